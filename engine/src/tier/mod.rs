//! Storage tiers: where a shard keeps its keys and values. A tier is owned
//! by one shard thread and is never shared; it sees operations in LSN order
//! and holds exactly the state the WAL describes up to the last applied LSN.
//!
//! The [`Tier`] trait is the seam for the planned hybrid RAM+disk tier
//! (FASTER / Aerospike style). What that tier will need from this seam,
//! and why the trait looks the way it does:
//! - **Async reads of cold values.** `get` is synchronous today because the
//!   memory tier answers from RAM. The hybrid tier keeps a compact in-RAM
//!   index (target: at most ~12 bytes per key: a tag of the key hash plus a
//!   segment address, with collisions resolved by reading the key from
//!   disk) and must fetch cold values from value segments through io_uring.
//!   It will add `fn get_cold(&self, ..) -> impl Future` (or turn `get` into
//!   a two-step "hit or address" lookup) so the shard can keep serving other
//!   requests while a read is in flight.
//! - **Writes that append.** A put will append the value to the active value
//!   segment and update the index; the WAL record stays the durability point,
//!   so the value segments need no fsync of their own before an ack.
//! - **Compaction and snapshots by partition.** Entries are split into
//!   [`Tier::partition_count`] partitions by hash bits the shard router does
//!   not use. Checkpoints copy one partition at a time (so the shard never
//!   stops for a whole-dataset copy); compaction will also work per partition.
//! - **Memory accounting** ([`Tier::memory_bytes`]) so metrics and limits see
//!   what the process really uses.

pub mod memory;

pub use memory::MemoryTier;

use bytes::Bytes;

/// The interface a shard uses to keep its key-value state.
///
/// `hash` is always the routing hash of `key` ([`crate::hash::fnv1a64`]);
/// the shard computes it once per operation and passes it down.
pub trait Tier {
    /// The value of `key`, copied out.
    fn get(&self, hash: u64, key: &[u8]) -> Option<Bytes>;
    /// Whether `key` is present.
    fn contains(&self, hash: u64, key: &[u8]) -> bool;
    /// Sets `key` to `value`; returns true if the key was new.
    fn put(&mut self, hash: u64, key: &[u8], value: &[u8]) -> bool;
    /// Removes `key`; returns true if it existed.
    fn delete(&mut self, hash: u64, key: &[u8]) -> bool;
    /// Number of keys.
    fn len(&self) -> u64;
    /// Whether there are no keys.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Bytes of memory the tier holds (entries plus index), without the
    /// allocator's own per-allocation overhead.
    fn memory_bytes(&self) -> u64;
    /// How many partitions [`Tier::visit_partition`] accepts.
    fn partition_count(&self) -> usize;
    /// Calls `f(key, value)` for every entry of partition `partition`.
    fn visit_partition(&self, partition: usize, f: &mut dyn FnMut(&[u8], &[u8]));
}
