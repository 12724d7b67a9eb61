//! Where claims live in etcd and what a claim key holds: written by the client,
//! read by the client and the controller, in one place.

use serde::{Deserialize, Serialize};

use crate::api::{EtcdBackend, RevokeReason};
use crate::protocol::PodIdentity;

/// The prefix of all claim keys of lock `name` in `namespace`, ending in `/`.
pub fn lock_prefix(backend: &EtcdBackend, namespace: &str, name: &str) -> String {
    format!("{}/{namespace}/{name}/", backend.prefix())
}

/// The key of claim `claim` of lock `name` in `namespace`.
pub fn claim_key(backend: &EtcdBackend, namespace: &str, name: &str, claim: &str) -> String {
    format!("{}{claim}", lock_prefix(backend, namespace, name))
}

/// The claim's name: the key with the lock's prefix taken off.
pub fn claim_of<'k>(prefix: &str, key: &'k str) -> &'k str {
    key.strip_prefix(prefix).unwrap_or(key)
}

/// What a claim key holds (JSON).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ClaimValue {
    /// The pod whose process made the claim.
    pub pod: String,
    /// That pod's UID.
    #[serde(rename = "podUID")]
    pub pod_uid: String,
    /// The lease the process lives by, in seconds.
    pub lease_seconds: i32,
    /// Set by the controller when it moved the key onto a lease of its own: why the
    /// claim was revoked. The key then holds its place until that lease ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_back: Option<RevokeReason>,
}

impl ClaimValue {
    /// The value a process writes for its claim.
    pub fn new(identity: &PodIdentity, lease_seconds: i32) -> Self {
        ClaimValue {
            pod: identity.name.clone(),
            pod_uid: identity.uid.clone(),
            lease_seconds,
            held_back: None,
        }
    }

    /// Parse a key's value; `None` when it is no claim value.
    pub fn parse(bytes: &[u8]) -> Option<Self> {
        serde_json::from_slice(bytes).ok()
    }

    /// The JSON bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a claim value serializes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_nest_namespace_lock_and_claim_under_the_prefix() {
        let mut b = EtcdBackend {
            endpoints: vec!["http://e:2379".into()],
            key_prefix: None,
            tls_secret_ref: None,
        };
        assert_eq!(claim_key(&b, "ns", "l", "l-1"), "/leasehold/ns/l/l-1");
        b.key_prefix = Some("/x/".into());
        assert_eq!(lock_prefix(&b, "ns", "l"), "/x/ns/l/");
        assert_eq!(claim_of("/x/ns/l/", "/x/ns/l/l-1"), "l-1");
    }

    #[test]
    fn values_round_trip_and_garbage_is_no_claim() {
        let id = PodIdentity {
            name: "p".into(),
            namespace: "ns".into(),
            uid: "u".into(),
        };
        let v = ClaimValue::new(&id, 7);
        assert_eq!(ClaimValue::parse(&v.to_bytes()), Some(v));
        assert_eq!(ClaimValue::parse(b"not json"), None);
        assert_eq!(ClaimValue::parse(br#"{"pod":"p"}"#), None);
    }
}
