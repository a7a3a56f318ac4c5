//! Crash runs against the real `ringkv-server` binary, in a tiny size: a
//! few kills, small N. `sync` loses nothing on either tier (put/get, YCSB A,
//! bank transfers); zeroing the tail of each shard's log between a kill and
//! the restart is caught as loss; `async` loses only writes acknowledged
//! within the flush window; Ctrl-C leaves no server running.
//!
//! These tests need `ringkv-server` built beside `loadgen`
//! (`cargo build -p ringkv-server`; a workspace build does it). No timing
//! is asserted: only what was lost and what was left running.

use loadgen::cli::Cli;
use loadgen::crash::clients::Mix;
use loadgen::crash::report::CrashSummary;
use loadgen::crash::{CrashOutcome, CrashPlan, RunOn};
use loadgen::settings::Settings;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// `ringkv-server` beside this test's `loadgen` binary.
fn server_binary() -> PathBuf {
    let loadgen = PathBuf::from(env!("CARGO_BIN_EXE_loadgen"));
    let server = loadgen.with_file_name("ringkv-server");
    assert!(
        server.is_file(),
        "{} is missing: run `cargo build -p ringkv-server` first",
        server.display()
    );
    server
}

/// Settings and plan from a loadgen command line, as the binary makes them.
fn plan_of(args: &[&str]) -> (Settings, CrashPlan) {
    let mut full = vec![
        "loadgen",
        "--threads",
        "4",
        "--batch",
        "50",
        "--timeout",
        "30",
    ];
    full.extend_from_slice(args);
    let cli = <Cli as clap::Parser>::try_parse_from(full).expect("flags parse");
    let s = cli.run.settings(false).expect("settings");
    let mut plan = cli.run.crash_plan(&s).expect("plan").expect("a crash run");
    plan.server_command = format!("'{}'", server_binary().display());
    (s, plan)
}

fn run(
    plan: &CrashPlan,
    s: &Settings,
    mix: Mix,
    durability: &'static str,
    tier: &'static str,
) -> CrashSummary {
    run_outcome(plan, s, mix, "test", durability, tier).summary
}

fn run_outcome(
    plan: &CrashPlan,
    s: &Settings,
    mix: Mix,
    workload: &str,
    durability: &'static str,
    tier: &'static str,
) -> CrashOutcome {
    let on = RunOn {
        profile: "unthrottled",
        durability,
        tier,
        shards: 2,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let outcome = runtime
        .block_on(loadgen::crash::run(plan, s, mix, workload, on))
        .expect("the crash run runs");
    assert!(!outcome.rows.is_empty(), "the workload's rows are reported");
    outcome
}

fn assert_nothing_lost(summary: &CrashSummary, kills: usize) {
    assert_eq!(summary.crashes.len(), kills, "{summary:#?}");
    assert!(summary.acknowledged > 0);
    for c in &summary.crashes {
        assert_eq!(c.audit.lost, 0, "{c:#?}");
        assert!(c.audit.keys_checked > 0);
    }
    assert_eq!(summary.lost, 0);
    assert!(!summary.failed(), "{summary:#?}");
}

#[test]
fn sync_loses_nothing_on_either_tier() {
    let (s, plan) = plan_of(&["--records", "2K", "--duration", "3", "--crashes", "3"]);
    for tier in ["memory", "hybrid"] {
        let summary = run(&plan, &s, Mix::PutGet, "sync", tier);
        assert_nothing_lost(&summary, 3);
        assert_eq!(summary.final_audit.keys_checked, 2000);
        assert!(
            summary.crashes.iter().all(|c| c.recovery.is_some()),
            "{tier}: /metrics read"
        );
    }
}

#[test]
fn sync_ycsb_a_and_bank_transfers_lose_nothing() {
    let (s, plan) = plan_of(&[
        "--records",
        "2K",
        "--range",
        "200",
        "--duration",
        "2",
        "--crashes",
        "2",
    ]);
    assert_nothing_lost(&run(&plan, &s, Mix::YcsbA, "sync", "memory"), 2);
    let bank = run(&plan, &s, Mix::Bank, "sync", "hybrid");
    assert_nothing_lost(&bank, 2);
    for audit in bank
        .crashes
        .iter()
        .map(|c| &c.audit)
        .chain([&bank.final_audit])
    {
        assert_eq!(audit.bank_total, Some(200 * 1000));
        assert_eq!(audit.bank_expected, Some(200 * 1000));
    }
}

/// The human report of one crash run's outcome, as the binary prints it.
fn rendered(outcome: &CrashOutcome, workload: &str) -> String {
    let report = loadgen::report::Report {
        schema: loadgen::report::SCHEMA.to_string(),
        loadgen_version: "test".to_string(),
        started_at: String::new(),
        command_line: String::new(),
        machine: loadgen::machine::Machine::default(),
        run: loadgen::report::RunSettings {
            workload: workload.to_string(),
            target: "process".to_string(),
            method: None,
            server_addr: None,
            devices: vec!["unthrottled".to_string()],
            threads: 4,
            batch: 50,
            records: 2000,
            duration_s: Some(2.0),
            ops: None,
            warmup_s: 0.0,
            mode: "closed".to_string(),
            rate_ops_per_sec: None,
            seed: 0,
            field_count: 10,
            field_length: 100,
            sweep_sizes: Vec::new(),
            shards: 2,
            notes: Vec::new(),
            txn_range: Some(200),
            allocator: None,
        },
        results: outcome.rows.clone(),
        crash: vec![outcome.summary.clone()],
        tiered: Vec::new(),
        published: Vec::new(),
    };
    loadgen::render::render(&report)
}

/// Issue 33: the report of a crash run has the server's device counters
/// (summed over the server's lives, not 0) and, for bank transfers, the
/// ringkv row of the PutGetTx comparison table.
#[test]
fn the_report_sums_stats_over_lives_and_has_the_putgettx_row() {
    let (s, plan) = plan_of(&[
        "--records",
        "2K",
        "--range",
        "200",
        "--duration",
        "2",
        "--crashes",
        "1",
    ]);
    let outcome = run_outcome(&plan, &s, Mix::Bank, "putgettx", "sync", "hybrid");
    assert_nothing_lost(&outcome.summary, 1);
    for row in &outcome.rows {
        let wal = row.wal_device().expect("the WAL device's counters");
        assert!(wal.ios > 0, "device I/Os of a sync run: {wal:?}");
        assert!(
            wal.bytes_written > 0,
            "bytes written by a sync run: {wal:?}"
        );
        assert!(row.wal.bytes_written > 0, "{:?}", row.wal);
        assert!(
            row.counters_lower_bound,
            "a killed life's figures are lower bounds"
        );
    }
    let text = rendered(&outcome, "putgettx");
    let details = text
        .split("Details (server STATS")
        .nth(1)
        .unwrap_or_else(|| panic!("no details table:\n{text}"));
    assert!(details.contains("≥: lower bound"), "{text}");
    assert!(details.contains("≥ "), "{text}");
    let ops: Vec<&str> = outcome.rows.iter().map(|r| r.operation.as_str()).collect();
    assert!(ops.contains(&"tx"), "a tx row, as without kills: {ops:?}");
    let table = text
        .split("PutGetTx: transactions/s")
        .nth(1)
        .unwrap_or_else(|| panic!("no PutGetTx table:\n{text}"));
    assert!(
        table.lines().any(|l| l.starts_with("ringkv putgettx")),
        "no ringkv row:\n{text}"
    );
    assert!(table.contains("† the run included kills"), "{text}");
}

/// Bytes zeroed at the end of each shard's log: several flushes' worth.
const ZEROED_TAIL_BYTES: usize = 512 * 1024;
const BLOCK_BYTES: usize = 4096;

/// The newest segment of a shard that holds records: the highest number
/// whose header's first LSN (bytes 24..32) is not 0 (docs/wal.md).
fn newest_used_segment(wal: &Path) -> Option<PathBuf> {
    let mut segments: Vec<PathBuf> = std::fs::read_dir(wal)
        .expect("wal dir")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "wal"))
        .collect();
    segments.sort();
    segments.into_iter().rev().find(|p| {
        let bytes = std::fs::read(p).expect("read segment");
        bytes.len() >= 32 && bytes[24..32] != [0; 8]
    })
}

/// Zeroes the last flushes of every shard's log, as a lost tail of a disk
/// would. Where no durable mark covers them, recovery cannot tell that from
/// a torn write (docs/wal.md, "The durable mark"), so only the audit can
/// see the acknowledged writes it held; where one does, the restart is
/// refused.
fn zero_the_newest_flushes(data: &Path) {
    let shards = std::fs::read_dir(data).expect("data dir");
    for shard in shards
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("shard-"))
    {
        let Some(segment) = newest_used_segment(&shard.path().join("wal")) else {
            continue;
        };
        let mut bytes = std::fs::read(&segment).expect("read segment");
        let end = bytes
            .iter()
            .rposition(|&b| b != 0)
            .map_or(0, |i| (i / BLOCK_BYTES + 1) * BLOCK_BYTES);
        let start = end.saturating_sub(ZEROED_TAIL_BYTES).max(BLOCK_BYTES);
        if start < end {
            bytes[start..end].fill(0);
            std::fs::write(&segment, &bytes).expect("write segment");
        }
    }
}

/// A server command whose config writes no durable mark for a minute:
/// `dir` holds the config file.
fn server_marking_once_a_minute(dir: &Path) -> String {
    let config = dir.join("ringkv.toml");
    std::fs::write(&config, "[storage]\nwal_mark_interval = \"60s\"\n").expect("config");
    format!(
        "'{}' --config '{}'",
        server_binary().display(),
        config.display()
    )
}

#[test]
fn a_lost_wal_tail_is_reported_as_loss() {
    let (s, mut plan) = plan_of(&["--records", "2K", "--duration", "2", "--crashes", "1"]);
    plan.between_kill_and_restart = Some(Arc::new(zero_the_newest_flushes));
    // No mark since the start: the lost tail reads as a torn write, and
    // the audit is what must see the loss.
    let dir = tempfile::tempdir().expect("tempdir");
    plan.server_command = server_marking_once_a_minute(dir.path());
    let summary = run(&plan, &s, Mix::PutGet, "sync", "memory");
    let audit = &summary.crashes[0].audit;
    assert!(audit.lost > 0, "{audit:#?}");
    assert!(!audit.lost_keys.is_empty());
    assert!(audit.lost_keys.iter().all(|k| k.found < k.acked));
    assert!(summary.failed(), "a loss fails the run (exit code 1)");
}

#[test]
fn async_loses_only_writes_inside_the_flush_window() {
    let (s, plan) = plan_of(&["--records", "2K", "--duration", "3", "--crashes", "3"]);
    let summary = run(&plan, &s, Mix::PutGet, "async", "memory");
    let window = summary.async_window_ms.expect("an async run has a window");
    for c in &summary.crashes {
        assert_eq!(c.audit.outside_window, 0, "{c:#?}");
        for k in &c.audit.lost_keys {
            let before = k
                .acked_before_kill_ms
                .expect("a lost write's ack is remembered");
            assert!(before <= window, "{k:?} lost outside {window} ms");
        }
    }
    assert!(!summary.failed(), "{summary:#?}");
    assert_eq!(summary.final_audit.lost, 0, "no loss without a kill");
}

/// Whether a process with this pid exists (a zombie counts).
fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

#[test]
fn ctrl_c_stops_the_run_and_leaves_no_server() {
    use std::io::{BufRead, BufReader};
    server_binary();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_loadgen"))
        .args([
            "--records",
            "1K",
            "--threads",
            "2",
            "--batch",
            "20",
            "--duration",
            "60",
        ])
        .args(["--crash-every", "20s", "--device", "unthrottled"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start loadgen");
    // Read stderr to its end on a thread: a closed pipe would make
    // loadgen's next message fail.
    let stderr = BufReader::new(child.stderr.take().expect("piped"));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in stderr.lines().map_while(Result::ok) {
            if let Some(rest) = line.split("server pid ").nth(1) {
                let _ = tx.send(
                    rest.split_whitespace()
                        .next()
                        .and_then(|p| p.parse::<u32>().ok()),
                );
            }
        }
    });
    let pid = rx
        .recv_timeout(Duration::from_secs(60))
        .ok()
        .flatten()
        .expect("loadgen names the server's pid");
    assert!(alive(pid));
    std::thread::sleep(Duration::from_millis(500));
    let loadgen = libc::pid_t::try_from(child.id()).expect("pid");
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(loadgen, libc::SIGINT) };
    let status = child.wait().expect("loadgen exits");
    assert_eq!(status.code(), Some(130));
    assert!(!alive(pid), "the server {pid} is still running");
}
