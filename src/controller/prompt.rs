//! Reconciling a lock at once on news that can free one of its slots: a claim marked
//! released, a claim deleted while its lock's status names it, a pod deleted.
//!
//! kube-runtime's scheduler runs a triggered reconcile when its delay queue next ticks:
//! it counts in whole milliseconds, rounded up, so a trigger waits 1.6 ms (median, the
//! handoff benchmark's controller path) before its reconcile starts — a fifth of the
//! controller's part of a graceful handoff. A prompt runs the same reconcile straight
//! away, beside that path; the scheduled reconcile still follows, finds the status
//! written and writes nothing, and keeps the requeue and error handling it always had.
//! Reconciles of one lock take turns ([`Turns`]), whichever path started them. Prompts
//! run only while fewer than [`MAX_PROMPTS`] are running: under load the scheduler's
//! tick is lost in the queueing, and the API server's write throughput is the limit.

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use kube::runtime::reflector::{ObjectRef, Store};
use tokio::sync::{Mutex, OwnedSemaphorePermit, Semaphore, mpsc};

use super::context::Context;
use crate::api::DistributedLock;

/// How many stripes [`Turns`] has: locks sharing one take turns needlessly, which at
/// the reconciler's concurrency (32) is rare.
pub const STRIPES: usize = 1024;
/// How many prompted reconciles run at once at most; beyond, the scheduled one serves.
pub const MAX_PROMPTS: usize = 8;

/// The turns of reconciles of one lock: a reconcile holds its lock's for its whole run.
pub struct Turns(Box<[Mutex<()>]>);

impl Default for Turns {
    fn default() -> Self {
        Turns((0..STRIPES).map(|_| Mutex::new(())).collect())
    }
}

impl Turns {
    /// The mutex whose holder may reconcile `lock`.
    pub fn of(&self, lock: &ObjectRef<DistributedLock>) -> &Mutex<()> {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (&lock.namespace, &lock.name).hash(&mut h);
        &self.0[(h.finish() % self.0.len() as u64) as usize]
    }
}

/// Asks for locks to be reconciled at once (see the module doc).
#[derive(Clone)]
pub struct Prompter(mpsc::UnboundedSender<ObjectRef<DistributedLock>>);

impl Prompter {
    /// A prompter whose prompts go nowhere until [`Prompter::serve`] takes them.
    pub fn new() -> (Self, mpsc::UnboundedReceiver<ObjectRef<DistributedLock>>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Prompter(tx), rx)
    }

    /// Reconcile `lock` at once, if a prompt is free.
    pub fn prompt(&self, lock: ObjectRef<DistributedLock>) {
        let _ = self.0.send(lock); // the controller is stopping
    }

    /// Run the prompted reconciles of the locks `store` holds, until the senders go.
    pub async fn serve(
        mut prompts: mpsc::UnboundedReceiver<ObjectRef<DistributedLock>>,
        store: Store<DistributedLock>,
        ctx: Arc<Context>,
    ) {
        let free = Arc::new(Semaphore::new(MAX_PROMPTS));
        while let Some(lock) = prompts.recv().await {
            let (Some(obj), Ok(permit)) = (store.get(&lock), free.clone().try_acquire_owned()) else {
                continue; // not cached (the scheduled reconcile waits for it too), or busy
            };
            tokio::spawn(prompted(obj, ctx.clone(), permit));
        }
    }
}

async fn prompted(lock: Arc<DistributedLock>, ctx: Arc<Context>, _permit: OwnedSemaphorePermit) {
    // Errors and requeues are the scheduled reconcile's, which follows.
    if let Err(e) = super::reconcile::reconcile(lock, ctx).await {
        tracing::debug!(error = %e, "prompted reconcile failed; the scheduled one follows");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_lock_always_has_the_same_turn_and_others_mostly_another() {
        let turns = Turns::default();
        let r = |ns: &str, name: &str| ObjectRef::<DistributedLock>::new(name).within(ns);
        assert!(std::ptr::eq(turns.of(&r("a", "x")), turns.of(&r("a", "x"))));
        let distinct = (0..64)
            .map(|i| turns.of(&r("ns", &format!("lock-{i}"))) as *const _)
            .collect::<std::collections::HashSet<_>>();
        assert!(distinct.len() >= 60, "64 locks share {} turns", distinct.len());
    }
}
