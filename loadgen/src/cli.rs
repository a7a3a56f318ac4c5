//! The `loadgen` command line: flags, their defaults, and the checks that
//! turn them into [`Settings`].
//!
//! What must hold: `loadgen --help` names every flag with its default; a
//! combination that cannot mean anything (`--server` with `--device`,
//! `--duration` with `--ops`, a zero thread count) is refused with a message
//! before anything runs.

use crate::driver::{Pacing, Progress};
use crate::record::RecordShape;
use crate::settings::{Measure, Settings};
use crate::workloads::{sweep, tiered, ycsb};
use clap::{Parser, Subcommand, ValueEnum};
use std::path::PathBuf;
use std::time::Duration;

/// Default records preloaded before the put/get and YCSB phases.
pub const DEFAULT_RECORDS: u64 = 200_000;
/// Default measured seconds per phase.
pub const DEFAULT_DURATION_S: f64 = 10.0;
/// Default warm-up seconds per phase.
pub const DEFAULT_WARMUP_S: f64 = 2.0;

#[derive(Debug, Parser)]
#[command(
    name = "loadgen",
    version,
    about = "Benchmark ringkv with the workloads of the GridGain YCSB report, YCSB A-F and the MapDB/ChronicleMap sweep.",
    long_about = "Benchmark ringkv with the workloads of the GridGain YCSB report, YCSB A-F and the \
MapDB/ChronicleMap sweep.\n\nWithout --server, loadgen starts an embedded ringkv server (in this \
process, on a temporary data directory and a loopback port) with the chosen disk profile, runs \
the workload, and removes it. With --server ADDR it measures a running ringkv-server and reports \
that server's own profile and durability (read from STATS).\n\nSee docs/loadgen.md for the \
workloads, the table columns and the --json schema.",
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,

    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print "+298%"-style deltas per operation between two --json reports
    /// (throughput: NEW/BASE - 1; latencies: BASE/NEW - 1, so positive = NEW is better).
    Compare {
        /// The baseline report.
        base: PathBuf,
        /// The report to compare against the baseline.
        new: PathBuf,
        /// Also draw A and B side by side per operation (.svg or .png).
        #[arg(long, value_name = "FILE")]
        plot: Option<PathBuf>,
    },
    /// Draw the chart of a --json report (same chart as --plot).
    Plot {
        /// A report written by --json.
        report: PathBuf,
        /// The file to write: .svg, or .png (rendered from the SVG).
        out: PathBuf,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum WorkloadArg {
    /// GridGain-style: preload, then batched puts, then batched gets.
    #[value(alias = "gridgain")]
    Putget,
    /// YCSB core workloads A, B, C, F, D, E in YCSB's recommended order, after one load.
    Ycsb,
    /// YCSB A: 50% read, 50% update, zipfian.
    #[value(name = "ycsb-a")]
    YcsbA,
    /// YCSB B: 95% read, 5% update, zipfian.
    #[value(name = "ycsb-b")]
    YcsbB,
    /// YCSB C: 100% read, zipfian.
    #[value(name = "ycsb-c")]
    YcsbC,
    /// YCSB D: 95% read, 5% insert, latest.
    #[value(name = "ycsb-d")]
    YcsbD,
    /// YCSB E: 95% scan, 5% insert, zipfian (unsupported: ringkv has no
    /// ordered range read).
    #[value(name = "ycsb-e")]
    YcsbE,
    /// YCSB F: 50% read, 50% read-modify-write, zipfian.
    #[value(name = "ycsb-f")]
    YcsbF,
    /// MapDB/ChronicleMap: write N items then read N items, for each N.
    Sweep,
    /// Ignite/Hazelcast PutGetTx: pessimistic transactions (get-for-update,
    /// then put), keys uniform in [0, --range) (default 1M, Yardstick's).
    Putgettx,
    /// PutGetTx on a small range (--range default 64) so lock waits and
    /// aborts show.
    #[value(name = "putgettx-contended")]
    PutgettxContended,
    /// Hybrid tier, three layouts in one report: all values on nvme, all on
    /// sas, and tiered (sas behind an nvme hot device of --hot-percent of the
    /// data); GETs Zipfian and/or uniform, --write-percent updates; latency,
    /// device-read shares and cost per GB-month.
    Tiered,
}

impl WorkloadArg {
    pub fn name(&self) -> &'static str {
        match self {
            WorkloadArg::Putget => "putget",
            WorkloadArg::Ycsb => "ycsb",
            WorkloadArg::YcsbA => "ycsb-a",
            WorkloadArg::YcsbB => "ycsb-b",
            WorkloadArg::YcsbC => "ycsb-c",
            WorkloadArg::YcsbD => "ycsb-d",
            WorkloadArg::YcsbE => "ycsb-e",
            WorkloadArg::YcsbF => "ycsb-f",
            WorkloadArg::Sweep => "sweep",
            WorkloadArg::Putgettx => "putgettx",
            WorkloadArg::PutgettxContended => "putgettx-contended",
            WorkloadArg::Tiered => "tiered",
        }
    }

    /// The YCSB mixes this workload runs, in order (empty for non-YCSB).
    pub fn ycsb_mixes(&self) -> Vec<ycsb::Mix> {
        match self {
            WorkloadArg::Putget
            | WorkloadArg::Sweep
            | WorkloadArg::Putgettx
            | WorkloadArg::PutgettxContended
            | WorkloadArg::Tiered => Vec::new(),
            WorkloadArg::Ycsb => ycsb::RECOMMENDED_ORDER
                .iter()
                .filter_map(|n| ycsb::mix_named(n))
                .collect(),
            single => ycsb::mix_named(single.name()).into_iter().collect(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DeviceArg {
    /// 1,800 IOPS, burst 5,000 (the seed's "High I/O - SAS").
    Sas,
    /// 2,300 IOPS, burst 8,000 (the seed's "General Purpose SSD").
    Gpssd,
    /// 6,500 IOPS, burst 16,000 (the seed's "Ultra-high I/O SSD").
    Nvme,
    /// No emulation: the real disk.
    Unthrottled,
    /// sas, gpssd and nvme one after the other, printed side by side.
    All,
}

impl DeviceArg {
    /// Profile names to run, in order of increasing speed.
    pub fn profiles(&self) -> Vec<&'static str> {
        match self {
            DeviceArg::Sas => vec!["sas"],
            DeviceArg::Gpssd => vec!["gpssd"],
            DeviceArg::Nvme => vec!["nvme"],
            DeviceArg::Unthrottled => vec!["unthrottled"],
            DeviceArg::All => vec!["sas", "gpssd", "nvme"],
        }
    }
}

/// The tiered workload's read distributions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DistributionArg {
    /// YCSB's scrambled Zipfian, theta 0.99.
    Zipfian,
    /// Every loaded record equally likely.
    Uniform,
    /// Zipfian, then uniform, on the same server (two measured phases).
    Both,
    /// YCSB's hotspot: --hot-set-percent of the records get
    /// --hot-ops-percent of the GETs and updates, the rest uniform.
    Hotspot,
}

impl DistributionArg {
    /// The distributions to measure, in order (`hot`: the hotspot's hot
    /// set and the share of operations it gets, in percent).
    pub fn distributions(&self, hot: (u32, u32)) -> Vec<ycsb::Distribution> {
        match self {
            DistributionArg::Zipfian => vec![ycsb::Distribution::Zipfian],
            DistributionArg::Uniform => vec![ycsb::Distribution::Uniform],
            DistributionArg::Both => {
                vec![ycsb::Distribution::Zipfian, ycsb::Distribution::Uniform]
            }
            DistributionArg::Hotspot => vec![ycsb::Distribution::Hotspot {
                hot_set_percent: hot.0,
                hot_ops_percent: hot.1,
            }],
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TargetArg {
    /// The engine library in this process: no TCP, no protocol.
    Engine,
    /// An embedded ringkv server on a loopback port.
    Server,
}

impl TargetArg {
    pub fn name(&self) -> &'static str {
        match self {
            TargetArg::Engine => "engine",
            TargetArg::Server => "server",
        }
    }
}

/// `--durability` and `--tier` take the config's own enums (their flag
/// values and help lines are in `tunables`, shared with the server); the
/// names below are loadgen's for them.
pub use tunables::{Durability as DurabilityArg, Tier as TierArg};

/// `--help` headings; flags are listed under them in this order.
pub mod heading {
    pub const WORKLOAD: &str = "Workload";
    pub const DATA: &str = "Data set";
    pub const TARGET: &str = "Target/server";
    pub const STORAGE: &str = "Durability & devices";
    pub const CRASH: &str = "Crash audit";
    pub const TIERED: &str = "Tiered workload";
    pub const OUTPUT: &str = "Output";
    /// Every heading, in the order `--help` shows them.
    pub const ALL: [&str; 7] = [WORKLOAD, DATA, TARGET, STORAGE, CRASH, TIERED, OUTPUT];
}

#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// Workload to run.
    #[arg(long, value_enum, default_value = "putget", help_heading = heading::WORKLOAD)]
    pub workload: WorkloadArg,

    /// Measured time of each timed phase (after the warm-up): seconds, or a
    /// number with a unit (500ms, 2m).
    /// [default: 10]
    #[arg(long, value_name = "DURATION", conflicts_with = "ops", value_parser = parse_duration, help_heading = heading::WORKLOAD)]
    pub duration: Option<Duration>,

    /// Measure this many operations per timed phase instead of a duration
    /// (rounded up to whole batches; accepts K/M/G).
    #[arg(long, value_parser = parse_count, value_name = "N", help_heading = heading::WORKLOAD)]
    pub ops: Option<u64>,

    /// Warm-up before each timed phase, not measured: seconds, or a number
    /// with a unit (200ms).
    #[arg(long, default_value = "2", value_parser = parse_duration, value_name = "DURATION", help_heading = heading::WORKLOAD)]
    pub warmup: Duration,

    /// Client tasks, each with its own connection.
    /// [default: 16; sweep: 1, the document's single client]
    #[arg(long, value_name = "N", help_heading = heading::WORKLOAD)]
    pub threads: Option<usize>,

    /// Operations per batch (one request frame).
    /// [default: 1000; sweep: 1, the document's one call per item]
    #[arg(long, value_name = "N", help_heading = heading::WORKLOAD)]
    pub batch: Option<usize>,

    /// Open loop: send this many operations per second in total (accepts K/M),
    /// measuring each batch from its intended send time. Default: closed loop.
    #[arg(long, value_parser = parse_count, value_name = "R", help_heading = heading::WORKLOAD)]
    pub rate: Option<u64>,

    /// Seed of the key sequences and record values.
    #[arg(long, default_value_t = 1, value_name = "N", help_heading = heading::WORKLOAD)]
    pub seed: u64,

    /// PutGetTx key range: keys uniform in [0, N) (accepts K/M suffixes).
    /// [default: 1M for putgettx (Yardstick's --range default), 64 for
    /// putgettx-contended]
    #[arg(long, value_parser = parse_count, value_name = "N", help_heading = heading::WORKLOAD)]
    pub range: Option<u64>,

    /// Records preloaded before the put/get and YCSB phases (accepts K/M/G
    /// suffixes: 15M). The GridGain report used 15M; the default fits a
    /// 2-core machine in about a minute.
    #[arg(long, default_value = "200K", value_parser = parse_count, value_name = "N", help_heading = heading::DATA)]
    pub records: u64,

    /// Fields per record (YCSB fieldcount). With the sweep, giving this (or
    /// --field-length) replaces the document's 8-byte key and 32-byte value
    /// by YCSB-style records. [default: 10]
    #[arg(long, value_name = "N", help_heading = heading::DATA)]
    pub fields: Option<usize>,

    /// Bytes per field (YCSB fieldlength). [default: 100]
    #[arg(long, value_name = "BYTES", help_heading = heading::DATA)]
    pub field_length: Option<usize>,

    /// Largest sweep size: the sweep runs the document's 10K, 100K, 1M, 10M,
    /// 50M (then 100M, 500M, 1G, 2G) up to this. Sizes that cannot fit in
    /// this machine's RAM or disk are refused before anything runs.
    #[arg(long, default_value = "50M", value_parser = parse_count, value_name = "N", help_heading = heading::DATA)]
    pub sweep_max: u64,

    /// Exact sweep sizes, comma separated (e.g. 1K,5K); overrides --sweep-max.
    #[arg(long, value_delimiter = ',', value_parser = parse_count, value_name = "LIST", help_heading = heading::DATA)]
    pub sweep_sizes: Option<Vec<u64>>,

    /// Operations run before each sweep phase's clock starts (the
    /// document's warm-up): writes of other keys before the write phase,
    /// uniform reads before the read phase.
    #[arg(long, default_value = "10K", value_parser = parse_count, value_name = "N", help_heading = heading::DATA)]
    pub sweep_warmup: u64,

    /// Reads in each sweep size's read phase: this many uniform random
    /// reads over its N items instead of N (the document's). Every read of
    /// a large size is one device read on the hybrid tier, so 50M reads on
    /// sas take hours; a sample measures the same rate. [default: N]
    #[arg(long, value_parser = parse_count, value_name = "N", help_heading = heading::DATA)]
    pub sweep_reads: Option<u64>,

    /// Benchmark a running ringkv-server at this address (host:port) instead
    /// of an embedded one.
    #[arg(long, value_name = "ADDR", help_heading = heading::TARGET)]
    pub server: Option<String>,

    /// What is measured: `engine` drives the engine library in this process
    /// (no TCP, no protocol; the MapDB/ChronicleMap document's way), `server`
    /// an embedded ringkv server over loopback TCP. `--server ADDR` measures
    /// a running server instead.
    /// [default: sweep: engine; other workloads: server]
    #[arg(long, value_enum, value_name = "KIND", help_heading = heading::TARGET)]
    pub target: Option<TargetArg>,

    /// A request not answered within this long fails the run: seconds, or a
    /// number with a unit (500ms, 2m).
    #[arg(long, default_value = "60", value_parser = parse_duration, value_name = "DURATION", help_heading = heading::TARGET)]
    pub timeout: Duration,

    /// With --server: TLS and password flags (--tls, --ca, --insecure,
    /// --password-file or RINGKV_PASSWORD), as the `ringkv` CLI takes them.
    #[command(flatten, next_help_heading = heading::TARGET)]
    pub connect: ringkv_client::ConnectArgs,

    /// Disk profile of the embedded server's WAL device; --device-profile is
    /// the same flag under the server's name for it. Not with --server.
    /// [default: nvme]
    #[arg(long, value_enum, visible_alias = "device-profile", value_name = "PROFILE", help_heading = heading::STORAGE)]
    pub device: Option<DeviceArg>,

    /// Durability of the embedded server or engine. Not with --server. The
    /// report calls none "RAM Only" and sync and async "RAM+Disk".
    /// [default: putget runs none (RAM Only) and then sync (RAM+Disk); sweep: async (the
    /// document's stores do not sync each write); YCSB: sync]
    #[arg(long, value_enum, help_heading = heading::STORAGE)]
    pub durability: Option<DurabilityArg>,

    /// Storage tier of the embedded server or engine (storage.tier). Not with
    /// --server. With hybrid, runs that would default to durability none use
    /// sync instead (the hybrid tier needs its WAL).
    /// [default: memory]
    #[arg(long, value_enum, value_name = "TIER", help_heading = heading::STORAGE)]
    pub tier: Option<TierArg>,

    /// The hybrid tier's read cache for the whole embedded server or engine
    /// (storage.cache_bytes, e.g. 64MiB, 1GiB). Not with --server.
    /// [default: the config's, 256MiB]
    #[arg(long, value_name = "SIZE", help_heading = heading::STORAGE)]
    pub cache_bytes: Option<tunables::ByteSize>,

    /// Keys the hybrid index is sized for, whole embedded server or engine
    /// (storage.index_keys; accepts K/M/G). Not with --server.
    /// [default: the config's, 16M]
    #[arg(long, value_parser = parse_count, value_name = "N", help_heading = heading::STORAGE)]
    pub index_keys: Option<u64>,

    /// Shards of the embedded server or engine (0 = one per core). Not with --server.
    /// [default: sweep with --target engine: 1 (the client runs on that shard's own
    /// thread, every call inline: the document's single thread); otherwise 0]
    #[arg(long, value_name = "N", help_heading = heading::STORAGE)]
    pub shards: Option<u32>,

    /// Crash run: SIGKILL the server at random moments about this far apart
    /// (each gap uniform in [0.5, 1.5] x this; seconds, or a number with a
    /// unit: 10, 10s, 1500ms), restart it on the same data directory and
    /// audit every acknowledged write. loadgen runs `ringkv-server` as a
    /// separate process (or --server-cmd). Workloads: putget, sweep,
    /// ycsb-a, putgettx. [default with --crashes: the duration / (N + 1)]
    #[arg(long, value_parser = parse_duration, value_name = "DURATION", help_heading = heading::CRASH)]
    pub crash_every: Option<Duration>,

    /// Crash run: kill the server this many times (at most; fewer if the
    /// duration ends first). [default with --crash-every: as many as fit]
    #[arg(long, value_name = "N", help_heading = heading::CRASH)]
    pub crashes: Option<u32>,

    /// Crash run: the command that starts the server, e.g. "/opt/ringkv-server
    /// --config my.toml"; loadgen appends --data-dir, --listen,
    /// --metrics-listen, --durability, --tier, --device-profile and --shards.
    /// [default: ringkv-server beside loadgen, else on PATH]
    #[arg(long, value_name = "CMD", help_heading = heading::CRASH)]
    pub server_cmd: Option<String>,

    /// Crash run: read back every key after each restart up to this many
    /// keys; above it, a uniform sample of about this many (accepts K/M).
    #[arg(long, default_value = "2M", value_parser = parse_count, value_name = "N", help_heading = heading::CRASH)]
    pub crash_audit_keys: u64,

    /// Crash run with --durability async: a lost write must have been
    /// acknowledged within the server's flush interval plus this before
    /// the kill (seconds, or a number with a unit).
    #[arg(long, default_value = "250ms", value_parser = parse_duration, value_name = "DURATION", help_heading = heading::CRASH)]
    pub crash_async_slack: Duration,

    /// Tiered workload: percent of the measured operations that are updates
    /// of loaded records (0 to 50); the rest are GETs.
    #[arg(long, default_value_t = tiered::DEFAULT_WRITE_PERCENT, value_name = "PERCENT", help_heading = heading::TIERED)]
    pub write_percent: u32,

    /// Tiered workload: the GETs' key distribution; `both` measures Zipfian
    /// and then uniform on each layout's server.
    #[arg(long, value_enum, default_value = "both", value_name = "DIST", help_heading = heading::TIERED)]
    pub distribution: DistributionArg,

    /// Tiered workload, `--distribution hotspot`: the hot set, as a percent
    /// of the loaded records (1 to 99; YCSB's default is 20).
    #[arg(long, default_value_t = 20, value_name = "PERCENT", help_heading = heading::TIERED)]
    pub hot_set_percent: u32,

    /// Tiered workload, `--distribution hotspot`: the percent of the GETs
    /// and updates that go to the hot set (0 to 100; YCSB's default is 80).
    #[arg(long, default_value_t = 80, value_name = "PERCENT", help_heading = heading::TIERED)]
    pub hot_ops_percent: u32,

    /// Tiered workload: the hot device's size as a percent of the data set
    /// (records x value size), rounded up to whole 1 MiB segments and at
    /// least four a shard.
    #[arg(long, default_value_t = tiered::DEFAULT_HOT_PERCENT, value_name = "PERCENT", help_heading = heading::TIERED)]
    pub hot_percent: u32,

    /// Tiered workload: reads of a key lately that copy it up to the hot
    /// device, or keep it there (storage.hot_promote_reads, 1 to 15).
    #[arg(long, default_value_t = tunables::Config::default().storage.hot_promote_reads, value_name = "N", help_heading = heading::TIERED)]
    pub hot_promote_reads: u32,

    /// Tiered workload: the share of each device's profile that moves
    /// between the hot and the cold device may take
    /// (storage.hot_move_percent, 1 to 100).
    #[arg(long, default_value_t = tunables::Config::default().storage.hot_move_percent, value_name = "PERCENT", help_heading = heading::TIERED)]
    pub hot_move_percent: u32,

    /// Tiered workload: dollars per GB-month of nvme (AWS EBS io2's list price).
    #[arg(long, default_value_t = 0.125, value_name = "DOLLARS", help_heading = heading::TIERED)]
    pub price_nvme: f64,

    /// Tiered workload: dollars per GB-month of sas (AWS EBS st1's list price).
    #[arg(long, default_value_t = 0.045, value_name = "DOLLARS", help_heading = heading::TIERED)]
    pub price_sas: f64,

    /// Tiered workload: dollars per GB-month of gpssd (AWS EBS gp3's list
    /// price; no layout uses it today).
    #[arg(long, default_value_t = 0.08, value_name = "DOLLARS", help_heading = heading::TIERED)]
    pub price_gpssd: f64,

    /// Write every figure as JSON (schema ringkv-loadgen/1, docs/loadgen.md).
    #[arg(long, value_name = "FILE", help_heading = heading::OUTPUT)]
    pub json: Option<PathBuf>,

    /// Write a chart: .svg, or .png (rendered from the SVG). put/get and YCSB:
    /// throughput and latency by percentile; sweep: time vs N with the
    /// document's published lines.
    #[arg(long, value_name = "FILE", help_heading = heading::OUTPUT)]
    pub plot: Option<PathBuf>,

    /// When stderr is not a terminal (CI, a pipe), print a progress line
    /// (phase, elapsed time, operations done, current rate) this often
    /// during each phase: seconds, or a number with a unit; 0 turns the
    /// lines off. A terminal gets a progress bar instead.
    #[arg(long, default_value = "5", value_parser = parse_duration, value_name = "DURATION", help_heading = heading::OUTPUT)]
    pub progress_every: Duration,
}

/// A flag combination that cannot run.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum CliError {
    #[error("--{flag} applies to the embedded server only; with --server the server's own {what} is used (and reported from STATS)")]
    EmbeddedOnly {
        flag: &'static str,
        what: &'static str,
    },
    #[error("--{flag} must be at least {min}, got {got}")]
    TooSmall {
        flag: &'static str,
        min: f64,
        got: f64,
    },
    #[error("--sweep-max {max} leaves no sweep size (the smallest is 10K)")]
    NoSweepSizes { max: u64 },
    #[error(
        "--target engine runs the engine in this process; it cannot be combined with --server"
    )]
    EngineWithServer,
    #[error("--tier hybrid needs a WAL: use --durability sync or async (or --tier memory)")]
    HybridWithoutWal,
    #[error("a crash run kills and restarts a ringkv-server process that loadgen starts; {0}")]
    CrashRefused(&'static str),
    #[error("--workload tiered {0}")]
    TieredRefused(&'static str),
}

/// Parses `200K`, `15M`, `2G`, `1000`, `1_000` (decimal multipliers).
pub fn parse_count(text: &str) -> Result<u64, String> {
    let t = text.trim().replace('_', "");
    let (digits, mult) = match t.char_indices().last() {
        Some((i, c)) if c.eq_ignore_ascii_case(&'k') => (&t[..i], 1_000),
        Some((i, c)) if c.eq_ignore_ascii_case(&'m') => (&t[..i], 1_000_000),
        Some((i, c)) if c.eq_ignore_ascii_case(&'g') => (&t[..i], 1_000_000_000),
        _ => (t.as_str(), 1),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a count (examples: 1000, 200K, 15M)"))?;
    n.checked_mul(mult)
        .ok_or_else(|| format!("{text:?} is too large"))
}

/// Parses every loadgen duration flag: a bare number is seconds and may
/// have a fraction ("10", "0.5"); otherwise a whole number with one of the
/// config file's units ("250ms", "10s", "2m", "1h", also "us" and "ns"),
/// read by [`tunables::Duration`], so `--crash-every 10s` means what
/// `"10s"` means in ringkv.toml. clap puts the flag's name in front of the
/// error.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let (whole, fraction) = t.split_once('.').unwrap_or((t, ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if !t.is_empty() && digits(whole) && digits(fraction) && t != "." {
        let secs: f64 = t
            .parse()
            .map_err(|_| format!("{text:?} is not a number of seconds"))?;
        return Duration::try_from_secs_f64(secs)
            .map_err(|_| format!("{text:?} is too many seconds"));
    }
    t.parse::<tunables::Duration>()
        .map(Duration::from)
        .map_err(|e| {
            format!(
                "{}; a duration is a number of seconds (10, 0.5) or a whole number with a unit \
                 (250ms, 10s, 2m)",
                e.message
            )
        })
}

/// `10000` -> "10K", `1000000` -> "1M", `1500` -> "1500".
pub fn format_count(n: u64) -> String {
    if n >= 1_000_000_000 && n.is_multiple_of(1_000_000_000) {
        format!("{}G", n / 1_000_000_000)
    } else if n >= 1_000_000 && n.is_multiple_of(1_000_000) {
        format!("{}M", n / 1_000_000)
    } else if n >= 1_000 && n.is_multiple_of(1_000) {
        format!("{}K", n / 1_000)
    } else {
        n.to_string()
    }
}

/// Every size the sweep knows, smallest first: the document's 10K..50M,
/// then up to the 2 billion items its commands write.
pub const SWEEP_LADDER: [u64; 9] = [
    10_000,
    100_000,
    1_000_000,
    10_000_000,
    50_000_000,
    100_000_000,
    500_000_000,
    1_000_000_000,
    2_000_000_000,
];

impl RunArgs {
    /// Checks the flags and resolves defaults into [`Settings`].
    /// `terminal`: stderr is a terminal, so progress is a bar; otherwise
    /// it is a line every `--progress-every`.
    pub fn settings(&self, terminal: bool) -> Result<Settings, CliError> {
        let tiered = self.workload == WorkloadArg::Tiered;
        if tiered {
            self.tiered_refusals()?;
        }
        if self.server.is_some() {
            if self.device.is_some() {
                return Err(CliError::EmbeddedOnly {
                    flag: "device",
                    what: "disk profile",
                });
            }
            if self.durability.is_some() {
                return Err(CliError::EmbeddedOnly {
                    flag: "durability",
                    what: "durability",
                });
            }
            if self.shards.is_some() {
                return Err(CliError::EmbeddedOnly {
                    flag: "shards",
                    what: "shard count",
                });
            }
            for (given, flag, what) in [
                (self.tier.is_some(), "tier", "storage tier"),
                (self.cache_bytes.is_some(), "cache-bytes", "cache size"),
                (self.index_keys.is_some(), "index-keys", "index size"),
            ] {
                if given {
                    return Err(CliError::EmbeddedOnly { flag, what });
                }
            }
            if self.target == Some(TargetArg::Engine) {
                return Err(CliError::EngineWithServer);
            }
        }
        if self.tier_kind() == TierArg::Hybrid && self.durability == Some(DurabilityArg::None) {
            return Err(CliError::HybridWithoutWal);
        }

        let at_least = |flag: &'static str, got: f64, min: f64| {
            if got >= min && got.is_finite() {
                Ok(())
            } else {
                Err(CliError::TooSmall { flag, min, got })
            }
        };
        let sweep = self.workload == WorkloadArg::Sweep;
        let threads = self.threads.unwrap_or(if sweep { 1 } else { 16 });
        // The tiered workload reports the latency of GETs, not of batches.
        let batch = self.batch.unwrap_or(if sweep || tiered { 1 } else { 1000 });
        let shape = RecordShape {
            field_count: self.fields.unwrap_or(RecordShape::YCSB.field_count),
            field_length: self.field_length.unwrap_or(RecordShape::YCSB.field_length),
        };
        at_least("threads", threads as f64, 1.0)?;
        at_least("batch", batch as f64, 1.0)?;
        at_least("records", self.records as f64, 1.0)?;
        at_least("fields", shape.field_count as f64, 1.0)?;
        at_least("field-length", shape.field_length as f64, 1.0)?;
        at_least("timeout", self.timeout.as_secs_f64(), 0.001)?;
        let measure = match (self.duration, self.ops) {
            (_, Some(ops)) => {
                at_least("ops", ops as f64, 1.0)?;
                Measure::Ops(ops)
            }
            (Some(d), None) => {
                at_least("duration", d.as_secs_f64(), 0.001)?;
                Measure::Time(d)
            }
            (None, None) => Measure::Time(Duration::from_secs_f64(DEFAULT_DURATION_S)),
        };
        let pacing = match self.rate {
            Some(r) => {
                at_least("rate", r as f64, 1.0)?;
                Pacing::Open {
                    ops_per_sec: r as f64,
                }
            }
            None => Pacing::Closed,
        };
        let sweep_sizes = match &self.sweep_sizes {
            Some(list) => {
                for &n in list {
                    at_least("sweep-sizes", n as f64, 1.0)?;
                }
                list.clone()
            }
            None => {
                let sizes: Vec<u64> = SWEEP_LADDER
                    .iter()
                    .copied()
                    .filter(|&n| n <= self.sweep_max)
                    .collect();
                if sizes.is_empty() {
                    return Err(CliError::NoSweepSizes {
                        max: self.sweep_max,
                    });
                }
                sizes
            }
        };
        let sweep_items = if self.fields.is_some() || self.field_length.is_some() {
            sweep::ItemShape::Fields(shape)
        } else {
            sweep::ItemShape::Document
        };
        Ok(Settings {
            threads,
            batch,
            records: self.records,
            measure,
            warmup: self.warmup,
            pacing,
            seed: self.seed,
            shape,
            progress: match (terminal, self.progress_every) {
                (true, _) => Progress::Bar,
                (false, every) if every.is_zero() => Progress::Off,
                (false, every) => Progress::Lines { every },
            },
            sweep_sizes,
            sweep_items,
            sweep_warmup_ops: self.sweep_warmup,
            sweep_reads: self.sweep_reads,
            txn_range: self.range.unwrap_or(match self.workload {
                WorkloadArg::PutgettxContended => 64,
                _ => 1_000_000,
            }),
        })
    }

    /// What the tiered workload cannot be combined with: it starts its own
    /// three embedded servers with the hybrid tier and fixed device classes.
    fn tiered_refusals(&self) -> Result<(), CliError> {
        let refuse = |what| Err(CliError::TieredRefused(what));
        if self.server.is_some() {
            return refuse("starts three embedded servers of its own; it cannot measure --server");
        }
        if self.device.is_some() {
            return refuse("runs its three layouts on nvme and sas; leave --device out");
        }
        if self.tier == Some(TierArg::Memory) {
            return refuse("measures the hybrid tier; leave --tier out");
        }
        if self.durability == Some(DurabilityArg::None) {
            return refuse("needs a WAL (the hybrid tier's): use --durability sync or async");
        }
        if self.target == Some(TargetArg::Engine) {
            return refuse("measures embedded servers; leave --target out");
        }
        if self.crash_run() {
            return refuse("has no crash run");
        }
        let value = self.fields.unwrap_or(RecordShape::YCSB.field_count) as u64
            * self.field_length.unwrap_or(RecordShape::YCSB.field_length) as u64;
        if value > tiered::VALUE_BYTES_MAX {
            return refuse("stores values of at most 512 KiB (--fields x --field-length): its value segments are 1 MiB");
        }
        if self.write_percent > tiered::MAX_WRITE_PERCENT {
            return refuse("takes --write-percent from 0 to 50");
        }
        if !(1..=100).contains(&self.hot_percent) {
            return refuse("takes --hot-percent from 1 to 100");
        }
        if !(1..=15).contains(&self.hot_promote_reads) {
            return refuse("takes --hot-promote-reads from 1 to 15");
        }
        if !(1..=100).contains(&self.hot_move_percent) {
            return refuse("takes --hot-move-percent from 1 to 100");
        }
        if !(1..=99).contains(&self.hot_set_percent) {
            return refuse("takes --hot-set-percent from 1 to 99");
        }
        if self.hot_ops_percent > 100 {
            return refuse("takes --hot-ops-percent from 0 to 100");
        }
        for price in [self.price_nvme, self.price_sas, self.price_gpssd] {
            if !(price.is_finite() && price >= 0.0) {
                return refuse("takes prices of zero or more dollars");
            }
        }
        Ok(())
    }

    /// The tiered workload's own settings.
    pub fn tiered_plan(&self) -> tiered::TieredPlan {
        tiered::TieredPlan {
            write_percent: self.write_percent.min(tiered::MAX_WRITE_PERCENT),
            distributions: self
                .distribution
                .distributions((self.hot_set_percent, self.hot_ops_percent)),
            hot_percent: self.hot_percent.clamp(1, 100),
            promote_reads: self.hot_promote_reads.clamp(1, 15),
            move_percent: self.hot_move_percent.clamp(1, 100),
            prices: tiered::Prices {
                nvme: self.price_nvme,
                sas: self.price_sas,
                gpssd: self.price_gpssd,
            },
            cache_bytes: self
                .storage()
                .cache_bytes
                .unwrap_or(tunables::Config::default().storage.cache_bytes)
                .0,
        }
    }

    /// Whether this is a crash run (`--crash-every` or `--crashes`).
    pub fn crash_run(&self) -> bool {
        self.crash_every.is_some() || self.crashes.is_some()
    }

    /// The crash run's plan (None: not a crash run), after the refusals.
    pub fn crash_plan(&self, s: &Settings) -> Result<Option<crate::crash::CrashPlan>, CliError> {
        if !self.crash_run() {
            return Ok(None);
        }
        self.crash_refusals()?;
        let Measure::Time(duration) = s.measure else {
            return Err(CliError::CrashRefused("it runs for --duration, not --ops"));
        };
        let interval = match (self.crash_every, self.crashes) {
            (Some(every), _) => every,
            (None, n) => duration / (n.unwrap_or(1) + 1),
        };
        if interval.is_zero() {
            return Err(CliError::CrashRefused("--crash-every must be above zero"));
        }
        Ok(Some(crate::crash::CrashPlan {
            interval,
            crashes: self.crashes,
            duration,
            server_command: self
                .server_cmd
                .clone()
                .unwrap_or_else(crate::crash::process::ServerSpec::default_command),
            audit_keys_max: self.crash_audit_keys.max(1),
            async_slack: self.crash_async_slack,
            ready_within: self.timeout,
            timeout: self.timeout,
            between_kill_and_restart: None,
        }))
    }

    fn crash_refusals(&self) -> Result<(), CliError> {
        if self.server.is_some() {
            return Err(CliError::CrashRefused("it cannot restart a server it did not start (--server); describe how to start yours with --server-cmd"));
        }
        match self.target {
            Some(TargetArg::Engine) => return Err(CliError::CrashRefused("--target engine runs the engine inside loadgen, which a kill would take down with it")),
            Some(TargetArg::Server) => return Err(CliError::CrashRefused("--target server is the embedded server inside loadgen, which cannot be killed alone; leave --target out")),
            None => {}
        }
        if crate::crash::mix_of(self.workload).is_none() {
            return Err(CliError::CrashRefused(
                "its workloads are putget, sweep, ycsb-a, putgettx and putgettx-contended",
            ));
        }
        Ok(())
    }

    /// Durabilities to run on the embedded server, in order. The hybrid
    /// tier has no `none` run by default (it needs its WAL).
    pub fn durabilities(&self) -> Vec<DurabilityArg> {
        let hybrid = self.tier_kind() == TierArg::Hybrid;
        match (self.durability, self.workload) {
            (Some(d), _) => vec![d],
            (None, WorkloadArg::Putget) if hybrid => vec![DurabilityArg::Sync],
            (None, WorkloadArg::Putget) => vec![DurabilityArg::None, DurabilityArg::Sync],
            (None, WorkloadArg::Sweep) => vec![DurabilityArg::Async],
            (None, _) => vec![DurabilityArg::Sync],
        }
    }

    /// The storage tier of the embedded server or engine.
    pub fn tier_kind(&self) -> TierArg {
        match (self.tier, self.workload) {
            (Some(t), _) => t,
            (None, WorkloadArg::Tiered) => TierArg::Hybrid,
            (None, _) => TierArg::Memory,
        }
    }

    /// The storage settings of the embedded server or engine that the flags
    /// give (the rest stay at the config's defaults).
    pub fn storage(&self) -> crate::embedded::EmbeddedStorage {
        crate::embedded::EmbeddedStorage {
            tier: self.tier_kind(),
            // The tiered workload's cache is small, so reads reach the devices.
            cache_bytes: match (self.cache_bytes, self.workload) {
                (None, WorkloadArg::Tiered) => {
                    Some(tunables::ByteSize(tiered::DEFAULT_CACHE_BYTES))
                }
                (given, _) => given,
            },
            index_keys: self.index_keys,
        }
    }

    /// Shards of the embedded server or engine (0 = one per core).
    pub fn shard_count(&self) -> u32 {
        match self.shards {
            Some(n) => n,
            None if self.workload == WorkloadArg::Sweep
                && self.target_kind() == TargetArg::Engine =>
            {
                1
            }
            None => 0,
        }
    }

    /// The target to measure when no `--server` is given.
    pub fn target_kind(&self) -> TargetArg {
        match (self.target, self.workload) {
            (Some(t), _) => t,
            (None, WorkloadArg::Sweep) => TargetArg::Engine,
            (None, _) => TargetArg::Server,
        }
    }

    /// Device classes to run on the embedded server.
    pub fn devices(&self) -> Vec<&'static str> {
        self.device.unwrap_or(DeviceArg::Nvme).profiles()
    }
}

// The sweep's default sizes are the document's columns: the ladder's first five.
const _: () = assert!(
    SWEEP_LADDER[0] == crate::published::SWEEP_SIZES[0]
        && SWEEP_LADDER[4] == crate::published::SWEEP_SIZES[4]
);

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn parse(args: &[&str]) -> Cli {
        let mut full = vec!["loadgen"];
        full.extend_from_slice(args);
        Cli::try_parse_from(full).expect("parses")
    }

    #[test]
    fn clap_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn defaults_are_the_documented_ones() {
        let cli = parse(&[]);
        assert!(cli.command.is_none());
        let r = &cli.run;
        assert_eq!(r.workload, WorkloadArg::Putget);
        assert_eq!(r.devices(), vec!["nvme"]);
        assert_eq!(r.records, 200_000);
        assert_eq!(
            r.durabilities(),
            vec![DurabilityArg::None, DurabilityArg::Sync]
        );
        assert_eq!(r.target_kind(), TargetArg::Server);
        let s = r.settings(false).expect("settings");
        assert_eq!((s.threads, s.batch), (16, 1000));
        assert_eq!(s.measure, Measure::Time(Duration::from_secs(10)));
        assert_eq!(s.warmup, Duration::from_secs(2));
        assert_eq!(s.pacing, Pacing::Closed);
        assert_eq!(s.sweep_sizes, crate::published::SWEEP_SIZES.to_vec());
        assert_eq!(s.shape, RecordShape::YCSB);
    }

    #[test]
    fn sweep_defaults_are_the_documents_method() {
        let r = parse(&["--workload", "sweep"]).run;
        assert_eq!(r.target_kind(), TargetArg::Engine);
        assert_eq!(r.durabilities(), vec![DurabilityArg::Async]);
        let s = r.settings(false).expect("settings");
        assert_eq!((s.threads, s.batch), (1, 1));
        assert_eq!(s.sweep_items, sweep::ItemShape::Document);
        assert_eq!(s.sweep_warmup_ops, 10_000);
        assert_eq!(s.sweep_sizes, crate::published::SWEEP_SIZES.to_vec());
        // Today's shape stays available.
        let s = parse(&[
            "--workload",
            "sweep",
            "--fields",
            "10",
            "--threads",
            "16",
            "--batch",
            "1000",
            "--target",
            "server",
        ])
        .run
        .settings(false)
        .expect("settings");
        assert_eq!((s.threads, s.batch), (16, 1000));
        assert_eq!(s.sweep_items, sweep::ItemShape::Fields(RecordShape::YCSB));
        let e = parse(&["--server", "127.0.0.1:1", "--target", "engine"])
            .run
            .settings(false)
            .unwrap_err();
        assert_eq!(e, CliError::EngineWithServer);
    }

    #[test]
    fn counts_accept_suffixes() {
        assert_eq!(parse_count("15M"), Ok(15_000_000));
        assert_eq!(parse_count("200k"), Ok(200_000));
        assert_eq!(parse_count("1_000"), Ok(1000));
        assert_eq!(parse_count("2G"), Ok(2_000_000_000));
        assert!(parse_count("ten").is_err());
        assert!(parse_count("99999999999999G").is_err());
        assert_eq!(format_count(10_000), "10K");
        assert_eq!(format_count(50_000_000), "50M");
        assert_eq!(format_count(1_500), "1500");
        assert_eq!(format_count(0), "0");
    }

    #[test]
    fn sweep_max_selects_the_ladder_prefix() {
        let s = parse(&["--workload", "sweep", "--sweep-max", "50M"])
            .run
            .settings(false)
            .expect("ok");
        assert_eq!(s.sweep_sizes, SWEEP_LADDER[..5].to_vec());
        let s = parse(&["--workload", "sweep", "--sweep-max", "2G"])
            .run
            .settings(false)
            .expect("2G is accepted");
        assert_eq!(s.sweep_sizes, SWEEP_LADDER.to_vec());
        let s = parse(&["--sweep-sizes", "1K,5K"])
            .run
            .settings(false)
            .expect("ok");
        assert_eq!(s.sweep_sizes, vec![1_000, 5_000]);
        let e = parse(&["--sweep-max", "5K"])
            .run
            .settings(false)
            .unwrap_err();
        assert_eq!(e, CliError::NoSweepSizes { max: 5_000 });
    }

    #[test]
    fn server_refuses_embedded_only_flags() {
        for flag in [
            ["--device", "sas"],
            ["--durability", "none"],
            ["--shards", "2"],
            ["--tier", "hybrid"],
            ["--cache-bytes", "1GiB"],
            ["--index-keys", "1M"],
        ] {
            let cli = parse(&["--server", "127.0.0.1:1", flag[0], flag[1]]);
            assert!(
                matches!(cli.run.settings(false), Err(CliError::EmbeddedOnly { .. })),
                "{flag:?}"
            );
        }
        assert!(parse(&["--server", "127.0.0.1:1"])
            .run
            .settings(false)
            .is_ok());
    }

    #[test]
    fn tier_flags_parse_into_the_embedded_config() {
        let r = parse(&[]).run;
        assert_eq!(r.tier_kind(), TierArg::Memory);
        assert_eq!(r.storage().tier, TierArg::Memory);

        let r = parse(&[
            "--tier",
            "hybrid",
            "--cache-bytes",
            "64MiB",
            "--index-keys",
            "2M",
        ])
        .run;
        assert!(r.settings(false).is_ok());
        assert_eq!(r.tier_kind(), TierArg::Hybrid);
        // The default put/get pair drops its RAM-only run: hybrid needs a WAL.
        assert_eq!(r.durabilities(), vec![DurabilityArg::Sync]);
        let storage = r.storage();
        assert_eq!(storage.cache_bytes, Some(tunables::ByteSize::mib(64)));
        assert_eq!(storage.index_keys, Some(2_000_000));
        let dir = tempfile::tempdir().expect("tempdir");
        let c =
            crate::embedded::embedded_config(dir.path(), "nvme", DurabilityArg::Sync, 2, storage)
                .expect("config");
        assert_eq!(c.storage.tier, tunables::Tier::Hybrid);
        assert_eq!(c.storage.cache_bytes, tunables::ByteSize::mib(64));
        assert_eq!(c.storage.index_keys, 2_000_000);
        c.validate().expect("a valid config");

        let e = parse(&["--tier", "hybrid", "--durability", "none"])
            .run
            .settings(false)
            .unwrap_err();
        assert_eq!(e, CliError::HybridWithoutWal);
        assert!(parse(&["--tier", "memory", "--durability", "none"])
            .run
            .settings(false)
            .is_ok());
        let argv = ["loadgen", "--tier", "disk"];
        assert!(Cli::try_parse_from(argv).is_err());
        let argv = ["loadgen", "--cache-bytes", "lots"];
        assert!(Cli::try_parse_from(argv).is_err());
    }

    #[test]
    fn duration_and_ops_conflict_and_bad_values_are_refused() {
        let argv = ["loadgen", "--duration", "3", "--ops", "100"];
        assert!(Cli::try_parse_from(argv).is_err());
        let e = parse(&["--threads", "0"]).run.settings(false).unwrap_err();
        assert!(matches!(
            e,
            CliError::TooSmall {
                flag: "threads",
                ..
            }
        ));
        let s = parse(&["--ops", "5K", "--rate", "20K"])
            .run
            .settings(false)
            .expect("ok");
        assert_eq!(s.measure, Measure::Ops(5_000));
        assert_eq!(
            s.pacing,
            Pacing::Open {
                ops_per_sec: 20_000.0
            }
        );
        assert_eq!(s.mode(), "open");
    }

    #[test]
    fn workloads_and_devices_resolve() {
        let cli = parse(&[
            "--workload",
            "ycsb",
            "--device",
            "all",
            "--durability",
            "async",
        ]);
        assert_eq!(cli.run.devices(), vec!["sas", "gpssd", "nvme"]);
        assert_eq!(cli.run.durabilities(), vec![DurabilityArg::Async]);
        let names: Vec<&str> = cli
            .run
            .workload
            .ycsb_mixes()
            .iter()
            .map(|m| m.name)
            .collect();
        assert_eq!(names, ycsb::RECOMMENDED_ORDER.to_vec());
        assert_eq!(
            parse(&["--workload", "gridgain"]).run.workload,
            WorkloadArg::Putget
        );
        assert_eq!(
            parse(&["--workload", "ycsb-f"])
                .run
                .workload
                .ycsb_mixes()
                .len(),
            1
        );
        assert_eq!(
            parse(&["--workload", "ycsb-a"]).run.durabilities(),
            vec![DurabilityArg::Sync]
        );
    }

    #[test]
    fn subcommands_parse() {
        let cli = parse(&["compare", "a.json", "b.json"]);
        assert!(matches!(cli.command, Some(Command::Compare { .. })));
        let cli = parse(&["plot", "a.json", "b.svg"]);
        assert!(matches!(cli.command, Some(Command::Plot { .. })));
    }

    #[test]
    fn help_mentions_every_flag_with_its_default() {
        let help = Cli::command().render_long_help().to_string();
        for flag in [
            "--workload",
            "--device",
            "--server",
            "--threads",
            "--batch",
            "--records",
            "--duration",
            "--ops",
            "--durability",
            "--rate",
            "--seed",
            "--json",
            "--plot",
            "--sweep-max",
            "--sweep-warmup",
            "--target",
            "--tier",
            "--cache-bytes",
            "--index-keys",
        ] {
            assert!(help.contains(flag), "help lacks {flag}");
        }
        for default in [
            "default: putget",
            "default: 16",
            "default: 1000",
            "default: 200K",
            "default: nvme",
            "default: 10]",
            "default: memory",
        ] {
            assert!(help.contains(default), "help lacks {default:?}");
        }
    }

    #[test]
    fn tiered_defaults_and_refusals() {
        let r = parse(&["--workload", "tiered"]).run;
        let s = r.settings(false).expect("settings");
        assert_eq!((s.threads, s.batch), (16, 1));
        assert_eq!(r.tier_kind(), TierArg::Hybrid);
        assert_eq!(r.durabilities(), vec![DurabilityArg::Sync]);
        assert_eq!(
            r.storage().cache_bytes,
            Some(tunables::ByteSize(tiered::DEFAULT_CACHE_BYTES))
        );
        let plan = r.tiered_plan();
        assert_eq!(plan.write_percent, 5);
        assert_eq!(plan.hot_percent, 10);
        assert_eq!((plan.promote_reads, plan.move_percent), (2, 20));
        assert_eq!(plan.prices, tiered::Prices::default());
        assert_eq!(
            plan.distributions,
            vec![ycsb::Distribution::Zipfian, ycsb::Distribution::Uniform]
        );
        let r = parse(&[
            "--workload",
            "tiered",
            "--distribution",
            "uniform",
            "--write-percent",
            "50",
            "--price-sas",
            "0.02",
            "--cache-bytes",
            "0B",
            "--hot-promote-reads",
            "4",
            "--hot-move-percent",
            "100",
        ])
        .run;
        assert!(r.settings(false).is_ok());
        let plan = r.tiered_plan();
        assert_eq!((plan.promote_reads, plan.move_percent), (4, 100));
        assert_eq!(plan.distributions, vec![ycsb::Distribution::Uniform]);
        assert_eq!((plan.write_percent, plan.prices.sas), (50, 0.02));
        assert_eq!(r.storage().cache_bytes, Some(tunables::ByteSize(0)));
        let r = parse(&[
            "--workload",
            "tiered",
            "--distribution",
            "hotspot",
            "--hot-set-percent",
            "10",
            "--hot-ops-percent",
            "90",
        ])
        .run;
        assert!(r.settings(false).is_ok());
        assert_eq!(
            r.tiered_plan().distributions,
            vec![ycsb::Distribution::Hotspot {
                hot_set_percent: 10,
                hot_ops_percent: 90
            }]
        );
        for args in [
            &["--write-percent", "51"][..],
            &["--hot-percent", "0"],
            &["--hot-promote-reads", "16"],
            &["--hot-move-percent", "0"],
            &["--hot-set-percent", "0"],
            &["--hot-set-percent", "100"],
            &["--hot-ops-percent", "101"],
            &["--device", "sas"],
            &["--tier", "memory"],
            &["--durability", "none"],
            &["--server", "127.0.0.1:1"],
            &["--target", "engine"],
            &["--crashes", "1"],
            &["--price-nvme=-1"],
            &["--fields", "1", "--field-length", "600000"],
        ] {
            let mut full = vec!["--workload", "tiered"];
            full.extend_from_slice(args);
            assert!(
                matches!(
                    parse(&full).run.settings(false),
                    Err(CliError::TieredRefused(_))
                ),
                "{args:?} was not refused"
            );
        }
    }

    fn crash_refusal(args: &[&str]) -> Option<CliError> {
        let r = parse(args).run;
        let s = r.settings(false).ok()?;
        r.crash_plan(&s).err()
    }

    #[test]
    fn crash_runs_refuse_what_they_cannot_kill() {
        for args in [
            &["--crashes", "2", "--target", "engine"][..],
            &["--crashes", "2", "--target", "server"],
            &["--crash-every", "1s", "--server", "127.0.0.1:1"],
            &["--crash-every", "1s", "--workload", "ycsb-b"],
            &["--crash-every", "1s", "--ops", "1000"],
        ] {
            assert!(
                matches!(crash_refusal(args), Some(CliError::CrashRefused(_))),
                "{args:?} was not refused"
            );
        }
        let r = parse(&["--crash-every", "0s"]).run;
        let s = r.settings(false).expect("settings");
        assert!(r.crash_plan(&s).is_err());
    }

    #[test]
    fn crash_plan_defaults() {
        let r = parse(&["--crashes", "3", "--duration", "8"]).run;
        let s = r.settings(false).expect("settings");
        let plan = r.crash_plan(&s).expect("plan").expect("a crash run");
        assert_eq!(plan.interval, Duration::from_secs(2));
        assert_eq!(plan.crashes, Some(3));
        assert_eq!(plan.audit_keys_max, 2_000_000);
        assert_eq!(plan.async_slack, Duration::from_millis(250));
        let r = parse(&["--crash-every", "10s"]).run;
        let plan = r
            .crash_plan(&r.settings(false).expect("settings"))
            .expect("plan")
            .expect("run");
        assert_eq!(
            (plan.interval, plan.crashes),
            (Duration::from_secs(10), None)
        );
        let r = parse(&[]).run;
        assert!(r
            .crash_plan(&r.settings(false).expect("settings"))
            .expect("ok")
            .is_none());
    }

    #[test]
    fn durations_take_bare_seconds_or_a_unit() {
        let ok: &[(&str, Duration)] = &[
            ("10", Duration::from_secs(10)),
            ("0.5", Duration::from_millis(500)),
            ("0", Duration::ZERO),
            ("10s", Duration::from_secs(10)),
            ("250ms", Duration::from_millis(250)),
            ("2m", Duration::from_secs(120)),
            ("1h", Duration::from_secs(3600)),
            ("200us", Duration::from_micros(200)),
            (" 3 s ", Duration::from_secs(3)),
        ];
        for (text, want) in ok {
            assert_eq!(parse_duration(text), Ok(*want), "{text:?}");
        }
        for bad in ["", ".", "ten", "10x", "1.5s", "-1", "1e3", "inf", "10 sec"] {
            let e = parse_duration(bad).expect_err(bad);
            assert!(
                e.contains("a duration is a number of seconds"),
                "{bad:?}: {e}"
            );
        }
        assert!(parse_duration("5d")
            .unwrap_err()
            .contains("unknown duration unit 'd'"));
    }

    #[test]
    fn every_duration_flag_takes_both_forms() {
        let r = parse(&[
            "--timeout",
            "10s",
            "--crash-every",
            "10",
            "--duration",
            "30",
            "--warmup",
            "500ms",
            "--crash-async-slack",
            "1",
            "--progress-every",
            "1m",
        ])
        .run;
        assert_eq!(r.timeout, Duration::from_secs(10));
        assert_eq!(r.crash_every, Some(Duration::from_secs(10)));
        assert_eq!(r.crash_async_slack, Duration::from_secs(1));
        assert_eq!(r.progress_every, Duration::from_secs(60));
        let s = r.settings(false).expect("settings");
        assert_eq!(s.warmup, Duration::from_millis(500));
        assert_eq!(s.measure, Measure::Time(Duration::from_secs(30)));
        assert_eq!(
            s.progress,
            Progress::Lines {
                every: Duration::from_secs(60)
            }
        );
        let plan = r.crash_plan(&s).expect("plan").expect("a crash run");
        assert_eq!(plan.interval, Duration::from_secs(10));
        assert_eq!(plan.timeout, Duration::from_secs(10));
    }

    #[test]
    fn a_bad_duration_names_its_flag() {
        for flag in ["--timeout", "--crash-every", "--warmup", "--duration"] {
            let e = Cli::try_parse_from(["loadgen", flag, "10parsecs"]).unwrap_err();
            let text = e.to_string();
            assert!(text.contains(flag), "{text}");
            assert!(text.contains("10parsecs"), "{text}");
        }
    }

    #[test]
    fn progress_is_a_bar_on_a_terminal_and_lines_elsewhere() {
        let r = parse(&[]).run;
        assert_eq!(r.settings(true).expect("settings").progress, Progress::Bar);
        assert_eq!(
            r.settings(false).expect("settings").progress,
            Progress::Lines {
                every: Duration::from_secs(5)
            }
        );
        let r = parse(&["--progress-every", "0"]).run;
        assert_eq!(r.settings(false).expect("settings").progress, Progress::Off);
    }

    #[test]
    fn device_profile_is_the_device_flag() {
        let a = parse(&["--device-profile", "sas"]).run;
        let b = parse(&["--device", "sas"]).run;
        assert_eq!(a.device, Some(DeviceArg::Sas));
        assert_eq!(a.devices(), b.devices());
        // The same flag: giving both is a repeat, not two settings.
        assert!(
            Cli::try_parse_from(["loadgen", "--device", "sas", "--device-profile", "nvme"])
                .is_err()
        );
        let help = Cli::command().render_long_help().to_string();
        assert!(help.contains("--device-profile"), "{help}");
    }

    #[test]
    fn help_groups_the_flags_under_headings() {
        let help = Cli::command().render_long_help().to_string();
        let mut last = 0;
        for h in heading::ALL {
            let at = help
                .find(&format!("\n{h}:\n"))
                .unwrap_or_else(|| panic!("no heading {h:?} in\n{help}"));
            assert!(at > last, "heading {h:?} out of order");
            last = at;
        }
        // Every flag of the run sits under a heading, none in the default
        // "Options" list but --help and --version.
        let cmd = Cli::command();
        for arg in cmd.get_arguments() {
            let id = arg.get_id().as_str();
            if id == "help" || id == "version" {
                continue;
            }
            assert!(arg.get_help_heading().is_some(), "--{id} has no heading");
        }
        // One flag per heading checked in the text: under its heading.
        for (h, flag) in [
            (heading::WORKLOAD, "--duration"),
            (heading::DATA, "--records"),
            (heading::TARGET, "--password-file"),
            (heading::STORAGE, "--device"),
            (heading::CRASH, "--crash-every"),
            (heading::TIERED, "--hot-percent"),
            (heading::OUTPUT, "--progress-every"),
        ] {
            let from = help.find(&format!("\n{h}:\n")).expect("heading") + 1;
            let section = &help[from..];
            // The section ends where the next heading starts.
            let end = heading::ALL
                .iter()
                .filter_map(|o| section.find(&format!("\n{o}:\n")))
                .min()
                .unwrap_or(section.len());
            assert!(section[..end].contains(flag), "{flag} not under {h:?}");
        }
    }
}
