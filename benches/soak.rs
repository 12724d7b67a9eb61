//! The chaos soak: `leasehold run` clients take turns on one lock on a local control
//! plane while faults are injected, and every critical section is checked afterwards.
//!
//! ```sh
//! cargo test --release --features cli --bench soak -- --seconds 1200      # a long run, by hand
//! LEASEHOLD_BIN=/copy/of/leasehold cargo test --features cli --bench soak -- --seconds 2400
//! cargo test --features cli --bench soak -- --seconds 60                  # the short run CI does
//! cargo test --release --features cli --bench soak -- --seconds 600 --only Neighbour --fault-every 1
//! ```
//!
//! Faults, one every `--fault-every` seconds on average, chosen at random:
//! controller SIGKILL and restart; a runner's `leasehold run` SIGKILLed; a runner's API
//! path black-holed for two leases; the controller's watches stalled for two leases
//! (writes pass); the controller's whole path black-holed for two leases; a holder's pod force-deleted (no kubelet report) while its path is
//! black-holed, then re-created under the same name; a release mark forged on the
//! holder's claim; a neighbour tampering with any claim, queued or not yet (its lease
//! patched down, its hash stripped, its pod fields changed, its lock label removed, a
//! mark forged). Every section's CMD leaves a ticking child behind (a forking CMD).
//!
//! The history check: sections never overlap — a section lasts from its `start` line to
//! the last line its token wrote (ticks of leftover children included) — and tokens
//! strictly increase in start order. Every run must end in a way a fault explains (see
//! `EXPECTED_EXITS`), and once the faults stop every runner's last run must end within
//! a drain of ten leases and 120 s (a runner waiting past it is a lost waiter). Prints
//! the figures and exits non-zero on a violation.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use leasehold::api::{DistributedLock, DistributedLockSpec};
use leasehold::testing::proxy::Proxy;
use rand::Rng;
use tokio::process::{Child, Command};

/// The leasehold binary: `$LEASEHOLD_BIN`, else the one cargo built beside this program
/// (a long soak should run a copy, so that a rebuild during the run cannot swap it).
fn leasehold() -> PathBuf {
    std::env::var_os("LEASEHOLD_BIN").map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_leasehold")), PathBuf::from)
}
const NS: &str = "soak";

/// The section every runner's CMD runs: it logs its start, leaves a ticking child
/// behind, and logs its end (times in ns, from this machine's clock).
const SECTION: &str = r#"t() { date +%s%N; }; echo "start $LEASEHOLD_FENCING_TOKEN $POD_NAME $(t)" >> $LOG; (while :; do echo "tick $LEASEHOLD_FENCING_TOKEN $POD_NAME $(t)" >> $LOG; sleep 0.02; done) & sleep 0.05; echo "end $LEASEHOLD_FENCING_TOKEN $POD_NAME $(t)" >> $LOG"#;

struct Args {
    seconds: u64,
    pods: usize,
    lease: i32,
    fault_every: f64,
    /// Only this fault (its name, as printed), instead of one chosen at random.
    only: Option<String>,
}

fn args() -> Args {
    let mut a = Args {
        seconds: 60,
        pods: 4,
        lease: 2,
        fault_every: 3.0,
        only: None,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    for pair in argv.windows(2) {
        match pair[0].as_str() {
            "--seconds" => a.seconds = pair[1].parse().expect("--seconds N"),
            "--pods" => a.pods = pair[1].parse().expect("--pods N"),
            "--lease" => a.lease = pair[1].parse().expect("--lease N"),
            "--fault-every" => a.fault_every = pair[1].parse().expect("--fault-every SECONDS"),
            "--only" => a.only = Some(pair[1].clone()),
            _ => {}
        }
    }
    a
}

/// What the faults reach: each runner's path, the controller's path and process.
struct World {
    client: Client,
    dir: PathBuf,
    lease: Duration,
    controller_proxy: Proxy,
    controller: Mutex<Option<Child>>,
    /// The controller's HTTP port, the same across its restarts: the URL it publishes
    /// for release notices stays good, and holders reach it while it runs.
    http_port: u16,
    runners: Vec<Runner>,
    /// How each `leasehold run` ended: its exit code, or the signal that killed it.
    exits: Mutex<BTreeMap<String, u32>>,
}

struct Runner {
    pod: String,
    proxy: Proxy,
    kubeconfig: PathBuf,
    uid: Mutex<String>,
    child: Mutex<Option<Child>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    ControllerKill,
    RunnerKill,
    RunnerBlackHole,
    ControllerWatchStall,
    ControllerBlackHole,
    PodForceDelete,
    ForgedRelease,
    Neighbour,
}

const FAULTS: [Fault; 8] = [
    Fault::ControllerKill,
    Fault::RunnerKill,
    Fault::RunnerBlackHole,
    Fault::ControllerWatchStall,
    Fault::ControllerBlackHole,
    Fault::PodForceDelete,
    Fault::ForgedRelease,
    Fault::Neighbour,
];

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    leasehold::telemetry::init("warn,kube_client=error", leasehold::telemetry::LogFormat::Text);
    let a = args();
    let kubeconfig = leasehold::testing::spawn_for_process(&leasehold(), Duration::from_secs(600))?;
    let client = leasehold::kubeconfig::client_for(&kubeconfig).await?;
    let dir = std::env::temp_dir().join(format!("leasehold-soak-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    setup(&client, a.lease).await?;
    let upstream = leasehold::testing::proxy::api_port(&kubeconfig)?;
    let controller_proxy = Proxy::start(upstream).await;
    controller_proxy.kubeconfig(&kubeconfig, &dir.join("kubeconfig-controller"))?;
    let mut runners = Vec::new();
    for i in 0..a.pods {
        let pod = format!("p{i}");
        let uid = create_pod(&client, &pod).await?;
        let proxy = Proxy::start(upstream).await;
        let path = dir.join(format!("kubeconfig-{pod}"));
        proxy.kubeconfig(&kubeconfig, &path)?;
        runners.push(Runner {
            pod,
            proxy,
            kubeconfig: path,
            uid: Mutex::new(uid),
            child: Mutex::new(None),
        });
    }
    let world = Arc::new(World {
        client,
        dir: dir.clone(),
        lease: Duration::from_secs(a.lease as u64),
        controller_proxy,
        controller: Mutex::new(None),
        http_port: std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port(),
        runners,
        exits: Mutex::new(BTreeMap::new()),
    });
    start_controller(&world)?;
    let started = Instant::now();
    let end = started + Duration::from_secs(a.seconds);
    let mut loops = Vec::new();
    for i in 0..world.runners.len() {
        loops.push(tokio::spawn(run_loop(world.clone(), i, end)));
    }
    let mut faults: BTreeMap<Fault, u32> = BTreeMap::new();
    while Instant::now() < end {
        let pause = rand::rng().random_range(0.5..1.5) * a.fault_every;
        tokio::time::sleep(Duration::from_secs_f64(pause)).await;
        if Instant::now() >= end {
            break;
        }
        let fault = match &a.only {
            Some(name) => *FAULTS
                .iter()
                .find(|f| format!("{f:?}") == *name)
                .unwrap_or_else(|| panic!("--only takes one of {FAULTS:?}")),
            None => FAULTS[rand::rng().random_range(0..FAULTS.len())],
        };
        if inject(&world, fault).await {
            *faults.entry(fault).or_default() += 1;
        }
    }
    // Once the faults stop, every runner's last run ends within the drain: the faults
    // still in place (two leases at most) pass, a holder cut off is expired (a lease and
    // its grace), and the others take their turns. A runner still waiting past it is a
    // lost waiter (which waits for ever: the bound is generous, since CI saw drains of
    // 46 s and, before this check, one of 57 s on a loaded machine).
    let drain = world.lease * 10 + Duration::from_secs(120);
    let mut lost = Vec::new();
    for (i, l) in loops.into_iter().enumerate() {
        if tokio::time::timeout_at((end + drain).into(), l).await.is_err() {
            lost.push(format!(
                "lost waiter: {}'s run had not ended {drain:?} after the faults stopped",
                world.runners[i].pod
            ));
            if let Some(c) = world.runners[i].child.lock().unwrap().as_mut() {
                let _ = c.start_kill();
            }
        }
    }
    if let Some(mut c) = world.controller.lock().unwrap().take() {
        let _ = c.start_kill();
    }
    let log = std::fs::read_to_string(dir.join("log")).unwrap_or_default();
    let mut report = check(&log);
    report.violations.extend(lost);
    let exits = world.exits.lock().unwrap().clone();
    println!("runs ended: {exits:?}");
    for (how, n) in &exits {
        if !EXPECTED_EXITS.contains(&how.as_str()) {
            report
                .violations
                .push(format!("{n} runs ended with {how}, which no fault explains"));
        }
    }
    println!(
        "soak: {:.0} s, {} pods, lease {} s: {} sections (handoffs), {} ticks checked",
        started.elapsed().as_secs_f64(),
        a.pods,
        a.lease,
        report.sections,
        report.ticks
    );
    let total: u32 = faults.values().sum();
    println!("faults: {total} ({faults:?})");
    println!("violations: {}", report.violations.len());
    for v in report.violations.iter().take(20) {
        println!("  {v}");
    }
    if report.violations.is_empty() && report.sections > 0 && exits.get("exit 0").is_some_and(|n| *n > 0) {
        println!("soak: 1 passed, 0 failed");
        Ok(())
    } else {
        println!("soak: 0 passed, 1 failed");
        anyhow::bail!("the soak found violations (log: {})", dir.join("log").display())
    }
}

async fn setup(client: &Client, lease: i32) -> anyhow::Result<()> {
    leasehold::testing::scale::namespace(client, NS).await?;
    let lock = DistributedLock::new(
        "l",
        DistributedLockSpec {
            lease_duration_seconds: lease,
            max_holders: 1,
            backend: None,
            max_queue: None,
        },
    );
    Api::<DistributedLock>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &lock)
        .await?;
    Ok(())
}

async fn create_pod(client: &Client, name: &str) -> anyhow::Result<String> {
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {"automountServiceAccountToken": false, "containers": [{"name": "app", "image": "leasehold:dev"}]}
    }))?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    loop {
        match pods.create(&PostParams::default(), &pod).await {
            Ok(p) => return Ok(p.uid().unwrap_or_default()),
            // The old pod of this name is still being removed.
            Err(kube::Error::Api(s)) if s.is_already_exists() => tokio::time::sleep(Duration::from_millis(50)).await,
            Err(e) => return Err(e.into()),
        }
    }
}

fn start_controller(world: &World) -> anyhow::Result<()> {
    let child = Command::new(leasehold())
        .args(["controller", "--namespace", NS, "--advertise-address", "127.0.0.1"])
        .arg("--http-addr")
        .arg(format!("127.0.0.1:{}", world.http_port))
        .env("KUBECONFIG", world.dir.join("kubeconfig-controller"))
        .env("RUST_LOG", "error")
        .kill_on_drop(true)
        .spawn()?;
    *world.controller.lock().unwrap() = Some(child);
    Ok(())
}

/// How a `leasehold run` may end under the soak's faults: CMD's status (0: the section
/// always succeeds), 76 (the grant lost: a black hole, a forced or forged release, a
/// tampered claim), 125 (leasehold's own error: a refused claim after a neighbour changed
/// its pod fields or its pod was re-created, an API error), SIGKILL (`RunnerKill`).
/// Anything else (101 is a panic) is a violation.
const EXPECTED_EXITS: [&str; 4] = ["exit 0", "exit 76", "exit 125", "signal 9"];

/// How a child ended, as [`EXPECTED_EXITS`] names it.
fn ended(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit {code}"),
        (None, Some(sig)) => format!("signal {sig}"),
        (None, None) => format!("{status}"),
    }
}

/// One pod's client: `leasehold run` again and again until `end`.
async fn run_loop(world: Arc<World>, i: usize, end: Instant) {
    let r = &world.runners[i];
    while Instant::now() < end {
        let uid = r.uid.lock().unwrap().clone();
        let child = Command::new(leasehold())
            .arg("run")
            .arg("--kubeconfig")
            .arg(&r.kubeconfig)
            .args(["--lock", "l", "--namespace", NS, "--", "sh", "-c", SECTION])
            .env("POD_NAME", &r.pod)
            .env("POD_NAMESPACE", NS)
            .env("POD_UID", uid)
            .env("LOG", world.dir.join("log"))
            .env("RUST_LOG", "off")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn();
        let Ok(child) = child else { return };
        *r.child.lock().unwrap() = Some(child);
        loop {
            let done = {
                let mut guard = r.child.lock().unwrap();
                match guard.as_mut().map(|c| c.try_wait()) {
                    Some(Ok(Some(status))) => {
                        *world.exits.lock().unwrap().entry(ended(status)).or_default() += 1;
                        true
                    }
                    Some(Ok(None)) => false,
                    Some(Err(_)) | None => true,
                }
            };
            if done {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// Inject one fault; returns whether it could be injected.
async fn inject(world: &Arc<World>, fault: Fault) -> bool {
    let pick = rand::rng().random_range(0..world.runners.len());
    match fault {
        Fault::ControllerKill => {
            if let Some(mut c) = world.controller.lock().unwrap().take() {
                let _ = c.start_kill();
            }
            tokio::time::sleep(Duration::from_millis(rand::rng().random_range(0..1000))).await;
            start_controller(world).is_ok()
        }
        Fault::RunnerKill => {
            let mut child = world.runners[pick].child.lock().unwrap();
            child.as_mut().is_some_and(|c| c.start_kill().is_ok())
        }
        Fault::RunnerBlackHole => for_two_leases(
            world,
            move |w| w.runners[pick].proxy.black_hole(),
            move |w| w.runners[pick].proxy.restore(),
        ),
        Fault::ControllerWatchStall => for_two_leases(
            world,
            |w| w.controller_proxy.freeze_open(),
            |w| w.controller_proxy.thaw(),
        ),
        Fault::ControllerBlackHole => for_two_leases(
            world,
            |w| w.controller_proxy.black_hole(),
            |w| w.controller_proxy.restore(),
        ),
        Fault::PodForceDelete => force_delete_holder(world).await,
        Fault::ForgedRelease => forge_release(world).await,
        Fault::Neighbour => tamper(world).await,
    }
}

/// Put a fault in place now and take it away two leases later; always injected.
fn for_two_leases(world: &Arc<World>, on: impl FnOnce(&World), off: impl FnOnce(&World) + Send + 'static) -> bool {
    on(world);
    let w = world.clone();
    tokio::spawn(async move {
        tokio::time::sleep(w.lease * 2).await;
        off(&w);
    });
    true
}

async fn holder(world: &World) -> Option<(String, String)> {
    let lock = Api::<DistributedLock>::namespaced(world.client.clone(), NS)
        .get("l")
        .await
        .ok()?;
    let h = lock.status?.holders.into_iter().find(|h| h.revoked.is_none())?;
    Some((h.pod, h.claim))
}

/// Black-hole the holder's path (its node stops answering), force-delete its pod, and
/// re-create the pod under the same name (as a StatefulSet would); restore the path
/// two leases later.
async fn force_delete_holder(world: &Arc<World>) -> bool {
    let Some((pod, _)) = holder(world).await else {
        return false;
    };
    let Some(i) = world.runners.iter().position(|r| r.pod == pod) else {
        return false;
    };
    for_two_leases(
        world,
        move |w| w.runners[i].proxy.black_hole(),
        move |w| w.runners[i].proxy.restore(),
    );
    let pods: Api<Pod> = Api::namespaced(world.client.clone(), NS);
    let now = DeleteParams {
        grace_period_seconds: Some(0),
        ..Default::default()
    };
    let deleted = pods.delete(&pod, &now).await.is_ok();
    if let Ok(uid) = create_pod(&world.client, &pod).await {
        *world.runners[i].uid.lock().unwrap() = uid;
    }
    deleted
}

/// Write a release mark on the holder's claim that its process did not write.
async fn forge_release(world: &World) -> bool {
    let Some((_, claim)) = holder(world).await else {
        return false;
    };
    // A release notice with a made-up secret to the controller (refused: 403), then a
    // mark with one on the claim (the holder is revoked, its slot held back).
    let notice = serde_json::json!({"namespace": NS, "lock": "l", "claim": claim, "secret": "true"}).to_string();
    let _ = forged_notice(world.http_port, &notice).await;
    let patch = serde_json::json!({"metadata": {"annotations": {"leasehold.dev/released": "true"}}});
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> = Api::namespaced(world.client.clone(), NS);
    leases
        .patch(&claim, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .is_ok()
}

/// A neighbour who may patch and create Leases tampers with a random claim, waiting or
/// held, queued or not yet (raw merge patches, as the client Role allows): its lease
/// patched down, removed or raised to an hour, its release or wait hash stripped,
/// copied from another claim or padded to 200,000 bytes, its pod fields pointed at
/// another pod, its lock label removed, a fencing-token stamp added, or a release mark
/// forged; or it creates a stamped claim of a runner's pod, with the lock's lease.
async fn tamper(world: &World) -> bool {
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> = Api::namespaced(world.client.clone(), NS);
    let claims = leases
        .list(&kube::api::ListParams::default().labels("leasehold.dev/lock"))
        .await;
    let Ok(claims) = claims else { return false };
    if claims.items.is_empty() {
        return false;
    }
    let claim = &claims.items[rand::rng().random_range(0..claims.items.len())];
    let other = &world.runners[rand::rng().random_range(0..world.runners.len())];
    let other_uid = other.uid.lock().unwrap().clone();
    let another = &claims.items[rand::rng().random_range(0..claims.items.len())];
    let copied = |key: &str| another.annotations().get(key).cloned();
    let patch = match rand::rng().random_range(0..13) {
        0 => serde_json::json!({"spec": {"leaseDurationSeconds": 1}}),
        1 => serde_json::json!({"metadata": {"annotations": {"leasehold.dev/release-hash": null}}}),
        5 => serde_json::json!({"spec": {"leaseDurationSeconds": null}}),
        6 => serde_json::json!({"spec": {"leaseDurationSeconds": 3600}}),
        7 => serde_json::json!({"metadata": {"annotations": {"leasehold.dev/wait-hash": null}}}),
        8 => serde_json::json!({"metadata": {"annotations": {
            "leasehold.dev/release-hash": copied("leasehold.dev/release-hash"),
            "leasehold.dev/wait-hash": copied("leasehold.dev/wait-hash"),
        }}}),
        9 => serde_json::json!({"metadata": {"annotations": {"leasehold.dev/release-hash": "f".repeat(200_000)}}}),
        10 => serde_json::json!({"metadata": {"annotations": {"leasehold.dev/fencing-token": "1"}}}),
        11 => return stamped_claim(world, other, &other_uid).await,
        2 => serde_json::json!({
            "metadata": {
                "annotations": {"leasehold.dev/pod-uid": other_uid},
                "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": other.pod, "uid": other_uid}],
            },
            "spec": {"holderIdentity": other.pod},
        }),
        3 => serde_json::json!({"metadata": {"labels": {"leasehold.dev/lock": null}}}),
        _ => serde_json::json!({"metadata": {"annotations": {"leasehold.dev/released": "true"}}}),
    };
    let name = claim.name_any();
    leases
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .is_ok()
}

/// The neighbour's own claim (of runner `other`'s pod, which it may name): stamped with
/// a fencing token, living by the lock's lease, never renewed.
async fn stamped_claim(world: &World, other: &Runner, uid: &str) -> bool {
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> = Api::namespaced(world.client.clone(), NS);
    let pod = leasehold::protocol::PodIdentity {
        name: other.pod.clone(),
        namespace: NS.into(),
        uid: uid.into(),
    };
    let name = leasehold::protocol::claim::claim_name("l");
    let lease = i32::try_from(world.lease.as_secs()).unwrap_or(1);
    let mut claim = leasehold::protocol::claim::claim_lease(&name, "l", &pod, lease);
    let stamp = ("leasehold.dev/fencing-token".to_string(), "1".to_string());
    claim.metadata.annotations.get_or_insert_default().extend([stamp]);
    leases.create(&PostParams::default(), &claim).await.is_ok()
}

/// POST a release notice body to the controller on loopback; its status line.
async fn forged_notice(port: u16, body: &str) -> std::io::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    let req = format!(
        "POST /v1/release HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(req.as_bytes()).await?;
    let mut out = String::new();
    tokio::time::timeout(Duration::from_secs(2), conn.read_to_string(&mut out))
        .await
        .map_err(std::io::Error::other)??;
    Ok(out.lines().next().unwrap_or_default().to_string())
}

struct Report {
    sections: usize,
    ticks: usize,
    violations: Vec<String>,
}

/// Check the shared log: per token, the span from its start to the last line it
/// wrote; spans must not overlap, and tokens must increase in start order.
fn check(log: &str) -> Report {
    let mut spans: BTreeMap<i64, (u128, u128, String)> = BTreeMap::new();
    let mut ticks = 0;
    let mut violations = Vec::new();
    for line in log.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        let [kind, token, pod, at] = w[..] else {
            violations.push(format!("malformed line {line:?}"));
            continue;
        };
        let (Ok(token), Ok(at)) = (token.parse::<i64>(), at.parse::<u128>()) else {
            violations.push(format!("malformed line {line:?}"));
            continue;
        };
        if kind == "tick" {
            ticks += 1;
        }
        let span = spans.entry(token).or_insert((u128::MAX, 0, pod.to_string()));
        if kind == "start" {
            span.0 = span.0.min(at);
        }
        span.1 = span.1.max(at);
    }
    let mut by_start: Vec<(u128, u128, i64, String)> = spans
        .into_iter()
        .filter(|(_, s)| s.0 != u128::MAX)
        .map(|(t, (start, last, pod))| (start, last, t, pod))
        .collect();
    by_start.sort();
    for w in by_start.windows(2) {
        let ((s0, l0, t0, p0), (s1, _, t1, p1)) = (&w[0], &w[1]);
        if t1 <= t0 {
            violations.push(format!("token {t1} ({p1}) started after token {t0} ({p0})"));
        }
        if s1 <= l0 {
            violations.push(format!(
                "overlap: {p1} (token {t1}) started {:.1} ms before {p0} (token {t0}, started {s0}) stopped",
                (*l0 - *s1) as f64 / 1e6
            ));
        }
    }
    Report {
        sections: by_start.len(),
        ticks,
        violations,
    }
}
