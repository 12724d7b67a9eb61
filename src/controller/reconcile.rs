//! One reconcile of one lock, whatever its backend: take the lock's turn, wait until
//! the caches have synced, let a deleted lock without the fence go, and hand the lock to
//! the backend that serves it ([`BACKENDS`], each a [`Backend`]); the others forget it.
//! Errors are counted and requeued here ([`error_policy`]); prompted reconciles
//! ([`crate::controller::prompt`]) run here too.

use std::sync::Arc;
use std::time::Instant;

use kube::ResourceExt;
use kube::runtime::controller::Action as Requeue;
use kube::runtime::reflector::{ObjectRef, Store};
use tokio::sync::{OwnedSemaphorePermit, mpsc};
use tracing::instrument;

use crate::api::DistributedLock;
use crate::controller::backend::Backend;
use crate::controller::context::Context;
use crate::controller::error::{ERROR_REQUEUE, Error};

/// The backends, asked in this order which serves a lock: the first that does.
pub(crate) const BACKENDS: &[&dyn Backend] = &[&crate::controller::etcd::Etcd, &crate::controller::k8s::Kube];

/// Reconcile one lock.
#[instrument(skip_all, fields(namespace = lock.namespace().unwrap_or_default(), lock = lock.name_any()))]
pub async fn reconcile(lock: Arc<DistributedLock>, ctx: Arc<Context>) -> Result<Requeue, Error> {
    let started = Instant::now();
    let owner = ctx.clone(); // the turn outlives `ctx`, which the backend takes
    let _turn = owner
        .turns
        .of(&kube::runtime::reflector::ObjectRef::from_obj(lock.as_ref()))
        .lock()
        .await;
    if ctx.synced.clone().wait_for(|synced| *synced).await.is_err() {
        // The controller stopped (its caches' task is gone) before they synced: decide
        // nothing on caches that may lack claims and pods.
        return Ok(Requeue::await_change());
    }
    // A deleted lock with the finalizer is decided on (closing) until it has no holder
    // left; one without has nothing to fence.
    if lock.metadata.deletion_timestamp.is_some() && !crate::controller::finalizer::fences(&lock) {
        return Ok(crate::controller::finalizer::retire(&ctx, &lock).await?);
    }
    let at = ObjectRef::from_obj(lock.as_ref());
    let chosen = serving(&lock);
    for (_, other) in BACKENDS.iter().enumerate().filter(|(i, _)| *i != chosen) {
        other.forget(&at, &ctx);
    }
    let backend = BACKENDS[chosen];
    backend.reconcile(lock, ctx, started).await
}

/// The index in [`BACKENDS`] of the backend that serves `lock`: the first that does
/// (by index: the backends are zero-sized, so their references cannot tell them apart).
fn serving(lock: &DistributedLock) -> usize {
    BACKENDS
        .iter()
        .position(|b| b.serves(lock))
        .expect("the Kubernetes backend serves every lock the others do not")
}

/// Count the error and retry soon.
pub fn error_policy(_lock: Arc<DistributedLock>, err: &Error, ctx: Arc<Context>) -> Requeue {
    tracing::warn!(error = %err, "reconcile failed");
    ctx.metrics.record_error(err.category());
    Requeue::requeue(ERROR_REQUEUE)
}

/// Run the prompted reconciles of the locks `store` holds, until the senders go;
/// prompts beyond [`crate::controller::prompt::MAX_PROMPTS`] at once go to `scheduled`,
/// the scheduler's triggers. The reconciles it started end with it (dropped, like the
/// scheduled ones when the controller stops), so none runs on for a controller that
/// stopped leading.
pub(crate) async fn serve_prompts(
    prompts: mpsc::UnboundedReceiver<ObjectRef<DistributedLock>>,
    store: Store<DistributedLock>,
    ctx: Arc<Context>,
    scheduled: mpsc::UnboundedSender<ObjectRef<DistributedLock>>,
) {
    let mut running = tokio::task::JoinSet::new();
    crate::controller::prompt::route(prompts, store, scheduled, move |lock, permit| {
        while running.try_join_next().is_some() {} // reap the finished
        running.spawn(prompted(lock, ctx.clone(), permit));
    })
    .await
}

async fn prompted(lock: Arc<DistributedLock>, ctx: Arc<Context>, _permit: OwnedSemaphorePermit) {
    // Errors and requeues are the scheduled reconcile's, which follows.
    if let Err(e) = reconcile(lock, ctx).await {
        tracing::debug!(error = %e, "prompted reconcile failed; the scheduled one follows");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::DistributedLockSpec;

    #[test]
    fn each_lock_is_served_by_one_backend_and_the_other_forgets_it() {
        let kube = DistributedLock::new("l", DistributedLockSpec::default());
        let etcd_spec = DistributedLockSpec {
            backend: serde_json::from_value(serde_json::json!({"etcd": {"endpoints": ["http://127.0.0.1:2379"]}}))
                .unwrap(),
            ..Default::default()
        };
        let etcd = DistributedLock::new("l", etcd_spec);
        let (k, e) = (serving(&kube), serving(&etcd));
        assert_ne!(k, e, "a lock on etcd and one on Leases are served apart");
        assert!(BACKENDS[k].serves(&kube) && !BACKENDS[e].serves(&kube));
        assert!(BACKENDS[e].serves(&etcd) && !BACKENDS[k].serves(&etcd));
    }
}
