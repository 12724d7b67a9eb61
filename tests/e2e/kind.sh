#!/usr/bin/env bash
# End-to-end on a kind cluster: build and load the image, helm install the chart (2
# controller replicas), run the contention Job (6 parallel pods, one lock) and verify
# mutual exclusion and strictly increasing tokens from their logs with
# `leasehold check-log` (the same checker the integration tests use); then delete a
# holder pod (the kubelet's SIGTERM reaches CMD, the next replica takes over) and the
# leading controller pod (the other replica takes over, nothing lost); tear down.
#
# Needs docker, kind, kubectl, helm and cargo. NOT run on the CI machines of this
# project: they have no Docker engine (see README, "What runs where").
set -euo pipefail
cd "$(dirname "$0")/../.."

CLUSTER=${CLUSTER:-leasehold-e2e}
IMAGE=leasehold:e2e
NS=e2e
for tool in docker kind kubectl helm cargo; do
  command -v "$tool" >/dev/null || { echo "kind.sh needs $tool on PATH" >&2; exit 2; }
done
step() { printf '\n==> %s\n' "$*"; }
fail() { echo "FAIL: $*" >&2; exit 1; }
# Wait up to $1 seconds for the command to succeed.
until_ok() { local t=$1; shift; for _ in $(seq "$t"); do "$@" >/dev/null 2>&1 && return 0; sleep 1; done; "$@"; }

step "building leasehold (for check-log) and the image"
cargo build --locked --quiet
LEASEHOLD=${CARGO_TARGET_DIR:-target}/debug/leasehold
docker build -t "$IMAGE" .

step "creating kind cluster $CLUSTER"
kind create cluster --name "$CLUSTER" --wait 180s
trap 'kind delete cluster --name "$CLUSTER"' EXIT
kind load docker-image "$IMAGE" --name "$CLUSTER"

step "helm install (2 replicas, leader election)"
kubectl create namespace "$NS"
helm install leasehold charts/leasehold -n leasehold-system --create-namespace \
  --set image.repository=leasehold --set image.tag=e2e --set image.pullPolicy=Never \
  --set "clientRbac.namespaces={$NS}" --wait --timeout 180s
with_image() { sed "s#image: leasehold:0.1.0#image: $IMAGE\n          imagePullPolicy: Never#" "$1"; }

step "contention Job: 6 pods, one lock"
with_image examples/contention-job.yaml | kubectl apply -n "$NS" -f -
kubectl wait -n "$NS" --for=condition=complete job/contention --timeout=300s
log=$(mktemp)
for pod in $(kubectl get pods -n "$NS" -l job-name=contention -o name); do
  kubectl logs -n "$NS" "$pod" | grep -E '^(start|end|term) ' >> "$log"
done
# Each line ends with the time in nanoseconds (kind's nodes share the host clock).
sort -n -k4,4 "$log" > "$log.lines"
"$LEASEHOLD" check-log "$log.lines" || fail "contention log: $(cat "$log")"
[ "$(grep -c '^start ' "$log.lines")" = 6 ] || fail "expected 6 sections"
kubectl get dlock -n "$NS" contention

step "deleting the holder pod of a singleton Deployment"
with_image examples/singleton-deployment.yaml | kubectl apply -n "$NS" -f -
kubectl rollout status -n "$NS" deployment/singleton-task --timeout=180s
holder() { kubectl get dlock -n "$NS" singleton-task -o jsonpath='{.status.holders[0].pod}'; }
token() { kubectl get dlock -n "$NS" singleton-task -o jsonpath='{.status.fencingToken}'; }
until_ok 60 test -n "$(holder)"
first=$(holder); t1=$(token)
kubectl delete pod -n "$NS" "$first" --wait=false
until_ok 60 bash -c "h=\$(kubectl get dlock -n $NS singleton-task -o jsonpath='{.status.holders[0].pod}'); [ -n \"\$h\" ] && [ \"\$h\" != $first ]"
[ "$(token)" -gt "$t1" ] || fail "token did not increase after the handoff"
kubectl logs -n "$NS" "$(holder)" | grep -q "leader with token" || fail "the new holder's CMD did not start"

step "killing the leading controller"
leader=$(kubectl get lease -n leasehold-system leasehold-controller -o jsonpath='{.spec.holderIdentity}')
[ -n "$leader" ] || fail "no controller leader"
kubectl delete pod -n leasehold-system "$leader" --wait=false
until_ok 90 bash -c "l=\$(kubectl get lease -n leasehold-system leasehold-controller -o jsonpath='{.spec.holderIdentity}'); [ -n \"\$l\" ] && [ \"\$l\" != $leader ]"
second=$(holder); t2=$(token)
kubectl delete pod -n "$NS" "$second" --wait=false
until_ok 90 bash -c "h=\$(kubectl get dlock -n $NS singleton-task -o jsonpath='{.status.holders[0].pod}'); [ -n \"\$h\" ] && [ \"\$h\" != $second ]"
[ "$(token)" -gt "$t2" ] || fail "no grant after the leader change"

step "kind e2e passed"
