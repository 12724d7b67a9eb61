//! Kubernetes events of every backend: on the lock for its grants, releases and
//! revocations (naming the claim), Warning events on bad claims and on the lock itself,
//! each within its budget ([`crate::controller::budget`]; one over is counted as
//! suppressed). Best effort, in tasks of their own: the status is the truth, and a
//! failed event changes no one's grant.

use std::sync::Arc;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType};
use kube::{Resource, ResourceExt};

use crate::api::DistributedLock;
use crate::controller::context::Context;
use crate::decide::ActionKind;

/// How many bad claims one reconcile logs one by one; the rest it counts in one line.
pub const MAX_WARNINGS_LOGGED: usize = 16;

/// Publish the events of `actions` on `lock` (in a task of their own).
pub fn publish_actions(ctx: &Arc<Context>, lock: &DistributedLock, actions: Vec<crate::decide::Action>) {
    if actions.is_empty() {
        return;
    }
    let (ctx, lock) = (ctx.clone(), lock.clone());
    tokio::spawn(async move { publish_events(&ctx, &lock, &actions).await });
}

pub(crate) async fn publish_events(ctx: &Context, lock: &DistributedLock, actions: &[crate::decide::Action]) {
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

/// Whether an event of `type_` may go now (its budget, see [`crate::controller::budget`]); one
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
    for (i, (lease, reason, note)) in warnings.iter().enumerate() {
        // A flood of bad claims is logged by its first few and a count, not line by line.
        if i < MAX_WARNINGS_LOGGED {
            tracing::warn!(claim = lease.name_any(), reason, note, "bad claim");
        } else if i == MAX_WARNINGS_LOGGED {
            let more = warnings.len() - MAX_WARNINGS_LOGGED;
            tracing::warn!(
                more,
                "more bad claims (each has its Warning event, within the events' budget)"
            );
        }
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
