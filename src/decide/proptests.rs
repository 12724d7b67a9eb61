//! Property tests: random event sequences against a model of the world, checking the
//! safety and liveness rules after every decision.

use std::collections::BTreeSet;

use proptest::prelude::*;

use super::tests::{Fixture, lock};
use super::*;

pub(super) const PODS: usize = 4;

#[derive(Clone, Debug)]
pub(super) enum Event {
    /// A process in pod i asks for the lock.
    Claim(usize),
    /// The process behind the j-th claim ever made releases (or withdraws) it.
    Release(usize),
    /// The j-th claim stops being renewed and the observer judges it expired.
    Expire(usize),
    /// Someone deletes the j-th claim (a forced release if it holds the lock).
    ForceDelete(usize),
    /// Someone other than its process writes a release mark on the j-th claim.
    ForgeRelease(usize),
    /// Pod i is deleted; with `gc`, garbage collection also removes its claims. With
    /// `graceful`, the kubelet stopped its containers and said so first; without, the
    /// object is force-deleted and its processes may run on.
    PodDies {
        pod: usize,
        gc: bool,
        graceful: bool,
    },
    /// Pod i is replaced by a pod of the same name with a new UID (`graceful` as above).
    PodReplaced {
        pod: usize,
        graceful: bool,
    },
    /// Pod i reaches Succeeded/Failed.
    PodFinishes(usize),
    /// The hold-back delay of the j-th claim elapses (if it is a revoked holder).
    HoldBackElapses(usize),
    SetMaxHolders(i32),
    Decide,
    /// A controller that decided on the k-th status written so far (the current one,
    /// or one a deposed leader still believes) grants its successor directly, before
    /// its status write, which is then lost: the successor starts if it still waits.
    DirectGrant(usize),
    /// The lock is deleted: from now on it is decided on as closing.
    Delete,
    /// A deleted lock is let go, if the finalizer's rule allows (decided on, no holder
    /// and no successor left), and is re-created under the same name: the new lock is
    /// decided on with the claims still there, none of them remembered.
    Recreate,
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        4 => (0..PODS).prop_map(Event::Claim),
        2 => any::<usize>().prop_map(Event::Release),
        1 => any::<usize>().prop_map(Event::Expire),
        1 => any::<usize>().prop_map(Event::ForceDelete),
        1 => any::<usize>().prop_map(Event::ForgeRelease),
        1 => (0..PODS, any::<bool>(), any::<bool>()).prop_map(|(pod, gc, graceful)| Event::PodDies { pod, gc, graceful }),
        1 => (0..PODS, any::<bool>()).prop_map(|(pod, graceful)| Event::PodReplaced { pod, graceful }),
        1 => (0..PODS).prop_map(Event::PodFinishes),
        2 => any::<usize>().prop_map(Event::HoldBackElapses),
        1 => (1..4i32).prop_map(Event::SetMaxHolders),
        5 => Just(Event::Decide),
        2 => any::<usize>().prop_map(Event::DirectGrant),
        1 => Just(Event::Delete),
        1 => Just(Event::Recreate),
    ]
}

/// The model's view of one process that was granted the lock.
#[derive(Clone, Debug)]
struct Process {
    claim: String,
    uid: String,
    /// It has certainly stopped working under the lock.
    stopped: bool,
}

#[derive(Clone)]
pub(super) struct Model {
    f: Fixture,
    /// Every claim name ever made, in arrival order.
    made: Vec<String>,
    /// Pod generation per pod index, for fresh UIDs.
    generation: [u32; PODS],
    granted: Vec<Process>,
    last_token: i64,
    grant_arrivals: Vec<Arrival>,
    /// Every world a decision was made in, oldest first (what stale leaders may hold).
    history: Vec<Fixture>,
    /// Claims whose process has stopped waiting or working by itself (released,
    /// withdrawn, expired, its pod stopped, or its hold-back over): a direct grant
    /// reaching it starts nothing.
    quit: BTreeSet<String>,
}

impl Model {
    pub(super) fn new() -> Self {
        let mut f = lock();
        for i in 0..PODS {
            f.pods.insert(
                pod(i),
                PodView {
                    uid: format!("{}#0", pod(i)),
                    finished: false,
                },
            );
        }
        Model {
            f,
            made: Vec::new(),
            generation: [0; PODS],
            granted: Vec::new(),
            last_token: 0,
            grant_arrivals: Vec::new(),
            history: Vec::new(),
            quit: BTreeSet::new(),
        }
    }

    fn nth(&self, j: usize) -> Option<String> {
        (!self.made.is_empty()).then(|| self.made[j % self.made.len()].clone())
    }

    fn stop_where(&mut self, pred: impl Fn(&Process) -> bool) {
        self.granted
            .iter_mut()
            .filter(|p| pred(p))
            .for_each(|p| p.stopped = true);
    }

    /// The processes of every claim made in a pod with UID `uid` have stopped.
    fn quit_pod(&mut self, uid: &str) {
        let gone = self
            .f
            .claims
            .iter()
            .filter(|c| c.pod_uid == uid)
            .map(|c| c.name.clone());
        self.quit.extend(gone);
        self.stop_where(|p| p.uid == uid);
    }

    /// The process of claim `claim` may still run (as a waiter or a holder).
    fn may_run(&self, claim: &str) -> bool {
        !self.quit.contains(claim)
    }

    /// A direct grant from a decision on the k-th world decided in so far, or on the
    /// world as it is now (its write lost).
    fn direct_grant(&mut self, k: usize) {
        let k = k % (self.history.len() + 1);
        let snapshot = self.history.get(k).unwrap_or(&self.f).clone();
        let Some(successor) = snapshot.status.successor.clone() else {
            return;
        };
        let d = snapshot.decide();
        let direct = d
            .actions
            .iter()
            .any(|a| a.kind == ActionKind::Granted(successor.fencing_token) && a.claim == successor.claim);
        if !direct || !self.may_run(&successor.claim) || self.granted.iter().any(|p| p.claim == successor.claim) {
            return;
        }
        let Some(w) = snapshot.status.queue.iter().find(|w| w.claim == successor.claim) else {
            panic!("a successor that is not queued was granted");
        };
        self.granted.push(Process {
            claim: w.claim.clone(),
            uid: w.pod_uid.clone(),
            stopped: false,
        });
        let max = self.f.spec.max_holders.max(snapshot.spec.max_holders) as usize;
        let running = self.granted.iter().filter(|p| !p.stopped).count();
        assert!(
            running <= max,
            "a direct grant makes {running} processes run under a lock of {max}: {:?}",
            self.granted
        );
    }

    pub(super) fn apply(&mut self, e: &Event) {
        match *e {
            Event::Claim(i) => {
                let name = format!("c{}", self.made.len());
                let Some(p) = self.f.pods.get(&pod(i)) else { return };
                let uid = p.uid.clone();
                self.f.claims.push(ClaimView {
                    name: name.clone(),
                    pod: pod(i),
                    pod_uid: uid,
                    arrival: Arrival {
                        created_secs: super::tests::MADE_AT_SECS,
                        requested_micros: 0,
                        seen_seq: self.made.len() as u64,
                    },
                    released: false,
                    forged: false,
                    release_hash: None,
                    wait_hash: None,
                    stamped_token: None,
                    expired: false,
                    lease_seconds: 15,
                });
                self.made.push(name);
            }
            Event::Release(j) | Event::Expire(j) => {
                let Some(name) = self.nth(j) else { return };
                if let Some(c) = self.f.claims.iter_mut().find(|c| c.name == name) {
                    // Releasing: the process stopped first. Expiry: by the client
                    // contract its process stopped before the observer could judge so.
                    if matches!(e, Event::Release(_)) {
                        c.released = true
                    } else {
                        c.expired = true
                    }
                    self.quit.insert(name.clone());
                    self.stop_where(|p| p.claim == name);
                }
            }
            Event::ForgeRelease(j) => {
                let Some(name) = self.nth(j) else { return };
                if let Some(c) = self.f.claims.iter_mut().find(|c| c.name == name) {
                    c.forged = true; // its process runs on, unaware
                }
            }
            Event::ForceDelete(j) => {
                let Some(name) = self.nth(j) else { return };
                self.f.claims.retain(|c| c.name != name);
            }
            Event::PodDies { pod: i, gc, graceful } => {
                let Some(gone) = self.f.pods.remove(&pod(i)) else {
                    return;
                };
                if gc {
                    self.f.claims.retain(|c| c.pod != pod(i));
                }
                if graceful {
                    self.f.stopped.insert(gone.uid.clone());
                    self.quit_pod(&gone.uid);
                }
            }
            Event::PodReplaced { pod: i, graceful } => {
                if let Some(old) = self.f.pods.get(&pod(i)).cloned()
                    && graceful
                {
                    self.f.stopped.insert(old.uid.clone());
                    self.quit_pod(&old.uid);
                }
                self.generation[i] += 1;
                self.f.pods.insert(
                    pod(i),
                    PodView {
                        uid: format!("{}#{}", pod(i), self.generation[i]),
                        finished: false,
                    },
                );
            }
            Event::PodFinishes(i) => {
                if let Some(p) = self.f.pods.get_mut(&pod(i)) {
                    p.finished = true;
                    let uid = p.uid.clone();
                    self.quit_pod(&uid);
                }
            }
            Event::HoldBackElapses(j) => {
                let Some(name) = self.nth(j) else { return };
                // The observer's delay only runs for a holder it has marked revoked; by
                // the client contract that process has stopped when it elapses.
                let revoked = self
                    .f
                    .status
                    .holders
                    .iter()
                    .any(|h| h.claim == name && h.revoked.is_some());
                if revoked {
                    self.f.elapsed.insert(name.clone());
                    self.quit.insert(name.clone());
                    self.stop_where(|p| p.claim == name);
                    // A claim still there (a holder or successor a deleted lock
                    // revoked) is given up by its client with a valid release as it
                    // stops, or, never granted, as it sees its claim held back.
                    if let Some(c) = self.f.claims.iter_mut().find(|c| c.name == name) {
                        c.released = true;
                    }
                }
            }
            Event::SetMaxHolders(n) => self.f.spec.max_holders = n,
            Event::Decide => self.decide_and_check(),
            Event::DirectGrant(k) => self.direct_grant(k),
            Event::Delete => self.f.closing = true,
            Event::Recreate => self.recreate(),
        }
    }

    /// The finalizer lets the deleted lock go once a decision left it no holder and no
    /// successor; the lock is re-created, and its first decision knows nothing of the
    /// old one (any claim may be gone by then, e.g. with its force-deleted pod): a
    /// process of the old lock still running would show as a freed slot.
    fn recreate(&mut self) {
        if !self.f.closing {
            return;
        }
        self.decide_and_check();
        if occupied(&self.f.status) {
            return; // the finalizer waits
        }
        let status = std::mem::take(&mut self.f.status);
        // The new lock's epoch: the clock, above every token issued so far.
        self.f.token_floor = status.fencing_token + 1_000;
        self.f.elapsed.clear();
        self.f.closing = false;
        self.decide_and_check();
    }

    fn decide_and_check(&mut self) {
        let before = self.f.status.clone();
        self.history.push(self.f.clone());
        let d = self.f.decide();
        let max = self.f.spec.max_holders as usize;

        // Tokens never go backwards; every grant's token exceeds all earlier ones.
        assert!(d.status.fencing_token >= before.fencing_token, "token went backwards");
        for a in &d.actions {
            if let ActionKind::Granted(token) = a.kind {
                let claim = &a.claim;
                let direct = before
                    .successor
                    .as_ref()
                    .is_some_and(|s| &s.claim == claim && s.fencing_token == token);
                assert!(token > self.last_token, "token {token} not above {}", self.last_token);
                self.last_token = token;
                let c = self
                    .f
                    .claims
                    .iter()
                    .find(|c| &c.name == claim)
                    .expect("granted a claim that is not there");
                self.grant_arrivals.push(c.arrival);
                if direct && self.granted.iter().any(|p| &p.claim == claim) {
                    continue; // its direct grant, now written: the same grant, not a new process
                }
                self.granted.push(Process {
                    claim: claim.clone(),
                    uid: c.pod_uid.clone(),
                    stopped: false,
                });
                // Mutual exclusion against processes that may still run, not just status.
                let running = self.granted.iter().filter(|p| !p.stopped).count();
                assert!(
                    running <= max,
                    "{running} processes may run under a lock of {max}: {:?}",
                    self.granted
                );
            }
        }
        // Occupied slots (revoked-but-held-back included) never exceed maxHolders
        // because of a grant.
        let grants = d
            .actions
            .iter()
            .filter(|a| matches!(a.kind, ActionKind::Granted(_)))
            .count();
        if grants > 0 {
            assert!(!self.f.closing, "a closing lock granted");
            assert!(d.status.holders.len() <= max, "granted past maxHolders");
        }
        // A force-released holder whose process may still run keeps its slot.
        // A successor told of its grant, not yet listed as a holder, stays the successor.
        for p in self.granted.iter().filter(|p| !p.stopped) {
            let successor = d.status.successor.as_ref().is_some_and(|s| s.claim == p.claim);
            assert!(
                d.status.holders.iter().any(|h| h.claim == p.claim) || successor,
                "slot of running {} was freed",
                p.claim
            );
        }
        // The successor is the head of the queue, designated only while every slot is
        // taken, with a token above every grant's; a closing lock designates no one.
        if let Some(s) = &d.status.successor {
            assert_eq!(d.status.queue.first().map(|w| &w.claim), Some(&s.claim));
            assert!(!self.f.closing, "designated while closing");
            assert!(d.status.holders.len() >= max, "designated with a slot free");
            assert!(d.status.holders.iter().all(|h| h.fencing_token < s.fencing_token));
            assert!(s.fencing_token <= d.status.fencing_token);
        } else {
            assert!(d.status.queue.is_empty() || self.f.closing, "waiters but no successor");
        }
        // Grants in arrival order.
        assert!(
            self.grant_arrivals.windows(2).all(|w| w[0] < w[1]),
            "grants out of arrival order"
        );
        // The queue itself stays in arrival order.
        let arrival = |name: &str| self.f.claims.iter().find(|c| c.name == name).map(|c| c.arrival);
        let q: Vec<_> = d.status.queue.iter().map(|w| arrival(&w.claim)).collect();
        assert!(q.windows(2).all(|w| w[0] < w[1]), "queue out of arrival order");
        // No live waiter is lost.
        for c in &self.f.claims {
            let live = self
                .f
                .pods
                .get(&c.pod)
                .is_some_and(|p| p.uid == c.pod_uid && !p.finished);
            if live && !c.released && !c.expired && !c.forged {
                let held = d.status.holders.iter().any(|h| h.claim == c.name);
                let queued = d.status.queue.iter().any(|w| w.claim == c.name);
                assert!(held || queued, "live claim {} lost", c.name);
            }
        }
        assert_eq!(d.status.queue_length as usize, d.status.queue.len());
        // Idempotence: the same observation decided again changes nothing.
        self.f.status = d.status.clone();
        let again = self.f.decide();
        assert!(again.actions.is_empty(), "second decide acted: {:?}", again.actions);
        assert_eq!(again.status, d.status, "second decide changed status");
        // The observer deletes what decide asked it to; the claims then vanish.
        self.f.claims.retain(|c| !d.delete_claims.contains(&c.name));
    }
}

impl Model {
    /// Every event that can change this model, within `pods` pods, `claims` claims and
    /// lock sizes up to `max_holders` (what the exhaustive explorer tries in each state).
    pub(super) fn enabled(&self, pods: usize, claims: usize, max_holders: i32) -> Vec<Event> {
        let mut out = vec![Event::Decide];
        if self.made.len() < claims {
            out.extend(
                (0..pods)
                    .filter(|i| self.f.pods.contains_key(&pod(*i)))
                    .map(Event::Claim),
            );
        }
        for (j, name) in self.made.iter().enumerate() {
            let Some(c) = self.f.claims.iter().find(|c| &c.name == name) else {
                continue; // deleted: events on it change nothing
            };
            if !c.released && !c.expired {
                out.extend([Event::Release(j), Event::Expire(j)]);
            }
            if !c.forged {
                out.push(Event::ForgeRelease(j));
            }
            out.push(Event::ForceDelete(j));
            let revoked = self
                .f
                .status
                .holders
                .iter()
                .any(|h| &h.claim == name && h.revoked.is_some());
            if revoked && !self.f.elapsed.contains(name) {
                out.push(Event::HoldBackElapses(j));
            }
        }
        for i in (0..pods).filter(|i| self.f.pods.contains_key(&pod(*i))) {
            for (gc, graceful) in [(false, false), (false, true), (true, false), (true, true)] {
                out.push(Event::PodDies { pod: i, gc, graceful });
            }
            out.extend([false, true].map(|graceful| Event::PodReplaced { pod: i, graceful }));
            if !self.f.pods[&pod(i)].finished {
                out.push(Event::PodFinishes(i));
            }
        }
        out.extend(
            (1..=max_holders)
                .filter(|n| *n != self.f.spec.max_holders)
                .map(Event::SetMaxHolders),
        );
        // A direct grant from each distinct world decided in so far, and from now.
        let mut seen = BTreeSet::new();
        for (k, w) in self.history.iter().enumerate() {
            if w.status.successor.is_some() && seen.insert(format!("{w:?}")) {
                out.push(Event::DirectGrant(k));
            }
        }
        if self.f.status.successor.is_some() {
            out.push(Event::DirectGrant(self.history.len()));
        }
        if self.f.closing {
            out.push(Event::Recreate);
        } else {
            out.push(Event::Delete);
        }
        out
    }

    /// What the model's future depends on, as one string: two models with the same key
    /// behave alike under every sequence of events (the worlds decided in so far count as
    /// a set, for a direct grant may come from any of them; of the grants' arrivals only
    /// the last, which the next grant's must exceed).
    pub(super) fn key(&self) -> String {
        let history: BTreeSet<String> = self.history.iter().map(|w| format!("{w:?}")).collect();
        format!(
            "{:?}|{:?}|{:?}|{:?}|{}|{:?}|{:?}|{:?}",
            self.f,
            self.made,
            self.generation,
            self.granted,
            self.last_token,
            self.grant_arrivals.last(),
            self.quit,
            history
        )
    }
}

pub(super) fn pod(i: usize) -> String {
    format!("p{i}")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4000, ..ProptestConfig::default() })]

    #[test]
    fn random_histories_keep_every_rule(events in proptest::collection::vec(event(), 1..80)) {
        let mut m = Model::new();
        for e in &events {
            m.apply(e);
        }
        m.apply(&Event::Decide);
    }
}
