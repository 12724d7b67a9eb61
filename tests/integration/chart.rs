//! The Helm chart installs on a real API server; the controller running as the chart's
//! ServiceAccount can do all it needs and nothing more; a client bound to the chart's
//! client Role can acquire and release.

use std::process::Command;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, Patch, PatchParams, PostParams};
use leasehold::api::{DistributedLock, DistributedLockSpec};
use leasehold::client::Lock;

use crate::support::*;

fn helm(args: &[&str]) -> std::process::Output {
    let helm = std::env::var("LEASEHOLD_HELM").expect("checked by the test");
    let out = Command::new(helm)
        .args(args)
        .arg("--kubeconfig")
        .arg(kubeconfig())
        .output()
        .expect("run helm");
    assert!(
        out.status.success(),
        "helm {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[tokio::test]
async fn chart_installs_and_its_rbac_is_enough_and_no_more() {
    assert!(
        std::env::var_os("LEASEHOLD_HELM").is_some(),
        "LEASEHOLD_HELM is not set: scripts/test.sh sets it (scripts/chart-check.sh fetches helm and prints its path)"
    );
    let system = TestNs::new("chart").await;
    let app = TestNs::new("chartapp").await;
    let rel = format!("lh-{:04x}", rand::random::<u16>());
    let chart = concat!(env!("CARGO_MANIFEST_DIR"), "/charts/leasehold");
    let apps = format!("clientRbac.namespaces={{{}}}", app.name);
    // The CRD already exists (leasehold dev installed it): the chart takes it over.
    helm(&[
        "install",
        &rel,
        chart,
        "-n",
        &system.name,
        "--take-ownership",
        "--set",
        &apps,
    ]);
    let fullname = format!("{rel}-leasehold");
    let deploy = Api::<Deployment>::namespaced(system.client.clone(), &system.name)
        .get(&fullname)
        .await
        .unwrap();
    assert_eq!(deploy.spec.unwrap().replicas, Some(2));

    // The controller, as the chart's ServiceAccount, with leader election.
    let sa = format!("system:serviceaccount:{}:{fullname}", system.name);
    let as_controller = client_as(&sa).await;
    let opts = leasehold::controller::Options {
        leader_election_namespace: Some(system.name.clone()),
        identity: "chart-test".into(),
        http_addr: None,
        probe_addr: None,
        namespace: Some(app.name.clone()),
        release_url: None,
        notice_wait: leasehold::protocol::timing::NOTICE_WAIT,
        etcd_mirror: leasehold::controller::EtcdMirrorPace::default(),
        admission: None,
    };
    let _c = spawn_controller_with(as_controller.clone(), opts);
    app.lock(
        "l",
        DistributedLockSpec {
            lease_duration_seconds: 60,
            max_holders: 1,
            backend: None,
            max_queue: None,
        },
    )
    .await;
    let (a, b) = (app.pod("a").await, app.pod("b").await);
    let ca = claim(&app, "l", &a, 60).await;
    app.wait_lock("l", "a holds (granted by the chart's identity)", |l| {
        holders(l) == ["a"]
    })
    .await;
    claim(&app, "l", &b, 60).await;
    app.wait_lock("l", "b waits", |l| queue(l) == ["b"]).await;
    release(&app, &ca).await;
    app.wait_lock("l", "b holds", |l| holders(l) == ["b"]).await;
    wait_for("Granted events written", DEADLINE, || async {
        (event_reasons(&app, "l")
            .await
            .iter()
            .filter(|r| *r == "Granted")
            .count()
            == 2)
            .then_some(())
    })
    .await;
    wait_for("released claim deleted", DEADLINE, || async {
        leases(&app).get_opt(&ca).await.unwrap().is_none().then_some(())
    })
    .await;

    // ...and is refused what it does not need.
    let ns = &app.name;
    assert!(forbidden(
        Api::<Secret>::namespaced(as_controller.clone(), ns)
            .list(&Default::default())
            .await
    ));
    // No Secret at all by default: only those etcdBackend.tlsSecrets names.
    assert!(forbidden(
        Api::<Secret>::namespaced(as_controller.clone(), ns)
            .get("etcd-client-tls")
            .await
    ));
    assert!(forbidden(
        Api::<Pod>::namespaced(as_controller.clone(), ns)
            .delete("a", &Default::default())
            .await
    ));
    let locks = Api::<DistributedLock>::namespaced(as_controller.clone(), ns);
    let new = DistributedLock::new("x", DistributedLockSpec::default());
    assert!(forbidden(locks.create(&PostParams::default(), &new).await));
    // (It may patch locks: its finalizer. RBAC cannot narrow that to metadata.)
    assert!(forbidden(locks.delete("l", &Default::default()).await));
    let lease = leasehold::protocol::claim::claim_lease("forged", "l", &a, 60);
    assert!(forbidden(
        leases_as(&as_controller, ns)
            .create(&PostParams::default(), &lease)
            .await
    ));

    // A client pod's identity, bound by the chart's client Role, can take turns.
    let client_sa = format!("system:serviceaccount:{}:leasehold-client", app.name);
    let as_client = client_as(&client_sa).await;
    let c = app.pod("c").await;
    let lock = Lock::builder(as_client.clone(), ns, "l").identity(c).build().unwrap();
    let waiting = tokio::spawn(async move {
        let g = lock.acquire().await.expect("the client Role suffices to acquire");
        let token = g.fencing_token();
        g.release().await.expect("and to release");
        token
    });
    app.wait_lock("l", "c waits behind b", |l| queue(l) == ["c"]).await;
    let cb = app.locks().get("l").await.unwrap().status.unwrap().holders[0]
        .claim
        .clone();
    release(&app, &cb).await;
    let token = tokio::time::timeout(DEADLINE, waiting).await.unwrap().unwrap();
    assert_eq!(token - epoch(&app.locks().get("l").await.unwrap()), 3);
    assert!(forbidden(
        Api::<Pod>::namespaced(as_client.clone(), ns)
            .list(&Default::default())
            .await
    ));
    assert!(forbidden(Api::<Pod>::namespaced(as_client.clone(), ns).get("c").await));
    // Least privilege on Leases: no reading, replacing or deleting anyone's Lease (an
    // application's leader-election Lease included), only create and patch.
    let leader: k8s_openapi::api::coordination::v1::Lease = serde_json::from_value(
        serde_json::json!({"metadata": {"name": "app-leader"}, "spec": {"holderIdentity": "x"}}),
    )
    .unwrap();
    let leader = leases_as(&app.client, ns)
        .create(&PostParams::default(), &leader)
        .await
        .unwrap();
    let leases_c = leases_as(&as_client, ns);
    assert!(forbidden(leases_c.get("app-leader").await));
    assert!(forbidden(leases_c.list(&Default::default()).await));
    assert!(forbidden(
        leases_c.replace("app-leader", &PostParams::default(), &leader).await
    ));
    assert!(forbidden(leases_c.delete("app-leader", &Default::default()).await));
    let status = Patch::Merge(serde_json::json!({"status": {"fencingToken": 99}}));
    let locks = Api::<DistributedLock>::namespaced(as_client, ns);
    assert!(forbidden(
        locks.patch_status("l", &PatchParams::default(), &status).await
    ));

    // No kubelet here: the pre-delete hook's Job would never run (the e2e runs it).
    helm(&["uninstall", &rel, "-n", &system.name, "--no-hooks"]);
}

fn leases_as(client: &kube::Client, ns: &str) -> Api<k8s_openapi::api::coordination::v1::Lease> {
    Api::namespaced(client.clone(), ns)
}

/// The documents of `kind` in a rendered manifest.
fn rendered_docs(manifest: &str, kind: &str) -> Vec<serde_json::Value> {
    serde_norway::Deserializer::from_str(manifest)
        .filter_map(|doc| <serde_json::Value as serde::Deserialize>::deserialize(doc).ok())
        .filter(|v| v["kind"] == kind)
        .collect()
}

#[tokio::test]
async fn the_chart_s_webhook_serves_its_certificate_for_the_service_name_the_api_server_calls() {
    let ns = format!("lh-{:04x}", rand::random::<u16>());
    let chart = concat!(env!("CARGO_MANIFEST_DIR"), "/charts/leasehold");
    let out = helm(&["template", "lh", chart, "-n", &ns, "--set", "admission.enabled=true"]);
    let manifest = String::from_utf8(out.stdout).unwrap();
    let secret = &rendered_docs(&manifest, "Secret")[0];
    let config = &rendered_docs(&manifest, "ValidatingWebhookConfiguration")[0];
    let client = &config["webhooks"][0]["clientConfig"];
    let (service, path) = (
        client["service"]["name"].as_str().unwrap(),
        client["service"]["path"].as_str().unwrap(),
    );
    assert_eq!(path, leasehold::protocol::admission::ADMISSION_PATH);
    // The Deployment mounts that Secret and points the controller at its files.
    let deploy = &rendered_docs(&manifest, "Deployment")[0];
    let volumes = deploy["spec"]["template"]["spec"]["volumes"].to_string();
    assert!(
        volumes.contains(secret["metadata"]["name"].as_str().unwrap()),
        "{volumes}"
    );
    let args = deploy["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
    assert!(
        args.contains("--admission-cert=/etc/leasehold/admission/tls.crt"),
        "{args}"
    );

    let dir = std::env::temp_dir().join(format!("leasehold-chart-{ns}"));
    std::fs::create_dir_all(&dir).unwrap();
    let decoded = |v: &serde_json::Value| serde_json::from_value::<k8s_openapi::ByteString>(v.clone()).unwrap().0;
    std::fs::write(dir.join("tls.crt"), decoded(&secret["data"]["tls.crt"])).unwrap();
    std::fs::write(dir.join("tls.key"), decoded(&secret["data"]["tls.key"])).unwrap();
    std::fs::write(dir.join("ca.crt"), decoded(&client["caBundle"])).unwrap();
    let server = leasehold::controller::admission::Server::bind(leasehold::controller::admission::Admission {
        addr: ([127, 0, 0, 1], 0).into(),
        cert: dir.join("tls.crt"),
        key: dir.join("tls.key"),
        policy: Default::default(),
    })
    .await
    .expect("the controller takes the chart's certificate and key");
    let port = server.local_addr().port();
    let _serving = tokio::spawn(server.run());
    // As the API server calls it: by the Service's DNS name, trusting only caBundle.
    let host = format!("{service}.{ns}.svc");
    let review = serde_json::json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u-1", "operation": "UPDATE", "name": "app-leader", "namespace": "apps",
        "kind": {"group": "coordination.k8s.io", "version": "v1", "kind": "Lease"},
        "resource": {"group": "coordination.k8s.io", "version": "v1", "resource": "leases"},
        "userInfo": {"username": "system:serviceaccount:apps:leasehold-client"},
        "object": {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "app-leader"}},
        "oldObject": {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "app-leader"}}}});
    let curl = tokio::process::Command::new("curl")
        .args(["-sS", "--fail", "--cacert"])
        .arg(dir.join("ca.crt"))
        .arg("--resolve")
        .arg(format!("{host}:{port}:127.0.0.1"))
        .args([
            "-H",
            "content-type: application/json",
            "--data-binary",
            &review.to_string(),
        ])
        .arg(format!("https://{host}:{port}{path}"))
        .output()
        .await
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(curl.status.success(), "{}", String::from_utf8_lossy(&curl.stderr));
    let answer: serde_json::Value = serde_json::from_slice(&curl.stdout).unwrap();
    assert_eq!(answer["response"]["uid"], "u-1");
    assert_eq!(answer["response"]["allowed"], false, "{answer}");
}
