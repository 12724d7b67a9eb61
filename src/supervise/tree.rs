//! A process's descendants, read from `/proc`, and killing all of them.
//!
//! Only the kernel's parent links are trusted: a descendant that left its process group
//! or session is still found, and one whose parent died was re-parented to us (the
//! supervisor is a child subreaper), so it is found too.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitPidFlag, waitpid};
use nix::unistd::Pid;

/// How long [`kill_descendants`] keeps killing before it gives up.
pub const KILL_TIMEOUT: Duration = Duration::from_secs(5);

/// One process as `/proc/PID/stat` describes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Proc {
    pid: i32,
    ppid: i32,
    zombie: bool,
}

fn parse_stat(text: &str) -> Option<Proc> {
    let (head, tail) = text.rsplit_once(')')?;
    let pid = head.split_whitespace().next()?.parse().ok()?;
    let mut fields = tail.split_whitespace();
    let state = fields.next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some(Proc {
        pid,
        ppid,
        zombie: state == "Z" || state == "X",
    })
}

fn processes() -> Vec<Proc> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
        })
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .filter_map(|t| parse_stat(&t))
        .collect()
}

/// How many threads `/proc/PID/task` lists (0 once the process is gone).
fn tasks(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |d| d.count())
}

/// Every descendant of `root` among `procs`, parents before children.
fn descendants_in(procs: &[Proc], root: i32) -> Vec<Proc> {
    let mut children: HashMap<i32, Vec<Proc>> = HashMap::new();
    for p in procs {
        children.entry(p.ppid).or_default().push(*p);
    }
    let mut out = Vec::new();
    let mut next = vec![root];
    while let Some(parent) = next.pop() {
        for child in children.get(&parent).into_iter().flatten() {
            out.push(*child);
            next.push(child.pid);
        }
    }
    out
}

/// Whether this process has no child at all, and so (a child subreaper) no descendant:
/// an orphaned one would have been re-parented to it. Reaps one zombie child if any.
pub fn childless() -> bool {
    waitpid(None, Some(WaitPidFlag::WNOHANG)) == Err(Errno::ECHILD)
}

/// SIGKILL every descendant of this process until none is left alive, reaping the
/// zombies re-parented to us — except `spare`, a child someone else waits for (it is
/// killed, not reaped). Returns whether everything died within [`KILL_TIMEOUT`].
pub fn kill_descendants(spare: Option<Pid>) -> bool {
    // The common case costs no /proc walk: with no child at all there is no descendant
    // either (an orphaned one would have been re-parented to us, the subreaper).
    if spare.is_none() && childless() {
        return true;
    }
    kill_descendants_of(std::process::id() as i32, spare)
}

fn kill_descendants_of(me: i32, spare: Option<Pid>) -> bool {
    let end = Instant::now() + KILL_TIMEOUT;
    loop {
        let all = descendants_in(&processes(), me);
        // A process whose main thread exited shows as a zombie while its other threads
        // run on: only a zombie with one task left is dead. Killing a zombie is harmless.
        let dead = |p: &Proc| p.zombie && tasks(p.pid) <= 1;
        for p in &all {
            let _ = kill(Pid::from_raw(p.pid), Signal::SIGKILL);
            if dead(p) && p.ppid == me && Some(Pid::from_raw(p.pid)) != spare {
                let _ = waitpid(Pid::from_raw(p.pid), Some(WaitPidFlag::WNOHANG));
            }
        }
        if all.iter().all(dead) {
            return true;
        }
        if Instant::now() > end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(pid: i32, ppid: i32) -> Proc {
        Proc {
            pid,
            ppid,
            zombie: false,
        }
    }

    #[test]
    fn stat_lines_parse_even_with_odd_command_names() {
        let proc = parse_stat("4242 (a (weird) name) S 17 4242 4242 0 -1").unwrap();
        assert_eq!(proc, p(4242, 17));
        assert!(parse_stat("4243 (sh) Z 1 0").unwrap().zombie);
    }

    #[test]
    fn descendants_include_grandchildren_in_other_groups_and_nothing_else() {
        let procs = [p(10, 1), p(11, 10), p(12, 11), p(13, 12), p(20, 1), p(21, 20)];
        let mut found: Vec<i32> = descendants_in(&procs, 10).iter().map(|p| p.pid).collect();
        found.sort();
        assert_eq!(found, [11, 12, 13]);
    }

    #[test]
    fn a_shells_background_jobs_are_found_and_killed() {
        let sh = std::process::Command::new("sh")
            .args(["-c", "sleep 30 & sleep 30 & wait; echo done"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let root = sh.id() as i32;
        let end = Instant::now() + Duration::from_secs(10);
        while descendants_in(&processes(), root).len() < 2 {
            assert!(Instant::now() < end, "the shell never started its jobs");
            std::thread::yield_now();
        }
        assert!(kill_descendants_of(root, None));
        let out = sh.wait_with_output().unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "done\n",
            "the jobs died, the shell did not"
        );
    }
}
