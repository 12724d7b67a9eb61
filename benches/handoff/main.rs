//! Handoff latency on the local control plane, printed as figures (a benchmark, not a
//! test), every path in one run on one etcd so the ratios hold on a noisy machine:
//!
//! * `run`: `leasehold run` end to end — one CMD exits → the next queued CMD starts,
//!   with `--contenders` runs queued (each CMD a 50 ms section in `sh -c`);
//! * `etcdctl`: the same with `etcdctl lock` on the control plane's own etcd (the anchor);
//! * `etcd-run`: `leasehold run` as in `run`, on a lock whose claims live in that same
//!   etcd (`spec.backend.etcd`);
//! * `library`: the client library in-process — `release()` called → the next
//!   `acquire()` returns; `etcd-library` the same on the etcd-backed lock;
//! * `controller`: a claim marked released → the next holder in the lock's status;
//! * `start`, `etcdctl-start`: a free lock, taken by a process just started (one at a
//!   time, 50 rounds at most): its start → its CMD's first line;
//! * `floor`: one Lease write on a warm connection → one watch delivers it;
//! * `pod-gone`: the holder's pod deleted after its containers stopped → next holder;
//! * `sigkill`: the holder's `leasehold run` SIGKILLed → the next CMD starts (the claim
//!   expires: lease 2 s).
//!
//! It also prints the API writes per grant (the API server's own counters, claim
//! creation left out) of the `run` path and of the `controller` path, and the API
//! server's part of the `etcd-run` path (the lock's status mirror, each run's start).
//!
//! ```sh
//! cargo bench --features cli --bench handoff                       # release build, 200 rounds
//! cargo test --features cli --bench handoff -- --bench --rounds 40 # quicker, debug build
//! python3 scripts/plot-handoff.py                   # docs/handoff.png from the CSV
//! ```
//! Options: `--rounds N`, `--contenders N` (default 20), `--only a,b` (series keys),
//! `--csv PATH` (default `$CARGO_TARGET_DIR/handoff.csv`), `--no-notices` (the
//! controller publishes no release URL: holders release through their claims alone,
//! as before release notices), `--unanswered-notices` (the published URL's connections
//! never complete, as when a NetworkPolicy drops the clients' packets to it),
//! `--keep-logs DIR` (keep the section logs of the process paths, for
//! `scripts/handoff-cpu.py`: where the CPU goes during each handoff), `--section-ms N`
//! (how long each CMD of the process paths holds; default 50).

mod inproc;
mod procs;
mod setup;
mod stats;

use std::path::{Path, PathBuf};
use std::time::Duration;

use stats::Series;

const LEASEHOLD: &str = env!("CARGO_BIN_EXE_leasehold");

struct Args {
    rounds: usize,
    contenders: usize,
    only: Option<Vec<String>>,
    csv: PathBuf,
    notices: bool,
    /// The published release URL's connections never complete (a NetworkPolicy that
    /// drops the clients' packets to the controller).
    unanswered: bool,
    /// Keep the section logs of the process paths here (`--keep-logs DIR`).
    keep_logs: Option<PathBuf>,
    /// How long each CMD of the process paths holds, in ms (`--section-ms N`).
    section_ms: u32,
}

fn args() -> Option<Args> {
    let argv = stats::bench_args()?;
    let value = |f: &str| stats::flag(&argv, f);
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| PathBuf::from("target"), PathBuf::from);
    Some(Args {
        rounds: value("--rounds").and_then(|v| v.parse().ok()).unwrap_or(200),
        contenders: value("--contenders").and_then(|v| v.parse().ok()).unwrap_or(20),
        only: value("--only").map(|v| v.split(',').map(String::from).collect()),
        csv: value("--csv").map_or_else(|| target.join("handoff.csv"), PathBuf::from),
        notices: !argv.iter().any(|a| a == "--no-notices"),
        unanswered: argv.iter().any(|a| a == "--unanswered-notices"),
        keep_logs: value("--keep-logs").map(PathBuf::from),
        section_ms: value("--section-ms").and_then(|v| v.parse().ok()).unwrap_or(50),
    })
}

fn main() -> anyhow::Result<()> {
    let Some(args) = args() else {
        println!("handoff: SKIPPED — a benchmark, not a test; run `cargo bench --features cli --bench handoff`");
        return Ok(());
    };
    if let Some(dir) = &args.keep_logs {
        procs::keep_logs(dir.clone())?;
    }
    procs::section_ms(args.section_ms);
    let kubeconfig = leasehold::testing::spawn_for_process(Path::new(LEASEHOLD), Duration::from_secs(600))?;
    let etcd = leasehold::dev::etcd_endpoint(&kubeconfig)?;
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(measure(&args, &kubeconfig, &etcd))
}

async fn measure(args: &Args, kubeconfig: &Path, etcd: &str) -> anyhow::Result<()> {
    let want = |key: &str| args.only.as_ref().is_none_or(|o| o.iter().any(|k| k == key));
    let client = leasehold::kubeconfig::client_for(kubeconfig).await?;
    // The controller serves release notices on loopback, as a deployed one does on its
    // pod IP (`--advertise-address`).
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let hole = leasehold::testing::proxy::Unanswered::start().await?;
    let published = if args.unanswered { hole.port } else { port };
    let opts = leasehold::controller::Options {
        http_addr: Some(([127, 0, 0, 1], port).into()),
        release_url: args
            .notices
            .then(|| leasehold::controller::release_url("127.0.0.1", published)),
        ..leasehold::controller::Options::single("bench", None)
    };
    println!(
        "release notices: {}",
        match (args.notices, args.unanswered) {
            (false, _) => "off (--no-notices)",
            (true, false) => "on",
            (true, true) => "on, to a URL whose connections never complete (--unanswered-notices)",
        }
    );
    let controller = tokio::spawn(leasehold::controller::run(client.clone(), opts, std::future::pending()));
    let leasehold = Path::new(LEASEHOLD);
    let (n, k) = (args.rounds, args.contenders);
    let mut all = Vec::new();
    // The two processes-level paths first and back to back, so they share conditions.
    let mut run_writes = None;
    if want("run") {
        let before = stats::api_requests(&client).await?;
        let s = procs::leasehold_run(leasehold, &client, kubeconfig, k, n, None).await?;
        // Let the last grants' follow-up writes (deletions, sweeps, events) land.
        tokio::time::sleep(Duration::from_secs(2)).await;
        run_writes = Some((before, stats::api_requests(&client).await?, n + 1));
        all.push(Series::new("run", "leasehold run: CMD exits -> next CMD starts", s));
    }
    let mut etcd_run_requests = None;
    if want("etcd-run") {
        let before = stats::api_requests(&client).await?;
        let s = procs::leasehold_run(leasehold, &client, kubeconfig, k, n, Some(etcd)).await?;
        // The API server's share of an etcd-backed lock's work: the lock's status (the
        // controller's mirror of the claims) and each run's start.
        tokio::time::sleep(Duration::from_secs(2)).await;
        etcd_run_requests = Some((before, stats::api_requests(&client).await?, n + 1));
        all.push(Series::new(
            "etcd-run",
            "leasehold run, etcd backend (same etcd): CMD exits -> next CMD starts",
            s,
        ));
    }
    if want("etcdctl") {
        let s = procs::etcdctl_lock(etcd, k, n).await?;
        all.push(Series::new(
            "etcdctl",
            "etcdctl lock (same etcd): CMD exits -> next CMD starts",
            s,
        ));
    }
    if want("start") {
        let s = procs::uncontended(leasehold, &client, kubeconfig, n.min(50), None).await?;
        all.push(Series::new(
            "start",
            "leasehold run, lock free: process start -> CMD starts",
            s,
        ));
    }
    if want("etcdctl-start") {
        let s = procs::uncontended(leasehold, &client, kubeconfig, n.min(50), Some(etcd)).await?;
        all.push(Series::new(
            "etcdctl-start",
            "etcdctl lock, lock free: process start -> CMD starts",
            s,
        ));
    }
    if want("library") {
        let s = inproc::library(kubeconfig, 3, n, None).await?;
        all.push(Series::new(
            "library",
            "client library: release() -> next acquire() returns",
            s,
        ));
    }
    if want("etcd-library") {
        let s = inproc::library(kubeconfig, 3, n, Some(etcd)).await?;
        all.push(Series::new(
            "etcd-library",
            "client library, etcd backend: release() -> next acquire() returns",
            s,
        ));
    }
    let mut writes = None;
    if want("controller") {
        let before = stats::api_requests(&client).await?;
        let s = inproc::controller(client.clone(), n).await?;
        // Let the grant's follow-up writes (stamp, deletion, events) land.
        tokio::time::sleep(Duration::from_secs(2)).await;
        writes = Some((before, stats::api_requests(&client).await?));
        all.push(Series::new(
            "controller",
            "release mark written -> next holder in status",
            s,
        ));
    }
    if want("floor") {
        let s = inproc::floor(kubeconfig, n).await?;
        all.push(Series::new("floor", "one Lease write -> one watch delivers it", s));
    }
    if want("pod-gone") {
        let s = inproc::pod_gone(client.clone(), n.min(60)).await?;
        all.push(Series::new(
            "pod-gone",
            "stopped holder's pod deleted -> next holder in status",
            s,
        ));
    }
    if want("sigkill") {
        let s = procs::sigkill(leasehold, &client, kubeconfig, 2, n.clamp(1, 5)).await?;
        all.push(Series::new(
            "sigkill",
            "holder's leasehold run SIGKILLed (lease 2 s) -> next CMD",
            s,
        ));
    }
    controller.abort();
    let _ = controller.await;
    println!();
    all.iter().for_each(Series::print);
    stats::print_ratios(&all, "etcdctl");
    println!();
    if let Some((before, after, grants)) = run_writes {
        let path = if args.notices {
            "leasehold run path (release notices)"
        } else {
            "leasehold run path (release marks)"
        };
        stats::print_writes_per_grant(path, &before, &after, grants);
    }
    if let Some((before, after, grants)) = etcd_run_requests {
        stats::print_writes_per_grant(
            "leasehold run path, etcd backend (the API server's part)",
            &before,
            &after,
            grants,
        );
    }
    if let Some((before, after)) = writes {
        stats::print_writes_per_grant("controller path (release marks)", &before, &after, n);
    }
    stats::write_csv(&all, &args.csv)?;
    println!("\nsamples: {}", args.csv.display());
    Ok(())
}
