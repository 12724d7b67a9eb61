//! Prometheus metrics (prometheus-client): the families, their labels, and how the
//! controller records into them. Per-lock series follow the locks: they are removed when
//! the lock watch shows a lock deleted (or gone from a relist).

use std::collections::HashSet;
use std::sync::Mutex;
use std::sync::atomic::AtomicBool;

use kube::ResourceExt;
use kube::runtime::watcher::Event;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use crate::api::{DistributedLock, DistributedLockStatus, RevokeReason};
use crate::decide::{Action, ActionKind};

/// The content type of [`Metrics::encode`]'s output (OpenMetrics text).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// This build's source revision (`LEASEHOLD_REVISION` at compile time), for
/// `leasehold_build_info`.
pub const REVISION: &str = match option_env!("LEASEHOLD_REVISION") {
    Some(r) => r,
    None => "unknown",
};

/// Labels naming one lock.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LockLabels {
    /// The lock's namespace.
    pub namespace: String,
    /// The lock's name.
    pub lock: String,
}

/// A revocation's reason.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// RevokeReason as a string.
    pub reason: String,
}

/// The build's identity.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildLabels {
    /// The crate version.
    pub version: String,
    /// The source revision ([`REVISION`]).
    pub revision: String,
}

/// An error's short fixed category.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CategoryLabels {
    /// See `Error::category`.
    pub category: String,
}

/// The controller's metrics.
pub struct Metrics {
    /// Grants made, per lock.
    pub grants: Family<LockLabels, Counter>,
    /// Revocations, by reason.
    pub revocations: Family<ReasonLabels, Counter>,
    /// Waiting claims, per lock.
    pub queue_depth: Family<LockLabels, Gauge>,
    /// Seconds from queueing to grant.
    pub wait_seconds: Histogram,
    /// Seconds from grant to release or revocation.
    pub hold_seconds: Histogram,
    /// Seconds from seeing a release mark to the next grant being written.
    pub handoff_seconds: Histogram,
    /// Seconds one reconcile took.
    pub reconcile_seconds: Histogram,
    /// Errors by category.
    pub errors: Family<CategoryLabels, Counter>,
    /// Normal events not published: over the event budget.
    pub events_suppressed: Counter,
    /// Release notices taken, by answer.
    pub notices: Family<CategoryLabels, Counter>,
    /// Successors told of their grant before its status write.
    pub direct_grants: Counter,
    /// Successors' grants written on their claims, as the claims asked.
    pub claim_grants: Counter,
    /// Successors waiting here to be told of their grant.
    pub successors_waiting: Gauge,
    /// 1 while this replica leads (or runs without election), else 0.
    pub leader: Gauge,
    /// With the admission webhook served: 1 when this replica's last check found the API
    /// server enforcing it, 0 when a write it must refuse went through (absent: not
    /// checked, or it could not tell).
    pub admission_enforced: Family<CategoryLabels, Gauge>,
    /// Set once the controller's caches are synced (or it is a ready standby).
    pub ready: AtomicBool,
    locks: Mutex<LockSeries>,
    registry: Registry,
}

/// The locks that have per-lock series, and the locks a relist in progress has shown.
#[derive(Default)]
struct LockSeries {
    known: HashSet<LockLabels>,
    relisted: Option<HashSet<LockLabels>>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut r = Registry::with_prefix("leasehold");
        register_build_info(&mut r);
        let buckets = |start, n| Histogram::new(exponential_buckets(start, 2.0, n));
        Metrics {
            leader: add(&mut r, "leader", "1 while this replica leads, else 0", Gauge::default()),
            grants: add(&mut r, "grants", "Grants made", Family::default()),
            revocations: add(&mut r, "revocations", "Grants revoked, by reason", Family::default()),
            queue_depth: add(&mut r, "queue_depth", "Claims waiting for the lock", Family::default()),
            wait_seconds: add(
                &mut r,
                "wait_seconds",
                "Seconds from queueing to grant",
                buckets(0.01, 16),
            ),
            hold_seconds: add(
                &mut r,
                "hold_seconds",
                "Seconds from grant to release or revocation",
                buckets(0.01, 20),
            ),
            handoff_seconds: add(
                &mut r,
                "handoff_seconds",
                "Seconds from a seen release to the next grant written",
                buckets(0.001, 16),
            ),
            reconcile_seconds: add(
                &mut r,
                "reconcile_seconds",
                "Seconds per reconcile",
                buckets(0.0005, 16),
            ),
            errors: add(&mut r, "errors", "Reconcile errors by category", Family::default()),
            events_suppressed: add(
                &mut r,
                "events_suppressed",
                "Normal events not published: over the event budget",
                Counter::default(),
            ),
            notices: add(
                &mut r,
                "release_notices",
                "Release notices taken over HTTP, by answer (category)",
                Family::default(),
            ),
            direct_grants: add(
                &mut r,
                "direct_grants",
                "Successors told of their grant directly, before its status write",
                Counter::default(),
            ),
            claim_grants: add(
                &mut r,
                "claim_grants",
                "Successors' grants written on their claims (not told over HTTP), before the status write",
                Counter::default(),
            ),
            successors_waiting: add(
                &mut r,
                "successors_waiting",
                "Designated successors waiting at this replica to be told of their grant",
                Gauge::default(),
            ),
            admission_enforced: add(
                &mut r,
                "admission_enforced",
                "1 when the API server enforces the admission webhook (a dry-run claim it must refuse was refused), 0 when not",
                Family::default(),
            ),
            ready: AtomicBool::new(false),
            locks: Mutex::default(),
            registry: r,
        }
    }
}

/// `build_info{version,revision}`, always 1, registered in `r`.
fn register_build_info(r: &mut Registry) {
    let build_info = Family::<BuildLabels, Gauge>::default();
    let build = BuildLabels {
        version: env!("CARGO_PKG_VERSION").into(),
        revision: REVISION.into(),
    };
    build_info.get_or_create(&build).set(1);
    r.register("build_info", "The running build (always 1)", build_info);
}

/// `metric`, registered in `r` as `name` with `help`.
fn add<M: prometheus_client::registry::Metric + Clone>(r: &mut Registry, name: &str, help: &str, metric: M) -> M {
    r.register(name, help, metric.clone());
    metric
}

impl Metrics {
    /// Count a grant of lock `ns/lock`, with how long the claim waited in the queue.
    pub fn record_grant(&self, ns: &str, lock: &str, waited_secs: Option<f64>) {
        self.grants.get_or_create(&self.lock_series(ns, lock)).inc();
        if let Some(s) = waited_secs {
            self.wait_seconds.observe(s);
        }
    }

    /// Record the end of a grant (release, or revocation with its reason), with how
    /// long it was held.
    pub fn record_slot_end(&self, held_secs: Option<f64>, revoked: Option<RevokeReason>) {
        if let Some(s) = held_secs {
            self.hold_seconds.observe(s);
        }
        if let Some(reason) = revoked {
            let labels = ReasonLabels {
                reason: reason.as_str().into(),
            };
            self.revocations.get_or_create(&labels).inc();
        }
    }

    /// Record what one status write of lock `ns/lock` did, whichever backend keeps its
    /// claims: each grant with how long it waited since it was queued (as `old`, the
    /// status it replaced, says), each release or revocation with how long it was held
    /// (and the revocation's reason), and, when the write also granted, each handoff
    /// from when the release was seen (`released_seen`) to now.
    pub fn record_actions(
        &self,
        (ns, lock): (&str, &str),
        old: &DistributedLockStatus,
        actions: &[Action],
        released_seen: &[(String, std::time::Instant)],
        now: Timestamp,
    ) {
        let secs_since = |t: &Time| (now.as_millisecond() - t.0.as_millisecond()).max(0) as f64 / 1000.0;
        let granted_any = actions.iter().any(|a| matches!(a.kind, ActionKind::Granted(_)));
        for a in actions {
            match a.kind {
                ActionKind::Granted(_) => {
                    let waited = old.queue.iter().find(|w| w.claim == a.claim);
                    self.record_grant(ns, lock, waited.map(|w| secs_since(&w.requested_at)));
                }
                ActionKind::Released(_) | ActionKind::Revoked(..) => {
                    let held = old.holders.iter().find(|h| h.claim == a.claim);
                    let reason = match a.kind {
                        ActionKind::Revoked(_, reason) => Some(reason),
                        _ => None,
                    };
                    self.record_slot_end(held.map(|h| secs_since(&h.granted_at)), reason);
                    if granted_any && let Some((_, seen)) = released_seen.iter().find(|(c, _)| c == &a.claim) {
                        self.handoff_seconds.observe(seen.elapsed().as_secs_f64());
                    }
                }
                _ => {}
            }
        }
    }

    /// Set the number of waiting claims of lock `ns/lock`.
    pub fn set_queue_depth(&self, ns: &str, lock: &str, depth: usize) {
        let depth = i64::try_from(depth).unwrap_or(i64::MAX);
        self.queue_depth.get_or_create(&self.lock_series(ns, lock)).set(depth);
    }

    /// Record whether this replica leads. A deposed replica drops its per-lock series:
    /// the new leader counts from now on, and sums over replicas do not count a lock
    /// twice (a counter that comes back later starts again, which `rate` takes as a reset).
    pub fn set_leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
        if !leading {
            let mut series = self.locks.lock().expect("lock series poisoned");
            for labels in series.known.drain() {
                self.remove_lock_series(&labels);
            }
        }
    }

    /// Keep the per-lock series in step with the lock watch: remove a deleted lock's,
    /// and after a relist, those of every lock it did not show.
    pub fn follow_locks(&self, event: &Event<DistributedLock>) {
        let labels = |l: &DistributedLock| lock_labels(&l.namespace().unwrap_or_default(), &l.name_any());
        let mut series = self.locks.lock().expect("lock series poisoned");
        match event {
            Event::Delete(lock) => {
                let gone = labels(lock);
                self.remove_lock_series(&gone);
                series.known.remove(&gone);
            }
            Event::Init => series.relisted = Some(HashSet::new()),
            Event::InitApply(lock) => {
                if let Some(listed) = series.relisted.as_mut() {
                    listed.insert(labels(lock));
                }
            }
            Event::InitDone => {
                let listed = series.relisted.take().unwrap_or_default();
                let gone: Vec<LockLabels> = series.known.difference(&listed).cloned().collect();
                for labels in &gone {
                    self.remove_lock_series(labels);
                    series.known.remove(labels);
                }
            }
            Event::Apply(_) => {}
        }
    }

    /// The labels of lock `ns/lock`, noted as having series.
    fn lock_series(&self, ns: &str, lock: &str) -> LockLabels {
        let labels = lock_labels(ns, lock);
        let mut series = self.locks.lock().expect("lock series poisoned");
        if !series.known.contains(&labels) {
            series.known.insert(labels.clone());
        }
        labels
    }

    fn remove_lock_series(&self, labels: &LockLabels) {
        self.grants.remove(labels);
        self.queue_depth.remove(labels);
    }

    /// Count a reconcile error by its fixed category.
    pub fn record_error(&self, category: &'static str) {
        let labels = CategoryLabels {
            category: category.into(),
        };
        self.errors.get_or_create(&labels).inc();
    }

    /// Count a release notice by its answer's fixed category.
    pub fn record_notice(&self, category: &'static str) {
        let labels = CategoryLabels {
            category: category.into(),
        };
        self.notices.get_or_create(&labels).inc();
    }

    /// The metrics in the OpenMetrics text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
}

fn lock_labels(ns: &str, lock: &str) -> LockLabels {
    LockLabels {
        namespace: ns.into(),
        lock: lock.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lock(ns: &str, name: &str) -> DistributedLock {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "leasehold.dev/v1alpha1", "kind": "DistributedLock",
            "metadata": {"name": name, "namespace": ns}, "spec": {},
        }))
        .unwrap()
    }

    fn series_of(m: &Metrics, ns: &str, name: &str) -> Vec<String> {
        let labels = format!("{{namespace=\"{ns}\",lock=\"{name}\"}}");
        m.encode()
            .lines()
            .filter(|l| l.contains(&labels))
            .map(String::from)
            .collect()
    }

    #[test]
    fn what_a_write_did_is_recorded_whatever_the_backend() {
        let m = Metrics::default();
        let at = |secs| Time(Timestamp::from_second(secs).unwrap());
        let old: DistributedLockStatus = serde_json::from_value(serde_json::json!({
            "holders": [{"claim": "a", "pod": "a", "podUID": "u", "fencingToken": 1, "grantedAt": "1970-01-01T00:00:10Z"}],
            "queue": [{"claim": "b", "pod": "b", "podUID": "v", "requestedAt": "1970-01-01T00:00:15Z"}],
        }))
        .unwrap();
        let actions = [
            Action::new("a", "a", ActionKind::Revoked(1, RevokeReason::PodGone)),
            Action::new("b", "b", ActionKind::Granted(2)),
        ];
        let seen = [("a".to_string(), std::time::Instant::now())];
        m.record_actions(("ns", "l"), &old, &actions, &seen, at(40).0);
        let text = m.encode();
        for line in [
            "leasehold_grants_total{namespace=\"ns\",lock=\"l\"} 1",
            "leasehold_revocations_total{reason=\"PodGone\"} 1",
            "leasehold_hold_seconds_sum 30.0",
            "leasehold_wait_seconds_sum 25.0",
            "leasehold_handoff_seconds_count 1",
        ] {
            assert!(text.contains(line), "{line} in:\n{text}");
        }
        // A release alone (no grant in the same write) times no handoff.
        m.record_actions(("ns", "l"), &old, &actions[..1], &seen, at(40).0);
        assert!(m.encode().contains("leasehold_handoff_seconds_count 1"));
    }

    #[test]
    fn build_info_and_the_leader_gauge_are_exposed() {
        let m = Metrics::default();
        let text = m.encode();
        let build = format!(
            "leasehold_build_info{{version=\"{}\",revision=\"{REVISION}\"}} 1",
            env!("CARGO_PKG_VERSION")
        );
        assert!(text.contains(&build), "{text}");
        assert!(text.contains("leasehold_leader 0"), "{text}");
        m.set_leader(true);
        assert!(m.encode().contains("leasehold_leader 1"));
        assert!(text.ends_with("# EOF\n"), "OpenMetrics text ends with # EOF");
    }

    #[test]
    fn a_deleted_locks_series_are_removed_and_others_kept() {
        let m = Metrics::default();
        m.record_grant("ns", "a", Some(1.0));
        m.set_queue_depth("ns", "a", 2);
        m.set_queue_depth("ns", "b", 1);
        assert_eq!(series_of(&m, "ns", "a").len(), 2);
        m.follow_locks(&Event::Apply(lock("ns", "a")));
        assert_eq!(series_of(&m, "ns", "a").len(), 2, "an update removes nothing");
        m.follow_locks(&Event::Delete(lock("ns", "a")));
        assert!(series_of(&m, "ns", "a").is_empty(), "{}", m.encode());
        assert_eq!(
            series_of(&m, "ns", "b"),
            ["leasehold_queue_depth{namespace=\"ns\",lock=\"b\"} 1"]
        );
    }

    #[test]
    fn a_deposed_replica_drops_its_per_lock_series() {
        let m = Metrics::default();
        m.set_leader(true);
        m.record_grant("ns", "a", Some(1.0));
        m.set_queue_depth("ns", "a", 2);
        m.record_error("status_write");
        assert_eq!(series_of(&m, "ns", "a").len(), 2);
        m.set_leader(false);
        assert!(series_of(&m, "ns", "a").is_empty(), "{}", m.encode());
        let text = m.encode();
        assert!(text.contains("leasehold_leader 0"), "{text}");
        assert!(
            text.contains("leasehold_errors_total{category=\"status_write\"} 1"),
            "replica-wide series stay: {text}"
        );
        m.set_leader(true);
        m.record_grant("ns", "a", None);
        assert!(
            m.encode()
                .contains("leasehold_grants_total{namespace=\"ns\",lock=\"a\"} 1")
        );
    }

    /// Every name a sample of this registry may carry: a counter's with `_total`, a
    /// histogram's base name and its `_bucket`, `_sum` and `_count`.
    fn exposed() -> (std::collections::BTreeSet<String>, std::collections::BTreeSet<String>) {
        let (mut listed, mut samples) = (std::collections::BTreeSet::new(), std::collections::BTreeSet::new());
        // A family shows only once it has a series: give each one.
        let m = Metrics::default();
        m.record_grant("ns", "l", None);
        m.record_slot_end(None, Some(RevokeReason::PodGone));
        m.set_queue_depth("ns", "l", 0);
        m.record_error("e");
        m.record_notice("n");
        let webhook = CategoryLabels {
            category: "webhook".into(),
        };
        m.admission_enforced.get_or_create(&webhook).set(1);
        for line in m.encode().lines() {
            let Some([name, kind]) = line.strip_prefix("# TYPE ").map(|t| {
                let mut w = t.split(' ');
                [w.next().unwrap_or_default(), w.next().unwrap_or_default()]
            }) else {
                continue;
            };
            let (name, kind) = (name.to_string(), kind.to_string());
            match kind.as_str() {
                "counter" => {
                    listed.insert(format!("{name}_total"));
                    samples.insert(format!("{name}_total"));
                }
                "histogram" => {
                    for suffix in ["_bucket", "_sum", "_count"] {
                        samples.insert(format!("{name}{suffix}"));
                    }
                    listed.insert(name);
                }
                _ => {
                    samples.insert(name.clone());
                    listed.insert(name);
                }
            }
        }
        (listed, samples)
    }

    /// The `leasehold_*` names in `text`.
    fn names_in(text: &str) -> std::collections::BTreeSet<String> {
        let mut out = std::collections::BTreeSet::new();
        let mut rest = text;
        while let Some(at) = rest.find("leasehold_") {
            let tail = &rest[at..];
            let end = tail
                .find(|c: char| !(c.is_ascii_lowercase() || c == '_'))
                .unwrap_or(tail.len());
            out.insert(tail[..end].to_string());
            rest = &tail[end..];
        }
        out
    }

    #[test]
    fn the_readme_lists_every_metric_by_its_exposed_name_and_the_chart_uses_no_other() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let read = |p: &str| std::fs::read_to_string(root.join(p)).unwrap_or_else(|e| panic!("{p}: {e}"));
        let readme = read("README.md");
        let from = readme
            .find("The controller serves Prometheus metrics")
            .expect("the README's metric list");
        let to = from
            + readme[from..]
                .find("plus `/healthz`")
                .expect("the end of the metric list");
        let (listed, samples) = exposed();
        assert_eq!(
            names_in(&readme[from..to]),
            listed,
            "README's metric list vs the registry"
        );
        for file in [
            "charts/leasehold/files/alerts.yaml",
            "charts/leasehold/files/dashboard.json",
        ] {
            let used = names_in(&read(file));
            let unknown: Vec<_> = used
                .iter()
                .filter(|n| !samples.contains(*n) && !listed.contains(*n))
                .collect();
            assert!(
                unknown.is_empty(),
                "{file} uses metrics the controller does not expose: {unknown:?}"
            );
            assert!(!used.is_empty(), "{file} uses no leasehold metric");
        }
    }

    #[test]
    fn a_relist_removes_the_series_of_locks_it_does_not_show() {
        let m = Metrics::default();
        m.set_queue_depth("ns", "a", 0);
        m.set_queue_depth("ns", "b", 0);
        m.follow_locks(&Event::Init);
        m.follow_locks(&Event::InitApply(lock("ns", "b")));
        assert_eq!(
            series_of(&m, "ns", "a").len(),
            1,
            "nothing goes before the relist is done"
        );
        m.follow_locks(&Event::InitDone);
        assert!(series_of(&m, "ns", "a").is_empty());
        assert_eq!(series_of(&m, "ns", "b").len(), 1);
    }
}
