#!/usr/bin/env bash
# Times the admin console's API on a big table: loads N deliveries (default
# 1,000,000) into a scratch database with bulk SQL, starts
# `hookinbox-worker admin` (release build) on a free port, and reports p50
# and p99 of the list (first and deeper pages), filter, count and detail
# requests, and of the overview. Target: p99 under 100 ms.
#
#   scripts/admin-bench.sh [N] [REQUESTS_PER_KIND]
#
# Everything it makes (the database, the console, the tokens file) is
# removed on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/native.sh
n="${1:-1000000}"
per_kind="${2:-300}"
db="hookinbox_adminbench_$$"

cargo build --release -q -p hookinbox-worker
bin=target/release/hookinbox-worker
scratch_db "$db"
export DATABASE_URL="$base/$db" HOOKINBOX_QUEUE_PREFIX="$db" RUST_LOG=warn HOOKINBOX_AUTO_MIGRATE=false
$bin migrate >/dev/null

echo "loading $n deliveries ..."
load_start=$(date +%s)
# The shape of a busy installation: 5 sources, 30 events with 7 actions,
# 1,000 repositories, a month of history; 96% completed, 3% dead letters
# (three classes), 0.5% waiting for a retry, 0.5% in flight. Dead letters
# and retries have a parked body, as the state machine leaves them.
psql -q -v ON_ERROR_STOP=1 "$DATABASE_URL" <<SQL
insert into deliveries (provider, source, hook_id, delivery_id, event, action, repository,
                        body_sha256, status, retryable, claim_token, lease_until, attempts,
                        created_at, claimed_at, completed_at, failed_at, first_failed_at,
                        next_attempt_at, dead_lettered_at, last_error_class, last_error)
select 'github', 'src' || (i % 5), '1', md5(i::text), 'ev' || (i % 30), 'act' || (i % 7),
       'owner/repo' || (i % 1000), sha256(i::text::bytea),
       s.status, s.retryable, gen_random_uuid(),
       case when s.status = 'processing' then now() + interval '1 minute' end,
       case when s.status = 'processing' then 0 else 1 end,
       t, t,
       case when s.status = 'completed' then t + interval '1 second' end,
       case when s.status = 'failed' then t + interval '1 second' end,
       case when s.status = 'failed' then t + interval '1 second' end,
       case when s.retryable then now() + interval '1 hour' end,
       case when s.status = 'failed' and not s.retryable then t + interval '2 seconds' end,
       case when s.status = 'failed' and s.retryable then 'transient'
            when s.status = 'failed' then (array['permanent', 'poison', 'max_attempts'])[1 + i % 3] end,
       case when s.status = 'failed' then 'receiver said 422' end
from generate_series(1, $n) i,
     lateral (select now() - make_interval(secs => ($n - i) * (2592000.0 / $n)) as t) ts,
     lateral (select case when i % 200 = 0 then 'processing'
                          when i % 200 = 1 then 'failed'
                          when i % 100 in (2, 3, 4) then 'failed'
                          else 'completed' end as status,
                     i % 200 = 1 as retryable) s;
insert into parked_bodies (provider, source, hook_id, delivery_id, content_type, headers, body)
select provider, source, hook_id, delivery_id, 'application/json',
       jsonb_build_array(jsonb_build_array('x-github-event', event)),
       convert_to(json_build_object('action', action, 'repository', json_build_object('full_name', repository),
                                    'padding', repeat('x', 1500))::text, 'UTF8')
from deliveries where status = 'failed';
vacuum analyze deliveries;
vacuum analyze parked_bodies;
SQL
echo "loaded in $(( $(date +%s) - load_start )) s: $(psql -Atq "$DATABASE_URL" -c "select count(*) from deliveries") deliveries, $(psql -Atq "$DATABASE_URL" -c "select count(*) from deliveries where status = 'failed' and not retryable") dead letters"

token="bench-operator-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')"
printf 'bench operator %s\n' "$token" > "$work/tokens"
port=$(free_port)
HOOKINBOX_ADMIN_LISTEN="127.0.0.1:$port" HOOKINBOX_ADMIN_TOKENS_FILE="$work/tokens" \
  HOOKINBOX_METRICS_LISTEN="127.0.0.1:$(free_port)" $bin admin &
pids+=($!)
for _ in $(seq 1 100); do
  curl -fsS -o /dev/null "http://127.0.0.1:$port/readyz" 2>/dev/null && break
  sleep 0.1
done

# Sample delivery ids for the detail and prefix requests.
psql -Atq "$DATABASE_URL" -c "select source || '/' || delivery_id from deliveries
  where status = 'failed' and not retryable order by md5(delivery_id || 'x') limit $per_kind" > "$work/dead"
psql -Atq "$DATABASE_URL" -c "select source || '/' || delivery_id from deliveries
  where status = 'completed' order by md5(delivery_id || 'y') limit $per_kind" > "$work/done"

python3 - "$port" "$token" "$per_kind" "$work" <<'PY'
import http.client, json, random, sys, time
port, token, per_kind, work = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
conn = http.client.HTTPConnection("127.0.0.1", port)
headers = {"Authorization": f"Bearer {token}"}
random.seed(7)

def get(path):
    start = time.perf_counter()
    conn.request("GET", path, headers=headers)
    resp = conn.getresponse()
    body = resp.read()
    took = (time.perf_counter() - start) * 1000
    if resp.status != 200:
        sys.exit(f"{path}: {resp.status} {body[:200]!r}")
    return took, json.loads(body)

filters = [
    "status=dead", "status=retrying", "status=processing", "status=completed",
    "status=dead&source=src2", "status=dead&error_class=poison", "error_class=max_attempts",
    "source=src3", "event=ev7", "event=ev7&action=act3", "action=act5",
    "repository=owner/repo{r}", "repository=owner/repo{r}&status=completed",
    "since=1d", "since=7d&event=ev12", "until=20d&status=dead", "delivery_id={p}",
    "since=2h&status=dead",
]
def a_filter():
    f = random.choice(filters)
    return f.format(r=random.randrange(1000), p="%03x" % random.randrange(4096))

def filters_of(f):
    """The filter's shape: values of the repository and prefix left out."""
    return "&".join(p.split("=")[0] + ("=" + p.split("=")[1] if p.split("=")[0] in ("status", "source", "event", "action", "error_class", "since", "until") else "=…") for p in f.split("&"))

def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]

results = {}
# Warm the connection and the console's prepared statements.
for _ in range(20):
    get("/api/v1/deliveries?" + a_filter())
    get("/api/v1/deliveries/count?" + a_filter())

times = []
cursor = None
for i in range(per_kind):
    if i % 50 == 0:
        cursor = None  # back to the first page now and then
    took, body = get("/api/v1/deliveries?limit=50" + (f"&cursor={cursor}" if cursor else ""))
    cursor = body["next_cursor"]
    times.append(took)
results["list (50 a page, following next_cursor 50 pages deep)"] = times

by_filter = {}
times = []
for i in range(per_kind):
    f = a_filter()
    took, body = get("/api/v1/deliveries?limit=50&" + f)
    times.append(took)
    by_filter.setdefault(filters_of(f), [[], []])[0].append(took)
results["filter (list with one of %d filters)" % len(filters)] = times

times = []
for i in range(per_kind):
    f = a_filter()
    took, _ = get("/api/v1/deliveries/count?" + f)
    times.append(took)
    by_filter.setdefault(filters_of(f), [[], []])[1].append(took)
results["count (the same filters)"] = times

times = []
dead = open(f"{work}/dead").read().split()
done = open(f"{work}/done").read().split()
for i in range(per_kind):
    key = dead[i % len(dead)] if i % 2 == 0 else done[i % len(done)]
    took, body = get(f"/api/v1/deliveries/{key}?hook_id=1")
    times.append(took)
results["detail (dead letters with payload, completed rows)"] = times

times = []
for i in range(max(20, per_kind // 10)):
    took, _ = get("/api/v1/overview")
    times.append(took)
results["overview"] = times

times = []
for i in range(max(20, per_kind // 10)):
    took, _ = get("/api/v1/deliveries/count")
    times.append(took)
results["count of everything (no filter)"] = times

print()
print(f"{'request':60} {'n':>5} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
for name, xs in results.items():
    print(f"{name:60} {len(xs):5} {pct(xs, 50):8.1f} {pct(xs, 99):8.1f} {max(xs):8.1f}")
print()
print(f"{'by filter':46} {'list p50':>9} {'list max':>9} {'count p50':>10} {'count max':>10}")
for name, (lists, counts) in sorted(by_filter.items()):
    l50, lmax = (pct(lists, 50), max(lists)) if lists else (0, 0)
    c50, cmax = (pct(counts, 50), max(counts)) if counts else (0, 0)
    print(f"{name:46} {l50:9.1f} {lmax:9.1f} {c50:10.1f} {cmax:10.1f}")
PY
