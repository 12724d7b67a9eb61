//! A held grant: the [`Guard`] a caller keeps while it holds the lock.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::Error;
use super::backend::{self, Claim, GiveUp, Granted};
use super::session::{Session, State};
use crate::protocol::timing::release_budget;

/// Pause before the first retry of a failed release; it doubles before each further try.
pub const RELEASE_RETRY_DELAY: Duration = Duration::from_millis(200);

/// State shared by all guards of one grant (reentrant acquisitions share it).
#[derive(Debug)]
pub(crate) struct Held {
    pub session: Arc<Session>,
    /// How the claim is given up.
    pub claim: Arc<dyn Claim>,
    pub token: i64,
    /// How many guards of this grant are outstanding.
    pub count: AtomicUsize,
    pub renewal: std::sync::Mutex<Option<JoinHandle<()>>>,
}

impl Held {
    /// The state of a grant just made to `session`, with one guard outstanding.
    pub fn granted(granted: Granted) -> Arc<Held> {
        let Granted {
            session,
            renewal,
            token,
            claim,
        } = granted;
        Arc::new(Held {
            session,
            claim,
            token,
            count: AtomicUsize::new(1),
            renewal: std::sync::Mutex::new(Some(renewal)),
        })
    }

    /// Give up the grant: stop renewing, give the claim up (one write) and wait for
    /// the renewal task to end, surfacing its failure.
    pub async fn release(&self) -> Result<(), Error> {
        let released = backend::end(&self.session, self.claim.as_ref()).await;
        let task = self.renewal.lock().expect("renewal handle lock poisoned").take();
        if let Some(task) = task
            && let Err(e) = task.await
        {
            tracing::warn!(claim = self.session.claim, error = %e, "the renewal task failed");
        }
        released
    }

    /// [`Held::release`], then retry a failed release mark, up to `tries` attempts in
    /// all, [`RELEASE_RETRY_DELAY`] apart (doubling), all within [`release_budget`].
    pub async fn release_retrying(&self, tries: u32) -> Result<(), Error> {
        let budget = release_budget(self.session.lease);
        let until = tokio::time::Instant::now() + budget;
        let mut delay = RELEASE_RETRY_DELAY;
        for attempt in 1.. {
            let write = async {
                match attempt {
                    1 => self.release().await,
                    _ => self.claim.give_up(&self.session, GiveUp::Write).await,
                }
            };
            let e = match tokio::time::timeout_at(until, write).await {
                Ok(Ok(())) => return Ok(()),
                Ok(Err(e)) => e,
                Err(_) => Error::ReleaseTimeout(budget),
            };
            if attempt >= tries || tokio::time::Instant::now() + delay >= until {
                return Err(e);
            }
            tracing::warn!(claim = self.session.claim, error = %e, ?delay, "releasing failed; retrying");
            tokio::time::sleep(delay).await;
            delay *= 2;
        }
        unreachable!("the attempts end by returning")
    }
}

/// A held lock. Pass [`Guard::fencing_token`] to every resource the lock protects,
/// stop working when [`Guard::lost`] fires, and call [`Guard::release`] when done
/// (dropping the guard releases too, best effort).
#[derive(Debug)]
pub struct Guard {
    pub(crate) held: Arc<Held>,
    pub(crate) released: bool,
}

// === impl Guard ===

impl Guard {
    /// The grant's fencing token: strictly greater than every earlier grant's.
    pub fn fencing_token(&self) -> i64 {
        self.held.token
    }

    /// The lease duration the grant is renewed with.
    pub fn lease_duration(&self) -> Duration {
        self.held.session.lease
    }

    /// By when the holder must have stopped acting on the strength of its last
    /// successful renewal ([`crate::protocol::timing::client_stop_by`]: its send time
    /// plus the lease less the safety margin), on the monotonic clock. [`Guard::lost`]
    /// fires then at the latest, unless the process was paused or starved past it: a
    /// loss noticed after this instant leaves no time to wind down.
    pub fn valid_until(&self) -> tokio::time::Instant {
        self.held.session.valid_until()
    }

    /// [`Guard::valid_until`] as it changes (with each successful renewal): for a
    /// watchdog of the caller's own, as `leasehold run` keeps one in CMD's supervisor.
    pub fn valid_until_changes(&self) -> watch::Receiver<tokio::time::Instant> {
        self.held.session.valid_until_changes()
    }

    /// The name of the claim Lease holding the lock.
    pub fn claim(&self) -> &str {
        &self.held.session.claim
    }

    /// Completes when the grant is lost: revoked by the controller, the claim taken
    /// away, or renewals failing for so long that the controller might expire it.
    /// Stop acting on the lock's behalf at once when it fires.
    pub async fn lost(&self) {
        self.held.session.lost().await
    }

    /// Whether the grant is already lost, or its deadline ([`Guard::valid_until`]) has
    /// passed: a process paused or starved past it reads that here before its renewal
    /// task has run to publish the loss.
    pub fn is_lost(&self) -> bool {
        let lost = matches!(*self.held.session.state().borrow(), State::Lost(_));
        lost || tokio::time::Instant::now() >= self.valid_until()
    }

    /// The grant's state on a watch channel, for `select!` or child tasks.
    pub fn state(&self) -> watch::Receiver<State> {
        self.held.session.state()
    }

    /// Release this acquisition. For a reentrant lock the grant is given up when the
    /// last acquisition is released: its claim is marked released (one write).
    pub async fn release(self) -> Result<(), Error> {
        self.release_retrying(1).await
    }

    /// [`Guard::release`], retrying a failed release: up to `tries` attempts in all,
    /// [`RELEASE_RETRY_DELAY`] apart (doubling), never for longer than half the lease.
    /// When it still fails, the claim expires within the lease instead.
    pub async fn release_retrying(mut self, tries: u32) -> Result<(), Error> {
        self.released = true;
        if self.held.count.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.held.release_retrying(tries).await?;
        }
        Ok(())
    }
}

impl Guard {
    /// Give the grant up without releasing it: renewals stop and the claim is left to
    /// expire (after a lease the controller passes the slot on). For a holder that
    /// cannot be sure its work has stopped, so must not say it has.
    pub fn abandon(mut self) {
        self.released = true;
        if self.held.count.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.held.session.finish();
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if self.released || self.held.count.fetch_sub(1, Ordering::SeqCst) != 1 {
            return;
        }
        let held = self.held.clone();
        held.session.finish();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                if let Err(e) = held.release().await {
                    tracing::warn!(claim = held.session.claim, error = %e, "release on drop failed; the claim will expire");
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU32;

    use k8s_openapi::api::coordination::v1::Lease;
    use kube::api::Api;

    use super::*;
    use crate::protocol::PodIdentity;
    use crate::testing::mock_api;

    /// A claim API whose create succeeds and whose first `failing` patches (release
    /// marks) fail with a 500; counts the patches.
    fn flaky_patches(failing: u32) -> (Api<Lease>, Arc<AtomicU32>) {
        let patches = Arc::new(AtomicU32::new(0));
        let seen = patches.clone();
        let client = mock_api::client(move |req| {
            let failed = req.method() == http::Method::PATCH && seen.fetch_add(1, Ordering::SeqCst) < failing;
            async move {
                match failed {
                    true => (500, mock_api::status(500, "InternalError", "etcd is sulking")),
                    false => (200, mock_api::claim_lease()),
                }
            }
        });
        (Api::namespaced(client, "ns"), patches)
    }

    async fn held_grant(leases: Api<Lease>, lease_secs: i32) -> Held {
        let identity = PodIdentity {
            name: "p".into(),
            namespace: "ns".into(),
            uid: "u".into(),
        };
        let (claim, session, renewal) = crate::client::k8s::lease::create(
            (leases.clone(), leases),
            "l",
            &identity,
            (lease_secs, &Default::default()),
        )
        .await
        .unwrap();
        Held {
            session,
            claim,
            token: 1,
            count: AtomicUsize::new(1),
            renewal: std::sync::Mutex::new(Some(renewal)),
        }
    }

    /// A process paused past its deadline, its renewal task not yet run since (here: not
    /// running at all), reads its guard as lost before it acts again.
    #[tokio::test(start_paused = true)]
    async fn a_guard_past_its_deadline_is_lost_before_its_renewal_task_says_so() {
        let (leases, _) = flaky_patches(0);
        let held = Arc::new(held_grant(leases, 30).await);
        held.renewal.lock().unwrap().take().expect("renewing").abort();
        let guard = Guard {
            held: held.clone(),
            released: false,
        };
        assert!(!guard.is_lost(), "within its deadline");
        let left = guard.valid_until() - tokio::time::Instant::now();
        tokio::time::advance(left).await;
        assert!(held.session.is_live(), "nothing published the loss");
        assert!(guard.is_lost(), "its deadline has passed");
        guard.abandon();
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_release_is_retried_until_it_is_written() {
        let (leases, patches) = flaky_patches(2);
        let held = held_grant(leases, 30).await;
        held.release_retrying(3).await.expect("the third attempt is written");
        assert_eq!(patches.load(Ordering::SeqCst), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn release_retries_stop_after_the_tries_or_half_the_lease() {
        let (leases, patches) = flaky_patches(u32::MAX);
        let held = held_grant(leases, 30).await;
        assert!(held.release_retrying(3).await.is_err());
        assert_eq!(patches.load(Ordering::SeqCst), 3, "three tries");

        // A 1 s lease: retries at 200 ms, then 600 ms would pass half the lease.
        let (leases, patches) = flaky_patches(u32::MAX);
        let held = held_grant(leases, 1).await;
        let started = tokio::time::Instant::now();
        assert!(held.release_retrying(10).await.is_err());
        assert_eq!(patches.load(Ordering::SeqCst), 2);
        assert!(started.elapsed() <= release_budget(Duration::from_secs(1)));
    }
}
