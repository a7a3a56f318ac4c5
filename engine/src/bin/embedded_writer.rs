//! `ringkv-embedded-writer`: the victim of `engine/tests/embedded_kill9.rs`.
//! A small program that links the engine through the embedded API
//! ([`ringkv_engine::Db`], `sync` durability) and writes on its one thread
//! until it is killed.
//!
//! Each call is announced on stdout before it is made and reported again
//! once it returned `Ok` (one line each, flushed at once):
//!
//! ```text
//! W <call> <ops>      the call is about to be made
//! A <call> <ops>      the call returned Ok: its ops are acknowledged
//! ```
//!
//! `<ops>` is one op for `Db::put` / `Db::delete` and several for
//! `Db::batch`, each `put <key> <seq>` or `del <key>`. Put `seq` writes
//! `<key>=<seq>;` followed by letters, 16 to 3015 bytes in all (see
//! [`value`]); the test recomputes it on its own. Keys are `k<round>.<n>`;
//! `seq` is unique over rounds (`round * 10^9 + n`). Puts go to fresh keys,
//! over live keys, deletes remove live keys (or, now and then, a key never
//! written); a key live from an earlier round is found by a scan at start.
//! Every 200 calls it prints `gc <passes>` on stderr (0 on the memory tier).
//!
//! The writer checks what it can see itself: each delete's answer (the
//! key was there or not) and, now and then, a read of a key it wrote in
//! this run. A mismatch ends it with status 3 before it is killed.
//!
//! `--dump` instead opens the directory, prints `K <key> <value>` for every
//! key (scan, then a get of each; bytes outside printable ASCII escaped),
//! then `END <count>`, and stops without closing (`Db::halt`, as a crash
//! would), so the next opener recovers again.
//!
//! Usage: `ringkv-embedded-writer --dir PATH [--tier memory|hybrid] [--seed N] [--round N] [--dump]`

#![cfg_attr(not(test), deny(clippy::unwrap_used))]

use bytes::Bytes;
use ringkv_engine::rng::SplitMix64;
use ringkv_engine::{Db, Op, OpResult};
use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;

// The engine config the kill -9 writers and their tests share.
#[path = "../../tests/common/kill9_shape.rs"]
#[allow(dead_code)]
mod kill9_shape;

/// The value put `seq` writes to `key`.
fn value(key: &str, seq: u64) -> Vec<u8> {
    let len = 16 + (seq.wrapping_mul(7919) % 3000) as usize;
    let mut v = format!("{key}={seq};").into_bytes();
    while v.len() < len {
        v.push(b'a' + ((seq + v.len() as u64) % 26) as u8);
    }
    v
}

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn fail(code: i32, msg: &str) -> ! {
    eprintln!("ringkv-embedded-writer: {msg}");
    std::process::exit(code);
}

/// One op of a call, with what the writer expects it to answer.
enum Planned {
    Put {
        key: String,
        seq: u64,
    },
    /// `was_there`: the key is live as far as the writer knows.
    Del {
        key: String,
        was_there: bool,
    },
}

impl Planned {
    fn describe(&self, line: &mut String) {
        use std::fmt::Write as _;
        let _ = match self {
            Planned::Put { key, seq } => write!(line, " put {key} {seq}"),
            Planned::Del { key, .. } => write!(line, " del {key}"),
        };
    }
}

struct Writer {
    db: Db,
    rng: SplitMix64,
    round: u64,
    next_key: u64,
    next_seq: u64,
    /// Keys the writer believes present.
    live: Vec<String>,
    /// The seq of each key this run put last (`None`: deleted since).
    written: HashMap<String, Option<u64>>,
    out: std::io::StdoutLock<'static>,
}

impl Writer {
    fn fresh_key(&mut self) -> String {
        self.next_key += 1;
        format!("k{}.{}", self.round, self.next_key)
    }

    fn plan_put(&mut self, key: String) -> Planned {
        self.next_seq += 1;
        let seq = self.round * 1_000_000_000 + self.next_seq;
        if !self.live.contains(&key) {
            self.live.push(key.clone());
        }
        Planned::Put { key, seq }
    }

    fn plan_del(&mut self, key: String) -> Planned {
        let was_there = match self.live.iter().position(|k| *k == key) {
            Some(i) => {
                self.live.swap_remove(i);
                true
            }
            None => false,
        };
        Planned::Del { key, was_there }
    }

    /// One op; `prev` is the key of the op before it in the same batch.
    fn plan(&mut self, prev: Option<&Planned>) -> Planned {
        if let (Some(p), 0) = (prev, self.rng.below(4)) {
            // Touch the same key again within the batch.
            return match p {
                Planned::Put { key, .. } => self.plan_del(key.clone()),
                Planned::Del { key, .. } => self.plan_put(key.clone()),
            };
        }
        let r = self.rng.below(100);
        if r < 45 || self.live.is_empty() {
            let key = self.fresh_key();
            self.plan_put(key)
        } else if r < 75 {
            let key = self.live[self.rng.below(self.live.len() as u64) as usize].clone();
            self.plan_put(key)
        } else if r < 95 {
            let key = self.live[self.rng.below(self.live.len() as u64) as usize].clone();
            self.plan_del(key)
        } else {
            let key = self.fresh_key();
            self.plan_del(key)
        }
    }

    fn say(&mut self, line: &str) {
        // One write of the whole line, then flush: the test reads a line
        // only once it is complete.
        let _ = self.out.write_all(line.as_bytes());
        let _ = self.out.flush();
    }

    fn call(&mut self, n: u64) {
        if n.is_multiple_of(200) {
            self.report_gc();
        }
        let count = if self.rng.below(5) == 0 {
            2 + self.rng.below(7)
        } else {
            1
        };
        let mut ops: Vec<Planned> = Vec::new();
        for _ in 0..count {
            let op = self.plan(ops.last());
            ops.push(op);
        }
        let mut desc = String::new();
        for op in &ops {
            op.describe(&mut desc);
        }
        self.say(&format!("W {n}{desc}\n"));
        if let [op] = &ops[..] {
            match op {
                Planned::Put { key, seq } => {
                    if let Err(e) = self.db.put(key, value(key, *seq)) {
                        fail(1, &format!("call {n}: put {key}: {e}"));
                    }
                }
                Planned::Del { key, was_there } => match self.db.delete(key) {
                    Ok(there) if there == *was_there => {}
                    Ok(there) => fail(
                        3,
                        &format!("call {n}: delete {key} answered {there}, expected {was_there}"),
                    ),
                    Err(e) => fail(1, &format!("call {n}: delete {key}: {e}")),
                },
            }
        } else {
            let batch = ops
                .iter()
                .map(|op| match op {
                    Planned::Put { key, seq } => Op::Put {
                        key: Bytes::from(key.clone()),
                        value: Bytes::from(value(key, *seq)),
                    },
                    Planned::Del { key, .. } => Op::Delete {
                        key: Bytes::from(key.clone()),
                    },
                })
                .collect();
            let answers = match self.db.batch(batch) {
                Ok(a) => a,
                Err(e) => fail(1, &format!("call {n}: batch: {e}")),
            };
            for (op, answer) in ops.iter().zip(&answers) {
                let want = match op {
                    Planned::Put { .. }
                    | Planned::Del {
                        was_there: true, ..
                    } => OpResult::Ok,
                    Planned::Del { .. } => OpResult::NotFound,
                };
                if *answer != want {
                    fail(
                        3,
                        &format!("call {n}: batch answered {answer:?} where {want:?} was due"),
                    );
                }
            }
        }
        self.say(&format!("A {n}{desc}\n"));
        for op in ops {
            match op {
                Planned::Put { key, seq } => self.written.insert(key, Some(seq)),
                Planned::Del { key, .. } => self.written.insert(key, None),
            };
        }
    }

    /// On the hybrid tier, `gc <passes>` on stderr (the test reads the
    /// last one).
    fn report_gc(&self) {
        let passes: u64 = self
            .db
            .metrics()
            .shards
            .iter()
            .filter_map(|s| s.hybrid)
            .map(|h| h.gc_runs)
            .sum();
        eprintln!("gc {passes}");
    }

    /// Reads back a key this run wrote (on the hybrid tier, mostly from
    /// the value segments: the cache is small).
    fn check_one(&mut self) {
        if self.written.is_empty() {
            return;
        }
        let i = self.rng.below(self.written.len() as u64) as usize;
        let Some((key, seq)) = self.written.iter().nth(i).map(|(k, s)| (k.clone(), *s)) else {
            return;
        };
        let got = match self.db.get(&key) {
            Ok(v) => v,
            Err(e) => fail(1, &format!("get {key}: {e}")),
        };
        let want = seq.map(|s| value(&key, s));
        if got.as_deref() != want.as_deref() {
            fail(
                3,
                &format!(
                    "get {key} read {:?}, expected seq {seq:?}",
                    got.map(|v| v.len())
                ),
            );
        }
    }
}

/// Every key in the database.
fn all_keys(db: &Db) -> Vec<Bytes> {
    let mut keys = Vec::new();
    let mut cursor = 0;
    loop {
        let (next, mut some) = match db.scan(cursor, 256) {
            Ok(step) => step,
            Err(e) => fail(1, &format!("scan: {e}")),
        };
        keys.append(&mut some);
        if next == 0 {
            return keys;
        }
        cursor = next;
    }
}

fn dump(db: Db) {
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let keys = all_keys(&db);
    for key in &keys {
        match db.get(key) {
            Ok(Some(v)) => {
                let _ = writeln!(out, "K {} {}", key.escape_ascii(), v.escape_ascii());
            }
            // A key the scan listed but a get does not find.
            Ok(None) => {
                let _ = writeln!(out, "K {} -", key.escape_ascii());
            }
            Err(e) => fail(1, &format!("get {}: {e}", key.escape_ascii())),
        }
    }
    let _ = writeln!(out, "END {}", keys.len());
    let _ = out.flush();
    db.halt();
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(dir) = arg(&args, "--dir") else {
        fail(
            2,
            "usage: ringkv-embedded-writer --dir PATH [--tier memory|hybrid] [--seed N] [--round N] [--dump]",
        );
    };
    let number = |name: &str| -> u64 {
        arg(&args, name).map_or(0, |s| {
            s.parse()
                .unwrap_or_else(|_| fail(2, &format!("{name} must be a number")))
        })
    };
    let hybrid = match arg(&args, "--tier").as_deref() {
        None | Some("memory") => false,
        Some("hybrid") => true,
        Some(other) => fail(
            2,
            &format!("--tier must be memory or hybrid, not {other:?}"),
        ),
    };
    let shape = if hybrid {
        kill9_shape::Shape::Hybrid
    } else {
        kill9_shape::Shape::Memory
    };
    let config = kill9_shape::config(PathBuf::from(dir), 1, shape);
    let db = match Db::open_with(config) {
        Ok(db) => db,
        Err(e) => fail(1, &format!("open failed: {e}")),
    };
    if args.iter().any(|a| a == "--dump") {
        dump(db);
        return;
    }
    let live: Vec<String> = all_keys(&db)
        .iter()
        .map(|k| String::from_utf8_lossy(k).into_owned())
        .collect();
    let mut w = Writer {
        db,
        rng: SplitMix64::new(number("--seed")),
        round: number("--round"),
        next_key: 0,
        next_seq: 0,
        live,
        written: HashMap::new(),
        out: std::io::stdout().lock(),
    };
    for n in 1.. {
        w.call(n);
        if w.rng.below(10) == 0 {
            w.check_one();
        }
    }
}
