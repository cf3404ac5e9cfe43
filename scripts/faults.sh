#!/usr/bin/env bash
# The fault-injection suite (tests/src/bin/faults/) with the binaries
# built with their kill points (`--features failpoints`, a separate target
# directory, so no other build carries them).
# Usage: scripts/faults.sh [CYCLES] [WORKER_KILLS_PER_CYCLE]
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
cargo build -q --features failpoints -p hookinbox-ingest -p hookinbox-worker --target-dir target/faults
cargo build -q -p hookinbox-tests --bin faults
HOOKINBOX_FAULT_BINS="$(pwd)/target/faults/debug" target/debug/faults "${1:-1}" "${2:-3}" &
suite=$!

faults_cleanup() {
  # shellcheck disable=SC2046
  stop_pids $(descendants "$suite") "$suite"
  local root="${TMPDIR:-/tmp}/hookinbox-faults-$suite"
  if [ -f "$root/pg/postmaster.pid" ]; then
    runuser -u postgres -- /usr/lib/postgresql/15/bin/pg_ctl -D "$root/pg" stop -m immediate -w \
      >/dev/null 2>&1 || true
  fi
  # `rabbitmqctl stop PIDFILE` waits for the file's process, and for the
  # file itself: only when the node left one, and never for long.
  if [ -f "$root/rabbit/pid" ]; then
    timeout 60 rabbitmqctl -q -n "hookinbox-faults-$suite@localhost" stop "$root/rabbit/pid" \
      >/dev/null 2>&1 || kill -9 "$(cat "$root/rabbit/pid")" 2>/dev/null || true
  fi
  if [ -f "$root/pgbouncer.port" ]; then
    scripts/pgbouncer.sh stop "$(cat "$root/pgbouncer.port")"
  fi
}
trap faults_cleanup EXIT
wait "$suite"
