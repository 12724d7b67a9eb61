//! The conformance suite: every client library is driven through one command-line
//! contract (docs/conformance.md) against the real control plane and the controller,
//! and must behave alike. The clients: Rust (`leasehold contract`) and Python
//! (`python -m leasehold_client.contract`, from `clients/python`; the interpreter is
//! `$LEASEHOLD_PYTHON`, default `python3`). Each runs as its own process, as a pod's
//! program would, with the lock users' ServiceAccount token (examples/rbac.yaml).

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use leasehold::api::{DistributedLock, DistributedLockSpec};
use leasehold::protocol::claim::PodIdentity;
use leasehold::protocol::grant::{Grant, GrantKey};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;

use crate::support::{
    DEADLINE, LEASEHOLD, TestNs, controller_taking_notices, holders, kubeconfig, queue, spawn_controller, spec,
    wait_for,
};

/// One client library, as the suite starts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Rust,
    Python,
    /// The Python client's asyncio variant (`AsyncLock`).
    PythonAsyncio,
}

/// The clients under test: `$LEASEHOLD_CONFORMANCE_CLIENTS` (`rust,python,python-asyncio`
/// by default; name one to run the suite for it alone).
fn kinds() -> Vec<Kind> {
    let names = std::env::var("LEASEHOLD_CONFORMANCE_CLIENTS").unwrap_or_else(|_| "rust,python,python-asyncio".into());
    let kinds: Vec<Kind> = names
        .split(',')
        .map(|n| match n.trim() {
            "rust" => Kind::Rust,
            "python" => Kind::Python,
            "python-asyncio" => Kind::PythonAsyncio,
            other => panic!("LEASEHOLD_CONFORMANCE_CLIENTS: unknown client {other:?}"),
        })
        .collect();
    assert!(!kinds.is_empty(), "LEASEHOLD_CONFORMANCE_CLIENTS names no client");
    kinds
}

/// `wanted`, if it is under test; else the first client that is (mixed scenarios).
fn or_tested(wanted: Kind) -> Kind {
    let kinds = kinds();
    if kinds.contains(&wanted) { wanted } else { kinds[0] }
}

impl Kind {
    fn command(self) -> Command {
        match self {
            Kind::Rust => {
                let mut c = Command::new(LEASEHOLD);
                c.arg("contract");
                c
            }
            Kind::Python | Kind::PythonAsyncio => {
                let python = std::env::var("LEASEHOLD_PYTHON").unwrap_or_else(|_| "python3".into());
                let mut c = Command::new(python);
                c.args(["-m", "leasehold_client.contract"]);
                if self == Kind::PythonAsyncio {
                    c.arg("--asyncio");
                }
                c
            }
        }
    }
}

/// A kubeconfig for `ns`'s lock users: the shared API server (or `server`'s copy of its
/// kubeconfig, e.g. through a proxy), authenticated by the `leasehold-client`
/// ServiceAccount's token, as a pod of theirs is.
async fn client_kubeconfig(ns: &TestNs, through: Option<&std::path::Path>) -> PathBuf {
    let sas: Api<ServiceAccount> = Api::namespaced(ns.client.clone(), &ns.name);
    if sas.get_opt("leasehold-client").await.unwrap().is_none() {
        ns.as_lock_user().await;
    }
    let secret = wait_for("the lock users' ServiceAccount token", DEADLINE, || async {
        let sa = sas.get_opt("leasehold-client").await.ok()??;
        sa.secrets?.first()?.name.clone()
    })
    .await;
    let secret = Api::<Secret>::namespaced(ns.client.clone(), &ns.name)
        .get(&secret)
        .await
        .unwrap();
    let token = String::from_utf8(secret.data.unwrap()["token"].0.clone()).unwrap();
    let base = std::fs::read_to_string(through.unwrap_or(kubeconfig())).unwrap();
    let text: String = base
        .lines()
        .map(|l| match l.trim_start().strip_prefix("token: ") {
            Some(_) => format!("    token: {token}"),
            None => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n");
    let path = std::env::temp_dir().join(format!(
        "leasehold-conformance-{}-{:08x}.kubeconfig",
        ns.name,
        rand::random::<u32>()
    ));
    std::fs::write(&path, text).unwrap();
    path
}

/// One client process under the contract: its answers, stamped when they arrived.
struct Driven {
    kind: Kind,
    pod: String,
    child: Child,
    stdin: ChildStdin,
    answers: mpsc::UnboundedReceiver<(Instant, Value)>,
}

impl Driven {
    /// Start a `kind` client for `lock` in pod `pod`, with `kubeconfig`; wait for `ready`.
    async fn start(kind: Kind, kubeconfig: &std::path::Path, lock: &str, pod: &PodIdentity) -> Self {
        let mut child = kind
            .command()
            .args(["--lock", lock, "--namespace", &pod.namespace])
            .env("KUBECONFIG", kubeconfig)
            .env("POD_NAME", &pod.name)
            .env("POD_NAMESPACE", &pod.namespace)
            .env("POD_UID", &pod.uid)
            .env("RUST_LOG", "info")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("start the {kind:?} client: {e}"));
        let stdin = child.stdin.take().unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let (tx, answers) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                let value =
                    serde_json::from_str(&line).unwrap_or_else(|_| json!({ "event": "unparsed", "line": line }));
                if tx.send((Instant::now(), value)).is_err() {
                    return;
                }
            }
        });
        let mut driven = Driven {
            kind,
            pod: pod.name.clone(),
            child,
            stdin,
            answers,
        };
        driven.expect("ready", DEADLINE).await;
        driven
    }

    async fn send(&mut self, command: &str) {
        self.stdin
            .write_all(format!("{command}\n").as_bytes())
            .await
            .unwrap_or_else(|e| panic!("{:?} client in {}: {e}", self.kind, self.pod));
    }

    /// The next answer within `within`.
    async fn next(&mut self, within: Duration) -> (Instant, Value) {
        match tokio::time::timeout(within, self.answers.recv()).await {
            Ok(Some(answer)) => answer,
            Ok(None) => panic!(
                "the {:?} client in {} exited ({:?}): is it installed (pip install ./clients/python)?",
                self.kind,
                self.pod,
                self.child.try_wait()
            ),
            Err(_) => panic!(
                "the {:?} client in {} answered nothing within {within:?}",
                self.kind, self.pod
            ),
        }
    }

    /// The next answer, which must be `event`.
    async fn expect(&mut self, event: &str, within: Duration) -> (Instant, Value) {
        let (at, answer) = self.next(within).await;
        assert_eq!(
            answer["event"], event,
            "the {:?} client in {} answered {answer}, expected {event}",
            self.kind, self.pod
        );
        (at, answer)
    }

    /// `acquire`, and the token it was granted.
    async fn acquired(&mut self, within: Duration) -> (Instant, i64, String) {
        let (at, a) = self.expect("acquired", within).await;
        (
            at,
            a["token"].as_i64().unwrap(),
            a["claim"].as_str().unwrap().to_string(),
        )
    }

    async fn release(&mut self) -> Instant {
        let sent = Instant::now();
        self.send("release").await;
        self.expect("released", DEADLINE).await;
        sent
    }
}

fn lock_spec(lease: i32, max_holders: i32, max_queue: Option<i32>) -> DistributedLockSpec {
    DistributedLockSpec {
        max_holders,
        max_queue,
        ..spec(lease)
    }
}

/// A holder (driven with kubeconfig `configs.0`) granted lock `l` (its token and claim),
/// and a waiter (with `configs.1`) ready to claim it.
async fn holder_and_waiter(
    kind: Kind,
    ns: &TestNs,
    configs: (&std::path::Path, &std::path::Path),
) -> (Driven, (i64, String), Driven) {
    let mut holder = Driven::start(kind, configs.0, "l", &ns.pod("holder").await).await;
    let waiter = Driven::start(kind, configs.1, "l", &ns.pod("waiter").await).await;
    holder.send("acquire").await;
    let (_, token, claim) = holder.acquired(DEADLINE).await;
    (holder, (token, claim), waiter)
}

/// The claim Leases of `lock`, oldest first.
async fn claims(ns: &TestNs, lock: &str) -> Vec<Lease> {
    let leases: Api<Lease> = Api::namespaced(ns.client.clone(), &ns.name);
    let mut all = leases
        .list(&ListParams::default().labels(&format!("leasehold.dev/lock={lock}")))
        .await
        .unwrap()
        .items;
    all.sort_by_key(|l| l.creation_timestamp().map(|t| t.0));
    all
}

#[tokio::test]
async fn clients_of_both_languages_take_turns_in_fifo_order_with_rising_tokens() {
    let ns = TestNs::new("conf-fifo").await;
    let (_addr, _controller) = controller_taking_notices(&ns, "conf-fifo").await;
    ns.lock("l", lock_spec(15, 1, None)).await;
    let config = client_kubeconfig(&ns, None).await;
    let mut clients = Vec::new();
    let order = [Kind::Rust, Kind::Python, Kind::PythonAsyncio, Kind::Rust];
    for (i, kind) in order.into_iter().map(or_tested).enumerate() {
        let pod = ns.pod(&format!("p{i}")).await;
        clients.push(Driven::start(kind, &config, "l", &pod).await);
    }
    clients[0].send("acquire").await;
    let (_, mut last, _) = clients[0].acquired(DEADLINE).await;
    for (i, c) in clients.iter_mut().enumerate().skip(1) {
        c.send("acquire").await;
        ns.wait_lock("l", &format!("client {i} queued"), |l| queue(l).len() == i)
            .await;
    }
    for i in 1..clients.len() {
        let released = clients[i - 1].release().await;
        let (at, token, _) = clients[i].acquired(DEADLINE).await;
        assert!(token > last, "client {i} got token {token} after {last}");
        assert!(at > released, "client {i} was granted before the holder released");
        last = token;
        for (j, c) in clients.iter_mut().enumerate().skip(i + 1) {
            let early = c.answers.try_recv().ok();
            assert!(
                early.is_none(),
                "client {j} ({:?}) answered out of turn: {early:?}",
                c.kind
            );
        }
    }
    clients.last_mut().unwrap().release().await;
}

/// Whether the claim `claim` carried the release mark before it was deleted, as seen by
/// a watch started before its release.
async fn marked_before_deleted(ns: &TestNs, claim: &str, release: impl std::future::Future<Output = ()>) -> bool {
    use futures::StreamExt;
    let leases: Api<Lease> = Api::namespaced(ns.client.clone(), &ns.name);
    let params = kube::api::WatchParams::default().fields(&format!("metadata.name={claim}"));
    let current = leases.get(claim).await.unwrap().resource_version().unwrap();
    let mut events = leases.watch(&params, &current).await.unwrap().boxed();
    release.await;
    let mut marked = false;
    let end = tokio::time::Instant::now() + DEADLINE;
    loop {
        let event = tokio::time::timeout_at(end, events.next())
            .await
            .expect("the released claim is deleted");
        match event {
            Some(Ok(kube::api::WatchEvent::Modified(l))) => {
                marked |= l.labels().get("leasehold.dev/released").is_some_and(|v| v == "true");
            }
            Some(Ok(kube::api::WatchEvent::Deleted(l))) => {
                return marked || l.labels().get("leasehold.dev/released").is_some_and(|v| v == "true");
            }
            Some(_) => {}
            None => panic!("the claim's watch ended"),
        }
    }
}

#[tokio::test]
async fn each_client_releases_by_notice_where_one_is_published_and_by_mark_where_not() {
    for (notices, kind) in [true, false]
        .into_iter()
        .flat_map(|n| kinds().into_iter().map(move |k| (n, k)))
    {
        let ns = TestNs::new("conf-release").await;
        let _controller = match notices {
            true => controller_taking_notices(&ns, "conf-release").await.1,
            false => spawn_controller(&ns, "conf-release"),
        };
        ns.lock("l", lock_spec(15, 1, None)).await;
        let config = client_kubeconfig(&ns, None).await;
        let mut holder = Driven::start(kind, &config, "l", &ns.pod("holder").await).await;
        let mut waiter = Driven::start(kind, &config, "l", &ns.pod("waiter").await).await;
        holder.send("acquire").await;
        let (_, token, claim) = holder.acquired(DEADLINE).await;
        waiter.send("acquire").await;
        ns.wait_lock("l", "the waiter queued", |l| queue(l).len() == 1).await;
        if notices {
            // A holder learns the URL from a status; this one has it.
            ns.wait_lock("l", "a published release URL", |l| {
                l.status.as_ref().is_some_and(|s| s.release_url.is_some())
            })
            .await;
        }
        let marked = marked_before_deleted(&ns, &claim, async {
            holder.release().await;
        })
        .await;
        let (_, next, _) = waiter.acquired(DEADLINE).await;
        assert!(next > token);
        assert_eq!(
            marked,
            !notices,
            "{kind:?}: the release {} the claim",
            if notices {
                "by notice marked"
            } else {
                "without a URL did not mark"
            }
        );
        waiter.release().await;
    }
}

/// Lock `l` once its status designates a successor.
async fn designated(ns: &TestNs) -> DistributedLock {
    ns.wait_lock("l", "the waiter designated", |l| {
        l.status.as_ref().is_some_and(|s| s.successor.is_some())
    })
    .await
}

/// Let `user` do in `ns` what the controller does (the chart's rules), lock status
/// writes only if `status_writes`; and read the CRD.
async fn controller_rbac(ns: &TestNs, user: &str, status_writes: bool) {
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
    let rule = |group: &str, resource: &str, verbs: &[&str]| json!({"apiGroups": [group], "resources": [resource], "verbs": verbs});
    let mut rules = vec![
        rule("leasehold.dev", "distributedlocks", &["get", "list", "watch", "patch"]),
        rule(
            "coordination.k8s.io",
            "leases",
            &["get", "list", "watch", "patch", "delete", "deletecollection"],
        ),
        rule("", "pods", &["get", "list", "watch"]),
        rule("events.k8s.io", "events", &["create", "patch"]),
    ];
    if status_writes {
        rules.push(rule("leasehold.dev", "distributedlocks/status", &["update"]));
    }
    let apply = PatchParams::apply("conformance").force();
    let subjects = json!([{"kind": "User", "name": user, "apiGroup": "rbac.authorization.k8s.io"}]);
    let role: Role = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "conf-controller"}, "rules": rules,
    }))
    .unwrap();
    let binding: RoleBinding = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "conf-controller"}, "subjects": subjects,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "conf-controller"},
    }))
    .unwrap();
    // The CRD is read cluster-wide (until it is established).
    let crd_reader: ClusterRole = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "conf-controller-crd"},
        "rules": [rule("apiextensions.k8s.io", "customresourcedefinitions", &["get", "list", "watch"])],
    }))
    .unwrap();
    let crd_binding: ClusterRoleBinding = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": user}, "subjects": subjects,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "conf-controller-crd"},
    }))
    .unwrap();
    Api::<ClusterRole>::all(ns.client.clone())
        .patch("conf-controller-crd", &apply, &Patch::Apply(&crd_reader))
        .await
        .unwrap();
    Api::<ClusterRoleBinding>::all(ns.client.clone())
        .patch(user, &apply, &Patch::Apply(&crd_binding))
        .await
        .unwrap();
    Api::<Role>::namespaced(ns.client.clone(), &ns.name)
        .patch("conf-controller", &apply, &Patch::Apply(&role))
        .await
        .unwrap();
    Api::<RoleBinding>::namespaced(ns.client.clone(), &ns.name)
        .patch("conf-controller", &apply, &Patch::Apply(&binding))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_designated_waiter_takes_the_grant_written_on_its_claim_while_the_status_cannot_be_written() {
    for kind in kinds() {
        let ns = TestNs::new("conf-claimgrant").await;
        // One slot, held by a raw claim made without a release hash (released by the
        // mark "true"): the status records no hash for it, so its mark is no handover
        // (`protocol::handover`) and only the controller's grant can tell the waiter. (A
        // semaphore's successor granted beside other holders is told by the status
        // write alone.)
        ns.lock("l", lock_spec(15, 1, None)).await;
        // A controller acting as a user with the chart's rules, in the test namespace.
        let user = format!("conf-controller-{}", ns.name);
        controller_rbac(&ns, &user, true).await;
        let _controller = crate::support::spawn_controller_with(
            crate::support::client_as(&user).await,
            leasehold::controller::Options::single(&user, Some(&ns.name)),
        );
        let config = client_kubeconfig(&ns, None).await;
        let holder_claim = crate::support::claim(&ns, "l", &ns.pod("holder").await, 15).await;
        let renewing = crate::support::keep_renewing(&ns, &holder_claim, Duration::from_secs(2));
        let held = ns
            .wait_lock("l", "the raw claim holds", |l| holders(l) == ["holder"])
            .await;
        let token = held.status.unwrap().holders[0].fencing_token;
        let mut waiter = Driven::start(kind, &config, "l", &ns.pod("waiter").await).await;
        waiter.send("acquire").await;
        let designated = designated(&ns).await;
        let status = designated.status.clone().unwrap();
        let successor = status.successor.clone().unwrap();
        assert!(status.release_url.is_none(), "no URL: no HTTP grant");
        // From now on the controller cannot write the lock's status: a grant can reach
        // the waiter only on its claim.
        controller_rbac(&ns, &user, false).await;
        let sar_says = || async {
            let review: k8s_openapi::api::authorization::v1::SubjectAccessReview = serde_json::from_value(json!({
                "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                "spec": {"user": user, "resourceAttributes": {
                    "namespace": ns.name, "verb": "update", "group": "leasehold.dev",
                    "resource": "distributedlocks", "subresource": "status"}},
            }))
            .unwrap();
            let api: Api<k8s_openapi::api::authorization::v1::SubjectAccessReview> = Api::all(ns.client.clone());
            let answer = api.create(&Default::default(), &review).await.ok()?;
            (!answer.status?.allowed).then_some(())
        };
        wait_for("status writes forbidden to the controller", DEADLINE, sar_says).await;
        renewing.abort();
        crate::support::release(&ns, &holder_claim).await;
        let (_, next, claim) = waiter.acquired(DEADLINE).await;
        assert_eq!(
            (next, claim.as_str()),
            (successor.fencing_token, successor.claim.as_str()),
            "{kind:?}"
        );
        assert!(next > token);
        // Nothing recorded the grant: the status still names the old holder alone.
        let now = ns.locks().get("l").await.unwrap().status.unwrap();
        let recorded: Vec<&str> = now.holders.iter().map(|h| h.claim.as_str()).collect();
        assert_eq!(
            recorded,
            [holder_claim.as_str()],
            "{kind:?}: the status was written after all"
        );
        let lease = Api::<Lease>::namespaced(ns.client.clone(), &ns.name)
            .get(&claim)
            .await
            .unwrap();
        let written = &lease.annotations()[leasehold::protocol::DIRECT_GRANT_ANNOTATION];
        let grant = Grant {
            namespace: &ns.name,
            lock: "l",
            lock_uid: designated.metadata.uid.as_deref().unwrap(),
            claim: &claim,
            fencing_token: next,
        };
        assert!(grant.told_by_annotation(status.grant_key.as_deref().unwrap(), written));
        // Status writes allowed again: the grant is recorded, and the waiter releases.
        controller_rbac(&ns, &user, true).await;
        ns.wait_lock("l", "the grant recorded", |l| {
            l.status
                .as_ref()
                .is_some_and(|s| s.holders.iter().any(|h| h.claim == claim))
        })
        .await;
        waiter.release().await;
        let bindings: Api<k8s_openapi::api::rbac::v1::ClusterRoleBinding> = Api::all(ns.client.clone());
        bindings.delete(&user, &Default::default()).await.unwrap();
    }
}

#[tokio::test]
async fn a_client_that_may_not_watch_leases_takes_its_ask_back_and_is_granted_by_the_status() {
    use leasehold::protocol::{DIRECT_GRANT_ANNOTATION, GRANT_WATCH_ANNOTATION};
    for kind in kinds() {
        let ns = TestNs::new("conf-nowatch").await;
        let _controller = spawn_controller(&ns, "conf-nowatch"); // no URL
        ns.lock("l", lock_spec(15, 1, None)).await;
        let config = client_kubeconfig(&ns, None).await;
        // The lock users' Role without `watch` on Leases (clientRbac.watchClaims: false).
        let rules = json!({"rules": [
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create", "patch"]},
            {"apiGroups": ["leasehold.dev"], "resources": ["distributedlocks"], "verbs": ["get", "list", "watch"]},
        ]});
        Api::<k8s_openapi::api::rbac::v1::Role>::namespaced(ns.client.clone(), &ns.name)
            .patch("leasehold-client", &PatchParams::default(), &Patch::Merge(&rules))
            .await
            .unwrap();
        let (mut holder, (token, _), mut waiter) = holder_and_waiter(kind, &ns, (&config, &config)).await;
        waiter.send("acquire").await;
        let designated = designated(&ns).await;
        let claim = designated.status.unwrap().successor.unwrap().claim;
        let leases = Api::<Lease>::namespaced(ns.client.clone(), &ns.name);
        wait_for("the ask for a grant on the claim taken back", DEADLINE, || async {
            let lease = leases.get(&claim).await.ok()?;
            (!lease.annotations().contains_key(GRANT_WATCH_ANNOTATION)).then_some(())
        })
        .await;
        holder.release().await;
        let (_, next, granted) = waiter.acquired(DEADLINE).await;
        assert_eq!(granted, claim, "{kind:?}");
        assert!(next > token);
        let lease = leases.get(&claim).await.unwrap();
        assert!(
            !lease.annotations().contains_key(DIRECT_GRANT_ANNOTATION),
            "{kind:?}: the controller wrote a grant nobody could watch"
        );
        waiter.release().await;
    }
}

#[tokio::test]
async fn a_successor_that_takes_the_holders_mark_itself_is_written_no_grant_on_its_claim() {
    use leasehold::protocol::{DIRECT_GRANT_ANNOTATION, HANDOVER_WATCH_ANNOTATION};
    for kind in kinds() {
        let ns = TestNs::new("conf-handover").await;
        let _controller = spawn_controller(&ns, "conf-handover"); // no URL
        ns.lock("l", lock_spec(15, 1, None)).await;
        let config = client_kubeconfig(&ns, None).await;
        let (mut holder, (token, _), mut waiter) = holder_and_waiter(kind, &ns, (&config, &config)).await;
        waiter.send("acquire").await;
        let successor = designated(&ns).await.status.unwrap().successor.unwrap();
        let leases = Api::<Lease>::namespaced(ns.client.clone(), &ns.name);
        let watches = leases
            .get(&successor.claim)
            .await
            .unwrap()
            .annotations()
            .get(HANDOVER_WATCH_ANNOTATION)
            .cloned();
        // The Rust client watches the holder's claim for the handover; the Python client
        // does not (the protocol says MAY), and is written its grant on its claim.
        assert_eq!(watches.as_deref(), (kind == Kind::Rust).then_some("true"), "{kind:?}");
        holder.release().await;
        let (_, next, granted) = waiter.acquired(DEADLINE).await;
        assert_eq!(
            (granted.as_str(), next),
            (successor.claim.as_str(), successor.fencing_token),
            "{kind:?}"
        );
        assert!(next > token);
        // The grant on the claim is sent before the status write that records the grant.
        ns.wait_lock("l", "the grant recorded", |l| {
            l.status
                .as_ref()
                .is_some_and(|s| s.holders.iter().any(|h| h.claim == granted))
        })
        .await;
        let written = || async {
            leases
                .get(&granted)
                .await
                .unwrap()
                .annotations()
                .contains_key(DIRECT_GRANT_ANNOTATION)
        };
        if kind == Kind::Rust {
            assert!(
                !written().await,
                "a grant written on the claim of a successor that took the holder's mark"
            );
        } else {
            wait_for("the grant written on the claim", DEADLINE, || async {
                written().await.then_some(())
            })
            .await;
        }
        waiter.release().await;
    }
}

#[tokio::test]
async fn a_holder_that_stops_renewing_stops_before_the_next_grant() {
    for kind in kinds() {
        let ns = TestNs::new("conf-silent").await;
        let _controller = spawn_controller(&ns, "conf-silent");
        ns.lock("l", lock_spec(3, 1, None)).await;
        let dir = std::env::temp_dir().join(format!("leasehold-conformance-{}", ns.name));
        std::fs::create_dir_all(&dir).unwrap();
        let (proxy, proxied) = crate::support::proxied_kubeconfig(&dir).await;
        let holder_config = client_kubeconfig(&ns, Some(&proxied)).await;
        let config = client_kubeconfig(&ns, None).await;
        let (mut holder, (token, _), mut waiter) = holder_and_waiter(kind, &ns, (&holder_config, &config)).await;
        waiter.send("acquire").await;
        ns.wait_lock("l", "the waiter queued", |l| queue(l).len() == 1).await;
        // The holder's every connection hangs from now on: no renewal, no watch event.
        proxy.black_hole();
        let (lost_at, lost) = holder.expect("lost", DEADLINE).await;
        assert_eq!(lost["reason"], "RenewalsFailed", "{kind:?}: {lost}");
        assert_eq!(lost["token"], token);
        let (granted_at, next, _) = waiter.acquired(DEADLINE).await;
        assert!(next > token);
        assert!(
            lost_at < granted_at,
            "{kind:?}: the silent holder stopped {:?} after the next grant",
            lost_at.duration_since(granted_at)
        );
        waiter.release().await;
        proxy.restore();
    }
}

#[tokio::test]
async fn a_waiter_whose_grant_lapsed_unseen_claims_anew() {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    for kind in kinds() {
        let ns = TestNs::new("conf-lapse").await;
        let _controller = spawn_controller(&ns, "conf-lapse");
        // A one-second lease: a grant not renewed is expired three seconds after it.
        ns.lock("l", lock_spec(1, 1, None)).await;
        let config = client_kubeconfig(&ns, None).await;
        let (mut holder, (token, _), mut waiter) = holder_and_waiter(kind, &ns, (&config, &config)).await;
        waiter.send("acquire").await;
        let lock = ns.wait_lock("l", "the waiter queued", |l| queue(l).len() == 1).await;
        let lapsed = lock.status.unwrap().queue[0].claim.clone();
        // The waiter's process is paused (a frozen container, a long pause): its grant
        // comes and expires unseen, the status events wait in its socket.
        let pid = Pid::from_raw(waiter.child.id().unwrap() as i32);
        kill(pid, Signal::SIGSTOP).unwrap();
        holder.release().await;
        ns.wait_lock("l", "the unseen grant expired", |l| {
            holders(l).is_empty() && queue(l).is_empty() && l.status.as_ref().is_some_and(|s| s.fencing_token > token)
        })
        .await;
        kill(pid, Signal::SIGCONT).unwrap();
        // It reads its grant late, finds its claim gone as it renews before acting, and
        // waits on with a new claim: never acted on, never an error.
        let (_, next, claim) = waiter.acquired(DEADLINE).await;
        assert_ne!(claim, lapsed, "{kind:?} acted on the grant that had lapsed");
        assert!(
            next > token + 1,
            "{kind:?}: token {next} after the lapsed grant's {}",
            token + 1
        );
        waiter.release().await;
    }
}

#[tokio::test]
async fn a_waiter_paused_before_any_status_placed_it_claims_anew_not_collected() {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    for kind in kinds() {
        let ns = TestNs::new("conf-unread").await;
        let controller = spawn_controller(&ns, "conf-unread");
        ns.lock("l", lock_spec(1, 1, None)).await;
        let config = client_kubeconfig(&ns, None).await;
        let (mut holder, (token, held), mut waiter) = holder_and_waiter(kind, &ns, (&config, &config)).await;
        // No controller while the waiter claims: no status places its claim before the
        // waiter's process is paused (a frozen container), so it has read none.
        controller.stop().await;
        waiter.send("acquire").await;
        let unread = wait_for("the waiter's claim", DEADLINE, || async {
            claims(&ns, "l")
                .await
                .into_iter()
                .map(|l| l.name_any())
                .find(|c| *c != held)
        })
        .await;
        let pid = Pid::from_raw(waiter.child.id().unwrap() as i32);
        kill(pid, Signal::SIGSTOP).unwrap();
        let paused_at = tokio::time::Instant::now();
        let _controller = spawn_controller(&ns, "conf-unread");
        holder.release().await;
        // Placed, granted and expired unseen, its statuses waiting in its socket...
        ns.wait_lock("l", "the unseen grant expired", |l| {
            holders(l).is_empty() && queue(l).is_empty() && l.status.as_ref().is_some_and(|s| s.fencing_token > token)
        })
        .await;
        // ...and paused past the time at which an unplaced claim is read back: the
        // length of the pause is the case, not a synchronisation.
        tokio::time::sleep_until(paused_at + leasehold::client::UNQUEUED_NOTICE).await;
        kill(pid, Signal::SIGCONT).unwrap();
        // Its claim is gone and no status it read placed it: not a claim collected for
        // naming no pod (this pod exists), so it waits on with a new claim.
        let (_, next, claim) = waiter.acquired(DEADLINE).await;
        assert_ne!(claim, unread, "{kind:?} acted on the grant that had lapsed");
        assert!(next > token + 1, "{kind:?}: token {next} after the lapsed grant's");
        waiter.release().await;
    }
}

#[tokio::test]
async fn a_claim_tampered_with_before_it_was_recorded_is_withdrawn_never_acted_on() {
    for kind in kinds() {
        let ns = TestNs::new("conf-tamper").await;
        // A short lease: the controller may grant the tampered claim (its owner's
        // withdrawal does not open the forged hash) and expires it one lease later.
        ns.lock("l", lock_spec(3, 1, None)).await;
        let config = client_kubeconfig(&ns, None).await;
        let mut client = Driven::start(kind, &config, "l", &ns.pod("p").await).await;
        // No controller yet: the claim waits unrecorded, and a neighbour swaps its
        // release hash for one whose secret it knows.
        client.send("acquire").await;
        let tampered = wait_for("the claim", DEADLINE, || async { claims(&ns, "l").await.pop() }).await;
        let tampered = tampered.name_any();
        let forged = leasehold::protocol::release::hash_of("the neighbour's secret");
        let patch = json!({ "metadata": { "annotations": { "leasehold.dev/release-hash": forged } } });
        Api::<Lease>::namespaced(ns.client.clone(), &ns.name)
            .patch(&tampered, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
        let _controller = spawn_controller(&ns, "conf-tamper");
        let (_, _, claim) = client.acquired(DEADLINE).await;
        assert_ne!(
            claim, tampered,
            "{kind:?} acted on the claim recorded with another release hash"
        );
        let lock = ns.recorded("l", &claim).await;
        let held: Vec<_> = lock.status.unwrap().holders.into_iter().map(|h| h.claim).collect();
        assert_eq!(held, vec![claim.clone()]);
        client.release().await;
    }
}

/// A controller stand-in answering one wait for a direct grant at `/v1/grant` with a
/// 200, token `token` and `signature`; sends the request line and body it got.
async fn grant_answering(token: i64, signature: String) -> (String, tokio::sync::oneshot::Receiver<String>) {
    use tokio::io::AsyncReadExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (mut conn, _) = listener.accept().await.unwrap();
        let mut buf = [0u8; 4096];
        // A client probes the URL first (a connect, nothing sent): skip such connections.
        let (mut conn, got) = loop {
            let mut got = Vec::new();
            while !String::from_utf8_lossy(&got).contains('}') {
                match conn.read(&mut buf).await {
                    Ok(n) if n > 0 => got.extend_from_slice(&buf[..n]),
                    _ => break,
                }
            }
            if String::from_utf8_lossy(&got).contains('}') {
                break (conn, got);
            }
            conn = listener.accept().await.unwrap().0;
        };
        let reply = format!(
            "HTTP/1.1 200 OK\r\nleasehold-fencing-token: {token}\r\nleasehold-grant-signature: {signature}\r\ncontent-length: 0\r\n\r\n"
        );
        conn.write_all(reply.as_bytes()).await.unwrap();
        // The client has read the answer once it closes the connection.
        let _ = conn.read(&mut buf).await;
        let _ = tx.send(String::from_utf8_lossy(&got).into_owned());
        // Later connections (a release notice) are refused: the client then marks.
    });
    (url, rx)
}

/// Write `lock`'s status as a controller would to designate `claim` (queued, as its
/// process wrote it) with `token`, publishing `url` and `key`; `holding` lists it as a
/// holder instead.
async fn designate(
    ns: &TestNs,
    lock: &DistributedLock,
    claim: &Lease,
    (token, url, key): (i64, &str, &str),
    holding: bool,
) {
    let a = |k: &str| claim.annotations().get(k).cloned();
    let pod = claim.spec.as_ref().unwrap().holder_identity.clone().unwrap();
    let entry = json!({
        "claim": claim.name_any(), "pod": pod, "podUID": a("leasehold.dev/pod-uid"),
        "releaseHash": a("leasehold.dev/release-hash"), "leaseDurationSeconds": 15,
    });
    let mut status = json!({
        "holders": [], "queue": [], "queueLength": 0, "fencingToken": token,
        "releaseUrl": url, "grantKey": key,
    });
    if holding {
        let mut holder = entry.clone();
        holder["fencingToken"] = token.into();
        holder["grantedAt"] = "2026-01-01T00:00:00Z".into();
        status["holders"] = json!([holder]);
    } else {
        let mut waiter = entry.clone();
        waiter["waitHash"] = a("leasehold.dev/wait-hash").into();
        waiter["requestedAt"] = "2026-01-01T00:00:00Z".into();
        status["queue"] = json!([waiter]);
        status["queueLength"] = 1.into();
        status["successor"] = json!({ "claim": claim.name_any(), "fencingToken": token, "leaseDurationSeconds": 15 });
        // Another claim holds the slot the successor waits for.
        status["holders"] = json!([{
            "claim": "other-000000000000", "pod": "other", "podUID": "u", "fencingToken": token - 1,
            "grantedAt": "2026-01-01T00:00:00Z", "leaseDurationSeconds": 15,
        }]);
    }
    let patch = json!({ "status": status });
    ns.locks()
        .patch_status(&lock.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("write the designation");
}

#[tokio::test]
async fn a_direct_grant_is_taken_only_with_the_lock_s_signature() {
    for kind in kinds() {
        for forged in [true, false] {
            // No controller: the test writes the status and answers the wait itself.
            let ns = TestNs::new("conf-direct").await;
            let lock = ns.lock("l", lock_spec(15, 1, None)).await;
            let config = client_kubeconfig(&ns, None).await;
            let mut client = Driven::start(kind, &config, "l", &ns.pod("p").await).await;
            client.send("acquire").await;
            let claim = wait_for("the claim", DEADLINE, || async { claims(&ns, "l").await.pop() }).await;
            let (key, signer) = (GrantKey::generate(), GrantKey::generate());
            let token = 42;
            let grant = Grant {
                namespace: &ns.name,
                lock: "l",
                lock_uid: &lock.uid().unwrap(),
                claim: &claim.name_any(),
                fencing_token: token,
            };
            let signature = if forged { signer.sign(&grant) } else { key.sign(&grant) };
            let (url, waited) = grant_answering(token, signature).await;
            designate(&ns, &lock, &claim, (token, &url, &key.public()), false).await;
            let request = tokio::time::timeout(DEADLINE, waited)
                .await
                .expect("the designated client waits at /v1/grant")
                .unwrap();
            assert!(request.starts_with("POST /v1/grant HTTP/1.1"), "{kind:?}: {request}");
            let proof_hash = claim.annotations()["leasehold.dev/wait-hash"].clone();
            let body: Value = serde_json::from_str(&request[request.find('{').unwrap()..]).unwrap();
            assert_eq!(
                leasehold::protocol::release::hash_of(body["proof"].as_str().unwrap()),
                proof_hash,
                "{kind:?} shows the wait proof its claim's hash opens"
            );
            if forged {
                // The client has read the forged answer: it must not act on it (a grant
                // it takes is answered within milliseconds); then the status grants it.
                let early = tokio::time::timeout(Duration::from_secs(2), client.answers.recv()).await;
                assert!(
                    early.is_err(),
                    "{kind:?} acted on a direct grant signed by another key: {early:?}"
                );
                designate(&ns, &lock, &claim, (token, &url, &key.public()), true).await;
                let (_, got, _) = client.acquired(DEADLINE).await;
                assert_eq!(got, token);
            } else {
                let (_, got, name) = client.acquired(DEADLINE).await;
                assert_eq!((got, name), (token, claim.name_any()), "{kind:?}");
                let status = ns.locks().get("l").await.unwrap().status.unwrap();
                assert!(
                    status.holders.iter().all(|h| h.claim != claim.name_any()),
                    "granted directly"
                );
            }
            client.release().await;
        }
    }
}

#[tokio::test]
async fn refused_claims_say_why() {
    for kind in kinds() {
        let ns = TestNs::new("conf-refused").await;
        let _controller = spawn_controller(&ns, "conf-refused");
        ns.lock("l", lock_spec(15, 1, Some(1))).await;
        let config = client_kubeconfig(&ns, None).await;
        let mut holder = Driven::start(kind, &config, "l", &ns.pod("holder").await).await;
        let mut waiter = Driven::start(kind, &config, "l", &ns.pod("waiter").await).await;
        let mut third = Driven::start(kind, &config, "l", &ns.pod("third").await).await;
        holder.send("acquire").await;
        holder.acquired(DEADLINE).await;
        waiter.send("acquire").await;
        ns.wait_lock("l", "the waiter queued", |l| queue(l).len() == 1).await;
        third.send("acquire").await;
        let (_, refused) = third.expect("refused", DEADLINE).await;
        assert_eq!(refused["reason"], "QueueFull", "{kind:?}: {refused}");
        // A process that names a pod that does not exist.
        let ghost = PodIdentity {
            name: "ghost".into(),
            namespace: ns.name.clone(),
            uid: "00000000-0000-0000-0000-000000000000".into(),
        };
        let mut ghost = Driven::start(kind, &config, "l", &ghost).await;
        holder.release().await;
        waiter.acquired(DEADLINE).await;
        ghost.send("acquire").await;
        let (_, answer) = ghost.next(DEADLINE).await;
        let reason = answer["reason"].as_str().unwrap_or_default();
        assert!(
            (answer["event"] == "refused" && reason == "PodNotFound") || answer["event"] == "collected",
            "{kind:?}: {answer}"
        );
        waiter.release().await;
    }
}

#[tokio::test]
async fn try_reentrancy_and_max_holders_alike() {
    for kind in kinds() {
        let ns = TestNs::new("conf-try").await;
        let _controller = spawn_controller(&ns, "conf-try");
        let config = client_kubeconfig(&ns, None).await;
        let mut a = Driven::start(kind, &config, "l", &ns.pod("a").await).await;
        a.send("try").await;
        a.expect("no-such-lock", DEADLINE).await;
        ns.lock("l", lock_spec(15, 2, None)).await;
        let mut b = Driven::start(kind, &config, "l", &ns.pod("b").await).await;
        let mut c = Driven::start(kind, &config, "l", &ns.pod("c").await).await;
        a.send("acquire").await;
        let (_, ta, claim) = a.acquired(DEADLINE).await;
        b.send("acquire").await;
        let (_, tb, _) = b.acquired(DEADLINE).await;
        assert!(tb > ta, "two holders of a lock of maxHolders 2, tokens rising");
        c.send("try").await;
        c.expect("busy", DEADLINE).await;
        a.send("acquire").await;
        let (_, again, same) = a.acquired(DEADLINE).await;
        assert_eq!(
            (again, same),
            (ta, claim),
            "{kind:?}: reentrant acquire shares the grant"
        );
        a.send("release").await;
        a.expect("released", DEADLINE).await;
        c.send("try").await;
        c.expect("busy", DEADLINE).await;
        a.release().await;
        c.send("try").await;
        let (_, tc, _) = c.acquired(DEADLINE).await;
        assert!(tc > tb);
        c.send("acquire-timeout 1").await;
        let (_, depth) = c.expect("acquired", DEADLINE).await;
        assert_eq!(depth["depth"], 2);
        a.send("acquire-timeout 1.5").await;
        a.expect("timeout", DEADLINE).await;
        b.release().await;
        c.release().await;
        c.release().await;
    }
}

/// How long the mixed soak runs (`LEASEHOLD_CONFORMANCE_SOAK_SECONDS`, default 20).
fn soak_seconds() -> u64 {
    std::env::var("LEASEHOLD_CONFORMANCE_SOAK_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20)
}

#[tokio::test]
async fn a_soak_of_both_languages_contending_shows_no_overlap() {
    let ns = TestNs::new("conf-soak").await;
    let (_addr, _controller) = controller_taking_notices(&ns, "conf-soak").await;
    ns.lock("l", lock_spec(5, 1, None)).await;
    let config = client_kubeconfig(&ns, None).await;
    let kinds = [Kind::Rust, Kind::Python, Kind::Rust, Kind::PythonAsyncio].map(or_tested);
    let (tx, mut turns) = mpsc::unbounded_channel::<(Kind, String, Instant, Instant, i64)>();
    let until = Instant::now() + Duration::from_secs(soak_seconds());
    let mut tasks = Vec::new();
    for (i, kind) in kinds.into_iter().enumerate() {
        let pod = ns.pod(&format!("p{i}")).await;
        let mut client = Driven::start(kind, &config, "l", &pod).await;
        let tx = tx.clone();
        tasks.push(tokio::spawn(async move {
            while Instant::now() < until {
                client.send("acquire").await;
                let (at, token, _) = client.acquired(Duration::from_secs(60)).await;
                // The section: from the grant's answer to the release's command, both
                // inside the client's own hold.
                tokio::task::yield_now().await;
                let released = client.release().await;
                tx.send((kind, client.pod.clone(), at, released, token)).unwrap();
            }
        }));
    }
    drop(tx);
    for t in tasks {
        t.await.unwrap();
    }
    let mut all = Vec::new();
    while let Some(turn) = turns.recv().await {
        all.push(turn);
    }
    all.sort_by_key(|t| t.2);
    for pair in all.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        assert!(
            b.2 > a.3,
            "{} (token {}) started before {} (token {}) ended",
            b.1,
            b.4,
            a.1,
            a.4
        );
        assert!(b.4 > a.4, "tokens in grant order: {} then {}", a.4, b.4);
    }
    for kind in kinds {
        let n = all.iter().filter(|t| t.0 == kind).count();
        assert!(n >= 2, "{kind:?} clients had {n} turns");
    }
    eprintln!(
        "soak: {} turns in {} s, {} Rust, {} Python, 0 overlaps",
        all.len(),
        soak_seconds(),
        all.iter().filter(|t| t.0 == Kind::Rust).count(),
        all.iter().filter(|t| t.0 != Kind::Rust).count()
    );
}

#[tokio::test]
async fn the_python_example_takes_its_turn_and_writes_with_its_token() {
    let ns = TestNs::new("conf-example").await;
    let _controller = spawn_controller(&ns, "conf-example");
    ns.lock("my-lock", lock_spec(15, 1, None)).await;
    let config = client_kubeconfig(&ns, None).await;
    let pod = ns.pod("job").await;
    let python = std::env::var("LEASEHOLD_PYTHON").unwrap_or_else(|_| "python3".into());
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/clients/python/examples/fenced_job.py");
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        Command::new(python)
            .args([example, "my-lock"])
            .env("KUBECONFIG", &config)
            .env("POD_NAME", &pod.name)
            .env("POD_NAMESPACE", &pod.namespace)
            .env("POD_UID", &pod.uid)
            .output(),
    )
    .await
    .expect("the example ends")
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    // Every message carries the example's whole output: its stderr has the client's log.
    let said = format!(
        "{}\n--- stdout:\n{stdout}\n--- stderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{said}");
    let status = ns.locks().get("my-lock").await.unwrap().status.unwrap();
    let token = status.fencing_token;
    assert!(
        stdout.contains(&format!("granted my-lock with token {token}")),
        "the status's token is {token}, status {status:?}: {said}"
    );
    assert_eq!(
        stdout.matches(&format!("written with fencing token {token}")).count(),
        5,
        "{said}"
    );
    assert!(stdout.trim_end().ends_with("released"), "{said}");
}
