//! The scale workload, shared by `benches/scale.rs` (figures) and the integration test
//! that guards correctness at breadth: `locks` locks × `claimants` claims each, written
//! ahead of time per the claim protocol (one claimant pod each, in order), and a driver
//! that releases every grant as soon as it sees it — at once, or at an offered rate —
//! and checks that every lock granted its claims in creation order with strictly
//! increasing tokens.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};

use crate::api::{DistributedLock, DistributedLockSpec};
use crate::protocol::claim::{PodIdentity, claim_lease_with, claim_name, release_patch_with};
use crate::protocol::release::Secret;
use crate::protocol::timing::MAX_LEASE_SECONDS;

/// How many API requests the setup and the driver keep in flight.
pub const IN_FLIGHT: usize = 32;

/// One prepared workload: its namespace and each lock's claims in creation order.
pub struct Workload {
    /// The namespace holding the locks, claimant pods and claims.
    pub namespace: String,
    /// Lock name → its claims, oldest first.
    pub claims: HashMap<String, Vec<String>>,
    /// The release secret of every claim (one for all: what counts here is that each
    /// claim records its hashes in the lock's status and releases with its secret, as a
    /// client's claim does).
    pub secret: Secret,
}

/// What driving a workload showed.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Grants seen.
    pub grants: usize,
    /// From the first release to the last grant.
    pub elapsed: Duration,
    /// Release sent → the lock's next grant seen, per handoff.
    pub handoffs: Vec<Duration>,
    /// FIFO or token-order violations, described.
    pub violations: Vec<String>,
    /// With an offered rate: how long until every lock had its first grant (the
    /// controller's start-up, at its own pace); releases are held back until then.
    pub warmup: Option<Duration>,
    /// The statuses of the run's locks the driver's watch saw after its first listing
    /// (each one written), and their bytes as JSON: what the API server decodes,
    /// validates and stores per write.
    pub statuses: (usize, usize),
}

/// Create `count` Pod objects (never scheduled) named `<prefix><i>` in `ns`.
pub async fn pods(client: &Client, ns: &str, prefix: &str, count: usize) -> anyhow::Result<Vec<PodIdentity>> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let made = futures::stream::iter(0..count)
        .map(|i| {
            let api = api.clone();
            async move {
                let pod: Pod = serde_json::from_value(serde_json::json!({
                    "metadata": {"name": format!("{prefix}{i}")},
                    "spec": {"automountServiceAccountToken": false, "containers": [{"name": "app", "image": "leasehold"}]}
                }))?;
                let pod = api.create(&PostParams::default(), &pod).await?;
                Ok::<_, anyhow::Error>(PodIdentity {
                    name: pod.name_any(),
                    namespace: ns.into(),
                    uid: pod.uid().unwrap_or_default(),
                })
            }
        })
        .buffered(IN_FLIGHT)
        .collect::<Vec<_>>()
        .await;
    made.into_iter().collect()
}

/// Create namespace `ns` (it must not exist) and wait until its default ServiceAccount
/// has its token, without which a v1.20 API server admits no pod.
pub async fn namespace(client: &Client, ns: &str) -> anyhow::Result<()> {
    let obj: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": ns}}))?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &obj)
        .await?;
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    let until = Instant::now() + Duration::from_secs(60);
    let tokened = |sa: Option<ServiceAccount>| sa.and_then(|s| s.secrets).is_some_and(|s| !s.is_empty());
    while !tokened(sas.get_opt("default").await?) {
        anyhow::ensure!(
            Instant::now() < until,
            "the default ServiceAccount of {ns} got no token in 60 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// Create `locks` locks (`l0`…) and `claimants` pods in `ns`, and for each lock one claim
/// per pod, in pod order (claims live [`MAX_LEASE_SECONDS`], so none needs renewing).
pub async fn prepare(client: &Client, ns: &str, locks: usize, claimants: usize) -> anyhow::Result<Workload> {
    namespace(client, ns).await?;
    let pods = pods(client, ns, "c", claimants).await?;
    let lock_api: Api<DistributedLock> = Api::namespaced(client.clone(), ns);
    let names: Vec<String> = (0..locks).map(|i| format!("l{i}")).collect();
    futures::stream::iter(names.iter())
        .map(|name| {
            let api = lock_api.clone();
            let spec = DistributedLockSpec {
                lease_duration_seconds: 60,
                ..Default::default()
            };
            async move {
                api.create(&PostParams::default(), &DistributedLock::new(name, spec))
                    .await
            }
        })
        .buffer_unordered(IN_FLIGHT)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
    let leases: Api<Lease> = Api::namespaced(client.clone(), ns);
    let mut claims: HashMap<String, Vec<String>> = HashMap::new();
    let secret = Secret::generate();
    // Claim i of every lock before claim i + 1 of any: the creation second orders them.
    for pod in &pods {
        let batch: Vec<(String, Lease)> = names
            .iter()
            .map(|lock| {
                let name = claim_name(lock);
                (
                    lock.clone(),
                    claim_lease_with(&name, lock, pod, MAX_LEASE_SECONDS, Some(&secret)),
                )
            })
            .collect();
        futures::stream::iter(batch.iter())
            .map(|(_, lease)| {
                let leases = leases.clone();
                async move { leases.create(&PostParams::default(), lease).await }
            })
            .buffer_unordered(IN_FLIGHT)
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect::<Result<Vec<_>, _>>()?;
        for (lock, lease) in batch {
            claims.entry(lock).or_default().push(lease.name_any());
        }
        // The next claimant's claims must fall in a later second (FIFO's first key).
        tokio::time::sleep(Duration::from_millis(1001)).await;
    }
    Ok(Workload {
        namespace: ns.into(),
        claims,
        secret,
    })
}

struct LockRun {
    next: usize,
    last_token: i64,
}

/// What a lock's current holder says of the run.
enum Judged {
    /// A status from before the last release.
    Stale,
    /// A grant out of order: the lock would wait for ever on a release never sent.
    OutOfOrder,
    /// The next grant in order (its token checked and counted).
    Next,
}

impl LockRun {
    /// Judge `holder` of lock `name`, whose claims were made in `order`, recording
    /// grants and violations in `out`.
    fn judge(&mut self, name: &str, order: &[String], holder: &crate::api::Holder, out: &mut Outcome) -> Judged {
        if self.next >= order.len() || holder.claim != order[self.next] {
            if order[..self.next].contains(&holder.claim) {
                return Judged::Stale;
            }
            out.violations
                .push(format!("{name}: granted {} out of order", holder.claim));
            return Judged::OutOfOrder;
        }
        if holder.fencing_token <= self.last_token {
            out.violations.push(format!(
                "{name}: token {} after {}",
                holder.fencing_token, self.last_token
            ));
        }
        out.grants += 1;
        self.last_token = holder.fencing_token;
        self.next += 1;
        Judged::Next
    }
}

/// When each lock's last release was sent.
type Sent = Arc<std::sync::Mutex<HashMap<String, Instant>>>;

/// The releaser: sends the releases (lock, claim) it is given in order, each with the
/// claims' `secret`, paced when a rate is offered, [`IN_FLIGHT`] at most at once, noting
/// in `sent` when each went.
fn releaser(
    (leases, secret): (Api<Lease>, Secret),
    rate: Option<f64>,
    sent: Sent,
) -> (
    tokio::sync::mpsc::UnboundedSender<(String, String)>,
    tokio::task::JoinHandle<()>,
) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(String, String)>();
    let task = tokio::spawn(async move {
        let gate = Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT));
        let pace = rate.map(|r| Duration::from_secs_f64(1.0 / r));
        let mut next_at = tokio::time::Instant::now();
        while let Some((lock, claim)) = rx.recv().await {
            if let Some(p) = pace {
                tokio::time::sleep_until(next_at).await;
                next_at = next_at.max(tokio::time::Instant::now() - p) + p;
            }
            let permit = gate.clone().acquire_owned().await.expect("never closed");
            let leases = leases.clone();
            let patch = Patch::Merge(release_patch_with(&lock, &secret));
            sent.lock().expect("sent lock").insert(lock, Instant::now());
            tokio::spawn(async move {
                if let Err(e) = leases.patch(&claim, &PatchParams::default(), &patch).await {
                    tracing::warn!(claim, error = %e, "release failed");
                }
                drop(permit);
            });
        }
    });
    (tx, task)
}

/// Delete every lock in `ns` and wait until they are gone (a controller must run: it
/// removes their finalizer), then every claim left in `ns`.
pub async fn remove_locks(client: &Client, ns: &str) -> anyhow::Result<()> {
    let api: Api<DistributedLock> = Api::namespaced(client.clone(), ns);
    api.delete_collection(&Default::default(), &Default::default()).await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(300);
    let one = kube::api::ListParams::default().limit(1);
    while !api.list(&one).await?.items.is_empty() {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "the locks of {ns} were not let go within 300 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await; // a benchmark's wait, not a test's
    }
    // Claims released at the end and not swept yet: gone too, so the next run's
    // controller does not start with orphaned claims (each warned about once).
    let leases: Api<Lease> = Api::namespaced(client.clone(), ns);
    leases
        .delete_collection(&Default::default(), &Default::default())
        .await?;
    Ok(())
}

/// Release each grant as soon as the lock's status shows it (`rate`: at most that many
/// releases per second, from when every lock has had its first grant, so the paced
/// phase measures steady state, not the controller's start-up), until every claim was
/// granted or a grant came out of order; `deadline` bounds it all.
pub async fn drive(client: &Client, w: &Workload, rate: Option<f64>, deadline: Duration) -> anyhow::Result<Outcome> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), &w.namespace);
    let locks: Api<DistributedLock> = Api::namespaced(client.clone(), &w.namespace);
    let total: usize = w.claims.values().map(Vec::len).sum();
    let mut runs: HashMap<String, LockRun> = w
        .claims
        .keys()
        .map(|k| {
            let run = LockRun { next: 0, last_token: 0 };
            (k.clone(), run)
        })
        .collect();
    // When each lock's last release was sent.
    let sent: Sent = Arc::default();
    let (tx, releases) = releaser((leases, w.secret.clone()), rate, sent.clone());
    let mut out = Outcome::default();
    // With a rate: the first grants' releases, held until every lock has one.
    let mut held: Option<Vec<(String, String)>> = rate.map(|_| Vec::new());
    let mut events = watcher(locks, watcher::Config::default()).applied_objects().boxed();
    let mut listed = HashSet::new();
    let started = Instant::now();
    let end = tokio::time::Instant::now() + deadline;
    while out.grants < total {
        let lock = tokio::select! {
            ev = events.next() => match ev {
                Some(Ok(lock)) => lock,
                Some(Err(e)) => { tracing::warn!(error = %e, "lock watch"); continue }
                None => anyhow::bail!("the lock watch ended"),
            },
            _ = tokio::time::sleep_until(end) => anyhow::bail!("{} of {total} grants within {deadline:?}", out.grants),
        };
        let name = lock.name_any();
        let (Some(run), Some(order)) = (runs.get_mut(&name), w.claims.get(&name)) else {
            continue;
        };
        // Each lock's first event is the watch's listing of it, not a write.
        if !listed.insert(name.clone()) {
            out.statuses.0 += 1;
            out.statuses.1 += serde_json::to_vec(&lock.status).map_or(0, |v| v.len());
        }
        let Some(holder) = lock.status.as_ref().and_then(|s| s.holders.first()) else {
            continue;
        };
        match run.judge(&name, order, holder, &mut out) {
            Judged::Stale => continue,
            Judged::OutOfOrder => break,
            Judged::Next => {}
        }
        let seen = Instant::now();
        if let Some(at) = sent.lock().expect("sent lock").remove(&name) {
            out.handoffs.push(seen - at);
        }
        match held.as_mut() {
            Some(first) => {
                first.push((name, holder.claim.clone()));
                if first.len() == w.claims.len() {
                    out.warmup = Some(started.elapsed());
                    first.drain(..).for_each(|r| drop(tx.send(r)));
                    held = None;
                }
            }
            None => drop(tx.send((name, holder.claim.clone()))),
        }
    }
    out.elapsed = started.elapsed();
    drop(tx);
    let _ = releases.await;
    Ok(out)
}

/// Per lock: when each grant (with its token) and each release (`None`) happened.
type Marks = HashMap<String, Vec<(Instant, Option<i64>)>>;

/// The etcd backend's workload: `locks` etcd-backed locks (claims under a prefix of `ns`
/// on the etcd at `etcd`) and `claimants` in-process clients each, every one acquiring its
/// lock once and releasing at once. Grants are etcd's: checked per lock for strictly
/// increasing tokens (create revisions, so FIFO by creation), handoff = `release()`
/// called → the lock's next `acquire()` returned.
pub async fn drive_etcd(
    client: &Client,
    ns: &str,
    etcd: &str,
    locks: usize,
    claimants: usize,
    deadline: Duration,
) -> anyhow::Result<Outcome> {
    namespace(client, ns).await?;
    let ids = pods(client, ns, "c", claimants).await?;
    etcd_locks(client, ns, etcd, locks).await?;
    // Per lock, in the order they happened: grants (with their token) and releases.
    let marks: Arc<std::sync::Mutex<Marks>> = Arc::default();
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..locks {
        for id in &ids {
            let (client, marks, name) = (client.clone(), marks.clone(), format!("l{i}"));
            let lock = crate::client::Lock::builder(client, ns, &name)
                .identity(id.clone())
                .build()?;
            tasks.spawn(async move {
                let guard = lock.acquire().await?;
                let token = guard.fencing_token();
                marks
                    .lock()
                    .expect("marks")
                    .entry(name.clone())
                    .or_default()
                    .push((Instant::now(), Some(token)));
                marks
                    .lock()
                    .expect("marks")
                    .entry(name)
                    .or_default()
                    .push((Instant::now(), None));
                guard.release().await?;
                Ok::<_, anyhow::Error>(())
            });
        }
    }
    let all = async {
        while let Some(done) = tasks.join_next().await {
            done??;
        }
        Ok::<_, anyhow::Error>(())
    };
    tokio::time::timeout(deadline, all)
        .await
        .map_err(|_| anyhow::anyhow!("not every claimant held its lock within {deadline:?}"))??;
    let mut out = Outcome {
        elapsed: started.elapsed(),
        ..Default::default()
    };
    score(&marks.lock().expect("marks"), &mut out);
    Ok(out)
}

/// Create locks `l0`.. `l{locks - 1}` in `ns`, their claims under a prefix of `ns` on
/// the etcd at `etcd`.
async fn etcd_locks(client: &Client, ns: &str, etcd: &str, locks: usize) -> anyhow::Result<()> {
    use crate::api::{Backend, EtcdBackend};
    let lock_api: Api<DistributedLock> = Api::namespaced(client.clone(), ns);
    for i in 0..locks {
        let spec = DistributedLockSpec {
            lease_duration_seconds: 60,
            backend: Some(Backend {
                etcd: Some(EtcdBackend {
                    endpoints: vec![etcd.into()],
                    key_prefix: Some(format!("/leasehold-scale-{ns}")),
                    tls_secret_ref: None,
                }),
            }),
            ..Default::default()
        };
        lock_api
            .create(&PostParams::default(), &DistributedLock::new(&format!("l{i}"), spec))
            .await?;
    }
    Ok(())
}

/// Count grants, token regressions and handoffs (a release → the lock's next grant)
/// from each lock's `marks` into `out`.
fn score(marks: &Marks, out: &mut Outcome) {
    for (name, marks) in marks.iter() {
        let mut last_token = 0;
        let mut released: Option<Instant> = None;
        for (at, token) in marks {
            match token {
                Some(t) => {
                    out.grants += 1;
                    if *t <= last_token {
                        out.violations.push(format!("{name}: token {t} after {last_token}"));
                    }
                    last_token = *t;
                    if let Some(r) = released.take() {
                        out.handoffs.push(at.saturating_duration_since(r));
                    }
                }
                None => released = Some(*at),
            }
        }
    }
}
