#!/usr/bin/env bash
# Runs hookinbox on this machine, without Docker: ingest, a worker and the
# admin console against the local Postgres and RabbitMQ (installed from
# Debian and started first when missing or down: scripts/lib/services.sh),
# in a fresh database and queue prefix of their own. Prints the URLs, the
# console's sign-in secret and a signed sample `curl`, then runs until
# Ctrl-C, which stops every process it started and drops its database and
# queues.
#
#   scripts/run-local.sh
#
# Each process logs to target/run-local/<name>.log, kept after the stop.
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/lib/services.sh
services_up
cargo build -q -p hookinbox-ingest -p hookinbox-worker --bins

. scripts/lib/native.sh
# Ctrl-C (or a kill) ends the script; the EXIT trap of native.sh then
# stops every process in $pids and drops the database and its queues.
trap 'exit 130' INT TERM
run="hookinbox_local_$$"
scratch_db "$run"
logs=target/run-local
mkdir -p "$logs"

ingest_port=$(free_port)
ingest_metrics=$(free_port)
worker_metrics=$(free_port)
admin_port=$(free_port)
secret=$(openssl rand -hex 20)
admin_secret=$(openssl rand -hex 24)
printf 'local operator %s\n' "$admin_secret" > "$work/admin-tokens"

export DATABASE_URL="$base/$run" HOOKINBOX_QUEUE_PREFIX="$run"
export AMQP_URL="${AMQP_URL:-amqp://guest:guest@127.0.0.1:5672/%2f}"
export HOOKINBOX_GITHUB_SECRET="$secret" HOOKINBOX_LOG_FORMAT=text
target/debug/hookinbox-worker migrate > /dev/null 2> "$logs/migrate.log"

HOOKINBOX_LISTEN="127.0.0.1:$ingest_port" HOOKINBOX_METRICS_LISTEN="127.0.0.1:$ingest_metrics" \
  target/debug/hookinbox-ingest 2> "$logs/ingest.log" & pids+=($!)
HOOKINBOX_METRICS_LISTEN="127.0.0.1:$worker_metrics" \
  target/debug/hookinbox-worker 2> "$logs/worker.log" & pids+=($!)
HOOKINBOX_ADMIN_LISTEN="127.0.0.1:$admin_port" HOOKINBOX_ADMIN_TOKENS_FILE="$work/admin-tokens" \
  target/debug/hookinbox-worker admin 2> "$logs/admin.log" & pids+=($!)

# Each answers /readyz once it is up (a process that died says so in its log).
for ready in "$ingest_port" "$worker_metrics" "$admin_port"; do
  for _ in $(seq 1 120); do
    curl -fsS -o /dev/null "http://127.0.0.1:$ready/readyz" 2>/dev/null && continue 2
    for pid in "${pids[@]}"; do
      kill -0 "$pid" 2>/dev/null || { echo "a process stopped; see $logs/*.log" >&2; exit 1; }
    done
    sleep 0.5
  done
  echo "nothing answered on 127.0.0.1:$ready; see $logs/*.log" >&2
  exit 1
done

cat <<EOF

hookinbox is running (database and queue prefix $run; logs in $logs/):
  webhooks       http://127.0.0.1:$ingest_port/webhooks/github
  admin console  http://127.0.0.1:$admin_port   sign in with: $admin_secret
  metrics        http://127.0.0.1:$ingest_metrics/metrics (ingest), http://127.0.0.1:$worker_metrics/metrics (worker)
  webhook secret $secret

Send a signed sample delivery (answers 202 accepted):

body='{"action":"opened","issue":{"number":1}}'
curl -i http://127.0.0.1:$ingest_port/webhooks/github \\
  -H 'Content-Type: application/json' \\
  -H 'X-GitHub-Event: issues' \\
  -H "X-GitHub-Delivery: \$(cat /proc/sys/kernel/random/uuid)" \\
  -H "X-Hub-Signature-256: sha256=\$(printf '%s' "\$body" | openssl dgst -sha256 -hmac '$secret' -hex | sed 's/^.*= //')" \\
  --data-raw "\$body"

Ctrl-C stops everything.
EOF
wait
