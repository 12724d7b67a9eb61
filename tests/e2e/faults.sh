# The faults only a multi-node cluster has, shared by the cluster providers
# (tests/e2e/multi-node.sh, tests/e2e/kind.sh); sourced after tests/e2e/scenario.sh,
# whose settings and helpers it uses (LOG_MODE must be hostpath: every CMD appends
# `start|end|term <token> <pod> <ns-time>` to one file all nodes share, one kernel and
# one clock, and check-log judges each lock's overlap from its pods' lines: lock_lines).
#
# The provider also sets NODES (the worker node names, 3 or more), installs the chart
# with its replicas on different nodes whatever the rollout (SPREAD_REPLICAS: the
# chart's default anti-affinity is only preferred, and a rolling upgrade may then put
# both replicas on one node, which a lost node would take down together), and defines
#   node_partition NODE   drop every packet in and out of NODE (its pods keep running)
#   node_heal NODE        undo node_partition
#   node_kill NODE        kill NODE's kubelet, kube-proxy, containerd and containers at once
#   image_retag TAG       make $IMAGE's image available on every node as ${IMAGE%:*}:TAG
#   node_block_port NODE IP PORT / node_unblock_port NODE IP PORT
#                         drop / stop dropping TCP to IP:PORT arriving at NODE from the others
# (on kind these are `docker exec NODE iptables ...`, `docker kill NODE` and
# `docker tag` + `kind load docker-image`: see tests/e2e/kind.sh).

now_ns() { date +%s%N; }
# An empty shared log every pod's user may append to.
reset_log() { : > "$HOST_LOG_DIR/log"; chmod 0666 "$HOST_LOG_DIR/log"; }
# starts LOCK: how many sections of LOCK's pods began.
starts() { lock_lines "$1" | grep -c '^start '; }
ms_since() { echo $(( ($2 - $1) / 1000000 )); }
node_of() { k get pod -n "$1" "$2" -o jsonpath='{.spec.nodeName}'; }
holder_of() { k get dlock -n "$NS" "$1" -o jsonpath='{.status.holders[0].pod}'; }
token_of() { k get dlock -n "$NS" "$1" -o jsonpath='{.status.holders[0].fencingToken}'; }
other_started() { [ -n "$(other_start "$1")" ] || { echo "only $1 in the log: $(tail -5 "$HOST_LOG_DIR/log")"; return 1; }; }
# ready NODE: the node's Ready condition.
ready() { k get node "$1" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}'; }
# exit_code POD: the exit code of POD's (terminated) container.
exit_code() { k get pod -n "$NS" "$1" -o jsonpath='{.status.containerStatuses[0].state.terminated.exitCode}'; }
queued() { k get dlock -n "$NS" "$1" -o jsonpath='{.status.queue[*].pod}'; }
# lock_lines LOCK: the shared log's lines of LOCK's pods (each fault names its pods
# LOCK-...), by time. Other locks' pods write to the same file: the scenario's singleton
# Deployment runs on through the faults, and a partition or a lost node moves its lock
# too (a `term` of a section opened before reset_log, then a `start`).
lock_lines() { awk -v p="$1-" '$1 ~ /^(start|end|term)$/ && index($3, p) == 1' "$HOST_LOG_DIR/log" | sort -n -k4,4; }
# other_start POD: the first start of another pod of POD's lock (POD is LOCK-x).
other_start() { lock_lines "${1%-*}" | awk -v p="$1" '$1 == "start" && $3 != p { print $4; exit }'; }
# The worker nodes but $1.
others() { local n; for n in $NODES; do [ "$n" = "$1" ] || echo "$n"; done; }

# lock NAME LEASE: a DistributedLock.
lock() {
  printf 'apiVersion: leasehold.dev/v1alpha1\nkind: DistributedLock\nmetadata: { name: %s }\nspec: { leaseDurationSeconds: %s }\n' "$1" "$2" \
    | k apply -n "$NS" -f - >/dev/null
}

# pinned_pod NAME NODE LOCK SCRIPT [COMMAND]: a pod on NODE running `leasehold run
# --lock LOCK` with SCRIPT as CMD (or COMMAND with SCRIPT, as pod_spec says), never
# restarted (its exit status is kept).
pinned_pod() {
  local name=$1 node=$2 lock=$3 script=$4 command=${5:-}
  { printf 'apiVersion: v1\nkind: Pod\nmetadata: { name: %s, labels: { app: %s } }\n' "$name" "$lock"
    POD_EXTRAS="      nodeName: $node${POD_EXTRAS:+
$POD_EXTRAS}" pod_spec Never "$lock" "$script" ${command:+"$command"} | sed 's/^    //'; } | k apply -n "$NS" -f - >/dev/null
}

# A CMD that holds until stopped: `start`, then `term` when SIGTERM comes.
HOLD_SCRIPT="trap ''$(line term); exit 0'' TERM; $(line start); while true; do sleep 1; done"

# check_log NAME LOCK: judge LOCK's lines of the shared log (open sections allowed:
# holders still running).
check_log() {
  lock_lines "$2" > "$HOST_LOG_DIR/$1.sorted"
  "$LEASEHOLD" check-log --allow-open "$HOST_LOG_DIR/$1.sorted" | cut -c1-160 || fail "$1: the log shows an overlap:
$(cat "$HOST_LOG_DIR/$1.sorted")"
}

# clean_lock LOCK: its pods gone (their last lines written), then the lock and the log.
clean_lock() {
  k delete pod -n "$NS" -l "app=$1" --timeout=90s >/dev/null 2>&1 || true
  k delete dlock -n "$NS" "$1" --wait=false >/dev/null 2>&1 || true
  reset_log
}

# timeline T0_NS LOCK POD: what the leading controller logged about LOCK and what POD
# logged, after T0 (printed when a step took longer than its bound).
timeline() {
  local since; since=$(( ($(now_ns) - $1) / 1000000000 + 5 ))s
  echo "--- t0 = $(date -u -d "@$(( $1 / 1000000000 )).$(printf '%09d' $(( $1 % 1000000000 )))" +%H:%M:%S.%3N)"
  echo "--- the leader's log about $2"
  k logs -n "$SYSNS" "$(leader)" --since="$since" 2>&1 | grep -F "$2" | tail -40
  echo "--- $3's log"
  k logs -n "$NS" "$3" --since="$since" 2>&1 | tail -20
}

# The holder's node (not the leading controller's) is cut off from the API server and
# the other nodes, its pod still running: its CMD stops by its deadline, the next holder
# (on another node) starts only after that, within the lease, the expiry grace and a
# few seconds; healed, the old `leasehold run` reports the loss (exit 76) and never
# runs CMD again. (A node that also runs the leader: see fault_node_lost.)
fault_partition() {
  step "fault: the holder's node is partitioned (its pod runs on)"
  reset_log
  local lease=10 h=part-a hn next t0 t_term t_next
  set -- $(others "$(node_of "$SYSNS" "$(leader)")")
  hn=$1 next=$2
  lock part "$lease"
  pinned_pod part-a "$hn" part "$HOLD_SCRIPT"
  within 120 "part-a does not hold lock part" is part-a holder_of part
  within 60 "the holder's CMD never started" has_started "$h"
  pinned_pod part-b "$next" part "$HOLD_SCRIPT"
  within 60 "part-b is not queued" has part-b queued part
  t0=$(now_ns)
  node_partition "$hn"
  echo "  partitioned $hn, holding $h (token $(token_of part))"
  ( within 120 "the lock did not move on from the partitioned $h" other_started "$h" ) || { node_heal "$hn"; exit 1; }
  t_next=$(other_start "$h")
  t_term=$(awk -v p="$h" '$1 == "term" && $3 == p { print $4; exit }' "$HOST_LOG_DIR/log")
  [ -n "$t_term" ] || { node_heal "$hn"; fail "the partitioned holder's CMD never stopped; the log has: $(cat "$HOST_LOG_DIR/log")"; }
  local bound=$(( (lease + 2 + 5) * 1000 )) # lease + EXPIRY_GRACE + a few seconds
  echo "  partition -> old CMD stopped: $(ms_since "$t0" "$t_term") ms; -> next CMD started: $(ms_since "$t0" "$t_next") ms (bound $bound ms)"
  [ "$t_term" -lt "$t_next" ] || fail "the next holder started before the partitioned one stopped; the log has: $(cat "$HOST_LOG_DIR/log")"
  [ "$(ms_since "$t0" "$t_next")" -le "$bound" ] || { timeline "$t0" part part-b; fail "the lock took longer than $bound ms to move on"; }
  check_log partition part
  node_heal "$hn"
  within 120 "$hn did not become Ready again after the partition healed" is True ready "$hn"
  within 120 "the partitioned holder's leasehold run did not exit 76 (lost)" is 76 exit_code "$h"
  [ "$(awk -v p="$h" '$1 == "start" && $3 == p' "$HOST_LOG_DIR/log" | wc -l)" = 1 ] \
    || fail "the partitioned holder ran CMD again; the log has: $(cat "$HOST_LOG_DIR/log")"
  # Its log is read through the API server from the node's kubelet: the path the partition
  # cut, which may take a while to carry a request again after the node is Ready (the
  # kubelet's own requests go the other way).
  within 120 "the partitioned holder did not report its loss" has_line "lost lock part" k logs -n "$NS" "$h"
  echo "  healed: $hn Ready, $h exited 76 (lost lock part), its CMD ran once"
  check_log partition-healed part
  clean_lock part
}

# A node dies holding both a lock holder and the leading controller: the standby leads
# within the leader lease, and the lock moves on by expiry (the pod object stays
# Running: the claim does not wait for pod eviction), no overlap, tokens increasing.
fault_node_lost() {
  step "fault: a node is lost with a lock holder and the leading controller on it"
  reset_log
  local lease=10 lead ln other t0 t_lead t_next tok
  lead=$(leader); ln=$(node_of "$SYSNS" "$lead")
  other=$(others "$ln" | head -1)
  [ "$(k get pods -n "$SYSNS" -o jsonpath='{.items[*].spec.nodeName}' | tr ' ' '\n' | grep -c "^$ln\$")" = 1 ] \
    || fail "both controller replicas run on $ln: a lost node would take both (see SPREAD_REPLICAS)"
  lock lost "$lease"
  pinned_pod lost-a "$ln" lost "$HOLD_SCRIPT"
  within 120 "lost-a does not hold lock lost" is lost-a holder_of lost
  within 60 "lost-a's CMD never started" has_started lost-a
  pinned_pod lost-b "$other" lost "$HOLD_SCRIPT"
  within 60 "lost-b is not queued" has lost-b queued lost
  tok=$(token_of lost)
  t0=$(now_ns)
  node_kill "$ln"
  # Its processes died with it (SIGKILL of every container's init): the section ends now.
  echo "end $tok lost-a $t0 killed-with-its-node" >> "$HOST_LOG_DIR/log"
  echo "  killed $ln at once: leader $lead, holder lost-a (token $tok)"
  within 90 "no new leader after $ln was lost" other_than "$lead" leader
  t_lead=$(now_ns)
  within 120 "lost-b never started after lost-a's node was lost" has_started lost-b
  t_next=$(started_at lost-b)
  [ "$(token_of lost)" -gt "$tok" ] || fail "the token did not increase: $tok -> $(token_of lost)"
  # The standby leads within the leader lease (15 s); the claim expires a lease (and the
  # expiry grace) after the new leader first saw it, not after pod eviction (minutes).
  local lead_bound=$(( (15 + 5) * 1000 )) next_bound=$(( (15 + lease + 2 + 5) * 1000 ))
  [ "$(ms_since "$t0" "$t_lead")" -le "$lead_bound" ] || fail "the standby took over after more than $lead_bound ms"
  [ "$(ms_since "$t0" "$t_next")" -le "$next_bound" ] || fail "the lock moved on after more than $next_bound ms"
  [ "$(k get pod -n "$NS" lost-a -o jsonpath='{.status.phase}')" = Running ] \
    || echo "  (lost-a's pod object is no longer Running: $(k get pod -n "$NS" lost-a -o jsonpath='{.status.phase}'))"
  echo "  node lost -> new leader seen: $(ms_since "$t0" "$t_lead") ms (bound $lead_bound); -> lost-b's CMD started: $(ms_since "$t0" "$t_next") ms (bound $next_bound); lost-a's pod object: $(k get pod -n "$NS" lost-a -o jsonpath='{.status.phase}')"
  check_log node-lost lost
}

# The controller is upgraded (`helm upgrade` to a second image tag of the same build)
# while 6 clients on every node keep taking turns: no overlap, tokens increasing,
# handoffs flowing through the rollout; prints the longest gap between two grants.
fault_rolling_upgrade() {
  step "fault: a rolling upgrade of the controller while 6 clients contend across nodes"
  reset_log
  local secs=75 inner gap before after
  lock upgrade 10
  image_retag e2e-upgraded
  # Each pod runs `leasehold run` again and again for $secs seconds; its CMD's lines
  # are written by the inner shell (so its variables are escaped from the outer one).
  inner=$(printf '%s; sleep 0.2; %s' "$(line start)" "$(line end)" | sed 's/\$/\\$/g')
  { cat <<YAML
apiVersion: batch/v1
kind: Job
metadata: { name: upgrade }
spec:
  completions: 6
  parallelism: 6
  backoffLimit: 0
  template:
    metadata: { labels: { app: upgrade } }
YAML
    pod_spec Never upgrade "end=\$((\$(date +%s) + $secs)); while [ \$(date +%s) -lt \$end ]; do leasehold run --lock upgrade -- sh -c \"$inner\" || exit 1; done" \
      '["sh", "-c"]'; } | k apply -n "$NS" -f - >/dev/null
  within 120 "the clients are not taking turns" at_least 10 starts upgrade
  before=$(starts upgrade)
  local t0; t0=$(now_ns)
  "$HELM" upgrade leasehold charts/leasehold -n "$SYSNS" --reuse-values --set image.tag=e2e-upgraded >/dev/null
  k rollout status -n "$SYSNS" deploy/leasehold --timeout=180s >/dev/null \
    || fail "the upgrade did not roll out: $(k get pods -n "$SYSNS" -o wide 2>&1)"
  local t1; t1=$(now_ns)
  echo "  upgraded to ${IMAGE%:*}:e2e-upgraded in $(ms_since "$t0" "$t1") ms; $before grants before it"
  k wait -n "$NS" --for=condition=complete job/upgrade --timeout=300s >/dev/null || fail "the contending clients did not finish: $(k get pods -n "$NS" -l app=upgrade -o wide 2>&1)"
  lock_lines upgrade > "$HOST_LOG_DIR/upgrade.sorted"
  "$LEASEHOLD" check-log "$HOST_LOG_DIR/upgrade.sorted" | cut -c1-160 || fail "upgrade: the log shows an overlap:
$(cat "$HOST_LOG_DIR/upgrade.sorted")"
  after=$(awk -v t="$t1" '$1 == "start" && $4 > t' "$HOST_LOG_DIR/upgrade.sorted" | wc -l)
  [ "$after" -gt 0 ] || fail "no grant after the upgrade rolled out; the log has: $(tail -20 "$HOST_LOG_DIR/upgrade.sorted")"
  local during; during=$(awk -v a="$t0" -v b="$t1" '$1 == "start" && $4 > a && $4 < b' "$HOST_LOG_DIR/upgrade.sorted" | wc -l)
  gap=$(awk '$1 == "start" { if (last) { g = $4 - last; if (g > max) max = g } last = $4 } END { printf "%d", max / 1000000 }' "$HOST_LOG_DIR/upgrade.sorted")
  echo "  $(grep -c '^start ' "$HOST_LOG_DIR/upgrade.sorted") grants, no overlap, tokens increasing; $during during the rollout, $after after it; longest gap between grants: $gap ms"
  k get pods -n "$SYSNS" -o wide
  k delete job -n "$NS" upgrade --wait=false >/dev/null
  clean_lock upgrade
}

# With the leader on another node than both holder and successor, the release notice
# and the direct grant cross the pod network (the leader's metrics count them); then,
# with the leader's notice port black-holed from the other nodes, the holder falls back
# to the release mark after the notice times out, without overlap.
fault_fast_path() {
  step "fault: release notices and direct grants across the pod network, then black-holed"
  reset_log
  local lead ln a b ip metrics direct0 direct1 written0 written1
  lead=$(leader); ln=$(node_of "$SYSNS" "$lead"); ip=$(k get pod -n "$SYSNS" "$lead" -o jsonpath='{.status.podIP}')
  set -- $(others "$ln")
  a=$1 b=$2
  # metric NAME: its value on the leader (through the API server's pod proxy; no value
  # is 0, a failed read fails the step with kubectl's error).
  metric() {
    local m; m=$(within 30 "the leader's metrics" k get --raw "/api/v1/namespaces/$SYSNS/pods/$lead:8080/proxy/metrics") || exit 1
    awk -v m="$1" '$1 == m { v = $2 } END { print v + 0 }' <<<"$m"
  }
  direct0=$(metric leasehold_direct_grants_total); written0=$(metric 'leasehold_release_notices_total{category="written"}')
  lock fast 10
  # pass FIRST SECOND: FIRST holds 2 s on node $a, SECOND waits on node $b. FIRST's pod
  # lingers after its `leasehold run` released, so that only the release (a notice, or
  # the mark) can pass the lock on at once: a finished pod would pass it too.
  pass() {
    local inner; inner=$(printf '%s; sleep 2; %s' "$(line start)" "$(line end)" | sed 's/\$/\\$/g')
    pinned_pod "$1" "$a" fast "trap \"exit 0\" TERM; leasehold run --lock fast -- sh -c \"$inner\"; sleep 60 & wait" '["sh", "-c"]'
    within 60 "$1 does not hold lock fast" is "$1" holder_of fast
    pinned_pod "$2" "$b" fast "$(line start); sleep 1; $(line end)"
    within 120 "$2 did not succeed" is Succeeded k get pod -n "$NS" "$2" -o jsonpath='{.status.phase}'
  }
  pass fast-a fast-b
  direct1=$(metric leasehold_direct_grants_total); written1=$(metric 'leasehold_release_notices_total{category="written"}')
  echo "  leader $lead on $ln; holder on $a, successor on $b: direct grants ${direct0:-0} -> $direct1, release notices written ${written0:-0} -> $written1"
  [ "$direct1" -gt "$direct0" ] || fail "no direct grant crossed the pod network (leasehold_direct_grants_total $direct0 -> $direct1)"
  [ "$written1" -gt "$written0" ] || fail "no release notice crossed the pod network (written notices $written0 -> $written1)"
  check_log fast-path fast
  node_block_port "$ln" "$ip" 8081
  local t0; t0=$(now_ns)
  pass fast-c fast-d
  node_unblock_port "$ln" "$ip" 8081
  local written2; written2=$(metric 'leasehold_release_notices_total{category="written"}')
  [ "$written2" = "$written1" ] || fail "a release notice got through the black hole (written notices $written1 -> $written2)"
  k logs -n "$NS" fast-c | grep -qi "notice" && echo "  fast-c: $(k logs -n "$NS" fast-c | grep -i notice | head -1)"
  local c_end d_start; c_end=$(awk '$1 == "end" && $3 == "fast-c" { print $4 }' "$HOST_LOG_DIR/log"); d_start=$(started_at fast-d)
  echo "  notices black-holed: fast-c's CMD ended -> fast-d's started in $(ms_since "$c_end" "$d_start") ms (by the release mark; bound: the lease, 10000 ms), no notice written"
  # Without the mark the slot would pass only by expiry, after more than the lease.
  [ "$(ms_since "$c_end" "$d_start")" -le 10000 ] \
    || fail "the handoff waited for an expiry: the release mark did not follow the lost notice; the log has: $(cat "$HOST_LOG_DIR/log")"
  check_log fast-path-blackholed fast
  clean_lock fast
}

# run_steps [STEP...]: the shared scenario's steps and the faults, by name (default: all,
# in this order; node-lost last, as it leaves a node dead).
run_steps() {
  local s
  [ $# -gt 0 ] || set -- scenario fast-path upgrade partition node-lost
  for s in "$@"; do
    case "$s" in
      scenario) admission_confines_clients; contention; delete_holder; only_the_holder_ready; any_image; kill_leader ;;
      fast-path) fault_fast_path ;;
      upgrade) fault_rolling_upgrade ;;
      partition) fault_partition ;;
      node-lost) fault_node_lost ;;
      *) fail "unknown step $s (steps: scenario fast-path upgrade partition node-lost)" ;;
    esac
  done
}
