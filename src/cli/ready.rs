//! `leasehold run --ready-port PORT`: an HTTP endpoint that answers 200 while this
//! process holds its lock and runs CMD, and 503 otherwise, for a readiness probe
//! (`httpGet`, so the wrapped image needs no tool of its own). Behind a Service, only
//! the holder is then Ready and receives traffic, as client-go leader election users
//! route to their leader.
//!
//! Any path, any method: the answer is the state, nothing else is read. A connection
//! that sends nothing within [`READ_TIMEOUT`] is answered anyway.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// How long a probe's request may take to arrive before it is answered unread.
pub const READ_TIMEOUT: Duration = Duration::from_secs(1);

/// The endpoint's state: set it as the grant comes and goes.
#[derive(Debug)]
pub struct Ready {
    holding: watch::Sender<bool>,
    addr: SocketAddr,
}

impl Ready {
    /// Serve on `addr` (port 0: any free port), not holding yet.
    pub async fn serve(addr: SocketAddr) -> std::io::Result<Ready> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let (holding, state) = watch::channel(false);
        tokio::spawn(async move {
            loop {
                match listener.accept().await {
                    Ok((conn, _)) => drop(tokio::spawn(answer(conn, *state.borrow()))),
                    // Out of descriptors, say: a probe fails meanwhile, as it should.
                    Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
        });
        Ok(Ready { holding, addr })
    }

    /// Whether this process holds the lock (and CMD runs) now.
    pub fn set(&self, holding: bool) {
        self.holding.send_replace(holding);
    }

    /// The address it serves on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

/// Read what the probe sends (up to its headers' end, 4 KiB, or [`READ_TIMEOUT`]),
/// then answer `holding` and close.
async fn answer(mut conn: TcpStream, holding: bool) {
    let mut buf = [0u8; 4096];
    let mut read = 0;
    let _ = tokio::time::timeout(READ_TIMEOUT, async {
        while read < buf.len() {
            match conn.read(&mut buf[read..]).await {
                Ok(0) | Err(_) => break,
                Ok(n) => read += n,
            }
            if buf[..read].windows(4).any(|w| w == b"\r\n\r\n") {
                break;
            }
        }
    })
    .await;
    let (status, body) = if holding {
        ("200 OK", "holding\n")
    } else {
        ("503 Service Unavailable", "not holding\n")
    };
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = conn.write_all(response.as_bytes()).await;
    let _ = conn.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The status line a GET on `addr` gets.
    async fn probe(addr: SocketAddr) -> String {
        let mut conn = TcpStream::connect(addr).await.unwrap();
        conn.write_all(b"GET /ready HTTP/1.1\r\nHost: x\r\nUser-Agent: kube-probe/1.20\r\n\r\n")
            .await
            .unwrap();
        let mut out = String::new();
        conn.read_to_string(&mut out).await.unwrap();
        out.lines().next().unwrap_or_default().to_string()
    }

    #[tokio::test]
    async fn answers_the_probe_by_whether_the_lock_is_held() {
        let ready = Ready::serve("127.0.0.1:0".parse().unwrap()).await.unwrap();
        assert_eq!(probe(ready.addr()).await, "HTTP/1.1 503 Service Unavailable");
        ready.set(true);
        assert_eq!(probe(ready.addr()).await, "HTTP/1.1 200 OK");
        ready.set(false);
        assert_eq!(probe(ready.addr()).await, "HTTP/1.1 503 Service Unavailable");
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_connection_is_answered_after_the_read_timeout() {
        let ready = Ready::serve("127.0.0.1:0".parse().unwrap()).await.unwrap();
        ready.set(true);
        let mut conn = TcpStream::connect(ready.addr()).await.unwrap();
        let mut out = String::new();
        // Paused time runs ahead to the read timeout as soon as all tasks wait.
        conn.read_to_string(&mut out).await.unwrap();
        assert!(out.starts_with("HTTP/1.1 200 OK"), "{out}");
    }
}
