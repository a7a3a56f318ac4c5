//! Shards: one OS thread per core, each running its own compio runtime and
//! owning its keys, WAL and tier. `router` holds the cross-thread plumbing,
//! `core` the apply path (tier + WAL, see `crate::wal::durable` for the
//! WAL's bookkeeping), `thread` the thread's life (recovery, tasks,
//! shutdown), `checkpoint` the snapshots, `gc` and `expiry` the tier's
//! background work, `txn` the shard's side of transactions (lock table in
//! use, logging and applying parts).
//!
//! Shards sit above `wal`, `snapshot` and `txn` and import them; none of
//! those imports a shard. The transaction coordinator (`crate::coordinator`)
//! and the engine handle sit above the shards.

pub(crate) mod backup;
pub mod checkpoint;
pub mod core;
pub mod expiry;
pub mod gc;
pub mod router;
pub mod thread;
pub(crate) mod txn;
