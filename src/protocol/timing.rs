//! The timing rules of the claim protocol, on both sides, and the test that ties them
//! together (see the module doc of [`crate::protocol`] for the contract).
//!
//! Every rule is a function of the lease duration so that client and controller cannot
//! drift apart: change one here and the inequality test below judges the pair.

use std::ops::Add;
use std::time::Duration;

/// A moment of a monotonic clock: the controller's (`std::time::Instant`) or a
/// simulated one's (the system model's), so that the controller's memory and its turns
/// run on either.
pub trait Moment: Copy + Ord + Add<Duration, Output = Self> + std::fmt::Debug + Send + Sync + 'static {
    /// How long after `earlier` this is (zero if it is not after).
    fn since(self, earlier: Self) -> Duration;
}

impl Moment for std::time::Instant {
    fn since(self, earlier: Self) -> Duration {
        self.saturating_duration_since(earlier)
    }
}

/// Extra time, beyond the lease duration, before the controller judges a claim
/// expired or a held-back slot free. Covers scheduling delays and clock-rate drift.
pub const EXPIRY_GRACE: Duration = Duration::from_secs(2);

/// The longest lease a lock or a claim may state, in seconds (the CRD's maximum).
pub const MAX_LEASE_SECONDS: i32 = 3600;

/// The shortest time a renewal request may take before it counts as failed.
pub const MIN_RENEW_TIMEOUT: Duration = Duration::from_millis(200);

/// How long before its lease runs out a client gives up its grant: a quarter of the
/// lease duration (at least 250 ms). `leasehold run` uses the same span as the grace
/// between SIGTERM and SIGKILL, so the command is dead by the lease's end.
pub fn safety_margin(lease: Duration) -> Duration {
    (lease / 4).max(Duration::from_millis(250))
}

/// How often a claim is renewed: a third of the lease duration.
pub fn renew_interval(lease: Duration) -> Duration {
    lease / 3
}

/// The least lease a *waiting* claim lives by. A waiter renews every third of its wait
/// lease (80 s), so its writes leave room in a budget of one API request a minute,
/// whatever its lease, for its watch's restarts ([`WATCH_TIMEOUT`]) and fresh reads
/// ([`WAIT_CHECK`]).
pub const WAIT_LEASE: Duration = Duration::from_secs(240);

/// How often a waiting claimant reads its lock afresh beside its watch: the bound on
/// how long a watch stalled on a connection that died without a reset can hide a grant
/// from a client whose transport does not find dead connections itself. A lock client
/// built by [`crate::kubeconfig::watch_client_from`] (`leasehold run`'s) finds one by
/// HTTP/2 PINGs within seconds, at no request. A holder reads every [`renew_interval`].
pub const WAIT_CHECK: Duration = Duration::from_secs(600);

/// The longest pause before a client claims anew within one acquisition
/// ([`claim_anew_pause`]).
pub const CLAIM_ANEW_MAX: Duration = Duration::from_secs(5);

/// How long a client pauses before the `n`th claim of one acquisition (0: its first).
/// None before the first two: a claim dropped, lapsed, held back or tampered with once
/// is claimed anew at once. From the third on, 100 ms doubling up to
/// [`CLAIM_ANEW_MAX`]: a claim that keeps going (someone who may write Leases deleting
/// each one, an API server answering "gone" to every renewal) costs a create every few
/// seconds, not a loop at the API server's pace.
pub fn claim_anew_pause(n: u32) -> Duration {
    match n.checked_sub(2) {
        None => Duration::ZERO,
        Some(k) => Duration::from_millis(100u64.saturating_mul(1u64 << k.min(16))).min(CLAIM_ANEW_MAX),
    }
}

/// How long the API server keeps a client's watch of its lock open before ending it
/// (the client then watches again from where it was: one request).
pub const WATCH_TIMEOUT: Duration = Duration::from_secs(1800);

/// The lease a claim lives by while it waits (stated on the claim, see
/// [`crate::protocol::WAIT_LEASE_ANNOTATION`]): the longer of its lease and [`WAIT_LEASE`].
pub fn wait_lease(lease: Duration) -> Duration {
    lease.max(WAIT_LEASE)
}

/// How often a waiting claim is renewed: a third of its wait lease.
pub fn wait_renew_interval(lease: Duration) -> Duration {
    renew_interval(wait_lease(lease))
}

/// The longest wait between two renewal attempts after a failure (they start 100 ms
/// apart and double up to this): a quarter of the renewal interval, so a holder whose
/// API server comes back tries again within a twelfth of its lease, not only once the
/// doubling allows (at a 15 s lease the attempt after 8.1 s came at 11.3 s, past the
/// holder's deadline of 11.25 s).
pub fn renew_retry_max(lease: Duration) -> Duration {
    (renew_interval(lease) / 4).max(Duration::from_millis(100))
}

/// How long one renewal request may take before it counts as failed.
pub fn renew_timeout(lease: Duration) -> Duration {
    renew_interval(lease).max(MIN_RENEW_TIMEOUT)
}

/// Client side: by when a holder stops its work (`lost()` fires), counted from when the
/// last successful write of its claim was *sent*, on the client's monotonic clock.
pub fn client_stop_by<T: Add<Duration, Output = T>>(sent: T, lease: Duration) -> T {
    sent + lease.saturating_sub(safety_margin(lease))
}

/// Client side: by when `leasehold run` has SIGKILLed its command: the stop plus the
/// SIGTERM grace ([`safety_margin`]).
pub fn command_dead_by<T: Add<Duration, Output = T>>(sent: T, lease: Duration) -> T {
    client_stop_by(sent, lease) + safety_margin(lease)
}

/// Client side: how long a holder that is done keeps retrying a failed release: half
/// the lease. Past that the claim is left to expire (within the lease) rather than keep
/// the caller waiting longer than the expiry itself would.
pub fn release_budget(lease: Duration) -> Duration {
    lease / 2
}

/// Client side: how long a holder waits for the controller's answer to its release
/// notice ([`crate::protocol::notice`]) before it writes the release mark instead: an
/// eighth of the lease, between 125 ms and 1 s. It leaves the mark a whole
/// [`renew_timeout`] within the [`release_budget`], and exceeds [`NOTICE_WAIT`].
pub fn notice_timeout(lease: Duration) -> Duration {
    (lease / 8).clamp(Duration::from_millis(125), Duration::from_secs(1))
}

/// Controller side: how long it waits for the status write a release notice asks for
/// before it answers that the notice was accepted but not yet written.
pub const NOTICE_WAIT: Duration = Duration::from_millis(100);

/// Controller side: how long a new claim whose pod the controller has not seen keeps
/// its place in arrival order, counted from the claim's creation (the API server's
/// second): younger claims are not queued ahead of it meanwhile, since a pod just
/// created may not be in the controller's cache yet. Past it, the claim is refused
/// (`PodNotFound`) and younger claims go ahead. The client waits as long before it
/// gives up on such a refusal (`client::progress::UNQUEUED_NOTICE`).
pub const POD_CACHE_GRACE: Duration = Duration::from_secs(5);

/// Controller side: when an unrenewed claim expires, counted from when this controller
/// *saw* its last renewal (or, for a holder, wrote its grant, whichever is later), by
/// the longer of the lock's and the claim's own lease (its wait lease while it waits).
pub fn controller_expiry<T: Add<Duration, Output = T>>(seen: T, spec_lease: Duration, claim_lease: Duration) -> T {
    seen + spec_lease.max(claim_lease) + EXPIRY_GRACE
}

/// Controller side: the lease a claim is judged by for its expiry. Once the lock's
/// status records the claim, the lease recorded for it (`recorded`: at its grant for a
/// holder, when first queued or designated for a waiter): its owner checked that record
/// (at least the lease it lives by, or it withdraws: [`crate::protocol::record`]), while
/// what the claim states may have been patched since by anyone who may patch Leases,
/// down (a process expired while it acts) or up (a silent process's slot kept for an
/// hour). Before the record, the lease it states. While it waits (`holding` false), the
/// wait lease of that too, or the one it states before the record: its process renews
/// by that.
pub fn judged_lease(
    stated: Duration,
    stated_wait: Option<Duration>,
    recorded: Option<Duration>,
    holding: bool,
) -> Duration {
    let own = recorded.unwrap_or(stated);
    if holding {
        return own;
    }
    match recorded {
        Some(r) => wait_lease(r),
        None => own.max(stated_wait.unwrap_or_default()),
    }
}

/// Controller side: when a revoked holder's held-back slot passes on, counted from
/// when this controller first saw the revocation.
pub fn hold_back_ends<T: Add<Duration, Output = T>>(revoked_seen: T, lease: Duration) -> T {
    revoked_seen + lease + EXPIRY_GRACE
}

/// etcd backend, client side: the TTL, in whole seconds, of the etcd lease a claim key
/// lives on: the lease duration plus [`EXPIRY_GRACE`] (for clock-rate drift between
/// the client and etcd, as on the controller's side), rounded up. etcd may raise a TTL
/// (to its minimum) but never lowers it, and counts it from when it *received* the
/// grant or keep-alive.
pub fn etcd_claim_ttl(lease: Duration) -> i64 {
    (lease + EXPIRY_GRACE).as_millis().div_ceil(1000) as i64
}

/// etcd backend, controller side: the TTL, in whole seconds, of the controller's lease
/// that a claim key is moved onto when its pod is gone but may still run: the longer
/// of the lock's and the claim's lease plus [`EXPIRY_GRACE`], rounded up, counted from
/// the move: etcd counts it from the grant, so the controller keeps the lease alive
/// once the move has landed (`controller::etcd::revoke`). The key keeps its place (its
/// create revision) until then.
pub fn etcd_hold_back_ttl(spec_lease: Duration, claim_lease: Duration) -> i64 {
    let lease = if crate::mutant::on(crate::mutant::Mutant::HoldBackBySpecLease) {
        spec_lease // the lock's lease alone, however long the claim's
    } else {
        spec_lease.max(claim_lease)
    };
    (lease + EXPIRY_GRACE).as_millis().div_ceil(1000) as i64
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// The lease durations the CRD allows, in seconds.
    const LEASES: std::ops::RangeInclusive<u64> = 1..=3600;

    /// The safety inequality for one case: the command of a client whose last
    /// successful renewal was sent at 0 and seen `seen_after` later is dead before the
    /// controller may hand its slot on.
    fn handoff_is_fenced(lease: Duration, spec: Duration, seen_after: Duration) -> bool {
        let sent = Duration::ZERO;
        let seen = sent + seen_after;
        command_dead_by(sent, lease) < controller_expiry(seen, spec, lease)
    }

    #[test]
    fn claims_anew_at_once_twice_then_ever_more_slowly_up_to_the_cap() {
        assert_eq!(claim_anew_pause(0), Duration::ZERO);
        assert_eq!(claim_anew_pause(1), Duration::ZERO);
        assert_eq!(claim_anew_pause(2), Duration::from_millis(100));
        assert_eq!(claim_anew_pause(3), Duration::from_millis(200));
        let pauses: Vec<_> = (0..200).map(claim_anew_pause).collect();
        assert!(pauses.windows(2).all(|w| w[0] <= w[1]), "{pauses:?}");
        assert_eq!(pauses[199], CLAIM_ANEW_MAX);
        assert_eq!(claim_anew_pause(u32::MAX), CLAIM_ANEW_MAX);
    }

    #[test]
    fn every_allowed_lease_stops_the_client_before_the_controller_expires_it() {
        for secs in LEASES {
            let lease = Duration::from_secs(secs);
            // The worst case: the controller sees the write at once, and judges by the
            // client's own lease (the spec's may only be longer).
            assert!(handoff_is_fenced(lease, lease, Duration::ZERO), "lease {secs}s");
            // The SIGTERM grace fits inside the lease, and a renewal is due before the stop.
            assert!(safety_margin(lease) < lease, "lease {secs}s");
            assert!(
                renew_interval(lease) < client_stop_by(Duration::ZERO, lease),
                "lease {secs}s"
            );
        }
    }

    #[test]
    fn a_waiter_costs_at_most_one_request_a_minute_and_is_not_expired_while_it_renews() {
        for secs in LEASES {
            let lease = Duration::from_secs(secs);
            // Its renewals, its fresh reads and its watch's restarts, per minute.
            let per_minute = |every: Duration| 60.0 / every.as_secs_f64();
            let requests = per_minute(wait_renew_interval(lease)) + per_minute(WAIT_CHECK) + per_minute(WATCH_TIMEOUT);
            assert!(requests <= 1.0, "lease {secs}s: {requests:.3} requests a minute");
            assert!(wait_renew_interval(lease) >= renew_interval(lease), "lease {secs}s");
            // A waiter renewing on schedule, each renewal taking as long as it may, and
            // seen at once: the controller judging it by its wait lease never expires it.
            let sent = Duration::ZERO;
            let next_seen = sent + wait_renew_interval(lease) + renew_timeout(lease);
            let expiry = controller_expiry(sent, lease, wait_lease(lease));
            assert!(next_seen < expiry, "lease {secs}s");
        }
    }

    /// A waiter whose last write was sent at 0 (and seen at once) is granted at
    /// `granted_after`; the controller counts the holder's expiry from the later of that
    /// sight and the grant. It acts only while the deadline of an acknowledged write is
    /// ahead: the old one, or a renewal sent `renewed_after` the grant (an acknowledged
    /// renewal is always seen before an expiry: expiry deletes the claim under a
    /// resourceVersion precondition first). Either way it is dead before the expiry; a
    /// silent one is found out by a lease plus grace after its grant.
    fn stale_grant_is_fenced(
        lease: Duration,
        spec: Duration,
        granted_after: Duration,
        renewed_after: Duration,
    ) -> bool {
        let (last_sent, granted) = (Duration::ZERO, granted_after);
        let expiry_from = |seen: Duration| controller_expiry(seen.max(granted), spec, lease);
        let old_write_fenced = command_dead_by(last_sent, lease) < expiry_from(last_sent);
        let renewed = granted + renewed_after;
        let renewal_fenced = command_dead_by(renewed, lease) < expiry_from(renewed);
        let found_out = expiry_from(last_sent) <= granted.max(last_sent) + spec.max(lease) + EXPIRY_GRACE;
        old_write_fenced && renewal_fenced && found_out
    }

    proptest! {
        #[test]
        fn a_waiter_granted_long_after_its_last_write_is_fenced(
            lease_ms in 1_000u64..=3_600_000,
            spec_ms in 1_000u64..=3_600_000,
            granted_after_ms in 0u64..=3_600_000,
            renewed_after_ms in 0u64..=60_000,
        ) {
            let ms = Duration::from_millis;
            prop_assert!(stale_grant_is_fenced(ms(lease_ms), ms(spec_ms), ms(granted_after_ms), ms(renewed_after_ms)));
        }
    }

    #[test]
    fn a_release_notice_is_answered_in_time_and_a_failed_one_leaves_the_mark_its_try() {
        for secs in 1..=MAX_LEASE_SECONDS as u64 {
            let lease = Duration::from_secs(secs);
            assert!(NOTICE_WAIT < notice_timeout(lease), "lease {secs}s");
            assert!(
                notice_timeout(lease) + renew_timeout(lease) <= release_budget(lease),
                "lease {secs}s: notice {:?} + mark {:?} > budget {:?}",
                notice_timeout(lease),
                renew_timeout(lease),
                release_budget(lease)
            );
        }
    }

    #[test]
    fn the_renewal_request_timeout_has_a_floor() {
        assert_eq!(renew_timeout(Duration::from_millis(300)), MIN_RENEW_TIMEOUT);
        assert_eq!(renew_timeout(Duration::from_secs(15)), Duration::from_secs(5));
    }

    /// The etcd backend's inequalities for one case. A client's renewal is a check that
    /// its key is on its lease, *sent* at 0 (and received by etcd `received_after`
    /// later), then a keep-alive received no earlier. Its command is dead (a) before
    /// etcd can expire the lease (TTL counted from the keep-alive's receipt), and (b)
    /// before a controller move made after the check was received, `moved_after`,
    /// can let the moved key expire.
    fn etcd_handoff_is_fenced(
        lease: Duration,
        spec: Duration,
        received_after: Duration,
        moved_after: Duration,
    ) -> bool {
        let dead = command_dead_by(Duration::ZERO, lease);
        let ttl = |secs: i64| Duration::from_secs(secs as u64);
        let lease_expires = received_after + ttl(etcd_claim_ttl(lease));
        let moved_key_expires = received_after + moved_after + ttl(etcd_hold_back_ttl(spec, lease));
        dead < lease_expires && dead < moved_key_expires
    }

    #[test]
    fn every_allowed_lease_stops_an_etcd_client_before_its_key_can_go() {
        for secs in LEASES {
            let lease = Duration::from_secs(secs);
            assert!(
                etcd_handoff_is_fenced(lease, lease, Duration::ZERO, Duration::ZERO),
                "lease {secs}s"
            );
        }
        // Sub-second precision never rounds a TTL below the lease.
        assert_eq!(etcd_claim_ttl(Duration::from_millis(1500)), 4);
        assert_eq!(
            etcd_hold_back_ttl(Duration::from_secs(1), Duration::from_millis(2500)),
            5
        );
    }

    proptest! {
        #[test]
        fn etcd_fenced_for_any_lease_spec_and_delay(
            lease_ms in 1_000u64..=3_600_000,
            spec_ms in 1_000u64..=3_600_000,
            received_after_ms in 0u64..=60_000,
            moved_after_ms in 0u64..=60_000,
        ) {
            let ms = Duration::from_millis;
            prop_assert!(etcd_handoff_is_fenced(ms(lease_ms), ms(spec_ms), ms(received_after_ms), ms(moved_after_ms)));
        }

        #[test]
        fn fenced_for_any_lease_spec_and_delivery_delay(
            lease_ms in 1_000u64..=3_600_000,
            spec_ms in 1_000u64..=3_600_000,
            seen_after_ms in 0u64..=60_000,
        ) {
            let lease = Duration::from_millis(lease_ms);
            let spec = Duration::from_millis(spec_ms);
            prop_assert!(handoff_is_fenced(lease, spec, Duration::from_millis(seen_after_ms)));
        }
    }
}
