//! `leasehold controller`: the operator.
//!
//! Pipeline per lock: **observe** (reflector stores of claim Leases and slim Pods, plus
//! the [`observe::Tracker`]'s monotonic clock) → **decide** ([`crate::decide`], pure) →
//! **apply** (status write with a resourceVersion precondition, then events, claim
//! deletion and stamping). Watch-driven: a claim, pod or lock change triggers the
//! lock's reconcile; time-based transitions requeue at the next deadline.

pub mod metrics;
pub mod observe;
pub mod reconcile;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::Api;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{Controller, WatchStreamExt, watcher};
use kube::{Client, ResourceExt};

use crate::api::{DistributedLock, LOCK_LABEL};
pub use metrics::Metrics;
use observe::Tracker;
use reconcile::Context;

/// Name of the Lease the controller replicas elect a leader with.
pub const LEADER_LEASE: &str = "leasehold-controller";
/// Leader lease duration.
pub const LEADER_LEASE_SECONDS: u64 = 15;
/// How often to repeat the "CRD not installed" hint.
pub const CRD_HINT_INTERVAL: Duration = Duration::from_secs(10);

/// How to run the controller.
#[derive(Clone, Debug)]
pub struct Options {
    /// Elect a leader among replicas through a Lease in this namespace; `None` runs
    /// without election (one replica, or tests).
    pub leader_election_namespace: Option<String>,
    /// This replica's identity (the pod name in a cluster).
    pub identity: String,
    /// Where to serve /metrics, /healthz and /readyz; `None` serves nothing.
    pub http_addr: Option<SocketAddr>,
    /// Watch only this namespace; `None` watches all.
    pub namespace: Option<String>,
}

impl Options {
    /// Options for one replica without leader election or HTTP, watching `namespace`
    /// (or all namespaces).
    pub fn single(identity: &str, namespace: Option<&str>) -> Self {
        Options {
            leader_election_namespace: None,
            identity: identity.into(),
            http_addr: None,
            namespace: namespace.map(String::from),
        }
    }

    fn api<K>(&self, client: &Client) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        match &self.namespace {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        }
    }
}

/// Errors that stop the controller.
#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    /// Leader election could not start.
    #[error("starting leader election: {0}")]
    LeaderElection(#[source] kube_lease_manager::LeaseManagerError),
}

/// How long a stopping leader waits to hand its leader Lease back.
pub const LEADER_RELEASE_TIMEOUT: Duration = Duration::from_secs(5);

/// Run the controller until `shutdown` completes.
pub async fn run(client: Client, opts: Options, shutdown: impl Future<Output = ()>) -> Result<(), ControllerError> {
    let metrics = Arc::new(Metrics::default());
    let http = opts.http_addr.map(|addr| {
        let m = metrics.clone();
        tokio::spawn(async move {
            if let Err(e) = metrics::serve(addr, m).await {
                tracing::error!(%addr, error = %e, "serving HTTP failed: no /metrics, /healthz or /readyz");
            }
        })
    });
    let result = match &opts.leader_election_namespace {
        None => {
            tokio::select! {
                _ = async { wait_for_crd(client.clone()).await; run_leader(client.clone(), &opts, metrics.clone()).await } => Ok(()),
                _ = shutdown => Ok(()),
            }
        }
        Some(ns) => run_elected(client.clone(), &opts, ns, metrics.clone(), shutdown).await,
    };
    if let Some(h) = http {
        h.abort();
    }
    result
}

/// Wait until the CRD is established, repeating a hint while it is missing.
async fn wait_for_crd(client: Client) {
    let api: Api<CustomResourceDefinition> = Api::all(client);
    loop {
        match crate::crd::wait_established(api.clone(), CRD_HINT_INTERVAL).await {
            Ok(()) => return,
            Err(e) => tracing::error!(
                "{e}. Install it with `leasehold crd | kubectl apply -f -` or the Helm chart (crds.install=true)"
            ),
        }
    }
}

/// Take part in leader election; reconcile only while leading. On shutdown, hand the
/// leader Lease back so another replica takes over at once.
async fn run_elected(
    client: Client,
    opts: &Options,
    ns: &str,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ControllerError> {
    let manager = kube_lease_manager::LeaseManagerBuilder::new(client.clone(), LEADER_LEASE)
        .with_namespace(ns)
        .with_identity(&opts.identity)
        .with_duration(LEADER_LEASE_SECONDS)
        .with_grace(5)
        .build()
        .await
        .map_err(ControllerError::LeaderElection)?;
    let (mut leading, task) = manager.watch().await;
    metrics.ready.store(true, Ordering::Relaxed); // a standby is ready too
    let work = async {
        wait_for_crd(client.clone()).await;
        loop {
            while !*leading.borrow_and_update() {
                tracing::info!(identity = opts.identity, "standing by for leadership");
                if leading.changed().await.is_err() {
                    return;
                }
            }
            tracing::info!(identity = opts.identity, "leading: reconciling");
            tokio::select! {
                _ = run_leader(client.clone(), opts, metrics.clone()) => {}
                _ = async { while *leading.borrow_and_update() { if leading.changed().await.is_err() { break } } } => {
                    tracing::warn!("lost leadership: stopping reconciles");
                }
            }
        }
    };
    tokio::select! {
        _ = work => {}
        _ = shutdown => {}
    }
    drop(leading); // the manager's task releases the Lease when its channel closes
    let _ = tokio::time::timeout(LEADER_RELEASE_TIMEOUT, task).await;
    Ok(())
}

/// Watch and reconcile (runs forever).
async fn run_leader(client: Client, opts: &Options, metrics: Arc<Metrics>) {
    let tracker = Arc::new(Mutex::new(Tracker::default()));
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "leasehold-controller".into(),
            instance: Some(opts.identity.clone()),
        },
    );
    let (lease_store, lease_writer) = reflector::store::<Lease>();
    let (pod_store, pod_writer) = reflector::store::<Pod>();
    let controller = Controller::new(opts.api::<DistributedLock>(&client), watcher::Config::default());
    let lock_store = controller.store();

    let t = tracker.clone();
    let leases = watcher(
        opts.api::<Lease>(&client),
        watcher::Config::default().labels(LOCK_LABEL),
    )
    .default_backoff()
    .reflect(lease_writer)
    .inspect_ok(move |ev| {
        let mut t = t.lock().expect("tracker lock poisoned");
        match ev {
            watcher::Event::Apply(l) | watcher::Event::InitApply(l) => t.observe(l, Instant::now()),
            watcher::Event::Delete(l) => t.forget(l),
            _ => {}
        }
    })
    .touched_objects();
    let pods = watcher(opts.api::<Pod>(&client), watcher::Config::default())
        .default_backoff()
        .modify(observe::slim_pod)
        .reflect(pod_writer)
        .touched_objects();

    let (synced_tx, synced_rx) = tokio::sync::watch::channel(false);
    let ctx = Arc::new(Context {
        client: client.clone(),
        leases: lease_store.clone(),
        pods: pod_store.clone(),
        tracker,
        recorder,
        metrics: metrics.clone(),
        synced: synced_rx,
    });
    let (ls, lc, ctx2, ctx3) = (lock_store.clone(), lease_store.clone(), ctx.clone(), ctx.clone());
    let pod_locks = move |pod: Pod| locks_of_pod(&pod, &ls, &lc);
    let ready = {
        let (l, p, m, k) = (
            lease_store.clone(),
            pod_store.clone(),
            metrics.clone(),
            lock_store.clone(),
        );
        async move {
            store_ready(&k).await;
            store_ready(&l).await;
            store_ready(&p).await;
            let _ = synced_tx.send(true);
            // Claims seen before the caches synced were not checked: check them now.
            for lease in l.state() {
                lock_of_claim(&lease, &k, &ctx3);
            }
            m.ready.store(true, Ordering::Relaxed);
            tracing::info!("caches synced");
            synced_tx.closed().await; // keep the sender while the controller runs
        }
    };
    tokio::spawn(ready);
    let lease_lock = move |lease: Lease| lock_of_claim(&lease, &lock_store, &ctx2);
    controller
        .watches_stream(leases, lease_lock)
        .watches_stream(pods, pod_locks)
        .run(reconcile::reconcile, reconcile::error_policy, ctx)
        .for_each(|_| futures::future::ready(()))
        .await;
}

/// Wait until a store has synced. kube-runtime's `Store::wait_until_ready` wakes only
/// the last task that polled it, so poll it with short timeouts rather than trusting a
/// wake-up; everything else waits on the `synced` watch channel instead.
async fn store_ready<K: kube::Resource + Clone + 'static>(store: &Store<K>)
where
    K::DynamicType: std::hash::Hash + Eq + Clone,
{
    while tokio::time::timeout(Duration::from_millis(100), store.wait_until_ready())
        .await
        .is_err()
    {}
}

/// The lock a claim asks for; warns (once) when no such lock exists yet.
fn lock_of_claim(
    lease: &Lease,
    locks: &Store<DistributedLock>,
    ctx: &Arc<Context>,
) -> Option<ObjectRef<DistributedLock>> {
    let ns = lease.namespace()?;
    let lock = ObjectRef::new(observe::claim_lock(lease)?).within(&ns);
    if *ctx.synced.borrow() && locks.get(&lock).is_none() {
        let uid = lease.uid().unwrap_or_default();
        let first = ctx
            .tracker
            .lock()
            .expect("tracker lock poisoned")
            .first_warning(&uid, "LockNotFound");
        if first {
            let note = format!(
                "no DistributedLock {} in namespace {ns}; the claim waits until it is created",
                lock.name
            );
            reconcile::publish_warnings(ctx, &[(Arc::new(lease.clone()), "LockNotFound", note)]);
        }
    }
    Some(lock)
}

/// The locks whose claims or status mention a pod.
fn locks_of_pod(pod: &Pod, locks: &Store<DistributedLock>, leases: &Store<Lease>) -> Vec<ObjectRef<DistributedLock>> {
    let (Some(ns), name) = (pod.namespace(), pod.name_any()) else {
        return Vec::new();
    };
    let mut out: Vec<ObjectRef<DistributedLock>> = leases
        .state()
        .iter()
        .filter(|l| l.namespace().as_deref() == Some(&ns))
        .filter(|l| l.spec.as_ref().and_then(|s| s.holder_identity.as_deref()) == Some(&name))
        .filter_map(|l| observe::claim_lock(l).map(|lock| ObjectRef::new(lock).within(&ns)))
        .collect();
    for lock in locks.state().iter().filter(|l| l.namespace().as_deref() == Some(&ns)) {
        let Some(st) = lock.status.as_ref() else { continue };
        if st.holders.iter().any(|h| h.pod == name) || st.queue.iter().any(|w| w.pod == name) {
            out.push(ObjectRef::from_obj(lock.as_ref()));
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out.dedup();
    out
}
