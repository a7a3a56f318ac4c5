//! Model-based crash tests on the simulated disk, in `sync` mode: random
//! batches of puts, deletes and gets over a small key space run beside a
//! `BTreeMap` model; a tail of concurrent batches is cut by a crash (engine
//! halted, unsynced writes dropped, the last block torn); after reopening,
//! every acknowledged write must be there with its latest acknowledged
//! value (or the value of a later write that was requested but not
//! acknowledged), and no value that was never written may appear. Each seed
//! runs several crash cycles, so recovery also recovers recovered logs.
//!
//! A third of the puts carry an expiry time, derived from the write's
//! version so the model needs no clock: two in three of them far in the
//! future, one in three already past when written (the key reads absent
//! at once, active expiry deletes it through logged deletes while the
//! seed runs, recovery replays the put and must not bring back an older
//! version). After every reopen each key's expiry must be the one written
//! with the value it holds (none for a plain put), so an expiry never
//! survives without its value, nor a value without its expiry. Expiry
//! times that pass during a run are `hybrid_model`'s part (its clock is
//! simulated; here the wall clock would make replays inexact).
//!
//! The same runs go on the hybrid tier too (values in 64 KiB segment
//! files, a 16 KiB cache, GC whenever 5% of segment bytes are garbage), so
//! crashes cut it mid-GC, between a GC and the checkpoints that retire its
//! victims, and during checkpoints (slow writes and syncs in the tail).
//!
//! Seeds from [`IN_FLIGHT_SEEDS`] on run with several WAL flushes in flight
//! per shard (`storage.wal_flushes_in_flight` 2 to 4): their tails complete
//! the device's writes in any order (random latency), and their crashes keep
//! any subset of the unsynced writes, each whole, lost or torn; so a flush
//! may survive complete while an older one in flight with it does not.
//!
//! Seeds: 200 by default, `RINGKV_CRASH_SEEDS=N` for more, and
//! `RINGKV_CRASH_SEED=S` to rerun one. Thread timing is not part of the
//! seed: a rerun takes the same operations but may cut the concurrent tail
//! at a different point. So every run records what timing decided (each
//! crash image and which tail batches were acknowledged, `common::tape`),
//! and a failing seed saves that recording and prints
//! `RINGKV_CRASH_REPLAY=PATH`, which replays it exactly: every crash leaves
//! the recorded image, and every recovery and check after it repeats.

mod common;

use bytes::Bytes;
use common::tape::{tape_path, Tape};
use common::*;
use ringkv_engine::io::sim::{SimDisk, SimFaults};
use ringkv_engine::rng::SplitMix64;
use ringkv_engine::{Engine, Op, OpResult, TtlUpdate, UpdateAnswer};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;
use tunables::Durability;

const KEYS: u64 = 64;
const CYCLES: u32 = 3;

type Rng = SplitMix64;

/// A key's state: `Some(version)` or absent.
type State = Option<u64>;

/// The expiry time a put with an expiry gives version `version`: in 2001
/// for one version in nine (expired when written), else in the year 2100
/// and later (nothing else expires during the test).
fn expiry_of_version(version: u64) -> u64 {
    if expired_when_written(version) {
        1_000_000_000_000 + version
    } else {
        4_102_444_800_000 + version
    }
}

fn expired_when_written(version: u64) -> bool {
    version % 9 == 6
}

/// The state a read sees after a write leaves `state`: a version written
/// with an expiry already past reads as absent.
fn seen(state: State) -> State {
    state.filter(|&v| !expired_when_written(v))
}

fn ttl_op(apply: ringkv_engine::TtlUpdateFn, k: u64, arg: Bytes, number: i64) -> Op {
    Op::UpdateTtl {
        key: key(k),
        update: TtlUpdate { apply, arg, number },
    }
}

/// Checks every key's expiry against the version it holds.
fn check_expiries(
    h: &ringkv_engine::Handle,
    states: &BTreeMap<u64, State>,
    cycle: u32,
) -> Result<(), String> {
    let answers = h
        .batch_blocking(
            (0..KEYS)
                .map(|k| ttl_op(expiry_of, k, Bytes::new(), 0))
                .collect(),
        )
        .map_err(|e| format!("cycle {cycle}: expiry read-back refused: {e}"))?;
    for (k, a) in (0..KEYS).zip(&answers) {
        let want = match states[&k] {
            None => -2,
            Some(v) if v % 3 == 0 => expiry_of_version(v) as i64,
            Some(_) => -1,
        };
        if *a != OpResult::Updated(UpdateAnswer::Int(want)) {
            return Err(format!(
                "cycle {cycle}: key {k} ({}) has expiry {a:?}, want {want}",
                describe(&states[&k])
            ));
        }
    }
    Ok(())
}

fn random_batch(rng: &mut Rng, next_version: &mut u64, max_ops: u64) -> Vec<Op> {
    let n = 1 + rng.below(max_ops);
    (0..n)
        .map(|_| {
            let k = rng.below(KEYS);
            match rng.below(10) {
                0..=5 => {
                    *next_version += 1;
                    let version = *next_version;
                    // Every third version carries an expiry time.
                    if version.is_multiple_of(3) {
                        ttl_op(
                            set_expiring,
                            k,
                            value(k, version),
                            expiry_of_version(version) as i64,
                        )
                    } else {
                        put(k, version)
                    }
                }
                6..=7 => del(k),
                _ => get(k),
            }
        })
        .collect()
}

fn key_index(op: &Op) -> u64 {
    std::str::from_utf8(&op.key()[4..])
        .expect("test key")
        .parse()
        .expect("test key")
}

/// The state a write leaves its key in.
fn write_state(op: &Op) -> Option<State> {
    match op {
        Op::Put { value, .. } => Some(Some(parse_value(value).expect("test value").1)),
        Op::Delete { .. } => Some(None),
        Op::Get { .. } => None,
        Op::UpdateTtl { update, .. } => Some(Some(parse_value(&update.arg).expect("test value").1)),
        Op::Update { .. } => unreachable!("this test sends no plain updates"),
    }
}

fn describe(state: &State) -> String {
    match state {
        Some(v) => format!("version {v}"),
        None => "absent".to_string(),
    }
}

/// What a seed exercised, so the suite can check it reached the paths it
/// is meant to test.
#[derive(Default)]
struct Coverage {
    checkpoints: u64,
    /// Checkpoints written as deltas (recoveries load chains).
    deltas: u64,
    torn_blocks: u64,
    segments_rolled: u64,
    segments_recycled: u64,
    gc_runs: u64,
    device_reads: u64,
    /// Records moved between a hot device and the value device.
    moves: u64,
    /// Puts acknowledged with an expiry already past.
    expired_puts: u64,
    /// Every key's state at the end of the run.
    final_model: Vec<State>,
}

/// The first seed of the runs with several flushes in flight.
const IN_FLIGHT_SEEDS: u64 = 1_000_000;
/// The first seed of the hybrid runs with a hot device in front of the
/// value device (several flushes in flight too).
const TIERED_SEEDS: u64 = 2_000_000;

/// Which test runs `seed`: 0 the plain ones, 1 several flushes in flight,
/// 2 a hot device.
fn seed_range(seed: u64) -> u8 {
    match seed {
        s if s >= TIERED_SEEDS => 2,
        s if s >= IN_FLIGHT_SEEDS => 1,
        _ => 0,
    }
}

fn run_seed(seed: u64, hybrid: bool, tape: &mut Tape) -> Result<Coverage, String> {
    let mut coverage = Coverage::default();
    let mut rng = SplitMix64::new(seed);
    let disk = SimDisk::new(seed);
    let shards = 1 + (seed % 3) as u32;
    let dir = Path::new("/crash");
    let mut config = small_config(dir, shards, Durability::Sync);
    if hybrid {
        use_small_hybrid_tier(&mut config);
        if seed >= TIERED_SEEDS {
            // Both devices in the data directory (the hot one in its own
            // folder, both unthrottled): four to seven 64 KiB segments
            // per shard.
            config.devices.insert("hot".to_string(), Default::default());
            config.storage.hot_device = "hot".to_string();
            config.storage.hot_bytes =
                tunables::ByteSize::kib(64 * (4 + seed % 4) * u64::from(shards));
            config.storage.hot_promote_reads = 1 + (seed % 2) as u32;
        }
    }
    if seed.is_multiple_of(4) {
        // Let some group commits wait for company.
        config.storage.group_commit_max_delay = tunables::Duration::from_micros(200);
    }
    let in_flight = seed >= IN_FLIGHT_SEEDS;
    if in_flight {
        config.storage.wal_flushes_in_flight = 2 + (seed % 3) as u32;
    }
    let mut model: BTreeMap<u64, State> = (0..KEYS).map(|k| (k, None)).collect();
    let mut next_version = 0u64;
    // Half the memory-tier seeds carry cold data the test never changes:
    // the writes then change a small part of the live data between two
    // checkpoints, and the checkpointer takes deltas (when they change
    // most of it, a full copy is cheaper and it takes those).
    let ballast = if !hybrid && (seed / 3).is_multiple_of(2) {
        BALLAST_KEYS
    } else {
        0
    };

    for cycle in 0..CYCLES {
        disk.set_faults(SimFaults::default());
        let engine = Engine::open_with_disk(&config, disk.clone())
            .map_err(|e| format!("cycle {cycle}: reopen failed: {e}"))?;
        let h = engine.handle();
        if cycle == 0 {
            write_ballast(&h, ballast)?;
        }
        check_ballast(&h, ballast, cycle)?;

        // Check the state recovery produced against the allowed outcomes
        // (the model already holds them as single states after checking).
        let answers = h
            .batch_blocking((0..KEYS).map(get).collect())
            .map_err(|e| format!("cycle {cycle}: read-back refused: {e}"))?;
        for (k, a) in (0..KEYS).zip(&answers) {
            let got = match a {
                OpResult::Value(v) => Some(
                    parse_value(v)
                        .filter(|(i, _)| *i == k)
                        .ok_or_else(|| {
                            format!("cycle {cycle}: key {k} holds a value never written: {v:?}")
                        })?
                        .1,
                ),
                OpResult::NotFound => None,
                other => {
                    return Err(format!(
                        "cycle {cycle}: key {k}: unexpected answer {other:?}"
                    ))
                }
            };
            if got != model[&k] {
                return Err(format!(
                    "cycle {cycle}: after reopen key {k} is {} but the model says {}",
                    describe(&got),
                    describe(&model[&k])
                ));
            }
        }
        check_expiries(&h, &model, cycle)?;

        // Phase 1: sequential batches, each acknowledged; reads see the model.
        let batches = 8 + rng.below(40);
        for b in 0..batches {
            let ops = random_batch(&mut rng, &mut next_version, 40);
            let answers = h
                .batch_blocking(ops.clone())
                .map_err(|e| format!("cycle {cycle} batch {b}: refused: {e}"))?;
            for (op, a) in ops.iter().zip(&answers) {
                let k = key_index(op);
                match write_state(op) {
                    Some(state) => {
                        let expected = match op {
                            Op::Delete { .. } if model[&k].is_none() => OpResult::NotFound,
                            Op::UpdateTtl { .. } => OpResult::Updated(UpdateAnswer::Ok),
                            _ => OpResult::Ok,
                        };
                        if *a != expected {
                            return Err(format!("cycle {cycle} batch {b}: {op:?} answered {a:?}"));
                        }
                        if seen(state) != state {
                            coverage.expired_puts += 1;
                        }
                        model.insert(k, seen(state));
                    }
                    None => {
                        let got = value_of(a).and_then(|v| parse_value(&v)).map(|(_, v)| v);
                        if got != model[&k] {
                            return Err(format!(
                                "cycle {cycle} batch {b}: get {k} saw {} but the model says {}",
                                describe(&got),
                                describe(&model[&k])
                            ));
                        }
                    }
                }
            }
        }
        // Phase 2: concurrent batches cut by the crash. Slow writes and
        // syncs make it likely that a flush is in flight when we halt.
        disk.set_faults(SimFaults {
            latency: Some(Duration::from_micros(300 + rng.below(700))),
            latency_jitter: in_flight.then_some(Duration::from_micros(1500)),
            crash_keeps_any_writes: in_flight,
            ..SimFaults::default()
        });
        let tail: Vec<Vec<Op>> = (0..1 + rng.below(4))
            .map(|_| random_batch(&mut rng, &mut next_version, 30))
            .collect();
        let wait_us = rng.below(4000);
        let mut running = Some(engine);
        let acked = tape.tail(|| {
            let engine = running.take().expect("the engine runs the tail");
            let threads: Vec<_> = tail
                .iter()
                .cloned()
                .map(|ops| {
                    let h = h.clone();
                    std::thread::spawn(move || h.batch_blocking(ops).is_ok())
                })
                .collect();
            std::thread::sleep(Duration::from_micros(wait_us));
            note_coverage(&engine, &mut coverage);
            engine.halt();
            threads
                .into_iter()
                .map(|t| t.join().expect("submitter thread"))
                .collect()
        })?;
        if let Some(engine) = running {
            // Playing: the tail is not run, its recorded end is restored.
            engine.halt();
        }
        tape.crash(&disk)?;

        // Allowed outcomes per key after the crash.
        let mut allowed: BTreeMap<u64, BTreeSet<State>> = BTreeMap::new();
        let mut acked_write: BTreeSet<u64> = BTreeSet::new();
        for (ops, ok) in tail.iter().zip(&acked) {
            for op in ops {
                if let Some(state) = write_state(op) {
                    let k = key_index(op);
                    allowed.entry(k).or_default().insert(seen(state));
                    if *ok {
                        acked_write.insert(k);
                    }
                }
            }
        }
        for (k, states) in allowed.iter_mut() {
            if !acked_write.contains(k) {
                states.insert(model[k]);
            }
        }

        // Reopen (without faults) and check.
        disk.set_faults(SimFaults::default());
        let engine = Engine::open_with_disk(&config, disk.clone())
            .map_err(|e| format!("cycle {cycle}: reopen after crash failed: {e}"))?;
        let answers = engine
            .handle()
            .batch_blocking((0..KEYS).map(get).collect())
            .map_err(|e| format!("cycle {cycle}: read-back refused: {e}"))?;
        for (k, a) in (0..KEYS).zip(&answers) {
            let got: State = match a {
                OpResult::Value(v) => match parse_value(v) {
                    Some((i, version)) if i == k => Some(version),
                    _ => {
                        return Err(format!(
                            "cycle {cycle}: key {k} holds a value never written: {v:?}"
                        ))
                    }
                },
                OpResult::NotFound => None,
                other => {
                    return Err(format!(
                        "cycle {cycle}: key {k}: unexpected answer {other:?}"
                    ))
                }
            };
            let ok = match allowed.get(&k) {
                Some(states) => states.contains(&got),
                None => got == model[&k],
            };
            if !ok {
                let expected = match allowed.get(&k) {
                    Some(states) => states.iter().map(describe).collect::<Vec<_>>().join(" or "),
                    None => describe(&model[&k]),
                };
                return Err(format!(
                    "cycle {cycle}: after the crash key {k} is {} but must be {expected} (tail acked: {acked:?})",
                    describe(&got)
                ));
            }
            model.insert(k, got);
        }
        check_expiries(&engine.handle(), &model, cycle)?;
        check_ballast(&engine.handle(), ballast, cycle)?;
        engine.halt();
        tape.crash(&disk)?;
    }
    coverage.torn_blocks = disk.stats().torn_blocks;
    coverage.final_model = model.into_values().collect();
    Ok(coverage)
}

/// Cold keys of the seeds that carry them, and their values' size.
const BALLAST_KEYS: u64 = 128;
const BALLAST_BYTES: usize = 2000;

fn ballast_key(i: u64) -> Bytes {
    key(1_000_000 + i)
}

fn ballast_value(i: u64) -> Bytes {
    let mut v = format!("ballast {i} ").into_bytes();
    v.resize(BALLAST_BYTES, b'#');
    Bytes::from(v)
}

/// Writes the `n` cold keys, every batch acknowledged.
fn write_ballast(h: &ringkv_engine::Handle, n: u64) -> Result<(), String> {
    let ids: Vec<u64> = (0..n).collect();
    for chunk in ids.chunks(16) {
        let ops = chunk
            .iter()
            .map(|&i| Op::Put {
                key: ballast_key(i),
                value: ballast_value(i),
            })
            .collect();
        let answers = h
            .batch_blocking(ops)
            .map_err(|e| format!("cold keys refused: {e}"))?;
        if answers.iter().any(|a| *a != OpResult::Ok) {
            return Err(format!("cold keys answered {answers:?}"));
        }
    }
    Ok(())
}

/// The `n` cold keys hold what was written, whatever crashed since.
fn check_ballast(h: &ringkv_engine::Handle, n: u64, cycle: u32) -> Result<(), String> {
    let ops = (0..n)
        .map(|i| Op::Get {
            key: ballast_key(i),
        })
        .collect();
    let answers = h
        .batch_blocking(ops)
        .map_err(|e| format!("cycle {cycle}: cold keys' read-back refused: {e}"))?;
    for (i, a) in answers.iter().enumerate() {
        if value_of(a) != Some(ballast_value(i as u64)) {
            return Err(format!("cycle {cycle}: cold key {i} reads {a:?}"));
        }
    }
    Ok(())
}

fn note_coverage(engine: &Engine, coverage: &mut Coverage) {
    for m in engine.metrics().shards {
        coverage.checkpoints += m.checkpoints;
        coverage.deltas += m.checkpoint_deltas;
        if let Some(h) = m.hybrid {
            coverage.gc_runs += h.gc_runs;
            coverage.device_reads += h.device_reads;
            coverage.moves += h.promotions + h.demotions;
        }
        coverage.segments_rolled += m.wal_bytes_written / (64 * 1024);
        coverage.segments_recycled += m.segments_recycled;
    }
}

/// Runs one seed with a recording tape; if it fails (an error or a
/// panic), saves the tape and panics with the commands that rerun and
/// replay it.
fn run_recorded(seed: u64, hybrid: bool) -> Coverage {
    let mut tape = Tape::recording();
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        run_seed(seed, hybrid, &mut tape)
    }));
    let msg = match outcome {
        Ok(Ok(c)) => return c,
        Ok(Err(msg)) => msg,
        Err(panic) => panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "a panic".to_string()),
    };
    let path = tape_path("crash_sim", seed, hybrid);
    let saved = match tape.save(&path, seed, hybrid) {
        Ok(()) => format!(
            "replay exactly: RINGKV_CRASH_REPLAY={} cargo nextest run -p ringkv-engine --test crash_sim",
            path.display()
        ),
        Err(e) => format!("(the recording could not be saved to {}: {e})", path.display()),
    };
    panic!(
        "crash test failed for seed {seed} (hybrid tier: {hybrid}): {msg}\n\
         rerun: RINGKV_CRASH_SEED={seed} cargo nextest run -p ringkv-engine --test crash_sim\n{saved}"
    )
}

/// Runs this part's seeds (or the one in `RINGKV_CRASH_SEED`, or the
/// recording in `RINGKV_CRASH_REPLAY`), panicking with a rerun and a
/// replay command on failure.
fn run_seeds(part: u64, parts: u64, hybrid: bool) {
    run_seeds_from(1, part, parts, hybrid);
}

/// [`run_seeds`] over the seeds `first..first + n`.
fn run_seeds_from(first: u64, part: u64, parts: u64, hybrid: bool) {
    init_log();
    if let Ok(path) = std::env::var("RINGKV_CRASH_REPLAY") {
        let (seed, tape_hybrid, mut tape) =
            Tape::load(Path::new(&path)).unwrap_or_else(|e| panic!("{e}"));
        let same_range = seed_range(seed) == seed_range(first);
        if part == 0 && tape_hybrid == hybrid && same_range {
            if let Err(msg) = run_seed(seed, hybrid, &mut tape) {
                panic!("replay of seed {seed} (hybrid tier: {hybrid}) from {path}: {msg}");
            }
        }
        return;
    }
    let seeds: Vec<u64> = match std::env::var("RINGKV_CRASH_SEED") {
        Ok(s) if part == 0 => {
            let seed: u64 = s.parse().expect("RINGKV_CRASH_SEED must be a number");
            // Each seed runs in the test of its range.
            if seed_range(seed) == seed_range(first) {
                vec![seed]
            } else {
                Vec::new()
            }
        }
        Ok(_) => Vec::new(),
        Err(_) => {
            let n: u64 = std::env::var("RINGKV_CRASH_SEEDS")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(200);
            (first..first + n).filter(|s| s % parts == part).collect()
        }
    };
    let mut total = Coverage::default();
    for &seed in &seeds {
        if std::env::var("RINGKV_CRASH_VERBOSE").is_ok() {
            eprintln!("crash_sim: seed {seed}");
        }
        let c = run_recorded(seed, hybrid);
        total.gc_runs += c.gc_runs;
        total.device_reads += c.device_reads;
        total.checkpoints += c.checkpoints;
        total.deltas += c.deltas;
        total.torn_blocks += c.torn_blocks;
        total.segments_rolled += c.segments_rolled;
        total.segments_recycled += c.segments_recycled;
        total.expired_puts += c.expired_puts;
        total.moves += c.moves;
    }
    if seeds.len() >= 20 {
        // The paths this test exists for were really taken.
        assert!(
            total.expired_puts > 0,
            "no put with a past expiry was acknowledged in {} seeds",
            seeds.len()
        );
        assert!(
            total.checkpoints > 0,
            "no checkpoint was taken in {} seeds",
            seeds.len()
        );
        assert!(
            total.deltas > 0,
            "no delta checkpoint was taken in {} seeds",
            seeds.len()
        );
        assert!(
            total.torn_blocks > 0,
            "no crash tore a block in {} seeds",
            seeds.len()
        );
        assert!(
            total.segments_rolled > 0,
            "no segment filled up in {} seeds",
            seeds.len()
        );
        if hybrid {
            assert!(total.gc_runs > 0, "no GC ran in {} seeds", seeds.len());
            assert!(
                total.device_reads > 0,
                "no value was read from a segment in {} seeds",
                seeds.len()
            );
            if first >= TIERED_SEEDS {
                assert!(
                    total.moves > 0,
                    "no record moved between the hot and the value device in {} seeds",
                    seeds.len()
                );
            }
        }
    }
}

// Four parts so the seeds run in parallel under nextest.
#[test]
fn acknowledged_writes_survive_crashes_part0() {
    run_seeds(0, 4, false);
}

#[test]
fn acknowledged_writes_survive_crashes_part1() {
    run_seeds(1, 4, false);
}

#[test]
fn acknowledged_writes_survive_crashes_part2() {
    run_seeds(2, 4, false);
}

#[test]
fn acknowledged_writes_survive_crashes_part3() {
    run_seeds(3, 4, false);
}

// Several flushes in flight per shard (memory tier), in two parts.
#[test]
fn flushes_in_flight_acknowledged_writes_survive_crashes_part0() {
    run_seeds_from(IN_FLIGHT_SEEDS, 0, 2, false);
}

#[test]
fn flushes_in_flight_acknowledged_writes_survive_crashes_part1() {
    run_seeds_from(IN_FLIGHT_SEEDS, 1, 2, false);
}

// The hybrid tier, in two parts.
#[test]
fn hybrid_acknowledged_writes_survive_crashes_part0() {
    run_seeds(0, 2, true);
}

#[test]
fn hybrid_acknowledged_writes_survive_crashes_part1() {
    run_seeds(1, 2, true);
}

// The hybrid tier with a hot device.
#[test]
fn hot_device_acknowledged_writes_survive_crashes() {
    run_seeds_from(TIERED_SEEDS, 0, 1, true);
}

/// A recorded run replays to the same end: the tape saved to a file and
/// played back gives every recovery the recorded image, so each key ends
/// in the state the recorded run left it in.
#[test]
fn a_recorded_seed_replays_to_the_same_end() {
    init_log();
    for (seed, hybrid) in [(5, false), (6, true)] {
        let mut tape = Tape::recording();
        let recorded = run_seed(seed, hybrid, &mut tape).expect("the recorded run passes");
        let path = tape_path("crash_sim_replay_test", seed, hybrid);
        tape.save(&path, seed, hybrid).expect("save the tape");
        let (loaded_seed, loaded_hybrid, mut played) = Tape::load(&path).expect("load the tape");
        assert_eq!((loaded_seed, loaded_hybrid), (seed, hybrid));
        let replayed = run_seed(seed, hybrid, &mut played).expect("the replay passes");
        assert_eq!(replayed.final_model, recorded.final_model);
        let Tape::Play(rest) = played else {
            unreachable!("loaded tapes play")
        };
        assert!(rest.is_empty(), "the replay used every recorded event");
        // A damaged tape is refused with a reason, not played.
        let mut bytes = std::fs::read(&path).unwrap();
        bytes.truncate(bytes.len() - 1);
        std::fs::write(&path, &bytes).unwrap();
        let err = Tape::load(&path).expect_err("a cut tape");
        assert!(err.contains("not a crash tape"), "{err}");
        std::fs::remove_file(&path).unwrap();
    }
}
