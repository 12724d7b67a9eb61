//! What the client sees of its DistributedLock: watch events, backed by a fresh read
//! every so often, so that a watch stalled on a dead connection delays nothing for
//! longer than that period, whatever the transport (a lock client built by
//! [`crate::kubeconfig::watch_client_from`] finds a dead connection by HTTP/2 PINGs
//! within seconds).

use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt, watcher as watch_stream};
use tokio::time::{Interval, MissedTickBehavior};

use crate::api::DistributedLock;
use crate::protocol::timing::WATCH_TIMEOUT;

/// One observation of the lock.
#[derive(Debug)]
pub(crate) enum Seen {
    /// The lock as it stands.
    Lock(Box<DistributedLock>),
    /// The lock does not exist (deleted, or not yet created).
    Gone,
}

/// A watch on one DistributedLock with a periodic fresh read behind it.
pub(crate) struct LockWatch {
    api: Api<DistributedLock>,
    name: String,
    events: BoxStream<'static, Result<Event<DistributedLock>, watcher::Error>>,
    check: Interval,
    check_every: Duration,
    /// Whether the current (re)list showed the lock.
    listed: bool,
    /// The newest resourceVersion passed on, so an older observation is never
    /// passed on after a newer one (a fresh read can overtake buffered events).
    newest: u64,
}

impl LockWatch {
    /// Watch lock `name`, reading it afresh every `check_every`.
    pub fn start(api: Api<DistributedLock>, name: &str, check_every: Duration) -> Self {
        let fields = format!("metadata.name={name}");
        let timeout = u32::try_from(WATCH_TIMEOUT.as_secs()).unwrap_or(u32::MAX);
        let config = watcher::Config::default().fields(&fields).timeout(timeout);
        let events = crate::retry::relist_at_once(watch_stream(api.clone(), config))
            .backoff(crate::retry::WatchBackoff::client())
            .boxed();
        LockWatch {
            api,
            name: name.into(),
            events,
            check: every(check_every),
            check_every,
            listed: false,
            newest: 0,
        }
    }

    /// Read the lock afresh every `check_every` from now on.
    pub fn check_every(&mut self, check_every: Duration) {
        self.check = every(check_every);
        self.check_every = check_every;
    }

    /// The next observation; `None` once the watch has ended for good.
    pub async fn next(&mut self) -> Option<Seen> {
        loop {
            let seen = tokio::select! {
                ev = self.events.next() => match ev? {
                    Ok(Event::Apply(lock) | Event::InitApply(lock)) => {
                        self.listed = true;
                        Seen::Lock(Box::new(lock))
                    }
                    Ok(Event::Delete(_)) => Seen::Gone,
                    Ok(Event::Init) => {
                        self.listed = false;
                        continue;
                    }
                    Ok(Event::InitDone) if !self.listed => Seen::Gone,
                    Ok(Event::InitDone) => continue,
                    Err(e) => {
                        tracing::debug!(error = %e, "lock watch error; retrying");
                        continue;
                    }
                },
                _ = self.check.tick() => match tokio::time::timeout(self.check_every, self.api.get_opt(&self.name)).await {
                    Ok(Ok(Some(lock))) => Seen::Lock(Box::new(lock)),
                    Ok(Ok(None)) => Seen::Gone,
                    Err(_) => {
                        tracing::debug!("reading the lock timed out; retrying");
                        continue;
                    }
                    Ok(Err(e)) => {
                        tracing::debug!(error = %e, "reading the lock failed; retrying");
                        continue;
                    }
                },
            };
            if let Seen::Lock(lock) = &seen {
                match lock.resource_version().and_then(|v| v.parse::<u64>().ok()) {
                    Some(v) if v < self.newest => continue,
                    Some(v) => self.newest = v,
                    None => {}
                }
            }
            return Some(seen);
        }
    }
}

/// Ticks every `period`, the first a period from now.
fn every(period: Duration) -> Interval {
    let mut check = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    check.set_missed_tick_behavior(MissedTickBehavior::Delay);
    check
}
