//! Building a Kubernetes client: from a kubeconfig file and/or a named context, or the
//! usual inference (`$KUBECONFIG`, `~/.kube/config`, in-cluster).

use std::path::Path;

use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};

/// A client for a kubeconfig file (its current context).
pub async fn client_for(path: &Path) -> Result<Client, kube::Error> {
    client(Some(path), None).await
}

/// A client for `kubeconfig` (else `$KUBECONFIG` or `~/.kube/config`) and `context`
/// (else the current context); with neither given, the inferred default, which falls
/// back to the in-cluster configuration.
pub async fn client(kubeconfig: Option<&Path>, context: Option<&str>) -> Result<Client, kube::Error> {
    Client::try_from(config(kubeconfig, context).await?)
}

/// The configuration [`client`] builds its client from (read once, it can make several
/// clients, each with its own connection pool).
pub async fn config(kubeconfig: Option<&Path>, context: Option<&str>) -> Result<kube::Config, kube::Error> {
    let options = KubeConfigOptions {
        context: context.map(String::from),
        ..KubeConfigOptions::default()
    };
    let config = match (kubeconfig, context) {
        (Some(path), _) => {
            let kc = Kubeconfig::read_from(path).map_err(kube::Error::InferKubeconfig)?;
            kube::Config::from_custom_kubeconfig(kc, &options).await
        }
        (None, Some(_)) => kube::Config::from_kubeconfig(&options).await,
        (None, None) => return kube::Config::infer().await.map_err(kube::Error::InferConfig),
    };
    config.map_err(kube::Error::InferKubeconfig)
}
