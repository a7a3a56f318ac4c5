//! The hybrid tier on its own, single-threaded and fully decided by a seed,
//! beside a `BTreeMap` model: random puts (some with an expiry), deletes,
//! GC steps, fuzzy checkpoints taken one partition at a time between the
//! other operations, and crashes. A crash drops what was not synced and
//! recovers the way the shard does: a new tier loads the last published
//! checkpoint and replays every operation since that checkpoint began.
//! The keys are few, so most writes overwrite, and six of them share a
//! tag. A clock moves on at every step: some puts expire within a few
//! hundred steps (and read as absent from then on), others far in the
//! future; active expiry steps delete what the tier lists as due, through
//! logged deletes as the shard does. After every step every key is read back, every key walked, and a
//! delete must answer whether its key was there: half of them the blocking
//! way, half the way the shard does it (applied without reading, the
//! answer read later, with other steps in between).
//!
//! Puts made while the unresolved set is full queue settling reads; the
//! model takes them, reads them and applies what they found at random
//! later steps, as the shard's settling task does between requests. The
//! tier forgets what it keeps in RAM at one step in three, so writes and
//! deletes meet records on the device.
//!
//! The second test runs the same with a hot device in front of the value
//! device, a few segments large, so writes, GC and reads move records
//! between the two devices (both on the one simulated disk, which loses
//! what either did not sync at a crash); across its seeds records must
//! have moved both ways.
//!
//! Unlike `crash_sim`, no thread timing is involved: a failing seed
//! replays exactly. `RINGKV_MODEL_SEEDS=N` runs more seeds (30 by
//! default), `RINGKV_MODEL_SEED=S` one.

use bytes::Bytes;
use common::hybrid::{key, settings, SHARED_TAG};
use futures::FutureExt;
use ringkv_engine::hash::fnv1a64;
use ringkv_engine::io::sim::SimDisk;
use ringkv_engine::io::Disk;
use ringkv_engine::rng::SplitMix64;
use ringkv_engine::tier::hybrid::ReadHold;
use ringkv_engine::tier::{
    ColdGet, ColdRead, DeleteLookup, HotSettings, HybridSettings, HybridTier, Tier,
};
use std::collections::BTreeMap;

mod common;

const PLAIN_KEYS: u64 = 24;

#[derive(Clone, Debug)]
enum Logged {
    Put(Vec<u8>, Vec<u8>, Option<u64>),
    Delete(Vec<u8>),
}

type Entries = Vec<(Vec<u8>, Vec<u8>, Option<u64>)>;
type Model = BTreeMap<Vec<u8>, (Vec<u8>, Option<u64>)>;

/// Whether the model's entry of `k` is there and unexpired at `now`.
fn live(model: &Model, k: &[u8], now: u64) -> bool {
    model
        .get(k)
        .is_some_and(|(_, at)| at.is_none_or(|at| at > now))
}

/// What reads see at `now`: the model without its expired entries.
fn visible(model: &Model, now: u64) -> Model {
    model
        .iter()
        .filter(|(k, _)| live(model, k, now))
        .map(|(k, e)| (k.clone(), e.clone()))
        .collect()
}

fn keys() -> Vec<Vec<u8>> {
    SHARED_TAG
        .iter()
        .map(|k| k.as_bytes().to_vec())
        .chain((0..PLAIN_KEYS).map(key))
        .collect()
}

fn tier_settings(rng: &mut SplitMix64) -> HybridSettings {
    HybridSettings {
        segment_bytes: 64 << 10,
        index_keys: 1_000,
        cache_bytes: [0, 4 << 10, 16 << 10][rng.below(3) as usize],
        // A quarter of the seeds without GC: only writes, deletes and the
        // settling scan settle unresolved entries.
        gc_garbage_percent: [5, 5, 5, 100][rng.below(4) as usize],
        ..settings(0)
    }
}

/// A value naming its key and version, 10 to ~1,500 bytes.
fn value_of(k: &[u8], version: u64, rng: &mut SplitMix64) -> Vec<u8> {
    let mut v = format!("{}#{version}#", String::from_utf8_lossy(k)).into_bytes();
    let len = [10, 100, 900, 1_500][rng.below(4) as usize];
    while v.len() < len {
        v.push(b'a' + (v.len() % 26) as u8);
    }
    v
}

/// Applies `op`, logged with LSN `lsn` (its place in the log, from 1: a
/// replay gives each write the LSN it had, as the WAL does).
fn apply(t: &mut dyn Tier, op: &Logged, lsn: u64) {
    match op {
        Logged::Put(k, v, at) => {
            t.put_expiring(fnv1a64(k), k, v, *at, lsn);
        }
        Logged::Delete(k) => {
            t.delete_blind(fnv1a64(k), k, lsn);
        }
    }
}

/// The LSN the next logged operation gets.
fn next_lsn(log: &[Logged]) -> u64 {
    log.len() as u64 + 1
}

/// A blind delete's answer still to read: (its read, the key, whether the
/// model had it).
type PendingDelete = (ColdGet, Vec<u8>, bool);

/// Reads the answers of blind deletes and checks them.
fn answer_deletes(
    t: &mut dyn Tier,
    pending: &mut Vec<PendingDelete>,
    what: &str,
) -> Result<(), String> {
    let mut want = Vec::new();
    let mut cold = Vec::new();
    for (i, (mut g, k, existed)) in pending.drain(..).enumerate() {
        g.index = i;
        cold.push(g);
        want.push((k, existed));
    }
    for (i, a) in pollster::block_on(t.read_cold(cold)) {
        let (k, existed) = &want[i];
        if a.as_ref().map(|v| v.is_some()) != Ok(*existed) {
            return Err(format!(
                "{what}: the blind delete of {} answers {:?}, want existed = {existed}",
                String::from_utf8_lossy(k),
                a.map(|v| v.is_some())
            ));
        }
    }
    Ok(())
}

/// Settling reads at their three stages: queued in the tier, taken (not
/// read yet), read (their device reads done, held before their records
/// are tried; writes, GC and checkpoints run meanwhile).
#[derive(Default)]
struct Settles {
    taken: Vec<ColdGet>,
    read: Vec<(ReadHold, ColdRead)>,
    finished: u64,
}

impl Settles {
    /// One stage further for some of them, as the dice say: take what the
    /// tier queued, read what was taken, or apply what was read (a record
    /// longer than its first read is read again then).
    fn step(&mut self, t: &mut HybridTier<SimDisk>, rng: &mut SplitMix64) {
        match rng.below(3) {
            0 => t.take_settles(1 + rng.below(4) as usize, &mut self.taken),
            1 if !self.taken.is_empty() => {
                let n = (1 + rng.below(4) as usize).min(self.taken.len());
                let batch: Vec<ColdGet> = self.taken.drain(..n).collect();
                let hold = t.hold_next_cold_read();
                let mut read = t.read_cold(batch);
                // The simulated disk answers at once: one poll makes the
                // device reads and stops at the hold.
                let polled = (&mut read).now_or_never();
                assert!(
                    polled.is_none() && hold.reached(),
                    "the read stops at its hold"
                );
                self.read.push((hold, read));
            }
            _ if !self.read.is_empty() => {
                for (hold, read) in std::mem::take(&mut self.read) {
                    hold.release();
                    self.finished += pollster::block_on(read).len() as u64;
                }
            }
            _ => {}
        }
    }
}

/// The GET path the shard takes: look up all, read the cold ones.
fn split_gets(t: &mut dyn Tier, model: &Model, what: &str) -> Result<(), String> {
    let all = keys();
    let hashes: Vec<u64> = all.iter().map(|k| fnv1a64(k)).collect();
    let all: Vec<Bytes> = all.into_iter().map(Bytes::from).collect();
    let (mut out, mut cold) = (Vec::new(), Vec::new());
    let mut left = usize::MAX;
    t.get_many_split(&hashes, &all, &mut out, &mut left, &mut cold);
    let mut answers: Vec<Result<Option<Bytes>, String>> = out.into_iter().map(Ok).collect();
    for (i, a) in pollster::block_on(t.read_cold(cold)) {
        answers[i] = a.map_err(|e| format!("{e:?}"));
    }
    for (k, a) in all.iter().zip(answers) {
        let want = model.get(&k[..]).map(|(v, _)| Bytes::from(v.clone()));
        if a != Ok(want.clone()) {
            return Err(format!(
                "{what}: a split GET of {} answers {:?}, want {:?}",
                String::from_utf8_lossy(k),
                a.map(|v| v.map(|v| String::from_utf8_lossy(&v[..v.len().min(24)]).into_owned())),
                want.map(|v| String::from_utf8_lossy(&v[..v.len().min(24)]).into_owned()),
            ));
        }
    }
    Ok(())
}

/// Reads every key back (the blocking way, then the way the shard's
/// GETs do; with `split_first` the other way round, so the split GETs
/// meet records on the device, not the ones the blocking reads just
/// brought into RAM), walks every key, and compares with the model.
fn check(t: &mut dyn Tier, model: &Model, what: &str, split_first: bool) -> Result<(), String> {
    if split_first {
        split_gets(t, model, what)?;
    }
    for k in keys() {
        let got = t.get_expiring(fnv1a64(&k), &k);
        let want = model.get(&k).map(|(v, at)| (Bytes::from(v.clone()), *at));
        if got != want {
            let show = |x: &Option<(Bytes, Option<u64>)>| {
                x.as_ref().map(|(v, at)| {
                    (
                        String::from_utf8_lossy(&v[..v.len().min(24)]).into_owned(),
                        *at,
                    )
                })
            };
            return Err(format!(
                "{what}: key {} reads {:?}, want {:?}",
                String::from_utf8_lossy(&k),
                show(&got),
                show(&want)
            ));
        }
    }
    if !split_first {
        split_gets(t, model, what)?;
    }
    let mut seen = BTreeMap::new();
    for p in 0..t.partition_count() {
        t.visit_partition(p, &mut |k, v, at| {
            seen.insert(k.to_vec(), (v.to_vec(), at));
        });
    }
    if &seen != model {
        let short = |e: Option<&(Vec<u8>, Option<u64>)>| {
            e.map(|(v, at)| {
                (
                    String::from_utf8_lossy(&v[..v.len().min(24)]).into_owned(),
                    *at,
                )
            })
        };
        let differ: Vec<_> = seen
            .keys()
            .chain(model.keys())
            .filter(|k| seen.get(*k) != model.get(*k))
            .map(|k| {
                (
                    String::from_utf8_lossy(k).into_owned(),
                    short(seen.get(k)),
                    short(model.get(k)),
                )
            })
            .collect();
        return Err(format!(
            "{what}: a walk lists {} keys, the model has {}; (key, walked, model): {differ:?}",
            seen.len(),
            model.len()
        ));
    }
    let errors = t.take_read_errors();
    if !errors.is_empty() {
        return Err(format!("{what}: read errors {errors:?}"));
    }
    Ok(())
}

/// An active expiry step, as the shard takes it: up to `max` keys the
/// tier lists as due are deleted through logged deletes. Every key listed
/// must be expired in the model; every key that is, once the tier has
/// listed none, must be gone or still listed later (checked by the reads:
/// an expired key reads absent whether deleted or not).
fn expire_some(
    t: &mut dyn Tier,
    model: &mut Model,
    log: &mut Vec<Logged>,
    now: u64,
    max: usize,
    what: &str,
) -> Result<u64, String> {
    let mut expired = 0;
    for k in t.due_keys(max) {
        let k = k.to_vec();
        if live(model, &k, now) || !model.contains_key(&k) {
            return Err(format!(
                "{what}: active expiry lists {}, which the model has as {:?} at {now}",
                String::from_utf8_lossy(&k),
                model.get(&k).map(|(_, at)| at)
            ));
        }
        let seen = match t.delete_lookup(fnv1a64(&k), &k) {
            DeleteLookup::Expired | DeleteLookup::Cold(_) => None,
            DeleteLookup::Live => Some("live"),
            DeleteLookup::Absent => Some("absent"),
        };
        if let Some(seen) = seen {
            return Err(format!(
                "{what}: the due key {} looks {seen} to a delete",
                String::from_utf8_lossy(&k)
            ));
        }
        t.delete_blind(fnv1a64(&k), &k, next_lsn(log));
        log.push(Logged::Delete(k.clone()));
        model.remove(&k);
        expired += 1;
    }
    Ok(expired)
}

/// A checkpoint in progress: its start in the log, the entries so far and
/// the next partition to copy.
struct Running {
    start: usize,
    entries: Entries,
    next: usize,
    /// Only what changed since the last published checkpoint.
    delta: bool,
}

/// Runs one seed; returns how many keys active expiry deleted.
/// What a seed's run did: keys active expiry deleted, and records moved
/// up to the hot device and down from it.
#[derive(Default)]
struct Ran {
    expired: u64,
    promotions: u64,
    demotions: u64,
}

fn run(seed: u64, tiered: bool) -> Result<Ran, String> {
    let mut rng = SplitMix64::new(seed);
    let disk = SimDisk::new(seed);
    let mut settings = tier_settings(&mut rng);
    if tiered {
        settings.hot = Some(HotSettings {
            dir: "/v/shard-000/values-hot".into(),
            bytes: settings.segment_bytes * (4 + rng.below(13)),
            promote_reads: 1 + rng.below(3) as u8,
        });
    }
    // Most seeds bound the unresolved entries low, so the set fills,
    // background steps settle it, and PUTs read again when it is full; at
    // a bound of 1 a restart's replay leaves it far over, for the
    // settling scan.
    let unresolved_max = [None, Some(1), Some(4), Some(12)][rng.below(4) as usize];
    let open = |disk: &SimDisk| {
        let mut t = HybridTier::new(disk.clone(), settings.clone()).expect("tier");
        if let Some(hot) = &settings.hot {
            disk.create_dir_all(&hot.dir).expect("hot folder");
            t = t.with_hot_device(disk.clone());
        }
        if let Some(max) = unresolved_max {
            t.set_unresolved_max(max);
        }
        t
    };
    let mut t = open(&disk);
    let keys = keys();
    let mut model: Model = BTreeMap::new();
    let mut log: Vec<Logged> = Vec::new();
    // The published checkpoints a recovery loads: a full one, then the
    // deltas over it; each as (log position it began at, entries).
    let mut published: Vec<(usize, Entries)> = Vec::new();
    // The tier's change marks are relative to the last published
    // checkpoint (none failed or was lost to a crash since it).
    let mut marks_valid = false;
    let mut running: Option<Running> = None;
    let mut version = 0u64;
    let mut pending: Vec<PendingDelete> = Vec::new();
    let mut settles = Settles::default();
    let mut now = 1_000_000_000u64;
    let mut expired = 0;
    // Records moved up and down by the tiers dropped at crashes.
    let mut moved = (0, 0);
    t.set_now_ms(now);
    for step in 0..3_000u32 {
        let dice = rng.below(100);
        let what = format!("seed {seed} step {step}");
        now += rng.below(8);
        t.set_now_ms(now);
        if !pending.is_empty() && rng.below(3) == 0 {
            answer_deletes(&mut t, &mut pending, &what)?;
        }
        if rng.below(2) == 0 {
            settles.step(&mut t, &mut rng);
        }
        // The checks read every key back into RAM; with so few keys,
        // records reach the device only when RAM forgets them.
        if rng.below(3) == 0 {
            t.forget_cached();
        }
        if dice < 55 {
            // Few keys take most writes, so overwrites of cold keys are many.
            let k = if rng.below(4) == 0 {
                &keys[rng.below(keys.len() as u64) as usize]
            } else {
                &keys[rng.below(8) as usize + SHARED_TAG.len() - 3]
            };
            version += 1;
            let v = value_of(k, version, &mut rng);
            let at = match version % 6 {
                0 | 3 => Some(4_102_444_800_000 + version),
                // Due within about a hundred steps.
                1 => Some(now + 1 + rng.below(800)),
                _ => None,
            };
            let op = Logged::Put(k.clone(), v.clone(), at);
            // What the memory limit checks a put against bounds what the
            // put adds to RAM.
            let growth = t.put_growth_bytes(fnv1a64(k), k, v.len(), at);
            let before = t.memory_bytes() as i64;
            apply(&mut t, &op, next_lsn(&log));
            let grew = t.memory_bytes() as i64 - before;
            if grew > growth.max(0) {
                return Err(format!(
                    "{what}: a put grew RAM by {grew} bytes, checked for {growth}; after it: {:?}",
                    t.stats()
                ));
            }
            log.push(op);
            model.insert(k.clone(), (v, at));
        } else if dice < 65 {
            let k = &keys[rng.below(keys.len() as u64) as usize];
            let op = Logged::Delete(k.clone());
            let had = live(&model, k, now);
            // A blocking delete answers whether an entry was there,
            // expired or not (the shard looks at expiry itself).
            let (existed, want) = if rng.below(2) == 0 {
                (
                    t.delete(fnv1a64(k), k, next_lsn(&log)),
                    model.contains_key(k),
                )
            } else {
                // The shard's way: logged and applied without a read when
                // RAM cannot tell; the answer is read afterwards.
                let existed = match t.delete_lookup(fnv1a64(k), k) {
                    DeleteLookup::Absent => false,
                    DeleteLookup::Live => {
                        t.delete_blind(fnv1a64(k), k, next_lsn(&log));
                        true
                    }
                    DeleteLookup::Expired => {
                        // Logged and applied; it answers "not found".
                        t.delete_blind(fnv1a64(k), k, next_lsn(&log));
                        false
                    }
                    DeleteLookup::Cold(g) => {
                        t.delete_blind(fnv1a64(k), k, next_lsn(&log));
                        pending.push((g, k.clone(), had));
                        // Checked when the answer is read.
                        had
                    }
                };
                (existed, had)
            };
            if existed != want {
                return Err(format!(
                    "{what}: delete of {} answers {existed}; read errors {:?}",
                    String::from_utf8_lossy(k),
                    t.take_read_errors()
                ));
            }
            log.push(op);
            model.remove(k);
        } else if dice < 70 {
            expired += expire_some(
                &mut t,
                &mut model,
                &mut log,
                now,
                1 + rng.below(6) as usize,
                &what,
            )?;
        } else if dice < 80 {
            for _ in 0..1 + rng.below(4) {
                t.background_step();
            }
        } else if dice < 97 {
            match running.as_mut() {
                None => {
                    t.checkpoint_begin();
                    running = Some(Running {
                        start: log.len(),
                        entries: Vec::new(),
                        next: 0,
                        // Chains of up to 5 deltas.
                        delta: marks_valid && published.len() < 6 && rng.below(4) != 0,
                    });
                }
                Some(_) if rng.below(40) == 0 => {
                    // The checkpoint fails (a full disk): its file is
                    // dropped, and the marks of what it copied are lost.
                    running = None;
                    marks_valid = false;
                }
                Some(r) if r.next < t.partition_count() => {
                    // Several partitions at a time: 256 of them.
                    let end = (r.next + 1 + rng.below(64) as usize).min(t.partition_count());
                    for p in r.next..end {
                        t.visit_checkpoint_partition(p, r.delta, &mut |k, v, at| {
                            let v = v.expect("no deleted-key entries");
                            r.entries.push((k.to_vec(), v.to_vec(), at))
                        });
                    }
                    r.next = end;
                }
                Some(_) => {
                    let mut r = running.take().expect("running");
                    t.checkpoint_finish(&mut |k, v, at| {
                        let v = v.expect("no deleted-key entries");
                        r.entries.push((k.to_vec(), v.to_vec(), at))
                    })
                    .map_err(|e| format!("{what}: checkpoint: {e}"))?;
                    // Published: its snapshot is durable; what it retires goes.
                    if !r.delta {
                        published.clear();
                    }
                    published.push((r.start, r.entries));
                    marks_valid = true;
                    t.checkpoint_published();
                }
            }
        } else {
            // Crash: unsynced writes are lost; recovery loads the last
            // published checkpoint and replays the log since it began.
            let before = t.stats();
            moved.0 += before.promotions;
            moved.1 += before.demotions;
            drop(t);
            running = None;
            // Answers and settling reads not made yet are lost with the
            // process.
            pending.clear();
            settles.taken.clear();
            settles.read.clear();
            disk.crash();
            marks_valid = false;
            let mut back = open(&disk);
            back.set_now_ms(now);
            for (i, (_, entries)) in published.iter().enumerate() {
                back.load_checkpoint_begin(i > 0)
                    .map_err(|e| format!("{what}: checkpoint {i}: {e}"))?;
                for (k, v, at) in entries {
                    back.load_checkpoint_entry(k, v, *at)
                        .map_err(|e| format!("{what}: checkpoint entry: {e}"))?;
                }
            }
            back.load_checkpoint_done()
                .map_err(|e| format!("{what}: checkpoint chain: {e}"))?;
            // As recovery does: the replay's blind writes are not bounded.
            back.replay_begin();
            let replay_from = published.last().map_or(0, |(start, _)| *start);
            for (i, op) in log.iter().enumerate().skip(replay_from) {
                apply(&mut back, op, i as u64 + 1);
            }
            back.recovery_done();
            t = back;
            check(
                &mut t,
                &visible(&model, now),
                &format!("{what} (after a crash)"),
                tiered && rng.below(2) == 0,
            )?;
            continue;
        }
        check(
            &mut t,
            &visible(&model, now),
            &what,
            tiered && rng.below(2) == 0,
        )?;
    }
    answer_deletes(&mut t, &mut pending, "at the end")?;
    if unresolved_max.is_some() && settles.finished == 0 {
        return Err(format!(
            "seed {seed}: no settling read was made with a full unresolved set"
        ));
    }
    let stats = t.stats();
    if std::env::var("RINGKV_MODEL_DEBUG").is_ok() {
        eprintln!("{stats:?}");
    }
    Ok(Ran {
        expired,
        promotions: moved.0 + stats.promotions,
        demotions: moved.1 + stats.demotions,
    })
}

/// The seeds to run: `RINGKV_MODEL_SEED`, or the first
/// `RINGKV_MODEL_SEEDS` (30 by default).
fn seeds() -> Vec<u64> {
    match std::env::var("RINGKV_MODEL_SEED") {
        Ok(s) => vec![s.parse().expect("RINGKV_MODEL_SEED is a number")],
        Err(_) => {
            let n = std::env::var("RINGKV_MODEL_SEEDS")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(30u64);
            (0..n).collect()
        }
    }
}

/// Runs `seeds`, fails the test if any failed, and returns what the runs
/// did in all.
fn run_all(seeds: Vec<u64>, tiered: bool) -> Ran {
    let (mut failed, mut all) = (Vec::<String>::new(), Ran::default());
    for seed in seeds {
        match run(seed, tiered) {
            Ok(r) => {
                all.expired += r.expired;
                all.promotions += r.promotions;
                all.demotions += r.demotions;
            }
            Err(e) => failed.push(e),
        }
    }
    assert!(
        failed.is_empty(),
        "{} seeds failed:\n{}",
        failed.len(),
        failed.join("\n")
    );
    all
}

#[test]
fn the_tier_matches_the_model_through_gc_checkpoints_and_crashes() {
    let seeds = seeds();
    let n = seeds.len();
    let expired = run_all(seeds, false).expired;
    assert!(
        n < 10 || expired > 0,
        "active expiry deleted nothing in {n} seeds"
    );
    eprintln!("hybrid_model: {n} seeds, active expiry deleted {expired} keys");
}

#[test]
fn a_tier_with_a_hot_device_matches_the_model_and_moves_records_both_ways() {
    let seeds = seeds();
    let n = seeds.len();
    let ran = run_all(seeds, true);
    assert!(
        n < 10 || (ran.promotions > 0 && ran.demotions > 0),
        "in {n} seeds {} records moved up to the hot device and {} down",
        ran.promotions,
        ran.demotions
    );
    eprintln!(
        "hybrid_model, hot device: {n} seeds, {} records moved up, {} down",
        ran.promotions, ran.demotions
    );
}
