//! The `/metrics` endpoint: a deliberately tiny HTTP/1.1 server off the data
//! path. It answers `GET /metrics` with the text the server renders,
//! `GET /healthz` (the process is up: 200) and `GET /readyz` (200 once
//! recovery is done and no shard is poisoned, else 503), 404 for other
//! paths, 405 for other methods, and closes the connection after every
//! answer. It is read-only: nothing it serves changes the server.
//!
//! When the server has a password, `/metrics` must carry it as HTTP Basic
//! authentication (any user name; Prometheus `basic_auth.password`), else
//! 401; `/healthz` and `/readyz` say only "up" / "ready" and need none. With
//! `server.tls_metrics` it speaks HTTPS (rustls over the blocking socket).
//!
//! The endpoint starts before recovery (so `/readyz` can say "not yet");
//! until [`MetricsServer::serve_pages`] hands it the server's pages,
//! `/metrics` and `/readyz` answer 503.
//!
//! What must hold: a scraper can never hurt the server, and no scraper can
//! stop another from being answered. One accept thread hands each
//! connection to a thread of its own; at most [`CONNECTIONS_MAX`] are served
//! at once (more wait in the listen backlog); each one is done within
//! [`CONNECTION_TIME_MAX`] (its request head within
//! [`REQUEST_READ_TIMEOUT`], at most [`REQUEST_HEAD_BYTES_MAX`] bytes), so a
//! slow client frees its slot in bounded time; a wrong password waits
//! `server.auth_failure_delay` on its own connection's thread only. The
//! accept thread stops within one poll interval of [`MetricsServer::stop`];
//! connection threads end within their deadline.

use rustix::event::{poll, PollFd, PollFlags, Timespec};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crate::auth::{Authenticator, Verdict};
use crate::tls::TlsConfig;

/// Who may scrape, and over what.
#[derive(Debug, Clone)]
pub struct MetricsAccess {
    /// The server's password check (HTTP Basic when a password is set).
    pub auth: Arc<Authenticator>,
    /// HTTPS when set.
    pub tls: Option<Arc<TlsConfig>>,
}

impl MetricsAccess {
    /// Plain HTTP, no password.
    pub fn open() -> MetricsAccess {
        MetricsAccess {
            auth: Arc::new(Authenticator::open()),
            tls: None,
        }
    }
}

/// What a running server serves on the endpoint.
pub trait Pages: Send + Sync {
    /// The Prometheus text exposition.
    fn metrics(&self) -> String;
    /// `Err(why)` when the server should get no traffic (a poisoned shard,
    /// shutting down).
    fn readiness(&self) -> Result<(), String>;
}

/// Pages from two closures (tests, and servers that need no more).
pub struct FnPages<M, R> {
    pub metrics: M,
    pub readiness: R,
}

impl<M, R> Pages for FnPages<M, R>
where
    M: Fn() -> String + Send + Sync,
    R: Fn() -> Result<(), String> + Send + Sync,
{
    fn metrics(&self) -> String {
        (self.metrics)()
    }
    fn readiness(&self) -> Result<(), String> {
        (self.readiness)()
    }
}

/// Largest request head read; anything longer is answered 431 and closed.
pub const REQUEST_HEAD_BYTES_MAX: usize = 8 * 1024;
/// How long a client may take to send its request head (TLS handshake
/// included).
pub const REQUEST_READ_TIMEOUT: Duration = Duration::from_secs(2);
/// How long one connection may take from accept to the last byte of its
/// answer; a client that reads the answer slower is cut off.
pub const CONNECTION_TIME_MAX: Duration = Duration::from_secs(10);
/// Connections served at once; more wait in the listen backlog until one
/// ends (each ends within [`CONNECTION_TIME_MAX`]).
pub const CONNECTIONS_MAX: usize = 128;
/// Stack of a connection thread (it parses a head and writes a page that
/// lives on the heap).
const CONNECTION_STACK_BYTES: usize = 256 * 1024;
/// How often the accept loop checks whether it should stop.
const POLL_INTERVAL: Timespec = Timespec {
    tv_sec: 0,
    tv_nsec: 100_000_000,
};

/// The pages, once the server has them (shared with connection threads).
type PagesSlot = Arc<OnceLock<Box<dyn Pages>>>;

/// The running endpoint; dropping it stops the accept thread (as
/// [`MetricsServer::stop`]).
pub struct MetricsServer {
    local_addr: SocketAddr,
    stop: Arc<AtomicBool>,
    pages: PagesSlot,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for MetricsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsServer")
            .field("local_addr", &self.local_addr)
            .field("serving", &self.pages.get().is_some())
            .finish_non_exhaustive()
    }
}

impl MetricsServer {
    /// Binds `addr` and starts the endpoint thread. Until
    /// [`MetricsServer::serve_pages`], `/metrics` and `/readyz` answer 503
    /// (the server is loading).
    pub fn start(addr: SocketAddr, access: MetricsAccess) -> io::Result<MetricsServer> {
        let listener = TcpListener::bind(addr)?;
        let local_addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let pages: PagesSlot = Arc::new(OnceLock::new());
        let thread_stop = Arc::clone(&stop);
        let thread_pages = Arc::clone(&pages);
        let thread = std::thread::Builder::new()
            .name("ringkv-metrics".to_string())
            .spawn(move || serve(listener, &thread_stop, access, thread_pages))?;
        Ok(MetricsServer {
            local_addr,
            stop,
            pages,
            thread: Some(thread),
        })
    }

    /// Starts serving `pages` (the server is up): `/metrics` renders them
    /// and `/readyz` asks them. Only the first call has an effect.
    pub fn serve_pages(&self, pages: Box<dyn Pages>) {
        let _ = self.pages.set(pages);
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops accepting and waits for the accept thread to finish.
    pub fn stop(mut self) {
        self.stop_inner();
    }

    fn stop_inner(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                tracing::warn!("the metrics endpoint thread panicked");
            }
        }
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop_inner();
    }
}

fn serve(listener: TcpListener, stop: &AtomicBool, access: MetricsAccess, pages: PagesSlot) {
    let busy = Arc::new(AtomicUsize::new(0));
    while !stop.load(Ordering::Acquire) {
        if busy.load(Ordering::Acquire) >= CONNECTIONS_MAX {
            // Full: newcomers wait in the backlog until a slot frees.
            std::thread::sleep(Duration::from_millis(10));
            continue;
        }
        let mut fds = [PollFd::new(&listener, PollFlags::IN)];
        let ready = poll(&mut fds, Some(&POLL_INTERVAL)).unwrap_or(0);
        if ready == 0 {
            continue;
        }
        match listener.accept() {
            Ok((stream, peer)) => {
                busy.fetch_add(1, Ordering::AcqRel);
                let slot = Slot(Arc::clone(&busy));
                let access = access.clone();
                let pages = Arc::clone(&pages);
                let spawned = std::thread::Builder::new()
                    .name("ringkv-metrics-conn".to_string())
                    .stack_size(CONNECTION_STACK_BYTES)
                    .spawn(move || {
                        let _slot = slot;
                        if let Err(e) = answer(stream, &access, &pages) {
                            tracing::debug!(%peer, error = %e, "metrics request failed");
                        }
                    });
                if let Err(e) = spawned {
                    // The closure (and so the stream and the slot) is dropped.
                    tracing::warn!(%peer, error = %e, "cannot start a metrics connection thread");
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, "metrics accept failed");
                // EMFILE and friends: back off instead of spinning.
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// One of the [`CONNECTIONS_MAX`] connection slots, freed on drop.
struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A socket whose every read and write waits at most until `deadline`.
struct Deadlined {
    stream: TcpStream,
    deadline: Instant,
}

impl Deadlined {
    fn remaining(&self) -> io::Result<Duration> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the connection's time is up",
            ));
        }
        Ok(left)
    }
}

impl Read for Deadlined {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.remaining()?;
        self.stream.set_read_timeout(Some(left))?;
        self.stream.read(buf)
    }
}

impl Write for Deadlined {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let left = self.remaining()?;
        self.stream.set_write_timeout(Some(left))?;
        self.stream.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.stream.flush()
    }
}

/// What the request head asked for.
#[derive(Debug, PartialEq, Eq)]
enum Parsed {
    /// `GET /metrics`, with the password of its Basic credentials, if any.
    Metrics {
        password: Option<Vec<u8>>,
    },
    Healthz,
    Readyz,
    NotFound,
    MethodNotAllowed,
    Bad,
    TooLarge,
}

/// An answer: status line, content type, body.
type Answer = (&'static str, &'static str, String);

const LOADING: &str = "loading: recovery has not finished\n";

fn answer(stream: TcpStream, access: &MetricsAccess, pages: &PagesSlot) -> io::Result<()> {
    let accepted = Instant::now();
    let mut head_stream = Deadlined {
        stream,
        deadline: accepted + REQUEST_READ_TIMEOUT,
    };
    let mut tls = match &access.tls {
        None => None,
        Some(tls) => Some(rustls::ServerConnection::new(tls.current()).map_err(io::Error::other)?),
    };
    let parsed = match &mut tls {
        None => read_head(&mut head_stream)?,
        Some(conn) => read_head(&mut rustls::Stream::new(conn, &mut head_stream))?,
    };
    let mut unauthorized = false;
    let (status, content_type, body): Answer = match parsed {
        Parsed::Metrics { password } => match access.auth.check(password.as_deref()) {
            Verdict::Accepted => match pages.get() {
                Some(p) => (
                    "200 OK",
                    "text/plain; version=0.0.4; charset=utf-8",
                    p.metrics(),
                ),
                None => ("503 Service Unavailable", "text/plain", LOADING.into()),
            },
            verdict => {
                if verdict == Verdict::WrongPassword {
                    // Only this connection's thread waits.
                    std::thread::sleep(access.auth.failure_delay());
                }
                unauthorized = true;
                (
                    "401 Unauthorized",
                    "text/plain",
                    "the password is missing or wrong; send it as HTTP Basic authentication (any user name)\n"
                        .into(),
                )
            }
        },
        Parsed::Healthz => ("200 OK", "text/plain", "up\n".into()),
        Parsed::Readyz => match pages.get().map(|p| p.readiness()) {
            Some(Ok(())) => ("200 OK", "text/plain", "ready\n".into()),
            Some(Err(why)) => (
                "503 Service Unavailable",
                "text/plain",
                format!("not ready: {why}\n"),
            ),
            None => ("503 Service Unavailable", "text/plain", LOADING.into()),
        },
        Parsed::NotFound => (
            "404 Not Found",
            "text/plain",
            "not found; try /metrics, /healthz or /readyz\n".into(),
        ),
        Parsed::MethodNotAllowed => (
            "405 Method Not Allowed",
            "text/plain",
            "only GET is served\n".into(),
        ),
        Parsed::Bad => ("400 Bad Request", "text/plain", "bad request\n".into()),
        Parsed::TooLarge => (
            "431 Request Header Fields Too Large",
            "text/plain",
            "request head too large\n".into(),
        ),
    };
    let challenge = if unauthorized {
        "WWW-Authenticate: Basic realm=\"ringkv\"\r\n"
    } else {
        ""
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n{challenge}Connection: close\r\n\r\n",
        body.len()
    );
    let mut out = head.into_bytes();
    out.extend_from_slice(body.as_bytes());
    head_stream.deadline = accepted + CONNECTION_TIME_MAX;
    match &mut tls {
        None => {
            head_stream.write_all(&out)?;
            head_stream.flush()
        }
        Some(conn) => {
            let mut s = rustls::Stream::new(conn, &mut head_stream);
            s.write_all(&out)?;
            s.flush()?;
            conn.send_close_notify();
            while conn.wants_write() {
                conn.write_tls(&mut head_stream)?;
            }
            Ok(())
        }
    }
}

fn read_head(stream: &mut dyn Read) -> io::Result<Parsed> {
    let deadline = Instant::now() + REQUEST_READ_TIMEOUT;
    let mut head = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    loop {
        if let Some(end) = find_head_end(&head) {
            return Ok(parse_head(&head[..end]));
        }
        if head.len() >= REQUEST_HEAD_BYTES_MAX {
            return Ok(Parsed::TooLarge);
        }
        if Instant::now() >= deadline {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "request head not received in time",
            ));
        }
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "peer closed before the request head ended",
            ));
        }
        head.extend_from_slice(&chunk[..n]);
    }
}

fn find_head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n")
}

fn parse_head(head: &[u8]) -> Parsed {
    let Ok(text) = std::str::from_utf8(head) else {
        return Parsed::Bad;
    };
    let request_line = text.split("\r\n").next().unwrap_or("");
    let mut parts = request_line.split(' ');
    let (Some(method), Some(target), Some(version)) = (parts.next(), parts.next(), parts.next())
    else {
        return Parsed::Bad;
    };
    if parts.next().is_some() || !version.starts_with("HTTP/1.") {
        return Parsed::Bad;
    }
    if method != "GET" {
        return Parsed::MethodNotAllowed;
    }
    match target.split('?').next().unwrap_or("") {
        "/metrics" => {}
        "/healthz" => return Parsed::Healthz,
        "/readyz" => return Parsed::Readyz,
        _ => return Parsed::NotFound,
    }
    let password = text
        .split("\r\n")
        .skip(1)
        .filter_map(|line| line.split_once(':'))
        .find(|(name, _)| name.trim().eq_ignore_ascii_case("authorization"))
        .and_then(|(_, value)| basic_password(value.trim()));
    Parsed::Metrics { password }
}

/// The password of an HTTP Basic credential (`Basic base64(user:password)`).
fn basic_password(value: &str) -> Option<Vec<u8>> {
    let (scheme, encoded) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64_decode(encoded.trim())?;
    let colon = decoded.iter().position(|&b| b == b':')?;
    Some(decoded[colon + 1..].to_vec())
}

/// Standard base64 (RFC 4648, with or without `=` padding); `None` if invalid.
fn base64_decode(text: &str) -> Option<Vec<u8>> {
    fn value(c: u8) -> Option<u32> {
        match c {
            b'A'..=b'Z' => Some(u32::from(c - b'A')),
            b'a'..=b'z' => Some(u32::from(c - b'a') + 26),
            b'0'..=b'9' => Some(u32::from(c - b'0') + 52),
            b'+' => Some(62),
            b'/' => Some(63),
            _ => None,
        }
    }
    let bytes = text.trim_end_matches('=').as_bytes();
    if bytes.len() % 4 == 1 {
        return None;
    }
    let mut out = Vec::with_capacity(bytes.len() * 3 / 4);
    for chunk in bytes.chunks(4) {
        let mut acc = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            acc |= value(c)? << (18 - 6 * i);
        }
        let produced = chunk.len() - 1;
        for i in 0..produced {
            out.push((acc >> (16 - 8 * i)) as u8);
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_request_lines() {
        let plain = Parsed::Metrics { password: None };
        assert_eq!(parse_head(b"GET /metrics HTTP/1.1\r\nHost: x"), plain);
        assert_eq!(parse_head(b"GET /metrics?x=1 HTTP/1.0"), plain);
        // "scraper:s3cr:et" in base64.
        assert_eq!(
            parse_head(
                b"GET /metrics HTTP/1.1\r\nauthorization:  Basic c2NyYXBlcjpzM2NyOmV0\r\nHost: x"
            ),
            Parsed::Metrics {
                password: Some(b"s3cr:et".to_vec())
            }
        );
        assert_eq!(
            parse_head(b"GET /metrics HTTP/1.1\r\nAuthorization: Bearer abc"),
            plain
        );
        assert_eq!(parse_head(b"GET / HTTP/1.1"), Parsed::NotFound);
        assert_eq!(parse_head(b"GET /healthz HTTP/1.1"), Parsed::Healthz);
        assert_eq!(parse_head(b"GET /readyz HTTP/1.0"), Parsed::Readyz);
        assert_eq!(
            parse_head(b"POST /metrics HTTP/1.1"),
            Parsed::MethodNotAllowed
        );
        assert_eq!(parse_head(b"GET /metrics"), Parsed::Bad);
        assert_eq!(parse_head(b"\xff\xfe"), Parsed::Bad);
        assert_eq!(parse_head(b"GET /metrics SPDY/3"), Parsed::Bad);
    }

    fn fetch(addr: SocketAddr, request: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(request).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    fn start_serving(
        access: MetricsAccess,
        metrics: impl Fn() -> String + Send + Sync + 'static,
    ) -> MetricsServer {
        let server = MetricsServer::start("127.0.0.1:0".parse().unwrap(), access).unwrap();
        server.serve_pages(Box::new(FnPages {
            metrics,
            readiness: || Ok(()),
        }));
        server
    }

    #[test]
    fn health_and_readiness_follow_the_pages() {
        let server =
            MetricsServer::start("127.0.0.1:0".parse().unwrap(), MetricsAccess::open()).unwrap();
        let addr = server.local_addr();
        let get = |path: &str| fetch(addr, format!("GET {path} HTTP/1.1\r\n\r\n").as_bytes());
        // Loading: up, not ready, no metrics yet.
        assert!(get("/healthz").starts_with("HTTP/1.1 200 "));
        let loading = get("/readyz");
        assert!(loading.starts_with("HTTP/1.1 503 "), "{loading}");
        assert!(loading.ends_with(LOADING), "{loading}");
        assert!(get("/metrics").starts_with("HTTP/1.1 503 "));
        let poisoned = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&poisoned);
        server.serve_pages(Box::new(FnPages {
            metrics: || "m 1\n".to_string(),
            readiness: move || {
                if flag.load(Ordering::Relaxed) {
                    Err("shard 0 is poisoned".to_string())
                } else {
                    Ok(())
                }
            },
        }));
        assert!(get("/readyz").starts_with("HTTP/1.1 200 "));
        assert!(get("/metrics").ends_with("\r\n\r\nm 1\n"));
        poisoned.store(true, Ordering::Relaxed);
        let sick = get("/readyz");
        assert!(sick.starts_with("HTTP/1.1 503 "), "{sick}");
        assert!(sick.contains("shard 0 is poisoned"), "{sick}");
        assert!(get("/healthz").starts_with("HTTP/1.1 200 "));
        assert!(get("/readyz?verbose").starts_with("HTTP/1.1 503 "));
        server.stop();
    }

    #[test]
    fn base64_decodes_with_and_without_padding() {
        assert_eq!(base64_decode("").unwrap(), b"");
        assert_eq!(base64_decode("YQ==").unwrap(), b"a");
        assert_eq!(base64_decode("YWI").unwrap(), b"ab");
        assert_eq!(base64_decode("YWJj").unwrap(), b"abc");
        assert_eq!(base64_decode("Ojo/Pz4+").unwrap(), b"::??>>");
        assert_eq!(base64_decode("YWJjZA").unwrap(), b"abcd");
        assert!(base64_decode("Y").is_none());
        assert!(base64_decode("a*b=").is_none());
    }

    #[test]
    fn a_password_guards_the_metrics() {
        let auth = Authenticator::new(
            Some(crate::auth::Password::new(b"pw", "test").unwrap()),
            Duration::ZERO,
        );
        let access = MetricsAccess {
            auth: Arc::new(auth),
            tls: None,
        };
        let auth = Arc::clone(&access.auth);
        let server = start_serving(access, || "x 1\n".into());
        let addr = server.local_addr();
        let none = fetch(addr, b"GET /metrics HTTP/1.1\r\n\r\n");
        assert!(none.starts_with("HTTP/1.1 401 "), "{none}");
        assert!(none.contains("WWW-Authenticate: Basic"), "{none}");
        // "u:nope" and "u:pw".
        let wrong = fetch(
            addr,
            b"GET /metrics HTTP/1.1\r\nAuthorization: Basic dTpub3Bl\r\n\r\n",
        );
        assert!(wrong.starts_with("HTTP/1.1 401 "), "{wrong}");
        assert!(!wrong.contains("x 1"), "{wrong}");
        let right = fetch(
            addr,
            b"GET /metrics HTTP/1.1\r\nAuthorization: Basic dTpwdw==\r\n\r\n",
        );
        assert!(right.starts_with("HTTP/1.1 200 "), "{right}");
        assert!(right.ends_with("x 1\n"), "{right}");
        assert_eq!((auth.failures(), auth.successes()), (2, 1));
        server.stop();
    }

    #[test]
    fn serves_metrics_and_404_then_stops() {
        let server = start_serving(MetricsAccess::open(), || "a_total 1\n".to_string());
        let addr = server.local_addr();
        let ok = fetch(addr, b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n");
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
        assert!(ok.contains("Content-Length: 10\r\n"), "{ok}");
        assert!(ok.ends_with("\r\n\r\na_total 1\n"), "{ok}");
        let missing = fetch(addr, b"GET /nope HTTP/1.1\r\n\r\n");
        assert!(missing.starts_with("HTTP/1.1 404 "), "{missing}");
        let huge = vec![b'a'; REQUEST_HEAD_BYTES_MAX];
        let too_large = fetch(addr, &huge);
        assert!(too_large.starts_with("HTTP/1.1 431 "), "{too_large}");
        server.stop();
        assert!(TcpStream::connect(addr).is_err());
    }
}
