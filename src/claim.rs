//! The claim protocol's one shared piece: how a claim Lease looks.
//!
//! A process asks for a lock by creating a `coordination.k8s.io/v1` Lease in the
//! lock's namespace: a unique name, label `leasehold.dev/lock=<lock>`,
//! `spec.holderIdentity` = its pod's name, `spec.leaseDurationSeconds` = the lock's,
//! annotation `leasehold.dev/pod-uid`, and an ownerReference to its Pod (so garbage
//! collection removes the claims of a deleted pod). It renews `spec.renewTime` about
//! every third of the lease duration, and releases by setting annotation
//! `leasehold.dev/released: "true"`.

use std::collections::BTreeMap;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use k8s_openapi::jiff::Timestamp;

use crate::api::{LOCK_LABEL, POD_UID_ANNOTATION, RELEASED_ANNOTATION};

/// The identity of the process making a claim: its pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodIdentity {
    /// The pod's name (`POD_NAME` from the downward API).
    pub name: String,
    /// The pod's namespace (`POD_NAMESPACE`).
    pub namespace: String,
    /// The pod's UID (`POD_UID`).
    pub uid: String,
}

/// A fresh, unique claim name for a lock: `<lock>-<random>`, within 63 characters.
pub fn claim_name(lock: &str) -> String {
    let suffix = format!("{:012x}", rand::random::<u64>() & 0xffff_ffff_ffff);
    let head: String = lock.chars().take(63 - 1 - suffix.len()).collect();
    format!("{}-{suffix}", head.trim_end_matches(['-', '.']))
}

/// The claim Lease a process creates to ask for `lock`.
pub fn claim_lease(name: &str, lock: &str, pod: &PodIdentity, lease_duration_seconds: i32) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(pod.namespace.clone()),
            labels: Some(BTreeMap::from([(LOCK_LABEL.into(), lock.into())])),
            annotations: Some(BTreeMap::from([(POD_UID_ANNOTATION.into(), pod.uid.clone())])),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Pod".into(),
                name: pod.name.clone(),
                uid: pod.uid.clone(),
                ..Default::default()
            }]),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(pod.name.clone()),
            lease_duration_seconds: Some(lease_duration_seconds),
            renew_time: Some(MicroTime(Timestamp::now())),
            ..Default::default()
        }),
    }
}

/// The merge patch that renews a claim.
pub fn renew_patch() -> serde_json::Value {
    serde_json::json!({ "spec": { "renewTime": MicroTime(Timestamp::now()) } })
}

/// The merge patch that releases a claim (or withdraws it while waiting).
pub fn release_patch() -> serde_json::Value {
    serde_json::json!({ "metadata": { "annotations": { RELEASED_ANNOTATION: "true" } } })
}
