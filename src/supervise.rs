//! Children that never outlive their parent.
//!
//! `leasehold guard --signal S -- CMD` asks the kernel to send it signal S when its
//! parent dies (Linux's parent-death signal, which survives `exec`), checks that the
//! parent is still the one that started it, and then *becomes* CMD. `leasehold run`
//! starts the wrapped program this way, and `leasehold dev` its etcd and API server,
//! so neither outlives a killed parent — even one killed by SIGKILL.
//!
//! The parent-death signal fires when the *thread* that forked the child ends, so
//! spawn guarded children from a thread that lives as long as the parent needs them.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;

use nix::sys::signal::Signal;
use nix::unistd::{Pid, getppid};

/// Environment variable carrying the pid of the process that started the guard.
pub const PARENT_ENV: &str = "LEASEHOLD_GUARD_PARENT";

/// Become `argv`, arranging for `signal` when the parent dies. Returns only on error.
pub fn exec_guarded(signal: Signal, argv: &[OsString]) -> std::io::Error {
    let Some((program, args)) = argv.split_first() else {
        return std::io::Error::new(std::io::ErrorKind::InvalidInput, "guard: no command given");
    };
    if let Err(e) = nix::sys::prctl::set_pdeathsig(signal) {
        return std::io::Error::other(format!("guard: set parent-death signal: {e}"));
    }
    // The parent may have died between fork and prctl: then we were re-parented.
    let expected = std::env::var(PARENT_ENV).ok().and_then(|p| p.parse::<i32>().ok());
    if let Some(expected) = expected
        && getppid() != Pid::from_raw(expected)
    {
        return std::io::Error::other("guard: parent already gone");
    }
    std::process::Command::new(program)
        .args(args)
        .env_remove(PARENT_ENV)
        .exec()
}

/// A command that runs `program` under `leasehold guard`, so it dies with this process.
pub fn guarded_command(leasehold: &PathBuf, signal: Signal, program: impl Into<OsString>) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(leasehold);
    cmd.arg("guard")
        .arg("--signal")
        .arg(signal.as_str())
        .arg("--")
        .arg(program.into());
    cmd.env(PARENT_ENV, std::process::id().to_string());
    cmd
}

/// The path of the running `leasehold` binary, used to start guarded children.
pub fn self_exe() -> std::io::Result<PathBuf> {
    std::env::current_exe()
}
