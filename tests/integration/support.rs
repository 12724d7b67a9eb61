//! Test support: one real control plane per test binary, a namespace per test,
//! Pods standing for in-pod clients, and an in-process controller.

use std::path::{Path, PathBuf};

use leasehold::testing::proxy::Proxy;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use leasehold::api::{DistributedLock, DistributedLockSpec};
use leasehold::protocol::claim::PodIdentity;

/// The leasehold binary under test.
pub const LEASEHOLD: &str = env!("CARGO_BIN_EXE_leasehold");
/// Default deadline for waiting on a condition.
pub const DEADLINE: Duration = Duration::from_secs(30);

static SHARED: OnceLock<PathBuf> = OnceLock::new();

/// The kubeconfig of this test binary's control plane, started on first use.
pub fn kubeconfig() -> &'static PathBuf {
    SHARED.get_or_init(|| {
        leasehold::testing::spawn_for_process(Path::new(LEASEHOLD), Duration::from_secs(600))
            .expect("local control plane")
    })
}

/// A client for the shared control plane (one per test: clients are tied to a runtime).
pub async fn client() -> Client {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_test_writer()
        .try_init();
    leasehold::kubeconfig::client_for(kubeconfig())
        .await
        .expect("client for the local control plane")
}

/// Wait until `check` returns Some, or panic after `deadline` naming `what`.
pub async fn wait_for<T, F, Fut>(what: &str, deadline: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let end = Instant::now() + deadline;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < end, "timed out after {deadline:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A namespace of one test, with its default ServiceAccount in place.
pub struct TestNs {
    /// Admin client.
    pub client: Client,
    /// The namespace's name.
    pub name: String,
}

impl TestNs {
    /// Create `t-<prefix>-<random>` and wait for its default ServiceAccount.
    pub async fn new(prefix: &str) -> Self {
        Self::new_on(client().await, prefix).await
    }

    /// [`TestNs::new`] on the control plane `client` talks to.
    pub async fn new_on(client: Client, prefix: &str) -> Self {
        let name = format!("t-{prefix}-{:06x}", rand::random::<u32>() & 0xffffff);
        let ns: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap();
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .expect("create namespace");
        // On v1.20 the ServiceAccount admission plugin refuses pods until the tokens
        // controller has given the default ServiceAccount its token secret.
        let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), &name);
        wait_for("default ServiceAccount with its token", DEADLINE, || async {
            let sa = sas.get_opt("default").await.ok().flatten()?;
            sa.secrets.filter(|s| !s.is_empty()).map(|_| ())
        })
        .await;
        TestNs { client, name }
    }

    /// Apply `examples/rbac.yaml` (the client ServiceAccount, Role and RoleBinding every
    /// lock user has) here, and return a client acting as that ServiceAccount.
    pub async fn as_lock_user(&self) -> Client {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/rbac.yaml");
        let text = std::fs::read_to_string(path).unwrap();
        for doc in serde_norway::Deserializer::from_str(&text) {
            let obj: kube::api::DynamicObject = serde::Deserialize::deserialize(doc).unwrap();
            let gvk = kube::core::GroupVersionKind::try_from(obj.types.as_ref().unwrap()).unwrap();
            let (resource, _) = kube::discovery::pinned_kind(&self.client, &gvk).await.unwrap();
            let api: Api<kube::api::DynamicObject> = Api::namespaced_with(self.client.clone(), &self.name, &resource);
            api.create(&PostParams::default(), &obj)
                .await
                .expect("apply examples/rbac.yaml");
        }
        client_as(&format!("system:serviceaccount:{}:leasehold-client", self.name)).await
    }

    /// Apply a DistributedLock.
    pub async fn lock(&self, name: &str, spec: DistributedLockSpec) -> DistributedLock {
        let lock = DistributedLock::new(name, spec);
        self.locks()
            .create(&PostParams::default(), &lock)
            .await
            .expect("create DistributedLock")
    }

    /// The DistributedLock API of this namespace.
    pub fn locks(&self) -> Api<DistributedLock> {
        Api::namespaced(self.client.clone(), &self.name)
    }

    /// The Pod API of this namespace.
    pub fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.name)
    }

    /// Create a Pod object standing for an in-pod client (it never runs: no kubelet).
    pub async fn pod(&self, name: &str) -> PodIdentity {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "spec": {"containers": [{"name": "app", "image": "leasehold:dev"}]}
        }))
        .unwrap();
        let pod = self
            .pods()
            .create(&PostParams::default(), &pod)
            .await
            .expect("create pod");
        PodIdentity {
            name: name.into(),
            namespace: self.name.clone(),
            uid: pod.uid().unwrap(),
        }
    }

    /// Set a pod's phase through the status subresource.
    pub async fn set_phase(&self, pod: &str, phase: &str) {
        let patch = serde_json::json!({"status": {"phase": phase}});
        self.pods()
            .patch_status(pod, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("set pod phase");
    }

    /// Play the kubelet stopping a pod: report its container terminated (what a kubelet
    /// does before a graceful deletion removes the object).
    pub async fn stop_containers(&self, pod: &str) {
        let patch = serde_json::json!({"status": {"containerStatuses": [{
            "name": "app", "image": "leasehold:dev", "imageID": "", "ready": false,
            "restartCount": 0, "state": {"terminated": {"exitCode": 0}},
        }]}});
        self.pods()
            .patch_status(pod, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("report the pod's containers terminated");
    }

    /// Delete a pod (unscheduled pods go at once).
    pub async fn delete_pod(&self, pod: &str) {
        self.pods().delete(pod, &Default::default()).await.expect("delete pod");
    }

    /// Wait until the deleted lock `lock` is gone.
    pub async fn wait_gone(&self, lock: &str) {
        wait_for(&format!("the deleted lock {lock} gone"), DEADLINE, || async {
            self.locks().get_opt(lock).await.unwrap().is_none().then_some(())
        })
        .await;
    }

    /// Wait until the lock's status satisfies `pred`; return that lock.
    pub async fn wait_lock(&self, lock: &str, what: &str, pred: impl Fn(&DistributedLock) -> bool) -> DistributedLock {
        let api = self.locks();
        wait_for(what, DEADLINE, || {
            let api = api.clone();
            let pred = &pred;
            async move { api.get(lock).await.ok().filter(|l| pred(l)) }
        })
        .await
    }

    /// Lock `lock` once its status records `claim` as an unrevoked holder: a client may
    /// be granted before that status write (directly, over HTTP or on its claim).
    pub async fn recorded(&self, lock: &str, claim: &str) -> DistributedLock {
        let what = format!("the status recording {claim}'s grant");
        self.wait_lock(lock, &what, |l| {
            l.status
                .as_ref()
                .is_some_and(|s| s.holders.iter().any(|h| h.claim == claim && h.revoked.is_none()))
        })
        .await
    }
}

/// A mutex whose claims live by `lease` seconds.
pub fn spec(lease: i32) -> DistributedLockSpec {
    DistributedLockSpec {
        lease_duration_seconds: lease,
        max_holders: 1,
        backend: None,
        max_queue: None,
    }
}

/// The assumption every outage test makes, said when it does not hold: a holder that
/// renews every lease/3, retries a failed renewal within lease/12 (a quarter of that
/// interval) and stops at 3/4 of its lease after its last acknowledged renewal rides out
/// an outage shorter than 3/4 − 1/3 − 1/12 = 1/3 of its lease, for sure. `took` is the
/// outage as measured (down time plus the component's start on this machine): when it
/// is longer, the machine is too slow for the test, which says so rather than blame
/// the product.
pub fn assume_rides_out(what: &str, took: Duration, lease: i32) {
    let bound = Duration::from_secs(lease as u64) / 3;
    assert!(
        took < bound,
        "this machine is too slow for the test's assumption, not the product: the {what} \
         outage took {took:?}, and a holder with a {lease} s lease rides out only {bound:?} for sure"
    );
    eprintln!("{what} outage: {took:?} (a {lease} s lease rides out {bound:?})");
}

/// A loopback port nothing listens on now.
pub fn free_port() -> u16 {
    let sock = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    sock.local_addr().unwrap().port()
}

/// Run a controller in this process (no leader election, no HTTP) watching only the
/// test's namespace, until stopped.
pub fn spawn_controller(ns: &TestNs, identity: &str) -> Running {
    spawn_controller_with(
        ns.client.clone(),
        leasehold::controller::Options::single(identity, Some(&ns.name)),
    )
}

/// Run a controller with these options until stopped.
pub fn spawn_controller_with(client: Client, opts: leasehold::controller::Options) -> Running {
    let identity = opts.identity.clone();
    let task = tokio::spawn(async move {
        if let Err(e) = leasehold::controller::run(client, opts, std::future::pending()).await {
            eprintln!("the in-process controller failed: {e:#}");
        }
    });
    Running {
        task: Some(task),
        identity,
    }
}

/// An in-process controller. It runs until the test stops it ([`Running::stop`],
/// [`Running::abort`]); if it ends by itself (an error or a panic), the test fails when
/// this handle is dropped, so that a dead controller cannot pass a test that checks that
/// nothing happens.
pub struct Running {
    task: Option<tokio::task::JoinHandle<()>>,
    identity: String,
}

impl Running {
    /// Stop the controller now, without waiting for it to go.
    pub fn abort(&mut self) {
        if let Some(task) = self.task.take() {
            self.check_alive(&task);
            task.abort();
        }
    }

    /// Stop the controller and wait until it has gone.
    pub async fn stop(mut self) {
        if let Some(task) = self.task.take() {
            self.check_alive(&task);
            task.abort();
            let _ = task.await;
        }
    }

    /// Panic (failing the test) if the controller ended by itself.
    fn check_alive(&self, task: &tokio::task::JoinHandle<()>) {
        assert!(
            !task.is_finished(),
            "the in-process controller {} stopped before the test stopped it (its error or panic is above)",
            self.identity
        );
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            let dead = task.is_finished();
            task.abort();
            if dead && !std::thread::panicking() {
                panic!(
                    "the in-process controller {} stopped during the test (its error or panic is above)",
                    self.identity
                );
            }
        }
    }
}

/// The pods of the current holders of a lock.
pub fn holders(lock: &DistributedLock) -> Vec<String> {
    lock.status
        .as_ref()
        .map(|s| s.holders.iter().map(|h| h.pod.clone()).collect())
        .unwrap_or_default()
}

/// The pods of the queue of a lock.
pub fn queue(lock: &DistributedLock) -> Vec<String> {
    lock.status
        .as_ref()
        .map(|s| s.queue.iter().map(|w| w.pod.clone()).collect())
        .unwrap_or_default()
}

/// The claim Lease API of a namespace.
pub fn leases(ns: &TestNs) -> Api<k8s_openapi::api::coordination::v1::Lease> {
    Api::namespaced(ns.client.clone(), &ns.name)
}

/// Create a claim for `lock` from `pod` (the raw protocol); returns its name.
pub async fn claim(ns: &TestNs, lock: &str, pod: &PodIdentity, lease_secs: i32) -> String {
    let name = leasehold::protocol::claim::claim_name(lock);
    let lease = leasehold::protocol::claim::claim_lease(&name, lock, pod, lease_secs);
    leases(ns)
        .create(&PostParams::default(), &lease)
        .await
        .expect("create claim");
    name
}

/// Mark a claim released (the raw protocol).
pub async fn release(ns: &TestNs, claim: &str) {
    let patch = Patch::Merge(leasehold::protocol::claim::release_patch());
    leases(ns)
        .patch(claim, &PatchParams::default(), &patch)
        .await
        .expect("release claim");
}

/// Renew a claim every `every` until the task is aborted or the claim is gone (what a
/// live client does). A failed renewal is retried at the next beat, as a client does
/// within its deadline: a transient API error must not look like a holder that stopped.
pub fn keep_renewing(ns: &TestNs, claim: &str, every: Duration) -> tokio::task::JoinHandle<()> {
    let (api, claim) = (leases(ns), claim.to_string());
    tokio::spawn(async move {
        loop {
            let patch = Patch::Merge(leasehold::protocol::claim::renew_patch(None));
            match api.patch(&claim, &PatchParams::default(), &patch).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => return,
                Err(e) => eprintln!("keep_renewing {claim}: {e} (retried at the next beat)"),
            }
            tokio::time::sleep(every).await;
        }
    })
}

/// The fencing tokens of the current holders, counted from the lock's epoch (so the
/// first grant is 1).
pub fn tokens(lock: &DistributedLock) -> Vec<i64> {
    lock.status
        .as_ref()
        .map(|s| s.holders.iter().map(|h| h.fencing_token - epoch(lock)).collect())
        .unwrap_or_default()
}

/// The epoch the lock's fencing tokens count from.
pub fn epoch(lock: &DistributedLock) -> i64 {
    lock.status.as_ref().and_then(|s| s.fencing_token_epoch).unwrap_or(0)
}

/// The last fencing token issued, counted from the lock's epoch.
pub fn last_token(lock: &DistributedLock) -> i64 {
    lock.status.as_ref().map_or(0, |s| s.fencing_token) - epoch(lock)
}

/// The last fencing token granted to a holder, counted from the lock's epoch: unlike
/// `status.fencingToken`, it leaves out the token reserved for the successor, who is
/// also counted in the queue.
pub fn last_granted(lock: &DistributedLock) -> i64 {
    let reserved = lock
        .status
        .as_ref()
        .and_then(|s| s.successor.as_ref())
        .map(|s| s.fencing_token);
    let last = lock.status.as_ref().map_or(0, |s| s.fencing_token);
    last - i64::from(reserved == Some(last)) - epoch(lock)
}

/// Reasons of the Kubernetes events about `object` in the namespace.
pub async fn event_reasons(ns: &TestNs, object: &str) -> Vec<String> {
    events(ns, object).await.into_iter().map(|(reason, _)| reason).collect()
}

/// The Kubernetes events about `object` in the namespace: (reason, note).
pub async fn events(ns: &TestNs, object: &str) -> Vec<(String, String)> {
    let api: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(ns.client.clone(), &ns.name);
    let list = api.list(&Default::default()).await.expect("list events");
    list.items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(object))
        .filter_map(|e| Some((e.reason?, e.note.unwrap_or_default())))
        .collect()
}

/// Wait until `object` has an event with `reason`: the controller publishes events
/// after the status write they follow, so a test that saw the status waits for them.
pub async fn wait_event(ns: &TestNs, object: &str, reason: &str) {
    wait_for(&format!("a {reason} event on {object}"), DEADLINE, || async {
        event_reasons(ns, object)
            .await
            .iter()
            .any(|r| r == reason)
            .then_some(())
    })
    .await;
}

/// A client for the shared control plane that impersonates `user` (RBAC checks).
pub async fn client_as(user: &str) -> Client {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig()).unwrap();
    let mut config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    config.auth_info.impersonate = Some(user.into());
    Client::try_from(config).unwrap()
}

/// Whether an API result is a 403 Forbidden.
pub fn forbidden<T: std::fmt::Debug>(r: Result<T, kube::Error>) -> bool {
    matches!(r, Err(kube::Error::Api(s)) if s.code == 403)
}

/// Pods `p0..pn` each make a claim (lease 120 s) for `lock`, each seen by the
/// controller before the next is made, so arrival order is p0, p1, ...; returns the claims.
pub async fn claims_in_order(ns: &TestNs, lock: &str, n: usize) -> Vec<String> {
    let mut claims = Vec::new();
    for i in 0..n {
        let pod = ns.pod(&format!("p{i}")).await;
        claims.push(claim(ns, lock, &pod, 120).await);
        ns.wait_lock(lock, "claim seen", |l| holders(l).len() + queue(l).len() == i + 1)
            .await;
    }
    claims
}

/// A kubeconfig in `dir` whose server is a new proxy in front of the shared API server.
pub async fn proxied_kubeconfig(dir: &Path) -> (Proxy, PathBuf) {
    let port = leasehold::testing::proxy::api_port(kubeconfig()).unwrap();
    let proxy = Proxy::start(port).await;
    let proxied = dir.join(format!("kubeconfig-{}", proxy.port));
    proxy.kubeconfig(kubeconfig(), &proxied).unwrap();
    (proxy, proxied)
}

/// A client for the shared API server whose every request goes through a new proxy the
/// test controls (its kubeconfig in a scratch directory named after `name`).
pub async fn proxied_client(name: &str) -> (Proxy, Client) {
    let (proxy, proxied) = proxied_kubeconfig_named(name).await;
    (proxy, leasehold::kubeconfig::client_for(&proxied).await.unwrap())
}

/// [`proxied_client`], built as a lock client's reads and watches are
/// (`kubeconfig::watch_client_from`: HTTP/2 with PINGs).
pub async fn proxied_watch_client(name: &str) -> (Proxy, Client) {
    let (proxy, proxied) = proxied_kubeconfig_named(name).await;
    (proxy, leasehold::kubeconfig::watch_client_for(&proxied).await.unwrap())
}

/// [`proxied_kubeconfig`] in a scratch directory named after `name`.
async fn proxied_kubeconfig_named(name: &str) -> (Proxy, PathBuf) {
    let dir = std::env::temp_dir().join(format!("leasehold-test-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    proxied_kubeconfig(&dir).await
}

/// A controller for `ns` (identity `name`) whose watches go through a proxy the test
/// can stall, while its reads and writes go direct.
pub async fn controller_with_proxied_watches(ns: &TestNs, name: &str) -> (Proxy, Running) {
    let (proxy, watches) = proxied_client(name).await;
    let client = split_client(ns.client.clone(), watches);
    let opts = leasehold::controller::Options::single(name, Some(&ns.name));
    (proxy, spawn_controller_with(client, opts))
}

/// A client that sends watch requests through `watches` and every other request
/// through `direct`: a test can then stall one controller's watches while its reads
/// and writes go through.
pub fn split_client(direct: Client, watches: Client) -> Client {
    split_client_where(direct, watches, |_| true)
}

/// A client that sends the watch requests `divert` picks (given their path) through
/// `diverted`, and every other request through `direct`.
pub fn split_client_where(direct: Client, diverted: Client, divert: fn(&str) -> bool) -> Client {
    let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let is_watch = req
            .uri()
            .query()
            .is_some_and(|q| q.split('&').any(|kv| kv == "watch=true"));
        let client = if is_watch && divert(req.uri().path()) {
            diverted.clone()
        } else {
            direct.clone()
        };
        async move { client.send(req).await }
    });
    Client::new(service, "default")
}

/// Lock `l` (lease `lease`) held by pod a's claim and waited for by pod b's, each
/// renewed every 500 ms as a live client would; returns the renewing tasks.
pub async fn live_holder_and_waiter(ns: &TestNs, lease: i32) -> [tokio::task::JoinHandle<()>; 2] {
    ns.lock(
        "l",
        DistributedLockSpec {
            lease_duration_seconds: lease,
            max_holders: 1,
            backend: None,
            max_queue: None,
        },
    )
    .await;
    let (a, b) = (ns.pod("a").await, ns.pod("b").await);
    let ca = claim(ns, "l", &a, lease).await;
    let ra = keep_renewing(ns, &ca, Duration::from_millis(500));
    ns.wait_lock("l", "a holds", |l| holders(l) == ["a"]).await;
    let cb = claim(ns, "l", &b, lease).await;
    let rb = keep_renewing(ns, &cb, Duration::from_millis(500));
    ns.wait_lock("l", "b waits", |l| queue(l) == ["b"]).await;
    [ra, rb]
}

/// For `how_long`, `check` holds for lock `l` as read every 100 ms (`None`: gone),
/// given how long into the observation it was read.
pub async fn throughout(ns: &TestNs, how_long: Duration, check: impl Fn(Option<&DistributedLock>, Duration)) {
    let (started, until) = (Instant::now(), Instant::now() + how_long);
    while Instant::now() < until {
        let l = ns.locks().get_opt("l").await.unwrap();
        check(l.as_ref(), started.elapsed());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The pods of `lock`'s holders, each with its revocation reason (if revoked).
pub fn revoked_for(lock: &DistributedLock) -> Vec<(String, Option<leasehold::api::RevokeReason>)> {
    let holders = lock.status.iter().flat_map(|s| &s.holders);
    holders
        .map(|h| (h.pod.clone(), h.revoked.as_ref().map(|r| r.reason)))
        .collect()
}

/// For `how_long`, lock `l` keeps live holder a, waiter b and its tokens, and no
/// Revoked or Dropped event appears (observed every 100 ms).
pub async fn assert_undisturbed(ns: &TestNs, how_long: Duration) {
    let token = tokens(&ns.locks().get("l").await.unwrap());
    throughout(ns, how_long, |l, at| {
        let l = l.unwrap_or_else(|| panic!("the lock went {at:?} in"));
        assert_eq!(holders(l), ["a"], "the live holder was revoked {at:?} in");
        assert_eq!(queue(l), ["b"], "the live waiter was dropped {at:?} in");
        assert_eq!(tokens(l), token, "a new grant {at:?} in");
    })
    .await;
    let reasons = event_reasons(ns, "l").await;
    assert!(!reasons.iter().any(|r| r == "Revoked" || r == "Dropped"), "{reasons:?}");
}

/// After a check that nothing happened (which a dead controller passes too): the
/// controller still acts. Lock `l`'s holder a stops renewing (`renewing`, from
/// [`live_holder_and_waiter`]) and releases, and waiter b is granted the next token.
pub async fn still_served(ns: &TestNs, renewing: [tokio::task::JoinHandle<()>; 2]) {
    let before = ns.locks().get("l").await.expect("read the lock");
    let claim_a = before.status.as_ref().expect("a status").holders[0].claim.clone();
    renewing[0].abort();
    release(ns, &claim_a).await;
    let l = ns
        .wait_lock("l", "b holds after a's release: the controller still acts", |l| {
            holders(l) == ["b"]
        })
        .await;
    assert_eq!(last_granted(&l), last_granted(&before) + 1, "b has the next token");
}

/// The claim of lock `lock`'s first holder.
pub async fn holder_claim(ns: &TestNs, lock: &str) -> String {
    let l = ns.locks().get(lock).await.expect("read the lock");
    l.status.expect("the lock has a status").holders[0].claim.clone()
}

/// Pod `pod` acquires lock `lock` through the library and releases it at once.
pub async fn take_turn(ns: &TestNs, lock: &str, pod: PodIdentity) {
    let handle = leasehold::client::Lock::builder(ns.client.clone(), &ns.name, lock)
        .identity(pod)
        .build()
        .expect("a lock handle");
    let guard = handle.acquire().await.expect("acquire");
    guard.release().await.expect("release");
}

/// GET a path from 127.0.0.1:port; returns (status line and headers, body).
pub async fn get(port: u16, path: &str) -> Option<(String, String)> {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok()?;
    tokio::io::AsyncWriteExt::write_all(
        &mut s,
        format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes(),
    )
    .await
    .ok()?;
    let mut text = String::new();
    tokio::io::AsyncReadExt::read_to_string(&mut s, &mut text).await.ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    Some((head.to_string(), body.to_string()))
}

/// One controller of `ns` serving HTTP on a loopback port: the port, the controller's
/// task and its first /metrics answer (head, body).
pub async fn serving_controller(ns: &TestNs, name: &str) -> (u16, Running, (String, String)) {
    let port = free_port();
    let opts = leasehold::controller::Options {
        http_addr: Some(([127, 0, 0, 1], port).into()),
        ..leasehold::controller::Options::single(name, Some(&ns.name))
    };
    let c = spawn_controller_with(ns.client.clone(), opts);
    let first = wait_for("/metrics to answer", DEADLINE, || get(port, "/metrics")).await;
    (port, c, first)
}

/// A controller serving HTTP (with notices) on a loopback port, publishing its URL.
/// Its answers wait up to 800 ms for the status write, not 100 ms: the write, the
/// claim's deletion and its watch event can take longer on a loaded 2-core machine,
/// and the answer would then be "accepted" (with a mark written), which is correct but
/// not the path under test. It stays under the 15 s lease's 1 s notice timeout.
pub async fn controller_taking_notices(ns: &TestNs, name: &str) -> (std::net::SocketAddr, Running) {
    let port = free_port();
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let opts = leasehold::controller::Options {
        http_addr: Some(addr),
        release_url: Some(leasehold::controller::release_url("127.0.0.1", port)),
        notice_wait: Duration::from_millis(800),
        ..leasehold::controller::Options::single(name, Some(&ns.name))
    };
    (addr, spawn_controller_with(ns.client.clone(), opts))
}
