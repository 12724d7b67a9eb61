//! The controller against the real API server: FIFO grants, fencing tokens, handoff
//! on release, revocation on pod death/finish, expiry and forced release, semaphores,
//! restarts, two controllers at once, and bad input.

use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::ResourceExt;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use leasehold::api::{DistributedLockSpec, RevokeReason};

use crate::support::*;

fn spec(lease: i32, max: i32) -> DistributedLockSpec {
    DistributedLockSpec {
        lease_duration_seconds: lease,
        max_holders: max,
        backend: None,
        max_queue: None,
    }
}

#[tokio::test]
async fn fifo_order_of_five_waiters_with_handoff_on_release() {
    let ns = TestNs::new("fifo").await;
    let _c = spawn_controller(&ns, "fifo");
    ns.lock("l", spec(120, 1)).await;
    let claims = claims_in_order(&ns, "l", 5).await;
    let l = ns.wait_lock("l", "p0 holds", |l| holders(l) == ["p0"]).await;
    assert_eq!(queue(&l), ["p1", "p2", "p3", "p4"]);
    assert_eq!(l.status.as_ref().unwrap().queue_length, 4);
    let mut last = 0;
    for (i, claim) in claims.iter().enumerate() {
        let l = ns
            .wait_lock("l", &format!("p{i} holds"), |l| holders(l) == [format!("p{i}")])
            .await;
        let token = tokens(&l)[0];
        assert!(token > last, "tokens strictly increase: {token} after {last}");
        last = token;
        release(&ns, claim).await;
    }
    let l = ns.wait_lock("l", "lock free", |l| holders(l).is_empty()).await;
    assert_eq!(last_token(&l), 5);
    let left = wait_for("released claims deleted", DEADLINE, || async {
        let n = leases(&ns).list(&Default::default()).await.unwrap().items.len();
        (n == 0).then_some(n)
    })
    .await;
    assert_eq!(left, 0);
    // Events are published after each status write: wait for all ten.
    wait_for("5 Granted and 5 Released events", DEADLINE, || async {
        let reasons = event_reasons(&ns, "l").await;
        let count = |what: &str| reasons.iter().filter(|r| *r == what).count();
        (count("Granted") == 5 && count("Released") == 5).then_some(())
    })
    .await;
}

/// The version-skew rule (docs/operations.md): today's controller serves claims in the
/// oldest format a client wrote: label, pod UID, owner and lease, with no requested-at,
/// wait lease, release hash or wait hash. They queue in arrival order, are granted with
/// rising tokens, and a release with `"true"` passes the lock on.
#[tokio::test]
async fn claims_in_the_oldest_format_are_queued_granted_and_released() {
    let ns = TestNs::new("skew").await;
    let _c = spawn_controller(&ns, "skew");
    ns.lock("l", spec(120, 1)).await;
    let mut claims = Vec::new();
    for i in 0..2 {
        let pod = ns.pod(&format!("p{i}")).await;
        let name = leasehold::protocol::claim::claim_name("l");
        let mut lease = leasehold::protocol::claim::claim_lease(&name, "l", &pod, 120);
        let annotations = lease.metadata.annotations.as_mut().unwrap();
        annotations.retain(|k, _| k == leasehold::protocol::POD_UID_ANNOTATION);
        leases(&ns).create(&PostParams::default(), &lease).await.unwrap();
        let seen = |l: &leasehold::api::DistributedLock| holders(l).len() + queue(l).len() == i + 1;
        ns.wait_lock("l", &format!("claim {i} seen"), seen).await;
        claims.push(name);
    }
    let l = ns.wait_lock("l", "p0 holds, p1 waits", |l| holders(l) == ["p0"]).await;
    assert_eq!(queue(&l), ["p1"]);
    let first = tokens(&l)[0];
    release(&ns, &claims[0]).await;
    let l = ns.wait_lock("l", "p1 holds", |l| holders(l) == ["p1"]).await;
    assert!(tokens(&l)[0] > first, "tokens rise: {:?} after {first}", tokens(&l));
}

#[tokio::test]
async fn holder_pod_deleted_or_finished_revokes_at_once() {
    let ns = TestNs::new("poddeath").await;
    let _c = spawn_controller(&ns, "poddeath");
    ns.lock("l", spec(120, 1)).await;
    let (a, b, c) = (ns.pod("a").await, ns.pod("b").await, ns.pod("c").await);
    claim(&ns, "l", &a, 120).await;
    ns.wait_lock("l", "a holds", |l| holders(l) == ["a"]).await;
    claim(&ns, "l", &b, 120).await;
    ns.wait_lock("l", "b waits", |l| queue(l) == ["b"]).await;
    claim(&ns, "l", &c, 120).await;
    ns.wait_lock("l", "c waits", |l| queue(l) == ["b", "c"]).await;

    ns.stop_containers("a").await;
    ns.delete_pod("a").await;
    let l = ns
        .wait_lock("l", "b holds after a's pod is gone", |l| holders(l) == ["b"])
        .await;
    assert_eq!(tokens(&l), [2]);

    ns.stop_containers("b").await;
    ns.set_phase("b", "Succeeded").await;
    let l = ns
        .wait_lock("l", "c holds after b's pod finished", |l| holders(l) == ["c"])
        .await;
    assert_eq!(tokens(&l), [3]);
    // Events are published after the status write: wait for both.
    wait_for("two Revoked events", DEADLINE, || async {
        let reasons = event_reasons(&ns, "l").await;
        (reasons.iter().filter(|r| *r == "Revoked").count() == 2).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_force_deleted_holder_pod_holds_its_slot_back_for_a_lease() {
    let ns = TestNs::new("forcedel").await;
    let _c = spawn_controller(&ns, "forcedel");
    // a's claim is never renewed: it must outlive the processing of the pod's deletion
    // (or a is revoked as Expired, not PodGone). 10 s is that assumption, with room.
    let lease = 10;
    ns.lock("l", spec(lease, 1)).await;
    let (a, b) = (ns.pod("a").await, ns.pod("b").await);
    claim(&ns, "l", &a, lease).await;
    ns.wait_lock("l", "a holds", |l| holders(l) == ["a"]).await;
    let cb = claim(&ns, "l", &b, lease).await;
    let _rb = keep_renewing(&ns, &cb, Duration::from_millis(500));
    ns.wait_lock("l", "b waits", |l| queue(l) == ["b"]).await;
    // No kubelet said a's containers stopped: the pod garbage collector of a deleted
    // node marks the pod Failed (Kubernetes >= 1.26) and removes the object.
    let deleted = Instant::now();
    ns.set_phase("a", "Failed").await;
    ns.delete_pod("a").await;
    let l = ns
        .wait_lock("l", "a revoked but its slot held back", |l| {
            l.status
                .as_ref()
                .is_some_and(|s| s.holders.iter().any(|h| h.revoked.is_some()))
        })
        .await;
    assert_eq!(holders(&l), ["a"]);
    assert_eq!(
        l.status.unwrap().holders[0].revoked.as_ref().unwrap().reason,
        RevokeReason::PodGone
    );
    ns.wait_lock("l", "b holds after the hold-back", |l| holders(l) == ["b"])
        .await;
    assert!(
        deleted.elapsed() >= Duration::from_secs(lease as u64),
        "the slot passed on {:?} after a's pod object went, before a could have stopped itself",
        deleted.elapsed()
    );
}

#[tokio::test]
async fn unrenewed_claim_expires_and_the_next_waiter_is_granted() {
    let ns = TestNs::new("expiry").await;
    let _c = spawn_controller(&ns, "expiry");
    ns.lock("l", spec(2, 1)).await;
    let (a, b) = (ns.pod("a").await, ns.pod("b").await);
    // a's claim is never renewed after its creation: it may expire no sooner than a
    // lease and the expiry grace after it.
    let since = Instant::now();
    let ca = claim(&ns, "l", &a, 2).await;
    ns.wait_lock("l", "a holds", |l| holders(l) == ["a"]).await;
    let cb = claim(&ns, "l", &b, 2).await;
    let _renew_b = keep_renewing(&ns, &cb, Duration::from_millis(400));
    let l = ns
        .wait_lock("l", "b holds after a expired", |l| holders(l) == ["b"])
        .await;
    assert!(
        since.elapsed() >= Duration::from_secs(2) + leasehold::protocol::timing::EXPIRY_GRACE,
        "expired too early: {:?}",
        since.elapsed()
    );
    assert_eq!(tokens(&l), [2]);
    wait_for("expired claim deleted", DEADLINE, || async {
        leases(&ns).get_opt(&ca).await.unwrap().is_none().then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_stalled_claim_watch_never_expires_a_live_holder() {
    let ns = TestNs::new("stalewatch").await;
    let (proxy, _c) = controller_with_proxied_watches(&ns, "stalewatch").await;
    let renewing = live_holder_and_waiter(&ns, 3).await;
    // The controller's watches stall for longer than a lease (plus grace) while the
    // holder keeps renewing; its own reads and writes still go through.
    proxy.freeze_open();
    assert_undisturbed(&ns, Duration::from_secs(8)).await;
    proxy.thaw();
    assert_undisturbed(&ns, Duration::from_secs(5)).await;
    still_served(&ns, renewing).await;
}

#[tokio::test]
async fn a_deleted_lock_behind_a_stalled_claim_watch_never_lets_a_renewing_holder_go() {
    // A deleted lock keeps its revoked holder's claim (for its release). A holder that
    // has not seen the revocation renews it, but the controller's watches stall: the
    // hold-back must not end on the renewals the watch shows alone.
    let ns = TestNs::new("stalewatchdel").await;
    let (proxy, _c) = controller_with_proxied_watches(&ns, "stalewatchdel").await;
    ns.lock("l", spec(2, 1)).await;
    let a = ns.pod("a").await;
    let ca = claim(&ns, "l", &a, 2).await;
    let renewing = keep_renewing(&ns, &ca, Duration::from_millis(400));
    ns.wait_lock("l", "a holds", |l| holders(l) == ["a"]).await;
    ns.locks().delete("l", &Default::default()).await.unwrap();
    ns.wait_lock("l", "a revoked by the deletion", |l| {
        revoked_for(l) == [("a".to_string(), Some(RevokeReason::LockDeleted))]
    })
    .await;
    proxy.freeze_open();
    // Twice the hold-back (2 s lease + 2 s grace).
    throughout(&ns, Duration::from_secs(8), |l, at| {
        let l = l.unwrap_or_else(|| panic!("the lock went {at:?} in, while a renewed"));
        assert_eq!(holders(l), ["a"], "a's slot was freed {at:?} in, while a renewed");
    })
    .await;
    proxy.thaw();
    // a stops: its slot passes once its claim is no longer renewed, and the lock goes.
    renewing.abort();
    ns.wait_gone("l").await;
}

#[tokio::test]
async fn a_holder_is_judged_by_the_lease_of_its_grant_not_a_patched_claim() {
    let ns = TestNs::new("leasepatch").await;
    let _c = spawn_controller(&ns, "leasepatch");
    ns.lock("l", spec(20, 1)).await;
    let (a, b) = (ns.pod("a").await, ns.pod("b").await);
    let ca = claim(&ns, "l", &a, 20).await;
    // a renews as its 20 s lease asks: every 5 s.
    let ra = keep_renewing(&ns, &ca, Duration::from_secs(5));
    ns.wait_lock("l", "a holds", |l| holders(l) == ["a"]).await;
    let cb = claim(&ns, "l", &b, 20).await;
    let rb = keep_renewing(&ns, &cb, Duration::from_millis(500));
    ns.wait_lock("l", "b waits", |l| queue(l) == ["b"]).await;
    // The lock is edited to 1 s, and a neighbour patches a's claim down to 1 s too.
    let short = serde_json::json!({"spec": {"leaseDurationSeconds": 1}});
    ns.locks()
        .patch("l", &PatchParams::default(), &Patch::Merge(&short))
        .await
        .unwrap();
    leases(&ns)
        .patch(&ca, &PatchParams::default(), &Patch::Merge(&short))
        .await
        .unwrap();
    assert_undisturbed(&ns, Duration::from_secs(8)).await;
    still_served(&ns, [ra, rb]).await;
}

#[tokio::test]
async fn forced_release_holds_the_slot_back_for_a_lease_duration() {
    let ns = TestNs::new("forced").await;
    let _c = spawn_controller(&ns, "forced");
    let lease = 3;
    ns.lock("l", spec(lease, 1)).await;
    let (a, b) = (ns.pod("a").await, ns.pod("b").await);
    let ca = claim(&ns, "l", &a, lease).await;
    let _ra = keep_renewing(&ns, &ca, Duration::from_millis(500));
    ns.wait_lock("l", "a holds", |l| holders(l) == ["a"]).await;
    let cb = claim(&ns, "l", &b, lease).await;
    let _rb = keep_renewing(&ns, &cb, Duration::from_millis(500));
    ns.wait_lock("l", "b waits", |l| queue(l) == ["b"]).await;

    leases(&ns)
        .delete(&ca, &Default::default())
        .await
        .expect("admin deletes a's claim");
    let deleted = Instant::now();
    let l = ns
        .wait_lock("l", "a revoked but holding its slot", |l| {
            l.status
                .as_ref()
                .unwrap()
                .holders
                .first()
                .and_then(|h| h.revoked.as_ref())
                .is_some()
        })
        .await;
    let h = &l.status.as_ref().unwrap().holders[0];
    assert_eq!(h.revoked.as_ref().unwrap().reason, RevokeReason::ForceReleased);
    assert_eq!(queue(&l), ["b"]);
    let l = ns
        .wait_lock("l", "b holds after the hold-back", |l| holders(l) == ["b"])
        .await;
    let waited = deleted.elapsed();
    assert!(
        waited >= Duration::from_secs(lease as u64),
        "slot passed on after {waited:?}, before one lease duration"
    );
    assert_eq!(tokens(&l), [2]);
}

#[tokio::test]
async fn claims_made_within_one_second_keep_their_order_across_a_controller_start() {
    let ns = TestNs::new("fifosec").await;
    ns.lock("l", spec(15, 1)).await;
    let (z, a) = (ns.pod("zzz").await, ns.pod("aaa").await);
    // No controller runs: both claims wait to be listed at once, l-zzz made first.
    // Two creates land in one second of the API server's clock far more often than not.
    for attempt in 1.. {
        assert!(
            attempt <= 20,
            "20 pairs of claims made back to back never landed within one second"
        );
        let first = leasehold::protocol::claim::claim_lease("l-zzz", "l", &z, 15);
        let second = leasehold::protocol::claim::claim_lease("l-aaa", "l", &a, 15);
        let first = leases(&ns).create(&PostParams::default(), &first).await.unwrap();
        let second = leases(&ns).create(&PostParams::default(), &second).await.unwrap();
        if first.metadata.creation_timestamp == second.metadata.creation_timestamp {
            break; // within one second of the API server's clock: the case to test
        }
        for name in ["l-zzz", "l-aaa"] {
            leases(&ns).delete(name, &Default::default()).await.unwrap();
        }
        wait_for("both claims deleted", DEADLINE, || async {
            let list = leases(&ns).list(&Default::default()).await.unwrap();
            list.items.is_empty().then_some(())
        })
        .await;
    }
    let _c = spawn_controller(&ns, "fifosec");
    let l = ns
        .wait_lock("l", "the claims placed", |l| holders(l).len() + queue(l).len() == 2)
        .await;
    assert_eq!(holders(&l), ["zzz"], "the first claim made is granted first");
    assert_eq!(queue(&l), ["aaa"]);
}

#[tokio::test]
async fn a_claim_made_before_the_controller_saw_its_pod_keeps_its_arrival_place() {
    // The controller's pod watch lags (stalled here): a pod just created is not in its
    // cache when the pod's claim arrives, and a younger claim of a pod it has seen
    // arrives right after.
    let ns = TestNs::new("podlag").await;
    let (proxy, pod_watches) = proxied_client("podlag").await;
    let client = split_client_where(ns.client.clone(), pod_watches, |path| path.ends_with("/pods"));
    let _c = spawn_controller_with(client, leasehold::controller::Options::single("podlag", Some(&ns.name)));
    ns.lock("l", spec(120, 1)).await;
    ns.lock("other", spec(120, 1)).await;
    let (a, c) = (ns.pod("a").await, ns.pod("c").await);
    claim(&ns, "l", &a, 120).await;
    ns.wait_lock("l", "a holds", |l| holders(l) == ["a"]).await;
    proxy.freeze_open();
    let b = ns.pod("b").await;
    claim(&ns, "l", &b, 120).await;
    claim(&ns, "l", &c, 120).await;
    // The claim watch is not stalled: once a later claim (of another lock) is granted,
    // the controller has seen both of l's.
    claim(&ns, "other", &c, 120).await;
    ns.wait_lock("other", "the later claim granted", |l| holders(l) == ["c"])
        .await;
    proxy.thaw();
    let l = ns.wait_lock("l", "both claims queued", |l| queue(l).len() == 2).await;
    assert_eq!(queue(&l), ["b", "c"], "b claimed first");
    let refused = l.status.unwrap().refused;
    assert!(refused.is_empty(), "b was refused for a pod not yet seen: {refused:?}");
}

/// Issue #41: the grace kept a claim's place only for a pod not seen at all. A pod
/// deleted and re-created under its name (a StatefulSet's, say) claims at once, while
/// the controller's lagging cache still holds the old pod's UID: its claim was refused
/// (`PodUidMismatch`) and a younger claim queued ahead of it.
#[tokio::test]
async fn a_claim_of_a_pod_re_created_under_its_name_keeps_its_arrival_place() {
    let ns = TestNs::new("podnew").await;
    let (proxy, pod_watches) = proxied_client("podnew").await;
    let client = split_client_where(ns.client.clone(), pod_watches, |path| path.ends_with("/pods"));
    let _c = spawn_controller_with(client, leasehold::controller::Options::single("podnew", Some(&ns.name)));
    ns.lock("l", spec(120, 1)).await;
    ns.lock("other", spec(120, 1)).await;
    let (a, c) = (ns.pod("a").await, ns.pod("c").await);
    ns.pod("b").await;
    claim(&ns, "l", &a, 120).await;
    ns.wait_lock("l", "a holds", |l| holders(l) == ["a"]).await;
    proxy.freeze_open();
    ns.delete_pod("b").await;
    let b = ns.pod("b").await; // the same name, a new UID
    claim(&ns, "l", &b, 120).await;
    claim(&ns, "l", &c, 120).await;
    claim(&ns, "other", &c, 120).await;
    ns.wait_lock("other", "the later claim granted", |l| holders(l) == ["c"])
        .await;
    proxy.thaw();
    let l = ns.wait_lock("l", "both claims queued", |l| queue(l).len() == 2).await;
    assert_eq!(queue(&l), ["b", "c"], "b claimed first");
    let refused = l.status.unwrap().refused;
    assert!(refused.is_empty(), "b was refused for its old pod's UID: {refused:?}");
}

/// The system model's finding (menu `mw`): a semaphore's designated successor was told
/// of its grant by a controller whose cache had not yet seen `maxHolders` lowered, so it
/// could start beside the remaining holder after the change was stored. Here the
/// controller's lock watch is stalled while its claim watch is not, and the successor
/// asks for its grant on its claim.
#[tokio::test]
async fn a_grant_beside_a_holder_is_not_sent_from_a_cache_that_missed_max_holders_lowered() {
    use leasehold::protocol::{DIRECT_GRANT_ANNOTATION, GRANT_WATCH_ANNOTATION};
    let ns = TestNs::new("lowered").await;
    let (proxy, lock_watches) = proxied_client("lowered").await;
    let client = split_client_where(ns.client.clone(), lock_watches, |path| {
        path.ends_with("/distributedlocks")
    });
    let _c = spawn_controller_with(
        client,
        leasehold::controller::Options::single("lowered", Some(&ns.name)),
    );
    ns.lock("l", spec(120, 2)).await;
    let claims = claims_in_order(&ns, "l", 2).await;
    let pod = ns.pod("p2").await;
    let name = leasehold::protocol::claim::claim_name("l");
    let mut asks = leasehold::protocol::claim::claim_lease(&name, "l", &pod, 120);
    asks.annotations_mut()
        .insert(GRANT_WATCH_ANNOTATION.into(), "true".into());
    leases(&ns).create(&PostParams::default(), &asks).await.unwrap();
    let designated = |l: &leasehold::api::DistributedLock| {
        l.status
            .as_ref()
            .and_then(|s| s.successor.as_ref())
            .map(|s| s.claim.clone())
            == Some(name.clone())
    };
    ns.wait_lock("l", "p2 designated", |l| holders(l) == ["p0", "p1"] && designated(l))
        .await;

    proxy.freeze_open();
    ns.locks()
        .patch(
            "l",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"maxHolders": 1}})),
        )
        .await
        .unwrap();
    release(&ns, &claims[0]).await;
    // The status write, made under the lock's resourceVersion, fails; the controller
    // reads the lock afresh and decides by maxHolders 1.
    let l = ns
        .wait_lock("l", "p0's release decided", |l| holders(l) == ["p1"])
        .await;
    assert!(designated(&l), "p2 stays designated");
    let claim = leases(&ns).get(&name).await.unwrap();
    assert!(
        !claim.annotations().contains_key(DIRECT_GRANT_ANNOTATION),
        "p2 was told of its grant beside p1 after maxHolders went from 2 to 1"
    );

    proxy.thaw();
    release(&ns, &claims[1]).await;
    ns.wait_lock("l", "p2 granted once p1 left", |l| holders(l) == ["p2"])
        .await;
}

#[tokio::test]
async fn semaphore_with_max_holders_three() {
    let ns = TestNs::new("sema").await;
    let _c = spawn_controller(&ns, "sema");
    ns.lock("l", spec(120, 3)).await;
    let claims = claims_in_order(&ns, "l", 5).await;
    let l = ns.wait_lock("l", "three hold", |l| holders(l).len() == 3).await;
    assert_eq!(holders(&l), ["p0", "p1", "p2"]);
    assert_eq!(queue(&l), ["p3", "p4"]);
    assert_eq!(tokens(&l), [1, 2, 3]);
    release(&ns, &claims[1]).await;
    let l = ns
        .wait_lock("l", "p3 joins the holders", |l| holders(l) == ["p0", "p2", "p3"])
        .await;
    assert_eq!(tokens(&l), [1, 3, 4]);
}

#[tokio::test]
async fn controller_restart_mid_queue_loses_no_waiter_and_never_double_grants() {
    let ns = TestNs::new("restart").await;
    let c = spawn_controller(&ns, "restart-1");
    ns.lock("l", spec(120, 1)).await;
    let mut claims = claims_in_order(&ns, "l", 3).await;
    c.stop().await;
    // While no controller runs: a new claim arrives and the holder releases.
    let p3 = ns.pod("p3").await;
    claims.push(claim(&ns, "l", &p3, 120).await);
    release(&ns, &claims[0]).await;
    let _c = spawn_controller(&ns, "restart-2");
    let l = ns
        .wait_lock("l", "p1 holds after restart", |l| holders(l) == ["p1"])
        .await;
    assert_eq!(queue(&l), ["p2", "p3"], "no waiter lost, order kept");
    assert_eq!(tokens(&l), [2]);
    for (i, claim) in claims.iter().enumerate().skip(1) {
        ns.wait_lock("l", "next holds", |l| holders(l) == [format!("p{i}")])
            .await;
        release(&ns, claim).await;
    }
    let l = ns.wait_lock("l", "free", |l| holders(l).is_empty()).await;
    assert_eq!(last_token(&l), 4);
}

#[tokio::test]
async fn two_controllers_at_once_never_exceed_max_holders() {
    let ns = TestNs::new("twoctl").await;
    let _c1 = spawn_controller(&ns, "twin-1");
    let _c2 = spawn_controller(&ns, "twin-2");
    ns.lock("l", spec(120, 1)).await;
    // Record every status version the API server stores.
    let mut versions = watcher(ns.locks(), watcher::Config::default())
        .applied_objects()
        .boxed();
    let recorder = tokio::spawn(async move {
        let mut seen = Vec::new();
        while let Some(Ok(l)) = versions.next().await {
            let st = l.status.clone().unwrap_or_default();
            seen.push((st.holders.len(), st.fencing_token));
            if last_token(&l) >= 30 && st.holders.is_empty() {
                break;
            }
        }
        seen
    });
    let mut pods = Vec::new();
    for i in 0..3 {
        pods.push(ns.pod(&format!("p{i}")).await);
    }
    for round in 0..10 {
        let claims: Vec<String> = futures::future::join_all(pods.iter().map(|p| claim(&ns, "l", p, 120))).await;
        for _ in 0..3 {
            let l = ns
                .wait_lock("l", &format!("a holder in round {round}"), |l| holders(l).len() == 1)
                .await;
            let holder = &l.status.as_ref().unwrap().holders[0].claim;
            assert!(claims.contains(holder));
            release(&ns, holder).await;
            ns.wait_lock("l", "the release is processed", |l| {
                !l.status.as_ref().unwrap().holders.iter().any(|h| &h.claim == holder)
            })
            .await;
        }
    }
    let seen = tokio::time::timeout(DEADLINE, recorder)
        .await
        .expect("recorder finished")
        .unwrap();
    assert!(
        seen.iter().all(|(holders, _)| *holders <= 1),
        "two holders at once: {seen:?}"
    );
    assert!(
        seen.windows(2).all(|w| w[0].1 <= w[1].1),
        "token went backwards: {seen:?}"
    );
    let epoch = epoch(&ns.locks().get("l").await.unwrap());
    assert_eq!(seen.last().unwrap().1 - epoch, 30, "30 grants, each with its own token");
}

#[tokio::test]
async fn bad_claims_get_warnings_and_block_nothing() {
    let ns = TestNs::new("bad").await;
    let _c = spawn_controller(&ns, "bad");
    let a = ns.pod("a").await;
    // A claim for a lock that does not exist yet waits, with a Warning.
    let early = claim(&ns, "later", &a, 120).await;
    wait_event(&ns, &early, "LockNotFound").await;
    ns.lock("later", spec(120, 1)).await;
    ns.wait_lock("later", "the early claim is granted once the lock exists", |l| {
        holders(l) == ["a"]
    })
    .await;

    // A malformed claim (no pod-uid annotation) is ignored with a Warning.
    ns.lock("l", spec(120, 1)).await;
    let b = ns.pod("b").await;
    let mut bad = leasehold::protocol::claim::claim_lease("bad-claim", "l", &b, 120);
    bad.metadata.annotations = None;
    leases(&ns).create(&PostParams::default(), &bad).await.unwrap();
    wait_event(&ns, "bad-claim", "InvalidClaim").await;
    // ...and blocks no one.
    claim(&ns, "l", &b, 120).await;
    let l = ns
        .wait_lock("l", "the good claim is granted", |l| holders(l) == ["b"])
        .await;
    assert!(
        l.status.as_ref().unwrap().holders[0].claim.starts_with("l-"),
        "the valid claim holds"
    );
    // An odd status edit does not crash the controller: a duplicate holder entry.
    let mut st = l.status.clone().unwrap();
    st.holders.push(st.holders[0].clone());
    ns.locks()
        .patch_status(
            "l",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "status": st })),
        )
        .await
        .unwrap();
    ns.wait_lock("l", "the duplicate is cleaned up", |l| holders(l) == ["b"])
        .await;
}

#[tokio::test]
async fn a_claim_swept_before_the_controller_saw_its_release_passes_the_slot_at_once() {
    let ns = TestNs::new("sweptrel").await;
    let (proxy, _c) = controller_with_proxied_watches(&ns, "sweptrel").await;
    ns.lock("l", spec(60, 1)).await;
    let (a, b) = (ns.pod("a").await, ns.pod("b").await);
    let ca = claim(&ns, "l", &a, 60).await;
    ns.wait_lock("l", "a holds", |l| holders(l) == ["a"]).await;
    let _cb = claim(&ns, "l", &b, 60).await;
    ns.wait_lock("l", "b waits", |l| queue(l) == ["b"]).await;
    // The controller's watches stall while a releases and its claim is swept (as a
    // batch sweep may, before the controller decided on the release); then they resume.
    proxy.freeze_open();
    release(&ns, &ca).await;
    leases(&ns).delete(&ca, &Default::default()).await.unwrap();
    proxy.thaw();
    // A claim gone without a release would hold a's slot back for the 60 s lease,
    // longer than the wait: b holds because a's release was seen, and the lock says so.
    ns.wait_lock("l", "b holds (within the wait, not after a 60 s hold-back)", |l| {
        holders(l) == ["b"]
    })
    .await;
    wait_event(&ns, "l", "Released").await;
    let reasons = event_reasons(&ns, "l").await;
    assert!(
        !reasons.iter().any(|r| r == "Revoked"),
        "a's release was taken for a forced one: {reasons:?}"
    );
}
