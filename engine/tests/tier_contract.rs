//! The tier contract: one model test that every storage tier must pass
//! through the engine, on the simulated disk, in `sync` mode.
//!
//! Random batches of every operation the engine exposes run beside a
//! `BTreeMap` model (value and expiry time per key): puts, gets, deletes,
//! read-modify-writes (`Op::Update`), expiry updates (`Op::UpdateTtl`:
//! set a value with an expiry, set or remove the expiry of a present key,
//! a time in the past that deletes, reading the expiry), transactions
//! across shards, and FLUSHALL (`Handle::clear`). Every answer is checked
//! against the model. Each run goes through several lives of the engine,
//! ended either by a clean shutdown or by a halt and a simulated crash;
//! since every batch was acknowledged under `sync`, the reopened engine
//! must hold exactly the model: every value, every expiry time, and the
//! same key set in a walk over every partition. Small WAL segments and
//! checkpoint thresholds make checkpoints (and, on the hybrid tier, GC)
//! happen within a life, so recovery starts from snapshots and logs.
//!
//! A new tier is added to [`configure`] (the `match` has no wildcard, so a
//! new `tunables::Tier` does not compile until it is) and to the list of
//! tiers at the bottom; it then runs the same contract.
//!
//! Seeds: `RINGKV_CONTRACT_SEEDS=N` runs more, `RINGKV_CONTRACT_SEED=S`
//! replays one.

mod common;

use bytes::Bytes;
use common::*;
use ringkv_engine::io::sim::SimDisk;
use ringkv_engine::rng::SplitMix64;
use ringkv_engine::{
    Current, Engine, Handle, Op, OpResult, TtlUpdate, Update, UpdateAnswer, UpdateOutcome,
    UpdateWrite, PARTITIONS_PER_SHARD,
};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use tunables::{Config, Durability, Tier};

const KEYS: u64 = 48;
const LIVES: u32 = 4;
const SEEDS: u64 = 16;
/// Expiry times the test sets: the year 2100 and later, so nothing expires
/// while it runs (the model needs no clock).
const FAR: u64 = 4_102_444_800_000;
/// An expiry time long past: setting it deletes the key.
const PAST: u64 = 1;
/// Appends past this length start the value over (it stays under
/// `value_bytes_max`).
const APPEND_RESET_BYTES: usize = 1024;

/// What the model holds for a key.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    value: Bytes,
    expires_at: Option<u64>,
}

type Model = BTreeMap<u64, Entry>;

/// The tier's own settings on top of the shared small config. Sized so
/// that the hybrid tier rolls value segments, misses its cache and runs GC
/// within one life.
fn configure(tier: Tier, c: &mut Config) {
    c.storage.tier = tier;
    match tier {
        Tier::Memory => {}
        Tier::Hybrid => {
            c.storage.value_segment_size = tunables::ByteSize::kib(64);
            c.storage.cache_bytes = tunables::ByteSize::kib(16);
            c.storage.index_keys = 1024;
            c.storage.gc_garbage_percent = 5;
        }
    }
}

// ---- the update functions the operations use ----

/// Appends `arg` (starting over past [`APPEND_RESET_BYTES`]); answers the
/// new length. Keeps the expiry time, as APPEND does.
fn append(current: Option<Bytes>, arg: &Bytes, _: i64) -> UpdateOutcome {
    let mut v = current.map(|c| c.to_vec()).unwrap_or_default();
    if v.len() + arg.len() > APPEND_RESET_BYTES {
        v.clear();
    }
    v.extend_from_slice(arg);
    let len = v.len() as i64;
    UpdateOutcome {
        write: UpdateWrite::Put(Bytes::from(v)),
        answer: UpdateAnswer::Int(len),
    }
}

/// Sets the expiry time of a present key to `number` (0: none); answers
/// 1 if the key was there, else 0.
fn set_expiry(current: Current, _now: u64, _: &Bytes, number: i64) -> UpdateOutcome {
    UpdateOutcome {
        write: UpdateWrite::SetExpiry((number != 0).then_some(number as u64)),
        answer: UpdateAnswer::Int(current.is_some() as i64),
    }
}

fn ttl(apply: ringkv_engine::TtlUpdateFn, k: u64, arg: Bytes, number: u64) -> Op {
    Op::UpdateTtl {
        key: key(k),
        update: TtlUpdate {
            apply,
            arg,
            number: number as i64,
        },
    }
}

/// The answer `expiry_of` gives for a model entry.
fn expiry_answer(entry: Option<&Entry>) -> OpResult {
    OpResult::Updated(UpdateAnswer::Int(match entry {
        None => -2,
        Some(Entry {
            expires_at: None, ..
        }) => -1,
        Some(Entry {
            expires_at: Some(at),
            ..
        }) => *at as i64,
    }))
}

// ---- one random operation, its expected answer, and its effect ----

/// Builds a random operation on `model`, applies its effect to the model
/// and returns it with the answer the engine must give.
fn random_op(rng: &mut SplitMix64, model: &mut Model, version: &mut u64) -> (Op, OpResult) {
    let k = rng.below(KEYS);
    *version += 1;
    let v = *version;
    let old = model.get(&k).cloned();
    match rng.below(100) {
        0..=29 => {
            model.insert(
                k,
                Entry {
                    value: value(k, v),
                    expires_at: None,
                },
            );
            (put(k, v), OpResult::Ok)
        }
        30..=49 => (
            get(k),
            old.map_or(OpResult::NotFound, |e| OpResult::Value(e.value)),
        ),
        50..=59 => {
            let answer = if model.remove(&k).is_some() {
                OpResult::Ok
            } else {
                OpResult::NotFound
            };
            (del(k), answer)
        }
        60..=69 => {
            let arg = Bytes::from(format!("+{v}"));
            let out = append(old.as_ref().map(|e| e.value.clone()), &arg, 0);
            let UpdateWrite::Put(new) = out.write else {
                unreachable!("append always puts")
            };
            model.insert(
                k,
                Entry {
                    value: new,
                    expires_at: old.and_then(|e| e.expires_at),
                },
            );
            let op = Op::Update {
                key: key(k),
                update: Update {
                    apply: append,
                    arg,
                    number: 0,
                },
            };
            (op, OpResult::Updated(out.answer))
        }
        70..=79 => {
            // A value with an expiry time (SET EX).
            let at = FAR + v;
            model.insert(
                k,
                Entry {
                    value: value(k, v),
                    expires_at: Some(at),
                },
            );
            (
                ttl(set_expiring, k, value(k, v), at),
                OpResult::Updated(UpdateAnswer::Ok),
            )
        }
        80..=86 => {
            // EXPIRE or PERSIST on a key that may be missing.
            let at = if rng.below(2) == 0 { 0 } else { FAR + v };
            if let Some(e) = model.get_mut(&k) {
                e.expires_at = (at != 0).then_some(at);
            }
            (
                ttl(set_expiry, k, Bytes::new(), at),
                OpResult::Updated(UpdateAnswer::Int(old.is_some() as i64)),
            )
        }
        87..=90 => {
            // An expiry time already past deletes the key.
            model.remove(&k);
            (
                ttl(set_expiring, k, value(k, v), PAST),
                OpResult::Updated(UpdateAnswer::Ok),
            )
        }
        _ => (
            ttl(expiry_of, k, Bytes::new(), 0),
            expiry_answer(old.as_ref()),
        ),
    }
}

fn run_batch(h: &Handle, rng: &mut SplitMix64, model: &mut Model, version: &mut u64, at: &str) {
    let n = 1 + rng.below(30);
    let (ops, want): (Vec<Op>, Vec<OpResult>) =
        (0..n).map(|_| random_op(rng, model, version)).unzip();
    let got = h
        .batch_blocking(ops.clone())
        .unwrap_or_else(|e| panic!("{at}: batch refused: {e}"));
    for ((op, want), got) in ops.iter().zip(&want).zip(&got) {
        assert_eq!(got, want, "{at}: {op:?}");
    }
}

/// A transaction of a few puts and deletes over keys of any shard, with
/// reads of what it has written and of what it has not; committed.
fn run_txn(h: &Handle, rng: &mut SplitMix64, model: &mut Model, version: &mut u64, at: &str) {
    let mut pending: BTreeMap<u64, Option<Bytes>> = BTreeMap::new();
    pollster::block_on(async {
        let mut t = h.begin(ringkv_engine::TxnSettings::default());
        for _ in 0..1 + rng.below(5) {
            let k = rng.below(KEYS);
            *version += 1;
            let seen = match pending.get(&k) {
                Some(p) => p.clone(),
                None => model.get(&k).map(|e| e.value.clone()),
            };
            let got = t.get(key(k)).await.expect("txn get");
            assert_eq!(got, seen, "{at}: txn get {k}");
            if rng.below(4) == 0 {
                let existed = t.delete(key(k)).await.expect("txn delete");
                assert_eq!(existed, seen.is_some(), "{at}: txn delete {k}");
                pending.insert(k, None);
            } else {
                // Short values: a shard's part must fit one WAL record.
                let v = Bytes::from(format!("t{k}:{version}"));
                t.put(key(k), v.clone()).await.expect("txn put");
                pending.insert(k, Some(v));
            }
        }
        t.commit().await.expect("commit");
    });
    for (k, v) in pending {
        match v {
            // A transaction's put is a plain SET: no expiry time.
            Some(value) => model.insert(
                k,
                Entry {
                    value,
                    expires_at: None,
                },
            ),
            None => model.remove(&k),
        };
    }
}

/// The engine holds exactly the model: values, expiry times, and the key
/// set a walk over every partition of every shard finds.
fn check_state(engine: &Engine, model: &Model, at: &str) {
    let h = engine.handle();
    let answers = h
        .batch_blocking((0..KEYS).map(get).collect())
        .unwrap_or_else(|e| panic!("{at}: read-back refused: {e}"));
    for (k, a) in (0..KEYS).zip(&answers) {
        let want = model
            .get(&k)
            .map_or(OpResult::NotFound, |e| OpResult::Value(e.value.clone()));
        assert_eq!(a, &want, "{at}: key {k}");
    }
    let answers = h
        .batch_blocking(
            (0..KEYS)
                .map(|k| ttl(expiry_of, k, Bytes::new(), 0))
                .collect(),
        )
        .unwrap_or_else(|e| panic!("{at}: expiry read-back refused: {e}"));
    for (k, a) in (0..KEYS).zip(&answers) {
        assert_eq!(a, &expiry_answer(model.get(&k)), "{at}: expiry of key {k}");
    }
    let mut walked = BTreeSet::new();
    for shard in 0..h.shard_count() {
        let mut from = Some(0);
        while let Some(p) = from {
            let step = pollster::block_on(h.partition_keys(shard, p, 7))
                .unwrap_or_else(|e| panic!("{at}: partition walk refused: {e}"));
            for k in step.keys {
                assert_eq!(h.shard_of(&k), shard, "{at}: {k:?} listed by shard {shard}");
                assert!(walked.insert(k.clone()), "{at}: {k:?} listed twice");
            }
            from = step.next;
            assert!(from.is_none_or(|n| n > p && n <= PARTITIONS_PER_SHARD));
        }
    }
    let want: BTreeSet<Bytes> = model.keys().map(|&k| key(k)).collect();
    assert_eq!(walked, want, "{at}: keys found by the partition walk");
}

/// What the runs of one tier went through (summed over lives and seeds),
/// so the contract cannot pass by never reaching the interesting paths.
#[derive(Debug, Default)]
struct Coverage {
    checkpoints: u64,
    /// Opens that loaded entries from a snapshot.
    snapshot_recoveries: u64,
    records_replayed: u64,
    crashes: u64,
    /// Hybrid tier: GC runs and reads that missed the cache.
    gc_runs: u64,
    cache_misses: u64,
}

impl Coverage {
    fn add_life(&mut self, engine: &Engine) {
        let m = engine.metrics();
        for s in &m.shards {
            self.checkpoints += s.checkpoints;
            self.snapshot_recoveries += (s.recovery_snapshot_entries > 0) as u64;
            self.records_replayed += s.recovery_records_replayed;
            if let Some(h) = &s.hybrid {
                self.gc_runs += h.gc_runs;
                self.cache_misses += h.cache_misses;
            }
        }
    }

    fn check(&self, tier: Tier) {
        eprintln!("{tier:?}: {self:?}");
        assert!(self.checkpoints > 0, "{tier:?}: no checkpoint ran");
        assert!(
            self.snapshot_recoveries > 0,
            "{tier:?}: no open started from a snapshot"
        );
        assert!(
            self.records_replayed > 0,
            "{tier:?}: no open replayed the WAL"
        );
        assert!(self.crashes > 0, "{tier:?}: no life ended in a crash");
        match tier {
            Tier::Memory => {}
            Tier::Hybrid => {
                assert!(self.gc_runs > 0, "hybrid: GC never ran");
                assert!(self.cache_misses > 0, "hybrid: every read hit the cache");
            }
        }
    }
}

/// One seed on one tier: [`LIVES`] lives of the engine on one simulated
/// disk, each checked on open, each ended by a shutdown or a crash.
fn run_seed(tier: Tier, seed: u64, coverage: &mut Coverage) {
    let disk = SimDisk::new(seed);
    let mut config = small_config(Path::new("/contract"), 2, Durability::Sync);
    configure(tier, &mut config);
    let mut rng = SplitMix64::new(seed ^ 0xC0_47AC7);
    let mut model = Model::new();
    let mut version = 0u64;
    for life in 0..LIVES {
        let at = format!("{tier:?} seed {seed} life {life}");
        let engine = Engine::open_with_disk(&config, disk.clone())
            .unwrap_or_else(|e| panic!("{at}: open failed: {e}"));
        assert_eq!(engine.tier(), tier, "{at}: the engine runs another tier");
        check_state(&engine, &model, &format!("{at}, after open"));
        let h = engine.handle();
        let batches = 20 + rng.below(30);
        for b in 0..batches {
            let at = format!("{at} batch {b}");
            if life == 1 && b == 10 {
                // FLUSHALL once per run, mid-life.
                let deleted = pollster::block_on(h.clear()).expect("clear");
                assert_eq!(deleted, model.len() as u64, "{at}: keys cleared");
                model.clear();
            } else if rng.below(8) == 0 {
                run_txn(&h, &mut rng, &mut model, &mut version, &at);
            } else {
                run_batch(&h, &mut rng, &mut model, &mut version, &at);
            }
        }
        check_state(&engine, &model, &format!("{at}, before it ends"));
        coverage.add_life(&engine);
        drop(h);
        if rng.below(2) == 0 {
            engine
                .shutdown()
                .unwrap_or_else(|e| panic!("{at}: shutdown: {e}"));
        } else {
            // Every batch was acknowledged under `sync`: a crash loses none.
            engine.halt();
            disk.crash();
            coverage.crashes += 1;
        }
    }
    let engine = Engine::open_with_disk(&config, disk.clone()).expect("last open");
    check_state(&engine, &model, &format!("{tier:?} seed {seed}, last open"));
    engine.shutdown().expect("shutdown");
}

fn run_contract(tier: Tier) {
    init_log();
    let seeds: Vec<u64> = match std::env::var("RINGKV_CONTRACT_SEED") {
        Ok(s) => vec![s.parse().expect("RINGKV_CONTRACT_SEED must be a number")],
        Err(_) => {
            let n = std::env::var("RINGKV_CONTRACT_SEEDS")
                .map(|s| s.parse().expect("RINGKV_CONTRACT_SEEDS must be a number"))
                .unwrap_or(SEEDS);
            (1..=n).collect()
        }
    };
    let mut coverage = Coverage::default();
    for seed in &seeds {
        run_seed(tier, *seed, &mut coverage);
    }
    if seeds.len() > 1 {
        coverage.check(tier);
    }
}

// ---- the tiers under contract: one line each ----

#[test]
fn memory_tier_keeps_the_contract() {
    run_contract(Tier::Memory);
}

#[test]
fn hybrid_tier_keeps_the_contract() {
    run_contract(Tier::Hybrid);
}
