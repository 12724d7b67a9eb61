//! A loopback TCP proxy a test can cut, to partition one client from the API server.

use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// A running proxy; `cut()` drops every connection and refuses new ones.
pub struct Proxy {
    /// The proxy's port on 127.0.0.1.
    pub port: u16,
    cut: CancellationToken,
}

impl Proxy {
    /// Forward 127.0.0.1:<new port> to 127.0.0.1:`upstream`.
    pub async fn start(upstream: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let cut = CancellationToken::new();
        let c = cut.clone();
        tokio::spawn(async move {
            let c = Arc::new(c);
            loop {
                let accepted = tokio::select! {
                    _ = c.cancelled() => return,
                    a = listener.accept() => a,
                };
                let Ok((mut down, _)) = accepted else { continue };
                let c = c.clone();
                tokio::spawn(async move {
                    let Ok(mut up) = TcpStream::connect(("127.0.0.1", upstream)).await else {
                        return;
                    };
                    tokio::select! {
                        _ = c.cancelled() => {}
                        _ = tokio::io::copy_bidirectional(&mut down, &mut up) => {}
                    }
                });
            }
        });
        Proxy { port, cut }
    }

    /// Partition: drop all connections and stop accepting.
    pub fn cut(&self) {
        self.cut.cancel();
    }
}
