//! CMD's process started ahead of the grant: `leasehold guard --start-fd FD -- CMD`
//! blocks reading the start message, then *becomes* CMD. The supervisor starts it at
//! once, in CMD's process group, while `leasehold run` still waits for the lock; at
//! the grant only a read and an `exec` remain on the handoff — no supervisor wake-up,
//! no fork, no `PATH` search (1–2 ms of an etcd-backed handoff, measured).
//!
//! While it waits it dies with the supervisor (parent-death signal, cleared before
//! the `exec`, so CMD is started as it was before), and it is not dumpable, so no
//! process of the same user can reach the start pipe through `/proc`. The start
//! message (`KEY=VALUE` lines, then an empty line) adds to CMD's environment, over
//! any variable of the same name. End of file before it means CMD is never to run.

use std::ffi::{OsStr, OsString};
use std::io::BufRead;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;

use nix::sys::signal::Signal;

use super::{PARENT_ENV, expected_parent, parent_gone, reopened};

/// Wait for the start message on `start_fd`, then become `argv` (dying with the
/// parent, by `signal`, until then). `Ok(false)`: the message never came, CMD was not
/// started. Returns only when CMD was not started.
pub fn exec_when_started(signal: Signal, start_fd: i32, argv: &[OsString]) -> std::io::Result<bool> {
    let Some((program, args)) = argv.split_first() else {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "guard: no command given",
        ));
    };
    nix::sys::prctl::set_dumpable(false).map_err(std::io::Error::other)?;
    nix::sys::prctl::set_pdeathsig(signal).map_err(std::io::Error::other)?;
    let parent = expected_parent();
    if parent_gone(parent) {
        return Err(std::io::Error::other("guard: parent already gone"));
    }
    // Paid while waiting: the search `exec` would make after the grant.
    let path = resolve(program);
    let start = std::io::BufReader::new(reopened(start_fd, false)?);
    let Some(env) = read_start(start)? else {
        return Ok(false);
    };
    // CMD must not inherit the parent-death signal; and a parent that died meanwhile
    // left us re-parented: then CMD must not start.
    nix::sys::prctl::set_pdeathsig(None).map_err(std::io::Error::other)?;
    if parent_gone(parent) {
        return Err(std::io::Error::other("guard: parent gone before the start"));
    }
    let Some(path) = path else {
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("guard: {}: command not found", program.to_string_lossy()),
        ));
    };
    Err(std::process::Command::new(path)
        .arg0(program)
        .args(args)
        .envs(env)
        .env_remove(PARENT_ENV)
        .exec())
}

/// Read CMD's extra environment (`KEY=VALUE` lines, then an empty line); `None` at end
/// of file before the empty line.
fn read_start(mut start: impl BufRead) -> std::io::Result<Option<Vec<(String, String)>>> {
    let mut env = Vec::new();
    let mut line = String::new();
    loop {
        line.clear();
        if start.read_line(&mut line)? == 0 {
            return Ok(None);
        }
        let text = line.strip_suffix('\n').unwrap_or(&line);
        if text.is_empty() {
            return Ok(Some(env));
        }
        let (k, v) = text
            .split_once('=')
            .filter(|(k, _)| !k.is_empty())
            .ok_or_else(|| std::io::Error::other(format!("guard: bad start line {text:?}")))?;
        env.push((k.to_string(), v.to_string()));
    }
}

/// `program` looked up as `execvp` would: a name with a slash as it is, else the first
/// executable file of that name in `$PATH`; `None` when there is none.
fn resolve(program: &OsStr) -> Option<PathBuf> {
    if program.as_bytes().contains(&b'/') {
        return Some(PathBuf::from(program));
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    std::env::split_paths(&path).map(|dir| dir.join(program)).find(|p| {
        p.metadata().is_ok_and(|m| m.is_file())
            && nix::unistd::access(p.as_path(), nix::unistd::AccessFlags::X_OK).is_ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_looked_up_in_path_and_a_path_is_kept() {
        let sh = resolve(OsStr::new("sh")).expect("sh is on PATH");
        assert!(sh.is_absolute(), "{sh:?}");
        assert_eq!(resolve(OsStr::new("./x")), Some(PathBuf::from("./x")));
        assert_eq!(resolve(OsStr::new("no-such-program-leasehold")), None);
    }

    #[test]
    fn the_start_message_is_variables_then_an_empty_line() {
        let env = read_start(&b"A=1\nB=x=y\n\nignored"[..]).expect("read");
        assert_eq!(env, Some(vec![("A".into(), "1".into()), ("B".into(), "x=y".into())]));
        assert_eq!(read_start(&b"\n"[..]).expect("read"), Some(vec![]));
        assert_eq!(
            read_start(&b"A=1\n"[..]).expect("read"),
            None,
            "end of file: not started"
        );
        assert!(read_start(&b"NOEQUALS\n\n"[..]).is_err());
        assert!(read_start(&b"=v\n\n"[..]).is_err());
    }
}
