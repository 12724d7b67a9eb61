//! A held grant: its renewal task, its `lost()` signal and its release.
//!
//! The contract that makes the controller's fenced handoff exact: `lost()` fires no
//! later than (the moment the last *successful* renewal request was sent + lease
//! duration − [`safety_margin`]) on this process's monotonic clock. The controller
//! judges a claim expired only after it has not seen a change for lease duration plus
//! its grace, counted from when it saw the renewal — which is after it was sent. So a
//! live client always stops before the controller can hand its slot on.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, Patch, PatchParams};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Error;
use crate::claim;

/// How long before its lease runs out a client gives up its grant: a quarter of the
/// lease duration (at least 250 ms). `leasehold run` uses the same span as the grace
/// between SIGTERM and SIGKILL, so the command is dead by the lease's end.
pub fn safety_margin(lease: Duration) -> Duration {
    (lease / 4).max(Duration::from_millis(250))
}

/// How often a claim is renewed: a third of the lease duration.
pub fn renew_interval(lease: Duration) -> Duration {
    lease / 3
}

/// State shared by all guards of one grant (reentrant acquisitions share it).
#[derive(Debug)]
pub(crate) struct Held {
    pub claim: String,
    pub token: i64,
    pub lease: Duration,
    pub count: AtomicUsize,
    pub lost: CancellationToken,
    pub leases: Api<Lease>,
    pub stop: CancellationToken,
}

impl Held {
    /// Mark the claim released (one write) and stop renewing.
    pub async fn release(&self) -> Result<(), Error> {
        self.stop.cancel();
        mark_released(&self.leases, &self.claim).await
    }
}

/// Mark a claim released; a claim that is already gone counts as released.
pub(crate) async fn mark_released(leases: &Api<Lease>, name: &str) -> Result<(), Error> {
    let patch = Patch::Merge(claim::release_patch());
    match leases.patch(name, &PatchParams::default(), &patch).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.is_not_found() => Ok(()),
        Err(e) => Err(Error::Release(e)),
    }
}

/// Renew `name` every [`renew_interval`] until `stop`; cancel `lost` when the claim is
/// gone or when renewals have failed until the safety deadline.
pub(crate) fn spawn_renewal(
    leases: Api<Lease>,
    name: String,
    lease: Duration,
    lost: CancellationToken,
    stop: CancellationToken,
) {
    let deadline_after_ok = lease.saturating_sub(safety_margin(lease));
    tokio::spawn(async move {
        // The claim was created (a successful write) just before this task started.
        let mut deadline = Instant::now() + deadline_after_ok;
        let mut next = Instant::now() + renew_interval(lease);
        let mut backoff = Duration::from_millis(100);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = lost.cancelled() => return,
                _ = tokio::time::sleep_until(deadline) => {
                    tracing::warn!(claim = name, "renewals failed for too long: giving up the grant");
                    lost.cancel();
                    return;
                }
                _ = tokio::time::sleep_until(next) => {}
            }
            let sent = Instant::now();
            let patch = Patch::Merge(claim::renew_patch());
            let params = PatchParams::default();
            let limit = renew_interval(lease).max(Duration::from_millis(200));
            match tokio::time::timeout(limit, leases.patch(&name, &params, &patch)).await {
                Ok(Ok(_)) => {
                    deadline = sent + deadline_after_ok;
                    next = sent + renew_interval(lease);
                    backoff = Duration::from_millis(100);
                }
                Ok(Err(kube::Error::Api(s))) if s.is_not_found() => {
                    tracing::warn!(claim = name, "claim is gone (forced release): giving up the grant");
                    lost.cancel();
                    return;
                }
                failed => {
                    let error = match failed {
                        Ok(Err(e)) => e.to_string(),
                        _ => "timed out".to_string(),
                    };
                    tracing::warn!(claim = name, error, "renewal failed; retrying");
                    next = Instant::now() + backoff;
                    backoff = (backoff * 2).min(renew_interval(lease));
                }
            }
        }
    });
}

/// A held lock. Pass [`Guard::fencing_token`] to every resource the lock protects,
/// stop working when [`Guard::lost`] fires, and call [`Guard::release`] when done
/// (dropping the guard releases too, best effort).
#[derive(Debug)]
pub struct Guard {
    pub(crate) held: Arc<Held>,
    pub(crate) released: bool,
}

impl Guard {
    /// The grant's fencing token: strictly greater than every earlier grant's.
    pub fn fencing_token(&self) -> i64 {
        self.held.token
    }

    /// The lease duration the grant is renewed with.
    pub fn lease_duration(&self) -> Duration {
        self.held.lease
    }

    /// The name of the claim Lease holding the lock.
    pub fn claim(&self) -> &str {
        &self.held.claim
    }

    /// Completes when the grant is lost: revoked by the controller, the claim taken
    /// away, or renewals failing for so long that the controller might expire it.
    /// Stop acting on the lock's behalf at once when it fires.
    pub async fn lost(&self) {
        self.held.lost.cancelled().await
    }

    /// Whether the grant is already lost.
    pub fn is_lost(&self) -> bool {
        self.held.lost.is_cancelled()
    }

    /// A token cancelled when the grant is lost, for `select!` or child tasks.
    pub fn lost_token(&self) -> CancellationToken {
        self.held.lost.clone()
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

impl Drop for Guard {
    fn drop(&mut self) {
        if self.released || self.held.count.fetch_sub(1, Ordering::SeqCst) != 1 {
            return;
        }
        let held = self.held.clone();
        held.stop.cancel();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                if let Err(e) = held.release().await {
                    tracing::warn!(claim = held.claim, error = %e, "release on drop failed; the claim will expire");
                }
            });
        }
    }
}
