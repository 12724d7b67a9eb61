//! The watches that feed the reconciler: locks, claim Leases (which also feed the
//! [`Tracker`]'s clock) and slim Pods, each mapped to the locks it concerns.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{Controller, WatchStreamExt, watcher};
use kube::{Client, ResourceExt};

use super::etcd::mirror::Mirrors;
use super::{Metrics, Options, reconcile};
use crate::api::DistributedLock;
use crate::controller::cache::tracker::Tracker;
use crate::controller::context::Context;
use crate::controller::k8s::observe;
use crate::protocol;
use crate::retry::{NoPause, WatchBackoff, relist_at_once};

/// How many locks are reconciled at once. Unbounded, a start-up over 1,000 locks ran
/// 1,000 reconciles side by side, each holding its request and response buffers, and
/// sent the API server more writes at once than it takes (its throughput peaks at 16–32
/// writers here). Reconciles of one lock never run side by side either way.
pub const MAX_CONCURRENT_RECONCILES: u16 = 32;

/// Watch and reconcile (runs forever).
pub(super) async fn run_leader(
    client: Client,
    opts: &Options,
    metrics: Arc<Metrics>,
    notices: Arc<crate::controller::k8s::notices::Notices>,
) {
    let tracker = Arc::new(Mutex::new(Tracker::default()));
    let (lease_store, lease_writer) = reflector::store::<Lease>();
    let (lock_store, lock_writer) = reflector::store::<DistributedLock>();
    let (etcd_trigger, etcd_triggers) = tokio::sync::mpsc::unbounded_channel();
    // The scheduler's own triggers: etcd mirrors' changes, and prompts beyond the limit.
    let scheduled = etcd_trigger.clone();
    let mirrors = Arc::new(Mirrors::new(client.clone(), etcd_trigger, opts.etcd_mirror));
    let written = Arc::new(crate::controller::cache::written::Written::default());
    let api = opts.api::<DistributedLock>(&client);
    let locks = lock_watch(api, lock_writer, metrics.clone(), mirrors.clone(), written.clone());
    let controller = Controller::for_stream(locks, lock_store.clone())
        .with_config(kube::runtime::controller::Config::default().concurrency(MAX_CONCURRENT_RECONCILES))
        .trigger_backoff(NoPause);

    let claims = Arc::new(crate::controller::k8s::claims::ClaimIndex::default());
    let (prompter, prompts) = crate::controller::prompt::Prompter::new();
    let tombstones = Arc::new(crate::controller::k8s::sweep::Tombstones::default());
    let pod_index = Arc::new(crate::controller::cache::pods::PodIndex::default());
    let feeds = Feeds {
        tracker: tracker.clone(),
        claims: claims.clone(),
        pods: pod_index.clone(),
        tombstones: tombstones.clone(),
        notices: notices.clone(),
        statuses: lock_store.clone(),
        written: written.clone(),
        prompter: prompter.clone(),
    };
    let leases = claim_watch(opts.api::<Lease>(&client), lease_writer, feeds.clone());
    let pods = pod_watch(opts.api::<Pod>(&client), feeds);

    let (synced_tx, synced_rx) = tokio::sync::watch::channel(false);
    let backends = crate::controller::k8s::state::State {
        leases: lease_store.clone(),
        claims: claims.clone(),
        tombstones,
        sweeper: Arc::new(crate::controller::k8s::sweep::Sweeper::new(client.clone())),
        notices: notices.clone(),
        release_url: opts.release_url.clone(),
    };
    let ctx = Arc::new(Context {
        client: client.clone(),
        pods: pod_index.clone(),
        tracker,
        recorder: recorder(&client, opts),
        event_budget: Default::default(),
        warning_budget: crate::controller::budget::Budget::warnings(Instant::now()),
        metrics: metrics.clone(),
        written,
        synced: synced_rx,
        turns: Default::default(),
        k8s: backends,
        etcd: mirrors,
    });
    notices.lead(lock_store.clone(), ctx.written.clone(), prompter.clone());
    let prompted = reconcile::serve_prompts(prompts, lock_store.clone(), ctx.clone(), scheduled);
    let _prompts = super::Helper::spawn(prompted);
    let (ls, ctx2, ctx3) = (lock_store.clone(), ctx.clone(), ctx.clone());
    let by_pod = claims.clone();
    let pod_locks = move |pod: Pod| locks_of_pod(&pod, &ls, &by_pod);
    let stores = (lock_store.clone(), lease_store.clone());
    let indexes = (pod_index.clone(), claims.clone());
    let _ready = super::Helper::spawn(synced(stores, indexes, synced_tx, metrics.clone(), ctx3));
    let lease_lock = move |lease: Lease| lock_of_claim(&lease, &lock_store, &ctx2);
    controller
        .watches_stream(leases, lease_lock)
        .watches_stream(pods, pod_locks)
        .reconcile_on(futures::stream::unfold(etcd_triggers, |mut rx| async move {
            rx.recv().await.map(|lock| (lock, rx))
        }))
        .run(reconcile::reconcile, reconcile::error_policy, ctx)
        .for_each(|_| futures::future::ready(()))
        .await;
}

/// The event recorder of this replica.
fn recorder(client: &Client, opts: &Options) -> Recorder {
    let reporter = Reporter {
        controller: "leasehold-controller".into(),
        instance: Some(opts.identity.clone()),
    };
    Recorder::new(client.clone(), reporter)
}

/// The lock watch: it fills the lock store (`writer`) and follows the locks' metric
/// series; a deleted lock is never reconciled, so its series and etcd mirror go as the
/// watch shows it. Like the claim and pod watches it backs off on its own
/// ([`crate::retry`]). The watch showing this controller's own status write
/// holds no news for it.
fn lock_watch(
    api: kube::Api<DistributedLock>,
    writer: reflector::store::Writer<DistributedLock>,
    metrics: Arc<Metrics>,
    mirrors: Arc<Mirrors>,
    own: Arc<crate::controller::cache::written::Written>,
) -> impl futures::Stream<Item = Result<DistributedLock, watcher::Error>> + Send + 'static {
    relist_at_once(watcher(api, watcher::Config::default()))
        .backoff(WatchBackoff::controller())
        .reflect(writer)
        .inspect_ok(move |ev| {
            metrics.follow_locks(ev);
            if let watcher::Event::Delete(lock) = ev {
                mirrors.forget(&ObjectRef::from_obj(lock));
            }
        })
        .applied_objects()
        .try_filter(move |lock| std::future::ready(!own.is_own(lock)))
}

/// What the claim and pod watches feed, besides their stores.
#[derive(Clone)]
struct Feeds {
    tracker: Arc<Mutex<Tracker>>,
    claims: Arc<crate::controller::k8s::claims::ClaimIndex>,
    pods: Arc<crate::controller::cache::pods::PodIndex>,
    tombstones: Arc<crate::controller::k8s::sweep::Tombstones>,
    notices: Arc<crate::controller::k8s::notices::Notices>,
    statuses: Store<DistributedLock>,
    written: Arc<crate::controller::cache::written::Written>,
    prompter: crate::controller::prompt::Prompter,
}

/// How many claims one page of the claim watch's listing brings: a page is parsed whole
/// before each claim is cut to what the controller reads, and a neighbour may pad a
/// Lease to the API server's object limit (about 1.5 MiB): 50 such claims are 75 MiB of
/// JSON, where kube's default page of 500 was ten times the chart's memory limit
/// (256 MiB). 10,000 claims list in 200 pages.
const CLAIM_PAGE: u32 = 50;

/// The claim watch: it fills the claim store (`writer`) and index and the tracker's
/// clock, prompts the lock of a claim marked released, and remembers a claim deleted
/// before its lock decided on it (a noticed claim as marked).
fn claim_watch(
    api: kube::Api<Lease>,
    writer: reflector::store::Writer<Lease>,
    f: Feeds,
) -> impl futures::Stream<Item = Result<Lease, watcher::Error>> + Send + 'static {
    let config = watcher::Config::default()
        .labels(protocol::LOCK_LABEL)
        .page_size(CLAIM_PAGE);
    relist_at_once(watcher(api, config))
        .backoff(WatchBackoff::controller())
        .modify(protocol::claim::keep_what_is_read) // bounded, whatever a neighbour writes
        .reflect(writer)
        .inspect_ok(move |ev| {
            f.claims.apply(ev);
            let mut t = f.tracker.lock().expect("tracker lock poisoned");
            match ev {
                watcher::Event::Apply(l) | watcher::Event::InitApply(l) => {
                    t.observe(l, Instant::now());
                    if protocol::claim::has_release_mark(l) {
                        prompt_for_claim(&f.prompter, l);
                    }
                }
                watcher::Event::Delete(l) => {
                    if named_in_status(&f.statuses, &f.written, l) {
                        let marked = f.notices.as_marked(l);
                        f.tombstones.bury(marked.as_ref().unwrap_or(l), Instant::now());
                        prompt_for_claim(&f.prompter, l);
                    }
                    t.forget(l, Instant::now());
                    if let Some(ns) = l.namespace() {
                        f.notices.forget(&ns, &l.name_any());
                    }
                }
                watcher::Event::Init => t.relist_started(),
                watcher::Event::InitDone => t.relist_done(),
            }
        })
        .touched_objects()
}

/// The pod watch (slim pods): it fills the pod index, tells the tracker of pods gone,
/// and prompts the locks a deleted pod's claims ask for (the claim index, no scan of
/// every lock's status as the trigger mapper does: a holder has a claim).
fn pod_watch(
    api: kube::Api<Pod>,
    f: Feeds,
) -> impl futures::Stream<Item = Result<Pod, watcher::Error>> + Send + 'static {
    relist_at_once(watcher(api, watcher::Config::default()))
        .backoff(WatchBackoff::controller())
        .modify(observe::slim_pod)
        .inspect_ok(move |ev| {
            f.pods.apply(ev);
            if let watcher::Event::Delete(pod) = ev {
                let mut t = f.tracker.lock().expect("tracker lock poisoned");
                t.pod_departed(pod, Instant::now());
                if let Some(ns) = pod.namespace() {
                    for lock in f.claims.locks_of_pod(&ns, &pod.name_any()) {
                        f.prompter.prompt(ObjectRef::new(&lock).within(&ns));
                    }
                }
            }
        })
        .touched_objects()
}

/// Completes nothing until the lock and claim stores and the pod and claim indexes have
/// synced (the indexes take each event after the store), then says so on `synced`,
/// checks the claims seen before (they were not), marks the controller ready, and keeps
/// the sender while the controller runs.
async fn synced(
    (locks, leases): (Store<DistributedLock>, Store<Lease>),
    (pods, claims): (
        Arc<crate::controller::cache::pods::PodIndex>,
        Arc<crate::controller::k8s::claims::ClaimIndex>,
    ),
    synced: tokio::sync::watch::Sender<bool>,
    metrics: Arc<Metrics>,
    ctx: Arc<Context>,
) {
    store_ready(&locks).await;
    store_ready(&leases).await;
    while !pods.synced() || !claims.synced() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = synced.send(true);
    for lease in leases.state() {
        lock_of_claim(&lease, &locks, &ctx);
    }
    metrics.ready.store(true, Ordering::Relaxed);
    tracing::info!("caches synced");
    synced.closed().await;
}

/// Reconcile at once the lock claim `lease` asks for (see [`super::prompt`]).
fn prompt_for_claim(prompter: &crate::controller::prompt::Prompter, lease: &Lease) {
    if let (Some(ns), Some(lock)) = (lease.namespace(), protocol::claim::claim_lock(lease)) {
        prompter.prompt(ObjectRef::new(lock).within(&ns));
    }
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

/// Whether the status of the lock a claim asks for still names it, as a holder or a
/// waiter, as cached or as this controller last wrote it: only then is its deletion
/// news the lock must decide on.
fn named_in_status(
    locks: &Store<DistributedLock>,
    written: &crate::controller::cache::written::Written,
    lease: &Lease,
) -> bool {
    let (Some(ns), Some(lock)) = (lease.namespace(), protocol::claim::claim_lock(lease)) else {
        return false;
    };
    let claim = lease.name_any();
    let names = |l: &DistributedLock| l.status.as_ref().is_some_and(|s| protocol::names_claim(s, &claim));
    let cached = locks.get(&ObjectRef::new(lock).within(&ns));
    cached.as_deref().is_some_and(names) || written.last_written_is(&ns, lock, names)
}

/// The lock a claim asks for; warns (once) when no such lock exists yet.
fn lock_of_claim(
    lease: &Lease,
    locks: &Store<DistributedLock>,
    ctx: &Arc<Context>,
) -> Option<ObjectRef<DistributedLock>> {
    let ns = lease.namespace()?;
    let lock = ObjectRef::new(protocol::claim::claim_lock(lease)?).within(&ns);
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
            crate::controller::events::publish_warnings(ctx, &[(Arc::new(lease.clone()), "LockNotFound", note)]);
        }
    }
    Some(lock)
}

/// The locks whose claims or status mention a pod.
fn locks_of_pod(
    pod: &Pod,
    locks: &Store<DistributedLock>,
    claims: &crate::controller::k8s::claims::ClaimIndex,
) -> Vec<ObjectRef<DistributedLock>> {
    let (Some(ns), name) = (pod.namespace(), pod.name_any()) else {
        return Vec::new();
    };
    let mut out: Vec<ObjectRef<DistributedLock>> = claims
        .locks_of_pod(&ns, &name)
        .into_iter()
        .map(|lock| ObjectRef::new(&lock).within(&ns))
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
