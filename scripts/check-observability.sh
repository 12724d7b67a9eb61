#!/usr/bin/env bash
# Offline checks of what the chart ships for monitoring (issue #44):
#   (a) `promtool check rules charts/leasehold/files/alerts.yaml`, the very file whose groups
#       the chart's PrometheusRule ships;
#   (b) `promtool test rules tests/observability/alerts-test.yaml`: series that make each alert
#       fire, and series that must not (a standby's stale gauges, a lock that moves);
#   (c) every PromQL expression of charts/leasehold/files/dashboard.json (panel targets, and the
#       selectors of its label_values variables), Grafana's variables replaced ($__rate_interval
#       -> 5m, $__interval -> 1m, $__range -> 1h, any other $x / ${x} / [[x]] -> .*), written as
#       recording rules into a temporary rules file and checked by `promtool check rules`;
#   (d) every leasehold_* name those expressions and the alerts use (and any the two files
#       name, comments included) is registered in src/controller/metrics.rs and exposed under
#       that name (a counter as _total, a histogram as _bucket/_sum/_count, a gauge bare), and
#       every label they match on is one the metric has (or a label of the scrape target: job,
#       instance, namespace, pod, service, endpoint, container);
#   (e) `helm lint --strict` with both features off and on, and `helm template` with
#       metrics.prometheusRule and metrics.grafanaDashboard enabled, parsed with python3 (PyYAML):
#       the PrometheusRule's groups are alerts.yaml's (and carry the tunables when they are set,
#       also checked by promtool), and the ConfigMap's JSON parses and is dashboard.json.
# promtool comes from Debian's `prometheus` package: `apt-get download` (an `apt-get update`
# only if that fails) and `dpkg -x` into $TOOLS/prometheus-<version>/, never installed, so no
# service is started. Helm is the one scripts/chart-check.sh fetches.
# Prints, as its last line, `metrics used: ` and the sorted leasehold_* base names (as
# registered, without _total/_bucket/_sum/_count) the alerts and the dashboard use.
set -euo pipefail
cd "$(dirname "$0")/.."

TOOLS=${LEASEHOLD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/leasehold}/tools
HELM=$TOOLS/helm-v3.18.0/helm
ALERTS=charts/leasehold/files/alerts.yaml
DASHBOARD=charts/leasehold/files/dashboard.json
ALERT_TESTS=tests/observability/alerts-test.yaml
log() { printf '[check-observability] %s\n' "$*" >&2; }
fail() { log "$*"; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# promtool: Debian's package unpacked, not installed.
promtool=$(ls -d "$TOOLS"/prometheus-*/usr/bin/promtool 2>/dev/null | sort -V | tail -n 1 || true)
if [ -z "$promtool" ]; then
  sudo="" apt_opts=()
  if [ "$(id -u)" = 0 ]; then apt_opts=(-o APT::Sandbox::User=root); else sudo=sudo; fi
  mkdir "$work/deb"
  log "fetching Debian's prometheus package for promtool (apt-get download)"
  if ! (cd "$work/deb" && apt-get download -qq "${apt_opts[@]}" prometheus) >"$work/apt.log" 2>&1; then
    log "apt-get download failed: apt-get update, then again"
    $sudo apt-get update -qq >>"$work/apt.log" 2>&1 || { cat "$work/apt.log" >&2; fail "apt-get update failed"; }
    (cd "$work/deb" && apt-get download -qq "${apt_opts[@]}" prometheus) >>"$work/apt.log" 2>&1 ||
      { cat "$work/apt.log" >&2; fail "apt-get download prometheus failed"; }
  fi
  deb=$(ls "$work"/deb/prometheus_*.deb)
  version=$(dpkg-deb -f "$deb" Version)
  dest=$TOOLS/prometheus-${version//[:~]/_}
  mkdir -p "$TOOLS"
  rm -rf "$dest.tmp" && dpkg -x "$deb" "$dest.tmp" && rm -rf "$dest" && mv "$dest.tmp" "$dest"
  promtool=$dest/usr/bin/promtool
fi
[ -x "$promtool" ] || fail "no promtool at $promtool"
if [ ! -x "$HELM" ]; then
  log "fetching helm (scripts/chart-check.sh --tools-only)"
  scripts/chart-check.sh --tools-only >/dev/null
fi

check_rules() { # check_rules FILE WHAT: promtool check rules, its output shown only on failure
  "$promtool" check rules "$1" >"$work/promtool.log" 2>&1 || { cat "$work/promtool.log" >&2; fail "promtool check rules: $2"; }
}

log "(a) promtool check rules $ALERTS ($("$promtool" --version 2>&1 | head -n 1))"
check_rules "$ALERTS" "$ALERTS"

log "(b) promtool test rules $ALERT_TESTS"
"$promtool" test rules "$ALERT_TESTS" >"$work/test.log" 2>&1 || { cat "$work/test.log" >&2; fail "the alerts' unit tests failed"; }

# (c) and (d): the dashboard's expressions as recording rules; the names and labels used
# against metrics.rs. Writes $work/dashboard-rules.yaml and $work/metrics-used.
log "(c) the dashboard's expressions are PromQL; (d) they and the alerts use metrics.rs's names and labels"
python3 - "$ALERTS" "$DASHBOARD" src/controller/metrics.rs "$work" <<'PY'
import json, re, sys
import yaml

alerts_path, dashboard_path, metrics_rs, work = sys.argv[1:]
errors = []

# --- the registry, as src/controller/metrics.rs writes it ---------------------------
src = open(metrics_rs, encoding="utf-8").read()
prefix = re.search(r'Registry::with_prefix\("(\w+)"\)', src).group(1)
label_sets = {
    name: re.findall(r"pub (\w+): String", body)
    for name, body in re.findall(r"pub struct (\w+Labels) \{(.*?)\n\}", src, re.S)
}
struct = re.search(r"pub struct Metrics \{(.*?)\n\}", src, re.S).group(1)
field_types = dict(re.findall(r"pub (\w+): ([\w<>, ]+),", struct))
registered = {}  # exposed base name -> (type, labels)

def kind_of(ty):
    m = re.fullmatch(r"Family<(\w+), (\w+)>", ty.replace("::", ""))
    labels, inner = (label_sets[m.group(1)], m.group(2)) if m else ([], ty)
    return {"Counter": "counter", "Gauge": "gauge", "Histogram": "histogram"}[inner], labels

for field, name in re.findall(r'(\w+): add\(\s*&mut r,\s*"(\w+)"', src):
    registered[f"{prefix}_{name}"] = kind_of(field_types[field])
locals_ = dict(re.findall(r"let (\w+) = (Family::<\w+, \w+>)::default\(\);", src))
for name, var in re.findall(r'r\.register\(\s*"(\w+)",[^;]*?,\s*(\w+),?\s*\);', src, re.S):
    registered[f"{prefix}_{name}"] = kind_of(locals_[var])
if len(registered) < 10:
    sys.exit(f"read only {len(registered)} metrics from {metrics_rs}: its layout changed, fix this script")

SUFFIXES = {"counter": ["_total"], "gauge": [""], "histogram": ["_bucket", "_sum", "_count"]}
TARGET_LABELS = {"job", "instance", "namespace", "pod", "service", "endpoint", "container"}
exposed = {}  # exposed series name -> base name
for base, (kind, _) in registered.items():
    for suffix in SUFFIXES[kind]:
        exposed[base + suffix] = base

used = set()

def check_expr(expr, where):
    """The leasehold_* names and label matchers of `expr` against the registry."""
    for name in sorted(set(re.findall(rf"\b{prefix}_[a-z0-9_]+\b", expr))):
        base = exposed.get(name)
        if base is None:
            close = [b for b in registered if name.startswith(b)]
            hint = f" ({close[0]} is a {registered[close[0]][0]}: {', '.join(close[0] + s for s in SUFFIXES[registered[close[0]][0]])})" if close else ""
            errors.append(f"{where}: {name} is not exposed by metrics.rs{hint}")
            continue
        used.add(base)
    for name, matchers in re.findall(rf"\b({prefix}_[a-z0-9_]+)\s*\{{([^}}]*)\}}", expr):
        base = exposed.get(name)
        if base is None:
            continue
        allowed = set(registered[base][1]) | TARGET_LABELS | ({"le"} if name.endswith("_bucket") else set())
        for label in re.findall(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)", matchers):
            if label not in allowed:
                errors.append(f"{where}: {name} has no label {label!r} (it has {sorted(allowed)})")

# Any leasehold_* name in the two files, comments and descriptions too, is one a sample
# carries (as the Rust test over them reads it: a histogram by _bucket/_sum/_count).
for path in (alerts_path, dashboard_path):
    for name in sorted(set(re.findall(rf"{prefix}_[a-z_]*", open(path, encoding="utf-8").read()))):
        if name not in exposed:
            errors.append(f"{path}: names {name}, which no sample carries")

# --- the alerts ----------------------------------------------------------------------
for group in yaml.safe_load(open(alerts_path, encoding="utf-8"))["groups"]:
    for rule in group["rules"]:
        check_expr(rule["expr"], f"{alerts_path}: {rule.get('alert') or rule.get('record')}")

# --- the dashboard -------------------------------------------------------------------
def grafana_to_promql(expr):
    """Grafana's variables as promtool can parse them."""
    for var, value in (("__rate_interval", "5m"), ("__interval", "1m"), ("__range", "1h")):
        expr = re.sub(rf"\$\{{{var}(?::[^}}]*)?\}}|\${var}\b|\[\[{var}\]\]", value, expr)
    return re.sub(r"\$\{[^}]+\}|\$[A-Za-z_]\w*|\[\[[^\]]+\]\]", ".*", expr)

dashboard = json.load(open(dashboard_path, encoding="utf-8"))
exprs = []

def panels(items):
    for p in items:
        yield p
        yield from panels(p.get("panels", []))

for p in panels(dashboard["panels"]):
    for t in p.get("targets", []):
        if "expr" in t:
            exprs.append((f"panel {p.get('id')} {p.get('title')!r} target {t.get('refId')}", t["expr"]))
for v in dashboard.get("templating", {}).get("list", []):
    if v.get("type") != "query":
        continue
    q = v.get("query")
    q = q.get("query", "") if isinstance(q, dict) else (q or "")
    m = re.fullmatch(r"\s*label_values\((.*),\s*([A-Za-z_]\w*)\)\s*", q, re.S)
    if m:
        exprs.append((f"variable {v['name']!r}", m.group(1)))
    elif q.strip():
        exprs.append((f"variable {v['name']!r}", q))
if len(exprs) < 10:
    errors.append(f"{dashboard_path}: only {len(exprs)} expressions found")

rules = []
for i, (where, expr) in enumerate(exprs):
    promql = grafana_to_promql(expr)
    if "$" in promql:
        errors.append(f"{dashboard_path}: {where}: a variable left in {promql!r}")
    check_expr(promql, f"{dashboard_path}: {where}")
    rules.append({"record": f"dashboard:expr_{i}", "expr": promql})
with open(f"{work}/dashboard-rules.yaml", "w", encoding="utf-8") as f:
    yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}, f, sort_keys=False)

if errors:
    sys.exit("\n".join(errors))
with open(f"{work}/metrics-used", "w", encoding="utf-8") as f:
    f.write(" ".join(sorted(used)) + "\n")
PY
check_rules "$work/dashboard-rules.yaml" "the dashboard's expressions (with Grafana's variables replaced)"

log "(e) helm lint --strict; helm template with metrics.prometheusRule and metrics.grafanaDashboard"
on=(--set metrics.prometheusRule.enabled=true --set metrics.grafanaDashboard.enabled=true)
"$HELM" lint --strict charts/leasehold >"$work/lint.log" 2>&1 || { cat "$work/lint.log" >&2; fail "helm lint failed"; }
"$HELM" lint --strict charts/leasehold "${on[@]}" >"$work/lint.log" 2>&1 || { cat "$work/lint.log" >&2; fail "helm lint failed (both features on)"; }
tpl() { local out=$1; shift; "$HELM" template leasehold charts/leasehold -n leasehold-system "$@" >"$work/$out"; }
tpl off.yaml
tpl on.yaml "${on[@]}"
tpl tuned.yaml "${on[@]}" --set metrics.prometheusRule.queueStuckMinutes=30 \
  --set metrics.prometheusRule.heldTooLongSeconds=7200 --set metrics.prometheusRule.reconcileErrorsPerMinute=30 \
  --set metrics.prometheusRule.runbookBaseUrl=https://git.example.com/leasehold/docs/operations.md \
  --set metrics.prometheusRule.labels.release=prometheus --set metrics.grafanaDashboard.namespace=monitoring \
  --set metrics.grafanaDashboard.labels.team=platform
python3 - "$work" "$ALERTS" "$DASHBOARD" <<'PY'
import json, sys
import yaml

work, alerts_path, dashboard_path = sys.argv[1:]
alerts = yaml.safe_load(open(alerts_path, encoding="utf-8"))
dashboard = json.load(open(dashboard_path, encoding="utf-8"))

def docs(name):
    return [d for d in yaml.safe_load_all(open(f"{work}/{name}", encoding="utf-8")) if d]

def one(ds, kind, what):
    found = [d for d in ds if d["kind"] == kind]
    if len(found) != 1:
        sys.exit(f"{what}: {len(found)} {kind}(s) rendered, not 1")
    return found[0]

def dashboards(ds):
    return [d for d in ds if d["kind"] == "ConfigMap" and "leasehold.json" in d.get("data", {})]

off = docs("off.yaml")
if any(d["kind"] == "PrometheusRule" for d in off) or dashboards(off):
    sys.exit("the default values render a PrometheusRule or the dashboard's ConfigMap: both are opt-in")

on = docs("on.yaml")
rule = one(on, "PrometheusRule", "both on")
if rule["apiVersion"] != "monitoring.coreos.com/v1" or rule["metadata"]["namespace"] != "leasehold-system":
    sys.exit(f"the PrometheusRule's apiVersion or namespace is wrong: {rule['apiVersion']}, {rule['metadata']}")
if rule["spec"] != {"groups": alerts["groups"]}:
    sys.exit("with the default tunables the PrometheusRule's spec is not alerts.yaml's groups (what promtool checked)")
cms = dashboards(on)
if len(cms) != 1:
    sys.exit(f"both on: {len(cms)} dashboard ConfigMaps rendered, not 1")
cm = cms[0]
if cm["metadata"]["labels"].get("grafana_dashboard") != "1" or cm["metadata"]["namespace"] != "leasehold-system":
    sys.exit(f"the dashboard's ConfigMap lacks the sidecar's label or is elsewhere: {cm['metadata']}")
if json.loads(cm["data"]["leasehold.json"]) != dashboard:
    sys.exit("the dashboard's ConfigMap does not hold dashboard.json")

tuned = docs("tuned.yaml")
rule = one(tuned, "PrometheusRule", "tuned")
if rule["metadata"]["labels"].get("release") != "prometheus":
    sys.exit("metrics.prometheusRule.labels are not on the PrometheusRule")
by_name = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
for alert, wanted in [
    ("LeaseholdQueueStuck", "[30m]"),
    ("LeaseholdLockHeldTooLong", "[7200s]"),
    ("LeaseholdReconcileErrors", "> 30"),
]:
    if wanted not in by_name[alert]["expr"]:
        sys.exit(f"{alert}: the tunable ({wanted}) is not in its expression: {by_name[alert]['expr']}")
for r in by_name.values():
    if not r["annotations"]["runbook_url"].startswith("https://git.example.com/leasehold/docs/operations.md#"):
        sys.exit(f"{r['alert']}: runbookBaseUrl is not used: {r['annotations']['runbook_url']}")
with open(f"{work}/tuned-rules.yaml", "w", encoding="utf-8") as f:
    yaml.safe_dump(rule["spec"], f, sort_keys=False)
cm = dashboards(tuned)[0]
if cm["metadata"]["namespace"] != "monitoring" or cm["metadata"]["labels"].get("team") != "platform":
    sys.exit(f"metrics.grafanaDashboard.namespace or labels are not used: {cm['metadata']}")
PY
check_rules "$work/tuned-rules.yaml" "the PrometheusRule rendered with tunables set"

log "ok"
echo "metrics used: $(cat "$work/metrics-used")"
