//! Writing a lock's status, whatever its backend: under the resourceVersion that was read
//! (so two controllers can never both write from the same state; on a conflict the lock
//! is re-read and decided again), never for its release URL alone, and with
//! observedGeneration and the Ready condition set.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, PostParams};

use crate::api::{DistributedLock, DistributedLockStatus};
use crate::controller::context::Context;
use crate::controller::error::Error;

/// What a reconcile does after writing a lock's status.
pub enum Step {
    /// Written: go on.
    Written,
    /// Nothing to write: go on.
    Unchanged,
    /// Someone wrote first: decide again from the lock as it is now (re-read).
    Again,
    /// The lock is gone, or another lock has its name now: stop.
    Stop,
}

/// Write `status` over `current`'s (unless unchanged but for its release URL, which
/// goes along with writes made anyway), with `current`'s resourceVersion as the
/// precondition, and remember the write for the next reconcile. On a conflict `current`
/// becomes the lock as re-read.
pub async fn write_status(
    ctx: &Context,
    api: &Api<DistributedLock>,
    current: &mut DistributedLock,
    status: DistributedLockStatus,
) -> Result<Step, Error> {
    if unchanged(current.status.as_ref(), &status) {
        return Ok(Step::Unchanged);
    }
    let name = current.name_any();
    let mut next = current.clone();
    next.status = Some(status);
    match api.replace_status(&name, &PostParams::default(), &next).await {
        Ok(written) => {
            ctx.written.record(current.metadata.resource_version.clone(), written);
            Ok(Step::Written)
        }
        Err(kube::Error::Api(s)) if s.is_conflict() => {
            let fresh = api.get(&name).await.map_err(|e| Error::Reread(name.clone(), e))?;
            if fresh.uid() != current.uid() {
                // Another lock under the name (deleted and made again): its own turn,
                // from its finalizer on, decides on it; this one's is over.
                ctx.written.forget(current);
                return Ok(Step::Stop);
            }
            *current = fresh;
            Ok(Step::Again)
        }
        Err(kube::Error::Api(s)) if s.is_not_found() => {
            ctx.written.forget(current);
            Ok(Step::Stop)
        }
        Err(e) => Err(Error::WriteStatus(name, e)),
    }
}

/// Whether writing `next` over `current` would change nothing but the release URL: a
/// controller's URL is published with the writes it makes anyway, never alone (a new
/// leader would otherwise rewrite every lock at once).
pub(crate) fn unchanged(current: Option<&DistributedLockStatus>, next: &DistributedLockStatus) -> bool {
    current.is_some_and(|c| {
        c.release_url == next.release_url && c.grant_key == next.grant_key && c == next || {
            let mut c = c.clone();
            c.release_url.clone_from(&next.release_url);
            c.grant_key.clone_from(&next.grant_key);
            &c == next
        }
    })
}

/// Why a lock is not Ready (besides a name too long for claims).
pub struct Trouble {
    /// The condition's reason.
    pub reason: &'static str,
    /// The condition's message.
    pub message: String,
}

impl Trouble {
    /// `count` claims were rejected (each has a Warning event).
    pub fn rejected(count: usize) -> Self {
        Trouble {
            reason: "ClaimsRejected",
            message: format!(
                "{count} claim(s) rejected (malformed, misplaced or with a forged release): see the \
                 Warning events of the lock's Leases (kubectl get events --field-selector type=Warning)"
            ),
        }
    }

    /// The lock's etcd cannot be reached or read.
    pub fn etcd(why: &str) -> Self {
        Trouble {
            reason: "EtcdUnavailable",
            message: format!(
                "the lock's etcd (spec.backend.etcd) cannot be reached: {why}; holders stop by their \
                 lease, and the status shows the last keys seen"
            ),
        }
    }
}

/// Set observedGeneration and the Ready condition: True while the lock is reconciled,
/// False (with the reason) when the lock is deleted but waits for a held-back slot,
/// when claims cannot name it, or when `trouble` says why; a change of it dated `now`.
pub fn with_conditions(
    lock: &DistributedLock,
    mut status: DistributedLockStatus,
    trouble: Option<&Trouble>,
    now: Timestamp,
) -> DistributedLockStatus {
    let generation = lock.metadata.generation;
    status.observed_generation = generation;
    let name = lock.name_any();
    let (ready, reason, message) = if let Some(message) = deletion_waits(lock, &status) {
        ("False", "Deleting", message)
    } else if name.len() > crate::protocol::MAX_LOCK_NAME {
        let message = format!(
            "the lock's name has {} characters: claims name their lock in a label value, which \
             holds at most {}; no claim can ask for this lock, so re-create it with a shorter name",
            name.len(),
            crate::protocol::MAX_LOCK_NAME
        );
        ("False", "NameTooLong", message)
    } else if let Some(t) = trouble {
        ("False", t.reason, t.message.clone())
    } else {
        let message = format!(
            "{} of {} slots held, {} waiting",
            status.holders.len(),
            lock.spec.max_holders,
            status.queue.len()
        );
        ("True", "Reconciled", message)
    };
    let previous = status.conditions.iter().find(|c| c.type_ == "Ready").cloned();
    let unchanged = previous
        .as_ref()
        .is_some_and(|p| p.status == ready && p.message == message && p.observed_generation == generation);
    if !unchanged {
        let since = previous.filter(|p| p.status == ready).map(|p| p.last_transition_time);
        status.conditions.retain(|c| c.type_ != "Ready");
        status.conditions.push(Condition {
            type_: "Ready".into(),
            status: ready.into(),
            reason: reason.into(),
            message,
            observed_generation: generation,
            last_transition_time: since.unwrap_or(Time(now)),
        });
    }
    status
}

/// Why a deleted lock is still there, if it waits for its revoked holders to stop (see
/// [`crate::decide::occupied`]): the pods whose processes may still run.
fn deletion_waits(lock: &DistributedLock, status: &DistributedLockStatus) -> Option<String> {
    if lock.metadata.deletion_timestamp.is_none()
        || !crate::controller::finalizer::fences(lock)
        || !crate::decide::occupied(status)
    {
        return None;
    }
    let pods: Vec<&str> = status.holders.iter().map(|h| h.pod.as_str()).collect();
    Some(format!(
        "deleted: every grant is revoked and nothing is granted; the lock goes once the \
         holder(s) in pod(s) {} have stopped (released, their pods seen stopped, or a lease \
         duration without a renewal of their claims)",
        pods.join(", ")
    ))
}

#[cfg(test)]
mod tests {

    use super::*;

    #[test]
    fn a_status_is_not_written_for_its_release_url_or_grant_key_alone() {
        let old = DistributedLockStatus {
            fencing_token: 3,
            release_url: Some("http://10.0.0.1:8080".into()),
            ..Default::default()
        };
        let mut new = old.clone();
        new.release_url = Some("http://10.0.0.2:8080".into());
        new.grant_key = Some("ab".repeat(32));
        assert!(
            unchanged(Some(&old), &new),
            "a new leader's URL and key wait for a write"
        );
        new.fencing_token = 4;
        assert!(!unchanged(Some(&old), &new), "and goes with the next one");
        assert!(!unchanged(None, &new));
        assert!(unchanged(Some(&new), &new.clone()));
    }

    #[test]
    fn a_deleted_lock_with_holders_left_says_why_it_is_still_there() {
        let status: DistributedLockStatus = serde_json::from_value(serde_json::json!({
            "fencingToken": 2,
            "holders": [
                {"claim": "a", "pod": "pod-a", "podUID": "ua", "fencingToken": 1, "grantedAt": "2024-01-01T00:00:00Z",
                 "revoked": {"reason": "LockDeleted", "at": "2024-01-01T00:00:01Z"}},
            ],
        }))
        .unwrap();
        let ready = |lock: &DistributedLock, status: &DistributedLockStatus| {
            let s = with_conditions(lock, status.clone(), None, Timestamp::now());
            let c = s.conditions.into_iter().find(|c| c.type_ == "Ready").unwrap();
            (c.status, c.reason, c.message)
        };
        let mut lock = DistributedLock::new("l", crate::api::DistributedLockSpec::default());
        lock.metadata.finalizers = Some(vec![crate::controller::finalizer::LOCK_FINALIZER.into()]);
        assert_eq!(
            ready(&lock, &status).0,
            "True",
            "a live lock holding a slot back is ready"
        );
        lock.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        let (state, reason, message) = ready(&lock, &status);
        assert_eq!((state.as_str(), reason.as_str()), ("False", "Deleting"));
        assert!(message.contains("pod-a"), "{message}");
        assert_eq!(
            ready(&lock, &DistributedLockStatus::default()).1,
            "Reconciled",
            "with no holder left, a deleted lock goes without saying so"
        );
        lock.metadata.finalizers = None;
        assert_eq!(
            ready(&lock, &status).1,
            "Reconciled",
            "a deleted lock without the fence (or on etcd) is let go at once: it waits for nothing"
        );
    }
}
