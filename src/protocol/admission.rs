//! What the optional admission webhook lets through (served by the controller, see
//! `controller::admission`): defence in depth for the claim protocol, which stays safe
//! without it ([`super::record`]: a client acts only on a grant whose record matches what
//! it wrote). Pure: the request's operation, user and objects in, a verdict out.
//!
//! - **A claim's identity is fixed at creation.** Its lock label, pod
//!   (`spec.holderIdentity`), pod UID, release hash, wait hash, wait lease and
//!   requested-at time and its `spec.leaseDurationSeconds` never change (lowered, its
//!   process would be judged by less than it acts on; raised, a revoked holder's slot
//!   held back that long); a release mark, once set, stays as it is. A Lease becomes a claim only when it is
//!   created as one (adding the lock label to another application's Lease would have
//!   the controller's sweeper delete it once marked released).
//! - **A claim is well-formed when created**: the checks the controller would otherwise
//!   report in an `InvalidClaim` event ([`super::claim::validate_claim`]: its hashes in
//!   their one format among them), a positive lease (the controller would refuse it,
//!   `LeaseMissing`), under a name its lock's clients make
//!   ([`super::claim::is_claim_name`]: nobody squats another application's future
//!   Lease), without the fencing-token stamp of earlier controllers.
//! - **Only its owner releases a claim**: a release mark (or the released label) added
//!   must open the claim's release hash ([`super::release::judge`]); the ownerReference to
//!   its Pod changes only by the garbage collector ([`GARBAGE_COLLECTORS`]), and the
//!   fencing-token stamp is never added or changed.
//! - **A claim stays small** ([`MAX_CLAIM_BYTES`]): no write makes one larger than that.
//!   A review carries the old and the new object, JSON-escaped by the API server (a `<`
//!   takes six bytes): a claim padded near the API server's largest object would make
//!   every later review of it too large for the webhook to read, and with
//!   `failurePolicy: Ignore` its next change go through unjudged.
//! - **Lock clients touch claims only.** A request by one of the client service
//!   accounts ([`Policy::client_accounts`], in any namespace) may create, patch or
//!   delete only Leases that are claims, so the client Role's `create/patch` on Leases
//!   no longer reaches other applications' leader-election Leases.

use std::fmt;

use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;

use super::claim::{BadClaim, is_claim_name, validate_claim};
use super::release::{self, Mark};
use super::{
    FENCING_TOKEN_ANNOTATION, LOCK_LABEL, POD_UID_ANNOTATION, RELEASE_HASH_ANNOTATION, RELEASED_ANNOTATION,
    RELEASED_LABEL, REQUESTED_AT_ANNOTATION, WAIT_HASH_ANNOTATION, WAIT_LEASE_ANNOTATION,
};

/// The most bytes (as JSON) a write may make a claim: a claim its client writes,
/// with the controller's annotations and the API server's managed fields, takes a few
/// KiB; reviews of one this large stay far below what the webhook reads (its old and
/// new object, each escaped to at most six times its size).
pub const MAX_CLAIM_BYTES: usize = 64 * 1024;

/// The path the webhook is served on.
pub const ADMISSION_PATH: &str = "/v1/admit-lease";

/// The service account lock clients run as by default (`examples/rbac.yaml`, the
/// chart's `clientRbac`).
pub const CLIENT_ACCOUNT: &str = "leasehold-client";

/// The annotations that name a claim's owner and its proofs: fixed at creation.
const FIXED_ANNOTATIONS: [&str; 5] = [
    POD_UID_ANNOTATION,
    RELEASE_HASH_ANNOTATION,
    WAIT_HASH_ANNOTATION,
    WAIT_LEASE_ANNOTATION,
    REQUESTED_AT_ANNOTATION,
];

/// The users the garbage collector writes as (kube-controller-manager with and without
/// `--use-service-account-credentials`): they may drop a claim's ownerReference to its
/// Pod (orphaning), which nobody else may change.
pub const GARBAGE_COLLECTORS: [&str; 2] = [
    "system:serviceaccount:kube-system:generic-garbage-collector",
    "system:kube-controller-manager",
];

/// What a request does to a Lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    /// Creates it.
    Create,
    /// Changes it (a patch or a replace).
    Update,
    /// Deletes it.
    Delete,
}

/// Whom the rules confine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    /// Names of the service accounts lock clients run as, in any namespace: their
    /// requests may touch claims only.
    pub client_accounts: Vec<String>,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            client_accounts: vec![CLIENT_ACCOUNT.into()],
        }
    }
}

impl Policy {
    /// Whether `user` (a request's `userInfo.username`) is one of the client accounts.
    pub fn is_client(&self, user: &str) -> bool {
        let account = user
            .strip_prefix("system:serviceaccount:")
            .and_then(|r| r.split_once(':'));
        account.is_some_and(|(_, name)| self.client_accounts.iter().any(|a| a == name))
    }
}

/// Why a request is refused; its text is what the requester reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// A client account wrote a Lease that is not a claim.
    NotAClaim,
    /// The lock label was added to a Lease created without it.
    BecomesClaim,
    /// A field fixed at creation changed.
    Changed(String),
    /// The claim's lease was changed (or removed).
    LeaseChanged {
        /// The lease before.
        from: i32,
        /// The lease asked for (`None`: removed).
        to: Option<i32>,
    },
    /// A claim is created malformed.
    Malformed(BadClaim),
    /// A claim is created under a name its lock's clients never make (`<lock>-<12 hex
    /// digits>`): it could squat the name of another application's future Lease.
    BadName(String),
    /// A release mark (or the released label) that does not open the claim's release
    /// hash: anyone's but its owner's.
    ForgedMark,
    /// The fencing-token stamp of earlier controllers, which only they wrote.
    Stamped,
    /// A claim is created stating no positive lease.
    NoLease,
    /// A write would leave a claim larger than [`MAX_CLAIM_BYTES`].
    TooLarge(usize),
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::NotAClaim => write!(
                f,
                "leasehold: lock clients may write only claim Leases (labelled {LOCK_LABEL})"
            ),
            Refusal::BecomesClaim => write!(
                f,
                "leasehold: a Lease becomes a claim only when created as one: {LOCK_LABEL} cannot be added"
            ),
            Refusal::Changed(field) => write!(f, "leasehold: a claim's {field} is fixed at creation"),
            Refusal::LeaseChanged { from, to } => match to {
                Some(to) => write!(
                    f,
                    "leasehold: a claim's spec.leaseDurationSeconds is fixed at creation ({from} to {to})"
                ),
                None => write!(f, "leasehold: a claim's spec.leaseDurationSeconds may not be removed"),
            },
            Refusal::Malformed(bad) => write!(f, "leasehold: {}", bad.message()),
            Refusal::BadName(name) => write!(
                f,
                "leasehold: claim name {name:?} is not <lock>-<12 hex digits>, as clients name their claims"
            ),
            Refusal::ForgedMark => write!(
                f,
                "leasehold: a release mark ({RELEASED_ANNOTATION}, and the label {RELEASED_LABEL} with it) must open the claim's {RELEASE_HASH_ANNOTATION}: only its owner releases it"
            ),
            Refusal::Stamped => write!(
                f,
                "leasehold: {FENCING_TOKEN_ANNOTATION} is written by controllers only, never added or changed"
            ),
            Refusal::NoLease => write!(f, "leasehold: a claim states a positive spec.leaseDurationSeconds"),
            Refusal::TooLarge(bytes) => write!(
                f,
                "leasehold: a claim takes at most {MAX_CLAIM_BYTES} bytes as JSON (this write makes it {bytes}), \
                 so that its admission reviews stay readable"
            ),
        }
    }
}

/// Judge a request by `user` that does `op` to a Lease, `old` as stored before (update,
/// delete) and `new` as it would be stored (create, update).
pub fn judge(
    policy: &Policy,
    op: Operation,
    user: &str,
    old: Option<&Lease>,
    new: Option<&Lease>,
) -> Result<(), Refusal> {
    let was_claim = old.is_some_and(is_claim);
    let is_claim_now = new.is_some_and(is_claim);
    if policy.is_client(user) && !was_claim && !is_claim_now {
        return Err(Refusal::NotAClaim);
    }
    if let Some(new) = new.filter(|_| was_claim || is_claim_now) {
        too_large(new)?;
    }
    match (op, old, new) {
        (Operation::Create, _, Some(new)) if is_claim_now => created(new),
        (Operation::Update, Some(old), Some(new)) if was_claim => unchanged(user, old, new),
        (Operation::Update, Some(_), Some(_)) if is_claim_now => Err(Refusal::BecomesClaim),
        _ => Ok(()),
    }
}

/// Refused if `new` is larger than [`MAX_CLAIM_BYTES`] (a claim padded before this
/// rule existed can no longer be written: renewals fail, and its client claims anew).
fn too_large(new: &Lease) -> Result<(), Refusal> {
    let size = serde_json::to_vec(new).map_or(usize::MAX, |v| v.len());
    if size > MAX_CLAIM_BYTES {
        return Err(Refusal::TooLarge(size));
    }
    Ok(())
}

/// Whether a Lease is a claim: it carries the lock label (any value: an emptied label
/// is a change the rules judge).
fn is_claim(lease: &Lease) -> bool {
    lease.labels().contains_key(LOCK_LABEL)
}

/// Whether a claim is created as its lock's clients create one.
fn created(new: &Lease) -> Result<(), Refusal> {
    validate_claim(new).map_err(Refusal::Malformed)?;
    let (name, lock) = (
        new.name_any(),
        new.labels().get(LOCK_LABEL).cloned().unwrap_or_default(),
    );
    if !is_claim_name(&name, &lock) {
        return Err(Refusal::BadName(name));
    }
    if new.annotations().contains_key(FENCING_TOKEN_ANNOTATION) {
        return Err(Refusal::Stamped);
    }
    if new
        .spec
        .as_ref()
        .and_then(|s| s.lease_duration_seconds)
        .is_none_or(|l| l <= 0)
    {
        return Err(Refusal::NoLease);
    }
    marked_by_owner(None, new)
}

/// Whether a release mark or label that `new` adds to `old` opens the claim's hash (a
/// claim made without one is released with `"true"`).
fn marked_by_owner(old: Option<&Lease>, new: &Lease) -> Result<(), Refusal> {
    let had = |l: &Lease, label: bool| match label {
        true => l.labels().contains_key(RELEASED_LABEL),
        false => l.annotations().contains_key(RELEASED_ANNOTATION),
    };
    let adds = |label| had(new, label) && !old.is_some_and(|o| had(o, label));
    let valid = release::judge(new, release::claim_hash(new).as_deref()) == Mark::Valid;
    if (adds(false) || adds(true)) && !valid {
        return Err(Refusal::ForgedMark);
    }
    Ok(())
}

/// The Pods a claim names as its owners (name and UID).
fn owner_pods(lease: &Lease) -> Vec<(&str, &str)> {
    let pods = lease.owner_references().iter().filter(|o| o.kind == "Pod");
    pods.map(|o| (o.name.as_str(), o.uid.as_str())).collect()
}

/// Whether an update by `user` keeps what is fixed about the claim `old`.
fn unchanged(user: &str, old: &Lease, new: &Lease) -> Result<(), Refusal> {
    let changed = |field: &str| Err(Refusal::Changed(field.to_string()));
    if old.labels().get(LOCK_LABEL) != new.labels().get(LOCK_LABEL) {
        return changed(&format!("label {LOCK_LABEL}"));
    }
    let holder = |l: &Lease| l.spec.as_ref().and_then(|s| s.holder_identity.clone());
    if holder(old) != holder(new) {
        return changed("spec.holderIdentity");
    }
    for key in FIXED_ANNOTATIONS {
        if old.annotations().get(key) != new.annotations().get(key) {
            return changed(&format!("annotation {key}"));
        }
    }
    if owner_pods(old) != owner_pods(new) && !GARBAGE_COLLECTORS.contains(&user) {
        return changed("ownerReference to its Pod");
    }
    let stamp = |l: &Lease| l.annotations().get(FENCING_TOKEN_ANNOTATION).cloned();
    if stamp(new).is_some() && stamp(new) != stamp(old) {
        return Err(Refusal::Stamped);
    }
    marked_by_owner(Some(old), new)?;
    if let Some(mark) = old.annotations().get(RELEASED_ANNOTATION)
        && new.annotations().get(RELEASED_ANNOTATION) != Some(mark)
    {
        return changed(&format!("annotation {RELEASED_ANNOTATION}, once set,"));
    }
    if let Some(mark) = old.labels().get(RELEASED_LABEL)
        && new.labels().get(RELEASED_LABEL) != Some(mark)
    {
        return changed(&format!("label {RELEASED_LABEL}, once set,"));
    }
    let lease = |l: &Lease| l.spec.as_ref().and_then(|s| s.lease_duration_seconds);
    match (lease(old), lease(new)) {
        (Some(from), to) if to != Some(from) => Err(Refusal::LeaseChanged { from, to }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::super::claim::{PodIdentity, claim_lease_with, claim_name, release_patch_with, renew_patch};
    use super::super::release::Secret;
    use super::*;

    const CLIENT: &str = "system:serviceaccount:apps:leasehold-client";
    const ADMIN: &str = "kubernetes-admin";

    /// A claim as the client makes it, and its release secret.
    fn claim_and_secret() -> (Lease, Secret) {
        let pod = PodIdentity {
            name: "p".into(),
            namespace: "apps".into(),
            uid: "u-1".into(),
        };
        let secret = Secret::generate();
        (claim_lease_with(&claim_name("l"), "l", &pod, 15, Some(&secret)), secret)
    }

    fn claim() -> Lease {
        claim_and_secret().0
    }

    fn leader_lease() -> Lease {
        let mut lease = Lease::default();
        lease.metadata.name = Some("app-leader".into());
        lease.spec = Some(Default::default());
        lease
    }

    /// `lease` after a JSON merge patch, as the API server would store it.
    fn patched(lease: &Lease, patch: serde_json::Value) -> Lease {
        let mut doc = serde_json::to_value(lease).unwrap();
        json_patch::merge(&mut doc, &patch);
        serde_json::from_value(doc).unwrap()
    }

    fn update(user: &str, old: &Lease, patch: serde_json::Value) -> Result<(), Refusal> {
        let new = patched(old, patch);
        judge(&Policy::default(), Operation::Update, user, Some(old), Some(&new))
    }

    #[test]
    fn the_client_s_own_writes_pass_renewal_and_release_alike() {
        let (c, secret) = claim_and_secret();
        let policy = Policy::default();
        assert_eq!(judge(&policy, Operation::Create, CLIENT, None, Some(&c)), Ok(()));
        assert_eq!(update(CLIENT, &c, renew_patch(Some("uid-1"))), Ok(()));
        let released = patched(&c, release_patch_with("l", &secret));
        assert_eq!(update(CLIENT, &c, release_patch_with("l", &secret)), Ok(()));
        assert_eq!(
            update(CLIENT, &released, release_patch_with("l", &secret)),
            Ok(()),
            "a release retried"
        );
        assert_eq!(judge(&policy, Operation::Delete, CLIENT, Some(&released), None), Ok(()));
    }

    /// A padded claim's every later review would be too large for the webhook to read
    /// (and let through unjudged under `failurePolicy: Ignore`): no write may pad one.
    #[test]
    fn no_write_makes_a_claim_larger_than_its_reviews_can_carry() {
        let c = claim();
        let owner = c.owner_references()[0].clone();
        let pad = |n: usize| {
            let other = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "name": "<".repeat(n), "uid": "x"});
            serde_json::json!({"metadata": {"ownerReferences": [owner, other]}})
        };
        assert_eq!(update(ADMIN, &c, pad(1000)), Ok(()), "a foreign owner of a sane size");
        for user in [CLIENT, ADMIN] {
            let refused = update(user, &c, pad(MAX_CLAIM_BYTES));
            assert!(
                matches!(refused, Err(Refusal::TooLarge(n)) if n > MAX_CLAIM_BYTES),
                "{refused:?}"
            );
            let padded = serde_json::json!({"metadata": {"annotations": {"x": "<".repeat(MAX_CLAIM_BYTES)}}});
            assert!(matches!(update(user, &c, padded), Err(Refusal::TooLarge(_))));
        }
        let mut big = claim();
        big.annotations_mut().insert("x".into(), "y".repeat(MAX_CLAIM_BYTES));
        let created = judge(&Policy::default(), Operation::Create, CLIENT, None, Some(&big));
        assert!(matches!(created, Err(Refusal::TooLarge(_))), "{created:?}");
        // One padded before the rule is written no more (its renewals fail).
        let renewed = update(CLIENT, &big, renew_patch(Some("uid-1")));
        assert!(matches!(renewed, Err(Refusal::TooLarge(_))), "{renewed:?}");
        // Not a claim: not this rule's (nor the webhook's) business.
        let mut other = leader_lease();
        other.annotations_mut().insert("x".into(), "y".repeat(MAX_CLAIM_BYTES));
        assert_eq!(
            judge(&Policy::default(), Operation::Create, ADMIN, None, Some(&other)),
            Ok(())
        );
    }

    #[test]
    fn each_fixed_field_of_a_claim_is_refused_by_name_whoever_asks() {
        let c = claim();
        for user in [CLIENT, ADMIN] {
            for key in FIXED_ANNOTATIONS {
                for value in [serde_json::Value::Null, "forged".into()] {
                    let patch = serde_json::json!({"metadata": {"annotations": {key: value}}});
                    assert_eq!(
                        update(user, &c, patch),
                        Err(Refusal::Changed(format!("annotation {key}"))),
                        "{user} {key}"
                    );
                }
            }
            let unlabel = serde_json::json!({"metadata": {"labels": {LOCK_LABEL: null}}});
            assert_eq!(
                update(user, &c, unlabel),
                Err(Refusal::Changed(format!("label {LOCK_LABEL}")))
            );
            let relabel = serde_json::json!({"metadata": {"labels": {LOCK_LABEL: "other"}}});
            assert!(update(user, &c, relabel).is_err());
            let pod = serde_json::json!({"spec": {"holderIdentity": "neighbour"}});
            assert_eq!(
                update(user, &c, pod),
                Err(Refusal::Changed("spec.holderIdentity".into()))
            );
            let lower = serde_json::json!({"spec": {"leaseDurationSeconds": 1}});
            assert_eq!(
                update(user, &c, lower),
                Err(Refusal::LeaseChanged { from: 15, to: Some(1) })
            );
            let raise = serde_json::json!({"spec": {"leaseDurationSeconds": 3600}});
            assert_eq!(
                update(user, &c, raise),
                Err(Refusal::LeaseChanged {
                    from: 15,
                    to: Some(3600)
                })
            );
            let remove = serde_json::json!({"spec": {"leaseDurationSeconds": null}});
            assert_eq!(
                update(user, &c, remove),
                Err(Refusal::LeaseChanged { from: 15, to: None })
            );
        }
    }

    #[test]
    fn only_the_owner_s_secret_marks_a_claim_released() {
        let (c, secret) = claim_and_secret();
        assert_eq!(
            update(CLIENT, &c, release_patch_with("l", &Secret::generate())),
            Err(Refusal::ForgedMark)
        );
        let plain = serde_json::json!({"metadata": {"annotations": {RELEASED_ANNOTATION: "true"}}});
        assert_eq!(update(ADMIN, &c, plain), Err(Refusal::ForgedMark));
        let label = serde_json::json!({"metadata": {"labels": {RELEASED_LABEL: "true"}}});
        assert_eq!(
            update(CLIENT, &c, label),
            Err(Refusal::ForgedMark),
            "the sweeper would delete it"
        );
        assert_eq!(update(CLIENT, &c, release_patch_with("l", &secret)), Ok(()));
        // A claim made without a hash (an older client) is released with "true".
        let mut old = c.clone();
        old.metadata
            .annotations
            .as_mut()
            .unwrap()
            .remove(RELEASE_HASH_ANNOTATION);
        let plain = serde_json::json!({"metadata": {"annotations": {RELEASED_ANNOTATION: "true"}}});
        assert_eq!(update(CLIENT, &old, plain), Ok(()));
    }

    #[test]
    fn a_claim_s_pod_reference_and_stamp_stay_as_made_but_the_garbage_collector_may_orphan_it() {
        let c = claim();
        let orphan = serde_json::json!({"metadata": {"ownerReferences": []}});
        let repoint = serde_json::json!({"metadata": {"ownerReferences": [
            {"apiVersion": "v1", "kind": "Pod", "name": "x", "uid": "00000000-0000-0000-0000-000000000000"}]}});
        assert_eq!(
            update(CLIENT, &c, repoint),
            Err(Refusal::Changed("ownerReference to its Pod".into()))
        );
        assert!(update(ADMIN, &c, orphan.clone()).is_err());
        assert_eq!(update(GARBAGE_COLLECTORS[0], &c, orphan), Ok(()));
        let stamp = serde_json::json!({"metadata": {"annotations": {FENCING_TOKEN_ANNOTATION: "1"}}});
        assert_eq!(update(CLIENT, &c, stamp.clone()), Err(Refusal::Stamped));
        let stamped = patched(&c, stamp);
        let unstamp = serde_json::json!({"metadata": {"annotations": {FENCING_TOKEN_ANNOTATION: null}}});
        assert_eq!(update(CLIENT, &stamped, unstamp), Ok(()), "a stamp may go");
        let policy = Policy::default();
        assert_eq!(
            judge(&policy, Operation::Create, CLIENT, None, Some(&stamped)),
            Err(Refusal::Stamped)
        );
    }

    #[test]
    fn a_claim_is_created_only_under_a_name_its_lock_s_clients_make() {
        let mut squat = claim();
        squat.metadata.name = Some("app-leader".into());
        let refused = judge(&Policy::default(), Operation::Create, CLIENT, None, Some(&squat));
        assert_eq!(refused, Err(Refusal::BadName("app-leader".into())));
    }

    #[test]
    fn a_release_mark_once_set_stays() {
        let (c, secret) = claim_and_secret();
        let released = patched(&c, release_patch_with("l", &secret));
        let forged = serde_json::json!({"metadata": {"annotations": {RELEASED_ANNOTATION: "other"}}});
        assert!(update(CLIENT, &released, forged).is_err());
        let unmarked = serde_json::json!({"metadata": {"labels": {RELEASED_LABEL: null}}});
        assert!(update(ADMIN, &released, unmarked).is_err());
    }

    #[test]
    fn a_client_account_touches_no_lease_but_claims_and_others_touch_theirs_freely() {
        let app = leader_lease();
        let depose = serde_json::json!({"spec": {"holderIdentity": "neighbour"}});
        let policy = Policy::default();
        assert_eq!(update(CLIENT, &app, depose.clone()), Err(Refusal::NotAClaim));
        assert_eq!(
            judge(&policy, Operation::Create, CLIENT, None, Some(&app)),
            Err(Refusal::NotAClaim)
        );
        assert_eq!(
            judge(&policy, Operation::Delete, CLIENT, Some(&app), None),
            Err(Refusal::NotAClaim)
        );
        assert_eq!(update("system:serviceaccount:apps:app", &app, depose), Ok(()));
        let other = Policy {
            client_accounts: vec!["locks".into()],
        };
        assert!(other.is_client("system:serviceaccount:x:locks"));
        assert!(!other.is_client("system:serviceaccount:x:leasehold-client"));
        assert!(!other.is_client("locks"));
    }

    #[test]
    fn no_one_turns_a_lease_into_a_claim_after_creation() {
        let app = leader_lease();
        let label = serde_json::json!({"metadata": {"labels": {LOCK_LABEL: "l", RELEASED_LABEL: "true"}}});
        assert_eq!(update(ADMIN, &app, label.clone()), Err(Refusal::BecomesClaim));
        assert_eq!(update(CLIENT, &app, label), Err(Refusal::BecomesClaim));
    }

    #[test]
    fn a_malformed_claim_is_refused_at_creation_with_the_controller_s_reason() {
        let mut c = claim();
        c.metadata.owner_references = None;
        let refused = judge(&Policy::default(), Operation::Create, CLIENT, None, Some(&c));
        assert_eq!(refused, Err(Refusal::Malformed(BadClaim::NoPodOwner)));
        assert!(refused.unwrap_err().to_string().contains("ownerReference"));
    }

    proptest! {
        /// Any merge patch of the fields a neighbour can reach is let through exactly when
        /// it leaves a claim's identity and its lease as created.
        #[test]
        fn a_patched_claim_passes_only_if_what_is_fixed_is_kept(
            annotation in proptest::option::of((0..FIXED_ANNOTATIONS.len(), proptest::option::of("[a-z]{1,3}"))),
            lease in proptest::option::of(proptest::option::of(-2..40i32)),
            holder in proptest::option::of(proptest::option::of("[a-z]{1,2}")),
            renew in any::<bool>(),
        ) {
            let c = claim();
            let mut patch = serde_json::json!({});
            let mut keeps = true;
            if let Some((i, value)) = &annotation {
                let key = FIXED_ANNOTATIONS[*i];
                keeps &= c.annotations().get(key) == value.as_ref();
                patch["metadata"]["annotations"] = serde_json::json!({key: value});
            }
            if let Some(l) = lease {
                keeps &= l == Some(15);
                patch["spec"]["leaseDurationSeconds"] = serde_json::json!(l);
            }
            if let Some(h) = &holder {
                keeps &= h.as_deref() == Some("p");
                patch["spec"]["holderIdentity"] = serde_json::json!(h);
            }
            if renew {
                patch["spec"]["renewTime"] = serde_json::json!("2026-01-01T00:00:00.000000Z");
            }
            prop_assert_eq!(update(CLIENT, &c, patch.clone()).is_ok(), keeps, "{}", patch);
        }
    }
}
