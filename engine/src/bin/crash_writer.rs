//! `ringkv-crash-writer`: the victim of the kill -9 test (`engine/tests/kill9.rs`).
//! Opens the engine on real disks in `sync` mode and writes batches from
//! several threads forever, printing to stdout (flushed, one line at a
//! time, under one lock so the line order is the real order):
//! `W <batch> <key> <key> ...` before submitting a batch and `A <batch>`
//! once it is acknowledged. Batch `b` puts `value(key, b)` for each key.
//!
//! With `--tier hybrid` it runs the hybrid tier and reports its GC passes
//! and the records moved between devices on stderr (`gc <passes>
//! <moves>`, every 20 ms); `--tier hot-device` runs it with a small hot
//! device in front of the value device, and one more thread reading 64 of
//! the keys, so records move both ways.
//!
//! Usage: `ringkv-crash-writer --dir PATH [--shards N] [--threads N] [--seed N] [--tier memory|hybrid|hot-device]`

#![cfg_attr(not(test), deny(clippy::unwrap_used))]

use bytes::Bytes;
use ringkv_engine::rng::mix64;
use ringkv_engine::{Engine, Op, OpResult};
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

#[path = "../../tests/common/kill9_shape.rs"]
mod kill9_shape;
use kill9_shape::{config, value, Shape, KEY_SPACE};

const OPS_PER_BATCH: u64 = 20;

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(dir) = arg(&args, "--dir") else {
        eprintln!("usage: ringkv-crash-writer --dir PATH [--shards N] [--threads N] [--seed N] [--tier memory|hybrid|hot-device]");
        std::process::exit(2);
    };
    let number = |name: &str, default: u64| -> u64 {
        arg(&args, name).map_or(default, |s| {
            s.parse().unwrap_or_else(|_| {
                eprintln!("{name} must be a number");
                std::process::exit(2)
            })
        })
    };
    let shards = number("--shards", 2) as u32;
    let threads = number("--threads", 4);
    let seed = number("--seed", 1);
    let shape = match arg(&args, "--tier").as_deref() {
        None => Shape::Memory,
        Some(name) => Shape::parse(name).unwrap_or_else(|| {
            eprintln!("--tier must be memory, hybrid or hot-device, not {name:?}");
            std::process::exit(2);
        }),
    };
    let hybrid = shape != Shape::Memory;
    let engine = match Engine::open(&config(PathBuf::from(dir), shards, shape)) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("ringkv-crash-writer: open failed: {e}");
            std::process::exit(1);
        }
    };
    let out = Arc::new(Mutex::new(std::io::stdout()));
    let next_batch = Arc::new(AtomicU64::new(1));
    let workers: Vec<_> = (0..threads)
        .map(|_| {
            let h = engine.handle();
            let out = out.clone();
            let next_batch = next_batch.clone();
            std::thread::spawn(move || loop {
                let batch = next_batch.fetch_add(1, Ordering::Relaxed);
                let keys: Vec<u64> = (0..OPS_PER_BATCH)
                    .map(|i| mix64(seed ^ (batch << 8) ^ i) % KEY_SPACE)
                    .collect();
                let ops: Vec<Op> = keys
                    .iter()
                    .map(|&k| Op::Put {
                        key: Bytes::from(format!("k{k}")),
                        value: Bytes::from(value(k, batch)),
                    })
                    .collect();
                {
                    let mut o = out.lock().unwrap_or_else(|p| p.into_inner());
                    let list: Vec<String> = keys.iter().map(u64::to_string).collect();
                    let _ = writeln!(o, "W {batch} {}", list.join(" "));
                    let _ = o.flush();
                }
                match h.batch_blocking(ops) {
                    Ok(answers) if answers.iter().all(|a| *a == OpResult::Ok) => {
                        let mut o = out.lock().unwrap_or_else(|p| p.into_inner());
                        let _ = writeln!(o, "A {batch}");
                        let _ = o.flush();
                    }
                    other => {
                        eprintln!("ringkv-crash-writer: batch {batch} failed: {other:?}");
                        std::process::exit(1);
                    }
                }
            })
        })
        .collect();
    if shape == Shape::HotDevice {
        // Reads of random keys, so records demoted to the value device are
        // read there and copied back to the hot one.
        let h = engine.handle();
        std::thread::spawn(move || {
            for i in 0u64.. {
                let ops: Vec<Op> = (0..16)
                    .map(|j| Op::Get {
                        key: Bytes::from(format!("k{}", mix64(seed ^ i << 8 ^ j) % 64)),
                    })
                    .collect();
                if h.batch_blocking(ops).is_err() {
                    return;
                }
            }
        });
    }
    if hybrid {
        let h = engine.handle();
        std::thread::spawn(move || loop {
            let stats: Vec<_> = h.metrics().shards.iter().filter_map(|s| s.hybrid).collect();
            let runs: u64 = stats.iter().map(|x| x.gc_runs).sum();
            let moves: u64 = stats.iter().map(|x| x.promotions + x.demotions).sum();
            eprintln!("gc {runs} {moves}");
            std::thread::sleep(std::time::Duration::from_millis(20));
        });
    }
    for w in workers {
        let _ = w.join();
    }
}
