//! The paths measured between processes: `leasehold run` and `etcdctl lock` wrapping
//! the same CMD, and `leasehold run` SIGKILLed while holding.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use kube::Client;
use kube::api::Api;
use leasehold::api::DistributedLock;
use leasehold::protocol::claim::PodIdentity;
use tokio::process::Command;

use crate::setup::{LOCK, namespace, namespace_on, pod};

/// How long the critical section holds (`--section-ms`, default 50).
static SECTION_MS: std::sync::OnceLock<u32> = std::sync::OnceLock::new();

/// Hold each critical section `ms` milliseconds.
pub fn section_ms(ms: u32) {
    let _ = SECTION_MS.set(ms);
}

/// The critical section both tools run: log its start, hold for [`section_ms`] (50 ms
/// by default), log its end (times in ns from this machine's clock; `date` costs the
/// same to both).
fn section() -> String {
    let ms = SECTION_MS.get().copied().unwrap_or(50);
    format!(
        "echo start $(date +%s%N) >> $LOG; sleep {}.{:03}; echo end $(date +%s%N) >> $LOG",
        ms / 1000,
        ms % 1000
    )
}

/// Where the section logs are copied before their temp dirs go (`--keep-logs DIR`).
static KEEP_LOGS: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// Keep every section log in `dir` (for `scripts/handoff-cpu.py`).
pub fn keep_logs(dir: PathBuf) -> std::io::Result<()> {
    std::fs::create_dir_all(&dir)?;
    let _ = KEEP_LOGS.set(dir);
    Ok(())
}

/// A temp dir and its log file, removed when dropped (copied first to the
/// [`keep_logs`] dir, as `WHAT.log`).
struct Log(PathBuf, &'static str);

impl Log {
    fn new(what: &'static str) -> std::io::Result<Self> {
        let dir = std::env::temp_dir().join(format!("leasehold-bench-{what}-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        Ok(Log(dir, what))
    }
    fn path(&self) -> PathBuf {
        self.0.join("log")
    }
}

impl Drop for Log {
    fn drop(&mut self) {
        if let Some(keep) = KEEP_LOGS.get() {
            let _ = std::fs::copy(self.path(), keep.join(format!("{}.log", self.1)));
        }
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Keep `contenders` processes queued until `rounds + 1` sections ran; then check the
/// sections never overlapped and return the gaps between one's end and the next start.
async fn contend(
    contenders: usize,
    rounds: usize,
    log: &Path,
    spawn: impl Fn(usize) -> std::io::Result<tokio::process::Child>,
) -> anyhow::Result<Vec<Duration>> {
    let mut running = VecDeque::new();
    let mut next = 0;
    while next < contenders.min(rounds + 1) {
        running.push_back(spawn(next)?);
        next += 1;
    }
    while let Some(mut child) = running.pop_front() {
        let status = child.wait().await?;
        anyhow::ensure!(status.success(), "a contender failed: {status}");
        if next <= rounds {
            running.push_back(spawn(next)?);
            next += 1;
        }
    }
    gaps(&std::fs::read_to_string(log)?)
}

/// The handoff gaps of a section log, after checking that sections alternate.
fn gaps(text: &str) -> anyhow::Result<Vec<Duration>> {
    let mut marks: Vec<(u64, bool)> = text
        .lines()
        .filter_map(|l| {
            let (what, ns) = l.split_once(' ')?;
            Some((ns.trim().parse().ok()?, what == "start"))
        })
        .collect();
    marks.sort();
    for (i, (_, start)) in marks.iter().enumerate() {
        anyhow::ensure!(
            *start == (i % 2 == 0),
            "two sections overlapped (log line {i} of {text})"
        );
    }
    Ok(marks
        .windows(2)
        .filter(|w| !w[0].1 && w[1].1)
        .map(|w| Duration::from_nanos(w[1].0 - w[0].0))
        .collect())
}

/// `leasehold run --lock bench -- sh -c SECTION` (see [`section`]) as `pod`, with `$LOG` the shared log.
fn run_as(leasehold: &Path, kubeconfig: &Path, pod: &PodIdentity, log: &Log, section: &str) -> Command {
    let mut cmd = Command::new(leasehold);
    cmd.arg("run")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["--lock", LOCK, "--namespace", &pod.namespace, "--", "sh", "-c", section])
        .env("POD_NAME", &pod.name)
        .env("POD_NAMESPACE", &pod.namespace)
        .env("POD_UID", &pod.uid)
        .env("LOG", log.path())
        .env("RUST_LOG", "error")
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    cmd
}

/// `leasehold run` end to end: one CMD exits → the next queued CMD starts; on a lock
/// whose claims live in the etcd at `etcd` when given.
pub async fn leasehold_run(
    leasehold: &Path,
    client: &Client,
    kubeconfig: &Path,
    contenders: usize,
    rounds: usize,
    etcd: Option<&str>,
) -> anyhow::Result<Vec<Duration>> {
    let ns = if etcd.is_some() { "bench-etcd-run" } else { "bench-run" };
    namespace_on(client, ns, 60, etcd).await?;
    let log = Log::new(ns)?;
    let mut pods = Vec::new();
    for i in 0..contenders {
        pods.push(pod(client, ns, &format!("w{i}")).await?);
    }
    contend(contenders, rounds, &log.path(), |i| {
        run_as(leasehold, kubeconfig, &pods[i % pods.len()], &log, &section()).spawn()
    })
    .await
}

/// `etcdctl lock` on the control plane's own etcd, wrapping the same CMD.
pub async fn etcdctl_lock(etcd: &str, contenders: usize, rounds: usize) -> anyhow::Result<Vec<Duration>> {
    let log = Log::new("etcdctl")?;
    let key = format!("leasehold-bench-{}", std::process::id());
    contend(contenders, rounds, &log.path(), |_| {
        etcdctl(etcd, &key, &log, &section()).spawn()
    })
    .await
}

/// `etcdctl lock KEY -- sh -c SECTION` on the etcd at `url`, with `$LOG` the shared log.
fn etcdctl(url: &str, key: &str, log: &Log, section: &str) -> Command {
    let mut cmd = Command::new("etcdctl");
    cmd.arg(format!("--endpoints={url}"))
        .args(["lock", key, "--", "sh", "-c", section])
        .env("ETCDCTL_API", "3")
        .env("LOG", log.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    cmd
}

/// A free lock taken by a process just started: the process's start (recorded here,
/// just before spawning it) → its CMD's first line, `rounds` times one after another,
/// with `leasehold run` (`etcd` None) or `etcdctl lock` on the etcd at `etcd`.
pub async fn uncontended(
    leasehold: &Path,
    client: &Client,
    kubeconfig: &Path,
    rounds: usize,
    etcd: Option<&str>,
) -> anyhow::Result<Vec<Duration>> {
    let ns = "bench-uncontended";
    let me = match etcd {
        None => {
            namespace(client, ns, 60).await?;
            Some(pod(client, ns, "u").await?)
        }
        Some(_) => None,
    };
    let log = Log::new(if etcd.is_some() { "etcdctl-start" } else { ns })?;
    let key = format!("leasehold-bench-start-{}", std::process::id());
    let section = "echo start $(date +%s%N) >> $LOG";
    let mut samples = Vec::new();
    for _ in 0..rounds {
        let mut cmd = match (etcd, &me) {
            (Some(url), _) => etcdctl(url, &key, &log, section),
            (None, me) => run_as(leasehold, kubeconfig, me.as_ref().expect("made above"), &log, section),
        };
        let spawned = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
        let status = cmd.spawn()?.wait().await?;
        anyhow::ensure!(status.success(), "an uncontended run failed: {status}");
        let text = std::fs::read_to_string(log.path())?;
        let started: u64 = text
            .lines()
            .last()
            .and_then(|l| l.strip_prefix("start "))
            .and_then(|n| n.trim().parse().ok())
            .ok_or_else(|| anyhow::anyhow!("no start line in {text}"))?;
        samples.push(Duration::from_nanos(started).saturating_sub(spawned));
    }
    Ok(samples)
}

/// `leasehold run` SIGKILLed while holding (its claim is left to expire) → the next
/// queued CMD starts. Lease `lease_seconds`; one waiter queued each round.
pub async fn sigkill(
    leasehold: &Path,
    client: &Client,
    kubeconfig: &Path,
    lease_seconds: i32,
    rounds: usize,
) -> anyhow::Result<Vec<Duration>> {
    let ns = "bench-sigkill";
    namespace(client, ns, lease_seconds).await?;
    let log = Log::new("sigkill")?;
    let mut pods = Vec::new();
    for i in 0..=rounds {
        pods.push(pod(client, ns, &format!("k{i}")).await?);
    }
    let spawn = |i: usize| {
        let section = format!("echo start {i} >> $LOG; exec sleep 3600");
        run_as(leasehold, kubeconfig, &pods[i], &log, &section)
            .kill_on_drop(true)
            .spawn()
    };
    let started =
        |i: usize| std::fs::read_to_string(log.path()).is_ok_and(|t| t.lines().any(|l| l == format!("start {i}")));
    let mut holder = spawn(0)?;
    let mut samples = Vec::new();
    for i in 1..=rounds {
        while !started(i - 1) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let waiter = spawn(i)?;
        // Untimed: until the waiter's claim is queued.
        let locks: Api<DistributedLock> = Api::namespaced(client.clone(), ns);
        while locks.get(LOCK).await?.status.is_none_or(|s| s.queue.is_empty()) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let killed = Instant::now();
        holder.start_kill()?;
        holder.wait().await?;
        while !started(i) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        samples.push(killed.elapsed());
        holder = waiter;
    }
    Ok(samples)
}
