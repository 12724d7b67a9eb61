//! One reconcile of one lock: observe → decide ([`super::observe::plan`]) → write the
//! status → apply ([`super::apply`]).
//!
//! The status write is the single source of truth and carries the resourceVersion
//! that was read, so two controllers can never both grant from the same state; on a
//! conflict the lock is re-read and decided again. Events and claim deletion follow
//! only a successful write. A lock carries the controller's finalizer before anything
//! is granted; a deleted one is decided on as *closing* (nothing granted, every grant
//! revoked) and let go once it has no holder left ([`super::finalizer`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use kube::runtime::controller::Action as Requeue;
use tracing::instrument;

use super::apply::{after_write, publish_warnings};
use super::claims::delete_as_read;
use super::context::Context;
use super::observe::{Plan, plan};
use crate::api::{DistributedLock, DistributedLockStatus};

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
    Stray(#[from] super::strays::Error),
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
    Finalizer(#[from] super::finalizer::Error),
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

/// Reconcile one lock.
#[instrument(skip_all, fields(namespace = lock.namespace().unwrap_or_default(), lock = lock.name_any()))]
pub async fn reconcile(lock: Arc<DistributedLock>, ctx: Arc<Context>) -> Result<Requeue, Error> {
    let started = Instant::now();
    let owner = ctx.clone(); // the turn outlives `ctx`, which the etcd path takes
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
    if lock.metadata.deletion_timestamp.is_some() && !super::finalizer::fences(&lock) {
        return Ok(super::finalizer::retire(&ctx, &lock).await?);
    }
    if let Some(backend) = lock.spec.etcd() {
        let backend = backend.clone();
        return super::etcd::reconcile(lock, ctx, backend).await;
    }
    ctx.mirrors
        .forget(&kube::runtime::reflector::ObjectRef::from_obj(lock.as_ref()));
    let ns = lock.namespace().unwrap_or_default();
    let name = lock.name_any();
    let api: Api<DistributedLock> = Api::namespaced(ctx.client.clone(), &ns);
    let mut current = ctx.written.fresher(&lock);
    // Nothing is granted before the finalizer is on: a deleted lock must outlive its
    // holders' processes (see `finalizer`).
    if !super::finalizer::ensure(&ctx.written, &api, &mut current).await? {
        return Ok(Requeue::await_change());
    }
    for _ in 0..MAX_CONFLICT_RETRIES {
        let plan = plan(&current, &ctx, Instant::now());
        if renewed_unseen(&ctx, &ns, &plan).await? {
            continue; // the watch lags: plan again with what the fresh reads showed
        }
        let seen = (&ctx.client, &*ctx.tracker);
        if super::strays::confirm(seen, &ns, &name, &plan.strays).await? {
            continue; // plan again with what the reads by name showed
        }
        publish_warnings(&ctx, &plan.warnings);
        let trouble = (plan.rejected > 0).then(|| Trouble::rejected(plan.rejected));
        let mut status = with_conditions(&current, plan.decision.status.clone(), trouble.as_ref());
        status.release_url = ctx.release_url.clone();
        status.grant_key = ctx.release_url.as_ref().map(|_| ctx.notices.successors.public_key());
        grants_restart_expiry(&ctx, &ns, &plan);
        grant_directly(&ctx, &current, &plan);
        match write_status(&ctx, &api, &mut current, status).await? {
            Step::Go => {}
            Step::Again => continue,
            Step::Stop => return Ok(Requeue::await_change()),
        }
        after_write(&ctx, &current, &plan);
        ctx.metrics.reconcile_seconds.observe(started.elapsed().as_secs_f64());
        // `current` is the lock before the write: judge by the status written.
        if super::finalizer::lets_go(&current, &plan.decision.status) {
            return Ok(super::finalizer::retire(&ctx, &current).await?);
        }
        if current.metadata.deletion_timestamp.is_some() {
            tracing::info!("deleted: every grant revoked; the lock goes once its holders have stopped");
        }
        // A claim to delete is looked at again once its deletion may have failed, even
        // on a lock with nothing else to wait for.
        let deletes = (!plan.decision.delete_claims.is_empty()).then(|| Instant::now() + super::written::DELETE_RETRY);
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
    if ctx.notices.successors.grant(&grant) {
        ctx.metrics.direct_grants.inc();
        tracing::debug!(claim = s.claim, token = s.fencing_token, "successor told of its grant");
    }
}

/// What a reconcile does after writing a lock's status.
pub enum Step {
    /// Written (or nothing to write): go on.
    Go,
    /// Someone wrote first: decide again from the lock as it is now (re-read).
    Again,
    /// The lock is gone: stop.
    Stop,
}

/// Write `status` over `current`'s (unless unchanged but for its release URL, which
/// goes along with writes made anyway), with `current`'s resourceVersion as the
/// precondition, and remember the write for the next reconcile. On a conflict `current`
/// becomes the lock as re-read.
pub async fn write_status(
    ctx: &Context,
    api: &Api<DistributedLock>,
    current: &mut DistributedLock,
    status: DistributedLockStatus,
) -> Result<Step, Error> {
    if unchanged(current.status.as_ref(), &status) {
        return Ok(Step::Go);
    }
    let name = current.name_any();
    let mut next = current.clone();
    next.status = Some(status);
    match api.replace_status(&name, &PostParams::default(), &next).await {
        Ok(written) => {
            ctx.written.record(current.metadata.resource_version.clone(), written);
            ctx.notices.wrote();
            Ok(Step::Go)
        }
        Err(kube::Error::Api(s)) if s.is_conflict() => {
            *current = api.get(&name).await.map_err(|e| Error::Reread(name.clone(), e))?;
            Ok(Step::Again)
        }
        Err(kube::Error::Api(s)) if s.is_not_found() => {
            ctx.written.forget(current);
            Ok(Step::Stop)
        }
        Err(e) => Err(Error::WriteStatus(name, e)),
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
            // to its client (see `client::session`).
            Ok(_) => ctx.tombstones.bury_expired(&fresh, Instant::now()),
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

/// Whether writing `next` over `current` would change nothing but the release URL: a
/// controller's URL is published with the writes it makes anyway, never alone (a new
/// leader would otherwise rewrite every lock at once).
fn unchanged(current: Option<&DistributedLockStatus>, next: &DistributedLockStatus) -> bool {
    current.is_some_and(|c| {
        c.release_url == next.release_url && c.grant_key == next.grant_key && c == next || {
            let mut c = c.clone();
            c.release_url.clone_from(&next.release_url);
            c.grant_key.clone_from(&next.grant_key);
            &c == next
        }
    })
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

/// Count the error and retry soon.
pub fn error_policy(_lock: Arc<DistributedLock>, err: &Error, ctx: Arc<Context>) -> Requeue {
    tracing::warn!(error = %err, "reconcile failed");
    ctx.metrics.record_error(err.category());
    Requeue::requeue(ERROR_REQUEUE)
}

/// Why a lock is not Ready (besides a name too long for claims).
pub struct Trouble {
    /// The condition's reason.
    pub reason: &'static str,
    /// The condition's message.
    pub message: String,
}

impl Trouble {
    /// `count` claims were rejected (each has a Warning event).
    pub fn rejected(count: usize) -> Self {
        Trouble {
            reason: "ClaimsRejected",
            message: format!(
                "{count} claim(s) rejected (malformed, misplaced or with a forged release): see the \
                 Warning events of the lock's Leases (kubectl get events --field-selector type=Warning)"
            ),
        }
    }

    /// The lock's etcd cannot be reached or read.
    pub fn etcd(why: &str) -> Self {
        Trouble {
            reason: "EtcdUnavailable",
            message: format!(
                "the lock's etcd (spec.backend.etcd) cannot be reached: {why}; holders stop by their \
                 lease, and the status shows the last keys seen"
            ),
        }
    }
}

/// Set observedGeneration and the Ready condition: True while the lock is reconciled,
/// False (with the reason) when the lock is deleted but waits for a held-back slot,
/// when claims cannot name it, or when `trouble` says why.
pub fn with_conditions(
    lock: &DistributedLock,
    mut status: DistributedLockStatus,
    trouble: Option<&Trouble>,
) -> DistributedLockStatus {
    let generation = lock.metadata.generation;
    status.observed_generation = generation;
    let name = lock.name_any();
    let (ready, reason, message) = if let Some(message) = deletion_waits(lock, &status) {
        ("False", "Deleting", message)
    } else if name.len() > crate::protocol::MAX_LOCK_NAME {
        let message = format!(
            "the lock's name has {} characters: claims name their lock in a label value, which \
             holds at most {}; no claim can ask for this lock, so re-create it with a shorter name",
            name.len(),
            crate::protocol::MAX_LOCK_NAME
        );
        ("False", "NameTooLong", message)
    } else if let Some(t) = trouble {
        ("False", t.reason, t.message.clone())
    } else {
        let message = format!(
            "{} of {} slots held, {} waiting",
            status.holders.len(),
            lock.spec.max_holders,
            status.queue.len()
        );
        ("True", "Reconciled", message)
    };
    let previous = status.conditions.iter().find(|c| c.type_ == "Ready").cloned();
    let unchanged = previous
        .as_ref()
        .is_some_and(|p| p.status == ready && p.message == message && p.observed_generation == generation);
    if !unchanged {
        let since = previous.filter(|p| p.status == ready).map(|p| p.last_transition_time);
        status.conditions.retain(|c| c.type_ != "Ready");
        status.conditions.push(Condition {
            type_: "Ready".into(),
            status: ready.into(),
            reason: reason.into(),
            message,
            observed_generation: generation,
            last_transition_time: since.unwrap_or(Time(Timestamp::now())),
        });
    }
    status
}

/// Why a deleted lock is still there, if it waits for its revoked holders to stop (see
/// [`crate::decide::occupied`]): the pods whose processes may still run.
fn deletion_waits(lock: &DistributedLock, status: &DistributedLockStatus) -> Option<String> {
    if lock.metadata.deletion_timestamp.is_none() || !super::finalizer::fences(lock) || !crate::decide::occupied(status)
    {
        return None;
    }
    let pods: Vec<&str> = status.holders.iter().map(|h| h.pod.as_str()).collect();
    Some(format!(
        "deleted: every grant is revoked and nothing is granted; the lock goes once the \
         holder(s) in pod(s) {} have stopped (released, their pods seen stopped, or a lease \
         duration without a renewal of their claims)",
        pods.join(", ")
    ))
}

#[cfg(test)]
mod tests {

    use super::*;

    #[test]
    fn a_status_is_not_written_for_its_release_url_or_grant_key_alone() {
        let old = DistributedLockStatus {
            fencing_token: 3,
            release_url: Some("http://10.0.0.1:8080".into()),
            ..Default::default()
        };
        let mut new = old.clone();
        new.release_url = Some("http://10.0.0.2:8080".into());
        new.grant_key = Some("ab".repeat(32));
        assert!(
            unchanged(Some(&old), &new),
            "a new leader's URL and key wait for a write"
        );
        new.fencing_token = 4;
        assert!(!unchanged(Some(&old), &new), "and goes with the next one");
        assert!(!unchanged(None, &new));
        assert!(unchanged(Some(&new), &new.clone()));
    }

    #[test]
    fn a_deleted_lock_with_holders_left_says_why_it_is_still_there() {
        let status: DistributedLockStatus = serde_json::from_value(serde_json::json!({
            "fencingToken": 2,
            "holders": [
                {"claim": "a", "pod": "pod-a", "podUID": "ua", "fencingToken": 1, "grantedAt": "2024-01-01T00:00:00Z",
                 "revoked": {"reason": "LockDeleted", "at": "2024-01-01T00:00:01Z"}},
            ],
        }))
        .unwrap();
        let ready = |lock: &DistributedLock, status: &DistributedLockStatus| {
            let s = with_conditions(lock, status.clone(), None);
            let c = s.conditions.into_iter().find(|c| c.type_ == "Ready").unwrap();
            (c.status, c.reason, c.message)
        };
        let mut lock = DistributedLock::new("l", crate::api::DistributedLockSpec::default());
        lock.metadata.finalizers = Some(vec![super::super::finalizer::LOCK_FINALIZER.into()]);
        assert_eq!(
            ready(&lock, &status).0,
            "True",
            "a live lock holding a slot back is ready"
        );
        lock.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        let (state, reason, message) = ready(&lock, &status);
        assert_eq!((state.as_str(), reason.as_str()), ("False", "Deleting"));
        assert!(message.contains("pod-a"), "{message}");
        assert_eq!(
            ready(&lock, &DistributedLockStatus::default()).1,
            "Reconciled",
            "with no holder left, a deleted lock goes without saying so"
        );
        lock.metadata.finalizers = None;
        assert_eq!(
            ready(&lock, &status).1,
            "Reconciled",
            "a deleted lock without the fence (or on etcd) is let go at once: it waits for nothing"
        );
    }
}
