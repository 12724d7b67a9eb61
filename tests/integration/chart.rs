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

    helm(&["uninstall", &rel, "-n", &system.name]);
}

fn leases_as(client: &kube::Client, ns: &str) -> Api<k8s_openapi::api::coordination::v1::Lease> {
    Api::namespaced(client.clone(), ns)
}
