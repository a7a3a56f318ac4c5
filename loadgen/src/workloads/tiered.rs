//! The hybrid tier's hot device, shown by what it buys: the same data set,
//! the same read/write mix, on three layouts — every value on `nvme`,
//! every value on `sas`, and tiered (`sas` cold, an `nvme` hot device
//! sized to a tenth of the data) — with each one's GET latency, throughput,
//! the share of device reads each device served, the bytes on each device
//! class and what those bytes cost a month at per-class prices.
//!
//! What must hold:
//! - Every layout gets a fresh embedded server (the caller starts one per
//!   layout) with the hybrid tier, the same records, the same segment size
//!   and the same small read cache, so the layouts differ in their devices
//!   only.
//! - The device-read shares are STATS deltas over the measured window
//!   (warm-up excluded): `tier.hot_reads` were served by the hot device,
//!   `tier.cold_reads - tier.hot_reads` by the value device.
//! - The bytes on each class are STATS gauges read after the window:
//!   `tier.hot_segment_bytes` on the hot device, the rest of
//!   `tier.segment_bytes` on the value device. Cost is those bytes in GB
//!   (2^30 bytes, as the clouds bill) times the class's price per GB-month.
//! - The aims are measured and reported, met or not; nothing is asserted
//!   about them.

use super::ycsb::{Distribution, Mix, ReadTrace, OPERATIONS};
use crate::driver::{DriverError, PhaseOutcome};
use crate::hist::LatencySummary;
use crate::keys::InsertSequence;
use crate::record::{RecordShape, ValuePool};
use crate::report::{rows_from_phase, ResultRow};
use crate::settings::Settings;
use crate::target::Target;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// Default share of the measured operations that are writes (updates).
pub const DEFAULT_WRITE_PERCENT: u32 = 5;
/// The largest `--write-percent` (the range is 5-50%).
pub const MAX_WRITE_PERCENT: u32 = 50;
/// Default size of the hot device, as a percent of the data set's bytes.
pub const DEFAULT_HOT_PERCENT: u32 = 10;
/// Value segment size of every layout (`storage.value_segment_size`): small,
/// so a hot device of a tenth of a data set of a few hundred MB still has
/// the four segments per shard the engine needs.
pub const SEGMENT_BYTES: u64 = 1 << 20;
/// The largest value of every layout (`limits.value_bytes_max`): a value
/// segment must hold the largest record, so this is lowered with the
/// segment size (the engine's default, 8 MiB, needs 8 MiB segments).
pub const VALUE_BYTES_MAX: u64 = 512 << 10;
/// Default read cache of the whole server: small, so reads reach the devices.
pub const DEFAULT_CACHE_BYTES: u64 = 4 << 20;
/// Records per batch of the load phase.
pub const LOAD_BATCH: usize = 1000;
/// Bytes in the GB of a price per GB-month (the clouds bill GiB).
pub const GB: f64 = (1u64 << 30) as f64;

/// Price of a GB-month on each device class, in dollars.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Prices {
    pub nvme: f64,
    pub sas: f64,
    pub gpssd: f64,
}

impl Default for Prices {
    /// Public-cloud list prices of block storage (AWS EBS, us-east-1):
    /// provisioned-IOPS SSD (io2) $0.125 for `nvme`, general purpose SSD
    /// (gp3) $0.08 for `gpssd`, throughput-optimized HDD (st1) $0.045 for
    /// `sas`.
    fn default() -> Prices {
        Prices {
            nvme: 0.125,
            sas: 0.045,
            gpssd: 0.08,
        }
    }
}

impl Prices {
    /// The price of a GB-month on `profile` (0 for a class without a price:
    /// `unthrottled` is not a class one buys).
    pub fn per_gb_month(&self, profile: &str) -> f64 {
        match profile {
            "nvme" => self.nvme,
            "sas" => self.sas,
            "gpssd" => self.gpssd,
            _ => 0.0,
        }
    }
}

/// Where the values (and the WAL) of one configuration live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Every value segment and the WAL on `nvme`.
    AllNvme,
    /// Every value segment and the WAL on `sas`.
    AllSas,
    /// Value segments on `sas` behind an `nvme` hot device; the WAL on the
    /// `nvme` device (one throttle for the class, as in all-nvme).
    Tiered,
}

/// The three layouts, in report order.
pub const LAYOUTS: [Layout; 3] = [Layout::AllNvme, Layout::AllSas, Layout::Tiered];

/// The name of the device `Layout::Tiered` adds for its cold values.
pub const COLD_DEVICE: &str = "cold";

impl Layout {
    pub fn name(&self) -> &'static str {
        match self {
            Layout::AllNvme => "all-nvme",
            Layout::AllSas => "all-sas",
            Layout::Tiered => "tiered",
        }
    }

    /// Profile of the WAL device (also the value device, untiered).
    pub fn wal_profile(&self) -> &'static str {
        match self {
            Layout::AllNvme | Layout::Tiered => "nvme",
            Layout::AllSas => "sas",
        }
    }

    /// Profile of `storage.value_device` (the cold device when tiered).
    pub fn value_profile(&self) -> &'static str {
        match self {
            Layout::AllNvme => "nvme",
            Layout::AllSas | Layout::Tiered => "sas",
        }
    }

    /// Profile of `storage.hot_device`, if the layout has one.
    pub fn hot_profile(&self) -> Option<&'static str> {
        match self {
            Layout::Tiered => Some("nvme"),
            Layout::AllNvme | Layout::AllSas => None,
        }
    }

    /// Changes an embedded server's config (made with `wal_profile` on its
    /// WAL device) into this layout: the hybrid tier's segment size (and the
    /// largest value, which must fit in a segment), and for
    /// the tiered layout a `sas` value device in the data directory and the
    /// WAL device as the hot device, holding `hot_bytes` (whole server).
    pub fn apply(&self, config: &mut tunables::Config, hot: HotTuning) {
        config.storage.tier = tunables::Tier::Hybrid;
        config.storage.value_segment_size = tunables::ByteSize(SEGMENT_BYTES);
        config.limits.value_bytes_max = tunables::ByteSize(VALUE_BYTES_MAX);
        if let Some(hot_profile) = self.hot_profile() {
            let wal = config.storage.wal_device.clone();
            if let Some(device) = config.devices.get_mut(&wal) {
                device.profile = hot_profile.to_string();
            }
            config.devices.insert(
                COLD_DEVICE.to_string(),
                tunables::DeviceConfig {
                    path: std::path::PathBuf::new(),
                    profile: self.value_profile().to_string(),
                },
            );
            config.storage.value_device = COLD_DEVICE.to_string();
            config.storage.hot_device = wal;
            config.storage.hot_bytes = tunables::ByteSize(hot.bytes);
            config.storage.hot_promote_reads = hot.promote_reads;
            config.storage.hot_move_percent = hot.move_percent;
        }
    }
}

/// The tiered layout's hot device: its size (whole server) and the
/// placement settings (`storage.hot_bytes`, `hot_promote_reads`,
/// `hot_move_percent`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HotTuning {
    pub bytes: u64,
    pub promote_reads: u32,
    pub move_percent: u32,
}

/// What the tiered workload runs, beyond the common settings.
#[derive(Debug, Clone, PartialEq)]
pub struct TieredPlan {
    /// Percent of the measured operations that are updates (0..=50).
    pub write_percent: u32,
    /// The read distributions to measure, one phase each, in order.
    pub distributions: Vec<Distribution>,
    /// The hot device's size as a percent of the data set's bytes.
    pub hot_percent: u32,
    /// `storage.hot_promote_reads` and `storage.hot_move_percent` of the
    /// tiered layout.
    pub promote_reads: u32,
    pub move_percent: u32,
    pub prices: Prices,
    /// The server's RAM read cache (`storage.cache_bytes`), for the bound.
    pub cache_bytes: u64,
}

/// The data set's bytes: records times the value size (keys and record
/// headers left out).
pub fn data_bytes(records: u64, shape: RecordShape) -> u64 {
    records.saturating_mul(shape.value_bytes() as u64)
}

/// The hot device's size for the whole server: `hot_percent` of
/// `data_bytes`, split over `shards`, each shard's part rounded up to whole
/// segments and to at least the four segments the engine needs.
pub fn hot_bytes(data_bytes: u64, hot_percent: u32, shards: u64, segment_bytes: u64) -> u64 {
    let shards = shards.max(1);
    let segment = segment_bytes.max(1);
    let want = u128::from(data_bytes) * u128::from(hot_percent) / 100;
    let per_shard = u64::try_from(want.div_ceil(u128::from(shards))).unwrap_or(u64::MAX);
    let per_shard = per_shard.max(4 * segment).div_ceil(segment) * segment;
    per_shard.saturating_mul(shards)
}

/// Bytes of value segments on one device class, and what they cost.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClassBytes {
    /// The device's profile (its class).
    pub profile: String,
    /// Which device: "hot" or "value".
    pub role: String,
    pub bytes: u64,
    pub price_per_gb_month: f64,
    /// `bytes / 2^30 * price_per_gb_month`.
    pub cost_per_month: f64,
}

/// The bytes of value segments on each class of `layout`, from STATS: the
/// hot device holds `hot_segment_bytes`, the value device the rest of
/// `segment_bytes`.
pub fn classes(
    layout: Layout,
    segment_bytes: u64,
    hot_segment_bytes: u64,
    prices: &Prices,
) -> Vec<ClassBytes> {
    let class = |profile: &str, role: &str, bytes: u64| {
        let price = prices.per_gb_month(profile);
        ClassBytes {
            profile: profile.to_string(),
            role: role.to_string(),
            bytes,
            price_per_gb_month: price,
            cost_per_month: bytes as f64 / GB * price,
        }
    };
    let mut out = Vec::new();
    if let Some(hot) = layout.hot_profile() {
        out.push(class(hot, "hot", hot_segment_bytes));
    }
    out.push(class(
        layout.value_profile(),
        "value",
        segment_bytes.saturating_sub(hot_segment_bytes),
    ));
    out
}

/// One layout's figures under one read distribution.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TieredSummary {
    /// "all-nvme", "all-sas" or "tiered".
    pub layout: String,
    /// "zipfian" or "uniform".
    pub distribution: String,
    pub write_percent: u32,
    pub value_profile: String,
    pub hot_profile: Option<String>,
    /// `storage.hot_bytes` (whole server; 0 without a hot device).
    pub hot_bytes: u64,
    pub records: u64,
    /// Records times the value size.
    pub data_bytes: u64,
    /// Operations (GETs and updates) per second in the measured window.
    pub ops_per_sec: f64,
    /// Latency of the GETs (of one batch: per GET with `--batch 1`).
    pub get_latency_us: LatencySummary,
    /// Device reads of value segments in the window, by the hot device.
    pub hot_device_reads: u64,
    /// ... and by the value device.
    pub value_device_reads: u64,
    /// The bound: the percent of the device reads an oracle placement
    /// would serve from the hot device, from this window's own reads (see
    /// [`oracle_hot_percent`]; None without a hot device or device reads).
    #[serde(default)]
    pub oracle_hot_percent: Option<f64>,
    /// Records copied up and moved down in the window.
    pub promotions: u64,
    pub demotions: u64,
    /// Moves held back in the window by `storage.hot_move_percent` (copies
    /// up skipped, GC waits).
    #[serde(default)]
    pub move_waits: u64,
    /// Value segment bytes on each class after the window.
    pub classes: Vec<ClassBytes>,
    /// The sum of the classes' costs, dollars a month.
    pub cost_per_month: f64,
    /// How this layout compares with the others (same distribution).
    #[serde(default)]
    pub ratios: Ratios,
    /// The aims (tiered layout, Zipfian reads only).
    #[serde(default)]
    pub aims: Vec<Aim>,
}

/// Ratios against the untiered layouts measured under the same distribution
/// (absent when that layout was not measured or measured nothing).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Ratios {
    /// GET p99 over all-nvme's GET p99.
    pub p99_vs_all_nvme: Option<f64>,
    pub p99_vs_all_sas: Option<f64>,
    /// Throughput over all-nvme's throughput.
    pub throughput_vs_all_nvme: Option<f64>,
    pub throughput_vs_all_sas: Option<f64>,
}

/// One aim of the issue and whether this run met it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Aim {
    pub aim: String,
    /// What was measured, in words.
    pub got: String,
    pub met: bool,
}

impl TieredSummary {
    /// Percent of the device reads that the hot device served (None: no
    /// device reads in the window).
    pub fn hot_read_percent(&self) -> Option<f64> {
        let all = self.hot_device_reads + self.value_device_reads;
        (all > 0).then(|| 100.0 * self.hot_device_reads as f64 / all as f64)
    }

    /// The measured hot share over the oracle's (1.0: as good as any
    /// placement could be on these reads).
    pub fn of_oracle(&self) -> Option<f64> {
        match (self.hot_read_percent(), self.oracle_hot_percent) {
            (Some(got), Some(best)) if best > 0.0 => Some(got / best),
            _ => None,
        }
    }

    /// Percent of the value segment bytes on the value device (None: no
    /// bytes).
    pub fn value_device_bytes_percent(&self) -> Option<f64> {
        let all: u64 = self.classes.iter().map(|c| c.bytes).sum();
        let value: u64 = self
            .classes
            .iter()
            .filter(|c| c.role == "value")
            .map(|c| c.bytes)
            .sum();
        (all > 0).then(|| 100.0 * value as f64 / all as f64)
    }
}

/// The aims, for the tiered layout under Zipfian reads.
pub const AIM_HOT_READS_PERCENT: f64 = 90.0;
pub const AIM_P99_VS_NVME: f64 = 1.5;
pub const AIM_SAS_BYTES_PERCENT: f64 = 85.0;
pub const AIM_THROUGHPUT_VS_SAS: f64 = 3.0;

fn ratio(a: f64, b: f64) -> Option<f64> {
    (a.is_finite() && b.is_finite() && b > 0.0).then(|| a / b)
}

/// Fills every summary's ratios against the all-nvme and all-sas summaries
/// of the same distribution, and the aims of the tiered Zipfian one.
pub fn compare_layouts(summaries: &mut [TieredSummary]) {
    let find = |list: &[TieredSummary], layout: Layout, distribution: &str| {
        list.iter()
            .find(|s| s.layout == layout.name() && s.distribution == distribution)
            .map(|s| (s.get_latency_us.p99, s.ops_per_sec))
    };
    let snapshot = summaries.to_vec();
    for s in summaries.iter_mut() {
        let nvme = find(&snapshot, Layout::AllNvme, &s.distribution);
        let sas = find(&snapshot, Layout::AllSas, &s.distribution);
        s.ratios = Ratios {
            p99_vs_all_nvme: nvme.and_then(|(p99, _)| ratio(s.get_latency_us.p99, p99)),
            p99_vs_all_sas: sas.and_then(|(p99, _)| ratio(s.get_latency_us.p99, p99)),
            throughput_vs_all_nvme: nvme.and_then(|(_, ops)| ratio(s.ops_per_sec, ops)),
            throughput_vs_all_sas: sas.and_then(|(_, ops)| ratio(s.ops_per_sec, ops)),
        };
        s.aims = if s.layout == Layout::Tiered.name() && s.distribution == "zipfian" {
            aims_of(s)
        } else {
            Vec::new()
        };
    }
}

fn percent(v: Option<f64>) -> String {
    v.map_or_else(|| "n/a".to_string(), |p| format!("{p:.1}%"))
}

fn times(v: Option<f64>) -> String {
    v.map_or_else(|| "n/a".to_string(), |r| format!("{r:.2}x"))
}

/// The three aims of the issue, measured on `s` (ratios already filled).
fn aims_of(s: &TieredSummary) -> Vec<Aim> {
    let hot = s.hot_read_percent();
    let p99 = s.ratios.p99_vs_all_nvme;
    let sas_bytes = s.value_device_bytes_percent();
    let ops = s.ratios.throughput_vs_all_sas;
    vec![
        Aim {
            aim: format!(
                "at least {AIM_HOT_READS_PERCENT:.0}% of device reads from the hot device"
            ),
            got: percent(hot),
            met: hot.is_some_and(|h| h >= AIM_HOT_READS_PERCENT),
        },
        Aim {
            aim: format!(
                "GET p99 within {AIM_P99_VS_NVME}x of all-nvme while at least {AIM_SAS_BYTES_PERCENT:.0}% of bytes are on the value device"
            ),
            got: format!("{} of all-nvme, {} of bytes", times(p99), percent(sas_bytes)),
            met: p99.is_some_and(|r| r <= AIM_P99_VS_NVME)
                && sas_bytes.is_some_and(|b| b >= AIM_SAS_BYTES_PERCENT),
        },
        Aim {
            aim: format!("throughput at least {AIM_THROUGHPUT_VS_SAS}x all-sas"),
            got: times(ops),
            met: ops.is_some_and(|r| r >= AIM_THROUGHPUT_VS_SAS),
        },
    ]
}

/// The bound on a placement, from a window's reads (`counts`, per record):
/// a RAM cache that holds the `cache_records` records read most often, and
/// a hot device that holds the next `hot_records`, serve the most device
/// reads from the hot device that any placement of records could. Returns
/// that share of the reads the cache misses, in percent (None: no read
/// misses the cache). A record counts as its value's bytes; the tiers'
/// own headers and the cache's per-entry RAM are left out, so the oracle
/// is a little generous.
pub fn oracle_hot_percent(counts: &[u32], cache_records: u64, hot_records: u64) -> Option<f64> {
    let mut sorted = counts.to_vec();
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    let cache = (cache_records as usize).min(sorted.len());
    let missed = &sorted[cache..];
    let hot = (hot_records as usize).min(missed.len());
    let device: u64 = missed.iter().map(|&c| u64::from(c)).sum();
    let best: u64 = missed[..hot].iter().map(|&c| u64::from(c)).sum();
    (device > 0).then(|| 100.0 * best as f64 / device as f64)
}

/// "zipfian", "uniform" or "hotspot".
pub fn distribution_name(d: Distribution) -> &'static str {
    match d {
        Distribution::Uniform => "uniform",
        Distribution::Zipfian => "zipfian",
        Distribution::Latest => "latest",
        Distribution::Hotspot { .. } => "hotspot",
    }
}

/// The measured mix: GETs and whole-record updates of loaded records.
pub fn mix(plan: &TieredPlan, distribution: Distribution) -> Mix {
    let update = f64::from(plan.write_percent.min(MAX_WRITE_PERCENT)) / 100.0;
    Mix {
        name: match distribution {
            Distribution::Uniform => "tiered-uniform",
            Distribution::Hotspot { .. } => "tiered-hotspot",
            _ => "tiered-zipfian",
        },
        read: 1.0 - update,
        update,
        insert: 0.0,
        scan: 0.0,
        read_modify_write: 0.0,
        distribution,
    }
}

/// One layout on a server that is already running with it (and nothing
/// loaded): load `s.records` records, then one measured phase per
/// distribution of the plan. Returns the result rows (labelled with the
/// layout's name as their device) and one summary per distribution.
pub async fn run_layout<T: Target>(
    target: &T,
    s: &Settings,
    plan: &TieredPlan,
    layout: Layout,
    hot_bytes: u64,
) -> Result<(Vec<ResultRow>, Vec<TieredSummary>), DriverError> {
    s.check();
    let label = layout.name();
    let pool = Arc::new(ValuePool::new(s.seed, s.shape));
    // The load fills the store: in batches of at least LOAD_BATCH whatever
    // the measured phases' --batch (1 by default, for per-GET latency).
    let load = Settings {
        batch: s.batch.max(LOAD_BATCH),
        ..s.clone()
    };
    let mut rows = super::gridgain::preload(target, &load, &pool, label, "tiered").await?;
    let sequence = Arc::new(InsertSequence::new(s.records));
    let mut summaries = Vec::new();
    for &distribution in &plan.distributions {
        let mix = mix(plan, distribution);
        let trace = Arc::new(ReadTrace::new(s.records));
        let out = super::ycsb::run_mix_traced(
            target,
            s,
            mix,
            &sequence,
            &pool,
            label,
            Some(trace.clone()),
        )
        .await?;
        let phase = rows_from_phase(mix.name, &out, &OPERATIONS, None, s.mode())?;
        let get = phase
            .iter()
            .find(|r| r.operation == "read")
            .map(|r| r.latency_us)
            .unwrap_or_default();
        let mut one = summary(layout, distribution, plan, s, hot_bytes, &out, get);
        if layout.hot_profile().is_some() {
            let record = (s.shape.value_bytes() as u64).max(1);
            one.oracle_hot_percent = oracle_hot_percent(
                &trace.counts(),
                plan.cache_bytes / record,
                hot_bytes / record,
            );
        }
        summaries.push(one);
        rows.extend(phase);
    }
    for r in &mut rows {
        r.device = label.to_string();
    }
    Ok((rows, summaries))
}

/// One phase's summary from its STATS before and after the window.
fn summary(
    layout: Layout,
    distribution: Distribution,
    plan: &TieredPlan,
    s: &Settings,
    hot_bytes: u64,
    out: &PhaseOutcome,
    get: LatencySummary,
) -> TieredSummary {
    let (b, a) = (&out.before.hybrid, &out.after.hybrid);
    let hot_reads = a.hot_reads.saturating_sub(b.hot_reads);
    let all_reads = a.cold_reads.saturating_sub(b.cold_reads);
    let classes = classes(layout, a.segment_bytes, a.hot_segment_bytes, &plan.prices);
    TieredSummary {
        layout: layout.name().to_string(),
        distribution: distribution_name(distribution).to_string(),
        write_percent: plan.write_percent,
        value_profile: layout.value_profile().to_string(),
        hot_profile: layout.hot_profile().map(str::to_string),
        hot_bytes: if layout.hot_profile().is_some() {
            hot_bytes
        } else {
            0
        },
        records: s.records,
        data_bytes: data_bytes(s.records, s.shape),
        ops_per_sec: out.ops_per_sec,
        get_latency_us: get,
        hot_device_reads: hot_reads,
        value_device_reads: all_reads.saturating_sub(hot_reads),
        oracle_hot_percent: None,
        promotions: a.promotions.saturating_sub(b.promotions),
        demotions: a.demotions.saturating_sub(b.demotions),
        move_waits: a.move_waits.saturating_sub(b.move_waits),
        cost_per_month: classes.iter().map(|c| c.cost_per_month).sum(),
        classes,
        ratios: Ratios::default(),
        aims: Vec::new(),
    }
}

#[cfg(test)]
pub mod tests {
    use super::*;

    /// A summary with the figures that matter to the comparisons.
    pub fn sample(layout: Layout, p99: f64, ops: f64, hot: u64, value: u64) -> TieredSummary {
        let prices = Prices::default();
        let classes = classes(layout, 10 * GB as u64, GB as u64, &prices);
        TieredSummary {
            layout: layout.name().to_string(),
            distribution: "zipfian".to_string(),
            write_percent: 5,
            value_profile: layout.value_profile().to_string(),
            hot_profile: layout.hot_profile().map(str::to_string),
            hot_bytes: 0,
            records: 1000,
            data_bytes: 1_000_000,
            ops_per_sec: ops,
            get_latency_us: LatencySummary {
                p50: p99 / 4.0,
                p99,
                p999: p99 * 2.0,
                ..LatencySummary::default()
            },
            hot_device_reads: hot,
            value_device_reads: value,
            oracle_hot_percent: None,
            promotions: 0,
            demotions: 0,
            move_waits: 0,
            cost_per_month: classes.iter().map(|c| c.cost_per_month).sum(),
            classes,
            ratios: Ratios::default(),
            aims: Vec::new(),
        }
    }

    #[test]
    fn hot_bytes_is_the_share_rounded_to_whole_segments_per_shard() {
        let mib = 1u64 << 20;
        // 200 MB of data, 10%, 2 shards: 10 MB a shard, rounded up to 10 MiB.
        assert_eq!(hot_bytes(200_000_000, 10, 2, mib), 2 * 10 * mib);
        // A tiny data set still gets four segments a shard.
        assert_eq!(hot_bytes(1_000_000, 10, 3, mib), 3 * 4 * mib);
        // Exactly whole segments stay as they are.
        assert_eq!(hot_bytes(80 * mib, 10, 1, mib), 8 * mib);
        assert_eq!(hot_bytes(80 * mib + 10, 10, 1, mib), 9 * mib);
        // Zero shards count as one; every result passes the engine's check.
        for (data, pct, shards) in [(7u64, 10u32, 0u64), (123_456_789, 25, 5), (1 << 50, 100, 7)] {
            let h = hot_bytes(data, pct, shards, mib);
            let per = h / shards.max(1);
            assert!(
                per >= 4 * mib && per.is_multiple_of(mib),
                "{data} {pct} {shards}: {h}"
            );
        }
        assert_eq!(data_bytes(200_000, RecordShape::YCSB), 200_000_000);
    }

    #[test]
    fn cost_is_gb_times_price_per_class() {
        let prices = Prices {
            nvme: 0.2,
            sas: 0.05,
            gpssd: 0.1,
        };
        let gb = GB as u64;
        let c = classes(Layout::Tiered, 12 * gb, 2 * gb, &prices);
        assert_eq!(c.len(), 2);
        assert_eq!((c[0].profile.as_str(), c[0].role.as_str()), ("nvme", "hot"));
        assert_eq!(c[0].bytes, 2 * gb);
        assert!((c[0].cost_per_month - 0.4).abs() < 1e-12);
        assert_eq!((c[1].profile.as_str(), c[1].bytes), ("sas", 10 * gb));
        assert!((c[1].cost_per_month - 0.5).abs() < 1e-12);
        let c = classes(Layout::AllSas, 3 * gb, 0, &prices);
        assert_eq!(c.len(), 1);
        assert!((c[0].cost_per_month - 0.15).abs() < 1e-12);
        let c = classes(Layout::AllNvme, gb / 2, 0, &prices);
        assert!((c[0].cost_per_month - 0.1).abs() < 1e-12);
        // The stated defaults.
        let d = Prices::default();
        assert_eq!((d.nvme, d.sas, d.gpssd), (0.125, 0.045, 0.08));
        assert_eq!(d.per_gb_month("unthrottled"), 0.0);
    }

    #[test]
    fn layouts_put_values_where_they_say() {
        let dir = tempfile::tempdir().expect("tempdir");
        for layout in LAYOUTS {
            let mut c = crate::embedded::embedded_config(
                dir.path(),
                layout.wal_profile(),
                crate::cli::DurabilityArg::Sync,
                2,
                crate::embedded::EmbeddedStorage::default(),
            )
            .expect("config");
            let hot = HotTuning {
                bytes: hot_bytes(100 << 20, 10, 2, SEGMENT_BYTES),
                promote_reads: 3,
                move_percent: 40,
            };
            layout.apply(&mut c, hot);
            c.validate().expect("a valid config");
            assert_eq!(c.storage.tier, tunables::Tier::Hybrid);
            let value = &c.devices[&c.storage.value_device];
            assert_eq!(value.profile, layout.value_profile(), "{layout:?}");
            match layout.hot_profile() {
                Some(hot) => {
                    assert_ne!(c.storage.hot_device, c.storage.value_device);
                    assert_eq!(c.devices[&c.storage.hot_device].profile, hot);
                    assert_eq!(c.storage.hot_bytes.0, 2 * 5 * SEGMENT_BYTES);
                    assert_eq!(c.storage.hot_promote_reads, 3);
                    assert_eq!(c.storage.hot_move_percent, 40);
                }
                None => assert!(c.storage.hot_device.is_empty()),
            }
        }
    }

    #[test]
    fn ratios_and_aims_compare_with_the_same_distribution() {
        let mut list = vec![
            sample(Layout::AllNvme, 1000.0, 6000.0, 0, 100),
            sample(Layout::AllSas, 8000.0, 1500.0, 0, 100),
            sample(Layout::Tiered, 1400.0, 5000.0, 95, 5),
        ];
        let mut uniform = sample(Layout::Tiered, 9000.0, 1000.0, 10, 90);
        uniform.distribution = "uniform".to_string();
        list.push(uniform);
        compare_layouts(&mut list);
        let t = &list[2].ratios;
        assert!((t.p99_vs_all_nvme.expect("nvme") - 1.4).abs() < 1e-12);
        assert!((t.throughput_vs_all_sas.expect("sas") - 5000.0 / 1500.0).abs() < 1e-12);
        assert!((list[0].ratios.p99_vs_all_nvme.expect("self") - 1.0).abs() < 1e-12);
        // Sample bytes: 1 GB hot, 9 GB value: 90% on sas.
        assert_eq!(list[2].value_device_bytes_percent(), Some(90.0));
        assert_eq!(list[2].aims.len(), 3);
        assert!(list[2].aims.iter().all(|a| a.met), "{:?}", list[2].aims);
        // No all-nvme or all-sas uniform run: no ratios, and no aims off Zipfian.
        assert_eq!(list[3].ratios, Ratios::default());
        assert!(list[3].aims.is_empty() && list[0].aims.is_empty());

        // A p99 past 1.5x and a hot share under 90% are not met.
        let mut list = vec![
            sample(Layout::AllNvme, 1000.0, 6000.0, 0, 100),
            sample(Layout::AllSas, 8000.0, 1500.0, 0, 100),
            sample(Layout::Tiered, 1600.0, 4000.0, 80, 20),
        ];
        compare_layouts(&mut list);
        let met: Vec<bool> = list[2].aims.iter().map(|a| a.met).collect();
        assert_eq!(met, [false, false, false]);
        assert_eq!(list[2].hot_read_percent(), Some(80.0));
    }

    #[test]
    fn the_oracle_puts_the_most_read_records_after_the_cache_on_the_hot_device() {
        // Record i read 10 - i times: the cache takes records 0 and 1 (10 + 9
        // reads), the hot device the next three (8 + 7 + 6 of the 36 reads
        // left: 58.3%).
        let counts: Vec<u32> = (0..10).map(|i| 10 - i).collect();
        let got = oracle_hot_percent(&counts, 2, 3).expect("reads miss the cache");
        assert!((got - 100.0 * 21.0 / 36.0).abs() < 1e-9, "{got}");
        // The order of the records does not matter, only their counts.
        let mut shuffled = counts.clone();
        shuffled.reverse();
        assert_eq!(oracle_hot_percent(&shuffled, 2, 3), Some(got));
        // A hot device that holds every record left serves them all; a
        // cache that holds everything leaves no device read.
        assert_eq!(oracle_hot_percent(&counts, 2, 100), Some(100.0));
        assert_eq!(oracle_hot_percent(&counts, 10, 3), None);
        assert_eq!(oracle_hot_percent(&counts, 0, 0), Some(0.0));
        // The measured share over the bound.
        let mut s = sample(Layout::Tiered, 1.0, 1.0, 40, 60);
        s.oracle_hot_percent = Some(50.0);
        assert_eq!(s.of_oracle(), Some(0.8));
    }

    #[test]
    fn the_mix_writes_the_asked_share() {
        let plan = TieredPlan {
            write_percent: 20,
            distributions: vec![Distribution::Zipfian],
            hot_percent: 10,
            promote_reads: 2,
            move_percent: 20,
            prices: Prices::default(),
            cache_bytes: 0,
        };
        let m = mix(&plan, Distribution::Uniform);
        assert_eq!(m.name, "tiered-uniform");
        assert!((m.read - 0.8).abs() < 1e-12 && (m.update - 0.2).abs() < 1e-12);
        assert_eq!(m.distribution, Distribution::Uniform);
    }
}
