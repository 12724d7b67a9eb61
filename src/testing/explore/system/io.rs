//! The model's side of a controller's turn ([`crate::controller::k8s::turn::TurnIo`]):
//! its caches and memory for the plan, and the API server for its reads and writes:
//! resourceVersions checked as the API server checks them, and the properties checked
//! as each write lands (a claim deleted as expired, a status written, a lock let go).
//! Direct grants and status grants reach the clients as messages they take at any later
//! step.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::DeleteParams;

use super::objects::{self, claim_lease, lock_object};
use super::{Ms, Server, System};
use crate::api::{DistributedLock, DistributedLockStatus};
use crate::controller::cache::tracker::Tracker;
use crate::controller::error::Error;
use crate::controller::k8s::claim_io::ClaimIo;
use crate::controller::k8s::observe::{Caches, Plan, Warning};
use crate::controller::k8s::sweep::{Tombstone, Tombstones};
use crate::controller::k8s::turn::{Ended, TurnIo, turn};
use crate::controller::status::Step;
use crate::decide::PodView;
use crate::protocol::Handover;
use crate::protocol::grant::Grant;

/// What controller `c` reads for a plan: its caches.
struct ModelCaches<'a> {
    view: &'a Server,
    tombstones: &'a Tombstones<Ms>,
    noticed: &'a BTreeMap<String, Ms>,
}

impl Caches<Ms> for ModelCaches<'_> {
    fn claims(&self, _lock: &DistributedLock) -> Vec<Arc<Lease>> {
        let labelled = self.view.claims.iter().filter(|(_, o)| o.labelled);
        labelled.map(|(n, o)| Arc::new(claim_lease(n, o))).collect()
    }

    fn tombstones(&self, ns: &str, lock: &str, now: Ms) -> Vec<Tombstone> {
        self.tombstones.of_lock(ns, lock, now)
    }

    fn noticed(&self, _ns: &str, claim: &str, hash: Option<&str>) -> Option<Ms> {
        let at = *self.noticed.get(claim)?;
        crate::protocol::release::notice_proves(super::secret().reveal(), hash).then_some(at)
    }

    fn pods(&self, _ns: &str, names: &mut dyn Iterator<Item = &str>) -> BTreeMap<String, PodView> {
        let known = |name: &str| self.view.pods.iter().find(|i| objects::pod(**i).0 == name).copied();
        names
            .filter_map(|n| {
                let i = known(n)?;
                let view = PodView {
                    uid: objects::pod(i).1,
                    finished: false,
                };
                Some((n.to_string(), view))
            })
            .collect()
    }

    fn deleting(&self, _ns: &str, _claim: &str) -> bool {
        false // the model's deletions land at once
    }

    fn wall(&self) -> Timestamp {
        objects::wall()
    }
}

/// Controller `c`'s turn I/O on the model.
struct ModelIo<'a> {
    sys: Mutex<&'a mut System>,
    c: usize,
}

/// An API error of `code`.
fn api_error(code: u16, reason: &str) -> kube::Error {
    kube::Error::Api(kube::core::Status::failure(reason, reason).with_code(code).boxed())
}

impl<'a> ModelIo<'a> {
    fn sys(&self) -> std::sync::MutexGuard<'_, &'a mut System> {
        self.sys.lock().expect("the model's lock")
    }
}

impl ClaimIo for ModelIo<'_> {
    type Moment = Ms;

    fn now(&self) -> Ms {
        self.sys().now
    }

    fn tracker<R>(&self, f: impl FnOnce(&mut Tracker<Ms>) -> R) -> R {
        f(&mut self.sys().ctrls[self.c].tracker)
    }

    async fn read_claim(&self, _ns: &str, name: &str) -> Result<Option<Lease>, kube::Error> {
        Ok(self.sys().server.claims.get(name).map(|o| claim_lease(name, o)))
    }

    async fn delete_claim(&self, _ns: &str, name: &str, params: DeleteParams) -> Result<(), kube::Error> {
        let mut sys = self.sys();
        let Some(obj) = sys.server.claims.get(name) else {
            return Err(api_error(404, "NotFound"));
        };
        let wanted = params.preconditions.and_then(|p| p.resource_version);
        if wanted.is_some_and(|rv| rv != obj.rv.to_string()) {
            return Err(api_error(409, "Conflict"));
        }
        sys.next_rv();
        sys.server.claims.remove(name);
        Ok(())
    }
}

impl TurnIo for ModelIo<'_> {
    fn wall(&self) -> Timestamp {
        objects::wall()
    }

    fn plan(&self, lock: &DistributedLock, now: Ms) -> Plan<Ms> {
        let mut sys = self.sys();
        let super::controller::Ctrl {
            view,
            tracker,
            tombstones,
            noticed,
            ..
        } = &mut sys.ctrls[self.c];
        let empty = Server::default();
        let caches = ModelCaches {
            view: view.as_ref().unwrap_or(&empty),
            tombstones,
            noticed,
        };
        crate::controller::k8s::observe::plan(lock, &caches, tracker, now)
    }

    fn bury_expired(&self, lease: &Lease, now: Ms) {
        let sys = self.sys();
        let name = lease.name_any();
        let client = lease.spec.as_ref().and_then(|s| s.holder_identity.clone());
        let client = client.and_then(|p| p.trim_start_matches('p').parse::<usize>().ok());
        sys.check_not_acting(client, &name);
        sys.ctrls[self.c].tombstones.bury_expired(lease, now);
    }

    async fn ensure_finalizer(&self, _current: &mut DistributedLock) -> Result<bool, Error> {
        Ok(true) // the model's locks carry it from their creation
    }

    async fn write_status(&self, current: &mut DistributedLock, status: DistributedLockStatus) -> Result<Step, Error> {
        Ok(self.sys().write_status(self.c, current, status))
    }

    /// Every successor is told (the shipped controller leaves a grant untold only where
    /// the successor takes its predecessor's mark, which the model's `SeeMark` plays).
    fn grant_directly(&self, grant: &Grant<'_>, _designated_by: Option<&str>, _handover: Option<Handover<'_>>) {
        let mut sys = self.sys();
        sys.check_direct_grant(grant.claim, grant.fencing_token);
        let view = sys.ctrls[self.c].view.as_ref();
        let status = view.and_then(|v| v.lock.as_ref()).map(|l| l.status.clone());
        sys.tell(grant.claim, grant.fencing_token, &status.unwrap_or_default());
    }

    /// No time passes: what may happen meanwhile may happen during the status write.
    async fn settle_after_tell(&self) {}

    fn published(&self) -> (Option<String>, Option<String>) {
        (None, None)
    }

    fn publish_warnings(&self, _warnings: &[Warning]) {}

    fn after_write(&self, lock: &DistributedLock, plan: &Plan<Ms>) {
        self.sys().after_write(self.c, lock, plan);
    }

    fn record_error(&self, _e: &Error) {}
}

impl System {
    /// Controller `c`'s turn on `lock` (as its caches show it).
    pub(super) fn turn(&mut self, c: usize, lock: &super::LockObj) {
        let current = lock_object(lock);
        let ended = {
            let io = ModelIo {
                sys: Mutex::new(&mut *self),
                c,
            };
            futures::executor::block_on(turn(&io, current))
        };
        match ended {
            Ok(Ended::Requeue(at)) => self.ctrls[c].next_deadline = at,
            Ok(Ended::AwaitChange) => self.ctrls[c].next_deadline = None,
            Ok(Ended::LetGo(_)) => {
                let stored = self.server.lock.as_ref().filter(|l| l.uid == lock.uid);
                if let Some(uid) = stored.map(|l| l.uid) {
                    self.check_let_go(uid);
                    self.next_rv();
                    self.server.lock = None; // the finalizer lets it go
                }
            }
            Err(_) => {} // looked at again on its next turn
        }
    }

    /// The API server takes a status write: under `current`'s resourceVersion, if it has
    /// one. The properties are checked as it lands; clients granted by it are told (the
    /// lock's watch).
    fn write_status(&mut self, c: usize, current: &mut DistributedLock, status: DistributedLockStatus) -> Step {
        if crate::controller::status::unchanged(current.status.as_ref(), &status) {
            return Step::Unchanged;
        }
        let uid = current.metadata.uid.clone();
        let Some(stored) = self
            .server
            .lock
            .clone()
            .filter(|l| Some(format!("lock-{}", l.uid)) == uid)
        else {
            return Step::Stop;
        };
        if current
            .metadata
            .resource_version
            .as_ref()
            .is_some_and(|rv| *rv != stored.rv.to_string())
        {
            *current = lock_object(&stored); // a conflict: re-read
            return Step::Again;
        }
        self.check_write(&stored.status, &status);
        let rv = self.next_rv();
        let written = self.server.lock.as_mut().expect("stored");
        (written.status, written.rv) = (status.clone(), rv);
        let written = written.clone();
        let max_holders = written.spec.max_holders;
        if let Some(v) = self.ctrls[c].view.as_mut() {
            v.lock = Some(written); // the controller's own write, as `Written` keeps it
        }
        let newly = status.holders.iter().filter(|h| h.revoked.is_none()).filter(|h| {
            !(stored.status.holders.iter()).any(|o| o.claim == h.claim && o.fencing_token == h.fencing_token)
        });
        let granted: Vec<(String, i64)> = newly.map(|h| (h.claim.clone(), h.fencing_token)).collect();
        for (claim, token) in granted {
            self.tell(&claim, token, &status);
        }
        self.designate(&status, max_holders);
        self.see_placed(&status);
        Step::Written
    }

    /// After controller `c`'s write: its tombstones settle, and the claims the decision
    /// names are deleted (an expired one the status did not name only as it was seen).
    fn after_write(&mut self, c: usize, lock: &DistributedLock, plan: &Plan<Ms>) {
        let d = &plan.decision;
        let server = &self.server;
        let stored = |n: &str| self.ctrls[c].view.as_ref().is_some_and(|v| v.claims.contains_key(n));
        let named = |n: &str| crate::protocol::names_claim(&d.status, n);
        self.ctrls[c]
            .tombstones
            .settle(objects::NS, &lock.name_any(), named, stored);
        let as_seen = |n: &str| {
            plan.expire_unnamed
                .iter()
                .find(|l| l.name_any() == n)
                .map(|l| l.resource_version())
        };
        let gone: Vec<String> = (d.delete_claims.iter())
            .filter(|n| match (as_seen(n), server.claims.get(n.as_str())) {
                (Some(rv), Some(obj)) => rv == Some(obj.rv.to_string()),
                (None, Some(_)) => true,
                (_, None) => false,
            })
            .cloned()
            .collect();
        for name in gone {
            self.next_rv();
            self.server.claims.remove(&name);
        }
    }

    /// The property as a controller sends a direct grant: the API server stores that
    /// grant already, as the designated successor's (or as a holder's): a grant sent
    /// before its designation is stored binds no later decision (see
    /// [`crate::protocol::grant`]).
    fn check_direct_grant(&self, claim: &str, token: i64) {
        let stored = self.server.lock.as_ref().map(|l| &l.status);
        let is = |c: &str, t: i64| c == claim && t == token;
        let designated = stored
            .and_then(|s| s.successor.as_ref())
            .is_some_and(|s| is(&s.claim, s.fencing_token));
        let listed = stored.is_some_and(|s| s.holders.iter().any(|h| is(&h.claim, h.fencing_token)));
        assert!(
            designated || listed,
            "{claim} told directly of its grant with token {token}, which the stored status neither designates nor lists"
        );
    }

    /// The property as a controller deletes a claim as expired: its process does not act.
    fn check_not_acting(&self, client: Option<usize>, name: &str) {
        let Some(client) = client.and_then(|i| self.clients.get(i)) else {
            return; // the neighbour's own
        };
        assert!(
            !(client.token > 0 && client.until > self.now),
            "claim {name} deleted as expired while its process may act until {:?} (now {:?})",
            client.until,
            self.now
        );
    }

    /// The properties of a status write over `old`: the stored token never goes down;
    /// a holder's slot passes only once its process has stopped; grants go in arrival
    /// order (no claim granted while an older one still waits); every holder it lists
    /// was a holder, or the designated successor, with that token before, or holds a
    /// token issued now (no claim holds a slot the lock never gave it).
    fn check_write(&self, old: &DistributedLockStatus, next: &DistributedLockStatus) {
        assert!(
            next.fencing_token >= old.fencing_token,
            "the stored fencing token went from {} down to {}",
            old.fencing_token,
            next.fencing_token
        );
        for h in &old.holders {
            let kept = next
                .holders
                .iter()
                .any(|x| x.claim == h.claim && x.fencing_token == h.fencing_token);
            let acting = self
                .clients
                .iter()
                .position(|c| c.token == h.fencing_token && c.until > self.now);
            assert!(
                kept || acting.is_none(),
                "the slot of {} (token {}) passed while client {acting:?}'s process may act until {:?} (now {:?})",
                h.claim,
                h.fencing_token,
                acting.map(|i| self.clients[i].until),
                self.now
            );
        }
        let issued_now = |t: i64| t > old.fencing_token && next.fencing_token_epoch.is_some_and(|e| t > e);
        let made = |n: &str| self.server.claims.get(n).map(|c| c.made);
        for h in &next.holders {
            let was = old
                .holders
                .iter()
                .any(|x| x.claim == h.claim && x.fencing_token == h.fencing_token);
            let designated =
                (old.successor.as_ref()).is_some_and(|s| s.claim == h.claim && s.fencing_token == h.fencing_token);
            assert!(
                was || designated || issued_now(h.fencing_token),
                "{} holds a slot with token {} the lock never granted it",
                h.claim,
                h.fencing_token
            );
            if was || h.revoked.is_some() {
                continue;
            }
            let before =
                |w: &&crate::api::Waiter| matches!((made(&w.claim), made(&h.claim)), (Some(x), Some(y)) if x < y);
            let older = next.queue.iter().find(before);
            assert!(
                older.is_none(),
                "{} granted while the older {:?} waits",
                h.claim,
                older.map(|w| &w.claim)
            );
        }
    }
}
