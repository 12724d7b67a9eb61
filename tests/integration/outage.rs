//! Faults of the control plane itself: the API server and etcd crash and come back while
//! locks are held and queued (on a control plane of this test's own), and a holder cut
//! off from the API server while the controller restarts.

use std::path::Path;
use std::time::Duration;

use leasehold::api::DistributedLockSpec;
use leasehold::client::Lock;
use leasehold::dev::ControlPlane;

use crate::support::*;

fn spec(lease: i32) -> DistributedLockSpec {
    DistributedLockSpec {
        lease_duration_seconds: lease,
        max_holders: 1,
        backend: None,
    }
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
    ns.lock("l", spec(15)).await;
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

    // The API server crashes and is down for 3 s: the holder rides it out (its lease
    // is 15 s), and the queue survives.
    cp.restart("kube-apiserver", Duration::from_secs(3)).await.unwrap();
    let l = ns.wait_lock("l", "the lock after the restart", |_| true).await;
    assert_eq!(holders(&l), ["a"]);
    assert_eq!(queue(&l), ["b", "c"]);
    assert!(!first.is_lost(), "a 3 s outage is no reason to give up a 15 s lease");
    first.release().await.unwrap();
    let second = waiting_b.await.unwrap();
    assert_eq!(tokens(&ns.locks().get("l").await.unwrap()), [2]);

    // Then etcd crashes and is down for 3 s.
    cp.restart("etcd", Duration::from_secs(3)).await.unwrap();
    let l = ns.wait_lock("l", "the lock after the etcd restart", |_| true).await;
    assert_eq!(holders(&l), ["b"]);
    assert_eq!(queue(&l), ["c"]);
    assert!(!second.is_lost());
    second.release().await.unwrap();
    let third = waiting_c.await.unwrap();
    assert_eq!(tokens(&ns.locks().get("l").await.unwrap()), [3]);
    third.release().await.unwrap();
    cp.stop().await;
}
