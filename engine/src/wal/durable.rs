//! One shard's WAL as the shard uses it: [`Wal`] owns the durability
//! state ([`WalState`]: the append buffer, the last and the durable LSN,
//! the answers waiting for durability, poisoning), the wake-ups between
//! the appenders, the flusher and the segment creator, and the counter
//! that tells the checkpointer when a checkpoint is due. It knows nothing
//! of tiers or operations: callers hand it records and applied batches
//! ([`Applied`]), and the flusher ([`crate::wal::flusher`]) hands back
//! finished flushes. [`WalState`] is the plain bookkeeping under it, with
//! no tasks and no I/O, so its rules are testable on their own.
//!
//! What must hold: LSNs grow by one per logged record; an answer queued
//! for LSN `n` is sent only once a flush through `n` is durable (or the
//! state is poisoned), and queued answers leave in the order they came;
//! once poisoned, nothing more is logged and every write answer still
//! waiting, or completed later without being durable, fails.

use crate::api::{OpError, OpResult};
use crate::io::AlignedBuf;
use crate::mesh::Reply;
use crate::metrics::ShardStats;
use crate::notify::Notify;
use crate::wal::format::{chain_end_size, record_size_expiring, RecordKind};
use crate::wal::writer::{Reserve, SealedFlush, WalAppender};
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::path::Path;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

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
    pub(crate) fn mark(&mut self, index: usize, is_write: bool) {
        match (&mut *self, is_write) {
            (WriteSet::None, true) if index == 0 => *self = WriteSet::All,
            (WriteSet::None, true) => *self = WriteSet::Some(vec![index as u32]),
            (WriteSet::All, false) => *self = WriteSet::Some((0..index as u32).collect()),
            (WriteSet::Some(v), true) => v.push(index as u32),
            _ => {}
        }
    }

    pub(crate) fn poison(&self, results: &mut [OpResult], shard: usize) {
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

/// The answer to a batch, ready to go to its caller.
pub(crate) struct Answer {
    results: Vec<OpResult>,
    reply: Reply,
}

impl Answer {
    /// Sends the answer; a caller that stopped waiting is no error.
    pub(crate) fn send(self) {
        self.reply.send(self.results);
    }
}

/// An answer waiting for its LSN to be durable.
pub(crate) struct Pending {
    lsn: u64,
    applied: Applied,
    reply: Reply,
}

impl Pending {
    fn answer(self) -> Answer {
        Answer {
            results: self.applied.results,
            reply: self.reply,
        }
    }

    /// The answer with every write in it turned into `Poisoned`.
    fn fail(mut self, shard: usize) -> Answer {
        self.applied.writes.poison(&mut self.applied.results, shard);
        self.answer()
    }
}

/// What [`WalState::append`] did with a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Append {
    /// Logged at `lsn`; `rolled`: the appender moved to a new segment for
    /// it (the segment creator has work).
    Logged { lsn: u64, rolled: bool },
    /// No WAL (durability `none`): nothing is logged, no LSN is used.
    NoWal,
    /// The open buffer is full: nothing was logged and a flush is
    /// requested; try again once the flusher frees space.
    Full,
    /// The shard is poisoned: nothing is logged any more.
    Poisoned,
}

/// The durability state of one shard's WAL.
pub(crate) struct WalState {
    /// Shard index, for the `Poisoned` answers.
    shard: usize,
    /// `None` without a WAL (durability `none`).
    appender: Option<WalAppender>,
    /// LSN of the newest record logged.
    last_lsn: u64,
    /// LSN through which the log is on disk.
    durable_lsn: u64,
    poisoned: bool,
    /// Answers waiting for durability, in LSN order (batches are applied,
    /// and so completed, in LSN order).
    pending: VecDeque<Pending>,
    /// The chunk chain being logged, if any: no other record is logged
    /// until its end record is (recovery needs a chain's records
    /// consecutive).
    chain: Option<OpenChain>,
}

/// A value being logged as a chunk chain across flushes.
#[derive(Debug, Clone, Copy)]
struct OpenChain {
    first_lsn: u64,
    /// Value bytes in chunks so far.
    written: usize,
    commit_version: u64,
    /// The value's length and key's length, to check that the same write
    /// continues the chain.
    value_len: usize,
    key_len: usize,
}

impl WalState {
    /// The state after recovery: everything up to `last_lsn` is durable.
    pub(crate) fn new(shard: usize, last_lsn: u64, appender: Option<WalAppender>) -> WalState {
        WalState {
            shard,
            appender,
            last_lsn,
            durable_lsn: last_lsn,
            poisoned: false,
            pending: VecDeque::new(),
            chain: None,
        }
    }

    /// The LSN of the first chunk of a chain still being logged.
    pub(crate) fn open_chain_first_lsn(&self) -> Option<u64> {
        self.chain.map(|c| c.first_lsn)
    }

    /// Whether a Put of this size is logged as a chunk chain: its record
    /// would not fit an empty flush buffer.
    pub(crate) fn needs_chain(&self, key_len: usize, value_len: usize, at: Option<u64>) -> bool {
        self.appender
            .as_ref()
            .is_some_and(|w| !w.holds(record_size_expiring(key_len, value_len, at)))
    }

    pub(crate) fn last_lsn(&self) -> u64 {
        self.last_lsn
    }

    pub(crate) fn durable_lsn(&self) -> u64 {
        self.durable_lsn
    }

    pub(crate) fn is_poisoned(&self) -> bool {
        self.poisoned
    }

    /// Segment the open buffer belongs to (0 without a WAL).
    pub(crate) fn open_segment_seq(&self) -> u64 {
        self.appender.as_ref().map_or(0, |w| w.open_seq())
    }

    /// (open buffer has records, a flush was requested, the buffer passed
    /// half its threshold)
    pub(crate) fn flush_state(&self) -> (bool, bool, bool) {
        match &self.appender {
            Some(w) => (
                w.has_records(),
                w.flush_requested,
                w.open_bytes() >= w.flush_threshold() / 2,
            ),
            None => (false, false, false),
        }
    }

    /// Logs one record at the next LSN. `version` is asked for the commit
    /// version only once the record fits, so a step that waits for space
    /// takes no version from the clock.
    pub(crate) fn append(
        &mut self,
        kind: RecordKind,
        key: &[u8],
        value: &[u8],
        expires_at_ms: Option<u64>,
        version: impl FnOnce() -> u64,
    ) -> Append {
        if self.poisoned {
            return Append::Poisoned;
        }
        let Some(wal) = &mut self.appender else {
            return Append::NoWal;
        };
        if self.chain.is_some() {
            return Append::Full;
        }
        let (reserve, rolled) =
            wal.reserve(record_size_expiring(key.len(), value.len(), expires_at_ms));
        if reserve == Reserve::Full {
            wal.flush_requested = true;
            return Append::Full;
        }
        let version = version();
        self.last_lsn += 1;
        wal.append_expiring(self.last_lsn, version, kind, key, value, expires_at_ms);
        Append::Logged {
            lsn: self.last_lsn,
            rolled,
        }
    }

    /// Logs a Put too large for one flush buffer as a chunk chain, going
    /// on where an earlier call stopped: chunks as long as the open buffer
    /// has room, then the end record. `Full` when the buffer must be
    /// flushed first (call again with the same write once space is
    /// freed); `Logged` with the end record's LSN once the chain is whole.
    /// The second value says whether the appender moved to a new segment.
    pub(crate) fn append_chained(
        &mut self,
        key: &[u8],
        value: &[u8],
        expires_at_ms: Option<u64>,
        version: impl FnOnce() -> u64,
    ) -> (Append, bool) {
        if self.poisoned {
            return (Append::Poisoned, false);
        }
        let Some(wal) = &mut self.appender else {
            return (Append::NoWal, false);
        };
        let last_lsn = self.last_lsn;
        let chain = self.chain.get_or_insert_with(|| OpenChain {
            first_lsn: last_lsn + 1,
            written: 0,
            commit_version: version(),
            value_len: value.len(),
            key_len: key.len(),
        });
        assert!(
            chain.value_len == value.len() && chain.key_len == key.len(),
            "the write that opened a chain continues it"
        );
        let mut rolled = false;
        while chain.written < value.len() {
            let (room, moved) = wal.chunk_room(value.len() - chain.written);
            rolled |= moved;
            let Some(n) = room else {
                wal.flush_requested = true;
                return (Append::Full, rolled);
            };
            self.last_lsn += 1;
            let piece = &value[chain.written..chain.written + n];
            wal.append_chunk(self.last_lsn, chain.commit_version, piece);
            chain.written += n;
        }
        let (reserve, moved) = wal.reserve(chain_end_size(key.len(), 0, expires_at_ms));
        rolled |= moved;
        if reserve == Reserve::Full {
            wal.flush_requested = true;
            return (Append::Full, rolled);
        }
        self.last_lsn += 1;
        let lsn = self.last_lsn;
        let (first_lsn, version) = (chain.first_lsn, chain.commit_version);
        wal.append_chain_end(lsn, version, key, b"", expires_at_ms, first_lsn);
        self.chain = None;
        (Append::Logged { lsn, rolled }, rolled)
    }

    /// Asks for the open buffer to be flushed now (the caller wakes the
    /// flusher).
    pub(crate) fn request_flush(&mut self) {
        if let Some(w) = &mut self.appender {
            w.flush_requested = true;
        }
    }

    /// The flusher takes the open buffer, sealed. `Some` frees buffer
    /// space: appenders waiting for it may go on.
    /// Its seal records the LSNs still in flight before it (those after
    /// the durable LSN), for recovery's in-flight window rule.
    pub(crate) fn take_flush(&mut self) -> Option<SealedFlush> {
        let durable = self.durable_lsn;
        self.appender
            .as_mut()
            .and_then(|w| w.take_after(Some(durable)))
    }

    /// Whether the next flush taken starts a segment.
    pub(crate) fn next_flush_starts_segment(&self) -> bool {
        self.appender
            .as_ref()
            .is_some_and(|w| w.next_flush_starts_segment())
    }

    /// An applied batch is done: returns its answer if it may go now
    /// (nothing to wait for, its LSN is durable already, or it fails
    /// because the shard is poisoned); otherwise queues it until a flush
    /// makes its LSN durable.
    pub(crate) fn complete(&mut self, applied: Applied, reply: Reply) -> Option<Answer> {
        let pending = match applied.wait_lsn {
            None => {
                return Some(Answer {
                    results: applied.results,
                    reply,
                })
            }
            Some(lsn) => Pending {
                lsn,
                applied,
                reply,
            },
        };
        if self.durable_lsn >= pending.lsn {
            Some(pending.answer())
        } else if self.poisoned {
            Some(pending.fail(self.shard))
        } else {
            self.pending.push_back(pending);
            None
        }
    }

    /// The flush through `last_lsn` is durable and its buffer comes back:
    /// returns the answers it releases, oldest first.
    pub(crate) fn flush_done(&mut self, last_lsn: u64, buf: AlignedBuf) -> Vec<Answer> {
        assert!(last_lsn > self.durable_lsn, "durable LSN only grows");
        debug_assert!(
            last_lsn <= self.last_lsn,
            "a flush makes durable only records that were logged"
        );
        self.durable_lsn = last_lsn;
        if let Some(w) = &mut self.appender {
            w.give_back(buf);
        }
        let mut ready = Vec::new();
        while self.pending.front().is_some_and(|p| p.lsn <= last_lsn) {
            if let Some(p) = self.pending.pop_front() {
                ready.push(p.answer());
            }
        }
        ready
    }

    /// Poisons the state: nothing more is logged. Returns every waiting
    /// answer, its writes failed with `Poisoned`.
    pub(crate) fn poison(&mut self) -> Vec<Answer> {
        self.poisoned = true;
        let shard = self.shard;
        self.pending.drain(..).map(|p| p.fail(shard)).collect()
    }

    /// The shard stops without answering: returns the waiting answers for
    /// the caller to drop, so their callers see the channel close.
    pub(crate) fn abandon(&mut self) -> Vec<Pending> {
        self.pending.drain(..).collect()
    }
}

/// Checkpoints whose run-over segments the WAL's files are sized for
/// ([`Wal::checkpoint_ran_over`]).
const RAN_OVER_KEPT: usize = 4;

/// WAL bytes and writes since the last checkpoint, and the threshold that
/// makes the next one due: the checkpointer reads and resets it, the
/// flusher adds to it.
struct CheckpointCounter {
    /// The configured `checkpoint_wal_bytes`: the threshold never goes
    /// below it.
    wal_bytes_min: u64,
    threshold: Cell<u64>,
    wal_bytes: Cell<u64>,
    writes: Cell<u64>,
    /// Segments the WAL started while each of the last checkpoints ran,
    /// the newest first.
    ran_over: Cell<[usize; RAN_OVER_KEPT]>,
}

/// One shard's write-ahead log as its tasks share it (single-threaded:
/// every task of the shard runs on its thread). See the module doc.
pub(crate) struct Wal {
    shard: usize,
    state: RefCell<WalState>,
    stats: Arc<ShardStats>,
    checkpoint: CheckpointCounter,
    /// The flusher waits on this for records or a flush request.
    pub(crate) flush_wanted: Notify,
    /// Appenders wait on this for buffer space (or poisoning). The shard
    /// also uses it for room in its tier.
    pub(crate) space_freed: Notify,
    /// The segment creator waits on this (the appender moved to a new
    /// segment).
    pub(crate) segment_rolled: Notify,
    /// The checkpointer waits on this.
    pub(crate) checkpoint_wanted: Notify,
    /// Durable LSN moved (or the shard got poisoned).
    pub(crate) durable_advanced: Notify,
    /// The durable mark in `wal.head` (`docs/wal.md`, "The durable
    /// mark"): the LSN it vouches for, the highest LSN someone waits to
    /// see marked (a clean stop), and the wake-up once a mark is written.
    marked_lsn: Cell<u64>,
    mark_wanted: Cell<u64>,
    pub(crate) mark_written: Notify,
}

impl Wal {
    /// The WAL after recovery: everything up to `last_lsn` is durable;
    /// `appender` is `None` without a WAL (durability `none`).
    pub(crate) fn new(
        shard: usize,
        last_lsn: u64,
        appender: Option<WalAppender>,
        stats: Arc<ShardStats>,
        checkpoint_wal_bytes: u64,
    ) -> Wal {
        stats.current_lsn.store(last_lsn, Relaxed);
        stats.durable_lsn.store(last_lsn, Relaxed);
        Wal {
            shard,
            state: RefCell::new(WalState::new(shard, last_lsn, appender)),
            stats,
            checkpoint: CheckpointCounter {
                wal_bytes_min: checkpoint_wal_bytes,
                threshold: Cell::new(checkpoint_wal_bytes),
                wal_bytes: Cell::new(0),
                writes: Cell::new(0),
                ran_over: Cell::new([0; RAN_OVER_KEPT]),
            },
            flush_wanted: Notify::new(),
            space_freed: Notify::new(),
            segment_rolled: Notify::new(),
            checkpoint_wanted: Notify::new(),
            durable_advanced: Notify::new(),
            marked_lsn: Cell::new(0),
            mark_wanted: Cell::new(0),
            mark_written: Notify::new(),
        }
    }

    /// The durable mark as written (0: none yet in this process).
    pub(crate) fn marked_lsn(&self) -> u64 {
        self.marked_lsn.get()
    }

    /// A durable mark through `lsn` was written (by the flusher).
    pub(crate) fn set_marked(&self, lsn: u64) {
        self.marked_lsn.set(self.marked_lsn.get().max(lsn));
        self.mark_written.notify();
    }

    /// Whether someone waits for a mark above the one written.
    pub(crate) fn mark_requested(&self) -> bool {
        self.mark_wanted.get() > self.marked_lsn.get()
    }

    /// Has the flusher write the durable mark through `lsn` (already
    /// durable) now, without waiting for the WAL to go idle, and waits
    /// for it: a clean stop leaves a mark through its last record. `Err`
    /// if the shard is (or gets) poisoned first.
    pub(crate) async fn mark_through(&self, lsn: u64) -> Result<(), ()> {
        self.mark_wanted.set(self.mark_wanted.get().max(lsn));
        loop {
            let written = self.mark_written.notified();
            if self.marked_lsn.get() >= lsn {
                return Ok(());
            }
            if self.is_poisoned() {
                return Err(());
            }
            self.flush_wanted.notify();
            written.await;
        }
    }

    pub(crate) fn stats(&self) -> &ShardStats {
        &self.stats
    }

    pub(crate) fn is_poisoned(&self) -> bool {
        self.state.borrow().is_poisoned()
    }

    /// The shard this WAL is of.
    pub(crate) fn shard(&self) -> usize {
        self.shard
    }

    /// Where durability stands, for the durability watch.
    pub(crate) fn progress(&self) -> crate::wal::watch::Progress {
        let st = self.state.borrow();
        let (open_buffer_has_records, flush_requested, _) = st.flush_state();
        crate::wal::watch::Progress {
            durable_lsn: st.durable_lsn,
            last_lsn: st.last_lsn,
            waiting_answers: st.pending.len(),
            oldest_waiting_lsn: st.pending.iter().map(|p| p.lsn).min(),
            open_buffer_has_records,
            flush_requested,
        }
    }

    pub(crate) fn last_lsn(&self) -> u64 {
        self.state.borrow().last_lsn()
    }

    pub(crate) fn durable_lsn(&self) -> u64 {
        self.state.borrow().durable_lsn()
    }

    /// Segment the open buffer belongs to (0 without a WAL).
    pub(crate) fn open_segment_seq(&self) -> u64 {
        self.state.borrow().open_segment_seq()
    }

    /// (open buffer has records, a flush was requested, the buffer passed
    /// half its threshold)
    pub(crate) fn flush_state(&self) -> (bool, bool, bool) {
        self.state.borrow().flush_state()
    }

    /// Logs one record at the next LSN (see [`WalState::append`]). The
    /// caller wakes the flusher and the segment creator once its step is
    /// done ([`Wal::appended`]).
    pub(crate) fn append(
        &self,
        kind: RecordKind,
        key: &[u8],
        value: &[u8],
        expires_at_ms: Option<u64>,
        version: impl FnOnce() -> u64,
    ) -> Append {
        self.state
            .borrow_mut()
            .append(kind, key, value, expires_at_ms, version)
    }

    /// Logs a Put as a chunk chain (see [`WalState::append_chained`]).
    pub(crate) fn append_chained(
        &self,
        key: &[u8],
        value: &[u8],
        expires_at_ms: Option<u64>,
        version: impl FnOnce() -> u64,
    ) -> (Append, bool) {
        self.state
            .borrow_mut()
            .append_chained(key, value, expires_at_ms, version)
    }

    /// Whether a Put of this size goes as a chunk chain.
    pub(crate) fn needs_chain(&self, key_len: usize, value_len: usize, at: Option<u64>) -> bool {
        self.state.borrow().needs_chain(key_len, value_len, at)
    }

    /// The first LSN of a chunk chain still being logged: a checkpoint
    /// must not claim it (or anything after it).
    pub(crate) fn open_chain_first_lsn(&self) -> Option<u64> {
        self.state.borrow().open_chain_first_lsn()
    }

    /// A step of appends ended: counts it as one write toward the next
    /// checkpoint if it logged anything (`records`), and wakes the flusher
    /// (`wake_flusher`: records to write, or a full buffer to empty) and
    /// the segment creator (`rolled`: the appender moved to a new segment).
    pub(crate) fn appended(&self, records: u64, wake_flusher: bool, rolled: bool) {
        if records > 0 {
            self.checkpoint.writes.set(self.checkpoint.writes.get() + 1);
        }
        if wake_flusher {
            self.flush_wanted.notify();
        }
        if rolled {
            self.segment_rolled.notify();
        }
    }

    /// Answers an applied batch now, or queues the answer until the LSN it
    /// waits for is durable.
    pub(crate) fn complete(&self, applied: Applied, reply: Reply) {
        let answer = self.state.borrow_mut().complete(applied, reply);
        if let Some(answer) = answer {
            answer.send();
        }
    }

    /// Whether the next flush taken starts a segment (the flusher submits
    /// such a flush only with nothing else in flight).
    pub(crate) fn next_flush_starts_segment(&self) -> bool {
        self.state.borrow().next_flush_starts_segment()
    }

    /// The flusher takes the open buffer (sealed). Wakes blocked appenders.
    pub(crate) fn take_flush(&self) -> Option<SealedFlush> {
        let sealed = self.state.borrow_mut().take_flush();
        if sealed.is_some() {
            self.space_freed.notify();
        }
        sealed
    }

    /// The flush through `last_lsn` is durable and its buffer comes back:
    /// acknowledges everything it covers, counts its bytes toward the next
    /// checkpoint, and wakes whoever waits for space or durability.
    pub(crate) fn flush_complete(&self, flush: FlushDone) {
        let ready = self
            .state
            .borrow_mut()
            .flush_done(flush.last_lsn, flush.buf);
        let bytes = self.checkpoint.wal_bytes.get() + flush.bytes;
        self.checkpoint.wal_bytes.set(bytes);
        let s = &self.stats;
        s.durable_lsn.store(flush.last_lsn, Relaxed);
        s.wal_flushes.fetch_add(1, Relaxed);
        s.wal_bytes_written.fetch_add(flush.bytes, Relaxed);
        s.group_commit_records.record(flush.records);
        s.group_commit_bytes.record(flush.bytes);
        s.fdatasync_latency_us.record(flush.sync_us);
        s.wal_live_bytes.store(flush.live_wal_bytes, Relaxed);
        for answer in ready {
            answer.send();
        }
        // A flush just returned its buffer: appenders may go on.
        self.space_freed.notify();
        self.durable_advanced.notify();
        if bytes >= self.checkpoint.threshold.get() {
            self.checkpoint_wanted.notify();
        }
    }

    /// A WAL write or fdatasync failed: no more writes on this shard.
    pub(crate) fn poison(&self, what: &str, file: &Path, offset: u64, err: &std::io::Error) {
        tracing::error!(
            shard = self.shard,
            file = %file.display(),
            offset,
            error = %err,
            "WAL {what} failed: shard poisoned, it accepts no writes until restart (the fdatasync is never retried; restart recovers from what is on disk)"
        );
        self.poison_pending();
    }

    /// Poisons the state: every waiting write answer fails, every task
    /// waiting on the WAL wakes to see it.
    pub(crate) fn poison_pending(&self) {
        let failed = self.state.borrow_mut().poison();
        self.stats.poisoned.store(true, Relaxed);
        for answer in failed {
            answer.send();
        }
        self.space_freed.notify();
        self.durable_advanced.notify();
        self.flush_wanted.notify();
        self.mark_written.notify();
        self.checkpoint_wanted.notify();
    }

    /// The shard thread is ending without answering what waits: drop the
    /// waiting answers so their callers see `ShuttingDown` instead of
    /// waiting forever.
    pub(crate) fn abandon(&self) {
        let pending: Vec<Pending> = self.state.borrow_mut().abandon();
        drop(pending);
    }

    /// Asks the flusher to write the open buffer now.
    pub(crate) fn request_flush(&self) {
        self.state.borrow_mut().request_flush();
        self.flush_wanted.notify();
    }

    /// Waits until `lsn` is durable. Err if the shard is poisoned first.
    pub(crate) async fn wait_durable(&self, lsn: u64) -> Result<(), ()> {
        loop {
            let advanced = self.durable_advanced.notified();
            {
                let st = self.state.borrow();
                if st.durable_lsn() >= lsn {
                    return Ok(());
                }
                if st.is_poisoned() {
                    return Err(());
                }
            }
            self.request_flush();
            advanced.await;
        }
    }

    /// (WAL bytes, writes) since the last checkpoint.
    pub(crate) fn since_checkpoint(&self) -> (u64, u64) {
        (
            self.checkpoint.wal_bytes.get(),
            self.checkpoint.writes.get(),
        )
    }

    /// WAL bytes after which the next checkpoint is due.
    pub(crate) fn checkpoint_threshold(&self) -> u64 {
        self.checkpoint.threshold.get()
    }

    /// The least WAL between checkpoints (`storage.checkpoint_wal_bytes`).
    pub(crate) fn checkpoint_allowance(&self) -> u64 {
        self.checkpoint.wal_bytes_min
    }

    /// Records that the checkpoint just taken ran over `segments` segments
    /// (the WAL started them after its LSN); returns the most that any of
    /// the last [`RAN_OVER_KEPT`] ran over, so that a cycle running over a
    /// segment fewer than the ones before does not remove a file the next
    /// one makes again.
    pub(crate) fn checkpoint_ran_over(&self, segments: usize) -> usize {
        let mut last = self.checkpoint.ran_over.get();
        last.rotate_right(1);
        last[0] = segments;
        self.checkpoint.ran_over.set(last);
        last.into_iter().max().unwrap_or(segments)
    }

    /// Sets the WAL bytes after which the next checkpoint is due (the
    /// checkpointer's choice: `checkpoint_wal_bytes` before a delta, more
    /// before a full snapshot); never below `checkpoint_wal_bytes`.
    pub(crate) fn set_checkpoint_threshold(&self, bytes: u64) {
        let c = &self.checkpoint;
        c.threshold.set(c.wal_bytes_min.max(bytes));
    }

    /// Recovery replayed `bytes` of WAL holding `records` records after the
    /// newest snapshot: they count toward the next checkpoint as if this
    /// process had written them (a server that restarts often must still
    /// checkpoint).
    pub(crate) fn carry_over(&self, bytes: u64, records: u64) {
        self.checkpoint.wal_bytes.set(bytes);
        self.checkpoint.writes.set(records);
    }

    /// A checkpoint starts: count from zero again.
    pub(crate) fn checkpoint_started(&self) {
        self.checkpoint.wal_bytes.set(0);
        self.checkpoint.writes.set(0);
    }
}

/// A flush the flusher finished (written and fdatasync'ed).
#[derive(Debug)]
pub(crate) struct FlushDone {
    pub(crate) last_lsn: u64,
    pub(crate) buf: AlignedBuf,
    pub(crate) bytes: u64,
    pub(crate) records: u64,
    pub(crate) sync_us: u64,
    /// Bytes of every segment file on disk after this flush.
    pub(crate) live_wal_bytes: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::channel::oneshot;

    const SHARD: usize = 3;

    fn state() -> WalState {
        // 1 MiB segments, 16 KiB flush threshold, records up to 4 KiB.
        let appender = WalAppender::new(SHARD as u32, 1 << 20, 16 << 10, 4 << 10, 1);
        WalState::new(SHARD, 0, Some(appender))
    }

    fn put(st: &mut WalState, value_len: usize) -> Append {
        st.append(RecordKind::Put, b"key", &vec![7u8; value_len], None, || 1)
    }

    /// A batch of one write and one read, waiting for `lsn`.
    fn batch(lsn: u64) -> Applied {
        Applied {
            results: vec![OpResult::Ok, OpResult::NotFound],
            wait_lsn: Some(lsn),
            writes: WriteSet::Some(vec![0]),
        }
    }

    fn complete(st: &mut WalState, applied: Applied) -> oneshot::Receiver<Vec<OpResult>> {
        let (tx, rx) = oneshot::channel();
        if let Some(answer) = st.complete(applied, Reply::Direct(tx)) {
            answer.send();
        }
        rx
    }

    fn received(rx: &mut oneshot::Receiver<Vec<OpResult>>) -> Option<Vec<OpResult>> {
        rx.try_recv().expect("the answer was not dropped")
    }

    fn send_all(answers: Vec<Answer>) -> usize {
        let n = answers.len();
        answers.into_iter().for_each(Answer::send);
        n
    }

    #[test]
    fn lsns_grow_by_one_per_record() {
        let mut st = state();
        for lsn in 1..=5 {
            assert_eq!(put(&mut st, 10), Append::Logged { lsn, rolled: false });
        }
        assert_eq!(st.last_lsn(), 5);
        assert_eq!(st.durable_lsn(), 0);
        assert!(st.flush_state().0, "the open buffer has records");
    }

    #[test]
    fn answers_wait_until_their_lsn_is_durable_and_leave_in_order() {
        let mut st = state();
        put(&mut st, 10);
        let mut first = complete(&mut st, batch(1));
        let flush1 = st.take_flush().expect("records to flush");
        assert_eq!(flush1.last_lsn, 1);
        put(&mut st, 10);
        put(&mut st, 10);
        let mut second = complete(&mut st, batch(3));
        assert_eq!(received(&mut first), None, "LSN 1 is not durable yet");

        assert_eq!(send_all(st.flush_done(1, flush1.buf)), 1);
        assert_eq!(
            received(&mut first),
            Some(vec![OpResult::Ok, OpResult::NotFound])
        );
        assert_eq!(received(&mut second), None, "LSN 3 is not durable yet");

        let flush2 = st.take_flush().expect("records to flush");
        assert_eq!((flush2.first_lsn, flush2.last_lsn), (2, 3));
        assert_eq!(send_all(st.flush_done(3, flush2.buf)), 1);
        assert!(received(&mut second).is_some());
        assert_eq!(st.durable_lsn(), 3);

        // Durable already: answered at once, nothing queued.
        let mut late = complete(&mut st, batch(2));
        assert!(received(&mut late).is_some());
        // Nothing to wait for: answered at once even before any flush.
        put(&mut st, 10);
        let mut read_only = complete(
            &mut st,
            Applied {
                results: vec![OpResult::NotFound],
                wait_lsn: None,
                writes: WriteSet::None,
            },
        );
        assert_eq!(received(&mut read_only), Some(vec![OpResult::NotFound]));
    }

    #[test]
    fn one_flush_covering_several_batches_releases_all_of_them() {
        let mut st = state();
        let mut waiting = Vec::new();
        for lsn in 1..=4 {
            put(&mut st, 10);
            waiting.push(complete(&mut st, batch(lsn)));
        }
        let flush = st.take_flush().expect("records to flush");
        assert_eq!(flush.records, 4);
        assert!(waiting.iter_mut().all(|rx| received(rx).is_none()));
        assert_eq!(send_all(st.flush_done(4, flush.buf)), 4);
        assert!(waiting.iter_mut().all(|rx| received(rx).is_some()));
    }

    #[test]
    fn poisoning_fails_waiting_writes_and_refuses_appends() {
        let mut st = state();
        put(&mut st, 10);
        put(&mut st, 10);
        let mut a = complete(&mut st, batch(1));
        let mut b = complete(&mut st, batch(2));
        let poisoned = OpResult::Err(OpError::Poisoned { shard: SHARD });

        assert_eq!(send_all(st.poison()), 2);
        assert!(st.is_poisoned());
        for rx in [&mut a, &mut b] {
            // The write fails; the read in the same batch keeps its answer.
            assert_eq!(
                received(rx),
                Some(vec![poisoned.clone(), OpResult::NotFound])
            );
        }

        assert_eq!(put(&mut st, 10), Append::Poisoned);
        assert_eq!(st.last_lsn(), 2, "no LSN is used after poisoning");
        // A batch completed later, not durable, fails at once too.
        let mut c = complete(&mut st, batch(2));
        assert_eq!(received(&mut c), Some(vec![poisoned, OpResult::NotFound]));
    }

    #[test]
    fn a_full_buffer_logs_nothing_and_asks_for_a_flush() {
        let mut st = state();
        let mut logged = 0u64;
        loop {
            match put(&mut st, 3000) {
                Append::Logged { lsn, .. } => {
                    logged += 1;
                    assert_eq!(lsn, logged);
                }
                Append::Full => break,
                other => panic!("unexpected {other:?}"),
            }
            assert!(logged < 100, "the buffer never filled");
        }
        assert_eq!(st.last_lsn(), logged, "a full buffer uses no LSN");
        let (has_records, requested, _) = st.flush_state();
        assert!(has_records && requested);
        let flush = st.take_flush().expect("records to flush");
        assert_eq!(flush.last_lsn, logged);
        assert!(!st.flush_state().1, "taking the buffer clears the request");
        assert_eq!(
            put(&mut st, 3000),
            Append::Logged {
                lsn: logged + 1,
                rolled: false
            }
        );
    }

    #[test]
    fn without_a_wal_nothing_is_logged_and_writes_answer_at_once() {
        let mut st = WalState::new(SHARD, 7, None);
        assert_eq!(put(&mut st, 10), Append::NoWal);
        assert_eq!(st.last_lsn(), 7);
        assert_eq!(st.open_segment_seq(), 0);
        let mut rx = complete(&mut st, batch(7));
        assert!(received(&mut rx).is_some());
    }

    #[test]
    fn abandoned_answers_close_their_channels() {
        let mut st = state();
        put(&mut st, 10);
        let mut rx = complete(&mut st, batch(1));
        drop(st.abandon());
        assert!(rx.try_recv().is_err(), "the caller sees the channel close");
    }
}
