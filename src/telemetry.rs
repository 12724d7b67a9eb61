//! Logging set-up: structured `tracing` logs to stderr, filtered by `RUST_LOG`.

/// The default filter: info, minus the kube client's readiness-poll and
/// self-signed-certificate noise.
pub const DEFAULT_FILTER: &str =
    "info,kube_runtime=warn,kube_client::client::builder=off,kube_client::client::tls=error";
/// A quieter default for output meant for people (the demo).
pub const QUIET_FILTER: &str = "warn,kube_client=error,kube_client::client::builder=off";

/// Install the global tracing subscriber (`RUST_LOG`, else `default`). Safe to call twice.
pub fn init(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr)
        .try_init();
}
