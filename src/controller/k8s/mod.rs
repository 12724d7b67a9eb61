//! The Kubernetes backend: claims are Leases, and the controller decides
//! ([`crate::decide`]). One reconcile: observe ([`observe::plan`]) → confirm expiries
//! with fresh reads and look up strays → write the status ([`crate::controller::status`])
//! → apply ([`apply::after_write`]: events, claim deletion). Events and claim deletion
//! follow only a successful write. A lock carries the controller's finalizer before
//! anything is granted; a deleted one is decided on as *closing* (nothing granted, every
//! grant revoked) and let go once it has no holder left ([`crate::controller::finalizer`]).

pub(crate) mod apply;
pub(crate) mod claims;
pub(crate) mod direct;
pub(crate) mod notices;
pub(crate) mod observe;
pub(crate) mod state;
pub(crate) mod strays;
pub(crate) mod sweep;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action as Requeue;
use kube::runtime::reflector::ObjectRef;

use self::apply::after_write;
use self::claims::delete_as_read;
use self::observe::{Plan, plan};
use crate::api::DistributedLock;
use crate::controller::backend::Backend;
use crate::controller::context::Context;
use crate::controller::error::{Error, MAX_CONFLICT_RETRIES};
use crate::controller::events::publish_warnings;
use crate::controller::status::{Step, Trouble, with_conditions, write_status};

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

/// Reconcile a lock whose claims are Leases.
async fn reconcile(lock: Arc<DistributedLock>, ctx: Arc<Context>, started: Instant) -> Result<Requeue, Error> {
    let ns = lock.namespace().unwrap_or_default();
    let name = lock.name_any();
    let api: Api<DistributedLock> = Api::namespaced(ctx.client.clone(), &ns);
    let mut current = ctx.written.fresher(&lock);
    // Nothing is granted before the finalizer is on: a deleted lock must outlive its
    // holders' processes (see `finalizer`).
    if !crate::controller::finalizer::ensure(&ctx.written, &api, &mut current).await? {
        return Ok(Requeue::await_change());
    }
    for _ in 0..MAX_CONFLICT_RETRIES {
        let plan = plan(&current, &ctx, Instant::now());
        if renewed_unseen(&ctx, &ns, &plan).await? {
            continue; // the watch lags: plan again with what the fresh reads showed
        }
        let seen = (&ctx.client, &*ctx.tracker);
        if crate::controller::k8s::strays::confirm(seen, &ns, &name, &plan.strays).await? {
            continue; // plan again with what the reads by name showed
        }
        publish_warnings(&ctx, &plan.warnings);
        let trouble = (plan.rejected > 0).then(|| Trouble::rejected(plan.rejected));
        let mut status = with_conditions(&current, plan.decision.status.clone(), trouble.as_ref());
        status.release_url = ctx.k8s.release_url.clone();
        status.grant_key = ctx
            .k8s
            .release_url
            .as_ref()
            .map(|_| ctx.k8s.notices.successors.public_key());
        grants_restart_expiry(&ctx, &ns, &plan);
        grant_directly(&ctx, &current, &plan);
        match write_status(&ctx, &api, &mut current, status).await? {
            Step::Written => ctx.k8s.notices.wrote(), // answers waiting for a write look again
            Step::Unchanged => {}
            Step::Again => continue,
            Step::Stop => return Ok(Requeue::await_change()),
        }
        after_write(&ctx, &current, &plan);
        ctx.metrics.reconcile_seconds.observe(started.elapsed().as_secs_f64());
        // `current` is the lock before the write: judge by the status written.
        if crate::controller::finalizer::lets_go(&current, &plan.decision.status) {
            return Ok(crate::controller::finalizer::retire(&ctx, &current).await?);
        }
        if current.metadata.deletion_timestamp.is_some() {
            tracing::info!("deleted: every grant revoked; the lock goes once its holders have stopped");
        }
        // A claim to delete is looked at again once its deletion may have failed, even
        // on a lock with nothing else to wait for.
        let deletes = (!plan.decision.delete_claims.is_empty())
            .then(|| Instant::now() + crate::controller::cache::written::DELETE_RETRY);
        let requeue = match plan.next_deadline.into_iter().chain(deletes).min() {
            Some(at) => Requeue::requeue(at.saturating_duration_since(Instant::now()) + Duration::from_millis(10)),
            None => Requeue::await_change(),
        };
        return Ok(requeue);
    }
    Err(Error::Conflicts(name))
}

/// A claim granted counts its expiry from its grant: a waiter renews slowly (its wait
/// lease), so as a holder it has a whole lease to renew. Done before the status write,
/// so a write whose answer is lost (applied or not) leaves no new holder judged by its
/// last waiting renewal; if the write fails, a waiter's expiry was only put off.
fn grants_restart_expiry(ctx: &Context, ns: &str, plan: &Plan) {
    let now = Instant::now();
    let mut tracker = ctx.tracker.lock().expect("tracker lock poisoned");
    for a in &plan.decision.actions {
        if matches!(a.kind, crate::decide::ActionKind::Granted(_)) {
            tracker.restart_expiry(ns, &a.claim, now);
        }
    }
}

/// Tell the successor `current`'s status designated that the plan grants it, before
/// the status write that records the grant (see [`crate::protocol::grant`]). `current`
/// is a status the API server stored, so its designation binds every later decision.
fn grant_directly(ctx: &Context, current: &DistributedLock, plan: &Plan) {
    let Some(s) = current.status.as_ref().and_then(|s| s.successor.as_ref()) else {
        return;
    };
    let granted = crate::decide::ActionKind::Granted(s.fencing_token);
    if !plan
        .decision
        .actions
        .iter()
        .any(|a| a.claim == s.claim && a.kind == granted)
    {
        return;
    }
    let (ns, lock) = (current.namespace().unwrap_or_default(), current.name_any());
    let grant = crate::protocol::grant::Grant {
        namespace: &ns,
        lock: &lock,
        lock_uid: current.metadata.uid.as_deref().unwrap_or_default(),
        claim: &s.claim,
        fencing_token: s.fencing_token,
    };
    if ctx.k8s.notices.successors.grant(&grant) {
        ctx.metrics.direct_grants.inc();
        tracing::debug!(claim = s.claim, token = s.fencing_token, "successor told of its grant");
    }
}

/// Expiry is never judged from a view that may be stale: the claims this plan expires
/// are read afresh (a quorum read), and a claim renewed where the watch could not show
/// it (a watch in backoff, or stalled on a half-open connection, after an outage of
/// this controller) counts as renewed now. A claim the read confirms expired is then
/// deleted under that read's resourceVersion, before any status write frees its slot:
/// a renewal that lands after the read makes the deletion fail (and counts as seen
/// now), one sent later finds no claim, so no client holds on a renewal this controller
/// did not see (see [`crate::protocol`]'s timing contract). Returns whether any claim
/// was renewed (then plan again).
async fn renewed_unseen(ctx: &Context, ns: &str, plan: &Plan) -> Result<bool, Error> {
    let leases: Api<Lease> = Api::namespaced(ctx.client.clone(), ns);
    let mut renewed = false;
    for claim in &plan.expired {
        let name = claim.name_any();
        let fresh = read_claim(&leases, &name).await?;
        if saw_renewal(ctx, claim, &fresh) {
            renewed = true;
            continue;
        }
        match leases.delete(&name, &delete_as_read(&fresh)).await {
            // Deleted, or being deleted (something holds the object back): either way
            // a renewal from now on is refused or, on a terminating object, no renewal
            // to its client (see `KubeRenewer` in `client::k8s::claim`).
            Ok(_) => ctx.k8s.tombstones.bury_expired(&fresh, Instant::now()),
            Err(kube::Error::Api(s)) if s.is_conflict() => {
                // Written since the read: look again (a release mark is no renewal).
                let again = read_claim(&leases, &name).await?;
                saw_renewal(ctx, claim, &again);
                renewed = true;
            }
            Err(kube::Error::Api(s)) if s.is_not_found() => return Err(Error::ClaimGoneUnseen(name)),
            Err(e) => {
                // Not expired without the deletion: postpone this claim's expiry by a
                // lease, and let the rest of the lock go on.
                let e = Error::Expire(name.clone(), e);
                tracing::warn!(error = %e, "the claim's expiry is postponed by a lease");
                ctx.metrics.record_error(e.category());
                let mut tracker = ctx.tracker.lock().expect("tracker lock poisoned");
                tracker.restart_expiry(ns, &name, Instant::now());
                renewed = true;
            }
        }
    }
    Ok(renewed)
}

/// A claim read afresh (a quorum read); one gone and not yet shown gone by the watch
/// may have been renewed until just before, so it is no expired claim: wait for the
/// watch to show the deletion (then a live holder's slot is held back as for a forced
/// release).
async fn read_claim(leases: &Api<Lease>, name: &str) -> Result<Lease, Error> {
    match leases.get_opt(name).await {
        Ok(Some(fresh)) => Ok(fresh),
        Ok(None) => Err(Error::ClaimGoneUnseen(name.to_string())),
        Err(e) => Err(Error::ConfirmExpiry(name.to_string(), e)),
    }
}

/// Whether `fresh` shows a renewal of `claim` the watch did not; if so it counts as
/// seen now.
fn saw_renewal(ctx: &Context, claim: &Lease, fresh: &Lease) -> bool {
    let mut tracker = ctx.tracker.lock().expect("tracker lock poisoned");
    let renewed = tracker.renewed_since(claim, fresh);
    if renewed {
        tracing::warn!(
            claim = claim.name_any(),
            "the claim watch lags: a renewal it did not show was read afresh"
        );
        tracker.observe(fresh, Instant::now());
    }
    renewed
}
