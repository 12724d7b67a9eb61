//! The seam a backend plugs into. A backend is where a lock's claims live and how its
//! reconcile runs there: the driver ([`crate::controller::reconcile`]) takes the lock's
//! turn, waits for the caches and lets a deleted lock without the fence go, then asks
//! each backend of [`crate::controller::reconcile::BACKENDS`] in turn whether it serves
//! the lock and hands it to the first that does. A backend writes the status with
//! [`crate::controller::status::write_status`], publishes events with
//! [`crate::controller::events`] and records [`crate::controller::Metrics::record_actions`],
//! so every backend reports alike.

use std::sync::Arc;
use std::time::Instant;

use futures::future::BoxFuture;
use kube::runtime::controller::Action as Requeue;
use kube::runtime::reflector::ObjectRef;

use crate::api::DistributedLock;
use crate::controller::context::Context;
use crate::controller::error::Error;

/// One place a lock's claims can live.
pub(crate) trait Backend: Sync {
    /// Whether this backend serves `lock` (by its spec).
    fn serves(&self, lock: &DistributedLock) -> bool;

    /// Reconcile `lock`, the driver holding its turn; `started` is when the driver
    /// started (the reconcile's duration is measured from it). Returns when to look
    /// again.
    fn reconcile(
        &self,
        lock: Arc<DistributedLock>,
        ctx: Arc<Context>,
        started: Instant,
    ) -> BoxFuture<'static, Result<Requeue, Error>>;

    /// Drop whatever this backend keeps for `lock`: another backend serves it now.
    fn forget(&self, lock: &ObjectRef<DistributedLock>, ctx: &Context);
}
