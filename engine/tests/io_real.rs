//! The real O_DIRECT disk on a temporary directory, on both backends
//! (io_uring when this machine allows it, and always the fallback):
//! round trips, alignment errors, zero-filled allocation, persistence across
//! reopen and across runtimes, directory operations, errors naming the path.

use ringkv_engine::io::real::{raw_os_error, RealDisk};
use ringkv_engine::io::runtime::{build_runtime, choose_backend, uring_status, BackendKind};
use ringkv_engine::io::{AlignedBuf, Disk, DiskFile, ALIGN};
use std::future::Future;
use std::io::ErrorKind;
use std::path::Path;

/// Runs `make(dir)` on every backend this machine has, each in a fresh
/// temporary directory on the build's file system (tmpfs may lack O_DIRECT).
fn on_each_backend<F, Fut>(make: F)
where
    F: Fn(std::path::PathBuf) -> Fut,
    Fut: Future<Output = ()>,
{
    let mut kinds = vec![BackendKind::Fallback];
    if uring_status().is_ok() {
        kinds.push(BackendKind::Uring);
    }
    for kind in kinds {
        let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let rt = build_runtime(kind, 32).unwrap();
        rt.block_on(make(tmp.path().to_path_buf()));
    }
}

fn pattern(seed: u8, len: usize) -> AlignedBuf {
    let mut buf = AlignedBuf::with_capacity(len);
    let bytes: Vec<u8> = (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect();
    buf.extend_from_slice(&bytes);
    buf
}

#[test]
fn forced_fallback_does_real_file_io() {
    let kind = choose_backend(tunables::Backend::Fallback).unwrap();
    assert_eq!(kind, BackendKind::Fallback);
    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let rt = build_runtime(kind, 8).unwrap();
    rt.block_on(async {
        let disk = RealDisk;
        let path = tmp.path().join("fallback.dat");
        let f = disk.open(&path, true).await.unwrap();
        let (r, _) = f.write_at(pattern(3, 2 * ALIGN), 0).await;
        r.unwrap();
        f.sync_data().await.unwrap();
        let (r, buf) = f.read_at(AlignedBuf::with_capacity(2 * ALIGN), 0).await;
        assert_eq!(r.unwrap(), 2 * ALIGN);
        assert_eq!(buf.as_slice(), pattern(3, 2 * ALIGN).as_slice());
    });
    // The bytes really are in the file system.
    let on_disk = std::fs::read(tmp.path().join("fallback.dat")).unwrap();
    assert_eq!(on_disk, pattern(3, 2 * ALIGN).as_slice());
}

#[test]
fn write_read_round_trip() {
    on_each_backend(|dir| async move {
        let disk = RealDisk;
        let path = dir.join("a.dat");
        let f = disk.open(&path, true).await.unwrap();
        let (r, _) = f.write_at(pattern(1, 3 * ALIGN), 0).await;
        r.unwrap();
        let (r, _) = f.write_at(pattern(2, ALIGN), 5 * ALIGN as u64).await;
        r.unwrap();
        assert_eq!(f.len().await.unwrap(), 6 * ALIGN as u64);

        let (r, buf) = f.read_at(AlignedBuf::with_capacity(3 * ALIGN), 0).await;
        assert_eq!(r.unwrap(), 3 * ALIGN);
        assert_eq!(buf.as_slice(), pattern(1, 3 * ALIGN).as_slice());

        // Reads past the end are short; the hole reads as zeroes.
        let (r, buf) = f
            .read_at(AlignedBuf::with_capacity(8 * ALIGN), 3 * ALIGN as u64)
            .await;
        assert_eq!(r.unwrap(), 3 * ALIGN);
        assert!(buf.as_slice()[..2 * ALIGN].iter().all(|&b| b == 0));
        assert_eq!(&buf.as_slice()[2 * ALIGN..], pattern(2, ALIGN).as_slice());

        let (r, buf) = f
            .read_at(AlignedBuf::with_capacity(ALIGN), 64 * ALIGN as u64)
            .await;
        assert_eq!(r.unwrap(), 0);
        assert!(buf.is_empty());
    });
}

#[test]
fn misaligned_io_is_an_error_naming_the_file() {
    on_each_backend(|dir| async move {
        let disk = RealDisk;
        let path = dir.join("b.dat");
        let f = disk.open(&path, true).await.unwrap();
        let mut short = AlignedBuf::with_capacity(ALIGN);
        short.extend_from_slice(b"not a block");
        let (r, buf) = f.write_at(short, 0).await;
        let err = r.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
        assert!(err.to_string().contains("b.dat"), "{err}");
        assert_eq!(buf.as_slice(), b"not a block", "the buffer comes back");

        let (r, _) = f.write_at(pattern(0, ALIGN), 512).await;
        assert_eq!(r.unwrap_err().kind(), ErrorKind::InvalidInput);
        let (r, _) = f.read_at(AlignedBuf::with_capacity(ALIGN), 100).await;
        assert_eq!(r.unwrap_err().kind(), ErrorKind::InvalidInput);
        assert_eq!(
            f.allocate_zeroed(ALIGN as u64 + 1)
                .await
                .unwrap_err()
                .kind(),
            ErrorKind::InvalidInput
        );
        assert_eq!(f.len().await.unwrap(), 0);
    });
}

#[test]
fn allocate_zeroed_writes_zeroes_and_never_shrinks() {
    on_each_backend(|dir| async move {
        let disk = RealDisk;
        let path = dir.join("seg.wal");
        let f = disk.open(&path, true).await.unwrap();
        let (r, _) = f.write_at(pattern(9, ALIGN), 0).await;
        r.unwrap();
        f.set_len(100).await.unwrap(); // unaligned end inside the first block
                                       // More than one zero-fill chunk (1 MiB).
        let len = 2 * (1 << 20) + 3 * ALIGN as u64;
        f.allocate_zeroed(len).await.unwrap();
        assert_eq!(f.len().await.unwrap(), len);
        f.allocate_zeroed(ALIGN as u64).await.unwrap();
        assert_eq!(f.len().await.unwrap(), len);
        f.sync_data().await.unwrap();

        let (r, buf) = f.read_at(AlignedBuf::with_capacity(len as usize), 0).await;
        assert_eq!(r.unwrap(), len as usize);
        assert_eq!(&buf.as_slice()[..100], &pattern(9, ALIGN).as_slice()[..100]);
        assert!(buf.as_slice()[100..].iter().all(|&b| b == 0));

        // Zeroes were written, not a hole: the blocks are allocated.
        let meta = std::fs::metadata(&path).unwrap();
        use std::os::unix::fs::MetadataExt;
        assert!(meta.blocks() * 512 >= len, "blocks {}", meta.blocks());
    });
}

#[test]
fn data_persists_across_reopen_and_runtimes() {
    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let path = tmp.path().join("persist.dat");
    let first = if uring_status().is_ok() {
        BackendKind::Uring
    } else {
        BackendKind::Fallback
    };
    build_runtime(first, 8).unwrap().block_on(async {
        let f = RealDisk.open(&path, true).await.unwrap();
        let (r, _) = f.write_at(pattern(7, 4 * ALIGN), 0).await;
        r.unwrap();
        f.sync_data().await.unwrap();
        RealDisk.sync_dir(tmp.path()).await.unwrap();
    });
    build_runtime(BackendKind::Fallback, 8)
        .unwrap()
        .block_on(async {
            let f = RealDisk.open(&path, false).await.unwrap();
            assert_eq!(f.len().await.unwrap(), 4 * ALIGN as u64);
            let (r, buf) = f.read_at(AlignedBuf::with_capacity(4 * ALIGN), 0).await;
            assert_eq!(r.unwrap(), 4 * ALIGN);
            assert_eq!(buf.as_slice(), pattern(7, 4 * ALIGN).as_slice());
        });
}

#[test]
fn directory_operations() {
    on_each_backend(|dir| async move {
        let disk = RealDisk;
        let wal = dir.join("shard-000").join("wal");
        disk.create_dir_all(&wal).unwrap();
        disk.create_dir_all(&wal).unwrap(); // idempotent
        assert!(disk.exists(&wal));
        for name in ["c", "a", "b"] {
            drop(disk.open(&wal.join(name), true).await.unwrap());
        }
        disk.create_dir_all(&wal.join("sub")).unwrap();
        assert_eq!(
            disk.list_dir(&wal).unwrap(),
            vec![wal.join("a"), wal.join("b"), wal.join("c")]
        );
        disk.rename(&wal.join("a"), &wal.join("z")).await.unwrap();
        disk.remove_file(&wal.join("b")).await.unwrap();
        disk.sync_dir(&wal).await.unwrap();
        assert_eq!(
            disk.list_dir(&wal).unwrap(),
            vec![wal.join("c"), wal.join("z")]
        );
        assert!(!disk.exists(&wal.join("a")));
    });
}

#[test]
fn errors_name_the_path_and_keep_the_os_error() {
    on_each_backend(|dir| async move {
        let disk = RealDisk;
        let missing = dir.join("missing.dat");
        let err = disk.open(&missing, false).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotFound);
        assert!(err.to_string().contains("missing.dat"), "{err}");
        assert_eq!(raw_os_error(&err), Some(libc::ENOENT));

        let err = disk.rename(&missing, &dir.join("other")).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotFound);
        assert!(err.to_string().contains("other"), "{err}");

        let err = disk.remove_file(&missing).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotFound);
        let err = disk.sync_dir(&dir.join("nodir")).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotFound);
        assert!(disk.list_dir(Path::new("/definitely/not/here")).is_err());
    });
}

/// Measurement, not a test: `cargo nextest run -p ringkv-engine --run-ignored
/// only -E 'test(measure_real_disk)' --no-capture`. Prints 4 KiB
/// write+fdatasync latency on a zero-filled file vs appending, per backend.
#[test]
#[ignore = "measurement; run by hand"]
fn measure_real_disk() {
    use ringkv_engine::histogram::AtomicHistogram;
    use std::time::{Duration, Instant};
    let mut kinds = vec![BackendKind::Fallback];
    if uring_status().is_ok() {
        kinds.push(BackendKind::Uring);
    }
    for kind in kinds {
        let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        build_runtime(kind, 64).unwrap().block_on(async {
            let disk = RealDisk;
            let size = 64u64 << 20;
            let path = tmp.path().join("prealloc");
            let f = disk.open(&path, true).await.unwrap();
            let started = Instant::now();
            f.allocate_zeroed(size).await.unwrap();
            f.sync_data().await.unwrap();
            println!(
                "{kind}: allocate_zeroed 64 MiB + fdatasync: {:?}",
                started.elapsed()
            );
            for (label, file) in [
                ("overwrite zero-filled", f),
                ("append", disk.open(&tmp.path().join("append"), true).await.unwrap()),
            ] {
                let hist = AtomicHistogram::new();
                let deadline = Instant::now() + Duration::from_secs(2);
                let mut offset = 0u64;
                while Instant::now() < deadline && offset < size {
                    let t = Instant::now();
                    let (r, _) = file.write_at(pattern(1, ALIGN), offset).await;
                    r.unwrap();
                    file.sync_data().await.unwrap();
                    hist.record_duration(t.elapsed());
                    offset += ALIGN as u64;
                }
                let s = hist.snapshot();
                println!(
                    "{kind}: 4 KiB write + fdatasync, {label}: {} ops, p50 {} us, p99 {} us, max {} us",
                    s.count(),
                    s.quantile(0.5) / 1000,
                    s.quantile(0.99) / 1000,
                    s.max() / 1000
                );
            }
        });
    }
}

/// The blocking variants on a real file, mixed with async calls on the same
/// file inside a runtime (as synchronous code on a shard thread does).
#[test]
fn blocking_round_trip_mixed_with_async() {
    on_each_backend(|dir| async move {
        let disk = RealDisk;
        let path = dir.join("blocking.dat");
        let f = disk.open_blocking(&path, true).unwrap();
        f.write_at_blocking(&pattern(4, 3 * ALIGN), 0).unwrap();
        f.sync_data_blocking().unwrap();
        // Blocking write, async read.
        let (r, buf) = f.read_at(AlignedBuf::with_capacity(3 * ALIGN), 0).await;
        assert_eq!(r.unwrap(), 3 * ALIGN);
        assert_eq!(buf.as_slice(), pattern(4, 3 * ALIGN).as_slice());
        // Async write, blocking read: short at end of file, hole of zeroes.
        let (r, _) = f.write_at(pattern(5, ALIGN), 5 * ALIGN as u64).await;
        r.unwrap();
        f.sync_data().await.unwrap();
        let mut buf = AlignedBuf::with_capacity(8 * ALIGN);
        let n = f.read_at_blocking(&mut buf, 2 * ALIGN as u64).unwrap();
        assert_eq!(n, 4 * ALIGN);
        assert_eq!(buf.len(), n);
        assert_eq!(
            &buf.as_slice()[..ALIGN],
            &pattern(4, 3 * ALIGN).as_slice()[2 * ALIGN..]
        );
        assert!(buf.as_slice()[ALIGN..3 * ALIGN].iter().all(|&b| b == 0));
        assert_eq!(&buf.as_slice()[3 * ALIGN..], pattern(5, ALIGN).as_slice());
        assert_eq!(f.read_at_blocking(&mut buf, 64 * ALIGN as u64).unwrap(), 0);
        assert!(buf.is_empty());
        disk.sync_dir_blocking(&dir).unwrap();
        drop(f);

        // Reopen the existing file without create, blocking, and read it
        // both ways.
        let g = disk.open_blocking(&path, false).unwrap();
        assert_eq!(g.len().await.unwrap(), 6 * ALIGN as u64);
        let mut buf = AlignedBuf::with_capacity(ALIGN);
        assert_eq!(g.read_at_blocking(&mut buf, 0).unwrap(), ALIGN);
        assert_eq!(buf.as_slice(), &pattern(4, 3 * ALIGN).as_slice()[..ALIGN]);
        g.write_at_blocking(&pattern(6, ALIGN), 0).unwrap();
        g.sync_data_blocking().unwrap();
        let (r, buf) = g.read_at(AlignedBuf::with_capacity(ALIGN), 0).await;
        assert_eq!(r.unwrap(), ALIGN);
        assert_eq!(buf.as_slice(), pattern(6, ALIGN).as_slice());
        drop(g);

        // The bytes really are in the file.
        let on_disk = std::fs::read(&path).unwrap();
        assert_eq!(&on_disk[..ALIGN], pattern(6, ALIGN).as_slice());
        assert_eq!(&on_disk[5 * ALIGN..], pattern(5, ALIGN).as_slice());

        disk.remove_file_blocking(&path).unwrap();
        assert!(!disk.exists(&path));
        disk.sync_dir_blocking(&dir).unwrap();
    });
}

/// The blocking calls need no compio runtime at all.
#[test]
fn blocking_calls_work_without_a_runtime() {
    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let disk = RealDisk;
    let sub = tmp.path().join("tier");
    disk.create_dir_all(&sub).unwrap();
    let path = sub.join("pages");
    let f = disk.open_blocking(&path, true).unwrap();
    // A write large enough that the kernel may split it.
    f.write_at_blocking(&pattern(8, 64 * ALIGN), ALIGN as u64)
        .unwrap();
    f.sync_data_blocking().unwrap();
    disk.sync_dir_blocking(&sub).unwrap();
    let mut buf = AlignedBuf::with_capacity(65 * ALIGN);
    assert_eq!(f.read_at_blocking(&mut buf, 0).unwrap(), 65 * ALIGN);
    assert!(buf.as_slice()[..ALIGN].iter().all(|&b| b == 0));
    assert_eq!(&buf.as_slice()[ALIGN..], pattern(8, 64 * ALIGN).as_slice());
    drop(f);
    let on_disk = std::fs::read(&path).unwrap();
    assert_eq!(&on_disk[ALIGN..], pattern(8, 64 * ALIGN).as_slice());
    disk.remove_file_blocking(&path).unwrap();
    assert!(!path.exists());
}

#[test]
fn blocking_errors_match_the_async_ones() {
    on_each_backend(|dir| async move {
        let disk = RealDisk;
        let path = dir.join("c.dat");
        let f = disk.open_blocking(&path, true).unwrap();

        let mut short = AlignedBuf::with_capacity(ALIGN);
        short.extend_from_slice(b"not a block");
        let blocking = f.write_at_blocking(&short, 0).unwrap_err();
        let (r, _) = f.write_at(short, 0).await;
        let async_err = r.unwrap_err();
        assert_eq!(blocking.kind(), ErrorKind::InvalidInput);
        assert_eq!(blocking.to_string(), async_err.to_string());
        assert!(blocking.to_string().contains("c.dat"), "{blocking}");

        let blocking = f.write_at_blocking(&pattern(0, ALIGN), 512).unwrap_err();
        assert_eq!(blocking.kind(), ErrorKind::InvalidInput);
        assert!(blocking.to_string().contains("offset 512"), "{blocking}");
        let mut buf = AlignedBuf::with_capacity(ALIGN);
        let blocking = f.read_at_blocking(&mut buf, 100).unwrap_err();
        let (r, _) = f.read_at(AlignedBuf::with_capacity(ALIGN), 100).await;
        assert_eq!(blocking.kind(), ErrorKind::InvalidInput);
        assert_eq!(blocking.to_string(), r.unwrap_err().to_string());
        assert_eq!(f.len().await.unwrap(), 0, "refused writes wrote nothing");

        let missing = dir.join("missing.dat");
        let blocking = disk.open_blocking(&missing, false).unwrap_err();
        let async_err = disk.open(&missing, false).await.unwrap_err();
        assert_eq!(blocking.kind(), ErrorKind::NotFound);
        assert_eq!(raw_os_error(&blocking), Some(libc::ENOENT));
        assert_eq!(blocking.to_string(), async_err.to_string());

        let blocking = disk.remove_file_blocking(&missing).unwrap_err();
        let async_err = disk.remove_file(&missing).await.unwrap_err();
        assert_eq!(blocking.kind(), ErrorKind::NotFound);
        assert_eq!(blocking.to_string(), async_err.to_string());

        let nodir = dir.join("nodir");
        let blocking = disk.sync_dir_blocking(&nodir).unwrap_err();
        let async_err = disk.sync_dir(&nodir).await.unwrap_err();
        assert_eq!(blocking.kind(), ErrorKind::NotFound);
        assert_eq!(blocking.to_string(), async_err.to_string());
    });
}

/// A durable write lands where it should through a file renamed after it
/// was opened (a new WAL segment is created under a temporary name), is
/// visible through the file's own descriptor, and is on disk once it
/// returns; an unaligned one is refused like any write.
#[test]
fn durable_writes_reach_a_renamed_file() {
    on_each_backend(|dir| async move {
        let disk = RealDisk;
        let tmp = dir.join("seg.tmp");
        let f = disk.open(&tmp, true).await.unwrap();
        f.allocate_zeroed(8 * ALIGN as u64).await.unwrap();
        f.sync_data().await.unwrap();
        let path = dir.join("seg");
        disk.rename(&tmp, &path).await.unwrap();

        let (r, _) = f
            .write_at_durable(pattern(7, 2 * ALIGN), ALIGN as u64)
            .await;
        r.unwrap();
        let (r, _) = f
            .write_at_durable(pattern(9, ALIGN), 5 * ALIGN as u64)
            .await;
        r.unwrap();
        let (r, buf) = f
            .read_at(AlignedBuf::with_capacity(2 * ALIGN), ALIGN as u64)
            .await;
        assert_eq!(r.unwrap(), 2 * ALIGN);
        assert_eq!(buf.as_slice(), pattern(7, 2 * ALIGN).as_slice());
        assert_eq!(
            f.len().await.unwrap(),
            8 * ALIGN as u64,
            "a durable write does not grow the file"
        );

        let on_disk = std::fs::read(&path).unwrap();
        assert_eq!(&on_disk[ALIGN..3 * ALIGN], pattern(7, 2 * ALIGN).as_slice());
        assert_eq!(&on_disk[5 * ALIGN..6 * ALIGN], pattern(9, ALIGN).as_slice());
        assert!(on_disk[..ALIGN].iter().all(|&b| b == 0));

        let mut odd = AlignedBuf::with_capacity(ALIGN);
        odd.extend_from_slice(&[1u8; 100]);
        let (r, _) = f.write_at_durable(odd, 0).await;
        assert_eq!(r.unwrap_err().kind(), ErrorKind::InvalidInput);
    });
}
