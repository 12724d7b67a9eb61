//! The in-pod client: acquire a [`DistributedLock`](crate::api::DistributedLock) from
//! inside a pod, hold it with a fencing token, and release it.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use leasehold::client::Lock;
//!
//! let client = kube::Client::try_default().await?;
//! // Identity: POD_NAME, POD_NAMESPACE, POD_UID if set, else the pod's token (`identity`).
//! let lock = Lock::new(client, "default", "db-migration")?;
//! let guard = lock.acquire().await?; // waits its turn (FIFO), woken by a watch
//! let token = guard.fencing_token(); // hand this to the storage you write to
//! tokio::select! {
//!     _ = guard.lost() => eprintln!("lost the lock: stop now"),
//!     _ = async { /* critical section, passing `token` along */ } => {}
//! }
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! Files: `lock` (acquire, try, timeout, reentrancy; picks the backend), `backend` (the
//! seam a backend plugs into), `session` (renewals and deadlines, the sources of
//! loss), `guard` (the held grant), `progress` (what a waiter hears), `identity` (which
//! pod this is: its variables, else its service-account token), and a folder per
//! backend: `k8s/` (claims are Leases) and `etcd/` (claims are etcd keys).
//!
//! A pod needs RBAC to create and patch leases and get/list/watch distributedlocks (see
//! `examples/rbac.yaml`), and knows its pod from its service-account token on
//! Kubernetes ≥ 1.21 ([`identity`]). Where tokens do not name their pod (older
//! clusters, legacy token Secrets), give it the downward API:
//!
//! ```yaml
//! env:
//! - { name: POD_NAME, valueFrom: { fieldRef: { fieldPath: metadata.name } } }
//! - { name: POD_NAMESPACE, valueFrom: { fieldRef: { fieldPath: metadata.namespace } } }
//! - { name: POD_UID, valueFrom: { fieldRef: { fieldPath: metadata.uid } } }
//! ```

mod backend;
#[cfg(feature = "etcd")]
pub(crate) mod etcd;
mod guard;
pub mod identity;
pub(crate) mod k8s;
mod lock;
mod progress;
pub(crate) mod session;

use std::time::Duration;

pub use guard::{Guard, RELEASE_RETRY_DELAY};
pub use lock::{Lock, LockBuilder, TRY_ACQUIRE_TIMEOUT};
pub use progress::{UNQUEUED_NOTICE, WaitEvent};
pub use session::{LostReason, State};

/// Errors of the client, each naming the action that failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The process's pod identity is incomplete.
    #[error(
        "missing pod identity: set {0} (the downward API gives it), or run where the pod's service-account token names its pod (Kubernetes >= 1.21)"
    )]
    MissingIdentity(&'static str),
    /// Claims must live in their pod's namespace (owner references cannot cross namespaces).
    #[error("lock namespace {lock} differs from the pod's namespace {pod}: a pod can only lock in its own namespace")]
    CrossNamespace {
        /// The lock's namespace.
        lock: String,
        /// The pod's namespace.
        pod: String,
    },
    /// The lock's name cannot be named by a claim (it goes in a label value).
    #[error(
        "lock name {0:?} is longer than 63 characters: claims name their lock in a label value, which holds at most 63"
    )]
    NameTooLong(String),
    /// Reading the DistributedLock failed.
    #[error("reading DistributedLock {0}: {1}")]
    GetLock(String, #[source] kube::Error),
    /// Creating the claim Lease failed.
    #[error("creating the claim Lease: {0}")]
    CreateClaim(#[source] kube::Error),
    /// The watch on the DistributedLock ended.
    #[error("watching DistributedLock {0}: the watch ended")]
    Watch(String),
    /// The claim disappeared while waiting (deleted, or expired after lost renewals).
    #[error("the claim Lease {0} was removed while waiting for the lock")]
    ClaimLost(String),
    /// Marking the claim released failed.
    #[error("releasing the claim Lease: {0}")]
    Release(#[source] kube::Error),
    /// Marking the claim released took too long (the claim will expire instead).
    #[error("releasing the claim Lease: no answer within {0:?}; the claim will expire")]
    ReleaseTimeout(Duration),
    /// The controller does not queue the claim, and says why in the lock's status (the
    /// claim was withdrawn).
    #[error("the controller refuses claim {claim} of DistributedLock {lock}: {} ({})", .reason.as_str(), .reason.message())]
    Refused {
        /// The lock's name.
        lock: String,
        /// The claim Lease's name.
        claim: String,
        /// Why.
        reason: crate::api::RefuseReason,
    },
    /// Two claims in a row (a try's one) were deleted before any status the client read
    /// placed them: by the garbage collector, because their ownerReference names no
    /// existing pod (one such claim is claimed anew: a paused process may find its
    /// claim granted and expired unread).
    #[error(
        "the claim Lease {claim} was deleted before any controller queued it: the garbage collector deletes a claim whose \
         ownerReference names no existing pod, so POD_NAME ({pod}) and POD_UID ({uid}) must be this pod's own (give them \
         with the downward API)"
    )]
    ClaimCollected {
        /// The claim Lease's name.
        claim: String,
        /// The pod name the claim gave.
        pod: String,
        /// The pod UID the claim gave.
        uid: String,
    },
    /// The lock was not granted in time (the claim was withdrawn).
    #[error("the lock was not granted within {0:?}")]
    Timeout(Duration),
    /// Taking the lock at once ([`Lock::try_acquire`]) found no such DistributedLock.
    #[error("taking DistributedLock {0} at once: it does not exist")]
    NoSuchLock(String),
    /// The lock's claims live in etcd, and this build has no etcd backend.
    #[error(
        "DistributedLock {0} keeps its claims in etcd (spec.backend.etcd), and this program was built without leasehold's `etcd` feature"
    )]
    EtcdUnsupported(String),
    /// The etcd backend failed.
    #[cfg(feature = "etcd")]
    #[error(transparent)]
    Etcd(#[from] crate::etcd::Error),
}

/// Where a waiting claim stands, for progress output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WaitStatus {
    /// 1-based position in the queue.
    pub position: usize,
    /// Pods holding the lock now.
    pub holders: Vec<String>,
}

#[cfg(test)]
mod tests {
    /// The client's own waits, as the protocol's test vectors state them
    /// (`docs/protocol-vectors.json`; the rest is checked in `protocol::vectors`).
    #[test]
    fn the_client_s_waits_are_the_vectors() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/protocol-vectors.json");
        let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let constants = &v["timing"]["constants_ms"];
        for (name, wait) in [
            ("UNQUEUED_NOTICE", super::UNQUEUED_NOTICE),
            ("TRY_ACQUIRE_TIMEOUT", super::TRY_ACQUIRE_TIMEOUT),
            ("RELEASE_RETRY_DELAY", super::RELEASE_RETRY_DELAY),
        ] {
            assert_eq!(constants[name], wait.as_millis() as u64, "{name}");
        }
    }
}
