//! The claim protocol, owned in one place: what a claim looks like (written by the
//! client, read and judged by the controller), the patches both sides send, when a
//! lock's status grants a claim, and the timing rules that make the fenced handoff safe.
//!
//! Client ([`crate::client`]) and controller (`controller`) depend on this
//! module and never on each other's constants.
//!
//! ## A claim
//!
//! A process asks for a lock by creating a `coordination.k8s.io/v1` Lease in the
//! lock's namespace ([`claim::claim_lease`]): a unique name, label [`LOCK_LABEL`] =
//! the lock's name, `spec.holderIdentity` = its pod's name, `spec.leaseDurationSeconds`
//! = the lease it lives by, annotation [`POD_UID_ANNOTATION`] and an ownerReference to
//! its Pod (so garbage collection removes a deleted pod's claims), and annotation
//! [`WAIT_LEASE_ANNOTATION`]. While it waits it renews `spec.renewTime` every
//! [`timing::wait_renew_interval`] (at most once a minute); once granted, every
//! [`timing::renew_interval`]. It releases (or withdraws while
//! waiting) by setting annotation [`RELEASED_ANNOTATION`] to its release secret, whose
//! hash it wrote at creation ([`RELEASE_HASH_ANNOTATION`], see [`release`]), and label
//! [`RELEASED_LABEL`] in the same write. The controller
//! validates a claim with [`claim::validate_claim`] and grants it by listing it as an
//! unrevoked holder in the lock's status ([`granted_token`]). When a lock is deleted,
//! the controller revokes every grant and lets the lock go only once no holder's
//! process may still run (see `controller::finalizer`).
//!
//! ## The timing contract
//!
//! Let `L` be the lease the client lives by, `margin = safety_margin(L)`, and `sent`
//! the moment (client's monotonic clock) the last successful write of the claim was
//! *sent*. Let `seen` be the moment (controller's monotonic clock) the controller saw
//! that write, and `L_c = max(L_spec, L_claim)` the lease the controller judges by,
//! `L_claim` the lease the lock's status records for the claim (the one it states only
//! before the record: [`timing::judged_lease`]).
//!
//! * The client stops its work (`lost()`) by `sent + L − margin + h`
//!   ([`timing::client_stop_by`]), where `h` is how long an in-flight request may
//!   delay the deadline. The renewal task races every request against the deadline,
//!   so `h = 0` even when a black-holed connection makes a request hang until its
//!   timeout (a paused-time test in `client::k8s::lease` holds it to that). `leasehold run`
//!   then gives CMD `margin` between SIGTERM and SIGKILL of its whole process tree, so
//!   CMD is dead by `sent + L`.
//! * The controller frees the slot of an unrenewed claim no earlier than
//!   `seen + L_c + EXPIRY_GRACE` ([`timing::controller_expiry`]), and only after a
//!   fresh read of the claim shows no renewal its watch missed *and* it deleted the
//!   claim under that read's resourceVersion: a renewal written after the read makes
//!   the deletion fail, one sent later finds no claim. So every renewal a client sees
//!   acknowledged was seen by the controller before it expired the claim.
//! * A waiter is judged by its wait lease; a holder by its lease, counted from no
//!   earlier than when this controller wrote its grant, so a holder granted long after
//!   its last (slow, waiting) renewal has one lease to renew, and a silent one is found
//!   out no later than one lease (plus grace) after its grant.
//! * A granted client acts only while `now < client_stop_by(sent)` for its last
//!   acknowledged write, whenever that write was sent (before or after the grant: the
//!   controller saw it before any expiry, and counts from no earlier than that). A
//!   waiter renews slowly, so at its grant that deadline may have passed (or be less
//!   than `margin` ahead): it then renews first and acts once that renewal is
//!   acknowledged. A renewal names the claim's UID, and one answered with a
//!   `deletionTimestamp` counts as refused, so a claim the controller expired (deleted,
//!   or held back by someone's finalizer) or re-created under its name renews nothing. A revoked holder whose
//!   process may still run (forced release, force-deleted pod) keeps its slot until
//!   `max(revoked_seen, seen) + max(L_spec, L_holder) + EXPIRY_GRACE`
//!   ([`timing::hold_back_ends`]), `L_holder` being the lease recorded at its grant.
//!
//! Since `seen ≥ sent` (a write is seen after it is sent), `L ≤ L_c` (the client's
//! lease is written on its claim, capped at [`timing::MAX_LEASE_SECONDS`] like the
//! lock's, and it acts only on a record of at least that: [`record`]), `h = 0` and
//! `EXPIRY_GRACE > 0`:
//! `sent + L − margin + h + margin < seen + L_c + EXPIRY_GRACE`. The grace covers clock
//! *rate* differences between the two machines over one lease; no wall clocks are
//! compared. `timing`'s tests state this inequality with the real functions.

pub mod admission;
pub mod claim;
pub mod grant;
#[cfg(feature = "client")]
pub mod notice;
pub mod record;
pub mod release;
pub mod timing;
#[cfg(test)]
mod vectors;

use k8s_openapi::api::coordination::v1::Lease;

use crate::api::DistributedLockStatus;
use crate::mutant::{Mutant, on as mutant};

pub use claim::{BadClaim, PodIdentity};

/// The longest lock name claims can ask for: the name is a label value.
pub const MAX_LOCK_NAME: usize = 63;
/// Label on a claim Lease naming the DistributedLock it asks for.
pub const LOCK_LABEL: &str = "leasehold.dev/lock";
/// Annotation on a claim Lease carrying the UID of the pod that made it.
pub const POD_UID_ANNOTATION: &str = "leasehold.dev/pod-uid";
/// Annotation a client sets on its claim to release the lock (or withdraw): the
/// claim's release secret (see [`release`]), or `"true"` for a claim made without one.
pub const RELEASED_ANNOTATION: &str = "leasehold.dev/released";
/// Label a client sets on its claim with the release mark (value `"true"`), so the
/// controller can delete released claims in one request per namespace.
pub const RELEASED_LABEL: &str = "leasehold.dev/released";
/// Annotation a client sets on its claim at creation: the SHA-256 of its release secret.
pub const RELEASE_HASH_ANNOTATION: &str = "leasehold.dev/release-hash";
/// Annotation a client sets on its claim at creation: the SHA-256 of its wait proof
/// ([`release::Secret::wait_proof`]), which it shows when it waits for a direct grant
/// (see [`grant`]), so that nobody else can hold its waits at the controller.
pub const WAIT_HASH_ANNOTATION: &str = "leasehold.dev/wait-hash";
/// Annotation a client sets on its claim at creation: when it asked (RFC 3339, with
/// microseconds). It is used only to order claims created within
/// the same second of the API server's clock.
pub const REQUESTED_AT_ANNOTATION: &str = "leasehold.dev/requested-at";
/// Annotation a client sets on its claim at creation: the lease, in seconds, the claim
/// lives by *while it waits* ([`timing::wait_lease`]; it renews every third of it). Once
/// granted it lives by `spec.leaseDurationSeconds`. Absent: the claim's own lease.
pub const WAIT_LEASE_ANNOTATION: &str = "leasehold.dev/wait-lease-seconds";
/// Annotation a client sets on its claim at creation (`"true"`) when it watches its own
/// claim while designated, so that the controller writes a direct grant there
/// ([`DIRECT_GRANT_ANNOTATION`]) when it cannot tell it over HTTP. Absent: the
/// controller writes none (the client learns its grant from the status).
pub const GRANT_WATCH_ANNOTATION: &str = "leasehold.dev/grant-watch";
/// Annotation a client sets on its claim at creation (`"true"`) when, while designated
/// on a lock whose holder is expected to mark its claim (no release URL published, or
/// none the client expects an answer from), it also watches its predecessor's claim for
/// the release mark that hands the slot on ([`handover`]). Where that mark is what
/// grants it and the successor is not waiting over HTTP, the controller then writes no
/// grant on the claim (the client saw the same mark; one Lease write and its delivery
/// fewer on the handoff). Absent: the controller writes it as [`GRANT_WATCH_ANNOTATION`]
/// asks.
pub const HANDOVER_WATCH_ANNOTATION: &str = "leasehold.dev/handover-watch";
/// Annotation the controller writes on a designated successor's claim that asked for
/// it ([`GRANT_WATCH_ANNOTATION`]) when the successor was not told of its grant over
/// HTTP: `"<token> <signature>"`, the direct grant as signed ([`grant::Grant`]). Anyone
/// who may patch Leases can write it; a client trusts it only as it trusts a direct
/// grant over HTTP (see [`grant::Grant::told_by_annotation`]).
pub const DIRECT_GRANT_ANNOTATION: &str = "leasehold.dev/direct-grant";
/// Annotation earlier (unreleased) builds of the controller stamped on a holder's claim
/// when the lock was deleted. No controller writes it now and none trusts it: anyone
/// who may patch Leases could write it (a stamped claim once held a lock for an hour,
/// skipping the queue). The admission webhook refuses it on claims.
pub const FENCING_TOKEN_ANNOTATION: &str = "leasehold.dev/fencing-token";

/// The fencing token with which `status` grants `claim`: `Some` only while the claim
/// is listed as a holder whose grant has not been revoked.
pub fn granted_token(status: &DistributedLockStatus, claim: &str) -> Option<i64> {
    status
        .holders
        .iter()
        .find(|h| h.claim == claim && h.revoked.is_none())
        .map(|h| h.fencing_token)
}

/// Whether `status` still lets the holder of `claim`'s grant with `token` hold: it lists
/// the claim as an unrevoked holder with that token, or still designates it as the
/// successor with that token (granted directly, see [`grant`], and not yet written).
pub fn still_grants(status: &DistributedLockStatus, claim: &str, token: i64) -> bool {
    let designated = status.successor.as_ref();
    granted_token(status, claim) == Some(token)
        || designated.is_some_and(|s| s.claim == claim && s.fencing_token == token)
}

/// The release that hands a lock of one slot on to its designated successor: what a
/// successor may watch for instead of waiting for the controller to tell it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Handover<'s> {
    /// The claim of the one holder listed (revoked or not): the slot's occupant.
    pub from: &'s str,
    /// The release hash the lock recorded for it.
    pub hash: &'s str,
    /// The token reserved for the successor.
    pub token: i64,
}

impl Handover<'_> {
    /// Whether `lease` is the holder's claim carrying a release mark that opens the
    /// recorded hash: its owner revealed the secret, so its work has stopped (a
    /// neighbour who may patch Leases cannot write one; `"true"` never opens a hash).
    pub fn released_by(&self, lease: &Lease) -> bool {
        let valid = match release::judge(lease, Some(self.hash)) {
            release::Mark::Valid => true,
            release::Mark::Forged => mutant(Mutant::HandoverByAnyMark),
            release::Mark::None => false,
        };
        lease.metadata.name.as_deref() == Some(self.from) && valid
    }
}

/// The handover by which `status` (of a lock whose `spec.maxHolders` is `max_holders`,
/// read from the same object) grants `claim`: when the lock has one slot, lists exactly
/// one holder with a recorded release hash, and designates `claim` its successor. The
/// successor is fenced like a holder (it leaves its place only by its grant, by
/// withdrawing, or once certainly stopped) and the next slot to free is its, with the
/// reserved token; with one slot that slot is the holder's, freed by its valid mark. So
/// the holder's release mark is the successor's grant as surely as the controller's
/// word: a successor that sees it takes it as a direct grant ([`grant`]). Not with
/// several slots: one listed holder's release frees a slot only while `maxHolders`
/// has not been lowered since, which a status cannot show.
pub fn handover<'s>(max_holders: i32, status: &'s DistributedLockStatus, claim: &str) -> Option<Handover<'s>> {
    let successor = status.successor.as_ref().filter(|s| s.claim == claim)?;
    // As the lock keeps a designation: the head of its queue (a status naming it
    // otherwise was not written by a controller, which would not fence it).
    status.queue.first().filter(|w| w.claim == claim)?;
    let [holder] = status.holders.as_slice() else {
        return None;
    };
    if holder.claim == claim {
        return None;
    }
    let hash = holder.release_hash.as_deref().filter(|h| release::is_hash(h))?;
    (max_holders <= 1).then_some(Handover {
        from: &holder.claim,
        hash,
        token: successor.fencing_token,
    })
}

/// Whether `status` lists `claim` as a revoked holder whose slot is held back until its
/// process has certainly stopped.
pub fn held_back(status: &DistributedLockStatus, claim: &str) -> bool {
    status.holders.iter().any(|h| h.claim == claim && h.revoked.is_some())
}

/// Whether `status` names `claim`, as a holder (revoked or not) or a waiter: whether
/// the lock has yet to decide the claim's end.
pub fn names_claim(status: &DistributedLockStatus, claim: &str) -> bool {
    status.holders.iter().any(|h| h.claim == claim) || status.queue.iter().any(|w| w.claim == claim)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;

    use super::*;
    use crate::api::{Holder, Revocation, RevokeReason};

    fn holder(claim: &str, token: i64, revoked: bool) -> Holder {
        Holder {
            claim: claim.into(),
            pod: "p".into(),
            pod_uid: "u".into(),
            fencing_token: token,
            granted_at: Time(Timestamp::UNIX_EPOCH),
            lease_duration_seconds: None,
            release_hash: None,
            revoked: revoked.then_some(Revocation {
                reason: RevokeReason::ForceReleased,
                at: Time(Timestamp::UNIX_EPOCH),
            }),
        }
    }

    #[test]
    fn only_an_unrevoked_holder_entry_grants() {
        let status = DistributedLockStatus {
            holders: vec![holder("a", 3, true), holder("b", 4, false)],
            ..Default::default()
        };
        assert_eq!(granted_token(&status, "a"), None, "a revoked holder holds nothing");
        assert_eq!(granted_token(&status, "b"), Some(4));
        assert_eq!(granted_token(&status, "c"), None);
    }

    /// One holder `a` (revoked or not) with `hash` recorded, `b` queued and designated
    /// with token 8.
    fn designating_b(hash: Option<&str>, revoked: bool) -> DistributedLockStatus {
        let a = Holder {
            release_hash: hash.map(String::from),
            ..holder("a", 7, revoked)
        };
        let b = waiter("b");
        DistributedLockStatus {
            holders: vec![a],
            queue: vec![b],
            successor: Some(crate::api::Successor {
                claim: "b".into(),
                fencing_token: 8,
                lease_duration_seconds: None,
            }),
            ..Default::default()
        }
    }

    fn waiter(claim: &str) -> crate::api::Waiter {
        crate::api::Waiter {
            claim: claim.into(),
            pod: "p".into(),
            pod_uid: "u".into(),
            requested_at: Time(Timestamp::UNIX_EPOCH),
            release_hash: None,
            lease_duration_seconds: None,
            wait_hash: None,
        }
    }

    fn marked(name: &str, mark: &str) -> Lease {
        let mut lease = Lease::default();
        lease.metadata.name = Some(name.into());
        lease.metadata.annotations = Some([(RELEASED_ANNOTATION.to_string(), mark.to_string())].into());
        lease
    }

    #[test]
    fn the_one_holders_mark_that_opens_its_recorded_hash_hands_the_slot_to_the_successor() {
        let secret = release::Secret::generate();
        let hash = secret.hash();
        for revoked in [false, true] {
            let status = designating_b(Some(&hash), revoked);
            let h = handover(1, &status, "b").expect("a handover");
            assert_eq!((h.from, h.hash, h.token), ("a", hash.as_str(), 8));
            assert!(
                still_grants(&status, "b", h.token),
                "the status that designated it still grants it"
            );
            assert!(h.released_by(&marked("a", secret.reveal())));
            let other = release::Secret::generate();
            let mut unmarked = marked("a", "");
            unmarked.metadata.annotations = None;
            for (what, lease) in [
                ("\"true\"", marked("a", "true")),
                ("another secret", marked("a", other.reveal())),
                ("the hash itself", marked("a", &hash)),
                ("another claim's mark", marked("c", secret.reveal())),
                ("no mark", unmarked.clone()),
            ] {
                assert!(!h.released_by(&lease), "{what} hands nothing on");
            }
        }
    }

    #[test]
    fn no_handover_but_to_the_designated_head_behind_one_holder_with_a_hash_under_one_slot() {
        let hash = release::Secret::generate().hash();
        let ok = designating_b(Some(&hash), false);
        assert!(handover(1, &ok, "b").is_some());
        assert_eq!(handover(1, &ok, "a"), None, "not designated");
        assert_eq!(handover(2, &ok, "b"), None, "several slots");
        assert_eq!(handover(1, &designating_b(None, false), "b"), None, "no hash recorded");
        assert_eq!(
            handover(1, &designating_b(Some("true"), false), "b"),
            None,
            "not a hash"
        );
        let mut two = ok.clone();
        two.holders.push(holder("c", 6, true));
        assert_eq!(handover(1, &two, "b"), None, "two holders listed");
        let mut behind = ok.clone();
        behind.queue.insert(0, waiter("d"));
        assert_eq!(handover(1, &behind, "b"), None, "not the head of the queue");
        let mut itself = ok.clone();
        itself.holders[0].claim = "b".into();
        assert_eq!(handover(1, &itself, "b"), None, "its own holder entry");
    }
}
