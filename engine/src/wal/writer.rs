//! The write side of one shard's WAL: the append buffer records are encoded
//! into ([`WalAppender`], no I/O, used by the shard's apply path) and the
//! segment files (created ahead of need, recycled or removed after
//! checkpoints). The tasks that write them are in `crate::wal::flusher`.
//!
//! What must hold: a flush starts on a block boundary past every earlier
//! flush and never rewrites a block holding acknowledged records; a
//! segment is retired only when every record in it is covered by a
//! checkpoint.

use crate::error::WalError;
use crate::io::{AlignedBuf, Disk, DiskFile, ALIGN};
use crate::layout::{DirId, ShardPaths};
use crate::wal::format::{
    chain_end_size, chunk_record_size, encode_chain_end, encode_chunk, encode_record_expiring,
    encode_seal, encode_segment_header, record_size_expiring, seal_size, RecordKind, SealInfo,
    SegmentHeader, BLOCK_BYTES, FLAG_FIRST, RECORD_HEADER_BYTES, SEAL_RESERVE_BYTES,
};
use crate::wal::head::{open_head, HeadState, WalHead};
use crate::wal::segment::{create_segment, prepare_segment, recycle_into, LiveSegment};
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use std::rc::Rc;

/// Bytes a flush buffer needs so that a segment header, one record of
/// `max_record_bytes` and the largest seal always fit.
pub fn buffer_bytes_needed(max_record_bytes: usize) -> usize {
    BLOCK_BYTES + max_record_bytes + SEAL_RESERVE_BYTES
}

/// Smallest piece of value a chunk carries (or a quarter of the flush
/// threshold, if smaller) unless it is the value's last: with less room
/// the buffer is flushed first (or, empty, moves to the next segment), so
/// chains are not cut into slivers.
pub const CHUNK_PIECE_MIN: usize = 64 * 1024;

/// A flush ready to go to disk.
#[derive(Debug)]
pub struct SealedFlush {
    pub buf: AlignedBuf,
    pub seq: u64,
    pub offset: u64,
    pub first_lsn: u64,
    pub last_lsn: u64,
    pub records: u32,
    pub starts_segment: bool,
}

/// The open flush buffer of one shard. Pure memory: records go in, sealed
/// flushes come out.
#[derive(Debug)]
pub struct WalAppender {
    shard: u32,
    /// The data directory's identity, written into every segment header.
    dir_id: DirId,
    segment_bytes: u64,
    flush_threshold: usize,
    open: AlignedBuf,
    open_seq: u64,
    open_offset: u64,
    open_first_lsn: u64,
    open_last_lsn: u64,
    open_records: u32,
    /// Buffers free for the next open one: one per flush that may be in
    /// flight, less those out.
    spares: Vec<AlignedBuf>,
    /// Every buffer this appender owns (the open one and the spares,
    /// counting those out in flight).
    buffers: usize,
    capacity: usize,
    /// Someone wants the open buffer flushed now (full buffer, shutdown,
    /// checkpoint); the flusher clears it when it takes the buffer.
    pub flush_requested: bool,
}

/// Whether a record could be appended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reserve {
    Fits,
    /// The open buffer (or its segment) is full: wait for the flusher to take it.
    Full,
}

impl WalAppender {
    /// An appender whose next flush starts segment `seq` at offset 0.
    pub fn new(
        shard: u32,
        segment_bytes: u64,
        flush_threshold: usize,
        max_record_bytes: usize,
        seq: u64,
    ) -> WalAppender {
        let capacity = flush_threshold.max(buffer_bytes_needed(max_record_bytes));
        assert!(
            buffer_bytes_needed(max_record_bytes) as u64 <= segment_bytes,
            "segment too small for one record (checked at open)"
        );
        assert_eq!(segment_bytes % ALIGN as u64, 0);
        WalAppender {
            shard,
            dir_id: 0,
            segment_bytes,
            flush_threshold,
            open: AlignedBuf::with_capacity(capacity),
            open_seq: seq,
            open_offset: 0,
            open_first_lsn: 0,
            open_last_lsn: 0,
            open_records: 0,
            spares: vec![AlignedBuf::with_capacity(capacity)],
            buffers: 2,
            capacity,
            flush_requested: false,
        }
    }

    /// Lets up to `flushes` flushes be out at once (sealed and not given
    /// back): the appender then owns `flushes + 1` buffers.
    /// This appender writing `dir_id` (the data directory's identity) into
    /// the header of every segment it starts (0 until set: tests only).
    pub fn with_dir_id(mut self, dir_id: DirId) -> WalAppender {
        self.dir_id = dir_id;
        self
    }

    /// This appender's first flush continuing its segment at `offset` (a
    /// restart fills the segment the log ended in; `offset` is where it
    /// ended, a block boundary after a seal).
    pub fn resuming_at(mut self, offset: u64) -> WalAppender {
        assert!(offset.is_multiple_of(ALIGN as u64) && offset < self.segment_bytes);
        self.open_offset = offset;
        self
    }

    pub fn with_flushes_in_flight(mut self, flushes: usize) -> WalAppender {
        assert!(flushes >= 1);
        while self.buffers < flushes + 1 {
            self.spares.push(AlignedBuf::with_capacity(self.capacity));
            self.buffers += 1;
        }
        self
    }

    /// Whether the next flush taken starts a segment (carries its header).
    pub fn next_flush_starts_segment(&self) -> bool {
        self.open_offset == 0
    }

    /// Whether a record of `size` bytes fits an empty flush buffer (larger
    /// Puts are logged as chunk chains).
    pub fn holds(&self, size: usize) -> bool {
        let needed = buffer_bytes_needed(size);
        needed <= self.open.capacity() && needed as u64 <= self.segment_bytes
    }

    pub fn has_records(&self) -> bool {
        self.open_records > 0
    }

    /// Bytes of records (and header) in the open buffer.
    pub fn open_bytes(&self) -> usize {
        self.open.len()
    }

    pub fn flush_threshold(&self) -> usize {
        self.flush_threshold
    }

    /// Segment the open buffer belongs to.
    pub fn open_seq(&self) -> u64 {
        self.open_seq
    }

    fn used_after(&self, size: usize) -> usize {
        let header = if self.open_offset == 0 {
            BLOCK_BYTES
        } else {
            0
        };
        let used = if self.open_records == 0 {
            header
        } else {
            self.open.len()
        };
        used + size + SEAL_RESERVE_BYTES
    }

    fn fits(&self, size: usize) -> bool {
        let need = self.used_after(size);
        if self.open_records > 0 && need > self.flush_threshold {
            return false;
        }
        need <= self.open.capacity() && self.open_offset + need as u64 <= self.segment_bytes
    }

    /// Checks room for a record of `size` bytes, moving an empty buffer to
    /// the next segment when this one has no room left. Returns whether the
    /// appender moved to a new segment along with the answer.
    pub fn reserve(&mut self, size: usize) -> (Reserve, bool) {
        if self.fits(size) {
            return (Reserve::Fits, false);
        }
        if self.open_records > 0 {
            return (Reserve::Full, false);
        }
        // Empty buffer, no room in this segment: the rest of it stays zero.
        self.open_seq += 1;
        self.open_offset = 0;
        assert!(self.fits(size), "a record always fits an empty segment");
        (Reserve::Fits, true)
    }

    /// Appends a record; `reserve` must have answered `Fits` for its size.
    pub fn append(
        &mut self,
        lsn: u64,
        commit_version: u64,
        kind: RecordKind,
        key: &[u8],
        value: &[u8],
    ) {
        self.append_expiring(lsn, commit_version, kind, key, value, None);
    }

    /// [`WalAppender::append`] of a Put that may carry an expiry time
    /// (reserve `record_size_expiring` bytes first).
    pub fn append_expiring(
        &mut self,
        lsn: u64,
        commit_version: u64,
        kind: RecordKind,
        key: &[u8],
        value: &[u8],
        expires_at_ms: Option<u64>,
    ) {
        let size = record_size_expiring(key.len(), value.len(), expires_at_ms);
        let (start, flags) = self.open_record(lsn, size);
        encode_record_expiring(
            &mut self.open.as_mut_slice()[start..],
            lsn,
            commit_version,
            kind,
            flags,
            key,
            value,
            expires_at_ms,
        );
    }

    /// Value bytes the next chunk may carry in the open buffer (at most
    /// `want`), moving an empty buffer to the next segment when this one
    /// has no room for a useful piece. `None` when the buffer must be
    /// flushed first. The second value says whether it moved.
    pub fn chunk_room(&mut self, want: usize) -> (Option<usize>, bool) {
        let mut rolled = false;
        loop {
            let room = self.piece_room();
            let fresh = self.open_records == 0 && self.open_offset == 0;
            let piece_min = want.min(CHUNK_PIECE_MIN).min(self.flush_threshold / 4);
            if room > 0 && (fresh || room >= piece_min) {
                return (Some(room.min(want)), rolled);
            }
            if self.open_records > 0 {
                return (None, rolled);
            }
            assert!(!fresh, "an empty segment holds a chunk");
            self.open_seq += 1;
            self.open_offset = 0;
            rolled = true;
        }
    }

    /// Value bytes a chunk appended now could carry.
    fn piece_room(&self) -> usize {
        let base = self.used_after(RECORD_HEADER_BYTES);
        let cap = if self.open_records > 0 {
            self.flush_threshold.min(self.open.capacity())
        } else {
            self.open.capacity()
        };
        let segment_left = self.segment_bytes - self.open_offset;
        let limit = (cap as u64).min(segment_left) as usize;
        limit.saturating_sub(base)
    }

    /// Appends a `Chunk` record holding `piece` (`chunk_room` must have
    /// allowed its length).
    pub fn append_chunk(&mut self, lsn: u64, commit_version: u64, piece: &[u8]) {
        let (start, flags) = self.open_record(lsn, chunk_record_size(piece.len()));
        encode_chunk(
            &mut self.open.as_mut_slice()[start..],
            lsn,
            commit_version,
            flags,
            piece,
        );
    }

    /// Appends the Put that ends a chain (reserve `chain_end_size` first).
    #[allow(clippy::too_many_arguments)]
    pub fn append_chain_end(
        &mut self,
        lsn: u64,
        commit_version: u64,
        key: &[u8],
        tail: &[u8],
        expires_at_ms: Option<u64>,
        chain_first_lsn: u64,
    ) {
        let size = chain_end_size(key.len(), tail.len(), expires_at_ms);
        let (start, flags) = self.open_record(lsn, size);
        encode_chain_end(
            &mut self.open.as_mut_slice()[start..],
            lsn,
            commit_version,
            flags,
            key,
            tail,
            expires_at_ms,
            chain_first_lsn,
        );
    }

    /// Makes room for a record of `size` bytes at LSN `lsn` in the open
    /// buffer: returns where it starts and its FIRST flag.
    fn open_record(&mut self, lsn: u64, size: usize) -> (usize, u8) {
        debug_assert!(self.fits(size));
        let flags = if self.open_records == 0 {
            let header = if self.open_offset == 0 {
                BLOCK_BYTES
            } else {
                0
            };
            self.open.set_len(header);
            self.open_first_lsn = lsn;
            FLAG_FIRST
        } else {
            assert_eq!(lsn, self.open_last_lsn + 1, "LSNs are contiguous");
            0
        };
        let start = self.open.len();
        self.open.set_len(start + size);
        self.open_last_lsn = lsn;
        self.open_records += 1;
        (start, flags)
    }

    /// Seals the open buffer (segment header if it starts a segment, seal
    /// record padding to a block) and hands it out; the spare buffer
    /// becomes the open one. `None` if there is nothing to flush or the
    /// spare is still out (a flush in flight). The seal says no flush is
    /// in flight with this one.
    pub fn take(&mut self) -> Option<SealedFlush> {
        self.take_after(None)
    }

    /// [`WalAppender::take`] for a flush submitted while the records up to
    /// `durable_lsn` are durable and those after it, up to this flush, are
    /// still in flight (`None`: nothing in flight): its seal records how
    /// many LSNs that is, for recovery's in-flight window rule.
    pub fn take_after(&mut self, durable_lsn: Option<u64>) -> Option<SealedFlush> {
        if self.open_records == 0 {
            return None;
        }
        let lsns_in_flight = match durable_lsn {
            None => 0,
            Some(durable) => {
                assert!(durable < self.open_first_lsn, "a flush of durable records");
                // Never saturate: a larger count would claim a wider
                // window than was in flight. The flush buffers in flight
                // bound it far below u32::MAX.
                u32::try_from(self.open_first_lsn - 1 - durable)
                    .expect("LSNs in flight are bounded by the buffers in flight")
            }
        };
        let spare = self.spares.pop()?;
        let mut buf = std::mem::replace(&mut self.open, spare);
        self.open.set_len(0);
        let starts_segment = self.open_offset == 0;
        if starts_segment {
            let header = SegmentHeader {
                shard: self.shard,
                seq: self.open_seq,
                first_lsn: self.open_first_lsn,
                segment_bytes: self.segment_bytes,
                flags: 0,
                dir_id: self.dir_id,
            };
            encode_segment_header(&header, &mut buf.as_mut_slice()[..BLOCK_BYTES]);
        }
        let used = buf.len();
        let seal = seal_size(used);
        buf.set_len(used + seal);
        encode_seal(
            &mut buf.as_mut_slice()[used..],
            &SealInfo {
                flush_offset: self.open_offset,
                first_lsn: self.open_first_lsn,
                last_lsn: self.open_last_lsn,
                record_count: self.open_records,
                lsns_in_flight,
            },
        );
        assert_eq!(buf.len() % BLOCK_BYTES, 0);
        let sealed = SealedFlush {
            seq: self.open_seq,
            offset: self.open_offset,
            first_lsn: self.open_first_lsn,
            last_lsn: self.open_last_lsn,
            records: self.open_records,
            starts_segment,
            buf,
        };
        self.open_offset += sealed.buf.len() as u64;
        assert!(self.open_offset <= self.segment_bytes);
        self.open_records = 0;
        self.flush_requested = false;
        Some(sealed)
    }

    /// Returns a buffer after its flush completed.
    pub fn give_back(&mut self, mut buf: AlignedBuf) {
        assert!(
            self.spares.len() + 1 < self.buffers,
            "more buffers given back than taken"
        );
        buf.set_len(0);
        self.spares.push(buf);
    }
}

/// The open segment files of one shard, the segments holding records (for
/// recycling after checkpoints) and the pool of recyclable files.
pub struct SegmentFiles<D: Disk> {
    disk: D,
    pub(super) paths: ShardPaths,
    pub(super) segment_bytes: u64,
    /// The data directory's identity, in the prepared header of every
    /// segment recycled.
    dir_id: DirId,
    files: RefCell<BTreeMap<u64, Rc<D::File>>>,
    live: RefCell<Vec<LiveSegment>>,
    /// Files with a prepared (or zero) header, ready to be renamed into place.
    pool: RefCell<Vec<PathBuf>>,
    /// Segments whose file was recycled (their first flush says so).
    recycled: RefCell<BTreeSet<u64>>,
    /// The last failed creation: (segment, error). Not sticky: the creator
    /// retries (after a pause, a rollover, or when the flusher needs that
    /// segment); the flusher poisons the shard only when a fresh attempt
    /// for the segment it must write fails.
    pub(super) create_failed: RefCell<Option<(u64, String)>>,
    created: crate::notify::Notify,
    /// The flusher wants a fresh creation attempt now.
    pub(super) retry_wanted: crate::notify::Notify,
    /// The segment the flusher waits for, if it does not exist.
    pub(super) needed: Cell<Option<u64>>,
    creating: Cell<bool>,
    /// The WAL head (taken out by the flusher while it updates it).
    pub(super) head: RefCell<Option<WalHead<D::File>>>,
}

impl<D: Disk> SegmentFiles<D> {
    /// The data directory's identity, which every file of the shard carries.
    pub(crate) fn dir_id(&self) -> DirId {
        self.dir_id
    }

    /// Files after recovery: `live` segments hold records, `next_seq` exists
    /// (unused header) and receives the next flush, or, with `resume`, that
    /// live segment receives it and `next_seq` is the spare ahead; `spares`
    /// may be recycled.
    /// The WAL head is opened (`head` as read by recovery), or created
    /// naming `head_found` when there was none. `next_ready` is false when
    /// recovery could not make the next segment (a full disk): the creator
    /// makes it later, and writes poison the shard if it cannot.
    #[allow(clippy::too_many_arguments)]
    pub async fn open(
        disk: D,
        paths: ShardPaths,
        (segment_bytes, dir_id): (u64, DirId),
        live: Vec<LiveSegment>,
        (next_seq, next_ready): (u64, bool),
        (next_recycled, resume): (bool, Option<u64>),
        spares: Vec<PathBuf>,
        head: (Option<HeadState>, HeadState),
    ) -> Result<SegmentFiles<D>, WalError> {
        let head = open_head(&disk, &paths, paths.shard as u32, dir_id, head.0, head.1).await?;
        let mut files = BTreeMap::new();
        let ready = next_ready.then_some(next_seq);
        for seq in resume.into_iter().chain(ready) {
            let path = paths.segment(seq);
            let file = disk
                .open(&path, false)
                .await
                .map_err(|source| WalError::Io {
                    op: "open",
                    file: path.clone(),
                    offset: 0,
                    source,
                })?;
            files.insert(seq, Rc::new(file));
        }
        let mut recycled = BTreeSet::new();
        if next_recycled {
            recycled.insert(next_seq);
        }
        Ok(SegmentFiles {
            disk,
            paths,
            segment_bytes,
            dir_id,
            files: RefCell::new(files),
            live: RefCell::new(live),
            pool: RefCell::new(spares),
            recycled: RefCell::new(recycled),
            create_failed: RefCell::new(None),
            created: crate::notify::Notify::new(),
            retry_wanted: crate::notify::Notify::new(),
            needed: Cell::new(None),
            creating: Cell::new(false),
            head: RefCell::new(Some(head)),
        })
    }

    /// Number of segment files on disk (live, open spares, pool).
    pub fn segment_bytes(&self) -> u64 {
        self.segment_bytes
    }

    pub fn file_count(&self) -> usize {
        let live = self.live.borrow();
        let files = self.files.borrow();
        live.len()
            + files
                .keys()
                .filter(|seq| !live.iter().any(|s| s.seq == **seq))
                .count()
            + self.pool.borrow().len()
    }

    pub(super) fn has(&self, seq: u64) -> bool {
        self.files.borrow().contains_key(&seq)
    }

    pub(super) fn is_recycled(&self, seq: u64) -> bool {
        self.recycled.borrow().contains(&seq)
    }

    /// The file of segment `seq`, waiting for its creation if needed. If
    /// the last attempt to make it failed, asks for one fresh attempt (space
    /// may have been freed since) and fails only if that one fails too.
    pub(super) async fn file(&self, seq: u64) -> Result<Rc<D::File>, String> {
        let mut retried = false;
        let result = loop {
            if let Some(f) = self.files.borrow().get(&seq) {
                break Ok(f.clone());
            }
            let failed = self.create_failed.borrow().clone();
            if let Some((failed_seq, e)) = failed {
                if failed_seq == seq {
                    if retried {
                        break Err(e);
                    }
                    retried = true;
                    *self.create_failed.borrow_mut() = None;
                }
            }
            // Tell the creator which segment is needed (the appender may
            // already be past it) and wake it.
            self.needed.set(Some(seq));
            self.retry_wanted.notify();
            self.created.notified().await;
        };
        self.needed.set(None);
        result
    }

    /// Reads block 0 of segment `seq` (which exists). On a throttled device
    /// the read is admitted only once the device has paid for the I/O
    /// charged before it (the zero-fill of a new segment): called before
    /// the shard reports ready, so its first writes do not wait for that.
    pub async fn settle(&self, seq: u64) {
        let file = self.files.borrow().get(&seq).cloned();
        if let Some(file) = file {
            let buf = AlignedBuf::with_capacity(BLOCK_BYTES);
            let _ = file.read_at(buf, 0).await;
        }
    }

    /// Makes segment `seq` exist: a pooled file renamed into place, or a new
    /// zero-filled one. Errors are kept for the flusher (which poisons the
    /// shard when it needs that segment). Returns whether it recycled, if
    /// it made a segment.
    pub(super) async fn create_ahead(&self, seq: u64) -> Option<bool> {
        if self.has(seq) || self.creating.get() {
            return None;
        }
        self.creating.set(true);
        // A pooled file already named like the target is taken as it is:
        // renaming another one onto its name would replace it while the
        // pool still lists that name, and a later recycle would then rename
        // a segment in use.
        let spare = {
            let target = self.paths.segment(seq);
            let mut pool = self.pool.borrow_mut();
            match pool.iter().position(|p| *p == target) {
                Some(i) => Some(pool.remove(i)),
                None => pool.pop(),
            }
        };
        let result = match spare {
            Some(from) => match recycle_into(&self.disk, &self.paths, &from, seq).await {
                Ok(()) => {
                    let path = self.paths.segment(seq);
                    self.disk
                        .open(&path, false)
                        .await
                        .map_err(|source| WalError::Io {
                            op: "open",
                            file: path,
                            offset: 0,
                            source,
                        })
                        .map(|f| (f, true))
                }
                Err(e) => Err(e),
            },
            None => create_segment(&self.disk, &self.paths, seq, self.segment_bytes)
                .await
                .map(|f| (f, false)),
        };
        self.creating.set(false);
        let made = match result {
            Ok((file, recycled)) => {
                self.files.borrow_mut().insert(seq, Rc::new(file));
                if recycled {
                    self.recycled.borrow_mut().insert(seq);
                }
                Some(recycled)
            }
            Err(e) => {
                tracing::warn!(shard = self.paths.shard, segment = seq, error = %e,
                    "preparing a WAL segment failed; retrying later (writes fail once the shard needs it)");
                *self.create_failed.borrow_mut() = Some((seq, e.to_string()));
                None
            }
        };
        if made.is_some() {
            *self.create_failed.borrow_mut() = None;
        }
        self.created.notify();
        made
    }

    /// The segments that hold records, oldest first.
    pub(crate) fn live_segments(&self) -> Vec<LiveSegment> {
        self.live.borrow().clone()
    }

    pub(super) fn mark_live(&self, seq: u64, first_lsn: u64) {
        let mut live = self.live.borrow_mut();
        assert!(
            live.last().is_none_or(|s| s.seq < seq),
            "segments go live in order"
        );
        live.push(LiveSegment {
            seq,
            path: self.paths.segment(seq),
            first_lsn,
            bytes: self.segment_bytes,
        });
    }

    /// Whether segment `seq` exists (open, or made ahead).
    pub(crate) fn has_segment(&self, seq: u64) -> bool {
        self.has(seq)
    }

    /// Makes segment `seq` exist: see [`SegmentFiles::create_ahead`].
    /// `Some(recycled)` if it made one now.
    pub(crate) async fn make(&self, seq: u64) -> Option<bool> {
        self.create_ahead(seq).await
    }

    /// Retires every segment all of whose records are at or below
    /// `covered_lsn` (the next live segment starts at or below
    /// `covered_lsn + 1`) and whose next live segment has a durable record
    /// (its first LSN at or below `durable_lsn`): until the next one's
    /// first flush is on the device, a crash would leave that one without
    /// its header, and a retired one before it would leave no segment in
    /// use after the snapshot, which recovery refuses. The shard's segment
    /// files (live, open, the
    /// spare ahead, the pool) stay at most `files_max`, or what is live and
    /// open if that is more: retired files get a prepared header and join
    /// the pool while there is room, the rest are removed, and so are
    /// pooled files beyond it. Returns how many segments were retired.
    pub async fn remove_covered(
        &self,
        covered_lsn: u64,
        durable_lsn: u64,
        files_max: usize,
    ) -> Result<usize, WalError> {
        let doomed: Vec<LiveSegment> = {
            let live = self.live.borrow();
            let mut n = 0;
            while n + 1 < live.len()
                && live[n + 1].first_lsn <= covered_lsn + 1
                && live[n + 1].first_lsn <= durable_lsn
            {
                n += 1;
            }
            live[..n].to_vec()
        };
        // What stays whatever happens: the live segments after the doomed
        // ones, the open one and the spare ahead.
        let staying = self.file_count() - self.pool.borrow().len() - doomed.len();
        let pool_max = files_max.saturating_sub(staying);
        let mut removed = self.trim_pool(pool_max).await?;
        if doomed.is_empty() {
            if removed {
                self.sync_wal_dir().await?;
            }
            return Ok(0);
        }
        for seg in &doomed {
            self.files.borrow_mut().remove(&seg.seq);
            self.recycled.borrow_mut().remove(&seg.seq);
            self.live.borrow_mut().retain(|s| s.seq != seg.seq);
            let io = |op: &'static str| {
                let file = seg.path.clone();
                move |source| WalError::Io {
                    op,
                    file,
                    offset: 0,
                    source,
                }
            };
            if self.pool.borrow().len() < pool_max && seg.bytes == self.segment_bytes {
                let file = self.disk.open(&seg.path, false).await.map_err(io("open"))?;
                prepare_segment(
                    &file,
                    &seg.path,
                    self.paths.shard as u32,
                    self.segment_bytes,
                    self.dir_id,
                )
                .await?;
                self.pool.borrow_mut().push(seg.path.clone());
            } else {
                self.disk
                    .remove_file(&seg.path)
                    .await
                    .map_err(io("remove"))?;
                removed = true;
            }
        }
        if removed {
            self.sync_wal_dir().await?;
        }
        Ok(doomed.len())
    }

    /// Removes pooled files beyond `pool_max` (the directory is not
    /// fsync'ed: the caller does). Returns whether it removed any.
    async fn trim_pool(&self, pool_max: usize) -> Result<bool, WalError> {
        let mut removed = false;
        loop {
            let extra = {
                let mut pool = self.pool.borrow_mut();
                if pool.len() <= pool_max {
                    break;
                }
                pool.pop()
            };
            let Some(path) = extra else { break };
            self.disk
                .remove_file(&path)
                .await
                .map_err(|source| WalError::Io {
                    op: "remove",
                    file: path.clone(),
                    offset: 0,
                    source,
                })?;
            removed = true;
        }
        Ok(removed)
    }

    async fn sync_wal_dir(&self) -> Result<(), WalError> {
        self.disk
            .sync_dir(&self.paths.wal_dir)
            .await
            .map_err(|source| WalError::Io {
                op: "fsync directory",
                file: self.paths.wal_dir.clone(),
                offset: 0,
                source,
            })
    }

    /// Forgets the file handle of a segment that is full and flushed.
    pub(super) fn close_before(&self, seq: u64) {
        self.files.borrow_mut().retain(|s, _| *s >= seq);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wal::format::{decode_record, decode_segment_header, record_size, Decoded};

    #[test]
    fn a_pooled_file_named_like_the_target_is_never_replaced() {
        use crate::io::sim::SimDisk;
        use crate::wal::segment::create_segment;
        let seg = 64 * 1024;
        let disk = SimDisk::new(1);
        let paths = ShardPaths::new(std::path::Path::new("/pool"), 0);
        disk.create_dir_all(&paths.wal_dir).expect("dir");
        compio::runtime::Runtime::new()
            .expect("runtime")
            .block_on(async {
                for seq in [5, 10, 11, 12] {
                    create_segment(&disk, &paths, seq, seg)
                        .await
                        .expect("create");
                }
                // Recovery handed out 10 for new writes; 5, 11 and 12 are
                // spares, two of them named like segments to come.
                let spares = [5, 11, 12].map(|s| paths.segment(s)).to_vec();
                let head = HeadState {
                    generation: 0,
                    seq: 0,
                    first_lsn: 0,
                    marked_lsn: 0,
                    dir_id: 0,
                };
                let files = SegmentFiles::open(
                    disk.clone(),
                    paths.clone(),
                    (seg, 7),
                    Vec::new(),
                    (10, true),
                    (false, None),
                    spares,
                    (None, head),
                )
                .await
                .expect("open");
                assert_eq!(files.make(11).await, Some(true));
                assert_eq!(files.make(12).await, Some(true));
                for seq in [10, 11, 12] {
                    assert!(disk.exists(&paths.segment(seq)), "segment {seq} is gone");
                    assert!(files.has_segment(seq));
                }
                assert_eq!(*files.pool.borrow(), vec![paths.segment(5)]);
            });
    }

    #[test]
    fn flushes_are_sealed_and_block_aligned() {
        let seg = 64 * 1024;
        let mut a = WalAppender::new(3, seg, 16 * 1024, 2000, 1);
        assert_eq!(a.reserve(record_size(3, 100)), (Reserve::Fits, false));
        a.append(1, 1, RecordKind::Put, b"abc", &[7; 100]);
        a.append(2, 1, RecordKind::Delete, b"abc", b"");
        let f = a.take().expect("flush");
        assert!(f.starts_segment);
        assert_eq!(
            (f.seq, f.offset, f.first_lsn, f.last_lsn, f.records),
            (1, 0, 1, 2, 2)
        );
        assert_eq!(f.buf.len() % BLOCK_BYTES, 0);
        let bytes = f.buf.as_slice();
        let h = decode_segment_header(&bytes[..BLOCK_BYTES])
            .expect("header")
            .expect("some");
        assert_eq!((h.shard, h.seq, h.first_lsn), (3, 1, 1));
        let Ok(Decoded::Record(r)) =
            decode_record(&bytes[BLOCK_BYTES..], bytes.len() - BLOCK_BYTES)
        else {
            panic!("first record");
        };
        assert!(r.is_first());
        // No spare until the flush comes back.
        a.reserve(record_size(1, 1));
        a.append(3, 2, RecordKind::Put, b"k", b"v");
        assert!(a.take().is_none());
        let next_offset = f.buf.len() as u64;
        a.give_back(f.buf);
        let g = a.take().expect("second flush");
        assert!(!g.starts_segment);
        assert_eq!(g.offset, next_offset);
    }

    #[test]
    fn full_buffer_and_segment_rollover() {
        let seg = 64 * 1024;
        let mut a = WalAppender::new(0, seg, 16 * 1024, 4000, 5);
        let mut lsn = 0;
        let mut flushes = Vec::new();
        let mut rolled = 0;
        for _ in 0..200 {
            let (r, moved) = a.reserve(record_size(8, 1000));
            rolled += moved as u32;
            if r == Reserve::Full {
                let f = a.take().expect("full buffer flushes");
                assert!(f.offset + f.buf.len() as u64 <= seg);
                assert!(f.buf.len() <= 16 * 1024 + 4096);
                let buf = AlignedBuf::with_capacity(f.buf.capacity());
                flushes.push((f.seq, f.offset, f.buf.len()));
                a.give_back(buf);
                let (r, moved) = a.reserve(record_size(8, 1000));
                rolled += moved as u32;
                assert_eq!(r, Reserve::Fits);
            }
            lsn += 1;
            a.append(lsn, 1, RecordKind::Put, b"12345678", &[1; 1000]);
        }
        assert!(
            rolled >= 2,
            "200 KB of records must span several 64 KiB segments"
        );
        // Flushes of one segment are contiguous and start at 0.
        let mut expect: BTreeMap<u64, u64> = BTreeMap::new();
        for (seq, offset, len) in flushes {
            let e = expect.entry(seq).or_insert(0);
            assert_eq!(*e, offset);
            *e += len as u64;
        }
    }
}
