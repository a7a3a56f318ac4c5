//! One shard's front door, run on the shard's own runtime thread: accept
//! connections on this shard's SO_REUSEPORT socket, enforce
//! `server.max_connections`, close idle connections, and on stop drain this
//! shard's connections before reporting back.
//!
//! What must hold: after [`run_shard`] returns, this shard accepts nothing
//! and every connection it served is closed (answered, or cut off after the
//! drain deadline).

use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use compio::buf::BufResult;
use compio::io::AsyncWriteExt;
use compio::net::{TcpListener, TcpStream};
use futures::future::{select, Either};
use ringkv_protocol::{encode_hello_ack, HelloAck, Status, PROTOCOL_VERSION};

use crate::native::connection::{linger, serve};
use crate::native::session::CloseReason;
use crate::shard::ShardContext;

/// How long a stopping shard lets its connections finish what they read.
pub const DRAIN_TIME: Duration = Duration::from_secs(3);
/// After that, how long it waits for cut-off connections to unwind.
const DRAIN_FORCE_TIME: Duration = Duration::from_secs(1);
/// How long a refused connection is kept open to deliver its refusal.
const REFUSAL_LINGER: Duration = Duration::from_millis(500);
/// Pause after an accept error that is about resources (EMFILE, ENOBUFS),
/// so the loop does not spin while the condition lasts.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Accepts on `listener` (and on `resp_listener`, the Redis-protocol
/// socket, when enabled) until `stop` fires (or its sender is dropped), then
/// drains this shard's connections of both kinds.
pub async fn run_shard(
    ctx: Rc<ShardContext>,
    listener: std::net::TcpListener,
    resp_listener: Option<std::net::TcpListener>,
    stop: futures::channel::oneshot::Receiver<()>,
) {
    let listener = match TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(shard = ctx.shard, error = %e, "cannot use the listening socket on this shard's runtime; the shard accepts no connections");
            let _ = stop.await;
            return;
        }
    };
    let housekeeping = compio::runtime::spawn(close_idle_loop(Rc::clone(&ctx)));
    // Dropped (so no longer accepting) before the drain below.
    let resp_accept =
        resp_listener.map(|l| compio::runtime::spawn(crate::resp::accept_loop(Rc::clone(&ctx), l)));
    let mut stop = stop;
    loop {
        let accepted = {
            let accept = std::pin::pin!(listener.accept());
            match select(accept, &mut stop).await {
                Either::Left((result, _)) => result,
                Either::Right(_) => break,
            }
        };
        match accepted {
            Ok((stream, peer)) => admit(&ctx, stream, peer),
            Err(e) => {
                let resource = matches!(
                    e.raw_os_error(),
                    Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
                );
                if ctx.allow_warning() {
                    tracing::warn!(shard = ctx.shard, error = %e, "accept failed");
                }
                if resource {
                    compio::time::sleep(ACCEPT_BACKOFF).await;
                }
            }
        }
    }
    drop(listener);
    drop(resp_accept);
    drain(&ctx).await;
    drop(housekeeping);
}

fn admit(ctx: &Rc<ShardContext>, stream: TcpStream, peer: SocketAddr) {
    ctx.counters().add_accepted();
    match ctx.shared.try_acquire_connection() {
        Some(slot) => {
            let ctx = Rc::clone(ctx);
            compio::runtime::spawn(async move {
                serve(ctx, stream, peer).await;
                drop(slot);
            })
            .detach();
        }
        None => {
            ctx.counters().add_closed(CloseReason::TooManyConnections);
            if ctx.allow_warning() {
                tracing::warn!(%peer, max_connections = ctx.shared.max_connections, "refused a connection: too many connections");
            }
            let max = ctx.shared.max_connections;
            if ctx.shared.access.tls.is_some() {
                // A TLS client cannot read a plaintext refusal: just close.
                drop(stream);
            } else {
                compio::runtime::spawn(refuse(stream, max)).detach();
            }
        }
    }
}

/// Answers a connection over the limit with a refused hello-ack (status
/// OVERLOADED) and closes it.
async fn refuse(stream: TcpStream, max_connections: usize) {
    let mut out = BytesMut::new();
    encode_hello_ack(
        &HelloAck::Refused {
            version: PROTOCOL_VERSION,
            status: Status::Overloaded,
            message: format!(
                "too many connections: the server accepts {max_connections} at once; retry later"
            ),
        },
        &mut out,
    );
    let mut s = &stream;
    let BufResult(result, _) = s.write_all(out).await;
    if result.is_ok() {
        let _ = compio::io::AsyncWrite::shutdown(&mut s).await;
        linger(&stream, REFUSAL_LINGER).await;
    }
}

/// Closes idle connections and those whose handshake is overdue, checking a
/// few times per timeout period.
async fn close_idle_loop(ctx: Rc<ShardContext>) {
    let shortest = ctx
        .shared
        .idle_timeout
        .min(ctx.shared.access.handshake_timeout);
    let period = (shortest / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
    loop {
        compio::time::sleep(period).await;
        let closed = ctx.close_idle(Instant::now());
        if closed > 0 {
            tracing::debug!(shard = ctx.shard, closed, "closed idle connections");
        }
    }
}

/// Lets every connection answer what it has read, then closes it; cuts off
/// the ones that do not finish in time (e.g. a client that stopped reading).
async fn drain(ctx: &ShardContext) {
    ctx.close_all(CloseReason::Shutdown, false);
    if !wait_until_no_connections(ctx, DRAIN_TIME).await {
        tracing::warn!(
            shard = ctx.shard,
            open = ctx.connection_count(),
            "connections did not finish within {DRAIN_TIME:?}; closing them"
        );
        ctx.close_all(CloseReason::Shutdown, true);
        if !wait_until_no_connections(ctx, DRAIN_FORCE_TIME).await {
            tracing::warn!(
                shard = ctx.shard,
                open = ctx.connection_count(),
                "connections still open after being cut off"
            );
        }
    }
}

async fn wait_until_no_connections(ctx: &ShardContext, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while ctx.connection_count() > 0 {
        if Instant::now() >= deadline {
            return false;
        }
        compio::time::sleep(Duration::from_millis(5)).await;
    }
    true
}
