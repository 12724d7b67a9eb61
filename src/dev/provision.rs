//! Finding (or building) the control plane's binaries.

use std::path::PathBuf;

use super::DevError;

/// The provisioning script, embedded so an installed binary can provision too.
const SCRIPT: &str = concat!(
    include_str!("../../scripts/apt.sh"),
    include_str!("../../scripts/provision-k8s.sh")
);

/// Environment variable naming a directory that already holds the binaries.
pub const BIN_ENV: &str = "LEASEHOLD_K8S_BIN";

/// The directory holding `etcd`, `kube-apiserver` and (optionally)
/// `kube-controller-manager`: `$LEASEHOLD_K8S_BIN` if set, else whatever the
/// provisioning script finds or builds (`$KUBEBUILDER_ASSETS`, the cache, a build).
pub async fn binaries() -> Result<PathBuf, DevError> {
    if let Some(dir) = std::env::var_os(BIN_ENV) {
        return Ok(PathBuf::from(dir));
    }
    let out = tokio::process::Command::new("bash")
        .arg("-c")
        .arg(SCRIPT)
        .arg("provision-k8s")
        .stderr(std::process::Stdio::inherit())
        .output()
        .await
        .map_err(DevError::Provision)?;
    if !out.status.success() {
        return Err(DevError::ProvisionFailed(out.status));
    }
    let dir = String::from_utf8_lossy(&out.stdout).trim().to_string();
    Ok(PathBuf::from(dir))
}
