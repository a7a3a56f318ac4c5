//! ringkv configuration: the schema, its defaults, and the disk profiles.
//!
//! This crate depends on nothing else in the workspace. Every field here is
//! documented in `docs/config.md` with its meaning, unit, default and range.
//! Sizes and durations are written as human strings ("64MiB", "200us") and
//! parsed through [`ByteSize`] and [`Duration`].

mod units;

pub use units::{ByteSize, Duration, UnitError};

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// The whole configuration file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Number of shards; 0 means one shard per available core. Default: 0.
    pub shards: u32,
    pub server: ServerConfig,
    pub storage: StorageConfig,
    pub limits: LimitsConfig,
    pub io: IoConfig,
    /// Named devices that storage parts are placed on (`wal`, `snapshot`, ...).
    pub devices: BTreeMap<String, DeviceConfig>,
    /// User-defined disk profiles, in addition to the built-in ones.
    pub profiles: BTreeMap<String, ProfileConfig>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Address of the binary-protocol listener. Default: "127.0.0.1:7379".
    pub listen: String,
    /// Address of the Prometheus `/metrics` listener; empty disables it. Default: "".
    pub metrics_listen: String,
    /// Connections accepted at once across all shards. Default: 10000.
    pub max_connections: u32,
    /// A connection idle this long is closed. Default: "300s".
    pub idle_timeout: Duration,
    /// Frames a connection may have in flight (pipelined, not yet answered). Default: 128.
    pub pipeline_depth_max: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    /// Every key and value in RAM; persistence through the WAL and snapshots.
    Memory,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    /// Acknowledge a write after the fdatasync that covers it returns.
    Sync,
    /// Acknowledge once applied in memory; flush every `flush_interval`.
    Async,
    /// RAM only: no WAL, no snapshots.
    None,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StorageConfig {
    /// Directory holding the manifest, the lock file and one folder per shard. Default: "./data".
    pub data_dir: PathBuf,
    /// Storage tier. Default: "memory".
    pub tier: Tier,
    /// Durability mode. Default: "sync".
    pub durability: Durability,
    /// Size of one preallocated WAL segment. Multiple of 4096. Default: "64MiB".
    pub wal_segment_size: ByteSize,
    /// Most bytes one group commit writes. Multiple of 4096, <= wal_segment_size. Default: "1MiB".
    pub group_commit_max_bytes: ByteSize,
    /// Longest a write waits for others to join its group commit. Default: "0us"
    /// (a flush starts as soon as the previous one completes).
    pub group_commit_max_delay: Duration,
    /// In `async` mode, how often buffered writes are flushed. Default: "10ms".
    pub flush_interval: Duration,
    /// A checkpoint is taken once the WAL holds this many bytes past the last one. Default: "256MiB".
    pub checkpoint_wal_bytes: ByteSize,
    /// A checkpoint is also taken this often if anything was written. "0s" disables. Default: "300s".
    pub checkpoint_interval: Duration,
    /// Device (in `[devices]`) the WAL and snapshots live on. Default: "wal".
    pub wal_device: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    /// Largest key. Default: "1KiB". Range 1 B..=64 KiB.
    pub key_bytes_max: ByteSize,
    /// Largest value. Default: "1MiB". Range 0..=64 MiB.
    pub value_bytes_max: ByteSize,
    /// Largest wire frame. Default: "16MiB".
    pub frame_bytes_max: ByteSize,
    /// Most operations in one frame or engine batch. Default: 10000.
    pub ops_per_frame_max: u32,
    /// Capacity of each shard's inbound request channel, in batches. Default: 1024.
    pub shard_queue_depth: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// io_uring when the kernel allows it, else the fallback (said once in the log).
    Auto,
    /// io_uring or refuse to start.
    Uring,
    /// Always the fallback (readiness polling + a blocking-I/O thread pool).
    Fallback,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IoConfig {
    /// I/O backend. Default: "auto".
    pub backend: Backend,
    /// io_uring submission queue entries per shard. Power of two, 8..=4096. Default: 256.
    pub queue_depth: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DeviceConfig {
    /// Directory on this device; empty means the data directory. Default: "".
    pub path: PathBuf,
    /// Disk profile (built-in `sas`, `gpssd`, `nvme`, `unthrottled`, or one of `[profiles]`).
    /// Default: "unthrottled".
    pub profile: String,
}

/// A disk class: an IOPS rate with a burst credit, and optionally a bandwidth cap.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProfileConfig {
    /// Sustained I/O operations per second; 0 means unlimited.
    pub iops: u64,
    /// Rate allowed while burst credit lasts (>= iops).
    pub burst_iops: u64,
    /// Burst credit, in I/Os, when full (the bucket refills at `iops`).
    pub burst_credit: u64,
    /// Bandwidth cap in bytes per second; "0B" means none.
    pub bytes_per_sec: ByteSize,
    /// An I/O larger than this counts as ceil(len / io_unit) I/Os.
    pub io_unit: ByteSize,
    /// Whether an fdatasync counts as one I/O.
    pub count_fsync: bool,
}

impl Default for Config {
    fn default() -> Self {
        let mut devices = BTreeMap::new();
        devices.insert("wal".to_string(), DeviceConfig::default());
        Config {
            shards: 0,
            server: ServerConfig::default(),
            storage: StorageConfig::default(),
            limits: LimitsConfig::default(),
            io: IoConfig::default(),
            devices,
            profiles: BTreeMap::new(),
        }
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: "127.0.0.1:7379".to_string(),
            metrics_listen: String::new(),
            max_connections: 10_000,
            idle_timeout: Duration::from_secs(300),
            pipeline_depth_max: 128,
        }
    }
}

impl Default for StorageConfig {
    fn default() -> Self {
        StorageConfig {
            data_dir: PathBuf::from("./data"),
            tier: Tier::Memory,
            durability: Durability::Sync,
            wal_segment_size: ByteSize::mib(64),
            group_commit_max_bytes: ByteSize::mib(1),
            group_commit_max_delay: Duration::from_micros(0),
            flush_interval: Duration::from_millis(10),
            checkpoint_wal_bytes: ByteSize::mib(256),
            checkpoint_interval: Duration::from_secs(300),
            wal_device: "wal".to_string(),
        }
    }
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            key_bytes_max: ByteSize::kib(1),
            value_bytes_max: ByteSize::mib(1),
            frame_bytes_max: ByteSize::mib(16),
            ops_per_frame_max: 10_000,
            shard_queue_depth: 1024,
        }
    }
}

impl Default for IoConfig {
    fn default() -> Self {
        IoConfig {
            backend: Backend::Auto,
            queue_depth: 256,
        }
    }
}

impl Default for DeviceConfig {
    fn default() -> Self {
        DeviceConfig {
            path: PathBuf::new(),
            profile: "unthrottled".to_string(),
        }
    }
}

impl Default for ProfileConfig {
    fn default() -> Self {
        ProfileConfig {
            iops: 0,
            burst_iops: 0,
            burst_credit: 0,
            bytes_per_sec: ByteSize(0),
            io_unit: ByteSize::kib(256),
            count_fsync: true,
        }
    }
}
