//! The config of the embedded kill -9 writer (`src/bin/embedded_writer.rs`)
//! and its test (`tests/embedded_kill9.rs`): both open the same directory,
//! so both include this one file with `#[path]`. (The values each write
//! carries are not shared: the test recomputes them on its own.)

use std::path::PathBuf;

/// `sync` durability and small WAL segments and checkpoint threshold, so a
/// short run rolls segments and checkpoints. `hybrid`: a 64 KiB read cache
/// and small value segments with an eager GC, so values live in segment
/// files and reads go to the device.
pub fn config(dir: PathBuf, hybrid: bool) -> tunables::Config {
    let mut c = tunables::Config {
        shards: 1,
        ..Default::default()
    };
    c.storage.data_dir = dir;
    c.storage.durability = tunables::Durability::Sync;
    c.storage.wal_segment_size = tunables::ByteSize::kib(128);
    c.storage.group_commit_max_bytes = tunables::ByteSize::kib(32);
    c.storage.checkpoint_wal_bytes = tunables::ByteSize::kib(256);
    c.limits.key_bytes_max = tunables::ByteSize(64);
    c.limits.value_bytes_max = tunables::ByteSize(4096);
    if hybrid {
        c.storage.tier = tunables::Tier::Hybrid;
        c.storage.value_segment_size = tunables::ByteSize::kib(128);
        c.storage.cache_bytes = tunables::ByteSize::kib(64);
        c.storage.index_keys = 4096;
        c.storage.gc_garbage_percent = 10;
    }
    c
}
