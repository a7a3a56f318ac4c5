//! One shard's RESP front door and its connections, run on the shard's
//! own runtime thread beside the native listener: accept on this shard's
//! SO_REUSEPORT RESP socket, then per connection a reader task (bytes →
//! commands, [`RespDecoder`]) and an executor task (commands → engine
//! batches → replies), joined by a bounded [`Pipe`].
//!
//! What must hold:
//! - commands run in the order they arrived and replies leave in that
//!   order; consecutive commands are sent to the engine as one batch (split
//!   by owning shard by the engine's router, like a native batch), so a
//!   pipeline costs one round of group commit, and a write's reply waits
//!   for the configured durability exactly as a native PUT's does;
//! - a connection holds at most one partial command in its read buffer
//!   (bounded by `limits.frame_bytes_max`; before it authenticates, by
//!   [`PREAUTH_COMMAND_BYTES_MAX`], the native port's pre-auth buffer), and at most
//!   `server.pipeline_depth_max` reads' worth of decoded commands (at most
//!   `limits.frame_bytes_max` bytes) wait for the executor: a client that
//!   does not read its replies stops being read (TCP back-pressure);
//! - a protocol error is answered with Redis's text and the connection is
//!   closed; nothing a client sends reaches another connection or stops
//!   the shard;
//! - when a password is set, a connection that has not authenticated
//!   within `server.handshake_timeout` (its TLS handshake included) is
//!   closed, as on the native port.

use std::cell::Cell;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::rc::Rc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use compio::buf::BufResult;
use compio::io::AsyncWriteExt;
use compio::net::{TcpListener, TcpStream};
use engine::{Op, OpResult};
use ringkv_protocol::resp::{Command, ReplyWriter, RespDecoder, RespError, RespLimits, Version};

use super::command::{
    finish, plan, plan_hello, Client, Env, Finish, MultiCommand, Planned, AUTH_NO_PASSWORD,
    AUTH_WRONG_PASS,
};
use super::counters::RespCounters;
use super::info::answer_server_command;
use super::multi::{self, error_reply, MultiLimits, MultiState, Queued, WATCH_INSIDE_MULTI};
use crate::native::connection::{
    linger, read_failure, write_out, ConnState, Wire, HANDSHAKE_READ_BYTES,
};
use crate::native::pipe::Pipe;
use crate::native::session::CloseReason;
use crate::shard::ShardContext;
use crate::tls::{TlsConn, TlsFailure};

/// Smallest free space offered to one read.
const READ_CHUNK_BYTES: usize = 64 * 1024;
/// Replies beyond this many bytes are written before the next engine batch.
const OUT_FLUSH_BYTES: usize = 256 * 1024;
/// Most commands the reader hands over in one pipe item.
const COMMANDS_PER_ITEM_MAX: usize = 1024;
/// After a protocol error, how long the reader drains input so the error
/// reply is not lost to a TCP reset.
const LINGER_TIME: Duration = Duration::from_secs(2);
/// Pause after an accept error about resources (EMFILE...).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);
/// The reply to a connection over `server.max_connections` (Redis's text).
const TOO_MANY_CLIENTS: &[u8] = b"-ERR max number of clients reached\r\n";
/// Largest partial command buffered before the client authenticated (when
/// a password is set): the native port's pre-auth read buffer. AUTH with a
/// 512-byte password, or HELLO 3 AUTH with it and a short user and client
/// name, fits; a longer command is refused as soon as its length is known.
pub const PREAUTH_COMMAND_BYTES_MAX: usize = HANDSHAKE_READ_BYTES;
/// After a failed TLS handshake, how long the alert gets to reach the peer.
const TLS_REFUSAL_LINGER: Duration = Duration::from_millis(200);

/// The RESP limits for a server's configuration.
pub fn resp_limits(limits: &ringkv_protocol::Limits) -> RespLimits {
    RespLimits {
        bulk_bytes_max: limits.key_bytes_max.max(limits.value_bytes_max) as usize,
        // MSET of 2 × ops_per_frame_max pairs (it runs as several engine
        // batches); each argument still counts against command_bytes_max.
        args_max: 4 * limits.ops_per_frame_max as usize + 1,
        command_bytes_max: limits.frame_bytes_max as usize,
    }
}

/// Accepts RESP connections on `listener` until the task is dropped (the
/// shard's accept loop drops it when the server stops; the shard's drain
/// then closes these connections with the native ones).
pub async fn accept_loop(ctx: Rc<ShardContext>, listener: std::net::TcpListener) {
    let listener = match TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(shard = ctx.shard, error = %e, "cannot use the RESP listening socket on this shard's runtime; the shard accepts no RESP connections");
            return;
        }
    };
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => admit(&ctx, stream, peer),
            Err(e) => {
                if ctx.allow_warning() {
                    tracing::warn!(shard = ctx.shard, error = %e, "RESP accept failed");
                }
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
                ) {
                    compio::time::sleep(ACCEPT_BACKOFF).await;
                }
            }
        }
    }
}

fn admit(ctx: &Rc<ShardContext>, stream: TcpStream, peer: SocketAddr) {
    ctx.counters().add_accepted();
    ctx.resp_counters().add_accepted();
    match ctx.shared.try_acquire_connection() {
        Some(slot) => {
            let ctx = Rc::clone(ctx);
            compio::runtime::spawn(async move {
                serve(&ctx, stream, peer).await;
                ctx.resp_counters().add_closed();
                drop(slot);
            })
            .detach();
        }
        None => {
            ctx.counters().add_closed(CloseReason::TooManyConnections);
            ctx.resp_counters().add_closed();
            if ctx.allow_warning() {
                tracing::warn!(%peer, max_connections = ctx.shared.max_connections, "refused a RESP connection: too many connections");
            }
            if ctx.shared.access.resp_tls.is_some() {
                // A TLS client cannot read a plaintext refusal: just close.
                return;
            }
            compio::runtime::spawn(async move {
                let mut s = &stream;
                let BufResult(result, _) = s.write_all(TOO_MANY_CLIENTS).await;
                if result.is_ok() {
                    let _ = compio::io::AsyncWrite::shutdown(&mut s).await;
                    linger(&stream, Duration::from_millis(500)).await;
                }
            })
            .detach();
        }
    }
}

/// What the reader hands the executor.
#[derive(Debug)]
enum Work {
    Commands(Vec<Command>),
    /// Write this error reply after everything before it, then close;
    /// `reset`: close with a reset instead of a FIN (see `oversized`).
    Close {
        reply: Bytes,
        reset: bool,
    },
}

/// A command too large to take: the client is most likely still sending
/// it and reads nothing until it is sent, so no reply would reach it.
/// Such a connection is reset at once, as Redis does: the client's next
/// write fails with "connection reset by peer" instead of waiting on a
/// server that stopped reading (or dying of SIGPIPE after a FIN).
fn oversized(e: &RespError) -> bool {
    matches!(
        e,
        RespError::BulkTooLarge { .. } | RespError::CommandTooLarge { .. }
    )
}

async fn serve(ctx: &Rc<ShardContext>, stream: TcpStream, peer: SocketAddr) {
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!(%peer, error = %e, "could not set TCP_NODELAY");
    }
    // Declared after `stream`: dropped (unregistered) before the socket.
    let registration = ctx.register(peer, stream.as_raw_fd());
    let conn = Rc::clone(registration.conn());
    // The handshake deadline covers the TLS handshake and, when a password
    // is set, the AUTH that must follow (RESP has no opening handshake of
    // its own; without a password only the idle timeout applies).
    let tls = match &ctx.shared.access.resp_tls {
        None => None,
        Some(config) => match TlsConn::accept(&stream, config.current()).await {
            Ok(tls) => Some(tls),
            Err(e) => {
                let reason = conn.forced().unwrap_or(match e {
                    TlsFailure::Io(_) => CloseReason::PeerClosed,
                    TlsFailure::Tls(_) => CloseReason::TlsError,
                });
                ctx.counters().add_closed(reason);
                if reason == CloseReason::TlsError && ctx.allow_warning() {
                    tracing::warn!(%peer, conn = conn.id, error = %e, "closed a RESP connection: TLS handshake failed");
                } else {
                    tracing::debug!(%peer, conn = conn.id, reason = reason.name(), error = %e, "RESP connection closed during the TLS handshake");
                }
                linger(&stream, TLS_REFUSAL_LINGER).await;
                drop(registration);
                return;
            }
        },
    };
    if !ctx.shared.access.auth.is_required() {
        conn.handshake_done();
    }
    let stream = Rc::new(Wire::new(stream, tls));
    let limits = ctx.shared.limits;
    let pipe: Pipe<Work> = Pipe::new(
        limits.pipeline_depth_max as usize,
        limits.frame_bytes_max as usize,
    );
    // Whether the client may run commands (see `Client::authenticated`);
    // the reader applies Redis's tighter limits until it is.
    let authenticated = Rc::new(Cell::new(!ctx.shared.access.auth.is_required()));
    let reader = compio::runtime::spawn(read_loop(
        Rc::clone(ctx),
        Rc::clone(&conn),
        Rc::clone(&stream),
        pipe.clone(),
        Rc::clone(&authenticated),
    ));
    let outcome = execute_loop(ctx, &conn, &stream, &pipe, &authenticated).await;
    // Whatever ended the executor (QUIT, a write error, the reader being
    // done), the reader stops too.
    pipe.close_receiver();
    if outcome.is_err() {
        conn.force_close(CloseReason::IoError, true);
    } else if !matches!(outcome, Ok(Ended::ReaderDone)) {
        conn.force_close(CloseReason::PeerClosed, false);
    }
    let (reason, detail) = match reader.await {
        Ok(r) => r,
        Err(_) => (CloseReason::IoError, "reader task failed".to_string()),
    };
    // A protocol error is what ended it even if the executor then shut the
    // socket; otherwise a forced close (idle, shutdown) names the reason.
    let reason = match (reason, conn.forced()) {
        (CloseReason::ProtocolError, _) => CloseReason::ProtocolError,
        (_, Some(forced)) => forced,
        (r, None) => r,
    };
    ctx.counters().add_closed(reason);
    match reason {
        CloseReason::ProtocolError if ctx.allow_warning() => {
            tracing::warn!(%peer, conn = conn.id, detail, "closed a RESP connection that broke the protocol")
        }
        _ => {
            tracing::debug!(%peer, conn = conn.id, reason = reason.name(), detail, write_error = ?outcome.err(), "RESP connection closed")
        }
    }
    drop(registration);
}

async fn read_loop(
    ctx: Rc<ShardContext>,
    conn: Rc<ConnState>,
    stream: Rc<Wire>,
    pipe: Pipe<Work>,
    authenticated: Rc<Cell<bool>>,
) -> (CloseReason, String) {
    let mut decoder = RespDecoder::new(resp_limits(&ctx.shared.limits));
    // Small until the client authenticates: it never gets more than this
    // buffer before it has proven anything.
    let mut buf = BytesMut::with_capacity(if authenticated.get() {
        READ_CHUNK_BYTES
    } else {
        PREAUTH_COMMAND_BYTES_MAX
    });
    let outcome = loop {
        conn.not_reading();
        let (progressed, mut fatal) =
            match hand_over(&mut decoder, &mut buf, &pipe, &authenticated).await {
                Ok(decoded) => decoded,
                Err(Stopped) => {
                    pipe.close_sender();
                    return (CloseReason::PeerClosed, "executor stopped".to_string());
                }
            };
        let room = read_room(&decoder, &buf, authenticated.get(), &mut fatal);
        if let Some((e, reset)) = fatal {
            ctx.resp_counters().add_error();
            let mut reply = BytesMut::new();
            ReplyWriter::new(&mut reply, Version::Resp2).error(&format!("ERR {e}"));
            let _ = pipe
                .push(
                    Work::Close {
                        reply: reply.freeze(),
                        reset,
                    },
                    0,
                )
                .await;
            pipe.close_sender();
            if !reset {
                linger(stream.stream(), LINGER_TIME).await;
            }
            return (CloseReason::ProtocolError, e);
        }
        buf.reserve(room);
        conn.reading(decoder.has_partial(&buf), progressed);
        let (result, back) = stream.read(buf, room).await;
        buf = back;
        match result {
            Ok(0) => break (CloseReason::PeerClosed, String::new()),
            Ok(n) => {
                conn.touch();
                ctx.counters().add_received(n);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => break read_failure(&e),
        }
    };
    pipe.close_sender();
    outcome
}

/// The executor is gone: nothing more can be handed over.
struct Stopped;

/// Decodes every complete command in `buf` and hands them to the executor
/// in items. Returns whether any command was handed over and the protocol
/// error that stopped decoding, if one did (its text, and whether the
/// connection is to be reset: `oversized`).
async fn hand_over(
    decoder: &mut RespDecoder,
    buf: &mut BytesMut,
    pipe: &Pipe<Work>,
    authenticated: &Cell<bool>,
) -> Result<(bool, Option<(String, bool)>), Stopped> {
    let mut progressed = false;
    loop {
        // Until the client authenticates, Redis's limits apply and
        // commands are handed over one at a time, each run before the
        // next is decoded (so an AUTH lifts the limits for what
        // follows it in the same pipeline, as in Redis).
        let one_at_a_time = !authenticated.get();
        decoder.set_unauthenticated(one_at_a_time);
        let per_item = if one_at_a_time {
            1
        } else {
            COMMANDS_PER_ITEM_MAX
        };
        let mut commands = Vec::new();
        let mut bytes = 0usize;
        let mut fatal = None;
        while commands.len() < per_item {
            match decoder.decode(buf) {
                Ok(Some(cmd)) => {
                    bytes += cmd.iter().map(|a| a.len() + 16).sum::<usize>();
                    commands.push(cmd);
                }
                Ok(None) => break,
                Err(e) => {
                    fatal = Some((e.to_string(), oversized(&e)));
                    break;
                }
            }
        }
        if commands.is_empty() {
            return Ok((progressed, fatal));
        }
        progressed = true;
        if pipe.push(Work::Commands(commands), bytes).await.is_err()
            || (one_at_a_time && pipe.drained().await.is_err())
        {
            return Err(Stopped);
        }
        if fatal.is_some() {
            return Ok((progressed, fatal));
        }
    }
}

/// How many bytes the next read may add to `buf`. Before AUTH only one
/// partial command is buffered (every complete one was handed over): it is
/// refused, through `fatal`, once it cannot fit.
fn read_room(
    decoder: &RespDecoder,
    buf: &BytesMut,
    authenticated: bool,
    fatal: &mut Option<(String, bool)>,
) -> usize {
    let wanted = decoder.bytes_wanted();
    if authenticated {
        return crate::sockets::read_room(
            wanted.saturating_sub(buf.len()),
            buf.len(),
            READ_CHUNK_BYTES,
        );
    }
    let room = PREAUTH_COMMAND_BYTES_MAX.saturating_sub(buf.len());
    if fatal.is_none() && (wanted > PREAUTH_COMMAND_BYTES_MAX || room == 0) {
        *fatal = Some((
            format!(
                "Protocol error: unauthenticated command longer than {PREAUTH_COMMAND_BYTES_MAX} bytes"
            ),
            false,
        ));
    }
    room
}

/// Why the executor stopped.
#[derive(Debug)]
enum Ended {
    /// The reader finished and everything was answered.
    ReaderDone,
    /// QUIT or a protocol error: answered, then closed.
    Closed,
    /// A command too large to take: answered, then reset (`oversized`).
    Reset,
}

/// Commands waiting for one engine batch.
struct Batch {
    ops: Vec<Op>,
    /// Per command in order: its reply, or where its ops are and how to
    /// finish it.
    pending: Vec<Pending>,
}

enum Pending {
    Ready(Bytes),
    Engine {
        /// The command's counter slot.
        slot: usize,
        start: usize,
        count: usize,
        finish: Finish,
        version: Version,
    },
}

impl Batch {
    fn new() -> Batch {
        Batch {
            ops: Vec::new(),
            pending: Vec::new(),
        }
    }

    fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }
}

/// One connection's executor state: the client's session, its MULTI queue,
/// the engine batch being gathered and the replies not yet written.
struct Executor<'a> {
    ctx: &'a Rc<ShardContext>,
    conn: &'a ConnState,
    stream: &'a Wire,
    authenticated: &'a Cell<bool>,
    env: Env,
    client: Client,
    multi_limits: MultiLimits,
    multi: MultiState,
    batch: Batch,
    out: BytesMut,
}

impl<'a> Executor<'a> {
    fn new(
        ctx: &'a Rc<ShardContext>,
        conn: &'a ConnState,
        stream: &'a Wire,
        authenticated: &'a Cell<bool>,
    ) -> Executor<'a> {
        let limits = ctx.shared.limits;
        let env = Env {
            value_bytes_max: limits.value_bytes_max as usize,
            ops_max: limits.ops_per_frame_max as usize,
            flush_enabled: ctx.shared.facts.resp_flush_enabled,
        };
        // Redis's client ids start at 1 (clients check `CLIENT ID > 0`); the
        // connection ids start at 0.
        let mut client = Client::with_identity(
            ((conn.id & (i64::MAX as u64)) as i64).saturating_add(1),
            ctx.shared.access.auth.default_identity().clone(),
        );
        client.authenticated = authenticated.get();
        let multi_limits = MultiLimits {
            commands_max: ctx.shared.txn.settings.locks_max,
            bytes_max: limits.frame_bytes_max as usize,
        };
        Executor {
            ctx,
            conn,
            stream,
            authenticated,
            env,
            client,
            multi_limits,
            multi: MultiState::default(),
            batch: Batch::new(),
            out: BytesMut::with_capacity(READ_CHUNK_BYTES),
        }
    }

    /// Runs the gathered batch, appending its replies (and writing them
    /// out once enough has gathered): every command before this point has
    /// run when it returns.
    async fn run_batch(&mut self) -> std::io::Result<()> {
        let out = std::mem::take(&mut self.out);
        self.out = run_and_write(self.ctx, self.conn, self.stream, &mut self.batch, out).await?;
        Ok(())
    }

    /// Answers one queue item; `Some` when the connection is to close
    /// after what has been answered.
    async fn run_item(&mut self, work: &mut Work) -> std::io::Result<Option<Ended>> {
        let commands = match work {
            Work::Commands(c) => std::mem::take(c),
            Work::Close { reply, reset } => {
                self.run_batch().await?;
                self.out.extend_from_slice(reply);
                return Ok(Some(if *reset { Ended::Reset } else { Ended::Closed }));
            }
        };
        for args in commands {
            if let Some(ended) = self.run_command(args).await? {
                return Ok(Some(ended));
            }
        }
        Ok(None)
    }

    /// Plans one command and either adds it to the batch or, for a command
    /// that must see everything before it, runs the batch and then it.
    async fn run_command(&mut self, args: Vec<Bytes>) -> std::io::Result<Option<Ended>> {
        let slot = RespCounters::slot(&args[0]);
        self.ctx.resp_counters().add_command(slot);
        let planned = if self.multi.in_multi() {
            match self
                .multi
                .queue(&args, &mut self.client, &self.env, &self.multi_limits)
            {
                Queued::Run(planned) => planned,
                Queued::Reply(reply) => Planned::Ready(reply),
            }
        } else {
            plan(&args, &mut self.client, &self.env)
        };
        match planned {
            Planned::Ready(reply) => {
                if reply.first() == Some(&b'-') {
                    self.ctx.resp_counters().add_rejected(slot);
                }
                self.batch.pending.push(Pending::Ready(reply));
            }
            Planned::Engine { ops, finish } => self.add_engine(slot, ops, finish).await?,
            Planned::Server(command) => {
                self.run_batch().await?;
                let mut w = ReplyWriter::new(&mut self.out, self.client.version);
                self.conn.set_executing(true);
                answer_server_command(self.ctx, &command, &mut w).await;
                self.conn.set_executing(false);
            }
            Planned::Multi(command) => self.multi(slot, command).await?,
            Planned::MsetNx(_) => self.msetnx(slot, args).await?,
            Planned::Auth {
                user,
                password,
                hello,
            } => self.auth(slot, user, &password, hello).await?,
            Planned::Quit => {
                self.run_batch().await?;
                ReplyWriter::new(&mut self.out, self.client.version).ok();
                return Ok(Some(Ended::Closed));
            }
        }
        Ok(None)
    }

    /// Adds a command's engine ops to the batch (running the batch first if
    /// they would not fit one frame's worth of ops).
    async fn add_engine(
        &mut self,
        slot: usize,
        ops: Vec<Op>,
        finish: Finish,
    ) -> std::io::Result<()> {
        if !self.batch.ops.is_empty() && self.batch.ops.len() + ops.len() > self.env.ops_max {
            self.run_batch().await?;
        }
        self.batch.pending.push(Pending::Engine {
            slot,
            start: self.batch.ops.len(),
            count: ops.len(),
            finish,
            version: self.client.version,
        });
        self.batch.ops.extend(ops);
        Ok(())
    }

    async fn multi(&mut self, slot: usize, command: MultiCommand) -> std::io::Result<()> {
        // WATCH and EXEC see every command before them.
        if matches!(command, MultiCommand::Exec | MultiCommand::Watch(_)) {
            self.run_batch().await?;
        }
        let reply = multi_command(
            self.ctx,
            self.conn,
            &mut self.multi,
            &self.multi_limits,
            command,
            &mut self.client,
            &self.env,
        )
        .await;
        if reply.first() == Some(&b'-') {
            self.ctx.resp_counters().add_failed(slot);
        }
        self.batch.pending.push(Pending::Ready(reply));
        Ok(())
    }

    /// MSETNX: a transaction of this one command.
    async fn msetnx(&mut self, slot: usize, args: Vec<Bytes>) -> std::io::Result<()> {
        self.run_batch().await?;
        self.conn.set_executing(true);
        let outcome = multi::run(
            &self.ctx.handle,
            self.ctx.shared.txn.settings,
            std::slice::from_ref(&args),
            &[],
            &mut self.client,
            &self.env,
        )
        .await;
        self.conn.set_executing(false);
        match outcome {
            multi::ExecOutcome::Replies(replies) => {
                for r in replies {
                    self.out.extend_from_slice(&r);
                }
            }
            multi::ExecOutcome::WatchChanged => unreachable!("MSETNX watches nothing"),
            multi::ExecOutcome::Failed(text) => {
                self.ctx.resp_counters().add_failed(slot);
                ReplyWriter::new(&mut self.out, self.client.version).error(&text);
            }
        }
        Ok(())
    }

    async fn auth(
        &mut self,
        slot: usize,
        user: Option<Bytes>,
        password: &[u8],
        hello: Option<Vec<Bytes>>,
    ) -> std::io::Result<()> {
        self.run_batch().await?;
        let reply = authenticate(self.ctx, &mut self.client, user, password, hello).await;
        self.authenticated.set(self.client.authenticated);
        if self.client.authenticated {
            self.conn.handshake_done();
        }
        if reply.first() == Some(&b'-') {
            self.ctx.resp_counters().add_failed(slot);
        }
        self.out.extend_from_slice(&reply);
        Ok(())
    }

    /// Runs what is gathered and writes every reply out.
    async fn flush(&mut self) -> std::io::Result<()> {
        self.run_batch().await?;
        let out = std::mem::take(&mut self.out);
        self.out = write_out(self.ctx, self.conn, self.stream, out).await?;
        Ok(())
    }
}

async fn execute_loop(
    ctx: &Rc<ShardContext>,
    conn: &ConnState,
    stream: &Wire,
    pipe: &Pipe<Work>,
    authenticated: &Cell<bool>,
) -> std::io::Result<Ended> {
    let mut exec = Executor::new(ctx, conn, stream, authenticated);
    while let Some((first, first_bytes)) = pipe.pop().await {
        // Take what else is queued, so one engine batch covers it all.
        let mut items = vec![(first, first_bytes)];
        while items.len() < 64 {
            match pipe.try_pop() {
                Some(item) => items.push(item),
                None => break,
            }
        }
        let mut ended = None;
        let mut completed = 0;
        for (work, _) in items.iter_mut() {
            completed += 1;
            ended = exec.run_item(work).await?;
            if ended.is_some() {
                break;
            }
        }
        exec.flush().await?;
        for (_, bytes) in items.iter().take(completed) {
            pipe.complete(*bytes);
        }
        if let Some(ended) = ended {
            if matches!(ended, Ended::Reset) {
                reset_on_close(stream.stream());
            } else {
                shutdown_write(stream).await;
            }
            return Ok(ended);
        }
    }
    shutdown_write(stream).await;
    Ok(Ended::ReaderDone)
}

/// MULTI, EXEC, DISCARD, WATCH, UNWATCH (`multi`): the reply. Every
/// command before it has run (the caller ran the batch for EXEC and
/// WATCH).
async fn multi_command(
    ctx: &ShardContext,
    conn: &ConnState,
    multi: &mut MultiState,
    limits: &MultiLimits,
    command: MultiCommand,
    client: &mut Client,
    env: &Env,
) -> Bytes {
    let v = client.version;
    let mut out = BytesMut::new();
    match command {
        MultiCommand::Multi => match multi.begin() {
            Ok(()) => ReplyWriter::new(&mut out, v).ok(),
            Err(text) => ReplyWriter::new(&mut out, v).error(text),
        },
        MultiCommand::Discard => match multi.discard() {
            Ok(()) => ReplyWriter::new(&mut out, v).ok(),
            Err(text) => ReplyWriter::new(&mut out, v).error(text),
        },
        MultiCommand::Unwatch => {
            multi.unwatch();
            ReplyWriter::new(&mut out, v).ok();
        }
        MultiCommand::Watch(_) if multi.in_multi() => {
            ReplyWriter::new(&mut out, v).error(WATCH_INSIDE_MULTI)
        }
        MultiCommand::Watch(keys) => {
            if keys.len() > multi.watch_room(limits) {
                return error_reply(
                    v,
                    &format!(
                        "ERR ringkv: a connection watches at most {} keys (server.txn_locks_max)",
                        limits.commands_max
                    ),
                );
            }
            let checked = keys
                .iter()
                .find_map(|key| ctx.handle.check_limits(&Op::Get { key: key.clone() }).err());
            if let Some(e) = checked {
                return error_reply(v, &super::command::op_error_text(&e));
            }
            match ctx.handle.key_marks(&keys).await {
                Ok(marks) => {
                    multi.watch(keys.into_iter().zip(marks).collect());
                    ReplyWriter::new(&mut out, v).ok();
                }
                Err(e) => ReplyWriter::new(&mut out, v).error(&super::command::op_error_text(&e)),
            }
        }
        MultiCommand::Exec => match multi.take_exec() {
            Err(text) => ReplyWriter::new(&mut out, v).error(text),
            Ok((commands, watched)) => {
                conn.set_executing(true);
                let outcome = multi::run(
                    &ctx.handle,
                    ctx.shared.txn.settings,
                    &commands,
                    &watched,
                    client,
                    env,
                )
                .await;
                conn.set_executing(false);
                outcome.write_exec(&mut out, v);
            }
        },
    }
    out.freeze()
}

/// AUTH / HELLO AUTH: checks the password with the server's shared
/// [`crate::auth::Authenticator`] (a wrong one is refused after
/// `server.auth_failure_delay`, as on the native port) and answers with
/// Redis's replies; on success the client is authenticated and a HELLO
/// runs.
async fn authenticate(
    ctx: &ShardContext,
    client: &mut Client,
    user: Option<Bytes>,
    password: &[u8],
    hello: Option<Vec<Bytes>>,
) -> Bytes {
    use crate::auth::Verdict;
    let auth = &ctx.shared.access.auth;
    let (verdict, identity) = auth.check_user(user.as_deref(), Some(password));
    let mut out = BytesMut::new();
    let accepted = match verdict {
        Verdict::Accepted => true,
        // Without a password the default user takes any (Redis's
        // `nopass`); only the one-argument form is an error.
        Verdict::NoPasswordConfigured if user.is_some() => true,
        Verdict::NoPasswordConfigured => {
            ReplyWriter::new(&mut out, client.version).error(AUTH_NO_PASSWORD);
            false
        }
        Verdict::WrongPassword | Verdict::Required => {
            compio::time::sleep(auth.failure_delay()).await;
            ReplyWriter::new(&mut out, client.version).error(AUTH_WRONG_PASS);
            false
        }
    };
    let Some(identity) = identity.filter(|_| accepted) else {
        return out.freeze();
    };
    client.authenticated = true;
    client.identity = identity;
    match hello {
        None => {
            ReplyWriter::new(&mut out, client.version).ok();
            out.freeze()
        }
        Some(args) => match plan_hello(&args, client) {
            Planned::Ready(reply) => reply,
            other => {
                // plan_hello without an AUTH option always answers at once.
                tracing::error!(?other, "HELLO after AUTH did not answer at once");
                ReplyWriter::new(&mut out, client.version).error("ERR internal error in HELLO");
                out.freeze()
            }
        },
    }
}

/// Runs the batch, then writes the replies out if they passed
/// [`OUT_FLUSH_BYTES`], so a connection never holds the replies of more
/// than one engine batch.
async fn run_and_write(
    ctx: &ShardContext,
    conn: &ConnState,
    stream: &Wire,
    batch: &mut Batch,
    mut out: BytesMut,
) -> std::io::Result<BytesMut> {
    run_batch(ctx, conn, batch, &mut out).await;
    if out.len() >= OUT_FLUSH_BYTES {
        out = write_out(ctx, conn, stream, out).await?;
    }
    Ok(out)
}

/// Runs the batch's engine ops (if any) as one engine batch and appends
/// every pending reply, in order, to `out`.
async fn run_batch(ctx: &ShardContext, conn: &ConnState, batch: &mut Batch, out: &mut BytesMut) {
    if batch.is_empty() {
        return;
    }
    // Engine batches of at most `ops_per_frame_max` ops, one after another
    // (one command with more keys than that spans several).
    let ops_max = (ctx.shared.limits.ops_per_frame_max as usize).max(1);
    let mut ops = std::mem::take(&mut batch.ops);
    let mut results: Vec<OpResult> = Vec::with_capacity(ops.len());
    conn.set_executing(true);
    while !ops.is_empty() {
        let rest = ops.split_off(ops.len().min(ops_max));
        let chunk = std::mem::replace(&mut ops, rest);
        let n = chunk.len();
        match ctx.handle.batch(chunk).await {
            Ok(r) => results.extend(r),
            Err(e) => results.extend(std::iter::repeat_n(OpResult::Err(e), n)),
        }
    }
    conn.set_executing(false);
    for pending in batch.pending.drain(..) {
        match pending {
            Pending::Ready(reply) => out.extend_from_slice(&reply),
            Pending::Engine {
                slot,
                start,
                count,
                finish: f,
                version,
            } => {
                let mut w = ReplyWriter::new(out, version);
                let mine: &[OpResult] = &results[start..start + count];
                if mine.iter().any(|r| matches!(r, OpResult::Err(_)))
                    || matches!(
                        mine.first(),
                        Some(OpResult::Updated(engine::UpdateAnswer::Refused(_)))
                    )
                {
                    ctx.resp_counters().add_failed(slot);
                }
                finish(f, mine, &mut w);
            }
        }
    }
}

async fn shutdown_write(stream: &Wire) {
    stream.shutdown_write().await;
}

/// Makes the socket's close send a reset (SO_LINGER on with a zero time)
/// instead of a FIN after what is queued.
fn reset_on_close(stream: &TcpStream) {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: the descriptor is the open socket `stream` owns, and the
    // option value is a valid `linger` of the size given.
    let rc = unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&raw const linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        tracing::trace!(error = %std::io::Error::last_os_error(), "SO_LINGER failed");
    }
}
