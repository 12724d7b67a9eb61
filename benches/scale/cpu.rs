//! Where a run's CPU goes: the controller's, and the API server's, etcd's and this
//! driver's beside it, per grant and as a share of the machine, so a run shows which
//! process is the limit (the ceiling's `wrk` run gives the API server and etcd every
//! core; a scale run shares them with the controller and the driver).

use std::path::Path;
use std::sync::OnceLock;

static PLANE: OnceLock<Plane> = OnceLock::new();

/// Find the control plane of `kubeconfig` once, for [`now`].
pub fn init(kubeconfig: &Path) {
    let _ = PLANE.set(Plane::find(kubeconfig));
}

/// The control plane's and this driver's CPU seconds now (zeros before [`init`]).
pub fn now() -> Sample {
    PLANE
        .get()
        .map_or(Sample([0.0; 3], std::time::Instant::now()), Plane::sample)
}

/// CPU seconds a process has used (user + system); 0 when it cannot be read.
pub fn seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat.rsplit(')').next().unwrap_or("").split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // After the command name: state is field 0, utime 11, stime 12 (clock ticks of 1/100 s).
    (ticks(11) + ticks(12)) / 100.0
}

/// The control plane's processes of one `leasehold dev` (found by its directory's name
/// in their arguments) and this process.
pub struct Plane {
    apiserver: Option<u32>,
    etcd: Option<u32>,
}

/// CPU seconds of the API server, etcd and this driver at one moment.
#[derive(Clone, Copy)]
pub struct Sample([f64; 3], std::time::Instant);

impl Plane {
    /// The processes of the control plane whose kubeconfig is `kubeconfig`.
    pub fn find(kubeconfig: &Path) -> Self {
        let tag = kubeconfig
            .parent()
            .and_then(|d| d.file_name())
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut plane = Plane {
            apiserver: None,
            etcd: None,
        };
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            let args: Vec<String> = cmdline
                .split(|b| *b == 0)
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            let program = args.first().and_then(|a| a.rsplit('/').next()).unwrap_or_default();
            if tag.is_empty() || !args.iter().any(|a| a.contains(&tag)) {
                continue;
            }
            match program {
                "kube-apiserver" => plane.apiserver = Some(pid),
                "etcd" => plane.etcd = Some(pid),
                _ => {}
            }
        }
        plane
    }

    /// The processes' CPU seconds now.
    pub fn sample(&self) -> Sample {
        let of = |pid: Option<u32>| pid.map_or(0.0, seconds);
        Sample(
            [of(self.apiserver), of(self.etcd), seconds(std::process::id())],
            std::time::Instant::now(),
        )
    }
}

/// The CPU each process used between `before` and `after` (with the controller's
/// `controller` seconds) per grant, and all of it as a share of the machine's cores
/// between the two samples: one line's tail.
pub fn per_grant(before: Sample, after: Sample, controller: f64, grants: usize) -> String {
    let elapsed = after.1.duration_since(before.1).as_secs_f64();
    let [api, etcd, driver] = [0, 1, 2].map(|i| after.0[i] - before.0[i]);
    let ms = |s: f64| s * 1000.0 / grants.max(1) as f64;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let busy = (api + etcd + driver + controller) / (elapsed.max(1e-9) * cores);
    format!(
        "CPU per grant: API server {:.2} ms, etcd {:.2} ms, controller {:.2} ms, driver {:.2} ms; \
         all four {:.0}% of {cores} cores",
        ms(api),
        ms(etcd),
        ms(controller),
        ms(driver),
        100.0 * busy
    )
}
