//! Cold reads: the GETs (and delete answers and settling reads) whose
//! records must come from a device. A lookup leaves such a key as a
//! [`ColdKey`] in the tier's [`PendingCold`] set and hands the shard a
//! [`ColdGet`] whose ticket names it; [`read_cold`] is the one future that
//! answers a set of them: it reads every key's next candidate at once
//! (reads of adjacent blocks merged), tries the records read, and reads
//! again for keys whose candidate was another key's or longer than was
//! read, until each key has its answer. It borrows the tier only between
//! reads, so the shard serves other requests while it waits.

use super::index::KeyHash;
use super::log::{
    check_blocks, parse_record, DeviceSource, Parsed, ReadError, Record, RecordSpot, BLOCK, HOT,
};
use super::Inner;
use crate::histogram::AtomicHistogram;
use crate::io::{AlignedBuf, Disk, DiskFile};
use crate::tier::{ColdAnswer, ColdGet, ColdReads, ColdTicket};
use bytes::Bytes;
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;

/// Most settling reads queued or in flight per shard. Past it a put
/// reads its candidates itself; the shard holds writes back before that
/// ([`Tier::write_room`]).
pub(super) const SETTLES_MAX: usize = 4096;

/// The reads that settle blind writes made past the sets' bound.
pub(super) struct Settling<F> {
    /// Reads that settle the candidates of puts made past the unresolved
    /// set's bound, waiting for [`Tier::take_settles`].
    pub(super) settles: Vec<ColdKey<F>>,
    /// Settling reads queued or in flight (not finished yet): each holds
    /// an [`OpenSettle`], which counts it until it is dropped.
    pub(super) settles_open: std::rc::Rc<std::cell::Cell<usize>>,
    /// The last delete looked up past the sets' bound with an answer read
    /// counted among the settling reads: it may go blind.
    pub(super) blind_allowed: Option<u64>,
    /// Most settling reads open ([`SETTLES_MAX`]).
    pub(super) settles_max: usize,
    /// Settling reads finished.
    pub(super) settles_done: u64,
}

impl<F> Default for Settling<F> {
    fn default() -> Self {
        Settling {
            settles: Vec::new(),
            settles_open: Rc::new(Cell::new(0)),
            blind_allowed: None,
            settles_max: SETTLES_MAX,
            settles_done: 0,
        }
    }
}

/// A candidate record of a cold GET.
pub(super) struct ColdCand<F> {
    pub(super) addr: u32,
    pub(super) span: u8,
    /// An unresolved entry: the answer only if every candidate before it
    /// was read and is another key's.
    pub(super) unresolved: bool,
    pub(super) state: CandState<F>,
}

pub(super) enum CandState<F> {
    /// On the device: `blocks` are the checked payloads once read.
    Read {
        spot: RecordSpot,
        src: DeviceSource<F>,
        blocks: Option<Result<Vec<u8>, ReadError>>,
    },
    /// Found in RAM, but tried only after the candidates before it.
    Known(Result<Record, ReadError>),
}

/// Where a candidate's record is.
pub(super) enum Where<F> {
    Ram(Result<Record, ReadError>),
    Device(RecordSpot, DeviceSource<F>),
}

/// A GET waiting for device reads (what a [`ColdGet`]'s ticket names).
pub(super) struct ColdKey<F> {
    pub(super) key: Bytes,
    pub(super) hash: u64,
    /// The tier's clock when the GET was looked up.
    pub(super) now_ms: u64,
    /// Candidates still to try, in order; the first is the one read next.
    pub(super) cands: VecDeque<ColdCand<F>>,
    /// Why an earlier candidate could not be read (the key may be there).
    pub(super) failed: Option<String>,
    /// Device reads done for this GET and their bytes, not counted yet (a
    /// merged read counts once, for the first GET it served).
    pub(super) reads: u64,
    /// Of `reads`, those of hot segments.
    pub(super) hot_reads: u64,
    pub(super) bytes: u64,
    /// The read answers a delete that was applied blind, or settles a
    /// put's candidates: the key's record it finds is dead (older than
    /// the delete or the put), and its entry goes.
    pub(super) settle: bool,
    /// A settling read of a put; no one waits for its answer.
    pub(super) background: bool,
    /// The newest record of the key found so far among unresolved
    /// candidates (by LSN, see `Inner::is_newer`), its address and whether
    /// it may be cached: the answer once every candidate is read. A
    /// settling read keeps it from any candidate (every record of the key
    /// it finds is dead; the newest tells whether the key was live).
    pub(super) best: Option<(u32, Record, bool)>,
    /// Counted in `settles_open` (a put's settling read, or the answer
    /// read of a delete applied blind past the sets' bound) until dropped.
    pub(super) counted: Option<OpenSettle>,
}

/// One open settling read, counted until dropped (finished, or abandoned:
/// a delete looked up again when its WAL record did not fit).
pub(super) struct OpenSettle(std::rc::Rc<std::cell::Cell<usize>>);

impl OpenSettle {
    pub(super) fn new(open: &std::rc::Rc<std::cell::Cell<usize>>) -> OpenSettle {
        open.set(open.get() + 1);
        OpenSettle(open.clone())
    }
}

impl Drop for OpenSettle {
    fn drop(&mut self) {
        self.0.set(self.0.get() - 1);
    }
}

/// Where a cold read's answer goes: (its index, whether it answers a
/// delete), as in [`ColdGet`].
pub(super) type Placed = (usize, bool);

/// Most blocks one merged GET read covers (256 KiB).
const MERGE_BLOCKS: u64 = 64;

/// The cold reads a tier owes: the keys its [`ColdGet`]s name, by ticket
/// number, until [`read_cold`] takes them (or their tickets are dropped).
pub(super) struct PendingCold<F> {
    next: Cell<u64>,
    keys: RefCell<HashMap<u64, ColdKey<F>>>,
}

impl<F: DiskFile> PendingCold<F> {
    pub(super) fn new() -> Rc<PendingCold<F>> {
        Rc::new(PendingCold {
            next: Cell::new(0),
            keys: RefCell::new(HashMap::new()),
        })
    }

    /// Holds `ck` until it is read: the [`ColdGet`] that names it.
    pub(super) fn hold(self: &Rc<Self>, ck: ColdKey<F>, index: usize, delete: bool) -> ColdGet {
        let id = self.next.get();
        self.next.set(id + 1);
        self.keys.borrow_mut().insert(id, ck);
        ColdGet {
            index,
            delete,
            ticket: ColdTicket::new(id, Rc::clone(self) as Rc<dyn ColdReads>),
        }
    }

    /// Takes the keys `gets` name, each with where its answer goes.
    pub(super) fn take(self: &Rc<Self>, gets: Vec<ColdGet>) -> Vec<(Placed, Box<ColdKey<F>>)> {
        let set = Rc::clone(self) as Rc<dyn ColdReads>;
        gets.into_iter()
            .map(|g| {
                let id = g.ticket.redeem(&set);
                let ck = self
                    .keys
                    .borrow_mut()
                    .remove(&id)
                    .expect("a ticket names a read its set holds");
                ((g.index, g.delete), Box::new(ck))
            })
            .collect()
    }
}

impl<F: DiskFile> ColdReads for PendingCold<F> {
    /// Dropping the key drops its [`OpenSettle`] too: a read counted
    /// against the settling bound stops counting.
    fn forget(&self, id: u64) {
        self.keys.borrow_mut().remove(&id);
    }
}

/// A test hook: a cold read given one waits, once its first device reads
/// are done, until the hold is released, so a test can apply writes and
/// GC between a cold GET's device read and its answer.
#[derive(Clone, Default)]
pub struct ReadHold(Rc<HoldState>);

#[derive(Default)]
struct HoldState {
    /// The read reached the hold (its device reads are done).
    reached: Cell<bool>,
    released: Cell<bool>,
    waker: RefCell<Option<std::task::Waker>>,
}

impl ReadHold {
    /// Whether the read got as far as the hold.
    pub fn reached(&self) -> bool {
        self.0.reached.get()
    }

    /// Lets the read go on.
    pub fn release(&self) {
        self.0.released.set(true);
        if let Some(w) = self.0.waker.borrow_mut().take() {
            w.wake();
        }
    }

    async fn wait(&self) {
        self.0.reached.set(true);
        std::future::poll_fn(|cx| {
            if self.0.released.get() {
                std::task::Poll::Ready(())
            } else {
                *self.0.waker.borrow_mut() = Some(cx.waker().clone());
                std::task::Poll::Pending
            }
        })
        .await
    }
}

/// Answers `keys` (taken from the tier's [`PendingCold`]): reads, tries
/// the records read, and reads again until every key has its answer.
/// Borrows the tier only between reads. Then raises the tier's room
/// signal: reads counted against the settling bound are done.
pub(super) async fn read_cold<D: Disk>(
    inner: Rc<RefCell<Inner<D>>>,
    mut keys: Vec<(Placed, Box<ColdKey<D::File>>)>,
    mut hold: Option<ReadHold>,
) -> Vec<(usize, ColdAnswer)> {
    let latency = inner.borrow().settings.read_latency_us.clone();
    let mut answers = Vec::with_capacity(keys.len());
    while !keys.is_empty() {
        read_blocks(&mut keys, &latency).await;
        if let Some(hold) = hold.take() {
            hold.wait().await;
        }
        let mut again = Vec::new();
        let mut st = inner.borrow_mut();
        for ((index, delete), ck) in keys {
            let background = ck.background;
            match st.finish_one(ck) {
                Ok(answer) => {
                    if background {
                        st.settling.settles_done += 1;
                    }
                    answers.push((index, answer));
                }
                Err(ck) => again.push(((index, delete), ck)),
            }
        }
        keys = again;
    }
    // Only wakes: no waiting task runs inside this borrow.
    inner.borrow().room.notify();
    answers
}

/// Reads the next candidate of every key in `keys` that waits for one,
/// merged into as few reads as [`merge_reads`] makes, all at once, and
/// leaves each key's checked blocks (or why they could not be read) in
/// its candidate.
async fn read_blocks<F: DiskFile>(
    keys: &mut [(Placed, Box<ColdKey<F>>)],
    latency: &AtomicHistogram,
) {
    let merged = merge_reads(keys);
    let reads = merged.iter().map(|m| {
        let file = match keys[m.gets[0]].1.cands.front().map(|c| &c.state) {
            Some(CandState::Read { src, .. }) => std::rc::Rc::clone(&src.file),
            _ => unreachable!("only reads were wanted"),
        };
        let (offset, len) = (m.first * BLOCK as u64, (m.end - m.first) as usize * BLOCK);
        async move {
            let started = std::time::Instant::now();
            let (res, buf) = file.read_at(AlignedBuf::with_capacity(len), offset).await;
            (res, buf, started.elapsed())
        }
    });
    let done = futures::future::join_all(reads).await;
    for (m, (res, buf, took)) in merged.iter().zip(done) {
        latency.record(took.as_micros() as u64);
        let n = res.as_ref().map_or(0, |&n| n);
        if res.is_ok() {
            let first = &mut keys[m.gets[0]].1;
            first.reads += 1;
            first.bytes += n as u64;
            if let Some(CandState::Read { src, .. }) = first.cands.front().map(|c| &c.state) {
                first.hot_reads += u64::from(src.device == HOT);
            }
        }
        for &i in &m.gets {
            let Some(CandState::Read { spot, src, blocks }) =
                keys[i].1.cands.front_mut().map(|c| &mut c.state)
            else {
                unreachable!("only reads were wanted");
            };
            let lo = (spot.first - m.first) as usize * BLOCK;
            let hi = lo + spot.count as usize * BLOCK;
            let at = m.first * BLOCK as u64;
            *blocks = Some(match &res {
                Err(e) => Err(ReadError::Io {
                    file: src.path.clone(),
                    offset: at,
                    source: std::io::Error::new(e.kind(), e.to_string()),
                }),
                Ok(_) if n < hi => Err(ReadError::Corrupt {
                    file: src.path.clone(),
                    offset: at + n as u64,
                    reason: format!(
                        "the file ends {n} bytes into a {}-byte read",
                        buf.capacity()
                    ),
                }),
                Ok(_) => check_blocks(src.seq, spot.first, &src.path, &buf.as_slice()[lo..hi]),
            });
        }
    }
}

/// One device read a batch of cold GETs shares: blocks `first..end` of one
/// segment, for the GETs (indexes into the batch) whose next blocks lie in
/// it.
struct MergedRead {
    first: u64,
    end: u64,
    gets: Vec<usize>,
}

/// The reads a batch of cold GETs makes next: the blocks each needs, in
/// order; reads of the same segment whose blocks touch or overlap go as one
/// read, up to MERGE_BLOCKS blocks.
fn merge_reads<F>(keys: &[(Placed, Box<ColdKey<F>>)]) -> Vec<MergedRead> {
    // The blocks each GET needs next: (segment, first, end, GET).
    let mut wanted: Vec<(u64, u64, u64, usize)> = keys
        .iter()
        .enumerate()
        .filter_map(|(i, (_, ck))| match &ck.cands.front()?.state {
            CandState::Read {
                spot,
                src,
                blocks: None,
            } => Some((src.seq, spot.first, spot.first + spot.count, i)),
            _ => None,
        })
        .collect();
    wanted.sort_unstable();
    let mut merged: Vec<MergedRead> = Vec::new();
    let mut last_seq = None;
    for (seq, first, end, i) in wanted {
        match merged.last_mut() {
            Some(m)
                if last_seq == Some(seq)
                    && first <= m.end
                    && end.max(m.end) - m.first <= MERGE_BLOCKS =>
            {
                m.end = m.end.max(end);
                m.gets.push(i);
            }
            _ => merged.push(MergedRead {
                first,
                end,
                gets: vec![i],
            }),
        }
        last_seq = Some(seq);
    }
    merged
}

impl<D: Disk> Inner<D> {
    /// Answers a cold GET whose next candidate was read, or hands it back
    /// for another read.
    fn finish_one(
        &mut self,
        mut ck: Box<ColdKey<D::File>>,
    ) -> Result<ColdAnswer, Box<ColdKey<D::File>>> {
        self.log.reads += std::mem::take(&mut ck.reads);
        self.log.hot_reads += std::mem::take(&mut ck.hot_reads);
        self.log.bytes_read += std::mem::take(&mut ck.bytes);
        loop {
            match ck.cands.front() {
                None => break,
                // Its turn, and not read yet.
                Some(ColdCand {
                    state: CandState::Read { blocks: None, .. },
                    ..
                }) => return Err(ck),
                Some(_) => {}
            }
            let cand = ck.cands.pop_front().expect("looked at");
            let (addr, unresolved) = (cand.addr, cand.unresolved);
            let Some((record, cacheable)) = self.candidate_record(&mut ck, cand) else {
                continue;
            };
            match record {
                Ok(r)
                    if r.key == ck.key
                        && unresolved
                        && ck.failed.is_some()
                        && ck.best.is_none() =>
                {
                    // An earlier candidate could not be read and may be
                    // the key's newer record.
                    break;
                }
                Ok(r) if r.key == ck.key => {
                    if ck.settle {
                        // A blind delete's answer, or a put's settling
                        // read: the record is dead now, and so is every
                        // other one of the key among the candidates
                        // (reading them all leaves the key no unresolved
                        // entry, so it leaves the deleted-key set).
                        if cacheable {
                            self.settle_deleted(ck.hash, addr, !unresolved, &r);
                        }
                    } else if !unresolved {
                        // Settled: the key's newest record.
                        return Ok(Ok(self.answer_cold(&ck, addr, r, cacheable)));
                    }
                    let newer = ck
                        .best
                        .as_ref()
                        .is_none_or(|(b, br, _)| self.is_newer(addr, &r, *b, br));
                    if newer {
                        ck.best = Some((addr, r, cacheable));
                    }
                }
                Ok(r) => {
                    if let Err(e) = self.check_dangling(KeyHash::new(ck.hash), addr, &r) {
                        self.faults
                            .warn(self.settings.shard, "a candidate entry dangles", &e);
                        ck.failed.get_or_insert(e.to_string());
                    }
                }
                Err(e) => {
                    self.faults.warn(
                        self.settings.shard,
                        "a candidate record could not be read",
                        &e,
                    );
                    ck.failed.get_or_insert(e.to_string());
                }
            }
        }
        // The newest record of the key found; one that failed after it (at
        // an older place) is taken for older: its LSN is not known. (With
        // a hot device place does not order records: the read fails.)
        if ck.failed.is_some() && !self.place_orders() {
            ck.best = None;
        }
        if let Some((addr, r, cacheable)) = ck.best.take() {
            let cacheable = cacheable && !ck.settle;
            return Ok(Ok(self.answer_cold(&ck, addr, r, cacheable)));
        }
        Ok(match ck.failed {
            Some(reason) => {
                self.faults.read_error_count += 1;
                Err(reason)
            }
            None => Ok(None),
        })
    }

    /// A cold GET's answer from the key's record `r` at `addr`, caching it
    /// if `cacheable` and the index still points at it (a write since the
    /// lookup moved the key on, or GC removed the segment and its slot was
    /// reused).
    fn answer_cold(
        &mut self,
        ck: &ColdKey<D::File>,
        addr: u32,
        r: Record,
        cacheable: bool,
    ) -> Option<Bytes> {
        if cacheable && self.index.find_addr(KeyHash::new(ck.hash), addr).is_some() {
            self.cache.insert(addr, r.clone());
            self.maybe_promote(ck.hash, addr, &r);
        }
        r.expires_at_ms
            .is_none_or(|at| at > ck.now_ms)
            .then_some(r.value)
    }

    /// The record of a candidate taken from the front of `ck`: known
    /// already, or parsed from the blocks read for it, and whether it may be
    /// cached (its segment is still the one read). `None` when the read was
    /// short: the candidate went back to the front, to be read whole.
    fn candidate_record(
        &mut self,
        ck: &mut ColdKey<D::File>,
        cand: ColdCand<D::File>,
    ) -> Option<(Result<Record, ReadError>, bool)> {
        let ColdCand {
            addr,
            span,
            unresolved,
            state,
        } = cand;
        Some(match state {
            CandState::Known(r) => (r, false),
            CandState::Read {
                mut spot,
                src,
                blocks,
            } => {
                let parsed = blocks.expect("read").and_then(|payloads| {
                    self.log
                        .remember_read(spot.slot, src.seq, spot.first, &payloads);
                    parse_record(&payloads, &spot, self.log.segment_bytes(), &src.path)
                });
                let same_segment = self.log.seq_of_slot(spot.slot) == Some(src.seq);
                let record = match parsed {
                    Ok(Parsed::Record(r)) => Ok(r),
                    Ok(Parsed::NeedBlocks(count)) => {
                        if same_segment
                            && self
                                .log
                                .device_source(spot.slot, spot.first, count)
                                .is_none()
                        {
                            // The rest is still in the unwritten tail.
                            self.log.read(addr, span)
                        } else {
                            // Read again, whole this time.
                            spot.count = count;
                            ck.cands.push_front(ColdCand {
                                addr,
                                span,
                                unresolved,
                                state: CandState::Read {
                                    spot,
                                    src,
                                    blocks: None,
                                },
                            });
                            return None;
                        }
                    }
                    Err(e) => Err(e),
                };
                (record, same_segment)
            }
        })
    }
}
