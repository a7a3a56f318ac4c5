//! What the kill -9 writer (`src/bin/crash_writer.rs`) and its test
//! (`tests/kill9.rs`) must agree on: the key space, the value each batch
//! writes to each key, and the engine config. One file, included by both
//! with `#[path]`, so the two can never drift apart.

use std::path::PathBuf;

/// Keys are `k<number>` with numbers below this.
pub const KEY_SPACE: u64 = 500;

/// The value batch `batch` writes to key number `key`.
pub fn value(key: u64, batch: u64) -> Vec<u8> {
    let mut v = format!("{key}:{batch}:").into_bytes();
    v.resize(64 + ((key * 7 + batch * 13) % 1500) as usize, b'#');
    v
}

/// The config both the writer and the test open the engine with: `sync`
/// durability and small segments, so rollover and checkpoints happen. On
/// the hybrid tier, small value segments and cache and an eager GC, so
/// values are read from segments and GC runs under the write load.
pub fn config(dir: PathBuf, shards: u32, hybrid: bool) -> tunables::Config {
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
    c
}
