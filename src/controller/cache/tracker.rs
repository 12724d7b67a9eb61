//! The controller's memory, on its own monotonic clock: when it last saw each claim
//! change, the order in which it first saw claims, when it first saw each revocation,
//! and which warnings it already published.
//!
//! A claim's expiry is judged from the moment *this controller* saw its last change
//! (any new resourceVersion), never from the renewTime another machine wrote. After a
//! restart every claim counts as freshly renewed, which only delays expiry (safe).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use kube::ResourceExt;

use crate::decide::Arrival;
use crate::protocol::timing::{self, Moment};

/// (namespace, name) of a namespaced object.
pub type Key = (String, String);

/// What the controller saw of one claim.
#[derive(Clone, Debug)]
struct Seen<T> {
    /// The holder's last `spec.renewTime`: only its change counts as a renewal, not
    /// the controller's own stamp or anyone's annotation.
    renew_time: String,
    changed_at: T,
    /// When this controller first saw the release mark.
    released_at: Option<T>,
    seq: u64,
    uid: String,
    /// Its `leasehold.dev/requested-at`, in microseconds (fixed at creation).
    requested_micros: i64,
    /// The relist generation in which the claim was last listed or changed.
    epoch: u64,
}

/// The controller's memory of claims and revocations, fed by the watch streams, on the
/// clock `T` (the controller's; the system model's simulated one). Ordered maps, so
/// that the memory of two controllers that saw the same is the same, also as printed.
#[derive(Clone, Debug)]
pub struct Tracker<T = Instant> {
    claims: BTreeMap<Key, Seen<T>>,
    next_seq: u64,
    /// Counts relists of the claim watch; claims not seen in the latest are forgotten.
    epoch: u64,
    /// (namespace, lock, claim) -> when this controller first saw it revoked.
    revoked: BTreeMap<(String, String, String), T>,
    /// Revoked holders' claims out of view that a read by name found gone.
    strays_gone: BTreeSet<(String, String, String)>,
    /// Revoked holders' claims out of view that a read by name found still there, and
    /// whose deletion under that read conflicted (written since: renewed); looked up
    /// again once the hold-back, counted from then, is over.
    strays_renewed: BTreeSet<(String, String, String)>,
    /// Warnings already published, by object uid, with their reasons: each is said
    /// once (by uid first, so a claim's go with it in one step: a flood of claims
    /// deleted at once costs a removal apiece).
    warned: BTreeMap<String, BTreeSet<&'static str>>,
    /// UIDs of pods whose objects went away after the kubelet reported them stopped,
    /// with when this controller saw that (forgotten after [`STOPPED_POD_MEMORY`]).
    stopped_pods: BTreeMap<String, T>,
}

impl<T> Default for Tracker<T> {
    fn default() -> Self {
        Tracker {
            claims: BTreeMap::new(),
            next_seq: 0,
            epoch: 0,
            revoked: BTreeMap::new(),
            strays_gone: BTreeSet::new(),
            strays_renewed: BTreeSet::new(),
            warned: BTreeMap::new(),
            stopped_pods: BTreeMap::new(),
        }
    }
}

/// How long the tracker remembers that a deleted pod had stopped.
pub const STOPPED_POD_MEMORY: Duration = Duration::from_secs(3600);

// === impl Tracker ===

impl<T: Moment> Tracker<T> {
    /// Every moment it remembers, mapped by `f` (the system model takes them relative to
    /// its clock's now, so that memories alike compare alike).
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn map_moments(&mut self, f: impl Fn(T) -> T) {
        for s in self.claims.values_mut() {
            s.changed_at = f(s.changed_at);
            s.released_at = s.released_at.map(&f);
        }
        self.revoked.values_mut().for_each(|t| *t = f(*t));
        self.stopped_pods.values_mut().for_each(|t| *t = f(*t));
    }

    /// Record a claim seen in a watch event (or a list); a new `spec.renewTime`
    /// counts as a renewal seen now.
    pub fn observe(&mut self, lease: &Lease, now: T) {
        let key = (lease.namespace().unwrap_or_default(), lease.name_any());
        let renewed = renew_time(lease);
        let epoch = self.epoch;
        let released = crate::protocol::claim::has_release_mark(lease).then_some(now);
        match self.claims.get_mut(&key) {
            Some(seen) if seen.renew_time == renewed => {
                seen.epoch = epoch;
                seen.released_at = seen.released_at.or(released);
            }
            Some(seen) => {
                seen.renew_time = renewed;
                seen.changed_at = now;
                seen.epoch = epoch;
                seen.released_at = seen.released_at.or(released);
            }
            None => {
                self.next_seq += 1;
                let seen = Seen {
                    renew_time: renewed,
                    changed_at: now,
                    released_at: released,
                    seq: self.next_seq,
                    uid: lease.uid().unwrap_or_default(),
                    requested_micros: crate::protocol::claim::requested_micros(lease),
                    epoch,
                };
                self.claims.insert(key, seen);
            }
        }
    }

    /// `claim`'s expiry counts from no earlier than `now` (only ever later: safe). Called
    /// as this controller writes its grant: a waiter renews slowly (its wait lease), so
    /// as a holder it has a whole lease from its grant to renew, and a silent one is
    /// found out a lease after its grant. And when an expiry's deletion failed.
    pub fn restart_expiry(&mut self, ns: &str, claim: &str, now: T) {
        if let Some(seen) = self.claims.get_mut(&(ns.to_string(), claim.to_string())) {
            seen.changed_at = seen.changed_at.max(now);
        }
    }

    /// Whether `fresh` (read just now) shows a renewal of `claim` (the claim as the plan
    /// that judged it expired saw it) that the plan or this tracker has not seen. Both
    /// count: the watch may show the renewal between the plan and the read, and then the
    /// tracker alone would take the read for nothing new.
    pub fn renewed_since(&self, claim: &Lease, fresh: &Lease) -> bool {
        let key = (claim.namespace().unwrap_or_default(), claim.name_any());
        let renewed = renew_time(fresh);
        renew_time(claim) != renewed || self.claims.get(&key).is_none_or(|s| s.renew_time != renewed)
    }

    /// Forget a deleted claim, and the warnings said about it. A revoked holder's
    /// hold-back counts from no earlier than now: it may have renewed its claim until
    /// just before the deletion.
    pub fn forget(&mut self, lease: &Lease, now: T) {
        let key = (lease.namespace().unwrap_or_default(), lease.name_any());
        if let Some(lock) = crate::protocol::claim::claim_lock(lease) {
            let revoked = (key.0.clone(), lock.to_string(), key.1.clone());
            if let Some(from) = self.revoked.get_mut(&revoked) {
                *from = (*from).max(now);
            }
        }
        if let Some(seen) = self.claims.remove(&key) {
            self.warned.remove(&seen.uid);
        }
    }

    /// The claim watch starts a relist: claims it does not list again were deleted
    /// while the watch was down.
    pub fn relist_started(&mut self) {
        self.epoch += 1;
    }

    /// The relist is complete: forget the claims it did not list.
    pub fn relist_done(&mut self) {
        let epoch = self.epoch;
        let gone: Vec<String> = self
            .claims
            .values()
            .filter(|s| s.epoch != epoch)
            .map(|s| s.uid.clone())
            .collect();
        self.claims.retain(|_, s| s.epoch == epoch);
        for uid in gone {
            self.warned.remove(&uid);
        }
    }

    /// When a claim's lease (plus grace) runs out, judged from its last seen change.
    pub fn expires_at(&mut self, lease: &Lease, spec: Duration, own: Duration, now: T) -> T {
        self.observe(lease, now);
        timing::controller_expiry(self.changed_at(lease, now), spec, own)
    }

    /// When this controller last saw the claim change (`now`, if never seen).
    pub fn changed_at(&self, lease: &Lease, now: T) -> T {
        self.last_change(lease).unwrap_or(now)
    }

    /// When this controller last saw the claim change; `None` for a claim it does not
    /// follow (never seen, or deleted: a tombstone's last state).
    pub fn last_change(&self, lease: &Lease) -> Option<T> {
        let key = (lease.namespace().unwrap_or_default(), lease.name_any());
        self.claims.get(&key).map(|s| s.changed_at)
    }

    /// When this controller first saw the claim's release mark (`now`, if never seen).
    pub fn released_at(&self, lease: &Lease, now: T) -> T {
        let key = (lease.namespace().unwrap_or_default(), lease.name_any());
        self.claims.get(&key).and_then(|s| s.released_at).unwrap_or(now)
    }

    /// The claim's arrival key, for FIFO order among claims not yet queued.
    pub fn arrival(&self, lease: &Lease) -> Arrival {
        let key = (lease.namespace().unwrap_or_default(), lease.name_any());
        let seen = self
            .claims
            .get(&key)
            .filter(|s| Some(&s.uid) == lease.metadata.uid.as_ref());
        Arrival {
            created_secs: lease.creation_timestamp().map(|t| t.0.as_second()).unwrap_or_default(),
            // Read once, when first seen (it is fixed at creation; parsing it for every
            // claim on every pass cost a flood's reconciles most of their time).
            requested_micros: seen.map_or_else(
                || crate::protocol::claim::requested_micros(lease),
                |s| s.requested_micros,
            ),
            seen_seq: self.claims.get(&key).map(|s| s.seq).unwrap_or(u64::MAX),
        }
    }

    /// When a revoked holder's hold-back delay ends: `duration` (the longest lease the
    /// holder may be living by) plus grace after this controller first saw the
    /// revocation, or saw the claim renewed after it (`renewed`), whichever is later.
    pub fn hold_back_ends(
        &mut self,
        ns: &str,
        lock: &str,
        claim: &str,
        duration: Duration,
        renewed: Option<T>,
        now: T,
    ) -> T {
        let from = self
            .revoked
            .entry((ns.into(), lock.into(), claim.into()))
            .or_insert(now);
        *from = (*from).max(renewed.unwrap_or(*from));
        timing::hold_back_ends(*from, duration)
    }

    /// Record a pod object's deletion; remembered when its last state shows it stopped.
    pub fn pod_departed(&mut self, pod: &Pod, now: T) {
        self.stopped_pods.retain(|_, at| now.since(*at) < STOPPED_POD_MEMORY);
        if pod_stopped(pod) {
            self.stopped_pods.insert(pod.uid().unwrap_or_default(), now);
        }
    }

    /// Whether the pod with this UID went away after the kubelet reported it stopped.
    pub fn pod_stopped(&self, uid: &str) -> bool {
        self.stopped_pods.contains_key(uid)
    }

    /// Drop revocation memories of a lock that are no longer in its status.
    pub fn retain_revoked(&mut self, ns: &str, lock: &str, still: &BTreeSet<String>) {
        let kept = |(n, l, c): &(String, String, String)| !(n == ns && l == lock) || still.contains(c);
        self.revoked.retain(|k, _| kept(k));
        self.strays_gone.retain(kept);
        self.strays_renewed.retain(kept);
    }

    /// This controller just deleted a revoked holder's claim that was out of its view:
    /// the holder may have renewed it until then, so its hold-back counts from `now`.
    pub fn restart_hold_back(&mut self, ns: &str, lock: &str, claim: &str, now: T) {
        let from = self
            .revoked
            .entry((ns.into(), lock.into(), claim.into()))
            .or_insert(now);
        *from = (*from).max(now);
    }

    /// A read by name found a revoked holder's claim gone, or this controller deleted it
    /// (no later renewal can land).
    pub fn found_stray_gone(&mut self, ns: &str, lock: &str, claim: &str) {
        self.strays_gone.insert((ns.into(), lock.into(), claim.into()));
    }

    /// A read by name found a revoked holder's claim still there, and deleting it under
    /// that read conflicted: it was written since, so it counts as renewed now, as a
    /// conflicting expiry does ([`Tracker::restart_hold_back`]); it is looked up again
    /// when that hold-back is over, not at once (a neighbour who keeps writing it would
    /// keep the lock looking it up).
    pub fn found_stray_renewed(&mut self, ns: &str, lock: &str, claim: &str, now: T) {
        self.restart_hold_back(ns, lock, claim, now);
        self.strays_renewed.insert((ns.into(), lock.into(), claim.into()));
    }

    /// Whether a stray's look-up is due: never looked up, or found renewed and its
    /// hold-back since (ending at `ends`) is over; never once found gone.
    pub fn stray_due(&self, ns: &str, lock: &str, claim: &str, ends: T, now: T) -> bool {
        let key = (ns.into(), lock.into(), claim.into());
        !self.strays_gone.contains(&key) && (!self.strays_renewed.contains(&key) || now >= ends)
    }

    /// Whether [`Tracker::found_stray_gone`] was said of this revoked holder's claim.
    pub fn stray_gone(&self, ns: &str, lock: &str, claim: &str) -> bool {
        self.strays_gone.contains(&(ns.into(), lock.into(), claim.into()))
    }

    /// True the first time a warning of this reason is raised for this object.
    pub fn first_warning(&mut self, uid: &str, reason: &'static str) -> bool {
        match self.warned.get_mut(uid) {
            Some(reasons) => reasons.insert(reason),
            None => {
                self.warned.insert(uid.to_string(), BTreeSet::from([reason]));
                true
            }
        }
    }
}

/// Whether the kubelet's own report says every process of the pod has stopped: every
/// container (init and sidecar containers included) is in state terminated. A final
/// phase alone is not proof: the pod garbage collector marks the pods of a deleted
/// node `Failed` without anyone having stopped them.
pub fn pod_stopped(pod: &Pod) -> bool {
    let Some(status) = pod.status.as_ref() else {
        return false;
    };
    let terminated = |cs: &Option<Vec<ContainerStatus>>| {
        cs.iter()
            .flatten()
            .all(|c| c.state.as_ref().is_some_and(|s| s.terminated.is_some()))
    };
    let containers = status.container_statuses.as_deref().unwrap_or_default();
    !containers.is_empty() && terminated(&status.container_statuses) && terminated(&status.init_container_statuses)
}

/// A claim's `spec.renewTime` as written (empty when absent).
fn renew_time(lease: &Lease) -> String {
    let time = lease.spec.as_ref().and_then(|s| s.renew_time.as_ref());
    time.map(|t| t.0.to_string()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
    use k8s_openapi::jiff::Timestamp;

    use super::*;

    /// Claim `name` as renewed at second `renewed`.
    fn claim(name: &str, renewed: &str) -> Lease {
        let secs: i64 = renewed.parse().unwrap();
        Lease {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                uid: Some(format!("uid-{name}")),
                resource_version: Some(format!("rv-{renewed}")),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                renew_time: Some(MicroTime(Timestamp::from_second(secs).unwrap())),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn a_new_renew_time_counts_as_a_renewal_seen_now() {
        let mut t = Tracker::default();
        let t0 = Instant::now();
        t.observe(&claim("a", "1"), t0);
        t.observe(&claim("a", "1"), t0 + Duration::from_secs(5));
        assert_eq!(t.changed_at(&claim("a", "1"), t0), t0, "the same renewal is no renewal");
        t.observe(&claim("a", "2"), t0 + Duration::from_secs(6));
        assert_eq!(t.changed_at(&claim("a", "2"), t0), t0 + Duration::from_secs(6));
    }

    #[test]
    fn a_holder_granted_long_after_its_last_renewal_has_a_lease_from_its_grant() {
        let mut t = Tracker::default();
        let (t0, secs) = (Instant::now(), Duration::from_secs);
        let (lease, wait) = (secs(15), crate::protocol::timing::WAIT_LEASE);
        let a = claim("a", "1");
        // Waiting, judged by its wait lease: a minute without a renewal is no expiry.
        assert!(t.expires_at(&a, lease, wait, t0) > t0 + secs(60));
        // Granted 100 s after its last renewal: not expired at the grant, and found
        // out within one lease plus grace of it if it stays silent.
        let granted = t0 + secs(100);
        t.restart_expiry("ns", "a", granted);
        let expires = t.expires_at(&a, lease, lease, granted);
        assert_eq!(expires, granted + lease + crate::protocol::timing::EXPIRY_GRACE);
        // A grant never moves an expiry earlier.
        t.restart_expiry("ns", "a", t0);
        assert_eq!(t.expires_at(&a, lease, lease, granted), expires);
    }

    #[test]
    fn writes_other_than_the_holders_renewal_do_not_count() {
        let mut t = Tracker::default();
        let t0 = Instant::now();
        t.observe(&claim("a", "1"), t0);
        // The controller's stamp, or a neighbour's annotation: a new resourceVersion only.
        let mut stamped = claim("a", "1");
        stamped.metadata.resource_version = Some("rv-stamped".into());
        stamped
            .metadata
            .annotations
            .get_or_insert_default()
            .insert("example.com/note".into(), "x".into());
        t.observe(&stamped, t0 + Duration::from_secs(5));
        assert_eq!(t.changed_at(&stamped, t0), t0);
        assert!(!t.renewed_since(&claim("a", "1"), &stamped));
        assert!(t.renewed_since(&claim("a", "1"), &claim("a", "3")));
    }

    /// A plan judged claim a expired from its renewal 1; before the fresh read, the
    /// watch (back from an outage) shows renewal 3. The read's 3 is still a renewal the
    /// plan did not see: expiring the claim would revoke a live holder.
    #[test]
    fn a_renewal_the_watch_shows_between_the_plan_and_the_read_counts() {
        let mut t = Tracker::default();
        let t0 = Instant::now();
        t.observe(&claim("a", "1"), t0);
        let planned = claim("a", "1");
        t.observe(&claim("a", "3"), t0 + Duration::from_secs(20));
        assert!(t.renewed_since(&planned, &claim("a", "3")));
    }

    #[test]
    fn a_relist_forgets_claims_deleted_while_the_watch_was_down() {
        let mut t = Tracker::default();
        let t0 = Instant::now();
        t.observe(&claim("a", "1"), t0);
        t.observe(&claim("b", "1"), t0);
        assert!(t.first_warning("uid-a", "InvalidClaim"));
        t.relist_started();
        t.observe(&claim("b", "1"), t0);
        t.relist_done();
        assert_eq!(t.arrival(&claim("a", "1")).seen_seq, u64::MAX, "a is forgotten");
        assert_eq!(t.arrival(&claim("b", "1")).seen_seq, 2, "b keeps its place");
        assert!(t.first_warning("uid-a", "InvalidClaim"), "a's warnings went with it");
    }

    #[test]
    fn forgetting_a_claim_prunes_its_warnings() {
        let mut t = Tracker::default();
        t.observe(&claim("a", "1"), Instant::now());
        assert!(t.first_warning("uid-a", "InvalidClaim"));
        assert!(!t.first_warning("uid-a", "InvalidClaim"));
        t.forget(&claim("a", "1"), Instant::now());
        assert!(t.first_warning("uid-a", "InvalidClaim"));
    }
}
