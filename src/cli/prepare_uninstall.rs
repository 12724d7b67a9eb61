//! `leasehold prepare-uninstall`: what makes an uninstall end without a hang (the
//! chart's pre-delete hook runs it). Granted locks carry the fence finalizer
//! ([`crate::controller::finalizer::LOCK_FINALIZER`]), which only a running controller
//! takes off; once it is uninstalled, deleting such a lock, or a namespace holding one,
//! would hang. So, in order:
//! 1. locks already being deleted are given `--drain-timeout` for the running
//!    controller to let them go as it does (once their holders have stopped); those
//!    still there after it lose their fence with the rest (a warning names them);
//! 2. the controller's Deployment is scaled to 0 and its pods awaited (a running
//!    replica would put the finalizer back at its next turn);
//! 3. the finalizer is taken off every lock. What still holds keeps its claim; with no
//!    controller, nothing is granted or revoked any more.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use tokio::time::{Instant, sleep};

use super::ClusterArgs;
use crate::api::DistributedLock;
use crate::controller::finalizer::{has_finalizer, strip};

/// How often the waits look again.
const POLL: Duration = Duration::from_secs(1);

/// Options of `leasehold prepare-uninstall`.
#[derive(clap::Args, Debug)]
pub struct PrepareUninstallArgs {
    /// The controller's Deployment, scaled to 0 before the finalizers are taken off.
    /// Without it the controller must already be stopped (it would put them back).
    #[arg(long)]
    pub deployment: Option<String>,
    /// The Deployment's namespace; default: the kubeconfig's (in a pod: its own).
    #[arg(long, short = 'n')]
    pub namespace: Option<String>,
    /// Only the locks of this namespace (the controller's `--namespace`); default: all.
    #[arg(long)]
    pub watch_namespace: Option<String>,
    /// How long locks already being deleted get to be let go by the running controller.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "60s")]
    pub drain_timeout: Duration,
    /// How long the controller's pods get to stop.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "120s")]
    pub timeout: Duration,
    /// Which cluster.
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

/// Drain, stop the controller, take the finalizers off (see the module docs).
pub async fn run(args: PrepareUninstallArgs) -> anyhow::Result<()> {
    let client = args.cluster.client().await?;
    let locks: Api<DistributedLock> = match &args.watch_namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let ns = args
        .namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_string());
    // No replica running (a retry after the scale-down): nothing would let them go.
    let running = match &args.deployment {
        Some(name) => controller_pods(&client, &ns, name).await?.is_some_and(|n| n > 0),
        None => false,
    };
    let drain = if running { args.drain_timeout } else { Duration::ZERO };
    let deadline = Instant::now() + drain;
    let closing = loop {
        let closing = closing(&locks).await?;
        if closing.is_empty() || Instant::now() >= deadline {
            break closing;
        }
        sleep(POLL).await;
    };
    if !closing.is_empty() {
        tracing::warn!(
            locks = closing.join(", "),
            "deleted locks still fenced after {drain:?}: their revoked holders may still run, and a lock \
             re-created under one of these names may grant beside them (their fencing tokens stay apart)"
        );
    }
    match &args.deployment {
        Some(name) => stop_controller(&client, &ns, name, args.timeout).await?,
        None => println!("no --deployment: taking it that the controller is stopped"),
    }
    let mut stripped = Vec::new();
    for lock in locks.list(&ListParams::default()).await?.items {
        let ns = lock.namespace().unwrap_or_default();
        if strip(&Api::namespaced(client.clone(), &ns), &lock).await? {
            stripped.push(format!("{ns}/{}", lock.name_any()));
        }
    }
    println!(
        "took the fence finalizer off {} lock(s): {}",
        stripped.len(),
        stripped.join(", ")
    );
    Ok(())
}

/// The locks being deleted that still carry the finalizer, as `ns/name`.
async fn closing(locks: &Api<DistributedLock>) -> anyhow::Result<Vec<String>> {
    let all = locks.list(&ListParams::default()).await?.items;
    let closing = all
        .iter()
        .filter(|l| has_finalizer(l) && l.metadata.deletion_timestamp.is_some());
    Ok(closing
        .map(|l| format!("{}/{}", l.namespace().unwrap_or_default(), l.name_any()))
        .collect())
}

/// How many pods of Deployment `ns/name` may still run (not Succeeded or Failed: an
/// evicted pod stays Failed for good); `None` when there is no such Deployment.
async fn controller_pods(client: &kube::Client, ns: &str, name: &str) -> anyhow::Result<Option<usize>> {
    let Some(d) = Api::<Deployment>::namespaced(client.clone(), ns).get_opt(name).await? else {
        return Ok(None);
    };
    let labels = d.spec.and_then(|s| s.selector.match_labels).unwrap_or_default();
    anyhow::ensure!(
        !labels.is_empty(),
        "deployment {ns}/{name} selects its pods by no label: not guessing which pods are the controller's"
    );
    let selector: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let list = ListParams::default().labels(&selector.join(","));
    let pods = Api::<Pod>::namespaced(client.clone(), ns).list(&list).await?.items;
    let ended = |p: &&Pod| {
        let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
        matches!(phase, Some("Succeeded" | "Failed"))
    };
    Ok(Some(pods.iter().filter(|p| !ended(p)).count()))
}

/// Scale Deployment `name` to 0 and wait until none of its pods may still run.
async fn stop_controller(client: &kube::Client, ns: &str, name: &str, timeout: Duration) -> anyhow::Result<()> {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    if deployments.get_opt(name).await?.is_none() {
        println!("deployment {ns}/{name} is not there: nothing to stop");
        return Ok(());
    }
    let zero = serde_json::json!({"spec": {"replicas": 0}});
    deployments
        .patch(name, &PatchParams::default(), &Patch::Merge(&zero))
        .await?;
    let deadline = Instant::now() + timeout;
    loop {
        let left = controller_pods(client, ns, name).await?.unwrap_or(0);
        if left == 0 {
            println!("scaled deployment {ns}/{name} to 0; none of its pods runs");
            return Ok(());
        }
        if Instant::now() >= deadline {
            anyhow::bail!(
                "{left} pod(s) of deployment {ns}/{name} still running after {timeout:?}: not taking \
                 the finalizers off while a controller may put them back (it stays scaled to 0: \
                 retry, or scale it back up to keep the release)"
            );
        }
        sleep(POLL).await;
    }
}
