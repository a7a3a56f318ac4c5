//! The embedded ringkv server: the real server library started in this
//! process on a fresh temporary data directory, a loopback port chosen by the
//! kernel, and the chosen disk profile on its WAL device.
//!
//! What must hold: every embedded server gets its own data directory, which
//! is removed when the server is stopped (runs never see each other's data);
//! the server only listens on 127.0.0.1.

use crate::cli::{DurabilityArg, TierArg};
use std::net::SocketAddr;
use tempfile::TempDir;
use tunables::{ByteSize, Config};

/// Failure to start or stop the embedded server.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EmbeddedError {
    #[error("cannot create a temporary data directory: {0}")]
    TempDir(std::io::Error),
    #[error("the configuration has no device named {device:?} for the WAL")]
    NoWalDevice { device: String },
    #[error(
        "embedded server (profile {profile}, durability {durability}, tier {tier}) did not start: {reason}"
    )]
    Start {
        profile: String,
        durability: &'static str,
        tier: &'static str,
        reason: String,
    },
    #[error("embedded server (profile {profile}) did not stop cleanly: {reason}")]
    Stop { profile: String, reason: String },
}

/// A running embedded server and the directory it owns.
pub struct EmbeddedServer {
    server: ringkv_server::RunningServer,
    addr: SocketAddr,
    profile: String,
    // Dropped (removed) after the server has stopped.
    _dir: TempDir,
}

/// The storage settings the command line gives an embedded server or
/// engine; `None` keeps the config's default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EmbeddedStorage {
    pub tier: TierArg,
    pub cache_bytes: Option<ByteSize>,
    pub index_keys: Option<u64>,
}

impl Default for EmbeddedStorage {
    fn default() -> Self {
        EmbeddedStorage {
            tier: TierArg::Memory,
            cache_bytes: None,
            index_keys: None,
        }
    }
}

/// The configuration of an embedded server: defaults, plus the data
/// directory, a loopback listener on a kernel-chosen port, the durability,
/// the shard count, the WAL device's profile and the storage tier settings.
/// The value device is the WAL device, so its profile throttles both.
pub fn embedded_config(
    data_dir: &std::path::Path,
    profile: &str,
    durability: DurabilityArg,
    shards: u32,
    storage: EmbeddedStorage,
) -> Result<Config, EmbeddedError> {
    let mut config = Config {
        shards,
        ..Config::default()
    };
    config.storage.data_dir = data_dir.to_path_buf();
    config.server.listen = "127.0.0.1:0".to_string();
    config.storage.durability = durability;
    let wal_device = config.storage.wal_device.clone();
    match config.devices.get_mut(&wal_device) {
        Some(device) => device.profile = profile.to_string(),
        None => return Err(EmbeddedError::NoWalDevice { device: wal_device }),
    }
    config.storage.value_device = wal_device;
    config.storage.tier = storage.tier;
    if let Some(bytes) = storage.cache_bytes {
        config.storage.cache_bytes = bytes;
    }
    if let Some(keys) = storage.index_keys {
        config.storage.index_keys = keys;
    }
    Ok(config)
}

impl EmbeddedServer {
    /// Starts a server (blocking: call from a blocking context).
    pub fn start(
        profile: &str,
        durability: DurabilityArg,
        shards: u32,
        storage: EmbeddedStorage,
    ) -> Result<EmbeddedServer, EmbeddedError> {
        EmbeddedServer::start_with(profile, durability, shards, storage, |_| {})
    }

    /// Starts a server whose [`embedded_config`] `edit` changes first (more
    /// devices, a hot device, a segment size); `profile` still names the
    /// WAL device's profile (blocking: call from a blocking context).
    pub fn start_with(
        profile: &str,
        durability: DurabilityArg,
        shards: u32,
        storage: EmbeddedStorage,
        edit: impl FnOnce(&mut Config),
    ) -> Result<EmbeddedServer, EmbeddedError> {
        let dir = tempfile::Builder::new()
            .prefix("loadgen-ringkv-")
            .tempdir()
            .map_err(EmbeddedError::TempDir)?;
        let mut config = embedded_config(dir.path(), profile, durability, shards, storage)?;
        edit(&mut config);
        let server = ringkv_server::start(config).map_err(|e| EmbeddedError::Start {
            profile: profile.to_string(),
            durability: durability.as_str(),
            tier: storage.tier.as_str(),
            reason: e.to_string(),
        })?;
        let addr = server.local_addr();
        Ok(EmbeddedServer {
            server,
            addr,
            profile: profile.to_string(),
            _dir: dir,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops the server and removes its data directory (blocking).
    pub fn stop(self) -> Result<(), EmbeddedError> {
        let profile = self.profile.clone();
        self.server
            .shutdown()
            .map_err(|e| EmbeddedError::Stop {
                profile,
                reason: e.to_string(),
            })
            .map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tunables::Durability;

    #[test]
    fn config_points_everything_at_the_temp_dir_and_loopback() {
        let dir = tempfile::tempdir().expect("tempdir");
        let c = embedded_config(
            dir.path(),
            "sas",
            DurabilityArg::None,
            3,
            EmbeddedStorage::default(),
        )
        .expect("config");
        assert_eq!(c.storage.data_dir, dir.path());
        assert_eq!(c.server.listen, "127.0.0.1:0");
        assert_eq!(c.storage.durability, Durability::None);
        assert_eq!(c.shards, 3);
        assert_eq!(c.devices[&c.storage.wal_device].profile, "sas");
        assert_eq!(c.storage.tier, tunables::Tier::Memory);
        assert_eq!(c.storage.value_device, c.storage.wal_device);
        // Unset storage flags keep the config's defaults.
        let defaults = tunables::StorageConfig::default();
        assert_eq!(c.storage.cache_bytes, defaults.cache_bytes);
        assert_eq!(c.storage.index_keys, defaults.index_keys);
        c.validate().expect("a valid config");
    }
}
