//! CMD's deadline, kept by the supervisor itself: a dead-man's switch. `leasehold run`
//! tells the supervisor, on a pipe of its own, by when CMD must be dead
//! ([`crate::protocol::timing::command_dead_by`] its last successful renewal) each time
//! that moves; the supervisor kills CMD's whole tree when the last deadline it was told
//! passes. So a `leasehold run` that stops renewing *and* stops acting (stopped by
//! SIGSTOP, blocked on a stderr pipe that is not read) no longer leaves CMD running
//! past the moment the controller may pass the lock on.
//!
//! A deadline travels as the time left (`kill-in MS`), counted from its receipt: later
//! than `leasehold run`'s count by the pipe's delay, microseconds while the supervisor
//! runs (a stopped supervisor kills nothing either way; the controller's expiry waits
//! two seconds more than the client's deadline for such slack).

use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::net::unix::pipe;
use tokio::time::Instant;

/// What a deadline line starts with; the milliseconds left follow.
const PREFIX: &str = "kill-in ";

/// The line that tells the supervisor CMD must be dead `left` from now.
pub fn message(left: Duration) -> String {
    format!("{PREFIX}{}\n", left.as_millis())
}

/// The time left a deadline line tells, if it is one.
fn parse(line: &str) -> Option<Duration> {
    let ms = line.trim_end().strip_prefix(PREFIX)?.parse().ok()?;
    Some(Duration::from_millis(ms))
}

/// Completes at `at`; never when there is none.
pub async fn passes(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The deadlines read from `leasehold run`'s pipe, and the last one told.
pub struct Deadline {
    lines: Option<Lines<BufReader<pipe::Receiver>>>,
    at: Option<Instant>,
}

impl Deadline {
    /// Deadlines read from `file` (the reading end of the pipe), or none ever.
    pub fn read_from(file: Option<std::fs::File>) -> std::io::Result<Self> {
        let lines = match file {
            Some(f) => Some(BufReader::new(pipe::Receiver::from_file(f)?).lines()),
            None => None,
        };
        Ok(Deadline { lines, at: None })
    }

    /// Completes when a line was read (a new deadline, or something else, ignored); never
    /// once the pipe is closed (its writer gone: then the parent-death signal acts).
    pub async fn read(&mut self) {
        let Some(lines) = self.lines.as_mut() else {
            return std::future::pending().await;
        };
        match lines.next_line().await {
            Ok(Some(line)) => {
                if let Some(left) = parse(&line) {
                    self.at = Some(Instant::now() + left);
                }
            }
            Ok(None) | Err(_) => self.lines = None,
        }
    }

    /// The last deadline told, if any.
    pub fn at(&self) -> Option<Instant> {
        self.at
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deadline_line_says_the_milliseconds_left() {
        assert_eq!(
            parse(&message(Duration::from_millis(1_500))),
            Some(Duration::from_millis(1_500))
        );
        assert_eq!(parse("kill-in 0\n"), Some(Duration::ZERO));
        assert_eq!(parse("exited 3"), None);
        assert_eq!(parse("kill-in soon"), None);
    }

    #[tokio::test(start_paused = true)]
    async fn the_last_deadline_told_is_the_one_that_passes() {
        let (rx, tx) = std::io::pipe().unwrap();
        let file = std::fs::File::from(std::os::fd::OwnedFd::from(rx));
        let mut d = Deadline::read_from(Some(file)).unwrap();
        let mut tx = std::fs::File::from(std::os::fd::OwnedFd::from(tx));
        use std::io::Write;
        tx.write_all(message(Duration::from_secs(1)).as_bytes()).unwrap();
        d.read().await;
        tx.write_all(message(Duration::from_secs(3)).as_bytes()).unwrap();
        d.read().await;
        let told = Instant::now();
        passes(d.at()).await;
        assert!(told.elapsed() >= Duration::from_secs(3), "the later deadline stands");
        drop(tx);
        let closed = tokio::time::timeout(Duration::from_secs(60), d.read()).await;
        assert!(closed.is_ok(), "the close is read once");
        let after = tokio::time::timeout(Duration::from_secs(60), d.read()).await;
        assert!(after.is_err(), "then nothing more is read");
    }
}
