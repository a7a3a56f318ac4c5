//! The transaction path of a connection: a frame that holds a transaction
//! op (BEGIN, GET_FOR_UPDATE, COMMIT, ROLLBACK), or that arrives while the
//! connection has a transaction open, runs here one op at a time, in order.
//! Other frames keep the batched path (`exec`).
//!
//! What must hold: one open transaction per connection; every op gets one
//! answer; after DIE or LOCK_TIMEOUT the transaction holds no lock and its
//! later ops answer ABORTED until COMMIT (answered ABORTED) or ROLLBACK
//! (answered OK) ends it, and the connection's next BEGIN starts the retry
//! with the aborted transaction's age (see [`ConnTxn`]); a connection that closes rolls its transaction
//! back (the engine's `Txn` releases its locks when dropped); PUT_EXPIRING,
//! EXPIRE, TTL and SCAN are refused (UNSUPPORTED) while a transaction is
//! open, and run as plain operations in a frame before its BEGIN.

use bytes::Bytes;
use engine::{AbortReason, Op, OpResult, Txn, TxnSettings};
use ringkv_protocol::{fit_response, OpReply, Request, RequestOp, Response, Status};
use std::time::Duration;

use crate::native::exec::{engine_op, engine_reply, scan_room_bytes};
use crate::native::scan::{scan, ScanArgs};
use crate::ops::counters::{OpKind, OpTally};
use crate::ops::status::{op_error_status, txn_error_reply};

/// Transaction settings from `[server]`.
#[derive(Debug, Clone, Copy)]
pub struct TxnConfig {
    pub settings: TxnSettings,
    /// An open transaction idle this long is aborted.
    pub idle_timeout: Duration,
}

impl TxnConfig {
    pub fn from_config(server: &tunables::ServerConfig) -> TxnConfig {
        TxnConfig {
            settings: TxnSettings {
                lock_wait_max: server.txn_lock_wait_timeout.get(),
                locks_max: server.txn_locks_max as usize,
            },
            idle_timeout: server.txn_idle_timeout.get(),
        }
    }
}

impl Default for TxnConfig {
    fn default() -> Self {
        TxnConfig::from_config(&tunables::ServerConfig::default())
    }
}

/// A connection's transaction state: the open transaction, and the age of
/// the last one a lock conflict (DIE or LOCK_TIMEOUT) aborted, which the
/// next BEGIN takes over. A client retries a transaction that died by
/// sending BEGIN again; with its first attempt's age the retry waits
/// behind younger holders instead of dying for them, as the RESP port's
/// EXEC does, so retries do not pile up under contention. Any other end
/// (a commit, a rollback of a live transaction) drops the age.
#[derive(Default)]
pub struct ConnTxn {
    open: Option<Txn>,
    retry: Option<engine::RetryTicket>,
}

impl ConnTxn {
    /// A transaction is open (possibly aborted, waiting for its end).
    pub fn is_open(&self) -> bool {
        self.open.is_some()
    }

    /// A transaction is open and not aborted (the idle timeout applies).
    pub fn is_active(&self) -> bool {
        self.open.as_ref().is_some_and(|t| t.aborted().is_none())
    }

    fn begin(&mut self, handle: &engine::Handle, settings: TxnSettings) {
        self.open = Some(match self.retry.take() {
            Some(ticket) => handle.begin_again(settings, ticket),
            None => handle.begin(settings),
        });
    }

    /// Takes the open transaction to end it; a transaction a lock conflict
    /// aborted is ended here, its age kept for the next BEGIN, and its
    /// answer (`reason`) returned instead.
    fn take_to_end(&mut self) -> Option<Result<Txn, AbortReason>> {
        let t = self.open.take()?;
        self.retry = None;
        let reason = t.aborted();
        Some(match t.into_retry() {
            Ok(ticket) => {
                self.retry = Some(ticket);
                Err(reason.expect("only an aborted transaction has a retry ticket"))
            }
            Err(t) => Ok(t),
        })
    }
}

/// Whether `request` must take the transaction path.
pub fn needs_txn_path(request: &Request, txn_open: bool) -> bool {
    txn_open
        || request.ops.iter().any(|op| {
            matches!(
                op,
                RequestOp::Begin
                    | RequestOp::GetForUpdate { .. }
                    | RequestOp::Commit
                    | RequestOp::Rollback
                    // Answered one by one, as this path does (it is long).
                    | RequestOp::Backup { .. }
            )
        })
}

fn no_txn(what: &str) -> OpReply {
    OpReply::Error {
        status: Status::NoTransaction,
        message: format!("{what} needs an open transaction (send BEGIN first)"),
    }
}

/// The answer to an operation that has no meaning inside a transaction.
fn not_in_txn(kind: OpKind) -> OpReply {
    OpReply::Error {
        status: Status::Unsupported,
        message: format!(
            "{} does not run inside a transaction (COMMIT or ROLLBACK first)",
            kind.name().to_ascii_uppercase()
        ),
    }
}

/// A plain (non-transactional) single op of `kind` through the engine.
async fn plain(handle: &engine::Handle, kind: OpKind, op: Op) -> OpReply {
    match handle.batch(vec![op]).await {
        Ok(mut results) => engine_reply(
            kind,
            results
                .pop()
                .unwrap_or(OpResult::Err(engine::OpError::ShuttingDown)),
        ),
        Err(e) => OpReply::Error {
            status: op_error_status(&e),
            message: e.to_string(),
        },
    }
}

fn read_reply(value: Option<Bytes>) -> OpReply {
    match value {
        Some(v) => OpReply::Value(v),
        None => OpReply::NotFound,
    }
}

/// Runs one request on the transaction path. `txn` is the connection's
/// open transaction (if any); it is updated as the ops begin and end it.
pub async fn run_request(
    handle: &engine::Handle,
    config: &TxnConfig,
    txn: &mut ConnTxn,
    request: Request,
    frame_bytes_max: u32,
    stats: &mut dyn FnMut() -> Vec<(String, String)>,
    tally: &mut OpTally,
) -> Response {
    let mut results = Vec::with_capacity(request.ops.len());
    let mut kinds = Vec::with_capacity(request.ops.len());
    let scan_count = request
        .ops
        .iter()
        .filter(|op| matches!(op, RequestOp::Scan { .. }))
        .count();
    let scan_room = scan_room_bytes(frame_bytes_max, request.ops.len(), scan_count);
    for op in request.ops {
        let (kind, reply) = match op {
            RequestOp::PutExpiring { .. } | RequestOp::Expire { .. } | RequestOp::Ttl { .. } => {
                let Ok((kind, op)) = engine_op(op) else {
                    unreachable!("expiry operations are engine operations")
                };
                (
                    kind,
                    if txn.is_open() {
                        not_in_txn(kind)
                    } else {
                        plain(handle, kind, op).await
                    },
                )
            }
            RequestOp::Scan {
                cursor,
                count,
                pattern,
            } => (
                OpKind::Scan,
                if txn.is_open() {
                    not_in_txn(OpKind::Scan)
                } else {
                    let args = ScanArgs {
                        cursor,
                        count,
                        pattern,
                    };
                    scan(handle, &args, scan_room).await
                },
            ),
            RequestOp::Ping => (OpKind::Ping, OpReply::Ok),
            RequestOp::Stats => (OpKind::Stats, OpReply::Stats(stats())),
            // Counted with STATS: the server's own operations.
            RequestOp::Backup {
                dest,
                rate_bytes_per_sec,
            } => (
                OpKind::Stats,
                if txn.is_open() {
                    OpReply::Error {
                        status: Status::Unsupported,
                        message:
                            "BACKUP does not run inside a transaction (COMMIT or ROLLBACK first)"
                                .into(),
                    }
                } else {
                    crate::ops::backup::native_backup(handle, &dest, rate_bytes_per_sec).await
                },
            ),
            op => txn_or_key_op(handle, config, txn, op).await,
        };
        kinds.push(kind);
        results.push(reply);
    }
    let mut response = Response {
        id: request.id,
        results,
    };
    fit_response(&mut response, frame_bytes_max);
    for (kind, reply) in kinds.iter().zip(response.results.iter()) {
        tally.add(*kind, reply.status());
    }
    response
}

/// The operations a transaction changes: BEGIN, COMMIT, ROLLBACK and
/// GET_FOR_UPDATE, and GET, PUT and DELETE (inside a transaction when one
/// is open, plain otherwise).
async fn txn_or_key_op(
    handle: &engine::Handle,
    config: &TxnConfig,
    txn: &mut ConnTxn,
    op: RequestOp,
) -> (OpKind, OpReply) {
    match op {
        RequestOp::Begin => (
            OpKind::Txn,
            if txn.is_open() {
                OpReply::Error {
                    status: Status::NoTransaction,
                    message: "a transaction is already open on this connection (one at a time; COMMIT or ROLLBACK it first)".to_string(),
                }
            } else {
                txn.begin(handle, config.settings);
                OpReply::Ok
            },
        ),
        RequestOp::GetForUpdate { key } => (
            OpKind::Txn,
            match txn.open.as_mut() {
                None => no_txn("GET_FOR_UPDATE"),
                Some(t) => match t.get_for_update(key).await {
                    Ok(v) => read_reply(v),
                    Err(e) => txn_error_reply(&e),
                },
            },
        ),
        RequestOp::Get { key } => (
            OpKind::Get,
            match txn.open.as_mut() {
                None => plain(handle, OpKind::Get, Op::Get { key }).await,
                Some(t) => match t.get(key).await {
                    Ok(v) => read_reply(v),
                    Err(e) => txn_error_reply(&e),
                },
            },
        ),
        RequestOp::Put { key, value } => (
            OpKind::Put,
            match txn.open.as_mut() {
                None => plain(handle, OpKind::Put, Op::Put { key, value }).await,
                Some(t) => match t.put(key, value).await {
                    Ok(()) => OpReply::Ok,
                    Err(e) => txn_error_reply(&e),
                },
            },
        ),
        RequestOp::Delete { key } => (
            OpKind::Delete,
            match txn.open.as_mut() {
                None => plain(handle, OpKind::Delete, Op::Delete { key }).await,
                Some(t) => match t.delete(key).await {
                    Ok(true) => OpReply::Ok,
                    Ok(false) => OpReply::NotFound,
                    Err(e) => txn_error_reply(&e),
                },
            },
        ),
        RequestOp::Commit => (
            OpKind::Txn,
            match txn.take_to_end() {
                None => no_txn("COMMIT"),
                Some(Err(reason)) => txn_error_reply(&engine::TxnError::Aborted { reason }),
                Some(Ok(t)) => match t.commit().await {
                    Ok(()) => OpReply::Ok,
                    Err(e) => txn_error_reply(&e),
                },
            },
        ),
        RequestOp::Rollback => (
            OpKind::Txn,
            match txn.take_to_end() {
                None => no_txn("ROLLBACK"),
                Some(Err(_)) => OpReply::Ok,
                Some(Ok(t)) => {
                    t.rollback().await;
                    OpReply::Ok
                }
            },
        ),
        RequestOp::PutExpiring { .. }
        | RequestOp::Expire { .. }
        | RequestOp::Ttl { .. }
        | RequestOp::Scan { .. }
        | RequestOp::Ping
        | RequestOp::Stats
        | RequestOp::Backup { .. } => unreachable!("run_request answers these itself"),
    }
}

/// The connection sent nothing for the idle timeout with a transaction
/// open: abort it (its locks are released; its next ops answer ABORTED).
pub async fn abort_idle(txn: &mut ConnTxn) {
    if let Some(t) = txn.open.as_mut() {
        if t.aborted().is_none() {
            tracing::debug!(txn = t.id(), "idle transaction aborted");
            t.abort(AbortReason::Idle).await;
        }
    }
}
