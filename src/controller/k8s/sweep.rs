//! Released claims leave in batches: one `deletecollection` per namespace sweeps every
//! claim carrying the [`RELEASED_LABEL`] its client set with the release mark, instead
//! of one DELETE per claim.
//!
//! A sweep may take a claim whose release this controller has not decided on yet (the
//! label is set by the client, so any released claim is fair game). Such a claim is
//! not lost: the claim watch shows its release and then its deletion, in order, and
//! [`Tombstones`] keep the last state of a claim deleted after it was seen with a
//! release mark, so the decide core still sees the mark (and judges it against the
//! hash recorded in status, as for a claim still there) until the lock's status no
//! longer names the claim. Without that memory (a relist, a restart) a holder's claim
//! found gone counts as force-released: its slot is held back one lease, which is
//! slower but safe.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams};

use crate::controller::cache::written::Written;
use crate::protocol::claim::{claim_lock, has_release_mark, keep_what_is_read};
use crate::protocol::timing::Moment;
use crate::protocol::{LOCK_LABEL, RELEASED_LABEL};

/// How long a sweep request waits for others to join it, and the least time between
/// two sweeps of a namespace. It also leaves the controller time to decide on a
/// release before its claim is swept, so the [`Tombstones`] are seldom needed.
pub const SWEEP_BATCH: Duration = Duration::from_secs(1);
/// How long a released claim's last state is remembered after its deletion at most.
pub const TOMBSTONE_MEMORY: Duration = Duration::from_secs(120);

/// (namespace, lock).
type LockKey = (String, String);
/// A claim's last state, and when its deletion was seen.
#[derive(Clone)]
struct Buried<T> {
    lease: Arc<Lease>,
    at: T,
    /// This controller deleted it as expired (see [`Tombstones::bury_expired`]).
    expired: bool,
}

/// A remembered claim: its last state, and whether this controller expired it.
pub type Tombstone = (Arc<Lease>, bool);

/// The last state of claims deleted after they were seen with a release mark, or
/// deleted by this controller as expired, by lock, on the clock `T`.
pub struct Tombstones<T = Instant>(Mutex<BTreeMap<LockKey, Vec<Buried<T>>>>);

impl<T> Default for Tombstones<T> {
    fn default() -> Self {
        Tombstones(Mutex::new(BTreeMap::new()))
    }
}

impl<T: Clone> Clone for Tombstones<T> {
    fn clone(&self) -> Self {
        Tombstones(Mutex::new(self.0.lock().expect("tombstones lock poisoned").clone()))
    }
}

/// Each remembered claim as its name, resourceVersion, whether it was expired, and
/// when it was buried: what the system model compares of two controllers' memories.
impl<T: std::fmt::Debug> std::fmt::Debug for Tombstones<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let map = self.0.lock().expect("tombstones lock poisoned");
        let digest = map.iter().map(|(k, list)| {
            let buried: Vec<_> = list
                .iter()
                .map(|b| (b.lease.name_any(), b.lease.resource_version(), b.expired, &b.at))
                .collect();
            (k, buried)
        });
        f.debug_map().entries(digest).finish()
    }
}

impl<T: Moment> Tombstones<T> {
    /// Every moment it remembers, mapped by `f` (see [`crate::controller::cache::tracker::Tracker::map_moments`]).
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn map_moments(&self, f: impl Fn(T) -> T) {
        let mut map = self.0.lock().expect("tombstones lock poisoned");
        map.values_mut().flatten().for_each(|b| b.at = f(b.at));
    }

    /// A claim was deleted (`lease`: its last state): remember it if it was released.
    pub fn bury(&self, lease: &Lease, now: T) {
        if has_release_mark(lease) {
            self.remember(lease, now, false);
        }
    }

    /// This controller deleted `lease` (its state as read just before) as expired: until
    /// its lock's status no longer names it, it counts as expired, not as a claim gone
    /// without word (which would hold a holder's slot back a lease).
    pub fn bury_expired(&self, lease: &Lease, now: T) {
        self.remember(lease, now, true);
    }

    fn remember(&self, lease: &Lease, now: T, expired: bool) {
        let (Some(ns), Some(lock)) = (lease.namespace(), claim_lock(lease)) else {
            return;
        };
        let mut map = self.0.lock().expect("tombstones lock poisoned");
        let list = map.entry((ns, lock.to_string())).or_default();
        if list.iter().any(|b| b.expired && b.lease.name_any() == lease.name_any()) {
            return; // expired by this controller: its own deletion's event changes nothing
        }
        list.retain(|b| b.lease.name_any() != lease.name_any());
        // Bounded as the claim cache's claims are: a claim read afresh before its
        // expiry is as a neighbour wrote it, padding included, and is kept a while.
        let mut kept = lease.clone();
        keep_what_is_read(&mut kept);
        list.push(Buried {
            lease: Arc::new(kept),
            at: now,
            expired,
        });
    }

    /// The remembered claims of a lock (forgetting those older than the memory).
    pub fn of_lock(&self, ns: &str, lock: &str, now: T) -> Vec<Tombstone> {
        let mut map = self.0.lock().expect("tombstones lock poisoned");
        let key = (ns.to_string(), lock.to_string());
        let Some(list) = map.get_mut(&key) else {
            return Vec::new();
        };
        list.retain(|b| now.since(b.at) < TOMBSTONE_MEMORY);
        let out = list.iter().map(|b| (b.lease.clone(), b.expired)).collect();
        if list.is_empty() {
            map.remove(&key);
        }
        out
    }

    /// After a status write: forget the lock's remembered claims it no longer names,
    /// except a claim this controller expired that the claim cache (`stored`) still
    /// holds: a watch that has not shown its deletion yet (stalled after an API server
    /// restart, say) would otherwise offer it as a new claim, and it would be queued.
    pub fn settle(&self, ns: &str, lock: &str, named: impl Fn(&str) -> bool, stored: impl Fn(&str) -> bool) {
        let mut map = self.0.lock().expect("tombstones lock poisoned");
        let key = (ns.to_string(), lock.to_string());
        if let Some(list) = map.get_mut(&key) {
            list.retain(|b| {
                let name = b.lease.name_any();
                named(&name) || (b.expired && stored(&name))
            });
            if list.is_empty() {
                map.remove(&key);
            }
        }
    }

    /// Whether no claim is remembered (a lock's list goes with its last claim).
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.0.lock().expect("tombstones lock poisoned").is_empty()
    }
}

/// Whether a claim is swept rather than deleted on its own: its client labelled it
/// released (clients before the label are deleted one by one).
pub fn sweepable(lease: &Lease) -> bool {
    lease.labels().contains_key(RELEASED_LABEL)
}

/// Batches the sweeps of each namespace: one at a time per namespace, each taking every
/// claim asked for until it starts, and telling [`Written`] which deletions were taken.
pub struct Sweeper {
    client: kube::Client,
    /// Per namespace with a sweep task: the claims asked for since its last sweep began.
    pending: Mutex<HashMap<String, BTreeSet<String>>>,
}

impl Sweeper {
    /// A sweeper writing through `client`.
    pub fn new(client: kube::Client) -> Self {
        Sweeper {
            client,
            pending: Mutex::default(),
        }
    }

    /// Sweep `ns` soon, deleting (among all released claims) `claim`.
    pub fn request(self: &Arc<Self>, ns: &str, claim: &str, written: &Arc<Written>) {
        let mut pending = self.pending.lock().expect("sweeper lock poisoned");
        if let Some(claims) = pending.get_mut(ns) {
            claims.insert(claim.to_string()); // the namespace's task takes it
            return;
        }
        pending.insert(ns.to_string(), BTreeSet::from([claim.to_string()]));
        let (me, ns, written) = (self.clone(), ns.to_string(), written.clone());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(SWEEP_BATCH).await; // let others join this sweep
                let asked = {
                    let mut pending = me.pending.lock().expect("sweeper lock poisoned");
                    let asked = pending.get_mut(&ns).map(std::mem::take).unwrap_or_default();
                    if asked.is_empty() {
                        pending.remove(&ns);
                        return;
                    }
                    asked
                };
                me.sweep(&ns, &asked, &written).await;
            }
        });
    }

    async fn sweep(&self, ns: &str, asked: &BTreeSet<String>, written: &Written) {
        match self.delete_released(ns).await {
            Ok(taken) => {
                tracing::debug!(namespace = ns, swept = taken.len(), "swept released claims");
                for claim in asked {
                    if taken.contains(claim) {
                        written.delete_done(ns, claim);
                    } else {
                        written.delete_failed(ns, claim); // not there, or not yet: look again
                    }
                }
            }
            Err(e) => {
                tracing::warn!(namespace = ns, error = %e, "sweeping released claims failed; will retry");
                asked.iter().for_each(|c| written.delete_failed(ns, c));
            }
        }
    }

    /// One `deletecollection` of the namespace's released claims; the names it deleted.
    /// (The API server lists the namespace's Leases from etcd for it: a list from its
    /// watch cache, `resourceVersion=0`, becomes a precondition on every deletion in
    /// v1.20 and fails them all. Hence the batching: one such list per [`SWEEP_BATCH`]
    /// and namespace at most.)
    async fn delete_released(&self, ns: &str) -> Result<BTreeSet<String>, kube::Error> {
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), ns);
        // Claims only: a Lease someone else labelled released is no claim to sweep.
        let list = ListParams::default().labels(&format!("{LOCK_LABEL},{RELEASED_LABEL}"));
        let deleted = leases.delete_collection(&DeleteParams::default(), &list).await?;
        Ok(deleted
            .left()
            .map(|l| l.items.iter().map(|l| l.name_any()).collect())
            .unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;
    use crate::protocol::{LOCK_LABEL, RELEASED_ANNOTATION};

    fn claim(name: &str, released: bool) -> Lease {
        let mut annotations = BTreeMap::new();
        if released {
            annotations.insert(RELEASED_ANNOTATION.to_string(), "secret".to_string());
        }
        Lease {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                labels: Some(BTreeMap::from([(LOCK_LABEL.to_string(), "l".to_string())])),
                annotations: Some(annotations),
                ..Default::default()
            },
            spec: None,
        }
    }

    fn names(list: &[Tombstone]) -> Vec<String> {
        list.iter().map(|(l, _)| l.name_any()).collect()
    }

    #[test]
    fn a_claim_expired_by_this_controller_stays_expired_whatever_its_deletion_event_shows() {
        let t = Tombstones::default();
        let now = Instant::now();
        t.bury_expired(&claim("a", false), now);
        t.bury(&claim("a", true), now); // its deletion seen later: no change
        let list = t.of_lock("ns", "l", now);
        assert_eq!(names(&list), ["a"]);
        assert!(list[0].1, "counted as expired");
        assert!(
            !list[0].0.annotations().contains_key(RELEASED_ANNOTATION),
            "the state read before deleting"
        );
        t.settle("ns", "l", |_| false, |_| true);
        assert_eq!(
            names(&t.of_lock("ns", "l", now)),
            ["a"],
            "while the claim cache still holds it, it stays expired, never a new claim"
        );
        t.settle("ns", "l", |_| false, |_| false);
        assert!(t.is_empty());
    }

    #[test]
    fn a_buried_claim_keeps_only_what_the_controller_reads() {
        let t = Tombstones::default();
        let now = Instant::now();
        let mut padded = claim("a", true);
        let pad = "x".repeat(200 * 1024);
        padded.annotations_mut().insert("example.com/pad".into(), pad.clone());
        padded.labels_mut().insert("example.com/pad".into(), "x".into());
        padded.metadata.finalizers = Some(vec![pad]);
        t.bury_expired(&padded, now);
        let list = t.of_lock("ns", "l", now);
        let kept = serde_json::to_vec(&*list[0].0).unwrap();
        assert!(kept.len() < 1024, "a buried claim of {} bytes kept", kept.len());
        assert!(
            list[0].0.annotations().contains_key(RELEASED_ANNOTATION),
            "what the controller reads is kept"
        );
    }

    #[test]
    fn only_a_claim_deleted_with_a_release_mark_is_remembered() {
        let t = Tombstones::default();
        let now = Instant::now();
        t.bury(&claim("a", true), now);
        t.bury(&claim("b", false), now);
        assert_eq!(names(&t.of_lock("ns", "l", now)), ["a"]);
        assert!(t.of_lock("ns", "other", now).is_empty());
        assert!(t.of_lock("other", "l", now).is_empty());
    }

    #[test]
    fn a_remembered_claim_is_forgotten_once_status_no_longer_names_it() {
        let t = Tombstones::default();
        let now = Instant::now();
        t.bury(&claim("a", true), now);
        t.bury(&claim("b", true), now);
        t.bury(&claim("b", true), now); // the same deletion seen twice: once
        t.settle("ns", "l", |c| c == "b", |_| true);
        assert_eq!(
            names(&t.of_lock("ns", "l", now)),
            ["b"],
            "a released claim goes even if cached"
        );
        t.settle("ns", "l", |_| false, |_| true);
        assert!(t.is_empty());
    }

    #[test]
    fn a_remembered_claim_is_forgotten_after_the_memory_at_the_latest() {
        let t = Tombstones::default();
        let now = Instant::now();
        t.bury(&claim("a", true), now);
        assert_eq!(t.of_lock("ns", "l", now + TOMBSTONE_MEMORY / 2).len(), 1);
        assert!(t.of_lock("ns", "l", now + TOMBSTONE_MEMORY).is_empty());
        assert!(t.is_empty(), "nothing kept for a lock nobody asks about again");
    }

    #[test]
    fn only_a_claim_its_client_labelled_released_is_swept() {
        let mut labelled = claim("a", true);
        labelled
            .labels_mut()
            .insert(RELEASED_LABEL.to_string(), "true".to_string());
        assert!(sweepable(&labelled));
        assert!(
            !sweepable(&claim("b", true)),
            "an older client's release: deleted on its own"
        );
    }
}
