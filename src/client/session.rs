//! A claim's session: create the claim, keep it renewed, and publish whether it still
//! stands on a watch channel.
//!
//! One background task owns the renewals; whoever else learns that the claim is lost
//! (the lock's watch seeing a revocation) reports it through [`Session::lose`]. The
//! timing follows [`crate::protocol::timing`]: `lost` is published no later than
//! [`client_stop_by`] the moment the last successful write was sent.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, Patch, PatchParams, PostParams};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::Error;
use crate::protocol::claim::{self, PodIdentity};
use crate::protocol::release::Secret;
use crate::protocol::timing::{client_stop_by, renew_interval, renew_timeout};

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
    /// How the claim is given up.
    release: Release,
    state: watch::Sender<State>,
}

/// How a claim is given up, by backend. (One per claim: its size does not matter.)
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
pub(crate) enum Release {
    /// Write the release mark on the claim Lease: the secret whose hash the claim
    /// carries proves the mark is the owner's.
    Kube { leases: Api<Lease>, secret: Secret },
    /// Revoke the claim's etcd lease.
    #[cfg(feature = "etcd")]
    Etcd(crate::etcd::claim::EtcdRelease),
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

struct KubeRenewer {
    leases: Api<Lease>,
    name: String,
}

impl Renewer for KubeRenewer {
    async fn renew(&mut self) -> Renewal {
        let patch = Patch::Merge(claim::renew_patch());
        match self.leases.patch(&self.name, &PatchParams::default(), &patch).await {
            Ok(_) => Renewal::Renewed,
            Err(kube::Error::Api(s)) if s.is_not_found() => Renewal::Gone,
            Err(e) => Renewal::Failed(e.to_string()),
        }
    }
}

// === impl Session ===

impl Session {
    /// Create the claim for `lock` and start renewing it; the handle is the renewal task.
    pub async fn create(
        leases: Api<Lease>,
        lock: &str,
        identity: &PodIdentity,
        lease_secs: i32,
    ) -> Result<(Arc<Session>, JoinHandle<()>), Error> {
        let name = claim::claim_name(lock);
        let lease = Duration::from_secs(lease_secs.max(1) as u64);
        let secret = Secret::generate();
        let obj = claim::claim_lease_with(&name, lock, identity, lease_secs, Some(&secret));
        // The first deadline counts from when the create was sent, like every renewal's.
        let sent = Instant::now();
        leases
            .create(&PostParams::default(), &obj)
            .await
            .map_err(Error::CreateClaim)?;
        let renewer = KubeRenewer {
            leases: leases.clone(),
            name: name.clone(),
        };
        Ok(Session::start(
            name,
            lease,
            Release::Kube { leases, secret },
            sent,
            renewer,
        ))
    }

    /// A session for a claim created when `sent` was sent, renewed by `renewer`.
    pub fn start(
        claim: String,
        lease: Duration,
        release: Release,
        sent: Instant,
        renewer: impl Renewer,
    ) -> (Arc<Session>, JoinHandle<()>) {
        let (state, _) = watch::channel(State::Live);
        let session = Arc::new(Session {
            claim,
            lease,
            release,
            state,
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

    /// Stop renewing and mark the claim released (one write, bounded by the renewal
    /// timeout: when it cannot be written, the claim expires instead).
    pub async fn end(&self) -> Result<(), Error> {
        self.finish();
        self.release_mark().await
    }

    /// Write the release mark (bounded by the renewal timeout).
    pub async fn release_mark(&self) -> Result<(), Error> {
        let limit = renew_timeout(self.lease);
        let released = async {
            match &self.release {
                Release::Kube { leases, secret } => mark_released(leases, &self.claim, secret).await,
                #[cfg(feature = "etcd")]
                Release::Etcd(r) => r.release().await.map_err(Error::from),
            }
        };
        tokio::time::timeout(limit, released)
            .await
            .map_err(|_| Error::ReleaseTimeout(limit))?
    }
}

/// Mark a claim released; a claim that is already gone counts as released.
async fn mark_released(leases: &Api<Lease>, name: &str, secret: &Secret) -> Result<(), Error> {
    let patch = Patch::Merge(claim::release_patch_with(secret));
    match leases.patch(name, &PatchParams::default(), &patch).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.is_not_found() => Ok(()),
        Err(e) => Err(Error::Release(e)),
    }
}

/// Renew every [`renew_interval`] while the session is live; publish `Lost` when the
/// claim is gone or when renewals have failed until the safety deadline. The deadline
/// fires on time whatever request is in flight: a black-holed connection, where a
/// request hangs until its timeout, must not delay it.
async fn renew(session: Arc<Session>, created_sent: Instant, mut renewer: impl Renewer) {
    let (name, lease) = (session.claim.as_str(), session.lease);
    let mut state = session.state();
    let mut deadline = client_stop_by(created_sent, lease);
    let mut next = created_sent + renew_interval(lease);
    let mut backoff = Duration::from_millis(100);
    loop {
        tokio::select! {
            _ = state.wait_for(|s| *s != State::Live) => return,
            _ = tokio::time::sleep_until(deadline) => return give_up(&session),
            _ = tokio::time::sleep_until(next) => {}
        }
        let sent = Instant::now();
        let request = tokio::time::timeout(renew_timeout(lease), renewer.renew());
        let outcome = tokio::select! {
            _ = state.wait_for(|s| *s != State::Live) => return,
            _ = tokio::time::sleep_until(deadline) => return give_up(&session),
            outcome = request => outcome,
        };
        match outcome {
            Ok(Renewal::Renewed) => {
                deadline = client_stop_by(sent, lease);
                next = sent + renew_interval(lease);
                backoff = Duration::from_millis(100);
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
                next = Instant::now() + backoff;
                backoff = (backoff * 2).min(renew_interval(lease));
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

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use bytes::Bytes;
    use http_body_util::Full;

    use super::*;

    fn identity() -> PodIdentity {
        PodIdentity {
            name: "p".into(),
            namespace: "ns".into(),
            uid: "u".into(),
        }
    }

    /// A client whose claim create is answered after `create_takes`, and whose every
    /// later request hangs: the path to the API server black-holes packets.
    fn black_holed_after_create(create_takes: Duration) -> Api<Lease> {
        let service = tower::service_fn(move |req: http::Request<kube::client::Body>| async move {
            if req.method() != http::Method::POST {
                std::future::pending::<()>().await;
            }
            tokio::time::sleep(create_takes).await;
            let lease = serde_json::json!({
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": { "name": "l-1", "namespace": "ns", "resourceVersion": "1" },
            });
            Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from(lease.to_string()))))
        });
        Api::namespaced(kube::Client::new(service, "ns"), "ns")
    }

    #[tokio::test(start_paused = true)]
    async fn lost_fires_by_the_deadline_while_a_renewal_hangs() {
        for secs in [1, 3, 15, 60, 3600] {
            let lease = Duration::from_secs(secs);
            let sent = Instant::now();
            let leases = black_holed_after_create(Duration::from_millis(100));
            let (session, task) = Session::create(leases, "l", &identity(), secs as i32).await.unwrap();
            session.lost().await;
            let at = Instant::now() - sent;
            assert!(
                at <= client_stop_by(Duration::ZERO, lease),
                "lease {secs}s: lost() after {at:?}, promised by {:?} after the create was sent",
                client_stop_by(Duration::ZERO, lease)
            );
            assert_eq!(*session.state().borrow(), State::Lost(LostReason::RenewalsFailed));
            task.await.unwrap();
        }
    }
}
