//! Real servers on loopback for the proxy's tests: a plain HTTP server and an
//! HTTPS one with a certificate from a CA made at test time. Each records
//! what reached it, so a test can prove a refused request was never dialled.
// Test scaffolding: a failure here is a failed test, which is what unwrap gives.
#![allow(dead_code, clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use airlock_net::{Proxy, ProxyConfig, ProxyHandle, StaticResolver};
use airlock_policy::{HostRule, NetworkEvent, NetworkVerdict};

/// How long any test socket waits before the test gives up.
pub const PATIENCE: Duration = Duration::from_secs(10);

/// One request as a test server received it.
#[derive(Clone, Debug, Default)]
pub struct Received {
    pub head: String,
    pub body: Vec<u8>,
    /// What arrived on the connection after the request (a smuggled second one).
    pub after: Vec<u8>,
}

/// What reached a test server.
#[derive(Debug, Default)]
pub struct ServerLog {
    pub connections: usize,
    /// Connections the server is done with.
    pub finished: usize,
    /// Raw bytes received, over all connections (TLS records for the HTTPS server).
    pub bytes: u64,
    pub requests: Vec<Received>,
    /// Server names clients asked for in TLS handshakes that completed.
    pub server_names: Vec<Option<String>>,
}

/// A server on 127.0.0.1 that answers `/big/N` with N bytes, `/echo` with
/// the request body, and anything else with `hello from PATH`.
pub struct Server {
    pub addr: SocketAddr,
    pub log: Arc<Mutex<ServerLog>>,
}

impl Server {
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    pub fn connections(&self) -> usize {
        self.log.lock().unwrap().connections
    }

    pub fn requests(&self) -> Vec<Received> {
        self.log.lock().unwrap().requests.clone()
    }

    /// Waits until the server has accepted `connections` connections (the
    /// kernel completes a connection before the server accepts it) and is
    /// done with every one.
    pub fn settle(&self, connections: usize) {
        let started = std::time::Instant::now();
        while started.elapsed() < PATIENCE {
            let log = self.log.lock().unwrap();
            if log.connections >= connections && log.finished == log.connections {
                return;
            }
            drop(log);
            thread::sleep(Duration::from_millis(5));
        }
        panic!("the test server still has open connections after {PATIENCE:?}");
    }

    /// A plain HTTP server.
    pub fn http() -> Server {
        Server::start("127.0.0.1:0", None)
    }

    /// A plain HTTP server on IPv6 loopback.
    pub fn http_v6() -> Server {
        Server::start("[::1]:0", None)
    }

    /// An HTTPS server presenting `ca`'s leaf certificate.
    pub fn https(ca: &TestCa) -> Server {
        Server::start("127.0.0.1:0", Some(Arc::new(ca.server_config())))
    }

    fn start(bind: &str, tls: Option<Arc<rustls::ServerConfig>>) -> Server {
        let listener = TcpListener::bind(bind).unwrap();
        let addr = listener.local_addr().unwrap();
        let log = Arc::new(Mutex::new(ServerLog::default()));
        let server_log = Arc::clone(&log);
        thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                server_log.lock().unwrap().connections += 1;
                let log = Arc::clone(&server_log);
                let tls = tls.clone();
                thread::spawn(move || {
                    serve_one(stream, tls, &log);
                    log.lock().unwrap().finished += 1;
                });
            }
        });
        Server { addr, log }
    }
}

/// Counts the raw bytes a connection delivers.
struct Counting {
    stream: TcpStream,
    log: Arc<Mutex<ServerLog>>,
}

impl Read for Counting {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.stream.read(buf)?;
        self.log.lock().unwrap().bytes += n as u64;
        Ok(n)
    }
}

impl Write for Counting {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.stream.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.stream.flush()
    }
}

fn serve_one(stream: TcpStream, tls: Option<Arc<rustls::ServerConfig>>, log: &Arc<Mutex<ServerLog>>) {
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    let raw = Counting { stream: stream.try_clone().unwrap(), log: Arc::clone(log) };
    match tls {
        None => {
            let mut raw = raw;
            if let Some(received) = answer(&mut raw) {
                let _ = stream.shutdown(Shutdown::Write);
                let mut received = received;
                let _ = raw.read_to_end(&mut received.after);
                log.lock().unwrap().requests.push(received);
            }
        }
        Some(config) => {
            let connection = rustls::ServerConnection::new(config).unwrap();
            let mut tls = rustls::StreamOwned::new(connection, raw);
            if let Some(received) = answer(&mut tls) {
                let name = tls.conn.server_name().map(str::to_owned);
                tls.conn.send_close_notify();
                let _ = tls.flush();
                let mut log = log.lock().unwrap();
                log.server_names.push(name);
                log.requests.push(received);
            }
        }
    }
}

/// Reads one request from `stream` and answers it.
fn answer(stream: &mut impl ReadWrite) -> Option<Received> {
    let mut data = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(at) = find(&data, b"\r\n\r\n") {
            break at + 4;
        }
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => return None,
            Ok(n) => data.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&data[..head_end]).into_owned();
    let lower = head.to_ascii_lowercase();
    let mut body = data[head_end..].to_vec();
    if let Some(length) = header(&lower, "content-length") {
        let length: usize = length.parse().unwrap();
        while body.len() < length {
            match stream.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => body.extend_from_slice(&chunk[..n]),
            }
        }
    } else if header(&lower, "transfer-encoding").is_some() {
        // Ends at the last chunk and its (possibly non-empty) trailer.
        while !(body.ends_with(b"\r\n\r\n") && (body.starts_with(b"0\r\n") || find(&body, b"\r\n0\r\n").is_some())) {
            match stream.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => body.extend_from_slice(&chunk[..n]),
            }
        }
    }
    let path = head.split(' ').nth(1).unwrap_or("/").to_owned();
    let reply: Vec<u8> = if let Some(size) = path.strip_prefix("/big/") {
        vec![b'x'; size.parse().unwrap()]
    } else if path == "/echo" {
        body.clone()
    } else {
        format!("hello from {path}").into_bytes()
    };
    let _ = stream.write_all(
        format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", reply.len()).as_bytes(),
    );
    let _ = stream.write_all(&reply);
    let _ = stream.flush();
    Some(Received { head, body, after: Vec::new() })
}

pub trait ReadWrite: Read + Write {}
impl<T: Read + Write> ReadWrite for T {}

fn header<'a>(lower_head: &'a str, name: &str) -> Option<&'a str> {
    lower_head.lines().find_map(|line| line.strip_prefix(name)?.strip_prefix(':').map(str::trim))
}

pub fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// A CA made for one test run, and a server certificate it signed for
/// `localhost`, `service.test` and 127.0.0.1.
pub struct TestCa {
    ca_der: rustls::pki_types::CertificateDer<'static>,
    leaf_der: rustls::pki_types::CertificateDer<'static>,
    leaf_key_der: Vec<u8>,
    pub dir: tempfile::TempDir,
}

impl TestCa {
    pub fn new() -> TestCa {
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params.distinguished_name.push(rcgen::DnType::CommonName, "airlock test CA");
        ca_params.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign, rcgen::KeyUsagePurpose::DigitalSignature];
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let ca_cert = ca_params.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca_params, ca_key);

        let mut leaf_params = rcgen::CertificateParams::new(vec![
            "localhost".to_owned(),
            "service.test".to_owned(),
            "127.0.0.1".to_owned(),
        ])
        .unwrap();
        leaf_params.distinguished_name.push(rcgen::DnType::CommonName, "localhost");
        leaf_params.use_authority_key_identifier_extension = true;
        leaf_params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        let leaf_key = rcgen::KeyPair::generate().unwrap();
        let leaf = leaf_params.signed_by(&leaf_key, &issuer).unwrap();

        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.pem"), ca_cert.pem()).unwrap();
        TestCa {
            ca_der: ca_cert.der().clone(),
            leaf_der: leaf.der().clone(),
            leaf_key_der: leaf_key.serialize_der(),
            dir,
        }
    }

    /// The CA certificate as a PEM file, for SSL_CERT_FILE and REQUESTS_CA_BUNDLE.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    fn server_config(&self) -> rustls::ServerConfig {
        let key = rustls::pki_types::PrivateKeyDer::Pkcs8(self.leaf_key_der.clone().into());
        rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(vec![self.leaf_der.clone()], key)
            .unwrap()
    }

    /// A client that trusts only this CA.
    pub fn client_config(&self) -> Arc<rustls::ClientConfig> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.ca_der.clone()).unwrap();
        Arc::new(rustls::ClientConfig::builder().with_root_certificates(roots).with_no_client_auth())
    }
}

/// Caps for a test proxy; generous unless a test is about them.
pub struct Caps {
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub connections: u32,
    pub head_timeout: Duration,
}

impl Default for Caps {
    fn default() -> Caps {
        Caps { bytes_in: 1 << 30, bytes_out: 1 << 30, connections: 64, head_timeout: Duration::from_secs(5) }
    }
}

/// A proxy on a fresh loopback listener, with these rules and names.
pub fn start_proxy(rules: &[String], resolver: Arc<StaticResolver>, caps: Caps) -> (ProxyHandle, SocketAddr) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let config = ProxyConfig {
        rules: rules.iter().map(|r| HostRule::parse(r).unwrap()).collect(),
        max_bytes_in: caps.bytes_in,
        max_bytes_out: caps.bytes_out,
        max_connections: caps.connections,
        resolver,
        head_timeout: caps.head_timeout,
        connect_timeout: Duration::from_secs(5),
    };
    (Proxy::start(listener, config).unwrap(), addr)
}

/// Sends `request` to the proxy and returns everything it answers until it closes.
pub fn exchange(proxy: SocketAddr, request: &[u8]) -> String {
    let mut stream = TcpStream::connect(proxy).unwrap();
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    // A proxy that refuses early may reset the connection before all is sent.
    let _ = stream.write_all(request);
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    String::from_utf8_lossy(&answer).into_owned()
}

/// Opens a CONNECT tunnel and returns the stream and the proxy's answer head.
pub fn connect(proxy: SocketAddr, target: &str, extra_headers: &str) -> (TcpStream, String) {
    let mut stream = TcpStream::connect(proxy).unwrap();
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    stream.write_all(format!("CONNECT {target} HTTP/1.1\r\n{extra_headers}\r\n").as_bytes()).unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => break,
        }
    }
    (stream, String::from_utf8_lossy(&head).into_owned())
}

/// GET `path` over TLS through an open tunnel, naming `server_name` in the
/// handshake; the body on success, the TLS or I/O error otherwise.
pub fn https_get(
    tunnel: TcpStream,
    config: Arc<rustls::ClientConfig>,
    server_name: &str,
    path: &str,
) -> Result<String, String> {
    let name = rustls::pki_types::ServerName::try_from(server_name.to_owned()).unwrap();
    let connection = rustls::ClientConnection::new(config, name).unwrap();
    let mut tls = rustls::StreamOwned::new(connection, tunnel);
    tls.write_all(format!("GET {path} HTTP/1.1\r\nHost: {server_name}\r\nConnection: close\r\n\r\n").as_bytes())
        .map_err(|e| e.to_string())?;
    let mut answer = Vec::new();
    match tls.read_to_end(&mut answer) {
        Ok(_) => Ok(String::from_utf8_lossy(&answer).into_owned()),
        // A server that closes without close_notify still answered in full.
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !answer.is_empty() => {
            Ok(String::from_utf8_lossy(&answer).into_owned())
        }
        Err(e) => Err(e.to_string()),
    }
}

/// The status code of an HTTP answer, 0 if there is none.
pub fn status(answer: &str) -> u16 {
    answer.split(' ').nth(1).and_then(|code| code.parse().ok()).unwrap_or(0)
}

pub fn allowed(events: &[NetworkEvent]) -> Vec<&NetworkEvent> {
    events.iter().filter(|e| e.verdict == NetworkVerdict::Allowed).collect()
}

/// A keep-alive HTTP/1.1 server on loopback that reads request heads only
/// (its handlers ignore bodies, as Python's `BaseHTTPRequestHandler`'s do
/// unless they read one) and answers each with the host and path it was
/// asked for, until a request says `Connection: close`. Returns its port and
/// the answers it gave.
pub fn server_that_ignores_bodies() -> (u16, Arc<Mutex<Vec<String>>>) {
    serve_each_logging(|mut stream, log| {
        let mut data = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            let Some(end) = find(&data, b"\r\n\r\n") else {
                match stream.read(&mut chunk) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => data.extend_from_slice(&chunk[..n]),
                }
                continue;
            };
            let head = String::from_utf8_lossy(&data[..end]).into_owned();
            data.drain(..end + 4);
            let path = head.split(' ').nth(1).unwrap_or("").to_owned();
            let host = head.lines().find_map(|l| l.strip_prefix("Host: ")).unwrap_or("").to_owned();
            let text = format!("you asked {host} for {path}");
            log.lock().unwrap().push(text.clone());
            let close = head.to_ascii_lowercase().contains("connection: close");
            let answer = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{text}", text.len());
            if stream.write_all(answer.as_bytes()).is_err() || close {
                break;
            }
        }
    })
}

/// A server on 127.0.0.1 that hands each connection to `handle`, with a log
/// it keeps; returns its port and the log.
fn serve_each_logging(
    handle: impl Fn(TcpStream, &Mutex<Vec<String>>) + Send + 'static,
) -> (u16, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let log = Arc::new(Mutex::new(Vec::new()));
    let kept = Arc::clone(&log);
    thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            stream.set_read_timeout(Some(PATIENCE)).unwrap();
            handle(stream, &kept);
        }
    });
    (port, log)
}

/// A ClientHello for no server name (a tunnel to an IP), which the proxy
/// reads as TLS, with `random` as its random field.
pub fn client_hello(random: &[u8; 32]) -> Vec<u8> {
    let mut body = vec![3, 3];
    body.extend(random);
    body.extend([0, 0, 2, 0x13, 0x01, 1, 0]); // no session id, one suite, no compression
    let mut handshake = vec![1, 0, 0, body.len() as u8];
    handshake.extend(body);
    let mut record = vec![22, 3, 1, 0, handshake.len() as u8];
    record.extend(handshake);
    record
}

/// What [`line_service`] sends first when asked to speak first.
pub const BANNER: &str = "220 service ready\r\n";

/// A line-based service on loopback (a cache's, a mail server's) on a port
/// an operator allowed: it answers each line it reads, after [`BANNER`] if
/// it `speaks_first`. Returns its address (`127.0.0.1:PORT`) and the lines
/// it read.
pub fn line_service(speaks_first: bool) -> (String, Arc<Mutex<Vec<String>>>) {
    let (port, lines) = serve_each_logging(move |mut stream, log| {
        if speaks_first {
            let _ = stream.write_all(BANNER.as_bytes());
        }
        let mut reader = std::io::BufReader::new(stream.try_clone().unwrap());
        let mut line = Vec::new();
        while std::io::BufRead::read_until(&mut reader, b'\n', &mut line).is_ok_and(|n| n > 0) {
            let text = String::from_utf8_lossy(&line).trim_end().to_owned();
            log.lock().unwrap().push(text.clone());
            let _ = stream.write_all(format!("+OK {text}\r\n").as_bytes());
            line.clear();
        }
    });
    (format!("127.0.0.1:{port}"), lines)
}
