//! The API server's Lease write ceiling, measured in the same run as the scale rows:
//! `wrk` (Debian's package) sends merge PATCHes to a set of Leases, each one a real
//! write (a field that changes every time), on as many connections as asked, with the
//! kubeconfig's bearer token. What the controller gets out of the API server is then a
//! share of this figure.

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, PostParams};

/// Leases the load is spread over.
const TARGETS: usize = 64;
/// Parallel connections (as the issue measured it).
pub const CONNECTIONS: usize = 32;

/// What `wrk` measured.
pub struct Ceiling {
    /// Successful PATCHes per second.
    pub writes_per_sec: f64,
    /// Requests answered with anything but 2xx/3xx (0 expected: each would be a
    /// failed write counted as one).
    pub failed: u64,
    /// `wrk`'s median and 99th percentile latency, as it prints them.
    pub latency: (String, String),
}

/// Measure the ceiling for `duration` on the API server of `kubeconfig` (which must
/// carry a bearer token, as the local control plane's does), in namespace `ns`.
pub async fn measure(
    client: &kube::Client,
    kubeconfig: &Path,
    ns: &str,
    duration: Duration,
) -> anyhow::Result<Ceiling> {
    let config = kube::config::Kubeconfig::read_from(kubeconfig)?;
    let server = config
        .clusters
        .first()
        .and_then(|c| c.cluster.as_ref())
        .and_then(|c| c.server.clone())
        .ok_or_else(|| anyhow::anyhow!("no server in {}", kubeconfig.display()))?;
    // The kubeconfig as written (its serialisation shows the token).
    let token = serde_json::to_value(&config)?
        .pointer("/users/0/user/token")
        .and_then(|t| t.as_str())
        .map(String::from)
        .ok_or_else(|| anyhow::anyhow!("no token in {}: the ceiling needs one", kubeconfig.display()))?;
    leasehold::testing::scale::namespace(client, ns).await?;
    let leases: Api<Lease> = Api::namespaced(client.clone(), ns);
    for i in 0..TARGETS {
        let lease: Lease = serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("c{i}")}, "spec": {"leaseTransitions": 0}
        }))?;
        leases.create(&PostParams::default(), &lease).await?;
    }
    let script = std::env::temp_dir().join(format!("leasehold-ceiling-{}.lua", std::process::id()));
    std::fs::write(&script, lua(ns, &token))?;
    let out = tokio::process::Command::new("wrk")
        .args([
            "-t2",
            &format!("-c{CONNECTIONS}"),
            &format!("-d{}s", duration.as_secs()),
        ])
        .args(["--latency", "-s"])
        .arg(&script)
        .arg(&server)
        .output()
        .await
        .map_err(|e| anyhow::anyhow!("running wrk (apt-get install wrk): {e}"))?;
    let _ = std::fs::remove_file(&script);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    anyhow::ensure!(
        out.status.success(),
        "wrk failed: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    parse(&text)
}

/// The request script: PATCH lease `c(i mod TARGETS)` setting a counter unique to the
/// request, so every request is a write.
fn lua(ns: &str, token: &str) -> String {
    format!(
        r#"local counter = 0
setup = function(thread)
  thread:set("id", counter)
  counter = counter + 1
end
init = function(args)
  id = wrk.thread:get("id")
  n = 0
end
request = function()
  n = n + 1
  local path = "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/c" .. ((n * 2 + id) % {TARGETS})
  local body = '{{"spec":{{"leaseTransitions":' .. (n * 2 + id) .. '}}}}'
  return wrk.format("PATCH", path, {{["Content-Type"] = "application/merge-patch+json", ["Authorization"] = "Bearer {token}"}}, body)
end
"#
    )
}

/// Requests/s, failures and latency from `wrk --latency`'s report.
fn parse(text: &str) -> anyhow::Result<Ceiling> {
    let field = |prefix: &str| {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(prefix).map(|v| v.trim().to_string()))
    };
    let rate: f64 = field("Requests/sec:")
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no Requests/sec in wrk's report: {text}"))?;
    let failed = field("Non-2xx or 3xx responses:")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let requests: f64 = text
        .lines()
        .find_map(|l| l.split_once(" requests in ").and_then(|(n, _)| n.trim().parse().ok()))
        .unwrap_or(0.0);
    let ok_share = if requests > 0.0 {
        1.0 - failed as f64 / requests
    } else {
        1.0
    };
    Ok(Ceiling {
        writes_per_sec: rate * ok_share,
        failed,
        latency: (field("50%").unwrap_or_default(), field("99%").unwrap_or_default()),
    })
}
