#!/usr/bin/env bash
# Runs the whole test suite against the local Postgres and RabbitMQ. On a
# Debian 12 machine without them it installs them from Debian first
# (pinned, non-interactive) and starts them, with the test tools
# (cargo-nextest, Chromium and its chromedriver): scripts/lib/services.sh,
# which .ci/run uses too. A service that is up is used as it is.
#
# The integration tests start the real binaries too, so they are built
# first (`cargo nextest run` alone builds only test targets). Extra
# arguments go to nextest, e.g. `scripts/test.sh -E 'test(fenced)'`.
#
#   scripts/test.sh --through-pgbouncer
# runs the suite's core paths (ingest, the worker, the operator commands,
# retention, the reconciler, the console's API) with every hookinbox
# process reaching Postgres through a private PgBouncer in transaction
# mode (scripts/pgbouncer.sh, port 6543), as HOOKINBOX_DB_POOLER=transaction
# deployments do. The tests' own assertions still read Postgres directly.
# That PgBouncer is stopped when the run ends, passed, failed or
# interrupted (one that was already running is left as it was).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/services.sh
services_up
ensure_nextest
ensure_chromium
ensure_node
if [ -z "${HOOKINBOX_GITHUB_FIXTURES:-}" ] && [ -d ../shared/fixtures/github-payloads ]; then
  HOOKINBOX_GITHUB_FIXTURES="$(cd ../shared/fixtures/github-payloads && pwd)"
  export HOOKINBOX_GITHUB_FIXTURES
fi
cargo build --workspace --bins --examples
if [ "${1:-}" = "--through-pgbouncer" ]; then
  shift
  ensure_pgbouncer
  pidfile=/tmp/hookinbox-pgbouncer-6543/pgbouncer.pid
  if ! { [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }; then
    trap 'scripts/pgbouncer.sh stop 6543' EXIT
  fi
  scripts/pgbouncer.sh start 6543 5432
  export HOOKINBOX_TEST_PGBOUNCER=127.0.0.1:6543
  core='ingest_dedup|github_corpus|ingest_replay_guard|ingest_rate_limits|worker_retries'
  core+='|worker_failures|worker_fencing|worker_forward|worker_bad_bodies|worker_shutdown'
  core+='|operator_cli|retention|reconciler|sources|admin_api'
  # Not the tests that put a proxy of their own in front of Postgres.
  direct='worker_holds_messages_while_postgres_is_unreachable'
  # Not `exec`: the trap stops PgBouncer after the run.
  cargo nextest run --workspace --no-fail-fast \
    -E "binary(it) & test(/^($core)::/) & !test(/$direct/)" "$@"
  exit
fi
# RabbitMQ 3.10 gives up on the supervisor of the quorum queues'
# dead-letter workers after two of them crash within five seconds (a queue
# deleted while its declare is still electing a leader does it), and never
# starts it again: every queue declared after that fails with `noproc`. A
# watchdog restarts it every few seconds while the suite runs, and nextest
# retries a test once (.config/nextest.toml), so that a test caught in
# that window does not fail the run for the broker's bug.
dlx_watchdog() {
  while sleep 2; do
    rabbitmqctl -q eval 'is_pid(whereis(rabbit_fifo_dlx_sup)) orelse element(1, supervisor:restart_child(rabbit_sup, rabbit_fifo_dlx_sup)) =:= ok.' >/dev/null 2>&1 || true
  done
}
dlx_watchdog &
watchdog=$!
trap 'kill "$watchdog" 2>/dev/null || true' EXIT
cargo nextest run --workspace --no-fail-fast "$@"
# Tests that restart the shared RabbitMQ run alone, after the suite.
if [ "$#" -eq 0 ]; then
  cargo nextest run --workspace --no-fail-fast --run-ignored only --test-threads 1
fi
