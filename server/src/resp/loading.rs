//! The RESP port while the engine recovers: from before recovery starts
//! until the shards take the port over, every connection is answered
//! `-LOADING ...` and closed, as Redis answers while it loads its data, so
//! clients and proxies can tell "recovering" from "down" (redis-py raises
//! `BusyLoadingError`, and retries when told to).
//!
//! With `server.tls_resp` the reply goes inside TLS (the same certificate
//! as the shards will use), so a TLS client reads it too.
//!
//! What must hold: the responder owns its socket alone and never reads
//! more than a bounded amount from a client or waits on one for long (one
//! plain thread serves every connection in turn); it stops, and its socket
//! is closed, before the shards bind the port.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::tls::TlsConfig;

/// The reply (Redis's error code, ringkv's words).
pub const LOADING_REPLY: &[u8] = b"-LOADING ringkv is loading the dataset in memory\r\n";
/// How often the accept loop looks at its stop flag.
const POLL_INTERVAL: Duration = Duration::from_millis(20);
/// Longest wait on one client (reading what it sent, writing the reply).
const CLIENT_WAIT: Duration = Duration::from_millis(200);
/// Most bytes read from one client before the reply.
const CLIENT_READ_BYTES_MAX: usize = 64 * 1024;

/// Answers `-LOADING` on the RESP address until stopped.
#[derive(Debug)]
pub struct LoadingResponder {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl LoadingResponder {
    /// Binds `addr` (port 0: the kernel picks one; [`Self::addr`] tells
    /// which) and starts answering.
    pub fn start(
        addr: SocketAddr,
        tls: Option<Arc<TlsConfig>>,
    ) -> std::io::Result<LoadingResponder> {
        let listener = TcpListener::bind(addr)?;
        let addr = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let thread_stop = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("resp-loading".to_string())
            .spawn(move || serve(listener, &thread_stop, tls.as_deref()))?;
        Ok(LoadingResponder {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops answering and closes the socket; returns the address, for the
    /// shards to bind.
    pub fn stop(mut self) -> SocketAddr {
        self.stop_inner();
        self.addr
    }

    fn stop_inner(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                tracing::warn!("the RESP loading responder thread panicked");
            }
        }
    }
}

impl Drop for LoadingResponder {
    fn drop(&mut self) {
        self.stop_inner();
    }
}

fn serve(listener: TcpListener, stop: &AtomicBool, tls: Option<&TlsConfig>) {
    while !stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((stream, _)) => match tls {
                None => answer(stream),
                Some(tls) => answer_tls(stream, tls),
            },
            Err(e) if e.kind() == ErrorKind::WouldBlock => std::thread::sleep(POLL_INTERVAL),
            Err(e) => {
                tracing::debug!(error = %e, "accept on the RESP port while loading failed");
                std::thread::sleep(POLL_INTERVAL);
            }
        }
    }
}

/// Reads what the client sent (bounded, briefly), answers, closes. The
/// read comes first: closing a socket with unread input resets the
/// connection, which can destroy the reply before the client reads it.
fn answer(mut stream: TcpStream) {
    let prepared = stream
        .set_nonblocking(false)
        .and_then(|()| stream.set_read_timeout(Some(CLIENT_WAIT)))
        .and_then(|()| stream.set_write_timeout(Some(CLIENT_WAIT)));
    if prepared.is_err() {
        return;
    }
    let mut buf = [0u8; 4096];
    let mut read = 0;
    // One read is enough for a command; more would only delay the reply.
    if let Ok(n) = stream.read(&mut buf) {
        read += n;
    }
    if stream.write_all(LOADING_REPLY).is_err() {
        return;
    }
    let _ = stream.shutdown(Shutdown::Write);
    // Drain (bounded) until the client closes, so the close is clean.
    while read < CLIENT_READ_BYTES_MAX {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => read += n,
        }
    }
}

/// [`answer`] inside TLS: the handshake, the reply, close_notify; every
/// step bounded by [`CLIENT_WAIT`] per read or write.
fn answer_tls(stream: TcpStream, tls: &TlsConfig) {
    let prepared = stream
        .set_nonblocking(false)
        .and_then(|()| stream.set_read_timeout(Some(CLIENT_WAIT)))
        .and_then(|()| stream.set_write_timeout(Some(CLIENT_WAIT)));
    if prepared.is_err() {
        return;
    }
    let Ok(conn) = rustls::ServerConnection::new(tls.current()) else {
        return;
    };
    let mut tls = rustls::StreamOwned::new(conn, stream);
    // One read drives the handshake and takes the command, if it came.
    let mut buf = [0u8; 4096];
    let _ = tls.read(&mut buf);
    if tls.conn.is_handshaking() || tls.write_all(LOADING_REPLY).is_err() {
        return;
    }
    tls.conn.send_close_notify();
    let _ = tls.flush();
    let _ = tls.sock.shutdown(Shutdown::Write);
    let mut read = 0;
    while read < CLIENT_READ_BYTES_MAX {
        match tls.sock.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => read += n,
        }
    }
}
