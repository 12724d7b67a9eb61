//! The etcd backend: the same locks, with their claims as keys in an etcd cluster the
//! pods reach directly (`spec.backend.etcd`). Same CRD, same [`crate::client::Lock`],
//! same `leasehold run`; the client picks the backend from the lock object.
//!
//! ```text
//!  pod A (client)                          etcd                                controller
//!  lease grant (TTL = lease), keep alive   <prefix>/<ns>/<lock>/<claim-a>      watches the lock's
//!  txn: create <claim-a> under the lease     create revision 101 ── holds      keys, mirrors them
//!  keys ahead of mine < maxHolders? hold,  <prefix>/<ns>/<lock>/<claim-b>      into status; a key
//!    fencing token = my create revision      create revision 107 ── waits      whose pod is gone:
//!  else watch the key just ahead           B watches only <claim-a>            stopped → delete;
//!  done → revoke my lease (deletes my key ─▶ delete event wakes B: 107 holds     maybe running →
//!    only while it is still on my lease)                                       move onto its own
//!                                                                              lease (hold back)
//! ```
//!
//! The rules, and why they fence:
//! * FIFO and grants are etcd's: the first `maxHolders` keys by create revision hold.
//!   A key's create revision is its fencing token: etcd's revision only grows, so a
//!   later grant always carries a larger token (they are not 1, 2, 3).
//! * A client renews by checking that its key is still on its own lease and then
//!   keeping the lease alive; its `lost()` fires [`client_stop_by`] after the check
//!   was *sent*. etcd expires the lease no earlier than one TTL after the keep-alive
//!   was *received*, and the TTL is the lease rounded up ([`timing::etcd_claim_ttl`]).
//! * The controller never deletes the key of a process that may run: for a pod gone
//!   without word that its containers stopped, it moves the key (same create revision,
//!   so same place) onto a lease of its own with [`timing::etcd_hold_back_ttl`], then
//!   revokes the client's lease. A renewal check sent before the move succeeded, so
//!   the client stops within one lease of the move; the key outlives that.
//!
//! Anyone with write access to the prefix can delete keys: in etcd, the lock is only
//! as safe as etcd's own access control (give the pods a role on their prefix).
//!
//! [`client_stop_by`]: crate::protocol::timing::client_stop_by
//! [`timing::etcd_claim_ttl`]: crate::protocol::timing::etcd_claim_ttl
//! [`timing::etcd_hold_back_ttl`]: crate::protocol::timing::etcd_hold_back_ttl

pub mod connect;
pub mod keys;
pub mod rules;

pub use connect::{ENDPOINTS_ENV, TLS_DIR_ENV, connect, connect_with, tls_dir};

/// Errors of the etcd backend, each naming the action that failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No endpoint could be reached, or the client could not be built.
    #[error("connecting to etcd at {0}: {1}")]
    Connect(String, #[source] etcd_client::Error),
    /// Reading the TLS files failed.
    #[error("reading etcd TLS file {0}: {1}")]
    TlsFile(String, #[source] std::io::Error),
    /// The TLS Secret is missing a key.
    #[error("etcd TLS Secret {0} has no {1}")]
    TlsSecret(String, &'static str),
    /// Granting the claim's lease failed.
    #[error("granting the claim's etcd lease: {0}")]
    Grant(#[source] etcd_client::Error),
    /// Creating the claim key failed.
    #[error("creating the claim key {0}: {1}")]
    Create(String, #[source] etcd_client::Error),
    /// Reading the lock's keys failed.
    #[error("reading the keys of lock {0}: {1}")]
    Read(String, #[source] etcd_client::Error),
    /// Watching failed.
    #[error("watching {0}: {1}")]
    Watch(String, #[source] etcd_client::Error),
    /// Giving up the claim (revoking its lease) failed.
    #[error("releasing the claim key {0}: {1}")]
    Release(String, #[source] etcd_client::Error),
    /// Moving or deleting a claim key (controller) failed.
    #[error("revoking the claim key {0}: {1}")]
    Revoke(String, #[source] etcd_client::Error),
}

impl Error {
    /// A short fixed string for metric labels.
    pub fn category(&self) -> &'static str {
        match self {
            Error::Connect(..) => "etcd_connect",
            Error::TlsFile(..) | Error::TlsSecret(..) => "etcd_tls",
            Error::Grant(..) => "etcd_grant",
            Error::Create(..) => "etcd_create",
            Error::Read(..) => "etcd_read",
            Error::Watch(..) => "etcd_watch",
            Error::Release(..) => "etcd_release",
            Error::Revoke(..) => "etcd_revoke",
        }
    }
}
