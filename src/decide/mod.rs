//! The pure heart of leasehold: given what was observed of a lock, its claims and their
//! pods, compute the lock's next status and what happened.
//!
//! No I/O, no clock reads: the caller passes `now` and its own judgements of time
//! (which claims expired, which held-back slots' delays elapsed), measured on its
//! monotonic clock. The rules (the **fenced handoff**: a slot passes on only when the
//! old holder has certainly stopped):
//!
//! * A holder's slot is freed at once when its process marked the claim released; when
//!   its pod is gone, replaced or finished; or when its claim expired.
//! * A holder whose claim vanished without the released mark while its pod lives was
//!   *force-released*: the entry is marked `revoked` and keeps its slot until its pod is
//!   gone/replaced/finished or the caller says its hold-back delay elapsed.
//! * `status.queue` is the durable FIFO order; claims not yet in it are appended by
//!   their arrival key. While fewer than `maxHolders` slots are occupied, the head of
//!   the queue is granted with the next fencing token.
//! * Deciding again on the same observation changes nothing.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use crate::api::{DistributedLockSpec, DistributedLockStatus, Holder, Revocation, RevokeReason, Waiter};

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;

/// The order in which claims arrived: creation time first, then the order in which
/// the observer first saw them (watch events arrive in the store's write order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Arrival {
    /// The claim's `metadata.creationTimestamp`, in seconds.
    pub created_secs: i64,
    /// A counter the observer increments each time it first sees a claim.
    pub seen_seq: u64,
}

/// One observed claim Lease of this lock, already validated by the caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimView {
    /// The claim Lease's name: the identity of one process's request.
    pub name: String,
    /// The pod the claim says it comes from.
    pub pod: String,
    /// That pod's UID, as the claim states it.
    pub pod_uid: String,
    /// Its arrival key, for FIFO order among new claims.
    pub arrival: Arrival,
    /// The process marked the claim released (or withdrew it while waiting).
    pub released: bool,
    /// The caller judged the claim expired: not renewed for long enough.
    pub expired: bool,
}

/// What is known of one pod, by name. A pod absent from the map is gone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodView {
    /// The pod's current UID.
    pub uid: String,
    /// Its phase is Succeeded or Failed: its containers have stopped.
    pub finished: bool,
}

/// Everything `decide` looks at.
#[derive(Clone, Copy, Debug)]
pub struct World<'a> {
    /// The lock's spec.
    pub spec: &'a DistributedLockSpec,
    /// The lock's current status (the durable holders, queue and token).
    pub status: &'a DistributedLockStatus,
    /// All claims observed for this lock.
    pub claims: &'a [ClaimView],
    /// What is known of the pods the claims name, by pod name.
    pub pods: &'a BTreeMap<String, PodView>,
    /// Revoked holders (by claim) whose hold-back delay elapsed on the caller's clock.
    pub hold_back_elapsed: &'a BTreeSet<String>,
    /// The wall-clock time to write into timestamps (informational only).
    pub now: Timestamp,
}

/// Why a waiter left the queue without being granted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DropReason {
    /// Its process withdrew the claim (marked it released while waiting).
    Withdrawn,
    /// Its claim was deleted.
    ClaimGone,
    /// Its claim was not renewed in time.
    Expired,
    /// Its pod is gone.
    PodGone,
    /// Its pod was replaced by one with another UID.
    PodReplaced,
    /// Its pod finished.
    PodFinished,
}

/// Why a claim was left out of the queue (the caller reports it as a Warning).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IgnoreReason {
    /// No pod of the claimed name is known.
    PodNotFound,
    /// The pod of that name has another UID than the claim states.
    PodUidMismatch,
    /// The pod has already finished.
    PodFinished,
}

/// Something that happened to one claim of the lock, for events and metrics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Action {
    /// The claim it happened to.
    pub claim: String,
    /// The claim's pod.
    pub pod: String,
    /// What happened.
    pub kind: ActionKind,
}

/// What happened to a claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActionKind {
    /// The claim was granted the lock with this fencing token.
    Granted(i64),
    /// The holder with this token released the lock; its slot is free.
    Released(i64),
    /// The grant with this token was revoked. For `ForceReleased` the slot is held back.
    Revoked(i64, RevokeReason),
    /// The held-back slot of the revoked grant with this token passed on.
    SlotFreed(i64),
    /// A new claim joined the queue at this 1-based position.
    Enqueued(usize),
    /// A waiter left the queue.
    Dropped(DropReason),
}

impl Action {
    fn new(claim: &str, pod: &str, kind: ActionKind) -> Self {
        Action {
            claim: claim.to_string(),
            pod: pod.to_string(),
            kind,
        }
    }
}

/// The outcome of one decision.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    /// The next status (conditions and observedGeneration are copied unchanged).
    pub status: DistributedLockStatus,
    /// What happened, in order.
    pub actions: Vec<Action>,
    /// Claims to delete once the status is written: released, expired or stale ones.
    pub delete_claims: Vec<String>,
    /// Claims left out of the queue, and why.
    pub ignored: Vec<(String, IgnoreReason)>,
}

/// How a claim's pod stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Liveness {
    Alive,
    Gone,
    Replaced,
    Finished,
}

fn liveness(pods: &BTreeMap<String, PodView>, pod: &str, uid: &str) -> Liveness {
    match pods.get(pod) {
        None => Liveness::Gone,
        Some(p) if p.uid != uid => Liveness::Replaced,
        Some(p) if p.finished => Liveness::Finished,
        Some(_) => Liveness::Alive,
    }
}

fn revoke_reason(l: Liveness) -> Option<RevokeReason> {
    match l {
        Liveness::Alive => None,
        Liveness::Gone => Some(RevokeReason::PodGone),
        Liveness::Replaced => Some(RevokeReason::PodReplaced),
        Liveness::Finished => Some(RevokeReason::PodFinished),
    }
}

fn drop_reason(l: Liveness) -> Option<DropReason> {
    revoke_reason(l).map(|r| match r {
        RevokeReason::PodReplaced => DropReason::PodReplaced,
        RevokeReason::PodFinished => DropReason::PodFinished,
        _ => DropReason::PodGone,
    })
}

/// Compute the lock's next status and the actions that lead there.
pub fn decide(world: &World<'_>) -> Decision {
    let mut d = Decision {
        status: DistributedLockStatus {
            observed_generation: world.status.observed_generation,
            conditions: world.status.conditions.clone(),
            ..Default::default()
        },
        actions: Vec::new(),
        delete_claims: Vec::new(),
        ignored: Vec::new(),
    };
    let claims: BTreeMap<&str, &ClaimView> = world.claims.iter().map(|c| (c.name.as_str(), c)).collect();
    let mut known: BTreeSet<&str> = BTreeSet::new();

    let holders = decide_holders(world, &claims, &mut known, &mut d);
    let queue = decide_queue(world, &claims, &mut known, &mut d);
    let issued = world.status.holders.iter().map(|h| h.fencing_token);
    d.status.fencing_token = issued.fold(world.status.fencing_token, i64::max);
    d.status.holders = holders;
    d.status.queue = queue;
    grant(world, &mut d);
    d.status.queue_length = i32::try_from(d.status.queue.len()).unwrap_or(i32::MAX);
    d
}

/// Carry each current holder forward, release or revoke it.
fn decide_holders<'w>(
    world: &World<'w>,
    claims: &BTreeMap<&str, &ClaimView>,
    known: &mut BTreeSet<&'w str>,
    d: &mut Decision,
) -> Vec<Holder> {
    let mut kept = Vec::new();
    for h in &world.status.holders {
        if !known.insert(h.claim.as_str()) {
            continue; // a duplicate entry (hand-edited status): keep the first
        }
        let act = |kind| Action::new(&h.claim, &h.pod, kind);
        let token = h.fencing_token;
        let live = liveness(world.pods, &h.pod, &h.pod_uid);
        if h.revoked.is_some() {
            if live != Liveness::Alive || world.hold_back_elapsed.contains(&h.claim) {
                d.actions.push(act(ActionKind::SlotFreed(token)));
            } else {
                kept.push(h.clone());
            }
            continue;
        }
        match claims.get(h.claim.as_str()) {
            Some(c) if c.released => {
                d.actions.push(act(ActionKind::Released(token)));
                d.delete_claims.push(h.claim.clone());
            }
            present => {
                let reason = revoke_reason(live).or(match present {
                    None => Some(RevokeReason::ForceReleased),
                    Some(c) if c.expired => Some(RevokeReason::Expired),
                    Some(_) => None,
                });
                let Some(reason) = reason else {
                    kept.push(h.clone());
                    continue;
                };
                d.actions.push(act(ActionKind::Revoked(token, reason)));
                if reason == RevokeReason::ForceReleased {
                    let at = Time(world.now);
                    kept.push(Holder {
                        revoked: Some(Revocation { reason, at }),
                        ..h.clone()
                    });
                } else if present.is_some() {
                    d.delete_claims.push(h.claim.clone());
                }
            }
        }
    }
    kept
}

/// Carry each waiter forward or drop it, then append new claims by arrival.
fn decide_queue<'w>(
    world: &World<'w>,
    claims: &BTreeMap<&str, &ClaimView>,
    known: &mut BTreeSet<&'w str>,
    d: &mut Decision,
) -> Vec<Waiter> {
    let mut queue = Vec::new();
    for w in &world.status.queue {
        if !known.insert(w.claim.as_str()) {
            continue;
        }
        let reason = match claims.get(w.claim.as_str()) {
            None => Some(DropReason::ClaimGone),
            Some(c) if c.released => Some(DropReason::Withdrawn),
            Some(c) if c.expired => Some(DropReason::Expired),
            Some(_) => drop_reason(liveness(world.pods, &w.pod, &w.pod_uid)),
        };
        match reason {
            None => queue.push(w.clone()),
            Some(reason) => {
                if reason != DropReason::ClaimGone {
                    d.delete_claims.push(w.claim.clone());
                }
                d.actions
                    .push(Action::new(&w.claim, &w.pod, ActionKind::Dropped(reason)));
            }
        }
    }
    let mut new: Vec<&ClaimView> = world
        .claims
        .iter()
        .filter(|c| !known.contains(c.name.as_str()))
        .collect();
    new.sort_by(|a, b| (a.arrival, &a.name).cmp(&(b.arrival, &b.name)));
    for c in new {
        if !known.insert(c.name.as_str()) {
            continue; // two claims of one name: only the first counts
        }
        if c.released || c.expired {
            d.delete_claims.push(c.name.clone());
            continue;
        }
        let ignore = match liveness(world.pods, &c.pod, &c.pod_uid) {
            Liveness::Alive => None,
            Liveness::Gone => Some(IgnoreReason::PodNotFound),
            Liveness::Replaced => Some(IgnoreReason::PodUidMismatch),
            Liveness::Finished => Some(IgnoreReason::PodFinished),
        };
        if let Some(reason) = ignore {
            d.ignored.push((c.name.clone(), reason));
            continue;
        }
        queue.push(Waiter {
            claim: c.name.clone(),
            pod: c.pod.clone(),
            pod_uid: c.pod_uid.clone(),
            requested_at: Time(world.now),
        });
        d.actions
            .push(Action::new(&c.name, &c.pod, ActionKind::Enqueued(queue.len())));
    }
    queue
}

/// Grant queue heads while slots are free.
fn grant(world: &World<'_>, d: &mut Decision) {
    let max = usize::try_from(world.spec.max_holders.max(1)).unwrap_or(1);
    let mut granted = 0;
    while d.status.holders.len() < max && granted < d.status.queue.len() {
        let w = &d.status.queue[granted];
        granted += 1;
        d.status.fencing_token += 1;
        let token = d.status.fencing_token;
        d.status.holders.push(Holder {
            claim: w.claim.clone(),
            pod: w.pod.clone(),
            pod_uid: w.pod_uid.clone(),
            fencing_token: token,
            granted_at: Time(world.now),
            revoked: None,
        });
        d.actions
            .push(Action::new(&w.claim, &w.pod, ActionKind::Granted(token)));
    }
    d.status.queue.drain(..granted);
}
