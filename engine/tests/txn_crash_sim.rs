//! Crash tests of multi-shard transactions on the simulated disk (`sync`):
//! committed transactions are all there after a crash, and a transaction
//! cut by the crash (some parts durable, others not) is wholly applied or
//! wholly absent.
//!
//! Each writer owns a disjoint set of keys spread over every shard and
//! commits transactions one after another, each writing a random subset of
//! its keys (1..=4 keys, usually on several shards) with the transaction's
//! number. After the crash, each writer's keys must equal the state after
//! some prefix of its transactions that includes every acknowledged one:
//! a half-applied transaction matches no prefix.
//!
//! Both tiers. Seeds: 60 by default, `RINGKV_TXN_CRASH_SEEDS=N` for more,
//! `RINGKV_TXN_CRASH_SEED=S` for one.

mod common;

use bytes::Bytes;
use common::*;
use ringkv_engine::io::sim::{SimDisk, SimFaults};
use ringkv_engine::rng::SplitMix64;
use ringkv_engine::{Engine, Handle, TxnError, TxnSettings};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tunables::Durability;

const WRITERS: u64 = 3;
const KEYS_PER_WRITER: u64 = 8;
const CYCLES: u32 = 3;

/// One planned transaction: the keys it writes (`None` deletes).
type Plan = Vec<(u64, Option<u64>)>;

fn plan_txn(rng: &mut SplitMix64, writer: u64, number: u64) -> Plan {
    let n = 1 + rng.below(4);
    let mut keys = BTreeMap::new();
    for _ in 0..n {
        let k = writer * KEYS_PER_WRITER + rng.below(KEYS_PER_WRITER);
        let v = if rng.below(8) == 0 {
            None
        } else {
            Some(number)
        };
        keys.insert(k, v);
    }
    keys.into_iter().collect()
}

/// How a planned transaction ended.
#[derive(Debug, PartialEq)]
enum Outcome {
    Committed,
    /// One shard's writes did not fit one WAL record: refused at COMMIT,
    /// nothing applied (docs/transactions.md, "Limits").
    TooLarge,
    Failed(String),
}

fn run_txn(h: &Handle, plan: &Plan) -> Outcome {
    let mut txn = h.begin(TxnSettings::default());
    pollster::block_on(async {
        for (k, v) in plan {
            let r = match v {
                Some(version) => txn.put(key(*k), value(*k, *version)).await,
                None => txn.delete(key(*k)).await.map(|_| ()),
            };
            if let Err(e) = r {
                txn.rollback().await;
                return Outcome::Failed(format!("{e:?}"));
            }
        }
        match txn.commit().await {
            Ok(()) => Outcome::Committed,
            Err(TxnError::TooLarge { .. }) => Outcome::TooLarge,
            Err(e) => Outcome::Failed(format!("{e:?}")),
        }
    })
}

fn read_state(h: &Handle, keys: &[u64]) -> Result<BTreeMap<u64, Option<u64>>, String> {
    let mut out = BTreeMap::new();
    for &k in keys {
        let got = pollster::block_on(h.get(key(k))).map_err(|e| format!("read {k}: {e}"))?;
        let state = match got {
            None => None,
            Some(v) => match parse_value(&v) {
                Some((i, version)) if i == k => Some(version),
                _ => return Err(format!("key {k} holds a value never written: {v:?}")),
            },
        };
        out.insert(k, state);
    }
    Ok(out)
}

fn apply(state: &mut BTreeMap<u64, Option<u64>>, plan: &Plan) {
    for (k, v) in plan {
        state.insert(*k, *v);
    }
}

#[derive(Default)]
struct Coverage {
    dropped: u64,
    applied: u64,
}

fn run_seed(seed: u64, hybrid: bool) -> Result<Coverage, String> {
    let mut cov = Coverage::default();
    let mut rng = SplitMix64::new(seed);
    let disk = SimDisk::new(seed);
    let shards = 2 + (seed % 2) as u32;
    let mut config = small_config(Path::new("/txn-crash"), shards, Durability::Sync);
    if hybrid {
        use_small_hybrid_tier(&mut config);
    }
    let all_keys: Vec<u64> = (0..WRITERS * KEYS_PER_WRITER).collect();
    let mut model: BTreeMap<u64, Option<u64>> = all_keys.iter().map(|&k| (k, None)).collect();
    let mut number = 0u64;
    for cycle in 0..CYCLES {
        disk.set_faults(SimFaults::default());
        let engine = Engine::open_with_disk(&config, disk.clone())
            .map_err(|e| format!("cycle {cycle}: open failed: {e}"))?;
        let h = engine.handle();
        let stats = h.txn_stats();
        cov.dropped += stats.recovered_parts_dropped.load(Ordering::Relaxed);
        cov.applied += stats.recovered_parts_applied.load(Ordering::Relaxed);
        let got = read_state(&h, &all_keys)?;
        if got != model {
            return Err(format!(
                "cycle {cycle}: after open the state is {got:?}, expected {model:?}"
            ));
        }
        // Sequential, acknowledged transactions.
        for _ in 0..5 + rng.below(20) {
            number += 1;
            let writer = rng.below(WRITERS);
            let plan = plan_txn(&mut rng, writer, number);
            match run_txn(&h, &plan) {
                Outcome::Committed => apply(&mut model, &plan),
                // Refused whole: the reads below check nothing of it landed.
                Outcome::TooLarge => {}
                Outcome::Failed(e) => {
                    return Err(format!("cycle {cycle}: transaction {number} failed: {e}"))
                }
            }
        }
        let got = read_state(&h, &all_keys)?;
        if got != model {
            return Err(format!(
                "cycle {cycle}: reads {got:?} differ from {model:?}"
            ));
        }
        // Concurrent writers cut by a crash; slow I/O so parts are in flight.
        disk.set_faults(SimFaults {
            latency: Some(Duration::from_micros(200 + rng.below(800))),
            ..SimFaults::default()
        });
        let plans: Vec<Vec<Plan>> = (0..WRITERS)
            .map(|w| {
                (0..20)
                    .map(|_| {
                        number += 1;
                        plan_txn(&mut rng, w, number)
                    })
                    .collect()
            })
            .collect();
        let stop = Arc::new(AtomicBool::new(false));
        let threads: Vec<_> = plans
            .iter()
            .cloned()
            .map(|plans| {
                let h = h.clone();
                let stop = stop.clone();
                let acked = Arc::new(AtomicUsize::new(0));
                let started = Arc::new(AtomicUsize::new(0));
                let (a, s) = (acked.clone(), started.clone());
                let t = std::thread::spawn(move || {
                    for plan in &plans {
                        if stop.load(Ordering::Relaxed) {
                            break;
                        }
                        s.fetch_add(1, Ordering::SeqCst);
                        // A refusal or a failure (the crash) ends this
                        // writer: its acknowledged prefix is what counts.
                        if run_txn(&h, plan) != Outcome::Committed {
                            break;
                        }
                        a.fetch_add(1, Ordering::SeqCst);
                    }
                });
                (t, acked, started)
            })
            .collect();
        std::thread::sleep(Duration::from_micros(500 + rng.below(6000)));
        stop.store(true, Ordering::Relaxed);
        engine.halt();
        let mut outcome = Vec::new();
        for (t, acked, started) in threads {
            t.join().map_err(|_| "writer thread panicked".to_string())?;
            outcome.push((acked.load(Ordering::SeqCst), started.load(Ordering::SeqCst)));
        }
        disk.crash();
        disk.set_faults(SimFaults::default());
        let engine = Engine::open_with_disk(&config, disk.clone())
            .map_err(|e| format!("cycle {cycle}: reopen after crash failed: {e}"))?;
        let h = engine.handle();
        cov.dropped += h
            .txn_stats()
            .recovered_parts_dropped
            .load(Ordering::Relaxed);
        cov.applied += h
            .txn_stats()
            .recovered_parts_applied
            .load(Ordering::Relaxed);
        for (w, (acked, started)) in outcome.iter().enumerate() {
            let keys: Vec<u64> =
                (w as u64 * KEYS_PER_WRITER..(w as u64 + 1) * KEYS_PER_WRITER).collect();
            let got = read_state(&h, &keys)?;
            let mut state: BTreeMap<u64, Option<u64>> =
                keys.iter().map(|k| (*k, model[k])).collect();
            for plan in &plans[w][..*acked] {
                apply(&mut state, plan);
            }
            let mut matched = got == state;
            for plan in &plans[w][*acked..*started] {
                apply(&mut state, plan);
                matched |= got == state;
            }
            if !matched {
                return Err(format!(
                    "cycle {cycle}: writer {w} (acked {acked}, started {started}): state {got:?} is no prefix of its transactions (a transaction half applied or an acknowledged one lost); before: {:?}; transactions: {:?}",
                    keys.iter().map(|k| (k, model[k])).collect::<Vec<_>>(),
                    &plans[w][..*started]
                ));
            }
            for (k, v) in got {
                model.insert(k, v);
            }
        }
        engine.halt();
        disk.crash();
    }
    Ok(cov)
}

#[test]
fn multi_shard_transactions_are_all_or_nothing_across_crashes() {
    run_seeds(false);
}

/// The same on the hybrid tier (issue 28: transactions where the tier's
/// values live on a device).
#[test]
fn multi_shard_transactions_are_all_or_nothing_across_crashes_hybrid_tier() {
    run_seeds(true);
}

fn run_seeds(hybrid: bool) {
    init_log();
    let seeds: Vec<u64> = match std::env::var("RINGKV_TXN_CRASH_SEED") {
        Ok(s) => vec![s.parse().expect("RINGKV_TXN_CRASH_SEED must be a number")],
        Err(_) => {
            let n: u64 = std::env::var("RINGKV_TXN_CRASH_SEEDS")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(60);
            (1..=n).collect()
        }
    };
    let mut total = Coverage::default();
    for &seed in &seeds {
        match run_seed(seed, hybrid) {
            Ok(c) => {
                total.dropped += c.dropped;
                total.applied += c.applied;
            }
            Err(msg) => panic!(
                "seed {seed} (hybrid tier: {hybrid}): {msg}\nreplay: RINGKV_TXN_CRASH_SEED={seed} cargo nextest run -p ringkv-engine --test txn_crash_sim"
            ),
        }
    }
    eprintln!(
        "txn_crash_sim (hybrid tier: {hybrid}): {} seeds, recovery applied {} and dropped {} multi-shard parts",
        seeds.len(),
        total.applied,
        total.dropped
    );
    if seeds.len() >= 20 {
        assert!(total.applied > 0, "no multi-shard part was ever recovered");
        assert!(
            total.dropped > 0,
            "no crash fell between the parts' fsyncs in {} seeds",
            seeds.len()
        );
    }
}

#[test]
fn plain_writes_on_a_locked_key_are_refused_and_lose_nothing() {
    let disk = SimDisk::new(7);
    let config = small_config(Path::new("/locked"), 2, Durability::Sync);
    let engine = Engine::open_with_disk(&config, disk).unwrap();
    let h = engine.handle();
    let mut txn = h.begin(TxnSettings::default());
    pollster::block_on(txn.put(key(1), Bytes::from_static(b"txn"))).unwrap();
    let r = h.batch_blocking(vec![put(1, 5)]).unwrap();
    assert!(
        matches!(
            r[0],
            ringkv_engine::OpResult::Err(ringkv_engine::OpError::Locked { .. })
        ),
        "{r:?}"
    );
    pollster::block_on(txn.commit()).unwrap();
    assert_eq!(
        pollster::block_on(h.get(key(1))).unwrap().as_deref(),
        Some(&b"txn"[..])
    );
    h.batch_blocking(vec![put(1, 5)]).unwrap();
    assert_eq!(
        pollster::block_on(h.get(key(1))).unwrap(),
        Some(value(1, 5))
    );
}
