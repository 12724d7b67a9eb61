//! Prometheus metrics (prometheus-client) and the HTTP endpoints /metrics, /healthz
//! and /readyz.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

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
    /// The metrics in the OpenMetrics text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
}

/// Serve /metrics, /healthz and /readyz on `addr` until the task is dropped.
pub async fn serve(addr: SocketAddr, metrics: Arc<Metrics>) -> std::io::Result<()> {
    let app = Router::new()
        .route(
            "/metrics",
            get(|State(m): State<Arc<Metrics>>| async move { m.encode() }),
        )
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(|State(m): State<Arc<Metrics>>| async move {
                if m.ready.load(Ordering::Relaxed) {
                    (StatusCode::OK, "ok")
                } else {
                    (StatusCode::SERVICE_UNAVAILABLE, "caches not synced")
                }
            }),
        )
        .with_state(metrics);
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(%addr, "serving /metrics, /healthz and /readyz");
    axum::serve(listener, app).await
}
