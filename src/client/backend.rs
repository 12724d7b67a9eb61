//! The seam a backend plugs its claims into: [`Backend`] acquires (creates a claim,
//! waits for its grant, and from the grant on reports the grant's loss to the
//! session), [`Claim`] gives a claim up. The lock handle ([`super::Lock`]) knows only
//! these two traits; the [`Session`] keeps the timing (renewals, deadlines) for every
//! backend alike.
//!
//! A backend lives in a folder of its own under `client/` (`k8s/`, `etcd/`), and
//! [`super::lock`] picks one by the lock's `spec.backend`.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::task::JoinHandle;

use super::session::Session;
use super::{Error, progress::Listener};
use crate::api::DistributedLock;
use crate::protocol::PodIdentity;
use crate::protocol::timing::renew_timeout;

/// How long an acquisition may wait.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Mode {
    /// Until granted.
    Wait,
    /// Not behind anyone: a claim queued behind others is withdrawn.
    Try,
    /// Until the instant; the duration is the caller's limit, for its error.
    Until(tokio::time::Instant, Duration),
}

impl Mode {
    /// When waiting must end, for a backend whose claims wait to be placed (the Lease
    /// backend: a `try` waits [`super::TRY_ACQUIRE_TIMEOUT`] at most for that).
    pub fn until(&self) -> Option<tokio::time::Instant> {
        match self {
            Mode::Wait => None,
            Mode::Try => Some(tokio::time::Instant::now() + super::TRY_ACQUIRE_TIMEOUT),
            Mode::Until(at, _) => Some(*at),
        }
    }

    /// The error when waiting ran out of time.
    pub fn timed_out(&self) -> Error {
        Error::Timeout(match self {
            Mode::Until(_, limit) => *limit,
            _ => super::TRY_ACQUIRE_TIMEOUT,
        })
    }
}

/// What an acquisition asks of a backend.
pub(crate) struct Request<'a> {
    /// The lock's name.
    pub name: &'a str,
    /// The process's pod.
    pub identity: &'a PodIdentity,
    /// The lock as read before the claim is made (`None`: it does not exist yet).
    pub lock: Option<&'a DistributedLock>,
    /// How long to wait.
    pub mode: Mode,
    /// Who hears of the wait's progress.
    pub listeners: &'a [Listener],
}

/// A grant: the claim's session, its renewal task and token, and how to give it up.
pub(crate) struct Granted {
    /// The claim's session, lost when the backend reports the grant gone.
    pub session: Arc<Session>,
    /// The task renewing the claim.
    pub renewal: JoinHandle<()>,
    /// The fencing token.
    pub token: i64,
    /// How the claim is given up.
    pub claim: Arc<dyn Claim>,
}

/// One backend's way to acquire a lock: the one trait a new backend implements (with
/// [`Claim`] for what it grants, and a [`super::session::Renewer`] for its renewals).
pub(crate) trait Backend: Send + Sync {
    /// Create a claim and wait for its grant as `request.mode` says: `None` when a
    /// try was not granted at once (the lock taken, or the claim not standing as
    /// made). From the grant on, the backend reports the grant's
    /// loss through [`Session::lose`]; a claim not granted is withdrawn before this
    /// returns, and when the future is dropped (see [`Withdraw`]).
    fn acquire<'a>(&'a self, request: Request<'a>) -> BoxFuture<'a, Result<Option<Granted>, Error>>;
}

/// How a claim is given up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum GiveUp {
    /// The first try of a session that held (an etcd claim holds from its creation):
    /// the backend's quickest way (the Lease backend tells the controller first).
    Holder,
    /// A withdrawal, or a retry: the one write that gives the claim up.
    Write,
}

/// A claim as its backend gives it up.
pub(crate) trait Claim: Send + Sync + std::fmt::Debug {
    /// Give the claim up (its session has ended); a claim already gone counts as given
    /// up. The write is bounded by [`write_within`].
    fn give_up<'a>(&'a self, session: &'a Session, how: GiveUp) -> BoxFuture<'a, Result<(), Error>>;
}

/// `write`, bounded by the renewal timeout of `session`'s lease: a release that cannot
/// be written in that time fails (the claim expires instead).
pub(crate) async fn write_within(
    session: &Session,
    write: impl std::future::Future<Output = Result<(), Error>>,
) -> Result<(), Error> {
    let limit = renew_timeout(session.lease);
    tokio::time::timeout(limit, write)
        .await
        .map_err(|_| Error::ReleaseTimeout(limit))?
}

/// End `session` (renewals stop at once) and give its claim up.
pub(crate) async fn end(session: &Session, claim: &dyn Claim) -> Result<(), Error> {
    let how = if session.is_holding() {
        GiveUp::Holder
    } else {
        GiveUp::Write
    };
    session.finish();
    claim.give_up(session, how).await
}

/// Withdraw a claim that was not granted (or not waited for): when that cannot be
/// written, the claim expires.
pub(crate) async fn withdraw_now(session: &Session, claim: &dyn Claim) {
    if let Err(e) = end(session, claim).await {
        tracing::warn!(claim = session.claim, error = %e, "withdrawing the claim failed; it will expire");
    }
}

/// Withdraws a claim whose acquisition was abandoned: dropped while waiting (a
/// `timeout` or `select!` around `acquire`), the claim stops being renewed at once and
/// is given up, so it is never granted to a process that no longer waits for it.
pub(crate) struct Withdraw(pub Option<(Arc<Session>, Arc<dyn Claim>)>);

impl Withdraw {
    /// Guard `session`'s claim until [`Withdraw::disarm`].
    pub fn arm(session: &Arc<Session>, claim: &Arc<dyn Claim>) -> Self {
        Withdraw(Some((session.clone(), claim.clone())))
    }

    /// The acquisition goes on: nothing is withdrawn on drop.
    pub fn disarm(&mut self) {
        self.0 = None;
    }
}

impl Drop for Withdraw {
    fn drop(&mut self) {
        let Some((session, claim)) = self.0.take() else { return };
        session.finish();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                if let Err(e) = claim.give_up(&session, GiveUp::Write).await {
                    tracing::warn!(claim = session.claim, error = %e, "withdrawing an abandoned claim failed; it will expire");
                }
            });
        }
    }
}
