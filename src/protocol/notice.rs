//! The release notice: a holder tells the controller of its release straight away, over
//! HTTP, instead of only through its claim.
//!
//! Through the claim alone a graceful handoff is two API writes and two watch
//! deliveries in a row: the holder's release mark, the controller's watch showing it,
//! the controller's status write, the next holder's watch showing that. A notice takes
//! out the first write and the first delivery. The controller publishes where it takes
//! notices in the lock's status ([`crate::api::DistributedLockStatus::release_url`]);
//! a releasing holder POSTs a [`Notice`] there, carrying its claim's release secret.
//!
//! **Why it proves as much as the mark.** The controller accepts a notice only when the
//! secret's hash is the one recorded in the lock's status for that claim
//! ([`super::release`]), and then treats the claim exactly as one carrying a valid
//! release mark. Only the claim's process knows the secret, and it reveals it (in a
//! notice as in a mark) only once its work has stopped. Seeing the secret on the wire
//! therefore gives nobody anything: the claim is being released already.
//!
//! **Unlike a mark, a notice that does not match changes nothing.** A forged mark on a
//! holder's claim revokes it (its slot held back); a notice anyone can send must not
//! take a grant away, so a mismatch is only refused.
//!
//! **What the answer means.** [`WRITTEN`] (200, with [`WRITTEN_HEADER`] and a signature
//! by the key the lock's status publishes, [`WRITTEN_SIGNATURE_HEADER`]): the controller
//! has written a newer status of the same lock that no longer names the claim, so the
//! release is recorded where grants are, and it has seen the claim deleted, so no later
//! controller can take the unmarked claim for a new one; the client writes nothing more. Anything else (a
//! refusal, [`ACCEPTED`] when the status was not written within
//! [`super::timing::NOTICE_WAIT`], a
//! timeout, no route to the controller) and the client writes the release mark as
//! before: a notice can make a release faster, never lost.

use serde::{Deserialize, Serialize};

/// The path, under the controller's published URL, that takes notices (POST, JSON).
pub const NOTICE_PATH: &str = "/v1/release";
/// The largest notice body the controller reads.
pub const MAX_NOTICE_BYTES: usize = 4 * 1024;
/// Status code: the release is written in the lock's status.
pub const WRITTEN: u16 = 200;
/// The response header (value [`WRITTEN_VALUE`]) that says a 200 comes from a
/// controller that wrote the release, not from whatever else answers at a stale URL.
pub const WRITTEN_HEADER: &str = "leasehold-release";
/// The value of [`WRITTEN_HEADER`] on a [`WRITTEN`] answer.
pub const WRITTEN_VALUE: &str = "written";
/// The response header carrying the written answer's signature (hex, by the grant key:
/// see [`super::grant::WrittenRelease`]). A written answer without a valid one is
/// taken as not written.
pub const WRITTEN_SIGNATURE_HEADER: &str = "leasehold-release-signature";
/// Status code: the notice was valid, but the status was not written in time.
pub const ACCEPTED: u16 = 202;

/// A holder's release, told to the controller.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Notice {
    /// The lock's namespace.
    pub namespace: String,
    /// The lock's name.
    pub lock: String,
    /// The claim Lease's name.
    pub claim: String,
    /// The claim's release secret (see [`super::release`]).
    pub secret: String,
}

impl std::fmt::Debug for Notice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Notice")
            .field("namespace", &self.namespace)
            .field("lock", &self.lock)
            .field("claim", &self.claim)
            .finish_non_exhaustive()
    }
}

/// Where notices go, given the URL a lock's status publishes; `None` unless it is a
/// plain `http://host:port` URL (a controller publishes nothing else).
pub fn notice_uri(release_url: &str) -> Option<http::Uri> {
    endpoint(release_url, NOTICE_PATH)
}

/// The URI of the controller's endpoint `path` under its published `release_url`, if
/// that is a plain `http://host:port` URL.
pub fn endpoint(release_url: &str, path: &str) -> Option<http::Uri> {
    let uri: http::Uri = format!("{}{path}", release_url.trim_end_matches('/')).parse().ok()?;
    (uri.scheme_str() == Some("http") && uri.port_u16().is_some() && uri.host().is_some()).then_some(uri)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_plain_http_url_with_a_port_is_a_notice_target() {
        let uri = notice_uri("http://10.1.2.3:8080").unwrap();
        assert_eq!(uri.to_string(), "http://10.1.2.3:8080/v1/release");
        assert_eq!(notice_uri("http://10.1.2.3:8080/").unwrap(), uri);
        assert!(notice_uri("https://10.1.2.3:8080").is_none());
        assert!(notice_uri("http://10.1.2.3").is_none());
        assert!(notice_uri("not a url").is_none());
        assert!(notice_uri("").is_none());
    }

    #[test]
    fn a_notice_never_shows_its_secret_in_logs() {
        let n = Notice {
            namespace: "ns".into(),
            lock: "l".into(),
            claim: "l-1".into(),
            secret: "s3cr3t".into(),
        };
        assert!(!format!("{n:?}").contains("s3cr3t"));
        let wire = serde_json::to_value(&n).unwrap();
        assert_eq!(wire["secret"], "s3cr3t");
        assert_eq!(wire["namespace"], "ns");
    }
}
