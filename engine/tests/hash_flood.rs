//! Hash flooding (issue 31): keys that all share one FNV-1a hash, built
//! offline, must not share one probe chain in a shard's tables.
//!
//! The keys: FNV-1a (`h = (h ^ byte) * P`) lets a byte set the state's low
//! byte to any value, so a block of bytes adds chosen small numbers
//! `d_1..d_k` to the state between multiplications, and two blocks whose
//! additions differ by `D` end in the same state when
//! `sum(D_i * P^(k-i+1)) = 0 mod 2^64`. `COLLISION_STEPS` is such a `D`
//! (a short vector of that lattice, found once with LLL); every pair of
//! blocks built from it is checked by hashing. Fifteen pairs, one after
//! the other, give 2^15 keys with one full 64-bit `fnv1a64`.
//!
//! The measure: the median time of a GET of a colliding key against that
//! of an ordinary key, in rounds that alternate the two, so load on the
//! machine slows both alike. With the keyed table hash the two are alike;
//! with the unkeyed hash of old data directories a colliding GET walks
//! every colliding entry. The `unkeyed_*` tests show that the measure
//! sees a flood (they pass only because the legacy hash is flooded).
//! `flood_benchmark` (ignored) prints the numbers of docs/benchmarks.md.

mod common;

use bytes::Bytes;
use common::*;
use ringkv_engine::hash::{fnv1a64, TableHasher};
use ringkv_engine::io::sim::SimDisk;
use ringkv_engine::io::{AlignedBuf, Disk, DiskFile};
use ringkv_engine::tier::{MemoryTier, Tier};
use ringkv_engine::{Engine, Op, OpResult};
use std::path::Path;
use std::time::{Duration, Instant};
use tunables::{ByteSize, Durability, Tier as StorageTier};

const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;
const FNV_OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
/// Differences of the additions of two colliding blocks (see the module doc).
const COLLISION_STEPS: [i64; 12] = [1, 8, -2, -4, -10, -6, 14, 2, 18, 13, -15, 17];
/// Pairs of blocks chained: 2^15 = 32,768 colliding keys.
const PAIRS: usize = 15;
/// The colliding keys a flood test stores.
const FLOOD_KEYS: usize = 20_000;
/// How much slower than an ordinary key's a colliding key's GET may be.
const SLOWDOWN_MAX: f64 = 20.0;

/// Two blocks that take the FNV-1a state `start` to one same state.
fn colliding_blocks(start: u64) -> ([u8; 12], [u8; 12], u64) {
    let (mut h, mut h2) = (start, start);
    let (mut a, mut b) = ([0u8; 12], [0u8; 12]);
    for (i, &step) in COLLISION_STEPS.iter().enumerate() {
        let (low, low2) = ((h & 0xff) as i64, (h2 & 0xff) as i64);
        // The new low bytes: `v` in `a`'s state, `v + shift` in `b`'s.
        let shift = low2 - low - step;
        let (lo, hi) = (0.max(-shift), 255.min(255 - shift));
        assert!(lo <= hi, "block {i} from state {start:#x} cannot be built");
        let v = (lo + hi) / 2;
        a[i] = (v ^ low) as u8;
        b[i] = ((v + shift) ^ low2) as u8;
        h = (h ^ u64::from(a[i])).wrapping_mul(FNV_PRIME);
        h2 = (h2 ^ u64::from(b[i])).wrapping_mul(FNV_PRIME);
    }
    assert_eq!(h, h2, "blocks from state {start:#x} do not collide");
    (a, b, h)
}

/// `count` distinct keys (at most 2^15) whose `fnv1a64` is one value.
fn colliding_keys(count: usize) -> Vec<Bytes> {
    assert!(count <= 1 << PAIRS);
    let mut state = FNV_OFFSET_BASIS;
    let mut pairs = Vec::new();
    for _ in 0..PAIRS {
        let (a, b, next) = colliding_blocks(state);
        pairs.push((a, b));
        state = next;
    }
    (0..count)
        .map(|n| {
            let mut key = Vec::with_capacity(PAIRS * 12);
            for (bit, (a, b)) in pairs.iter().enumerate() {
                key.extend_from_slice(if n >> bit & 1 == 0 { a } else { b });
            }
            Bytes::from(key)
        })
        .collect()
}

fn normal_key(i: u64) -> Bytes {
    Bytes::from(format!("normal-key-{i:08}"))
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort_unstable();
    v[v.len() / 2]
}

/// Median time of one GET of `flooded` and of `normal` (each timed over
/// `per_round` GETs, in `rounds` alternating rounds).
fn get_medians(
    mut get: impl FnMut(&Bytes),
    flooded: &Bytes,
    normal: &Bytes,
    rounds: usize,
    per_round: u32,
) -> (Duration, Duration) {
    let (mut f, mut n) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        for (key, out) in [(flooded, &mut f), (normal, &mut n)] {
            let started = Instant::now();
            for _ in 0..per_round {
                get(key);
            }
            out.push(started.elapsed() / per_round);
        }
    }
    (median(f), median(n))
}

/// A memory tier holding `count` colliding keys and as many ordinary ones;
/// the median GET times of the last colliding key and of an ordinary one.
fn memory_tier_flood(hasher: TableHasher, count: usize, rounds: usize) -> (Duration, Duration) {
    let mut t = MemoryTier::with_hasher(hasher);
    let keys = colliding_keys(count);
    for (i, k) in keys.iter().enumerate() {
        assert!(t.put(hasher.hash_key(k), k, b"flood", 0));
        let n = normal_key(i as u64);
        assert!(t.put(hasher.hash_key(&n), &n, b"normal", 0));
    }
    let flooded = keys.last().expect("keys");
    let normal = normal_key(count as u64 / 2);
    let get = |k: &Bytes| {
        assert!(t.get(hasher.hash_key(k), k).is_some());
    };
    get_medians(get, flooded, &normal, rounds, 50)
}

/// The config of the engine tests: one shard, room for the colliding keys.
fn engine_config(tier: StorageTier) -> tunables::Config {
    let durability = match tier {
        StorageTier::Memory => Durability::None,
        StorageTier::Hybrid => Durability::Async,
    };
    let mut c = small_config(Path::new("/flood"), 1, durability);
    c.storage.tier = tier;
    c.storage.wal_segment_size = ByteSize::mib(4);
    c.storage.checkpoint_wal_bytes = ByteSize::mib(64);
    c.limits.key_bytes_max = ByteSize(256);
    c
}

/// GETs of one key per timed batch in the engine tests: a batch's trip
/// to the shard thread and back (which a loaded machine stretches to
/// milliseconds) is shared by them, so the time is the table's.
const GETS_PER_BATCH: usize = 100;

/// An engine holding `count` colliding keys and as many ordinary ones; the
/// median GET times (through the engine's handle, in batches of
/// [`GETS_PER_BATCH`] GETs of one key) of the last colliding key and of an
/// ordinary one.
fn engine_flood(engine: &Engine, count: usize, rounds: usize) -> (Duration, Duration) {
    let h = engine.handle();
    let keys = colliding_keys(count);
    for (chunk_at, chunk) in keys.chunks(200).enumerate() {
        let mut ops = Vec::new();
        for (i, k) in chunk.iter().enumerate() {
            ops.push(Op::Put {
                key: k.clone(),
                value: Bytes::from_static(b"flood"),
            });
            ops.push(Op::Put {
                key: normal_key((chunk_at * 200 + i) as u64),
                value: Bytes::from_static(b"normal"),
            });
        }
        h.batch_blocking(ops).expect("puts");
    }
    let get = |k: &Bytes| {
        let gets = vec![Op::Get { key: k.clone() }; GETS_PER_BATCH];
        let a = h.batch_blocking(gets).expect("get");
        assert!(a.iter().all(|a| matches!(a, OpResult::Value(_))), "{a:?}");
    };
    let flooded = keys.last().expect("keys");
    let (f, n) = get_medians(get, flooded, &normal_key(count as u64 / 2), rounds, 1);
    (f / GETS_PER_BATCH as u32, n / GETS_PER_BATCH as u32)
}

/// How many times slower the colliding key's GET was (and prints both).
fn ratio((flooded, normal): (Duration, Duration)) -> f64 {
    let r = flooded.as_nanos() as f64 / normal.as_nanos().max(1) as f64;
    eprintln!("colliding GET {flooded:?}, ordinary GET {normal:?}: {r:.1}x");
    r
}

/// Writes a version 2 hybrid manifest (made before table hash keys
/// existed): the engine opens such a directory with the unkeyed hash.
fn write_v2_hybrid_manifest(disk: &SimDisk, dir: &Path) {
    let mut b = Vec::new();
    b.extend_from_slice(b"RINGKVMF");
    b.extend_from_slice(&2u32.to_le_bytes());
    b.extend_from_slice(&1u32.to_le_bytes());
    let mut name = [0u8; 16];
    name[..7].copy_from_slice(b"fnv1a64");
    b.extend_from_slice(&name);
    b.extend_from_slice(&1u32.to_le_bytes());
    let crc = crc32fast::hash(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    b.resize(4096, 0);
    compio::runtime::Runtime::new()
        .expect("runtime")
        .block_on(async {
            disk.create_dir_all(dir).expect("mkdir");
            let f = disk
                .open(&dir.join("MANIFEST"), true)
                .await
                .expect("create");
            let mut buf = AlignedBuf::with_capacity(b.len());
            buf.set_len(b.len());
            buf.as_mut_slice().copy_from_slice(&b);
            let (r, _) = f.write_at(buf, 0).await;
            r.expect("write");
            f.sync_data().await.expect("sync");
        });
}

#[test]
fn colliding_keys_share_one_full_fnv1a64() {
    let keys = colliding_keys(1 << PAIRS);
    let hash = fnv1a64(&keys[0]);
    assert!(keys.iter().all(|k| fnv1a64(k) == hash));
    let distinct: std::collections::HashSet<&Bytes> = keys.iter().collect();
    assert_eq!(distinct.len(), 1 << PAIRS);
    // ...and the keyed table hash tells them apart.
    let hasher = TableHasher::random().expect("key");
    let hashes: std::collections::HashSet<u64> = keys.iter().map(|k| hasher.hash_key(k)).collect();
    assert_eq!(hashes.len(), 1 << PAIRS);
}

#[test]
fn keyed_memory_tier_resists_a_flood() {
    let hasher = TableHasher::random().expect("key");
    let m = memory_tier_flood(hasher, FLOOD_KEYS, 31);
    assert!(
        ratio(m) < SLOWDOWN_MAX,
        "a colliding key's GET took {:?}, an ordinary one's {:?}",
        m.0,
        m.1
    );
}

/// The measure sees a flood: the unkeyed hash of old directories, with a
/// few thousand colliding keys, makes their GETs far slower.
#[test]
fn unkeyed_memory_tier_is_flooded() {
    let m = memory_tier_flood(TableHasher::LEGACY, 2_000, 11);
    assert!(
        ratio(m) > SLOWDOWN_MAX,
        "the flood went unseen: {:?} against {:?}",
        m.0,
        m.1
    );
}

#[test]
fn engine_on_the_memory_tier_resists_a_flood() {
    let engine = Engine::open_with_disk(&engine_config(StorageTier::Memory), SimDisk::new(31))
        .expect("open");
    let m = engine_flood(&engine, FLOOD_KEYS, 31);
    engine.shutdown().expect("shutdown");
    assert!(
        ratio(m) < SLOWDOWN_MAX,
        "a colliding key's GET took {:?}, an ordinary one's {:?}",
        m.0,
        m.1
    );
}

#[test]
fn engine_on_the_hybrid_tier_resists_a_flood() {
    let engine = Engine::open_with_disk(&engine_config(StorageTier::Hybrid), SimDisk::new(32))
        .expect("open");
    let m = engine_flood(&engine, FLOOD_KEYS, 31);
    engine.shutdown().expect("shutdown");
    assert!(
        ratio(m) < SLOWDOWN_MAX,
        "a colliding key's GET took {:?}, an ordinary one's {:?}",
        m.0,
        m.1
    );
}

/// An old hybrid directory keeps the unkeyed hash (its checkpoints hold
/// tags of it), and the measure sees the flood there.
#[test]
fn unkeyed_hybrid_directory_is_flooded() {
    let disk = SimDisk::new(33);
    write_v2_hybrid_manifest(&disk, Path::new("/flood"));
    let engine = Engine::open_with_disk(&engine_config(StorageTier::Hybrid), disk).expect("open");
    let m = engine_flood(&engine, 500, 11);
    engine.shutdown().expect("shutdown");
    assert!(
        ratio(m) > SLOWDOWN_MAX,
        "the flood went unseen: {:?} against {:?}",
        m.0,
        m.1
    );
}

/// Prints GET latencies of colliding and ordinary keys, unkeyed and keyed
/// (docs/benchmarks.md, "Hash flooding"). Run in release:
/// `cargo test --release -p ringkv-engine --test hash_flood -- --ignored --nocapture`
#[test]
#[ignore = "benchmark: prints numbers, run by hand in release"]
fn flood_benchmark() {
    let show = |what: &str, count: usize, m: (Duration, Duration)| {
        println!(
            "{what:<34} {count:>6} keys  colliding GET {:>10.2?}  ordinary GET {:>10.2?}  ratio {:>8.1}",
            m.0,
            m.1,
            ratio(m)
        );
    };
    for count in [1_000, 5_000, FLOOD_KEYS] {
        show(
            "memory tier, unkeyed (legacy)",
            count,
            memory_tier_flood(TableHasher::LEGACY, count, 31),
        );
        let keyed = TableHasher::random().expect("key");
        show(
            "memory tier, keyed",
            count,
            memory_tier_flood(keyed, count, 31),
        );
    }
    for count in [1_000, FLOOD_KEYS] {
        let engine = Engine::open_with_disk(&engine_config(StorageTier::Memory), SimDisk::new(1))
            .expect("open");
        show(
            "engine, memory tier, keyed",
            count,
            engine_flood(&engine, count, 31),
        );
        engine.shutdown().expect("shutdown");
        let engine = Engine::open_with_disk(&engine_config(StorageTier::Hybrid), SimDisk::new(2))
            .expect("open");
        show(
            "engine, hybrid tier, keyed",
            count,
            engine_flood(&engine, count, 31),
        );
        engine.shutdown().expect("shutdown");
    }
    for count in [500, 2_000] {
        let disk = SimDisk::new(3);
        write_v2_hybrid_manifest(&disk, Path::new("/flood"));
        let engine =
            Engine::open_with_disk(&engine_config(StorageTier::Hybrid), disk).expect("open");
        show(
            "engine, hybrid tier, unkeyed (v2)",
            count,
            engine_flood(&engine, count, 11),
        );
        engine.shutdown().expect("shutdown");
    }
}
