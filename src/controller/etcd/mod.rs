//! Locks whose claims live in etcd: one mirror task per lock watches its keys; the
//! reconcile reports them in status ([`crate::etcd::rules::mirror`]) and takes away the
//! keys of gone pods (delete, or hold back when the process may still run).
//!
//! etcd grants, not the controller: when the controller is down, etcd-backed locks
//! still hand over; only the status report and the revocations of gone pods wait.

pub(crate) mod mirror;
pub(crate) mod revoke;

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
use crate::api::{DistributedLock, EtcdBackend};
use crate::controller::backend::Backend;
use crate::controller::context::Context;
use crate::controller::error::{Error, MAX_CONFLICT_RETRIES};
use crate::controller::status::{Step, Trouble, with_conditions, write_status};
use crate::decide::{Action, ActionKind};
use crate::etcd::Error as EtcdError;
use crate::etcd::keys::ClaimValue;
use crate::etcd::rules::{self, KeyView};

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
        let (mut retry, mut failed) = (false, None);
        if let Some(etcd) = client {
            let io = LiveKeys {
                pods: Api::namespaced(ctx.client.clone(), &ns),
                etcd,
            };
            let taken = revoke::take_away(&io, actions).await;
            events.extend(taken.events);
            (retry, failed) = (taken.retry, taken.failed);
        }
        // The same metrics as a Lease-backed lock's (a release here is seen when etcd
        // shows its key gone: no handoff is timed from a notice or a mark).
        ctx.metrics
            .record_actions((&ns, &name), &old, &events, &[], Timestamp::now());
        ctx.metrics.reconcile_seconds.observe(started.elapsed().as_secs_f64());
        crate::controller::events::publish_actions(&ctx, &current, events);
        if let Some(e) = failed {
            return Err(Error::Etcd(e)); // what was done before it is published above
        }
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

/// The controller's side of [`revoke::KeyIo`]: the pod API and the lock's etcd.
struct LiveKeys {
    pods: Api<Pod>,
    etcd: Client,
}

impl revoke::KeyIo for LiveKeys {
    async fn pod_uid(&self, pod: &str) -> Result<Option<String>, String> {
        let got = self.pods.get_opt(pod).await.map_err(|e| e.to_string())?;
        Ok(got.and_then(|p| p.uid()))
    }

    async fn grant_lease(&self, key: &str, ttl_seconds: i64) -> Result<i64, EtcdError> {
        let granted = self.etcd.clone().lease_grant(ttl_seconds, None).await;
        Ok(granted.map_err(|e| EtcdError::Revoke(key.into(), e))?.id())
    }

    async fn keep_alive(&self, key: &str, id: i64) -> Result<(), EtcdError> {
        let refresh = async {
            let (mut keeper, mut answers) = self.etcd.clone().lease_keep_alive(id).await?;
            keeper.keep_alive().await?;
            answers.message().await.map(drop)
        };
        refresh.await.map_err(|e| EtcdError::Revoke(key.into(), e))
    }

    async fn revoke_lease(&self, key: &str, id: i64) -> Result<(), EtcdError> {
        let revoked = self.etcd.clone().lease_revoke(id).await;
        revoked.map(drop).map_err(|e| EtcdError::Revoke(key.into(), e))
    }

    async fn delete(&self, key: &str, if_revision: Option<i64>) -> Result<bool, EtcdError> {
        self.txn(key, if_revision, TxnOp::delete(key, None)).await
    }

    async fn put(
        &self,
        key: &str,
        if_revision: Option<i64>,
        value: &ClaimValue,
        lease: i64,
    ) -> Result<bool, EtcdError> {
        let options = PutOptions::new().with_lease(lease);
        self.txn(key, if_revision, TxnOp::put(key, value.to_bytes(), Some(options)))
            .await
    }
}

impl LiveKeys {
    /// Do `op` on `key` in one Txn, if its mod revision is `if_revision` (any, when `None`).
    async fn txn(&self, key: &str, if_revision: Option<i64>, op: TxnOp) -> Result<bool, EtcdError> {
        let when = if_revision.map(|rev| Compare::mod_revision(key, CompareOp::Equal, rev));
        let txn = Txn::new().when(when.into_iter().collect::<Vec<_>>()).and_then([op]);
        let done = self.etcd.clone().txn(txn).await;
        Ok(done.map_err(|e| EtcdError::Revoke(key.into(), e))?.succeeded())
    }
}
