//! The proxy itself: accepts the sandbox's connections, decides, dials,
//! relays with byte counting, and records every connection.
//!
//! Threads, not an async runtime: the connections of one run are capped
//! (64 by default), and the supervisor that owns the proxy is synchronous.
//! One thread accepts; each connection gets one thread, plus a second while
//! it relays (one per direction). [`ProxyHandle::finish`] shuts every socket
//! down, which wakes every blocked read and write, so it returns promptly.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use airlock_policy::{Limit, NetworkEvent, NetworkRecord, NetworkVerdict};
use rustix::event::{PollFd, PollFlags, Timespec, poll};

use crate::config::{ProxyConfig, Refusal};
use crate::error::NetError;
use crate::host::{HostError, RequestHost, parse_absolute_url, parse_authority, parse_host, split_port};
use crate::http::{BodyFraming, MAX_HEAD_BYTES, RequestHead, read_head, split_head};
use crate::tls::{HelloScan, MAX_CLIENT_HELLO, answers_tls, scan_client_hello};

/// Bytes moved per read while relaying. Larger buffers measured no faster on
/// loopback (and neither did splice(2); see bench/results/net.md).
const RELAY_BUFFER: usize = 128 * 1024;
/// How long [`ProxyHandle::finish`] waits for connection threads to end
/// after their sockets are shut down. Only a thread stuck in a resolver or a
/// connect can take this long; it is then left to end on its own.
const FINISH_GRACE: Duration = Duration::from_secs(2);
/// How long a refusal waits to be written, and for the client's leftover
/// bytes to drain so that closing does not reset the connection before the
/// client reads the answer.
const REFUSAL_LINGER: Duration = Duration::from_millis(200);
/// The longest host text or reason kept in a record entry.
const MAX_RECORD_TEXT: usize = 300;

/// Starts proxies. See [`Proxy::start`].
#[derive(Debug)]
pub struct Proxy;

impl Proxy {
    /// Serves `listener` (already listening, usually inside the sandbox's
    /// network namespace) on its own threads until [`ProxyHandle::finish`].
    pub fn start(listener: TcpListener, config: ProxyConfig) -> Result<ProxyHandle, NetError> {
        if !rustix::net::sockopt::socket_acceptconn(&listener).map_err(|e| NetError::Listener(e.into()))? {
            return Err(NetError::Listener(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the socket is not listening; call listen() on it before handing it to the proxy",
            )));
        }
        listener.set_nonblocking(true).map_err(NetError::Listener)?;
        let (waker, wakee) = UnixStream::pair().map_err(NetError::Thread)?;
        let run = Arc::new(Run::new(config));
        let acceptor = {
            let run = Arc::clone(&run);
            thread::Builder::new()
                .name("airlock-net-accept".into())
                .spawn(move || accept_loop(&run, &listener, &wakee))
                .map_err(NetError::Thread)?
        };
        Ok(ProxyHandle { run, waker, acceptor: Some(acceptor) })
    }
}

/// A running proxy. Dropping it stops the proxy as [`ProxyHandle::finish`]
/// does, without the record.
#[derive(Debug)]
pub struct ProxyHandle {
    run: Arc<Run>,
    waker: UnixStream,
    acceptor: Option<JoinHandle<()>>,
}

/// What the proxy saw over a run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProxyOutcome {
    /// The rules and every connection, in the order they were accepted.
    pub record: NetworkRecord,
    /// [`Limit::NetworkBytes`] and/or [`Limit::NetworkConnections`] if reached.
    pub limits_hit: Vec<Limit>,
    /// Connections refused after the connection cap was reached, beyond the
    /// first (which is in the record). They are counted, not listed, so a
    /// loop of connection attempts cannot grow the record without bound.
    pub unlisted_refusals: u64,
}

impl ProxyHandle {
    /// Whether a byte or connection cap has been reached (cheap; for polling).
    pub fn limit_hit(&self) -> bool {
        self.run.byte_cap_hit.load(Ordering::SeqCst) || self.run.connection_cap_hit.load(Ordering::SeqCst)
    }

    /// The caps reached so far.
    pub fn limits_hit(&self) -> Vec<Limit> {
        self.run.limits_hit()
    }

    /// Stops accepting, closes every connection, waits a bounded time for
    /// the threads, and returns every connection's record.
    pub fn finish(mut self) -> ProxyOutcome {
        self.stop();
        let deadline = Instant::now() + FINISH_GRACE;
        loop {
            let mut workers = lock(&self.run.workers);
            let (done, running): (Vec<_>, Vec<_>) = workers.drain(..).partition(|worker| worker.is_finished());
            *workers = running;
            drop(workers);
            for worker in done {
                // A connection thread that panicked has already recorded what it could.
                let _ = worker.join();
            }
            if lock(&self.run.workers).is_empty() || Instant::now() >= deadline {
                break;
            }
            thread::sleep(Duration::from_millis(2));
        }
        self.run.outcome()
    }

    /// Stops accepting and shuts down every socket. Idempotent.
    fn stop(&mut self) {
        if self.run.stopping.swap(true, Ordering::SeqCst) {
            return;
        }
        // The acceptor polls this socket beside the listener; closing it wakes the poll.
        let _ = self.waker.shutdown(Shutdown::Both);
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
        for connection in lock(&self.run.connections).iter() {
            connection.note("closed when the run ended");
        }
        let open = lock(&self.run.open_sockets).take().unwrap_or_default();
        for stream in open.values().flatten() {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }
}

impl Drop for ProxyHandle {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Which way bytes go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Direction {
    /// From the sandbox to the outside.
    Out,
    /// From the outside to the sandbox.
    In,
}

/// The state of one run's proxy, shared by its threads.
struct Run {
    config: ProxyConfig,
    stopping: AtomicBool,
    bytes_out: AtomicU64,
    bytes_in: AtomicU64,
    accepted: AtomicU64,
    unlisted_refusals: AtomicU64,
    byte_cap_hit: AtomicBool,
    connection_cap_hit: AtomicBool,
    connections: Mutex<Vec<Arc<Connection>>>,
    /// Clones of every open socket by connection, so that stopping can shut
    /// them down; `None` once stopping, when no socket may be added.
    open_sockets: Mutex<Option<HashMap<u64, Vec<TcpStream>>>>,
    workers: Mutex<Vec<JoinHandle<()>>>,
}

impl std::fmt::Debug for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Run").field("config", &self.config).finish_non_exhaustive()
    }
}

impl Run {
    fn new(config: ProxyConfig) -> Run {
        Run {
            config,
            stopping: AtomicBool::new(false),
            bytes_out: AtomicU64::new(0),
            bytes_in: AtomicU64::new(0),
            accepted: AtomicU64::new(0),
            unlisted_refusals: AtomicU64::new(0),
            byte_cap_hit: AtomicBool::new(false),
            connection_cap_hit: AtomicBool::new(false),
            connections: Mutex::new(Vec::new()),
            open_sockets: Mutex::new(Some(HashMap::new())),
            workers: Mutex::new(Vec::new()),
        }
    }

    fn limits_hit(&self) -> Vec<Limit> {
        let mut limits = Vec::new();
        if self.byte_cap_hit.load(Ordering::SeqCst) {
            limits.push(Limit::NetworkBytes);
        }
        if self.connection_cap_hit.load(Ordering::SeqCst) {
            limits.push(Limit::NetworkConnections);
        }
        limits
    }

    fn outcome(&self) -> ProxyOutcome {
        ProxyOutcome {
            record: NetworkRecord {
                allowed_hosts: self.config.rules.iter().map(ToString::to_string).collect(),
                connections: lock(&self.connections).iter().map(|c| c.event()).collect(),
            },
            limits_hit: self.limits_hit(),
            unlisted_refusals: self.unlisted_refusals.load(Ordering::SeqCst),
        }
    }

    /// Registers `stream` to be shut down when the run stops; refuses (and
    /// shuts it down) if the run is already stopping.
    fn track(&self, connection: u64, stream: &TcpStream) -> Result<(), Ended> {
        let mut open = lock(&self.open_sockets);
        match (open.as_mut(), stream.try_clone()) {
            (Some(open), Ok(clone)) => {
                open.entry(connection).or_default().push(clone);
                Ok(())
            }
            _ => {
                let _ = stream.shutdown(Shutdown::Both);
                Err(Ended)
            }
        }
    }

    fn untrack(&self, connection: u64) {
        if let Some(open) = lock(&self.open_sockets).as_mut() {
            open.remove(&connection);
        }
    }

    /// Takes up to `wanted` bytes from the run's budget for `direction`;
    /// returns how many may pass. Fewer than wanted means the cap is reached.
    fn take_budget(&self, direction: Direction, wanted: usize) -> usize {
        let (counter, cap) = match direction {
            Direction::Out => (&self.bytes_out, self.config.max_bytes_out),
            Direction::In => (&self.bytes_in, self.config.max_bytes_in),
        };
        let wanted = wanted as u64;
        let mut used = counter.load(Ordering::SeqCst);
        loop {
            let granted = cap.saturating_sub(used).min(wanted);
            match counter.compare_exchange(used, used + granted, Ordering::SeqCst, Ordering::SeqCst) {
                // `granted <= wanted`, which came from a usize.
                Ok(_) => return granted as usize,
                Err(actual) => used = actual,
            }
        }
    }

    /// Admits or refuses one accepted connection.
    fn admit(self: &Arc<Run>, client: TcpStream) {
        let number = self.accepted.fetch_add(1, Ordering::SeqCst) + 1;
        if number > u64::from(self.config.max_connections) {
            self.connection_cap_hit.store(true, Ordering::SeqCst);
            let reason = format!("the run's cap of {} connections was reached", self.config.max_connections);
            if number == u64::from(self.config.max_connections) + 1 {
                let connection = Connection::new(number);
                connection.note(&reason);
                connection.end();
                lock(&self.connections).push(Arc::new(connection));
            } else {
                self.unlisted_refusals.fetch_add(1, Ordering::SeqCst);
            }
            refuse_without_waiting(client, &reason);
            return;
        }
        let connection = Arc::new(Connection::new(number));
        lock(&self.connections).push(Arc::clone(&connection));
        let spawned = {
            let run = Arc::clone(self);
            let connection = Arc::clone(&connection);
            thread::Builder::new().name(format!("airlock-net-{number}")).spawn(move || {
                serve(&run, &connection, &client);
                connection.end();
            })
        };
        match spawned {
            Ok(worker) => {
                let mut workers = lock(&self.workers);
                workers.retain(|w| !w.is_finished());
                workers.push(worker);
            }
            // The client's socket went with the thread that never started.
            Err(e) => {
                connection.note(&format!("the proxy could not start a thread: {e}"));
                connection.end();
            }
        }
    }
}

/// The run is stopping; the connection ends.
#[derive(Debug)]
struct Ended;

/// One accepted connection, as the record will show it.
#[derive(Debug)]
struct Connection {
    id: u64,
    state: Mutex<ConnectionState>,
    bytes_out: AtomicU64,
    bytes_in: AtomicU64,
}

#[derive(Debug)]
struct ConnectionState {
    host: String,
    port: u16,
    resolved: Option<String>,
    verdict: NetworkVerdict,
    reason: Option<String>,
    ended: bool,
}

impl Connection {
    fn new(id: u64) -> Connection {
        Connection {
            id,
            state: Mutex::new(ConnectionState {
                host: String::new(),
                port: 0,
                resolved: None,
                verdict: NetworkVerdict::Denied,
                reason: None,
                ended: false,
            }),
            bytes_out: AtomicU64::new(0),
            bytes_in: AtomicU64::new(0),
        }
    }

    /// Names the host and port the request asked for, as written.
    fn describe(&self, host: &str, port: u16) {
        let mut state = lock(&self.state);
        state.host = clip(host);
        state.port = port;
    }

    fn allow(&self, dialled: SocketAddr) {
        let mut state = lock(&self.state);
        state.verdict = NetworkVerdict::Allowed;
        state.resolved = Some(dialled.ip().to_string());
    }

    /// Marks the connection refused, and why, unless a cause is already recorded.
    fn deny(&self, reason: &str) {
        lock(&self.state).verdict = NetworkVerdict::Denied;
        self.note(reason);
    }

    /// Records how the connection ended, unless something already did: the
    /// first cause is the one worth reading.
    fn note(&self, reason: &str) {
        let mut state = lock(&self.state);
        if state.reason.is_none() && !state.ended {
            state.reason = Some(clip(reason));
        }
    }

    fn end(&self) {
        lock(&self.state).ended = true;
    }

    fn count(&self, direction: Direction, bytes: usize) {
        let counter = match direction {
            Direction::Out => &self.bytes_out,
            Direction::In => &self.bytes_in,
        };
        counter.fetch_add(bytes as u64, Ordering::SeqCst);
    }

    fn event(&self) -> NetworkEvent {
        let state = lock(&self.state);
        NetworkEvent {
            host: state.host.clone(),
            port: state.port,
            resolved: state.resolved.clone(),
            verdict: state.verdict,
            reason: state.reason.clone(),
            bytes_out: self.bytes_out.load(Ordering::SeqCst),
            bytes_in: self.bytes_in.load(Ordering::SeqCst),
        }
    }
}

/// The longest the acceptor sleeps without checking whether the run stopped.
const ACCEPT_POLL_LIMIT: Timespec = Timespec { tv_sec: 1, tv_nsec: 0 };

/// Accepts until the waker closes.
fn accept_loop(run: &Arc<Run>, listener: &TcpListener, waker: &UnixStream) {
    loop {
        let mut fds = [PollFd::new(listener, PollFlags::IN), PollFd::new(waker, PollFlags::IN)];
        // The timeout only backs up the waker: stopping never waits on a client.
        let polled = poll(&mut fds, Some(&ACCEPT_POLL_LIMIT));
        if run.stopping.load(Ordering::SeqCst) || !fds[1].revents().is_empty() {
            return;
        }
        match polled {
            Ok(0) => continue,
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => {
                // Nothing here fails for long; do not spin while it does.
                thread::sleep(Duration::from_millis(10));
                continue;
            }
        }
        match listener.accept() {
            Ok((client, _)) => {
                // Accepted sockets must block: the connection threads rely on timeouts.
                if client.set_nonblocking(false).is_ok() {
                    let _ = client.set_nodelay(true);
                    run.admit(client);
                }
            }
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => {}
            Err(e) if e.kind() == io::ErrorKind::ConnectionAborted => {}
            // Out of descriptors, most likely: wait for some to close.
            Err(_) => thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// Why a request goes no further: the status the client gets, and the reason.
#[derive(Debug)]
enum Stop {
    /// The policy refuses it, or it cannot be read (4xx; never dialled).
    Denied { status: u16, reason: String },
    /// Allowed, but the outside could not be reached (502).
    Failed(String),
    /// The run is stopping.
    Ended,
}

impl From<Refusal> for Stop {
    fn from(refusal: Refusal) -> Stop {
        match refusal {
            Refusal::NotAllowed(reason) => Stop::Denied { status: 403, reason },
            Refusal::Unresolvable(reason) => Stop::Failed(reason),
        }
    }
}

impl From<Ended> for Stop {
    fn from(_: Ended) -> Stop {
        Stop::Ended
    }
}

fn bad_request(reason: impl Into<String>) -> Stop {
    Stop::Denied { status: 400, reason: reason.into() }
}

fn forbidden(reason: impl Into<String>) -> Stop {
    Stop::Denied { status: 403, reason: reason.into() }
}

/// Serves one connection from its first byte to its close.
fn serve(run: &Run, connection: &Connection, client: &TcpStream) {
    if run.track(connection.id, client).is_err() {
        return;
    }
    let deadline = Instant::now() + run.config.head_timeout;
    let result = match read_head(client, deadline) {
        Err(e) => Err(Stop::Denied { status: e.status(), reason: e.to_string() }),
        Ok((head, early)) => {
            let _ = client.set_read_timeout(None);
            if head.method == "CONNECT" {
                tunnel(run, connection, client, &head, early)
            } else {
                forward(run, connection, client, &head, early)
            }
        }
    };
    match result {
        Ok(()) | Err(Stop::Ended) => {}
        Err(Stop::Denied { status, reason }) => {
            connection.deny(&reason);
            refuse(client, status, &reason);
        }
        Err(Stop::Failed(reason)) => {
            connection.note(&reason);
            refuse(client, 502, &reason);
        }
    }
    run.untrack(connection.id);
}

/// CONNECT host:port: check, dial, answer 200, check what the tunnel
/// carries, relay.
///
/// A tunnel carries TLS to the host it was opened to, or, on a port where
/// plaintext is allowed ([`plaintext_allowed`]), HTTP for that host: without
/// that check, a tunnel to an allowed host:port could carry requests for any
/// other site the server behind it answers for (a shared front end, a
/// forward proxy) in plain text, or any other protocol the server speaks.
/// So the first bytes must be a TLS ClientHello whose server name is the
/// CONNECT host, which the server must answer with TLS before anything else
/// passes either way, or one HTTP/1 request that names it; anything else is
/// refused, the tunnel closed, and the connection recorded as refused with
/// the reason.
fn tunnel(
    run: &Run,
    connection: &Connection,
    client: &TcpStream,
    head: &RequestHead,
    early: Vec<u8>,
) -> Result<(), Stop> {
    let (host_text, _) = split_port(&head.target).unwrap_or((&head.target, None));
    connection.describe(host_text, 0);
    let (host, port) = parse_authority(&head.target).map_err(|e| bad_request(format!("CONNECT target: {e}")))?;
    let port = port.ok_or_else(|| bad_request(format!("CONNECT target {:?} has no port", head.target)))?;
    connection.describe(host_text, port);
    // A Host header is optional on CONNECT; without a port it names the host only.
    check_host_header(head, &host, port, None, &head.target)?;
    let addresses = run.config.route(&host, port)?;
    // A lookup may outlast the run: never dial for a run that is over.
    if run.stopping.load(Ordering::SeqCst) {
        return Err(Stop::Ended);
    }
    let (upstream, dialled) = dial(&addresses, run.config.connect_timeout)?;
    connection.allow(dialled);
    run.track(connection.id, &upstream)?;
    let mut reply = client;
    reply.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n").map_err(|_| Stop::Ended)?;
    // Both protocols a tunnel may carry begin with the client: until it has
    // spoken, nothing passes, and a server that speaks first is refused.
    match tunnel_opening(run, client, &upstream, early, &host, port) {
        Ok(Opening::Tls { data, hello }) => {
            if let Err((end, direction)) = tls_answered(run, connection, client, &upstream, &data[..hello], &host, port)
            {
                end_direction(run, connection, end, client, &upstream, direction);
                return Ok(());
            }
            relay_both(run, connection, client, &upstream, Answer::Any, || {
                match forward_bytes(run, connection, &upstream, &data[hello..], Direction::Out) {
                    Ok(()) => relay(run, connection, client, &upstream, Direction::Out, None),
                    Err(end) => end,
                }
            })
        }
        Ok(Opening::Http(first)) => {
            relay_both(run, connection, client, &upstream, Answer::Http { target: &head.target }, || {
                relay_http_request(run, connection, client, &upstream, first, &host, port)
            })?;
            // As after a forwarded request: let the client read the answer.
            linger(client);
            Ok(())
        }
        // The client closed (or half-closed) before sending anything
        // through the tunnel: nothing passes either way.
        Ok(Opening::Closed) => {
            shutdown_both(client, &upstream);
            Ok(())
        }
        Err(reason) => {
            connection.deny(&reason);
            shutdown_both(client, &upstream);
            Ok(())
        }
    }
}

/// Passes the ClientHello (`hello`, its records alone) to the server, and
/// its answer back to the client, once that answer begins as a TLS server's
/// does ([`answers_tls`]). Until then nothing else passes: the bytes the
/// client sent after its ClientHello wait, and a server of another protocol
/// (a line-based one on an allowed port, which would read past the hello's
/// bytes as junk) never gets them, nor sends the client a byte. The
/// ClientHello's own bytes do reach it: they are what the proxy checked.
/// Returns how it ended otherwise, and in which direction.
fn tls_answered(
    run: &Run,
    connection: &Connection,
    client: &TcpStream,
    upstream: &TcpStream,
    hello: &[u8],
    host: &RequestHost,
    port: u16,
) -> Result<(), (RelayEnd, Direction)> {
    forward_bytes(run, connection, upstream, hello, Direction::Out).map_err(|end| (end, Direction::Out))?;
    let refused = |reason: String| (RelayEnd::Refused(reason), Direction::In);
    let mut answer = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    let mut reader = upstream;
    let deadline = Some(Instant::now() + run.config.head_timeout);
    while answer.len() < 5 {
        match read_some(upstream, &mut reader, &mut chunk, deadline) {
            // The run ending closes every tunnel: not the server's doing.
            Ok(0) if run.stopping.load(Ordering::SeqCst) => return Err((RelayEnd::Eof, Direction::In)),
            Ok(0) if answer.is_empty() => {
                return Err(refused(format!("{host}:{port} closed the tunnel at the TLS ClientHello")));
            }
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&chunk[..n]),
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                return Err(refused(format!("{host}:{port} did not answer the TLS ClientHello in time")));
            }
            Err(e) => return Err((RelayEnd::Error(e), Direction::In)),
        }
    }
    if !answers_tls(&answer) {
        let shown = String::from_utf8_lossy(&answer[..answer.len().min(16)]).into_owned();
        return Err(refused(format!(
            "{host}:{port} did not answer the TLS ClientHello with TLS (it began {shown:?}): a tunnel carries TLS, \
             or on a port that allows plaintext one HTTP request, and no other protocol"
        )));
    }
    forward_bytes(run, connection, client, &answer, Direction::In).map_err(|end| (end, Direction::In))
}

/// How a tunnel begins.
enum Opening {
    /// A whole ClientHello for the tunnel's host: the bytes read so far,
    /// the first `hello` of them its records.
    Tls { data: Vec<u8>, hello: usize },
    /// Not TLS, on a port that allows plaintext: the bytes read so far, to be
    /// read as HTTP requests.
    Http(Vec<u8>),
    /// The client closed before sending anything.
    Closed,
}

/// Whether a tunnel to `port` may carry plaintext HTTP. 443 is HTTPS's port:
/// a client that tunnels there and then speaks plaintext is not fetching a
/// web page. Elsewhere (80, a service's own port) HTTP may go in the clear,
/// each request checked.
pub fn plaintext_allowed(port: u16) -> bool {
    port != 443
}

/// Reads what the client sends first through a tunnel: a TLS ClientHello
/// naming the tunnel's host, or (where the port allows plaintext) the start
/// of something else, to be read as HTTP. Returns why not, otherwise.
fn tunnel_opening(
    run: &Run,
    client: &TcpStream,
    upstream: &TcpStream,
    mut data: Vec<u8>,
    host: &RequestHost,
    port: u16,
) -> Result<Opening, String> {
    let mut reader = client;
    // The first byte must come within the head timeout, as a request's
    // head must, unless the server speaks first: a tunnel the client
    // leaves silent would hold four of the supervisor's descriptors until
    // the run ends. A ClientHello, once begun, must be quick too.
    if data.is_empty() {
        match client_speaks_first(client, upstream, run.config.head_timeout) {
            _ if run.stopping.load(Ordering::SeqCst) => return Ok(Opening::Closed),
            Ok(Some(true)) => {}
            Ok(None) => {
                return Err(format!(
                    "the client sent nothing through the tunnel to {host}:{port} within {} s",
                    run.config.head_timeout.as_secs_f64()
                ));
            }
            Ok(Some(false)) => {
                return Err(format!(
                    "{host}:{port} spoke (or closed) before the client did: a tunnel carries TLS or HTTP, whose \
                     client speaks first"
                ));
            }
            Err(e) => return Err(format!("waiting for the tunnel's first bytes: {e}")),
        }
    }
    let mut deadline = None;
    let mut chunk = [0u8; 16 * 1024];
    loop {
        match scan_client_hello(&data) {
            HelloScan::NotTls if plaintext_allowed(port) => return Ok(Opening::Http(data)),
            HelloScan::NotTls => {
                return Err(format!(
                    "the tunnel to {host}:{port} does not begin with a TLS ClientHello, and port {port} carries TLS only"
                ));
            }
            // An IP literal is never a server name (RFC 6066): a client
            // tunnelling to an address sends none.
            HelloScan::Hello { server_name: None, length } if matches!(host, RequestHost::Ip(_)) => {
                return Ok(Opening::Tls { data, hello: length });
            }
            HelloScan::Hello { server_name: None, .. } => {
                return Err(format!("the TLS ClientHello names no server, and the tunnel is for {host} only"));
            }
            HelloScan::Hello { server_name: Some(name), length } => {
                if parse_host(&name).as_ref() == Ok(host) {
                    return Ok(Opening::Tls { data, hello: length });
                }
                return Err(format!("the TLS server name {name:?} differs from the CONNECT host {host}"));
            }
            HelloScan::Malformed(why) => return Err(format!("unreadable TLS ClientHello: {why}")),
            HelloScan::Incomplete => {}
        }
        if data.len() > 4 * MAX_CLIENT_HELLO {
            return Err("the TLS ClientHello is too large".into());
        }
        if !data.is_empty() && deadline.is_none() {
            deadline = Some(Instant::now() + run.config.head_timeout);
        }
        match read_some(client, &mut reader, &mut chunk, deadline) {
            Ok(0) if data.is_empty() => return Ok(Opening::Closed),
            Ok(0) => return Err("the client closed the tunnel in the middle of a TLS ClientHello".into()),
            Ok(n) => data.extend_from_slice(&chunk[..n]),
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                return Err("no whole TLS ClientHello arrived in time".into());
            }
            Err(e) => return Err(format!("reading the TLS ClientHello: {e}")),
        }
    }
}

/// Waits, at most `patience`, until either side of a fresh tunnel has
/// something to read: whether the client was first (it was, too, when both
/// were), or `None` if neither spoke in time.
fn client_speaks_first(client: &TcpStream, upstream: &TcpStream, patience: Duration) -> io::Result<Option<bool>> {
    let deadline = Instant::now() + patience;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(None);
        }
        let timeout = rustix::time::Timespec::try_from(left).map_err(|_| io::Error::other("a timeout out of range"))?;
        let mut fds = [PollFd::new(client, PollFlags::IN), PollFd::new(upstream, PollFlags::IN)];
        match poll(&mut fds, Some(&timeout)) {
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
            Ok(_) if !fds[0].revents().is_empty() => return Ok(Some(true)),
            Ok(_) if !fds[1].revents().is_empty() => return Ok(Some(false)),
            Ok(_) => continue,
        }
    }
}

/// One read from `client` (or the server), by `deadline` if there is one;
/// interrupted reads are retried.
fn read_some(
    client: &TcpStream,
    reader: &mut &TcpStream,
    buffer: &mut [u8],
    deadline: Option<Instant>,
) -> io::Result<usize> {
    loop {
        let timeout = match deadline {
            None => None,
            Some(deadline) => match deadline.saturating_duration_since(Instant::now()) {
                left if left.is_zero() => return Err(io::ErrorKind::TimedOut.into()),
                left => Some(left),
            },
        };
        client.set_read_timeout(timeout)?;
        match reader.read(buffer) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => {
                let _ = client.set_read_timeout(None);
                return other;
            }
        }
    }
}

/// Relays one plaintext HTTP/1 request through a tunnel: its head, read
/// whole, must name the tunnel's host; it goes upstream rebuilt as a
/// forwarded request's is ([`upstream_head`], `Connection: close`), then
/// exactly its body, and the answer comes back untouched on the other
/// thread. One request a tunnel: a server that reads a body the proxy
/// passed (a GET's, a body its handler ignores) as a request of its own
/// would otherwise take whatever host that "request" names, so the server
/// is asked to close after the first, and anything the client sends after
/// its body ends the tunnel, refused, as does a request that names another
/// host, leaves HTTP (an Upgrade, a CONNECT) or cannot be read.
fn relay_http_request(
    run: &Run,
    connection: &Connection,
    client: &TcpStream,
    upstream: &TcpStream,
    mut pending: Vec<u8>,
    host: &RequestHost,
    port: u16,
) -> RelayEnd {
    let mut reader = client;
    let mut chunk = vec![0u8; RELAY_BUFFER];
    // The head: quick, once its first byte came.
    let deadline = Some(Instant::now() + run.config.head_timeout);
    let (head, length) = loop {
        match split_head(&pending) {
            Ok(Some(found)) => break found,
            Ok(None) => {}
            Err(e) => {
                return RelayEnd::Refused(format!(
                    "the tunnel to {host}:{port} carries no HTTP the proxy can check: {e}"
                ));
            }
        }
        if pending.len() >= MAX_HEAD_BYTES {
            return RelayEnd::Refused(format!("a request head in the tunnel is larger than {MAX_HEAD_BYTES} bytes"));
        }
        let room = chunk.len().min(MAX_HEAD_BYTES - pending.len());
        match read_some(client, &mut reader, &mut chunk[..room], deadline) {
            // The run ending closes every tunnel: not the client's doing.
            Ok(0) if run.stopping.load(Ordering::SeqCst) => return RelayEnd::Eof,
            Ok(0) => return RelayEnd::Refused("the client closed the tunnel in the middle of a request".into()),
            Ok(n) => pending.extend_from_slice(&chunk[..n]),
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                return RelayEnd::Refused("no whole request head arrived in time through the tunnel".into());
            }
            Err(e) => return RelayEnd::Error(e),
        }
    };
    let path = match check_tunnelled_request(&head, host, port) {
        Ok(path) => path,
        Err(reason) => return RelayEnd::Refused(reason),
    };
    let mut framing = match BodyFraming::of(&head) {
        Ok(framing) => framing,
        Err(e) => return RelayEnd::Refused(format!("request body: {e}")),
    };
    let rebuilt = upstream_head(&head, &path, &format!("{host}:{port}"));
    if let Err(end) = forward_bytes(run, connection, upstream, &rebuilt, Direction::Out) {
        return end;
    }
    pending.drain(..length);
    // The body: exactly what its framing says, from what is buffered, then the stream.
    loop {
        let taken = match framing.advance(&pending) {
            Ok(taken) => taken,
            Err(e) => return RelayEnd::Refused(format!("request body: {e}")),
        };
        if let Err(end) = forward_bytes(run, connection, upstream, &pending[..taken], Direction::Out) {
            return end;
        }
        pending.drain(..taken);
        if framing.is_done() {
            break;
        }
        match read_some(client, &mut reader, &mut chunk, None) {
            Ok(0) => return RelayEnd::Eof,
            Ok(n) => pending.extend_from_slice(&chunk[..n]),
            Err(e) => return RelayEnd::Error(e),
        }
    }
    // Nothing more goes upstream; the client may only close.
    let more = if pending.is_empty() { read_some(client, &mut reader, &mut chunk, None) } else { Ok(pending.len()) };
    match more {
        Ok(0) => RelayEnd::Eof,
        Ok(_) => RelayEnd::Refused(format!(
            "a second request in the tunnel to {host}:{port}: the proxy passes one request a plaintext tunnel, \
             and asked the server to close after it (open a new tunnel, or send the request to the proxy)"
        )),
        Err(e) => RelayEnd::Error(e),
    }
}

/// Refuses a request in a plaintext tunnel that does not name the tunnel's
/// host (its Host header, and its target if absolute) or that would leave
/// HTTP/1, where the proxy could no longer check what passes. Returns the
/// request's target in origin form.
fn check_tunnelled_request(head: &RequestHead, host: &RequestHost, port: u16) -> Result<String, String> {
    if head.method.eq_ignore_ascii_case("CONNECT") {
        return Err(format!("a CONNECT inside the tunnel to {host}:{port}"));
    }
    if head.values("upgrade").next().is_some() {
        return Err(format!("an Upgrade inside the tunnel to {host}:{port}: the proxy checks HTTP/1 only"));
    }
    let mut path = head.target.clone();
    if head.target.contains("://") {
        let url = parse_absolute_url(&head.target).map_err(|e| format!("request target: {e}"))?;
        if url.host != *host || url.port != port {
            return Err(format!("a request in the tunnel to {host}:{port} is for {:?}", head.target));
        }
        path = url.path;
    }
    // Without a port, the Host header means HTTP's default port.
    match check_host_header(head, host, port, Some(80), &format!("{host}:{port}")) {
        Ok(true) => Ok(path),
        Ok(false) => Err(format!("a request in the tunnel to {host}:{port} names no host (it has no Host header)")),
        Err(Stop::Denied { reason, .. }) | Err(Stop::Failed(reason)) => {
            Err(format!("a request in the tunnel to {host}:{port}: {reason}"))
        }
        Err(Stop::Ended) => Err("the run is stopping".into()),
    }
}

/// GET http://host/path: check, dial, send the request in origin form with
/// `Connection: close`, pass the body and only the body, relay the answer.
fn forward(
    run: &Run,
    connection: &Connection,
    client: &TcpStream,
    head: &RequestHead,
    early: Vec<u8>,
) -> Result<(), Stop> {
    let url = parse_absolute_url(&head.target).map_err(|e| match e {
        HostError::NotAbsolute(_) => {
            bad_request(format!("{e} (it came in origin form: use this address as an HTTP proxy, not as a server)"))
        }
        e => bad_request(format!("request target: {e}")),
    })?;
    let (host_text, _) = split_port(&url.authority).unwrap_or((&url.authority, None));
    connection.describe(host_text, url.port);
    let has_host = check_host_header(head, &url.host, url.port, Some(80), &url.authority)?;
    if !has_host && head.version >= 1 {
        return Err(bad_request("an HTTP/1.1 request must have a Host header"));
    }
    let mut framing = BodyFraming::of(head).map_err(|e| bad_request(e.to_string()))?;
    let addresses = run.config.route(&url.host, url.port)?;
    // A lookup may outlast the run: never dial for a run that is over.
    if run.stopping.load(Ordering::SeqCst) {
        return Err(Stop::Ended);
    }
    let (upstream, dialled) = dial(&addresses, run.config.connect_timeout)?;
    connection.allow(dialled);
    run.track(connection.id, &upstream)?;
    if let Err(end) =
        forward_bytes(run, connection, &upstream, &upstream_head(head, &url.path, &url.authority), Direction::Out)
    {
        end_direction(run, connection, end, client, &upstream, Direction::Out);
        return Ok(());
    }
    relay_both(run, connection, client, &upstream, Answer::Http { target: &url.authority }, || {
        let taken = match framing.advance(&early) {
            Ok(taken) => taken,
            Err(e) => return RelayEnd::Refused(format!("request body: {e}")),
        };
        if let Err(end) = forward_bytes(run, connection, &upstream, &early[..taken], Direction::Out) {
            return end;
        }
        if framing.is_done() {
            return RelayEnd::BodyDone;
        }
        relay(run, connection, client, &upstream, Direction::Out, Some(framing))
    })?;
    // The answer is passed and the client's side closed; let the client read
    // it before closing (unread pipelined bytes would reset the connection).
    linger(client);
    Ok(())
}

/// What the server may answer through a relay.
#[derive(Clone, Copy)]
enum Answer<'a> {
    /// Anything: TLS, whose opening was checked both ways already.
    Any,
    /// HTTP/1, from the server at `target` (`host:port`), for a request the
    /// proxy passed in plain text.
    Http { target: &'a str },
}

/// Relays the server's answer to a plaintext request: it must begin as an
/// HTTP/1 answer does (`HTTP/1.x` and a status), or nothing of it reaches
/// the client and the connection is refused. A request's body is the
/// client's to fill, and a server of another protocol on an allowed port (a
/// cache's, a mail server's) reads it as commands: the client must not get
/// its answers. The answer goes on with `Connection: close` first among its
/// headers, so that a keep-alive client opens a new connection for its next
/// request rather than send it where the proxy passes one.
fn relay_http_answer(
    run: &Run,
    connection: &Connection,
    upstream: &TcpStream,
    client: &TcpStream,
    target: &str,
) -> RelayEnd {
    let mut head = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    let mut reader = upstream;
    // The status line, whole, or as much of it as proves it is not one.
    let line_end = loop {
        if let Some(at) = head.windows(2).position(|pair| pair == b"\r\n") {
            break Some(at);
        }
        if head.len() >= MAX_HEAD_BYTES || !b"HTTP/1.".starts_with(&head[..head.len().min(7)]) {
            break None;
        }
        match reader.read(&mut chunk) {
            Ok(0) if head.is_empty() => return RelayEnd::Eof,
            Ok(0) => break None,
            Ok(n) => head.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return RelayEnd::Error(e),
        }
    };
    let Some(line_end) = line_end.filter(|&end| is_status_line(&head[..end])) else {
        let shown = String::from_utf8_lossy(&head[..head.len().min(24)]).into_owned();
        return RelayEnd::Refused(format!(
            "{target} did not answer as an HTTP server (it began {shown:?}): a plaintext request carries HTTP, \
             and no other protocol"
        ));
    };
    let mut answer = Vec::with_capacity(head.len() + 19);
    answer.extend_from_slice(&head[..line_end + 2]);
    answer.extend_from_slice(b"Connection: close\r\n");
    answer.extend_from_slice(&head[line_end + 2..]);
    if let Err(end) = forward_bytes(run, connection, client, &answer, Direction::In) {
        return end;
    }
    relay(run, connection, upstream, client, Direction::In, None)
}

/// `HTTP/1.0 200 OK` or `HTTP/1.1 404` and the like: a version, a space,
/// three digits, then the end or a space.
fn is_status_line(line: &[u8]) -> bool {
    match line {
        [b'H', b'T', b'T', b'P', b'/', b'1', b'.', b'0' | b'1', b' ', a, b, c, rest @ ..] => {
            [a, b, c].iter().all(|d| d.is_ascii_digit()) && matches!(rest.first(), None | Some(b' '))
        }
        _ => false,
    }
}

/// Relays both ways until both directions end: the outside's bytes to the
/// client on a second thread, and `outbound` (which sends the client's bytes
/// upstream) on this one.
fn relay_both(
    run: &Run,
    connection: &Connection,
    client: &TcpStream,
    upstream: &TcpStream,
    answer: Answer<'_>,
    outbound: impl FnOnce() -> RelayEnd,
) -> Result<(), Stop> {
    thread::scope(|scope| {
        let inbound = thread::Builder::new()
            .name(format!("airlock-net-{}-in", connection.id))
            .spawn_scoped(scope, || {
                let end = match answer {
                    Answer::Any => relay(run, connection, upstream, client, Direction::In, None),
                    Answer::Http { target } => relay_http_answer(run, connection, upstream, client, target),
                };
                end_direction(run, connection, end, client, upstream, Direction::In);
            })
            .map_err(|e| {
                shutdown_both(client, upstream);
                Stop::Failed(format!("the proxy could not start a thread: {e}"))
            })?;
        let end = outbound();
        end_direction(run, connection, end, client, upstream, Direction::Out);
        // A relay thread that panicked has already recorded what it could.
        let _ = inbound.join();
        Ok(())
    })
}

/// Refuses a request whose Host header names another host or port than
/// `target` (`host`:`port`), or that has more than one. A Host without a
/// port means `implied_port`, or any port if that is `None`. Returns whether
/// the request has a Host header.
fn check_host_header(
    head: &RequestHead,
    host: &RequestHost,
    port: u16,
    implied_port: Option<u16>,
    target: &str,
) -> Result<bool, Stop> {
    let mut values = head.values("host");
    let Some(value) = values.next() else {
        return Ok(false);
    };
    if values.next().is_some() {
        return Err(bad_request("the request has more than one Host header"));
    }
    let value = std::str::from_utf8(value).map(str::trim).map_err(|_| bad_request("the Host header is not text"))?;
    let (named, named_port) = parse_authority(value).map_err(|e| bad_request(format!("Host header: {e}")))?;
    if named != *host || named_port.or(implied_port).is_some_and(|p| p != port) {
        return Err(forbidden(format!("the Host header {value:?} differs from the request's target {target:?}")));
    }
    Ok(true)
}

/// Headers that concern one hop only, and so never go upstream.
const HOP_BY_HOP: [&str; 6] = ["connection", "keep-alive", "te", "trailer", "upgrade", "proxy-connection"];
/// Headers that delimit the body, which the proxy forwards as it checked them.
const FRAMING: [&str; 3] = ["content-length", "transfer-encoding", "host"];

/// The request head to send upstream: origin-form target, the client's end-
/// to-end headers, `Connection: close`.
fn upstream_head(head: &RequestHead, path: &str, authority: &str) -> Vec<u8> {
    // Headers the client's Connection header names are hop-by-hop too, but a
    // client may not use that to strip the headers that delimit the body.
    let named_by_connection: Vec<String> = head
        .values("connection")
        .flat_map(|value| {
            String::from_utf8_lossy(value).split(',').map(|t| t.trim().to_ascii_lowercase()).collect::<Vec<_>>()
        })
        .filter(|token| !FRAMING.contains(&token.as_str()))
        .collect();
    let mut out = Vec::with_capacity(1024);
    out.extend_from_slice(format!("{} {path} HTTP/1.{}\r\n", head.method, head.version).as_bytes());
    if head.values("host").next().is_none() {
        out.extend_from_slice(format!("Host: {authority}\r\n").as_bytes());
    }
    for (name, value) in &head.headers {
        let lower = name.to_ascii_lowercase();
        if HOP_BY_HOP.contains(&lower.as_str()) || lower.starts_with("proxy-") || named_by_connection.contains(&lower) {
            continue;
        }
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"Connection: close\r\n\r\n");
    out
}

/// Connects to the first address that answers, in order.
fn dial(addresses: &[SocketAddr], timeout: Duration) -> Result<(TcpStream, SocketAddr), Stop> {
    let mut failures = Vec::new();
    for address in addresses {
        match TcpStream::connect_timeout(address, timeout) {
            Ok(stream) => {
                let _ = stream.set_nodelay(true);
                return Ok((stream, *address));
            }
            Err(e) => failures.push(format!("{address}: {e}")),
        }
    }
    Err(Stop::Failed(format!("could not connect: {}", failures.join("; "))))
}

/// How one direction of a relay ended.
#[derive(Debug)]
enum RelayEnd {
    /// The sender closed its side.
    Eof,
    /// A plain-HTTP request body is complete; nothing more goes upstream.
    BodyDone,
    /// The run's byte cap for this direction was reached.
    CapReached,
    /// The stream broke (or was shut down when the run ended).
    Error(io::Error),
    /// The bytes broke a rule (a malformed chunked body).
    Refused(String),
}

/// Copies `from` to `to` until one ends, counting and capping bytes, and
/// passing only the request body if `framing` is given.
fn relay(
    run: &Run,
    connection: &Connection,
    from: &TcpStream,
    to: &TcpStream,
    direction: Direction,
    mut framing: Option<BodyFraming>,
) -> RelayEnd {
    let mut buffer = vec![0u8; RELAY_BUFFER];
    let mut reader = from;
    loop {
        let read = match reader.read(&mut buffer) {
            Ok(0) => return RelayEnd::Eof,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return RelayEnd::Error(e),
        };
        let passing = match framing.as_mut() {
            None => read,
            Some(framing) => match framing.advance(&buffer[..read]) {
                Ok(taken) => taken,
                Err(e) => return RelayEnd::Refused(format!("request body: {e}")),
            },
        };
        if let Err(end) = forward_bytes(run, connection, to, &buffer[..passing], direction) {
            return end;
        }
        if framing.as_ref().is_some_and(BodyFraming::is_done) {
            return RelayEnd::BodyDone;
        }
    }
}

/// Writes `data` to `to` within the run's byte budget.
fn forward_bytes(
    run: &Run,
    connection: &Connection,
    to: &TcpStream,
    data: &[u8],
    direction: Direction,
) -> Result<(), RelayEnd> {
    if data.is_empty() {
        return Ok(());
    }
    let granted = run.take_budget(direction, data.len());
    let mut writer = to;
    writer.write_all(&data[..granted]).map_err(RelayEnd::Error)?;
    connection.count(direction, granted);
    if granted < data.len() {
        run.byte_cap_hit.store(true, Ordering::SeqCst);
        return Err(RelayEnd::CapReached);
    }
    Ok(())
}

/// Acts on how one direction ended: passes an orderly close on, or tears
/// the whole connection down.
fn end_direction(
    run: &Run,
    connection: &Connection,
    end: RelayEnd,
    client: &TcpStream,
    upstream: &TcpStream,
    direction: Direction,
) {
    let receiver = match direction {
        Direction::Out => upstream,
        Direction::In => client,
    };
    match end {
        RelayEnd::Eof => {
            let _ = receiver.shutdown(Shutdown::Write);
        }
        RelayEnd::BodyDone => {}
        RelayEnd::CapReached => {
            let (cap, which) = match direction {
                Direction::Out => (run.config.max_bytes_out, "out"),
                Direction::In => (run.config.max_bytes_in, "in"),
            };
            connection.note(&format!("the run's cap of {cap} bytes {which} was reached"));
            shutdown_both(client, upstream);
        }
        RelayEnd::Error(e) => {
            connection.note(&format!("connection error: {e}"));
            shutdown_both(client, upstream);
        }
        RelayEnd::Refused(reason) => {
            connection.deny(&reason);
            shutdown_both(client, upstream);
        }
    }
}

fn shutdown_both(client: &TcpStream, upstream: &TcpStream) {
    let _ = client.shutdown(Shutdown::Both);
    let _ = upstream.shutdown(Shutdown::Both);
}

/// Answers a refused request and closes, giving the client a moment to read
/// the answer before the connection goes.
fn refuse(client: &TcpStream, status: u16, reason: &str) {
    let mut writer = client;
    let _ = client.set_write_timeout(Some(REFUSAL_LINGER));
    let _ = writer.write_all(&refusal_response(status, reason));
    let _ = client.shutdown(Shutdown::Write);
    linger(client);
}

/// Reads and drops what the client still sends, briefly, after the proxy
/// closed its side: closing with unread bytes resets the connection, which
/// can destroy the answer before the client reads it.
fn linger(client: &TcpStream) {
    let mut reader = client;
    let _ = client.set_read_timeout(Some(REFUSAL_LINGER));
    let mut sink = [0u8; 8192];
    let mut drained = 0;
    while drained < 256 * 1024 {
        match reader.read(&mut sink) {
            Ok(0) | Err(_) => break,
            Ok(n) => drained += n,
        }
    }
}

/// Answers a connection refused before it was read, without blocking the
/// thread that accepts.
fn refuse_without_waiting(client: TcpStream, reason: &str) {
    if client.set_nonblocking(true).is_ok() {
        let mut sink = [0u8; 8192];
        let _ = (&client).read(&mut sink);
        let _ = (&client).write_all(&refusal_response(403, reason));
        let _ = client.shutdown(Shutdown::Write);
    }
}

fn refusal_response(status: u16, reason: &str) -> Vec<u8> {
    let phrase = match status {
        400 => "Bad Request",
        403 => "Forbidden",
        408 => "Request Timeout",
        431 => "Request Header Fields Too Large",
        _ => "Bad Gateway",
    };
    let body = format!("airlock proxy: {reason}\n");
    format!(
        "HTTP/1.1 {status} {phrase}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// At most [`MAX_RECORD_TEXT`] bytes of `text`, cut at a character boundary.
fn clip(text: &str) -> String {
    if text.len() <= MAX_RECORD_TEXT {
        return text.to_owned();
    }
    let mut end = MAX_RECORD_TEXT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &text[..end])
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_https_s_port_refuses_plaintext_tunnels() {
        assert!(!plaintext_allowed(443));
        for port in [80, 8080, 8443, 5000] {
            assert!(plaintext_allowed(port), "{port}");
        }
    }
}
