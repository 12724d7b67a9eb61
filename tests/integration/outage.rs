//! Faults of the control plane itself: the API server and etcd crash and come back while
//! locks are held and queued (on a control plane of this test's own), and a holder cut
//! off from the API server while the controller restarts.

use std::path::Path;
use std::time::Duration;

use leasehold::client::Lock;
use leasehold::dev::ControlPlane;

use crate::support::*;

/// The lock's lease. Not what is tested (riding out an outage is), so long: an outage
/// is the 3 s down plus the component's start on a loaded machine (an API server start
/// took ~8 s once in CI, and the 15 s lease this test had then was rightly given up).
const LEASE: i32 = 60;

/// How soon after a release the next waiter is granted once the control plane is back.
/// Watches are back at most 2 s (the controller's) or 5 s (a client's) after the API
/// server is, and relist at once when it answers 410 Gone; a watch sent while the API
/// server starts may hang until its watch cache is ready (seen here: ~10 s after it
/// answered `/readyz`). The released claim would expire only a lease after its last
/// renewal: before the watches paced themselves, the grant came 30–56 s after the
/// release, when the claim expired.
const GRANTED_WITHIN: Duration = Duration::from_secs(20);

/// The guard `waiting` acquires, within [`GRANTED_WITHIN`].
async fn granted_soon(
    waiting: tokio::task::JoinHandle<leasehold::client::Guard>,
    who: &str,
) -> leasehold::client::Guard {
    match tokio::time::timeout(GRANTED_WITHIN, waiting).await {
        Ok(guard) => guard.unwrap(),
        Err(_) => panic!("{who} was not granted within {GRANTED_WITHIN:?} of the release after the outage"),
    }
}

/// Restart `component` after `down`, and return how long the outage really was
/// (checked against [`assume_rides_out`]).
async fn outage(cp: &mut ControlPlane, component: &str, down: Duration) -> Duration {
    let started = std::time::Instant::now();
    cp.restart(component, down).await.unwrap();
    let took = started.elapsed();
    assume_rides_out(component, took, LEASE);
    took
}

#[tokio::test]
async fn held_and_queued_locks_ride_out_an_api_server_and_an_etcd_restart() {
    let mut cp = ControlPlane::start(Path::new(LEASEHOLD))
        .await
        .expect("own control plane");
    let admin = cp.client().await.unwrap();
    leasehold::crd::install(admin.clone()).await.unwrap();
    let ns = TestNs::new_on(admin.clone(), "outage").await;
    let _c = spawn_controller(&ns, "outage");
    ns.lock("l", spec(LEASE)).await;
    let (a, b, c) = (ns.pod("a").await, ns.pod("b").await, ns.pod("c").await);
    let lock = |pod| {
        Lock::builder(admin.clone(), &ns.name, "l")
            .identity(pod)
            .build()
            .unwrap()
    };
    let first = lock(a).acquire().await.unwrap();
    let (lock_b, lock_c) = (lock(b), lock(c));
    let waiting_b = tokio::spawn(async move { lock_b.acquire().await.unwrap() });
    ns.wait_lock("l", "b waits", |l| queue(l) == ["b"]).await;
    let waiting_c = tokio::spawn(async move { lock_c.acquire().await.unwrap() });
    ns.wait_lock("l", "c waits", |l| queue(l) == ["b", "c"]).await;

    // The API server crashes and is down for 8 s (plus its start): the holder rides it
    // out, and the queue survives. (Every watch fails all that time: long enough for a
    // backoff that grows without bound to outlast the outage by far.)
    let took = outage(&mut cp, "kube-apiserver", Duration::from_secs(8)).await;
    let l = ns.wait_lock("l", "the lock after the restart", |_| true).await;
    assert_eq!(holders(&l), ["a"]);
    assert_eq!(queue(&l), ["b", "c"]);
    assert!(
        !first.is_lost(),
        "a {took:?} outage is no reason to give up a {LEASE} s lease"
    );
    first.release().await.unwrap();
    let second = granted_soon(waiting_b, "b").await;
    assert_eq!(tokens(&ns.recorded("l", second.claim()).await), [2]);

    // Then etcd crashes and is down for 3 s (plus its start).
    let took = outage(&mut cp, "etcd", Duration::from_secs(3)).await;
    let l = ns.wait_lock("l", "the lock after the etcd restart", |_| true).await;
    assert_eq!(holders(&l), ["b"]);
    assert_eq!(queue(&l), ["c"]);
    assert!(
        !second.is_lost(),
        "a {took:?} outage is no reason to give up a {LEASE} s lease"
    );
    second.release().await.unwrap();
    let third = granted_soon(waiting_c, "c").await;
    assert_eq!(tokens(&ns.recorded("l", third.claim()).await), [3]);
    third.release().await.unwrap();
    cp.stop().await;
}
