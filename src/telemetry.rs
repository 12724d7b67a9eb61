//! Logging set-up: structured `tracing` logs to stderr, filtered by `RUST_LOG`.

/// The default filter: info, minus the kube client's readiness-poll and
/// self-signed-certificate noise.
pub const DEFAULT_FILTER: &str =
    "info,kube_runtime=warn,kube_client::client::builder=off,kube_client::client::tls=error";
/// A quieter default for output meant for people (the demo).
pub const QUIET_FILTER: &str = "warn,kube_client=error,kube_client::client::builder=off";

/// How logs are written.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// Lines for people (colours on a terminal).
    #[default]
    Text,
    /// One JSON object a line (`timestamp`, `level`, `fields.message`, the other
    /// fields, `target`, `span`), for log collectors.
    Json,
}

/// Install the global tracing subscriber (`RUST_LOG`, else `default`) writing `format`
/// to stderr. Safe to call twice.
pub fn init(default: &str, format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}
