//! What every stage of a reconcile shares, whatever the lock's backend: the client,
//! the pod cache, the tracker, the event recorder and budgets, the metrics, the memory
//! of this controller's writes, the turns; and each backend's own state.

use std::sync::{Arc, Mutex};

use kube::runtime::events::Recorder;

use super::cache::pods::PodIndex;
use super::cache::tracker::Tracker;
use super::cache::written::Written;
use crate::controller::metrics::Metrics;

/// Shared state of the reconciler.
pub struct Context {
    /// The API client.
    pub client: kube::Client,
    /// Pods, slimmed to name, uid and phase.
    pub pods: Arc<PodIndex>,
    /// What this controller has seen, on its monotonic clock.
    pub tracker: Arc<Mutex<Tracker>>,
    /// Publishes Kubernetes events.
    pub recorder: Recorder,
    /// How many Normal events may go now.
    pub event_budget: crate::controller::budget::Budget,
    /// How many Warning events may go now.
    pub warning_budget: crate::controller::budget::Budget,
    /// Prometheus metrics.
    pub metrics: Arc<Metrics>,
    /// This controller's status writes its lock watch has not shown yet, and the claim
    /// deletions it sent.
    pub written: Arc<Written>,
    /// Becomes true once the lock, claim and pod caches have synced.
    pub synced: tokio::sync::watch::Receiver<bool>,
    /// Whose turn it is to reconcile each lock (scheduled or prompted reconciles).
    pub turns: crate::controller::prompt::Turns,
    /// The Kubernetes backend's state.
    pub k8s: super::k8s::state::State,
    /// The etcd backend's state: the mirrors of etcd-backed locks.
    pub etcd: Arc<super::etcd::mirror::Mirrors>,
}
