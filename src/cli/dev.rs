//! `leasehold dev`: a local control plane on loopback, for trying leasehold out and
//! for the integration tests.

use std::time::Instant;

use nix::sys::signal::Signal;

use crate::dev::{ControlPlane, Layout};

/// Options of `leasehold dev`.
#[derive(clap::Args, Debug)]
pub struct DevArgs {
    /// Stop (and clean up) when the parent process dies; used by test harnesses.
    #[arg(long)]
    pub die_with_parent: bool,
    /// Run the demo (three clients taking turns on one lock), then stop.
    #[arg(long, conflicts_with = "controller")]
    pub demo: bool,
    /// Also run the controller, until Ctrl-C.
    #[arg(long)]
    pub controller: bool,
    /// The kube-controller-manager controllers to run (comma-separated).
    #[arg(long, default_value = crate::dev::DEFAULT_CONTROLLERS)]
    pub kcm_controllers: String,
    /// The address kube-apiserver listens on and advertises (the kubeconfig's server):
    /// loopback, or an address nodes in other network namespaces reach.
    #[arg(long, default_value = "127.0.0.1")]
    pub address: std::net::IpAddr,
    /// Give each node that registers a /24 of this pod network (kube-controller-manager's
    /// nodeipam controller), e.g. 10.244.0.0/16.
    #[arg(long, value_name = "CIDR")]
    pub cluster_cidr: Option<String>,
}

/// Start the control plane, install the CRD, print `KUBECONFIG=...` on stdout, and run
/// until SIGINT or SIGTERM; then tear everything down.
pub async fn run(args: DevArgs) -> anyhow::Result<()> {
    if args.die_with_parent {
        nix::sys::prctl::set_pdeathsig(Signal::SIGTERM)?;
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let started = Instant::now();
    eprintln!(
        "leasehold dev: starting etcd, kube-apiserver (on {}) and kube-controller-manager...",
        args.address
    );
    let leasehold = crate::supervise::self_exe()?;
    let layout = Layout {
        controllers: args.kcm_controllers.clone(),
        address: args.address,
        cluster_cidr: args.cluster_cidr.clone(),
    };
    let cp = tokio::select! {
        cp = ControlPlane::start_with(&leasehold, layout) => cp?,
        _ = tokio::signal::ctrl_c() => anyhow::bail!("interrupted while starting"),
        _ = term.recv() => anyhow::bail!("terminated while starting"),
    };
    let client = cp.client().await?;
    crate::crd::install(client.clone()).await?;
    if args.demo {
        let result = crate::dev::demo::run(client, cp.kubeconfig()).await;
        cp.stop().await;
        return result;
    }
    let controller = args.controller.then(|| {
        let opts = crate::controller::Options {
            http_addr: Some(([127, 0, 0, 1], 8080).into()),
            release_url: Some(crate::controller::release_url("127.0.0.1", 8080)),
            ..crate::controller::Options::single("leasehold-dev", None)
        };
        tokio::spawn(crate::controller::run(client, opts, std::future::pending()))
    });
    eprintln!(
        "leasehold dev: control plane ready in {:.1}s (logs in {}/logs)\n  export KUBECONFIG={}\n{}Press Ctrl-C to stop.",
        started.elapsed().as_secs_f64(),
        cp.dir().display(),
        cp.kubeconfig().display(),
        if args.controller {
            "The controller runs too (metrics on http://127.0.0.1:8080/metrics).\n"
        } else {
            ""
        }
    );
    println!("KUBECONFIG={}", cp.kubeconfig().display());
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    eprintln!("leasehold dev: stopping");
    if let Some(c) = controller {
        c.abort();
    }
    cp.stop().await;
    Ok(())
}
