//! Runs one phase of a workload: N client tasks, each on its own connection,
//! in a closed loop (send, wait, send) or an open loop at a fixed rate.
//!
//! What must hold:
//! - Warm-up is excluded: a step counts only if its (intended) start falls in
//!   the measurement window; the window's STATS are read at its start and
//!   after the last counted step.
//! - Open loop measures from the *intended* send time, so a stall that delays
//!   later sends shows up in their latency (no coordinated omission).
//! - Failed, missing and wrong answers are counted during the whole phase,
//!   warm-up included: correctness has no warm-up.
//! - Every loop is bounded: by time, by a step budget, or by the work running
//!   out; a transport error in one task stops all of them.
//! - Each operation kind also gets a per-second timeline of the window
//!   (operations and batch p99 of each second, by completion time), so a
//!   report can show how steady the phase was, not only its average.

use crate::crash::timeline::{Timeline, TimelinePoint};
use crate::hist::LatencyHistogram;
use crate::stats::{ServerSnapshot, StatsError};
use crate::target::{Session, Target, TargetError};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// When a phase ends.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Stop {
    /// Warm up for `warmup`, then measure for `measure`.
    Time { warmup: Duration, measure: Duration },
    /// Warm up for `warmup`, then measure exactly `steps` steps (batches).
    Steps { warmup: Duration, steps: u64 },
    /// Run until every task's work is used up; everything is measured.
    /// `total_ops` only sizes the progress bar.
    Exhausted { total_ops: u64 },
}

/// How sends are paced.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Pacing {
    /// Each task sends its next step when the previous one is answered.
    Closed,
    /// All tasks together start `ops_per_sec / batch` steps per second.
    Open { ops_per_sec: f64 },
}

/// How a phase shows its progress on stderr while it runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Progress {
    /// Nothing until the phase ends.
    Off,
    /// A bar redrawn in place; for a terminal.
    Bar,
    /// A line every `every`: elapsed time, operations done, current rate.
    /// For a log or a pipe, where a bar would print nothing.
    Lines { every: Duration },
}

/// One phase to run.
#[derive(Debug, Clone)]
pub struct PhasePlan {
    /// Progress-bar label, e.g. "nvme put".
    pub label: String,
    pub stop: Stop,
    pub pacing: Pacing,
    /// Operations per step (for the open-loop schedule).
    pub batch: usize,
    /// How progress is shown while the phase runs.
    pub progress: Progress,
}

/// What happened to one kind of operation during a phase.
#[derive(Debug, Clone, Default)]
pub struct OpTally {
    /// Step latencies inside the measurement window.
    pub hist: LatencyHistogram,
    /// Operations inside the measurement window.
    pub ops: u64,
    /// Steps (batches) inside the measurement window.
    pub steps: u64,
    /// Operations the server refused (whole phase).
    pub failed: u64,
    /// Reads that found no value for a key that must exist (whole phase).
    pub not_found: u64,
    /// Reads whose value differs from what was written (whole phase).
    pub wrong_value: u64,
    /// The first refusal's text, for the report.
    pub first_failure: Option<String>,
    /// Bytes of keys and values the puts of the window carried (what the
    /// client asked to store; 0 for reads).
    pub payload_bytes: u64,
}

impl OpTally {
    pub fn merge(&mut self, other: &OpTally) {
        self.hist.merge(&other.hist);
        self.ops += other.ops;
        self.steps += other.steps;
        self.failed += other.failed;
        self.not_found += other.not_found;
        self.wrong_value += other.wrong_value;
        self.payload_bytes += other.payload_bytes;
        if self.first_failure.is_none() {
            self.first_failure.clone_from(&other.first_failure);
        }
    }

    pub fn error_count(&self) -> u64 {
        self.failed + self.not_found + self.wrong_value
    }
}

/// Per-task tallies, keyed by operation name ("put", "read", ...).
pub type Tallies = BTreeMap<&'static str, OpTally>;

/// What a [`Work`] sees of the current step.
pub struct StepContext<'a> {
    intended: Instant,
    active: bool,
    tallies: &'a mut Tallies,
    /// Per-second buckets of the window, by operation kind.
    seconds: &'a BTreeMap<&'static str, Timeline>,
}

impl StepContext<'_> {
    /// When this step was meant to start (the latency origin).
    pub fn intended(&self) -> Instant {
        self.intended
    }

    /// Whether this step falls in the measured window (not the warm-up).
    pub fn measuring(&self) -> bool {
        self.active
    }

    /// Records `ops` operations of kind `op` whose step started at the
    /// intended time and completed now.
    pub fn complete(&mut self, op: &'static str, ops: u64) {
        if !self.active || ops == 0 {
            return;
        }
        let now = Instant::now();
        let latency = now.saturating_duration_since(self.intended);
        let t = self.tallies.entry(op).or_default();
        t.hist.record(latency);
        t.ops += ops;
        t.steps += 1;
        if let Some(timeline) = self.seconds.get(op) {
            timeline.record(now.into_std(), ops, latency);
        }
    }

    /// Records that a step of kind `op` asked to store `bytes` bytes of keys
    /// and values (counted inside the measurement window only). Zero bytes
    /// record nothing: a kind that never ran gets no tally, so no row.
    pub fn payload(&mut self, op: &'static str, bytes: u64) {
        if self.active && bytes > 0 {
            self.tallies.entry(op).or_default().payload_bytes += bytes;
        }
    }

    pub fn failed(&mut self, op: &'static str, reason: &str) {
        let t = self.tallies.entry(op).or_default();
        t.failed += 1;
        if t.first_failure.is_none() {
            t.first_failure = Some(reason.to_string());
        }
    }

    pub fn not_found(&mut self, op: &'static str) {
        self.tallies.entry(op).or_default().not_found += 1;
    }

    pub fn wrong_value(&mut self, op: &'static str) {
        self.tallies.entry(op).or_default().wrong_value += 1;
    }
}

/// Result of one step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepOutcome {
    /// The step ran this many operations.
    Ran { ops: u64 },
    /// There is nothing left to do (load-style phases).
    Exhausted,
}

/// One client task's workload: produces and checks one step at a time.
pub trait Work: Send + 'static {
    /// The operation names this work records (each gets a result row).
    fn operations(&self) -> Vec<&'static str>;

    fn step<S: Session>(
        &mut self,
        session: &mut S,
        ctx: &mut StepContext<'_>,
    ) -> impl Future<Output = Result<StepOutcome, TargetError>> + Send;
}

/// Everything measured in one phase.
#[derive(Debug, Clone)]
pub struct PhaseOutcome {
    pub tallies: Tallies,
    /// From the window's start to the completion of its last counted step.
    pub elapsed: Duration,
    pub before: ServerSnapshot,
    pub after: ServerSnapshot,
    /// Operations per second of all kinds together.
    pub ops_per_sec: f64,
    /// Open loop only: batches scheduled inside the window that were still
    /// unsent when it closed (the target rate was not sustained).
    pub missed_batches: u64,
    /// Per operation kind: operations per second and batch p99 of each
    /// second of the window ([`Timeline::window_points`]); empty for phases
    /// not run by [`run_phase`].
    pub timelines: BTreeMap<&'static str, Vec<TimelinePoint>>,
}

/// Why a phase could not complete.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DriverError {
    #[error(transparent)]
    Target(#[from] TargetError),
    #[error(transparent)]
    Stats(#[from] StatsError),
    #[error("client task {task} panicked or was cancelled: {reason}")]
    Task { task: usize, reason: String },
    #[error("a phase needs at least one client task")]
    NoTasks,
}

struct Shared {
    measure_start: Instant,
    /// For `Stop::Time`, when steps stop counting (and stop being sent).
    measure_end: Option<Instant>,
    /// For `Stop::Steps`, measured steps not yet claimed.
    steps_left: AtomicI64,
    limit_by_steps: bool,
    ops_done: AtomicU64,
    abort: AtomicBool,
    /// One per operation kind the works declare, from the window's start.
    seconds: BTreeMap<&'static str, Timeline>,
}

/// Runs `works` (one per client task) against `target` as described by `plan`.
pub async fn run_phase<T: Target, W: Work>(
    target: &T,
    plan: &PhasePlan,
    works: Vec<W>,
) -> Result<PhaseOutcome, DriverError> {
    let threads = works.len();
    if threads == 0 {
        return Err(DriverError::NoTasks);
    }
    // Connect everyone before the clock starts: connection set-up is not load.
    let mut monitor = target.connect().await?;
    let mut sessions = Vec::with_capacity(threads);
    for _ in 0..threads {
        sessions.push(target.connect().await?);
    }

    let (warmup, measure_end_after) = match plan.stop {
        Stop::Time { warmup, measure } => (warmup, Some(warmup + measure)),
        Stop::Steps { warmup, .. } => (warmup, None),
        Stop::Exhausted { .. } => (Duration::ZERO, None),
    };
    let before_exhausted = if warmup.is_zero() {
        Some(ServerSnapshot::parse(&monitor.stats().await?)?)
    } else {
        None
    };
    let phase_start = Instant::now();
    let measure_start = phase_start + warmup;
    let steps = match plan.stop {
        Stop::Steps { steps, .. } => i64::try_from(steps).unwrap_or(i64::MAX),
        _ => 0,
    };
    let seconds: BTreeMap<&'static str, Timeline> = works
        .iter()
        .flat_map(|w| w.operations())
        .map(|op| {
            (
                op,
                Timeline::per_phase(measure_start.into_std(), Duration::from_secs(1)),
            )
        })
        .collect();
    let shared = Arc::new(Shared {
        measure_start,
        measure_end: measure_end_after.map(|d| phase_start + d),
        steps_left: AtomicI64::new(steps),
        limit_by_steps: matches!(plan.stop, Stop::Steps { .. }),
        ops_done: AtomicU64::new(0),
        abort: AtomicBool::new(false),
        seconds,
    });

    let interval = match plan.pacing {
        Pacing::Closed => None,
        Pacing::Open { ops_per_sec } => {
            assert!(ops_per_sec > 0.0, "open-loop rate must be positive");
            Some(Duration::from_secs_f64(
                threads as f64 * plan.batch.max(1) as f64 / ops_per_sec,
            ))
        }
    };

    let bar = progress_bar(plan, &shared, phase_start);
    let lines = {
        let shared = shared.clone();
        progress_lines(
            plan.progress,
            &plan.label,
            phase_start,
            measure_start,
            move || shared.ops_done.load(Ordering::Relaxed),
        )
    };
    let mut handles = Vec::with_capacity(threads);
    for (index, (work, session)) in works.into_iter().zip(sessions).enumerate() {
        let shared = shared.clone();
        let first = interval.map(|iv| phase_start + iv.mul_f64(index as f64 / threads as f64));
        handles.push(tokio::spawn(client_task(
            work, session, shared, first, interval,
        )));
    }

    // Read STATS when the measurement window opens. On failure, stop the
    // tasks and wait for them: nothing outlives its phase.
    let before = match before_exhausted {
        Some(snap) => Ok(snap),
        None => {
            tokio::time::sleep_until(measure_start).await;
            match monitor.stats().await {
                Ok(pairs) => ServerSnapshot::parse(&pairs).map_err(DriverError::from),
                Err(e) => Err(DriverError::from(e)),
            }
        }
    };
    if before.is_err() {
        shared.abort.store(true, Ordering::Relaxed);
    }

    let mut tallies = Tallies::new();
    let mut last_done: Option<Instant> = None;
    let mut missed_batches = 0u64;
    let mut first_error: Option<DriverError> = None;
    for (task, handle) in handles.into_iter().enumerate() {
        match handle.await {
            Ok(Ok(done)) => {
                for (op, t) in &done.tallies {
                    tallies.entry(op).or_default().merge(t);
                }
                last_done = last_done.max(done.last_done);
                missed_batches += done.missed_batches;
            }
            Ok(Err(e)) => {
                first_error.get_or_insert(DriverError::Target(e));
            }
            Err(e) => {
                first_error.get_or_insert(DriverError::Task {
                    task,
                    reason: e.to_string(),
                });
            }
        }
    }
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    drop(lines);
    let before = before?;
    if let Some(e) = first_error {
        return Err(e);
    }
    // A fresh connection: a phase may outlast the server's idle timeout
    // (a preload of 50M records takes minutes), and the monitor's has
    // been quiet since the window opened.
    drop(monitor);
    let after = ServerSnapshot::parse(&target.connect().await?.stats().await?)?;
    let elapsed = last_done
        .map(|t| t.saturating_duration_since(measure_start))
        .unwrap_or_default();
    let total_ops: u64 = tallies.values().map(|t| t.ops).sum();
    let ops_per_sec = if elapsed.is_zero() {
        0.0
    } else {
        total_ops as f64 / elapsed.as_secs_f64()
    };
    let timelines = shared
        .seconds
        .iter()
        .map(|(op, timeline)| (*op, timeline.window_points(elapsed)))
        .collect();
    Ok(PhaseOutcome {
        tallies,
        elapsed,
        before,
        after,
        ops_per_sec,
        missed_batches,
        timelines,
    })
}

/// Steps of the grid `first, first + iv, ...` whose time falls in `[start, end)`.
fn scheduled_in_window(first: Instant, iv: Duration, start: Instant, end: Instant) -> u64 {
    let iv_ns = iv.as_nanos().max(1);
    // Index of the first grid step at or after t (0 if t <= first).
    let index_at = |t: Instant| {
        t.saturating_duration_since(first)
            .as_nanos()
            .div_ceil(iv_ns)
    };
    let count = index_at(end).saturating_sub(index_at(start));
    u64::try_from(count).unwrap_or(u64::MAX)
}

struct TaskDone {
    tallies: Tallies,
    last_done: Option<Instant>,
    missed_batches: u64,
}

async fn client_task<W: Work, S: Session>(
    mut work: W,
    mut session: S,
    shared: Arc<Shared>,
    first: Option<Instant>,
    interval: Option<Duration>,
) -> Result<TaskDone, TargetError> {
    // Every operation the work can produce gets a row, even if none of its
    // steps landed in the window (an open loop far behind its schedule).
    let mut tallies: Tallies = work
        .operations()
        .into_iter()
        .map(|op| (op, OpTally::default()))
        .collect();
    let mut last_done = None;
    let mut missed_batches = 0u64;
    let mut next_intended = first;
    loop {
        if shared.abort.load(Ordering::Relaxed) {
            break;
        }
        let intended = match (next_intended, interval) {
            (Some(at), Some(iv)) => {
                tokio::time::sleep_until(at).await;
                next_intended = Some(at + iv);
                at
            }
            _ => Instant::now(),
        };
        if let Some(end) = shared.measure_end {
            if intended >= end {
                break;
            }
            if let Some(iv) = interval {
                // Open loop, so far behind that the window closed: the rest
                // of the schedule is counted as missed, not sent late forever.
                if Instant::now() >= end {
                    missed_batches += scheduled_in_window(intended, iv, shared.measure_start, end);
                    break;
                }
            }
        }
        // A step belongs to the window its intended start falls in, even if
        // an open-loop task sends it late.
        let active = intended >= shared.measure_start;
        if active && shared.limit_by_steps && shared.steps_left.fetch_sub(1, Ordering::Relaxed) <= 0
        {
            break;
        }
        let mut ctx = StepContext {
            intended,
            active,
            tallies: &mut tallies,
            seconds: &shared.seconds,
        };
        match work.step(&mut session, &mut ctx).await {
            Ok(StepOutcome::Ran { ops }) => {
                shared.ops_done.fetch_add(ops, Ordering::Relaxed);
                if active {
                    last_done = Some(Instant::now());
                }
            }
            Ok(StepOutcome::Exhausted) => break,
            Err(e) => {
                shared.abort.store(true, Ordering::Relaxed);
                return Err(e);
            }
        }
    }
    Ok(TaskDone {
        tallies,
        last_done,
        missed_batches,
    })
}

/// Stops a progress-line ticker when its phase ends, however it ends.
pub struct TickerGuard(tokio::task::JoinHandle<()>);

impl Drop for TickerGuard {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// One progress line, e.g. "loadgen: nvme put: 15 s (measuring), 3.1M ops
/// done, 206K ops/s"; the elapsed time has a decimal below 10 s.
fn progress_line(label: &str, elapsed: Duration, phase: &str, ops: u64, rate: f64) -> String {
    let secs = elapsed.as_secs_f64();
    let elapsed = if secs < 10.0 {
        format!("{secs:.1}")
    } else {
        format!("{secs:.0}")
    };
    format!(
        "loadgen: {label}: {elapsed} s ({phase}), {} ops done, {} ops/s",
        crate::plot::human_count(ops as f64),
        crate::plot::human_count(rate)
    )
}

/// With [`Progress::Lines`], a task on the current tokio runtime that
/// prints a progress line to stderr every interval, from `phase_start` on,
/// until the returned guard is dropped; `None` otherwise. `ops_done` counts
/// the phase's operations so far; before `measure_start` the line says
/// "warm-up".
pub fn progress_lines(
    progress: Progress,
    label: &str,
    phase_start: Instant,
    measure_start: Instant,
    ops_done: impl Fn() -> u64 + Send + 'static,
) -> Option<TickerGuard> {
    let Progress::Lines { every } = progress else {
        return None;
    };
    if every.is_zero() {
        return None;
    }
    let label = label.to_string();
    Some(TickerGuard(tokio::spawn(async move {
        let mut last_ops = 0u64;
        let mut last_at = phase_start;
        let mut ticks = tokio::time::interval_at(phase_start + every, every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            let ops = ops_done();
            let now = Instant::now();
            let rate = ops.saturating_sub(last_ops) as f64
                / now.duration_since(last_at).as_secs_f64().max(1e-3);
            (last_ops, last_at) = (ops, now);
            let phase = if now < measure_start {
                "warm-up"
            } else {
                "measuring"
            };
            eprintln!(
                "{}",
                progress_line(&label, now.duration_since(phase_start), phase, ops, rate)
            );
        }
    })))
}

/// With [`Progress::Bar`], a progress bar fed by a ticker task; `None`
/// otherwise or when stderr is not a terminal (indicatif hides itself then).
fn progress_bar(
    plan: &PhasePlan,
    shared: &Arc<Shared>,
    phase_start: Instant,
) -> Option<ProgressBar> {
    if plan.progress != Progress::Bar {
        return None;
    }
    let (len, by_time) = match plan.stop {
        Stop::Time { warmup, measure } => ((warmup + measure).as_millis() as u64, true),
        Stop::Steps { steps, .. } => (steps.saturating_mul(plan.batch as u64), false),
        Stop::Exhausted { total_ops } => (total_ops, false),
    };
    let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    if bar.is_hidden() {
        return None;
    }
    let template = if by_time {
        "{prefix:>18} [{bar:30}] {elapsed:>4} {msg}"
    } else {
        "{prefix:>18} [{bar:30}] {human_pos}/{human_len} {msg}"
    };
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_prefix(plan.label.clone());
    let ticker_bar = bar.clone();
    let shared = shared.clone();
    tokio::spawn(async move {
        let mut last_ops = 0u64;
        let mut last_at = Instant::now();
        while !ticker_bar.is_finished() {
            tokio::time::sleep(Duration::from_millis(250)).await;
            let ops = shared.ops_done.load(Ordering::Relaxed);
            let now = Instant::now();
            let rate =
                (ops - last_ops) as f64 / now.duration_since(last_at).as_secs_f64().max(1e-3);
            (last_ops, last_at) = (ops, now);
            if by_time {
                ticker_bar.set_position(now.duration_since(phase_start).as_millis() as u64);
            } else {
                ticker_bar.set_position(ops);
            }
            let phase = if now < shared.measure_start {
                "warm-up"
            } else {
                "measuring"
            };
            ticker_bar.set_message(format!("{phase}, {:.0}K ops/s", rate / 1000.0));
        }
    });
    Some(bar)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target::memory::MemoryTarget;
    use crate::target::Op;
    use bytes::Bytes;

    /// Puts `count` keys of its own, `per_step` at a time.
    struct Writer {
        task: u64,
        next: u64,
        count: u64,
        per_step: u64,
    }

    impl Work for Writer {
        fn operations(&self) -> Vec<&'static str> {
            vec!["put"]
        }

        async fn step<S: Session>(
            &mut self,
            session: &mut S,
            ctx: &mut StepContext<'_>,
        ) -> Result<StepOutcome, TargetError> {
            if self.next >= self.count {
                return Ok(StepOutcome::Exhausted);
            }
            let end = (self.next + self.per_step).min(self.count);
            let ops: Vec<Op> = (self.next..end)
                .map(|i| Op::Put {
                    key: Bytes::from(format!("t{}-{i}", self.task)),
                    value: Bytes::from_static(b"v"),
                })
                .collect();
            let n = ops.len() as u64;
            session.batch(ops).await?;
            self.next = end;
            ctx.complete("put", n);
            Ok(StepOutcome::Ran { ops: n })
        }
    }

    #[test]
    fn a_progress_line_says_phase_time_ops_and_rate() {
        assert_eq!(
            progress_line(
                "nvme put",
                Duration::from_millis(2500),
                "warm-up",
                1500,
                600.0
            ),
            "loadgen: nvme put: 2.5 s (warm-up), 1.5K ops done, 600 ops/s"
        );
        assert_eq!(
            progress_line(
                "nvme put",
                Duration::from_secs(15),
                "measuring",
                3_100_000,
                206_400.0
            ),
            "loadgen: nvme put: 15 s (measuring), 3.1M ops done, 206K ops/s"
        );
    }

    fn plan(stop: Stop, pacing: Pacing) -> PhasePlan {
        PhasePlan {
            label: "test".into(),
            stop,
            pacing,
            batch: 10,
            progress: Progress::Off,
        }
    }

    fn writers(tasks: u64, count: u64) -> Vec<Writer> {
        (0..tasks)
            .map(|task| Writer {
                task,
                next: 0,
                count,
                per_step: 10,
            })
            .collect()
    }

    #[tokio::test]
    async fn exhausted_phase_measures_every_operation() {
        let target = MemoryTarget::default();
        let out = run_phase(
            &target,
            &plan(Stop::Exhausted { total_ops: 400 }, Pacing::Closed),
            writers(4, 100),
        )
        .await
        .expect("phase");
        assert_eq!(target.keys(), 400);
        let put = &out.tallies["put"];
        assert_eq!(put.ops, 400);
        assert_eq!(put.steps, 40);
        assert_eq!(put.hist.count(), 40);
        assert_eq!(put.error_count(), 0);
        assert_eq!(
            out.after.devices["wal"].ios - out.before.devices["wal"].ios,
            4
        );
    }

    #[tokio::test]
    async fn a_phase_records_each_operation_per_second() {
        let target = MemoryTarget::default();
        let out = run_phase(
            &target,
            &plan(Stop::Exhausted { total_ops: 400 }, Pacing::Closed),
            writers(4, 100),
        )
        .await
        .expect("phase");
        // A window well under a second is one point, its rate over the window.
        let line = &out.timelines["put"];
        assert_eq!(line.len(), 1, "{line:?}");
        let ops = line[0].ops_per_sec * out.elapsed.as_secs_f64();
        assert!((ops - 400.0).abs() < 1e-6, "{ops}");
        assert!(line[0].p99_us > 0.0);
    }

    #[tokio::test]
    async fn a_phase_longer_than_the_idle_timeout_still_reads_stats_after_it() {
        // The monitor connection is quiet while the tasks run; a server
        // closes it once the phase outlasts its idle timeout.
        let mut target = MemoryTarget::default();
        target.idle_close = Some(Duration::from_millis(40));
        let out = run_phase(
            &target,
            &plan(
                Stop::Exhausted { total_ops: 100 },
                Pacing::Open { ops_per_sec: 500.0 },
            ),
            writers(1, 100),
        )
        .await
        .expect("phase");
        // 10 steps, one every 20 ms: about 200 ms, five idle timeouts.
        assert_eq!(out.tallies["put"].ops, 100);
        assert_eq!(out.after.keys, 100);
    }

    #[tokio::test]
    async fn step_budget_counts_exactly_that_many_steps_after_warmup() {
        let target = MemoryTarget::default();
        let stop = Stop::Steps {
            warmup: Duration::from_millis(20),
            steps: 7,
        };
        let out = run_phase(&target, &plan(stop, Pacing::Closed), writers(3, u64::MAX))
            .await
            .expect("phase");
        let put = &out.tallies["put"];
        assert_eq!(put.steps, 7);
        assert_eq!(put.ops, 70);
        // The warm-up wrote keys too, but they were not counted.
        assert!(target.keys() >= 70);
    }

    #[tokio::test]
    async fn open_loop_paces_steps_by_the_schedule() {
        let target = MemoryTarget::default();
        // 2 tasks x 10 ops per step at 2,000 ops/s: one step every 10 ms per task.
        let stop = Stop::Time {
            warmup: Duration::ZERO,
            measure: Duration::from_millis(100),
        };
        let out = run_phase(
            &target,
            &plan(
                stop,
                Pacing::Open {
                    ops_per_sec: 2_000.0,
                },
            ),
            writers(2, u64::MAX),
        )
        .await
        .expect("phase");
        let steps = out.tallies["put"].steps;
        // 100 ms / 10 ms = 10 steps per task; the schedule, not the speed of
        // the target, decides the count.
        assert_eq!(steps, 20, "steps {steps}");
    }

    /// Takes at least 20 ms per step.
    struct Slow;

    impl Work for Slow {
        fn operations(&self) -> Vec<&'static str> {
            vec!["put"]
        }

        async fn step<S: Session>(
            &mut self,
            _session: &mut S,
            ctx: &mut StepContext<'_>,
        ) -> Result<StepOutcome, TargetError> {
            tokio::time::sleep(Duration::from_millis(20)).await;
            ctx.complete("put", 1);
            Ok(StepOutcome::Ran { ops: 1 })
        }
    }

    #[tokio::test]
    async fn open_loop_that_falls_behind_counts_missed_batches() {
        let target = MemoryTarget::default();
        // One step every 5 ms for 50 ms = 10 scheduled; each takes >= 20 ms.
        let stop = Stop::Time {
            warmup: Duration::ZERO,
            measure: Duration::from_millis(50),
        };
        let mut p = plan(stop, Pacing::Open { ops_per_sec: 200.0 });
        p.batch = 1;
        let out = run_phase(&target, &p, vec![Slow]).await.expect("phase");
        let sent = out.tallies["put"].steps;
        assert!(sent <= 3, "sent {sent}");
        assert_eq!(sent + out.missed_batches, 10);
        // Late sends carry their queueing delay: the last one waited >= 20 ms.
        assert!(out.tallies["put"].hist.summary().max >= 20_000.0);
    }

    #[test]
    fn window_counts_grid_steps() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        // Steps at 0, 5, 10, ...: [10, 50) holds 10..45 = 8 steps.
        assert_eq!(scheduled_in_window(t0, ms(5), t0 + ms(10), t0 + ms(50)), 8);
        // Starting mid-window: steps 15..45 = 7.
        assert_eq!(
            scheduled_in_window(t0 + ms(15), ms(5), t0 + ms(10), t0 + ms(50)),
            7
        );
        // A window entirely before the first step.
        assert_eq!(scheduled_in_window(t0 + ms(60), ms(5), t0, t0 + ms(50)), 0);
    }

    #[tokio::test]
    async fn open_loop_far_behind_still_reports_every_operation() {
        let target = MemoryTarget::default();
        // The warm-up alone schedules 3 steps per 20 ms step: nothing
        // scheduled in the window is ever sent.
        let stop = Stop::Time {
            warmup: Duration::from_millis(60),
            measure: Duration::from_millis(30),
        };
        let mut p = plan(
            stop,
            Pacing::Open {
                ops_per_sec: 1000.0,
            },
        );
        p.batch = 1;
        let out = run_phase(&target, &p, vec![Slow]).await.expect("phase");
        let put = &out.tallies["put"];
        assert_eq!(put.steps, 0);
        assert_eq!(out.missed_batches, 30);
    }

    #[tokio::test]
    async fn zero_tasks_is_an_error() {
        let target = MemoryTarget::default();
        let r = run_phase(
            &target,
            &plan(Stop::Exhausted { total_ops: 0 }, Pacing::Closed),
            Vec::<Writer>::new(),
        )
        .await;
        assert!(matches!(r, Err(DriverError::NoTasks)));
    }
}
