#!/usr/bin/env bash
# End-to-end on a kind cluster: build and load the image, then the shared scenario
# (tests/e2e/scenario.sh: helm install with 2 controller replicas, a contention Job of 6
# pods checked with `leasehold check-log`, a holder pod deleted mid-section, the leading
# controller killed); tear down. tests/e2e/real-node.sh runs the same scenario on a
# real kubelet on this machine.
#
# Needs docker, kind, kubectl, helm and cargo. NOT run on the CI machines of this
# project: they have no Docker engine (see README, "What runs where").
set -euo pipefail
cd "$(dirname "$0")/../.."

CLUSTER=${CLUSTER:-leasehold-e2e}
IMAGE=leasehold:e2e
NS=e2e
LOG_MODE=stdout
POD_EXTRAS=""
ENV_EXTRAS=""
HELM_EXTRA=()
for tool in docker kind kubectl helm cargo; do
  command -v "$tool" >/dev/null || { echo "kind.sh needs $tool on PATH" >&2; exit 2; }
done
KUBECTL=$(command -v kubectl)
HELM=$(command -v helm)
. tests/e2e/scenario.sh

step "building leasehold (for check-log) and the image"
cargo build --locked --quiet
LEASEHOLD=${CARGO_TARGET_DIR:-target}/debug/leasehold
docker build -f Dockerfile.build -t leasehold-build . && docker build -t "$IMAGE" .

step "creating kind cluster $CLUSTER"
kind create cluster --name "$CLUSTER" --wait 180s
trap 'kind delete cluster --name "$CLUSTER"' EXIT
kind load docker-image "$IMAGE" --name "$CLUSTER"

run_scenario
