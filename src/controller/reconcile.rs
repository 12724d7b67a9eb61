//! One reconcile of one lock: observe → decide → apply.
//!
//! The status write is the single source of truth and carries the resourceVersion
//! that was read, so two controllers can never both grant from the same state; on a
//! conflict the lock is re-read and decided again. Events, claim deletion and claim
//! stamping follow only a successful write.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, MicroTime, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action as Requeue;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::Store;
use kube::{Resource, ResourceExt};
use tracing::instrument;

use super::metrics::{CategoryLabels, LockLabels, Metrics, ReasonLabels};
use super::observe::{self, Tracker};
use crate::api::{DistributedLock, DistributedLockStatus, FENCING_TOKEN_ANNOTATION};
use crate::decide::{ActionKind, Decision, World, decide};

/// How many times one reconcile re-reads and re-decides after write conflicts.
pub const MAX_CONFLICT_RETRIES: usize = 8;
/// Requeue delay after an error.
pub const ERROR_REQUEUE: Duration = Duration::from_secs(1);

/// Shared state of the reconciler.
pub struct Context {
    /// The API client.
    pub client: kube::Client,
    /// Claim Leases (those labelled `leasehold.dev/lock`).
    pub leases: Store<Lease>,
    /// Pods, slimmed to name, uid and phase.
    pub pods: Store<Pod>,
    /// What this controller has seen, on its monotonic clock.
    pub tracker: Arc<Mutex<Tracker>>,
    /// Publishes Kubernetes events.
    pub recorder: Recorder,
    /// Prometheus metrics.
    pub metrics: Arc<Metrics>,
    /// Becomes true once the lock, claim and pod caches have synced.
    pub synced: tokio::sync::watch::Receiver<bool>,
}

/// Errors of a reconcile, each naming the action that failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Writing the lock's status failed.
    #[error("writing status of DistributedLock {0}: {1}")]
    WriteStatus(String, #[source] kube::Error),
    /// Re-reading the lock after a write conflict failed.
    #[error("re-reading DistributedLock {0} after a conflict: {1}")]
    Reread(String, #[source] kube::Error),
    /// Conflicts kept happening.
    #[error("DistributedLock {0}: {MAX_CONFLICT_RETRIES} write conflicts in a row")]
    Conflicts(String),
}

impl Error {
    /// A short fixed string for metric labels.
    pub fn category(&self) -> &'static str {
        match self {
            Error::WriteStatus(..) => "write_status",
            Error::Reread(..) => "reread",
            Error::Conflicts(..) => "conflicts",
        }
    }
}

/// What one decision plans, with when to look again.
struct Plan {
    decision: Decision,
    next_deadline: Option<Instant>,
    warnings: Vec<(Arc<Lease>, &'static str, String)>,
    released_seen: Vec<(String, Instant)>,
}

/// Reconcile one lock.
#[instrument(skip_all, fields(namespace = lock.namespace().unwrap_or_default(), lock = lock.name_any()))]
pub async fn reconcile(lock: Arc<DistributedLock>, ctx: Arc<Context>) -> Result<Requeue, Error> {
    let started = Instant::now();
    let _ = ctx.synced.clone().wait_for(|synced| *synced).await;
    let ns = lock.namespace().unwrap_or_default();
    let name = lock.name_any();
    let api: Api<DistributedLock> = Api::namespaced(ctx.client.clone(), &ns);
    let mut current = (*lock).clone();
    for _ in 0..MAX_CONFLICT_RETRIES {
        let plan = plan(&current, &ctx, Instant::now());
        publish_warnings(&ctx, &plan.warnings);
        let old = current.status.clone().unwrap_or_default();
        let mut next = current.clone();
        next.status = Some(with_conditions(&current, plan.decision.status.clone()));
        if next.status.as_ref() != Some(&old) {
            match api.replace_status(&name, &PostParams::default(), &next).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.is_conflict() => {
                    current = api.get(&name).await.map_err(|e| Error::Reread(name.clone(), e))?;
                    continue;
                }
                Err(kube::Error::Api(s)) if s.is_not_found() => return Ok(Requeue::await_change()),
                Err(e) => return Err(Error::WriteStatus(name, e)),
            }
        }
        after_write(&ctx, &current, &plan);
        ctx.metrics.reconcile_seconds.observe(started.elapsed().as_secs_f64());
        let requeue = match plan.next_deadline {
            Some(at) => Requeue::requeue(at.saturating_duration_since(Instant::now()) + Duration::from_millis(10)),
            None => Requeue::await_change(),
        };
        return Ok(requeue);
    }
    Err(Error::Conflicts(name))
}

/// Count the error and retry soon.
pub fn error_policy(_lock: Arc<DistributedLock>, err: &Error, ctx: Arc<Context>) -> Requeue {
    tracing::warn!(error = %err, "reconcile failed");
    ctx.metrics
        .errors
        .get_or_create(&CategoryLabels {
            category: err.category().into(),
        })
        .inc();
    Requeue::requeue(ERROR_REQUEUE)
}

/// Observe the stores and the tracker, and decide.
fn plan(lock: &DistributedLock, ctx: &Context, now: Instant) -> Plan {
    let ns = lock.namespace().unwrap_or_default();
    let name = lock.name_any();
    let lease = Duration::from_secs(lock.spec.lease_duration_seconds.max(1) as u64);
    let status = lock.status.clone().unwrap_or_default();
    let mut tracker = ctx.tracker.lock().expect("tracker lock poisoned");
    let mut deadlines = Vec::new();
    let mut claims = Vec::new();
    let mut warnings = Vec::new();
    let mut released_seen = Vec::new();
    let leases = observe::claims_of(&ctx.leases, lock);
    for claim in &leases {
        let (pod, uid) = match observe::validate_claim(claim) {
            Ok(ok) => ok,
            Err(bad) => {
                warnings.push((claim.clone(), "InvalidClaim", bad.message().to_string()));
                continue;
            }
        };
        let own = claim
            .spec
            .as_ref()
            .and_then(|s| s.lease_duration_seconds)
            .unwrap_or(0)
            .max(0) as u64;
        let expires = tracker.expires_at(claim, lease.max(Duration::from_secs(own)), now);
        let expired = now >= expires;
        if !expired {
            deadlines.push(expires);
        }
        let view = observe::claim_view(claim, pod, uid, expired, &tracker);
        if view.released {
            released_seen.push((view.name.clone(), tracker.changed_at(claim)));
        }
        claims.push(view);
    }
    let pod_names = claims.iter().map(|c| c.pod.as_str());
    let pod_names = pod_names.chain(status.holders.iter().map(|h| h.pod.as_str()));
    let pods = observe::pod_views(
        &ctx.pods,
        &ns,
        pod_names.chain(status.queue.iter().map(|w| w.pod.as_str())),
    );
    let mut elapsed = BTreeSet::new();
    for h in status.holders.iter().filter(|h| h.revoked.is_some()) {
        let ends = tracker.hold_back_ends(&ns, &name, &h.claim, lease, now);
        if now >= ends {
            elapsed.insert(h.claim.clone());
        } else {
            deadlines.push(ends);
        }
    }
    let world = World {
        spec: &lock.spec,
        status: &status,
        claims: &claims,
        pods: &pods,
        hold_back_elapsed: &elapsed,
        now: Timestamp::now(),
    };
    let decision = decide(&world);
    let revoked: BTreeSet<String> = decision
        .status
        .holders
        .iter()
        .filter(|h| h.revoked.is_some())
        .map(|h| h.claim.clone())
        .collect();
    for claim in &revoked {
        deadlines.push(tracker.hold_back_ends(&ns, &name, claim, lease, now));
    }
    tracker.retain_revoked(&ns, &name, &revoked);
    for (claim, reason) in &decision.ignored {
        if let Some(lease) = leases.iter().find(|l| &l.name_any() == claim) {
            warnings.push((
                lease.clone(),
                "ClaimIgnored",
                format!("{reason:?}: the claim's pod is not a live pod with that UID"),
            ));
        }
    }
    warnings.retain(|(l, reason, _)| tracker.first_warning(&l.uid().unwrap_or_default(), reason));
    Plan {
        decision,
        next_deadline: deadlines.into_iter().min(),
        warnings,
        released_seen,
    }
}

/// Set observedGeneration and the Ready condition.
fn with_conditions(lock: &DistributedLock, mut status: DistributedLockStatus) -> DistributedLockStatus {
    let generation = lock.metadata.generation;
    status.observed_generation = generation;
    let message = format!(
        "{} of {} slots held, {} waiting",
        status.holders.len(),
        lock.spec.max_holders,
        status.queue.len()
    );
    let previous = status.conditions.iter().find(|c| c.type_ == "Ready").cloned();
    let unchanged = previous
        .as_ref()
        .is_some_and(|p| p.status == "True" && p.message == message && p.observed_generation == generation);
    if !unchanged {
        let since = previous.filter(|p| p.status == "True").map(|p| p.last_transition_time);
        status.conditions.retain(|c| c.type_ != "Ready");
        status.conditions.push(Condition {
            type_: "Ready".into(),
            status: "True".into(),
            reason: "Reconciled".into(),
            message,
            observed_generation: generation,
            last_transition_time: since.unwrap_or(Time(Timestamp::now())),
        });
    }
    status
}

/// After a successful write: metrics, events, claim deletion and stamping.
fn after_write(ctx: &Arc<Context>, lock: &DistributedLock, plan: &Plan) {
    let d = &plan.decision;
    let labels = LockLabels {
        namespace: lock.namespace().unwrap_or_default(),
        lock: lock.name_any(),
    };
    let m = &ctx.metrics;
    m.queue_depth.get_or_create(&labels).set(d.status.queue.len() as i64);
    let granted_any = d.actions.iter().any(|a| matches!(a.kind, ActionKind::Granted(_)));
    let now = Timestamp::now();
    let old = lock.status.clone().unwrap_or_default();
    for a in &d.actions {
        let secs_since = |t: &Time| (now.as_millisecond() - t.0.as_millisecond()).max(0) as f64 / 1000.0;
        match a.kind {
            ActionKind::Granted(token) => {
                m.grants.get_or_create(&labels).inc();
                if let Some(w) = old.queue.iter().find(|w| w.claim == a.claim) {
                    m.wait_seconds.observe(secs_since(&w.requested_at));
                }
                tracing::info!(claim = a.claim, pod = a.pod, token, "granted");
            }
            ActionKind::Released(_) | ActionKind::Revoked(..) => {
                if let Some(h) = old.holders.iter().find(|h| h.claim == a.claim) {
                    m.hold_seconds.observe(secs_since(&h.granted_at));
                }
                if let ActionKind::Revoked(_, reason) = a.kind {
                    m.revocations
                        .get_or_create(&ReasonLabels {
                            reason: reason.as_str().into(),
                        })
                        .inc();
                }
                if granted_any && let Some((_, seen)) = plan.released_seen.iter().find(|(c, _)| c == &a.claim) {
                    m.handoff_seconds.observe(seen.elapsed().as_secs_f64());
                }
                tracing::info!(claim = a.claim, pod = a.pod, kind = ?a.kind, "slot freed or revoked");
            }
            _ => tracing::debug!(claim = a.claim, pod = a.pod, kind = ?a.kind, "queue changed"),
        }
    }
    let ctx = ctx.clone();
    let lock = lock.clone();
    let actions = d.actions.clone();
    let delete = d.delete_claims.clone();
    let ns = lock.namespace().unwrap_or_default();
    tokio::spawn(async move {
        let leases: Api<Lease> = Api::namespaced(ctx.client.clone(), &ns);
        for a in &actions {
            if let ActionKind::Granted(token) = a.kind {
                stamp(&leases, &a.claim, token).await;
            }
        }
        for claim in &delete {
            if let Err(e) = leases.delete(claim, &DeleteParams::default()).await
                && !matches!(&e, kube::Error::Api(s) if s.is_not_found())
            {
                tracing::warn!(claim, error = %e, "deleting a finished claim failed; will retry");
            }
        }
        let reference = lock.object_ref(&());
        for a in &actions {
            if let Some(ev) = event_for(a, &ns)
                && let Err(e) = ctx.recorder.publish(&ev, &reference).await
            {
                tracing::warn!(error = %e, "publishing an event failed");
            }
        }
    });
}

/// Stamp a granted claim so tools reading Leases see the holder and its token.
async fn stamp(leases: &Api<Lease>, claim: &str, token: i64) {
    let patch = serde_json::json!({
        "metadata": { "annotations": { FENCING_TOKEN_ANNOTATION: token.to_string() } },
        "spec": { "acquireTime": MicroTime(Timestamp::now()) },
    });
    if let Err(e) = leases
        .patch(claim, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        tracing::debug!(claim, error = %e, "stamping a granted claim failed (informational only)");
    }
}

fn claim_ref(ns: &str, claim: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("coordination.k8s.io/v1".into()),
        kind: Some("Lease".into()),
        name: Some(claim.into()),
        namespace: Some(ns.into()),
        ..Default::default()
    }
}

/// The Kubernetes event for an action (none for queue joins).
fn event_for(a: &crate::decide::Action, ns: &str) -> Option<Event> {
    let (type_, reason, note) = match a.kind {
        ActionKind::Granted(t) => (
            EventType::Normal,
            "Granted",
            format!("granted to pod {} (claim {}), fencing token {t}", a.pod, a.claim),
        ),
        ActionKind::Released(t) => (
            EventType::Normal,
            "Released",
            format!("released by pod {} (claim {}), fencing token {t}", a.pod, a.claim),
        ),
        ActionKind::Revoked(t, r) => (
            EventType::Warning,
            "Revoked",
            format!(
                "{}: revoked from pod {} (claim {}), fencing token {t}",
                r.as_str(),
                a.pod,
                a.claim
            ),
        ),
        ActionKind::SlotFreed(t) => (
            EventType::Normal,
            "SlotFreed",
            format!("held-back slot of pod {} (fencing token {t}) passed on", a.pod),
        ),
        ActionKind::Dropped(r) => (
            EventType::Normal,
            "Dropped",
            format!("waiter pod {} (claim {}) left the queue: {r:?}", a.pod, a.claim),
        ),
        ActionKind::Enqueued(_) => return None,
    };
    Some(Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: reason.into(),
        secondary: Some(claim_ref(ns, &a.claim)),
    })
}

/// Publish Warning events on claims (each once per claim and reason).
pub fn publish_warnings(ctx: &Arc<Context>, warnings: &[(Arc<Lease>, &'static str, String)]) {
    for (lease, reason, note) in warnings {
        tracing::warn!(claim = lease.name_any(), reason, note, "bad claim");
        let ctx = ctx.clone();
        let reference = lease.object_ref(&());
        let ev = Event {
            type_: EventType::Warning,
            reason: (*reason).into(),
            note: Some(note.clone()),
            action: "Validate".into(),
            secondary: None,
        };
        tokio::spawn(async move {
            if let Err(e) = ctx.recorder.publish(&ev, &reference).await {
                tracing::warn!(error = %e, "publishing a warning event failed");
            }
        });
    }
}
