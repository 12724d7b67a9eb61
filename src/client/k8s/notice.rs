//! Sending a release notice ([`crate::protocol::notice`]): one plain HTTP/1.1 POST to
//! the URL the lock's status published, on a connection of its own, bounded by
//! [`notice_timeout`]. Its answer only decides whether the release mark is still
//! written: whatever goes wrong here, the caller falls back to the mark.
//!
//! A URL that cannot be reached (a NetworkPolicy that drops the client's packets, an
//! address that no longer answers) would cost every release the whole notice timeout.
//! So each URL is probed once, off the release's path, when a status first publishes
//! it to this process (a TCP connect, bounded by the same timeout, while the claim
//! waits or its holder works); a URL found unreachable, by the probe or by a notice
//! that got no answer, is skipped for [`UNREACHABLE_FOR`]: the release goes straight
//! to the mark. (A `leasehold run`, which releases once, learns it from its probe.) So
//! is a URL whose probe has not answered within [`PROBE_GRACE`] of its start: a
//! reachable one answers a connect within a round trip, so a probe still under way
//! after that has most likely met a URL that drops packets, where the notice would
//! wait out its whole timeout (as a `leasehold run` granted and done within that
//! timeout of its first status did). A release comes that soon after the probe's start
//! only on a free lock with a very short section; it waits the rest of the grace.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

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

/// How long this process skips a notice URL found unreachable before it tries again.
pub(crate) const UNREACHABLE_FOR: Duration = Duration::from_secs(60);

/// How long after its start a probe of a notice URL may keep a release waiting (a
/// reachable URL answers a connect within a round trip); past it, the release marks
/// its claim.
pub(crate) const PROBE_GRACE: Duration = Duration::from_millis(50);

/// A probe is bounded by the notice timeout (1 s at most): one not answered after this
/// never will be (its runtime shut down under it), and the URL counts as not probed.
const PROBE_STALE: Duration = Duration::from_secs(2);

/// What this process knows of one notice URL.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reach {
    /// A probe is under way, since then.
    Probing(Instant),
    /// Reached (by a probe): notices are sent.
    Reached,
    /// Not reached (by a probe or a notice): skipped until then.
    Unreachable(Instant),
}

/// What this process knows of the notice URLs it met.
static REACH: Mutex<BTreeMap<String, Reach>> = Mutex::new(BTreeMap::new());

/// Woken whenever a probe's answer is learnt.
static PROBED: tokio::sync::Notify = tokio::sync::Notify::const_new();

fn reach() -> std::sync::MutexGuard<'static, BTreeMap<String, Reach>> {
    REACH.lock().expect("notice reachability lock poisoned")
}

/// Whether a notice to `url` is not sent: its probe is still under way, or it was
/// found unreachable within [`UNREACHABLE_FOR`] of `now`.
fn skipped(url: &str, now: Instant) -> bool {
    match reach().get(url) {
        Some(Reach::Probing(began)) => now < *began + PROBE_STALE,
        Some(Reach::Unreachable(until)) => *until > now,
        Some(Reach::Reached) | None => false,
    }
}

/// Whether this process expects no answer from the release URL `url`, so that a holder
/// too will likely release by its claim's mark: the URL is not one ([`notice_uri`]), or
/// its probe found it unreachable, or has gone unanswered past [`PROBE_GRACE`] (waited
/// for until then). A guess from this process's own probe (another pod's path may
/// differ): a designated successor then also watches the holder's claim for the
/// handover, which costs one watch when the guess is wrong.
pub(crate) async fn expects_no_answer(url: &str) -> bool {
    if notice_uri(url).is_none() {
        return true;
    }
    probe_answered(url).await;
    unanswered(url, Instant::now())
}

/// Whether, at `now`, `url` was found unreachable within [`UNREACHABLE_FOR`], or its
/// probe has been under way for longer than a reachable URL takes ([`PROBE_GRACE`]).
fn unanswered(url: &str, now: Instant) -> bool {
    match reach().get(url) {
        Some(Reach::Probing(began)) => now >= *began + PROBE_GRACE && now < *began + PROBE_STALE,
        Some(Reach::Unreachable(until)) => *until > now,
        Some(Reach::Reached) | None => false,
    }
}

/// [`learn`], now, for other modules' tests.
#[cfg(test)]
pub(super) fn learn_for_test(url: &str, reached: bool) {
    learn(url, reached, Instant::now());
}

/// Remember whether `url` could be reached, as learnt at `now`.
fn learn(url: &str, reached: bool, now: Instant) {
    let known = if reached {
        Reach::Reached
    } else {
        Reach::Unreachable(now + UNREACHABLE_FOR)
    };
    reach().insert(url.to_string(), known);
}

/// Probe `url` in the background (a TCP connect, bounded by [`notice_timeout`]) so
/// that a release never waits for a URL that cannot be reached: once per URL, and
/// again once a URL found unreachable may be tried again. Needs a Tokio runtime;
/// without one, nothing is probed and notices are sent as usual. Returns the probe's
/// task, if one was started.
pub(crate) fn probe(url: &str, lease: Duration) -> Option<tokio::task::JoinHandle<()>> {
    let authority = notice_uri(url)?.authority()?.to_string();
    let runtime = tokio::runtime::Handle::try_current().ok()?;
    {
        let mut known = reach();
        match known.get(url) {
            Some(Reach::Reached) => return None,
            Some(Reach::Probing(began)) if began.elapsed() < PROBE_STALE => return None,
            Some(Reach::Unreachable(until)) if *until > Instant::now() => return None,
            _ => known.insert(url.to_string(), Reach::Probing(Instant::now())),
        };
    }
    let (url, limit) = (url.to_string(), notice_timeout(lease));
    Some(runtime.spawn(async move {
        let connected = tokio::time::timeout(limit, tokio::net::TcpStream::connect(authority.as_str())).await;
        let reached = matches!(connected, Ok(Ok(_)));
        if !reached {
            tracing::info!(
                release_url = url,
                "the controller's release URL cannot be reached: releases write the mark at once"
            );
        }
        learn(&url, reached, Instant::now());
        PROBED.notify_waiters();
    }))
}

/// Wait until no probe of `url` is under way, or [`PROBE_GRACE`] after the probe
/// began (so a release long after a probe that still hangs does not wait at all).
async fn probe_answered(url: &str) {
    loop {
        let answered = PROBED.notified();
        tokio::pin!(answered);
        answered.as_mut().enable(); // before the look: an answer in between still wakes it
        let Some(Reach::Probing(began)) = reach().get(url).copied() else {
            return;
        };
        let left = (began + PROBE_GRACE).saturating_duration_since(Instant::now());
        if left.is_zero() || tokio::time::timeout(left, answered).await.is_err() {
            return;
        }
    }
}

/// Send `notice` to the controller at `target`; true only when it answers that the
/// release is written in the lock's status, signed by the key the status published.
pub(crate) async fn written(target: &NoticeTarget, notice: &Notice, lease: Duration) -> bool {
    let Some(uri) = notice_uri(&target.url) else {
        tracing::debug!(release_url = target.url, "not a release URL; marking the claim instead");
        return false;
    };
    probe_answered(&target.url).await;
    if skipped(&target.url, Instant::now()) {
        tracing::debug!(
            release_url = target.url,
            "release URL found unreachable, or its probe not answered in time; marking the claim"
        );
        return false;
    }
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
            learn(&target.url, false, Instant::now());
            false
        }
        Err(_) => {
            tracing::debug!(
                claim = notice.claim,
                ?limit,
                "release notice timed out; marking the claim"
            );
            learn(&target.url, false, Instant::now());
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
        // Unanswered once, the URL is not waited for again: the next release marks at once.
        let again = tokio::time::Instant::now();
        assert!(!written(&to(&url), &notice(), lease).await);
        assert_eq!(again.elapsed(), Duration::ZERO);
    }

    #[test]
    fn an_unreachable_url_is_skipped_for_a_while_and_a_reached_one_is_not() {
        let (url, now) = ("http://10.0.0.1:8080", Instant::now());
        assert!(!skipped(url, now));
        learn(url, false, now);
        assert!(skipped(url, now + UNREACHABLE_FOR - Duration::from_millis(1)));
        assert!(!skipped(url, now + UNREACHABLE_FOR), "tried again after a while");
        learn(url, false, now);
        learn(url, true, now);
        assert!(!skipped(url, now), "reached again: no longer skipped");
    }

    #[test]
    fn no_answer_is_expected_from_a_url_found_unreachable_or_whose_probe_hangs() {
        let (url, now) = ("http://10.0.0.2:8080", Instant::now());
        assert!(!unanswered(url, now), "not probed yet");
        reach().insert(url.into(), Reach::Probing(now));
        assert!(
            !unanswered(url, now + PROBE_GRACE - Duration::from_millis(1)),
            "a reachable URL answers by then"
        );
        assert!(unanswered(url, now + PROBE_GRACE), "a probe still under way");
        assert!(!unanswered(url, now + PROBE_STALE), "a stale probe tells nothing");
        learn(url, false, now);
        assert!(unanswered(url, now + UNREACHABLE_FOR - Duration::from_millis(1)));
        assert!(!unanswered(url, now + UNREACHABLE_FOR), "tried again after a while");
        learn(url, true, now);
        assert!(!unanswered(url, now), "reached");
    }

    #[tokio::test]
    async fn whether_an_answer_is_expected_waits_for_a_probe_only_until_its_grace() {
        let url = "http://10.0.0.4:8091";
        assert!(expects_no_answer("not a url").await, "no URL: no notice is sent");
        assert!(!expects_no_answer(url).await, "not probed: a notice will be tried");
        let began = Instant::now();
        reach().insert(url.into(), Reach::Probing(began));
        assert!(expects_no_answer(url).await, "a probe unanswered past its grace");
        let waited = began.elapsed();
        assert!(waited >= PROBE_GRACE && waited < PROBE_STALE, "{waited:?}");
    }

    /// A URL whose connections never complete (its listener's accept queue is full), as
    /// where packets are dropped: a probe's connect, and a notice's, hang until their
    /// timeouts. Keep the listener and the stream filling its queue while it is used.
    async fn hanging_url() -> (String, tokio::net::TcpListener, tokio::net::TcpStream) {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(([127, 0, 0, 1], 0).into()).unwrap();
        let listener = socket.listen(0).unwrap();
        let filler = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        (format!("http://{}", listener.local_addr().unwrap()), listener, filler)
    }

    #[tokio::test(start_paused = true)]
    async fn a_release_waits_a_little_for_a_probe_under_way_then_marks() {
        let (url, _listener, _filler) = hanging_url().await;
        let lease = Duration::from_secs(15);
        let probing = probe(&url, lease).expect("a probe");
        let started = tokio::time::Instant::now();
        assert!(!written(&to(&url), &notice(), lease).await);
        let took = started.elapsed();
        assert!(
            took <= PROBE_GRACE,
            "{took:?}: the grace at most, not the notice timeout"
        );
        probing.await.unwrap();
        assert!(
            skipped(&url, Instant::now()),
            "found unreachable: later releases mark at once"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_release_long_after_a_probe_that_still_hangs_began_marks_at_once() {
        // A notice there would hang its timeout (1 s): the release does not send one.
        let (url, _listener, _filler) = hanging_url().await;
        reach().insert(url.clone(), Reach::Probing(Instant::now() - 2 * PROBE_GRACE));
        let started = tokio::time::Instant::now();
        assert!(!written(&to(&url), &notice(), Duration::from_secs(15)).await);
        assert_eq!(started.elapsed(), Duration::ZERO);
    }

    #[test]
    fn a_probe_that_never_answered_does_not_keep_notices_off() {
        // Its runtime shut down under it: never answered, so probed again, not skipped.
        let url = "http://10.0.0.3:8080";
        reach().insert(url.into(), Reach::Probing(Instant::now() - PROBE_STALE));
        assert!(!skipped(url, Instant::now()));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _entered = runtime.enter();
        assert!(probe(url, Duration::from_secs(15)).is_some(), "probed anew");
    }

    #[tokio::test(start_paused = true)]
    async fn a_release_while_a_reachable_url_is_probed_waits_for_the_probe_and_sends_its_notice() {
        // (On a paused clock: the loopback connect is seen at the runtime's next poll,
        // before the clock would jump past the grace.)
        // Accepts, never answers: the notice costs its timeout, so it shows it was sent.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let _held = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((conn, _)) = listener.accept().await {
                held.push(conn);
            }
        });
        let lease = Duration::from_secs(15);
        let _probing = probe(&url, lease).expect("a probe");
        let started = tokio::time::Instant::now();
        assert!(!written(&to(&url), &notice(), lease).await);
        let took = started.elapsed();
        assert!(
            took >= notice_timeout(lease) && took < notice_timeout(lease) + PROBE_GRACE,
            "{took:?}: the notice was sent once the probe reached the URL"
        );
    }

    #[tokio::test]
    async fn a_probe_finds_a_closed_port_unreachable_and_an_open_one_reachable() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        drop(listener);
        let lease = Duration::from_secs(15);
        probe(&url, lease).expect("a probe").await.unwrap();
        assert!(skipped(&url, Instant::now()));
        assert!(!written(&to(&url), &notice(), lease).await);
        assert!(probe(&url, lease).is_none(), "probed once, not on every status");
        // An open port is reached, and probed once.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let open = format!("http://{}", listener.local_addr().unwrap());
        probe(&open, lease).expect("a probe").await.unwrap();
        assert!(!skipped(&open, Instant::now()));
        assert!(probe(&open, lease).is_none());
        assert!(probe("https://example.invalid:1", lease).is_none(), "not a release URL");
    }
}
