//! Building a Kubernetes client: from a kubeconfig file and/or a named context, or the
//! usual inference (`$KUBECONFIG`, `~/.kube/config`, in-cluster), on connections that
//! send at once ([`client_from`]).

use std::path::Path;

use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};

/// A client for a kubeconfig file (its current context).
pub async fn client_for(path: &Path) -> Result<Client, kube::Error> {
    client(Some(path), None).await
}

/// A client for `kubeconfig` (else `$KUBECONFIG` or `~/.kube/config`) and `context`
/// (else the current context); with neither given, the inferred default, which falls
/// back to the in-cluster configuration.
pub async fn client(kubeconfig: Option<&Path>, context: Option<&str>) -> Result<Client, kube::Error> {
    client_from(config(kubeconfig, context).await?)
}

/// A client for `config` whose TCP connections send without delay (`TCP_NODELAY`).
///
/// kube's own builder leaves Nagle's algorithm on. A TLS handshake with a client
/// certificate then waits for the server's delayed ACK before its last flight goes out:
/// each new connection to the API server took about 45 ms here instead of about 5 ms,
/// three times over for every `leasehold run` start, and once more whenever a request on
/// a handoff's path needs a new connection. This builds the same stack (TLS from
/// `config`, its timeouts, retries, authentication and headers) on a connector that sets
/// `TCP_NODELAY`. A configuration with a proxy or an exec plugin is left to kube's
/// builder, which knows those.
pub fn client_from(config: kube::Config) -> Result<Client, kube::Error> {
    use hyper_util::client::legacy::connect::HttpConnector;
    use hyper_util::rt::TokioExecutor;
    use kube::client::ConfigExt;
    use kube::client::retry::RetryPolicy;
    use tower::ServiceBuilder;
    use tower::retry::RetryLayer;

    if config.proxy_url.is_some() || config.auth_info.exec.is_some() {
        return Client::try_from(config);
    }
    let mut tcp = HttpConnector::new();
    tcp.enforce_http(false);
    tcp.set_nodelay(true);
    let mut connector = hyper_timeout::TimeoutConnector::new(config.rustls_https_connector_with_connector(tcp)?);
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    connector.set_reset_reader_on_write(config.reset_reader_on_write);
    let http = hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build(connector);
    // Requests, answers and failures at debug: a failed request is its caller's to
    // report (a readiness poll, a renewal retried), not an error line of its own.
    let trace = tower_http::trace::TraceLayer::new_for_http()
        .make_span_with(|req: &http::Request<kube::client::Body>| {
            tracing::debug_span!("HTTP", http.method = %req.method(), http.url = %req.uri())
        })
        .on_failure(tower_http::trace::DefaultOnFailure::new().level(tracing::Level::DEBUG));
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(
            config
                .default_retry
                .then(|| RetryLayer::new(RetryPolicy::server_retry())),
        )
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .layer(trace)
        .map_err(tower::BoxError::from)
        .service(http);
    Ok(Client::new(service, config.default_namespace))
}

/// The configuration [`client`] builds its client from (read once, it can make several
/// clients, each with its own connection pool).
pub async fn config(kubeconfig: Option<&Path>, context: Option<&str>) -> Result<kube::Config, kube::Error> {
    let options = KubeConfigOptions {
        context: context.map(String::from),
        ..KubeConfigOptions::default()
    };
    let config = match (kubeconfig, context) {
        (Some(path), _) => {
            let kc = Kubeconfig::read_from(path).map_err(kube::Error::InferKubeconfig)?;
            kube::Config::from_custom_kubeconfig(kc, &options).await
        }
        (None, Some(_)) => kube::Config::from_kubeconfig(&options).await,
        (None, None) => return kube::Config::infer().await.map_err(kube::Error::InferConfig),
    };
    config.map_err(kube::Error::InferKubeconfig)
}
