//! Children that never outlive their parent.
//!
//! `leasehold guard --signal S -- CMD` asks the kernel to send it signal S when its
//! parent dies (Linux's parent-death signal, which survives `exec`), checks that the
//! parent is still the one that started it, and then *becomes* CMD. `leasehold dev`
//! starts etcd and the API server this way, so they never outlive a killed launcher.
//!
//! `leasehold guard --supervise -- CMD` is what `leasehold run` starts: signalling one
//! PID is not enough there, since CMD's own children (`sh -c 'job &'`) would run on
//! after the grant. The supervisor stays CMD's parent: it becomes a child subreaper,
//! starts CMD in a process group of its own, passes [`FORWARD_TERM_SIGNAL`] (as
//! SIGTERM) and SIGINT on to that group, kills CMD's whole process tree on
//! [`KILL_TREE_SIGNAL`], on SIGTERM (its parent-death signal), when the last deadline
//! `leasehold run` told it passes ([`deadline`]: a dead-man's switch) and after CMD exits (so
//! nothing CMD left behind outlives the grant), and exits with CMD's status. When CMD
//! left nothing behind, it first reports that status on its report descriptor, so
//! `leasehold run` can release without waiting for the supervisor's own exit (0.57 ms
//! of a handoff, measured), and then exits only once its parent closed the report
//! pipe (after the release), so that its exit does not compete with the next holder's
//! start either. CMD's process is started before the grant and waits for
//! the start message itself ([`start`]: `leasehold guard --start-fd`), so at the grant
//! it only `exec`s.
//!
//! The parent-death signal fires when the *thread* that forked the child ends, so
//! spawn guarded children from a thread that lives as long as the parent needs them.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::{Pid, getppid};
use tokio::signal::unix::{SignalKind, signal};

mod deadline;
mod start;
mod tree;

pub use start::exec_when_started;

pub use tree::{KILL_TIMEOUT, kill_descendants};

/// The signal `leasehold run` sends the supervisor to kill CMD's whole process tree.
pub const KILL_TREE_SIGNAL: Signal = Signal::SIGUSR1;
/// The signal `leasehold run` sends the supervisor to pass SIGTERM on to CMD's group.
/// (SIGTERM itself means the parent died: the parent-death signal also fires when
/// only the parent's *thread* that started us exits, before the whole process is
/// gone, so the parent pid cannot tell the two apart.)
pub const FORWARD_TERM_SIGNAL: Signal = Signal::SIGUSR2;

/// The descriptor number the supervisor reads its start message from.
const START_FD: i32 = 3;
/// The descriptor number the supervisor reports CMD's end on.
const REPORT_FD: i32 = 4;
/// The descriptor number the supervisor reads CMD's deadlines from ([`deadline`]).
const DEADLINE_FD: i32 = 5;

/// The supervisor's exit status when it was told never to start CMD.
pub const EXIT_NOT_STARTED: u8 = 125;

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
    if parent_gone(expected_parent()) {
        return std::io::Error::other("guard: parent already gone");
    }
    std::process::Command::new(program)
        .args(args)
        .env_remove(PARENT_ENV)
        .exec()
}

/// The pid of the process that started the guard, from [`PARENT_ENV`].
fn expected_parent() -> Option<Pid> {
    let pid = std::env::var(PARENT_ENV).ok()?.parse::<i32>().ok()?;
    Some(Pid::from_raw(pid))
}

/// Whether the parent that started us is gone (we were re-parented). Checked after
/// arming the parent-death signal, since the parent may die between fork and prctl.
fn parent_gone(expected: Option<Pid>) -> bool {
    expected.is_some_and(|p| getppid() != p)
}

/// Run `argv` as a supervised process tree (see the module doc); returns the exit
/// status to exit with: CMD's code, or 128 + the signal that ended it. With `start_fd`
/// (see [`Pending`]) CMD's process starts at once and waits to read its environment
/// from that descriptor before it becomes CMD ([`start`]; when it never does, it exits
/// with [`EXIT_NOT_STARTED`]). With `report_fd`, that status is written
/// there (`exited N`) when CMD's tree ended with CMD (nothing of it left to kill), and
/// only then. With `deadline_fd`, CMD's whole tree is killed when the last deadline read
/// there passes ([`deadline`]), and then no status is reported.
pub fn supervise(
    argv: &[OsString],
    start_fd: Option<i32>,
    report_fd: Option<i32>,
    deadline_fd: Option<i32>,
) -> std::io::Result<u8> {
    let Some((program, args)) = argv.split_first() else {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "guard: no command given",
        ));
    };
    nix::sys::prctl::set_pdeathsig(Signal::SIGTERM).map_err(std::io::Error::other)?;
    let parent = expected_parent();
    if parent_gone(parent) {
        return Err(std::io::Error::other("guard: parent already gone"));
    }
    nix::sys::prctl::set_child_subreaper(true).map_err(std::io::Error::other)?;
    // Not dumpable: CMD (same user, no CAP_SYS_PTRACE) cannot open our descriptors
    // through /proc/$PPID/fd and write a report of its own end. CMD's exec makes CMD
    // itself dumpable again.
    nix::sys::prctl::set_dumpable(false).map_err(std::io::Error::other)?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        let (mut term, mut int) = (signal(SignalKind::terminate())?, signal(SignalKind::interrupt())?);
        let mut kill_tree = signal(SignalKind::from_raw(KILL_TREE_SIGNAL as i32))?;
        let mut forward_term = signal(SignalKind::from_raw(FORWARD_TERM_SIGNAL as i32))?;
        let mut report = report_fd.map(|fd| reopened(fd, true)).transpose()?;
        let mut deadline = deadline::Deadline::read_from(deadline_fd.map(|fd| reopened(fd, false)).transpose()?)?;
        let mut child = match start_fd {
            // CMD's process starts now and waits for the start message itself.
            Some(fd) => started_ahead(program, args, reopened(fd, false)?)?.spawn()?,
            None => tokio::process::Command::new(program)
                .args(args)
                .env_remove(PARENT_ENV)
                .process_group(0)
                .spawn()?,
        };
        let cmd = Pid::from_raw(child.id().expect("a just-spawned child has a pid") as i32);
        let mut past_deadline = false;
        let status = loop {
            let dead_by = deadline.at().filter(|_| !past_deadline);
            tokio::select! {
                status = child.wait() => break status?,
                _ = term.recv() => { tree::kill_descendants(Some(cmd)); }
                _ = forward_term.recv() => { let _ = killpg(cmd, Signal::SIGTERM); }
                _ = int.recv() => { let _ = killpg(cmd, Signal::SIGINT); }
                _ = kill_tree.recv() => { tree::kill_descendants(Some(cmd)); }
                _ = deadline.read() => {}
                _ = deadline::passes(dead_by) => {
                    past_deadline = true;
                    tree::kill_descendants(Some(cmd));
                }
            }
        };
        let code = exit_status(status);
        // Killed by its deadline: the grant is lost, not CMD's to report.
        if tree::childless() && !past_deadline {
            // CMD left nothing behind: certain without a /proc walk (an orphan would
            // have been re-parented to us). Only then report; a tree that had to be
            // killed is left to our exit, after which the parent checks once more for
            // anything re-parented to it, before it releases.
            if let Some(report) = report.as_mut() {
                use std::io::Write;
                // Best effort: unread, the parent learns the same from our exit.
                if report.write_all(format!("{REPORT_PREFIX}{code}\n").as_bytes()).is_ok() {
                    linger_until_unread(report);
                }
            }
        } else if !tree::kill_descendants(None) {
            eprintln!(
                "leasehold guard: some of the command's processes did not die within {:?}",
                tree::KILL_TIMEOUT
            );
        }
        Ok(code)
    })
}

/// After a report: stay until the parent closes its end of the report pipe (after its
/// release; or by dying) or a signal comes, so that this process's exit (its runtime
/// and image torn down, 0.3 ms of CPU measured) does not compete for the CPU with the
/// next holder's start. Nothing of CMD's is left by then, so staying holds nothing up.
fn linger_until_unread(report: &std::fs::File) {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use std::os::fd::AsFd;
    // Only a pipe tells when its reader is gone: the report on anything else (a file)
    // is left to be read after our exit.
    let pipe = report.metadata().is_ok_and(|m| {
        use std::os::unix::fs::FileTypeExt;
        m.file_type().is_fifo()
    });
    if pipe {
        // A pipe's writing end polls as an error once no reader is left. A signal
        // (SIGTERM, our parent-death signal, among them) interrupts the wait: poll is
        // never restarted after a handler.
        let mut fds = [PollFd::new(report.as_fd(), PollFlags::empty())];
        let _ = poll(&mut fds, PollTimeout::NONE);
    }
}

/// What the report line starts with; CMD's exit code follows.
const REPORT_PREFIX: &str = "exited ";

/// A descriptor passed by [`pending_command`], opened afresh through /proc (for reading,
/// or for writing) and closed under its number, so CMD does not inherit it.
fn reopened(fd: i32, write: bool) -> std::io::Result<std::fs::File> {
    let file = std::fs::OpenOptions::new()
        .read(!write)
        .write(write)
        .open(format!("/proc/self/fd/{fd}"))?;
    nix::unistd::close(fd).map_err(std::io::Error::from)?;
    Ok(file)
}

/// `leasehold guard --start-fd` for `program`, in a process group of its own, reading
/// the start message from `start` (see [`start`]).
fn started_ahead(
    program: &OsString,
    args: &[OsString],
    start: std::fs::File,
) -> std::io::Result<tokio::process::Command> {
    use command_fds::{CommandFdExt, FdMapping};
    let mut cmd = tokio::process::Command::new(self_exe()?);
    cmd.args([
        "guard",
        "--signal",
        "SIGKILL",
        "--start-fd",
        &START_FD.to_string(),
        "--",
    ])
    .arg(program)
    .args(args)
    .env(PARENT_ENV, std::process::id().to_string())
    .process_group(0);
    cmd.fd_mappings(vec![FdMapping {
        parent_fd: start.into(),
        child_fd: START_FD,
    }])
    .map_err(std::io::Error::other)?;
    Ok(cmd)
}

/// A supervisor started ahead of the grant, waiting to start CMD: the costs of
/// starting a process (exec, loading, setting up) are paid while waiting for the lock,
/// not on the handoff. Dropping it unstarted makes the supervisor exit without running
/// CMD.
pub struct Pending {
    start: std::io::PipeWriter,
    report: std::io::PipeReader,
    deadline: std::io::PipeWriter,
}

impl Pending {
    /// Start CMD with these extra environment variables. An error means CMD was not
    /// started.
    pub fn start(mut self, env: &[(&str, &str)]) -> std::io::Result<Started> {
        use std::io::Write;
        let mut msg = String::new();
        for (k, v) in env {
            if k.contains(['=', '\n']) || v.contains('\n') {
                return Err(std::io::Error::other(format!("guard: unsendable variable {k}")));
            }
            msg.push_str(&format!("{k}={v}\n"));
        }
        msg.push('\n');
        // Before the start message: once that is written, CMD runs.
        let report = tokio::net::unix::pipe::Receiver::from_owned_fd(self.report.into())?;
        self.start.write_all(msg.as_bytes())?;
        Ok(Started {
            report: Some(tokio::io::BufReader::new(report)),
            deadline: self.deadline,
        })
    }
}

/// A started supervisor's report of CMD's end. A supervisor that reported exits only
/// once this is dropped (or its parent dies): drop it before waiting for that exit.
pub struct Started {
    report: Option<tokio::io::BufReader<tokio::net::unix::pipe::Receiver>>,
    deadline: std::io::PipeWriter,
}

impl Started {
    /// CMD's exit code, when CMD ended leaving no process behind. `None` (at once, from
    /// then on) when the supervisor ended without reporting (CMD left processes it had
    /// to kill, or it was killed): then only its exit tells.
    pub async fn exited(&mut self) -> Option<u8> {
        use tokio::io::AsyncBufReadExt;
        let reader = self.report.as_mut()?;
        let mut line = String::new();
        let code = match reader.read_line(&mut line).await {
            Ok(_) => line.trim_end().strip_prefix(REPORT_PREFIX).and_then(|c| c.parse().ok()),
            Err(_) => None,
        };
        if code.is_none() {
            self.report = None;
        }
        code
    }

    /// Whether a report may still come.
    pub fn reporting(&self) -> bool {
        self.report.is_some()
    }

    /// Tell the supervisor CMD must be dead `left` from now: it kills CMD's tree when
    /// the last deadline told passes ([`deadline`]). Never blocks: a line the pipe cannot
    /// take now (the supervisor stopped, its pipe full) is dropped, and the one before
    /// stands, the earlier.
    pub fn tell_deadline(&self, left: std::time::Duration) {
        use std::io::Write;
        let _ = (&self.deadline).write(deadline::message(left).as_bytes());
    }
}

/// A command that runs `program` supervised by `leasehold guard --supervise` (see the
/// module doc), which starts it only at [`Pending::start`].
pub fn pending_command(
    leasehold: &PathBuf,
    program: impl Into<OsString>,
) -> std::io::Result<(tokio::process::Command, Pending)> {
    use command_fds::{CommandFdExt, FdMapping};
    let (read, start) = std::io::pipe()?;
    let (report, write) = std::io::pipe()?;
    let (deadlines, deadline) = std::io::pipe()?;
    // Written without blocking, and without the reactor's readiness (a fresh pipe's
    // first write would wait for it): plain non-blocking writes, set up before the wait.
    use nix::fcntl::{FcntlArg, OFlag, fcntl};
    fcntl(&deadline, FcntlArg::F_SETFL(OFlag::O_NONBLOCK)).map_err(std::io::Error::from)?;
    let mut cmd = tokio::process::Command::new(leasehold);
    cmd.args(["guard", "--supervise", "--start-fd", &START_FD.to_string()])
        .args(["--report-fd", &REPORT_FD.to_string()])
        .args(["--deadline-fd", &DEADLINE_FD.to_string(), "--"])
        .arg(program.into());
    cmd.env(PARENT_ENV, std::process::id().to_string());
    cmd.fd_mappings(vec![
        FdMapping {
            parent_fd: read.into(),
            child_fd: START_FD,
        },
        FdMapping {
            parent_fd: write.into(),
            child_fd: REPORT_FD,
        },
        FdMapping {
            parent_fd: deadlines.into(),
            child_fd: DEADLINE_FD,
        },
    ])
    .map_err(std::io::Error::other)?;
    Ok((
        cmd,
        Pending {
            start,
            report,
            deadline,
        },
    ))
}

/// A process's exit status as an exit code: its code, or 128 + its signal.
pub fn exit_status(status: std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => c as u8,
        (None, Some(s)) => 128u8.wrapping_add(s as u8),
        _ => 1,
    }
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
