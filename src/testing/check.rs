//! Checks of a critical-section log, shared by the integration tests and the
//! end-to-end scripts (`leasehold check-log FILE`).
//!
//! Each holder appends `start <token> <pod>` when its critical section begins and
//! `end <token> <pod>` (or `term <token> <pod>` when stopped by a signal) when it ends.
//! Extra words after the pod are ignored.

/// What a valid log showed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// Pods in the order their sections started.
    pub order: Vec<String>,
    /// Tokens in the order their sections started.
    pub tokens: Vec<i64>,
    /// Most sections open at once.
    pub max_concurrent: usize,
}

/// Check that at most `max_holders` sections overlap, every section ends (unless
/// `allow_open`), and tokens strictly increase in start order.
pub fn check_sections(log: &str, max_holders: usize, allow_open: bool) -> Result<Summary, String> {
    let mut open: Vec<(i64, String)> = Vec::new();
    let mut summary = Summary {
        order: Vec::new(),
        tokens: Vec::new(),
        max_concurrent: 0,
    };
    for (n, line) in log.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let words: Vec<&str> = line.split_whitespace().collect();
        let [kind, token, pod, ..] = words[..] else {
            return Err(format!(
                "line {}: expected `<start|end|term> <token> <pod>`: {line:?}",
                n + 1
            ));
        };
        let token: i64 = token
            .parse()
            .map_err(|_| format!("line {}: bad token {token:?}", n + 1))?;
        match kind {
            "start" => {
                if let Some(&last) = summary.tokens.last()
                    && token <= last
                {
                    return Err(format!(
                        "line {}: token {token} does not exceed the previous {last}",
                        n + 1
                    ));
                }
                open.push((token, pod.to_string()));
                if open.len() > max_holders {
                    return Err(format!(
                        "line {}: {} sections overlap (max {max_holders}): {open:?}",
                        n + 1,
                        open.len()
                    ));
                }
                summary.max_concurrent = summary.max_concurrent.max(open.len());
                summary.order.push(pod.to_string());
                summary.tokens.push(token);
            }
            "end" | "term" => {
                let Some(i) = open.iter().position(|(t, p)| *t == token && p == pod) else {
                    return Err(format!(
                        "line {}: {kind} of a section that is not open: {line:?}",
                        n + 1
                    ));
                };
                open.remove(i);
            }
            other => return Err(format!("line {}: unknown entry {other:?}", n + 1)),
        }
    }
    if !allow_open && !open.is_empty() {
        return Err(format!("sections never ended: {open:?}"));
    }
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_turns_and_reports_order() {
        let s = check_sections("start 1 a\nend 1 a\nstart 2 b\nterm 2 b\n", 1, false).unwrap();
        assert_eq!(s.order, ["a", "b"]);
        assert_eq!(s.tokens, [1, 2]);
        assert_eq!(s.max_concurrent, 1);
    }

    #[test]
    fn rejects_overlap_backwards_tokens_and_unended_sections() {
        assert!(
            check_sections("start 1 a\nstart 2 b\nend 1 a\nend 2 b", 1, false)
                .unwrap_err()
                .contains("overlap")
        );
        assert!(
            check_sections("start 2 a\nend 2 a\nstart 2 b\nend 2 b", 1, false)
                .unwrap_err()
                .contains("exceed")
        );
        assert!(
            check_sections("start 1 a", 1, false)
                .unwrap_err()
                .contains("never ended")
        );
        assert!(check_sections("start 1 a", 1, true).is_ok());
        assert!(check_sections("end 1 a", 1, false).unwrap_err().contains("not open"));
        assert!(check_sections("hello", 1, false).is_err());
    }

    #[test]
    fn semaphores_may_overlap_up_to_max() {
        let log = "start 1 a\nstart 2 b\nend 1 a\nstart 3 c\nend 2 b\nend 3 c";
        assert_eq!(check_sections(log, 2, false).unwrap().max_concurrent, 2);
        assert!(check_sections(log, 1, false).is_err());
    }
}
