//! The data directory's identity (docs/wal.md, "Manifest" and "Format
//! versions"): a file copied from another data directory, under the name
//! of one of this directory's, is refused at open, naming the file and
//! saying it belongs to another directory; a manifest copied from another
//! directory is refused naming the manifest. One test per file kind: two
//! directories are written with the same operations (so their files have
//! the same names, LSNs and sequence numbers), one file of the second is
//! copied over the first's, and the first is reopened.

mod common;

use common::{block_on, key, put, small_config, use_small_hybrid_tier, value};
use ringkv_engine::io::sim::SimDisk;
use ringkv_engine::io::{AlignedBuf, Disk, DiskFile, ALIGN};
use ringkv_engine::{Engine, EngineError};
use std::path::{Path, PathBuf};
use tunables::{ByteSize, Config, Durability};

const ROOT: &str = "/ff";

fn config(hybrid: bool) -> Config {
    let mut c = small_config(Path::new(ROOT), 1, Durability::Sync);
    c.storage.checkpoint_wal_bytes = ByteSize::mib(64);
    if hybrid {
        use_small_hybrid_tier(&mut c);
    }
    c
}

/// A directory on a disk of its own seed (so its own identity), written
/// with the same operations as every other: 200 keys, a checkpoint, 50
/// overwrites, a clean stop.
fn written(seed: u64, hybrid: bool) -> SimDisk {
    let disk = SimDisk::new(seed);
    let engine = Engine::open_with_disk(&config(hybrid), disk.clone()).expect("open");
    let h = engine.handle();
    for chunk in (0..200).collect::<Vec<u64>>().chunks(20) {
        h.batch_blocking(chunk.iter().map(|&i| put(i, 1)).collect())
            .expect("puts");
    }
    h.checkpoint_all().expect("checkpoint");
    h.batch_blocking((0..50).map(|i| put(i, 2)).collect())
        .expect("overwrites");
    engine.shutdown().expect("shutdown");
    disk
}

/// The files of `dir` on `disk` whose name ends in `suffix`, by name.
fn files(disk: &SimDisk, dir: &str, suffix: &str) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = disk
        .list_dir(&Path::new(ROOT).join(dir))
        .expect("list")
        .into_iter()
        .filter(|p| p.to_string_lossy().ends_with(suffix))
        .collect();
    found.sort();
    found
}

/// Replaces `path` on `to` with the file of the same name on `from`.
fn copy_over(from: &SimDisk, to: &SimDisk, path: &Path) {
    let bytes = from.read_written(path).expect("the other directory has it");
    block_on(async {
        let f = to.open(path, true).await.expect("open");
        f.set_len(0).await.expect("empty");
        let padded = bytes.len().div_ceil(ALIGN) * ALIGN;
        let mut buf = AlignedBuf::with_capacity(padded.max(ALIGN));
        buf.extend_from_slice(&bytes);
        buf.extend_from_slice(&vec![0; padded - bytes.len()]);
        f.write_at_blocking(&buf, 0).expect("write");
        f.set_len(bytes.len() as u64).await.expect("length");
        f.sync_data().await.expect("sync");
    });
}

/// Copies `path` from a second directory over the first's and reopens:
/// the open must fail naming the file and another directory.
fn refused_naming(hybrid: bool, pick: impl Fn(&SimDisk) -> PathBuf) -> EngineError {
    let ours = written(1, hybrid);
    let theirs = written(2, hybrid);
    let path = pick(&ours);
    copy_over(&theirs, &ours, &path);
    let err = match Engine::open_with_disk(&config(hybrid), ours) {
        Ok(_) => panic!("{} from another directory was accepted", path.display()),
        Err(e) => e,
    };
    let text = err.to_string();
    let name = path.file_name().expect("a name").to_string_lossy();
    assert!(text.contains(&*name), "the refusal names {name}: {text}");
    assert!(
        text.contains("another data directory"),
        "the refusal says why: {text}"
    );
    err
}

#[test]
fn a_wal_segment_of_another_directory_is_refused() {
    let err = refused_naming(false, |d| {
        files(d, "shard-000/wal", ".wal")
            .into_iter()
            .next()
            .expect("a segment")
    });
    assert!(
        matches!(
            err.root(),
            EngineError::Wal(ringkv_engine::WalError::Corrupt {
                reason: ringkv_engine::Damage::ForeignDirectory { .. },
                ..
            })
        ),
        "{err:?}"
    );
}

#[test]
fn a_wal_head_of_another_directory_is_refused() {
    refused_naming(false, |_| Path::new(ROOT).join("shard-000/wal.head"));
}

#[test]
fn a_snapshot_of_another_directory_is_refused() {
    let err = refused_naming(false, |d| {
        files(d, "shard-000/snapshots", ".snap")
            .pop()
            .expect("a snapshot")
    });
    assert!(
        matches!(
            err.root(),
            EngineError::Snapshot(ringkv_engine::SnapshotError::ForeignDirectory { .. })
        ),
        "{err:?}"
    );
}

#[test]
fn a_hybrid_checkpoint_of_another_directory_is_refused() {
    refused_naming(true, |d| {
        files(d, "shard-000/snapshots", ".snap")
            .pop()
            .expect("a checkpoint")
    });
}

#[test]
fn a_value_segment_of_another_directory_is_refused() {
    refused_naming(true, |d| {
        files(d, "shard-000/values", ".seg")
            .into_iter()
            .next()
            .expect("a value segment")
    });
}

#[test]
fn a_manifest_of_another_directory_is_refused_by_name() {
    for hybrid in [false, true] {
        let err = refused_naming(hybrid, |_| Path::new(ROOT).join("MANIFEST"));
        assert!(
            matches!(
                err.root(),
                EngineError::Manifest(ringkv_engine::ManifestError::ForeignDirectory { .. })
            ),
            "{err:?}"
        );
    }
}

/// The directory's own files, copied back in place (a restore of its own
/// backup), open; and the directory reads what it was written with.
#[test]
fn the_directorys_own_files_open() {
    let ours = written(1, false);
    let copy = SimDisk::new(7);
    copy.restore(&ours.image());
    let engine = Engine::open_with_disk(&config(false), copy).expect("its own files open");
    let got = pollster::block_on(engine.handle().get(key(3))).expect("get");
    assert_eq!(got, Some(value(3, 2)));
    engine.halt();
}

/// `verify`'s examination names a file of another directory, and a
/// manifest of another directory, as problems (on real files: it reads
/// through the operator tools' overlay of the real filesystem).
#[test]
fn verify_names_files_of_another_directory() {
    use ringkv_engine::inspect::{examine, Depth};
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir_of = |name: &str| {
        let mut c = small_config(&tmp.path().join(name), 1, Durability::Sync);
        c.storage.checkpoint_wal_bytes = ByteSize::mib(64);
        c
    };
    for name in ["ours", "theirs"] {
        let engine = Engine::open(&dir_of(name)).expect("open");
        let h = engine.handle();
        h.batch_blocking((0..50).map(|i| put(i, 1)).collect())
            .expect("puts");
        h.checkpoint_all().expect("checkpoint");
        engine.shutdown().expect("shutdown");
    }
    let ours = dir_of("ours");
    assert!(
        examine(&ours, Depth::Full).problems.is_empty(),
        "a directory of its own files has no problem"
    );
    let snaps = |name: &str| {
        let mut v: Vec<PathBuf> =
            std::fs::read_dir(tmp.path().join(name).join("shard-000/snapshots"))
                .expect("list")
                .map(|e| e.expect("entry").path())
                .filter(|p| p.extension().is_some_and(|e| e == "snap"))
                .collect();
        v.sort();
        v
    };
    let (snap, foreign) = (snaps("ours").remove(0), snaps("theirs").remove(0));
    let own = std::fs::read(&snap).expect("read");
    std::fs::copy(&foreign, &snap).expect("copy a snapshot over");
    let report = examine(&ours, Depth::Full);
    assert!(
        report
            .problems
            .iter()
            .any(|p| p.file == snap && p.to_string().contains("another data directory")),
        "{:?}",
        report.problems
    );
    std::fs::write(&snap, own).expect("put the snapshot back");
    let manifest = tmp.path().join("ours/MANIFEST");
    std::fs::copy(tmp.path().join("theirs/MANIFEST"), &manifest).expect("copy the manifest");
    let report = examine(&ours, Depth::Headers);
    assert!(
        report
            .problems
            .iter()
            .any(|p| p.file == manifest && p.to_string().contains("another data directory")),
        "{:?}",
        report.problems
    );
}
