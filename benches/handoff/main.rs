//! Handoff latency on the local control plane, printed as figures (not a test):
//!
//! * controller: a holder's claim is marked released → the next holder appears in the
//!   lock's status (seen through a watch), with the controller running in this process;
//! * end to end: one `leasehold run` CMD exits → the next queued CMD starts;
//! * pod gone: the holder's pod is deleted after the kubelet reported its containers
//!   terminated (a graceful deletion) → the next holder appears in the lock's status.
//!
//! `cargo bench --bench handoff` (add `-- --rounds N` to change the sample size).

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use leasehold::api::{DistributedLock, DistributedLockSpec};
use leasehold::protocol::claim::{PodIdentity, claim_lease, claim_name, release_patch};

const LEASEHOLD: &str = env!("CARGO_BIN_EXE_leasehold");

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if !args.iter().any(|a| a == "--bench") {
        println!("handoff: SKIPPED — a benchmark, not a test; run `cargo bench --bench handoff`");
        return Ok(());
    }
    let rounds = args
        .iter()
        .position(|a| a == "--rounds")
        .and_then(|i| args.get(i + 1)?.parse().ok())
        .unwrap_or(220);
    let kubeconfig = leasehold::dev::spawn_for_process(std::path::Path::new(LEASEHOLD), Duration::from_secs(600))?;
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(async {
            let client = leasehold::kubeconfig::client_for(&kubeconfig).await?;
            let controller_task = tokio::spawn(leasehold::controller::run(
                client.clone(),
                leasehold::controller::Options::single("bench", None),
                std::future::pending(),
            ));
            let mut controller = controller_handoffs(client.clone(), rounds).await?;
            report(
                "controller handoff (release written -> next holder in status)",
                &mut controller,
            );
            let mut gone = pod_gone_handoffs(client.clone(), rounds.min(60)).await?;
            report(
                "pod-gone handoff (stopped pod deleted -> next holder in status)",
                &mut gone,
            );
            let mut e2e = end_to_end_handoffs(client, &kubeconfig, rounds).await?;
            report("end-to-end handoff (CMD exits -> next CMD starts)", &mut e2e);
            controller_task.abort();
            let _ = controller_task.await;
            Ok(())
        })
}

fn report(what: &str, samples: &mut [Duration]) {
    samples.sort();
    let pct = |p: f64| samples[((samples.len() as f64 - 1.0) * p).round() as usize].as_secs_f64() * 1000.0;
    println!(
        "{what}: n={} median={:.1} ms p90={:.1} ms p99={:.1} ms min={:.1} ms max={:.1} ms",
        samples.len(),
        pct(0.5),
        pct(0.9),
        pct(0.99),
        pct(0.0),
        pct(1.0)
    );
}

async fn namespace(client: &Client, name: &str) -> anyhow::Result<()> {
    let ns: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": name}}))?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await?;
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), name);
    while sas.get_opt("default").await?.is_none() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let lock = DistributedLock::new(
        "bench",
        DistributedLockSpec {
            lease_duration_seconds: 60,
            max_holders: 1,
        },
    );
    Api::<DistributedLock>::namespaced(client.clone(), name)
        .create(&PostParams::default(), &lock)
        .await?;
    Ok(())
}

async fn pod(client: &Client, ns: &str, name: &str) -> anyhow::Result<PodIdentity> {
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name}, "spec": {"automountServiceAccountToken": false, "containers": [{"name": "app", "image": "leasehold"}]}
    }))?;
    let pod = Api::<Pod>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &pod)
        .await?;
    Ok(PodIdentity {
        name: name.into(),
        namespace: ns.into(),
        uid: pod.uid().unwrap_or_default(),
    })
}

async fn controller_handoffs(client: Client, rounds: usize) -> anyhow::Result<Vec<Duration>> {
    let ns = "bench-controller";
    namespace(&client, ns).await?;
    let pods = [pod(&client, ns, "a").await?, pod(&client, ns, "b").await?];
    let leases: Api<Lease> = Api::namespaced(client.clone(), ns);
    let locks: Api<DistributedLock> = Api::namespaced(client.clone(), ns);
    let mut events = watcher(locks, watcher::Config::default().fields("metadata.name=bench"))
        .applied_objects()
        .boxed();
    let new_claim = |i: usize| {
        let name = claim_name("bench");
        (name.clone(), claim_lease(&name, "bench", &pods[i % 2], 60))
    };
    let (mut holder, lease) = new_claim(0);
    leases.create(&PostParams::default(), &lease).await?;
    let mut samples = Vec::new();
    for i in 1..=rounds {
        let (waiter, lease) = new_claim(i);
        leases.create(&PostParams::default(), &lease).await?;
        // Untimed: wait until the holder holds and the waiter is queued.
        loop {
            let st = events.next().await.expect("watch")?.status.unwrap_or_default();
            if st.holders.first().is_some_and(|h| h.claim == holder) && st.queue.iter().any(|w| w.claim == waiter) {
                break;
            }
        }
        let started = Instant::now();
        leases
            .patch(&holder, &PatchParams::default(), &Patch::Merge(release_patch()))
            .await?;
        loop {
            let st = events.next().await.expect("watch")?.status.unwrap_or_default();
            if st.holders.first().is_some_and(|h| h.claim == waiter) {
                break;
            }
        }
        samples.push(started.elapsed());
        holder = waiter;
    }
    Ok(samples)
}

async fn pod_gone_handoffs(client: Client, rounds: usize) -> anyhow::Result<Vec<Duration>> {
    let ns = "bench-podgone";
    namespace(&client, ns).await?;
    let leases: Api<Lease> = Api::namespaced(client.clone(), ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let locks: Api<DistributedLock> = Api::namespaced(client.clone(), ns);
    let mut events = watcher(locks, watcher::Config::default().fields("metadata.name=bench"))
        .applied_objects()
        .boxed();
    let claim_for = |p: &PodIdentity| {
        let name = claim_name("bench");
        (name.clone(), claim_lease(&name, "bench", p, 60))
    };
    let mut holder = pod(&client, ns, "p0").await?;
    let (mut holder_claim, lease) = claim_for(&holder);
    leases.create(&PostParams::default(), &lease).await?;
    let terminated = serde_json::json!({"status": {"containerStatuses": [{
        "name": "app", "image": "leasehold", "imageID": "", "ready": false,
        "restartCount": 0, "state": {"terminated": {"exitCode": 0}},
    }]}});
    let mut samples = Vec::new();
    for i in 1..=rounds {
        let waiter = pod(&client, ns, &format!("p{i}")).await?;
        let (waiter_claim, lease) = claim_for(&waiter);
        leases.create(&PostParams::default(), &lease).await?;
        loop {
            let st = events.next().await.expect("watch")?.status.unwrap_or_default();
            if st.holders.first().is_some_and(|h| h.claim == holder_claim)
                && st.queue.iter().any(|w| w.claim == waiter_claim)
            {
                break;
            }
        }
        // The kubelet stopped the holder's containers and said so; then the object goes.
        pods.patch_status(&holder.name, &PatchParams::default(), &Patch::Merge(&terminated))
            .await?;
        let started = Instant::now();
        pods.delete(&holder.name, &Default::default()).await?;
        loop {
            let st = events.next().await.expect("watch")?.status.unwrap_or_default();
            if st.holders.first().is_some_and(|h| h.claim == waiter_claim) {
                break;
            }
        }
        samples.push(started.elapsed());
        (holder, holder_claim) = (waiter, waiter_claim);
    }
    Ok(samples)
}

async fn end_to_end_handoffs(client: Client, kubeconfig: &PathBuf, rounds: usize) -> anyhow::Result<Vec<Duration>> {
    let ns = "bench-e2e";
    namespace(&client, ns).await?;
    let dir = std::env::temp_dir().join(format!("leasehold-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let log = dir.join("log");
    let mut pods = Vec::new();
    for i in 0..4 {
        pods.push(pod(&client, ns, &format!("w{i}")).await?);
    }
    // Keep three runs alive (one holding, two queued) until `rounds + 1` have run.
    let spawn = |i: usize| {
        let p = &pods[i % pods.len()];
        tokio::process::Command::new(LEASEHOLD)
            .arg("run")
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["--lock", "bench", "--namespace", ns, "--", "sh", "-c"])
            .arg("echo start $LEASEHOLD_FENCING_TOKEN $(date +%s%N) >> $LOG; echo end $LEASEHOLD_FENCING_TOKEN $(date +%s%N) >> $LOG")
            .env("POD_NAME", &p.name)
            .env("POD_NAMESPACE", ns)
            .env("POD_UID", &p.uid)
            .env("LOG", &log)
            .env("RUST_LOG", "error")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
    };
    let mut running = std::collections::VecDeque::new();
    let mut next = 0;
    while next < 3 {
        running.push_back(spawn(next)?);
        next += 1;
    }
    while let Some(mut child) = running.pop_front() {
        let status = child.wait().await?;
        anyhow::ensure!(status.success(), "leasehold run failed: {status}");
        if next <= rounds {
            running.push_back(spawn(next)?);
            next += 1;
        }
    }
    let text = std::fs::read_to_string(&log)?;
    leasehold::check::check_sections(
        &text
            .lines()
            .map(|l| l.rsplit_once(' ').map(|(h, _)| format!("{h} w")).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n"),
        1,
        false,
    )
    .map_err(anyhow::Error::msg)?;
    let times: Vec<(String, u64)> = text
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            Some((w.first()?.to_string(), w.get(2)?.parse().ok()?))
        })
        .collect();
    let samples = times
        .windows(2)
        .filter(|w| w[0].0 == "end" && w[1].0 == "start")
        .map(|w| Duration::from_nanos(w[1].1.saturating_sub(w[0].1)))
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    Ok(samples)
}
