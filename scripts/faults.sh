#!/usr/bin/env bash
# The fault-injection suite (tests/src/bin/faults/) with the binaries
# built with their kill points (`--features failpoints`, a separate target
# directory, so no other build carries them).
# Usage: scripts/faults.sh [--cluster] [CYCLES] [WORKER_KILLS_PER_CYCLE]
#   --cluster: RabbitMQ as a three-node cluster (every AMQP_URL lists the
#   nodes) and Postgres with a synchronous streaming standby (every
#   DATABASE_URL lists both); the node leading the most queues is killed,
#   the nodes are restarted in turn, and the last cycle ends with a
#   failover to the standby. The report adds leader placement and each
#   such fault's 5xx seconds and recovery time.
#   HOOKINBOX_FAULT_REPORT=path writes the Markdown report there too.
#   HOOKINBOX_FAULT_OUTAGE_SECS=N: the destination outage of the first
#   cycle (15 s by default, as in CI; minutes in a full run).
#   HOOKINBOX_FAULT_PGBOUNCER=1: ingest and workers go through PgBouncer.
# Each cycle also breaks a `forward` destination (slow, 503, 404, refused,
# reset mid-answer) at receivers inside the suite, on 127.0.0.1 only.
#
# The suite stops what it started when it ends (its private Postgres, its
# RabbitMQ node, its PgBouncer, ingest and the workers; the destinations'
# receivers are threads of the suite and end with it). If it is
# interrupted or dies first, the trap below does: the suite's processes,
# then the instances, found by the suite's working folder and node name.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/procs.sh
if [ "${1:-}" = "--cluster" ]; then
  export HOOKINBOX_FAULT_CLUSTER=1
  shift
fi
cargo build -q --features failpoints -p hookinbox-ingest -p hookinbox-worker --target-dir target/faults
cargo build -q -p hookinbox-tests --bin faults
HOOKINBOX_FAULT_BINS="$(pwd)/target/faults/debug" target/debug/faults "${1:-1}" "${2:-3}" &
suite=$!

faults_cleanup() {
  # shellcheck disable=SC2046
  stop_pids $(descendants "$suite") "$suite"
  local root="${TMPDIR:-/tmp}/hookinbox-faults-$suite"
  local pg rabbit
  for pg in "$root/pg" "$root/standby"; do
    if [ -f "$pg/postmaster.pid" ]; then
      runuser -u postgres -- /usr/lib/postgresql/15/bin/pg_ctl -D "$pg" stop -m immediate -w \
        >/dev/null 2>&1 || true
    fi
  done
  # `rabbitmqctl stop PIDFILE` waits for the file's process, and for the
  # file itself: only when the node left one, and never for long. Each
  # node's folder names it (`rabbit/node`, or `rabbit-N/node` in a cluster).
  for rabbit in "$root"/rabbit*; do
    if [ -f "$rabbit/pid" ] && [ -f "$rabbit/node" ]; then
      timeout 60 rabbitmqctl -q -n "$(cat "$rabbit/node")" stop "$rabbit/pid" \
        >/dev/null 2>&1 || kill -9 "$(cat "$rabbit/pid")" 2>/dev/null || true
    fi
  done
  if [ -f "$root/pgbouncer.port" ]; then
    scripts/pgbouncer.sh stop "$(cat "$root/pgbouncer.port")"
  fi
}
trap faults_cleanup EXIT
wait "$suite"
