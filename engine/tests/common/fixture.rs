//! What the tests of the checked-in format fixtures (`fixture_v1.rs`,
//! `fixture_hybrid_v1.rs`) share: the configuration their directories
//! were written with, and a copy of a fixture to open (opening may write).

use std::path::Path;

/// The configuration every fixture was written and is opened with: one
/// shard, `sync`, 64 KiB WAL segments, a checkpoint every 64 KiB of WAL.
/// Fixed: a fixture's bytes depend on it.
pub fn fixture_config(dir: &Path) -> tunables::Config {
    let mut c = tunables::Config {
        shards: 1,
        ..Default::default()
    };
    c.storage.data_dir = dir.to_path_buf();
    c.storage.durability = tunables::Durability::Sync;
    c.storage.wal_segment_size = tunables::ByteSize::kib(64);
    c.storage.group_commit_max_bytes = tunables::ByteSize::kib(16);
    c.storage.checkpoint_wal_bytes = tunables::ByteSize::kib(64);
    c.storage.checkpoint_interval = tunables::Duration::from_secs(0);
    c.limits.key_bytes_max = tunables::ByteSize(64);
    c.limits.value_bytes_max = tunables::ByteSize(4096);
    c
}

/// Copies the directory tree `from` to `to`.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read_dir") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy");
        }
    }
}
