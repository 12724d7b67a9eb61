//! A claim's session: create the claim, keep it renewed, and publish whether it still
//! stands on a watch channel.
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

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, Patch, PatchParams, PostParams};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::Error;
use crate::protocol::claim::{self, PodIdentity};
use crate::protocol::release::Secret;
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
    /// How the claim is given up.
    release: Release,
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

/// How a claim is given up, by backend. (One per claim: its size does not matter.)
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
pub(crate) enum Release {
    /// Write the release mark on the claim Lease: the secret whose hash the claim
    /// carries proves the mark is the owner's. A holder first tells the controller at
    /// `notice_target` (the URL its lock's status published, see
    /// [`crate::protocol::notice`]), and marks the claim only when that is answered as
    /// written with a signature by the key the same status published.
    Kube {
        leases: Api<Lease>,
        secret: Secret,
        /// The claim's (namespace, lock).
        lock: (String, String),
        /// The claim's UID, from its creation.
        uid: Option<String>,
        notice_target: std::sync::Mutex<Option<super::notice::NoticeTarget>>,
    },
    /// Give the claim up through the backend that keeps it (the etcd backend: revoke
    /// its lease). Only another backend makes one.
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))]
    Backend(Box<dyn Releaser>),
}

/// How a backend other than Kubernetes gives a claim up: the seam a backend plugs its
/// release into, so that the session names no backend.
pub(crate) trait Releaser: Send + Sync + std::fmt::Debug {
    /// Give the claim up; a claim already gone counts as released.
    fn release(&self) -> futures::future::BoxFuture<'_, Result<(), Error>>;
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
    /// The claim's UID: only that object is renewed.
    uid: Option<String>,
    /// The lock the claim asks for: a claim whose lock label someone removed or changed
    /// is no claim the controller follows, so renewing it holds nothing.
    lock: String,
}

impl Renewer for KubeRenewer {
    async fn renew(&mut self) -> Renewal {
        let patch = Patch::Merge(claim::renew_patch(self.uid.as_deref()));
        match self.leases.patch(&self.name, &PatchParams::default(), &patch).await {
            // Being deleted (the controller expired it, and something holds the object
            // back): a renewal written after the expiry's deletion is no renewal.
            Ok(lease) if lease.metadata.deletion_timestamp.is_some() => Renewal::Gone,
            Ok(lease) if claim::claim_lock(&lease) != Some(self.lock.as_str()) => Renewal::Gone,
            Ok(_) => Renewal::Renewed,
            Err(kube::Error::Api(s)) if s.is_not_found() => Renewal::Gone,
            // Another object under the claim's name: the UID in the patch is refused.
            Err(kube::Error::Api(s)) if s.is_conflict() || s.code == 422 => Renewal::Gone,
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
        let created = create_or_withdraw(&leases, &name, obj, &secret).await?;
        let renewer = KubeRenewer {
            leases: leases.clone(),
            name: name.clone(),
            uid: created.metadata.uid.clone(),
            lock: lock.to_string(),
        };
        let release = Release::Kube {
            leases,
            secret,
            lock: (identity.namespace.clone(), lock.to_string()),
            uid: created.metadata.uid,
            notice_target: Default::default(),
        };
        Ok(Session::start(name, lease, release, (sent, Cadence::Waiting), renewer))
    }

    /// A session for a claim created when `sent` was sent, renewed by `renewer` at `cadence`.
    pub fn start(
        claim: String,
        lease: Duration,
        release: Release,
        (sent, cadence): (Instant, Cadence),
        renewer: impl Renewer,
    ) -> (Arc<Session>, JoinHandle<()>) {
        let (state, _) = watch::channel(State::Live);
        let holding = (cadence == Cadence::Holding).then_some(sent);
        let session = Arc::new(Session {
            claim,
            lease,
            release,
            state,
            holding: watch::channel(holding).0,
            valid_until: watch::channel(client_stop_by(sent, lease)).0,
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
            if Instant::now() + safety_margin(self.lease) < *valid.borrow_and_update() {
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

    /// The hash of the claim's release secret, as its creation wrote it (`None` for a
    /// backend whose claims carry none).
    pub fn release_hash(&self) -> Option<String> {
        match &self.release {
            Release::Kube { secret, .. } => Some(secret.hash()),
            Release::Backend(_) => None,
        }
    }

    /// The claim as the API server has it now, read with a PATCH that changes nothing
    /// (the client Role may not GET): `Some(None)` when it is gone (deleted, or being
    /// deleted), `None` when it cannot be read (or the claim is not a Lease).
    pub async fn stored(&self) -> Option<Option<Lease>> {
        let Release::Kube { leases, uid, .. } = &self.release else {
            return None;
        };
        let probe = Patch::Merge(serde_json::json!({ "metadata": { "uid": uid } }));
        let params = PatchParams::default();
        let answer = leases.patch(&self.claim, &params, &probe);
        match tokio::time::timeout(renew_timeout(self.lease), answer).await {
            Ok(Ok(l)) => Some(Some(l).filter(|l| l.metadata.deletion_timestamp.is_none())),
            Ok(Err(kube::Error::Api(s))) if s.is_not_found() || s.is_conflict() || s.code == 422 => Some(None),
            _ => None,
        }
    }

    /// Where the controller takes release notices, and the key its written answer must
    /// be signed by, as the lock's status last said (see [`crate::protocol::notice`]);
    /// `None` when it says nothing.
    pub fn set_notice_target(&self, target: Option<super::notice::NoticeTarget>) {
        if let Release::Kube { notice_target, .. } = &self.release {
            let mut current = notice_target.lock().expect("notice target lock poisoned");
            if *current != target {
                if let Some(t) = &target {
                    super::notice::probe(&t.url, self.lease);
                }
                *current = target;
            }
        }
    }

    /// What the owner shows when it waits for a direct grant (`None` on etcd, which
    /// has no direct grants).
    pub fn wait_proof(&self) -> Option<String> {
        match &self.release {
            Release::Kube { secret, .. } => Some(secret.wait_proof()),
            Release::Backend(_) => None,
        }
    }

    /// Stop renewing and give the claim up: a holder tells the controller first (when
    /// its lock published where), and is done if the controller answers that the
    /// release is written; otherwise the claim is marked released (one write, bounded by
    /// the renewal timeout: when it cannot be written, the claim expires instead).
    pub async fn end(&self) -> Result<(), Error> {
        let held = self.holding.borrow().is_some();
        self.finish();
        if held && self.notice_written().await {
            return Ok(());
        }
        self.release_mark().await
    }

    /// Send the release notice, if the lock published where; whether it was written.
    async fn notice_written(&self) -> bool {
        let Release::Kube {
            secret,
            lock: (namespace, lock),
            notice_target,
            ..
        } = &self.release
        else {
            return false;
        };
        let Some(target) = notice_target.lock().expect("notice target lock poisoned").clone() else {
            return false;
        };
        let notice = crate::protocol::notice::Notice {
            namespace: namespace.clone(),
            lock: lock.clone(),
            claim: self.claim.clone(),
            secret: secret.reveal().to_string(),
        };
        super::notice::written(&target, &notice, self.lease).await
    }

    /// Write the release mark (bounded by the renewal timeout).
    pub async fn release_mark(&self) -> Result<(), Error> {
        let limit = renew_timeout(self.lease);
        let released = async {
            match &self.release {
                Release::Kube {
                    leases,
                    secret,
                    lock: (_, lock),
                    ..
                } => mark_released(leases, (&self.claim, lock), secret).await,
                Release::Backend(r) => r.release().await,
            }
        };
        tokio::time::timeout(limit, released)
            .await
            .map_err(|_| Error::ReleaseTimeout(limit))?
    }
}

/// Create the claim `obj` (named `name`, released with `secret`). The request runs on a
/// task of its own: if this future is dropped while it is out (a caller's timeout
/// around `acquire`), the claim may still be created, with nobody to renew or withdraw
/// it, and would wait in the queue until it expired; the task then withdraws it.
async fn create_or_withdraw(leases: &Api<Lease>, name: &str, obj: Lease, secret: &Secret) -> Result<Lease, Error> {
    let (answer, answered) = tokio::sync::oneshot::channel();
    let (leases, name, secret) = (leases.clone(), name.to_string(), secret.clone());
    let lock = claim::claim_lock(&obj).unwrap_or_default().to_string();
    tokio::spawn(async move {
        let created = leases.create(&PostParams::default(), &obj).await;
        if let Err(Ok(_)) = answer.send(created) {
            match mark_released(&leases, (&name, &lock), &secret).await {
                Ok(()) => tracing::info!(claim = name, "withdrew a claim created after its acquire was dropped"),
                Err(e) => {
                    tracing::warn!(claim = name, error = %e, "withdrawing a claim created after its acquire was dropped failed; it will expire")
                }
            }
        }
    });
    match answered.await {
        Ok(created) => created.map_err(Error::CreateClaim),
        // The task was cancelled: the runtime is shutting down.
        Err(_) => Err(Error::CreateClaim(kube::Error::Service(Box::new(
            std::io::Error::other("the claim's create task ended without an answer"),
        )))),
    }
}

/// Mark a claim released; a claim that is already gone counts as released.
async fn mark_released(leases: &Api<Lease>, (name, lock): (&str, &str), secret: &Secret) -> Result<(), Error> {
    let patch = Patch::Merge(claim::release_patch_with(lock, secret));
    match leases.patch(name, &PatchParams::default(), &patch).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.is_not_found() => Ok(()),
        Err(e) => Err(Error::Release(e)),
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
                session.valid_until.send_replace(client_stop_by(sent, lease));
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
        let usable = |since: Instant| deadline > since + safety_margin(lease);
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

    /// The body of the mocked API server's answers: the claim Lease.
    fn claim_json() -> serde_json::Value {
        serde_json::json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {
                "name": "l-1", "namespace": "ns", "resourceVersion": "1",
                "labels": { crate::protocol::LOCK_LABEL: "l" },
            },
        })
    }

    /// A client whose claim create is answered after `create_takes`, and whose every
    /// later request hangs: the path to the API server black-holes packets.
    fn black_holed_after_create(create_takes: Duration) -> Api<Lease> {
        let service = tower::service_fn(move |req: http::Request<kube::client::Body>| async move {
            if req.method() != http::Method::POST {
                std::future::pending::<()>().await;
            }
            tokio::time::sleep(create_takes).await;
            let lease = claim_json();
            Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from(lease.to_string()))))
        });
        Api::namespaced(kube::Client::new(service, "ns"), "ns")
    }

    #[tokio::test(start_paused = true)]
    async fn a_claim_created_after_its_acquire_was_dropped_is_withdrawn() {
        // The create is answered after 200 ms; every PATCH's body is reported.
        let (tx, mut patches) = tokio::sync::mpsc::unbounded_channel();
        let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
            let tx = tx.clone();
            async move {
                let is_post = req.method() == http::Method::POST;
                let body = http_body_util::BodyExt::collect(req.into_body())
                    .await
                    .unwrap()
                    .to_bytes();
                if is_post {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                } else {
                    tx.send(String::from_utf8_lossy(&body).into_owned()).unwrap();
                }
                let lease = claim_json();
                Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from(lease.to_string()))))
            }
        });
        let leases = Api::namespaced(kube::Client::new(service, "ns"), "ns");
        let pod = identity();
        let create = Session::create(leases, "l", &pod, 15);
        let dropped = tokio::time::timeout(Duration::from_millis(50), create).await;
        assert!(dropped.is_err(), "the caller gave up while the create was out");
        let patch = tokio::time::timeout(Duration::from_secs(10), patches.recv())
            .await
            .expect("the claim created after all is withdrawn")
            .unwrap();
        assert!(
            patch.contains(crate::protocol::RELEASED_ANNOTATION),
            "with a release mark: {patch}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_holder_rides_out_an_api_server_outage_that_ends_before_its_deadline() {
        // Renewals are refused (503) for the first 10 s; the holder's deadline is 11.25 s
        // after its create (lease 15 s), its first renewal due at 5 s.
        let start = Instant::now();
        let service = tower::service_fn(move |req: http::Request<kube::client::Body>| async move {
            let lease = claim_json();
            let down = req.method() == http::Method::PATCH && Instant::now() < start + Duration::from_secs(10);
            let (code, body) = if down {
                (503, "{}".to_string())
            } else {
                (200, lease.to_string())
            };
            let response = http::Response::builder()
                .status(code)
                .body(Full::new(Bytes::from(body)));
            Ok::<_, Infallible>(response.unwrap())
        });
        let leases = Api::namespaced(kube::Client::new(service, "ns"), "ns");
        let (session, _task) = Session::create(leases, "l", &identity(), 15).await.unwrap();
        session.hold().await.unwrap();
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert!(
            session.is_live(),
            "a retry between the outage's end and the deadline renews: {:?}",
            *session.state().borrow()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn lost_fires_by_the_deadline_while_a_renewal_hangs() {
        for secs in [1, 3, 15, 60, 3600] {
            let lease = Duration::from_secs(secs);
            let sent = Instant::now();
            let leases = black_holed_after_create(Duration::from_millis(100));
            let (session, task) = Session::create(leases, "l", &identity(), secs as i32).await.unwrap();
            session
                .hold()
                .await
                .expect("granted right after the create: its deadline is ahead");
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

    /// A client whose claim create is answered at once and whose renewals (PATCHes)
    /// are answered after `patch_takes`, counting them.
    fn counting_patches(patch_takes: Duration) -> (Api<Lease>, Arc<std::sync::atomic::AtomicUsize>) {
        let patches = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let seen = patches.clone();
        let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
            let seen = seen.clone();
            async move {
                if req.method() == http::Method::PATCH {
                    tokio::time::sleep(patch_takes).await;
                    seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
                let lease = claim_json();
                Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from(lease.to_string()))))
            }
        });
        (Api::namespaced(kube::Client::new(service, "ns"), "ns"), patches)
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiting_claim_writes_once_a_minute_and_a_held_one_every_third_of_its_lease() {
        let (leases, patches) = counting_patches(Duration::from_millis(5));
        let (session, _task) = Session::create(leases, "l", &identity(), 15).await.unwrap();
        tokio::time::sleep(Duration::from_secs(600)).await;
        let waiting = patches.load(std::sync::atomic::Ordering::SeqCst);
        assert!(waiting <= 10, "{waiting} renewals in 10 minutes of waiting");
        assert!(waiting >= 9, "{waiting} renewals in 10 minutes: a waiter still renews");
        assert!(session.is_live(), "a waiter whose deadline passed is not lost");
        session.hold().await.unwrap();
        tokio::time::sleep(Duration::from_secs(60)).await;
        let holding = patches.load(std::sync::atomic::Ordering::SeqCst) - waiting;
        assert!(
            (12..=13).contains(&holding),
            "{holding} renewals in a minute of holding a 15 s lease"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_claim_granted_after_its_deadline_holds_only_once_a_renewal_is_acknowledged() {
        let lease = Duration::from_secs(15);
        let takes = Duration::from_secs(2);
        let (leases, patches) = counting_patches(takes);
        let (session, _task) = Session::create(leases, "l", &identity(), 15).await.unwrap();
        // Granted 100 s on: its last write (the renewal at 60 s) stops it by 71.25 s.
        tokio::time::sleep(Duration::from_secs(100)).await;
        let before = patches.load(std::sync::atomic::Ordering::SeqCst);
        let granted = Instant::now();
        session.hold().await.unwrap();
        assert_eq!(
            patches.load(std::sync::atomic::Ordering::SeqCst),
            before + 1,
            "holds on a renewal"
        );
        assert!(
            Instant::now() >= granted + takes,
            "not before the renewal is acknowledged"
        );
        let valid = *session.valid_until.borrow();
        assert_eq!(
            valid,
            client_stop_by(granted, lease),
            "counted from the renewal's sending"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_whose_renewals_fail_gives_up_only_when_its_wait_lease_may_be_over() {
        let lease = Duration::from_secs(15);
        let created = Instant::now();
        let leases = black_holed_after_create(Duration::from_millis(100));
        let (session, task) = Session::create(leases, "l", &identity(), 15).await.unwrap();
        session.lost().await;
        let at = created.elapsed();
        let by = client_stop_by(Duration::ZERO, crate::protocol::timing::wait_lease(lease));
        assert!(
            at > client_stop_by(Duration::ZERO, lease) * 10,
            "gave up after {at:?}: judged by its lease"
        );
        assert!(at <= by, "gave up after {at:?}, promised by {by:?}");
        assert_eq!(*session.state().borrow(), State::Lost(LostReason::RenewalsFailed));
        task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_is_not_lost_to_failing_renewals_but_a_claim_granted_then_is_within_its_lease() {
        let lease = Duration::from_secs(15);
        let leases = black_holed_after_create(Duration::from_millis(100));
        let (session, task) = Session::create(leases, "l", &identity(), 15).await.unwrap();
        tokio::time::sleep(Duration::from_secs(100)).await;
        assert!(session.is_live(), "waiting: its holder's deadline is no deadline");
        let granted = Instant::now();
        assert_eq!(session.hold().await, Err(LostReason::RenewalsFailed));
        assert!(
            Instant::now() <= granted + lease,
            "gave up {:?} after the grant",
            granted.elapsed()
        );
        task.await.unwrap();
    }
}
