//! Reconciling a lock at once on news that can free one of its slots: a claim marked
//! released, a release notice ([`crate::controller::k8s::notices`]), a claim deleted while its lock's
//! status names it, a pod deleted.
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
//! A prompt that finds them all busy goes to the scheduler instead, never nowhere: a
//! release notice has no API event behind it that would trigger the lock otherwise.

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use kube::runtime::reflector::{ObjectRef, Store};
use tokio::sync::{Mutex, OwnedSemaphorePermit, Semaphore, mpsc};

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
    /// A prompter whose prompts go nowhere until [`serve`](super::reconcile::serve_prompts)
    /// takes them.
    pub fn new() -> (Self, mpsc::UnboundedReceiver<ObjectRef<DistributedLock>>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Prompter(tx), rx)
    }

    /// Reconcile `lock` at once, if a prompt is free.
    pub fn prompt(&self, lock: ObjectRef<DistributedLock>) {
        let _ = self.0.send(lock); // the controller is stopping
    }
}

/// Route each prompt of a cached lock: to `run` with a permit while one of
/// [`MAX_PROMPTS`] is free, else to `scheduled`. (A lock not cached is left to the
/// scheduled reconcile, which waits for it too.)
pub(crate) async fn route(
    mut prompts: mpsc::UnboundedReceiver<ObjectRef<DistributedLock>>,
    store: Store<DistributedLock>,
    scheduled: mpsc::UnboundedSender<ObjectRef<DistributedLock>>,
    mut run: impl FnMut(Arc<DistributedLock>, OwnedSemaphorePermit),
) {
    let free = Arc::new(Semaphore::new(MAX_PROMPTS));
    while let Some(lock) = prompts.recv().await {
        let Some(obj) = store.get(&lock) else { continue };
        match free.clone().try_acquire_owned() {
            Ok(permit) => run(obj, permit),
            Err(_) => {
                let _ = scheduled.send(lock); // the controller is stopping
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use kube::ResourceExt;

    use super::*;

    #[tokio::test]
    async fn a_prompt_that_finds_every_slot_busy_goes_to_the_scheduler() {
        use kube::runtime::reflector;
        let lock = |name: &str| {
            let mut l = DistributedLock::new(name, crate::api::DistributedLockSpec::default());
            l.metadata.namespace = Some("ns".into());
            l
        };
        let (store, mut cache) = reflector::store::<DistributedLock>();
        for i in 0..=MAX_PROMPTS {
            cache.apply_watcher_event(&kube::runtime::watcher::Event::Apply(lock(&format!("l{i}"))));
        }
        let (prompter, prompts) = Prompter::new();
        let (scheduled_tx, mut scheduled) = mpsc::unbounded_channel();
        // Every prompted reconcile runs on: its permit is kept.
        let running = Arc::new(std::sync::Mutex::new(Vec::new()));
        let held = running.clone();
        let router = tokio::spawn(route(prompts, store, scheduled_tx, move |l, permit| {
            held.lock().unwrap().push((l.name_any(), permit));
        }));
        for i in 0..=MAX_PROMPTS {
            prompter.prompt(ObjectRef::new(&format!("l{i}")).within("ns"));
        }
        prompter.prompt(ObjectRef::new("not-cached").within("ns"));
        drop(prompter);
        router.await.unwrap();
        assert_eq!(
            running.lock().unwrap().len(),
            MAX_PROMPTS,
            "as many run at once as there are slots"
        );
        let overflow = ObjectRef::new(&format!("l{MAX_PROMPTS}")).within("ns");
        assert_eq!(
            scheduled.try_recv().unwrap(),
            overflow,
            "the one beyond goes to the scheduler"
        );
        assert!(
            scheduled.try_recv().is_err(),
            "a lock not cached is the scheduler's already"
        );
    }

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
