//! Apply, after a successful status write: metrics, claim deletion, and
//! Kubernetes events (Warning events on bad claims too).
//!
//! Everything here follows the write and is best effort: the status is the truth, and
//! a failed event or deletion changes no one's grant.

use std::sync::Arc;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams};
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};

use super::context::Context;
use super::observe::Plan;
use crate::api::DistributedLock;
use crate::decide::ActionKind;

/// After a successful write: metrics, events and claim deletion.
pub fn after_write(ctx: &Arc<Context>, lock: &DistributedLock, plan: &Plan) {
    let d = &plan.decision;
    let (ns, name) = (lock.namespace().unwrap_or_default(), lock.name_any());
    let stored = |c: &str| ctx.leases.get(&ObjectRef::new(c).within(&ns)).is_some();
    ctx.tombstones
        .settle(&ns, &name, |c| crate::protocol::names_claim(&d.status, c), stored);
    let m = &ctx.metrics;
    // A deleted lock with no holder left goes now: a reconcile of it that ends after
    // its deletion was seen must not bring its series back.
    if !super::finalizer::lets_go(lock, &d.status) {
        m.set_queue_depth(&ns, &name, d.status.queue.len());
    }
    let old = lock.status.clone().unwrap_or_default();
    m.record_actions((&ns, &name), &old, &d.actions, &plan.released_seen, Timestamp::now());
    for a in &d.actions {
        match a.kind {
            ActionKind::Granted(token) => tracing::info!(claim = a.claim, pod = a.pod, token, "granted"),
            ActionKind::Released(_) | ActionKind::Revoked(..) => {
                tracing::info!(claim = a.claim, pod = a.pod, kind = ?a.kind, "slot freed or revoked")
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
        for claim in &delete {
            if !ctx.written.delete_now(&ns, claim, std::time::Instant::now()) {
                continue; // sent already; the watch has not shown it gone yet
            }
            let stored = ctx.leases.get(&ObjectRef::new(claim).within(&ns));
            if stored.is_some_and(|l| super::sweep::sweepable(&l)) {
                ctx.sweeper.request(&ns, claim, &ctx.written);
                continue;
            }
            match leases.delete(claim, &DeleteParams::default()).await {
                Err(e) if !matches!(&e, kube::Error::Api(s) if s.is_not_found()) => {
                    ctx.written.delete_failed(&ns, claim);
                    tracing::warn!(claim, error = %e, "deleting a finished claim failed; will retry");
                }
                _ => ctx.written.delete_done(&ns, claim),
            }
        }
        publish_events(&ctx, &lock, &actions).await;
    });
}

/// Publish the events of `actions` on `lock` (in a task of their own).
pub fn publish_actions(ctx: &Arc<Context>, lock: &DistributedLock, actions: Vec<crate::decide::Action>) {
    if actions.is_empty() {
        return;
    }
    let (ctx, lock) = (ctx.clone(), lock.clone());
    tokio::spawn(async move { publish_events(&ctx, &lock, &actions).await });
}

async fn publish_events(ctx: &Context, lock: &DistributedLock, actions: &[crate::decide::Action]) {
    let ns = lock.namespace().unwrap_or_default();
    let reference = lock.object_ref(&());
    for a in actions {
        let Some(ev) = event_for(a, &ns) else { continue };
        if !within_budget(ctx, &ev.type_) {
            continue;
        }
        if let Err(e) = ctx.recorder.publish(&ev, &reference).await {
            tracing::warn!(error = %e, "publishing an event failed");
        }
    }
}

/// Whether an event of `type_` may go now (its budget, see [`super::budget`]); one
/// that may not is counted as suppressed.
fn within_budget(ctx: &Context, type_: &EventType) -> bool {
    let budget = match type_ {
        EventType::Normal => &ctx.event_budget,
        EventType::Warning => &ctx.warning_budget,
    };
    let ok = budget.take(std::time::Instant::now());
    if !ok {
        ctx.metrics.events_suppressed.inc();
    }
    ok
}

/// Publish a Warning event on the lock itself (in a task of its own).
pub fn warn_on_lock(ctx: &Arc<Context>, lock: &DistributedLock, reason: &'static str, note: String) {
    tracing::warn!(lock = lock.name_any(), reason, note, "lock warning");
    if !within_budget(ctx, &EventType::Warning) {
        return;
    }
    let ctx = ctx.clone();
    let reference = lock.object_ref(&());
    let ev = Event {
        type_: EventType::Warning,
        reason: reason.into(),
        note: Some(note),
        action: "Reconcile".into(),
        secondary: None,
    };
    tokio::spawn(async move {
        if let Err(e) = ctx.recorder.publish(&ev, &reference).await {
            tracing::warn!(error = %e, "publishing a warning event failed");
        }
    });
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
        if !within_budget(ctx, &EventType::Warning) {
            continue;
        }
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
