//! One turn of a lock whose claims are Leases: the controller's orchestration around the
//! decide core, written once against the I/O it names ([`TurnIo`]), so that the
//! controller that ships and the system model (`explore::system`) run the same steps in
//! the same order. The controller gives it the API server, its caches and its clock
//! ([`super::live`]); the model, its simulated ones.
//!
//! A turn: the finalizer on before anything is granted; then, until a write goes
//! through (at most [`MAX_CONFLICT_RETRIES`] times): plan on the caches
//! ([`super::observe::plan`]); confirm each expiry of a claim the status names by a
//! fresh read and a deletion under that read's resourceVersion ([`renewed_unseen`]);
//! look each stray up by name ([`strays`]); restart the expiry of the claims it grants;
//! tell the designated successor of its grant if the *stored* status designates it
//! and the grant leaves it alone in the lock (and, if it learns on a claim, let it
//! start before the status write);
//! write the status under the resourceVersion read; then apply (deletions, events) and
//! let a deleted lock go once nothing holds it.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::DeleteParams;

use super::claim_io::ClaimIo;
use super::claims::delete_as_read;
use super::observe::{Plan, Warning};
use crate::api::{DistributedLock, DistributedLockStatus};
use crate::controller::error::{Error, MAX_CONFLICT_RETRIES};
use crate::controller::status::{Step, Trouble, with_conditions};
use crate::mutant::{Mutant, on as mutant};
use crate::protocol::Handover;
use crate::protocol::grant::Grant;

/// How soon a claim this turn deletes is looked at again, in case its deletion failed.
pub const DELETE_RETRY: Duration = crate::controller::cache::written::DELETE_RETRY;

/// What a turn reads, writes and remembers beyond [`ClaimIo`], on its clock.
pub trait TurnIo: ClaimIo {
    /// The wall clock, for what the status says when (informational).
    fn wall(&self) -> Timestamp;
    /// Plan on the caches as they are now ([`super::observe::plan`] on this side's
    /// caches and memory).
    fn plan(&self, lock: &DistributedLock, now: Self::Moment) -> Plan<Self::Moment>;
    /// Remember `lease` (as read just before its deletion) as expired by this controller.
    fn bury_expired(&self, lease: &Lease, now: Self::Moment);
    /// Put the finalizer on `current` ([`crate::controller::finalizer::ensure`]):
    /// whether the lock is still there.
    fn ensure_finalizer(&self, current: &mut DistributedLock) -> impl Future<Output = Result<bool, Error>> + Send;
    /// Write `status` over `current` under its resourceVersion
    /// ([`crate::controller::status::write_status`]).
    fn write_status(
        &self,
        current: &mut DistributedLock,
        status: DistributedLockStatus,
    ) -> impl Future<Output = Result<Step, Error>> + Send;
    /// Tell the designated successor of its grant (before the status write);
    /// `designated_by` is the `grantKey` of the stored status that designated it (the
    /// key its client checks the grant by), `handover` the handover by which that status
    /// lets the successor take the holder's release mark as its grant, if any (then a
    /// successor that watches for the mark need not be told).
    fn grant_directly(&self, grant: &Grant<'_>, designated_by: Option<&str>, handover: Option<Handover<'_>>);
    /// Between telling a successor and the status write: the controller lets a
    /// successor told on a claim (its own, or its predecessor's mark) start first
    /// ([`super::claim_grant::CLAIM_GRANT_SETTLE`]).
    /// Safe to put off: the stored status designates the successor, so every decision
    /// counts it as told meanwhile.
    fn settle_after_tell(&self) -> impl Future<Output = ()> + Send;
    /// Where this replica takes release notices, and its grant key, for the status.
    fn published(&self) -> (Option<String>, Option<String>);
    /// Publish the plan's warnings on claims.
    fn publish_warnings(&self, warnings: &[Warning]);
    /// After a successful write: events, metrics, claim deletions.
    fn after_write(&self, lock: &DistributedLock, plan: &Plan<Self::Moment>);
    /// Count an error the turn rode out.
    fn record_error(&self, e: &Error);
}

/// How a turn ended.
#[derive(Debug)]
pub enum Ended<T> {
    /// Nothing to wait for but a change.
    AwaitChange,
    /// Look again at this moment, or on a change.
    Requeue(Option<T>),
    /// A deleted lock holds nothing any more: let it go (this is the lock as written).
    LetGo(Box<DistributedLock>),
}

/// One turn of `current` (the freshest this controller knows of the lock).
pub async fn turn<IO: TurnIo>(io: &IO, mut current: DistributedLock) -> Result<Ended<IO::Moment>, Error> {
    let (ns, name) = (current.namespace().unwrap_or_default(), current.name_any());
    // Nothing is granted before the finalizer is on: a deleted lock must outlive its
    // holders' processes (see `finalizer`).
    if !io.ensure_finalizer(&mut current).await? {
        return Ok(Ended::AwaitChange);
    }
    for _ in 0..MAX_CONFLICT_RETRIES {
        let plan = io.plan(&current, io.now());
        if renewed_unseen(io, &ns, &plan).await? {
            continue; // the watch lags: plan again with what the fresh reads showed
        }
        if super::strays::confirm(io, (&ns, &name), &plan.strays).await? {
            continue; // plan again with what the reads by name showed
        }
        io.publish_warnings(&plan.warnings);
        let trouble = (plan.rejected > 0).then(|| Trouble::rejected(plan.rejected));
        let mut status = with_conditions(&current, plan.decision.status.clone(), trouble.as_ref(), io.wall());
        (status.release_url, status.grant_key) = io.published();
        grants_restart_expiry(io, &ns, &plan);
        grant_directly(io, &current, &plan);
        io.settle_after_tell().await;
        if mutant(Mutant::StatusWithoutVersion) {
            current.metadata.resource_version = None; // written whatever was written since
        }
        match io.write_status(&mut current, status).await? {
            Step::Written | Step::Unchanged => {}
            Step::Again => continue,
            Step::Stop => return Ok(Ended::AwaitChange),
        }
        io.after_write(&current, &plan);
        // `current` is the lock before the write: judge by the status written.
        if crate::controller::finalizer::lets_go(&current, &plan.decision.status) {
            return Ok(Ended::LetGo(Box::new(current)));
        }
        if current.metadata.deletion_timestamp.is_some() {
            tracing::info!("deleted: every grant revoked; the lock goes once its holders have stopped");
        }
        // A claim to delete is looked at again once its deletion may have failed, even
        // on a lock with nothing else to wait for.
        let deletes = (!plan.decision.delete_claims.is_empty()).then(|| io.now() + DELETE_RETRY);
        return Ok(Ended::Requeue(plan.next_deadline.into_iter().chain(deletes).min()));
    }
    Err(Error::Conflicts(name))
}

/// A claim granted counts its expiry from its grant: a waiter renews slowly (its wait
/// lease), so as a holder it has a whole lease to renew. Done before the status write,
/// so a write whose answer is lost (applied or not) leaves no new holder judged by its
/// last waiting renewal; if the write fails, a waiter's expiry was only put off.
fn grants_restart_expiry<IO: TurnIo>(io: &IO, ns: &str, plan: &Plan<IO::Moment>) {
    let now = io.now();
    io.tracker(|tracker| {
        for a in &plan.decision.actions {
            if matches!(a.kind, crate::decide::ActionKind::Granted(_)) {
                tracker.restart_expiry(ns, &a.claim, now);
            }
        }
    });
}

/// Tell the successor `current`'s status designated that the plan grants it, before
/// the status write that records the grant (see [`crate::protocol::grant`]). `current`
/// is a status the API server stored, so its designation binds every later decision.
fn grant_directly<IO: TurnIo>(io: &IO, current: &DistributedLock, plan: &Plan<IO::Moment>) {
    let (ns, lock) = (current.namespace().unwrap_or_default(), current.name_any());
    let lock_uid = current.metadata.uid.as_deref().unwrap_or_default();
    let designated_by = current.status.as_ref().and_then(|s| s.grant_key.as_deref());
    let stored = current.status.as_ref();
    let tell = |claim: &str, fencing_token: i64| {
        let grant = Grant {
            namespace: &ns,
            lock: &lock,
            lock_uid,
            claim,
            fencing_token,
        };
        // URL or not: a successor that asks for the handover and is not waiting over
        // HTTP (`io.grant_directly` tells one that is) watches for the holder's mark
        // where no URL is published or it expects no answer from it; a mark on the
        // holder's claim means the holder's notice did not get through either.
        let handover = stored
            .and_then(|s| crate::protocol::handover(current.spec.max_holders, s, claim))
            .filter(|h| h.token == fencing_token);
        io.grant_directly(&grant, designated_by, handover);
    };
    if mutant(Mutant::DirectGrantBeforeStored) {
        // Every grant of the plan, designated in the stored status or not.
        for a in &plan.decision.actions {
            if let crate::decide::ActionKind::Granted(token) = a.kind {
                tell(&a.claim, token);
            }
        }
        return;
    }
    let Some(s) = current.status.as_ref().and_then(|s| s.successor.as_ref()) else {
        return;
    };
    if !alone_in_the_lock(plan) && !mutant(Mutant::DirectGrantBesideHolders) {
        return; // the status write grants it, under the maxHolders stored then
    }
    let granted = crate::decide::ActionKind::Granted(s.fencing_token);
    if plan
        .decision
        .actions
        .iter()
        .any(|a| a.claim == s.claim && a.kind == granted)
    {
        tell(&s.claim, s.fencing_token);
    }
}

/// Whether the plan leaves one holder entry in the lock (revoked ones count: they may
/// still run); with the successor's grant checked below, that entry is the
/// successor's. Only such a grant is sent before the status write: it is within any
/// `maxHolders`. A grant beside other holders is judged by the `maxHolders`
/// of the lock as this controller's cache shows it, which the user may have lowered
/// since; the status write, made under the resourceVersion read, fails then, but a
/// grant already sent would stand (the model found a successor started beside the
/// holder after `maxHolders` went from 2 to 1: `explore::system`, menu `mw`).
fn alone_in_the_lock<M>(plan: &Plan<M>) -> bool {
    plan.decision.status.holders.len() == 1
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
async fn renewed_unseen<IO: TurnIo>(io: &IO, ns: &str, plan: &Plan<IO::Moment>) -> Result<bool, Error> {
    let mut renewed = false;
    for claim in &plan.expired {
        let name = claim.name_any();
        if mutant(Mutant::ExpiryWithoutFreshRead) {
            // Deleted on the cache's word, whatever was written since.
            match io.delete_claim(ns, &name, DeleteParams::default()).await {
                Ok(()) => io.bury_expired(claim, io.now()),
                Err(e) => return Err(Error::Expire(name, e)),
            }
            continue;
        }
        let fresh = read_claim(io, ns, &name).await?;
        if saw_renewal(io, claim, &fresh) {
            renewed = true;
            continue;
        }
        match io.delete_claim(ns, &name, delete_as_read(&fresh)).await {
            // Deleted, or being deleted (something holds the object back): either way
            // a renewal from now on is refused or, on a terminating object, no renewal
            // to its client (see `KubeRenewer` in `client::k8s::lease`).
            Ok(()) => io.bury_expired(&fresh, io.now()),
            Err(kube::Error::Api(s)) if s.is_conflict() => {
                // Written since the read: look again (a release mark is no renewal).
                let again = read_claim(io, ns, &name).await?;
                saw_renewal(io, claim, &again);
                renewed = true;
            }
            Err(kube::Error::Api(s)) if s.is_not_found() => return Err(Error::ClaimGoneUnseen(name)),
            Err(e) => {
                // Not expired without the deletion: postpone this claim's expiry by a
                // lease, and let the rest of the lock go on.
                let e = Error::Expire(name.clone(), e);
                tracing::warn!(error = %e, "the claim's expiry is postponed by a lease");
                io.record_error(&e);
                let now = io.now();
                io.tracker(|t| t.restart_expiry(ns, &name, now));
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
async fn read_claim<IO: TurnIo>(io: &IO, ns: &str, name: &str) -> Result<Lease, Error> {
    match io.read_claim(ns, name).await {
        Ok(Some(fresh)) => Ok(fresh),
        Ok(None) => Err(Error::ClaimGoneUnseen(name.to_string())),
        Err(e) => Err(Error::ConfirmExpiry(name.to_string(), e)),
    }
}

/// Whether `fresh` shows a renewal of `claim` the watch did not; if so it counts as
/// seen now.
fn saw_renewal<IO: TurnIo>(io: &IO, claim: &Arc<Lease>, fresh: &Lease) -> bool {
    let now = io.now();
    io.tracker(|tracker| {
        let renewed = tracker.renewed_since(claim, fresh);
        if renewed {
            tracing::warn!(
                claim = claim.name_any(),
                "the claim watch lags: a renewal it did not show was read afresh"
            );
            tracker.observe(fresh, now);
        }
        renewed
    })
}
