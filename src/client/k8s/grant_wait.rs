//! Waiting for a direct grant ([`crate::protocol::grant`]) while the lock's status
//! designates the claim as its successor: one request held open at the controller's
//! published URL, a watch on the claim itself, where the controller writes the grant
//! when it cannot tell it over HTTP ([`crate::protocol::DIRECT_GRANT_ANNOTATION`]), and,
//! on a lock of one slot whose holder is expected to mark its claim (no release URL
//! published, or none this process expects an answer from), a watch on the holder's
//! claim for the release mark that hands the slot on ([`crate::protocol::handover`]).
//! A grant is trusted only when its signature verifies against the key of the status
//! that designated the claim, for the token reserved there; a handover only when the
//! mark opens the release hash that status recorded for the holder.

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;
use kube::api::{Api, WatchEvent, WatchParams};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::api::DistributedLock;
use crate::protocol::grant::{GRANT_PATH, Grant, SIGNATURE_HEADER, TOKEN_HEADER, WaitFor};
use crate::protocol::notice::endpoint;
use crate::protocol::{DIRECT_GRANT_ANNOTATION, Handover};

/// The least time between two waits for one designation (or two watches of the claim).
const REASK_AFTER: std::time::Duration = std::time::Duration::from_secs(1);
/// How long one watch of the claim lasts before it is made anew (the API server's
/// bound, as kube takes it, is under 295 s).
const CLAIM_WATCH_SECS: u32 = 290;
/// After how many failures in a row to make a claim's watch the client warns (once a
/// run): a failure that stays (credentials, TLS) is tried on while the designation
/// stands, every 2.5–5 s.
const WARN_AFTER_FAILURES: u32 = 5;

/// What a designation says: where to wait, whom to trust, for which grant.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Designation {
    /// Where to hold a wait open; `None`: the claim's watch alone.
    release_url: Option<String>,
    key: String,
    namespace: String,
    lock: String,
    lock_uid: String,
    claim: String,
    token: i64,
    /// The owner's wait proof, shown to the controller with the wait.
    proof: Option<String>,
    /// The one holder's claim and the release hash recorded for it, when its valid
    /// release mark is this claim's grant ([`crate::protocol::handover`]).
    handover: Option<(String, String)>,
}

/// How a watch of one Lease ended.
#[derive(Debug, PartialEq, Eq)]
enum Watched {
    /// A state of it was what the watch waited for.
    Seen,
    /// The client Role may not watch Leases.
    Refused,
}

/// Watch the Lease `name` (its state now first, then each change) until `wanted` takes
/// one, making the watch anew as it ends, and again, backed off as the lock watch is
/// ([`crate::retry::WatchBackoff::client`]), when it cannot be made: a successor whose
/// watch failed once would otherwise learn of its grant only from the status write, or
/// not at all while the controller is away. The designation's end stops it.
async fn watch_lease(leases: &Api<Lease>, name: &str, wanted: impl Fn(&Lease) -> bool) -> Watched {
    let params = WatchParams::default()
        .fields(&format!("metadata.name={name}"))
        .timeout(CLAIM_WATCH_SECS);
    let mut backoff = crate::retry::WatchBackoff::client();
    let mut failed = 0;
    loop {
        let started = tokio::time::Instant::now();
        // From "0": the Lease as it is now first, so a value written before the watch
        // began is seen.
        let events = match leases.watch(&params, "0").await {
            Ok(events) => events,
            Err(kube::Error::Api(s)) if s.code == 403 => return Watched::Refused,
            Err(e) => {
                failed += 1;
                let wait = backoff.next().unwrap_or(REASK_AFTER);
                if failed == WARN_AFTER_FAILURES {
                    tracing::warn!(lease = name, error = %e, failed, "watching a claim keeps failing; trying on (the lock's status grants meanwhile)");
                } else {
                    tracing::debug!(lease = name, error = %e, ?wait, "watching a claim failed; again after a wait");
                }
                tokio::time::sleep(wait).await;
                continue;
            }
        };
        failed = 0;
        futures::pin_mut!(events);
        while let Some(event) = events.next().await {
            match event {
                Ok(WatchEvent::Added(lease) | WatchEvent::Modified(lease)) if wanted(&lease) => {
                    return Watched::Seen;
                }
                Ok(
                    WatchEvent::Added(_) | WatchEvent::Modified(_) | WatchEvent::Deleted(_) | WatchEvent::Bookmark(_),
                ) => {}
                Ok(WatchEvent::Error(_)) | Err(_) => break, // watch anew
            }
        }
        // A watch that lasted the longest wait after the last one starts the waits over.
        kube::runtime::utils::Backoff::reset(&mut backoff);
        tokio::time::sleep_until(started + REASK_AFTER).await;
    }
}

impl Designation {
    /// The designation of `claim` in `lock`'s status, if it has one with everything a
    /// direct grant needs.
    fn of(lock: &DistributedLock, claim: &str, proof: Option<&str>) -> Option<Self> {
        let status = lock.status.as_ref()?;
        let successor = status.successor.as_ref().filter(|s| s.claim == claim)?;
        Some(Designation {
            release_url: status.release_url.clone(),
            key: status.grant_key.clone()?,
            namespace: lock.metadata.namespace.clone()?,
            lock: lock.metadata.name.clone()?,
            lock_uid: lock.metadata.uid.clone()?,
            claim: claim.into(),
            token: successor.fencing_token,
            proof: proof.map(String::from),
            // Watched only where the holder is expected to mark its claim
            // ([`Designation::watch_handover`]).
            handover: crate::protocol::handover(lock.spec.max_holders, status, claim)
                .map(|h| (h.from.to_string(), h.hash.to_string())),
        })
    }

    fn grant(&self) -> Grant<'_> {
        Grant {
            namespace: &self.namespace,
            lock: &self.lock,
            lock_uid: &self.lock_uid,
            claim: &self.claim,
            fencing_token: self.token,
        }
    }

    /// Watch the claim until the controller writes this grant on it, verified (`Some`),
    /// or the watch is refused (`None`: a client Role without `watch` on Leases). A
    /// value that does not verify (a neighbour's, or one of an earlier designation) is
    /// passed over.
    async fn watch_claim(&self, (leases, refused): (Api<Lease>, Refused)) -> Option<i64> {
        let grant = self.grant();
        let told = |lease: &Lease| {
            let value = lease.annotations().get(DIRECT_GRANT_ANNOTATION);
            value.is_some_and(|v| grant.told_by_annotation(&self.key, v))
        };
        match watch_lease(&leases, &self.claim, told).await {
            Watched::Seen => Some(self.token),
            Watched::Refused => {
                refused.store(true, std::sync::atomic::Ordering::Relaxed);
                self.ask_for_no_grant(&leases).await;
                None
            }
        }
    }

    /// Watch the one holder's claim until it carries the release mark that opens the
    /// hash recorded for it: the slot is this claim's, with the reserved token (`Some`).
    /// `None` when there is no handover to wait for, the watch is refused, or the
    /// holder is expected to release by a notice.
    ///
    /// Watched only where the holder is expected to mark its claim: no release URL is
    /// published, or this process expects no answer from the one published
    /// ([`super::notice::expects_no_answer`]: a guess from its own probe, whose only
    /// price when wrong is this watch). Where notices get through, the holder releases
    /// by one, its claim is deleted, never marked, and the successor is told over HTTP:
    /// the watch would cost one more watch a designation, whose end lands on the
    /// handoff (measured 1.40x -> 1.56x `etcdctl lock` when a watch was a connection of
    /// its own, docs/measurements.md).
    async fn watch_handover(&self, leases: Api<Lease>) -> Option<i64> {
        let (from, hash) = self.handover.as_ref()?;
        if let Some(url) = &self.release_url
            && !super::notice::expects_no_answer(url).await
        {
            return None;
        }
        let handover = Handover {
            from,
            hash,
            token: self.token,
        };
        match watch_lease(&leases, from, |lease| handover.released_by(lease)).await {
            Watched::Seen => {
                tracing::debug!(
                    claim = self.claim,
                    holder = from,
                    "the holder's release mark hands the lock on"
                );
                Some(self.token)
            }
            Watched::Refused => None,
        }
    }

    /// Refused a watch of its claim: take the claim's asks for a grant written on it and
    /// for none where the handover grants it back (the controller would write the one,
    /// put its status write off, and leave the other to a watch not made, for nothing).
    async fn ask_for_no_grant(&self, leases: &Api<Lease>) {
        tracing::info!(
            claim = self.claim,
            "the client Role may not watch Leases: grants come by the lock's status (grant them `watch` on leases for faster handoffs without release notices)"
        );
        let patch = serde_json::json!({ "metadata": { "annotations": {
            crate::protocol::GRANT_WATCH_ANNOTATION: null,
            crate::protocol::HANDOVER_WATCH_ANNOTATION: null,
        } } });
        let params = kube::api::PatchParams::default();
        if let Err(e) = leases
            .patch(&self.claim, &params, &kube::api::Patch::Merge(&patch))
            .await
        {
            tracing::debug!(claim = self.claim, error = %e, "taking the claim's ask for a grant on it back failed");
        }
    }

    /// Wait at the controller's `url` until it grants (`Some`), or refuses or fails
    /// (`None`).
    async fn wait_at(&self, url: &str) -> Option<i64> {
        let uri = endpoint(url, GRANT_PATH)?;
        let body = WaitFor {
            namespace: self.namespace.clone(),
            lock: self.lock.clone(),
            claim: self.claim.clone(),
            proof: self.proof.clone(),
        };
        loop {
            let sent = tokio::time::Instant::now();
            let head = match super::notice::post_json(uri.clone(), &body).await {
                Ok(head) => head,
                Err(e) => {
                    tracing::debug!(claim = self.claim, error = %e, "waiting for a direct grant failed");
                    return None;
                }
            };
            match head.status.as_u16() {
                204 => {
                    // Nothing yet: ask again (not in a tight loop if something answers
                    // at once that should have held the request open).
                    tokio::time::sleep_until(sent + REASK_AFTER).await;
                    continue;
                }
                200 => {}
                code => {
                    tracing::debug!(
                        claim = self.claim,
                        code,
                        "the controller takes no wait for a direct grant"
                    );
                    return None;
                }
            }
            let header = |name: &str| head.headers.get(name).and_then(|v| v.to_str().ok());
            // The token exactly as the controller writes it (no `+7`, no `07`), as the
            // Python client reads it.
            let token = header(TOKEN_HEADER).and_then(|t| t.parse::<i64>().ok().filter(|n| n.to_string() == t));
            let signature = header(SIGNATURE_HEADER).unwrap_or_default();
            if token == Some(self.token) && self.grant().verify(&self.key, signature) {
                return Some(self.token);
            }
            tracing::warn!(
                claim = self.claim,
                ?token,
                url,
                "a direct grant did not verify against the lock's grant key: ignored"
            );
            return None;
        }
    }
}

/// Set once a watch of a claim was refused: later claims of the lock handle ask for no
/// grant written on them.
type Refused = std::sync::Arc<std::sync::atomic::AtomicBool>;

/// A claim's wait for a direct grant, following the lock's status.
#[derive(Default)]
pub(crate) struct DirectWait {
    /// The claim's namespace's Leases, to watch the claim while designated, and the
    /// flag set if that is refused; `None`: the HTTP wait alone.
    leases: Option<(Api<Lease>, Refused)>,
    waiting: Option<Waiting>,
    granted: Option<mpsc::Receiver<i64>>,
    /// A verified grant that came while the caller was busy with a status: kept until
    /// [`DirectWait::granted`] takes it, whatever status follows.
    arrived: Option<i64>,
}

/// The waits of one designation: at the URL (made again, after a failure, on a later
/// status) and on the claim (once: a watch refused stays refused).
struct Waiting {
    designation: Designation,
    tx: mpsc::Sender<i64>,
    http: Option<JoinHandle<()>>,
    claim: Option<JoinHandle<()>>,
    handover: Option<JoinHandle<()>>,
}

impl Waiting {
    /// The wait at the URL, if there is one and none runs now.
    fn ask_at_url(&mut self) {
        let Some(url) = self.designation.release_url.clone() else {
            return;
        };
        if self.http.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        let (d, tx) = (self.designation.clone(), self.tx.clone());
        self.http = Some(tokio::spawn(async move {
            if let Some(token) = d.wait_at(&url).await {
                let _ = tx.try_send(token);
            }
        }));
    }

    fn stop(self) {
        for task in [self.http, self.claim, self.handover].into_iter().flatten() {
            task.abort();
        }
    }
}

impl DirectWait {
    /// A wait that also watches the claim through `leases` while designated.
    pub fn watching(leases: (Api<Lease>, Refused)) -> Self {
        DirectWait {
            leases: Some(leases),
            waiting: None,
            granted: None,
            arrived: None,
        }
    }

    /// The lock as last seen: wait for a direct grant while its status designates
    /// `claim` (once per designation, URL and key; at the URL again after a failure
    /// only when the status changes; on the claim once), showing the owner's wait `proof`.
    pub fn follow(&mut self, lock: &DistributedLock, claim: &str, proof: Option<&str>) {
        // A grant already here stays: it was verified for this claim's reserved token,
        // and the lock counts a successor told of its grant as a holder.
        if let Some(rx) = self.granted.as_mut()
            && let Ok(grant) = rx.try_recv()
        {
            self.arrived = Some(grant);
        }
        if self.arrived.is_some() {
            return;
        }
        let next = Designation::of(lock, claim, proof);
        if let Some(waiting) = self.waiting.as_mut()
            && Some(&waiting.designation) == next.as_ref()
        {
            waiting.ask_at_url();
            return;
        }
        self.stop();
        let Some(designation) = next else { return };
        let (tx, rx) = mpsc::channel(2);
        let claim = self.leases.clone().map(|leases| {
            let (d, tx) = (designation.clone(), tx.clone());
            tokio::spawn(async move {
                if let Some(token) = d.watch_claim(leases).await {
                    let _ = tx.try_send(token);
                }
            })
        });
        // Not where a watch of a claim was refused already (a 403 each designation).
        let refused = |(_, r): &(Api<Lease>, Refused)| r.load(std::sync::atomic::Ordering::Relaxed);
        let handover = self
            .leases
            .clone()
            .filter(|l| designation.handover.is_some() && !refused(l))
            .map(|(leases, _)| {
                let (d, tx) = (designation.clone(), tx.clone());
                tokio::spawn(async move {
                    if let Some(token) = d.watch_handover(leases).await {
                        let _ = tx.try_send(token);
                    }
                })
            });
        let mut waiting = Waiting {
            designation,
            tx,
            http: None,
            claim,
            handover,
        };
        waiting.ask_at_url();
        self.waiting = Some(waiting);
        self.granted = Some(rx);
    }

    /// Completes with the token once a verified direct grant has come; pending while
    /// none can.
    pub async fn granted(&mut self) -> i64 {
        if let Some(grant) = self.arrived.take() {
            return grant;
        }
        match self.granted.as_mut() {
            // Never closed while the wait holds a sender: pending until a grant comes.
            Some(rx) => match rx.recv().await {
                Some(granted) => granted,
                None => std::future::pending().await,
            },
            None => std::future::pending().await,
        }
    }

    /// Stop waiting: no direct grant is taken until the next [`DirectWait::follow`].
    pub fn stop(&mut self) {
        if let Some(waiting) = self.waiting.take() {
            waiting.stop();
        }
        self.granted = None;
        self.arrived = None;
    }
}

impl Drop for DirectWait {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::api::{DistributedLockSpec, DistributedLockStatus, Successor};
    use crate::protocol::grant::GrantKey;
    use crate::testing::mock_api;

    /// Leases answered by `answer`, given how many watches came before; the count.
    fn watched(answer: fn(usize) -> (u16, serde_json::Value)) -> (Api<Lease>, Arc<AtomicUsize>) {
        let watches = Arc::new(AtomicUsize::new(0));
        let seen = watches.clone();
        let client = mock_api::client(move |req| {
            let seen = seen.clone();
            async move {
                assert!(
                    req.uri().query().unwrap_or_default().contains("watch=true"),
                    "{}",
                    req.uri()
                );
                answer(seen.fetch_add(1, Ordering::SeqCst))
            }
        });
        (Api::namespaced(client, "ns"), watches)
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_of_a_claim_that_cannot_be_made_is_made_again_until_it_can() {
        let (leases, watches) = watched(|n| match n {
            0 | 1 => (503, mock_api::status(503, "ServiceUnavailable", "starting")),
            _ => (
                200,
                serde_json::json!({ "type": "ADDED", "object": mock_api::claim_lease() }),
            ),
        });
        let t0 = tokio::time::Instant::now();
        let seen = watch_lease(&leases, "l-1", |l| l.name_any() == "l-1").await;
        assert_eq!(seen, Watched::Seen);
        assert_eq!(watches.load(Ordering::SeqCst), 3);
        // Backed off: at least half of 200 ms, then half of 400 ms.
        assert!(
            t0.elapsed() >= std::time::Duration::from_millis(300),
            "{:?}",
            t0.elapsed()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_watch_of_a_claim_is_not_made_again() {
        let (leases, watches) = watched(|_| (403, mock_api::status(403, "Forbidden", "no watch on leases")));
        assert_eq!(watch_lease(&leases, "l-1", |_| true).await, Watched::Refused);
        assert_eq!(watches.load(Ordering::SeqCst), 1);
    }

    /// A controller stand-in on loopback answering one wait with `reply` (a raw HTTP
    /// response head).
    async fn answering(reply: String) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            while !String::from_utf8_lossy(&got).contains("\"claim\"") {
                let n = conn.read(&mut buf).await.unwrap();
                assert!(n > 0, "closed before the body");
                got.extend_from_slice(&buf[..n]);
            }
            assert!(String::from_utf8_lossy(&got).starts_with("POST /v1/grant HTTP/1.1"));
            conn.write_all(reply.as_bytes()).await.unwrap();
            std::future::pending::<()>().await;
        });
        url
    }

    fn designating(url: &str, key: &GrantKey) -> DistributedLock {
        let mut lock = DistributedLock::new("l", DistributedLockSpec::default());
        lock.metadata.namespace = Some("ns".into());
        lock.metadata.uid = Some("u-1".into());
        lock.status = Some(DistributedLockStatus {
            successor: Some(Successor {
                claim: "c-1".into(),
                fencing_token: 7,
                lease_duration_seconds: None,
            }),
            release_url: Some(url.into()),
            grant_key: Some(key.public()),
            ..Default::default()
        });
        lock
    }

    fn reply(token: i64, signature: &str) -> String {
        format!(
            "HTTP/1.1 200 OK\r\n{TOKEN_HEADER}: {token}\r\n{SIGNATURE_HEADER}: {signature}\r\ncontent-length: 0\r\n\r\n"
        )
    }

    fn grant(token: i64) -> Grant<'static> {
        Grant {
            namespace: "ns",
            lock: "l",
            lock_uid: "u-1",
            claim: "c-1",
            fencing_token: token,
        }
    }

    /// Whether following `lock` as claim c-1 yields a grant within a second.
    async fn granted(lock: &DistributedLock) -> Option<i64> {
        let mut wait = DirectWait::default();
        wait.follow(lock, "c-1", None);
        tokio::time::timeout(std::time::Duration::from_secs(1), wait.granted())
            .await
            .ok()
    }

    #[tokio::test]
    async fn a_grant_signed_by_the_published_key_for_the_reserved_token_is_taken() {
        let key = GrantKey::generate();
        let url = answering(reply(7, &key.sign(&grant(7)))).await;
        assert_eq!(granted(&designating(&url, &key)).await, Some(7));
    }

    #[tokio::test]
    async fn a_grant_that_came_while_a_status_was_handled_is_kept() {
        // The stand-in answers one wait only: a grant dropped would never come again.
        let key = GrantKey::generate();
        let url = answering(reply(7, &key.sign(&grant(7)))).await;
        let lock = designating(&url, &key);
        let mut wait = DirectWait::default();
        wait.follow(&lock, "c-1", None);
        let task = |w: &DirectWait| {
            let http = w.waiting.as_ref().and_then(|w| w.http.as_ref());
            http.is_none_or(|t| t.is_finished())
        };
        tokio::time::timeout(std::time::Duration::from_secs(5), async {
            while !task(&wait) {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the grant comes");
        // A status event is handled first (selected before the grant), still designating c-1.
        wait.follow(&lock, "c-1", None);
        let got = tokio::time::timeout(std::time::Duration::from_secs(1), wait.granted()).await;
        assert_eq!(got.ok(), Some(7), "the grant that came is taken");
    }

    #[tokio::test]
    async fn a_wait_refused_is_made_again_on_a_later_status_of_the_same_designation() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let key = GrantKey::generate();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let replies = [
            "HTTP/1.1 503 X\r\ncontent-length: 0\r\n\r\n".to_string(),
            reply(7, &key.sign(&grant(7))),
        ];
        tokio::spawn(async move {
            for reply in replies {
                let (mut conn, _) = listener.accept().await.unwrap();
                let mut buf = [0u8; 4096];
                let _ = conn.read(&mut buf).await.unwrap();
                conn.write_all(reply.as_bytes()).await.unwrap();
                tokio::spawn(async move {
                    let _keep = conn;
                    std::future::pending::<()>().await
                });
            }
        });
        let lock = designating(&url, &key);
        // The claim's watch goes to an API server that never answers: it runs on.
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let api = format!("http://{}", silent.local_addr().unwrap());
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((conn, _)) = silent.accept().await {
                held.push(conn);
            }
        });
        let client = kube::Client::try_from(kube::Config::new(api.parse().unwrap())).unwrap();
        let mut wait = DirectWait::watching((Api::namespaced(client, "ns"), Default::default()));
        wait.follow(&lock, "c-1", None);
        let refused = tokio::time::timeout(std::time::Duration::from_millis(500), wait.granted()).await;
        assert!(refused.is_err(), "refused: no grant");
        wait.follow(&lock, "c-1", None); // a later status, the same designation
        let got = tokio::time::timeout(std::time::Duration::from_secs(5), wait.granted()).await;
        assert_eq!(got.ok(), Some(7), "asked again, and granted");
    }

    #[tokio::test]
    async fn a_forged_or_mismatched_grant_is_ignored() {
        let key = GrantKey::generate();
        let forger = GrantKey::generate();
        for (what, head) in [
            ("another key", reply(7, &forger.sign(&grant(7)))),
            ("another token", reply(8, &key.sign(&grant(8)))),
            ("a token unlike the signed one", reply(7, &key.sign(&grant(8)))),
            (
                "no signature",
                "HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n".to_string(),
            ),
            ("a refusal", "HTTP/1.1 503 X\r\ncontent-length: 0\r\n\r\n".to_string()),
        ] {
            let url = answering(head).await;
            assert_eq!(granted(&designating(&url, &key)).await, None, "{what}");
        }
    }

    #[tokio::test]
    async fn no_wait_without_a_designation_of_this_claim_with_a_key_and_url() {
        let key = GrantKey::generate();
        let url = answering(reply(7, &key.sign(&grant(7)))).await;
        let lock = designating(&url, &key);
        let mut other = lock.clone();
        other.status.as_mut().unwrap().successor.as_mut().unwrap().claim = "c-2".into();
        let mut keyless = lock.clone();
        keyless.status.as_mut().unwrap().grant_key = None;
        // No URL, and no claim to watch (these waits have no Leases API).
        let mut urlless = lock.clone();
        urlless.status.as_mut().unwrap().release_url = None;
        for lock in [other, keyless, urlless] {
            assert_eq!(granted(&lock).await, None);
        }
        assert!(granted(&lock).await.is_some(), "the stand-in still answers");
    }

    /// A status of `url` (or none) designating c-1 (token 7) behind one holder, h, whose
    /// recorded release hash the secret "s" opens.
    fn behind_h(url: Option<&str>) -> DistributedLock {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        let mut lock = designating(url.unwrap_or("http://unused"), &GrantKey::generate());
        let status = lock.status.as_mut().unwrap();
        status.release_url = url.map(String::from);
        let epoch = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        status.holders = vec![crate::api::Holder {
            claim: "h".into(),
            pod: "p".into(),
            pod_uid: "u".into(),
            fencing_token: 6,
            granted_at: epoch.clone(),
            lease_duration_seconds: None,
            release_hash: Some(crate::protocol::release::hash_of("s")),
            revoked: None,
        }];
        status.queue = vec![crate::api::Waiter {
            claim: "c-1".into(),
            pod: "p".into(),
            pod_uid: "u".into(),
            requested_at: epoch,
            release_hash: None,
            lease_duration_seconds: None,
            wait_hash: None,
        }];
        lock
    }

    #[tokio::test]
    async fn the_holders_claim_is_watched_for_the_handover_only_where_it_is_expected_to_be_marked() {
        // The watch shows h carrying the mark that opens its recorded hash.
        let (leases, watches) = watched(|_| {
            let mut h = mock_api::claim_lease();
            h["metadata"]["name"] = "h".into();
            h["metadata"]["annotations"] = serde_json::json!({ crate::protocol::RELEASED_ANNOTATION: "s" });
            (200, serde_json::json!({ "type": "ADDED", "object": h }))
        });
        let handed_over = |lock: DistributedLock| {
            let leases = leases.clone();
            async move {
                Designation::of(&lock, "c-1", None)
                    .unwrap()
                    .watch_handover(leases)
                    .await
            }
        };
        // No URL, or one that is no URL: the holder marks its claim.
        assert_eq!(handed_over(behind_h(None)).await, Some(7));
        assert_eq!(handed_over(behind_h(Some("not a url"))).await, Some(7));
        assert_eq!(watches.load(Ordering::SeqCst), 2);
        // A URL this process reached: the holder will tell the controller; no watch.
        let url = "http://192.0.2.7:8081"; // this test's own: the reach is per process
        super::super::notice::learn_for_test(url, true);
        assert_eq!(handed_over(behind_h(Some(url))).await, None);
        assert_eq!(watches.load(Ordering::SeqCst), 2, "not watched");
        // Found unreachable (its packets dropped): the holder will mark its claim.
        super::super::notice::learn_for_test(url, false);
        assert_eq!(handed_over(behind_h(Some(url))).await, Some(7));
        assert_eq!(watches.load(Ordering::SeqCst), 3);
    }
}
