//! The controller's own writes that its watches have not shown yet: status writes, and
//! claim deletions.
//!
//! A claim event can start a reconcile before the watch delivers the status this
//! controller just wrote; deciding from the cached lock would then be deciding from a
//! state already replaced, and the write would fail on its resourceVersion and cost a
//! re-read. The written object is at least as fresh as the cache while the cache still
//! shows the version it replaced, so a reconcile starts from it then.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kube::ResourceExt;

use crate::api::DistributedLock;

/// How long a claim deletion is taken to be under way before it is sent again (the claim
/// still showing then means it failed or was lost).
pub const DELETE_RETRY: Duration = Duration::from_secs(5);

/// How long a claim deletion the API server answered is remembered: a claim the watch
/// still shows after that is deleted again (one 404 at worst).
pub const DELETED_MEMORY: Duration = Duration::from_secs(30);

/// Per lock: the resourceVersion a write replaced, and the object it wrote; per claim
/// (namespace, name): when its deletion was sent, and whether the API server took it.
#[derive(Default)]
pub struct Written {
    statuses: Mutex<HashMap<(String, String), (String, DistributedLock)>>,
    deletes: Mutex<Deletes>,
}

/// The claim deletions sent, and when the memory was last pruned: at most once per
/// [`PRUNE_EVERY`], not per call (at 250 grants/s a per-call sweep of 30 s of deletions
/// was 17 % of the controller's CPU, by `perf`).
#[derive(Default)]
struct Deletes {
    sent: HashMap<(String, String), (Instant, bool)>,
    pruned: Option<Instant>,
}

/// How often the deletion memory drops entries older than [`DELETED_MEMORY`].
const PRUNE_EVERY: Duration = Duration::from_secs(1);

fn key(lock: &DistributedLock) -> (String, String) {
    (lock.namespace().unwrap_or_default(), lock.name_any())
}

/// The write `record` holds, if it was made over the version `cached` shows.
fn over<'a>(record: Option<&'a (String, DistributedLock)>, cached: &DistributedLock) -> Option<&'a DistributedLock> {
    record
        .filter(|(replaced, _)| cached.metadata.resource_version.as_ref() == Some(replaced))
        .map(|(_, written)| written)
}

impl Written {
    /// The freshest known state of `cached`: this controller's write over it, if the
    /// cache still shows the version that write replaced; otherwise `cached` itself
    /// (and the record of the write is dropped, the cache having moved on).
    pub fn fresher(&self, cached: &DistributedLock) -> DistributedLock {
        let mut map = self.statuses.lock().expect("written lock poisoned");
        let k = key(cached);
        if let Some(written) = over(map.get(&k), cached) {
            return written.clone();
        }
        map.remove(&k);
        cached.clone()
    }

    /// [`Written::fresher`] without dropping a record the cache has moved past: for
    /// readers that must not change what the reconciles see (release notices, which
    /// anyone may send).
    pub fn peek(&self, cached: &DistributedLock) -> DistributedLock {
        let map = self.statuses.lock().expect("written lock poisoned");
        over(map.get(&key(cached)), cached).unwrap_or(cached).clone()
    }

    /// Remember that `written` replaced the version `replaced` of its lock.
    pub fn record(&self, replaced: Option<String>, written: DistributedLock) {
        let mut map = self.statuses.lock().expect("written lock poisoned");
        match replaced {
            Some(rv) => map.insert(key(&written), (rv, written)),
            None => map.remove(&key(&written)),
        };
    }

    /// Whether to send the deletion of claim `name` in `ns` now (every reconcile until
    /// the watch shows the claim gone plans its deletion again): not once the API server
    /// took one (for [`DELETED_MEMORY`]: a lagging watch costs no second DELETE), nor
    /// while one sent less than [`DELETE_RETRY`] ago may still be under way. Records
    /// the send.
    pub fn delete_now(&self, ns: &str, name: &str, now: Instant) -> bool {
        let mut deletes = self.deletes.lock().expect("written lock poisoned");
        let age = |at: &Instant| now.saturating_duration_since(*at);
        if deletes.pruned.is_none_or(|p| age(&p) >= PRUNE_EVERY) {
            deletes.sent.retain(|_, (at, _)| age(at) < DELETED_MEMORY);
            deletes.pruned = Some(now);
        }
        let key = (ns.to_string(), name.to_string());
        match deletes.sent.get(&key) {
            Some((at, true)) if age(at) < DELETED_MEMORY => false,
            Some((at, false)) if age(at) < DELETE_RETRY => false,
            _ => {
                deletes.sent.insert(key, (now, false));
                true
            }
        }
    }

    /// Whether this controller sent the deletion of claim `name` in `ns` (and it has not
    /// failed): the claim is on its way out.
    pub fn deleting(&self, ns: &str, name: &str) -> bool {
        let deletes = self.deletes.lock().expect("written lock poisoned");
        deletes.sent.contains_key(&(ns.to_string(), name.to_string()))
    }

    /// The API server took a deletion (or the claim was gone already).
    pub fn delete_done(&self, ns: &str, name: &str) {
        let mut deletes = self.deletes.lock().expect("written lock poisoned");
        if let Some(entry) = deletes.sent.get_mut(&(ns.to_string(), name.to_string())) {
            entry.1 = true;
        }
    }

    /// A deletion sent failed: the next reconcile sends it again.
    pub fn delete_failed(&self, ns: &str, name: &str) {
        let mut deletes = self.deletes.lock().expect("written lock poisoned");
        deletes.sent.remove(&(ns.to_string(), name.to_string()));
    }

    /// Whether `seen` is the very object this controller last wrote (its watch showing
    /// that write): it holds no news, and reconciling it again would decide the same.
    pub fn is_own(&self, seen: &DistributedLock) -> bool {
        let map = self.statuses.lock().expect("written lock poisoned");
        map.get(&key(seen)).is_some_and(|(_, written)| {
            written.metadata.resource_version.is_some()
                && written.metadata.resource_version == seen.metadata.resource_version
        })
    }

    /// Whether the lock `ns`/`name` as this controller last wrote it (while its lock
    /// watch has not shown that write yet) satisfies `pred`.
    pub fn last_written_is(&self, ns: &str, name: &str, pred: impl Fn(&DistributedLock) -> bool) -> bool {
        let map = self.statuses.lock().expect("written lock poisoned");
        map.get(&(ns.to_string(), name.to_string()))
            .is_some_and(|(_, l)| pred(l))
    }

    /// Forget a lock (deleted).
    pub fn forget(&self, lock: &DistributedLock) {
        self.statuses.lock().expect("written lock poisoned").remove(&key(lock));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::DistributedLockSpec;

    fn lock(rv: &str, holders: usize) -> DistributedLock {
        let mut l = DistributedLock::new(
            "l",
            DistributedLockSpec {
                lease_duration_seconds: 15,
                max_holders: 1,
                backend: None,
                max_queue: None,
            },
        );
        l.metadata.namespace = Some("ns".into());
        l.metadata.resource_version = Some(rv.into());
        l.status = Some(crate::api::DistributedLockStatus {
            fencing_token: holders as i64,
            ..Default::default()
        });
        l
    }

    #[test]
    fn a_stale_cache_yields_the_written_object_and_a_caught_up_one_itself() {
        let w = Written::default();
        w.record(Some("1".into()), lock("2", 1));
        assert_eq!(w.fresher(&lock("1", 0)).metadata.resource_version.as_deref(), Some("2"));
        // The cache caught up (or someone else wrote): the cache wins, the record goes.
        assert_eq!(w.fresher(&lock("3", 5)).metadata.resource_version.as_deref(), Some("3"));
        assert_eq!(w.fresher(&lock("1", 0)).metadata.resource_version.as_deref(), Some("1"));
    }

    #[test]
    fn only_the_object_last_written_is_ones_own() {
        let w = Written::default();
        assert!(!w.is_own(&lock("2", 1)));
        w.record(Some("1".into()), lock("2", 1));
        assert!(w.is_own(&lock("2", 1)));
        assert!(!w.is_own(&lock("1", 0)), "the version the write replaced");
        assert!(!w.is_own(&lock("3", 1)), "someone's write after ours");
        let mut elsewhere = lock("2", 1);
        elsewhere.metadata.namespace = Some("other".into());
        assert!(!w.is_own(&elsewhere), "another namespace's lock");
        let mut no_version = lock("", 1);
        no_version.metadata.resource_version = None;
        w.record(Some("5".into()), no_version.clone());
        assert!(!w.is_own(&no_version), "an object without a version is nobody's write");
    }

    #[test]
    fn a_claim_deletion_is_sent_once_until_it_may_have_failed() {
        let w = Written::default();
        let t0 = Instant::now();
        assert!(w.delete_now("ns", "c", t0));
        assert!(
            !w.delete_now("ns", "c", t0 + Duration::from_millis(10)),
            "sent again at once"
        );
        assert!(w.delete_now("ns", "other", t0), "another claim is another deletion");
        assert!(
            w.delete_now("ns", "c", t0 + DELETE_RETRY),
            "retried once it may have failed"
        );
    }

    #[test]
    fn the_deletion_memory_forgets_old_deletions_without_a_sweep_per_call() {
        let w = Written::default();
        let t0 = Instant::now();
        for i in 0..1000 {
            assert!(w.delete_now("ns", &format!("c{i}"), t0));
        }
        let size = || w.deletes.lock().unwrap().sent.len();
        assert!(w.delete_now("ns", "soon", t0 + PRUNE_EVERY / 2));
        assert_eq!(size(), 1001, "no sweep within a second of the last");
        assert!(w.delete_now("ns", "late", t0 + DELETED_MEMORY + PRUNE_EVERY));
        assert_eq!(size(), 1, "old ones forgotten at the next sweep");
    }

    #[test]
    fn a_deletion_the_api_server_took_is_not_sent_again_while_the_watch_lags() {
        let w = Written::default();
        let t0 = Instant::now();
        assert!(w.delete_now("ns", "c", t0));
        w.delete_done("ns", "c");
        assert!(
            !w.delete_now("ns", "c", t0 + 4 * DELETE_RETRY),
            "taken: no second DELETE"
        );
        assert!(
            w.delete_now("ns", "c", t0 + DELETED_MEMORY),
            "remembered for a while, not for ever"
        );
        // A failed one is retried by the next reconcile.
        w.delete_failed("ns", "c");
        assert!(w.delete_now("ns", "c", t0 + DELETED_MEMORY));
    }

    #[test]
    fn a_forgotten_lock_has_no_record() {
        let w = Written::default();
        w.record(Some("1".into()), lock("2", 1));
        w.forget(&lock("1", 0));
        assert_eq!(w.fresher(&lock("1", 0)).metadata.resource_version.as_deref(), Some("1"));
    }
}
