//! The MapDB/ChronicleMap sweep (seed document 001), by the document's own
//! method: for each N, write items `i = 0 … N-1` in order, then do N reads
//! of keys drawn uniformly from `[0, N)`, timing each phase in nanoseconds.
//! An item is the document's: an 8-byte integer key `i` and a value of 8
//! random 32-bit floats (32 bytes). One client makes one call per item;
//! 10,000 operations run before each phase's clock starts (the warm-up).
//! `--threads`, `--batch` and `--fields/--field-length` change the clients,
//! the batching and the item shape; the report header says which ran.
//!
//! What must hold: the write phase writes exactly the keys `0 … N-1` (plus
//! warm-up keys outside that range); every read is of a key in `[0, N)` and
//! its value is checked against the one written; warm-up is never timed, but
//! its wrong answers are counted like the measured ones.

use super::{check_put, send, Access, RangeCursor};
use crate::driver::{run_phase, DriverError, StepContext, StepOutcome, Work};
use crate::keys::{key_name, Rng};
use crate::record::{RecordShape, ValuePool};
use crate::report::{rows_from_phase, ResultRow};
use crate::settings::Settings;
use crate::stats::ServerSnapshot;
use crate::target::{Op, Reply, Session, Target, TargetError};
use bytes::Bytes;
use std::sync::Arc;

pub const WORKLOAD: &str = "sweep";

/// The document's warm-up: operations before the clock starts.
pub const DOCUMENT_WARMUP_OPS: u64 = 10_000;

/// The document's key: an 8-byte integer.
pub const DOCUMENT_KEY_BYTES: usize = 8;
/// The document's value: 8 random 32-bit floats.
pub const DOCUMENT_FLOATS: usize = 8;
pub const DOCUMENT_VALUE_BYTES: usize = DOCUMENT_FLOATS * 4;

/// Warm-up writes go to keys from here on (inside the size's namespace,
/// above any N the ladder has), so the measured phase writes fresh keys.
const WARMUP_KEY_OFFSET: u64 = 1 << 39;
const _: () = assert!(WARMUP_KEY_OFFSET > crate::cli::SWEEP_LADDER[8]);

/// What one sweep item looks like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ItemShape {
    /// The document's: key `i` as 8 bytes (big-endian, so keys sort like
    /// the integers), value 8 random `f32` (little-endian), 32 bytes.
    Document,
    /// YCSB-style: key `"user"` + FNV hash of `i`, value of the given shape.
    Fields(RecordShape),
}

impl ItemShape {
    /// Key and value bytes of one item (the longest YCSB key for `Fields`).
    pub fn item_bytes(&self) -> (usize, usize) {
        match self {
            ItemShape::Document => (DOCUMENT_KEY_BYTES, DOCUMENT_VALUE_BYTES),
            // "user" + up to 20 decimal digits.
            ItemShape::Fields(shape) => (24, shape.value_bytes()),
        }
    }

    /// One line for the report header.
    pub fn describe(&self) -> String {
        match self {
            ItemShape::Document => format!(
                "the document's items: {DOCUMENT_KEY_BYTES}-byte integer key i, value {DOCUMENT_FLOATS} random f32 ({DOCUMENT_VALUE_BYTES} B)"
            ),
            ItemShape::Fields(s) => format!(
                "YCSB-style items: key \"user\"+hash(i), value {} x {} B",
                s.field_count, s.field_length
            ),
        }
    }
}

/// Keys and values of the sweep's items: pure functions of (seed, i).
#[derive(Debug, Clone)]
pub struct Items {
    shape: ItemShape,
    seed: u64,
    pool: Option<ValuePool>,
}

impl Items {
    pub fn new(shape: ItemShape, seed: u64) -> Items {
        let pool = match shape {
            ItemShape::Document => None,
            ItemShape::Fields(s) => Some(ValuePool::new(seed, s)),
        };
        Items { shape, seed, pool }
    }

    /// The key of item `i` in key namespace `base`.
    pub fn key(&self, base: u64, i: u64) -> Bytes {
        let n = base.wrapping_add(i);
        match self.shape {
            ItemShape::Document => Bytes::copy_from_slice(&n.to_be_bytes()),
            ItemShape::Fields(_) => Bytes::from(key_name(n)),
        }
    }

    /// The value of item `i`.
    pub fn value(&self, i: u64) -> Bytes {
        match &self.pool {
            Some(pool) => pool.value_for(i),
            None => Bytes::copy_from_slice(&document_value(self.seed, i)),
        }
    }

    /// Whether `got` is exactly the value of item `i`.
    pub fn matches(&self, i: u64, got: &[u8]) -> bool {
        match &self.pool {
            Some(pool) => pool.matches(i, got),
            None => document_value(self.seed, i) == got,
        }
    }
}

/// Item `i`'s value: 8 floats uniform in [0, 1), from a generator seeded by
/// (seed, i), so a read can be checked without remembering what was written.
pub fn document_value(seed: u64, i: u64) -> [u8; DOCUMENT_VALUE_BYTES] {
    let mut rng = Rng::new(seed, i);
    let mut out = [0u8; DOCUMENT_VALUE_BYTES];
    for chunk in out.chunks_exact_mut(4) {
        // 24 random bits: every value is an exact f32 in [0, 1).
        let f = (rng.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        chunk.copy_from_slice(&f.to_le_bytes());
    }
    out
}

/// Which item each operation touches.
#[derive(Debug, Clone)]
pub enum Order {
    /// Operation `j` touches item `offset + j` (the document's write loop).
    Sequential { offset: u64 },
    /// Each operation touches an item drawn uniformly from `[0, items)`.
    Uniform { items: u64, rng: Rng },
}

/// One client's share of a sweep phase: operations are numbered `[0, count)`
/// by a cursor all clients share, `batch` at a time.
pub struct SweepWork {
    pub cursor: Arc<RangeCursor>,
    pub access: Access,
    pub order: Order,
    pub base: u64,
    pub batch: u64,
    pub items: Arc<Items>,
    pub op: &'static str,
}

impl SweepWork {
    /// The item numbers of the next step (empty when the phase is done).
    pub fn next_items(&mut self) -> Vec<u64> {
        let Some(range) = self.cursor.claim(self.batch) else {
            return Vec::new();
        };
        match &mut self.order {
            Order::Sequential { offset } => range.map(|j| *offset + j).collect(),
            Order::Uniform { items, rng } => range.map(|_| rng.below(*items)).collect(),
        }
    }
}

impl Work for SweepWork {
    fn operations(&self) -> Vec<&'static str> {
        vec![self.op]
    }

    async fn step<S: Session>(
        &mut self,
        session: &mut S,
        ctx: &mut StepContext<'_>,
    ) -> Result<StepOutcome, TargetError> {
        let numbers = self.next_items();
        if numbers.is_empty() {
            return Ok(StepOutcome::Exhausted);
        }
        let ops: Vec<Op> = numbers
            .iter()
            .map(|&i| match self.access {
                Access::Put => Op::Put {
                    key: self.items.key(self.base, i),
                    value: self.items.value(i),
                },
                Access::Get => Op::Get {
                    key: self.items.key(self.base, i),
                },
            })
            .collect();
        let payload = super::put_payload(&ops);
        let replies = send(session, ops).await?;
        ctx.complete(self.op, replies.len() as u64);
        ctx.payload(self.op, payload);
        for (&i, reply) in numbers.iter().zip(&replies) {
            match self.access {
                Access::Put => check_put(ctx, self.op, reply),
                Access::Get => match reply {
                    Reply::Value(v) if self.items.matches(i, v) => {}
                    Reply::Value(_) => ctx.wrong_value(self.op),
                    Reply::NotFound => ctx.not_found(self.op),
                    Reply::Failed(reason) => ctx.failed(self.op, reason),
                    other => ctx.failed(self.op, &format!("unexpected answer to a get: {other:?}")),
                },
            }
        }
        Ok(StepOutcome::Ran {
            ops: replies.len() as u64,
        })
    }
}

/// The client works of one phase: `count` operations over `s.threads` clients.
fn works(
    s: &Settings,
    items: &Arc<Items>,
    access: Access,
    op: &'static str,
    base: u64,
    count: u64,
    order: impl Fn(usize) -> Order,
) -> Vec<SweepWork> {
    let cursor = RangeCursor::new(count);
    (0..s.threads)
        .map(|t| SweepWork {
            cursor: cursor.clone(),
            access,
            order: order(t),
            base,
            batch: s.batch as u64,
            items: items.clone(),
            op,
        })
        .collect()
}

/// Random streams: distinct per phase and client, fixed by `--seed`.
const STREAM_WARMUP_READ: u64 = 0x5357_0000;
const STREAM_READ: u64 = 0x5357_1000;

/// Where a sweep runs: through the driver (any target: TCP sessions, one
/// call per step) or as client loops on the in-process engine's threads.
pub enum SweepTarget<'a, T: Target> {
    Driver(&'a T),
    Engine(&'a crate::engine_target::EngineTarget),
    /// The embedded API's `Db`, one client on its thread.
    Db(&'a crate::engine_target::DbTarget),
}

impl<T: Target> SweepTarget<'_, T> {
    async fn phase(
        &self,
        s: &Settings,
        label: String,
        count: u64,
        works: Vec<SweepWork>,
    ) -> Result<crate::driver::PhaseOutcome, DriverError> {
        match self {
            SweepTarget::Driver(target) => {
                let plan = s.exhaust_plan(label, count, s.pacing);
                run_phase(*target, &plan, works).await
            }
            SweepTarget::Engine(target) => engine_phase(target, s, &label, works).await,
            SweepTarget::Db(target) => db_phase(target, s, &label, works).await,
        }
    }
}

/// Writes then reads `n` items in key namespace `base`.
pub async fn run_size<T: Target>(
    target: &T,
    s: &Settings,
    n: u64,
    base: u64,
    label: &str,
) -> Result<Vec<ResultRow>, DriverError> {
    run_size_on(SweepTarget::Driver(target), s, n, base, label).await
}

/// [`run_size`] on either kind of [`SweepTarget`].
pub async fn run_size_on<T: Target>(
    target: SweepTarget<'_, T>,
    s: &Settings,
    n: u64,
    base: u64,
    label: &str,
) -> Result<Vec<ResultRow>, DriverError> {
    s.check();
    assert!(n >= 1, "a sweep size of at least one item");
    let items = Arc::new(Items::new(s.sweep_items, s.seed));
    let sizes = crate::cli::format_count(n);
    let mut rows = Vec::new();
    for (access, op) in [(Access::Put, "write"), (Access::Get, "read")] {
        let order = |warm: bool| {
            move |t: usize| match access {
                Access::Put => Order::Sequential {
                    offset: if warm { WARMUP_KEY_OFFSET } else { 0 },
                },
                Access::Get => Order::Uniform {
                    items: n,
                    rng: Rng::new(
                        s.seed,
                        if warm {
                            STREAM_WARMUP_READ
                        } else {
                            STREAM_READ
                        } + t as u64,
                    ),
                },
            }
        };
        let warm_errors = if s.sweep_warmup_ops > 0 {
            let warm = works(s, &items, access, op, base, s.sweep_warmup_ops, order(true));
            target
                .phase(
                    s,
                    format!("{label} {op} {sizes} warm-up"),
                    s.sweep_warmup_ops,
                    warm,
                )
                .await?
                .tallies
        } else {
            Default::default()
        };
        // The read phase may be a sample (--sweep-reads).
        let count = match access {
            Access::Get => s.sweep_reads.map_or(n, |r| r.clamp(1, n)),
            Access::Put => n,
        };
        let measured = works(s, &items, access, op, base, count, order(false));
        let mut out = target
            .phase(s, format!("{label} {op} {sizes}"), count, measured)
            .await?;
        // Warm-up is not timed, but its wrong answers count.
        if let Some(w) = warm_errors.get(op) {
            let t = out.tallies.entry(op).or_default();
            t.failed += w.failed;
            t.not_found += w.not_found;
            t.wrong_value += w.wrong_value;
            if t.first_failure.is_none() {
                t.first_failure.clone_from(&w.first_failure);
            }
        }
        rows.extend(rows_from_phase(WORKLOAD, &out, &[op], Some(n), s.mode())?);
    }
    Ok(rows)
}

/// What one client loop measured on a shard thread.
struct ClientRun {
    op: &'static str,
    tally: crate::driver::OpTally,
    first_start: Option<std::time::Instant>,
    last_done: Option<std::time::Instant>,
}

/// One client loop of the in-process path: the work's calls in order, each
/// timed, each answer checked (runs on a shard thread of the engine).
async fn engine_client_loop(
    mut work: SweepWork,
    handle: engine::Handle,
    stop: Arc<std::sync::atomic::AtomicBool>,
    ops_done: Arc<std::sync::atomic::AtomicU64>,
) -> ClientRun {
    let mut run = ClientRun::new(work.op);
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let numbers = work.next_items();
        if numbers.is_empty() {
            break;
        }
        let ops = engine_ops(&work, &numbers);
        let started = std::time::Instant::now();
        let answer = handle.batch(ops).await.map_err(|e| e.to_string());
        run.step(&work, &numbers, started, answer, &ops_done);
    }
    run
}

/// The engine operations of one step.
fn engine_ops(work: &SweepWork, numbers: &[u64]) -> Vec<engine::Op> {
    numbers
        .iter()
        .map(|&i| match work.access {
            Access::Put => engine::Op::Put {
                key: work.items.key(work.base, i),
                value: work.items.value(i),
            },
            Access::Get => engine::Op::Get {
                key: work.items.key(work.base, i),
            },
        })
        .collect()
}

/// [`engine_client_loop`] on the embedded API, on the `Db`'s own thread:
/// a step of one item is one `put` or `get` call (the document's one call
/// per item), a longer step one `batch` call.
fn db_client_loop(
    mut work: SweepWork,
    db: &engine::Db,
    stop: &std::sync::atomic::AtomicBool,
    ops_done: &std::sync::atomic::AtomicU64,
) -> ClientRun {
    let mut run = ClientRun::new(work.op);
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let numbers = work.next_items();
        let answer = match numbers[..] {
            [] => break,
            [i] => {
                let key = work.items.key(work.base, i);
                let started = std::time::Instant::now();
                let answer = match work.access {
                    Access::Put => db
                        .put(&key, work.items.value(i))
                        .map(|()| engine::OpResult::Ok),
                    Access::Get => db.get(&key).map(|v| match v {
                        Some(v) => engine::OpResult::Value(v),
                        None => engine::OpResult::NotFound,
                    }),
                };
                let answer = match answer {
                    Ok(r) => Ok(vec![r]),
                    Err(engine::DbError::Op(e)) => Ok(vec![engine::OpResult::Err(e)]),
                    Err(e) => Err(e.to_string()),
                };
                (started, answer)
            }
            _ => {
                let ops = engine_ops(&work, &numbers);
                let started = std::time::Instant::now();
                (started, db.batch(ops).map_err(|e| e.to_string()))
            }
        };
        run.step(&work, &numbers, answer.0, answer.1, ops_done);
    }
    run
}

impl ClientRun {
    fn new(op: &'static str) -> ClientRun {
        ClientRun {
            op,
            tally: crate::driver::OpTally::default(),
            first_start: None,
            last_done: None,
        }
    }

    /// Times one step that started at `started` and checks its answers.
    fn step(
        &mut self,
        work: &SweepWork,
        numbers: &[u64],
        started: std::time::Instant,
        answer: Result<Vec<engine::OpResult>, String>,
        ops_done: &std::sync::atomic::AtomicU64,
    ) {
        let done = std::time::Instant::now();
        let op = work.op;
        let fail = |t: &mut crate::driver::OpTally, reason: String| {
            t.failed += 1;
            if t.first_failure.is_none() {
                t.first_failure = Some(reason);
            }
        };
        self.first_start.get_or_insert(started);
        self.last_done = Some(done);
        let t = &mut self.tally;
        t.hist.record(done - started);
        t.ops += numbers.len() as u64;
        t.steps += 1;
        ops_done.fetch_add(numbers.len() as u64, std::sync::atomic::Ordering::Relaxed);
        let results = match answer {
            Ok(results) => results,
            Err(e) => {
                for _ in numbers {
                    fail(t, format!("{op}: {e}"));
                }
                return;
            }
        };
        for (&i, result) in numbers.iter().zip(results) {
            match (work.access, result) {
                (Access::Put, engine::OpResult::Ok) => {}
                (Access::Get, engine::OpResult::Value(v)) if work.items.matches(i, &v) => {}
                (Access::Get, engine::OpResult::Value(_)) => t.wrong_value += 1,
                (Access::Get, engine::OpResult::NotFound) => t.not_found += 1,
                (_, engine::OpResult::Err(e)) => fail(t, e.to_string()),
                (_, other) => fail(t, format!("unexpected answer to a {op}: {other:?}")),
            }
        }
    }
}

/// Sets its flag when dropped.
struct StopOnDrop(Arc<std::sync::atomic::AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The count of operations a phase's client loops have done, and the
/// progress lines that print it while the guard lives.
fn progress(
    s: &Settings,
    label: &str,
) -> (
    Arc<std::sync::atomic::AtomicU64>,
    Option<crate::driver::TickerGuard>,
) {
    let done = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let start = tokio::time::Instant::now();
    let count = done.clone();
    let lines = crate::driver::progress_lines(s.progress, label, start, start, move || {
        count.load(std::sync::atomic::Ordering::Relaxed)
    });
    (done, lines)
}

/// One phase on the in-process engine: `s.threads` client loops on the
/// engine's shard threads, merged into the driver's outcome shape.
async fn engine_phase(
    target: &crate::engine_target::EngineTarget,
    s: &Settings,
    label: &str,
    works: Vec<SweepWork>,
) -> Result<crate::driver::PhaseOutcome, DriverError> {
    let before = ServerSnapshot::parse(&target.connect().await?.stats().await?)?;
    let (done, lines) = progress(s, label);
    let slots: Vec<std::sync::Mutex<Option<SweepWork>>> = works
        .into_iter()
        .map(|w| std::sync::Mutex::new(Some(w)))
        .collect();
    let slots = Arc::new(slots);
    let clients = slots.len();
    // If this phase is dropped (SIGINT/SIGTERM), the loops on the shard
    // threads stop at their next call.
    let stop = StopOnDrop(Arc::new(std::sync::atomic::AtomicBool::new(false)));
    let flag = stop.0.clone();
    let runs = target
        .run_on_shards(clients, move |t, handle| {
            let work = slots[t]
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .take();
            let flag = flag.clone();
            let done = done.clone();
            async move {
                match work {
                    Some(work) => Some(engine_client_loop(work, handle, flag, done).await),
                    None => None,
                }
            }
        })
        .await?;
    drop(stop);
    drop(lines);
    let after = ServerSnapshot::parse(&target.connect().await?.stats().await?)?;
    Ok(phase_outcome(runs.into_iter().flatten(), before, after))
}

/// One phase on the embedded API: the single client loop on the `Db`'s
/// thread.
async fn db_phase(
    target: &crate::engine_target::DbTarget,
    s: &Settings,
    label: &str,
    works: Vec<SweepWork>,
) -> Result<crate::driver::PhaseOutcome, DriverError> {
    let [work]: [SweepWork; 1] = works.try_into().map_err(|w: Vec<SweepWork>| {
        DriverError::Target(TargetError::Unsupported {
            addr: "in-process engine (Db)".to_string(),
            what: if w.len() > 1 {
                "more than one client thread on the embedded API (a Db is called from one thread; use --shards 2 or more for the engine's own threads)"
            } else {
                "a phase without a client"
            },
        })
    })?;
    let before = ServerSnapshot::parse(&target.stats().await?)?;
    let (done, lines) = progress(s, label);
    // If this phase is dropped (SIGINT/SIGTERM), the loop stops at its
    // next call.
    let stop = StopOnDrop(Arc::new(std::sync::atomic::AtomicBool::new(false)));
    let flag = stop.0.clone();
    let run = target
        .run(move |db| db_client_loop(work, db, &flag, &done))
        .await?;
    drop(stop);
    drop(lines);
    let after = ServerSnapshot::parse(&target.stats().await?)?;
    Ok(phase_outcome(std::iter::once(run), before, after))
}

/// A phase's outcome from its client loops' runs.
fn phase_outcome(
    runs: impl Iterator<Item = ClientRun>,
    before: ServerSnapshot,
    after: ServerSnapshot,
) -> crate::driver::PhaseOutcome {
    let mut tallies = crate::driver::Tallies::new();
    let mut first = None;
    let mut last = None;
    for run in runs {
        tallies.entry(run.op).or_default().merge(&run.tally);
        first = match (first, run.first_start) {
            (Some(a), Some(b)) => Some(std::cmp::min(a, b)),
            (a, b) => a.or(b),
        };
        last = last.max(run.last_done);
    }
    let elapsed = match (first, last) {
        (Some(a), Some(b)) => b.saturating_duration_since(a),
        _ => std::time::Duration::ZERO,
    };
    let total: u64 = tallies.values().map(|t| t.ops).sum();
    crate::driver::PhaseOutcome {
        tallies,
        elapsed,
        before,
        after,
        ops_per_sec: if elapsed.is_zero() {
            0.0
        } else {
            total as f64 / elapsed.as_secs_f64()
        },
        missed_batches: 0,
        timelines: Default::default(),
    }
}

/// Namespace for size index `i` on a shared server: sizes never share keys.
pub fn namespace(i: usize) -> u64 {
    (i as u64 + 1) << 40
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Status;
    use crate::settings::tests::tiny;
    use crate::target::memory::MemoryTarget;

    #[test]
    fn document_items_have_the_documents_shape() {
        let items = Items::new(ItemShape::Document, 1);
        let key = items.key(0, 258);
        assert_eq!(key.len(), 8);
        assert_eq!(key.as_ref(), &[0, 0, 0, 0, 0, 0, 1, 2], "the integer 258");
        let value = items.value(258);
        assert_eq!(value.len(), 32);
        let floats: Vec<f32> = value
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        assert_eq!(floats.len(), 8);
        assert!(floats.iter().all(|f| (0.0..1.0).contains(f)), "{floats:?}");
        // Random floats: not all equal, different per item and per seed.
        assert!(floats.windows(2).any(|w| w[0] != w[1]));
        assert_ne!(items.value(259), value);
        assert_ne!(Items::new(ItemShape::Document, 2).value(258), value);
        assert!(items.matches(258, &value));
        assert!(!items.matches(259, &value));
        assert_eq!(ItemShape::Document.item_bytes(), (8, 32));
    }

    #[test]
    fn writes_are_sequential_and_reads_uniform_over_n() {
        let n = 1_000u64;
        let items = Arc::new(Items::new(ItemShape::Document, 1));
        let s = Settings {
            threads: 1,
            batch: 7,
            ..tiny()
        };
        let mut w = works(&s, &items, Access::Put, "write", 0, n, |_| {
            Order::Sequential { offset: 0 }
        });
        let mut written = Vec::new();
        loop {
            let next = w[0].next_items();
            if next.is_empty() {
                break;
            }
            written.extend(next);
        }
        assert_eq!(written, (0..n).collect::<Vec<_>>(), "i = 0 … N-1 in order");

        // N reads, uniform over [0, N): count per tenth of the range.
        let reads = 100_000u64;
        let mut r = works(&s, &items, Access::Get, "read", 0, reads, |_| {
            Order::Uniform {
                items: n,
                rng: Rng::new(1, 2),
            }
        });
        let mut tenths = [0u64; 10];
        let mut total = 0u64;
        loop {
            let next = r[0].next_items();
            if next.is_empty() {
                break;
            }
            for i in next {
                assert!(i < n);
                tenths[(i * 10 / n) as usize] += 1;
                total += 1;
            }
        }
        assert_eq!(total, reads, "exactly the phase's count");
        // Each tenth expects 10,000 (sd ~95): 5% is > 5 sd.
        for c in tenths {
            assert!((9_500..=10_500).contains(&c), "{tenths:?}");
        }
    }

    #[tokio::test]
    async fn writes_then_reads_every_size_with_warmup_and_checks() {
        let target = MemoryTarget::default();
        let s = tiny();
        let mut total = 0;
        for (i, &n) in s.sweep_sizes.iter().enumerate() {
            let rows = run_size(&target, &s, n, namespace(i), "t")
                .await
                .expect("size");
            assert_eq!(rows.len(), 2);
            assert_eq!(
                (rows[0].operation.as_str(), rows[1].operation.as_str()),
                ("write", "read")
            );
            for r in &rows {
                assert_eq!(r.ops, n, "warm-up is not counted");
                assert_eq!(r.items, Some(n));
                assert_eq!(r.status, Status::Ok);
                assert!(r.elapsed_ns > 0);
            }
            // N items plus the warm-up writes, in their own namespace.
            total += n + s.sweep_warmup_ops;
            assert_eq!(target.keys() as u64, total);
        }
    }

    #[tokio::test]
    async fn a_read_sample_reads_fewer_than_n_over_all_of_them() {
        let target = MemoryTarget::default();
        let s = Settings {
            sweep_warmup_ops: 0,
            sweep_reads: Some(30),
            ..tiny()
        };
        let rows = run_size(&target, &s, 120, 0, "t").await.expect("size");
        assert_eq!((rows[0].ops, rows[1].ops), (120, 30));
        assert_eq!(rows[1].items, Some(120));
        assert_eq!(rows[1].status, Status::Ok);
        // A sample larger than N reads N.
        let s = Settings {
            sweep_reads: Some(1_000),
            ..s
        };
        let rows = run_size(&target, &s, 50, 1, "t").await.expect("size");
        assert_eq!(rows[1].ops, 50);
    }

    #[tokio::test]
    async fn a_wrong_value_is_caught() {
        let target = MemoryTarget::default();
        let s = Settings {
            sweep_warmup_ops: 0,
            ..tiny()
        };
        let items = Items::new(s.sweep_items, s.seed);
        // Every item answers garbage, so each of the 50 uniform reads is caught.
        for i in 0..50 {
            target.corrupt(items.key(0, i));
        }
        let rows = run_size(&target, &s, 50, 0, "t").await.expect("size");
        assert_eq!(rows[1].status, Status::Errors);
        assert_eq!(rows[1].errors.wrong_value, 50);
    }
}
