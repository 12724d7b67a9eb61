//! What every stage of a reconcile shares: the client, the caches, the tracker, the
//! event recorder and the metrics.

use std::sync::{Arc, Mutex};

use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::events::Recorder;
use kube::runtime::reflector::Store;

use super::metrics::Metrics;
use super::tracker::Tracker;
use super::written::Written;

/// Shared state of the reconciler.
pub struct Context {
    /// The API client.
    pub client: kube::Client,
    /// Claim Leases (those labelled `leasehold.dev/lock`).
    pub leases: Store<Lease>,
    /// The claims by lock and by pod.
    pub claims: Arc<super::claims::ClaimIndex>,
    /// Pods, slimmed to name, uid and phase.
    pub pods: Arc<super::pods::PodIndex>,
    /// What this controller has seen, on its monotonic clock.
    pub tracker: Arc<Mutex<Tracker>>,
    /// Publishes Kubernetes events.
    pub recorder: Recorder,
    /// How many Normal events may go now.
    pub event_budget: super::budget::Budget,
    /// How many Warning events may go now.
    pub warning_budget: super::budget::Budget,
    /// Prometheus metrics.
    pub metrics: Arc<Metrics>,
    /// This controller's status writes its lock watch has not shown yet, and the claim
    /// deletions it sent.
    pub written: Arc<Written>,
    /// Claims deleted after they were seen released, until their lock's status lets
    /// them go.
    pub tombstones: Arc<super::sweep::Tombstones>,
    /// Deletes released claims in batches.
    pub sweeper: Arc<super::sweep::Sweeper>,
    /// The mirrors of etcd-backed locks.
    pub mirrors: Arc<super::etcd::Mirrors>,
    /// Becomes true once the lock, claim and pod caches have synced.
    pub synced: tokio::sync::watch::Receiver<bool>,
    /// Whose turn it is to reconcile each lock (scheduled or prompted reconciles).
    pub turns: super::prompt::Turns,
    /// The release notices taken over HTTP.
    pub notices: Arc<super::notices::Notices>,
    /// Where this replica takes release notices, published in the statuses it writes.
    pub release_url: Option<String>,
}
