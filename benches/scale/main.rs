//! Scale: L locks × C claimants on the local control plane, with unrelated pods in the
//! cluster, printed as figures (a benchmark, not a test).
//!
//! For each L: the claims are written ahead of time (claim creation is not counted),
//! each with its release and wait hashes as a client writes it, then a fresh `leasehold
//! controller` process (this build) is started and every grant is released (with the
//! claim's secret) as soon as it is seen — flat out, then at an offered release rate. It
//! prints grants/s, release → next grant p50/p90/p99, the controller's peak RSS and CPU
//! seconds, API writes per grant by verb and resource and every request per grant by
//! verb (reads and watches too) from the API server's own `/metrics`, the lock statuses
//! written per grant and their bytes (as the driver's watch saw them), and the share of
//! the API server's Lease write ceiling the run's writes took; and, first, what the
//! unrelated pods cost the controller's memory. Then
//! the etcd backend's rows (`--etcd-locks`): in-process clients on the control plane's
//! etcd, each acquiring once and releasing at once; the controller only mirrors.
//!
//! ```sh
//! cargo bench --features cli --bench scale                                   # (10, 100, 1000) × 10, 2000 pods; etcd (10, 100) × 10
//! cargo bench --features cli --bench scale -- --locks 10,100 --pods 500 --rate 50 --ceiling-secs 0
//! cargo bench --features cli --bench scale -- --locks "" --etcd-locks "" --waiters 200 --waiting-secs 120
//! ```
//!
//! First of all, the ceiling (`--ceiling-secs`, default 10; 0 skips it): `wrk` (Debian's
//! package: `apt-get install wrk`) sends merge PATCHes to 64 Leases on 32 connections;
//! the paced phase offers a sixth of it unless `--rate` says otherwise ([`ceiling`]).
//! Then (`--waiters`, default 200): what a *waiting* claimant costs. That many library
//! clients queue on one lock (15 s lease) whose holder keeps it; the API server's
//! counters give every request made while they wait (`--waiting-secs`), writes and
//! reads apart.

#[path = "../handoff/stats.rs"]
#[allow(dead_code)]
mod stats;

mod ceiling;
mod cpu;

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use kube::Client;
use leasehold::testing::scale::{self, Outcome};
use stats::Series;

const LEASEHOLD: &str = env!("CARGO_BIN_EXE_leasehold");
/// How long one run may take before it counts as stuck.
const RUN_DEADLINE: Duration = Duration::from_secs(1800);

struct Args {
    locks: Vec<usize>,
    claimants: usize,
    pods: usize,
    /// Releases/s offered in the paced phase; `None`: a sixth of the measured ceiling.
    rate: Option<f64>,
    /// How long the API server's Lease write ceiling is measured (0: not measured).
    ceiling: Duration,
    /// Lock counts for the etcd backend's rows (on the control plane's etcd).
    etcd_locks: Vec<usize>,
    /// Library clients waiting on one held lock, for what a waiter costs (0: skip).
    waiters: usize,
    /// How long the waiters' writes are counted.
    waiting: Duration,
}

fn args() -> Option<Args> {
    let argv = stats::bench_args()?;
    let value = |f: &str| stats::flag(&argv, f);
    let locks = value("--locks").unwrap_or_else(|| "10,100,1000".into());
    Some(Args {
        locks: locks.split(',').filter_map(|v| v.parse().ok()).collect(),
        claimants: value("--claimants").and_then(|v| v.parse().ok()).unwrap_or(10),
        pods: value("--pods").and_then(|v| v.parse().ok()).unwrap_or(2000),
        rate: value("--rate").and_then(|v| v.parse().ok()),
        ceiling: Duration::from_secs(value("--ceiling-secs").and_then(|v| v.parse().ok()).unwrap_or(10)),
        etcd_locks: value("--etcd-locks")
            .unwrap_or_else(|| "10,100".into())
            .split(',')
            .filter_map(|v| v.parse().ok())
            .collect(),
        waiters: value("--waiters").and_then(|v| v.parse().ok()).unwrap_or(200),
        waiting: Duration::from_secs(value("--waiting-secs").and_then(|v| v.parse().ok()).unwrap_or(120)),
    })
}

fn main() -> anyhow::Result<()> {
    let Some(args) = args() else {
        println!("scale: SKIPPED — a benchmark, not a test; run `cargo bench --features cli --bench scale`");
        return Ok(());
    };
    let kubeconfig = leasehold::testing::spawn_for_process(Path::new(LEASEHOLD), Duration::from_secs(3600))?;
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(measure(&args, &kubeconfig))
}

/// A `leasehold controller` process watching every namespace.
struct Controller(tokio::process::Child);

impl Controller {
    fn start(kubeconfig: &Path) -> anyhow::Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let child = tokio::process::Command::new(LEASEHOLD)
            .args([
                "controller",
                "--identity",
                "scale",
                "--http-addr",
                &format!("127.0.0.1:{port}"),
            ])
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()?;
        Ok(Controller(child))
    }

    fn pid(&self) -> u32 {
        self.0.id().unwrap_or(0)
    }

    /// Peak and current resident set, in KiB (`VmHWM`, `VmRSS`).
    fn rss_kib(&self) -> (u64, u64) {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap_or_default();
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
                .unwrap_or(0)
        };
        (field("VmHWM:"), field("VmRSS:"))
    }

    /// CPU seconds used (user + system).
    fn cpu_seconds(&self) -> f64 {
        cpu::seconds(self.pid())
    }
}

async fn measure(args: &Args, kubeconfig: &Path) -> anyhow::Result<()> {
    let client = leasehold::kubeconfig::client_for(kubeconfig).await?;
    cpu::init(kubeconfig);
    // What unrelated pods cost: the controller's RSS before and after they appear.
    let bystanders = Controller::start(kubeconfig)?;
    tokio::time::sleep(Duration::from_secs(3)).await; // settle: caches synced, allocator warm
    let (_, before) = bystanders.rss_kib();
    scale::namespace(&client, "scale-bystanders").await?;
    scale::pods(&client, "scale-bystanders", "p", args.pods).await?;
    tokio::time::sleep(Duration::from_secs(3)).await; // the pod watch has them
    let (_, after) = bystanders.rss_kib();
    drop(bystanders);
    println!(
        "unrelated pods: {} → controller RSS {:.1} → {:.1} MiB: {:.2} KiB per pod",
        args.pods,
        before as f64 / 1024.0,
        after as f64 / 1024.0,
        (after as f64 - before as f64) / args.pods.max(1) as f64
    );
    println!();
    let ceiling = if args.ceiling.is_zero() {
        None
    } else {
        let c = ceiling::measure(&client, kubeconfig, "scale-ceiling", args.ceiling).await?;
        println!(
            "API server Lease write ceiling: {:.0} writes/s (wrk, {} connections, merge PATCHes on 64 Leases, {} s; \
             latency p50 {} p99 {}; {} failed)",
            c.writes_per_sec,
            ceiling::CONNECTIONS,
            args.ceiling.as_secs(),
            c.latency.0,
            c.latency.1,
            c.failed
        );
        println!();
        Some(c.writes_per_sec)
    };
    let rate = args.rate.or(ceiling.map(|c| c / 6.0)).unwrap_or(100.0);
    if args.waiters > 0 {
        idle_waiters(&client, kubeconfig, args.waiters, args.waiting).await?;
    }
    for &locks in &args.locks {
        for rate in [None, Some(rate)] {
            let ns = match rate {
                None => format!("scale-{locks}x{}-flat", args.claimants),
                Some(r) => format!("scale-{locks}x{}-rate{}", args.claimants, r as u64),
            };
            run(&client, kubeconfig, &ns, (locks, args.claimants), rate, ceiling).await?;
        }
    }
    let etcd = leasehold::dev::etcd_endpoint(kubeconfig)?;
    for &locks in &args.etcd_locks {
        run_etcd(&client, kubeconfig, &etcd, locks, args.claimants).await?;
    }
    Ok(())
}

/// What waiting costs: `n` library clients (each its own pod) queue on one lock whose
/// holder keeps it; print the API writes made during `window`, per waiter and minute,
/// beside what the holder's renewals alone account for.
async fn idle_waiters(client: &Client, kubeconfig: &Path, n: usize, window: Duration) -> anyhow::Result<()> {
    use kube::api::{Api, PostParams};
    use leasehold::api::{DistributedLock, DistributedLockSpec};
    let ns = format!("scale-waiters-{n}");
    scale::namespace(client, &ns).await?;
    let pods = scale::pods(client, &ns, "w", n + 1).await?;
    let controller = Controller::start(kubeconfig)?;
    let locks: Api<DistributedLock> = Api::namespaced(client.clone(), &ns);
    let lease = 15;
    let spec = DistributedLockSpec {
        lease_duration_seconds: lease,
        max_holders: 1,
        backend: None,
        max_queue: None,
    };
    locks
        .create(&PostParams::default(), &DistributedLock::new("idle", spec))
        .await?;
    // As `leasehold run` builds them: reads and watches over HTTP/2 with PINGs.
    let reads = leasehold::kubeconfig::watch_client_for(kubeconfig).await?;
    let handle = |pod: &leasehold::protocol::PodIdentity| {
        leasehold::client::Lock::builder(reads.clone(), &ns, "idle")
            .write_client(client.clone())
            .identity(pod.clone())
            .build()
    };
    let holder = handle(&pods[0])?;
    let guard = holder.acquire().await?;
    let mut waiting = Vec::new();
    for pod in &pods[1..] {
        let lock = handle(pod)?;
        waiting.push(tokio::spawn(
            async move { lock.acquire().await.map(|g| g.fencing_token()) },
        ));
    }
    let queued = std::time::Instant::now();
    loop {
        let l = locks.get("idle").await?;
        if l.status.as_ref().is_some_and(|s| s.queue.len() == n) {
            break;
        }
        anyhow::ensure!(
            queued.elapsed() < Duration::from_secs(300),
            "{n} waiters not queued in 300 s"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let before = stats::api_requests(client).await?;
    tokio::time::sleep(window).await;
    let after = stats::api_requests(client).await?;
    let delta = |verb: &str, resource: &str| {
        let key = (verb.to_string(), resource.to_string());
        after.get(&key).copied().unwrap_or(0.0) - before.get(&key).copied().unwrap_or(0.0)
    };
    let patches = delta("PATCH", "leases");
    let on_lock_objects = |write: bool| {
        after
            .iter()
            .filter(|(k, _)| ["leases", "distributedlocks", "events"].contains(&k.1.as_str()))
            .filter(|(k, _)| stats::WRITE_VERBS.contains(&k.0.as_str()) == write)
            .map(|(k, v)| (k, v - before.get(k).copied().unwrap_or(0.0)))
            .filter(|(_, d)| *d > 0.0)
            .collect::<Vec<_>>()
    };
    let others: f64 = on_lock_objects(true).iter().map(|(_, d)| d).sum::<f64>() - patches;
    let reads = on_lock_objects(false);
    let read_total: f64 = reads.iter().map(|(_, d)| d).sum();
    let read_parts: Vec<String> = reads.iter().map(|(k, d)| format!("{} {} {d:.0}", k.0, k.1)).collect();
    let minutes = window.as_secs_f64() / 60.0;
    let holder_renewals = window.as_secs_f64() / (lease as f64 / 3.0);
    let writes_per_minute = ((patches - holder_renewals).max(0.0) + others) / n as f64 / minutes;
    println!(
        "waiting claimants: {n} waiting {:.0} s on one held lock (lease {lease} s): {patches:.0} claim PATCHes \
         (the holder's renewals ≈ {holder_renewals:.0}), {others:.0} other lock/claim/event writes: \
         {:.2} writes per waiter per minute; controller peak RSS {:.1} MiB",
        window.as_secs_f64(),
        writes_per_minute,
        controller.rss_kib().0 as f64 / 1024.0,
    );
    println!(
        "waiting claimants: reads in the same {:.0} s [{}]: {:.2} reads per waiter per minute; \
         every request: {:.2} per waiter per minute",
        window.as_secs_f64(),
        read_parts.join(", "),
        read_total / n as f64 / minutes,
        writes_per_minute + read_total / n as f64 / minutes,
    );
    for task in &waiting {
        task.abort(); // dropped while waiting: each withdraws its claim
    }
    guard.release().await?;
    scale::remove_locks(client, &ns).await?;
    drop(controller);
    println!();
    Ok(())
}

/// The etcd backend's row: in-process clients on the control plane's etcd; the
/// controller only mirrors (its writes are status writes).
async fn run_etcd(
    client: &Client,
    kubeconfig: &Path,
    etcd: &str,
    locks: usize,
    claimants: usize,
) -> anyhow::Result<()> {
    let ns = format!("scale-etcd-{locks}x{claimants}");
    let before = (stats::api_requests(client).await?, cpu::now());
    let controller = Controller::start(kubeconfig)?;
    let out = scale::drive_etcd(client, &ns, etcd, locks, claimants, RUN_DEADLINE).await?;
    tokio::time::sleep(Duration::from_secs(2)).await; // the mirror's last status writes
    let what = format!("{locks:>5} locks × {claimants} (etcd backend, flat out)");
    report(client, &controller, &before, &out, (&what, None)).await?;
    // The run's locks go while its controller runs (it lets them go: the finalizer),
    // so the next run's controller holds only its own.
    scale::remove_locks(client, &ns).await?;
    drop(controller);
    Ok(())
}

/// Stop the run's controller and print its row: `before` is the API server's request
/// counters and the control plane's CPU from before the run; with the API server's Lease write `ceiling`, the share
/// of it the run's writes took.
async fn report(
    client: &Client,
    controller: &Controller,
    (before, cpu_before): &(stats::Counters, cpu::Sample),
    out: &Outcome,
    (what, ceiling): (&str, Option<f64>),
) -> anyhow::Result<()> {
    let (peak_kib, _) = controller.rss_kib();
    let cpu = controller.cpu_seconds();
    let cpu_after = cpu::now();
    let after = stats::api_requests(client).await?;
    let (writes, parts) = stats::writes_per_grant(before, &after, out.grants);
    let (requests, by_verb) = stats::requests_per_grant(before, &after, out.grants);
    let grants_per_sec = out.grants as f64 / out.elapsed.as_secs_f64();
    let handoffs = Series::new("handoff", "", out.handoffs.clone());
    if let Some(w) = out.warmup {
        println!(
            "{what}: start-up (every lock's first grant, releases held) {:.2} s",
            w.as_secs_f64()
        );
    }
    println!(
        "{what}: {} grants, {:.1} grants/s, release→grant p50 {:.1} ms p90 {:.1} ms p99 {:.1} ms, \
         controller peak RSS {:.1} MiB, CPU {:.1} s ({:.2} ms/grant), {writes:.2} API writes/grant [{parts}], \
         {requests:.2} API requests/grant by verb [{by_verb}], {} violations{}",
        out.grants,
        grants_per_sec,
        handoffs.quantile(0.5),
        handoffs.quantile(0.9),
        handoffs.quantile(0.99),
        peak_kib as f64 / 1024.0,
        cpu,
        cpu * 1000.0 / out.grants.max(1) as f64,
        out.violations.len(),
        if out.violations.is_empty() {
            String::new()
        } else {
            format!(": {:?}", &out.violations[..out.violations.len().min(3)])
        },
    );
    if out.statuses.0 > 0 {
        let (seen, bytes) = out.statuses;
        println!(
            "{what}: statuses seen {:.2} per grant, {:.0} bytes each (JSON): {:.0} status bytes written per grant",
            seen as f64 / out.grants.max(1) as f64,
            bytes as f64 / seen as f64,
            bytes as f64 / out.grants.max(1) as f64,
        );
    }
    let shares = cpu::per_grant(*cpu_before, cpu_after, cpu, out.grants);
    println!("{what}: {shares}");
    if let Some(c) = ceiling {
        let rate = grants_per_sec * writes;
        println!(
            "{what}: API writes {rate:.0}/s (grants/s × writes/grant) = {:.0}% of the Lease write ceiling {c:.0}/s",
            100.0 * rate / c
        );
    }
    Ok(())
}

async fn run(
    client: &Client,
    kubeconfig: &Path,
    ns: &str,
    (locks, claimants): (usize, usize),
    rate: Option<f64>,
    ceiling: Option<f64>,
) -> anyhow::Result<()> {
    let workload = scale::prepare(client, ns, locks, claimants).await?;
    let before = (stats::api_requests(client).await?, cpu::now());
    let controller = Controller::start(kubeconfig)?;
    let out: Outcome = scale::drive(client, &workload, rate, RUN_DEADLINE).await?;
    let offered = rate.map_or("flat out".to_string(), |r| format!("{r:.0}/s offered"));
    let what = format!("{locks:>5} locks × {claimants} ({offered:>12})");
    report(client, &controller, &before, &out, (&what, ceiling)).await?;
    // The run's locks go while its controller runs (it lets them go: the finalizer),
    // so the next run's controller holds only its own.
    scale::remove_locks(client, ns).await?;
    drop(controller);
    Ok(())
}
