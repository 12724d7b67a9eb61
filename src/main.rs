//! The `leasehold` binary: parse arguments, set up logging, run the subcommand.
#![forbid(unsafe_code)]

use clap::Parser;

use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = leasehold::cli::Cli::parse();
    if let Some(code) = leasehold::cli::run_sync(&cli) {
        return code;
    }
    leasehold::telemetry::init(cli.default_log_filter(), cli.log_format);
    let result = cli
        .runtime()
        .map_err(anyhow::Error::from)
        .and_then(|runtime| runtime.block_on(leasehold::cli::run(cli)));
    result.unwrap_or_else(|e| {
        eprintln!("leasehold: {e:#}");
        ExitCode::from(leasehold::cli::EXIT_OWN_ERROR)
    })
}
