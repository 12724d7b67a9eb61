//! The options every cluster-facing subcommand shares: which kubeconfig and context.

use std::path::PathBuf;

/// Which cluster to talk to.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ClusterArgs {
    /// Path of a kubeconfig; default: $KUBECONFIG, ~/.kube/config, or in-cluster.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use; default: its current context.
    #[arg(long)]
    pub context: Option<String>,
}

impl ClusterArgs {
    /// A client for the chosen kubeconfig and context.
    pub async fn client(&self) -> Result<kube::Client, kube::Error> {
        crate::kubeconfig::client_from(self.config().await?)
    }

    /// The configuration of the chosen kubeconfig and context (read once for several
    /// clients).
    pub async fn config(&self) -> Result<kube::Config, kube::Error> {
        crate::kubeconfig::config(self.kubeconfig.as_deref(), self.context.as_deref()).await
    }
}
