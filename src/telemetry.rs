//! Logging set-up: structured `tracing` logs to stderr, filtered by `RUST_LOG`.

/// Install the global tracing subscriber (`RUST_LOG`, default `info`). Safe to call twice.
pub fn init() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(
            "info,kube_runtime=warn,kube_client::client::builder=off,kube_client::client::tls=error",
        )
    });
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
