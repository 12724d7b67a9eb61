//! Revoked holders' claims out of view: a hold-back counts from no earlier than a read
//! that found the claim gone, or this controller's deletion of it.
//!
//! The controller follows claims through their lock label. Anyone who may patch Leases
//! can remove or change that label on a holder's claim: the controller then sees the
//! claim go and revokes the grant with its slot held back (a forced release), while the
//! holder's renewals of the claim, by name and UID, may go on succeeding, and the claim
//! may be deleted later by anyone, unseen. A holder that cannot read its lock's status
//! (reads failing while writes work) would run on past the hold-back. So a revoked
//! holder whose claim is out of view is looked up by name, once, before anything else is
//! decided (and again after a restart): one still there is deleted under that read (its
//! UID and resourceVersion, so a renewal since makes the deletion fail and is read
//! again); and whether deleted now or found gone, the hold-back counts again from then,
//! by when every renewal the holder saw acknowledged was sent. Looked up when the
//! revocation is first decided, this costs the hold-back nothing.

use kube::ResourceExt;

use super::claim_io::ClaimIo;
use crate::controller::k8s::claims::delete_as_read;
use crate::mutant::{Mutant, on as mutant};

/// Errors looking up a stray claim, each naming the action that failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading a revoked holder's claim out of view by name failed.
    #[error("looking up claim {0}, out of view since its holder's revocation: {1}")]
    Read(String, #[source] kube::Error),
    /// Deleting a revoked holder's claim found out of view failed.
    #[error("deleting claim {0}, found without its lock label: {1}")]
    Delete(String, #[source] kube::Error),
}

impl Error {
    /// A short fixed string for metric labels.
    pub fn category(&self) -> &'static str {
        match self {
            Error::Read(..) => "read_stray",
            Error::Delete(..) => "delete_stray",
        }
    }
}

/// Look up each stray claim of `lock` (namespace `ns`) by name, as the module says.
/// Returns whether anything was learnt (then plan again).
pub async fn confirm<IO: ClaimIo>(io: &IO, (ns, lock): (&str, &str), strays: &[String]) -> Result<bool, Error> {
    for claim in strays {
        if mutant(Mutant::StrayWithoutRead) {
            // Taken as gone on the cache's word: neither read nor deleted.
        } else if let Some(fresh) = io
            .read_claim(ns, claim)
            .await
            .map_err(|e| Error::Read(claim.clone(), e))?
        {
            // Deleted, or being deleted (a finalizer someone added holds it: a renewal
            // answered with a deletionTimestamp counts as refused by its client).
            match io.delete_claim(ns, claim, delete_as_read(&fresh)).await {
                Ok(()) => {}
                Err(kube::Error::Api(s)) if s.is_not_found() => {}
                // Written since the read: renewed now, as for an expiry; looked up again
                // when its hold-back, counted from now, is over.
                Err(kube::Error::Api(s)) if s.is_conflict() => {
                    let now = io.now();
                    io.tracker(|t| t.found_stray_renewed(ns, lock, claim, now));
                    continue;
                }
                Err(e) => return Err(Error::Delete(claim.clone(), e)),
            }
            tracing::warn!(
                claim,
                labels = ?fresh.labels(),
                "a revoked holder's claim was still there without its lock label: deleted it; \
                 its slot is held back a lease from now"
            );
        }
        // Gone as of now: the hold-back counts from here, once.
        let now = io.now();
        io.tracker(|t| {
            t.restart_hold_back(ns, lock, claim, now);
            t.found_stray_gone(ns, lock, claim);
        });
    }
    Ok(!strays.is_empty())
}
