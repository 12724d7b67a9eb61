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

/// Restart `component` after 3 s down, and return how long the outage really was
/// (checked against [`assume_rides_out`]).
async fn outage(cp: &mut ControlPlane, component: &str) -> Duration {
    let started = std::time::Instant::now();
    cp.restart(component, Duration::from_secs(3)).await.unwrap();
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

    // The API server crashes and is down for 3 s (plus its start): the holder rides it
    // out, and the queue survives.
    let took = outage(&mut cp, "kube-apiserver").await;
    let l = ns.wait_lock("l", "the lock after the restart", |_| true).await;
    assert_eq!(holders(&l), ["a"]);
    assert_eq!(queue(&l), ["b", "c"]);
    assert!(
        !first.is_lost(),
        "a {took:?} outage is no reason to give up a {LEASE} s lease"
    );
    first.release().await.unwrap();
    let second = waiting_b.await.unwrap();
    assert_eq!(tokens(&ns.recorded("l", second.claim()).await), [2]);

    // Then etcd crashes and is down for 3 s (plus its start).
    let took = outage(&mut cp, "etcd").await;
    let l = ns.wait_lock("l", "the lock after the etcd restart", |_| true).await;
    assert_eq!(holders(&l), ["b"]);
    assert_eq!(queue(&l), ["c"]);
    assert!(
        !second.is_lost(),
        "a {took:?} outage is no reason to give up a {LEASE} s lease"
    );
    second.release().await.unwrap();
    let third = waiting_c.await.unwrap();
    assert_eq!(tokens(&ns.recorded("l", third.claim()).await), [3]);
    third.release().await.unwrap();
    cp.stop().await;
}
