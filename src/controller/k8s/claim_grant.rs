//! The direct grant written on the successor's own claim: where the successor could not
//! be told over HTTP (no URL published, its packets dropped, or it does not wait there),
//! and its claim asks for it ([`GRANT_WATCH_ANNOTATION`]), the controller writes the
//! signed grant onto the claim ([`DIRECT_GRANT_ANNOTATION`]), which the successor
//! watches while designated. One Lease write, seen by one watcher, instead of waiting
//! for the lock's status write (which costs the API server three to five Lease writes
//! and wakes every waiter of the lock).
//!
//! It is safe for the reason a direct grant over HTTP is ([`crate::protocol::grant`]):
//! it is written only where an HTTP grant would be told (the stored status designates
//! the claim with that token, and the plan grants it), and the decide core already
//! counts a designated successor as possibly told. The write is not waited for; the
//! turn puts its status write off by [`CLAIM_GRANT_SETTLE`] so that the successor
//! starts first, and a client that misses the annotation learns its grant from the
//! status then.

use std::sync::Arc;

use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;

use crate::controller::context::Context;
use crate::protocol::grant::Grant;
use crate::protocol::{DIRECT_GRANT_ANNOTATION, GRANT_WATCH_ANNOTATION};

/// Whether `claim` asks for its direct grant to be written on it.
pub fn asks(claim: &Lease) -> bool {
    claim
        .annotations()
        .get(GRANT_WATCH_ANNOTATION)
        .is_some_and(|v| v == "true")
}

/// The merge patch that writes `grant`, signed `signature`, on the claim with UID `uid`
/// (a claim re-created under the name refuses it).
pub fn patch(grant: &Grant<'_>, signature: &str, uid: &str) -> serde_json::Value {
    serde_json::json!({
        "metadata": {
            "uid": uid,
            "annotations": { DIRECT_GRANT_ANNOTATION: grant.annotation(signature) },
        }
    })
}

/// How long a turn that wrote a successor's grant on its claim puts off the lock's
/// status write: long enough for the Lease write, its watch event and the successor's
/// start (about 6 ms after the write is sent, measured here), so that the status write,
/// its delivery to every waiter of the lock and the events do not compete with them
/// for the API server and the CPU. Measured with 20 waiters: the handoff without
/// release notices 4.3× → 2.8× `etcdctl lock` (see docs/measurements.md).
pub const CLAIM_GRANT_SETTLE: std::time::Duration = std::time::Duration::from_millis(20);

/// Write `grant` on its claim if the claim (as cached) asks for it and the status that
/// designated it published this replica's key (`designated_by`: its client checks the
/// grant by that key alone, so a grant signed by another is no use to it), not waited
/// for; whether it was sent.
pub fn write(ctx: &Arc<Context>, grant: &Grant<'_>, designated_by: Option<&str>) -> bool {
    let successors = &ctx.k8s.notices.successors;
    if designated_by != Some(successors.public_key().as_str()) {
        return false;
    }
    let at = ObjectRef::<Lease>::new(grant.claim).within(grant.namespace);
    let Some(claim) = ctx.k8s.leases.get(&at).filter(|c| asks(c)) else {
        return false;
    };
    let signature = successors.sign(grant);
    let body = patch(grant, &signature, &claim.uid().unwrap_or_default());
    let api: Api<Lease> = Api::namespaced(ctx.client.clone(), grant.namespace);
    let (name, token, ctx) = (grant.claim.to_string(), grant.fencing_token, Arc::clone(ctx));
    tokio::spawn(async move {
        match api.patch(&name, &PatchParams::default(), &Patch::Merge(&body)).await {
            Ok(_) => {
                ctx.metrics.claim_grants.inc();
                tracing::debug!(claim = name, token, "successor's grant written on its claim");
            }
            // The successor learns its grant from the status instead.
            Err(e) => tracing::debug!(claim = name, token, error = %e, "writing the grant on the claim failed"),
        }
    });
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::grant::GrantKey;

    #[test]
    fn the_patch_carries_the_signed_grant_under_the_claims_uid() {
        let key = GrantKey::generate();
        let grant = Grant {
            namespace: "ns",
            lock: "l",
            lock_uid: "u-1",
            claim: "l-0123456789ab",
            fencing_token: 9,
        };
        let body = patch(&grant, &key.sign(&grant), "c-uid");
        assert_eq!(body["metadata"]["uid"], "c-uid");
        let value = body["metadata"]["annotations"][DIRECT_GRANT_ANNOTATION]
            .as_str()
            .unwrap();
        assert!(grant.told_by_annotation(&key.public(), value), "{value}");
    }

    #[test]
    fn only_a_claim_that_asks_gets_its_grant_written() {
        let mut claim = Lease::default();
        assert!(!asks(&claim));
        claim
            .annotations_mut()
            .insert(GRANT_WATCH_ANNOTATION.into(), "yes".into());
        assert!(!asks(&claim));
        claim
            .annotations_mut()
            .insert(GRANT_WATCH_ANNOTATION.into(), "true".into());
        assert!(asks(&claim));
    }
}
