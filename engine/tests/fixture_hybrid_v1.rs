//! A hybrid-tier data directory written by value segment format version 1
//! (records without an LSN), checked in under `tests/fixtures/hybrid-v1/`:
//! a manifest, checkpoints holding the index, value segments (some
//! rewritten by GC) and the WAL after the last checkpoint. Opening a copy
//! must give exactly the keys in `expected.txt`; writes after that go to
//! segments of the current version beside the old ones, and everything
//! must still read after a restart and after GC has rewritten the old
//! segments. Also here, with the same configuration: a write replayed
//! from the WAL after a crash is stored with the LSN it was logged with.
//!
//! Regenerate (only with the build that writes version 1 segments, into
//! this directory; a later format gets a new directory and generator):
//! `cargo nextest run -p ringkv-engine --test fixture_hybrid_v1 --run-ignored only`

#[path = "common/fixture.rs"]
mod fixture;

use bytes::Bytes;
use fixture::{copy_dir, fixture_config};
use ringkv_engine::{
    Current, Engine, Op, OpResult, TtlUpdate, UpdateAnswer, UpdateOutcome, UpdateWrite,
};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hybrid-v1")
}

fn config(dir: &Path) -> tunables::Config {
    let mut c = fixture_config(dir);
    c.storage.tier = tunables::Tier::Hybrid;
    c.storage.cache_bytes = tunables::ByteSize::kib(16);
    c.storage.value_segment_size = tunables::ByteSize::kib(64);
    c.storage.index_keys = 4_096;
    c
}

/// What a key holds: a value version, and the expiry time it was put with.
type Want = Option<(u64, Option<u64>)>;

/// The value version `version` of key `key` holds (fixed forever: the
/// fixture's bytes depend on it).
fn value(key: u64, version: u64) -> Vec<u8> {
    let mut v = format!("hybrid-fixture:{key}:{version}:").into_bytes();
    v.resize(60 + ((key * 53 + version * 17) % 900) as usize, b'#');
    v
}

fn key(k: u64) -> Bytes {
    Bytes::from(format!("hx-{k:04}"))
}

/// A far-future expiry time (the year 2100 and on), fixed per key.
fn far(k: u64) -> u64 {
    4_102_444_800_000 + k * 1000
}

fn put_expiring(_: Current, _: u64, arg: &Bytes, number: i64) -> UpdateOutcome {
    UpdateOutcome {
        write: UpdateWrite::PutExpiring(arg.clone(), Some(number as u64)),
        answer: UpdateAnswer::Ok,
    }
}

fn write_op(k: u64, version: u64, expiring: bool) -> Op {
    if expiring {
        Op::UpdateTtl {
            key: key(k),
            update: TtlUpdate {
                apply: put_expiring,
                arg: Bytes::from(value(k, version)),
                number: far(k) as i64,
            },
        }
    } else {
        Op::Put {
            key: key(k),
            value: Bytes::from(value(k, version)),
        }
    }
}

fn read_expected() -> BTreeMap<u64, Want> {
    let text = std::fs::read_to_string(fixture_dir().join("expected.txt")).expect("expected.txt");
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            let k = w[0].parse().expect("key");
            let v = match w[1] {
                "absent" => None,
                n => Some((
                    n.parse().expect("version"),
                    w.get(2).map(|t| t.parse().expect("expiry")),
                )),
            };
            (k, v)
        })
        .collect()
}

fn expiry_of(cur: Current, _: u64, _: &Bytes, _: i64) -> UpdateOutcome {
    UpdateOutcome {
        write: UpdateWrite::Keep,
        answer: UpdateAnswer::Int(match cur {
            Some((_, Some(at))) => at as i64,
            Some((_, None)) => -1,
            None => -2,
        }),
    }
}

/// Every key of `model` reads its value and expiry through the engine.
fn check(engine: &Engine, model: &BTreeMap<u64, Want>, what: &str) {
    let h = engine.handle();
    let keys: Vec<u64> = model.keys().copied().collect();
    for chunk in keys.chunks(100) {
        let ops = chunk.iter().map(|&k| Op::Get { key: key(k) }).collect();
        let answers = h.batch_blocking(ops).expect("read");
        for (&k, a) in chunk.iter().zip(answers) {
            match (model[&k], a) {
                (Some((v, _)), OpResult::Value(got)) => {
                    assert_eq!(got.to_vec(), value(k, v), "{what}: key {k}")
                }
                (None, OpResult::NotFound) => {}
                (want, a) => panic!("{what}: key {k}: expected {want:?}, got {a:?}"),
            }
        }
        let ops = chunk
            .iter()
            .map(|&k| Op::UpdateTtl {
                key: key(k),
                update: TtlUpdate {
                    apply: expiry_of,
                    arg: Bytes::new(),
                    number: 0,
                },
            })
            .collect();
        let answers = h.batch_blocking(ops).expect("expiry");
        for (&k, a) in chunk.iter().zip(answers) {
            let want = match model[&k] {
                None => -2,
                Some((_, None)) => -1,
                Some((_, Some(at))) => at as i64,
            };
            assert_eq!(
                a,
                OpResult::Updated(UpdateAnswer::Int(want)),
                "{what}: expiry of key {k}"
            );
        }
    }
}

/// Rounds of writes: puts (every third key with an expiry), overwrites
/// and deletes, enough for several value segments, GC and checkpoints.
fn write_rounds(engine: &Engine, model: &mut BTreeMap<u64, Want>, rounds: std::ops::Range<u64>) {
    let h = engine.handle();
    for round in rounds {
        let version = round + 1;
        let ops: Vec<Op> = (0..40)
            .map(|i| {
                let k = (round * 17 + i * 3) % 180;
                let expiring = (k + round) % 3 == 0;
                model.insert(k, Some((version, expiring.then(|| far(k)))));
                write_op(k, version, expiring)
            })
            .collect();
        h.batch_blocking(ops).expect("batch");
        if round % 4 == 3 {
            let ops: Vec<Op> = (0..8)
                .map(|i| Op::Delete {
                    key: key((round * 11 + i * 7) % 180),
                })
                .collect();
            h.batch_blocking(ops).expect("batch");
            for i in 0..8 {
                model.insert((round * 11 + i * 7) % 180, None);
            }
        }
        // Let the checkpointer and GC keep up.
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

fn segment_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).expect("read_dir") {
            let p = entry.expect("entry").path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|e| e == "seg") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The format version in a value segment's header block.
fn segment_version(path: &Path) -> u32 {
    let bytes = std::fs::read(path).expect("read segment");
    assert_eq!(&bytes[0..8], b"RKVSEGV1", "{}", path.display());
    u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"))
}

#[test]
fn hybrid_version_1_segments_open_and_read_every_key() {
    let expected = read_expected();
    assert!(expected.len() > 100);
    let fixture_segments = segment_files(&fixture_dir().join("data"));
    assert!(fixture_segments.len() >= 2, "{fixture_segments:?}");
    for s in &fixture_segments {
        assert_eq!(
            segment_version(s),
            1,
            "the fixture holds version 1 segments"
        );
    }

    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("data");
    copy_dir(&fixture_dir().join("data"), &dir);
    let engine = Engine::open(&config(&dir)).expect("open the fixture");
    check(&engine, &expected, "as opened");

    // New writes (newer segments) over the old records, then a restart:
    // old and new records side by side.
    let mut model = expected.clone();
    write_rounds(&engine, &mut model, 100..130);
    check(&engine, &model, "after writes");
    engine.shutdown().expect("shutdown");
    let engine = Engine::open(&config(&dir)).expect("reopen");
    check(&engine, &model, "after a restart");
    // Overwrite everything so GC empties the old segments.
    write_rounds(&engine, &mut model, 130..200);
    check(&engine, &model, "after overwrites");
    engine.shutdown().expect("shutdown");
    let engine = Engine::open(&config(&dir)).expect("reopen");
    check(&engine, &model, "after a second restart");
    engine.shutdown().expect("shutdown");
    let now = segment_files(&dir);
    assert!(
        now.iter()
            .any(|s| segment_version(s) == CURRENT_SEGMENT_VERSION),
        "new writes go to current-version segments: {now:?}"
    );
    // Every key was overwritten many times over: GC emptied the version 1
    // segments and they are gone (the upgrade path: no conversion step).
    let names = |v: &[PathBuf]| -> Vec<std::ffi::OsString> {
        v.iter()
            .map(|p| p.file_name().expect("name").to_owned())
            .collect()
    };
    let old = names(&fixture_segments);
    let left: Vec<_> = names(&now)
        .into_iter()
        .filter(|n| old.contains(n))
        .collect();
    assert!(left.is_empty(), "version 1 segments left: {left:?}");
}

/// The value segment format version this build writes.
const CURRENT_SEGMENT_VERSION: u32 = 3;

/// Writes the fixture (with a build that writes version 1 segments).
/// Deterministic operations; the file layout depends on checkpoint and GC
/// timing, which does not matter: `expected.txt` is what the data must say.
#[test]
#[ignore = "generator: run by hand, on the build that writes version 1 segments"]
fn generate_fixture_hybrid_v1() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("data");
    let mut model: BTreeMap<u64, Want> = BTreeMap::new();
    let engine = Engine::open(&config(&dir)).expect("open");
    write_rounds(&engine, &mut model, 0..40);
    let m = engine.metrics();
    assert!(m.shards[0].checkpoints > 0, "no checkpoint taken");
    check(&engine, &model, "generated");
    engine.shutdown().expect("shutdown");
    // A tail of writes after the last checkpoint, left for the WAL replay.
    let engine = Engine::open(&config(&dir)).expect("reopen");
    write_rounds(&engine, &mut model, 40..42);
    engine.shutdown().expect("shutdown");
    for s in segment_files(&dir) {
        assert_eq!(segment_version(&s), 1, "generate with the version 1 build");
    }
    let check_dir = tempfile::tempdir().expect("tempdir");
    copy_dir(&dir, &check_dir.path().join("data"));
    let engine = Engine::open(&config(&check_dir.path().join("data"))).expect("open a copy");
    check(&engine, &model, "a copy of the generated fixture");
    engine.shutdown().expect("shutdown");

    let out = fixture_dir();
    let _ = std::fs::remove_dir_all(out.join("data"));
    copy_dir(&dir, &out.join("data"));
    let mut text = String::from(
        "# key version [expiry ms]|absent: what the hybrid v1 fixture must contain (keys hx-NNNN, values from value(key, version) in fixture_hybrid_v1.rs)\n",
    );
    for (k, v) in &model {
        match v {
            Some((v, Some(at))) => text.push_str(&format!("{k} {v} {at}\n")),
            Some((v, None)) => text.push_str(&format!("{k} {v}\n")),
            None => text.push_str(&format!("{k} absent\n")),
        }
    }
    std::fs::write(out.join("expected.txt"), text).expect("write expected.txt");
}

/// A write replayed from the WAL after a crash gets the LSN it was logged
/// with: the keys written one batch each before a halt (LSNs 1, 2, ... on
/// a new shard, one per data record) are found, after the replay and a
/// checkpoint, in records carrying exactly those LSNs.
#[test]
fn a_replayed_write_keeps_the_lsn_it_was_logged_with() {
    use ringkv_engine::io::real::RealDisk;
    use ringkv_engine::tier::hybrid::log::{SegState, ValueLog};
    let tmp = tempfile::tempdir().expect("tempdir");
    let a = tmp.path().join("a");
    let mut c = config(&a);
    c.storage.checkpoint_wal_bytes = tunables::ByteSize::mib(64);
    let engine = Engine::open(&c).expect("open");
    let before = engine.metrics().shards[0].checkpoints;
    for k in 0..50u64 {
        let op = write_op(k, 1, k % 5 == 0);
        engine.handle().batch_blocking(vec![op]).expect("write");
    }
    assert_eq!(
        engine.metrics().shards[0].checkpoints,
        before,
        "no checkpoint"
    );
    engine.halt();
    let b = tmp.path().join("b");
    copy_dir(&a, &b);
    let engine = Engine::open(&config(&b)).expect("open after a crash");
    // Filler until a checkpoint makes the segments durable.
    let after_open = engine.metrics().shards[0].checkpoints;
    let mut i = 0u64;
    while engine.metrics().shards[0].checkpoints == after_open {
        let ops = (0..20)
            .map(|j| Op::Put {
                key: Bytes::from(format!("filler-{i}-{j}")),
                value: Bytes::from(vec![b'f'; 3000]),
            })
            .collect();
        engine.handle().batch_blocking(ops).expect("filler");
        i += 1;
        assert!(i < 10_000, "no checkpoint");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    engine.shutdown().expect("shutdown");
    let dir = b.join("shard-000/values");
    let mut log = ValueLog::new(RealDisk, dir.clone(), 0, 64 * 1024);
    let mut found: BTreeMap<Vec<u8>, u64> = BTreeMap::new();
    for (slot, path) in segment_files(&b).into_iter().enumerate() {
        let slot = slot as u32;
        let seq: u64 = path
            .file_stem()
            .and_then(|s| s.to_str())
            .and_then(|s| s.parse().ok())
            .expect("segment name");
        let end = std::fs::metadata(&path).expect("metadata").len();
        log.open_existing(slot, seq, end, 0, SegState::Sealed)
            .expect("open");
        let mut from = 0;
        while from < end {
            let Ok((records, next)) = log.scan_from(slot, from, 16) else {
                break; // past the durable blocks of the active segment
            };
            for (_, r) in records {
                if r.key.starts_with(b"hx-") {
                    found.insert(r.key.to_vec(), r.lsn.expect("an LSN"));
                }
            }
            from = next;
        }
    }
    for k in 0..50u64 {
        assert_eq!(found.get(&key(k)[..]), Some(&(k + 1)), "key {k}");
    }
}
