//! Building a Kubernetes client: from a kubeconfig file and/or a named context, or the
//! usual inference (`$KUBECONFIG`, `~/.kube/config`, in-cluster), on connections that
//! send at once ([`client_from`]); for a lock client's watches, over HTTP/2 with PINGs
//! that find a dead connection ([`watch_client_from`]).

mod spread;

use std::path::Path;
use std::time::Duration;

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

/// How long a connection may carry nothing from the API server before the client sends
/// an HTTP/2 PING on it, and how long the answer may take before the connection counts as
/// dead. A watch on a connection that died without a reset (a black hole, a half-open
/// connection behind a proxy) is found within their sum and started anew on a new
/// connection, at no API request: a waiting claimant needs no periodic read of its lock
/// for that (see [`crate::protocol::timing::WAIT_CHECK`]).
/// A granted waiter must see its grant within its lease and the controller's grace: 6 s
/// leaves a lease of 10 s room for a new watch (a shorter lease may lose a grant that
/// comes while its watch stalls; it is handed on). Answering a PING is cheap for the
/// API server: no request, no authentication, no etcd read.
pub const PING_AFTER: Duration = Duration::from_secs(3);
/// See [`PING_AFTER`]; long enough that a busy API server is not taken for a dead one.
pub const PING_TIMEOUT: Duration = Duration::from_secs(3);

/// A client for `config` whose TCP connections send without delay (`TCP_NODELAY`), over
/// HTTP/1.1: a connection a request (a watch keeps its own), as kube's builder makes
/// them. The controller's client, and a lock client's writes.
///
/// kube's own builder leaves Nagle's algorithm on. A TLS handshake with a client
/// certificate then waits for the server's delayed ACK before its last flight goes out:
/// each new connection to the API server took about 45 ms here instead of about 5 ms,
/// three times over for every `leasehold run` start, and once more whenever a request on
/// a handoff's path needs a new connection. This builds the same stack (TLS from
/// `config`, its timeouts, retries, authentication and headers) on a connector that sets
/// `TCP_NODELAY`. A configuration with a proxy, an exec plugin or a TLS server name of
/// its own is left to kube's builder, which knows those.
pub fn client_from(config: kube::Config) -> Result<Client, kube::Error> {
    build(config, None, Transport::Http1)
}

/// A client for `config` for a lock client's reads and watches: [`client_from`]'s, but
/// speaking HTTP/2 where the API server offers it (ALPN, as client-go does), with PINGs
/// that find a dead connection ([`PING_AFTER`]), on as many connections as the streams
/// in use need (`kubeconfig/spread.rs`: a watch holds a stream for as long as it runs, and one
/// connection carries a limited number at once).
///
/// Over HTTP/1.1 nothing tells a watch stalled on a dead connection from a quiet one but
/// a request; with this client a waiter learns of a grant its stalled watch hid within
/// seconds, at no request. Not for a controller: under load (the scale benchmark, 1,000
/// locks on 2 cores) its watches, multiplexed on one connection, were dropped and listed
/// afresh (0.36 LISTs per grant, release → grant p99 7.0 s against 2.2 s over HTTP/1.1).
pub fn watch_client_from(config: kube::Config) -> Result<Client, kube::Error> {
    build(config, None, Transport::Http2Pinged)
}

/// A lock's two clients for `config`: the lock client ([`watch_client_from`]) and a
/// client for the claim's writes ([`client_from`]; see
/// [`crate::client::LockBuilder::write_client`]), on one TLS configuration, so that
/// the second connection resumes the first one's TLS session instead of a full
/// handshake. A full handshake makes the API server sign with its certificate's key
/// (about 1 ms of its CPU for RSA-2048, measured here: a tenth of its CPU in the
/// handoff benchmark, where one `leasehold run` starts at each handoff); a resumed one
/// does not. Both clients speak for the same identity to the same server, so a
/// session resumed across them changes nothing they may do.
pub fn lock_clients_from(config: kube::Config) -> Result<(Client, Client), kube::Error> {
    // A clone shares the original's session store: what one connection learns, the
    // other resumes.
    let tls = if kube_builds(&config) {
        None
    } else {
        Some(tls_config(&config)?)
    };
    let writes = build(config.clone(), tls.clone(), Transport::Http1)?;
    let reads = build(config, tls, Transport::Http2Pinged)?;
    Ok((reads, writes))
}

/// How a client's connections carry requests.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Transport {
    Http1,
    Http2Pinged,
}

/// Whether kube's own builder makes the client for `config` (see [`client_from`]).
fn kube_builds(config: &kube::Config) -> bool {
    config.proxy_url.is_some() || config.auth_info.exec.is_some() || config.tls_server_name.is_some()
}

/// The TLS configuration of the clients [`build`] makes for `config`.
fn tls_config(config: &kube::Config) -> Result<rustls::ClientConfig, kube::Error> {
    use kube::client::ConfigExt;
    config.rustls_client_config()
}

/// A client for `config` on `tls` (else a TLS configuration of its own) carrying
/// requests by `transport`.
fn build(config: kube::Config, tls: Option<rustls::ClientConfig>, transport: Transport) -> Result<Client, kube::Error> {
    use hyper_util::client::legacy::connect::HttpConnector;
    use hyper_util::rt::{TokioExecutor, TokioTimer};

    if kube_builds(&config) {
        return Client::try_from(config);
    }
    let tls = match tls {
        Some(tls) => tls,
        None => tls_config(&config)?,
    };
    let mut tcp = HttpConnector::new();
    tcp.enforce_http(false);
    tcp.set_nodelay(true);
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http();
    let https = match transport {
        Transport::Http1 => https.enable_http1().wrap_connector(tcp),
        Transport::Http2Pinged => https.enable_all_versions().wrap_connector(tcp),
    };
    let mut connector = hyper_timeout::TimeoutConnector::new(https);
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    connector.set_reset_reader_on_write(config.reset_reader_on_write);
    let executor = hyper_util::client::legacy::Client::builder(TokioExecutor::new());
    match transport {
        Transport::Http1 => finish(config, executor.build(connector)),
        Transport::Http2Pinged => {
            let mut builder = executor;
            builder
                .timer(TokioTimer::new())
                .http2_keep_alive_interval(PING_AFTER)
                .http2_keep_alive_timeout(PING_TIMEOUT);
            finish(config, spread::Spread::new(builder, connector))
        }
    }
}

/// kube's layers (base URI, retries, authentication, headers) and a trace around `http`.
fn finish<S, B>(config: kube::Config, http: S) -> Result<Client, kube::Error>
where
    S: tower::Service<
            http::Request<kube::client::Body>,
            Response = http::Response<B>,
            Error = hyper_util::client::legacy::Error,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: hyper::body::Body<Data = hyper::body::Bytes, Error = hyper::Error> + Send + 'static,
{
    use kube::client::ConfigExt;
    use kube::client::retry::RetryPolicy;
    use tower::ServiceBuilder;
    use tower::retry::RetryLayer;

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

/// A lock client for a kubeconfig file (its current context): [`watch_client_from`].
pub async fn watch_client_for(path: &Path) -> Result<Client, kube::Error> {
    watch_client_from(config(Some(path), None).await?)
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
