//! TLS with rustls (ring provider) for the native listener and `/metrics`:
//! the certificate files and their reload ([`TlsConfig`]), and a rustls
//! `ServerConnection` driven by hand over a compio socket ([`TlsConn`]).
//!
//! Why by hand: a connection has a reader task and a writer task working on
//! one socket at the same time. compio-tls wraps a stream that one task
//! owns (its split halves share one lock held across a read, which would
//! block every answer while the reader waits for the client). rustls is
//! sans-IO, so both tasks share one `ServerConnection` in a `RefCell`, never
//! holding the borrow across an await: the reader feeds it ciphertext and
//! takes plaintext, the writer puts plaintext in and sends what comes out.
//!
//! What must hold:
//! - a reload builds a complete new configuration from the files and only
//!   then replaces the old one; a failed reload keeps the old one (and says
//!   why); connections already open keep the configuration they started with;
//! - memory per connection is bounded by rustls's own limits (one TLS
//!   record of ciphertext, its received-plaintext limit) plus one read chunk;
//!   the read chunk is [`HANDSHAKE_CIPHERTEXT_READ_BYTES`] until the caller
//!   asks for more room (after the client authenticated), so a handshake
//!   costs rustls's state and no large buffer of ours;
//! - every byte the writer sends goes through the one writer task, so TLS
//!   records never interleave on the socket.

use std::cell::{Cell, RefCell};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use compio::buf::BufResult;
use compio::io::{AsyncRead, AsyncWriteExt};
use compio::net::TcpStream;
use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig, ServerConnection};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// Ciphertext read from the socket at once (a TLS record is at most ~16 KiB).
const CIPHERTEXT_READ_BYTES: usize = 32 * 1024;
/// Ciphertext read at once during the handshake and while the caller asks
/// for little plaintext (before the client authenticated). A ClientHello
/// larger than this takes more than one read.
pub const HANDSHAKE_CIPHERTEXT_READ_BYTES: usize = 1024;
/// Plaintext handed to rustls per encryption step.
const PLAINTEXT_WRITE_CHUNK_BYTES: usize = 64 * 1024;

/// Why TLS could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    #[error("cannot read {field} {path}: {reason}")]
    File {
        field: &'static str,
        path: PathBuf,
        reason: String,
    },
    #[error("{field} {path} holds no certificate")]
    NoCertificate { field: &'static str, path: PathBuf },
    #[error("invalid TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("invalid server.tls_client_ca_file: {0}")]
    ClientCa(String),
}

/// The files a TLS configuration is built from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: Option<PathBuf>,
}

impl TlsFiles {
    /// The files of `config`, when any listener uses TLS.
    pub fn from_config(config: &tunables::Config) -> Option<TlsFiles> {
        let s = &config.server;
        (s.tls_native || s.tls_metrics || s.tls_resp).then(|| TlsFiles {
            cert: s.tls_cert_file.clone(),
            key: s.tls_key_file.clone(),
            client_ca: (!s.tls_client_ca_file.as_os_str().is_empty())
                .then(|| s.tls_client_ca_file.clone()),
        })
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read_certs(field: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|iter| iter.collect::<Result<Vec<_>, _>>())
        .map_err(|e| TlsError::File {
            field,
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            field,
            path: path.to_path_buf(),
        });
    }
    Ok(certs)
}

/// Builds a rustls server configuration from `files`.
pub fn build_server_config(files: &TlsFiles) -> Result<ServerConfig, TlsError> {
    let certs = read_certs("server.tls_cert_file", &files.cert)?;
    let key = PrivateKeyDer::from_pem_file(&files.key).map_err(|e| TlsError::File {
        field: "server.tls_key_file",
        path: files.key.clone(),
        reason: e.to_string(),
    })?;
    let builder =
        ServerConfig::builder_with_provider(provider()).with_safe_default_protocol_versions()?;
    let builder = match &files.client_ca {
        None => builder.with_no_client_auth(),
        Some(path) => {
            let mut roots = RootCertStore::empty();
            for cert in read_certs("server.tls_client_ca_file", path)? {
                roots.add(cert)?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
                .build()
                .map_err(|e| TlsError::ClientCa(e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    // with_single_cert checks that the key matches the certificate.
    Ok(builder.with_single_cert(certs, key)?)
}

/// The current TLS configuration of a server, replaceable at run time.
#[derive(Debug)]
pub struct TlsConfig {
    files: TlsFiles,
    current: RwLock<Arc<ServerConfig>>,
    reloads: AtomicU64,
    reload_failures: AtomicU64,
}

impl TlsConfig {
    /// Loads `files`; fails if they do not make a valid configuration.
    pub fn load(files: TlsFiles) -> Result<TlsConfig, TlsError> {
        let config = build_server_config(&files)?;
        Ok(TlsConfig {
            files,
            current: RwLock::new(Arc::new(config)),
            reloads: AtomicU64::new(0),
            reload_failures: AtomicU64::new(0),
        })
    }

    /// The configuration new connections use.
    pub fn current(&self) -> Arc<ServerConfig> {
        Arc::clone(&self.current.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Reads the files again and, if they make a valid configuration, uses it
    /// for new connections. On error the previous configuration stays.
    pub fn reload(&self) -> Result<(), TlsError> {
        match build_server_config(&self.files) {
            Ok(config) => {
                *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(config);
                self.reloads.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(e) => {
                self.reload_failures.fetch_add(1, Ordering::Relaxed);
                Err(e)
            }
        }
    }

    /// Successful reloads so far.
    pub fn reloads(&self) -> u64 {
        self.reloads.load(Ordering::Relaxed)
    }

    /// Failed reloads so far.
    pub fn reload_failures(&self) -> u64 {
        self.reload_failures.load(Ordering::Relaxed)
    }
}

/// Why a TLS connection ended abnormally.
#[derive(Debug)]
pub enum TlsFailure {
    /// The socket closed or failed.
    Io(io::Error),
    /// The peer broke TLS (not a TLS client, bad certificate, bad record).
    Tls(rustls::Error),
}

impl std::fmt::Display for TlsFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TlsFailure::Io(e) => write!(f, "{e}"),
            TlsFailure::Tls(e) => write!(f, "TLS: {e}"),
        }
    }
}

/// One server-side TLS connection over a compio socket, shared by the
/// connection's reader and writer tasks (same thread).
pub struct TlsConn {
    conn: RefCell<ServerConnection>,
    /// Ciphertext read from the socket and not yet given to rustls
    /// (`pending[consumed..]`); reader only.
    pending: Cell<Vec<u8>>,
    consumed: Cell<usize>,
    /// Decrypted bytes rustls holds for the reader, and whether the peer
    /// sent close_notify (from the last `process_new_packets`).
    available: Cell<usize>,
    peer_closed: Cell<bool>,
    /// Ciphertext to send; writer only (the handshake, before the writer).
    outgoing: Cell<Vec<u8>>,
}

impl std::fmt::Debug for TlsConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsConn").finish_non_exhaustive()
    }
}

impl TlsConn {
    /// Runs the TLS handshake on `stream`. The caller bounds it in time (the
    /// handshake deadline shuts the socket down, which ends the reads here).
    pub async fn accept(
        stream: &TcpStream,
        config: Arc<ServerConfig>,
    ) -> Result<TlsConn, TlsFailure> {
        let conn = ServerConnection::new(config).map_err(TlsFailure::Tls)?;
        let tls = TlsConn {
            conn: RefCell::new(conn),
            pending: Cell::new(Vec::with_capacity(HANDSHAKE_CIPHERTEXT_READ_BYTES)),
            consumed: Cell::new(0),
            available: Cell::new(0),
            peer_closed: Cell::new(false),
            outgoing: Cell::new(Vec::new()),
        };
        loop {
            tls.flush(stream).await.map_err(TlsFailure::Io)?;
            if !tls.conn.borrow().is_handshaking() {
                // The server's handshake flight (its certificate chain)
                // is not kept for the connection's lifetime.
                tls.outgoing.set(Vec::new());
                return Ok(tls);
            }
            match tls.feed(stream, HANDSHAKE_CIPHERTEXT_READ_BYTES).await {
                Ok(true) => {}
                Ok(false) => {
                    return Err(TlsFailure::Io(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the peer closed during the TLS handshake",
                    )))
                }
                Err(e) => {
                    // Send the alert rustls prepared, if the socket still works.
                    let _ = tls.flush(stream).await;
                    return Err(e);
                }
            }
        }
    }

    /// Reads ciphertext from the socket (unless some is pending) and gives
    /// it to rustls; a read takes up to `want` bytes (clamped to
    /// [`HANDSHAKE_CIPHERTEXT_READ_BYTES`]..=[`CIPHERTEXT_READ_BYTES`]); the
    /// buffer only grows when a larger read is wanted. `Ok(false)`: the
    /// peer closed the socket.
    async fn feed(&self, stream: &TcpStream, want: usize) -> Result<bool, TlsFailure> {
        let mut pending = self.pending.take();
        let mut consumed = self.consumed.get();
        if consumed >= pending.len() {
            pending.clear();
            consumed = 0;
            let want = want.clamp(HANDSHAKE_CIPHERTEXT_READ_BYTES, CIPHERTEXT_READ_BYTES);
            if pending.capacity() < want {
                pending.reserve_exact(want);
            }
            let mut s = stream;
            let BufResult(result, back) = s.read(pending).await;
            pending = back;
            match result {
                Ok(0) => {
                    self.pending.set(pending);
                    self.consumed.set(0);
                    return Ok(false);
                }
                Ok(_) => {}
                Err(e) => {
                    self.pending.set(pending);
                    return Err(TlsFailure::Io(e));
                }
            }
        }
        let result = {
            let mut conn = self.conn.borrow_mut();
            let mut rest = &pending[consumed..];
            let before = rest.len();
            let read = conn.read_tls(&mut rest);
            consumed += before - rest.len();
            match read {
                Ok(_) => match conn.process_new_packets() {
                    Ok(state) => {
                        self.available.set(state.plaintext_bytes_to_read());
                        self.peer_closed.set(state.peer_has_closed());
                        Ok(())
                    }
                    Err(e) => Err(TlsFailure::Tls(e)),
                },
                Err(e) => Err(TlsFailure::Io(e)),
            }
        };
        self.pending.set(pending);
        self.consumed.set(consumed);
        result.map(|()| true)
    }

    /// Sends whatever rustls has queued (handshake messages, alerts,
    /// encrypted records).
    async fn flush(&self, stream: &TcpStream) -> io::Result<()> {
        let mut out = self.outgoing.take();
        out.clear();
        {
            let mut conn = self.conn.borrow_mut();
            while conn.wants_write() {
                conn.write_tls(&mut out)?;
            }
        }
        if out.is_empty() {
            self.outgoing.set(out);
            return Ok(());
        }
        let mut s = stream;
        let BufResult(result, mut out) = s.write_all(out).await;
        out.clear();
        if out.capacity() > 4 * PLAINTEXT_WRITE_CHUNK_BYTES {
            out = Vec::new();
        }
        self.outgoing.set(out);
        result
    }

    /// Reads decrypted bytes into the spare room of `buf` (at least `room`
    /// bytes are offered). `Ok(0)`: the peer closed (cleanly or not).
    pub async fn read_plain(
        &self,
        stream: &TcpStream,
        buf: &mut bytes::BytesMut,
        room: usize,
    ) -> io::Result<usize> {
        loop {
            let available = self.available.get();
            if available > 0 {
                // Only as many bytes as rustls holds are zeroed and copied.
                let take = available.min(room.max(1));
                let start = buf.len();
                buf.resize(start + take, 0);
                let read = self.conn.borrow_mut().reader().read(&mut buf[start..]);
                match read {
                    Ok(n) => {
                        buf.truncate(start + n);
                        self.available.set(available.saturating_sub(n));
                        if n > 0 {
                            return Ok(n);
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        buf.truncate(start);
                        self.available.set(0);
                    }
                    Err(e) => {
                        buf.truncate(start);
                        return Err(e);
                    }
                }
            }
            if self.peer_closed.get() {
                return Ok(0);
            }
            match self.feed(stream, room).await {
                Ok(true) => {}
                Ok(false) => return Ok(0),
                Err(TlsFailure::Io(e)) => return Err(e),
                Err(TlsFailure::Tls(e)) => {
                    return Err(io::Error::new(io::ErrorKind::InvalidData, TlsReadError(e)))
                }
            }
        }
    }

    /// Encrypts `plain` and sends it.
    pub async fn write_plain(&self, stream: &TcpStream, plain: &[u8]) -> io::Result<()> {
        for chunk in plain.chunks(PLAINTEXT_WRITE_CHUNK_BYTES) {
            self.conn.borrow_mut().writer().write_all(chunk)?;
            self.flush(stream).await?;
        }
        Ok(())
    }

    /// Sends a close_notify alert (best effort).
    pub async fn close(&self, stream: &TcpStream) {
        self.conn.borrow_mut().send_close_notify();
        let _ = self.flush(stream).await;
    }
}

/// A TLS error met while reading, marked so the connection can tell it
/// from a socket error.
#[derive(Debug)]
pub struct TlsReadError(pub rustls::Error);

impl std::fmt::Display for TlsReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TLS: {}", self.0)
    }
}

impl std::error::Error for TlsReadError {}
