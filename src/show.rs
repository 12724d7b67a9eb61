//! How a lock reads to a person: the status table `leasehold status` prints, and the
//! demo prints as the lock changes.

use jiff::Timestamp;

use crate::api::{DistributedLock, DistributedLockStatus};

/// The human-readable status: a summary line, the Ready condition, then one row per
/// holder, waiter and refused claim, each column as wide as its widest cell.
pub fn table(lock: &DistributedLock, now: Timestamp) -> String {
    use std::fmt::Write;
    let st = lock.status.clone().unwrap_or_default();
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
    let _ = writeln!(out, "{}", ready_line(&st));
    let _ = writeln!(out);
    let rows = rows(&st, now);
    let widths: Vec<usize> = (0..HEADER.len())
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    for row in &rows {
        let cells = row.iter().zip(&widths).map(|(cell, w)| format!("{cell:<w$}"));
        let _ = writeln!(out, "{}", cells.collect::<Vec<_>>().join("  ").trim_end());
    }
    out
}

const HEADER: [&str; 6] = ["ROLE", "POD", "TOKEN", "SINCE", "CLAIM", "REASON"];

/// The Ready condition in one line: `Ready: True (Granting)`, its message after.
fn ready_line(st: &DistributedLockStatus) -> String {
    match st.conditions.iter().find(|c| c.type_ == "Ready") {
        Some(c) if c.message.is_empty() => format!("Ready: {} ({})", c.status, c.reason),
        Some(c) => format!("Ready: {} ({}): {}", c.status, c.reason, c.message),
        None => "Ready: unknown (no controller has written this lock's status yet)".into(),
    }
}

/// The header, then holders (revoked ones with why), waiters (the successor as `next`,
/// with its reserved token) and refused claims (with why).
fn rows(st: &DistributedLockStatus, now: Timestamp) -> Vec<[String; 6]> {
    let ago = |t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time| {
        format!("{}s", (now.as_second() - t.0.as_second()).max(0))
    };
    let mut rows = vec![HEADER.map(String::from)];
    for h in &st.holders {
        let (role, reason) = match &h.revoked {
            Some(r) => ("revoked", r.reason.as_str().to_string()),
            None => ("holder", String::new()),
        };
        let token = h.fencing_token.to_string();
        rows.push([
            role.into(),
            h.pod.clone(),
            token,
            ago(&h.granted_at),
            h.claim.clone(),
            reason,
        ]);
    }
    for (i, w) in st.queue.iter().enumerate() {
        // The successor's token is reserved: it is the one its grant will carry.
        let reserved = st.successor.as_ref().filter(|s| s.claim == w.claim);
        let (role, token) = match reserved {
            Some(s) => ("next".to_string(), s.fencing_token.to_string()),
            None => (format!("#{}", i + 1), "-".to_string()),
        };
        rows.push([
            role,
            w.pod.clone(),
            token,
            ago(&w.requested_at),
            w.claim.clone(),
            String::new(),
        ]);
    }
    for r in &st.refused {
        let reason = format!("{:?}", r.reason);
        rows.push([
            "refused".into(),
            "-".into(),
            "-".into(),
            "-".into(),
            r.claim.clone(),
            reason,
        ]);
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_fit_long_tokens_and_pod_names_and_ready_and_refused_claims_show() {
        let lock: DistributedLock = serde_json::from_value(serde_json::json!({
            "apiVersion": "leasehold.dev/v1alpha1", "kind": "DistributedLock",
            "metadata": {"name": "l", "namespace": "ns"}, "spec": {"maxHolders": 1},
            "status": {
                "fencingToken": 1795820873873914i64,
                "holders": [{"claim": "l-a", "pod": "singleton-f99cc4d58-7nvj8-with-a-long-name", "podUID": "u",
                             "fencingToken": 1795820873873913i64, "grantedAt": "1970-01-01T00:00:10Z"}],
                "queue": [{"claim": "l-b", "pod": "b", "podUID": "v", "requestedAt": "1970-01-01T00:00:15Z"}],
                "successor": {"claim": "l-b", "fencingToken": 1795820873873914i64},
                "refused": [{"claim": "l-c", "reason": "PodUidMismatch"}],
                "conditions": [{"type": "Ready", "status": "True", "reason": "Granting", "message": "",
                                "lastTransitionTime": "1970-01-01T00:00:00Z"}],
            },
        }))
        .unwrap();
        let text = table(&lock, Timestamp::from_second(40).unwrap());
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[1], "Ready: True (Granting)", "{text}");
        let table: Vec<&str> = lines[3..].to_vec();
        assert_eq!(table.len(), 4, "header, holder, next, refused:\n{text}");
        let claim_at: Vec<Option<usize>> = table.iter().map(|l| l.find(" l-").or(l.find(" CLAIM"))).collect();
        assert!(
            claim_at.iter().all(|c| *c == claim_at[0] && c.is_some()),
            "CLAIM aligned:\n{text}"
        );
        assert!(
            table[1].contains("1795820873873913") && table[1].contains("30s"),
            "{text}"
        );
        assert!(
            table[2].starts_with("next") && table[2].contains("1795820873873914"),
            "{text}"
        );
        assert!(
            table[3].starts_with("refused") && table[3].ends_with("PodUidMismatch"),
            "{text}"
        );
    }
}
