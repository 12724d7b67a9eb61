//! The controller's own status writes that its lock watch has not shown yet.
//!
//! A claim event can start a reconcile before the watch delivers the status this
//! controller just wrote; deciding from the cached lock would then be deciding from a
//! state already replaced, and the write would fail on its resourceVersion and cost a
//! re-read. The written object is at least as fresh as the cache while the cache still
//! shows the version it replaced, so a reconcile starts from it then.

use std::collections::HashMap;
use std::sync::Mutex;

use kube::ResourceExt;

use crate::api::DistributedLock;

/// Per lock: the resourceVersion a write replaced, and the object it wrote.
#[derive(Default)]
pub struct Written(Mutex<HashMap<(String, String), (String, DistributedLock)>>);

fn key(lock: &DistributedLock) -> (String, String) {
    (lock.namespace().unwrap_or_default(), lock.name_any())
}

impl Written {
    /// The freshest known state of `cached`: this controller's write over it, if the
    /// cache still shows the version that write replaced; otherwise `cached` itself
    /// (and the record of the write is dropped, the cache having moved on).
    pub fn fresher(&self, cached: &DistributedLock) -> DistributedLock {
        let mut map = self.0.lock().expect("written lock poisoned");
        let k = key(cached);
        match map.get(&k) {
            Some((replaced, written)) if cached.metadata.resource_version.as_ref() == Some(replaced) => written.clone(),
            Some(_) => {
                map.remove(&k);
                cached.clone()
            }
            None => cached.clone(),
        }
    }

    /// Remember that `written` replaced the version `replaced` of its lock.
    pub fn record(&self, replaced: Option<String>, written: DistributedLock) {
        let mut map = self.0.lock().expect("written lock poisoned");
        match replaced {
            Some(rv) => map.insert(key(&written), (rv, written)),
            None => map.remove(&key(&written)),
        };
    }

    /// Forget a lock (deleted).
    pub fn forget(&self, lock: &DistributedLock) {
        self.0.lock().expect("written lock poisoned").remove(&key(lock));
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
    fn a_forgotten_lock_has_no_record() {
        let w = Written::default();
        w.record(Some("1".into()), lock("2", 1));
        w.forget(&lock("1", 0));
        assert_eq!(w.fresher(&lock("1", 0)).metadata.resource_version.as_deref(), Some("1"));
    }
}
