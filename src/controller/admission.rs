//! The validating admission webhook for Leases (optional: `--admission-addr`, the
//! chart's `admission.enabled`), served over HTTPS by every replica, leader or not. It
//! asks [`crate::protocol::admission`] about each request and answers the API server;
//! it keeps no state. Connections are bounded as the client endpoints' are
//! (`controller::listener`), a TLS handshake that does not finish within
//! [`HANDSHAKE_TIMEOUT`] is dropped without holding up the others, and a renewed
//! certificate is served from the next handshake on.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use k8s_openapi::api::coordination::v1::Lease;
use kube::core::DynamicObject;
use kube::core::admission::{self, AdmissionRequest, AdmissionResponse, AdmissionReview};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use crate::controller::listener::{Bounded, Counted};
use crate::protocol::admission::{ADMISSION_PATH, Operation, Policy, judge};

/// How long a TLS handshake may take before its connection is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest AdmissionReview taken: two objects at the API server's largest (1.5 MiB
/// stored, escaped to as much as six times that in a review's JSON: a `<` is written
/// `\u003c`), and room for the rest. Any review the API server can send is read, so
/// none is refused here, which under `failurePolicy: Ignore` would let its write
/// through unjudged: a Lease padded before it carried the lock label, say, and then
/// labelled. (A claim's reviews stay far smaller: no judged write may leave one over
/// [`crate::protocol::admission::MAX_CLAIM_BYTES`].)
pub const MAX_REVIEW_BYTES: usize = 24 * 1024 * 1024;

/// Where and how to serve the webhook.
#[derive(Clone, Debug)]
pub struct Admission {
    /// The address to listen on.
    pub addr: SocketAddr,
    /// The server certificate chain (PEM), valid for the name the API server calls.
    pub cert: PathBuf,
    /// The certificate's private key (PEM).
    pub key: PathBuf,
    /// Whom the rules confine.
    pub policy: Policy,
}

/// Why the webhook cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum AdmissionError {
    /// The certificate file could not be read or parsed.
    #[error("reading the webhook's certificate {0}: {1}")]
    ReadCert(PathBuf, #[source] rustls::pki_types::pem::Error),
    /// The key file could not be read or parsed.
    #[error("reading the webhook's private key {0}: {1}")]
    ReadKey(PathBuf, #[source] rustls::pki_types::pem::Error),
    /// The certificate and key do not make a TLS server configuration.
    #[error("using the webhook's certificate and key: {0}")]
    Tls(#[source] rustls::Error),
    /// The address could not be bound.
    #[error("listening for admission reviews on {0}: {1}")]
    Listen(SocketAddr, #[source] std::io::Error),
}

/// A webhook bound to its address with its certificate loaded, ready to serve.
pub struct Server {
    listener: TlsListener,
    policy: Arc<Policy>,
}

impl Server {
    /// Load the certificate and bind the address, so a certificate that cannot be read
    /// is found at start, not at the first review (the controller stops on it; an
    /// address in use, [`AdmissionError::Listen`], it only logs).
    pub async fn bind(config: Admission) -> Result<Self, AdmissionError> {
        let resolver = Reloading::load(config.cert.clone(), config.key.clone())?;
        let acceptor = TlsAcceptor::from(Arc::new(tls_config(resolver)));
        let tcp = tokio::net::TcpListener::bind(config.addr)
            .await
            .map_err(|e| AdmissionError::Listen(config.addr, e))?;
        let local = tcp.local_addr().map_err(|e| AdmissionError::Listen(config.addr, e))?;
        tracing::info!(addr = %local, path = ADMISSION_PATH, "serving the admission webhook");
        Ok(Server {
            listener: TlsListener::start(Bounded::new(tcp), acceptor, local),
            policy: Arc::new(config.policy),
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local
    }

    /// Serve until dropped.
    pub async fn run(self) {
        super::listener::serve(self.listener, router(self.policy)).await;
    }
}

/// The webhook's one route.
fn router(policy: Arc<Policy>) -> Router {
    Router::new()
        .route(ADMISSION_PATH, post(review))
        .layer(DefaultBodyLimit::max(MAX_REVIEW_BYTES))
        .with_state(policy)
}

/// Answer one AdmissionReview of a Lease (400 for a body that is none).
async fn review(State(policy): State<Arc<Policy>>, body: Bytes) -> Response {
    let review: AdmissionReview<Lease> = match serde_json::from_slice(&body) {
        Ok(review) => review,
        Err(e) => {
            return (
                StatusCode::BAD_REQUEST,
                format!("not an AdmissionReview of a Lease: {e}\n"),
            )
                .into_response();
        }
    };
    let answer = answer(&policy, review);
    let json = serde_json::to_vec(&answer).expect("an AdmissionReview serializes");
    ([(header::CONTENT_TYPE, "application/json")], json).into_response()
}

/// The verdict on one review, as the review to send back.
fn answer(policy: &Policy, review: AdmissionReview<Lease>) -> AdmissionReview<DynamicObject> {
    let request: AdmissionRequest<Lease> = match review.try_into() {
        Ok(request) => request,
        Err(e) => return AdmissionResponse::invalid(format!("not an admission request: {e}")).into_review(),
    };
    let response = AdmissionResponse::from(&request);
    let op = match request.operation {
        admission::Operation::Create => Operation::Create,
        admission::Operation::Update => Operation::Update,
        admission::Operation::Delete => Operation::Delete,
        admission::Operation::Connect => return response.into_review(),
    };
    let user = request.user_info.username.as_deref().unwrap_or_default();
    match judge(policy, op, user, request.old_object.as_ref(), request.object.as_ref()) {
        Ok(()) => response.into_review(),
        Err(refusal) => {
            tracing::info!(
                user,
                namespace = request.namespace.as_deref().unwrap_or_default(),
                lease = request.name,
                operation = ?op,
                reason = %refusal,
                "refused a Lease write"
            );
            response.deny(refusal.to_string()).into_review()
        }
    }
}

/// A TLS server configuration that serves `resolver`'s certificate.
fn tls_config(resolver: Reloading) -> rustls::ServerConfig {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(resolver))
}

/// A certificate and key read from PEM files, and read again at the next handshake
/// after either file changed (the kubelet updates a mounted Secret in place; a
/// re-issued certificate is served without a restart). A failed reload keeps the old.
#[derive(Debug)]
struct Reloading {
    cert: PathBuf,
    key: PathBuf,
    loaded: Mutex<(Stamp, Arc<CertifiedKey>)>,
}

/// When the two files were last modified.
type Stamp = (Option<SystemTime>, Option<SystemTime>);

impl Reloading {
    fn load(cert: PathBuf, key: PathBuf) -> Result<Self, AdmissionError> {
        let stamp = stamp(&cert, &key);
        let certified = certified_key(&cert, &key)?;
        Ok(Reloading {
            cert,
            key,
            loaded: Mutex::new((stamp, certified)),
        })
    }
}

impl ResolvesServerCert for Reloading {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let mut loaded = self.loaded.lock().expect("certificate lock poisoned");
        let now = stamp(&self.cert, &self.key);
        if now != loaded.0 {
            match certified_key(&self.cert, &self.key) {
                Ok(certified) => {
                    tracing::info!(cert = %self.cert.display(), "serving the webhook's renewed certificate");
                    *loaded = (now, certified);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "reloading the webhook's certificate failed; serving the last one")
                }
            }
        }
        Some(loaded.1.clone())
    }
}

fn stamp(cert: &Path, key: &Path) -> Stamp {
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    (modified(cert), modified(key))
}

/// The certificate chain and signing key from PEM files.
fn certified_key(cert: &Path, key: &Path) -> Result<Arc<CertifiedKey>, AdmissionError> {
    let chain = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| AdmissionError::ReadCert(cert.to_path_buf(), e))?;
    let private = PrivateKeyDer::from_pem_file(key).map_err(|e| AdmissionError::ReadKey(key.to_path_buf(), e))?;
    let signing = rustls::crypto::ring::sign::any_supported_type(&private).map_err(AdmissionError::Tls)?;
    let certified = CertifiedKey::new(chain, signing);
    certified.keys_match().map_err(AdmissionError::Tls)?;
    Ok(Arc::new(certified))
}

/// Accepts bounded TCP connections and hands on those whose TLS handshake finished;
/// each handshake runs in a task of its own.
struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<Counted>, SocketAddr)>,
    local: SocketAddr,
    _accepting: super::Helper,
}

impl TlsListener {
    fn start(mut tcp: Bounded, acceptor: TlsAcceptor, local: SocketAddr) -> Self {
        let (done, ready) = mpsc::channel(64);
        let accepting = super::Helper::spawn(async move {
            use axum::serve::Listener;
            loop {
                let (stream, addr) = tcp.accept().await;
                let (acceptor, done) = (acceptor.clone(), done.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => {
                            let _ = done.send((tls, addr)).await;
                        }
                        Ok(Err(e)) => tracing::debug!(%addr, error = %e, "TLS handshake failed"),
                        Err(_) => tracing::debug!(%addr, "TLS handshake timed out"),
                    }
                });
            }
        });
        TlsListener {
            ready,
            local,
            _accepting: accepting,
        }
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<Counted>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, SocketAddr) {
        match self.ready.recv().await {
            Some(accepted) => accepted,
            None => std::future::pending().await, // the accepting task is gone
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Ok(self.local)
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    use super::*;

    /// An AdmissionReview as the API server sends it, for `op` on a Lease by `user`.
    fn review_of(op: &str, user: &str, object: serde_json::Value, old: serde_json::Value) -> String {
        serde_json::json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
                "kind": {"group": "coordination.k8s.io", "version": "v1", "kind": "Lease"},
                "resource": {"group": "coordination.k8s.io", "version": "v1", "resource": "leases"},
                "requestKind": {"group": "coordination.k8s.io", "version": "v1", "kind": "Lease"},
                "requestResource": {"group": "coordination.k8s.io", "version": "v1", "resource": "leases"},
                "name": "app-leader",
                "namespace": "apps",
                "operation": op,
                "userInfo": {"username": user, "groups": ["system:serviceaccounts"]},
                "object": object,
                "oldObject": old,
                "dryRun": false
            }
        })
        .to_string()
    }

    async fn answer(body: String) -> serde_json::Value {
        let request = http::Request::post(ADMISSION_PATH)
            .header("content-type", "application/json")
            .body(axum::body::Body::from(body))
            .unwrap();
        let response = router(Arc::new(Policy::default())).oneshot(request).await.unwrap();
        assert_eq!(response.status(), http::StatusCode::OK);
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        serde_json::from_slice(&bytes).unwrap()
    }

    fn lease(holder: &str) -> serde_json::Value {
        serde_json::json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "app-leader", "namespace": "apps"},
            "spec": {"holderIdentity": holder}})
    }

    #[tokio::test]
    async fn a_client_account_deposing_a_leader_lease_is_denied_with_the_reason_and_the_request_s_uid() {
        let client = "system:serviceaccount:apps:leasehold-client";
        let reply = answer(review_of("UPDATE", client, lease("neighbour"), lease("app-0"))).await;
        let response = &reply["response"];
        assert_eq!(response["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");
        assert_eq!(response["allowed"], false, "{reply}");
        let message = response["status"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("only claim Leases"), "{reply}");
        assert_eq!(reply["apiVersion"], "admission.k8s.io/v1");
    }

    #[tokio::test]
    async fn the_application_s_own_account_is_let_through_and_a_connect_is_not_judged() {
        let app = "system:serviceaccount:apps:app";
        let reply = answer(review_of("UPDATE", app, lease("app-1"), lease("app-0"))).await;
        assert_eq!(reply["response"]["allowed"], true, "{reply}");
        let reply = answer(review_of(
            "CONNECT",
            "x",
            serde_json::Value::Null,
            serde_json::Value::Null,
        ))
        .await;
        assert_eq!(reply["response"]["allowed"], true, "{reply}");
    }

    #[test]
    fn a_missing_certificate_is_an_error_naming_the_file() {
        let missing = |p: &str| PathBuf::from(p);
        let e = Reloading::load(missing("/nonexistent/tls.crt"), missing("/nonexistent/tls.key")).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/tls.crt"), "{e}");
    }
}
