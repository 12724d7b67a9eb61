//! The controller's side of a turn ([`super::turn`]): its caches (the watches' stores
//! and indexes, the tombstones, the release notices taken, the deletions sent), its
//! memory on the monotonic clock, and the API server.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams};
use kube::runtime::reflector::ObjectRef;

use super::claim_io::ClaimIo;
use super::observe::{Caches, Plan, Warning};
use super::sweep::Tombstone;
use super::turn::TurnIo;
use crate::api::{DistributedLock, DistributedLockStatus};
use crate::controller::cache::tracker::Tracker;
use crate::controller::context::Context;
use crate::controller::error::Error;
use crate::controller::status::Step;
use crate::decide::PodView;
use crate::protocol::grant::Grant;
use crate::protocol::{Handover, claim};

/// The controller's caches, as a turn reads them.
pub struct Live<'a>(pub &'a Context);

impl Caches<Instant> for Live<'_> {
    /// The index names them, the store holds them.
    fn claims(&self, lock: &DistributedLock) -> Vec<Arc<Lease>> {
        let ctx = self.0;
        let (ns, name) = (lock.namespace().unwrap_or_default(), lock.name_any());
        ctx.k8s
            .claims
            .of_lock(&ns, &name)
            .into_iter()
            .filter_map(|claim| ctx.k8s.leases.get(&ObjectRef::new(&claim).within(&ns)))
            .filter(|l| claim::claim_lock(l) == Some(name.as_str()))
            // Being deleted (its renewals are no renewals to its client): no claim.
            .filter(|l| l.metadata.deletion_timestamp.is_none())
            .collect()
    }

    fn tombstones(&self, ns: &str, lock: &str, now: Instant) -> Vec<Tombstone> {
        self.0.k8s.tombstones.of_lock(ns, lock, now)
    }

    fn noticed(&self, ns: &str, claim: &str, hash: Option<&str>) -> Option<Instant> {
        self.0.k8s.notices.proves(ns, claim, hash)
    }

    fn pods(&self, ns: &str, names: &mut dyn Iterator<Item = &str>) -> BTreeMap<String, PodView> {
        self.0.pods.views(ns, names)
    }

    fn deleting(&self, ns: &str, claim: &str) -> bool {
        self.0.written.deleting(ns, claim)
    }

    fn wall(&self) -> Timestamp {
        Timestamp::now()
    }
}

/// The controller's turn I/O: the API server through `ctx.client`, the lock's API `api`.
pub struct LiveIo<'a> {
    /// The controller's shared state.
    pub ctx: &'a Arc<Context>,
    /// The lock's namespace's DistributedLock API.
    pub api: Api<DistributedLock>,
    /// Whether, since this turn last settled, a successor learns its grant on a claim: its
    /// grant written on its own, or its predecessor's mark left to hand over.
    pub wrote_on_claim: std::sync::atomic::AtomicBool,
}

impl LiveIo<'_> {
    fn leases(&self, ns: &str) -> Api<Lease> {
        Api::namespaced(self.ctx.client.clone(), ns)
    }
}

impl ClaimIo for LiveIo<'_> {
    type Moment = Instant;

    fn now(&self) -> Instant {
        Instant::now()
    }

    fn tracker<R>(&self, f: impl FnOnce(&mut Tracker<Instant>) -> R) -> R {
        f(&mut self.ctx.tracker.lock().expect("tracker lock poisoned"))
    }

    async fn read_claim(&self, ns: &str, name: &str) -> Result<Option<Lease>, kube::Error> {
        self.leases(ns).get_opt(name).await
    }

    async fn delete_claim(&self, ns: &str, name: &str, params: DeleteParams) -> Result<(), kube::Error> {
        self.leases(ns).delete(name, &params).await.map(|_| ())
    }
}

impl TurnIo for LiveIo<'_> {
    fn wall(&self) -> Timestamp {
        Timestamp::now()
    }

    fn plan(&self, lock: &DistributedLock, now: Instant) -> Plan<Instant> {
        let mut tracker = self.ctx.tracker.lock().expect("tracker lock poisoned");
        super::observe::plan(lock, &Live(self.ctx), &mut tracker, now)
    }

    fn bury_expired(&self, lease: &Lease, now: Instant) {
        self.ctx.k8s.tombstones.bury_expired(lease, now);
    }

    async fn ensure_finalizer(&self, current: &mut DistributedLock) -> Result<bool, Error> {
        Ok(crate::controller::finalizer::ensure(&self.ctx.written, &self.api, current).await?)
    }

    async fn write_status(&self, current: &mut DistributedLock, status: DistributedLockStatus) -> Result<Step, Error> {
        let step = crate::controller::status::write_status(self.ctx, &self.api, current, status).await?;
        if matches!(step, Step::Written) {
            self.ctx.k8s.notices.wrote(); // answers waiting for a write look again
        }
        Ok(step)
    }

    fn grant_directly(&self, grant: &Grant<'_>, designated_by: Option<&str>, handover: Option<Handover<'_>>) {
        if self.ctx.k8s.notices.successors.grant(grant) {
            self.ctx.metrics.direct_grants.inc();
            tracing::debug!(
                claim = grant.claim,
                token = grant.fencing_token,
                "successor told of its grant"
            );
        } else if super::claim_grant::write(self.ctx, grant, designated_by, handover) {
            self.wrote_on_claim.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }

    async fn settle_after_tell(&self) {
        if self.wrote_on_claim.swap(false, std::sync::atomic::Ordering::Relaxed) {
            tokio::time::sleep(super::claim_grant::CLAIM_GRANT_SETTLE).await;
        }
    }

    /// The key always: a grant written on a claim is checked by it, URL or not.
    fn published(&self) -> (Option<String>, Option<String>) {
        let url = self.ctx.k8s.release_url.clone();
        (url, Some(self.ctx.k8s.notices.successors.public_key()))
    }

    fn publish_warnings(&self, warnings: &[Warning]) {
        crate::controller::events::publish_warnings(self.ctx, warnings);
    }

    fn after_write(&self, lock: &DistributedLock, plan: &Plan<Instant>) {
        super::apply::after_write(self.ctx, lock, plan);
    }

    fn record_error(&self, e: &Error) {
        self.ctx.metrics.record_error(e.category());
    }
}
