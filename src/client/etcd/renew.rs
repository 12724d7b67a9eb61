//! Renewing an etcd claim: check that the claim key is still on the claim's lease (sent
//! first, so the renewal counts from before any move by the controller), then keep the
//! lease alive over a keep-alive stream.
//!
//! A keep-alive stream answers its requests in order, with nothing to tell which
//! request an answer is for. So the stream is taken out while an attempt is under way
//! and put back only once the attempt has its answer: an attempt dropped at its timeout
//! drops its stream with it, and a late answer to it can never pass for the next
//! attempt's (which would count a renewal from a request etcd may never have seen).

use std::future::Future;

use etcd_client::{Client, Compare, CompareOp, LeaseKeepAliveStream, LeaseKeeper, Txn};

use crate::client::session::{Renewal, Renewer};

/// What renewing asks of etcd: the real [`Etcd`], or a fake in tests.
pub(crate) trait LeaseLine: Send + 'static {
    /// A keep-alive stream of the claim's lease.
    type Stream: KeepAlive;
    /// Whether the claim key is still on the claim's lease.
    fn on_own_lease(&mut self) -> impl Future<Output = Result<bool, String>> + Send;
    /// Open a keep-alive stream for the claim's lease.
    fn open(&mut self) -> impl Future<Output = Result<Self::Stream, String>> + Send;
}

/// One keep-alive stream.
pub(crate) trait KeepAlive: Send + 'static {
    /// Send a keep-alive and read the stream's next answer: the lease's TTL (0: the
    /// lease is gone), or `None` when the stream ended.
    fn keep_alive(&mut self) -> impl Future<Output = Result<Option<i64>, String>> + Send;
}

/// Renews an etcd claim (see the module docs).
pub(crate) struct EtcdRenewer<L: LeaseLine> {
    line: L,
    stream: Option<L::Stream>,
}

impl<L: LeaseLine> EtcdRenewer<L> {
    /// A renewer over `line`; it opens its stream at the first renewal.
    pub(crate) fn new(line: L) -> Self {
        EtcdRenewer { line, stream: None }
    }
}

impl<L: LeaseLine> Renewer for EtcdRenewer<L> {
    async fn renew(&mut self) -> Renewal {
        match self.line.on_own_lease().await {
            Ok(true) => {}
            Ok(false) => return Renewal::Gone,
            Err(e) => return Renewal::Failed(e),
        }
        let mut stream = match self.stream.take() {
            Some(stream) => stream,
            None => match self.line.open().await {
                Ok(stream) => stream,
                Err(e) => return Renewal::Failed(e),
            },
        };
        match stream.keep_alive().await {
            Ok(Some(ttl)) if ttl > 0 => {
                self.stream = Some(stream);
                Renewal::Renewed
            }
            Ok(Some(_)) => Renewal::Gone,
            Ok(None) => Renewal::Failed("the keep-alive stream ended".into()),
            Err(e) => Renewal::Failed(e),
        }
    }
}

/// The real line: an etcd client, the claim key and its lease.
pub(crate) struct Etcd {
    pub(crate) client: Client,
    pub(crate) key: String,
    pub(crate) lease_id: i64,
}

impl LeaseLine for Etcd {
    type Stream = (LeaseKeeper, LeaseKeepAliveStream);

    async fn on_own_lease(&mut self) -> Result<bool, String> {
        let txn = on_own_lease(&self.key, self.lease_id);
        self.client
            .txn(txn)
            .await
            .map(|r| r.succeeded())
            .map_err(|e| e.to_string())
    }

    async fn open(&mut self) -> Result<Self::Stream, String> {
        self.client
            .lease_keep_alive(self.lease_id)
            .await
            .map_err(|e| e.to_string())
    }
}

impl KeepAlive for (LeaseKeeper, LeaseKeepAliveStream) {
    async fn keep_alive(&mut self) -> Result<Option<i64>, String> {
        self.0.keep_alive().await.map_err(|e| e.to_string())?;
        let answer = self.1.message().await.map_err(|e| e.to_string())?;
        Ok(answer.map(|r| r.ttl()))
    }
}

/// A transaction that succeeds only while `key` is on lease `lease_id`.
pub(crate) fn on_own_lease(key: &str, lease_id: i64) -> Txn {
    Txn::new().when([Compare::lease(key, CompareOp::Equal, lease_id)])
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use tokio::sync::mpsc;

    use super::*;

    /// A lease line whose streams answer only what the test sends them.
    #[derive(Clone, Default)]
    struct Fake {
        /// The senders of every stream opened, in order.
        streams: Arc<Mutex<Vec<mpsc::UnboundedSender<i64>>>>,
    }

    struct FakeStream(mpsc::UnboundedReceiver<i64>);

    impl LeaseLine for Fake {
        type Stream = FakeStream;

        async fn on_own_lease(&mut self) -> Result<bool, String> {
            Ok(true)
        }

        async fn open(&mut self) -> Result<FakeStream, String> {
            let (tx, rx) = mpsc::unbounded_channel();
            self.streams.lock().unwrap().push(tx);
            Ok(FakeStream(rx))
        }
    }

    impl KeepAlive for FakeStream {
        async fn keep_alive(&mut self) -> Result<Option<i64>, String> {
            Ok(self.0.recv().await)
        }
    }

    impl Fake {
        /// Answer on the `n`th stream opened (lost if that stream was dropped, as a
        /// late answer on the wire is once its stream is closed).
        fn answer(&self, n: usize, ttl: i64) {
            let _ = self.streams.lock().unwrap()[n].send(ttl);
        }

        fn opened(&self) -> usize {
            self.streams.lock().unwrap().len()
        }
    }

    const TIMEOUT: Duration = Duration::from_secs(2);

    #[tokio::test(start_paused = true)]
    async fn a_late_answer_to_a_timed_out_attempt_never_passes_for_the_next_attempt_s() {
        let fake = Fake::default();
        let mut renewer = EtcdRenewer::new(fake.clone());
        // The first attempt's answer comes after its timeout.
        assert!(tokio::time::timeout(TIMEOUT, renewer.renew()).await.is_err());
        fake.answer(0, 30);
        // The next attempt's own request is never answered: it must not take the late
        // answer (etcd's refresh for the earlier request) as its own.
        let next = tokio::time::timeout(TIMEOUT, renewer.renew()).await;
        assert!(
            !matches!(next, Ok(Renewal::Renewed)),
            "a renewal counted from a request etcd may never have seen"
        );
        assert_eq!(fake.opened(), 2, "the timed-out attempt's stream was dropped");
    }

    #[tokio::test(start_paused = true)]
    async fn an_answered_stream_is_kept_and_a_ttl_of_zero_is_the_lease_gone() {
        let fake = Fake::default();
        let mut renewer = EtcdRenewer::new(fake.clone());
        let renewing = tokio::spawn(async move {
            let first = renewer.renew().await;
            let second = renewer.renew().await;
            (first, second)
        });
        tokio::task::yield_now().await;
        fake.answer(0, 30);
        fake.answer(0, 0);
        let (first, second) = renewing.await.unwrap();
        assert!(matches!(first, Renewal::Renewed));
        assert!(matches!(second, Renewal::Gone));
        assert_eq!(fake.opened(), 1, "one stream serves attempts that get their answers");
    }
}
