//! A real local control plane for tests and the demo: etcd, kube-apiserver and
//! kube-controller-manager as plain processes on loopback ports, in a temp dir.
//!
//! Every child runs under [`crate::supervise`], so it dies with the process that started
//! it, even one killed by SIGKILL. The temp dir carries a lock file held for the
//! launcher's lifetime; a later start removes dirs whose lock is free (their launcher
//! died without cleaning up). [`ControlPlane::stop`] (or dropping it) ends the
//! children and removes the dir.

mod children;
pub mod demo;
mod provision;
mod workdir;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kube::Client;
use tokio::process::Child;

pub use provision::{BIN_ENV, binaries};
pub use workdir::sweep_stale_dirs;
use workdir::{free_ports, issuers_pem, kubeconfig_yaml, new_dir, write};

/// How long the API server may take to report ready.
pub const READY_TIMEOUT: Duration = Duration::from_secs(90);
/// How long a child gets to exit after SIGTERM before SIGKILL.
pub const STOP_GRACE: Duration = Duration::from_secs(5);
/// The directory (under the system temp dir) holding every launcher's own dir.
pub const DIR_PREFIX: &str = "leasehold-dev";
/// The file beside the kubeconfig that holds etcd's client URL.
pub const ETCD_ENDPOINT_FILE: &str = "etcd-endpoint";

/// The etcd client URL of the control plane whose kubeconfig is `kubeconfig`.
pub fn etcd_endpoint(kubeconfig: &Path) -> std::io::Result<String> {
    let dir = kubeconfig.parent().unwrap_or(Path::new("."));
    Ok(std::fs::read_to_string(dir.join(ETCD_ENDPOINT_FILE))?
        .trim()
        .to_string())
}

/// The kube-controller-manager controllers run by default: enough for garbage
/// collection of claims, namespace deletion, ServiceAccount tokens and the root CA each
/// pod's bound token volume mounts.
pub const DEFAULT_CONTROLLERS: &str =
    "garbagecollector,namespace,serviceaccount-token,serviceaccount,root-ca-cert-publisher";

/// Feature gates of the API server and kube-controller-manager: pods get bound
/// service-account tokens (which name their pod) as on Kubernetes >= 1.21, the default
/// there; v1.20, the newest built here, has them behind this gate.
const FEATURE_GATES: &str = "--feature-gates=BoundServiceAccountTokenVolume=true";

/// How a control plane is laid out.
#[derive(Clone, Debug)]
pub struct Layout {
    /// The kube-controller-manager controllers to run (comma-separated).
    pub controllers: String,
    /// Where kube-apiserver listens and what it advertises (the `kubernetes` Service's
    /// endpoint): loopback for one machine, a bridge's address for nodes in network
    /// namespaces (`tests/e2e/cluster.sh`).
    pub address: std::net::IpAddr,
    /// The pods' network: kube-controller-manager gives each node a /24 of it (its
    /// `nodeipam` controller runs too).
    pub cluster_cidr: Option<String>,
}

impl Default for Layout {
    fn default() -> Self {
        Layout {
            controllers: DEFAULT_CONTROLLERS.to_string(),
            address: std::net::Ipv4Addr::LOCALHOST.into(),
            cluster_cidr: None,
        }
    }
}

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
    layout: Layout,
    children: Vec<(&'static str, Child)>,
    /// How each child was started: (name, leasehold binary, program, arguments).
    specs: Vec<(&'static str, PathBuf, PathBuf, Vec<String>)>,
    _alive: File,
}

// === impl ControlPlane ===

impl ControlPlane {
    /// Start etcd, kube-apiserver and (if present) kube-controller-manager, and wait
    /// until the API server is ready. `leasehold` is the path of the leasehold binary,
    /// used to guard the children.
    pub async fn start(leasehold: &Path) -> Result<Self, DevError> {
        Self::start_with(leasehold, Layout::default()).await
    }

    /// [`ControlPlane::start`], laid out as `layout` says.
    pub async fn start_with(leasehold: &Path, layout: Layout) -> Result<Self, DevError> {
        let bin = binaries().await?;
        sweep_stale_dirs();
        let dir = new_dir()?;
        let alive = File::create(dir.join("alive")).map_err(|e| prep(&dir, e))?;
        alive.lock().map_err(|e| prep(&dir, e))?;
        let mut cp = ControlPlane {
            kubeconfig: dir.join("kubeconfig"),
            dir,
            layout,
            children: Vec::new(),
            specs: Vec::new(),
            _alive: alive,
        };
        cp.launch(&bin, leasehold).await?;
        Ok(cp)
    }

    /// The kubeconfig for the admin user (token auth, loopback; trusting the CA of the
    /// API server's self-made certificate once it is ready).
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
        crate::kubeconfig::client_for(&self.kubeconfig)
            .await
            .map_err(DevError::Client)
    }

    /// Once kube-apiserver has made its serving certificate (it has when it is ready),
    /// rewrite the kubeconfig to trust the CA it signed it with instead of any
    /// certificate: clients then verify the server, and each client process skips
    /// loading the system's trust store (half the CPU of a short `leasehold status`).
    fn trust_serving_ca(&self, certs: &Path, api_port: u16, token: &str) -> Result<(), DevError> {
        let chain = certs.join("apiserver.crt");
        let text = std::fs::read_to_string(&chain).map_err(|e| prep(&chain, e))?;
        let Some(ca) = issuers_pem(&text) else {
            tracing::warn!(chain = %chain.display(), "no CA in kube-apiserver's certificate chain; the kubeconfig trusts any certificate");
            return Ok(());
        };
        let ca_path = certs.join("ca.crt");
        write(&ca_path, &ca)?;
        let tmp = self.kubeconfig.with_extension("new");
        write(
            &tmp,
            &kubeconfig_yaml((self.layout.address, api_port), token, Some(&ca_path)),
        )?;
        std::fs::rename(&tmp, &self.kubeconfig).map_err(|e| prep(&self.kubeconfig, e))
    }

    /// Start etcd on `[client, peer]` ports, its data on tmpfs where there is one
    /// (fsyncs there cost nothing); its client URL.
    fn start_etcd(&mut self, bin: &Path, leasehold: &Path, [client, peer]: [u16; 2]) -> Result<String, DevError> {
        let d = self.dir.clone();
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
        let etcd_url = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        // Beside the kubeconfig, for tools that talk to etcd itself (`etcdctl lock` in
        // the handoff benchmark).
        write(&d.join(ETCD_ENDPOINT_FILE), &etcd_url)?;
        let args = [
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
        ];
        self.spawn(leasehold, "etcd", &bin.join("etcd"), &args)?;
        Ok(etcd_url)
    }

    /// Start kube-controller-manager as the layout says, if `bin` has one (without it,
    /// claims of deleted pods are not garbage-collected).
    fn start_controller_manager(
        &mut self,
        (bin, leasehold): (&Path, &Path),
        sa_key: &Path,
        certs: &Path,
    ) -> Result<(), DevError> {
        let kcm = bin.join("kube-controller-manager");
        if !kcm.exists() {
            tracing::warn!(
                "no kube-controller-manager in {}: claims of deleted pods are not garbage-collected",
                bin.display()
            );
            return Ok(());
        }
        let mut controllers = self.layout.controllers.clone();
        let mut args: Vec<String> = vec![
            "--kubeconfig".into(),
            self.kubeconfig.to_string_lossy().into_owned(),
            "--service-account-private-key-file".into(),
            sa_key.to_string_lossy().into_owned(),
            "--root-ca-file".into(),
            certs.join("apiserver.crt").to_string_lossy().into_owned(),
            "--leader-elect=false".into(),
            FEATURE_GATES.into(),
            "--secure-port=0".into(),
            "--port=0".into(),
        ];
        if let Some(cidr) = &self.layout.cluster_cidr {
            if !controllers.split(',').any(|c| c == "nodeipam") {
                controllers.push_str(",nodeipam");
            }
            args.push("--allocate-node-cidrs=true".into());
            args.push(format!("--cluster-cidr={cidr}"));
            args.push("--node-cidr-mask-size=24".into());
        }
        args.push(format!("--controllers={controllers}"));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.spawn(leasehold, "kube-controller-manager", &kcm, &args)
    }

    async fn launch(&mut self, bin: &Path, leasehold: &Path) -> Result<(), DevError> {
        let started = Instant::now();
        let d = self.dir.clone();
        let token = format!("{:032x}", rand::random::<u128>());
        let [etcd_port, peer_port, api_port] = free_ports();
        write(&d.join("tokens.csv"), &format!("{token},admin,admin,system:masters\n"))?;
        let address = self.layout.address.to_string();
        write(
            &self.kubeconfig,
            &kubeconfig_yaml((self.layout.address, api_port), &token, None),
        )?;
        let sa_key = service_account_key(&d)?;
        let etcd_url = self.start_etcd(bin, leasehold, [etcd_port, peer_port])?;
        let (certs, tokens) = (d.join("certs"), d.join("tokens.csv"));
        let args = [
            "--etcd-servers",
            &etcd_url,
            "--bind-address",
            &address,
            "--secure-port",
            &api_port.to_string(),
            "--insecure-port",
            "0",
            "--cert-dir",
            &certs.to_string_lossy(),
            "--token-auth-file",
            &tokens.to_string_lossy(),
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
            &address,
            // Nodes by their address: their names resolve nowhere (exec, logs).
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            // Webhooks by their Services' endpoints (no kube-proxy on this host), as a
            // cluster's API server reaches them through its own.
            "--enable-aggregator-routing=true",
            "--profiling=true",
            FEATURE_GATES,
        ];
        self.spawn(leasehold, "kube-apiserver", &bin.join("kube-apiserver"), &args)?;
        let client = crate::kubeconfig::client_for(&self.kubeconfig)
            .await
            .map_err(DevError::Client)?;
        self.wait_ready(&client).await?;
        self.trust_serving_ca(&certs, api_port, &token)?;
        self.start_controller_manager((bin, leasehold), &sa_key, &certs)?;
        let pids: Vec<String> = self.pids().iter().map(u32::to_string).collect();
        write(&d.join("pids"), &pids.join("\n"))?;
        tracing::info!(elapsed_ms = started.elapsed().as_millis() as u64, dir = %d.display(), "local control plane ready");
        Ok(())
    }
}

fn prep(path: &Path, e: std::io::Error) -> DevError {
    DevError::Prepare(path.display().to_string(), e)
}

/// Make the service-account signing key in `dir`.
fn service_account_key(dir: &Path) -> Result<PathBuf, DevError> {
    let sa_key = dir.join("sa.key");
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
    Ok(sa_key)
}
