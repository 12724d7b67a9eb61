#!/usr/bin/env bash
# End-to-end on a kind cluster of one control-plane node and three workers: build and
# load the image, then the shared scenario (tests/e2e/scenario.sh: helm install with 2
# controller replicas, a contention Job of 6 pods checked with `leasehold check-log`, a
# holder pod deleted mid-section, the leading controller killed) and the multi-node
# faults (tests/e2e/faults.sh: notices and direct grants across nodes, a rolling
# upgrade, a partitioned holder's node, a lost node); tear down.
# tests/e2e/multi-node.sh runs the same steps on this machine's network-namespace
# cluster, tests/e2e/real-node.sh the scenario on a single real node.
#
# The fault steps act on the node containers from the host, as root does on kind's
# privileged nodes: `docker exec NODE iptables ...` (partition, a black-holed port) and
# `docker kill NODE` (a lost node); the scenario alone needs none of that.
#
# usage: tests/e2e/kind.sh [STEP...]   (steps as in multi-node.sh; default: all)
# Needs docker, kind, kubectl, helm and cargo. NOT run on this project's CI machines:
# they have no kind node image (see README, "What runs where").
set -euo pipefail
cd "$(dirname "$0")/../.."

CLUSTER=${CLUSTER:-leasehold-e2e}
IMAGE=leasehold:e2e
NS=e2e
LOG_MODE=hostpath
HOST_LOG_DIR=$(mktemp -d /tmp/leasehold-kind.XXXXXX)
chmod 0777 "$HOST_LOG_DIR"
POD_EXTRAS=""
ENV_EXTRAS=""
for tool in docker kind kubectl helm cargo; do
  command -v "$tool" >/dev/null || { echo "kind.sh needs $tool on PATH" >&2; exit 2; }
done
KUBECTL=$(command -v kubectl)
HELM=$(command -v helm)
. tests/e2e/scenario.sh
. tests/e2e/faults.sh
HELM_EXTRA=("${SPREAD_REPLICAS[@]}")

step "building leasehold (for check-log) and the image"
cargo build --locked --quiet --features cli
LEASEHOLD=${CARGO_TARGET_DIR:-target}/debug/leasehold
docker build -f Dockerfile.build -t leasehold-build . && docker build -t "$IMAGE" .

step "creating kind cluster $CLUSTER (a control plane and 3 workers sharing $HOST_LOG_DIR)"
worker="- role: worker
  extraMounts: [{ hostPath: $HOST_LOG_DIR, containerPath: $HOST_LOG_DIR }]"
printf 'kind: Cluster\napiVersion: kind.x-k8s.io/v1alpha4\nnodes:\n- role: control-plane\n%s\n%s\n%s\n' "$worker" "$worker" "$worker" \
  | kind create cluster --name "$CLUSTER" --wait 180s --config -
trap 'kind delete cluster --name "$CLUSTER"; rm -rf "$HOST_LOG_DIR"' EXIT
kind load docker-image "$IMAGE" --name "$CLUSTER"

NODES=$(k get nodes -l '!node-role.kubernetes.io/control-plane' -o jsonpath='{.items[*].metadata.name}')
node_partition() {
  docker exec "$1" iptables -t raw -I PREROUTING -i eth0 -j DROP
  docker exec "$1" iptables -t mangle -I POSTROUTING -o eth0 -j DROP
}
node_heal() {
  docker exec "$1" iptables -t raw -D PREROUTING -i eth0 -j DROP
  docker exec "$1" iptables -t mangle -D POSTROUTING -o eth0 -j DROP
}
node_kill() { docker kill "$1" >/dev/null; }
node_block_port() { docker exec "$1" iptables -t raw -I PREROUTING -i eth0 -d "$2" -p tcp --dport "$3" -j DROP; }
node_unblock_port() { docker exec "$1" iptables -t raw -D PREROUTING -i eth0 -d "$2" -p tcp --dport "$3" -j DROP; }
image_retag() { docker tag "$IMAGE" "${IMAGE%:*}:$1"; kind load docker-image "${IMAGE%:*}:$1" --name "$CLUSTER"; }

install_chart
run_steps "$@"
step "kind end-to-end passed"
