#!/usr/bin/env bash
# The benchmark: baselines and hookinbox measured in the same run, on this
# machine, against the local Postgres and RabbitMQ. Writes a Markdown report
# (bench-report.md, or $BENCH_REPORT).
#
#   scripts/bench.sh            full run (about 45–60 minutes)
#   scripts/bench.sh --smoke    a 10-second load-generator run, no figures
#   scripts/bench.sh --search   only S, with the settings in the environment
#   scripts/bench.sh --body-share RATE   what each half of a delivery
#                               costs the broker and Postgres, see body_share
#   scripts/bench.sh --octokit  ingest against octokit's own receiver
#                               (B_octokit) under one closed loop, see peer_run
#   scripts/bench.sh --duplicates   only the duplicate-redelivery search
#                               (the same key and body again: the dedup path)
#   scripts/bench.sh --cost RATE...   CPU µs per delivery of each process at
#                               fixed rates (STEP seconds each), see cost_run;
#                               a RATE written cN is a closed loop of N
#                               connections instead (tests/src/bin/closedloop.rs),
#                               costed until every delivery it got accepted
#                               completed, e.g. --cost c64 c4 1000;
#                               COST_VARIANTS="LABEL:VAR=VALUE,VAR=VALUE ..."
#                               repeats every rate once per variant, with
#                               those settings (STACK_BINS=DIR or
#                               STACK_REV=GITREV among them runs another
#                               build), for before/after rows from one run;
#                               OTEL_EXPORTER_OTLP_ENDPOINT=sink sends the
#                               stack's traces to a local OTLP endpoint
#                               (tests/src/bin/otlpsink.rs) that decodes
#                               and counts them, e.g. the traces' cost:
#                               COST_VARIANTS="off: sampled1:OTEL_EXPORTER_OTLP_ENDPOINT=sink,OTEL_TRACES_SAMPLER=parentbased_traceidratio,OTEL_TRACES_SAMPLER_ARG=0.01 sampled100:OTEL_EXPORTER_OTLP_ENDPOINT=sink";
#                               a variant may name HOOKINBOX_CONFIG (the
#                               stack then runs without the single-source
#                               secret), and LOADGEN_EXTRA adds arguments
#                               to the load generator, e.g. ordering's cost:
#                               LOADGEN_EXTRA="--repositories 1000"
#                               COST_VARIANTS="unordered: ordered:HOOKINBOX_CONFIG=bench/ordered.toml"
#   scripts/bench.sh --destbench ARGS...   a destbench scenario (e.g.
#                               `fairness --flood-rate 100 --slow-ms 200`)
#                               on the benchmark's own Postgres
#   scripts/bench.sh --storage ARGS...   storage at volume: N delivered
#                               deliveries, then the retention sweep under
#                               live claims, with and without day
#                               partitions; --rr-secs adds closed loops
#                               beside a REPEATABLE READ transaction (see
#                               tests/src/bin/storagebench.rs)
#   scripts/bench.sh --sizes RATE   fixed-rate runs (STEP seconds each) across
#                               ingest's pool, the worker's pool and the
#                               worker's concurrency (prefetch), each with
#                               the peak Postgres connections of each
#                               process, to size the pools
#
# STACK_BINS names another build's folder for the stack's ingest and worker
# (say, an earlier commit's, to compare), the load generator staying this
# tree's.
#
# The stack's processes take their pools from INGEST_POOL and WORKER_POOL
# (HOOKINBOX_DB_POOL_SIZE of ingest and of the worker, default 16 each) and
# the worker's concurrency from WORKER_CONCURRENCY (default 32); --sizes
# sweeps INGEST_POOLS, WORKER_POOLS and CONCURRENCIES (defaults below; an
# empty list skips that sweep). A destbench scenario's stacks take the
# manifests' pools instead (ingest 4, worker 11) unless INGEST_POOL or
# WORKER_POOL say otherwise.
#
# Settings: STEP (seconds per search step, default 10), HOLD (seconds S
# must hold for the headline figure, default 600), VERIFY (seconds each
# before/after search's S, and the headline candidate before its HOLD, must
# hold, default 60), HOLD_LAG (seconds of arrivals the work queue may hold
# during those holds, default 5; a search step allows 1). A candidate that
# does not hold is lowered by a tenth and held again; a run stops early once
# the queue has outgrown its bound. Every queue-depth sample is logged to
# $DEPTH_LOG (default bench-depth.log) to line up with Postgres's log.
set -euo pipefail
cd "$(dirname "$0")/.."
# Thousands of requests in flight each hold a socket: the default soft limit
# (1,024 descriptors) runs out at about 10,000 requests/s.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || ulimit -n 65536 2>/dev/null || true
mode="${1:-full}"
STEP="${STEP:-10}"
HOLD="${HOLD:-600}"
VERIFY="${VERIFY:-60}"
HOLD_LAG="${HOLD_LAG:-5}"
report="${BENCH_REPORT:-bench-report.md}"
depth_log="${DEPTH_LOG:-bench-depth.log}"
: > "$depth_log"
base="${HOOKINBOX_TEST_POSTGRES:-postgres://postgres@127.0.0.1:5432}"
amqp="${AMQP_URL:-amqp://guest:guest@127.0.0.1:5672/%2f}"
export HOOKINBOX_GITHUB_SECRET="bench-secret"
if [ -z "${HOOKINBOX_GITHUB_FIXTURES:-}" ] && [ -d ../shared/fixtures/github-payloads ]; then
  HOOKINBOX_GITHUB_FIXTURES="$(cd ../shared/fixtures/github-payloads && pwd)"
  export HOOKINBOX_GITHUB_FIXTURES
fi

profile=release
[ "$mode" = "--smoke" ] && profile=debug
cargo build -q --profile "$( [ $profile = debug ] && echo dev || echo release )" \
  -p hookinbox-ingest -p hookinbox-worker -p hookinbox-tests --bins
bin="target/$profile"
stack_bin="${STACK_BINS:-$bin}"

. scripts/lib/native.sh
# Its own Postgres, with the recommended settings (bench/postgresql.conf:
# autovacuum on, shared_buffers for the working set, WAL compression,
# spaced checkpoints); BENCH_POSTGRES=shared uses HOOKINBOX_TEST_POSTGRES.
. scripts/lib/bench-postgres.sh
bench_postgres_start

# --storage ARGS...: storage at volume (tests/src/bin/storagebench.rs):
# retention and claims before and after day partitions, on this Postgres.
if [ "$mode" = "--storage" ]; then
  shift
  "$bin/storagebench" "$@"
  exit 0
fi

# --destbench ARGS...: a destbench scenario (tests/src/bin/destbench) on
# this Postgres, whose autovacuum runs as a deployment's does.
if [ "$mode" = "--destbench" ]; then
  shift
  "$bin/destbench" "$@"
  exit 0
fi

# Starts ingest and one worker on a fresh database and queue prefix;
# sets INGEST_URL, INGEST_PID, DB_URL, PREFIX.
stack_pids=()
stop_stack() {
  for pid in "${stack_pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${stack_pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  stack_pids=()
}
start_stack() {
  # One stack at a time: stop the previous one and free its connections.
  stop_stack
  # A variant with HOOKINBOX_CONFIG (its sources carry their secrets) runs
  # the stack without the single-source secret, which the binaries refuse
  # beside the file; the load generator still signs with it.
  local own=()
  [ -n "${HOOKINBOX_CONFIG:-}" ] && own=(env -u HOOKINBOX_GITHUB_SECRET)
  local name="bench_$$_$1"
  scratch_db "$name"
  DB_URL="$base/$name"; PREFIX="$name"
  local port; port=$(free_port)
  INGEST_METRICS=$(free_port); WORKER_METRICS=$(free_port)
  DATABASE_URL="$DB_URL" HOOKINBOX_QUEUE_PREFIX="$PREFIX" RUST_LOG=warn "${own[@]}" "$stack_bin/hookinbox-worker" migrate >/dev/null
  # Each process names its sessions (application_name), so that
  # pg_stat_activity tells their connections apart (see count_connections).
  DATABASE_URL="$DB_URL?application_name=bench-ingest" HOOKINBOX_QUEUE_PREFIX="$PREFIX" HOOKINBOX_AUTO_MIGRATE=false \
    HOOKINBOX_LISTEN="127.0.0.1:$port" HOOKINBOX_METRICS_LISTEN="127.0.0.1:$INGEST_METRICS" RUST_LOG="${STACK_LOG:-warn}" \
    HOOKINBOX_DB_POOL_SIZE="${INGEST_POOL:-16}" \
    HOOKINBOX_CLAIM_BATCH="${CLAIM_BATCH:-64}" HOOKINBOX_PUBLISH_WINDOW="${PUBLISH_WINDOW:-256}" \
    "${own[@]}" "$stack_bin/hookinbox-ingest" 2>"${STACK_LOG_FILE:-/dev/null}" & INGEST_PID=$!; pids+=("$INGEST_PID"); stack_pids+=("$INGEST_PID")
  # NO_WORKER=1: ingest alone (the peer comparison measures the durable
  # receiver, as octokit's is measured without an app behind it).
  if [ -z "${NO_WORKER:-}" ]; then
  DATABASE_URL="$DB_URL?application_name=bench-worker" HOOKINBOX_QUEUE_PREFIX="$PREFIX" HOOKINBOX_AUTO_MIGRATE=false \
    HOOKINBOX_METRICS_LISTEN="127.0.0.1:$WORKER_METRICS" HOOKINBOX_CONCURRENCY="${WORKER_CONCURRENCY:-32}" RUST_LOG="${STACK_LOG:-warn}" \
    HOOKINBOX_DB_POOL_SIZE="${WORKER_POOL:-16}" \
    HOOKINBOX_COMPLETE_BATCH="${COMPLETE_BATCH:-64}" HOOKINBOX_TAKE_BATCH="${TAKE_BATCH:-64}" \
    "${own[@]}" "$stack_bin/hookinbox-worker" 2>>"${STACK_LOG_FILE:-/dev/null}" & WORKER_PID=$!; pids+=($!); stack_pids+=($!)
  fi
  INGEST_URL="http://127.0.0.1:$port/webhooks/github"
  for _ in $(seq 1 100); do curl -fsS "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && return; sleep 0.1; done
  echo "stack did not start" >&2; exit 1
}

loadgen() {
  DATABASE_URL="$DB_URL" HOOKINBOX_QUEUE_PREFIX="$PREFIX" AMQP_URL="$amqp" \
    "$bin/loadgen" --url "$INGEST_URL" --hold-lag "$HOLD_LAG" --depth-log "$depth_log" "$@"
}

# Samples pg_stat_activity every half second, through one session, until
# the file $work/stop-counting appears; prints the peaks of each process:
# connections open (a pool opens one only when all its open ones are in
# use, so this is the most it needed at once) and connections running a
# statement or inside a transaction at a sample.
count_connections() { # DATABASE
  local samples="$work/connections"
  rm -f "$work/stop-counting"
  while [ ! -e "$work/stop-counting" ]; do
    echo "select application_name, count(*), count(*) filter (where state <> 'idle')
          from pg_stat_activity where datname = '$1' and application_name like 'bench-%'
          group by 1;"
    sleep 0.5
  done | psql -qtA -F ' ' "$base/postgres" > "$samples"
  awk '{ if ($2 > open[$1]) open[$1] = $2; if ($3 > busy[$1]) busy[$1] = $3 }
       END { printf "connections: ingest open max %d (busy max %d), worker open max %d (busy max %d)\n",
             open["bench-ingest"], busy["bench-ingest"], open["bench-worker"], busy["bench-worker"] }' "$samples"
}

# One fixed-rate run on a fresh stack, with its peak connections.
sized_run() { # LABEL RATE
  start_stack "$1"
  count_connections "$PREFIX" > "$work/peaks" & local counter=$!
  local out; out=$(loadgen --rate "$2" --duration "$STEP" --redeliver 0.1)
  touch "$work/stop-counting"; wait "$counter"
  echo "ingest pool ${INGEST_POOL:-16}, worker pool ${WORKER_POOL:-16}, concurrency ${WORKER_CONCURRENCY:-32}: $out; $(cat "$work/peaks")"
}

# CPU ticks of Postgres: with the benchmark's own cluster, its postmaster's
# own and its reaped children's time (/proc fields 14-17: backends and
# autovacuum workers that exited during the run are counted there) plus
# every live child's; sharing the machine's server, every postgres process.
postgres_ticks() {
  if [ -n "$bench_pg_dir" ]; then
    local pm; pm=$(head -n1 "$bench_pg_dir/data/postmaster.pid")
    local reaped; reaped=$(awk '{print $14 + $15 + $16 + $17}' "/proc/$pm/stat")
    # shellcheck disable=SC2046
    echo $((reaped + $(ticks $(pgrep -P "$pm"))))
  else
    # shellcheck disable=SC2046
    ticks $(pgrep -x postgres)
  fi
}

# CPU time (user + system) of processes, in clock ticks, from
# /proc/PID/stat (fields 14 and 15; the names here hold no spaces).
ticks() { # PID...
  local total=0 pid t
  for pid in "$@"; do
    t=$(awk '{print $14 + $15}' "/proc/$pid/stat" 2>/dev/null || echo 0)
    total=$((total + ${t:-0}))
  done
  echo "$total"
}
# Mean rows per group-commit statement so far (hookinbox_batch_rows), as
# "claim N, take N, complete N" from both metrics listeners.
batch_rows() {
  { curl -fsS "http://127.0.0.1:$INGEST_METRICS/metrics"; curl -fsS "http://127.0.0.1:$WORKER_METRICS/metrics"; } 2>/dev/null |
    awk '/^hookinbox_batch_rows_(sum|count)\{/ {
           match($0, /statement="[a-z]+"/); s = substr($0, RSTART + 11, RLENGTH - 12)
           if ($0 ~ /_sum\{/) sum[s] += $NF; else n[s] += $NF }
         END { printf "claim %.1f, take %.1f, complete %.1f", (n["claim"] ? sum["claim"] / n["claim"] : 0),
               (n["take"] ? sum["take"] / n["take"] : 0), (n["complete"] ? sum["complete"] / n["complete"] : 0) }'
}

# Bytes processes wrote to storage (/proc/PID/io write_bytes), summed.
written() { # PID...
  local total=0 pid b
  for pid in "$@"; do
    b=$(awk '/^write_bytes/ {print $2}' "/proc/$pid/io" 2>/dev/null || echo 0)
    total=$((total + ${b:-0}))
  done
  echo "$total"
}

# Busy ticks of the whole machine: user, nice, system, irq, softirq, steal.
machine_ticks() { awk '/^cpu / {print $2 + $3 + $4 + $7 + $8 + $9}' /proc/stat; }

# One fixed-rate run on a fresh stack, costed: the CPU each process spent
# from the first request until the last delivery completed (the load
# generator waits for that), divided by the deliveries completed. Postgres
# is every process of the server (see postgres_ticks), RabbitMQ its Erlang
# VM; the load generator's time comes from
# /usr/bin/time. Every request is a new delivery with the real payload mix.
cost_runs=0
cost_run() { # RATE [LABEL]
  cost_runs=$((cost_runs + 1))
  start_stack "cost${cost_runs}_$1"
  local hz; hz=$(getconf CLK_TCK)
  local i0 w0 p0 m0 all0
  # BENCH_PG_TOP=N (with BENCH_POSTGRES_SETTINGS="shared_preload_libraries =
  # 'pg_stat_statements'"): the run's N costliest statements, printed below.
  [ -n "${BENCH_PG_TOP:-}" ] && psql -qAt "$DB_URL" \
    -c "create extension if not exists pg_stat_statements" -c "select pg_stat_statements_reset()" >/dev/null
  # shellcheck disable=SC2046
  i0=$(ticks "$INGEST_PID"); w0=$(ticks "$WORKER_PID"); p0=$(postgres_ticks)
  # shellcheck disable=SC2046
  m0=$(ticks $(pgrep -x beam.smp)); all0=$(machine_ticks)
  # Bytes written: Postgres's WAL (its insert position), RabbitMQ's to disk
  # (/proc/PID/io of its VM: its own WAL and segment files).
  local wal0 mqio0
  wal0=$(psql -tAq "$DB_URL" -c "select pg_current_wal_insert_lsn()")
  # shellcheck disable=SC2046
  mqio0=$(written $(pgrep -x beam.smp))
  local out started; started=$(date +%s.%N)
  if [ "${1#c}" != "$1" ]; then
    # A closed loop of ${1#c} connections for STEP seconds, then the wait
    # until every delivery it got accepted is completed: the time to that
    # is the run's, for the deliveries completed per second.
    out=$(/usr/bin/time -f '%U %S' -o "$work/loadgen-time" \
      "$bin/closedloop" --url "$INGEST_URL" --connections "${1#c}" --duration "$STEP")
    local left=1
    for _ in $(seq 1 6000); do
      left=$(psql -tAq "$DB_URL" -c "select count(*) from deliveries where status <> 'completed'")
      [ "$left" = 0 ] && break
      sleep 0.1
    done
    out="$out; all completed after $(python3 -c "import time; print(f'{time.time() - $started:.1f}')") s (left: $left)"
  else
    out=$(/usr/bin/time -f '%U %S' -o "$work/loadgen-time" \
      env DATABASE_URL="$DB_URL" HOOKINBOX_QUEUE_PREFIX="$PREFIX" AMQP_URL="$amqp" \
      "$bin/loadgen" --url "$INGEST_URL" --rate "$1" --duration "$STEP" --hold-lag "$HOLD_LAG" \
      ${LOADGEN_EXTRA:-})
  fi
  local elapsed; elapsed=$(python3 -c "import time; print(time.time() - $started)")
  # The run pays for its own garbage inside its time: the vacuum its rows
  # get anyway, which would otherwise fall into a later run's. (No
  # checkpoint, nor a database dropped, between runs: either makes the
  # next run start with every page's first write a full-page image.)
  psql -q "$DB_URL" -c "vacuum"
  local i1 w1 p1 m1 all1
  # shellcheck disable=SC2046
  i1=$(ticks "$INGEST_PID"); w1=$(ticks "$WORKER_PID"); p1=$(postgres_ticks)
  # shellcheck disable=SC2046
  m1=$(ticks $(pgrep -x beam.smp)); all1=$(machine_ticks)
  local completed
  completed=$(psql -tAq "$DB_URL" -c "select count(*) from deliveries where status = 'completed'")
  # shellcheck disable=SC2046
  local mqio1; mqio1=$(written $(pgrep -x beam.smp))
  # Per delivery completed: WAL and RabbitMQ's disk writes during the run
  # (its vacuum included), and what each table holds now (its indexes and
  # TOAST included) once vacuumed.
  psql -tAq "$DB_URL" -c "select format('bytes per delivery: Postgres WAL %s, RabbitMQ written %s; tables (with indexes): deliveries %s, bodies %s, github_events %s, seen_bodies %s',
      round(pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '$wal0') / greatest($completed, 1)),
      round(($mqio1 - $mqio0)::numeric / greatest($completed, 1)),
      round(pg_total_relation_size('deliveries')::numeric / greatest($completed, 1)),
      round(coalesce((select sum(pg_total_relation_size(c.oid)) from pg_inherits i join pg_class c on c.oid = i.inhrelid
                      where i.inhparent = to_regclass('bodies')), 0)::numeric / greatest($completed, 1)),
      round(coalesce((select sum(pg_total_relation_size(c.oid)) from pg_inherits i join pg_class c on c.oid = i.inhrelid
                      where i.inhparent = to_regclass('github_events')), pg_total_relation_size('github_events'))::numeric
            / greatest($completed, 1)),
      round(pg_total_relation_size('seen_bodies')::numeric / greatest($completed, 1)))" >&2
  local batches; batches=$(batch_rows)
  if [ -n "${BENCH_PG_TOP:-}" ]; then
    psql -q "$DB_URL" -c "select calls, round(total_exec_time) as ms, round(total_exec_time * 1000 / greatest($completed, 1)) as us_per_delivery,
        rows, left(regexp_replace(query, '\s+', ' ', 'g'), 160) as query
      from pg_stat_statements order by total_exec_time desc limit $BENCH_PG_TOP" >&2
  fi
  stop_stack
  python3 - "${2:-}" "$1" "$hz" "$completed" "$((i1 - i0))" "$((w1 - w0))" "$((p1 - p0))" "$((m1 - m0))" \
    "$(cat "$work/loadgen-time")" "$((all1 - all0))" "$batches" "$elapsed" <<'PY'
import sys
label = sys.argv.pop(1)
rate, hz, done = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
# A closed loop's "rate": its connections, and the deliveries it got
# completed per second, from its first request to the last completion.
rate = (f"closed {rate[1:]} ({done / float(sys.argv[11]):,.0f}/s done)"
        if rate.startswith("c") else f"{int(rate):,}")
ingest, worker, pg, mq = (int(x) for x in sys.argv[4:8])
user, system = (float(x) for x in sys.argv[8].split())
machine = int(sys.argv[9])
us = lambda t: t * 1e6 / hz / max(done, 1)
gen = (user + system) * 1e6 / max(done, 1)
print(f"| {label} | {rate} | {done:,} | {us(ingest):,.0f} | {us(worker):,.0f} | {us(pg):,.0f} | {us(mq):,.0f} "
      f"| {gen:,.0f} | {us(ingest + worker + pg + mq):,.0f} | {us(machine):,.0f} | {sys.argv[10]} |")
PY
  echo "$out" >&2
}

# B_octokit and ingest under the same closed loop (tests/src/bin/closedloop.rs:
# PEER_CONNECTIONS senders, 64, for PEER_SECONDS, 20; the same signed real
# payloads, a new delivery id and body per request): octokit's own receiver
# (bench/octokit: @octokit/webhooks createNodeMiddleware on Node.js,
# verifying the signature, then an in-memory no-op), then ingest alone on a
# fresh stack (durable: each request claimed in Postgres and published with
# a confirm; no worker). Prints both lines with the CPU µs per request of
# each process, and sets B_OCTOKIT, PEER_INGEST and PEER_RATIO.
peer_run() {
  local conns="${PEER_CONNECTIONS:-64}" secs="${PEER_SECONDS:-20}" hz; hz=$(getconf CLK_TCK)
  if [ ! -d bench/octokit/node_modules ]; then
    (cd bench/octokit && npm ci --no-audit --no-fund --silent)
  fi
  local port; port=$(free_port)
  OCTOKIT_SECRET="$HOOKINBOX_GITHUB_SECRET" OCTOKIT_PORT="$port" node bench/octokit/server.mjs >/dev/null 2>&1 &
  local node_pid=$!; pids+=("$node_pid")
  for _ in $(seq 1 100); do curl -fsS "http://127.0.0.1:$port/healthz" >/dev/null 2>&1 && break; sleep 0.1; done
  local n0 all0 n1 all1 out
  n0=$(ticks "$node_pid"); all0=$(machine_ticks)
  out=$("$bin/closedloop" --url "http://127.0.0.1:$port/webhooks/github" --connections "$conns" --duration "$secs")
  n1=$(ticks "$node_pid"); all1=$(machine_ticks)
  kill "$node_pid" 2>/dev/null || true
  B_OCTOKIT=$(echo "$out" | awk '{for (i = 1; i < NF; i++) if ($(i+1) == "requests/s") print int($i)}')
  echo "B_octokit: $out; CPU µs per request: node $(( (n1 - n0) * 1000000 / hz / (B_OCTOKIT * secs + 1) )), whole machine $(( (all1 - all0) * 1000000 / hz / (B_OCTOKIT * secs + 1) ))"
  NO_WORKER=1 start_stack peer
  local i0 p0 m0 i1 p1 m1
  # shellcheck disable=SC2046
  i0=$(ticks "$INGEST_PID"); p0=$(postgres_ticks); m0=$(ticks $(pgrep -x beam.smp)); all0=$(machine_ticks)
  out=$("$bin/closedloop" --url "$INGEST_URL" --connections "$conns" --duration "$secs")
  # shellcheck disable=SC2046
  i1=$(ticks "$INGEST_PID"); p1=$(postgres_ticks); m1=$(ticks $(pgrep -x beam.smp)); all1=$(machine_ticks)
  PEER_INGEST=$(echo "$out" | awk '{for (i = 1; i < NF; i++) if ($(i+1) == "requests/s") print int($i)}')
  local n=$((PEER_INGEST * secs + 1))
  echo "ingest: $out; CPU µs per request: ingest $(( (i1 - i0) * 1000000 / hz / n )), Postgres $(( (p1 - p0) * 1000000 / hz / n )), RabbitMQ $(( (m1 - m0) * 1000000 / hz / n )), whole machine $(( (all1 - all0) * 1000000 / hz / n ))"
  PEER_RATIO=$(python3 -c "print(f'{${PEER_INGEST:-0} / max(${B_OCTOKIT:-0}, 1):.2f}')")
  echo "ingest / B_octokit = $PEER_RATIO"
}

# What each half of a delivery costs (tests/src/bin/bodyshare.rs), at RATE
# deliveries/s for STEP seconds each: the broker's CPU per delivery to
# carry, deliver and ack a job's message (its key), and Postgres's for the
# claim with its body, the read of the body and the completion. Prints the
# table and sets BODY_SHARE (its row).
body_share() { # RATE
  local rate="$1" hz; hz=$(getconf CLK_TCK)
  local name="bench_$$_bodyshare"
  scratch_db "$name"
  DATABASE_URL="$base/$name" RUST_LOG=warn "$bin/hookinbox-worker" migrate >/dev/null
  local phase t0 t1 n=$((rate * STEP))
  declare -A us
  for phase in mq pg; do
    local of=beam
    [ "${phase#pg}" != "$phase" ] && of=pg
    # shellcheck disable=SC2046
    if [ $of = beam ]; then t0=$(ticks $(pgrep -x beam.smp)); else t0=$(postgres_ticks); fi
    DATABASE_URL="$base/$name" AMQP_URL="$amqp" HOOKINBOX_QUEUE_PREFIX="$name" \
      "$bin/bodyshare" "$phase" --rate "$rate" --seconds "$STEP" >&2
    # Its backends' time is counted once the postmaster has reaped them.
    while [ "$(psql -tAq "$base/postgres" -c "select count(*) from pg_stat_activity where datname = '$name'")" != 0 ]; do
      sleep 0.1
    done
    # shellcheck disable=SC2046
    if [ $of = beam ]; then t1=$(ticks $(pgrep -x beam.smp)); else t1=$(postgres_ticks); fi
    us[$phase]=$(( (t1 - t0) * 1000000 / hz / n ))
  done
  BODY_SHARE="| the key in the message, the body in Postgres (the design) | ${us[mq]} | ${us[pg]} | $(( us[mq] + us[pg] )) |"
  BODY_MQ=${us[mq]}; BODY_PG=${us[pg]}
  echo "CPU µs per delivery at $rate/s, $STEP s each (Postgres in batches of 16)"
  echo "| design | RabbitMQ | Postgres | both |"
  echo "|---|---|---|---|"
  echo "$BODY_SHARE"
}

if [ "$mode" = "--body-share" ]; then
  body_share "${2:?usage: scripts/bench.sh --body-share RATE}"
  exit 0
fi

if [ "$mode" = "--octokit" ]; then
  peer_run
  exit 0
fi

# The release binaries of ingest and the worker at git revision REV, built
# once in a worktree (one shared target folder, so dependencies build once)
# and kept in target/bench-builds/SHA; prints that folder.
rev_bins() { # REV
  local sha; sha=$(git rev-parse --short=12 "$1^{commit}")
  local out="target/bench-builds/$sha"
  if [ ! -x "$out/hookinbox-worker" ]; then
    local tree="target/bench-builds/tree-$sha"
    git worktree add -f --detach "$tree" "$sha" >/dev/null 2>&1
    (cd "$tree" && CARGO_TARGET_DIR="$(pwd)/../target" cargo build -q --release \
      -p hookinbox-ingest -p hookinbox-worker) >&2
    mkdir -p "$out"
    cp target/bench-builds/target/release/hookinbox-ingest target/bench-builds/target/release/hookinbox-worker "$out/"
    git worktree remove --force "$tree" >/dev/null 2>&1 || true
  fi
  echo "$out"
}

# The OTLP sink for the traced variants, started on first use (not in a
# subshell: it sets $otlp_sink, its endpoint). Its own CPU is not the
# stack's (a collector runs elsewhere).
otlp_sink=""
otlp_sink_start() {
  if [ -z "$otlp_sink" ]; then
    local port; port=$(free_port)
    "$bin/otlpsink" --port "$port" >/dev/null 2>&1 & pids+=($!)
    otlp_sink="http://127.0.0.1:$port"
    for _ in $(seq 1 100); do curl -fsS "$otlp_sink/count" >/dev/null 2>&1 && break; sleep 0.1; done
  fi
}

# Runs "$@" with one variant's settings (LABEL:VAR=VALUE,VAR=VALUE; see
# --cost) in force, then takes them back. STACK_BINS=DIR runs the
# binaries in DIR, STACK_REV=REV those built from git revision REV;
# OTEL_EXPORTER_OTLP_ENDPOINT=sink the local OTLP sink (otlp_sink_start),
# whose spans received during the run are reported on standard error.
with_variant() { # VARIANT COMMAND...
  local variant="$1"; shift
  local settings="${variant#*:}" pair names=()
  [ "$settings" = "$variant" ] && settings=""
  local saved_bin="$stack_bin"
  IFS=',' read -r -a pairs <<< "$settings"
  for pair in "${pairs[@]}"; do
    [ -n "$pair" ] || continue
    if [ "${pair%%=*}" = STACK_BINS ]; then stack_bin="${pair#*=}"; continue; fi
    if [ "${pair%%=*}" = STACK_REV ]; then stack_bin=$(rev_bins "${pair#*=}"); continue; fi
    if [ "$pair" = OTEL_EXPORTER_OTLP_ENDPOINT=sink ]; then otlp_sink_start; pair="OTEL_EXPORTER_OTLP_ENDPOINT=$otlp_sink"; fi
    export "${pair?}"; names+=("${pair%%=*}")
  done
  local spans0=""
  [ -n "$otlp_sink" ] && spans0=$(curl -fsS "$otlp_sink/count")
  "$@"
  if [ -n "$otlp_sink" ]; then
    echo "${variant%%:*}: spans received by the OTLP sink: $(( $(curl -fsS "$otlp_sink/count") - ${spans0:-0} ))" >&2
  fi
  for pair in "${names[@]}"; do unset "$pair"; done
  stack_bin="$saved_bin"
}

# The --cost table: every rate, every variant (COST_VARIANTS), COST_REPEAT
# rounds.
cost_table() { # RATE...
  echo "CPU µs per delivery, $STEP s at each rate (ingest pool ${INGEST_POOL:-16}, worker pool ${WORKER_POOL:-16}, concurrency ${WORKER_CONCURRENCY:-32})"
  echo "| variant | rate /s | deliveries | ingest | worker | Postgres | RabbitMQ | load generator | stack (no generator) | whole machine | rows per statement |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|"
  # COST_REPEAT rounds, each variant in turn within a round, so that
  # drift on a shared machine spreads over all of them.
  local rows="$work/cost-rows"
  : > "$rows"
  for _ in $(seq 1 "${COST_REPEAT:-1}"); do
    for rate in "$@"; do
      for variant in ${COST_VARIANTS:-default:}; do
        # Not through a pipe: a pipe's subshell would lose the run's
        # counters and stack.
        with_variant "$variant" cost_run "$rate" "${variant%%:*}" > "$work/cost-row"
        cat "$work/cost-row"; cat "$work/cost-row" >> "$rows"
      done
    done
  done
  cost_ratios "$rows"
}

# The medians of the --cost rows by variant and rate (of the rounds), and
# each variant's against the first variant's: the before/after a change
# to the hot path is judged by (stack: ingest, worker, Postgres and
# RabbitMQ together; a closed loop's completions per second too).
cost_ratios() { # ROWS_FILE
  python3 - "$1" <<'PY'
import re, statistics, sys
rows = [l for l in open(sys.argv[1]) if l.startswith("| ")]
num = lambda s: float(s.replace(",", "").strip())
runs = {}
order = []
for l in rows:
    c = [x.strip() for x in l.strip().strip("|").split("|")]
    variant, rate = c[0], re.sub(r" \(.*\)", "", c[1])
    done = re.search(r"\(([\d,]+)/s done\)", c[1])
    key = (variant, rate)
    if variant not in order:
        order.append(variant)
    runs.setdefault(key, []).append({
        "ingest": num(c[3]), "worker": num(c[4]), "Postgres": num(c[5]), "RabbitMQ": num(c[6]),
        "stack": num(c[8]), "done/s": num(done.group(1)) if done else None})
if not runs:
    sys.exit(0)
print()
print("Medians of the rounds, and each variant against the first (" + order[0] + "):")
print("| variant | rate | runs | ingest | worker | Postgres | RabbitMQ | stack | stack ratio | done/s | done/s ratio |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
rates = []
for (v, r) in runs:
    if r not in rates:
        rates.append(r)
for r in rates:
    base = runs.get((order[0], r))
    med = lambda rs, k: statistics.median([x[k] for x in rs]) if rs and rs[0][k] is not None else None
    for v in order:
        rs = runs.get((v, r))
        if not rs:
            continue
        stack, done = med(rs, "stack"), med(rs, "done/s")
        b_stack, b_done = med(base, "stack"), med(base, "done/s")
        ratio = f"{stack / b_stack:.2f} ×" if b_stack else "-"
        dratio = f"{done / b_done:.2f} ×" if done and b_done else "-"
        print(f"| {v} | {r} | {len(rs)} | {med(rs, 'ingest'):,.0f} | {med(rs, 'worker'):,.0f} | "
              f"{med(rs, 'Postgres'):,.0f} | {med(rs, 'RabbitMQ'):,.0f} | {stack:,.0f} | {ratio} | "
              f"{'-' if done is None else f'{done:,.0f}'} | {dratio} |")
PY
}

if [ "$mode" = "--cost" ]; then
  shift
  [ "$#" -gt 0 ] || { echo "usage: scripts/bench.sh --cost RATE..." >&2; exit 2; }
  cost_table "$@"
  exit 0
fi

if [ "$mode" = "--sizes" ]; then
  rate="${2:?usage: scripts/bench.sh --sizes RATE}"
  echo "== ingest's pool (HOOKINBOX_DB_POOL_SIZE of ingest), $rate/s for $STEP s each"
  for pool in ${INGEST_POOLS-2 4 8 16}; do
    INGEST_POOL=$pool sized_run "ingest$pool" "$rate"
  done
  echo "== the worker's pool (HOOKINBOX_DB_POOL_SIZE of the worker)"
  for pool in ${WORKER_POOLS-2 4 8 16}; do
    WORKER_POOL=$pool sized_run "worker$pool" "$rate"
  done
  echo "== the worker's concurrency (HOOKINBOX_CONCURRENCY, also its prefetch)"
  for c in ${CONCURRENCIES-8 16 32 64}; do
    WORKER_CONCURRENCY=$c sized_run "conc$c" "$rate"
  done
  exit 0
fi

if [ "$mode" = "--search" ]; then
  start_stack s
  loadgen --search --rate 100 --step-duration "$STEP" --verify "$VERIFY" --hold "$HOLD" --redeliver 0.1 \
    --pid "$INGEST_PID"
  exit 0
fi

if [ "$mode" = "--duplicates" ]; then
  start_stack dup
  loadgen --duplicates-only --search --rate 200 --step-duration "$STEP" --no-e2e
  exit 0
fi

if [ "$mode" = "--smoke" ]; then
  start_stack smoke
  loadgen --rate 50 --duration 10 --redeliver 0.1 --pid "$INGEST_PID"
  exit 0
fi

echo "== machine"
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')
cores=$(nproc)
sync_commit=$(psql -tAq "$base/postgres" -c 'show synchronous_commit')
# Debian keeps pg_test_fsync out of PATH.
test_fsync=$(command -v pg_test_fsync || ls /usr/lib/postgresql/*/bin/pg_test_fsync 2>/dev/null | tail -1)
fsync=$(cd "$(mktemp -d)" && "$test_fsync" -s 2 2>/dev/null | grep -m1 -E '^ +fdatasync +[0-9]' | sed 's/^ *//;s/  */ /g' || true)
echo "$cpu, $cores cores, synchronous_commit=$sync_commit, $fsync"

echo "== baselines"
start_stack pg
psql -q "$DB_URL" -c "analyze"
b_pg1=$(pgbench -n -c 32 -j 2 -T "$STEP" -f bench/claim1.sql "$DB_URL" 2>/dev/null | awk '/^tps/ {print int($3)}')
b_pgb_tps=$(pgbench -n -c 8 -j 2 -T "$STEP" -f bench/claim64.sql "$DB_URL" 2>/dev/null | awk '/^tps/ {print $3}')
b_pgb=$(python3 -c "print(int(float('$b_pgb_tps') * 64))")
echo "B_pg1 $b_pg1 claims/s; B_pgB $b_pgb claims/s"
b_mq=$(AMQP_URL="$amqp" "$bin/mqbench" "$STEP" | awk '{print $2}')
echo "B_mq $b_mq messages/s"
http_port=$(free_port)
HOOKINBOX_LISTEN="127.0.0.1:$http_port" "$bin/httpbench" & pids+=($!)
sleep 1
b_http=$(DATABASE_URL=unused "$bin/loadgen" --url "http://127.0.0.1:$http_port/" --no-e2e --search --rate 500 \
  --step-duration "$STEP" | tee -a /dev/stderr | awk '/^S = / {print $3}')
echo "B_http $b_http requests/s"

# A pgbench latency probe of the disk under Postgres, before and after the
# run: on a shared virtual disk, fsync times move with what ran before.
probe() {
  pgbench -n -c 8 -j 2 -R 1000 -T 10 -f bench/claim1.sql "$DB_URL" 2>/dev/null |
    awk '/^latency average/ {a = $4} /^latency stddev/ {d = $4} END {printf "1,000 one-row claims/s: latency %s ms (stddev %s ms)", a, d}'
}
probe_start=$(probe); echo "probe: $probe_start"

echo "== B_octokit: octokit's receiver and ingest, one closed loop"
peer_run > "$work/peer"
cat "$work/peer" >&2

echo "== each half of a delivery: the broker's and Postgres's"
body_share "${COST_BODY_RATE:-2000}" >&2

# CPU per delivery before and after each change of the second design, in
# the order they landed, each row one build and its settings (all from this
# run); COST_RATES and COST_STEP (20 s) set the runs.
BEFORE_REV="${BEFORE_REV:-888d29d}"
FULL_VARIANTS="${FULL_VARIANTS:-before:STACK_REV=$BEFORE_REV,HOOKINBOX_BATCH_LINGER_US=0 \
+linger:STACK_REV=$BEFORE_REV,HOOKINBOX_BATCH_LINGER_US=3000 \
+one-statement:STACK_REV=f071e15,HOOKINBOX_BATCH_LINGER_US=3000 +multiple-acks:}"
echo "== CPU µs per delivery, before and after each change"
full_step=$STEP
STEP="${COST_STEP:-20}" COST_VARIANTS="$FULL_VARIANTS"
# shellcheck disable=SC2086
cost_table ${COST_RATES:-500 1000 2000} > "$work/cost"
STEP=$full_step
cat "$work/cost" >&2

echo "== hookinbox: highest sustainable rate S"
start_stack s
# V: the candidate held for VERIFY seconds. S: then held for HOLD seconds,
# starting from V.
search=$(loadgen --search --rate 100 --step-duration "$STEP" --verify "$VERIFY" --hold "$HOLD" \
  --redeliver 0.1 --pid "$INGEST_PID" | tee -a /dev/stderr)
v=$(echo "$search" | awk '/^V = / {print $3}')
s=$(echo "$search" | awk '/^S = / {print $3}')
v=${v:-0}; s=${s:-0}
echo "== at S/2 and 0.8 S"
start_stack half
# Should no rate hold for HOLD seconds, V stands in (the report says so);
# should none hold at all, there is nothing to measure latency at.
s_lat=$s; lat_of="S"
[ "$s" -gt 0 ] || { s_lat=$v; lat_of="V (no rate held for $HOLD s)"; }
at_half="not measured: no rate held"; at_80="$at_half"
if [ "$s_lat" -ge 2 ]; then
  at_half=$(loadgen --rate $((s_lat / 2)) --duration "$VERIFY" --redeliver 0.1 | tee -a /dev/stderr)
  start_stack eighty
  at_80=$(loadgen --rate $((s_lat * 8 / 10)) --duration "$VERIFY" --redeliver 0.1 | tee -a /dev/stderr)
fi
echo "== duplicate redeliveries"
start_stack dup
dup=$(loadgen --duplicates-only --search --rate 200 --step-duration "$STEP" --hold "$VERIFY" --no-e2e | tee -a /dev/stderr)
s_dup=$(echo "$dup" | awk '/^S = / {print $3}')

probe_end=$(probe); echo "probe: $probe_end"

ratio() { python3 -c "print(f'{$1 / max($2, 1):.2f}')"; }
# What this design cannot beat here: two cores spent on nothing but the
# broker's work per message and Postgres's per delivery (both from the
# body-share run: the real publisher and consumer; the claim and the
# completion in batches of 16) and a bare receiver's per request (two
# cores over B_http, its load generator included).
limit=$(python3 -c "
mq, pg, http = float('${BODY_MQ:-0}'), float('${BODY_PG:-0}'), 2e6 / max(${b_http:-0}, 1)
print(int(2e6 / max(mq + pg + http, 1)))")
cat > "$report" <<MD
# hookinbox benchmark

$(date -u +%Y-%m-%d), $cpu, $cores cores; the benchmark's own Postgres 15 (bench/postgresql.conf: synchronous_commit=$sync_commit, autovacuum on), RabbitMQ $(rabbitmqctl version 2>/dev/null), all on this one machine. fsync: $fsync. Disk probe (pgbench, $probe_start at the start; $probe_end at the end).

| measure | value |
|---|---|
| B_pg1: pgbench, one claim upsert per transaction, 32 clients | $b_pg1 claims/s |
| B_pgB: pgbench, 64-row UNNEST claim upsert per transaction | $b_pgb claims/s |
| B_mq: raw lapin publisher, confirms, window 256, quorum queue | $b_mq messages/s |
| B_http: actix, read body + HMAC, no I/O | $b_http requests/s |
| B_octokit: @octokit/webhooks createNodeMiddleware, closed loop | ${B_OCTOKIT:-?} requests/s |
| ingest alone (durable, no worker), the same closed loop | ${PEER_INGEST:-?} requests/s (**${PEER_RATIO:-?} × B_octokit**) |
| limit: two cores over the broker's and Postgres's work per delivery and a bare receiver's | $limit deliveries/s |
| **S**: highest sustainable rate of the whole pipeline (10 % redeliveries), held $HOLD s | **$s deliveries/s** |
| V: the same, held $VERIFY s (the hold that S started from) | $v deliveries/s |
| S / B_pg1, S / B_mq, S / limit | $(ratio "$s" "$b_pg1"), $(ratio "$s" "$b_mq"), $(ratio "$s" "$limit") |
| duplicate-redelivery throughput | $s_dup requests/s ($(ratio "${s_dup:-0}" "$s") × S) |

B_octokit and ingest under one closed loop (tests/src/bin/closedloop.rs):

$(sed 's/^/    /' "$work/peer")

Each half of a delivery, CPU µs per delivery:

| design | RabbitMQ | Postgres | both |
|---|---|---|---|
$BODY_SHARE

CPU µs per delivery and process, before and after each change (each row one build, all from this run):

$(cat "$work/cost")

A run is sustained when every request is answered 2xx, the rate is
achieved (95 %), every accepted delivery completes, and the work queue
never grows more than a second of arrivals above its depth at the start
($HOLD_LAG s during the ${VERIFY}-s and ${HOLD}-s holds) and is within half a
second of arrivals of it when sending stops. Queue-depth samples: \`$depth_log\`.

The holds, in order (the last \`verified\` line that held made V, the last
\`held\` line that held made S):

$(echo "$search" | grep -E '^(verified|held)' | sed 's/^/    /')

Latencies below are at fractions of $lat_of.

At S/2 ($((s_lat / 2))/s for $VERIFY s):

    $at_half

At 0.8 S ($((s_lat * 8 / 10))/s for $VERIFY s):

    $at_80
MD
echo "report written to $report"
cat "$report"
