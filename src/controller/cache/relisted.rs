//! A map kept from a watch's events that survives relists: events of a relist build a
//! fresh map, swapped in when the relist is done (objects deleted while the watch was
//! down get no delete event). Readers see the previous map until then.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use kube::runtime::watcher::Event;

/// `M` kept from the events of a watch on `K`.
#[derive(Default)]
pub struct Relisted<M> {
    live: Mutex<M>,
    relist: Mutex<Option<M>>,
    synced: AtomicBool,
}

impl<M: Default> Relisted<M> {
    /// Take in one event: `insert` an applied object, `remove` a deleted one.
    pub fn apply<K>(&self, event: &Event<K>, insert: impl Fn(&mut M, &K), remove: impl Fn(&mut M, &K)) {
        match event {
            Event::Apply(k) => insert(&mut self.live.lock().expect("index lock poisoned"), k),
            Event::Delete(k) => remove(&mut self.live.lock().expect("index lock poisoned"), k),
            Event::Init => *self.relist.lock().expect("index lock poisoned") = Some(M::default()),
            Event::InitApply(k) => {
                if let Some(m) = self.relist.lock().expect("index lock poisoned").as_mut() {
                    insert(m, k);
                }
            }
            Event::InitDone => {
                if let Some(m) = self.relist.lock().expect("index lock poisoned").take() {
                    *self.live.lock().expect("index lock poisoned") = m;
                }
                self.synced.store(true, Ordering::Release);
            }
        }
    }

    /// Read the live map.
    pub fn read<R>(&self, f: impl FnOnce(&M) -> R) -> R {
        f(&self.live.lock().expect("index lock poisoned"))
    }

    /// Whether a first list has been taken in.
    pub fn synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }
}
