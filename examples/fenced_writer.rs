//! A program that uses the leasehold library: it takes a lock, then writes to a
//! "storage" (a file here) that rejects writes carrying a stale fencing token, and
//! stops as soon as the grant is lost.
//!
//! Run it in a pod (it knows its pod from its service-account token, or from POD_NAME,
//! POD_NAMESPACE, POD_UID), or
//! locally against `leasehold dev --controller` with those variables set by hand:
//! `cargo run --example fenced_writer -- my-lock /tmp/store`. The controller grants
//! only claims of live pods, so outside a pod a Pod object named `$POD_NAME` with uid
//! `$POD_UID` must exist: e.g. `kubectl run writer --image=pause` (any image; it never
//! has to run where there is no kubelet), then `POD_NAME=writer POD_UID=$(kubectl get
//! pod writer -o jsonpath='{.metadata.uid}')`.

use std::time::Duration;

use leasehold::client::Lock;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let lock_name = args.next().unwrap_or_else(|| "my-lock".into());
    let store = args.next().unwrap_or_else(|| "/tmp/leasehold-store".into());
    let client = kube::Client::try_default().await?;
    let namespace = std::env::var("POD_NAMESPACE").unwrap_or_else(|_| client.default_namespace().to_string());
    let lock = Lock::builder(client, &namespace, &lock_name)
        .on_wait(|w| eprintln!("waiting: position {} behind {:?}", w.position, w.holders))
        .build()?;
    let guard = lock.acquire().await?;
    let token = guard.fencing_token();
    eprintln!("holding {lock_name} with fencing token {token}");
    for i in 0..5 {
        tokio::select! {
            _ = guard.lost() => anyhow::bail!("lost the lock: stopping before writing again"),
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
        fenced_write(&store, token, &format!("entry {i}"))?;
    }
    guard.release().await?;
    Ok(())
}

/// The storage side of fencing: remember the highest token seen and refuse lower ones.
fn fenced_write(path: &str, token: i64, entry: &str) -> anyhow::Result<()> {
    let seen = std::fs::read_to_string(format!("{path}.token"))
        .ok()
        .and_then(|t| t.trim().parse::<i64>().ok());
    if let Some(seen) = seen.filter(|s| *s > token) {
        anyhow::bail!("storage refused token {token}: it has seen {seen}");
    }
    std::fs::write(format!("{path}.token"), token.to_string())?;
    use std::io::Write;
    writeln!(
        std::fs::OpenOptions::new().create(true).append(true).open(path)?,
        "{token} {entry}"
    )?;
    Ok(())
}
