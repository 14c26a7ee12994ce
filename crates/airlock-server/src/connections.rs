//! The server's front door: the accept loop and what bounds it.
//!
//! Whoever can reach the port can open connections, and every token holder
//! can send bodies, so each costs the server only what the operator allows:
//!
//! - at most `max_connections` connections are open at once; past it a new
//!   one is closed as soon as it is accepted, so a crowd of idle sockets
//!   never takes the server's descriptors;
//! - a request head must arrive within `header_timeout_s`, and so must an
//!   idle keep-alive connection's next one, else the connection is closed
//!   (a response, such as MCP's long-lived event stream, has no time limit);
//! - an answer its client stops reading for `write_timeout_s` closes the
//!   connection: otherwise a client that pipelines requests and reads
//!   nothing would hold its place for as long as it likes, and a few
//!   hundred such connections, no token needed, would shut everyone out
//!   (an idle event stream writes nothing, so it is not cut);
//! - a request body must arrive whole within `body_timeout_s` (408), and
//!   the bodies being read hold at most `body_bytes_in_flight` bytes in all
//!   (429 for the body that would pass it): the bytes are counted as they
//!   are read and given back once the request's body and its
//!   [`BodyLease`] are gone.
//!
//! On shutdown the listener closes, open connections finish the answer in
//! hand, and those still open after the patience given are dropped.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::Request;
use http_body_util::BodyExt as _;
use hyper::body::{Body as _, Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;

use crate::config::Settings;

/// The size past which hyper's read buffer for a request head stops
/// growing (it otherwise grows to about 400 KiB a connection). hyper reads
/// into whatever room the buffer has, so a head of up to about twice this
/// is still read; a larger one gets 431. A bound on memory, not an exact
/// cap on heads.
const MAX_HEAD_BUFFER: usize = 64 << 10;

/// How long the accept loop waits after the system refused a connection
/// (out of descriptors, say) before it tries again.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Serves `app` on `listener` until `stop` is cancelled, within the limits
/// of `settings` (see the module's doc); then closes the listener, lets
/// open connections finish their answers, and drops those still open after
/// `patience`.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    settings: &Settings,
    stop: CancellationToken,
    patience: Duration,
) {
    let budget =
        Arc::new(BodyBudget::new(settings.body_bytes_in_flight, settings.tokens.len(), settings.max_body_bytes));
    let body_timeout = settings.body_timeout;
    let service = TowerToHyperService::new(app.map_request(move |request: Request<Incoming>| {
        let lease = BodyLease(Arc::new(Lease::new(budget.clone())));
        let (mut parts, body) = request.into_parts();
        parts.extensions.insert(lease.clone());
        let body = MeteredBody { inner: body, lease, timeout: body_timeout, deadline: None };
        Request::from_parts(parts, Body::new(body))
    }));
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(settings.header_timeout).max_buf_size(MAX_HEAD_BUFFER);
    let open = Arc::new(Semaphore::new(settings.max_connections));
    let graceful = GracefulShutdown::new();
    // Owned here, so that dropping them after the patience ends them.
    let mut connections = JoinSet::new();
    loop {
        let stream = tokio::select! {
            () = stop.cancelled() => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => stream,
                Err(_) => {
                    // A connection reset before it was accepted, or no
                    // descriptor left: neither ends the server.
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
        };
        let Ok(place) = open.clone().try_acquire_owned() else {
            // Past max_connections: closed at once, holding nothing.
            drop(stream);
            continue;
        };
        let stream = WriteProgress { inner: stream, patience: settings.write_timeout, stalled: None };
        let connection = graceful.watch(http.serve_connection(TokioIo::new(stream), service.clone()));
        connections.spawn(async move {
            // A connection's error (a timeout, a reset) is its client's affair.
            let _ = connection.await;
            drop(place);
        });
    }
    drop(listener);
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(patience) => {}
    }
    connections.shutdown().await;
}

/// A connection whose writes must make progress: one the client has not
/// let through for `patience` fails (TimedOut), and hyper then closes the
/// connection.
struct WriteProgress {
    inner: tokio::net::TcpStream,
    patience: Duration,
    /// Since when a write has waited, as a deadline.
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl WriteProgress {
    /// `Pending` while a write may still wait; a time-out once it has waited
    /// `patience`; progress clears the wait.
    fn waited<T>(&mut self, cx: &mut Context<'_>, poll: Poll<std::io::Result<T>>) -> Poll<std::io::Result<T>> {
        match poll {
            Poll::Ready(result) => {
                self.stalled = None;
                Poll::Ready(result)
            }
            Poll::Pending => {
                let patience = self.patience;
                let deadline = self.stalled.get_or_insert_with(|| Box::pin(tokio::time::sleep(patience)));
                match deadline.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "the client read nothing of its answer for write_timeout_s",
                    ))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }
}

impl tokio::io::AsyncRead for WriteProgress {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for WriteProgress {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.waited(cx, poll)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let poll = Pin::new(&mut self.inner).poll_flush(cx);
        self.waited(cx, poll)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let poll = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.waited(cx, poll)
    }
}

/// The bytes of request bodies being read, server-wide, and each token's
/// share: no token may hold more than `per_token` of them, so that one
/// token's stalled uploads cannot refuse every other token's requests.
#[derive(Debug)]
struct BodyBudget {
    limit: usize,
    per_token: usize,
    used: Mutex<Used>,
}

#[derive(Debug, Default)]
struct Used {
    total: usize,
    by_token: HashMap<String, usize>,
}

impl BodyBudget {
    /// `limit` bytes in all; a token's share is `limit` over the number of
    /// `tokens`, but never less than one whole body (`body_cap`).
    fn new(limit: usize, tokens: usize, body_cap: usize) -> BodyBudget {
        let per_token = (limit / tokens.max(1)).max(body_cap).min(limit);
        BodyBudget { limit, per_token, used: Mutex::new(Used::default()) }
    }

    /// Takes `bytes` for `token` (none before a token is known), if both
    /// the budget and the token's share have them.
    fn take(&self, bytes: usize, token: Option<&str>) -> Result<(), BodyError> {
        let mut used = self.used.lock().unwrap_or_else(PoisonError::into_inner);
        let total = used.total.checked_add(bytes).filter(|total| *total <= self.limit);
        let total = total.ok_or(BodyError::OverBudget(self.limit))?;
        if let Some(token) = token {
            let mine = used.by_token.get(token).copied().unwrap_or(0);
            let mine = mine.checked_add(bytes).filter(|mine| *mine <= self.per_token);
            let mine = mine.ok_or(BodyError::OverShare(self.per_token))?;
            used.by_token.insert(token.to_owned(), mine);
        }
        used.total = total;
        Ok(())
    }

    fn give(&self, bytes: usize, token: Option<&str>) {
        let mut used = self.used.lock().unwrap_or_else(PoisonError::into_inner);
        used.total = used.total.saturating_sub(bytes);
        if let Some(token) = token
            && let Some(mine) = used.by_token.get_mut(token)
        {
            *mine = mine.saturating_sub(bytes);
            if *mine == 0 {
                used.by_token.remove(token);
            }
        }
    }
}

/// What one request's body has taken from the budget, given back when the
/// last holder is gone.
#[derive(Debug)]
struct Lease {
    budget: Arc<BodyBudget>,
    /// The token the request carries, once the auth layer has checked it.
    token: OnceLock<String>,
    /// The bytes taken, and the token they were charged to (the first
    /// take's: a lease's bytes are given back as they were taken).
    taken: Mutex<(usize, Option<String>)>,
}

impl Lease {
    fn new(budget: Arc<BodyBudget>) -> Lease {
        Lease { budget, token: OnceLock::new(), taken: Mutex::new((0, None)) }
    }

    fn take(&self, bytes: usize) -> Result<(), BodyError> {
        let mut taken = self.taken.lock().unwrap_or_else(PoisonError::into_inner);
        if taken.0 == 0 {
            taken.1 = self.token.get().cloned();
        }
        self.budget.take(bytes, taken.1.as_deref())?;
        taken.0 += bytes;
        Ok(())
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let (bytes, token) = std::mem::take(self.taken.get_mut().unwrap_or_else(PoisonError::into_inner));
        self.budget.give(bytes, token.as_deref());
    }
}

/// A request's hold on the bytes its body took from `body_bytes_in_flight`,
/// in its extensions: a handler that keeps it past reading the body (until
/// it has parsed the bytes) keeps them counted.
#[derive(Clone, Debug)]
pub struct BodyLease(Arc<Lease>);

impl BodyLease {
    /// Charges the request's body to `token` (the auth layer calls it once
    /// the token is checked, before any handler reads the body).
    pub fn charge_to(&self, token: &str) {
        let _ = self.0.token.set(token.to_owned());
    }
}

/// Why a request body was not read whole.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error(
        "the request body did not arrive whole within {} s (body_timeout_s); send it faster, or ask the operator to raise body_timeout_s",
        .0.as_secs_f64()
    )]
    TimedOut(Duration),
    #[error(
        "the server is already reading {0} bytes of request bodies, the most body_bytes_in_flight allows; retry shortly, or ask the operator to raise body_bytes_in_flight"
    )]
    OverBudget(usize),
    #[error(
        "this token is already sending {0} bytes of request bodies, its share of body_bytes_in_flight; retry shortly, once its other uploads are in"
    )]
    OverShare(usize),
    #[error("the request body could not be read: {0}")]
    Read(#[from] hyper::Error),
}

/// A request body read within `body_timeout_s` (counted from its first
/// read) and `body_bytes_in_flight`.
struct MeteredBody {
    inner: Incoming,
    lease: BodyLease,
    timeout: Duration,
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl hyper::body::Body for MeteredBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = &mut *self;
        if this.inner.is_end_stream() {
            return Poll::Ready(None);
        }
        let timeout = this.timeout;
        let deadline = this.deadline.get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                let size = frame.data_ref().map_or(0, Bytes::len);
                match this.lease.0.take(size) {
                    Ok(()) => Poll::Ready(Some(Ok(frame))),
                    Err(refused) => Poll::Ready(Some(Err(refused))),
                }
            }
            Poll::Ready(Some(Err(error))) => Poll::Ready(Some(Err(BodyError::Read(error)))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => match deadline.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Some(Err(BodyError::TimedOut(timeout)))),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Why [`read_body`] returned no body.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("the request body is above the server's cap of {0} bytes (max_body_bytes)")]
    TooLarge(usize),
    #[error(transparent)]
    Body(BodyError),
    #[error("the request body could not be read: {0}")]
    Other(axum::Error),
}

/// The whole of `body`, at most `cap` bytes: refused at once when its
/// declared length is past the cap, and as soon as a chunked body passes it.
pub async fn read_body(mut body: Body, cap: usize) -> Result<Bytes, ReadError> {
    if usize::try_from(body.size_hint().lower()).map_or(true, |declared| declared > cap) {
        return Err(ReadError::TooLarge(cap));
    }
    // A declared length is allocated once (its pages are touched only as
    // bytes arrive); growing by doubling would copy, and hold up to twice
    // what the budget counts.
    let declared = body.size_hint().exact().and_then(|length| usize::try_from(length).ok());
    let mut bytes = Vec::with_capacity(declared.unwrap_or(0));
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|error| match error.into_inner().downcast::<BodyError>() {
            Ok(body) => ReadError::Body(*body),
            Err(other) => ReadError::Other(axum::Error::new(other)),
        })?;
        if let Ok(data) = frame.into_data() {
            if bytes.len().saturating_add(data.len()) > cap {
                return Err(ReadError::TooLarge(cap));
            }
            bytes.extend_from_slice(&data);
        }
    }
    Ok(Bytes::from(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leases_take_from_the_budget_and_the_tokens_share_and_give_back_when_dropped() {
        // 100 bytes in all, two tokens: a share of 50 each (one body is 10).
        let budget = Arc::new(BodyBudget::new(100, 2, 10));
        let lease = |token: Option<&str>| {
            let lease = Lease::new(budget.clone());
            if let Some(token) = token {
                let _ = lease.token.set(token.to_owned());
            }
            lease
        };
        let alice = lease(Some("alice"));
        assert!(alice.take(50).is_ok());
        let more = lease(Some("alice"));
        assert!(matches!(more.take(1), Err(BodyError::OverShare(50))), "past Alice's share");
        let bob = lease(Some("bob"));
        assert!(bob.take(40).is_ok(), "Alice's stalled uploads leave Bob his share");
        let unnamed = lease(None);
        assert!(matches!(unnamed.take(11), Err(BodyError::OverBudget(100))), "past the budget");
        assert!(unnamed.take(10).is_ok());
        drop((alice, more));
        assert_eq!(budget.used.lock().unwrap().total, 50);
        drop((bob, unnamed));
        let used = budget.used.lock().unwrap();
        assert_eq!((used.total, used.by_token.len()), (0, 0));
    }

    #[tokio::test]
    async fn a_body_past_the_cap_is_refused_declared_or_not() {
        let body = Body::from(vec![b'x'; 2048]);
        assert!(matches!(read_body(body, 1024).await, Err(ReadError::TooLarge(1024))));
        let chunks = Body::new(Chunks(vec![Bytes::from(vec![b'x'; 800]), Bytes::from(vec![b'x'; 800])]));
        assert!(matches!(read_body(chunks, 1024).await, Err(ReadError::TooLarge(1024))));
        let body = read_body(Body::from("{}"), 1024).await.ok();
        assert_eq!(body.as_deref(), Some(&b"{}"[..]));
    }

    /// A body sent in chunks, its length not declared.
    struct Chunks(Vec<Bytes>);

    impl hyper::body::Body for Chunks {
        type Data = Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            let next = (!self.0.is_empty()).then(|| self.0.remove(0));
            Poll::Ready(next.map(|chunk| Ok(Frame::data(chunk))))
        }
    }
}
