//! One test per row of the recovery decision table
//! (`ringkv_engine::wal::recovery::RecoveryCase`). WAL logs are built with the
//! engine's own append buffer (`WalAppender`), so they are byte-for-byte
//! what the flusher writes, and then damaged on purpose; snapshot rows use
//! a real engine that checkpointed.

mod common;

use bytes::Bytes;
use common::*;
use ringkv_engine::io::sim::{SimDisk, SimFaults, SimFile};
use ringkv_engine::io::{AlignedBuf, Disk, DiskFile};
use ringkv_engine::layout::ShardPaths;
use ringkv_engine::wal::format::{
    encode_segment_header, record_size, RecordKind, SegmentHeader, BLOCK_BYTES,
};
use ringkv_engine::wal::recovery::{recover, Recovered, RecoveryCase, RecoveryConfig};
use ringkv_engine::wal::writer::{Reserve, WalAppender};
use ringkv_engine::{Damage, Engine, EngineError, SnapshotError, WalError};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tunables::Durability;

const SEG: u64 = 64 * 1024;
const ROOT: &str = "/r";

fn paths() -> ShardPaths {
    ShardPaths::new(Path::new(ROOT), 0)
}

fn cfg() -> RecoveryConfig {
    RecoveryConfig {
        shard: 0,
        segment_bytes: SEG,
        dir_id: 0,
    }
}

/// Where one flush landed.
#[derive(Debug, Clone, Copy)]
struct FlushAt {
    seq: u64,
    offset: u64,
    len: u64,
}

/// Writes a WAL exactly as the shard's flusher does.
struct LogBuilder {
    disk: SimDisk,
    paths: ShardPaths,
    appender: WalAppender,
    files: BTreeMap<u64, SimFile>,
    next_lsn: u64,
    flushes: Vec<FlushAt>,
    /// Segments whose file is recycled (their first flush says so).
    recycled: std::collections::BTreeSet<u64>,
}

impl LogBuilder {
    fn new(disk: &SimDisk, first_seq: u64, first_lsn: u64) -> LogBuilder {
        let paths = paths();
        disk.create_dir_all(&paths.wal_dir).expect("dir");
        disk.create_dir_all(&paths.snapshot_dir).expect("dir");
        LogBuilder {
            disk: disk.clone(),
            appender: WalAppender::new(0, SEG, 16 * 1024, record_size(64, 4096), first_seq),
            paths,
            files: BTreeMap::new(),
            next_lsn: first_lsn,
            flushes: Vec::new(),
            recycled: Default::default(),
        }
    }

    async fn file(&mut self, seq: u64) -> &SimFile {
        if !self.files.contains_key(&seq) {
            let path = self.paths.segment(seq);
            let f = self.disk.open(&path, true).await.expect("create");
            f.allocate_zeroed(SEG).await.expect("allocate");
            f.sync_data().await.expect("sync");
            self.disk
                .sync_dir(&self.paths.wal_dir)
                .await
                .expect("sync dir");
            self.files.insert(seq, f);
        }
        &self.files[&seq]
    }

    /// Appends a put of `key` -> `value(key, version)`, flushing first when
    /// the buffer is full.
    async fn put(&mut self, k: u64, version: u64) {
        let (key, val) = (key(k), value(k, version));
        if self.appender.reserve(record_size(key.len(), val.len())).0 == Reserve::Full {
            self.flush().await;
            assert_eq!(
                self.appender.reserve(record_size(key.len(), val.len())).0,
                Reserve::Fits
            );
        }
        self.appender
            .append(self.next_lsn, version, RecordKind::Put, &key, &val);
        self.next_lsn += 1;
    }

    /// Seals and writes the open buffer (only `keep_blocks` of its blocks,
    /// listed by index, when given: a torn write).
    async fn write_flush(&mut self, keep_blocks: Option<&[usize]>) -> FlushAt {
        let flush = self.appender.take().expect("records to flush");
        let at = FlushAt {
            seq: flush.seq,
            offset: flush.offset,
            len: flush.buf.len() as u64,
        };
        let mut buf = flush.buf;
        if at.offset == 0 && self.recycled.contains(&at.seq) {
            ringkv_engine::wal::format::set_segment_header_flags(
                &mut buf.as_mut_slice()[..BLOCK_BYTES],
                ringkv_engine::wal::format::SEGMENT_FLAG_RECYCLED,
            );
        }
        let file = self.file(at.seq).await;
        match keep_blocks {
            None => {
                let (r, b) = file.write_at(buf, at.offset).await;
                r.expect("write");
                file.sync_data().await.expect("sync");
                self.appender.give_back(b);
            }
            Some(blocks) => {
                for &i in blocks {
                    let mut one = AlignedBuf::with_capacity(BLOCK_BYTES);
                    one.extend_from_slice(&buf.as_slice()[i * BLOCK_BYTES..(i + 1) * BLOCK_BYTES]);
                    let (r, _) = file
                        .write_at(one, at.offset + (i * BLOCK_BYTES) as u64)
                        .await;
                    r.expect("write");
                }
                file.sync_data().await.expect("sync");
                self.appender.give_back(buf);
            }
        }
        self.flushes.push(at);
        at
    }

    async fn flush(&mut self) -> FlushAt {
        self.write_flush(None).await
    }

    fn segment_path(&self, seq: u64) -> PathBuf {
        self.paths.segment(seq)
    }
}

fn get(r: &Recovered, k: u64) -> Option<Bytes> {
    let key = key(k);
    r.tier.get(ringkv_engine::hash::fnv1a64(&key), &key)
}

fn wal_corrupt(err: &EngineError) -> (&Path, u64, &Damage) {
    match err.root() {
        EngineError::Wal(WalError::Corrupt {
            file,
            offset,
            reason,
        }) => (file, *offset, reason),
        other => panic!("expected WalError::Corrupt, got {other}"),
    }
}

/// Builds records 1..=n (keys 0..n, version = lsn) in flushes of `per_flush`.
async fn build(disk: &SimDisk, n: u64, per_flush: u64) -> LogBuilder {
    let mut log = LogBuilder::new(disk, 1, 1);
    for lsn in 1..=n {
        log.put(lsn - 1, lsn).await;
        if lsn % per_flush == 0 {
            log.flush().await;
        }
    }
    if log.appender.has_records() {
        log.flush().await;
    }
    log
}

#[test]
fn no_wal_starts_empty_with_a_fresh_segment() {
    block_on(async {
        let disk = SimDisk::new(1);
        disk.create_dir_all(&paths().wal_dir).expect("dir");
        disk.create_dir_all(&paths().snapshot_dir).expect("dir");
        let r = recover(&disk, &paths(), cfg()).await.expect("recover");
        assert!(r.cases.contains(&RecoveryCase::NoWal));
        assert_eq!((r.last_lsn, r.next_segment_seq), (0, 1));
        assert_eq!(disk.file_len(&paths().segment(1)), Some(SEG));
    });
}

#[test]
fn complete_flushes_replay_to_a_clean_end() {
    block_on(async {
        let disk = SimDisk::new(2);
        build(&disk, 30, 10).await;
        let r = recover(&disk, &paths(), cfg()).await.expect("recover");
        assert_eq!(r.last_lsn, 30);
        assert_eq!(r.records_replayed, 30);
        assert_eq!(
            r.cases
                .iter()
                .filter(|c| **c == RecoveryCase::FlushReplayed)
                .count(),
            3
        );
        assert!(r.cases.contains(&RecoveryCase::CleanEnd));
        assert!(!r.cases.contains(&RecoveryCase::TornTail));
        for k in 0..30 {
            assert_eq!(get(&r, k), Some(value(k, k + 1)));
        }
        // New writes go to a fresh segment.
        assert_eq!(r.next_segment_seq, 2);
    });
}

#[test]
fn rollover_continues_in_the_next_segment() {
    block_on(async {
        let disk = SimDisk::new(3);
        let log = build(&disk, 400, 7).await;
        let segments: std::collections::BTreeSet<u64> = log.flushes.iter().map(|f| f.seq).collect();
        assert!(
            segments.len() >= 3,
            "the log must span segments: {segments:?}"
        );
        let r = recover(&disk, &paths(), cfg()).await.expect("recover");
        assert_eq!(r.last_lsn, 400);
        assert_eq!(
            r.cases
                .iter()
                .filter(|c| **c == RecoveryCase::Rollover)
                .count(),
            segments.len() - 1
        );
        assert_eq!(r.live_segments.len(), segments.len());
        for k in 0..400 {
            assert_eq!(get(&r, k), Some(value(k, k + 1)), "key {k}");
        }
    });
}

#[test]
fn torn_tail_is_truncated_durably_and_never_replayed() {
    for keep in [&[0usize][..], &[0, 2], &[1, 2], &[2]] {
        block_on(async {
            let disk = SimDisk::new(4);
            let mut log = build(&disk, 20, 10).await;
            // A flush of three blocks of which only `keep` reached the disk.
            for k in 100..103 {
                let (key, val) = (key(k), Bytes::from(vec![b'x'; 3000]));
                log.appender.reserve(record_size(key.len(), val.len()));
                log.appender
                    .append(log.next_lsn, 1, RecordKind::Put, &key, &val);
                log.next_lsn += 1;
            }
            let torn = log.write_flush(Some(keep)).await;
            assert_eq!(torn.len, 3 * BLOCK_BYTES as u64);
            let r = recover(&disk, &paths(), cfg()).await.expect("recover");
            assert!(
                r.cases.contains(&RecoveryCase::TornTail),
                "{keep:?}: {:?}",
                r.cases
            );
            assert_eq!(r.last_lsn, 20, "{keep:?}");
            for k in 0..20 {
                assert_eq!(get(&r, k), Some(value(k, k + 1)));
            }
            for k in 100..103 {
                assert_eq!(
                    get(&r, k),
                    None,
                    "{keep:?}: a torn flush must not be replayed"
                );
            }
            // Recovery wrote nothing over the log: recovering again gives the
            // same answer, and the log goes on in the next segment.
            let next_seq = r.next_segment_seq;
            assert!(next_seq > torn.seq);
            drop(r);
            let again = recover(&disk, &paths(), cfg())
                .await
                .expect("recover again");
            assert_eq!(again.last_lsn, 20);
            assert_eq!(again.next_segment_seq, next_seq);
            drop(again);
            let mut more = LogBuilder::new(&disk, next_seq, 21);
            for k in 200..205 {
                more.put(k, 1).await;
            }
            more.flush().await;
            let third = recover(&disk, &paths(), cfg())
                .await
                .expect("recover after new writes");
            assert!(
                third.cases.contains(&RecoveryCase::Rollover),
                "{:?}",
                third.cases
            );
            assert_eq!(third.last_lsn, 25);
            for k in 100..103 {
                assert_eq!(
                    get(&third, k),
                    None,
                    "{keep:?}: the torn flush stays unreplayed"
                );
            }
            assert_eq!(get(&third, 204), Some(value(204, 1)));
        });
    }
}

/// Fills the open segment until the next record rolls over, then writes
/// the first flush of the new segment keeping only `keep` blocks.
async fn tear_first_flush_of_next_segment(log: &mut LogBuilder, keep: &[usize]) -> (FlushAt, u64) {
    let mut lsn_before = log.next_lsn - 1;
    loop {
        let (key, val) = (key(7), Bytes::from(vec![b'y'; 2000]));
        let (res, moved) = log.appender.reserve(record_size(key.len(), val.len()));
        if res == Reserve::Full {
            log.flush().await;
            lsn_before = log.next_lsn - 1;
            continue;
        }
        log.appender
            .append(log.next_lsn, 1, RecordKind::Put, &key, &val);
        log.next_lsn += 1;
        if moved {
            break;
        }
    }
    (log.write_flush(Some(keep)).await, lsn_before)
}

#[test]
fn torn_first_flush_without_its_header_leaves_an_unused_segment() {
    block_on(async {
        let disk = SimDisk::new(5);
        let mut log = build(&disk, 400, 7).await;
        let last_seq = log.flushes.last().expect("flushes").seq;
        let (torn, lsn_before) = tear_first_flush_of_next_segment(&mut log, &[1]).await;
        assert_eq!((torn.seq, torn.offset), (last_seq + 1, 0));
        let r = recover(&disk, &paths(), cfg()).await.expect("recover");
        assert_eq!(r.last_lsn, lsn_before);
        // Its header never landed: the segment is unused and takes the
        // next flush; the torn bytes after block 0 are never read.
        assert_eq!(r.next_segment_seq, torn.seq, "{:?}", r.cases);
        assert!(r.cases.contains(&RecoveryCase::UnusedSegmentReused));
        drop(r);
        let mut more = LogBuilder::new(&disk, torn.seq, lsn_before + 1);
        more.put(300, 9).await;
        more.flush().await;
        let again = recover(&disk, &paths(), cfg()).await.expect("recover");
        assert_eq!(again.last_lsn, lsn_before + 1);
        assert_eq!(get(&again, 300), Some(value(300, 9)));
    });
}

#[test]
fn torn_first_flush_with_its_header_is_recycled() {
    block_on(async {
        let disk = SimDisk::new(17);
        let mut log = build(&disk, 400, 7).await;
        let (torn, lsn_before) = tear_first_flush_of_next_segment(&mut log, &[0]).await;
        let r = recover(&disk, &paths(), cfg()).await.expect("recover");
        assert!(r.cases.contains(&RecoveryCase::TornTail), "{:?}", r.cases);
        assert!(
            r.cases.contains(&RecoveryCase::SegmentRecycled),
            "{:?}",
            r.cases
        );
        assert_eq!(r.last_lsn, lsn_before);
        // It was prepared and renamed into place as the next segment.
        assert_eq!(r.next_segment_seq, torn.seq + 1);
        assert!(r.next_segment_recycled);
        assert_eq!(disk.file_len(&log.segment_path(torn.seq)), None);
    });
}

#[test]
fn damage_followed_by_a_complete_flush_refuses_naming_file_and_offset() {
    block_on(async {
        let disk = SimDisk::new(6);
        let log = build(&disk, 30, 10).await;
        let second = log.flushes[1];
        let path = log.segment_path(second.seq);
        disk.corrupt(&path, second.offset + 100, 1);
        let err = recover(&disk, &paths(), cfg())
            .await
            .err()
            .expect("must refuse");
        let (file, offset, reason) = wal_corrupt(&err);
        assert_eq!(file, path);
        assert_eq!(
            offset, second.offset,
            "damage is reported at the damaged record"
        );
        assert!(
            matches!(reason, Damage::ValidFlushAfterDamage { offset, .. } if *offset == log.flushes[2].offset)
        );
        let text = err.to_string();
        assert!(
            text.contains(&path.display().to_string()) && text.contains(&second.offset.to_string()),
            "{text}"
        );
        // The same through the engine: open refuses.
        let mut config = small_config(Path::new(ROOT), 1, Durability::Sync);
        config.storage.checkpoint_wal_bytes = tunables::ByteSize::mib(64);
        ringkv_engine::manifest::store(
            &disk,
            Path::new(ROOT),
            &ringkv_engine::manifest::Manifest::current(
                1,
                tunables::Tier::Memory,
                ringkv_engine::hash::TableHasher::LEGACY,
            ),
        )
        .await
        .expect("manifest");
        let err = Engine::open_with_disk(&config, disk.clone()).expect_err("open must refuse");
        assert!(
            matches!(err.root(), EngineError::Wal(WalError::Corrupt { .. })),
            "{err}"
        );
    });
}

/// A flush sealed but not written: where it goes and its bytes.
struct Sealed {
    at: FlushAt,
    bytes: Vec<u8>,
}

impl LogBuilder {
    /// Appends `n` puts of 3,000-byte values (keys from `first_key`, at
    /// version 7) and seals them as one flush submitted while the records
    /// up to `durable` are durable (`None`: nothing else in flight), as
    /// the flusher does with several flushes in flight. Nothing is written.
    fn seal_in_flight(&mut self, first_key: u64, n: u64, durable: Option<u64>) -> Sealed {
        for k in first_key..first_key + n {
            let (key, val) = (key(k), Bytes::from(vec![b'w'; 3000]));
            assert_eq!(
                self.appender.reserve(record_size(key.len(), val.len())).0,
                Reserve::Fits
            );
            self.appender
                .append(self.next_lsn, 7, RecordKind::Put, &key, &val);
            self.next_lsn += 1;
        }
        let flush = self.appender.take_after(durable).expect("records");
        let at = FlushAt {
            seq: flush.seq,
            offset: flush.offset,
            len: flush.buf.len() as u64,
        };
        let bytes = flush.buf.as_slice().to_vec();
        self.appender.give_back(flush.buf);
        self.flushes.push(at);
        Sealed { at, bytes }
    }

    /// Writes the blocks of `sealed` listed in `keep` (all of them for
    /// `None`) and syncs: what a crash left of one in-flight flush.
    async fn land(&mut self, sealed: &Sealed, keep: Option<&[usize]>) {
        let blocks = sealed.bytes.len() / BLOCK_BYTES;
        let all: Vec<usize> = (0..blocks).collect();
        let file = self.file(sealed.at.seq).await;
        for &i in keep.unwrap_or(&all) {
            let mut one = AlignedBuf::with_capacity(BLOCK_BYTES);
            one.extend_from_slice(&sealed.bytes[i * BLOCK_BYTES..(i + 1) * BLOCK_BYTES]);
            let (r, _) = file
                .write_at(one, sealed.at.offset + (i * BLOCK_BYTES) as u64)
                .await;
            r.expect("write");
        }
        file.sync_data().await.expect("sync");
    }
}

/// What of each of three in-flight flushes reached the disk.
#[derive(Debug, Clone, Copy)]
enum Landed {
    Nothing,
    FirstBlock,
    LastBlock,
    All,
}

impl Landed {
    fn keep(self, sealed: &Sealed) -> Option<Vec<usize>> {
        let blocks = sealed.bytes.len() / BLOCK_BYTES;
        match self {
            Landed::Nothing => Some(vec![]),
            Landed::FirstBlock => Some(vec![0]),
            Landed::LastBlock => Some(vec![blocks - 1]),
            Landed::All => None,
        }
    }
}

#[test]
fn a_torn_in_flight_window_is_truncated_and_erased() {
    use Landed::*;
    // Records 1..=20 durable, then three flushes in flight at once
    // (21..=23, 24..=26, 27..=29), all submitted while 20 was the durable
    // LSN; the crash kept some subset of their blocks.
    for landed in [
        [Nothing, All, All],
        [FirstBlock, All, All],
        [LastBlock, Nothing, All],
        [Nothing, FirstBlock, All],
        [All, Nothing, All],
        [All, LastBlock, All],
    ] {
        block_on(async {
            let disk = SimDisk::new(40);
            let mut log = build(&disk, 20, 10).await;
            let window: Vec<Sealed> = (0..3)
                .map(|i| log.seal_in_flight(100 + 3 * i, 3, Some(20)))
                .collect();
            for (sealed, l) in window.iter().zip(landed) {
                log.land(sealed, l.keep(sealed).as_deref()).await;
            }
            let expect_last = if matches!(landed[0], All) { 23 } else { 20 };
            let r = recover(&disk, &paths(), cfg()).await.expect("recover");
            assert!(
                r.cases.contains(&RecoveryCase::TornWindow),
                "{landed:?}: {:?}",
                r.cases
            );
            assert_eq!(r.last_lsn, expect_last, "{landed:?}");
            for k in 0..20 {
                assert_eq!(get(&r, k), Some(value(k, k + 1)));
            }
            for k in 100 + (expect_last - 20)..109 {
                assert_eq!(
                    get(&r, k),
                    None,
                    "{landed:?}: key {k} of the window replayed"
                );
            }
            // The window's flushes were erased: the durable image holds
            // zeroes where they were, so their LSNs can be reused.
            let image = disk.read_durable(&log.segment_path(1)).expect("segment");
            let last = window[2].at;
            let end = (last.offset + last.len) as usize;
            assert!(
                image[end - BLOCK_BYTES..end].iter().all(|&b| b == 0),
                "{landed:?}"
            );
            let next_seq = r.next_segment_seq;
            drop(r);
            // A second recovery decides the same, and the log goes on at
            // the first missing LSN in the next segment.
            let again = recover(&disk, &paths(), cfg()).await.expect("again");
            assert_eq!(again.last_lsn, expect_last, "{landed:?}");
            drop(again);
            let mut more = LogBuilder::new(&disk, next_seq, expect_last + 1);
            for k in 200..205 {
                more.put(k, 1).await;
            }
            more.flush().await;
            let third = recover(&disk, &paths(), cfg()).await.expect("third");
            assert!(
                third.cases.contains(&RecoveryCase::Rollover),
                "{:?}",
                third.cases
            );
            assert_eq!(third.last_lsn, expect_last + 5);
            assert_eq!(get(&third, 204), Some(value(204, 1)));
            assert_eq!(get(&third, 108), None, "{landed:?}");
        });
    }
}

#[test]
fn a_flush_submitted_after_the_hole_was_durable_refuses() {
    block_on(async {
        let disk = SimDisk::new(41);
        let mut log = build(&disk, 20, 10).await;
        // 21..=23 and 24..=26 in flight together; 27..=29 submitted once
        // 21..=23 was durable, so its seal proves LSN 21 had been durable
        // (and maybe acknowledged): losing it is damage, not a torn window.
        let a = log.seal_in_flight(100, 3, Some(20));
        let b = log.seal_in_flight(103, 3, Some(20));
        let c = log.seal_in_flight(106, 3, Some(23));
        log.land(&a, Some(&[])).await;
        log.land(&b, None).await;
        log.land(&c, None).await;
        let err = recover(&disk, &paths(), cfg())
            .await
            .err()
            .expect("must refuse");
        let (file, offset, reason) = wal_corrupt(&err);
        assert_eq!(file, log.segment_path(1));
        assert_eq!(offset, a.at.offset, "the hole is named");
        assert!(
            matches!(reason, Damage::ValidFlushAfterDamage { offset, .. } if *offset == c.at.offset),
            "{reason:?}"
        );
        // Nothing was erased on the way to the refusal.
        let image = disk.read_durable(&log.segment_path(1)).expect("segment");
        let at = b.at.offset as usize;
        assert_eq!(&image[at..at + b.bytes.len()], &b.bytes[..]);
    });
}

#[test]
fn zeroed_flush_before_data_refuses() {
    block_on(async {
        let disk = SimDisk::new(7);
        let log = build(&disk, 30, 10).await;
        let second = log.flushes[1];
        let path = log.segment_path(second.seq);
        let f = disk.open(&path, false).await.expect("open");
        let mut zeros = AlignedBuf::with_capacity(second.len as usize);
        zeros.set_len(second.len as usize);
        let (r, _) = f.write_at(zeros, second.offset).await;
        r.expect("write");
        f.sync_data().await.expect("sync");
        let err = recover(&disk, &paths(), cfg())
            .await
            .err()
            .expect("must refuse");
        let (file, offset, _) = wal_corrupt(&err);
        assert_eq!((file, offset), (path.as_path(), second.offset));
    });
}

#[test]
fn lsn_gap_refuses() {
    block_on(async {
        let disk = SimDisk::new(8);
        let mut log = LogBuilder::new(&disk, 1, 1);
        for k in 0..3 {
            log.put(k, 1).await;
        }
        log.flush().await;
        log.next_lsn = 10;
        for k in 3..6 {
            log.put(k, 1).await;
        }
        let gap = log.flush().await;
        let err = recover(&disk, &paths(), cfg())
            .await
            .err()
            .expect("must refuse");
        let (_, offset, reason) = wal_corrupt(&err);
        assert_eq!(offset, gap.offset);
        assert_eq!(
            *reason,
            Damage::LsnGap {
                expected: 4,
                found: 10
            }
        );
    });
}

#[test]
fn missing_history_refuses() {
    block_on(async {
        let disk = SimDisk::new(9);
        let mut log = LogBuilder::new(&disk, 1, 5);
        log.put(1, 1).await;
        log.flush().await;
        let err = recover(&disk, &paths(), cfg())
            .await
            .err()
            .expect("must refuse");
        let (_, _, reason) = wal_corrupt(&err);
        assert_eq!(
            *reason,
            Damage::MissingHistory {
                needed_lsn: 1,
                first_lsn: 5,
                segment_before: 0,
            }
        );
    });
}

#[test]
fn unused_segments_after_the_end_are_reused_or_removed() {
    block_on(async {
        let disk = SimDisk::new(10);
        build(&disk, 10, 10).await;
        // A preallocated spare (seq 2) and a short, half-created one (seq 3).
        for (seq, len) in [(2u64, SEG), (3, 8192)] {
            let f = disk
                .open(&paths().segment(seq), true)
                .await
                .expect("create");
            f.allocate_zeroed(len).await.expect("allocate");
            f.sync_data().await.expect("sync");
        }
        disk.sync_dir(&paths().wal_dir).await.expect("sync dir");
        let r = recover(&disk, &paths(), cfg()).await.expect("recover");
        assert!(r.cases.contains(&RecoveryCase::UnusedSegmentReused));
        assert!(r.cases.contains(&RecoveryCase::UnusedSegmentRemoved));
        assert_eq!(r.next_segment_seq, 2);
        assert!(disk.file_len(&paths().segment(3)).is_none());
    });
}

#[test]
fn data_after_an_unused_segment_refuses() {
    block_on(async {
        let disk = SimDisk::new(11);
        let mut log = LogBuilder::new(&disk, 1, 1);
        for k in 0..5 {
            log.put(k, 1).await;
        }
        log.flush().await;
        let f = disk.open(&paths().segment(2), true).await.expect("create");
        f.allocate_zeroed(SEG).await.expect("allocate");
        f.sync_data().await.expect("sync");
        let mut later = LogBuilder::new(&disk, 3, 6);
        for k in 5..10 {
            later.put(k, 1).await;
        }
        later.flush().await;
        let err = recover(&disk, &paths(), cfg())
            .await
            .err()
            .expect("must refuse");
        let (_, _, reason) = wal_corrupt(&err);
        assert!(
            matches!(reason, Damage::UsedSegmentAfterUnused { file } if *file == paths().segment(3)),
            "{reason}"
        );
    });
}

#[test]
fn next_segment_starting_at_a_wrong_lsn_refuses() {
    block_on(async {
        let disk = SimDisk::new(18);
        let mut log = LogBuilder::new(&disk, 1, 1);
        for k in 0..5 {
            log.put(k, 1).await;
        }
        log.flush().await;
        // The next segment starts at 9: LSNs 6..8 are missing.
        let mut later = LogBuilder::new(&disk, 2, 9);
        later.put(5, 1).await;
        later.flush().await;
        let err = recover(&disk, &paths(), cfg())
            .await
            .err()
            .expect("must refuse");
        // Named where the log stops, with the segment that does not
        // continue it.
        let (file, _, reason) = wal_corrupt(&err);
        assert_eq!(file, paths().segment(1));
        assert_eq!(
            *reason,
            Damage::LogStopsBeforeNext {
                next: paths().segment(2),
                expected: 6,
                found: 9
            }
        );
    });
}

#[test]
fn stale_records_of_a_recycled_segment_are_never_replayed() {
    block_on(async {
        let disk = SimDisk::new(19);
        // Segment 1: keys 0..60 at versions 1..=60 (version = LSN).
        let log = build(&disk, 60, 6).await;
        // Segment 2 is a recycled copy of segment 1: a prepared header and
        // segment 1's flushes (all complete, all with older LSNs) after it.
        let image = disk.read_durable(&log.segment_path(1)).expect("segment 1");
        let f = disk.open(&paths().segment(2), true).await.expect("create");
        let mut buf = AlignedBuf::with_capacity(image.len());
        buf.extend_from_slice(&image);
        let (r, _) = f.write_at(buf, 0).await;
        r.expect("write");
        ringkv_engine::wal::segment::prepare_segment(&f, &paths().segment(2), 0, SEG, 0)
            .await
            .expect("prepare");
        // The log goes on in segment 2 (LSN 61..): newer versions of keys
        // 0..5, in one small flush; then a torn flush (LSN 67..).
        let mut more = LogBuilder::new(&disk, 2, 61);
        more.recycled.insert(2);
        for k in 0..6 {
            more.put(k, 1000 + k).await;
        }
        more.flush().await;
        let r = recover(&disk, &paths(), cfg()).await.expect("recover");
        assert_eq!(r.last_lsn, 66);
        assert!(r.cases.contains(&RecoveryCase::CleanEnd), "{:?}", r.cases);
        for k in 0..6 {
            assert_eq!(
                get(&r, k),
                Some(value(k, 1000 + k)),
                "stale record replayed for key {k}"
            );
        }
        for k in 6..60 {
            assert_eq!(get(&r, k), Some(value(k, k + 1)));
        }
        drop(r);
        for k in 100..103 {
            let (key, val) = (key(k), Bytes::from(vec![b'x'; 3000]));
            more.appender.reserve(record_size(key.len(), val.len()));
            more.appender
                .append(more.next_lsn, 1, RecordKind::Put, &key, &val);
            more.next_lsn += 1;
        }
        more.write_flush(Some(&[0])).await;
        let r = recover(&disk, &paths(), cfg()).await.expect("recover");
        assert!(r.cases.contains(&RecoveryCase::TornTail), "{:?}", r.cases);
        assert_eq!(r.last_lsn, 66);
        assert_eq!(get(&r, 100), None);
    });
}

// Guards: recovery makes durable what it read before it builds on it. A
// run killed inside `prepare_segment` (the prepared header written, its
// fdatasync not done) leaves a file whose page cache says "spare" and
// whose device still holds the header of the segment it was; recovery
// renames that spare into the log, and after a power loss the renamed
// file named its old segment, so the next start refused the directory.
#[test]
fn a_spare_prepared_but_not_synced_before_a_kill_survives_a_power_loss() {
    block_on(async {
        let disk = SimDisk::new(31);
        // The log lives in segment 2 (LSN 1..=10).
        let mut log = LogBuilder::new(&disk, 2, 1);
        for k in 0..10 {
            log.put(k, k + 1).await;
        }
        log.flush().await;
        // Segment 1, retired by a checkpoint: its durable header is still
        // the used one; the prepared header is only in the page cache.
        let path = paths().segment(1);
        let f = disk.open(&path, true).await.expect("create");
        f.allocate_zeroed(SEG).await.expect("allocate");
        let header = |h: &SegmentHeader| {
            let mut block = AlignedBuf::with_capacity(BLOCK_BYTES);
            block.set_len(BLOCK_BYTES);
            encode_segment_header(h, block.as_mut_slice());
            block
        };
        let used = SegmentHeader {
            shard: 0,
            seq: 1,
            first_lsn: 1,
            segment_bytes: SEG,
            flags: 0,
            dir_id: 0,
        };
        let (r, _) = f.write_at(header(&used), 0).await;
        r.expect("write");
        f.sync_data().await.expect("sync");
        disk.sync_dir(&paths().wal_dir).await.expect("sync dir");
        let (r, _) = f
            .write_at(header(&SegmentHeader::prepared(0, SEG, 0)), 0)
            .await;
        r.expect("write prepared header");
        drop(f);
        // The restart takes segment 1 as a spare and renames it to 3.
        let r = recover(&disk, &paths(), cfg()).await.expect("recover");
        assert!(
            r.cases.contains(&RecoveryCase::SegmentRecycled),
            "{:?}",
            r.cases
        );
        assert_eq!(r.next_segment_seq, 3);
        assert_eq!(r.last_lsn, 10);
        drop(r);
        // Power loss, losing every write not synced: segment 3 must read
        // as the spare it was renamed as.
        disk.set_faults(SimFaults {
            torn_write_on_crash: false,
            ..SimFaults::default()
        });
        disk.crash();
        let r = recover(&disk, &paths(), cfg())
            .await
            .expect("recover after the power loss");
        assert_eq!(r.last_lsn, 10);
        for k in 0..10 {
            assert_eq!(get(&r, k), Some(value(k, k + 1)));
        }
    });
}

#[test]
fn a_misplaced_segment_refuses() {
    block_on(async {
        let disk = SimDisk::new(12);
        build(&disk, 10, 10).await;
        let image = disk.read_durable(&paths().segment(1)).expect("segment");
        let f = disk.open(&paths().segment(5), true).await.expect("create");
        let mut buf = AlignedBuf::with_capacity(image.len());
        buf.extend_from_slice(&image);
        let (r, _) = f.write_at(buf, 0).await;
        r.expect("write");
        f.sync_data().await.expect("sync");
        let err = recover(&disk, &paths(), cfg())
            .await
            .err()
            .expect("must refuse");
        let (_, _, reason) = wal_corrupt(&err);
        assert!(
            matches!(
                reason,
                Damage::ForeignSegment {
                    found_seq: 1,
                    expected_seq: 5,
                    ..
                }
            ),
            "{reason}"
        );
    });
}

/// Runs an engine (one shard) until it has taken `checkpoints`
/// checkpoints, then shuts it down. Returns the final value version of
/// keys 0..64.
fn engine_with_checkpoints(disk: &SimDisk, checkpoints: u64) -> BTreeMap<u64, u64> {
    let mut config = small_config(Path::new(ROOT), 1, Durability::Sync);
    config.storage.checkpoint_wal_bytes = tunables::ByteSize::kib(64);
    let engine = Engine::open_with_disk(&config, disk.clone()).expect("open");
    let h = engine.handle();
    let mut model = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut version = 0;
    while engine.metrics().shards[0].checkpoints < checkpoints {
        assert!(Instant::now() < deadline, "checkpoints never happened");
        version += 1;
        let ops = (0..64).map(|k| put(k, version)).collect();
        h.batch_blocking(ops).expect("batch");
        for k in 0..64 {
            model.insert(k, version);
        }
    }
    // A few more writes after the last checkpoint, so replay has work.
    version += 1;
    h.batch_blocking((0..10).map(|k| put(k, version)).collect())
        .expect("batch");
    for k in 0..10 {
        model.insert(k, version);
    }
    // A stop does not wait for a checkpoint: one cut between its rename
    // and its retirement leaves segments its snapshot covers (recovery
    // skips them). Let one the last writes started finish first.
    // (Unchanged for three looks in a row: under a loaded machine's
    // fdatasync one look once fell inside a checkpoint.)
    let mut seen = engine.metrics().shards[0].checkpoints;
    let mut still = 0;
    while still < 3 {
        std::thread::sleep(Duration::from_millis(300));
        let now = engine.metrics().shards[0].checkpoints;
        still = if now == seen { still + 1 } else { 0 };
        seen = now;
    }
    engine.shutdown().expect("shutdown");
    model
}

fn snapshots(disk: &SimDisk) -> Vec<PathBuf> {
    disk.list_dir(&paths().snapshot_dir)
        .expect("list")
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "snap"))
        .collect()
}

fn check_model(r: &Recovered, model: &BTreeMap<u64, u64>) {
    for (k, v) in model {
        assert_eq!(get(r, *k), Some(value(*k, *v)), "key {k}");
    }
    assert_eq!(r.tier.len(), model.len() as u64);
}

/// (LSN, base LSN) of every snapshot on disk, oldest first.
fn chain(disk: &SimDisk) -> Vec<(u64, Option<u64>)> {
    let mut out: Vec<(u64, Option<u64>)> = snapshots(disk)
        .iter()
        .map(|p| {
            let h = block_on(async {
                let f = disk.open(p, false).await.expect("open");
                ringkv_engine::snapshot::read_header(&f, p, (0, 0))
                    .await
                    .expect("header")
            });
            (h.lsn, h.base_lsn)
        })
        .collect();
    out.sort();
    out
}

#[test]
fn snapshot_is_loaded_and_only_the_wal_after_it_is_kept() {
    let disk = SimDisk::new(13);
    let model = engine_with_checkpoints(&disk, 3);
    // Only the newest snapshot's chain is kept: one full snapshot and the
    // deltas over it, each building on the one before.
    let chain = chain(&disk);
    assert!(!chain.is_empty(), "{chain:?}");
    assert_eq!(chain[0].1, None, "{chain:?}");
    for pair in chain.windows(2) {
        assert_eq!(pair[1].1, Some(pair[0].0), "{chain:?}");
    }
    block_on(async {
        let r = recover(&disk, &paths(), cfg()).await.expect("recover");
        assert!(
            r.cases.contains(&RecoveryCase::SnapshotLoaded),
            "{:?}",
            r.cases
        );
        // Retention kept no closed segment the snapshot covers whole: a
        // checkpoint retires those. The segment still open when it was
        // taken stays, and is covered whole when it rolled right after the
        // snapshot's LSN (the last writes then start the next one), so at
        // most that one is skipped.
        let skipped = r
            .cases
            .iter()
            .filter(|c| **c == RecoveryCase::SegmentSkipped)
            .count();
        assert!(skipped <= 1, "{:?}", r.cases);
        assert!(r.snapshot_entries > 0);
        check_model(&r, &model);
    });
}

#[test]
fn a_damaged_newest_snapshot_refuses_naming_it() {
    // Only the newest chain is kept, and the WAL only from it on: there
    // is no older state to fall back to, and recovery must not serve one.
    let disk = SimDisk::new(14);
    engine_with_checkpoints(&disk, 3);
    let snaps = snapshots(&disk);
    let newest = snaps.last().expect("snapshot").clone();
    let len = disk.file_len(&newest).expect("len");
    disk.corrupt(&newest, len / 2, 4);
    let err = block_on(recover(&disk, &paths(), cfg()))
        .err()
        .expect("must refuse");
    match err.root() {
        EngineError::Snapshot(SnapshotError::NoUsableSnapshot { file, reason }) => {
            assert_eq!(file, &newest, "{err}");
            assert!(reason.contains("is corrupt at offset"), "{err}");
        }
        other => panic!("{other}"),
    }
    // Nothing was renamed or removed.
    assert!(disk.file_len(&newest).is_some());
}

#[test]
fn no_usable_snapshot_refuses() {
    let disk = SimDisk::new(15);
    engine_with_checkpoints(&disk, 3);
    for s in snapshots(&disk) {
        disk.corrupt(&s, 5000, 1);
    }
    // The first segment's records are retired: removed, or its file kept
    // for recycling with a prepared header (first LSN 0). Either way the
    // WAL does not start at LSN 1, which would need no snapshot.
    if let Some(bytes) = disk.read_durable(&paths().segment(1)) {
        let header = ringkv_engine::wal::format::decode_segment_header(&bytes[..BLOCK_BYTES])
            .expect("a header")
            .expect("not zeroes");
        assert!(
            header.is_prepared(),
            "the first segment was retired: {header:?}"
        );
    }
    let err = block_on(recover(&disk, &paths(), cfg()))
        .err()
        .expect("must refuse");
    assert!(
        matches!(
            err.root(),
            EngineError::Snapshot(SnapshotError::NoUsableSnapshot { .. })
        ),
        "{err}"
    );
}

/// Keys [`engine_with_deletes`] writes first.
const KEYS: u64 = 1000;

/// An engine that overwrites and deletes keys over several
/// checkpoints with `deltas_max` deltas per chain; returns the live keys.
fn engine_with_deletes(disk: &SimDisk, deltas_max: u32, checkpoints: u64) -> BTreeMap<u64, u64> {
    let mut config = small_config(Path::new(ROOT), 1, Durability::Sync);
    config.storage.checkpoint_deltas_max = deltas_max;
    // Every key first, with no checkpoint, so the first (full) checkpoint,
    // taken at the next start, holds them all, and each delta (about a
    // checkpoint threshold of writes, some 170 of them) is far smaller.
    let mut model = BTreeMap::new();
    let mut version = 1;
    let engine = Engine::open_with_disk(&config, disk.clone()).expect("open");
    for from in (0..KEYS).step_by(200) {
        let ops = (from..from + 200).map(|k| put(k, version)).collect();
        engine.handle().batch_blocking(ops).expect("batch");
    }
    model.extend((0..KEYS).map(|k| (k, version)));
    engine.shutdown().expect("shutdown");
    config.storage.checkpoint_wal_bytes = tunables::ByteSize::kib(64);
    let engine = Engine::open_with_disk(&config, disk.clone()).expect("open");
    let h = engine.handle();
    let deadline = Instant::now() + Duration::from_secs(60);
    while engine.metrics().shards[0].checkpoints < checkpoints {
        assert!(Instant::now() < deadline, "checkpoints never happened");
        version += 1;
        // Each round writes a window of 64 keys and deletes a few below it,
        // all in the first 300 keys: between two checkpoints less than half
        // the data changes, so the checkpointer takes deltas.
        let first = version * 67 % 236;
        let mut ops: Vec<_> = (first..first + 64).map(|k| put(k, version)).collect();
        ops.extend((0..5).map(|i| del((first + KEYS - 3 * i) % KEYS)));
        h.batch_blocking(ops).expect("batch");
        for k in first..first + 64 {
            model.insert(k, version);
        }
        for i in 0..5 {
            model.remove(&((first + KEYS - 3 * i) % KEYS));
        }
    }
    engine.shutdown().expect("shutdown");
    model
}

#[test]
fn a_chain_of_deltas_recovers_overwrites_and_deletes() {
    let disk = SimDisk::new(21);
    let model = engine_with_deletes(&disk, 3, 6);
    let chain = chain(&disk);
    assert!(chain.iter().any(|(_, base)| base.is_some()), "{chain:?}");
    // No chain is longer than three deltas.
    assert!(chain.len() <= 2 * 4, "{chain:?}");
    block_on(async {
        let r = recover(&disk, &paths(), cfg()).await.expect("recover");
        check_model(&r, &model);
        for k in 0..KEYS + 64 {
            if !model.contains_key(&k) {
                assert_eq!(get(&r, k), None, "deleted key {k} came back");
            }
        }
    });
}

#[test]
fn without_deltas_every_snapshot_is_full() {
    let disk = SimDisk::new(22);
    let model = engine_with_deletes(&disk, 0, 6);
    let chain = chain(&disk);
    assert_eq!(chain.len(), 1, "{chain:?}");
    assert!(chain.iter().all(|(_, base)| base.is_none()), "{chain:?}");
    block_on(async {
        let r = recover(&disk, &paths(), cfg()).await.expect("recover");
        check_model(&r, &model);
    });
}

#[test]
fn a_damaged_snapshot_under_a_delta_refuses_to_open() {
    // A full snapshot and deltas, each over the one before. Checkpoints
    // run on their own, so there may be more than the 3 waited for, and
    // on a loaded machine one that lags far enough behind the writes is
    // full again (the WAL since the last full one outgrew it): then the
    // newest builds on nothing, and the run is made again on a new disk.
    let (disk, all) = (0..8)
        .map(|attempt| {
            let disk = SimDisk::new(23 + attempt);
            engine_with_deletes(&disk, 8, 3);
            let all = chain(&disk);
            (disk, all)
        })
        .find(|(_, all)| {
            let last_full = all.iter().rposition(|(_, base)| base.is_none());
            last_full.is_some_and(|i| all.len() - i >= 3)
        })
        .expect("a chain of a full snapshot and two deltas in 8 runs");
    let last_full = all
        .iter()
        .rposition(|(_, base)| base.is_none())
        .expect("a full snapshot");
    let chain = &all[last_full..];
    assert!(chain.len() >= 3, "{chain:?}");
    assert_eq!(chain[0].1, None, "{chain:?}");
    for pair in chain.windows(2) {
        assert_eq!(pair[1].1, Some(pair[0].0), "{chain:?}");
    }
    // The first delta: the newest builds on it, and the WAL reaches back
    // only to the snapshot before the newest, not to the full one.
    let first_delta = paths().snapshot(chain[1].0);
    let len = disk.file_len(&first_delta).expect("len");
    disk.corrupt(&first_delta, len / 2, 4);
    let err = block_on(recover(&disk, &paths(), cfg()))
        .err()
        .expect("must refuse");
    match err.root() {
        EngineError::Snapshot(SnapshotError::NoUsableSnapshot { file, reason }) => {
            let newest = chain.last().expect("a snapshot").0;
            assert_eq!(file, &paths().snapshot(newest), "{err}");
            assert!(reason.contains("builds on"), "{err}");
        }
        other => panic!("{other}"),
    }
    // Nothing was renamed or removed: the files are as they were.
    assert_eq!(snapshots(&disk).len(), all.len());
}

#[test]
fn snapshot_without_wal_refuses() {
    let disk = SimDisk::new(16);
    engine_with_checkpoints(&disk, 1);
    for f in disk.list_dir(&paths().wal_dir).expect("list") {
        block_on(disk.remove_file(&f)).expect("remove");
    }
    let err = block_on(recover(&disk, &paths(), cfg()))
        .err()
        .expect("must refuse");
    let (_, _, reason) = wal_corrupt(&err);
    assert!(
        matches!(reason, Damage::NoWalForSnapshot { .. }),
        "{reason}"
    );
}

/// The newest segment holding acknowledged records, found by its header.
fn newest_used_segment(disk: &SimDisk) -> PathBuf {
    let mut used: Vec<(u64, PathBuf)> = disk
        .list_dir(&paths().wal_dir)
        .expect("list")
        .into_iter()
        .filter_map(|p| {
            let bytes = disk.read_written(&p)?;
            match ringkv_engine::wal::format::decode_segment_header(&bytes[..BLOCK_BYTES]) {
                Ok(Some(h)) if !h.is_prepared() => Some((h.seq, p)),
                _ => None,
            }
        })
        .collect();
    used.sort();
    used.pop().expect("a used segment").1
}

/// Runs an engine (one shard) without checkpoints over several segments,
/// then shuts it down. Returns the final versions.
fn engine_over_segments(disk: &SimDisk) -> BTreeMap<u64, u64> {
    let mut config = small_config(Path::new(ROOT), 1, Durability::Sync);
    config.storage.checkpoint_wal_bytes = tunables::ByteSize::mib(64);
    let engine = Engine::open_with_disk(&config, disk.clone()).expect("open");
    let h = engine.handle();
    let mut model = BTreeMap::new();
    for version in 1..=8 {
        h.batch_blocking((0..64).map(|k| put(k, version)).collect())
            .expect("batch");
        for k in 0..64 {
            model.insert(k, version);
        }
    }
    assert_eq!(engine.metrics().shards[0].checkpoints, 0);
    engine.shutdown().expect("shutdown");
    model
}

fn expect_newest_missing(disk: &SimDisk, newest: &Path) {
    let err = block_on(recover(disk, &paths(), cfg()))
        .err()
        .expect("must refuse");
    let (file, _, reason) = wal_corrupt(&err);
    assert!(
        matches!(reason, Damage::NewestSegmentMissing { .. }),
        "{reason}"
    );
    assert_eq!(file, newest, "names the missing segment");
}

#[test]
fn deleted_newest_segment_refuses() {
    // Without the WAL head this reads as a clean end one segment early:
    // every acknowledged write of the last segment silently reverted.
    let disk = SimDisk::new(17);
    let model = engine_over_segments(&disk);
    let newest = newest_used_segment(&disk);
    assert!(
        newest != paths().segment(1),
        "the log must span several segments"
    );
    block_on(async {
        let r = recover(&disk, &paths(), cfg()).await.expect("recover");
        check_model(&r, &model);
    });
    block_on(disk.remove_file(&newest)).expect("remove");
    expect_newest_missing(&disk, &newest);
}

#[test]
fn newest_segment_emptied_refuses() {
    // The file is there with its header zeroed (truncated and re-created,
    // or overwritten): it looks unused, which alone reads as a clean end.
    let disk = SimDisk::new(18);
    engine_over_segments(&disk);
    let newest = newest_used_segment(&disk);
    block_on(async {
        let f = disk.open(&newest, false).await.expect("open");
        let mut b = AlignedBuf::with_capacity(BLOCK_BYTES);
        b.set_len(BLOCK_BYTES);
        let (res, _) = f.write_at(b, 0).await;
        res.expect("write");
        f.sync_data().await.expect("sync");
    });
    expect_newest_missing(&disk, &newest);
}

#[test]
fn deleted_newest_segment_after_checkpoints_refuses() {
    let disk = SimDisk::new(19);
    engine_with_checkpoints(&disk, 2);
    let newest = newest_used_segment(&disk);
    block_on(disk.remove_file(&newest)).expect("remove");
    let err = block_on(recover(&disk, &paths(), cfg()))
        .err()
        .expect("must refuse");
    let (_, _, reason) = wal_corrupt(&err);
    // If checkpoints left only that segment, the snapshot rule fires first.
    assert!(
        matches!(
            reason,
            Damage::NewestSegmentMissing { .. } | Damage::NoWalForSnapshot { .. }
        ),
        "{reason}"
    );
}
