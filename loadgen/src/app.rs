//! What `loadgen` does when run: resolve the flags, start an embedded server
//! per device class (or use `--server`), run the workload, print the report,
//! write `--json` / `--plot`, and choose the exit code.
//!
//! What must hold:
//! - Each device class (and each durability, and each sweep size) gets a fresh
//!   embedded server on a fresh data directory, so runs cannot contaminate
//!   each other.
//! - Results already measured are printed even if a later run fails.
//! - The exit code is non-zero if anything failed or any answer was wrong:
//!   0 = all good, 1 = wrong/failed answers, 2 = could not run,
//!   130 = interrupted (SIGINT/SIGTERM; temporary data is removed first).

use crate::cli::{
    format_count, Cli, Command, DurabilityArg, RunArgs, TargetArg, TierArg, WorkloadArg,
};
use crate::driver::DriverError;
use crate::embedded::{EmbeddedError, EmbeddedServer, EmbeddedStorage};
use crate::engine_target::{DbTarget, EngineTarget};
use crate::keys::InsertSequence;
use crate::machine::{utc_now_rfc3339, Machine};
use crate::plot::{plot, PlotError};
use crate::record::ValuePool;
use crate::report::{Report, ReportError, ResultRow, RunSettings, Status, SCHEMA};
use crate::ringkv::RingkvTarget;
use crate::settings::{Measure, Settings};
use crate::target::{Session, Target};
use crate::workloads::tiered::{self, TieredSummary};
use crate::workloads::{gridgain, sweep, ycsb};
use crate::{compare, render};
use std::io::IsTerminal;
use std::path::Path;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AppError {
    #[error(transparent)]
    Cli(#[from] crate::cli::CliError),
    #[error(transparent)]
    Driver(#[from] DriverError),
    #[error(transparent)]
    Embedded(#[from] EmbeddedError),
    #[error(transparent)]
    Report(#[from] ReportError),
    #[error(transparent)]
    Plot(#[from] PlotError),
    #[error("connection flags: {0}")]
    Connect(String),
    #[error("cannot start the tokio runtime: {0}")]
    Runtime(std::io::Error),
    #[error("a blocking task (embedded server start/stop) failed: {0}")]
    Join(String),
    #[error("interrupted by {signal}; results measured so far are shown above")]
    Interrupted { signal: &'static str },
    #[error("{0}")]
    DoesNotFit(String),
    #[error(transparent)]
    Crash(#[from] crate::crash::CrashError),
}

/// Runs the parsed command line; returns the process exit code.
pub fn main_with(cli: Cli) -> ExitCode {
    let outcome = match cli.command {
        Some(Command::Compare { base, new, plot }) => run_compare(&base, &new, plot.as_deref()),
        Some(Command::Plot { report, out }) => run_plot(&report, &out),
        None => run_benchmark(&cli.run),
    };
    match outcome {
        Ok(code) => code,
        Err(e @ AppError::Interrupted { .. }) => {
            eprintln!("loadgen: {e}");
            ExitCode::from(130)
        }
        Err(e) => {
            eprintln!("loadgen: error: {e}");
            ExitCode::from(2)
        }
    }
}

/// The first SIGINT/SIGTERM, as seen by the async side.
struct Interrupt {
    notify: Notify,
    signal: Mutex<&'static str>,
}

/// Takes SIGINT/SIGTERM on a dedicated thread (the server crate's handler, no
/// code in signal context): the first one stops the run cleanly — embedded
/// servers shut down and their temporary data directories are removed — and a
/// second one exits at once. Must run before any thread is started.
fn install_interrupt() -> Option<Arc<Interrupt>> {
    use ringkv_server::signals::{block_termination_signals, spawn_signal_thread};
    if let Err(e) = block_termination_signals() {
        eprintln!(
            "loadgen: warning: cannot take over SIGINT/SIGTERM ({e}); Ctrl-C will not clean up"
        );
        return None;
    }
    let interrupt = Arc::new(Interrupt {
        notify: Notify::new(),
        signal: Mutex::new(""),
    });
    let seen = interrupt.clone();
    let mut count = 0u32;
    let spawned = spawn_signal_thread(move |signal| {
        count += 1;
        if count > 1 {
            eprintln!(
                "loadgen: second {}, exiting now (temporary data may be left behind)",
                signal.name()
            );
            std::process::exit(130);
        }
        eprintln!(
            "loadgen: {} — stopping and removing temporary data (again to exit at once)",
            signal.name()
        );
        *seen.signal.lock().unwrap_or_else(|e| e.into_inner()) = signal.name();
        seen.notify.notify_one();
    });
    match spawned {
        Ok(_) => Some(interrupt),
        Err(e) => {
            eprintln!("loadgen: warning: cannot start the signal thread ({e}); SIGINT/SIGTERM are ignored");
            None
        }
    }
}

async fn interrupted(interrupt: Option<Arc<Interrupt>>) -> AppError {
    match interrupt {
        Some(i) => {
            i.notify.notified().await;
            let signal = *i.signal.lock().unwrap_or_else(|e| e.into_inner());
            AppError::Interrupted { signal }
        }
        None => std::future::pending().await,
    }
}

fn run_compare(base: &Path, new: &Path, plot: Option<&Path>) -> Result<ExitCode, AppError> {
    let b = Report::read_json(base)?;
    let n = Report::read_json(new)?;
    if let Some(out) = plot {
        crate::plot::plot_compare(
            &b,
            &base.display().to_string(),
            &n,
            &new.display().to_string(),
            out,
        )?;
        eprintln!("loadgen: wrote {}", out.display());
    }
    print!(
        "{}",
        compare::compare(
            &b,
            &base.display().to_string(),
            &n,
            &new.display().to_string()
        )
    );
    Ok(ExitCode::SUCCESS)
}

fn run_plot(report: &Path, out: &Path) -> Result<ExitCode, AppError> {
    let r = Report::read_json(report)?;
    plot(&r, out)?;
    eprintln!("loadgen: wrote {}", out.display());
    Ok(ExitCode::SUCCESS)
}

fn command_line() -> String {
    std::env::args()
        .map(|a| {
            if a.is_empty() || a.contains(|c: char| c.is_whitespace() || "'\"$\\".contains(c)) {
                format!("'{}'", a.replace('\'', "'\\''"))
            } else {
                a
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn run_benchmark(args: &RunArgs) -> Result<ExitCode, AppError> {
    let settings = args.settings(std::io::stderr().is_terminal())?;
    let crash_plan = args.crash_plan(&settings)?;
    if args.workload == WorkloadArg::Sweep && args.server.is_none() && crash_plan.is_none() {
        check_sweep_fits(args, &settings)?;
    }
    let interrupt = install_interrupt();
    let machine = Machine::detect();
    let mut report = Report {
        schema: SCHEMA.to_string(),
        loadgen_version: env!("CARGO_PKG_VERSION").to_string(),
        started_at: utc_now_rfc3339(),
        command_line: command_line(),
        machine: machine.clone(),
        run: run_settings(args, &settings, &machine),
        results: Vec::new(),
        crash: Vec::new(),
        tiered: Vec::new(),
        published: Vec::new(),
    };
    if crash_plan.is_none() {
        report.published = Report::published_rows_for(&report.run.workload);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(AppError::Runtime)?;
    // On a signal the run's future is dropped: embedded servers shut down
    // (RunningServer's Drop) and their data directories are removed (TempDir).
    let (results, crashes, tiered) = (&mut report.results, &mut report.crash, &mut report.tiered);
    let outcome = runtime.block_on(async {
        tokio::select! {
            r = run_chosen(args, &settings, crash_plan.as_ref(), results, crashes, tiered) => r,
            e = interrupted(interrupt) => Err(e),
        }
    });
    drop(runtime);

    print!("{}", render::render(&report));
    if let Some(path) = &args.json {
        report.write_json(path)?;
        eprintln!("loadgen: wrote {}", path.display());
    }
    if let Some(path) = &args.plot {
        if report
            .results
            .iter()
            .any(|r| r.status != Status::Unsupported)
        {
            plot(&report, path)?;
            eprintln!("loadgen: wrote {}", path.display());
        }
    }
    outcome?;
    Ok(if report.has_errors() {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// Refuses, before anything runs, sweep sizes that cannot fit in this
/// machine's RAM or in the temporary directory's file system.
fn check_sweep_fits(args: &RunArgs, s: &Settings) -> Result<(), AppError> {
    let (key, value) = s.sweep_items.item_bytes();
    let logs = args
        .durabilities()
        .iter()
        .any(|d| *d != DurabilityArg::None);
    let shards = match args.shard_count() {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get() as u64),
        n => u64::from(n),
    };
    let config = tunables::Config::default();
    let shard_disk = crate::capacity::per_shard_disk_bytes(&config);
    let storage = args.storage();
    let needs: Vec<crate::capacity::Need> = s
        .sweep_sizes
        .iter()
        .map(|&n| {
            let items = n + s.sweep_warmup_ops;
            match storage.tier {
                TierArg::Memory => crate::capacity::need(
                    n,
                    items,
                    key as u64,
                    value as u64,
                    logs,
                    shards,
                    shard_disk,
                ),
                TierArg::Hybrid => crate::capacity::need_hybrid(
                    n,
                    items,
                    key as u64,
                    value as u64,
                    storage.cache_bytes.unwrap_or(config.storage.cache_bytes).0,
                    shards,
                    shard_disk,
                ),
            }
        })
        .collect();
    crate::capacity::check(
        &needs,
        crate::capacity::available_ram_bytes(),
        crate::capacity::available_disk_bytes(&std::env::temp_dir()),
    )
    .map_err(AppError::DoesNotFit)
}

fn run_settings(args: &RunArgs, s: &Settings, machine: &Machine) -> RunSettings {
    let mut notes = Vec::new();
    if args.crash_run() {
        notes.push(format!(
            "crash run: the server process and the {} client tasks share the machine's {} CPUs; no load phase and no warm-up (keys fill as the run writes them); the audit's rule is in docs/loadgen.md",
            s.threads, machine.cpus
        ));
    } else if args.server.is_none() {
        let what = match args.target_kind() {
            TargetArg::Engine => "the engine runs in this process (no TCP): its shard threads",
            TargetArg::Server => "the embedded server runs in this process: its shard threads",
        };
        notes.push(format!(
            "{what} and the {} client tasks share the machine's {} CPUs",
            s.threads, machine.cpus
        ));
    }
    match args.workload {
        WorkloadArg::Putget if args.crash_run() => {}
        WorkloadArg::Putget => notes.push(format!(
            "{} records preloaded (the GridGain report used 15M; raise with --records); keys uniform over them",
            format_count(s.records)
        )),
        WorkloadArg::Sweep if args.server.is_none() && args.target_kind() == TargetArg::Engine && s.pacing == crate::driver::Pacing::Closed && s.threads == 1 && args.shard_count() == 1 => notes.push(
            "in-process through the embedded API (ringkv_engine::Db, docs/embedding.md): the one shard runs on the client's own thread, one call per item (Db::put, Db::get; Db::batch with --batch above 1); each call is also timed and checked, which a bare loop does not pay (scripts/bench-embedded.sh runs one)".to_string()
        ),
        WorkloadArg::Sweep if args.server.is_none() && args.target_kind() == TargetArg::Engine && s.pacing == crate::driver::Pacing::Closed => notes.push(format!(
            "in-process: each client loop runs on one of the engine's {} shard thread(s), calling the engine as an embedding application does (operations of that shard run inline; with more shards, other shards' operations cross threads)",
            args.shard_count()
        )),
        _ => {}
    }
    match args.workload {
        WorkloadArg::Sweep => notes.push(format!(
            "sweep sizes {}; each size written then read on a fresh {} (or its own key range with --server)",
            s.sweep_sizes.iter().map(|n| format_count(*n)).collect::<Vec<_>>().join(", "),
            if args.target_kind() == TargetArg::Engine { "engine" } else { "server" }
        )),
        WorkloadArg::Putget => {}
        WorkloadArg::Tiered => {
            let plan = args.tiered_plan();
            let data = tiered::data_bytes(s.records, s.shape);
            let storage = args.storage();
            notes.push(format!(
                "tiered: three layouts, each on a fresh embedded server with the hybrid tier and {} MiB value segments: all-nvme (values and WAL on nvme), all-sas (values and WAL on sas), tiered (values on sas behind an nvme hot device of {:.1} MiB, {}% of the {:.1} MiB of values rounded to whole segments per shard, hot_promote_reads {}, hot_move_percent {}; WAL on the nvme device); read cache {} for the whole server",
                tiered::SEGMENT_BYTES >> 20,
                tiered_hot_bytes(args, s) as f64 / (1u64 << 20) as f64,
                plan.hot_percent,
                data as f64 / (1u64 << 20) as f64,
                plan.promote_reads,
                plan.move_percent,
                storage.cache_bytes.map_or_else(|| "the config's".to_string(), |b| b.to_string()),
            ));
            notes.push(format!(
                "measured: {}% GETs, {}% updates of loaded records, keys {}; cost: value segment bytes on each class x price per GB-month (GB = 2^30 B): nvme ${}, sas ${}, gpssd ${}",
                100 - plan.write_percent,
                plan.write_percent,
                plan.distributions
                    .iter()
                    .map(|d| match d {
                        ycsb::Distribution::Zipfian => "Zipfian (theta 0.99, scrambled: YCSB's)".to_string(),
                        ycsb::Distribution::Hotspot { hot_set_percent, hot_ops_percent } => format!(
                            "hotspot ({hot_set_percent}% of the records get {hot_ops_percent}% of the operations: YCSB's)"
                        ),
                        _ => tiered::distribution_name(*d).to_string(),
                    })
                    .collect::<Vec<_>>()
                    .join(", then "),
                plan.prices.nvme,
                plan.prices.sas,
                plan.prices.gpssd
            ));
        }
        WorkloadArg::Putgettx | WorkloadArg::PutgettxContended => notes.push(format!(
            "PutGetTx over {} keys (Yardstick's --range default is 1,000,000); each client task has its own connection and one transaction at a time; aborted attempts (DIE/LOCK_TIMEOUT) are counted in the abort row and not retried (the next transaction picks new keys)",
            format_count(s.txn_range)
        )),
        _ => notes.push(
            "YCSB updates write the whole record (ringkv stores a record as one value); latency is per batch (use --batch 1 for per-operation latency)"
                .to_string(),
        ),
    }
    RunSettings {
        workload: args.workload.name().to_string(),
        target: match (&args.server, args.target_kind()) {
            _ if args.crash_run() => "process",
            (Some(_), _) => "server",
            (None, TargetArg::Server) => "embedded",
            (None, TargetArg::Engine) => "engine",
        }
        .to_string(),
        method: (args.workload == WorkloadArg::Sweep).then(|| sweep_method(args, s)),
        server_addr: args.server.clone(),
        devices: if args.server.is_some() {
            Vec::new()
        } else if args.workload == WorkloadArg::Tiered {
            tiered::LAYOUTS
                .iter()
                .map(|l| l.name().to_string())
                .collect()
        } else {
            args.devices().iter().map(|d| d.to_string()).collect()
        },
        threads: s.threads,
        batch: s.batch,
        records: s.records,
        duration_s: match s.measure {
            Measure::Time(d) => Some(d.as_secs_f64()),
            Measure::Ops(_) => None,
        },
        ops: match s.measure {
            Measure::Ops(n) => Some(n),
            Measure::Time(_) => None,
        },
        warmup_s: if args.crash_run() {
            0.0
        } else {
            s.warmup.as_secs_f64()
        },
        mode: s.mode().to_string(),
        rate_ops_per_sec: match s.pacing {
            crate::driver::Pacing::Open { ops_per_sec } => Some(ops_per_sec),
            crate::driver::Pacing::Closed => None,
        },
        seed: s.seed,
        field_count: s.shape.field_count,
        field_length: s.shape.field_length,
        sweep_sizes: if args.workload == WorkloadArg::Sweep {
            s.sweep_sizes.clone()
        } else {
            Vec::new()
        },
        shards: args.shard_count(),
        notes,
        txn_range: matches!(
            args.workload,
            WorkloadArg::Putgettx | WorkloadArg::PutgettxContended
        )
        .then_some(s.txn_range),
        allocator: Some(crate::allocator::global_allocator().to_string()),
    }
}

/// The sweep's method, for the report header: the document's, or what differs.
fn sweep_method(args: &RunArgs, s: &Settings) -> String {
    let document = s.threads == 1
        && s.batch == 1
        && s.sweep_reads.is_none()
        && s.sweep_items == sweep::ItemShape::Document
        && s.sweep_warmup_ops == sweep::DOCUMENT_WARMUP_OPS
        && (args.server.is_some() || args.target_kind() == TargetArg::Engine);
    format!(
        "{}: {}; writes i = 0 … N-1 in order, then {} reads uniform over [0, N); {} client{} x {} op{} per call; {} warm-up ops before each phase's clock",
        if document {
            "the MapDB/ChronicleMap document's method"
        } else {
            "the document's order with other settings"
        },
        s.sweep_items.describe(),
        match s.sweep_reads {
            None => "N".to_string(),
            Some(r) => format!("min(N, {})", format_count(r)),
        },
        s.threads,
        if s.threads == 1 { "" } else { "s" },
        s.batch,
        if s.batch == 1 { "" } else { "s" },
        format_count(s.sweep_warmup_ops)
    )
}

/// A crash run when the flags ask for one, the tiered workload's three
/// layouts, else [`run_all`].
async fn run_chosen(
    args: &RunArgs,
    s: &Settings,
    plan: Option<&crate::crash::CrashPlan>,
    rows: &mut Vec<ResultRow>,
    crashes: &mut Vec<crate::crash::report::CrashSummary>,
    tiered: &mut Vec<TieredSummary>,
) -> Result<(), AppError> {
    match plan {
        Some(plan) => run_crashes(args, s, plan, rows, crashes).await,
        None if args.workload == WorkloadArg::Tiered => run_tiered(args, s, rows, tiered).await,
        None => run_all(args, s, rows).await,
    }
}

/// The shards an embedded server will have (0 = one per core).
fn resolved_shards(args: &RunArgs) -> u64 {
    match args.shard_count() {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get() as u64),
        n => u64::from(n),
    }
}

/// The hot device's size of the tiered layout (whole server).
pub fn tiered_hot_bytes(args: &RunArgs, s: &Settings) -> u64 {
    tiered::hot_bytes(
        tiered::data_bytes(s.records, s.shape),
        args.tiered_plan().hot_percent,
        resolved_shards(args),
        tiered::SEGMENT_BYTES,
    )
}

/// The tiered workload: each layout on a fresh embedded server, one after
/// the other, appending rows and summaries as they are measured; the
/// summaries' ratios and aims are filled once all are in.
pub async fn run_tiered(
    args: &RunArgs,
    s: &Settings,
    rows: &mut Vec<ResultRow>,
    summaries: &mut Vec<TieredSummary>,
) -> Result<(), AppError> {
    let timeout = args.timeout;
    let plan = args.tiered_plan();
    let hot = tiered_hot_bytes(args, s);
    let mut storage = args.storage();
    if storage.index_keys.is_none() {
        let default = tunables::Config::default().storage.index_keys;
        storage.index_keys = Some(default.max(s.records + s.records / 8));
    }
    let durability = args
        .durabilities()
        .first()
        .copied()
        .unwrap_or(DurabilityArg::Sync);
    for layout in tiered::LAYOUTS {
        let server = start_embedded_with(
            layout.wal_profile(),
            durability,
            args.shard_count(),
            storage,
            move |c| {
                layout.apply(
                    c,
                    tiered::HotTuning {
                        bytes: hot,
                        promote_reads: plan.promote_reads,
                        move_percent: plan.move_percent,
                    },
                )
            },
        )
        .await?;
        eprintln!(
            "[{}] values on {}{}",
            layout.name(),
            layout.value_profile(),
            match layout.hot_profile() {
                Some(p) => format!(" behind a {p} hot device of {hot} bytes"),
                None => String::new(),
            }
        );
        let target = RingkvTarget::new(server.addr().to_string(), timeout);
        let got = tiered::run_layout(&target, s, &plan, layout, hot).await;
        let stopped = stop_embedded(server).await;
        let (got_rows, got_summaries) = got?;
        stopped?;
        announce(&got_rows);
        rows.extend(got_rows);
        summaries.extend(got_summaries);
        tiered::compare_layouts(summaries);
    }
    Ok(())
}

/// Crash runs: one per device class and durability (default `sync`), each
/// on its own server process and data directory.
pub async fn run_crashes(
    args: &RunArgs,
    s: &Settings,
    plan: &crate::crash::CrashPlan,
    rows: &mut Vec<ResultRow>,
    crashes: &mut Vec<crate::crash::report::CrashSummary>,
) -> Result<(), AppError> {
    let mix = crate::crash::mix_of(args.workload).ok_or(crate::cli::CliError::CrashRefused(
        "this workload has no crash run",
    ))?;
    let durabilities = match args.durability {
        Some(d) => vec![d],
        None => vec![DurabilityArg::Sync],
    };
    for device in args.devices() {
        for durability in &durabilities {
            let on = crate::crash::RunOn {
                profile: device,
                durability: durability.as_str(),
                tier: args.tier_kind().as_str(),
                shards: args.shard_count(),
            };
            let got = crate::crash::run(plan, s, mix, args.workload.name(), on).await?;
            announce(&got.rows);
            rows.extend(got.rows);
            crashes.push(got.summary);
        }
    }
    Ok(())
}

/// Runs everything the flags ask for, appending rows as they are measured.
pub async fn run_all(
    args: &RunArgs,
    s: &Settings,
    rows: &mut Vec<ResultRow>,
) -> Result<(), AppError> {
    let timeout = args.timeout;
    if let Some(addr) = &args.server {
        let options = args.connect.options(timeout).map_err(AppError::Connect)?;
        let target = RingkvTarget::with_options(addr.clone(), options);
        return run_on_target(&target, args.workload, s, "server", rows).await;
    }
    if args.connect.wants_tls() || args.connect.password_file.is_some() {
        return Err(AppError::Connect(
            "--tls, --ca, --insecure, --cert and --password-file apply to --server only".into(),
        ));
    }
    for device in args.devices() {
        for durability in args.durabilities() {
            // The sweep starts a fresh target per size; other workloads one.
            let sizes: Vec<Option<u64>> = if args.workload == WorkloadArg::Sweep {
                s.sweep_sizes.iter().map(|&n| Some(n)).collect()
            } else {
                vec![None]
            };
            for size in sizes {
                let kind = args.target_kind();
                // The hybrid index is sized for the items this run stores
                // (unless --index-keys says otherwise).
                let mut storage = args.storage();
                if storage.tier == TierArg::Hybrid && storage.index_keys.is_none() {
                    let items = match size {
                        Some(n) => n + s.sweep_warmup_ops,
                        None => s.records,
                    };
                    let default = tunables::Config::default().storage.index_keys;
                    storage.index_keys = Some(default.max(items + items / 8));
                }
                match kind {
                    // The sweep's single client on one shard: the embedded
                    // API, the way a program that links ringkv calls it.
                    TargetArg::Engine
                        if size.is_some()
                            && s.pacing == crate::driver::Pacing::Closed
                            && s.threads == 1
                            && args.shard_count() == 1 =>
                    {
                        let Some(n) = size else {
                            unreachable!("a sweep size")
                        };
                        let target = start_db(device, durability, storage).await?;
                        let on = sweep::SweepTarget::<EngineTarget>::Db(&target);
                        let got = sweep::run_size_on(on, s, n, 0, device).await;
                        if let Ok(got) = &got {
                            announce(got);
                        }
                        let stopped = tokio::task::spawn_blocking(move || target.stop())
                            .await
                            .map_err(|e| AppError::Join(e.to_string()))?;
                        rows.extend(got?);
                        stopped?;
                    }
                    TargetArg::Engine => {
                        let target =
                            start_engine(device, durability, args.shard_count(), storage).await?;
                        let got = match size {
                            // Closed loop: client loops on the engine's own threads.
                            Some(n) if s.pacing == crate::driver::Pacing::Closed => {
                                let on = sweep::SweepTarget::<EngineTarget>::Engine(&target);
                                match sweep::run_size_on(on, s, n, 0, device).await {
                                    Ok(got) => {
                                        announce(&got);
                                        rows.extend(got);
                                        Ok(())
                                    }
                                    Err(e) => Err(AppError::from(e)),
                                }
                            }
                            _ => run_one(&target, args.workload, s, size, device, rows).await,
                        };
                        // The run's own error, if any, matters more than a failed stop.
                        let stopped = stop_engine(target).await;
                        got?;
                        stopped?;
                    }
                    TargetArg::Server => {
                        let server =
                            start_embedded(device, durability, args.shard_count(), storage).await?;
                        let target = RingkvTarget::new(server.addr().to_string(), timeout);
                        let got = run_one(&target, args.workload, s, size, device, rows).await;
                        let stopped = stop_embedded(server).await;
                        got?;
                        stopped?;
                    }
                }
            }
        }
    }
    Ok(())
}

/// One sweep size (`Some(n)`) or the whole workload (`None`) on a fresh target.
async fn run_one<T: Target>(
    target: &T,
    workload: WorkloadArg,
    s: &Settings,
    size: Option<u64>,
    device: &str,
    rows: &mut Vec<ResultRow>,
) -> Result<(), AppError> {
    match size {
        Some(n) => {
            let got = sweep::run_size(target, s, n, 0, device).await?;
            announce(&got);
            rows.extend(got);
            Ok(())
        }
        None => run_on_target(target, workload, s, device, rows).await,
    }
}

/// A workload against one server that is already running (`--server`; the
/// embedded path also uses it for put/get and YCSB).
pub async fn run_on_target<T: Target>(
    target: &T,
    workload: WorkloadArg,
    s: &Settings,
    label: &str,
    rows: &mut Vec<ResultRow>,
) -> Result<(), AppError> {
    match workload {
        WorkloadArg::Putget => {
            let got = gridgain::run(target, s, label).await?;
            announce(&got);
            rows.extend(got);
        }
        WorkloadArg::Tiered => {
            return Err(AppError::Cli(crate::cli::CliError::TieredRefused(
                "starts its own servers (app::run_tiered); it cannot run on one given server",
            )));
        }
        WorkloadArg::Putgettx | WorkloadArg::PutgettxContended => {
            let got = crate::workloads::putgettx::run(target, s, label, workload.name()).await?;
            announce(&got);
            rows.extend(got);
        }
        WorkloadArg::Sweep => {
            // One server for every size: each size gets its own key range.
            for (i, &n) in s.sweep_sizes.iter().enumerate() {
                let got = sweep::run_size(target, s, n, sweep::namespace(i), label).await?;
                announce(&got);
                rows.extend(got);
            }
        }
        ycsb_workload => {
            let scan = target
                .connect()
                .await
                .map_err(DriverError::from)?
                .supports_scan();
            let mixes = ycsb_workload.ycsb_mixes();
            // No load when nothing can run (E alone without SCAN).
            if mixes.iter().any(|m| scan || m.scan == 0.0) {
                let pool = Arc::new(ValuePool::new(s.seed, s.shape));
                let load = gridgain::preload(target, s, &pool, label, "ycsb").await?;
                announce(&load);
                rows.extend(load);
            }
            let sequence = Arc::new(InsertSequence::new(s.records));
            for mix in mixes {
                let got = ycsb::run_mixes(target, s, &[mix], &sequence, scan, label).await?;
                announce(&got);
                rows.extend(got);
            }
        }
    }
    Ok(())
}

/// One progress line per result on stderr (visible in CI logs too).
fn announce(rows: &[ResultRow]) {
    for r in rows {
        let what = match r.items {
            Some(n) => format!("{} {} {}", r.workload, r.operation, format_count(n)),
            None => format!("{} {}", r.workload, r.operation),
        };
        match r.status {
            Status::Unsupported => eprintln!("[{}] {what}: unsupported", r.device),
            _ => eprintln!(
                "[{} {}] {what}: {:.1}K ops/s, batch avg {:.0} µs, p99 {:.0} µs{}",
                r.device,
                r.durability,
                r.throughput_kops,
                r.latency_us.avg,
                r.latency_us.p99,
                if r.status == Status::Errors {
                    " (ERRORS)"
                } else {
                    ""
                }
            ),
        }
    }
}

async fn start_embedded(
    profile: &'static str,
    durability: DurabilityArg,
    shards: u32,
    storage: EmbeddedStorage,
) -> Result<EmbeddedServer, AppError> {
    start_embedded_with(profile, durability, shards, storage, |_| {}).await
}

/// [`start_embedded`] with a change to the config first.
async fn start_embedded_with(
    profile: &'static str,
    durability: DurabilityArg,
    shards: u32,
    storage: EmbeddedStorage,
    edit: impl FnOnce(&mut tunables::Config) + Send + 'static,
) -> Result<EmbeddedServer, AppError> {
    let server = tokio::task::spawn_blocking(move || {
        EmbeddedServer::start_with(profile, durability, shards, storage, edit)
    })
    .await
    .map_err(|e| AppError::Join(e.to_string()))??;
    eprintln!(
        "[{profile} {}] embedded ringkv server on {} (tier {})",
        durability.as_str(),
        server.addr(),
        storage.tier.as_str()
    );
    Ok(server)
}

async fn start_engine(
    profile: &'static str,
    durability: DurabilityArg,
    shards: u32,
    storage: EmbeddedStorage,
) -> Result<EngineTarget, AppError> {
    let target = tokio::task::spawn_blocking(move || {
        EngineTarget::start(profile, durability, shards, storage)
    })
    .await
    .map_err(|e| AppError::Join(e.to_string()))??;
    eprintln!(
        "[{profile} {}] in-process ringkv engine (no TCP, tier {})",
        durability.as_str(),
        storage.tier.as_str()
    );
    Ok(target)
}

async fn start_db(
    profile: &'static str,
    durability: DurabilityArg,
    storage: EmbeddedStorage,
) -> Result<DbTarget, AppError> {
    let target = tokio::task::spawn_blocking(move || DbTarget::start(profile, durability, storage))
        .await
        .map_err(|e| AppError::Join(e.to_string()))??;
    eprintln!(
        "[{profile} {}] in-process ringkv engine through its embedded API (one shard on the client's thread, tier {})",
        durability.as_str(),
        storage.tier.as_str()
    );
    Ok(target)
}

async fn stop_engine(target: EngineTarget) -> Result<(), AppError> {
    tokio::task::spawn_blocking(move || target.stop())
        .await
        .map_err(|e| AppError::Join(e.to_string()))??;
    Ok(())
}

async fn stop_embedded(server: EmbeddedServer) -> Result<(), AppError> {
    tokio::task::spawn_blocking(move || server.stop())
        .await
        .map_err(|e| AppError::Join(e.to_string()))??;
    Ok(())
}
