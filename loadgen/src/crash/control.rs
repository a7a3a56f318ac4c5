//! The controller of a crash run: start the child, start the clients,
//! kill / restart / audit on the schedule, read back at the end, build the
//! report's rows and crash summary.

use super::audit::{self, Finding, Versioned};
use super::clients::{self, Mix, Phase, INITIAL_BALANCE};
use super::process::{ProcessError, ServerProcess, ServerSpec};
use super::report::{AuditResult, CrashEvent, CrashSummary, LostKey, LOST_LISTED_MAX};
use super::timeline::Timeline;
use super::{AckLog, CrashPlan, Shared};
use crate::driver::{PhaseOutcome, Tallies};
use crate::keys::{fnv64, key_name, Rng};
use crate::report::{rows_from_phase, ResultRow};
use crate::ringkv::RingkvTarget;
use crate::settings::Settings;
use crate::stats::{ServerSnapshot, StatsError};
use crate::target::{Op, Reply, Session, Target, TargetError};
use bytes::Bytes;
use std::collections::VecDeque;
use std::future::Future;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// Why a crash run could not go on (a lost write is a finding, not this).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CrashError {
    #[error("crash run: {0}")]
    Process(#[from] ProcessError),
    #[error("crash run: {0}")]
    Target(#[from] TargetError),
    #[error("crash run: {0}")]
    Stats(#[from] StatsError),
    #[error("crash run: cannot make the data directory: {0}")]
    DataDir(std::io::Error),
    #[error("crash run: {0}")]
    Join(String),
}

/// Rows for the workload's tables and the crash summary.
pub struct CrashOutcome {
    pub rows: Vec<ResultRow>,
    pub summary: CrashSummary,
}

/// Where a crash run happens.
#[derive(Debug, Clone, Copy)]
pub struct RunOn {
    pub profile: &'static str,
    pub durability: &'static str,
    pub tier: &'static str,
    pub shards: u32,
}

/// Keys the audit reads per request.
const AUDIT_BATCH: usize = 500;
/// Connections the audit reads over.
const AUDIT_CONNECTIONS: usize = 4;

/// Runs `mix` under kills as `plan` says; `workload` names it in the report.
pub async fn run(
    plan: &CrashPlan,
    s: &Settings,
    mix: Mix,
    workload: &str,
    on: RunOn,
) -> Result<CrashOutcome, CrashError> {
    let dir = tempfile::Builder::new()
        .prefix("loadgen-crash-")
        .tempdir()
        .map_err(CrashError::DataDir)?;
    let spec = ServerSpec {
        command: plan.server_command.clone(),
        data_dir: dir.path().join("data"),
        durability: on.durability,
        tier: on.tier,
        profile: on.profile,
        shards: on.shards,
        log: dir.path().join("server.log"),
    };
    eprintln!(
        "[{} {}] crash run: {} on a ringkv-server process (tier {}), data in {}",
        on.profile,
        on.durability,
        workload,
        on.tier,
        spec.data_dir.display()
    );
    let mut server = start(&spec, plan.ready_within).await?;
    let shared = Arc::new(shared_state(plan, s, mix, &server, on.durability));
    if mix == Mix::Bank {
        open_accounts(&shared).await?;
    }
    // STATS restart from zero with each server life: a life's counters run
    // from its reading when the clients (re)start to its last reading.
    let mut lives = Lives {
        start: snapshot(&shared).await?,
        ended: Vec::new(),
        kills: 0,
    };
    let handles: Vec<_> = (0..s.threads)
        .map(|i| tokio::spawn(clients::client(shared.clone(), i, mix)))
        .collect();
    // Kills come every --crash-every; a log also gets a line between them.
    let lines = {
        let shared = shared.clone();
        let start = tokio::time::Instant::now();
        crate::driver::progress_lines(
            s.progress,
            &format!("{} {} crash run {workload}", on.profile, on.durability),
            start,
            start,
            move || shared.timeline.total_ops(),
        )
    };
    let mut crashes = Vec::new();
    let mut rng = Rng::new(s.seed, 0xC8A5);
    let mut active = Duration::ZERO;
    while let Some(gap) = next_gap(plan, &mut rng, active, crashes.len()) {
        tokio::time::sleep(gap).await;
        active += gap;
        let (event, restarted) =
            kill_and_restart(plan, &spec, &shared, server, mix, &mut lives).await?;
        server = restarted;
        crashes.push(event);
    }
    tokio::time::sleep(plan.duration.saturating_sub(active)).await;
    pause(&shared, plan.timeout).await;
    drop(lines);
    // The last life ends with the clients: its reading is exact.
    lives.end(Some(snapshot(&shared).await?));
    let final_audit = read_back(&shared, mix, None).await?;
    let _ = shared.phase.send(Phase::Done);
    let mut tallies = Tallies::new();
    for h in handles {
        let t = h.await.map_err(|e| CrashError::Join(e.to_string()))?;
        for (kind, tally) in t {
            tallies.entry(kind).or_default().merge(&tally);
        }
    }
    let stopped = tokio::task::spawn_blocking(move || server.stop(Duration::from_secs(10)));
    stopped
        .await
        .map_err(|e| CrashError::Join(e.to_string()))??;
    let end_s = shared.timeline.since_start(Instant::now()).as_secs_f64();
    let rows = rows_of(workload, tallies, plan.duration, &lives, s)?;
    let summary = summarize(plan, &shared, workload, on, crashes, final_audit, end_s);
    drop(dir);
    Ok(CrashOutcome { rows, summary })
}

async fn start(spec: &ServerSpec, within: Duration) -> Result<ServerProcess, CrashError> {
    let spec = spec.clone();
    let server = tokio::task::spawn_blocking(move || spec.start(within))
        .await
        .map_err(|e| CrashError::Join(e.to_string()))??;
    eprintln!(
        "  server pid {} ready on {} ({:.0} ms after spawn)",
        server.pid(),
        server.addr,
        server.start_to_ready.as_secs_f64() * 1e3
    );
    Ok(server)
}

fn shared_state(
    plan: &CrashPlan,
    s: &Settings,
    mix: Mix,
    server: &ServerProcess,
    durability: &str,
) -> Shared {
    let async_run = durability == "async";
    let keys = if mix == Mix::Bank {
        s.txn_range.max(2)
    } else {
        s.records
    };
    let window = async_window(plan);
    let width = Duration::from_secs_f64((plan.duration.as_secs_f64() / 240.0).clamp(0.1, 1.0));
    Shared {
        table: audit::VersionTable::new(keys),
        addr: RwLock::new(server.addr.clone()),
        phase: tokio::sync::watch::Sender::new(Phase::Running),
        parked: Default::default(),
        timeline: Timeline::new(Instant::now(), width),
        audit_keys_max: plan.audit_keys_max,
        keeps_nothing: durability == "none",
        async_window: async_run.then_some(window),
        acknowledged: Default::default(),
        acks: async_run.then(|| AckLog {
            keep: (window * 4).max(Duration::from_secs(2)),
            acks: Mutex::new(VecDeque::new()),
        }),
        value_bytes: s.shape.value_bytes(),
        threads: s.threads,
        batch: s.batch,
        timeout: plan.timeout,
        seed: s.seed,
    }
}

/// The server's flush interval (its default config) plus the slack.
pub fn async_window(plan: &CrashPlan) -> Duration {
    tunables::Config::default().storage.flush_interval.0 + plan.async_slack
}

/// The next stretch of active time before a kill, or None when no more
/// kill fits (or `--crashes` is reached).
fn next_gap(plan: &CrashPlan, rng: &mut Rng, active: Duration, done: usize) -> Option<Duration> {
    if plan.crashes.is_some_and(|n| done >= n as usize) {
        return None;
    }
    let gap = plan.interval.mul_f64(0.5 + rng.next_f64());
    (active + gap < plan.duration).then_some(gap)
}

/// Waits (bounded) until every client is parked, so every answer the
/// server gave has been counted.
async fn pause(shared: &Shared, timeout: Duration) {
    let _ = shared.phase.send(Phase::Paused);
    let deadline = Instant::now() + timeout + Duration::from_secs(1);
    while shared.parked.load(SeqCst) < shared.threads && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// The server's STATS over its lives (each restart counts from zero).
struct Lives {
    /// STATS of the current life when the clients (re)started.
    start: ServerSnapshot,
    /// Finished lives: (start, last reading).
    ended: Vec<(ServerSnapshot, ServerSnapshot)>,
    /// Killed lives: the I/O between the last reading and the SIGKILL is
    /// not known, so their figures are lower bounds.
    kills: usize,
}

impl Lives {
    /// Ends the current life at `last` (None: no reading, the life adds
    /// nothing known).
    fn end(&mut self, last: Option<ServerSnapshot>) {
        let last = last.unwrap_or_else(|| self.start.clone());
        self.ended.push((self.start.clone(), last));
    }
}

/// STATS read just before a kill, bounded so that a slow answer cannot
/// hold the kill back long (None: no reading).
async fn reading_before_kill(shared: &Shared) -> Option<ServerSnapshot> {
    let within = Duration::from_secs(2).min(shared.timeout);
    match tokio::time::timeout(within, snapshot(shared)).await {
        Ok(Ok(snap)) => Some(snap),
        Ok(Err(e)) => {
            eprintln!("  STATS before the kill failed ({e}): this life's counters are left out");
            None
        }
        Err(_) => {
            eprintln!("  STATS before the kill did not answer within {within:?}: this life's counters are left out");
            None
        }
    }
}

async fn kill_and_restart(
    plan: &CrashPlan,
    spec: &ServerSpec,
    shared: &Shared,
    server: ServerProcess,
    mix: Mix,
    lives: &mut Lives,
) -> Result<(CrashEvent, ServerProcess), CrashError> {
    lives.end(reading_before_kill(shared).await);
    lives.kills += 1;
    let killed = Instant::now();
    tokio::task::spawn_blocking(move || server.kill())
        .await
        .map_err(|e| CrashError::Join(e.to_string()))??;
    pause(shared, plan.timeout).await;
    if let Some(hook) = &plan.between_kill_and_restart {
        (hook.as_ref())(spec.data_dir.as_path());
    }
    let restarted = start(spec, plan.ready_within).await?;
    let ready_ms = killed.elapsed().as_secs_f64() * 1e3;
    let recovery = restarted.recovery();
    shared.set_addr(&restarted.addr);
    let audit = read_back(shared, mix, Some(killed)).await?;
    // The new life counts from here: recovery and the read-back are not
    // the workload's.
    lives.start = snapshot(shared).await?;
    let _ = shared.phase.send(Phase::Running);
    eprintln!(
        "  kill at {:.1} s: ready after {ready_ms:.0} ms, read back {} keys, {} lost",
        shared.timeline.since_start(killed).as_secs_f64(),
        audit.keys_checked,
        audit.lost
    );
    let event = CrashEvent {
        kill_at_s: shared.timeline.since_start(killed).as_secs_f64(),
        ready_ms,
        start_ms: restarted.start_to_ready.as_secs_f64() * 1e3,
        recovery,
        audit,
        before: Default::default(),
        after: Default::default(),
    };
    Ok((event, restarted))
}

/// Whether the audit reads `keynum` (every key, or a uniform sample).
fn sampled(keynum: u64, keys: u64, max: u64, salt: u64) -> bool {
    keys <= max || fnv64(keynum ^ salt) % keys < max
}

/// Reads back the keys (all, or a sample) and checks each by the rule;
/// lowers the table to what a kill lost. `killed`: the kill it follows.
async fn read_back(
    shared: &Shared,
    mix: Mix,
    killed: Option<Instant>,
) -> Result<AuditResult, CrashError> {
    let began = Instant::now();
    let keys = shared.table.keys();
    let max = if mix == Mix::Bank {
        u64::MAX
    } else {
        shared.audit_keys_max.max(1)
    };
    let salt = killed.map_or(0, |k| shared.timeline.since_start(k).as_nanos() as u64);
    let wanted: Vec<u64> = (0..keys).filter(|&k| sampled(k, keys, max, salt)).collect();
    let target = RingkvTarget::new(shared.addr(), shared.timeout);
    let chunks: Vec<Vec<u64>> = wanted
        .chunks(wanted.len().div_ceil(AUDIT_CONNECTIONS).max(1))
        .map(<[u64]>::to_vec)
        .collect();
    let mut tasks = Vec::new();
    for chunk in chunks {
        let target = target.clone();
        let session = target.connect().await?;
        tasks.push(read_chunk(session, chunk, shared));
    }
    let mut result = AuditResult {
        keys_checked: wanted.len() as u64,
        sampled: wanted.len() as u64 != keys,
        ..AuditResult::default()
    };
    let mut lost = Vec::new();
    let mut balance = 0i64;
    for part in futures_join(tasks).await {
        let part = part?;
        merge(&mut result, &part);
        lost.extend(part.lost);
        balance += part.balance;
    }
    if mix == Mix::Bank {
        result.bank_total = Some(balance);
        result.bank_expected = Some(keys as i64 * INITIAL_BALANCE);
    }
    settle_losses(shared, &mut result, &lost, killed);
    result.audit_ms = began.elapsed().as_secs_f64() * 1e3;
    Ok(result)
}

/// Runs the futures on this task, concurrently.
async fn futures_join<F: Future>(tasks: Vec<F>) -> Vec<F::Output> {
    let mut pinned: Vec<_> = tasks.into_iter().map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = (0..pinned.len()).map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (i, f) in pinned.iter_mut().enumerate() {
            if out[i].is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => out[i] = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    out.into_iter()
        .map(|o| o.expect("every future finished"))
        .collect()
}

/// One connection's part of a read-back.
#[derive(Default)]
struct ChunkFindings {
    result: AuditResult,
    lost: Vec<(u64, u32, u32)>,
    balance: i64,
}

async fn read_chunk<S: Session>(
    mut session: S,
    keys: Vec<u64>,
    shared: &Shared,
) -> Result<ChunkFindings, CrashError> {
    let mut f = ChunkFindings::default();
    for batch in keys.chunks(AUDIT_BATCH) {
        let ops = batch
            .iter()
            .map(|&k| Op::Get {
                key: Bytes::from(key_name(k)),
            })
            .collect();
        let replies = session.batch(ops).await?;
        for (&k, r) in batch.iter().zip(&replies) {
            let got = match r {
                Reply::Value(v) => Some(v.as_ref()),
                _ => None,
            };
            let (finding, value) = audit::check(&shared.table, k, got);
            note_finding(&mut f, k, finding, value);
        }
    }
    Ok(f)
}

fn note_finding(f: &mut ChunkFindings, keynum: u64, finding: Finding, value: Option<Versioned>) {
    if let Some(v) = value {
        f.balance += v.balance;
    }
    match finding {
        Finding::Ok => {}
        Finding::Lost { acked, found } => f.lost.push((keynum, acked, found)),
        Finding::Phantom { .. } => f.result.phantom += 1,
        Finding::Malformed(_) => f.result.malformed += 1,
        Finding::WrongKey { .. } => f.result.wrong_key += 1,
    }
}

fn merge(into: &mut AuditResult, part: &ChunkFindings) {
    into.phantom += part.result.phantom;
    into.malformed += part.result.malformed;
    into.wrong_key += part.result.wrong_key;
}

/// Counts and lists the lost keys, times them against the kill (async),
/// and lowers the table so later audits count only later losses.
fn settle_losses(
    shared: &Shared,
    r: &mut AuditResult,
    lost: &[(u64, u32, u32)],
    killed: Option<Instant>,
) {
    let pairs: Vec<(u64, u32)> = lost.iter().map(|&(k, _, found)| (k, found)).collect();
    let acked_at = shared.oldest_lost_acks(&pairs);
    r.lost = lost.len() as u64;
    for (&(keynum, acked, found), at) in lost.iter().zip(acked_at) {
        let before_ms = match (at, killed) {
            (Some(at), Some(k)) => Some(k.saturating_duration_since(at).as_secs_f64() * 1e3),
            _ => None,
        };
        let inside = shared.keeps_nothing
            || match (before_ms, shared.async_window) {
                (Some(ms), Some(w)) => ms <= w.as_secs_f64() * 1e3,
                _ => false,
            };
        if !inside {
            r.outside_window += 1;
        }
        if r.lost_keys.len() < LOST_LISTED_MAX {
            r.lost_keys.push(LostKey {
                keynum,
                acked,
                found,
                acked_before_kill_ms: before_ms,
            });
        }
        shared.table.lower_acked(keynum, found);
    }
    shared.forget_judged_acks(lost);
}

/// Writes version 1 of every bank account with the initial balance.
async fn open_accounts(shared: &Shared) -> Result<(), CrashError> {
    let target = RingkvTarget::new(shared.addr(), shared.timeout);
    let mut session = target.connect().await?;
    let keys: Vec<u64> = (0..shared.table.keys()).collect();
    for batch in keys.chunks(AUDIT_BATCH) {
        let mut ops = Vec::with_capacity(batch.len());
        for &k in batch {
            let version = shared.table.next_version(k);
            let v = Versioned {
                keynum: k,
                version,
                balance: INITIAL_BALANCE,
            };
            ops.push(Op::Put {
                key: Bytes::from(key_name(k)),
                value: audit::encode(v, shared.value_bytes),
            });
        }
        let replies = session.batch(ops).await?;
        for (&k, r) in batch.iter().zip(&replies) {
            if *r == Reply::Done {
                shared.table.acknowledge(k, 1);
                shared.note_ack(k, 1);
            }
        }
    }
    Ok(())
}

async fn snapshot(shared: &Shared) -> Result<ServerSnapshot, CrashError> {
    let target = RingkvTarget::new(shared.addr(), shared.timeout);
    let pairs = target.connect().await?.stats().await?;
    Ok(ServerSnapshot::parse(&pairs)?)
}

fn rows_of(
    workload: &str,
    tallies: Tallies,
    active: Duration,
    lives: &Lives,
    s: &Settings,
) -> Result<Vec<ResultRow>, CrashError> {
    let ops: u64 = tallies.values().map(|t| t.ops).sum();
    let outcome = PhaseOutcome {
        tallies,
        elapsed: active,
        before: ServerSnapshot::default(),
        after: crate::stats::sum_of_lives(&lives.ended)?,
        ops_per_sec: ops as f64 / active.as_secs_f64().max(1e-9),
        missed_batches: 0,
        timelines: Default::default(),
    };
    let mut rows = rows_from_phase(
        workload,
        &outcome,
        &["put", "get", "tx", "abort"],
        None,
        s.mode(),
    )?;
    let kills = lives.kills;
    for r in &mut rows {
        r.counters_lower_bound = kills > 0;
        r.note = Some(format!(
            "under kills ({kills} kill{}): time is the clients' active time; device and WAL counters are summed over the server's {} lives, each from the clients' (re)start to its last STATS reading{}",
            if kills == 1 { "" } else { "s" },
            lives.ended.len(),
            if kills > 0 {
                ", so they are lower bounds (≥): the I/O between the reading just before each kill and the SIGKILL is not counted"
            } else {
                ""
            }
        ));
    }
    Ok(rows)
}

fn summarize(
    plan: &CrashPlan,
    shared: &Shared,
    workload: &str,
    on: RunOn,
    mut crashes: Vec<CrashEvent>,
    final_audit: AuditResult,
    end_s: f64,
) -> CrashSummary {
    let window_s = (plan.interval.as_secs_f64() / 2.0).min(2.0);
    for c in &mut crashes {
        c.before = shared.timeline.window(c.kill_at_s - window_s, c.kill_at_s);
        let resumed_s = c.kill_at_s + (c.ready_ms + c.audit.audit_ms) / 1e3;
        c.after = shared.timeline.window(resumed_s, resumed_s + window_s);
    }
    let lost = crashes.iter().map(|c| c.audit.lost).sum::<u64>() + final_audit.lost;
    CrashSummary {
        device: on.profile.to_string(),
        durability: on.durability.to_string(),
        tier: on.tier.to_string(),
        workload: workload.to_string(),
        server_command: plan.server_command.clone(),
        interval_s: plan.interval.as_secs_f64(),
        async_window_ms: (on.durability == "async").then(|| async_window(plan).as_secs_f64() * 1e3),
        acknowledged: shared.acknowledged.load(SeqCst),
        lost,
        crashes,
        final_audit,
        timeline: shared.timeline.points(end_s),
        window_s,
    }
}
