//! Direct grants ([`crate::protocol::grant`]): designated successors wait here, over
//! HTTP, to be told of their grant before the status write that records it.
//!
//! Only the leader tells anyone anything: a standby (or a replica between terms)
//! refuses, and stepping down answers every waiting successor with a refusal, so a
//! successor never waits on a replica that will not grant. A wait is answered after
//! [`WAIT_LIMIT`] at the latest, so an abandoned one is not kept for ever. Only the
//! designated claim's owner may wait (checked by [`crate::controller::k8s::notices::Notices::may_wait`]
//! before a wait is taken), so nobody else can hold its waits or fill this replica's.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::oneshot;

use crate::protocol::grant::{Grant, GrantKey, WaitFor};

/// The longest a wait is held open before it is answered [`Told::NotYet`] (the
/// successor asks again).
pub const WAIT_LIMIT: Duration = Duration::from_secs(60);

/// The most waits one claim may hold open at once (its client holds one; a retry may
/// overlap the wait it replaces): more are answered [`Told::Busy`].
pub const MAX_WAITS_PER_CLAIM: usize = 2;

/// The most claims that may wait at once on one replica, so that requests from a
/// misbehaving pod cannot grow its memory without bound: more are answered
/// [`Told::Busy`].
pub const MAX_WAITING_CLAIMS: usize = 4096;

/// What a waiting successor is told.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Told {
    /// Granted with this fencing token; the grant's signature (hex).
    Granted(i64, String),
    /// Nothing within [`WAIT_LIMIT`]: ask again.
    NotYet,
    /// This replica does not lead (or stopped leading): wait for the lock's status.
    NotLeader,
    /// Too many waits are open (for this claim, or on this replica): wait for the
    /// lock's status.
    Busy,
    /// The lock's status does not designate the claim, or the wait does not show the
    /// proof whose hash the claim's queue entry records: only the designated claim's
    /// owner may wait (its claim name is public; its proof is not).
    NotYours,
}

/// Waits by (namespace, lock, claim).
type Waiting = HashMap<(String, String, String), Vec<oneshot::Sender<Told>>>;

/// The successors waiting while this replica leads.
#[derive(Default)]
pub struct Successors {
    key: GrantKey,
    /// `None` while this replica does not lead.
    waiting: Mutex<Option<Waiting>>,
}

// === impl Successors ===

impl Successors {
    /// The public half of this replica's signing key, for the statuses it writes.
    pub fn public_key(&self) -> String {
        self.key.public()
    }

    /// Sign `grant` with this replica's key (the key its statuses publish).
    pub fn sign(&self, grant: &Grant<'_>) -> String {
        self.key.sign(grant)
    }

    /// The signature of a written release answer, by this replica's key.
    pub fn sign_written(&self, written: &crate::protocol::grant::WrittenRelease<'_>) -> String {
        self.key.sign_written(written)
    }

    /// This replica leads: take waits.
    pub fn lead(&self) {
        let mut waiting = self.waiting.lock().expect("successors lock poisoned");
        waiting.get_or_insert_with(HashMap::new);
    }

    /// This replica stopped leading: refuse waits, and answer those waiting.
    pub fn step_down(&self) {
        let waiting = self.waiting.lock().expect("successors lock poisoned").take();
        for tx in waiting.into_iter().flat_map(HashMap::into_values).flatten() {
            let _ = tx.send(Told::NotLeader);
        }
    }

    /// Wait (up to [`WAIT_LIMIT`]) to be told of the grant of `w.claim`.
    pub async fn wait(&self, w: &WaitFor) -> Told {
        let rx = {
            let mut waiting = self.waiting.lock().expect("successors lock poisoned");
            let Some(waiting) = waiting.as_mut() else {
                return Told::NotLeader;
            };
            let key = (w.namespace.clone(), w.lock.clone(), w.claim.clone());
            let open = |txs: &mut Vec<oneshot::Sender<Told>>| {
                txs.retain(|tx| !tx.is_closed());
                !txs.is_empty()
            };
            if !waiting.contains_key(&key) && waiting.len() >= MAX_WAITING_CLAIMS {
                waiting.retain(|_, txs| open(txs)); // only when full: amortised
                if waiting.len() >= MAX_WAITING_CLAIMS {
                    return Told::Busy;
                }
            }
            let txs = waiting.entry(key).or_default();
            open(txs);
            if txs.len() >= MAX_WAITS_PER_CLAIM {
                return Told::Busy;
            }
            let (tx, rx) = oneshot::channel();
            txs.push(tx);
            rx
        };
        match tokio::time::timeout(WAIT_LIMIT, rx).await {
            Ok(Ok(told)) => told,
            Ok(Err(_)) => Told::NotLeader,
            Err(_) => Told::NotYet,
        }
    }

    /// Tell the successor of `grant`, if it waits here (signed with this replica's
    /// key). Whether anyone was told.
    pub fn grant(&self, grant: &Grant<'_>) -> bool {
        let key = (grant.namespace.into(), grant.lock.into(), grant.claim.into());
        let txs = {
            let mut waiting = self.waiting.lock().expect("successors lock poisoned");
            let Some(waiting) = waiting.as_mut() else {
                return false;
            };
            waiting.remove(&key).unwrap_or_default()
        };
        if txs.is_empty() {
            return false;
        }
        let told = Told::Granted(grant.fencing_token, self.key.sign(grant));
        let sent = txs.into_iter().map(|tx| tx.send(told.clone()).is_ok());
        sent.filter(|ok| *ok).count() > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Successors {
        /// How many claims have a wait open.
        fn claims_waiting(&self) -> usize {
            let waiting = self.waiting.lock().unwrap();
            waiting
                .iter()
                .flatten()
                .filter(|(_, txs)| txs.iter().any(|tx| !tx.is_closed()))
                .count()
        }
    }

    /// Let spawned waits run until `n` claims wait.
    async fn until_waiting(s: &Successors, n: usize) {
        while s.claims_waiting() < n {
            tokio::task::yield_now().await;
        }
    }

    fn wait_for(claim: &str) -> WaitFor {
        WaitFor {
            namespace: "ns".into(),
            lock: "l".into(),
            claim: claim.into(),
            proof: None,
        }
    }

    fn grant(claim: &str) -> Grant<'_> {
        Grant {
            namespace: "ns",
            lock: "l",
            lock_uid: "u",
            claim,
            fencing_token: 9,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiting_successor_is_told_its_grant_signed_by_the_published_key() {
        let s = std::sync::Arc::new(Successors::default());
        s.lead();
        let (s2, s3) = (s.clone(), s.clone());
        let waiting = tokio::spawn(async move { s2.wait(&wait_for("c-1")).await });
        let other = tokio::spawn(async move { s3.wait(&wait_for("c-2")).await });
        tokio::task::yield_now().await;
        assert!(!s.grant(&grant("c-3")), "nobody waits for c-3");
        assert!(s.grant(&grant("c-1")));
        let Told::Granted(token, signature) = waiting.await.unwrap() else {
            panic!("not granted");
        };
        assert_eq!(token, 9);
        assert!(grant("c-1").verify(&s.public_key(), &signature));
        assert!(!other.is_finished(), "another claim's wait is not answered");
        assert!(!s.grant(&grant("c-1")), "told once");
        s.step_down();
        assert_eq!(other.await.unwrap(), Told::NotLeader, "a replica stepping down answers");
    }

    #[tokio::test(start_paused = true)]
    async fn a_standby_refuses_and_a_wait_is_answered_within_its_limit() {
        let s = Successors::default();
        assert_eq!(s.wait(&wait_for("c-1")).await, Told::NotLeader);
        assert!(!s.grant(&grant("c-1")), "a standby tells no one");
        s.lead();
        let started = tokio::time::Instant::now();
        assert_eq!(s.wait(&wait_for("c-1")).await, Told::NotYet);
        assert_eq!(started.elapsed(), WAIT_LIMIT);
        assert!(!s.grant(&grant("c-1")), "the abandoned wait is gone");
    }

    #[tokio::test(start_paused = true)]
    async fn waits_are_capped_per_claim_and_per_replica() {
        let s = std::sync::Arc::new(Successors::default());
        s.lead();
        let mut open = Vec::new();
        for _ in 0..MAX_WAITS_PER_CLAIM {
            let s = s.clone();
            open.push(tokio::spawn(async move { s.wait(&wait_for("c-1")).await }));
        }
        tokio::task::yield_now().await;
        assert_eq!(
            s.wait(&wait_for("c-1")).await,
            Told::Busy,
            "one claim's waits are capped"
        );
        // An abandoned wait makes room for another.
        open.pop().unwrap().abort();
        tokio::task::yield_now().await;
        let again = {
            let s = s.clone();
            tokio::spawn(async move { s.wait(&wait_for("c-1")).await })
        };
        tokio::task::yield_now().await;
        assert!(!again.is_finished(), "taken after an abandoned one closed");
        for i in 0..MAX_WAITING_CLAIMS - 1 {
            let s = s.clone();
            open.push(tokio::spawn(async move { s.wait(&wait_for(&format!("x-{i}"))).await }));
        }
        until_waiting(&s, MAX_WAITING_CLAIMS).await;
        assert_eq!(
            s.wait(&wait_for("y")).await,
            Told::Busy,
            "the replica's waits are capped"
        );
        assert!(s.grant(&grant("c-1")), "those waiting are still told");
        assert!(matches!(again.await.unwrap(), Told::Granted(9, _)));
    }
}
