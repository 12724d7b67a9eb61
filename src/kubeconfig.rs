//! Building a Kubernetes client: from a kubeconfig file, or the usual inference
//! (`$KUBECONFIG`, `~/.kube/config`, in-cluster).

use std::path::Path;

use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};

/// A client for a kubeconfig file.
pub async fn client_for(path: &Path) -> Result<Client, kube::Error> {
    let kc = Kubeconfig::read_from(path).map_err(kube::Error::InferKubeconfig)?;
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(kube::Error::InferKubeconfig)?;
    Client::try_from(config)
}

/// A client for `kubeconfig` when given, else the inferred default.
pub async fn client(kubeconfig: Option<&Path>) -> Result<Client, kube::Error> {
    match kubeconfig {
        Some(path) => client_for(path).await,
        None => Client::try_default().await,
    }
}
