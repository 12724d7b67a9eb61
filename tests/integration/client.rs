//! The in-pod client library and `leasehold run` against the real API server.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use leasehold::client::Lock;
use leasehold::protocol::claim::PodIdentity;
use tokio::process::{Child, Command};

use crate::support::*;

/// The lease of the handoff tests below. Short, so that a hold-back or an expiry costs
/// little; not shorter, because a holder renews every lease/3 and stops at 3/4 of its
/// lease after its last acknowledged renewal, and CMD gets SIGKILL a quarter-lease after
/// SIGTERM: at 6 s an API call or a wake-up may take 1.5 s on a loaded machine before a
/// live holder gives its grant up (at 3 s, 0.75 s was seen to be too little).
const LEASE: i32 = 6;

/// A scratch dir for one test's shared log and the runs' stderr.
pub(crate) fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("leasehold-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Start `leasehold run` as `pod` with `script` (sh) as CMD; `$LOG` is the shared log.
pub(crate) fn run(
    kubeconfig: &Path,
    ns: &TestNs,
    pod: &PodIdentity,
    dir: &Path,
    extra: &[&str],
    script: &str,
) -> Child {
    run_with_env(kubeconfig, ns, pod, dir, extra, &[], script)
}

/// [`run`] with extra environment variables.
pub(crate) fn run_with_env(
    kubeconfig: &Path,
    ns: &TestNs,
    pod: &PodIdentity,
    dir: &Path,
    extra: &[&str],
    env: &[(&str, &str)],
    script: &str,
) -> Child {
    let stderr = std::fs::File::create(dir.join(format!("{}.stderr", pod.name))).unwrap();
    Command::new(LEASEHOLD)
        .arg("run")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["--lock", "l", "--namespace", &ns.name])
        .args(extra)
        .args(["--", "sh", "-c", script])
        .env("POD_NAME", &pod.name)
        .env("POD_NAMESPACE", &pod.namespace)
        .env("POD_UID", &pod.uid)
        .env("LOG", dir.join("log"))
        .env("RUST_LOG", "warn")
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(stderr)
        .kill_on_drop(true)
        .spawn()
        .expect("spawn leasehold run")
}

/// The shared log's lines, split into words.
pub(crate) fn log(dir: &Path) -> Vec<Vec<String>> {
    let text = std::fs::read_to_string(dir.join("log")).unwrap_or_default();
    text.lines()
        .map(|l| l.split_whitespace().map(String::from).collect())
        .collect()
}

pub(crate) async fn wait_log(dir: &Path, what: &str, pred: impl Fn(&[Vec<String>]) -> bool) {
    wait_for(what, DEADLINE, || async { pred(&log(dir)).then_some(()) }).await;
}

pub(crate) const SECTION: &str = r#"echo start $LEASEHOLD_FENCING_TOKEN $POD_NAME >> $LOG; sleep 0.3; echo end $LEASEHOLD_FENCING_TOKEN $POD_NAME >> $LOG"#;
/// A holder that runs until SIGTERM, logging the signal.
pub(crate) const UNTIL_TERM: &str = r#"trap 'echo term $LEASEHOLD_FENCING_TOKEN $POD_NAME >> $LOG; exit 0' TERM; echo start $LEASEHOLD_FENCING_TOKEN $POD_NAME $$ >> $LOG; while true; do sleep 0.1; done"#;

/// A holder whose CMD is a shell that leaves a ticking grandchild behind when it dies.
pub(crate) const FORKING: &str = r#"echo start $LEASEHOLD_FENCING_TOKEN $POD_NAME $$ >> $LOG; sh -c 'while :; do echo tick >> $LOG; sleep 0.1; done' & wait"#;
/// A holder whose CMD ignores SIGTERM (and so do its children): only SIGKILL stops it.
const STUBBORN: &str = r#"trap '' TERM; echo start $LEASEHOLD_FENCING_TOKEN $POD_NAME $$ >> $LOG; while :; do echo tick >> $LOG; sleep 0.1; done"#;
/// A one-second section, long enough for a leftover ticker to show up inside it.
const LONG_SECTION: &str = r#"echo start $LEASEHOLD_FENCING_TOKEN $POD_NAME >> $LOG; sleep 1; echo end $LEASEHOLD_FENCING_TOKEN $POD_NAME >> $LOG"#;

/// The log's lines after b's start: none may be a tick of a's leftover process.
fn ticks_after_b_started(dir: &Path) -> usize {
    let lines = log(dir);
    let b = lines
        .iter()
        .position(|l| l[0] == "start" && l[2] == "b")
        .expect("b started");
    lines[b..].iter().filter(|l| l[0] == "tick").count()
}

/// Holder a running `script` (which logs ticks) and a waiting b (one-second section) on
/// lock l.
async fn ticking_holder_and_waiter(ns: &TestNs, dir: &Path, script: &str) -> (Child, Child) {
    let (a, b) = (ns.pod("a").await, ns.pod("b").await);
    let run_a = run(kubeconfig(), ns, &a, dir, &[], script);
    wait_log(dir, "a ticks", |l| l.iter().any(|l| l[0] == "tick")).await;
    let run_b = run(kubeconfig(), ns, &b, dir, &[], LONG_SECTION);
    ns.wait_lock("l", "b waits", |l| queue(l) == ["b"]).await;
    (run_a, run_b)
}

#[tokio::test]
async fn forced_release_stops_the_children_of_a_forking_cmd_too() {
    let ns = TestNs::new("forkrel").await;
    let _c = spawn_controller(&ns, "forkrel");
    ns.lock("l", spec(LEASE)).await;
    let dir = scratch("forkrel");
    let (mut run_a, mut run_b) = ticking_holder_and_waiter(&ns, &dir, FORKING).await;
    let claim_a = holder_claim(&ns, "l").await;
    leases(&ns).delete(&claim_a, &Default::default()).await.unwrap();
    a_lost_then_b_ran_alone(&mut run_a, &mut run_b, &dir).await;
}

#[tokio::test]
async fn sigkill_of_the_supervisor_leaves_nothing_of_cmd_running_past_the_release() {
    let ns = TestNs::new("forksup").await;
    let _c = spawn_controller(&ns, "forksup");
    ns.lock("l", spec(LEASE)).await;
    let dir = scratch("forksup");
    let (mut run_a, mut run_b) = ticking_holder_and_waiter(&ns, &dir, FORKING).await;
    // CMD's parent is the supervisor: kill it as the OOM killer would.
    let cmd_pid: i32 = log(&dir)[0][3].parse().unwrap();
    let stat = std::fs::read_to_string(format!("/proc/{cmd_pid}/stat")).unwrap();
    let supervisor: i32 = stat
        .rsplit(')')
        .next()
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(supervisor),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let status = tokio::time::timeout(DEADLINE, run_a.wait()).await.unwrap().unwrap();
    assert_eq!(
        status.code(),
        Some(128 + 9),
        "run reports how its command's supervisor ended"
    );
    assert!(run_b.wait().await.unwrap().success());
    assert_eq!(ticks_after_b_started(&dir), 0, "a's CMD ran on after b started");
}

#[tokio::test]
async fn a_pending_supervisor_starts_cmd_with_the_sent_environment_or_never() {
    let exe = PathBuf::from(LEASEHOLD);
    let spawn = |script: &str| {
        let (mut cmd, pending) = leasehold::supervise::pending_command(&exe, "sh").unwrap();
        cmd.args(["-c", script]).stdout(Stdio::piped());
        (cmd.spawn().unwrap(), pending)
    };
    let (mut child, pending) = spawn(
        "echo token=$TOKEN; for fd in 3 4; do [ -e /proc/$$/fd/$fd ] && echo fd$fd-open || echo fd$fd-closed; done; exit 7",
    );
    let mut started = pending.start(&[("TOKEN", "42")]).unwrap();
    assert_eq!(
        started.exited().await,
        Some(7),
        "the supervisor reports CMD's exit code"
    );
    // Having reported, it stays (so its exit does not compete with the next holder's
    // start) until its parent closes the report pipe, and then exits at once.
    assert!(
        tokio::time::timeout(Duration::from_millis(500), child.wait())
            .await
            .is_err(),
        "the supervisor exited while its report pipe was still open"
    );
    drop(started);
    let out = tokio::time::timeout(DEADLINE, child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(7));
    // CMD got the token, and neither the start nor the report pipe (the supervisor's
    // fds 3 and 4).
    assert_eq!(text, "token=42\nfd3-closed\nfd4-closed\n");
    // Never started: the supervisor exits 125 without running CMD.
    let (child, pending) = spawn("echo ran");
    drop(pending);
    let out = child.wait_with_output().await.unwrap();
    assert_eq!(out.status.code(), Some(125));
    assert!(out.stdout.is_empty(), "CMD ran though never started");
}

/// The supervisor reports CMD's end only when CMD left nothing of its tree behind (no
/// /proc walk needed to know): a background job CMD left running is killed, and the
/// supervisor's exit, not a report, tells its parent.
#[tokio::test]
async fn the_supervisor_reports_cmds_end_only_when_it_left_nothing_behind() {
    let dir = scratch("report");
    let exe = PathBuf::from(LEASEHOLD);
    let (mut cmd, pending) = leasehold::supervise::pending_command(&exe, "sh").unwrap();
    let job = dir.join("job.pid");
    cmd.args(["-c", &format!("sleep 600 & echo $! > {}; exit 0", job.display())]);
    let mut supervisor = cmd.spawn().unwrap();
    drop(cmd);
    let mut started = pending.start(&[]).unwrap();
    assert_eq!(started.exited().await, None, "a report though CMD left a job behind");
    assert!(supervisor.wait().await.unwrap().success());
    let job: i32 = std::fs::read_to_string(&job).unwrap().trim().parse().unwrap();
    let state = std::fs::read_to_string(format!("/proc/{job}/stat")).unwrap_or_default();
    let state = state.rsplit(')').next().unwrap_or("").trim_start().chars().next();
    assert!(
        matches!(state, None | Some('Z' | 'X')),
        "CMD's background job still runs ({state:?}) after its supervisor exited"
    );
    // A supervisor killed before it could report: no report, at once, from then on.
    // (CMD, `cat` on the supervisor's stdin, ends when the test closes that.)
    let (mut cmd, pending) = leasehold::supervise::pending_command(&exe, "cat").unwrap();
    cmd.stdin(Stdio::piped()).stdout(Stdio::null());
    let mut supervisor = cmd.spawn().unwrap();
    drop(cmd);
    let stdin = supervisor.stdin.take();
    let mut started = pending.start(&[]).unwrap();
    supervisor.start_kill().unwrap();
    assert_eq!(started.exited().await, None);
    assert!(!started.reporting());
    assert_eq!(started.exited().await, None);
    supervisor.wait().await.unwrap();
    drop(stdin);
}

/// CMD cannot forge the supervisor's report: a CMD with its supervisor's user and
/// capabilities but no CAP_SYS_PTRACE (root here, with that one dropped from both) that
/// writes `exited 9` to every descriptor of its supervisor's it can open through
/// /proc/$PPID/fd reaches none (having left a job behind, CMD gets no report from the
/// supervisor either).
#[tokio::test]
async fn cmd_cannot_forge_its_supervisors_report() {
    use std::os::unix::fs::PermissionsExt;
    let dir = scratch("forge");
    // The supervisor (and so CMD) without CAP_SYS_PTRACE.
    let exe = dir.join("leasehold-without-ptrace");
    std::fs::write(
        &exe,
        format!("#!/bin/sh\nexec setpriv --bounding-set -sys_ptrace {LEASEHOLD} \"$@\"\n"),
    )
    .unwrap();
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    let job = dir.join("job.pid");
    let script = format!(
        "sleep 600 & echo $! > {}; for f in /proc/$PPID/fd/*; do case ${{f##*/}} in 0|1|2) ;; *) echo 'exited 9' > $f ;; esac; done 2>/dev/null; exit 0",
        job.display()
    );
    let (mut cmd, pending) = leasehold::supervise::pending_command(&exe, "sh").unwrap();
    cmd.args(["-c", &script]).stdout(Stdio::null());
    let mut supervisor = cmd.spawn().unwrap();
    drop(cmd);
    let mut started = pending.start(&[]).unwrap();
    // CMD left a job behind, so the supervisor itself reports nothing.
    assert_eq!(
        started.exited().await,
        None,
        "a report CMD wrote was taken for the supervisor's"
    );
    assert!(supervisor.wait().await.unwrap().success());
    let job: i32 = std::fs::read_to_string(&job).unwrap().trim().parse().unwrap();
    let state = std::fs::read_to_string(format!("/proc/{job}/stat")).unwrap_or_default();
    let state = state.rsplit(')').next().unwrap_or("").trim_start().chars().next();
    assert!(matches!(state, None | Some('Z' | 'X')), "CMD's job runs ({state:?})");
}

/// The first child process `pid` has.
fn first_child(pid: u32) -> u32 {
    let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap();
    children
        .split_whitespace()
        .next()
        .unwrap_or_else(|| panic!("process {pid} has no child"))
        .parse()
        .unwrap()
}

/// The lock ends free, and b's CMD never logged a start (`why` if it did).
async fn lock_freed_and_b_never_started(ns: &TestNs, dir: &Path, why: &str) {
    ns.wait_lock("l", "the lock to be free", |l| {
        holders(l).is_empty() && queue(l).is_empty()
    })
    .await;
    assert!(!log(dir).iter().any(|l| l[0] == "start" && l[2] == "b"), "{why}");
}

/// Whether process `pid` is gone (or a zombie).
fn dead(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat
        .rsplit(')')
        .next()
        .and_then(|t| t.split_whitespace().next().map(String::from));
    matches!(state.as_deref(), None | Some("Z" | "X"))
}

#[tokio::test]
async fn sigkill_of_a_waiting_run_leaves_neither_supervisor_nor_cmd() {
    let ns = TestNs::new("waitkill").await;
    let _c = spawn_controller(&ns, "waitkill");
    ns.lock("l", spec(LEASE)).await;
    let dir = scratch("waitkill");
    let (mut run_a, mut run_b) = ticking_holder_and_waiter(&ns, &dir, FORKING).await;
    // b waits with its supervisor, and CMD's process waiting to exec, started ahead
    // of the grant.
    let supervisor = first_child(run_b.id().unwrap());
    let pending = first_child(supervisor);
    run_b.kill().await.unwrap();
    wait_for("the pending supervisor and CMD to die", DEADLINE, || async {
        (dead(supervisor) && dead(pending)).then_some(())
    })
    .await;
    run_a.kill().await.unwrap();
    lock_freed_and_b_never_started(&ns, &dir, "b's CMD ran though b was killed while waiting").await;
}

#[tokio::test]
async fn sigkill_of_a_waiting_supervisor_kills_the_pending_cmd_and_run_never_starts_it() {
    let ns = TestNs::new("pendkill").await;
    let _c = spawn_controller(&ns, "pendkill");
    ns.lock("l", spec(LEASE)).await;
    let dir = scratch("pendkill");
    let (mut run_a, mut run_b) = ticking_holder_and_waiter(&ns, &dir, FORKING).await;
    let supervisor = first_child(run_b.id().unwrap());
    let pending = first_child(supervisor);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(supervisor as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    // The pending process dies with its supervisor (its parent-death signal), so no
    // start message can reach it; b, granted, finds no one to start and releases.
    wait_for("the pending CMD to die with its supervisor", DEADLINE, || async {
        dead(pending).then_some(())
    })
    .await;
    run_a.kill().await.unwrap();
    let status = tokio::time::timeout(DEADLINE, run_b.wait()).await.unwrap().unwrap();
    assert_eq!(status.code(), Some(125), "b could not start CMD: its own error");
    lock_freed_and_b_never_started(&ns, &dir, "b's CMD ran though its supervisor was killed while waiting").await;
}

#[tokio::test]
async fn sigkill_of_run_kills_the_children_of_a_forking_cmd_too() {
    let ns = TestNs::new("forkkill").await;
    let _c = spawn_controller(&ns, "forkkill");
    ns.lock("l", spec(LEASE)).await;
    let dir = scratch("forkkill");
    let (mut run_a, mut run_b) = ticking_holder_and_waiter(&ns, &dir, FORKING).await;
    run_a.kill().await.unwrap();
    assert!(run_b.wait().await.unwrap().success());
    assert_eq!(ticks_after_b_started(&dir), 0, "a's grandchild ran on after b started");
}

/// A holder that takes 3 s to stop after SIGTERM.
const SLOW_TERM: &str = r#"trap 'echo term $LEASEHOLD_FENCING_TOKEN $POD_NAME >> $LOG; sleep 3; echo end $LEASEHOLD_FENCING_TOKEN $POD_NAME >> $LOG; exit 0' TERM; echo start $LEASEHOLD_FENCING_TOKEN $POD_NAME $$ >> $LOG; while true; do sleep 0.1; done"#;

/// a's run exits with the lost-lock status, b's run succeeds, and the shared log shows
/// `order` (`<kind> <pod>` per line): a's CMD stopped before b's started.
pub(crate) async fn a_lost_then_b_ran(run_a: &mut Child, run_b: &mut Child, dir: &Path, order: &[&str]) {
    let wait = Duration::from_secs(60);
    let status = tokio::time::timeout(wait, run_a.wait()).await.unwrap().unwrap();
    assert_eq!(status.code(), Some(76), "a's run exits with the lost-lock status");
    let status = tokio::time::timeout(wait, run_b.wait()).await.unwrap().unwrap();
    assert!(status.success(), "b's run succeeds");
    let seen: Vec<_> = log(dir).iter().map(|l| format!("{} {}", l[0], l[2])).collect();
    assert_eq!(seen, order, "a stopped before b started");
}

/// a's run exits with the lost-lock status, b's run succeeds, and nothing of a's CMD
/// (its leftover children included) wrote to the log after b's CMD started.
async fn a_lost_then_b_ran_alone(run_a: &mut Child, run_b: &mut Child, dir: &Path) {
    let wait = Duration::from_secs(60);
    let status = tokio::time::timeout(wait, run_a.wait()).await.unwrap().unwrap();
    assert_eq!(status.code(), Some(76), "a's run exits with the lost-lock status");
    let status = tokio::time::timeout(wait, run_b.wait()).await.unwrap().unwrap();
    assert!(status.success(), "b's run succeeds");
    assert_eq!(ticks_after_b_started(dir), 0, "a's CMD ran on after b started");
}

/// Pod a holds the lock in `leasehold run` (its CMD runs until SIGTERM; `a_kubeconfig`
/// lets it go through a proxy), and pod b waits in `leasehold run` with a short section.
async fn holder_and_waiter(ns: &TestNs, dir: &Path, a_kubeconfig: &Path) -> (Child, Child) {
    let (a, b) = (ns.pod("a").await, ns.pod("b").await);
    let run_a = run(a_kubeconfig, ns, &a, dir, &[], UNTIL_TERM);
    wait_log(dir, "a starts", |l| l.len() == 1).await;
    let run_b = run(kubeconfig(), ns, &b, dir, &[], SECTION);
    ns.wait_lock("l", "b waits", |l| queue(l) == ["b"]).await;
    (run_a, run_b)
}

#[tokio::test]
async fn eight_runs_take_turns_in_request_order_with_increasing_tokens() {
    let ns = TestNs::new("eight").await;
    let _c = spawn_controller(&ns, "eight");
    ns.lock("l", spec(15)).await;
    let dir = scratch("eight");
    let mut children = Vec::new();
    for i in 0..8 {
        let pod = ns.pod(&format!("r{i}")).await;
        children.push(run(kubeconfig(), &ns, &pod, &dir, &[], SECTION));
        // Request order is the order in which the controller saw the claims.
        ns.wait_lock("l", "claim seen", |l| {
            // Every claim seen so far was either granted (one token each) or is queued
            // (the successor's reserved token is not a grant: it is counted as queued).
            let st = l.status.clone().unwrap_or_default();
            last_granted(l) as usize + st.queue.len() > i
        })
        .await;
    }
    for mut c in children {
        let status = tokio::time::timeout(Duration::from_secs(60), c.wait())
            .await
            .unwrap()
            .unwrap();
        assert!(status.success(), "leasehold run exited with {status}");
    }
    let text = std::fs::read_to_string(dir.join("log")).unwrap();
    let summary = leasehold::testing::check::check_sections(&text, 1, false).unwrap_or_else(|e| panic!("{e}:\n{text}"));
    let expected: Vec<String> = (0..8).map(|i| format!("r{i}")).collect();
    assert_eq!(summary.order, expected, "grant order equals request order");
    assert_eq!(summary.tokens.len(), 8);
}

#[tokio::test]
async fn run_exits_125_for_its_own_errors_not_as_a_command_would() {
    let ns = TestNs::new("own").await;
    let out = Command::new(LEASEHOLD)
        .arg("run")
        .arg("--kubeconfig")
        .arg(kubeconfig())
        .args(["--lock", "l", "--namespace", &ns.name, "--", "true"])
        .env("POD_NAME", "p")
        .env_remove("POD_UID")
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("POD_UID"), "the error names what is missing: {stderr}");
}

#[tokio::test]
async fn run_times_out_with_status_75_and_withdraws_its_claim() {
    let ns = TestNs::new("timeout").await;
    let _c = spawn_controller(&ns, "timeout");
    ns.lock("l", spec(15)).await;
    let holder = ns.pod("holder").await;
    let lock = Lock::builder(ns.client.clone(), &ns.name, "l")
        .identity(holder)
        .build()
        .unwrap();
    let guard = lock.acquire().await.unwrap();
    let dir = scratch("timeout");
    let waiter = ns.pod("waiter").await;
    let started = Instant::now();
    // Time enough for the controller to queue the claim and the run to see it, under load
    // (the assumption: within 8 s; the elapsed time checked below is a lower bound).
    let status = run(kubeconfig(), &ns, &waiter, &dir, &["--timeout", "8s"], "exit 0")
        .wait()
        .await
        .unwrap();
    assert_eq!(status.code(), Some(75));
    assert!(started.elapsed() >= Duration::from_secs(8));
    assert!(log(&dir).is_empty(), "CMD never ran");
    let stderr = std::fs::read_to_string(dir.join("waiter.stderr")).unwrap();
    assert!(
        stderr.contains("position 1 in queue"),
        "prints its queue position: {stderr}"
    );
    ns.wait_lock("l", "the withdrawn claim leaves the queue", |l| queue(l).is_empty())
        .await;
    guard.release().await.unwrap();
}

#[tokio::test]
async fn try_acquire_and_reentrancy() {
    let ns = TestNs::new("try").await;
    let _c = spawn_controller(&ns, "try");
    ns.lock("l", spec(15)).await;
    let (a, b) = (ns.pod("a").await, ns.pod("b").await);
    let lock_a = Lock::builder(ns.client.clone(), &ns.name, "l")
        .identity(a)
        .build()
        .unwrap();
    let lock_b = Lock::builder(ns.client.clone(), &ns.name, "l")
        .identity(b)
        .build()
        .unwrap();

    let g1 = lock_a
        .try_acquire()
        .await
        .unwrap()
        .expect("a free lock is granted at once");
    let g2 = lock_a.acquire().await.expect("reentrant acquire succeeds at once");
    assert_eq!(g1.fencing_token(), g2.fencing_token(), "one grant, counted twice");
    assert_eq!(g1.claim(), g2.claim());

    assert!(lock_b.try_acquire().await.unwrap().is_none(), "b would have to wait");
    ns.wait_lock("l", "b's withdrawn claim leaves the queue", |l| queue(l).is_empty())
        .await;

    g1.release().await.unwrap();
    let l = ns
        .wait_lock("l", "a still holds after one release", |l| holders(l) == ["a"])
        .await;
    assert_eq!(tokens(&l), [g2.fencing_token() - epoch(&l)]);
    let last = g2.fencing_token();
    g2.release().await.unwrap();
    ns.wait_lock("l", "the last release frees the lock", |l| holders(l).is_empty())
        .await;

    let gb = lock_b.try_acquire().await.unwrap().expect("now b gets it at once");
    assert!(gb.fencing_token() > last);
    gb.release().await.unwrap();
}

#[tokio::test]
async fn forced_release_stops_cmd_before_the_next_holder_starts() {
    let ns = TestNs::new("forcedrun").await;
    let _c = spawn_controller(&ns, "forcedrun");
    ns.lock("l", spec(LEASE)).await;
    let dir = scratch("forcedrun");
    let (mut run_a, mut run_b) = holder_and_waiter(&ns, &dir, kubeconfig()).await;
    let claim_a = holder_claim(&ns, "l").await;
    leases(&ns)
        .delete(&claim_a, &Default::default())
        .await
        .expect("admin deletes a's claim");
    let status = tokio::time::timeout(DEADLINE, run_a.wait()).await.unwrap().unwrap();
    assert_eq!(status.code(), Some(76), "run exits with the lost-lock status");
    assert!(run_b.wait().await.unwrap().success());
    let lines = log(&dir);
    let order: Vec<_> = lines.iter().map(|l| format!("{} {}", l[0], l[2])).collect();
    assert_eq!(
        order,
        ["start a", "term a", "start b", "end b"],
        "a was stopped before b started"
    );
}

#[tokio::test]
async fn partition_stops_cmd_before_the_lock_passes_on_after_expiry() {
    let ns = TestNs::new("partition").await;
    let _c = spawn_controller(&ns, "partition");
    ns.lock("l", spec(LEASE)).await;
    let dir = scratch("partition");
    let (proxy, proxied) = proxied_kubeconfig(&dir).await;
    let (mut run_a, mut run_b) = holder_and_waiter(&ns, &dir, &proxied).await;
    proxy.cut();
    a_lost_then_b_ran(&mut run_a, &mut run_b, &dir, &["start a", "term a", "start b", "end b"]).await;
}

#[tokio::test]
async fn a_cut_off_holder_stops_before_the_lock_passes_on_across_a_controller_restart() {
    let ns = TestNs::new("partrestart").await;
    let controller = spawn_controller(&ns, "partrestart-1");
    ns.lock("l", spec(LEASE)).await;
    let dir = scratch("partrestart");
    let (proxy, proxied) = proxied_kubeconfig(&dir).await;
    let (mut run_a, mut run_b) = holder_and_waiter(&ns, &dir, &proxied).await;
    proxy.cut();
    // The controller restarts while a is cut off: the new one rebuilds its view from
    // the API and must still wait for a's claim to expire.
    controller.stop().await;
    let _c = spawn_controller(&ns, "partrestart-2");
    a_lost_then_b_ran(&mut run_a, &mut run_b, &dir, &["start a", "term a", "start b", "end b"]).await;
}

#[tokio::test]
async fn black_holed_holder_with_a_slow_cmd_stops_before_the_lock_passes_on() {
    let ns = TestNs::new("blackhole").await;
    let _c = spawn_controller(&ns, "blackhole");
    ns.lock("l", spec(15)).await;
    let dir = scratch("blackhole");
    let (proxy, proxied) = proxied_kubeconfig(&dir).await;
    let (a, b) = (ns.pod("a").await, ns.pod("b").await);
    let mut run_a = run(&proxied, &ns, &a, &dir, &[], SLOW_TERM);
    wait_log(&dir, "a starts", |l| l.len() == 1).await;
    let mut run_b = run(kubeconfig(), &ns, &b, &dir, &[], SECTION);
    ns.wait_lock("l", "b waits", |l| queue(l) == ["b"]).await;
    // Packets vanish; a's sockets stay open, so its requests hang until they time out.
    proxy.black_hole();
    a_lost_then_b_ran(
        &mut run_a,
        &mut run_b,
        &dir,
        &["start a", "term a", "end a", "start b", "end b"],
    )
    .await;
}

#[tokio::test]
async fn force_deleted_pod_of_a_cut_off_holder_stops_cmd_before_the_next_starts() {
    let ns = TestNs::new("forcedelrun").await;
    let _c = spawn_controller(&ns, "forcedelrun");
    ns.lock("l", spec(LEASE)).await;
    let dir = scratch("forcedelrun");
    let (proxy, proxied) = proxied_kubeconfig(&dir).await;
    let (mut run_a, mut run_b) = holder_and_waiter(&ns, &dir, &proxied).await;
    // The node stops answering; an operator force-deletes its pod.
    proxy.black_hole();
    let grace0 = kube::api::DeleteParams {
        grace_period_seconds: Some(0),
        ..Default::default()
    };
    ns.pods().delete("a", &grace0).await.unwrap();
    a_lost_then_b_ran(&mut run_a, &mut run_b, &dir, &["start a", "term a", "start b", "end b"]).await;
}

#[tokio::test]
async fn hold_back_after_a_forced_release_lasts_the_holders_lease_not_the_edited_one() {
    let ns = TestNs::new("holdlease").await;
    let _c = spawn_controller(&ns, "holdlease");
    ns.lock("l", spec(20)).await;
    let dir = scratch("holdlease");
    // a's CMD ignores SIGTERM: only the SIGKILL a margin (5 s) after loss stops it.
    let (mut run_a, mut run_b) = ticking_holder_and_waiter(&ns, &dir, STUBBORN).await;
    // The lock is edited to a short lease, then a's claim is taken away.
    let patch = serde_json::json!({"spec": {"leaseDurationSeconds": 1}});
    ns.locks()
        .patch("l", &Default::default(), &kube::api::Patch::Merge(&patch))
        .await
        .unwrap();
    let claim_a = holder_claim(&ns, "l").await;
    leases(&ns).delete(&claim_a, &Default::default()).await.unwrap();
    a_lost_then_b_ran_alone(&mut run_a, &mut run_b, &dir).await;
}

#[tokio::test]
async fn a_forged_release_mark_does_not_let_the_next_holder_in_early() {
    let ns = TestNs::new("forge").await;
    let _c = spawn_controller(&ns, "forge");
    ns.lock("l", spec(LEASE)).await;
    let dir = scratch("forge");
    let (mut run_a, mut run_b) = ticking_holder_and_waiter(&ns, &dir, STUBBORN).await;
    let claim_a = holder_claim(&ns, "l").await;
    // A neighbour with patch rights on Leases writes a release mark, with a hash of
    // its own choosing to match (`kubectl annotate lease ... leasehold.dev/released=...`).
    let forged = serde_json::json!({"metadata": {"annotations": {
        "leasehold.dev/release-hash": leasehold::protocol::release::hash_of("mine"),
        "leasehold.dev/released": "mine",
    }}});
    leases(&ns)
        .patch(&claim_a, &Default::default(), &kube::api::Patch::Merge(&forged))
        .await
        .unwrap();
    a_lost_then_b_ran_alone(&mut run_a, &mut run_b, &dir).await;
    wait_event(&ns, &claim_a, "ForgedRelease").await;
}

/// A holder's pod frozen past its deadline (a cgroup freeze, a paused VM: `leasehold
/// run`, its supervisor and CMD stopped alike) while the lock passes on: once thawed,
/// `leasehold run` finds its grant lost with no time left, and kills CMD at once.
/// Before, it gave CMD the whole SIGTERM grace (a quarter of the lease) and then the
/// supervisor up to five seconds more, while the next holder ran.
#[tokio::test]
async fn a_run_thawed_past_its_deadline_kills_its_command_at_once() {
    use nix::sys::signal::{Signal, kill, killpg};
    use nix::unistd::Pid;

    let ns = TestNs::new("thaw").await;
    let _c = spawn_controller(&ns, "thaw");
    ns.lock("l", spec(LEASE)).await;
    let dir = scratch("thaw");
    let (mut run_a, mut run_b) = ticking_holder_and_waiter(&ns, &dir, STUBBORN).await;
    let run_pid = run_a.id().unwrap();
    let supervisor = first_child(run_pid);
    let cmd: i32 = log(&dir)[0][3].parse().unwrap();
    let frozen = [Pid::from_raw(run_pid as i32), Pid::from_raw(supervisor as i32)];
    killpg(Pid::from_raw(cmd), Signal::SIGSTOP).unwrap();
    for pid in frozen {
        kill(pid, Signal::SIGSTOP).unwrap();
    }
    // a's claim expires, and b runs its section.
    wait_log(&dir, "b starts", |l| l.iter().any(|l| l[0] == "start" && l[2] == "b")).await;
    kill(frozen[0], Signal::SIGCONT).unwrap();
    let thawed = Instant::now();
    wait_for("a's CMD to die", DEADLINE, || async { dead(cmd as u32).then_some(()) }).await;
    let margin = leasehold::protocol::timing::safety_margin(Duration::from_secs(LEASE as u64));
    assert!(
        thawed.elapsed() < margin / 2,
        "a's CMD lived {:?} past the thaw, its deadline long gone (the SIGTERM grace is {margin:?})",
        thawed.elapsed()
    );
    let _ = kill(frozen[1], Signal::SIGCONT);
    let _ = killpg(Pid::from_raw(cmd), Signal::SIGCONT);
    a_lost_then_b_ran_alone(&mut run_a, &mut run_b, &dir).await;
}

/// A holder's `leasehold run` stopped alone (SIGSTOP of its pid: its supervisor and CMD
/// run on) past its deadline: the supervisor kills CMD's tree by the deadline it was
/// told, before the controller may pass the lock on. Before, CMD ran beside the next
/// holder until `leasehold run` resumed.
#[tokio::test]
async fn a_run_stopped_alone_has_its_command_killed_by_its_supervisor_at_the_deadline() {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;

    let ns = TestNs::new("stopped").await;
    let _c = spawn_controller(&ns, "stopped");
    ns.lock("l", spec(LEASE)).await;
    let dir = scratch("stopped");
    let (mut run_a, mut run_b) = ticking_holder_and_waiter(&ns, &dir, STUBBORN).await;
    let cmd: u32 = log(&dir)[0][3].parse().unwrap();
    let run_pid = Pid::from_raw(run_a.id().unwrap() as i32);
    kill(run_pid, Signal::SIGSTOP).unwrap();
    // a's claim expires, and b runs its section; a's CMD must be dead by then.
    wait_log(&dir, "b ends", |l| l.iter().any(|l| l[0] == "end" && l[2] == "b")).await;
    assert!(dead(cmd), "a's CMD runs on beside b while a's leasehold run is stopped");
    kill(run_pid, Signal::SIGCONT).unwrap();
    a_lost_then_b_ran_alone(&mut run_a, &mut run_b, &dir).await;
}

#[tokio::test]
async fn sigkill_of_run_kills_cmd_and_the_next_holder_starts_after_expiry() {
    let ns = TestNs::new("sigkill").await;
    let _c = spawn_controller(&ns, "sigkill");
    let lease = LEASE;
    ns.lock("l", spec(lease)).await;
    let dir = scratch("sigkill");
    let (mut run_a, mut run_b) = holder_and_waiter(&ns, &dir, kubeconfig()).await;
    let cmd_pid: i32 = log(&dir)[0][3].parse().unwrap();
    run_a.kill().await.unwrap();
    let killed = Instant::now();
    wait_for("CMD to die with its leasehold run", DEADLINE, || async {
        let stat = std::fs::read_to_string(format!("/proc/{cmd_pid}/stat")).unwrap_or_default();
        (stat.is_empty() || stat.rsplit(')').next().unwrap().trim_start().starts_with('Z')).then_some(())
    })
    .await;
    // (CMD runs until SIGTERM, which nobody sent: it died with its run.)
    wait_log(&dir, "b starts", |l| l.len() >= 2).await;
    assert!(
        killed.elapsed() >= Duration::from_secs(lease as u64),
        "b started before a's claim could expire"
    );
    assert!(run_b.wait().await.unwrap().success());
    let order: Vec<_> = log(&dir).iter().map(|l| format!("{} {}", l[0], l[2])).collect();
    assert_eq!(order, ["start a", "start b", "end b"]);
}

#[tokio::test]
async fn pod_deleted_hands_the_lock_on_promptly() {
    let ns = TestNs::new("poddel").await;
    let _c = spawn_controller(&ns, "poddel");
    ns.lock("l", spec(60)).await;
    let dir = scratch("poddel");
    let (mut run_a, mut run_b) = holder_and_waiter(&ns, &dir, kubeconfig()).await;
    // Play the kubelet: stop the pod's processes, report it, then remove the object.
    run_a.kill().await.unwrap();
    let _ = run_a.wait().await;
    ns.stop_containers("a").await;
    ns.delete_pod("a").await;
    wait_log(&dir, "b starts", |l| l.len() >= 2).await;
    assert!(run_b.wait().await.unwrap().success());
    // Handed on because a's pod went, not by the 60 s expiry (longer than the wait).
    wait_event(&ns, "l", "Revoked").await;
    let revoked: Vec<_> = events(&ns, "l")
        .await
        .into_iter()
        .filter(|(r, _)| r == "Revoked")
        .collect();
    assert!(
        revoked.iter().all(|(_, note)| note.starts_with("PodGone:")),
        "{revoked:?}"
    );
}

/// The client's end of one connection to the API server, read through a loopback
/// forwarder that tells us the client's address; `TCP_NODELAY` read from that socket.
#[tokio::test]
async fn clients_talk_to_the_api_server_on_connections_that_send_without_delay() {
    use std::os::fd::BorrowedFd;

    use nix::sys::socket::{SockaddrIn, getsockname, getsockopt, sockopt::TcpNoDelay};

    let upstream = leasehold::testing::proxy::api_port(kubeconfig()).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let dir = scratch("nodelay");
    let via = dir.join("kubeconfig");
    let text = std::fs::read_to_string(kubeconfig()).unwrap();
    std::fs::write(
        &via,
        text.replace(&format!("127.0.0.1:{upstream}"), &format!("127.0.0.1:{port}")),
    )
    .unwrap();
    let forward = tokio::spawn(async move {
        let (mut down, peer) = listener.accept().await.unwrap();
        let mut up = tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await.unwrap();
        let nodelay = std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
            .find(|fd| getsockname::<SockaddrIn>(*fd).is_ok_and(|a| std::net::SocketAddr::V4(a.into()) == peer))
            // SAFETY: the descriptor was just listed open, and is borrowed for one call.
            .map(|fd| getsockopt(&unsafe { BorrowedFd::borrow_raw(fd) }, TcpNoDelay).unwrap());
        tokio::spawn(async move { tokio::io::copy_bidirectional(&mut down, &mut up).await });
        nodelay
    });
    let client = leasehold::kubeconfig::client_for(&via).await.unwrap();
    // A whole TLS handshake (client certificate included) and a request, through the forwarder.
    client
        .apiserver_version()
        .await
        .expect("the API server answers through the forwarder");
    assert_eq!(
        forward.await.unwrap(),
        Some(true),
        "the client's connection keeps Nagle's algorithm on: its TLS handshake waits for the server's delayed ACK (~40 ms)"
    );
}
