//! Claim Leases indexed by the lock they name and by their pod, kept from the claim
//! watch's events: a reconcile reads its own lock's claims, and a pod event finds the
//! locks its claims name, without scanning every claim in the cluster.

use std::collections::{BTreeSet, HashMap};

use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;
use kube::api::{DeleteParams, Preconditions};
use kube::runtime::watcher::Event;

use crate::controller::cache::relisted::Relisted;
use crate::protocol::claim;

/// (namespace, name).
type Key = (String, String);

#[derive(Default)]
struct Maps {
    /// Claim → (its lock, its pod).
    claims: HashMap<Key, (String, String)>,
    /// (namespace, lock) → its claims.
    by_lock: HashMap<Key, BTreeSet<String>>,
    /// (namespace, pod) → its claims.
    by_pod: HashMap<Key, BTreeSet<String>>,
}

impl Maps {
    fn insert(&mut self, lease: &Lease) {
        let (Some(ns), name) = (lease.namespace(), lease.name_any()) else {
            return;
        };
        self.remove(&ns, &name);
        let Some(lock) = claim::claim_lock(lease) else { return };
        let pod = lease
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.clone())
            .unwrap_or_default();
        self.by_lock
            .entry((ns.clone(), lock.to_string()))
            .or_default()
            .insert(name.clone());
        self.by_pod
            .entry((ns.clone(), pod.clone()))
            .or_default()
            .insert(name.clone());
        self.claims.insert((ns, name), (lock.to_string(), pod));
    }

    fn remove(&mut self, ns: &str, name: &str) {
        let Some((lock, pod)) = self.claims.remove(&(ns.to_string(), name.to_string())) else {
            return;
        };
        for (map, key) in [(&mut self.by_lock, lock), (&mut self.by_pod, pod)] {
            let key = (ns.to_string(), key);
            if let Some(set) = map.get_mut(&key) {
                set.remove(name);
                if set.is_empty() {
                    map.remove(&key);
                }
            }
        }
    }
}

/// The index; feed it every claim-watch event with [`ClaimIndex::apply`].
#[derive(Default)]
pub struct ClaimIndex(Relisted<Maps>);

impl ClaimIndex {
    /// Take in one watch event.
    pub fn apply(&self, event: &Event<Lease>) {
        let remove = |m: &mut Maps, l: &Lease| m.remove(&l.namespace().unwrap_or_default(), &l.name_any());
        self.0.apply(event, Maps::insert, remove);
    }

    /// The names of the claims that name lock `lock` in `ns`.
    pub fn of_lock(&self, ns: &str, lock: &str) -> Vec<String> {
        self.0.read(|maps| {
            let set = maps.by_lock.get(&(ns.to_string(), lock.to_string()));
            set.map(|s| s.iter().cloned().collect()).unwrap_or_default()
        })
    }

    /// Whether the first list of claims has been taken in (the claim store can be ready
    /// a moment before: it takes each event first).
    pub fn synced(&self) -> bool {
        self.0.synced()
    }

    /// The locks named by the claims of pod `pod` in `ns`.
    pub fn locks_of_pod(&self, ns: &str, pod: &str) -> Vec<String> {
        self.0.read(|maps| {
            let Some(claims) = maps.by_pod.get(&(ns.to_string(), pod.to_string())) else {
                return Vec::new();
            };
            let locks = claims
                .iter()
                .filter_map(|c| maps.claims.get(&(ns.to_string(), c.clone())));
            let mut out: Vec<String> = locks.map(|(lock, _)| lock.clone()).collect();
            out.sort();
            out.dedup();
            out
        })
    }
}

/// The deletion of a claim only as read (its UID and resourceVersion), so that a write
/// since (a renewal) makes it fail: how a claim is expired, and how a claim out of view
/// is taken away from a revoked holder.
pub fn delete_as_read(fresh: &Lease) -> DeleteParams {
    DeleteParams {
        preconditions: Some(Preconditions {
            resource_version: fresh.resource_version(),
            uid: fresh.uid(),
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::claim::{PodIdentity, claim_lease};

    fn lease(name: &str, lock: &str, pod: &str) -> Lease {
        let id = PodIdentity {
            name: pod.into(),
            namespace: "ns".into(),
            uid: format!("uid-{pod}"),
        };
        claim_lease(name, lock, &id, 10)
    }

    #[test]
    fn claims_are_found_by_lock_and_by_pod_and_forgotten_when_deleted() {
        let index = ClaimIndex::default();
        index.apply(&Event::Apply(lease("c1", "l1", "a")));
        index.apply(&Event::Apply(lease("c2", "l1", "b")));
        index.apply(&Event::Apply(lease("c3", "l2", "a")));
        assert_eq!(index.of_lock("ns", "l1"), ["c1", "c2"]);
        assert_eq!(index.locks_of_pod("ns", "a"), ["l1", "l2"]);
        assert!(index.of_lock("other", "l1").is_empty(), "namespaces are apart");
        index.apply(&Event::Delete(lease("c1", "l1", "a")));
        assert_eq!(index.of_lock("ns", "l1"), ["c2"]);
        assert_eq!(index.locks_of_pod("ns", "a"), ["l2"]);
    }

    #[test]
    fn a_relabelled_claim_moves_and_a_relist_drops_what_went_unseen() {
        let index = ClaimIndex::default();
        index.apply(&Event::Apply(lease("c1", "l1", "a")));
        index.apply(&Event::Apply(lease("c1", "l2", "a")));
        assert!(index.of_lock("ns", "l1").is_empty());
        assert_eq!(index.of_lock("ns", "l2"), ["c1"]);
        index.apply(&Event::Apply(lease("gone", "l2", "b")));
        // A relist that no longer shows `gone` (deleted while the watch was down).
        index.apply(&Event::Init);
        index.apply(&Event::InitApply(lease("c1", "l2", "a")));
        assert_eq!(
            index.of_lock("ns", "l2"),
            ["c1", "gone"],
            "the old view serves until the relist is done"
        );
        index.apply(&Event::InitDone);
        assert_eq!(index.of_lock("ns", "l2"), ["c1"]);
        assert!(index.locks_of_pod("ns", "b").is_empty());
    }

    #[test]
    fn a_deletion_takes_only_the_claim_as_read() {
        let fresh = Lease {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some("l-1".into()),
                uid: Some("uid-1".into()),
                resource_version: Some("42".into()),
                ..Default::default()
            },
            spec: None,
        };
        let body = serde_json::to_value(delete_as_read(&fresh)).unwrap();
        assert_eq!(body["preconditions"]["resourceVersion"], "42");
        assert_eq!(body["preconditions"]["uid"], "uid-1");
    }
}
