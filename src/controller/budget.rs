//! The event budget: Normal events (Granted, Released, SlotFreed, Dropped) are a token
//! bucket's worth across the whole controller — every grant's event while locks are
//! quiet, a bounded trickle under load — because events are API writes, and at scale
//! they would cost more than the grants themselves. Warning events (revocations, bad
//! claims, an unreachable etcd) have a budget of their own, ten times larger: they
//! are what users look for, but a storm of them (10,000 claims of a deleted lock, each
//! warned once) must not become 10,000 API writes and as many requests held in memory
//! at once. Suppressed events are counted in the `leasehold_events_suppressed` metric;
//! every warning is logged either way.

use std::sync::Mutex;
use std::time::Instant;

/// How many Normal events may go at once after a quiet spell.
pub const EVENT_BURST: f64 = 50.0;
/// How many Normal events per second may go under sustained load.
pub const EVENTS_PER_SECOND: f64 = 10.0;

/// How many Warning events may go at once after a quiet spell.
pub const WARNING_BURST: f64 = 500.0;
/// How many Warning events per second may go under sustained load.
pub const WARNINGS_PER_SECOND: f64 = 100.0;

/// A token bucket, filled at `rate` per second up to `burst`.
#[derive(Debug)]
pub struct Budget {
    burst: f64,
    rate: f64,
    state: Mutex<(f64, Instant)>,
}

impl Default for Budget {
    fn default() -> Self {
        Budget::new(EVENT_BURST, EVENTS_PER_SECOND, Instant::now())
    }
}

impl Budget {
    /// The Warning events' budget, full at `now`.
    pub fn warnings(now: Instant) -> Self {
        Budget::new(WARNING_BURST, WARNINGS_PER_SECOND, now)
    }

    /// A full bucket of `burst` tokens at `now`, refilled at `rate` per second.
    pub fn new(burst: f64, rate: f64, now: Instant) -> Self {
        Budget {
            burst,
            rate,
            state: Mutex::new((burst, now)),
        }
    }

    /// Take one token at `now` if there is one.
    pub fn take(&self, now: Instant) -> bool {
        let mut state = self.state.lock().expect("budget lock poisoned");
        let (tokens, at) = *state;
        let elapsed = now.saturating_duration_since(at).as_secs_f64();
        let tokens = (tokens + elapsed * self.rate).min(self.burst);
        let (left, taken) = if tokens >= 1.0 {
            (tokens - 1.0, true)
        } else {
            (tokens, false)
        };
        *state = (left, now.max(at));
        taken
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_burst_goes_then_the_rate_holds() {
        let t0 = Instant::now();
        let b = Budget::new(3.0, 2.0, t0);
        assert_eq!((0..5).filter(|_| b.take(t0)).count(), 3, "the burst");
        assert!(!b.take(t0 + Duration::from_millis(100)), "0.2 tokens are no token");
        assert!(b.take(t0 + Duration::from_millis(500)), "one token per half second");
        assert!(!b.take(t0 + Duration::from_millis(600)));
        // A long quiet spell refills only up to the burst.
        let later = t0 + Duration::from_secs(3600);
        assert_eq!((0..10).filter(|_| b.take(later)).count(), 3);
    }

    #[test]
    fn a_storm_of_warnings_is_bounded_and_larger_than_the_normal_budget() {
        let t0 = Instant::now();
        let w = Budget::warnings(t0);
        let storm = (0..10_000).filter(|_| w.take(t0)).count();
        assert_eq!(storm, WARNING_BURST as usize, "10,000 warnings at once: the burst goes");
        let second = (0..10_000).filter(|_| w.take(t0 + Duration::from_secs(1))).count();
        assert_eq!(second, WARNINGS_PER_SECOND as usize);
        const { assert!(WARNING_BURST > EVENT_BURST && WARNINGS_PER_SECOND > EVENTS_PER_SECOND) };
    }
}
