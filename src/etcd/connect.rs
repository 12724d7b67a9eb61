//! Connecting to a lock's etcd: endpoints from the lock, TLS from files (in a pod) or
//! from the Secret's bytes (the controller).

use std::path::{Path, PathBuf};
use std::time::Duration;

use etcd_client::{Certificate, Client, ConnectOptions, Identity, TlsOptions};

use super::Error;
use crate::api::EtcdBackend;

/// The environment variable naming the directory with the etcd TLS files in a pod.
pub const TLS_DIR_ENV: &str = "LEASEHOLD_ETCD_TLS_DIR";
/// The environment variable that, in a pod, replaces the lock's endpoints (comma
/// separated): for pods that reach etcd by another address (a node-local proxy).
pub const ENDPOINTS_ENV: &str = "LEASEHOLD_ETCD_ENDPOINTS";
/// Where a pod mounts the lock's `tlsSecretRef` Secret by default.
pub const DEFAULT_TLS_DIR: &str = "/var/run/secrets/leasehold.dev/etcd";
/// How long connecting to an endpoint may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The TLS material of a lock's etcd: PEM bytes of `ca.crt`, `tls.crt`, `tls.key`.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    /// The CA that signed etcd's server certificate.
    pub ca: Vec<u8>,
    /// The client certificate.
    pub cert: Vec<u8>,
    /// The client key.
    pub key: Vec<u8>,
}

/// The directory a pod reads the TLS files from: `LEASEHOLD_ETCD_TLS_DIR`, else
/// [`DEFAULT_TLS_DIR`].
pub fn tls_dir() -> PathBuf {
    std::env::var_os(TLS_DIR_ENV).map_or_else(|| PathBuf::from(DEFAULT_TLS_DIR), PathBuf::from)
}

fn read(dir: &Path, name: &str) -> Result<Vec<u8>, Error> {
    let path = dir.join(name);
    std::fs::read(&path).map_err(|e| Error::TlsFile(path.display().to_string(), e))
}

/// Connect as a client in a pod: endpoints from [`ENDPOINTS_ENV`] if set, else the
/// lock's; TLS files from [`tls_dir`] when the lock names a Secret; `request_timeout`
/// bounds every request.
pub async fn connect(backend: &EtcdBackend, request_timeout: Duration) -> Result<Client, Error> {
    let mut backend = backend.clone();
    if let Some(list) = std::env::var(ENDPOINTS_ENV).ok().filter(|v| !v.trim().is_empty()) {
        backend.endpoints = list.split(',').map(|e| e.trim().to_string()).collect();
    }
    let tls = match &backend.tls_secret_ref {
        None => None,
        Some(_) => {
            let dir = tls_dir();
            Some(TlsFiles {
                ca: read(&dir, "ca.crt")?,
                cert: read(&dir, "tls.crt")?,
                key: read(&dir, "tls.key")?,
            })
        }
    };
    connect_with(&backend, tls.as_ref(), request_timeout).await
}

/// Connect with the given TLS material (or none). HTTP/2 pings every
/// `request_timeout` find a black-holed connection.
pub async fn connect_with(
    backend: &EtcdBackend,
    tls: Option<&TlsFiles>,
    request_timeout: Duration,
) -> Result<Client, Error> {
    let mut options = ConnectOptions::new()
        .with_connect_timeout(CONNECT_TIMEOUT.min(request_timeout.max(Duration::from_secs(1))))
        .with_timeout(request_timeout)
        .with_keep_alive(request_timeout, request_timeout)
        .with_keep_alive_while_idle(true);
    if let Some(t) = tls {
        let config = TlsOptions::new()
            .ca_certificate(Certificate::from_pem(&t.ca))
            .identity(Identity::from_pem(&t.cert, &t.key));
        options = options.with_tls(config);
    }
    let endpoints = backend.endpoints.join(",");
    Client::connect(&backend.endpoints, Some(options))
        .await
        .map_err(|e| Error::Connect(endpoints, e))
}
