//! Waiting for a claim Lease's grant: the lock's status, read from its watch, says
//! where the claim stands; a direct grant may come first ([`super::grant_wait`]). Every
//! status is checked against the claim as this process wrote it before anything in it
//! is acted on ([`crate::protocol::record`]).

use tokio::time::Instant;

use super::grant_wait::DirectWait;
use super::lease::KubeClaim;
use super::notice::{self, NoticeTarget};
use super::watch::{LockWatch, Seen};
use crate::api::{DistributedLock, RefuseReason};
use crate::client::backend::{Mode, Request};
use crate::client::progress::{Progress, UNQUEUED_NOTICE};
use crate::client::session::{LostReason, Session};
use crate::client::{Error, State};
use crate::protocol::record::{self, Claimed, Tampered, Written};
use crate::protocol::{granted_token, held_back, names_claim};

/// How a wait ended, short of an error.
pub(super) enum Outcome {
    Granted(i64),
    /// A try found the claim queued behind others.
    WouldBlock,
    /// Listed as a revoked holder whose slot is held back, though never granted.
    HeldBack,
    /// The status records the claim otherwise than this process wrote it.
    Tampered(Tampered),
    /// The claim was queued, and a later status names it no more, ungranted.
    Dropped,
    /// Granted, but the claim was gone before this process could act on the grant: it
    /// saw the grant too late (paused, or its watch delayed) and the controller expired
    /// the claim meanwhile. Never acted on.
    Lapsed,
    /// The claim was gone by the notice time, and no status read had placed it:
    /// garbage-collected (its ownerReference names no existing pod), or placed, granted
    /// and expired while this process read nothing (paused). Claimed anew once; a
    /// second in a row is [`Error::ClaimCollected`].
    Vanished,
}

impl Outcome {
    /// Whether the claim is withdrawn, never acted on, and the process claims anew (at
    /// the back of the queue); says why in the log.
    pub fn claims_anew(&self, claim: &str) -> bool {
        match self {
            // The lock holds a slot back for this claim as if its process might run (a
            // deleted lock revoking the successor it had designated, or a forged mark),
            // yet it was never granted: a valid release says so, freeing the slot
            // (unless the controller deleted the claim first: then the slot is held back
            // its lease).
            Outcome::HeldBack => {
                tracing::info!(claim, "the claim is held back though never granted: claiming anew")
            }
            // Dropped from the queue while its process waits (its claim expired or
            // hidden by someone who may patch Leases).
            Outcome::Dropped => tracing::warn!(claim, "the claim left the queue without a grant: claiming anew"),
            // Its grant expired unseen; nothing ran under it, so the process waits on.
            Outcome::Lapsed => tracing::warn!(
                claim,
                "the grant lapsed before this process could act on it (its claim is gone): claiming anew"
            ),
            Outcome::Vanished => tracing::warn!(
                claim,
                "the claim is gone though no status read placed it (garbage-collected, or granted and expired \
                 while this process read nothing): claiming anew (a second such claim in a row, or a try's, is an error)"
            ),
            // Someone changed the claim before the controller recorded it: a grant under
            // that record is not this process's to act on (see `protocol::record`).
            Outcome::Tampered(field) => tracing::warn!(
                claim,
                field = field.field(),
                "{field}: withdrawing the claim without acting on it, and claiming anew"
            ),
            Outcome::Granted(_) | Outcome::WouldBlock => return false,
        }
        true
    }
}

/// What this process wrote on its claim: what every status must record for it.
pub(super) fn claimed(request: &Request<'_>, session: &Session, claim: &KubeClaim) -> Claimed {
    Claimed {
        pod: request.identity.name.clone(),
        pod_uid: request.identity.uid.clone(),
        release_hash: Some(claim.release_hash()),
        wait_hash: Some(crate::protocol::release::hash_of(&claim.wait_proof())),
        lease_seconds: i32::try_from(session.lease.as_secs()).unwrap_or(i32::MAX),
    }
}

/// What one waiting claim has learnt so far.
struct Wait<'a> {
    request: &'a Request<'a>,
    session: &'a Session,
    claim: &'a KubeClaim,
    /// The claim as this process wrote it.
    wrote: Written<'a>,
    proof: &'a str,
    started: Instant,
    progress: Progress<'a>,
    direct: DirectWait,
    /// Why the controller refuses this claim, as its status last said.
    refused: Option<RefuseReason>,
    /// Whether a status has named the claim (queued, or held).
    was_placed: bool,
    /// When to read the claim back again while it stays unplaced after the notice
    /// time, and how many times it was read back since.
    read_back_at: (Option<Instant>, u32),
    /// Where release notices go, as the latest status said.
    notices_to: Option<NoticeTarget>,
}

/// Wait until `claim` (kept by `session`) is granted, or the wait ends otherwise, as
/// `request.mode` says; `exists` is whether the lock existed before the claim was made.
pub(super) async fn wait_grant(
    request: &Request<'_>,
    events: &mut LockWatch,
    (session, claim): (&Session, &KubeClaim),
    (exists, wrote): (bool, &Claimed),
) -> Result<Outcome, Error> {
    let proof = claim.wait_proof();
    let started = Instant::now();
    let mut wait = Wait {
        request,
        session,
        claim,
        wrote: wrote.written(),
        proof: &proof,
        started,
        progress: Progress::new(request.listeners, &session.claim, started, exists),
        direct: DirectWait::watching(claim.watches()),
        refused: None,
        was_placed: false,
        read_back_at: (None, 0),
        notices_to: None,
    };
    let until = request.mode.until();
    loop {
        let lock = tokio::select! {
            seen = events.next() => match seen {
                Some(Seen::Lock(lock)) => lock,
                Some(Seen::Gone) => {
                    wait.lock_gone()?;
                    continue;
                }
                None => return Err(Error::Watch(request.name.to_string())),
            },
            token = wait.direct.granted() => {
                // Notices go where the latest status said, checked by its key.
                claim.set_notice_target(wait.notices_to.clone());
                return Ok(Outcome::Granted(token));
            }
            _ = session.lost() => return wait.claim_lost(),
            _ = at(until) => return Err(request.mode.timed_out()),
            _ = at(wait.progress.notice_at()) => match wait.notice_due().await {
                Some(ended) => return ended,
                None => continue,
            },
            _ = at(wait.read_back_at.0) => match wait.read_back_again().await {
                Some(ended) => return ended,
                None => continue,
            },
        };
        if let Some(ended) = wait.seen(&lock).await {
            return ended;
        }
    }
}

/// How long after its `n`th read-back past the notice time an unplaced claim is read
/// back again: [`UNQUEUED_NOTICE`], doubling to a minute (one GET a minute at most for a
/// claim no controller places, as while none runs).
fn read_back_wait(n: u32) -> std::time::Duration {
    UNQUEUED_NOTICE
        .saturating_mul(1 << n.min(4))
        .min(std::time::Duration::from_secs(60))
}

/// Completes at `t`; never when there is none.
async fn at(t: Option<Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

// === impl Wait ===

impl Wait<'_> {
    fn claim_name(&self) -> &str {
        &self.session.claim
    }

    fn refusal(&self, reason: RefuseReason) -> Error {
        Error::Refused {
            lock: self.request.name.to_string(),
            claim: self.claim_name().to_string(),
            reason,
        }
    }

    /// The lock was deleted while its claim waits: a try ends; a wait waits for the
    /// lock to exist, taking no grant of the deleted lock from here on.
    fn lock_gone(&mut self) -> Result<(), Error> {
        if matches!(self.request.mode, Mode::Try) {
            return Err(Error::NoSuchLock(self.request.name.to_string()));
        }
        self.direct.stop();
        self.progress.lock_missing();
        Ok(())
    }

    /// The claim was deleted, or stripped of its lock label, by someone else while it
    /// waited: never acted on, so wait on with a new claim.
    fn claim_lost(&self) -> Result<Outcome, Error> {
        match *self.session.state().borrow() {
            State::Lost(LostReason::ClaimGone) => Ok(Outcome::Dropped),
            _ => Err(Error::ClaimLost(self.claim_name().to_string())),
        }
    }

    /// Unplaced (or refused) since the notice time: read the claim. Changed since this
    /// process made it: someone else's doing (the controller refuses or ignores it for
    /// that), so claim anew. Gone: a claim naming no existing pod is soon
    /// garbage-collected, maybe before its refusal was listed; but so is a claim
    /// granted and expired while this process was paused, its statuses unread (the
    /// notice time may come first when it resumes): [`Outcome::Vanished`]. `Some` when
    /// that ends the wait.
    async fn notice_due(&mut self) -> Option<Result<Outcome, Error>> {
        if let Some(ended) = self.read_back().await {
            return Some(ended);
        }
        if let Some(reason) = self.refused {
            return Some(Err(self.refusal(reason))); // still refused: no passing state
        }
        let now = Instant::now();
        self.progress.notice_due(now);
        self.read_back_at = (Some(now + read_back_wait(0)), 0);
        None
    }

    /// Still unplaced, unrefused, some time after the notice time: read the claim back
    /// again (a refusal the status could not list, [`crate::decide::MAX_REFUSED_LISTED`]
    /// others before it, would otherwise leave a claim changed after the first read-back
    /// waiting for ever), then again later, less and less often.
    async fn read_back_again(&mut self) -> Option<Result<Outcome, Error>> {
        if let Some(ended) = self.read_back().await {
            return Some(ended);
        }
        let n = self.read_back_at.1 + 1;
        self.read_back_at = (Some(Instant::now() + read_back_wait(n)), n);
        None
    }

    /// The claim as stored now: changed by someone else ([`Outcome::Tampered`]: claim
    /// anew), or gone with no refusal seen ([`Outcome::Vanished`]) end the wait.
    async fn read_back(&mut self) -> Option<Result<Outcome, Error>> {
        match self.claim.stored().await {
            Some(Some(stored)) => {
                let field = record::claim_differs(&stored, &self.wrote, self.request.name)?;
                self.direct.stop();
                Some(Ok(Outcome::Tampered(field)))
            }
            Some(None) if self.refused.is_none() => {
                self.direct.stop();
                Some(Ok(Outcome::Vanished))
            }
            _ => None,
        }
    }

    /// A status of the lock: `Some` when it ends the wait.
    async fn seen(&mut self, lock: &DistributedLock) -> Option<Result<Outcome, Error>> {
        let claim = self.session.claim.as_str();
        let status = lock.status.clone().unwrap_or_default();
        // Checked before anything in the status is acted on, a direct grant included
        // (it is followed only from a status checked here).
        if let Err(field) = record::check(&status, claim, &self.wrote) {
            self.direct.stop();
            return Some(Ok(Outcome::Tampered(field)));
        }
        self.notices_to = NoticeTarget::of(lock);
        if let Some(target) = &self.notices_to {
            // Found out while waiting, not when releasing: can notices reach it?
            notice::probe(&target.url, self.session.lease);
        }
        if let Some(token) = granted_token(&status, claim) {
            self.claim.set_notice_target(self.notices_to.clone());
            return Some(Ok(Outcome::Granted(token)));
        }
        if held_back(&status, claim) {
            return Some(Ok(Outcome::HeldBack));
        }
        if matches!(self.request.mode, Mode::Try) && status.queue.iter().any(|w| w.claim == claim) {
            return Some(Ok(Outcome::WouldBlock));
        }
        if let Some(ended) = self.placed_or_refused(&status).await {
            return Some(ended);
        }
        self.direct.follow(lock, claim, Some(self.proof));
        self.progress.lock_seen(&status, Instant::now());
        None
    }

    /// Refused: at once when final; else if not placed by the notice time (a pod the
    /// controller's cache has not seen yet is refused for a moment). The refusal is
    /// remembered until the claim is placed: a claim naming a pod UID that does not
    /// exist is soon garbage-collected, and no status lists it then. Placed, then named
    /// no more: dropped.
    async fn placed_or_refused(
        &mut self,
        status: &crate::api::DistributedLockStatus,
    ) -> Option<Result<Outcome, Error>> {
        let claim = self.session.claim.as_str();
        let listed = status.refused.iter().find(|r| r.claim == claim).map(|r| r.reason);
        let placed = names_claim(status, claim);
        if self.was_placed && !placed {
            self.direct.stop();
            return Some(Ok(Outcome::Dropped));
        }
        self.was_placed |= placed;
        if placed {
            self.read_back_at = (None, 0);
        }
        self.refused = if placed { None } else { listed.or(self.refused) };
        let reason = self
            .refused
            .filter(|r| r.is_final() || Instant::now() >= self.started + UNQUEUED_NOTICE)?;
        // Refused for its pod: the claim may name another pod than this process wrote
        // (changed by someone who may patch Leases before the controller saw it). Then
        // it is not this process that is refused: withdraw and claim anew, as for any
        // tampered claim.
        if !reason.is_final()
            && let Some(field) = self.changed().await
        {
            self.direct.stop();
            return Some(Ok(Outcome::Tampered(field)));
        }
        Some(Err(self.refusal(reason)))
    }

    /// Whether the claim as stored now names otherwise than this process wrote it
    /// (`None` also when it cannot be read).
    async fn changed(&self) -> Option<Tampered> {
        record::claim_differs(&self.claim.stored().await??, &self.wrote, self.request.name)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    #[test]
    fn an_unplaced_claim_is_read_back_again_less_and_less_often_to_a_minute() {
        let waits: Vec<u64> = (0..7).map(|n| super::read_back_wait(n).as_secs()).collect();
        assert_eq!(waits, [5, 10, 20, 40, 60, 60, 60]);
        assert_eq!(super::read_back_wait(u32::MAX), Duration::from_secs(60));
    }
}
