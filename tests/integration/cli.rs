//! The `leasehold` command line against the real API server: `run --try`,
//! `--timeout-exit-code`, the release retry, the messages while waiting, `status -o`
//! and `--context`.

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use leasehold::client::{Guard, Lock};
use tokio::process::Command;

use crate::client::{log, run, scratch, wait_log};
use crate::support::*;

/// How long a `leasehold run` that should exit by itself may take.
const RUN_DEADLINE: Duration = Duration::from_secs(20);
/// A CMD that leaves a trace when it runs.
const TRACE: &str = "echo ran $POD_NAME >> $LOG";

/// Lock l (lease 15 s) held through the library by pod `holder`.
async fn held_lock(ns: &TestNs) -> Guard {
    ns.lock("l", spec(15)).await;
    let lock = Lock::builder(ns.client.clone(), &ns.name, "l")
        .identity(ns.pod("holder").await)
        .build()
        .unwrap();
    lock.acquire().await.unwrap()
}

/// Run `leasehold run` as a new pod `pod` and wait for it to exit; returns its exit code.
async fn run_to_end(ns: &TestNs, pod: &str, dir: &Path, extra: &[&str], script: &str) -> Option<i32> {
    let pod = ns.pod(pod).await;
    let mut child = run(kubeconfig(), ns, &pod, dir, extra, script);
    let status = tokio::time::timeout(RUN_DEADLINE, child.wait())
        .await
        .expect("leasehold run exits by itself")
        .unwrap();
    status.code()
}

fn stderr_of(dir: &Path, pod: &str) -> String {
    std::fs::read_to_string(dir.join(format!("{pod}.stderr"))).unwrap_or_default()
}

/// leasehold's own lines (not its logs) in a run's stderr.
fn own_lines(stderr: &str) -> Vec<&str> {
    stderr.lines().filter(|l| l.starts_with("leasehold:")).collect()
}

async fn wait_stderr(dir: &Path, pod: &str, needle: &str, deadline: Duration) {
    let what = format!("{pod}'s stderr to say {needle:?}");
    wait_for(&what, deadline, || async {
        stderr_of(dir, pod).contains(needle).then_some(())
    })
    .await;
}

#[tokio::test]
async fn run_try_on_a_taken_lock_exits_with_the_timeout_exit_code_and_never_runs_cmd() {
    let ns = TestNs::new("try-run").await;
    let _c = spawn_controller(&ns, "try-run");
    let guard = held_lock(&ns).await;
    let dir = scratch("try-run");
    let code = run_to_end(&ns, "a", &dir, &["--try"], TRACE).await;
    assert_eq!(code, Some(75), "the default status for a taken lock");
    let code = run_to_end(&ns, "b", &dir, &["--try", "--timeout-exit-code", "3"], TRACE).await;
    assert_eq!(code, Some(3), "the given --timeout-exit-code");
    assert!(log(&dir).is_empty(), "CMD never ran");
    let stderr = stderr_of(&dir, "b");
    let lines = own_lines(&stderr);
    assert_eq!(
        lines.last(),
        Some(&"leasehold: lock l is taken (--try): not running the command"),
        "{stderr}"
    );
    // The one line a loaded machine may add before it: the controller took over 5 s to
    // place the claim. Nothing else.
    assert!(
        lines[..lines.len() - 1]
            .iter()
            .all(|l| l.contains("no controller has queued claim")),
        "{stderr}"
    );
    ns.wait_lock("l", "the withdrawn claims leave the queue", |l| queue(l).is_empty())
        .await;
    // Free, the lock is taken at once.
    guard.release().await.unwrap();
    let code = run_to_end(&ns, "c", &dir, &["--try", "--timeout-exit-code", "3"], TRACE).await;
    assert_eq!(code, Some(0));
    assert_eq!(log(&dir), [["ran", "c"]]);
}

#[tokio::test]
async fn run_timeout_exits_with_the_timeout_exit_code() {
    let ns = TestNs::new("timeout-code").await;
    let _c = spawn_controller(&ns, "timeout-code");
    let _guard = held_lock(&ns).await;
    let dir = scratch("timeout-code");
    let code = run_to_end(&ns, "a", &dir, &["--timeout", "1s", "--timeout-exit-code", "0"], TRACE).await;
    assert_eq!(code, Some(0), "a CronJob can skip quietly");
    assert!(log(&dir).is_empty(), "CMD never ran");
    assert!(stderr_of(&dir, "a").contains("not granted within 1s"));
}

#[tokio::test]
async fn run_with_a_wrong_pod_name_or_uid_is_told_why_the_controller_refuses_it_and_exits_125() {
    let ns = TestNs::new("refused").await;
    let _c = spawn_controller(&ns, "refused");
    ns.lock("l", spec(15)).await;
    let dir = scratch("refused");
    // A POD_NAME the downward API did not give: the controller refuses the claim
    // (PodNotFound), and the garbage collector deletes it (its ownerReference names no
    // pod), maybe before the refusal is listed; either way the client says why.
    let mut pod = ns.pod("w").await;
    pod.name = "not-the-pods-name".into();
    let stderr = refused_run(&ns, &dir, &pod).await;
    let refused = stderr.contains("refuses claim") && stderr.contains("PodNotFound");
    let collected = stderr.contains("garbage collector") && stderr.contains("POD_NAME (not-the-pods-name)");
    assert!(
        refused || collected,
        "the controller's reason, read from the lock's status: {stderr}"
    );
    ns.wait_lock("l", "the refusal withdrawn with the claim", |l| {
        l.status.as_ref().is_some_and(|s| s.refused.is_empty())
    })
    .await;
    // A POD_UID the downward API did not give: the same, told as PodUidMismatch or as
    // the collected claim.
    let mut pod = ns.pod("u").await;
    pod.uid = "not-the-pods-uid".into();
    let stderr = refused_run(&ns, &dir, &pod).await;
    let refused = stderr.contains("refuses claim") && stderr.contains("PodUidMismatch");
    let collected = stderr.contains("garbage collector") && stderr.contains("POD_UID (not-the-pods-uid)");
    assert!(refused || collected, "{stderr}");
}

/// Run `leasehold run` as `pod` (an identity the controller refuses) until it gives up
/// by itself: it exits 125 without running CMD; returns its stderr.
async fn refused_run(ns: &TestNs, dir: &Path, pod: &leasehold::protocol::PodIdentity) -> String {
    let mut child = run(kubeconfig(), ns, pod, dir, &[], TRACE);
    let status = tokio::time::timeout(RUN_DEADLINE, child.wait())
        .await
        .expect("leasehold run gives up by itself, told why (it waited for ever)")
        .unwrap();
    let stderr = stderr_of(dir, &pod.name);
    assert_eq!(status.code(), Some(125), "{stderr}");
    assert!(log(dir).is_empty(), "CMD never ran");
    stderr
}

#[tokio::test]
async fn run_says_a_lock_does_not_exist_and_waits_for_it_or_with_try_exits_125() {
    let ns = TestNs::new("nolock").await;
    let _c = spawn_controller(&ns, "nolock");
    let dir = scratch("nolock");
    let code = run_to_end(&ns, "t", &dir, &["--try"], TRACE).await;
    assert_eq!(code, Some(125), "--try on a missing lock is an error");
    let said = format!("lock l does not exist in namespace {}", ns.name);
    assert!(stderr_of(&dir, "t").contains(&said), "{}", stderr_of(&dir, "t"));

    let a = ns.pod("a").await;
    let mut waiting = run(kubeconfig(), &ns, &a, &dir, &[], TRACE);
    let message = format!(
        "leasehold: lock l does not exist in namespace {0} (kubectl get distributedlocks -n {0}); waiting for it to be created",
        ns.name
    );
    wait_stderr(&dir, "a", &message, DEADLINE).await;
    ns.lock("l", spec(15)).await;
    let status = tokio::time::timeout(RUN_DEADLINE, waiting.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "granted once the lock exists");
    assert_eq!(log(&dir), [["ran", "a"]]);
    assert_eq!(stderr_of(&dir, "a").matches(&message).count(), 1, "said once");
}

#[tokio::test]
async fn run_says_when_no_controller_has_queued_its_claim() {
    let ns = TestNs::new("nocontroller").await; // no controller watches this namespace
    ns.lock("l", spec(15)).await;
    let dir = scratch("nocontroller");
    let a = ns.pod("a").await;
    let mut waiting = run(kubeconfig(), &ns, &a, &dir, &[], TRACE);
    wait_stderr(&dir, "a", "leasehold: no controller has queued claim l-", DEADLINE).await;
    waiting.kill().await.unwrap();
    let stderr = stderr_of(&dir, "a");
    assert!(
        stderr.contains(
            "for lock l within 5s: is the leasehold controller running (kubectl get pods -l app.kubernetes.io/name=leasehold -A)?"
        ),
        "{stderr}"
    );
    assert!(log(&dir).is_empty());
}

/// A release that fails is retried, CMD's status is returned, and `--ready-port` says
/// not Ready from CMD's end on (through the release), not only once we exit.
#[tokio::test]
async fn run_retries_a_failed_release_and_returns_cmds_status() {
    let ns = TestNs::new("relretry").await;
    let _c = spawn_controller(&ns, "relretry");
    ns.lock("l", spec(30)).await;
    let dir = scratch("relretry");
    let (proxy, proxied) = proxied_kubeconfig(&dir).await;
    let a = ns.pod("a").await;
    let go = dir.join("go");
    let script = format!(
        "echo start $POD_NAME >> $LOG; while [ ! -e {} ]; do sleep 0.05; done; exit 3",
        go.display()
    );
    let port = free_port();
    let mut run_a = run(&proxied, &ns, &a, &dir, &["--ready-port", &port.to_string()], &script);
    wait_log(&dir, "a starts", |l| l.len() == 1).await;
    assert_eq!(probe_ready(port).await, "HTTP/1.1 200 OK", "Ready while CMD runs");
    // The API server refuses a's connections just as CMD ends: the release fails. The
    // path comes back once a says it retries (within its release budget, 15 s here).
    proxy.refuse();
    std::fs::write(&go, "").unwrap();
    wait_stderr(&dir, "a", "releasing failed; retrying", DEADLINE).await;
    // CMD has ended: not Ready while the release is retried (the next holder may be).
    assert_eq!(
        probe_ready(port).await,
        "HTTP/1.1 503 Service Unavailable",
        "Ready after CMD ended"
    );
    proxy.restore();
    let status = tokio::time::timeout(RUN_DEADLINE, run_a.wait()).await.unwrap().unwrap();
    assert_eq!(status.code(), Some(3), "CMD's status, whatever the release did");
    let stderr = stderr_of(&dir, "a");
    assert!(!stderr.contains("the claim will expire"), "{stderr}");
    // Written on a retry, the release freed the lock: released, not expired.
    ns.wait_lock("l", "the lock free", |l| holders(l).is_empty()).await;
    wait_event(&ns, "l", "Released").await;
    let reasons = event_reasons(&ns, "l").await;
    assert!(!reasons.iter().any(|r| r == "Revoked"), "{reasons:?}");
}

/// The status line `leasehold run --ready-port PORT` answers a probe with.
async fn probe_ready(port: u16) -> String {
    let (head, _) = get(port, "/").await.expect("the readiness endpoint answers");
    head.lines().next().unwrap_or_default().to_string()
}

/// `leasehold status` with `args`; its output.
async fn status(args: &[&str], kubeconfig_env: Option<&Path>) -> Output {
    let mut cmd = Command::new(LEASEHOLD);
    cmd.arg("status").args(args).env("RUST_LOG", "error");
    match kubeconfig_env {
        Some(k) => cmd.env("KUBECONFIG", k),
        None => cmd.env_remove("KUBECONFIG"),
    };
    cmd.output().await.unwrap()
}

#[tokio::test]
async fn status_prints_the_whole_object_as_json_or_yaml() {
    let ns = TestNs::new("status-o").await;
    let _c = spawn_controller(&ns, "status-o");
    let _guard = held_lock(&ns).await;
    let k = kubeconfig().to_str().unwrap();
    let out = status(&["l", "-n", &ns.name, "--kubeconfig", k, "-o", "json"], None).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["kind"], "DistributedLock");
    assert_eq!(json["metadata"]["name"], "l");
    assert_eq!(json["metadata"]["namespace"], ns.name.as_str());
    assert_eq!(json["spec"]["leaseDurationSeconds"], 15);
    assert_eq!(json["status"]["holders"][0]["pod"], "holder");

    let out = status(&["l", "-n", &ns.name, "--kubeconfig", k, "--output", "yaml"], None).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let yaml = String::from_utf8_lossy(&out.stdout);
    for line in [
        "kind: DistributedLock",
        "name: l",
        "holders:",
        "pod: holder",
        "fencingToken:",
    ] {
        assert!(yaml.lines().any(|l| l.contains(line)), "{line:?} missing:\n{yaml}");
    }
    let out = status(&["nosuch", "-n", &ns.name, "--kubeconfig", k], None).await;
    assert_eq!(out.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&out.stderr).contains("lock nosuch does not exist in namespace"));
}

/// A copy of the test kubeconfig whose current context points at nothing, and whose
/// working context is named `real`.
fn kubeconfig_with_contexts(dir: &Path) -> std::path::PathBuf {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig()).unwrap();
    let mut json = serde_json::to_value(&kc).unwrap();
    let ctx = json["contexts"][0].clone();
    let mut real = ctx.clone();
    real["name"] = "real".into();
    let mut broken = ctx;
    broken["name"] = "broken".into();
    broken["context"]["cluster"] = "nowhere".into();
    json["contexts"] = serde_json::json!([real, broken]);
    let nowhere = serde_json::json!({"name": "nowhere", "cluster": {"server": "https://127.0.0.1:1", "insecure-skip-tls-verify": true}});
    json["clusters"].as_array_mut().unwrap().push(nowhere);
    json["current-context"] = "broken".into();
    let path = dir.join("kubeconfig-contexts");
    std::fs::write(&path, serde_json::to_string(&json).unwrap()).unwrap();
    path
}

#[tokio::test]
async fn context_selects_a_named_context_with_or_without_kubeconfig() {
    let ns = TestNs::new("context").await;
    let _c = spawn_controller(&ns, "context");
    ns.lock("l", spec(15)).await;
    let dir = scratch("context");
    let copy = kubeconfig_with_contexts(&dir);
    let c = copy.to_str().unwrap();
    let out = status(&["l", "-n", &ns.name, "--kubeconfig", c], None).await;
    assert_eq!(out.status.code(), Some(125), "the current context reaches nothing");
    let out = status(&["l", "-n", &ns.name, "--kubeconfig", c, "--context", "real"], None).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("Lock l:"));
    // Without --kubeconfig, the context is looked up in $KUBECONFIG.
    let out = status(&["l", "-n", &ns.name, "--context", "real"], Some(&copy)).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = status(&["l", "-n", &ns.name, "--context", "nosuch"], Some(&copy)).await;
    assert_eq!(out.status.code(), Some(125));
    // `run` takes it too.
    let a = ns.pod("a").await;
    let status = run(&copy, &ns, &a, &dir, &["--try", "--context", "real"], TRACE)
        .wait()
        .await
        .unwrap();
    assert_eq!(status.code(), Some(0), "{}", stderr_of(&dir, "a"));
    assert_eq!(log(&dir), [["ran", "a"]]);
}
