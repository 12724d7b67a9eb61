#!/usr/bin/env bash
# The end-to-end scenario (tests/e2e/scenario.sh) on a real single-node cluster on this
# machine: `leasehold dev` (etcd, kube-apiserver, kube-controller-manager) plus
# containerd + runc, a kubelet and kube-scheduler, all on loopback. Pods really run,
# get SIGTERM and die. The leasehold image is built from the Dockerfile by a real Docker
# engine (tests/e2e/build-image.sh), the pause image written by hand; both are imported
# with ctr (no registry). Everything is torn down on exit: containers, mounts, dirs.
#
# Needs root and Debian's containerd, runc, containernetworking-plugins, busybox-static
# (installed if missing). Pods use hostNetwork and reach the API server on 127.0.0.1;
# the node's address is $NODE_IP on a veth of its own (a kubelet refuses a loopback
# node IP, and a pod without an IP is in no Service's endpoints: the API server calls
# the admission webhook there).
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/common.sh
. tests/e2e/scenario.sh
[ "$(id -u)" = 0 ] || { echo "real-node.sh needs root (containerd, kubelet)" >&2; exit 2; }
started=$(date +%s)

pkgs=(containerd runc containernetworking-plugins busybox-static iproute2 python3-yaml)
apt_install "${pkgs[@]}"
step "provisioning kubelet and kube-scheduler too"
BIN=$(scripts/provision-k8s.sh --node)
export LEASEHOLD_K8S_BIN=$BIN
tools=$(scripts/chart-check.sh 2>/dev/null)
HELM=$(sed -n 's/^LEASEHOLD_HELM=//p' <<<"$tools")
KUBECTL=$(sed -n 's/^LEASEHOLD_KUBECTL=//p' <<<"$tools")
step "building leasehold"
cargo build --locked --quiet --features cli --bin leasehold
LEASEHOLD=$CARGO_TARGET_DIR/debug/leasehold

W=$(mktemp -d /tmp/leasehold-node.XXXXXX)
SOCK=$W/containerd.sock
NODE=leasehold-node
NODE_IP=10.250.0.1
NODE_LINK=lh-node0
pids=()
cleanup() {
  local rc=$?
  set +e
  step "tearing down the node"
  if [ -n "${KUBECONFIG:-}" ]; then
    "$KUBECTL" delete namespace e2e leasehold-system --wait=false >/dev/null 2>&1
  fi
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  if [ -S "$SOCK" ]; then
    for t in $(ctr -a "$SOCK" -n k8s.io tasks ls -q 2>/dev/null); do ctr -a "$SOCK" -n k8s.io tasks kill -s SIGKILL "$t" >/dev/null 2>&1; done
    sleep 1
    for t in $(ctr -a "$SOCK" -n k8s.io tasks ls -q 2>/dev/null); do ctr -a "$SOCK" -n k8s.io tasks delete -f "$t" >/dev/null 2>&1; done
    for c in $(ctr -a "$SOCK" -n k8s.io containers ls -q 2>/dev/null); do ctr -a "$SOCK" -n k8s.io containers delete "$c" >/dev/null 2>&1; done
  fi
  [ -n "${CONTAINERD_PID:-}" ] && kill "$CONTAINERD_PID" 2>/dev/null
  pkill -f "containerd-shim.*$W" 2>/dev/null
  [ -n "${DEV_PID:-}" ] && kill "$DEV_PID" 2>/dev/null && wait "$DEV_PID" 2>/dev/null
  for p in "${pids[@]}" ${CONTAINERD_PID:-}; do wait "$p" 2>/dev/null; done
  grep -o " $W[^ ]*" /proc/mounts | sort -r | while read -r m; do umount -l "$m" 2>/dev/null; done
  rm -rf "$W"
  ip link del "$NODE_LINK" 2>/dev/null
  echo "real-node e2e: $(( $(date +%s) - started ))s, exit $rc"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

step "control plane (leasehold dev) with workload and node-lifecycle controllers"
"$LEASEHOLD" dev --die-with-parent \
  --kcm-controllers garbagecollector,namespace,serviceaccount-token,serviceaccount,root-ca-cert-publisher,deployment,replicaset,job,nodelifecycle,podgc,endpoint \
  > "$W/dev.out" 2> "$W/dev.err" &
DEV_PID=$!
( within 300 "leasehold dev did not start" grep -q '^KUBECONFIG=' "$W/dev.out" ) || { tail -20 "$W/dev.err"; exit 1; }
export KUBECONFIG; KUBECONFIG=$(sed -n 's/^KUBECONFIG=//p' "$W/dev.out")
API_PORT=$(sed -n 's#.*server: https://127.0.0.1:\([0-9]*\).*#\1#p' "$KUBECONFIG")

step "containerd (root, state and socket under $W)"
mkdir -p "$W/cni" "$W/shared" && chmod 0777 "$W/shared"
cat > "$W/cni/10-bridge.conflist" <<'JSON'
{"cniVersion": "0.4.0", "name": "leasehold-e2e", "plugins": [
  {"type": "bridge", "bridge": "lh-e2e0", "isGateway": false, "ipMasq": false,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.0.0/24"}]]}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
JSON
tests/e2e/containerd-config.sh "$W/containerd.toml" "$W/cni"
containerd --config "$W/containerd.toml" --root "$W/containerd/root" --state "$W/containerd/state" \
  --address "$SOCK" > "$W/containerd.log" 2>&1 &
CONTAINERD_PID=$!
( within 30 "containerd did not start" ctr -a "$SOCK" version >/dev/null ) || { tail "$W/containerd.log"; exit 1; }

step "images: pause (an OCI tarball written by hand) and leasehold:e2e (docker build)"
rootfs() { # rootfs DIR: busybox with its applets
  mkdir -p "$1/bin" "$1/tmp" "$1/usr/local/bin" && chmod 1777 "$1/tmp"
  cp /bin/busybox "$1/bin/busybox"
  for a in sh sleep date echo cat; do ln -sf busybox "$1/bin/$a"; done
}
rootfs "$W/img/pause"
tests/e2e/oci-image.py docker.io/library/pause:local "$W/img/pause" "$W/pause.tar" -- /bin/sh -c "trap 'exit 0' TERM; while true; do sleep 1; done"
# The leasehold image from the Dockerfile, with a real Docker engine (the release recipe
# on this tree's static build; see the script).
tests/e2e/build-image.sh docker.io/library/leasehold:e2e "$W/leasehold.tar" "$W/plain.tar" "$W/python.tar"
for t in pause leasehold plain python; do ctr -a "$SOCK" -n k8s.io images import "$W/$t.tar" >/dev/null; done
rm -rf "$W/img" "$W"/*.tar

step "kubelet (node address $NODE_IP) and kube-scheduler"
ip link del "$NODE_LINK" 2>/dev/null || true
ip link add "$NODE_LINK" type veth peer name "${NODE_LINK}p"
ip addr add "$NODE_IP/32" dev "$NODE_LINK"
ip link set "$NODE_LINK" up && ip link set "${NODE_LINK}p" up
"$BIN/kubelet" --kubeconfig "$KUBECONFIG" --container-runtime=remote --container-runtime-endpoint="unix://$SOCK" \
  --cgroup-driver=cgroupfs --fail-swap-on=false --cgroups-per-qos=false --enforce-node-allocatable="" \
  --eviction-hard="" --image-gc-high-threshold=100 --image-gc-low-threshold=99 \
  --pod-infra-container-image=docker.io/library/pause:local --root-dir "$W/kubelet" --cert-dir "$W/kubelet/pki" \
  --hostname-override "$NODE" --node-ip "$NODE_IP" --address "$NODE_IP" --read-only-port 0 --healthz-port 0 \
  --anonymous-auth=false --authorization-mode=AlwaysAllow > "$W/kubelet.log" 2>&1 &
pids+=($!)
"$BIN/kube-scheduler" --kubeconfig "$KUBECONFIG" --leader-elect=false --port 0 --secure-port 0 > "$W/scheduler.log" 2>&1 &
pids+=($!)
( within 120 "node $NODE not Ready" is True k get node "$NODE" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' ) \
  || { tail -20 "$W/kubelet.log"; exit 1; }
"$KUBECTL" taint nodes "$NODE" node.kubernetes.io/not-ready- >/dev/null 2>&1 || true
echo "node $NODE Ready after $(( $(date +%s) - started ))s"

IMAGE=leasehold:e2e
PY_IMAGE=leasehold-python:e2e
NS=e2e
LOG_MODE=hostpath
HOST_LOG_DIR=$W/shared
POD_EXTRAS="      hostNetwork: true
      dnsPolicy: ClusterFirstWithHostNet"
ENV_EXTRAS="            - { name: KUBERNETES_SERVICE_HOST, value: \"127.0.0.1\" }
            - { name: KUBERNETES_SERVICE_PORT, value: \"$API_PORT\" }"
EXAMPLE_EXTRAS=(--host-network "127.0.0.1:$API_PORT")
LOG_FORMAT_JSON=1
HELM_EXTRA=(--take-ownership --set hostNetwork=true --set probes.enabled=false --set logFormat=json
  --set "extraEnv[0].name=KUBERNETES_SERVICE_HOST" --set-string "extraEnv[0].value=127.0.0.1"
  --set "extraEnv[1].name=KUBERNETES_SERVICE_PORT" --set-string "extraEnv[1].value=$API_PORT")
run_scenario
