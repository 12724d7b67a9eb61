//! `leasehold status NAME`: the lock's holders, token and queue, or the whole object.

use jiff::Timestamp;
use kube::api::Api;

use super::ClusterArgs;
use crate::api::DistributedLock;

/// Options of `leasehold status`.
#[derive(clap::Args, Debug)]
pub struct StatusArgs {
    /// The DistributedLock's name.
    pub lock: String,
    /// Its namespace; default: the kubeconfig's.
    #[arg(long, short = 'n')]
    pub namespace: Option<String>,
    /// Output format: a table of holders and queue, or the whole object as JSON or YAML.
    #[arg(long, short = 'o', value_enum, default_value_t = Output::Table)]
    pub output: Output,
    /// Which cluster.
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

/// The output formats of `leasehold status`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// Holders and queue, for people.
    Table,
    /// The whole DistributedLock as JSON.
    Json,
    /// The whole DistributedLock as YAML.
    Yaml,
}

/// Print the lock's status.
pub async fn run(args: StatusArgs) -> anyhow::Result<()> {
    let client = args.cluster.client().await?;
    let ns = args.namespace.unwrap_or_else(|| client.default_namespace().to_string());
    let lock = Api::<DistributedLock>::namespaced(client, &ns)
        .get_opt(&args.lock)
        .await?
        .ok_or_else(|| {
            anyhow::anyhow!(
                "lock {} does not exist in namespace {ns} (kubectl get distributedlocks -n {ns})",
                args.lock
            )
        })?;
    print!("{}", render(lock, args.output, Timestamp::now())?);
    Ok(())
}

/// The lock in the chosen format. JSON and YAML show the whole object, without the
/// managed fields (as kubectl does).
pub fn render(mut lock: DistributedLock, output: Output, now: Timestamp) -> anyhow::Result<String> {
    lock.metadata.managed_fields = None;
    Ok(match output {
        Output::Table => crate::show::table(&lock, now),
        Output::Json => serde_json::to_string_pretty(&lock)? + "\n",
        Output::Yaml => serde_norway::to_string(&lock)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lock() -> DistributedLock {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "leasehold.dev/v1alpha1", "kind": "DistributedLock",
            "metadata": {"name": "db", "namespace": "ns", "managedFields": [{"manager": "kubectl"}]},
            "spec": {"leaseDurationSeconds": 15, "maxHolders": 1},
            "status": {"fencingToken": 7, "holders": [{"claim": "db-1", "pod": "a", "podUID": "u",
                "fencingToken": 7, "grantedAt": "2024-01-01T00:00:00Z"}]},
        }))
        .unwrap()
    }

    #[test]
    fn json_and_yaml_show_the_whole_object_without_managed_fields() {
        let now = Timestamp::now();
        let json: serde_json::Value = serde_json::from_str(&render(lock(), Output::Json, now).unwrap()).unwrap();
        assert_eq!(json["kind"], "DistributedLock");
        assert_eq!(json["metadata"]["name"], "db");
        assert_eq!(json["spec"]["maxHolders"], 1);
        assert_eq!(json["status"]["holders"][0]["pod"], "a");
        assert!(json["metadata"].get("managedFields").is_none());
        let yaml = render(lock(), Output::Yaml, now).unwrap();
        let back: serde_json::Value = serde_norway::from_str(&yaml).unwrap();
        assert_eq!(back, json, "the YAML is the same object:\n{yaml}");
    }

    #[test]
    fn the_table_names_the_lock_and_its_holder() {
        let text = render(lock(), Output::Table, Timestamp::now()).unwrap();
        assert!(
            text.starts_with("Lock db: fencing token 7, 1 of 1 slots held"),
            "{text}"
        );
        let holder = text.lines().find(|l| l.starts_with("holder")).unwrap_or_default();
        assert_eq!(
            holder.split_whitespace().take(3).collect::<Vec<_>>(),
            ["holder", "a", "7"],
            "{text}"
        );
    }

    #[test]
    fn the_table_shows_the_successor_with_its_reserved_token() {
        let mut l = lock();
        let status = l.status.as_mut().unwrap();
        status.queue = serde_json::from_value(serde_json::json!([
            {"claim": "db-2", "pod": "b", "podUID": "ub", "requestedAt": "2024-01-01T00:00:00Z"},
            {"claim": "db-3", "pod": "c", "podUID": "uc", "requestedAt": "2024-01-01T00:00:00Z"},
        ]))
        .unwrap();
        status.successor = Some(crate::api::Successor {
            claim: "db-2".into(),
            fencing_token: 8,
            lease_duration_seconds: None,
        });
        let text = render(l, Output::Table, Timestamp::now()).unwrap();
        let row = |pod: &str| {
            text.lines()
                .find(|r| r.split_whitespace().nth(1) == Some(pod))
                .unwrap_or_default()
                .to_string()
        };
        let b: Vec<String> = row("b").split_whitespace().take(3).map(String::from).collect();
        assert_eq!(b, ["next", "b", "8"], "{text}");
        let c: Vec<String> = row("c").split_whitespace().take(3).map(String::from).collect();
        assert_eq!(c, ["#2", "c", "-"], "{text}");
    }
}
