//! The crash part of a report: per kill, what it cost and what the audit
//! found; the totals; the timeline. Serialized into `--json` as `crash`,
//! rendered after the workload's tables, compared by `loadgen compare`.
//!
//! What must hold: `lost` is the sum of every audit's lost keys, and a run
//! with a lost key, a phantom, a malformed value or a broken bank total has
//! [`CrashSummary::failed`] true (the exit code is then 1).

use super::process::Recovery;
use super::timeline::{TimelinePoint, Window};
use crate::table::{thousands, Align, Table};
use serde::{Deserialize, Serialize};

/// The most lost keys listed per audit (all are counted).
pub const LOST_LISTED_MAX: usize = 50;

/// One lost key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LostKey {
    pub keynum: u64,
    /// Highest version acknowledged before the kill.
    pub acked: u32,
    /// Version read back (0 = missing).
    pub found: u32,
    /// How long before the kill the oldest lost version was acknowledged
    /// (async runs; absent when loadgen no longer remembers it).
    pub acked_before_kill_ms: Option<f64>,
}

/// What one read-back found.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AuditResult {
    pub keys_checked: u64,
    /// True when a uniform sample was read instead of every key.
    pub sampled: bool,
    pub lost: u64,
    pub phantom: u64,
    pub malformed: u64,
    pub wrong_key: u64,
    /// Async runs: lost keys whose loss is not inside the window.
    pub outside_window: u64,
    /// Bank runs: the sum of the balances read, and what it must be.
    pub bank_total: Option<i64>,
    pub bank_expected: Option<i64>,
    /// The first [`LOST_LISTED_MAX`] lost keys.
    pub lost_keys: Vec<LostKey>,
    pub audit_ms: f64,
}

impl AuditResult {
    pub fn failed(&self, async_window: bool) -> bool {
        let bank_broken = self.bank_total.is_some() && self.bank_total != self.bank_expected;
        let loss_counts = !async_window || self.outside_window > 0;
        (self.lost > 0 && loss_counts)
            || self.phantom + self.malformed + self.wrong_key > 0
            || bank_broken
    }
}

/// One kill and restart.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CrashEvent {
    /// Seconds since the run started.
    pub kill_at_s: f64,
    /// From SIGKILL to the restarted server's ready line.
    pub ready_ms: f64,
    /// From the restart's spawn to its ready line.
    pub start_ms: f64,
    /// The restarted server's own figures (from /metrics), if it reports them.
    pub recovery: Option<Recovery>,
    /// The read-back after the restart (clients wait for it).
    pub audit: AuditResult,
    /// Throughput and p99 in the seconds before the kill and after the
    /// clients resumed.
    pub before: Window,
    pub after: Window,
}

/// A whole crash run on one device class and durability.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CrashSummary {
    pub device: String,
    pub durability: String,
    pub tier: String,
    pub workload: String,
    pub server_command: String,
    pub interval_s: f64,
    /// Async runs: losses must lie within this many ms before the kill.
    pub async_window_ms: Option<f64>,
    /// Acknowledged writes (puts, or committed transfers' account writes).
    pub acknowledged: u64,
    pub lost: u64,
    pub crashes: Vec<CrashEvent>,
    /// The read-back at the end (no kill before it).
    pub final_audit: AuditResult,
    pub timeline: Vec<TimelinePoint>,
    /// Seconds the before/after windows span.
    pub window_s: f64,
}

impl CrashSummary {
    pub fn failed(&self) -> bool {
        // Durability none keeps nothing across a kill: losses are reported only.
        let window = self.async_window_ms.is_some() || self.durability == "none";
        self.crashes.iter().any(|c| c.audit.failed(window)) || self.final_audit.failed(false)
    }
}

fn ms(v: f64) -> String {
    format!("{v:.0}")
}

fn recovery_cells(r: &Option<Recovery>) -> [String; 3] {
    match r {
        Some(r) => [
            ms(r.duration_ms),
            thousands(r.replayed_records),
            format!("{:.1}", r.replayed_bytes as f64 / 1e6),
        ],
        None => ["-".into(), "-".into(), "-".into()],
    }
}

/// The per-crash table.
pub fn crash_table(s: &CrashSummary) -> Table {
    let mut t = Table::new(&[
        ("Kill", Align::Right),
        ("At, s", Align::Right),
        ("Ready, ms", Align::Right),
        ("Recovery, ms", Align::Right),
        ("WAL records", Align::Right),
        ("WAL MB", Align::Right),
        ("Before: Kops/s (p99 µs)", Align::Right),
        ("After: Kops/s (p99 µs)", Align::Right),
        ("Keys read", Align::Right),
        ("Lost", Align::Right),
    ]);
    for (i, c) in s.crashes.iter().enumerate() {
        let [rec, records, bytes] = recovery_cells(&c.recovery);
        let w = |w: &Window| format!("{:.1} ({:.0})", w.ops_per_sec / 1000.0, w.p99_us);
        t.push(vec![
            (i + 1).to_string(),
            format!("{:.1}", c.kill_at_s),
            ms(c.ready_ms),
            rec,
            records,
            bytes,
            w(&c.before),
            w(&c.after),
            thousands(c.audit.keys_checked),
            c.audit.lost.to_string(),
        ]);
    }
    t
}

/// The crash section of the text report.
pub fn render(s: &CrashSummary) -> String {
    let mut out = format!(
        "\nCrash run [{} {} tier {}] {}: {} kill(s) about every {:.1} s (SIGKILL, restart on the same data directory)\n\n",
        s.device, s.durability, s.tier, s.workload, s.crashes.len(), s.interval_s
    );
    out.push_str(&crash_table(s).render());
    out.push_str(&format!(
        "acknowledged {}, lost {}{}\n",
        thousands(s.acknowledged),
        s.lost,
        match s.async_window_ms {
            Some(w) => format!(" (async: losses allowed within {w:.0} ms before a kill)"),
            None => String::new(),
        }
    ));
    for (i, c) in s.crashes.iter().enumerate() {
        out.push_str(&audit_lines(&format!("kill {}", i + 1), &c.audit));
    }
    out.push_str(&audit_lines("final read-back", &s.final_audit));
    out.push_str(if s.failed() {
        "DURABILITY AUDIT FAILED\n"
    } else {
        "durability audit passed\n"
    });
    out
}

fn audit_lines(what: &str, a: &AuditResult) -> String {
    let mut out = String::new();
    if a.lost + a.phantom + a.malformed + a.wrong_key > 0 {
        out.push_str(&format!(
            "  {what}: {} lost, {} phantom, {} malformed, {} wrong key ({} outside the async window)\n",
            a.lost, a.phantom, a.malformed, a.wrong_key, a.outside_window
        ));
        for k in &a.lost_keys {
            out.push_str(&format!(
                "    key {} acknowledged v{} found v{}{}\n",
                k.keynum,
                k.acked,
                k.found,
                k.acked_before_kill_ms
                    .map(|m| format!(" (acknowledged {m:.0} ms before the kill)"))
                    .unwrap_or_default()
            ));
        }
    }
    if let (Some(got), Some(want)) = (a.bank_total, a.bank_expected) {
        if got != want {
            out.push_str(&format!("  {what}: bank total {got}, must be {want}\n"));
        }
    }
    out
}

/// `loadgen compare` lines for the crash runs present in both reports.
pub fn compare(base: &[CrashSummary], new: &[CrashSummary]) -> String {
    let mut out = String::new();
    for n in new {
        let Some(b) = base.iter().find(|b| {
            (&b.device, &b.durability, &b.tier, &b.workload)
                == (&n.device, &n.durability, &n.tier, &n.workload)
        }) else {
            continue;
        };
        let ready = |s: &CrashSummary| {
            let n = s.crashes.len().max(1) as f64;
            s.crashes.iter().map(|c| c.ready_ms).sum::<f64>() / n
        };
        out.push_str(&format!(
            "crash [{} {} {} {}]: kills {} -> {}, mean ready {:.0} -> {:.0} ms ({}), acknowledged {} -> {}, lost {} -> {}\n",
            n.device,
            n.durability,
            n.tier,
            n.workload,
            b.crashes.len(),
            n.crashes.len(),
            ready(b),
            ready(n),
            crate::compare::delta_lower_is_better(ready(b), ready(n)),
            thousands(b.acknowledged),
            thousands(n.acknowledged),
            b.lost,
            n.lost
        ));
    }
    out
}

#[cfg(test)]
pub mod tests {
    use super::*;

    pub fn sample(lost: u64) -> CrashSummary {
        let audit = AuditResult {
            keys_checked: 100,
            lost,
            lost_keys: (0..lost)
                .map(|k| LostKey {
                    keynum: k,
                    acked: 2,
                    found: 1,
                    acked_before_kill_ms: None,
                })
                .collect(),
            ..AuditResult::default()
        };
        CrashSummary {
            device: "nvme".into(),
            durability: "sync".into(),
            tier: "memory".into(),
            workload: "putget".into(),
            server_command: "ringkv-server".into(),
            interval_s: 2.0,
            async_window_ms: None,
            acknowledged: 5000,
            lost,
            crashes: vec![CrashEvent {
                kill_at_s: 1.5,
                ready_ms: 120.0,
                start_ms: 100.0,
                recovery: Some(Recovery {
                    duration_ms: 40.0,
                    replayed_bytes: 2_000_000,
                    replayed_records: 1500,
                }),
                audit,
                before: Window {
                    ops_per_sec: 20_000.0,
                    p99_us: 900.0,
                },
                after: Window {
                    ops_per_sec: 15_000.0,
                    p99_us: 1500.0,
                },
            }],
            final_audit: AuditResult {
                keys_checked: 100,
                ..AuditResult::default()
            },
            timeline: Vec::new(),
            window_s: 1.0,
        }
    }

    #[test]
    fn a_loss_fails_the_run_and_is_listed() {
        let ok = sample(0);
        assert!(!ok.failed());
        assert!(
            render(&ok).contains("acknowledged 5,000, lost 0"),
            "{}",
            render(&ok)
        );
        let bad = sample(2);
        assert!(bad.failed());
        let text = render(&bad);
        assert!(text.contains("key 1 acknowledged v2 found v1"), "{text}");
        assert!(text.contains("DURABILITY AUDIT FAILED"));
    }

    #[test]
    fn async_losses_count_only_outside_the_window() {
        let mut s = sample(3);
        s.async_window_ms = Some(260.0);
        assert!(!s.failed());
        s.crashes[0].audit.outside_window = 1;
        assert!(s.failed());
        // A broken bank total fails whatever the durability.
        let mut b = sample(0);
        b.final_audit.bank_total = Some(99);
        b.final_audit.bank_expected = Some(100);
        assert!(b.failed());
    }

    #[test]
    fn compare_pairs_runs_and_shows_ready_times() {
        let mut n = sample(0);
        n.crashes[0].ready_ms = 60.0;
        let text = compare(&[sample(0)], &[n]);
        assert!(text.contains("mean ready 120 -> 60 ms (+100%)"), "{text}");
    }
}
