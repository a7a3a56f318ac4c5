//! The `/metrics` endpoint: a deliberately tiny HTTP/1.1 server on one plain
//! std thread, off the data path. It answers `GET /metrics` with the text the
//! caller renders, 404 for other paths, 405 for other methods, and closes the
//! connection after every answer. It is read-only: nothing it serves changes
//! the server.
//!
//! When the server has a password, a scrape must carry it as HTTP Basic
//! authentication (any user name; Prometheus `basic_auth.password`), else
//! 401. With `server.tls_metrics` it speaks HTTPS (rustls over the blocking
//! socket).
//!
//! What must hold: a scraper can never hurt the server. Requests are read with
//! a deadline and a byte bound, one connection at a time, and the thread stops
//! within one poll interval of [`MetricsServer::stop`].

use rustix::event::{poll, PollFd, PollFlags, Timespec};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
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

/// A blocking byte stream: the socket, or TLS over it.
trait Duplex: Read + Write {}
impl<T: Read + Write> Duplex for T {}

/// Largest request head read; anything longer is answered 431 and closed.
pub const REQUEST_HEAD_BYTES_MAX: usize = 8 * 1024;
/// How long a client may take to send its request head.
pub const REQUEST_READ_TIMEOUT: Duration = Duration::from_secs(2);
/// How often the accept loop checks whether it should stop.
const POLL_INTERVAL: Timespec = Timespec {
    tv_sec: 0,
    tv_nsec: 100_000_000,
};

/// The running endpoint; dropping it without [`MetricsServer::stop`] leaves
/// the thread running until the process ends.
#[derive(Debug)]
pub struct MetricsServer {
    local_addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl MetricsServer {
    /// Binds `addr` and starts the endpoint thread. `render` produces the
    /// Prometheus text exposition for each scrape.
    pub fn start(
        addr: SocketAddr,
        access: MetricsAccess,
        render: impl Fn() -> String + Send + 'static,
    ) -> io::Result<MetricsServer> {
        let listener = TcpListener::bind(addr)?;
        let local_addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let thread_stop = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("ringkv-metrics".to_string())
            .spawn(move || serve(listener, &thread_stop, &access, &render))?;
        Ok(MetricsServer {
            local_addr,
            stop,
            thread: Some(thread),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops accepting and waits for the thread to finish.
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                tracing::warn!("the metrics endpoint thread panicked");
            }
        }
    }
}

fn serve(
    listener: TcpListener,
    stop: &AtomicBool,
    access: &MetricsAccess,
    render: &dyn Fn() -> String,
) {
    while !stop.load(Ordering::Acquire) {
        let mut fds = [PollFd::new(&listener, PollFlags::IN)];
        let ready = poll(&mut fds, Some(&POLL_INTERVAL)).unwrap_or(0);
        if ready == 0 {
            continue;
        }
        match listener.accept() {
            Ok((stream, peer)) => {
                if let Err(e) = answer(stream, access, render) {
                    tracing::debug!(%peer, error = %e, "metrics request failed");
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

/// What the request head asked for.
#[derive(Debug, PartialEq, Eq)]
enum Parsed {
    /// `GET /metrics`, with the password of its Basic credentials, if any.
    Metrics {
        password: Option<Vec<u8>>,
    },
    NotFound,
    MethodNotAllowed,
    Bad,
    TooLarge,
}

fn answer(
    stream: TcpStream,
    access: &MetricsAccess,
    render: &dyn Fn() -> String,
) -> io::Result<()> {
    stream.set_write_timeout(Some(REQUEST_READ_TIMEOUT))?;
    // Each read waits at most this; read_head also bounds the whole head.
    stream.set_read_timeout(Some(REQUEST_READ_TIMEOUT))?;
    let mut stream: Box<dyn Duplex> = match &access.tls {
        None => Box::new(stream),
        Some(tls) => {
            let conn = rustls::ServerConnection::new(tls.current()).map_err(io::Error::other)?;
            Box::new(rustls::StreamOwned::new(conn, stream))
        }
    };
    let parsed = read_head(&mut *stream)?;
    let mut unauthorized = false;
    let (status, content_type, body) = match parsed {
        Parsed::Metrics { password } => match access.auth.check(password.as_deref()) {
            Verdict::Accepted => (
                "200 OK",
                "text/plain; version=0.0.4; charset=utf-8",
                render(),
            ),
            verdict => {
                if verdict == Verdict::WrongPassword {
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
        Parsed::NotFound => (
            "404 Not Found",
            "text/plain",
            "not found; try /metrics\n".into(),
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
    stream.write_all(head.as_bytes())?;
    stream.write_all(body.as_bytes())?;
    stream.flush()
}

fn read_head(stream: &mut dyn Duplex) -> io::Result<Parsed> {
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
    let path = target.split('?').next().unwrap_or("");
    if path != "/metrics" {
        return Parsed::NotFound;
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
        let server =
            MetricsServer::start("127.0.0.1:0".parse().unwrap(), access, || "x 1\n".into())
                .unwrap();
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
        let server = MetricsServer::start(
            "127.0.0.1:0".parse().unwrap(),
            MetricsAccess::open(),
            || "a_total 1\n".to_string(),
        )
        .unwrap();
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
