//! The queue: each waiter carried forward or dropped, then the new claims appended in
//! arrival order within the lock's bounds (`maxQueue` entries, and
//! [`STATUS_BUDGET_BYTES`] for every entry), and the grace a claim whose pod the caller
//! has not seen keeps its place for.
//!
//! What a claim says reaches the status only through here, so the bounds on what a
//! neighbour may write into a lock's status are kept here: an entry's size is counted
//! from its strings ([`entry_bytes`]), and a claim that states no lease is not recorded
//! (its process wrote one; see [`crate::protocol::record`]).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::{
    Action, ActionKind, ClaimView, Decision, DropReason, IgnoreReason, Liveness, World, drop_reason, liveness,
};
use crate::api::{Holder, Revocation, RevokeReason, Waiter};
use crate::mutant::{Mutant, on as mutant};

/// The most bytes the entries of a lock's holders and waiters may take in its status
/// (as JSON). A new claim whose entry would pass it is refused (`QueueFull`), whatever
/// `spec.maxQueue` allows: etcd stores an object of at most 1.5 MiB, and the rest of the
/// status (conditions, at most [`super::MAX_REFUSED_LISTED`] refusals, the key and the
/// URL) stays far below the difference.
pub const STATUS_BUDGET_BYTES: usize = 1024 * 1024;

/// What one entry takes beyond its strings: the keys, the quotes, the token, the
/// times, the lease and a revocation (a generous bound; see the test).
pub const ENTRY_OVERHEAD_BYTES: usize = 320;

/// The bytes a string takes in JSON at most: its quotes, and each character escaped
/// as JSON escapes it.
fn json_bytes(s: &str) -> usize {
    let escaped = |c: char| match c {
        '"' | '\\' => 2,
        c if (c as u32) < 0x20 => 6,
        c => c.len_utf8(),
    };
    2 + s.chars().map(escaped).sum::<usize>()
}

/// A bound on the bytes a holder's or waiter's entry for these strings takes in the
/// status, as JSON.
pub fn entry_bytes(claim: &str, pod: &str, pod_uid: &str, hashes: [Option<&str>; 2]) -> usize {
    let strings = [claim, pod, pod_uid].into_iter().chain(hashes.into_iter().flatten());
    ENTRY_OVERHEAD_BYTES + strings.map(json_bytes).sum::<usize>()
}

/// The bytes `h`'s entry takes at most.
pub(super) fn holder_bytes(h: &Holder) -> usize {
    entry_bytes(&h.claim, &h.pod, &h.pod_uid, [h.release_hash.as_deref(), None])
}

/// The bytes `w`'s entry takes at most (and, at the head, its designation: its name
/// again and the overhead).
pub(super) fn waiter_bytes(w: &Waiter) -> usize {
    let hashes = [w.release_hash.as_deref(), w.wait_hash.as_deref()];
    entry_bytes(&w.claim, &w.pod, &w.pod_uid, hashes) + ENTRY_OVERHEAD_BYTES + json_bytes(&w.claim)
}

/// How much more the queue may take: entries and bytes.
#[derive(Clone, Copy, Debug)]
pub(super) struct Room {
    /// Waiters (beyond the successor, who is counted already).
    pub entries: usize,
    /// Bytes of the status's budget left.
    pub bytes: usize,
}

/// Carry each waiter forward or drop it, then append the new claims by arrival within
/// `room` (the others are ignored, `QueueFull`). Returns the queue, and the holders an
/// earlier build stamped (none: see [`stamped_holder`]).
pub(super) fn decide_queue<'w>(
    world: &World<'w>,
    claims: &BTreeMap<&str, &ClaimView>,
    (epoch, room): (i64, Room),
    known: &mut BTreeSet<&'w str>,
    d: &mut Decision,
) -> (Vec<Waiter>, Vec<Holder>) {
    let mut queue = carry_waiters(world, claims, known, d);
    let mut bytes = room.bytes;
    for w in &queue {
        bytes = bytes.saturating_sub(waiter_bytes(w));
    }
    let mut stale = Vec::new();
    let mut new: Vec<&ClaimView> = world
        .claims
        .iter()
        .filter(|c| !known.contains(c.name.as_str()))
        .collect();
    new.sort_by(|a, b| (a.arrival, &a.name).cmp(&(b.arrival, &b.name)));
    if mutant(Mutant::LifoQueue) {
        new.reverse();
    }
    // Set once a new claim waits for its pod to be seen: younger claims keep their
    // places behind it (they are neither queued nor refused yet).
    let mut behind_unseen_pod = false;
    for c in new {
        if !known.insert(c.name.as_str()) {
            continue; // two claims of one name: only the first counts
        }
        if c.released || c.forged || c.expired {
            d.delete_claims.push(c.name.clone());
            continue;
        }
        if let Some(holder) = stamped_holder(world, c, epoch, d) {
            stale.extend(holder);
            continue;
        }
        if behind_unseen_pod {
            continue;
        }
        if let Some(ends) = awaits_its_pod(world, c) {
            behind_unseen_pod = true;
            recheck(d, ends);
            continue;
        }
        let waiter = waiter_of(world, c);
        let fits = queue.len() < room.entries && waiter_bytes(&waiter) <= bytes;
        let refused = refusal(world, c).or((!fits).then_some(IgnoreReason::QueueFull));
        if let Some(reason) = refused {
            d.ignored.push((c.name.clone(), reason));
            continue;
        }
        bytes -= waiter_bytes(&waiter);
        queue.push(waiter);
        d.actions
            .push(Action::new(&c.name, &c.pod, ActionKind::Enqueued(queue.len())));
    }
    (queue, stale)
}

/// The waiters of the stored queue that stay, in order; the others dropped (their
/// claims deleted: out of view is not gone, a claim whose lock label someone removed is
/// still renewed by its process, and deleting it by name tells it).
fn carry_waiters<'w>(
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
            Some(c) if c.forged => Some(DropReason::ForgedRelease),
            Some(c) if c.expired => Some(DropReason::Expired),
            // A pod the caller has not seen (yet) keeps its waiter's place for the
            // grace, as it keeps a new claim's: a new leader's pod cache may lag.
            Some(c) => match awaits_its_pod(world, c) {
                Some(ends) => {
                    recheck(d, ends);
                    None
                }
                None => drop_reason(liveness(world, &w.pod, &w.pod_uid)),
            },
        };
        match reason {
            None => queue.push(w.clone()),
            Some(reason) => {
                d.delete_claims.push(w.claim.clone());
                d.actions
                    .push(Action::new(&w.claim, &w.pod, ActionKind::Dropped(reason)));
            }
        }
    }
    queue
}

/// Why new claim `c` is not queued, by what it says and its pod, if it is not.
fn refusal(world: &World<'_>, c: &ClaimView) -> Option<IgnoreReason> {
    let by_pod = match liveness(world, &c.pod, &c.pod_uid) {
        Liveness::Alive => None,
        Liveness::Stopped(RevokeReason::PodFinished) => Some(IgnoreReason::PodFinished),
        Liveness::Stopped(RevokeReason::PodReplaced) | Liveness::Unknown(RevokeReason::PodReplaced) => {
            Some(IgnoreReason::PodUidMismatch)
        }
        Liveness::Stopped(_) | Liveness::Unknown(_) => Some(IgnoreReason::PodNotFound),
    };
    // Its process wrote a lease: one stating none was changed by someone else, and a
    // record without a lease would let the lock's (maybe shorter) lease judge it.
    let no_lease = c.lease_seconds <= 0 && !mutant(Mutant::QueuedWithoutLease);
    by_pod.or(no_lease.then_some(IgnoreReason::LeaseMissing))
}

/// The entry new claim `c` is queued with: what it states now, recorded for good.
fn waiter_of(world: &World<'_>, c: &ClaimView) -> Waiter {
    Waiter {
        claim: c.name.clone(),
        pod: c.pod.clone(),
        pod_uid: c.pod_uid.clone(),
        requested_at: Time(world.now),
        release_hash: c.release_hash.clone(),
        lease_duration_seconds: Some(c.lease_seconds).filter(|l| *l > 0),
        wait_hash: c.wait_hash.clone(),
    }
}

/// A claim stamped with a fencing token is no earlier incarnation's holder: no build
/// of the controller that ships stamps claims, and a stamp is a value anyone who may
/// patch Leases can write (one such claim held a lock for its lease, an hour, skipping
/// the queue). It is judged as any new claim. (`Some` only with the mutant that puts
/// the old trust back: the holder it made, `None` inside when its pod has stopped.)
fn stamped_holder(world: &World<'_>, c: &ClaimView, epoch: i64, d: &mut Decision) -> Option<Option<Holder>> {
    if !mutant(Mutant::StampTrusted) {
        return None;
    }
    let token = c.stamped_token.filter(|t| *t < epoch)?;
    if matches!(liveness(world, &c.pod, &c.pod_uid), Liveness::Stopped(_)) {
        d.delete_claims.push(c.name.clone());
        return Some(None);
    }
    let reason = RevokeReason::ForceReleased;
    d.actions
        .push(Action::new(&c.name, &c.pod, ActionKind::Revoked(token, reason)));
    Some(Some(Holder {
        claim: c.name.clone(),
        pod: c.pod.clone(),
        pod_uid: c.pod_uid.clone(),
        fencing_token: token,
        granted_at: Time(world.now),
        lease_duration_seconds: Some(c.lease_seconds).filter(|l| *l > 0),
        release_hash: c.release_hash.clone(),
        revoked: Some(Revocation {
            reason,
            at: Time(world.now),
        }),
    }))
}

/// When the grace of claim `c` ends, if its pod is not seen as the claim says (no pod
/// of its name, or one of another UID, not known stopped) and the claim is younger than
/// [`crate::protocol::timing::POD_CACHE_GRACE`]: a pod just created (or re-created
/// under its name) may not be in the caller's cache yet, so the claim keeps its place
/// rather than be refused or dropped.
fn awaits_its_pod(world: &World<'_>, c: &ClaimView) -> Option<Timestamp> {
    if !matches!(
        liveness(world, &c.pod, &c.pod_uid),
        Liveness::Unknown(RevokeReason::PodGone | RevokeReason::PodReplaced)
    ) {
        return None;
    }
    let grace = crate::protocol::timing::POD_CACHE_GRACE.as_secs() as i64;
    let ends = Timestamp::from_second(c.arrival.created_secs.saturating_add(grace)).ok()?;
    (world.now < ends).then_some(ends)
}

/// Decide again at `at` (or earlier, if asked already).
fn recheck(d: &mut Decision, at: Timestamp) {
    d.recheck_at = Some(d.recheck_at.map_or(at, |t| t.min(at)));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_bound_covers_the_json_of_the_largest_entries() {
        let long = "x".repeat(253);
        let odd = "\"\\\u{1}é".repeat(40);
        for (claim, pod, uid) in [(long.as_str(), long.as_str(), odd.as_str()), ("c", "p", "u")] {
            let hash = Some("f".repeat(64));
            let holder = Holder {
                claim: claim.to_string(),
                pod: pod.to_string(),
                pod_uid: uid.to_string(),
                fencing_token: i64::MAX,
                granted_at: Time(Timestamp::MAX),
                lease_duration_seconds: Some(i32::MIN),
                release_hash: hash.clone(),
                revoked: Some(Revocation {
                    reason: RevokeReason::ForceReleased,
                    at: Time(Timestamp::MAX),
                }),
            };
            let json = serde_json::to_string(&holder).unwrap();
            assert!(
                json.len() <= holder_bytes(&holder),
                "{} > {}",
                json.len(),
                holder_bytes(&holder)
            );
            let waiter = Waiter {
                claim: claim.to_string(),
                pod: pod.to_string(),
                pod_uid: uid.to_string(),
                requested_at: Time(Timestamp::MAX),
                release_hash: hash.clone(),
                lease_duration_seconds: Some(i32::MIN),
                wait_hash: hash,
            };
            let successor = crate::api::Successor {
                claim: claim.to_string(),
                fencing_token: i64::MAX,
                lease_duration_seconds: Some(i32::MIN),
            };
            let both = serde_json::to_string(&waiter).unwrap().len() + serde_json::to_string(&successor).unwrap().len();
            assert!(both <= waiter_bytes(&waiter), "{both} > {}", waiter_bytes(&waiter));
        }
    }
}
