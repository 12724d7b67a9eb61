//! The controller's memory, on its own monotonic clock: when it last saw each claim
//! change, the order in which it first saw claims, when it first saw each revocation,
//! and which warnings it already published.
//!
//! A claim's expiry is judged from the moment *this controller* saw its last change
//! (any new resourceVersion), never from the renewTime another machine wrote. After a
//! restart every claim counts as freshly renewed, which only delays expiry (safe).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;

use crate::decide::Arrival;
use crate::protocol::timing;

/// (namespace, name) of a namespaced object.
pub type Key = (String, String);

/// What the controller saw of one claim.
#[derive(Clone, Debug)]
struct Seen {
    resource_version: String,
    changed_at: Instant,
    seq: u64,
    uid: String,
    /// The relist generation in which the claim was last listed or changed.
    epoch: u64,
}

/// The controller's memory of claims and revocations, fed by the watch streams.
#[derive(Debug, Default)]
pub struct Tracker {
    claims: HashMap<Key, Seen>,
    next_seq: u64,
    /// Counts relists of the claim watch; claims not seen in the latest are forgotten.
    epoch: u64,
    /// (namespace, lock, claim) -> when this controller first saw it revoked.
    revoked: HashMap<(String, String, String), Instant>,
    /// Warnings already published, by (object uid, reason): each is said once.
    warned: HashSet<(String, &'static str)>,
}

// === impl Tracker ===

impl Tracker {
    /// Record a claim seen in a watch event (or a list); a new resourceVersion
    /// counts as a renewal seen now.
    pub fn observe(&mut self, lease: &Lease, now: Instant) {
        let key = (lease.namespace().unwrap_or_default(), lease.name_any());
        let rv = lease.resource_version().unwrap_or_default();
        let epoch = self.epoch;
        match self.claims.get_mut(&key) {
            Some(seen) if seen.resource_version == rv => seen.epoch = epoch,
            Some(seen) => {
                seen.resource_version = rv;
                seen.changed_at = now;
                seen.epoch = epoch;
            }
            None => {
                self.next_seq += 1;
                let seen = Seen {
                    resource_version: rv,
                    changed_at: now,
                    seq: self.next_seq,
                    uid: lease.uid().unwrap_or_default(),
                    epoch,
                };
                self.claims.insert(key, seen);
            }
        }
    }

    /// Forget a deleted claim, and the warnings said about it.
    pub fn forget(&mut self, lease: &Lease) {
        let key = (lease.namespace().unwrap_or_default(), lease.name_any());
        if let Some(seen) = self.claims.remove(&key) {
            self.warned.retain(|(uid, _)| uid != &seen.uid);
        }
    }

    /// The claim watch starts a relist: claims it does not list again were deleted
    /// while the watch was down.
    pub fn relist_started(&mut self) {
        self.epoch += 1;
    }

    /// The relist is complete: forget the claims it did not list.
    pub fn relist_done(&mut self) {
        let epoch = self.epoch;
        let gone: Vec<String> = self
            .claims
            .values()
            .filter(|s| s.epoch != epoch)
            .map(|s| s.uid.clone())
            .collect();
        self.claims.retain(|_, s| s.epoch == epoch);
        self.warned.retain(|(uid, _)| !gone.contains(uid));
    }

    /// When a claim's lease (plus grace) runs out, judged from its last seen change.
    pub fn expires_at(&mut self, lease: &Lease, spec: Duration, own: Duration, now: Instant) -> Instant {
        self.observe(lease, now);
        timing::controller_expiry(self.changed_at(lease), spec, own)
    }

    /// When this controller last saw the claim change (now, if never seen).
    pub fn changed_at(&self, lease: &Lease) -> Instant {
        let key = (lease.namespace().unwrap_or_default(), lease.name_any());
        self.claims.get(&key).map_or_else(Instant::now, |s| s.changed_at)
    }

    /// The claim's arrival key, for FIFO order among claims not yet queued.
    pub fn arrival(&self, lease: &Lease) -> Arrival {
        let key = (lease.namespace().unwrap_or_default(), lease.name_any());
        Arrival {
            created_secs: lease.creation_timestamp().map(|t| t.0.as_second()).unwrap_or_default(),
            seen_seq: self.claims.get(&key).map(|s| s.seq).unwrap_or(u64::MAX),
        }
    }

    /// When a revoked holder's hold-back delay ends: one lease duration plus grace
    /// after this controller first saw the revocation.
    pub fn hold_back_ends(&mut self, ns: &str, lock: &str, claim: &str, duration: Duration, now: Instant) -> Instant {
        let first = *self
            .revoked
            .entry((ns.into(), lock.into(), claim.into()))
            .or_insert(now);
        timing::hold_back_ends(first, duration)
    }

    /// Drop revocation memories of a lock that are no longer in its status.
    pub fn retain_revoked(&mut self, ns: &str, lock: &str, still: &BTreeSet<String>) {
        self.revoked
            .retain(|(n, l, c), _| !(n == ns && l == lock) || still.contains(c));
    }

    /// True the first time a warning of this reason is raised for this object.
    pub fn first_warning(&mut self, uid: &str, reason: &'static str) -> bool {
        self.warned.insert((uid.to_string(), reason))
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn claim(name: &str, rv: &str) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                uid: Some(format!("uid-{name}")),
                resource_version: Some(rv.into()),
                ..Default::default()
            },
            spec: None,
        }
    }

    #[test]
    fn a_new_resource_version_counts_as_a_renewal_seen_now() {
        let mut t = Tracker::default();
        let t0 = Instant::now();
        t.observe(&claim("a", "1"), t0);
        t.observe(&claim("a", "1"), t0 + Duration::from_secs(5));
        assert_eq!(t.changed_at(&claim("a", "1")), t0, "the same version is no renewal");
        t.observe(&claim("a", "2"), t0 + Duration::from_secs(6));
        assert_eq!(t.changed_at(&claim("a", "2")), t0 + Duration::from_secs(6));
    }

    #[test]
    fn a_relist_forgets_claims_deleted_while_the_watch_was_down() {
        let mut t = Tracker::default();
        let t0 = Instant::now();
        t.observe(&claim("a", "1"), t0);
        t.observe(&claim("b", "1"), t0);
        assert!(t.first_warning("uid-a", "InvalidClaim"));
        t.relist_started();
        t.observe(&claim("b", "1"), t0);
        t.relist_done();
        assert_eq!(t.arrival(&claim("a", "1")).seen_seq, u64::MAX, "a is forgotten");
        assert_eq!(t.arrival(&claim("b", "1")).seen_seq, 2, "b keeps its place");
        assert!(t.first_warning("uid-a", "InvalidClaim"), "a's warnings went with it");
    }

    #[test]
    fn forgetting_a_claim_prunes_its_warnings() {
        let mut t = Tracker::default();
        t.observe(&claim("a", "1"), Instant::now());
        assert!(t.first_warning("uid-a", "InvalidClaim"));
        assert!(!t.first_warning("uid-a", "InvalidClaim"));
        t.forget(&claim("a", "1"));
        assert!(t.first_warning("uid-a", "InvalidClaim"));
    }
}
