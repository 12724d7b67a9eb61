//! Prometheus metrics (prometheus-client): the families, their labels, and how the
//! controller records into them.

use std::sync::atomic::AtomicBool;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::api::RevokeReason;

/// Labels naming one lock.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LockLabels {
    /// The lock's namespace.
    pub namespace: String,
    /// The lock's name.
    pub lock: String,
}

/// A revocation's reason.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// RevokeReason as a string.
    pub reason: String,
}

/// An error's short fixed category.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CategoryLabels {
    /// See `Error::category`.
    pub category: String,
}

/// The controller's metrics.
pub struct Metrics {
    /// Grants made, per lock.
    pub grants: Family<LockLabels, Counter>,
    /// Revocations, by reason.
    pub revocations: Family<ReasonLabels, Counter>,
    /// Waiting claims, per lock.
    pub queue_depth: Family<LockLabels, Gauge>,
    /// Seconds from queueing to grant.
    pub wait_seconds: Histogram,
    /// Seconds from grant to release or revocation.
    pub hold_seconds: Histogram,
    /// Seconds from seeing a release mark to the next grant being written.
    pub handoff_seconds: Histogram,
    /// Seconds one reconcile took.
    pub reconcile_seconds: Histogram,
    /// Errors by category.
    pub errors: Family<CategoryLabels, Counter>,
    /// Set once the controller's caches are synced (or it is a ready standby).
    pub ready: AtomicBool,
    registry: Registry,
}

impl Default for Metrics {
    fn default() -> Self {
        let grants = Family::<LockLabels, Counter>::default();
        let revocations = Family::<ReasonLabels, Counter>::default();
        let queue_depth = Family::<LockLabels, Gauge>::default();
        let wait_seconds = Histogram::new(exponential_buckets(0.01, 2.0, 16));
        let hold_seconds = Histogram::new(exponential_buckets(0.01, 2.0, 20));
        let handoff_seconds = Histogram::new(exponential_buckets(0.001, 2.0, 16));
        let reconcile_seconds = Histogram::new(exponential_buckets(0.0005, 2.0, 16));
        let errors = Family::<CategoryLabels, Counter>::default();
        let mut registry = Registry::with_prefix("leasehold");
        registry.register("grants", "Grants made", grants.clone());
        registry.register("revocations", "Grants revoked, by reason", revocations.clone());
        registry.register("queue_depth", "Claims waiting for the lock", queue_depth.clone());
        registry.register("wait_seconds", "Seconds from queueing to grant", wait_seconds.clone());
        registry.register(
            "hold_seconds",
            "Seconds from grant to release or revocation",
            hold_seconds.clone(),
        );
        registry.register(
            "handoff_seconds",
            "Seconds from a seen release to the next grant written",
            handoff_seconds.clone(),
        );
        registry.register("reconcile_seconds", "Seconds per reconcile", reconcile_seconds.clone());
        registry.register("errors", "Reconcile errors by category", errors.clone());
        Metrics {
            grants,
            revocations,
            queue_depth,
            wait_seconds,
            hold_seconds,
            handoff_seconds,
            reconcile_seconds,
            errors,
            ready: AtomicBool::new(false),
            registry,
        }
    }
}

impl Metrics {
    /// Count a grant of lock `ns/lock`, with how long the claim waited in the queue.
    pub fn record_grant(&self, ns: &str, lock: &str, waited_secs: Option<f64>) {
        self.grants.get_or_create(&lock_labels(ns, lock)).inc();
        if let Some(s) = waited_secs {
            self.wait_seconds.observe(s);
        }
    }

    /// Record the end of a grant (release, or revocation with its reason), with how
    /// long it was held.
    pub fn record_slot_end(&self, held_secs: Option<f64>, revoked: Option<RevokeReason>) {
        if let Some(s) = held_secs {
            self.hold_seconds.observe(s);
        }
        if let Some(reason) = revoked {
            let labels = ReasonLabels {
                reason: reason.as_str().into(),
            };
            self.revocations.get_or_create(&labels).inc();
        }
    }

    /// Set the number of waiting claims of lock `ns/lock`.
    pub fn set_queue_depth(&self, ns: &str, lock: &str, depth: usize) {
        let depth = i64::try_from(depth).unwrap_or(i64::MAX);
        self.queue_depth.get_or_create(&lock_labels(ns, lock)).set(depth);
    }

    /// Count a reconcile error by its fixed category.
    pub fn record_error(&self, category: &'static str) {
        let labels = CategoryLabels {
            category: category.into(),
        };
        self.errors.get_or_create(&labels).inc();
    }

    /// The metrics in the OpenMetrics text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
}

fn lock_labels(ns: &str, lock: &str) -> LockLabels {
    LockLabels {
        namespace: ns.into(),
        lock: lock.into(),
    }
}
