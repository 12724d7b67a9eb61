//! Observation: the stored claims and pods of one lock, and the tracker's clock,
//! turned into the decide core's inputs; then the decision, with when to look again.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ContainerState, ContainerStateTerminated, ContainerStatus, Pod, PodStatus};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use super::sweep::Tombstone;
use crate::api::{DistributedLock, DistributedLockStatus};
use crate::controller::cache::tracker::Tracker;
use crate::decide::{ClaimView, Decision, IgnoreReason, PodView, World, decide};
use crate::protocol::claim;
use crate::protocol::record::{self, Recorded, Tampered, Written};
use crate::protocol::release::{self, Mark};
use crate::protocol::timing::{self, MAX_LEASE_SECONDS, Moment};

/// A Warning event to publish on a claim: (claim, reason, note).
pub type Warning = (Arc<Lease>, &'static str, String);

/// What a turn reads of its controller's caches, on the clock `T`: the claims and pods
/// as watched, the claims remembered after their deletion, the release notices taken,
/// the deletions sent, and the wall clock. The controller's are its watches' stores
/// ([`super::Live`]); the system model's, its simulated ones.
pub trait Caches<T: Moment> {
    /// The lock's claims in the claim cache (labelled for it, not being deleted).
    fn claims(&self, lock: &DistributedLock) -> Vec<Arc<Lease>>;
    /// The lock's claims remembered after their deletion ([`super::sweep::Tombstones`]).
    fn tombstones(&self, ns: &str, lock: &str, now: T) -> Vec<Tombstone>;
    /// When a release notice of `claim` that proves its release against `hash` was
    /// taken, if one was ([`super::notices`]).
    fn noticed(&self, ns: &str, claim: &str, hash: Option<&str>) -> Option<T>;
    /// What the pod cache knows of the pods of these names.
    fn pods(&self, ns: &str, names: &mut dyn Iterator<Item = &str>) -> BTreeMap<String, PodView>;
    /// Whether this controller sent the claim's deletion and has not seen it go.
    fn deleting(&self, ns: &str, claim: &str) -> bool;
    /// The wall clock: written into status (informational), and a new lock's token
    /// epoch.
    fn wall(&self) -> Timestamp;
}

/// What one decision plans, with when to look again, on the clock `T`.
pub struct Plan<T> {
    /// The decide core's outcome.
    pub decision: Decision,
    /// The next time-based transition (expiry, end of a hold-back), if any.
    pub next_deadline: Option<T>,
    /// Warning events to publish on claims (each claim's first only): (claim, reason, note).
    pub warnings: Vec<Warning>,
    /// How many of the lock's claims are rejected now (invalid, forged, or naming no
    /// live pod); a note on an odd lease is no rejection.
    pub rejected: usize,
    /// Released claims with when this controller saw the release, for the handoff metric.
    pub released_seen: Vec<(String, T)>,
    /// The claims the status names judged expired, to be confirmed with a fresh read
    /// before acting.
    pub expired: Vec<Arc<Lease>>,
    /// The claims the status does not name judged expired: no slot passes by them, so
    /// they take no fresh read in the reconcile (a flood of them, expiring together,
    /// would hold it up for a round trip apiece); each is deleted after the write only
    /// as it was seen here ([`super::claims::delete_as_read`]), so one renewed since
    /// stays.
    pub expire_unnamed: Vec<Arc<Lease>>,
    /// Revoked holders' claims out of this controller's view at their hold-back's end,
    /// to be looked up by name before the slot passes on (see [`super::strays`]).
    pub strays: Vec<String>,
}

/// Observe the stores and the tracker, and decide: the claims in view
/// ([`in_view`]), each judged ([`judge_claims`]), the revoked holders whose hold-back is
/// over ([`hold_backs_over`]), the decision on that world, then what it leaves to look
/// up or to wait for ([`after_decision`]) and the warnings worth an event ([`warnings`]).
pub fn plan<T: Moment>(lock: &DistributedLock, caches: &impl Caches<T>, tracker: &mut Tracker<T>, now: T) -> Plan<T> {
    let at = (lock.namespace().unwrap_or_default(), lock.name_any());
    let (ns, name) = (at.0.as_str(), at.1.as_str());
    let lease = Duration::from_secs(lock.spec.lease_duration_seconds.max(1) as u64);
    let status = lock.status.clone().unwrap_or_default();
    let seen = in_view(caches.claims(lock), caches.tombstones(ns, name, now));
    let noticed = |claim: &str, hash: Option<&str>| caches.noticed(ns, claim, hash);
    let records = record::records(&status);
    let mut judged = judge_claims(&seen, (&status, &records), lease, noticed, tracker, now);
    let elapsed = hold_backs_over(&seen, &status, (ns, name), lease, tracker, now, &mut judged);
    let names = judged.claims.iter().map(|c| c.pod.as_str());
    let names = names.chain(status.holders.iter().map(|h| h.pod.as_str()));
    let pods = caches.pods(ns, &mut names.chain(status.queue.iter().map(|w| w.pod.as_str())));
    let uids = status.holders.iter().map(|h| h.pod_uid.as_str());
    let uids = uids.chain(judged.claims.iter().map(|c| c.pod_uid.as_str()));
    let stopped_pods = uids.filter(|uid| tracker.pod_stopped(uid)).map(String::from).collect();
    let wall = caches.wall();
    let created = lock
        .metadata
        .creation_timestamp
        .as_ref()
        .map_or(0, |t| t.0.as_microsecond());
    let world = World {
        spec: &lock.spec,
        status: &status,
        claims: &judged.claims,
        pods: &pods,
        stopped_pods: &stopped_pods,
        hold_back_elapsed: &elapsed,
        now: wall,
        token_floor: wall.as_microsecond().max(created),
        closing: lock.metadata.deletion_timestamp.is_some(),
    };
    let mut decision = decide(&world);
    if let Some(at) = decision.recheck_at {
        let wait = at.as_microsecond().saturating_sub(wall.as_microsecond()).max(0);
        judged.deadlines.push(now + Duration::from_micros(wait as u64));
    }
    decision.delete_claims.retain(|c| !seen.gone.contains(c)); // deleted already
    let deleting = |c: &str| decision.delete_claims.iter().any(|d| d == c) || caches.deleting(ns, c);
    let invalid = judged.invalid.drain(..).map(|c| (c, IgnoreReason::InvalidClaim));
    let refused: Vec<_> = decision.ignored.iter().cloned().chain(invalid).collect();
    decision.status.refused = crate::decide::refusals(&refused, deleting);
    let strays = after_decision(
        &decision,
        &seen,
        &judged.claims,
        (ns, name),
        lease,
        tracker,
        now,
        &mut judged.deadlines,
    );
    let (warnings, rejected) = warnings(judged.warnings, &decision, &seen, tracker);
    Plan {
        rejected,
        decision,
        next_deadline: judged.deadlines.into_iter().min(),
        warnings,
        released_seen: judged.released_seen,
        expired: judged.expired,
        expire_unnamed: judged.expire_unnamed,
        strays,
    }
}

/// The claims one decision sees.
struct InView {
    /// The claims: those in the store, and those this controller deleted that the lock's
    /// status may still name.
    leases: Vec<Arc<Lease>>,
    /// The names of those in the store.
    live: BTreeSet<String>,
    /// Swept after their release (their last state, release mark and all), and gone.
    gone: BTreeSet<String>,
    /// Deleted by this controller as expired: expired until status drops them, whatever
    /// the store still shows.
    expired_gone: BTreeSet<String>,
}

/// The lock's claims in the store, with what this controller deleted (`buried`: each
/// with whether it was deleted as expired; see [`super::sweep::Tombstones`]).
fn in_view(mut leases: Vec<Arc<Lease>>, buried: Vec<Tombstone>) -> InView {
    let expired_gone: BTreeSet<String> = buried.iter().filter(|(_, e)| *e).map(|(l, _)| l.name_any()).collect();
    leases.retain(|l| !expired_gone.contains(&l.name_any()));
    let live: BTreeSet<String> = leases.iter().map(|l| l.name_any()).collect();
    let gone: Vec<Arc<Lease>> = buried
        .into_iter()
        .map(|(l, _)| l)
        .filter(|l| !live.contains(&l.name_any()))
        .collect();
    let gone_names: BTreeSet<String> = gone.iter().map(|l| l.name_any()).collect();
    leases.extend(gone);
    InView {
        leases,
        live,
        gone: gone_names,
        expired_gone,
    }
}

/// What judging the claims one by one found.
struct Judged<T> {
    /// The valid claims, as the decide core sees them.
    claims: Vec<ClaimView>,
    /// Warning events to publish: (claim, reason, note).
    warnings: Vec<Warning>,
    /// When something will change by time alone.
    deadlines: Vec<T>,
    /// Claims the status names judged expired, to confirm with a fresh read.
    expired: Vec<Arc<Lease>>,
    /// Claims the status does not name judged expired (see [`Plan::expire_unnamed`]).
    expire_unnamed: Vec<Arc<Lease>>,
    /// Released claims, with when the release was seen.
    released_seen: Vec<(String, T)>,
    /// Invalid claims the status does not name (refused for their clients: a claim its
    /// process wrote is valid, so someone else changed it before it was recorded).
    invalid: Vec<String>,
}

impl<T> Judged<T> {
    /// `claim` is not valid: an event; refused for its client where the status does not
    /// record it (`records`).
    fn invalid_claim(&mut self, claim: &Arc<Lease>, bad: &claim::BadClaim, records: &HashMap<&str, Recorded>) {
        self.warnings
            .push((claim.clone(), "InvalidClaim", bad.message().to_string()));
        let name = claim.name_any();
        let unlisted = crate::mutant::on(crate::mutant::Mutant::InvalidClaimUnlisted);
        if !records.contains_key(name.as_str()) && !unlisted {
            self.invalid.push(name);
        }
    }

    /// `claim`'s `field` was changed after the lock recorded it: an event.
    fn tampered(&mut self, claim: &Arc<Lease>, field: Tampered) {
        let note = format!(
            "the claim's {} was changed after the lock recorded it (by someone other than its \
             process, who may patch Leases here): the record stands, the change is ignored",
            field.field()
        );
        self.warnings.push((claim.clone(), "ClaimTampered", note));
    }
}

impl<T> Default for Judged<T> {
    fn default() -> Self {
        Judged {
            claims: Vec::new(),
            warnings: Vec::new(),
            deadlines: Vec::new(),
            expired: Vec::new(),
            expire_unnamed: Vec::new(),
            released_seen: Vec::new(),
            invalid: Vec::new(),
        }
    }
}

/// Judge each claim in view: valid or not, its lease stated and recorded, expired or
/// when it will be, released (by a mark or a notice `noticed` proves) or forged.
fn judge_claims<T: Moment>(
    seen: &InView,
    (status, records): (&DistributedLockStatus, &HashMap<&str, Recorded>),
    lease: Duration,
    noticed: impl Fn(&str, Option<&str>) -> Option<T>,
    tracker: &mut Tracker<T>,
    now: T,
) -> Judged<T> {
    let mut j = Judged::default();
    for lease_obj in &seen.leases {
        let (pod, uid) = match claim::validate_claim(lease_obj) {
            Ok(ok) => ok,
            Err(bad) => {
                j.invalid_claim(lease_obj, &bad, records);
                continue;
            }
        };
        if let Some(problem) = claim::lease_problem(lease_obj) {
            j.warnings.push((lease_obj.clone(), "ClaimLease", problem));
        }
        let name_of = lease_obj.name_any();
        let record = records.get(name_of.as_str());
        if let Some(field) = changed_since_recorded(lease_obj, (&pod, &uid), record) {
            j.tampered(lease_obj, field);
        }
        // Judged by the lease recorded for it, whatever its claim says now (a neighbour
        // may patch the claim): a holder by its lease, a waiter by its wait lease.
        let holder = record
            .filter(|r| r.granted)
            .and_then(|_| status.holders.iter().find(|h| h.claim == name_of));
        let recorded = record.and_then(|r| r.lease_seconds);
        let recorded = recorded.map(|l| Duration::from_secs(l.clamp(0, MAX_LEASE_SECONDS) as u64));
        let own = timing::judged_lease(
            claim::claim_lease_duration(lease_obj),
            claim::claim_wait_lease(lease_obj),
            recorded,
            holder.is_some(),
        );
        let expired = if seen.expired_gone.contains(&name_of) {
            true // deleted by this controller as expired
        } else if seen.gone.contains(&name_of) {
            false // released, and gone: nothing left to expire
        } else if holder.is_some_and(|h| h.revoked.is_some()) {
            // A revoked holder's slot passes by its hold-back, not by its claim's expiry:
            // its claim is neither read afresh nor deleted (that would restart the hold-back).
            tracker.observe(lease_obj, now);
            false
        } else {
            let expires = tracker.expires_at(lease_obj, lease, own, now);
            if now >= expires && record.is_none() {
                j.expire_unnamed.push(lease_obj.clone());
            } else if now >= expires {
                j.expired.push(lease_obj.clone());
            } else {
                j.deadlines.push(expires);
            }
            now >= expires
        };
        let recorded = recorded_hash(lease_obj, record);
        let noticed = noticed(&name_of, recorded.as_deref());
        let view = claim_view(lease_obj, (pod, uid), expired, noticed.is_some(), recorded, tracker);
        if view.forged {
            let note = "the claim's release mark does not match its release hash: written by someone \
                        other than its process; a holder is revoked with its slot held back, a waiter is dropped";
            j.warnings.push((lease_obj.clone(), "ForgedRelease", note.to_string()));
        }
        if view.released {
            let seen_at = noticed.unwrap_or_else(|| tracker.released_at(lease_obj, now));
            j.released_seen.push((view.name.clone(), seen_at));
        }
        j.claims.push(view);
    }
    j
}

/// The revoked holders whose hold-back is over. A claim still there (a deleted lock keeps
/// its revoked holders' claims for their releases) may have been renewed unseen, behind
/// a stalled watch: the end is confirmed like an expiry (it joins `judged.expired`); one
/// out of view and not looked up yet waits for its lookup ([`after_decision`]).
#[allow(clippy::too_many_arguments)]
fn hold_backs_over<T: Moment>(
    seen: &InView,
    status: &DistributedLockStatus,
    (ns, name): (&str, &str),
    lease: Duration,
    tracker: &mut Tracker<T>,
    now: T,
    judged: &mut Judged<T>,
) -> BTreeSet<String> {
    let mut elapsed = BTreeSet::new();
    for h in status.holders.iter().filter(|h| h.revoked.is_some()) {
        let renewed = renewed_at(&seen.leases, tracker, &h.claim);
        let ends = tracker.hold_back_ends(ns, name, &h.claim, crate::decide::holder_lease(lease, h), renewed, now);
        if now < ends {
            judged.deadlines.push(ends);
            continue;
        }
        let released = judged.claims.iter().any(|c| c.name == h.claim && c.released);
        let gone = seen.gone.contains(&h.claim);
        let there = seen.leases.iter().find(|l| l.name_any() == h.claim && !gone);
        if let Some(l) = there.filter(|_| !released) {
            judged.expired.push(l.clone());
        } else if !released && !gone && !tracker.stray_gone(ns, name, &h.claim) {
            continue; // out of view and not looked up yet: a stray
        }
        elapsed.insert(h.claim.clone());
    }
    elapsed
}

/// After the decision: the revoked holders out of view, yet maybe still there (their
/// lock label removed or changed by someone who may patch Leases, and renewed by their
/// holders all along), or gone at a moment nobody saw, to look up by name before
/// anything else is decided (returned); each hold-back's end as a deadline; and the
/// tracker's revocation memory kept to the revoked holders the decision names.
#[allow(clippy::too_many_arguments)]
fn after_decision<T: Moment>(
    decision: &Decision,
    seen: &InView,
    claims: &[ClaimView],
    (ns, name): (&str, &str),
    lease: Duration,
    tracker: &mut Tracker<T>,
    now: T,
    deadlines: &mut Vec<T>,
) -> Vec<String> {
    let mut strays = Vec::new();
    let revoked = decision.status.holders.iter().filter(|h| h.revoked.is_some());
    for h in revoked.clone() {
        let released = claims.iter().any(|c| c.name == h.claim && c.released);
        let in_view = seen.live.contains(&h.claim) || seen.gone.contains(&h.claim);
        let renewed = renewed_at(&seen.leases, tracker, &h.claim);
        let ends = tracker.hold_back_ends(ns, name, &h.claim, crate::decide::holder_lease(lease, h), renewed, now);
        if !released && !in_view && tracker.stray_due(ns, name, &h.claim, ends, now) {
            strays.push(h.claim.clone());
        }
        deadlines.push(ends);
    }
    tracker.retain_revoked(ns, name, &revoked.map(|h| h.claim.clone()).collect());
    strays
}

/// The warnings worth an event (each claim's first of each reason; none for a claim
/// gone, warned while it was there), with the claims the decision ignored; and how many
/// claims are rejected (a note on an odd or tampered lease is no rejection).
fn warnings<T: Moment>(
    mut warnings: Vec<Warning>,
    decision: &Decision,
    seen: &InView,
    tracker: &mut Tracker<T>,
) -> (Vec<Warning>, usize) {
    // By name, once: a flood of ignored claims costs a look-up apiece, not a scan.
    let by_name: HashMap<String, &Arc<Lease>> = seen.leases.iter().map(|l| (l.name_any(), l)).collect();
    for (claim, reason) in &decision.ignored {
        if let Some(lease) = by_name.get(claim) {
            let note = format!("{}: {}", reason.as_str(), reason.message());
            warnings.push(((*lease).clone(), "ClaimIgnored", note));
        }
    }
    warnings.retain(|(l, _, _)| !seen.gone.contains(&l.name_any()));
    let noted_only = |reason: &str| reason == "ClaimLease" || reason == "ClaimTampered";
    let rejected = warnings.iter().filter(|(_, reason, _)| !noted_only(reason)).count();
    warnings.retain(|(l, reason, _)| tracker.first_warning(&l.uid().unwrap_or_default(), reason));
    (warnings, rejected)
}

/// When the controller last saw `claim` renewed, if it follows it (a claim swept after
/// its release is followed no more: its hold-back counts from the revocation).
fn renewed_at<T: Moment>(leases: &[Arc<Lease>], tracker: &Tracker<T>, claim: &str) -> Option<T> {
    let lease = leases.iter().find(|l| l.name_any() == claim)?;
    tracker.last_change(lease)
}

/// A field of `lease` (whose pod fields read `pod`) that differs from what the lock's
/// status recorded for it: the record stands (see [`crate::protocol::record`]), so such
/// a change is only reported.
fn changed_since_recorded(
    lease: &Lease,
    (pod, pod_uid): (&str, &str),
    recorded: Option<&Recorded>,
) -> Option<Tampered> {
    let recorded = recorded?;
    let hash = release::claim_hash(lease);
    let stated = claim::claim_lease_seconds(lease);
    let now = Written {
        pod,
        pod_uid,
        release_hash: hash.as_deref(),
        wait_hash: claim::claim_wait_hash(lease),
        lease_seconds: stated,
    };
    let lowered = recorded.lease_seconds.is_some_and(|l| l > stated);
    match recorded.differs(&now) {
        Some(field) => Some(field),
        None => lowered.then_some(Tampered::Lease),
    }
}

/// The release hash a claim's release is judged against: the one recorded for it
/// (`recorded`: its holder entry's, else its queue entry's) when it was queued, its own
/// if not queued yet.
pub fn recorded_hash(lease: &Lease, recorded: Option<&Recorded>) -> Option<String> {
    match recorded {
        Some(r) => r.release_hash.map(String::from),
        None => release::claim_hash(lease),
    }
}

/// One claim turned into the decide core's view. Its release mark is judged against
/// `recorded`, its [`recorded_hash`]. A claim with no mark but a valid release notice
/// (`noticed`, proved against that same hash, see [`super::notices`]) counts as validly
/// marked.
pub fn claim_view<T: Moment>(
    lease: &Lease,
    (pod, pod_uid): (String, String),
    expired: bool,
    noticed: bool,
    recorded: Option<String>,
    tracker: &Tracker<T>,
) -> ClaimView {
    let name = lease.name_any();
    let mark = match release::judge(lease, recorded.as_deref()) {
        Mark::None if noticed => Mark::Valid,
        mark => mark,
    };
    ClaimView {
        name,
        pod,
        pod_uid,
        arrival: tracker.arrival(lease),
        released: mark == Mark::Valid,
        forged: mark == Mark::Forged,
        release_hash: recorded,
        wait_hash: claim::claim_wait_hash(lease).map(String::from),
        stamped_token: claim::stamped_token(lease),
        expired,
        lease_seconds: claim::claim_lease_seconds(lease),
    }
}

/// Strip a pod down to what the controller needs (name, namespace, uid, phase, and
/// whether its containers terminated), so the cluster-wide pod cache stays small.
pub fn slim_pod(pod: &mut Pod) {
    pod.spec = None;
    pod.metadata.managed_fields = None;
    pod.metadata.annotations = None;
    pod.metadata.labels = None;
    if let Some(status) = pod.status.as_mut() {
        let terminated = |c: &ContainerStatus| ContainerStatus {
            name: c.name.clone(),
            state: c.state.as_ref().map(|s| ContainerState {
                terminated: s.terminated.as_ref().map(|t| ContainerStateTerminated {
                    exit_code: t.exit_code,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let slim = |cs: &Option<Vec<ContainerStatus>>| cs.as_ref().map(|cs| cs.iter().map(terminated).collect());
        *status = PodStatus {
            phase: status.phase.take(),
            container_statuses: slim(&status.container_statuses),
            init_container_statuses: slim(&status.init_container_statuses),
            ..Default::default()
        };
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::protocol::claim::{PodIdentity, claim_lease};

    fn lease(name: &str) -> Arc<Lease> {
        let pod = PodIdentity {
            name: format!("pod-{name}"),
            namespace: "ns".into(),
            uid: format!("uid-{name}"),
        };
        let mut l = claim_lease(name, "l", &pod, 10);
        l.metadata.uid = Some(format!("lease-{name}"));
        Arc::new(l)
    }

    /// A status holding `claim` revoked (a forced release) with a 10 s lease.
    fn revoked(claim: &str) -> DistributedLockStatus {
        serde_json::from_value(serde_json::json!({"fencingToken": 1, "holders": [{
            "claim": claim, "pod": format!("pod-{claim}"), "podUID": format!("uid-{claim}"),
            "fencingToken": 1, "grantedAt": "2026-01-01T00:00:00Z", "leaseDurationSeconds": 10,
            "revoked": {"reason": "ForceReleased", "at": "2026-01-01T00:00:01Z"}}]}))
        .unwrap()
    }

    /// [`judge_claims`] with no release notices.
    fn judge(
        seen: &InView,
        status: &DistributedLockStatus,
        lease: Duration,
        tracker: &mut Tracker<Instant>,
        now: Instant,
    ) -> Judged<Instant> {
        let none = |_: &str, _: Option<&str>| None;
        judge_claims(seen, (status, &record::records(status)), lease, none, tracker, now)
    }

    fn names(leases: &[Arc<Lease>]) -> Vec<String> {
        leases.iter().map(|l| l.name_any()).collect()
    }

    #[test]
    fn in_view_a_claim_deleted_as_expired_is_its_last_state_and_a_swept_one_is_seen_gone() {
        let store = vec![lease("a"), lease("b")];
        let buried = vec![(lease("a"), true), (lease("c"), false), (lease("b"), false)];
        let seen = in_view(store, buried);
        assert_eq!(
            names(&seen.leases),
            ["b", "a", "c"],
            "b's store copy, a's and c's last states"
        );
        assert_eq!(seen.live, BTreeSet::from(["b".to_string()]));
        assert_eq!(seen.gone, BTreeSet::from(["a".to_string(), "c".to_string()]));
        assert_eq!(seen.expired_gone, BTreeSet::from(["a".to_string()]));
    }

    #[test]
    fn a_claim_is_judged_expired_only_once_its_lease_passed_unrenewed() {
        let seen = in_view(vec![lease("a")], Vec::new());
        let status = DistributedLockStatus::default();
        let mut tracker = Tracker::default();
        let t0 = Instant::now();
        let first = judge(&seen, &status, Duration::from_secs(10), &mut tracker, t0);
        assert!(first.expired.is_empty());
        assert_eq!(first.claims.len(), 1);
        let due = *first.deadlines.first().expect("its expiry is a deadline");
        let later = judge(&seen, &status, Duration::from_secs(10), &mut tracker, due);
        assert!(later.expired.is_empty(), "the status names it not: no fresh read");
        assert_eq!(
            names(&later.expire_unnamed),
            ["a"],
            "judged expired at its deadline, to be deleted as seen"
        );
        assert!(later.claims[0].expired, "neither queued nor granted");
        let queued: DistributedLockStatus = serde_json::from_value(serde_json::json!({"queue": [{
            "claim": "a", "pod": "pod-a", "podUID": "uid-a", "requestedAt": "2026-01-01T00:00:00Z",
            "leaseDurationSeconds": 10}], "queueLength": 1}))
        .unwrap();
        let later = judge(
            &seen,
            &queued,
            Duration::from_secs(1),
            &mut tracker,
            due + timing::WAIT_LEASE,
        );
        assert_eq!(
            names(&later.expired),
            ["a"],
            "named in the status: judged expired at its deadline, to be read afresh"
        );
    }

    /// Found by the system model (`explore::system`): a neighbour who patched a queued
    /// claim's lease and wait lease down to 1 s had it expired (dropped, a lost waiter;
    /// and a successor told of its grant, acting on its 10 s lease, judged by 1 s).
    #[test]
    fn a_waiter_patched_down_after_it_was_queued_is_judged_by_its_recorded_wait_lease() {
        let mut patched = (*lease("a")).clone();
        patched.spec.as_mut().unwrap().lease_duration_seconds = Some(1);
        patched
            .annotations_mut()
            .insert(crate::protocol::WAIT_LEASE_ANNOTATION.into(), "1".into());
        let seen = in_view(vec![Arc::new(patched)], Vec::new());
        let status: DistributedLockStatus = serde_json::from_value(serde_json::json!({"queue": [{
            "claim": "a", "pod": "pod-a", "podUID": "uid-a", "requestedAt": "2026-01-01T00:00:00Z",
            "leaseDurationSeconds": 10}], "queueLength": 1}))
        .unwrap();
        let (mut tracker, t0) = (Tracker::default(), Instant::now());
        let judged = judge(&seen, &status, Duration::from_secs(1), &mut tracker, t0);
        let expires = *judged.deadlines.first().expect("its expiry is a deadline");
        let by_wait_lease = timing::controller_expiry(t0, Duration::from_secs(1), timing::WAIT_LEASE);
        assert_eq!(
            expires, by_wait_lease,
            "judged by the wait lease of its recorded 10 s lease, not by 1 s"
        );
    }

    /// Found by the chaos soak (issue #41): a claim's lease raised by a neighbour after
    /// the record kept its slot an hour once its process went silent. Recorded, a claim
    /// is judged by its record alone, raised or lowered since.
    #[test]
    fn a_claim_patched_up_after_it_was_recorded_is_judged_by_its_record() {
        let mut patched = (*lease("a")).clone();
        patched.spec.as_mut().unwrap().lease_duration_seconds = Some(3600);
        let seen = in_view(vec![Arc::new(patched)], Vec::new());
        let status: DistributedLockStatus = serde_json::from_value(serde_json::json!({"holders": [{
            "claim": "a", "pod": "pod-a", "podUID": "uid-a", "fencingToken": 1,
            "grantedAt": "2026-01-01T00:00:00Z", "leaseDurationSeconds": 10}]}))
        .unwrap();
        let (mut tracker, t0) = (Tracker::default(), Instant::now());
        let judged = judge(&seen, &status, Duration::from_secs(5), &mut tracker, t0);
        let expires = *judged.deadlines.first().expect("its expiry is a deadline");
        let by_record = timing::controller_expiry(t0, Duration::from_secs(5), Duration::from_secs(10));
        assert_eq!(expires, by_record, "judged by its recorded 10 s, not the raised hour");
    }

    /// A claim not recorded that names no pod as its process wrote it is refused for its
    /// client (who claims anew); one the status records stands by its record.
    #[test]
    fn an_invalid_claim_is_refused_only_where_the_status_does_not_record_it() {
        let strip = |name: &str| {
            let mut l = (*lease(name)).clone();
            l.annotations_mut().remove(crate::protocol::POD_UID_ANNOTATION);
            Arc::new(l)
        };
        let seen = in_view(vec![strip("a"), strip("b"), lease("c")], Vec::new());
        let status: DistributedLockStatus = serde_json::from_value(serde_json::json!({"holders": [{
            "claim": "b", "pod": "pod-b", "podUID": "uid-b", "fencingToken": 1,
            "grantedAt": "2026-01-01T00:00:00Z", "leaseDurationSeconds": 10}]}))
        .unwrap();
        let (mut tracker, t0) = (Tracker::default(), Instant::now());
        let judged = judge(&seen, &status, Duration::from_secs(10), &mut tracker, t0);
        assert_eq!(judged.invalid, ["a"], "b is recorded: its record stands");
        let warned: Vec<_> = judged.warnings.iter().map(|(l, r, _)| (l.name_any(), *r)).collect();
        assert_eq!(warned, [("a".into(), "InvalidClaim"), ("b".into(), "InvalidClaim")]);
    }

    #[test]
    fn a_revoked_holder_out_of_view_holds_its_slot_until_looked_up_then_its_hold_back_ends() {
        let status = revoked("a");
        let seen = in_view(Vec::new(), Vec::new());
        let (at, lease) = (("ns", "l"), Duration::from_secs(10));
        let mut tracker = Tracker::default();
        let t0 = Instant::now();
        let mut judged = Judged::default();
        assert!(hold_backs_over(&seen, &status, at, lease, &mut tracker, t0, &mut judged).is_empty());
        let ends = judged.deadlines.pop().expect("the hold-back's end is a deadline");
        let mut judged = Judged::default();
        let elapsed = hold_backs_over(&seen, &status, at, lease, &mut tracker, ends, &mut judged);
        assert!(elapsed.is_empty(), "out of view and not looked up: the slot stays held");
        let d = Decision {
            status: status.clone(),
            actions: Vec::new(),
            delete_claims: Vec::new(),
            ignored: Vec::new(),
            recheck_at: None,
        };
        let mut deadlines = Vec::new();
        let strays = after_decision(&d, &seen, &[], at, lease, &mut tracker, ends, &mut deadlines);
        assert_eq!(strays, ["a"], "looked up by name first");
        tracker.found_stray_gone("ns", "l", "a");
        let elapsed = hold_backs_over(&seen, &status, at, lease, &mut tracker, ends, &mut Judged::default());
        assert_eq!(
            elapsed,
            BTreeSet::from(["a".to_string()]),
            "found gone: the slot passes"
        );
        let strays = after_decision(&d, &seen, &[], at, lease, &mut tracker, ends, &mut deadlines);
        assert!(strays.is_empty());
    }

    /// Issue #41: a stray whose deletion kept conflicting (written since its read) was
    /// looked up again at once, without end and with no status write meanwhile. It
    /// counts as renewed then, as a conflicting expiry does: looked up again only once
    /// its hold-back, counted from then, is over.
    #[test]
    fn a_stray_found_renewed_is_looked_up_again_only_once_its_hold_back_is_over() {
        let status = revoked("a");
        let seen = in_view(Vec::new(), Vec::new());
        let (at, lease) = (("ns", "l"), Duration::from_secs(10));
        let mut tracker = Tracker::default();
        let t0 = Instant::now();
        let d = Decision {
            status: status.clone(),
            actions: Vec::new(),
            delete_claims: Vec::new(),
            ignored: Vec::new(),
            recheck_at: None,
        };
        let mut deadlines = Vec::new();
        let strays = after_decision(&d, &seen, &[], at, lease, &mut tracker, t0, &mut deadlines);
        assert_eq!(strays, ["a"], "looked up when first revoked");
        let t1 = t0 + Duration::from_secs(1);
        tracker.found_stray_renewed("ns", "l", "a", t1);
        let mut deadlines = Vec::new();
        let strays = after_decision(&d, &seen, &[], at, lease, &mut tracker, t1, &mut deadlines);
        assert!(strays.is_empty(), "not again at once");
        let ends = deadlines.pop().unwrap();
        assert_eq!(
            ends,
            timing::hold_back_ends(t1, lease),
            "the hold-back counts from the conflict"
        );
        let elapsed = hold_backs_over(&seen, &status, at, lease, &mut tracker, ends, &mut Judged::default());
        assert!(elapsed.is_empty(), "still held: it may be renewed");
        let strays = after_decision(&d, &seen, &[], at, lease, &mut tracker, ends, &mut Vec::new());
        assert_eq!(strays, ["a"], "looked up again at its end");
    }

    #[test]
    fn a_revoked_holder_whose_claim_is_still_there_is_confirmed_like_an_expiry() {
        let status = revoked("a");
        let seen = in_view(vec![lease("a")], Vec::new());
        let (at, lease_d) = (("ns", "l"), Duration::from_secs(10));
        let mut tracker = Tracker::default();
        let t0 = Instant::now();
        let mut judged = Judged::default();
        hold_backs_over(&seen, &status, at, lease_d, &mut tracker, t0, &mut judged);
        let ends = judged.deadlines.pop().unwrap();
        let mut judged = Judged::default();
        let elapsed = hold_backs_over(&seen, &status, at, lease_d, &mut tracker, ends, &mut judged);
        assert_eq!(elapsed, BTreeSet::from(["a".to_string()]));
        assert_eq!(
            names(&judged.expired),
            ["a"],
            "read afresh and deleted under that read first"
        );
    }

    #[test]
    fn warnings_go_once_per_claim_and_reason_and_notes_are_no_rejections() {
        let seen = in_view(vec![lease("a"), lease("b")], vec![(lease("c"), false)]);
        let d = Decision {
            status: DistributedLockStatus::default(),
            actions: Vec::new(),
            delete_claims: Vec::new(),
            ignored: vec![("b".into(), crate::api::RefuseReason::QueueFull)],
            recheck_at: None,
        };
        let mut tracker: Tracker = Tracker::default();
        let raised = || {
            vec![
                (lease("a"), "ClaimLease", "odd".to_string()),
                (lease("a"), "ForgedRelease", "forged".to_string()),
                (lease("c"), "InvalidClaim", "gone".to_string()),
            ]
        };
        let (w, rejected) = warnings(raised(), &d, &seen, &mut tracker);
        let reasons: Vec<_> = w.iter().map(|(l, r, _)| (l.name_any(), *r)).collect();
        assert_eq!(
            reasons,
            [
                ("a".into(), "ClaimLease"),
                ("a".into(), "ForgedRelease"),
                ("b".into(), "ClaimIgnored")
            ]
        );
        assert_eq!(
            rejected, 2,
            "the forged mark and the ignored claim; the lease note is none"
        );
        let (again, rejected) = warnings(raised(), &d, &seen, &mut tracker);
        assert!(again.is_empty(), "each once");
        assert_eq!(rejected, 2, "still rejected, without a new event");
    }
}
