//! The CRD is installed, a DistributedLock can be applied, watched and validated.

use futures::StreamExt;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use leasehold::api::{DistributedLock, DistributedLockSpec, DistributedLockStatus};

use crate::support::{DEADLINE, TestNs};

#[tokio::test]
async fn apply_a_lock_and_watch_it_change() {
    let ns = TestNs::new("smoke").await;
    let lock = ns.lock("smoke", DistributedLockSpec::default()).await;
    assert_eq!(lock.spec.lease_duration_seconds, 15, "defaulted by the schema");
    assert_eq!(lock.spec.max_holders, 1);

    let mut changes = watcher(ns.locks(), watcher::Config::default())
        .applied_objects()
        .boxed();
    let status = DistributedLockStatus {
        fencing_token: 7,
        ..Default::default()
    };
    let patch = Patch::Merge(serde_json::json!({ "status": status }));
    ns.locks()
        .patch_status("smoke", &PatchParams::default(), &patch)
        .await
        .expect("patch status");
    let seen = tokio::time::timeout(DEADLINE, async {
        while let Some(Ok(l)) = changes.next().await {
            if l.status.as_ref().is_some_and(|s| s.fencing_token == 7) {
                return l;
            }
        }
        panic!("watch ended");
    })
    .await
    .expect("the watch saw the status change");
    assert_eq!(seen.status.unwrap().fencing_token, 7);
}

#[tokio::test]
async fn out_of_range_spec_is_rejected_by_the_api_server() {
    let ns = TestNs::new("schema").await;
    for (lease, max) in [(0, 1), (3601, 1), (15, 0), (15, 1001)] {
        let spec = DistributedLockSpec {
            lease_duration_seconds: lease,
            max_holders: max,
            backend: None,
            max_queue: None,
        };
        let err = ns
            .locks()
            .create(&PostParams::default(), &DistributedLock::new("bad", spec))
            .await;
        let Err(kube::Error::Api(status)) = err else {
            panic!("lease {lease}, max {max} was accepted")
        };
        assert_eq!(status.code, 422, "{status:?}");
    }
}
