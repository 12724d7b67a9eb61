//! Mocked API servers for unit tests: a [`kube::Client`] whose every request a
//! closure answers, with the bodies the tests answer with. Only the shape of requests
//! is tested this way; behaviour is tested on a real API server (`tests/integration`).

use std::convert::Infallible;
use std::future::Future;

use bytes::Bytes;
use http_body_util::Full;

/// A request as the mocked server receives it.
pub(crate) type Request = http::Request<kube::client::Body>;

/// A client (default namespace `ns`) whose requests `respond` answers with a status
/// code and a JSON body.
pub(crate) fn client<F, A>(respond: F) -> kube::Client
where
    F: Fn(Request) -> A + Clone + Send + 'static,
    A: Future<Output = (u16, serde_json::Value)> + Send + 'static,
{
    let service = tower::service_fn(move |req: Request| {
        let answer = respond(req);
        async move {
            let (code, body) = answer.await;
            let response = http::Response::builder()
                .status(code)
                .body(Full::new(Bytes::from(body.to_string())))
                .expect("a valid response");
            Ok::<_, Infallible>(response)
        }
    });
    kube::Client::new(service, "ns")
}

/// The body of an API error `code` with `reason`.
pub(crate) fn status(code: u16, reason: &str, message: &str) -> serde_json::Value {
    serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "status": "Failure",
        "reason": reason, "code": code, "message": message,
    })
}

/// The body of claim Lease `l-1` of lock `l` in namespace `ns`.
pub(crate) fn claim_lease() -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {
            "name": "l-1", "namespace": "ns", "resourceVersion": "1",
            "labels": { crate::protocol::LOCK_LABEL: "l" },
        },
    })
}

/// The body of a request, as text.
pub(crate) async fn body_text(req: Request) -> String {
    let body = http_body_util::BodyExt::collect(req.into_body())
        .await
        .expect("a readable body")
        .to_bytes();
    String::from_utf8_lossy(&body).into_owned()
}
