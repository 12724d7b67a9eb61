//! The `leasehold` binary: parse arguments, set up logging, run the subcommand.
#![forbid(unsafe_code)]

use clap::Parser;

fn main() -> anyhow::Result<std::process::ExitCode> {
    let cli = leasehold::cli::Cli::parse();
    if let Some(code) = leasehold::cli::run_sync(&cli) {
        return Ok(code);
    }
    leasehold::telemetry::init(cli.default_log_filter());
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(leasehold::cli::run(cli))
}
