//! Will a sweep size fit? The RAM and disk arithmetic done before anything
//! runs, so a size that cannot fit fails at once with the numbers instead
//! of after an hour of writing.
//!
//! The model (the memory tier keeps every key and value in RAM; see
//! engine/src/tier/memory.rs and docs/wal.md):
//! - RAM per item: one heap block `[8-byte header][key][value]`, which the
//!   allocator rounds to a 16-byte chunk with 8 bytes of its own (at least
//!   32), plus the hash-table slot: 8-byte pointer, 8-byte cached hash and 1
//!   control byte at a load factor that can be as low as 7/16 right after a
//!   table grows (39 bytes).
//! - Disk per item (durabilities that log): the WAL record (a 32-byte header
//!   plus key and value), counted twice because a checkpoint writes a new snapshot
//!   while the previous one and the log still exist; plus per shard the WAL
//!   kept between checkpoints and two spare segments.
//!
//! What must hold: the estimate never under-counts the model above; a refusal
//! names the size, what it needs, what is available, and the largest
//! `--sweep-max` that would fit.

use crate::cli::format_count;
use std::path::Path;

/// Hash-table bytes per item at the lowest load factor (17 bytes / (7/16),
/// rounded up).
const TABLE_BYTES_PER_ITEM: u64 = 39;
/// WAL record header (engine/src/wal/format.rs `RECORD_HEADER_BYTES`).
const WAL_RECORD_HEADER_BYTES: u64 = 32;

/// The allocator's chunk for a request of `bytes` (glibc: +8, 16-aligned, ≥ 32).
fn malloc_chunk(bytes: u64) -> u64 {
    (bytes + 8).div_ceil(16).max(2) * 16
}

/// Estimated RAM and disk of `items` items of (key, value) bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Need {
    /// The sweep size this is for (what messages name).
    pub size: u64,
    /// Items stored: the size plus the warm-up's writes.
    pub items: u64,
    pub ram_bytes: u64,
    pub disk_bytes: u64,
}

/// Per-shard disk the engine holds besides the items: the WAL allowed
/// between checkpoints and two prepared segments.
pub fn per_shard_disk_bytes(config: &tunables::Config) -> u64 {
    config.storage.checkpoint_wal_bytes.0 + 2 * config.storage.wal_segment_size.0
}

/// What sweep size `size` (`items` items stored, warm-up included) of
/// `key_bytes` + `value_bytes` needs in the memory tier.
pub fn need(
    size: u64,
    items: u64,
    key_bytes: u64,
    value_bytes: u64,
    logs: bool,
    shards: u64,
    shard_disk_bytes: u64,
) -> Need {
    let ram_per_item = malloc_chunk(8 + key_bytes + value_bytes) + TABLE_BYTES_PER_ITEM;
    let disk_per_item = 2 * (WAL_RECORD_HEADER_BYTES + key_bytes + value_bytes);
    Need {
        size,
        items,
        ram_bytes: items.saturating_mul(ram_per_item),
        disk_bytes: if logs {
            items
                .saturating_mul(disk_per_item)
                .saturating_add(shards.saturating_mul(shard_disk_bytes))
        } else {
            0
        },
    }
}

/// What the hybrid tier needs for the same items: RAM for the index (6
/// bytes a slot at 85% load, counted as 8 per item) plus the whole read
/// cache; disk for the WAL record, the segment record (16-byte aligned,
/// counted twice: GC lets garbage reach half of the segments at the
/// default `gc_garbage_percent`), and two index checkpoints.
pub fn need_hybrid(
    size: u64,
    items: u64,
    key_bytes: u64,
    value_bytes: u64,
    cache_bytes: u64,
    shards: u64,
    shard_disk_bytes: u64,
) -> Need {
    let record = (8 + key_bytes + value_bytes).div_ceil(16) * 16;
    let disk_per_item = WAL_RECORD_HEADER_BYTES + key_bytes + value_bytes + 2 * record + 2 * 8;
    Need {
        size,
        items,
        ram_bytes: items.saturating_mul(8).saturating_add(cache_bytes),
        disk_bytes: items
            .saturating_mul(disk_per_item)
            .saturating_add(shards.saturating_mul(shard_disk_bytes)),
    }
}

/// Bytes of RAM the kernel says are available (`MemAvailable`).
pub fn available_ram_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Bytes available to an unprivileged user on the file system of `dir`.
pub fn available_disk_bytes(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: `statvfs` is plain old data; all-zero is a valid value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is a NUL-terminated string that outlives the call and
    // `st` is a valid, writable statvfs.
    let rc = unsafe { libc::statvfs(path.as_ptr(), &mut st) };
    (rc == 0).then(|| st.f_bavail.saturating_mul(st.f_frsize))
}

fn gb(bytes: u64) -> String {
    format!("{:.1} GB", bytes as f64 / 1e9)
}

/// Checks every size against what is available; `Err` explains each size
/// that does not fit. `ram`/`disk` are the available bytes (None = unknown,
/// not checked).
pub fn check(needs: &[Need], ram: Option<u64>, disk: Option<u64>) -> Result<(), String> {
    let mut problems = Vec::new();
    let mut largest_fit = None;
    for n in needs {
        let mut why = Vec::new();
        if let Some(ram) = ram {
            if n.ram_bytes > ram {
                why.push(format!(
                    "RAM {} needed ({} B per item) vs {} available",
                    gb(n.ram_bytes),
                    n.ram_bytes / n.items.max(1),
                    gb(ram)
                ));
            }
        }
        if let Some(disk) = disk {
            if n.disk_bytes > disk {
                why.push(format!(
                    "disk {} needed (WAL, segments and checkpoints) vs {} available",
                    gb(n.disk_bytes),
                    gb(disk)
                ));
            }
        }
        if why.is_empty() {
            largest_fit = Some(n.size);
        } else {
            problems.push(format!("N = {}: {}", format_count(n.size), why.join("; ")));
        }
    }
    if problems.is_empty() {
        return Ok(());
    }
    let hint = match largest_fit {
        Some(n) => format!(
            "; the largest size that fits is {} (--sweep-max {})",
            format_count(n),
            format_count(n)
        ),
        None => String::new(),
    };
    Err(format!(
        "sweep sizes that cannot fit this machine (the memory tier keeps every item in RAM; the hybrid tier needs ~8 B of RAM per item plus its cache):\n  {}{hint}",
        problems.join("\n  ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn document_item_arithmetic() {
        // 8 + 8 + 32 = 48 B block -> 64 B chunk, + 39 B of table = 103 B.
        let n = need(50_000_000, 50_000_000, 8, 32, true, 2, 384 << 20);
        assert_eq!(n.ram_bytes, 50_000_000 * 103);
        assert_eq!(n.disk_bytes, 50_000_000 * 2 * 72 + 2 * (384 << 20));
        assert_eq!(need(10, 10, 8, 32, false, 2, 1 << 30).disk_bytes, 0);
        assert_eq!(malloc_chunk(1), 32);
        assert_eq!(malloc_chunk(1000), 1008);
    }

    #[test]
    fn two_billion_items_are_refused_with_the_numbers() {
        let needs: Vec<Need> = [50_000_000u64, 2_000_000_000]
            .iter()
            .map(|&n| need(n, n, 8, 32, true, 2, 384 << 20))
            .collect();
        let ram = 24_000_000_000;
        let disk = 60_000_000_000;
        let err = check(&needs, Some(ram), Some(disk)).unwrap_err();
        assert!(err.contains("N = 2G"), "{err}");
        assert!(err.contains("RAM 206.0 GB needed"), "{err}");
        assert!(err.contains("vs 24.0 GB available"), "{err}");
        assert!(err.contains("disk 288.8 GB needed"), "{err}");
        assert!(err.contains("--sweep-max 50M"), "{err}");
        assert!(!err.contains("N = 50M"), "{err}");
        assert!(check(&needs[..1], Some(ram), Some(disk)).is_ok());
        assert!(check(&needs, None, None).is_ok(), "unknown = not checked");
    }

    #[test]
    fn the_hybrid_tier_needs_a_few_bytes_of_ram_per_item() {
        // The seed's 2G items of 8 + 32 bytes: 16 GB of index + the cache.
        let n = need_hybrid(2_000_000_000, 2_000_000_000, 8, 32, 1 << 30, 2, 384 << 20);
        assert_eq!(n.ram_bytes, 2_000_000_000 * 8 + (1 << 30));
        // WAL 72 + 2 x 48 of segments + 16 of checkpoints = 184 B per item.
        assert_eq!(n.disk_bytes, 2_000_000_000 * 184 + 2 * (384 << 20));
        let err = check(&[n], Some(24_000_000_000), Some(60_000_000_000)).unwrap_err();
        assert!(err.contains("disk 368.8 GB needed"), "{err}");
        assert!(!err.contains("B per item) vs"), "no RAM problem: {err}");
    }

    #[test]
    fn this_machine_reports_something() {
        assert!(available_ram_bytes().is_some_and(|b| b > 0));
        assert!(available_disk_bytes(&std::env::temp_dir()).is_some_and(|b| b > 0));
    }
}
