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
use crate::hash::fnv1a64;
use crate::metrics::ShardStats;
use crate::shard::notify::Notify;
use crate::tier::{ColdGet, Tier};
use crate::txn::watch::{KeyMark, WriteMarks};
use crate::wal::format::{record_size, record_size_expiring, RecordKind};
use crate::wal::writer::{Reserve, SealedFlush, WalAppender};
use futures::channel::oneshot;
use std::cell::RefCell;
use std::collections::VecDeque;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use tunables::Durability;

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

/// Which answers of a batch belong to writes (they turn into `Poisoned`
/// if the shard is poisoned before their flush is durable).
#[derive(Debug)]
pub(crate) enum WriteSet {
    None,
    All,
    Some(Vec<u32>),
}

impl WriteSet {
    /// Records whether the answer at `index` (answers are pushed in order)
    /// belongs to a write.
    fn mark(&mut self, index: usize, is_write: bool) {
        match (&mut *self, is_write) {
            (WriteSet::None, true) if index == 0 => *self = WriteSet::All,
            (WriteSet::None, true) => *self = WriteSet::Some(vec![index as u32]),
            (WriteSet::All, false) => *self = WriteSet::Some((0..index as u32).collect()),
            (WriteSet::Some(v), true) => v.push(index as u32),
            _ => {}
        }
    }

    fn poison(&self, results: &mut [OpResult], shard: usize) {
        let err = || OpResult::Err(OpError::Poisoned { shard });
        match self {
            WriteSet::None => {}
            WriteSet::All => results.iter_mut().for_each(|r| *r = err()),
            WriteSet::Some(v) => v.iter().for_each(|&i| results[i as usize] = err()),
        }
    }
}

/// The outcome of applying a batch, before it is answered.
#[derive(Debug)]
pub(crate) struct Applied {
    pub(crate) results: Vec<OpResult>,
    /// LSN that must be durable before the answer (sync mode with writes).
    pub(crate) wait_lsn: Option<u64>,
    pub(crate) writes: WriteSet,
}

struct Pending {
    lsn: u64,
    applied: Applied,
    reply: oneshot::Sender<Vec<OpResult>>,
}

struct CoreState {
    tier: Box<dyn Tier>,
    last_lsn: u64,
    /// LSN of the newest plain write applied to the tier (transaction parts
    /// reach the tier only once durable, so they never count here).
    plain_write_lsn: u64,
    durable_lsn: u64,
    poisoned: bool,
    wal: Option<WalAppender>,
    pending: VecDeque<Pending>,
    wal_bytes_since_checkpoint: u64,
    writes_since_checkpoint: u64,
    /// Bumped with every change of a key in the tier (WATCH).
    write_marks: WriteMarks,
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
}

/// One shard's state and the notifications between its tasks.
pub(crate) struct ShardCore {
    pub(crate) settings: CoreSettings,
    /// Locks and transaction parts of this shard.
    pub(crate) txn: crate::txn::shard::TxnShard,
    pub(crate) stats: Arc<ShardStats>,
    pub(crate) clock: Arc<CommitClock>,
    state: RefCell<CoreState>,
    /// WAL bytes after which a checkpoint is due: the configured
    /// `checkpoint_wal_bytes`, or the size of the last snapshot if larger
    /// (a checkpoint never costs more than the log it replaces; like Redis's
    /// `auto-aof-rewrite-percentage 100`).
    checkpoint_threshold: std::cell::Cell<u64>,
    /// The flusher waits on this for records or a flush request.
    pub(crate) flush_wanted: Notify,
    /// Appenders wait on this for buffer space (or poisoning).
    pub(crate) space_freed: Notify,
    /// The segment creator waits on this (the appender moved to a new segment).
    pub(crate) segment_rolled: Notify,
    /// The checkpointer waits on this.
    pub(crate) checkpoint_wanted: Notify,
    /// Durable LSN moved (or the shard got poisoned).
    pub(crate) durable_advanced: Notify,
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

impl ShardCore {
    pub(crate) fn new(
        settings: CoreSettings,
        tier: Box<dyn Tier>,
        last_lsn: u64,
        wal: Option<WalAppender>,
        stats: Arc<ShardStats>,
        clock: Arc<CommitClock>,
        txn: crate::txn::shard::TxnShard,
    ) -> ShardCore {
        assert_eq!(wal.is_some(), settings.durability != Durability::None);
        stats.current_lsn.store(last_lsn, Relaxed);
        stats.durable_lsn.store(last_lsn, Relaxed);
        stats.keys.store(tier.len(), Relaxed);
        stats.memory_bytes.store(tier.memory_bytes(), Relaxed);
        ShardCore {
            settings,
            txn,
            stats,
            clock,
            state: RefCell::new(CoreState {
                tier,
                last_lsn,
                plain_write_lsn: last_lsn,
                durable_lsn: last_lsn,
                poisoned: false,
                wal,
                pending: VecDeque::new(),
                wal_bytes_since_checkpoint: 0,
                writes_since_checkpoint: 0,
                write_marks: WriteMarks::new(),
            }),
            checkpoint_threshold: std::cell::Cell::new(settings.checkpoint_wal_bytes),
            flush_wanted: Notify::new(),
            space_freed: Notify::new(),
            segment_rolled: Notify::new(),
            checkpoint_wanted: Notify::new(),
            durable_advanced: Notify::new(),
        }
    }

    pub(crate) fn is_poisoned(&self) -> bool {
        self.state.borrow().poisoned
    }

    pub(crate) fn last_lsn(&self) -> u64 {
        self.state.borrow().last_lsn
    }

    /// Segment the open WAL buffer belongs to (0 without a WAL).
    pub(crate) fn open_segment_seq(&self) -> u64 {
        self.state.borrow().wal.as_ref().map_or(0, |w| w.open_seq())
    }

    /// (open buffer has records, a flush was requested, the buffer passed its threshold)
    pub(crate) fn flush_state(&self) -> (bool, bool, bool) {
        let st = self.state.borrow();
        match &st.wal {
            Some(w) => (
                w.has_records(),
                w.flush_requested,
                w.open_bytes() >= w.flush_threshold() / 2,
            ),
            None => (false, false, false),
        }
    }

    /// Runs `f` on the tier (reads from a checkpoint or a key scan), with
    /// the tier's clock set to now (expired keys are not visited).
    pub(crate) fn with_tier<R>(&self, f: impl FnOnce(&dyn Tier) -> R) -> R {
        let mut st = self.state.borrow_mut();
        st.tier.set_now_ms(now_ms());
        f(&*st.tier)
    }

    /// (WAL bytes, writes) since the last checkpoint.
    pub(crate) fn since_checkpoint(&self) -> (u64, u64) {
        let st = self.state.borrow();
        (st.wal_bytes_since_checkpoint, st.writes_since_checkpoint)
    }

    /// WAL bytes after which the next checkpoint is due.
    pub(crate) fn checkpoint_threshold(&self) -> u64 {
        self.checkpoint_threshold.get()
    }

    /// A snapshot of `snapshot_bytes` was written: checkpoint again once
    /// the WAL has grown by at least as much.
    pub(crate) fn checkpoint_written(&self, snapshot_bytes: u64) {
        self.checkpoint_threshold
            .set(self.settings.checkpoint_wal_bytes.max(snapshot_bytes));
    }

    /// Recovery replayed `bytes` of WAL holding `records` records after the
    /// newest snapshot: they count toward the next checkpoint as if this
    /// process had written them (a server that restarts often must still
    /// checkpoint).
    pub(crate) fn carry_over(&self, bytes: u64, records: u64) {
        let mut st = self.state.borrow_mut();
        st.wal_bytes_since_checkpoint = bytes;
        st.writes_since_checkpoint = records;
    }

    /// A checkpoint starts: count from zero again.
    pub(crate) fn checkpoint_started(&self) {
        let mut st = self.state.borrow_mut();
        st.wal_bytes_since_checkpoint = 0;
        st.writes_since_checkpoint = 0;
    }

    /// A write of the tier's own files failed: poison the shard (the WAL
    /// keeps everything acknowledged; a restart recovers it).
    fn check_tier_fault(&self) {
        let fault = self.state.borrow_mut().tier.take_fault();
        if let Some(fault) = fault {
            self.poison_with(&fault);
        }
    }

    /// Copies the tier's own counters into the shard's metrics.
    pub(crate) fn publish_tier_stats(&self) {
        let stats = self.state.borrow().tier.hybrid_stats();
        if stats.is_some() {
            *self.stats.hybrid.lock().unwrap_or_else(|p| p.into_inner()) = stats;
        }
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
    #[allow(clippy::too_many_arguments)]
    fn apply_some(
        &self,
        ops: &mut std::iter::Peekable<std::vec::IntoIter<Op>>,
        results: &mut Vec<OpResult>,
        writes: &mut WriteSet,
        had_write: &mut bool,
        counts: &mut Counts,
        read_left: &mut usize,
        cold: &mut Vec<ColdGet>,
    ) -> bool {
        let shard = self.settings.shard;
        let mut st = self.state.borrow_mut();
        let st = &mut *st;
        let mut version = 0u64;
        let mut appended = false;
        let mut rolled = false;
        // One clock reading per step: every operation of the step sees the
        // same keys as expired.
        let now = now_ms();
        st.tier.set_now_ms(now);
        let done = loop {
            let Some(op) = ops.peek() else {
                break true;
            };
            let index = results.len();
            match op {
                Op::Get { .. } => {
                    // A run of consecutive GETs goes to the tier in one
                    // call, so it can overlap their memory accesses. No
                    // write sits inside the run, so each GET still sees
                    // every write before it in the batch, and none after.
                    let mut keys = Vec::new();
                    while let Some(Op::Get { key }) = ops.next_if(|op| matches!(op, Op::Get { .. }))
                    {
                        keys.push(key);
                    }
                    let hashes: Vec<u64> = keys.iter().map(|key| fnv1a64(key)).collect();
                    counts.get += keys.len() as u64;
                    // Values are copied only while the batch's read
                    // budget lasts; later GETs are answered
                    // `ReadLimitReached` without a copy. Keys whose
                    // records must come from a device are answered once
                    // `apply` has read them (placeholders until then).
                    let mut found = Vec::with_capacity(keys.len());
                    let cold_from = cold.len();
                    let answered = st
                        .tier
                        .get_many_split(&hashes, &keys, &mut found, read_left, cold);
                    for g in &mut cold[cold_from..] {
                        g.index += index;
                    }
                    assert_eq!(found.len(), answered, "one answer per GET answered");
                    let unreadable = st.tier.take_read_errors();
                    let found =
                        found.into_iter().enumerate().map(|(i, v)| {
                            match unreadable_error(&unreadable, &keys[i], v.is_none(), shard) {
                                Some(e) => Some(Err(e)),
                                None => v.map(Ok),
                            }
                        });
                    let max = self.settings.read_bytes_max;
                    let values = found.chain(
                        (answered..keys.len())
                            .map(|_| Some(Err(OpError::ReadLimitReached { shard, max }))),
                    );
                    for (offset, value) in values.into_iter().enumerate() {
                        writes.mark(index + offset, false);
                        results.push(match value {
                            Some(Ok(v)) => OpResult::Value(v),
                            Some(Err(e)) => {
                                counts.failed += 1;
                                OpResult::Err(e)
                            }
                            None => OpResult::NotFound,
                        });
                    }
                    // The run is consumed already.
                    continue;
                }
                Op::Put { .. } | Op::Delete { .. } | Op::Update { .. } | Op::UpdateTtl { .. }
                    if st.poisoned =>
                {
                    writes.mark(index, true);
                    *had_write = true;
                    match op {
                        Op::Put { .. } | Op::Update { .. } | Op::UpdateTtl { .. } => {
                            counts.put += 1
                        }
                        _ => counts.delete += 1,
                    }
                    counts.failed += 1;
                    results.push(OpResult::Err(OpError::Poisoned { shard }));
                }
                Op::Put { key, .. }
                | Op::Delete { key }
                | Op::Update { key, .. }
                | Op::UpdateTtl { key, .. }
                    if self.txn.is_locked(key) =>
                {
                    // A transaction holds the key: refusing keeps both
                    // updates (the caller retries after the commit). A
                    // read-modify-write is refused too: applied now, it
                    // would be overwritten by the transaction's commit.
                    counts.failed += 1;
                    results.push(OpResult::Err(OpError::Locked { shard }));
                }
                Op::Put { key, value } => {
                    let hash = fnv1a64(key);
                    if let Some(wal) = &mut st.wal {
                        let size = record_size(key.len(), value.len());
                        assert!(
                            size <= self.settings.max_record_bytes,
                            "limits are checked before the shard"
                        );
                        let (reserve, moved) = wal.reserve(size);
                        rolled |= moved;
                        if reserve == Reserve::Full {
                            wal.flush_requested = true;
                            break false;
                        }
                        if version == 0 {
                            version = self.clock.next();
                        }
                        st.last_lsn += 1;
                        wal.append(st.last_lsn, version, RecordKind::Put, key, value);
                        appended = true;
                        counts.records += 1;
                    }
                    st.tier.put(hash, key, value);
                    st.write_marks.bump(hash);
                    writes.mark(index, true);
                    *had_write = true;
                    counts.put += 1;
                    results.push(OpResult::Ok);
                }
                Op::Update { .. } | Op::UpdateTtl { .. } => {
                    let key = op.key();
                    let hash = fnv1a64(key);
                    let current = st.tier.get_expiring(hash, key);
                    let unreadable = st.tier.take_read_errors();
                    if let Some(e) = unreadable_error(&unreadable, key, current.is_none(), shard) {
                        // The current value is unknown: nothing is written.
                        writes.mark(index, true);
                        *had_write = true;
                        counts.put += 1;
                        counts.failed += 1;
                        results.push(OpResult::Err(e));
                        ops.next();
                        continue;
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
                        _ => unreachable!("matched above"),
                    };
                    // What to write: (value, expiry), or delete the key.
                    let (write, expiry) = match &outcome.write {
                        UpdateWrite::Keep => (UpdateWrite::Keep, None),
                        UpdateWrite::Put(v) => (UpdateWrite::Put(v.clone()), current_expiry),
                        UpdateWrite::PutExpiring(v, at) => (UpdateWrite::Put(v.clone()), *at),
                        UpdateWrite::SetExpiry(at) => match current_value {
                            Some(v) => (UpdateWrite::Put(v), *at),
                            None => (UpdateWrite::Keep, None),
                        },
                        UpdateWrite::Delete => (UpdateWrite::Delete, None),
                    };
                    let write = match write {
                        // An expiry time already passed: the key goes.
                        UpdateWrite::Put(_) if expiry.is_some_and(|at| at <= now) => {
                            UpdateWrite::Delete
                        }
                        w => w,
                    };
                    let (kind, value) = match &write {
                        UpdateWrite::Keep
                        | UpdateWrite::PutExpiring(..)
                        | UpdateWrite::SetExpiry(_) => (None, None),
                        UpdateWrite::Put(v) if v.len() > self.settings.value_bytes_max => {
                            writes.mark(index, true);
                            *had_write = true;
                            counts.put += 1;
                            counts.failed += 1;
                            results.push(OpResult::Err(OpError::ValueTooLarge {
                                len: v.len(),
                                max: self.settings.value_bytes_max,
                            }));
                            ops.next();
                            continue;
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
                    if let (Some(kind), Some(wal)) = (kind, &mut st.wal) {
                        let payload: &[u8] = value.map_or(b"", |v| v);
                        let size = record_size_expiring(key.len(), payload.len(), expiry);
                        let (reserve, moved) = wal.reserve(size);
                        rolled |= moved;
                        if reserve == Reserve::Full {
                            // Nothing was applied: the update runs again,
                            // on the same state, once there is room.
                            wal.flush_requested = true;
                            break false;
                        }
                        if version == 0 {
                            version = self.clock.next();
                        }
                        st.last_lsn += 1;
                        wal.append_expiring(st.last_lsn, version, kind, key, payload, expiry);
                        appended = true;
                        counts.records += 1;
                    }
                    if kind.is_some() {
                        st.write_marks.bump(hash);
                    }
                    match (kind, value) {
                        (Some(RecordKind::Put), Some(v)) => {
                            st.tier.put_expiring(hash, key, v, expiry);
                        }
                        (Some(_), _) => {
                            if !st.tier.contains(hash, key) {
                                counts.expired += 1;
                            }
                            st.tier.delete(hash, key);
                        }
                        (None, _) => {}
                    }
                    writes.mark(index, true);
                    *had_write = true;
                    counts.put += 1;
                    results.push(OpResult::Updated(outcome.answer));
                }
                Op::Delete { key } => {
                    let hash = fnv1a64(key);
                    // An expired entry is deleted (and logged) like a live
                    // one, but answers NotFound, as Redis's DEL does.
                    let live = st.tier.contains(hash, key);
                    let any = st.tier.contains_any(hash, key);
                    let unreadable = st.tier.take_read_errors();
                    if let Some(e) = unreadable_error(&unreadable, key, !any, shard) {
                        writes.mark(index, true);
                        *had_write = true;
                        counts.delete += 1;
                        counts.failed += 1;
                        results.push(OpResult::Err(e));
                        ops.next();
                        continue;
                    }
                    if any {
                        if let Some(wal) = &mut st.wal {
                            let size = record_size(key.len(), 0);
                            let (reserve, moved) = wal.reserve(size);
                            rolled |= moved;
                            if reserve == Reserve::Full {
                                wal.flush_requested = true;
                                break false;
                            }
                            if version == 0 {
                                version = self.clock.next();
                            }
                            st.last_lsn += 1;
                            wal.append(st.last_lsn, version, RecordKind::Delete, key, b"");
                            appended = true;
                            counts.records += 1;
                        }
                        st.tier.delete(hash, key);
                        st.write_marks.bump(hash);
                        if live {
                            results.push(OpResult::Ok);
                        } else {
                            counts.expired += 1;
                            results.push(OpResult::NotFound);
                        }
                    } else {
                        // Nothing to log, but in sync mode the answer still
                        // waits for everything logged before it.
                        results.push(OpResult::NotFound);
                    }
                    writes.mark(index, true);
                    *had_write = true;
                    counts.delete += 1;
                }
            }
            ops.next();
        };
        if appended {
            st.plain_write_lsn = st.last_lsn;
            st.writes_since_checkpoint += 1;
            self.stats.current_lsn.store(st.last_lsn, Relaxed);
        }
        let wake_flusher = appended || !done;
        let keys = st.tier.len();
        let memory = st.tier.memory_bytes();
        self.stats
            .expiring_keys
            .store(st.tier.expiring_count(), Relaxed);
        // Notifications only schedule other tasks; no borrow is re-entered.
        self.stats.keys.store(keys, Relaxed);
        self.stats.memory_bytes.store(memory, Relaxed);
        if wake_flusher {
            self.flush_wanted.notify();
        }
        if rolled {
            self.segment_rolled.notify();
        }
        done
    }

    /// Applies a batch to the tier and the WAL buffer, waiting for buffer
    /// space when it is full (back-pressure) and for the device reads of
    /// GETs the tier could not answer from RAM (other batches run
    /// meanwhile; the GETs' answers are those of their place in this
    /// batch); does not wait for durability.
    pub(crate) async fn apply(&self, ops: Vec<Op>) -> Applied {
        let mut results = Vec::with_capacity(ops.len());
        let mut writes = WriteSet::None;
        let mut had_write = false;
        let mut counts = Counts::default();
        let mut read_left = self.settings.read_bytes_max;
        let mut cold = Vec::new();
        let mut ops = ops.into_iter().peekable();
        loop {
            let space = self.space_freed.notified();
            let all = self.apply_some(
                &mut ops,
                &mut results,
                &mut writes,
                &mut had_write,
                &mut counts,
                &mut read_left,
                &mut cold,
            );
            self.check_tier_fault();
            if all {
                break;
            }
            space.await;
        }
        // What this batch logged (read before other batches run during the
        // cold reads below).
        let applied_lsn = self.state.borrow().last_lsn;
        if !cold.is_empty() {
            self.answer_cold(cold, &mut results, &mut counts).await;
        }
        let s = &self.stats;
        s.ops_get.fetch_add(counts.get, Relaxed);
        s.ops_put.fetch_add(counts.put, Relaxed);
        s.ops_delete.fetch_add(counts.delete, Relaxed);
        if counts.failed > 0 {
            s.ops_failed.fetch_add(counts.failed, Relaxed);
        }
        if counts.records > 0 {
            s.wal_records.fetch_add(counts.records, Relaxed);
        }
        if counts.expired > 0 {
            s.expired_keys.fetch_add(counts.expired, Relaxed);
        }
        let wait_lsn =
            (had_write && self.settings.durability == Durability::Sync).then_some(applied_lsn);
        Applied {
            results,
            wait_lsn,
            writes,
        }
    }

    /// Reads the records of a batch's cold GETs (all at once; the shard
    /// serves other requests meanwhile) and puts their answers in place.
    /// Then applies the batch's read budget again over every value in
    /// order, now that the cold ones' sizes are known.
    async fn answer_cold(
        &self,
        mut cold: Vec<ColdGet>,
        results: &mut [OpResult],
        counts: &mut Counts,
    ) {
        let shard = self.settings.shard;
        let mut answers = Vec::with_capacity(cold.len());
        while !cold.is_empty() {
            let fetch = self.state.borrow().tier.fetch_cold(cold);
            let read = fetch.await;
            let mut again = Vec::new();
            self.state
                .borrow()
                .tier
                .finish_cold(read, &mut answers, &mut again);
            cold = again;
        }
        for (i, answer) in answers {
            results[i] = match answer {
                Ok(Some(v)) => OpResult::Value(v),
                Ok(None) => OpResult::NotFound,
                Err(reason) => {
                    counts.failed += 1;
                    OpResult::Err(OpError::ValueUnreadable { shard, reason })
                }
            };
        }
        let max = self.settings.read_bytes_max;
        let mut left = max;
        for r in results.iter_mut() {
            if let OpResult::Value(v) = r {
                if left == 0 {
                    counts.failed += 1;
                    *r = OpResult::Err(OpError::ReadLimitReached { shard, max });
                } else {
                    left = left.saturating_sub(v.len());
                }
            }
        }
    }

    /// Answers an applied batch now, or queues the answer until the LSN it
    /// waits for is durable.
    pub(crate) fn complete(&self, mut applied: Applied, reply: oneshot::Sender<Vec<OpResult>>) {
        let Some(lsn) = applied.wait_lsn else {
            let _ = reply.send(applied.results);
            return;
        };
        let mut st = self.state.borrow_mut();
        if st.durable_lsn >= lsn {
            drop(st);
            let _ = reply.send(applied.results);
        } else if st.poisoned {
            drop(st);
            applied
                .writes
                .poison(&mut applied.results, self.settings.shard);
            let _ = reply.send(applied.results);
        } else {
            st.pending.push_back(Pending {
                lsn,
                applied,
                reply,
            });
        }
    }

    /// Applies a batch and waits for its answer (the inline path of a
    /// caller running on this shard's thread).
    pub(crate) async fn execute(&self, ops: Vec<Op>) -> Vec<OpResult> {
        let n = ops.len();
        let applied = self.apply(ops).await;
        let (tx, rx) = oneshot::channel();
        self.complete(applied, tx);
        match rx.await {
            Ok(results) => results,
            Err(_) => (0..n)
                .map(|_| OpResult::Err(OpError::ShuttingDown))
                .collect(),
        }
    }

    /// The flusher takes the open buffer (sealed). Wakes blocked appenders.
    pub(crate) fn take_flush(&self) -> Option<SealedFlush> {
        let sealed = self.state.borrow_mut().wal.as_mut().and_then(|w| w.take());
        if sealed.is_some() {
            self.space_freed.notify();
        }
        sealed
    }

    /// A flush is durable: acknowledge everything it covers.
    pub(crate) fn flush_complete(
        &self,
        last_lsn: u64,
        buf: crate::io::AlignedBuf,
        bytes: u64,
        records: u64,
        sync_us: u64,
        live_wal_bytes: u64,
    ) {
        let mut ready = Vec::new();
        let checkpoint_due;
        {
            let mut st = self.state.borrow_mut();
            assert!(last_lsn > st.durable_lsn, "durable LSN only grows");
            st.durable_lsn = last_lsn;
            if let Some(w) = st.wal.as_mut() {
                w.give_back(buf);
            }
            while st.pending.front().is_some_and(|p| p.lsn <= last_lsn) {
                if let Some(p) = st.pending.pop_front() {
                    ready.push(p);
                }
            }
            st.wal_bytes_since_checkpoint += bytes;
            checkpoint_due = st.wal_bytes_since_checkpoint >= self.checkpoint_threshold.get();
        }
        let s = &self.stats;
        s.durable_lsn.store(last_lsn, Relaxed);
        s.wal_flushes.fetch_add(1, Relaxed);
        s.wal_bytes_written.fetch_add(bytes, Relaxed);
        s.group_commit_records.record(records);
        s.group_commit_bytes.record(bytes);
        s.fdatasync_latency_us.record(sync_us);
        s.wal_live_bytes.store(live_wal_bytes, Relaxed);
        for p in ready {
            let _ = p.reply.send(p.applied.results);
        }
        // A flush just returned its buffer: appenders may go on.
        self.space_freed.notify();
        self.durable_advanced.notify();
        if checkpoint_due {
            self.checkpoint_wanted.notify();
        }
    }

    /// A WAL write or fdatasync failed: no more writes on this shard.
    pub(crate) fn poison(&self, what: &str, file: &Path, offset: u64, err: &std::io::Error) {
        tracing::error!(
            shard = self.settings.shard,
            file = %file.display(),
            offset,
            error = %err,
            "WAL {what} failed: shard poisoned, it accepts no writes until restart (the fdatasync is never retried; restart recovers from what is on disk)"
        );
        self.poison_pending();
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
        let pending: Vec<Pending> = {
            let mut st = self.state.borrow_mut();
            st.poisoned = true;
            st.pending.drain(..).collect()
        };
        self.stats.poisoned.store(true, Relaxed);
        for mut p in pending {
            p.applied
                .writes
                .poison(&mut p.applied.results, self.settings.shard);
            let _ = p.reply.send(p.applied.results);
        }
        self.space_freed.notify();
        self.durable_advanced.notify();
        self.flush_wanted.notify();
        self.checkpoint_wanted.notify();
    }

    /// The shard thread is ending without answering what waits: drop the
    /// waiting answers so their callers see `ShuttingDown` instead of
    /// waiting forever.
    pub(crate) fn abandon(&self) {
        let pending: Vec<Pending> = self.state.borrow_mut().pending.drain(..).collect();
        drop(pending);
    }

    /// Asks the flusher to write the open buffer now.
    pub(crate) fn request_flush(&self) {
        if let Some(w) = self.state.borrow_mut().wal.as_mut() {
            w.flush_requested = true;
        }
        self.flush_wanted.notify();
    }

    /// The committed value of `key` in the tier.
    pub(crate) fn read_tier(&self, key: &[u8]) -> Result<Option<bytes::Bytes>, OpError> {
        let mut st = self.state.borrow_mut();
        // A key whose expiry time passed since the last step is absent.
        st.tier.set_now_ms(now_ms());
        let value = st.tier.get(fnv1a64(key), key);
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
                let hash = fnv1a64(key);
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
        (self.settings.durability == Durability::Sync && st.durable_lsn < st.plain_write_lsn)
            .then_some(st.plain_write_lsn)
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
            let space = self.space_freed.notified();
            let logged = {
                let mut guard = self.state.borrow_mut();
                let st = &mut *guard;
                if st.poisoned {
                    return Err(());
                }
                let Some(wal) = &mut st.wal else {
                    return Ok(None);
                };
                let (reserve, rolled) = wal.reserve(size);
                if reserve == Reserve::Full {
                    wal.flush_requested = true;
                    None
                } else {
                    let version = self.clock.next();
                    st.last_lsn += 1;
                    wal.append(st.last_lsn, version, RecordKind::TxnPart, header, body);
                    st.writes_since_checkpoint += 1;
                    Some((st.last_lsn, rolled))
                }
            };
            if let Some((lsn, rolled)) = logged {
                self.stats.wal_records.fetch_add(1, Relaxed);
                self.stats.current_lsn.store(lsn, Relaxed);
                if rolled {
                    self.segment_rolled.notify();
                }
                self.flush_wanted.notify();
                return Ok(Some(lsn));
            }
            self.flush_wanted.notify();
            space.await;
        }
    }

    /// Applies a committed transaction's writes on this shard to the tier.
    pub(crate) fn apply_txn_writes(&self, writes: &[crate::txn::record::TxnWrite]) {
        let mut st = self.state.borrow_mut();
        for w in writes {
            let hash = fnv1a64(&w.key);
            st.write_marks.bump(hash);
            match &w.value {
                Some(v) => {
                    st.tier.put(hash, &w.key, v);
                }
                None => {
                    st.tier.delete(hash, &w.key);
                }
            }
        }
        self.stats.keys.store(st.tier.len(), Relaxed);
        self.stats
            .memory_bytes
            .store(st.tier.memory_bytes(), Relaxed);
        drop(st);
        self.check_tier_fault();
    }

    /// Waits until `lsn` is durable. Err if the shard is poisoned first.
    pub(crate) async fn wait_durable(&self, lsn: u64) -> Result<(), ()> {
        loop {
            let advanced = self.durable_advanced.notified();
            {
                let st = self.state.borrow();
                if st.durable_lsn >= lsn {
                    return Ok(());
                }
                if st.poisoned {
                    return Err(());
                }
            }
            self.request_flush();
            advanced.await;
        }
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
