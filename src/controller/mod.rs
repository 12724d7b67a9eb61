//! `leasehold controller`: the operator.
//!
//! Pipeline per lock: **observe** (reflector stores of claim Leases and slim Pods, plus
//! the `cache::tracker::Tracker`'s monotonic clock) → **decide** ([`crate::decide`], pure) →
//! **apply** (status write with a resourceVersion precondition, then events and claim
//! deletion). A deleted lock revokes its holders and goes once they have stopped
//! (`finalizer`).
//! Watch-driven: a claim, pod or lock change triggers the lock's reconcile; time-based
//! transitions requeue at the next deadline.

pub mod admission;
pub(crate) mod backend;
pub(crate) mod budget;
pub(crate) mod cache;
pub(crate) mod context;
pub mod enforced;
pub(crate) mod error;
pub(crate) mod etcd;
pub(crate) mod events;
pub(crate) mod finalizer;
mod http;
pub(crate) mod k8s;
mod leader;
mod listener;
pub use etcd::mirror::{INTERVAL as ETCD_MIRROR_INTERVAL, Pace as EtcdMirrorPace, SETTLE as ETCD_MIRROR_SETTLE};
pub use listener::{HEADER_READ_TIMEOUT, MAX_CONNECTIONS, MAX_PER_SOURCE};
pub mod metrics;
pub(crate) mod prompt;
pub(crate) mod reconcile;
pub(crate) mod status;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::Api;

pub use metrics::Metrics;

/// Name of the Lease the controller replicas elect a leader with.
pub const LEADER_LEASE: &str = "leasehold-controller";
/// Leader lease duration.
pub const LEADER_LEASE_SECONDS: u64 = 15;
/// How often to repeat the "CRD not installed" hint.
pub const CRD_HINT_INTERVAL: Duration = Duration::from_secs(10);

/// How to run the controller.
#[derive(Clone, Debug)]
pub struct Options {
    /// Elect a leader among replicas through a Lease in this namespace; `None` runs
    /// without election (one replica, or tests).
    pub leader_election_namespace: Option<String>,
    /// This replica's identity (the pod name in a cluster).
    pub identity: String,
    /// Where to serve release notices and direct grants, and /metrics, /healthz and
    /// /readyz unless `probe_addr` is given; `None` serves nothing.
    pub http_addr: Option<SocketAddr>,
    /// Where to serve /metrics, /healthz and /readyz apart from the endpoints clients
    /// use (so that nothing clients send can starve the probes); `None` serves them on
    /// `http_addr`.
    pub probe_addr: Option<SocketAddr>,
    /// Watch only this namespace; `None` watches all.
    pub namespace: Option<String>,
    /// The URL (`http://host:port`) at which clients reach `http_addr`, published in
    /// every status this replica writes so holders send it their release notices
    /// ([`crate::protocol::notice`]); `None` publishes none (holders then release
    /// through their claims alone).
    pub release_url: Option<String>,
    /// How long the answer to a release notice waits for the status write that records
    /// the release before it says "accepted" (the holder then writes its release mark
    /// too). Default [`crate::protocol::timing::NOTICE_WAIT`]; keep it under the
    /// clients' [`crate::protocol::timing::notice_timeout`] (at least 125 ms), or they
    /// stop waiting first.
    pub notice_wait: Duration,
    /// When an etcd-backed lock's status mirror reconciles after a change of its keys,
    /// gathering the changes that follow: [`ETCD_MIRROR_SETTLE`] after it, and no sooner
    /// than [`ETCD_MIRROR_INTERVAL`] after the previous, by default.
    pub etcd_mirror: EtcdMirrorPace,
    /// Serve the validating admission webhook for Leases ([`admission`]); `None`
    /// serves none.
    pub admission: Option<admission::Admission>,
}

impl Options {
    /// Options for one replica without leader election or HTTP, watching `namespace`
    /// (or all namespaces).
    pub fn single(identity: &str, namespace: Option<&str>) -> Self {
        Options {
            leader_election_namespace: None,
            identity: identity.into(),
            http_addr: None,
            probe_addr: None,
            namespace: namespace.map(String::from),
            release_url: None,
            notice_wait: crate::protocol::timing::NOTICE_WAIT,
            etcd_mirror: EtcdMirrorPace::default(),
            admission: None,
        }
    }

    fn api<K>(&self, client: &Client) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        match &self.namespace {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        }
    }
}

/// The release URL for clients that reach this replica's HTTP port `port` at `address`
/// (a host name or an IP address; an IPv6 address is bracketed).
pub fn release_url(address: &str, port: u16) -> String {
    match address.parse::<std::net::Ipv6Addr>() {
        Ok(v6) => format!("http://[{v6}]:{port}"),
        Err(_) => format!("http://{address}:{port}"),
    }
}

/// Errors that stop the controller.
#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    /// Leader election could not start.
    #[error("starting leader election: {0}")]
    LeaderElection(#[source] kube_lease_manager::LeaseManagerError),
    /// The admission webhook could not start.
    #[error("starting the admission webhook: {0}")]
    Admission(#[source] admission::AdmissionError),
}

/// How long a stopping leader waits to hand its leader Lease back.
pub const LEADER_RELEASE_TIMEOUT: Duration = Duration::from_secs(5);

/// A spawned helper task of the controller, aborted when this is dropped: the HTTP
/// server and the prompted reconciles end with `run`'s future, also when that future is
/// dropped (aborted) rather than run to its end. (A status write's follow-ups, events
/// and claim deletions, may still finish.)
pub(crate) struct Helper(tokio::task::JoinHandle<()>);

impl Helper {
    /// Spawn `task` as a helper.
    pub(crate) fn spawn(task: impl Future<Output = ()> + Send + 'static) -> Self {
        Helper(tokio::spawn(task))
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Run the controller until `shutdown` completes. Dropping the future stops it too.
pub async fn run(client: Client, opts: Options, shutdown: impl Future<Output = ()>) -> Result<(), ControllerError> {
    let metrics = Arc::new(Metrics::default());
    let notices = Arc::new(k8s::notices::Notices::new(opts.notice_wait));
    let probes_apart = opts.probe_addr.is_some();
    // A certificate that cannot be read stops the controller at start; an address in
    // use (another replica on the same host network) is logged, as for HTTP.
    let _admission = match opts.admission.clone().map(admission::Server::bind) {
        Some(bound) => match bound.await {
            Ok(server) => Some(Helper::spawn(server.run())),
            Err(e @ admission::AdmissionError::Listen(..)) => {
                tracing::error!(error = %e, "serving the admission webhook failed");
                None
            }
            Err(e) => return Err(ControllerError::Admission(e)),
        },
        None => None,
    };
    // Served and elected in a namespace of its own (as the chart runs it): check that
    // the API server reaches the webhook.
    let _enforced = (_admission.is_some())
        .then_some(opts.leader_election_namespace.clone())
        .flatten()
        .map(|ns| {
            Helper::spawn(enforced::keep_checking(
                client.clone(),
                metrics.clone(),
                (opts.identity.clone(), ns),
            ))
        });
    let _http = opts.http_addr.map(|addr| {
        let (m, n) = (metrics.clone(), notices.clone());
        Helper::spawn(async move {
            if let Err(e) = http::serve(addr, m, n, probes_apart).await {
                tracing::error!(%addr, error = %e, "serving HTTP failed: no release notices or direct grants");
            }
        })
    });
    let _probes = opts.probe_addr.map(|addr| {
        let m = metrics.clone();
        Helper::spawn(async move {
            if let Err(e) = http::serve_probes(addr, m).await {
                tracing::error!(%addr, error = %e, "serving HTTP failed: no /metrics, /healthz or /readyz");
            }
        })
    });
    match &opts.leader_election_namespace {
        None => {
            metrics.set_leader(true); // the only replica
            tokio::select! {
                _ = async { wait_for_crd(client.clone()).await; leader::run_leader(client.clone(), &opts, metrics.clone(), notices.clone()).await } => Ok(()),
                _ = shutdown => Ok(()),
            }
        }
        Some(ns) => run_elected(client.clone(), &opts, ns, metrics.clone(), notices.clone(), shutdown).await,
    }
}

/// Wait until the CRD is established, repeating a hint while it is missing.
async fn wait_for_crd(client: Client) {
    let api: Api<CustomResourceDefinition> = Api::all(client);
    loop {
        match crate::crd::wait_established(api.clone(), CRD_HINT_INTERVAL).await {
            Ok(()) => return,
            Err(e) => tracing::error!(
                "{e}. Install it with `leasehold crd | kubectl apply -f -` or the Helm chart (crds.install=true)"
            ),
        }
    }
}

/// Take part in leader election; reconcile only while leading. On shutdown, hand the
/// leader Lease back so another replica takes over at once.
async fn run_elected(
    client: Client,
    opts: &Options,
    ns: &str,
    metrics: Arc<Metrics>,
    notices: Arc<k8s::notices::Notices>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ControllerError> {
    let manager = kube_lease_manager::LeaseManagerBuilder::new(client.clone(), LEADER_LEASE)
        .with_namespace(ns)
        .with_identity(&opts.identity)
        .with_duration(LEADER_LEASE_SECONDS)
        .with_grace(5)
        .build()
        .await
        .map_err(ControllerError::LeaderElection)?;
    let (mut leading, task) = manager.watch().await;
    metrics.ready.store(true, Ordering::Relaxed); // a standby is ready too
    let work = async {
        wait_for_crd(client.clone()).await;
        loop {
            while !*leading.borrow_and_update() {
                tracing::info!(identity = opts.identity, "standing by for leadership");
                if leading.changed().await.is_err() {
                    return;
                }
            }
            tracing::info!(identity = opts.identity, "leading: reconciling");
            metrics.set_leader(true);
            tokio::select! {
                _ = leader::run_leader(client.clone(), opts, metrics.clone(), notices.clone()) => {}
                _ = async { while *leading.borrow_and_update() { if leading.changed().await.is_err() { break } } } => {
                    tracing::warn!("lost leadership: stopping reconciles");
                }
            }
            notices.step_down();
            metrics.set_leader(false);
        }
    };
    tokio::select! {
        _ = work => {}
        _ = shutdown => {}
    }
    notices.step_down(); // refuse notices at once while the Lease is handed back
    metrics.set_leader(false);
    drop(leading); // the manager's task releases the Lease when its channel closes
    let _ = tokio::time::timeout(LEADER_RELEASE_TIMEOUT, task).await;
    Ok(())
}
