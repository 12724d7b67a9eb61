//! Locks whose claims live in etcd: one mirror task per lock watches its keys; the
//! reconcile reports them in status ([`crate::etcd::rules::mirror`]) and takes away the
//! keys of gone pods (delete, or hold back when the process may still run).
//!
//! etcd grants, not the controller: when the controller is down, etcd-backed locks
//! still hand over; only the status report and the revocations of gone pods wait.

pub(crate) mod mirror;

use std::sync::Arc;
use std::time::Instant;

use etcd_client::{Client, Compare, CompareOp, PutOptions, Txn, TxnOp};
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action as Requeue;
use kube::runtime::reflector::ObjectRef;

use self::mirror::{UNAVAILABLE_REQUEUE, View};
use crate::api::{DistributedLock, EtcdBackend, RevokeReason};
use crate::controller::backend::Backend;
use crate::controller::context::Context;
use crate::controller::error::{Error, MAX_CONFLICT_RETRIES};
use crate::controller::status::{Step, Trouble, with_conditions, write_status};
use crate::decide::{Action, ActionKind};
use crate::etcd::Error as EtcdError;
use crate::etcd::rules::{self, KeyAction, KeyView};

/// The etcd backend: every lock with `spec.backend.etcd`.
pub(crate) struct Etcd;

impl Backend for Etcd {
    fn serves(&self, lock: &DistributedLock) -> bool {
        lock.spec.etcd().is_some()
    }

    fn reconcile(
        &self,
        lock: Arc<DistributedLock>,
        ctx: Arc<Context>,
        started: Instant,
    ) -> BoxFuture<'static, Result<Requeue, Error>> {
        Box::pin(async move {
            let Some(backend) = lock.spec.etcd().cloned() else {
                return Ok(Requeue::await_change()); // served by another backend now
            };
            reconcile(lock, ctx, backend, started).await
        })
    }

    fn forget(&self, lock: &ObjectRef<DistributedLock>, ctx: &Context) {
        ctx.etcd.forget(lock);
    }
}

/// Reconcile an etcd-backed lock: report its keys in status, revoke the claims of gone
/// pods, and say in the Ready condition (and an event) when etcd cannot be reached.
async fn reconcile(
    lock: Arc<DistributedLock>,
    ctx: Arc<Context>,
    backend: EtcdBackend,
    started: Instant,
) -> Result<Requeue, Error> {
    let ns = lock.namespace().unwrap_or_default();
    let name = lock.name_any();
    let api: Api<DistributedLock> = Api::namespaced(ctx.client.clone(), &ns);
    let view = ctx.etcd.view(&lock, &backend);
    let mut current = ctx.written.fresher(&lock);
    for _ in 0..MAX_CONFLICT_RETRIES {
        let old = current.status.clone().unwrap_or_default();
        let (status, actions, trouble, client) = match &view {
            View::Keys(keys, client) => {
                let m = plan(&current, &ctx, keys);
                let trouble = (!m.invalid.is_empty()).then(|| Trouble::rejected(m.invalid.len()));
                (m.status, m.actions, trouble, Some((**client).clone()))
            }
            View::Connecting => return Ok(Requeue::await_change()), // the mirror triggers when it knows
            View::Failed(why) => (old.clone(), Vec::new(), Some(Trouble::etcd(why)), None),
        };
        let new = with_conditions(&current, status, trouble.as_ref(), k8s_openapi::jiff::Timestamp::now());
        match write_status(&ctx, &api, &mut current, new.clone()).await? {
            Step::Written | Step::Unchanged => {}
            Step::Again => continue,
            Step::Stop => return Ok(Requeue::await_change()),
        }
        let was = |s: &crate::api::DistributedLockStatus| {
            s.conditions
                .iter()
                .find(|c| c.type_ == "Ready")
                .map(|c| c.reason.clone())
        };
        if let Some(t) = &trouble
            && was(&old).as_deref() != Some(t.reason)
        {
            crate::controller::events::warn_on_lock(&ctx, &current, t.reason, t.message.clone());
        }
        ctx.metrics.set_queue_depth(&ns, &name, new.queue.len());
        let mut events = changes(&old, &new);
        let mut retry = false;
        if let Some(client) = client {
            for a in actions {
                match pod_confirmed_gone(&ctx, &ns, &a).await {
                    Some(true) => {}
                    Some(false) => continue,
                    None => {
                        retry = true;
                        continue;
                    }
                }
                if let Some(event) = revoke(client.clone(), &a).await.map_err(Error::Etcd)? {
                    events.push(event);
                }
            }
        }
        // The same metrics as a Lease-backed lock's (a release here is seen when etcd
        // shows its key gone: no handoff is timed from a notice or a mark).
        ctx.metrics
            .record_actions((&ns, &name), &old, &events, &[], Timestamp::now());
        ctx.metrics.reconcile_seconds.observe(started.elapsed().as_secs_f64());
        crate::controller::events::publish_actions(&ctx, &current, events);
        if let Some(Trouble {
            reason: "EtcdUnavailable",
            ..
        }) = trouble
        {
            return Ok(Requeue::requeue(UNAVAILABLE_REQUEUE));
        }
        if retry {
            return Ok(Requeue::requeue(crate::controller::error::ERROR_REQUEUE));
        }
        return Ok(Requeue::await_change());
    }
    Err(Error::Conflicts(name))
}

fn plan(lock: &DistributedLock, ctx: &Context, keys: &[KeyView]) -> rules::Mirror {
    let ns = lock.namespace().unwrap_or_default();
    let status = lock.status.clone().unwrap_or_default();
    let names: Vec<&str> = keys
        .iter()
        .filter_map(|k| k.value.as_ref())
        .map(|v| v.pod.as_str())
        .collect();
    let pods = ctx.pods.views(&ns, names.into_iter());
    let tracker = ctx.tracker.lock().expect("tracker lock poisoned");
    let stopped = keys
        .iter()
        .filter_map(|k| k.value.as_ref())
        .filter(|v| tracker.pod_stopped(&v.pod_uid))
        .map(|v| v.pod_uid.clone())
        .collect();
    rules::mirror(keys, &lock.spec, &status, &pods, &stopped, Timestamp::now())
}

/// Grants and ends between two mirrored statuses, as the decide core's actions (for
/// the same events as the Kubernetes backend).
fn changes(old: &crate::api::DistributedLockStatus, new: &crate::api::DistributedLockStatus) -> Vec<Action> {
    let mut out = Vec::new();
    for h in &new.holders {
        if !old.holders.iter().any(|o| o.claim == h.claim) {
            out.push(Action::new(&h.claim, &h.pod, ActionKind::Granted(h.fencing_token)));
        }
    }
    for h in &old.holders {
        if !new.holders.iter().any(|n| n.claim == h.claim) {
            let kind = match h.revoked {
                Some(_) => ActionKind::SlotFreed(h.fencing_token),
                None => ActionKind::Released(h.fencing_token),
            };
            out.push(Action::new(&h.claim, &h.pod, kind));
        }
    }
    out
}

/// Whether a key action may go ahead: a pod judged gone from the controller's pod cache
/// is read afresh first (only on such trouble), so a claim made by a pod the cache has
/// not shown yet is not held back. `None`: the read failed; look again soon.
async fn pod_confirmed_gone(ctx: &Context, ns: &str, a: &KeyAction) -> Option<bool> {
    let KeyAction::HoldBack {
        value,
        reason: RevokeReason::PodGone,
        ..
    } = a
    else {
        return Some(true);
    };
    if value.pod.is_empty() {
        return Some(true);
    }
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    match pods.get_opt(&value.pod).await {
        Ok(Some(pod)) if pod.uid().as_deref() == Some(value.pod_uid.as_str()) => {
            tracing::info!(
                pod = value.pod,
                "the pod cache lags: the claim's pod is there; not revoking"
            );
            Some(false)
        }
        Ok(_) => Some(true),
        Err(e) => {
            tracing::warn!(pod = value.pod, error = %e, "confirming a pod gone failed; not revoking yet");
            None
        }
    }
}

/// Take one key away: delete it, or move it onto a fresh controller lease and revoke
/// the client's (each only if the key is unchanged). Returns the event to publish.
async fn revoke(mut client: Client, a: &KeyAction) -> Result<Option<Action>, EtcdError> {
    match a {
        KeyAction::Delete {
            key,
            claim,
            mod_revision,
            reason,
        } => {
            let txn = Txn::new()
                .when([Compare::mod_revision(key.as_str(), CompareOp::Equal, *mod_revision)])
                .and_then([TxnOp::delete(key.as_str(), None)]);
            let done = client.txn(txn).await.map_err(|e| EtcdError::Revoke(key.clone(), e))?;
            tracing::info!(
                claim,
                ?reason,
                deleted = done.succeeded(),
                "deleting the claim key of a stopped pod"
            );
            Ok(None)
        }
        KeyAction::HoldBack {
            key,
            claim,
            mod_revision,
            client_lease,
            create_revision,
            ttl_seconds,
            value,
            reason,
        } => {
            let lease = client
                .lease_grant(*ttl_seconds, None)
                .await
                .map_err(|e| EtcdError::Revoke(key.clone(), e))?
                .id();
            let put = TxnOp::put(
                key.as_str(),
                value.to_bytes(),
                Some(PutOptions::new().with_lease(lease)),
            );
            let txn = Txn::new()
                .when([Compare::mod_revision(key.as_str(), CompareOp::Equal, *mod_revision)])
                .and_then([put]);
            let moved = client.txn(txn).await.map_err(|e| EtcdError::Revoke(key.clone(), e))?;
            if !moved.succeeded() {
                let _ = client.lease_revoke(lease).await; // the key changed meanwhile: look again
                return Ok(None);
            }
            tracing::warn!(
                claim,
                ?reason,
                ttl_seconds,
                "held back the claim key of a pod that may still run"
            );
            if *client_lease != 0
                && let Err(e) = client.lease_revoke(*client_lease).await
            {
                tracing::debug!(claim, error = %e, "revoking the client's lease failed (it learns at its next renewal)");
            }
            Ok(Some(Action::new(
                claim,
                &value.pod,
                ActionKind::Revoked(*create_revision, *reason),
            )))
        }
    }
}
