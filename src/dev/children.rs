//! The control plane's child processes: starting, restarting, readiness and stopping.

use std::path::Path;
use std::time::{Duration, Instant};

use kube::Client;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::workdir::{log_tail, remove_dir};
use super::{ControlPlane, DevError, READY_TIMEOUT, STOP_GRACE, prep};

impl ControlPlane {
    /// Kill one component (`etcd`, `kube-apiserver`, `kube-controller-manager`) with
    /// SIGKILL, as a crash would, keep it down for `down`, start it again with the same
    /// flags and data, and wait until the API server is ready again.
    pub async fn restart(&mut self, name: &str, down: Duration) -> Result<(), DevError> {
        let at = self.children.iter().position(|(n, _)| *n == name);
        let Some(at) = at else {
            return Err(prep(Path::new(name), std::io::Error::other("no such component")));
        };
        let (name, mut child) = self.children.remove(at);
        let _ = child.kill().await;
        tokio::time::sleep(down).await;
        let (_, leasehold, program, args) = self
            .specs
            .iter()
            .find(|(n, ..)| *n == name)
            .cloned()
            .expect("every child has a spec");
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.spawn(&leasehold, name, &program, &args)?;
        let client = self.client().await?;
        self.wait_ready(&client).await
    }

    pub(super) fn spawn(
        &mut self,
        leasehold: &Path,
        name: &'static str,
        program: &Path,
        args: &[&str],
    ) -> Result<(), DevError> {
        if !self.specs.iter().any(|(n, ..)| *n == name) {
            let owned = args.iter().map(|a| a.to_string()).collect();
            self.specs
                .push((name, leasehold.to_path_buf(), program.to_path_buf(), owned));
        }
        let logs = self.dir.join("logs");
        std::fs::create_dir_all(&logs).map_err(|e| prep(&logs, e))?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(logs.join(format!("{name}.log")))
            .map_err(|e| prep(&logs, e))?;
        let err = log.try_clone().map_err(|e| prep(&logs, e))?;
        let mut cmd = crate::supervise::guarded_command(&leasehold.to_path_buf(), Signal::SIGKILL, program);
        cmd.args(args)
            .stdin(std::process::Stdio::null())
            .stdout(log)
            .stderr(err)
            .kill_on_drop(true);
        let child = cmd.spawn().map_err(|e| DevError::Spawn(name, e))?;
        self.children.push((name, child));
        Ok(())
    }

    pub(super) async fn wait_ready(&mut self, client: &Client) -> Result<(), DevError> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            for (name, child) in &mut self.children {
                if let Ok(Some(status)) = child.try_wait() {
                    return Err(DevError::Exited(name, status, log_tail(&self.dir, name)));
                }
            }
            let req = http::Request::get("/readyz")
                .body(Vec::new())
                .expect("a static request is valid");
            if matches!(client.request_text(req).await, Ok(body) if body.trim() == "ok") {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(DevError::NotReady(READY_TIMEOUT, log_tail(&self.dir, "kube-apiserver")));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Stop every child (SIGTERM, then SIGKILL after [`STOP_GRACE`]) and remove the dir.
    pub async fn stop(mut self) {
        for (_, child) in self.children.iter_mut().rev() {
            if let Some(pid) = child.id() {
                let _ = kill(Pid::from_raw(pid as i32), Signal::SIGTERM);
            }
            if tokio::time::timeout(STOP_GRACE, child.wait()).await.is_err() {
                let _ = child.kill().await;
            }
        }
        self.children.clear();
        remove_dir(&self.dir);
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        for (_, child) in &mut self.children {
            let _ = child.start_kill();
        }
        if !self.children.is_empty() {
            remove_dir(&self.dir);
        }
    }
}
