//! The direct grant: the controller tells the designated successor
//! ([`crate::api::Successor`]) that a slot is its own, straight over HTTP, before it
//! writes the status that lists it as a holder.
//!
//! Through the status alone, a graceful handoff waits for one API write and its watch
//! delivery to every waiter (measured here: about 4 ms for the write and its first
//! delivery, and 1.7 ms more until the granted waiter, one of twenty, has its turn).
//! The successor instead holds a request open at the URL the status published
//! ([`crate::api::DistributedLockStatus::release_url`], path [`GRANT_PATH`]); when a
//! release frees the slot reserved for it, the controller answers that request at once.
//!
//! **Why a grant before the write is safe.** The designation, with its token, was
//! written before any grant can be sent, and the decide core holds the next freed slot
//! for the successor alone until it is granted, withdraws, or has certainly stopped
//! (a successor whose process may run on keeps a slot held back like a revoked holder).
//! So whichever controller writes next, and whatever it knows of the direct grant, the
//! slot goes to the same claim with the same token, and a successor told of its grant
//! is counted in every decision as if it held. One thing the designation cannot fix is
//! the lock's `maxHolders`, which the user may lower after the controller read it: so a
//! grant is sent before its write only where it leaves its successor alone in the lock,
//! within any `maxHolders` (`controller::k8s::turn`); a semaphore's successor granted
//! beside other holders learns of it from the status write, made under the
//! resourceVersion read. The successor then acts by the holder's
//! timing rules ([`super::timing`]) from its last acknowledged write, as after a grant
//! seen in status.
//!
//! **Why it cannot be forged.** The answer carries an Ed25519 signature over the lock
//! (namespace, name, UID), the claim and the token, by the key whose public half the
//! same controller wrote in the status (`grantKey`): only a writer of the lock's status
//! could publish a key, and only the holder of its private half can sign. A waiter
//! trusts a grant only when it verifies against the key of the status that designated
//! it; anything else (a bad signature, another token, a refusal, no answer) and it waits
//! for the status, as before: a direct grant can make a handoff faster, never looser.

use serde::{Deserialize, Serialize};

use super::release::{hex, unhex};

/// The path, under the controller's published URL, where a successor waits (POST, JSON
/// [`WaitFor`]).
pub const GRANT_PATH: &str = "/v1/grant";
/// The answer header carrying the granted fencing token.
pub const TOKEN_HEADER: &str = "leasehold-fencing-token";
/// The answer header carrying the grant's signature (hex).
pub const SIGNATURE_HEADER: &str = "leasehold-grant-signature";
/// The largest wait request the controller reads.
pub const MAX_WAIT_BYTES: usize = 4 * 1024;

/// A successor's request to be told of its grant.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WaitFor {
    /// The lock's namespace.
    pub namespace: String,
    /// The lock's name.
    pub lock: String,
    /// The designated claim Lease's name.
    pub claim: String,
    /// The claim owner's wait proof ([`crate::protocol::release::Secret::wait_proof`]);
    /// the controller takes the wait only if it opens the wait hash recorded for the
    /// claim. (`None` from an older client, whose claim has no wait hash.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proof: Option<String>,
}

/// One direct grant, as signed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant<'a> {
    /// The lock's namespace.
    pub namespace: &'a str,
    /// The lock's name.
    pub lock: &'a str,
    /// The lock's UID (a lock re-created under the same name is another lock).
    pub lock_uid: &'a str,
    /// The claim granted.
    pub claim: &'a str,
    /// The fencing token reserved for it.
    pub fencing_token: i64,
}

impl Grant<'_> {
    /// The bytes signed: every field, one per line, after a fixed tag (no field can
    /// hold a newline: they are Kubernetes names and UIDs).
    pub(crate) fn message(&self) -> Vec<u8> {
        let Grant {
            namespace,
            lock,
            lock_uid,
            claim,
            fencing_token,
        } = self;
        format!("leasehold direct grant v1\n{namespace}\n{lock}\n{lock_uid}\n{claim}\n{fencing_token}\n").into_bytes()
    }

    /// Whether `signature` (hex) is this grant's, by the key published as `public_key`
    /// (hex).
    pub fn verify(&self, public_key: &str, signature: &str) -> bool {
        verify(public_key, &self.message(), signature)
    }

    /// The value of [`super::DIRECT_GRANT_ANNOTATION`] that tells this grant on the
    /// claim: the token, a space, the signature (hex).
    pub fn annotation(&self, signature: &str) -> String {
        format!("{} {signature}", self.fencing_token)
    }

    /// Whether the annotation `value` on the claim tells this grant: its token, signed
    /// by the key published as `public_key`. The same trust as a direct grant over HTTP:
    /// anyone who may patch Leases can write the annotation, none but the controller
    /// can sign it.
    pub fn told_by_annotation(&self, public_key: &str, value: &str) -> bool {
        let Some((token, signature)) = value.split_once(' ') else {
            return false;
        };
        token == self.fencing_token.to_string() && self.verify(public_key, signature)
    }
}

/// A release notice answered as written ([`super::notice::WRITTEN`]), as signed: a
/// client trusts that answer, and writes no release mark, only when it verifies against
/// the key of the status that published the URL it sent its notice to. Whatever else
/// answers there (a stale URL after a failover, a hijacked address) cannot make a
/// holder skip its mark.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WrittenRelease<'a> {
    /// The lock's namespace.
    pub namespace: &'a str,
    /// The lock's name.
    pub lock: &'a str,
    /// The lock's UID.
    pub lock_uid: &'a str,
    /// The claim released.
    pub claim: &'a str,
}

impl WrittenRelease<'_> {
    pub(crate) fn message(&self) -> Vec<u8> {
        let WrittenRelease {
            namespace,
            lock,
            lock_uid,
            claim,
        } = self;
        format!("leasehold release written v1\n{namespace}\n{lock}\n{lock_uid}\n{claim}\n").into_bytes()
    }

    /// Whether `signature` (hex) is this answer's, by the key published as `public_key`.
    pub fn verify(&self, public_key: &str, signature: &str) -> bool {
        verify(public_key, &self.message(), signature)
    }
}

/// Whether `signature` (hex) signs `message` by the Ed25519 key `public_key` (hex).
fn verify(public_key: &str, message: &[u8], signature: &str) -> bool {
    let (Some(key), Some(signature)) = (unhex(public_key), unhex(signature)) else {
        return false;
    };
    let key = ring::signature::UnparsedPublicKey::new(&ring::signature::ED25519, key);
    key.verify(message, &signature).is_ok()
}

/// A controller's signing key, made afresh each time it starts (its public half goes
/// into every status it writes).
pub struct GrantKey(ring::signature::Ed25519KeyPair);

impl std::fmt::Debug for GrantKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GrantKey({})", self.public())
    }
}

impl Default for GrantKey {
    fn default() -> Self {
        Self::generate()
    }
}

impl GrantKey {
    /// A fresh random key.
    pub fn generate() -> Self {
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = ring::signature::Ed25519KeyPair::generate_pkcs8(&rng).expect("the system's RNG works");
        GrantKey(ring::signature::Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).expect("a key ring just made"))
    }

    /// The key of a 32-byte Ed25519 `seed` (the protocol's test vectors).
    #[cfg(test)]
    pub(crate) fn from_seed(seed: &[u8]) -> Self {
        GrantKey(ring::signature::Ed25519KeyPair::from_seed_unchecked(seed).expect("a 32-byte seed"))
    }

    /// The public half, hex-encoded, as published in status.
    pub fn public(&self) -> String {
        use ring::signature::KeyPair;
        hex(self.0.public_key().as_ref())
    }

    /// The signature of `grant`, hex-encoded.
    pub fn sign(&self, grant: &Grant<'_>) -> String {
        hex(self.0.sign(&grant.message()).as_ref())
    }

    /// The signature of a written release, hex-encoded.
    pub fn sign_written(&self, written: &WrittenRelease<'_>) -> String {
        hex(self.0.sign(&written.message()).as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant() -> Grant<'static> {
        Grant {
            namespace: "ns",
            lock: "l",
            lock_uid: "u-1",
            claim: "l-abc",
            fencing_token: 42,
        }
    }

    #[test]
    fn a_grant_verifies_only_against_its_signers_key_and_its_own_fields() {
        let key = GrantKey::generate();
        let signature = key.sign(&grant());
        assert!(grant().verify(&key.public(), &signature));
        assert!(
            !grant().verify(&GrantKey::generate().public(), &signature),
            "another key"
        );
        let others = [
            Grant {
                namespace: "ns2",
                ..grant()
            },
            Grant { lock: "m", ..grant() },
            Grant {
                lock_uid: "u-2",
                ..grant()
            },
            Grant {
                claim: "l-abd",
                ..grant()
            },
            Grant {
                fencing_token: 43,
                ..grant()
            },
        ];
        for other in others {
            assert!(!other.verify(&key.public(), &signature), "{other:?}");
        }
    }

    #[test]
    fn a_written_release_verifies_only_for_its_own_fields_and_never_as_a_grant() {
        let key = GrantKey::generate();
        let w = WrittenRelease {
            namespace: "ns",
            lock: "l",
            lock_uid: "u-1",
            claim: "c-1",
        };
        let sig = key.sign_written(&w);
        assert!(w.verify(&key.public(), &sig));
        let other = WrittenRelease {
            claim: "c-2",
            ..w.clone()
        };
        assert!(!other.verify(&key.public(), &sig), "another claim");
        let recreated = WrittenRelease {
            lock_uid: "u-2",
            ..w.clone()
        };
        assert!(
            !recreated.verify(&key.public(), &sig),
            "a lock re-created under the name"
        );
        assert!(!w.verify(&GrantKey::generate().public(), &sig), "another key");
        let g = Grant {
            namespace: "ns",
            lock: "l",
            lock_uid: "u-1",
            claim: "c-1",
            fencing_token: 7,
        };
        assert!(
            !w.verify(&key.public(), &key.sign(&g)),
            "a grant's signature is no written answer"
        );
    }

    #[test]
    fn a_grant_on_the_claim_is_told_only_with_its_token_and_its_signers_signature() {
        let key = GrantKey::generate();
        let g = grant();
        let value = g.annotation(&key.sign(&g));
        assert!(g.told_by_annotation(&key.public(), &value));
        let other = Grant {
            fencing_token: g.fencing_token + 1,
            ..g.clone()
        };
        let forger = GrantKey::generate();
        for (what, value) in [
            (
                "another token, the same signature",
                value.replacen(&g.fencing_token.to_string(), "8", 1),
            ),
            ("another token, signed", other.annotation(&key.sign(&other))),
            ("another key", g.annotation(&forger.sign(&g))),
            ("no signature", g.fencing_token.to_string()),
            ("empty", String::new()),
            ("two spaces", format!("{} {}", g.fencing_token, value)),
            ("a token written otherwise", format!("+{value}")),
        ] {
            assert!(!g.told_by_annotation(&key.public(), &value), "{what}");
        }
    }

    #[test]
    fn malformed_keys_and_signatures_verify_nothing() {
        let key = GrantKey::generate();
        let signature = key.sign(&grant());
        for (k, s) in [
            ("", signature.as_str()),
            ("zz", signature.as_str()),
            (&key.public()[1..], signature.as_str()),
            (&key.public(), ""),
            (&key.public(), &signature[..126]),
            (&key.public(), "0"),
        ] {
            assert!(!grant().verify(k, s), "{k:?} {s:?}");
        }
        assert_eq!(key.public().len(), 64);
        assert_eq!(signature.len(), 128);
    }
}
