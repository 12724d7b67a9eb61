//! The listener of the endpoints clients use (release notices, direct grants) and of the
//! admission webhook: at most [`MAX_CONNECTIONS`] connections open at once, and at most
//! [`MAX_PER_SOURCE`] from one address, so that neither one pod nor many can exhaust the
//! controller's sockets or memory. A connection over either bound is closed as soon as
//! it is accepted; its client falls back to the lock's status and its claim, as it does
//! for any failure. And [`serve`]: a connection that sends no whole request head within
//! [`HEADER_READ_TIMEOUT`] (of its accept, or of the last answer on a kept-alive one) is
//! closed, and so is one whose request body stalls for [`BODY_READ_TIMEOUT`], so idle
//! connections cannot fill those bounds (eight addresses once held them all, and with
//! the webhook's `failurePolicy: Ignore` that switched admission off).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

/// The most connections open at once.
pub const MAX_CONNECTIONS: usize = 2048;
/// The most connections open at once from one address (pods on the host network share
/// their node's).
pub const MAX_PER_SOURCE: usize = 256;

/// How long a connection may take to send a request's head: counted from its accept
/// and, on a kept-alive connection, from the last answer (so that an idle connection is
/// closed after as long). Clients send theirs at once, on a connection of its own.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a request's body may stall.
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Serve `router` on `listener`'s connections (HTTP/1.1) with the timeouts above, until
/// the task is dropped.
pub async fn serve<L: axum::serve::Listener>(listener: L, router: axum::Router) {
    serve_with(listener, router, (HEADER_READ_TIMEOUT, BODY_READ_TIMEOUT)).await
}

/// [`serve`] with these (head, body) timeouts.
async fn serve_with<L: axum::serve::Listener>(
    mut listener: L,
    router: axum::Router,
    (head, body): (Duration, Duration),
) {
    let router = router.layer(tower_http::timeout::RequestBodyTimeoutLayer::new(body));
    loop {
        let (io, _) = listener.accept().await;
        let service = hyper_util::service::TowerToHyperService::new(router.clone());
        tokio::spawn(async move {
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(head)
                .serve_connection(hyper_util::rt::TokioIo::new(io), service);
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "a connection ended in error");
            }
        });
    }
}

/// The open connections, counted.
#[derive(Debug, Default)]
struct Open {
    total: usize,
    by_source: HashMap<IpAddr, usize>,
}

impl Open {
    /// Count a connection from `source` in, if the bounds allow it.
    fn admit(&mut self, source: IpAddr) -> bool {
        let from_source = self.by_source.get(&source).copied().unwrap_or(0);
        if self.total >= MAX_CONNECTIONS || from_source >= MAX_PER_SOURCE {
            return false;
        }
        self.total += 1;
        self.by_source.insert(source, from_source + 1);
        true
    }

    /// Count a closed connection from `source` out.
    fn close(&mut self, source: IpAddr) {
        self.total = self.total.saturating_sub(1);
        if let Some(n) = self.by_source.get_mut(&source) {
            *n -= 1;
            if *n == 0 {
                self.by_source.remove(&source);
            }
        }
    }
}

/// A TCP listener that keeps to the bounds.
pub struct Bounded {
    inner: TcpListener,
    open: Arc<Mutex<Open>>,
}

impl Bounded {
    /// Bound `inner`.
    pub fn new(inner: TcpListener) -> Self {
        Bounded {
            inner,
            open: Arc::default(),
        }
    }
}

/// One admitted connection; counted out when dropped.
pub struct Counted {
    stream: TcpStream,
    source: IpAddr,
    open: Arc<Mutex<Open>>,
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.open.lock().expect("connections lock poisoned").close(self.source);
    }
}

impl AsyncRead for Counted {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Counted {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

impl axum::serve::Listener for Bounded {
    type Io = Counted;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Counted, SocketAddr) {
        loop {
            let (stream, addr) = match self.inner.accept().await {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors, or a connection reset before it was
                    // taken: try again shortly rather than spin.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let source = addr.ip();
            if self.open.lock().expect("connections lock poisoned").admit(source) {
                let open = self.open.clone();
                return (Counted { stream, source, open }, addr);
            }
            tracing::debug!(%source, "too many connections: closed at once");
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_source_is_bounded_on_its_own_and_all_together() {
        let mut open = Open::default();
        let (a, b): (IpAddr, IpAddr) = ([10, 0, 0, 1].into(), [10, 0, 0, 2].into());
        for _ in 0..MAX_PER_SOURCE {
            assert!(open.admit(a));
        }
        assert!(!open.admit(a), "one source over its bound");
        assert!(open.admit(b), "another source is not held back by it");
        open.close(a);
        assert!(open.admit(a), "a closed connection makes room");
        let mut n = 0u32;
        while open.admit(IpAddr::from(n.to_be_bytes())) {
            n += 1;
        }
        assert_eq!(open.total, MAX_CONNECTIONS);
        assert!(!open.admit(b), "over the total bound");
        open.close(b);
        assert!(open.admit(b));
    }

    /// Issue #41: idle connections to the client port and the webhook (both served
    /// here) were never timed out: a few addresses could hold every connection the
    /// bounds allow.
    #[tokio::test]
    async fn a_connection_that_sends_no_whole_head_in_time_is_closed_and_a_request_is_answered() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let bounded = Bounded::new(TcpListener::bind("127.0.0.1:0").await.unwrap());
        let addr = axum::serve::Listener::local_addr(&bounded).unwrap();
        let router = axum::Router::new().route("/", axum::routing::get(|| async { "ok" }));
        let limit = Duration::from_millis(300);
        let _serving = tokio::spawn(serve_with(bounded, router, (limit, limit)));
        let closed_after = |mut conn: TcpStream| async move {
            let started = std::time::Instant::now();
            let mut buf = [0u8; 256];
            let read = tokio::time::timeout(Duration::from_secs(5), conn.read(&mut buf)).await;
            assert!(matches!(read, Ok(Ok(0) | Err(_))), "still open: {read:?}");
            started.elapsed()
        };
        let silent = TcpStream::connect(addr).await.unwrap();
        assert!(closed_after(silent).await >= limit, "an idle connection");
        let mut slow = TcpStream::connect(addr).await.unwrap();
        slow.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n").await.unwrap();
        closed_after(slow).await; // a head never finished
        let mut kept = TcpStream::connect(addr).await.unwrap();
        kept.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n").await.unwrap();
        let mut buf = [0u8; 256];
        let n = kept.read(&mut buf).await.unwrap();
        assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
        closed_after(kept).await; // idle after its answer
    }

    #[tokio::test]
    async fn a_connection_over_the_bound_is_closed_and_a_closed_one_makes_room() {
        use axum::serve::Listener;
        use tokio::io::AsyncReadExt;
        let mut bounded = Bounded::new(TcpListener::bind("127.0.0.1:0").await.unwrap());
        let addr = bounded.local_addr().unwrap();
        let mut kept = Vec::new();
        for _ in 0..MAX_PER_SOURCE {
            let client = TcpStream::connect(addr).await.unwrap();
            kept.push((client, bounded.accept().await.0));
        }
        // The next is accepted by the kernel and closed by the listener at once.
        let mut over = TcpStream::connect(addr).await.unwrap();
        let accepting = tokio::spawn(async move { (bounded.accept().await.0, bounded) });
        let mut buf = [0u8; 1];
        assert_eq!(over.read(&mut buf).await.unwrap(), 0, "closed");
        drop(kept.pop());
        let _room = TcpStream::connect(addr).await.unwrap();
        let (_admitted, _) = accepting.await.unwrap();
    }
}
