//! Bad input: every malformed or odd claim we could think of, fed to one controller.
//! Each gets a clear Warning event (or the lock a condition), none blocks a valid
//! waiter or a healthy lock, and the controller never stops serving.

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Patch, PatchParams, PostParams};
use leasehold::api::{DistributedLock, DistributedLockSpec};
use leasehold::client::Lock;
use leasehold::protocol::PodIdentity;
use leasehold::protocol::claim::claim_lease;

use crate::support::*;

fn spec(lease: i32, max: i32) -> DistributedLockSpec {
    DistributedLockSpec {
        lease_duration_seconds: lease,
        max_holders: max,
        backend: None,
        max_queue: None,
    }
}

/// A claim for lock `l` from `pod`, then bent by `bend`.
fn bent(name: &str, pod: &PodIdentity, bend: impl FnOnce(&mut Lease)) -> Lease {
    let mut lease = claim_lease(name, "l", pod, 120);
    bend(&mut lease);
    lease
}

fn annotate(lease: &mut Lease, key: &str, value: &str) {
    let annotations = lease.metadata.annotations.get_or_insert_default();
    annotations.insert(key.into(), value.into());
}

/// Wait for a `reason` warning on `object`. A claim whose ownerReference names a UID no
/// pod has may instead be garbage-collected first (its owner never existed), which
/// also settles it: `ClaimIgnored` accepts that.
async fn wait_warning(ns: &TestNs, object: &str, reason: &str) {
    wait_for(&format!("a {reason} warning on {object}"), DEADLINE, || async {
        let warned = event_reasons(ns, object).await.iter().any(|r| r == reason);
        let collected = reason == "ClaimIgnored" && leases(ns).get_opt(object).await.unwrap().is_none();
        (warned || collected).then_some(())
    })
    .await;
}

#[tokio::test]
async fn malformed_claims_get_warnings_and_block_no_one() {
    let ns = TestNs::new("corpus").await;
    let _c = spawn_controller(&ns, "corpus");
    ns.lock("l", spec(120, 1)).await;
    ns.lock("good", spec(15, 1)).await;
    let (h, b, c) = (ns.pod("h").await, ns.pod("b").await, ns.pod("c").await);
    let holder = claim(&ns, "l", &h, 120).await;
    ns.wait_lock("l", "h holds", |l| holders(l) == ["h"]).await;
    let ghost = PodIdentity {
        name: "ghost".into(),
        namespace: ns.name.clone(),
        uid: "ghost-uid".into(),
    };
    let elsewhere = PodIdentity {
        name: "app".into(),
        namespace: "kube-system".into(),
        uid: b.uid.clone(),
    };
    let impostor = PodIdentity {
        uid: c.uid.clone(),
        ..b.clone()
    };
    let corpus: Vec<(Lease, &str)> = vec![
        (
            bent("no-holder", &b, |l| l.spec.as_mut().unwrap().holder_identity = None),
            "InvalidClaim",
        ),
        (
            bent("no-pod-uid", &b, |l| {
                l.metadata.annotations.as_mut().unwrap().remove("leasehold.dev/pod-uid");
            }),
            "InvalidClaim",
        ),
        (
            bent("no-owner", &b, |l| l.metadata.owner_references = None),
            "InvalidClaim",
        ),
        (
            bent("garbled-uid", &b, |l| {
                annotate(l, "leasehold.dev/pod-uid", "not-a-uid");
                l.metadata.owner_references.as_mut().unwrap()[0].uid = "not-a-uid".into();
            }),
            "ClaimIgnored",
        ),
        (bent("unknown-pod", &ghost, |_| {}), "ClaimIgnored"),
        (bent("pod-in-another-ns", &elsewhere, |_| {}), "ClaimIgnored"),
        (bent("another-pods-uid", &impostor, |_| {}), "ClaimIgnored"),
        (
            bent("released-false", &b, |l| annotate(l, "leasehold.dev/released", "false")),
            "ForgedRelease",
        ),
        (
            bent("released-yes", &b, |l| annotate(l, "leasehold.dev/released", "yes")),
            "ForgedRelease",
        ),
        (
            bent("no-lease", &b, |l| {
                l.spec.as_mut().unwrap().lease_duration_seconds = None
            }),
            "ClaimIgnored", // LeaseMissing: its process wrote one (issue #41)
        ),
        (
            bent("malformed-hash", &b, |l| {
                annotate(l, "leasehold.dev/release-hash", "not-a-hash")
            }),
            "InvalidClaim",
        ),
        // (A lease of 0 or less the API server refuses itself.)
        (
            bent("huge-lease", &b, |l| {
                l.spec.as_mut().unwrap().lease_duration_seconds = Some(1_000_000_000)
            }),
            "ClaimLease",
        ),
    ];
    for (lease, _) in &corpus {
        let mut lease = lease.clone();
        lease.metadata.namespace = Some(ns.name.clone());
        leases(&ns).create(&PostParams::default(), &lease).await.unwrap();
    }
    for (lease, reason) in &corpus {
        wait_warning(&ns, lease.metadata.name.as_deref().unwrap(), reason).await;
    }
    // The lock's Ready condition says claims are rejected while they are there, and
    // only then (a capped lease is a note, not a rejection).
    let ready = |l: &DistributedLock| {
        let s = l.status.as_ref()?;
        let c = s.conditions.iter().find(|c| c.type_ == "Ready")?;
        Some((c.status.clone(), c.reason.clone()))
    };
    let rejected = Some(("False".to_string(), "ClaimsRejected".to_string()));
    ns.wait_lock("l", "Ready=False ClaimsRejected", |l| ready(l) == rejected)
        .await;
    for (lease, reason) in &corpus {
        if *reason != "ClaimLease" {
            let name = lease.metadata.name.as_deref().unwrap();
            // (A dropped waiter's claim the controller may have deleted already.)
            let _ = leases(&ns).delete(name, &Default::default()).await;
        }
    }
    ns.wait_lock("l", "Ready=True once the rejected claims are gone", |l| {
        ready(l).is_some_and(|(status, _)| status == "True")
    })
    .await;
    // A valid claim with a name at the 253-character limit queues like any other.
    let long_name = "a".repeat(253);
    let long = claim_lease(&long_name, "l", &c, 120);
    leases(&ns).create(&PostParams::default(), &long).await.unwrap();
    ns.wait_lock("l", "the long-named claim waits", |l| {
        l.status
            .as_ref()
            .is_some_and(|s| s.queue.iter().any(|w| w.claim == long_name))
    })
    .await;
    // Only the well-formed claims wait (a huge lease is capped); nothing else queued.
    let l = ns.locks().get("l").await.unwrap();
    let mut queued: Vec<String> = l.status.unwrap().queue.into_iter().map(|w| w.claim).collect();
    queued.sort();
    assert_eq!(queued, [long_name.as_str(), "huge-lease"]);

    // The lock's spec edited mid-hold: maxHolders up then down, the lease shortened.
    let locks = ns.locks();
    let edit = |v: serde_json::Value| {
        let locks = locks.clone();
        async move {
            locks
                .patch("l", &PatchParams::default(), &Patch::Merge(&v))
                .await
                .unwrap();
        }
    };
    edit(serde_json::json!({"spec": {"maxHolders": 3}})).await;
    ns.wait_lock("l", "three hold", |l| holders(l).len() == 3).await;
    edit(serde_json::json!({"spec": {"maxHolders": 1, "leaseDurationSeconds": 60}})).await;
    let l = ns.wait_lock("l", "the edit observed", |l| {
        l.status.as_ref().and_then(|s| s.observed_generation) == l.metadata.generation
    });
    assert_eq!(holders(&l.await).len(), 3, "lowering maxHolders revokes no one");
    release(&ns, &holder).await;

    // The controller still serves a healthy lock, and a lock whose name no claim can
    // carry says so in its Ready condition.
    take_turn(&ns, "good", h.clone()).await;
    let too_long = "x".repeat(64);
    ns.lock(&too_long, spec(15, 1)).await;
    let l = ns
        .wait_lock(&too_long, "a Ready=False condition", |l| {
            l.status
                .as_ref()
                .is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "False"))
        })
        .await;
    let ready = l
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert_eq!(ready.reason, "NameTooLong");
    let refused = Lock::builder(ns.client.clone(), &ns.name, &too_long)
        .identity(h)
        .build();
    assert!(refused.is_err(), "the client refuses it with a clear error");
}

#[tokio::test]
async fn a_thousand_claims_on_one_lock_all_wait_in_order() {
    let ns = TestNs::new("thousand").await;
    let _c = spawn_controller(&ns, "thousand");
    ns.lock("l", spec(300, 1)).await;
    let p = ns.pod("p").await;
    let mut names = Vec::new();
    for chunk in 0..20 {
        let made = futures::future::join_all((0..50).map(|i| {
            let name = format!("l-{:04}", chunk * 50 + i);
            let lease = claim_lease(&name, "l", &p, 300);
            let api = leases(&ns);
            async move {
                api.create(&PostParams::default(), &lease).await.unwrap();
                name
            }
        }))
        .await;
        names.extend(made);
    }
    let l = ns
        .wait_lock("l", "all 1000 claims placed", |l| {
            holders(l).len() + queue(l).len() == 1000
        })
        .await;
    assert_eq!(l.status.as_ref().unwrap().queue_length, 999);
    // Each batch of 50 was made after the one before had been created: whatever order
    // the claims of one batch arrived in, every claim of a batch is ahead of the next.
    let batch = |claim: &str| claim["l-".len()..].parse::<usize>().unwrap() / 50;
    let st = l.status.as_ref().unwrap();
    let order: Vec<usize> = st
        .holders
        .iter()
        .map(|h| batch(&h.claim))
        .chain(st.queue.iter().map(|w| batch(&w.claim)))
        .collect();
    assert!(
        order.windows(2).all(|w| w[0] <= w[1]),
        "a later batch queued ahead of an earlier one: {order:?}"
    );
    // A healthy lock beside it is still served.
    ns.lock("other", spec(15, 1)).await;
    take_turn(&ns, "other", p).await;
}
