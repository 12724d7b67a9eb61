//! Namespaces, locks and pods for the benchmark's paths.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};
use leasehold::api::{Backend, DistributedLock, DistributedLockSpec, EtcdBackend};
use leasehold::protocol::claim::PodIdentity;

/// The lock every path contends for.
pub const LOCK: &str = "bench";

/// A namespace holding lock [`LOCK`] with this lease.
pub async fn namespace(client: &Client, name: &str, lease_seconds: i32) -> anyhow::Result<()> {
    namespace_on(client, name, lease_seconds, None).await
}

/// [`namespace`], the lock's claims in the etcd at `etcd` when given.
pub async fn namespace_on(client: &Client, name: &str, lease_seconds: i32, etcd: Option<&str>) -> anyhow::Result<()> {
    let backend = etcd.map(|url| Backend {
        etcd: Some(EtcdBackend {
            endpoints: vec![url.into()],
            key_prefix: Some(format!("/leasehold-bench-{}", std::process::id())),
            tls_secret_ref: None,
        }),
    });
    leasehold::testing::scale::namespace(client, name).await?;
    let lock = DistributedLock::new(
        LOCK,
        DistributedLockSpec {
            lease_duration_seconds: lease_seconds,
            max_holders: 1,
            backend,
            max_queue: None,
        },
    );
    Api::<DistributedLock>::namespaced(client.clone(), name)
        .create(&PostParams::default(), &lock)
        .await?;
    Ok(())
}

/// A Pod object (never scheduled) for a claimant's identity.
pub async fn pod(client: &Client, ns: &str, name: &str) -> anyhow::Result<PodIdentity> {
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name}, "spec": {"automountServiceAccountToken": false, "containers": [{"name": "app", "image": "leasehold"}]}
    }))?;
    let pod = Api::<Pod>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &pod)
        .await?;
    Ok(PodIdentity {
        name: name.into(),
        namespace: ns.into(),
        uid: pod.uid().unwrap_or_default(),
    })
}
