//! The Kubernetes backend of the client: a claim is a Lease in the pod's namespace,
//! and the lock's status (read by a watch, never by polling) says when it is granted;
//! a designated successor may be granted directly by the controller over HTTP
//! ([`grant_wait`]), and a holder tells the controller of its release ([`notice`]).
//!
//! Files: `lease` (the claim Lease: create, renew, give up), `wait` (the wait for a
//! grant), `watch` (the lock's watch), `grant_wait` and `notice`.

mod grant_wait;
pub(crate) mod lease;
mod notice;
mod wait;
mod watch;

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Client;
use kube::api::Api;

use self::lease::KubeClaim;
use self::notice::NoticeTarget;
use self::wait::Outcome;
use self::watch::{LockWatch, Seen};
use super::backend::{Backend, Claim, Granted, Mode, Request, Withdraw, withdraw_now};
use super::session::{LostReason, Session};
use super::{Error, State};
use crate::api::{DEFAULT_LEASE_DURATION_SECONDS, DistributedLock};
use crate::protocol::record::Claimed;
use crate::protocol::still_grants;
use crate::protocol::timing::{WAIT_CHECK, claim_anew_pause, renew_interval};

/// The Lease backend: reads the lock with `client`, writes claims with `writes`.
#[derive(Clone)]
pub(crate) struct Kube {
    /// Reads and watches the DistributedLock.
    pub client: Client,
    /// Writes the claim (create, renewals, the release): a pool of its own, see
    /// [`super::LockBuilder::write_client`].
    pub writes: Client,
    /// Set once a watch of one of this handle's claims was refused (a client Role
    /// without `watch` on Leases): its claims ask for no grant written on them from
    /// then on ([`crate::protocol::GRANT_WATCH_ANNOTATION`]).
    pub claim_watch_refused: Arc<std::sync::atomic::AtomicBool>,
}

impl Backend for Kube {
    fn acquire<'a>(&'a self, request: Request<'a>) -> BoxFuture<'a, Result<Option<Granted>, Error>> {
        Box::pin(self.acquire(request))
    }
}

// === impl Kube ===

impl Kube {
    /// The Leases of `ns` for a claim's writes, and for its watches while designated.
    ///
    /// The watches go on the lock's client, not the write pool: a watch holds an
    /// HTTP/1.1 connection for as long as it runs, and one ended unfinished at the grant
    /// closes it, so the release mark that ends the section waited for a new connection
    /// and its TLS handshake (0.75 ms of a 6.5 ms handoff without release notices,
    /// measured), and every designation cost the API server two handshakes.
    fn claim_leases(&self, ns: &str) -> (Api<Lease>, Api<Lease>) {
        (
            Api::namespaced(self.writes.clone(), ns),
            Api::namespaced(self.client.clone(), ns),
        )
    }

    async fn acquire(&self, request: Request<'_>) -> Result<Option<Granted>, Error> {
        let ns = &request.identity.namespace;
        let locks: Api<DistributedLock> = Api::namespaced(self.client.clone(), ns);
        let (leases, watches) = self.claim_leases(ns);
        let exists = request.lock.is_some();
        if !exists && matches!(request.mode, Mode::Try) {
            return Err(Error::NoSuchLock(request.name.to_string()));
        }
        let secs = request
            .lock
            .map_or(DEFAULT_LEASE_DURATION_SECONDS, |l| l.spec.lease_duration_seconds);
        // Watch first, so no status change between create and watch is missed. A
        // waiter reads afresh only rarely (its transport finds a dead connection); a
        // holder every renewal interval.
        let lease = Duration::from_secs(secs.max(1) as u64);
        let mut events = LockWatch::start(locks, request.name, WAIT_CHECK);
        let mut anew = ClaimsAnew::default();
        loop {
            anew.pause(&request.mode).await?;
            let (claim, session, renewal) = lease::create(
                (leases.clone(), watches.clone()),
                request.name,
                request.identity,
                (secs, &self.claim_watch_refused),
            )
            .await?;
            let given_up: Arc<dyn Claim> = claim.clone();
            // If this future is dropped from here on, the claim is withdrawn.
            let mut withdraw = Withdraw::arm(&session, &given_up);
            let wrote = wait::claimed(&request, &session, &claim);
            let outcome = wait::wait_grant(&request, &mut events, (&session, &claim), (exists, &wrote)).await;
            let outcome = match outcome {
                Ok(Outcome::Granted(token)) => hold(&session, &request.mode, token).await,
                other => other,
            };
            withdraw.disarm();
            match outcome {
                Ok(Outcome::Granted(token)) => {
                    events.check_every(renew_interval(lease));
                    watch_revocation(events, (session.clone(), claim, wrote), token);
                    let claim = given_up;
                    return Ok(Some(Granted {
                        session,
                        renewal,
                        token,
                        claim,
                    }));
                }
                Ok(again) if again.claims_anew(&session.claim) => {
                    withdraw_now(&session, given_up.as_ref()).await;
                    anew.ended(&again, &request, &session)?;
                    if matches!(request.mode, Mode::Try) {
                        return Ok(None); // a try does not wait on
                    }
                }
                other => {
                    withdraw_now(&session, given_up.as_ref()).await;
                    return other.map(|_| None);
                }
            }
        }
    }
}

/// The claims of one acquisition that ended without a grant, to claim anew after.
#[derive(Default)]
struct ClaimsAnew {
    /// Claims made so far.
    made: u32,
    /// Whether the last one vanished unplaced ([`Outcome::Vanished`]).
    vanished: bool,
}

impl ClaimsAnew {
    /// Before a claim: pause as [`claim_anew_pause`] says, ending the acquisition if
    /// the caller's time runs out first.
    async fn pause(&mut self, mode: &Mode) -> Result<(), Error> {
        let pause = claim_anew_pause(self.made);
        self.made = self.made.saturating_add(1);
        if pause.is_zero() {
            return Ok(());
        }
        let until = tokio::time::Instant::now() + pause;
        match mode {
            Mode::Until(at, _) if *at <= until => {
                tokio::time::sleep_until(*at).await;
                Err(mode.timed_out())
            }
            _ => {
                tokio::time::sleep_until(until).await;
                Ok(())
            }
        }
    }

    /// A claim ended with `outcome`, to be claimed anew: a second claim in a row gone
    /// unplaced (or a try's, which does not claim anew) was garbage-collected, its pod
    /// named wrongly.
    fn ended(&mut self, outcome: &Outcome, request: &Request<'_>, session: &Session) -> Result<(), Error> {
        let vanished = matches!(outcome, Outcome::Vanished);
        if vanished && (self.vanished || matches!(request.mode, Mode::Try)) {
            return Err(Error::ClaimCollected {
                claim: session.claim.clone(),
                pod: request.identity.name.clone(),
                uid: request.identity.uid.clone(),
            });
        }
        self.vanished = vanished;
        Ok(())
    }
}

/// A waiter renews slowly: once granted, act only once its last write's deadline is
/// ahead (within the caller's time limit, if any: past it the grant is given back).
/// A claim found gone meanwhile lapsed unseen (never acted on: claim anew); any other
/// loss ends the acquisition.
async fn hold(session: &Session, mode: &Mode, token: i64) -> Result<Outcome, Error> {
    let held = match mode {
        Mode::Until(at, _) => tokio::time::timeout_at(*at, session.hold())
            .await
            .map_err(|_| mode.timed_out())?,
        _ => session.hold().await,
    };
    match held {
        Ok(()) => Ok(Outcome::Granted(token)),
        Err(LostReason::ClaimGone) => Ok(Outcome::Lapsed),
        Err(reason) => {
            tracing::warn!(claim = session.claim, ?reason, "the claim was lost as it was granted");
            Err(Error::ClaimLost(session.claim.clone()))
        }
    }
}

/// After a grant with `token`: report the session lost as soon as the lock's status no
/// longer grants it ([`still_grants`]: a direct grant's status shows the designation
/// until the grant is written), records the claim otherwise than this process `wrote`
/// it (the one check of [`crate::protocol::record`], before and after a grant alike,
/// whether it came by the status or directly), or the lock is deleted.
fn watch_revocation(
    mut events: LockWatch,
    (session, claim, wrote): (Arc<Session>, Arc<KubeClaim>, Claimed),
    token: i64,
) {
    tokio::spawn(async move {
        let mut state = session.state();
        loop {
            let seen = tokio::select! {
                _ = state.wait_for(|s| *s != State::Live) => return,
                seen = events.next() => match seen {
                    Some(seen) => seen,
                    None => return,
                },
            };
            let reason = match seen {
                Seen::Gone => LostReason::LockDeleted,
                Seen::Lock(lock) if !grants(&lock, &session.claim, token) => lost_reason(&lock, &session.claim),
                Seen::Lock(lock) if let Err(field) = checked(&lock, &session.claim, &wrote) => {
                    tracing::warn!(claim = session.claim, field = field.field(), "{field}: stopping");
                    LostReason::Revoked
                }
                Seen::Lock(lock) => {
                    // A new leader publishes where it takes notices, and its key, with
                    // its writes.
                    claim.set_notice_target(NoticeTarget::of(&lock));
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

fn checked(lock: &DistributedLock, claim: &str, wrote: &Claimed) -> Result<(), crate::protocol::record::Tampered> {
    let check = |s| crate::protocol::record::check(s, claim, &wrote.written());
    lock.status.as_ref().map_or(Ok(()), check)
}

fn grants(lock: &DistributedLock, claim: &str, token: i64) -> bool {
    lock.status.as_ref().is_some_and(|s| still_grants(s, claim, token))
}

#[cfg(test)]
mod tests {
    use tokio::time::Instant;

    use super::*;
    use crate::testing::mock_api;

    /// A newer controller's reasons (a revocation, a refusal this release does not know)
    /// still parse: a holder reads its grant revoked, not a status it cannot read (on
    /// which it held on, its slot held back, for as long as it renewed).
    #[test]
    fn a_status_with_a_newer_controller_s_reasons_still_revokes_the_grant() {
        let lock: DistributedLock = serde_json::from_value(serde_json::json!({
            "apiVersion": "leasehold.dev/v1alpha1", "kind": "DistributedLock",
            "metadata": { "name": "l", "namespace": "ns" },
            "spec": {},
            "status": {
                "holders": [{
                    "claim": "a", "pod": "p", "podUID": "u", "fencingToken": 7,
                    "grantedAt": "2026-11-30T00:00:00Z",
                    "revoked": { "reason": "PodEvicted", "at": "2026-11-30T00:00:01Z" },
                }],
                "refused": [{ "claim": "b", "reason": "QuotaExceeded" }],
            },
        }))
        .expect("a newer controller's status parses");
        assert!(!grants(&lock, "a", 7), "revoked, whatever the reason");
        assert_eq!(lost_reason(&lock, "a"), LostReason::Revoked);
        let refused = lock.status.as_ref().unwrap().refused[0].reason;
        assert!(!refused.is_final(), "an unknown refusal is read back, as a passing one");
    }

    #[tokio::test]
    async fn a_claims_watches_go_on_the_lock_client_and_its_writes_on_the_write_pool() {
        // Each mock answers with the name of its client, in a Lease's holder.
        let named = |who: &'static str| {
            mock_api::client(move |_req| async move {
                (
                    200,
                    serde_json::json!({
                        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                        "metadata": { "name": "c" }, "spec": { "holderIdentity": who },
                    }),
                )
            })
        };
        let kube = Kube {
            client: named("lock client"),
            writes: named("write pool"),
            claim_watch_refused: Default::default(),
        };
        let (writes, watches) = kube.claim_leases("ns");
        let holder = |l: Lease| l.spec.and_then(|s| s.holder_identity).unwrap();
        assert_eq!(holder(writes.get("c").await.unwrap()), "write pool");
        assert_eq!(
            holder(watches.get("c").await.unwrap()),
            "lock client",
            "a watch on the write pool closes its connection when it ends at the grant"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn claims_anew_pause_as_the_rule_says_and_end_at_the_callers_deadline() {
        let mut anew = ClaimsAnew::default();
        let started = Instant::now();
        for _ in 0..3 {
            anew.pause(&Mode::Wait).await.unwrap();
        }
        assert_eq!(started.elapsed(), claim_anew_pause(2));
        // The fourth claim's pause (200 ms) would end past the caller's deadline.
        let at = Instant::now() + Duration::from_millis(150);
        let ended = anew.pause(&Mode::Until(at, Duration::from_secs(1))).await;
        assert!(matches!(ended, Err(Error::Timeout(_))), "{ended:?}");
        assert_eq!(Instant::now(), at);
    }
}
