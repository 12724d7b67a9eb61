//! A real local control plane for tests and the demo: etcd, kube-apiserver and
//! kube-controller-manager as plain processes on loopback ports, in a temp dir.
//!
//! Every child runs under [`crate::guard`], so it dies with the process that started
//! it, even one killed by SIGKILL. The temp dir carries a lock file held for the
//! launcher's lifetime; a later start removes dirs whose lock is free (their launcher
//! died without cleaning up). [`ControlPlane::stop`] (or dropping it) ends the
//! children and removes the dir.

mod provision;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::Child;

pub use provision::{BIN_ENV, binaries};

/// How long the API server may take to report ready.
pub const READY_TIMEOUT: Duration = Duration::from_secs(90);
/// How long a child gets to exit after SIGTERM before SIGKILL.
pub const STOP_GRACE: Duration = Duration::from_secs(5);
/// The directory (under the system temp dir) holding every launcher's own dir.
pub const DIR_PREFIX: &str = "leasehold-dev";
/// The kube-controller-manager controllers run by default: enough for garbage
/// collection of claims, namespace deletion and ServiceAccount tokens.
pub const DEFAULT_CONTROLLERS: &str = "garbagecollector,namespace,serviceaccount-token,serviceaccount";

/// Errors of the local control plane, each naming the step that failed.
#[derive(Debug, thiserror::Error)]
pub enum DevError {
    /// Running the provisioning script failed.
    #[error("running the provisioning script: {0}")]
    Provision(#[source] std::io::Error),
    /// The provisioning script exited unsuccessfully.
    #[error("provisioning the control plane binaries failed ({0}); see its output above")]
    ProvisionFailed(std::process::ExitStatus),
    /// A file or directory of the control plane could not be written.
    #[error("preparing {0}: {1}")]
    Prepare(String, #[source] std::io::Error),
    /// A child process could not be started.
    #[error("starting {0}: {1}")]
    Spawn(&'static str, #[source] std::io::Error),
    /// A child process exited while the control plane was starting.
    #[error("{0} exited early ({1}); last lines of its log:\n{2}")]
    Exited(&'static str, std::process::ExitStatus, String),
    /// The API server did not become ready in time.
    #[error("kube-apiserver not ready within {0:?}; last lines of its log:\n{1}")]
    NotReady(Duration, String),
    /// Building a client for the new API server failed.
    #[error("building a client for the local API server: {0}")]
    Client(#[source] kube::Error),
}

/// A running local control plane.
pub struct ControlPlane {
    dir: PathBuf,
    kubeconfig: PathBuf,
    children: Vec<(&'static str, Child)>,
    _alive: File,
}

// === impl ControlPlane ===

impl ControlPlane {
    /// Start etcd, kube-apiserver and (if present) kube-controller-manager, and wait
    /// until the API server is ready. `leasehold` is the path of the leasehold binary,
    /// used to guard the children.
    pub async fn start(leasehold: &Path) -> Result<Self, DevError> {
        Self::start_with(leasehold, DEFAULT_CONTROLLERS).await
    }

    /// [`ControlPlane::start`], running these kube-controller-manager `controllers`.
    pub async fn start_with(leasehold: &Path, controllers: &str) -> Result<Self, DevError> {
        let bin = binaries().await?;
        sweep_stale_dirs();
        let dir = new_dir()?;
        let alive = File::create(dir.join("alive")).map_err(|e| prep(&dir, e))?;
        alive.lock().map_err(|e| prep(&dir, e))?;
        let mut cp = ControlPlane {
            kubeconfig: dir.join("kubeconfig"),
            dir,
            children: Vec::new(),
            _alive: alive,
        };
        cp.launch(&bin, leasehold, controllers).await?;
        Ok(cp)
    }

    /// The kubeconfig for the admin user (token auth, loopback, self-signed cert).
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The control plane's temp dir (logs under `logs/`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The pids of the running children.
    pub fn pids(&self) -> Vec<u32> {
        self.children.iter().filter_map(|(_, c)| c.id()).collect()
    }

    /// A client for the admin user.
    pub async fn client(&self) -> Result<Client, DevError> {
        client_for(&self.kubeconfig).await
    }

    async fn launch(&mut self, bin: &Path, leasehold: &Path, controllers: &str) -> Result<(), DevError> {
        let started = Instant::now();
        let d = self.dir.clone();
        let token = format!("{:032x}", rand::random::<u128>());
        let [etcd_port, peer_port, api_port] = free_ports();
        write(&d.join("tokens.csv"), &format!("{token},admin,admin,system:masters\n"))?;
        write(&self.kubeconfig, &kubeconfig_yaml(api_port, &token))?;
        let sa_key = d.join("sa.key");
        let status = std::process::Command::new("openssl")
            .args(["genrsa", "-out"])
            .arg(&sa_key)
            .arg("2048")
            .stderr(std::process::Stdio::null())
            .status()
            .map_err(|e| DevError::Spawn("openssl", e))?;
        if !status.success() {
            return Err(prep(&sa_key, std::io::Error::other("openssl genrsa failed")));
        }
        // etcd's data on tmpfs where there is one: fsyncs there cost nothing.
        let shm = Path::new("/dev/shm");
        let data = if shm.is_dir() {
            shm.join(
                d.file_name()
                    .map(|n| format!("{DIR_PREFIX}-{}", n.to_string_lossy()))
                    .unwrap_or_default(),
            )
        } else {
            d.join("etcd")
        };
        write(&d.join("etcd-data-dir"), &data.to_string_lossy())?;
        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        self.spawn(
            leasehold,
            "etcd",
            &bin.join("etcd"),
            &[
                "--data-dir",
                &data.to_string_lossy(),
                "--name",
                "default",
                "--listen-client-urls",
                &etcd_url,
                "--advertise-client-urls",
                &etcd_url,
                "--listen-peer-urls",
                &peer_url,
                "--initial-advertise-peer-urls",
                &peer_url,
                "--initial-cluster",
                &format!("default={peer_url}"),
                "--log-level",
                "warn",
            ],
        )?;
        let certs = d.join("certs");
        self.spawn(
            leasehold,
            "kube-apiserver",
            &bin.join("kube-apiserver"),
            &[
                "--etcd-servers",
                &etcd_url,
                "--bind-address",
                "127.0.0.1",
                "--secure-port",
                &api_port.to_string(),
                "--insecure-port",
                "0",
                "--cert-dir",
                &certs.to_string_lossy(),
                "--token-auth-file",
                &d.join("tokens.csv").to_string_lossy(),
                "--authorization-mode",
                "RBAC",
                "--service-account-issuer",
                "https://kubernetes.default.svc",
                "--service-account-key-file",
                &sa_key.to_string_lossy(),
                "--service-account-signing-key-file",
                &sa_key.to_string_lossy(),
                "--service-cluster-ip-range",
                "10.96.0.0/16",
                "--advertise-address",
                "127.0.0.1",
                "--profiling=false",
            ],
        )?;
        let client = client_for(&self.kubeconfig).await?;
        self.wait_ready(&client).await?;
        let kcm = bin.join("kube-controller-manager");
        if kcm.exists() {
            let kubeconfig = self.kubeconfig.clone();
            self.spawn(
                leasehold,
                "kube-controller-manager",
                &kcm,
                &[
                    "--kubeconfig",
                    &kubeconfig.to_string_lossy(),
                    "--controllers",
                    controllers,
                    "--service-account-private-key-file",
                    &sa_key.to_string_lossy(),
                    "--root-ca-file",
                    &certs.join("apiserver.crt").to_string_lossy(),
                    "--leader-elect=false",
                    "--secure-port",
                    "0",
                    "--port",
                    "0",
                ],
            )?;
        } else {
            tracing::warn!(
                "no kube-controller-manager in {}: claims of deleted pods are not garbage-collected",
                bin.display()
            );
        }
        let pids: Vec<String> = self.pids().iter().map(u32::to_string).collect();
        write(&d.join("pids"), &pids.join("\n"))?;
        tracing::info!(elapsed_ms = started.elapsed().as_millis() as u64, dir = %d.display(), "local control plane ready");
        Ok(())
    }

    fn spawn(&mut self, leasehold: &Path, name: &'static str, program: &Path, args: &[&str]) -> Result<(), DevError> {
        let logs = self.dir.join("logs");
        std::fs::create_dir_all(&logs).map_err(|e| prep(&logs, e))?;
        let log = File::create(logs.join(format!("{name}.log"))).map_err(|e| prep(&logs, e))?;
        let err = log.try_clone().map_err(|e| prep(&logs, e))?;
        let mut cmd = crate::guard::guarded_command(&leasehold.to_path_buf(), Signal::SIGKILL, program);
        cmd.args(args)
            .stdin(std::process::Stdio::null())
            .stdout(log)
            .stderr(err)
            .kill_on_drop(true);
        let child = cmd.spawn().map_err(|e| DevError::Spawn(name, e))?;
        self.children.push((name, child));
        Ok(())
    }

    async fn wait_ready(&mut self, client: &Client) -> Result<(), DevError> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            for (name, child) in &mut self.children {
                if let Ok(Some(status)) = child.try_wait() {
                    return Err(DevError::Exited(name, status, log_tail(&self.dir, name)));
                }
            }
            let req = http::Request::get("/readyz")
                .body(Vec::new())
                .expect("a static request is valid");
            if matches!(client.request_text(req).await, Ok(body) if body.trim() == "ok") {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(DevError::NotReady(READY_TIMEOUT, log_tail(&self.dir, "kube-apiserver")));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Stop every child (SIGTERM, then SIGKILL after [`STOP_GRACE`]) and remove the dir.
    pub async fn stop(mut self) {
        for (_, child) in self.children.iter_mut().rev() {
            if let Some(pid) = child.id() {
                let _ = kill(Pid::from_raw(pid as i32), Signal::SIGTERM);
            }
            if tokio::time::timeout(STOP_GRACE, child.wait()).await.is_err() {
                let _ = child.kill().await;
            }
        }
        self.children.clear();
        remove_dir(&self.dir);
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        for (_, child) in &mut self.children {
            let _ = child.start_kill();
        }
        if !self.children.is_empty() {
            remove_dir(&self.dir);
        }
    }
}

/// Start `leasehold dev --die-with-parent` (the binary at `leasehold`) from a thread
/// that lives as long as this process — the parent-death signal is tied to the spawning
/// thread — and return its kubeconfig once ready. The control plane stops when this
/// process exits, however it exits. For test harnesses and benchmarks.
pub fn spawn_for_process(leasehold: &Path, timeout: Duration) -> std::io::Result<PathBuf> {
    use std::io::BufRead;
    let leasehold = leasehold.to_path_buf();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        // Spawned from this thread, which never ends, not from the caller's.
        let spawned = std::process::Command::new(&leasehold)
            .args(["dev", "--die-with-parent"])
            .stdout(std::process::Stdio::piped())
            .spawn();
        let mut child = match spawned {
            Ok(child) => child,
            Err(e) => return drop(tx.send(Err(e))),
        };
        let stdout = child.stdout.take().expect("stdout is piped");
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(path) = line.strip_prefix("KUBECONFIG=") {
                let _ = tx.send(Ok(PathBuf::from(path)));
            }
        }
        let _keep = child; // hold the child while this thread parks forever
        loop {
            std::thread::park();
        }
    });
    rx.recv_timeout(timeout).map_err(|_| {
        std::io::Error::other(format!(
            "leasehold dev was not ready within {timeout:?} (see its stderr)"
        ))
    })?
}

/// A client for a kubeconfig file.
pub async fn client_for(path: &Path) -> Result<Client, DevError> {
    let kc = Kubeconfig::read_from(path).map_err(|e| DevError::Client(kube::Error::InferKubeconfig(e)))?;
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(|e| DevError::Client(kube::Error::InferKubeconfig(e)))?;
    Client::try_from(config).map_err(DevError::Client)
}

fn kubeconfig_yaml(port: u16, token: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: leasehold-dev\n  cluster:\n    server: https://127.0.0.1:{port}\n    insecure-skip-tls-verify: true\nusers:\n- name: admin\n  user:\n    token: {token}\ncontexts:\n- name: leasehold-dev\n  context:\n    cluster: leasehold-dev\n    user: admin\n    namespace: default\ncurrent-context: leasehold-dev\n"
    )
}

/// Three distinct free loopback ports (bound together, then released).
fn free_ports() -> [u16; 3] {
    let socks: Vec<_> = (0..3)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("bind a loopback port"))
        .collect();
    let port = |i: usize| socks[i].local_addr().expect("bound socket has an address").port();
    [port(0), port(1), port(2)]
}

fn root_dir() -> PathBuf {
    std::env::temp_dir().join(DIR_PREFIX)
}

fn new_dir() -> Result<PathBuf, DevError> {
    let dir = root_dir().join(format!("{}-{:08x}", std::process::id(), rand::random::<u32>()));
    std::fs::create_dir_all(&dir).map_err(|e| prep(&dir, e))?;
    Ok(dir)
}

/// Remove the dirs of launchers that died without cleaning up (their lock is free).
pub fn sweep_stale_dirs() {
    let Ok(entries) = std::fs::read_dir(root_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let dir = entry.path();
        let stale = match File::open(dir.join("alive")) {
            Ok(f) => f.try_lock().is_ok(),
            Err(_) => dir
                .metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|t| t.elapsed().unwrap_or_default() > Duration::from_secs(600)),
        };
        if stale {
            tracing::info!(dir = %dir.display(), "removing a stale control plane dir");
            remove_dir(&dir);
        }
    }
}

fn remove_dir(dir: &Path) {
    if let Ok(data) = std::fs::read_to_string(dir.join("etcd-data-dir")) {
        let _ = std::fs::remove_dir_all(data.trim());
    }
    let _ = std::fs::remove_dir_all(dir);
}

fn log_tail(dir: &Path, name: &str) -> String {
    let text = std::fs::read_to_string(dir.join("logs").join(format!("{name}.log"))).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

fn write(path: &Path, text: &str) -> Result<(), DevError> {
    std::fs::write(path, text).map_err(|e| prep(path, e))
}

fn prep(path: &Path, e: std::io::Error) -> DevError {
    DevError::Prepare(path.display().to_string(), e)
}
