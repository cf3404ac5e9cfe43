"""The Postgres connection budget of one rendered kustomize overlay.

    python3 scripts/lib/connection_budget.py OVERLAY RENDERED.yaml

Computes the most connections the overlay's processes can hold at once and
fails, naming the overlay and every term, when that exceeds the
max_connections the overlay declares (docs/operations.md, "The connection
budget"):

    Σ over Deployments ((max replicas + rollout surge) × connections per pod)
      + the migrate Job + the reserve  ≤  max_connections

- max replicas: the maxReplicas of the HorizontalPodAutoscaler, or the
  maxReplicaCount of the KEDA ScaledObject, that scales the Deployment;
  its `replicas` when nothing scales it.
- rollout surge: the pods a rolling update adds on top (maxSurge, 25 % by
  default, rounded up); a rollout of a new image runs in every Deployment at
  once.
- connections per pod: HOOKINBOX_DB_POOL_SIZE (its env, else the
  hookinbox-config ConfigMap, else the code's default, read from
  shared/src/config/mod.rs); the admin console caps its pool (read from
  operator/src/console/startup.rs); `hookinbox-worker migrate` opens one.
- the declared budget: annotations on the ConfigMap hookinbox-config,
  hookinbox.io/postgres-max-connections and
  hookinbox.io/postgres-reserved-connections (superuser_reserved_connections,
  monitoring, operators' psql and CLI commands).

With PgBouncer in the overlay (a Deployment whose container runs pgbouncer,
its pgbouncer.ini in a ConfigMap), processes with
HOOKINBOX_DB_POOLER=transaction connect their pool to PgBouncer: those pools
count against PgBouncer's max_client_conn (each PgBouncer pod must take all
of them, as when the other pods restart), and Postgres sees PgBouncer's
server connections (max_db_connections per pod) plus the direct ones:
LEADER_CONNECTIONS per worker pod (its leaders' session advisory locks,
through HOOKINBOX_DIRECT_DATABASE_URL; read from shared/src/config/mod.rs),
the processes that do not pool, the migrate Job, and the reserve.
"""

import configparser
import math
import pathlib
import re
import sys

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
MAX_ANNOTATION = "hookinbox.io/postgres-max-connections"
RESERVE_ANNOTATION = "hookinbox.io/postgres-reserved-connections"
PGBOUNCER_DATABASE = "hookinbox"


def code_default_pool():
    src = (ROOT / "shared/src/config/mod.rs").read_text()
    m = re.search(r'env = "HOOKINBOX_DB_POOL_SIZE",.*?default_value_t = (\d+)', src, re.S)
    if not m:
        sys.exit("FAIL: cannot find the default of HOOKINBOX_DB_POOL_SIZE in shared/src/config/mod.rs")
    return int(m.group(1))


def code_leader_connections():
    """Direct connections a worker's leaders (the gauge sampler, the
    sweeper, the reconciler) hold behind a transaction pooler."""
    src = (ROOT / "shared/src/config/mod.rs").read_text()
    m = re.search(r"pub const LEADER_CONNECTIONS: usize = (\d+);", src)
    if not m:
        sys.exit("FAIL: cannot find LEADER_CONNECTIONS in shared/src/config/mod.rs")
    return int(m.group(1))


def code_admin_cap():
    src = (ROOT / "operator/src/console/startup.rs").read_text()
    m = re.search(r"const POOL_SIZE: usize = (\d+);", src)
    if not m or "POOL_SIZE.min(common.db_pool_size).max(2)" not in src:
        sys.exit("FAIL: cannot find the admin console's pool cap in operator/src/console/startup.rs")
    return int(m.group(1))


class Overlay:
    def __init__(self, name, docs):
        self.name = name
        self.docs = docs
        self.failures = []

    def find(self, kind, name=None):
        return [d for d in self.docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]

    def fail(self, msg):
        self.failures.append(msg)

    def env(self, container, var):
        """A container's setting: (value, origin); value None when it comes
        from a Secret (unknown here) or is unset (origin None)."""
        for e in container.get("env", []):
            if e["name"] == var:
                if "value" in e:
                    return str(e["value"]), "env"
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    return None, f"secret {ref['name']}/{ref['key']}"
                return None, "env (valueFrom)"
        # envFrom: a later source wins over an earlier one.
        found = (None, None)
        for src in container.get("envFrom", []):
            if "configMapRef" in src:
                for cm in self.find("ConfigMap", src["configMapRef"]["name"]):
                    if var in cm.get("data", {}):
                        found = (str(cm["data"][var]), f"configmap {cm['metadata']['name']}")
        return found

    def max_pods(self, dep):
        """(max replicas, by what, surge)."""
        name = dep["metadata"]["name"]
        replicas, by = dep["spec"].get("replicas", 1), "replicas"
        for hpa in self.find("HorizontalPodAutoscaler"):
            ref = hpa["spec"]["scaleTargetRef"]
            if ref["kind"] == "Deployment" and ref["name"] == name:
                replicas, by = hpa["spec"]["maxReplicas"], "HPA maxReplicas"
        for so in self.find("ScaledObject"):
            ref = so["spec"]["scaleTargetRef"]
            if ref.get("kind", "Deployment") == "Deployment" and ref["name"] == name:
                replicas, by = so["spec"].get("maxReplicaCount", 100), "ScaledObject maxReplicaCount"
        strategy = dep["spec"].get("strategy", {})
        if strategy.get("type", "RollingUpdate") == "Recreate":
            surge = 0
        else:
            raw = strategy.get("rollingUpdate", {}).get("maxSurge", "25%")
            if isinstance(raw, str) and raw.endswith("%"):
                surge = math.ceil(replicas * int(raw[:-1]) / 100)
            else:
                surge = int(raw)
        return replicas, by, surge


def role(container):
    cmd = container.get("command") or []
    image = container.get("image", "")
    if cmd and cmd[0].endswith("hookinbox-ingest"):
        return "ingest"
    if cmd and cmd[0].endswith("hookinbox-worker"):
        sub = [a for a in cmd[1:] if not a.startswith("-")]
        return {(): "worker", ("admin",): "admin", ("migrate",): "migrate"}.get(tuple(sub), "other")
    if "pgbouncer" in image or (cmd and cmd[0].endswith("pgbouncer")):
        return "pgbouncer"
    return None


def read_pgbouncer(ov, dep):
    """pgbouncer.ini of the Deployment (from the ConfigMap it mounts)."""
    pod = dep["spec"]["template"]["spec"]
    for vol in pod.get("volumes", []):
        cm_name = vol.get("configMap", {}).get("name")
        for cm in ov.find("ConfigMap", cm_name) if cm_name else []:
            text = cm.get("data", {}).get("pgbouncer.ini")
            if text is None:
                continue
            ini = configparser.ConfigParser(interpolation=None, delimiters=("=",))
            ini.read_string(text)
            return ini, cm["metadata"]["name"]
    ov.fail(f"{dep['metadata']['name']}: no ConfigMap with pgbouncer.ini mounted")
    return None, None


def check_pgbouncer_ini(ov, ini, where):
    pb = ini["pgbouncer"] if ini.has_section("pgbouncer") else {}

    def need(cond, msg):
        if not cond:
            ov.fail(f"{where}: {msg}")

    need(pb.get("pool_mode", "session").strip() == "transaction", "pool_mode must be transaction")
    need("server_reset_query" in pb and pb["server_reset_query"].strip() == "",
         "server_reset_query must be set empty (transaction pooling)")
    ignored = {p.strip() for p in pb.get("ignore_startup_parameters", "").split(",")}
    need({"extra_float_digits", "options"} <= ignored,
         "ignore_startup_parameters must list extra_float_digits and options")
    need("max_prepared_statements" not in pb, "max_prepared_statements needs PgBouncer 1.21; the overlay targets 1.18")
    need(int(pb.get("max_db_connections", "0")) > 0, "max_db_connections must bound the server connections")
    dbs = ini["databases"] if ini.has_section("databases") else {}
    entry = dbs.get(PGBOUNCER_DATABASE, "")
    need(entry, f"[databases] has no {PGBOUNCER_DATABASE} entry")
    query = re.search(r"connect_query\s*=\s*'((?:[^']|'')*)'", entry)
    query = query.group(1).replace("''", "'") if query else ""
    need("enable_seqscan" in query and "idle_in_transaction_session_timeout" in query,
         f"the {PGBOUNCER_DATABASE} entry's connect_query must set enable_seqscan and idle_in_transaction_session_timeout")
    return pb


def main():
    overlay, rendered = sys.argv[1], sys.argv[2]
    with open(rendered) as f:
        ov = Overlay(overlay, [d for d in yaml.safe_load_all(f) if d])
    default_pool = code_default_pool()
    admin_cap = code_admin_cap()
    leader_connections = code_leader_connections()

    cms = ov.find("ConfigMap", "hookinbox-config")
    ann = cms[0]["metadata"].get("annotations", {}) if cms else {}
    try:
        max_connections = int(ann[MAX_ANNOTATION])
        reserve = int(ann[RESERVE_ANNOTATION])
    except (KeyError, ValueError):
        sys.exit(f"FAIL: {overlay}: the ConfigMap hookinbox-config must carry the annotations "
                 f"{MAX_ANNOTATION} and {RESERVE_ANNOTATION} (integers)")

    postgres = []    # (term, connections)
    clients = []     # through PgBouncer
    bouncers = []    # (deployment, pods, pgbouncer section)
    for dep in ov.find("Deployment"):
        name = dep["metadata"]["name"]
        container = dep["spec"]["template"]["spec"]["containers"][0]
        kind = role(container)
        if kind is None:
            continue
        replicas, by, surge = ov.max_pods(dep)
        pods = replicas + surge
        pods_text = f"({replicas} {by} + {surge} surge)"
        if kind == "pgbouncer":
            ini, cm = read_pgbouncer(ov, dep)
            if ini is not None:
                pb = check_pgbouncer_ini(ov, ini, f"{name} ({cm})")
                bouncers.append((name, pods, pb))
                per = int(pb.get("max_db_connections", "0"))
                postgres.append((f"{name}: {pods_text} × max_db_connections {per}", pods * per))
            continue
        if kind in ("migrate", "other"):
            ov.fail(f"{name}: a Deployment running hookinbox-worker {kind!r} is not budgeted")
            continue
        value, origin = ov.env(container, "HOOKINBOX_DB_POOL_SIZE")
        if value is None and origin is not None:
            ov.fail(f"{name}: HOOKINBOX_DB_POOL_SIZE must be a literal (it comes from {origin})")
            continue
        pool = int(value) if value is not None else default_pool
        pool_text = f"HOOKINBOX_DB_POOL_SIZE {pool}" if value is not None else f"pool {pool} (code default)"
        if kind == "admin":
            pool = max(2, min(pool, admin_cap))
            pool_text += f", capped at {pool}"
        pooler, _ = ov.env(container, "HOOKINBOX_DB_POOLER")
        pooler = pooler or "none"
        _, url_origin = ov.env(container, "DATABASE_URL")
        through_bouncer = "PGBOUNCER" in (url_origin or "").upper()
        if through_bouncer and pooler != "transaction":
            ov.fail(f"{name}: DATABASE_URL points at PgBouncer ({url_origin}) but HOOKINBOX_DB_POOLER is {pooler!r}, "
                    "not 'transaction' (named prepared statements do not survive transaction pooling)")
        if pooler == "transaction" or through_bouncer:
            if ov.env(container, "HOOKINBOX_DIRECT_DATABASE_URL")[1] is None:
                ov.fail(f"{name}: HOOKINBOX_DB_POOLER=transaction needs HOOKINBOX_DIRECT_DATABASE_URL "
                        "(migrations and session advisory locks go straight to Postgres)")
            clients.append((f"{name}: {pods_text} × {pool_text}", pods * pool))
            if kind == "worker":
                postgres.append((f"{name} direct: {pods_text} × LEADER_CONNECTIONS {leader_connections} (leader locks)",
                                 pods * leader_connections))
        else:
            postgres.append((f"{name}: {pods_text} × {pool_text}", pods * pool))

    for job in ov.find("Job"):
        container = job["spec"]["template"]["spec"]["containers"][0]
        if role(container) == "migrate":
            par = job["spec"].get("parallelism", 1)
            postgres.append((f"{job['metadata']['name']} Job: {par} pod × 1 (migrate opens one connection)", par))
        elif role(container) is not None:
            ov.fail(f"Job {job['metadata']['name']}: not budgeted")

    postgres.append(("reserve (superuser_reserved_connections, monitoring, operators)", reserve))

    if clients and not bouncers:
        ov.fail("processes run with HOOKINBOX_DB_POOLER=transaction but the overlay has no PgBouncer")

    def show(title, terms, limit, limit_text):
        total = sum(n for _, n in terms)
        width = max(len(t) for t, _ in terms)
        print(f"   {title}")
        for term, n in terms:
            print(f"     {term:<{width}}  {n:>5}")
        verdict = "ok" if total <= limit else "OVER"
        print(f"     {'total':<{width}}  {total:>5}  {'<=' if total <= limit else '>'} {limit_text} {limit}: {verdict}")
        if total > limit:
            ov.fail(f"{title}: {total} > {limit_text} {limit} ("
                    + "; ".join(f"{t} = {n}" for t, n in terms) + ")")
        return total

    print(f"-- connection budget: {overlay}")
    for name, pods, pb in bouncers:
        show(f"PgBouncer clients (every pod of {name} must take them all)", clients,
             int(pb.get("max_client_conn", "100")), "max_client_conn")
    show("Postgres connections", postgres, max_connections, f"{MAX_ANNOTATION}")

    if ov.failures:
        for f in ov.failures:
            print(f"FAIL: connection budget of overlay {overlay}: {f}", file=sys.stderr)
        sys.exit(1)
    print(f"ok: {overlay}: the connection budget fits")


if __name__ == "__main__":
    main()
