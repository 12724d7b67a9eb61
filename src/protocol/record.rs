//! The owner's check of what a lock's status records for its claim.
//!
//! The controller records a claim's pod, pod UID, release hash and lease in the lock's
//! status when it first queues the claim, from the claim as it was then, and never
//! lowers the recorded lease afterwards. Anyone allowed to patch Leases in the namespace
//! (every lock user) could have changed those fields *before* that: a claim made before
//! its lock exists, while the controller is down, or whose name is public in the status
//! of a lock deleted and re-created. A record made from a tampered claim could let the
//! controller free the slot while its process runs (a stripped hash accepts anyone's
//! release mark, another pod's end frees it, a shorter lease expires it early).
//!
//! So the owner checks the record end to end: a client acts on its grant only when the
//! status records exactly what it wrote ([`check`]); anything else and it withdraws the
//! claim and claims anew, never acting under the tampered record.

use std::collections::HashMap;

use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;

use crate::api::DistributedLockStatus;

/// What a claim's owner wrote on its claim at creation.
#[derive(Clone, Copy, Debug)]
pub struct Written<'a> {
    /// Its pod's name.
    pub pod: &'a str,
    /// Its pod's UID.
    pub pod_uid: &'a str,
    /// The hash of its release secret (`None`: it wrote none).
    pub release_hash: Option<&'a str>,
    /// The hash of its wait proof (`None`: it wrote none).
    pub wait_hash: Option<&'a str>,
    /// The lease it lives by, in seconds.
    pub lease_seconds: i32,
}

/// What a claim's owner wrote on its claim at creation, owned (for a task that checks
/// every status it sees, after its grant too).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claimed {
    /// Its pod's name.
    pub pod: String,
    /// Its pod's UID.
    pub pod_uid: String,
    /// The hash of its release secret.
    pub release_hash: Option<String>,
    /// The hash of its wait proof.
    pub wait_hash: Option<String>,
    /// The lease it lives by, in seconds.
    pub lease_seconds: i32,
}

impl Claimed {
    /// As [`Written`], to check.
    pub fn written(&self) -> Written<'_> {
        Written {
            pod: &self.pod,
            pod_uid: &self.pod_uid,
            release_hash: self.release_hash.as_deref(),
            wait_hash: self.wait_hash.as_deref(),
            lease_seconds: self.lease_seconds,
        }
    }
}

/// A field the status records otherwise than the owner wrote it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tampered {
    /// The pod's name.
    Pod,
    /// The pod's UID.
    PodUid,
    /// The release hash.
    ReleaseHash,
    /// The lease: none recorded, or shorter than the owner's.
    Lease,
    /// The claim's lock label (changed or removed).
    Lock,
    /// The claim's ownerReference to its pod.
    Owner,
    /// The hash of the owner's wait proof (another than it wrote: only its holder
    /// could then wait for the claim's direct grant).
    WaitHash,
}

impl Tampered {
    /// The claim field that was changed, as a user knows it.
    pub fn field(self) -> &'static str {
        match self {
            Self::Pod => "spec.holderIdentity",
            Self::PodUid => "leasehold.dev/pod-uid",
            Self::ReleaseHash => "leasehold.dev/release-hash",
            Self::Lease => "spec.leaseDurationSeconds",
            Self::Lock => "metadata.labels[leasehold.dev/lock]",
            Self::Owner => "metadata.ownerReferences",
            Self::WaitHash => "leasehold.dev/wait-hash",
        }
    }
}

impl std::fmt::Display for Tampered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the lock's status records the claim's {} otherwise than its process wrote it \
             (changed by someone else before the controller first queued it)",
            self.field()
        )
    }
}

/// What a lock's status records for one claim.
#[derive(Clone, Copy, Debug)]
pub struct Recorded<'a> {
    /// The pod's name.
    pub pod: &'a str,
    /// The pod's UID.
    pub pod_uid: &'a str,
    /// The release hash.
    pub release_hash: Option<&'a str>,
    /// The wait hash (`None`: none recorded, or a holder's record, which has none).
    pub wait_hash: Option<&'a str>,
    /// The lease (a designated waiter's: the longer of its queue entry's and its
    /// designation's).
    pub lease_seconds: Option<i32>,
    /// Recorded as a holder (a holder's record always has a lease).
    pub granted: bool,
}

/// What `status` records for `claim`: its holder entry if it has one, else its queue
/// entry; `None` when it records nothing for it.
pub fn recorded<'s>(status: &'s DistributedLockStatus, claim: &str) -> Option<Recorded<'s>> {
    if let Some(h) = status.holders.iter().find(|h| h.claim == claim) {
        return Some(of_holder(h));
    }
    let w = status.queue.iter().find(|w| w.claim == claim)?;
    Some(of_waiter(status, w))
}

/// What `status` records for every claim it names, by claim, as [`recorded`] says of
/// each: built once for a lock with many claims (a flood of them must cost each pass
/// no more than a look-up apiece).
pub fn records(status: &DistributedLockStatus) -> HashMap<&str, Recorded<'_>> {
    let mut all: HashMap<&str, Recorded<'_>> = HashMap::with_capacity(status.queue.len() + status.holders.len());
    for w in status.queue.iter().rev() {
        all.insert(&w.claim, of_waiter(status, w)); // the first entry of a name stands
    }
    for h in status.holders.iter().rev() {
        all.insert(&h.claim, of_holder(h)); // a holder entry before a queue entry
    }
    all
}

fn of_holder(h: &crate::api::Holder) -> Recorded<'_> {
    Recorded {
        pod: &h.pod,
        pod_uid: &h.pod_uid,
        release_hash: h.release_hash.as_deref(),
        wait_hash: None,
        lease_seconds: h.lease_duration_seconds,
        granted: true,
    }
}

fn of_waiter<'s>(status: &'s DistributedLockStatus, w: &'s crate::api::Waiter) -> Recorded<'s> {
    let designated = status.successor.as_ref().filter(|s| s.claim == w.claim);
    Recorded {
        pod: &w.pod,
        pod_uid: &w.pod_uid,
        release_hash: w.release_hash.as_deref(),
        wait_hash: w.wait_hash.as_deref(),
        lease_seconds: w
            .lease_duration_seconds
            .max(designated.and_then(|s| s.lease_duration_seconds)),
        granted: false,
    }
}

impl Recorded<'_> {
    /// The first field recorded otherwise than `wrote` says, the lease included: shorter
    /// (judged by less than its process acts on), longer (a slot held back that long once
    /// its holder is revoked: an hour for a neighbour's raise) or absent.
    pub fn differs(&self, wrote: &Written<'_>) -> Option<Tampered> {
        if self.pod != wrote.pod {
            return Some(Tampered::Pod);
        }
        if self.pod_uid != wrote.pod_uid {
            return Some(Tampered::PodUid);
        }
        if self.release_hash != wrote.release_hash {
            return Some(Tampered::ReleaseHash);
        }
        // A waiter's record carries the wait hash its claim stated (a holder's carries
        // none): one stripped before the record would let anyone hold the successor's
        // waits for its direct grant.
        if !self.granted && self.wait_hash != wrote.wait_hash {
            return Some(Tampered::WaitHash);
        }
        // Every record carries the owner's lease: the controller judges the claim by it.
        // One recorded without would be judged by the lock's (maybe shorter) lease while
        // its process acts by its own, a direct grant included; a longer one (its claim
        // raised before the record) would hold a revoked holder's slot back that long.
        let accepts_none = !self.granted && crate::mutant::on(crate::mutant::Mutant::QueuedWithoutLease);
        let accepts_longer = crate::mutant::on(crate::mutant::Mutant::RecordLongerLease);
        match self.lease_seconds {
            Some(l) if l == wrote.lease_seconds => None,
            Some(l) if accepts_longer && l > wrote.lease_seconds => None,
            None if accepts_none => None,
            _ => Some(Tampered::Lease),
        }
    }
}

/// The first field of the claim `stored` (as the API server has it now) that differs
/// from what its owner `wrote` for `lock`: a claim the controller has not placed yet
/// may be unplaced because someone changed it (the controller then refuses it for its
/// pod or its missing lease, or ignores it as invalid, and its owner would wait or give
/// up for nothing).
pub fn claim_differs(stored: &Lease, wrote: &Written<'_>, lock: &str) -> Option<Tampered> {
    let annotation = |key: &str| stored.annotations().get(key).map(String::as_str);
    let pod = stored.spec.as_ref().and_then(|s| s.holder_identity.as_deref());
    let owned = stored
        .owner_references()
        .iter()
        .any(|o| o.kind == "Pod" && o.name == wrote.pod && o.uid == wrote.pod_uid);
    if crate::protocol::claim::claim_lock(stored) != Some(lock) {
        Some(Tampered::Lock)
    } else if pod != Some(wrote.pod) {
        Some(Tampered::Pod)
    } else if annotation(crate::protocol::POD_UID_ANNOTATION) != Some(wrote.pod_uid) {
        Some(Tampered::PodUid)
    } else if annotation(crate::protocol::RELEASE_HASH_ANNOTATION) != wrote.release_hash {
        Some(Tampered::ReleaseHash)
    } else if !owned {
        Some(Tampered::Owner)
    } else if crate::protocol::claim::claim_wait_hash(stored) != wrote.wait_hash {
        Some(Tampered::WaitHash)
    } else if stored.spec.as_ref().and_then(|s| s.lease_duration_seconds) != Some(wrote.lease_seconds) {
        Some(Tampered::Lease)
    } else {
        None
    }
}

/// Check what `status` records for `claim` against what its owner `wrote`; `Ok` when
/// the status records nothing for it yet.
pub fn check(status: &DistributedLockStatus, claim: &str, wrote: &Written<'_>) -> Result<(), Tampered> {
    match recorded(status, claim).and_then(|r| r.differs(wrote)) {
        Some(field) => Err(field),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;

    use super::*;
    use crate::api::{Holder, Successor, Waiter};

    #[test]
    fn a_stored_claim_changed_in_any_field_its_owner_wrote_is_told_apart() {
        let pod = crate::protocol::PodIdentity {
            name: "p".into(),
            namespace: "ns".into(),
            uid: "u".into(),
        };
        let secret = crate::protocol::release::Secret::generate();
        let hash = secret.hash();
        let wait = secret.wait_hash();
        let wrote = Written {
            release_hash: Some(&hash),
            wait_hash: Some(&wait),
            ..WROTE
        };
        let made = crate::protocol::claim::claim_lease_with("c", "l", &pod, 60, Some(&secret));
        assert_eq!(claim_differs(&made, &wrote, "l"), None);
        assert_eq!(claim_differs(&made, &wrote, "m"), Some(Tampered::Lock));
        type Edit = fn(&mut Lease);
        let edits: [(Edit, Tampered); 9] = [
            (
                |l| drop(l.labels_mut().remove(crate::protocol::LOCK_LABEL)),
                Tampered::Lock,
            ),
            (
                |l| l.spec.as_mut().unwrap().holder_identity = Some("q".into()),
                Tampered::Pod,
            ),
            (
                |l| {
                    drop(
                        l.annotations_mut()
                            .insert(crate::protocol::POD_UID_ANNOTATION.into(), "v".into()),
                    )
                },
                Tampered::PodUid,
            ),
            (
                |l| drop(l.annotations_mut().remove(crate::protocol::RELEASE_HASH_ANNOTATION)),
                Tampered::ReleaseHash,
            ),
            (|l| l.metadata.owner_references = None, Tampered::Owner),
            (
                |l| drop(l.annotations_mut().remove(crate::protocol::WAIT_HASH_ANNOTATION)),
                Tampered::WaitHash,
            ),
            (
                |l| l.spec.as_mut().unwrap().lease_duration_seconds = None,
                Tampered::Lease,
            ),
            (
                |l| l.spec.as_mut().unwrap().lease_duration_seconds = Some(1),
                Tampered::Lease,
            ),
            (
                |l| l.spec.as_mut().unwrap().lease_duration_seconds = Some(3600),
                Tampered::Lease,
            ),
        ];
        for (edit, field) in edits {
            let mut changed = made.clone();
            edit(&mut changed);
            assert_eq!(claim_differs(&changed, &wrote, "l"), Some(field));
        }
    }

    const WROTE: Written<'static> = Written {
        pod: "p",
        pod_uid: "u",
        release_hash: Some("h"),
        wait_hash: Some("w"),
        lease_seconds: 60,
    };

    /// Issue #41: a stripped wait hash recorded as none let anyone hold the successor's
    /// waits for its direct grant; a claim that states one must be recorded with it.
    #[test]
    fn a_waiters_record_carries_exactly_the_wait_hash_its_owner_wrote() {
        let with = |hash: Option<&str>| {
            let mut status = waiting(Some(60));
            status.queue[0].wait_hash = hash.map(String::from);
            check(&status, "c", &WROTE)
        };
        assert_eq!(with(Some("w")), Ok(()));
        assert_eq!(
            with(Some("x")),
            Err(Tampered::WaitHash),
            "another's proof would open it"
        );
        assert_eq!(with(None), Err(Tampered::WaitHash), "stripped before the record");
        let none = Written {
            wait_hash: None,
            ..WROTE
        };
        let mut status = waiting(Some(60));
        status.queue[0].wait_hash = None;
        assert_eq!(check(&status, "c", &none), Ok(()), "an owner that wrote none");
    }

    fn waiting(lease: Option<i32>) -> DistributedLockStatus {
        DistributedLockStatus {
            queue: vec![Waiter {
                claim: "c".into(),
                pod: "p".into(),
                pod_uid: "u".into(),
                requested_at: Time(Timestamp::UNIX_EPOCH),
                release_hash: Some("h".into()),
                lease_duration_seconds: lease,
                wait_hash: Some("w".into()),
            }],
            ..Default::default()
        }
    }

    fn granted(edit: impl FnOnce(&mut Holder)) -> DistributedLockStatus {
        let mut h = Holder {
            claim: "c".into(),
            pod: "p".into(),
            pod_uid: "u".into(),
            fencing_token: 1,
            granted_at: Time(Timestamp::UNIX_EPOCH),
            lease_duration_seconds: Some(60),
            release_hash: Some("h".into()),
            revoked: None,
        };
        edit(&mut h);
        DistributedLockStatus {
            holders: vec![h],
            ..Default::default()
        }
    }

    #[test]
    fn a_record_of_what_the_owner_wrote_passes() {
        assert_eq!(check(&granted(|_| {}), "c", &WROTE), Ok(()));
        assert_eq!(check(&waiting(Some(60)), "c", &WROTE), Ok(()));
        assert_eq!(
            check(&DistributedLockStatus::default(), "c", &WROTE),
            Ok(()),
            "not recorded yet"
        );
    }

    #[test]
    fn each_field_changed_before_the_record_is_named() {
        type Edit = fn(&mut Holder);
        let cases: [(Edit, Tampered); 7] = [
            (|h| h.pod = "neighbour".into(), Tampered::Pod),
            (|h| h.pod_uid = "u-2".into(), Tampered::PodUid),
            (|h| h.release_hash = None, Tampered::ReleaseHash),
            (|h| h.release_hash = Some("other".into()), Tampered::ReleaseHash),
            (|h| h.lease_duration_seconds = Some(1), Tampered::Lease),
            (|h| h.lease_duration_seconds = None, Tampered::Lease),
            // Raised before the record: its slot would be held back an hour once revoked.
            (|h| h.lease_duration_seconds = Some(3600), Tampered::Lease),
        ];
        for (edit, field) in cases {
            assert_eq!(check(&granted(edit), "c", &WROTE), Err(field));
        }
        assert_eq!(check(&waiting(Some(1)), "c", &WROTE), Err(Tampered::Lease));
        assert_eq!(check(&waiting(Some(3600)), "c", &WROTE), Err(Tampered::Lease));
        // Issue #41: a waiter recorded without a lease (its claim's removed before the
        // lock recorded it) was accepted as an older controller's record, then granted
        // directly and judged by the lock's 1 s lease while it acted on its own.
        assert_eq!(check(&waiting(None), "c", &WROTE), Err(Tampered::Lease));
    }

    #[test]
    fn a_designated_waiter_is_judged_by_the_longer_of_its_records() {
        let mut status = waiting(Some(1));
        status.successor = Some(Successor {
            claim: "c".into(),
            fencing_token: 2,
            lease_duration_seconds: Some(60),
        });
        assert_eq!(check(&status, "c", &WROTE), Ok(()));
    }
}
