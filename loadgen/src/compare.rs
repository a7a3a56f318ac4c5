//! `loadgen compare BASE.json NEW.json`: the GridGain report's "+298%"-style
//! deltas per operation, for throughput and each latency percentile.
//!
//! What must hold: deltas use the seed document's convention, where a
//! positive number always means NEW is better — throughput `NEW / BASE - 1`,
//! latency `BASE / NEW - 1` (e.g. 165,501 µs -> 35,441 µs is "+367%").
//! Rows are paired by (device, workload, durability, operation, items); rows
//! present in only one file are listed, not dropped.

use crate::report::{Report, ResultRow, Status};
use crate::table::{fixed0, fixed1, Align, Table};

/// "+298%", "-3%", or "n/a" when either side is zero.
pub fn delta_higher_is_better(base: f64, new: f64) -> String {
    percent(new, base)
}

/// Latency delta in the seed's convention: lower NEW is a positive delta.
pub fn delta_lower_is_better(base: f64, new: f64) -> String {
    percent(base, new)
}

fn percent(numerator: f64, denominator: f64) -> String {
    if numerator <= 0.0 || denominator <= 0.0 || !numerator.is_finite() || !denominator.is_finite()
    {
        return "n/a".to_string();
    }
    // Rounded first, so a tiny loss prints "+0%" rather than "-0%".
    let p = ((numerator / denominator - 1.0) * 100.0).round();
    if p == 0.0 {
        return "+0%".to_string();
    }
    format!("{p:+.0}%")
}

/// The comparison as text.
pub fn compare(base: &Report, base_label: &str, new: &Report, new_label: &str) -> String {
    let mut t = Table::new(&[
        ("Device", Align::Left),
        ("Workload", Align::Left),
        ("Storage", Align::Left),
        ("Operation", Align::Left),
        ("Run", Align::Left),
        ("Throughput, 1000 ops/s", Align::Right),
        ("Average (µs)", Align::Right),
        ("p50 (µs)", Align::Right),
        ("95th % (µs)", Align::Right),
        ("99th % (µs)", Align::Right),
        ("99.9th % (µs)", Align::Right),
        ("max (µs)", Align::Right),
    ]);
    let usable = |r: &&ResultRow| r.status != Status::Unsupported;
    let mut only_base = Vec::new();
    let mut paired = 0usize;
    for b in base.results.iter().filter(usable) {
        let Some(n) = new
            .results
            .iter()
            .filter(usable)
            .find(|n| n.key() == b.key())
        else {
            only_base.push(describe(b));
            continue;
        };
        paired += 1;
        let op = match b.items {
            Some(items) => format!("{} {}", b.operation, crate::cli::format_count(items)),
            None => b.operation.clone(),
        };
        let lead = |run: &str| {
            vec![
                b.device.clone(),
                b.workload.clone(),
                format!("{} ({})", b.storage, b.durability),
                op.clone(),
                run.to_string(),
            ]
        };
        for (label, r) in [(base_label, b), (new_label, n)] {
            let mut row = lead(label);
            row.push(fixed1(r.throughput_kops));
            for (_, v) in r.latency_us.labelled() {
                row.push(if v >= 100.0 { fixed0(v) } else { fixed1(v) });
            }
            t.push(row);
        }
        let mut row = lead("delta");
        row.push(delta_higher_is_better(b.ops_per_sec, n.ops_per_sec));
        for ((_, bv), (_, nv)) in b.latency_us.labelled().iter().zip(n.latency_us.labelled()) {
            row.push(delta_lower_is_better(*bv, nv));
        }
        t.push(row);
    }
    let only_new: Vec<String> = new
        .results
        .iter()
        .filter(usable)
        .filter(|n| !base.results.iter().any(|b| b.key() == n.key()))
        .map(describe)
        .collect();

    let mut out = format!(
        "Comparing {base_label} (loadgen {}, ringkv {}, {}) with {new_label} (loadgen {}, ringkv {}, {}).\n\
         Positive deltas mean {new_label} is better: throughput {new_label}/{base_label} - 1, latency {base_label}/{new_label} - 1.\n\n",
        base.loadgen_version,
        server_version(base),
        base.started_at,
        new.loadgen_version,
        server_version(new),
        new.started_at,
    );
    if paired == 0 {
        out.push_str("No operation appears in both reports.\n");
    } else {
        out.push_str(&t.render());
    }
    for (file, rows) in [(base_label, &only_base), (new_label, &only_new)] {
        if !rows.is_empty() {
            out.push_str(&format!("\nOnly in {file}: {}\n", rows.join("; ")));
        }
    }
    let crash = crate::crash::report::compare(&base.crash, &new.crash);
    if !crash.is_empty() {
        out.push('\n');
        out.push_str(&crash);
    }
    if base.machine != new.machine {
        out.push_str(&format!(
            "\nNote: the reports come from different machines ({} vs {}).\n",
            base.machine.describe(),
            new.machine.describe()
        ));
    }
    out
}

fn server_version(r: &Report) -> String {
    r.results
        .iter()
        .map(|row| row.server.version.as_str())
        .find(|v| !v.is_empty())
        .unwrap_or("?")
        .to_string()
}

fn describe(r: &ResultRow) -> String {
    match r.items {
        Some(n) => format!(
            "{} {} {} {} {}",
            r.device, r.workload, r.durability, r.operation, n
        ),
        None => format!(
            "{} {} {} {}",
            r.device, r.workload, r.durability, r.operation
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::tests::sample_report;

    #[test]
    fn deltas_follow_the_gridgain_convention() {
        // Throughput 92 -> 366 is "+298%"; average latency 165501 -> 35441 is "+367%".
        assert_eq!(delta_higher_is_better(92.0, 366.0), "+298%");
        assert_eq!(delta_lower_is_better(165_501.0, 35_441.0), "+367%");
        // 95th percentile got worse: 25759 -> 26575 is "-3%".
        assert_eq!(delta_lower_is_better(25_759.0, 26_575.0), "-3%");
        assert_eq!(delta_lower_is_better(100.0, 100.3), "+0%");
        assert_eq!(delta_higher_is_better(0.0, 5.0), "n/a");
        assert_eq!(delta_lower_is_better(5.0, 0.0), "n/a");
    }

    #[test]
    fn compare_pairs_rows_and_lists_the_rest() {
        let base = sample_report(&["nvme"], &["put", "get"], 1.0);
        let new = sample_report(&["nvme"], &["put", "scan"], 2.0);
        let text = compare(&base, "base.json", &new, "new.json");
        // put: throughput doubled and latencies halved -> +100% everywhere.
        let delta_line = text
            .lines()
            .find(|l| l.contains("| put ") && l.contains("delta"))
            .expect("delta row");
        assert_eq!(delta_line.matches("+100%").count(), 7, "{delta_line}");
        assert!(
            text.contains("Only in base.json: nvme putget sync get"),
            "{text}"
        );
        assert!(
            text.contains("Only in new.json: nvme putget sync scan"),
            "{text}"
        );
    }

    #[test]
    fn nothing_in_common_says_so() {
        let base = sample_report(&["sas"], &["put"], 1.0);
        let new = sample_report(&["nvme"], &["put"], 1.0);
        assert!(compare(&base, "a", &new, "b").contains("No operation appears in both reports."));
    }
}
