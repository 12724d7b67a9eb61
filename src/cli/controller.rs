//! `leasehold controller`: run the operator.

use std::net::SocketAddr;

use super::ClusterArgs;

/// Options of `leasehold controller`.
#[derive(clap::Args, Debug)]
pub struct ControllerArgs {
    /// Address for release notices and direct grants (what clients reach), and for
    /// /metrics, /healthz and /readyz unless --probe-addr is given.
    #[arg(long, env = "LEASEHOLD_HTTP_ADDR", default_value = "0.0.0.0:8080")]
    pub http_addr: SocketAddr,
    /// Address for /metrics, /healthz and /readyz apart from --http-addr, so that
    /// nothing clients send there can starve the kubelet's probes (the Helm chart sets
    /// it).
    #[arg(long, env = "LEASEHOLD_PROBE_ADDR")]
    pub probe_addr: Option<SocketAddr>,
    /// The address (usually the pod IP, from the downward API) at which clients reach
    /// --http-addr's port. The controller publishes `http://ADDRESS:PORT` in the status
    /// it writes, and holders send it their release notices there, which makes a
    /// graceful handoff one API write shorter. Without it, holders release through their
    /// claims alone.
    #[arg(long, env = "LEASEHOLD_ADVERTISE_ADDRESS")]
    pub advertise_address: Option<String>,
    /// Elect a leader among replicas through a Lease in this namespace (usually the
    /// controller's own, from the downward API). Without it, run as the only replica.
    #[arg(long, env = "LEASEHOLD_LEADER_ELECTION_NAMESPACE")]
    pub leader_election_namespace: Option<String>,
    /// This replica's identity for leader election.
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// Watch only this namespace (default: all namespaces).
    #[arg(long, env = "LEASEHOLD_WATCH_NAMESPACE")]
    pub namespace: Option<String>,
    /// Serve the validating admission webhook for Leases over HTTPS on this address
    /// (the chart's `admission.enabled` sets it, with a ValidatingWebhookConfiguration).
    /// It keeps a claim's identity, hash and lock label as created and its lease from
    /// decreasing, and confines the lock clients' service accounts to claims.
    #[arg(long, env = "LEASEHOLD_ADMISSION_ADDR", requires_all = ["admission_cert", "admission_key"])]
    pub admission_addr: Option<SocketAddr>,
    /// The webhook's certificate chain (PEM).
    #[arg(long, env = "LEASEHOLD_ADMISSION_CERT")]
    pub admission_cert: Option<std::path::PathBuf>,
    /// The webhook's private key (PEM).
    #[arg(long, env = "LEASEHOLD_ADMISSION_KEY")]
    pub admission_key: Option<std::path::PathBuf>,
    /// The service account names (in any namespace) lock clients run as: the webhook
    /// lets them write claim Leases only. Repeat for several.
    #[arg(long = "admission-client-account", env = "LEASEHOLD_ADMISSION_CLIENT_ACCOUNTS",
          value_delimiter = ',', default_value = crate::protocol::admission::CLIENT_ACCOUNT)]
    pub admission_client_accounts: Vec<String>,
    /// Which cluster (default: in-cluster when run in a pod).
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

/// Run the controller until SIGINT or SIGTERM.
pub async fn run(args: ControllerArgs) -> anyhow::Result<()> {
    let client = args.cluster.client().await?;
    let identity = args
        .identity
        .unwrap_or_else(|| format!("leasehold-{}", std::process::id()));
    let opts = crate::controller::Options {
        leader_election_namespace: args.leader_election_namespace,
        identity,
        http_addr: Some(args.http_addr),
        probe_addr: args.probe_addr,
        namespace: args.namespace,
        release_url: args
            .advertise_address
            .as_deref()
            .map(|a| crate::controller::release_url(a, args.http_addr.port())),
        notice_wait: crate::protocol::timing::NOTICE_WAIT,
        etcd_mirror: crate::controller::EtcdMirrorPace::default(),
        admission: admission(
            &args.admission_addr,
            &args.admission_cert,
            &args.admission_key,
            args.admission_client_accounts,
        ),
    };
    crate::controller::run(client, opts, shutdown_signal()).await?;
    Ok(())
}

/// The webhook's configuration, when its address is given (clap requires the
/// certificate and key with it).
fn admission(
    addr: &Option<SocketAddr>,
    cert: &Option<std::path::PathBuf>,
    key: &Option<std::path::PathBuf>,
    client_accounts: Vec<String>,
) -> Option<crate::controller::admission::Admission> {
    Some(crate::controller::admission::Admission {
        addr: (*addr)?,
        cert: cert.clone()?,
        key: key.clone()?,
        policy: crate::protocol::admission::Policy { client_accounts },
    })
}

/// Completes on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let mut term =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("install SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
