//! Release notices ([`leasehold::protocol::notice`]) and direct grants
//! ([`leasehold::protocol::grant`]) against the real API server: a holder's notice hands
//! the lock on with no release mark written, a forged notice takes nothing away, a
//! controller that never answers costs the notice's timeout, then the mark does the
//! handoff; the successor is told of its grant before any status write, and a
//! controller that never wrote it grants the same slot and token to the same claim;
//! without notices, the holder's release mark is its successor's grant, with no
//! controller running.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::ResourceExt;
use kube::runtime::watcher;
use leasehold::client::Lock;
use leasehold::controller::{Options, release_url};
use leasehold::protocol::PodIdentity;
use leasehold::protocol::RELEASED_ANNOTATION;
use leasehold::protocol::timing::notice_timeout;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::*;

fn lock_for(ns: &TestNs, pod: PodIdentity) -> Lock {
    Lock::builder(ns.client.clone(), &ns.name, "l")
        .identity(pod)
        .build()
        .unwrap()
}

/// One HTTP/1.1 request on a connection of its own: the status code and body.
async fn http(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(req.as_bytes()).await.unwrap();
    let mut out = String::new();
    conn.read_to_string(&mut out).await.unwrap();
    let code = out[9..12].parse().unwrap();
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (code, body)
}

/// The claim whose `versions` are followed is swept, and one of them carried the
/// release mark: its release went through the claim, not a notice.
async fn released_through_its_mark(versions: tokio::task::JoinHandle<Vec<k8s_openapi::api::coordination::v1::Lease>>) {
    let seen = tokio::time::timeout(DEADLINE, versions)
        .await
        .expect("the released claim is swept")
        .unwrap();
    assert!(
        seen.iter().any(|l| l.annotations().contains_key(RELEASED_ANNOTATION)),
        "the release went through the claim's mark"
    );
}

/// Every version of claim `name` the API server shows from now until it is deleted.
fn versions_until_deleted(
    ns: &TestNs,
    name: &str,
) -> tokio::task::JoinHandle<Vec<k8s_openapi::api::coordination::v1::Lease>> {
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = watcher(leases(ns), config).boxed();
    tokio::spawn(async move {
        let mut seen = Vec::new();
        while let Some(ev) = events.next().await {
            match ev {
                Ok(watcher::Event::Apply(l) | watcher::Event::InitApply(l)) => seen.push(l),
                Ok(watcher::Event::Delete(l)) => {
                    seen.push(l);
                    return seen;
                }
                _ => {}
            }
        }
        seen
    })
}

#[tokio::test]
async fn a_holders_release_notice_hands_the_lock_on_and_its_claim_is_never_marked() {
    let ns = TestNs::new("notice").await;
    let (addr, _c) = controller_taking_notices(&ns, "notice").await;
    ns.lock("l", spec(15)).await;
    let (a, b) = (ns.pod("a").await, ns.pod("b").await);
    let first = lock_for(&ns, a).acquire().await.unwrap();
    let claim = first.claim().to_string();
    let token = first.fencing_token();
    let versions = versions_until_deleted(&ns, &claim);
    let lock_b = lock_for(&ns, b);
    let waiter = tokio::spawn(async move { lock_b.acquire().await });
    ns.wait_lock("l", "b queued", |l| !queue(l).is_empty()).await;
    let url = format!("http://{addr}");
    let lock = ns.locks().get("l").await.unwrap();
    assert_eq!(lock.status.unwrap().release_url.as_deref(), Some(url.as_str()));

    first.release().await.unwrap();
    let second = tokio::time::timeout(Duration::from_secs(20), waiter)
        .await
        .expect("b is granted")
        .unwrap()
        .unwrap();
    assert!(second.fencing_token() > token);
    let seen = tokio::time::timeout(Duration::from_secs(20), versions)
        .await
        .expect("the controller deletes the released claim")
        .unwrap();
    assert!(
        seen.iter().all(|l| !l.annotations().contains_key(RELEASED_ANNOTATION)),
        "the notice was answered as written: no release mark is written"
    );
    let (_, metrics) = http(addr, "GET", "/metrics", "").await;
    assert!(
        metrics.contains("leasehold_release_notices_total{category=\"written\"} 1"),
        "{metrics}"
    );
    second.release().await.unwrap();
}

#[tokio::test]
async fn a_forged_release_notice_is_refused_and_takes_no_grant_away() {
    let ns = TestNs::new("noticeforged").await;
    let (addr, _c) = controller_taking_notices(&ns, "noticeforged").await;
    ns.lock("l", spec(15)).await;
    let guard = lock_for(&ns, ns.pod("a").await).acquire().await.unwrap();
    let held = ns.locks().get("l").await.unwrap().status.unwrap();
    let hash = held.holders[0]
        .release_hash
        .clone()
        .expect("a hash recorded at queueing");
    let forge = |secret: &str| {
        serde_json::json!({"namespace": ns.name, "lock": "l", "claim": guard.claim(), "secret": secret}).to_string()
    };
    for secret in ["true", hash.as_str(), "0123456789abcdef"] {
        let (code, text) = http(addr, "POST", "/v1/release", &forge(secret)).await;
        assert_eq!(code, 403, "{secret}: {text}");
    }
    let (code, _) = http(addr, "POST", "/v1/release", "{\"claim\": 1}").await;
    assert_eq!(code, 400);
    // The controller reconciles as it would anyway: the holder keeps its grant.
    let (_, metrics) = http(addr, "GET", "/metrics", "").await;
    assert!(
        metrics.contains("leasehold_release_notices_total{category=\"mismatch\"} 3"),
        "{metrics}"
    );
    let lock = ns.locks().get("l").await.unwrap();
    let st = lock.status.unwrap();
    assert_eq!(st.holders.len(), 1);
    assert_eq!(st.holders[0].claim, guard.claim());
    assert!(st.holders[0].revoked.is_none(), "a forged notice revokes nothing");
    assert!(!guard.is_lost());
    guard.release().await.unwrap();
}

#[tokio::test]
async fn a_controller_that_never_answers_a_notice_costs_its_timeout_then_the_mark_hands_on() {
    let ns = TestNs::new("noticehole").await;
    // The published URL accepts connections and never answers (a black hole after
    // connect); the controller itself runs without HTTP.
    let hole = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = hole.local_addr().unwrap().port();
    let _held = tokio::spawn(async move {
        let mut conns = Vec::new();
        while let Ok((c, _)) = hole.accept().await {
            conns.push(c);
        }
    });
    let opts = Options {
        release_url: Some(release_url("127.0.0.1", port)),
        ..Options::single("noticehole", Some(&ns.name))
    };
    let _c = spawn_controller_with(ns.client.clone(), opts);
    // The notice timeout is an eighth of the lease, and the mark is then written within
    // the release budget (half the lease): at 6 s, the mark has 2.25 s on a loaded
    // machine where at 2 s it had 667 ms.
    let lease = 6;
    ns.lock("l", spec(lease)).await;
    let first = lock_for(&ns, ns.pod("a").await).acquire().await.unwrap();
    let claim = first.claim().to_string();
    let versions = versions_until_deleted(&ns, &claim);
    let started = Instant::now();
    first
        .release()
        .await
        .expect("the mark is written after the notice times out");
    let took = started.elapsed();
    let limit = notice_timeout(Duration::from_secs(lease as u64));
    assert!(took >= limit, "the notice was waited for ({took:?} < {limit:?})");
    // The assumption: the mark's write takes less than a lease on a loaded machine.
    assert!(
        took < limit + Duration::from_secs(lease as u64),
        "and no longer ({took:?})"
    );
    ns.wait_lock("l", "the slot is free", |l| holders(l).is_empty()).await;
    released_through_its_mark(versions).await;
}

/// A controller publishing a release URL whose connections never complete (a
/// NetworkPolicy that drops the clients' packets to it), and lock `l` with `lease`:
/// keep what it returns for the test's length.
async fn behind_a_dropping_url(
    ns: &TestNs,
    identity: &str,
    lease: i32,
) -> (leasehold::testing::proxy::Unanswered, Running) {
    let hole = leasehold::testing::proxy::Unanswered::start().await.unwrap();
    let opts = Options {
        release_url: Some(release_url("127.0.0.1", hole.port)),
        ..Options::single(identity, Some(&ns.name))
    };
    let controller = spawn_controller_with(ns.client.clone(), opts);
    ns.lock("l", spec(lease)).await;
    (hole, controller)
}

/// How long the run of `dir`'s pod `b` takes to exit after its CMD's end (it succeeds).
async fn exit_after_cmd_end(dir: &std::path::Path, run: &mut tokio::process::Child) -> Duration {
    crate::client::wait_log(dir, "b's CMD ends", |l| l.iter().any(|l| l[0] == "end")).await;
    let ended = Instant::now();
    let status = tokio::time::timeout(DEADLINE, run.wait()).await.unwrap().unwrap();
    let took = ended.elapsed();
    assert!(status.success());
    took
}

#[tokio::test]
async fn a_release_url_whose_packets_are_dropped_costs_a_waiting_run_s_release_nothing() {
    // A NetworkPolicy that drops the clients' packets to the controller: connections to
    // the published URL never complete. Every release used to wait the notice timeout.
    let ns = TestNs::new("noticedrop").await;
    let lease = 10;
    let _dropping = behind_a_dropping_url(&ns, "noticedrop", lease).await;
    let holder = lock_for(&ns, ns.pod("a").await).acquire().await.unwrap();
    let dir = crate::client::scratch("noticedrop");
    let b = ns.pod("b").await;
    let env = [("RUST_LOG", "info")];
    let mut run_b = crate::client::run_with_env(kubeconfig(), &ns, &b, &dir, &[], &env, crate::client::SECTION);
    let l = ns.wait_lock("l", "b waits", |l| queue(l) == ["b"]).await;
    let claim_b = l.status.unwrap().queue[0].claim.clone();
    // While b waits, it probes the URL its lock published, and says what it found.
    wait_for("b to find the release URL unreachable", DEADLINE, || async {
        let stderr = std::fs::read_to_string(dir.join("b.stderr")).unwrap_or_default();
        stderr.contains("release URL cannot be reached").then_some(())
    })
    .await;
    let versions = versions_until_deleted(&ns, &claim_b);
    holder.release().await.unwrap();
    let took = exit_after_cmd_end(&dir, &mut run_b).await;
    // The assumption: a mark write and the run's exit take less than half the notice
    // timeout (1 s at this lease) on a loaded machine.
    let limit = notice_timeout(Duration::from_secs(lease as u64));
    assert!(
        took < limit / 2,
        "b's release waited for the unreachable URL: {took:?} from its CMD's end to its exit"
    );
    released_through_its_mark(versions).await;
}

#[tokio::test]
async fn a_run_done_before_its_probe_answered_does_not_wait_for_a_release_url_whose_packets_are_dropped() {
    // A free lock and a short CMD: the run's release comes while its probe of the
    // published URL (bounded by the notice timeout, 1 s at this lease) still waits for
    // a connection that never completes. Such a release used to send its notice there
    // and wait the whole notice timeout.
    let ns = TestNs::new("noticeprobing").await;
    let lease = 10;
    let _dropping = behind_a_dropping_url(&ns, "noticeprobing", lease).await;
    ns.wait_lock("l", "the release URL published", |l| {
        l.status.as_ref().is_some_and(|s| s.release_url.is_some())
    })
    .await;
    let dir = crate::client::scratch("noticeprobing");
    let b = ns.pod("b").await;
    let env = [("RUST_LOG", "debug")];
    let mut run_b = crate::client::run_with_env(kubeconfig(), &ns, &b, &dir, &[], &env, crate::client::SECTION);
    let took = exit_after_cmd_end(&dir, &mut run_b).await;
    let limit = notice_timeout(Duration::from_secs(lease as u64));
    let stderr = std::fs::read_to_string(dir.join("b.stderr")).unwrap_or_default();
    assert!(
        took < limit / 2,
        "b's release waited for the URL its probe had not reached: {took:?} from its CMD's end to its exit\n{stderr}"
    );
    ns.wait_lock("l", "the slot is free", |l| holders(l).is_empty()).await;
}

#[tokio::test]
async fn only_the_designated_claims_owner_may_wait_for_its_direct_grant() {
    // A neighbour reads the designated successor's claim name in the lock's status and
    // asks the controller for its grant: it must neither learn the grant nor take the
    // successor's waits (two per claim), which would leave the successor the slow path.
    let ns = TestNs::new("waitowner").await;
    let (addr, _c) = controller_taking_notices(&ns, "waitowner").await;
    ns.lock("l", spec(15)).await;
    let first = lock_for(&ns, ns.pod("a").await).acquire().await.unwrap();
    let lock_b = lock_for(&ns, ns.pod("b").await);
    let waiter_b = tokio::spawn(async move { lock_b.acquire().await });
    let designated = ns.wait_lock("l", "b designated", |l| successor(l).is_some()).await;
    let (claim_b, _) = successor(&designated).unwrap();
    let body = serde_json::json!({"namespace": ns.name, "lock": "l", "claim": claim_b}).to_string();
    for _ in 0..2 {
        let (code, text) = tokio::time::timeout(DEADLINE, http(addr, "POST", "/v1/grant", &body))
            .await
            .expect("a wait without its owner's proof is answered at once, not held");
        assert_eq!(code, 403, "{text}");
    }
    // b's own wait is held; a's release grants b directly.
    wait_for("b waiting at the controller", DEADLINE, || async {
        let (_, metrics) = http(addr, "GET", "/metrics", "").await;
        metrics.contains("leasehold_successors_waiting 1").then_some(())
    })
    .await;
    first.release().await.unwrap();
    let second = tokio::time::timeout(DEADLINE, waiter_b)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let (_, metrics) = http(addr, "GET", "/metrics", "").await;
    assert!(
        metrics.contains("\nleasehold_direct_grants_total 1\n"),
        "b was told of its grant directly:\n{metrics}"
    );
    second.release().await.unwrap();
}

/// The tokens of the holders the lock lists.
fn holder_tokens(lock: &leasehold::api::DistributedLock) -> Vec<i64> {
    lock.status
        .iter()
        .flat_map(|s| &s.holders)
        .map(|h| h.fencing_token)
        .collect()
}

/// The lock's designated successor: its claim and reserved token.
fn successor(lock: &leasehold::api::DistributedLock) -> Option<(String, i64)> {
    let s = lock.status.as_ref()?.successor.as_ref()?;
    Some((s.claim.clone(), s.fencing_token))
}

#[tokio::test]
async fn a_successor_is_granted_before_the_status_write_and_the_next_controller_grants_it_the_same_token() {
    let ns = TestNs::new("direct").await;
    // Controller A reaches the API server through a proxy the test black-holes.
    let (proxy, through_proxy) = proxied_client("direct").await;
    let port = free_port();
    let opts = Options {
        http_addr: Some(([127, 0, 0, 1], port).into()),
        release_url: Some(release_url("127.0.0.1", port)),
        ..Options::single("direct-a", Some(&ns.name))
    };
    let mut controller_a = spawn_controller_with(through_proxy, opts);
    ns.lock("l", spec(4)).await;
    let (a, b, c) = (ns.pod("a").await, ns.pod("b").await, ns.pod("c").await);
    let first = lock_for(&ns, a).acquire().await.unwrap();
    let lock_b = lock_for(&ns, b);
    let waiter_b = tokio::spawn(async move { lock_b.acquire().await });
    let designated = ns.wait_lock("l", "b designated", |l| successor(l).is_some()).await;
    let (claim_b, reserved) = successor(&designated).unwrap();
    let lock_c = lock_for(&ns, c);
    let waiter_c = tokio::spawn(async move { lock_c.acquire().await });
    ns.wait_lock("l", "c queued", |l| queue(l).len() == 2).await;
    wait_for("b waiting at controller A", Duration::from_secs(10), || async {
        let (_, metrics) = http(([127, 0, 0, 1], port).into(), "GET", "/metrics", "").await;
        metrics.contains("leasehold_successors_waiting 1").then_some(())
    })
    .await;

    // A can no longer write anything; a's release notice still reaches it.
    proxy.black_hole();
    first.release().await.unwrap();
    let second = tokio::time::timeout(Duration::from_secs(20), waiter_b)
        .await
        .expect("b is told of its grant")
        .unwrap()
        .unwrap();
    assert_eq!(second.fencing_token(), reserved, "the token reserved for b");
    let before_any_write = ns.locks().get("l").await.unwrap();
    assert_eq!(holders(&before_any_write), ["a"], "b holds before any status lists it");
    assert_eq!(successor(&before_any_write), Some((claim_b.clone(), reserved)));

    // A dies with its status write unsent. B knows nothing of the direct grant, and
    // grants the freed slot to b, with b's token, and to nobody else.
    controller_a.abort();
    let _controller_b = spawn_controller(&ns, "direct-b");
    let after = ns.wait_lock("l", "b listed as holder", |l| holders(l) == ["b"]).await;
    assert_eq!(holder_tokens(&after), [reserved], "b's reserved token, issued once");
    let (_, token_c) = successor(&after).expect("c designated next");
    assert_eq!(queue(&after), ["c"]);
    assert!(token_c > reserved);
    assert!(!second.is_lost(), "b held throughout");
    assert!(!waiter_c.is_finished(), "c still waits");
    second.release().await.unwrap();
    let third = tokio::time::timeout(Duration::from_secs(20), waiter_c)
        .await
        .expect("c is granted")
        .unwrap()
        .unwrap();
    assert_eq!(third.fencing_token(), token_c);
    third.release().await.unwrap();
}

/// Pod a holds lock `l` and pod b, waiting behind it, is designated its successor: a's
/// guard, b's acquire, and the lock as it designated b.
async fn a_holds_b_designated(
    ns: &TestNs,
) -> (
    leasehold::client::Guard,
    tokio::task::JoinHandle<Result<leasehold::client::Guard, leasehold::client::Error>>,
    leasehold::api::DistributedLock,
) {
    let (a, b) = (ns.pod("a").await, ns.pod("b").await);
    let first = lock_for(ns, a).acquire().await.unwrap();
    let lock_b = lock_for(ns, b);
    let waiter_b = tokio::spawn(async move { lock_b.acquire().await });
    let designated = ns.wait_lock("l", "b designated", |l| successor(l).is_some()).await;
    (first, waiter_b, designated)
}

/// With no controller running, a (`first`) releases and b (`waiter_b`) takes a's release
/// mark as its grant, with the claim and token `designated` reserved for it: b's guard
/// and that token.
async fn a_releases_and_b_takes_the_mark(
    first: leasehold::client::Guard,
    waiter_b: tokio::task::JoinHandle<Result<leasehold::client::Guard, leasehold::client::Error>>,
    designated: &leasehold::api::DistributedLock,
) -> (leasehold::client::Guard, i64) {
    let (claim_b, reserved) = successor(designated).unwrap();
    first.release().await.unwrap();
    let second = tokio::time::timeout(DEADLINE, waiter_b)
        .await
        .expect("b takes a's release mark as its grant")
        .unwrap()
        .unwrap();
    assert_eq!((second.claim(), second.fencing_token()), (claim_b.as_str(), reserved));
    (second, reserved)
}

/// Without release notices (a controller publishing no URL), the holder's release mark
/// is the designated successor's grant ([`leasehold::protocol::handover`]): with no
/// controller running, the successor takes its reserved token from the mark alone, and
/// the next controller lists it as the holder with that token.
#[tokio::test]
async fn with_no_controller_running_the_holders_release_mark_hands_the_lock_to_its_successor() {
    let ns = TestNs::new("handover").await;
    let controller_a = spawn_controller(&ns, "handover-a"); // no URL: no notices
    ns.lock("l", spec(15)).await;
    let (first, waiter_b, designated) = a_holds_b_designated(&ns).await;
    controller_a.stop().await;

    let (second, reserved) = a_releases_and_b_takes_the_mark(first, waiter_b, &designated).await;
    let before_any_write = ns.locks().get("l").await.unwrap();
    assert_eq!(holders(&before_any_write), ["a"], "b holds before any status lists it");

    let _controller_b = spawn_controller(&ns, "handover-b");
    let after = ns.wait_lock("l", "b listed as holder", |l| holders(l) == ["b"]).await;
    assert_eq!(holder_tokens(&after), [reserved], "b's reserved token, issued once");
    assert!(!second.is_lost(), "b held throughout");
    second.release().await.unwrap();
}

/// Where the clients' packets to the published release URL are dropped, the holder
/// marks its claim, and a successor that expects no answer from that URL takes the mark
/// as its grant, as where no URL is published: with no controller running, it takes its
/// reserved token from the mark alone.
#[tokio::test]
async fn behind_a_dropping_release_url_the_holders_mark_hands_the_lock_to_its_successor() {
    let ns = TestNs::new("handoverdrop").await;
    let (_hole, controller) = behind_a_dropping_url(&ns, "handoverdrop", 15).await;
    let (first, waiter_b, designated) = a_holds_b_designated(&ns).await;
    assert!(designated.status.as_ref().unwrap().release_url.is_some());
    controller.stop().await;

    let (second, _) = a_releases_and_b_takes_the_mark(first, waiter_b, &designated).await;
    second.release().await.unwrap();
}

/// Behind a dropping release URL, the controller writes no grant on the claim of a
/// successor that takes the holder's mark itself (it asks for the handover, and is not
/// waiting over HTTP): one Lease write fewer on the handoff.
#[tokio::test]
async fn behind_a_dropping_release_url_a_successor_that_takes_the_mark_is_written_no_grant() {
    use k8s_openapi::api::coordination::v1::Lease;
    use leasehold::protocol::DIRECT_GRANT_ANNOTATION;
    let ns = TestNs::new("handoverdropw").await;
    let _dropping = behind_a_dropping_url(&ns, "handoverdropw", 15).await;
    let (first, waiter_b, designated) = a_holds_b_designated(&ns).await;
    let (claim_b, reserved) = successor(&designated).unwrap();
    first.release().await.unwrap();
    let second = tokio::time::timeout(DEADLINE, waiter_b)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!((second.claim(), second.fencing_token()), (claim_b.as_str(), reserved));
    // The grant is written on a claim before the status write that records it.
    ns.wait_lock("l", "b's grant recorded", |l| holders(l) == ["b"]).await;
    let claim = kube::Api::<Lease>::namespaced(ns.client.clone(), &ns.name)
        .get(&claim_b)
        .await
        .unwrap();
    assert!(
        !claim.annotations().contains_key(DIRECT_GRANT_ANNOTATION),
        "a grant written on the claim of a successor that took the holder's mark"
    );
    second.release().await.unwrap();
}

/// A stand-in at `addr` answering every request "written" (200 with the controller's
/// header, signed by a key of its own), the way whatever answers at a stale or hijacked
/// release URL might; returns how many requests it answered.
fn answering_written_unsigned(listener: tokio::net::TcpListener) -> std::sync::Arc<std::sync::atomic::AtomicUsize> {
    let answered = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = answered.clone();
    let forger = leasehold::protocol::grant::GrantKey::generate();
    tokio::spawn(async move {
        loop {
            let Ok((mut conn, _)) = listener.accept().await else {
                return;
            };
            let mut buf = [0u8; 4096];
            let _ = conn.read(&mut buf).await;
            let w = leasehold::protocol::grant::WrittenRelease {
                namespace: "x",
                lock: "l",
                lock_uid: "x",
                claim: "x",
            };
            let reply = format!(
                "HTTP/1.1 200 OK\r\nleasehold-release: written\r\nleasehold-release-signature: {}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                forger.sign_written(&w)
            );
            let _ = conn.write_all(reply.as_bytes()).await;
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    });
    answered
}

#[tokio::test]
async fn a_written_answer_from_whatever_answers_at_the_published_url_without_the_lock_s_key_spares_no_mark() {
    let ns = TestNs::new("stale-url").await;
    // The status publishes an address where something else answers (a stale URL after
    // a failover, a hijacked pod IP): "written", without the controller's signature.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let answered = answering_written_unsigned(listener);
    let opts = Options {
        release_url: Some(release_url("127.0.0.1", port)),
        ..Options::single("stale-url", Some(&ns.name))
    };
    let _c = spawn_controller_with(ns.client.clone(), opts);
    ns.lock("l", spec(15)).await;
    let (a, b) = (ns.pod("a").await, ns.pod("b").await);
    let first = lock_for(&ns, a).acquire().await.unwrap();
    let versions = versions_until_deleted(&ns, first.claim());
    let lock_b = lock_for(&ns, b);
    let waiter = tokio::spawn(async move { lock_b.acquire().await });
    ns.wait_lock("l", "b queued", |l| !queue(l).is_empty()).await;
    first.release().await.unwrap();
    assert!(
        answered.load(std::sync::atomic::Ordering::SeqCst) >= 1,
        "the holder sent its notice to the published URL"
    );
    let seen = tokio::time::timeout(Duration::from_secs(20), versions)
        .await
        .expect("the released claim is deleted")
        .unwrap();
    assert!(
        seen.iter().any(|l| l.annotations().contains_key(RELEASED_ANNOTATION)),
        "the holder wrote its release mark (an unsigned 'written' spared it, and the slot waited for the claim's expiry)"
    );
    let second = tokio::time::timeout(Duration::from_secs(20), waiter)
        .await
        .expect("b is granted")
        .unwrap()
        .unwrap();
    second.release().await.unwrap();
    let reasons = event_reasons(&ns, "l").await;
    assert!(
        !reasons.iter().any(|r| r == "Revoked"),
        "released, not expired: {reasons:?}"
    );
}
