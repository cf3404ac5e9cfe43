#!/usr/bin/env bash
# Abuse beside real traffic, against a native ingest + worker on the local
# Postgres and RabbitMQ (loopback only):
#   1. an unsigned flood (wrk) beside a signed stream (loadgen): the flood
#      must claim nothing and the signed stream's p99 must stay under 1 s;
#   2. slowhttptest's slow-headers (slowloris) and slow-body attacks: ingest
#      must keep serving signed deliveries, and claim nothing for them.
# Usage: scripts/abuse.sh [SECONDS]   (default 20)
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-20}"
need=()
command -v wrk >/dev/null || need+=(wrk)
command -v slowhttptest >/dev/null || need+=(slowhttptest)
if [ "${#need[@]}" -gt 0 ]; then
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
cargo build -q --release -p hookinbox-ingest -p hookinbox-worker -p hookinbox-tests --bin loadgen
bin=target/release

. scripts/lib/native.sh
run="abuse_$$"
scratch_db "$run"
port=$(free_port)
export DATABASE_URL="$base/$run" HOOKINBOX_QUEUE_PREFIX="$run" HOOKINBOX_GITHUB_SECRET="abuse-secret" RUST_LOG=warn
HOOKINBOX_LISTEN="127.0.0.1:$port" HOOKINBOX_METRICS_LISTEN="127.0.0.1:0" "$bin/hookinbox-ingest" 2>"$work/ingest.log" & pids+=($!)
HOOKINBOX_METRICS_LISTEN="127.0.0.1:0" "$bin/hookinbox-worker" 2>"$work/worker.log" & pids+=($!)
for _ in $(seq 1 100); do curl -fsS "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break; sleep 0.1; done
url="http://127.0.0.1:$port/webhooks/github"

claims() { psql -tAq "$DATABASE_URL" -c "select count(*) from deliveries where delivery_id like '$1%'"; }

echo "== 1. unsigned flood (wrk, 2 threads, 64 connections, ${secs} s) beside a signed stream of 100/s"
cat > "$work/flood.lua" <<'LUA'
wrk.method = "POST"
wrk.body = '{"action":"opened","zen":"flood"}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["X-GitHub-Event"] = "push"
wrk.headers["X-Hub-Signature-256"] = "sha256=0000000000000000000000000000000000000000000000000000000000000000"
counter = 0
request = function()
  counter = counter + 1
  wrk.headers["X-GitHub-Delivery"] = "flood-" .. counter .. "-" .. math.random(1, 1000000000)
  return wrk.format()
end
LUA
wrk -t2 -c64 -d"${secs}s" -s "$work/flood.lua" "$url" > "$work/wrk.txt" 2>&1 & flood=$!
"$bin/loadgen" --url "$url" --rate 100 --duration "$secs" --secret "$HOOKINBOX_GITHUB_SECRET" > "$work/signed.txt"
wait "$flood" || true
grep -E "Requests/sec|requests in|Non-2xx" "$work/wrk.txt" | sed 's/^/  wrk: /'
sed 's/^/  signed: /' "$work/signed.txt"
flood_claims=$(claims flood-)
echo "  claim rows from the flood: $flood_claims"
p99=$(sed -n 's/.*ingest p50 [0-9.]* ms, p99 \([0-9.]*\) ms.*/\1/p' "$work/signed.txt")
[ "$flood_claims" = 0 ] || { echo "the flood claimed rows"; exit 1; }
python3 -c "import sys; sys.exit(0 if float('$p99') < 1000 else 1)" || { echo "signed p99 $p99 ms >= 1 s"; exit 1; }

echo "== 2. slowhttptest: slow headers and slow body (${secs} s each) beside a signed stream"
for mode in -H -B; do
  slowhttptest "$mode" -c 500 -i 5 -r 100 -l "$secs" -t POST -u "$url" -s 8192 -x 24 -p 3 \
    > "$work/slow$mode.txt" 2>&1 & slow=$!
  sleep 3
  "$bin/loadgen" --url "$url" --rate 50 --duration $((secs / 2)) --secret "$HOOKINBOX_GITHUB_SECRET" \
    | sed "s/^/  signed during slowhttptest $mode: /"
  wait "$slow" || true
  grep -E "^(service available|slow HTTP test status|.*pending|.*closed|.*connected)" "$work/slow$mode.txt" | tail -4 | sed "s/^/  slowhttptest $mode: /" || true
done
# The load generator's ids are UUIDs; anything else was claimed for an attacker.
slow_claims=$(psql -tAq "$DATABASE_URL" -c "select count(*) from deliveries where delivery_id !~ '^[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}$'")
echo "  claim rows from the slow clients and the flood: $slow_claims"
[ "$slow_claims" = 0 ] || { echo "abusive requests claimed rows"; exit 1; }
echo "abuse: ok"
