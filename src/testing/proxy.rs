//! A loopback TCP proxy a test or the soak program controls, to put one client's path to the API server
//! through the faults a real network has: refusing (`cut` for good, `refuse` until
//! `restore`), black-holing (sockets stay open, nothing comes through: `black_hole`), and holding back only the connections
//! already open (a watch stuck on a half-open connection while new requests pass:
//! `freeze_open`, undone by `thaw`). And [`Unanswered`]: an address whose connections
//! never complete, as a NetworkPolicy that drops packets makes one.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// What the proxy does with bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Control {
    /// Forward nothing, on any connection, old or new, but keep every socket open.
    black_hole: bool,
    /// Connections numbered below this hold their bytes until it is lowered to 0.
    frozen_below: u64,
    /// Close every connection, and each new one at once.
    refusing: bool,
}

/// A running proxy.
pub struct Proxy {
    /// The proxy's port on 127.0.0.1.
    pub port: u16,
    cut: CancellationToken,
    control: watch::Sender<Control>,
    accepted: Arc<AtomicU64>,
}

impl Proxy {
    /// Forward 127.0.0.1:<new port> to 127.0.0.1:`upstream`.
    pub async fn start(upstream: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind a loopback port");
        let port = listener.local_addr().expect("a bound socket has an address").port();
        let cut = CancellationToken::new();
        let (control, _) = watch::channel(Control {
            black_hole: false,
            frozen_below: 0,
            refusing: false,
        });
        let accepted = Arc::new(AtomicU64::new(0));
        let (c, ctl, n) = (cut.clone(), control.clone(), accepted.clone());
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    _ = c.cancelled() => return,
                    a = listener.accept() => a,
                };
                let Ok((down, _)) = accepted else { continue };
                if ctl.borrow().refusing {
                    continue; // dropping it closes it
                }
                let id = n.fetch_add(1, Ordering::SeqCst);
                let (c, mut ctl) = (c.clone(), ctl.subscribe());
                tokio::spawn(async move {
                    let Ok(up) = TcpStream::connect(("127.0.0.1", upstream)).await else {
                        return;
                    };
                    let (down_r, down_w) = down.into_split();
                    let (up_r, up_w) = up.into_split();
                    let (ctl_down, ctl_up) = (ctl.clone(), ctl.clone());
                    tokio::select! {
                        _ = c.cancelled() => {}
                        _ = async {
                            if ctl.wait_for(|k| k.refusing).await.is_err() {
                                std::future::pending::<()>().await; // the proxy's owner is gone
                            }
                        } => {}
                        _ = pump(id, down_r, up_w, ctl_down) => {}
                        _ = pump(id, up_r, down_w, ctl_up) => {}
                    }
                });
            }
        });
        Proxy {
            port,
            cut,
            control,
            accepted,
        }
    }

    /// Partition that refuses: drop all connections and stop accepting.
    pub fn cut(&self) {
        self.cut.cancel();
    }

    /// Partition that refuses until [`Proxy::restore`]: close every connection, and
    /// each new one as soon as it is accepted.
    pub fn refuse(&self) {
        self.control.send_modify(|c| c.refusing = true);
    }

    /// Partition that black-holes: every connection stays open, nothing is forwarded.
    pub fn black_hole(&self) {
        self.control.send_modify(|c| c.black_hole = true);
    }

    /// Hold back the bytes of every connection open now; new connections pass.
    pub fn freeze_open(&self) {
        let open = self.accepted.load(Ordering::SeqCst);
        self.control.send_modify(|c| c.frozen_below = open);
    }

    /// Let frozen connections go on, delivering what they held.
    pub fn thaw(&self) {
        self.control.send_modify(|c| c.frozen_below = 0);
    }

    /// End a black hole or a refusal: bytes flow again (connections the client gave up
    /// on close).
    pub fn restore(&self) {
        self.control.send_modify(|c| {
            c.black_hole = false;
            c.refusing = false;
        });
    }

    /// A copy of `kubeconfig` (loopback API server) whose server is this proxy, written
    /// as `path`.
    pub fn kubeconfig(&self, kubeconfig: &std::path::Path, path: &std::path::Path) -> std::io::Result<()> {
        let port = api_port(kubeconfig)?;
        let text = std::fs::read_to_string(kubeconfig)?;
        let text = text.replace(&format!("127.0.0.1:{port}"), &format!("127.0.0.1:{}", self.port));
        std::fs::write(path, text)
    }
}

/// A loopback address whose connections never complete: what a published URL looks
/// like to a client whose packets a NetworkPolicy drops. Its listener's accept queue
/// (backlog 0) is filled by one connection of its own and never drained, so the kernel
/// drops every further SYN and a connect hangs until the caller's timeout.
pub struct Unanswered {
    /// The address's port on 127.0.0.1.
    pub port: u16,
    _listener: TcpListener,
    _filler: TcpStream,
}

impl Unanswered {
    /// Listen on a new loopback port and fill its accept queue.
    pub async fn start() -> std::io::Result<Self> {
        let socket = tokio::net::TcpSocket::new_v4()?;
        socket.bind(([127, 0, 0, 1], 0).into())?;
        let listener = socket.listen(0)?;
        let port = listener.local_addr()?.port();
        let filler = TcpStream::connect(("127.0.0.1", port)).await?;
        Ok(Unanswered {
            port,
            _listener: listener,
            _filler: filler,
        })
    }
}

/// The port of the loopback API server a kubeconfig names (`server: https://127.0.0.1:N`).
pub fn api_port(kubeconfig: &std::path::Path) -> std::io::Result<u16> {
    let text = std::fs::read_to_string(kubeconfig)?;
    let server = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: https://127.0.0.1:"))
        .ok_or_else(|| std::io::Error::other("no loopback server in the kubeconfig"))?;
    server.trim_end_matches('/').parse().map_err(std::io::Error::other)
}

/// Copy `from` to `to`, obeying the control channel before each write.
async fn pump(id: u64, mut from: OwnedReadHalf, mut to: OwnedWriteHalf, mut ctl: watch::Receiver<Control>) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let passes = |c: &Control| !c.black_hole && id >= c.frozen_below;
        if ctl.wait_for(passes).await.is_err() {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
