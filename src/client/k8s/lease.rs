//! A claim Lease as its process keeps it: created (with the release secret's hash),
//! renewed by [`KubeRenewer`], and given up by a release notice to the controller or
//! the release mark the secret proves (see [`crate::protocol::release`]).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, Patch, PatchParams, PostParams};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::notice::{self, NoticeTarget};
use crate::client::Error;
use crate::client::backend::{Claim, GiveUp, write_within};
use crate::client::session::{Cadence, Renewal, Renewer, Session};
use crate::protocol::claim::{self, PodIdentity};
use crate::protocol::release::Secret;
use crate::protocol::timing::renew_timeout;

/// A claim Lease this process created. Its holder gives it up by telling the
/// controller at the notice target (the URL its lock's status published, see
/// [`crate::protocol::notice`]) and writes the release mark only when that is not
/// answered as written with a signature by the key the same status published.
#[derive(Debug)]
pub(crate) struct KubeClaim {
    /// The claim's writes: its creation, renewals and release mark.
    leases: Api<Lease>,
    /// The claim's watches while designated (its own, its predecessor's), on the lock
    /// handle's watch client: a watch holds its HTTP/1.1 connection for as long as it
    /// runs, and one ended unfinished closes it, so on the write pool the release
    /// mark after the grant found no open connection and waited for a TLS handshake.
    watches: Api<Lease>,
    /// The claim's name.
    name: String,
    /// The claim's (namespace, lock).
    lock: (String, String),
    /// Proves a release mark (or notice) is the owner's; its hash is on the claim.
    secret: Secret,
    /// The claim's UID, from its creation.
    uid: Option<String>,
    lease: Duration,
    notice_target: Mutex<Option<NoticeTarget>>,
    /// Shared by the claims of one lock handle: set once a watch of one was refused.
    watch_refused: Arc<std::sync::atomic::AtomicBool>,
}

/// Create the claim for `lock` and start its session (renewed at the waiting cadence);
/// the handle is the renewal task. `leases`: the Leases of the claim's namespace, for
/// its writes and for its watches ([`KubeClaim::watches`]). `watch_refused`: whether a
/// watch of an earlier claim of this lock handle was refused (then this one asks for no
/// grant written on it).
pub(crate) async fn create(
    (leases, watches): (Api<Lease>, Api<Lease>),
    lock: &str,
    identity: &PodIdentity,
    (lease_secs, watch_refused): (i32, &Arc<std::sync::atomic::AtomicBool>),
) -> Result<(Arc<KubeClaim>, Arc<Session>, JoinHandle<()>), Error> {
    let name = claim::claim_name(lock);
    let lease = Duration::from_secs(lease_secs.max(1) as u64);
    let secret = Secret::generate();
    let mut obj = claim::claim_lease_with(&name, lock, identity, lease_secs, Some(&secret));
    // This process watches its claim while designated, and its predecessor's for the
    // handover (`grant_wait`), if it may.
    if !watch_refused.load(std::sync::atomic::Ordering::Relaxed) {
        let annotations = obj.metadata.annotations.get_or_insert_default();
        for ask in [
            crate::protocol::GRANT_WATCH_ANNOTATION,
            crate::protocol::HANDOVER_WATCH_ANNOTATION,
        ] {
            annotations.insert(ask.into(), "true".into());
        }
    }
    // The first deadline counts from when the create was sent, like every renewal's.
    let sent = Instant::now();
    let created = create_or_withdraw(&leases, &name, obj, &secret).await?;
    let renewer = KubeRenewer {
        leases: leases.clone(),
        name: name.clone(),
        uid: created.metadata.uid.clone(),
        lock: lock.to_string(),
    };
    let claim = Arc::new(KubeClaim {
        leases,
        watches,
        name: name.clone(),
        lock: (identity.namespace.clone(), lock.to_string()),
        secret,
        uid: created.metadata.uid,
        lease,
        notice_target: Mutex::default(),
        watch_refused: Arc::clone(watch_refused),
    });
    let (session, task) = Session::start(name, lease, (sent, Cadence::Waiting), renewer);
    Ok((claim, session, task))
}

// === impl KubeClaim ===

impl KubeClaim {
    /// The hash of the claim's release secret, as its creation wrote it.
    pub fn release_hash(&self) -> String {
        self.secret.hash()
    }

    /// The Leases of the claim's namespace on the watch client (to watch the claim while
    /// designated), and the flag its lock handle's claims share, set once such a watch
    /// was refused.
    pub fn watches(&self) -> (Api<Lease>, Arc<std::sync::atomic::AtomicBool>) {
        (self.watches.clone(), Arc::clone(&self.watch_refused))
    }

    /// What the owner shows when it waits for a direct grant.
    pub fn wait_proof(&self) -> String {
        self.secret.wait_proof()
    }

    /// The claim as the API server has it now, read with a PATCH that changes nothing
    /// (the client Role may not GET): `Some(None)` when it is gone (deleted, or being
    /// deleted), `None` when it cannot be read.
    pub async fn stored(&self) -> Option<Option<Lease>> {
        let probe = Patch::Merge(serde_json::json!({ "metadata": { "uid": self.uid } }));
        let params = PatchParams::default();
        let answer = self.leases.patch(&self.name, &params, &probe);
        match tokio::time::timeout(renew_timeout(self.lease), answer).await {
            Ok(Ok(l)) => Some(Some(l).filter(|l| l.metadata.deletion_timestamp.is_none())),
            Ok(Err(kube::Error::Api(s))) if s.is_not_found() || s.is_conflict() || s.code == 422 => Some(None),
            _ => None,
        }
    }

    /// Where the controller takes release notices, and the key its written answer must
    /// be signed by, as the lock's status last said (see [`crate::protocol::notice`]);
    /// `None` when it says nothing.
    pub fn set_notice_target(&self, target: Option<NoticeTarget>) {
        let mut current = self.notice_target.lock().expect("notice target lock poisoned");
        if *current != target {
            if let Some(t) = &target {
                notice::probe(&t.url, self.lease);
            }
            *current = target;
        }
    }

    /// Send the release notice, if the lock published where; whether it was written.
    async fn notice_written(&self) -> bool {
        let Some(target) = self.notice_target.lock().expect("notice target lock poisoned").clone() else {
            return false;
        };
        let (namespace, lock) = &self.lock;
        let notice = crate::protocol::notice::Notice {
            namespace: namespace.clone(),
            lock: lock.clone(),
            claim: self.name.clone(),
            secret: self.secret.reveal().to_string(),
        };
        notice::written(&target, &notice, self.lease).await
    }
}

impl Claim for KubeClaim {
    /// A holder tells the controller first, and is done if the controller answers that
    /// the release is written; otherwise the claim is marked released (one write: when
    /// it cannot be written, the claim expires instead).
    fn give_up<'a>(&'a self, session: &'a Session, how: GiveUp) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            if how == GiveUp::Holder && self.notice_written().await {
                return Ok(());
            }
            let mark = mark_released(&self.leases, (&self.name, &self.lock.1), &self.secret);
            write_within(session, mark).await
        })
    }
}

/// Renews a claim Lease (its UID a precondition), and finds it gone when it is
/// deleted, being deleted, replaced, or no longer labelled for its lock.
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::client::session::{LostReason, State};
    use crate::protocol::timing::client_stop_by;
    use crate::testing::mock_api::{self, claim_lease};

    fn identity() -> PodIdentity {
        PodIdentity {
            name: "p".into(),
            namespace: "ns".into(),
            uid: "u".into(),
        }
    }

    fn leases(client: kube::Client) -> Api<Lease> {
        Api::namespaced(client, "ns")
    }

    /// `leases` for a claim's writes and its watches alike.
    fn both(leases: Api<Lease>) -> (Api<Lease>, Api<Lease>) {
        (leases.clone(), leases)
    }

    /// A client whose claim create is answered after `create_takes`, and whose every
    /// later request hangs: the path to the API server black-holes packets.
    fn black_holed_after_create(create_takes: Duration) -> Api<Lease> {
        leases(mock_api::client(move |req| async move {
            if req.method() != http::Method::POST {
                std::future::pending::<()>().await;
            }
            tokio::time::sleep(create_takes).await;
            (200, claim_lease())
        }))
    }

    /// A client whose claim create is answered at once and whose renewals (PATCHes)
    /// are answered after `patch_takes`, counting them.
    fn counting_patches(patch_takes: Duration) -> (Api<Lease>, Arc<AtomicUsize>) {
        let patches = Arc::new(AtomicUsize::new(0));
        let seen = patches.clone();
        let client = mock_api::client(move |req| {
            let seen = seen.clone();
            async move {
                if req.method() == http::Method::PATCH {
                    tokio::time::sleep(patch_takes).await;
                    seen.fetch_add(1, Ordering::SeqCst);
                }
                (200, claim_lease())
            }
        });
        (leases(client), patches)
    }

    #[tokio::test(start_paused = true)]
    async fn a_claim_created_after_its_acquire_was_dropped_is_withdrawn() {
        // The create is answered after 200 ms; every PATCH's body is reported.
        let (tx, mut patches) = tokio::sync::mpsc::unbounded_channel();
        let client = mock_api::client(move |req| {
            let tx = tx.clone();
            async move {
                if req.method() == http::Method::POST {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                } else {
                    tx.send(mock_api::body_text(req).await).unwrap();
                }
                (200, claim_lease())
            }
        });
        let pod = identity();
        let refused = Arc::default();
        let create = create(both(leases(client)), "l", &pod, (15, &refused));
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
        let client = mock_api::client(move |req| async move {
            let down = req.method() == http::Method::PATCH && Instant::now() < start + Duration::from_secs(10);
            match down {
                true => (503, serde_json::json!({})),
                false => (200, claim_lease()),
            }
        });
        let (_claim, session, _task) = create(both(leases(client)), "l", &identity(), (15, &Default::default()))
            .await
            .unwrap();
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
            let (_claim, session, task) = create(both(leases), "l", &identity(), (secs as i32, &Default::default()))
                .await
                .unwrap();
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

    #[tokio::test(start_paused = true)]
    async fn a_waiting_claim_writes_every_80_s_and_a_held_one_every_third_of_its_lease() {
        let (leases, patches) = counting_patches(Duration::from_millis(5));
        let (_claim, session, _task) = create(both(leases), "l", &identity(), (15, &Default::default()))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_secs(600)).await;
        let waiting = patches.load(Ordering::SeqCst);
        // 600 s / 80 s: 7 renewals (the eighth is due at 640 s).
        assert!(waiting <= 7, "{waiting} renewals in 10 minutes of waiting");
        assert!(waiting >= 6, "{waiting} renewals in 10 minutes: a waiter still renews");
        assert!(session.is_live(), "a waiter whose deadline passed is not lost");
        session.hold().await.unwrap();
        tokio::time::sleep(Duration::from_secs(60)).await;
        let holding = patches.load(Ordering::SeqCst) - waiting;
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
        let (_claim, session, _task) = create(both(leases), "l", &identity(), (15, &Default::default()))
            .await
            .unwrap();
        // Granted 100 s on: its last write (the renewal at 60 s) stops it by 71.25 s.
        tokio::time::sleep(Duration::from_secs(100)).await;
        let before = patches.load(Ordering::SeqCst);
        let granted = Instant::now();
        session.hold().await.unwrap();
        assert_eq!(patches.load(Ordering::SeqCst), before + 1, "holds on a renewal");
        assert!(
            Instant::now() >= granted + takes,
            "not before the renewal is acknowledged"
        );
        assert_eq!(
            session.valid_until(),
            client_stop_by(granted, lease),
            "counted from the renewal's sending"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_whose_renewals_fail_gives_up_only_when_its_wait_lease_may_be_over() {
        let lease = Duration::from_secs(15);
        let created = Instant::now();
        let leases = black_holed_after_create(Duration::from_millis(100));
        let (_claim, session, task) = create(both(leases), "l", &identity(), (15, &Default::default()))
            .await
            .unwrap();
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
        let (_claim, session, task) = create(both(leases), "l", &identity(), (15, &Default::default()))
            .await
            .unwrap();
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
