//! `leasehold run --lock NAME -- CMD`: run CMD while holding the lock.
//!
//! CMD gets `LEASEHOLD_LOCK`, `LEASEHOLD_NAMESPACE`, `LEASEHOLD_POD` (the pod its claim
//! names) and `LEASEHOLD_FENCING_TOKEN`.
//! SIGTERM/SIGINT are forwarded to it; when it exits the lock is released (a failed
//! release is retried; if it still fails, the claim expires) and its exit status
//! becomes ours ([`EXIT_SETTLE`] after a graceful release). Our own failures exit 125; a lock not granted (`--timeout`, `--try`)
//! exits 75 or `--timeout-exit-code`. If the grant is lost, CMD gets SIGTERM and,
//! after the safety margin, SIGKILL — so it is dead before the lease could run out. CMD runs under
//! `leasehold guard --supervise` ([`crate::supervise`]) in a process group of its own:
//! signals reach its whole group, and its whole process tree dies when it exits, when
//! the grant is lost, and with us even if we are killed by SIGKILL. With
//! `--ready-port`, a readiness endpoint tells whether CMD runs under the grant
//! ([`super::ready`]).

use std::ffi::OsString;
use std::process::ExitCode;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::signal::unix::{SignalKind, signal};
use tokio::time::Instant;

use super::ClusterArgs;
use super::ready::Ready;
use tokio::process::Child;

use crate::client::{Error as ClientError, Guard, Lock, WaitEvent};
use crate::protocol::timing::safety_margin;
use crate::supervise::{FORWARD_TERM_SIGNAL, KILL_TIMEOUT, KILL_TREE_SIGNAL, Started};

/// Exit status when `--timeout` passed before the lock was granted, or `--try` found it
/// taken (EX_TEMPFAIL), unless `--timeout-exit-code` says otherwise.
pub const EXIT_TIMEOUT: u8 = 75;
/// Exit status when the grant was lost while CMD ran (EX_PROTOCOL).
pub const EXIT_LOST: u8 = 76;
/// How many times the release is tried after CMD exits (all within half the lease).
pub const RELEASE_TRIES: u32 = 4;
/// How long `leasehold run` stays after a graceful release before it exits. Its exit
/// (dropping its runtime and connections, the kernel freeing an 18 MiB process) costs
/// over a millisecond of CPU; done at once, it competes with the next holder's start
/// whenever both run on one node (measured: docs/measurements.md). Only after a
/// graceful release: CMD's whole tree has ended, the release has been written (or has
/// failed, and the claim expires), and only our exit status waits.
pub const EXIT_SETTLE: Duration = Duration::from_millis(20);

/// Options of `leasehold run`.
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// The DistributedLock to hold while CMD runs.
    #[arg(long)]
    pub lock: String,
    /// The lock's namespace (must be the pod's own). Default: $POD_NAMESPACE, else the
    /// kubeconfig's namespace.
    #[arg(long, short = 'n')]
    pub namespace: Option<String>,
    /// Give up waiting after this long (e.g. `30s`, `5m`) and exit with status 75 (or
    /// `--timeout-exit-code`), without running CMD.
    #[arg(long, value_parser = humantime::parse_duration, conflicts_with = "try_only")]
    pub timeout: Option<Duration>,
    /// Take the lock only if it is free: when it is held (or others wait for it), exit
    /// at once with status 75 (or `--timeout-exit-code`), without running CMD.
    #[arg(long = "try")]
    pub try_only: bool,
    /// The exit status when `--timeout` passes or `--try` finds the lock taken (like
    /// `flock -E`); `--timeout-exit-code 0` lets a CronJob skip a run quietly.
    #[arg(long, value_name = "N", default_value_t = EXIT_TIMEOUT)]
    pub timeout_exit_code: u8,
    /// Serve HTTP on this port (all addresses): 200 while this process holds the lock
    /// and runs CMD, 503 before and after. For a `readinessProbe` (`httpGet`): behind a
    /// Service, only the holder is Ready and gets traffic.
    #[arg(long, value_name = "PORT")]
    pub ready_port: Option<u16>,
    /// Which cluster.
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    pub command: Vec<OsString>,
}

/// Acquire, run CMD, release; returns CMD's exit status (or 75 / 76).
pub async fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    let (lock, namespace) = handle(&args).await?;
    let ready = match args.ready_port {
        Some(port) => Some(serve_ready(port).await?),
        None => None,
    };
    // The supervisor is started now and waits: a process start costs milliseconds,
    // which belong to the wait, not to the handoff.
    let (program, rest) = args.command.split_first().expect("clap requires a command");
    let (mut cmd, pending) = crate::supervise::pending_command(&crate::supervise::self_exe()?, program.clone())?;
    cmd.args(rest)
        .env("LEASEHOLD_LOCK", &args.lock)
        .env("LEASEHOLD_NAMESPACE", &namespace)
        .env("LEASEHOLD_POD", &lock.identity().name);
    // Anything of CMD's that outlives its supervisor (killed itself, or unable to kill
    // the tree in time) is re-parented to us, and killed before the release.
    nix::sys::prctl::set_child_subreaper(true)?;
    // Not dumpable: CMD (same user) cannot reach our end of the supervisor's report
    // pipe through /proc, nor read our memory.
    nix::sys::prctl::set_dumpable(false)?;
    let mut child = cmd.spawn()?;
    drop(cmd); // closes our copies of the supervisor's ends of its pipes
    let guard = match acquire(&lock, &args, &namespace).await? {
        Ok(guard) => guard,
        Err(code) => return Ok(code),
    };
    let token = guard.fencing_token();
    let mut started = match pending.start(&[("LEASEHOLD_FENCING_TOKEN", &token.to_string())]) {
        Ok(started) => started,
        Err(e) => {
            // The supervisor is gone (killed): CMD never ran, so the grant can be released.
            eprintln!("leasehold: starting the command failed: {e}");
            let _ = child.wait().await;
            guard.release().await?;
            return Ok(ExitCode::from(crate::cli::EXIT_OWN_ERROR));
        }
    };
    let pid = Pid::from_raw(child.id().expect("a just-spawned child has a pid") as i32);
    tell_deadline(&started, &guard);
    ready.iter().for_each(|r| r.set(true));
    let ended = watch_command(&mut child, pid, &mut started, &guard).await?;
    // CMD no longer runs under the grant: not Ready from now, through the release and
    // until we exit, while the next holder may already be Ready.
    ready.iter().for_each(|r| r.set(false));
    let code = match ended {
        // The supervisor saw CMD end with nothing of its tree left (it is a subreaper:
        // nothing of CMD's can be anywhere but below it) and exits once we close the
        // report pipe: release at once, and let it go and reap it after.
        Ended::Reported(code) => {
            release_reported(guard, started, &mut child).await;
            code
        }
        Ended::Exited(status) => {
            // Killed by its supervisor at the deadline (this process paused): the grant is lost.
            let lost = guard.is_lost();
            if outlived_by_nothing() {
                release(guard).await;
            } else {
                guard.abandon();
            }
            if lost {
                EXIT_LOST
            } else {
                crate::supervise::exit_status(status)
            }
        }
        Ended::Lost => {
            // A supervisor that reports CMD's end now exits at once.
            drop(started);
            stop_on_loss((&mut child, pid), guard, &args.lock).await;
            EXIT_LOST
        }
    };
    Ok(ExitCode::from(code))
}

/// The readiness endpoint on `port` of every address (IPv6 and IPv4, else IPv4 alone).
async fn serve_ready(port: u16) -> anyhow::Result<Ready> {
    let any6 = (std::net::Ipv6Addr::UNSPECIFIED, port).into();
    match Ready::serve(any6).await {
        Ok(r) => Ok(r),
        Err(_) => Ready::serve((std::net::Ipv4Addr::UNSPECIFIED, port).into())
            .await
            .map_err(|e| anyhow::anyhow!("serving readiness on port {port} (--ready-port): {e}")),
    }
}

/// The lock handle `args` name, and its namespace.
async fn handle(args: &RunArgs) -> anyhow::Result<(Lock, String)> {
    let config = args.cluster.config().await?;
    // Reads and watches over HTTP/2 with PINGs: a stalled watch is found at no request;
    // a second pool for the claim's writes keeps the release off a cold connection.
    let (client, writes) = crate::kubeconfig::lock_clients_from(config)?;
    let namespace = args
        .namespace
        .clone()
        .or_else(|| std::env::var("POD_NAMESPACE").ok().filter(|n| !n.is_empty()))
        .unwrap_or_else(|| client.default_namespace().to_string());
    let (name, ns) = (args.lock.clone(), namespace.clone());
    let lock = Lock::builder(client, &namespace, &args.lock)
        .write_client(writes)
        .on_wait_event(move |event| eprintln!("{}", notice(event, &name, &ns)))
        .build()?;
    Ok((lock, namespace))
}

/// Granted `lock` under `guard`: say so, and give it back at once if it is lost already
/// (CMD never ran; a guard dropped would try the release in a task the runtime's end
/// may cut short, leaving the slot to expire).
async fn holding(guard: Guard, lock: &str) -> Result<Guard, ExitCode> {
    let token = guard.fencing_token();
    eprintln!("leasehold: holding lock {lock} with fencing token {token}");
    if !guard.is_lost() {
        return Ok(guard);
    }
    eprintln!("leasehold: the grant was lost before the command started");
    let _ = guard.release().await;
    Err(ExitCode::from(EXIT_LOST))
}

/// Acquire as `args` say: the guard, or the exit status when the lock is not granted
/// (taken, or not in time, or lost before CMD could start).
async fn acquire(lock: &Lock, args: &RunArgs, namespace: &str) -> anyhow::Result<Result<Guard, ExitCode>> {
    let acquired = match (args.try_only, args.timeout) {
        (true, _) => lock.try_acquire().await,
        (false, Some(t)) => lock.acquire_timeout(t).await.map(Some),
        (false, None) => lock.acquire().await.map(Some),
    };
    let not_run = Err(ExitCode::from(args.timeout_exit_code));
    match acquired {
        Ok(Some(g)) => Ok(holding(g, &args.lock).await),
        Ok(None) => {
            eprintln!(
                "leasehold: lock {} is taken (--try): not running the command",
                args.lock
            );
            Ok(not_run)
        }
        Err(ClientError::Timeout(t)) if !args.try_only => {
            eprintln!("leasehold: lock {} not granted within {t:?}", args.lock);
            Ok(not_run)
        }
        Err(ClientError::Timeout(t)) => anyhow::bail!(
            "no controller placed the claim for lock {} within {t:?} (--try): is the leasehold controller running?",
            args.lock
        ),
        Err(ClientError::NoSuchLock(_)) => anyhow::bail!(
            "lock {} does not exist in namespace {namespace} (kubectl get distributedlocks -n {namespace})",
            args.lock
        ),
        Err(e) => Err(e.into()),
    }
}

/// Wait for CMD (under its supervisor `child`, process `pid`) to end, forwarding
/// SIGTERM and SIGINT, or for the grant to be lost.
async fn watch_command(child: &mut Child, pid: Pid, started: &mut Started, guard: &Guard) -> anyhow::Result<Ended> {
    let (mut term, mut int) = (signal(SignalKind::terminate())?, signal(SignalKind::interrupt())?);
    let mut renewed = guard.valid_until_changes();
    loop {
        tokio::select! {
            Ok(()) = renewed.changed() => tell_deadline(started, guard),
            code = started.exited(), if started.reporting() => match code {
                Some(code) => return Ok(Ended::Reported(code)),
                None => continue, // the supervisor ended unreported: its exit tells
            },
            status = child.wait() => return Ok(Ended::Exited(status?)),
            _ = term.recv() => { let _ = kill(pid, FORWARD_TERM_SIGNAL); }
            _ = int.recv() => { let _ = kill(pid, Signal::SIGINT); }
            _ = guard.lost() => return Ok(Ended::Lost),
        }
    }
}

/// The grant is lost: stop CMD's whole tree (SIGTERM; by the command's deadline,
/// [`kill_grace`], SIGKILL to the supervisor and every process below it), and release
/// only when nothing of it is left.
async fn stop_on_loss((child, pid): (&mut Child, Pid), guard: Guard, lock: &str) {
    let grace = kill_grace(guard.valid_until(), guard.lease_duration(), Instant::now());
    eprintln!("leasehold: lost lock {lock}: stopping the command (SIGKILL in {grace:?})");
    let _ = kill(pid, FORWARD_TERM_SIGNAL);
    if tokio::time::timeout(grace, child.wait()).await.is_err() {
        // The supervisor would kill the tree on a signal, but it may be stopped or slow
        // (CMD may signal its parent): as the subreaper above it, kill it all ourselves.
        let _ = kill(pid, KILL_TREE_SIGNAL);
        crate::supervise::kill_descendants(Some(pid));
        let _ = child.wait().await;
    }
    if !outlived_by_nothing() {
        guard.abandon();
    } else if let Err(e) = guard.release().await {
        eprintln!("leasehold: {e}");
    }
}

/// Tell CMD's supervisor its deadline, as `guard`'s last renewal sets it.
fn tell_deadline(started: &Started, guard: &Guard) {
    started.tell_deadline(command_left(
        guard.valid_until(),
        guard.lease_duration(),
        Instant::now(),
    ));
}

/// How long from `now` CMD may run at most: until its deadline
/// ([`crate::protocol::timing::command_dead_by`] the last successful renewal:
/// `valid_until`, the holder's stop, plus the safety margin), which its supervisor keeps
/// too ([`Started::tell_deadline`]).
fn command_left(valid_until: Instant, lease: Duration, now: Instant) -> Duration {
    (valid_until + safety_margin(lease)).saturating_duration_since(now)
}

/// How long CMD may take over SIGTERM before SIGKILL, its grant lost at `now`: the
/// safety margin, but no longer than [`command_left`]. A loss noticed late (the process
/// paused, a frozen pod, a starved runtime) leaves less, or none: the lock may have
/// passed on already.
fn kill_grace(valid_until: Instant, lease: Duration, now: Instant) -> Duration {
    command_left(valid_until, lease, now).min(safety_margin(lease))
}

/// How CMD's end became known.
enum Ended {
    /// The supervisor reported CMD's exit code: CMD left nothing of its tree behind.
    Reported(u8),
    /// The supervisor exited (with CMD's status, or killed) without a report.
    Exited(std::process::ExitStatus),
    /// The grant was lost while CMD ran.
    Lost,
}

/// CMD's supervisor (`child`) reported CMD's end with nothing of its tree left: release
/// at once; then, after [`EXIT_SETTLE`], let the supervisor go (closing the report pipe
/// it waits on) and reap it.
async fn release_reported(guard: Guard, started: Started, child: &mut Child) {
    release(guard).await;
    // The release is done (or failed, and the claim expires): give the CPU to the next
    // holder's start before our own exit's work, and the supervisor's.
    tokio::time::sleep(EXIT_SETTLE).await;
    drop(started);
    if tokio::time::timeout(KILL_TIMEOUT, child.wait()).await.is_err() {
        let _ = child.kill().await;
    }
    // Off the handoff: should anything of CMD's have been re-parented to us after all
    // (a report it forged as root), it dies with us, not after.
    outlived_by_nothing();
}

/// Give the grant back after CMD's work is done.
async fn release(guard: Guard) {
    if let Err(e) = guard.release_retrying(RELEASE_TRIES).await {
        // CMD's work is done: its status is ours. The claim expires within a lease.
        eprintln!("leasehold: {e}; the claim will expire instead");
    }
}

/// The line printed while waiting, on each [`WaitEvent`].
pub fn notice(event: &WaitEvent, lock: &str, ns: &str) -> String {
    match event {
        WaitEvent::Queued(w) => format!(
            "leasehold: waiting for lock {lock}: position {} in queue, held by {}",
            w.position,
            w.holders.join(", ")
        ),
        WaitEvent::LockMissing => format!(
            "leasehold: lock {lock} does not exist in namespace {ns} (kubectl get distributedlocks -n {ns}); \
             waiting for it to be created"
        ),
        WaitEvent::Unqueued { claim, waited } => format!(
            "leasehold: no controller has queued claim {claim} for lock {lock} within {}s: is the leasehold \
             controller running (kubectl get pods -l app.kubernetes.io/name=leasehold -A)?",
            waited.as_secs()
        ),
    }
}

/// Kill whatever of CMD's tree is left (re-parented to us); true when nothing is, so
/// the release may be written. Otherwise the claim is left to expire: by then the
/// controller counts a lease, and the processes that would not die are not our grant's.
fn outlived_by_nothing() -> bool {
    let clean = crate::supervise::kill_descendants(None);
    if !clean {
        eprintln!("leasehold: processes of the command did not die; not releasing: the claim will expire");
    }
    clean
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The SIGTERM grace ends by CMD's deadline: the whole margin for a loss noticed on
    /// time (at the holder's stop), less for one noticed late, none past the deadline.
    #[test]
    fn the_kill_grace_ends_by_the_commands_deadline() {
        let lease = Duration::from_secs(8); // a margin of 2 s
        let stop = Instant::now() + Duration::from_secs(60);
        let grace = |after_stop: i64| {
            let now = if after_stop >= 0 {
                stop + Duration::from_millis(after_stop as u64)
            } else {
                stop - Duration::from_millis(-after_stop as u64)
            };
            kill_grace(stop, lease, now).as_millis()
        };
        assert_eq!(grace(-30_000), 2_000, "revoked early: the whole margin");
        assert_eq!(grace(0), 2_000, "at the stop: the whole margin");
        assert_eq!(grace(1_500), 500, "noticed late: what is left");
        assert_eq!(grace(2_000), 0, "at the deadline: none");
        assert_eq!(grace(60_000), 0, "resumed a minute late: none");
    }
}
