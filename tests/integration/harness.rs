//! The launcher leaves nothing behind: not when stopped, not when killed, not when
//! the process that started it (a test harness) is killed.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::support::{LEASEHOLD, wait_for};

/// Start `sh -c 'leasehold dev --die-with-parent; :'` (sh stands for a test harness)
/// and return sh, the control plane's dir and its children's pids.
fn start_under_sh() -> (Child, PathBuf, Vec<i32>) {
    let mut sh = Command::new("sh")
        .arg("-c")
        .arg(format!("'{LEASEHOLD}' dev --die-with-parent; :"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn sh");
    let stdout = sh.stdout.take().unwrap();
    let line = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .find_map(|l| l.strip_prefix("KUBECONFIG=").map(String::from))
        .expect("leasehold dev printed its kubeconfig");
    let dir = Path::new(&line).parent().unwrap().to_path_buf();
    let pids = std::fs::read_to_string(dir.join("pids")).unwrap();
    let pids: Vec<i32> = pids.lines().map(|p| p.parse().unwrap()).collect();
    assert_eq!(pids.len(), 3, "etcd, kube-apiserver, kube-controller-manager");
    (sh, dir, pids)
}

fn alive(pid: i32) -> bool {
    // A zombie has exited; only a running process counts.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !s.rsplit(')').next().unwrap_or("").trim_start().starts_with('Z'))
        .unwrap_or(false)
}

#[tokio::test]
async fn killing_the_harness_leaves_no_process_and_no_dir() {
    let (mut sh, dir, pids) = start_under_sh();
    assert!(pids.iter().all(|p| alive(*p)));
    sh.kill().expect("SIGKILL the harness");
    sh.wait().unwrap();
    let deadline = Duration::from_secs(20);
    wait_for("children to exit", deadline, || async {
        pids.iter().all(|p| !alive(*p)).then_some(())
    })
    .await;
    wait_for("the temp dir to be removed", deadline, || async {
        (!dir.exists()).then_some(())
    })
    .await;
}

#[tokio::test]
async fn sigkill_of_the_launcher_kills_children_and_the_next_start_sweeps_its_dir() {
    let (mut sh, dir, pids) = start_under_sh();
    let launcher = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .find(|p| {
            let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
            let ppid = stat
                .rsplit(')')
                .next()
                .and_then(|r| r.split_whitespace().nth(1))
                .and_then(|x| x.parse().ok());
            ppid == Some(sh.id() as i32)
        })
        .expect("the launcher is sh's child");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(launcher), nix::sys::signal::Signal::SIGKILL).unwrap();
    let deadline = Duration::from_secs(20);
    wait_for("children to die with the launcher", deadline, || async {
        pids.iter().all(|p| !alive(*p)).then_some(())
    })
    .await;
    sh.wait().unwrap();
    assert!(dir.exists(), "nobody could clean up after SIGKILL");
    leasehold::dev::sweep_stale_dirs();
    assert!(!dir.exists(), "the sweep removes the dead launcher's dir");
}

/// The kubeconfig `leasehold dev` hands out verifies the API server: it names the CA
/// of kube-apiserver's certificate, and a client trusting another certificate fails.
#[tokio::test]
async fn the_dev_kubeconfig_verifies_the_api_servers_certificate() {
    let path = crate::support::kubeconfig();
    let kubeconfig = kube::config::Kubeconfig::read_from(path).unwrap();
    let cluster = kubeconfig.clusters[0].cluster.clone().unwrap();
    assert_eq!(cluster.insecure_skip_tls_verify, None, "{}", path.display());
    let ca = std::path::PathBuf::from(cluster.certificate_authority.expect("a CA file"));
    crate::support::client()
        .await
        .apiserver_version()
        .await
        .expect("the CA verifies the server");

    // Trusting only the serving certificate itself (not its issuer) must fail.
    let chain = std::fs::read_to_string(ca.with_file_name("apiserver.crt")).unwrap();
    let end = "-----END CERTIFICATE-----";
    let leaf = &chain[..chain.find(end).unwrap() + end.len()];
    let wrong = std::env::temp_dir().join(format!("leasehold-wrong-ca-{}.crt", std::process::id()));
    std::fs::write(&wrong, format!("{leaf}\n")).unwrap();
    let mut other = kubeconfig.clone();
    other.clusters[0].cluster.as_mut().unwrap().certificate_authority = Some(wrong.display().to_string());
    let config = kube::Config::from_custom_kubeconfig(other, &Default::default())
        .await
        .unwrap();
    let client = leasehold::kubeconfig::client_from(config).unwrap();
    let err = client
        .apiserver_version()
        .await
        .expect_err("an untrusted server must be refused");
    let _ = std::fs::remove_file(&wrong);
    assert!(format!("{err:?}").contains("UnknownIssuer"), "{err:?}");
}
