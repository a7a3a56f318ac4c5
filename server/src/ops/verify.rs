//! The offline tools `ringkv-server verify`, `inspect` and `repair`
//! (`docs/operations.md`): they take the data directory's lock, read it
//! through `engine::inspect` and print what they found.
//!
//! What must hold: `verify` and `inspect` change nothing in the directory
//! (the lock file aside); `repair` writes only with `--truncate-wal-tail`,
//! prints exactly what it drops, and keeps a copy of every segment it
//! changes unless told not to. The exit codes are the contract below.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use engine::inspect::{
    self, Depth, OpenSummary, OverlayDisk, Report, SegmentEnd, SegmentState, TailRepair,
};
use tunables::Config;

use crate::cli::{RepairArgs, Tool, ToolArgs};
use crate::lockfile::{DirLock, LockError};

/// No problem found; the server would start.
pub const EXIT_CLEAN: u8 = 0;
/// Problems found (a torn tail, a damaged value block, a damaged older
/// snapshot, ...) but recovery accepts the directory: the server would start.
pub const EXIT_DAMAGED: u8 = 1;
/// The server would refuse to start on the directory as it is.
pub const EXIT_UNUSABLE: u8 = 2;
/// A usage error: no such directory, a bad config file, or the directory
/// is locked by a running server.
pub const EXIT_USAGE: u8 = 3;

/// Runs one tool; returns the process exit code.
pub fn run(tool: &Tool) -> ExitCode {
    let code = match tool {
        Tool::Verify(args) => verify(args, &mut std::io::stdout()),
        Tool::Inspect(args) => inspect_dir(args, &mut std::io::stdout()),
        Tool::Repair(args) => repair(args, &mut std::io::stdout()),
    };
    ExitCode::from(code)
}

/// What every tool needs first: the config, and the lock held.
struct Opened {
    config: Config,
    _locks: Vec<DirLock>,
}

fn open_target(args: &ToolArgs) -> Result<Opened, String> {
    let mut config = match &args.config {
        Some(path) => Config::load(path).map_err(|e| format!("{}: {e}", path.display()))?,
        None => Config::default(),
    };
    if !args.data_dir.is_dir() {
        return Err(format!("{} is not a directory", args.data_dir.display()));
    }
    let data_dir = std::fs::canonicalize(&args.data_dir)
        .map_err(|e| format!("{}: {e}", args.data_dir.display()))?;
    if !engine::inspect::manifest_path(&data_dir).exists() && !data_dir.join("shard-000").exists() {
        return Err(format!(
            "{} holds no MANIFEST and no shard folder: not a ringkv data directory",
            data_dir.display()
        ));
    }
    config.storage.data_dir = data_dir.clone();
    let mut locks = vec![lock(&data_dir)?];
    for device in config.devices.values() {
        if !device.path.as_os_str().is_empty() && device.path.is_dir() {
            locks.push(lock(&device.path)?);
        }
    }
    Ok(Opened {
        config,
        _locks: locks,
    })
}

fn lock(dir: &Path) -> Result<DirLock, String> {
    DirLock::acquire(dir).map_err(|e| match e {
        LockError::Held { .. } => {
            format!(
                "{e}; stop the server first (these tools run only on a directory no server holds)"
            )
        }
        other => other.to_string(),
    })
}

fn usage_error(out: &mut dyn std::io::Write, message: &str) -> u8 {
    let _ = out.flush();
    eprintln!("ringkv-server: {message}");
    EXIT_USAGE
}

/// `verify`: full read, then the trial open.
pub fn verify(args: &ToolArgs, out: &mut dyn std::io::Write) -> u8 {
    let opened = match open_target(args) {
        Ok(o) => o,
        Err(e) => return usage_error(out, &e),
    };
    let report = inspect::examine(&opened.config, Depth::Full);
    let config = inspect::config_for(&opened.config, report.manifest.as_ref().ok());
    let trial = inspect::trial_open(&config, OverlayDisk::new());
    let mut text = render(&report);
    let code = verdict(&report, &trial, &mut text);
    let _ = out.write_all(text.as_bytes());
    code
}

/// The exit code of a verify, with the lines that explain it.
fn verdict(
    report: &Report,
    trial: &Result<OpenSummary, engine::EngineError>,
    text: &mut String,
) -> u8 {
    match trial {
        Ok(summary) => render_open(summary, text),
        Err(e) => {
            let _ = writeln!(text, "recovery (trial run, nothing written): REFUSES: {e}");
        }
    }
    render_problems(report, text);
    let code = match (trial, report.problems.is_empty()) {
        (Err(_), _) => EXIT_UNUSABLE,
        (Ok(_), true) => EXIT_CLEAN,
        (Ok(_), false) => EXIT_DAMAGED,
    };
    let words = match code {
        EXIT_CLEAN => "clean",
        EXIT_DAMAGED => "damaged, but the server would start",
        _ => "unusable: the server would refuse to start",
    };
    let _ = writeln!(text, "result: {words} (exit {code})");
    code
}

/// `inspect`: headers only.
pub fn inspect_dir(args: &ToolArgs, out: &mut dyn std::io::Write) -> u8 {
    let opened = match open_target(args) {
        Ok(o) => o,
        Err(e) => return usage_error(out, &e),
    };
    let report = inspect::examine(&opened.config, Depth::Headers);
    let mut text = render(&report);
    render_problems(&report, &mut text);
    let _ = out.write_all(text.as_bytes());
    // Headers alone cannot tell whether recovery accepts a problem: that
    // is verify's verdict.
    if report.problems.is_empty() {
        EXIT_CLEAN
    } else {
        eprintln!(
            "ringkv-server: problems in the headers; `ringkv-server verify` says whether the server would start"
        );
        EXIT_DAMAGED
    }
}

/// `repair`: plan, then (with the flag) back up, try on the overlay, write.
pub fn repair(args: &RepairArgs, out: &mut dyn std::io::Write) -> u8 {
    let opened = match open_target(&args.target) {
        Ok(o) => o,
        Err(e) => return usage_error(out, &e),
    };
    let report = inspect::examine(&opened.config, Depth::Full);
    let config = inspect::config_for(&opened.config, report.manifest.as_ref().ok());
    let (repairs, refused) = inspect::plan_wal_tail_repair(&report);
    let mut text = String::new();
    for p in &refused {
        let _ = writeln!(text, "cannot repair: {p}");
    }
    not_repaired_values(&report, &mut text);
    if repairs.is_empty() {
        let trial = inspect::trial_open(&config, OverlayDisk::new());
        let _ = writeln!(
            text,
            "nothing a WAL tail truncation can repair; run `ringkv-server verify` for the full report"
        );
        let code = match trial {
            Ok(_) if report.problems.is_empty() => EXIT_CLEAN,
            Ok(_) => EXIT_DAMAGED,
            Err(e) => {
                let _ = writeln!(text, "recovery refuses: {e}");
                EXIT_UNUSABLE
            }
        };
        let _ = out.write_all(text.as_bytes());
        return code;
    }
    for r in &repairs {
        let _ = writeln!(text, "{}", describe_drop(r));
    }
    if report.shards.len() > 1 && repairs.iter().any(|r| r.records > 0 || r.grow_to.is_some()) {
        let _ = writeln!(
            text,
            "transactions: if what is given up held a part of a multi-shard transaction, the next start drops that transaction's other parts, except where another shard's snapshot already holds its part: there the transaction stays applied (no log says which; docs/operations.md, repair)"
        );
    }
    if !args.truncate_wal_tail {
        let _ = writeln!(
            text,
            "nothing was written: pass --truncate-wal-tail to drop the above (the records in it are lost for good)"
        );
        let _ = out.write_all(text.as_bytes());
        return EXIT_UNUSABLE;
    }
    if !args.no_backup {
        let dir = args.backup_dir.clone().unwrap_or_else(|| {
            let secs = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            config
                .storage
                .data_dir
                .join(format!("repair-backup-{secs}"))
        });
        match back_up(&repairs, &dir) {
            Ok(copies) => {
                for c in copies {
                    let _ = writeln!(text, "copy kept: {}", c.display());
                }
            }
            Err(e) => {
                let _ = writeln!(text, "nothing was written: the copy failed: {e}");
                let _ = out.write_all(text.as_bytes());
                return EXIT_UNUSABLE;
            }
        }
    } else {
        let _ = writeln!(text, "no copy kept (--no-backup)");
    }
    let code = match inspect::repair_wal_tail(&config, &repairs) {
        Ok(summary) => {
            let _ = writeln!(text, "repaired: {} segment(s) changed", repairs.len());
            render_open(&summary, &mut text);
            EXIT_CLEAN
        }
        Err(e) => {
            let _ = writeln!(text, "repair failed: {e}");
            EXIT_UNUSABLE
        }
    };
    let _ = out.write_all(text.as_bytes());
    code
}

/// Damage to value segments is never repaired: the values in them are
/// gone, and the keys stay (reads of them fail) until written again or
/// deleted. Says so, with the keys each damaged segment costs.
fn not_repaired_values(report: &Report, text: &mut String) {
    for d in report.shards.iter().flat_map(|s| &s.value_damage) {
        let _ = writeln!(
            text,
            "not repaired (repair rewrites only WAL tails; these keys stay unreadable until written again or deleted): {d}"
        );
    }
}

/// One line naming everything a repair drops.
pub fn describe_drop(r: &TailRepair) -> String {
    if r.flushes == 0 && (r.mark.is_some() || r.grow_to.is_some()) {
        return describe_vouched_drop(r);
    }
    let lsns = match r.lsns {
        Some((a, b)) => format!("LSNs {a}..={b}"),
        None => "no complete record".to_string(),
    };
    let covered = if r.covered_records > 0 {
        format!(
            " ({} more record(s) there are held by the newest snapshot)",
            r.covered_records
        )
    } else {
        String::new()
    };
    let mark = match &r.mark {
        Some((head, from, to)) => format!(
            "; the durable mark in {} is lowered from LSN {from} to {to}",
            head.display()
        ),
        None => String::new(),
    };
    format!(
        "drop: shard {} segment {} from offset {} ({} bytes): {} record(s) lost in {} complete flush(es), {lsns}{covered}; damage there: {}{mark}",
        r.shard,
        r.segment.display(),
        r.offset,
        r.bytes,
        r.records,
        r.flushes,
        r.reason
    )
}

/// The line for a repair of a cut segment or of a damaged last flush
/// that the durable mark vouched for: what is regrown, zeroed and given
/// up, counted from the mark (the records after it, if any were
/// acknowledged, cannot be counted: the damage took them).
fn describe_vouched_drop(r: &TailRepair) -> String {
    let mut what = Vec::new();
    if let Some(len) = r.grow_to {
        what.push(format!("grow it back to {len} bytes"));
    }
    if r.bytes > 0 {
        what.push(format!(
            "zero {} bytes from offset {} (the flush the damage tore)",
            r.bytes, r.offset
        ));
    }
    if let Some((head, from, to)) = &r.mark {
        what.push(format!(
            "lower the durable mark in {} from LSN {from} to {to}",
            head.display()
        ));
    }
    let lost = match r.lsns {
        Some((a, b)) => format!(
            "{} record(s) the durable mark vouched for are lost (LSNs {a}..={b}); records after LSN {b}, if any were acknowledged, are lost too and cannot be counted",
            r.records
        ),
        None => "the durable mark vouched for nothing past the log's end; records in what the damage took, if any were acknowledged, cannot be counted".to_string(),
    };
    format!(
        "drop: shard {} segment {}: {}; {lost}; damage there: {}",
        r.shard,
        r.segment.display(),
        what.join(", "),
        r.reason
    )
}

fn back_up(repairs: &[TailRepair], dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut copies = Vec::new();
    for r in repairs {
        let shard_dir = dir.join(format!("shard-{:03}", r.shard));
        std::fs::create_dir_all(&shard_dir)?;
        let mut files = vec![r.segment.clone()];
        files.extend(r.mark.as_ref().map(|(head, _, _)| head.clone()));
        for file in files {
            let name = file.file_name().unwrap_or_default();
            let copy = shard_dir.join(name);
            std::fs::copy(&file, &copy)?;
            std::fs::File::open(&copy)?.sync_all()?;
            copies.push(copy);
        }
    }
    Ok(copies)
}

/// The listing both `inspect` and `verify` print.
pub fn render(report: &Report) -> String {
    let mut t = String::new();
    let _ = writeln!(t, "data directory: {}", report.data_dir.display());
    match &report.manifest {
        Ok(m) => {
            let _ = writeln!(
                t,
                "manifest: version {}, {} shard(s), routing hash {}, table hash {}, tier {}",
                m.version,
                m.shard_count,
                m.hash,
                m.table_hasher.name(),
                tier_name(m.tier)
            );
        }
        Err(e) => {
            let _ = writeln!(t, "manifest: unreadable ({e})");
        }
    }
    let full = report.depth == Depth::Full;
    for s in &report.shards {
        let _ = writeln!(t, "shard {} ({})", s.shard, s.dir.display());
        match s.head {
            Some(h) => {
                let mark = match h.marked_lsn {
                    0 => String::new(),
                    m => format!(", durable through LSN {m}"),
                };
                let _ = writeln!(
                    t,
                    "  wal.head: segment {} (first LSN {}), generation {}{mark}",
                    h.seq, h.first_lsn, h.generation
                );
            }
            None => {
                let _ = writeln!(t, "  wal.head: none");
            }
        }
        let bytes: u64 = s.segments.iter().map(|g| g.bytes).sum();
        let range = match s.lsn_range() {
            Some((a, b)) if full => format!("LSNs {a}..={b}"),
            Some((a, b)) => format!("LSNs from {a} (newest segment from {b})"),
            None => "no records".to_string(),
        };
        let _ = writeln!(
            t,
            "  WAL: {} segment(s), {bytes} bytes, {range}",
            s.segments.len()
        );
        for g in &s.segments {
            let _ = writeln!(t, "    {}", segment_line(g, full));
        }
        if full {
            if let Some(line) = chains_line(&s.chunk_chains) {
                let _ = writeln!(t, "{line}");
            }
        }
        let _ = writeln!(t, "  snapshots: {}", s.snapshots.len());
        for p in &s.snapshots {
            let _ = writeln!(t, "    {}", snapshot_line(p));
        }
        if !s.chain.is_empty() {
            let chain: Vec<String> = s.chain.iter().map(u64::to_string).collect();
            let _ = writeln!(
                t,
                "  newest snapshot's chain (full first): {}",
                chain.join(" <- ")
            );
        }
        if !s.values.is_empty() {
            let vbytes: u64 = s.values.iter().map(|v| v.bytes).sum();
            let blocks: u64 = s.values.iter().map(|v| v.blocks_checked).sum();
            let _ = writeln!(
                t,
                "  value segments: {}, {vbytes} bytes{}",
                s.values.len(),
                if full {
                    format!(", {blocks} blocks checked")
                } else {
                    String::new()
                }
            );
        }
        for l in &s.leftovers {
            let _ = writeln!(
                t,
                "  leftover (recovery removes or ignores it): {}",
                l.display()
            );
        }
    }
    t
}

/// The chunk chains a full read found, when it found any.
fn chains_line(c: &inspect::ChunkChains) -> Option<String> {
    if c.whole == 0 && c.abandoned == 0 && c.unfinished.is_none() {
        return None;
    }
    let mut line = format!(
        "  chunk chains (values larger than a flush): {} whole",
        c.whole
    );
    if c.abandoned > 0 {
        line += &format!(", {} abandoned before a restart (dropped)", c.abandoned);
    }
    if let Some(u) = c.unfinished {
        line += &format!(
            ", one unfinished at the log's end (LSNs {}..={}, {} bytes; never acknowledged, dropped by recovery)",
            u.first_lsn, u.last_lsn, u.bytes
        );
    }
    Some(line)
}

fn snapshot_line(p: &inspect::SnapshotReport) -> String {
    let kind = match p.base_lsn {
        Some(b) => format!("delta on {b}"),
        None => "full".to_string(),
    };
    let entries = p
        .entries
        .map_or(String::new(), |e| format!(", {e} entries"));
    let status = p
        .error
        .as_ref()
        .map_or(String::new(), |e| format!(", DAMAGED: {e}"));
    format!(
        "{} LSN {} ({kind}, {} bytes{entries}){status}",
        file_name(&p.path),
        p.lsn,
        p.bytes
    )
}

fn segment_line(g: &inspect::SegmentReport, full: bool) -> String {
    let state = match &g.state {
        SegmentState::Used { first_lsn } => match g.last_lsn {
            Some(last) if full => format!(
                "used, LSNs {first_lsn}..={last} ({} flushes, {} records)",
                g.flushes, g.records
            ),
            _ if full => format!("used from LSN {first_lsn}, no complete flush"),
            _ => format!("used from LSN {first_lsn}"),
        },
        SegmentState::Unused { recycled: true } => "unused (recycled, waiting)".to_string(),
        SegmentState::Unused { recycled: false } => "unused (zero)".to_string(),
        SegmentState::Damaged(why) => format!("DAMAGED header: {why}"),
    };
    let end = match &g.end {
        Some(SegmentEnd::Clean { offset }) => format!("; ends cleanly at offset {offset}"),
        Some(SegmentEnd::Torn { offset, .. }) => format!("; torn flush at offset {offset}"),
        Some(SegmentEnd::DamageBeforeData { offset, .. }) => {
            format!("; DAMAGE at offset {offset} before newer data")
        }
        None => String::new(),
    };
    format!("{} {} bytes, {state}{end}", file_name(&g.path), g.bytes)
}

fn render_open(summary: &OpenSummary, t: &mut String) {
    let _ = writeln!(t, "recovery (trial run, nothing written): opens");
    for s in &summary.shards {
        let ratio = s.live_ratio.map_or(String::new(), |r| {
            format!(", value segments {:.0}% live", r * 100.0)
        });
        let _ = writeln!(
            t,
            "  shard {}: {} keys, last LSN {}, {} snapshot entries loaded, {} records replayed{ratio}",
            s.shard, s.keys, s.last_lsn, s.snapshot_entries, s.records_replayed
        );
        if s.damaged_segments > 0 {
            let _ = writeln!(
                t,
                "  shard {}: {} keys unreadable, their values past the end of {} value segment(s) cut short (counted after the WAL replay, as a start reports them; the keys stay, their reads fail)",
                s.shard, s.unreadable_keys, s.damaged_segments
            );
        }
    }
}

fn render_problems(report: &Report, t: &mut String) {
    if report.problems.is_empty() {
        let _ = writeln!(t, "problems: none");
        return;
    }
    let _ = writeln!(t, "problems: {}", report.problems.len());
    for p in &report.problems {
        let _ = writeln!(t, "  {p}");
    }
}

fn file_name(path: &Path) -> String {
    path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

fn tier_name(tier: tunables::Tier) -> &'static str {
    match tier {
        tunables::Tier::Memory => "memory",
        tunables::Tier::Hybrid => "hybrid",
    }
}
