//! The Kubernetes backend: claims are Leases, and the controller decides
//! ([`crate::decide`]). One reconcile is one [`turn`]: observe ([`observe::plan`]) →
//! confirm expiries with fresh reads and look up strays → write the status
//! ([`crate::controller::status`]) → apply ([`apply::after_write`]: events, claim
//! deletion), written once against the I/O it names, which the controller gives it here
//! ([`live`]) and the system model in `explore::system`. Events and claim deletion
//! follow only a successful write. A lock carries the controller's finalizer before
//! anything is granted; a deleted one is decided on as *closing* (nothing granted, every
//! grant revoked) and let go once it has no holder left ([`crate::controller::finalizer`]).

pub(crate) mod apply;
pub(crate) mod claim_grant;
pub(crate) mod claim_io;
pub(crate) mod claims;
pub(crate) mod live;
pub(crate) mod notices;
pub(crate) mod observe;
pub(crate) mod state;
pub(crate) mod strays;
pub(crate) mod successors;
pub(crate) mod sweep;
pub(crate) mod turn;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action as Requeue;
use kube::runtime::reflector::ObjectRef;

use self::live::LiveIo;
use self::turn::Ended;
use crate::api::DistributedLock;
use crate::controller::backend::Backend;
use crate::controller::context::Context;
use crate::controller::error::Error;

/// The Kubernetes backend: every lock without `spec.backend`.
pub(crate) struct Kube;

impl Backend for Kube {
    fn serves(&self, lock: &DistributedLock) -> bool {
        lock.spec.etcd().is_none()
    }

    fn reconcile(
        &self,
        lock: Arc<DistributedLock>,
        ctx: Arc<Context>,
        started: Instant,
    ) -> BoxFuture<'static, Result<Requeue, Error>> {
        Box::pin(reconcile(lock, ctx, started))
    }

    fn forget(&self, _lock: &ObjectRef<DistributedLock>, _ctx: &Context) {
        // Nothing is kept per lock apart from the caches, which follow the watches.
    }
}

/// Reconcile a lock whose claims are Leases: one [`turn`] with the controller's I/O.
async fn reconcile(lock: Arc<DistributedLock>, ctx: Arc<Context>, started: Instant) -> Result<Requeue, Error> {
    let ns = lock.namespace().unwrap_or_default();
    let io = LiveIo {
        ctx: &ctx,
        api: Api::namespaced(ctx.client.clone(), &ns),
        wrote_on_claim: Default::default(),
    };
    let current = ctx.written.fresher(&lock);
    let ended = turn::turn(&io, current).await?;
    ctx.metrics.reconcile_seconds.observe(started.elapsed().as_secs_f64());
    Ok(match ended {
        Ended::AwaitChange => Requeue::await_change(),
        Ended::LetGo(lock) => crate::controller::finalizer::retire(&ctx, &lock).await?,
        Ended::Requeue(None) => Requeue::await_change(),
        Ended::Requeue(Some(at)) => {
            Requeue::requeue(at.saturating_duration_since(Instant::now()) + Duration::from_millis(10))
        }
    })
}
