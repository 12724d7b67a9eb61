# The end-to-end scenario, shared by the cluster providers (kind.sh, real-node.sh):
# one code path, checked with `leasehold check-log` (the integration tests' checker).
#
# The provider sets: KUBECTL, HELM, LEASEHOLD (a host binary, for check-log), IMAGE
# (repository:tag, already on the node), NS (the app namespace), and
#   LOG_MODE=stdout               sections log to stdout, collected with kubectl logs, or
#   LOG_MODE=hostpath HOST_LOG_DIR sections append to a hostPath file read on the host;
#   POD_EXTRAS     YAML lines added to every pod spec (6 spaces of indent), may be empty;
#   ENV_EXTRAS     YAML env list items added to every container (12 spaces), may be empty;
#   HELM_EXTRA     array of extra `helm install` arguments.
# SPREAD_REPLICAS holds the `helm install` arguments that keep the controller replicas on
# different nodes (a topology spread that must be met); the multi-node providers add it.
SPREAD_REPLICAS=(--set "topologySpreadConstraints[0].maxSkew=1"
  --set "topologySpreadConstraints[0].topologyKey=kubernetes.io/hostname"
  --set "topologySpreadConstraints[0].whenUnsatisfiable=DoNotSchedule")

SYSNS=leasehold-system
k() { "$KUBECTL" "$@"; }
step() { printf '\n==> %s\n' "$*"; }
fail() { echo "FAIL: $*" >&2; exit 1; }
# Run the command until it succeeds, once a second, for at most $1 seconds.
until_ok() { local t=$1; shift; for _ in $(seq "$t"); do "$@" >/dev/null 2>&1 && return 0; sleep 1; done; "$@"; }

# pod_spec RESTART LOCK SCRIPT [COMMAND]: a pod spec running `leasehold run --lock LOCK`
# with SCRIPT as CMD (or COMMAND, a JSON list, with SCRIPT as its argument); $OUT is
# where the script writes its `start|end|term <token> <pod> <ns-time>` lines.
pod_spec() {
  local restart=$1 lock=$2 script=$3 out=/dev/stdout mount=""
  local command=${4:-"[\"leasehold\", \"run\", \"--lock\", \"$lock\", \"--\", \"sh\", \"-c\"]"}
  if [ "$LOG_MODE" = hostpath ]; then
    out=/shared/log
    mount=$'          volumeMounts: [{ name: shared, mountPath: /shared }]\n'
  fi
  cat <<YAML
    spec:
      serviceAccountName: leasehold-client
      restartPolicy: $restart
      terminationGracePeriodSeconds: 20
${POD_EXTRAS:-}
      containers:
        - name: worker
          image: $IMAGE
          imagePullPolicy: Never
          command: $command
          args: ['$script']
${mount}          env:
            - { name: OUT, value: "$out" }
            - { name: POD_NAME, valueFrom: { fieldRef: { fieldPath: metadata.name } } }
            - { name: POD_NAMESPACE, valueFrom: { fieldRef: { fieldPath: metadata.namespace } } }
            - { name: POD_UID, valueFrom: { fieldRef: { fieldPath: metadata.uid } } }
${ENV_EXTRAS:-}
YAML
  if [ "$LOG_MODE" = hostpath ]; then
    printf '      volumes: [{ name: shared, hostPath: { path: "%s", type: Directory } }]\n' "$HOST_LOG_DIR"
  fi
}

line() { echo "echo $1 \$LEASEHOLD_FENCING_TOKEN \$POD_NAME \$(date +%s%N) >> \$OUT"; }

install_chart() {
  step "helm install: 2 controller replicas with leader election, image $IMAGE"
  k create namespace "$NS" >/dev/null
  "$HELM" install leasehold charts/leasehold -n "$SYSNS" --create-namespace \
    --set image.repository="${IMAGE%:*}" --set image.tag="${IMAGE##*:}" --set image.pullPolicy=Never \
    --set "clientRbac.namespaces={$NS}" "${HELM_EXTRA[@]}"
  until_ok 180 bash -c "[ \"\$('$KUBECTL' get deploy -n $SYSNS leasehold -o jsonpath='{.status.availableReplicas}')\" = 2 ]" \
    || fail "the controller replicas did not become available"
}

contention() {
  step "contention: a Job of 6 parallel pods, one lock"
  { cat <<YAML
apiVersion: leasehold.dev/v1alpha1
kind: DistributedLock
metadata: { name: contention }
spec: { leaseDurationSeconds: 10 }
---
apiVersion: batch/v1
kind: Job
metadata: { name: contention }
spec:
  completions: 6
  parallelism: 6
  backoffLimit: 0
  template:
YAML
    pod_spec Never contention "$(line start); sleep 1; $(line end)"; } | k apply -n "$NS" -f -
  k wait -n "$NS" --for=condition=complete job/contention --timeout=300s || fail "the contention Job did not complete"
  local log; log=$(mktemp)
  if [ "$LOG_MODE" = hostpath ]; then
    cp "$HOST_LOG_DIR/log" "$log"; : > "$HOST_LOG_DIR/log"
  else
    for pod in $(k get pods -n "$NS" -l job-name=contention -o name); do k logs -n "$NS" "$pod" >> "$log"; done
  fi
  sort -n -k4,4 "$log" | grep -E '^(start|end|term) ' > "$log.sorted"
  "$LEASEHOLD" check-log "$log.sorted" || fail "contention log:\n$(cat "$log.sorted")"
  [ "$(grep -c '^start ' "$log.sorted")" = 6 ] || fail "expected 6 sections: $(cat "$log.sorted")"
  k get dlock -n "$NS" contention
}

holder() { k get dlock -n "$NS" singleton -o jsonpath='{.status.holders[0].pod}'; }
has_holder() { [ -n "$(holder)" ]; }
# The holder's own token: status.fencingToken also counts a token reserved for the
# designated successor, which its grant then keeps.
token() { k get dlock -n "$NS" singleton -o jsonpath='{.status.holders[0].fencingToken}'; }
# hand_off: delete the holder pod and wait for another pod to hold with a higher token.
hand_off() {
  local old t; old=$(holder); t=$(token)
  k delete pod -n "$NS" "$old" --wait=false >/dev/null
  until_ok 90 bash -c "h=\$('$KUBECTL' get dlock -n $NS singleton -o jsonpath='{.status.holders[0].pod}'); [ -n \"\$h\" ] && [ \"\$h\" != $old ]" \
    || fail "no new holder after deleting $old"
  [ "$(token)" -gt "$t" ] || fail "the token did not increase after $old"
  echo "  $old -> $(holder), token $t -> $(token)"
}

delete_holder() {
  step "singleton: deleting the holder pod mid-section (the kubelet's SIGTERM reaches CMD)"
  { cat <<YAML
apiVersion: leasehold.dev/v1alpha1
kind: DistributedLock
metadata: { name: singleton }
spec: { leaseDurationSeconds: 30 }
---
apiVersion: apps/v1
kind: Deployment
metadata: { name: singleton }
spec:
  replicas: 2
  selector: { matchLabels: { app: singleton } }
  template:
    metadata: { labels: { app: singleton } }
YAML
    # The trap in single quotes (doubled: the script sits in a YAML single-quoted
    # string), so its `date` runs when SIGTERM comes, not when the trap is set.
    pod_spec Always singleton "trap ''$(line term); exit 0'' TERM; $(line start); while true; do sleep 1; done"; } \
    | k apply -n "$NS" -f -
  until_ok 120 has_holder || fail "nobody holds the singleton lock"
  if [ "$LOG_MODE" = hostpath ]; then # mid-section: once the holder's CMD has started
    until_ok 30 grep -q "^start .* $(holder) " "$HOST_LOG_DIR/log" || fail "the holder's CMD never started"
  fi
  hand_off
  # Released, not expired: the CMD stopped on SIGTERM and leasehold run released.
  # (This lock's events only: the contention lock's are in the same namespace.)
  until_ok 30 bash -c "'$KUBECTL' get events -n $NS --field-selector reason=Released,involvedObject.kind=DistributedLock,involvedObject.name=singleton -o name | grep -q ." \
    || fail "no Released event: the handoff did not come from a release"
  if [ "$LOG_MODE" = hostpath ]; then
    sort -n -k4,4 "$HOST_LOG_DIR/log" > "$HOST_LOG_DIR/sorted"
    "$LEASEHOLD" check-log --allow-open "$HOST_LOG_DIR/sorted" || fail "singleton log:\n$(cat "$HOST_LOG_DIR/sorted")"
    grep -q '^term ' "$HOST_LOG_DIR/sorted" || fail "CMD never saw SIGTERM"
  fi
}

kill_leader() {
  step "killing the leading controller pod: the other replica takes over"
  local leader new
  leader=$(k get lease -n "$SYSNS" leasehold-controller -o jsonpath='{.spec.holderIdentity}')
  [ -n "$leader" ] || fail "no controller leader"
  k delete pod -n "$SYSNS" "$leader" --wait=false >/dev/null
  until_ok 90 bash -c "l=\$('$KUBECTL' get lease -n $SYSNS leasehold-controller -o jsonpath='{.spec.holderIdentity}'); [ -n \"\$l\" ] && [ \"\$l\" != $leader ]" \
    || fail "no new leader after deleting $leader"
  new=$(k get lease -n "$SYSNS" leasehold-controller -o jsonpath='{.spec.holderIdentity}')
  echo "  leader $leader -> $new"
  hand_off
}

run_scenario() {
  install_chart
  contention
  delete_holder
  kill_leader
  step "end-to-end scenario passed"
}
