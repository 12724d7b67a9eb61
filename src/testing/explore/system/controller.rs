//! The controller replicas of the model: each with its caches (what its watches last
//! showed), its memory (the real [`Tracker`] and [`Tombstones`], fed as the real
//! watches feed them), the release notices it took, and when it will look again. A
//! reconcile is the shipped turn ([`crate::controller::k8s::turn`]) run on the model's
//! I/O ([`super::io`]): nothing of the controller's orchestration is written here.

use std::collections::{BTreeMap, BTreeSet};

use super::objects::{claim_lease, stopped_pod};
use super::{Ms, Server, System};
use crate::controller::cache::tracker::Tracker;
use crate::controller::k8s::sweep::Tombstones;

/// One controller replica: its caches and its memory.
#[derive(Clone, Debug, Default)]
pub(super) struct Ctrl {
    /// It believes it leads.
    pub leads: bool,
    /// The API server as its caches last showed it.
    pub view: Option<Server>,
    /// Its memory on its clock.
    pub tracker: Tracker<Ms>,
    /// Claims it remembers after their deletion.
    pub tombstones: Tombstones<Ms>,
    /// Claims whose release notice it took, and when.
    pub noticed: BTreeMap<String, Ms>,
    /// When its last turn asked to look again.
    pub next_deadline: Option<Ms>,
}

impl Ctrl {
    pub fn shift(&mut self, f: impl Fn(&mut Ms)) {
        let moved = |mut t: Ms| {
            f(&mut t);
            t
        };
        self.tracker.map_moments(moved);
        self.tombstones.map_moments(moved);
        self.noticed.values_mut().for_each(&f);
        if let Some(t) = self.next_deadline.as_mut() {
            f(t);
        }
    }
}

impl System {
    /// Controller `c`'s caches catch up with the API server.
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

    /// Controller `c`'s claim and pod watches catch up (its lock watch may not), feeding
    /// its memory as the real watches do: every labelled claim observed (a new
    /// renewTime counts as a renewal seen now), a claim gone from the labelled ones
    /// forgotten (and buried, as marked if it was released or noticed, while the lock
    /// it knows names it), a pod gone after the kubelet reported it stopped remembered.
    pub(super) fn sync_claims(&mut self, c: usize) {
        let now = self.now;
        let server = self.server.clone();
        let ctrl = &mut self.ctrls[c];
        let before = ctrl.view.take();
        let labelled = |s: &Server| -> BTreeSet<String> {
            s.claims
                .iter()
                .filter(|(_, o)| o.labelled)
                .map(|(n, _)| n.clone())
                .collect()
        };
        for (name, obj) in server.claims.iter().filter(|(_, o)| o.labelled) {
            ctrl.tracker.observe(&claim_lease(name, obj), now);
        }
        if let Some(old) = &before {
            let status = old.lock.as_ref().map(|l| &l.status);
            for name in labelled(old).difference(&labelled(&server)) {
                let mut last = old.claims[name].clone();
                if ctrl.noticed.remove(name).is_some() {
                    last.mark = super::Mark::Owner; // remembered as marked
                }
                let lease = claim_lease(name, &last);
                if status.is_some_and(|s| crate::protocol::names_claim(s, name)) {
                    ctrl.tombstones.bury(&lease, now);
                }
                ctrl.tracker.forget(&lease, now);
            }
            for i in old.pods.difference(&server.pods) {
                if server.stopped.contains(i) {
                    ctrl.tracker.pod_departed(&stopped_pod(*i), now);
                }
            }
        }
        let lock = before.map(|v| v.lock);
        ctrl.view = Some(Server {
            lock: lock.unwrap_or_else(|| server.lock.clone()),
            rv: 0, // partly current
            ..server
        });
    }

    /// When controller `c` will look again by itself.
    pub(super) fn ctrl_deadlines(&self, c: usize) -> Vec<Ms> {
        self.ctrls[c].next_deadline.into_iter().collect()
    }

    /// Whether controller `c`'s caches may differ from the API server (a stale step then
    /// differs from a fresh one): `rv` is the server's only when all of it was synced.
    pub(super) fn stale_differs(&self, c: usize) -> bool {
        let ctrl = &self.ctrls[c];
        ctrl.leads && ctrl.view.as_ref().is_some_and(|v| v.rv != self.server.rv)
    }

    /// One reconcile of the lock by controller `c`, on fresh caches or on what it has:
    /// the shipped turn, on the model's I/O.
    pub(super) fn reconcile(&mut self, c: usize, fresh: bool) {
        if fresh {
            self.sync(c);
            if self.server.leader != c {
                self.ctrls[c].leads = false;
            }
        }
        let ctrl = &self.ctrls[c];
        let Some(lock) = ctrl.view.as_ref().filter(|_| ctrl.leads).and_then(|v| v.lock.clone()) else {
            return;
        };
        self.turn(c, &lock);
    }

    /// The property as a deleted lock is let go: no process granted by it may act.
    pub(super) fn check_let_go(&self, uid: u32) {
        let now = self.now;
        let (first, next) = (super::objects::epoch_floor(uid), super::objects::epoch_floor(uid + 1));
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
}
