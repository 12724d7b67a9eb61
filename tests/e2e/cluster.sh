#!/usr/bin/env bash
# A multi-node Kubernetes cluster on this machine, built as kind builds one, with a
# network namespace for each node instead of a container (this sandbox cannot run the
# privileged containers kind's nodes are):
#
#   host    `leasehold dev` (etcd, kube-apiserver on the cluster bridge's address,
#           kube-controller-manager giving each node a podCIDR) and kube-scheduler; the
#           bridge lh-br0 (10.77.0.1/24) the nodes hang on, like kind's docker network
#   node i  network namespace lh-node-i, eth0 10.77.0.(10+i) on the bridge, with its own
#           containerd, kubelet and kube-proxy (entered with `nsenter --net`: they share
#           the host's kernel and mounts, as kind's node containers do, but for the
#           node's own /var/log/pods and /var/log/containers). Pods get an IP
#           from the node's podCIDR (bridge + host-local CNI); each node routes the
#           other nodes' podCIDRs to them (what kindnet does) and masquerades what
#           leaves the cluster; the `kubernetes` Service is reached through kube-proxy.
#
# usage (root):
#   tests/e2e/cluster.sh up [NODES]     start NODES nodes (default 3); prints KUBECONFIG=...
#   tests/e2e/cluster.sh load TAR...    import image archives into every node (kind load)
#   tests/e2e/cluster.sh tag SRC DST    tag image SRC as DST on every node
#   tests/e2e/cluster.sh partition N    cut node N off the API server and the other nodes
#                                       (iptables DROP inside it; its pods keep running)
#   tests/e2e/cluster.sh heal N         undo that
#   tests/e2e/cluster.sh block N IP PORT    drop TCP to IP:PORT arriving at node N from
#                                       outside it (unblock N IP PORT undoes it)
#   tests/e2e/cluster.sh kill-node N    kill node N's kubelet, kube-proxy, containerd and
#                                       every container at once (the node is lost)
#   tests/e2e/cluster.sh down           stop and remove everything `up` made
# State lives in $LEASEHOLD_CLUSTER_DIR (default /tmp/leasehold-cluster).
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/common.sh

W=${LEASEHOLD_CLUSTER_DIR:-/tmp/leasehold-cluster}
BRIDGE=lh-br0
HOST_IP=10.77.0.1
CLUSTER_CIDR=10.244.0.0/16
MARK="leasehold-cluster"
node_name() { echo "lh-node-$1"; }
node_ip() { echo "10.77.0.$((10 + $1))"; }
in_node() { local n=$1; shift; nsenter --net="/var/run/netns/$(node_name "$n")" "$@"; }
die() { echo "cluster: $*" >&2; exit 1; }
# Run the command until it succeeds, once a second, for at most $1 seconds.
until_ok() { local t=$1; shift; for _ in $(seq "$t"); do "$@" >/dev/null 2>&1 && return 0; sleep 1; done; "$@"; }
# Start a long-running process detached from this script, its output to $1.log; note its pid.
detach() { local log=$1; shift; setsid "$@" > "$log.log" 2>&1 < /dev/null & echo "$!" >> "$W/pids"; }

nodes() { cat "$W/nodes"; }
kubectl_() { "$(cat "$W/kubectl")" --kubeconfig "$W/kubeconfig" "$@"; }

up() {
  local count=${1:-3} started; started=$(date +%s)
  [ "$(id -u)" = 0 ] || die "up needs root (network namespaces, containerd, kubelet)"
  [ ! -e "$W" ] || die "$W exists: a cluster is up (tests/e2e/cluster.sh down first)"
  apt_install containerd runc containernetworking-plugins busybox-static conntrack iptables iproute2 util-linux
  step "provisioning kubelet, kube-scheduler and kube-proxy"
  BIN=$(scripts/provision-k8s.sh --node)
  export LEASEHOLD_K8S_BIN=$BIN
  local tools; tools=$(scripts/chart-check.sh --tools-only 2>/dev/null)
  step "building leasehold"
  cargo build --locked --quiet --features cli --bin leasehold
  mkdir -p "$W/shared" && chmod 0777 "$W/shared"
  : > "$W/pids"
  seq "$count" > "$W/nodes"
  sed -n 's/^LEASEHOLD_KUBECTL=//p' <<<"$tools" > "$W/kubectl"
  ls /var/run/netns 2>/dev/null > "$W/netns.before" || : > "$W/netns.before"
  ls /var/log/pods 2>/dev/null > "$W/podlogs.before" || : > "$W/podlogs.before"

  step "the cluster network: bridge $BRIDGE ($HOST_IP/24)"
  # A fixed MAC: a bridge takes its lowest port's otherwise, which changes as nodes join
  # and leaves the first node's ARP entry for the host stale (30 s of timeouts).
  ip link add "$BRIDGE" address 02:4c:48:00:00:01 type bridge
  ip addr add "$HOST_IP/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  # Frames bridged between nodes pass the host's FORWARD chain (br_netfilter), whose
  # policy Docker sets to DROP.
  iptables -I FORWARD -i "$BRIDGE" -o "$BRIDGE" -m comment --comment "$MARK" -j ACCEPT

  step "control plane on $HOST_IP: leasehold dev (nodeipam allocates podCIDRs from $CLUSTER_CIDR), kube-scheduler"
  detach "$W/dev" "$CARGO_TARGET_DIR/debug/leasehold" dev --address "$HOST_IP" --cluster-cidr "$CLUSTER_CIDR" \
    --kcm-controllers garbagecollector,namespace,serviceaccount-token,serviceaccount,root-ca-cert-publisher,deployment,replicaset,job,nodelifecycle,podgc,nodeipam,endpoint
  until_ok 300 grep -q '^KUBECONFIG=' "$W/dev.log" || die "leasehold dev did not start: $(tail "$W/dev.log")"
  cp "$(sed -n 's/^KUBECONFIG=//p' "$W/dev.log")" "$W/kubeconfig"
  detach "$W/scheduler" "$BIN/kube-scheduler" --kubeconfig "$W/kubeconfig" --leader-elect=false --port 0 --secure-port 0

  step "the pause image (busybox, an OCI archive written by hand)"
  mkdir -p "$W/img/bin" "$W/img/tmp" && chmod 1777 "$W/img/tmp"
  cp /bin/busybox "$W/img/bin/busybox"
  for a in sh sleep date echo cat; do ln -sf busybox "$W/img/bin/$a"; done
  tests/e2e/oci-image.py docker.io/library/pause:local "$W/img" "$W/pause.tar" -- /bin/sh -c "trap 'exit 0' TERM; while true; do sleep 1; done"
  rm -rf "$W/img"

  local n
  for n in $(nodes); do start_node "$n"; done
  step "podCIDRs, routes between the nodes, CNI"
  for n in $(nodes); do
    until_ok 60 has_pod_cidr "$n" || die "$(node_name "$n") got no podCIDR"
  done
  for n in $(nodes); do wire_node "$n"; done
  for n in $(nodes); do
    until_ok 120 node_ready "$n" || die "$(node_name "$n") not Ready: $(tail -20 "$W/node-$n/kubelet.log")"
  done
  kubectl_ get nodes -o wide >&2
  echo "cluster: $count nodes Ready in $(( $(date +%s) - started ))s" >&2
  echo "KUBECONFIG=$W/kubeconfig"
}

pod_cidr() { kubectl_ get node "$(node_name "$1")" -o jsonpath='{.spec.podCIDR}' 2>/dev/null; }
has_pod_cidr() { [ -n "$(pod_cidr "$1")" ]; }
node_ready() { [ "$(kubectl_ get node "$(node_name "$1")" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" = True ]; }

# start_node N: the node's namespace and link, containerd (with the pause image),
# kubelet and kube-proxy.
start_node() {
  local n=$1 name ip d; name=$(node_name "$1"); ip=$(node_ip "$1"); d=$W/node-$1
  step "node $name ($ip): network namespace, containerd, kubelet, kube-proxy"
  mkdir -p "$d/cni"
  ip netns add "$name"
  ip link add "lh-v$n" type veth peer name eth0 netns "$name"
  ip link set "lh-v$n" master "$BRIDGE" up
  in_node "$n" ip link set lo up
  in_node "$n" ip addr add "$ip/24" dev eth0
  in_node "$n" ip link set eth0 up
  in_node "$n" ip route add default via "$HOST_IP"
  in_node "$n" sysctl -qw net.ipv4.ip_forward=1
  in_node "$n" sysctl -qw net.bridge.bridge-nf-call-iptables=1 2>/dev/null || true
  tests/e2e/containerd-config.sh "$d/containerd.toml" "$d/cni"
  # The node's own /var/log/pods and /var/log/containers, in a mount namespace its
  # containerd and kubelet share: a kubelet deletes the log directories of the pods it
  # does not run, so on one shared /var/log/pods each node's kubelet deleted the other
  # nodes' pod logs within a minute (`kubectl logs`: no such file).
  mkdir -p "$d/log/pods" "$d/log/containers" /var/log/pods /var/log/containers
  : > "$d/mntns"
  unshare --mount="$d/mntns" --propagation private \
    sh -c "mount --bind '$d/log/pods' /var/log/pods && mount --bind '$d/log/containers' /var/log/containers"
  local enter=(nsenter --mount="$d/mntns" --net="/var/run/netns/$name")
  local sock=$d/containerd.sock
  detach "$d/containerd" "${enter[@]}" containerd --config "$d/containerd.toml" \
    --root "$d/containerd/root" --state "$d/containerd/state" --address "$sock"
  until_ok 30 ctr -a "$sock" version || die "containerd of $name did not start: $(tail "$d/containerd.log")"
  ctr -a "$sock" -n k8s.io images import "$W/pause.tar" >/dev/null
  # Anonymous requests allowed: the API server has no kubelet client certificate here
  # (logs, exec). Anything on the cluster's networks (host, nodes, pods) may use the
  # kubelet API: a test cluster, never a place to test what a pod may do.
  detach "$d/kubelet" "${enter[@]}" "$BIN/kubelet" --kubeconfig "$W/kubeconfig" \
    --container-runtime=remote --container-runtime-endpoint="unix://$sock" \
    --cgroup-driver=cgroupfs --fail-swap-on=false --cgroups-per-qos=false --enforce-node-allocatable="" \
    --eviction-hard="" --image-gc-high-threshold=100 --image-gc-low-threshold=99 \
    --pod-infra-container-image=docker.io/library/pause:local --root-dir "$d/kubelet" --cert-dir "$d/kubelet/pki" \
    --hostname-override "$name" --node-ip "$ip" --address "$ip" --read-only-port 0 \
    --anonymous-auth=true --authorization-mode=AlwaysAllow
  detach "$d/kube-proxy" nsenter --net="/var/run/netns/$name" "$BIN/kube-proxy" --kubeconfig "$W/kubeconfig" \
    --hostname-override "$name" --cluster-cidr "$CLUSTER_CIDR" --proxy-mode iptables \
    --conntrack-max-per-core 0 --conntrack-tcp-timeout-established 0 --conntrack-tcp-timeout-close-wait 0
}

# wire_node N: once every node has its podCIDR: the CNI config for N's, routes to the
# others' (kindnet's job), masquerading what leaves the cluster.
wire_node() {
  local n=$1 m cidr d=$W/node-$1; cidr=$(pod_cidr "$n")
  cat > "$d/cni/10-bridge.conflist" <<JSON
{"cniVersion": "0.4.0", "name": "lh-node-$n", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "dataDir": "$d/ipam", "ranges": [[{"subnet": "$cidr"}]],
            "routes": [{"dst": "0.0.0.0/0"}]}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
JSON
  for m in $(nodes); do
    [ "$m" = "$n" ] || in_node "$n" ip route replace "$(pod_cidr "$m")" via "$(node_ip "$m")"
  done
  # The host (the control plane) reaches pods too, as kind's control-plane node does
  # (kubectl proxy to a pod, the API server's webhook calls).
  ip route replace "$cidr" via "$(node_ip "$n")"
  in_node "$n" iptables -t nat -A POSTROUTING -s "$CLUSTER_CIDR" ! -d "$CLUSTER_CIDR" -o eth0 \
    -m comment --comment "$MARK" -j MASQUERADE
  echo "  $(node_name "$n"): podCIDR $cidr" >&2
}

# partition N / heal N: every packet in or out of node N's eth0 dropped (raw and mangle
# tables: kube-proxy and the kubelet keep the filter and nat tables).
partition() {
  in_node "$1" iptables -t raw -I PREROUTING -i eth0 -m comment --comment "$MARK" -j DROP
  in_node "$1" iptables -t mangle -I POSTROUTING -o eth0 -m comment --comment "$MARK" -j DROP
}
heal() {
  in_node "$1" iptables -t raw -D PREROUTING -i eth0 -m comment --comment "$MARK" -j DROP
  in_node "$1" iptables -t mangle -D POSTROUTING -o eth0 -m comment --comment "$MARK" -j DROP
}

# The pids of node N's containers (their init processes), kubelet, kube-proxy,
# containerd and shims.
node_pids() {
  local n=$1 d=$W/node-$1
  ctr -a "$d/containerd.sock" -n k8s.io tasks ls 2>/dev/null | awk 'NR > 1 && $2 > 0 { print $2 }'
  pgrep -f -- "--root-dir $d/kubelet" || true
  pgrep -f -- "kube-proxy .*--hostname-override $(node_name "$n")( |$)" || true
  pgrep -f -- "--root $d/containerd/root" || true
  pgrep -f -- "containerd-shim.*-address $d/containerd.sock" || true
}
kill_node() {
  local pids; pids=$(node_pids "$1" | sort -u | tr '\n' ' ')
  [ -n "$pids" ] || die "node $1 runs nothing"
  # shellcheck disable=SC2086
  kill -9 $pids
}

down() {
  [ -d "$W" ] || { echo "cluster: nothing to take down ($W does not exist)" >&2; return 0; }
  set +e
  local n d
  for n in $(nodes 2>/dev/null); do
    d=$W/node-$n
    if [ -S "$d/containerd.sock" ]; then
      for t in $(ctr -a "$d/containerd.sock" -n k8s.io tasks ls -q 2>/dev/null); do
        ctr -a "$d/containerd.sock" -n k8s.io tasks kill -s SIGKILL "$t" >/dev/null 2>&1
      done
    fi
  done
  # leasehold dev stops its own children on SIGTERM; everything else is killed.
  local pid pids; pids=$(cat "$W/pids" 2>/dev/null)
  for pid in $pids; do kill "$pid" 2>/dev/null; done
  for n in $(nodes 2>/dev/null); do kill -9 $(node_pids "$n") 2>/dev/null; done
  for _ in $(seq 30); do
    local alive=""
    for pid in $pids; do [ -e "/proc/$pid" ] && [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ] && alive=1; done
    [ -z "$alive" ] && break
    sleep 1
  done
  for pid in $pids; do kill -9 "$pid" 2>/dev/null; done
  grep -o " $W[^ ]*" /proc/mounts | sort -r | while read -r m; do umount -l "$m" 2>/dev/null; done
  # A link goes with its namespace only once the kernel frees it (asynchronously):
  # delete each node's pair now, so that an `up` right after finds its names free.
  for n in $(nodes 2>/dev/null); do ip link delete "lh-v$n" 2>/dev/null; done
  for ns in $(ls /var/run/netns 2>/dev/null); do
    grep -qx "$ns" "$W/netns.before" 2>/dev/null || ip netns delete "$ns" 2>/dev/null
  done
  for p in $(ls /var/log/pods 2>/dev/null); do
    grep -qx "$p" "$W/podlogs.before" 2>/dev/null || rm -rf "/var/log/pods/$p"
  done
  find /var/log/containers -xtype l -delete 2>/dev/null
  ip link delete "$BRIDGE" 2>/dev/null
  while iptables -D FORWARD -i "$BRIDGE" -o "$BRIDGE" -m comment --comment "$MARK" -j ACCEPT 2>/dev/null; do :; done
  rm -rf "$W"
  set -e
  echo "cluster: down" >&2
}

cmd=${1:-}; shift || true
case "$cmd" in
  up) up "$@" ;;
  down) down ;;
  load)
    for n in $(nodes); do
      for t in "$@"; do ctr -a "$W/node-$n/containerd.sock" -n k8s.io images import "$t" >/dev/null; done
    done ;;
  tag)
    for n in $(nodes); do ctr -a "$W/node-$n/containerd.sock" -n k8s.io images tag --force "$1" "$2" >/dev/null; done ;;
  partition) partition "$1" ;;
  heal) heal "$1" ;;
  block) in_node "$1" iptables -t raw -I PREROUTING -i eth0 -d "$2" -p tcp --dport "$3" -m comment --comment "$MARK" -j DROP ;;
  unblock) in_node "$1" iptables -t raw -D PREROUTING -i eth0 -d "$2" -p tcp --dport "$3" -m comment --comment "$MARK" -j DROP ;;
  kill-node) kill_node "$1" ;;
  *) sed -n '2,/^set -euo/p' "$0" | sed '$d' >&2; exit 2 ;;
esac
