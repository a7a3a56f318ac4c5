//! The storage-fault matrix on a real disk: damage is never mistaken for a
//! crash.
//!
//! A real `ringkv-server` process takes a `sync` write load from the client;
//! this test records every acknowledged write (the independent record),
//! then stops the server (SIGTERM, SIGKILL right after the last
//! acknowledgement, SIGKILL after an idle half second). Each row copies a
//! stopped directory, damages one file of it one way, starts a server on
//! the copy and audits every acknowledged key through the client. What
//! must hold for every row: the server refuses (exit non-zero, naming the
//! file, and `verify` exits 2 naming it), or it starts and every
//! acknowledged key reads its last acknowledged value, or the keys it
//! cannot read fail with an error and are counted (at the start, or by
//! `verify` for bad blocks a start does not read), or (only after a SIGKILL
//! with no durable mark since the last flush, and only for damage to that
//! flush) the lost writes are exactly those of the final batch. Anything
//! else (an acknowledged write missing or wrong without a refusal or a
//! report, a panic, a hang) fails, and so does a row whose outcome is not
//! the one [`expected`] gives. The table goes to stdout and to
//! `$CARGO_TARGET_DIR/fault-matrix.md` (docs/benchmarks.md, "Reliability
//! checks").

mod common;

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{
    connect, copy_tree, field, server_binary, start_server_or_exit, with_runtime, ServerProcess,
    Started,
};
use engine::inspect::{self, Depth, SegmentState};
use ringkv_client::OpReply;
use ringkv_protocol::{RequestOp, Status};
use tunables::{ByteSize, Config, Durability, Tier};

/// Keys written. Round 0 writes all of them; later rounds overwrite every
/// fourth one only, so the others keep their first record (in the hybrid
/// tier's oldest value segments), the overwritten ones make the WAL grow,
/// and a memory-tier delta (a quarter of the data) is cheaper than a full
/// copy, so the checkpointer takes deltas.
const KEYS: u64 = 240;
/// Puts per client batch: one flush per shard (a batch is far below
/// `group_commit_max_bytes`), so the final batch is the final flush.
const BATCH_KEYS: u64 = 8;
/// Longest wait for a start, an exit, a verify run.
const WAIT: Duration = Duration::from_secs(30);
/// Batches the load ends with in the newest WAL segment (about one flush
/// each in shard 0).
const NEWEST_SEGMENT_BATCHES: usize = 7;
/// Idle time before the second kind of SIGKILL: well past `wal_mark_interval`
/// (the default, 100 ms: the mark covers the whole load by then).
const IDLE_BEFORE_KILL: Duration = Duration::from_millis(500);

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Setup {
    Memory,
    Hybrid,
    /// The hybrid tier with a hot device in front of the value device.
    HybridHot,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Stop {
    /// SIGTERM: a clean stop, which writes a durable mark through the end.
    Term,
    /// SIGKILL right after the last acknowledgement.
    Kill,
    /// SIGKILL after [`IDLE_BEFORE_KILL`] with nothing written.
    KillIdle,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    /// The segment a start replays from (the oldest kept: only the WAL
    /// after the newest snapshot is), not the newest.
    WalReplayed,
    WalNewest,
    Head,
    SnapFull,
    SnapDelta,
    Manifest,
    ValueSeg,
    HotSeg,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Pos {
    First,
    Middle,
    Last,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Damage {
    /// Three bytes flipped at the position.
    Flip(Pos),
    /// The 4 KiB block at the position zeroed.
    Zero(Pos),
    /// Cut to half its length.
    Truncate,
    Missing,
    /// The file of the same name (or, when there is none, of the same role)
    /// from another data directory with the same config and keys.
    Foreign,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// Exit non-zero at the start naming the file; `verify` exits 2 naming it.
    Refused,
    /// Every acknowledged key reads its last acknowledged value.
    NothingLost,
    /// The start log counts the unreadable keys; exactly those fail.
    LossReported,
    /// Not seen at the start (bad blocks); each read of a lost key fails
    /// with VALUE_UNREADABLE and `verify` counts exactly those keys.
    LossAtRead,
    /// After a SIGKILL: only the writes of the final batch are gone.
    Window,
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Outcome::Refused => "refused",
            Outcome::NothingLost => "started, nothing lost",
            Outcome::LossReported => "started, loss reported",
            Outcome::LossAtRead => "started, reads of lost keys fail",
            Outcome::Window => "undetectable window",
        })
    }
}

/// Small segments and checkpoint thresholds: several WAL segments, a full
/// snapshot with deltas over it and (hybrid) several value segments after a
/// few hundred KiB of writes.
fn config(setup: Setup) -> Config {
    let mut c = Config {
        shards: 2,
        ..Default::default()
    };
    c.storage.durability = Durability::Sync;
    c.storage.wal_segment_size = ByteSize::kib(64);
    c.storage.group_commit_max_bytes = ByteSize::kib(16);
    // Four segments between checkpoints: the WAL replayed at a start spans
    // more than one segment.
    c.storage.checkpoint_wal_bytes = ByteSize::kib(256);
    c.storage.checkpoint_interval = tunables::Duration::from_secs(0);
    c.limits.key_bytes_max = ByteSize(64);
    c.limits.value_bytes_max = ByteSize(2048);
    if setup != Setup::Memory {
        c.storage.tier = Tier::Hybrid;
        c.storage.value_segment_size = ByteSize::kib(64);
        c.storage.cache_bytes = ByteSize::kib(64);
        c.storage.index_keys = 4096;
        // No GC: the odd keys' records stay where round 0 wrote them.
        c.storage.gc_garbage_percent = 95;
    }
    if setup == Setup::HybridHot {
        // The default device: the data directory, unthrottled.
        c.devices.insert("hot".to_string(), Default::default());
        c.storage.hot_device = "hot".to_string();
        // Room for every record: nothing is evicted to the cold device.
        c.storage.hot_bytes = ByteSize::mib(4);
    }
    c
}

fn key(i: u64) -> Bytes {
    Bytes::from(format!("key-{i:05}"))
}

/// Distinct per directory (`seed`), round and key; 200..=600 bytes.
fn value(seed: u64, round: u64, i: u64) -> Bytes {
    let mut v = format!("seed{seed}-round{round}-key{i}-").into_bytes();
    let len = 200 + ((i * 37 + round * 11) % 401) as usize;
    v.resize(len, b'a' + ((i + round + seed) % 26) as u8);
    Bytes::from(v)
}

/// One acknowledged write: the batch that carried it (index in ack order)
/// and the value.
#[derive(Debug, Clone)]
struct Ack {
    batch: usize,
    value: Bytes,
}

/// A stopped data directory and the record of what it acknowledged.
struct Loaded {
    setup: Setup,
    stop: Stop,
    _root: tempfile::TempDir,
    data: PathBuf,
    config_file: PathBuf,
    /// Every acknowledged write per key, oldest first.
    acks: BTreeMap<Bytes, Vec<Ack>>,
    /// Batches acknowledged; the last one is `batches - 1`.
    batches: usize,
}

/// Starts the server on `data` and waits for its ready line or its exit.
fn start(data: &Path, config_file: &Path) -> Started {
    let config = config_file.to_str().expect("a UTF-8 path");
    start_server_or_exit(data, &["--config", config])
}

/// Starts a server on a fresh directory, drives the load, stops it `stop`.
fn load(setup: Setup, stop: Stop, seed: u64) -> Loaded {
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("data");
    let config_file = root.path().join("ringkv.toml");
    let mut c = config(setup);
    if stop == Stop::Kill {
        // The durable mark follows the load every `wal_mark_interval`; a
        // kill "right after the last acknowledgement" must find none since
        // the load began, or the window rows would depend on timing.
        c.storage.wal_mark_interval = tunables::Duration::from_secs(60);
    }
    std::fs::write(&config_file, c.to_toml_string()).unwrap();
    let Started::Ready(mut proc) = start(&data, &config_file) else {
        panic!("the server did not start on a fresh directory");
    };
    let (acks, batches) = with_runtime(drive(proc.addr, seed, data.clone(), setup));
    match stop {
        Stop::Term => {
            proc.signal(libc::SIGTERM);
            let status = proc.try_wait_exit().expect("SIGTERM stops the server");
            assert!(status.success(), "{status}:\n{}", proc.log().join("\n"));
        }
        Stop::Kill | Stop::KillIdle => {
            if stop == Stop::KillIdle {
                std::thread::sleep(IDLE_BEFORE_KILL);
            }
            proc.signal(libc::SIGKILL);
            proc.try_wait_exit().expect("SIGKILL ends the server");
        }
    }
    Loaded {
        setup,
        stop,
        _root: root,
        data,
        config_file,
        acks,
        batches,
    }
}

/// One client, one batch at a time, every key once per round, until shard 0
/// has a delta snapshot over a full one, three used WAL segments and (hybrid)
/// three value segments.
async fn drive(
    addr: SocketAddr,
    seed: u64,
    data: PathBuf,
    setup: Setup,
) -> (BTreeMap<Bytes, Vec<Ack>>, usize) {
    let client = connect(addr).await;
    let mut acks: BTreeMap<Bytes, Vec<Ack>> = BTreeMap::new();
    let mut batches = 0usize;
    let deadline = Instant::now() + Duration::from_secs(60);
    // The newest used segment while the layout holds, and the batches
    // written into it since: the stop waits for a few, so its first, middle
    // and last flushes differ.
    let mut newest: Option<PathBuf> = None;
    let mut batches_in_newest = 0;
    for round in 0u64.. {
        let step = if round == 0 { 1 } else { 4 };
        let round_keys: Vec<u64> = (0..KEYS).step_by(step).collect();
        for chunk in round_keys.chunks(BATCH_KEYS as usize) {
            let writes: Vec<(Bytes, Bytes)> = chunk
                .iter()
                .map(|&i| (key(i), value(seed, round, i)))
                .collect();
            let ops = writes
                .iter()
                .map(|(k, v)| RequestOp::Put {
                    key: k.clone(),
                    value: v.clone(),
                })
                .collect();
            let replies = client.batch(ops).await.expect("batch");
            assert!(replies.iter().all(|r| *r == OpReply::Ok), "{replies:?}");
            for (k, v) in writes {
                acks.entry(k).or_default().push(Ack {
                    batch: batches,
                    value: v,
                });
            }
            batches += 1;
            let now = if round >= 2 {
                laid_out(&data, setup)
            } else {
                None
            };
            if now.is_some() && now == newest {
                batches_in_newest += 1;
            } else {
                batches_in_newest = usize::from(now.is_some());
                newest = now;
            }
            if batches_in_newest >= NEWEST_SEGMENT_BATCHES {
                return (acks, batches);
            }
        }
        assert!(Instant::now() < deadline, "the load never made its files");
    }
    unreachable!("the load loops until it returns")
}

fn files(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = entries
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .collect();
    out.sort();
    out
}

/// Whether a snapshot file is a delta (bytes 36..44 of its header: the base).
fn is_delta(path: &Path) -> bool {
    let bytes = std::fs::read(path).unwrap_or_default();
    bytes.len() >= 44 && bytes[36..44].iter().any(|&b| b != 0)
}

/// The used WAL segments of a shard directory: (path, first LSN), in order.
fn used_segments(shard: &Path) -> Vec<(PathBuf, u64)> {
    files(&shard.join("wal"), "wal")
        .into_iter()
        .filter_map(|p| {
            let mut header = [0u8; 32];
            std::fs::File::open(&p)
                .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut header))
                .ok()?;
            let first = u64::from_le_bytes(header[24..32].try_into().unwrap());
            (&header[..8] == b"RINGKVWL" && first != 0).then_some((p, first))
        })
        .collect()
}

/// The LSN a snapshot covers (its name).
fn snapshot_lsn(path: &Path) -> u64 {
    path.file_stem().unwrap().to_string_lossy().parse().unwrap()
}

/// Of the used segments, the index of the one a start replays from: the
/// last one starting at or below the newest snapshot's LSN + 1.
fn replay_from(segments: &[(PathBuf, u64)], snapshot: u64) -> Option<usize> {
    segments
        .iter()
        .rposition(|(_, first)| *first <= snapshot + 1)
}

/// The newest used WAL segment of shard 0 if it has a delta snapshot over
/// a full one, (hybrid) three value segments, and a start would replay two
/// or three segments (fewer than the four a checkpoint waits for, so none
/// is under way).
fn laid_out(data: &Path, setup: Setup) -> Option<PathBuf> {
    let shard = data.join("shard-000");
    let snaps = files(&shard.join("snapshots"), "snap");
    let full = snaps.iter().filter(|p| !is_delta(p)).count();
    let delta = snaps.len() - full;
    let values = match setup {
        Setup::Memory => 3,
        Setup::Hybrid => files(&shard.join("values"), "seg").len(),
        Setup::HybridHot => files(&shard.join("values-hot"), "seg").len(),
    };
    if full == 0 || delta == 0 || values < 3 {
        return None;
    }
    let segments = used_segments(&shard);
    let from = replay_from(&segments, snapshot_lsn(snaps.last()?))?;
    let replayed = segments.len() - from;
    (2..=3)
        .contains(&replayed)
        .then(|| segments.last().unwrap().0.clone())
}

/// The file of each kind in shard 0 of a stopped directory, with the byte
/// offsets its positions stand for.
struct Target {
    path: PathBuf,
    /// Where `First`, `Middle` and `Last` flip bytes.
    flip_at: [u64; 3],
    /// Where `First`, `Middle` and `Last` zero a 4 KiB block.
    zero_at: [u64; 3],
}

fn targets(data: &Path, config_file: &Path, setup: Setup) -> BTreeMap<Kind, Target> {
    let mut c = Config::load(config_file).unwrap();
    c.storage.data_dir = data.to_path_buf();
    let report = inspect::examine(&c, Depth::Full);
    let shard = &report.shards[0];
    let mut out: BTreeMap<Kind, Target> = wal_targets(shard).into_iter().collect();
    out.insert(
        Kind::Head,
        Target {
            path: shard.dir.join("wal.head"),
            flip_at: [16, 16, 4096 + 16],
            zero_at: [0, 0, 4096],
        },
    );
    let snaps = files(&shard.dir.join("snapshots"), "snap");
    let newest_full = snaps
        .iter()
        .rev()
        .find(|p| !is_delta(p))
        .expect("a full snapshot");
    let newest_delta = snaps
        .iter()
        .rev()
        .find(|p| is_delta(p))
        .expect("a delta snapshot");
    out.insert(Kind::SnapFull, snapshot_target(newest_full));
    out.insert(Kind::SnapDelta, snapshot_target(newest_delta));
    out.insert(
        Kind::Manifest,
        Target {
            path: data.join("MANIFEST"),
            flip_at: [13, 13, 13],
            zero_at: [0, 0, 0],
        },
    );
    let value_dir = match setup {
        Setup::Memory => None,
        Setup::Hybrid => Some((Kind::ValueSeg, "values")),
        Setup::HybridHot => Some((Kind::HotSeg, "values-hot")),
    };
    if let Some((kind, folder)) = value_dir {
        // The oldest segment with at least three data blocks.
        let seg = files(&shard.dir.join(folder), "seg")
            .into_iter()
            .find(|p| std::fs::metadata(p).unwrap().len() >= 4 * 4096)
            .unwrap_or_else(|| panic!("no value segment of 4 blocks in {folder}"));
        let len = std::fs::metadata(&seg).unwrap().len();
        let blocks = [4096, (len / 2) / 4096 * 4096, len / 4096 * 4096 - 4096];
        out.insert(
            kind,
            Target {
                path: seg,
                flip_at: blocks.map(|b| b + 100),
                zero_at: blocks,
            },
        );
    }
    out
}

/// Shard 0's used WAL segments below the newest snapshot, replayed, and
/// the newest, with their first, middle and last flushes.
fn wal_targets(shard: &inspect::ShardReport) -> [(Kind, Target); 2] {
    let used: Vec<_> = shard
        .segments
        .iter()
        .filter(|s| matches!(s.state, SegmentState::Used { .. }))
        .collect();
    let snaps = files(&shard.dir.join("snapshots"), "snap");
    let newest_snapshot = snapshot_lsn(snaps.last().expect("a snapshot"));
    let firsts: Vec<(PathBuf, u64)> = used
        .iter()
        .map(|s| match s.state {
            SegmentState::Used { first_lsn } => (s.path.clone(), first_lsn),
            _ => unreachable!(),
        })
        .collect();
    let from = replay_from(&firsts, newest_snapshot).expect("a segment to replay from");
    assert!(
        from + 1 < used.len(),
        "want two replayed segments: {firsts:?}, snapshot {newest_snapshot}"
    );
    let wal = [
        (Kind::WalReplayed, used[from]),
        (Kind::WalNewest, used[used.len() - 1]),
    ];
    wal.map(|(kind, seg)| {
        let flushes = &seg.flush_offsets;
        // First, middle and last differ where they matter.
        assert!(
            flushes.len() >= 3,
            "{} has {} flushes",
            seg.path.display(),
            flushes.len()
        );
        // The records of a flush: past block 0 (the segment header).
        let at = |i: usize| flushes[i].max(4096);
        let offsets = [at(0), at(flushes.len() / 2), at(flushes.len() - 1)];
        let target = Target {
            path: seg.path.clone(),
            flip_at: offsets.map(|o| o + 64),
            zero_at: offsets,
        };
        (kind, target)
    })
}

/// Header, middle and trailer of a snapshot file.
fn snapshot_target(path: &Path) -> Target {
    let bytes = std::fs::read(path).unwrap();
    let len = bytes.len() as u64;
    let trailer = bytes
        .windows(4)
        .rposition(|w| w == b"STRL")
        .expect("a snapshot trailer") as u64;
    Target {
        path: path.to_path_buf(),
        flip_at: [20, len / 2, trailer + 20],
        zero_at: [0, (len / 2) / 4096 * 4096, (len - 1) / 4096 * 4096],
    }
}

/// The damages each kind gets.
fn damages(kind: Kind) -> Vec<Damage> {
    let positions: &[Pos] = match kind {
        Kind::Manifest => &[Pos::First],
        Kind::Head => &[Pos::First, Pos::Last],
        _ => &[Pos::First, Pos::Middle, Pos::Last],
    };
    let mut out = Vec::new();
    out.extend(positions.iter().map(|&p| Damage::Flip(p)));
    out.extend(positions.iter().map(|&p| Damage::Zero(p)));
    out.extend([Damage::Truncate, Damage::Missing, Damage::Foreign]);
    out
}

/// Applies `damage` to `path` inside a copy; `foreign` is the file to put
/// in its place for [`Damage::Foreign`].
fn apply(target: &Target, path: &Path, damage: Damage, foreign: &Path) {
    let pos_index = |p: Pos| p as usize;
    match damage {
        Damage::Flip(p) => {
            let mut bytes = std::fs::read(path).unwrap();
            let at = target.flip_at[pos_index(p)] as usize;
            for b in &mut bytes[at..at + 3] {
                *b ^= 0x10;
            }
            std::fs::write(path, bytes).unwrap();
        }
        Damage::Zero(p) => {
            let mut bytes = std::fs::read(path).unwrap();
            let at = target.zero_at[pos_index(p)] as usize;
            let end = (at + 4096).min(bytes.len());
            bytes[at..end].fill(0);
            std::fs::write(path, bytes).unwrap();
        }
        Damage::Truncate => {
            let len = std::fs::metadata(path).unwrap().len();
            let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
            file.set_len(len / 2).unwrap();
        }
        Damage::Missing => std::fs::remove_file(path).unwrap(),
        Damage::Foreign => {
            std::fs::copy(foreign, path).unwrap();
        }
    }
}

/// One row of the matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Row {
    setup: Setup,
    kind: Kind,
    damage: Damage,
    stop: Stop,
}

impl Row {
    /// Tier, file, damage and stop, as the table writes them.
    fn names(&self) -> [String; 4] {
        let setup = match self.setup {
            Setup::Memory => "memory",
            Setup::Hybrid => "hybrid",
            Setup::HybridHot => "hybrid+hot",
        };
        let kind = match self.kind {
            Kind::WalReplayed => "WAL segment replayed, not the newest",
            Kind::WalNewest => "WAL segment, newest",
            Kind::Head => "wal.head",
            Kind::SnapFull if self.setup == Setup::Memory => "snapshot, full",
            Kind::SnapDelta if self.setup == Setup::Memory => "snapshot, delta",
            Kind::SnapFull => "checkpoint, full",
            Kind::SnapDelta => "checkpoint, delta",
            Kind::Manifest => "MANIFEST",
            Kind::ValueSeg => "value segment",
            Kind::HotSeg => "hot value segment",
        };
        let pos = |p: Pos| match (self.kind, p) {
            (Kind::Head, Pos::First) => "slot 0",
            (Kind::Head, _) => "slot 1",
            (Kind::SnapFull | Kind::SnapDelta, Pos::First) => "header",
            (Kind::SnapFull | Kind::SnapDelta, Pos::Middle) => "middle",
            (Kind::SnapFull | Kind::SnapDelta, Pos::Last) => "trailer",
            (Kind::ValueSeg | Kind::HotSeg, Pos::First) => "first block",
            (Kind::ValueSeg | Kind::HotSeg, Pos::Middle) => "middle block",
            (Kind::ValueSeg | Kind::HotSeg, Pos::Last) => "last block",
            (Kind::Manifest, _) => "block 0",
            (_, Pos::First) => "first flush",
            (_, Pos::Middle) => "middle flush",
            (_, Pos::Last) => "last flush",
        };
        let damage = match self.damage {
            Damage::Flip(p) => format!("bit flip, {}", pos(p)),
            Damage::Zero(p) => format!("zeroed 4 KiB, {}", pos(p)),
            Damage::Truncate => "cut to half".to_string(),
            Damage::Missing => "missing".to_string(),
            Damage::Foreign => "from another directory".to_string(),
        };
        let stop = match self.stop {
            Stop::Term => "SIGTERM",
            Stop::Kill => "SIGKILL",
            Stop::KillIdle => "SIGKILL after idle",
        };
        [setup.into(), kind.into(), damage, stop.into()]
    }
}

impl fmt::Display for Row {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.names().join(" | "))
    }
}

/// What a row found.
struct Found {
    row: Row,
    outcome: Result<Outcome, String>,
    audited: usize,
    lost_reported: usize,
    lost_silently: usize,
    /// [`Outcome::LossAtRead`]: the keys `verify` counts in the file.
    verify_counted: u64,
}

/// Runs `ringkv-server verify` on `data`: its exit code and stdout.
fn run_verify(data: &Path, config_file: &Path) -> (Option<i32>, String) {
    let mut child = Command::new(server_binary())
        .args(["verify", "--config"])
        .arg(config_file)
        .arg("--data-dir")
        .arg(data)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn ringkv-server verify");
    let mut stdout = child.stdout.take().expect("piped stdout");
    let reader = std::thread::spawn(move || {
        let mut out = String::new();
        let _ = std::io::Read::read_to_string(&mut stdout, &mut out);
        out
    });
    let deadline = Instant::now() + WAIT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break Some(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let out = reader.join().unwrap();
    (status.and_then(|s| s.code()), out)
}

/// The sum of `K` in "...: K keys unreadable" on lines naming `name`.
fn keys_unreadable_in(out: &str, name: &str) -> u64 {
    out.lines()
        .filter(|l| l.contains(name))
        .filter_map(|l| {
            let end = l.find(" keys unreadable")?;
            l[..end].rsplit([' ', ':']).next()?.parse::<u64>().ok()
        })
        .sum()
}

/// Reads every acknowledged key of `loaded` through the client and sorts
/// them: last value, VALUE_UNREADABLE, an older acknowledged value (or
/// none: the lost writes), or anything else.
#[derive(Default)]
struct Audit {
    keys: usize,
    unreadable: Vec<Bytes>,
    /// Keys reading an older acknowledged value (or nothing), with the
    /// acknowledged writes missing.
    stale: Vec<(Bytes, Vec<Ack>)>,
    wrong: Vec<String>,
}

fn audit(loaded: &Loaded, addr: SocketAddr) -> Audit {
    let keys: Vec<(Bytes, Vec<Ack>)> = loaded
        .acks
        .iter()
        .map(|(k, a)| (k.clone(), a.clone()))
        .collect();
    with_runtime(async move {
        let client = connect(addr).await;
        let mut audit = Audit {
            keys: keys.len(),
            ..Default::default()
        };
        for chunk in keys.chunks(60) {
            let ops = chunk
                .iter()
                .map(|(k, _)| RequestOp::Get { key: k.clone() })
                .collect();
            let replies = client.batch(ops).await.expect("GET batch");
            for ((k, acks), reply) in chunk.iter().zip(replies) {
                let last = &acks.last().expect("an ack").value;
                match reply {
                    OpReply::Value(v) if v == *last => {}
                    OpReply::Error {
                        status: Status::ValueUnreadable,
                        ..
                    } => audit.unreadable.push(k.clone()),
                    OpReply::Value(v) => match acks.iter().rposition(|a| a.value == v) {
                        Some(i) => audit.stale.push((k.clone(), acks[i + 1..].to_vec())),
                        None => audit.wrong.push(format!(
                            "{} reads {:?}",
                            String::from_utf8_lossy(k),
                            String::from_utf8_lossy(&v[..v.len().min(24)])
                        )),
                    },
                    OpReply::NotFound => audit.stale.push((k.clone(), acks.clone())),
                    other => audit
                        .wrong
                        .push(format!("{} answers {other:?}", String::from_utf8_lossy(k))),
                }
            }
        }
        audit
    })
}

fn panicked(log: &[String]) -> Option<&String> {
    log.iter().find(|l| l.contains("panicked"))
}

fn tail(log: &[String]) -> String {
    log[log.len().saturating_sub(8)..].join("\n")
}

/// Copies `loaded`, damages the copy, starts a server on it and audits.
fn run_row(row: Row, loaded: &Loaded, foreign: &Loaded, target: &Target, other: &Target) -> Found {
    let mut found = Found {
        row,
        outcome: Err(String::new()),
        audited: 0,
        lost_reported: 0,
        lost_silently: 0,
        verify_counted: 0,
    };
    let scratch = tempfile::tempdir().unwrap();
    let data = scratch.path().join("data");
    copy_tree(&loaded.data, &data);
    let relative = target.path.strip_prefix(&loaded.data).unwrap();
    let path = data.join(relative);
    // The same-named file of the other directory, else the one in the same role.
    let same_named = foreign.data.join(relative);
    let foreign_file = if same_named.exists() {
        same_named
    } else {
        other.path.clone()
    };
    apply(target, &path, row.damage, &foreign_file);
    // A missing newest snapshot is named by nothing left on disk: the
    // refusal must then say that a snapshot is missing instead.
    let name = if row.kind == Kind::SnapDelta && row.damage == Damage::Missing {
        MISSING_SNAPSHOT.to_string()
    } else {
        relative.file_name().unwrap().to_string_lossy().to_string()
    };
    found.outcome = match start(&data, &loaded.config_file) {
        Started::Hung(log) => Err(format!(
            "no ready line and no exit in {WAIT:?}:\n{}",
            tail(&log)
        )),
        Started::Exited(status, log) => refused(status, &log, &data, &loaded.config_file, &name),
        Started::Ready(mut proc) => {
            let result = started(&mut found, loaded, &proc, proc.addr);
            let result = if let Some(line) = panicked(&proc.log()) {
                Err(format!("the server panicked: {line}"))
            } else if !proc.alive() {
                Err(format!(
                    "the server died during the audit:\n{}",
                    tail(&proc.log())
                ))
            } else {
                result
            };
            drop(proc);
            match result {
                Ok(Outcome::LossAtRead) => {
                    verify_counts(&mut found, &data, &loaded.config_file, &name)
                }
                other => other,
            }
        }
    };
    found
}

/// What a refusal says when the file it would name is a missing newest
/// snapshot (`Damage::MissingHistory`'s text).
const MISSING_SNAPSHOT: &str = "a snapshot covering LSN";

/// A start that exited: it must be a refusal naming the file, and
/// `verify` must exit 2 naming it.
fn refused(
    status: ExitStatus,
    log: &[String],
    data: &Path,
    config_file: &Path,
    name: &str,
) -> Result<Outcome, String> {
    if let Some(line) = panicked(log) {
        return Err(format!("the server panicked at the start: {line}"));
    }
    if status.success() || status.code().is_none() {
        return Err(format!("the start ended with {status}:\n{}", tail(log)));
    }
    if !log.iter().any(|l| l.contains(name)) {
        return Err(format!("refused without naming {name}:\n{}", tail(log)));
    }
    let (code, out) = run_verify(data, config_file);
    if code != Some(2) || !out.contains(name) {
        return Err(format!(
            "verify exit {code:?} (want 2 naming {name}):\n{out}"
        ));
    }
    Ok(Outcome::Refused)
}

/// A start that served: audit every acknowledged key.
fn started(
    found: &mut Found,
    loaded: &Loaded,
    proc: &ServerProcess,
    addr: SocketAddr,
) -> Result<Outcome, String> {
    let a = audit(loaded, addr);
    found.audited = a.keys;
    found.lost_reported = a.unreadable.len();
    let stale_writes: usize = a.stale.iter().map(|(_, lost)| lost.len()).sum();
    if !a.wrong.is_empty() {
        found.lost_silently = a.wrong.len() + a.stale.len();
        return Err(format!(
            "{} keys read a value never acknowledged for them: {:?}",
            a.wrong.len(),
            &a.wrong[..a.wrong.len().min(3)]
        ));
    }
    let final_batch = loaded.batches - 1;
    let window = !a.stale.is_empty()
        && loaded.stop == Stop::Kill
        && a.stale
            .iter()
            .all(|(_, lost)| lost.iter().all(|ack| ack.batch == final_batch));
    if !a.stale.is_empty() && !window {
        found.lost_silently = a.stale.len();
        let (k, lost) = &a.stale[0];
        return Err(format!(
            "{} acknowledged writes of {} keys lost silently, e.g. {} (batches {:?}, final batch {final_batch})",
            stale_writes,
            a.stale.len(),
            String::from_utf8_lossy(k),
            lost.iter().map(|ack| ack.batch).collect::<Vec<_>>()
        ));
    }
    if a.unreadable.is_empty() {
        if window {
            found.lost_silently = a.stale.len();
            return Ok(Outcome::Window);
        }
        return Ok(Outcome::NothingLost);
    }
    if window {
        return Err("both a window loss and unreadable keys".to_string());
    }
    let reported: u64 = proc
        .log()
        .iter()
        .filter(|l| l.contains("value segments are damaged"))
        .map(|l| field(l, "unreadable_keys").parse::<u64>().unwrap_or(0))
        .sum();
    if reported > 0 {
        if reported != a.unreadable.len() as u64 {
            return Err(format!(
                "the start reports {reported} keys unreadable, {} fail",
                a.unreadable.len()
            ));
        }
        return Ok(Outcome::LossReported);
    }
    // Bad blocks a start does not read: checked by verify once stopped.
    Ok(Outcome::LossAtRead)
}

/// Bad blocks a start does not read: verify must name the file and count
/// at least the keys that fail (it counts in the newest snapshot's index,
/// without the WAL replay that wrote some of them again).
fn verify_counts(
    found: &mut Found,
    data: &Path,
    config_file: &Path,
    name: &str,
) -> Result<Outcome, String> {
    let (code, out) = run_verify(data, config_file);
    found.verify_counted = keys_unreadable_in(&out, name);
    let failing = found.lost_reported;
    if code != Some(1) || found.verify_counted < failing as u64 {
        return Err(format!(
            "{failing} keys fail; verify exit {code:?} counts {} in {name}:\n{out}",
            found.verify_counted
        ));
    }
    Ok(Outcome::LossAtRead)
}

/// Rows that show a known bug: run and printed, not asserted. None now:
/// the matrix's first run found files from another data directory read
/// as this one's; every file now carries the directory's id, and such a
/// file is refused (the rows below expect that). Kept for the next one.
fn known_bug(_row: Row) -> Option<&'static str> {
    None
}

/// The outcome each row must have (rows of [`known_bug`] excepted).
fn expected(row: Row) -> Outcome {
    use Outcome::*;
    let last_flush = matches!(
        row.damage,
        Damage::Flip(Pos::Last) | Damage::Zero(Pos::Last)
    );
    if row.damage == Damage::Foreign {
        // Its header carries another directory's id (`ForeignDirectory`);
        // a MANIFEST from another directory matches no file's id.
        return Refused;
    }
    match (row.kind, row.damage) {
        // Damage with newer flushes after it (`DamageBeforeData`), a log
        // the next segment does not continue (`LsnGap`), `ShortSegment`.
        (Kind::WalReplayed, _) => Refused,
        // The last flush after a SIGKILL with no durable mark since: a
        // torn tail. Anything else is refused (`DamageBeforeData`,
        // `MarkedRecordsMissing`, `ShortSegment`, `NewestSegmentMissing`).
        (Kind::WalNewest, _) if last_flush && row.stop == Stop::Kill => Window,
        (Kind::WalNewest, _) => Refused,
        // One slot damaged or cut off: the other holds the previous head
        // (a lower bound, still true). No head at all: read as a directory
        // written before the head existed; every segment is there, so
        // nothing is lost (a head from another directory names segments
        // and a mark at or below this one's).
        (Kind::Head, _) => NothingLost,
        // The full snapshot every delta builds on: no chain loads and the
        // WAL does not start at LSN 1 (`NoUsableSnapshot`).
        (Kind::SnapFull, _) => Refused,
        // The newest delta: only the newest chain and the WAL after it
        // are kept, so nothing older stands in (`NoUsableSnapshot`, or
        // `MissingHistory` saying a snapshot is missing).
        (Kind::SnapDelta, _) => Refused,
        // Its fields sit in the first 72 bytes: a cut block still reads.
        (Kind::Manifest, Damage::Truncate) => NothingLost,
        (Kind::Manifest, _) => Refused,
        // The segment's last block holds only records of keys written
        // again later: no index entry points there.
        (Kind::ValueSeg | Kind::HotSeg, _) if last_flush => NothingLost,
        (Kind::ValueSeg | Kind::HotSeg, Damage::Flip(_) | Damage::Zero(_)) => LossAtRead,
        (Kind::ValueSeg | Kind::HotSeg, Damage::Truncate) => LossReported,
        (Kind::ValueSeg | Kind::HotSeg, Damage::Missing | Damage::Foreign) => Refused,
    }
}

/// The rows: every kind the setup has, each damage, each stop (the
/// manifest, written once when the directory is made, only after SIGTERM).
fn rows(setup: Setup, stop: Stop) -> Vec<Row> {
    // The files every tier has; the hybrid tier adds its value segments.
    const LOG_AND_SNAPSHOTS: [Kind; 6] = [
        Kind::WalReplayed,
        Kind::WalNewest,
        Kind::Head,
        Kind::SnapFull,
        Kind::SnapDelta,
        Kind::Manifest,
    ];
    let kinds: Vec<Kind> = match setup {
        Setup::Memory => LOG_AND_SNAPSHOTS.to_vec(),
        Setup::Hybrid => [&LOG_AND_SNAPSHOTS[..], &[Kind::ValueSeg]].concat(),
        Setup::HybridHot => vec![Kind::HotSeg],
    };
    let mut out = Vec::new();
    for kind in kinds {
        if kind == Kind::Manifest && stop != Stop::Term {
            continue;
        }
        for damage in damages(kind) {
            out.push(Row {
                setup,
                kind,
                damage,
                stop,
            });
        }
    }
    out
}

/// Runs `jobs` on two threads (the machine this must fit has two cores).
fn parallel<T: Send, R: Send>(jobs: Vec<T>, f: impl Fn(T) -> R + Sync) -> Vec<R> {
    let queue = Mutex::new(jobs.into_iter().enumerate().collect::<Vec<_>>());
    let results = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| loop {
                let Some((i, job)) = queue.lock().unwrap().pop() else {
                    return;
                };
                let r = f(job);
                results.lock().unwrap().push((i, r));
            });
        }
    });
    let mut results = results.into_inner().unwrap();
    results.sort_by_key(|(i, _)| *i);
    results.into_iter().map(|(_, r)| r).collect()
}

/// `target/` of this build: the test binary is `target/PROFILE/deps/NAME`.
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.ancestors().nth(3).unwrap().to_path_buf()
}

#[test]
fn storage_fault_matrix_on_a_real_disk() {
    let began = Instant::now();
    let setups = [Setup::Memory, Setup::Hybrid, Setup::HybridHot];
    let stops = [Stop::Term, Stop::Kill, Stop::KillIdle];
    // Seed 1: the directories damaged; seed 2: the other directory each
    // setup takes foreign files from.
    let mut jobs: Vec<(Setup, Stop, u64)> = Vec::new();
    for setup in setups {
        for stop in stops {
            jobs.push((setup, stop, 1));
        }
        jobs.push((setup, Stop::Term, 2));
    }
    let loads = parallel(jobs, |(setup, stop, seed)| (seed, load(setup, stop, seed)));
    let load_time = began.elapsed();
    let foreign: BTreeMap<Setup, &Loaded> = loads
        .iter()
        .filter(|(seed, _)| *seed == 2)
        .map(|(_, l)| (l.setup, l))
        .collect();
    let damaged: Vec<&Loaded> = loads
        .iter()
        .filter(|(seed, _)| *seed == 1)
        .map(|(_, l)| l)
        .collect();
    let all_targets: Vec<(BTreeMap<Kind, Target>, BTreeMap<Kind, Target>)> = damaged
        .iter()
        .map(|l| {
            let f = foreign[&l.setup];
            (
                targets(&l.data, &l.config_file, l.setup),
                targets(&f.data, &f.config_file, f.setup),
            )
        })
        .collect();
    let mut jobs = Vec::new();
    for (i, l) in damaged.iter().enumerate() {
        for row in rows(l.setup, l.stop) {
            jobs.push((i, row));
        }
    }
    let found = parallel(jobs, |(i, row)| {
        let (mine, theirs) = &all_targets[i];
        let l = damaged[i];
        run_row(
            row,
            l,
            foreign[&l.setup],
            &mine[&row.kind],
            &theirs[&row.kind],
        )
    });
    let elapsed = began.elapsed();

    let acked: Vec<usize> = damaged
        .iter()
        .map(|l| l.acks.values().map(Vec::len).sum())
        .collect();
    let mut text = format!(
        "{} rows in {:.0} s ({:.0} s loading {} directories); every started row reads all {KEYS} keys, the last of {}–{} acknowledged writes per directory\n\n",
        found.len(),
        elapsed.as_secs_f64(),
        load_time.as_secs_f64(),
        loads.len(),
        acked.iter().min().unwrap(),
        acked.iter().max().unwrap(),
    );
    let (table, failures) = table(&found);
    text.push_str(&summary(&found));
    text.push_str("\nEvery row:\n\n");
    text.push_str(&table);
    println!("{text}");
    let file = target_dir().join("fault-matrix.md");
    std::fs::write(&file, &text).unwrap();
    println!("table written to {}", file.display());
    assert!(
        failures.is_empty(),
        "{} rows failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// A row's outcome in the tables: what happened, with its counts.
fn cell(f: &Found) -> String {
    let bug = known_bug(f.row).is_some();
    match (&f.outcome, bug) {
        (Ok(Outcome::Refused), _) => "refused".to_string(),
        (Ok(Outcome::NothingLost), _) => "nothing lost".to_string(),
        (Ok(Outcome::LossReported), _) => format!("{} reported at start", f.lost_reported),
        (Ok(Outcome::LossAtRead), _) => format!(
            "{} fail at read; verify counts {}",
            f.lost_reported, f.verify_counted
        ),
        (Ok(Outcome::Window), _) => format!("window: {} lost", f.lost_silently),
        (Err(_), true) => format!("**bug: {} silent**", f.lost_silently),
        (Err(_), false) => "**FAILED**".to_string(),
    }
}

/// Every row, and the failures: a row whose audit failed (outside
/// [`known_bug`]) or whose outcome is not [`expected`].
fn table(found: &[Found]) -> (String, Vec<String>) {
    let mut table = String::from(
        "| tier | file | damage | stop | outcome | keys audited | lost, reported | lost silently |\n|---|---|---|---|---|---:|---:|---:|\n",
    );
    let mut failures = Vec::new();
    for f in found {
        let bug = known_bug(f.row);
        let outcome = match (&f.outcome, bug) {
            (Ok(o), None) => o.to_string(),
            (Ok(o), Some(_)) => format!("{o} (bug row)"),
            (Err(_), Some(_)) => "**silent loss: known bug**".to_string(),
            (Err(_), None) => "**FAILED**".to_string(),
        };
        table.push_str(&format!(
            "| {} | {outcome} | {} | {} | {} |\n",
            f.row, f.audited, f.lost_reported, f.lost_silently
        ));
        match (&f.outcome, bug) {
            (Err(e), Some(bug)) => println!("known bug ({bug}): {}: {e}", f.row),
            (Ok(_), Some(_)) => {}
            (Err(e), None) => failures.push(format!("{}: {e}", f.row)),
            (Ok(o), None) if *o == expected(f.row) => {}
            (Ok(o), None) => failures.push(format!("{}: {o}, expected {}", f.row, expected(f.row))),
        }
    }
    (table, failures)
}

/// A line of the summary: tier, file, damage, and the outcome per stop.
type Line = (String, String, String, [String; 3]);

/// The same file, damage and outcomes on both tiers: one line.
fn merge_tiers(lines: Vec<Line>) -> Vec<Line> {
    let mut merged: Vec<Line> = Vec::new();
    for line in lines {
        let twin = merged
            .iter_mut()
            .find(|m| m.1 == line.1 && m.2 == line.2 && m.3 == line.3 && m.0 == "memory");
        match twin {
            Some(m) if line.0 == "hybrid" => m.0 = "memory, hybrid".to_string(),
            _ => merged.push(line),
        }
    }
    merged
}

/// The rows folded: one line per tier, file and damage, a column per
/// stop; positions with the same outcomes share a line, and so do tiers.
fn summary(found: &[Found]) -> String {
    // (setup, kind, damage class) -> positions -> cells per stop.
    type Cells = [String; 3];
    type Positions = Vec<(Option<Pos>, Cells)>;
    let mut by_damage: BTreeMap<(Setup, Kind, String), Positions> = BTreeMap::new();
    let mut cells: BTreeMap<(Setup, Kind, Damage), Cells> = BTreeMap::new();
    for f in found {
        let at = (f.row.setup, f.row.kind, f.row.damage);
        let entry = cells
            .entry(at)
            .or_insert_with(|| ["—".into(), "—".into(), "—".into()]);
        entry[f.row.stop as usize] = cell(f);
    }
    for ((setup, kind, damage), c) in cells {
        let (class, pos) = match damage {
            Damage::Flip(p) => ("bit flip", Some(p)),
            Damage::Zero(p) => ("zeroed 4 KiB", Some(p)),
            _ => ("", None),
        };
        let names = Row {
            setup,
            kind,
            damage,
            stop: Stop::Term,
        }
        .names();
        let class = if class.is_empty() {
            names[2].clone()
        } else {
            class.to_string()
        };
        by_damage
            .entry((setup, kind, class))
            .or_default()
            .push((pos, c));
    }
    // Lines: (tier, file, damage label, cells).
    let mut lines: Vec<Line> = Vec::new();
    for ((setup, kind, class), positions) in by_damage {
        let row = |damage| Row {
            setup,
            kind,
            damage,
            stop: Stop::Term,
        };
        let names = row(Damage::Missing).names();
        let all_same = positions.iter().all(|(_, c)| *c == positions[0].1);
        if positions.len() > 1 && all_same {
            lines.push((
                names[0].clone(),
                names[1].clone(),
                format!("{class}, any position"),
                positions[0].1.clone(),
            ));
            continue;
        }
        for (pos, c) in positions {
            let label = match pos {
                Some(Pos::First) => row(Damage::Flip(Pos::First)).names()[2].clone(),
                Some(Pos::Middle) => row(Damage::Flip(Pos::Middle)).names()[2].clone(),
                Some(Pos::Last) => row(Damage::Flip(Pos::Last)).names()[2].clone(),
                None => class.clone(),
            };
            let label = label.replacen("bit flip", &class, 1);
            lines.push((names[0].clone(), names[1].clone(), label, c));
        }
    }
    let merged = merge_tiers(lines);
    let mut out = String::from(
        "| tier | file | damage | SIGTERM | SIGKILL | SIGKILL after idle |\n|---|---|---|---|---|---|\n",
    );
    for (tier, file, damage, c) in merged {
        out.push_str(&format!(
            "| {tier} | {file} | {damage} | {} | {} | {} |\n",
            c[0], c[1], c[2]
        ));
    }
    out
}
