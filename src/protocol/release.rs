//! The release proof: only the process that made a claim can release it.
//!
//! A client keeps a random secret for each claim and writes only its SHA-256 hash on
//! the claim when creating it ([`RELEASE_HASH_ANNOTATION`]); it releases by writing the
//! secret itself as the [`RELEASED_ANNOTATION`]. The controller records the hash in
//! the lock's status when it first queues the claim (status is the controller's alone),
//! and frees a slot at once only for a mark whose hash matches the recorded one.
//! Anyone else who may patch Leases in the namespace can write a mark, but not a
//! matching one: a holder with a forged mark is treated as force-released (its slot is
//! held back one lease), and a forged mark on a waiter is ignored.
//!
//! Claims made without a hash (by older clients) release with `"true"`, as before.

use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;

use super::{RELEASE_HASH_ANNOTATION, RELEASED_ANNOTATION};

/// A claim's release secret: 32 random bytes, hex-encoded.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Secret {
    /// A fresh random secret.
    pub fn generate() -> Self {
        Secret(hex(&rand::random::<[u8; 32]>()))
    }

    /// The secret whose revealed value is `revealed` (the protocol's test vectors).
    #[cfg(test)]
    pub(crate) fn from_revealed(revealed: &str) -> Self {
        Secret(revealed.to_string())
    }

    /// The value written as the release mark.
    pub fn reveal(&self) -> &str {
        &self.0
    }

    /// The hash written on the claim at creation.
    pub fn hash(&self) -> String {
        hash_of(&self.0)
    }

    /// What the owner shows when it waits for a direct grant: derived from the secret
    /// one way, so showing it reveals nothing of the secret itself.
    pub fn wait_proof(&self) -> String {
        hash_of(&format!("leasehold-wait:{}", self.0))
    }

    /// The hash of [`Secret::wait_proof`], written on the claim at creation.
    pub fn wait_hash(&self) -> String {
        hash_of(&self.wait_proof())
    }
}

/// How long a hash is: SHA-256, hex-encoded.
pub const HASH_LEN: usize = 64;

/// Whether `text` has a hash's one format ([`HASH_LEN`] lower-case hex digits): the
/// only form a release or wait hash may take on a claim (checked by the controller,
/// the admission webhook and the admission policy's CEL alike).
pub fn is_hash(text: &str) -> bool {
    text.len() == HASH_LEN && text.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The SHA-256 hash of a release mark, hex-encoded.
pub fn hash_of(mark: &str) -> String {
    hex(ring::digest::digest(&ring::digest::SHA256, mark.as_bytes()).as_ref())
}

/// `bytes`, hex-encoded (lower case).
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The bytes a hex string encodes; `None` unless it is all pairs of hex digits (only
/// digits: `u8::from_str_radix` alone would take `+f` for `0f`).
pub(crate) fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| text.get(i..i + 2).and_then(|pair| u8::from_str_radix(pair, 16).ok()))
        .collect()
}

/// Whether `secret` is the one behind `hash`, a release hash recorded in status.
pub fn opens(hash: &str, secret: &str) -> bool {
    hash_of(secret) == hash
}

/// Whether a release notice's `secret` releases a claim whose recorded hash is
/// `recorded`: only a claim with a hash can be released by notice (an older client's
/// claim, released with `"true"`, has no secret to tell).
pub fn notice_proves(secret: &str, recorded: Option<&str>) -> bool {
    recorded.is_some_and(|hash| opens(hash, secret))
}

/// What a claim's release mark proves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mark {
    /// No release mark.
    None,
    /// A mark its owner wrote: the claim is released.
    Valid,
    /// A mark that does not match the recorded hash: written by someone else.
    Forged,
}

/// The release-hash annotation a claim carries (as its creator wrote it).
pub fn claim_hash(lease: &Lease) -> Option<String> {
    let hash = lease.annotations().get(RELEASE_HASH_ANNOTATION);
    hash.filter(|h| !h.is_empty()).cloned()
}

/// Judge a claim's release mark against `recorded`, the hash the controller recorded
/// when it first queued the claim (`None` for a claim made without one).
pub fn judge(lease: &Lease, recorded: Option<&str>) -> Mark {
    let Some(mark) = lease.annotations().get(RELEASED_ANNOTATION) else {
        return Mark::None;
    };
    let valid = match recorded {
        Some(hash) => opens(hash, mark),
        None => mark == "true",
    };
    if valid { Mark::Valid } else { Mark::Forged }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::claim::{PodIdentity, claim_lease};

    fn marked(mark: Option<&str>) -> Lease {
        let pod = PodIdentity {
            name: "p".into(),
            namespace: "ns".into(),
            uid: "u".into(),
        };
        let mut lease = claim_lease("l-1", "l", &pod, 15);
        if let Some(m) = mark {
            let annotations = lease.metadata.annotations.get_or_insert_default();
            annotations.insert(RELEASED_ANNOTATION.into(), m.into());
        }
        lease
    }

    #[test]
    fn only_the_secret_behind_the_recorded_hash_releases() {
        let secret = Secret::generate();
        let hash = secret.hash();
        assert_eq!(judge(&marked(None), Some(&hash)), Mark::None);
        assert_eq!(judge(&marked(Some(secret.reveal())), Some(&hash)), Mark::Valid);
        assert_eq!(judge(&marked(Some("true")), Some(&hash)), Mark::Forged);
        assert_eq!(
            judge(&marked(Some(&hash)), Some(&hash)),
            Mark::Forged,
            "the hash is no secret"
        );
        let other = Secret::generate();
        assert_eq!(judge(&marked(Some(other.reveal())), Some(&hash)), Mark::Forged);
    }

    #[test]
    fn a_notice_releases_only_with_the_secret_behind_a_recorded_hash() {
        let secret = Secret::generate();
        let hash = secret.hash();
        assert!(notice_proves(secret.reveal(), Some(&hash)));
        assert!(!notice_proves(&hash, Some(&hash)), "the hash is no secret");
        assert!(!notice_proves(Secret::generate().reveal(), Some(&hash)));
        assert!(
            !notice_proves("true", None),
            "a claim without a hash has no secret to tell"
        );
    }

    #[test]
    fn claims_without_a_hash_release_the_old_way() {
        assert_eq!(judge(&marked(Some("true")), None), Mark::Valid);
        assert_eq!(judge(&marked(Some("yes")), None), Mark::Forged);
    }

    #[test]
    fn the_hash_is_sha256() {
        assert_eq!(
            hash_of("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
