//! The etcd backend's rules, pure: when a claim holds (client), and how the
//! controller mirrors a lock's keys into status and which keys it takes away.
//!
//! Grants are etcd's order, not the controller's: the first `maxHolders` keys by create
//! revision hold. The controller only reports them and revokes claims of pods that are
//! gone, by the fenced-handoff rule of [`crate::decide::pod_liveness`]:
//! * a pod certainly stopped (finished, or gone after the kubelet reported its
//!   containers stopped): its key is deleted, and the slot or place passes on at once;
//! * a pod gone or replaced with nothing saying its process stopped: its key, holder
//!   or waiter alike, is moved onto a controller lease of
//!   [`crate::protocol::timing::etcd_hold_back_ttl`]. It keeps its
//!   place, so a waiter behind it is not granted before that process has stopped. (A
//!   waiter is held back too: unlike the Kubernetes backend, where the controller
//!   grants, an etcd waiter grants itself the moment the keys ahead are gone.)
//! * a key whose value is no claim (written by something else) is held back the same
//!   way, so it cannot block the lock for ever.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::keys::ClaimValue;
use crate::api::{DistributedLockSpec, DistributedLockStatus, Holder, Revocation, RevokeReason, Waiter};
use crate::decide::{Liveness, PodView, StoppedPods, pod_liveness};
use crate::protocol::timing::etcd_hold_back_ttl;

/// Client: whether a claim with `ahead` keys created before it holds the lock.
pub fn holds(ahead: i64, max_holders: i32) -> bool {
    ahead < i64::from(max_holders.max(1))
}

/// Client: what a waiting claim watches to learn that it may hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WakeOn {
    /// Next in line (exactly `maxHolders` keys ahead): the lock's whole prefix, tracking
    /// every key ahead ([`track_ahead`]), so it holds at the very event that frees its
    /// slot, with no read after it (beside other keys, a semaphore's waiter reads its
    /// keys and the lock's `maxHolders` again first). One waiter of a mutex watches so.
    Tracking,
    /// A mutex's waiter further back: the key second nearest ahead. It cannot hold
    /// while that key exists, and when it goes the waiter is usually next in line: it
    /// reads again (a short while later, or at once should the key next ahead go,
    /// which it watches too) and tracks, before the release it waits for. One waiter
    /// woken per release.
    SecondAhead,
    /// A semaphore's waiter further back: any deletion among the lock's keys (any key
    /// ahead going may free a slot for it).
    AnyDeletion,
}

/// Client: what a waiting claim of a lock with `max_holders` watches, with `ahead` keys
/// ahead of it (more than it may hold beside).
pub fn wake_on(ahead: i64, max_holders: i32) -> WakeOn {
    let max = i64::from(max_holders.max(1));
    if ahead <= max {
        WakeOn::Tracking
    } else if max == 1 {
        WakeOn::SecondAhead
    } else {
        WakeOn::AnyDeletion
    }
}

/// Client: one change to a lock's keys, as a watch on its prefix shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyChange<'a> {
    /// A key written (created, or moved onto another lease).
    Put(&'a [u8]),
    /// A key deleted (by its client, its lease's end, or the controller).
    Delete(&'a [u8]),
}

/// Client: what a waiter tracking every key ahead of it learns from one watch response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tracked {
    /// Fewer than `maxHolders` keys are ahead, and its own key is as it was: it holds.
    Holds,
    /// Its own key was moved or deleted by someone else: the claim is lost.
    Lost,
    /// Still waiting.
    Waiting,
}

/// Client: apply one watch response (etcd never splits a revision's events) to `ahead`,
/// the keys created before the waiter's `own` key, as read when the watch began. The
/// watch is one watch on the lock's prefix, so its events come in revision order and
/// none is missed: after them `ahead` is exactly the keys ahead at that revision (a key
/// created later is behind), and its own key untouched means still on its own lease.
pub fn track_ahead<'a>(
    ahead: &mut BTreeSet<Vec<u8>>,
    own: &[u8],
    changes: impl IntoIterator<Item = KeyChange<'a>>,
    max_holders: i32,
) -> Tracked {
    let mut changed = false;
    for change in changes {
        changed = true;
        match change {
            KeyChange::Put(key) | KeyChange::Delete(key) if key == own => return Tracked::Lost,
            KeyChange::Delete(key) => {
                ahead.remove(key);
            }
            KeyChange::Put(_) => {}
        }
    }
    if changed && holds(ahead.len() as i64, max_holders) {
        Tracked::Holds
    } else {
        Tracked::Waiting
    }
}

/// One claim key of a lock, as read from etcd.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyView {
    /// The whole key.
    pub key: String,
    /// The claim's name (the key without the lock's prefix).
    pub claim: String,
    /// The key's create revision: its place in the queue and its fencing token.
    pub create_revision: i64,
    /// The key's last modification, to guard a controller write.
    pub mod_revision: i64,
    /// The etcd lease the key lives on.
    pub lease: i64,
    /// The parsed value; `None` when it is no claim.
    pub value: Option<ClaimValue>,
}

/// What the controller does to one key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyAction {
    /// Delete the key (if unchanged since `mod_revision`): its process has stopped.
    Delete {
        /// The key.
        key: String,
        /// The claim.
        claim: String,
        /// The revision the key must still have.
        mod_revision: i64,
        /// Why.
        reason: RevokeReason,
    },
    /// Move the key (if unchanged since `mod_revision`) onto a new controller lease of
    /// `ttl_seconds` with `value`, then revoke `client_lease`.
    HoldBack {
        /// The key.
        key: String,
        /// The claim.
        claim: String,
        /// The revision the key must still have.
        mod_revision: i64,
        /// The lease the key was on (revoked after the move, so the process learns).
        client_lease: i64,
        /// The key's create revision: the claim's fencing token.
        create_revision: i64,
        /// The TTL of the controller's lease.
        ttl_seconds: i64,
        /// The value written: the claim's, marked held back.
        value: ClaimValue,
        /// Why.
        reason: RevokeReason,
    },
}

/// The controller's view of one lock on etcd: its status and what to do.
#[derive(Clone, Debug, PartialEq)]
pub struct Mirror {
    /// The status that reports the keys.
    pub status: DistributedLockStatus,
    /// Keys to delete or hold back.
    pub actions: Vec<KeyAction>,
    /// Claims whose key holds no claim value.
    pub invalid: Vec<String>,
}

/// Mirror `keys` (any order) into the lock's status, keeping what `prev` recorded
/// (grant and queue times, the token high-water mark), and plan the revocations.
pub fn mirror(
    keys: &[KeyView],
    spec: &DistributedLockSpec,
    prev: &DistributedLockStatus,
    pods: &BTreeMap<String, PodView>,
    stopped_pods: &StoppedPods,
    now: Timestamp,
) -> Mirror {
    let mut keys: Vec<&KeyView> = keys.iter().collect();
    keys.sort_by_key(|k| k.create_revision);
    let slots = spec.max_holders.max(1) as usize;
    let mut status = DistributedLockStatus {
        fencing_token: prev.fencing_token,
        fencing_token_epoch: prev.fencing_token_epoch,
        observed_generation: prev.observed_generation,
        conditions: prev.conditions.clone(),
        ..Default::default()
    };
    let mut actions = Vec::new();
    let mut invalid = Vec::new();
    let spec_lease = Duration::from_secs(spec.lease_duration_seconds.max(1) as u64);
    for (place, k) in keys.iter().enumerate() {
        let value = k.value.clone().unwrap_or_else(|| {
            invalid.push(k.claim.clone());
            ClaimValue {
                pod: String::new(),
                pod_uid: String::new(),
                lease_seconds: spec.lease_duration_seconds,
                held_back: None,
            }
        });
        if let Some(action) = revocation(k, &value, spec_lease, pods, stopped_pods) {
            actions.push(action);
        }
        if place < slots {
            let before = prev.holders.iter().find(|h| h.claim == k.claim);
            let revoked = value.held_back.map(|reason| Revocation {
                reason,
                at: before
                    .and_then(|h| h.revoked.as_ref())
                    .map_or(Time(now), |r| r.at.clone()),
            });
            status.fencing_token = status.fencing_token.max(k.create_revision);
            status.holders.push(Holder {
                claim: k.claim.clone(),
                pod: value.pod,
                pod_uid: value.pod_uid,
                fencing_token: k.create_revision,
                granted_at: before.map_or(Time(now), |h| h.granted_at.clone()),
                lease_duration_seconds: Some(value.lease_seconds),
                release_hash: None,
                revoked,
            });
        } else {
            let before = prev.queue.iter().find(|w| w.claim == k.claim);
            status.queue.push(Waiter {
                claim: k.claim.clone(),
                pod: value.pod,
                pod_uid: value.pod_uid,
                requested_at: before.map_or(Time(now), |w| w.requested_at.clone()),
                release_hash: None,
                lease_duration_seconds: Some(value.lease_seconds),
                wait_hash: None,
            });
        }
    }
    status.queue_length = status.queue.len() as i32;
    Mirror {
        status,
        actions,
        invalid,
    }
}

/// What to do with one key, by its pod's liveness.
fn revocation(
    k: &KeyView,
    value: &ClaimValue,
    spec_lease: Duration,
    pods: &BTreeMap<String, PodView>,
    stopped_pods: &StoppedPods,
) -> Option<KeyAction> {
    let delete = |reason| KeyAction::Delete {
        key: k.key.clone(),
        claim: k.claim.clone(),
        mod_revision: k.mod_revision,
        reason,
    };
    let liveness = pod_liveness(pods, stopped_pods, &value.pod, &value.pod_uid);
    if value.held_back.is_some() {
        // Held back already: it goes by its lease, or at once when its pod is known stopped.
        return match liveness {
            Liveness::Stopped(reason) => Some(delete(reason)),
            _ => None,
        };
    }
    let reason = match (liveness, k.value.is_some()) {
        (_, false) => RevokeReason::ForceReleased,
        (Liveness::Alive, true) => return None,
        (Liveness::Stopped(reason), true) => return Some(delete(reason)),
        (Liveness::Unknown(reason), true) => reason,
    };
    let claim_lease = Duration::from_secs(value.lease_seconds.max(1) as u64);
    Some(KeyAction::HoldBack {
        key: k.key.clone(),
        claim: k.claim.clone(),
        mod_revision: k.mod_revision,
        client_lease: k.lease,
        create_revision: k.create_revision,
        ttl_seconds: etcd_hold_back_ttl(spec_lease, claim_lease),
        value: ClaimValue {
            held_back: Some(reason),
            ..value.clone()
        },
        reason,
    })
}

#[cfg(test)]
pub(crate) mod tests;
