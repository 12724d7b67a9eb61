//! The lock handle: acquire (wait, try, or with a timeout), with reentrancy.
//!
//! Acquiring watches the DistributedLock first, then creates the claim, so no status
//! change between the two is missed; it is woken by the watch, never by polling.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::Client;
use kube::api::Api;

use super::direct::DirectWait;
use super::guard::{Guard, Held};
use super::notice::NoticeTarget;
use super::progress::{Listener, Progress, UNQUEUED_NOTICE, WaitEvent};
use super::session::{LostReason, Session};
use super::watch::{LockWatch, Seen};
use super::{Error, WaitStatus, identity_from_env};
use crate::api::{DEFAULT_LEASE_DURATION_SECONDS, DistributedLock};
use crate::protocol::record::{self, Tampered, Written};
use crate::protocol::timing::renew_interval;
use crate::protocol::{PodIdentity, granted_token, held_back, still_grants};

/// How long `try_acquire` waits for the controller to place its claim.
pub const TRY_ACQUIRE_TIMEOUT: Duration = Duration::from_secs(30);

/// A handle on one DistributedLock for this process. Acquisitions through the same
/// handle are reentrant: they share one grant, released when the last is released.
pub struct Lock {
    client: Client,
    writes: Client,
    name: String,
    identity: PodIdentity,
    listeners: Vec<Listener>,
    current: tokio::sync::Mutex<Option<Arc<Held>>>,
}

impl std::fmt::Debug for Lock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lock")
            .field("name", &self.name)
            .field("identity", &self.identity)
            .finish_non_exhaustive()
    }
}

/// Builds a [`Lock`] with options.
pub struct LockBuilder {
    client: Client,
    writes: Option<Client>,
    namespace: String,
    name: String,
    identity: Option<PodIdentity>,
    listeners: Vec<Listener>,
}

// === impl LockBuilder ===

impl LockBuilder {
    /// Use this identity instead of `POD_NAME`/`POD_UID` from the environment.
    pub fn identity(mut self, identity: PodIdentity) -> Self {
        self.identity = Some(identity);
        self
    }

    /// Send the claim's writes (create, renewals, the release) through `client`, a
    /// client with a connection pool of its own. A long-running watch holds an HTTP/1.1
    /// connection for as long as it runs, so with one pool the release may have to open
    /// (and TLS-handshake) a new connection on the handoff path; a second pool keeps a
    /// warm one for writes. Build it from the same configuration as the first, with
    /// [`crate::kubeconfig::client_from`] (connections without Nagle's delay).
    pub fn write_client(mut self, client: Client) -> Self {
        self.writes = Some(client);
        self
    }

    /// Call `f` whenever the claim's place in the queue changes while waiting.
    pub fn on_wait(self, f: impl Fn(&WaitStatus) + Send + Sync + 'static) -> Self {
        self.on_wait_event(move |event| {
            if let WaitEvent::Queued(status) = event {
                f(status)
            }
        })
    }

    /// Call `f` with each [`WaitEvent`] while waiting: the place in the queue as it
    /// changes, a missing lock, a claim no controller has placed.
    pub fn on_wait_event(mut self, f: impl Fn(&WaitEvent) + Send + Sync + 'static) -> Self {
        self.listeners.push(Arc::new(f));
        self
    }

    /// Build the handle.
    pub fn build(self) -> Result<Lock, Error> {
        if self.name.len() > crate::protocol::MAX_LOCK_NAME {
            return Err(Error::NameTooLong(self.name));
        }
        let identity = match self.identity {
            Some(id) => id,
            None => identity_from_env(&self.namespace)?,
        };
        if identity.namespace != self.namespace {
            return Err(Error::CrossNamespace {
                lock: self.namespace,
                pod: identity.namespace,
            });
        }
        Ok(Lock {
            writes: self.writes.unwrap_or_else(|| self.client.clone()),
            client: self.client,
            name: self.name,
            identity,
            listeners: self.listeners,
            current: tokio::sync::Mutex::new(None),
        })
    }
}

enum Mode {
    Wait,
    Try,
    Until(tokio::time::Instant, Duration),
}

enum Outcome {
    Granted(i64),
    WouldBlock,
    /// Listed as a revoked holder whose slot is held back, though never granted.
    HeldBack,
    /// The status records the claim otherwise than this process wrote it.
    Tampered(Tampered),
    /// The claim was queued, and a later status names it no more, ungranted.
    Dropped,
}

// === impl Lock ===

impl Lock {
    /// A handle on lock `name` in `namespace`, identity from the environment.
    pub fn new(client: Client, namespace: &str, name: &str) -> Result<Self, Error> {
        Self::builder(client, namespace, name).build()
    }

    /// A builder for a handle with options.
    pub fn builder(client: Client, namespace: &str, name: &str) -> LockBuilder {
        LockBuilder {
            client,
            writes: None,
            namespace: namespace.into(),
            name: name.into(),
            identity: None,
            listeners: Vec::new(),
        }
    }

    /// Wait (FIFO, no polling) until the lock is granted.
    pub async fn acquire(&self) -> Result<Guard, Error> {
        Ok(self.acquire_with(Mode::Wait).await?.expect("waiting never gives up"))
    }

    /// Take the lock only if it is granted without waiting behind anyone; otherwise
    /// withdraw the claim and return `None`. Fails with [`Error::NoSuchLock`] when the
    /// lock does not exist.
    pub async fn try_acquire(&self) -> Result<Option<Guard>, Error> {
        self.acquire_with(Mode::Try).await
    }

    /// Wait up to `timeout`; then withdraw the claim and fail with [`Error::Timeout`].
    pub async fn acquire_timeout(&self, timeout: Duration) -> Result<Guard, Error> {
        let until = tokio::time::Instant::now() + timeout;
        Ok(self
            .acquire_with(Mode::Until(until, timeout))
            .await?
            .expect("a timed wait grants or fails"))
    }

    async fn acquire_with(&self, mode: Mode) -> Result<Option<Guard>, Error> {
        let mut current = self.current.lock().await;
        if let Some(held) = current.as_ref().filter(|h| h.session.is_live()) {
            if held.count.fetch_add(1, Ordering::SeqCst) > 0 {
                return Ok(Some(Guard {
                    held: held.clone(),
                    released: false,
                }));
            }
            held.count.fetch_sub(1, Ordering::SeqCst); // all guards were released meanwhile
        }
        let ns = &self.identity.namespace;
        let locks: Api<DistributedLock> = Api::namespaced(self.client.clone(), ns);
        let leases: Api<Lease> = Api::namespaced(self.writes.clone(), ns);
        let spec = locks
            .get_opt(&self.name)
            .await
            .map_err(|e| Error::GetLock(self.name.clone(), e))?;
        if let Some(etcd) = spec.as_ref().and_then(|l| l.spec.etcd()) {
            let (secs, max) = spec
                .as_ref()
                .map(|l| (l.spec.lease_duration_seconds, l.spec.max_holders))
                .unwrap_or_default();
            let acquired = self.acquire_etcd(etcd.clone(), secs, max, &mode).await?;
            if let Some(held) = acquired.as_ref() {
                *current = Some(held.held.clone());
            }
            return Ok(acquired);
        }
        let exists = spec.is_some();
        if !exists && matches!(mode, Mode::Try) {
            return Err(Error::NoSuchLock(self.name.clone()));
        }
        let secs = spec
            .map(|l| l.spec.lease_duration_seconds)
            .unwrap_or(DEFAULT_LEASE_DURATION_SECONDS);
        // Watch first, so no status change between create and watch is missed.
        let lease = Duration::from_secs(secs.max(1) as u64);
        let mut events = LockWatch::start(locks, &self.name, renew_interval(lease));
        let (session, renewal, mut withdraw, mut outcome) = loop {
            let (session, renewal) = Session::create(leases.clone(), &self.name, &self.identity, secs).await?;
            // If this future is dropped from here on, the claim is withdrawn.
            let mut withdraw = Withdraw(Some(session.clone()));
            let outcome = self.wait_grant(&mut events, &session, &mode, exists).await;
            match &outcome {
                // The lock holds a slot back for this claim as if its process might run
                // (a deleted lock revoking the successor it had designated, or a forged
                // mark), yet it was never granted: a valid release says so, freeing the
                // slot (unless the controller deleted the claim first: then the slot is
                // held back its lease), and a new claim waits on, at the back of the queue.
                Ok(Outcome::HeldBack) => tracing::info!(
                    claim = session.claim,
                    "the claim is held back though never granted: claiming anew"
                ),
                // Dropped from the queue while its process waits (its claim expired
                // or hidden by someone who may patch Leases): wait on with a new claim.
                Ok(Outcome::Dropped) => tracing::warn!(
                    claim = session.claim,
                    "the claim left the queue without a grant: claiming anew"
                ),
                // Someone changed the claim before the controller recorded it: a grant
                // under that record is not this process's to act on (see
                // `protocol::record`). Withdrawn, never acted on; a new claim waits on.
                Ok(Outcome::Tampered(field)) => tracing::warn!(
                    claim = session.claim,
                    field = field.field(),
                    "{field}: withdrawing the claim without acting on it, and claiming anew"
                ),
                _ => break (session, renewal, withdraw, outcome),
            }
            withdraw.0 = None;
            withdraw_now(&session).await;
            if matches!(mode, Mode::Try) {
                return Ok(None);
            }
        };
        if let Ok(Outcome::Granted(_)) = outcome {
            // A waiter renews slowly: act only once its last write's deadline is ahead
            // (within the caller's time limit, if any: past it the grant is given back).
            let held = match &mode {
                Mode::Until(at, limit) => tokio::time::timeout_at(*at, session.hold())
                    .await
                    .map_err(|_| Error::Timeout(*limit)),
                _ => Ok(session.hold().await),
            };
            outcome = match held {
                Ok(Ok(())) => outcome,
                Ok(Err(reason)) => {
                    tracing::warn!(claim = session.claim, ?reason, "the claim was lost as it was granted");
                    Err(Error::ClaimLost(session.claim.clone()))
                }
                Err(timeout) => Err(timeout),
            };
        }
        withdraw.0 = None;
        match outcome {
            Ok(Outcome::Granted(token)) => {
                let held = Held::granted(session, renewal, token);
                watch_revocation(events, held.session.clone(), token);
                *current = Some(held.clone());
                Ok(Some(Guard { held, released: false }))
            }
            other => {
                withdraw_now(&session).await;
                match other {
                    Ok(_) => Ok(None),
                    Err(e) => Err(e),
                }
            }
        }
    }

    #[cfg(not(feature = "etcd"))]
    async fn acquire_etcd(&self, _: crate::api::EtcdBackend, _: i32, _: i32, _: &Mode) -> Result<Option<Guard>, Error> {
        Err(Error::EtcdUnsupported(self.name.clone()))
    }

    /// Acquire a lock whose claims live in etcd ([`crate::etcd`]).
    #[cfg(feature = "etcd")]
    async fn acquire_etcd(
        &self,
        backend: crate::api::EtcdBackend,
        secs: i32,
        max_holders: i32,
        mode: &Mode,
    ) -> Result<Option<Guard>, Error> {
        use super::etcd::claim::{Waited, create};
        let (mut claim, session, renewal) = create(&backend, &self.name, &self.identity, secs, max_holders).await?;
        // If this future is dropped from here on, the claim is withdrawn.
        let mut withdraw = Withdraw(Some(session.clone()));
        let (until, try_only) = match mode {
            Mode::Wait => (None, false),
            Mode::Try => (None, true),
            Mode::Until(at, _) => (Some(*at), false),
        };
        let waited = claim.wait(&session, until, try_only).await;
        withdraw.0 = None;
        let outcome = match waited {
            Ok(Waited::Granted(token)) => {
                let held = Held::granted(session, renewal, token);
                claim.watch_revocation(held.session.clone());
                return Ok(Some(Guard { held, released: false }));
            }
            Ok(Waited::WouldBlock) => Ok(None),
            Ok(Waited::TimedOut) => Err(Error::Timeout(match mode {
                Mode::Until(_, d) => *d,
                _ => TRY_ACQUIRE_TIMEOUT,
            })),
            Ok(Waited::Lost) => Err(Error::ClaimLost(session.claim.clone())),
            Err(e) => Err(Error::Etcd(e)),
        };
        withdraw_now(&session).await;
        outcome
    }

    async fn wait_grant(
        &self,
        events: &mut LockWatch,
        session: &Session,
        mode: &Mode,
        exists: bool,
    ) -> Result<Outcome, Error> {
        let claim = session.claim.as_str();
        let hash = session.release_hash();
        let proof = session.wait_proof();
        let wait_hash = proof.as_deref().map(crate::protocol::release::hash_of);
        let wrote = Written {
            pod: &self.identity.name,
            pod_uid: &self.identity.uid,
            release_hash: hash.as_deref(),
            wait_hash: wait_hash.as_deref(),
            lease_seconds: i32::try_from(session.lease.as_secs()).unwrap_or(i32::MAX),
        };
        let now = tokio::time::Instant::now;
        let until = match mode {
            Mode::Wait => None,
            Mode::Try => Some(now() + TRY_ACQUIRE_TIMEOUT),
            Mode::Until(at, _) => Some(*at),
        };
        let started = now();
        let mut progress = Progress::new(&self.listeners, claim, started, exists);
        let mut direct = DirectWait::default();
        // Why the controller refuses this claim, as its status last said.
        let mut refused = None;
        // Whether a status has named the claim (queued, or held).
        let mut was_placed = false;
        // Where release notices go, as the latest status said.
        let mut notices_to = None;
        let refusal = |reason| Error::Refused {
            lock: self.name.clone(),
            claim: claim.to_string(),
            reason,
        };
        loop {
            let at = |t: Option<tokio::time::Instant>| async move {
                match t {
                    Some(t) => tokio::time::sleep_until(t).await,
                    None => std::future::pending().await,
                }
            };
            let lock = tokio::select! {
                seen = events.next() => match seen {
                    Some(Seen::Lock(lock)) => lock,
                    Some(Seen::Gone) if matches!(mode, Mode::Try) => return Err(Error::NoSuchLock(self.name.clone())),
                    Some(Seen::Gone) => {
                        direct.stop(); // no grant of the deleted lock is taken from here on
                        progress.lock_missing(); // the claim waits for the lock to exist
                        continue;
                    }
                    None => return Err(Error::Watch(self.name.clone())),
                },
                (token, _) = direct.granted() => {
                    // Notices go where the latest status said, checked by its key.
                    session.set_notice_target(notices_to.clone());
                    return Ok(Outcome::Granted(token));
                }
                _ = session.lost() => {
                    // Deleted, or stripped of its lock label, by someone else while it
                    // waited: never acted on, so wait on with a new claim.
                    if *session.state().borrow() == super::State::Lost(LostReason::ClaimGone) {
                        return Ok(Outcome::Dropped);
                    }
                    return Err(Error::ClaimLost(claim.into()));
                }
                _ = at(until) => return Err(Error::Timeout(match mode {
                    Mode::Until(_, d) => *d,
                    _ => TRY_ACQUIRE_TIMEOUT,
                })),
                _ = at(progress.notice_at()) => {
                    // Unplaced (or refused) this long: read the claim. Changed since this
                    // process made it: someone else's doing (the controller refuses or
                    // ignores it for that), so claim anew. Gone: a claim naming no existing
                    // pod is soon garbage-collected, maybe before its refusal was listed.
                    match session.stored().await {
                        Some(Some(stored)) => {
                            if let Some(field) = record::claim_differs(&stored, &wrote, &self.name) {
                                direct.stop();
                                return Ok(Outcome::Tampered(field));
                            }
                        }
                        Some(None) if refused.is_none() => {
                            return Err(Error::ClaimCollected {
                                claim: claim.to_string(),
                                pod: self.identity.name.clone(),
                                uid: self.identity.uid.clone(),
                            });
                        }
                        _ => {}
                    }
                    if let Some(reason) = refused {
                        return Err(refusal(reason)); // still refused: no passing state
                    }
                    progress.notice_due(now());
                    continue;
                }
            };
            let status = lock.status.clone().unwrap_or_default();
            // Checked before anything in the status is acted on, a direct grant included
            // (it is followed only from a status checked here).
            if let Err(field) = record::check(&status, claim, &wrote) {
                direct.stop();
                return Ok(Outcome::Tampered(field));
            }
            notices_to = NoticeTarget::of(&lock);
            if let Some(target) = &notices_to {
                // Found out while waiting, not when releasing: can notices reach it?
                super::notice::probe(&target.url, session.lease);
            }
            if let Some(token) = granted_token(&status, claim) {
                session.set_notice_target(notices_to.clone());
                return Ok(Outcome::Granted(token));
            }
            if held_back(&status, claim) {
                return Ok(Outcome::HeldBack);
            }
            if matches!(mode, Mode::Try) && status.queue.iter().any(|w| w.claim == claim) {
                return Ok(Outcome::WouldBlock);
            }
            // Refused: at once when final; else if not placed by the notice time (a pod
            // the controller's cache has not seen yet is refused for a moment). The
            // refusal is remembered until the claim is placed: a claim naming a pod UID
            // that does not exist is soon garbage-collected, and no status lists it then.
            let listed = status.refused.iter().find(|r| r.claim == claim).map(|r| r.reason);
            let placed = crate::protocol::names_claim(&status, claim);
            if was_placed && !placed {
                direct.stop();
                return Ok(Outcome::Dropped);
            }
            was_placed |= placed;
            refused = if placed { None } else { listed.or(refused) };
            if let Some(reason) = refused.filter(|r| r.is_final() || now() >= started + UNQUEUED_NOTICE) {
                // Refused for its pod: the claim may name another pod than this
                // process wrote (changed by someone who may patch Leases before the
                // controller saw it). Then it is not this process that is refused:
                // withdraw and claim anew, as for any tampered claim.
                if !reason.is_final()
                    && let Some(field) = changed(session, &wrote, &self.name).await
                {
                    direct.stop();
                    return Ok(Outcome::Tampered(field));
                }
                return Err(refusal(reason));
            }
            direct.follow(&lock, claim, proof.as_deref());
            progress.lock_seen(&status, now());
        }
    }
}

/// Whether the claim as stored now names otherwise than this process `wrote` it for
/// `lock` (`None` also when it cannot be read).
async fn changed(session: &Session, wrote: &Written<'_>, lock: &str) -> Option<Tampered> {
    record::claim_differs(&session.stored().await??, wrote, lock)
}

/// Withdraw a claim that was not granted (or not waited for): stop renewing and mark it
/// released; when that cannot be written, the claim expires.
async fn withdraw_now(session: &Session) {
    if let Err(e) = session.end().await {
        tracing::warn!(claim = session.claim, error = %e, "withdrawing the claim failed; it will expire");
    }
}

/// After a grant with `token`: report the session lost as soon as the lock's status no
/// longer grants it ([`still_grants`]: a direct grant's status shows the designation
/// until the grant is written), or the lock is deleted.
fn watch_revocation(mut events: LockWatch, session: Arc<Session>, token: i64) {
    tokio::spawn(async move {
        let mut state = session.state();
        loop {
            let seen = tokio::select! {
                _ = state.wait_for(|s| *s != super::State::Live) => return,
                seen = events.next() => match seen {
                    Some(seen) => seen,
                    None => return,
                },
            };
            let reason = match seen {
                Seen::Gone => LostReason::LockDeleted,
                Seen::Lock(lock) if !grants(&lock, &session.claim, token) => lost_reason(&lock, &session.claim),
                Seen::Lock(lock) => {
                    // A new leader publishes where it takes notices, and its key, with
                    // its writes.
                    session.set_notice_target(NoticeTarget::of(&lock));
                    continue;
                }
            };
            tracing::warn!(claim = session.claim, ?reason, "the grant is gone");
            session.lose(reason);
            return;
        }
    });
}

/// Why a status that no longer grants `claim` took its grant: `LockDeleted` when the
/// deleted lock revoked it (a deleted lock revokes every grant before it goes).
fn lost_reason(lock: &DistributedLock, claim: &str) -> LostReason {
    let holders = lock.status.iter().flat_map(|s| &s.holders);
    let revoked = holders.filter(|h| h.claim == claim).find_map(|h| h.revoked.as_ref());
    match revoked.map(|r| r.reason) {
        Some(crate::api::RevokeReason::LockDeleted) => LostReason::LockDeleted,
        _ => LostReason::Revoked,
    }
}

fn grants(lock: &DistributedLock, claim: &str, token: i64) -> bool {
    lock.status.as_ref().is_some_and(|s| still_grants(s, claim, token))
}

/// Withdraws a claim whose acquisition was abandoned: dropped while waiting (a
/// `timeout` or `select!` around `acquire`), the claim stops being renewed at once and
/// is marked released, so the controller never grants it to a process that no longer
/// waits for it.
struct Withdraw(Option<Arc<Session>>);

impl Drop for Withdraw {
    fn drop(&mut self) {
        let Some(session) = self.0.take() else { return };
        session.finish();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                if let Err(e) = session.release_mark().await {
                    tracing::warn!(claim = session.claim, error = %e, "withdrawing an abandoned claim failed; it will expire");
                }
            });
        }
    }
}
