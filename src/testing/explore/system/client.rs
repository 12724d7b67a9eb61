//! The clients: each knows only what the real client knows (its own writes and their
//! answers, the grants it was told of, the lock it reads) and acts by the real client's
//! rules ([`valid_until`], [`may_hold`]).

use std::collections::{BTreeMap, BTreeSet};

use super::objects::claim_lease;
use super::{ClaimObj, Mark, Menu, Ms, Step, System, secs};
use crate::api::DistributedLockStatus;
use crate::client::session::{may_hold, valid_until};
use crate::protocol::record;
use crate::protocol::timing::{renew_interval, safety_margin, wait_lease, wait_renew_interval};

/// Where a client stands.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) enum Phase {
    #[default]
    Idle,
    Waiting,
    Acting,
    /// Released, withdrawn, lost or killed: it makes no more steps.
    Done,
}

/// One client process and what it knows.
#[derive(Clone, Debug, Default)]
pub(super) struct Client {
    pub claim: Option<String>,
    pub phase: Phase,
    /// Told of its grant: it renews at the holder's pace.
    pub held: bool,
    /// When its last successful write was sent.
    pub last_sent: Ms,
    /// The deadline of its last successful write ([`valid_until`]).
    pub valid_until: Ms,
    /// Until when its command may run (certainly dead from then on); for the properties.
    pub until: Ms,
    /// Its grant's fencing token, once it acts.
    pub token: i64,
    /// Grants it was told of (by the lock's watch, or directly), by token: whether the
    /// status they came with records its claim as it wrote it ([`record::check`]), and
    /// the highest token of a process that had certainly stopped when it was issued.
    told: BTreeMap<i64, (bool, i64)>,
    /// Handovers it was designated for ([`crate::protocol::handover`]) by statuses that
    /// record its claim as it wrote it: the one holder's claim whose valid release mark
    /// grants it, and the token reserved for it. Every one it ever saw (its watch of the
    /// lock may lag, so it may follow an older designation than the stored status).
    handovers: BTreeSet<(String, i64)>,
    /// A status written since it claimed named its claim.
    pub placed: bool,
    /// It read its unplaced claim back at its notice time, and found it as it wrote it.
    pub read_back: bool,
    /// How many claims it made (idle after one: it claims anew).
    pub claims: u32,
    /// It gave up waiting on a refusal of its claim as it wrote it.
    pub gave_up: bool,
}

impl Client {
    /// The moments at which something happens to it by itself: its next renewal
    /// falls due, its deadline passes, its command is certainly dead.
    pub fn deadlines(&self, lease: std::time::Duration) -> Vec<Ms> {
        let mut out = Vec::new();
        match self.phase {
            Phase::Acting => out.extend([self.valid_until, self.renew_due(lease)]),
            Phase::Waiting => out.push(self.renew_due(lease)),
            Phase::Idle | Phase::Done => {}
        }
        if self.token > 0 {
            out.push(self.until);
        }
        out
    }

    /// Whether it was told of a grant.
    pub fn has_been_told(&self) -> bool {
        !self.told.is_empty()
    }

    /// When its next renewal falls due, at the pace of where it stands.
    pub fn renew_due(&self, lease: std::time::Duration) -> Ms {
        let held = self.held || self.phase == Phase::Acting;
        self.last_sent
            + if held {
                renew_interval(lease)
            } else {
                wait_renew_interval(lease)
            }
    }

    /// It withdrew its claim, never acted on: it knows nothing of it any more, and
    /// claims anew.
    pub fn start_anew(&mut self) {
        *self = Client {
            claims: self.claims,
            ..Default::default()
        };
    }

    pub fn shift(&mut self, f: impl Fn(&mut Ms)) {
        f(&mut self.last_sent);
        f(&mut self.valid_until);
        f(&mut self.until);
    }
}

/// What client `i` writes on its claim (the model's claims carry no wait hash).
fn wrote(i: usize, lease: i32) -> record::Claimed {
    record::Claimed {
        pod: format!("p{i}"),
        pod_uid: format!("u{i}"),
        release_hash: Some(super::secret_hash().to_string()),
        wait_hash: None,
        lease_seconds: lease,
    }
}

impl System {
    /// What client `i` writes on its claim.
    pub(super) fn wrote(&self, i: usize) -> record::Claimed {
        wrote(i, self.cfg.client_lease)
    }

    pub(super) fn lease(&self) -> std::time::Duration {
        secs(self.cfg.client_lease)
    }

    pub(super) fn client_steps(&self, i: usize) -> Vec<Step> {
        let c = &self.clients[i];
        let Menu { kills, leaders, .. } = self.cfg.menu;
        let mut out = Vec::new();
        match c.phase {
            Phase::Idle if self.server.pods.contains(&i) => out.push(Step::Create(i)),
            Phase::Idle | Phase::Done => {}
            Phase::Waiting => {
                out.push(Step::Renew(i));
                out.extend((!c.told.is_empty()).then_some(Step::Hold(i)));
                out.extend(self.handed_over(i).is_some().then_some(Step::SeeMark(i)));
                out.push(Step::Release(i));
                out.extend(self.learn_steps(i));
            }
            Phase::Acting => {
                out.extend([Step::Renew(i), Step::Release(i)]);
                if kills {
                    let ctrls = if leaders { 0..2 } else { 0..1 };
                    out.extend(ctrls.map(|ctrl| Step::Notice(i, ctrl)));
                }
                out.extend(self.revoked(i).then_some(Step::SeeRevoked(i)));
            }
        }
        if kills && matches!(c.phase, Phase::Waiting | Phase::Acting) {
            out.extend([Step::Kill(i), Step::Hang(i)]);
        }
        out
    }

    pub(super) fn create(&mut self, i: usize) {
        let rv = self.next_rv();
        let lease = self.lease();
        let letter = (b'a' + i as u8) as char;
        let made = self.clients[i].claims;
        let name = if made == 0 {
            letter.to_string()
        } else {
            format!("{letter}{made}")
        };
        let obj = ClaimObj {
            rv,
            client: i,
            lease: self.cfg.client_lease,
            wait: wait_lease(lease).as_secs() as i32,
            mark: Mark::None,
            hash: true,
            stamped: false,
            labelled: true,
            uid_changed: false,
            renewals: 0,
            made: self.made,
            patched_early: false,
        };
        self.made += 1;
        self.server.claims.insert(name.clone(), obj);
        let now = self.now;
        let c = &mut self.clients[i];
        (c.claim, c.phase, c.claims) = (Some(name), Phase::Waiting, made + 1);
        (c.placed, c.read_back) = (false, false);
        c.last_sent = now;
        c.valid_until = valid_until(now, lease, true);
    }

    pub(super) fn renew(&mut self, i: usize) {
        let (now, lease) = (self.now, self.lease());
        let rv = self.next_rv();
        let name = self.clients[i].claim.clone().unwrap_or_default();
        let Some(obj) = self.server.claims.get_mut(&name) else {
            // Gone: someone deleted it (a forced release, or an expiry). A waiter told of
            // no grant claims anew (the real one's claim is dropped); else it stops.
            let c = &self.clients[i];
            if c.phase == Phase::Waiting && !c.has_been_told() {
                return self.claim_anew(i);
            }
            return self.stop_process(i, now + safety_margin(lease));
        };
        (obj.renewals, obj.rv) = (obj.renewals + 1, rv);
        let c = &mut self.clients[i];
        c.last_sent = now;
        c.valid_until = valid_until(now, lease, !c.held);
        if c.phase == Phase::Acting {
            c.until = c.until.max(c.valid_until + safety_margin(lease));
        }
    }

    pub(super) fn hold(&mut self, i: usize) {
        let (now, lease) = (self.now, self.lease());
        let c = &mut self.clients[i];
        let (&token, &(recorded_as_written, stopped_before)) = c.told.last_key_value().expect("told of a grant");
        if !recorded_as_written {
            // The status records its claim otherwise than it wrote it: it withdraws
            // (and would claim anew), never acting under the tampered record. No lost
            // waiter: only a patch made before the record can do that.
            let name = c.claim.clone().unwrap_or_default();
            let early = self.server.claims.get(&name).is_none_or(|o| o.patched_early);
            assert!(
                early,
                "client {i}'s record was lowered though its claim was patched only after the lock recorded it"
            );
            return self.claim_anew(i);
        }
        c.held = true;
        if !may_hold(now, c.valid_until, lease) {
            return; // it renews first
        }
        (c.phase, c.token) = (Phase::Acting, token);
        c.until = c.valid_until + safety_margin(lease);
        self.check_acting(i, stopped_before);
    }

    /// The properties as client `i` starts to act on a grant issued when the highest
    /// token of a process that had stopped was `stopped_before`.
    fn check_acting(&self, i: usize, stopped_before: i64) {
        let now = self.now;
        let token = self.clients[i].token;
        let acting: Vec<(usize, i64)> = (self.clients.iter().enumerate())
            .filter(|(_, c)| c.token > 0 && c.until > now)
            .map(|(j, c)| (j, c.token))
            .collect();
        let max = self.cfg.max_holders as usize;
        assert!(
            acting.len() <= max,
            "{} processes act at once under a lock of maxHolders {max}: (client, token) {acting:?}",
            acting.len()
        );
        assert!(
            token > stopped_before,
            "client {i} acts with token {token}, not above {stopped_before} of a process that stopped before it was issued",
        );
        let twins = acting.iter().filter(|(_, t)| *t == token).count();
        assert!(twins == 1, "two processes act with token {token}: {acting:?}");
    }

    /// The command ends (or the claim is withdrawn), then the release is written: a mark,
    /// or a notice to controller `notice`.
    pub(super) fn release(&mut self, i: usize, notice: Option<usize>) {
        self.stop_process(i, self.now);
        let name = self.clients[i].claim.clone().unwrap_or_default();
        match notice {
            Some(ctrl) => {
                let now = self.now;
                self.ctrls[ctrl].noticed.insert(name, now);
            }
            None => {
                let rv = self.next_rv();
                if let Some(obj) = self.server.claims.get_mut(&name) {
                    (obj.mark, obj.rv) = (Mark::Owner, rv);
                }
            }
        }
    }

    /// Client `i` stops: its command is dead by `by` at the latest.
    pub(super) fn stop_process(&mut self, i: usize, by: Ms) {
        let c = &mut self.clients[i];
        if c.token > 0 {
            c.until = c.until.min(by); // acting, or in its command's grace
        }
        if c.phase != Phase::Idle {
            c.phase = Phase::Done;
        }
    }

    /// Whether the lock as stored no longer lists client `i` as an unrevoked holder, or
    /// records its claim otherwise than it wrote it (the client checks every status it
    /// reads, after its grant too).
    fn revoked(&self, i: usize) -> bool {
        let name = self.clients[i].claim.as_deref().unwrap_or_default();
        let Some(lock) = &self.server.lock else { return true };
        let held = (lock.status.holders)
            .iter()
            .any(|h| h.claim == name && h.revoked.is_none() && h.fencing_token == self.clients[i].token);
        let wrote = wrote(i, self.cfg.client_lease);
        !held || record::check(&lock.status, name, &wrote.written()).is_err()
    }

    /// Client `i` reads the lock and finds its grant gone, or its record tampered: it
    /// stops its command (SIGTERM, then SIGKILL a margin later). A tampered record is
    /// no lost grant only if its claim was patched before the lock recorded it.
    pub(super) fn see_revoked(&mut self, i: usize) {
        let name = self.clients[i].claim.clone().unwrap_or_default();
        let status = self.server.lock.as_ref().map(|l| &l.status);
        let wrote = wrote(i, self.cfg.client_lease);
        if status.is_some_and(|s| record::check(s, &name, &wrote.written()).is_err()) {
            let early = self.server.claims.get(&name).is_none_or(|o| o.patched_early);
            assert!(
                early,
                "client {i}'s record was lowered though its claim was patched only after the lock recorded it"
            );
        }
        let by = self.now + safety_margin(self.lease());
        self.stop_process(i, by);
    }

    /// Time passed: an acting client whose deadline passed gives up.
    pub(super) fn client_deadline_passed(&mut self, i: usize) {
        let c = &mut self.clients[i];
        if c.phase == Phase::Acting && self.now >= c.valid_until {
            c.phase = Phase::Done;
        }
    }

    /// The waiting client of claim `claim`, and its index.
    fn waiting(&mut self, claim: &str) -> Option<(usize, &mut Client)> {
        let c = self
            .clients
            .iter_mut()
            .enumerate()
            .find(|(_, c)| c.claim.as_deref() == Some(claim));
        c.filter(|(_, c)| c.phase == Phase::Waiting)
    }

    /// A status is written that designates the claim of a waiting client for a handover:
    /// the client follows it if the status records its claim as it wrote it (else it
    /// withdraws on reading it, following nothing).
    pub(super) fn designate(&mut self, status: &DistributedLockStatus, max_holders: i32) {
        let lease = self.cfg.client_lease;
        let Some(claim) = status.successor.as_ref().map(|s| s.claim.as_str()) else {
            return;
        };
        let Some(h) = crate::protocol::handover(max_holders, status, claim) else {
            return;
        };
        let Some((i, c)) = self.waiting(claim) else {
            return;
        };
        if record::check(status, claim, &wrote(i, lease).written()).is_ok() {
            c.handovers.insert((h.from.to_string(), h.token));
        }
    }

    /// The token of a handover client `i` follows whose holder's claim, as stored now,
    /// carries a release mark that opens the recorded hash (judged by the real rule),
    /// and which it was not told of yet.
    fn handed_over(&self, i: usize) -> Option<i64> {
        let c = &self.clients[i];
        c.handovers.iter().find_map(|(from, token)| {
            let obj = self.server.claims.get(from)?;
            let h = crate::protocol::Handover {
                from,
                hash: super::secret_hash(),
                token: *token,
            };
            (!c.told.contains_key(token) && h.released_by(&claim_lease(from, obj))).then_some(*token)
        })
    }

    /// Client `i`'s watch of the holder's claim shows the release mark that hands the
    /// slot on to it: it is told of its grant now (the holder has stopped), and acts by
    /// [`System::hold`]'s rule. The token must be above every token of a process that
    /// has stopped by now.
    pub(super) fn see_mark(&mut self, i: usize) {
        let stopped_before = self.stopped_max;
        if let Some(token) = self.handed_over(i)
            && self.clients[i].told.insert(token, (true, stopped_before)).is_none()
        {
            self.check_issued(i, token);
        }
    }

    /// The client of claim `claim` is told of its grant with `token`, with `status`,
    /// which it checks records its claim as it wrote it.
    pub(super) fn tell(&mut self, claim: &str, token: i64, status: &DistributedLockStatus) {
        let (lease, stopped_before) = (self.cfg.client_lease, self.stopped_max);
        let Some((i, c)) = self.waiting(claim) else {
            return;
        };
        let ok = record::check(status, claim, &wrote(i, lease).written()).is_ok();
        if ok {
            // The lock judges the process by its record: one longer than the lease the
            // process lives by holds its slot back that long once it dies.
            let recorded = record::recorded(status, claim).and_then(|r| r.lease_seconds);
            assert_eq!(
                recorded,
                Some(lease),
                "client {i} takes a grant recorded with a lease of {recorded:?} s against its own {lease} s: \
                 once its process dies, its slot is held back that long"
            );
        }
        // Told of one grant twice (directly, then by the status): it may act on the first
        // that checked out.
        let new = !c.told.contains_key(&token);
        let told = c.told.entry(token).or_insert((ok, stopped_before));
        told.0 |= ok;
        if new {
            self.check_issued(i, token);
        }
    }

    /// The property as a grant is issued to client `i` (told at its issue): with it, no more processes may act
    /// than the lock's `maxHolders` says *now* (a lowered `maxHolders` revokes no one,
    /// but a grant issued after it is stored counts against it). A process may act if it
    /// acts or may still run, or was told of a grant it would take (with a status that
    /// records its claim as it wrote it) and may still take it (its last write's
    /// deadline has not passed: the lock still counts its slot).
    fn check_issued(&self, i: usize, token: i64) {
        let now = self.now;
        let Some(max) = self.server.lock.as_ref().map(|l| l.spec.max_holders.max(1) as usize) else {
            return;
        };
        let may_act: Vec<usize> = (self.clients.iter().enumerate())
            .filter(|(j, c)| {
                let acts = c.token > 0 && c.until > now;
                let would_take = c.told.values().any(|(as_written, _)| *as_written);
                let may_take = c.phase == Phase::Waiting && would_take && c.valid_until > now;
                *j == i || acts || may_take
            })
            .map(|(j, _)| j)
            .collect();
        assert!(
            may_act.len() <= max,
            "client {i} is granted token {token} while clients {may_act:?} may act under a lock of maxHolders {max} (now)"
        );
    }
}
