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

#![cfg_attr(not(test), deny(clippy::unwrap_used))]

#[cfg(feature = "clap")]
mod cli_values;
mod cpus;
mod error;
mod load;
mod profiles;
mod schema;
mod suggest;
mod units;
mod validate;

pub use cpus::{CpuPlacement, CPU_MAX};
pub use error::{ConfigError, ConfigErrors};
pub use profiles::{builtin_profile, builtin_profile_names, BURST_WINDOW_SECS};
pub use schema::{
    docs_sections, docs_table, example_toml, DeviceConfig, FieldInfo, IoConfig, LimitsConfig,
    LogConfig, ProfileConfig, ServerConfig, StorageConfig, UserConfig, SHARDS_MAX,
};
pub use units::{ByteSize, Duration, UnitError, DURATION_UNITS, SIZE_UNITS};
pub use validate::{
    is_loopback, unprotected_listeners, FRAME_OVERHEAD_BYTES_MAX, PAGE_SIZE_BYTES,
    PASSWORD_BYTES_MAX, WAL_FLUSH_OVERHEAD_BYTES_MAX,
};

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
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
    pub log: LogConfig,
    /// Named devices that storage parts are placed on (`wal`, ...). Names are
    /// 1..=64 characters of `A-Za-z0-9_-`. Default: one device `wal` on the
    /// `unthrottled` profile in the data directory.
    pub devices: BTreeMap<String, DeviceConfig>,
    /// User-defined disk profiles, in addition to the built-in ones. A user
    /// profile named like a built-in one replaces it. Default: none.
    pub profiles: BTreeMap<String, ProfileConfig>,
    /// Named users (`[users.NAME]`), each with a password file and a role,
    /// besides the `default` user. Names follow the device name rules and
    /// are not `default`. Default: none.
    pub users: BTreeMap<String, UserConfig>,
}

/// How the server writes its log lines (`log.format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// One human-readable line per event.
    Text,
    /// One JSON object per line (for journald, Loki, jq).
    Json,
}

/// The roles a user can have, least to most able (`docs/security.md`).
pub const ROLE_NAMES: [&str; 3] = ["read-only", "read-write", "admin"];

/// The name of the user that `server.requirepass` / `server.password_file`
/// authenticate (and that a client without a user name is).
pub const DEFAULT_USER: &str = "default";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    /// Every key and value in RAM; persistence through the WAL and snapshots.
    Memory,
    /// A compact index in RAM; values in append-only segment files on the
    /// `value_device`, the hot ones cached in RAM.
    Hybrid,
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

named_enum!(Tier, "tier", Memory => "memory", Hybrid => "hybrid");
named_enum!(Durability, "durability mode", Sync => "sync", Async => "async", None => "none");
named_enum!(Backend, "I/O backend", Auto => "auto", Uring => "uring", Fallback => "fallback");
named_enum!(LogFormat, "log format", Text => "text", Json => "json");

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
            log: LogConfig::default(),
            devices,
            profiles: BTreeMap::new(),
            users: BTreeMap::new(),
        }
    }
}
