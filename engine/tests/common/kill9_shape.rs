//! What the kill -9 writer (`src/bin/crash_writer.rs`) and its test
//! (`tests/kill9.rs`) must agree on: the key space, the value each batch
//! writes to each key, and the engine config. One file, included by both
//! with `#[path]`, so the two can never drift apart. The embedded writer
//! (`src/bin/embedded_writer.rs`) and its test (`tests/embedded_kill9.rs`)
//! open their directory with the same config.

use std::path::PathBuf;

/// Keys are `k<number>` with numbers below this.
pub const KEY_SPACE: u64 = 500;

/// The value batch `batch` writes to key number `key`.
pub fn value(key: u64, batch: u64) -> Vec<u8> {
    let mut v = format!("{key}:{batch}:").into_bytes();
    v.resize(64 + ((key * 7 + batch * 13) % 1500) as usize, b'#');
    v
}

/// Which tier the writer runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    Memory,
    Hybrid,
    /// The hybrid tier with a hot device of four value segments per shard
    /// in front of the value device (both in the data directory).
    HotDevice,
}

impl Shape {
    pub fn name(self) -> &'static str {
        match self {
            Shape::Memory => "memory",
            Shape::Hybrid => "hybrid",
            Shape::HotDevice => "hot-device",
        }
    }

    /// The shape named `s` (the writer's `--tier`; the test only names).
    #[allow(dead_code)]
    pub fn parse(s: &str) -> Option<Shape> {
        [Shape::Memory, Shape::Hybrid, Shape::HotDevice]
            .into_iter()
            .find(|t| t.name() == s)
    }
}

/// The config both the writer and the test open the engine with: `sync`
/// durability and small segments, so rollover and checkpoints happen. On
/// the hybrid tier, small value segments and cache and an eager GC, so
/// values are read from segments and GC runs under the write load; with a
/// hot device, one small enough that GC moves records off it.
pub fn config(dir: PathBuf, shards: u32, shape: Shape) -> tunables::Config {
    let hybrid = shape != Shape::Memory;
    let mut c = tunables::Config {
        shards,
        ..Default::default()
    };
    c.storage.data_dir = dir;
    c.storage.durability = tunables::Durability::Sync;
    c.storage.wal_segment_size = tunables::ByteSize::kib(256);
    c.storage.group_commit_max_bytes = tunables::ByteSize::kib(64);
    c.storage.checkpoint_wal_bytes = tunables::ByteSize::kib(512);
    c.limits.key_bytes_max = tunables::ByteSize(64);
    c.limits.value_bytes_max = tunables::ByteSize(4096);
    if hybrid {
        c.storage.tier = tunables::Tier::Hybrid;
        c.storage.value_segment_size = tunables::ByteSize::kib(256);
        c.storage.cache_bytes = tunables::ByteSize::kib(64);
        c.storage.index_keys = 4096;
        c.storage.gc_garbage_percent = 10;
    }
    if shape == Shape::HotDevice {
        // The default device: the data directory, unthrottled.
        c.devices.insert("hot".to_string(), Default::default());
        c.storage.hot_device = "hot".to_string();
        c.storage.hot_bytes = tunables::ByteSize::kib(4 * 256 * u64::from(shards));
    }
    c
}
