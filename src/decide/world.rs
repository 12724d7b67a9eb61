//! What the decide core reads (the observed world) and what it returns (a decision).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::jiff::Timestamp;

use crate::api::{DistributedLockSpec, DistributedLockStatus, RevokeReason};

/// The order in which claims arrived: the API server's creation second first; within
/// one second, the time the client says it made the claim (so a controller that lists
/// several claims at once after a failover keeps their order — a client can skew it
/// only within its claim's creation second); then the order in which the observer
/// first saw them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Arrival {
    /// The claim's `metadata.creationTimestamp`, in seconds.
    pub created_secs: i64,
    /// The claim's `leasehold.dev/requested-at`, in microseconds since 1970.
    pub requested_micros: i64,
    /// A counter the observer increments each time it first sees a claim.
    pub seen_seq: u64,
}

/// One observed claim Lease of this lock, already validated by the caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimView {
    /// The claim Lease's name: the identity of one process's request.
    pub name: String,
    /// The pod the claim says it comes from.
    pub pod: String,
    /// That pod's UID, as the claim states it.
    pub pod_uid: String,
    /// Its arrival key, for FIFO order among new claims.
    pub arrival: Arrival,
    /// The process marked the claim released (or withdrew it while waiting), with a
    /// mark that proves it is the claim's owner.
    pub released: bool,
    /// The claim carries a release mark its owner did not write (see
    /// [`crate::protocol::release`]).
    pub forged: bool,
    /// The hash of the claim's release secret, to record when it is queued.
    pub release_hash: Option<String>,
    /// The hash of the claim owner's wait proof, to record when it is queued.
    pub wait_hash: Option<String>,
    /// The fencing token stamped on the claim ([`crate::protocol::FENCING_TOKEN_ANNOTATION`]):
    /// not trusted, since anyone who may patch Leases can write it; read only by a
    /// mutation test's switch that puts the old trust back.
    pub stamped_token: Option<i64>,
    /// The caller judged the claim expired: not renewed for long enough.
    pub expired: bool,
    /// The lease the claim's process lives by, in seconds (as written on the claim,
    /// capped at the API's maximum; 0 when absent).
    pub lease_seconds: i32,
}

/// What is known of one pod, by name. A pod absent from the map is gone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodView {
    /// The pod's current UID.
    pub uid: String,
    /// Its phase is Succeeded or Failed: its containers have stopped.
    pub finished: bool,
}

/// UIDs of pods whose objects are gone, but whose last state the kubelet reported
/// showed every container terminated: their processes have certainly stopped.
pub type StoppedPods = BTreeSet<String>;

/// Everything `decide` looks at.
#[derive(Clone, Copy, Debug)]
pub struct World<'a> {
    /// The lock's spec.
    pub spec: &'a DistributedLockSpec,
    /// The lock's current status (the durable holders, queue and token).
    pub status: &'a DistributedLockStatus,
    /// All claims observed for this lock.
    pub claims: &'a [ClaimView],
    /// What is known of the pods the claims name, by pod name.
    pub pods: &'a BTreeMap<String, PodView>,
    /// Pods (by UID) gone or replaced after the kubelet reported them stopped.
    pub stopped_pods: &'a StoppedPods,
    /// Revoked holders (by claim) whose hold-back delay elapsed on the caller's clock.
    pub hold_back_elapsed: &'a BTreeSet<String>,
    /// The wall-clock time to write into timestamps (informational only).
    pub now: Timestamp,
    /// The epoch a lock's tokens start from when its status has none yet: the caller's
    /// clock in microseconds, no earlier than the lock's creation.
    pub token_floor: i64,
    /// The lock is being deleted: nothing is granted and no successor newly designated,
    /// while its holders are judged as ever (so a held-back slot runs out its hold-back
    /// before the lock may go).
    pub closing: bool,
}

/// Why a waiter left the queue without being granted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DropReason {
    /// Its process withdrew the claim (marked it released while waiting).
    Withdrawn,
    /// Its claim was deleted.
    ClaimGone,
    /// Someone other than its process wrote a release mark on its claim.
    ForgedRelease,
    /// Its claim was not renewed in time.
    Expired,
    /// Its pod is gone.
    PodGone,
    /// Its pod was replaced by one with another UID.
    PodReplaced,
    /// Its pod finished.
    PodFinished,
}

/// Why a claim was left out of the queue (the caller reports it as a Warning, and the
/// status lists it for its client).
pub use crate::api::RefuseReason as IgnoreReason;

/// Something that happened to one claim of the lock, for events and metrics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Action {
    /// The claim it happened to.
    pub claim: String,
    /// The claim's pod.
    pub pod: String,
    /// What happened.
    pub kind: ActionKind,
}

/// What happened to a claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActionKind {
    /// The claim was granted the lock with this fencing token.
    Granted(i64),
    /// The holder with this token released the lock; its slot is free.
    Released(i64),
    /// The grant with this token was revoked. For `ForceReleased` the slot is held back.
    Revoked(i64, RevokeReason),
    /// The held-back slot of the revoked grant with this token passed on.
    SlotFreed(i64),
    /// A new claim joined the queue at this 1-based position.
    Enqueued(usize),
    /// A waiter left the queue.
    Dropped(DropReason),
}

impl Action {
    pub(crate) fn new(claim: &str, pod: &str, kind: ActionKind) -> Self {
        Action {
            claim: claim.to_string(),
            pod: pod.to_string(),
            kind,
        }
    }
}

/// The outcome of one decision.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    /// The next status (conditions and observedGeneration are copied unchanged).
    pub status: DistributedLockStatus,
    /// What happened, in order.
    pub actions: Vec<Action>,
    /// Claims to delete once the status is written: released, expired or stale ones.
    pub delete_claims: Vec<String>,
    /// Claims left out of the queue, and why.
    pub ignored: Vec<(String, IgnoreReason)>,
    /// When to decide again because a new claim waits for its pod to be seen (see
    /// [`crate::protocol::timing::POD_CACHE_GRACE`]): the end of its grace.
    pub recheck_at: Option<Timestamp>,
}
