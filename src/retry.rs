//! How watches retry after an error, in the controller and in the client: each watch
//! paces itself, soon and never long after the API server is back; a watch the API
//! server answers with 410 Gone (a restarted API server's answer to the resource
//! version the watch had) relists at once; and an error in one watch pauses no other.
//!
//! kube-runtime's default (800 ms doubling to 30 s, with jitter up to twice that, reset
//! only by an event or after 120 s without an error) grows through an outage: every
//! refused connection doubles it, and the 410 costs one more step before the relist.
//! Its `Controller` also paused *all* its trigger watches on an error from any one, and
//! a paused watch fills no store. Measured here (`outage` integration test): after a
//! 5.8 s kube-apiserver restart the controller saw no claim change for over 55 s and
//! granted the next waiter only when the released claim expired (30–56 s after the
//! release). With the controller's watches paced as here but the client's still on the
//! default, the controller granted at once and the waiter's lock watch learned of it
//! 14.9 s after the release; with both paced, 0.03–8.9 s.

use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use kube::runtime::utils::Backoff;
use kube::runtime::watcher;

/// The first wait after an error.
pub const FIRST: Duration = Duration::from_millis(200);
/// The controller's longest wait: its watches are back at most this long after the
/// API server is. One controller leads, with three watches: once at this wait they
/// cost a down API server 1.5 requests a second.
#[cfg(feature = "controller")]
pub const CONTROLLER_LONGEST: Duration = Duration::from_secs(2);
/// A client's longest wait. Thousands of clients may watch: once at this wait (jittered
/// to 2.5–5 s), 10,000 of them cost a down API server at most 4,000 requests a second,
/// and after it is back each relists one object.
pub const CLIENT_LONGEST: Duration = Duration::from_secs(5);
/// A second 410 Gone this soon after the last one is backed off like any error: lagging
/// watch caches (several API servers, one restarted) could otherwise answer every
/// relist's watch with another, and the watch would list and watch without a pause.
pub const GONE_AGAIN: Duration = Duration::from_secs(10);

/// A watch's backoff: [`FIRST`], doubling up to a longest wait. A jittered one waits
/// between half and all of each step, so clients whose watches failed together (an
/// outage) do not come back together. The watcher passes on an event (which resets a
/// backoff) before each list, even one that then fails, so a reset takes effect only
/// once a longest wait has passed without an error since the last wait ended: a list
/// refused again and again still climbs to the longest wait.
#[derive(Debug, Clone)]
pub struct WatchBackoff {
    step: Duration,
    longest: Duration,
    jitter: bool,
    /// When the last wait ends.
    waited_until: Option<Instant>,
}

impl WatchBackoff {
    /// The controller's: up to [`CONTROLLER_LONGEST`], no jitter (one replica leads).
    #[cfg(feature = "controller")]
    pub fn controller() -> Self {
        WatchBackoff::up_to(CONTROLLER_LONGEST, false)
    }

    /// A client's: up to [`CLIENT_LONGEST`], jittered.
    pub fn client() -> Self {
        WatchBackoff::up_to(CLIENT_LONGEST, true)
    }

    fn up_to(longest: Duration, jitter: bool) -> Self {
        WatchBackoff {
            step: FIRST,
            longest,
            jitter,
            waited_until: None,
        }
    }

    /// The wait after an error at `now`.
    fn wait_at(&mut self, now: Instant) -> Duration {
        let step = self.step;
        self.step = (step * 2).min(self.longest);
        let wait = if self.jitter {
            step.mul_f64(rand::random_range(0.5..=1.0))
        } else {
            step
        };
        self.waited_until = Some(now + wait);
        wait
    }

    /// An event at `now`: back to [`FIRST`] if no error came for a longest wait.
    fn reset_at(&mut self, now: Instant) {
        if self.waited_until.is_none_or(|end| now >= end + self.longest) {
            self.step = FIRST;
        }
    }
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        Some(self.wait_at(Instant::now()))
    }
}

impl Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.reset_at(Instant::now());
    }
}

/// The backoff of the controller's merged trigger stream: none. Every watch in it
/// backs off on its own ([`WatchBackoff`]); pausing the merge on one watch's error
/// would pause the others, and the stores they fill, with it.
#[cfg(feature = "controller")]
#[derive(Debug, Clone, Copy, Default)]
pub struct NoPause;

#[cfg(feature = "controller")]
impl Iterator for NoPause {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        Some(Duration::ZERO)
    }
}

#[cfg(feature = "controller")]
impl Backoff for NoPause {
    fn reset(&mut self) {}
}

/// `events` without a 410 Gone error, so that the backoff after it does not delay the
/// relist the watcher starts on one; a second within [`GONE_AGAIN`] passes on, to be
/// backed off. Any other error passes on too.
pub fn relist_at_once<S, T>(events: S) -> impl Stream<Item = Result<T, watcher::Error>> + Send
where
    S: Stream<Item = Result<T, watcher::Error>> + Send,
    T: Send,
{
    let mut last_gone = None;
    events.filter(move |event| {
        let skip = matches!(event, Err(e) if is_gone(e)) && skip_gone(&mut last_gone, Instant::now());
        if skip {
            tracing::debug!("a watch's resource version is gone: relisting");
        }
        std::future::ready(!skip)
    })
}

/// Whether the API server ended a watch with 410 Gone (the watcher relists next).
fn is_gone(e: &watcher::Error) -> bool {
    matches!(e, watcher::Error::WatchError(status) if status.code == 410)
}

/// Whether a 410 Gone at `now` skips the backoff: the first in [`GONE_AGAIN`] does.
fn skip_gone(last: &mut Option<Instant>, now: Instant) -> bool {
    let skip = last.is_none_or(|at| now >= at + GONE_AGAIN);
    if skip {
        *last = Some(now);
    }
    skip
}

#[cfg(test)]
mod tests {
    use kube::core::Status;

    use super::*;

    #[test]
    #[cfg(feature = "controller")]
    fn the_controller_waits_longer_after_each_error_up_to_two_seconds() {
        let mut b = WatchBackoff::controller();
        let now = Instant::now();
        let waits: Vec<_> = (0..7).map(|_| b.wait_at(now).as_millis()).collect();
        assert_eq!(waits, [200, 400, 800, 1600, 2000, 2000, 2000]);
        // However long the outage, the wait never grows past the longest.
        assert!((0..1000).all(|_| b.wait_at(now) == CONTROLLER_LONGEST));
    }

    #[test]
    fn a_client_waits_between_half_and_all_of_each_step_up_to_five_seconds() {
        let mut b = WatchBackoff::client();
        let now = Instant::now();
        let steps = [200, 400, 800, 1600, 3200, 5000, 5000, 5000];
        for step in steps.map(Duration::from_millis) {
            let wait = b.wait_at(now);
            assert!(wait >= step / 2 && wait <= step, "{wait:?} for a step of {step:?}");
        }
    }

    #[test]
    fn an_event_starts_the_waits_over_only_after_a_longest_wait_without_an_error() {
        let mut b = WatchBackoff::up_to(Duration::from_secs(2), false);
        let t0 = Instant::now();
        assert_eq!(b.wait_at(t0), FIRST);
        assert_eq!(b.wait_at(t0), FIRST * 2); // ends at t0 + 400 ms
        // The watcher's Init before a list that then fails: no reset.
        b.reset_at(t0 + Duration::from_millis(400));
        assert_eq!(b.wait_at(t0 + Duration::from_millis(400)), FIRST * 4); // ends at t0 + 1.2 s
        b.reset_at(t0 + Duration::from_millis(3199));
        assert_eq!(b.wait_at(t0 + Duration::from_millis(3199)), FIRST * 8); // ends at t0 + 4.799 s
        // Quiet for the longest wait after the last wait ended: start over.
        b.reset_at(t0 + Duration::from_millis(6799));
        assert_eq!(b.wait_at(t0 + Duration::from_millis(6800)), FIRST);
        // Never waited: any event resets (nothing to reset).
        let mut fresh = WatchBackoff::up_to(Duration::from_secs(2), false);
        fresh.reset_at(t0);
        assert_eq!(fresh.wait_at(t0), FIRST);
    }

    #[test]
    #[cfg(feature = "controller")]
    fn the_merged_triggers_never_pause() {
        assert!(NoPause.take(100).all(|d| d.is_zero()));
    }

    #[test]
    fn only_a_gone_resource_version_skips_the_backoff() {
        let status = |code| {
            watcher::Error::WatchError(
                Status::failure("too old resource version", "Expired")
                    .with_code(code)
                    .boxed(),
            )
        };
        assert!(is_gone(&status(410)));
        assert!(!is_gone(&status(500)));
        assert!(!is_gone(&status(403)));
        assert!(!is_gone(&watcher::Error::NoResourceVersion));
    }

    #[test]
    fn a_second_gone_within_ten_seconds_is_backed_off() {
        let t0 = Instant::now();
        let mut last = None;
        assert!(skip_gone(&mut last, t0));
        assert!(!skip_gone(&mut last, t0 + Duration::from_secs(1)));
        assert!(!skip_gone(&mut last, t0 + GONE_AGAIN - Duration::from_millis(1)));
        assert!(skip_gone(&mut last, t0 + GONE_AGAIN));
        assert!(!skip_gone(&mut last, t0 + GONE_AGAIN + Duration::from_secs(9)));
    }

    #[tokio::test]
    async fn a_gone_error_is_dropped_and_every_other_item_passes_on() {
        let err = |code| watcher::Error::WatchError(Status::failure("e", "r").with_code(code).boxed());
        let items = futures::stream::iter([Ok(1), Err(err(410)), Ok(2), Err(err(504)), Ok(3), Err(err(410))]);
        let passed: Vec<_> = relist_at_once(items).collect().await;
        let kept: Vec<_> = passed.iter().map(|r| r.as_ref().map_err(is_gone).copied()).collect();
        // The second 410 came within GONE_AGAIN of the first: backed off.
        assert_eq!(kept, [Ok(1), Ok(2), Err(false), Ok(3), Err(true)]);
    }
}
