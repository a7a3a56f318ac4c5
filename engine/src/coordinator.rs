//! The transaction coordinator: a [`Txn`] lives with its caller (a server
//! connection) and talks to the shards that own its keys. Its locks live
//! on those shards (`crate::shard::txn`); its writes stay in the `Txn`
//! until commit, when each written shard logs one `TxnPart` WAL record
//! (`crate::txn::record`). Recovery applies a multi-shard transaction only
//! if every participant's part is in its log (`crate::txn::recovery`).
//!
//! It sits above the shards and the engine handle (it sends messages
//! through the router and adds `begin` and `key_marks` to
//! [`Handle`](crate::Handle)); nothing below imports it.
//!
//! What must hold: every lock a `Txn` takes is released exactly once (on
//! commit, rollback, abort or drop), except the locks of a multi-shard
//! commit that failed with its outcome undecided, which its participants
//! keep until the restart decides it; nobody sees a multi-shard
//! transaction's writes before every part is durable; a failed commit is
//! answered as failed, never as done.

use crate::api::{Op, OpError};
use crate::mesh::Back;
use crate::metrics::TxnStats;
use crate::shard::router::{local_shard, EngineShared, ShardMsg};
use crate::shard::txn::{self as shard, TxnMsg};
use crate::txn::record::{header_len, TxnWrite, WRITES_FIXED_BYTES};
use crate::txn::watch::KeyMark;
use crate::txn::{AbortReason, TxnError, TxnSettings};
use crate::wal::format::RECORD_HEADER_BYTES;
use bytes::Bytes;
use futures::channel::oneshot;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Active,
    Aborted(AbortReason),
    Finished,
}

/// One interactive transaction. Dropping it unfinished rolls it back.
pub struct Txn {
    shared: Arc<EngineShared>,
    id: u64,
    settings: TxnSettings,
    locked: BTreeSet<Bytes>,
    /// Shards where this transaction holds locks.
    shards: BTreeSet<u16>,
    writes: BTreeMap<Bytes, Option<Bytes>>,
    state: State,
}

impl std::fmt::Debug for Txn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Txn")
            .field("id", &self.id)
            .field("locks", &self.locked.len())
            .field("writes", &self.writes.len())
            .field("state", &self.state)
            .finish()
    }
}

impl EngineShared {
    /// Hands a transaction message to `shard`: inline on its own thread,
    /// through the mesh from another shard's, through its inbox otherwise.
    async fn txn_send(&self, shard: usize, msg: TxnMsg) -> Result<(), OpError> {
        if let Some((s, core)) = local_shard(self.engine_id) {
            if s == shard {
                shard::handle(&core, msg);
                return Ok(());
            }
        }
        if let Some(port) = crate::mesh::port_of(self.engine_id) {
            let engine_id = self.engine_id;
            // Run on the receiving shard's thread; dropped unrun (that
            // shard stopped), the message's answer channels close.
            return port.call(
                shard,
                Box::new(move || {
                    if let Some((_, core)) = local_shard(engine_id) {
                        shard::handle(&core, msg);
                    }
                }),
            );
        }
        self.inboxes[shard]
            .send_async(ShardMsg::Txn(msg))
            .await
            .map_err(|_| OpError::ShuttingDown)?;
        if self.closed[shard].load(std::sync::atomic::Ordering::SeqCst) {
            return Err(OpError::ShuttingDown);
        }
        Ok(())
    }

    /// Sends a message built around a reply channel and waits for it.
    async fn txn_ask<T: Send + 'static>(
        &self,
        shard: usize,
        make: impl FnOnce(Back<T>) -> TxnMsg,
    ) -> Result<T, OpError> {
        let (tx, rx) = oneshot::channel();
        self.txn_send(shard, make(Back::new(self.engine_id, tx)))
            .await?;
        rx.await.map_err(|_| OpError::ShuttingDown)
    }

    /// Releases `txn`'s locks on `shards`, waiting for each to answer.
    async fn txn_release(&self, txn: u64, shards: &BTreeSet<u16>) {
        for &s in shards {
            let _ = self
                .txn_ask(s as usize, |reply| TxnMsg::Release {
                    txn,
                    reply: Some(reply),
                })
                .await;
        }
    }
}

/// The age of a transaction that a lock conflict (wait-die or a lock-wait
/// timeout) aborted, kept so that the client's next attempt starts with it
/// ([`crate::Handle::begin_again`]): the retry is as old as the first
/// attempt, so it waits behind the younger holders it would otherwise die
/// for, and a transaction retried in a loop cannot starve. Only
/// [`Txn::into_retry`] makes one, from a transaction that never logged a
/// part, so reusing its id cannot mix two transactions' parts.
#[derive(Debug)]
pub struct RetryTicket {
    id: u64,
}

impl crate::Handle {
    /// Starts a transaction. Its id orders it for wait-die (smaller is
    /// older); nothing is sent to any shard until its first operation.
    pub fn begin(&self, settings: TxnSettings) -> Txn {
        let id = self.shared.clock.next();
        self.begin_with_id(settings, id)
    }

    /// Starts the next attempt of a transaction a lock conflict aborted,
    /// with that transaction's id (see [`RetryTicket`]).
    pub fn begin_again(&self, settings: TxnSettings, ticket: RetryTicket) -> Txn {
        self.begin_with_id(settings, ticket.id)
    }

    fn begin_with_id(&self, settings: TxnSettings, id: u64) -> Txn {
        let shared = self.shared.clone();
        shared.txn_stats.open.fetch_add(1, Relaxed);
        Txn {
            shared,
            id,
            settings,
            locked: BTreeSet::new(),
            shards: BTreeSet::new(),
            writes: BTreeMap::new(),
            state: State::Active,
        }
    }

    /// The engine-wide transaction counters.
    pub fn txn_stats(&self) -> &TxnStats {
        &self.shared.txn_stats
    }
}

impl Txn {
    /// This transaction's id (its wait-die age).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Ends a transaction a lock conflict aborted (wait-die or a lock-wait
    /// timeout) and gives its age for the client's next attempt; any other
    /// transaction is given back as it was. Such a transaction holds no
    /// lock (the abort released them) and logged nothing (conflicts abort
    /// while locks are taken, before the commit). Taking `self` makes one
    /// ticket per transaction, so two attempts never share an id.
    pub fn into_retry(mut self) -> Result<RetryTicket, Txn> {
        match self.state {
            State::Aborted(AbortReason::Die | AbortReason::LockTimeout) => {
                debug_assert!(
                    self.shards.is_empty(),
                    "an aborted transaction holds no lock"
                );
                self.finish();
                Ok(RetryTicket { id: self.id })
            }
            _ => Err(self),
        }
    }

    /// Why it was aborted, if it was.
    pub fn aborted(&self) -> Option<AbortReason> {
        match self.state {
            State::Aborted(r) => Some(r),
            _ => None,
        }
    }

    /// Keys locked so far.
    pub fn lock_count(&self) -> usize {
        self.locked.len()
    }

    fn check_active(&self) -> Result<(), TxnError> {
        match self.state {
            State::Active => Ok(()),
            State::Aborted(reason) => Err(TxnError::Aborted { reason }),
            State::Finished => panic!("a finished transaction is not used again"),
        }
    }

    fn check_key(&self, op: &Op) -> Result<(), TxnError> {
        self.shared.limits.check(op).map_err(TxnError::Op)
    }

    /// Aborts now: releases every lock, answers `Aborted` from then on.
    pub async fn abort(&mut self, reason: AbortReason) {
        if self.state != State::Active {
            return;
        }
        self.state = State::Aborted(reason);
        let counter = match reason {
            AbortReason::Die => &self.shared.txn_stats.aborts_die,
            AbortReason::LockTimeout => &self.shared.txn_stats.aborts_lock_timeout,
            AbortReason::Idle => &self.shared.txn_stats.aborts_idle,
        };
        counter.fetch_add(1, Relaxed);
        let shards = std::mem::take(&mut self.shards);
        self.shared.txn_release(self.id, &shards).await;
        self.locked.clear();
        self.writes.clear();
    }

    /// Takes the lock on `key` if not held yet; with `read`, returns the
    /// value this transaction sees.
    async fn lock(&mut self, key: &Bytes, read: bool) -> Result<Option<Bytes>, TxnError> {
        if self.locked.contains(key) {
            if !read {
                return Ok(None);
            }
            if let Some(buffered) = self.writes.get(key) {
                return Ok(buffered.clone());
            }
            return self.read_committed(key).await;
        }
        if self.locked.len() >= self.settings.locks_max {
            return Err(TxnError::TooManyLocks {
                max: self.settings.locks_max,
            });
        }
        let shard = self.shared.shard_of(key);
        let (txn, wait_max) = (self.id, self.settings.lock_wait_max);
        let answer = self
            .shared
            .txn_ask(shard, |reply| TxnMsg::Lock {
                txn,
                key: key.clone(),
                read,
                wait_max,
                reply,
            })
            .await?;
        // The shard may have granted the lock even if the read failed.
        self.shards.insert(shard as u16);
        match answer {
            Ok(value) => {
                self.locked.insert(key.clone());
                Ok(value)
            }
            Err(TxnError::Die) => {
                self.abort(AbortReason::Die).await;
                Err(TxnError::Die)
            }
            Err(TxnError::LockTimeout) => {
                self.abort(AbortReason::LockTimeout).await;
                Err(TxnError::LockTimeout)
            }
            Err(e) => {
                self.locked.insert(key.clone());
                Err(e)
            }
        }
    }

    async fn read_committed(&self, key: &Bytes) -> Result<Option<Bytes>, TxnError> {
        let shard = self.shared.shard_of(key);
        self.shared
            .txn_ask(shard, |reply| TxnMsg::Read {
                key: key.clone(),
                reply,
            })
            .await?
    }

    /// Read-committed read without a lock: this transaction's own write if
    /// it has one, else the newest committed, durable value.
    pub async fn get(&mut self, key: Bytes) -> Result<Option<Bytes>, TxnError> {
        self.check_active()?;
        self.check_key(&Op::Get { key: key.clone() })?;
        if let Some(buffered) = self.writes.get(&key) {
            return Ok(buffered.clone());
        }
        self.read_committed(&key).await
    }

    /// Locks `key` and reads it (the value stays until commit or rollback
    /// unless this transaction writes it).
    pub async fn get_for_update(&mut self, key: Bytes) -> Result<Option<Bytes>, TxnError> {
        self.check_active()?;
        self.check_key(&Op::Get { key: key.clone() })?;
        self.lock(&key, true).await
    }

    /// Locks `key` and buffers the write until commit.
    pub async fn put(&mut self, key: Bytes, value: Bytes) -> Result<(), TxnError> {
        self.check_active()?;
        self.check_key(&Op::Put {
            key: key.clone(),
            value: value.clone(),
        })?;
        self.lock(&key, false).await?;
        self.writes.insert(key, Some(value));
        Ok(())
    }

    /// Locks `key` and buffers its removal; `true` if it existed (as this
    /// transaction sees it).
    pub async fn delete(&mut self, key: Bytes) -> Result<bool, TxnError> {
        self.check_active()?;
        self.check_key(&Op::Delete { key: key.clone() })?;
        let existed = self.lock(&key, true).await?.is_some();
        self.writes.insert(key, None);
        Ok(existed)
    }

    /// Starts this transaction again after wait-die or a lock-wait timeout
    /// aborted it: its locks are released, its writes dropped, and the new
    /// transaction keeps this one's id. Wait-die then still sees the first
    /// start time, so each restart leaves it older than every newcomer and
    /// it ends up waiting instead of dying again (no starvation). Nothing
    /// of an aborted transaction reached the WAL, so reusing its id cannot
    /// mix its parts with the restarted one's.
    pub async fn restart(mut self) -> Txn {
        assert!(
            matches!(
                self.state,
                State::Aborted(AbortReason::Die | AbortReason::LockTimeout)
            ),
            "only a transaction aborted by a lock conflict is restarted"
        );
        let shards = std::mem::take(&mut self.shards);
        self.shared.txn_release(self.id, &shards).await;
        self.finish();
        self.shared.txn_stats.open.fetch_add(1, Relaxed);
        Txn {
            shared: self.shared.clone(),
            id: self.id,
            settings: self.settings,
            locked: BTreeSet::new(),
            shards: BTreeSet::new(),
            writes: BTreeMap::new(),
            state: State::Active,
        }
    }

    /// Releases everything; nothing is written.
    pub async fn rollback(mut self) {
        if self.state == State::Active {
            self.shared.txn_stats.rollbacks.fetch_add(1, Relaxed);
        }
        let shards = std::mem::take(&mut self.shards);
        self.shared.txn_release(self.id, &shards).await;
        self.finish();
    }

    fn finish(&mut self) {
        if self.state != State::Finished {
            self.state = State::Finished;
            self.shared.txn_stats.open.fetch_sub(1, Relaxed);
        }
    }

    /// Commits: one WAL record per written shard; answered once every part
    /// is logged (and durable under `sync`) and applied.
    pub async fn commit(mut self) -> Result<(), TxnError> {
        if let State::Aborted(reason) = self.state {
            self.finish();
            return Err(TxnError::Aborted { reason });
        }
        let result = self.commit_parts().await;
        let stats = &self.shared.txn_stats;
        match &result {
            Ok(()) => stats.commits.fetch_add(1, Relaxed),
            Err(_) => stats.commit_failures.fetch_add(1, Relaxed),
        };
        self.finish();
        result
    }

    async fn commit_parts(&mut self) -> Result<(), TxnError> {
        let shared = self.shared.clone();
        let mut by_shard: BTreeMap<u16, Vec<TxnWrite>> = BTreeMap::new();
        for (key, value) in std::mem::take(&mut self.writes) {
            let shard = shared.shard_of(&key) as u16;
            by_shard
                .entry(shard)
                .or_default()
                .push(TxnWrite { key, value });
        }
        let lock_shards = self.shards.clone();
        let txn = self.id;
        if by_shard.is_empty() {
            shared.txn_release(txn, &lock_shards).await;
            return Ok(());
        }
        let participants: Arc<[u16]> = by_shard.keys().copied().collect();
        if let Err(e) = check_part_sizes(&shared, &by_shard, participants.len())
            .and_then(|()| check_memory(&shared, &by_shard))
        {
            shared.txn_release(txn, &lock_shards).await;
            return Err(e);
        }
        let others: BTreeSet<u16> = lock_shards
            .iter()
            .copied()
            .filter(|s| !by_shard.contains_key(s))
            .collect();
        if by_shard.len() == 1 {
            let Some((shard, writes)) = by_shard.into_iter().next() else {
                unreachable!("one shard")
            };
            return commit_on_one_shard(&shared, txn, shard, participants, writes, &others).await;
        }
        // Several shards: log every part, then apply every part.
        let parts = match log_parts(&shared, txn, &by_shard, &participants).await {
            Ok(parts) => parts,
            Err(failed) => {
                // Parts already logged stay unresolved on their shards
                // (their checkpoints stop short of them) until a restart
                // decides.
                let release = match failed.outcome {
                    FailedOutcome::NotApplied => &lock_shards,
                    FailedOutcome::Undecided => {
                        tracing::warn!(
                            txn,
                            participants = ?participants,
                            keys = self.locked.len(),
                            error = %failed.error,
                            "a multi-shard commit failed with a part that may be on disk: whether it is applied is decided at the next restart, and its keys stay locked until then (plain writes on them answer LOCKED, transactions that want them die or time out)"
                        );
                        &others
                    }
                };
                shared.txn_release(txn, release).await;
                return Err(failed.error);
            }
        };
        let result = apply_parts(&shared, txn, by_shard, parts).await;
        shared.txn_release(txn, &others).await;
        result
    }
}

/// Refuses a commit whose part on some shard would not fit one WAL record.
fn check_part_sizes(
    shared: &EngineShared,
    by_shard: &BTreeMap<u16, Vec<TxnWrite>>,
    participants: usize,
) -> Result<(), TxnError> {
    let max = shared.limits.record_bytes_max;
    for (&shard, writes) in by_shard {
        let bytes = RECORD_HEADER_BYTES
            + header_len(participants)
            + WRITES_FIXED_BYTES
            + writes.iter().map(TxnWrite::encoded_len).sum::<usize>();
        if bytes > max {
            return Err(TxnError::TooLarge {
                shard: shard as usize,
                bytes,
                max,
            });
        }
    }
    Ok(())
}

/// Most bytes one put of a transaction adds to a tier beyond its key and
/// value (memory tier: the entry header, expiry, table slot and growth
/// share) or in all (hybrid tier: a spilled index entry and an expiry
/// entry); what [`check_memory`] counts.
const TXN_PUT_OVERHEAD_BYTES: u64 = 96;

/// Refuses a commit whose puts would take some shard past its share of
/// `storage.max_memory`, before any part is logged, so the commit aborts
/// whole and the WAL never holds it. Reads each shard's usage as last
/// published (at the end of its latest apply step) and counts every put
/// as new (an upper bound); a commit of deletes only always passes.
fn check_memory(
    shared: &EngineShared,
    by_shard: &BTreeMap<u16, Vec<TxnWrite>>,
) -> Result<(), TxnError> {
    for (&shard, writes) in by_shard {
        let stats = &shared.stats[shard as usize];
        let max = stats.memory_bytes_max.load(Relaxed);
        if max == 0 {
            continue;
        }
        let growth: u64 = writes
            .iter()
            .filter_map(|w| w.value.as_ref().map(|v| (w.key.len(), v.len())))
            .map(|(key_len, value_len)| {
                let data = if shared.values_in_ram {
                    (key_len + value_len) as u64
                } else {
                    0
                };
                data + TXN_PUT_OVERHEAD_BYTES
            })
            .sum();
        let used = stats.memory_bytes.load(Relaxed);
        if growth > 0 && used.saturating_add(growth) > max {
            stats.oom_refusals.fetch_add(1, Relaxed);
            return Err(TxnError::Op(OpError::OutOfMemory {
                shard: shard as usize,
                used,
                max,
            }));
        }
    }
    Ok(())
}

/// A commit whose writes all go to one shard: one record, logged and
/// applied there in one step (which also releases that shard's locks, as
/// soon as the record is in the WAL buffer). The locks on shards that were
/// only read go as soon as that shard has released its own, before the
/// record is durable; the answer waits for it (early lock release, see
/// docs/transactions.md).
async fn commit_on_one_shard(
    shared: &Arc<EngineShared>,
    txn: u64,
    shard: u16,
    participants: Arc<[u16]>,
    writes: Vec<TxnWrite>,
    others: &BTreeSet<u16>,
) -> Result<(), TxnError> {
    let (released_tx, released_rx) = oneshot::channel();
    let ask = shared.txn_ask(shard as usize, |reply| TxnMsg::Log {
        txn,
        participants,
        writes,
        finish: true,
        released: Some(Back::new(shared.engine_id, released_tx)),
        reply,
    });
    let release_others = async {
        // Sent or dropped (the commit failed first): either way this
        // transaction writes nothing more through these locks.
        let _ = released_rx.await;
        shared.txn_release(txn, others).await;
    };
    let mut ask = std::pin::pin!(ask);
    let mut release_others = std::pin::pin!(release_others);
    let logged = match futures::future::select(ask.as_mut(), release_others.as_mut()).await {
        futures::future::Either::Left((logged, _)) => {
            // An answer from the shard comes after its `released` (sent,
            // or dropped with a failed commit), so the release finishes.
            // No answer at all (`ShuttingDown`: the message may sit in the
            // stopped shard's queue, `released` with it, for as long as the
            // engine's handles live): nothing is left to release.
            if logged.is_ok() {
                release_others.await;
            }
            logged
        }
        futures::future::Either::Right(((), _)) => ask.await,
    };
    match logged {
        Ok(Ok(_)) => Ok(()),
        // One record holds the whole transaction: on disk or not, it is
        // all or nothing, and no reader was answered with it (they wait
        // for its LSN), so its locks need not outlive the failure.
        Ok(Err(failed)) => {
            shared.txn_release(txn, &[shard].into()).await;
            Err(failed.error)
        }
        Err(e) => Err(TxnError::Op(e)),
    }
}

/// What a multi-shard commit whose parts were not all logged leaves behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FailedOutcome {
    /// Some participant refused its part before appending it (its shard
    /// was poisoned already): no log holds every part, so recovery never
    /// applies the transaction. Its locks can go.
    NotApplied,
    /// Every participant's part may be on disk (logged, or its flush
    /// failed after the append, or its shard gave no answer): the restart
    /// may find every part and apply the transaction. Until then its
    /// locks stay on every participant, so no reader of the old values
    /// writes over keys the restart may still give the new ones; readers
    /// see the old values, none of the new.
    Undecided,
}

/// The first failure of a multi-shard commit's logging, and its outcome.
struct LogFailed {
    error: TxnError,
    outcome: FailedOutcome,
}

/// Logs every shard's part of a multi-shard commit, all at once. Returns
/// each part's LSN, or the first failure with what it leaves behind.
async fn log_parts(
    shared: &Arc<EngineShared>,
    txn: u64,
    by_shard: &BTreeMap<u16, Vec<TxnWrite>>,
    participants: &Arc<[u16]>,
) -> Result<Arc<[(u16, u64)]>, LogFailed> {
    let logs = by_shard.iter().map(|(&shard, writes)| {
        let shared = shared.clone();
        let participants = participants.clone();
        let writes = writes.clone();
        async move {
            let answer = shared
                .txn_ask(shard as usize, |reply| TxnMsg::Log {
                    txn,
                    participants,
                    writes,
                    finish: false,
                    released: None,
                    reply,
                })
                .await;
            (shard, answer)
        }
    });
    let mut parts = Vec::new();
    let mut failure = None;
    let mut some_part_missing = false;
    for (shard, answer) in futures::future::join_all(logs).await {
        match answer {
            Ok(Ok(lsn)) => parts.push((shard, lsn)),
            Ok(Err(f)) => {
                some_part_missing |= !f.maybe_logged;
                failure.get_or_insert(f.error);
            }
            // No answer (the shard stopped): whether it logged is unknown.
            Err(e) => {
                failure.get_or_insert(TxnError::Op(e));
            }
        }
    }
    match failure {
        Some(error) => Err(LogFailed {
            error,
            outcome: if some_part_missing {
                FailedOutcome::NotApplied
            } else {
                FailedOutcome::Undecided
            },
        }),
        None => Ok(parts.into()),
    }
}

/// Applies every logged part of a multi-shard commit. A part that could
/// not be applied (its shard is poisoned) makes the commit's outcome the
/// restart's to decide, and the commit says so.
async fn apply_parts(
    shared: &Arc<EngineShared>,
    txn: u64,
    by_shard: BTreeMap<u16, Vec<TxnWrite>>,
    parts: Arc<[(u16, u64)]>,
) -> Result<(), TxnError> {
    let applies = by_shard.into_iter().map(|(shard, writes)| {
        let shared = shared.clone();
        let parts = parts.clone();
        let lsn = parts
            .iter()
            .find(|(s, _)| *s == shard)
            .map_or(0, |(_, l)| *l);
        async move {
            shared
                .txn_ask(shard as usize, |reply| TxnMsg::Apply {
                    txn,
                    lsn,
                    writes,
                    parts,
                    reply,
                })
                .await
        }
    });
    let mut failure = None;
    for answer in futures::future::join_all(applies).await {
        match answer {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                failure.get_or_insert(e);
            }
            // The shard is going away; every part is logged, so the
            // restart applies this one (as before this answer).
            Err(_) => {}
        }
    }
    match failure {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

impl Drop for Txn {
    /// An unfinished transaction (its owner went away) is rolled back: its
    /// locks are released without waiting.
    fn drop(&mut self) {
        if self.state == State::Finished {
            return;
        }
        self.shared.txn_stats.aborts_dropped.fetch_add(1, Relaxed);
        self.finish();
        let port = crate::mesh::port_of(self.shared.engine_id);
        let here = local_shard(self.shared.engine_id).map(|(s, _)| s);
        for &shard in &self.shards {
            // From a shard thread, the release to another shard goes the
            // way this transaction's locks went (the mesh), so it cannot
            // pass a lock request still on its way there.
            if let Some(port) = port.as_ref().filter(|_| here != Some(shard as usize)) {
                let (engine_id, txn) = (self.shared.engine_id, self.id);
                let _ = port.call(
                    shard as usize,
                    Box::new(move || {
                        if let Some((_, core)) = local_shard(engine_id) {
                            shard::handle(&core, TxnMsg::Release { txn, reply: None });
                        }
                    }),
                );
                continue;
            }
            let msg = ShardMsg::Txn(TxnMsg::Release {
                txn: self.id,
                reply: None,
            });
            let inbox = &self.shared.inboxes[shard as usize];
            if let Err(flume::TrySendError::Full(msg)) = inbox.try_send(msg) {
                // Rare: the inbox is full. A short-lived thread waits for room
                // (a lock must never be left behind).
                let inbox = inbox.clone();
                let _ = std::thread::Builder::new()
                    .name("ringkv-txn-release".into())
                    .spawn(move || {
                        let _ = inbox.send(msg);
                    });
            }
        }
    }
}

impl crate::Handle {
    /// The current marks of `keys`, in order (one message per shard; each
    /// shard answers for its keys in one step). Taking the marks of keys a
    /// transaction holds gives marks no plain write can change until it
    /// ends (plain writes on them are refused).
    pub async fn key_marks(&self, keys: &[Bytes]) -> Result<Vec<KeyMark>, crate::OpError> {
        let shared: &EngineShared = &self.shared;
        let mut by_shard: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for (index, key) in keys.iter().enumerate() {
            by_shard
                .entry(shared.shard_of(key))
                .or_default()
                .push(index);
        }
        let asks = by_shard.into_iter().map(|(shard, indexes)| {
            let shard_keys: Vec<Bytes> = indexes.iter().map(|&i| keys[i].clone()).collect();
            async move {
                let marks = shared
                    .txn_ask(shard, |reply| TxnMsg::Marks {
                        keys: shard_keys,
                        reply,
                    })
                    .await;
                (indexes, marks)
            }
        });
        let mut out = vec![
            KeyMark {
                writes: 0,
                expires_at_ms: None
            };
            keys.len()
        ];
        for (indexes, marks) in futures::future::join_all(asks).await {
            let marks = marks?;
            assert_eq!(marks.len(), indexes.len(), "one mark per key asked");
            for (i, mark) in indexes.into_iter().zip(marks) {
                out[i] = mark;
            }
        }
        Ok(out)
    }

    /// Checks `op` against the engine's limits (empty key, key or value
    /// too large) without running it.
    pub fn check_limits(&self, op: &crate::Op) -> Result<(), crate::OpError> {
        self.shared.limits.check(op)
    }
}
