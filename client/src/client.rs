//! An async tokio client: one TCP connection shared by many concurrent
//! callers. Each [`Client::batch`] is one REQUEST frame; frames are pipelined
//! (at most the server's `pipeline_depth_max` in flight, held by a semaphore)
//! and a reader task hands each answer to its caller. The server answers in
//! request order, so the reader matches every answer against the oldest
//! outstanding request id and treats any disagreement as a protocol violation.

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{lookup_host, TcpStream, ToSocketAddrs};
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};
use tokio::task::{AbortHandle, JoinHandle};

use crate::protocol::{
    check_frame, decode_hello_ack, decode_response, encode_auth, encode_hello, encode_request,
    encode_user, hello_flags, DecodeError, ErrorFrame, Expiry, Hello, HelloAck, LimitError, Limits,
    OpReply, Request, RequestOp, ServerFrame, ServerInfo, Status, PASSWORD_BYTES_MAX,
    PROTOCOL_VERSION, PROTOCOL_VERSION_MIN, USER_NAME_BYTES_MAX,
};
use crate::tls::{TlsOptions, TlsSetupError};

/// The reading side of the connection (TCP or TLS).
type ReadHalf = Box<dyn AsyncRead + Send + Unpin>;
/// The writing side of the connection (TCP or TLS).
type WriteHalf = Box<dyn AsyncWrite + Send + Unpin>;

/// How to connect: a user and password for the handshake, TLS, a time bound.
///
/// Start from [`ConnectOptions::new`] (or `Default`) and set what you need
/// with the `with_*` methods. The struct is `#[non_exhaustive]`: other
/// crates read its fields but cannot build it with a struct literal, so a
/// field added later does not break them.
///
/// ```
/// use std::time::Duration;
/// use ringkv_client::{ConnectOptions, TlsOptions};
///
/// let options = ConnectOptions::new()
///     .with_user("reader")
///     .with_password("secret")
///     .with_tls(TlsOptions::default())
///     .with_timeout(Duration::from_secs(2));
/// assert_eq!(options.user.as_deref(), Some(&b"reader"[..]));
/// assert_eq!(options.timeout, Duration::from_secs(2));
/// ```
///
/// A struct literal does not compile outside this crate:
///
/// ```compile_fail
/// let options = ringkv_client::ConnectOptions {
///     user: None,
///     password: None,
///     tls: None,
///     timeout: std::time::Duration::from_secs(1),
/// };
/// ```
#[derive(Clone)]
#[non_exhaustive]
pub struct ConnectOptions {
    /// The user to authenticate as (protocol version 4); 1..=64 bytes, and
    /// only with a password. `None`: the server's `default` user.
    pub user: Option<Vec<u8>>,
    /// Sent in the handshake (protocol version 2); 1..=512 bytes.
    pub password: Option<Vec<u8>>,
    /// Connect with TLS.
    pub tls: Option<TlsOptions>,
    /// Bound on resolving, connecting and both handshakes together.
    pub timeout: Duration,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            user: None,
            password: None,
            tls: None,
            timeout: CONNECT_TIMEOUT_DEFAULT,
        }
    }
}

impl ConnectOptions {
    /// No user, no password, no TLS, [`CONNECT_TIMEOUT_DEFAULT`].
    pub fn new() -> ConnectOptions {
        ConnectOptions::default()
    }

    /// Authenticates as `user` (needs a password too; protocol version 4).
    pub fn with_user(mut self, user: impl Into<Vec<u8>>) -> ConnectOptions {
        self.user = Some(user.into());
        self
    }

    /// Sends `password` in the handshake (protocol version 2).
    pub fn with_password(mut self, password: impl Into<Vec<u8>>) -> ConnectOptions {
        self.password = Some(password.into());
        self
    }

    /// Connects with TLS.
    pub fn with_tls(mut self, tls: TlsOptions) -> ConnectOptions {
        self.tls = Some(tls);
        self
    }

    /// Bounds resolving, connecting and both handshakes together.
    pub fn with_timeout(mut self, timeout: Duration) -> ConnectOptions {
        self.timeout = timeout;
        self
    }
}

impl std::fmt::Debug for ConnectOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectOptions")
            .field(
                "user",
                &self.user.as_ref().map(|u| String::from_utf8_lossy(u)),
            )
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("tls", &self.tls)
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// How long [`Client::connect`] waits for the TCP connection and the
/// hello-ack together.
pub const CONNECT_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);

/// The writer coalesces queued frames into one write up to this many bytes.
const WRITE_COALESCE_BYTES: usize = 256 << 10;
/// The reader asks the socket for at least this much room per read.
const READ_CHUNK_BYTES: usize = 64 << 10;

/// Why a client call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The server address did not resolve.
    #[error("cannot resolve the server address: {0}")]
    Resolve(io::Error),
    /// No resolved address accepted a TCP connection.
    #[error("cannot connect to {addrs:?}: {source}")]
    Connect {
        addrs: Vec<SocketAddr>,
        source: io::Error,
    },
    /// Connecting or the handshake took too long.
    #[error("{what} timed out after {after:?}")]
    Timeout { what: &'static str, after: Duration },
    /// The socket failed during the handshake.
    #[error("I/O error during the handshake with {peer}: {source}")]
    Io { peer: SocketAddr, source: io::Error },
    /// TLS could not be set up (CA file, client certificate, server name).
    #[error("TLS setup: {0}")]
    TlsSetup(#[from] TlsSetupError),
    /// The TLS handshake failed (untrusted certificate, not a TLS server...).
    #[error("TLS handshake with {peer} failed: {source}")]
    TlsHandshake { peer: SocketAddr, source: io::Error },
    /// The password cannot be sent (the protocol carries 1..=512 bytes).
    #[error("a password is 1..={max} bytes, this one is {len}", max = PASSWORD_BYTES_MAX)]
    BadPassword { len: usize },
    /// The user name cannot be sent: it is 1..=64 bytes and needs a password.
    #[error("a user name is 1..={max} bytes and needs a password; this one is {len} bytes{}", if *.with_password { "" } else { ", without a password" }, max = USER_NAME_BYTES_MAX)]
    BadUser { len: usize, with_password: bool },
    /// The connection was plain TCP and the server answered the hello with
    /// a TLS record: it expects TLS. Connect with TLS
    /// ([`ConnectOptions::with_tls`]).
    #[error("the server at {peer} speaks TLS: it answered the plain-TCP hello with a TLS record (first bytes {first_bytes:02x?}); connect with TLS")]
    TlsRequired {
        peer: SocketAddr,
        first_bytes: Vec<u8>,
    },
    /// The server refused the handshake (its hello-ack carried an error).
    #[error("server refused the connection ({status}): {message} (server speaks protocol version {server_version})")]
    Refused {
        status: Status,
        message: String,
        server_version: u16,
    },
    /// The server sent something the protocol does not allow. The connection
    /// is closed.
    #[error("protocol violation by the server: {0}")]
    Protocol(ProtocolError),
    /// The server refused a request as a whole (an ERROR frame), or a single
    /// operation failed (for the one-operation conveniences).
    #[error("server answered {status}: {message}")]
    Server { status: Status, message: String },
    /// The request breaks the limits the server advertised; nothing was sent.
    #[error("request not sent: {0}")]
    Limit(LimitError),
    /// The connection speaks an older protocol version (the server is
    /// older than this client) that lacks an operation; nothing was sent.
    #[error("request not sent: {op} needs protocol version {since}, and the server speaks version {version}")]
    NeedsVersion {
        op: &'static str,
        since: u16,
        version: u16,
    },
    /// The connection is gone; `reason` says why.
    #[error("connection closed: {reason}")]
    Closed { reason: String },
}

/// A server breaking the protocol. The client closes the connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProtocolError {
    #[error("undecodable bytes: {0}")]
    Decode(DecodeError),
    #[error("server accepted protocol version {got}, this client speaks {expected}")]
    Version { got: u16, expected: u16 },
    #[error(
        "answer for request {got} arrived while request {expected} was the oldest outstanding"
    )]
    IdMismatch { expected: u64, got: u64 },
    #[error("answer for request {id} arrived with no request outstanding")]
    Unsolicited { id: u64 },
    #[error("response to request {id} has {got} results for {expected} operations")]
    ResultCount {
        id: u64,
        expected: usize,
        got: usize,
    },
    #[error("request {id} op {index}: a {reply} reply is not a valid answer to {op}")]
    UnexpectedReply {
        id: u64,
        index: usize,
        op: &'static str,
        reply: Status,
    },
}

/// One outstanding request, oldest first in [`State::pending`].
struct Pending {
    id: u64,
    reply: oneshot::Sender<Result<Vec<OpReply>, ClientError>>,
    /// Returned to the pipeline semaphore when the answer arrives (or the
    /// connection dies), even if the caller stopped waiting.
    _permit: OwnedSemaphorePermit,
}

struct State {
    pending: VecDeque<Pending>,
    /// Set once, when the connection dies; later calls fail with it.
    closed: Option<String>,
}

/// What the reader and writer tasks share with the callers.
struct Connection {
    state: Mutex<State>,
    permits: Arc<Semaphore>,
    limits: Limits,
}

impl Connection {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock cannot leave State half-updated
        // (every critical section is a push, pop or drain), so recover it.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Marks the connection dead and fails every outstanding request with
    /// `error()`. Idempotent: only the first reason is kept.
    fn fail_all(&self, reason: String, error: impl Fn() -> ClientError) {
        let drained: Vec<Pending> = {
            let mut state = self.lock();
            if state.closed.is_none() {
                state.closed = Some(reason);
            }
            state.pending.drain(..).collect()
        };
        self.permits.close();
        for pending in drained {
            // The caller may have stopped waiting; that is fine.
            let _ = pending.reply.send(Err(error()));
        }
    }
}

/// A connection to a ringkv server. `batch` and the conveniences take
/// `&self`, so one `Client` (e.g. in an `Arc`) serves many tasks at once.
/// Dropping it closes the connection.
pub struct Client {
    connection: Arc<Connection>,
    frames: mpsc::UnboundedSender<Bytes>,
    next_id: AtomicU64,
    server: ServerInfo,
    version: u16,
    peer: SocketAddr,
    reader: JoinHandle<()>,
    writer: JoinHandle<()>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("peer", &self.peer)
            .field("server", &self.server)
            .field("limits", &self.connection.limits)
            .finish_non_exhaustive()
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.reader.abort();
        self.writer.abort();
    }
}

impl Client {
    /// Connects to `addr` and does the handshake, within
    /// [`CONNECT_TIMEOUT_DEFAULT`]. Must run inside a tokio runtime.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), ringkv_client::ClientError> {
    /// let client = ringkv_client::Client::connect("127.0.0.1:7379").await?;
    /// println!("connected to {}", client.server_info().server_name);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn connect(addr: impl ToSocketAddrs) -> Result<Client, ClientError> {
        Client::connect_timeout(addr, CONNECT_TIMEOUT_DEFAULT).await
    }

    /// Like [`Client::connect`], with a bound on resolving, connecting and
    /// the handshake together.
    pub async fn connect_timeout(
        addr: impl ToSocketAddrs,
        timeout: Duration,
    ) -> Result<Client, ClientError> {
        let options = ConnectOptions::new().with_timeout(timeout);
        match tokio::time::timeout(timeout, Client::connect_inner(addr, "", &options)).await {
            Ok(result) => result,
            Err(_) => Err(ClientError::Timeout {
                what: "connect and handshake",
                after: timeout,
            }),
        }
    }

    /// Connects to `addr` (`host:port`) with `options`: TLS, a password, a
    /// time bound.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), ringkv_client::ClientError> {
    /// use ringkv_client::{Client, ConnectOptions};
    ///
    /// let password = std::env::var("RINGKV_PASSWORD").unwrap_or_default();
    /// let options = ConnectOptions::new().with_password(password);
    /// let client = Client::connect_with("127.0.0.1:7379", &options).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn connect_with(addr: &str, options: &ConnectOptions) -> Result<Client, ClientError> {
        let timeout = options.timeout;
        let host = addr.rsplit_once(':').map_or(addr, |(host, _)| host);
        match tokio::time::timeout(timeout, Client::connect_inner(addr, host, options)).await {
            Ok(result) => result,
            Err(_) => Err(ClientError::Timeout {
                what: "connect and handshake",
                after: timeout,
            }),
        }
    }

    /// `host` names the server for TLS (when `options.tls` has no name).
    /// Asks for [`PROTOCOL_VERSION`]; a server that refuses it with
    /// UNSUPPORTED, naming an older version this client also speaks, is
    /// asked again for that version on a new connection (operations of
    /// later versions then fail with [`ClientError::NeedsVersion`]).
    async fn connect_inner(
        addr: impl ToSocketAddrs,
        host: &str,
        options: &ConnectOptions,
    ) -> Result<Client, ClientError> {
        let addrs: Vec<SocketAddr> = lookup_host(addr)
            .await
            .map_err(ClientError::Resolve)?
            .collect();
        match Client::connect_version(&addrs, host, options, PROTOCOL_VERSION).await {
            Err(ClientError::Refused {
                status: Status::Unsupported,
                server_version,
                ..
            }) if (PROTOCOL_VERSION_MIN..PROTOCOL_VERSION).contains(&server_version)
                // Version 1 cannot carry a password, nor versions
                // before 4 a user name.
                && (options.password.is_none() || server_version >= 2)
                && (options.user.is_none() || server_version >= 4) =>
            {
                Client::connect_version(&addrs, host, options, server_version).await
            }
            other => other,
        }
    }

    async fn connect_version(
        addrs: &[SocketAddr],
        host: &str,
        options: &ConnectOptions,
        version: u16,
    ) -> Result<Client, ClientError> {
        if let Some(password) = &options.password {
            if !(1..=PASSWORD_BYTES_MAX).contains(&password.len()) {
                return Err(ClientError::BadPassword {
                    len: password.len(),
                });
            }
        }
        if let Some(user) = &options.user {
            if !(1..=USER_NAME_BYTES_MAX).contains(&user.len()) || options.password.is_none() {
                return Err(ClientError::BadUser {
                    len: user.len(),
                    with_password: options.password.is_some(),
                });
            }
        }
        let tls = match &options.tls {
            None => None,
            Some(tls) => {
                let name = tls.server_name(host)?;
                let connector =
                    tokio_rustls::TlsConnector::from(std::sync::Arc::new(tls.client_config()?));
                Some((connector, name))
            }
        };
        let mut last_error =
            io::Error::new(io::ErrorKind::NotFound, "the address resolved to nothing");
        let mut stream = None;
        for addr in addrs {
            match TcpStream::connect(addr).await {
                Ok(connected) => {
                    stream = Some(connected);
                    break;
                }
                Err(error) => last_error = error,
            }
        }
        let Some(stream) = stream else {
            return Err(ClientError::Connect {
                addrs: addrs.to_vec(),
                source: last_error,
            });
        };
        let peer = stream.peer_addr().map_err(|source| ClientError::Io {
            peer: addrs[0],
            source,
        })?;
        let io_error = |source| ClientError::Io { peer, source };
        // Small frames must not wait for Nagle: latency is the point of pipelining.
        stream.set_nodelay(true).map_err(io_error)?;
        let (mut read, mut write): (ReadHalf, WriteHalf) = match tls {
            None => {
                let (read, write) = stream.into_split();
                (Box::new(read), Box::new(write))
            }
            Some((connector, name)) => {
                let tls = connector
                    .connect(name, stream)
                    .await
                    .map_err(|source| ClientError::TlsHandshake { peer, source })?;
                let (read, write) = tokio::io::split(tls);
                (Box::new(read), Box::new(write))
            }
        };

        let mut out = BytesMut::new();
        match (&options.user, &options.password) {
            (_, None) => encode_hello(&Hello { version, flags: 0 }, &mut out),
            (None, Some(password)) => {
                let flags = hello_flags::AUTH;
                encode_hello(&Hello { version, flags }, &mut out);
                encode_auth(password, &mut out);
            }
            (Some(user), Some(password)) => {
                let flags = hello_flags::AUTH | hello_flags::USER;
                encode_hello(&Hello { version, flags }, &mut out);
                encode_user(user, &mut out);
                encode_auth(password, &mut out);
            }
        }
        write.write_all(&out).await.map_err(io_error)?;
        write.flush().await.map_err(io_error)?;

        let mut buf = BytesMut::with_capacity(READ_CHUNK_BYTES);
        // A bad magic that may be the start of a TLS record, kept while more
        // bytes are read to tell.
        let mut undecided = None;
        let ack = loop {
            match decode_hello_ack(&mut buf) {
                Ok(Some(ack)) => break ack,
                Ok(None) => {}
                Err(error) => {
                    let guess = if options.tls.is_none() {
                        tls_record_guess(&buf)
                    } else {
                        TlsGuess::No
                    };
                    match guess {
                        TlsGuess::Yes => {
                            return Err(ClientError::TlsRequired {
                                peer,
                                first_bytes: buf[..buf.len().min(TLS_RECORD_HEADER_BYTES)].to_vec(),
                            })
                        }
                        TlsGuess::NeedMore => undecided = Some(error),
                        TlsGuess::No => {
                            return Err(ClientError::Protocol(ProtocolError::Decode(error)))
                        }
                    }
                }
            }
            let read = read.read_buf(&mut buf).await.map_err(io_error)?;
            if read == 0 {
                if let Some(error) = undecided {
                    return Err(ClientError::Protocol(ProtocolError::Decode(error)));
                }
                return Err(ClientError::Closed {
                    reason: "the server closed the connection during the handshake".into(),
                });
            }
        };
        let (accepted, limits, server) = match ack {
            HelloAck::Accepted {
                version,
                limits,
                server,
            } => (version, limits, server),
            HelloAck::Refused {
                version,
                status,
                message,
            } => {
                return Err(ClientError::Refused {
                    status,
                    message,
                    server_version: version,
                });
            }
        };
        if accepted != version {
            return Err(ClientError::Protocol(ProtocolError::Version {
                got: accepted,
                expected: version,
            }));
        }

        let connection = Arc::new(Connection {
            state: Mutex::new(State {
                pending: VecDeque::new(),
                closed: None,
            }),
            permits: Arc::new(Semaphore::new(
                (limits.pipeline_depth_max as usize).min(Semaphore::MAX_PERMITS),
            )),
            limits,
        });
        let (frames, queue) = mpsc::unbounded_channel();
        // Bytes after the ack (none today) belong to the first frame.
        let writer = tokio::spawn(write_loop(write, queue, Arc::clone(&connection)));
        let reader = tokio::spawn(read_loop(
            read,
            buf,
            Arc::clone(&connection),
            writer.abort_handle(),
        ));
        Ok(Client {
            connection,
            frames,
            next_id: AtomicU64::new(1),
            server,
            version,
            peer,
            reader,
            writer,
        })
    }

    /// The limits the server advertised; every request is checked against
    /// them before it is sent.
    pub fn limits(&self) -> &Limits {
        &self.connection.limits
    }

    /// Who the server is, from its hello-ack.
    pub fn server_info(&self) -> &ServerInfo {
        &self.server
    }

    /// The protocol version of this connection.
    pub fn protocol_version(&self) -> u16 {
        self.version
    }

    /// The server's address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }

    /// Why the connection is closed, once it is.
    pub fn closed_reason(&self) -> Option<String> {
        self.connection.lock().closed.clone()
    }

    /// Sends `ops` as one frame and returns one reply per op, in order.
    ///
    /// Safe to call from many tasks at once: frames are pipelined, at most
    /// `limits().pipeline_depth_max` in flight; further calls wait for a slot.
    /// Per-operation failures are `OpReply::Error` entries; `Err` means the
    /// whole batch failed (limits, an ERROR frame, or a dead connection). An
    /// empty `ops` returns an empty list without touching the network.
    ///
    /// Dropping the future after the frame was queued does not cancel the
    /// request on the server; its answer is discarded.
    ///
    /// ```no_run
    /// # async fn run(client: ringkv_client::Client) -> Result<(), ringkv_client::ClientError> {
    /// use ringkv_client::{OpReply, RequestOp};
    ///
    /// let replies = client
    ///     .batch(vec![
    ///         RequestOp::Put { key: "a".into(), value: "1".into() },
    ///         RequestOp::Get { key: "a".into() },
    ///         RequestOp::Get { key: "missing".into() },
    ///     ])
    ///     .await?;
    /// for reply in &replies {
    ///     match reply {
    ///         OpReply::Value(value) => println!("{}", String::from_utf8_lossy(value)),
    ///         OpReply::NotFound => println!("(nil)"),
    ///         OpReply::Error { status, message } => eprintln!("{status}: {message}"),
    ///         other => println!("{other:?}"),
    ///     }
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn batch(&self, ops: Vec<RequestOp>) -> Result<Vec<OpReply>, ClientError> {
        if ops.is_empty() {
            return Ok(Vec::new());
        }
        if let Some(op) = ops.iter().find(|op| op.since_version() > self.version) {
            return Err(ClientError::NeedsVersion {
                op: crate::protocol::opcode::name(op.opcode()).unwrap_or("?"),
                since: op.since_version(),
                version: self.version,
            });
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let request = Request { id, ops };
        self.connection
            .limits
            .check_request(&request)
            .map_err(ClientError::Limit)?;
        let mut frame = BytesMut::new();
        encode_request(&request, &mut frame);

        let closed = |connection: &Connection| ClientError::Closed {
            reason: connection
                .lock()
                .closed
                .clone()
                .unwrap_or_else(|| "client shut down".into()),
        };
        let permit = match Arc::clone(&self.connection.permits).acquire_owned().await {
            Ok(permit) => permit,
            Err(_) => return Err(closed(&self.connection)),
        };
        let (reply, answer) = oneshot::channel();
        {
            // Queueing the frame and its pending entry under one lock keeps
            // both queues in the same order, which is how answers are matched.
            let mut state = self.connection.lock();
            if let Some(reason) = &state.closed {
                return Err(ClientError::Closed {
                    reason: reason.clone(),
                });
            }
            if self.frames.send(frame.freeze()).is_err() {
                return Err(ClientError::Closed {
                    reason: "the writer task stopped".into(),
                });
            }
            state.pending.push_back(Pending {
                id,
                reply,
                _permit: permit,
            });
        }
        let results = match answer.await {
            Ok(result) => result?,
            Err(_) => return Err(closed(&self.connection)),
        };
        check_replies(&request, &results).map_err(|error| {
            // A server that answers nonsense cannot be trusted with more
            // requests: fail them all and drop the socket.
            self.connection
                .fail_all(format!("protocol violation: {error}"), || {
                    ClientError::Protocol(error.clone())
                });
            self.reader.abort();
            self.writer.abort();
            ClientError::Protocol(error)
        })?;
        Ok(results)
    }

    async fn single(&self, op: RequestOp) -> Result<OpReply, ClientError> {
        let mut replies = self.batch(vec![op]).await?;
        match replies.pop() {
            Some(OpReply::Error { status, message }) => {
                Err(ClientError::Server { status, message })
            }
            Some(reply) => Ok(reply),
            // check_replies guarantees one reply per op.
            None => unreachable!("batch returned no reply for one op"),
        }
    }

    /// Sets `key` to `value`. Keys and values are bytes: anything that
    /// converts into [`Bytes`] (`&'static str`, `Vec<u8>`, `String`, ...).
    ///
    /// ```no_run
    /// # async fn run(client: ringkv_client::Client) -> Result<(), ringkv_client::ClientError> {
    /// client.put("user:1", "Ada").await?;
    /// client.put(b"raw".to_vec(), vec![0u8, 1, 2]).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn put(
        &self,
        key: impl Into<Bytes>,
        value: impl Into<Bytes>,
    ) -> Result<(), ClientError> {
        self.single(RequestOp::Put {
            key: key.into(),
            value: value.into(),
        })
        .await
        .map(drop)
    }

    /// Reads `key`: `None` if it does not exist.
    ///
    /// ```no_run
    /// # async fn run(client: ringkv_client::Client) -> Result<(), ringkv_client::ClientError> {
    /// match client.get("user:1").await? {
    ///     Some(name) => println!("{}", String::from_utf8_lossy(&name)),
    ///     None => println!("no such user"),
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn get(&self, key: impl Into<Bytes>) -> Result<Option<Bytes>, ClientError> {
        match self.single(RequestOp::Get { key: key.into() }).await? {
            OpReply::Value(value) => Ok(Some(value)),
            _ => Ok(None), // NOT_FOUND: the only other reply check_replies lets through
        }
    }

    /// Removes `key`; true if it existed.
    pub async fn delete(&self, key: impl Into<Bytes>) -> Result<bool, ClientError> {
        Ok(self.single(RequestOp::Delete { key: key.into() }).await? == OpReply::Ok)
    }

    /// Sets `key` to `value`, expiring at `expires_at_ms` (absolute Unix
    /// time in ms; 0: never, like [`Client::put`]; a time already past
    /// deletes the key). Protocol version 3.
    pub async fn put_expiring_at(
        &self,
        key: impl Into<Bytes>,
        value: impl Into<Bytes>,
        expires_at_ms: u64,
    ) -> Result<(), ClientError> {
        self.single(RequestOp::PutExpiring {
            key: key.into(),
            value: value.into(),
            expires_at_ms,
        })
        .await
        .map(drop)
    }

    /// Sets `key` to `value`, expiring `ttl` from now by this machine's
    /// clock (see [`expiry_time_ms`]).
    pub async fn put_expiring_in(
        &self,
        key: impl Into<Bytes>,
        value: impl Into<Bytes>,
        ttl: Duration,
    ) -> Result<(), ClientError> {
        self.put_expiring_at(key, value, expiry_time_ms(ttl)).await
    }

    /// Sets the expiry time of an existing `key` (absolute Unix ms; 0
    /// removes it, a time already past deletes the key). False when there
    /// is no such key. Protocol version 3.
    pub async fn expire_at(
        &self,
        key: impl Into<Bytes>,
        expires_at_ms: u64,
    ) -> Result<bool, ClientError> {
        let op = RequestOp::Expire {
            key: key.into(),
            expires_at_ms,
        };
        Ok(self.single(op).await? == OpReply::Ok)
    }

    /// Makes an existing `key` expire `ttl` from now by this machine's
    /// clock. False when there is no such key.
    pub async fn expire_in(
        &self,
        key: impl Into<Bytes>,
        ttl: Duration,
    ) -> Result<bool, ClientError> {
        self.expire_at(key, expiry_time_ms(ttl)).await
    }

    /// Removes the expiry time of `key`, which then lives until deleted.
    /// False when there is no such key.
    pub async fn persist(&self, key: impl Into<Bytes>) -> Result<bool, ClientError> {
        self.expire_at(key, 0).await
    }

    /// The expiry of `key`. Protocol version 3.
    pub async fn ttl(&self, key: impl Into<Bytes>) -> Result<KeyTtl, ClientError> {
        match self.single(RequestOp::Ttl { key: key.into() }).await? {
            OpReply::Expiry(Some(expiry)) => Ok(KeyTtl::Expires(expiry)),
            OpReply::Expiry(None) => Ok(KeyTtl::Persistent),
            _ => Ok(KeyTtl::NotFound), // the only other reply check_replies lets through
        }
    }

    /// One step of a walk over every key: start with cursor 0, then pass
    /// the cursor of the last page until it is 0. `count` is a hint of
    /// how many keys to visit (0: the server's default); a non-empty
    /// `pattern` (a glob, at most 256 bytes) keeps the keys that match it.
    /// A key present for the whole walk is returned at least once.
    /// Protocol version 3.
    pub async fn scan(
        &self,
        cursor: u64,
        count: u32,
        pattern: impl Into<Bytes>,
    ) -> Result<ScanPage, ClientError> {
        let op = RequestOp::Scan {
            cursor,
            count,
            pattern: pattern.into(),
        };
        match self.single(op).await? {
            OpReply::Keys { cursor, keys } => Ok(ScanPage { cursor, keys }),
            _ => unreachable!("check_replies lets only KEYS replies through for SCAN"),
        }
    }

    /// A round trip that does nothing on the server.
    pub async fn ping(&self) -> Result<(), ClientError> {
        self.single(RequestOp::Ping).await.map(drop)
    }

    /// Starts an interactive transaction on this connection. Nothing is
    /// sent yet: BEGIN rides in the frame of the transaction's first
    /// operation (no extra round trip). The server keeps one transaction
    /// per connection, and the ops of this connection belong to it until
    /// commit or rollback: do not share this `Client` with other tasks
    /// while the transaction is open (use one connection per concurrent
    /// transaction).
    pub fn transaction(&self) -> Transaction<'_> {
        Transaction {
            client: self,
            begun: false,
            finished: false,
        }
    }

    /// Queues a frame whose answer nobody waits for (a rollback from a
    /// dropped transaction). Returns false if it could not be queued now.
    fn send_detached(&self, ops: Vec<RequestOp>) -> bool {
        let Ok(permit) = Arc::clone(&self.connection.permits).try_acquire_owned() else {
            return false;
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut frame = BytesMut::new();
        encode_request(&Request { id, ops }, &mut frame);
        let (reply, _answer) = oneshot::channel();
        let mut state = self.connection.lock();
        if state.closed.is_some() || self.frames.send(frame.freeze()).is_err() {
            return false;
        }
        state.pending.push_back(Pending {
            id,
            reply,
            _permit: permit,
        });
        true
    }

    /// The server's counters and settings, as (name, value) pairs.
    pub async fn stats(&self) -> Result<Vec<(String, String)>, ClientError> {
        match self.single(RequestOp::Stats).await? {
            OpReply::Stats(entries) => Ok(entries),
            _ => unreachable!("check_replies lets only STATS replies through for STATS"),
        }
    }
}

impl Client {
    /// Asks the server for an online backup into `dest`, a new or empty
    /// directory on the server's machine, copying at most
    /// `rate_bytes_per_sec` (0: no limit). Answers once the backup is
    /// finished, with what it wrote as (name, value) pairs. Needs protocol
    /// version 5 and the `admin` permission.
    pub async fn backup(
        &self,
        dest: &str,
        rate_bytes_per_sec: u64,
    ) -> Result<Vec<(String, String)>, ClientError> {
        let op = RequestOp::Backup {
            dest: Bytes::copy_from_slice(dest.as_bytes()),
            rate_bytes_per_sec,
        };
        match self.single(op).await? {
            OpReply::Stats(entries) => Ok(entries),
            _ => unreachable!("check_replies lets only STATS replies through for BACKUP"),
        }
    }
}

/// A TLS record header: content type, protocol version (2 bytes), length
/// (2 bytes).
const TLS_RECORD_HEADER_BYTES: usize = 5;

/// Whether the bytes a server sent look like a TLS record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TlsGuess {
    Yes,
    No,
    /// A prefix of a TLS record header, too short to tell.
    NeedMore,
}

/// A TLS server that reads a ringkv hello answers with a record: an alert
/// (content type 0x15) or a handshake message (0x16), then the record's
/// protocol version 0x03 0x00..=0x04 (SSL 3.0 to TLS 1.3).
fn tls_record_guess(bytes: &[u8]) -> TlsGuess {
    let fits = |index: usize, ok: fn(u8) -> bool| bytes.get(index).is_none_or(|&b| ok(b));
    let is_record =
        fits(0, |b| b == 0x15 || b == 0x16) && fits(1, |b| b == 0x03) && fits(2, |b| b <= 0x04);
    match (is_record, bytes.len() >= 3) {
        (false, _) => TlsGuess::No,
        (true, true) => TlsGuess::Yes,
        (true, false) => TlsGuess::NeedMore,
    }
}

/// What TTL found for a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyTtl {
    /// No such key (or it has expired).
    NotFound,
    /// The key has no expiry time.
    Persistent,
    /// The key expires then.
    Expires(Expiry),
}

/// One step of a SCAN walk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanPage {
    /// The cursor of the next step; 0 when the walk is done.
    pub cursor: u64,
    pub keys: Vec<Bytes>,
}

/// The absolute expiry time (Unix ms) `ttl` from now by this machine's
/// clock; never 0 (which would mean "no expiry").
pub fn expiry_time_ms(ttl: Duration) -> u64 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let ttl = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
    now.saturating_add(ttl).max(1)
}

/// Checks a response against the request it answers: one reply per op, each
/// a kind of reply its op can get.
fn check_replies(request: &Request, results: &[OpReply]) -> Result<(), ProtocolError> {
    if results.len() != request.ops.len() {
        return Err(ProtocolError::ResultCount {
            id: request.id,
            expected: request.ops.len(),
            got: results.len(),
        });
    }
    for (index, (op, reply)) in request.ops.iter().zip(results).enumerate() {
        if !op.accepts(reply) {
            return Err(ProtocolError::UnexpectedReply {
                id: request.id,
                index,
                op: op_name(op),
                reply: reply.status(),
            });
        }
    }
    Ok(())
}

fn op_name(op: &RequestOp) -> &'static str {
    match op {
        RequestOp::Put { .. } => "PUT",
        RequestOp::Get { .. } => "GET",
        RequestOp::Delete { .. } => "DELETE",
        RequestOp::Ping => "PING",
        RequestOp::Begin => "BEGIN",
        RequestOp::GetForUpdate { .. } => "GET_FOR_UPDATE",
        RequestOp::Commit => "COMMIT",
        RequestOp::Rollback => "ROLLBACK",
        RequestOp::Stats => "STATS",
        RequestOp::PutExpiring { .. } => "PUT_EXPIRING",
        RequestOp::Expire { .. } => "EXPIRE",
        RequestOp::Ttl { .. } => "TTL",
        RequestOp::Scan { .. } => "SCAN",
        RequestOp::Backup { .. } => "BACKUP",
    }
}

/// Sends queued frames, several per write when they queue up. Ends when the
/// client is dropped (the queue closes) or the socket fails.
async fn write_loop(
    mut write: WriteHalf,
    mut queue: mpsc::UnboundedReceiver<Bytes>,
    connection: Arc<Connection>,
) {
    let mut coalesced = BytesMut::new();
    while let Some(first) = queue.recv().await {
        let result = if queue.is_empty() || first.len() >= WRITE_COALESCE_BYTES {
            write.write_all(&first).await
        } else {
            coalesced.clear();
            coalesced.extend_from_slice(&first);
            while coalesced.len() < WRITE_COALESCE_BYTES {
                match queue.try_recv() {
                    Ok(frame) => coalesced.extend_from_slice(&frame),
                    Err(_) => break,
                }
            }
            write.write_all(&coalesced).await
        };
        // TLS may hold encrypted bytes back until flushed (a no-op on TCP).
        let result = match result {
            Ok(()) => write.flush().await,
            Err(error) => Err(error),
        };
        if let Err(error) = result {
            let reason = format!("write failed: {error}");
            connection.fail_all(reason.clone(), || ClientError::Closed {
                reason: reason.clone(),
            });
            return;
        }
    }
}

/// Reads answers and hands each to the oldest outstanding request. Ends at
/// EOF, on a socket error, on a protocol violation or after an ERROR frame
/// with CLOSE; every request still outstanding then fails, and the writer is
/// stopped so the socket closes.
async fn read_loop(
    read: ReadHalf,
    buf: BytesMut,
    connection: Arc<Connection>,
    writer: AbortHandle,
) {
    let stop = read_until_stop(read, buf, &connection).await;
    stop.apply(&connection);
    writer.abort();
}

async fn read_until_stop(mut read: ReadHalf, mut buf: BytesMut, connection: &Connection) -> Stop {
    loop {
        loop {
            match decode_response(&mut buf, &connection.limits) {
                Ok(Some(frame)) => {
                    if let Some(stop) = deliver(connection, frame) {
                        return stop;
                    }
                }
                Ok(None) => break,
                Err(error) => {
                    return Stop::Protocol(ProtocolError::Decode(error));
                }
            }
        }
        // The frame's length passed the limit check, so reserving what it
        // needs is bounded by frame_bytes_max.
        let want = match check_frame(&buf, &connection.limits) {
            Err(DecodeError::NeedMore { have, need }) => (need - have).max(READ_CHUNK_BYTES),
            _ => READ_CHUNK_BYTES,
        };
        buf.reserve(want);
        match read.read_buf(&mut buf).await {
            Ok(0) => {
                let reason = if buf.is_empty() {
                    "the server closed the connection".to_owned()
                } else {
                    format!("the server closed the connection in the middle of a frame ({} bytes buffered)", buf.len())
                };
                return Stop::Closed(reason);
            }
            Ok(_) => {}
            Err(error) => {
                return Stop::Closed(format!("read failed: {error}"));
            }
        }
    }
}

/// Why the reader stopped, and what outstanding requests are told.
enum Stop {
    Closed(String),
    Protocol(ProtocolError),
    Fatal(ErrorFrame),
}

impl Stop {
    fn apply(self, connection: &Connection) {
        match self {
            Stop::Closed(reason) => connection.fail_all(reason.clone(), || ClientError::Closed {
                reason: reason.clone(),
            }),
            Stop::Protocol(error) => connection
                .fail_all(format!("protocol violation: {error}"), || {
                    ClientError::Protocol(error.clone())
                }),
            Stop::Fatal(frame) => connection.fail_all(
                format!(
                    "the server closed the connection ({}: {})",
                    frame.status, frame.message
                ),
                || ClientError::Server {
                    status: frame.status,
                    message: frame.message.clone(),
                },
            ),
        }
    }
}

/// Hands one server frame to its request. `Some` when the reader must stop.
fn deliver(connection: &Connection, frame: ServerFrame) -> Option<Stop> {
    let (id, outcome, close) = match frame {
        ServerFrame::Response(response) => (Some(response.id), Ok(response.results), None),
        ServerFrame::Error(error) => {
            let outcome = Err((error.status, error.message.clone()));
            (error.id, outcome, error.close.then_some(error))
        }
    };
    let Some(id) = id else {
        // A connection-wide ERROR with CLOSE: every outstanding request fails with it.
        return close.map(Stop::Fatal);
    };
    let pending = {
        let mut state = connection.lock();
        match state.pending.front() {
            None => return Some(Stop::Protocol(ProtocolError::Unsolicited { id })),
            Some(oldest) if oldest.id != id => {
                let expected = oldest.id;
                return Some(Stop::Protocol(ProtocolError::IdMismatch {
                    expected,
                    got: id,
                }));
            }
            Some(_) => state.pending.pop_front(),
        }
    };
    if let Some(pending) = pending {
        let result = outcome.map_err(|(status, message)| ClientError::Server { status, message });
        // The caller may have stopped waiting; its answer is dropped.
        let _ = pending.reply.send(result);
    }
    close.map(Stop::Fatal)
}

/// An interactive transaction on one connection ([`Client::transaction`]).
///
/// Each call sends one frame; the first carries BEGIN in front of its
/// operations, and [`Transaction::commit_with`] puts its operations and
/// COMMIT in one frame, so a read-modify-write transaction costs two round
/// trips. A server answer of DIE, LOCK_TIMEOUT or ABORTED means the
/// transaction was aborted and holds no locks: run it again from a new
/// transaction ([`Status::is_txn_retry`]). Dropping an unfinished
/// transaction queues a ROLLBACK (closing the connection also rolls it back).
pub struct Transaction<'a> {
    client: &'a Client,
    begun: bool,
    finished: bool,
}

impl Transaction<'_> {
    /// Sends `ops` (after BEGIN if this is the first frame) and returns
    /// their replies; an error answer to BEGIN itself is an `Err`.
    pub async fn batch(&mut self, ops: Vec<RequestOp>) -> Result<Vec<OpReply>, ClientError> {
        assert!(!self.finished, "a finished transaction is not used again");
        if self.begun {
            return self.client.batch(ops).await;
        }
        let mut framed = Vec::with_capacity(ops.len() + 1);
        framed.push(RequestOp::Begin);
        framed.extend(ops);
        let mut replies = self.client.batch(framed).await?;
        let begin = replies.remove(0);
        if let OpReply::Error { status, message } = begin {
            return Err(ClientError::Server { status, message });
        }
        self.begun = true;
        Ok(replies)
    }

    async fn one(&mut self, op: RequestOp) -> Result<OpReply, ClientError> {
        match self.batch(vec![op]).await?.pop() {
            Some(OpReply::Error { status, message }) => {
                Err(ClientError::Server { status, message })
            }
            Some(reply) => Ok(reply),
            None => unreachable!("one reply per op is checked by batch"),
        }
    }

    /// Locks `key` and reads it.
    pub async fn get_for_update(
        &mut self,
        key: impl Into<Bytes>,
    ) -> Result<Option<Bytes>, ClientError> {
        match self
            .one(RequestOp::GetForUpdate { key: key.into() })
            .await?
        {
            OpReply::Value(v) => Ok(Some(v)),
            _ => Ok(None),
        }
    }

    /// Reads `key` without a lock (read committed; sees this
    /// transaction's own writes).
    pub async fn get(&mut self, key: impl Into<Bytes>) -> Result<Option<Bytes>, ClientError> {
        match self.one(RequestOp::Get { key: key.into() }).await? {
            OpReply::Value(v) => Ok(Some(v)),
            _ => Ok(None),
        }
    }

    /// Locks `key` and buffers the write until commit.
    pub async fn put(
        &mut self,
        key: impl Into<Bytes>,
        value: impl Into<Bytes>,
    ) -> Result<(), ClientError> {
        self.one(RequestOp::Put {
            key: key.into(),
            value: value.into(),
        })
        .await
        .map(drop)
    }

    /// Locks `key` and buffers its removal; true if it existed.
    pub async fn delete(&mut self, key: impl Into<Bytes>) -> Result<bool, ClientError> {
        Ok(self.one(RequestOp::Delete { key: key.into() }).await? == OpReply::Ok)
    }

    /// Commits (durable under `sync` when this returns Ok).
    pub async fn commit(self) -> Result<(), ClientError> {
        self.commit_with(Vec::new()).await.map(drop)
    }

    /// Sends `ops` and COMMIT in one frame. Returns the replies to `ops`;
    /// `Err` if any of them or the commit failed (then nothing was written).
    pub async fn commit_with(mut self, ops: Vec<RequestOp>) -> Result<Vec<OpReply>, ClientError> {
        if !self.begun && ops.is_empty() {
            self.finished = true;
            return Ok(Vec::new());
        }
        let mut framed = ops;
        framed.push(RequestOp::Commit);
        let result = self.batch(framed).await;
        self.finished = true;
        let mut replies = result?;
        let commit = replies.pop();
        if let Some(OpReply::Error { status, message }) = replies
            .iter()
            .find(|r| matches!(r, OpReply::Error { .. }))
            .cloned()
            .or(commit)
        {
            return Err(ClientError::Server { status, message });
        }
        Ok(replies)
    }

    /// Rolls back (nothing is written, every lock is released).
    pub async fn rollback(mut self) -> Result<(), ClientError> {
        self.finished = true;
        if !self.begun {
            return Ok(());
        }
        self.client.single(RequestOp::Rollback).await.map(drop)
    }
}

impl Drop for Transaction<'_> {
    fn drop(&mut self) {
        // If the ROLLBACK cannot be queued (pipeline full, connection
        // closed), the server's idle timeout or the connection's close ends
        // the transaction instead.
        if self.begun && !self.finished {
            let _ = self.client.send_detached(vec![RequestOp::Rollback]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_records_are_recognised_from_three_bytes() {
        // A TLS 1.2 fatal alert, as a TLS server answers a ringkv hello.
        let alert = [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x32];
        assert_eq!(tls_record_guess(&alert), TlsGuess::Yes);
        assert_eq!(tls_record_guess(&alert[..3]), TlsGuess::Yes);
        assert_eq!(tls_record_guess(&alert[..2]), TlsGuess::NeedMore);
        assert_eq!(tls_record_guess(&alert[..1]), TlsGuess::NeedMore);
        // A handshake record (a ServerHello) with the TLS 1.0 record version.
        assert_eq!(tls_record_guess(&[0x16, 0x03, 0x01, 0x00]), TlsGuess::Yes);
        // Not TLS: ringkv's own magic, text, an unknown record version.
        assert_eq!(tls_record_guess(b"RKV1"), TlsGuess::No);
        assert_eq!(tls_record_guess(b"-ERR unknown"), TlsGuess::No);
        assert_eq!(tls_record_guess(&[0x15, 0x03, 0x07]), TlsGuess::No);
        assert_eq!(tls_record_guess(&[0x17, 0x03, 0x03]), TlsGuess::No);
    }
}
