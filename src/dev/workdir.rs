//! The control plane's temp dirs: one per launcher, marked live by a held file lock,
//! swept on the next start once their launcher is gone.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{DIR_PREFIX, DevError, prep};

pub(super) fn root_dir() -> PathBuf {
    std::env::temp_dir().join(DIR_PREFIX)
}

pub(super) fn new_dir() -> Result<PathBuf, DevError> {
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

pub(super) fn remove_dir(dir: &Path) {
    if let Ok(data) = std::fs::read_to_string(dir.join("etcd-data-dir")) {
        let _ = std::fs::remove_dir_all(data.trim());
    }
    let _ = std::fs::remove_dir_all(dir);
}

pub(super) fn log_tail(dir: &Path, name: &str) -> String {
    let text = std::fs::read_to_string(dir.join("logs").join(format!("{name}.log"))).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

pub(super) fn write(path: &Path, text: &str) -> Result<(), DevError> {
    std::fs::write(path, text).map_err(|e| prep(path, e))
}

/// The admin kubeconfig of a control plane at `(address, port)` with bearer `token`,
/// trusting the CA certificate at `ca`, or (before the API server has made its
/// certificate) any certificate.
pub(super) fn kubeconfig_yaml((address, port): (std::net::IpAddr, u16), token: &str, ca: Option<&Path>) -> String {
    let server = std::net::SocketAddr::new(address, port);
    let trust = match ca {
        Some(ca) => format!("certificate-authority: {}", ca.display()),
        None => "insecure-skip-tls-verify: true".to_owned(),
    };
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: leasehold-dev\n  cluster:\n    server: https://{server}\n    {trust}\nusers:\n- name: admin\n  user:\n    token: {token}\ncontexts:\n- name: leasehold-dev\n  context:\n    cluster: leasehold-dev\n    user: admin\n    namespace: default\ncurrent-context: leasehold-dev\n"
    )
}

/// The issuing certificates of a PEM chain (every certificate after the first): the CA
/// kube-apiserver signed its self-made serving certificate with. `None` when the chain
/// has no issuer in it.
pub(super) fn issuers_pem(chain: &str) -> Option<String> {
    const END: &str = "-----END CERTIFICATE-----";
    let blocks: Vec<&str> = chain
        .split_inclusive(END)
        .map(str::trim)
        .filter(|b| b.starts_with("-----BEGIN CERTIFICATE-----") && b.ends_with(END))
        .collect();
    (blocks.len() > 1).then(|| blocks[1..].join("\n") + "\n")
}

/// Three distinct free loopback ports (bound together, then released).
pub(super) fn free_ports() -> [u16; 3] {
    let socks: Vec<_> = (0..3)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("bind a loopback port"))
        .collect();
    let port = |i: usize| socks[i].local_addr().expect("bound socket has an address").port();
    [port(0), port(1), port(2)]
}

#[cfg(test)]
mod tests {
    use super::*;

    const CERT: &str = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----";

    #[test]
    fn the_issuers_are_every_certificate_after_the_serving_one() {
        let ca = CERT.replace("AAAA", "CCCC");
        let chain = format!("{CERT}\n{ca}\n");
        assert_eq!(issuers_pem(&chain).as_deref(), Some(format!("{ca}\n").as_str()));
        assert_eq!(issuers_pem(CERT), None, "a lone certificate names no issuer");
        assert_eq!(issuers_pem(""), None);
    }

    #[test]
    fn the_kubeconfig_trusts_the_ca_once_there_is_one() {
        let with_ca = kubeconfig_yaml(
            (std::net::Ipv4Addr::LOCALHOST.into(), 6443),
            "t",
            Some(Path::new("/d/certs/ca.crt")),
        );
        let parsed = kube::config::Kubeconfig::from_yaml(&with_ca).expect("valid kubeconfig");
        let cluster = parsed.clusters[0].cluster.as_ref().expect("a cluster");
        assert_eq!(cluster.certificate_authority.as_deref(), Some("/d/certs/ca.crt"));
        assert_eq!(cluster.insecure_skip_tls_verify, None);
        let before = kube::config::Kubeconfig::from_yaml(&kubeconfig_yaml(
            (std::net::Ipv4Addr::LOCALHOST.into(), 6443),
            "t",
            None,
        ))
        .expect("valid kubeconfig");
        assert_eq!(
            before.clusters[0]
                .cluster
                .as_ref()
                .expect("a cluster")
                .insecure_skip_tls_verify,
            Some(true)
        );
    }
}
