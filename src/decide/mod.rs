//! The pure heart of leasehold: given what was observed of a lock, its claims and their
//! pods, compute the lock's next status and what happened.
//!
//! No I/O, no clock reads: the caller passes `now` and its own judgements of time
//! (which claims expired, which held-back slots' delays elapsed), measured on its
//! monotonic clock. The rules (the **fenced handoff**: a slot passes on only when the
//! old holder has certainly stopped):
//!
//! * A holder's slot is freed at once when its process marked the claim released; when
//!   its claim expired (its process stopped itself first); or when its pod finished, or
//!   is gone or replaced *and the kubelet reported its containers stopped* (graceful
//!   deletion removes the object only after that).
//! * A pod object gone is not a process stopped: after a forced deletion (a node that
//!   does not answer), node deletion or pod GC, the process may run on. Such a holder,
//!   and one whose claim vanished without the released mark while its pod lives
//!   (*force-released*), is marked `revoked` and keeps its slot until its pod is known
//!   stopped or the caller says its hold-back delay elapsed.
//! * A release mark its owner did not write (see [`crate::protocol::release`]) counts
//!   as a forced release: a holder keeps its slot held back, a waiter is dropped (as if
//!   its claim had been deleted) and its claim deleted.
//! * `status.queue` is the durable FIFO order; claims not yet in it are appended by
//!   their arrival key. While fewer than `maxHolders` slots are occupied, the head of
//!   the queue is granted with the next fencing token.
//! * While every slot is occupied, the head of the queue is the designated **successor**
//!   (`status.successor`), with the next fencing token reserved for it. The next slot
//!   to free goes to it, with that token, before anyone else. Because a controller may
//!   tell it of that grant directly, before any status write, and because with one slot
//!   the holder's release mark is its grant ([`crate::protocol::handover`]: it may act
//!   on the mark before any controller saw it), a successor is fenced like a holder: it
//!   leaves its place only by its grant, by withdrawing, or when its process has
//!   certainly stopped (expired, or its pod stopped); one that may run on
//!   (forced release, forged mark, pod gone without the kubelet's word) becomes a
//!   revoked holder with its slot held back. Its token is then never issued.
//! * Tokens are an epoch (taken once, from the caller's clock, when the lock is first
//!   decided) plus a count, so a lock re-created under the same name never issues a
//!   token an older incarnation issued.
//! * A lock being deleted (*closing*) grants nothing and designates no one: it revokes
//!   every holder, and its successor, keeping their slots held back (their claims are
//!   kept, so a valid release still frees a slot at once). The caller lets it go only
//!   once it has no holder left, so no process that may still run is forgotten with it
//!   (a lock re-created under the same name can only exist after that).
//! * At most [`max_queue`] claims wait; a new claim beyond that, and one naming no
//!   live pod with its UID, is left out (`ignored`); the caller lists it in
//!   `status.refused` for its client ([`refusals`]).
//! * Deciding again on the same observation changes nothing.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::api::Refusal;
use crate::api::{DistributedLockStatus, Holder, Revocation, RevokeReason, Successor, Waiter};
use crate::protocol::timing::MAX_LEASE_SECONDS;
pub use queue::{ENTRY_OVERHEAD_BYTES, STATUS_BUDGET_BYTES, entry_bytes};
pub use world::*;

use crate::mutant::{Mutant, on as mutant};

/// How many claims a lock queues at most (its successor included) unless its
/// `spec.maxQueue` says otherwise; a new claim beyond that is refused with `QueueFull`,
/// so the status stays well below what the API server stores (about 250 bytes a
/// waiter). Waiters already queued are never dropped for it.
pub const MAX_QUEUE: usize = 1000;

/// The queue bound of a lock with this spec.
pub fn max_queue(spec: &crate::api::DistributedLockSpec) -> usize {
    spec.max_queue
        .and_then(|m| usize::try_from(m).ok())
        .filter(|m| *m > 0)
        .unwrap_or(MAX_QUEUE)
}
/// How many refused claims the status lists for their clients, in arrival order.
pub const MAX_REFUSED_LISTED: usize = 16;

#[cfg(test)]
mod explore;
#[cfg(test)]
mod proptests;
mod queue;
#[cfg(test)]
mod tests;
mod world;

/// How a claim's pod stands: the one rule, shared by both backends, for when a claim's
/// process has certainly stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Liveness {
    /// The pod with the claim's UID exists and has not finished.
    Alive,
    /// Its processes have certainly stopped (finished, or gone/replaced after the
    /// kubelet reported its containers stopped).
    Stopped(RevokeReason),
    /// The pod object is gone or replaced, but nothing says its processes stopped.
    Unknown(RevokeReason),
}

/// How the pod `pod` with UID `uid` stands, given the pods observed in the lock's
/// namespace and the UIDs whose containers the kubelet reported stopped.
pub fn pod_liveness(pods: &BTreeMap<String, PodView>, stopped_pods: &StoppedPods, pod: &str, uid: &str) -> Liveness {
    let reason = match pods.get(pod) {
        Some(p) if p.uid == uid && !p.finished => return Liveness::Alive,
        Some(p) if p.uid == uid => return Liveness::Stopped(RevokeReason::PodFinished),
        Some(_) => RevokeReason::PodReplaced,
        None => RevokeReason::PodGone,
    };
    if stopped_pods.contains(uid) || (reason == RevokeReason::PodGone && mutant(Mutant::PodGoneAsStopped)) {
        Liveness::Stopped(reason)
    } else {
        Liveness::Unknown(reason)
    }
}

fn liveness(world: &World<'_>, pod: &str, uid: &str) -> Liveness {
    pod_liveness(world.pods, world.stopped_pods, pod, uid)
}

fn drop_reason(l: Liveness) -> Option<DropReason> {
    match l {
        Liveness::Alive => None,
        Liveness::Stopped(r) | Liveness::Unknown(r) => Some(dropped_for(r)),
    }
}

/// Why a waiter leaves the queue, for the reason a grant would have been revoked.
fn dropped_for(r: RevokeReason) -> DropReason {
    match r {
        RevokeReason::Expired => DropReason::Expired,
        RevokeReason::PodReplaced => DropReason::PodReplaced,
        RevokeReason::PodFinished => DropReason::PodFinished,
        _ => DropReason::PodGone,
    }
}

/// The lease claim `name` states, if it is observed with one.
fn stated_lease(world: &World<'_>, name: &str) -> Option<i32> {
    let claim = world.claims.iter().find(|c| c.name == name)?;
    Some(claim.lease_seconds).filter(|l| *l > 0)
}

/// The lease waiter `w` lives by: the longer of the one recorded when it was first
/// queued and the one recorded at its designation (its owner checked both); the one its
/// claim states now only when neither was recorded (a status written by hand). What the
/// claim states now anyone who may patch Leases may have changed: down, a process
/// judged by less than it acts on; up, a slot held back an hour once its holder is
/// revoked (a neighbour's raise and forged mark did that in the chaos soak).
fn waiter_lease(world: &World<'_>, w: &Waiter) -> Option<i32> {
    let designated = world.status.successor.as_ref().filter(|s| s.claim == w.claim);
    let recorded = w.lease_duration_seconds.filter(|l| *l > 0);
    let at_designation = designated.and_then(|s| s.lease_duration_seconds).filter(|l| *l > 0);
    if mutant(Mutant::LeaseAsPatchedAtGrant) {
        return stated_lease(world, &w.claim).or(recorded);
    }
    recorded.max(at_designation).or_else(|| stated_lease(world, &w.claim))
}

/// The lease a holder's process may be living by, which its revoked slot is held back
/// for: the longer of the lock's (`spec`) and the one recorded at its grant.
pub fn holder_lease(spec: std::time::Duration, holder: &Holder) -> std::time::Duration {
    // None recorded (a status edited by hand: every grant records one): the longest
    // there is, as for a successor's.
    let own = holder.lease_duration_seconds.unwrap_or(MAX_LEASE_SECONDS);
    let own = own.clamp(0, MAX_LEASE_SECONDS);
    if mutant(Mutant::HoldBackBySpecLease) {
        return spec;
    }
    spec.max(std::time::Duration::from_secs(own as u64))
}

/// Whether `status` still names a holder (revoked or not) or a successor: a process
/// that may run under the lock. A closing lock may be let go only once it names none.
pub fn occupied(status: &DistributedLockStatus) -> bool {
    if mutant(Mutant::LetGoWithSlotHeldBack) {
        return status.holders.iter().any(|h| h.revoked.is_none()) || status.successor.is_some();
    }
    !status.holders.is_empty() || status.successor.is_some()
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
        recheck_at: None,
    };
    let claims: BTreeMap<&str, &ClaimView> = world.claims.iter().map(|c| (c.name.as_str(), c)).collect();
    let mut known: BTreeSet<&str> = BTreeSet::new();

    // A fresh lock takes its epoch from the caller's clock; a lock that issued tokens
    // before epochs existed keeps counting from them.
    let epoch = match world.status.fencing_token_epoch {
        Some(epoch) => epoch,
        None if world.status.fencing_token == 0 && mutant(Mutant::NoTokenEpoch) => 0,
        None if world.status.fencing_token == 0 => world.token_floor.max(0),
        None => 0,
    };
    d.status.fencing_token_epoch = Some(epoch);
    let mut holders = decide_holders(world, &claims, &mut known, &mut d);
    let (successor, held_back) = decide_successor(world, &claims, &mut known, &mut d);
    // Room for waiters after this decision's grants: every slot left free takes one.
    let max = usize::try_from(world.spec.max_holders.max(1)).unwrap_or(1);
    let occupied = holders.len() + usize::from(held_back.is_some());
    let free = if world.closing { 0 } else { max.saturating_sub(occupied) };
    let entries = (max_queue(world.spec) + free).saturating_sub(usize::from(successor.is_some()));
    let taken = holders.iter().chain(&held_back).map(queue::holder_bytes);
    let taken = taken.chain(successor.iter().map(queue::waiter_bytes)).sum::<usize>();
    let bytes = STATUS_BUDGET_BYTES.saturating_sub(taken);
    let room = queue::Room { entries, bytes };
    let (queue, stale) = queue::decide_queue(world, &claims, (epoch, room), &mut known, &mut d);
    holders.extend(held_back);
    holders.extend(stale);
    let issued = world.status.holders.iter().chain(&holders).map(|h| h.fencing_token);
    let reserved = world.status.successor.iter().map(|s| s.fencing_token);
    d.status.fencing_token = issued
        .chain(reserved)
        .fold(world.status.fencing_token.max(epoch), i64::max);
    d.status.holders = holders;
    d.status.queue = successor.into_iter().chain(queue).collect();
    grant(world, &mut d);
    d.status.queue_length = i32::try_from(d.status.queue.len()).unwrap_or(i32::MAX);
    d
}

/// What `status.refused` lists for the clients of claims a decision left out
/// (`ignored`, in arrival order): at most [`MAX_REFUSED_LISTED`], leaving out those the
/// caller is `deleting` (a waiter just dropped, whose claim is on its way out, would
/// otherwise show as refused until its deletion is seen). The caller fills it in: a
/// decision's own status lists none, so deciding again on the same observation changes
/// nothing whatever the caller has deleted since.
pub fn refusals(ignored: &[(String, IgnoreReason)], deleting: impl Fn(&str) -> bool) -> Vec<Refusal> {
    let listed = ignored.iter().filter(|(claim, _)| !deleting(claim));
    listed
        .take(MAX_REFUSED_LISTED)
        .map(|(claim, reason)| Refusal {
            claim: claim.clone(),
            reason: *reason,
        })
        .collect()
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
        let live = liveness(world, &h.pod, &h.pod_uid);
        if h.revoked.is_some() {
            // Its process says it has stopped (a valid release), its pod has, or it has
            // had a lease to stop itself: the slot passes on, and a claim still there
            // goes with it (else it would come back as a new claim).
            let claim = claims.get(h.claim.as_str());
            let released = claim.is_some_and(|c| c.released);
            if released || matches!(live, Liveness::Stopped(_)) || world.hold_back_elapsed.contains(&h.claim) {
                if claim.is_some() {
                    d.delete_claims.push(h.claim.clone());
                }
                d.actions.push(act(ActionKind::SlotFreed(token)));
            } else {
                kept.push(h.clone());
            }
            continue;
        }
        let claim = claims.get(h.claim.as_str()).copied();
        let (reason, held_back) = match judge_grant(claim, live) {
            // Being deleted: the grant is revoked, its slot held back until its process
            // has stopped.
            Judgement::Keep if world.closing => (RevokeReason::LockDeleted, true),
            Judgement::Keep => {
                kept.push(h.clone());
                continue;
            }
            Judgement::Released => {
                d.actions.push(act(ActionKind::Released(token)));
                d.delete_claims.push(h.claim.clone());
                continue;
            }
            Judgement::Revoke(reason, held_back) => (reason, held_back),
        };
        d.actions.push(act(ActionKind::Revoked(token, reason)));
        if held_back {
            let at = Time(world.now);
            kept.push(Holder {
                revoked: Some(Revocation { reason, at }),
                ..h.clone()
            });
        }
        if claim.is_some() && reason != RevokeReason::LockDeleted {
            d.delete_claims.push(h.claim.clone());
        }
    }
    kept
}

/// How a grant (or a successor, who may have been told of its grant already) stands.
enum Judgement {
    /// It stands.
    Keep,
    /// Its process released it with a valid mark: it has stopped.
    Released,
    /// It is taken away for this reason; with `true`, its process may still run, so its
    /// slot is held back.
    Revoke(RevokeReason, bool),
}

/// Judge a grant by its claim (absent: deleted) and its pod.
fn judge_grant(claim: Option<&ClaimView>, live: Liveness) -> Judgement {
    if claim.is_some_and(|c| c.released || (c.forged && mutant(Mutant::ForgedAsReleased))) {
        return Judgement::Released;
    }
    let expired = claim.is_some_and(|c| c.expired);
    let forged = claim.is_some_and(|c| c.forged);
    match live {
        Liveness::Stopped(r) => Judgement::Revoke(r, false),
        // The claim expired: its process stopped itself before we could judge so.
        Liveness::Unknown(r) => Judgement::Revoke(r, !expired),
        Liveness::Alive if claim.is_none() || (forged && !expired) => {
            let held_back = !(claim.is_none() && mutant(Mutant::DeletedClaimFreesAtOnce));
            Judgement::Revoke(RevokeReason::ForceReleased, held_back)
        }
        Liveness::Alive if expired => Judgement::Revoke(RevokeReason::Expired, false),
        Liveness::Alive => Judgement::Keep,
    }
}

/// Carry the designated successor forward: it stays at the head of the queue, leaves it
/// (withdrawn, or certainly stopped), or, when it may have been told of its grant and
/// may still run, becomes a revoked holder whose slot is held back.
fn decide_successor<'w>(
    world: &World<'w>,
    claims: &BTreeMap<&str, &ClaimView>,
    known: &mut BTreeSet<&'w str>,
    d: &mut Decision,
) -> (Option<Waiter>, Option<Holder>) {
    let Some(s) = world.status.successor.as_ref() else {
        return (None, None);
    };
    let Some(w) = world.status.queue.iter().find(|w| w.claim == s.claim) else {
        return (None, None); // names no waiter (a hand-edited status): no designation
    };
    if !known.insert(w.claim.as_str()) {
        return (None, None);
    }
    let claim = claims.get(w.claim.as_str()).copied();
    let (reason, held_back) = match judge_grant(claim, liveness(world, &w.pod, &w.pod_uid)) {
        // Being deleted: it may have been told of its grant, so it is revoked like a
        // holder, its slot held back until it has stopped (or withdrawn).
        Judgement::Keep if world.closing => (RevokeReason::LockDeleted, true),
        Judgement::Keep => return (Some(w.clone()), None),
        Judgement::Released => {
            d.delete_claims.push(w.claim.clone());
            let dropped = ActionKind::Dropped(DropReason::Withdrawn);
            d.actions.push(Action::new(&w.claim, &w.pod, dropped));
            return (None, None);
        }
        Judgement::Revoke(reason, held_back) => (reason, held_back),
    };
    if claim.is_some() && reason != RevokeReason::LockDeleted {
        d.delete_claims.push(w.claim.clone());
    }
    if !held_back || mutant(Mutant::SuccessorNotFenced) {
        let why = dropped_for(reason);
        d.actions.push(Action::new(&w.claim, &w.pod, ActionKind::Dropped(why)));
        return (None, None);
    }
    d.actions.push(Action::new(
        &w.claim,
        &w.pod,
        ActionKind::Revoked(s.fencing_token, reason),
    ));
    // The longest recorded or stated for it (a claim patched meanwhile cannot shorten
    // it); none known: the longest there is.
    let lease = Some(waiter_lease(world, w).unwrap_or(MAX_LEASE_SECONDS));
    let holder = Holder {
        claim: w.claim.clone(),
        pod: w.pod.clone(),
        pod_uid: w.pod_uid.clone(),
        fencing_token: s.fencing_token,
        granted_at: Time(world.now),
        lease_duration_seconds: lease,
        release_hash: w.release_hash.clone(),
        revoked: Some(Revocation {
            reason,
            at: Time(world.now),
        }),
    };
    (None, Some(holder))
}

/// Grant queue heads while slots are free (the successor, at the head, with the token
/// reserved for it), then designate the head of what is left while every slot is taken.
fn grant(world: &World<'_>, d: &mut Decision) {
    let max = usize::try_from(world.spec.max_holders.max(1)).unwrap_or(1);
    // The standing designation of `claim`, if it has one.
    let designated = |claim: &str| world.status.successor.as_ref().filter(|s| s.claim == claim);
    if world.closing {
        // Being deleted: no grant, no designation (a standing one was revoked).
        d.status.successor = None;
        return;
    }
    let reserved = |claim: &str| designated(claim).map(|s| s.fencing_token);
    let mut granted = 0;
    while d.status.holders.len() < max && granted < d.status.queue.len() {
        let w = &d.status.queue[granted];
        let token = match reserved(&w.claim).filter(|_| granted == 0) {
            Some(token) => token,
            None => {
                d.status.fencing_token += 1;
                d.status.fencing_token
            }
        };
        granted += 1;
        d.status.holders.push(Holder {
            claim: w.claim.clone(),
            pod: w.pod.clone(),
            pod_uid: w.pod_uid.clone(),
            fencing_token: token,
            granted_at: Time(world.now),
            lease_duration_seconds: waiter_lease(world, w),
            release_hash: w.release_hash.clone(),
            revoked: None,
        });
        d.actions
            .push(Action::new(&w.claim, &w.pod, ActionKind::Granted(token)));
    }
    d.status.queue.drain(..granted);
    // Left waiting: every slot is taken. The head is designated, keeping its token.
    d.status.successor = d.status.queue.first().map(|w| {
        let fencing_token = reserved(&w.claim).unwrap_or_else(|| {
            d.status.fencing_token += 1;
            d.status.fencing_token
        });
        Successor {
            claim: w.claim.clone(),
            fencing_token,
            lease_duration_seconds: waiter_lease(world, w),
        }
    });
}
