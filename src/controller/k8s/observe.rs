//! Observation: the stored claims and pods of one lock, and the tracker's clock,
//! turned into the decide core's inputs; then the decision, with when to look again.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ContainerState, ContainerStateTerminated, ContainerStatus, Pod, PodStatus};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;

use crate::api::{DistributedLock, DistributedLockStatus, Holder};
use crate::controller::cache::tracker::Tracker;
use crate::controller::context::Context;
use crate::decide::{ClaimView, Decision, World, decide};
use crate::protocol::claim;
use crate::protocol::record::{self, Tampered, Written};
use crate::protocol::release::{self, Mark};
use crate::protocol::timing::MAX_LEASE_SECONDS;

/// What one decision plans, with when to look again.
pub struct Plan {
    /// The decide core's outcome.
    pub decision: Decision,
    /// The next time-based transition (expiry, end of a hold-back), if any.
    pub next_deadline: Option<Instant>,
    /// Warning events to publish on claims (each claim's first only): (claim, reason, note).
    pub warnings: Vec<(Arc<Lease>, &'static str, String)>,
    /// How many of the lock's claims are rejected now (invalid, forged, or naming no
    /// live pod); a note on an odd lease is no rejection.
    pub rejected: usize,
    /// Released claims with when this controller saw the release, for the handoff metric.
    pub released_seen: Vec<(String, Instant)>,
    /// The claims judged expired, to be confirmed with a fresh read before acting.
    pub expired: Vec<Arc<Lease>>,
    /// Revoked holders' claims out of this controller's view at their hold-back's end,
    /// to be looked up by name before the slot passes on (see [`super::strays`]).
    pub strays: Vec<String>,
}

/// Observe the stores and the tracker, and decide.
pub fn plan(lock: &DistributedLock, ctx: &Context, now: Instant) -> Plan {
    let ns = lock.namespace().unwrap_or_default();
    let name = lock.name_any();
    let lease = Duration::from_secs(lock.spec.lease_duration_seconds.max(1) as u64);
    let status = lock.status.clone().unwrap_or_default();
    let mut tracker = ctx.tracker.lock().expect("tracker lock poisoned");
    let mut deadlines = Vec::new();
    let mut claims = Vec::new();
    let mut warnings = Vec::new();
    let mut released_seen = Vec::new();
    let mut expired_claims = Vec::new();
    let mut strays = Vec::new();
    let mut leases = claims_of(ctx, lock);
    // Claims swept after their release before this lock decided on them: their last
    // state, release mark and all (see `sweep`).
    // Claims this controller deleted as expired count as such until status drops them,
    // whatever the store still shows.
    let buried = ctx.k8s.tombstones.of_lock(&ns, &name, now);
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
    for lease_obj in &leases {
        let (pod, uid) = match claim::validate_claim(lease_obj) {
            Ok(ok) => ok,
            Err(bad) => {
                warnings.push((lease_obj.clone(), "InvalidClaim", bad.message().to_string()));
                continue;
            }
        };
        if let Some(problem) = claim::lease_problem(lease_obj) {
            warnings.push((lease_obj.clone(), "ClaimLease", problem));
        }
        // A holder lives by the lease recorded at its grant, whatever its claim says now
        // (a neighbour may patch the claim): never judge it by less.
        let name_of = lease_obj.name_any();
        if let Some(field) = changed_since_recorded(lease_obj, (&pod, &uid), &status) {
            let note = format!(
                "the claim's {} was changed after the lock recorded it (by someone other than its \
                 process, who may patch Leases here): the record stands, the change is ignored",
                field.field()
            );
            warnings.push((lease_obj.clone(), "ClaimTampered", note));
        }
        let holder = status.holders.iter().find(|h| h.claim == name_of);
        let recorded = holder.and_then(|h| h.lease_duration_seconds).unwrap_or(0);
        let own = claim::claim_lease_duration(lease_obj)
            .max(Duration::from_secs(recorded.clamp(0, MAX_LEASE_SECONDS) as u64));
        // A waiter (queued or new) lives by its wait lease, a holder by its lease.
        let own = match claim::claim_wait_lease(lease_obj) {
            Some(wait) if holder.is_none() => own.max(wait),
            _ => own,
        };
        let expired = if expired_gone.contains(&name_of) {
            true // deleted by this controller as expired
        } else if gone_names.contains(&name_of) {
            false // released, and gone: nothing left to expire
        } else if holder.is_some_and(|h| h.revoked.is_some()) {
            // A revoked holder's slot passes by its hold-back, not by its claim's expiry:
            // its claim is neither read afresh nor deleted (that would restart the hold-back).
            tracker.observe(lease_obj, now);
            false
        } else {
            let expires = tracker.expires_at(lease_obj, lease, own, now);
            if now >= expires {
                expired_claims.push(lease_obj.clone());
            } else {
                deadlines.push(expires);
            }
            now >= expires
        };
        let recorded = recorded_hash(lease_obj, &status);
        let noticed = ctx.k8s.notices.proves(&ns, &name_of, recorded.as_deref());
        let view = claim_view(lease_obj, (pod, uid), expired, noticed.is_some(), recorded, &tracker);
        if view.forged {
            let note = "the claim's release mark does not match its release hash: written by someone \
                        other than its process; a holder is revoked with its slot held back, a waiter is dropped";
            warnings.push((lease_obj.clone(), "ForgedRelease", note.to_string()));
        }
        if view.released {
            let seen = noticed.unwrap_or_else(|| tracker.released_at(lease_obj));
            released_seen.push((view.name.clone(), seen));
        }
        claims.push(view);
    }
    let pod_names = claims.iter().map(|c| c.pod.as_str());
    let pod_names = pod_names.chain(status.holders.iter().map(|h| h.pod.as_str()));
    let pods = ctx
        .pods
        .views(&ns, pod_names.chain(status.queue.iter().map(|w| w.pod.as_str())));
    let uids = status.holders.iter().map(|h| h.pod_uid.as_str());
    let uids = uids.chain(claims.iter().map(|c| c.pod_uid.as_str()));
    let stopped_pods = uids.filter(|uid| tracker.pod_stopped(uid)).map(String::from).collect();
    let mut elapsed = BTreeSet::new();
    for h in status.holders.iter().filter(|h| h.revoked.is_some()) {
        let renewed = renewed_at(&leases, &tracker, &h.claim);
        let ends = tracker.hold_back_ends(&ns, &name, &h.claim, holder_lease(lease, h), renewed, now);
        if now >= ends {
            // A claim still there (a deleted lock keeps its revoked holders' claims for
            // their releases) may have been renewed unseen, behind a stalled watch: the
            // end is confirmed like an expiry, by a fresh read and a deletion under it.
            let released = claims.iter().any(|c| c.name == h.claim && c.released);
            let there = leases
                .iter()
                .find(|l| l.name_any() == h.claim && !gone_names.contains(&h.claim));
            if let Some(l) = there.filter(|_| !released) {
                expired_claims.push(l.clone());
            } else if !released && !gone_names.contains(&h.claim) && !tracker.stray_gone(&ns, &name, &h.claim) {
                continue; // out of view and not looked up yet: a stray (below)
            }
            elapsed.insert(h.claim.clone());
        } else {
            deadlines.push(ends);
        }
    }
    let wall = Timestamp::now();
    let created = lock
        .metadata
        .creation_timestamp
        .as_ref()
        .map_or(0, |t| t.0.as_microsecond());
    let world = World {
        spec: &lock.spec,
        status: &status,
        claims: &claims,
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
        deadlines.push(now + Duration::from_micros(wait as u64));
    }
    decision.delete_claims.retain(|c| !gone_names.contains(c)); // deleted already
    let deleting = |c: &str| decision.delete_claims.iter().any(|d| d == c) || ctx.written.deleting(&ns, c);
    decision.status.refused = crate::decide::refusals(&decision.ignored, deleting);
    let revoked: BTreeSet<String> = decision
        .status
        .holders
        .iter()
        .filter(|h| h.revoked.is_some())
        .map(|h| h.claim.clone())
        .collect();
    for h in decision.status.holders.iter().filter(|h| h.revoked.is_some()) {
        // Out of view, yet maybe still there (its lock label removed or changed by
        // someone who may patch Leases, and renewed by its holder all along), or gone
        // at a moment nobody saw: looked up by name before anything else is decided.
        let released = claims.iter().any(|c| c.name == h.claim && c.released);
        let in_view = live.contains(&h.claim) || gone_names.contains(&h.claim);
        if !released && !in_view && !tracker.stray_gone(&ns, &name, &h.claim) {
            strays.push(h.claim.clone());
        }
        let renewed = renewed_at(&leases, &tracker, &h.claim);
        let ends = tracker.hold_back_ends(&ns, &name, &h.claim, holder_lease(lease, h), renewed, now);
        deadlines.push(ends);
    }
    tracker.retain_revoked(&ns, &name, &revoked);
    for (claim, reason) in &decision.ignored {
        if let Some(lease) = leases.iter().find(|l| &l.name_any() == claim) {
            warnings.push((
                lease.clone(),
                "ClaimIgnored",
                format!("{}: {}", reason.as_str(), reason.message()),
            ));
        }
    }
    warnings.retain(|(l, _, _)| !gone_names.contains(&l.name_any())); // warned while it was there
    let noted_only = |reason: &str| reason == "ClaimLease" || reason == "ClaimTampered";
    let rejected = warnings.iter().filter(|(_, reason, _)| !noted_only(reason)).count();
    warnings.retain(|(l, reason, _)| tracker.first_warning(&l.uid().unwrap_or_default(), reason));
    Plan {
        rejected,
        decision,
        next_deadline: deadlines.into_iter().min(),
        warnings,
        released_seen,
        expired: expired_claims,
        strays,
    }
}

/// When the controller last saw `claim` renewed, if it follows it (a claim swept after
/// its release is followed no more: its hold-back counts from the revocation).
fn renewed_at(leases: &[Arc<Lease>], tracker: &Tracker, claim: &str) -> Option<Instant> {
    let lease = leases.iter().find(|l| l.name_any() == claim)?;
    tracker.last_change(lease)
}

/// The lease a holder's process may be living by: the longer of the lock's and the one
/// its claim stated when it was granted.
fn holder_lease(spec: Duration, holder: &Holder) -> Duration {
    let own = holder.lease_duration_seconds.unwrap_or(0).clamp(0, MAX_LEASE_SECONDS);
    spec.max(Duration::from_secs(own as u64))
}

/// A field of `lease` (whose pod fields read `pod`) that differs from what the lock's
/// status recorded for it: the record stands (see [`crate::protocol::record`]), so such
/// a change is only reported.
fn changed_since_recorded(
    lease: &Lease,
    (pod, pod_uid): (&str, &str),
    status: &DistributedLockStatus,
) -> Option<Tampered> {
    let recorded = record::recorded(status, &lease.name_any())?;
    let hash = release::claim_hash(lease);
    let stated = claim::claim_lease_seconds(lease);
    let now = Written {
        pod,
        pod_uid,
        release_hash: hash.as_deref(),
        wait_hash: claim::claim_wait_hash(lease),
        lease_seconds: stated,
    };
    let lowered = stated > 0 && recorded.lease_seconds.is_some_and(|l| l > stated);
    match recorded.differs(&now) {
        Some(Tampered::Lease) if stated == 0 => None, // no lease stated: noted as ClaimLease
        Some(field) => Some(field),
        None => lowered.then_some(Tampered::Lease),
    }
}

/// The claims of one lock: the index names them, the store holds them.
pub fn claims_of(ctx: &Context, lock: &DistributedLock) -> Vec<Arc<Lease>> {
    let (ns, name) = (lock.namespace().unwrap_or_default(), lock.name_any());
    ctx.k8s
        .claims
        .of_lock(&ns, &name)
        .into_iter()
        .filter_map(|claim| ctx.k8s.leases.get(&ObjectRef::new(&claim).within(&ns)))
        .filter(|l| claim::claim_lock(l) == Some(name.as_str()))
        // Being deleted (its renewals are no renewals to its client): no claim.
        .filter(|l| l.metadata.deletion_timestamp.is_none())
        .collect()
}

/// The release hash a claim's release is judged against: the one recorded in `status`
/// when it was queued (its own, if not queued yet).
pub fn recorded_hash(lease: &Lease, status: &DistributedLockStatus) -> Option<String> {
    let name = lease.name_any();
    let holder = status.holders.iter().find(|h| h.claim == name);
    let waiter = status.queue.iter().find(|w| w.claim == name);
    match (holder, waiter) {
        (Some(h), _) => h.release_hash.clone(),
        (None, Some(w)) => w.release_hash.clone(),
        (None, None) => release::claim_hash(lease),
    }
}

/// One claim turned into the decide core's view. Its release mark is judged against
/// `recorded`, its [`recorded_hash`]. A claim with no mark but a valid release notice
/// (`noticed`, proved against that same hash, see [`super::notices`]) counts as validly
/// marked.
pub fn claim_view(
    lease: &Lease,
    (pod, pod_uid): (String, String),
    expired: bool,
    noticed: bool,
    recorded: Option<String>,
    tracker: &Tracker,
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
