//! `leasehold dev`: a local control plane on loopback, for trying leasehold out and
//! for the integration tests.

use std::time::Instant;

use nix::sys::signal::Signal;

use crate::dev::ControlPlane;

/// Options of `leasehold dev`.
#[derive(clap::Args, Debug)]
pub struct DevArgs {
    /// Stop (and clean up) when the parent process dies; used by test harnesses.
    #[arg(long)]
    pub die_with_parent: bool,
}

/// Start the control plane, install the CRD, print `KUBECONFIG=...` on stdout, and run
/// until SIGINT or SIGTERM; then tear everything down.
pub async fn run(args: DevArgs) -> anyhow::Result<()> {
    if args.die_with_parent {
        nix::sys::prctl::set_pdeathsig(Signal::SIGTERM)?;
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let started = Instant::now();
    let leasehold = crate::guard::self_exe()?;
    let cp = tokio::select! {
        cp = ControlPlane::start(&leasehold) => cp?,
        _ = tokio::signal::ctrl_c() => anyhow::bail!("interrupted while starting"),
        _ = term.recv() => anyhow::bail!("terminated while starting"),
    };
    let client = cp.client().await?;
    crate::crd::install(client).await?;
    eprintln!(
        "leasehold dev: control plane ready in {:.1}s (logs in {}/logs)\n  export KUBECONFIG={}\nPress Ctrl-C to stop.",
        started.elapsed().as_secs_f64(),
        cp.dir().display(),
        cp.kubeconfig().display()
    );
    println!("KUBECONFIG={}", cp.kubeconfig().display());
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    eprintln!("leasehold dev: stopping");
    cp.stop().await;
    Ok(())
}
