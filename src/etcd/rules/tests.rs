//! The etcd rules, by example. The model of etcd, pods, processes, time and the
//! controller that ships, which explores them, is `testing::explore::etcd`.

use super::*;

const LOCK_LEASE: i32 = 10;

fn spec(max_holders: i32) -> DistributedLockSpec {
    spec_with(max_holders, LOCK_LEASE)
}

pub(crate) fn spec_with(max_holders: i32, lease: i32) -> DistributedLockSpec {
    DistributedLockSpec {
        lease_duration_seconds: lease,
        max_holders,
        backend: None,
        max_queue: None,
    }
}

pub(crate) fn key(claim: &str, rev: i64, pod: &str) -> KeyView {
    KeyView {
        key: format!("/leasehold/ns/l/{claim}"),
        claim: claim.into(),
        create_revision: rev,
        mod_revision: rev,
        lease: rev * 100,
        value: Some(ClaimValue {
            pod: pod.into(),
            pod_uid: format!("uid-{pod}"),
            lease_seconds: 5,
            held_back: None,
        }),
    }
}

fn pods(names: &[&str]) -> BTreeMap<String, PodView> {
    names
        .iter()
        .map(|p| {
            let view = PodView {
                uid: format!("uid-{p}"),
                finished: false,
            };
            (p.to_string(), view)
        })
        .collect()
}

#[test]
fn the_first_keys_by_create_revision_hold_with_their_revision_as_token() {
    let keys = [key("c", 30, "c"), key("a", 10, "a"), key("b", 20, "b")];
    let m = mirror(
        &keys,
        &spec(2),
        &Default::default(),
        &pods(&["a", "b", "c"]),
        &Default::default(),
        Timestamp::now(),
    );
    let holders: Vec<_> = m
        .status
        .holders
        .iter()
        .map(|h| (h.claim.as_str(), h.fencing_token))
        .collect();
    assert_eq!(holders, [("a", 10), ("b", 20)]);
    assert_eq!(
        m.status.queue.iter().map(|w| w.claim.as_str()).collect::<Vec<_>>(),
        ["c"]
    );
    assert_eq!((m.status.queue_length, m.status.fencing_token), (1, 20));
    assert!(m.actions.is_empty(), "all pods live: {:?}", m.actions);
}

#[test]
fn the_token_high_water_mark_never_goes_back() {
    let prev = DistributedLockStatus {
        fencing_token: 99,
        ..Default::default()
    };
    let m = mirror(
        &[key("a", 10, "a")],
        &spec(1),
        &prev,
        &pods(&["a"]),
        &Default::default(),
        Timestamp::now(),
    );
    assert_eq!(m.status.fencing_token, 99);
}

#[test]
fn a_force_deleted_pod_s_key_is_held_back_in_place_and_a_stopped_one_deleted() {
    let keys = [key("a", 10, "a"), key("b", 20, "b"), key("c", 30, "c")];
    // a: force-deleted (no word from the kubelet); b: deleted after its containers stopped.
    let stopped = ["uid-b".to_string()].into_iter().collect();
    let m = mirror(
        &keys,
        &spec(1),
        &Default::default(),
        &pods(&["c"]),
        &stopped,
        Timestamp::now(),
    );
    let [
        KeyAction::HoldBack {
            claim,
            ttl_seconds,
            value,
            client_lease,
            ..
        },
        KeyAction::Delete {
            claim: deleted, reason, ..
        },
    ] = m.actions.as_slice()
    else {
        panic!("expected a hold-back and a delete: {:?}", m.actions)
    };
    assert_eq!((claim.as_str(), *client_lease), ("a", 1000));
    assert_eq!(value.held_back, Some(RevokeReason::PodGone));
    assert!(
        *ttl_seconds >= i64::from(LOCK_LEASE),
        "held back for at least the lock's lease"
    );
    assert_eq!((deleted.as_str(), *reason), ("b", RevokeReason::PodGone));
}

#[test]
fn a_held_back_key_shows_as_revoked_and_goes_at_once_when_its_pod_is_known_stopped() {
    let mut a = key("a", 10, "a");
    a.value.as_mut().unwrap().held_back = Some(RevokeReason::PodGone);
    let m = mirror(
        &[a.clone()],
        &spec(1),
        &Default::default(),
        &pods(&[]),
        &Default::default(),
        Timestamp::now(),
    );
    assert!(m.actions.is_empty(), "it waits for its lease: {:?}", m.actions);
    assert_eq!(
        m.status.holders[0].revoked.as_ref().map(|r| r.reason),
        Some(RevokeReason::PodGone)
    );
    let stopped = ["uid-a".to_string()].into_iter().collect();
    let m = mirror(
        &[a],
        &spec(1),
        &Default::default(),
        &pods(&[]),
        &stopped,
        Timestamp::now(),
    );
    assert!(matches!(m.actions.as_slice(), [KeyAction::Delete { .. }]));
}

#[test]
fn a_key_that_is_no_claim_is_reported_and_held_back_so_it_cannot_block_for_ever() {
    let mut junk = key("junk", 5, "x");
    junk.value = None;
    let m = mirror(
        &[junk],
        &spec(1),
        &Default::default(),
        &pods(&[]),
        &Default::default(),
        Timestamp::now(),
    );
    assert_eq!(m.invalid, ["junk"]);
    assert!(matches!(
        m.actions.as_slice(),
        [KeyAction::HoldBack {
            reason: RevokeReason::ForceReleased,
            ..
        }]
    ));
}

#[test]
fn next_in_line_tracks_a_mutex_waiter_behind_watches_the_key_second_ahead_a_semaphore_s_every_deletion() {
    assert!(holds(0, 1) && !holds(1, 1) && holds(2, 3) && !holds(3, 3));
    assert_eq!(wake_on(1, 1), WakeOn::Tracking);
    assert_eq!(wake_on(2, 1), WakeOn::SecondAhead);
    assert_eq!(wake_on(9, 0), WakeOn::SecondAhead);
    assert_eq!(wake_on(3, 3), WakeOn::Tracking);
    assert_eq!(wake_on(4, 3), WakeOn::AnyDeletion);
}

#[test]
fn a_tracking_waiter_holds_at_the_deletion_that_frees_its_slot_and_not_before() {
    let own = b"/l/me".as_slice();
    let mut ahead: BTreeSet<Vec<u8>> = [b"/l/a".to_vec(), b"/l/b".to_vec()].into();
    use KeyChange::{Delete, Put};
    // A key created behind it, a key ahead moved (held back): still waiting.
    assert_eq!(
        track_ahead(&mut ahead, own, [Put(b"/l/z"), Put(b"/l/a")], 1),
        Tracked::Waiting
    );
    // A key behind deleted: still waiting; one ahead deleted: one is left.
    assert_eq!(track_ahead(&mut ahead, own, [Delete(b"/l/z")], 1), Tracked::Waiting);
    assert_eq!(track_ahead(&mut ahead, own, [Delete(b"/l/a")], 1), Tracked::Waiting);
    assert_eq!(track_ahead(&mut ahead, own, [Delete(b"/l/b")], 1), Tracked::Holds);
    // A semaphore of 2: one deletion of two ahead frees a slot.
    let mut two: BTreeSet<Vec<u8>> = [b"/l/a".to_vec(), b"/l/b".to_vec()].into();
    assert_eq!(track_ahead(&mut two, own, [Delete(b"/l/b")], 2), Tracked::Holds);
}

#[test]
fn a_tracking_waiter_whose_own_key_changed_in_the_same_revision_is_lost() {
    let own = b"/l/me".as_slice();
    use KeyChange::{Delete, Put};
    for mine in [Put(own), Delete(own)] {
        let mut ahead: BTreeSet<Vec<u8>> = [b"/l/a".to_vec()].into();
        // The key ahead goes in the same revision as its own key is moved or deleted.
        assert_eq!(track_ahead(&mut ahead, own, [Delete(b"/l/a"), mine], 1), Tracked::Lost);
        let mut ahead: BTreeSet<Vec<u8>> = [b"/l/a".to_vec()].into();
        assert_eq!(track_ahead(&mut ahead, own, [mine, Delete(b"/l/a")], 1), Tracked::Lost);
    }
    // A response with no events (the watch's creation) decides nothing.
    let mut none: BTreeSet<Vec<u8>> = BTreeSet::new();
    assert_eq!(track_ahead(&mut none, own, [], 1), Tracked::Waiting);
}
