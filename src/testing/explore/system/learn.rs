//! How a waiting client learns that its claim no longer stands, as the real one does
//! (`client::k8s::wait`): a status records its claim otherwise than it wrote it; a
//! status no longer names the claim it once placed; a status refuses it (it reads the
//! claim back: changed by someone else, it withdraws and claims anew; else it gives up
//! with the refusal); or, once, at its notice time, it reads its unplaced claim back
//! and finds it changed or gone. (The real client reads an unplaced claim back again
//! and again, less and less often; the model's reads it back once, which only makes
//! the liveness it checks harder to keep: the listed refusal must do the rest.) Each ends its wait: it withdraws the claim and claims
//! anew, or (refused, its claim as it wrote it) gives up. Without these, a waiter whose
//! claim a neighbour changed before the lock recorded it could wait for ever unseen:
//! [`super::settle`] requires each such waiter to be granted or to learn.

use super::client::Phase;
use super::objects::{LOCK, claim_lease};
use super::{Step, System};
use crate::api::RefuseReason;
use crate::protocol::{names_claim, record};

/// What ends a waiting client's wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Ended {
    /// A status records its claim otherwise than it wrote it.
    Tampered,
    /// A status no longer names the claim an earlier one placed.
    Dropped,
    /// A status refuses the claim, for this reason.
    Refused(RefuseReason),
}

impl System {
    /// What client `i` (waiting, told of no grant) learns from the lock as stored that
    /// ends its wait, if anything.
    pub(super) fn wait_ends(&self, i: usize) -> Option<Ended> {
        let c = &self.clients[i];
        if c.phase != Phase::Waiting || c.has_been_told() {
            return None;
        }
        let name = c.claim.as_deref()?;
        let status = &self.server.lock.as_ref()?.status;
        if record::check(status, name, &self.wrote(i).written()).is_err() {
            return Some(Ended::Tampered);
        }
        if names_claim(status, name) {
            return None;
        }
        if c.placed {
            return Some(Ended::Dropped);
        }
        let refused = status.refused.iter().find(|r| r.claim == name);
        refused.map(|r| Ended::Refused(r.reason))
    }

    /// Client `i`'s steps of learning: what the lock says ends its wait; its one
    /// read-back of an unplaced claim (where claims' pods may change).
    pub(super) fn learn_steps(&self, i: usize) -> impl Iterator<Item = Step> {
        let learns = self.wait_ends(i).is_some().then_some(Step::Learn(i));
        let reads = (self.cfg.menu.invalids && self.may_read_back(i)).then_some(Step::ReadBack(i));
        learns.into_iter().chain(reads)
    }

    /// Client `i` ends its wait on what the lock says: it withdraws its claim and claims
    /// anew, or gives up with the refusal. Only a claim someone else changed, or a pod
    /// that is gone, or a final reason, may be refused.
    pub(super) fn learn(&mut self, i: usize) {
        let Some(ended) = self.wait_ends(i) else { return };
        let name = self.clients[i].claim.clone().unwrap_or_default();
        let stored = self.server.claims.get(&name);
        let changed = self.stored_as_written(i) == Some(false);
        match ended {
            Ended::Tampered => {
                let early = stored.is_none_or(|o| o.patched_early);
                assert!(
                    early,
                    "client {i}'s record was changed though its claim was patched only after the lock recorded it"
                );
            }
            Ended::Dropped => {}
            Ended::Refused(_) if changed => {}
            Ended::Refused(reason) => {
                assert!(
                    stored.is_none() || reason.is_final() || !self.server.pods.contains(&i),
                    "client {i}'s claim, as it wrote it, is refused ({}) while its pod runs: a lost waiter",
                    reason.as_str()
                );
                self.clients[i].gave_up = true;
                return self.release(i, None); // it gives up
            }
        }
        self.claim_anew(i);
    }

    /// Client `i` withdraws its claim (never acted on) and goes back to claim anew.
    pub(super) fn claim_anew(&mut self, i: usize) {
        self.release(i, None);
        self.clients[i].start_anew();
    }

    /// Whether client `i` may still read its claim back at its notice time: waiting,
    /// told of nothing, its claim neither placed nor refused by the lock as stored.
    pub(super) fn may_read_back(&self, i: usize) -> bool {
        let c = &self.clients[i];
        let Some(status) = self.server.lock.as_ref().map(|l| &l.status) else {
            return false;
        };
        let name = c.claim.as_deref().unwrap_or_default();
        let refused = status.refused.iter().any(|r| r.claim == name);
        c.phase == Phase::Waiting && !c.read_back && !c.has_been_told() && !names_claim(status, name) && !refused
    }

    /// Client `i` reads its unplaced claim back at its notice time: changed or gone, it
    /// claims anew; as it wrote it, it waits on and reads it back no more.
    pub(super) fn read_back(&mut self, i: usize) {
        match self.stored_as_written(i) {
            Some(true) => self.clients[i].read_back = true,
            _ => self.claim_anew(i),
        }
    }

    /// Whether client `i`'s claim, as stored now, is as it wrote it (by the real
    /// [`record::claim_differs`]); `None` when it is gone.
    fn stored_as_written(&self, i: usize) -> Option<bool> {
        let name = self.clients[i].claim.as_deref().unwrap_or_default();
        let stored = self.server.claims.get(name)?;
        Some(record::claim_differs(&claim_lease(name, stored), &self.wrote(i).written(), LOCK).is_none())
    }

    /// A status is written: each waiting client whose claim it names knows its claim
    /// was placed.
    pub(super) fn see_placed(&mut self, status: &crate::api::DistributedLockStatus) {
        for c in self.clients.iter_mut().filter(|c| c.phase == Phase::Waiting) {
            if c.claim.as_deref().is_some_and(|n| names_claim(status, n)) {
                c.placed = true;
            }
        }
    }
}
