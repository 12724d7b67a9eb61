//! The whole claim protocol as one state machine, explored exhaustively within a bound:
//! the API server (objects with resourceVersions, preconditioned writes, quorum reads),
//! two controller replicas with their own caches and memories (caches that lag as a
//! whole or watch by watch; leadership that moves, a deposed leader acting on its stale
//! view until it reads that it lost; restarts), clients (create, wait, renew, hold, act,
//! release by mark or notice, withdraw, hang on a renewal that lands unanswered, be
//! killed, be told of a grant late, take the one holder's release mark as its grant
//! while designated, learn from the lock or a read-back that its claim no longer
//! stands and claim anew), a neighbour with the client Role's rights (patch a
//! claim's lease down or up, remove it, strip its release hash, change its pod UID,
//! stamp a fencing token on it, forge its release mark, delete it, make a stamped
//! claim of its own pod), pods
//! (force-deleted with their processes running on, or stopped by the kubelet), a lock
//! deleted behind its finalizer and re-created under the same name, and time.
//!
//! The decisions are the real ones: the controller calls [`crate::decide::decide`],
//! [`crate::decide::holder_lease`] and the timing rules of [`crate::protocol::timing`];
//! the client acts by [`crate::client::session`]'s `valid_until` and `may_hold`. What the
//! model writes itself is the I/O around them, as `controller::k8s` does it (see
//! [`controller`]).
//!
//! **Time** is discrete: it advances to the next deadline any actor computed (a
//! client's stop and its command's death, a claim's expiry as each controller judges
//! it, a held-back slot's end), so every ordering of deadlines and steps is explored.
//! Steps between two deadlines happen at the earlier one, the worst case for the timing
//! inequalities (a write seen the instant it was sent). A state is compared with times
//! taken relative to now.
//!
//! **Properties**, checked as each step is taken: at most `maxHolders` processes act at
//! once (a process acts from its grant until its command is certainly dead); a process
//! acts only with a token above every token of a process that had stopped when its
//! grant was issued, and no two acting processes share one (across deletion and
//! re-creation); a write never lowers the stored token; grants go in arrival order; the
//! controller never deletes as expired a claim whose process may still act, nor lets a
//! deleted lock go while a process it granted may; every holder a status lists was
//! granted (or designated) by the lock, with that token; a client never finds its
//! grant's record tampered unless its claim was patched before the lock recorded it, nor
//! a claim as it wrote it refused while its pod runs (no lost waiter); and, as a grant is issued (the model tells its client at the status
//! write that records it, the direct grant, or the mark it takes), no more processes may
//! act than the lock's `maxHolders` says at that moment (the user may change it). Liveness: see
//! [`settle`] (a waiter whose claim someone changed must be granted or learn of it).

mod client;
mod controller;
mod io;
mod learn;
mod objects;
mod settle;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Add;
use std::time::Duration;

use crate::api::{DistributedLockSpec, DistributedLockStatus};
use crate::testing::bfs::Machine;

/// A moment of the model's clock, in milliseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub(super) struct Ms(pub i64);

impl Add<Duration> for Ms {
    type Output = Ms;
    fn add(self, d: Duration) -> Ms {
        Ms(self.0 + d.as_millis() as i64)
    }
}

impl crate::protocol::timing::Moment for Ms {
    fn since(self, earlier: Ms) -> Duration {
        Duration::from_millis(u64::try_from(self.0 - earlier.0).unwrap_or(0))
    }
}

/// Which kinds of step a configuration explores beyond the clients' own and one
/// controller's.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Menu {
    /// The neighbour patches claims: leases down, hashes stripped, marks forged.
    pub neighbour: bool,
    /// The neighbour removes a claim's lease.
    pub strips: bool,
    /// The neighbour stamps a fencing token on a claim, or makes a stamped claim of its
    /// own pod.
    pub stamps: bool,
    /// The neighbour removes a claim's lock label: out of the controller's view, its
    /// process renews it on.
    pub unlabels: bool,
    /// The neighbour deletes claims.
    pub deletes: bool,
    /// Pods are force-deleted (processes run on) or stopped by the kubelet.
    pub pods: bool,
    /// The lock is deleted and re-created under the same name.
    pub lock: bool,
    /// A controller reconciles on caches that lag (its watches behind).
    pub lag: bool,
    /// A second controller takes over (the deposed one acting on until it reads that
    /// it lost); a controller restarts with no memory.
    pub leaders: bool,
    /// Processes are killed; holders release by a notice to a controller.
    pub kills: bool,
    /// The user changes the lock's `maxHolders` (to any value from 1 to the
    /// configuration's).
    pub resize: bool,
    /// The neighbour raises a claim's lease to an hour.
    pub raises: bool,
    /// The neighbour changes a claim's pod UID (the claim is invalid from then on); a
    /// waiting client reads its unplaced claim back once, as at its notice time.
    pub invalids: bool,
}

/// One configuration: the actors and the bound.
#[derive(Clone, Copy, Debug)]
pub(super) struct Config {
    /// How many clients (each in its own pod).
    pub clients: usize,
    /// The lock's `maxHolders`.
    pub max_holders: i32,
    /// The lock's lease, in seconds.
    pub spec_lease: i32,
    /// The clients' own lease, in seconds.
    pub client_lease: i32,
    /// What else may happen.
    pub menu: Menu,
}

/// A claim's release mark, by who wrote it (the controller judges it by
/// [`crate::protocol::release::judge`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mark {
    None,
    /// Written by its process: its release secret.
    Owner,
    /// Written by someone else, who does not know the secret: `"true"`.
    Forged,
}

/// The release secret every client of the model uses (the neighbour never learns it).
fn secret() -> &'static crate::protocol::release::Secret {
    static SECRET: std::sync::LazyLock<crate::protocol::release::Secret> =
        std::sync::LazyLock::new(crate::protocol::release::Secret::generate);
    &SECRET
}

/// The hash of [`secret`], hashed once (the model asks for it on every step).
fn secret_hash() -> &'static str {
    static HASH: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| secret().hash());
    &HASH
}

/// The longest lease a claim may state (an hour): the neighbour's own claim's, and
/// what it raises a claim's lease to.
const HOUR: i32 = crate::protocol::timing::MAX_LEASE_SECONDS;

/// A claim Lease as the API server stores it.
#[derive(Clone, Debug)]
struct ClaimObj {
    rv: u64,
    /// Whose it is: a client's index, or (`cfg.clients`) the neighbour's own.
    client: usize,
    /// The lease it states (0: none, the field removed), and its wait lease, in seconds.
    lease: i32,
    wait: i32,
    mark: Mark,
    /// It carries the hash of its owner's release secret (the neighbour may strip it).
    hash: bool,
    /// How many times its process renewed it (its `renewTime` changes).
    renewals: u32,
    /// It carries a fencing-token stamp (1, below every epoch).
    stamped: bool,
    /// It carries its lock label (the controller's watch selects claims by it).
    labelled: bool,
    /// Its pod UID annotation was changed: it no longer names its pod as its owner
    /// reference does (the controller judges it invalid).
    uid_changed: bool,
    /// Its place in arrival order.
    made: u32,
    /// Patched by the neighbour before the lock's status first recorded it (then its
    /// process may find the record tampered, and withdraw).
    patched_early: bool,
}

/// The DistributedLock as the API server stores it.
#[derive(Clone, Debug)]
struct LockObj {
    /// Each incarnation under the lock's name has its own.
    uid: u32,
    rv: u64,
    spec: DistributedLockSpec,
    status: DistributedLockStatus,
    deleting: bool,
}

/// What the API server stores.
#[derive(Clone, Debug, Default)]
struct Server {
    /// Bumped by every change, so a cache is current exactly when its `rv` is.
    rv: u64,
    lock: Option<LockObj>,
    claims: BTreeMap<String, ClaimObj>,
    /// Pod objects (pod i is client i's; its UID is i).
    pods: BTreeSet<usize>,
    /// Pods whose containers the kubelet reported stopped before their objects went.
    stopped: BTreeSet<usize>,
    /// Who holds the leader election Lease.
    leader: usize,
}

/// One step of the system.
#[derive(Clone, Debug)]
pub(super) enum Step {
    /// Client i creates a claim.
    Create(usize),
    /// Client i renews its claim (waiting, or holding).
    Renew(usize),
    /// Client i takes a grant it was told of: it acts if its last write's deadline is
    /// far enough ahead, else it renews at the holder's pace first.
    Hold(usize),
    /// Client i's command ends and it marks its claim released (or withdraws it).
    Release(usize),
    /// Client i's command ends and it tells controller c (its notice endpoint).
    Notice(usize, usize),
    /// Client i's process is killed.
    Kill(usize),
    /// Client i reads the lock and finds its grant revoked.
    SeeRevoked(usize),
    /// Client i, waiting, learns from the lock that its wait has ended ([`learn`]).
    Learn(usize),
    /// Client i reads its unplaced claim back, as at its notice time.
    ReadBack(usize),
    /// Client i, designated for a handover, sees the holder's claim carry a release mark
    /// that opens the recorded hash: its grant.
    SeeMark(usize),
    /// Controller c reads everything afresh (its watches catch up, it reads the
    /// leader Lease) and, if it leads, reconciles.
    Reconcile(usize),
    /// Controller c, believing it leads, reconciles on the caches it has.
    Stale(usize),
    /// Controller c's lock watch catches up (its claim watch lags).
    SyncLock(usize),
    /// Controller c's claim and pod watches catch up (its lock watch lags).
    SyncClaims(usize),
    /// Controller c takes the leader election Lease (the other may not know yet).
    TakeOver(usize),
    /// Controller c restarts: no caches, no memory, not leading.
    Restart(usize),
    /// Pod i is force-deleted: its process runs on.
    ForceDeletePod(usize),
    /// Pod i is deleted gracefully: the kubelet stops it and says so.
    StopPod(usize),
    /// The neighbour patches client i's claim's lease and wait lease to 1 s.
    PatchLease(usize),
    /// The neighbour removes client i's claim's lease.
    StripLease(usize),
    /// The neighbour raises client i's claim's lease to an hour.
    RaiseLease(usize),
    /// The neighbour changes client i's claim's pod UID annotation.
    ChangeUid(usize),
    /// The neighbour stamps a fencing token (1) on client i's claim.
    Stamp(usize),
    /// The neighbour makes a claim of its own pod, stamped, with a lease of an hour.
    NeighbourClaim,
    /// The neighbour removes the lock label from client i's claim.
    Unlabel(usize),
    /// The neighbour writes a release mark on client i's claim.
    Forge(usize),
    /// The neighbour strips the release hash from client i's claim.
    StripHash(usize),
    /// Client i's renewal lands but its answer never comes (the request hangs).
    Hang(usize),
    /// The neighbour deletes client i's claim.
    DeleteClaim(usize),
    /// Someone deletes the lock (its finalizer holds it).
    DeleteLock,
    /// The lock, let go, is created again under the same name.
    Recreate,
    /// The user sets the lock's `maxHolders` to this.
    Resize(i32),
    /// Time advances to the next deadline, at this many milliseconds.
    Tick(i64),
}

/// The system: the API server, two controllers, the clients, the clock.
#[derive(Clone, Debug)]
pub(super) struct System {
    cfg: Config,
    now: Ms,
    server: Server,
    ctrls: [controller::Ctrl; 2],
    clients: Vec<client::Client>,
    /// How many claims were made.
    made: u32,
    /// How many incarnations the lock had.
    incarnations: u32,
    /// The highest token of a process that has certainly stopped acting.
    stopped_max: i64,
}

impl System {
    /// The start: a lock nobody claimed, controller 0 leading, every pod running.
    pub(super) fn new(cfg: Config) -> Self {
        let spec = DistributedLockSpec {
            max_holders: cfg.max_holders,
            lease_duration_seconds: cfg.spec_lease,
            ..Default::default()
        };
        let lock = LockObj {
            uid: 1,
            rv: 1,
            spec,
            status: DistributedLockStatus::default(),
            deleting: false,
        };
        let mut ctrls = [controller::Ctrl::default(), controller::Ctrl::default()];
        ctrls[0].leads = true;
        System {
            cfg,
            now: Ms(0),
            server: Server {
                rv: 1,
                lock: Some(lock),
                claims: BTreeMap::new(),
                pods: (0..=cfg.clients).collect(), // the neighbour's pod too
                stopped: BTreeSet::new(),
                leader: 0,
            },
            ctrls,
            clients: (0..cfg.clients).map(|_| client::Client::default()).collect(),
            made: 0,
            incarnations: 1,
            stopped_max: 0,
        }
    }

    fn next_rv(&mut self) -> u64 {
        self.server.rv += 1;
        self.server.rv
    }

    /// The next deadline after now, if any actor has one.
    fn next_deadline(&self) -> Option<Ms> {
        let clients = self.clients.iter().flat_map(|c| c.deadlines(self.lease()));
        let ctrls = (0..2).flat_map(|c| self.ctrl_deadlines(c));
        clients.chain(ctrls).filter(|t| *t > self.now).min()
    }

    fn tick(&mut self, to: Ms) {
        self.now = to;
        for i in 0..self.clients.len() {
            self.client_deadline_passed(i);
        }
        self.note_stopped();
    }

    /// Remember the tokens of processes that have certainly stopped by now.
    fn note_stopped(&mut self) {
        let now = self.now;
        let stopped = self.clients.iter().filter(|c| c.token > 0 && c.until <= now);
        self.stopped_max = stopped.map(|c| c.token).fold(self.stopped_max, i64::max);
    }

    /// The state with every time taken relative to now and every resourceVersion by
    /// its rank: what the future depends on.
    fn normalized(&self) -> System {
        let mut s = self.clone();
        let shift = |t: &mut Ms| t.0 -= self.now.0;
        s.now = Ms(0);
        s.clients.iter_mut().for_each(|c| c.shift(shift));
        s.ctrls.iter_mut().for_each(|c| c.shift(shift));
        let mut rvs = BTreeSet::new();
        s.visit_rvs(|rv| {
            rvs.insert(*rv);
        });
        let rank: BTreeMap<u64, u64> = rvs.into_iter().zip(1..).collect();
        s.visit_rvs(|rv| *rv = rank[rv]);
        s
    }

    fn visit_rvs(&mut self, mut f: impl FnMut(&mut u64)) {
        let views = self.ctrls.iter_mut().filter_map(|c| c.view.as_mut());
        for server in std::iter::once(&mut self.server).chain(views) {
            f(&mut server.rv);
            if let Some(l) = server.lock.as_mut() {
                f(&mut l.rv);
            }
            server.claims.values_mut().for_each(|c| f(&mut c.rv));
        }
    }
}

impl Machine for System {
    type Step = Step;

    fn steps(&self) -> Vec<Step> {
        let mut out = Vec::new();
        for i in 0..self.clients.len() {
            out.extend(self.client_steps(i));
        }
        let menu = self.cfg.menu;
        let ctrls = if menu.leaders { 0..2 } else { 0..1 };
        for c in ctrls {
            out.push(Step::Reconcile(c));
            if menu.lag || menu.leaders {
                out.extend(self.stale_differs(c).then_some(Step::Stale(c)));
            }
            if menu.lag && self.ctrls[c].view.is_some() {
                out.extend([Step::SyncLock(c), Step::SyncClaims(c)]);
            }
            if menu.leaders {
                out.extend((self.server.leader != c).then_some(Step::TakeOver(c)));
                out.push(Step::Restart(c));
            }
        }
        for i in 0..self.clients.len() {
            let claim = self.clients[i].claim.as_ref().and_then(|n| self.server.claims.get(n));
            if let Some(claim) = claim.filter(|_| menu.strips) {
                out.extend((claim.lease > 0).then_some(Step::StripLease(i)));
            }
            if let Some(claim) = claim.filter(|_| menu.raises) {
                out.extend((0 < claim.lease && claim.lease < HOUR).then_some(Step::RaiseLease(i)));
            }
            if let Some(claim) = claim.filter(|_| menu.invalids) {
                out.extend((!claim.uid_changed).then_some(Step::ChangeUid(i)));
            }
            if let Some(claim) = claim.filter(|_| menu.stamps) {
                out.extend((!claim.stamped).then_some(Step::Stamp(i)));
            }
            if let Some(claim) = claim.filter(|_| menu.unlabels) {
                out.extend(claim.labelled.then_some(Step::Unlabel(i)));
            }
            if let Some(claim) = claim.filter(|_| menu.neighbour) {
                out.extend((claim.lease > 1).then_some(Step::PatchLease(i)));
                out.extend((claim.mark == Mark::None).then_some(Step::Forge(i)));
                out.extend(claim.hash.then_some(Step::StripHash(i)));
            }
            out.extend(claim.filter(|_| menu.deletes).map(|_| Step::DeleteClaim(i)));
            if menu.pods && self.server.pods.contains(&i) {
                out.extend([Step::ForceDeletePod(i), Step::StopPod(i)]);
            }
        }
        let neighbours = self.server.claims.values().any(|c| c.client == self.clients.len());
        if menu.stamps && !neighbours {
            out.push(Step::NeighbourClaim);
        }
        if menu.lock {
            match &self.server.lock {
                Some(l) if !l.deleting => out.push(Step::DeleteLock),
                Some(_) => {}
                None => out.push(Step::Recreate),
            }
        }
        if let Some(l) = self.server.lock.as_ref().filter(|_| menu.resize) {
            let other = (1..=self.cfg.max_holders).filter(|n| *n != l.spec.max_holders);
            out.extend(other.map(Step::Resize));
        }
        out.extend(self.next_deadline().map(|t| Step::Tick(t.0)));
        out
    }

    fn take(&mut self, step: &Step) {
        match *step {
            Step::Create(i) => self.create(i),
            Step::Renew(i) => self.renew(i),
            Step::Hold(i) => self.hold(i),
            Step::Release(i) => self.release(i, None),
            Step::Notice(i, c) => self.release(i, Some(c)),
            Step::Kill(i) => self.stop_process(i, self.now),
            Step::SeeRevoked(i) => self.see_revoked(i),
            Step::SeeMark(i) => self.see_mark(i),
            Step::Learn(i) => self.learn(i),
            Step::ReadBack(i) => self.read_back(i),
            Step::Reconcile(c) => self.reconcile(c, true),
            Step::Stale(c) => self.reconcile(c, false),
            Step::SyncLock(c) => self.sync_lock(c),
            Step::SyncClaims(c) => self.sync_claims(c),
            Step::TakeOver(c) => {
                self.next_rv();
                self.server.leader = c;
                self.ctrls[c].leads = true;
            }
            Step::Restart(c) => self.ctrls[c] = controller::Ctrl::default(),
            Step::ForceDeletePod(i) => {
                self.next_rv();
                self.server.pods.remove(&i);
            }
            Step::StopPod(i) => {
                self.stop_process(i, self.now);
                self.next_rv();
                self.server.stopped.insert(i);
                self.server.pods.remove(&i);
            }
            Step::PatchLease(i) => {
                let early = !self.recorded(i);
                self.patch_claim(i, |c| {
                    (c.lease, c.wait, c.patched_early) = (1, 1, c.patched_early || early)
                });
            }
            Step::RaiseLease(i) => {
                let early = !self.recorded(i);
                self.patch_claim(i, |c| (c.lease, c.patched_early) = (HOUR, c.patched_early || early));
            }
            Step::ChangeUid(i) => {
                let early = !self.recorded(i);
                self.patch_claim(i, |c| {
                    (c.uid_changed, c.patched_early) = (true, c.patched_early || early)
                });
            }
            Step::StripLease(i) => {
                let early = !self.recorded(i);
                self.patch_claim(i, |c| (c.lease, c.patched_early) = (0, c.patched_early || early));
            }
            Step::Stamp(i) => {
                let early = !self.recorded(i);
                self.patch_claim(i, |c| (c.stamped, c.patched_early) = (true, c.patched_early || early));
            }
            Step::NeighbourClaim => self.neighbour_claim(),
            Step::Unlabel(i) => self.patch_claim(i, |c| c.labelled = false),
            Step::Forge(i) => self.patch_claim(i, |c| c.mark = Mark::Forged),
            Step::StripHash(i) => {
                let early = !self.recorded(i);
                self.patch_claim(i, |c| (c.hash, c.patched_early) = (false, c.patched_early || early));
            }
            Step::Hang(i) => self.patch_claim(i, |c| c.renewals += 1),
            Step::DeleteClaim(i) => {
                self.next_rv();
                if let Some(name) = &self.clients[i].claim {
                    self.server.claims.remove(name);
                }
            }
            Step::DeleteLock => {
                let rv = self.next_rv();
                if let Some(l) = self.server.lock.as_mut() {
                    (l.deleting, l.rv) = (true, rv);
                }
            }
            Step::Recreate => self.recreate(),
            Step::Resize(n) => {
                let rv = self.next_rv();
                if let Some(l) = self.server.lock.as_mut() {
                    (l.spec.max_holders, l.rv) = (n, rv);
                }
            }
            Step::Tick(to) => self.tick(Ms(to)),
        }
        self.note_stopped();
    }

    fn key(&self) -> String {
        // All but the configuration, which every state shares.
        let n = self.normalized();
        let System {
            cfg: _,
            now: _,
            server,
            ctrls,
            clients,
            made,
            incarnations,
            stopped_max,
        } = &n;
        format!("{server:?}{ctrls:?}{clients:?}{made}/{incarnations}/{stopped_max}")
    }

    fn settles(&self) {
        self.settle();
    }
}

impl System {
    fn patch_claim(&mut self, i: usize, f: impl FnOnce(&mut ClaimObj)) {
        let rv = self.next_rv();
        let name = self.clients[i].claim.clone().unwrap_or_default();
        if let Some(c) = self.server.claims.get_mut(&name) {
            f(c);
            c.rv = rv;
        }
    }

    /// Whether the lock's stored status records client `i`'s claim.
    fn recorded(&self, i: usize) -> bool {
        let name = self.clients[i].claim.as_deref().unwrap_or_default();
        let status = self.server.lock.as_ref().map(|l| &l.status);
        status.is_some_and(|s| crate::protocol::record::recorded(s, name).is_some())
    }

    /// The neighbour's claim of its own pod (pod `cfg.clients`, running): stamped with
    /// a token below every epoch, living by an hour's lease, never renewed.
    fn neighbour_claim(&mut self) {
        let rv = self.next_rv();
        let obj = ClaimObj {
            rv,
            client: self.clients.len(),
            lease: HOUR,
            wait: crate::protocol::timing::MAX_LEASE_SECONDS,
            mark: Mark::None,
            hash: false,
            stamped: true,
            labelled: true,
            uid_changed: false,
            renewals: 0,
            made: self.made,
            patched_early: false,
        };
        self.made += 1;
        self.server.claims.insert("n".to_string(), obj);
    }

    fn recreate(&mut self) {
        self.incarnations += 1;
        let rv = self.next_rv();
        let spec = DistributedLockSpec {
            max_holders: self.cfg.max_holders,
            lease_duration_seconds: self.cfg.spec_lease,
            ..Default::default()
        };
        self.server.lock = Some(LockObj {
            uid: self.incarnations,
            rv,
            spec,
            status: DistributedLockStatus::default(),
            deleting: false,
        });
    }
}

/// `secs` seconds.
fn secs(secs: i32) -> Duration {
    Duration::from_secs(secs.max(1) as u64)
}
