//! Locks whose claims live in etcd: one mirror task per lock watches its keys; the
//! reconcile reports them in status ([`crate::etcd::rules::mirror`]) and takes away the
//! keys of gone pods (delete, or hold back when the process may still run).
//!
//! etcd grants, not the controller: when the controller is down, etcd-backed locks
//! still hand over; only the status report and the revocations of gone pods wait.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, EventType, GetOptions, PutOptions, Txn, TxnOp, WatchOptions};
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action as Requeue;
use kube::runtime::reflector::ObjectRef;
use tokio::sync::{mpsc, watch};

use super::context::Context;
use super::reconcile::{Error, MAX_CONFLICT_RETRIES, Step, Trouble, with_conditions, write_status};
use crate::api::{DistributedLock, EtcdBackend, RevokeReason};
use crate::decide::{Action, ActionKind};
use crate::etcd::keys::{ClaimValue, claim_of, lock_prefix};
use crate::etcd::rules::{KeyAction, KeyView, mirror};
use crate::etcd::{Error as EtcdError, connect::TlsFiles};

/// How long an etcd request of the controller may take.
pub const ETCD_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest pause between attempts to reach a lock's etcd.
pub const MAX_RETRY: Duration = Duration::from_secs(10);
/// How soon a lock whose etcd is unreachable is looked at again.
pub const UNAVAILABLE_REQUEUE: Duration = Duration::from_secs(5);

/// What the mirror of one lock sees.
#[derive(Clone)]
pub enum View {
    /// Not connected yet.
    Connecting,
    /// The lock's keys as of the last watch response, and a client to act with.
    Keys(Arc<Vec<KeyView>>, Box<Client>),
    /// etcd could not be reached or read: why.
    Failed(String),
}

struct Entry {
    backend: EtcdBackend,
    view: watch::Receiver<View>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Entry {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The mirror tasks, one per etcd-backed lock; each triggers its lock's reconcile on
/// every change it sees.
pub struct Mirrors {
    client: kube::Client,
    trigger: mpsc::UnboundedSender<ObjectRef<DistributedLock>>,
    entries: Mutex<HashMap<ObjectRef<DistributedLock>, Entry>>,
}

impl Mirrors {
    /// Mirrors that read TLS Secrets with `client` and send reconcile triggers to `trigger`.
    pub fn new(client: kube::Client, trigger: mpsc::UnboundedSender<ObjectRef<DistributedLock>>) -> Self {
        Mirrors {
            client,
            trigger,
            entries: Mutex::default(),
        }
    }

    /// The current view of `lock`'s keys, starting its mirror (again, if the backend
    /// changed) when needed.
    pub fn view(&self, lock: &DistributedLock, backend: &EtcdBackend) -> View {
        let at = ObjectRef::from_obj(lock);
        let mut entries = self.entries.lock().expect("mirrors lock poisoned");
        if let Some(e) = entries.get(&at).filter(|e| e.backend == *backend) {
            return e.view.borrow().clone();
        }
        let (tx, rx) = watch::channel(View::Connecting);
        let ns = lock.namespace().unwrap_or_default();
        let task = tokio::spawn(run_mirror(
            self.client.clone(),
            at.clone(),
            ns,
            backend.clone(),
            tx,
            self.trigger.clone(),
        ));
        let entry = Entry {
            backend: backend.clone(),
            view: rx,
            task,
        };
        entries.insert(at, entry);
        View::Connecting
    }

    /// Stop mirroring `lock` (deleted, or no longer on etcd).
    pub fn forget(&self, lock: &ObjectRef<DistributedLock>) {
        self.entries.lock().expect("mirrors lock poisoned").remove(lock);
    }
}

/// Read the TLS material of a lock's etcd from its Secret.
async fn tls_of(client: &kube::Client, ns: &str, backend: &EtcdBackend) -> Result<Option<TlsFiles>, String> {
    let Some(r) = &backend.tls_secret_ref else {
        return Ok(None);
    };
    let secret = Api::<Secret>::namespaced(client.clone(), ns)
        .get(&r.name)
        .await
        .map_err(|e| format!("reading the etcd TLS Secret {}: {e}", r.name))?;
    let data = secret.data.unwrap_or_default();
    let field = |k: &'static str| {
        data.get(k)
            .map(|b| b.0.clone())
            .ok_or_else(|| EtcdError::TlsSecret(r.name.clone(), k).to_string())
    };
    Ok(Some(TlsFiles {
        ca: field("ca.crt")?,
        cert: field("tls.crt")?,
        key: field("tls.key")?,
    }))
}

/// Mirror one lock's keys until aborted: list, then watch from the list's revision;
/// on any failure publish it and start over, backing off.
async fn run_mirror(
    kube: kube::Client,
    lock: ObjectRef<DistributedLock>,
    ns: String,
    backend: EtcdBackend,
    view: watch::Sender<View>,
    trigger: mpsc::UnboundedSender<ObjectRef<DistributedLock>>,
) {
    let prefix = lock_prefix(&backend, &ns, &lock.name);
    let mut backoff = Duration::from_millis(250);
    loop {
        let failure = match mirror_once(&kube, &ns, &backend, &prefix, &view, &lock, &trigger, &mut backoff).await {
            Ok(()) => "the watch ended".to_string(),
            Err(e) => e,
        };
        tracing::warn!(lock = %lock, error = failure, "mirroring the lock's etcd keys failed; retrying");
        view.send_replace(View::Failed(failure));
        let _ = trigger.send(lock.clone());
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_RETRY);
    }
}

#[allow(clippy::too_many_arguments)]
async fn mirror_once(
    kube: &kube::Client,
    ns: &str,
    backend: &EtcdBackend,
    prefix: &str,
    view: &watch::Sender<View>,
    lock: &ObjectRef<DistributedLock>,
    trigger: &mpsc::UnboundedSender<ObjectRef<DistributedLock>>,
    backoff: &mut Duration,
) -> Result<(), String> {
    let tls = tls_of(kube, ns, backend).await?;
    let mut client = crate::etcd::connect_with(backend, tls.as_ref(), ETCD_TIMEOUT)
        .await
        .map_err(|e| e.to_string())?;
    let listed = client
        .get(prefix, Some(GetOptions::new().with_prefix()))
        .await
        .map_err(|e| EtcdError::Read(prefix.into(), e).to_string())?;
    let from = listed.header().map_or(0, |h| h.revision()) + 1;
    let mut keys: BTreeMap<String, KeyView> = BTreeMap::new();
    for kv in listed.kvs() {
        if let Some(k) = key_view(prefix, kv) {
            keys.insert(k.key.clone(), k);
        }
    }
    let publish = |keys: &BTreeMap<String, KeyView>| {
        view.send_replace(View::Keys(
            Arc::new(keys.values().cloned().collect()),
            Box::new(client.clone()),
        ));
        let _ = trigger.send(lock.clone());
    };
    publish(&keys);
    let options = WatchOptions::new().with_prefix().with_start_revision(from);
    let mut stream = client
        .clone()
        .watch(prefix, Some(options))
        .await
        .map_err(|e| EtcdError::Watch(prefix.into(), e).to_string())?;
    *backoff = Duration::from_millis(250);
    loop {
        let Some(r) = stream
            .message()
            .await
            .map_err(|e| EtcdError::Watch(prefix.into(), e).to_string())?
        else {
            return Ok(());
        };
        if r.canceled() {
            return Err(format!("the watch on {prefix} was cancelled: {}", r.cancel_reason()));
        }
        if r.events().is_empty() {
            continue;
        }
        for e in r.events() {
            let Some(kv) = e.kv() else { continue };
            let key = String::from_utf8_lossy(kv.key()).into_owned();
            match e.event_type() {
                EventType::Delete => {
                    keys.remove(&key);
                }
                EventType::Put => {
                    if let Some(k) = key_view(prefix, kv) {
                        keys.insert(key, k);
                    }
                }
            }
        }
        publish(&keys);
    }
}

fn key_view(prefix: &str, kv: &etcd_client::KeyValue) -> Option<KeyView> {
    let key = std::str::from_utf8(kv.key()).ok()?;
    Some(KeyView {
        key: key.to_string(),
        claim: claim_of(prefix, key).to_string(),
        create_revision: kv.create_revision(),
        mod_revision: kv.mod_revision(),
        lease: kv.lease(),
        value: ClaimValue::parse(kv.value()),
    })
}

/// Reconcile an etcd-backed lock: report its keys in status, revoke the claims of gone
/// pods, and say in the Ready condition (and an event) when etcd cannot be reached.
pub async fn reconcile(lock: Arc<DistributedLock>, ctx: Arc<Context>, backend: EtcdBackend) -> Result<Requeue, Error> {
    let started = std::time::Instant::now();
    let ns = lock.namespace().unwrap_or_default();
    let name = lock.name_any();
    let api: Api<DistributedLock> = Api::namespaced(ctx.client.clone(), &ns);
    let view = ctx.mirrors.view(&lock, &backend);
    let mut current = ctx.written.fresher(&lock);
    for _ in 0..MAX_CONFLICT_RETRIES {
        let old = current.status.clone().unwrap_or_default();
        let (status, actions, trouble, client) = match &view {
            View::Keys(keys, client) => {
                let m = plan(&current, &ctx, keys);
                let trouble = (!m.invalid.is_empty()).then(|| Trouble::rejected(m.invalid.len()));
                (m.status, m.actions, trouble, Some((**client).clone()))
            }
            View::Connecting => return Ok(Requeue::await_change()), // the mirror triggers when it knows
            View::Failed(why) => (old.clone(), Vec::new(), Some(Trouble::etcd(why)), None),
        };
        let new = with_conditions(&current, status, trouble.as_ref());
        match write_status(&ctx, &api, &mut current, new.clone()).await? {
            Step::Go => {}
            Step::Again => continue,
            Step::Stop => return Ok(Requeue::await_change()),
        }
        let was = |s: &crate::api::DistributedLockStatus| {
            s.conditions
                .iter()
                .find(|c| c.type_ == "Ready")
                .map(|c| c.reason.clone())
        };
        if let Some(t) = &trouble
            && was(&old).as_deref() != Some(t.reason)
        {
            super::apply::warn_on_lock(&ctx, &current, t.reason, t.message.clone());
        }
        ctx.metrics.set_queue_depth(&ns, &name, new.queue.len());
        let mut events = changes(&old, &new);
        let mut retry = false;
        if let Some(client) = client {
            for a in actions {
                match pod_confirmed_gone(&ctx, &ns, &a).await {
                    Some(true) => {}
                    Some(false) => continue,
                    None => {
                        retry = true;
                        continue;
                    }
                }
                if let Some(event) = revoke(client.clone(), &a).await.map_err(Error::Etcd)? {
                    events.push(event);
                }
            }
        }
        // The same metrics as a Lease-backed lock's (a release here is seen when etcd
        // shows its key gone: no handoff is timed from a notice or a mark).
        ctx.metrics
            .record_actions((&ns, &name), &old, &events, &[], Timestamp::now());
        ctx.metrics.reconcile_seconds.observe(started.elapsed().as_secs_f64());
        super::apply::publish_actions(&ctx, &current, events);
        if let Some(Trouble {
            reason: "EtcdUnavailable",
            ..
        }) = trouble
        {
            return Ok(Requeue::requeue(UNAVAILABLE_REQUEUE));
        }
        if retry {
            return Ok(Requeue::requeue(super::reconcile::ERROR_REQUEUE));
        }
        return Ok(Requeue::await_change());
    }
    Err(Error::Conflicts(name))
}

fn plan(lock: &DistributedLock, ctx: &Context, keys: &[KeyView]) -> crate::etcd::rules::Mirror {
    let ns = lock.namespace().unwrap_or_default();
    let status = lock.status.clone().unwrap_or_default();
    let names: Vec<&str> = keys
        .iter()
        .filter_map(|k| k.value.as_ref())
        .map(|v| v.pod.as_str())
        .collect();
    let pods = ctx.pods.views(&ns, names.into_iter());
    let tracker = ctx.tracker.lock().expect("tracker lock poisoned");
    let stopped = keys
        .iter()
        .filter_map(|k| k.value.as_ref())
        .filter(|v| tracker.pod_stopped(&v.pod_uid))
        .map(|v| v.pod_uid.clone())
        .collect();
    mirror(keys, &lock.spec, &status, &pods, &stopped, Timestamp::now())
}

/// Grants and ends between two mirrored statuses, as the decide core's actions (for
/// the same events as the Kubernetes backend).
fn changes(old: &crate::api::DistributedLockStatus, new: &crate::api::DistributedLockStatus) -> Vec<Action> {
    let mut out = Vec::new();
    for h in &new.holders {
        if !old.holders.iter().any(|o| o.claim == h.claim) {
            out.push(Action::new(&h.claim, &h.pod, ActionKind::Granted(h.fencing_token)));
        }
    }
    for h in &old.holders {
        if !new.holders.iter().any(|n| n.claim == h.claim) {
            let kind = match h.revoked {
                Some(_) => ActionKind::SlotFreed(h.fencing_token),
                None => ActionKind::Released(h.fencing_token),
            };
            out.push(Action::new(&h.claim, &h.pod, kind));
        }
    }
    out
}

/// Whether a key action may go ahead: a pod judged gone from the controller's pod cache
/// is read afresh first (only on such trouble), so a claim made by a pod the cache has
/// not shown yet is not held back. `None`: the read failed; look again soon.
async fn pod_confirmed_gone(ctx: &Context, ns: &str, a: &KeyAction) -> Option<bool> {
    let KeyAction::HoldBack {
        value,
        reason: RevokeReason::PodGone,
        ..
    } = a
    else {
        return Some(true);
    };
    if value.pod.is_empty() {
        return Some(true);
    }
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    match pods.get_opt(&value.pod).await {
        Ok(Some(pod)) if pod.uid().as_deref() == Some(value.pod_uid.as_str()) => {
            tracing::info!(
                pod = value.pod,
                "the pod cache lags: the claim's pod is there; not revoking"
            );
            Some(false)
        }
        Ok(_) => Some(true),
        Err(e) => {
            tracing::warn!(pod = value.pod, error = %e, "confirming a pod gone failed; not revoking yet");
            None
        }
    }
}

/// Take one key away: delete it, or move it onto a fresh controller lease and revoke
/// the client's (each only if the key is unchanged). Returns the event to publish.
async fn revoke(mut client: Client, a: &KeyAction) -> Result<Option<Action>, EtcdError> {
    match a {
        KeyAction::Delete {
            key,
            claim,
            mod_revision,
            reason,
        } => {
            let txn = Txn::new()
                .when([Compare::mod_revision(key.as_str(), CompareOp::Equal, *mod_revision)])
                .and_then([TxnOp::delete(key.as_str(), None)]);
            let done = client.txn(txn).await.map_err(|e| EtcdError::Revoke(key.clone(), e))?;
            tracing::info!(
                claim,
                ?reason,
                deleted = done.succeeded(),
                "deleting the claim key of a stopped pod"
            );
            Ok(None)
        }
        KeyAction::HoldBack {
            key,
            claim,
            mod_revision,
            client_lease,
            create_revision,
            ttl_seconds,
            value,
            reason,
        } => {
            let lease = client
                .lease_grant(*ttl_seconds, None)
                .await
                .map_err(|e| EtcdError::Revoke(key.clone(), e))?
                .id();
            let put = TxnOp::put(
                key.as_str(),
                value.to_bytes(),
                Some(PutOptions::new().with_lease(lease)),
            );
            let txn = Txn::new()
                .when([Compare::mod_revision(key.as_str(), CompareOp::Equal, *mod_revision)])
                .and_then([put]);
            let moved = client.txn(txn).await.map_err(|e| EtcdError::Revoke(key.clone(), e))?;
            if !moved.succeeded() {
                let _ = client.lease_revoke(lease).await; // the key changed meanwhile: look again
                return Ok(None);
            }
            tracing::warn!(
                claim,
                ?reason,
                ttl_seconds,
                "held back the claim key of a pod that may still run"
            );
            if *client_lease != 0
                && let Err(e) = client.lease_revoke(*client_lease).await
            {
                tracing::debug!(claim, error = %e, "revoking the client's lease failed (it learns at its next renewal)");
            }
            Ok(Some(Action::new(
                claim,
                &value.pod,
                ActionKind::Revoked(*create_revision, *reason),
            )))
        }
    }
}
