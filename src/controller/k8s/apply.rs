//! Apply, after a successful status write of a lock whose claims are Leases: metrics,
//! claim deletion, and the events of the decision ([`crate::controller::events`]).
//!
//! Everything here follows the write and is best effort: the status is the truth, and
//! a failed event or deletion changes no one's grant.

use std::sync::Arc;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams};
use kube::runtime::reflector::ObjectRef;

use crate::api::DistributedLock;
use crate::controller::context::Context;
use crate::controller::k8s::claims::delete_as_read;
use crate::controller::k8s::observe::Plan;
use crate::decide::ActionKind;

/// After a successful write: metrics, events and claim deletion.
pub fn after_write(ctx: &Arc<Context>, lock: &DistributedLock, plan: &Plan<std::time::Instant>) {
    let d = &plan.decision;
    let (ns, name) = (lock.namespace().unwrap_or_default(), lock.name_any());
    let stored = |c: &str| ctx.k8s.leases.get(&ObjectRef::new(c).within(&ns)).is_some();
    ctx.k8s
        .tombstones
        .settle(&ns, &name, |c| crate::protocol::names_claim(&d.status, c), stored);
    let m = &ctx.metrics;
    // A deleted lock with no holder left goes now: a reconcile of it that ends after
    // its deletion was seen must not bring its series back.
    if !crate::controller::finalizer::lets_go(lock, &d.status) {
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
    let unnamed: std::collections::HashMap<String, Arc<Lease>> =
        plan.expire_unnamed.iter().map(|l| (l.name_any(), l.clone())).collect();
    let ns = lock.namespace().unwrap_or_default();
    tokio::spawn(async move {
        let leases: Api<Lease> = Api::namespaced(ctx.client.clone(), &ns);
        for claim in &delete {
            if !ctx.written.delete_now(&ns, claim, std::time::Instant::now()) {
                continue; // sent already; the watch has not shown it gone yet
            }
            let stored = ctx.k8s.leases.get(&ObjectRef::new(claim).within(&ns));
            if stored.is_some_and(|l| crate::controller::k8s::sweep::sweepable(&l)) {
                ctx.k8s.sweeper.request(&ns, claim, &ctx.written);
                continue;
            }
            // Expired unnamed: only as seen (renewed since, it stays).
            let as_seen = unnamed.get(claim);
            let params = as_seen.map_or_else(DeleteParams::default, |l| delete_as_read(l));
            match leases.delete(claim, &params).await {
                Err(e) if !matches!(&e, kube::Error::Api(s) if s.is_not_found()) => {
                    ctx.written.delete_failed(&ns, claim);
                    tracing::warn!(claim, error = %e, "deleting a finished claim failed; will retry");
                }
                _ => ctx.written.delete_done(&ns, claim),
            }
        }
        crate::controller::events::publish_events(&ctx, &lock, &actions).await;
    });
}
