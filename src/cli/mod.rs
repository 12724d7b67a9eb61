//! The `leasehold` command line: one subcommand per job.

mod cluster;
pub mod completions;
mod contract;
mod controller;
mod dev;
pub mod install;
pub mod prepare_uninstall;
pub mod ready;
pub mod run;
pub(crate) mod status;

pub use cluster::ClusterArgs;

use std::ffi::OsString;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Exit status for leasehold's own failures (as `env` and `timeout` use), so that they
/// cannot be mistaken for a wrapped command's status.
pub const EXIT_OWN_ERROR: u8 = 125;

/// Fair (FIFO), fenced distributed locks for Kubernetes pods.
#[derive(Parser, Debug)]
#[command(name = "leasehold", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
    /// How logs are written to stderr: lines for people, or one JSON object a line for
    /// log collectors.
    #[arg(long, global = true, value_enum, env = "LEASEHOLD_LOG_FORMAT", default_value_t = crate::telemetry::LogFormat::Text)]
    pub log_format: crate::telemetry::LogFormat,
}

/// The subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Print the DistributedLock CustomResourceDefinition as YAML.
    Crd,
    /// Run the controller (the operator) against the current kubeconfig or in-cluster.
    Controller(controller::ControllerArgs),
    /// Hold a lock while running a command: `leasehold run --lock NAME -- CMD ARGS...`.
    Run(run::RunArgs),
    /// Show a lock's holders, fencing token and queue.
    Status(status::StatusArgs),
    /// Run a local control plane (etcd, kube-apiserver, kube-controller-manager) on
    /// loopback with the CRD installed, until Ctrl-C.
    Dev(dev::DevArgs),
    /// Print a shell completion script: `source <(leasehold completions bash)`.
    Completions(completions::CompletionsArgs),
    /// Copy this binary to DIR/leasehold: an initContainer's way of giving an image that
    /// has none `leasehold run` (through a shared emptyDir).
    Install(install::InstallArgs),
    /// Before an uninstall: let deleted locks go, stop the controller, and take the
    /// fence finalizer off every lock, so that deleting a lock or its namespace later
    /// does not hang (the chart's pre-delete hook).
    PrepareUninstall(prepare_uninstall::PrepareUninstallArgs),
    /// Check a critical-section log (`start|end|term <token> <pod>` lines): mutual
    /// exclusion, strictly increasing tokens, optionally the expected order.
    #[command(hide = true)]
    CheckLog {
        /// The log file.
        file: std::path::PathBuf,
        /// How many sections may overlap.
        #[arg(long, default_value_t = 1)]
        max_holders: usize,
        /// The expected start order of pods, comma-separated.
        #[arg(long, value_delimiter = ',')]
        order: Vec<String>,
        /// Accept sections still open at the end (a holder that is still running).
        #[arg(long)]
        allow_open: bool,
    },
    /// Drive the client library through the conformance contract: one command a line
    /// on stdin (`acquire`, `acquire-timeout SECS`, `try`, `release`, `report`, `exit`),
    /// one JSON answer a line on stdout (docs/conformance.md).
    #[command(hide = true)]
    Contract(contract::ContractArgs),
    /// Run a command that dies with this process's parent (internal).
    #[command(hide = true)]
    Guard {
        /// The signal the command gets when the parent dies.
        #[arg(long, default_value = "SIGKILL")]
        signal: nix::sys::signal::Signal,
        /// Supervise the command's whole process tree instead of becoming the command.
        #[arg(long)]
        supervise: bool,
        /// Start the command only once its environment (`K=V` lines, then an empty
        /// line) has been read from this inherited descriptor.
        #[arg(long)]
        start_fd: Option<i32>,
        /// With --supervise: when the command ended leaving no process behind, write
        /// `exited CODE` to this inherited descriptor (a pipe), then exit with CODE once
        /// its reading end is closed (or a signal comes).
        #[arg(long, requires = "supervise")]
        report_fd: Option<i32>,
        /// With --supervise: kill the command's whole process tree when the last
        /// deadline read from this inherited descriptor (`kill-in MS` lines) passes.
        #[arg(long, requires = "supervise")]
        deadline_fd: Option<i32>,
        /// The command and its arguments.
        #[arg(last = true, required = true)]
        command: Vec<OsString>,
    },
}

impl Cli {
    /// The log filter used when `RUST_LOG` is unset.
    pub fn default_log_filter(&self) -> &'static str {
        match &self.command {
            Command::Dev(d) if d.demo => crate::telemetry::QUIET_FILTER,
            _ => crate::telemetry::DEFAULT_FILTER,
        }
    }

    /// The tokio runtime the command runs on. A claimant (`run`, `status`) waits on one
    /// watch and one process: one thread serves it, so each of the lock's status events
    /// (every waiter sees every one) costs no wake-up of a second thread (measured: 0.27
    /// → 0.18 ms of CPU per event, the herd's share of a handoff). The controller and
    /// the dev control plane serve many locks at once and take every core.
    pub fn runtime(&self) -> std::io::Result<tokio::runtime::Runtime> {
        let mut builder = match &self.command {
            Command::Run(_) | Command::Status(_) => tokio::runtime::Builder::new_current_thread(),
            _ => tokio::runtime::Builder::new_multi_thread(),
        };
        builder.enable_all().build()
    }
}

/// Whether the command must run before a tokio runtime exists (it `exec`s).
pub fn run_sync(cli: &Cli) -> Option<ExitCode> {
    match &cli.command {
        Command::Guard {
            supervise: true,
            command,
            start_fd,
            report_fd,
            deadline_fd,
            ..
        } => Some(
            match crate::supervise::supervise(command, *start_fd, *report_fd, *deadline_fd) {
                Ok(code) => ExitCode::from(code),
                Err(e) => {
                    eprintln!("leasehold guard: {e}");
                    ExitCode::from(127)
                }
            },
        ),
        Command::Guard {
            signal,
            command,
            start_fd: Some(fd),
            ..
        } => Some(match crate::supervise::exec_when_started(*signal, *fd, command) {
            Ok(_) => ExitCode::from(crate::supervise::EXIT_NOT_STARTED),
            Err(e) => {
                eprintln!("leasehold guard: {e}");
                ExitCode::from(127)
            }
        }),
        Command::Guard { signal, command, .. } => {
            let err = crate::supervise::exec_guarded(*signal, command);
            eprintln!("leasehold guard: {err}");
            Some(ExitCode::from(127))
        }
        _ => None,
    }
}

/// Run the parsed command.
pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Run(args) => return run::run(args).await,
        Command::Status(args) => status::run(args).await?,
        Command::Contract(args) => contract::run(args).await?,
        Command::Crd => print!("{}", crate::crd::crd_yaml()),
        Command::Controller(args) => controller::run(args).await?,
        Command::Dev(args) => dev::run(args).await?,
        Command::Completions(args) => print!("{}", completions::script(args.shell)),
        Command::Install(args) => install::run(&args)?,
        Command::PrepareUninstall(args) => prepare_uninstall::run(args).await?,
        Command::CheckLog {
            file,
            max_holders,
            order,
            allow_open,
        } => {
            let log = std::fs::read_to_string(&file)?;
            let summary =
                crate::testing::check::check_sections(&log, max_holders, allow_open).map_err(anyhow::Error::msg)?;
            if !order.is_empty() && summary.order != order {
                anyhow::bail!("start order {:?} differs from the expected {order:?}", summary.order);
            }
            println!(
                "ok: {} sections, tokens {:?}, order {:?}",
                summary.order.len(),
                summary.tokens,
                summary.order
            );
        }
        Command::Guard { .. } => unreachable!("handled by run_sync"),
    }
    Ok(ExitCode::SUCCESS)
}
