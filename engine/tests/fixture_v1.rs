//! A data directory written by format version 1, checked in under
//! `tests/fixtures/v1/`: a manifest, a snapshot, several WAL segments and a
//! torn last flush. Opening a copy must give exactly the keys listed in
//! `expected.txt`, so a format change that cannot read old data fails here.
//!
//! Regenerate (only when the format version changes, into a new `vN`):
//! `cargo nextest run -p ringkv-engine --test fixture_v1 --run-ignored only`

#[path = "common/fixture.rs"]
mod fixture;

use fixture::{copy_dir, fixture_config};
use ringkv_engine::io::real::RealDisk;
use ringkv_engine::layout::ShardPaths;
use ringkv_engine::wal::format::{decode_segment_header, record_size, seal_size, BLOCK_BYTES};
use ringkv_engine::wal::recovery::{recover, RecoveryCase, RecoveryConfig};
use ringkv_engine::{Engine, Op, OpResult};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// `fixture_config`'s WAL segment size.
const SEGMENT_BYTES: u64 = 64 * 1024;

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v1")
}

/// The value version `version` of key `key` holds (fixed forever: the
/// fixture's bytes depend on it).
fn value(key: u64, version: u64) -> Vec<u8> {
    let mut v = format!("fixture:{key}:{version}:").into_bytes();
    v.resize(40 + ((key * 37 + version * 11) % 400) as usize, b'=');
    v
}

fn key(k: u64) -> bytes::Bytes {
    bytes::Bytes::from(format!("fx-{k:04}"))
}

fn read_expected() -> BTreeMap<u64, Option<u64>> {
    let text = std::fs::read_to_string(fixture_dir().join("expected.txt")).expect("expected.txt");
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let mut w = l.split_whitespace();
            let k = w.next().expect("key").parse().expect("key");
            let v = match w.next().expect("version") {
                "absent" => None,
                n => Some(n.parse().expect("version")),
            };
            (k, v)
        })
        .collect()
}

#[test]
fn version_1_data_directory_opens_with_exact_contents() {
    let expected = read_expected();
    assert!(expected.len() > 100);

    // Recovery itself: a snapshot, a torn tail, exactly the expected keys.
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("data");
    copy_dir(&fixture_dir().join("data"), &dir);
    let rt = compio::runtime::Runtime::new().expect("runtime");
    let r = rt
        .block_on(recover(
            &RealDisk,
            &ShardPaths::new(&dir, 0),
            RecoveryConfig {
                shard: 0,
                segment_bytes: SEGMENT_BYTES,
                dir_id: 0,
            },
        ))
        .expect("recover the fixture");
    assert!(
        r.cases.contains(&RecoveryCase::SnapshotLoaded),
        "{:?}",
        r.cases
    );
    assert!(r.cases.contains(&RecoveryCase::TornTail), "{:?}", r.cases);
    for (&k, &v) in &expected {
        let got = r.tier.get(ringkv_engine::hash::fnv1a64(&key(k)), &key(k));
        assert_eq!(got.map(|b| b.to_vec()), v.map(|v| value(k, v)), "key {k}");
    }
    assert_eq!(
        r.tier.len(),
        expected.values().filter(|v| v.is_some()).count() as u64
    );
    drop(r);
    drop(rt);

    // The engine on a fresh copy.
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("data");
    copy_dir(&fixture_dir().join("data"), &dir);
    let engine = Engine::open(&fixture_config(&dir)).expect("open the fixture");
    let ops: Vec<Op> = expected.keys().map(|&k| Op::Get { key: key(k) }).collect();
    let answers = engine.handle().batch_blocking(ops).expect("read");
    for ((&k, &v), a) in expected.iter().zip(answers) {
        match (v, a) {
            (Some(v), OpResult::Value(got)) => assert_eq!(got.to_vec(), value(k, v), "key {k}"),
            (None, OpResult::NotFound) => {}
            (v, a) => panic!("key {k}: expected {v:?}, got {a:?}"),
        }
    }
    engine.shutdown().expect("shutdown");

    // The version 1 manifest held no tier: it opened as the memory tier and
    // the copy now carries a version 2 manifest saying so. The checked-in
    // fixture itself stays version 1.
    let rt = compio::runtime::Runtime::new().expect("runtime");
    let m = rt
        .block_on(ringkv_engine::manifest::load(&RealDisk, &dir))
        .expect("load the manifest")
        .expect("a manifest");
    assert_eq!(m.version, ringkv_engine::manifest::MANIFEST_VERSION);
    assert_eq!(m.tier, tunables::Tier::Memory);
    assert_eq!(m.shard_count, 1);
    let original = std::fs::read(fixture_dir().join("data/MANIFEST")).expect("fixture manifest");
    assert_eq!(
        original[8..12],
        1u32.to_le_bytes(),
        "the fixture is version 1"
    );
}

/// Writes the fixture. Deterministic operations; the file layout depends
/// on checkpoint timing, which does not matter: `expected.txt` is what the
/// data must say.
#[test]
#[ignore = "generator: run by hand to (re)create tests/fixtures/v1"]
fn generate_fixture_v1() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("data");
    let mut model: BTreeMap<u64, Option<u64>> = BTreeMap::new();

    // Session 1: enough writes for several segments and a checkpoint.
    let engine = Engine::open(&fixture_config(&dir)).expect("open");
    let h = engine.handle();
    for round in 0..12u64 {
        let version = round + 1;
        let ops: Vec<Op> = (0..40)
            .map(|i| {
                let k = (round * 17 + i * 3) % 160;
                model.insert(k, Some(version));
                Op::Put {
                    key: key(k),
                    value: bytes::Bytes::from(value(k, version)),
                }
            })
            .collect();
        h.batch_blocking(ops).expect("batch");
        if round % 4 == 3 {
            let ops: Vec<Op> = (0..10)
                .map(|i| Op::Delete {
                    key: key(round * 10 + i),
                })
                .collect();
            h.batch_blocking(ops).expect("batch");
            for i in 0..10 {
                model.insert(round * 10 + i, None);
            }
        }
        // Let the checkpointer keep up so the fixture holds a snapshot.
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(
        engine.metrics().shards[0].checkpoints > 0,
        "no checkpoint taken"
    );
    engine.shutdown().expect("shutdown");

    // Session 2: one more batch, whose flush is then torn (last block lost).
    let engine = Engine::open(&fixture_config(&dir)).expect("open");
    // Two records of 3000 bytes plus the segment header: one flush.
    let torn_keys: Vec<u64> = (1000..1002).collect();
    let ops: Vec<Op> = torn_keys
        .iter()
        .map(|&k| Op::Put {
            key: key(k),
            value: bytes::Bytes::from(vec![b'T'; 3000]),
        })
        .collect();
    engine.handle().batch_blocking(ops).expect("batch");
    assert_eq!(
        engine.metrics().shards[0].wal_flushes,
        1,
        "the batch must be one flush"
    );
    engine.shutdown().expect("shutdown");
    for k in &torn_keys {
        model.insert(*k, None);
    }
    // The batch is the first flush of the newest used segment (a segment
    // may be recycled, so find it by its header, not by its bytes).
    let wal_dir = ShardPaths::new(&dir, 0).wal_dir;
    let mut newest: Option<(u64, PathBuf)> = None;
    for entry in std::fs::read_dir(&wal_dir).expect("wal dir") {
        let path = entry.expect("entry").path();
        let bytes = std::fs::read(&path).expect("read");
        if let Ok(Some(h)) = decode_segment_header(&bytes[..BLOCK_BYTES]) {
            if !h.is_prepared() && newest.as_ref().is_none_or(|(lsn, _)| h.first_lsn > *lsn) {
                newest = Some((h.first_lsn, path));
            }
        }
    }
    let (_, seg) = newest.expect("a used segment");
    let used = BLOCK_BYTES + torn_keys.len() * record_size(key(0).len(), 3000);
    let flush_len = used + seal_size(used);
    let mut bytes = std::fs::read(&seg).expect("read");
    bytes[flush_len - BLOCK_BYTES..flush_len].fill(0);
    std::fs::write(&seg, bytes).expect("write");

    // The fixture must show what it is for.
    let rt = compio::runtime::Runtime::new().expect("runtime");
    let check = tempfile::tempdir().expect("tempdir");
    copy_dir(&dir, &check.path().join("data"));
    let r = rt
        .block_on(recover(
            &RealDisk,
            &ShardPaths::new(&check.path().join("data"), 0),
            RecoveryConfig {
                shard: 0,
                segment_bytes: SEGMENT_BYTES,
                dir_id: 0,
            },
        ))
        .expect("recover");
    assert!(
        r.cases.contains(&RecoveryCase::SnapshotLoaded),
        "{:?}",
        r.cases
    );
    assert!(r.cases.contains(&RecoveryCase::TornTail), "{:?}", r.cases);
    assert!(r.live_segments.len() >= 2, "{:?}", r.live_segments);
    for (k, v) in &model {
        let got = r.tier.get(ringkv_engine::hash::fnv1a64(&key(*k)), &key(*k));
        assert_eq!(
            got.map(|b| b.to_vec()),
            v.map(|v| value(*k, v)),
            "generated fixture, key {k}"
        );
    }

    let out = fixture_dir();
    let _ = std::fs::remove_dir_all(out.join("data"));
    copy_dir(&dir, &out.join("data"));
    let mut text = String::from(
        "# key version|absent: what the v1 fixture must contain (keys fx-NNNN, values from value(key, version) in fixture_v1.rs)\n",
    );
    for (k, v) in &model {
        match v {
            Some(v) => text.push_str(&format!("{k} {v}\n")),
            None => text.push_str(&format!("{k} absent\n")),
        }
    }
    std::fs::write(out.join("expected.txt"), text).expect("write expected.txt");
}
