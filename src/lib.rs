//! leasehold: fair (FIFO), fenced distributed locks for Kubernetes pods.
//!
//! A `DistributedLock` custom resource ([`api`]) is granted to pods in arrival order by
//! the controller (`controller`); every grant carries a strictly increasing fencing
//! token. Pods ask with claim Leases and learn of their grant from a watch on the
//! lock ([`client`]), or, next in line, from the controller directly
//! ([`protocol::grant`]). The claim's format and the timing rules that make the handoff
//! safe live in [`protocol`]; the grant rules themselves in the pure [`decide`] core.
//!
//! ```text
//!  pod A (client)                          controller                        pod B
//!  create claim Lease  ─────────────────▶  sees claim (watch)
//!    label leasehold.dev/lock=my-lock      decide (pure): queue, grant
//!  renew every lease/3                     write DistributedLock.status ◀── resourceVersion
//!  watch DistributedLock ◀───────────────    holders: [A, token 7]          precondition
//!  "A holds, token 7" → work, fenced by 7    queue:   [B]; successor: B, 8   B waits at the
//!                                                                          controller
//!  done → notice (or mark claim released) ▶ free slot: B's ── signed ─────▶ B works, 8
//!                                           grant, then status write
//!  A's pod gone / claim unrenewed / claim deleted by someone else:
//!    revoke; a slot passes on only once A has certainly stopped
//! ```
//!
//! Features: `client` (the default: the API types, the protocol and [`client`]; it
//! selects no k8s-openapi version, the depending crate does), `etcd` (the etcd backend;
//! its build needs `protoc`), `controller`, and `cli` (the `leasehold` binary; selects
//! k8s-openapi `v1_33`).
//!
//! Holding a lock from Rust (the pod's identity comes from its service-account token,
//! or from `POD_NAME`, `POD_NAMESPACE`, `POD_UID` where they are set):
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use leasehold::client::Lock;
//!
//! let lock = Lock::new(kube::Client::try_default().await?, "default", "my-lock")?;
//! let guard = lock.acquire().await?; // FIFO, woken by a watch
//! let token = guard.fencing_token(); // pass it to the storage you protect
//! tokio::select! {
//!     _ = guard.lost() => { /* revoked or renewals failing: stop now */ }
//!     _ = async { /* the critical section, fenced by `token` */ } => {}
//! }
//! guard.release().await?;
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod api;
#[cfg(feature = "client")]
pub mod client;
#[cfg(feature = "controller")]
pub mod controller;
#[cfg(feature = "controller")]
pub mod crd;
pub mod decide;
#[cfg(feature = "etcd")]
pub mod etcd;
#[cfg(feature = "client")]
pub mod kubeconfig;
mod mutant;
pub mod protocol;
#[cfg(feature = "client")]
pub(crate) mod retry;

#[cfg(feature = "cli")]
#[doc(hidden)]
pub mod cli;
#[cfg(feature = "cli")]
#[doc(hidden)]
pub mod dev;
#[cfg(feature = "cli")]
#[doc(hidden)]
pub mod show;
#[cfg(feature = "cli")]
#[doc(hidden)]
pub mod supervise;
#[cfg(feature = "cli")]
#[doc(hidden)]
pub mod telemetry;
#[doc(hidden)]
pub mod testing;
