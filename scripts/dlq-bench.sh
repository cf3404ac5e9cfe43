#!/usr/bin/env bash
# Times the operator's dead-letter commands over N dead letters (default
# 10,000) in a scratch database, against the local Postgres and RabbitMQ.
# Usage: scripts/dlq-bench.sh [N]
set -euo pipefail
cd "$(dirname "$0")/.."
n="${1:-10000}"
db="hookinbox_dlqbench_$$"
base="${HOOKINBOX_TEST_POSTGRES:-postgres://postgres@127.0.0.1:5432}"
cargo build --release -q -p hookinbox-worker
bin=target/release/hookinbox-worker
psql -q "$base/postgres" -c "create database $db"
trap 'psql -q "$base/postgres" -c "drop database if exists $db with (force)"' EXIT
export DATABASE_URL="$base/$db" HOOKINBOX_QUEUE_PREFIX="dlqbench-$$" RUST_LOG=warn
$bin migrate >/dev/null
psql -q "$DATABASE_URL" <<SQL
insert into deliveries (provider, source, hook_id, delivery_id, event, action, body_sha256,
                        status, retryable, claim_token, attempts, failed_at, first_failed_at,
                        dead_lettered_at, last_error_class, last_error)
select 'github', 'default', '1', 'dead-' || i, 'push', null, sha256(i::text::bytea),
       'failed', false, gen_random_uuid(), 1, now() - (i || ' seconds')::interval,
       now() - (i || ' seconds')::interval, now(), 'permanent', 'receiver said 422'
from generate_series(1, $n) i;
insert into parked_bodies (provider, source, hook_id, delivery_id, content_type, headers, body)
select 'github', 'default', '1', 'dead-' || i, 'application/json', '[]', convert_to(repeat('x', 2048), 'UTF8')
from generate_series(1, $n) i;
analyze;
SQL
time_it() {
  local start end
  start=$(date +%s.%N)
  "$@" >/dev/null
  end=$(date +%s.%N)
  printf '%-48s %6.3f s\n' "$*" "$(echo "$end - $start" | bc)"
}
echo "dead letters: $n"
time_it $bin dlq list
time_it $bin dlq list --limit 0
time_it $bin dlq list --limit 0 --json
time_it $bin dlq replay --all --dry-run
