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
# within SECS WHAT CMD...: run CMD once a second until it succeeds, for at most SECS
# seconds (by the clock, however long a try takes), and print what it printed; else fail
# with WHAT and what its last try printed, stdout and stderr, so a failure says what it
# saw (a kubectl error is not swallowed by a pipe).
within() {
  local t=$1 what=$2 out err errf end; shift 2
  end=$(( $(date +%s) + t )); errf=$(mktemp)
  while :; do
    if out=$("$@" 2>"$errf"); then
      rm -f "$errf"; [ -z "$out" ] || printf '%s\n' "$out"; return 0
    fi
    if [ "$(date +%s)" -ge "$end" ]; then
      err=$(cat "$errf"); rm -f "$errf"
      fail "$what (for ${t}s; the last try of \`$*\` printed: ${out:-nothing}${err:+; stderr: $err})"
    fi
    sleep 1
  done
}
# is WANT CMD...: CMD succeeds and prints exactly WANT; else say what it printed.
is() {
  local want=$1 got; shift
  got=$("$@") || return
  [ "$got" = "$want" ] || { echo "wanted '$want', got '$got'"; return 1; }
}
# has WORD CMD...: CMD succeeds and prints WORD (a whole word); else say what it printed.
has() {
  local want=$1 got; shift
  got=$("$@") || return
  grep -qwF -- "$want" <<<"$got" || { echo "no '$want' in '$got'"; return 1; }
}
# has_line TEXT CMD...: CMD succeeds and prints TEXT; else say what it printed (its tail).
has_line() {
  local want=$1 got; shift
  got=$("$@") || return
  grep -qF -- "$want" <<<"$got" || { echo "no '$want' in: $(tail -5 <<<"$got")"; return 1; }
}
# at_least N CMD...: CMD prints a number of at least N.
at_least() {
  local n=$1 got; shift
  got=$("$@")
  [ "${got:-0}" -ge "$n" ] 2>/dev/null || { echo "${got:-nothing}, fewer than $n"; return 1; }
}
# other_than OLD CMD...: CMD prints something neither empty nor OLD.
other_than() {
  local old=$1 got; shift
  got=$("$@") || return
  [ -n "$got" ] && [ "$got" != "$old" ] || { echo "still '$got'"; return 1; }
}

# pod_spec RESTART LOCK SCRIPT [COMMAND]: a pod spec running `leasehold run --lock LOCK`
# with SCRIPT as CMD (or COMMAND, a JSON list, with SCRIPT as its argument); $OUT is
# where the script writes its `start|end|term <token> <pod> <ns-time>` lines. No identity
# in the env: the client knows its pod from its bound service-account token (issued as
# on Kubernetes >= 1.21), and tells CMD (LEASEHOLD_POD). $POD_ACCOUNT names its
# ServiceAccount (default leasehold-client); $CONTAINER_EXTRAS (lines, each ending in a
# newline) adds to the container.
pod_spec() {
  local restart=$1 lock=$2 script=$3 out=/dev/stdout mount=""
  local command=${4:-"[\"leasehold\", \"run\", \"--lock\", \"$lock\", \"--\", \"sh\", \"-c\"]"}
  if [ "$LOG_MODE" = hostpath ]; then
    out=/shared/log
    mount=$'          volumeMounts: [{ name: shared, mountPath: /shared }]\n'
  fi
  cat <<YAML
    spec:
      serviceAccountName: ${POD_ACCOUNT:-leasehold-client}
      restartPolicy: $restart
      terminationGracePeriodSeconds: 20
${POD_EXTRAS:-}
      containers:
        - name: worker
          image: $IMAGE
          imagePullPolicy: Never
          command: $command
          args: ['$script']
${CONTAINER_EXTRAS:-}${mount}          env:
            - { name: OUT, value: "$out" }
${ENV_EXTRAS:-}
YAML
  if [ "$LOG_MODE" = hostpath ]; then
    printf '      volumes: [{ name: shared, hostPath: { path: "%s", type: Directory } }]\n' "$HOST_LOG_DIR"
  fi
}

# The leading controller replica.
leader() { k get lease -n "$SYSNS" leasehold-controller -o jsonpath='{.spec.holderIdentity}'; }
# The time of the first `start` line of POD in the shared log (empty if none).
started_at() { awk -v p="$1" '$1 == "start" && $3 == p { print $4; exit }' "$HOST_LOG_DIR/log"; }
# has_started POD: POD's CMD has written its `start` line (else say what the log has).
has_started() { [ -n "$(started_at "$1")" ] || { echo "no start of $1 in the log: $(tail -5 "$HOST_LOG_DIR/log")"; return 1; }; }

line() { echo "echo $1 \$LEASEHOLD_FENCING_TOKEN \$LEASEHOLD_POD \$(date +%s%N) >> \$OUT"; }

install_chart() {
  step "helm install: 2 controller replicas with leader election, the admission webhook (the defaults), image $IMAGE"
  k create namespace "$NS" >/dev/null
  # Kubernetes < 1.21 does not label namespaces with their name; the webhook's
  # confinement of the client accounts selects them by it (the chart's NOTES say so).
  k label namespace "$NS" "kubernetes.io/metadata.name=$NS" --overwrite >/dev/null
  "$HELM" install leasehold charts/leasehold -n "$SYSNS" --create-namespace \
    --set image.repository="${IMAGE%:*}" --set image.tag="${IMAGE##*:}" --set image.pullPolicy=Never \
    --set "clientRbac.namespaces={$NS}" --set "clientRbac.serviceAccounts={e2e-app}" "${HELM_EXTRA[@]}"
  within 180 "the controller replicas did not become available" \
    is 2 k get deploy -n "$SYSNS" leasehold -o jsonpath='{.status.availableReplicas}'
}

# The default install's admission webhook: the client service account (whose Role may
# create and patch any Lease) cannot write a Lease that is not a claim, so it cannot
# depose another application's leader; the locks work on (the steps after this).
admission_confines_clients() {
  step "admission: the client service account cannot write another application's Lease"
  local as="system:serviceaccount:$NS:leasehold-client" out lease
  lease=$(mktemp --suffix .json)
  echo '{"apiVersion":"coordination.k8s.io/v1","kind":"Lease","metadata":{"name":"app-leader"},"spec":{"holderIdentity":"app-0"}}' > "$lease"
  # The webhook answers once a controller pod serves it and is among its endpoints.
  within 120 "the webhook never refused the client's write of a Lease that is no claim" \
    refused "lock clients may write only claim Leases" k create -n "$NS" --as "$as" -f "$lease"
  out=$(k create -n "$NS" -f "$lease" 2>&1) || fail "an admin could not create the application's Lease: $out"
  rm -f "$lease"
  # As a neighbour would: a raw PATCH, with no GET first (the client Role has none).
  out=$(raw_patch "$as" app-leader '{"spec":{"holderIdentity":"neighbour"}}')
  grep -q '"status": *"Failure"' <<<"$out" || fail "the client service account patched another application's Lease: $out"
  grep -q "lock clients may write only claim Leases" <<<"$out" || fail "refused, but not by the webhook: $out"
  echo "  refused: $(sed -n 's/^ *"message": *"\(.*\)",$/\1/p' <<<"$out")"
  # The application's own account the chart binds (clientRbac.serviceAccounts) likewise.
  out=$(raw_patch "system:serviceaccount:$NS:e2e-app" app-leader '{"spec":{"holderIdentity":"neighbour"}}')
  grep -q "lock clients may write only claim Leases" <<<"$out" || fail "e2e-app (clientRbac.serviceAccounts) patched another application's Lease: $out"
  echo "  e2e-app (clientRbac.serviceAccounts) refused alike"
}

# raw_patch USER LEASE JSON: a merge PATCH of Lease LEASE in $NS sent straight to the API
# server as USER (impersonated), no GET before it; prints the API server's answer.
raw_patch() {
  local server token ca trust=(--insecure)
  server=$("$KUBECTL" config view --minify -o jsonpath='{.clusters[0].cluster.server}')
  token=$("$KUBECTL" config view --raw --minify -o jsonpath='{.users[0].user.token}')
  ca=$("$KUBECTL" config view --minify -o jsonpath='{.clusters[0].cluster.certificate-authority}')
  [ -z "$ca" ] || trust=(--cacert "$ca")
  curl -sS "${trust[@]}" -X PATCH -H "Authorization: Bearer $token" \
    -H "Impersonate-User: $1" -H 'Content-Type: application/merge-patch+json' --data "$3" \
    "$server/apis/coordination.k8s.io/v1/namespaces/$NS/leases/$2" 2>&1
}

# refused TEXT CMD...: CMD fails saying TEXT (else say what it did).
refused() {
  local want=$1 out; shift
  if out=$("$@" 2>&1); then
    "$KUBECTL" delete -n "$NS" lease app-leader --ignore-not-found >/dev/null 2>&1
    echo "accepted: $out (the webhook's endpoints: $("$KUBECTL" get endpoints -n "$SYSNS" leasehold-admission -o jsonpath='{.subsets}' 2>&1))"
    return 1
  fi
  grep -qF -- "$want" <<<"$out" || { echo "refused otherwise: $out"; return 1; }
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
  k wait -n "$NS" --for=condition=complete job/contention --timeout=300s \
    || fail "the contention Job did not complete: $(k get pods -n "$NS" -l job-name=contention -o wide 2>&1)"
  local log; log=$(mktemp)
  if [ "$LOG_MODE" = hostpath ]; then
    cp "$HOST_LOG_DIR/log" "$log"; : > "$HOST_LOG_DIR/log"
  else
    for pod in $(k get pods -n "$NS" -l job-name=contention -o name); do
      within 60 "the log of $pod" k logs -n "$NS" "$pod" >> "$log"
    done
  fi
  sort -n -k4,4 "$log" | grep -E '^(start|end|term) ' > "$log.sorted"
  "$LEASEHOLD" check-log "$log.sorted" || fail "contention log:\n$(cat "$log.sorted")"
  [ "$(grep -c '^start ' "$log.sorted")" = 6 ] || fail "expected 6 sections, the log has: $(cat "$log.sorted")"
  k get dlock -n "$NS" contention
}

holder() { k get dlock -n "$NS" singleton -o jsonpath='{.status.holders[0].pod}'; }
# The holder's own token: status.fencingToken also counts a token reserved for the
# designated successor, which its grant then keeps.
token() { k get dlock -n "$NS" singleton -o jsonpath='{.status.holders[0].fencingToken}'; }
# hand_off: delete the holder pod and wait for another pod to hold with a higher token.
hand_off() {
  local old t; old=$(holder); t=$(token)
  k delete pod -n "$NS" "$old" --wait=false >/dev/null
  within 90 "no new holder after deleting $old" other_than "$old" holder
  [ "$(token)" -gt "$t" ] || fail "the token did not increase after $old: $t -> $(token)"
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
  within 120 "nobody holds the singleton lock" other_than "" holder
  if [ "$LOG_MODE" = hostpath ]; then # mid-section: once the holder's CMD has started
    within 30 "the holder's CMD never started" has_started "$(holder)"
  fi
  hand_off
  # Released, not expired: the CMD stopped on SIGTERM and leasehold run released.
  # (This lock's events only: the contention lock's are in the same namespace.)
  within 30 "no Released event: the handoff did not come from a release" \
    other_than "" k get events -n "$NS" --field-selector reason=Released,involvedObject.kind=DistributedLock,involvedObject.name=singleton -o name
  if [ "$LOG_MODE" = hostpath ]; then
    sort -n -k4,4 "$HOST_LOG_DIR/log" > "$HOST_LOG_DIR/sorted"
    "$LEASEHOLD" check-log --allow-open "$HOST_LOG_DIR/sorted" || fail "singleton log:\n$(cat "$HOST_LOG_DIR/sorted")"
    grep -q '^term ' "$HOST_LOG_DIR/sorted" || fail "CMD never saw SIGTERM; the log has: $(cat "$HOST_LOG_DIR/sorted")"
  fi
}

# ready_pods: the READY condition of each pod of app=lead, as "pod=True pod=False".
ready_pods() {
  k get pods -n "$NS" -l app=lead -o jsonpath='{range .items[*]}{.metadata.name}={.status.conditions[?(@.type=="Ready")].status} {end}'
}
# routed: the pods the Service `lead` routes to (its ready endpoints).
routed() { k get endpoints -n "$NS" lead -o jsonpath='{.subsets[*].addresses[*].targetRef.name}'; }
lead_holder() { k get dlock -n "$NS" lead -o jsonpath='{.status.holders[0].pod}'; }
# only_ready HOLDER: HOLDER alone is Ready and alone behind the Service.
only_ready() {
  local r="$1=True" p
  for p in $(ready_pods); do
    case "$p" in "$r") ;; *=True) echo "also Ready: $p ($(ready_pods))"; return 1 ;; esac
  done
  grep -qx -- "$r" <<<"$(ready_pods | tr ' ' '\n')" || { echo "the holder $1 is not Ready: $(ready_pods)"; return 1; }
  [ "$(routed)" = "$1" ] || { echo "the Service routes to '$(routed)'"; return 1; }
}

# Leader election in a Deployment's style: two replicas (one Deployment each: on the real
# node they share the host's network, so each gets its own port) run `leasehold run
# --ready-port` with a readiness probe on it; only the holder is Ready and behind the
# Service, and when it goes, the other is. They run as the application's own
# ServiceAccount (e2e-app, bound by the chart's clientRbac.serviceAccounts), with no
# identity in their env.
only_the_holder_ready() {
  step "only the holder is Ready: leasehold run --ready-port behind a readinessProbe and a Service, as its own ServiceAccount"
  k create serviceaccount -n "$NS" e2e-app >/dev/null
  { cat <<YAML
apiVersion: leasehold.dev/v1alpha1
kind: DistributedLock
metadata: { name: lead }
spec: { leaseDurationSeconds: 10 }
---
apiVersion: v1
kind: Service
metadata: { name: lead }
spec:
  selector: { app: lead }
  ports: [{ name: ready, port: 8081, targetPort: ready }]
YAML
    local i port
    for i in 1 2; do
      port=$(( 18080 + i ))
      cat <<YAML
---
apiVersion: apps/v1
kind: Deployment
metadata: { name: lead-$i }
spec:
  replicas: 1
  selector: { matchLabels: { app: lead, replica: "r$i" } }
  template:
    metadata: { labels: { app: lead, replica: "r$i" } }
YAML
      POD_ACCOUNT=e2e-app CONTAINER_EXTRAS="          ports: [{ name: ready, containerPort: $port }]
          readinessProbe: { httpGet: { path: /, port: ready }, periodSeconds: 1, failureThreshold: 1 }
" pod_spec Always lead "exec sleep 3600" "[\"leasehold\", \"run\", \"--lock\", \"lead\", \"--ready-port\", \"$port\", \"--\", \"sh\", \"-c\"]"
    done; } | k apply -n "$NS" -f - >/dev/null
  within 120 "nobody holds lock lead" other_than "" lead_holder
  local first; first=$(lead_holder)
  within 60 "not the holder alone is Ready and routed to" only_ready "$first"
  echo "  holder $first alone Ready and behind the Service ($(ready_pods))"
  k delete pod -n "$NS" "$first" --wait=false >/dev/null
  within 90 "no new holder after deleting $first" other_than "$first" lead_holder
  local next; next=$(lead_holder)
  within 60 "after the handoff, not the new holder alone is Ready and routed to" only_ready "$next"
  echo "  $first deleted -> $next alone Ready and behind the Service"
  k delete deploy -n "$NS" lead-1 lead-2 --wait=false >/dev/null
}

# container_log POD CONTAINER [NS]: what CONTAINER of POD (in NS, default $NS) printed, through the API server, or
# where that cannot reach the kubelet (the real node's kubelet does not authenticate the
# API server), from this host's kubelet log file (CRI lines: time stream tag message).
container_log() {
  local ns=${3:-$NS}
  k logs -n "$ns" "$1" -c "$2" 2>/dev/null && return
  local f; f=$(ls /var/log/pods/"${ns}_$1_"*/"$2"/0.log 2>/dev/null | head -1)
  [ -n "$f" ] || { echo "no log of $1/$2 through the API server or in /var/log/pods" >&2; return 1; }
  cut -d' ' -f4- "$f"
}

# An application image that has never heard of leasehold (plain-app:e2e, a Debian
# minbase), wrapped as examples/any-image.yaml shows: the example itself, its image
# placeholders renamed to the images imported here (tests/e2e/example.py).
any_image() {
  step "any image: examples/any-image.yaml (an initContainer installs leasehold into an emptyDir of plain-app:e2e)"
  /usr/bin/python3 tests/e2e/example.py examples/any-image.yaml "leasehold:0.1.0=$IMAGE" \
    "registry.example.com/your-app:1.0=plain-app:e2e" "${EXAMPLE_EXTRAS[@]}" | k apply -n "$NS" -f - >/dev/null
  k wait -n "$NS" --for=condition=complete job/batch-report --timeout=180s \
    || fail "the Job of examples/any-image.yaml did not complete: $(k get pods -n "$NS" -l job-name=batch-report -o wide 2>&1)"
  local pod tokens=()
  for pod in $(k get pods -n "$NS" -l job-name=batch-report -o jsonpath='{.items[*].metadata.name}'); do
    within 60 "$pod's command did not run under the lock" has_line "report with fencing token" container_log "$pod" report
    tokens+=("$(container_log "$pod" report | sed -n 's/^report with fencing token //p')")
  done
  [ "${#tokens[@]}" = 2 ] && [ "${tokens[0]}" != "${tokens[1]}" ] \
    || fail "expected 2 runs with distinct fencing tokens, got: ${tokens[*]}"
  echo "  2 pods of plain-app:e2e ran their command under the lock, tokens ${tokens[*]}"
}

kill_leader() {
  step "killing the leading controller pod: the other replica takes over"
  local leader new
  within 30 "no controller leader" other_than "" leader
  leader=$(leader)
  k delete pod -n "$SYSNS" "$leader" --wait=false >/dev/null
  within 90 "no new leader after deleting $leader" other_than "$leader" leader
  new=$(leader)
  echo "  leader $leader -> $new"
  hand_off
}

# gone KIND NAME [ARGS...]: the object is not there (else say that it still is).
gone() { ! k get "$@" >/dev/null 2>&1 || { echo "$* is still there: $(k get "$@" -o jsonpath='{.metadata.deletionTimestamp} {.metadata.finalizers}')"; return 1; }; }

# helm uninstall, then delete the app namespace while its lock is granted: the chart's
# pre-delete hook (leasehold prepare-uninstall) stopped the controller and took the
# fence finalizer off, so the namespace goes (before it, it hung on the lock for ever).
uninstall_without_hang() {
  step "helm uninstall with a lock granted, then deleting its namespace: nothing hangs"
  local before; before=$(holder)
  [ -n "$before" ] || fail "singleton has no holder before the uninstall"
  has_line "leasehold.dev/fence-holders" k get dlock -n "$NS" singleton -o jsonpath='{.metadata.finalizers}' >/dev/null ||
    fail "the granted lock carries no fence finalizer before the uninstall"
  # What an operator reads first: -o wide's holders, maxHolders and successor, and
  # `leasehold status` with the Ready condition.
  local wide; wide=$(k get dlock -n "$NS" singleton -o wide)
  grep -qE 'HOLDERS +MAX +SUCCESSOR' <<<"$wide" && grep -qF "$before" <<<"$wide" ||
    fail "kubectl get dlock -o wide shows no holders, maxHolders and successor: $wide"
  printf '%s\n' "$wide"
  local status; status=$("$LEASEHOLD" status -n "$NS" singleton)
  grep -q '^Ready: True' <<<"$status" && grep -qE "^holder +$before " <<<"$status" ||
    fail "leasehold status shows no Ready condition or holder: $status"
  printf '%s\n' "$status"
  if [ -n "${LOG_FORMAT_JSON:-}" ]; then
    local pod; pod=$(leader)
    container_log "$pod" controller "$SYSNS" | tail -20 | python3 -c 'import json, sys; lines = [json.loads(l) for l in sys.stdin if l.strip()]; assert lines and all("level" in l and "timestamp" in l for l in lines), lines' ||
      fail "logFormat=json: the controller's log lines are not JSON objects"
    echo "  the controller logs JSON lines (logFormat=json)"
  fi
  "$HELM" uninstall leasehold -n "$SYSNS" --wait --timeout 5m ||
    fail "helm uninstall failed: $(k get pods -n "$SYSNS" -o wide 2>&1; k logs -n "$SYSNS" job/leasehold-prepare-uninstall 2>&1)"
  k get crd distributedlocks.leasehold.dev >/dev/null || fail "the CRD did not stay (crds.keep)"
  is "$before" holder || fail "the uninstall changed the holder"
  is "" k get dlock -n "$NS" singleton -o jsonpath='{.metadata.finalizers}' || fail "the fence finalizer is still on"
  k delete namespace "$NS" --wait=false >/dev/null
  within 180 "the namespace holding a granted lock did not go after the uninstall" gone namespace "$NS"
  echo "  uninstalled with $before holding; namespace $NS gone, the CRD kept"
}

# Clients of three kinds take turns on one lock: `leasehold run` (a Job of 2), the Rust
# library through `leasehold contract` driven by bash (2 turns), and the Python client in
# an image of its own ($PY_IMAGE: 2 turns). Every section is logged with its token, and
# check-log holds the lot to mutual exclusion and rising tokens. Run where the provider
# has the Python image (real-node.sh).
mixed_clients() {
  [ -n "${PY_IMAGE:-}" ] || { step "mixed clients: SKIPPED (no Python image on this provider)"; return 0; }
  step "mixed clients: leasehold run, the Rust library and the Python client take turns on one lock"
  local rust_script py_script
  # shellcheck disable=SC2016 # expanded in the pod
  rust_script='coproc C { leasehold contract --lock mixed; }
read -r l <&"${C[0]}"
for i in 1 2; do
  echo acquire >&"${C[1]}"; read -r l <&"${C[0]}"
  t=$(echo "$l" | sed -n "s/.*\"token\": *\([0-9]*\).*/\1/p")
  [ -n "$t" ] || { echo "contract answered: $l" >&2; exit 1; }
  echo start $t $POD_NAME $(date +%s%N) >> $OUT; sleep 1; echo end $t $POD_NAME $(date +%s%N) >> $OUT
  echo release >&"${C[1]}"; read -r l <&"${C[0]}"
done'
  py_script='import os, time
from leasehold_client import Lock
lock, pod = Lock("mixed"), os.environ["POD_NAME"]
for _ in range(2):
    with lock as g:
        with open(os.environ["OUT"], "a") as out:
            print("start", g.fencing_token, pod, time.time_ns(), file=out, flush=True)
            time.sleep(1)
            g.check()
            print("end", g.fencing_token, pod, time.time_ns(), file=out, flush=True)'
  # Multi-line scripts go in the command, as JSON strings (YAML folds a quoted scalar's lines).
  as_json() { python3 -c 'import json, sys; print(json.dumps(sys.argv[1:]))' "$@"; }
  job() { # NAME COMPLETIONS, then a pod spec on stdin
    printf -- '---\napiVersion: batch/v1\nkind: Job\nmetadata: { name: %s }\nspec:\n  completions: %s\n  parallelism: %s\n  backoffLimit: 0\n  template:\n' "$1" "$2" "$2"
    cat
  }
  local named="${ENV_EXTRAS:-}
            - { name: POD_NAME, valueFrom: { fieldRef: { fieldPath: metadata.name } } }"
  { printf 'apiVersion: leasehold.dev/v1alpha1\nkind: DistributedLock\nmetadata: { name: mixed }\nspec: { leaseDurationSeconds: 10 }\n'
    pod_spec Never mixed "$(line start); sleep 1; $(line end)" | job mixed-run 2
    ENV_EXTRAS=$named pod_spec Never mixed "" "$(as_json bash -c "$rust_script")" | job mixed-rust 1
    ENV_EXTRAS=$named IMAGE=$PY_IMAGE pod_spec Never mixed "" "$(as_json python3 -c "$py_script")" | job mixed-python 1
  } | k apply -n "$NS" -f -
  for j in mixed-run mixed-rust mixed-python; do
    k wait -n "$NS" --for=condition=complete "job/$j" --timeout=300s ||
      fail "job $j did not complete: $(k get pods -n "$NS" -l job-name=$j -o wide 2>&1; k logs -n "$NS" -l job-name=$j --tail=20 2>&1)"
  done
  local log; log=$(mktemp)
  if [ "$LOG_MODE" = hostpath ]; then
    cp "$HOST_LOG_DIR/log" "$log"; : > "$HOST_LOG_DIR/log"
  else
    for pod in $(k get pods -n "$NS" -l 'job-name in (mixed-run,mixed-rust,mixed-python)' -o name); do
      within 60 "the log of $pod" k logs -n "$NS" "$pod" >> "$log"
    done
  fi
  sort -n -k4,4 "$log" | grep -E '^(start|end|term) ' > "$log.sorted"
  "$LEASEHOLD" check-log "$log.sorted" || fail "mixed clients' log:\n$(cat "$log.sorted")"
  [ "$(grep -c '^start ' "$log.sorted")" = 6 ] || fail "expected 6 sections, the log has: $(cat "$log.sorted")"
  for j in mixed-run mixed-rust mixed-python; do
    grep -q "^start [0-9]* $j-" "$log.sorted" || fail "no section of $j in: $(cat "$log.sorted")"
  done
  echo "  6 sections, 3 kinds of client, no overlap, tokens rising: $(awk '$1=="start"{printf "%s ", $3}' "$log.sorted")"
}

run_scenario() {
  install_chart
  admission_confines_clients
  contention
  mixed_clients
  delete_holder
  only_the_holder_ready
  any_image
  kill_leader
  uninstall_without_hang
  step "end-to-end scenario passed"
}
