//! How the storage settings become each shard's tier, in one place: the
//! engine reads `storage.*` into a [`TierPlan`] before any shard starts
//! (which devices the tier uses, whether it keeps files of its own),
//! turns it into the [`TierSettings`] every shard thread gets once the
//! shard count is known, and each shard makes its [`TierConfig`] from
//! those with its own folders and disks. Neither the engine nor the shard
//! thread copies a tier setting or asks which tier runs.

use super::{HotSettings, HybridSettings, TierConfig};
use crate::error::EngineError;
use crate::histogram::AtomicHistogram;
use crate::io::Disk;
use crate::layout::{DirId, ShardPaths};
use std::path::PathBuf;
use std::sync::Arc;
use tunables::{StorageConfig, Tier};

fn config_err(reason: impl Into<String>) -> EngineError {
    EngineError::Config {
        reason: reason.into(),
    }
}

/// The tier the storage settings ask for, checked against the largest
/// record, before the shard count is known.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TierPlan<'a> {
    storage: &'a StorageConfig,
}

impl<'a> TierPlan<'a> {
    /// Reads `storage.tier` and checks the tier's settings that do not
    /// depend on the shard count: on the hybrid tier, the largest record
    /// (`key_max` + `value_max` bytes) must fit one value segment.
    pub(crate) fn new(
        storage: &'a StorageConfig,
        key_max: usize,
        value_max: usize,
    ) -> Result<TierPlan<'a>, EngineError> {
        if storage.tier == Tier::Hybrid {
            let segment_bytes = storage.value_segment_size.as_u64();
            let needed = super::hybrid::log::segment_bytes_needed(key_max, value_max);
            if segment_bytes < needed {
                return Err(config_err(format!(
                    "storage.value_segment_size = {segment_bytes} bytes cannot hold a record of the largest key and value (limits.key_bytes_max + limits.value_bytes_max = {} bytes); it needs at least {needed} bytes",
                    key_max + value_max
                )));
            }
        }
        Ok(TierPlan { storage })
    }

    /// Whether the tier keeps files of its own (value segments) on
    /// `storage.value_device`, beside the WAL and the snapshots.
    pub(crate) fn keeps_files(&self) -> bool {
        self.storage.tier == Tier::Hybrid
    }

    /// Whether every value is in RAM (the memory tier).
    pub(crate) fn values_in_ram(&self) -> bool {
        self.storage.tier == Tier::Memory
    }

    /// The folders of a shard the tier keeps its files in.
    pub(crate) fn dirs(&self) -> TierDirs {
        TierDirs {
            values: self.keeps_files(),
        }
    }

    /// The hot device the tier puts in front of the value device
    /// (`storage.hot_device`), if it uses one.
    pub(crate) fn hot_device(&self) -> Option<&'a str> {
        let name = self.storage.hot_device.as_str();
        (self.keeps_files() && !name.is_empty()).then_some(name)
    }

    /// What each of `shard_count` shards builds its tier from: its part of
    /// the server-wide budgets. A part of `storage.hot_bytes` under four
    /// value segments is refused (eviction keeps two segments free, and
    /// needs a sealed one to empty), except 0, which empties the hot
    /// device.
    pub(crate) fn shard_settings(&self, shard_count: usize) -> Result<TierSettings, EngineError> {
        let s = self.storage;
        if s.tier == Tier::Memory {
            return Ok(TierSettings::Memory);
        }
        let shards = (shard_count as u64).max(1);
        let hot_bytes = if self.hot_device().is_some() {
            let per_shard = s.hot_bytes.as_u64() / shards;
            let least = 4 * s.value_segment_size.as_u64();
            if per_shard != 0 && per_shard < least {
                return Err(config_err(format!(
                    "storage.hot_bytes = \"{}\" gives each of the {shard_count} shards {per_shard} bytes of the hot device; each needs at least four storage.value_segment_size ({least} bytes), or 0 to empty the hot device",
                    s.hot_bytes
                )));
            }
            per_shard
        } else {
            0
        };
        let (cache_bytes, index_keys) = per_shard_budgets(s, shard_count);
        Ok(TierSettings::Hybrid(HybridShare {
            cache_bytes,
            segment_bytes: s.value_segment_size.as_u64(),
            index_keys,
            gc_garbage_percent: s.gc_garbage_percent,
            hot_bytes,
            hot_promote_reads: s.hot_promote_reads.min(15) as u8,
        }))
    }
}

/// One shard's part of the server-wide hybrid-tier budgets, as
/// (`cache_bytes`, `index_keys`): split evenly, the cache rounded down (the
/// shards together stay within `storage.cache_bytes`), the index rounded up
/// (together they are sized for at least `storage.index_keys`).
pub(crate) fn per_shard_budgets(s: &StorageConfig, shard_count: usize) -> (u64, u64) {
    let shards = (shard_count as u64).max(1);
    (
        s.cache_bytes.as_u64() / shards,
        s.index_keys.div_ceil(shards),
    )
}

/// The folders inside a shard's folder where its tier keeps files of its
/// own: made with the shard's other folders, and in every backup of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TierDirs {
    /// The value segments' folder (`ShardPaths::values_dir`).
    values: bool,
}

impl TierDirs {
    /// The tier's folders of the shard at `paths`.
    pub(crate) fn of(self, paths: &ShardPaths) -> impl Iterator<Item = &PathBuf> {
        self.values.then_some(&paths.values_dir).into_iter()
    }
}

/// What every shard builds its tier from (the same for all shards).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TierSettings {
    Memory,
    Hybrid(HybridShare),
}

/// One shard's hybrid tier settings: its part of the server-wide budgets
/// and the settings every shard shares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HybridShare {
    /// This shard's part of `storage.cache_bytes` (the total divided by
    /// the shard count, rounded down).
    cache_bytes: u64,
    /// `storage.value_segment_size`, a multiple of 4096.
    segment_bytes: u64,
    /// This shard's part of `storage.index_keys` (the total divided by the
    /// shard count, rounded up).
    index_keys: u64,
    /// `storage.gc_garbage_percent`, 5..=95.
    gc_garbage_percent: u32,
    /// With a hot device: this shard's part of `storage.hot_bytes`.
    hot_bytes: u64,
    /// `storage.hot_promote_reads`, 1..=15.
    hot_promote_reads: u8,
}

/// What a shard gives [`TierSettings::config`]: its number, folders and
/// disks, and where its tier reports to.
pub(crate) struct ShardTier<'a, D: Disk> {
    pub(crate) shard: usize,
    pub(crate) paths: &'a ShardPaths,
    /// The value device's disk (`None` without a WAL).
    pub(crate) value_disk: Option<D>,
    /// The hot device's disk, if `storage.hot_device` is set.
    pub(crate) hot_disk: Option<D>,
    /// Where device read latencies go (µs).
    pub(crate) read_latency_us: Arc<AtomicHistogram>,
    /// The data directory's identity.
    pub(crate) dir_id: DirId,
}

impl TierSettings {
    /// How shard `at.shard` builds its tier, with what the tier needs on
    /// disk made.
    pub(crate) fn config<D: Disk>(
        &self,
        at: ShardTier<'_, D>,
    ) -> Result<TierConfig<D>, EngineError> {
        let ShardTier {
            shard,
            paths,
            value_disk,
            hot_disk,
            read_latency_us,
            dir_id,
        } = at;
        let (share, disk) = match (self, value_disk) {
            (TierSettings::Memory, _) => return Ok(TierConfig::Memory),
            (TierSettings::Hybrid(share), Some(disk)) => (share, disk),
            (TierSettings::Hybrid(_), None) => {
                return Err(config_err(
                    "storage.tier = \"hybrid\" needs a value device (and a WAL)",
                ))
            }
        };
        let hot_disk = hot_disk.filter(|_| paths.hot_values_dir.is_some());
        // Segments on a hot device this start does not know of: their
        // checkpoints could not be loaded (and would be set aside as damaged).
        if hot_disk.is_none() {
            let marker = paths.values_dir.join(super::hybrid::log::HOT_MARKER);
            if disk.exists(&marker) {
                return Err(config_err(format!(
                    "{} says value segments of shard {shard} are on a hot device, and storage.hot_device is not set: set it (and its [devices] entry) as before; to stop using the hot device, start with it and storage.hot_bytes = \"0B\" until STATS tier.hot_segments is 0",
                    marker.display()
                )));
            }
        }
        let config = TierConfig::Hybrid {
            disk,
            hot_disk,
            settings: HybridSettings {
                shard: shard as u32,
                dir: paths.values_dir.clone(),
                segment_bytes: share.segment_bytes,
                index_keys: share.index_keys,
                cache_bytes: share.cache_bytes,
                gc_garbage_percent: share.gc_garbage_percent,
                read_latency_us,
                hot: paths.hot_values_dir.clone().map(|dir| HotSettings {
                    dir,
                    bytes: share.hot_bytes,
                    promote_reads: share.hot_promote_reads,
                }),
            },
            dir_id,
        };
        config.prepare().map_err(|source| EngineError::Io {
            op: "create the value segment directory",
            path: paths.values_dir.clone(),
            source,
        })?;
        Ok(config)
    }
}
