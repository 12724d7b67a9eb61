//! The paths measured inside this process: the controller alone, a deleted pod, the
//! client library, and the floor (one Lease write seen through one watch).

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use leasehold::api::DistributedLock;
use leasehold::client::Lock;
use leasehold::protocol::claim::{PodIdentity, claim_lease, claim_name, release_patch};

use crate::setup::{LOCK, namespace, namespace_on, pod};

/// A watch of the lock's status.
fn lock_events(
    client: &Client,
    ns: &str,
) -> futures::stream::BoxStream<'static, Result<DistributedLock, watcher::Error>> {
    let locks: Api<DistributedLock> = Api::namespaced(client.clone(), ns);
    watcher(
        locks,
        watcher::Config::default().fields(&format!("metadata.name={LOCK}")),
    )
    .applied_objects()
    .boxed()
}

/// Wait until the status shows `holder` holding (and `waiter` queued, if given).
async fn until_status(
    events: &mut futures::stream::BoxStream<'static, Result<DistributedLock, watcher::Error>>,
    holder: &str,
    waiter: Option<&str>,
) -> anyhow::Result<()> {
    loop {
        let st = events.next().await.expect("watch")?.status.unwrap_or_default();
        if st.holders.first().is_some_and(|h| h.claim == holder)
            && waiter.is_none_or(|w| st.queue.iter().any(|q| q.claim == w))
        {
            return Ok(());
        }
    }
}

/// A holder's claim is marked released → the next holder appears in the lock's status.
pub async fn controller(client: Client, rounds: usize) -> anyhow::Result<Vec<Duration>> {
    let ns = "bench-controller";
    namespace(&client, ns, 60).await?;
    let pods = [pod(&client, ns, "a").await?, pod(&client, ns, "b").await?];
    let leases: Api<Lease> = Api::namespaced(client.clone(), ns);
    let mut events = lock_events(&client, ns);
    let new_claim = |i: usize| {
        let name = claim_name(LOCK);
        (name.clone(), claim_lease(&name, LOCK, &pods[i % 2], 60))
    };
    let (mut holder, lease) = new_claim(0);
    leases.create(&PostParams::default(), &lease).await?;
    let mut samples = Vec::new();
    for i in 1..=rounds {
        let (waiter, lease) = new_claim(i);
        leases.create(&PostParams::default(), &lease).await?;
        until_status(&mut events, &holder, Some(&waiter)).await?; // untimed
        let started = Instant::now();
        leases
            .patch(&holder, &PatchParams::default(), &Patch::Merge(release_patch()))
            .await?;
        until_status(&mut events, &waiter, None).await?;
        samples.push(started.elapsed());
        holder = waiter;
    }
    Ok(samples)
}

/// The holder's pod is deleted after the kubelet reported its containers terminated
/// (a graceful deletion) → the next holder appears in the lock's status.
pub async fn pod_gone(client: Client, rounds: usize) -> anyhow::Result<Vec<Duration>> {
    let ns = "bench-podgone";
    namespace(&client, ns, 60).await?;
    let leases: Api<Lease> = Api::namespaced(client.clone(), ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let mut events = lock_events(&client, ns);
    let claim_for = |p: &PodIdentity| {
        let name = claim_name(LOCK);
        (name.clone(), claim_lease(&name, LOCK, p, 60))
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
        until_status(&mut events, &holder_claim, Some(&waiter_claim)).await?;
        // The kubelet stopped the holder's containers and said so; then the object goes.
        pods.patch_status(&holder.name, &PatchParams::default(), &Patch::Merge(&terminated))
            .await?;
        let started = Instant::now();
        pods.delete(&holder.name, &Default::default()).await?;
        until_status(&mut events, &waiter_claim, None).await?;
        samples.push(started.elapsed());
        (holder, holder_claim) = (waiter, waiter_claim);
    }
    Ok(samples)
}

/// How long the library's holders hold (the processes' CMD holds as long).
const HOLD: Duration = Duration::from_millis(50);

/// The client library: `claimants` handles in this process (each with its own two
/// connection pools, as separate processes would have) take turns; a handoff lasts
/// from one holder's `release()` call to the next holder's `acquire()` returning.
pub async fn library(
    kubeconfig: &Path,
    claimants: usize,
    rounds: usize,
    etcd: Option<&str>,
) -> anyhow::Result<Vec<Duration>> {
    let ns = if etcd.is_some() {
        "bench-etcd-library"
    } else {
        "bench-library"
    };
    let admin = leasehold::kubeconfig::client_for(kubeconfig).await?;
    namespace_on(&admin, ns, 60, etcd).await?;
    #[derive(Clone, Copy)]
    enum Mark {
        Granted(Instant),
        Releasing(Instant),
    }
    let log = Arc::new(Mutex::new(Vec::<Mark>::new()));
    let mut tasks = Vec::new();
    for i in 0..claimants {
        let identity = pod(&admin, ns, &format!("l{i}")).await?;
        let lock = Lock::builder(leasehold::kubeconfig::client_for(kubeconfig).await?, ns, LOCK)
            .write_client(leasehold::kubeconfig::client_for(kubeconfig).await?)
            .identity(identity)
            .build()?;
        let log = log.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                let guard = lock.acquire().await?;
                let done = {
                    let mut log = log.lock().expect("log");
                    log.push(Mark::Granted(Instant::now()));
                    log.len() > 2 * rounds
                };
                if done {
                    return Ok::<_, anyhow::Error>(());
                }
                // Hold as the processes' CMD does, so the others are queued by now.
                tokio::time::sleep(HOLD).await;
                log.lock().expect("log").push(Mark::Releasing(Instant::now()));
                guard.release().await?;
            }
        }));
    }
    let (done, _, rest) = futures::future::select_all(tasks).await;
    done??;
    rest.iter().for_each(|t| t.abort());
    let log = log.lock().expect("log");
    Ok(log
        .windows(2)
        .filter_map(|w| match (w[0], w[1]) {
            (Mark::Releasing(r), Mark::Granted(g)) => Some(g.duration_since(r)),
            _ => None,
        })
        .collect())
}

/// The floor of any handoff through the API server: one Lease write (merge patch, on a
/// warm connection, after [`HOLD`] idle) until one watch (on another connection)
/// delivers it.
pub async fn floor(kubeconfig: &Path, rounds: usize) -> anyhow::Result<Vec<Duration>> {
    let ns = "bench-floor";
    let writer = leasehold::kubeconfig::client_for(kubeconfig).await?;
    let reader = leasehold::kubeconfig::client_for(kubeconfig).await?;
    namespace(&writer, ns, 60).await?;
    let leases: Api<Lease> = Api::namespaced(writer.clone(), ns);
    let lease: Lease = serde_json::from_value(serde_json::json!({"metadata": {"name": "floor"}, "spec": {}}))?;
    leases.create(&PostParams::default(), &lease).await?;
    let mut events = watcher(
        Api::<Lease>::namespaced(reader, ns),
        watcher::Config::default().fields("metadata.name=floor"),
    )
    .applied_objects()
    .boxed();
    events.next().await.expect("watch")?; // the initial list
    let mut samples = Vec::new();
    for i in 0..rounds {
        // Spaced as the handoffs are: a write after an idle spell costs more (here
        // about 2.8 ms against 1.5 ms back to back), and every handoff follows one.
        tokio::time::sleep(HOLD).await;
        let patch = serde_json::json!({"spec": {"leaseTransitions": i as i32 + 1}});
        let started = Instant::now();
        let written = leases
            .patch("floor", &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        loop {
            let seen = events.next().await.expect("watch")?;
            if seen.resource_version() == written.resource_version() {
                break;
            }
        }
        samples.push(started.elapsed());
    }
    Ok(samples)
}
