#!/usr/bin/env bash
# Starts ingest and a worker natively, a real Prometheus with the repo's
# own scrape config and rules (deploy/prometheus/), sends signed deliveries
# and asks Prometheus for the request rate. Local Postgres and RabbitMQ.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v prometheus >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null
fi
cargo build -q --workspace --bins

. scripts/lib/native.sh
run="promsmoke_$$"
ingest_port=$(free_port); ingest_metrics=$(free_port); worker_metrics=$(free_port); prom_port=$(free_port)
scratch_db "$run"

export DATABASE_URL="$base/$run" HOOKINBOX_QUEUE_PREFIX="$run" HOOKINBOX_LOG_FORMAT=json
export HOOKINBOX_GITHUB_SECRET="prometheus-smoke"
HOOKINBOX_LISTEN="127.0.0.1:$ingest_port" HOOKINBOX_METRICS_LISTEN="127.0.0.1:$ingest_metrics" \
  target/debug/hookinbox-ingest 2>"$work/ingest.log" & pids+=($!)
HOOKINBOX_METRICS_LISTEN="127.0.0.1:$worker_metrics" \
  target/debug/hookinbox-worker 2>"$work/worker.log" & pids+=($!)

# The repo's config with its targets pointed here: the compose DNS names
# become these local ports, everything else (jobs, paths, relabelling,
# rule files) is the file as it is.
mkdir -p "$work/rules"
cp deploy/prometheus/rules/*.rules.yml "$work/rules/"
python3 - "$work/prometheus.yml" "$ingest_metrics" "$worker_metrics" "$prom_port" <<'PY'
import re, sys
out, ingest, worker, prom = sys.argv[1:]
text = open("deploy/prometheus/prometheus.yml").read()
text = text.replace("scrape_interval: 15s", "scrape_interval: 1s")
text = text.replace('"ingest:9898"', f'"127.0.0.1:{ingest}"')
text = re.sub(r"dns_sd_configs:\n(\s+)- names: \[\"worker\"\]\n(?:\s+\w+: .*\n)+?(?=\s+relabel_configs)",
              lambda m: f"static_configs:\n{m.group(1)}- targets: [\"127.0.0.1:{worker}\"]\n", text)
text = text.replace('"localhost:9090"', f'"127.0.0.1:{prom}"')
open(out, "w").write(text)
PY
promtool check config "$work/prometheus.yml" >/dev/null
prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/data" \
  --web.listen-address="127.0.0.1:$prom_port" --log.level=warn 2>"$work/prometheus.log" & pids+=($!)

query() { curl -fsS "http://127.0.0.1:$prom_port/api/v1/query" --data-urlencode "query=$1"; }
for _ in $(seq 1 60); do curl -fsS "http://127.0.0.1:$ingest_port/readyz" >/dev/null 2>&1 && break; sleep 0.5; done
# Let Prometheus scrape the services first: a rate needs the counter to
# rise between two scrapes.
for _ in $(seq 1 60); do
  query 'sum(up{job=~"hookinbox-.*"})' 2>/dev/null | grep -q '"2"' && break
  sleep 0.5
done
echo "sending 50 signed deliveries over 5 s"
for i in $(seq 1 50); do
  body="{\"action\":\"opened\",\"number\":$i}"
  sig=$(printf '%s' "$body" | openssl dgst -sha256 -hmac "$HOOKINBOX_GITHUB_SECRET" -hex | sed 's/^.*= //')
  curl -fsS -o /dev/null "http://127.0.0.1:$ingest_port/webhooks/github" \
    -H 'Content-Type: application/json' -H 'X-GitHub-Event: issues' \
    -H "X-GitHub-Delivery: smoke-$i" -H "X-Hub-Signature-256: sha256=$sig" --data-raw "$body"
  sleep 0.1
done

for _ in $(seq 1 60); do
  rate=$(query 'sum(rate(hookinbox_ingest_requests_total{outcome="accepted"}[1m]))' || true)
  if echo "$rate" | grep -q '"value":\[[0-9.]*,"[0-9.]*[1-9]'; then break; fi
  sleep 1
done
echo "up:           $(query 'up{job=~"hookinbox-.*"}' | python3 -c 'import json,sys; print([(r["metric"]["job"], r["value"][1]) for r in json.load(sys.stdin)["data"]["result"]])')"
echo "request rate: $(echo "$rate" | python3 -c 'import json,sys; print(json.load(sys.stdin)["data"]["result"])')"
echo "completed:    $(query 'sum(hookinbox_jobs_total{outcome="completed"})' | python3 -c 'import json,sys; print(json.load(sys.stdin)["data"]["result"][0]["value"][1])')"
echo "$rate" | grep -q '"value":\[[0-9.]*,"[0-9.]*[1-9]' || { echo "Prometheus did not see the request rate"; exit 1; }
echo "prometheus smoke: ok"
