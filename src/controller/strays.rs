//! Revoked holders' claims out of view: a hold-back ends only once the claim is gone.
//!
//! The controller follows claims through their lock label. Anyone who may patch Leases
//! can remove or change that label on a holder's claim: the controller then sees the
//! claim go and revokes the grant with its slot held back (a forced release), while the
//! holder's renewals of the claim, by name and UID, go on succeeding. A holder that
//! cannot read its lock's status (reads failing while writes work) would run on past
//! the hold-back. So when a revoked holder's hold-back ends with its claim out of view,
//! the claim is read by name: one still there is deleted under that read (its UID and
//! resourceVersion, so a renewal since makes the deletion fail and is read again), and
//! the hold-back counts again from the deletion, by when every renewal the holder saw
//! acknowledged was sent; one gone lets the hold-back end.

use std::time::Instant;

use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;
use kube::api::Api;

use super::context::Context;
use super::reconcile::{Error, expiry_delete};

/// Look up each stray claim of `lock` (namespace `ns`) by name, as the module says.
/// Returns whether anything was learnt (then plan again).
pub async fn confirm(ctx: &Context, ns: &str, lock: &str, strays: &[String]) -> Result<bool, Error> {
    let leases: Api<Lease> = Api::namespaced(ctx.client.clone(), ns);
    for claim in strays {
        let found = leases
            .get_opt(claim)
            .await
            .map_err(|e| Error::ReadStray(claim.clone(), e))?;
        let Some(fresh) = found else {
            let mut tracker = ctx.tracker.lock().expect("tracker lock poisoned");
            tracker.found_stray_gone(ns, lock, claim);
            continue;
        };
        match leases.delete(claim, &expiry_delete(&fresh)).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.is_not_found() => {}
            // Written since the read: read it again on the next plan.
            Err(kube::Error::Api(s)) if s.is_conflict() => continue,
            Err(e) => return Err(Error::DeleteStray(claim.clone(), e)),
        }
        tracing::warn!(
            claim,
            labels = ?fresh.labels(),
            "a revoked holder's claim was still there without its lock label: deleted it; \
             its slot is held back one more lease from now"
        );
        let mut tracker = ctx.tracker.lock().expect("tracker lock poisoned");
        tracker.restart_hold_back(ns, lock, claim, Instant::now());
    }
    Ok(!strays.is_empty())
}
