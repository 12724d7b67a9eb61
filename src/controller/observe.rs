//! Observation: what the controller has seen of claims, on its own monotonic clock,
//! and the translation of stored objects into the decide core's inputs.
//!
//! A claim's expiry is judged from the moment *this controller* saw its last change
//! (any new resourceVersion), never from the renewTime another machine wrote. After a
//! restart every claim counts as freshly renewed, which only delays expiry (safe).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::runtime::reflector::Store;

use crate::api::{DistributedLock, LOCK_LABEL, POD_UID_ANNOTATION, RELEASED_ANNOTATION};
use crate::decide::{Arrival, ClaimView, PodView};

/// Extra time, beyond the lease duration, before the controller judges a claim
/// expired or a held-back slot free. Covers scheduling delays and clock-rate drift.
pub const EXPIRY_GRACE: Duration = Duration::from_secs(2);

/// (namespace, name) of a namespaced object.
pub type Key = (String, String);

/// What the controller saw of one claim.
#[derive(Clone, Debug)]
struct Seen {
    resource_version: String,
    changed_at: Instant,
    seq: u64,
}

/// The controller's memory of claims and revocations, fed by the watch streams.
#[derive(Debug, Default)]
pub struct Tracker {
    claims: HashMap<Key, Seen>,
    next_seq: u64,
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
        match self.claims.get_mut(&key) {
            Some(seen) if seen.resource_version == rv => {}
            Some(seen) => {
                seen.resource_version = rv;
                seen.changed_at = now;
            }
            None => {
                self.next_seq += 1;
                self.claims.insert(
                    key,
                    Seen {
                        resource_version: rv,
                        changed_at: now,
                        seq: self.next_seq,
                    },
                );
            }
        }
    }

    /// Forget a deleted claim.
    pub fn forget(&mut self, lease: &Lease) {
        self.claims
            .remove(&(lease.namespace().unwrap_or_default(), lease.name_any()));
    }

    /// When a claim's lease (plus grace) runs out, judged from its last seen change.
    pub fn expires_at(&mut self, lease: &Lease, duration: Duration, now: Instant) -> Instant {
        self.observe(lease, now);
        self.changed_at(lease) + duration + EXPIRY_GRACE
    }

    /// When this controller last saw the claim change (now, if never seen).
    pub fn changed_at(&self, lease: &Lease) -> Instant {
        let key = (lease.namespace().unwrap_or_default(), lease.name_any());
        self.claims.get(&key).map_or_else(Instant::now, |s| s.changed_at)
    }

    fn arrival(&self, lease: &Lease) -> Arrival {
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
        first + duration + EXPIRY_GRACE
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

/// Why a claim Lease is malformed, for a Warning event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadClaim {
    /// No `spec.holderIdentity` naming the pod.
    NoHolder,
    /// No `leasehold.dev/pod-uid` annotation.
    NoPodUid,
    /// No ownerReference to its Pod with that name and UID.
    NoPodOwner,
}

impl BadClaim {
    /// A human explanation.
    pub fn message(self) -> &'static str {
        match self {
            Self::NoHolder => "claim has no spec.holderIdentity naming its pod",
            Self::NoPodUid => "claim has no leasehold.dev/pod-uid annotation",
            Self::NoPodOwner => "claim has no ownerReference to its Pod (kind Pod, matching name and uid)",
        }
    }
}

/// Check a claim's shape; return its (pod, pod UID).
pub fn validate_claim(lease: &Lease) -> Result<(String, String), BadClaim> {
    let pod = lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.clone())
        .filter(|p| !p.is_empty());
    let pod = pod.ok_or(BadClaim::NoHolder)?;
    let uid = lease
        .annotations()
        .get(POD_UID_ANNOTATION)
        .cloned()
        .filter(|u| !u.is_empty());
    let uid = uid.ok_or(BadClaim::NoPodUid)?;
    let owned = lease
        .owner_references()
        .iter()
        .any(|o| o.kind == "Pod" && o.name == pod && o.uid == uid);
    if !owned {
        return Err(BadClaim::NoPodOwner);
    }
    Ok((pod, uid))
}

/// The lock a claim asks for, by its label.
pub fn claim_lock(lease: &Lease) -> Option<&str> {
    lease
        .labels()
        .get(LOCK_LABEL)
        .map(String::as_str)
        .filter(|l| !l.is_empty())
}

/// The claims of one lock, from the store.
pub fn claims_of(store: &Store<Lease>, lock: &DistributedLock) -> Vec<std::sync::Arc<Lease>> {
    let (ns, name) = (lock.namespace(), lock.name_any());
    store
        .state()
        .into_iter()
        .filter(|l| l.namespace() == ns && claim_lock(l) == Some(name.as_str()))
        .collect()
}

/// One claim turned into the decide core's view.
pub fn claim_view(lease: &Lease, pod: String, pod_uid: String, expired: bool, tracker: &Tracker) -> ClaimView {
    ClaimView {
        name: lease.name_any(),
        pod,
        pod_uid,
        arrival: tracker.arrival(lease),
        released: lease
            .annotations()
            .get(RELEASED_ANNOTATION)
            .is_some_and(|v| v == "true"),
        expired,
    }
}

/// What the pod store knows of the named pods in one namespace.
pub fn pod_views<'a>(store: &Store<Pod>, ns: &str, names: impl Iterator<Item = &'a str>) -> BTreeMap<String, PodView> {
    let mut out = BTreeMap::new();
    for name in names {
        let key = kube::runtime::reflector::ObjectRef::new(name).within(ns);
        if let Some(pod) = store.get(&key) {
            let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
            let finished = matches!(phase, Some("Succeeded" | "Failed"));
            out.insert(
                name.to_string(),
                PodView {
                    uid: pod.uid().unwrap_or_default(),
                    finished,
                },
            );
        }
    }
    out
}

/// Strip a pod down to what the controller needs (name, namespace, uid, phase), so
/// the cluster-wide pod cache stays small.
pub fn slim_pod(pod: &mut Pod) {
    pod.spec = None;
    pod.metadata.managed_fields = None;
    pod.metadata.annotations = None;
    pod.metadata.labels = None;
    if let Some(status) = pod.status.as_mut() {
        *status = k8s_openapi::api::core::v1::PodStatus {
            phase: status.phase.take(),
            ..Default::default()
        };
    }
}
