//! The in-pod client: acquire a [`DistributedLock`](crate::api::DistributedLock) from
//! inside a pod, hold it with a fencing token, and release it.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use leasehold::client::Lock;
//!
//! let client = kube::Client::try_default().await?;
//! // Identity from the downward API: POD_NAME, POD_NAMESPACE, POD_UID.
//! let lock = Lock::new(client, "default", "db-migration")?;
//! let guard = lock.acquire().await?; // waits its turn (FIFO), woken by a watch
//! let token = guard.fencing_token(); // hand this to the storage you write to
//! tokio::select! {
//!     _ = guard.lost() => eprintln!("lost the lock: stop now"),
//!     _ = async { /* critical section, passing `token` along */ } => {}
//! }
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! A pod needs the downward API in its env and RBAC to create/get/update/delete
//! leases, get/list/watch distributedlocks and get pods (see `examples/rbac.yaml`):
//!
//! ```yaml
//! env:
//! - { name: POD_NAME, valueFrom: { fieldRef: { fieldPath: metadata.name } } }
//! - { name: POD_NAMESPACE, valueFrom: { fieldRef: { fieldPath: metadata.namespace } } }
//! - { name: POD_UID, valueFrom: { fieldRef: { fieldPath: metadata.uid } } }
//! ```

mod guard;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Client;
use kube::api::{Api, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use tokio_util::sync::CancellationToken;

pub use guard::{Guard, renew_interval, safety_margin};
use guard::{Held, mark_released, spawn_renewal};

use crate::api::{DEFAULT_LEASE_DURATION_SECONDS, DistributedLock};
use crate::claim::{PodIdentity, claim_lease, claim_name};

/// How long `try_acquire` waits for the controller to place its claim.
pub const TRY_ACQUIRE_TIMEOUT: Duration = Duration::from_secs(30);

/// Errors of the client, each naming the action that failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The process's pod identity is incomplete.
    #[error("missing pod identity: set {0} (the downward API gives it; see the client docs)")]
    MissingIdentity(&'static str),
    /// Claims must live in their pod's namespace (owner references cannot cross namespaces).
    #[error("lock namespace {lock} differs from the pod's namespace {pod}: a pod can only lock in its own namespace")]
    CrossNamespace {
        /// The lock's namespace.
        lock: String,
        /// The pod's namespace.
        pod: String,
    },
    /// Reading the DistributedLock failed.
    #[error("reading DistributedLock {0}: {1}")]
    GetLock(String, #[source] kube::Error),
    /// Creating the claim Lease failed.
    #[error("creating the claim Lease: {0}")]
    CreateClaim(#[source] kube::Error),
    /// The watch on the DistributedLock ended.
    #[error("watching DistributedLock {0}: the watch ended")]
    Watch(String),
    /// The claim disappeared while waiting (deleted, or expired after lost renewals).
    #[error("the claim Lease {0} was removed while waiting for the lock")]
    ClaimLost(String),
    /// Marking the claim released failed.
    #[error("releasing the claim Lease: {0}")]
    Release(#[source] kube::Error),
    /// The lock was not granted in time (the claim was withdrawn).
    #[error("the lock was not granted within {0:?}")]
    Timeout(Duration),
}

/// Where a waiting claim stands, for progress output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WaitStatus {
    /// 1-based position in the queue.
    pub position: usize,
    /// Pods holding the lock now.
    pub holders: Vec<String>,
}

type OnWait = Arc<dyn Fn(&WaitStatus) + Send + Sync>;

/// A handle on one DistributedLock for this process. Acquisitions through the same
/// handle are reentrant: they share one grant, released when the last is released.
pub struct Lock {
    client: Client,
    name: String,
    identity: PodIdentity,
    on_wait: Option<OnWait>,
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
    namespace: String,
    name: String,
    identity: Option<PodIdentity>,
    on_wait: Option<OnWait>,
}

impl LockBuilder {
    /// Use this identity instead of `POD_NAME`/`POD_UID` from the environment.
    pub fn identity(mut self, identity: PodIdentity) -> Self {
        self.identity = Some(identity);
        self
    }

    /// Call `f` whenever the claim's place in the queue changes while waiting.
    pub fn on_wait(mut self, f: impl Fn(&WaitStatus) + Send + Sync + 'static) -> Self {
        self.on_wait = Some(Arc::new(f));
        self
    }

    /// Build the handle.
    pub fn build(self) -> Result<Lock, Error> {
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
            client: self.client,
            name: self.name,
            identity,
            on_wait: self.on_wait,
            current: tokio::sync::Mutex::new(None),
        })
    }
}

/// The pod identity from `POD_NAME` and `POD_UID` (namespace: `POD_NAMESPACE`, else
/// `default_namespace`).
pub fn identity_from_env(default_namespace: &str) -> Result<PodIdentity, Error> {
    let var = |k: &'static str| {
        std::env::var(k)
            .ok()
            .filter(|v| !v.is_empty())
            .ok_or(Error::MissingIdentity(k))
    };
    Ok(PodIdentity {
        name: var("POD_NAME")?,
        namespace: std::env::var("POD_NAMESPACE")
            .ok()
            .filter(|v| !v.is_empty())
            .unwrap_or(default_namespace.into()),
        uid: var("POD_UID")?,
    })
}

enum Mode {
    Wait,
    Try,
    Until(tokio::time::Instant, Duration),
}

enum Outcome {
    Granted(i64),
    WouldBlock,
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
            namespace: namespace.into(),
            name: name.into(),
            identity: None,
            on_wait: None,
        }
    }

    /// Wait (FIFO, no polling) until the lock is granted.
    pub async fn acquire(&self) -> Result<Guard, Error> {
        Ok(self.acquire_with(Mode::Wait).await?.expect("waiting never gives up"))
    }

    /// Take the lock only if it is granted without waiting behind anyone; otherwise
    /// withdraw the claim and return `None`.
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
        if let Some(held) = current
            .as_ref()
            .filter(|h| !h.lost.is_cancelled() && !h.stop.is_cancelled())
        {
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
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), ns);
        let spec_lease = locks
            .get_opt(&self.name)
            .await
            .map_err(|e| Error::GetLock(self.name.clone(), e))?;
        let secs = spec_lease
            .map(|l| l.spec.lease_duration_seconds)
            .unwrap_or(DEFAULT_LEASE_DURATION_SECONDS);
        let lease = Duration::from_secs(secs.max(1) as u64);
        // Watch first, so no status change between create and watch is missed.
        let fields = format!("metadata.name={}", self.name);
        let mut events = watcher(locks, watcher::Config::default().fields(&fields))
            .default_backoff()
            .applied_objects()
            .boxed();
        let claim = claim_name(&self.name);
        let lease_obj = claim_lease(&claim, &self.name, &self.identity, secs);
        leases
            .create(&PostParams::default(), &lease_obj)
            .await
            .map_err(Error::CreateClaim)?;
        let (lost, stop) = (CancellationToken::new(), CancellationToken::new());
        spawn_renewal(leases.clone(), claim.clone(), lease, lost.clone(), stop.clone());
        let outcome = self.wait_grant(&mut events, &claim, &mode, &lost).await;
        match outcome {
            Ok(Outcome::Granted(token)) => {
                let held = Arc::new(Held {
                    claim,
                    token,
                    lease,
                    count: AtomicUsize::new(1),
                    lost,
                    leases,
                    stop,
                });
                watch_revocation(events, held.clone());
                *current = Some(held.clone());
                Ok(Some(Guard { held, released: false }))
            }
            other => {
                stop.cancel();
                if let Err(e) = mark_released(&leases, &claim).await {
                    tracing::warn!(claim, error = %e, "withdrawing the claim failed; it will expire");
                }
                match other {
                    Ok(_) => Ok(None),
                    Err(e) => Err(e),
                }
            }
        }
    }

    async fn wait_grant(
        &self,
        events: &mut (impl Stream<Item = Result<DistributedLock, watcher::Error>> + Unpin),
        claim: &str,
        mode: &Mode,
        lost: &CancellationToken,
    ) -> Result<Outcome, Error> {
        let until = match mode {
            Mode::Wait => None,
            Mode::Try => Some(tokio::time::Instant::now() + TRY_ACQUIRE_TIMEOUT),
            Mode::Until(at, _) => Some(*at),
        };
        let mut last_status: Option<WaitStatus> = None;
        loop {
            let deadline = async {
                match until {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            let lock = tokio::select! {
                ev = events.next() => match ev {
                    Some(Ok(lock)) => lock,
                    Some(Err(e)) => { tracing::debug!(error = %e, "lock watch error; retrying"); continue }
                    None => return Err(Error::Watch(self.name.clone())),
                },
                _ = lost.cancelled() => return Err(Error::ClaimLost(claim.into())),
                _ = deadline => return Err(Error::Timeout(match mode {
                    Mode::Until(_, d) => *d,
                    _ => TRY_ACQUIRE_TIMEOUT,
                })),
            };
            let status = lock.status.unwrap_or_default();
            if let Some(h) = status.holders.iter().find(|h| h.claim == claim && h.revoked.is_none()) {
                return Ok(Outcome::Granted(h.fencing_token));
            }
            if let Some(pos) = status.queue.iter().position(|w| w.claim == claim) {
                if matches!(mode, Mode::Try) {
                    return Ok(Outcome::WouldBlock);
                }
                let now = WaitStatus {
                    position: pos + 1,
                    holders: status.holders.iter().map(|h| h.pod.clone()).collect(),
                };
                if last_status.as_ref() != Some(&now) {
                    if let Some(f) = &self.on_wait {
                        f(&now);
                    }
                    last_status = Some(now);
                }
            }
        }
    }
}

/// After a grant: cancel `lost` as soon as the lock's status no longer shows the
/// claim as an unrevoked holder.
fn watch_revocation(
    mut events: impl Stream<Item = Result<DistributedLock, watcher::Error>> + Unpin + Send + 'static,
    held: Arc<Held>,
) {
    tokio::spawn(async move {
        loop {
            let lock = tokio::select! {
                _ = held.stop.cancelled() => return,
                _ = held.lost.cancelled() => return,
                ev = events.next() => match ev {
                    Some(Ok(lock)) => lock,
                    Some(Err(_)) => continue,
                    None => return,
                },
            };
            let holds = lock
                .status
                .unwrap_or_default()
                .holders
                .iter()
                .any(|h| h.claim == held.claim && h.revoked.is_none());
            if !holds {
                tracing::warn!(claim = held.claim, "the controller revoked the grant");
                held.lost.cancel();
                return;
            }
        }
    });
}
