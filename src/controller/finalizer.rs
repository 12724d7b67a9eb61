//! The lock's finalizer: a lock is let go only once none of its holders' processes may
//! still run.
//!
//! A lock deleted and re-created under the same name starts with an empty status, so
//! a process still running on a grant of the old lock would be forgotten, and its slot
//! granted again. The controller therefore puts [`LOCK_FINALIZER`] on every lock whose
//! claims are Leases before it grants anything. A deleted lock is then decided on as
//! *closing* ([`crate::decide`]): it grants nothing, revokes every holder and its
//! designated successor (a controller may have told it of its grant), and keeps their
//! slots held back until their processes have stopped (a valid release, their pods
//! stopped, or a lease without renewal). Once it has no holder left ([`occupied`]),
//! the finalizer is removed, guarded by the resourceVersion of the status it judged
//! from (a write meanwhile makes it look again). The API server refuses to create an
//! object under a name still being deleted, so no re-created lock exists while an old
//! holder may run: nothing needs to outlive the lock, not even a claim (which goes with
//! its pod when the pod is force-deleted).
//!
//! The finalizer costs one write per lock's lifetime; `kubectl delete` takes until the
//! holders have stopped (a live client stops at once on the revocation).

use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action as Requeue;

use crate::api::{DistributedLock, DistributedLockStatus};
use crate::controller::context::Context;

/// How soon a deleted lock found still [occupied](crate::decide::occupied) at its retirement is looked at
/// again (its reconcile requeues itself for the hold-back's end; this is a backstop).
const RECHECK: std::time::Duration = std::time::Duration::from_secs(1);

/// How many write conflicts adding (or, uninstalling, stripping) the finalizer rides
/// out before it fails (the reconcile is retried).
const MAX_ADD_ATTEMPTS: usize = 8;

/// The finalizer the controller puts on locks whose claims are Leases.
pub const LOCK_FINALIZER: &str = "leasehold.dev/fence-holders";

/// Errors of the finalizer's writes, each naming the action that failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Adding the finalizer failed.
    #[error("adding finalizer {LOCK_FINALIZER} to DistributedLock {0}: {1}")]
    Add(String, #[source] kube::Error),
    /// Reading the deleted lock afresh failed.
    #[error("reading the deleted DistributedLock {0}: {1}")]
    Read(String, #[source] kube::Error),
    /// Removing the finalizer failed (a conflict: the lock changed since it was read).
    #[error("removing finalizer {LOCK_FINALIZER} from DistributedLock {0}: {1}")]
    Remove(String, #[source] kube::Error),
}

impl Error {
    /// A short fixed string for metric labels.
    pub fn category(&self) -> &'static str {
        match self {
            Error::Add(..) => "finalizer_add",
            Error::Read(..) => "finalizer_read",
            Error::Remove(..) => "finalizer_remove",
        }
    }
}

/// Whether `lock` carries the finalizer.
pub fn has_finalizer(lock: &DistributedLock) -> bool {
    lock.finalizers().iter().any(|f| f == LOCK_FINALIZER)
}

/// The lock's finalizers with [`LOCK_FINALIZER`] added (`true`) or removed (`false`).
fn finalizers_with(lock: &DistributedLock, on: bool) -> Vec<String> {
    let mut list: Vec<String> = lock
        .finalizers()
        .iter()
        .filter(|f| *f != LOCK_FINALIZER)
        .cloned()
        .collect();
    if on {
        list.push(LOCK_FINALIZER.into());
    }
    list
}

/// The merge patch that sets the lock's finalizers, guarded by its resourceVersion.
fn finalizers_patch(lock: &DistributedLock, on: bool) -> serde_json::Value {
    serde_json::json!({
        "metadata": {
            "finalizers": finalizers_with(lock, on),
            "resourceVersion": lock.resource_version(),
        }
    })
}

/// Put the finalizer on `current` before anything is granted. Returns whether the lock
/// is still there; `current` becomes the lock as written (or re-read after a conflict).
pub async fn ensure(
    written: &crate::controller::cache::written::Written,
    api: &Api<DistributedLock>,
    current: &mut DistributedLock,
) -> Result<bool, Error> {
    let name = current.name_any();
    let mut attempts = 0;
    while !has_finalizer(current) {
        let patch = finalizers_patch(current, true);
        match api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(now) => {
                written.record(current.metadata.resource_version.clone(), now.clone());
                *current = now;
            }
            // Written meanwhile: look again (the re-read may lack the finalizer still).
            Err(kube::Error::Api(s)) if s.is_conflict() && attempts < MAX_ADD_ATTEMPTS => {
                attempts += 1;
                match api.get_opt(&name).await {
                    Ok(Some(fresh)) => *current = fresh,
                    Ok(None) => return Ok(false),
                    Err(e) => return Err(Error::Read(name, e)),
                }
            }
            Err(kube::Error::Api(s)) if s.is_not_found() => return Ok(false),
            Err(e) => return Err(Error::Add(name, e)),
        }
    }
    Ok(true)
}

/// Take the finalizer off `lock` whatever its holders, guarded by its resourceVersion
/// and re-read on a conflict: for uninstalling, when no controller will fence them any
/// more. Returns whether it was on.
pub async fn strip(api: &Api<DistributedLock>, lock: &DistributedLock) -> Result<bool, Error> {
    let name = lock.name_any();
    let mut current = lock.clone();
    for _ in 0..MAX_ADD_ATTEMPTS {
        if !has_finalizer(&current) {
            return Ok(false);
        }
        let patch = finalizers_patch(&current, false);
        match api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => return Ok(true),
            Err(kube::Error::Api(s)) if s.is_not_found() => return Ok(false),
            Err(kube::Error::Api(s)) if s.is_conflict() => match api.get_opt(&name).await {
                Ok(Some(fresh)) => current = fresh,
                Ok(None) => return Ok(false),
                Err(e) => return Err(Error::Read(name, e)),
            },
            Err(e) => return Err(Error::Remove(name, e)),
        }
    }
    let conflict = kube::core::Status::failure("written meanwhile, again and again", "Conflict").with_code(409);
    Err(Error::Remove(name, kube::Error::Api(conflict.boxed())))
}

/// Whether `lock` is fenced by the finalizer: a Lease-backed lock carrying it, decided
/// on as closing once deleted (an etcd-backed lock's holders live by their keys).
pub fn fences(lock: &DistributedLock) -> bool {
    lock.spec.etcd().is_none() && has_finalizer(lock)
}

/// Whether `lock` is deleted and, judged by `status`, no process may run under it any
/// more ([`crate::decide::occupied`]): it goes now.
pub fn lets_go(lock: &DistributedLock, status: &DistributedLockStatus) -> bool {
    lock.metadata.deletion_timestamp.is_some() && !crate::decide::occupied(status)
}

/// A deleted lock: let it go, once no holder's process may still run (Lease backend;
/// an etcd-backed lock's holders live by their keys, which it leaves).
pub async fn retire(ctx: &Context, lock: &DistributedLock) -> Result<Requeue, Error> {
    let (ns, name) = (lock.namespace().unwrap_or_default(), lock.name_any());
    let api: Api<DistributedLock> = Api::namespaced(ctx.client.clone(), &ns);
    // The holders as they stand now, not as a lagging cache shows them.
    let fresh = match api.get_opt(&name).await {
        Ok(Some(fresh)) => fresh,
        Ok(None) => return Ok(Requeue::await_change()),
        Err(e) => return Err(Error::Read(name, e)),
    };
    // Only the lock judged here, still deleted: another under its name (made again
    // meanwhile) keeps its finalizer, whatever a stale view of this one showed.
    if !has_finalizer(&fresh) || fresh.uid() != lock.uid() || fresh.metadata.deletion_timestamp.is_none() {
        return Ok(Requeue::await_change());
    }
    if fresh.spec.etcd().is_none() && fresh.status.as_ref().is_some_and(crate::decide::occupied) {
        // Written since the caller looked (another replica): decide on it again.
        return Ok(Requeue::requeue(RECHECK));
    }
    let patch = finalizers_patch(&fresh, false);
    match api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(_) => Ok(Requeue::await_change()),
        Err(kube::Error::Api(s)) if s.is_not_found() => Ok(Requeue::await_change()),
        Err(e) => Err(Error::Remove(name, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::DistributedLockSpec;

    fn lock(finalizers: &[&str]) -> DistributedLock {
        let mut l = DistributedLock::new("l", DistributedLockSpec::default());
        l.metadata.finalizers = Some(finalizers.iter().map(|f| f.to_string()).collect());
        l.metadata.resource_version = Some("7".into());
        l
    }

    /// An API whose answers to PATCH and GET are taken, in order, from `answers`
    /// (status code, body), counting the PATCHes.
    fn scripted(
        answers: Vec<(u16, serde_json::Value)>,
    ) -> (Api<DistributedLock>, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
        let answers = std::sync::Arc::new(std::sync::Mutex::new(std::collections::VecDeque::from(answers)));
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = seen.clone();
        let client = crate::testing::mock_api::client(move |req| {
            log.lock().unwrap().push(req.method().to_string());
            let answer = answers.lock().unwrap().pop_front().expect("an unscripted request");
            async move { answer }
        });
        (Api::namespaced(client, "ns"), seen)
    }

    #[tokio::test]
    async fn adding_the_finalizer_rides_out_a_conflict_whose_re_read_still_lacks_it() {
        let mut bare = lock(&[]);
        bare.metadata.namespace = Some("ns".into());
        let conflict = crate::testing::mock_api::status(409, "Conflict", "the object has been modified");
        let mut re_read = bare.clone();
        re_read.metadata.resource_version = Some("8".into());
        let mut with = re_read.clone();
        with.metadata.finalizers = Some(vec![LOCK_FINALIZER.into()]);
        with.metadata.resource_version = Some("9".into());
        let (api, seen) = scripted(vec![
            (409, conflict),
            (200, serde_json::to_value(&re_read).unwrap()),
            (200, serde_json::to_value(&with).unwrap()),
        ]);
        let mut current = bare;
        let there = ensure(&Default::default(), &api, &mut current).await.unwrap();
        assert!(there);
        assert!(has_finalizer(&current), "nothing is granted before the finalizer is on");
        assert_eq!(*seen.lock().unwrap(), ["PATCH", "GET", "PATCH"]);
    }

    #[test]
    fn adding_keeps_other_finalizers_once_and_is_guarded_by_the_resource_version() {
        let patch = finalizers_patch(&lock(&["other"]), true);
        assert_eq!(
            patch["metadata"]["finalizers"],
            serde_json::json!(["other", LOCK_FINALIZER])
        );
        assert_eq!(patch["metadata"]["resourceVersion"], "7");
        let again = finalizers_patch(&lock(&[LOCK_FINALIZER, "other"]), true);
        assert_eq!(
            again["metadata"]["finalizers"],
            serde_json::json!(["other", LOCK_FINALIZER])
        );
    }

    #[test]
    fn removing_leaves_other_finalizers() {
        let patch = finalizers_patch(&lock(&["a", LOCK_FINALIZER, "b"]), false);
        assert_eq!(patch["metadata"]["finalizers"], serde_json::json!(["a", "b"]));
        assert!(has_finalizer(&lock(&[LOCK_FINALIZER])));
        assert!(!has_finalizer(&lock(&["a"])));
    }
}
