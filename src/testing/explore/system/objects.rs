//! The model's objects as the API server would serve them: claim Leases, the
//! DistributedLock, the pods the kubelet reported stopped. The controller's turn reads
//! these, as it reads the real ones.

use std::collections::BTreeMap;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{ContainerState, ContainerStateTerminated, ContainerStatus, Pod, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;

use super::{ClaimObj, LockObj, Mark};
use crate::api::DistributedLock;
use crate::protocol::{
    FENCING_TOKEN_ANNOTATION, LOCK_LABEL, POD_UID_ANNOTATION, RELEASE_HASH_ANNOTATION, RELEASED_ANNOTATION,
    REQUESTED_AT_ANNOTATION, WAIT_LEASE_ANNOTATION,
};

/// The namespace of everything.
pub(super) const NS: &str = "ns";
/// The lock's name.
pub(super) const LOCK: &str = "l";

/// The wall clock every controller reads: fixed (what the status says of when is
/// informational), and past every claim's pod-cache grace (claims are made at 0).
pub(super) fn wall() -> Timestamp {
    Timestamp::from_second(1_000_000).expect("a time")
}

/// The least token the incarnation `uid` of the lock issues: its creation time, in
/// microseconds, past the wall clock, so each incarnation's epoch is above the last's.
pub(super) fn epoch_floor(uid: u32) -> i64 {
    i64::from(uid) * 10_000_000_000_000
}

/// The pod of client (or neighbour) `i`, and its UID.
pub(super) fn pod(i: usize) -> (String, String) {
    (format!("p{i}"), format!("u{i}"))
}

/// Claim `name` as a Lease.
pub(super) fn claim_lease(name: &str, obj: &ClaimObj) -> Lease {
    let (pod, uid) = pod(obj.client);
    let stated_uid = if obj.uid_changed {
        format!("{uid}-changed")
    } else {
        uid.clone()
    };
    let requested = Timestamp::from_microsecond(i64::from(obj.made) + 1).expect("a time");
    let mut annotations = BTreeMap::from([
        (POD_UID_ANNOTATION.to_string(), stated_uid),
        (WAIT_LEASE_ANNOTATION.to_string(), obj.wait.to_string()),
        (REQUESTED_AT_ANNOTATION.to_string(), requested.to_string()),
    ]);
    if obj.hash {
        annotations.insert(RELEASE_HASH_ANNOTATION.into(), super::secret_hash().to_string());
    }
    match obj.mark {
        Mark::None => {}
        Mark::Owner => drop(annotations.insert(RELEASED_ANNOTATION.into(), super::secret().reveal().into())),
        Mark::Forged => drop(annotations.insert(RELEASED_ANNOTATION.into(), "true".into())),
    }
    if obj.stamped {
        annotations.insert(FENCING_TOKEN_ANNOTATION.into(), "1".into());
    }
    let labels = obj
        .labelled
        .then(|| BTreeMap::from([(LOCK_LABEL.to_string(), LOCK.to_string())]));
    Lease {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(NS.into()),
            uid: Some(format!("{name}-{}", obj.made)),
            resource_version: Some(obj.rv.to_string()),
            creation_timestamp: Some(Time(Timestamp::UNIX_EPOCH)),
            labels,
            annotations: Some(annotations),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Pod".into(),
                name: pod.clone(),
                uid,
                ..Default::default()
            }]),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(pod),
            lease_duration_seconds: Some(obj.lease).filter(|l| *l > 0),
            renew_time: Some(MicroTime(
                Timestamp::from_second(i64::from(obj.renewals)).expect("a time"),
            )),
            ..Default::default()
        }),
    }
}

/// The lock as the API server serves it (with the controller's finalizer: the model's
/// locks are fenced from their start).
pub(super) fn lock_object(l: &LockObj) -> DistributedLock {
    let mut lock = DistributedLock::new(LOCK, l.spec.clone());
    lock.metadata.namespace = Some(NS.into());
    lock.metadata.uid = Some(format!("lock-{}", l.uid));
    lock.metadata.resource_version = Some(l.rv.to_string());
    let created = Timestamp::from_microsecond(epoch_floor(l.uid)).expect("a time");
    lock.metadata.creation_timestamp = Some(Time(created));
    lock.metadata.finalizers = Some(vec![crate::controller::finalizer::LOCK_FINALIZER.into()]);
    lock.metadata.deletion_timestamp = l.deleting.then_some(Time(wall()));
    lock.status = Some(l.status.clone());
    lock
}

/// Pod `i`'s last state, as its watch shows it going: every container terminated
/// (the kubelet stopped it and said so).
pub(super) fn stopped_pod(i: usize) -> Pod {
    let (name, uid) = pod(i);
    let terminated = ContainerStatus {
        name: "app".into(),
        state: Some(ContainerState {
            terminated: Some(ContainerStateTerminated::default()),
            ..Default::default()
        }),
        ..Default::default()
    };
    Pod {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(NS.into()),
            uid: Some(uid),
            ..Default::default()
        },
        spec: None,
        status: Some(PodStatus {
            phase: Some("Succeeded".into()),
            container_statuses: Some(vec![terminated]),
            ..Default::default()
        }),
    }
}
