//! How a lock reads to a person: the status table `leasehold status` prints, and the
//! demo prints as the lock changes.

use jiff::Timestamp;

use crate::api::DistributedLock;

/// The human-readable status table.
pub fn table(lock: &DistributedLock, now: Timestamp) -> String {
    use std::fmt::Write;
    let st = lock.status.clone().unwrap_or_default();
    let ago = |t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time| {
        let secs = (now.as_second() - t.0.as_second()).max(0);
        format!("{secs}s")
    };
    let mut out = String::new();
    let name = lock.metadata.name.as_deref().unwrap_or("");
    let _ = writeln!(
        out,
        "Lock {name}: fencing token {}, {} of {} slots held, {} waiting (lease {}s)",
        st.fencing_token,
        st.holders.len(),
        lock.spec.max_holders,
        st.queue.len(),
        lock.spec.lease_duration_seconds
    );
    let _ = writeln!(
        out,
        "\n{:<8} {:<30} {:<8} {:<10} CLAIM",
        "ROLE", "POD", "TOKEN", "SINCE"
    );
    for h in &st.holders {
        let role = if h.revoked.is_some() { "revoked" } else { "holder" };
        let _ = writeln!(
            out,
            "{role:<8} {:<30} {:<8} {:<10} {}",
            h.pod,
            h.fencing_token,
            ago(&h.granted_at),
            h.claim
        );
    }
    for (i, w) in st.queue.iter().enumerate() {
        // The successor's token is reserved: it is the one its grant will carry.
        let reserved = st.successor.as_ref().filter(|s| s.claim == w.claim);
        let (role, token) = match reserved {
            Some(s) => ("next".to_string(), s.fencing_token.to_string()),
            None => (format!("#{}", i + 1), "-".to_string()),
        };
        let _ = writeln!(
            out,
            "{role:<8} {:<30} {token:<8} {:<10} {}",
            w.pod,
            ago(&w.requested_at),
            w.claim
        );
    }
    out
}
