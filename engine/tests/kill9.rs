//! The real thing: `ringkv-crash-writer` (real disks, O_DIRECT, `sync`
//! mode, several writer threads) is killed with SIGKILL at a random moment;
//! the engine is then reopened in this process on the same directory, and
//! every batch the writer reported acknowledged must be there: each key
//! holds the value of its last acknowledged batch, or of a batch that may
//! have come after it in the log, and never a value no batch wrote.
//!
//! The same on the hybrid tier, where GC rewrites segments under the write
//! load (the test checks that it did in at least one round); and on the
//! hybrid tier with a small hot device, where records also move between
//! the two devices (GC moves the ones not read lately off the hot device,
//! reads copy them back; the test checks that some did).
//!
//! Rounds: `RINGKV_KILL9_ROUNDS` (default 3) per tier. CI runs 8.

use ringkv_engine::{Engine, Op, OpResult};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

#[path = "common/kill9_shape.rs"]
mod kill9_shape;
use kill9_shape::{config, value, Shape, KEY_SPACE};

/// One batch as the writer reported it.
struct Batch {
    keys: Vec<u64>,
    /// Position of its `W` line.
    submitted_at: usize,
    /// Position of its `A` line, if it was printed.
    acked_at: Option<usize>,
}

fn parse(lines: &[String]) -> BTreeMap<u64, Batch> {
    let mut batches = BTreeMap::new();
    for (pos, line) in lines.iter().enumerate() {
        let mut words = line.split_whitespace();
        match (
            words.next(),
            words.next().and_then(|b| b.parse::<u64>().ok()),
        ) {
            (Some("W"), Some(b)) => {
                let keys = words.map(|k| k.parse().expect("key number")).collect();
                batches.insert(
                    b,
                    Batch {
                        keys,
                        submitted_at: pos,
                        acked_at: None,
                    },
                );
            }
            (Some("A"), Some(b)) => {
                batches
                    .get_mut(&b)
                    .expect("acknowledged batch was announced")
                    .acked_at = Some(pos);
            }
            _ => panic!("unexpected writer line {line:?}"),
        }
    }
    batches
}

/// Returns the GC passes and the moves between devices the writer last
/// reported (hybrid tier).
fn round(round: u32, delay_ms: u64, shape: Shape) -> (u64, u64) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("data");
    let shards = 1 + round % 2;
    let mut child = Command::new(env!("CARGO_BIN_EXE_ringkv-crash-writer"))
        .args(["--dir", dir.to_str().expect("utf-8 path")])
        .args(["--shards", &shards.to_string()])
        .args(["--threads", "4"])
        .args(["--seed", &(round as u64 + 1).to_string()])
        .args(["--tier", shape.name()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start ringkv-crash-writer");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            match line {
                Ok(l) => {
                    if tx.send(l).is_err() {
                        break;
                    }
                }
                Err(_) => break,
            }
        }
    });
    // Wait for the first acknowledgement (bounded), then a random delay.
    let mut lines = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !lines.iter().any(|l: &String| l.starts_with("A ")) {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(l) => lines.push(l),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if let Ok(Some(status)) = child.try_wait() {
                    let mut err = String::new();
                    use std::io::Read;
                    let _ = child.stderr.take().map(|mut e| e.read_to_string(&mut err));
                    panic!("writer exited early ({status}): {err}");
                }
                assert!(
                    Instant::now() < deadline,
                    "writer acknowledged nothing in 60 s"
                );
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => panic!("writer closed stdout"),
        }
    }
    std::thread::sleep(Duration::from_millis(delay_ms));
    child.kill().expect("SIGKILL"); // std sends SIGKILL on Unix
    let _ = child.wait();
    let mut err = String::new();
    {
        use std::io::Read;
        let _ = child.stderr.take().map(|mut e| e.read_to_string(&mut err));
    }
    let (gc_runs, moves) = err
        .lines()
        .filter_map(|l| {
            let mut n = l
                .strip_prefix("gc ")?
                .split(' ')
                .map(|n| n.parse::<u64>().ok());
            Some((n.next()??, n.next()??))
        })
        .next_back()
        .unwrap_or((0, 0));
    reader.join().expect("reader");
    lines.extend(rx.try_iter());
    // A line cut by the kill never reaches us (lines() needs the newline).
    let batches = parse(&lines);
    let acked = batches.values().filter(|b| b.acked_at.is_some()).count();
    assert!(acked > 0);

    let engine = Engine::open(&config(dir.clone(), shards, shape)).expect("reopen after kill -9");
    let h = engine.handle();
    let ops: Vec<Op> = (0..KEY_SPACE)
        .map(|k| Op::Get {
            key: bytes::Bytes::from(format!("k{k}")),
        })
        .collect();
    let answers = h.batch_blocking(ops).expect("read back");
    let mut checked = 0;
    for (k, answer) in (0..KEY_SPACE).zip(answers) {
        let writers: Vec<(&u64, &Batch)> = batches
            .iter()
            .filter(|(_, b)| b.keys.contains(&k))
            .collect();
        // A batch that was acknowledged before another writer of the key was
        // submitted is certainly older in the log than that one.
        let acked_writers: Vec<&Batch> = writers
            .iter()
            .filter(|(_, b)| b.acked_at.is_some())
            .map(|(_, b)| *b)
            .collect();
        let allowed: Vec<u64> = writers
            .iter()
            .filter(|(_, b)| {
                !acked_writers
                    .iter()
                    .any(|a| b.acked_at.is_some_and(|done| done < a.submitted_at))
            })
            .map(|(n, _)| **n)
            .collect();
        match answer {
            OpResult::Value(v) => {
                let text = String::from_utf8_lossy(&v[..v.len().min(40)]).to_string();
                assert!(
                    allowed.iter().any(|&b| v[..] == value(k, b)[..]),
                    "round {round}: key k{k} holds {text:?}, which is not the value of any allowed batch {allowed:?} (dir {})",
                    dir.display()
                );
                checked += 1;
            }
            OpResult::NotFound => {
                assert!(
                    acked_writers.is_empty(),
                    "round {round}: key k{k} is missing but batches {:?} wrote it and were acknowledged",
                    acked_writers.iter().map(|b| b.submitted_at).collect::<Vec<_>>()
                );
            }
            other => panic!("round {round}: key k{k}: {other:?}"),
        }
    }
    assert!(checked > 0);
    let m = engine.metrics();
    let replayed: u64 = m
        .shards
        .iter()
        .map(|s| s.recovery_records_replayed + s.recovery_snapshot_entries)
        .sum();
    assert!(replayed > 0, "recovery found nothing to replay");
    eprintln!(
        "kill9 round {round} ({} tier): {} batches announced, {acked} acknowledged, killed {delay_ms} ms after the first ack, {gc_runs} GC passes, {moves} moves between devices, backend {}",
        shape.name(),
        batches.len(),
        engine.backend()
    );
    engine.shutdown().expect("shutdown");
    (gc_runs, moves)
}

/// The GC passes and moves of all rounds.
fn rounds(shape: Shape) -> (u64, u64) {
    let rounds: u32 = std::env::var("RINGKV_KILL9_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64);
    (0..rounds)
        .map(|r| {
            // 20..=400 ms after the first acknowledgement (longer on the
            // hybrid tier, so GC has garbage to work on).
            let spread = if shape == Shape::Memory { 381 } else { 1500 };
            let delay = 20 + (seed.rotate_left(r * 7) ^ (r as u64 * 0x9E37)) % spread;
            round(r, delay, shape)
        })
        .fold((0, 0), |(g, m), (rg, rm)| (g + rg, m + rm))
}

#[test]
fn acknowledged_writes_survive_kill_9() {
    rounds(Shape::Memory);
}

#[test]
fn acknowledged_writes_survive_kill_9_on_the_hybrid_tier() {
    let (gc, _) = rounds(Shape::Hybrid);
    assert!(
        gc > 0,
        "GC never ran in the writer: no round tested a kill under GC load"
    );
}

#[test]
fn acknowledged_writes_survive_kill_9_with_a_hot_device() {
    let (gc, moves) = rounds(Shape::HotDevice);
    assert!(
        gc > 0 && moves > 0,
        "in the writer GC ran {gc} passes and moved {moves} records between devices: no round tested a kill while records moved"
    );
}
