//! Release notices taken over HTTP ([`crate::protocol::notice`]): a holder's release,
//! told straight to the controller.
//!
//! A notice is checked against the freshest status this controller knows (its own last
//! write, or its cache): the claim must be named there as a holder, and the secret must
//! open the release hash recorded for it. A valid one is remembered here until its
//! claim is deleted, and the lock is reconciled at once. While remembered, the decide
//! core sees the claim as carrying a valid release mark ([`Notices::noticed`]), and
//! nothing else changes: the notice frees the slot exactly as the mark would. The
//! answer waits (up to [`NOTICE_WAIT`]) for a status write that no longer names the
//! claim, so [`Answer::Written`] means the release is recorded in the lock's status.
//! Only the leader takes notices; a standby answers [`Answer::NotLeader`] and the
//! client marks its claim instead.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};
use tokio::sync::watch;

use crate::api::DistributedLock;
use crate::controller::cache::written::Written;
use crate::controller::k8s::successors::Told;
use crate::controller::prompt::Prompter;
use crate::protocol::RELEASED_ANNOTATION;
use crate::protocol::grant::WaitFor;
use crate::protocol::grant::WrittenRelease;
use crate::protocol::notice::{ACCEPTED, Notice, WRITTEN};
use crate::protocol::release::{notice_proves, opens};
use crate::protocol::timing::NOTICE_WAIT;

/// How long a notice is remembered at most when its claim's deletion is never seen
/// (a deletion the API server refuses); the claim's lock decided on it long before.
pub const NOTICE_MEMORY: Duration = Duration::from_secs(600);

/// How long a wait for a claim not (yet) designated in this replica's freshest status
/// is held for a status write that designates it.
pub const DESIGNATION_WAIT: Duration = Duration::from_secs(1);

/// What the controller answers a notice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// The lock's status no longer names the claim: the release is recorded.
    Written,
    /// Valid, but no status write dropped the claim within [`NOTICE_WAIT`].
    Accepted,
    /// This replica is not reconciling (a standby, or starting).
    NotLeader,
    /// The lock's status names no such holder (unknown lock or claim, or released).
    NotHeld,
    /// The secret does not open the hash recorded for the claim.
    Mismatch,
}

impl Answer {
    /// The HTTP status code and body of the answer.
    pub fn http(self) -> (u16, &'static str) {
        match self {
            Answer::Written => (
                WRITTEN,
                "written: the lock's status no longer names the claim, which is deleted\n",
            ),
            Answer::Accepted => (ACCEPTED, "accepted, not yet written: mark the claim released\n"),
            Answer::NotLeader => (503, "this replica is not the leader: mark the claim released\n"),
            Answer::NotHeld => (409, "the lock's status names no such holder\n"),
            Answer::Mismatch => (403, "the secret does not open the claim's release hash\n"),
        }
    }

    /// A short fixed string for metric labels.
    pub fn category(self) -> &'static str {
        match self {
            Answer::Written => "written",
            Answer::Accepted => "accepted",
            Answer::NotLeader => "not_leader",
            Answer::NotHeld => "not_held",
            Answer::Mismatch => "mismatch",
        }
    }
}

/// A lock's resourceVersion as a number (etcd's revision), 0 when it has none.
fn version(lock: &DistributedLock) -> u64 {
    lock.metadata
        .resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// What the leader lends the notices while it leads.
#[derive(Clone)]
struct Leader {
    locks: Store<DistributedLock>,
    written: Arc<Written>,
    prompter: Prompter,
}

impl Leader {
    /// The freshest status this controller knows of `lock`: its own last write, or its
    /// cache's.
    fn freshest(&self, lock: &ObjectRef<DistributedLock>) -> Option<DistributedLock> {
        self.locks.get(lock).map(|cached| self.written.peek(&cached))
    }
}

/// The valid notices, by (namespace, claim), with when each was taken and its secret.
pub struct Notices {
    /// How long an answer waits for the status write (see [`Notices::new`]).
    wait: Duration,
    leader: Mutex<Option<Leader>>,
    taken: Mutex<HashMap<(String, String), (Instant, String)>>,
    /// Counts the status writes of Lease-backed locks (and forgotten notices), so a
    /// waiting answer looks again after each.
    writes: watch::Sender<u64>,
    /// The successors waiting to be told of their grant.
    pub successors: crate::controller::k8s::successors::Successors,
}

// === impl Notices ===

impl Default for Notices {
    fn default() -> Self {
        Notices::new(NOTICE_WAIT)
    }
}

impl Notices {
    /// Notices whose answers wait up to `wait` for the status write that records the
    /// release ([`NOTICE_WAIT`] by default).
    pub fn new(wait: Duration) -> Self {
        Notices {
            wait,
            leader: Mutex::default(),
            taken: Mutex::default(),
            writes: watch::Sender::default(),
            successors: Default::default(),
        }
    }

    /// This replica leads: take notices, judged against `locks` and `written`, and
    /// reconcile their locks through `prompter`.
    pub fn lead(&self, locks: Store<DistributedLock>, written: Arc<Written>, prompter: Prompter) {
        self.taken.lock().expect("notices lock poisoned").clear();
        self.successors.lead();
        *self.leader.lock().expect("notices lock poisoned") = Some(Leader {
            locks,
            written,
            prompter,
        });
    }

    /// This replica stopped leading: refuse notices, and forget those taken (a later
    /// term of leadership starts from the API's state alone).
    pub fn step_down(&self) {
        *self.leader.lock().expect("notices lock poisoned") = None;
        self.taken.lock().expect("notices lock poisoned").clear();
        self.successors.step_down();
    }

    /// Judge a notice, and if it is valid, have its lock reconciled and wait (up to
    /// [`NOTICE_WAIT`], or the wait it was made with) for the status write that
    /// records the release. (The endpoint uses [`Notices::take_signed`].)
    #[cfg(test)]
    pub async fn take(&self, notice: &Notice) -> Answer {
        self.judge(notice).await.0
    }

    /// Judge a notice (a valid one has its lock reconciled and waits, up to the notice
    /// wait, for the status write that records the release), and for a written answer
    /// its signature by this replica's
    /// grant key ([`WrittenRelease`]), which the client checks before it skips its mark.
    pub async fn take_signed(&self, notice: &Notice) -> (Answer, Option<String>) {
        let (answer, lock_uid) = self.judge(notice).await;
        let signature = lock_uid.filter(|_| answer == Answer::Written).map(|lock_uid| {
            self.successors.sign_written(&WrittenRelease {
                namespace: &notice.namespace,
                lock: &notice.lock,
                lock_uid: &lock_uid,
                claim: &notice.claim,
            })
        });
        (answer, signature)
    }

    /// The answer to `notice`, with the UID of the lock it was judged against.
    async fn judge(&self, notice: &Notice) -> (Answer, Option<String>) {
        let lock = ObjectRef::<DistributedLock>::new(&notice.lock).within(&notice.namespace);
        let Some(leader) = self.leading() else {
            return (Answer::NotLeader, None);
        };
        let freshest = || leader.freshest(&lock);
        let Some(current) = freshest() else {
            return (Answer::NotHeld, None);
        };
        // Only a status newer than the one judged here can record the release: the
        // cache may lag this controller's writes, and then show an older one again.
        let judged = version(&current);
        let uid = current.metadata.uid.clone();
        let status = current.status.unwrap_or_default();
        let Some(holder) = status.holders.iter().find(|h| h.claim == notice.claim) else {
            return (Answer::NotHeld, uid);
        };
        if !notice_proves(&notice.secret, holder.release_hash.as_deref()) {
            return (Answer::Mismatch, uid);
        }
        let mut writes = self.writes.subscribe();
        self.remember(notice, Instant::now());
        leader.prompter.prompt(lock.clone());
        let deadline = tokio::time::Instant::now() + self.wait;
        loop {
            // Written: a newer status of the same lock no longer names the claim, and
            // the claim's deletion is seen (so no successor of this controller can take
            // the unmarked claim for a new one).
            let released = freshest().is_some_and(|l| {
                version(&l) > judged
                    && l.metadata.uid == uid
                    && !l
                        .status
                        .is_some_and(|s| crate::protocol::names_claim(&s, &notice.claim))
            });
            if released && self.noticed(&notice.namespace, &notice.claim).is_none() {
                return (Answer::Written, uid);
            }
            match tokio::time::timeout_at(deadline, writes.changed()).await {
                Ok(Ok(())) => continue,
                _ => return (Answer::Accepted, uid),
            }
        }
    }

    /// What the leader lent, while this replica leads.
    fn leading(&self) -> Option<Leader> {
        self.leader.lock().expect("notices lock poisoned").clone()
    }

    /// Whether `w` may wait for a direct grant here: this replica leads, the freshest
    /// status it knows designates the claim as its lock's successor, and the wait shows
    /// the proof whose hash the claim's queue entry records (a claim recorded without
    /// one is waited for by nobody: its name is public, so anyone could hold its waits;
    /// it is granted through the status alone). A claim not
    /// designated yet is looked at again after each status write, up to
    /// [`DESIGNATION_WAIT`] (the successor may ask as soon as it sees the write, before
    /// this replica has taken note of it).
    pub async fn may_wait(&self, w: &WaitFor) -> Result<(), Told> {
        let lock = ObjectRef::<DistributedLock>::new(&w.lock).within(&w.namespace);
        let Some(leader) = self.leading() else {
            return Err(Told::NotLeader);
        };
        let mut writes = self.writes.subscribe();
        let deadline = tokio::time::Instant::now() + DESIGNATION_WAIT;
        loop {
            let status = leader.freshest(&lock).and_then(|l| l.status).unwrap_or_default();
            let designated = status.successor.as_ref().is_some_and(|s| s.claim == w.claim);
            let entry = status.queue.iter().find(|q| q.claim == w.claim).filter(|_| designated);
            match entry.map(|q| q.wait_hash.as_deref()) {
                Some(None) => return Err(Told::NotYours),
                Some(Some(hash)) if w.proof.as_deref().is_some_and(|p| opens(hash, p)) => return Ok(()),
                Some(Some(_)) => return Err(Told::NotYours),
                None => {}
            }
            if !matches!(tokio::time::timeout_at(deadline, writes.changed()).await, Ok(Ok(()))) {
                return Err(Told::NotYours);
            }
        }
    }

    /// Remember a valid notice (forgetting any older than [`NOTICE_MEMORY`]).
    fn remember(&self, notice: &Notice, now: Instant) {
        let mut taken = self.taken.lock().expect("notices lock poisoned");
        taken.retain(|_, (at, _)| now.saturating_duration_since(*at) < NOTICE_MEMORY);
        let key = (notice.namespace.clone(), notice.claim.clone());
        taken.insert(key, (now, notice.secret.clone()));
    }

    /// When a valid notice of claim `ns`/`claim` was taken, if one was (and is not
    /// older than [`NOTICE_MEMORY`]).
    pub fn noticed(&self, ns: &str, claim: &str) -> Option<Instant> {
        let taken = self.taken.lock().expect("notices lock poisoned");
        let (at, _) = taken.get(&(ns.to_string(), claim.to_string()))?;
        (at.elapsed() < NOTICE_MEMORY).then_some(*at)
    }

    /// When a notice taken for claim `ns`/`claim` proves its release against
    /// `recorded`, the hash recorded for the claim *now*: then the claim counts as
    /// carrying a valid release mark. (Judged again at every use, so a notice never
    /// releases another claim that comes to bear the same name.)
    pub fn proves(&self, ns: &str, claim: &str, recorded: Option<&str>) -> Option<Instant> {
        let taken = self.taken.lock().expect("notices lock poisoned");
        let (at, secret) = taken.get(&(ns.to_string(), claim.to_string()))?;
        (at.elapsed() < NOTICE_MEMORY && notice_proves(secret, recorded)).then_some(*at)
    }

    /// `lease` as if its client had marked it released, when it has a notice: how a
    /// noticed claim deleted before its lock decided on it is remembered (see
    /// [`crate::controller::k8s::sweep::Tombstones`]).
    pub fn as_marked(&self, lease: &Lease) -> Option<Lease> {
        let ns = lease.namespace()?;
        let taken = self.taken.lock().expect("notices lock poisoned");
        let (_, secret) = taken.get(&(ns, lease.name_any()))?;
        if !notice_proves(secret, crate::protocol::release::claim_hash(lease).as_deref()) {
            return None; // another claim under the notice's claim's name
        }
        let mut marked = lease.clone();
        let annotations = marked.metadata.annotations.get_or_insert_default();
        annotations.insert(RELEASED_ANNOTATION.to_string(), secret.clone());
        Some(marked)
    }

    /// Claim `ns`/`claim` is gone: forget its notice (and let an answer waiting for
    /// the deletion look again).
    pub fn forget(&self, ns: &str, claim: &str) {
        let mut taken = self.taken.lock().expect("notices lock poisoned");
        if taken.remove(&(ns.to_string(), claim.to_string())).is_some() {
            self.wrote();
        }
    }

    /// A status was written: answers waiting for one look again.
    pub fn wrote(&self) {
        self.writes.send_modify(|n| *n = n.wrapping_add(1));
    }
}

#[cfg(test)]
mod tests {
    use kube::runtime::reflector;
    use kube::runtime::watcher::Event;

    use super::*;
    use crate::api::{DistributedLockSpec, DistributedLockStatus, Holder};
    use crate::protocol::release::Secret;

    fn lock_held_by(claim: &str, hash: Option<String>) -> DistributedLock {
        let mut lock = DistributedLock::new("l", DistributedLockSpec::default());
        lock.metadata.namespace = Some("ns".into());
        lock.metadata.resource_version = Some("1".into());
        let holder: Holder = serde_json::from_value(serde_json::json!({
            "claim": claim, "pod": "p", "podUID": "u", "fencingToken": 7,
            "grantedAt": "2026-01-01T00:00:00Z", "releaseHash": hash,
        }))
        .unwrap();
        lock.status = Some(DistributedLockStatus {
            holders: vec![holder],
            ..Default::default()
        });
        lock
    }

    /// Notices a leader lent its caches to: with the lock cache's writer, this
    /// controller's record of its writes, and the prompts the notices make.
    struct Led {
        notices: Arc<Notices>,
        cache: reflector::store::Writer<DistributedLock>,
        written: Arc<Written>,
        prompts: tokio::sync::mpsc::UnboundedReceiver<ObjectRef<DistributedLock>>,
    }

    /// Notices led with `lock` cached.
    fn leading(lock: DistributedLock) -> Led {
        let (store, mut cache) = reflector::store::<DistributedLock>();
        cache.apply_watcher_event(&Event::Apply(lock));
        let (prompter, prompts) = Prompter::new();
        let (notices, written) = (Arc::new(Notices::default()), Arc::new(Written::default()));
        notices.lead(store, written.clone(), prompter);
        Led {
            notices,
            cache,
            written,
            prompts,
        }
    }

    impl Led {
        /// Take `notice` in a task of its own, which has begun waiting when this returns.
        async fn answer(&self, notice: Notice) -> tokio::task::JoinHandle<Answer> {
            let n = self.notices.clone();
            let answer = tokio::spawn(async move { n.take(&notice).await });
            tokio::task::yield_now().await;
            answer
        }
    }

    fn pod() -> crate::protocol::PodIdentity {
        crate::protocol::PodIdentity {
            name: "p".into(),
            namespace: "ns".into(),
            uid: "u".into(),
        }
    }

    fn notice(claim: &str, secret: &str) -> Notice {
        Notice {
            namespace: "ns".into(),
            lock: "l".into(),
            claim: claim.into(),
            secret: secret.into(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_notice_that_does_not_prove_the_release_changes_nothing() {
        let secret = Secret::generate();
        let Led {
            notices, mut prompts, ..
        } = leading(lock_held_by("c-1", Some(secret.hash())));
        let forged = notice("c-1", Secret::generate().reveal());
        assert_eq!(notices.take(&forged).await, Answer::Mismatch);
        assert_eq!(notices.take(&notice("c-1", &secret.hash())).await, Answer::Mismatch);
        assert_eq!(notices.take(&notice("c-2", secret.reveal())).await, Answer::NotHeld);
        let mut other_lock = notice("c-1", secret.reveal());
        other_lock.lock = "m".into();
        assert_eq!(notices.take(&other_lock).await, Answer::NotHeld);
        assert_eq!(notices.noticed("ns", "c-1"), None, "nothing remembered");
        assert!(prompts.try_recv().is_err(), "no reconcile prompted");
    }

    /// Lock `l` held by `c-1`, with `c-2` queued and designated as its successor,
    /// recorded with `wait_hash`.
    fn lock_designating(wait_hash: Option<String>) -> DistributedLock {
        let mut lock = lock_held_by("c-1", None);
        let status = lock.status.as_mut().unwrap();
        status.queue = vec![
            serde_json::from_value(serde_json::json!({
                "claim": "c-2", "pod": "q", "podUID": "v", "requestedAt": "2026-01-01T00:00:00Z",
                "waitHash": wait_hash,
            }))
            .unwrap(),
        ];
        status.successor =
            Some(serde_json::from_value(serde_json::json!({"claim": "c-2", "fencingToken": 8})).unwrap());
        lock
    }

    fn wait_for(claim: &str, proof: Option<String>) -> WaitFor {
        WaitFor {
            namespace: "ns".into(),
            lock: "l".into(),
            claim: claim.into(),
            proof,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn only_the_designated_claims_owner_may_wait_for_its_grant() {
        let secret = Secret::generate();
        let notices = leading(lock_designating(Some(secret.wait_hash()))).notices;
        let owner = wait_for("c-2", Some(secret.wait_proof()));
        assert_eq!(notices.may_wait(&owner).await, Ok(()));
        // Its claim name is public; its proof is not.
        assert_eq!(notices.may_wait(&wait_for("c-2", None)).await, Err(Told::NotYours));
        let guessed = wait_for("c-2", Some(Secret::generate().wait_proof()));
        assert_eq!(notices.may_wait(&guessed).await, Err(Told::NotYours));
        let hash_shown = wait_for("c-2", Some(secret.wait_hash()));
        assert_eq!(notices.may_wait(&hash_shown).await, Err(Told::NotYours));
        // A claim not designated (the holder's, or unknown) is refused once no status
        // write designates it within the wait.
        let started = tokio::time::Instant::now();
        assert_eq!(notices.may_wait(&wait_for("c-1", None)).await, Err(Told::NotYours));
        assert_eq!(started.elapsed(), DESIGNATION_WAIT);
        // Issue #41: a claim recorded without a wait hash (stripped before the record)
        // was waited for by anyone who asked; now by no one.
        let notices = leading(lock_designating(None)).notices;
        assert_eq!(notices.may_wait(&wait_for("c-2", None)).await, Err(Told::NotYours));
        // A standby takes no wait.
        notices.step_down();
        assert_eq!(notices.may_wait(&owner).await, Err(Told::NotLeader));
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_that_came_before_the_designation_was_noted_is_taken_once_it_is() {
        let secret = Secret::generate();
        let cached = lock_held_by("c-1", None);
        let led = leading(cached.clone());
        let n = led.notices.clone();
        let owner = wait_for("c-2", Some(secret.wait_proof()));
        let waiting = tokio::spawn(async move { n.may_wait(&owner).await });
        tokio::task::yield_now().await;
        let mut designating = lock_designating(Some(secret.wait_hash()));
        designating.metadata.resource_version = Some("2".into());
        led.written.record(Some("1".into()), designating);
        led.notices.wrote();
        assert_eq!(waiting.await.unwrap(), Ok(()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_holder_without_a_release_hash_cannot_be_released_by_notice() {
        let notices = leading(lock_held_by("c-1", None)).notices;
        assert_eq!(notices.take(&notice("c-1", "true")).await, Answer::Mismatch);
    }

    #[tokio::test(start_paused = true)]
    async fn a_valid_notice_is_remembered_prompts_its_lock_and_is_accepted_until_a_write_drops_the_claim() {
        let secret = Secret::generate();
        let Led {
            notices, mut prompts, ..
        } = leading(lock_held_by("c-1", Some(secret.hash())));
        assert_eq!(notices.take(&notice("c-1", secret.reveal())).await, Answer::Accepted);
        assert!(notices.noticed("ns", "c-1").is_some());
        assert_eq!(prompts.try_recv().unwrap(), ObjectRef::new("l").within("ns"));
        let claim = |s: &Secret| {
            let mut c = crate::protocol::claim::claim_lease_with("c-1", "l", &pod(), 15, Some(s));
            c.metadata.namespace = Some("ns".into());
            c
        };
        let marked = notices.as_marked(&claim(&secret)).expect("noticed");
        let judged = crate::protocol::release::judge(&marked, Some(&secret.hash()));
        assert_eq!(
            judged,
            crate::protocol::release::Mark::Valid,
            "remembered as released by its owner"
        );
        // Another claim under the same name (another secret) is not released by it.
        let other = Secret::generate();
        assert!(notices.as_marked(&claim(&other)).is_none());
        assert!(notices.proves("ns", "c-1", Some(&other.hash())).is_none());
        assert!(notices.proves("ns", "c-1", Some(&secret.hash())).is_some());
        notices.forget("ns", "c-1");
        assert_eq!(notices.noticed("ns", "c-1"), None);
    }

    #[tokio::test(start_paused = true)]
    async fn the_answer_is_written_once_this_controllers_status_write_drops_the_claim() {
        let secret = Secret::generate();
        let cached = lock_held_by("c-1", Some(secret.hash()));
        let led = leading(cached.clone());
        let answer = led.answer(notice("c-1", secret.reveal())).await;
        let (notices, written) = (&led.notices, &led.written);
        let mut released = cached.clone();
        released.metadata.resource_version = Some("2".into());
        released.status = Some(DistributedLockStatus::default());
        written.record(Some("1".into()), released);
        notices.wrote();
        tokio::task::yield_now().await;
        assert!(!answer.is_finished(), "not before the claim's deletion is seen");
        notices.forget("ns", "c-1");
        assert_eq!(answer.await.unwrap(), Answer::Written);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lock_re_created_under_the_same_name_records_no_release() {
        let secret = Secret::generate();
        let mut cached = lock_held_by("c-1", Some(secret.hash()));
        cached.metadata.uid = Some("uid-old".into());
        let mut led = leading(cached);
        let answer = led.answer(notice("c-1", secret.reveal())).await;
        // The lock is deleted and created again: newer, holding nothing, another UID.
        let mut again = DistributedLock::new("l", DistributedLockSpec::default());
        again.metadata.namespace = Some("ns".into());
        again.metadata.resource_version = Some("9".into());
        again.metadata.uid = Some("uid-new".into());
        led.cache.apply_watcher_event(&Event::Apply(again));
        led.notices.forget("ns", "c-1");
        assert_eq!(
            answer.await.unwrap(),
            Answer::Accepted,
            "not written: the client marks its claim"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_older_status_shown_again_by_a_lagging_cache_records_no_release() {
        let secret = Secret::generate();
        // The cache still shows version 1, from before the claim was granted; this
        // controller's own write (version 2) granted it.
        let mut before = lock_held_by("c-0", None);
        before.status = Some(DistributedLockStatus::default());
        let led = leading(before);
        let mut granted = lock_held_by("c-1", Some(secret.hash()));
        granted.metadata.resource_version = Some("2".into());
        led.written.record(Some("1".into()), granted.clone());
        let answer = led.answer(notice("c-1", secret.reveal())).await;
        // Another write (version 3, still naming c-1) replaces version 2, which the
        // cache never showed: the freshest view falls back to the cache's version 1,
        // which does not name c-1 and is older than what the notice was judged by.
        let mut again = granted.clone();
        again.metadata.resource_version = Some("3".into());
        led.written.record(Some("2".into()), again);
        led.notices.wrote();
        assert_eq!(
            answer.await.unwrap(),
            Answer::Accepted,
            "not written: the client marks its claim"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_standby_takes_no_notice() {
        let secret = Secret::generate();
        let notices = leading(lock_held_by("c-1", Some(secret.hash()))).notices;
        assert_eq!(notices.take(&notice("c-1", secret.reveal())).await, Answer::Accepted);
        assert!(notices.noticed("ns", "c-1").is_some());
        notices.step_down();
        assert_eq!(
            notices.noticed("ns", "c-1"),
            None,
            "a new term starts from the API alone"
        );
        assert_eq!(notices.take(&notice("c-1", secret.reveal())).await, Answer::NotLeader);
        assert_eq!(notices.noticed("ns", "c-1"), None);
    }
}
