//! `leasehold status NAME`: the lock's holders, token and queue.

use std::path::PathBuf;

use jiff::Timestamp;
use kube::api::Api;

use crate::api::DistributedLock;

/// Options of `leasehold status`.
#[derive(clap::Args, Debug)]
pub struct StatusArgs {
    /// The DistributedLock's name.
    pub lock: String,
    /// Its namespace; default: the kubeconfig's.
    #[arg(long, short = 'n')]
    pub namespace: Option<String>,
    /// Output format: `table` or `json`.
    #[arg(long, short = 'o', default_value = "table", value_parser = ["table", "json"])]
    pub output: String,
    /// Path of a kubeconfig.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
}

/// Print the lock's status.
pub async fn run(args: StatusArgs) -> anyhow::Result<()> {
    let client = crate::kubeconfig::client(args.kubeconfig.as_deref()).await?;
    let ns = args.namespace.unwrap_or_else(|| client.default_namespace().to_string());
    let lock = Api::<DistributedLock>::namespaced(client, &ns).get(&args.lock).await?;
    if args.output == "json" {
        println!("{}", serde_json::to_string_pretty(&lock.status.unwrap_or_default())?);
    } else {
        print!("{}", table(&lock, Timestamp::now()));
    }
    Ok(())
}

/// The human-readable status table.
pub fn table(lock: &DistributedLock, now: Timestamp) -> String {
    use std::fmt::Write;
    let st = lock.status.clone().unwrap_or_default();
    let ago = |t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time| {
        let secs = (now.as_second() - t.0.as_second()).max(0);
        format!("{secs}s")
    };
    let mut out = String::new();
    let name = lock.metadata.name.as_deref().unwrap_or("");
    let _ = writeln!(
        out,
        "Lock {name}: fencing token {}, {} of {} slots held, {} waiting (lease {}s)",
        st.fencing_token,
        st.holders.len(),
        lock.spec.max_holders,
        st.queue.len(),
        lock.spec.lease_duration_seconds
    );
    let _ = writeln!(
        out,
        "\n{:<8} {:<30} {:<8} {:<10} CLAIM",
        "ROLE", "POD", "TOKEN", "SINCE"
    );
    for h in &st.holders {
        let role = if h.revoked.is_some() { "revoked" } else { "holder" };
        let _ = writeln!(
            out,
            "{role:<8} {:<30} {:<8} {:<10} {}",
            h.pod,
            h.fencing_token,
            ago(&h.granted_at),
            h.claim
        );
    }
    for (i, w) in st.queue.iter().enumerate() {
        let _ = writeln!(
            out,
            "{:<8} {:<30} {:<8} {:<10} {}",
            format!("#{}", i + 1),
            w.pod,
            "-",
            ago(&w.requested_at),
            w.claim
        );
    }
    out
}
