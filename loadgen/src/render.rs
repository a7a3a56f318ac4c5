//! The human report: header (machine, run settings, server facts), the
//! seed-shaped tables, the side-by-side device table and the error summary.
//!
//! What must hold: every number printed comes from the [`Report`]; nothing
//! is recomputed from other sources. Rows with errors are flagged in the
//! tables and summarised at the end, never silently printed as results.

use crate::cli::format_count;
use crate::report::{Report, ResultRow, Status};
use crate::table::{fixed0, fixed1, thousands, Align, Table};
use crate::workloads::tiered::TieredSummary;
use std::collections::BTreeSet;

/// Operations that write (used for the device-ordering line).
const WRITE_OPS: [&str; 5] = ["put", "write", "load", "update", "insert"];

pub fn render(report: &Report) -> String {
    let mut out = header(report);
    let timed: Vec<&ResultRow> = report
        .results
        .iter()
        .filter(|r| r.items.is_none() && r.status != Status::Unsupported)
        .collect();
    if !timed.is_empty() {
        out.push_str("\nLatency is that of one batch; throughput counts operations.\n\n");
        out.push_str(&main_table(&timed).render());
    }
    out.push_str(&bound_section(report, &timed));
    out.push_str(&steadiness_section(&report.results));
    out.push_str(&putgettx_table(report));
    let sweep: Vec<&ResultRow> = report
        .results
        .iter()
        .filter(|r| r.workload == "sweep")
        .collect();
    if !sweep.is_empty() {
        out.push_str(&sweep_tables(&sweep));
    }
    let unsupported: Vec<&ResultRow> = report
        .results
        .iter()
        .filter(|r| r.status == Status::Unsupported)
        .collect();
    for r in &unsupported {
        out.push_str(&format!(
            "\n{} {} on {}: unsupported — {}\n",
            r.workload,
            r.operation,
            r.device,
            r.note.as_deref().unwrap_or("")
        ));
    }
    let measured: Vec<&ResultRow> = report
        .results
        .iter()
        .filter(|r| r.status != Status::Unsupported)
        .collect();
    if !measured.is_empty() {
        out.push_str("\nDetails (server STATS deltas over each measured window; WAL device):\n\n");
        if measured.iter().any(|r| r.counters_lower_bound) {
            out.push_str(
                "≥: lower bound — the run killed the server; its STATS are summed over the server's lives, and the I/O between the last reading before each kill and the kill is not counted.\n\n",
            );
        }
        out.push_str(&detail_table(&measured).render());
        out.push_str(
            "\nProfile accuracy (per device, over each measured window: achieved I/O units/s and MB/s next to the \
             profile's limits; the burst rate applies while burst credit lasts, 30 minutes for the built-in profiles; \
             token wait is summed over every waiting I/O, so it can exceed 100% with several shards):\n\n",
        );
        out.push_str(&accuracy_table(&measured).render());
    }
    let devices = devices_in_order(report);
    if devices.len() > 1 {
        out.push_str("\nDevice classes side by side:\n\n");
        out.push_str(&side_by_side(&measured, &devices).render());
        // The tiered workload's columns are layouts, not profiles in IOPS order.
        if report.tiered.is_empty() {
            out.push_str(&ordering_lines(&measured, &devices));
        }
    }
    out.push_str(&tiered_section(&report.tiered));
    for r in &measured {
        if let Some(note) = &r.note {
            out.push_str(&format!(
                "\nnote: {} {} {} on {}: {note}\n",
                r.workload, r.durability, r.operation, r.device
            ));
        }
    }
    for run in &report.crash {
        out.push_str(&crate::crash::report::render(run));
    }
    out.push_str(&error_summary(report));
    out
}

/// "$0.0123", "$4.56", "$789": four significant digits below a dollar.
pub fn dollars(v: f64) -> String {
    if v <= 0.0 || !v.is_finite() {
        return "$0".to_string();
    }
    let digits = (3.0 - v.log10().floor()).clamp(0.0, 10.0) as usize;
    format!("${v:.digits$}")
}

/// Bytes in MiB with one decimal.
fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
}

/// The tiered workload: the layouts' latency, throughput, device reads,
/// bytes and cost, then the aims (empty for other workloads).
pub fn tiered_section(summaries: &[TieredSummary]) -> String {
    if summaries.is_empty() {
        return String::new();
    }
    let ratio = |v: Option<f64>| v.map_or_else(|| "n/a".to_string(), |r| format!("{r:.2}x"));
    let percent = |v: Option<f64>| v.map_or_else(|| "n/a".to_string(), |p| format!("{p:.1}%"));
    let mut out = String::from(
        "\nTiered: latency and throughput (GET latency of one batch: per GET with --batch 1; ratios against the untiered layouts under the same reads):\n\n",
    );
    let mut t = Table::new(&[
        ("Reads", Align::Left),
        ("Layout", Align::Left),
        ("Throughput, ops/s", Align::Right),
        ("GET p50 (µs)", Align::Right),
        ("GET p99 (µs)", Align::Right),
        ("GET p99.9 (µs)", Align::Right),
        ("p99 vs all-nvme", Align::Right),
        ("p99 vs all-sas", Align::Right),
        ("ops vs all-nvme", Align::Right),
        ("ops vs all-sas", Align::Right),
    ]);
    for s in summaries {
        t.push(vec![
            s.distribution.clone(),
            s.layout.clone(),
            fixed0(s.ops_per_sec),
            fixed0(s.get_latency_us.p50),
            fixed0(s.get_latency_us.p99),
            fixed0(s.get_latency_us.p999),
            ratio(s.ratios.p99_vs_all_nvme),
            ratio(s.ratios.p99_vs_all_sas),
            ratio(s.ratios.throughput_vs_all_nvme),
            ratio(s.ratios.throughput_vs_all_sas),
        ]);
    }
    out.push_str(&t.render());
    out.push_str(
        "\nTiered: where reads and bytes went (device reads of value segments in the measured window; oracle hot share = the most the hot device could serve of them: from the window's own reads, a RAM cache holding the records read most often and the hot device the next ones, as many as their values fill; of oracle = hot share / oracle hot share; segment bytes on each class after the window, garbage and emptied segments not yet removed included; cost = GB (2^30 B) x the class's price per GB-month):\n\n",
    );
    let mut t = Table::new(&[
        ("Reads", Align::Left),
        ("Layout", Align::Left),
        ("Hot device reads", Align::Right),
        ("Value device reads", Align::Right),
        ("Hot share", Align::Right),
        ("Oracle hot share", Align::Right),
        ("Of oracle", Align::Right),
        ("Bytes by class", Align::Left),
        ("On value device", Align::Right),
        ("Cost / month", Align::Right),
        ("Promotions", Align::Right),
        ("Demotions", Align::Right),
        ("Moves held back", Align::Right),
    ]);
    for s in summaries {
        let classes: Vec<String> = s
            .classes
            .iter()
            .map(|c| {
                format!(
                    "{} {} {} ({})",
                    c.role,
                    c.profile,
                    mib(c.bytes),
                    dollars(c.cost_per_month)
                )
            })
            .collect();
        t.push(vec![
            s.distribution.clone(),
            s.layout.clone(),
            thousands(s.hot_device_reads),
            thousands(s.value_device_reads),
            percent(s.hot_read_percent()),
            percent(s.oracle_hot_percent),
            ratio(s.of_oracle()),
            classes.join(", "),
            percent(s.value_device_bytes_percent()),
            dollars(s.cost_per_month),
            thousands(s.promotions),
            thousands(s.demotions),
            thousands(s.move_waits),
        ]);
    }
    out.push_str(&t.render());
    for s in summaries.iter().filter(|s| !s.aims.is_empty()) {
        out.push_str(&format!(
            "\nAims ({} layout, {} reads, {}% writes; hot device {}):\n",
            s.layout,
            s.distribution,
            s.write_percent,
            mib(s.hot_bytes)
        ));
        for a in &s.aims {
            out.push_str(&format!(
                "  {} {}: {}\n",
                if a.met { "met    " } else { "NOT met" },
                a.aim,
                a.got
            ));
        }
    }
    out
}

/// PutGetTx: our transactions per second beside the document's.
fn putgettx_table(report: &Report) -> String {
    let rows: Vec<&ResultRow> = report
        .results
        .iter()
        .filter(|r| r.workload.starts_with("putgettx") && r.status != Status::Unsupported)
        .collect();
    if rows.is_empty() {
        return String::new();
    }
    let mut out = String::from(
        "\nPutGetTx: transactions/s (one = BEGIN + GET_FOR_UPDATE, then PUT + COMMIT: two frames); latency per committed transaction:\n\n",
    );
    out.push_str(&format!(
        "{:<40} {:>10} {:>12} {:>10} {:>10} {:>10}\n",
        "system", "durability", "tx/s", "avg µs", "p99 µs", "aborts"
    ));
    let mut under_kills = Vec::new();
    for r in rows.iter().filter(|r| r.operation == "tx") {
        let aborts = rows
            .iter()
            .find(|a| {
                a.operation == "abort"
                    && a.workload == r.workload
                    && a.durability == r.durability
                    && a.device == r.device
            })
            .map_or(0, |a| a.ops);
        let crash = report.crash.iter().find(|c| {
            c.workload == r.workload && c.durability == r.durability && c.device == r.device
        });
        let system = match crash {
            Some(c) => {
                under_kills.push(c);
                format!(
                    "ringkv {} ({}, {} kill{}) †",
                    r.workload,
                    r.device,
                    c.crashes.len(),
                    if c.crashes.len() == 1 { "" } else { "s" }
                )
            }
            None => format!("ringkv {} (this machine)", r.workload),
        };
        out.push_str(&format!(
            "{:<40} {:>10} {:>12} {:>10.0} {:>10.0} {:>10}\n",
            system,
            r.durability,
            thousands(r.ops_per_sec as u64),
            r.latency_us.avg,
            r.latency_us.p99,
            thousands(aborts)
        ));
    }
    for (system, tps) in crate::published::PUTGETTX {
        out.push_str(&format!(
            "{:<40} {:>10} {:>12} {:>10} {:>10} {:>10}\n",
            format!("{system} ({})", crate::published::PUTGETTX_LABEL),
            "n/a",
            thousands(tps),
            "-",
            "-",
            "-"
        ));
    }
    out.push_str(&format!(
        "* {}: {}.\n",
        crate::published::PUTGETTX_LABEL,
        crate::published::PUTGETTX_SOURCE
    ));
    if !under_kills.is_empty() {
        out.push_str(
            "† the run included kills (crash run, this machine): loadgen SIGKILLed and restarted the server; \
             tx/s is over the clients' active time (restarts and read-backs excluded); each transaction is a \
             bank transfer: BEGIN + GET_FOR_UPDATE of two accounts, then PUT of both + COMMIT (two frames).\n",
        );
    }
    out
}

fn header(report: &Report) -> String {
    let run = &report.run;
    let mut s = format!(
        "loadgen {} — workload {} — {}\n",
        report.loadgen_version, run.workload, report.started_at
    );
    s.push_str(&format!("machine:  {}\n", report.machine.describe()));
    s.push_str(&format!("command:  {}\n", report.command_line));
    let shards = if run.shards == 0 {
        "one per core".to_string()
    } else {
        run.shards.to_string()
    };
    let target = match (&run.server_addr, run.target.as_str()) {
        (Some(addr), _) => format!("ringkv-server at {addr}"),
        (None, "process") => format!(
            "a ringkv-server process loadgen starts, kills and restarts (temporary data directory, loopback), shards {shards}"
        ),
        (None, "engine") => format!(
            "ringkv engine library in this process (no TCP, no protocol; temporary data directory), shards {shards}"
        ),
        (None, _) => format!(
            "embedded ringkv server (in-process, temporary data directory, loopback), shards {shards}"
        ),
    };
    s.push_str(&format!("target:   {target}\n"));
    let measure = match (run.duration_s, run.ops) {
        (_, Some(ops)) => format!("{} ops measured per phase", format_count(ops)),
        (Some(d), None) => format!("{d} s measured per phase"),
        (None, None) => String::new(),
    };
    let mode = match (run.mode.as_str(), run.rate_ops_per_sec) {
        ("open", Some(r)) => format!(
            "open loop at {} ops/s (latency from intended send time)",
            thousands(r as u64)
        ),
        _ => "closed loop".to_string(),
    };
    if run.workload == "sweep" {
        let sizes: Vec<String> = run.sweep_sizes.iter().map(|n| format_count(*n)).collect();
        if let Some(method) = &run.method {
            s.push_str(&format!(
                "method:   {method}; N = {}, {mode}, seed {}\n",
                sizes.join(", "),
                run.seed
            ));
        } else {
            s.push_str(&format!(
            "run:      {} client tasks x batches of {}, write then read N records of {} x {} B for N = {}, {mode}, seed {}\n",
            run.threads,
            run.batch,
            run.field_count,
            run.field_length,
            sizes.join(", "),
            run.seed
        ));
        }
    } else if run.workload.starts_with("putgettx") {
        s.push_str(&putgettx_run_line(report, &mode, &measure));
    } else {
        s.push_str(&format!(
            "run:      {} client tasks x batches of {}, {} records of {} x {} B, {mode}, warm-up {} s excluded, {measure}, seed {}\n",
            run.threads,
            run.batch,
            format_count(run.records),
            run.field_count,
            run.field_length,
            run.warmup_s,
            run.seed
        ));
    }
    let mut seen = BTreeSet::new();
    for r in &report.results {
        let sv = &r.server;
        let tier = if sv.tier.is_empty() {
            String::new()
        } else {
            format!(", tier {}", sv.tier)
        };
        let line = format!(
            "server:   {}: ringkv {}, backend {}, {} shards, durability {}{tier}, WAL profile {} ({})\n",
            r.device,
            sv.version,
            sv.backend,
            sv.shards,
            sv.durability,
            sv.profile,
            profile_limits(sv.iops_limit, sv.burst_iops)
        );
        if seen.insert(line.clone()) {
            s.push_str(&line);
        }
    }
    for note in &run.notes {
        s.push_str(&format!("note:     {note}\n"));
    }
    s
}

/// PutGetTx's run line: no batches or records apply, but the key range,
/// the client tasks (one transaction at a time each) and the durability.
fn putgettx_run_line(report: &Report, mode: &str, measure: &str) -> String {
    let run = &report.run;
    let range = match run.txn_range {
        Some(n) => format!("keys uniform over [0, {})", format_count(n)),
        None => "keys over --range".to_string(),
    };
    let (what, value) = if run.target == "process" {
        (
            "bank transfer between two accounts",
            format!(", values of {} x {} B", run.field_count, run.field_length),
        )
    } else {
        ("transaction", String::new())
    };
    let mut durabilities: Vec<&str> = Vec::new();
    for r in &report.results {
        if !durabilities.contains(&r.durability.as_str()) {
            durabilities.push(&r.durability);
        }
    }
    let durability = if durabilities.is_empty() {
        String::new()
    } else {
        format!(", durability {}", durabilities.join(", "))
    };
    format!(
        "run:      {} client tasks, one {what} at a time each (own connection), {range}{value}{durability}, {mode}, warm-up {} s excluded, {measure}, seed {}\n",
        run.threads,
        run.warmup_s,
        run.seed
    )
}

fn profile_limits(iops: u64, burst: u64) -> String {
    if iops == 0 {
        "no IOPS limit".to_string()
    } else {
        format!("{} IOPS, burst {}", thousands(iops), thousands(burst))
    }
}

/// "12.3%" of a share (0.123 -> "12.3%"), or "—".
fn share(v: Option<f64>) -> String {
    v.map_or_else(|| "—".to_string(), |v| format!("{:.1}%", 100.0 * v))
}

/// Our timed rows beside the seed document's published ones (putget: the
/// GridGain report), and for every RAM+Disk row what it asked of the WAL
/// device: bytes written per payload byte and the share of the profile's
/// bandwidth and burst IOPS, with the limit it ran into ("bound").
pub fn bound_section(report: &Report, timed: &[&ResultRow]) -> String {
    let rows: Vec<&&ResultRow> = timed.iter().filter(|r| r.operation != "load").collect();
    if rows.is_empty() && report.published.is_empty() {
        return String::new();
    }
    let mut out = format!(
        "\nWhat bounds each row (RAM+Disk rows: WAL device bytes written per payload byte put, and the share of the \
         profile's bandwidth cap and burst IOPS the window used; \"bound\" names a limit used to {:.0}% or more):\n\n",
        100.0 * crate::report::BOUND_SHARE
    );
    let mut t = Table::new(&[
        ("System", Align::Left),
        ("Device", Align::Left),
        ("Storage", Align::Left),
        ("Durability", Align::Left),
        ("Workload", Align::Left),
        ("Operation", Align::Left),
        ("Throughput, 1000 ops/s", Align::Right),
        ("Dev bytes / payload byte", Align::Right),
        ("Bandwidth used", Align::Right),
        ("IOPS used (of burst)", Align::Right),
        ("Bound", Align::Left),
    ]);
    for r in &rows {
        let disk = r.storage == "RAM+Disk";
        let dev = r.device_use.as_ref().filter(|_| disk);
        let figure = |v: Option<String>| at_least(r, v.unwrap_or_else(|| "—".to_string()));
        t.push(vec![
            "ringkv (this machine)".to_string(),
            r.device.clone(),
            r.storage.clone(),
            r.durability.clone(),
            r.workload.clone(),
            flagged(r, &r.operation),
            if r.ops == 0 {
                "-".to_string()
            } else {
                fixed1(r.throughput_kops)
            },
            figure(
                dev.and_then(|d| d.bytes_written_per_payload_byte)
                    .map(|v| format!("{v:.2}")),
            ),
            figure(dev.map(|d| share(d.bandwidth_share))),
            figure(dev.map(|d| share(d.iops_share))),
            dev.map_or_else(|| "—".to_string(), |d| d.bound.clone()),
        ]);
    }
    for p in &report.published {
        t.push(vec![
            format!("{} *", p.system),
            "n/a".to_string(),
            p.storage.clone(),
            "n/a".to_string(),
            report.run.workload.clone(),
            p.operation.clone(),
            fixed1(p.ops_per_sec / 1000.0),
            "n/a".to_string(),
            "n/a".to_string(),
            "n/a".to_string(),
            "n/a".to_string(),
        ]);
    }
    out.push_str(&t.render());
    if let Some(p) = report.published.first() {
        out.push_str(&format!("* published, other hardware: {}.\n", p.source));
    }
    out
}

/// Per measured phase and operation with at least two seconds: the
/// slowest second against the median second, and the worst second's batch
/// p99 against the phase's p50, with the aims.
pub fn steadiness_section(results: &[ResultRow]) -> String {
    use crate::report::{STEADY_P99_OVER_P50, STEADY_SLOWEST_SHARE};
    let mut t = Table::new(&[
        ("Device", Align::Left),
        ("Durability", Align::Left),
        ("Workload", Align::Left),
        ("Operation", Align::Left),
        ("Seconds", Align::Right),
        ("Median second, ops/s", Align::Right),
        ("Slowest second, ops/s", Align::Right),
        ("Slowest / median", Align::Right),
        ("Worst second p99 (µs)", Align::Right),
        ("Phase p50 (µs)", Align::Right),
        ("Worst p99 / p50", Align::Right),
        ("Aims", Align::Left),
    ]);
    for r in results.iter().filter(|r| r.status != Status::Unsupported) {
        let Some(s) = r.steadiness() else { continue };
        let mut missed = Vec::new();
        if s.slowest_share < STEADY_SLOWEST_SHARE {
            missed.push("slowest second");
        }
        if s.worst_p99_over_p50 > STEADY_P99_OVER_P50 {
            missed.push("p99");
        }
        t.push(vec![
            r.device.clone(),
            r.durability.clone(),
            r.workload.clone(),
            r.items.map_or_else(
                || r.operation.clone(),
                |n| format!("{} {}", r.operation, format_count(n)),
            ),
            s.seconds.to_string(),
            fixed0(s.median_ops_per_sec),
            fixed0(s.slowest_ops_per_sec),
            format!("{:.0}%", 100.0 * s.slowest_share),
            fixed0(s.worst_p99_us),
            fixed0(s.p50_us),
            format!("{:.1}x", s.worst_p99_over_p50),
            if s.met() {
                "met".to_string()
            } else {
                format!("NOT met: {}", missed.join(", "))
            },
        ]);
    }
    if t.is_empty() {
        return String::new();
    }
    format!(
        "\nSteadiness (per second of each measured window, by completion time; aims: slowest second >= {:.0}% of the median second, \
         no second's batch p99 above {:.0}x the phase's p50; phases shorter than two seconds are left out):\n\n{}",
        100.0 * STEADY_SLOWEST_SHARE,
        STEADY_P99_OVER_P50,
        t.render()
    )
}

/// The GridGain table's columns, one row per operation.
pub fn main_table(rows: &[&ResultRow]) -> Table {
    let mut t = Table::new(&[
        ("Device", Align::Left),
        ("Storage", Align::Left),
        ("Durability", Align::Left),
        ("Workload", Align::Left),
        ("Operation", Align::Left),
        ("Average latency (µs)", Align::Right),
        ("95th % (µs)", Align::Right),
        ("99th % (µs)", Align::Right),
        ("Throughput, 1000 ops/s", Align::Right),
    ]);
    for r in rows.iter().filter(|r| r.operation != "load") {
        // Nothing measured (an open loop that never caught up): no figures.
        let figure = |v: String| if r.ops == 0 { "-".to_string() } else { v };
        t.push(vec![
            r.device.clone(),
            r.storage.clone(),
            r.durability.clone(),
            r.workload.clone(),
            flagged(r, &r.operation),
            figure(fixed1(r.latency_us.avg)),
            figure(fixed0(r.latency_us.p95)),
            figure(fixed0(r.latency_us.p99)),
            figure(fixed0(r.throughput_kops)),
        ]);
    }
    t
}

fn flagged(r: &ResultRow, text: &str) -> String {
    if r.status == Status::Errors {
        format!("{text} (ERRORS)")
    } else {
        text.to_string()
    }
}

/// A device or WAL figure: `≥ v` when the row's counters are lower bounds
/// (a crash run's killed server lives).
fn at_least(r: &ResultRow, v: String) -> String {
    if r.counters_lower_bound {
        format!("≥ {v}")
    } else {
        v
    }
}

/// The rest of every row's figures.
pub fn detail_table(rows: &[&ResultRow]) -> Table {
    let mut t = Table::new(&[
        ("Device", Align::Left),
        ("Durability", Align::Left),
        ("Workload", Align::Left),
        ("Operation", Align::Left),
        ("Items", Align::Right),
        ("Ops measured", Align::Right),
        ("Seconds", Align::Right),
        ("p50 (µs)", Align::Right),
        ("p99.9 (µs)", Align::Right),
        ("max (µs)", Align::Right),
        ("Errors", Align::Right),
        ("Dev I/Os", Align::Right),
        ("Dev IOPS", Align::Right),
        ("MB written", Align::Right),
        ("fsync p99 (µs)", Align::Right),
        ("Token wait (ms)", Align::Right),
    ]);
    for r in rows {
        let dev = r.wal_device().cloned().unwrap_or_default();
        let errors = r.errors.failed + r.errors.not_found + r.errors.wrong_value;
        t.push(vec![
            r.device.clone(),
            r.durability.clone(),
            r.workload.clone(),
            r.operation.clone(),
            r.items.map(format_count).unwrap_or_default(),
            thousands(r.ops),
            format!("{:.2}", r.elapsed_ns as f64 / 1e9),
            fixed0(r.latency_us.p50),
            fixed0(r.latency_us.p999),
            fixed0(r.latency_us.max),
            thousands(errors),
            at_least(r, thousands(dev.ios)),
            at_least(r, fixed0(dev.iops)),
            at_least(r, fixed1(dev.bytes_written as f64 / 1e6)),
            thousands(dev.fsync_p99_us),
            at_least(r, fixed1(dev.token_wait_us as f64 / 1e3)),
        ]);
    }
    t
}

/// Per device and measured window: achieved I/O units/s and MB/s next to the
/// profile's limits, and how close to the limit a saturated device ran.
pub fn accuracy_table(rows: &[&ResultRow]) -> Table {
    let mut t = Table::new(&[
        ("Device", Align::Left),
        ("Durability", Align::Left),
        ("Workload", Align::Left),
        ("Operation", Align::Left),
        ("Items", Align::Right),
        ("Dev", Align::Left),
        ("Units/s", Align::Right),
        ("Limit units/s (burst)", Align::Right),
        ("MB/s", Align::Right),
        ("Limit MB/s", Align::Right),
        ("Token wait", Align::Right),
        ("Units/s % of burst", Align::Right),
    ]);
    for r in rows {
        let seconds = r.elapsed_ns as f64 / 1e9;
        for (name, dev) in &r.device_counters {
            let mb_s = if seconds > 0.0 {
                (dev.bytes_read + dev.bytes_written) as f64 / 1e6 / seconds
            } else {
                0.0
            };
            let limits = crate::stats::profile_limits(&dev.profile);
            let wait_share = if seconds > 0.0 {
                dev.token_wait_us as f64 / 1e6 / seconds
            } else {
                0.0
            };
            let of_burst = match limits {
                Some(l) if l.burst_iops > 0 => {
                    format!("{:.1}%", 100.0 * dev.iops / l.burst_iops as f64)
                }
                _ => "-".to_string(),
            };
            t.push(vec![
                r.device.clone(),
                r.durability.clone(),
                r.workload.clone(),
                r.operation.clone(),
                r.items.map(format_count).unwrap_or_default(),
                name.clone(),
                at_least(r, fixed0(dev.iops)),
                match limits {
                    Some(l) if l.iops > 0 => {
                        format!("{} ({})", thousands(l.iops), thousands(l.burst_iops))
                    }
                    Some(_) => "none".to_string(),
                    None => "?".to_string(),
                },
                at_least(r, fixed1(mb_s)),
                match limits {
                    Some(l) if l.bytes_per_sec > 0 => fixed1(l.bytes_per_sec as f64 / 1e6),
                    Some(_) => "none".to_string(),
                    None => "?".to_string(),
                },
                at_least(r, format!("{:.0}%", 100.0 * wait_share)),
                match of_burst.as_str() {
                    "-" => of_burst,
                    _ => at_least(r, of_burst),
                },
            ]);
        }
    }
    t
}

/// One table per device class and durability, shaped like the
/// MapDB/ChronicleMap document: rows write/read, columns N, cells in
/// nanoseconds; for the document's classes its own rows follow (marked
/// published, other hardware) and a ratio row per operation.
pub fn sweep_tables(rows: &[&ResultRow]) -> String {
    let mut out = String::new();
    let mut groups: Vec<(&str, &str)> = Vec::new();
    for r in rows {
        let g = (r.device.as_str(), r.durability.as_str());
        if !groups.contains(&g) {
            groups.push(g);
        }
    }
    for (device, durability) in groups {
        let mine: Vec<&&ResultRow> = rows
            .iter()
            .filter(|r| r.device == device && r.durability == durability)
            .collect();
        let mut sizes: Vec<u64> = mine.iter().filter_map(|r| r.items).collect();
        sizes.sort_unstable();
        sizes.dedup();
        let Some(first) = mine.first() else { continue };
        out.push_str(&format!(
            "\n{device} — {} — durability {} (ringkv {})\n\n",
            profile_limits(first.server.iops_limit, first.server.burst_iops),
            first.durability,
            first.server.version
        ));
        let mut columns: Vec<(String, Align)> = vec![("Storage(R/W)".to_string(), Align::Left)];
        columns.extend(
            sizes
                .iter()
                .map(|n| (format!("{}(ns)", format_count(*n)), Align::Right)),
        );
        let cols: Vec<(&str, Align)> = columns.iter().map(|(h, a)| (h.as_str(), *a)).collect();
        let mut t = Table::new(&cols);
        let mut sampled = false;
        for (op, label) in [("write", "ringkv(W)"), ("read", "ringkv(R)")] {
            let mut row = vec![label.to_string()];
            for n in &sizes {
                let cell = mine
                    .iter()
                    .find(|r| r.operation == op && r.items == Some(*n))
                    .map(|r| {
                        let (ns, scaled) = r.items_time_ns();
                        sampled |= scaled;
                        flagged(r, &format!("{}{ns}", if scaled { "~" } else { "" }))
                    })
                    .unwrap_or_default();
                row.push(cell);
            }
            t.push(row);
        }
        let published: Vec<&crate::published::SweepRow> =
            crate::published::sweep_rows(device).collect();
        if !published.is_empty() {
            for p in &published {
                let mut row = vec![format!("{} *", p.label())];
                row.extend(
                    sizes
                        .iter()
                        .map(|&n| p.at(n).map(|ns| ns.to_string()).unwrap_or_default()),
                );
                t.push(row);
            }
            for (op, label) in [("write", "W"), ("read", "R")] {
                let mut row = vec![format!("ringkv vs best published ({label})")];
                for &n in &sizes {
                    let ours = mine
                        .iter()
                        .find(|r| r.operation == op && r.items == Some(n) && r.status == Status::Ok)
                        .map(|r| r.items_time_ns().0);
                    let best = crate::published::best_published(device, op, n);
                    row.push(match (ours, best) {
                        (Some(ours), Some((_, best))) if ours > 0 => ratio(best, ours),
                        _ => String::new(),
                    });
                }
                t.push(row);
            }
        }
        out.push_str(&t.render());
        if sampled {
            out.push_str(
                "~ N reads at the rate of the sample read (--sweep-reads), not N reads timed.\n",
            );
        }
        if !published.is_empty() {
            out.push_str(&format!(
                "* {}: {}. Ratio = best published time / ringkv time (above 1x: ringkv is faster).\n",
                crate::published::PUBLISHED_LABEL,
                crate::published::SWEEP_SOURCE
            ));
        }
    }
    out
}

/// "12.3x" (how many times faster ringkv is); "0.45x" when slower.
fn ratio(published_ns: u64, ours_ns: u64) -> String {
    let r = published_ns as f64 / ours_ns as f64;
    if r >= 10.0 {
        format!("{r:.0}x")
    } else if r >= 1.0 {
        format!("{r:.1}x")
    } else {
        format!("{r:.2}x")
    }
}

/// Device classes in the order they first appear.
pub fn devices_in_order(report: &Report) -> Vec<String> {
    let mut devices: Vec<String> = Vec::new();
    for r in &report.results {
        if !devices.contains(&r.device) {
            devices.push(r.device.clone());
        }
    }
    devices
}

type RowKey = (String, String, String, Option<u64>);

fn row_keys(rows: &[&ResultRow]) -> Vec<RowKey> {
    let mut keys: Vec<RowKey> = Vec::new();
    for r in rows {
        let k = (
            r.workload.clone(),
            r.durability.clone(),
            r.operation.clone(),
            r.items,
        );
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    keys
}

/// One column per device class; one row per (operation, metric).
pub fn side_by_side(rows: &[&ResultRow], devices: &[String]) -> Table {
    let mut columns: Vec<(&str, Align)> = vec![
        ("Workload", Align::Left),
        ("Durability", Align::Left),
        ("Operation", Align::Left),
        ("Metric", Align::Left),
    ];
    columns.extend(devices.iter().map(|d| (d.as_str(), Align::Right)));
    let mut t = Table::new(&columns);
    type Metric = (&'static str, fn(&ResultRow) -> String);
    let metrics: [Metric; 7] = [
        ("time (ns)", |r| r.elapsed_ns.to_string()),
        ("throughput, 1000 ops/s", |r| fixed1(r.throughput_kops)),
        ("avg latency (µs)", |r| fixed1(r.latency_us.avg)),
        ("p99 latency (µs)", |r| fixed0(r.latency_us.p99)),
        ("device IOPS", |r| {
            at_least(r, fixed0(r.wal_device().map(|d| d.iops).unwrap_or(0.0)))
        }),
        ("fsync p99 (µs)", |r| {
            thousands(r.wal_device().map(|d| d.fsync_p99_us).unwrap_or(0))
        }),
        ("token wait (ms)", |r| {
            at_least(
                r,
                fixed1(r.wal_device().map(|d| d.token_wait_us).unwrap_or(0) as f64 / 1e3),
            )
        }),
    ];
    for (workload, durability, op, items) in row_keys(rows) {
        let label = match items {
            Some(n) => format!("{op} {}", format_count(n)),
            None => op.clone(),
        };
        for (name, metric) in &metrics {
            if *name == "time (ns)" && items.is_none() {
                continue;
            }
            let mut cells = vec![
                workload.clone(),
                durability.clone(),
                label.clone(),
                name.to_string(),
            ];
            for d in devices {
                let cell = rows
                    .iter()
                    .find(|r| {
                        &r.device == d
                            && r.workload == workload
                            && r.durability == durability
                            && r.operation == op
                            && r.items == items
                    })
                    .map(|r| metric(r))
                    .unwrap_or_default();
                cells.push(cell);
            }
            t.push(cells);
        }
    }
    t
}

/// For each write operation measured on several classes: are the classes
/// ordered by throughput as their profiles' IOPS limits say?
pub fn ordering_lines(rows: &[&ResultRow], devices: &[String]) -> String {
    let mut out = String::new();
    for (workload, durability, op, items) in row_keys(rows) {
        if !WRITE_OPS.contains(&op.as_str()) {
            continue;
        }
        let mut cells: Vec<(&ResultRow, u64)> = devices
            .iter()
            .filter_map(|d| {
                rows.iter().find(|r| {
                    &r.device == d
                        && r.workload == workload
                        && r.durability == durability
                        && r.operation == op
                        && r.items == items
                })
            })
            .map(|r| {
                (
                    *r,
                    if r.server.iops_limit == 0 {
                        u64::MAX
                    } else {
                        r.server.iops_limit
                    },
                )
            })
            .collect();
        if cells.len() < 2 {
            continue;
        }
        cells.sort_by_key(|(_, limit)| *limit);
        let in_order = cells
            .windows(2)
            .all(|w| w[0].0.ops_per_sec <= w[1].0.ops_per_sec);
        let chain: Vec<String> = cells
            .iter()
            .map(|(r, _)| format!("{} {}", r.device, fixed1(r.throughput_kops)))
            .collect();
        let what = match items {
            Some(n) => format!("{workload} {op} {}", format_count(n)),
            None => format!("{workload} {op}"),
        };
        out.push_str(&format!(
            "ordering: {what} ({durability}), 1000 ops/s by profile IOPS: {} — {}\n",
            chain.join(" <= "),
            if in_order {
                "in profile order"
            } else {
                "NOT in profile order"
            }
        ));
    }
    if !out.is_empty() {
        out.insert(0, '\n');
    }
    out
}

fn error_summary(report: &Report) -> String {
    let mut out = String::new();
    for r in report.results.iter().filter(|r| r.status == Status::Errors) {
        out.push_str(&format!(
            "ERRORS: {} {} {} on {}: {} failed, {} not found, {} wrong values{}\n",
            r.workload,
            r.durability,
            r.operation,
            r.device,
            r.errors.failed,
            r.errors.not_found,
            r.errors.wrong_value,
            r.errors
                .first_failure
                .as_ref()
                .map(|f| format!(" (first failure: {f})"))
                .unwrap_or_default()
        ));
    }
    if !out.is_empty() {
        out.insert(0, '\n');
        out.push_str("These results are not valid: the server gave wrong or failed answers.\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::tests::sample_report;

    #[test]
    fn putgettx_header_names_range_tasks_and_durability() {
        let mut report = sample_report(&["nvme"], &["tx", "abort"], 1.0);
        report.run.workload = "putgettx".into();
        report.run.txn_range = Some(100_000);
        for r in &mut report.results {
            r.workload = "putgettx".into();
        }
        let text = render(&report);
        let run = text
            .lines()
            .find(|l| l.starts_with("run:"))
            .expect("run line");
        assert!(!run.contains("batches of"), "{run}");
        assert!(!run.contains("records"), "{run}");
        assert!(run.contains("16 client tasks"), "{run}");
        assert!(run.contains("one transaction at a time"), "{run}");
        assert!(run.contains("[0, 100K)"), "{run}");
        assert!(run.contains("durability sync"), "{run}");
        report.run.target = "process".into();
        let text = render(&report);
        let run = text
            .lines()
            .find(|l| l.starts_with("run:"))
            .expect("run line");
        assert!(
            run.contains("one bank transfer between two accounts at a time"),
            "{run}"
        );
        assert!(run.contains("values of 10 x 100 B"), "{run}");
    }

    #[test]
    fn report_prints_seed_columns_and_side_by_side() {
        let mut report = sample_report(&["sas", "gpssd", "nvme"], &["put", "get"], 1.0);
        for (i, r) in report.results.iter_mut().enumerate() {
            r.server.iops_limit = [1800, 2300, 6500][i / 2];
        }
        let text = render(&report);
        assert!(text.contains("Average latency (µs)"));
        assert!(text.contains("Throughput, 1000 ops/s"));
        assert!(text.contains("Device classes side by side"));
        assert!(
            text.contains("| putget   | sync       | put       | throughput, 1000 ops/s |"),
            "{text}"
        );
        assert!(text.contains("in profile order"), "{text}");
        assert!(!text.contains("ERRORS"));
    }

    #[test]
    fn header_names_the_tier_when_the_server_reports_one() {
        let mut report = sample_report(&["nvme"], &["put"], 1.0);
        let text = render(&report);
        assert!(
            text.contains("durability sync, WAL profile nvme"),
            "an old report has no tier: {text}"
        );
        report.results[0].server.tier = "hybrid".into();
        let text = render(&report);
        assert!(
            text.contains("durability sync, tier hybrid, WAL profile nvme"),
            "{text}"
        );
    }

    #[test]
    fn ordering_line_flags_a_misordered_class() {
        let mut report = sample_report(&["sas", "nvme"], &["put"], 1.0);
        report.results[0].server.iops_limit = 1800;
        report.results[0].ops_per_sec = 1e6;
        report.results[1].server.iops_limit = 6500;
        let rows: Vec<&ResultRow> = report.results.iter().collect();
        let text = ordering_lines(&rows, &["sas".into(), "nvme".into()]);
        assert!(text.contains("NOT in profile order"), "{text}");
    }

    /// The cells of the Markdown table row of `text` that starts with `label`.
    fn table_row(text: &str, label: &str) -> Vec<String> {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("| {label}")))
            .unwrap_or_else(|| panic!("no row {label} in\n{text}"));
        line.split('|')
            .map(|c| c.trim().to_string())
            .filter(|c| !c.is_empty())
            .collect()
    }

    #[test]
    fn sweep_table_has_seed_shape() {
        let mut report = sample_report(&["nvme"], &["write", "read"], 1.0);
        let extra: Vec<ResultRow> = report
            .results
            .iter()
            .map(|r| ResultRow {
                items: Some(100_000),
                ops: 100_000,
                elapsed_ns: 9_000_000,
                ..r.clone()
            })
            .collect();
        for r in report.results.iter_mut() {
            r.items = Some(10_000);
            r.ops = 10_000;
            r.workload = "sweep".into();
        }
        for mut r in extra {
            r.workload = "sweep".into();
            report.results.push(r);
        }
        let rows: Vec<&ResultRow> = report.results.iter().collect();
        let text = sweep_tables(&rows);
        let row = |label: &str| table_row(&text, label);
        assert_eq!(row("Storage(R/W)"), ["Storage(R/W)", "10K(ns)", "100K(ns)"]);
        assert_eq!(row("ringkv(W)"), ["ringkv(W)", "1000000", "9000000"]);
        // The document's own rows for nvme, marked as published.
        assert_eq!(row("MapDB(W) *"), ["MapDB(W) *", "24414392", "241636276"]);
        assert_eq!(
            row("ChronicleMap(R) *"),
            ["ChronicleMap(R) *", "42593050", "275962770"]
        );
        // Best published write at 10K is MapDB's 24.4 ms: 24x ringkv's 1 ms.
        assert_eq!(
            row("ringkv vs best published (W)"),
            ["ringkv vs best published (W)", "24x", "27x"]
        );
        assert!(text.contains("published, other hardware"), "{text}");
        assert!(text.contains("durability sync"), "{text}");
        // No published rows for a class the document did not measure.
        for r in report.results.iter_mut() {
            r.device = "unthrottled".into();
        }
        let rows: Vec<&ResultRow> = report.results.iter().collect();
        assert!(!sweep_tables(&rows).contains("MapDB"));
    }

    #[test]
    fn a_sampled_read_is_shown_scaled_to_n_and_marked() {
        let mut report = sample_report(&["nvme"], &["write", "read"], 1.0);
        for r in report.results.iter_mut() {
            r.workload = "sweep".into();
            r.items = Some(100_000);
            r.elapsed_ns = 9_000_000;
            r.ops = if r.operation == "read" {
                10_000
            } else {
                100_000
            };
        }
        let rows: Vec<&ResultRow> = report.results.iter().collect();
        let text = sweep_tables(&rows);
        let cells = |label: &str| table_row(&text, label);
        // 10K reads in 9 ms: 100K at that rate take 90 ms.
        assert_eq!(cells("ringkv(R)"), ["ringkv(R)", "~90000000"]);
        assert_eq!(cells("ringkv(W)"), ["ringkv(W)", "9000000"]);
        // The published 100K read on nvme (276 ms) against the scaled 90 ms.
        assert_eq!(
            cells("ringkv vs best published (R)")[1],
            ratio(
                crate::published::best_published("nvme", "read", 100_000)
                    .unwrap()
                    .1,
                90_000_000
            )
        );
        assert!(
            text.contains("~ N reads at the rate of the sample"),
            "{text}"
        );
    }

    #[test]
    fn errors_are_flagged_and_summarised() {
        let mut report = sample_report(&["nvme"], &["get"], 1.0);
        report.results[0].status = Status::Errors;
        report.results[0].errors.wrong_value = 3;
        let text = render(&report);
        assert!(text.contains("get (ERRORS)"));
        assert!(text.contains("3 wrong values"));
        assert!(text.contains("not valid"));
    }

    #[test]
    fn tiered_section_shows_every_layout_and_the_aims() {
        use crate::workloads::tiered::{compare_layouts, tests::sample, Layout};
        assert_eq!(tiered_section(&[]), "");
        let mut list = vec![
            sample(Layout::AllNvme, 1000.0, 6000.0, 0, 100),
            sample(Layout::AllSas, 8000.0, 1500.0, 0, 100),
            sample(Layout::Tiered, 1400.0, 5000.0, 95, 5),
        ];
        compare_layouts(&mut list);
        let text = tiered_section(&list);
        for layout in ["all-nvme", "all-sas", "tiered"] {
            assert!(text.contains(&format!("| {layout}")), "{text}");
        }
        assert!(text.contains("1.40x"), "{text}");
        assert!(text.contains("95.0%"), "{text}");
        assert_eq!(text.matches("met    ").count(), 3, "{text}");
        assert_eq!(dollars(0.001234567), "$0.001235");
        assert_eq!(dollars(12.346), "$12.35");
        assert_eq!(dollars(0.0), "$0");
    }

    /// The trimmed cells of every table row whose first cells are `prefix`.
    fn rows_starting(text: &str, prefix: &[&str]) -> Vec<Vec<String>> {
        text.lines()
            .filter(|l| l.starts_with('|'))
            .map(|l| {
                l.trim_matches('|')
                    .split('|')
                    .map(|c| c.trim().to_string())
                    .collect::<Vec<_>>()
            })
            .filter(|cells| cells.len() >= prefix.len() && cells[..prefix.len()] == *prefix)
            .collect()
    }

    #[test]
    fn steadiness_rows_say_which_aim_was_missed() {
        use crate::crash::timeline::TimelinePoint;
        let mut report = sample_report(&["nvme"], &["put", "get"], 1.0);
        assert_eq!(steadiness_section(&report.results), "", "no timelines");
        let point = |at_s: f64, ops_per_sec: f64| TimelinePoint {
            at_s,
            ops_per_sec,
            p99_us: 2_000.0,
        };
        // put: p50 900 µs, worst p99 2 ms (2.2x); its second second is 50%.
        report.results[0].timeline =
            vec![point(0.0, 1000.0), point(1.0, 500.0), point(2.0, 1000.0)];
        // get: one second only, left out.
        report.results[1].timeline = vec![point(0.0, 1000.0)];
        let text = steadiness_section(&report.results);
        let rows = rows_starting(&text, &["nvme", "sync", "putget", "put"]);
        assert_eq!(rows.len(), 1, "{text}");
        let row = &rows[0];
        assert_eq!(
            row[4..],
            [
                "3",
                "1000",
                "500",
                "50%",
                "2000",
                "900",
                "2.2x",
                "NOT met: slowest second"
            ]
        );
        assert!(!text.contains("| get"), "{text}");
        report.results[0].timeline[1].ops_per_sec = 900.0;
        report.results[0].latency_us.p50 = 300.0;
        let text = render(&report);
        let rows = rows_starting(&text, &["nvme", "sync", "putget", "put", "3"]);
        assert_eq!(rows.len(), 1, "{text}");
        assert_eq!(rows[0][7..], ["90%", "2000", "300", "6.7x", "NOT met: p99"]);
    }

    #[test]
    fn the_bound_table_puts_published_rows_beside_ours() {
        let mut report = sample_report(&["nvme"], &["put", "get"], 1.0);
        report.published = Report::published_rows_for("putget");
        report.results[0].device_use = Some(crate::report::DeviceUse {
            bytes_written_per_payload_byte: Some(1.234),
            bandwidth_share: Some(0.981),
            iops_share: Some(0.2),
            bound: "device bandwidth (98%)".into(),
        });
        let text = render(&report);
        let ours = rows_starting(
            &text,
            &[
                "ringkv (this machine)",
                "nvme",
                "RAM+Disk",
                "sync",
                "putget",
                "put",
            ],
        );
        assert_eq!(
            ours[0][6..],
            ["100.0", "1.23", "98.1%", "20.0%", "device bandwidth (98%)"]
        );
        // The get row has no device use recorded: dashes, not zeros.
        let get = rows_starting(
            &text,
            &[
                "ringkv (this machine)",
                "nvme",
                "RAM+Disk",
                "sync",
                "putget",
                "get",
            ],
        );
        assert_eq!(get[0][7..], ["—", "—", "—", "—"]);
        let published = rows_starting(&text, &["GridGain 9.1.1 (published, 2 servers) *"]);
        assert_eq!(published.len(), 4, "{text}");
        assert_eq!(
            published[0][2..7],
            ["RAM+Disk", "n/a", "putget", "put", "366.0"]
        );
        assert!(
            text.contains("* published, other hardware: GridGain"),
            "{text}"
        );
        // Other workloads get no published rows.
        assert!(Report::published_rows_for("ycsb-a").is_empty());
    }
}
