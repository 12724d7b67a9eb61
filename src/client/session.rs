//! A claim's session, whatever its backend: keep the claim renewed (through the
//! backend's [`Renewer`]), and publish whether it still stands on a watch channel.
//!
//! One background task owns the renewals; whoever else learns that the claim is lost
//! (the lock's watch seeing a revocation) reports it through [`Session::lose`]. The
//! timing follows [`crate::protocol::timing`]: while the claim waits it is renewed every
//! [`wait_renew_interval`]; from [`Session::hold`] on, every [`renew_interval`].
//! `hold` returns only while [`client_stop_by`] the moment the last successful write
//! was sent is ahead (a waiter granted long after its last write renews first), and
//! from then on `lost` is published no later than that deadline.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::protocol::timing::{
    client_stop_by, renew_interval, renew_retry_max, renew_timeout, safety_margin, wait_lease, wait_renew_interval,
};

/// Where a claim's session stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// The claim stands and is being renewed.
    Live,
    /// The claim no longer stands: stop acting on the lock's behalf.
    Lost(LostReason),
    /// The claim was released (or withdrawn) by this process.
    Ended,
}

/// Why a session was lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LostReason {
    /// The lock's status no longer lists the claim as an unrevoked holder.
    Revoked,
    /// The claim Lease is gone (deleted by someone else).
    ClaimGone,
    /// Renewals failed for so long that the controller might expire the claim.
    RenewalsFailed,
    /// The DistributedLock was deleted.
    LockDeleted,
}

/// One claim, renewed by a background task until it ends or is lost.
#[derive(Debug)]
pub(crate) struct Session {
    /// The claim's name.
    pub claim: String,
    /// The lease duration the claim lives by.
    pub lease: Duration,
    state: watch::Sender<State>,
    /// Since when the claim holds (renewed at the holder's pace, its deadline
    /// enforced); `None` while it waits.
    holding: watch::Sender<Option<Instant>>,
    /// [`client_stop_by`] the last successful write: how long a holder may act.
    valid_until: watch::Sender<Instant>,
}

/// How a session renews its claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Cadence {
    /// Slowly while it waits ([`wait_renew_interval`]), at the holder's pace from
    /// [`Session::hold`] on: a claim Lease, which the controller judges by its wait lease
    /// while it waits.
    Waiting,
    /// At the holder's pace from the start, its deadline enforced from the start (an
    /// etcd key, whose lease etcd expires by the claim's own lease).
    Holding,
}

/// The outcome of one renewal attempt.
pub(crate) enum Renewal {
    /// The claim stands, renewed as of when the attempt was sent.
    Renewed,
    /// The claim is gone, or no longer this process's.
    Gone,
    /// The attempt failed; retry.
    Failed(String),
}

/// One backend's way to renew a claim.
pub(crate) trait Renewer: Send + 'static {
    /// Renew once. The caller bounds it by the renewal timeout.
    fn renew(&mut self) -> impl std::future::Future<Output = Renewal> + Send;
}

// === impl Session ===

impl Session {
    /// A session for a claim created when `sent` was sent, renewed by `renewer` at `cadence`.
    pub fn start(
        claim: String,
        lease: Duration,
        (sent, cadence): (Instant, Cadence),
        renewer: impl Renewer,
    ) -> (Arc<Session>, JoinHandle<()>) {
        let (state, _) = watch::channel(State::Live);
        let holding = (cadence == Cadence::Holding).then_some(sent);
        let session = Arc::new(Session {
            claim,
            lease,
            state,
            holding: watch::channel(holding).0,
            valid_until: watch::channel(valid_until(sent, lease, cadence == Cadence::Waiting)).0,
        });
        let task = tokio::spawn(renew(session.clone(), sent, renewer));
        (session, task)
    }

    /// The session's state, to read or to wait on.
    pub fn state(&self) -> watch::Receiver<State> {
        self.state.subscribe()
    }

    /// Whether the claim still stands.
    pub fn is_live(&self) -> bool {
        *self.state.borrow() == State::Live
    }

    /// The claim was granted: renew at the holder's pace and enforce the deadline from
    /// now on. Returns once the deadline of the last successful write is at least
    /// [`safety_margin`] ahead (at once, unless the claim's last write is that old: then
    /// after a renewal), or the session's loss.
    pub async fn hold(&self) -> Result<(), LostReason> {
        let since = Instant::now();
        self.holding
            .send_if_modified(|h| h.is_none() && h.replace(since).is_none());
        let mut valid = self.valid_until.subscribe();
        let mut state = self.state();
        loop {
            match *state.borrow_and_update() {
                State::Lost(reason) => return Err(reason),
                State::Ended => return Err(LostReason::Revoked),
                State::Live => {}
            }
            if may_hold(Instant::now(), *valid.borrow_and_update(), self.lease) {
                return Ok(());
            }
            tokio::select! {
                _ = valid.changed() => {}
                _ = state.changed() => {}
            }
        }
    }

    /// Completes once the session is lost.
    pub async fn lost(&self) {
        let mut rx = self.state.subscribe();
        let _ = rx.wait_for(|s| matches!(s, State::Lost(_))).await;
    }

    /// Publish that the claim is lost (no effect once the session is over).
    pub fn lose(&self, reason: LostReason) {
        self.state.send_if_modified(|s| {
            let live = *s == State::Live;
            if live {
                *s = State::Lost(reason);
            }
            live
        });
    }

    /// Whether the claim holds (renewed at the holder's pace, its deadline enforced).
    pub fn is_holding(&self) -> bool {
        self.holding.borrow().is_some()
    }

    /// [`client_stop_by`] the last successful write: how long a holder may act.
    pub fn valid_until(&self) -> Instant {
        *self.valid_until.borrow()
    }

    /// [`Session::valid_until`] as it changes (with each successful write).
    pub fn valid_until_changes(&self) -> watch::Receiver<Instant> {
        self.valid_until.subscribe()
    }

    /// Stop renewing at once (no write): the session is over.
    pub fn finish(&self) {
        self.state.send_if_modified(|s| {
            let live = *s == State::Live;
            if live {
                *s = State::Ended;
            }
            live
        });
    }
}

/// Renew while the session is live: every [`wait_renew_interval`] while the claim
/// waits, every [`renew_interval`] once it holds. Publish `Lost` when the claim is gone,
/// or when renewals of a held claim failed until the safety deadline (a claim granted
/// with its deadline passed has its lease to renew). The deadline fires on time
/// whatever request is in flight: a black-holed connection, where a request hangs
/// until its timeout, must not delay it.
async fn renew(session: Arc<Session>, created_sent: Instant, mut renewer: impl Renewer) {
    let (name, lease) = (session.claim.as_str(), session.lease);
    let mut state = session.state();
    let mut holding = session.holding.subscribe();
    let mut last_sent = created_sent;
    let mut retry_at = None;
    let mut backoff = Duration::from_millis(100);
    loop {
        let held = holding.borrow_and_update().is_some();
        let interval = if held {
            renew_interval(lease)
        } else {
            wait_renew_interval(lease)
        };
        let next = retry_at.unwrap_or(last_sent + interval);
        tokio::select! {
            _ = state.wait_for(|s| *s != State::Live) => return,
            _ = give_up_due(session.holding.subscribe(), last_sent, lease) => return give_up(&session),
            _ = holding.changed() => continue,
            _ = tokio::time::sleep_until(next) => {}
        }
        let sent = Instant::now();
        let request = tokio::time::timeout(renew_timeout(lease), renewer.renew());
        let outcome = tokio::select! {
            _ = state.wait_for(|s| *s != State::Live) => return,
            _ = give_up_due(session.holding.subscribe(), last_sent, lease) => return give_up(&session),
            outcome = request => outcome,
        };
        match outcome {
            Ok(Renewal::Renewed) => {
                last_sent = sent;
                retry_at = None;
                backoff = Duration::from_millis(100);
                session.valid_until.send_replace(valid_until(sent, lease, !held));
            }
            Ok(Renewal::Gone) => {
                tracing::warn!(claim = name, "claim is gone (forced release): giving up the grant");
                session.lose(LostReason::ClaimGone);
                return;
            }
            failed => {
                let error = match failed {
                    Ok(Renewal::Failed(e)) => e,
                    _ => "timed out".to_string(),
                };
                tracing::warn!(claim = name, error, "renewal failed; retrying");
                retry_at = Some(Instant::now() + backoff);
                backoff = (backoff * 2).min(renew_retry_max(lease));
            }
        }
    }
}

/// By when a holder stops acting on the strength of a write sent at `sent`
/// ([`client_stop_by`]): counted by its lease, even for a write made while it waited
/// (`waiting`), whose wait lease says only how long the controller keeps it queued.
pub(crate) fn valid_until<T: std::ops::Add<Duration, Output = T>>(sent: T, lease: Duration, waiting: bool) -> T {
    if waiting && crate::mutant::on(crate::mutant::Mutant::WaiterActsOnWaitRenewal) {
        return client_stop_by(sent, wait_lease(lease));
    }
    client_stop_by(sent, lease)
}

/// Whether a granted claim may act at `now`, the deadline of its last successful write
/// being `valid_until`: [`Session::hold`] returns only while that deadline is at least a
/// [`safety_margin`] ahead (else it renews first).
pub(crate) fn may_hold<T: std::ops::Add<Duration, Output = T> + PartialOrd>(
    now: T,
    valid_until: T,
    lease: Duration,
) -> bool {
    now + safety_margin(lease) < valid_until
}

/// Completes when the claim must give up, `last_sent` being when its last successful
/// write was sent. Held: at that write's deadline when [`Session::hold`] could have
/// returned on it (it was at least [`safety_margin`] ahead when the claim was first
/// held); otherwise a lease after the claim was held, time for renewals to restore a
/// deadline before `hold` returns. Waiting: when the controller may have dropped it
/// (the deadline of its wait lease), so a waiter whose renewals keep failing stops
/// waiting instead of waiting for ever.
async fn give_up_due(mut holding: watch::Receiver<Option<Instant>>, last_sent: Instant, lease: Duration) {
    let deadline = client_stop_by(last_sent, lease);
    loop {
        let since = *holding.borrow_and_update();
        let usable = |since: Instant| may_hold(since, deadline, lease);
        let at = match since {
            Some(since) if usable(since) => deadline,
            Some(since) => since + lease,
            None => client_stop_by(last_sent, wait_lease(lease)),
        };
        tokio::select! {
            _ = tokio::time::sleep_until(at) => return,
            changed = holding.changed() => {
                if changed.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        }
    }
}

fn give_up(session: &Session) {
    tracing::warn!(
        claim = session.claim,
        "renewals failed for too long: giving up the grant"
    );
    session.lose(LostReason::RenewalsFailed);
}
