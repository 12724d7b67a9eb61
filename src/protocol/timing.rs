//! The timing rules of the claim protocol, on both sides, and the test that ties them
//! together (see the module doc of [`crate::protocol`] for the contract).
//!
//! Every rule is a function of the lease duration so that client and controller cannot
//! drift apart: change one here and the inequality test below judges the pair.

use std::ops::Add;
use std::time::Duration;

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

/// Controller side: when an unrenewed claim expires, counted from when this controller
/// *saw* its last renewal, by the longer of the lock's and the claim's own lease.
pub fn controller_expiry<T: Add<Duration, Output = T>>(seen: T, spec_lease: Duration, claim_lease: Duration) -> T {
    seen + spec_lease.max(claim_lease) + EXPIRY_GRACE
}

/// Controller side: when a revoked holder's held-back slot passes on, counted from
/// when this controller first saw the revocation.
pub fn hold_back_ends<T: Add<Duration, Output = T>>(revoked_seen: T, lease: Duration) -> T {
    revoked_seen + lease + EXPIRY_GRACE
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
    fn the_renewal_request_timeout_has_a_floor() {
        assert_eq!(renew_timeout(Duration::from_millis(300)), MIN_RENEW_TIMEOUT);
        assert_eq!(renew_timeout(Duration::from_secs(15)), Duration::from_secs(5));
    }

    proptest! {
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
