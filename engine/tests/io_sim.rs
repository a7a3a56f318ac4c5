//! The simulated disk keeps its promises: O_DIRECT rules, written vs durable
//! images, directory durability, crash images (prefix + torn block, never
//! invented data), one-shot injected faults, determinism by seed.

use ringkv_engine::io::sim::{SimDisk, SimFaults, SECTOR_BYTES};
use ringkv_engine::io::{AlignedBuf, Disk, DiskFile, ALIGN};
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn filled(byte: u8, blocks: usize) -> AlignedBuf {
    let mut buf = AlignedBuf::with_capacity(blocks * ALIGN);
    buf.extend_from_slice(&vec![byte; blocks * ALIGN]);
    buf
}

fn run<F: std::future::Future>(f: F) -> F::Output {
    pollster::block_on(f)
}

fn p(s: &str) -> PathBuf {
    PathBuf::from(s)
}

async fn write(file: &impl DiskFile, byte: u8, blocks: usize, offset: u64) {
    let (r, _) = file.write_at(filled(byte, blocks), offset).await;
    r.unwrap();
}

#[test]
fn misaligned_io_is_refused_like_o_direct() {
    run(async {
        let disk = SimDisk::new(1);
        disk.create_dir_all(&p("/db")).unwrap();
        let f = disk.open(&p("/db/a"), true).await.unwrap();

        let mut short = AlignedBuf::with_capacity(ALIGN);
        short.extend_from_slice(b"abc");
        let (r, _) = f.write_at(short, 0).await;
        assert_eq!(r.unwrap_err().kind(), ErrorKind::InvalidInput);

        let (r, _) = f.write_at(filled(1, 1), 100).await;
        assert_eq!(r.unwrap_err().kind(), ErrorKind::InvalidInput);

        let (r, _) = f.read_at(AlignedBuf::with_capacity(ALIGN), 512).await;
        assert_eq!(r.unwrap_err().kind(), ErrorKind::InvalidInput);

        let err = f.allocate_zeroed(5000).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput);

        // Nothing was written by the refused calls.
        assert_eq!(disk.file_len(&p("/db/a")), Some(0));
        assert_eq!(disk.stats().writes, 0);
    });
}

#[test]
fn read_returns_written_image_and_short_at_eof() {
    run(async {
        let disk = SimDisk::new(2);
        disk.create_dir_all(&p("/db")).unwrap();
        let f = disk.open(&p("/db/a"), true).await.unwrap();
        write(&f, 0xAB, 2, 0).await;
        write(&f, 0xCD, 1, 4 * ALIGN as u64).await; // leaves a hole of zeroes
        assert_eq!(f.len().await.unwrap(), 5 * ALIGN as u64);

        let (r, buf) = f.read_at(AlignedBuf::with_capacity(8 * ALIGN), 0).await;
        assert_eq!(r.unwrap(), 5 * ALIGN);
        let data = buf.as_slice();
        assert!(data[..2 * ALIGN].iter().all(|&b| b == 0xAB));
        assert!(data[2 * ALIGN..4 * ALIGN].iter().all(|&b| b == 0));
        assert!(data[4 * ALIGN..].iter().all(|&b| b == 0xCD));

        let (r, buf) = f
            .read_at(AlignedBuf::with_capacity(ALIGN), 8 * ALIGN as u64)
            .await;
        assert_eq!(r.unwrap(), 0);
        assert!(buf.is_empty());
    });
}

#[test]
fn crash_keeps_only_synced_data_without_torn_writes() {
    run(async {
        let disk = SimDisk::new(3);
        disk.set_faults(SimFaults {
            torn_write_on_crash: false,
            ..SimFaults::default()
        });
        disk.create_dir_all(&p("/db")).unwrap();
        let f = disk.open(&p("/db/wal"), true).await.unwrap();
        f.allocate_zeroed(4 * ALIGN as u64).await.unwrap();
        write(&f, 1, 1, 0).await;
        f.sync_data().await.unwrap();
        disk.sync_dir(&p("/db")).await.unwrap();
        write(&f, 2, 2, ALIGN as u64).await;
        write(&f, 3, 1, 0).await;

        disk.crash();
        let image = disk.read_written(&p("/db/wal")).unwrap();
        assert_eq!(image.len(), 4 * ALIGN);
        assert!(image[..ALIGN].iter().all(|&b| b == 1));
        assert!(image[ALIGN..].iter().all(|&b| b == 0));
        assert_eq!(disk.stats().crashes, 1);
    });
}

#[test]
fn handles_do_not_survive_a_crash() {
    run(async {
        let disk = SimDisk::new(4);
        disk.create_dir_all(&p("/db")).unwrap();
        let f = disk.open(&p("/db/a"), true).await.unwrap();
        disk.sync_dir(&p("/db")).await.unwrap();
        disk.crash();
        let (r, _) = f.write_at(filled(9, 1), 0).await;
        assert!(r.is_err());
        assert!(f.sync_data().await.is_err());
        assert!(f.len().await.is_err());
        drop(f);
        // The file itself is still there and usable through a new handle.
        let g = disk.open(&p("/db/a"), false).await.unwrap();
        write(&g, 9, 1, 0).await;
        assert_eq!(disk.file_len(&p("/db/a")), Some(ALIGN as u64));
    });
}

#[test]
fn directory_operations_need_sync_dir() {
    run(async {
        let disk = SimDisk::new(5);
        disk.create_dir_all(&p("/db/wal")).unwrap();

        // Created, data synced, but the directory entry never synced: gone.
        let f = disk.open(&p("/db/wal/seg-1"), true).await.unwrap();
        write(&f, 1, 1, 0).await;
        f.sync_data().await.unwrap();
        drop(f);
        disk.crash();
        assert!(!disk.exists(&p("/db/wal/seg-1")));
        assert!(
            disk.exists(&p("/db/wal")),
            "directories are durable at once"
        );

        // Created and entry synced: survives with its durable data.
        let f = disk.open(&p("/db/wal/seg-1"), true).await.unwrap();
        write(&f, 1, 1, 0).await;
        f.sync_data().await.unwrap();
        disk.sync_dir(&p("/db/wal")).await.unwrap();
        drop(f);

        // Unsynced rename and removal are undone by a crash.
        disk.rename(&p("/db/wal/seg-1"), &p("/db/wal/seg-2"))
            .await
            .unwrap();
        assert!(disk.exists(&p("/db/wal/seg-2")));
        disk.crash();
        assert!(disk.exists(&p("/db/wal/seg-1")));
        assert!(!disk.exists(&p("/db/wal/seg-2")));

        disk.remove_file(&p("/db/wal/seg-1")).await.unwrap();
        assert!(!disk.exists(&p("/db/wal/seg-1")));
        disk.crash();
        assert_eq!(
            disk.read_written(&p("/db/wal/seg-1")).unwrap(),
            vec![1; ALIGN]
        );

        // Synced rename and removal stick.
        disk.rename(&p("/db/wal/seg-1"), &p("/db/wal/seg-2"))
            .await
            .unwrap();
        disk.sync_dir(&p("/db/wal")).await.unwrap();
        disk.crash();
        assert_eq!(disk.files(), vec![p("/db/wal/seg-2")]);
        disk.remove_file(&p("/db/wal/seg-2")).await.unwrap();
        disk.sync_dir(&p("/db/wal")).await.unwrap();
        disk.crash();
        assert!(disk.files().is_empty());
    });
}

#[test]
fn rename_replaces_target_and_keeps_open_handle() {
    run(async {
        let disk = SimDisk::new(6);
        disk.create_dir_all(&p("/db")).unwrap();
        let tmp = disk.open(&p("/db/snap.tmp"), true).await.unwrap();
        let old = disk.open(&p("/db/snap"), true).await.unwrap();
        write(&old, 1, 1, 0).await;
        write(&tmp, 2, 1, 0).await;
        disk.rename(&p("/db/snap.tmp"), &p("/db/snap"))
            .await
            .unwrap();
        assert_eq!(disk.read_written(&p("/db/snap")).unwrap(), vec![2; ALIGN]);
        assert!(!disk.exists(&p("/db/snap.tmp")));
        // The handle follows the inode, not the name.
        write(&tmp, 3, 1, ALIGN as u64).await;
        assert_eq!(disk.file_len(&p("/db/snap")), Some(2 * ALIGN as u64));
        // The replaced file's handle still works on its own (unnamed) inode.
        write(&old, 4, 1, 0).await;
        assert_eq!(disk.read_written(&p("/db/snap")).unwrap()[0], 2);
    });
}

#[test]
fn namespace_errors() {
    run(async {
        let disk = SimDisk::new(7);
        let err = disk.open(&p("/nope/a"), true).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotFound);
        disk.create_dir_all(&p("/db/sub")).unwrap();
        assert_eq!(
            disk.open(&p("/db/a"), false).await.unwrap_err().kind(),
            ErrorKind::NotFound
        );
        assert_eq!(
            disk.open(&p("/db/sub"), true).await.unwrap_err().kind(),
            ErrorKind::IsADirectory
        );
        assert_eq!(
            disk.remove_file(&p("/db/a")).await.unwrap_err().kind(),
            ErrorKind::NotFound
        );
        assert_eq!(
            disk.rename(&p("/db/a"), &p("/db/b"))
                .await
                .unwrap_err()
                .kind(),
            ErrorKind::NotFound
        );
        assert_eq!(
            disk.sync_dir(&p("/elsewhere")).await.unwrap_err().kind(),
            ErrorKind::NotFound
        );
        assert_eq!(
            disk.list_dir(&p("/elsewhere")).unwrap_err().kind(),
            ErrorKind::NotFound
        );
        drop(disk.open(&p("/db/file"), true).await.unwrap());
        assert!(disk.create_dir_all(&p("/db/file/x")).is_err());
    });
}

#[test]
fn list_dir_is_sorted_files_only() {
    run(async {
        let disk = SimDisk::new(8);
        disk.create_dir_all(&p("/db/shard-000/wal")).unwrap();
        for name in ["c", "a", "b"] {
            drop(disk.open(&p(&format!("/db/{name}")), true).await.unwrap());
        }
        drop(disk.open(&p("/db/shard-000/wal/x"), true).await.unwrap());
        assert_eq!(
            disk.list_dir(&p("/db")).unwrap(),
            vec![p("/db/a"), p("/db/b"), p("/db/c")]
        );
        assert_eq!(
            disk.list_dir(&p("/db/shard-000/wal/")).unwrap(),
            vec![p("/db/shard-000/wal/x")]
        );
        assert!(disk.list_dir(&p("/db/shard-000")).unwrap().is_empty());
    });
}

#[test]
fn allocate_zeroed_and_set_len() {
    run(async {
        let disk = SimDisk::new(9);
        disk.create_dir_all(&p("/db")).unwrap();
        let f = disk.open(&p("/db/a"), true).await.unwrap();
        write(&f, 5, 1, 0).await;
        f.allocate_zeroed(3 * ALIGN as u64).await.unwrap();
        f.allocate_zeroed(ALIGN as u64).await.unwrap(); // never shrinks
        assert_eq!(f.len().await.unwrap(), 3 * ALIGN as u64);
        let image = disk.read_written(&p("/db/a")).unwrap();
        assert!(image[..ALIGN].iter().all(|&b| b == 5));
        assert!(image[ALIGN..].iter().all(|&b| b == 0));
        assert_eq!(disk.read_durable(&p("/db/a")).unwrap().len(), 0);
        f.sync_data().await.unwrap();
        assert_eq!(disk.read_durable(&p("/db/a")).unwrap().len(), 3 * ALIGN);

        f.set_len(100).await.unwrap();
        assert_eq!(f.len().await.unwrap(), 100);
        f.set_len(ALIGN as u64 * 2).await.unwrap();
        let image = disk.read_written(&p("/db/a")).unwrap();
        assert!(image[..100].iter().all(|&b| b == 5));
        assert!(image[100..].iter().all(|&b| b == 0));
    });
}

/// Checks the crash image of `after` against `before` (the durable image)
/// and `target` (the written image before the crash): every byte is old or
/// new; the new bytes form whole blocks of a prefix plus at most one torn
/// block, sector by sector.
fn assert_prefix_with_one_torn_block(before: &[u8], target: &[u8], after: &[u8]) -> bool {
    assert_eq!(after.len(), before.len());
    let mut torn_seen = false;
    let mut old_seen = false;
    for (index, block) in after.chunks(ALIGN).enumerate() {
        let start = index * ALIGN;
        let old = &before[start..start + block.len()];
        let new = &target[start..start + block.len()];
        if old == new {
            continue; // block not touched by the unsynced writes
        }
        if block == new && !old_seen && !torn_seen {
            continue; // persisted whole, in order
        }
        if block == old {
            old_seen = true;
            continue;
        }
        assert!(!torn_seen && !old_seen, "a torn block after a lost block");
        torn_seen = true;
        for (s, sector) in block.chunks(SECTOR_BYTES).enumerate() {
            let range = s * SECTOR_BYTES..(s + 1) * SECTOR_BYTES;
            assert!(
                sector == &old[range.clone()] || sector == &new[range],
                "sector {s} of block {index} is neither old nor new"
            );
        }
    }
    torn_seen
}

#[test]
fn torn_crash_keeps_a_prefix_and_at_most_one_torn_block() {
    let mut torn_count = 0;
    let mut whole_kept = 0;
    for seed in 0..64 {
        run(async {
            let disk = SimDisk::new(seed);
            disk.create_dir_all(&p("/db")).unwrap();
            let f = disk.open(&p("/db/wal"), true).await.unwrap();
            f.allocate_zeroed(16 * ALIGN as u64).await.unwrap();
            write(&f, 0x11, 2, 0).await;
            f.sync_data().await.unwrap();
            disk.sync_dir(&p("/db")).await.unwrap();
            // Unsynced: distinct bytes per block so prefix order is visible.
            for block in 2..8u64 {
                let mut buf = AlignedBuf::with_capacity(ALIGN);
                let pattern: Vec<u8> = (0..ALIGN).map(|i| (i % 251) as u8 ^ block as u8).collect();
                buf.extend_from_slice(&pattern);
                let (r, _) = f.write_at(buf, block * ALIGN as u64).await;
                r.unwrap();
            }
            // A write past the durable length is never kept.
            write(&f, 0x77, 1, 20 * ALIGN as u64).await;
            let before = disk.read_durable(&p("/db/wal")).unwrap();
            let target = disk.read_written(&p("/db/wal")).unwrap();
            disk.crash();
            let after = disk.read_written(&p("/db/wal")).unwrap();
            assert_eq!(after.len(), 16 * ALIGN, "seed {seed}");
            if assert_prefix_with_one_torn_block(&before, &target[..before.len()], &after) {
                torn_count += 1;
            }
            if after[2 * ALIGN..3 * ALIGN] == target[2 * ALIGN..3 * ALIGN] {
                whole_kept += 1;
            }
            assert_eq!(disk.read_durable(&p("/db/wal")).unwrap(), after);
        });
    }
    // 64 seeds: the tear and the kept prefix each show up (deterministic).
    assert!(torn_count > 0, "no seed produced a torn block");
    assert!(whole_kept > 0, "no seed kept a whole unsynced block");
    assert!(torn_count < 64);
}

#[test]
fn write_fault_is_one_shot_and_counts_matching_writes() {
    run(async {
        let disk = SimDisk::new(10);
        disk.create_dir_all(&p("/db")).unwrap();
        let wal = disk.open(&p("/db/wal-1"), true).await.unwrap();
        let other = disk.open(&p("/db/snap"), true).await.unwrap();
        disk.set_faults(SimFaults {
            fail_write_after: Some(1),
            path_filter: Some("wal".into()),
            ..SimFaults::default()
        });
        write(&other, 1, 1, 0).await; // not counted: filtered out
        write(&wal, 1, 1, 0).await; // 0th matching write
        let (r, _) = wal.write_at(filled(2, 1), 0).await; // 1st: fails
        let err = r.unwrap_err();
        assert!(err.to_string().contains("injected EIO"), "{err}");
        write(&wal, 3, 1, 0).await; // one-shot: works again
        write(&other, 3, 1, 0).await;
        let stats = disk.stats();
        assert_eq!(stats.injected_write_errors, 1);
        assert_eq!(stats.writes, 4);
    });
}

#[test]
fn sync_fault_drops_unsynced_data() {
    run(async {
        let disk = SimDisk::new(11);
        disk.create_dir_all(&p("/db")).unwrap();
        let f = disk.open(&p("/db/wal"), true).await.unwrap();
        write(&f, 1, 1, 0).await;
        f.sync_data().await.unwrap();
        disk.set_faults(SimFaults {
            fail_sync_after: Some(0),
            ..SimFaults::default()
        });
        write(&f, 2, 1, 0).await;
        write(&f, 2, 1, ALIGN as u64).await;
        assert!(f.sync_data().await.is_err());
        // The unsynced data is gone even before any crash.
        assert_eq!(disk.read_written(&p("/db/wal")).unwrap(), vec![1; ALIGN]);
        // One-shot: a (forbidden for the engine) retry would succeed, and
        // would make the old image durable, not the lost writes.
        f.sync_data().await.unwrap();
        assert_eq!(disk.read_durable(&p("/db/wal")).unwrap(), vec![1; ALIGN]);
        assert_eq!(disk.stats().injected_sync_errors, 1);
    });
}

#[test]
fn corrupt_read_flips_exactly_one_bit() {
    run(async {
        let disk = SimDisk::new(12);
        disk.create_dir_all(&p("/db")).unwrap();
        let f = disk.open(&p("/db/a"), true).await.unwrap();
        write(&f, 0x5A, 2, 0).await;
        disk.set_faults(SimFaults {
            corrupt_read_probability: 1.0,
            ..SimFaults::default()
        });
        for _ in 0..10 {
            let (r, buf) = f.read_at(AlignedBuf::with_capacity(2 * ALIGN), 0).await;
            assert_eq!(r.unwrap(), 2 * ALIGN);
            let flipped: u32 = buf
                .as_slice()
                .iter()
                .map(|&b| (b ^ 0x5A).count_ones())
                .sum();
            assert_eq!(flipped, 1);
        }
        // The stored image is untouched.
        assert_eq!(
            disk.read_written(&p("/db/a")).unwrap(),
            vec![0x5A; 2 * ALIGN]
        );
        assert_eq!(disk.stats().corrupted_reads, 10);
    });
}

#[test]
fn corrupt_at_rest_hits_both_images() {
    run(async {
        let disk = SimDisk::new(13);
        disk.create_dir_all(&p("/db")).unwrap();
        let f = disk.open(&p("/db/a"), true).await.unwrap();
        write(&f, 0, 1, 0).await;
        f.sync_data().await.unwrap();
        assert!(disk.corrupt(&p("/db/a"), 10, 2));
        assert!(!disk.corrupt(&p("/db/missing"), 0, 1));
        for image in [
            disk.read_written(&p("/db/a")).unwrap(),
            disk.read_durable(&p("/db/a")).unwrap(),
        ] {
            assert_eq!(&image[9..13], &[0, 0xFF, 0xFF, 0]);
        }
    });
}

/// The same seed and operations give the same crash images and stats.
#[test]
fn deterministic_by_seed() {
    fn scenario(seed: u64) -> (Vec<u8>, ringkv_engine::io::sim::SimStats) {
        run(async {
            let disk = SimDisk::new(seed);
            disk.set_faults(SimFaults {
                corrupt_read_probability: 0.3,
                ..SimFaults::default()
            });
            disk.create_dir_all(&p("/db")).unwrap();
            let f = disk.open(&p("/db/a"), true).await.unwrap();
            f.allocate_zeroed(32 * ALIGN as u64).await.unwrap();
            f.sync_data().await.unwrap();
            disk.sync_dir(&p("/db")).await.unwrap();
            for i in 0..16u64 {
                write(&f, i as u8 + 1, 2, i * 2 * ALIGN as u64).await;
                let _ = f.read_at(AlignedBuf::with_capacity(ALIGN), 0).await;
            }
            disk.crash();
            (disk.read_written(&p("/db/a")).unwrap(), disk.stats())
        })
    }
    assert_eq!(scenario(99), scenario(99));
    let differing = (0..8).filter(|&s| scenario(s) != scenario(99)).count();
    assert!(differing > 0, "the seed has no effect");
}

#[test]
fn latency_delays_on_a_compio_runtime() {
    let rt = compio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let disk = SimDisk::new(14);
        disk.create_dir_all(&p("/db")).unwrap();
        let f = disk.open(&p("/db/a"), true).await.unwrap();
        disk.set_faults(SimFaults {
            latency: Some(Duration::from_millis(5)),
            ..SimFaults::default()
        });
        let start = Instant::now();
        write(&f, 1, 1, 0).await;
        f.sync_data().await.unwrap();
        // A lower bound only: a timer never fires early.
        assert!(start.elapsed() >= Duration::from_millis(10));
        assert_eq!(disk.read_durable(&p("/db/a")).unwrap(), vec![1; ALIGN]);
    });
}

#[test]
fn shared_between_threads() {
    let disk = SimDisk::new(15);
    disk.create_dir_all(&p("/db")).unwrap();
    let threads: Vec<_> = (0..4u8)
        .map(|t| {
            let disk = disk.clone();
            std::thread::spawn(move || {
                run(async {
                    let path = p(&format!("/db/shard-{t}"));
                    let f = disk.open(&path, true).await.unwrap();
                    for i in 0..8 {
                        write(&f, t, 1, i * ALIGN as u64).await;
                    }
                    f.sync_data().await.unwrap();
                })
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    run(disk.sync_dir(Path::new("/db"))).unwrap();
    disk.crash();
    for t in 0..4u8 {
        let image = disk.read_written(&p(&format!("/db/shard-{t}"))).unwrap();
        assert_eq!(image, vec![t; 8 * ALIGN]);
    }
    assert_eq!(disk.stats().writes, 32);
}

// The blocking variants run on the same state as the async calls: the
// tests below mix both kinds on one file and check that crash, faults,
// stats and alignment rules treat them alike.

fn write_blocking(file: &impl DiskFile, byte: u8, blocks: usize, offset: u64) {
    file.write_at_blocking(&filled(byte, blocks), offset)
        .unwrap();
}

#[test]
fn blocking_write_is_lost_in_a_crash_unless_synced() {
    let disk = SimDisk::new(40);
    disk.set_faults(SimFaults {
        torn_write_on_crash: false,
        ..SimFaults::default()
    });
    disk.create_dir_all(&p("/db")).unwrap();
    let lost = disk.open_blocking(&p("/db/lost"), true).unwrap();
    let kept = disk.open_blocking(&p("/db/kept"), true).unwrap();
    disk.sync_dir_blocking(&p("/db")).unwrap();
    write_blocking(&lost, 1, 2, 0);
    write_blocking(&kept, 2, 2, 0);
    kept.sync_data_blocking().unwrap();
    // Before the crash both are readable; only one is durable.
    assert_eq!(
        disk.read_written(&p("/db/lost")).unwrap(),
        vec![1; 2 * ALIGN]
    );
    assert_eq!(disk.read_durable(&p("/db/lost")).unwrap(), Vec::<u8>::new());
    assert_eq!(
        disk.read_durable(&p("/db/kept")).unwrap(),
        vec![2; 2 * ALIGN]
    );

    disk.crash();
    assert_eq!(disk.read_written(&p("/db/lost")).unwrap(), Vec::<u8>::new());
    assert_eq!(
        disk.read_written(&p("/db/kept")).unwrap(),
        vec![2; 2 * ALIGN]
    );
    let stats = disk.stats();
    assert_eq!((stats.writes, stats.bytes_written), (2, 4 * ALIGN as u64));
    assert_eq!((stats.syncs, stats.dir_syncs), (1, 1));

    // Handles from before the crash are dead for blocking calls too.
    assert!(lost.write_at_blocking(&filled(3, 1), 0).is_err());
    assert!(lost
        .read_at_blocking(&mut AlignedBuf::with_capacity(ALIGN), 0)
        .is_err());
    assert!(kept.sync_data_blocking().is_err());
}

#[test]
fn blocking_namespace_changes_need_a_blocking_or_async_sync_dir() {
    let disk = SimDisk::new(41);
    disk.create_dir_all(&p("/db")).unwrap();
    drop(disk.open_blocking(&p("/db/a"), true).unwrap());
    drop(disk.open_blocking(&p("/db/b"), true).unwrap());
    run(disk.sync_dir(&p("/db"))).unwrap();
    disk.remove_file_blocking(&p("/db/a")).unwrap();
    drop(disk.open_blocking(&p("/db/c"), true).unwrap());
    assert!(!disk.exists(&p("/db/a")));
    // Not yet durable: a crash brings "a" back and loses "c".
    disk.crash();
    assert_eq!(disk.files(), vec![p("/db/a"), p("/db/b")]);
    disk.remove_file_blocking(&p("/db/a")).unwrap();
    disk.sync_dir_blocking(&p("/db")).unwrap();
    disk.crash();
    assert_eq!(disk.files(), vec![p("/db/b")]);

    let err = disk.open_blocking(&p("/db/missing"), false).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound);
    assert!(err.to_string().contains("/db/missing"), "{err}");
    let err = disk.remove_file_blocking(&p("/db/missing")).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound);
    let err = disk.sync_dir_blocking(&p("/nodir")).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound);
    assert_eq!(
        disk.open_blocking(&p("/db"), true).unwrap_err().kind(),
        ErrorKind::IsADirectory
    );
}

/// Unsynced blocking writes are pending writes like async ones: a crash
/// with torn writes keeps a prefix of them (in order, with at most one torn
/// block), whichever kind of call made each write.
#[test]
fn unsynced_blocking_writes_tear_like_async_ones() {
    let (mut changed, mut all_kept) = (0, 0);
    for seed in 0..48 {
        let disk = SimDisk::new(seed);
        disk.create_dir_all(&p("/db")).unwrap();
        let f = disk.open_blocking(&p("/db/wal"), true).unwrap();
        run(f.allocate_zeroed(12 * ALIGN as u64)).unwrap();
        f.sync_data_blocking().unwrap();
        disk.sync_dir_blocking(&p("/db")).unwrap();
        for block in 0..8u64 {
            let mut buf = AlignedBuf::with_capacity(ALIGN);
            let pattern: Vec<u8> = (0..ALIGN)
                .map(|i| (i % 241) as u8 ^ (block as u8 + 1))
                .collect();
            buf.extend_from_slice(&pattern);
            let offset = block * ALIGN as u64;
            if block % 3 == 1 {
                let (r, _) = run(f.write_at(buf, offset));
                r.unwrap();
            } else {
                f.write_at_blocking(&buf, offset).unwrap();
            }
        }
        let before = disk.read_durable(&p("/db/wal")).unwrap();
        let target = disk.read_written(&p("/db/wal")).unwrap();
        disk.crash();
        let after = disk.read_written(&p("/db/wal")).unwrap();
        assert_eq!(after.len(), 12 * ALIGN, "seed {seed}");
        assert_prefix_with_one_torn_block(&before, &target, &after);
        if after != before {
            changed += 1;
        }
        if after == target {
            all_kept += 1;
        }
    }
    assert!(changed > 0, "no crash kept any unsynced blocking write");
    assert!(all_kept < 48, "no crash lost any unsynced blocking write");
}

#[test]
fn blocking_and_async_views_agree() {
    let rt = compio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let disk = SimDisk::new(42);
        disk.create_dir_all(&p("/db")).unwrap();
        let f = disk.open(&p("/db/a"), true).await.unwrap();
        // Blocking write, async read.
        write_blocking(&f, 0xB1, 2, 0);
        let (r, buf) = f.read_at(AlignedBuf::with_capacity(2 * ALIGN), 0).await;
        assert_eq!(r.unwrap(), 2 * ALIGN);
        assert_eq!(buf.as_slice(), filled(0xB1, 2).as_slice());
        // Async write, blocking read (short at end of file, with a hole).
        write(&f, 0xA2, 1, 3 * ALIGN as u64).await;
        let mut buf = AlignedBuf::with_capacity(8 * ALIGN);
        buf.extend_from_slice(b"stale");
        assert_eq!(
            f.read_at_blocking(&mut buf, ALIGN as u64).unwrap(),
            3 * ALIGN
        );
        assert_eq!(buf.len(), 3 * ALIGN);
        assert!(buf.as_slice()[..ALIGN].iter().all(|&b| b == 0xB1));
        assert!(buf.as_slice()[ALIGN..2 * ALIGN].iter().all(|&b| b == 0));
        assert!(buf.as_slice()[2 * ALIGN..].iter().all(|&b| b == 0xA2));
        // Past the end: empty.
        assert_eq!(f.read_at_blocking(&mut buf, 16 * ALIGN as u64).unwrap(), 0);
        assert!(buf.is_empty());
        // A blocking handle and an async one on the same file see each other.
        let g = disk.open_blocking(&p("/db/a"), false).unwrap();
        write_blocking(&g, 0xC3, 1, 0);
        let (r, buf) = f.read_at(AlignedBuf::with_capacity(ALIGN), 0).await;
        assert_eq!(r.unwrap(), ALIGN);
        assert_eq!(buf.as_slice(), filled(0xC3, 1).as_slice());
        // A blocking sync makes async writes durable, and the other way round.
        write(&f, 0xD4, 1, 0).await;
        g.sync_data_blocking().unwrap();
        assert_eq!(
            &disk.read_durable(&p("/db/a")).unwrap()[..ALIGN],
            &[0xD4; ALIGN]
        );
        write_blocking(&g, 0xE5, 1, 0);
        f.sync_data().await.unwrap();
        assert_eq!(
            &disk.read_durable(&p("/db/a")).unwrap()[..ALIGN],
            &[0xE5; ALIGN]
        );

        let stats = disk.stats();
        assert_eq!(stats.writes, 5);
        assert_eq!(stats.reads, 4, "blocking reads count too");
        // 2 + 3 + 0 (past the end) + 1 blocks.
        assert_eq!(stats.bytes_read, 6 * ALIGN as u64);
        assert_eq!(stats.syncs, 2);
    });
}

#[test]
fn misaligned_blocking_calls_are_refused() {
    let disk = SimDisk::new(43);
    disk.create_dir_all(&p("/db")).unwrap();
    let f = disk.open_blocking(&p("/db/a"), true).unwrap();
    let mut short = AlignedBuf::with_capacity(ALIGN);
    short.extend_from_slice(b"abc");
    let err = f.write_at_blocking(&short, 0).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    assert!(err.to_string().contains("/db/a"), "{err}");
    let err = f.write_at_blocking(&filled(1, 1), 100).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    assert!(err.to_string().contains("offset 100"), "{err}");
    let mut buf = AlignedBuf::with_capacity(ALIGN);
    let err = f.read_at_blocking(&mut buf, 512).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    assert!(err.to_string().contains("offset 512"), "{err}");
    assert_eq!(disk.file_len(&p("/db/a")), Some(0));
    let stats = disk.stats();
    assert_eq!((stats.writes, stats.reads), (0, 0));
}

/// One countdown for both kinds of call: the Nth matching write or sync
/// fails whether it is async or blocking.
#[test]
fn fault_countdowns_count_blocking_and_async_calls_together() {
    let disk = SimDisk::new(44);
    disk.create_dir_all(&p("/db")).unwrap();
    let f = disk.open_blocking(&p("/db/wal"), true).unwrap();
    write_blocking(&f, 1, 1, 0);
    f.sync_data_blocking().unwrap();
    disk.set_faults(SimFaults {
        fail_write_after: Some(1),
        fail_sync_after: Some(1),
        ..SimFaults::default()
    });
    run(write(&f, 2, 1, 0)); // write #0 (async)
    let err = f.write_at_blocking(&filled(3, 1), 0).unwrap_err(); // write #1
    assert!(err.to_string().contains("injected EIO"), "{err}");
    write_blocking(&f, 4, 1, ALIGN as u64); // one-shot: works again
    run(f.sync_data()).unwrap(); // sync #0 (async)
    write_blocking(&f, 5, 1, 0);
    let err = f.sync_data_blocking().unwrap_err(); // sync #1: drops unsynced data
    assert!(err.to_string().contains("injected EIO"), "{err}");
    let durable = disk.read_durable(&p("/db/wal")).unwrap();
    assert_eq!(disk.read_written(&p("/db/wal")).unwrap(), durable);
    assert_eq!(&durable[ALIGN..], &[4; ALIGN]);
    let stats = disk.stats();
    assert_eq!(
        (stats.injected_write_errors, stats.injected_sync_errors),
        (1, 1)
    );
}

#[test]
fn read_errors_hit_both_read_paths_when_certain_and_never_when_off() {
    let disk = SimDisk::new(45);
    disk.create_dir_all(&p("/db")).unwrap();
    let f = disk.open_blocking(&p("/db/a"), true).unwrap();
    let other = disk.open_blocking(&p("/db/other"), true).unwrap();
    write_blocking(&f, 7, 1, 0);
    write_blocking(&other, 8, 1, 0);
    disk.set_faults(SimFaults {
        read_error_probability: 1.0,
        path_filter: Some("/a".into()),
        ..SimFaults::default()
    });
    let (r, buf) = run(f.read_at(AlignedBuf::with_capacity(ALIGN), 0));
    let err = r.unwrap_err();
    assert!(err.to_string().contains("injected EIO on read_at"), "{err}");
    assert!(buf.is_empty(), "a failed read returns no data");
    let mut buf = AlignedBuf::with_capacity(ALIGN);
    let err = f.read_at_blocking(&mut buf, 0).unwrap_err();
    assert!(err.to_string().contains("injected EIO on read_at"), "{err}");
    // The path filter applies: the other file reads fine.
    assert_eq!(other.read_at_blocking(&mut buf, 0).unwrap(), ALIGN);
    let stats = disk.stats();
    assert_eq!(stats.injected_read_errors, 2);
    assert_eq!(stats.reads, 1, "failed reads are not counted as reads");

    disk.set_faults(SimFaults {
        read_error_probability: 0.0,
        ..SimFaults::default()
    });
    for _ in 0..50 {
        assert_eq!(f.read_at_blocking(&mut buf, 0).unwrap(), ALIGN);
        let (r, _) = run(f.read_at(AlignedBuf::with_capacity(ALIGN), 0));
        assert_eq!(r.unwrap(), ALIGN);
    }
    let stats = disk.stats();
    assert_eq!(stats.injected_read_errors, 2);
    assert_eq!(stats.reads, 101);
}

#[test]
fn read_error_probability_is_a_probability() {
    let disk = SimDisk::new(46);
    disk.create_dir_all(&p("/db")).unwrap();
    let f = disk.open_blocking(&p("/db/a"), true).unwrap();
    write_blocking(&f, 7, 1, 0);
    disk.set_faults(SimFaults {
        read_error_probability: 0.5,
        ..SimFaults::default()
    });
    let mut buf = AlignedBuf::with_capacity(ALIGN);
    let failed = (0..400)
        .filter(|_| f.read_at_blocking(&mut buf, 0).is_err())
        .count() as u64;
    assert_eq!(disk.stats().injected_read_errors, failed);
    // Deterministic for the seed; the bounds only guard against 0 or 1.
    assert!((100..300).contains(&failed), "{failed} of 400 failed");
}

#[test]
fn read_latency_delays_blocking_and_async_reads() {
    let latency = Duration::from_millis(20);
    let disk = SimDisk::new(47);
    disk.create_dir_all(&p("/db")).unwrap();
    let f = disk.open_blocking(&p("/db/a"), true).unwrap();
    write_blocking(&f, 1, 1, 0);
    disk.set_faults(SimFaults {
        read_latency: Some(latency),
        ..SimFaults::default()
    });
    let mut buf = AlignedBuf::with_capacity(ALIGN);
    let start = Instant::now();
    assert_eq!(f.read_at_blocking(&mut buf, 0).unwrap(), ALIGN);
    // Lower bounds only: a sleep or timer never ends early.
    assert!(start.elapsed() >= latency, "{:?}", start.elapsed());
    let rt = compio::runtime::Runtime::new().unwrap();
    let start = Instant::now();
    let (r, _) = rt.block_on(f.read_at(AlignedBuf::with_capacity(ALIGN), 0));
    assert_eq!(r.unwrap(), ALIGN);
    assert!(start.elapsed() >= latency, "{:?}", start.elapsed());
    // Write latency applies to blocking writes and syncs as well.
    disk.set_faults(SimFaults {
        latency: Some(latency),
        ..SimFaults::default()
    });
    let start = Instant::now();
    write_blocking(&f, 2, 1, 0);
    f.sync_data_blocking().unwrap();
    assert!(start.elapsed() >= 2 * latency, "{:?}", start.elapsed());
}

#[test]
fn new_fault_fields_default_to_off() {
    let faults = SimFaults::default();
    assert_eq!(faults.read_error_probability, 0.0);
    assert_eq!(faults.read_latency, None);
    let text = format!("{faults:?}");
    assert!(text.contains("read_error_probability"), "{text}");
    assert!(text.contains("read_latency"), "{text}");
    assert_eq!(SimDisk::new(1).stats().injected_read_errors, 0);
}

#[test]
fn a_durable_write_makes_only_itself_durable() {
    run(async {
        let disk = SimDisk::new(70);
        disk.create_dir_all(&p("/db")).unwrap();
        let f = disk.open(&p("/db/a"), true).await.unwrap();
        f.allocate_zeroed(3 * ALIGN as u64).await.unwrap();
        f.sync_data().await.unwrap();
        // Block 0 written but not synced; block 1 written durably (as one
        // O_DSYNC write): only block 1 is durable.
        write(&f, 1, 1, 0).await;
        let (r, _) = f.write_at_durable(filled(2, 1), ALIGN as u64).await;
        r.unwrap();
        let durable = disk.read_durable(&p("/db/a")).unwrap();
        assert!(
            durable[..ALIGN].iter().all(|&b| b == 0),
            "block 0 became durable"
        );
        assert!(durable[ALIGN..2 * ALIGN].iter().all(|&b| b == 2));
        // A durable write past the durable length syncs the size change too.
        let (r, _) = f.write_at_durable(filled(3, 1), 3 * ALIGN as u64).await;
        r.unwrap();
        let durable = disk.read_durable(&p("/db/a")).unwrap();
        assert_eq!(durable.len(), 4 * ALIGN);
        assert!(durable[..ALIGN].iter().all(|&b| b == 1));
    });
}

#[test]
fn a_crash_may_keep_any_subset_of_the_writes_in_flight() {
    // Two writes in flight (neither synced); the crash keeps each whole,
    // not at all, or torn, independently: across seeds the later one
    // survives without the earlier one, which a prefix never does.
    let mut later_without_earlier = 0;
    let mut torn = 0;
    for seed in 0..64 {
        run(async {
            let disk = SimDisk::new(seed);
            disk.create_dir_all(&p("/db")).unwrap();
            let f = disk.open(&p("/db/a"), true).await.unwrap();
            f.allocate_zeroed(4 * ALIGN as u64).await.unwrap();
            f.sync_data().await.unwrap();
            disk.sync_dir(&p("/db")).await.unwrap();
            write(&f, 0xA1, 2, 0).await;
            write(&f, 0xB2, 2, 2 * ALIGN as u64).await;
            disk.set_faults(SimFaults {
                crash_keeps_any_writes: true,
                ..SimFaults::default()
            });
            disk.crash();
            let image = disk.read_durable(&p("/db/a")).unwrap();
            assert_eq!(image.len(), 4 * ALIGN);
            // Never invented: every sector is old (zero) or its write's.
            for (i, sector) in image.chunks(SECTOR_BYTES).enumerate() {
                let new = if i < 2 * ALIGN / SECTOR_BYTES {
                    0xA1
                } else {
                    0xB2
                };
                assert!(
                    sector.iter().all(|&b| b == 0) || sector.iter().all(|&b| b == new),
                    "seed {seed}: sector {i} invented"
                );
            }
            let whole =
                |range: std::ops::Range<usize>, byte: u8| image[range].iter().all(|&b| b == byte);
            if whole(0..ALIGN, 0) && whole(2 * ALIGN..4 * ALIGN, 0xB2) {
                later_without_earlier += 1;
            }
            let mixed = |block: &[u8]| block.contains(&0) && block.iter().any(|&b| b != 0);
            if image.chunks(ALIGN).any(mixed) {
                torn += 1;
            }
        });
    }
    assert!(
        later_without_earlier > 0,
        "no crash kept the later write alone"
    );
    assert!(torn > 0, "no crash tore a block");
}

#[test]
fn latency_jitter_lets_overlapping_writes_complete_out_of_order() {
    let mut reversed = 0;
    for seed in 0..16 {
        compio::runtime::Runtime::new().unwrap().block_on(async {
            let disk = SimDisk::new(seed);
            disk.create_dir_all(&p("/db")).unwrap();
            let f = disk.open(&p("/db/a"), true).await.unwrap();
            f.allocate_zeroed(2 * ALIGN as u64).await.unwrap();
            f.sync_data().await.unwrap();
            disk.set_faults(SimFaults {
                latency: Some(Duration::from_millis(1)),
                latency_jitter: Some(Duration::from_millis(20)),
                ..SimFaults::default()
            });
            let order = std::cell::RefCell::new(Vec::new());
            let first = async {
                let (r, _) = f.write_at_durable(filled(1, 1), 0).await;
                r.unwrap();
                order.borrow_mut().push(1);
            };
            let second = async {
                let (r, _) = f.write_at_durable(filled(2, 1), ALIGN as u64).await;
                r.unwrap();
                order.borrow_mut().push(2);
            };
            futures::join!(first, second);
            if *order.borrow() == [2, 1] {
                reversed += 1;
            }
        });
    }
    assert!(reversed > 0, "the second write never completed first");
}
