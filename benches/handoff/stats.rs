//! Figures of one series of samples, the ratio table, and the CSV the plot is drawn from.

use std::io::Write;
use std::path::Path;
use std::time::Duration;

/// The program's arguments when run as a benchmark (`--bench`: `cargo bench`), else
/// `None` (`cargo test` runs every bench target once, as a test).
pub fn bench_args() -> Option<Vec<String>> {
    let argv: Vec<String> = std::env::args().collect();
    argv.iter().any(|a| a == "--bench").then_some(argv)
}

/// The argument after `flag`.
pub fn flag(argv: &[String], flag: &str) -> Option<String> {
    argv.iter()
        .position(|a| a == flag)
        .and_then(|i| argv.get(i + 1).cloned())
}

/// One measured path: its name, what it measures, and its samples.
pub struct Series {
    pub key: &'static str,
    pub what: &'static str,
    pub samples: Vec<Duration>,
}

impl Series {
    pub fn new(key: &'static str, what: &'static str, mut samples: Vec<Duration>) -> Self {
        samples.sort();
        Series { key, what, samples }
    }

    /// The `p` quantile in milliseconds (nearest rank).
    pub fn quantile(&self, p: f64) -> f64 {
        let n = self.samples.len();
        if n == 0 {
            return f64::NAN;
        }
        self.samples[((n as f64 - 1.0) * p).round() as usize].as_secs_f64() * 1000.0
    }

    pub fn print(&self) {
        println!(
            "{:<13} n={:<4} median={:>7.2} ms  p90={:>7.2} ms  p99={:>8.2} ms  max={:>8.2} ms   {}",
            self.key,
            self.samples.len(),
            self.quantile(0.5),
            self.quantile(0.9),
            self.quantile(0.99),
            self.quantile(1.0),
            self.what
        );
    }
}

/// Print every series against the anchor (`etcdctl lock`): median and p99 ratios.
pub fn print_ratios(all: &[Series], anchor: &str) {
    let Some(a) = all.iter().find(|s| s.key == anchor) else {
        return;
    };
    println!("\nratios to {anchor} (same run, same etcd):");
    for s in all.iter().filter(|s| s.key != anchor) {
        println!(
            "  {:<13} median {:>6.2}x   p90 {:>6.2}x   p99 {:>6.2}x",
            s.key,
            s.quantile(0.5) / a.quantile(0.5),
            s.quantile(0.9) / a.quantile(0.9),
            s.quantile(0.99) / a.quantile(0.99)
        );
    }
}

/// Write `series,ms` rows (what `scripts/plot-handoff.py` draws).
pub fn write_csv(all: &[Series], path: &Path) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    writeln!(f, "series,ms")?;
    for s in all {
        for d in &s.samples {
            writeln!(f, "{},{:.3}", s.key, d.as_secs_f64() * 1000.0)?;
        }
    }
    f.flush()
}

/// A reading of the API server's request counters, by (verb, resource).
pub type Counters = std::collections::BTreeMap<(String, String), f64>;

/// The verbs that write.
pub const WRITE_VERBS: [&str; 5] = ["POST", "PUT", "PATCH", "DELETE", "DELETECOLLECTION"];

/// The API server's request counters for every verb (reads and watches included), by
/// (verb, resource), from its /metrics.
pub async fn api_requests(client: &kube::Client) -> anyhow::Result<Counters> {
    let req = http::Request::get("/metrics").body(Vec::new())?;
    let text = client.request_text(req).await?;
    let mut out = Counters::new();
    for line in text.lines().filter(|l| l.starts_with("apiserver_request_total{")) {
        let Some((labels, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let label = |name: &str| {
            let start = labels.find(&format!("{name}=\""))? + name.len() + 2;
            Some(labels[start..].split('"').next()?.to_string())
        };
        let (Some(verb), Some(resource)) = (label("verb"), label("resource")) else {
            continue;
        };
        *out.entry((verb, resource)).or_insert(0.0) += value.parse::<f64>().unwrap_or(0.0);
    }
    Ok(out)
}

/// Every request between two readings per grant, by verb (reads by verb and resource),
/// on the resources a lock's work touches (claims, locks, events, pods), leaving out the
/// claims' creation.
pub fn requests_per_grant(before: &Counters, after: &Counters, grants: usize) -> (f64, String) {
    let mut by_verb = std::collections::BTreeMap::<String, f64>::new();
    for ((verb, resource), n) in after {
        let d = n - before.get(&(verb.clone(), resource.clone())).copied().unwrap_or(0.0);
        let counted = ["leases", "distributedlocks", "events", "pods"].contains(&resource.as_str());
        let created = verb == "POST" && (resource == "leases" || resource == "distributedlocks" || resource == "pods");
        if d > 0.0 && counted && !created {
            let read = ["GET", "LIST", "WATCH"].contains(&verb.as_str());
            let key = if read {
                format!("{verb} {resource}")
            } else {
                verb.clone()
            };
            *by_verb.entry(key).or_insert(0.0) += d;
        }
    }
    let per = |d: f64| d / grants.max(1) as f64;
    let total = by_verb.values().copied().map(per).sum();
    let parts: Vec<String> = by_verb.iter().map(|(v, d)| format!("{v} {:.2}", per(*d))).collect();
    (total, parts.join(", "))
}

/// The API writes between two readings per grant, leaving out the claims' creation:
/// the total and the parts by verb and resource.
pub fn writes_per_grant(before: &Counters, after: &Counters, grants: usize) -> (f64, String) {
    let mut total = 0.0;
    let mut parts = Vec::new();
    for (key, n) in after {
        let d = n - before.get(key).copied().unwrap_or(0.0);
        // Claim creation is the claimant's, not the grant's; the rest (locks, namespaces,
        // pods, the kube-controller-manager's ServiceAccounts) is the benchmark's setup.
        let counted = ["leases", "distributedlocks", "events"].contains(&key.1.as_str());
        let created = key.0 == "POST" && (key.1 == "leases" || key.1 == "distributedlocks");
        if d <= 0.0 || !counted || created || !WRITE_VERBS.contains(&key.0.as_str()) {
            continue;
        }
        total += d;
        parts.push(format!("{} {} {:.2}", key.0, key.1, d / grants as f64));
    }
    (total / grants.max(1) as f64, parts.join(", "))
}

/// Print the writes between two readings per grant, leaving out the claims' creation,
/// and every request (reads and watches too) by verb.
pub fn print_writes_per_grant(path: &str, before: &Counters, after: &Counters, grants: usize) {
    let (total, parts) = writes_per_grant(before, after, grants);
    let (requests, by_verb) = requests_per_grant(before, after, grants);
    println!(
        "{path}: {total:.2} API writes per grant (claim creation excluded): {parts}; \
         {requests:.2} API requests per grant, reads included: {by_verb}"
    );
}
