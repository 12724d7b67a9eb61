//! The etcd backend against a real etcd of its own (not the control plane's), with
//! the controller in this process mirroring the keys into the real API server, and
//! `leasehold run` unchanged.

use std::path::{Path, PathBuf};
use std::process::{Child as StdChild, Command as StdCommand, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use etcd_client::GetOptions;
use futures::StreamExt;
use kube::api::{Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use leasehold::api::{Backend, DistributedLock, DistributedLockSpec, EtcdBackend, RevokeReason};
use leasehold::client::Lock;
use leasehold::controller::{ETCD_MIRROR_INTERVAL, ETCD_MIRROR_SETTLE, EtcdMirrorPace};
use leasehold::etcd::connect::TlsFiles;
use leasehold::testing::proxy::Proxy;

use crate::client::{SECTION, UNTIL_TERM, a_lost_then_b_ran, log, run, run_with_env, scratch, wait_log};
use crate::support::*;

/// An etcd of the tests' own, killed with the test process (it runs under
/// `leasehold guard`), its data on tmpfs.
struct Etcd {
    child: Mutex<Option<StdChild>>,
    data: PathBuf,
    port: u16,
    peer: u16,
    /// A dir with ca.crt, server.crt/key and client.crt/key: serve TLS and require
    /// client certificates.
    tls: Option<PathBuf>,
}

impl Etcd {
    fn new() -> Self {
        Self::start(None)
    }

    fn start(tls: Option<PathBuf>) -> Self {
        let base = if Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        sweep(&base);
        let data = base.join(format!(
            "leasehold-test-etcd-{}-{:08x}",
            std::process::id(),
            rand::random::<u32>()
        ));
        let etcd = Etcd {
            child: Mutex::new(None),
            data,
            port: free_port(),
            peer: free_port(),
            tls,
        };
        etcd.spawn();
        etcd
    }

    fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// The client's TLS material, when etcd serves TLS.
    fn client_tls(&self) -> Option<TlsFiles> {
        let dir = self.tls.as_ref()?;
        let read = |f: &str| std::fs::read(dir.join(f)).unwrap();
        Some(TlsFiles {
            ca: read("ca.crt"),
            cert: read("client.crt"),
            key: read("client.key"),
        })
    }

    fn spawn(&self) {
        let bin = std::env::var_os("LEASEHOLD_K8S_BIN")
            .map(|d| PathBuf::from(d).join("etcd"))
            .filter(|p| p.exists())
            .unwrap_or_else(|| PathBuf::from("etcd"));
        let peer = format!("http://127.0.0.1:{}", self.peer);
        let log = std::fs::File::create(format!("{}.log", self.data.display())).unwrap();
        let mut tls_args: Vec<String> = Vec::new();
        if let Some(dir) = &self.tls {
            let f = |n: &str| dir.join(n).display().to_string();
            tls_args = vec![
                "--cert-file".into(),
                f("server.crt"),
                "--key-file".into(),
                f("server.key"),
                "--trusted-ca-file".into(),
                f("ca.crt"),
                "--client-cert-auth".into(),
            ];
        }
        let child = StdCommand::new(LEASEHOLD)
            .args(["guard", "--signal", "SIGKILL", "--"])
            .arg(bin)
            .arg("--data-dir")
            .arg(&self.data)
            .args(["--name", "t", "--log-level", "warn"])
            .args([
                "--listen-client-urls",
                &self.url(),
                "--advertise-client-urls",
                &self.url(),
            ])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("t={peer}")])
            .args(&tls_args)
            .env(leasehold::supervise::PARENT_ENV, std::process::id().to_string())
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start etcd under leasehold guard");
        *self.child.lock().unwrap() = Some(child);
    }

    /// Wait until etcd answers.
    async fn ready(&self) {
        wait_for("etcd to answer", DEADLINE, || async {
            self.connect().await.status().await.ok().map(|_| ())
        })
        .await;
    }

    /// A client, with the client certificate when etcd serves TLS.
    async fn connect(&self) -> etcd_client::Client {
        let backend = EtcdBackend {
            endpoints: vec![self.url()],
            key_prefix: None,
            tls_secret_ref: None,
        };
        let tls = self.client_tls();
        leasehold::etcd::connect_with(&backend, tls.as_ref(), Duration::from_secs(2))
            .await
            .expect("an etcd client (connecting is lazy)")
    }

    /// SIGKILL etcd (as a crash would) and wait until its port is closed.
    async fn kill(&self) {
        if let Some(mut c) = self.child.lock().unwrap().take() {
            c.kill().unwrap();
            c.wait().unwrap();
        }
        let port = self.port;
        wait_for("etcd to be gone", DEADLINE, || async {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_err().then_some(())
        })
        .await;
    }
}

/// Remove the data of test etcds whose test process is gone (the shared one is never
/// dropped: it dies with its process, and the next run sweeps its data).
fn sweep(base: &Path) {
    let Ok(entries) = std::fs::read_dir(base) else { return };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix("leasehold-test-etcd-")
            .and_then(|r| r.split('-').next())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(e.path());
            let _ = std::fs::remove_file(e.path());
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.lock().unwrap().take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.data);
    }
}

/// The etcd shared by this binary's etcd tests (each test uses its own key prefix).
/// It is started from a thread that lives as long as the process: `leasehold guard`
/// stops its child when the *thread* that started it ends.
fn shared() -> &'static Etcd {
    static SHARED: std::sync::OnceLock<Etcd> = std::sync::OnceLock::new();
    SHARED.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            tx.send(Etcd::new()).unwrap();
            loop {
                std::thread::park();
            }
        });
        rx.recv().unwrap()
    })
}

fn etcd_spec(ns: &TestNs, url: &str, lease: i32, max_holders: i32) -> DistributedLockSpec {
    DistributedLockSpec {
        lease_duration_seconds: lease,
        max_holders,
        backend: Some(Backend {
            etcd: Some(EtcdBackend {
                endpoints: vec![url.into()],
                key_prefix: Some(format!("/t/{}", ns.name)),
                tls_secret_ref: None,
            }),
        }),
        max_queue: None,
    }
}

/// The claim keys left under the test's prefix.
async fn keys_left(ns: &TestNs, etcd: &Etcd) -> usize {
    let mut c = etcd.connect().await;
    let got = c
        .get(format!("/t/{}/", ns.name), Some(GetOptions::new().with_prefix()))
        .await
        .unwrap();
    got.kvs().len()
}

/// Wait until `n` claim keys are left under the test's prefix.
async fn keys_come_to(ns: &TestNs, etcd: &Etcd, n: usize, what: &str) {
    wait_for(what, DEADLINE, || async {
        (keys_left(ns, etcd).await == n).then_some(())
    })
    .await;
}

/// Lock `l` of `ns` for its pod `name` (made now), read through `client`.
async fn etcd_lock(ns: &TestNs, client: kube::Client, name: &str) -> Lock {
    let id = ns.pod(name).await;
    Lock::builder(client, &ns.name, "l").identity(id).build().unwrap()
}

/// An etcd-backed semaphore `l` of two in `ns`, held by a, then b beside it.
async fn a_and_b_hold_a_semaphore(ns: &TestNs, etcd: &Etcd) -> (leasehold::client::Guard, leasehold::client::Guard) {
    ns.lock("l", etcd_spec(ns, &etcd.url(), 10, 2)).await;
    let a = etcd_lock(ns, ns.client.clone(), "a")
        .await
        .acquire()
        .await
        .expect("a holds");
    let b = etcd_lock(ns, ns.client.clone(), "b")
        .await
        .acquire()
        .await
        .expect("b holds beside a");
    (a, b)
}

/// The (event, token, pod) lines of the log, ticks left out.
fn sections(dir: &Path) -> Vec<(String, i64, String)> {
    log(dir)
        .into_iter()
        .filter(|l| l.len() >= 3 && l[0] != "tick")
        .map(|l| (l[0].clone(), l[1].parse().unwrap(), l[2].clone()))
        .collect()
}

fn ready_reason(lock: &DistributedLock) -> Option<String> {
    let s = lock.status.as_ref()?;
    s.conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.reason.clone())
}

/// A section that lasts until `$GO` exists, so waiters can line up behind it.
const UNTIL_GO: &str = r#"echo start $LEASEHOLD_FENCING_TOKEN $POD_NAME >> $LOG; while [ ! -e $GO ]; do sleep 0.05; done; sleep 0.2; echo end $LEASEHOLD_FENCING_TOKEN $POD_NAME >> $LOG"#;

#[tokio::test]
async fn leasehold_run_on_etcd_grants_fifo_one_at_a_time_with_growing_tokens_and_status_mirrors_it() {
    let etcd = shared();
    etcd.ready().await;
    let ns = TestNs::new("etcdfifo").await;
    let _c = spawn_controller(&ns, "etcdfifo");
    ns.lock("l", etcd_spec(&ns, &etcd.url(), 5, 1)).await;
    let dir = scratch("etcdfifo");
    // Each run's section lasts until its own go-file exists.
    let go = |name: &str| dir.join(format!("go-{name}"));
    let mut runs = Vec::new();
    for (i, name) in ["a", "b", "c"].into_iter().enumerate() {
        let pod = ns.pod(name).await;
        let go = go(name);
        let env = [("GO", go.to_str().unwrap())];
        runs.push(run_with_env(kubeconfig(), &ns, &pod, &dir, &[], &env, UNTIL_GO));
        if i == 0 {
            wait_log(&dir, "a starts", |l| l.iter().any(|l| l[0] == "start")).await;
        } else {
            let want: Vec<String> = ["b", "c"][..i].iter().map(|s| s.to_string()).collect();
            ns.wait_lock("l", "the queue mirrored in order", |l| queue(l) == want)
                .await;
        }
    }
    let lock = ns.wait_lock("l", "a holds", |l| holders(l) == ["a"]).await;
    let a_token = sections(&dir)[0].1;
    assert_eq!(
        lock.status.as_ref().unwrap().holders[0].fencing_token,
        a_token,
        "status shows a's token"
    );
    assert_eq!(ready_reason(&lock).as_deref(), Some("Reconciled"));
    std::fs::write(go("a"), "").unwrap();
    std::fs::write(go("b"), "").unwrap();
    // c ends only once the status showed it holding: the mirror writes the keys it
    // reads, so a section shorter than a status write could otherwise go unmirrored.
    ns.wait_lock("l", "c holds", |l| holders(l) == ["c"]).await;
    std::fs::write(go("c"), "").unwrap();
    for mut r in runs {
        let status = tokio::time::timeout(DEADLINE, r.wait())
            .await
            .expect("run ends")
            .unwrap();
        assert!(status.success(), "leasehold run exits with CMD's status: {status:?}");
    }
    let s = sections(&dir);
    let order: Vec<(&str, &str)> = s.iter().map(|(e, _, p)| (e.as_str(), p.as_str())).collect();
    let fifo = [
        ("start", "a"),
        ("end", "a"),
        ("start", "b"),
        ("end", "b"),
        ("start", "c"),
        ("end", "c"),
    ];
    assert_eq!(order, fifo, "one holder at a time, in arrival order");
    let tokens: Vec<i64> = s.iter().step_by(2).map(|(_, t, _)| *t).collect();
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens strictly increase: {tokens:?}"
    );
    let done = ns
        .wait_lock("l", "the status to show the lock free", |l| holders(l).is_empty())
        .await;
    assert_eq!(done.status.unwrap().fencing_token, tokens[2], "the last token issued");
    assert_eq!(keys_left(&ns, etcd).await, 0, "every release deleted its key");
}

#[tokio::test]
async fn sigkilled_run_hands_over_when_its_etcd_lease_ends_and_its_cmd_is_dead_first() {
    let etcd = shared();
    etcd.ready().await;
    let ns = TestNs::new("etcdkill").await;
    let _c = spawn_controller(&ns, "etcdkill");
    ns.lock("l", etcd_spec(&ns, &etcd.url(), 2, 1)).await;
    let dir = scratch("etcdkill");
    let (a, b) = (ns.pod("a").await, ns.pod("b").await);
    let ticking =
        r#"echo start $LEASEHOLD_FENCING_TOKEN $POD_NAME >> $LOG; while :; do echo tick 0 a >> $LOG; sleep 0.1; done"#;
    let mut run_a = run(kubeconfig(), &ns, &a, &dir, &[], ticking);
    wait_log(&dir, "a ticks", |l| l.iter().any(|l| l[0] == "tick")).await;
    let mut run_b = run(kubeconfig(), &ns, &b, &dir, &[], SECTION);
    ns.wait_lock("l", "b waits", |l| queue(l) == ["b"]).await;
    run_a.kill().await.unwrap(); // SIGKILL: no release is written
    let killed = Instant::now();
    let status = tokio::time::timeout(DEADLINE, run_b.wait())
        .await
        .expect("b runs after a's lease")
        .unwrap();
    assert!(status.success());
    let took = killed.elapsed();
    let lines = log(&dir);
    let b_start = lines
        .iter()
        .position(|l| l[0] == "start" && l[2] == "b")
        .expect("b started");
    assert_eq!(
        lines[b_start..].iter().filter(|l| l[0] == "tick").count(),
        0,
        "a's CMD ran on after b started"
    );
    // Handed over by the lease's expiry (TTL = lease + 2 s), not by anything sooner.
    assert!(
        took >= Duration::from_secs(2),
        "b started {took:?} after the kill, before a's lease could end"
    );
}

#[tokio::test]
async fn a_force_deleted_pod_s_claim_is_held_back_revoked_and_passed_on_after_it_stopped() {
    let etcd = shared();
    etcd.ready().await;
    let ns = TestNs::new("etcdgone").await;
    let (port, _c, _) = serving_controller(&ns, "etcdgone").await;
    ns.lock("l", etcd_spec(&ns, &etcd.url(), 3, 1)).await;
    let dir = scratch("etcdgone");
    let (a, b) = (ns.pod("a").await, ns.pod("b").await);
    let mut run_a = run(kubeconfig(), &ns, &a, &dir, &[], UNTIL_TERM);
    wait_log(&dir, "a starts", |l| l.iter().any(|l| l[0] == "start")).await;
    let mut run_b = run(kubeconfig(), &ns, &b, &dir, &[], SECTION);
    ns.wait_lock("l", "b waits", |l| queue(l) == ["b"]).await;
    // No kubelet: the pod object goes at once, with no word that its process stopped.
    ns.delete_pod("a").await;
    ns.wait_lock("l", "a's slot held back as revoked", |l| {
        let h = l.status.as_ref().and_then(|s| s.holders.first());
        h.and_then(|h| h.revoked.as_ref())
            .is_some_and(|r| r.reason == RevokeReason::PodGone)
    })
    .await;
    a_lost_then_b_ran(&mut run_a, &mut run_b, &dir, &["start a", "term a", "start b", "end b"]).await;
    wait_event(&ns, "l", "Revoked").await;
    // Counted as a Lease-backed lock's would be (etcd-backed locks recorded grants
    // only): a's revocation, its slot's end, and the reconciles' times (the revocation's
    // write came before b's grant, so before b ran).
    let (_, metrics) = get(port, "/metrics").await.unwrap();
    assert!(
        metrics.contains("leasehold_revocations_total{reason=\"PodGone\"} 1"),
        "{metrics}"
    );
    assert!(
        !metrics.contains("\nleasehold_hold_seconds_count 0\n")
            && !metrics.contains("\nleasehold_reconcile_seconds_count 0\n"),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_holder_cut_off_from_etcd_stops_before_the_next_starts() {
    let etcd = shared();
    etcd.ready().await;
    let ns = TestNs::new("etcdcut").await;
    let _c = spawn_controller(&ns, "etcdcut");
    ns.lock("l", etcd_spec(&ns, &etcd.url(), 3, 1)).await;
    let dir = scratch("etcdcut");
    let (a, b) = (ns.pod("a").await, ns.pod("b").await);
    // a reaches etcd through a proxy (its own endpoint, as a node-local proxy would be).
    let proxy = Proxy::start(etcd.port).await;
    let via = format!("http://127.0.0.1:{}", proxy.port);
    let env = [(leasehold::etcd::ENDPOINTS_ENV, via.as_str())];
    let mut run_a = run_with_env(kubeconfig(), &ns, &a, &dir, &[], &env, UNTIL_TERM);
    wait_log(&dir, "a starts", |l| l.iter().any(|l| l[0] == "start")).await;
    let mut run_b = run(kubeconfig(), &ns, &b, &dir, &[], SECTION);
    ns.wait_lock("l", "b waits", |l| queue(l) == ["b"]).await;
    proxy.black_hole(); // packets vanish: every request of a's hangs
    a_lost_then_b_ran(&mut run_a, &mut run_b, &dir, &["start a", "term a", "start b", "end b"]).await;
}

#[tokio::test]
async fn an_etcd_outage_shows_in_ready_and_the_lock_works_again_after_a_restart() {
    let etcd = Etcd::new(); // its own: this test kills it
    etcd.ready().await;
    let ns = TestNs::new("etcdrestart").await;
    let _c = spawn_controller(&ns, "etcdrestart");
    // Not what is tested (riding out the outage is), so long: the outage is etcd's
    // restart on this machine, measured and checked against it below.
    let lease = 60;
    ns.lock("l", etcd_spec(&ns, &etcd.url(), lease, 1)).await;
    let client = ns.client.clone();
    let (a, b, c) = (ns.pod("a").await, ns.pod("b").await, ns.pod("c").await);
    let lock = |id| {
        Lock::builder(client.clone(), &ns.name, "l")
            .identity(id)
            .build()
            .unwrap()
    };
    let (lock_a, lock_b, lock_c) = (lock(a), lock(b), lock(c));
    let held = lock_a.acquire().await.expect("a acquires");
    assert!(
        lock_c.try_acquire().await.unwrap().is_none(),
        "c may not jump the queue"
    );
    ns.wait_lock("l", "a holds, and c's withdrawn claim is gone", |l| {
        holders(l) == ["a"] && queue(l).is_empty()
    })
    .await;
    let outage = std::time::Instant::now();
    etcd.kill().await;
    let down = ns
        .wait_lock("l", "Ready=False EtcdUnavailable", |l| {
            ready_reason(l).as_deref() == Some("EtcdUnavailable")
        })
        .await;
    assert_eq!(holders(&down), ["a"], "the last keys seen stay in status");
    wait_event(&ns, "l", "EtcdUnavailable").await;
    etcd.spawn();
    etcd.ready().await;
    assume_rides_out("etcd", outage.elapsed(), lease);
    ns.wait_lock("l", "Ready again", |l| ready_reason(l).as_deref() == Some("Reconciled"))
        .await;
    let waiting = tokio::spawn(async move { lock_b.acquire().await.map(|g| (g.fencing_token(), lock_b)) });
    ns.wait_lock("l", "b waits behind a", |l| queue(l) == ["b"]).await;
    let a_token = held.fencing_token();
    assert!(
        !held.is_lost(),
        "a short outage within the lease does not cost a its grant"
    );
    held.release().await.expect("a releases");
    let (b_token, _lock_b) = tokio::time::timeout(DEADLINE, waiting)
        .await
        .unwrap()
        .unwrap()
        .expect("b acquires");
    assert!(b_token > a_token, "token {b_token} after {a_token}");
}

/// A CA, a server certificate for 127.0.0.1 and a client certificate, made by openssl.
fn certificates(dir: &Path) -> PathBuf {
    let script = r#"set -e
openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 1 -subj /CN=leasehold-test-ca
openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj /CN=etcd
printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' > server.ext
openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out server.crt -days 1 -extfile server.ext
openssl req -newkey rsa:2048 -nodes -keyout client.key -out client.csr -subj /CN=client
printf 'extendedKeyUsage=clientAuth\n' > client.ext
openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out client.crt -days 1 -extfile client.ext
mkdir pod && cp ca.crt pod/ca.crt && cp client.crt pod/tls.crt && cp client.key pod/tls.key"#;
    let out = StdCommand::new("sh")
        .arg("-c")
        .arg(script)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "openssl: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    dir.to_path_buf()
}

#[tokio::test]
async fn a_lock_on_an_etcd_that_wants_client_certificates_works_with_the_secret_and_the_mounted_files() {
    use k8s_openapi::ByteString;
    use k8s_openapi::api::core::v1::Secret;
    let dir = scratch("etcdtls");
    let etcd = Etcd::start(Some(certificates(&dir)));
    etcd.ready().await;
    let ns = TestNs::new("etcdtls").await;
    // The controller reads the lock's Secret through the API.
    let tls = etcd.client_tls().unwrap();
    let data = [("ca.crt", tls.ca), ("tls.crt", tls.cert), ("tls.key", tls.key)]
        .into_iter()
        .map(|(k, v)| (k.to_string(), ByteString(v)))
        .collect();
    let mut secret = Secret {
        data: Some(data),
        ..Default::default()
    };
    secret.metadata.name = Some("etcd-client-tls".into());
    kube::Api::<Secret>::namespaced(ns.client.clone(), &ns.name)
        .create(&Default::default(), &secret)
        .await
        .unwrap();
    let _c = spawn_controller(&ns, "etcdtls");
    let mut spec = etcd_spec(&ns, &etcd.url(), 5, 1);
    let backend = spec.backend.as_mut().unwrap().etcd.as_mut().unwrap();
    backend.tls_secret_ref = Some(leasehold::api::SecretRef {
        name: "etcd-client-tls".into(),
    });
    ns.lock("l", spec).await;
    let (a, b) = (ns.pod("a").await, ns.pod("b").await);
    // Without the files, `leasehold run` says which one it could not read.
    let missing = [(leasehold::etcd::TLS_DIR_ENV, "/nonexistent")];
    let status = run_with_env(kubeconfig(), &ns, &b, &dir, &[], &missing, SECTION)
        .wait()
        .await
        .unwrap();
    assert!(!status.success());
    let stderr = std::fs::read_to_string(dir.join("b.stderr")).unwrap();
    assert!(stderr.contains("reading etcd TLS file /nonexistent/ca.crt"), "{stderr}");
    // With them (as the pod's Secret volume), it holds; the controller mirrors it.
    let go = dir.join("go");
    let mounted = dir.join("pod");
    let env = [
        (leasehold::etcd::TLS_DIR_ENV, mounted.to_str().unwrap()),
        ("GO", go.to_str().unwrap()),
    ];
    let mut run_a = run_with_env(kubeconfig(), &ns, &a, &dir, &[], &env, UNTIL_GO);
    let held = ns
        .wait_lock("l", "a holds, seen over TLS", |l| holders(l) == ["a"])
        .await;
    assert_eq!(ready_reason(&held).as_deref(), Some("Reconciled"));
    std::fs::write(&go, "").unwrap();
    let status = tokio::time::timeout(DEADLINE, run_a.wait()).await.unwrap().unwrap();
    assert!(status.success(), "{status:?}");
    assert_eq!(keys_left(&ns, &etcd).await, 0);
}

#[tokio::test]
async fn a_semaphore_on_etcd_lets_two_hold_and_wakes_the_waiter_when_either_releases() {
    let etcd = shared();
    etcd.ready().await;
    let ns = TestNs::new("etcdsem").await;
    let (a, b) = a_and_b_hold_a_semaphore(&ns, etcd).await;
    assert!(a.fencing_token() < b.fencing_token());
    let lock_c = etcd_lock(&ns, ns.client.clone(), "c").await;
    let waiting = tokio::spawn(async move { lock_c.acquire().await.map(|g| (g.fencing_token(), lock_c)) });
    // c's key exists once it waits: the slot it waits for is b's or a's.
    keys_come_to(&ns, etcd, 3, "c's claim key").await;
    assert!(!waiting.is_finished(), "c may not hold while a and b do");
    // The holder that is *not* just ahead of c releases: c must still wake.
    a.release().await.unwrap();
    let (c_token, _lock_c) = tokio::time::timeout(DEADLINE, waiting)
        .await
        .unwrap()
        .unwrap()
        .expect("c holds");
    assert!(c_token > b.fencing_token());
    assert!(!b.is_lost());
}

/// A semaphore's waiter granted beside another holder reads the lock's `maxHolders`
/// first: lowered from 2 to 1 while it waited, it waits on until no key is ahead of it.
/// (Before, it held beside b by the 2 it read when it claimed.)
#[tokio::test]
async fn a_waiter_on_etcd_holds_beside_others_only_by_the_max_holders_stored_now() {
    let etcd = shared();
    etcd.ready().await;
    let ns = TestNs::new("etcdlower").await;
    let (a, b) = a_and_b_hold_a_semaphore(&ns, etcd).await;
    let lock_c = etcd_lock(&ns, ns.client.clone(), "c").await;
    let waiting = tokio::spawn(async move {
        let guard = lock_c.acquire().await;
        (guard.map(|g| g.fencing_token()), Instant::now(), lock_c)
    });
    keys_come_to(&ns, etcd, 3, "c's claim key").await;
    let lowered = serde_json::json!({"spec": {"maxHolders": 1}});
    ns.locks()
        .patch("l", &PatchParams::default(), &Patch::Merge(&lowered))
        .await
        .unwrap();
    a.release().await.unwrap();
    keys_come_to(&ns, etcd, 2, "a's key gone").await;
    let b_token = b.fencing_token();
    let b_released = Instant::now();
    b.release().await.unwrap();
    let (c_token, c_held, _lock_c) = tokio::time::timeout(DEADLINE, waiting).await.unwrap().unwrap();
    assert!(c_token.expect("c holds") > b_token);
    assert!(
        c_held > b_released,
        "c held beside b after maxHolders went from 2 to 1 ({:?} before b's release)",
        b_released - c_held
    );
}

/// A holder whose claim waited past a compaction of etcd's history: its revocation
/// watch opened from its key's creation, compacted away, and was cancelled at every
/// try (a new stream each 200 ms), so a move of its key by the controller was noticed
/// only at its next renewal (a third of the lease). Now a cancelled watch reads the
/// key afresh and watches on from there.
#[tokio::test]
async fn a_holder_whose_claim_waited_past_a_compaction_notices_its_key_moved_by_its_watch() {
    let etcd = Etcd::start(None); // its own: a compaction cancels others' watches too
    etcd.ready().await;
    let ns = TestNs::new("etcdcompact").await;
    let _c = spawn_controller(&ns, "etcdcompact");
    ns.lock("l", etcd_spec(&ns, &etcd.url(), 60, 1)).await;
    let a = etcd_lock(&ns, ns.client.clone(), "a")
        .await
        .acquire()
        .await
        .expect("a holds");
    let lock_b = etcd_lock(&ns, ns.client.clone(), "b").await;
    let waiting = tokio::spawn(async move { (lock_b.acquire().await, lock_b) });
    keys_come_to(&ns, &etcd, 2, "b's claim key").await;
    let mut raw = etcd.connect().await;
    for i in 0..5 {
        raw.put(format!("/other/{i}"), "x", None).await.unwrap();
    }
    let now = raw.get("/other/0", None).await.unwrap().header().unwrap().revision();
    raw.compact(now, None).await.unwrap();
    a.release().await.unwrap();
    let (b, _lock_b) = tokio::time::timeout(DEADLINE, waiting).await.unwrap().unwrap();
    let b = b.expect("b holds");
    // The controller's hold-back, by hand: b's key moved onto a lease of its own.
    let prefix = format!("/t/{}/", ns.name);
    let kv = raw
        .get(prefix, Some(GetOptions::new().with_prefix()))
        .await
        .unwrap()
        .kvs()[0]
        .clone();
    let lease = raw.lease_grant(120, None).await.unwrap().id();
    let onto = etcd_client::PutOptions::new().with_lease(lease);
    raw.put(kv.key(), kv.value(), Some(onto)).await.unwrap();
    let noticed = tokio::time::timeout(Duration::from_secs(2), b.lost()).await;
    assert!(
        noticed.is_ok(),
        "b's key moved, and b held on (its next renewal comes within 20 s)"
    );
    drop(b);
}

/// A waiter that cannot read the lock's `maxHolders` does not hold beside others: with
/// its API server's packets dropped it waits until no key is ahead of it (the etcd
/// path itself still works).
#[tokio::test]
async fn a_waiter_on_etcd_that_cannot_read_max_holders_does_not_hold_beside_others() {
    let etcd = shared();
    etcd.ready().await;
    let ns = TestNs::new("etcdblind").await;
    let (a, b) = a_and_b_hold_a_semaphore(&ns, etcd).await;
    let (proxy, blind) = proxied_client("etcdblind").await;
    let lock_c = etcd_lock(&ns, blind, "c").await;
    let mut waiting = tokio::spawn(async move { lock_c.acquire().await.map(|g| g.fencing_token()) });
    keys_come_to(&ns, etcd, 3, "c's claim key").await;
    proxy.black_hole();
    a.release().await.unwrap();
    // Longer than its read's timeout and the delay before it reads again
    // (`SPEC_READ_TIMEOUT` 2 s, `SPEC_REREAD_DELAY` 500 ms): it must not have gone by the
    // value it read before.
    let beside = tokio::time::timeout(Duration::from_secs(4), &mut waiting).await;
    assert!(
        beside.is_err(),
        "c held beside b on a maxHolders it could not read: {beside:?}"
    );
    b.release().await.unwrap();
    let c = tokio::time::timeout(DEADLINE, waiting).await.unwrap().unwrap();
    c.expect("c holds once no key is ahead, without the API server");
}

#[tokio::test]
async fn a_queue_is_granted_in_order_one_at_a_time_as_waiters_move_up_and_one_withdraws() {
    // A waiter further back watches the two keys ahead of it; when one goes it reads
    // again (10 ms later for the second ahead), and next in line it tracks every key
    // ahead and holds at the deletion that frees the slot. p2 withdraws while waiting:
    // p3 (its nearest key ahead gone) and p4 (its second) still get their turns.
    let depth = 6;
    let etcd = shared();
    etcd.ready().await;
    let ns = TestNs::new("etcdqueue").await;
    ns.lock("l", etcd_spec(&ns, &etcd.url(), 10, 1)).await;
    let holding = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (tx, mut granted) = tokio::sync::mpsc::unbounded_channel();
    // The first holder keeps the lock until every claim is queued.
    let (go, gate) = tokio::sync::watch::channel(false);
    let mut tasks = Vec::new();
    for i in 0..depth {
        let lock = Lock::builder(ns.client.clone(), &ns.name, "l")
            .identity(ns.pod(&format!("p{i}")).await)
            .build()
            .unwrap();
        let (holding, tx, mut gate) = (holding.clone(), tx.clone(), gate.clone());
        tasks.push(tokio::spawn(async move {
            let guard = lock.acquire().await.expect("granted");
            let others = holding.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            tx.send((i, guard.fencing_token(), others)).unwrap();
            gate.wait_for(|go| *go).await.unwrap();
            // The section under test: a claim granted beside it would count itself.
            tokio::time::sleep(Duration::from_millis(5)).await;
            holding.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
            guard.release().await.expect("released");
        }));
        // Queued in this order: the next claim only once this one's key exists.
        wait_for("the claim key", DEADLINE, || async {
            (keys_left(&ns, etcd).await > i).then_some(())
        })
        .await;
    }
    tasks[2].abort(); // dropped while waiting: its claim is withdrawn
    wait_for("p2's claim withdrawn", DEADLINE, || async {
        (keys_left(&ns, etcd).await == depth - 1).then_some(())
    })
    .await;
    go.send(true).unwrap();
    let mut last = 0;
    for expected in [0, 1, 3, 4, 5] {
        let (i, token, others) = tokio::time::timeout(DEADLINE, granted.recv()).await.unwrap().unwrap();
        assert_eq!(i, expected, "granted out of order");
        assert!(token > last, "token {token} after {last}");
        assert_eq!(others, 0, "claim {i} held beside another");
        last = token;
    }
}

/// The status mirror of an etcd-backed lock reconciles a change of its keys only once
/// it has settled (`Options::etcd_mirror`, [`ETCD_MIRROR_SETTLE`] by default),
/// so that its status write through the API server (into the API server's etcd) does
/// not compete for the CPU with the handoff it reports; it writes the changes of that
/// while at once. Here, with a settle of 2 s: a grant and the next claim queued behind
/// it in one status write, made no sooner than 2 s after the grant. (Measured:
/// docs/measurements.md.)
#[tokio::test]
async fn the_status_mirror_writes_the_changes_of_its_keys_together_once_they_settled() {
    const SETTLE: Duration = Duration::from_secs(2);
    let etcd = shared();
    etcd.ready().await;
    let ns = TestNs::new("etcdsettle").await;
    let (a, b) = (ns.pod("a").await, ns.pod("b").await);
    let pace = EtcdMirrorPace {
        settle: SETTLE,
        ..EtcdMirrorPace::default()
    };
    assert!(SETTLE > ETCD_MIRROR_SETTLE, "the default settles sooner");
    let (_c, first) = a_lock_mirrored_at(&ns, etcd, pace).await;
    // Every version the API server stores from now on, from a watch already open.
    let mut versions = watcher(ns.locks(), watcher::Config::default())
        .applied_objects()
        .boxed();
    let seen = next_version(&mut versions).await;
    assert_eq!(seen.metadata.resource_version, first.metadata.resource_version);
    let lock = |pod| {
        Lock::builder(ns.client.clone(), &ns.name, "l")
            .identity(pod)
            .build()
            .unwrap()
    };
    let claimed = Instant::now();
    let guard = lock(a).acquire().await.expect("a holds");
    let lock_b = lock(b);
    let waiting = tokio::spawn(async move { lock_b.acquire().await.map(|g| (g, lock_b)) });
    wait_for("b's claim key", DEADLINE, || async {
        (keys_left(&ns, etcd).await == 2).then_some(())
    })
    .await;
    let changed = claimed.elapsed();
    assert!(changed < SETTLE, "the grant and the next claim took {changed:?}");
    let written = next_version(&mut versions).await;
    let after = claimed.elapsed();
    assert!(after >= SETTLE, "the status was written {after:?} after the grant");
    assert_eq!(
        (holders(&written), queue(&written)),
        (vec!["a".to_string()], vec!["b".to_string()]),
        "one write for the grant and the claim queued behind it"
    );
    guard.release().await.unwrap();
    let (b_guard, _lock_b) = tokio::time::timeout(DEADLINE, waiting)
        .await
        .expect("b granted in time")
        .unwrap()
        .expect("b holds");
    b_guard.release().await.unwrap();
}

/// The status mirror of a lock whose keys keep changing writes its status at most once
/// an interval (`Options::etcd_mirror`, [`ETCD_MIRROR_INTERVAL`] by default), each write
/// with every change seen by then, and the last one once they stop: here one holder
/// takes and gives back the lock for 1.5 s (tens of key changes), with an interval of
/// 1 s. Before, every change was written 25 ms after it: one status write a handoff,
/// the API server's share of an etcd-backed handoff (measured: docs/measurements.md).
#[tokio::test]
async fn the_status_mirror_of_a_busy_lock_writes_at_most_once_an_interval() {
    const INTERVAL: Duration = Duration::from_secs(1);
    const CHURN: Duration = Duration::from_millis(1500);
    let etcd = shared();
    etcd.ready().await;
    let ns = TestNs::new("etcdpace").await;
    let a = ns.pod("a").await;
    let pace = EtcdMirrorPace {
        interval: INTERVAL,
        ..EtcdMirrorPace::default()
    };
    assert!(INTERVAL > ETCD_MIRROR_INTERVAL, "the default writes more often");
    let (_c, _) = a_lock_mirrored_at(&ns, etcd, pace).await;
    // Every version the API server stores from now on, each as the watch delivers it
    // (read at once, so that none is dropped from the API server's watch window).
    let mut versions = watcher(ns.locks(), watcher::Config::default())
        .applied_objects()
        .boxed();
    next_version(&mut versions).await; // the lock as it is now
    let (seen, mut written) = tokio::sync::mpsc::unbounded_channel();
    let reading = tokio::spawn(async move {
        while let Some(Ok(v)) = versions.next().await {
            if seen.send((Instant::now(), v)).is_err() {
                return;
            }
        }
    });
    let lock = Lock::builder(ns.client.clone(), &ns.name, "l")
        .identity(a)
        .build()
        .unwrap();
    let began = Instant::now();
    let mut cycles = 0;
    while began.elapsed() < CHURN {
        lock.acquire().await.expect("a holds").release().await.unwrap();
        cycles += 1;
    }
    let churned = began.elapsed();
    // Every status written from the first change until the lock shows free after the
    // churn (a status shown free during it may be the last one written).
    ns.wait_lock("l", "the lock free", |l| holders(l).is_empty()).await;
    reading.abort();
    let mut at = Vec::new();
    while let Ok((t, _)) = written.try_recv() {
        at.push(t - began);
    }
    let allowed = 2 + (churned.as_millis() / INTERVAL.as_millis()) as usize;
    assert!(
        at.len() <= allowed,
        "{} status writes for {cycles} grants in {churned:?} (at most {allowed}): {at:?}",
        at.len()
    );
    assert!(cycles >= 10, "only {cycles} grants: the lock hardly changed");
}

/// A controller for `ns` whose etcd mirrors keep `pace`, and lock `l` (one slot, on
/// `etcd`) as the mirror's first status shows it.
async fn a_lock_mirrored_at(ns: &TestNs, etcd: &Etcd, pace: EtcdMirrorPace) -> (Running, DistributedLock) {
    let opts = leasehold::controller::Options {
        etcd_mirror: pace,
        ..leasehold::controller::Options::single(&ns.name, Some(&ns.name))
    };
    let controller = spawn_controller_with(ns.client.clone(), opts);
    ns.lock("l", etcd_spec(ns, &etcd.url(), 10, 1)).await;
    let first = ns
        .wait_lock("l", "the mirror's first status", |l| {
            ready_reason(l).as_deref() == Some("Reconciled")
        })
        .await;
    (controller, first)
}

/// The next lock version `versions` shows.
async fn next_version(
    versions: &mut (impl futures::Stream<Item = Result<DistributedLock, watcher::Error>> + Unpin),
) -> DistributedLock {
    tokio::time::timeout(DEADLINE, versions.next())
        .await
        .expect("a version of the lock in time")
        .expect("the watch goes on")
        .expect("the watch reads")
}
