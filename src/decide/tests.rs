//! Example tests of the decision rules, written with fixture builders that read as
//! sentences: `lock().held_by("a").queued("b")`.

use super::*;
use k8s_openapi::jiff::Timestamp;

use crate::api::{DistributedLockSpec, Holder};

/// A lock plus its observed world, built up step by step.
#[derive(Clone, Debug)]
pub(super) struct Fixture {
    pub spec: DistributedLockSpec,
    pub status: DistributedLockStatus,
    pub claims: Vec<ClaimView>,
    pub pods: BTreeMap<String, PodView>,
    pub elapsed: BTreeSet<String>,
    pub stopped: StoppedPods,
    pub token_floor: i64,
    pub closing: bool,
    /// The observer's clock.
    pub now: Timestamp,
    seq: u64,
}

/// A mutex with no holders, no waiters and no claims.
pub(super) fn lock() -> Fixture {
    Fixture {
        spec: DistributedLockSpec::default(),
        status: DistributedLockStatus::default(),
        claims: Vec::new(),
        pods: BTreeMap::new(),
        elapsed: BTreeSet::new(),
        stopped: StoppedPods::new(),
        token_floor: 0,
        closing: false,
        now: Timestamp::UNIX_EPOCH,
        seq: 0,
    }
}

/// When a claim made by the builders was created: a minute before the observer's
/// clock, unless [`Fixture::just_made`] says otherwise.
pub(super) const MADE_AT_SECS: i64 = -60;

fn uid(pod: &str) -> String {
    format!("uid-{pod}")
}

impl Fixture {
    pub fn max_holders(mut self, n: i32) -> Self {
        self.spec.max_holders = n;
        self
    }

    /// A process in pod `name` (alive) made claim `name` that nobody has seen yet.
    pub fn claims(mut self, name: &str) -> Self {
        self.seq += 1;
        self.pods.insert(
            name.into(),
            PodView {
                uid: uid(name),
                finished: false,
            },
        );
        self.claims.push(ClaimView {
            name: name.into(),
            pod: name.into(),
            pod_uid: uid(name),
            arrival: Arrival {
                created_secs: MADE_AT_SECS,
                requested_micros: 0,
                seen_seq: self.seq,
            },
            released: false,
            forged: false,
            release_hash: None,
            wait_hash: None,
            stamped_token: None,
            expired: false,
            lease_seconds: 15,
        });
        self
    }

    /// Claim `name` holds the lock with the next token.
    pub fn held_by(mut self, name: &str) -> Self {
        self = self.claims(name);
        self.status.fencing_token += 1;
        self.status.holders.push(Holder {
            claim: name.into(),
            pod: name.into(),
            pod_uid: uid(name),
            fencing_token: self.status.fencing_token,
            granted_at: Time(Timestamp::UNIX_EPOCH),
            lease_duration_seconds: Some(15),
            release_hash: None,
            revoked: None,
        });
        self
    }

    /// Claim `name` waits in the queue.
    pub fn queued(mut self, name: &str) -> Self {
        self = self.claims(name);
        self.status.queue.push(Waiter {
            claim: name.into(),
            pod: name.into(),
            pod_uid: uid(name),
            requested_at: Time(Timestamp::UNIX_EPOCH),
            release_hash: None,
            lease_duration_seconds: Some(15),
            wait_hash: None,
        });
        self
    }

    fn claim_mut(&mut self, name: &str) -> &mut ClaimView {
        self.claims.iter_mut().find(|c| c.name == name).expect("no such claim")
    }

    /// Claim `name` was created in the observer's current second.
    pub fn just_made(mut self, name: &str) -> Self {
        let now = self.now.as_second();
        self.claim_mut(name).arrival.created_secs = now;
        self
    }

    /// The observer's clock moves on by `secs`.
    pub fn later(mut self, secs: i64) -> Self {
        self.now = Timestamp::from_second(self.now.as_second() + secs).unwrap();
        self
    }

    /// Pod `pod` appears in the observer's cache (it was created, or the cache caught up).
    pub fn pod_seen(mut self, pod: &str) -> Self {
        self.pods.insert(
            pod.into(),
            PodView {
                uid: uid(pod),
                finished: false,
            },
        );
        self
    }

    pub fn released(mut self, name: &str) -> Self {
        self.claim_mut(name).released = true;
        self
    }

    /// Someone other than its process wrote a release mark on claim `name`.
    pub fn forged(mut self, name: &str) -> Self {
        self.claim_mut(name).forged = true;
        self
    }

    pub fn expired(mut self, name: &str) -> Self {
        self.claim_mut(name).expired = true;
        self
    }

    /// Someone deleted claim `name`; its pod lives on.
    pub fn claim_deleted(mut self, name: &str) -> Self {
        self.claims.retain(|c| c.name != name);
        self
    }

    /// Pod `pod` is deleted gracefully: the kubelet stopped its containers first.
    pub fn pod_gone(mut self, pod: &str) -> Self {
        self.stopped.insert(uid(pod));
        self.pod_force_deleted(pod)
    }

    /// Pod `pod`'s object is removed with nothing said of its processes (forced
    /// deletion on an unreachable node, node deletion, pod GC).
    pub fn pod_force_deleted(mut self, pod: &str) -> Self {
        self.pods.remove(pod);
        self
    }

    /// Pod `pod` is replaced by one of the same name, its old containers stopped.
    pub fn pod_replaced(mut self, pod: &str) -> Self {
        self.stopped.insert(uid(pod));
        self.pod_force_replaced(pod)
    }

    /// Pod `pod` is replaced with nothing said of the old one's processes.
    pub fn pod_force_replaced(mut self, pod: &str) -> Self {
        self.pods.insert(
            pod.into(),
            PodView {
                uid: format!("{}-new", uid(pod)),
                finished: false,
            },
        );
        self
    }

    pub fn pod_finished(mut self, pod: &str) -> Self {
        self.pods.get_mut(pod).expect("no such pod").finished = true;
        self
    }

    /// The lock is being deleted.
    pub fn closing(mut self) -> Self {
        self.closing = true;
        self
    }

    pub fn hold_back_elapsed(mut self, claim: &str) -> Self {
        self.elapsed.insert(claim.into());
        self
    }

    pub fn decide(&self) -> Decision {
        decide(&World {
            spec: &self.spec,
            status: &self.status,
            claims: &self.claims,
            pods: &self.pods,
            stopped_pods: &self.stopped,
            hold_back_elapsed: &self.elapsed,
            now: self.now,
            token_floor: self.token_floor,
            closing: self.closing,
        })
    }

    /// Decide, and take the result as the new status.
    pub fn then(mut self) -> (Self, Decision) {
        let d = self.decide();
        self.status = d.status.clone();
        (self, d)
    }
}

impl Decision {
    fn holders(&self) -> Vec<&str> {
        self.status.holders.iter().map(|h| h.claim.as_str()).collect()
    }
    fn queue(&self) -> Vec<&str> {
        self.status.queue.iter().map(|w| w.claim.as_str()).collect()
    }
    fn granted(&self) -> Vec<(&str, i64)> {
        self.actions
            .iter()
            .filter_map(|a| match a.kind {
                ActionKind::Granted(token) => Some((a.claim.as_str(), token)),
                _ => None,
            })
            .collect()
    }
    fn revoked(&self) -> Vec<(&str, RevokeReason)> {
        self.actions
            .iter()
            .filter_map(|a| match a.kind {
                ActionKind::Revoked(_, reason) => Some((a.claim.as_str(), reason)),
                _ => None,
            })
            .collect()
    }
}

#[test]
fn first_claim_is_granted_token_one() {
    let d = lock().claims("a").decide();
    assert_eq!(d.holders(), ["a"]);
    assert_eq!(d.granted(), [("a", 1)]);
    assert_eq!(d.status.fencing_token, 1);
}

#[test]
fn new_claims_queue_in_arrival_order_behind_the_holder() {
    let d = lock().held_by("a").claims("c").claims("b").decide();
    assert_eq!(d.holders(), ["a"]);
    assert_eq!(d.queue(), ["c", "b"], "arrival order, not name order");
    assert_eq!(d.status.queue_length, 2);
}

#[test]
fn a_claim_whose_pod_is_not_seen_yet_keeps_its_place_for_the_grace() {
    // b claimed before c, but b's pod is not in the observer's cache yet (just created).
    let f = lock()
        .held_by("a")
        .claims("b")
        .claims("c")
        .just_made("b")
        .just_made("c")
        .pod_force_deleted("b");
    let d = f.decide();
    assert_eq!(d.queue(), Vec::<&str>::new(), "c is not queued ahead of b");
    assert!(d.ignored.is_empty(), "nor is either refused yet: {:?}", d.ignored);
    let grace = crate::protocol::timing::POD_CACHE_GRACE.as_secs() as i64;
    assert_eq!(d.recheck_at, Some(Timestamp::from_second(grace).unwrap()));
    // b's pod is seen within the grace: b first, then c.
    let d = f.clone().later(grace - 1).pod_seen("b").decide();
    assert_eq!(d.queue(), ["b", "c"]);
    assert_eq!(d.recheck_at, None);
    // Never seen: once the grace ends b is refused, and c goes ahead.
    let d = f.clone().later(grace).decide();
    assert_eq!(d.queue(), ["c"]);
    assert_eq!(d.ignored, [("b".to_string(), IgnoreReason::PodNotFound)]);
    // An old claim whose pod is not seen, or a pod known stopped, holds nobody back.
    let d = lock()
        .held_by("a")
        .claims("b")
        .claims("c")
        .pod_force_deleted("b")
        .decide();
    assert_eq!(d.queue(), ["c"]);
    let d = lock()
        .held_by("a")
        .claims("b")
        .claims("c")
        .just_made("b")
        .pod_gone("b")
        .decide();
    assert_eq!(d.queue(), ["c"]);
}

/// Issue #41: the grace covered a pod not seen at all, not a pod re-created under its
/// name (the cache still holds the old UID), nor a queued waiter whose pod a new
/// leader's cache does not hold yet: both lost their places at once.
#[test]
fn a_queued_waiter_whose_pod_is_not_seen_yet_keeps_its_place_for_the_grace() {
    let grace = crate::protocol::timing::POD_CACHE_GRACE.as_secs() as i64;
    // A new leader's pod cache lags behind b, whom the old leader queued.
    let f = lock()
        .held_by("a")
        .queued("b")
        .queued("c")
        .just_made("b")
        .pod_force_deleted("b");
    let d = f.clone().decide();
    assert_eq!(d.queue(), ["b", "c"], "b keeps its place: {:?}", d.actions);
    assert_eq!(d.recheck_at, Some(Timestamp::from_second(grace).unwrap()));
    let d = f.later(grace).decide();
    assert_eq!(d.queue(), ["c"], "never seen: dropped once the grace ends");
    // b's pod re-created under its name; the cache still holds the old one's UID.
    let f = lock()
        .held_by("a")
        .claims("b")
        .claims("c")
        .just_made("b")
        .just_made("c")
        .pod_force_replaced("b");
    let i = f.claims.iter().position(|c| c.name == "b").unwrap();
    let mut f = f;
    f.claims[i].pod_uid = "uid-b-newest".into(); // the claim names the new pod
    let d = f.clone().decide();
    assert!(d.queue().is_empty() && d.ignored.is_empty(), "{:?}", d);
    let d = f.later(grace).decide();
    assert_eq!(d.queue(), ["c"]);
    assert_eq!(d.ignored, [("b".to_string(), IgnoreReason::PodUidMismatch)]);
}

#[test]
fn release_hands_over_to_the_head_of_the_queue_and_deletes_the_claim() {
    let d = lock().held_by("a").queued("b").queued("c").released("a").decide();
    assert_eq!(d.holders(), ["b"]);
    assert_eq!(d.queue(), ["c"]);
    assert_eq!(d.granted(), [("b", 2)]);
    assert_eq!(d.delete_claims, ["a"]);
}

#[test]
fn pod_gone_replaced_or_finished_frees_the_slot_at_once() {
    for (f, reason) in [
        (lock().held_by("a").queued("b").pod_gone("a"), RevokeReason::PodGone),
        (
            lock().held_by("a").queued("b").pod_replaced("a"),
            RevokeReason::PodReplaced,
        ),
        (
            lock().held_by("a").queued("b").pod_finished("a"),
            RevokeReason::PodFinished,
        ),
        (lock().held_by("a").queued("b").expired("a"), RevokeReason::Expired),
    ] {
        let d = f.decide();
        assert_eq!(d.revoked(), [("a", reason)]);
        assert_eq!(d.holders(), ["b"], "{reason:?} frees the slot at once");
    }
}

#[test]
fn a_force_deleted_or_force_replaced_pod_holds_its_slot_back_until_the_delay_elapses() {
    for (f, reason) in [
        (
            lock().held_by("a").queued("b").pod_force_deleted("a"),
            RevokeReason::PodGone,
        ),
        (
            lock().held_by("a").queued("b").pod_force_replaced("a"),
            RevokeReason::PodReplaced,
        ),
    ] {
        let (f, d) = f.then();
        assert_eq!(d.revoked(), [("a", reason)]);
        assert_eq!(d.holders(), ["a"], "{reason:?}: its process may run on");
        assert!(d.status.holders[0].revoked.is_some());
        let d = f.clone().decide();
        assert!(d.actions.is_empty(), "nothing changes until the delay elapses");
        let d = f.hold_back_elapsed("a").decide();
        assert_eq!(d.holders(), ["b"]);
    }
}

#[test]
fn a_force_deleted_pod_whose_claim_expired_frees_its_slot_at_once() {
    let d = lock()
        .held_by("a")
        .queued("b")
        .expired("a")
        .pod_force_deleted("a")
        .decide();
    assert_eq!(d.revoked(), [("a", RevokeReason::PodGone)]);
    assert_eq!(d.holders(), ["b"], "the client stopped itself before expiry");
}

#[test]
fn a_held_back_slot_passes_on_once_the_kubelet_reports_the_pod_stopped() {
    let (f, _) = lock().held_by("a").queued("b").pod_force_deleted("a").then();
    let mut f = f;
    f.stopped.insert("uid-a".into());
    assert_eq!(f.decide().holders(), ["b"]);
}

#[test]
fn a_forged_release_of_a_holder_holds_its_slot_back_and_drops_a_waiter() {
    let (f, d) = lock()
        .held_by("a")
        .queued("b")
        .queued("c")
        .forged("a")
        .forged("c")
        .then();
    assert_eq!(d.revoked(), [("a", RevokeReason::ForceReleased)]);
    assert_eq!(d.holders(), ["a"], "a's process may run on: its slot is held back");
    assert_eq!(
        d.queue(),
        ["b"],
        "a forged withdrawal drops the waiter, as deleting its claim would"
    );
    assert!(d.delete_claims.contains(&"c".to_string()));
    assert!(d.delete_claims.contains(&"a".to_string()));
    assert_eq!(f.hold_back_elapsed("a").decide().holders(), ["b"]);
}

#[test]
fn a_fresh_lock_counts_its_tokens_from_the_epoch_and_keeps_it() {
    let mut f = lock();
    f.token_floor = 1_000_000;
    let (mut f, d) = f.claims("a").then();
    assert_eq!(d.granted(), [("a", 1_000_001)]);
    assert_eq!(d.status.fencing_token_epoch, Some(1_000_000));
    f.token_floor = 5_000_000; // a later clock changes nothing once the epoch is set
    let d = f.released("a").claims("b").decide();
    assert_eq!(d.granted(), [("b", 1_000_002)]);
}

#[test]
fn a_lock_that_issued_tokens_before_epochs_keeps_counting() {
    let mut f = lock().held_by("a").queued("b").released("a");
    f.token_floor = 1_000_000;
    let d = f.decide();
    assert_eq!(d.granted(), [("b", 2)]);
    assert_eq!(d.status.fencing_token_epoch, Some(0));
}

/// Issue #41: a claim created with a fencing-token stamp (anyone who may patch Leases
/// can write one) was taken as an earlier incarnation's holder: it skipped the queue
/// and held a slot back for its lease, an hour. It is a new claim like any other.
#[test]
fn a_stamped_claim_is_no_holder_and_waits_its_turn() {
    let mut f = lock().held_by("h").claims("w").claims("stamped");
    f.status.fencing_token_epoch = Some(100); // the stamp is below it
    let i = f.claims.iter().position(|c| c.name == "stamped").unwrap();
    f.claims[i].stamped_token = Some(7);
    f.claims[i].arrival.seen_seq = u64::MAX; // after w
    let d = f.clone().decide();
    assert!(d.revoked().is_empty(), "{:?}", d.actions);
    assert_eq!(d.holders(), ["h"]);
    assert_eq!(d.queue(), ["w", "stamped"], "in arrival order, behind w");
    let _old = crate::mutant::mutate(crate::mutant::Mutant::StampTrusted);
    let d = f.decide();
    assert_eq!(d.holders(), ["h", "stamped"], "the old trust held a slot for it");
}

/// Issue #41: a new claim that states no lease is refused (its process wrote one), not
/// recorded without one; one already recorded keeps its record.
#[test]
fn a_new_claim_stating_no_lease_is_refused_for_it() {
    let mut f = lock().held_by("h").claims("w");
    f.claims[1].lease_seconds = 0;
    let d = f.clone().decide();
    assert_eq!(d.ignored, [("w".to_string(), IgnoreReason::LeaseMissing)]);
    assert!(d.queue().is_empty());
    let _old = crate::mutant::mutate(crate::mutant::Mutant::QueuedWithoutLease);
    let d = f.decide();
    assert_eq!(
        d.status.queue[0].lease_duration_seconds, None,
        "recorded without a lease"
    );
}

#[test]
fn a_holders_own_lease_is_recorded_at_the_grant() {
    let d = lock().claims("a").decide();
    assert_eq!(d.status.holders[0].lease_duration_seconds, Some(15));
}

/// Decide on `f` again: nothing changes before a hold-back's delay has elapsed.
fn nothing_changes(f: Fixture) -> Fixture {
    let (f, d) = f.then();
    assert!(
        d.actions.is_empty(),
        "nothing changes before the delay: {:?}",
        d.actions
    );
    f
}

#[test]
fn forced_release_holds_the_slot_back_until_the_delay_elapses() {
    let (f, d) = lock().held_by("a").queued("b").claim_deleted("a").then();
    assert_eq!(d.revoked(), [("a", RevokeReason::ForceReleased)]);
    assert_eq!(d.holders(), ["a"], "slot held back");
    assert!(d.status.holders[0].revoked.is_some());
    assert_eq!(d.queue(), ["b"]);

    let f = nothing_changes(f);

    let d = f.hold_back_elapsed("a").decide();
    assert_eq!(d.holders(), ["b"]);
    assert_eq!(d.granted(), [("b", 2)]);
}

#[test]
fn forced_release_slot_passes_on_when_the_pod_goes() {
    let (f, _) = lock().held_by("a").queued("b").claim_deleted("a").then();
    let d = f.pod_gone("a").decide();
    assert!(matches!(d.actions[0].kind, ActionKind::SlotFreed(1)));
    assert_eq!(d.holders(), ["b"]);
}

#[test]
fn semaphore_grants_up_to_max_holders() {
    let d = lock()
        .max_holders(3)
        .claims("a")
        .claims("b")
        .claims("c")
        .claims("d")
        .decide();
    assert_eq!(d.holders(), ["a", "b", "c"]);
    assert_eq!(d.queue(), ["d"]);
    assert_eq!(d.granted(), [("a", 1), ("b", 2), ("c", 3)]);
}

#[test]
fn lowering_max_holders_revokes_no_one_and_grants_nothing() {
    let d = lock()
        .max_holders(3)
        .held_by("a")
        .held_by("b")
        .queued("c")
        .max_holders(1)
        .decide();
    assert_eq!(d.holders(), ["a", "b"]);
    assert_eq!(d.queue(), ["c"]);
}

#[test]
fn waiters_that_withdraw_expire_or_lose_their_pod_drop_out() {
    let d = lock().held_by("a").queued("b").queued("c").queued("d").queued("e");
    let d = d.released("b").expired("c").pod_gone("d").decide();
    assert_eq!(d.queue(), ["e"]);
    assert_eq!(d.delete_claims, ["b", "c", "d"]);
}

#[test]
fn claims_of_unknown_or_stale_pods_are_ignored_not_queued() {
    let d = lock()
        .held_by("a")
        .claims("b")
        .pod_gone("b")
        .claims("c")
        .pod_replaced("c")
        .decide();
    assert_eq!(d.queue(), Vec::<&str>::new());
    assert_eq!(
        d.ignored,
        [
            ("b".to_string(), IgnoreReason::PodNotFound),
            ("c".to_string(), IgnoreReason::PodUidMismatch)
        ]
    );
}

#[test]
fn a_full_queue_refuses_new_claims_lists_them_for_their_clients_and_takes_them_in_order_once_room_frees() {
    let mut f = lock().held_by("a");
    for i in 0..MAX_QUEUE {
        f = f.claims(&format!("w{i:04}"));
    }
    let (f, d) = f.claims("late").claims("later").then();
    assert_eq!(d.status.queue.len(), MAX_QUEUE, "the successor and 999 behind it");
    let listed = refusals(&d.ignored, |_| false);
    let refused: Vec<_> = listed.iter().map(|r| (r.claim.as_str(), r.reason)).collect();
    assert_eq!(
        refused,
        [("late", IgnoreReason::QueueFull), ("later", IgnoreReason::QueueFull)]
    );
    let f = nothing_changes(f);
    // a releases: its successor is granted, and one place frees for the first refused.
    let (f, d) = f.released("a").then();
    assert_eq!(d.granted(), [("w0000", 2)]);
    assert_eq!(d.status.queue.last().map(|w| w.claim.as_str()), Some("late"));
    let listed = refusals(&d.ignored, |_| false);
    assert_eq!(listed.len(), 1, "later waits for room");
    assert_eq!(listed[0].claim, "later");
    assert!(f.decide().status.queue.len() <= MAX_QUEUE);
}

#[test]
fn refused_claims_are_listed_at_most_sixteen_in_arrival_order() {
    let mut f = lock();
    for i in 0..20 {
        f = f.claims(&format!("c{i:02}")).pod_force_deleted(&format!("c{i:02}"));
    }
    let d = f.decide();
    assert_eq!(d.ignored.len(), 20);
    let refused = refusals(&d.ignored, |_| false);
    let listed: Vec<_> = refused.iter().map(|r| r.claim.as_str()).collect();
    let expected: Vec<String> = (0..MAX_REFUSED_LISTED).map(|i| format!("c{i:02}")).collect();
    assert_eq!(listed, expected);
    let refused = refusals(&d.ignored, |c| c == "c00");
    assert_eq!(refused[0].claim, "c01", "a claim on its way out is not listed");
}

#[test]
fn deciding_twice_changes_nothing() {
    let (f, _) = lock().held_by("a").queued("b").claims("c").released("a").then();
    let d = f.decide();
    assert!(d.actions.is_empty(), "{:?}", d.actions);
    assert_eq!(d.status, f.status);
}

#[test]
fn tokens_continue_from_status_even_when_holders_carry_higher_ones() {
    let mut f = lock().held_by("a").queued("b");
    f.status.fencing_token = 0; // a hand-edited status
    let d = f.released("a").decide();
    assert_eq!(d.granted(), [("b", 2)], "never reuse a holder's token");
}

fn successor(d: &Decision) -> Option<(&str, i64)> {
    d.status.successor.as_ref().map(|s| (s.claim.as_str(), s.fencing_token))
}

#[test]
fn the_head_of_a_full_lock_is_designated_with_the_next_token_which_its_grant_keeps() {
    let (f, d) = lock().held_by("a").queued("b").queued("c").then();
    assert_eq!(successor(&d), Some(("b", 2)), "designated while the only slot is taken");
    assert_eq!(d.status.fencing_token, 2, "the reserved token counts as issued");
    let (f, d) = f.claims("d").then();
    assert_eq!(successor(&d), Some(("b", 2)), "a newcomer changes no designation");
    assert_eq!(d.queue(), ["b", "c", "d"]);
    let (_, d) = f.released("a").then();
    assert_eq!(
        d.granted(),
        [("b", 2)],
        "the freed slot goes to the successor, with its token"
    );
    assert_eq!(successor(&d), Some(("c", 3)));
    let d = lock().held_by("a").queued("b").decide();
    assert_eq!(successor(&d), Some(("b", 2)));
    let d = lock().max_holders(2).held_by("a").queued("b").decide();
    assert_eq!(d.granted(), [("b", 2)]);
    assert_eq!(successor(&d), None, "nobody waits");
    let d = lock().held_by("a").decide();
    assert_eq!(successor(&d), None);
}

#[test]
fn a_successor_that_may_have_been_told_of_its_grant_and_may_run_holds_a_slot_back() {
    let (designated, _) = lock().held_by("a").queued("b").queued("c").then();
    for (f, reason) in [
        (designated.clone().pod_force_deleted("b"), RevokeReason::PodGone),
        (designated.clone().pod_force_replaced("b"), RevokeReason::PodReplaced),
        (designated.clone().forged("b"), RevokeReason::ForceReleased),
        (designated.clone().claim_deleted("b"), RevokeReason::ForceReleased),
    ] {
        let (f, d) = f.then();
        assert_eq!(d.revoked(), [("b", reason)], "{reason:?}");
        assert_eq!(d.holders(), ["a", "b"], "{reason:?}: b keeps a slot held back");
        assert_eq!(d.status.holders[1].fencing_token, 2, "with its reserved token");
        assert_eq!(successor(&d), Some(("c", 3)), "{reason:?}");
        // a leaves: b's held-back slot still counts, so c waits for it.
        let (f, d) = f.released("a").then();
        assert_eq!(d.granted(), [], "{reason:?}");
        let d = f.hold_back_elapsed("b").decide();
        assert_eq!(d.granted(), [("c", 3)], "{reason:?}");
    }
}

#[test]
fn a_successor_that_withdrew_or_certainly_stopped_leaves_its_place_to_the_next() {
    let (designated, _) = lock().held_by("a").queued("b").queued("c").then();
    for (f, reason) in [
        (designated.clone().released("b"), DropReason::Withdrawn),
        (designated.clone().expired("b"), DropReason::Expired),
        (designated.clone().pod_gone("b"), DropReason::PodGone),
        (designated.clone().pod_finished("b"), DropReason::PodFinished),
    ] {
        let d = f.decide();
        let dropped: Vec<_> = d.actions.iter().map(|a| (a.claim.as_str(), a.kind)).collect();
        assert_eq!(dropped, [("b", ActionKind::Dropped(reason))]);
        assert_eq!(d.holders(), ["a"], "{reason:?}: no slot held back");
        assert_eq!(successor(&d), Some(("c", 3)), "{reason:?}: b's token is never issued");
        assert_eq!(d.delete_claims, ["b"]);
    }
}

#[test]
fn a_held_back_successor_whose_claim_is_gone_keeps_the_lease_it_stated_at_its_designation() {
    let mut f = lock().held_by("a").queued("b");
    f.claims.iter_mut().find(|c| c.name == "b").unwrap().lease_seconds = 60;
    f.status.queue[0].lease_duration_seconds = Some(60); // as stated when queued
    let (designated, d) = f.then();
    let s = d.status.successor.as_ref().unwrap();
    assert_eq!(s.lease_duration_seconds, Some(60), "recorded at the designation");
    // b may have been told of its grant; then its claim is gone (its pod force-deleted
    // and garbage-collected), and the lock's lease is shortened.
    let mut gone = designated.clone().claim_deleted("b").pod_force_deleted("b");
    gone.spec.lease_duration_seconds = 10;
    let d = gone.decide();
    assert_eq!(d.holders(), ["a", "b"]);
    assert_eq!(
        d.status.holders[1].lease_duration_seconds,
        Some(60),
        "not the lock's 10 s"
    );
    // Its claim patched to a shorter lease: neither the designation nor the hold-back
    // takes it.
    let mut patched = designated.clone();
    patched.claims.iter_mut().find(|c| c.name == "b").unwrap().lease_seconds = 5;
    let (patched, d) = patched.then();
    assert_eq!(d.status.successor.as_ref().unwrap().lease_duration_seconds, Some(60));
    let d = patched.forged("b").decide();
    assert_eq!(d.holders(), ["a", "b"]);
    assert_eq!(
        d.status.holders[1].lease_duration_seconds,
        Some(60),
        "not the patched 5 s"
    );
    // No lease recorded, at its queueing (an older controller's) or its designation:
    // held back for the longest there can be.
    let mut unknown = designated.claim_deleted("b").pod_force_deleted("b");
    unknown.status.successor.as_mut().unwrap().lease_duration_seconds = None;
    unknown.status.queue[0].lease_duration_seconds = None;
    let d = unknown.decide();
    assert_eq!(d.status.holders[1].lease_duration_seconds, Some(MAX_LEASE_SECONDS));
}

#[test]
fn a_waiters_lease_recorded_when_first_queued_is_never_lowered_by_its_claim() {
    // b's claim states 60 s when it is first queued behind a; then a neighbour patches it
    // down to 1 s (issue #30, item 1): neither the designation nor the grant takes that.
    let mut f = lock().held_by("a").claims("b");
    f.claims.iter_mut().find(|c| c.name == "b").unwrap().lease_seconds = 60;
    let (mut f, d) = f.then();
    assert_eq!(
        d.status.queue[0].lease_duration_seconds,
        Some(60),
        "recorded at queueing"
    );
    f.claims.iter_mut().find(|c| c.name == "b").unwrap().lease_seconds = 1;
    let (f, d) = f.then();
    assert_eq!(d.status.successor.as_ref().unwrap().lease_duration_seconds, Some(60));
    assert_eq!(d.status.queue[0].lease_duration_seconds, Some(60), "the record stays");
    let d = f.released("a").decide();
    assert_eq!(d.granted(), [("b", 2)]);
    assert_eq!(
        d.status.holders[0].lease_duration_seconds,
        Some(60),
        "not the patched 1 s"
    );
    // Not designated first (two slots): the grant still takes the queued record.
    let mut f = lock().max_holders(2).held_by("a").held_by("c").claims("b");
    f.claims.iter_mut().find(|c| c.name == "b").unwrap().lease_seconds = 45;
    let (mut f, _) = f.then();
    f.claims.iter_mut().find(|c| c.name == "b").unwrap().lease_seconds = 1;
    let d = f.released("a").decide();
    let b = d.status.holders.iter().find(|h| h.claim == "b").unwrap();
    assert_eq!(b.lease_duration_seconds, Some(45), "not the patched 1 s");
}

/// Found by the chaos soak (issue #41): a neighbour raised a queued claim's lease to
/// an hour; its grant recorded that, and a forged mark on it then held the slot back an
/// hour (a lock wedged). The grant records what was recorded while it waited.
#[test]
fn a_waiters_lease_patched_up_after_it_was_queued_is_not_what_its_grant_records() {
    let mut f = lock().held_by("a").claims("b");
    f.claims.iter_mut().find(|c| c.name == "b").unwrap().lease_seconds = 15;
    let (mut f, _) = f.then();
    f.claims.iter_mut().find(|c| c.name == "b").unwrap().lease_seconds = 3600;
    let (f, d) = f.then();
    assert_eq!(d.status.successor.as_ref().unwrap().lease_duration_seconds, Some(15));
    let d = f.released("a").decide();
    assert_eq!(
        d.status.holders[0].lease_duration_seconds,
        Some(15),
        "not the raised 3600 s"
    );
}

#[test]
fn a_closing_lock_revokes_its_holders_and_successor_and_grants_nothing() {
    let d = lock().closing().claims("a").decide();
    assert!(d.granted().is_empty(), "a free slot is not granted: {:?}", d.actions);
    assert_eq!(d.queue(), ["a"]);
    assert_eq!(successor(&d), None, "nobody is designated");

    let (f, _) = lock().held_by("a").queued("b").queued("c").then();
    let (closing, d) = f.closing().then();
    assert_eq!(
        d.revoked(),
        [("a", RevokeReason::LockDeleted), ("b", RevokeReason::LockDeleted)],
        "the holder, and the successor that may have been told of its grant"
    );
    assert_eq!(d.holders(), ["a", "b"], "their slots held back until they stop");
    assert!(d.status.holders.iter().all(|h| h.revoked.is_some()));
    assert_eq!(d.status.holders[1].fencing_token, 2, "b's slot with its reserved token");
    assert!(d.delete_claims.is_empty(), "their claims stay, for their releases");
    assert_eq!(successor(&d), None);
    assert_eq!(d.queue(), ["c"], "a waiter waits on, for a lock of the same name");
    let closing = nothing_changes(closing);
    let d = closing.released("a").released("b").decide();
    assert!(d.holders().is_empty(), "valid releases free the slots at once");
    assert!(d.granted().is_empty(), "but the freed slots go to no one");
    assert_eq!(d.delete_claims, ["a", "b"]);
}

#[test]
fn a_closing_lock_runs_out_a_held_back_slot_as_ever() {
    // a's pod is force-deleted: its process may run on, so its slot is held back; the
    // lock may go only once it has no holder left.
    let (f, d) = lock().closing().held_by("a").queued("b").pod_force_deleted("a").then();
    assert_eq!(d.revoked(), [("a", RevokeReason::PodGone)]);
    assert!(d.status.holders[0].revoked.is_some(), "held back while closing too");
    let f = nothing_changes(f);
    let d = f.hold_back_elapsed("a").decide();
    assert!(d.holders().is_empty(), "the hold-back ran out: nothing held back");
    assert!(d.granted().is_empty());
}

/// Issue #41: `maxQueue` counts entries, not bytes. Whatever the claims say (the
/// longest names Kubernetes allows, pod UIDs of any length and characters JSON must
/// escape, hashes), and however many wait or hold, the status stays within its budget:
/// a claim whose entry would pass it is refused `QueueFull`.
#[test]
fn no_claim_content_pushes_a_status_past_its_budget() {
    let long = |i: usize, c: char| format!("{i:04}{}", c.to_string().repeat(249));
    for (holders, queue, uid_len) in [(1, 4000, 36), (1000, 4000, 128), (1, 4000, 4000)] {
        let mut f = lock().max_holders(holders);
        f.spec.max_queue = Some(queue);
        for i in 0..5000 {
            let name = long(i, 'c');
            f = f.claims(&name);
            let pod = long(i, 'p');
            let uid = format!("\"\\\u{1}{}", "u".repeat(uid_len));
            let c = f.claims.last_mut().unwrap();
            (c.pod, c.pod_uid) = (pod.clone(), uid.clone());
            c.release_hash = Some("a".repeat(64));
            c.wait_hash = Some("b".repeat(64));
            f.pods.remove(&name);
            f.pods.insert(pod, PodView { uid, finished: false });
        }
        let (f, d) = f.then();
        let (_, again) = f.then();
        for status in [&d.status, &again.status] {
            let mut entries = status.clone();
            entries.refused.clear();
            entries.conditions.clear();
            let bytes = serde_json::to_string(&entries).unwrap().len();
            assert!(
                bytes <= STATUS_BUDGET_BYTES,
                "{holders} holders, maxQueue {queue}, UIDs of {uid_len}: {bytes} bytes"
            );
        }
        let full = d.ignored.iter().filter(|(_, r)| *r == IgnoreReason::QueueFull).count();
        assert!(full > 0, "the budget refused some: {} queued", d.status.queue.len());
    }
}
