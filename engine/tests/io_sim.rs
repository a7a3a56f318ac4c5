//! The simulated disk keeps its promises: O_DIRECT rules, written vs durable
//! images, directory durability, crash images (prefix + torn block, never
//! invented data), one-shot injected faults, determinism by seed.

use engine::io::sim::{SimDisk, SimFaults, SECTOR_BYTES};
use engine::io::{AlignedBuf, Disk, DiskFile, ALIGN};
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
    fn scenario(seed: u64) -> (Vec<u8>, engine::io::sim::SimStats) {
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
