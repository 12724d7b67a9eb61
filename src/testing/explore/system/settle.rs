//! Liveness under fairness, from one state: no more faults; the election Lease's holder
//! knows it leads; each controller reconciles on fresh caches; each client renews when
//! due, takes a grant it was told of and releases once it acts; time advances only when
//! no step changes anything. Then every waiter that may still be granted is granted (a
//! grant is written for it, or it is told of one directly: one granted and then silent
//! for its lease loses it, as it should); every waiter whose claim someone else changed
//! before the lock recorded it is granted or learns that its claim no longer stands
//! ([`super::learn`]: it would claim anew); and a deleted lock is let go.

use super::client::Phase;
use super::{Mark, System};
use crate::client::session::may_hold;
use crate::protocol::timing::{client_stop_by, wait_lease};
use crate::testing::bfs::Machine;

/// How many fair rounds a state has to settle in (each round: every actor once, and
/// time to the next deadline when nothing moved).
const ROUNDS: usize = 200;

impl System {
    /// Whether client `i` is a waiter that must be granted: waiting on the lock as it
    /// stands, its pod running, its claim as it wrote it (no mark on it, its lock label
    /// on, not patched before the lock recorded it, valid), and not yet given up waiting.
    fn must_be_granted(&self, i: usize) -> bool {
        self.waits_on(i, |o| !o.patched_early && !o.uid_changed) || self.claims_anew(i)
    }

    /// Whether client `i` withdrew a claim to claim anew, on a lock open as it stands,
    /// its pod running.
    fn claims_anew(&self, i: usize) -> bool {
        let c = &self.clients[i];
        let open = self.server.lock.as_ref().is_some_and(|l| !l.deleting);
        c.phase == Phase::Idle && c.claims > 0 && open && self.server.pods.contains(&i)
    }

    /// Whether client `i` is a waiter that must be granted, on this claim or on one it
    /// makes anew once it learns that this one no longer stands, unless it gives up on a
    /// refusal: as [`Self::must_be_granted`], its claim patched before the lock recorded
    /// it, or made invalid at any time (refused if unrecorded; a recorded one is dropped
    /// from the queue and deleted, and the client's next renewal finds it gone).
    fn must_learn(&self, i: usize) -> bool {
        self.waits_on(i, |o| o.patched_early || o.uid_changed)
    }

    /// Whether client `i` waits on the lock as it stands, its pod running, its claim
    /// unmarked, labelled and as `which` asks, and has not yet given up waiting.
    fn waits_on(&self, i: usize, which: impl Fn(&super::ClaimObj) -> bool) -> bool {
        let c = &self.clients[i];
        let claim = c.claim.as_ref().and_then(|n| self.server.claims.get(n));
        let intact = claim.is_some_and(|o| o.mark == Mark::None && which(o) && o.labelled);
        let waits = c.phase == Phase::Waiting && self.now < client_stop_by(c.last_sent, wait_lease(self.lease()));
        let open = self.server.lock.as_ref().is_some_and(|l| !l.deleting);
        waits
            && intact
            && open
            && self.server.pods.contains(&i)
            && !self
                .ctrls
                .iter()
                .any(|k| k.noticed.contains_key(c.claim.as_deref().unwrap_or_default()))
    }

    /// One fair round.
    fn fair_round(&mut self) {
        let leader = self.server.leader;
        self.ctrls[leader].leads = true;
        for i in 0..self.clients.len() {
            let c = &self.clients[i];
            match c.phase {
                Phase::Acting => self.release(i, None),
                Phase::Waiting if c.has_been_told() => {
                    if c.held && !may_hold(self.now, c.valid_until, self.lease()) {
                        self.renew(i);
                    }
                    self.hold(i);
                }
                Phase::Waiting if self.wait_ends(i).is_some() => self.learn(i),
                Phase::Waiting if self.cfg.menu.invalids && self.may_read_back(i) => self.read_back(i),
                Phase::Waiting if self.now >= c.renew_due(self.lease()) => self.renew(i),
                Phase::Idle if self.claims_anew(i) => self.create(i),
                _ => {}
            }
        }
        for c in 0..2 {
            self.reconcile(c, true);
        }
    }

    /// Panics unless this state settles within [`ROUNDS`] fair rounds.
    pub(super) fn settle(&self) {
        let mut s = self.clone();
        let waiters: Vec<usize> = (0..s.clients.len()).filter(|i| s.must_be_granted(*i)).collect();
        let learners: Vec<usize> = (0..s.clients.len()).filter(|i| s.must_learn(*i)).collect();
        let deleting = s.server.lock.as_ref().is_some_and(|l| l.deleting);
        // Told of a grant (on its claim, or on one made anew), or gave up on a refusal.
        let learnt = |s: &System, i: usize| s.clients[i].has_been_told() || s.clients[i].gave_up;
        for _ in 0..ROUNDS {
            let granted = waiters.iter().all(|i| s.clients[*i].has_been_told());
            if granted && learners.iter().all(|i| learnt(&s, *i)) && !(deleting && s.server.lock.is_some()) {
                return;
            }
            let before = s.key();
            s.fair_round();
            if s.key() == before {
                let Some(t) = s.next_deadline() else { break };
                s.tick(t);
                s.note_stopped();
            }
        }
        let not = waiters
            .iter()
            .filter(|i| !s.clients[**i].has_been_told())
            .collect::<Vec<_>>();
        let unaware = learners.iter().filter(|i| !learnt(&s, **i)).collect::<Vec<_>>();
        panic!(
            "does not settle: waiters {not:?} never granted, waiters {unaware:?} whose claims were changed \
             never granted on one (nor refused){} after {ROUNDS} fair rounds; at the end: {:?}",
            if deleting {
                ", or the deleted lock never let go"
            } else {
                ""
            },
            s.server
        );
    }
}
