//! Device profiles through `Throttled<SimDisk>` on real compio runtimes:
//! the admitted I/O never exceeds what the token buckets allow over the
//! elapsed time, whether one shard or several threads share the device.
//! Only upper bounds (correctness of limiting) are asserted, never speed.

use engine::io::sim::SimDisk;
use engine::io::throttle::{Device, Throttled, PACING_WINDOW_NS};
use engine::io::{AlignedBuf, Disk, DiskFile, ALIGN};
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
