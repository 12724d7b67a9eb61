//! A neighbour with every lock user's rights (the client Role of `examples/rbac.yaml`:
//! create and patch Leases, read locks) tampering with other pods' claims through raw
//! merge PATCHes, as an attacker would (that Role cannot even GET a Lease). Each test
//! fails on the code before issue #30's fixes.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, Patch, PatchParams, PostParams};
use leasehold::api::DistributedLockSpec;
use leasehold::client::{Error, Guard, Lock};
use leasehold::protocol::{LOCK_LABEL, PodIdentity, RELEASE_HASH_ANNOTATION, RELEASED_LABEL};
use tokio::task::JoinHandle;

use crate::support::*;

fn lock_for(ns: &TestNs, pod: PodIdentity) -> Lock {
    Lock::builder(ns.client.clone(), &ns.name, "l")
        .identity(pod)
        .build()
        .unwrap()
}

/// The neighbour's raw merge PATCH of Lease `name` (no GET first: it may not read).
async fn neighbour_patch(neighbour: &kube::Client, ns: &TestNs, name: &str, patch: serde_json::Value) {
    let leases: Api<Lease> = Api::namespaced(neighbour.clone(), &ns.name);
    leases
        .patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .unwrap_or_else(|e| panic!("the client Role may patch Lease {name}: {e}"));
}

/// The names of the lock's claims, as admin (what the neighbour learns from the lock's
/// status, public to every lock user, or guesses).
async fn claim_names(ns: &TestNs) -> Vec<String> {
    let list = leases(ns).list(&Default::default()).await.unwrap();
    list.items.into_iter().filter_map(|l| l.metadata.name).collect()
}

/// Pod b asks for lock l, which does not exist yet (its acquire on a task of its own);
/// returns the acquire and b's claim, which nobody records until l is made.
async fn b_claims_a_lock_not_made_yet(ns: &TestNs) -> (JoinHandle<Result<Guard, Error>>, String) {
    let lock_b = lock_for(ns, ns.pod("b").await);
    let waiting = tokio::spawn(async move { lock_b.acquire().await });
    let cb = wait_for("b's claim", DEADLINE, || async { claim_names(ns).await.pop() }).await;
    (waiting, cb)
}

/// Lock l (lease `lease`) held by pod a through the library, and pod b waiting for it
/// (its acquire on a task of its own); returns a's guard, b's acquire and b's claim.
async fn b_waits_behind_a(ns: &TestNs, lease: i32) -> (Guard, JoinHandle<Result<Guard, Error>>, String) {
    ns.lock("l", spec(lease)).await;
    let (a, b) = (ns.pod("a").await, ns.pod("b").await);
    let held = lock_for(ns, a).acquire().await.unwrap();
    let lock_b = lock_for(ns, b);
    let waiting = tokio::spawn(async move { lock_b.acquire().await });
    let l = ns.wait_lock("l", "b waits", |l| queue(l) == ["b"]).await;
    let cb = l.status.unwrap().queue[0].claim.clone();
    (held, waiting, cb)
}

#[tokio::test]
async fn a_waiters_lease_patched_down_before_its_grant_is_not_what_its_grant_records() {
    let ns = TestNs::new("nb-lease").await;
    let neighbour = ns.as_lock_user().await;
    let _c = spawn_controller(&ns, "nb-lease");
    let (held, waiting, cb) = b_waits_behind_a(&ns, 60).await;
    // The lock is edited to 15 s; the neighbour patches b's claim down to 1 s.
    let edit = Patch::Merge(serde_json::json!({"spec": {"leaseDurationSeconds": 15}}));
    ns.locks().patch("l", &PatchParams::default(), &edit).await.unwrap();
    neighbour_patch(
        &neighbour,
        &ns,
        &cb,
        serde_json::json!({"spec": {"leaseDurationSeconds": 1}}),
    )
    .await;
    held.release().await.unwrap();
    let g = tokio::time::timeout(DEADLINE, waiting).await.unwrap().unwrap().unwrap();
    assert_eq!(g.claim(), cb, "b's claim was granted");
    let l = ns.recorded("l", g.claim()).await;
    let h = &l.status.unwrap().holders[0];
    assert_eq!(
        h.lease_duration_seconds,
        Some(60),
        "the grant records the lease b's claim stated when first queued, not the patched 1 s \
         (the controller would expire b, renewing every 20 s, 17 s after its grant)"
    );
    // The change is reported on the claim; the record stands.
    wait_event(&ns, &cb, "ClaimTampered").await;
    g.release().await.unwrap();
}

#[tokio::test]
async fn a_claim_changed_before_it_was_first_queued_is_withdrawn_not_acted_on() {
    let ns = TestNs::new("nb-hash").await;
    let neighbour = ns.as_lock_user().await;
    let _c = spawn_controller(&ns, "nb-hash");
    // b claims a lock that does not exist yet: nobody records its claim meanwhile.
    let (waiting, cb) = b_claims_a_lock_not_made_yet(&ns).await;
    // The neighbour strips its release hash, so that a plain "true" mark (anyone's)
    // would release it once granted.
    let strip = serde_json::json!({"metadata": {"annotations": {RELEASE_HASH_ANNOTATION: null}}});
    neighbour_patch(&neighbour, &ns, &cb, strip).await;
    ns.lock("l", spec(15)).await;
    let g = tokio::time::timeout(DEADLINE, waiting).await.unwrap().unwrap().unwrap();
    assert_ne!(
        g.claim(),
        cb,
        "b acted on the grant of the claim whose hash was stripped: a forged release frees its slot while it runs"
    );
    let l = ns.recorded("l", g.claim()).await;
    let h = &l.status.unwrap().holders[0];
    assert_eq!(h.claim, g.claim());
    assert!(h.release_hash.is_some(), "b's new claim is recorded with its hash");
    g.release().await.unwrap();
}

#[tokio::test]
async fn a_claim_whose_pod_uid_was_changed_before_it_was_queued_is_made_anew_not_waited_on() {
    let ns = TestNs::new("nb-poduid").await;
    let neighbour = ns.as_lock_user().await;
    let _c = spawn_controller(&ns, "nb-poduid");
    // b claims a lock that does not exist yet; the neighbour (who learnt the claim's
    // name, e.g. with a leader-election Role's list) points it at another pod UID. The
    // controller then ignores the claim (InvalidClaim: its pod UID no longer matches its
    // ownerReference), and b used to wait for ever.
    let (waiting, cb) = b_claims_a_lock_not_made_yet(&ns).await;
    let other_uid = serde_json::json!({"metadata": {"annotations": {"leasehold.dev/pod-uid": "not-b"}}});
    neighbour_patch(&neighbour, &ns, &cb, other_uid).await;
    ns.lock("l", spec(15)).await;
    wait_event(&ns, &cb, "InvalidClaim").await;
    // Not b's doing: b claims anew and is granted.
    let g = tokio::time::timeout(DEADLINE, waiting)
        .await
        .expect("b is granted under a new claim, not left waiting on one it can never get")
        .unwrap()
        .unwrap();
    assert_ne!(g.claim(), cb);
    g.release().await.unwrap();
}

/// Pod b asks for lock l, which exists, with no controller running: once b has read its
/// unplaced claim back at its notice time (and told so), the neighbour changes the
/// claim's pod UID. Returns b's acquire and the claim.
async fn b_waits_unplaced_then_its_pod_uid_is_changed(
    ns: &TestNs,
    neighbour: &kube::Client,
) -> (JoinHandle<Result<Guard, Error>>, String) {
    use leasehold::client::WaitEvent;

    let (told, mut unqueued) = tokio::sync::mpsc::unbounded_channel();
    let lock_b = Lock::builder(ns.client.clone(), &ns.name, "l")
        .identity(ns.pod("b").await)
        .on_wait_event(move |e| {
            if matches!(e, WaitEvent::Unqueued { .. }) {
                let _ = told.send(());
            }
        })
        .build()
        .unwrap();
    let before: Vec<String> = claim_names(ns).await;
    let waiting = tokio::spawn(async move { lock_b.acquire().await });
    tokio::time::timeout(DEADLINE, unqueued.recv())
        .await
        .expect("b tells it is unplaced");
    let cb = claim_names(ns)
        .await
        .into_iter()
        .find(|c| !before.contains(c))
        .expect("b's claim");
    let other_uid = serde_json::json!({"metadata": {"annotations": {"leasehold.dev/pod-uid": "not-b"}}});
    neighbour_patch(neighbour, ns, &cb, other_uid).await;
    (waiting, cb)
}

/// A claim changed after its client's read-back (the lock existed, no controller ran for
/// five seconds) and before any controller recorded it: the controller, once up, used
/// to ignore it (an InvalidClaim event) and list it nowhere, and its client, its one
/// read-back done, waited on it for ever. Now it is refused (`InvalidClaim`) and its
/// client claims anew.
#[tokio::test]
async fn a_claim_changed_after_its_read_back_and_before_it_was_queued_is_refused_and_made_anew() {
    let ns = TestNs::new("nb-late").await;
    let neighbour = ns.as_lock_user().await;
    ns.lock("l", spec(15)).await;
    let (waiting, cb) = b_waits_unplaced_then_its_pod_uid_is_changed(&ns, &neighbour).await;
    let _c = spawn_controller(&ns, "nb-late");
    let g = tokio::time::timeout(DEADLINE, waiting)
        .await
        .expect("b is granted under a new claim, not left waiting on one the controller ignores")
        .unwrap()
        .unwrap();
    assert_ne!(g.claim(), cb);
    g.release().await.unwrap();
}

/// As above, with sixteen older invalid claims of another pod already refused: the
/// status lists no more refusals than that, so b's `InvalidClaim` goes unlisted, and b,
/// its one read-back done, waited on for ever. Now it reads its unplaced claim back
/// again (5 s after the first, then less and less often), and claims anew.
#[tokio::test]
async fn a_claim_changed_after_its_read_back_whose_refusal_goes_unlisted_is_read_back_again() {
    use leasehold::decide::MAX_REFUSED_LISTED;

    let ns = TestNs::new("nb-unlisted").await;
    let neighbour = ns.as_lock_user().await;
    ns.lock("l", spec(15)).await;
    let n = ns.pod("n").await;
    // Older, and named before any claim b makes: listed first, in name or arrival order.
    for i in 0..MAX_REFUSED_LISTED {
        let mut c = leasehold::protocol::claim::claim_lease(&format!("l-{i:012x}"), "l", &n, 15);
        c.metadata.namespace = Some(ns.name.clone());
        let uid = c
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .get_mut("leasehold.dev/pod-uid")
            .unwrap();
        *uid = "not-n".into();
        leases(&ns).create(&PostParams::default(), &c).await.unwrap();
    }
    let (waiting, cb) = b_waits_unplaced_then_its_pod_uid_is_changed(&ns, &neighbour).await;
    let _c = spawn_controller(&ns, "nb-unlisted");
    let l = ns
        .wait_lock("l", "the older refusals listed", |l| {
            l.status.as_ref().is_some_and(|s| s.refused.len() == MAX_REFUSED_LISTED)
        })
        .await;
    let listed = l.status.unwrap().refused;
    assert!(
        listed.iter().all(|r| r.claim != cb),
        "b's refusal is not listed: {listed:?}"
    );
    let g = tokio::time::timeout(DEADLINE, waiting)
        .await
        .expect("b is granted under a new claim, not left waiting on one no status lists")
        .unwrap()
        .unwrap();
    assert_ne!(g.claim(), cb);
    g.release().await.unwrap();
}

/// A claim's lease raised to an hour before its lock recorded it: the record carried the
/// hour, its client accepted a lease longer than its own, and a slot it held was held
/// back an hour once revoked. Now its client claims anew, recorded with its own lease.
#[tokio::test]
async fn a_claim_whose_lease_was_raised_before_it_was_queued_is_made_anew_with_its_own() {
    let ns = TestNs::new("nb-raise").await;
    let neighbour = ns.as_lock_user().await;
    let _c = spawn_controller(&ns, "nb-raise");
    let (waiting, cb) = b_claims_a_lock_not_made_yet(&ns).await;
    let raise = serde_json::json!({"spec": {"leaseDurationSeconds": 3600}});
    neighbour_patch(&neighbour, &ns, &cb, raise).await;
    ns.lock("l", spec(15)).await;
    let g = tokio::time::timeout(DEADLINE, waiting)
        .await
        .expect("b is granted")
        .unwrap()
        .unwrap();
    let l = ns.locks().get("l").await.unwrap();
    let held = &l.status.as_ref().unwrap().holders[0];
    assert_eq!(
        (g.claim() != cb, held.lease_duration_seconds),
        (true, Some(15)),
        "b holds under a new claim, recorded with its own lease, not the neighbour's hour: {held:?}"
    );
    g.release().await.unwrap();
}

#[tokio::test]
async fn a_holders_claim_stripped_of_its_lock_label_is_deleted_before_its_slot_passes() {
    let ns = TestNs::new("nb-label").await;
    let neighbour = ns.as_lock_user().await;
    let _c = spawn_controller(&ns, "nb-label");
    let lease = 4;
    // a's holder renews its claim (its writes work) but never reads its lock.
    let [ra, rb] = live_holder_and_waiter(&ns, lease).await;
    let ca = holder_claim(&ns, "l").await;
    neighbour_patch(
        &neighbour,
        &ns,
        &ca,
        serde_json::json!({"metadata": {"labels": {LOCK_LABEL: null}}}),
    )
    .await;
    let l = ns
        .wait_lock("l", "b granted", |l| {
            holders(l) == ["b"] && revoked_for(l).iter().all(|(_, r)| r.is_none())
        })
        .await;
    assert!(
        leases(&ns).get_opt(&ca).await.unwrap().is_none(),
        "a's claim, out of the controller's view but renewed all along, still stands as b runs: {:?}",
        l.status
    );
    assert!(ra.is_finished(), "a's renewals are refused: it stops by its deadline");
    rb.abort();
}

#[tokio::test]
async fn the_sweeper_deletes_only_claims_not_any_lease_labelled_released() {
    let ns = TestNs::new("nb-sweep").await;
    let neighbour = ns.as_lock_user().await;
    let _c = spawn_controller(&ns, "nb-sweep");
    ns.lock("l", spec(15)).await;
    let leader: Lease = serde_json::from_value(
        serde_json::json!({"metadata": {"name": "app-leader"}, "spec": {"holderIdentity": "x"}}),
    )
    .unwrap();
    leases(&ns).create(&PostParams::default(), &leader).await.unwrap();
    // The neighbour cannot delete the application's leader Lease; it labels it released.
    let label = serde_json::json!({"metadata": {"labels": {RELEASED_LABEL: "true"}}});
    neighbour_patch(&neighbour, &ns, "app-leader", label).await;
    // A turn on the lock ends with a released claim, swept.
    let a = ns.pod("a").await;
    take_turn(&ns, "l", a).await;
    wait_for("the released claim swept", DEADLINE, || async {
        let left = claim_names(&ns).await;
        (left.iter().all(|n| n == "app-leader")).then_some(())
    })
    .await;
    assert!(
        leases(&ns).get_opt("app-leader").await.unwrap().is_some(),
        "the controller deleted another application's Lease for a neighbour without delete rights"
    );
}

#[tokio::test]
async fn a_queue_flooded_by_a_neighbour_refuses_new_claims_with_a_reason_instead_of_wedging() {
    let ns = TestNs::new("nb-flood").await;
    let neighbour = ns.as_lock_user().await;
    let _c = spawn_controller(&ns, "nb-flood");
    let max_queue = 5;
    ns.lock(
        "l",
        DistributedLockSpec {
            max_queue: Some(max_queue),
            ..spec(60)
        },
    )
    .await;
    let (n, v) = (ns.pod("n").await, ns.pod("v").await);
    // The neighbour floods the lock with claims of its own pod (the client Role may
    // create Leases): one holds, maxQueue wait, the rest are refused.
    let leases_n: Api<Lease> = Api::namespaced(neighbour.clone(), &ns.name);
    for i in 0..max_queue + 3 {
        let name = format!("l-flood-{i:02}");
        let claim = leasehold::protocol::claim::claim_lease(&name, "l", &n, 60);
        leases_n
            .create(&PostParams::default(), &claim)
            .await
            .expect("the client Role may create claims");
    }
    let l = ns
        .wait_lock("l", "the flood queued and refused", |l| {
            l.status.as_ref().is_some_and(|s| s.refused.len() == 2)
        })
        .await;
    let status = l.status.unwrap();
    assert_eq!(status.queue.len(), max_queue as usize, "maxQueue wait, no more");
    assert_eq!(status.holders.len(), 1);
    let refused: Vec<_> = status.refused.iter().map(|r| (r.claim.as_str(), r.reason)).collect();
    let full = leasehold::api::RefuseReason::QueueFull;
    assert_eq!(
        refused,
        [("l-flood-06", full), ("l-flood-07", full)],
        "in arrival order"
    );
    // A newcomer is told at once, through what it can read, why it is not queued.
    let refused = lock_for(&ns, v).acquire().await.expect_err("no place in a full queue");
    assert!(
        matches!(refused, leasehold::client::Error::Refused { reason, .. } if reason == full),
        "{refused}"
    );
    ns.wait_lock("l", "Ready says claims are rejected", |l| {
        let ready = l
            .status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"));
        ready.is_some_and(|c| c.status == "False" && c.reason == "ClaimsRejected")
    })
    .await;
}

#[tokio::test]
async fn a_waiter_whose_claim_a_neighbour_hid_claims_anew_and_is_not_lost() {
    let ns = TestNs::new("nb-hide").await;
    let neighbour = ns.as_lock_user().await;
    let _c = spawn_controller(&ns, "nb-hide");
    let (held, waiting, cb) = b_waits_behind_a(&ns, 15).await;
    // The neighbour hides b's claim from the controller: the waiter leaves the queue,
    // while b's process, renewing its claim, would wait for ever.
    neighbour_patch(
        &neighbour,
        &ns,
        &cb,
        serde_json::json!({"metadata": {"labels": {LOCK_LABEL: null}}}),
    )
    .await;
    let l = ns
        .wait_lock("l", "b waits again, with a new claim", |l| {
            l.status
                .as_ref()
                .is_some_and(|s| s.queue.len() == 1 && s.queue[0].claim != cb)
        })
        .await;
    assert_eq!(queue(&l), ["b"]);
    held.release().await.unwrap();
    let g = tokio::time::timeout(DEADLINE, waiting)
        .await
        .expect("b is granted, not lost")
        .unwrap()
        .unwrap();
    assert_ne!(g.claim(), cb);
    wait_for("the hidden claim, withdrawn by its owner, gone", DEADLINE, || async {
        leases(&ns).get_opt(&cb).await.unwrap().is_none().then_some(())
    })
    .await;
    g.release().await.unwrap();
}

/// A neighbour hiding every new claim of a waiter keeps it from the queue (its Role
/// may), but the waiter claims anew ever more slowly (`claim_anew_pause`), not at the
/// API server's pace, and is granted once the neighbour stops.
#[tokio::test]
async fn a_neighbour_hiding_each_new_claim_slows_the_waiter_down_not_into_a_loop() {
    use leasehold::protocol::timing::claim_anew_pause;
    let ns = TestNs::new("nb-again").await;
    let neighbour = ns.as_lock_user().await;
    let _c = spawn_controller(&ns, "nb-again");
    let (held, waiting, first) = b_waits_behind_a(&ns, 15).await;
    let mut hidden = vec![first];
    let strip = serde_json::json!({"metadata": {"labels": {LOCK_LABEL: null}}});
    let mut hid_at = tokio::time::Instant::now();
    neighbour_patch(&neighbour, &ns, &hidden[0], strip.clone()).await;
    for n in 1..7u32 {
        let l = ns
            .wait_lock("l", "b queued with a new claim", |l| {
                l.status
                    .as_ref()
                    .is_some_and(|s| s.queue.len() == 1 && !hidden.contains(&s.queue[0].claim))
            })
            .await;
        let waited = hid_at.elapsed();
        assert!(
            waited >= claim_anew_pause(n),
            "claim {n} came {waited:?} after the last was hidden, before its pause of {:?}",
            claim_anew_pause(n)
        );
        assert!(
            !waiting.is_finished(),
            "b's acquire ended while it was kept from the queue"
        );
        hidden.push(l.status.unwrap().queue[0].claim.clone());
        hid_at = tokio::time::Instant::now();
        neighbour_patch(&neighbour, &ns, hidden.last().unwrap(), strip.clone()).await;
    }
    // The neighbour stops: b's next claim is queued and granted.
    ns.wait_lock("l", "b queued again", |l| {
        l.status
            .as_ref()
            .is_some_and(|s| s.queue.len() == 1 && !hidden.contains(&s.queue[0].claim))
    })
    .await;
    held.release().await.unwrap();
    let g = tokio::time::timeout(DEADLINE, waiting).await.unwrap().unwrap().unwrap();
    assert!(!hidden.iter().any(|c| c == g.claim()));
    g.release().await.unwrap();
}

/// Issue #41, item 1 (two holders at once, 2 s): while b's claim was new (no controller
/// running), the neighbour removed its lease; the lock's lease was then lowered to 1 s.
/// b was recorded without a lease, its client took that for an older controller's
/// record, b was told of its grant directly and started, and the controller judged it
/// by the lock's 1 s lease: it expired b 3.5 s later and would have granted the next
/// while b's command ran. Now such a claim is refused (`LeaseMissing`), b withdraws it
/// and claims anew, and its grant records the lease it lives by.
#[tokio::test]
async fn a_waiter_whose_lease_was_removed_before_it_was_queued_is_never_judged_by_a_shorter_lease() {
    let ns = TestNs::new("nb-nolease").await;
    let neighbour = ns.as_lock_user().await;
    ns.lock("l", spec(15)).await;
    let (_, first) = controller_taking_notices(&ns, "nb-nolease-1").await;
    let (a, b) = (ns.pod("a").await, ns.pod("b").await);
    let held = lock_for(&ns, a).acquire().await.unwrap();
    first.stop().await; // a restart, say: b's claim is new meanwhile
    let lock_b = lock_for(&ns, b);
    let waiting = tokio::spawn(async move { lock_b.acquire().await });
    let cb = wait_for("b's claim", DEADLINE, || async {
        claim_names(&ns).await.into_iter().find(|n| n != held.claim())
    })
    .await;
    let strip = serde_json::json!({"spec": {"leaseDurationSeconds": null}});
    neighbour_patch(&neighbour, &ns, &cb, strip).await;
    let edit = Patch::Merge(serde_json::json!({"spec": {"leaseDurationSeconds": 1}}));
    ns.locks().patch("l", &PatchParams::default(), &edit).await.unwrap();
    let (_, _second) = controller_taking_notices(&ns, "nb-nolease-2").await;
    ns.wait_lock("l", "b waits", |l| queue(l) == ["b"]).await;
    held.release().await.unwrap();
    let g = tokio::time::timeout(DEADLINE, waiting).await.unwrap().unwrap().unwrap();
    assert_ne!(g.claim(), cb, "b acted on the claim recorded without its lease");
    let l = ns.recorded("l", g.claim()).await;
    let h = &l.status.unwrap().holders[0];
    assert_eq!((h.claim.as_str(), h.lease_duration_seconds), (g.claim(), Some(15)));
    // Judged by its 15 s: not expired by the lock's 1 s (3 s with the grace).
    throughout(&ns, Duration::from_secs(5), |l, at| {
        let held = l.is_some_and(|l| holders(l) == ["b"] && revoked_for(l).iter().all(|(_, r)| r.is_none()));
        assert!(
            held,
            "b's grant was taken {at:?} after its start: {:?}",
            l.map(|l| &l.status)
        );
    })
    .await;
    assert!(!g.is_lost());
    g.release().await.unwrap();
}

/// Issue #41, item 2 (a lock held for an hour by one POST): a claim of the neighbour's
/// own pod, created stamped with a fencing token and a lease of an hour, was taken as
/// an earlier incarnation's holder: it skipped the queue and held the slot back, and
/// the waiter was not granted when the holder released. A stamp is trusted no more.
#[tokio::test]
async fn a_claim_stamped_with_a_fencing_token_holds_no_slot_and_waits_its_turn() {
    let ns = TestNs::new("nb-stamp").await;
    let neighbour = ns.as_lock_user().await;
    let _c = spawn_controller(&ns, "nb-stamp");
    let (held, waiting, cb) = b_waits_behind_a(&ns, 15).await;
    let n = ns.pod("n").await;
    let name = leasehold::protocol::claim::claim_name("l");
    let mut stamped = leasehold::protocol::claim::claim_lease(&name, "l", &n, 3600);
    let stamp = (
        leasehold::protocol::FENCING_TOKEN_ANNOTATION.to_string(),
        "1".to_string(),
    );
    stamped.metadata.annotations.get_or_insert_default().extend([stamp]);
    let leases_n: Api<Lease> = Api::namespaced(neighbour.clone(), &ns.name);
    leases_n
        .create(&PostParams::default(), &stamped)
        .await
        .expect("the client Role may create claims");
    let l = ns
        .wait_lock("l", "the stamped claim queued", |l| queue(l) == ["b", "n"])
        .await;
    assert_eq!(holders(&l), ["a"], "no slot held for it");
    held.release().await.unwrap();
    let g = tokio::time::timeout(DEADLINE, waiting)
        .await
        .expect("b is granted when a releases")
        .unwrap()
        .unwrap();
    assert_eq!(g.claim(), cb);
    g.release().await.unwrap();
}

/// Issue #41: a wait hash stripped before the claim was queued was recorded as none,
/// which a waiting client accepted as an older controller's record, and the controller
/// then took anyone's wait for the successor's direct grant (its claim name is public).
/// The client withdraws such a claim and claims anew, as for any field changed before
/// the record.
#[tokio::test]
async fn a_claim_whose_wait_hash_was_stripped_before_it_was_queued_is_withdrawn_not_acted_on() {
    let ns = TestNs::new("nb-waithash").await;
    let neighbour = ns.as_lock_user().await;
    ns.lock("l", spec(15)).await;
    let first = spawn_controller(&ns, "nb-waithash-1");
    let (a, b) = (ns.pod("a").await, ns.pod("b").await);
    let held = lock_for(&ns, a).acquire().await.unwrap();
    first.stop().await; // b's claim is new meanwhile
    let lock_b = lock_for(&ns, b);
    let waiting = tokio::spawn(async move { lock_b.acquire().await });
    let cb = wait_for("b's claim", DEADLINE, || async {
        claim_names(&ns).await.into_iter().find(|n| n != held.claim())
    })
    .await;
    let strip = serde_json::json!({"metadata": {"annotations": {leasehold::protocol::WAIT_HASH_ANNOTATION: null}}});
    neighbour_patch(&neighbour, &ns, &cb, strip).await;
    let _second = spawn_controller(&ns, "nb-waithash-2");
    let l = ns
        .wait_lock("l", "b waits with a new claim", |l| {
            l.status
                .as_ref()
                .is_some_and(|s| s.queue.len() == 1 && s.queue[0].claim != cb)
        })
        .await;
    assert!(
        l.status.unwrap().queue[0].wait_hash.is_some(),
        "b's new claim is recorded with its wait hash"
    );
    held.release().await.unwrap();
    let g = tokio::time::timeout(DEADLINE, waiting).await.unwrap().unwrap().unwrap();
    assert_ne!(g.claim(), cb, "b acted on the claim recorded without its wait hash");
    g.release().await.unwrap();
}

/// The grant the controller writes on a designated claim where it cannot tell it over
/// HTTP is trusted only as an HTTP grant is: signed by the lock's key, for this claim
/// and its reserved token. A neighbour who may patch Leases writes on the next waiter's
/// claim a genuine grant copied from an earlier claim, that grant's signature under the
/// waiter's token, and a grant signed with a key of its own; none makes it run.
#[tokio::test]
async fn a_grant_copied_or_forged_onto_a_designated_claim_is_not_acted_on() {
    use leasehold::protocol::grant::{Grant, GrantKey};
    use leasehold::protocol::{DIRECT_GRANT_ANNOTATION, HANDOVER_WATCH_ANNOTATION};
    let ns = TestNs::new("nb-claimgrant").await;
    let neighbour = ns.as_lock_user().await;
    let _c = spawn_controller(&ns, "nb-claimgrant"); // no URL: grants go on claims
    let (held, waiting, cb) = b_waits_behind_a(&ns, 15).await;
    // So that the controller writes b's grant on its claim rather than leave it to a's
    // mark, the neighbour first takes b's word that it watches for that mark back (the
    // controller's watch shows this before a's release, written after it).
    let untold = serde_json::json!({"metadata": {"annotations": {HANDOVER_WATCH_ANNOTATION: null}}});
    neighbour_patch(&neighbour, &ns, &cb, untold).await;
    held.release().await.unwrap();
    let b = tokio::time::timeout(DEADLINE, waiting).await.unwrap().unwrap().unwrap();
    // b's grant, as the controller wrote it on b's claim (public to every lock user
    // whose Role may watch Leases).
    let genuine = wait_for("b's grant on its claim", DEADLINE, || async {
        let lease = leases(&ns).get(&cb).await.ok()?;
        lease.metadata.annotations?.get(DIRECT_GRANT_ANNOTATION).cloned()
    })
    .await;
    let lock_c = lock_for(&ns, ns.pod("c").await);
    let waiting = tokio::spawn(async move { lock_c.acquire().await });
    let l = ns
        .wait_lock("l", "c designated", |l| {
            l.status
                .as_ref()
                .and_then(|s| s.successor.as_ref())
                .is_some_and(|s| s.claim != cb)
        })
        .await;
    let successor = l.status.clone().unwrap().successor.unwrap();
    let (cc, tc) = (successor.claim.as_str(), successor.fencing_token);
    let own = GrantKey::generate();
    let forged = Grant {
        namespace: &ns.name,
        lock: "l",
        lock_uid: l.metadata.uid.as_deref().unwrap(),
        claim: cc,
        fencing_token: tc,
    };
    let (_, signature) = genuine.split_once(' ').unwrap();
    for value in [
        genuine.clone(),
        format!("{tc} {signature}"),
        forged.annotation(&own.sign(&forged)),
    ] {
        let patch = serde_json::json!({"metadata": {"annotations": {DIRECT_GRANT_ANNOTATION: &value}}});
        neighbour_patch(&neighbour, &ns, cc, patch).await;
        // Not a synchronisation: the time c has to act on this value, the claim's own
        // for that long whenever c's watch began (a client that took it would be
        // granted within milliseconds).
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(
            !waiting.is_finished(),
            "c acted on a grant that is not its own: {value}"
        );
    }
    b.release().await.unwrap();
    let c = tokio::time::timeout(DEADLINE, waiting).await.unwrap().unwrap().unwrap();
    assert_eq!((c.claim(), c.fencing_token()), (cc, tc));
    c.release().await.unwrap();
}

/// A designated successor takes the holder's release mark as its grant only when the
/// mark opens the release hash the lock recorded for the holder: a neighbour's mark on
/// the holder's claim (`"true"`, or a secret of its own) hands the lock to nobody, with
/// no controller running to judge it either; the holder's own mark then does.
#[tokio::test]
async fn a_release_mark_forged_on_the_holders_claim_hands_the_lock_to_nobody() {
    use leasehold::protocol::RELEASED_ANNOTATION;
    use leasehold::protocol::release::Secret;
    let ns = TestNs::new("nb-handover").await;
    let neighbour = ns.as_lock_user().await;
    let controller = spawn_controller(&ns, "nb-handover"); // no URL: no notices
    let (held, waiting, cb) = b_waits_behind_a(&ns, 15).await;
    let l = ns.wait_lock("l", "b designated", |l| {
        l.status
            .as_ref()
            .and_then(|s| s.successor.as_ref())
            .is_some_and(|s| s.claim == cb)
    });
    let reserved = l.await.status.unwrap().successor.unwrap().fencing_token;
    controller.stop().await;
    for mark in ["true".to_string(), Secret::generate().reveal().to_string()] {
        let patch = serde_json::json!({"metadata": {"annotations": {RELEASED_ANNOTATION: &mark}}});
        neighbour_patch(&neighbour, &ns, held.claim(), patch).await;
        // Not a synchronisation: the time b has to act on this mark (a client that took
        // it would be granted within milliseconds of the write).
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(
            !waiting.is_finished(),
            "b acted on a mark its holder did not write: {mark}"
        );
    }
    held.release().await.unwrap();
    let b = tokio::time::timeout(DEADLINE, waiting).await.unwrap().unwrap().unwrap();
    assert_eq!((b.claim(), b.fencing_token()), (cb.as_str(), reserved));
    b.release().await.unwrap();
}
