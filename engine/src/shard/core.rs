//! The state of one shard and its apply path: operations are applied to
//! the tier and logged to the WAL append buffer in one synchronous step
//! (so LSN order is apply order), then answered when the durability mode
//! allows. Lives on its shard thread only (`Rc`, `RefCell`); no borrow is
//! ever held across an `.await`.
//!
//! What must hold: in `sync` mode a write (or a batch containing one) is
//! answered only once every record logged before its answer is durable;
//! after poisoning no write is logged or acknowledged; LSNs grow by one per
//! record; commit versions are non-decreasing in LSN order.

use crate::api::{Op, OpError, OpResult, UpdateOutcome, UpdateWrite};
use crate::clock::now_ms;
use crate::hash::TableHasher;
use crate::metrics::ShardStats;
use crate::notify::Notify;
use crate::tier::{ColdGet, DeleteLookup, Tier, TierRoom};
use crate::txn::watch::{KeyMark, WriteMarks};
use crate::wal::durable::{Append, Applied, Wal, WriteSet};
use crate::wal::format::{record_size, RecordKind};
use crate::wal::writer::WalAppender;
use futures::channel::oneshot;
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use tunables::Durability;

/// Adds `n` to one of the counters only the shard's own thread writes
/// (operations, WAL records, expired keys): a load and a store, which
/// other threads may read at any time. A locked add would cost more than
/// its own cycles: it waits for every earlier store (the tier's, to cold
/// cache lines) to land first.
fn bump(counter: &AtomicU64, n: u64) {
    counter.store(counter.load(Relaxed).wrapping_add(n), Relaxed);
}

/// The engine-wide commit-version clock (monotonic across shards).
#[derive(Debug, Default)]
pub(crate) struct CommitClock {
    last: AtomicU64,
}

impl CommitClock {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// A new version, larger than every version handed out before.
    pub(crate) fn next(&self) -> u64 {
        self.last.fetch_add(1, Relaxed) + 1
    }

    /// Makes sure later versions are larger than `seen` (recovery).
    pub(crate) fn observe(&self, seen: u64) {
        self.last.fetch_max(seen, Relaxed);
    }

    pub(crate) fn current(&self) -> u64 {
        self.last.load(Relaxed)
    }
}

struct CoreState {
    tier: Box<dyn Tier>,
    /// The tier's table hasher: every key's `hash` argument comes from it.
    table_hasher: TableHasher,
    /// LSN of the newest plain write applied to the tier (transaction parts
    /// applied before they are durable are in `txn_undurable` instead).
    plain_write_lsn: u64,
    /// Bumped with every change of a key in the tier (WATCH).
    write_marks: WriteMarks,
    /// Under `sync`: key hash -> LSN of a transaction part applied to the
    /// tier before it was durable (early lock release). A read of such a
    /// key waits for that LSN; entries at or below the durable LSN are
    /// stale and dropped as they are met.
    txn_undurable: std::collections::HashMap<u64, u64>,
    /// The largest LSN in `txn_undurable` (once durable, all of it is).
    txn_undurable_max: u64,
    /// The tier's memory as the limit sees it: [`Tier::memory_bytes`] at
    /// the end of the last step, plus the growth bound of every write
    /// applied since (so the check needs no full count per write).
    used_bytes: u64,
}

/// Settings of the apply path.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CoreSettings {
    pub(crate) shard: usize,
    pub(crate) durability: Durability,
    pub(crate) checkpoint_wal_bytes: u64,
    pub(crate) max_record_bytes: usize,
    pub(crate) value_bytes_max: usize,
    /// Bytes of values one batch's GETs may read on this shard; the GET
    /// that reaches it is still answered, later ones are not looked up
    /// (they answer [`OpError::ReadLimitReached`]). Bounds the memory one
    /// request takes to about this plus one value per shard.
    pub(crate) read_bytes_max: usize,
    /// This shard's share of `storage.max_memory`: a write that would grow
    /// the tier past it is refused before it is logged (0: no limit).
    pub(crate) memory_bytes_max: u64,
}

/// One shard's state and the notifications between its tasks.
pub(crate) struct ShardCore {
    pub(crate) settings: CoreSettings,
    /// Locks and transaction parts of this shard.
    pub(crate) txn: crate::shard::txn::TxnShard,
    pub(crate) stats: Arc<ShardStats>,
    pub(crate) clock: Arc<CommitClock>,
    state: RefCell<CoreState>,
    /// The shard's WAL: durability, the flusher's wake-ups, the checkpoint
    /// trigger. The WAL bytes after which a checkpoint is due are the
    /// configured `checkpoint_wal_bytes`, or the size of the last snapshot
    /// if larger (a checkpoint never costs more than the log it replaces;
    /// like Redis's `auto-aof-rewrite-percentage 100`).
    pub(crate) wal: Rc<Wal>,
    /// The tier queued settling reads ([`Tier::take_settles`]).
    pub(crate) settle_wanted: Notify,
    /// Raised by the tier when writes it held back ([`Tier::write_room`])
    /// may go on.
    tier_room: TierRoom,
    /// An online backup's requests to the checkpointer, and its pin.
    pub(crate) backup: crate::shard::backup::BackupSide,
}

/// What one apply step logged to the WAL.
#[derive(Default)]
struct StepLog {
    /// The step's commit version, once its first record is logged.
    version: Option<u64>,
    records: u64,
    /// The appender moved to a new segment (the segment creator has work).
    rolled: bool,
}

/// Operation counts of one apply step, added to the atomics once.
#[derive(Default)]
struct Counts {
    get: u64,
    put: u64,
    delete: u64,
    failed: u64,
    records: u64,
    expired: u64,
}

/// What one batch's apply collects across its steps.
struct BatchOut {
    results: Vec<OpResult>,
    writes: WriteSet,
    /// Whether any write is among the results (a `sync` answer waits).
    had_write: bool,
    counts: Counts,
    /// The batch's read budget left for values.
    read_left: usize,
    /// GETs and delete answers that need a device read.
    cold: Vec<ColdGet>,
}

impl BatchOut {
    /// The answer of a write (a PUT, an update, or a DELETE when `delete`).
    fn write(&mut self, index: usize, delete: bool, result: OpResult) {
        self.writes.mark(index, true);
        self.had_write = true;
        if delete {
            self.counts.delete += 1;
        } else {
            self.counts.put += 1;
        }
        self.results.push(result);
    }

    /// A write that failed with `e`.
    fn failed_write(&mut self, index: usize, delete: bool, e: OpError) {
        self.counts.failed += 1;
        self.write(index, delete, OpResult::Err(e));
    }
}

/// How one operation of an apply step went.
enum OpStep {
    /// Answered; the step goes on with the next operation.
    Done,
    /// No room in the WAL buffer or the tier; nothing was applied. The
    /// step stops and the operation runs again, on the same state, once
    /// there is room.
    Wait,
}

/// What an update's outcome writes: the value and its expiry, or a delete
/// (also when the expiry has already passed), or nothing.
fn update_write(
    write: &UpdateWrite,
    current_value: Option<bytes::Bytes>,
    current_expiry: Option<u64>,
    now: u64,
) -> (UpdateWrite, Option<u64>) {
    let (write, expiry) = match write {
        UpdateWrite::Keep => (UpdateWrite::Keep, None),
        UpdateWrite::Put(v) => (UpdateWrite::Put(v.clone()), current_expiry),
        UpdateWrite::PutExpiring(v, at) => (UpdateWrite::Put(v.clone()), *at),
        UpdateWrite::SetExpiry(at) => match current_value {
            Some(v) => (UpdateWrite::Put(v), *at),
            None => (UpdateWrite::Keep, None),
        },
        UpdateWrite::Delete => (UpdateWrite::Delete, None),
    };
    match write {
        // An expiry time already passed: the key goes.
        UpdateWrite::Put(_) if expiry.is_some_and(|at| at <= now) => (UpdateWrite::Delete, expiry),
        w => (w, expiry),
    }
}

impl ShardCore {
    pub(crate) fn new(
        settings: CoreSettings,
        mut tier: Box<dyn Tier>,
        last_lsn: u64,
        wal: Option<WalAppender>,
        stats: Arc<ShardStats>,
        clock: Arc<CommitClock>,
        txn: crate::shard::txn::TxnShard,
    ) -> ShardCore {
        let tier_room = TierRoom::new();
        tier.set_room_signal(tier_room.clone());
        assert_eq!(wal.is_some(), settings.durability != Durability::None);
        let wal = Rc::new(Wal::new(
            settings.shard,
            last_lsn,
            wal,
            stats.clone(),
            settings.checkpoint_wal_bytes,
        ));
        stats.keys.store(tier.len(), Relaxed);
        let used_bytes = tier.memory_bytes();
        stats.memory_bytes.store(used_bytes, Relaxed);
        stats
            .memory_bytes_max
            .store(settings.memory_bytes_max, Relaxed);
        if settings.memory_bytes_max != 0 && used_bytes > settings.memory_bytes_max {
            tracing::warn!(
                shard = settings.shard,
                used_bytes,
                max_bytes = settings.memory_bytes_max,
                "this shard's tier already holds more than its share of storage.max_memory (its fixed tables and buffers plus the recovered data): writes that grow memory answer OUT_OF_MEMORY until deletes bring it under; raise storage.max_memory if it is the fixed part"
            );
        }
        ShardCore {
            settings,
            txn,
            stats,
            clock,
            state: RefCell::new(CoreState {
                table_hasher: tier.table_hasher(),
                tier,
                plain_write_lsn: last_lsn,
                write_marks: WriteMarks::new(),
                txn_undurable: std::collections::HashMap::new(),
                txn_undurable_max: 0,
                used_bytes,
            }),
            wal,
            settle_wanted: Notify::new(),
            tier_room,
            backup: Default::default(),
        }
    }

    pub(crate) fn is_poisoned(&self) -> bool {
        self.wal.is_poisoned()
    }

    pub(crate) fn last_lsn(&self) -> u64 {
        self.wal.last_lsn()
    }

    /// Runs `f` on the tier (reads from a checkpoint or a key scan), with
    /// the tier's clock set to now (expired keys are not visited).
    pub(crate) fn with_tier<R>(&self, f: impl FnOnce(&dyn Tier) -> R) -> R {
        let mut st = self.state.borrow_mut();
        st.tier.set_now_ms(now_ms());
        f(&*st.tier)
    }

    /// A write of the tier's own files failed: poison the shard (the WAL
    /// keeps everything acknowledged; a restart recovers it). Returns
    /// whether the tier reported a failure since the last call.
    fn check_tier_fault(&self) -> bool {
        let fault = self.state.borrow_mut().tier.take_fault();
        if let Some(fault) = &fault {
            self.poison_with(fault);
        }
        fault.is_some()
    }

    /// Makes up to `max` of the settling reads the tier queued, all
    /// submitted together (the shard serves other requests meanwhile;
    /// the tier wakes writes held back for them). Returns whether there
    /// were any.
    pub(crate) async fn settle_some(&self, max: usize) -> bool {
        let mut cold = Vec::new();
        self.state.borrow_mut().tier.take_settles(max, &mut cold);
        if cold.is_empty() {
            return false;
        }
        // Nobody waits for their answers.
        let read = self.state.borrow().tier.read_cold(cold);
        read.await;
        true
    }

    /// Wakes the settling task if the tier queued reads outside a batch
    /// (a transaction's commit, an update).
    pub(crate) fn wake_settles(&self) {
        if self.state.borrow().tier.settles_waiting() {
            self.settle_wanted.notify();
        }
    }

    /// Copies the tier's own counters into the shard's metrics, with its
    /// key count and memory: background steps move them too (GC and
    /// settling drop dead entries), and the memory limit's count follows.
    pub(crate) fn publish_tier_stats(&self) {
        let mut st = self.state.borrow_mut();
        let stats = st.tier.stats();
        st.used_bytes = st.tier.memory_bytes();
        self.stats.keys.store(st.tier.len(), Relaxed);
        self.stats.memory_bytes.store(st.used_bytes, Relaxed);
        drop(st);
        *self.stats.tier.lock().unwrap_or_else(|p| p.into_inner()) = stats;
    }

    /// Runs `f` on the tier with the tier's clock set to now, for steps
    /// that change the tier's own state (checkpoints, GC); poisons the
    /// shard if the tier reports a failed write.
    pub(crate) fn with_tier_mut<R>(&self, f: impl FnOnce(&mut dyn Tier) -> R) -> R {
        let out = {
            let mut st = self.state.borrow_mut();
            st.tier.set_now_ms(now_ms());
            f(&mut *st.tier)
        };
        self.check_tier_fault();
        out
    }

    /// Applies as many of `ops` as fit in the WAL buffer now. Returns
    /// whether all were applied (false: wait for buffer space).
    fn apply_some(
        &self,
        ops: &mut std::iter::Peekable<std::vec::IntoIter<Op>>,
        out: &mut BatchOut,
    ) -> bool {
        let shard = self.settings.shard;
        let mut st = self.state.borrow_mut();
        let st = &mut *st;
        let mut step = StepLog::default();
        // One clock reading per step: every operation of the step sees the
        // same keys as expired.
        let now = now_ms();
        st.tier.set_now_ms(now);
        let done = loop {
            let Some(op) = ops.peek() else {
                break true;
            };
            if matches!(op, Op::Get { .. }) {
                // The run is consumed by the call.
                self.apply_gets(st, ops, out);
                continue;
            }
            let index = out.results.len();
            let next = match op {
                Op::Get { .. } => unreachable!("GET runs are applied above"),
                _ if self.wal.is_poisoned() => {
                    let delete = matches!(op, Op::Delete { .. });
                    out.failed_write(index, delete, OpError::Poisoned { shard });
                    OpStep::Done
                }
                _ if self.txn.is_locked(op.key()) => {
                    // A transaction holds the key: refusing keeps both
                    // updates (the caller retries after the commit). A
                    // read-modify-write is refused too: applied now, it
                    // would be overwritten by the transaction's commit.
                    out.counts.failed += 1;
                    out.results.push(OpResult::Err(OpError::Locked { shard }));
                    OpStep::Done
                }
                Op::Put { key, value } => self.apply_put(st, &mut step, index, key, value, out),
                Op::Update { .. } | Op::UpdateTtl { .. } => {
                    self.apply_update(st, &mut step, now, index, op, out)
                }
                Op::Delete { key } => self.apply_delete(st, &mut step, index, key, out),
            };
            match next {
                OpStep::Done => {
                    ops.next();
                }
                OpStep::Wait => break false,
            }
        };
        self.finish_step(st, &step, done, &mut out.counts);
        done
    }

    /// A run of consecutive GETs, in one call to the tier so it can overlap
    /// their memory accesses. No write sits inside the run, so each GET
    /// still sees every write before it in the batch, and none after.
    fn apply_gets(
        &self,
        st: &mut CoreState,
        ops: &mut std::iter::Peekable<std::vec::IntoIter<Op>>,
        out: &mut BatchOut,
    ) {
        let shard = self.settings.shard;
        let index = out.results.len();
        let mut keys = Vec::new();
        while let Some(Op::Get { key }) = ops.next_if(|op| matches!(op, Op::Get { .. })) {
            keys.push(key);
        }
        let hashes: Vec<u64> = keys
            .iter()
            .map(|key| st.table_hasher.hash_key(key))
            .collect();
        out.counts.get += keys.len() as u64;
        // Values are copied only while the batch's read budget lasts; later
        // GETs are answered `ReadLimitReached` without a copy. Keys whose
        // records must come from a device are answered once `apply` has
        // read them (placeholders until then).
        let mut found = Vec::with_capacity(keys.len());
        let cold_from = out.cold.len();
        let answered = st.tier.get_many_split(
            &hashes,
            &keys,
            &mut found,
            &mut out.read_left,
            &mut out.cold,
        );
        for g in &mut out.cold[cold_from..] {
            g.index += index;
        }
        assert_eq!(found.len(), answered, "one answer per GET answered");
        let unreadable = st.tier.take_read_errors();
        let found = found.into_iter().enumerate().map(|(i, v)| {
            match unreadable_error(&unreadable, &keys[i], v.is_none(), shard) {
                Some(e) => Some(Err(e)),
                None => v.map(Ok),
            }
        });
        let max = self.settings.read_bytes_max;
        let values = found.chain(
            (answered..keys.len()).map(|_| Some(Err(OpError::ReadLimitReached { shard, max }))),
        );
        let durable = self.wal.durable_lsn();
        if durable >= st.txn_undurable_max {
            st.txn_undurable.clear();
        }
        for (offset, value) in values.into_iter().enumerate() {
            // A GET that may see a transaction's writes that are not durable
            // yet is answered with the batch's writes: once everything logged
            // before it is durable, and POISONED if the shard fails first.
            let sees_undurable = !st.txn_undurable.is_empty()
                && st
                    .txn_undurable
                    .get(&hashes[offset])
                    .is_some_and(|&lsn| lsn > durable);
            out.writes.mark(index + offset, sees_undurable);
            out.had_write |= sees_undurable;
            out.results.push(match value {
                Some(Ok(v)) => OpResult::Value(v),
                Some(Err(e)) => {
                    out.counts.failed += 1;
                    OpResult::Err(e)
                }
                None => OpResult::NotFound,
            });
        }
    }

    fn apply_put(
        &self,
        st: &mut CoreState,
        step: &mut StepLog,
        index: usize,
        key: &[u8],
        value: &[u8],
        out: &mut BatchOut,
    ) -> OpStep {
        let hash = st.table_hasher.hash_key(key);
        assert!(
            value.len() <= self.settings.value_bytes_max,
            "limits are checked before the shard"
        );
        // Too many settling reads open: the put waits for some to finish
        // rather than read on the shard thread.
        if !st.tier.write_room() {
            return OpStep::Wait;
        }
        let growth = match self.memory_room(st, hash, key, value.len(), None) {
            Ok(growth) => growth,
            Err(e) => {
                out.failed_write(index, false, e);
                return OpStep::Done;
            }
        };
        let Some(lsn) = self.log_record(step, RecordKind::Put, key, value, None) else {
            return OpStep::Wait;
        };
        st.tier.put(hash, key, value, lsn);
        st.used_bytes = st.used_bytes.saturating_add_signed(growth);
        st.write_marks.bump(hash);
        out.write(index, false, OpResult::Ok);
        OpStep::Done
    }

    /// A read-modify-write (`Update`, `UpdateTtl`): reads the key's value
    /// and expiry, runs the update on them and logs and applies what it
    /// decided.
    fn apply_update(
        &self,
        st: &mut CoreState,
        step: &mut StepLog,
        now: u64,
        index: usize,
        op: &Op,
        out: &mut BatchOut,
    ) -> OpStep {
        let shard = self.settings.shard;
        let key = op.key();
        let hash = st.table_hasher.hash_key(key);
        let current = st.tier.get_expiring(hash, key);
        let unreadable = st.tier.take_read_errors();
        if let Some(e) = unreadable_error(&unreadable, key, current.is_none(), shard) {
            // The current value is unknown: nothing is written.
            out.failed_write(index, false, e);
            return OpStep::Done;
        }
        let current_expiry = current.as_ref().and_then(|c| c.1);
        let current_value = current.as_ref().map(|c| c.0.clone());
        let outcome: UpdateOutcome = match op {
            Op::Update { update, .. } => {
                (update.apply)(current_value.clone(), &update.arg, update.number)
            }
            Op::UpdateTtl { update, .. } => {
                (update.apply)(current, now, &update.arg, update.number)
            }
            _ => unreachable!("only updates come here"),
        };
        let (write, expiry) = update_write(&outcome.write, current_value, current_expiry, now);
        let (kind, value) = match &write {
            UpdateWrite::Keep | UpdateWrite::PutExpiring(..) | UpdateWrite::SetExpiry(_) => {
                (None, None)
            }
            UpdateWrite::Put(v) if v.len() > self.settings.value_bytes_max => {
                let max = self.settings.value_bytes_max;
                let e = OpError::ValueTooLarge { len: v.len(), max };
                out.failed_write(index, false, e);
                return OpStep::Done;
            }
            UpdateWrite::Put(v) => (Some(RecordKind::Put), Some(v)),
            // An expired entry is deleted (and logged) too.
            UpdateWrite::Delete if st.tier.contains_any(hash, key) => {
                (Some(RecordKind::Delete), None)
            }
            UpdateWrite::Delete => (None, None),
        };
        let expiry = if kind == Some(RecordKind::Put) {
            expiry
        } else {
            None
        };
        let mut growth = 0;
        if let (Some(RecordKind::Put), Some(v)) = (kind, value) {
            match self.memory_room(st, hash, key, v.len(), expiry) {
                Ok(g) => growth = g,
                Err(e) => {
                    out.failed_write(index, false, e);
                    return OpStep::Done;
                }
            }
        }
        let mut lsn = 0;
        if let Some(kind) = kind {
            let payload: &[u8] = value.map_or(b"", |v| v);
            let Some(logged) = self.log_record(step, kind, key, payload, expiry) else {
                // Nothing was applied: the update runs again, on the same
                // state, once there is room.
                return OpStep::Wait;
            };
            lsn = logged;
            st.write_marks.bump(hash);
        }
        match (kind, value) {
            (Some(RecordKind::Put), Some(v)) => {
                st.tier.put_expiring(hash, key, v, expiry, lsn);
                st.used_bytes = st.used_bytes.saturating_add_signed(growth);
            }
            (Some(_), _) => {
                if !st.tier.contains(hash, key) {
                    out.counts.expired += 1;
                }
                st.tier.delete_blind(hash, key, lsn);
            }
            (None, _) => {}
        }
        out.write(index, false, OpResult::Updated(outcome.answer));
        OpStep::Done
    }

    /// A DELETE. An expired entry is deleted (and logged) like a live one,
    /// but answers NotFound, as Redis's DEL does. When only a device read
    /// can tell whether the key is there (hybrid tier), the delete is
    /// logged and applied now without it, and the answer waits for the
    /// read, like a cold GET's.
    fn apply_delete(
        &self,
        st: &mut CoreState,
        step: &mut StepLog,
        index: usize,
        key: &[u8],
        out: &mut BatchOut,
    ) -> OpStep {
        let shard = self.settings.shard;
        let hash = st.table_hasher.hash_key(key);
        // Past the tier's bounds with its settling reads all open, the
        // delete would read on the shard thread: it waits for room instead.
        if !st.tier.write_room() {
            return OpStep::Wait;
        }
        let lookup = st.tier.delete_lookup(hash, key);
        let live = matches!(lookup, DeleteLookup::Live);
        let any = !matches!(lookup, DeleteLookup::Absent);
        let unreadable = st.tier.take_read_errors();
        if let Some(e) = unreadable_error(&unreadable, key, !any, shard) {
            out.failed_write(index, true, e);
            return OpStep::Done;
        }
        if !any {
            // Nothing to log, but in sync mode the answer still waits for
            // everything logged before it.
            out.write(index, true, OpResult::NotFound);
            return OpStep::Done;
        }
        let Some(lsn) = self.log_record(step, RecordKind::Delete, key, b"", None) else {
            return OpStep::Wait;
        };
        st.tier.delete_blind(hash, key, lsn);
        st.write_marks.bump(hash);
        let answer = if let DeleteLookup::Cold(mut g) = lookup {
            g.index = index;
            out.cold.push(g);
            // A placeholder until the read answers.
            OpResult::NotFound
        } else if live {
            OpResult::Ok
        } else {
            out.counts.expired += 1;
            OpResult::NotFound
        };
        out.write(index, true, answer);
        OpStep::Done
    }

    /// The end of an apply step: the LSN and the gauges the step moved,
    /// and the flusher and the settling task woken.
    fn finish_step(&self, st: &mut CoreState, step: &StepLog, done: bool, counts: &mut Counts) {
        counts.records += step.records;
        if step.records > 0 {
            st.plain_write_lsn = self.wal.last_lsn();
            self.stats.current_lsn.store(st.plain_write_lsn, Relaxed);
        }
        let wake_flusher = step.records > 0 || !done;
        let keys = st.tier.len();
        let memory = st.tier.memory_bytes();
        st.used_bytes = memory;
        self.stats
            .expiring_keys
            .store(st.tier.expiring_count(), Relaxed);
        // Notifications only schedule other tasks; no borrow is re-entered.
        self.stats.keys.store(keys, Relaxed);
        self.stats.memory_bytes.store(memory, Relaxed);
        self.wal.appended(step.records, wake_flusher, step.rolled);
        if st.tier.settles_waiting() {
            self.settle_wanted.notify();
        }
    }

    /// Whether a put of `key` (a `value_len`-byte value) fits the shard's
    /// share of `storage.max_memory`: `Ok(growth)`, the bytes it adds (an
    /// upper bound, negative when it frees), or the OUT_OF_MEMORY error.
    /// A write that does not grow memory always fits. Checked before the
    /// write is logged, so a refused write leaves no trace in the WAL. A
    /// write whose chunk chain is being logged was admitted when the chain
    /// opened and is never refused half way (nothing else can be logged
    /// until its chain ends, and the tier's memory may have moved since,
    /// e.g. the hybrid tier's cache filling from reads).
    fn memory_room(
        &self,
        st: &CoreState,
        hash: u64,
        key: &[u8],
        value_len: usize,
        expires_at_ms: Option<u64>,
    ) -> Result<i64, OpError> {
        let max = self.settings.memory_bytes_max;
        if max == 0 {
            return Ok(0);
        }
        let growth = st
            .tier
            .put_growth_bytes(hash, key, value_len, expires_at_ms);
        if growth <= 0
            || st.used_bytes.saturating_add(growth.unsigned_abs()) <= max
            || self.wal.open_chain_first_lsn().is_some()
        {
            return Ok(growth);
        }
        self.stats.oom_refusals.fetch_add(1, Relaxed);
        Err(OpError::OutOfMemory {
            shard: self.settings.shard,
            used: st.used_bytes,
            max,
        })
    }

    /// Logs one record of an apply step through the WAL state, counting it
    /// in `step`. Returns false when the buffer is full (nothing logged;
    /// the step stops and waits for space). Without a WAL nothing is
    /// logged and the step goes on.
    fn log_record(
        &self,
        step: &mut StepLog,
        kind: RecordKind,
        key: &[u8],
        value: &[u8],
        expires_at_ms: Option<u64>,
    ) -> Option<u64> {
        // Every record of a step shares one commit version, taken from the
        // clock when its first record is logged.
        let clock = &self.clock;
        let version = &mut step.version;
        let next_version = || *version.get_or_insert_with(|| clock.next());
        let logged = if kind == RecordKind::Put
            && self.wal.needs_chain(key.len(), value.len(), expires_at_ms)
        {
            // Too large for one flush: a chunk chain, possibly over several
            // steps (the same write is retried until its end is logged).
            let (logged, rolled) = self
                .wal
                .append_chained(key, value, expires_at_ms, next_version);
            step.rolled |= rolled;
            logged
        } else {
            self.wal
                .append(kind, key, value, expires_at_ms, next_version)
        };
        match logged {
            Append::Logged { lsn, rolled } => {
                step.rolled |= rolled;
                step.records += 1;
                Some(lsn)
            }
            // No WAL (memory tier only): no LSN.
            Append::NoWal => Some(0),
            Append::Full => None,
            Append::Poisoned => unreachable!("writes on a poisoned shard fail before logging"),
        }
    }

    /// Applies a batch to the tier and the WAL buffer, waiting for buffer
    /// space when it is full (back-pressure) and for the device reads of
    /// GETs the tier could not answer from RAM (other batches run
    /// meanwhile; the GETs' answers are those of their place in this
    /// batch); does not wait for durability.
    pub(crate) async fn apply(&self, ops: Vec<Op>) -> Applied {
        let (applied, cold) = self.apply_in_order(ops).await;
        if cold.is_empty() {
            applied
        } else {
            self.finish_reads(applied, cold).await
        }
    }

    /// The part of [`ShardCore::apply`] that must happen in arrival order:
    /// everything but the device reads of cold GETs (and of the answers of
    /// deletes applied without reading), which come back for
    /// [`ShardCore::finish_reads`] (their answers are placeholders until
    /// then). The inbox runs this for one batch after another and leaves
    /// the reads to a task of their own, so a batch that waits for the
    /// device does not hold up the batches behind it.
    pub(crate) async fn apply_in_order(&self, ops: Vec<Op>) -> (Applied, Vec<ColdGet>) {
        let mut out = BatchOut {
            results: Vec::with_capacity(ops.len()),
            writes: WriteSet::None,
            had_write: false,
            counts: Counts::default(),
            read_left: self.settings.read_bytes_max,
            cold: Vec::new(),
        };
        let mut ops = ops.into_iter().peekable();
        loop {
            // A step stops for room in the WAL buffer or in the tier.
            let space = self.wal.space_freed.notified();
            let room = self.tier_room.freed();
            let all = self.apply_some(&mut ops, &mut out);
            self.check_tier_fault();
            if all {
                break;
            }
            futures::future::select(space, room).await;
        }
        let BatchOut {
            results,
            writes,
            had_write,
            counts,
            cold,
            ..
        } = out;
        self.count(&counts);
        let wait_lsn = (had_write && self.settings.durability == Durability::Sync)
            .then(|| self.wal.last_lsn());
        let applied = Applied {
            results,
            wait_lsn,
            writes,
        };
        (applied, cold)
    }

    /// Adds a batch's operation counts to the shard's counters.
    fn count(&self, counts: &Counts) {
        let s = &self.stats;
        if counts.get > 0 {
            bump(&s.ops_get, counts.get);
        }
        if counts.put > 0 {
            bump(&s.ops_put, counts.put);
        }
        if counts.delete > 0 {
            bump(&s.ops_delete, counts.delete);
        }
        if counts.failed > 0 {
            bump(&s.ops_failed, counts.failed);
        }
        if counts.records > 0 {
            bump(&s.wal_records, counts.records);
        }
        if counts.expired > 0 {
            bump(&s.expired_keys, counts.expired);
        }
    }

    /// One PUT (`value: Some`) or DELETE applied now, on the calling
    /// thread, with nothing to wait for first: the embedded API's path for
    /// a single write. `None` when it cannot be applied at once (no room in
    /// the WAL buffer or the tier, a chunk chain, or a delete whose answer
    /// needs a device read): nothing was applied, and the caller takes the
    /// batch path, which waits. Otherwise the answer and, under `sync`, the
    /// LSN it may be given at (once durable). The same steps, checks and
    /// counts as a one-operation batch.
    pub(crate) fn write_now(
        &self,
        key: &[u8],
        value: Option<&[u8]>,
    ) -> Option<(OpResult, Option<u64>)> {
        let shard = self.settings.shard;
        let mut out = BatchOut {
            results: Vec::with_capacity(1),
            writes: WriteSet::None,
            had_write: false,
            counts: Counts::default(),
            read_left: 0,
            cold: Vec::new(),
        };
        {
            let mut st = self.state.borrow_mut();
            let st = &mut *st;
            let mut step = StepLog::default();
            let delete = value.is_none();
            let next = if self.wal.is_poisoned() {
                out.failed_write(0, delete, OpError::Poisoned { shard });
                OpStep::Done
            } else if self.txn.is_locked(key) {
                out.counts.failed += 1;
                out.results.push(OpResult::Err(OpError::Locked { shard }));
                OpStep::Done
            } else {
                if value.is_none() || st.tier.puts_read_clock() {
                    st.tier.set_now_ms(now_ms());
                }
                match value {
                    Some(value) => self.apply_put(st, &mut step, 0, key, value, &mut out),
                    None => self.apply_delete(st, &mut step, 0, key, &mut out),
                }
            };
            let done = matches!(next, OpStep::Done);
            self.finish_step(st, &step, done, &mut out.counts);
            if !done || !out.cold.is_empty() {
                // A delete logged and applied whose answer waits for a
                // read cannot go back: `cold` is only ever filled by the
                // hybrid tier, whose deletes the caller sends the batch way.
                assert!(out.cold.is_empty(), "write_now: a delete needed a read");
                return None;
            }
        }
        self.check_tier_fault();
        self.count(&out.counts);
        let wait_lsn = (out.had_write && self.settings.durability == Durability::Sync)
            .then(|| self.wal.last_lsn());
        let answer = out.results.pop().expect("one answer");
        Some((answer, wait_lsn))
    }

    /// One GET answered now from RAM, on the calling thread: the embedded
    /// API's path for a single read of a tier that holds every value in
    /// RAM. `None` when the answer must wait (a transaction's write to the
    /// key that is not durable yet): the caller takes the batch path.
    pub(crate) fn get_now(&self, key: &[u8]) -> Option<OpResult> {
        let mut st = self.state.borrow_mut();
        let st = &mut *st;
        if !st.txn_undurable.is_empty() {
            return None;
        }
        st.tier.set_now_ms(now_ms());
        let hash = st.table_hasher.hash_key(key);
        let value = st.tier.get(hash, key);
        bump(&self.stats.ops_get, 1);
        Some(match value {
            Some(v) => OpResult::Value(v),
            None => OpResult::NotFound,
        })
    }

    /// Reads the records of a batch's cold GETs and puts their answers in
    /// place (see [`ShardCore::answer_cold`]).
    pub(crate) async fn finish_reads(&self, mut applied: Applied, cold: Vec<ColdGet>) -> Applied {
        let failed = self.answer_cold(cold, &mut applied.results).await;
        if failed > 0 {
            bump(&self.stats.ops_failed, failed);
        }
        applied
    }

    /// Reads the records of a batch's cold GETs and blind deletes (all at
    /// once; the shard serves other requests meanwhile) and puts their
    /// answers in place.
    /// Then applies the batch's read budget again over every value in
    /// order, now that the cold ones' sizes are known.
    /// Returns how many answers became errors.
    async fn answer_cold(&self, cold: Vec<ColdGet>, results: &mut [OpResult]) -> u64 {
        let mut failed = 0;
        let shard = self.settings.shard;
        let deletes: std::collections::HashSet<usize> =
            cold.iter().filter(|g| g.delete).map(|g| g.index).collect();
        let read = self.state.borrow().tier.read_cold(cold);
        for (i, answer) in read.await {
            results[i] = match answer {
                // A delete's: whether its key was there, live.
                Ok(Some(_)) if deletes.contains(&i) => OpResult::Ok,
                Ok(Some(v)) => OpResult::Value(v),
                Ok(None) => OpResult::NotFound,
                Err(reason) => {
                    failed += 1;
                    let reason = if deletes.contains(&i) {
                        format!("the key was deleted, but whether it was there could not be read: {reason}")
                    } else {
                        reason
                    };
                    OpResult::Err(OpError::ValueUnreadable { shard, reason })
                }
            };
        }
        let max = self.settings.read_bytes_max;
        let mut left = max;
        for r in results.iter_mut() {
            if let OpResult::Value(v) = r {
                if left == 0 {
                    failed += 1;
                    *r = OpResult::Err(OpError::ReadLimitReached { shard, max });
                } else {
                    left = left.saturating_sub(v.len());
                }
            }
        }
        failed
    }

    /// Answers an applied batch now, or queues the answer until the LSN it
    /// waits for is durable.
    pub(crate) fn complete(&self, applied: Applied, reply: crate::mesh::Reply) {
        self.wal.complete(applied, reply);
    }

    /// Applies a batch and waits for its answer (the inline path of a
    /// caller running on this shard's thread).
    pub(crate) async fn execute(&self, ops: Vec<Op>) -> Vec<OpResult> {
        let n = ops.len();
        let applied = self.apply(ops).await;
        let (tx, rx) = oneshot::channel();
        self.complete(applied, crate::mesh::Reply::Direct(tx));
        match rx.await {
            Ok(results) => results,
            Err(_) => (0..n)
                .map(|_| OpResult::Err(OpError::ShuttingDown))
                .collect(),
        }
    }

    /// The tier failed to write its own files: no more writes.
    fn poison_with(&self, fault: &str) {
        if self.is_poisoned() {
            return;
        }
        tracing::error!(
            shard = self.settings.shard,
            error = %fault,
            "storage tier write failed: shard poisoned, it accepts no writes until restart (everything acknowledged is in the WAL; free space or fix the device, then restart)"
        );
        self.poison_pending();
    }

    fn poison_pending(&self) {
        self.wal.poison_pending();
    }

    /// The shard thread is ending without answering what waits: drop the
    /// waiting answers so their callers see `ShuttingDown` instead of
    /// waiting forever.
    pub(crate) fn abandon(&self) {
        self.wal.abandon();
    }

    /// The committed value of `key` in the tier.
    pub(crate) fn read_tier(&self, key: &[u8]) -> Result<Option<bytes::Bytes>, OpError> {
        let mut st = self.state.borrow_mut();
        // A key whose expiry time passed since the last step is absent.
        st.tier.set_now_ms(now_ms());
        let value = st.tier.get(st.table_hasher.hash_key(key), key);
        let unreadable = st.tier.take_read_errors();
        match unreadable_error(&unreadable, key, value.is_none(), self.settings.shard) {
            Some(e) => Err(e),
            None => Ok(value),
        }
    }

    /// The write marks of `keys` now (one step: no write of this shard
    /// falls between two of them).
    pub(crate) fn key_marks(&self, keys: &[bytes::Bytes]) -> Vec<KeyMark> {
        let mut st = self.state.borrow_mut();
        st.tier.set_now_ms(now_ms());
        keys.iter()
            .map(|key| {
                let hash = st.table_hasher.hash_key(key);
                KeyMark {
                    writes: st.write_marks.get(hash),
                    expires_at_ms: st.tier.get_expiring(hash, key).and_then(|(_, at)| at),
                }
            })
            .collect()
    }

    /// Under `sync`, the LSN of the newest plain write in the tier if it
    /// is not durable yet (a read made now must wait for it); `None` when
    /// every value in the tier is durable.
    pub(crate) fn undurable_lsn(&self) -> Option<u64> {
        let st = self.state.borrow();
        (self.settings.durability == Durability::Sync
            && self.wal.durable_lsn() < st.plain_write_lsn)
            .then_some(st.plain_write_lsn)
    }

    /// Under `sync`, the LSN a read of `keys` made now must wait for: the
    /// newest plain write in the tier, and the newest transaction part
    /// applied before it was durable that wrote one of `keys`, whichever
    /// is larger and not durable yet. `None`: the read may be answered.
    pub(crate) fn undurable_lsn_of(&self, keys: &[bytes::Bytes]) -> Option<u64> {
        let plain = self.undurable_lsn();
        let durable = self.wal.durable_lsn();
        let mut st = self.state.borrow_mut();
        if durable >= st.txn_undurable_max {
            st.txn_undurable.clear();
            return plain;
        }
        let txn = keys
            .iter()
            .filter_map(|key| {
                let hash = st.table_hasher.hash_key(key);
                st.txn_undurable.get(&hash).copied()
            })
            .filter(|&lsn| lsn > durable)
            .max();
        plain.max(txn)
    }

    /// Logs one transaction part (waiting for buffer space). `Ok(None)`
    /// without a WAL; `Err` once the shard is poisoned.
    pub(crate) async fn log_txn_part(&self, header: &[u8], body: &[u8]) -> Result<Option<u64>, ()> {
        let size = record_size(header.len(), body.len());
        assert!(
            size <= self.settings.max_record_bytes,
            "transaction parts are checked against the record limit before the shard"
        );
        loop {
            let space = self.wal.space_freed.notified();
            let clock = &self.clock;
            match self
                .wal
                .append(RecordKind::TxnPart, header, body, None, || clock.next())
            {
                Append::Poisoned => return Err(()),
                Append::NoWal => return Ok(None),
                Append::Full => self.wal.appended(0, true, false),
                Append::Logged { lsn, rolled } => {
                    bump(&self.stats.wal_records, 1);
                    self.stats.current_lsn.store(lsn, Relaxed);
                    self.wal.appended(1, true, rolled);
                    return Ok(Some(lsn));
                }
            }
            space.await;
        }
    }

    /// Applies a transaction part's writes to the tier. `Err` if the tier
    /// failed to take one of them (the shard is poisoned then, and the
    /// commit's outcome is left to the restart, which replays the part).
    /// With `undurable_lsn` (the part's LSN, not durable yet: early lock
    /// release under `sync`), reads of the written keys wait for it.
    pub(crate) fn apply_txn_writes(
        &self,
        writes: &[crate::txn::record::TxnWrite],
        lsn: u64,
        undurable_lsn: Option<u64>,
    ) -> Result<(), ()> {
        let mut st = self.state.borrow_mut();
        if let Some(lsn) = undurable_lsn {
            let durable = self.wal.durable_lsn();
            if durable >= st.txn_undurable_max {
                st.txn_undurable.clear();
            } else if st.txn_undurable.len() >= 4096 {
                st.txn_undurable.retain(|_, l| *l > durable);
            }
            st.txn_undurable_max = st.txn_undurable_max.max(lsn);
        }
        for w in writes {
            let hash = st.table_hasher.hash_key(&w.key);
            st.write_marks.bump(hash);
            if let Some(lsn) = undurable_lsn {
                st.txn_undurable.insert(hash, lsn);
            }
            match &w.value {
                Some(v) => {
                    st.tier.put(hash, &w.key, v, lsn);
                }
                None => {
                    st.tier.delete_blind(hash, &w.key, lsn);
                }
            }
        }
        self.stats.keys.store(st.tier.len(), Relaxed);
        st.used_bytes = st.tier.memory_bytes();
        self.stats.memory_bytes.store(st.used_bytes, Relaxed);
        drop(st);
        if self.check_tier_fault() {
            return Err(());
        }
        Ok(())
    }

    /// Waits until `lsn` is durable. Err if the shard is poisoned first.
    pub(crate) async fn wait_durable(&self, lsn: u64) -> Result<(), ()> {
        self.wal.wait_durable(lsn).await
    }
}

/// The error for a read of `key` that found nothing, if the tier could
/// not read a record that may have been the key's.
fn unreadable_error(
    errors: &[(bytes::Bytes, String)],
    key: &[u8],
    absent: bool,
    shard: usize,
) -> Option<OpError> {
    if !absent || errors.is_empty() {
        return None;
    }
    errors
        .iter()
        .find(|(k, _)| k.as_ref() == key)
        .map(|(_, reason)| OpError::ValueUnreadable {
            shard,
            reason: reason.clone(),
        })
}
