//! Device profiles through `Throttled<SimDisk>` on real compio runtimes:
//! the admitted I/O never exceeds what the token buckets allow over the
//! elapsed time, whether one shard or several threads share the device.
//! Only upper bounds (correctness of limiting) are asserted, never speed.

use ringkv_engine::io::sim::SimDisk;
use ringkv_engine::io::throttle::{Device, Throttled, PACING_WINDOW_NS};
use ringkv_engine::io::{AlignedBuf, Disk, DiskFile, ALIGN};
use std::cell::Cell;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tunables::{ByteSize, ProfileConfig};

const IOPS: u64 = 200;
const BURST_IOPS: u64 = 400;
const CREDIT: u64 = 50;

fn tiny_profile() -> ProfileConfig {
    ProfileConfig {
        iops: IOPS,
        burst_iops: BURST_IOPS,
        burst_credit: CREDIT,
        bytes_per_sec: ByteSize(0),
        io_unit: ByteSize::kib(256),
        count_fsync: true,
    }
}

/// The most unit I/Os the buckets admit within `elapsed` of a fresh device:
/// min(pacing capacity + burst_iops * t, credit + iops * t).
fn admissible(elapsed: Duration) -> u64 {
    let t = elapsed.as_secs_f64();
    let pacing_capacity = (BURST_IOPS * PACING_WINDOW_NS) as f64 / 1e9;
    let bound = (pacing_capacity + BURST_IOPS as f64 * t).min(CREDIT as f64 + IOPS as f64 * t);
    bound.floor() as u64
}

fn block() -> AlignedBuf {
    let mut buf = AlignedBuf::with_capacity(ALIGN);
    buf.extend_from_slice(&[0xA5; ALIGN]);
    buf
}

/// Writes in `tasks` concurrent tasks until `deadline`; returns how many
/// writes completed by then.
async fn hammer(disk: Throttled<SimDisk>, dir: PathBuf, tasks: usize, deadline: Instant) -> u64 {
    disk.create_dir_all(&dir).unwrap();
    let done = Rc::new(Cell::new(0u64));
    let mut handles = Vec::new();
    for task in 0..tasks {
        let disk = disk.clone();
        let done = done.clone();
        let path = dir.join(format!("f{task}"));
        handles.push(compio::runtime::spawn(async move {
            let file = disk.open(&path, true).await.unwrap();
            let mut offset = 0u64;
            while Instant::now() < deadline {
                let (r, _) = file.write_at(block(), offset).await;
                r.unwrap();
                if Instant::now() <= deadline {
                    done.set(done.get() + 1);
                }
                offset = (offset + ALIGN as u64) % (64 * ALIGN as u64);
            }
        }));
    }
    for handle in handles {
        handle.await.unwrap();
    }
    done.get()
}

#[test]
fn one_shard_stays_within_the_profile() {
    let created = Instant::now();
    let device = Arc::new(Device::new("tiny", "", "tiny", tiny_profile()).unwrap());
    let disk = Throttled::new(SimDisk::new(7), device.clone());
    let deadline = Instant::now() + Duration::from_millis(1000);
    let rt = compio::runtime::Runtime::new().unwrap();
    let done = rt.block_on(hammer(disk, PathBuf::from("/db"), 4, deadline));
    let bound = admissible(created.elapsed());
    let m = device.metrics();
    eprintln!("one shard: {done} writes completed, profile allows {bound}; {m:?}");
    assert!(
        done <= bound + 1,
        "{done} writes completed, profile allows {bound}"
    );
    // The pacing bucket's initial tokens go out without waiting.
    assert!(done >= 4, "only {done} writes");
    assert!(m.ios_admitted >= done);
    assert!(m.waits > 0 && m.wait_ns_total > 0, "{m:?}");
    // Every admitted write completed; each of the 4 files also prepaid the
    // fdatasync that would follow its first write (engine/src/io/throttle.rs),
    // and none was issued.
    assert_eq!(
        m.writes + 4,
        m.ios_admitted,
        "every admitted write completed, plus one prepaid fdatasync per file"
    );
}

#[test]
fn threads_share_one_device_budget() {
    let created = Instant::now();
    let device = Arc::new(Device::new("tiny", "", "tiny", tiny_profile()).unwrap());
    let sim = SimDisk::new(8);
    let deadline = Instant::now() + Duration::from_millis(600);
    let threads: Vec<_> = (0..3)
        .map(|shard| {
            let disk = Throttled::new(sim.clone(), device.clone());
            std::thread::spawn(move || {
                let rt = compio::runtime::Runtime::new().unwrap();
                let dir = PathBuf::from(format!("/db/shard-{shard}"));
                rt.block_on(hammer(disk, dir, 2, deadline))
            })
        })
        .collect();
    let total: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    let bound = admissible(created.elapsed());
    eprintln!("three shards: {total} writes completed, profile allows {bound}");
    assert!(
        total <= bound + 1,
        "{total} writes across shards, profile allows {bound}"
    );
    assert!(total >= 4, "only {total} writes");
    assert_eq!(sim.stats().writes, device.metrics().writes);
    assert_eq!(sim.files().len(), 6);
}

/// What a device and its sim disk counted after `ops` ran on a fresh pair.
fn counted_after(
    seed: u64,
    ops: impl FnOnce(&Throttled<SimDisk>),
) -> (
    ringkv_engine::io::throttle::DeviceMetricsSnapshot,
    ringkv_engine::io::sim::SimStats,
) {
    // Credit for every I/O of the test: none waits. With no credit each
    // one waits for a microsecond's refill, and an async wait needs a
    // compio runtime (this runs under pollster): the test failed whenever
    // two I/Os came within a microsecond.
    let profile = ProfileConfig {
        iops: 1_000_000,
        burst_iops: 1_000_000,
        burst_credit: 1_000_000,
        bytes_per_sec: ByteSize(0),
        io_unit: ByteSize::kib(256),
        count_fsync: true,
    };
    let device = Arc::new(Device::new("d", "", "fast", profile).unwrap());
    let sim = SimDisk::new(seed);
    ops(&Throttled::new(sim.clone(), device.clone()));
    (device.metrics(), sim.stats())
}

fn blocks(n: usize) -> AlignedBuf {
    let mut buf = AlignedBuf::with_capacity(n * ALIGN);
    buf.extend_from_slice(&vec![0x3C; n * ALIGN]);
    buf
}

/// The blocking calls are charged and counted exactly like the async ones:
/// the same sequence of operations, made once each way, leaves the same
/// device metrics (time-dependent ones aside) and the same sim stats.
#[test]
fn blocking_calls_count_in_device_metrics_like_async_ones() {
    let dir = PathBuf::from("/d");
    let path = dir.join("f");
    let (blocking, blocking_sim) = counted_after(20, |disk| {
        disk.create_dir_all(&dir).unwrap();
        let f = disk.open_blocking(&path, true).unwrap();
        f.write_at_blocking(&blocks(2), 0).unwrap();
        f.sync_data_blocking().unwrap(); // prepaid by the write
        f.sync_data_blocking().unwrap(); // pays for itself
        let mut buf = AlignedBuf::with_capacity(4 * ALIGN);
        assert_eq!(f.read_at_blocking(&mut buf, 0).unwrap(), 2 * ALIGN);
        assert!(f.write_at_blocking(&blocks(1), 100).is_err());
        f.write_at_blocking(&blocks(1), 2 * ALIGN as u64).unwrap();
        f.sync_data_blocking().unwrap();
        disk.sync_dir_blocking(&dir).unwrap();
        drop(f);
        disk.remove_file_blocking(&path).unwrap();
        disk.sync_dir_blocking(&dir).unwrap();
        assert!(!disk.exists(&path));
    });
    let (asynchronous, async_sim) = counted_after(20, |disk| {
        pollster::block_on(async {
            disk.create_dir_all(&dir).unwrap();
            let f = disk.open(&path, true).await.unwrap();
            f.write_at(blocks(2), 0).await.0.unwrap();
            f.sync_data().await.unwrap();
            f.sync_data().await.unwrap();
            let (r, _) = f.read_at(AlignedBuf::with_capacity(4 * ALIGN), 0).await;
            assert_eq!(r.unwrap(), 2 * ALIGN);
            assert!(f.write_at(blocks(1), 100).await.0.is_err());
            f.write_at(blocks(1), 2 * ALIGN as u64).await.0.unwrap();
            f.sync_data().await.unwrap();
            disk.sync_dir(&dir).await.unwrap();
            drop(f);
            disk.remove_file(&path).await.unwrap();
            disk.sync_dir(&dir).await.unwrap();
        })
    });
    let summary = |m: &ringkv_engine::io::throttle::DeviceMetricsSnapshot| {
        (
            (m.reads, m.writes, m.syncs),
            (m.bytes_read, m.bytes_written),
            (m.ios_admitted, m.errors, m.waits),
            (m.write_latency.count(), m.fsync_latency.count()),
        )
    };
    assert_eq!(summary(&blocking), summary(&asynchronous));
    assert_eq!(blocking_sim, async_sim);
    // And the numbers themselves: 3 fdatasyncs + 2 directory syncs; the
    // refused write still reserved its I/O and the next fdatasync's
    // (2 + 0 + 1 + 1 + 2 + 1 + 0 + 1 + 1 = 9 units).
    assert_eq!(
        summary(&blocking),
        (
            (1, 2, 5),
            (2 * ALIGN as u64, 3 * ALIGN as u64),
            (9, 1, 0),
            (2, 3)
        )
    );
    assert_eq!((blocking_sim.reads, blocking_sim.writes), (1, 2));
}

/// A tight IOPS profile makes blocking reads wait (on the calling thread,
/// with no runtime): 100 I/Os/s with no burst credit admits one read per
/// 10 ms, so 11 reads span at least 100 ms. Only a generous lower bound is
/// asserted (half of that).
#[test]
fn a_tight_profile_delays_blocking_reads() {
    const IOPS: u64 = 100;
    const READS: u64 = 11;
    let profile = ProfileConfig {
        iops: IOPS,
        burst_iops: IOPS,
        burst_credit: 0,
        bytes_per_sec: ByteSize(0),
        io_unit: ByteSize::kib(256),
        count_fsync: true,
    };
    let device = Arc::new(Device::new("slow", "", "slow", profile).unwrap());
    let sim = SimDisk::new(21);
    sim.create_dir_all(&PathBuf::from("/d")).unwrap();
    let path = PathBuf::from("/d/f");
    sim.open_blocking(&path, true)
        .unwrap()
        .write_at_blocking(&blocks(1), 0)
        .unwrap();
    let disk = Throttled::new(sim, device.clone());
    let f = disk.open_blocking(&path, false).unwrap();
    let mut buf = AlignedBuf::with_capacity(ALIGN);
    let start = Instant::now();
    for _ in 0..READS {
        assert_eq!(f.read_at_blocking(&mut buf, 0).unwrap(), ALIGN);
    }
    let elapsed = start.elapsed();
    let computed = Duration::from_millis((READS - 1) * 1000 / IOPS);
    let m = device.metrics();
    eprintln!("{READS} blocking reads took {elapsed:?} (profile: {computed:?}); {m:?}");
    assert!(
        elapsed >= computed / 2,
        "{READS} reads in {elapsed:?}, the profile needs {computed:?}"
    );
    assert_eq!((m.reads, m.ios_admitted), (READS, READS));
    assert!(m.waits >= READS / 2, "{m:?}");
    assert!(
        Duration::from_nanos(m.wait_ns_total) >= computed / 2,
        "{m:?}"
    );
}

/// A segment's zero-fill does not hold its device's later I/O until all
/// of it is paid for: it is admitted a piece at a time, and a write asked
/// for while it runs goes between two pieces. At 64 MiB/s a 32 MiB fill
/// takes half a second; a 4 KiB write asked for 10 ms in waits about one
/// piece (62 ms), where one admission for the whole fill made it wait
/// about 500 ms.
#[test]
fn a_write_is_admitted_between_the_pieces_of_a_zero_fill() {
    use ringkv_engine::io::throttle::ZERO_FILL_PIECE_BYTES;
    const FILL: u64 = 32 << 20;
    const {
        assert!(
            FILL / ZERO_FILL_PIECE_BYTES >= 4,
            "a fill of several pieces"
        )
    };
    let profile = ProfileConfig {
        iops: 0,
        burst_iops: 0,
        burst_credit: 0,
        bytes_per_sec: ByteSize::mib(64),
        io_unit: ByteSize::kib(256),
        count_fsync: false,
    };
    let device = Arc::new(Device::new("d", "", "bw", profile).unwrap());
    let disk = Throttled::new(SimDisk::new(21), device);
    let dir = PathBuf::from("/z");
    disk.create_dir_all(&dir).unwrap();
    compio::runtime::Runtime::new().unwrap().block_on(async {
        let start = Instant::now();
        let filler = {
            let disk = disk.clone();
            let path = dir.join("segment");
            compio::runtime::spawn(async move {
                let f = disk.open(&path, true).await.unwrap();
                f.allocate_zeroed(FILL).await.unwrap();
                start.elapsed()
            })
        };
        compio::time::sleep(Duration::from_millis(10)).await;
        let f = disk.open(&dir.join("log"), true).await.unwrap();
        let asked = Instant::now();
        f.write_at(block(), 0).await.0.unwrap();
        let waited = asked.elapsed();
        let fill = filler.await.unwrap();
        assert!(
            fill >= Duration::from_millis(400),
            "the fill took {fill:?}: the profile did not limit it"
        );
        assert!(
            waited < fill / 2,
            "the write waited {waited:?} behind a zero-fill of {fill:?}"
        );
    });
}

/// A fill from a length that is not on a block bound (after a `set_len`)
/// to several pieces' worth: every piece the backend is asked for ends on
/// a block bound, and the whole file reads as zeroes; an unaligned target
/// is refused as the backend refuses it, and nothing is charged for it.
#[test]
fn a_zero_fill_from_an_unaligned_length_is_pieced_on_block_bounds() {
    use ringkv_engine::io::throttle::ZERO_FILL_PIECE_BYTES;
    let profile = ProfileConfig {
        iops: 0,
        burst_iops: 0,
        burst_credit: 0,
        bytes_per_sec: ByteSize::gib(64),
        io_unit: ByteSize::kib(256),
        count_fsync: false,
    };
    let device = Arc::new(Device::new("d", "", "fast", profile).unwrap());
    let sim = SimDisk::new(22);
    let disk = Throttled::new(sim.clone(), device.clone());
    let dir = PathBuf::from("/u");
    disk.create_dir_all(&dir).unwrap();
    let path = dir.join("f");
    let target = 2 * ZERO_FILL_PIECE_BYTES + ALIGN as u64;
    compio::runtime::Runtime::new().unwrap().block_on(async {
        let f = disk.open(&path, true).await.unwrap();
        f.write_at(block(), 0).await.0.unwrap();
        f.set_len(1000).await.unwrap();
        f.allocate_zeroed(target).await.unwrap();
        assert_eq!(f.len().await.unwrap(), target);
        let charged = device.metrics().bytes_written;
        assert!(f.allocate_zeroed(target + 100).await.is_err());
        assert_eq!(device.metrics().bytes_written, charged);
    });
    let written = sim.read_written(&path).unwrap();
    assert_eq!(written.len() as u64, target);
    assert!(written[..1000].iter().all(|&b| b == 0xA5));
    assert!(written[1000..].iter().all(|&b| b == 0));
}
