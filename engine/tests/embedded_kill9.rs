//! kill -9 of a program that embeds the engine: `ringkv-embedded-writer`
//! opens a [`Db`] with `sync` durability and writes on its own thread
//! (puts of fresh keys, overwrites, deletes, batches of several ops),
//! saying on stdout which calls returned `Ok`. It is killed with SIGKILL a
//! random 100-600 ms after its first acknowledgement, then the directory
//! is audited twice: by a fresh process (the writer's `--dump`, which
//! stops without closing), then by a `Db` opened in this process. The
//! next round's writer restarts on the same directory, so every round
//! after the first recovers a directory that was itself recovered (and,
//! on odd rounds, closed cleanly by the audit).
//!
//! What the audit catches (each a failure):
//! - an acknowledged put missing, or holding an older value: a write
//!   answered before it was durable, or lost by recovery;
//! - an acknowledged delete undone (the key is back);
//! - a value not byte for byte the one its put wrote (a torn or mixed
//!   record, a value read from the wrong place in a segment);
//! - a key no put wrote, or one the scan lists but a get does not find;
//! - the two audits disagreeing (two recoveries of one directory that do
//!   not agree on what is in it);
//! - the writer failing to reopen, or stopping on its own (its own checks
//!   of delete answers and reads failed).
//!
//! Only the last announced call may have been in flight at the kill (the
//! writer makes one call at a time): each key it touches may hold its
//! state before the call, or after any of the call's ops on that key (a
//! batch is not promised to be atomic), and nothing else.
//!
//! Rounds per tier: `RINGKV_EMBEDDED_KILL9_ROUNDS` (default 10); the seed
//! is printed, `RINGKV_EMBEDDED_KILL9_SEED` replays its choices (not the
//! kill's timing relative to the writer).

use ringkv_engine::rng::SplitMix64;
use ringkv_engine::Db;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

#[path = "common/kill9_shape.rs"]
#[allow(dead_code)]
mod kill9_shape;

const WRITER: &str = env!("CARGO_BIN_EXE_ringkv-embedded-writer");

/// The value `put <key> <seq>` writes, computed here from the writer's
/// documented format (not from its code): `<key>=<seq>;`, then letters
/// (`'a' + (seq + position) % 26`) up to `16 + seq * 7919 % 3000` bytes.
fn expected_value(key: &str, seq: u64) -> String {
    let len = 16 + (seq * 7919 % 3000) as usize;
    let mut v = format!("{key}={seq};");
    for i in v.len()..len {
        v.push(char::from(b'a' + ((seq + i as u64) % 26) as u8));
    }
    v
}

/// A key's state: `Some(seq)` holds put `seq`'s value, `None` is absent.
type State = Option<u64>;

enum WriteOp {
    Put(String, u64),
    Del(String),
}

fn parse_ops(text: &str) -> Vec<WriteOp> {
    let mut words = text.split_whitespace();
    let mut ops = Vec::new();
    while let Some(word) = words.next() {
        let key = words.next().expect("a key after the op").to_string();
        ops.push(match word {
            "put" => {
                let seq = words.next().and_then(|s| s.parse().ok()).expect("seq");
                WriteOp::Put(key, seq)
            }
            "del" => WriteOp::Del(key),
            other => panic!("unknown op {other:?} in {text:?}"),
        });
    }
    assert!(!ops.is_empty(), "a call without ops: {text:?}");
    ops
}

fn apply(model: &mut BTreeMap<String, State>, op: &WriteOp) {
    match op {
        WriteOp::Put(k, seq) => model.insert(k.clone(), Some(*seq)),
        WriteOp::Del(k) => model.insert(k.clone(), None),
    };
}

/// What the writer's stdout says: the acknowledged calls applied to
/// `model`, and for each key the last call (in flight at the kill) touched,
/// the states it may hold. Returns the number of acknowledged calls.
fn replay(
    lines: &[String],
    model: &mut BTreeMap<String, State>,
) -> (usize, BTreeMap<String, Vec<State>>) {
    let mut pending: Option<(u64, &str)> = None;
    let mut last = 0;
    let mut acked = 0;
    for line in lines {
        let (tag, rest) = line.split_once(' ').expect("a tagged line");
        let (n, ops) = rest.split_once(' ').expect("a call number and ops");
        let n: u64 = n.parse().expect("call number");
        match tag {
            "W" => {
                assert!(
                    pending.is_none(),
                    "call {n} announced before {last} was acknowledged"
                );
                assert_eq!(n, last + 1, "calls out of order");
                pending = Some((n, ops));
                last = n;
            }
            "A" => {
                assert_eq!(
                    pending,
                    Some((n, ops)),
                    "acknowledgement {line:?} of no announced call"
                );
                for op in parse_ops(ops) {
                    apply(model, &op);
                }
                pending = None;
                acked += 1;
            }
            _ => panic!("unexpected writer line {line:?}"),
        }
    }
    let mut in_flight: BTreeMap<String, Vec<State>> = BTreeMap::new();
    if let Some((_, ops)) = pending {
        let mut after = model.clone();
        for op in parse_ops(ops) {
            let key = match &op {
                WriteOp::Put(k, _) | WriteOp::Del(k) => k.clone(),
            };
            let states = in_flight
                .entry(key.clone())
                .or_insert_with(|| vec![model.get(&key).copied().flatten()]);
            apply(&mut after, &op);
            states.push(after[&key]);
        }
    }
    (acked, in_flight)
}

/// The writer, killed if the test panics before it does.
struct Victim(std::process::Child);

impl Drop for Victim {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs the writer until it has acknowledged something, then `delay_ms`
/// more, kills it, and returns its complete stdout lines and the GC passes
/// it last reported.
fn run_writer(
    dir: &Path,
    tier: &str,
    seed: u64,
    round: u64,
    delay_ms: u64,
    ctx: &str,
) -> (Vec<String>, u64) {
    let err_path = dir.with_extension(format!("writer-{round}.err"));
    let child = Command::new(WRITER)
        .arg("--dir")
        .arg(dir)
        .args(["--tier", tier])
        .args(["--seed", &seed.to_string()])
        .args(["--round", &round.to_string()])
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&err_path).expect("stderr file"))
        .spawn()
        .expect("start ringkv-embedded-writer");
    let mut child = Victim(child);
    let stdout = child.0.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        let mut r = BufReader::new(stdout);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match r.read_until(b'\n', &mut buf) {
                // A last line cut by the kill has no newline: dropped.
                Ok(_) if buf.last() == Some(&b'\n') => {
                    let line = String::from_utf8(buf[..buf.len() - 1].to_vec()).expect("utf-8");
                    if tx.send(line).is_err() {
                        return;
                    }
                }
                _ => return,
            }
        }
    });
    let writer_err = || std::fs::read_to_string(&err_path).unwrap_or_default();
    let mut lines = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !lines.iter().any(|l: &String| l.starts_with("A ")) {
        match rx.recv_timeout(Duration::from_millis(50)) {
            Ok(l) => lines.push(l),
            Err(_) => {
                if let Ok(Some(status)) = child.0.try_wait() {
                    panic!(
                        "{ctx}: the writer stopped before acknowledging ({status}): {}",
                        writer_err()
                    );
                }
                assert!(
                    Instant::now() < deadline,
                    "{ctx}: the writer acknowledged nothing in 30 s"
                );
            }
        }
    }
    std::thread::sleep(Duration::from_millis(delay_ms));
    if let Ok(Some(status)) = child.0.try_wait() {
        panic!(
            "{ctx}: the writer stopped on its own ({status}): {}",
            writer_err()
        );
    }
    child.0.kill().expect("SIGKILL"); // std's kill is SIGKILL on Unix
    let _ = child.0.wait();
    reader.join().expect("reader");
    lines.extend(rx.try_iter());
    // Its stderr holds only `gc` lines, unless one of its own checks failed.
    let err = writer_err();
    if let Some(l) = err.lines().find(|l| !l.starts_with("gc ")) {
        panic!("{ctx}: the writer complained: {l}");
    }
    let gc = err
        .lines()
        .filter_map(|l| l.strip_prefix("gc ")?.parse().ok())
        .next_back()
        .unwrap_or(0);
    (lines, gc)
}

/// Every key and value as a fresh process recovers them.
fn dump(dir: &Path, tier: &str, ctx: &str) -> BTreeMap<String, String> {
    let out = Command::new(WRITER)
        .arg("--dir")
        .arg(dir)
        .args(["--tier", tier, "--dump"])
        .output()
        .expect("run the dump");
    assert!(
        out.status.success(),
        "{ctx}: the dump failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("utf-8 dump");
    let mut keys = BTreeMap::new();
    let mut end = None;
    for line in text.lines() {
        if let Some(n) = line.strip_prefix("END ") {
            end = Some(n.parse::<usize>().expect("END count"));
            continue;
        }
        let mut w = line.strip_prefix("K ").expect("a K line").splitn(2, ' ');
        let (key, value) = (w.next().expect("key"), w.next().expect("value"));
        assert_ne!(
            value, "-",
            "{ctx}: the scan lists {key} but a get does not find it"
        );
        assert!(
            keys.insert(key.to_string(), value.to_string()).is_none(),
            "{ctx}: the scan lists {key} twice"
        );
    }
    assert_eq!(end, Some(keys.len()), "{ctx}: the dump was cut short");
    keys
}

/// Totals over a tier's rounds, for the report and the coverage checks.
#[derive(Default)]
struct Totals {
    acked: usize,
    in_flight_new: usize,
    in_flight_old: usize,
    replayed: u64,
    snapshot_entries: u64,
    cold_reads: u64,
    gc_runs: u64,
}

fn round(
    dir: &Path,
    tier: &str,
    seed: u64,
    r: u64,
    model: &mut BTreeMap<String, State>,
    t: &mut Totals,
) {
    let mut rng = SplitMix64::new(seed ^ r.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let writer_seed = rng.next_u64();
    let delay = 100 + rng.below(501);
    let ctx = format!("{tier} round {r} (seed {seed}, killed {delay} ms after the first ack)");
    let (lines, gc) = run_writer(dir, tier, writer_seed, r, delay, &ctx);
    t.gc_runs += gc;
    let (acked, in_flight) = replay(&lines, model);
    assert!(acked > 0, "{ctx}: nothing acknowledged");

    // The fresh process's view, checked against the acknowledged calls.
    let found = dump(dir, tier, &ctx);
    let keys: BTreeSet<&String> = model
        .keys()
        .chain(found.keys())
        .chain(in_flight.keys())
        .collect();
    let mut observed = BTreeMap::new();
    for key in keys {
        let allowed = in_flight
            .get(key)
            .cloned()
            .unwrap_or_else(|| vec![model.get(key).copied().flatten()]);
        let state = match found.get(key) {
            Some(v) => {
                let seq = allowed
                    .iter()
                    .flatten()
                    .find(|&&s| expected_value(key, s) == *v)
                    .copied();
                let shown = &v[..v.len().min(40)];
                assert!(
                    seq.is_some(),
                    "{ctx}: {key} holds {shown:?} ({} bytes); allowed states {allowed:?} (None: absent)",
                    v.len()
                );
                seq
            }
            None => {
                assert!(
                    allowed.contains(&None),
                    "{ctx}: {key} is missing; allowed states {allowed:?} (seq of an acknowledged put)"
                );
                None
            }
        };
        if let Some(states) = in_flight.get(key) {
            if state == states[0] {
                t.in_flight_old += 1;
            } else {
                t.in_flight_new += 1;
            }
        }
        observed.insert(key.clone(), state);
    }
    *model = observed;

    // This process's view must be the same, key by key.
    let shape = if tier == "hybrid" {
        kill9_shape::Shape::Hybrid
    } else {
        kill9_shape::Shape::Memory
    };
    let db = Db::open_with(kill9_shape::config(dir.to_path_buf(), 1, shape))
        .unwrap_or_else(|e| panic!("{ctx}: reopen in the test: {e}"));
    for (key, state) in model.iter() {
        let got = db
            .get(key)
            .unwrap_or_else(|e| panic!("{ctx}: get {key}: {e}"));
        let want = state.map(|s| expected_value(key, s));
        assert_eq!(
            got.as_deref(),
            want.as_deref().map(str::as_bytes),
            "{ctx}: the test's reopen disagrees with the dump on {key}"
        );
    }
    let mut listed = BTreeSet::new();
    let mut cursor = 0;
    loop {
        let (next, some) = db.scan(cursor, 256).expect("scan");
        listed.extend(some.iter().map(|k| String::from_utf8_lossy(k).into_owned()));
        if next == 0 {
            break;
        }
        cursor = next;
    }
    let present: BTreeSet<String> = model
        .iter()
        .filter(|(_, s)| s.is_some())
        .map(|(k, _)| k.clone())
        .collect();
    assert_eq!(
        listed, present,
        "{ctx}: the test's scan disagrees with the dump"
    );
    let m = db.metrics();
    for s in &m.shards {
        t.replayed += s.recovery_records_replayed;
        t.snapshot_entries += s.recovery_snapshot_entries;
        t.cold_reads += s.hybrid.map_or(0, |h| h.device_reads);
    }
    t.acked += acked;
    eprintln!(
        "{ctx}: {acked} calls acknowledged, {} keys present, {} tracked",
        present.len(),
        model.len()
    );
    // Odd rounds close cleanly; even ones stop as a crash would.
    if r % 2 == 1 {
        db.close().unwrap_or_else(|e| panic!("{ctx}: close: {e}"));
    } else {
        db.halt();
    }
}

fn rounds(tier: &str) -> Totals {
    let n: u64 = std::env::var("RINGKV_EMBEDDED_KILL9_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let seed = std::env::var("RINGKV_EMBEDDED_KILL9_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        });
    eprintln!("embedded_kill9 {tier}: seed {seed} (RINGKV_EMBEDDED_KILL9_SEED), {n} rounds");
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("data");
    let mut model = BTreeMap::new();
    let mut totals = Totals::default();
    for r in 0..n {
        round(&dir, tier, seed, r, &mut model, &mut totals);
    }
    eprintln!(
        "embedded_kill9 {tier}: seed {seed}: {} calls acknowledged; in-flight keys found old {} / new {}; {} WAL records replayed, {} snapshot entries loaded, {} cold reads; {} GC passes in the writers",
        totals.acked, totals.in_flight_old, totals.in_flight_new, totals.replayed, totals.snapshot_entries, totals.cold_reads, totals.gc_runs
    );
    assert!(totals.replayed > 0, "recovery never replayed a WAL record");
    totals
}

#[test]
fn acknowledged_writes_survive_kill_9_embedded() {
    rounds("memory");
}

#[test]
fn acknowledged_writes_survive_kill_9_embedded_on_the_hybrid_tier() {
    let t = rounds("hybrid");
    assert!(t.cold_reads > 0, "no read went to the value segments");
    assert!(
        t.gc_runs > 0,
        "GC never ran in the writer: no kill landed with GC at work"
    );
}
