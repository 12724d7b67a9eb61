//! `leasehold contract --lock NAME`: the Rust client driven through the conformance
//! contract (docs/conformance.md), one command a line on stdin, one JSON answer a line
//! on stdout. The conformance suite drives every client (this one, the Python one)
//! through the same lines, so that one suite holds them all to the protocol.

use std::sync::Arc;

use super::ClusterArgs;
use crate::client::{Error, Guard, Lock, State};

/// Options of `leasehold contract`.
#[derive(clap::Args, Debug)]
pub struct ContractArgs {
    /// The DistributedLock's name.
    #[arg(long)]
    pub lock: String,
    /// Its namespace; default: the pod's (`POD_NAMESPACE`, else the service-account token's).
    #[arg(long, short = 'n')]
    pub namespace: Option<String>,
    /// Which cluster.
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

/// Write one answer line.
fn say(event: &str, fields: serde_json::Value) {
    let mut line = serde_json::json!({ "event": event });
    if let (Some(line), serde_json::Value::Object(fields)) = (line.as_object_mut(), fields) {
        line.extend(fields);
    }
    println!("{line}");
}

/// The answer line for a failed acquire.
fn failed(e: &Error) {
    match e {
        Error::Refused { reason, .. } => say(
            "refused",
            serde_json::json!({ "reason": reason.as_str(), "message": e.to_string() }),
        ),
        Error::Timeout(_) => say("timeout", serde_json::json!({})),
        Error::NoSuchLock(_) => say("no-such-lock", serde_json::json!({})),
        Error::ClaimCollected { .. } => say("collected", serde_json::json!({ "message": e.to_string() })),
        e => say("error", serde_json::json!({ "message": e.to_string() })),
    }
}

/// Serve the contract until stdin ends or `exit`.
pub async fn run(args: ContractArgs) -> anyhow::Result<()> {
    let client = args.cluster.client().await?;
    let identity = crate::client::identity::from_pod(args.namespace.as_deref().unwrap_or("default"))?;
    let namespace = args.namespace.unwrap_or_else(|| identity.namespace.clone());
    let lock = Arc::new(
        Lock::builder(client, &namespace, &args.lock)
            .identity(identity)
            .build()?,
    );
    let mut guards: Vec<Guard> = Vec::new();
    say("ready", serde_json::json!({}));
    // Commands are read on a thread of their own (stdin blocks).
    let (tx, mut lines) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    while let Some(line) = lines.recv().await {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.first().copied() {
            None => {}
            Some("acquire" | "acquire-timeout" | "try") => acquire(&lock, &words, &mut guards).await,
            Some("release") => match guards.pop() {
                Some(guard) => match guard.release_retrying(3).await {
                    Ok(()) => say("released", serde_json::json!({ "depth": guards.len() })),
                    Err(e) => say("error", serde_json::json!({ "message": e.to_string() })),
                },
                None => say("error", serde_json::json!({ "message": "nothing to release" })),
            },
            Some("report") => report(&guards),
            Some("exit") => break,
            Some(other) => say(
                "error",
                serde_json::json!({ "message": format!("unknown command {other:?}") }),
            ),
        }
    }
    Ok(())
}

/// `acquire`, `acquire-timeout SECS` or `try`: answer, and keep the guard.
async fn acquire(lock: &Lock, words: &[&str], guards: &mut Vec<Guard>) {
    let acquired = match words[0] {
        "try" => lock.try_acquire().await,
        "acquire" => lock.acquire().await.map(Some),
        _ => match words.get(1).and_then(|s| s.parse::<f64>().ok()) {
            Some(secs) => lock
                .acquire_timeout(std::time::Duration::from_secs_f64(secs))
                .await
                .map(Some),
            None => return say("error", serde_json::json!({ "message": "acquire-timeout SECONDS" })),
        },
    };
    let guard = match acquired {
        Ok(Some(guard)) => guard,
        Ok(None) => return say("busy", serde_json::json!({})),
        Err(e) => return failed(&e),
    };
    let (token, claim) = (guard.fencing_token(), guard.claim().to_string());
    if guards.first().is_none_or(|g| g.claim() != claim) {
        let mut state = guard.state();
        tokio::spawn(async move {
            if let Ok(s) = state.wait_for(|s| matches!(s, State::Lost(_))).await
                && let State::Lost(reason) = *s
            {
                say(
                    "lost",
                    serde_json::json!({ "reason": format!("{reason:?}"), "token": token }),
                );
            }
        });
    }
    guards.push(guard);
    say(
        "acquired",
        serde_json::json!({ "token": token, "claim": claim, "depth": guards.len() }),
    );
}

/// `report`: where the newest acquisition stands.
fn report(guards: &[Guard]) {
    let g = guards.last();
    let lost = g.and_then(|g| match *g.state().borrow() {
        State::Lost(reason) => Some(format!("{reason:?}")),
        _ => None,
    });
    say(
        "report",
        serde_json::json!({
            "holding": g.is_some_and(|g| !g.is_lost()),
            "token": g.map(|g| g.fencing_token()),
            "lost": lost,
            "depth": guards.len(),
        }),
    );
}
