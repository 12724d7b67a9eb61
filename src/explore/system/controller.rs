//! The controller replicas, as `controller::k8s` reconciles: observe (its caches, its
//! memory of when it saw each claim renewed and each revocation), judge expiries and
//! hold-backs by [`crate::protocol::timing`], confirm each with a fresh read and delete
//! it under that read's resourceVersion, decide with the real [`decide`], tell a
//! designated successor of its grant directly, write the status under the
//! resourceVersion it read, then delete the claims the decision names and let a deleted
//! lock go once nothing holds it.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use super::{ClaimObj, LockObj, Mark, Ms, Server, System, secs};
use crate::api::{DistributedLockStatus, Holder};
use crate::decide::{ActionKind, Arrival, ClaimView, PodView, World, decide, holder_lease, occupied};
use crate::mutant::{Mutant, on as mutant};
use crate::protocol::timing::{MAX_LEASE_SECONDS, controller_expiry, hold_back_ends, judged_lease};
use crate::protocol::{record, release};

/// What a controller saw of one claim.
#[derive(Clone, Debug)]
struct Seen {
    renewals: u32,
    /// When it saw the last renewal.
    changed: Ms,
    /// The order in which it first saw the claims.
    seq: u64,
}

/// One controller replica: its caches and its memory.
#[derive(Clone, Debug, Default)]
pub(super) struct Ctrl {
    /// It believes it leads.
    pub leads: bool,
    /// The API server as its caches last showed it.
    pub view: Option<Server>,
    seen: BTreeMap<String, Seen>,
    next_seq: u64,
    /// When it first saw each revoked holder revoked.
    revoked_seen: BTreeMap<String, Ms>,
    /// Claims whose release notice it accepted.
    pub noticed: BTreeSet<String>,
    /// Claims it deleted as expired, as it read them: expired until the status drops them.
    pub buried: BTreeMap<String, ClaimObj>,
}

impl Ctrl {
    pub fn shift(&mut self, f: impl Fn(&mut Ms)) {
        self.seen.values_mut().for_each(|s| f(&mut s.changed));
        self.revoked_seen.values_mut().for_each(f);
    }
}

/// The real judgement of a release mark written by `by`, against the `recorded` hash.
fn judge_mark(by: Mark, recorded: Option<&str>) -> release::Mark {
    let mark = match by {
        Mark::None => return release::Mark::None,
        Mark::Owner => super::secret().reveal().to_string(),
        Mark::Forged => "true".to_string(),
    };
    let mut lease = k8s_openapi::api::coordination::v1::Lease::default();
    lease.metadata.annotations = Some([(crate::protocol::RELEASED_ANNOTATION.to_string(), mark)].into());
    release::judge(&lease, recorded)
}

/// The lease claim `name` is judged by for its expiry, as `judge_claims` judges it:
/// [`judged_lease`] of what it states and what `status` recorded for it.
fn own_lease(name: &str, obj: &ClaimObj, status: &DistributedLockStatus) -> Duration {
    let holding = status.holders.iter().any(|h| h.claim == name);
    let recorded = record::recorded(status, name).and_then(|r| r.lease_seconds);
    let recorded = recorded.map(|l| Duration::from_secs(l.clamp(0, MAX_LEASE_SECONDS) as u64));
    // As `claim::claim_lease_duration` reads it: none stated (0) is none.
    let stated = Duration::from_secs(obj.lease.max(0) as u64);
    judged_lease(stated, Some(secs(obj.wait)), recorded, holding)
}

impl System {
    /// Controller `c`'s caches catch up with the API server; a renewal counts as seen now.
    fn sync(&mut self, c: usize) {
        self.sync_claims(c);
        let view = self.ctrls[c].view.as_mut().expect("synced");
        (view.lock, view.leader, view.rv) = (self.server.lock.clone(), self.server.leader, self.server.rv);
    }

    /// Controller `c`'s lock watch catches up, its claim and pod watches do not.
    pub(super) fn sync_lock(&mut self, c: usize) {
        if let Some(view) = self.ctrls[c].view.as_mut() {
            (view.lock, view.rv) = (self.server.lock.clone(), 0);
        }
    }

    /// Controller `c`'s claim and pod watches catch up (its lock watch may not): a
    /// renewal counts as seen now.
    pub(super) fn sync_claims(&mut self, c: usize) {
        let now = self.now;
        let server = self.server.clone();
        let ctrl = &mut self.ctrls[c];
        for (name, obj) in &server.claims {
            match ctrl.seen.get_mut(name) {
                Some(s) if s.renewals == obj.renewals => {}
                Some(s) => (s.renewals, s.changed) = (obj.renewals, now),
                None => {
                    ctrl.next_seq += 1;
                    let seen = Seen {
                        renewals: obj.renewals,
                        changed: now,
                        seq: ctrl.next_seq,
                    };
                    ctrl.seen.insert(name.clone(), seen);
                }
            }
        }
        // Forgotten as deleted: a revoked holder may have renewed until just before.
        let gone: Vec<String> = ctrl
            .seen
            .keys()
            .filter(|n| !server.claims.contains_key(*n))
            .cloned()
            .collect();
        for name in gone {
            ctrl.seen.remove(&name);
            if let Some(from) = ctrl.revoked_seen.get_mut(&name) {
                *from = (*from).max(now);
            }
        }
        let lock = ctrl.view.as_mut().map(|v| v.lock.take());
        ctrl.view = Some(Server {
            lock: lock.unwrap_or_else(|| server.lock.clone()),
            rv: 0, // partly current
            ..server
        });
    }

    /// When controller `c` judges claim `name` expired.
    fn expiry(&self, c: usize, name: &str, obj: &ClaimObj, lock: &LockObj) -> Ms {
        let seen = self.ctrls[c].seen.get(name).map_or(self.now, |s| s.changed);
        controller_expiry(
            seen,
            secs(lock.spec.lease_duration_seconds),
            own_lease(name, obj, &lock.status),
        )
    }

    /// When controller `c` lets revoked holder `h`'s held-back slot pass on.
    fn hold_back_end(&self, c: usize, h: &Holder, lock: &LockObj) -> Ms {
        let ctrl = &self.ctrls[c];
        let from = ctrl.revoked_seen.get(&h.claim).copied().unwrap_or(self.now);
        let renewed = ctrl.seen.get(&h.claim).map(|s| s.changed);
        let spec = secs(lock.spec.lease_duration_seconds);
        hold_back_ends(from.max(renewed.unwrap_or(from)), holder_lease(spec, h))
    }

    /// The expiries and hold-back ends controller `c` waits for.
    pub(super) fn ctrl_deadlines(&self, c: usize) -> Vec<Ms> {
        let Some(lock) = self.ctrls[c].view.as_ref().and_then(|v| v.lock.as_ref()) else {
            return Vec::new();
        };
        let view = self.ctrls[c].view.as_ref().expect("a view");
        let revoked = |n: &str| lock.status.holders.iter().any(|h| h.claim == n && h.revoked.is_some());
        let claims = view.claims.iter().filter(|(n, _)| !revoked(n));
        let mut out: Vec<Ms> = claims.map(|(n, obj)| self.expiry(c, n, obj, lock)).collect();
        let holds = lock.status.holders.iter().filter(|h| h.revoked.is_some());
        out.extend(holds.map(|h| self.hold_back_end(c, h, lock)));
        out
    }

    /// Whether controller `c`'s caches may differ from the API server (a stale step then
    /// differs from a fresh one): `rv` is the server's only when all of it was synced.
    pub(super) fn stale_differs(&self, c: usize) -> bool {
        let ctrl = &self.ctrls[c];
        ctrl.leads && ctrl.view.as_ref().is_some_and(|v| v.rv != self.server.rv)
    }

    /// One reconcile of the lock by controller `c`, on fresh caches or on what it has.
    pub(super) fn reconcile(&mut self, c: usize, fresh: bool) {
        if fresh {
            self.sync(c);
            if self.server.leader != c {
                self.ctrls[c].leads = false;
            }
        }
        let ctrl = &self.ctrls[c];
        let Some(view) = ctrl.view.clone().filter(|_| ctrl.leads) else {
            return;
        };
        let Some(lock) = view.lock.clone() else { return };
        let now = self.now;
        let revoked = lock.status.holders.iter().filter(|h| h.revoked.is_some());
        for h in revoked.clone() {
            self.ctrls[c].revoked_seen.entry(h.claim.clone()).or_insert(now);
        }
        let (claims, mut expired) = self.judge(c, &view, &lock);
        let mut elapsed = BTreeSet::new();
        for h in revoked {
            if now < self.hold_back_end(c, h, &lock) {
                continue;
            }
            let released = claims.iter().any(|v| v.name == h.claim && v.released);
            if view.claims.contains_key(&h.claim) && !released {
                expired.insert(h.claim.clone()); // confirmed like an expiry
            }
            elapsed.insert(h.claim.clone());
        }
        for name in &expired {
            if !self.confirm_expiry(c, name) {
                return; // renewed unseen, or gone unseen: plan again
            }
        }
        self.decide_and_write(c, &view, &lock, &claims, &elapsed);
    }

    /// Judge each claim controller `c` sees (and those it deleted as expired that the
    /// status still names): the claim views, and those whose expiry passed.
    fn judge(&self, c: usize, view: &Server, lock: &LockObj) -> (Vec<ClaimView>, BTreeSet<String>) {
        let ctrl = &self.ctrls[c];
        let status = &lock.status;
        let named = |n: &str| status.holders.iter().any(|h| h.claim == n) || status.queue.iter().any(|w| w.claim == n);
        let buried = ctrl
            .buried
            .iter()
            .filter(|(n, _)| !view.claims.contains_key(*n) && named(n));
        let in_view = view.claims.iter().map(|(n, o)| (n, o, false));
        let mut expired = BTreeSet::new();
        let mut claims = Vec::new();
        for (name, obj, buried) in in_view.chain(buried.map(|(n, o)| (n, o, true))) {
            let revoked = status.holders.iter().any(|h| &h.claim == name && h.revoked.is_some());
            let is_expired = buried || (!revoked && self.now >= self.expiry(c, name, obj, lock));
            if is_expired && !buried {
                expired.insert(name.clone());
            }
            let seq = ctrl.seen.get(name).map_or(u64::MAX, |s| s.seq);
            // The hash its mark is judged by: the one recorded, else the claim's own.
            let (holder, waiter) = (
                status.holders.iter().find(|h| &h.claim == name),
                status.queue.iter().find(|w| &w.claim == name),
            );
            let claims_own = obj.hash.then(|| super::secret_hash().to_string());
            let recorded = match (holder, waiter) {
                (Some(h), _) => h.release_hash.clone(),
                (None, Some(w)) => w.release_hash.clone(),
                (None, None) => claims_own,
            };
            let mark = judge_mark(obj.mark, recorded.as_deref());
            let noticed = ctrl.noticed.contains(name);
            claims.push(ClaimView {
                name: name.clone(),
                pod: format!("p{}", obj.client),
                pod_uid: format!("u{}", obj.client),
                arrival: Arrival {
                    created_secs: 0,
                    requested_micros: i64::from(obj.made),
                    seen_seq: seq,
                },
                released: mark == release::Mark::Valid || (mark == release::Mark::None && noticed),
                forged: mark == release::Mark::Forged,
                release_hash: recorded,
                wait_hash: None,
                stamped_token: obj.stamped.then_some(1),
                expired: is_expired,
                lease_seconds: obj.lease,
            });
        }
        (claims, expired)
    }

    /// Read claim `name` afresh; unless renewed since controller `c` saw it, delete it
    /// under that read. False: renewed (seen now) or gone unseen, so plan again.
    fn confirm_expiry(&mut self, c: usize, name: &str) -> bool {
        let now = self.now;
        let seen = self.ctrls[c].seen.get(name).map(|s| s.renewals);
        let fresh = self.server.claims.get(name).cloned();
        let without_read = mutant(Mutant::ExpiryWithoutFreshRead);
        match fresh {
            None if without_read => true,
            None => false,
            Some(obj) if without_read || Some(obj.renewals) == seen => {
                self.check_not_acting(&obj, name);
                self.next_rv();
                self.server.claims.remove(name);
                self.ctrls[c].buried.insert(name.to_string(), obj);
                true
            }
            Some(obj) => {
                if let Some(s) = self.ctrls[c].seen.get_mut(name) {
                    (s.renewals, s.changed) = (obj.renewals, now);
                }
                false
            }
        }
    }

    /// The property as a controller deletes a claim as expired: its process does not act.
    fn check_not_acting(&self, obj: &ClaimObj, name: &str) {
        let Some(client) = self.clients.get(obj.client) else {
            return; // the neighbour's own
        };
        assert!(
            !(client.token > 0 && client.until > self.now),
            "claim {name} deleted as expired while its process may act until {:?} (now {:?})",
            client.until,
            self.now
        );
    }

    /// Decide on what controller `c` observed and carry the decision out.
    fn decide_and_write(
        &mut self,
        c: usize,
        view: &Server,
        lock: &LockObj,
        claims: &[ClaimView],
        elapsed: &BTreeSet<String>,
    ) {
        let pods: BTreeMap<String, PodView> = (view.pods.iter())
            .map(|i| {
                let pod = PodView {
                    uid: format!("u{i}"),
                    finished: false,
                };
                (format!("p{i}"), pod)
            })
            .collect();
        let stopped = view.stopped.iter().map(|i| format!("u{i}")).collect();
        let world = World {
            spec: &lock.spec,
            status: &lock.status,
            claims,
            pods: &pods,
            stopped_pods: &stopped,
            hold_back_elapsed: elapsed,
            now: Timestamp::from_second(1_000_000).expect("a time"),
            // The epoch: the clock in microseconds, past every token an earlier
            // incarnation issued.
            token_floor: i64::from(lock.uid) * 1_000_000,
            closing: lock.deleting,
        };
        let d = decide(&world);
        let now = self.now;
        // A grant's expiry counts from its grant: before the write, whose answer may be lost.
        for a in d.actions.iter().filter(|a| matches!(a.kind, ActionKind::Granted(_))) {
            if let Some(s) = self.ctrls[c].seen.get_mut(&a.claim) {
                s.changed = s.changed.max(now);
            }
        }
        // The designated successor is told of its grant before the status write.
        if let Some(s) = &lock.status.successor
            && d.actions
                .iter()
                .any(|a| a.claim == s.claim && a.kind == ActionKind::Granted(s.fencing_token))
        {
            self.tell(&s.claim, s.fencing_token, &lock.status);
        }
        let written = if d.status == lock.status {
            lock.clone() // unchanged: nothing to write
        } else {
            let stored = self.server.lock.as_ref();
            if !stored.is_some_and(|l| l.uid == lock.uid && l.rv == lock.rv) {
                return; // a conflict: written since this controller read it
            }
            self.check_write(lock, &d.status, claims, &d.actions);
            let rv = self.next_rv();
            let written = self.server.lock.as_mut().expect("stored");
            (written.status, written.rv) = (d.status.clone(), rv);
            written.clone()
        };
        let ctrl = &mut self.ctrls[c];
        if let Some(v) = ctrl.view.as_mut() {
            v.lock = Some(written.clone());
        }
        let revoked: BTreeSet<&str> = (d.status.holders.iter())
            .filter(|h| h.revoked.is_some())
            .map(|h| h.claim.as_str())
            .collect();
        ctrl.revoked_seen.retain(|n, _| revoked.contains(n.as_str()));
        for n in revoked {
            ctrl.revoked_seen.entry(n.to_string()).or_insert(now);
        }
        let named =
            |n: &str| d.status.holders.iter().any(|h| h.claim == n) || d.status.queue.iter().any(|w| w.claim == n);
        ctrl.buried.retain(|n, _| named(n));
        for a in &d.actions {
            if let ActionKind::Granted(token) = a.kind {
                self.tell(&a.claim, token, &d.status);
            }
        }
        for name in &d.delete_claims {
            self.next_rv();
            self.server.claims.remove(name);
        }
        if written.deleting && !occupied(&d.status) {
            self.check_let_go(written.uid);
            self.next_rv();
            self.server.lock = None; // the finalizer lets it go
        }
    }

    /// The property as a deleted lock is let go: no process granted by it may act.
    fn check_let_go(&self, uid: u32) {
        let now = self.now;
        let (first, next) = (i64::from(uid) * 1_000_000, i64::from(uid + 1) * 1_000_000);
        let acting = self
            .clients
            .iter()
            .enumerate()
            .find(|(_, c)| (first..next).contains(&c.token) && c.until > now);
        assert!(
            acting.is_none(),
            "the deleted lock was let go while client {:?} it granted may act",
            acting.map(|(i, c)| (i, c.token, c.until))
        );
    }

    /// The properties of a status write: the stored token never goes down; grants go in
    /// arrival order (no claim granted while an older one still waits); every holder it
    /// lists was a holder, or the designated successor, with that token before, or is
    /// granted by this decision (no claim holds a slot the lock never gave it).
    fn check_write(
        &self,
        lock: &LockObj,
        next: &crate::api::DistributedLockStatus,
        claims: &[ClaimView],
        actions: &[crate::decide::Action],
    ) {
        assert!(
            next.fencing_token >= lock.status.fencing_token,
            "the stored fencing token went from {} down to {}",
            lock.status.fencing_token,
            next.fencing_token
        );
        for h in &next.holders {
            let was = |x: &crate::api::Holder| x.claim == h.claim && x.fencing_token == h.fencing_token;
            let designated = (lock.status.successor.as_ref())
                .is_some_and(|s| s.claim == h.claim && s.fencing_token == h.fencing_token);
            let granted = actions
                .iter()
                .any(|a| a.claim == h.claim && a.kind == ActionKind::Granted(h.fencing_token));
            assert!(
                lock.status.holders.iter().any(was) || designated || granted,
                "{} holds a slot with token {} the lock never granted it",
                h.claim,
                h.fencing_token
            );
        }
        let made = |n: &str| claims.iter().find(|c| c.name == n).map(|c| c.arrival.requested_micros);
        for a in actions.iter().filter(|a| matches!(a.kind, ActionKind::Granted(_))) {
            let before =
                |w: &&crate::api::Waiter| matches!((made(&w.claim), made(&a.claim)), (Some(x), Some(y)) if x < y);
            let older = next.queue.iter().find(before);
            assert!(
                older.is_none(),
                "{} granted while the older {:?} waits",
                a.claim,
                older.map(|w| &w.claim)
            );
        }
    }
}
