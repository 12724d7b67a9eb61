//! The claim Lease: how a client writes it, and how the controller reads and judges it.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use super::release::Secret;
use super::timing::{MAX_LEASE_SECONDS, wait_lease};
use super::{
    FENCING_TOKEN_ANNOTATION, GRANT_WATCH_ANNOTATION, HANDOVER_WATCH_ANNOTATION, LOCK_LABEL, POD_UID_ANNOTATION,
    RELEASE_HASH_ANNOTATION, RELEASED_ANNOTATION, RELEASED_LABEL, REQUESTED_AT_ANNOTATION, WAIT_HASH_ANNOTATION,
    WAIT_LEASE_ANNOTATION,
};

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

// === writing ===

/// A fresh, unique claim name for a lock: `<lock>-<random>`, within 63 characters.
pub fn claim_name(lock: &str) -> String {
    let suffix = format!("{:012x}", rand::random::<u64>() & 0xffff_ffff_ffff);
    let head: String = lock.chars().take(63 - 1 - suffix.len()).collect();
    format!("{}-{suffix}", head.trim_end_matches(['-', '.']))
}

/// Whether `name` is one [`claim_name`] makes for `lock`: `<head>-<12 hex digits>`, the
/// head a start of the lock's name.
pub fn is_claim_name(name: &str, lock: &str) -> bool {
    let Some((head, suffix)) = name.rsplit_once('-') else {
        return false;
    };
    let hex = |b: u8| b.is_ascii_digit() || (b'a'..=b'f').contains(&b);
    !head.is_empty() && lock.starts_with(head) && suffix.len() == 12 && suffix.bytes().all(hex)
}

/// The claim Lease a process creates to ask for `lock`, without a release proof (it
/// then releases with `"true"`): see [`claim_lease_with`].
pub fn claim_lease(name: &str, lock: &str, pod: &PodIdentity, lease_duration_seconds: i32) -> Lease {
    claim_lease_with(name, lock, pod, lease_duration_seconds, None)
}

/// The claim Lease a process creates to ask for `lock`; with `secret`, only a release
/// mark carrying that secret releases it.
pub fn claim_lease_with(
    name: &str,
    lock: &str,
    pod: &PodIdentity,
    lease_duration_seconds: i32,
    secret: Option<&Secret>,
) -> Lease {
    let waiting = wait_lease(Duration::from_secs(lease_duration_seconds.max(1) as u64));
    let mut annotations = BTreeMap::from([
        (POD_UID_ANNOTATION.into(), pod.uid.clone()),
        (REQUESTED_AT_ANNOTATION.into(), Timestamp::now().to_string()),
        (WAIT_LEASE_ANNOTATION.into(), waiting.as_secs().to_string()),
    ]);
    if let Some(secret) = secret {
        annotations.insert(RELEASE_HASH_ANNOTATION.into(), secret.hash());
        annotations.insert(WAIT_HASH_ANNOTATION.into(), secret.wait_hash());
    }
    Lease {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(pod.namespace.clone()),
            labels: Some(BTreeMap::from([(LOCK_LABEL.into(), lock.into())])),
            annotations: Some(annotations),
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

/// The merge patch that renews a claim. With `uid` (the claim's, from its creation) it
/// renews only that object: a Lease re-created under the claim's name rejects it.
pub fn renew_patch(uid: Option<&str>) -> serde_json::Value {
    let mut patch = serde_json::json!({ "spec": { "renewTime": MicroTime(Timestamp::now()) } });
    if let Some(uid) = uid {
        patch["metadata"] = serde_json::json!({ "uid": uid });
    }
    patch
}

/// The merge patch that releases a claim made without a release proof.
pub fn release_patch() -> serde_json::Value {
    released_patch("true")
}

/// The merge patch that releases a claim for `lock` (or withdraws it while waiting) by
/// revealing its secret. It sets the claim's lock label too: a claim whose label someone
/// removed is out of the controller's view, and its slot would be held back rather
/// than freed by the release.
pub fn release_patch_with(lock: &str, secret: &Secret) -> serde_json::Value {
    let mut patch = released_patch(secret.reveal());
    patch["metadata"]["labels"][LOCK_LABEL] = lock.into();
    patch
}

fn released_patch(mark: &str) -> serde_json::Value {
    serde_json::json!({ "metadata": {
        "annotations": { RELEASED_ANNOTATION: mark },
        "labels": { RELEASED_LABEL: "true" },
    } })
}

// === reading ===

/// Why a claim Lease is malformed, for a Warning event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadClaim {
    /// No `spec.holderIdentity` naming the pod.
    NoHolder,
    /// No `leasehold.dev/pod-uid` annotation.
    NoPodUid,
    /// No ownerReference to its Pod with that name and UID.
    NoPodOwner,
    /// A release or wait hash that is not a hash ([`super::release::is_hash`]).
    MalformedHash,
}

impl BadClaim {
    /// A human explanation.
    pub fn message(self) -> &'static str {
        match self {
            Self::NoHolder => "claim has no spec.holderIdentity naming its pod",
            Self::NoPodUid => "claim has no leasehold.dev/pod-uid annotation",
            Self::NoPodOwner => "claim has no ownerReference to its Pod (kind Pod, matching name and uid)",
            Self::MalformedHash => {
                "claim's leasehold.dev/release-hash or leasehold.dev/wait-hash is not 64 lower-case hex digits"
            }
        }
    }
}

/// Check a claim's shape; return its (pod, pod UID).
pub fn validate_claim(lease: &Lease) -> Result<(String, String), BadClaim> {
    let pod = lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.clone())
        .filter(|p| !p.is_empty());
    let pod = pod.ok_or(BadClaim::NoHolder)?;
    let uid = lease
        .annotations()
        .get(POD_UID_ANNOTATION)
        .cloned()
        .filter(|u| !u.is_empty());
    let uid = uid.ok_or(BadClaim::NoPodUid)?;
    let owned = lease
        .owner_references()
        .iter()
        .any(|o| o.kind == "Pod" && o.name == pod && o.uid == uid);
    if !owned {
        return Err(BadClaim::NoPodOwner);
    }
    let hashes = [RELEASE_HASH_ANNOTATION, WAIT_HASH_ANNOTATION].map(|k| lease.annotations().get(k));
    if hashes.into_iter().flatten().any(|h| !super::release::is_hash(h)) {
        return Err(BadClaim::MalformedHash);
    }
    Ok((pod, uid))
}

// === what the controller keeps ===

/// Each annotation the controller reads, with the most bytes a valid value has: a
/// value longer than that is kept cut to one byte more (still invalid, or unequal to
/// anything valid), so a claim costs the controller's cache a bounded size whatever a
/// neighbour writes on it.
pub const READ_ANNOTATIONS: [(&str, usize); 9] = [
    (POD_UID_ANNOTATION, 128),
    (RELEASE_HASH_ANNOTATION, super::release::HASH_LEN),
    (WAIT_HASH_ANNOTATION, super::release::HASH_LEN),
    (RELEASED_ANNOTATION, super::release::HASH_LEN),
    (REQUESTED_AT_ANNOTATION, 64),
    (WAIT_LEASE_ANNOTATION, 16),
    (FENCING_TOKEN_ANNOTATION, 24),
    (GRANT_WATCH_ANNOTATION, 4),
    (HANDOVER_WATCH_ANNOTATION, 4),
];
/// The most bytes of a name the controller keeps (a Kubernetes name has at most 253).
pub const MAX_NAME_BYTES: usize = 253;
/// The most ownerReferences to Pods the controller keeps of a claim (its own has one).
pub const MAX_POD_OWNERS: usize = 4;

/// `text` cut to at most `bound + 1` bytes (on a character boundary).
fn bounded(text: &mut String, bound: usize) {
    if text.len() > bound + 1 {
        let mut end = bound + 1;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
}

/// Keep of a claim Lease only what the controller reads, each value within its bound
/// ([`READ_ANNOTATIONS`], [`MAX_NAME_BYTES`], [`MAX_POD_OWNERS`]): its identity and
/// times, the two labels, the annotations above, its Pod owners, and its holder,
/// lease and renewal time. The claim cache holds every labelled Lease of the cluster.
pub fn keep_what_is_read(lease: &mut Lease) {
    let m = std::mem::take(&mut lease.metadata);
    let labels = m.labels.map(|mut l| {
        l.retain(|k, _| k == LOCK_LABEL || k == RELEASED_LABEL);
        l
    });
    let annotations = m.annotations.map(|mut a| {
        a.retain(|k, _| READ_ANNOTATIONS.iter().any(|(key, _)| key == k));
        for (key, bound) in READ_ANNOTATIONS {
            if let Some(v) = a.get_mut(key) {
                bounded(v, bound);
            }
        }
        a
    });
    let owners = m.owner_references.map(|refs| {
        let pods = refs.into_iter().filter(|o| o.kind == "Pod").take(MAX_POD_OWNERS);
        pods.map(|mut o| {
            bounded(&mut o.name, MAX_NAME_BYTES);
            bounded(&mut o.uid, 128);
            OwnerReference {
                api_version: o.api_version,
                kind: o.kind,
                name: o.name,
                uid: o.uid,
                ..Default::default()
            }
        })
        .collect()
    });
    lease.metadata = ObjectMeta {
        name: m.name,
        namespace: m.namespace,
        uid: m.uid,
        resource_version: m.resource_version,
        creation_timestamp: m.creation_timestamp,
        deletion_timestamp: m.deletion_timestamp,
        labels,
        annotations,
        owner_references: owners,
        ..Default::default()
    };
    if let Some(spec) = lease.spec.take() {
        let mut holder = spec.holder_identity;
        if let Some(h) = holder.as_mut() {
            bounded(h, MAX_NAME_BYTES);
        }
        lease.spec = Some(LeaseSpec {
            holder_identity: holder,
            lease_duration_seconds: spec.lease_duration_seconds,
            renew_time: spec.renew_time,
            ..Default::default()
        });
    }
}

/// The hash of the owner's wait proof a claim carries, if any.
pub fn claim_wait_hash(lease: &Lease) -> Option<&str> {
    lease.annotations().get(WAIT_HASH_ANNOTATION).map(String::as_str)
}

/// The lock a claim asks for, by its label.
pub fn claim_lock(lease: &Lease) -> Option<&str> {
    lease
        .labels()
        .get(LOCK_LABEL)
        .map(String::as_str)
        .filter(|l| !l.is_empty())
}

/// The fencing token an earlier build of the controller stamped on the claim (see
/// [`FENCING_TOKEN_ANNOTATION`]).
pub fn stamped_token(lease: &Lease) -> Option<i64> {
    lease.annotations().get(FENCING_TOKEN_ANNOTATION)?.parse().ok()
}

/// Whether the claim carries a release mark (valid or not: see [`super::release`]).
pub fn has_release_mark(lease: &Lease) -> bool {
    lease.annotations().contains_key(RELEASED_ANNOTATION)
}

/// The claim's requested-at time, in microseconds since 1970 (0 when absent or
/// unreadable). Compared only among claims created within the same second of the API
/// server's clock: its whole value, not its sub-second part alone, which runs backwards
/// when the client's second turns within the server's.
pub fn requested_micros(lease: &Lease) -> i64 {
    let at = lease.annotations().get(REQUESTED_AT_ANNOTATION);
    let at = at.and_then(|t| t.parse::<Timestamp>().ok());
    at.map_or(0, |t| t.as_microsecond())
}

/// The lease the claim says its process lives by, in seconds: 0 when absent or
/// negative, and at most [`MAX_LEASE_SECONDS`] (the API's own maximum), so a claim
/// cannot keep a slot for longer than any lock could.
pub fn claim_lease_seconds(lease: &Lease) -> i32 {
    let secs = lease.spec.as_ref().and_then(|s| s.lease_duration_seconds).unwrap_or(0);
    secs.clamp(0, MAX_LEASE_SECONDS)
}

/// What is odd about the lease a claim states, if anything: a lease over the API's
/// maximum is capped ([`claim_lease_seconds`]). (One absent or not positive is no lease:
/// a claim not yet queued stating none is refused, `LeaseMissing`; a queued claim is
/// judged by the lease recorded for it, and a change after the record is reported as
/// tampering.)
pub fn lease_problem(lease: &Lease) -> Option<String> {
    match lease.spec.as_ref().and_then(|s| s.lease_duration_seconds) {
        Some(s) if s > MAX_LEASE_SECONDS => Some(format!(
            "claim's spec.leaseDurationSeconds {s} is capped at {MAX_LEASE_SECONDS}"
        )),
        _ => None,
    }
}

/// The lease the claim says it lives by while it waits ([`WAIT_LEASE_ANNOTATION`]),
/// capped like its own lease; `None` when absent or unreadable (a client from before
/// wait leases, renewing at its lease's pace).
pub fn claim_wait_lease(lease: &Lease) -> Option<Duration> {
    let secs: i64 = lease.annotations().get(WAIT_LEASE_ANNOTATION)?.parse().ok()?;
    Some(Duration::from_secs(secs.clamp(0, MAX_LEASE_SECONDS as i64) as u64))
}

/// [`claim_lease_seconds`] as a duration.
pub fn claim_lease_duration(lease: &Lease) -> Duration {
    Duration::from_secs(claim_lease_seconds(lease) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod() -> PodIdentity {
        PodIdentity {
            name: "p".into(),
            namespace: "ns".into(),
            uid: "u-1".into(),
        }
    }

    #[test]
    fn a_written_claim_reads_back_valid_and_unreleased() {
        let lease = claim_lease("l-1", "l", &pod(), 15);
        assert_eq!(validate_claim(&lease), Ok(("p".into(), "u-1".into())));
        assert_eq!(claim_lock(&lease), Some("l"));
        assert!(!has_release_mark(&lease));
        assert_eq!(claim_lease_duration(&lease), Duration::from_secs(15));
        assert_eq!(claim_wait_lease(&lease), Some(crate::protocol::timing::WAIT_LEASE));
    }

    #[test]
    fn a_stated_wait_lease_is_capped_and_a_garbled_one_ignored() {
        let mut lease = claim_lease("l-1", "l", &pod(), 15);
        let mut set = |v: &str| {
            let annotations = lease.metadata.annotations.get_or_insert_default();
            annotations.insert(WAIT_LEASE_ANNOTATION.into(), v.into());
            claim_wait_lease(&lease)
        };
        assert_eq!(set("999999"), Some(Duration::from_secs(MAX_LEASE_SECONDS as u64)));
        assert_eq!(set("-4"), Some(Duration::ZERO));
        assert_eq!(set("soon"), None);
    }

    #[test]
    fn every_made_claim_name_is_one_and_other_names_are_not() {
        for lock in [
            "l",
            "a-b.c",
            &"x".repeat(63),
            "ends-with-dash-",
            &format!("{}-y", "z".repeat(49)),
        ] {
            let name = claim_name(lock);
            assert!(is_claim_name(&name, lock), "{name} for {lock}");
            assert!(name.len() <= 63, "{name}");
        }
        assert!(!is_claim_name("app-leader", "app"));
        assert!(!is_claim_name("l-0123456789AB", "l"), "upper case");
        assert!(!is_claim_name("m-0123456789ab", "l"), "another lock's");
        assert!(!is_claim_name("-0123456789ab", "l"));
    }

    #[test]
    fn malformed_claims_name_what_is_missing() {
        let mut lease = claim_lease("l-1", "l", &pod(), 15);
        lease.metadata.owner_references = None;
        assert_eq!(validate_claim(&lease), Err(BadClaim::NoPodOwner));
        lease.metadata.annotations = None;
        assert_eq!(validate_claim(&lease), Err(BadClaim::NoPodUid));
        lease.spec.as_mut().unwrap().holder_identity = None;
        assert_eq!(validate_claim(&lease), Err(BadClaim::NoHolder));
    }

    #[test]
    fn the_release_patch_sets_the_mark_the_reader_judges_valid() {
        let secret = Secret::generate();
        let mut lease = claim_lease_with("l-1", "l", &pod(), 15, Some(&secret));
        let recorded = super::super::release::claim_hash(&lease);
        assert_eq!(recorded, Some(secret.hash()));
        let patch = release_patch_with("l", &secret);
        assert_eq!(
            patch["metadata"]["labels"][LOCK_LABEL], "l",
            "the label restored with the mark"
        );
        let value = patch["metadata"]["annotations"][RELEASED_ANNOTATION].as_str().unwrap();
        lease
            .metadata
            .annotations
            .get_or_insert_default()
            .insert(RELEASED_ANNOTATION.into(), value.into());
        assert!(has_release_mark(&lease));
        let judged = super::super::release::judge(&lease, recorded.as_deref());
        assert_eq!(judged, super::super::release::Mark::Valid);
    }

    #[test]
    fn a_claims_own_lease_is_capped_at_the_api_maximum() {
        let huge = claim_lease("l-1", "l", &pod(), i32::MAX);
        assert_eq!(claim_lease_seconds(&huge), MAX_LEASE_SECONDS);
        let negative = claim_lease("l-1", "l", &pod(), -5);
        assert_eq!(claim_lease_duration(&negative), Duration::ZERO);
    }

    #[test]
    fn the_requested_at_annotation_gives_the_sub_second_order() {
        let mut lease = claim_lease("l-1", "l", &pod(), 15);
        let set = |lease: &mut Lease, v: &str| {
            let annotations = lease.metadata.annotations.get_or_insert_default();
            annotations.insert(REQUESTED_AT_ANNOTATION.into(), v.into());
        };
        set(&mut lease, "2026-11-23T09:00:01.999000Z");
        let before = requested_micros(&lease);
        set(&mut lease, "2026-11-23T09:00:02.005000Z");
        let after = requested_micros(&lease);
        assert!(
            before < after,
            "a client second turning within one server second keeps the order"
        );
        set(&mut lease, "yesterday");
        assert_eq!(requested_micros(&lease), 0, "garbled: no order of its own");
    }

    #[test]
    fn the_cache_keeps_what_is_read_within_bounds_and_judges_it_alike() {
        let secret = Secret::generate();
        let mut lease = claim_lease_with("l-1", "l", &pod(), 15, Some(&secret));
        let made = lease.clone();
        keep_what_is_read(&mut lease);
        assert_eq!(lease, made, "a client's claim keeps everything");
        let huge = "x".repeat(250_000);
        let a = lease.annotations_mut();
        a.insert(RELEASE_HASH_ANNOTATION.into(), huge.clone());
        a.insert(RELEASED_ANNOTATION.into(), format!("{}{huge}", secret.reveal()));
        a.insert("padding".into(), huge.clone());
        lease.labels_mut().insert("padding".into(), "y".into());
        lease.spec.as_mut().unwrap().holder_identity = Some(huge.clone());
        lease.metadata.owner_references = Some(vec![
            OwnerReference {
                kind: "Pod".into(),
                name: huge.clone(),
                uid: huge,
                ..Default::default()
            };
            100
        ]);
        keep_what_is_read(&mut lease);
        let bytes = serde_json::to_string(&lease).unwrap().len();
        assert!(bytes < 4096, "{bytes} bytes kept");
        assert_eq!(
            validate_claim(&lease),
            Err(BadClaim::NoPodOwner),
            "the cut holder names no owner"
        );
        let mark = super::super::release::judge(&lease, Some(&secret.hash()));
        assert_eq!(
            mark,
            super::super::release::Mark::Forged,
            "a padded mark stays no valid one"
        );
        assert!(!lease.annotations().contains_key("padding"));
        assert_eq!(lease.labels().len(), 1);
    }

    #[test]
    fn a_hash_has_one_format() {
        let secret = Secret::generate();
        let mut lease = claim_lease_with("l-1", "l", &pod(), 15, Some(&secret));
        for bad in ["", "true", &"F".repeat(64), &"f".repeat(63), &"f".repeat(65)] {
            for key in [RELEASE_HASH_ANNOTATION, WAIT_HASH_ANNOTATION] {
                let mut l = lease.clone();
                l.annotations_mut().insert(key.into(), bad.to_string());
                assert_eq!(validate_claim(&l), Err(BadClaim::MalformedHash), "{key}: {bad:?}");
            }
        }
        lease.annotations_mut().remove(WAIT_HASH_ANNOTATION);
        assert!(validate_claim(&lease).is_ok(), "absent is no malformed hash");
    }

    #[test]
    fn claim_names_fit_in_63_characters() {
        let name = claim_name(&"x".repeat(253));
        assert!(name.len() <= 63, "{name}");
        assert!(claim_name("a").starts_with("a-"));
    }
}
