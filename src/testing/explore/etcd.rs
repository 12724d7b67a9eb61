//! The etcd backend's model: etcd (keys, revisions, leases), pods, processes, time and
//! the controller that ships, driven by random events and walked exhaustively within a
//! bound. The controller plans with the real rules ([`crate::etcd::rules::mirror`]) on
//! what its mirror and pod cache last saw (both may lag) and takes keys away with the
//! real orchestration ([`crate::controller::etcd::revoke::take_away`]) against the model's etcd and pod
//! API. Checked after each step: no more processes act as holders than `maxHolders`
//! allows; the controller never deletes a key whose process may run, never revokes a
//! claim as its pod gone or replaced while that pod is there, and never makes a key up;
//! no held-back key's controller lease runs out while its process may act, whatever the
//! lock's lease was when the claim was made and is now.

use std::collections::BTreeMap;
use std::sync::Mutex;

use k8s_openapi::jiff::Timestamp;
use proptest::prelude::*;

use crate::api::RevokeReason;
use crate::controller::etcd::revoke::{KeyIo, take_away};
use crate::decide::{PodView, StoppedPods};
use crate::etcd::Error;
use crate::etcd::keys::ClaimValue;
use crate::etcd::rules::tests::{key, spec_with};
use crate::etcd::rules::{KeyView, holds, mirror};
use crate::mutant::Mutant;

const PODS: usize = 3;

#[derive(Clone, Debug)]
enum Event {
    /// A process in pod i creates a claim key.
    Claim(usize),
    /// Every running process re-reads its place (as a woken waiter does).
    Check,
    /// The process of the j-th claim releases: stops, and revokes its own lease.
    Release(usize),
    /// Pod i goes: `graceful`, its processes stopped first (and the kubelet said so);
    /// else force-deleted, its processes run on.
    PodGone { pod: usize, graceful: bool },
    /// The process of the j-th claim notices its key moved or gone, and stops.
    Notices(usize),
    /// A held-back key's controller lease runs out, once its TTL has passed; its process
    /// must have stopped by then.
    HoldBackEnds(usize),
    /// The process of the j-th claim renews: its key still on its own lease (checked
    /// first), its lease kept alive; it may act a claim lease from now.
    Renew(usize),
    /// Time jumps to the next deadline (a process's last moment to act, a held-back
    /// key's expiry); a process whose renewals ran out stops (its client's rule).
    Tick,
    /// The lock's lease is lowered from [`HIGH_LEASE`] to [`LOW_LEASE`] (claims made
    /// before keep the lease they were made with).
    LowerLease,
    /// The controller's mirror catches up with etcd's keys.
    MirrorSees,
    /// The controller's pod cache catches up with the pods.
    CacheSees,
    /// The controller's turn: the rules on its mirror and cache, then the shipped
    /// orchestration against etcd and the pod API.
    Controller,
    /// The controller's turn, each key it moves landing [`PUT_DELAY`] seconds after the
    /// lease it moves the key onto was granted (a slow disk; the key's process renewed
    /// meanwhile, as late as the move).
    SlowController,
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        3 => (0..PODS).prop_map(Event::Claim),
        4 => Just(Event::Check),
        2 => any::<usize>().prop_map(Event::Release),
        1 => (0..PODS, any::<bool>()).prop_map(|(pod, graceful)| Event::PodGone { pod, graceful }),
        1 => any::<usize>().prop_map(Event::Notices),
        1 => any::<usize>().prop_map(Event::HoldBackEnds),
        3 => Just(Event::Controller),
        1 => Just(Event::SlowController),
        3 => Just(Event::MirrorSees),
        3 => Just(Event::CacheSees),
        2 => any::<usize>().prop_map(Event::Renew),
        3 => Just(Event::Tick),
        1 => Just(Event::LowerLease),
    ]
}

#[derive(Clone, Debug, Default)]
struct Process {
    claim: String,
    uid: String,
    /// The etcd lease its key was made on.
    lease: i64,
    running: bool,
    holding: bool,
    /// Until when it may act without another renewal.
    until: i64,
}

/// How long after its lease's grant a slow controller's move lands, in seconds: past
/// the 2 s grace the hold-back's TTL has beyond the lease.
const PUT_DELAY: i64 = 3;

/// The lock's lease before and after [`Event::LowerLease`], in seconds.
const HIGH_LEASE: i32 = 4;
const LOW_LEASE: i32 = 1;

#[derive(Clone, Debug, Default)]
struct Model {
    revision: i64,
    keys: Vec<KeyView>,
    procs: Vec<Process>,
    /// Pod i's current UID, or None while it is gone.
    pods: [Option<String>; PODS],
    stopped: StoppedPods,
    incarnation: usize,
    /// Seconds since the start.
    now: i64,
    /// The lock's lease was lowered.
    lowered: bool,
    /// The controller's leases: when each runs out.
    leases: BTreeMap<i64, i64>,
    /// The controller's leases' TTLs.
    ttls: BTreeMap<i64, i64>,
    /// How long before now the leases of the controller's turn were granted.
    put_delay: i64,
    /// How many leases the controller was granted (their IDs count down from -1).
    granted: i64,
    /// The keys as the controller's mirror last saw them.
    mirror: Vec<KeyView>,
    /// The pods as the controller's pod cache last saw them.
    cache: [Option<String>; PODS],
}

impl Model {
    /// The next moment something is due: a running process's last moment to act, or a
    /// controller lease's end.
    fn next_deadline(&self) -> Option<i64> {
        let acting = self.procs.iter().filter(|p| p.running).map(|p| p.until);
        acting
            .chain(self.leases.values().copied())
            .filter(|t| *t > self.now)
            .min()
    }

    fn lease(&self) -> i32 {
        if self.lowered { LOW_LEASE } else { HIGH_LEASE }
    }

    /// Whether key `k` is on a controller lease that has run out.
    fn due(&self, k: &KeyView) -> bool {
        self.leases.get(&k.lease).is_some_and(|at| *at <= self.now)
    }

    fn step(&mut self, e: &Event, max_holders: i32) {
        match *e {
            Event::Claim(pod) => self.claim(pod),
            Event::Check => self.check(max_holders),
            Event::Release(j) => {
                let n = self.procs.len().max(1);
                let Some(p) = self.procs.get_mut(j % n) else { return };
                if !p.running {
                    return;
                }
                p.running = false;
                let lease = p.lease;
                self.revoke(lease); // its key goes only while it is still on that lease
            }
            Event::PodGone { pod, graceful } => {
                let Some(uid) = self.pods[pod].take() else { return };
                self.incarnation += 1;
                if graceful {
                    for p in self.procs.iter_mut().filter(|p| p.uid == uid) {
                        p.running = false; // its key stays until its lease ends or the controller acts
                    }
                    self.stopped.insert(uid);
                }
            }
            Event::Notices(j) => {
                let n = self.procs.len().max(1);
                let Some(p) = self.procs.get(j % n) else { return };
                if !self.keys.iter().any(|k| k.claim == p.claim && k.lease == p.lease) {
                    self.procs[j % n].running = false;
                }
            }
            Event::HoldBackEnds(j) => {
                let Some(k) = self.keys.get(j % self.keys.len().max(1)) else {
                    return;
                };
                if self.due(k) {
                    let (claim, lease) = (k.claim.clone(), k.lease);
                    let acting = self.procs.iter().find(|p| p.claim == claim && p.running);
                    assert!(
                        acting.is_none(),
                        "the held-back key of {claim} went at {}s while its process may act until {}s",
                        self.now,
                        acting.map_or(0, |p| p.until)
                    );
                    self.revoke(lease);
                }
            }
            Event::Renew(j) => {
                let n = self.procs.len().max(1);
                let Some(p) = self.procs.get(j % n) else { return };
                let on_own_lease = |k: &&KeyView| k.claim == p.claim && k.lease == p.lease;
                let Some(k) = self.keys.iter().find(on_own_lease) else {
                    return;
                };
                let lease = k.value.as_ref().map_or(0, |v| v.lease_seconds);
                if p.running {
                    self.procs[j % n].until = self.now + i64::from(lease);
                }
            }
            Event::Tick => {
                let Some(next) = self.next_deadline() else { return };
                self.now = next;
                let now = self.now;
                for p in self.procs.iter_mut().filter(|p| p.until <= now) {
                    p.running = false;
                }
            }
            Event::LowerLease => self.lowered = true,
            Event::MirrorSees => self.mirror = self.keys.clone(),
            Event::CacheSees => self.cache = self.pods.clone(),
            Event::Controller => self.controller(max_holders),
            Event::SlowController => {
                self.put_delay = PUT_DELAY;
                self.controller(max_holders);
                self.put_delay = 0;
            }
        }
    }

    fn claim(&mut self, pod: usize) {
        let uid = self.pods[pod]
            .get_or_insert_with(|| format!("u{pod}-{}", self.incarnation))
            .clone();
        self.revision += 1;
        let claim = format!("c{}", self.revision);
        let mut k = key(&claim, self.revision, &format!("p{pod}"));
        let value = k.value.as_mut().expect("a claim value");
        (value.pod_uid, value.lease_seconds) = (uid.clone(), self.lease());
        self.procs.push(Process {
            claim,
            uid,
            lease: k.lease,
            running: true,
            holding: false,
            until: self.now + i64::from(self.lease()),
        });
        self.keys.push(k);
    }

    /// Every running waiter reads its place: it holds when its key is on its own lease
    /// with fewer than `max_holders` keys ahead.
    fn check(&mut self, max_holders: i32) {
        for p in self.procs.iter_mut().filter(|p| p.running && !p.holding) {
            let Some(mine) = self.keys.iter().find(|k| k.claim == p.claim) else {
                continue;
            };
            if mine.lease != p.lease {
                continue; // not on its own lease any more: the check fails
            }
            let ahead = self
                .keys
                .iter()
                .filter(|k| k.create_revision < mine.create_revision)
                .count();
            p.holding = holds(ahead as i64, max_holders);
        }
    }

    /// etcd revokes `lease`: its keys go with it.
    fn revoke(&mut self, lease: i64) {
        self.keys.retain(|k| k.lease != lease);
        self.leases.remove(&lease);
        self.ttls.remove(&lease);
    }

    /// The controller's turn: plan on the mirror and the pod cache, then take keys away
    /// as the shipped controller does, against the model's etcd and pods.
    fn controller(&mut self, max_holders: i32) {
        let cache = self.cache.iter().enumerate().filter_map(|(i, uid)| {
            let view = PodView {
                uid: uid.clone()?,
                finished: false,
            };
            Some((format!("p{i}"), view))
        });
        let plan = mirror(
            &self.mirror,
            &spec_with(max_holders, self.lease()),
            &Default::default(),
            &cache.collect(),
            &self.stopped,
            Timestamp::now(),
        );
        let io = ModelIo(Mutex::new(self));
        let taken = futures::executor::block_on(take_away(&io, plan.actions));
        assert!(taken.failed.is_none(), "the model's etcd answers");
    }

    fn check_safety(&self, max_holders: i32) {
        let acting = self.procs.iter().filter(|p| p.running && p.holding).count();
        assert!(
            acting <= max_holders as usize,
            "{acting} processes act as holders, at most {max_holders} may: {self:#?}"
        );
    }
}

/// The controller's I/O on the model: its etcd and pod API, the properties checked as
/// each write lands.
struct ModelIo<'a>(Mutex<&'a mut Model>);

impl<'a> ModelIo<'a> {
    fn model(&self) -> std::sync::MutexGuard<'_, &'a mut Model> {
        self.0.lock().expect("the model's lock")
    }
}

impl KeyIo for ModelIo<'_> {
    async fn pod_uid(&self, pod: &str) -> Result<Option<String>, String> {
        let i: usize = pod.trim_start_matches('p').parse().map_err(|_| "no such pod")?;
        Ok(self.model().pods[i].clone())
    }

    async fn grant_lease(&self, _key: &str, ttl_seconds: i64) -> Result<i64, Error> {
        let mut m = self.model();
        m.granted += 1;
        let id = -m.granted;
        let at = m.now - m.put_delay + ttl_seconds;
        m.leases.insert(id, at);
        m.ttls.insert(id, ttl_seconds);
        Ok(id)
    }

    async fn keep_alive(&self, _key: &str, id: i64) -> Result<(), Error> {
        let mut m = self.model();
        let now = m.now;
        if let Some(ttl) = m.ttls.get(&id).copied()
            && let Some(at) = m.leases.get_mut(&id)
        {
            *at = now + ttl;
        }
        Ok(())
    }

    async fn revoke_lease(&self, _key: &str, id: i64) -> Result<(), Error> {
        self.model().revoke(id);
        Ok(())
    }

    async fn delete(&self, key: &str, if_revision: Option<i64>) -> Result<bool, Error> {
        let mut m = self.model();
        let Some(at) = m.keys.iter().position(|k| k.key == key) else {
            return Ok(false);
        };
        if if_revision.is_some_and(|rev| rev != m.keys[at].mod_revision) {
            return Ok(false);
        }
        let claim = m.keys[at].claim.clone();
        let may_run = m.procs.iter().any(|p| p.claim == claim && p.running);
        assert!(!may_run, "deleted the key of {claim}, whose process may run");
        m.keys.remove(at);
        Ok(true)
    }

    async fn put(&self, key: &str, if_revision: Option<i64>, value: &ClaimValue, lease: i64) -> Result<bool, Error> {
        let mut m = self.model();
        let m = &mut **m;
        let at = m.keys.iter().position(|k| k.key == key);
        if at.is_none_or(|i| if_revision.is_some_and(|rev| rev != m.keys[i].mod_revision)) {
            assert!(
                at.is_some() || if_revision.is_some(),
                "the controller made up key {key}, gone before its write"
            );
            return Ok(false);
        }
        let on_cache_word = matches!(value.held_back, Some(RevokeReason::PodGone | RevokeReason::PodReplaced));
        let i: usize = value.pod.trim_start_matches('p').parse().unwrap_or(PODS);
        let there = m
            .pods
            .get(i)
            .is_some_and(|uid| uid.as_deref() == Some(value.pod_uid.as_str()));
        assert!(
            !(on_cache_word && there),
            "revoked the claim at {key} as its pod gone or replaced, while pod {} is there",
            value.pod
        );
        m.revision += 1;
        let k = &mut m.keys[at.expect("checked")];
        (k.value, k.mod_revision, k.lease) = (Some(value.clone()), m.revision, lease);
        Ok(true)
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]
    #[test]
    fn never_more_acting_holders_than_slots_and_no_key_of_a_running_process_deleted(
        max_holders in 1..3i32,
        events in prop::collection::vec(event(), 1..60),
    ) {
        let mut m = Model::default();
        for e in &events {
            m.step(e, max_holders);
            m.check_safety(max_holders);
        }
        // Liveness: once every process has stopped and the controller (caught up) and
        // the held-back leases have had their turn, no key is left to block the lock.
        for p in m.procs.iter_mut() { p.running = false; }
        for i in 0..PODS { m.step(&Event::PodGone { pod: i, graceful: false }, max_holders); }
        for e in [Event::MirrorSees, Event::CacheSees, Event::Controller] { m.step(&e, max_holders); }
        loop {
            while let Some(j) = m.keys.iter().position(|k| m.due(k)) {
                m.step(&Event::HoldBackEnds(j), max_holders);
            }
            if m.next_deadline().is_none() { break; }
            m.step(&Event::Tick, max_holders);
        }
        prop_assert!(m.keys.is_empty(), "keys left behind: {:?}", m.keys);
    }
}

/// The same model within a bound (this many claims made at most, `maxHolders`), as a
/// machine the exhaustive explorer walks: every sequence of events, not a sample.
#[derive(Clone)]
struct Bounded(Model, usize, i32);

impl crate::testing::bfs::Machine for Bounded {
    type Step = Event;
    fn steps(&self) -> Vec<Event> {
        let Bounded(m, claims, _) = self;
        let mut out = vec![Event::Check, Event::Controller, Event::SlowController];
        if m.mirror != m.keys {
            out.push(Event::MirrorSees);
        }
        if m.cache != m.pods {
            out.push(Event::CacheSees);
        }
        if m.procs.len() < *claims {
            out.extend((0..PODS).map(Event::Claim)); // a pod gone comes back
        }
        out.extend((0..m.procs.len()).flat_map(|j| [Event::Release(j), Event::Notices(j)]));
        let gone = |graceful| {
            (0..PODS)
                .filter(|i| m.pods[*i].is_some())
                .map(move |pod| Event::PodGone { pod, graceful })
        };
        out.extend(gone(true).chain(gone(false)));
        out.extend(
            (0..m.keys.len())
                .filter(|j| m.due(&m.keys[*j]))
                .map(Event::HoldBackEnds),
        );
        out.extend((0..m.procs.len()).filter(|j| m.procs[*j].running).map(Event::Renew));
        if m.next_deadline().is_some() {
            out.push(Event::Tick);
        }
        if !m.lowered {
            out.push(Event::LowerLease);
        }
        out
    }
    fn take(&mut self, e: &Event) {
        self.0.step(e, self.2);
        self.0.check_safety(self.2);
    }
    fn key(&self) -> String {
        format!("{:?}", self.0)
    }
}

#[test]
fn every_interleaving_within_the_bound_keeps_the_etcd_rules() {
    // Depth 8 for a mutex (the old model's bound, which had no lag); a semaphore's
    // branching costs more, so 7 there.
    for (claims, max_holders, depth) in [(3, 1, 8), (3, 2, 7)] {
        let start = Bounded(Model::default(), claims, max_holders);
        let covered = crate::testing::bfs::explore(start, depth).unwrap_or_else(|found| panic!("{found}"));
        println!("etcd model, {claims} claims, maxHolders {max_holders}, depth {depth}: {covered:?}");
        assert!(covered.states > 1000, "the bound explores too little: {covered:?}");
    }
}

/// The bugs of the etcd backend put back, each in the code that ships: the rules (a pod
/// object gone taken for its process stopped; a held-back key kept by the lock's lease
/// alone, short once the lock's lease is lowered below the claim's) and the controller's
/// orchestration (a hold-back on the pod cache's word; a Txn without the key's mod
/// revision; the client's lease revoked before the key is moved; a moved key's lease
/// not kept alive, its TTL counted from a grant the move landed long after). Each is
/// found.
#[test]
fn the_etcd_model_finds_each_bug_put_back_with_its_trace() {
    use Mutant::{
        EtcdClientLeaseRevokedFirst, EtcdHoldBackWithoutFreshRead, EtcdNoKeepAliveAfterMove, EtcdWriteWithoutRevision,
        HoldBackBySpecLease, PodGoneAsStopped,
    };
    for (bug, depth, broke) in [
        (PodGoneAsStopped, 10, "whose process may run"),
        (HoldBackBySpecLease, 10, "while its process may act"),
        (EtcdHoldBackWithoutFreshRead, 10, "while pod p0 is there"),
        (EtcdWriteWithoutRevision, 10, "the controller made up key"),
        (EtcdClientLeaseRevokedFirst, 10, "processes act as holders"),
        (EtcdNoKeepAliveAfterMove, 10, "while its process may act"),
    ] {
        let _on = crate::mutant::mutate(bug);
        let found = crate::testing::bfs::explore(Bounded(Model::default(), 3, 1), depth);
        let found = found.expect_err("put back and not found");
        assert!(found.trace.starts_with("   1. "), "{bug:?}: no trace in {found}");
        assert!(found.why.contains(broke), "{bug:?} broke another rule: {found}");
        println!("etcd model, {bug:?} found:\n{found}");
    }
}
