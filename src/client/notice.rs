//! Sending a release notice ([`crate::protocol::notice`]): one plain HTTP/1.1 POST to
//! the URL the lock's status published, on a connection of its own, bounded by
//! [`notice_timeout`]. Its answer only decides whether the release mark is still
//! written: whatever goes wrong here, the caller falls back to the mark.

use std::time::Duration;

use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use crate::api::DistributedLock;
use crate::protocol::grant::WrittenRelease;
use crate::protocol::notice::{Notice, WRITTEN, WRITTEN_HEADER, WRITTEN_SIGNATURE_HEADER, WRITTEN_VALUE, notice_uri};
use crate::protocol::timing::notice_timeout;

/// Where a holder sends its release notice, and how it checks the answer: the URL, the
/// grant key and the lock UID of one status, which published the first two together.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct NoticeTarget {
    /// The controller's published URL.
    pub url: String,
    /// The public key a written answer must be signed by.
    pub key: String,
    /// The lock's UID.
    pub lock_uid: String,
}

impl NoticeTarget {
    /// The target `lock`'s status publishes, if it publishes one.
    pub fn of(lock: &DistributedLock) -> Option<Self> {
        let status = lock.status.as_ref()?;
        Some(NoticeTarget {
            url: status.release_url.clone()?,
            key: status.grant_key.clone()?,
            lock_uid: lock.metadata.uid.clone()?,
        })
    }
}

/// Send `notice` to the controller at `target`; true only when it answers that the
/// release is written in the lock's status, signed by the key the status published.
pub(crate) async fn written(target: &NoticeTarget, notice: &Notice, lease: Duration) -> bool {
    let Some(uri) = notice_uri(&target.url) else {
        tracing::debug!(release_url = target.url, "not a release URL; marking the claim instead");
        return false;
    };
    let signed = |signature: &str| {
        let answer = WrittenRelease {
            namespace: &notice.namespace,
            lock: &notice.lock,
            lock_uid: &target.lock_uid,
            claim: &notice.claim,
        };
        answer.verify(&target.key, signature)
    };
    let limit = notice_timeout(lease);
    match tokio::time::timeout(limit, post(uri, notice)).await {
        Ok(Ok((code, Some(signature)))) if code == WRITTEN && signed(&signature) => true,
        Ok(Ok((code, Some(_)))) if code == WRITTEN => {
            tracing::warn!(
                claim = notice.claim,
                url = target.url,
                "a release notice was answered as written without the lock's signature: ignored, marking the claim"
            );
            false
        }
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

/// The answer's status code, and with the controller's written header its signature
/// (empty when it has none).
async fn post(uri: http::Uri, notice: &Notice) -> Result<(u16, Option<String>), String> {
    let response = post_json(uri, notice).await?;
    let header = |name: &str| response.headers.get(name).and_then(|v| v.to_str().ok());
    let ours = header(WRITTEN_HEADER) == Some(WRITTEN_VALUE);
    let signature = ours.then(|| header(WRITTEN_SIGNATURE_HEADER).unwrap_or_default().to_string());
    Ok((response.status.as_u16(), signature))
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
    use crate::protocol::grant::GrantKey;

    fn notice() -> Notice {
        Notice {
            namespace: "ns".into(),
            lock: "l".into(),
            claim: "l-1".into(),
            secret: "s".into(),
        }
    }

    /// A one-shot HTTP server on loopback answering `code` with the extra header lines
    /// `headers`, and what it was sent.
    async fn answering_as(code: u16, headers: String) -> (String, tokio::task::JoinHandle<String>) {
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
            let reply = format!("HTTP/1.1 {code} X\r\n{headers}content-length: 0\r\nconnection: close\r\n\r\n");
            conn.write_all(reply.as_bytes()).await.unwrap();
            String::from_utf8(got).unwrap()
        });
        (url, served)
    }

    /// The written answer's headers, signed by `key` for claim `claim` of lock l (UID u-1).
    fn written_by(key: &GrantKey, claim: &str) -> String {
        let w = WrittenRelease {
            namespace: "ns",
            lock: "l",
            lock_uid: "u-1",
            claim,
        };
        format!(
            "leasehold-release: written\r\nleasehold-release-signature: {}\r\n",
            key.sign_written(&w)
        )
    }

    fn target(url: &str, key: &GrantKey) -> NoticeTarget {
        NoticeTarget {
            url: url.into(),
            key: key.public(),
            lock_uid: "u-1".into(),
        }
    }

    fn to(url: &str) -> NoticeTarget {
        target(url, &GrantKey::generate())
    }

    #[tokio::test]
    async fn only_a_written_answer_signed_by_the_lock_s_key_spares_the_mark() {
        let key = GrantKey::generate();
        let (url, served) = answering_as(200, written_by(&key, "l-1")).await;
        assert!(written(&target(&url, &key), &notice(), Duration::from_secs(15)).await);
        let request = served.await.unwrap();
        assert!(request.starts_with("POST /v1/release HTTP/1.1"), "{request}");
        assert!(request.contains("\"claim\":\"l-1\""), "{request}");
        // Whatever answers at a stale or hijacked URL cannot sign with the lock's key.
        let forger = GrantKey::generate();
        for (what, headers) in [
            ("a bare 200", String::new()),
            ("written, unsigned", "leasehold-release: written\r\n".to_string()),
            ("written, signed by another key", written_by(&forger, "l-1")),
            ("written, signed for another claim", written_by(&key, "l-2")),
        ] {
            let (url, _served) = answering_as(200, headers).await;
            assert!(
                !written(&target(&url, &key), &notice(), Duration::from_secs(15)).await,
                "{what}"
            );
        }
        for code in [202, 403, 409, 503] {
            let (url, _served) = answering_as(code, String::new()).await;
            assert!(!written(&to(&url), &notice(), Duration::from_secs(15)).await, "{code}");
        }
    }

    #[tokio::test]
    async fn no_route_or_no_url_falls_back_to_the_mark() {
        // A port nothing listens on: refused at once.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        drop(listener);
        assert!(!written(&to(&url), &notice(), Duration::from_secs(15)).await);
        assert!(!written(&to("https://example.invalid:1"), &notice(), Duration::from_secs(15)).await);
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
        assert!(!written(&to(&url), &notice(), lease).await);
        assert_eq!(started.elapsed(), notice_timeout(lease));
    }
}
