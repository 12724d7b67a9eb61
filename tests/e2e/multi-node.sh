#!/usr/bin/env bash
# The end-to-end scenario (tests/e2e/scenario.sh) and the multi-node faults
# (tests/e2e/faults.sh) on a 3-node cluster on this machine (tests/e2e/cluster.sh: a
# network namespace per node with its own containerd, kubelet and kube-proxy; real pod
# networking across nodes; pods reach the API server through the `kubernetes` Service,
# in-cluster config unchanged). The leasehold image is built from the Dockerfile by a
# real Docker engine and loaded into every node; everything is torn down on exit.
#
# usage (root): tests/e2e/multi-node.sh [STEP...]   steps: scenario fast-path upgrade
#               partition node-lost (default: all, in that order; node-lost last, as it
#               leaves a node dead)
#               LEASEHOLD_E2E_KEEP=1 keeps the cluster up when a step fails.
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/common.sh
. tests/e2e/scenario.sh
. tests/e2e/faults.sh
[ "$(id -u)" = 0 ] || { echo "multi-node.sh needs root (network namespaces, containerd, kubelet)" >&2; exit 2; }
started=$(date +%s)

export LEASEHOLD_CLUSTER_DIR=${LEASEHOLD_CLUSTER_DIR:-/tmp/leasehold-cluster}
W=$LEASEHOLD_CLUSTER_DIR
tools=$(scripts/chart-check.sh --tools-only 2>/dev/null)
HELM=$(sed -n 's/^LEASEHOLD_HELM=//p' <<<"$tools")
KUBECTL=$(sed -n 's/^LEASEHOLD_KUBECTL=//p' <<<"$tools")
LEASEHOLD=$CARGO_TARGET_DIR/debug/leasehold
cleanup() {
  local rc=$?
  set +e
  [ $rc = 0 ] || { for f in "$W"/node-*/kubelet.log "$W"/dev.log; do [ -f "$f" ] && { echo "--- tail $f"; tail -5 "$f"; }; done; } >&2
  if [ $rc != 0 ] && [ -n "${LEASEHOLD_E2E_KEEP:-}" ]; then
    echo "kept the cluster for a look (LEASEHOLD_E2E_KEEP): KUBECONFIG=$KUBECONFIG; tests/e2e/cluster.sh down ends it"
  else
    tests/e2e/cluster.sh down
  fi
  echo "multi-node e2e: $(( $(date +%s) - started ))s, exit $rc"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

apt_install python3-yaml # tests/e2e/example.py
step "a 3-node cluster: tests/e2e/cluster.sh up 3"
tests/e2e/cluster.sh up 3 > "/tmp/leasehold-cluster-up.out"
export KUBECONFIG; KUBECONFIG=$(sed -n 's/^KUBECONFIG=//p' /tmp/leasehold-cluster-up.out)
rm -f /tmp/leasehold-cluster-up.out
echo "cluster up after $(( $(date +%s) - started ))s"

step "the leasehold image (docker build), loaded into every node (kind load's way: an archive per node)"
tests/e2e/build-image.sh docker.io/library/leasehold:e2e "$W/leasehold.tar" "$W/plain.tar"
tests/e2e/cluster.sh load "$W/leasehold.tar" "$W/plain.tar"
rm -f "$W/leasehold.tar" "$W/plain.tar"

IMAGE=leasehold:e2e
NS=e2e
LOG_MODE=hostpath
HOST_LOG_DIR=$W/shared
POD_EXTRAS=""
ENV_EXTRAS=""
EXAMPLE_EXTRAS=()
HELM_EXTRA=(--take-ownership "${SPREAD_REPLICAS[@]}")
NODES=$(k get nodes -o jsonpath='{.items[*].metadata.name}')
node_index() { echo "${1##*-}"; }
node_partition() { tests/e2e/cluster.sh partition "$(node_index "$1")"; }
node_heal() { tests/e2e/cluster.sh heal "$(node_index "$1")"; }
node_kill() { tests/e2e/cluster.sh kill-node "$(node_index "$1")"; }
node_block_port() { tests/e2e/cluster.sh block "$(node_index "$1")" "$2" "$3"; }
node_unblock_port() { tests/e2e/cluster.sh unblock "$(node_index "$1")" "$2" "$3"; }
image_retag() { tests/e2e/cluster.sh tag "docker.io/library/$IMAGE" "docker.io/library/${IMAGE%:*}:$1"; }

install_chart
k get pods -n "$SYSNS" -o wide
run_steps "$@"
step "multi-node end-to-end passed"
