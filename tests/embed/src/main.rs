//! Compiles only if leasehold's client feature builds with the user's own k8s-openapi
//! version feature and pulls in none of the binary's dependencies.

use k8s_openapi::api::core::v1::Pod;
use leasehold::api::DistributedLock;
use leasehold::client::Lock;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::args().nth(1).as_deref() != Some("--connect") {
        // Built and run in CI without a cluster: the types line up, that is the check.
        let _: Option<Pod> = None;
        println!("leasehold's client embeds beside the user's own k8s-openapi version (v1_34)");
        return Ok(());
    }
    let client = kube::Client::try_default().await?;
    let locks: kube::Api<DistributedLock> = kube::Api::default_namespaced(client.clone());
    println!("{} locks", locks.list(&Default::default()).await?.items.len());
    let lock = Lock::new(client, "default", "demo")?;
    let guard = lock.acquire().await?;
    println!("fencing token {}", guard.fencing_token());
    guard.release().await?;
    Ok(())
}
