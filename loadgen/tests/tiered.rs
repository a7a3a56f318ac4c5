//! The tiered workload end to end, in a tiny size: the `loadgen` binary runs
//! its three layouts (all-nvme, all-sas, tiered) on embedded servers and
//! writes the report, `--json` and the cost chart.
//!
//! What must hold: the binary exits 0 (every answer verified); the report
//! has a row per layout and read distribution; the tiered layout put value
//! segments on both of its devices and the untiered ones on one. No timing
//! is asserted, and no aim: only that things ran and were counted.

use loadgen::report::{Report, Status};
use std::process::Command;

#[test]
fn tiered_workload_runs_three_layouts_and_splits_the_tiered_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("tiered.json");
    let svg = dir.path().join("tiered.svg");
    // One shard: the hot device is its least, four 1 MiB segments, and the
    // 8 MB of values overflow it onto the cold device.
    let out = Command::new(env!("CARGO_BIN_EXE_loadgen"))
        .args([
            "--workload",
            "tiered",
            "--shards",
            "1",
            "--threads",
            "2",
            "--records",
            "8K",
            "--warmup",
            "0",
            "--ops",
            "300",
            "--write-percent",
            "20",
            "--timeout",
            "60",
        ])
        .arg("--json")
        .arg(&json)
        .arg("--plot")
        .arg(&svg)
        .output()
        .expect("run loadgen");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "loadgen failed: {stdout}\n{stderr}");
    assert!(
        stdout.contains("Tiered: latency and throughput"),
        "{stdout}"
    );
    assert!(
        stdout.contains("Aims (tiered layout, zipfian reads"),
        "{stdout}"
    );

    let report = Report::read_json(&json).expect("json");
    assert_eq!(report.run.workload, "tiered");
    for r in &report.results {
        assert_eq!(r.status, Status::Ok, "{r:?}");
    }
    let rows: Vec<(&str, &str)> = report
        .tiered
        .iter()
        .map(|t| (t.distribution.as_str(), t.layout.as_str()))
        .collect();
    assert_eq!(
        rows,
        [
            ("zipfian", "all-nvme"),
            ("uniform", "all-nvme"),
            ("zipfian", "all-sas"),
            ("uniform", "all-sas"),
            ("zipfian", "tiered"),
            ("uniform", "tiered"),
        ]
    );
    for t in &report.tiered {
        assert!(t.ops_per_sec > 0.0, "{t:?}");
        assert!(t.get_latency_us.p99 >= t.get_latency_us.p50, "{t:?}");
        assert!(t.cost_per_month > 0.0, "{t:?}");
        let on = |role: &str| -> Vec<(&str, u64)> {
            t.classes
                .iter()
                .filter(|c| c.role == role)
                .map(|c| (c.profile.as_str(), c.bytes))
                .collect()
        };
        match t.layout.as_str() {
            "tiered" => {
                let hot = on("hot");
                let value = on("value");
                assert_eq!(hot.len(), 1, "{t:?}");
                assert_eq!(hot[0].0, "nvme");
                assert!(hot[0].1 > 0, "nothing on the hot device: {t:?}");
                assert_eq!(value[0].0, "sas");
                assert!(value[0].1 > 0, "nothing on the cold device: {t:?}");
                assert_eq!(t.hot_bytes, 4 << 20);
                if t.distribution == "zipfian" {
                    assert_eq!(t.aims.len(), 3, "{t:?}");
                }
            }
            untiered => {
                assert!(on("hot").is_empty(), "{t:?}");
                assert_eq!(t.hot_device_reads, 0, "{t:?}");
                let profile = if untiered == "all-nvme" {
                    "nvme"
                } else {
                    "sas"
                };
                assert_eq!(on("value")[0].0, profile);
                assert!(on("value")[0].1 > 0, "{t:?}");
            }
        }
        // Ratios against the untiered layouts of the same reads are filled.
        assert!(t.ratios.p99_vs_all_nvme.is_some(), "{t:?}");
        assert!(t.ratios.throughput_vs_all_sas.is_some(), "{t:?}");
    }
    let chart = std::fs::read_to_string(&svg).expect("chart");
    assert!(chart.contains("against storage cost"), "{chart}");
    assert!(chart.contains("tiered (uniform)"));
}
