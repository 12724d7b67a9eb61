//! The errors of a reconcile, whatever the lock's backend, each naming the action that
//! failed, and the requeue that follows one.

use std::time::Duration;

/// How many times one reconcile re-reads and re-decides after write conflicts.
pub const MAX_CONFLICT_RETRIES: usize = 8;
/// Requeue delay after an error.
pub const ERROR_REQUEUE: Duration = Duration::from_secs(1);

/// Errors of a reconcile, each naming the action that failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Writing the lock's status failed.
    #[error("writing status of DistributedLock {0}: {1}")]
    WriteStatus(String, #[source] kube::Error),
    /// Re-reading the lock after a write conflict failed.
    #[error("re-reading DistributedLock {0} after a conflict: {1}")]
    Reread(String, #[source] kube::Error),
    /// Reading a claim afresh before expiring it failed.
    #[error("confirming the expiry of claim {0}: {1}")]
    ConfirmExpiry(String, #[source] kube::Error),
    /// Deleting a claim confirmed expired failed.
    #[error("deleting expired claim {0}: {1}")]
    Expire(String, #[source] kube::Error),
    /// Looking up or deleting a revoked holder's claim out of view failed.
    #[error(transparent)]
    Stray(#[from] crate::controller::k8s::strays::Error),
    /// A claim judged expired is gone, and the claim watch has not shown it yet.
    #[error("claim {0} is gone but the claim watch has not shown it yet; waiting for it")]
    ClaimGoneUnseen(String),
    /// Conflicts kept happening.
    #[error("DistributedLock {0}: {MAX_CONFLICT_RETRIES} write conflicts in a row")]
    Conflicts(String),
    /// Revoking a claim key in etcd failed.
    #[error(transparent)]
    Etcd(crate::etcd::Error),
    /// Adding or acting on the lock's finalizer failed.
    #[error(transparent)]
    Finalizer(#[from] crate::controller::finalizer::Error),
}

impl Error {
    /// A short fixed string for metric labels.
    pub fn category(&self) -> &'static str {
        match self {
            Error::WriteStatus(..) => "write_status",
            Error::Reread(..) => "reread",
            Error::ConfirmExpiry(..) => "confirm_expiry",
            Error::ClaimGoneUnseen(..) => "claim_gone_unseen",
            Error::Expire(..) => "expire",
            Error::Stray(e) => e.category(),
            Error::Conflicts(..) => "conflicts",
            Error::Etcd(e) => e.category(),
            Error::Finalizer(e) => e.category(),
        }
    }
}
