//! The lock handle: acquire (wait, try, or with a timeout), with reentrancy. It reads
//! the lock, picks the backend its spec names, and leaves the claim to it (see
//! [`super::backend`]); woken by watches, never by polling.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use kube::Client;
use kube::api::Api;

use super::backend::{Backend, Mode, Request};
use super::guard::{Guard, Held};
use super::k8s::Kube;
use super::progress::{Listener, WaitEvent};
use super::{Error, WaitStatus, identity};
use crate::api::DistributedLock;
use crate::protocol::PodIdentity;

/// How long `try_acquire` waits for the controller to place its claim.
pub const TRY_ACQUIRE_TIMEOUT: Duration = Duration::from_secs(30);

/// A handle on one DistributedLock for this process. Acquisitions through the same
/// handle are reentrant: they share one grant, released when the last is released.
pub struct Lock {
    kube: Kube,
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
    /// Use this identity instead of the one the pod tells ([`identity::from_pod`]).
    pub fn identity(mut self, identity: PodIdentity) -> Self {
        self.identity = Some(identity);
        self
    }

    /// Send the claim's writes (create, renewals, the release) through `client`, a
    /// client with a connection pool of its own. A long-running watch holds an HTTP/1.1
    /// connection for as long as it runs, so with one pool the release may have to open
    /// (and TLS-handshake) a new connection on the handoff path; a second pool keeps a
    /// warm one for writes (a claim's own watches while designated go on the lock's
    /// client, with the lock's watch). Build both with
    /// [`crate::kubeconfig::lock_clients_from`] (connections without Nagle's delay, the
    /// second resuming the first one's TLS session).
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
            None => identity::from_pod(&self.namespace)?,
        };
        if identity.namespace != self.namespace {
            return Err(Error::CrossNamespace {
                lock: self.namespace,
                pod: identity.namespace,
            });
        }
        Ok(Lock {
            kube: Kube {
                writes: self.writes.unwrap_or_else(|| self.client.clone()),
                client: self.client,
                claim_watch_refused: Default::default(),
            },
            name: self.name,
            identity,
            listeners: self.listeners,
            current: tokio::sync::Mutex::new(None),
        })
    }
}

// === impl Lock ===

impl Lock {
    /// A handle on lock `name` in `namespace`, identity from the pod ([`identity::from_pod`]).
    ///
    /// `client` reads and watches the lock. Built with
    /// [`crate::kubeconfig::watch_client_from`] (HTTP/2 with PINGs), a watch stalled on a
    /// dead connection is found within seconds at no request; on another client, by the
    /// waiter's fresh read every [`crate::protocol::timing::WAIT_CHECK`].
    pub fn new(client: Client, namespace: &str, name: &str) -> Result<Self, Error> {
        Self::builder(client, namespace, name).build()
    }

    /// The pod this handle claims for (from the environment or the pod's token, or
    /// as given to [`LockBuilder::identity`]).
    pub fn identity(&self) -> &PodIdentity {
        &self.identity
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
        let locks: Api<DistributedLock> = Api::namespaced(self.kube.client.clone(), &self.identity.namespace);
        let lock = locks
            .get_opt(&self.name)
            .await
            .map_err(|e| Error::GetLock(self.name.clone(), e))?;
        let request = Request {
            name: &self.name,
            identity: &self.identity,
            lock: lock.as_ref(),
            mode,
            listeners: &self.listeners,
        };
        let Some(granted) = self.backend(lock.as_ref())?.acquire(request).await? else {
            return Ok(None);
        };
        let held = Held::granted(granted);
        *current = Some(held.clone());
        Ok(Some(Guard { held, released: false }))
    }

    /// The backend that keeps `lock`'s claims, as its spec says.
    fn backend(&self, lock: Option<&DistributedLock>) -> Result<Box<dyn Backend>, Error> {
        match lock.and_then(|l| l.spec.etcd()) {
            #[cfg(feature = "etcd")]
            Some(etcd) => Ok(Box::new(super::etcd::claim_key::Keys {
                backend: etcd.clone(),
                locks: Api::namespaced(self.kube.client.clone(), &self.identity.namespace),
            })),
            #[cfg(not(feature = "etcd"))]
            Some(_) => Err(Error::EtcdUnsupported(self.name.clone())),
            None => Ok(Box::new(self.kube.clone())),
        }
    }
}
