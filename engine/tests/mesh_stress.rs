//! The mesh on real threads: three shards and two outside callers send
//! batches to random shards with random pauses (so shards park and are
//! woken all the time), a million operations in all (`RINGKV_MESH_STRESS_OPS`
//! to change it), and every one must be answered, in order, with the value
//! its caller last wrote. A lost wake-up shows as a caller that never
//! finishes: the test waits a generous deadline, then fails with each
//! caller's progress and each shard's LSNs, queue depth and mesh counters.
//! Not a timing test: the deadline is minutes for seconds of work.

mod common;

use common::*;
use ringkv_engine::io::sim::SimDisk;
use ringkv_engine::{Engine, Op, OpResult};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tunables::{Backend, Durability};

const SHARDS: u32 = 3;
/// Callers on each shard's thread (their batches cross through the mesh).
const TASKS_PER_SHARD: u64 = 3;
const OUTSIDE_CALLERS: u64 = 2;
/// Keys each caller owns (it alone writes them, so it knows their values).
const KEYS_PER_CALLER: u64 = 64;
const DEADLINE: Duration = Duration::from_secs(600);

fn total_ops() -> u64 {
    std::env::var("RINGKV_MESH_STRESS_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000)
}

/// A small generator (xorshift), seeded per caller.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// One caller's work: random batches of puts and gets over its own keys
/// (which hash to every shard), each answer checked against what it wrote.
struct Caller {
    id: u64,
    rng: Rng,
    versions: Vec<u64>,
    done: Arc<AtomicU64>,
}

impl Caller {
    fn new(id: u64, done: Arc<AtomicU64>) -> Caller {
        Caller {
            id,
            rng: Rng(0x9e37_79b9_7f4a_7c15 ^ (id + 1).wrapping_mul(0x2545_f491_4f6c_dd1d)),
            versions: vec![0; KEYS_PER_CALLER as usize],
            done,
        }
    }

    fn key_index(&self, k: u64) -> u64 {
        self.id * 1_000_000 + k
    }

    /// The next batch (1 to 8 operations), and the answer each must get.
    fn batch(&mut self) -> (Vec<Op>, Vec<Option<u64>>) {
        let n = 1 + self.rng.below(8);
        let mut ops = Vec::new();
        let mut expect = Vec::new();
        for _ in 0..n {
            let k = self.rng.below(KEYS_PER_CALLER);
            let i = self.key_index(k);
            if self.rng.below(2) == 0 {
                self.versions[k as usize] += 1;
                ops.push(put(i, self.versions[k as usize]));
                expect.push(None);
            } else {
                ops.push(get(i));
                expect.push(Some(self.versions[k as usize]));
            }
        }
        (ops, expect)
    }

    fn check(&self, answers: &[OpResult], expect: &[Option<u64>], ops: &[Op]) {
        assert_eq!(answers.len(), expect.len(), "one answer per operation");
        for ((answer, want), op) in answers.iter().zip(expect).zip(ops) {
            match want {
                None => assert_eq!(*answer, OpResult::Ok, "a put of caller {}", self.id),
                Some(0) => assert_eq!(*answer, OpResult::NotFound, "{op:?}"),
                Some(v) => {
                    let got = value_of(answer).and_then(|b| parse_value(&b));
                    let want_key = match op {
                        Op::Get { key } => String::from_utf8_lossy(key).to_string(),
                        _ => unreachable!(),
                    };
                    assert_eq!(
                        got.map(|g| g.1),
                        Some(*v),
                        "caller {} read {want_key} out of order: {answer:?}",
                        self.id
                    );
                }
            }
        }
        self.done.fetch_add(answers.len() as u64, Ordering::Relaxed);
    }

    /// A pause now and then, long enough for a shard to park.
    fn pause_us(&mut self) -> Option<u64> {
        (self.rng.below(16) == 0).then(|| self.rng.below(300))
    }
}

#[test]
fn a_million_requests_across_parking_shards_are_all_answered() {
    stress(Backend::Auto, total_ops());
}

/// The same on the fallback backend (readiness polling): there the bell is
/// the runtime's own wake-up, not MSG_RING. A fifth of the operations.
#[test]
fn on_the_fallback_backend_too() {
    stress(Backend::Fallback, total_ops() / 5);
}

fn stress(backend: Backend, total: u64) {
    init_log();
    let disk = SimDisk::new(11);
    let mut config = small_config(Path::new("/mesh"), SHARDS, Durability::Sync);
    config.io.backend = backend;
    let engine = Engine::open_with_disk(&config, disk).expect("open");
    let callers = u64::from(SHARDS) * TASKS_PER_SHARD + OUTSIDE_CALLERS;
    let per_caller = total.div_ceil(callers);
    let (finished_tx, finished_rx) = std::sync::mpsc::channel::<u64>();
    let mut progress = Vec::new();

    for shard in 0..SHARDS as usize {
        for t in 0..TASKS_PER_SHARD {
            let id = shard as u64 * TASKS_PER_SHARD + t;
            let done = Arc::new(AtomicU64::new(0));
            progress.push(done.clone());
            let h = engine.handle();
            let tx = finished_tx.clone();
            engine.spawn_on(shard, move || async move {
                let mut c = Caller::new(id, done);
                while c.done.load(Ordering::Relaxed) < per_caller {
                    let (ops, expect) = c.batch();
                    let answers = h.batch(ops.clone()).await.expect("batch");
                    c.check(&answers, &expect, &ops);
                    if let Some(us) = c.pause_us() {
                        compio::time::sleep(Duration::from_micros(us)).await;
                    }
                }
                let _ = tx.send(id);
            });
        }
    }
    let mut outside = Vec::new();
    for o in 0..OUTSIDE_CALLERS {
        let id = u64::from(SHARDS) * TASKS_PER_SHARD + o;
        let done = Arc::new(AtomicU64::new(0));
        progress.push(done.clone());
        let h = engine.handle();
        let tx = finished_tx.clone();
        outside.push(std::thread::spawn(move || {
            let mut c = Caller::new(id, done);
            while c.done.load(Ordering::Relaxed) < per_caller {
                let (ops, expect) = c.batch();
                let answers = h.batch_blocking(ops.clone()).expect("batch");
                c.check(&answers, &expect, &ops);
                if let Some(us) = c.pause_us() {
                    std::thread::sleep(Duration::from_micros(us));
                }
            }
            let _ = tx.send(id);
        }));
    }
    drop(finished_tx);

    let deadline = Instant::now() + DEADLINE;
    for _ in 0..callers {
        let left = deadline.saturating_duration_since(Instant::now());
        if finished_rx.recv_timeout(left).is_err() {
            let done: Vec<u64> = progress.iter().map(|d| d.load(Ordering::Relaxed)).collect();
            let shards: Vec<String> = engine
                .metrics()
                .shards
                .iter()
                .map(|s| {
                    format!(
                        "shard {}: lsn {} durable {} queue {} cross {} wakeups {}",
                        s.shard,
                        s.current_lsn,
                        s.durable_lsn,
                        s.queue_depth,
                        s.cross_requests,
                        s.wakeups
                    )
                })
                .collect();
            panic!(
                "callers stopped getting answers (a lost wake-up?): done per caller {done:?} of {per_caller}; {shards:#?}"
            );
        }
    }
    for t in outside {
        t.join().expect("outside caller");
    }
    let m = engine.metrics();
    let cross: u64 = m.shards.iter().map(|s| s.cross_requests).sum();
    let wakeups: u64 = m.shards.iter().map(|s| s.wakeups).sum();
    // Two thirds of the shard tasks' sub-batches belong to another shard.
    // A request and its answer each wake a parked shard at most once.
    assert!(cross > 0, "no batch crossed the mesh");
    assert!(
        wakeups <= 2 * cross,
        "more wake-ups ({wakeups}) than two per cross-shard request ({cross})"
    );
    let answered: u64 = progress.iter().map(|d| d.load(Ordering::Relaxed)).sum();
    assert!(answered >= per_caller * callers);
    engine.shutdown().expect("shutdown");
}

/// Back-pressure: many callers on shard 0 write keys of shard 1, whose
/// answers wait for fdatasyncs on a slow (`sas`) device. Shard 0 never has
/// more than `limits.shard_queue_depth` sub-batches unanswered at shard 1;
/// the callers past it wait on their own thread, and all finish.
#[test]
fn a_slow_peer_holds_the_mesh_to_its_bound() {
    init_log();
    let disk = SimDisk::new(12);
    let mut config = small_config(Path::new("/slow"), 2, Durability::Sync);
    config.devices.entry("wal".to_string()).or_default().profile = "sas".to_string();
    let bound = u64::from(config.limits.shard_queue_depth);
    let engine = Engine::open_with_disk(&config, disk).expect("open");
    let h = engine.handle();
    // Keys shard 1 owns.
    let theirs: Vec<u64> = (0..)
        .filter(|&i| h.shard_of(&key(i)) == 1)
        .take(64)
        .collect();
    let callers = 4 * bound as usize;
    let (tx, rx) = std::sync::mpsc::channel();
    for c in 0..callers {
        let h = engine.handle();
        let tx = tx.clone();
        let k = theirs[c % theirs.len()];
        engine.spawn_on(0, move || async move {
            let mut ok = true;
            for version in 1..=5 {
                let answers = h.batch(vec![put(k, version)]).await;
                ok &= matches!(answers.as_deref(), Ok([OpResult::Ok]));
            }
            let _ = tx.send(ok);
        });
    }
    drop(tx);
    for _ in 0..callers {
        let ok = rx
            .recv_timeout(DEADLINE)
            .expect("a caller behind the slow shard never finished");
        assert!(ok, "a write behind the slow shard failed");
    }
    let m = engine.metrics();
    let peak = m.shards[0].cross_in_flight_peak;
    eprintln!("{callers} callers, peak in flight at the slow shard: {peak}, bound {bound}");
    assert!(
        peak >= 2,
        "the callers never overlapped: the bound was not tested"
    );
    assert!(
        peak <= bound,
        "shard 0 had {peak} sub-batches unanswered at shard 1, over limits.shard_queue_depth = {bound}"
    );
    engine.shutdown().expect("shutdown");
}
