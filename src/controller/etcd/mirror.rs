//! The mirrors of etcd-backed locks: one task per lock watches its keys in etcd,
//! publishes every change it sees at once as the latest [`View`], and triggers the
//! lock's reconcile a while after a change ([`SETTLE`] by default, and no sooner than
//! [`INTERVAL`] after the previous one), once for all the changes seen by then; the
//! reconcile reads the latest view.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{Client, EventType, GetOptions, WatchOptions};
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::reflector::ObjectRef;
use tokio::sync::{mpsc, watch};

use crate::api::{DistributedLock, EtcdBackend};
use crate::etcd::keys::{ClaimValue, claim_of, lock_prefix};
use crate::etcd::rules::KeyView;
use crate::etcd::{Error as EtcdError, connect::TlsFiles};

/// How long an etcd request of the controller may take.
pub const ETCD_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest pause between attempts to reach a lock's etcd.
pub const MAX_RETRY: Duration = Duration::from_secs(10);
/// How long after a change of a lock's keys its reconcile waits by default, gathering
/// the changes that follow. The reconcile writes the lock's status through the API server (and so
/// into the API server's etcd); done at once, that write competes for the CPU with the
/// very handoff it reports, as the next holder's process starts (measured: see
/// docs/measurements.md). Nothing waits on it: etcd-backed holders learn of their grants
/// from etcd, and a pod's deletion prompts its lock's reconcile at once. The status
/// shows the keys as they are when it is written: a grant given and released within
/// the settle shows in none (as before, one shorter than a status write).
pub const SETTLE: Duration = Duration::from_millis(25);
/// The least time between two reconciles of one lock that its key changes trigger by
/// default: a lock whose keys change faster (a handoff every few milliseconds) has its
/// status written at most this often, with every change seen by then. Each status write
/// costs the API server three to five Lease writes' work, sent on to every watcher of the
/// lock; at one a handoff, they made the API server's share of an etcd-backed handoff
/// (measured: docs/measurements.md). The status of a busy lock lags its keys by up to
/// this, and a grant given and released within it shows in no status (nor Event, nor
/// grant metric); a pod event for a pod the status names still prompts a reconcile at
/// once (one for a pod newer than the status waits for this one).
pub const INTERVAL: Duration = Duration::from_millis(250);
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
    /// When the lock's reconcile is triggered after a change.
    pace: Pace,
    entries: Mutex<HashMap<ObjectRef<DistributedLock>, Entry>>,
}

impl Mirrors {
    /// Mirrors that read TLS Secrets with `client` and send reconcile triggers to
    /// `trigger` at `pace`.
    pub fn new(client: kube::Client, trigger: mpsc::UnboundedSender<ObjectRef<DistributedLock>>, pace: Pace) -> Self {
        Mirrors {
            client,
            trigger,
            pace,
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
            (self.trigger.clone(), self.pace),
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
        .map_err(|e| {
            let hint = match &e {
                kube::Error::Api(s) if s.code == 403 => {
                    " (the controller may not read it: grant it with the chart's etcdBackend.tlsSecrets)"
                }
                _ => "",
            };
            format!("reading the etcd TLS Secret {}: {e}{hint}", r.name)
        })?;
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
    (trigger, pace): (mpsc::UnboundedSender<ObjectRef<DistributedLock>>, Pace),
) {
    let prefix = lock_prefix(&backend, &ns, &lock.name);
    let mut backoff = Duration::from_millis(250);
    loop {
        let failure = match mirror_once(
            &kube,
            &ns,
            &backend,
            &prefix,
            &view,
            (&lock, &trigger, pace),
            &mut backoff,
        )
        .await
        {
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
    (lock, trigger, pace): (
        &ObjectRef<DistributedLock>,
        &mpsc::UnboundedSender<ObjectRef<DistributedLock>>,
        Pace,
    ),
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
    };
    publish(&keys);
    let _ = trigger.send(lock.clone());
    let mut last = tokio::time::Instant::now();
    let options = WatchOptions::new().with_prefix().with_start_revision(from);
    let mut stream = client
        .clone()
        .watch(prefix, Some(options))
        .await
        .map_err(|e| EtcdError::Watch(prefix.into(), e).to_string())?;
    *backoff = Duration::from_millis(250);
    // A change is published at once (a reconcile for any reason sees it) and
    // reconciled at the pace's time, together with whatever else changed meanwhile.
    let mut due: Option<tokio::time::Instant> = None;
    loop {
        let message = tokio::select! {
            m = stream.message() => m,
            () = tokio::time::sleep_until(due.unwrap_or_else(tokio::time::Instant::now)), if due.is_some() => {
                due = None;
                last = tokio::time::Instant::now();
                let _ = trigger.send(lock.clone());
                continue;
            }
        };
        let Some(r) = message.map_err(|e| EtcdError::Watch(prefix.into(), e).to_string())? else {
            return Ok(());
        };
        if r.canceled() {
            return Err(format!("the watch on {prefix} was cancelled: {}", r.cancel_reason()));
        }
        if r.events().is_empty() {
            continue;
        }
        apply(&mut keys, prefix, r.events());
        publish(&keys);
        due.get_or_insert_with(|| pace.due(tokio::time::Instant::now(), last));
    }
}

/// When a lock's mirror triggers its reconcile after a change of its keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pace {
    /// How long after the change ([`SETTLE`] by default), gathering those that follow.
    pub settle: Duration,
    /// The least time since the previous trigger ([`INTERVAL`] by default).
    pub interval: Duration,
}

impl Default for Pace {
    fn default() -> Self {
        Pace {
            settle: SETTLE,
            interval: INTERVAL,
        }
    }
}

impl Pace {
    /// The trigger for a change seen at `now`, the previous trigger having been at `last`.
    pub fn due(&self, now: tokio::time::Instant, last: tokio::time::Instant) -> tokio::time::Instant {
        (now + self.settle).max(last + self.interval)
    }
}

/// Apply a watch response's `events` to the lock's `keys`.
fn apply(keys: &mut BTreeMap<String, KeyView>, prefix: &str, events: &[etcd_client::Event]) {
    for e in events {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_is_reconciled_after_the_settle_and_no_sooner_than_an_interval_after_the_last() {
        let pace = Pace {
            settle: Duration::from_millis(25),
            interval: Duration::from_millis(250),
        };
        let t0 = tokio::time::Instant::now();
        let ms = |n| Duration::from_millis(n);
        // A quiet lock: the settle alone.
        assert_eq!(pace.due(t0 + ms(1000), t0), t0 + ms(1025));
        // A busy lock: the interval since the last trigger.
        assert_eq!(pace.due(t0 + ms(30), t0), t0 + ms(250));
        assert_eq!(pace.due(t0 + ms(240), t0), t0 + ms(265), "the settle still holds");
        assert_eq!(
            Pace::default(),
            Pace {
                settle: SETTLE,
                interval: INTERVAL
            }
        );
    }
}
