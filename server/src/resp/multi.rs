//! Redis's MULTI / EXEC / DISCARD / WATCH / UNWATCH, and MSETNX, on
//! ringkv's transactions (`docs/transactions.md`). Commands after MULTI
//! are checked and queued in the connection; EXEC runs them, in order, as
//! ONE engine transaction: each key is locked on first use (exclusive,
//! wait-die), writes are buffered (later commands read them), and the
//! commit logs one part per written shard and is answered once every part
//! is durable (under `sync`). WATCH remembers the write marks of its keys
//! ([`engine::KeyMark`]); EXEC first locks the watched keys, then answers
//! a null array if any mark changed. MSETNX outside MULTI is a transaction
//! of that one command.
//!
//! What must hold: nothing a queued command writes is seen by anyone
//! before the commit, and all of it is after; an attempt that wait-die or
//! a lock timeout aborted is run again from the start (at most
//! [`EXEC_ATTEMPTS_MAX`] times, keeping its transaction id so it ages and
//! finally waits instead of dying): safe, because nothing of it was
//! applied or answered; a watched key written, deleted or expired after WATCH
//! makes EXEC answer the null array (marks never miss a change); a
//! connection that goes away in MULTI or during EXEC leaves nothing (the
//! queue is the connection's memory; a dropped `Txn` rolls back).

use std::collections::HashSet;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use engine::{KeyMark, Op, OpError, OpResult, Txn, TxnError, TxnSettings, UpdateWrite};
use ringkv_protocol::resp::{ReplyWriter, Version};

use super::command::{
    check, finish, op_error_text, plan, Client, Env, Finish, MultiCommand, Planned,
};

/// Times EXEC runs its transaction when wait-die or a lock-wait timeout
/// aborts it, before it answers an error.
pub const EXEC_ATTEMPTS_MAX: u32 = 8;
/// Pause before the second attempt; doubled before each later one.
const EXEC_RETRY_PAUSE: Duration = Duration::from_millis(1);

pub const EXECABORT: &str = "EXECABORT Transaction discarded because of previous errors.";
pub const NESTED: &str = "ERR MULTI calls can not be nested";
pub const EXEC_WITHOUT_MULTI: &str = "ERR EXEC without MULTI";
pub const DISCARD_WITHOUT_MULTI: &str = "ERR DISCARD without MULTI";
pub const WATCH_INSIDE_MULTI: &str = "ERR WATCH inside MULTI is not allowed";

/// Commands that may be queued after MULTI: those whose engine work is
/// reads, puts, deletes and read-modify-writes without an expiry time,
/// and those answered without the engine. The others (KEYS, SCAN, INFO,
/// FLUSHALL, the expiry commands...) are refused when queued.
pub fn queueable(name: &str) -> bool {
    matches!(
        name,
        "get"
            | "set"
            | "setnx"
            | "getset"
            | "getdel"
            | "del"
            | "unlink"
            | "exists"
            | "mget"
            | "mset"
            | "msetnx"
            | "incr"
            | "decr"
            | "incrby"
            | "decrby"
            | "incrbyfloat"
            | "append"
            | "setrange"
            | "setbit"
            | "getbit"
            | "bitcount"
            | "lcs"
            | "strlen"
            | "getrange"
            | "substr"
            | "type"
            | "ping"
            | "echo"
            | "select"
            | "time"
            | "unwatch"
    )
}

fn not_queueable(name: &str) -> String {
    format!(
        "ERR Command not allowed inside a transaction (ringkv cannot run '{name}' in one of its transactions; see docs/resp.md)"
    )
}

const SET_EXPIRY_IN_MULTI: &str = "ERR ringkv cannot run SET with an expiry option (EX, PX, EXAT, PXAT, KEEPTTL) inside MULTI: transaction writes carry no expiry time";

const KEEPS_EXPIRY_IN_MULTI: &str = "ERR ringkv cannot run this command inside MULTI on a key with an expiry time (it keeps the expiry, and transaction writes carry none); the command did nothing";

/// Bounds of one connection's MULTI.
#[derive(Debug, Clone, Copy)]
pub struct MultiLimits {
    /// Most queued commands, and most watched keys (each locks at least
    /// one key at EXEC): `server.txn_locks_max`.
    pub commands_max: usize,
    /// Most bytes of queued arguments: `limits.frame_bytes_max`.
    pub bytes_max: usize,
}

#[derive(Debug, Default)]
struct Queue {
    commands: Vec<Vec<Bytes>>,
    bytes: usize,
    /// A command was refused while queueing: EXEC answers EXECABORT.
    dirty: bool,
}

/// What a command sent inside MULTI turned into.
#[derive(Debug)]
pub enum Queued {
    /// Answered now (`+QUEUED`, or an error that makes EXEC abort).
    Reply(Bytes),
    /// EXEC, DISCARD, MULTI, WATCH or QUIT, planned to run now; or the
    /// error reply of a command refused by the name, arity or
    /// authentication check (EXEC will abort).
    Run(Planned),
}

/// A connection's transaction state between commands.
#[derive(Debug, Default)]
pub struct MultiState {
    /// Inside MULTI: the queued commands.
    queue: Option<Queue>,
    /// Watched keys and their marks when WATCH ran.
    watched: Vec<(Bytes, KeyMark)>,
}

fn encoded(version: Version, f: impl FnOnce(&mut ReplyWriter)) -> Bytes {
    let mut out = BytesMut::new();
    f(&mut ReplyWriter::new(&mut out, version));
    out.freeze()
}

pub fn error_reply(version: Version, text: &str) -> Bytes {
    encoded(version, |w| w.error(text))
}

impl MultiState {
    pub fn in_multi(&self) -> bool {
        self.queue.is_some()
    }

    /// MULTI: `Err` if already inside one.
    pub fn begin(&mut self) -> Result<(), &'static str> {
        if self.queue.is_some() {
            return Err(NESTED);
        }
        self.queue = Some(Queue::default());
        Ok(())
    }

    /// A command inside MULTI: EXEC, DISCARD, MULTI, WATCH and QUIT run
    /// now; any other is checked (name, arity, whether a transaction can
    /// run it, the queue's bounds) and queued, or refused (and EXEC will
    /// answer EXECABORT).
    pub fn queue(
        &mut self,
        args: &[Bytes],
        client: &mut Client,
        env: &Env,
        limits: &MultiLimits,
    ) -> Queued {
        let v = client.version;
        let queue = self.queue.as_mut().expect("queue is called inside MULTI");
        let name = match check(args, client, env) {
            Ok(name) => name,
            Err(reply) => {
                queue.dirty = true;
                return Queued::Run(reply);
            }
        };
        if matches!(
            name.as_str(),
            "exec" | "discard" | "multi" | "watch" | "quit"
        ) {
            return Queued::Run(plan(args, client, env));
        }
        let refusal = if !queueable(&name) {
            Some(not_queueable(&name))
        } else if name == "set" && sets_expiry(args, client, env) {
            Some(SET_EXPIRY_IN_MULTI.to_string())
        } else {
            let bytes: usize = args.iter().map(|a| a.len()).sum();
            if queue.commands.len() >= limits.commands_max || queue.bytes + bytes > limits.bytes_max
            {
                Some(format!(
                    "ERR ringkv: a MULTI holds at most {} commands and {} bytes of arguments (server.txn_locks_max, limits.frame_bytes_max)",
                    limits.commands_max, limits.bytes_max
                ))
            } else {
                queue.bytes += bytes;
                queue.commands.push(args.to_vec());
                None
            }
        };
        match refusal {
            Some(text) => {
                queue.dirty = true;
                Queued::Reply(error_reply(v, &text))
            }
            None => Queued::Reply(encoded(v, |w| w.simple("QUEUED"))),
        }
    }

    /// EXEC: the queued commands (`Err` with the error text when there
    /// was no MULTI, or when a command was refused while queueing) and the
    /// watched keys. Either way the connection leaves MULTI and forgets its
    /// watched keys, as in Redis.
    #[allow(clippy::type_complexity)]
    pub fn take_exec(&mut self) -> Result<(Vec<Vec<Bytes>>, Vec<(Bytes, KeyMark)>), &'static str> {
        let Some(queue) = self.queue.take() else {
            return Err(EXEC_WITHOUT_MULTI);
        };
        let watched = std::mem::take(&mut self.watched);
        if queue.dirty {
            return Err(EXECABORT);
        }
        Ok((queue.commands, watched))
    }

    /// DISCARD: drops the queue and the watched keys.
    pub fn discard(&mut self) -> Result<(), &'static str> {
        if self.queue.take().is_none() {
            return Err(DISCARD_WITHOUT_MULTI);
        }
        self.watched.clear();
        Ok(())
    }

    /// Keys WATCH may still add within `limits`.
    pub fn watch_room(&self, limits: &MultiLimits) -> usize {
        limits.commands_max.saturating_sub(self.watched.len())
    }

    /// WATCH: remembers these marks (a key watched twice keeps its first).
    pub fn watch(&mut self, marks: Vec<(Bytes, KeyMark)>) {
        let mut known: HashSet<Bytes> = self.watched.iter().map(|(k, _)| k.clone()).collect();
        for (key, mark) in marks {
            if known.insert(key.clone()) {
                self.watched.push((key, mark));
            }
        }
    }

    pub fn unwatch(&mut self) {
        self.watched.clear();
    }
}

/// Whether a SET's options set or keep an expiry time.
fn sets_expiry(args: &[Bytes], client: &mut Client, env: &Env) -> bool {
    match plan(args, client, env) {
        Planned::Engine { ops, .. } => ops.iter().any(|op| matches!(op, Op::UpdateTtl { .. })),
        _ => false,
    }
}

/// How an EXEC (or an MSETNX) ended.
#[derive(Debug, PartialEq, Eq)]
pub enum ExecOutcome {
    /// Committed: each command's reply, in order.
    Replies(Vec<Bytes>),
    /// A watched key changed: nothing ran.
    WatchChanged,
    /// Not committed (error text); nothing of it was applied.
    Failed(String),
}

impl ExecOutcome {
    /// EXEC's reply: the array of replies, a null array, or the error.
    pub fn write_exec(&self, out: &mut BytesMut, version: Version) {
        match self {
            ExecOutcome::Replies(replies) => {
                ReplyWriter::new(out, version).array(replies.len());
                for r in replies {
                    out.extend_from_slice(r);
                }
            }
            ExecOutcome::WatchChanged => ReplyWriter::new(out, version).null_array(),
            ExecOutcome::Failed(text) => ReplyWriter::new(out, version).error(text),
        }
    }
}

/// Whether a failed attempt may simply run again.
fn retryable(e: &TxnError) -> bool {
    matches!(
        e,
        TxnError::Die
            | TxnError::LockTimeout
            | TxnError::Aborted {
                reason: engine::AbortReason::Die | engine::AbortReason::LockTimeout
            }
    )
}

fn failure_text(e: &TxnError, attempts: u32) -> String {
    match e {
        e if retryable(e) => format!(
            "ERR ringkv: the transaction was aborted {attempts} times by lock conflicts (last: {e}); nothing was applied"
        ),
        TxnError::TooManyLocks { .. } | TxnError::TooLarge { .. } => {
            format!("ERR ringkv: the transaction is too large ({e}); nothing was applied")
        }
        TxnError::Op(op) => op_error_text(op),
        TxnError::Poisoned { .. } => format!("MISCONF {e}"),
        other => format!("ERR ringkv: the transaction failed ({other})"),
    }
}

/// Runs `commands` as one transaction (after checking `watched`),
/// restarting it (same id, so it ages) when a lock conflict aborts it.
pub async fn run(
    handle: &engine::Handle,
    settings: TxnSettings,
    commands: &[Vec<Bytes>],
    watched: &[(Bytes, KeyMark)],
    client: &mut Client,
    env: &Env,
) -> ExecOutcome {
    let mut pause = EXEC_RETRY_PAUSE;
    let mut attempt = 1;
    let mut txn = handle.begin(settings);
    loop {
        match run_once(handle, &mut txn, commands, watched, client, env).await {
            Ok(Some(replies)) => {
                return match txn.commit().await {
                    Ok(()) => ExecOutcome::Replies(replies),
                    Err(e) => ExecOutcome::Failed(failure_text(&e, attempt)),
                };
            }
            Ok(None) => {
                txn.rollback().await;
                return ExecOutcome::WatchChanged;
            }
            Err(e) if retryable(&e) && attempt < EXEC_ATTEMPTS_MAX && txn.aborted().is_some() => {
                tracing::debug!(attempt, error = %e, "EXEC's transaction aborted; running it again");
                compio::time::sleep(pause).await;
                pause *= 2;
                attempt += 1;
                txn = txn.restart().await;
            }
            Err(e) => {
                txn.rollback().await;
                return ExecOutcome::Failed(failure_text(&e, attempt));
            }
        }
    }
}

/// One attempt: `None` when a watched key changed; the replies otherwise
/// (the caller commits).
async fn run_once(
    handle: &engine::Handle,
    txn: &mut Txn,
    commands: &[Vec<Bytes>],
    watched: &[(Bytes, KeyMark)],
    client: &mut Client,
    env: &Env,
) -> Result<Option<Vec<Bytes>>, TxnError> {
    if !watched.is_empty() {
        // Once the watched keys are locked, no plain write and no other
        // transaction can change them: their marks now are final.
        for (key, _) in watched {
            txn.get_for_update(key.clone()).await?;
        }
        let keys: Vec<Bytes> = watched.iter().map(|(k, _)| k.clone()).collect();
        let now = handle.key_marks(&keys).await?;
        let now_ms = engine::clock::now_ms();
        if watched
            .iter()
            .zip(&now)
            .any(|((_, then), now)| then.changed_by(now, now_ms))
        {
            return Ok(None);
        }
    }
    let mut run = TxnRun {
        handle,
        txn,
        env,
        written: HashSet::new(),
    };
    let mut replies = Vec::with_capacity(commands.len());
    for args in commands {
        let v = client.version;
        let mut out = BytesMut::new();
        match plan(args, client, env) {
            Planned::Ready(reply) => out.extend_from_slice(&reply),
            Planned::Engine { ops, finish } => run.engine(ops, finish, v, &mut out).await?,
            Planned::MsetNx(pairs) => run.msetnx(pairs, v, &mut out).await?,
            Planned::Multi(MultiCommand::Unwatch) => ReplyWriter::new(&mut out, v).ok(),
            other => {
                // Refused while queueing; never reached.
                tracing::error!(?other, "a command that cannot be queued reached EXEC");
                ReplyWriter::new(&mut out, v).error("ERR ringkv: not allowed inside MULTI");
            }
        }
        replies.push(out.freeze());
    }
    Ok(Some(replies))
}

/// The commands of one attempt, run through its transaction.
struct TxnRun<'a> {
    handle: &'a engine::Handle,
    txn: &'a mut Txn,
    env: &'a Env,
    /// Keys this transaction wrote: their expiry time is gone (a
    /// transaction write carries none).
    written: HashSet<Bytes>,
}

impl TxnRun<'_> {
    /// The limits' error of the first of `ops` that breaks one.
    fn limits_error(&self, ops: &[Op]) -> Option<OpError> {
        ops.iter().find_map(|op| self.handle.check_limits(op).err())
    }

    async fn put(&mut self, key: Bytes, value: Bytes) -> Result<(), TxnError> {
        self.txn.put(key.clone(), value).await?;
        self.written.insert(key);
        Ok(())
    }

    async fn delete(&mut self, key: Bytes) -> Result<bool, TxnError> {
        let existed = self.txn.delete(key.clone()).await?;
        self.written.insert(key);
        Ok(existed)
    }

    /// Whether `key` (locked by this transaction) holds an expiry time
    /// this transaction has not removed.
    async fn has_expiry(&self, key: &Bytes) -> Result<bool, TxnError> {
        if self.written.contains(key) {
            return Ok(false);
        }
        let marks = self.handle.key_marks(std::slice::from_ref(key)).await?;
        Ok(marks.first().is_some_and(|m| m.expires_at_ms.is_some()))
    }

    /// A planned command's engine operations, each through the
    /// transaction; the reply as the same command's outside MULTI.
    async fn engine(
        &mut self,
        ops: Vec<Op>,
        f: Finish,
        v: Version,
        out: &mut BytesMut,
    ) -> Result<(), TxnError> {
        // A key or value over a limit fails the whole command before any
        // of its operations runs (no half of an MSET).
        if let Some(e) = self.limits_error(&ops) {
            ReplyWriter::new(out, v).error(&op_error_text(&e));
            return Ok(());
        }
        let mut results = Vec::with_capacity(ops.len());
        for op in ops {
            let result = match op {
                Op::Get { key } => match self.txn.get_for_update(key).await? {
                    Some(value) => OpResult::Value(value),
                    None => OpResult::NotFound,
                },
                Op::Put { key, value } => {
                    self.put(key, value).await?;
                    OpResult::Ok
                }
                Op::Delete { key } => {
                    if self.delete(key).await? {
                        OpResult::Ok
                    } else {
                        OpResult::NotFound
                    }
                }
                Op::Update { key, update } => {
                    let current = self.txn.get_for_update(key.clone()).await?;
                    let present = current.is_some();
                    let outcome = (update.apply)(current, &update.arg, update.number);
                    let (value, keeps_expiry) = match outcome.write {
                        UpdateWrite::Keep => (None, false),
                        UpdateWrite::Put(value) => (Some(value), true),
                        UpdateWrite::PutExpiring(value, None) => (Some(value), false),
                        UpdateWrite::Delete => {
                            self.delete(key).await?;
                            results.push(OpResult::Updated(outcome.answer));
                            continue;
                        }
                        UpdateWrite::PutExpiring(_, Some(_)) | UpdateWrite::SetExpiry(_) => {
                            ReplyWriter::new(out, v).error(SET_EXPIRY_IN_MULTI);
                            return Ok(());
                        }
                    };
                    match value {
                        None => OpResult::Updated(outcome.answer),
                        Some(value) if value.len() > self.env.value_bytes_max => {
                            OpResult::Err(OpError::ValueTooLarge {
                                len: value.len(),
                                max: self.env.value_bytes_max,
                            })
                        }
                        Some(value) => {
                            if keeps_expiry && present && self.has_expiry(&key).await? {
                                ReplyWriter::new(out, v).error(KEEPS_EXPIRY_IN_MULTI);
                                return Ok(());
                            }
                            self.put(key, value).await?;
                            OpResult::Updated(outcome.answer)
                        }
                    }
                }
                Op::UpdateTtl { .. } => {
                    ReplyWriter::new(out, v).error(SET_EXPIRY_IN_MULTI);
                    return Ok(());
                }
            };
            results.push(result);
        }
        finish(f, &results, &mut ReplyWriter::new(out, v));
        Ok(())
    }

    /// MSETNX: every key locked; if none exists, all are set (1), else
    /// none (0).
    async fn msetnx(
        &mut self,
        pairs: Vec<(Bytes, Bytes)>,
        v: Version,
        out: &mut BytesMut,
    ) -> Result<(), TxnError> {
        let puts: Vec<Op> = pairs
            .iter()
            .map(|(key, value)| Op::Put {
                key: key.clone(),
                value: value.clone(),
            })
            .collect();
        if let Some(e) = self.limits_error(&puts) {
            ReplyWriter::new(out, v).error(&op_error_text(&e));
            return Ok(());
        }
        for (key, _) in &pairs {
            if self.txn.get_for_update(key.clone()).await?.is_some() {
                ReplyWriter::new(out, v).int(0);
                return Ok(());
            }
        }
        for (key, value) in pairs {
            self.put(key, value).await?;
        }
        ReplyWriter::new(out, v).int(1);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Vec<Bytes> {
        line.split(' ')
            .map(|a| Bytes::copy_from_slice(a.as_bytes()))
            .collect()
    }

    fn env() -> Env {
        Env {
            value_bytes_max: 1024,
            ops_max: 64,
            flush_enabled: true,
        }
    }

    const LIMITS: MultiLimits = MultiLimits {
        commands_max: 3,
        bytes_max: 1000,
    };

    fn reply(q: Queued) -> Bytes {
        match q {
            Queued::Reply(b) | Queued::Run(Planned::Ready(b)) => b,
            other => panic!("expected a reply, got {other:?}"),
        }
    }

    #[test]
    fn queueing_answers_queued_and_errors_make_exec_abort() {
        let mut state = MultiState::default();
        let mut client = Client::new(1);
        assert_eq!(state.take_exec().unwrap_err(), EXEC_WITHOUT_MULTI);
        state.begin().unwrap();
        assert_eq!(state.begin().unwrap_err(), NESTED);
        let q = state.queue(&args("set k 1"), &mut client, &env(), &LIMITS);
        assert_eq!(reply(q), Bytes::from_static(b"+QUEUED\r\n"));
        let (commands, _) = state.take_exec().unwrap();
        assert_eq!(commands, vec![args("set k 1")]);
        assert!(!state.in_multi());

        for refused in [
            "nosuch k",
            "get",
            "keys *",
            "set k 1 EX 10",
            "set k 1 KEEPTTL",
        ] {
            state.begin().unwrap();
            let q = state.queue(&args(refused), &mut client, &env(), &LIMITS);
            assert_eq!(reply(q).first(), Some(&b'-'), "{refused}");
            // A runtime error (syntax) is queued, as in Redis.
            let q = state.queue(&args("set k 1 nx xx"), &mut client, &env(), &LIMITS);
            assert_eq!(reply(q), Bytes::from_static(b"+QUEUED\r\n"));
            assert_eq!(state.take_exec().unwrap_err(), EXECABORT, "{refused}");
        }
    }

    #[test]
    fn the_queue_is_bounded() {
        let mut state = MultiState::default();
        let mut client = Client::new(1);
        state.begin().unwrap();
        for _ in 0..LIMITS.commands_max {
            let q = state.queue(&args("incr k"), &mut client, &env(), &LIMITS);
            assert_eq!(reply(q), Bytes::from_static(b"+QUEUED\r\n"));
        }
        let q = state.queue(&args("incr k"), &mut client, &env(), &LIMITS);
        assert_eq!(reply(q).first(), Some(&b'-'));
        assert_eq!(state.take_exec().unwrap_err(), EXECABORT);
    }

    #[test]
    fn exec_discard_multi_and_watch_run_at_once_inside_multi() {
        let mut state = MultiState::default();
        let mut client = Client::new(1);
        state.begin().unwrap();
        for (line, want) in [
            ("exec", MultiCommand::Exec),
            ("discard", MultiCommand::Discard),
            ("multi", MultiCommand::Multi),
            ("watch k", MultiCommand::Watch(args("k"))),
        ] {
            match state.queue(&args(line), &mut client, &env(), &LIMITS) {
                Queued::Run(Planned::Multi(got)) => assert_eq!(got, want),
                other => panic!("{line}: {other:?}"),
            }
        }
        assert!(state.in_multi());
        assert!(state.discard().is_ok());
        assert_eq!(state.discard().unwrap_err(), DISCARD_WITHOUT_MULTI);
    }
}
