//! Sending a release notice ([`crate::protocol::notice`]): one plain HTTP/1.1 POST to
//! the URL the lock's status published, on a connection of its own, bounded by
//! [`notice_timeout`]. Its answer only decides whether the release mark is still
//! written: whatever goes wrong here, the caller falls back to the mark.

use std::time::Duration;

use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use crate::protocol::notice::{Notice, WRITTEN, WRITTEN_HEADER, WRITTEN_VALUE, notice_uri};
use crate::protocol::timing::notice_timeout;

/// Send `notice` to the controller at `release_url`; true only when it answers that the
/// release is written in the lock's status.
pub(crate) async fn written(release_url: &str, notice: &Notice, lease: Duration) -> bool {
    let Some(uri) = notice_uri(release_url) else {
        tracing::debug!(release_url, "not a release URL; marking the claim instead");
        return false;
    };
    let limit = notice_timeout(lease);
    match tokio::time::timeout(limit, post(uri, notice)).await {
        Ok(Ok((code, true))) if code == WRITTEN => true,
        Ok(Ok((code, _))) => {
            tracing::debug!(
                claim = notice.claim,
                code,
                "release notice not written; marking the claim"
            );
            false
        }
        Ok(Err(e)) => {
            tracing::debug!(claim = notice.claim, error = %e, "release notice failed; marking the claim");
            false
        }
        Err(_) => {
            tracing::debug!(
                claim = notice.claim,
                ?limit,
                "release notice timed out; marking the claim"
            );
            false
        }
    }
}

/// The answer's status code, and whether it carries the controller's written header.
async fn post(uri: http::Uri, notice: &Notice) -> Result<(u16, bool), String> {
    let response = post_json(uri, notice).await?;
    let ours = response.headers.get(WRITTEN_HEADER).is_some_and(|v| v == WRITTEN_VALUE);
    Ok((response.status.as_u16(), ours))
}

/// POST `body` as JSON to `uri` (plain HTTP/1.1, on a connection of its own); the
/// answer's head (its body is not read).
pub(crate) async fn post_json(uri: http::Uri, body: &impl serde::Serialize) -> Result<http::response::Parts, String> {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: Client<_, kube::client::Body> = Client::builder(TokioExecutor::new()).build(connector);
    let body = serde_json::to_vec(body).map_err(|e| e.to_string())?;
    let request = http::Request::post(uri)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(kube::client::Body::from(body))
        .map_err(|e| e.to_string())?;
    let response = client.request(request).await.map_err(|e| e.to_string())?;
    Ok(response.into_parts().0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn notice() -> Notice {
        Notice {
            namespace: "ns".into(),
            lock: "l".into(),
            claim: "l-1".into(),
            secret: "s".into(),
        }
    }

    /// A one-shot HTTP server on loopback answering `code` (with the controller's
    /// written header on a 200 when `ours`), and what it was sent.
    async fn answering_as(code: u16, ours: bool) -> (String, tokio::task::JoinHandle<String>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let served = tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            while !String::from_utf8_lossy(&got).contains("\"secret\"") {
                let n = conn.read(&mut buf).await.unwrap();
                assert!(n > 0, "closed before the body");
                got.extend_from_slice(&buf[..n]);
            }
            let header = if ours { "leasehold-release: written\r\n" } else { "" };
            let reply = format!("HTTP/1.1 {code} X\r\n{header}content-length: 0\r\nconnection: close\r\n\r\n");
            conn.write_all(reply.as_bytes()).await.unwrap();
            String::from_utf8(got).unwrap()
        });
        (url, served)
    }

    async fn answering(code: u16) -> (String, tokio::task::JoinHandle<String>) {
        answering_as(code, code == 200).await
    }

    #[tokio::test]
    async fn only_a_written_answer_spares_the_mark() {
        let (url, served) = answering(200).await;
        assert!(written(&url, &notice(), Duration::from_secs(15)).await);
        let request = served.await.unwrap();
        assert!(request.starts_with("POST /v1/release HTTP/1.1"), "{request}");
        assert!(request.contains("\"claim\":\"l-1\""), "{request}");
        let (url, _served) = answering_as(200, false).await;
        assert!(
            !written(&url, &notice(), Duration::from_secs(15)).await,
            "a bare 200 (whatever answers at a stale URL) is no controller's answer"
        );
        for code in [202, 403, 409, 503] {
            let (url, _served) = answering(code).await;
            assert!(!written(&url, &notice(), Duration::from_secs(15)).await, "{code}");
        }
    }

    #[tokio::test]
    async fn no_route_or_no_url_falls_back_to_the_mark() {
        // A port nothing listens on: refused at once.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        drop(listener);
        assert!(!written(&url, &notice(), Duration::from_secs(15)).await);
        assert!(!written("https://example.invalid:1", &notice(), Duration::from_secs(15)).await);
    }

    #[tokio::test(start_paused = true)]
    async fn a_controller_that_never_answers_costs_the_notice_timeout_and_no_more() {
        // Accepts the connection, reads, never answers: a black hole after connect.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let _held = tokio::spawn(async move {
            let (conn, _) = listener.accept().await.unwrap();
            std::future::pending::<()>().await;
            drop(conn);
        });
        let lease = Duration::from_secs(2);
        let started = tokio::time::Instant::now();
        assert!(!written(&url, &notice(), lease).await);
        assert_eq!(started.elapsed(), notice_timeout(lease));
    }
}
