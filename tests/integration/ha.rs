//! Several replicas with leader election, and the HTTP endpoints.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use leasehold::api::DistributedLockSpec;
use leasehold::controller::{LEADER_LEASE, Options};

use crate::support::*;

fn elected(ns: &TestNs, identity: &str, http: Option<u16>) -> Options {
    Options {
        leader_election_namespace: Some(ns.name.clone()),
        identity: identity.into(),
        http_addr: http.map(|p| ([127, 0, 0, 1], p).into()),
        probe_addr: None,
        namespace: Some(ns.name.clone()),
        // Holders send release notices to whichever replica wrote their grant.
        release_url: http.map(|p| leasehold::controller::release_url("127.0.0.1", p)),
        notice_wait: leasehold::protocol::timing::NOTICE_WAIT,
        etcd_mirror: leasehold::controller::EtcdMirrorPace::default(),
        admission: None,
    }
}

async fn leader(ns: &TestNs) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(ns.client.clone(), &ns.name);
    leases
        .get_opt(LEADER_LEASE)
        .await
        .ok()??
        .spec?
        .holder_identity
        .filter(|h| !h.is_empty())
}

#[tokio::test]
async fn a_standby_replica_takes_over_when_the_leader_stops_and_metrics_are_served() {
    let ns = TestNs::new("ha").await;
    let ports = [free_port(), free_port()];
    let mut replicas = [
        Some(spawn_controller_with(
            ns.client.clone(),
            elected(&ns, "ha-0", Some(ports[0])),
        )),
        Some(spawn_controller_with(
            ns.client.clone(),
            elected(&ns, "ha-1", Some(ports[1])),
        )),
    ];
    let first = wait_for("a leader", DEADLINE, || leader(&ns)).await;
    let i: usize = first.strip_prefix("ha-").unwrap().parse().unwrap();
    for port in ports {
        wait_for("/readyz to answer 200", DEADLINE, || async {
            get(port, "/readyz").await.filter(|(status, _)| status.contains("200"))
        })
        .await;
        assert!(get(port, "/healthz").await.unwrap().0.contains("200"));
    }

    ns.lock(
        "l",
        DistributedLockSpec {
            lease_duration_seconds: 60,
            max_holders: 1,
            backend: None,
            max_queue: None,
        },
    )
    .await;
    let (a, b, c) = (ns.pod("a").await, ns.pod("b").await, ns.pod("c").await);
    let ca = claim(&ns, "l", &a, 60).await;
    ns.wait_lock("l", "a holds", |l| holders(l) == ["a"]).await;
    let cb = claim(&ns, "l", &b, 60).await;
    ns.wait_lock("l", "b waits", |l| queue(l) == ["b"]).await;
    let (_, metrics) = get(ports[i], "/metrics").await.unwrap();
    let grants = format!("leasehold_grants_total{{namespace=\"{}\",lock=\"l\"}} 1", ns.name);
    assert!(metrics.contains(&grants), "the leader counts its grant:\n{metrics}");
    let depth = format!("leasehold_queue_depth{{namespace=\"{}\",lock=\"l\"}} 1\n", ns.name);
    assert!(metrics.contains(&depth), "the leader shows b waiting:\n{metrics}");
    assert!(metrics.contains("\nleasehold_leader 1\n"), "{metrics}");
    let (_, standby) = get(ports[1 - i], "/metrics").await.unwrap();
    assert!(standby.contains("\nleasehold_leader 0\n"), "{standby}");

    // The leader stops; the standby takes over and grants continue.
    replicas[i].take().unwrap().stop().await;
    let second = wait_for("the standby to lead", Duration::from_secs(40), || async {
        leader(&ns).await.filter(|l| *l != first)
    })
    .await;
    assert_eq!(second, format!("ha-{}", 1 - i));
    release(&ns, &ca).await;
    let l = ns
        .wait_lock("l", "b holds under the new leader", |l| holders(l) == ["b"])
        .await;
    assert_eq!(tokens(&l), [2]);
    claim(&ns, "l", &c, 60).await;
    release(&ns, &cb).await;
    let l = ns.wait_lock("l", "c holds", |l| holders(l) == ["c"]).await;
    assert_eq!(tokens(&l), [3]);
    let (_, metrics) = get(ports[1 - i], "/metrics").await.unwrap();
    // The histogram has no labels: its count line is there from the start, at 0.
    assert!(
        metrics.contains("\nleasehold_handoff_seconds_count 2\n"),
        "the new leader timed its two handoffs (a to b, b to c):\n{metrics}"
    );
    assert!(
        metrics.contains("\nleasehold_leader 1\n"),
        "the new leader says so:\n{metrics}"
    );
}

#[tokio::test]
async fn a_controller_whose_future_is_dropped_serves_nothing_more() {
    // A program embedding the controller stops it by dropping `run`'s future: its HTTP
    // server (release notices, direct grants, metrics) must go with it, not answer on
    // for a controller that no longer watches anything.
    let ns = TestNs::new("dropped").await;
    let (port, c, _) = serving_controller(&ns, "dropped").await;
    c.stop().await;
    wait_for("the port to refuse connections", DEADLINE, || async {
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
            .then_some(())
    })
    .await;
}

#[tokio::test]
async fn metrics_are_openmetrics_with_build_info_and_a_deleted_locks_series_go() {
    let ns = TestNs::new("metrics").await;
    let (port, _c, (head, body)) = serving_controller(&ns, "metrics").await;
    let content_type = head
        .lines()
        .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-type: ").map(String::from));
    assert_eq!(
        content_type.as_deref(),
        Some("application/openmetrics-text; version=1.0.0; charset=utf-8")
    );
    let build = format!(
        "leasehold_build_info{{version=\"{}\",revision=",
        env!("CARGO_PKG_VERSION")
    );
    assert!(body.contains(&build), "{body}");
    assert!(
        body.contains("\nleasehold_leader 1\n"),
        "the only replica leads:\n{body}"
    );

    let mut claims = Vec::new();
    for lock in ["gone", "kept"] {
        ns.lock(
            lock,
            DistributedLockSpec {
                lease_duration_seconds: 60,
                max_holders: 1,
                backend: None,
                max_queue: None,
            },
        )
        .await;
        let pod = ns.pod(&format!("p-{lock}")).await;
        claims.push(claim(&ns, lock, &pod, 60).await);
        ns.wait_lock(lock, "the claim holds", |l| holders(l).len() == 1).await;
    }
    let series = |lock: &str| format!("{{namespace=\"{}\",lock=\"{lock}\"}}", ns.name);
    // Metrics are recorded after the status write returns, which may be after the
    // watch has shown this test the grant: wait for both series rather than race.
    wait_for("both locks' series", DEADLINE, || async {
        let (_, body) = get(port, "/metrics").await?;
        (body.contains(&series("gone")) && body.contains(&series("kept"))).then_some(())
    })
    .await;
    // The deleted lock revokes its holder and goes once the holder has stopped.
    ns.locks().delete("gone", &Default::default()).await.unwrap();
    release(&ns, &claims[0]).await;
    let body = wait_for("the deleted lock's series to go", DEADLINE, || async {
        let (_, body) = get(port, "/metrics").await?;
        (!body.contains(&series("gone"))).then_some(body)
    })
    .await;
    let kept = format!("leasehold_grants_total{}", series("kept"));
    assert!(body.contains(&kept), "the other lock's series stay:\n{body}");
}

#[tokio::test]
async fn a_leader_cut_off_and_back_after_a_takeover_never_expires_a_live_holder() {
    let ns = TestNs::new("hacut").await;
    // The first leader's whole path to the API server goes through a proxy.
    let (proxy, cut_off) = proxied_client("hacut").await;
    let _first = spawn_controller_with(cut_off, elected(&ns, "hacut-0", None));
    wait_for("hacut-0 leads", DEADLINE, || async {
        (leader(&ns).await.as_deref() == Some("hacut-0")).then_some(())
    })
    .await;
    let _standby = spawn_controller_with(ns.client.clone(), elected(&ns, "hacut-1", None));
    let renewing = live_holder_and_waiter(&ns, 3).await;

    // The leader's packets vanish: the standby takes over once the leader Lease runs out.
    proxy.black_hole();
    wait_for("hacut-1 takes over", Duration::from_secs(60), || async {
        (leader(&ns).await.as_deref() == Some("hacut-1")).then_some(())
    })
    .await;
    // The old leader comes back, its caches stale, still thinking it may lead.
    proxy.restore();
    assert_undisturbed(&ns, Duration::from_secs(10)).await;
    still_served(&ns, renewing).await;
}
