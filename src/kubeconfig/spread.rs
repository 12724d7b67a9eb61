//! HTTP/2 connections to one API server, as many as the streams in use need.
//!
//! One HTTP/2 connection carries at most as many streams at once as the server allows
//! (the API server here: 250), and a watch is a stream for as long as it runs. hyper's
//! pool keeps one connection per server and queues a request past that limit until a
//! stream ends: a process watching 300 locks through one client would wait for ever on
//! the 251st. [`Spread`] sends each request on the first connection with fewer than
//! [`STREAMS_PER_CONNECTION`] streams in use and opens another when every one is full.

use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use hyper::body::{Body, Frame, Incoming, SizeHint};

/// The most requests one connection carries at once: below any limit an API server
/// advertises (Kubernetes' own default is 100 from v1.27, 250 before).
pub const STREAMS_PER_CONNECTION: usize = 100;

/// A client with one pool (so one HTTP/2 connection) per [`Slot`].
type Http<C> = hyper_util::client::legacy::Client<C, kube::client::Body>;

/// One pool and the count of its requests whose answers are still open.
struct Slot<C> {
    http: Http<C>,
    streams: Arc<AtomicUsize>,
}

impl<C: Clone> Clone for Slot<C> {
    fn clone(&self) -> Self {
        Slot {
            http: self.http.clone(),
            streams: self.streams.clone(),
        }
    }
}

/// Sends requests on as many pools as the streams in use need (see the module doc).
pub struct Spread<C> {
    builder: Arc<hyper_util::client::legacy::Builder>,
    connector: C,
    slots: Arc<Mutex<Vec<Slot<C>>>>,
}

impl<C: Clone> Clone for Spread<C> {
    fn clone(&self) -> Self {
        Spread {
            builder: self.builder.clone(),
            connector: self.connector.clone(),
            slots: self.slots.clone(),
        }
    }
}

impl<C> Spread<C>
where
    C: hyper_util::client::legacy::connect::Connect + Clone + Send + Sync + 'static,
{
    /// Pools built by `builder` on `connector`, the first at once.
    pub fn new(builder: hyper_util::client::legacy::Builder, connector: C) -> Self {
        let spread = Spread {
            builder: Arc::new(builder),
            connector,
            slots: Arc::default(),
        };
        let first = spread.slot();
        spread.slots.lock().expect("slots lock poisoned").push(first);
        spread
    }

    fn slot(&self) -> Slot<C> {
        Slot {
            http: self.builder.build(self.connector.clone()),
            streams: Arc::default(),
        }
    }

    /// The slot a new request goes on, its count taken.
    fn pick(&self) -> Slot<C> {
        let mut slots = self.slots.lock().expect("slots lock poisoned");
        let free = slots
            .iter()
            .find(|s| s.streams.load(Ordering::SeqCst) < STREAMS_PER_CONNECTION)
            .cloned();
        let slot = free.unwrap_or_else(|| {
            let slot = self.slot();
            slots.push(slot.clone());
            tracing::debug!(connections = slots.len(), "every connection's streams in use: one more");
            slot
        });
        slot.streams.fetch_add(1, Ordering::SeqCst);
        slot
    }
}

impl<C> tower::Service<http::Request<kube::client::Body>> for Spread<C>
where
    C: hyper_util::client::legacy::connect::Connect + Clone + Send + Sync + 'static,
{
    type Response = http::Response<Counted>;
    type Error = hyper_util::client::legacy::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<kube::client::Body>) -> Self::Future {
        let slot = self.pick();
        let open = Open(slot.streams);
        let answer = slot.http.request(req);
        Box::pin(async move {
            let response = answer.await?;
            Ok(response.map(|body| Counted { body, _open: open }))
        })
    }
}

/// Counts one request as in use on its connection until dropped.
struct Open(Arc<AtomicUsize>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// An answer's body, counted as a stream in use until it is dropped.
pub struct Counted {
    body: Incoming,
    _open: Open,
}

impl Body for Counted {
    type Data = <Incoming as Body>::Data;
    type Error = <Incoming as Body>::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
