//! `leasehold prepare-uninstall`: what makes an uninstall end without a hang (the
//! chart's pre-delete hook runs it). Granted locks carry the fence finalizer
//! ([`crate::controller::finalizer::LOCK_FINALIZER`]), which only a running controller
//! takes off; once it is uninstalled, deleting such a lock, or a namespace holding one,
//! would hang. So, in order:
//! 1. locks already being deleted are given `--drain-timeout` for the running
//!    controller to let them go as it does (once their holders have stopped);
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
    let deadline = Instant::now() + args.drain_timeout;
    let closing = loop {
        let closing = closing(&locks).await?;
        if closing.is_empty() || Instant::now() >= deadline {
            break closing;
        }
        sleep(POLL).await;
    };
    if !closing.is_empty() {
        println!(
            "still fenced after {:?} (their holders may run): {}",
            args.drain_timeout,
            closing.join(", ")
        );
    }
    match &args.deployment {
        Some(name) => {
            let ns = args.namespace.unwrap_or_else(|| client.default_namespace().to_string());
            stop_controller(client.clone(), &ns, name, args.timeout).await?;
        }
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

/// Scale Deployment `name` to 0 and wait until none of its pods is left.
async fn stop_controller(client: kube::Client, ns: &str, name: &str, timeout: Duration) -> anyhow::Result<()> {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let Some(d) = deployments.get_opt(name).await? else {
        println!("deployment {ns}/{name} is not there: nothing to stop");
        return Ok(());
    };
    let zero = serde_json::json!({"spec": {"replicas": 0}});
    deployments
        .patch(name, &PatchParams::default(), &Patch::Merge(&zero))
        .await?;
    let labels = d.spec.and_then(|s| s.selector.match_labels).unwrap_or_default();
    let selector: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let pods: Api<Pod> = Api::namespaced(client, ns);
    let list = ListParams::default().labels(&selector.join(","));
    let deadline = Instant::now() + timeout;
    loop {
        let left = pods.list(&list).await?.items.len();
        if left == 0 {
            println!("scaled deployment {ns}/{name} to 0; its pods are gone");
            return Ok(());
        }
        if Instant::now() >= deadline {
            anyhow::bail!(
                "{left} pod(s) of deployment {ns}/{name} still there after {timeout:?}: not taking the \
                 finalizers off while a controller may put them back (retry, or stop it and run \
                 `leasehold prepare-uninstall` without --deployment)"
            );
        }
        sleep(POLL).await;
    }
}
