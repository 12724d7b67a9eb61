//! The control plane for a test binary or benchmark: one `leasehold dev` per process.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// Start `leasehold dev --die-with-parent` (the binary at `leasehold`) from a thread
/// that lives as long as this process — the parent-death signal is tied to the spawning
/// thread — and return its kubeconfig once ready. The control plane stops when this
/// process exits, however it exits. For test harnesses and benchmarks.
pub fn spawn_for_process(leasehold: &Path, timeout: Duration) -> std::io::Result<PathBuf> {
    use std::io::BufRead;
    let leasehold = leasehold.to_path_buf();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        // Spawned from this thread, which never ends, not from the caller's.
        let spawned = std::process::Command::new(&leasehold)
            .args(["dev", "--die-with-parent"])
            .stdout(std::process::Stdio::piped())
            .spawn();
        let mut child = match spawned {
            Ok(child) => child,
            Err(e) => return drop(tx.send(Err(e))),
        };
        let stdout = child.stdout.take().expect("stdout is piped");
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(path) = line.strip_prefix("KUBECONFIG=") {
                let _ = tx.send(Ok(PathBuf::from(path)));
            }
        }
        let _keep = child; // hold the child while this thread parks forever
        loop {
            std::thread::park();
        }
    });
    rx.recv_timeout(timeout).map_err(|_| {
        std::io::Error::other(format!(
            "leasehold dev was not ready within {timeout:?} (see its stderr)"
        ))
    })?
}
