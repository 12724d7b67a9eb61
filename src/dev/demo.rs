//! The demo behind the README's first command: three clients take turns on one lock
//! on the local control plane, while the lock's status is printed as it changes.

use std::path::Path;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use kube::api::{Api, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use nix::sys::signal::Signal;

use crate::api::{DistributedLock, DistributedLockSpec};

/// The namespace the demo runs in.
pub const DEMO_NAMESPACE: &str = "demo";
/// How many clients take turns.
pub const DEMO_CLIENTS: usize = 3;
/// How long to wait for any one demo step.
const STEP_TIMEOUT: Duration = Duration::from_secs(60);

/// Run the demo against the control plane at `kubeconfig`.
pub async fn run(client: Client, kubeconfig: &Path) -> anyhow::Result<()> {
    // The controller takes release notices on a loopback port, as a deployed one does
    // on its pod IP: each release hands over without a release mark.
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let opts = crate::controller::Options {
        http_addr: Some(([127, 0, 0, 1], port).into()),
        release_url: Some(crate::controller::release_url("127.0.0.1", port)),
        ..crate::controller::Options::single("demo", Some(DEMO_NAMESPACE))
    };
    let controller = tokio::spawn(crate::controller::run(client.clone(), opts, std::future::pending()));
    create_ignoring_conflict(
        &Api::<Namespace>::all(client.clone()),
        serde_json::json!({"metadata": {"name": DEMO_NAMESPACE}}),
    )
    .await?;
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), DEMO_NAMESPACE);
    tokio::time::timeout(STEP_TIMEOUT, async {
        while sas.get_opt("default").await.ok().flatten().is_none() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await?;
    let locks: Api<DistributedLock> = Api::namespaced(client.clone(), DEMO_NAMESPACE);
    let spec = DistributedLockSpec {
        lease_duration_seconds: 5,
        max_holders: 1,
        backend: None,
        max_queue: None,
    };
    create_ignoring_conflict(&locks, serde_json::to_value(DistributedLock::new("demo", spec))?).await?;
    println!("\n== created DistributedLock demo/demo (leaseDurationSeconds 5, maxHolders 1)\n");

    let printer = tokio::spawn(print_changes(locks.clone()));
    let pods: Api<Pod> = Api::namespaced(client.clone(), DEMO_NAMESPACE);
    let leasehold = crate::supervise::self_exe()?;
    let mut runs = Vec::new();
    for i in 1..=DEMO_CLIENTS {
        let name = format!("worker-{i}");
        let pod = serde_json::json!({"metadata": {"name": name}, "spec": {"automountServiceAccountToken": false, "containers": [{"name": "app", "image": "leasehold"}]}});
        let _ = pods.delete(&name, &Default::default()).await;
        let pod = create_retrying(&pods, pod).await?;
        let mut cmd = crate::supervise::guarded_command(&leasehold, Signal::SIGKILL, &leasehold);
        cmd.arg("run").arg("--kubeconfig").arg(kubeconfig).args([
            "--lock",
            "demo",
            "--namespace",
            DEMO_NAMESPACE,
            "--",
        ]);
        cmd.args(["sh", "-c", "echo \"   [$POD_NAME] in the critical section with fencing token $LEASEHOLD_FENCING_TOKEN\"; sleep 1; echo \"   [$POD_NAME] done\""]);
        cmd.env("POD_NAME", &name)
            .env("POD_NAMESPACE", DEMO_NAMESPACE)
            .env("POD_UID", pod.uid().unwrap_or_default());
        cmd.env("RUST_LOG", crate::telemetry::QUIET_FILTER);
        println!("== {name}: leasehold run --lock demo -- sh -c '...'");
        runs.push(cmd.spawn()?);
        tokio::time::sleep(Duration::from_millis(300)).await; // stagger, so the queue is visible
    }
    for mut r in runs {
        let status = tokio::time::timeout(STEP_TIMEOUT, r.wait()).await??;
        anyhow::ensure!(status.success(), "a demo client failed: {status}");
    }
    tokio::time::sleep(Duration::from_millis(500)).await; // let the last status print
    printer.abort();
    controller.abort();
    let _ = controller.await;
    println!("\n== done: each worker held the lock in turn, in arrival order, with a higher fencing token each time.");
    Ok(())
}

/// Print the lock's status table whenever its holders, queue or token change.
async fn print_changes(locks: Api<DistributedLock>) {
    let mut last = None;
    let mut stream = watcher(locks, watcher::Config::default()).applied_objects().boxed();
    while let Some(Ok(lock)) = stream.next().await {
        let st = lock.status.clone().unwrap_or_default();
        let key = (
            st.holders.clone(),
            st.queue.iter().map(|w| w.claim.clone()).collect::<Vec<_>>(),
            st.fencing_token,
        );
        if last.as_ref() != Some(&key) {
            println!(
                "\n$ leasehold status demo -n demo\n{}",
                crate::show::table(&lock, jiff::Timestamp::now())
            );
            last = Some(key);
        }
    }
}

async fn create_ignoring_conflict<K>(api: &Api<K>, obj: serde_json::Value) -> anyhow::Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let obj: K = serde_json::from_value(obj)?;
    match api.create(&PostParams::default(), &obj).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Create, retrying while a just-deleted object of the same name is still going.
async fn create_retrying(pods: &Api<Pod>, obj: serde_json::Value) -> anyhow::Result<Pod> {
    let pod: Pod = serde_json::from_value(obj)?;
    let deadline = tokio::time::Instant::now() + STEP_TIMEOUT;
    loop {
        match pods.create(&PostParams::default(), &pod).await {
            Ok(p) => return Ok(p),
            Err(kube::Error::Api(s)) if s.code == 409 && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}
