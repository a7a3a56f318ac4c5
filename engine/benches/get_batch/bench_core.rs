//! The core of the `get_batch` benchmark, shared by the bench binary and by
//! the tiny-size run in the test suite: fills a `MemoryTier`, then times
//! batches of random GETs through the per-key path (`Tier::get` in a loop,
//! what the shard did before batched reads) and the batched path
//! (`Tier::get_many`), interleaved so both see the same machine noise.
//! Every answer is checked against the key it was asked for.

use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use ringkv_engine::hash::TableHasher;
use ringkv_engine::tier::{MemoryTier, Tier};
use std::fmt;
use std::time::{Duration, Instant};

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// Keys in the tier.
    pub keys: u64,
    pub value_size: usize,
    /// GETs per batch.
    pub batch: usize,
    /// Batches per timed run.
    pub batches_per_run: usize,
    /// Runs of each path (interleaved); the report gives the median.
    pub runs: usize,
    /// Share of GETs (per mille) asking for a key that is not there.
    pub missing_per_mille: u32,
    pub seed: u64,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            keys: 1_000_000,
            value_size: 1000,
            batch: 1000,
            batches_per_run: 200,
            runs: 9,
            missing_per_mille: 0,
            seed: 7,
        }
    }
}

/// ns per GET of each timed run.
#[derive(Debug, Clone)]
pub struct Report {
    pub opts: Options,
    pub fill_seconds: f64,
    pub memory_bytes: u64,
    pub per_key_ns: Vec<f64>,
    pub batched_ns: Vec<f64>,
    /// GETs answered (both paths), each checked.
    pub gets_checked: u64,
    pub found: u64,
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s[s.len() / 2]
}

impl Report {
    pub fn per_key_median_ns(&self) -> f64 {
        median(&self.per_key_ns)
    }
    pub fn batched_median_ns(&self) -> f64 {
        median(&self.batched_ns)
    }
}

/// The keyed table hash a data directory made by this build runs with
/// (a fixed key, so runs compare).
fn hasher() -> TableHasher {
    TableHasher::keyed(*b"get_batch bench ")
}

fn key_of(i: u64) -> Vec<u8> {
    format!("key-{i:012}").into_bytes()
}

/// The value of key `i`: its index in the first 8 bytes (when they fit),
/// then a byte pattern.
fn value_of(i: u64, size: usize) -> Vec<u8> {
    let mut v: Vec<u8> = (0..size).map(|j| (j as u64 ^ i) as u8).collect();
    let tag = i.to_le_bytes();
    let n = size.min(8);
    v[..n].copy_from_slice(&tag[..n]);
    v
}

fn check(answer: &Option<Bytes>, index: Option<u64>, size: usize) -> bool {
    match (answer, index) {
        (None, None) => false,
        (Some(v), Some(i)) => {
            assert_eq!(v.len(), size, "value length of key {i}");
            let n = size.min(8);
            assert_eq!(v[..n], i.to_le_bytes()[..n], "value of key {i}");
            if size > 8 {
                assert_eq!(
                    v[size - 1],
                    ((size - 1) as u64 ^ i) as u8,
                    "tail of key {i}"
                );
            }
            true
        }
        (a, i) => panic!("key {i:?}: got {:?}", a.as_ref().map(|v| v.len())),
    }
}

/// One batch: keys, their routing hashes (computed untimed in both paths
/// alike: the shard hashes once either way), and which key index each is
/// (None: a missing key).
struct Batch {
    keys: Vec<Bytes>,
    hashes: Vec<u64>,
    indexes: Vec<Option<u64>>,
}

fn make_batches(opts: &Options, rng: &mut StdRng) -> Vec<Batch> {
    (0..opts.batches_per_run)
        .map(|_| {
            let mut b = Batch {
                keys: Vec::with_capacity(opts.batch),
                hashes: Vec::with_capacity(opts.batch),
                indexes: Vec::with_capacity(opts.batch),
            };
            for _ in 0..opts.batch {
                let missing = rng.random_range(0..1000) < opts.missing_per_mille;
                let (key, index) = if missing {
                    (
                        key_of(opts.keys + rng.random_range(0..opts.keys.max(1))),
                        None,
                    )
                } else {
                    let i = rng.random_range(0..opts.keys);
                    (key_of(i), Some(i))
                };
                b.hashes.push(hasher().hash_key(&key));
                b.keys.push(Bytes::from(key));
                b.indexes.push(index);
            }
            b
        })
        .collect()
}

/// Times one run; returns (time spent producing and dropping answers,
/// answers found). Checking the answers is not timed.
fn time_run(tier: &MemoryTier, batches: &[Batch], batched: bool, size: usize) -> (Duration, u64) {
    let mut spent = Duration::ZERO;
    let mut found = 0;
    let mut out = Vec::new();
    for b in batches {
        let start = Instant::now();
        if batched {
            tier.get_many(&b.hashes, &b.keys, &mut out);
        } else {
            out.extend(b.hashes.iter().zip(&b.keys).map(|(&h, k)| tier.get(h, k)));
        }
        spent += start.elapsed();
        assert_eq!(out.len(), b.keys.len());
        for (answer, &index) in out.iter().zip(&b.indexes) {
            found += u64::from(check(answer, index, size));
        }
        let start = Instant::now();
        out.clear();
        spent += start.elapsed();
    }
    (spent, found)
}

pub fn run(opts: &Options) -> Report {
    assert!(opts.keys > 0 && opts.batch > 0 && opts.batches_per_run > 0 && opts.runs > 0);
    let mut tier = MemoryTier::with_hasher(hasher());
    let start = Instant::now();
    for i in 0..opts.keys {
        let key = key_of(i);
        assert!(tier.put(
            hasher().hash_key(&key),
            &key,
            &value_of(i, opts.value_size),
            0
        ));
    }
    let fill_seconds = start.elapsed().as_secs_f64();
    let mut rng = StdRng::seed_from_u64(opts.seed);
    let gets_per_run = (opts.batch * opts.batches_per_run) as f64;
    let mut report = Report {
        opts: opts.clone(),
        fill_seconds,
        memory_bytes: tier.memory_bytes(),
        per_key_ns: Vec::new(),
        batched_ns: Vec::new(),
        gets_checked: 0,
        found: 0,
    };
    for run in 0..opts.runs {
        // Fresh random keys per run, so no run finds the previous one's
        // entries in the cache; alternate which path goes first.
        let batches = make_batches(opts, &mut rng);
        let order = if run % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for batched in order {
            let (spent, found) = time_run(&tier, &batches, batched, opts.value_size);
            let ns = spent.as_nanos() as f64 / gets_per_run;
            if batched {
                report.batched_ns.push(ns);
            } else {
                report.per_key_ns.push(ns);
            }
            report.gets_checked += gets_per_run as u64;
            report.found += found;
        }
    }
    report
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown cpu".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("{cpu}, {cores} cores available")
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let o = &self.opts;
        writeln!(f, "machine: {}", machine())?;
        writeln!(
            f,
            "config: {} keys x {} B values, batches of {} GETs, {} batches per run, {} runs per path, {}‰ missing keys",
            o.keys, o.value_size, o.batch, o.batches_per_run, o.runs, o.missing_per_mille
        )?;
        writeln!(
            f,
            "fill: {:.2} s, tier memory {} MiB",
            self.fill_seconds,
            self.memory_bytes >> 20
        )?;
        let line = |f: &mut fmt::Formatter<'_>, name: &str, v: &[f64]| {
            let mut s = v.to_vec();
            s.sort_by(f64::total_cmp);
            writeln!(
                f,
                "{name}: median {:.1} ns/GET (min {:.1}, max {:.1}) = {:.2}M GETs/s per core",
                median(v),
                s[0],
                s[s.len() - 1],
                1e3 / median(v)
            )
        };
        line(f, "per-key  (Tier::get loop)", &self.per_key_ns)?;
        line(f, "batched  (Tier::get_many)", &self.batched_ns)?;
        writeln!(
            f,
            "speed-up: {:.2}x; {} GETs checked, {} found",
            self.per_key_median_ns() / self.batched_median_ns(),
            self.gets_checked,
            self.found
        )
    }
}
