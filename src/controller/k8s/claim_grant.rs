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
//!
//! Not where the successor takes the grant from its predecessor's release mark itself
//! ([`crate::protocol::handover`]): when its claim says it watches for that
//! ([`HANDOVER_WATCH_ANNOTATION`]), the status that designated it has a key (without
//! one the client follows no designation), and the holder's claim, as cached, carries
//! the mark that opens the recorded hash. The successor's watch shows it the same mark,
//! and a grant written on its claim would only cost the API server a Lease write and
//! its delivery while the successor starts. The status write is put off all the same,
//! and grants a successor that has not seen the mark by then.

use std::sync::Arc;

use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;

use crate::controller::context::Context;
use crate::protocol::grant::Grant;
use crate::protocol::{DIRECT_GRANT_ANNOTATION, GRANT_WATCH_ANNOTATION, HANDOVER_WATCH_ANNOTATION, Handover};

/// Whether `claim` asks for its direct grant to be written on it.
pub fn asks(claim: &Lease) -> bool {
    says_true(claim, GRANT_WATCH_ANNOTATION)
}

/// Whether `claim`'s client watches its predecessor's claim for the handover.
pub fn takes_handover(claim: &Lease) -> bool {
    says_true(claim, HANDOVER_WATCH_ANNOTATION)
}

fn says_true(claim: &Lease, annotation: &str) -> bool {
    claim.annotations().get(annotation).is_some_and(|v| v == "true")
}

/// Whether the successor `successor` (its claim as cached) takes its grant from the
/// holder's release mark itself: it watches for it, and `holder` (the holder's claim as
/// cached) carries the mark that hands over.
pub fn handed_over(successor: &Lease, handover: &Handover<'_>, holder: Option<&Lease>) -> bool {
    takes_handover(successor) && holder.is_some_and(|h| handover.released_by(h))
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
/// for; or not where the successor takes it by `handover` ([`handed_over`]). Whether
/// the successor learns its grant on a claim (its own or its predecessor's): then the
/// status write is put off.
pub fn write(
    ctx: &Arc<Context>,
    grant: &Grant<'_>,
    designated_by: Option<&str>,
    handover: Option<Handover<'_>>,
) -> bool {
    let cached = |name: &str| {
        ctx.k8s
            .leases
            .get(&ObjectRef::<Lease>::new(name).within(grant.namespace))
    };
    let Some(claim) = cached(grant.claim) else {
        return false;
    };
    // As the client sees it: it follows a designation only from a status with a key.
    let keyed = designated_by.is_some();
    if keyed && handover.is_some_and(|h| handed_over(&claim, &h, cached(h.from).as_deref())) {
        tracing::debug!(
            claim = grant.claim,
            "successor takes its grant from the holder's release mark"
        );
        return true;
    }
    let successors = &ctx.k8s.notices.successors;
    if designated_by != Some(successors.public_key().as_str()) || !asks(&claim) {
        return false;
    }
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
    use crate::protocol::{RELEASED_ANNOTATION, release};

    fn lease(name: &str, annotations: &[(&str, &str)]) -> Lease {
        let mut lease = Lease::default();
        lease.metadata.name = Some(name.into());
        let annotations = annotations.iter().map(|(k, v)| (k.to_string(), v.to_string()));
        lease.metadata.annotations = Some(annotations.collect());
        lease
    }

    #[test]
    fn only_a_successor_watching_for_it_is_left_to_the_holders_valid_mark() {
        let secret = release::Secret::generate();
        let hash = secret.hash();
        let h = Handover {
            from: "a",
            hash: &hash,
            token: 8,
        };
        let watching = lease(
            "b",
            &[(HANDOVER_WATCH_ANNOTATION, "true"), (GRANT_WATCH_ANNOTATION, "true")],
        );
        let marked = lease("a", &[(RELEASED_ANNOTATION, secret.reveal())]);
        assert!(handed_over(&watching, &h, Some(&marked)));
        // A client that does not watch for the mark (the Python client) is written its grant.
        for asks in [
            vec![(GRANT_WATCH_ANNOTATION, "true")],
            vec![(HANDOVER_WATCH_ANNOTATION, "yes")],
        ] {
            assert!(!handed_over(&lease("b", &asks), &h, Some(&marked)), "{asks:?}");
        }
        // Nor where the holder's claim shows no mark that hands over.
        let other = release::Secret::generate();
        for (what, holder) in [
            ("no claim in the cache", None),
            ("no mark", Some(lease("a", &[]))),
            ("\"true\"", Some(lease("a", &[(RELEASED_ANNOTATION, "true")]))),
            (
                "another secret",
                Some(lease("a", &[(RELEASED_ANNOTATION, other.reveal())])),
            ),
            (
                "another claim's mark",
                Some(lease("c", &[(RELEASED_ANNOTATION, secret.reveal())])),
            ),
        ] {
            assert!(!handed_over(&watching, &h, holder.as_ref()), "{what}");
        }
    }

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
