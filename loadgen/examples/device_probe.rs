//! Profile accuracy probe: how many I/O units per second a throttled device
//! admits when R requesters each loop "write 4 KiB, then fdatasync" (the
//! shape of a WAL group commit) for S seconds, on the real disk or on the
//! simulated one. Prints achieved units/s next to the profile's burst rate.
//!
//! Usage: cargo run --release -p loadgen --example device_probe -- PROFILE real|sim REQUESTERS SECONDS

use engine::io::real::RealDisk;
use engine::io::sim::SimDisk;
use engine::io::throttle::{Device, Throttled};
use engine::io::{AlignedBuf, Disk, DiskFile, ALIGN};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

async fn requester<D: Disk>(disk: D, path: &Path, deadline: Instant) {
    if let Some(parent) = path.parent() {
        disk.create_dir_all(parent).expect("create dir");
    }
    let file = disk.open(path, true).await.expect("open");
    let mut block = 0u64;
    while Instant::now() < deadline {
        let mut buf = AlignedBuf::with_capacity(ALIGN);
        buf.extend_from_slice(&[1; ALIGN]);
        let (written, _) = file.write_at(buf, (block % 256) * ALIGN as u64).await;
        written.expect("write");
        file.sync_data().await.expect("fdatasync");
        block += 1;
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let profile_name = args.get(1).cloned().unwrap_or_else(|| "sas".to_string());
    let real = args.get(2).is_none_or(|s| s == "real");
    let requesters: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(2);
    let seconds: f64 = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(3.0);
    let profile = tunables::builtin_profile(&profile_name).expect("a built-in profile name");
    let dir = tempfile::tempdir().expect("tempdir");
    let device =
        Arc::new(Device::new("wal", dir.path(), &profile_name, profile.clone()).expect("device"));
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(seconds);
    let threads: Vec<_> = (0..requesters)
        .map(|t| {
            let device = device.clone();
            let path = dir.path().join(format!("r{t}/file"));
            std::thread::spawn(move || {
                let runtime = compio::runtime::Runtime::new().expect("compio runtime");
                runtime.block_on(async move {
                    if real {
                        requester(Throttled::new(RealDisk, device), &path, deadline).await;
                    } else {
                        requester(
                            Throttled::new(SimDisk::new(t as u64), device),
                            &path,
                            deadline,
                        )
                        .await;
                    }
                });
            })
        })
        .collect();
    for t in threads {
        t.join().expect("requester thread");
    }
    let elapsed = started.elapsed().as_secs_f64();
    let m = device.metrics();
    let rate = m.ios_admitted as f64 / elapsed;
    println!(
        "{profile_name} {} disk, {requesters} requesters: {:.0} units/s = {:.1}% of burst {} (sustained {}); token wait {:.2} s over {elapsed:.2} s; fdatasync p50 {} µs p99 {} µs",
        if real { "real" } else { "simulated" },
        rate,
        100.0 * rate / profile.burst_iops.max(1) as f64,
        profile.burst_iops,
        profile.iops,
        m.wait_ns_total as f64 / 1e9,
        m.fsync_latency.quantile(0.5) / 1_000,
        m.fsync_latency.quantile(0.99) / 1_000,
    );
}
