//! The `/metrics` endpoint: a deliberately tiny HTTP/1.1 server on one plain
//! std thread, off the data path. It answers `GET /metrics` with the text the
//! caller renders, 404 for other paths, 405 for other methods, and closes the
//! connection after every answer.
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
        render: impl Fn() -> String + Send + 'static,
    ) -> io::Result<MetricsServer> {
        let listener = TcpListener::bind(addr)?;
        let local_addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let thread_stop = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("ringkv-metrics".to_string())
            .spawn(move || serve(listener, &thread_stop, &render))?;
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

fn serve(listener: TcpListener, stop: &AtomicBool, render: &dyn Fn() -> String) {
    while !stop.load(Ordering::Acquire) {
        let mut fds = [PollFd::new(&listener, PollFlags::IN)];
        let ready = poll(&mut fds, Some(&POLL_INTERVAL)).unwrap_or(0);
        if ready == 0 {
            continue;
        }
        match listener.accept() {
            Ok((stream, peer)) => {
                if let Err(e) = answer(stream, render) {
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
    Metrics,
    NotFound,
    MethodNotAllowed,
    Bad,
    TooLarge,
}

fn answer(mut stream: TcpStream, render: &dyn Fn() -> String) -> io::Result<()> {
    stream.set_write_timeout(Some(REQUEST_READ_TIMEOUT))?;
    let parsed = read_head(&mut stream)?;
    let (status, content_type, body) = match parsed {
        Parsed::Metrics => (
            "200 OK",
            "text/plain; version=0.0.4; charset=utf-8",
            render(),
        ),
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
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    stream.write_all(body.as_bytes())?;
    stream.flush()
}

fn read_head(stream: &mut TcpStream) -> io::Result<Parsed> {
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
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "request head not received in time",
            ));
        }
        stream.set_read_timeout(Some(left))?;
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
    if path == "/metrics" {
        Parsed::Metrics
    } else {
        Parsed::NotFound
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_request_lines() {
        assert_eq!(
            parse_head(b"GET /metrics HTTP/1.1\r\nHost: x"),
            Parsed::Metrics
        );
        assert_eq!(parse_head(b"GET /metrics?x=1 HTTP/1.0"), Parsed::Metrics);
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
    fn serves_metrics_and_404_then_stops() {
        let server =
            MetricsServer::start("127.0.0.1:0".parse().unwrap(), || "a_total 1\n".to_string())
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
