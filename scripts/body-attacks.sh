#!/usr/bin/env bash
# The attacks on ingest before any signature (loopback only), each beside
# real signed deliveries at 20/s, against a release ingest on the local
# Postgres and RabbitMQ:
#   memory  N connections (100, then 1,000), each declaring 24 MiB and
#           sending all but 1 KiB of it, from as many addresses: ingest's
#           peak RSS against the documented worst case;
#   slow    1,100 connections that send a header and one byte, from one
#           address, then from 100: the share of signed deliveries
#           answered 202 and their p99.
# Every signed delivery must be answered 202 and the peak RSS must stay
# under idle + 1.5 × HOOKINBOX_MAX_BUFFERED_BYTES + 100 KiB per connection
# (docs/operations.md, "Ingest's memory and slots"), or the
# script fails. Attackers connect from 127.0.1.x (loopback in other
# disguises), the signed deliveries from 127.0.0.1.
#
# Usage: scripts/body-attacks.sh [SECONDS] [INGEST_BINARY]
#   SECONDS        each attack's length (default 30)
#   INGEST_BINARY  another hookinbox-ingest to attack (for figures from an
#                  older build); its results are printed, not checked.
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-30}"
other="${2:-}"
cargo build -q --release -p hookinbox-ingest -p hookinbox-tests \
  --bin hookinbox-ingest --bin loadgen --bin bodyflood
bin=target/release
ingest_bin="${other:-$bin/hookinbox-ingest}"

. scripts/lib/native.sh
run="bodyattacks_$$"
scratch_db "$run"
export DATABASE_URL="$base/$run" HOOKINBOX_QUEUE_PREFIX="$run" HOOKINBOX_GITHUB_SECRET="attack-secret" RUST_LOG=warn
budget=$((64 * 1024 * 1024))
failed=0

start_ingest() {
  port=$(free_port)
  HOOKINBOX_LISTEN="127.0.0.1:$port" HOOKINBOX_METRICS_LISTEN="127.0.0.1:0" \
    "$ingest_bin" 2>>"$work/ingest.log" & ingest_pid=$!
  pids+=("$ingest_pid")
  for _ in $(seq 1 200); do curl -fsS "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && return; sleep 0.1; done
  echo "ingest did not start"; cat "$work/ingest.log"; exit 1
}
stop_ingest() { kill "$ingest_pid" 2>/dev/null || true; wait "$ingest_pid" 2>/dev/null || true; }
kib() { awk -v f="$2" '$1 == f {print $2}' "/proc/$1/status"; }

# One attack beside signed deliveries; prints both and checks them.
attack() {
  local label="$1" connections="$2"; shift 2
  start_ingest
  local idle
  idle=$(kib "$ingest_pid" VmRSS:)
  "$bin/bodyflood" --target "127.0.0.1:$port" --connections "$connections" --seconds "$secs" "$@" \
    > "$work/flood.txt" & local flood=$!
  sleep 2
  "$bin/loadgen" --url "http://127.0.0.1:$port/webhooks/github" --rate 20 --duration $((secs - 4)) \
    --no-e2e > "$work/signed.txt"
  wait "$flood" || true
  local peak
  peak=$(kib "$ingest_pid" VmHWM:)
  stop_ingest
  local signed sent ok p99
  signed=$(cat "$work/signed.txt")
  sent=$(sed -n 's/.*sent \([0-9]*\),.*/\1/p' <<<"$signed")
  ok=$(sed -n 's/.* 2xx \([0-9]*\) .*/\1/p' <<<"$signed")
  p99=$(sed -n 's/.*ingest p50 [0-9.]* ms, p99 \([0-9.]*\) ms.*/\1/p' <<<"$signed")
  local bound=$(( idle + budget * 3 / 2 / 1024 + connections * 100 ))
  echo "== $label"
  sed 's/^/  /' "$work/flood.txt"
  echo "  signed at 20/s: $ok of $sent answered 2xx ($(python3 -c "print(f'{100*$ok/max($sent,1):.1f}')") %), p99 $p99 ms"
  echo "  ingest RSS: idle $((idle / 1024)) MiB, peak $((peak / 1024)) MiB; worst case for $connections connections $((bound / 1024)) MiB"
  if [ -z "$other" ]; then
    [ "$ok" = "$sent" ] || { echo "  FAIL: a signed delivery was refused during the attack"; failed=1; }
    [ "$peak" -le "$bound" ] || { echo "  FAIL: peak RSS passed the worst case"; failed=1; }
  fi
}

attack "memory: 100 connections × 24 MiB declared, from 100 addresses" 100 --mode memory --clients 100
if [ -z "$other" ]; then
  attack "memory: 1,000 connections × 24 MiB declared, from 1,000 addresses" 1000 --mode memory --clients 1000
else
  # Unbounded, 1,000 × 24 MiB is 24 GB: this machine's whole memory.
  echo "== memory, 1,000 connections: not run against $other (it would take about 24 GB)"
fi
attack "slow: 1,100 connections, a header and one byte, from one address" 1100 --mode slow --clients 1
attack "slow: 1,100 connections, a header and one byte, from 100 addresses" 1100 --mode slow --clients 100

claims=$(psql -tAq "$DATABASE_URL" -c "select count(*) from deliveries where delivery_id = 'flood'")
echo "claim rows from the attackers: $claims"
[ "$claims" = 0 ] || failed=1
[ "$failed" = 0 ] && echo "body attacks: ok" || { echo "body attacks: FAILED"; exit 1; }
