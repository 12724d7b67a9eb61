//! The controller's HTTP endpoints: /metrics (OpenMetrics text), /healthz, /readyz, the
//! release notices ([`crate::protocol::notice`], POST [`NOTICE_PATH`]) and the waits of
//! designated successors ([`crate::protocol::grant`], POST [`GRANT_PATH`]).
//!
//! The endpoints clients use are served on a listener whose connections are bounded
//! ([`super::listener`]); the probes and metrics may be served on an address of their
//! own, so that nothing clients send can starve the kubelet's probes.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{StatusCode, header};
use axum::routing::{get, post};

use crate::controller::k8s::notices::Notices;
use crate::controller::k8s::successors::Told;
use crate::controller::metrics::{CONTENT_TYPE, Metrics};
use crate::protocol::grant::{GRANT_PATH, MAX_WAIT_BYTES, SIGNATURE_HEADER, TOKEN_HEADER, WaitFor};
use crate::protocol::notice::{
    MAX_NOTICE_BYTES, NOTICE_PATH, Notice, WRITTEN_HEADER, WRITTEN_SIGNATURE_HEADER, WRITTEN_VALUE,
};

/// Serve the client endpoints on `addr` until the task is dropped, with the probes and
/// metrics too unless they have an address of their own (`probes_apart`).
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    notices: Arc<Notices>,
    probes_apart: bool,
) -> std::io::Result<()> {
    let listener = crate::controller::listener::Bounded::new(tokio::net::TcpListener::bind(addr).await?);
    let routes = if probes_apart {
        tracing::info!(%addr, "serving release notices and direct grants");
        client_router(metrics, notices)
    } else {
        tracing::info!(%addr, "serving /metrics, /healthz, /readyz, release notices and direct grants");
        router(metrics, notices)
    };
    crate::controller::listener::serve(listener, routes).await;
    Ok(())
}

/// Serve /metrics, /healthz and /readyz on `addr` until the task is dropped.
pub async fn serve_probes(addr: SocketAddr, metrics: Arc<Metrics>) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(%addr, "serving /metrics, /healthz and /readyz");
    axum::serve(listener, probe_router(metrics)).await
}

/// All the endpoints' routes.
fn router(metrics: Arc<Metrics>, notices: Arc<Notices>) -> Router {
    probe_router(metrics.clone()).merge(client_router(metrics, notices))
}

/// The routes clients use: release notices and direct grants.
fn client_router(metrics: Arc<Metrics>, notices: Arc<Notices>) -> Router {
    let m = metrics.clone();
    let take = post(move |State(notices): State<Arc<Notices>>, body: Bytes| async move {
        let (answer, signature) = match serde_json::from_slice::<Notice>(&body) {
            Ok(notice) => notices.take_signed(&notice).await,
            Err(e) => {
                m.record_notice("malformed");
                return (StatusCode::BAD_REQUEST, None, format!("not a release notice: {e}\n"));
            }
        };
        m.record_notice(answer.category());
        let (code, text) = answer.http();
        let written = signature.map(|s| {
            [
                (WRITTEN_HEADER, WRITTEN_VALUE.to_string()),
                (WRITTEN_SIGNATURE_HEADER, s),
            ]
        });
        (
            StatusCode::from_u16(code).expect("a valid code"),
            written,
            text.to_string(),
        )
    });
    let waiting = metrics.successors_waiting.clone();
    let wait = post(move |State(notices): State<Arc<Notices>>, body: Bytes| async move {
        let w = match serde_json::from_slice::<WaitFor>(&body) {
            Ok(w) => w,
            Err(e) => return (StatusCode::BAD_REQUEST, None, format!("not a wait for a grant: {e}\n")),
        };
        let told = match notices.may_wait(&w).await {
            Ok(()) => {
                let _counted = Counted::new(waiting);
                notices.successors.wait(&w).await
            }
            Err(refused) => refused,
        };
        match told {
            Told::Granted(token, signature) => (
                StatusCode::OK,
                Some([(TOKEN_HEADER, token.to_string()), (SIGNATURE_HEADER, signature)]),
                "granted\n".to_string(),
            ),
            Told::NotYet => (StatusCode::NO_CONTENT, None, String::new()),
            Told::NotLeader => (
                StatusCode::SERVICE_UNAVAILABLE,
                None,
                "this replica is not the leader: wait for the lock's status\n".to_string(),
            ),
            Told::Busy => (
                StatusCode::TOO_MANY_REQUESTS,
                None,
                "too many waits for grants are open: wait for the lock's status\n".to_string(),
            ),
            Told::NotYours => (
                StatusCode::FORBIDDEN,
                None,
                "the lock's status designates no such claim, or the wait's proof does not open its wait hash\n"
                    .to_string(),
            ),
        }
    });
    Router::new()
        .route(NOTICE_PATH, take)
        .route(GRANT_PATH, wait)
        .layer(DefaultBodyLimit::max(MAX_NOTICE_BYTES.max(MAX_WAIT_BYTES)))
        .with_state(notices)
}

/// The routes of the probes and metrics.
fn probe_router(metrics: Arc<Metrics>) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(|State(m): State<Arc<Metrics>>| async move { ([(header::CONTENT_TYPE, CONTENT_TYPE)], m.encode()) }),
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
        .with_state(metrics)
}

/// Counts one in a gauge while it lives (a wait is dropped when its client goes).
struct Counted(prometheus_client::metrics::gauge::Gauge);

impl Counted {
    fn new(gauge: prometheus_client::metrics::gauge::Gauge) -> Self {
        gauge.inc();
        Counted(gauge)
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.dec();
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    use super::*;

    #[tokio::test]
    async fn probes_apart_the_client_routes_serve_no_probe_and_the_probe_routes_no_notice() {
        let get = |path: &str| http::Request::get(path).body(axum::body::Body::empty()).unwrap();
        let metrics = Arc::new(Metrics::default());
        let clients = client_router(metrics.clone(), Arc::default());
        for path in ["/healthz", "/readyz", "/metrics"] {
            let response = clients.clone().oneshot(get(path)).await.unwrap();
            assert_eq!(response.status(), StatusCode::NOT_FOUND, "{path}");
        }
        let probes = probe_router(metrics);
        assert_eq!(
            probes.clone().oneshot(get("/healthz")).await.unwrap().status(),
            StatusCode::OK
        );
        let notice = http::Request::post(NOTICE_PATH)
            .body(axum::body::Body::from("{}"))
            .unwrap();
        assert_eq!(probes.oneshot(notice).await.unwrap().status(), StatusCode::NOT_FOUND);
    }

    #[tokio::test]
    async fn metrics_are_served_as_openmetrics_text() {
        let request = http::Request::get("/metrics").body(axum::body::Body::empty()).unwrap();
        let response = router(Arc::new(Metrics::default()), Arc::default())
            .oneshot(request)
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(
            response.headers()[header::CONTENT_TYPE],
            "application/openmetrics-text; version=1.0.0; charset=utf-8"
        );
        let body = response.into_body().collect().await.unwrap().to_bytes();
        let text = String::from_utf8(body.to_vec()).unwrap();
        assert!(
            text.contains("leasehold_build_info{") && text.ends_with("# EOF\n"),
            "{text}"
        );
    }

    async fn post_notice(router: Router, body: impl Into<axum::body::Body>) -> (StatusCode, String) {
        let request = http::Request::post(NOTICE_PATH).body(body.into()).unwrap();
        let response = router.oneshot(request).await.unwrap();
        let status = response.status();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8(body.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn a_notice_is_refused_clearly_when_malformed_oversized_or_sent_to_a_standby() {
        let metrics = Arc::new(Metrics::default());
        let app = || router(metrics.clone(), Arc::default());
        let (status, text) = post_notice(app(), "{\"claim\": 1}").await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(text.starts_with("not a release notice"), "{text}");
        let big = format!("{{\"padding\": \"{}\"}}", "x".repeat(MAX_NOTICE_BYTES));
        assert_eq!(post_notice(app(), big).await.0, StatusCode::PAYLOAD_TOO_LARGE);
        let notice = serde_json::json!({"namespace": "ns", "lock": "l", "claim": "l-1", "secret": "s"});
        let (status, text) = post_notice(app(), notice.to_string()).await;
        assert_eq!(
            status,
            StatusCode::SERVICE_UNAVAILABLE,
            "no leader lent the notices its caches"
        );
        assert!(text.contains("not the leader"), "{text}");
        let encoded = metrics.encode();
        assert!(
            encoded.contains("leasehold_release_notices_total{category=\"not_leader\"} 1"),
            "{encoded}"
        );
    }
}
