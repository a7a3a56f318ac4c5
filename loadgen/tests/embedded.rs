//! The main job's path end to end, in a tiny size, so it never rots: the
//! `loadgen` binary with an embedded server (both durabilities), `--json`,
//! `compare` and `--plot`; and a three-class sweep through the library.
//!
//! What must hold: the binary exits 0 (every answer verified), prints the
//! GridGain-shaped table, and its JSON carries the documented fields. No
//! timing is asserted: only that things ran and answered correctly.

use loadgen::cli::Cli;
use loadgen::report::{Report, ResultRow, Status};
use std::process::Command;

fn loadgen() -> Command {
    Command::new(env!("CARGO_BIN_EXE_loadgen"))
}

const TINY: [&str; 12] = [
    "--threads",
    "4",
    "--batch",
    "50",
    "--records",
    "2K",
    "--warmup",
    "0.2",
    "--duration",
    "0.5",
    "--timeout",
    "60",
];

#[test]
fn main_job_runs_embedded_and_reports() {
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("run.json");
    let svg = dir.path().join("run.svg");
    let out = loadgen()
        .args(["--device", "nvme"])
        .args(TINY)
        .arg("--json")
        .arg(&json)
        .arg("--plot")
        .arg(&svg)
        .output()
        .expect("run loadgen");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "loadgen failed: {stdout}\n{stderr}");
    assert!(stdout.contains("Throughput, 1000 ops/s"), "{stdout}");
    assert!(
        stdout.contains("RAM Only") && stdout.contains("RAM+Disk"),
        "{stdout}"
    );
    assert!(stdout.contains("machine:"), "{stdout}");

    let report = Report::read_json(&json).expect("json");
    let ops: Vec<(&str, &str)> = report
        .results
        .iter()
        .map(|r| (r.durability.as_str(), r.operation.as_str()))
        .collect();
    assert_eq!(
        ops,
        [
            ("none", "load"),
            ("none", "put"),
            ("none", "get"),
            ("sync", "load"),
            ("sync", "put"),
            ("sync", "get")
        ]
    );
    for r in &report.results {
        assert_eq!(r.status, Status::Ok, "{r:?}");
        assert_eq!(r.device, "nvme");
        assert!(r.ops > 0 && r.ops_per_sec > 0.0, "{r:?}");
        assert!(r.latency_us.max >= r.latency_us.p50);
        assert!(!r.server.version.is_empty());
    }
    // RAM+Disk puts went through the WAL device.
    let sync_put = report
        .results
        .iter()
        .find(|r| r.durability == "sync" && r.operation == "put")
        .expect("sync put");
    let wal = sync_put.wal_device().expect("WAL device counters");
    assert!(wal.bytes_written > 0 && wal.ios > 0, "{wal:?}");

    // The binary allocates with mimalloc, as ringkv-server does.
    assert_eq!(report.run.allocator.as_deref(), Some("mimalloc"));

    let svg_text = std::fs::read_to_string(&svg).expect("svg");
    assert!(svg_text.starts_with("<svg"));

    let cmp = loadgen()
        .arg("compare")
        .arg(&json)
        .arg(&json)
        .output()
        .expect("compare");
    let cmp_out = String::from_utf8_lossy(&cmp.stdout);
    assert!(cmp.status.success(), "{cmp_out}");
    assert!(
        cmp_out.contains("delta") && cmp_out.contains("+0%"),
        "{cmp_out}"
    );
}

/// The cells of the Markdown table row of `text` whose cells start with
/// `prefix` (cells compared trimmed).
fn table_rows<'t>(text: &'t str, prefix: &[&str]) -> Vec<Vec<&'t str>> {
    text.lines()
        .filter(|l| l.starts_with('|'))
        .map(|l| {
            l.trim_matches('|')
                .split('|')
                .map(str::trim)
                .collect::<Vec<_>>()
        })
        .filter(|cells| cells.len() >= prefix.len() && cells[..prefix.len()] == *prefix)
        .collect()
}

/// A RAM+Disk run with 2-second phases: each measured phase's JSON row
/// holds a timeline of one point per second whose rates add up to the
/// row's operations; the text has the Steadiness table, the GridGain
/// report's published rows and, for the sync put, the device bytes per
/// payload byte; the chart has the timeline panels.
#[test]
fn every_phase_records_a_timeline_and_the_report_says_what_bounds_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("run.json");
    let svg = dir.path().join("run.svg");
    let out = loadgen()
        .args(["--device", "nvme", "--durability", "sync"])
        .args(["--threads", "2", "--batch", "50", "--records", "2K"])
        .args(["--warmup", "0.2", "--duration", "2", "--timeout", "60"])
        .arg("--json")
        .arg(&json)
        .arg("--plot")
        .arg(&svg)
        .output()
        .expect("run loadgen");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "loadgen failed: {stdout}\n{stderr}");

    let report = Report::read_json(&json).expect("json");
    for op in ["put", "get"] {
        let r = report
            .results
            .iter()
            .find(|r| r.operation == op)
            .unwrap_or_else(|| panic!("no {op} row"));
        let seconds = r.elapsed_ns as f64 / 1e9;
        // The window is cut into whole seconds; a short tail joins the last.
        assert_eq!(r.timeline.len(), seconds.round() as usize, "{op}: {r:?}");
        for (i, p) in r.timeline.iter().enumerate() {
            assert_eq!(p.at_s, i as f64, "{op}: {:?}", r.timeline);
        }
        // Each point's rate times its span gives back every operation.
        let last = r.timeline.len() - 1;
        let counted: f64 = r
            .timeline
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let span = if i == last { seconds - i as f64 } else { 1.0 };
                p.ops_per_sec * span
            })
            .sum();
        assert!(
            (counted - r.ops as f64).abs() < 0.5,
            "{op}: {counted} counted, {} measured",
            r.ops
        );
        assert!(r.timeline.iter().any(|p| p.p99_us > 0.0), "{op}");
    }
    let put = report
        .results
        .iter()
        .find(|r| r.operation == "put")
        .expect("put");
    // 2 tasks x 50 records of a "user..." key and a 1,000-byte value.
    assert!(put.payload_bytes >= put.ops * 1_000, "{put:?}");
    let dev = put.device_use.as_ref().expect("the sync put's device use");
    assert!(dev.bytes_written_per_payload_byte.is_some_and(|v| v > 0.0));
    assert!(dev.bandwidth_share.is_some() && dev.iops_share.is_some());
    assert_eq!(report.published.len(), 4, "{:?}", report.published);

    assert!(stdout.contains("Steadiness ("), "{stdout}");
    for op in ["put", "get"] {
        let rows = table_rows(&stdout, &["nvme", "sync", "putget", op]);
        // The details, accuracy and steadiness tables each have the row;
        // the steadiness row has twelve cells, the seconds in the fifth.
        let seconds = rows
            .iter()
            .find(|c| c.len() == 12)
            .and_then(|c| c[4].parse::<usize>().ok());
        assert!(seconds.is_some_and(|n| n >= 2), "{stdout}");
    }
    let published = table_rows(&stdout, &["GridGain 9.1.1 (published, 2 servers) *"]);
    let cells: Vec<(&str, &str, &str)> = published.iter().map(|c| (c[2], c[5], c[6])).collect();
    assert_eq!(
        cells,
        [
            ("RAM+Disk", "put", "366.0"),
            ("RAM Only", "put", "524.0"),
            ("RAM+Disk", "get", "766.0"),
            ("RAM Only", "get", "744.0")
        ],
        "{stdout}"
    );
    let ours = table_rows(
        &stdout,
        &[
            "ringkv (this machine)",
            "nvme",
            "RAM+Disk",
            "sync",
            "putget",
            "put",
        ],
    );
    assert_eq!(ours.len(), 1, "{stdout}");
    let per_payload: f64 = ours[0][7].parse().expect("bytes per payload byte");
    assert!(per_payload > 0.0, "{stdout}");

    let svg_text = std::fs::read_to_string(&svg).expect("svg");
    assert!(
        svg_text.contains(loadgen::plot::TIMELINE_OPS_TITLE)
            && svg_text.contains(loadgen::plot::TIMELINE_P99_TITLE),
        "no timeline panel"
    );
}

/// With stderr a pipe, a phase longer than --progress-every prints
/// progress lines while it runs, not only its result at the end.
#[test]
fn a_piped_run_prints_progress_lines_during_a_phase() {
    let out = loadgen()
        .args(["--device-profile", "nvme", "--durability", "none"])
        .args(["--threads", "2", "--batch", "50", "--records", "1K"])
        .args(["--warmup", "0", "--duration", "1500ms", "--timeout", "60s"])
        .args(["--progress-every", "100ms"])
        .stderr(std::process::Stdio::piped())
        .output()
        .expect("run loadgen");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "loadgen failed: {stderr}");
    // The put phase lasts 1.5 s, fifteen intervals: it cannot end silent.
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("loadgen: nvme put: ") && l.contains(" ops done, "))
        .collect();
    assert!(
        !lines.is_empty(),
        "no progress line for the put phase:\n{stderr}"
    );
    assert!(lines.iter().all(|l| l.contains("(measuring)")), "{lines:?}");

    // The sweep on the in-process engine runs its own client loops, not the
    // driver's phases: it prints progress lines too.
    let out = loadgen()
        .args(["--workload", "sweep", "--device", "unthrottled"])
        .args(["--sweep-sizes", "100K", "--progress-every", "10ms"])
        .stderr(std::process::Stdio::piped())
        .output()
        .expect("run loadgen");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "loadgen failed: {stderr}");
    assert!(
        stderr.lines().any(
            |l| l.starts_with("loadgen: unthrottled write 100K: ") && l.contains(" ops done, ")
        ),
        "no progress line for the sweep's write phase:\n{stderr}"
    );
}

/// The duration flags take a bare number of seconds and a number with a
/// unit, and a bad one is refused naming the flag.
#[test]
fn duration_flags_take_seconds_or_units() {
    let out = loadgen()
        .args([
            "--server",
            "127.0.0.1:1",
            "--timeout",
            "10s",
            "--device",
            "sas",
        ])
        .output()
        .expect("run loadgen");
    // Parsed (10s is fine); refused later for --device with --server.
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("embedded server only"));
    let out = loadgen()
        .args(["--crash-every", "10x"])
        .output()
        .expect("run loadgen");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--crash-every") && stderr.contains("10x"),
        "{stderr}"
    );
}

#[test]
fn bad_flags_exit_2_with_a_reason() {
    let out = loadgen()
        .args(["--server", "127.0.0.1:1", "--device", "sas"])
        .output()
        .expect("run loadgen");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("embedded server only"));
}

/// A tiny sweep by the document's method (1 client, one item per call,
/// 8-byte keys, 32-byte values) through the library on every class, with
/// the in-process engine and with the embedded server.
#[test]
fn sweep_runs_on_every_class_with_each_target() {
    for target in ["engine", "server"] {
        let cli = <Cli as clap::Parser>::try_parse_from([
            "loadgen",
            "--device",
            "all",
            "--workload",
            "sweep",
            "--target",
            target,
            "--sweep-sizes",
            "1K",
            "--sweep-warmup",
            "100",
        ])
        .expect("flags");
        let settings = cli.run.settings(false).expect("settings");
        let runtime = tokio::runtime::Runtime::new().expect("runtime");
        let mut rows: Vec<ResultRow> = Vec::new();
        runtime
            .block_on(loadgen::app::run_all(&cli.run, &settings, &mut rows))
            .expect("sweep");
        assert_eq!(rows.len(), 3 * 2, "{target}: {rows:#?}");
        for device in ["sas", "gpssd", "nvme"] {
            for op in ["write", "read"] {
                let r = rows
                    .iter()
                    .find(|r| r.device == device && r.operation == op)
                    .unwrap_or_else(|| panic!("{target}: no {device} {op}"));
                assert_eq!(r.ops, 1_000, "{target} {device} {op}: warm-up not counted");
                assert_eq!(r.batches, 1_000, "{target}: one item per call");
                assert_eq!(r.status, Status::Ok, "{target} {device} {op}");
                assert_eq!(r.server.profile, device);
                assert_eq!(r.durability, "async", "the sweep's default");
                if target == "engine" {
                    assert!(r.server.version.contains("(engine)"), "{r:?}");
                }
            }
        }
    }
}

/// The binary's sweep prints the document's table shape with its rows.
#[test]
fn sweep_binary_prints_published_rows() {
    let out = loadgen()
        .args([
            "--workload",
            "sweep",
            "--device",
            "sas",
            "--sweep-sizes",
            "10K",
        ])
        .args(["--sweep-warmup", "100"])
        .output()
        .expect("run loadgen");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for want in [
        "Storage(R/W)",
        "ringkv(W)",
        "MapDB(W) *",
        "ChronicleMap(R) *",
        "ringkv vs best published (W)",
        "published, other hardware",
        "durability async",
        "Profile accuracy",
        "in this process (no TCP",
    ] {
        assert!(stdout.contains(want), "no {want:?} in:\n{stdout}");
    }
}

/// A size that cannot fit is refused at once, with the arithmetic.
#[test]
fn sweep_too_large_fails_at_once_with_the_numbers() {
    // 2G items need 206 GB of RAM (103 B per 40-byte item in the memory
    // tier: the 64-byte heap chunk plus 39 bytes of table with its hash per
    // slot); a machine that has it would really run.
    if loadgen::capacity::available_ram_bytes().is_some_and(|b| b > 206_000_000_000) {
        eprintln!("skipped: this machine has more than 206 GB of RAM available");
        return;
    }
    let out = loadgen()
        .args(["--workload", "sweep", "--sweep-max", "2G"])
        .output()
        .expect("run loadgen");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("N = 2G: RAM 206.0 GB needed"), "{stderr}");
    assert!(stderr.contains("--sweep-max"), "{stderr}");
}
