//! The client's side of the etcd backend: create the claim key under a lease of its
//! own, renew (check the key is still on that lease, then keep the lease alive), wait
//! for the keys ahead to go, and give the claim up by revoking the lease.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, EventType, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse,
    WatchFilterType, WatchOptions, WatchStream,
};
use futures::future::BoxFuture;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use kube::api::Api;

use super::renew::{Etcd, EtcdRenewer, on_own_lease};
use crate::api::{DistributedLock, EtcdBackend};
use crate::client::backend::{Backend, Claim, GiveUp, Granted, Mode, Request, Withdraw, withdraw_now, write_within};
use crate::client::session::{Cadence, Session};
use crate::client::{LostReason, State};
use crate::etcd::Error;
use crate::etcd::keys::{ClaimValue, claim_key, lock_prefix};
use crate::etcd::rules::{KeyChange, Tracked, WakeOn, holds, track_ahead, wake_on};
use crate::protocol::PodIdentity;
use crate::protocol::claim::claim_name;
use crate::protocol::timing::{etcd_claim_ttl, renew_timeout};

/// The etcd backend: a lock's claims are keys in the etcd its `spec.backend.etcd` names;
/// `locks` reads the lock's `maxHolders` afresh before a grant beside other holders.
pub(crate) struct Keys {
    /// Where the lock's claims live.
    pub backend: EtcdBackend,
    /// The locks of the client's namespace.
    pub locks: Api<DistributedLock>,
}

impl Backend for Keys {
    fn acquire<'a>(&'a self, request: Request<'a>) -> BoxFuture<'a, Result<Option<Granted>, crate::client::Error>> {
        Box::pin(self.acquire(request))
    }
}

impl Keys {
    async fn acquire(&self, request: Request<'_>) -> Result<Option<Granted>, crate::client::Error> {
        let (secs, max_holders) = request
            .lock
            .map(|l| (l.spec.lease_duration_seconds, l.spec.max_holders))
            .unwrap_or_default();
        let (mut claim, release, session, renewal) =
            create(&self.backend, request.name, request.identity, secs, max_holders).await?;
        claim.lock = Some(LockRef {
            api: self.locks.clone(),
            name: request.name.to_string(),
        });
        let given_up: Arc<dyn Claim> = release;
        // If this future is dropped from here on, the claim is withdrawn.
        let mut withdraw = Withdraw::arm(&session, &given_up);
        let (until, try_only) = match request.mode {
            Mode::Wait => (None, false),
            Mode::Try => (None, true),
            Mode::Until(at, _) => (Some(at), false),
        };
        let waited = claim.wait(&session, until, try_only).await;
        withdraw.disarm();
        let outcome = match waited {
            Ok(Waited::Granted(token)) => {
                claim.watch_revocation(session.clone());
                return Ok(Some(Granted {
                    session,
                    renewal,
                    token,
                    claim: given_up,
                }));
            }
            Ok(Waited::WouldBlock) => Ok(None),
            Ok(Waited::TimedOut) => Err(request.mode.timed_out()),
            Ok(Waited::Lost) => Err(crate::client::Error::ClaimLost(session.claim.clone())),
            Err(e) => Err(e.into()),
        };
        withdraw_now(&session, given_up.as_ref()).await;
        outcome
    }
}

/// How long a mutex's waiter woken by the release of the key second ahead of it puts
/// its read off (unless the key next ahead goes meanwhile). That release is a handoff
/// to the key next ahead: read at once, the waiter's request and the watch it then
/// opens made etcd compete for the CPU with the next holder's start (profiled: 0.3 ms
/// of etcd's and 0.3 ms of the waiter's CPU inside a 3.5 ms handoff; see
/// docs/measurements.md). It still tracks the keys ahead long before the next release
/// but for a holder done within this; then the watch of the key next ahead wakes it,
/// and it holds after one read.
pub const SECOND_AHEAD_SETTLE: Duration = Duration::from_millis(10);

/// How long a waiter that would hold beside other keys waits for its read of the lock's
/// `maxHolders` ([`KeyClaim::confirm`]).
const SPEC_READ_TIMEOUT: Duration = Duration::from_secs(2);

/// How soon such a waiter whose read failed reads again.
const SPEC_REREAD_DELAY: Duration = Duration::from_millis(500);

/// What a claim that would hold by the `maxHolders` it last read does.
enum Confirmed {
    /// The wait ends so: granted (the value stored now lets it hold), lost, timed out,
    /// or a try that would block.
    Ends(Waited),
    /// The value stored now is lower: it waits by that.
    WaitsOn,
    /// The value could not be read: read the keys again shortly.
    ReadAgain,
}

/// Pause before re-opening a broken watch on the claim's own key.
const REWATCH_DELAY: Duration = Duration::from_millis(200);

/// What waiting ended with.
enum Waited {
    /// The claim holds, with this fencing token.
    Granted(i64),
    /// Keys are ahead and the caller would not wait.
    WouldBlock,
    /// The deadline passed.
    TimedOut,
    /// The claim key was moved or deleted by someone else.
    Lost,
}

/// A created claim, waiting or holding.
struct KeyClaim {
    client: Client,
    prefix: String,
    key: String,
    lease_id: i64,
    revision: i64,
    /// The lock's `maxHolders` as last read.
    max_holders: i32,
    /// Where to read it afresh ([`KeyClaim::confirm`]).
    lock: Option<LockRef>,
}

/// The DistributedLock a claim is for, to read its `maxHolders` afresh.
struct LockRef {
    api: Api<DistributedLock>,
    name: String,
}

/// Gives an etcd claim up: revoking its lease deletes the key only while it is still
/// on that lease, so a late release never deletes a key the controller took over.
pub(crate) struct EtcdRelease {
    client: Client,
    key: String,
    lease_id: i64,
}

impl std::fmt::Debug for EtcdRelease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdRelease")
            .field("key", &self.key)
            .field("lease_id", &self.lease_id)
            .finish_non_exhaustive()
    }
}

impl Claim for EtcdRelease {
    /// Revoke the claim's lease, holder or not (etcd's controller learns of it from
    /// its watch).
    fn give_up<'a>(&'a self, session: &'a Session, _: GiveUp) -> BoxFuture<'a, Result<(), crate::client::Error>> {
        Box::pin(write_within(session, async move {
            self.revoke().await.map_err(crate::client::Error::from)
        }))
    }
}

impl EtcdRelease {
    /// Revoke the claim's lease; a lease already gone counts as released.
    pub async fn revoke(&self) -> Result<(), Error> {
        match self.client.clone().lease_revoke(self.lease_id).await {
            Ok(_) => Ok(()),
            Err(e) if e.to_string().contains("lease not found") => Ok(()),
            Err(e) => Err(Error::Release(self.key.clone(), e)),
        }
    }
}

/// Create a claim key for lock `name` (in the identity's namespace) and start its
/// session. The key lives on a fresh lease of [`etcd_claim_ttl`].
async fn create(
    backend: &EtcdBackend,
    name: &str,
    identity: &PodIdentity,
    lease_secs: i32,
    max_holders: i32,
) -> Result<(KeyClaim, Arc<EtcdRelease>, Arc<Session>, JoinHandle<()>), Error> {
    let lease = Duration::from_secs(lease_secs.max(1) as u64);
    let mut client = crate::etcd::connect(backend, renew_timeout(lease)).await?;
    let ns = &identity.namespace;
    let claim = claim_name(name);
    let key = claim_key(backend, ns, name, &claim);
    // The first deadline counts from when the grant was sent.
    let sent = Instant::now();
    let lease_id = client
        .lease_grant(etcd_claim_ttl(lease), None)
        .await
        .map_err(Error::Grant)?
        .id();
    let value = ClaimValue::new(identity, lease_secs).to_bytes();
    let put = TxnOp::put(key.as_str(), value, Some(PutOptions::new().with_lease(lease_id)));
    let txn = Txn::new()
        .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
        .and_then([put]);
    let created = client.txn(txn).await.map_err(|e| Error::Create(key.clone(), e))?;
    let revision = created.header().map_or(0, |h| h.revision());
    if !created.succeeded() || revision == 0 {
        let _ = client.lease_revoke(lease_id).await;
        let taken = etcd_client::Error::InvalidArgs("a key of that name exists".into());
        return Err(Error::Create(key, taken));
    }
    let release = EtcdRelease {
        client: client.clone(),
        key: key.clone(),
        lease_id,
    };
    let renewer = EtcdRenewer::new(Etcd {
        client: client.clone(),
        key: key.clone(),
        lease_id,
    });
    let (session, task) = Session::start(claim, lease, (sent, Cadence::Holding), renewer);
    let prefix = lock_prefix(backend, ns, name);
    let claim = KeyClaim {
        client,
        prefix,
        key,
        lease_id,
        revision,
        max_holders,
        lock: None,
    };
    Ok((claim, Arc::new(release), session, task))
}

// === impl KeyClaim ===

impl KeyClaim {
    /// Wait until the claim holds (`until` bounds it; `try_only` returns at once when
    /// keys are ahead). Woken by a watch, never by polling ([`wake_on`]): next in line
    /// it holds at the event that frees its slot; further back it reads again when
    /// woken.
    async fn wait(&mut self, session: &Session, until: Option<Instant>, try_only: bool) -> Result<Waited, Error> {
        loop {
            // Up to maxHolders + 1 of the keys created before this one, the nearest
            // first. (etcd counts a range before its revision filters: count the keys
            // returned.)
            let limit = i64::from(self.max_holders.max(1)) + 1;
            let ahead = GetOptions::new()
                .with_prefix()
                .with_keys_only()
                .with_max_create_revision(self.revision - 1)
                .with_sort(SortTarget::Create, SortOrder::Descend)
                .with_limit(limit);
            let check =
                on_own_lease(&self.key, self.lease_id).and_then([TxnOp::get(self.prefix.as_str(), Some(ahead))]);
            let r = self
                .client
                .txn(check)
                .await
                .map_err(|e| Error::Read(self.prefix.clone(), e))?;
            if !r.succeeded() {
                return Ok(Waited::Lost);
            }
            let at = r.header().map_or(0, |h| h.revision());
            let Some(TxnOpResponse::Get(got)) = r.op_responses().into_iter().next() else {
                return Ok(Waited::Lost);
            };
            let count = got.kvs().len() as i64;
            if holds(count, self.max_holders) {
                match self.confirm(count, session, until, try_only).await {
                    Confirmed::Ends(waited) => return Ok(waited),
                    Confirmed::ReadAgain => continue,
                    Confirmed::WaitsOn => {} // lowered: by the value stored now
                }
            }
            if try_only {
                return Ok(Waited::WouldBlock);
            }
            let deadline = deadline_at(until);
            let woke = match wake_on(count, self.max_holders) {
                WakeOn::Tracking => {
                    let ahead = got.kvs().iter().map(|kv| kv.key().to_vec()).collect();
                    self.wait_tracking(ahead, at, session, deadline).await?
                }
                WakeOn::SecondAhead => {
                    let (nearest, second) = (got.kvs()[0].key().to_vec(), got.kvs()[1].key().to_vec());
                    self.wait_woken(second, WatchOptions::new(), at, session, (deadline, Some(nearest)))
                        .await?
                }
                WakeOn::AnyDeletion => {
                    let prefix = self.prefix.clone().into_bytes();
                    let options = WatchOptions::new().with_prefix();
                    self.wait_woken(prefix, options, at, session, (deadline, None)).await?
                }
            };
            if let Some(waited) = woke {
                return Ok(waited);
            }
        }
    }

    /// Watch the lock's whole prefix from revision `at + 1`, tracking `ahead` (every key
    /// ahead at `at`): the outcome at the event that decides it; `None` when the watch
    /// ended (read again).
    async fn wait_tracking(
        &mut self,
        mut ahead: BTreeSet<Vec<u8>>,
        at: i64,
        session: &Session,
        deadline: impl std::future::Future<Output = ()>,
    ) -> Result<Option<Waited>, Error> {
        let options = WatchOptions::new().with_prefix().with_start_revision(at + 1);
        let mut stream = self
            .client
            .watch(self.prefix.as_str(), Some(options))
            .await
            .map_err(|e| Error::Watch(self.prefix.clone(), e))?;
        let (own, max_holders, granted) = (self.key.as_bytes(), self.max_holders, self.revision);
        let tracked = async {
            while let Some(r) = stream.message().await? {
                if r.canceled() {
                    break;
                }
                let changes = r.events().iter().filter_map(|e| {
                    let kv = e.kv()?;
                    Some(match e.event_type() {
                        EventType::Put => KeyChange::Put(kv.key()),
                        EventType::Delete => KeyChange::Delete(kv.key()),
                    })
                });
                match track_ahead(&mut ahead, own, changes, max_holders) {
                    // No key ahead: within any maxHolders. Beside others: read again
                    // (and the lock's maxHolders, `confirm`).
                    Tracked::Holds if ahead.is_empty() => return Ok(Some(Waited::Granted(granted))),
                    Tracked::Holds => return Ok(None),
                    Tracked::Lost => return Ok(Some(Waited::Lost)),
                    Tracked::Waiting => {}
                }
            }
            Ok(None)
        };
        tokio::select! {
            t = tracked => t.map_err(|e: etcd_client::Error| Error::Watch(self.prefix.clone(), e)),
            _ = session.lost() => Ok(Some(Waited::Lost)),
            _ = deadline => Ok(Some(Waited::TimedOut)),
        }
    }

    /// Watch `target` (with `options`) for a deletion, and the claim's own key, from
    /// revision `at + 1`: `None` when woken (read again), else the outcome. With
    /// `nearest` (the key next ahead, `target` being the one second ahead), the read
    /// after `target`'s deletion waits [`SECOND_AHEAD_SETTLE`], or until `nearest` goes.
    async fn wait_woken(
        &mut self,
        target: Vec<u8>,
        options: WatchOptions,
        at: i64,
        session: &Session,
        (deadline, nearest): (impl std::future::Future<Output = ()>, Option<Vec<u8>>),
    ) -> Result<Option<Waited>, Error> {
        let options = options
            .with_start_revision(at + 1)
            .with_filters([WatchFilterType::NoPut]);
        let what = String::from_utf8_lossy(&target).into_owned();
        let mut ahead = self
            .client
            .watch(target, Some(options.clone()))
            .await
            .map_err(|e| Error::Watch(what.clone(), e))?;
        let mut next = match nearest {
            Some(key) => {
                let name = String::from_utf8_lossy(&key).into_owned();
                let watch = self.client.watch(key, Some(options)).await;
                Some((watch.map_err(|e| Error::Watch(name.clone(), e))?, name))
            }
            None => None,
        };
        let mut mine = self.watch_own(at + 1).await?;
        let second = async { deletion(&mut ahead).await.map_err(|e| Error::Watch(what, e)) };
        let woken = async {
            match next.as_mut() {
                Some((next, name)) => {
                    let nearest = async { deletion(next).await.map_err(|e| Error::Watch(name.clone(), e)) };
                    read_after(second, nearest, SECOND_AHEAD_SETTLE).await
                }
                None => second.await,
            }
        };
        tokio::select! {
            woke = woken => woke.map(|()| None),
            _ = changed(&mut mine) => Ok(Some(Waited::Lost)),
            _ = session.lost() => Ok(Some(Waited::Lost)),
            _ = deadline => Ok(Some(Waited::TimedOut)),
        }
    }

    /// What a claim with `ahead` keys ahead of it, fewer than the `maxHolders` it last
    /// read, does: with none ahead it holds (within any `maxHolders`); beside others, it
    /// first reads the lock afresh, so that a `maxHolders` the user lowered while it
    /// waited counts (it then waits on by the new value); a lock deleted meanwhile, by
    /// the value last read (it can change no more). Until a read answers (within
    /// [`SPEC_READ_TIMEOUT`]) it does not hold beside others: it reads again
    /// [`SPEC_REREAD_DELAY`] later (a try answers that it would block). Its deadline and
    /// the session's loss end the wait meanwhile.
    async fn confirm(&mut self, ahead: i64, session: &Session, until: Option<Instant>, try_only: bool) -> Confirmed {
        if ahead == 0 {
            return Confirmed::Ends(Waited::Granted(self.revision));
        }
        let last = self.max_holders;
        let read = async {
            let LockRef { api, name } = self.lock.as_ref()?;
            match tokio::time::timeout(SPEC_READ_TIMEOUT, api.get_opt(name)).await {
                Ok(Ok(Some(lock))) => Some(lock.spec.max_holders),
                Ok(Ok(None)) => {
                    tracing::info!(lock = name, "the lock is gone; by the maxHolders last read");
                    Some(last)
                }
                Ok(Err(e)) => {
                    tracing::warn!(lock = name, error = %e, "reading maxHolders failed; not holding beside others");
                    None
                }
                Err(_) => {
                    tracing::warn!(lock = name, "reading maxHolders timed out; not holding beside others");
                    None
                }
            }
        };
        let deadline = deadline_at(until);
        tokio::pin!(deadline);
        let read = tokio::select! {
            read = read => read,
            _ = session.lost() => return Confirmed::Ends(Waited::Lost),
            _ = &mut deadline => return Confirmed::Ends(Waited::TimedOut),
        };
        match read {
            Some(max) if holds(ahead, max) => return Confirmed::Ends(Waited::Granted(self.revision)),
            Some(max) => {
                self.max_holders = max;
                return Confirmed::WaitsOn;
            }
            None if try_only => return Confirmed::Ends(Waited::WouldBlock),
            None => {}
        }
        tokio::select! {
            _ = tokio::time::sleep(SPEC_REREAD_DELAY) => Confirmed::ReadAgain,
            _ = session.lost() => Confirmed::Ends(Waited::Lost),
            _ = deadline => Confirmed::Ends(Waited::TimedOut),
        }
    }

    async fn watch_own(&mut self, from: i64) -> Result<WatchStream, Error> {
        let options = WatchOptions::new().with_start_revision(from);
        self.client
            .watch(self.key.as_str(), Some(options))
            .await
            .map_err(|e| Error::Watch(self.key.clone(), e))
    }

    /// After a grant: report the session lost as soon as the claim key is moved (held
    /// back by the controller) or deleted. The watch starts at the key's creation; one
    /// that breaks or is cancelled (etcd compacted that history away, as it does to a
    /// claim that waited long) reads the key afresh and watches on from that read, so
    /// it is not cancelled again and again; meanwhile the renewals' check stands guard.
    fn watch_revocation(mut self, session: Arc<Session>) {
        tokio::spawn(async move {
            let mut state = session.state();
            let mut from = self.revision + 1;
            loop {
                let watch = tokio::select! {
                    _ = state.wait_for(|s| *s != State::Live) => return,
                    w = self.watch_own(from) => w,
                };
                if let Ok(mut stream) = watch {
                    let seen = tokio::select! {
                        _ = state.wait_for(|s| *s != State::Live) => return,
                        seen = next_change(&mut stream) => seen,
                    };
                    match seen {
                        Ok(Some((EventType::Delete, _))) => return lose(&session, LostReason::ClaimGone),
                        Ok(Some((EventType::Put, _))) => return lose(&session, LostReason::Revoked),
                        Ok(None) | Err(_) => {}
                    }
                }
                tokio::time::sleep(REWATCH_DELAY).await;
                match self.own_key_now().await {
                    Ok(None) => return lose(&session, LostReason::ClaimGone),
                    Ok(Some((lease, _))) if lease != self.lease_id => return lose(&session, LostReason::Revoked),
                    Ok(Some((_, read_at))) => from = read_at + 1,
                    Err(_) => {} // the watch is tried again from where it was
                }
            }
        });
    }

    /// The claim key as stored now: `None` when it is gone; else the lease it is on and
    /// the revision of the read.
    async fn own_key_now(&mut self) -> Result<Option<(i64, i64)>, etcd_client::Error> {
        let got = self.client.get(self.key.as_str(), None).await?;
        let read_at = got.header().map_or(0, |h| h.revision());
        Ok(got.kvs().first().map(|kv| (kv.lease(), read_at)))
    }
}

/// Completes at `until` (never, with `None`).
async fn deadline_at(until: Option<Instant>) {
    match until {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

fn lose(session: &Session, reason: LostReason) {
    tracing::warn!(claim = session.claim, ?reason, "the claim key was taken away");
    session.lose(reason);
}

/// The next change of a watched key: its kind and revision; `None` when the stream ended.
async fn next_change(stream: &mut WatchStream) -> Result<Option<(EventType, i64)>, etcd_client::Error> {
    loop {
        let Some(r) = stream.message().await? else {
            return Ok(None);
        };
        if r.canceled() {
            return Ok(None);
        }
        if let Some(e) = r.events().first() {
            return Ok(Some((e.event_type(), e.kv().map_or(0, |kv| kv.mod_revision()))));
        }
    }
}

/// When a mutex's waiter reads again: `settle` after `second` (the key second ahead goes:
/// the key next ahead holds now, or soon will, and its process starts), or at once when
/// `nearest` (the key next ahead goes); an error of either at once.
async fn read_after<E>(
    second: impl std::future::Future<Output = Result<(), E>>,
    nearest: impl std::future::Future<Output = Result<(), E>>,
    settle: Duration,
) -> Result<(), E> {
    tokio::pin!(nearest);
    tokio::select! {
        gone = &mut nearest => return gone,
        gone = second => gone?,
    }
    tokio::select! {
        gone = nearest => gone,
        () = tokio::time::sleep(settle) => Ok(()),
    }
}

/// Completes at the first deletion the stream shows (or when it ends: look again).
async fn deletion(stream: &mut WatchStream) -> Result<(), etcd_client::Error> {
    loop {
        match next_change(stream).await? {
            None | Some((EventType::Delete, _)) => return Ok(()),
            Some(_) => {}
        }
    }
}

/// Completes at the first change of the claim's own key; pends if the watch breaks
/// (the renewals' check then finds a change).
async fn changed(stream: &mut WatchStream) {
    match next_change(stream).await {
        Ok(Some(_)) => {}
        _ => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deletion at `after` (never, with `None`).
    async fn gone_at(after: Option<u64>) -> Result<(), ()> {
        match after {
            Some(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
            None => std::future::pending().await,
        }
        Ok(())
    }

    /// When `read_after` completes, in ms from the start, for the key second ahead and
    /// the key next ahead going at those times.
    async fn read_at(second: Option<u64>, nearest: Option<u64>) -> u64 {
        let start = Instant::now();
        read_after(gone_at(second), gone_at(nearest), Duration::from_millis(10))
            .await
            .unwrap();
        start.elapsed().as_millis() as u64
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_woken_by_the_release_two_ahead_reads_after_the_settle_or_when_the_next_key_goes() {
        // The release two ahead: read 10 ms after it, not at once.
        assert_eq!(read_at(Some(5), None).await, 15);
        // The key next ahead goes within those 10 ms: read then.
        assert_eq!(read_at(Some(5), Some(8)).await, 8);
        // The key next ahead goes first (withdrawn): read at once.
        assert_eq!(read_at(None, Some(3)).await, 3);
        assert_eq!(read_at(Some(20), Some(3)).await, 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_watch_ends_the_wait_at_once() {
        let failed = async { Err::<(), &str>("broken") };
        let never = std::future::pending::<Result<(), &str>>();
        let r = read_after(failed, never, Duration::from_secs(60)).await;
        assert_eq!(r, Err("broken"));
    }
}
