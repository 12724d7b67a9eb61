//! The etcd rules: examples, then a model of etcd, pods, processes and time driven by
//! random events, checking after each step that no more processes act as holders than
//! `maxHolders` allows, that the controller never deletes a key whose process may run,
//! and that no held-back key's controller lease runs out while its process may act,
//! whatever the lock's lease was when the claim was made and is now.

use proptest::prelude::*;

use super::*;

const LOCK_LEASE: i32 = 10;

fn spec(max_holders: i32) -> DistributedLockSpec {
    spec_with(max_holders, LOCK_LEASE)
}

fn spec_with(max_holders: i32, lease: i32) -> DistributedLockSpec {
    DistributedLockSpec {
        lease_duration_seconds: lease,
        max_holders,
        backend: None,
        max_queue: None,
    }
}

fn key(claim: &str, rev: i64, pod: &str) -> KeyView {
    KeyView {
        key: format!("/leasehold/ns/l/{claim}"),
        claim: claim.into(),
        create_revision: rev,
        mod_revision: rev,
        lease: rev * 100,
        value: Some(ClaimValue {
            pod: pod.into(),
            pod_uid: format!("uid-{pod}"),
            lease_seconds: 5,
            held_back: None,
        }),
    }
}

fn pods(names: &[&str]) -> BTreeMap<String, PodView> {
    names
        .iter()
        .map(|p| {
            let view = PodView {
                uid: format!("uid-{p}"),
                finished: false,
            };
            (p.to_string(), view)
        })
        .collect()
}

#[test]
fn the_first_keys_by_create_revision_hold_with_their_revision_as_token() {
    let keys = [key("c", 30, "c"), key("a", 10, "a"), key("b", 20, "b")];
    let m = mirror(
        &keys,
        &spec(2),
        &Default::default(),
        &pods(&["a", "b", "c"]),
        &Default::default(),
        Timestamp::now(),
    );
    let holders: Vec<_> = m
        .status
        .holders
        .iter()
        .map(|h| (h.claim.as_str(), h.fencing_token))
        .collect();
    assert_eq!(holders, [("a", 10), ("b", 20)]);
    assert_eq!(
        m.status.queue.iter().map(|w| w.claim.as_str()).collect::<Vec<_>>(),
        ["c"]
    );
    assert_eq!((m.status.queue_length, m.status.fencing_token), (1, 20));
    assert!(m.actions.is_empty(), "all pods live: {:?}", m.actions);
}

#[test]
fn the_token_high_water_mark_never_goes_back() {
    let prev = DistributedLockStatus {
        fencing_token: 99,
        ..Default::default()
    };
    let m = mirror(
        &[key("a", 10, "a")],
        &spec(1),
        &prev,
        &pods(&["a"]),
        &Default::default(),
        Timestamp::now(),
    );
    assert_eq!(m.status.fencing_token, 99);
}

#[test]
fn a_force_deleted_pod_s_key_is_held_back_in_place_and_a_stopped_one_deleted() {
    let keys = [key("a", 10, "a"), key("b", 20, "b"), key("c", 30, "c")];
    // a: force-deleted (no word from the kubelet); b: deleted after its containers stopped.
    let stopped = ["uid-b".to_string()].into_iter().collect();
    let m = mirror(
        &keys,
        &spec(1),
        &Default::default(),
        &pods(&["c"]),
        &stopped,
        Timestamp::now(),
    );
    let [
        KeyAction::HoldBack {
            claim,
            ttl_seconds,
            value,
            client_lease,
            ..
        },
        KeyAction::Delete {
            claim: deleted, reason, ..
        },
    ] = m.actions.as_slice()
    else {
        panic!("expected a hold-back and a delete: {:?}", m.actions)
    };
    assert_eq!((claim.as_str(), *client_lease), ("a", 1000));
    assert_eq!(value.held_back, Some(RevokeReason::PodGone));
    assert!(
        *ttl_seconds >= i64::from(LOCK_LEASE),
        "held back for at least the lock's lease"
    );
    assert_eq!((deleted.as_str(), *reason), ("b", RevokeReason::PodGone));
}

#[test]
fn a_held_back_key_shows_as_revoked_and_goes_at_once_when_its_pod_is_known_stopped() {
    let mut a = key("a", 10, "a");
    a.value.as_mut().unwrap().held_back = Some(RevokeReason::PodGone);
    let m = mirror(
        &[a.clone()],
        &spec(1),
        &Default::default(),
        &pods(&[]),
        &Default::default(),
        Timestamp::now(),
    );
    assert!(m.actions.is_empty(), "it waits for its lease: {:?}", m.actions);
    assert_eq!(
        m.status.holders[0].revoked.as_ref().map(|r| r.reason),
        Some(RevokeReason::PodGone)
    );
    let stopped = ["uid-a".to_string()].into_iter().collect();
    let m = mirror(
        &[a],
        &spec(1),
        &Default::default(),
        &pods(&[]),
        &stopped,
        Timestamp::now(),
    );
    assert!(matches!(m.actions.as_slice(), [KeyAction::Delete { .. }]));
}

#[test]
fn a_key_that_is_no_claim_is_reported_and_held_back_so_it_cannot_block_for_ever() {
    let mut junk = key("junk", 5, "x");
    junk.value = None;
    let m = mirror(
        &[junk],
        &spec(1),
        &Default::default(),
        &pods(&[]),
        &Default::default(),
        Timestamp::now(),
    );
    assert_eq!(m.invalid, ["junk"]);
    assert!(matches!(
        m.actions.as_slice(),
        [KeyAction::HoldBack {
            reason: RevokeReason::ForceReleased,
            ..
        }]
    ));
}

#[test]
fn a_mutex_waiter_watches_the_key_ahead_and_a_semaphore_waiter_every_deletion() {
    assert!(holds(0, 1) && !holds(1, 1) && holds(2, 3) && !holds(3, 3));
    assert_eq!(wake_on(1), WakeOn::KeyAhead);
    assert_eq!(wake_on(3), WakeOn::AnyDeletion);
}

// === the model ===

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
    /// The controller mirrors and applies its actions.
    Controller,
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
        2 => any::<usize>().prop_map(Event::Renew),
        3 => Just(Event::Tick),
        1 => Just(Event::LowerLease),
    ]
}

#[derive(Clone, Debug, Default)]
struct Process {
    claim: String,
    uid: String,
    running: bool,
    holding: bool,
    /// Until when it may act without another renewal.
    until: i64,
}

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
    /// When each held-back key's controller lease runs out.
    expiries: BTreeMap<String, i64>,
}

impl Model {
    /// The next moment something is due: a running process's last moment to act, or a
    /// held-back key's expiry.
    fn next_deadline(&self) -> Option<i64> {
        let acting = self.procs.iter().filter(|p| p.running).map(|p| p.until);
        acting
            .chain(self.expiries.values().copied())
            .filter(|t| *t > self.now)
            .min()
    }

    fn lease(&self) -> i32 {
        if self.lowered { LOW_LEASE } else { HIGH_LEASE }
    }

    fn pod_views(&self) -> BTreeMap<String, PodView> {
        let live = self.pods.iter().enumerate();
        live.filter_map(|(i, uid)| {
            let view = PodView {
                uid: uid.clone()?,
                finished: false,
            };
            Some((format!("p{i}"), view))
        })
        .collect()
    }

    fn key_of(&self, claim: &str) -> Option<&KeyView> {
        self.keys.iter().find(|k| k.claim == claim)
    }

    fn step(&mut self, e: &Event, max_holders: i32) {
        match *e {
            Event::Claim(pod) => {
                let uid = self.pods[pod]
                    .get_or_insert_with(|| format!("u{pod}-{}", self.incarnation))
                    .clone();
                self.revision += 1;
                let claim = format!("c{}", self.revision);
                let mut k = key(&claim, self.revision, &format!("p{pod}"));
                let value = k.value.as_mut().unwrap();
                (value.pod_uid, value.lease_seconds) = (uid.clone(), self.lease());
                self.keys.push(k);
                self.procs.push(Process {
                    claim,
                    uid,
                    running: true,
                    holding: false,
                    until: self.now + i64::from(self.lease()),
                });
            }
            Event::Check => {
                for p in self.procs.iter_mut().filter(|p| p.running && !p.holding) {
                    let Some(mine) = self.keys.iter().find(|k| k.claim == p.claim) else {
                        continue;
                    };
                    if mine.value.as_ref().is_some_and(|v| v.held_back.is_some()) {
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
            Event::Release(j) => {
                let n = self.procs.len().max(1);
                let Some(p) = self.procs.get_mut(j % n) else { return };
                if !p.running {
                    return;
                }
                p.running = false;
                let claim = p.claim.clone();
                // Revoking its own lease deletes the key only while it is still on it.
                self.keys
                    .retain(|k| k.claim != claim || k.value.as_ref().is_some_and(|v| v.held_back.is_some()));
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
                let Some(p) = self.procs.get(j % self.procs.len().max(1)) else {
                    return;
                };
                let gone = match self.key_of(&p.claim) {
                    None => true,
                    Some(k) => k.value.as_ref().is_some_and(|v| v.held_back.is_some()),
                };
                if gone {
                    let n = self.procs.len();
                    self.procs[j % n].running = false;
                }
            }
            Event::HoldBackEnds(j) => {
                let Some(k) = self.keys.get(j % self.keys.len().max(1)) else {
                    return;
                };
                let claim = k.claim.clone();
                if self.expiries.get(&claim).is_some_and(|at| *at <= self.now) {
                    let acting = self.procs.iter().find(|p| p.claim == claim && p.running);
                    assert!(
                        acting.is_none(),
                        "the held-back key of {claim} went at {}s while its process may act until {}s",
                        self.now,
                        acting.map_or(0, |p| p.until)
                    );
                    self.keys.retain(|k| k.claim != claim);
                    self.expiries.remove(&claim);
                }
            }
            Event::Renew(j) => {
                let n = self.procs.len().max(1);
                let Some(p) = self.procs.get(j % n) else { return };
                let on_own_lease =
                    |k: &&KeyView| k.claim == p.claim && k.value.as_ref().is_some_and(|v| v.held_back.is_none());
                let Some(lease) = self
                    .keys
                    .iter()
                    .find(on_own_lease)
                    .map(|k| k.value.as_ref().unwrap().lease_seconds)
                else {
                    return;
                };
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
            Event::Controller => {
                let m = mirror(
                    &self.keys,
                    &spec_with(max_holders, self.lease()),
                    &Default::default(),
                    &self.pod_views(),
                    &self.stopped,
                    Timestamp::now(),
                );
                for action in m.actions {
                    self.apply(action);
                }
            }
        }
    }

    fn apply(&mut self, action: KeyAction) {
        match action {
            KeyAction::Delete {
                claim, mod_revision, ..
            } => {
                let may_run = self.procs.iter().any(|p| p.claim == claim && p.running);
                assert!(!may_run, "deleted the key of {claim}, whose process may run");
                self.keys.retain(|k| k.claim != claim || k.mod_revision != mod_revision);
            }
            KeyAction::HoldBack {
                claim,
                mod_revision,
                value,
                ttl_seconds,
                ..
            } => {
                self.expiries.insert(claim.clone(), self.now + ttl_seconds);
                self.revision += 1;
                let rev = self.revision;
                if let Some(k) = self
                    .keys
                    .iter_mut()
                    .find(|k| k.claim == claim && k.mod_revision == mod_revision)
                {
                    k.value = Some(value);
                    k.mod_revision = rev;
                }
            }
        }
    }

    fn check_safety(&self, max_holders: i32) {
        let acting = self.procs.iter().filter(|p| p.running && p.holding).count();
        assert!(
            acting <= max_holders as usize,
            "{acting} processes act as holders, at most {max_holders} may: {self:#?}"
        );
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
        // Liveness: once every process has stopped and the controller and the held-back
        // leases have had their turn, no key is left to block the lock.
        for p in m.procs.iter_mut() { p.running = false; }
        for i in 0..PODS { m.step(&Event::PodGone { pod: i, graceful: false }, max_holders); }
        m.step(&Event::Controller, max_holders);
        loop {
            while let Some(j) = m.keys.iter().position(|k| m.expiries.get(&k.claim).is_some_and(|at| *at <= m.now)) {
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
        let mut out = vec![Event::Check, Event::Controller];
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
        let due = |j: &usize| m.expiries.get(&m.keys[*j].claim).is_some_and(|at| *at <= m.now);
        out.extend((0..m.keys.len()).filter(due).map(Event::HoldBackEnds));
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
    for (claims, max_holders, depth) in [(3, 1, 8), (3, 2, 8)] {
        let start = Bounded(Model::default(), claims, max_holders);
        let covered = crate::testing::bfs::explore(start, depth).unwrap_or_else(|found| panic!("{found}"));
        println!("etcd rules, {claims} claims, maxHolders {max_holders}, depth {depth}: {covered:?}");
        assert!(covered.states > 1000, "the bound explores too little: {covered:?}");
    }
    // The etcd rules share the one rule for when a pod's process has stopped, and the
    // one for how long a revoked holder's key is kept: put back the bug of taking a pod
    // object gone for its process stopped, or of keeping the key by the lock's lease
    // alone (short once the lock's lease is lowered below the claim's), and it is found.
    use crate::mutant::Mutant::{HoldBackBySpecLease, PodGoneAsStopped};
    for bug in [PodGoneAsStopped, HoldBackBySpecLease] {
        let _on = crate::mutant::mutate(bug);
        let found = crate::testing::bfs::explore(Bounded(Model::default(), 3, 1), 10);
        let found = found.expect_err("put back and not found");
        assert!(found.trace.starts_with("   1. "), "{bug:?}: no trace in {found}");
        println!("etcd rules, {bug:?} found:\n{found}");
    }
}
