//! The client library's lifecycle against the real API server: abandoned acquisitions,
//! a deleted lock, and a waiter whose watch stalls.

use std::time::Duration;

use kube::ResourceExt;
use leasehold::api::RevokeReason;
use leasehold::client::{Lock, LostReason, State};
use leasehold::protocol::PodIdentity;

use crate::support::*;

fn lock_for(client: kube::Client, ns: &TestNs, pod: PodIdentity) -> Lock {
    Lock::builder(client, &ns.name, "l").identity(pod).build().unwrap()
}

#[tokio::test]
async fn an_acquire_dropped_while_waiting_withdraws_its_claim() {
    let ns = TestNs::new("dropacq").await;
    let _c = spawn_controller(&ns, "dropacq");
    ns.lock("l", spec(15)).await;
    let (a, b) = (ns.pod("a").await, ns.pod("b").await);
    let guard = lock_for(ns.client.clone(), &ns, a).acquire().await.unwrap();
    let lock_b = lock_for(ns.client.clone(), &ns, b);
    let mut acquiring = Box::pin(lock_b.acquire());
    // b's acquire runs until the controller has queued its claim; then it is dropped.
    tokio::select! {
        got = &mut acquiring => panic!("b cannot have the lock while a holds it: {:?}", got.map(|g| g.claim().to_string())),
        _ = ns.wait_lock("l", "b queued", |l| queue(l) == ["b"]) => {}
    }
    let l = ns.locks().get("l").await.unwrap();
    let claim_b = l.status.unwrap().queue[0].claim.clone();
    drop(acquiring);
    ns.wait_lock("l", "b's abandoned claim leaves the queue", |l| queue(l).is_empty())
        .await;
    wait_for("b's abandoned claim deleted", DEADLINE, || async {
        leases(&ns).get_opt(&claim_b).await.unwrap().is_none().then_some(())
    })
    .await;
    guard.release().await.unwrap();
    ns.wait_lock("l", "nobody holds the lock", |l| holders(l).is_empty())
        .await;
}

#[tokio::test]
async fn deleting_the_lock_revokes_its_holder() {
    let ns = TestNs::new("lockdel").await;
    let _c = spawn_controller(&ns, "lockdel");
    ns.lock("l", spec(15)).await;
    let a = ns.pod("a").await;
    let guard = lock_for(ns.client.clone(), &ns, a).acquire().await.unwrap();
    ns.locks().delete("l", &Default::default()).await.unwrap();
    tokio::time::timeout(DEADLINE, guard.lost())
        .await
        .expect("lost() fires when the lock is deleted");
    assert_eq!(*guard.state().borrow(), State::Lost(LostReason::LockDeleted));
}

#[tokio::test]
async fn a_lock_re_created_under_the_same_name_issues_higher_tokens() {
    let ns = TestNs::new("recreate").await;
    let _c = spawn_controller(&ns, "recreate");
    ns.lock("l", spec(15)).await;
    let (a, b) = (ns.pod("a").await, ns.pod("b").await);
    let lock_a = lock_for(ns.client.clone(), &ns, a);
    let mut old = Vec::new();
    for _ in 0..3 {
        let g = lock_a.acquire().await.unwrap();
        old.push(g.fencing_token());
        g.release().await.unwrap();
    }
    // An uninstall/reinstall or a GitOps replace: the lock goes and comes back at once.
    ns.locks().delete("l", &Default::default()).await.unwrap();
    ns.wait_gone("l").await;
    ns.lock("l", spec(15)).await;
    let g = lock_for(ns.client.clone(), &ns, b).acquire().await.unwrap();
    let newest = *old.iter().max().unwrap();
    assert!(
        g.fencing_token() > newest,
        "the new lock's token {} does not exceed the old lock's {newest}",
        g.fencing_token()
    );
    g.release().await.unwrap();
}

#[tokio::test]
async fn a_waiter_whose_watch_stalls_still_learns_of_its_grant() {
    let ns = TestNs::new("stallwait").await;
    let _c = spawn_controller(&ns, "stallwait");
    // Granted while its watch stalls, b must see the grant and renew within the lease
    // and the controller's grace (12 s) or lose it: PING_AFTER + PING_TIMEOUT (6 s) and a
    // new watch fit in that.
    let lease = 10;
    ns.lock("l", spec(lease)).await;
    let (proxy, watches) = proxied_watch_client("stallwait").await;
    let (a, b) = (ns.pod("a").await, ns.pod("b").await);
    let guard = lock_for(ns.client.clone(), &ns, a).acquire().await.unwrap();
    let lock_b = lock_for(split_client(ns.client.clone(), watches), &ns, b);
    let waiting = tokio::spawn(async move { lock_b.acquire().await.map(|g| g.fencing_token()) });
    ns.wait_lock("l", "b waits", |l| queue(l) == ["b"]).await;
    // b's watch stalls on a connection that answers nothing; then a releases.
    proxy.freeze_open();
    guard.release().await.unwrap();
    // b reads its lock afresh only every ten minutes while it waits (WAIT_CHECK): it
    // learns in time only because its client finds the dead connection by HTTP/2 PINGs
    // and watches again on a new one (without them it waits past this deadline, and the
    // controller takes the grant back unrenewed).
    let token = tokio::time::timeout(DEADLINE, waiting)
        .await
        .expect("b learns of its grant, though its watch is stalled")
        .unwrap()
        .unwrap();
    assert_eq!(token - epoch(&ns.locks().get("l").await.unwrap()), 2);
    proxy.thaw();
}

/// Lock `l` (lease `lease`) with pods a and b, held by a's claim, which a's process
/// renews until its node stops answering: (b, a's claim, the renewing task).
async fn held_by_a_renewing(ns: &TestNs, lease: i32) -> (PodIdentity, String, tokio::task::JoinHandle<()>) {
    ns.lock("l", spec(lease)).await;
    let (a, b) = (ns.pod("a").await, ns.pod("b").await);
    let claim_a = claim(ns, "l", &a, lease).await;
    let renewing = keep_renewing(ns, &claim_a, Duration::from_millis(500));
    ns.wait_lock("l", "a holds", |l| holders(l) == ["a"]).await;
    (b, claim_a, renewing)
}

/// Pod a's node stops answering: its renewals of `claim_a` end (the last was sent
/// before now, so its process stops by the deadline returned), its pod is force-deleted
/// (no kubelet says its containers stopped) and its claim goes with it (pod GC).
async fn cut_off_and_force_deleted(
    ns: &TestNs,
    claim_a: &str,
    renewing: tokio::task::JoinHandle<()>,
    lease: i32,
) -> std::time::Instant {
    renewing.abort();
    let stops_by =
        leasehold::protocol::timing::client_stop_by(std::time::Instant::now(), Duration::from_secs(lease as u64));
    ns.delete_pod("a").await;
    let _ = leases(ns).delete(claim_a, &Default::default()).await;
    stops_by
}

/// Once the deleted lock `l` is gone, re-create it: `grant` (b's acquisition) must not
/// complete before `a_stops_by`, when a's process has certainly stopped.
async fn re_created_grants_no_sooner_than(
    ns: &TestNs,
    lease: i32,
    grant: impl std::future::Future<Output = leasehold::client::Guard>,
    a_stops_by: std::time::Instant,
) {
    ns.wait_gone("l").await;
    ns.lock("l", spec(lease)).await;
    let guard_b = tokio::time::timeout(DEADLINE, grant)
        .await
        .expect("b is granted the re-created lock");
    let granted = std::time::Instant::now();
    assert!(
        granted >= a_stops_by,
        "b was granted {:?} before a's process had certainly stopped",
        a_stops_by - granted
    );
    guard_b.release().await.unwrap();
}

#[tokio::test]
async fn a_deleted_lock_revokes_its_holder_and_goes_only_once_it_stopped() {
    let ns = TestNs::new("finalize").await;
    let _c = spawn_controller(&ns, "finalize");
    ns.lock("l", spec(30)).await;
    let (a, b) = (ns.pod("a").await, ns.pod("b").await);
    // a's process goes on renewing its claim, not yet aware of anything.
    let claim_a = claim(&ns, "l", &a, 30).await;
    let renewing = keep_renewing(&ns, &claim_a, Duration::from_secs(2));
    let held = ns.wait_lock("l", "a holds", |l| holders(l) == ["a"]).await;
    let token = held.status.as_ref().unwrap().holders[0].fencing_token;
    ns.locks().delete("l", &Default::default()).await.unwrap();
    let closing = ns
        .wait_lock("l", "a's grant revoked by the deletion", |l| {
            revoked_for(l) == [("a".to_string(), Some(RevokeReason::LockDeleted))]
        })
        .await;
    assert!(
        closing.metadata.deletion_timestamp.is_some(),
        "the lock stays while a may run"
    );
    // a stops and says so with a valid release: the lock goes at once, and a lock
    // re-created under its name grants afresh, above the old tokens.
    renewing.abort();
    release(&ns, &claim_a).await;
    ns.wait_gone("l").await;
    ns.lock("l", spec(30)).await;
    let claim_b = claim(&ns, "l", &b, 30).await;
    let _renewing_b = keep_renewing(&ns, &claim_b, Duration::from_secs(2));
    let lock = ns.wait_lock("l", "b holds", |l| holders(l) == ["b"]).await;
    let b_token = lock.status.as_ref().unwrap().holders[0].fencing_token;
    assert!(b_token > token, "b's token {b_token} after a's {token}");
}

#[tokio::test]
async fn a_holder_force_deleted_after_its_lock_was_deleted_is_run_out_before_a_re_created_lock_grants() {
    // The holder's claim goes with its force-deleted pod (garbage collection) while its
    // process may run on: a lock re-created afterwards could never see it, so the
    // deleted lock must not go before that process has certainly stopped.
    let ns = TestNs::new("finalgc").await;
    let _c = spawn_controller(&ns, "finalgc");
    let lease = 4;
    let (b, claim_a, renewing) = held_by_a_renewing(&ns, lease).await;
    ns.locks().delete("l", &Default::default()).await.unwrap();
    ns.wait_lock("l", "a's grant revoked by the deletion", |l| {
        revoked_for(l) == [("a".to_string(), Some(RevokeReason::LockDeleted))]
    })
    .await;
    let a_stops_by = cut_off_and_force_deleted(&ns, &claim_a, renewing, lease).await;
    let lock_b = lock_for(ns.client.clone(), &ns, b);
    let grant = async move { lock_b.acquire().await.unwrap() };
    re_created_grants_no_sooner_than(&ns, lease, grant, a_stops_by).await;
}

#[tokio::test]
async fn the_successor_of_a_deleted_lock_is_revoked_and_claims_anew_in_the_re_created_lock() {
    let ns = TestNs::new("finalsucc").await;
    let _c = spawn_controller(&ns, "finalsucc");
    ns.lock("l", spec(30)).await;
    let (a, b) = (ns.pod("a").await, ns.pod("b").await);
    let guard_a = lock_for(ns.client.clone(), &ns, a).acquire().await.unwrap();
    let lock_b = lock_for(ns.client.clone(), &ns, b);
    let waiting = tokio::spawn(async move { lock_b.acquire().await });
    let designated = ns
        .wait_lock("l", "b designated", |l| {
            l.status.as_ref().is_some_and(|s| s.successor.is_some())
        })
        .await;
    let successor = designated.status.unwrap().successor.unwrap();
    // A controller may have told b of its grant before any status said so: the deleted
    // lock revokes b like a holder, with its reserved token, and a's grant.
    ns.locks().delete("l", &Default::default()).await.unwrap();
    let closing = ns
        .wait_lock("l", "a and b revoked by the deletion", |l| {
            let revoked = revoked_for(l);
            revoked.iter().any(|(p, _)| p == "a") && revoked.iter().all(|(_, r)| *r == Some(RevokeReason::LockDeleted))
        })
        .await;
    assert!(
        closing.status.unwrap().successor.is_none(),
        "a closing lock designates no one"
    );
    tokio::time::timeout(DEADLINE, guard_a.lost())
        .await
        .expect("a's grant ends with its lock");
    assert_eq!(*guard_a.state().borrow(), State::Lost(LostReason::LockDeleted));
    guard_a.release().await.expect("a says it stopped");
    // b, never granted, says so with a valid release and waits on with a new claim;
    // with no holder left the lock goes, and b is granted the re-created lock.
    ns.wait_gone("l").await;
    ns.lock("l", spec(30)).await;
    let guard_b = tokio::time::timeout(DEADLINE, waiting)
        .await
        .expect("b is granted the re-created lock, not left behind its own held-back claim")
        .unwrap()
        .unwrap();
    assert!(guard_b.fencing_token() > successor.fencing_token);
    let lock = ns.wait_lock("l", "b holds", |l| holders(l) == ["b"]).await;
    let status = lock.status.unwrap();
    assert_ne!(status.holders[0].claim, successor.claim, "with a new claim");
    assert!(status.holders.iter().all(|h| h.revoked.is_none()), "nothing held back");
}

#[tokio::test]
async fn a_deleted_lock_runs_out_a_held_back_slot_before_it_goes() {
    let ns = TestNs::new("finalheld").await;
    let _c = spawn_controller(&ns, "finalheld");
    let lease = 4;
    let (b, claim_a, renewing) = held_by_a_renewing(&ns, lease).await;
    let lock_b = lock_for(ns.client.clone(), &ns, b);
    let waiting = tokio::spawn(async move { lock_b.acquire().await });
    ns.wait_lock("l", "b waits", |l| queue(l) == ["b"]).await;
    // a is cut off and force-deleted: its slot is held back, as its process may run on.
    let a_stops_by = cut_off_and_force_deleted(&ns, &claim_a, renewing, lease).await;
    ns.wait_lock("l", "a's slot held back", |l| {
        l.status
            .as_ref()
            .is_some_and(|s| s.holders.first().is_some_and(|h| h.revoked.is_some()))
    })
    .await;
    // The lock is deleted and re-created: a's claim is gone, so a re-created lock could
    // not know of a. The old lock runs the hold-back out before it goes, granting nothing.
    ns.locks().delete("l", &Default::default()).await.unwrap();
    let closing = ns
        .wait_lock("l", "the deleted lock to say it waits for a's slot", |l| {
            let ready = l
                .status
                .as_ref()
                .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"));
            ready.is_some_and(|c| c.reason == "Deleting" && c.status == "False" && c.message.contains("pod(s) a "))
        })
        .await;
    assert!(
        holders(&closing).iter().all(|h| h != "b"),
        "a closing lock grants nothing"
    );
    let grant = async move { waiting.await.unwrap().unwrap() };
    re_created_grants_no_sooner_than(&ns, lease, grant, a_stops_by).await;
}

/// The `spec.renewTime`s of claim `claim`, as seen until `n` distinct ones were.
async fn renewals_seen(ns: &TestNs, claim: &str, n: usize) {
    let seen = std::sync::Mutex::new(std::collections::BTreeSet::new());
    wait_for(&format!("{n} renewals of {claim}"), DEADLINE, || async {
        let l = leases(ns).get(claim).await.ok()?;
        let renewed = l.spec.and_then(|s| s.renew_time).map(|t| t.0.to_string());
        let mut seen = seen.lock().unwrap();
        seen.insert(renewed);
        (seen.len() >= n).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_waiter_does_not_write_while_it_waits_and_renews_at_its_grant_before_it_acts() {
    let ns = TestNs::new("slowwait").await;
    let _c = spawn_controller(&ns, "slowwait");
    // Short, so that a holds for three leases within ~13 s; not shorter, because a
    // renews every lease/3 and must not lose its grant to a slow API call meanwhile.
    let lease = 4;
    ns.lock("l", spec(lease)).await;
    let (a, b) = (ns.pod("a").await, ns.pod("b").await);
    let guard = lock_for(ns.client.clone(), &ns, a).acquire().await.unwrap();
    let lock_b = lock_for(ns.client.clone(), &ns, b);
    let waiting = tokio::spawn(async move { lock_b.acquire().await.unwrap() });
    let l = ns.wait_lock("l", "b waits", |l| queue(l) == ["b"]).await;
    let cb = l.status.unwrap().queue[0].claim.clone();
    let created = leases(&ns).get(&cb).await.unwrap();
    // a holds for more than three leases (renewing every lease/3): b's deadline (from
    // its create) passes, and so would its claim's expiry if it were judged by its lease.
    let ca = holder_claim(&ns, "l").await;
    renewals_seen(&ns, &ca, 10).await;
    let still = leases(&ns).get(&cb).await.unwrap();
    assert_eq!(
        still.resource_version(),
        created.resource_version(),
        "b's claim was written while it waited"
    );
    let l = ns.locks().get("l").await.unwrap();
    assert_eq!(queue(&l), ["b"], "the controller judges a waiter by its wait lease");
    guard.release().await.unwrap();
    let g = tokio::time::timeout(DEADLINE, waiting).await.unwrap().unwrap();
    let renewed = leases(&ns).get(&cb).await.unwrap();
    let renew_time = |l: &k8s_openapi::api::coordination::v1::Lease| l.spec.as_ref().unwrap().renew_time.clone();
    assert_ne!(
        renew_time(&renewed),
        renew_time(&created),
        "b acted on a grant with its deadline long passed, without renewing first"
    );
    // Granted long after its last write, b keeps the grant: it renews as a holder.
    renewals_seen(&ns, &cb, 4).await;
    assert_eq!(*g.state().borrow(), State::Live);
    let l = ns.recorded("l", g.claim()).await;
    assert_eq!(holders(&l), ["b"]);
    assert_eq!(tokens(&l), [2]);
    g.release().await.unwrap();
}

#[tokio::test]
async fn a_lease_re_created_under_a_claims_name_renews_nothing_for_the_claims_client() {
    let ns = TestNs::new("recreatedclaim").await;
    let mut controller = spawn_controller(&ns, "recreatedclaim");
    let lease = 3;
    ns.lock("l", spec(lease)).await;
    let a = ns.pod("a").await;
    let guard = lock_for(ns.client.clone(), &ns, a).acquire().await.unwrap();
    // No controller from here on: only the client's own renewals can tell it.
    controller.abort();
    let ca = holder_claim(&ns, "l").await;
    let mut twin = leases(&ns).get(&ca).await.unwrap();
    leases(&ns).delete(&ca, &Default::default()).await.unwrap();
    twin.metadata.uid = None;
    twin.metadata.resource_version = None;
    twin.metadata.creation_timestamp = None;
    twin.metadata.managed_fields = None;
    leases(&ns).create(&Default::default(), &twin).await.unwrap();
    // (No controller runs: were the renewal taken for one, a would hold for ever.)
    tokio::time::timeout(DEADLINE, guard.lost())
        .await
        .expect("a renewal landing on another object under the claim's name is no renewal");
    assert_eq!(*guard.state().borrow(), State::Lost(LostReason::ClaimGone));
}

/// One HTTP/2 connection carries at most as many streams as the API server allows (250
/// here), and a watch holds one for as long as it runs: a process watching more locks
/// than that through one lock client (`kubeconfig::watch_client_from`) must still see
/// every one of them.
#[tokio::test]
async fn one_client_carries_more_watches_than_one_connection_has_streams() {
    use futures::StreamExt;
    use kube::api::{Api, Patch, PatchParams, WatchEvent, WatchParams};

    let ns = TestNs::new("streams").await;
    let rv = ns.lock("l", spec(15)).await.resource_version().unwrap();
    let client = leasehold::kubeconfig::watch_client_for(kubeconfig()).await.unwrap();
    let locks: Api<leasehold::api::DistributedLock> = Api::namespaced(client, &ns.name);
    let params = WatchParams::default().fields("metadata.name=l");
    let mut watches = Vec::new();
    for i in 0..300 {
        let watch = tokio::time::timeout(DEADLINE, locks.watch(&params, &rv))
            .await
            .unwrap_or_else(|_| panic!("watch {i} of 300 not started within {DEADLINE:?}"))
            .unwrap();
        watches.push(watch.boxed());
    }
    let label = serde_json::json!({ "metadata": { "labels": { "seen": "yes" } } });
    ns.locks()
        .patch("l", &PatchParams::default(), &Patch::Merge(&label))
        .await
        .unwrap();
    for (i, watch) in watches.iter_mut().enumerate() {
        let seen = tokio::time::timeout(DEADLINE, watch.next()).await;
        assert!(
            matches!(seen, Ok(Some(Ok(WatchEvent::Modified(_))))),
            "watch {i} of 300 did not see the change: {seen:?}"
        );
    }
}
