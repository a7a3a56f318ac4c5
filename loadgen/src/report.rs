//! The result model and the `--json` file (schema `ringkv-loadgen/1`,
//! documented field by field in docs/loadgen.md).
//!
//! What must hold: every figure printed in a table comes from a [`ResultRow`]
//! in the same [`Report`]; the schema string changes whenever a field changes
//! meaning or is removed (adding fields keeps it); reading a file checks it.

use crate::driver::{OpTally, PhaseOutcome};
use crate::hist::LatencySummary;
use crate::machine::Machine;
use crate::stats::{device_counters, DeviceCounters, ServerInfo, StatsError};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The schema name written into every JSON file.
pub const SCHEMA: &str = "ringkv-loadgen/1";

/// Everything one `loadgen` invocation measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub schema: String,
    pub loadgen_version: String,
    /// UTC, RFC 3339.
    pub started_at: String,
    pub command_line: String,
    pub machine: Machine,
    pub run: RunSettings,
    pub results: Vec<ResultRow>,
    /// Crash runs (`--crash-every` / `--crashes`): kills, restarts, audits.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub crash: Vec<crate::crash::report::CrashSummary>,
    /// The tiered workload: one summary per layout and read distribution.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tiered: Vec<crate::workloads::tiered::TieredSummary>,
    /// Figures a seed document published for the run's workload (putget:
    /// the GridGain report's put and get rows), printed beside ours.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub published: Vec<PublishedRow>,
}

/// One row of a seed document's table, as published (other hardware).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PublishedRow {
    /// Who measured it and on what, e.g. "GridGain 9.1.1 (published, 2 servers)".
    pub system: String,
    /// "RAM Only" or "RAM+Disk" (the document's words).
    pub storage: String,
    pub operation: String,
    pub ops_per_sec: f64,
    /// Where the figure comes from.
    pub source: String,
}

impl Report {
    /// The published rows that belong beside this run's results: the
    /// GridGain report's for a putget run, none otherwise.
    pub fn published_rows_for(workload: &str) -> Vec<PublishedRow> {
        if workload != crate::workloads::gridgain::WORKLOAD {
            return Vec::new();
        }
        crate::published::PUTGET
            .iter()
            .map(|p| PublishedRow {
                system: format!(
                    "{} ({})",
                    crate::published::PUTGET_SYSTEM,
                    crate::published::PUTGET_LABEL
                ),
                storage: p.storage.to_string(),
                operation: p.operation.to_string(),
                ops_per_sec: p.ops_per_sec as f64,
                source: crate::published::PUTGET_SOURCE.to_string(),
            })
            .collect()
    }
}

/// The settings the run used (after defaults).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunSettings {
    pub workload: String,
    /// "engine" (in-process library), "embedded" (server on loopback) or
    /// "server" (`--server ADDR`).
    pub target: String,
    /// The sweep's method in words (sweep only).
    #[serde(default)]
    pub method: Option<String>,
    /// The `--server` address, if any.
    pub server_addr: Option<String>,
    /// Device classes asked for (embedded); empty with `--server`.
    pub devices: Vec<String>,
    pub threads: usize,
    pub batch: usize,
    pub records: u64,
    pub duration_s: Option<f64>,
    pub ops: Option<u64>,
    pub warmup_s: f64,
    /// "closed" or "open".
    pub mode: String,
    pub rate_ops_per_sec: Option<f64>,
    pub seed: u64,
    pub field_count: usize,
    pub field_length: usize,
    pub sweep_sizes: Vec<u64>,
    /// Shards of the embedded server (0 = one per core).
    pub shards: u32,
    /// Free-text caveats printed in the header (CPU sharing, deviations).
    pub notes: Vec<String>,
    /// PutGetTx: the keys (accounts) are `[0, txn_range)`; null for other
    /// workloads and in files from before it was recorded.
    #[serde(default)]
    pub txn_range: Option<u64>,
    /// The allocator that served this process's heap ("mimalloc", as
    /// `ringkv-server` uses, or "system"); null in files from before it was
    /// recorded.
    #[serde(default)]
    pub allocator: Option<String>,
}

/// How a result ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Every operation answered as expected.
    Ok,
    /// Some operations failed, were missing or had wrong values.
    Errors,
    /// The server cannot run this operation (no numbers).
    Unsupported,
}

/// Operations that went wrong during a phase (warm-up included).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ErrorCounts {
    pub failed: u64,
    pub not_found: u64,
    pub wrong_value: u64,
    pub first_failure: Option<String>,
}

/// WAL activity during the phase (server-wide STATS).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WalCounters {
    pub bytes_written: u64,
    pub flushes: u64,
    /// Since-start p99 fdatasync latency, read after the phase.
    pub fsync_p99_us: u64,
}

/// One operation of one workload on one device class.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResultRow {
    /// Device class: the server's WAL-device profile, from STATS.
    pub device: String,
    pub workload: String,
    pub operation: String,
    /// The server's durability (sync | async | none), from STATS.
    pub durability: String,
    /// "RAM Only" (durability none) or "RAM+Disk".
    pub storage: String,
    /// Items written/read (the sweep's N); absent for timed phases.
    pub items: Option<u64>,
    pub status: Status,
    /// Why a row is unsupported, or other caveats.
    pub note: Option<String>,
    /// "closed" or "open".
    pub mode: String,
    /// Operations measured (warm-up excluded).
    pub ops: u64,
    /// Batches (steps) measured.
    pub batches: u64,
    /// Measured time, nanoseconds.
    pub elapsed_ns: u64,
    pub ops_per_sec: f64,
    /// `ops_per_sec / 1000`: the GridGain table's "Throughput, 1000 ops/s".
    pub throughput_kops: f64,
    /// Latency of one batch, µs (from the intended send time in open loop).
    pub latency_us: LatencySummary,
    /// The same latency at the percentiles of `hist::SPECTRUM_PERCENTILES`
    /// (the charts' "nines" axis); empty in reports from before it existed.
    #[serde(default)]
    pub latency_spectrum: Vec<crate::hist::SpectrumPoint>,
    pub errors: ErrorCounts,
    pub server: ServerInfo,
    /// Per-device activity during the measured window, by device name.
    pub device_counters: BTreeMap<String, DeviceCounters>,
    pub wal: WalCounters,
    /// The device and WAL counters are lower bounds (crash runs: I/O
    /// between the last STATS reading of a killed server and the kill is
    /// not counted).
    #[serde(default)]
    pub counters_lower_bound: bool,
    /// Bytes of keys and values the window's puts carried (0 for reads and
    /// in files from before it was recorded).
    #[serde(default)]
    pub payload_bytes: u64,
    /// How much of the WAL device's profile the window used; null when the
    /// row has no device counters or the profile's limits are unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_use: Option<DeviceUse>,
    /// Operations per second and batch p99 of each second of the window
    /// (empty in files from before it was recorded and for phases not run
    /// by the driver).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub timeline: Vec<crate::crash::timeline::TimelinePoint>,
}

/// A share at or above this (of the bandwidth cap or the burst IOPS) names
/// the device as what bounds a row.
pub const BOUND_SHARE: f64 = 0.9;

/// What a measured window asked of the WAL device, against its profile.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceUse {
    /// The device's bytes written over the payload bytes put (null when
    /// nothing was put).
    pub bytes_written_per_payload_byte: Option<f64>,
    /// Achieved MB/s (read + written) over the profile's cap; null when
    /// the profile has no bandwidth cap.
    pub bandwidth_share: Option<f64>,
    /// Achieved I/O units/s over the profile's burst IOPS (the rate the
    /// throttle allows while burst credit lasts); null when unlimited.
    pub iops_share: Option<f64>,
    /// "device bandwidth (98%)", "device IOPS (95%)" or "—".
    pub bound: String,
}

impl DeviceUse {
    /// From a window's WAL-device counters, its length and payload.
    pub fn of(dev: &DeviceCounters, seconds: f64, payload_bytes: u64) -> Option<DeviceUse> {
        let limits = crate::stats::profile_limits(&dev.profile)?;
        let per_payload =
            (payload_bytes > 0).then(|| dev.bytes_written as f64 / payload_bytes as f64);
        let bandwidth_share = (limits.bytes_per_sec > 0 && seconds > 0.0).then(|| {
            (dev.bytes_read + dev.bytes_written) as f64 / seconds / limits.bytes_per_sec as f64
        });
        let iops_share = (limits.burst_iops > 0).then(|| dev.iops / limits.burst_iops as f64);
        let bound = match (bandwidth_share, iops_share) {
            (Some(b), i) if b >= BOUND_SHARE && i.is_none_or(|i| b >= i) => {
                format!("device bandwidth ({:.0}%)", 100.0 * b)
            }
            (_, Some(i)) if i >= BOUND_SHARE => format!("device IOPS ({:.0}%)", 100.0 * i),
            _ => "—".to_string(),
        };
        Some(DeviceUse {
            bytes_written_per_payload_byte: per_payload,
            bandwidth_share,
            iops_share,
            bound,
        })
    }
}

impl ResultRow {
    /// The time of all `items` (the sweep's N): measured, or, when the
    /// phase read a sample of them (`--sweep-reads`), the sample's time
    /// scaled to N at its rate (`true`: scaled).
    pub fn items_time_ns(&self) -> (u64, bool) {
        match self.items {
            Some(n) if self.ops > 0 && self.ops < n => (
                u64::try_from(u128::from(self.elapsed_ns) * u128::from(n) / u128::from(self.ops))
                    .unwrap_or(u64::MAX),
                true,
            ),
            _ => (self.elapsed_ns, false),
        }
    }

    /// The counters of the WAL device (`wal`, else the first one).
    pub fn wal_device(&self) -> Option<&DeviceCounters> {
        self.device_counters
            .get("wal")
            .or_else(|| self.device_counters.values().next())
    }

    /// Identity used to pair rows across files (`loadgen compare`).
    pub fn key(&self) -> (String, String, String, String, Option<u64>) {
        (
            self.device.clone(),
            self.workload.clone(),
            self.durability.clone(),
            self.operation.clone(),
            self.items,
        )
    }

    /// A row for an operation the server cannot run.
    pub fn unsupported(
        server: ServerInfo,
        workload: &str,
        operation: &str,
        reason: &str,
    ) -> ResultRow {
        ResultRow {
            device: server.profile.clone(),
            workload: workload.to_string(),
            operation: operation.to_string(),
            durability: server.durability.clone(),
            storage: storage_label(&server.durability).to_string(),
            items: None,
            status: Status::Unsupported,
            note: Some(reason.to_string()),
            mode: String::new(),
            ops: 0,
            batches: 0,
            elapsed_ns: 0,
            ops_per_sec: 0.0,
            throughput_kops: 0.0,
            latency_us: LatencySummary::default(),
            latency_spectrum: Vec::new(),
            errors: ErrorCounts::default(),
            server,
            device_counters: BTreeMap::new(),
            wal: WalCounters::default(),
            counters_lower_bound: false,
            payload_bytes: 0,
            device_use: None,
            timeline: Vec::new(),
        }
    }
}

/// The steadiness aims: the slowest second at least this share of
/// the median second ...
pub const STEADY_SLOWEST_SHARE: f64 = 0.8;
/// ... and no second's batch p99 above this many times the phase's p50.
pub const STEADY_P99_OVER_P50: f64 = 5.0;

/// How even a phase's seconds were, from its timeline.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Steadiness {
    /// Points (seconds) of the timeline.
    pub seconds: usize,
    pub median_ops_per_sec: f64,
    pub slowest_ops_per_sec: f64,
    /// Slowest second over the median second (1.0 = as fast).
    pub slowest_share: f64,
    /// The highest per-second batch p99, µs.
    pub worst_p99_us: f64,
    /// The phase's batch p50, µs.
    pub p50_us: f64,
    /// `worst_p99_us / p50_us` (0 when p50 is 0).
    pub worst_p99_over_p50: f64,
}

impl Steadiness {
    /// Both aims met.
    pub fn met(&self) -> bool {
        self.slowest_share >= STEADY_SLOWEST_SHARE && self.worst_p99_over_p50 <= STEADY_P99_OVER_P50
    }
}

impl ResultRow {
    /// The row's steadiness, when its timeline has at least two seconds.
    pub fn steadiness(&self) -> Option<Steadiness> {
        if self.timeline.len() < 2 || self.ops == 0 {
            return None;
        }
        let mut rates: Vec<f64> = self.timeline.iter().map(|p| p.ops_per_sec).collect();
        rates.sort_by(f64::total_cmp);
        let mid = rates.len() / 2;
        let median = if rates.len().is_multiple_of(2) {
            (rates[mid - 1] + rates[mid]) / 2.0
        } else {
            rates[mid]
        };
        let slowest = rates[0];
        let worst_p99 = self.timeline.iter().map(|p| p.p99_us).fold(0.0, f64::max);
        let p50 = self.latency_us.p50;
        Some(Steadiness {
            seconds: self.timeline.len(),
            median_ops_per_sec: median,
            slowest_ops_per_sec: slowest,
            slowest_share: if median > 0.0 { slowest / median } else { 0.0 },
            worst_p99_us: worst_p99,
            p50_us: p50,
            worst_p99_over_p50: if p50 > 0.0 { worst_p99 / p50 } else { 0.0 },
        })
    }
}

/// "RAM Only" for durability `none`, else "RAM+Disk" (the GridGain table's words).
pub fn storage_label(durability: &str) -> &'static str {
    if durability == "none" {
        "RAM Only"
    } else {
        "RAM+Disk"
    }
}

/// Turns a phase into rows, one per operation kind, in `order` (kinds not in
/// `order` follow alphabetically). Throughput per kind is its operations over
/// the phase's measured time.
pub fn rows_from_phase(
    workload: &str,
    outcome: &PhaseOutcome,
    order: &[&str],
    items: Option<u64>,
    mode: &str,
) -> Result<Vec<ResultRow>, StatsError> {
    let seconds = outcome.elapsed.as_secs_f64();
    let counters = device_counters(&outcome.before, &outcome.after, seconds)?;
    let server = outcome.after.info();
    let wal = WalCounters {
        bytes_written: outcome
            .after
            .wal_bytes_written
            .saturating_sub(outcome.before.wal_bytes_written),
        flushes: outcome
            .after
            .wal_flushes
            .saturating_sub(outcome.before.wal_flushes),
        fsync_p99_us: outcome.after.wal_fsync_p99_us,
    };
    let mut kinds: Vec<&&str> = outcome.tallies.keys().collect();
    kinds.sort_by_key(|k| {
        (
            order.iter().position(|o| *o == **k).unwrap_or(usize::MAX),
            **k,
        )
    });
    Ok(kinds
        .into_iter()
        .map(|kind| {
            let t: &OpTally = &outcome.tallies[*kind];
            let ops_per_sec = if seconds > 0.0 { t.ops as f64 / seconds } else { 0.0 };
            let errors = ErrorCounts {
                failed: t.failed,
                not_found: t.not_found,
                wrong_value: t.wrong_value,
                first_failure: t.first_failure.clone(),
            };
            ResultRow {
                device: server.profile.clone(),
                workload: workload.to_string(),
                operation: kind.to_string(),
                durability: server.durability.clone(),
                storage: storage_label(&server.durability).to_string(),
                items,
                status: if t.error_count() == 0 { Status::Ok } else { Status::Errors },
                note: (outcome.missed_batches > 0).then(|| {
                    format!(
                        "open loop fell behind: {} scheduled batches were not sent before the window closed (target rate not sustained)",
                        outcome.missed_batches
                    )
                }),
                mode: mode.to_string(),
                ops: t.ops,
                batches: t.steps,
                elapsed_ns: u64::try_from(outcome.elapsed.as_nanos()).unwrap_or(u64::MAX),
                ops_per_sec,
                throughput_kops: ops_per_sec / 1000.0,
                latency_us: t.hist.summary(),
                latency_spectrum: t.hist.spectrum(),
                errors,
                server: server.clone(),
                device_counters: counters.clone(),
                wal: wal.clone(),
                counters_lower_bound: false,
                payload_bytes: t.payload_bytes,
                device_use: counters
                    .get("wal")
                    .or_else(|| counters.values().next())
                    .and_then(|dev| DeviceUse::of(dev, seconds, t.payload_bytes)),
                timeline: outcome.timelines.get(*kind).cloned().unwrap_or_default(),
            }
        })
        .collect())
}

/// Problems reading or writing report files.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReportError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not a loadgen report: {source}")]
    Parse {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("{path} has schema {got:?}; this loadgen reads {expected:?}")]
    Schema {
        path: PathBuf,
        expected: &'static str,
        got: String,
    },
}

impl Report {
    pub fn write_json(&self, path: &Path) -> Result<(), ReportError> {
        let text = serde_json::to_string_pretty(self).expect("a report always serializes");
        std::fs::write(path, text + "\n").map_err(|source| ReportError::Write {
            path: path.to_path_buf(),
            source,
        })
    }

    pub fn read_json(path: &Path) -> Result<Report, ReportError> {
        let text = std::fs::read_to_string(path).map_err(|source| ReportError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        // Check the schema first so an old or foreign file gets a clear message.
        let value: serde_json::Value =
            serde_json::from_str(&text).map_err(|source| ReportError::Parse {
                path: path.to_path_buf(),
                source,
            })?;
        let got = value
            .get("schema")
            .and_then(|s| s.as_str())
            .unwrap_or("")
            .to_string();
        if got != SCHEMA {
            return Err(ReportError::Schema {
                path: path.to_path_buf(),
                expected: SCHEMA,
                got,
            });
        }
        serde_json::from_value(value).map_err(|source| ReportError::Parse {
            path: path.to_path_buf(),
            source,
        })
    }

    /// Any row with errors.
    pub fn has_errors(&self) -> bool {
        self.results.iter().any(|r| r.status == Status::Errors)
            || self.crash.iter().any(|c| c.failed())
    }
}

#[cfg(test)]
pub mod tests {
    use super::*;
    use crate::machine::Machine;

    /// A report with one row per (device, operation), numbers derived from
    /// `scale` so tests can tell rows apart.
    pub fn sample_report(devices: &[&str], ops: &[&str], scale: f64) -> Report {
        let mut results = Vec::new();
        for (di, device) in devices.iter().enumerate() {
            for (oi, op) in ops.iter().enumerate() {
                let kops = scale * (100.0 + 10.0 * di as f64 + oi as f64);
                let mut counters = BTreeMap::new();
                counters.insert(
                    "wal".to_string(),
                    DeviceCounters {
                        profile: device.to_string(),
                        ios: 1000,
                        iops: 500.0 * (di + 1) as f64,
                        fsync_p99_us: 200,
                        ..DeviceCounters::default()
                    },
                );
                results.push(ResultRow {
                    device: device.to_string(),
                    workload: "putget".into(),
                    operation: op.to_string(),
                    durability: "sync".into(),
                    storage: "RAM+Disk".into(),
                    items: None,
                    status: Status::Ok,
                    note: None,
                    mode: "closed".into(),
                    ops: 1000,
                    batches: 1,
                    elapsed_ns: 1_000_000,
                    ops_per_sec: kops * 1000.0,
                    throughput_kops: kops,
                    latency_us: LatencySummary {
                        avg: 1000.0 / scale,
                        p50: 900.0 / scale,
                        p95: 2000.0 / scale,
                        p99: 3000.0 / scale,
                        p999: 4000.0 / scale,
                        max: 5000.0 / scale,
                    },
                    latency_spectrum: crate::hist::SPECTRUM_PERCENTILES
                        .iter()
                        .enumerate()
                        .map(|(i, &p)| crate::hist::SpectrumPoint {
                            percentile: p,
                            us: 900.0 * (1.0 + i as f64 * 0.5) / scale,
                        })
                        .collect(),
                    errors: ErrorCounts::default(),
                    server: ServerInfo {
                        version: "0.1.0".into(),
                        profile: device.to_string(),
                        durability: "sync".into(),
                        ..ServerInfo::default()
                    },
                    device_counters: counters,
                    wal: WalCounters::default(),
                    counters_lower_bound: false,
                    payload_bytes: 0,
                    device_use: None,
                    timeline: Vec::new(),
                });
            }
        }
        Report {
            schema: SCHEMA.into(),
            loadgen_version: "0.1.0".into(),
            started_at: "2026-01-01T00:00:00Z".into(),
            command_line: "loadgen".into(),
            machine: Machine::default(),
            run: RunSettings {
                workload: "putget".into(),
                target: "embedded".into(),
                method: None,
                server_addr: None,
                devices: devices.iter().map(|d| d.to_string()).collect(),
                threads: 16,
                batch: 1000,
                records: 1000,
                duration_s: Some(1.0),
                ops: None,
                warmup_s: 0.0,
                mode: "closed".into(),
                rate_ops_per_sec: None,
                seed: 0,
                field_count: 10,
                field_length: 100,
                sweep_sizes: vec![],
                shards: 0,
                notes: vec![],
                txn_range: None,
                allocator: None,
            },
            results,
            crash: Vec::new(),
            tiered: Vec::new(),
            published: Vec::new(),
        }
    }

    #[test]
    fn json_round_trips_and_checks_schema() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("r.json");
        let report = sample_report(&["nvme"], &["put", "get"], 1.0);
        report.write_json(&path).expect("write");
        assert_eq!(Report::read_json(&path).expect("read"), report);

        let mut other = serde_json::to_value(&report).expect("value");
        other["schema"] = serde_json::Value::from("something-else/9");
        std::fs::write(&path, other.to_string()).expect("write");
        assert!(matches!(
            Report::read_json(&path),
            Err(ReportError::Schema { .. })
        ));

        std::fs::write(&path, "not json").expect("write");
        assert!(matches!(
            Report::read_json(&path),
            Err(ReportError::Parse { .. })
        ));
    }

    #[test]
    fn json_has_the_documented_field_names() {
        let report = sample_report(&["nvme"], &["put"], 1.0);
        let v = serde_json::to_value(&report).expect("value");
        let row = &v["results"][0];
        for field in [
            "device",
            "workload",
            "operation",
            "durability",
            "ops_per_sec",
            "latency_us",
            "device_counters",
        ] {
            assert!(row.get(field).is_some(), "missing {field}");
        }
        for p in ["avg", "p50", "p95", "p99", "p999", "max"] {
            assert!(row["latency_us"].get(p).is_some(), "missing latency_us.{p}");
        }
        for f in [
            "ios",
            "bytes_read",
            "bytes_written",
            "fsync_p99_us",
            "token_wait_us",
            "iops",
        ] {
            assert!(
                row["device_counters"]["wal"].get(f).is_some(),
                "missing device_counters.wal.{f}"
            );
        }
        assert_eq!(row["status"], "ok");
    }

    #[test]
    fn storage_labels_follow_the_seed_document() {
        assert_eq!(storage_label("none"), "RAM Only");
        assert_eq!(storage_label("sync"), "RAM+Disk");
        assert_eq!(storage_label("async"), "RAM+Disk");
    }

    #[test]
    fn a_lost_write_makes_the_report_fail_and_survives_json() {
        let mut r = sample_report(&["nvme"], &["put"], 1.0);
        assert!(!r.has_errors());
        r.crash.push(crate::crash::report::tests::sample(0));
        assert!(!r.has_errors());
        r.crash.push(crate::crash::report::tests::sample(3));
        assert!(r.has_errors(), "a loss sets exit status 1");
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("r.json");
        r.write_json(&path).expect("write");
        assert_eq!(Report::read_json(&path).expect("read"), r);
    }

    #[test]
    fn a_row_from_before_the_timeline_still_loads() {
        let report = sample_report(&["nvme"], &["put"], 1.0);
        let mut v = serde_json::to_value(&report).expect("value");
        let row = v["results"][0].as_object_mut().expect("row");
        for field in ["timeline", "payload_bytes", "device_use"] {
            row.remove(field);
        }
        v.as_object_mut().expect("report").remove("published");
        let back: Report = serde_json::from_value(v).expect("an older report loads");
        assert!(back.results[0].timeline.is_empty());
        assert_eq!(back.results[0].payload_bytes, 0);
        assert!(back.published.is_empty());
    }

    #[test]
    fn device_use_names_the_limit_a_row_ran_into() {
        // nvme: 16,000 burst IOPS and a bandwidth cap; 10 s windows.
        let limits = crate::stats::profile_limits("nvme").expect("nvme");
        let cap = limits.bytes_per_sec as f64;
        let dev = |bytes_written: f64, iops: f64| DeviceCounters {
            profile: "nvme".into(),
            bytes_written: bytes_written as u64,
            iops,
            ..DeviceCounters::default()
        };
        let u = DeviceUse::of(&dev(0.98 * cap * 10.0, 1_000.0), 10.0, 1_000_000_000)
            .expect("a built-in profile");
        assert_eq!(u.bound, "device bandwidth (98%)");
        let per_payload = u.bytes_written_per_payload_byte.expect("puts");
        assert!((per_payload - 0.98 * cap * 10.0 / 1e9).abs() < 1e-9);
        let u = DeviceUse::of(&dev(0.1 * cap * 10.0, 15_200.0), 10.0, 0).expect("nvme");
        assert_eq!(u.bound, "device IOPS (95%)");
        assert_eq!(u.bytes_written_per_payload_byte, None, "no puts");
        let u = DeviceUse::of(&dev(0.5 * cap * 10.0, 8_000.0), 10.0, 1).expect("nvme");
        assert_eq!(u.bound, "—");
        assert!((u.iops_share.expect("limited") - 0.5).abs() < 1e-9);
        assert_eq!(
            DeviceUse::of(&dev(1.0, 1.0), 10.0, 1).map(|u| u.bound),
            Some("—".into())
        );
        let mut custom = dev(1.0, 1.0);
        custom.profile = "custom-disk".into();
        assert_eq!(DeviceUse::of(&custom, 10.0, 1), None, "unknown limits");
    }

    #[test]
    fn steadiness_compares_the_slowest_second_with_the_median() {
        use crate::crash::timeline::TimelinePoint;
        let mut r = sample_report(&["nvme"], &["put"], 1.0).results.remove(0);
        assert_eq!(r.steadiness(), None, "no timeline");
        let point = |at_s: f64, ops_per_sec: f64, p99_us: f64| TimelinePoint {
            at_s,
            ops_per_sec,
            p99_us,
        };
        r.timeline = vec![
            point(0.0, 1000.0, 1000.0),
            point(1.0, 700.0, 2000.0),
            point(2.0, 1100.0, 1500.0),
            point(3.0, 900.0, 1200.0),
        ];
        r.latency_us.p50 = 500.0;
        let s = r.steadiness().expect("four seconds");
        assert_eq!(s.seconds, 4);
        assert_eq!(s.median_ops_per_sec, 950.0);
        assert_eq!(s.slowest_ops_per_sec, 700.0);
        assert!((s.slowest_share - 700.0 / 950.0).abs() < 1e-12);
        assert_eq!(s.worst_p99_us, 2000.0);
        assert_eq!(s.worst_p99_over_p50, 4.0);
        assert!(!s.met(), "the slowest second is 74% of the median");
        r.timeline[1].ops_per_sec = 800.0;
        assert!(r.steadiness().expect("steady").met());
        r.timeline[1].p99_us = 2600.0;
        assert!(!r.steadiness().expect("a slow second").met(), "5.2x p50");
    }
}
