//! ringkv configuration: the schema, its defaults, loading with complete
//! error reports, validation, and the disk profiles.
//!
//! This crate depends on nothing else in the workspace. Every field here is
//! documented in `docs/config.md` with its meaning, unit, default and range;
//! `ringkv.toml` at the repository root lists every field at its default (a
//! test keeps it equal to [`Config::default`]). Sizes and durations are written
//! as human strings ("64MiB", "200us") and parsed through [`ByteSize`] and
//! [`Duration`]. Load files with [`Config::load`] or [`Config::from_toml_str`]:
//! they reject unknown keys and report every problem at once. The serde derives
//! below exist for embedding; they stop at the first error and do not validate.

mod error;
mod load;
mod profiles;
mod suggest;
mod units;
mod validate;

pub use error::{ConfigError, ConfigErrors};
pub use profiles::{builtin_profile, builtin_profile_names, BURST_WINDOW_SECS};
pub use units::{ByteSize, Duration, UnitError, DURATION_UNITS, SIZE_UNITS};
pub use validate::{
    is_loopback, unprotected_listeners, FRAME_OVERHEAD_BYTES_MAX, PAGE_SIZE_BYTES,
    PASSWORD_BYTES_MAX, SHARDS_MAX, WAL_RECORD_HEADER_BYTES_MAX,
};

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

/// What [`Config::redacted`] writes in place of a password.
pub const REDACTED: &str = "<redacted>";

/// The whole configuration file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Number of shards; 0 means one shard per available core. Range 0..=256. Default: 0.
    pub shards: u32,
    pub server: ServerConfig,
    pub storage: StorageConfig,
    pub limits: LimitsConfig,
    pub io: IoConfig,
    /// Named devices that storage parts are placed on (`wal`, ...). Names are
    /// 1..=64 characters of `A-Za-z0-9_-`. Default: one device `wal` on the
    /// `unthrottled` profile in the data directory.
    pub devices: BTreeMap<String, DeviceConfig>,
    /// User-defined disk profiles, in addition to the built-in ones. A user
    /// profile named like a built-in one replaces it. Default: none.
    pub profiles: BTreeMap<String, ProfileConfig>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Address of the binary-protocol listener, `IP:PORT` (no host names).
    /// Default: "127.0.0.1:7379".
    pub listen: String,
    /// Address of the Prometheus `/metrics` listener, `IP:PORT`; empty disables
    /// it. Must differ from `listen`. Default: "".
    pub metrics_listen: String,
    /// Connections accepted at once across all shards. Range 1..=1000000. Default: 10000.
    pub max_connections: u32,
    /// A connection idle this long is closed. Range "1ms"..="7d" (168h). Default: "300s".
    pub idle_timeout: Duration,
    /// Frames a connection may have in flight (pipelined, not yet answered).
    /// Range 1..=65536. Default: 128.
    pub pipeline_depth_max: u32,

    // --- Access control (issue 16). docs/config.md "Access control". ---
    /// Password every client must present in the handshake; empty means none.
    /// 1..=512 bytes when set; not together with `password_file`. Shown
    /// redacted by `--print-config`. Default: "".
    pub requirepass: String,
    /// File whose content (one trailing newline removed) is the password;
    /// keeps the secret out of this file. Empty means none. Read at start.
    /// Default: "".
    pub password_file: PathBuf,
    /// Protected mode's opt-out: allow listening on a non-loopback address
    /// with no password. Default: false.
    pub dangerously_listen_without_password: bool,
    /// A connection must finish its handshake (TLS included) within this.
    /// Range "10ms"..="1h". Default: "10s".
    pub handshake_timeout: Duration,
    /// How long a wrong password waits before it is refused. Range
    /// "0s"..="10s". Default: "200ms".
    pub auth_failure_delay: Duration,
    /// TLS on the binary-protocol listener. Needs `tls_cert_file` and
    /// `tls_key_file`. Default: false.
    pub tls_native: bool,
    /// TLS (HTTPS) on the `/metrics` listener. Default: false.
    pub tls_metrics: bool,
    /// Certificate chain, PEM, leaf first. Default: "".
    pub tls_cert_file: PathBuf,
    /// Private key of the certificate, PEM (PKCS#8, PKCS#1 or SEC1). Default: "".
    pub tls_key_file: PathBuf,
    /// CA certificates, PEM: when set, TLS clients must present a certificate
    /// signed by one of them. Default: "" (no client certificates).
    pub tls_client_ca_file: PathBuf,
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
    /// Directory holding the manifest, the lock file and one folder per shard.
    /// Must not be empty. Default: "./data".
    pub data_dir: PathBuf,
    /// Storage tier. Default: "memory".
    pub tier: Tier,
    /// Durability mode. Default: "sync".
    pub durability: Durability,
    /// Size of one preallocated WAL segment. Multiple of 4096, range
    /// "64KiB"..="64GiB". Default: "64MiB".
    pub wal_segment_size: ByteSize,
    /// Most bytes one group commit writes. Multiple of 4096, range
    /// "4KiB"..="1GiB", <= wal_segment_size / 2, and >= value_bytes_max +
    /// key_bytes_max + 64 (one record always fits a flush). Default: "2MiB".
    pub group_commit_max_bytes: ByteSize,
    /// Longest a write waits for others to join its group commit. Range
    /// "0s"..="1s". Default: "0s" (a flush starts as soon as the previous one
    /// completes).
    pub group_commit_max_delay: Duration,
    /// In `async` mode, how often buffered writes are flushed. Range
    /// "100us"..="60s". Default: "10ms".
    pub flush_interval: Duration,
    /// A checkpoint is taken once the WAL holds this many bytes past the last
    /// one. Range "64KiB"..="1TiB". Default: "256MiB".
    pub checkpoint_wal_bytes: ByteSize,
    /// A checkpoint is also taken this often if anything was written. "0s"
    /// disables. Range "0s"..="7d" (168h). Default: "300s".
    pub checkpoint_interval: Duration,
    /// Device (a key of `[devices]`) the WAL and snapshots live on. Default: "wal".
    pub wal_device: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    /// Largest key. Range "1B"..="64KiB". Default: "1KiB".
    pub key_bytes_max: ByteSize,
    /// Largest value. Range "0B"..="64MiB". Default: "1MiB".
    pub value_bytes_max: ByteSize,
    /// Largest wire frame. Range "4KiB"..="1GiB", and >= key_bytes_max +
    /// value_bytes_max + 256 (one max-size PUT always fits). Default: "16MiB".
    pub frame_bytes_max: ByteSize,
    /// Most operations in one frame or engine batch. Range 1..=1000000. Default: 10000.
    pub ops_per_frame_max: u32,
    /// Capacity of each shard's inbound request channel, in batches. Range
    /// 1..=65536. Default: 1024.
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

/// A disk class: an IOPS rate with a burst credit, and optionally a bandwidth
/// cap. See the module docs of `profiles` and `docs/config.md` for the burst
/// model and the I/O counting rule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProfileConfig {
    /// Sustained I/O operations per second; 0 means no IOPS limit (then
    /// `burst_iops` and `burst_credit` must be 0). Range 0..=10000000. Default: 0.
    pub iops: u64,
    /// Rate allowed while burst credit lasts; >= iops. Range 0..=10000000. Default: 0.
    pub burst_iops: u64,
    /// Burst credit, in I/Os, when full; the bucket starts full and refills at
    /// `iops` per second. Must be > 0 when burst_iops > iops. Range
    /// 0..=10^12. Default: 0.
    pub burst_credit: u64,
    /// Bandwidth cap in bytes per second; "0B" means none, else at least
    /// `io_unit`. Range up to "1TiB". Default: "0B".
    pub bytes_per_sec: ByteSize,
    /// An I/O larger than this counts as ceil(len / io_unit) I/Os. Multiple of
    /// 4096, range "4KiB"..="64MiB". Default: "256KiB".
    pub io_unit: ByteSize,
    /// Whether an fdatasync counts as one I/O. Default: true.
    pub count_fsync: bool,
}

/// A string that names no variant of a config enum.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {kind} \"{value}\" (allowed: {})", allowed.join(", "))]
pub struct UnknownVariant {
    /// What was being parsed: "tier", "durability mode", "I/O backend".
    pub kind: &'static str,
    pub value: String,
    pub allowed: &'static [&'static str],
}

/// Config enums written as lower-case names.
pub(crate) trait NamedVariants: FromStr<Err = UnknownVariant> {
    const NAMES: &'static [&'static str];
}

macro_rules! named_enum {
    ($ty:ident, $kind:literal, $($variant:ident => $name:literal),+ $(,)?) => {
        impl $ty {
            /// The name used in the config file.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $($ty::$variant => $name),+
                }
            }
        }

        impl NamedVariants for $ty {
            const NAMES: &'static [&'static str] = &[$($name),+];
        }

        impl FromStr for $ty {
            type Err = UnknownVariant;
            fn from_str(s: &str) -> Result<Self, UnknownVariant> {
                match s {
                    $($name => Ok($ty::$variant),)+
                    _ => Err(UnknownVariant {
                        kind: $kind,
                        value: s.to_string(),
                        allowed: <$ty as NamedVariants>::NAMES,
                    }),
                }
            }
        }

        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

named_enum!(Tier, "tier", Memory => "memory");
named_enum!(Durability, "durability mode", Sync => "sync", Async => "async", None => "none");
named_enum!(Backend, "I/O backend", Auto => "auto", Uring => "uring", Fallback => "fallback");

impl Config {
    /// The profile of this name: a user `[profiles]` entry first (it overrides
    /// a built-in of the same name), then a built-in one.
    pub fn profile(&self, name: &str) -> Option<ProfileConfig> {
        self.profiles
            .get(name)
            .cloned()
            .or_else(|| builtin_profile(name))
    }

    /// The profile of the device of this name (a key of `[devices]`), or
    /// `None` if there is no such device or its profile is unknown.
    pub fn device_profile(&self, device: &str) -> Option<ProfileConfig> {
        self.devices
            .get(device)
            .and_then(|d| self.profile(&d.profile))
    }

    /// Whether a password is configured (inline or in a file).
    pub fn has_password(&self) -> bool {
        !self.server.requirepass.is_empty() || !self.server.password_file.as_os_str().is_empty()
    }

    /// A copy safe to print: a set `server.requirepass` becomes
    /// [`REDACTED`] (the password file's path is not secret and stays).
    pub fn redacted(&self) -> Config {
        let mut c = self.clone();
        if !c.server.requirepass.is_empty() {
            c.server.requirepass = REDACTED.to_string();
        }
        c
    }

    /// The effective configuration as TOML (every field, defaults included),
    /// e.g. for `ringkv-server --print-config`. Loading the text back with
    /// [`Config::from_toml_str`] gives an equal `Config`.
    pub fn to_toml_string(&self) -> String {
        // Every field is a string, integer, boolean or table keyed by strings,
        // so serialization cannot fail; if it does, the schema itself is broken.
        toml::to_string(self).expect("Config always serializes to TOML")
    }
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
            requirepass: String::new(),
            password_file: PathBuf::new(),
            dangerously_listen_without_password: false,
            handshake_timeout: Duration::from_secs(10),
            auth_failure_delay: Duration::from_millis(200),
            tls_native: false,
            tls_metrics: false,
            tls_cert_file: PathBuf::new(),
            tls_key_file: PathBuf::new(),
            tls_client_ca_file: PathBuf::new(),
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
            // 2 MiB, not 1 MiB: one max-size record (1 MiB value + 1 KiB key +
            // header) must fit one flush.
            group_commit_max_bytes: ByteSize::mib(2),
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

/// The `unthrottled` profile: no limits.
impl Default for ProfileConfig {
    fn default() -> Self {
        ProfileConfig::unthrottled()
    }
}
