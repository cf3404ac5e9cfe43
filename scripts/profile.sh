#!/usr/bin/env bash
# Where the CPU goes at a given load: starts ingest and a worker (release),
# drives them with the load generator at RATE deliveries/s, and samples the
# whole machine with perf meanwhile. Prints the CPU share of each process
# and the hottest symbols of ingest and the worker.
# Usage: scripts/profile.sh [RATE] [SECONDS]
# Runs on the benchmark's own Postgres (scripts/lib/bench-postgres.sh); the
# stack's settings (HOOKINBOX_BATCH_LINGER_US, say) come from the
# environment; PROFILE_OUT=DIR keeps perf.data there.
set -euo pipefail
cd "$(dirname "$0")/.."
rate="${1:-1000}"
secs="${2:-15}"
command -v perf >/dev/null || { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq linux-perf >/dev/null; }
cargo build -q --release -p hookinbox-ingest -p hookinbox-worker -p hookinbox-tests --bin loadgen
bin=target/release
. scripts/lib/native.sh
. scripts/lib/bench-postgres.sh
bench_postgres_start
run="profile_$$"
scratch_db "$run"
port=$(free_port)
export DATABASE_URL="$base/$run" HOOKINBOX_QUEUE_PREFIX="$run" HOOKINBOX_GITHUB_SECRET="profile" RUST_LOG=warn
HOOKINBOX_LISTEN="127.0.0.1:$port" HOOKINBOX_METRICS_LISTEN="127.0.0.1:0" "$bin/hookinbox-ingest" 2>/dev/null & ingest_pid=$!; pids+=($!)
HOOKINBOX_METRICS_LISTEN="127.0.0.1:0" HOOKINBOX_CONCURRENCY=32 "$bin/hookinbox-worker" 2>/dev/null & worker_pid=$!; pids+=($!)
for _ in $(seq 1 100); do curl -fsS "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break; sleep 0.1; done
"$bin/loadgen" --url "http://127.0.0.1:$port/webhooks/github" --rate "$rate" --duration $((secs + 4)) --redeliver 0.1 > "$work/load.txt" &
load=$!
sleep 2
out="${PROFILE_OUT:-$work}"
mkdir -p "$out"
# The whole machine, and each of the two processes with every thread.
perf record -g -F 499 -p "$ingest_pid" -o "$out/ingest.data" -- sleep "$secs" >/dev/null 2>&1 & p1=$!
perf record -g -F 499 -p "$worker_pid" -o "$out/worker.data" -- sleep "$secs" >/dev/null 2>&1 & p2=$!
perf record -a -g -F 199 -o "$out/perf.data" -- sleep "$secs" 2>/dev/null >/dev/null
wait "$p1" "$p2" || true
wait "$load" || true
echo "== load"
cat "$work/load.txt"
echo "== CPU share by process (all cores, ${secs} s at $rate/s)"
perf report -i "$out/perf.data" --sort comm --stdio --no-children 2>/dev/null | grep -E '^ +[0-9]' | head -15
for proc in ingest worker; do
  echo "== $proc: share by thread, then the hottest symbols (of its own samples)"
  perf report -i "$out/$proc.data" --sort comm --stdio --no-children 2>/dev/null | grep -E '^ +[0-9]' | head -6
  perf report -i "$out/$proc.data" --sort dso,sym --stdio --no-children 2>/dev/null | grep -E '^ +[0-9]' | head -"${PROFILE_TOP:-25}"
done
