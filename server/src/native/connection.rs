//! One client connection on its shard thread: a reader task that reads and
//! decodes frames ([`Session`]) and an executor task that runs them on the
//! engine one after another and writes the answers, joined by a bounded
//! [`Pipe`].
//!
//! What must hold:
//! - answers leave in request order, and a connection's requests run one
//!   after another (a request sees the effects of the ones before it);
//! - at most `pipeline_depth_max` frames and about `frame_bytes_max` bytes
//!   of decoded requests wait per connection; the read buffer never grows
//!   past one frame (+ one read chunk); so one connection's memory is bounded
//!   by a few times `frame_bytes_max` whatever the client sends;
//! - a misbehaving client gets an error answer or a close with a logged
//!   reason, and nothing it does reaches another connection.

use std::cell::Cell;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use compio::buf::{BufResult, IntoInner, IoBuf};
use compio::io::{AsyncRead, AsyncWriteExt};
use compio::net::TcpStream;
use ringkv_protocol::{encode_response, Request, Status};

use crate::auth::Verdict;
use crate::native::exec::{assemble, plan, scan_room_bytes};
use crate::native::pipe::Pipe;
use crate::native::scan::scan_each;
use crate::native::session::{error_frame, CloseReason, Session, Step, HANDSHAKE_BYTES_MAX};
use crate::ops::counters::{OpKind, OpTally};
use crate::ops::status::for_version;
use crate::shard::ShardContext;
use crate::tls::{TlsConn, TlsFailure};

/// Smallest free space offered to one read.
const READ_CHUNK_BYTES: usize = 64 * 1024;
/// Read buffer before the handshake is accepted: the whole pre-auth budget
/// of an unauthenticated client (it never gets more buffer than this).
pub(crate) const HANDSHAKE_READ_BYTES: usize = 1024;
const _: () = assert!(HANDSHAKE_READ_BYTES >= HANDSHAKE_BYTES_MAX);
/// After a fatal protocol error, how long and how much the reader keeps
/// draining input so the final ERROR frame is not lost to a TCP reset.
const LINGER_TIME: Duration = Duration::from_secs(2);
const LINGER_BYTES_MAX: usize = 1 << 20;
/// After a failed TLS handshake, how long the alert gets to reach the peer.
const REFUSAL_LINGER_TIME: Duration = Duration::from_millis(200);

/// What the reader hands the executor.
#[derive(Debug)]
pub enum Work {
    /// Bytes to write as they are.
    Send(Bytes),
    /// A request to run and answer; `received` is when it was decoded,
    /// `version` the connection's protocol version (what its answer may
    /// use).
    Run {
        request: Request,
        received: Instant,
        version: u16,
    },
    /// Write the bytes (if any), then stop: the connection is closing.
    Close(Option<Bytes>),
}

/// The per-connection state the shard's housekeeping can see: when the
/// connection last moved bytes, since when it has held part of a message
/// without completing one, whether a request is running, and a forced close
/// reason (idle timeout, shutdown).
#[derive(Debug)]
pub struct ConnState {
    pub id: u64,
    pub peer: SocketAddr,
    fd: RawFd,
    last_activity: Cell<Instant>,
    /// Set while the reader waits on the socket with an incomplete message
    /// buffered: when that message started waiting. A client that trickles
    /// bytes without ever completing a message is cut off by this, not by
    /// `last_activity`.
    partial_since: Cell<Option<Instant>>,
    executing: Cell<bool>,
    forced: Cell<Option<CloseReason>>,
    /// Until the handshake is accepted: when it must be, or the connection
    /// is closed (a client that never finishes its handshake).
    handshake_deadline: Cell<Option<Instant>>,
}

impl ConnState {
    pub fn new(
        id: u64,
        peer: SocketAddr,
        fd: RawFd,
        now: Instant,
        handshake_deadline: Instant,
    ) -> ConnState {
        ConnState {
            id,
            peer,
            fd,
            last_activity: Cell::new(now),
            partial_since: Cell::new(None),
            executing: Cell::new(false),
            forced: Cell::new(None),
            handshake_deadline: Cell::new(Some(handshake_deadline)),
        }
    }

    /// The handshake was accepted: the handshake deadline no longer applies.
    pub fn handshake_done(&self) {
        self.handshake_deadline.set(None);
    }

    /// Why housekeeping should close this connection now, if it should: its
    /// handshake deadline passed, or it is idle ([`ConnState::is_idle`]).
    pub fn idle_reason(&self, now: Instant, timeout: Duration) -> Option<CloseReason> {
        if self.handshake_deadline.get().is_some_and(|d| now >= d) {
            Some(CloseReason::HandshakeTimeout)
        } else if self.is_idle(now, timeout) {
            Some(CloseReason::IdleTimeout)
        } else {
            None
        }
    }

    pub(crate) fn touch(&self) {
        self.last_activity.set(Instant::now());
    }

    /// Whether the connection is idle for `timeout`: no bytes moved in
    /// either direction while no request of it was running in the engine, or
    /// an incomplete message buffered that long without completing.
    pub fn is_idle(&self, now: Instant, timeout: Duration) -> bool {
        let silent = !self.executing.get()
            && now.saturating_duration_since(self.last_activity.get()) >= timeout;
        let stalled = self
            .partial_since
            .get()
            .is_some_and(|since| now.saturating_duration_since(since) >= timeout);
        silent || stalled
    }

    /// The reader is about to wait on the socket; `partial` says whether it
    /// holds part of a message, and `progressed` whether it completed one
    /// since the last wait.
    pub(crate) fn reading(&self, partial: bool, progressed: bool) {
        match (partial, self.partial_since.get()) {
            (false, _) => self.partial_since.set(None),
            (true, Some(_)) if !progressed => {}
            (true, _) => self.partial_since.set(Some(Instant::now())),
        }
    }

    /// The reader stopped waiting on the socket (it is decoding or handing
    /// requests over, which may wait on us, not on the client).
    pub(crate) fn not_reading(&self) {
        self.partial_since.set(None);
    }

    /// Stops reading (and, with `both`, writing) the socket: the reader sees
    /// end-of-stream and the connection winds down, recording `reason`.
    pub fn force_close(&self, reason: CloseReason, both: bool) {
        if self.forced.get().is_none() {
            self.forced.set(Some(reason));
        }
        let how = if both { libc::SHUT_RDWR } else { libc::SHUT_RD };
        // SAFETY: `fd` belongs to a socket that stays open while this state
        // is registered (the registry entry is removed before the socket is
        // dropped); shutdown does not release the descriptor.
        unsafe {
            libc::shutdown(self.fd, how);
        }
    }

    pub(crate) fn forced(&self) -> Option<CloseReason> {
        self.forced.get()
    }

    /// Whether a request of this connection is running in the engine (an
    /// executing connection is not idle).
    pub(crate) fn set_executing(&self, executing: bool) {
        self.executing.set(executing);
    }

    /// Whether the peer is gone for good: the socket reports an error or a
    /// hang-up (a reset, or both directions closed). A peer that only
    /// closed its sending side may still read its answers: not gone.
    fn peer_gone(&self) -> bool {
        let mut pfd = libc::pollfd {
            fd: self.fd,
            events: libc::POLLRDHUP,
            revents: 0,
        };
        // SAFETY: one valid pollfd for a socket that stays open while this
        // state is registered; a zero timeout never blocks.
        let n = unsafe { libc::poll(&mut pfd, 1, 0) };
        n > 0 && pfd.revents & (libc::POLLHUP | libc::POLLERR) != 0
    }
}

/// The byte stream of one connection: the socket, with TLS over it when the
/// listener uses TLS. Shared (in an `Rc`) by the reader and writer tasks.
pub(crate) struct Wire {
    stream: TcpStream,
    tls: Option<TlsConn>,
}

impl Wire {
    pub(crate) fn new(stream: TcpStream, tls: Option<TlsConn>) -> Wire {
        Wire { stream, tls }
    }

    pub(crate) fn stream(&self) -> &TcpStream {
        &self.stream
    }

    /// Reads into `buf` after its first `start` bytes, at most `room` bytes
    /// (the caller has reserved them); `Ok(0)` is end of stream.
    pub(crate) async fn read(
        &self,
        buf: BytesMut,
        room: usize,
    ) -> (std::io::Result<usize>, BytesMut) {
        match &self.tls {
            None => {
                let start = buf.len();
                let end = start + room.min(buf.capacity() - start);
                let BufResult(result, slice) = (&self.stream).read(buf.slice(start..end)).await;
                (result, slice.into_inner())
            }
            Some(tls) => {
                let mut buf = buf;
                let result = tls.read_plain(&self.stream, &mut buf, room).await;
                (result, buf)
            }
        }
    }

    /// Writes all of `out` (encrypted when TLS is on).
    pub(crate) async fn write_all(&self, out: BytesMut) -> (std::io::Result<()>, BytesMut) {
        match &self.tls {
            None => {
                let BufResult(result, out) = (&self.stream).write_all(out).await;
                (result, out)
            }
            Some(tls) => {
                let result = tls.write_plain(&self.stream, &out).await;
                (result, out)
            }
        }
    }

    /// Ends the sending side (a TLS close_notify first).
    pub(crate) async fn shutdown_write(&self) {
        use compio::io::AsyncWrite;
        if let Some(tls) = &self.tls {
            tls.close(&self.stream).await;
        }
        if let Err(e) = (&self.stream).shutdown().await {
            tracing::trace!(error = %e, "shutdown(SHUT_WR) failed");
        }
    }
}

/// Serves one accepted connection until it closes. The caller has counted it
/// in the open-connection total; this function registers it with the shard
/// for housekeeping and unregisters it at the end.
pub async fn serve(ctx: Rc<ShardContext>, stream: TcpStream, peer: SocketAddr) {
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!(%peer, error = %e, "could not set TCP_NODELAY");
    }
    // Declared after `stream`: dropped (unregistered) before the socket.
    let registration = ctx.register(peer, stream.as_raw_fd());
    let conn = Rc::clone(registration.conn());
    let tls = match &ctx.shared.access.tls {
        None => None,
        Some(config) => match TlsConn::accept(&stream, config.current()).await {
            Ok(tls) => Some(tls),
            Err(e) => {
                let reason = conn.forced().unwrap_or(match e {
                    TlsFailure::Io(_) => CloseReason::PeerClosed,
                    TlsFailure::Tls(_) => CloseReason::TlsError,
                });
                ctx.counters().add_closed(reason);
                log_close(&ctx, &conn, reason, &format!("TLS handshake: {e}"), None);
                linger(&stream, REFUSAL_LINGER_TIME).await;
                return;
            }
        },
    };
    // From here the socket lives in `wire`; the explicit drops at the end
    // keep the order "unregister, then close" (nothing runs in between).
    let wire = Rc::new(Wire { stream, tls });
    let limits = ctx.shared.limits;
    let pipe: Pipe<Work> = Pipe::new(
        limits.pipeline_depth_max as usize,
        limits.frame_bytes_max as usize,
    );
    let reader = compio::runtime::spawn(read_loop(
        Rc::clone(&ctx),
        Rc::clone(&conn),
        Rc::clone(&wire),
        pipe.clone(),
    ));
    let write_outcome = execute_loop(&ctx, &conn, &wire, &pipe).await;
    if write_outcome.is_err() {
        // Nobody reads the answers any more: stop the reader too.
        pipe.close_receiver();
        conn.force_close(CloseReason::IoError, true);
    }
    let read_outcome = match reader.await {
        Ok(outcome) => outcome,
        Err(e) => {
            tracing::error!(%peer, error = ?e, "connection reader task failed");
            ReadOutcome {
                reason: CloseReason::IoError,
                detail: "reader task failed".to_string(),
            }
        }
    };
    let reason = conn.forced().unwrap_or(read_outcome.reason);
    let reason = match (&write_outcome, reason) {
        (Err(_), CloseReason::PeerClosed) => CloseReason::IoError,
        (_, r) => r,
    };
    ctx.counters().add_closed(reason);
    log_close(
        &ctx,
        &conn,
        reason,
        &read_outcome.detail,
        write_outcome.err(),
    );
    drop(registration);
    // The last `wire` Rc closes the socket, after the registration is gone.
    drop(wire);
}

fn log_close(
    ctx: &ShardContext,
    conn: &ConnState,
    reason: CloseReason,
    detail: &str,
    write_error: Option<std::io::Error>,
) {
    let peer = conn.peer;
    match reason {
        CloseReason::PeerClosed | CloseReason::Shutdown => {
            tracing::debug!(%peer, conn = conn.id, reason = reason.name(), "connection closed")
        }
        CloseReason::IdleTimeout
        | CloseReason::IoError
        | CloseReason::TooManyConnections
        | CloseReason::HandshakeTimeout => {
            tracing::debug!(%peer, conn = conn.id, reason = reason.name(), detail, write_error = ?write_error, "connection closed")
        }
        CloseReason::AuthFailed => {
            if ctx.allow_warning() {
                tracing::warn!(%peer, conn = conn.id, detail, "refused a connection: authentication failed")
            } else {
                tracing::debug!(%peer, conn = conn.id, detail, "refused a connection: authentication failed")
            }
        }
        CloseReason::BadHandshake | CloseReason::ProtocolError | CloseReason::TlsError => {
            if ctx.allow_warning() {
                tracing::warn!(%peer, conn = conn.id, reason = reason.name(), detail, "closed a connection that broke the protocol")
            } else {
                tracing::debug!(%peer, conn = conn.id, reason = reason.name(), detail, "closed a connection that broke the protocol")
            }
        }
    }
}

/// How the reader ended.
#[derive(Debug)]
struct ReadOutcome {
    reason: CloseReason,
    detail: String,
}

async fn read_loop(
    ctx: Rc<ShardContext>,
    conn: Rc<ConnState>,
    wire: Rc<Wire>,
    pipe: Pipe<Work>,
) -> ReadOutcome {
    let mut session = Session::with_auth(
        ctx.shared.limits,
        ctx.shared.hello_ack.clone(),
        Arc::clone(&ctx.shared.access.auth),
    );
    // Small until the handshake is accepted: an unauthenticated client gets
    // no more memory than its handshake needs.
    let mut buf = BytesMut::with_capacity(HANDSHAKE_READ_BYTES);
    let outcome = loop {
        let (progressed, closing) =
            match hand_over(&ctx, &conn, &mut session, &mut buf, &pipe).await {
                Ok(handed) => handed,
                Err(stopped) => {
                    pipe.close_sender();
                    return stopped;
                }
            };
        if let Some(outcome) = closing {
            pipe.close_sender();
            linger(&wire.stream, LINGER_TIME).await;
            return outcome;
        }
        // Room for the rest of the current message, at least one chunk.
        let want = session.bytes_wanted(&buf);
        let chunk = if session.is_ready() {
            READ_CHUNK_BYTES
        } else {
            HANDSHAKE_READ_BYTES
        };
        let spare = crate::sockets::read_room(want.saturating_sub(buf.len()), buf.len(), chunk);
        buf.reserve(spare);
        let start = buf.len();
        conn.reading(start > 0, progressed);
        let (result, back) = wire.read(buf, spare).await;
        buf = back;
        match result {
            Ok(0) => {
                let detail = if buf.is_empty() {
                    String::new()
                } else {
                    format!("{} bytes of an unfinished message were dropped", buf.len())
                };
                break ReadOutcome {
                    reason: CloseReason::PeerClosed,
                    detail,
                };
            }
            Ok(n) => {
                conn.touch();
                ctx.counters().add_received(n);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                let (reason, detail) = read_failure(&e);
                break ReadOutcome { reason, detail };
            }
        }
    };
    pipe.close_sender();
    outcome
}

/// Hands every complete message in `buf` to the executor. Returns whether
/// any was, and how the connection ends when the session closed it; `Err`
/// when the executor is gone.
async fn hand_over(
    ctx: &ShardContext,
    conn: &ConnState,
    session: &mut Session,
    buf: &mut BytesMut,
    pipe: &Pipe<Work>,
) -> Result<(bool, Option<ReadOutcome>), ReadOutcome> {
    let mut progressed = false;
    loop {
        let refuse = ctx
            .shared
            .is_shutting_down()
            .then_some(Status::ShuttingDown);
        let Some(step) = session.next_step(buf, refuse) else {
            return Ok((progressed, None));
        };
        progressed = true;
        conn.not_reading();
        let mut closing = None;
        let pushed = match step {
            Step::Send(bytes) => {
                if session.is_ready() {
                    conn.handshake_done();
                }
                note_error_frame(ctx, &bytes);
                pipe.push(Work::Send(bytes), 0).await
            }
            Step::Run {
                request,
                frame_bytes,
            } => {
                let work = Work::Run {
                    request,
                    received: Instant::now(),
                    version: session.version(),
                };
                pipe.push(work, frame_bytes).await
            }
            Step::Close { reply, reason } => {
                if let Some(bytes) = &reply {
                    note_error_frame(ctx, bytes);
                }
                let detail = close_detail(ctx, session).await;
                closing = Some(ReadOutcome { reason, detail });
                pipe.push(Work::Close(reply), 0).await
            }
        };
        if pushed.is_err() {
            return Err(ReadOutcome {
                reason: CloseReason::IoError,
                detail: "writer stopped".to_string(),
            });
        }
        if closing.is_some() {
            return Ok((progressed, closing));
        }
    }
}

/// Why the session closed the connection, for the log; a wrong password
/// is answered only after a delay that slows down guessing (the connection
/// holds its slot meanwhile).
async fn close_detail(ctx: &ShardContext, session: &Session) -> String {
    match session.auth_refusal() {
        Some(verdict) => {
            if verdict == Verdict::WrongPassword {
                compio::time::sleep(ctx.shared.access.auth.failure_delay()).await;
            }
            format!("{verdict:?}")
        }
        None => session
            .last_error()
            .map(|e| e.to_string())
            .unwrap_or_default(),
    }
}

/// The close reason and detail for a failed read on either port.
pub(crate) fn read_failure(e: &std::io::Error) -> (CloseReason, String) {
    let tls = e
        .get_ref()
        .is_some_and(|inner| inner.is::<crate::tls::TlsReadError>());
    let reason = if tls {
        CloseReason::TlsError
    } else {
        CloseReason::IoError
    };
    (reason, format!("read failed: {e}"))
}

/// Reads and drops input for a short while so the peer receives our last
/// frame instead of a reset (closing with unread input sends RST).
pub(crate) async fn linger(stream: &TcpStream, time: Duration) {
    let deadline = Instant::now() + time;
    let mut drained = 0usize;
    let mut scratch = Vec::with_capacity(16 * 1024);
    while drained < LINGER_BYTES_MAX {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        let mut s = stream;
        match compio::time::timeout(left, s.read(std::mem::take(&mut scratch))).await {
            Ok(BufResult(Ok(n), back)) if n > 0 => {
                drained += n;
                scratch = back;
                scratch.clear();
            }
            _ => return,
        }
    }
}

fn note_error_frame(ctx: &ShardContext, bytes: &Bytes) {
    // ERROR frames and refused hello-acks both carry their status at a fixed
    // place; count ERROR frames by status for the metrics.
    use ringkv_protocol::{frame_kind, FRAME_HEADER_BYTES};
    if bytes.len() > FRAME_HEADER_BYTES && bytes[8] == frame_kind::ERROR {
        if let Some(status) = Status::from_code(bytes[FRAME_HEADER_BYTES]) {
            ctx.counters().add_error_frame(status);
        }
    }
}

/// Runs requests in order and writes every answer. Returns when the reader
/// is done and everything was written, or when a write fails.
async fn execute_loop(
    ctx: &Rc<ShardContext>,
    conn: &ConnState,
    wire: &Wire,
    pipe: &Pipe<Work>,
) -> std::io::Result<()> {
    // Grows with the first answers and is then reused (see `write_out`);
    // empty until then, so a connection that never authenticates costs
    // nothing here.
    let mut out = BytesMut::new();
    // The connection's open transaction; dropping it (connection closed)
    // rolls it back.
    let mut txn = crate::native::txn::ConnTxn::default();
    let txn_config = ctx.shared.txn;
    loop {
        let next = if txn.is_active() {
            match compio::time::timeout(txn_config.idle_timeout, pipe.pop()).await {
                Ok(next) => next,
                Err(_) => {
                    crate::native::txn::abort_idle(&mut txn).await;
                    continue;
                }
            }
        } else {
            pipe.pop().await
        };
        let Some((work, bytes)) = next else {
            break;
        };
        let stop = match work {
            Work::Send(b) => {
                out.extend_from_slice(&b);
                false
            }
            Work::Close(reply) => {
                if let Some(b) = reply {
                    out.extend_from_slice(&b);
                }
                true
            }
            Work::Run { .. } if conn.peer_gone() => {
                // Nobody will read the answer: do not run the request (nor
                // the ones queued after it).
                return Err(std::io::Error::new(
                    std::io::ErrorKind::ConnectionReset,
                    "the client is gone; its queued requests are dropped",
                ));
            }
            Work::Run {
                request,
                received,
                version,
            } if crate::native::txn::needs_txn_path(&request, txn.is_open()) => {
                let tally = run_in_txn(ctx, conn, &mut txn, request, version, &mut out).await;
                note_latency(ctx, received, &tally);
                false
            }
            Work::Run {
                request,
                received,
                version,
            } => {
                let tally = run_plain(ctx, conn, request, version, &mut out).await;
                note_latency(ctx, received, &tally);
                false
            }
        };
        out = write_out(ctx, conn, wire, out).await?;
        pipe.complete(bytes);
        if stop {
            wire.shutdown_write().await;
            return Ok(());
        }
    }
    // The reader is done. If the server is stopping, say so before closing.
    if conn.forced() == Some(CloseReason::Shutdown) {
        out.extend_from_slice(&error_frame(
            None,
            Status::ShuttingDown,
            "the server is shutting down".to_string(),
            true,
        ));
        ctx.counters().add_error_frame(Status::ShuttingDown);
        write_out(ctx, conn, wire, out).await?;
    }
    wire.shutdown_write().await;
    Ok(())
}

/// Runs a request that opens, uses or ends the connection's transaction,
/// appending its answer to `out`.
async fn run_in_txn(
    ctx: &ShardContext,
    conn: &ConnState,
    txn: &mut crate::native::txn::ConnTxn,
    request: Request,
    version: u16,
    out: &mut BytesMut,
) -> OpTally {
    let mut tally = OpTally::default();
    let mut fresh = if request
        .ops
        .iter()
        .any(|op| matches!(op, ringkv_protocol::RequestOp::Stats))
    {
        Some(ctx.stats_pairs_now().await)
    } else {
        None
    };
    let mut stats = || fresh.take().unwrap_or_else(|| ctx.stats_pairs());
    conn.executing.set(true);
    let response = crate::native::txn::run_request(
        &ctx.handle,
        &ctx.shared.txn,
        txn,
        request,
        ctx.shared.limits.frame_bytes_max,
        &mut stats,
        &mut tally,
    )
    .await;
    conn.executing.set(false);
    encode_response(&for_version(response, version), out);
    tally
}

/// Runs a request outside a transaction: its engine ops as one batch, then
/// its scans, appending the assembled answer to `out`.
async fn run_plain(
    ctx: &ShardContext,
    conn: &ConnState,
    request: Request,
    version: u16,
    out: &mut BytesMut,
) -> OpTally {
    let frame_bytes_max = ctx.shared.limits.frame_bytes_max;
    let mut plan = plan(request);
    let engine_ops = std::mem::take(&mut plan.engine_ops);
    let answer = if engine_ops.is_empty() {
        None
    } else {
        conn.executing.set(true);
        let answer = ctx.handle.batch(engine_ops).await;
        conn.executing.set(false);
        Some(answer)
    };
    let scan_answers = if plan.scans.is_empty() {
        Vec::new()
    } else {
        conn.executing.set(true);
        let room = scan_room_bytes(frame_bytes_max, plan.kinds.len(), plan.scans.len());
        let answers = scan_each(&ctx.handle, &plan.scans, room).await;
        conn.executing.set(false);
        answers
    };
    let mut tally = OpTally::default();
    let mut fresh = if plan.kinds.contains(&OpKind::Stats) {
        Some(ctx.stats_pairs_now().await)
    } else {
        None
    };
    let mut stats = || fresh.take().unwrap_or_else(|| ctx.stats_pairs());
    let response = assemble(
        &plan,
        answer,
        scan_answers,
        frame_bytes_max,
        &mut stats,
        &mut tally,
    );
    encode_response(&for_version(response, version), out);
    tally
}

/// Counts a finished request and the time since its frame was read.
fn note_latency(ctx: &ShardContext, received: Instant, tally: &OpTally) {
    let latency_us = received.elapsed().as_micros().min(u128::from(u64::MAX)) as u64;
    ctx.counters().add_request(tally, latency_us);
}

/// Writes `out` whole to the client and counts it; returns the buffer,
/// emptied, for the next answers (a new small one after a large answer).
/// Both ports' connections write through it.
pub(crate) async fn write_out(
    ctx: &ShardContext,
    conn: &ConnState,
    wire: &Wire,
    out: BytesMut,
) -> std::io::Result<BytesMut> {
    if out.is_empty() {
        return Ok(out);
    }
    let len = out.len();
    let (result, mut out) = wire.write_all(out).await;
    result?;
    conn.touch();
    ctx.counters().add_sent(len);
    out.clear();
    // Do not keep a huge buffer around after one large answer.
    if out.capacity() > 4 * READ_CHUNK_BYTES {
        out = BytesMut::with_capacity(READ_CHUNK_BYTES);
    }
    Ok(out)
}
