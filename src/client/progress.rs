//! What a waiting claim tells its listeners ([`WaitEvent`]), each thing once: its place
//! in the queue when it changes, that the lock does not exist, and that no controller
//! has placed the claim within [`UNQUEUED_NOTICE`].

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::WaitStatus;
use crate::api::DistributedLockStatus;

/// How long a claim may stay in neither the holders nor the queue of an existing lock
/// before [`WaitEvent::Unqueued`] says so (a running controller places it in
/// milliseconds).
pub const UNQUEUED_NOTICE: Duration = Duration::from_secs(5);

/// Something worth telling a user while a claim waits.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum WaitEvent {
    /// The claim's place in the queue changed.
    Queued(WaitStatus),
    /// The DistributedLock does not exist (yet): the claim waits for it to be created.
    LockMissing,
    /// The lock exists, but no controller has placed the claim (among its holders or
    /// in its queue) for `waited`: is one running?
    Unqueued {
        /// The claim Lease's name.
        claim: String,
        /// How long the claim has gone unplaced.
        waited: Duration,
    },
}

/// A listener for wait events.
pub(crate) type Listener = Arc<dyn Fn(&WaitEvent) + Send + Sync>;

/// One waiting claim's progress, told to the listeners as it changes.
pub(crate) struct Progress<'a> {
    listeners: &'a [Listener],
    claim: &'a str,
    /// Whether the lock existed when last seen.
    exists: bool,
    /// Since when the claim has been unplaced while its lock exists; `None` while the
    /// lock is missing, and for good once the claim was placed or the notice given.
    unplaced_since: Option<Instant>,
    /// The claim was placed, or the notice given: no notice (again).
    settled: bool,
    queued: Option<WaitStatus>,
}

// === impl Progress ===

impl<'a> Progress<'a> {
    /// A claim created at `created` for a lock that `exists` (as read just before).
    pub fn new(listeners: &'a [Listener], claim: &'a str, created: Instant, exists: bool) -> Self {
        let mut progress = Progress {
            listeners,
            claim,
            exists: true,
            unplaced_since: Some(created),
            settled: false,
            queued: None,
        };
        if !exists {
            progress.lock_missing();
        }
        progress
    }

    /// When [`Progress::notice_due`] should be called, if ever.
    pub fn notice_at(&self) -> Option<Instant> {
        self.unplaced_since.map(|since| since + UNQUEUED_NOTICE)
    }

    /// The lock does not exist (now).
    pub fn lock_missing(&mut self) {
        if self.exists {
            self.tell(&WaitEvent::LockMissing);
        }
        self.exists = false;
        self.unplaced_since = None; // no controller places claims on a missing lock
    }

    /// The lock exists with `status` at `now` (the claim is not granted).
    pub fn lock_seen(&mut self, status: &DistributedLockStatus, now: Instant) {
        self.exists = true;
        let placed = status.holders.iter().any(|h| h.claim == self.claim);
        let position = status.queue.iter().position(|w| w.claim == self.claim);
        if placed || position.is_some() {
            self.settled = true;
            self.unplaced_since = None;
        } else if !self.settled && self.unplaced_since.is_none() {
            self.unplaced_since = Some(now);
        }
        if let Some(pos) = position {
            let queued = WaitStatus {
                position: pos + 1,
                holders: status.holders.iter().map(|h| h.pod.clone()).collect(),
            };
            if self.queued.as_ref() != Some(&queued) {
                self.tell(&WaitEvent::Queued(queued.clone()));
                self.queued = Some(queued);
            }
        }
    }

    /// The time from [`Progress::notice_at`] has come: tell that the claim is unplaced.
    pub fn notice_due(&mut self, now: Instant) {
        let Some(since) = self.unplaced_since else { return };
        if now < since + UNQUEUED_NOTICE {
            return;
        }
        self.settled = true;
        self.unplaced_since = None;
        self.tell(&WaitEvent::Unqueued {
            claim: self.claim.into(),
            waited: now - since,
        });
    }

    fn tell(&self, event: &WaitEvent) {
        for listener in self.listeners {
            listener(event);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::api::{Holder, Waiter};

    const CLAIM: &str = "l-abc";

    /// Listeners that record what they were told.
    fn recorder() -> (Vec<Listener>, Arc<Mutex<Vec<WaitEvent>>>) {
        let told = Arc::new(Mutex::new(Vec::new()));
        let t = told.clone();
        let listener: Listener = Arc::new(move |e: &WaitEvent| t.lock().unwrap().push(e.clone()));
        (vec![listener], told)
    }

    fn status(holders: &[(&str, &str)], queue: &[(&str, &str)]) -> DistributedLockStatus {
        let mut st = DistributedLockStatus::default();
        for (claim, pod) in holders {
            let holder: Holder = serde_json::from_value(serde_json::json!({
                "claim": claim, "pod": pod, "podUID": "u", "fencingToken": 1,
                "grantedAt": "2024-01-01T00:00:00Z",
            }))
            .unwrap();
            st.holders.push(holder);
        }
        for (claim, pod) in queue {
            let waiter: Waiter = serde_json::from_value(serde_json::json!({
                "claim": claim, "pod": pod, "podUID": "u", "requestedAt": "2024-01-01T00:00:00Z",
            }))
            .unwrap();
            st.queue.push(waiter);
        }
        st
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn an_unplaced_claim_is_told_once_after_the_notice_time() {
        let (listeners, told) = recorder();
        let t0 = Instant::now();
        let mut p = Progress::new(&listeners, CLAIM, t0, true);
        p.lock_seen(&status(&[("other", "a")], &[]), t0 + secs(1));
        assert_eq!(p.notice_at(), Some(t0 + UNQUEUED_NOTICE));
        p.notice_due(t0 + secs(1)); // early: nothing
        p.notice_due(t0 + UNQUEUED_NOTICE);
        p.lock_seen(&status(&[("other", "a")], &[]), t0 + secs(6));
        assert_eq!(p.notice_at(), None);
        let expected = WaitEvent::Unqueued {
            claim: CLAIM.into(),
            waited: UNQUEUED_NOTICE,
        };
        assert_eq!(*told.lock().unwrap(), [expected]);
    }

    #[test]
    fn a_placed_claim_is_never_told_unplaced_and_its_queue_place_is_told_on_change() {
        let (listeners, told) = recorder();
        let t0 = Instant::now();
        let mut p = Progress::new(&listeners, CLAIM, t0, true);
        p.lock_seen(&status(&[("h", "a")], &[("w", "b"), (CLAIM, "me")]), t0);
        p.lock_seen(&status(&[("h", "a")], &[("w", "b"), (CLAIM, "me")]), t0);
        p.lock_seen(&status(&[("w", "b")], &[(CLAIM, "me")]), t0);
        assert_eq!(p.notice_at(), None);
        p.notice_due(t0 + secs(60));
        let queued = |position, holder: &str| {
            WaitEvent::Queued(WaitStatus {
                position,
                holders: vec![holder.into()],
            })
        };
        assert_eq!(*told.lock().unwrap(), [queued(2, "a"), queued(1, "b")]);
    }

    #[test]
    fn a_missing_lock_is_told_once_per_disappearance_and_restarts_the_notice_time() {
        let (listeners, told) = recorder();
        let t0 = Instant::now();
        let mut p = Progress::new(&listeners, CLAIM, t0, false);
        p.lock_missing();
        assert_eq!(p.notice_at(), None, "no controller places claims on a missing lock");
        p.lock_seen(&status(&[], &[]), t0 + secs(10));
        assert_eq!(p.notice_at(), Some(t0 + secs(10) + UNQUEUED_NOTICE));
        p.lock_missing();
        p.lock_missing();
        assert_eq!(*told.lock().unwrap(), [WaitEvent::LockMissing, WaitEvent::LockMissing]);
    }
}
