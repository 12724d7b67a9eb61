//! A held grant: the [`Guard`] a caller keeps while it holds the lock.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::Error;
use super::session::{Session, State};

/// State shared by all guards of one grant (reentrant acquisitions share it).
#[derive(Debug)]
pub(crate) struct Held {
    pub session: Arc<Session>,
    pub token: i64,
    /// How many guards of this grant are outstanding.
    pub count: AtomicUsize,
    pub renewal: std::sync::Mutex<Option<JoinHandle<()>>>,
}

impl Held {
    /// Give up the grant: stop renewing, mark the claim released (one write) and wait
    /// for the renewal task to end, surfacing its failure.
    pub async fn release(&self) -> Result<(), Error> {
        let released = self.session.end().await;
        let task = self.renewal.lock().expect("renewal handle lock poisoned").take();
        if let Some(task) = task
            && let Err(e) = task.await
        {
            tracing::warn!(claim = self.session.claim, error = %e, "the renewal task failed");
        }
        released
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

    /// Whether the grant is already lost.
    pub fn is_lost(&self) -> bool {
        matches!(*self.held.session.state().borrow(), State::Lost(_))
    }

    /// The grant's state on a watch channel, for `select!` or child tasks.
    pub fn state(&self) -> watch::Receiver<State> {
        self.held.session.state()
    }

    /// Release this acquisition. For a reentrant lock the grant is given up when the
    /// last acquisition is released: its claim is marked released (one write).
    pub async fn release(mut self) -> Result<(), Error> {
        self.released = true;
        if self.held.count.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.held.release().await?;
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
