//! Shards: one OS thread per core, each running its own compio runtime and
//! owning its keys, WAL and tier. `router` holds the cross-thread plumbing,
//! `core` the apply path, `durable` the WAL's durability bookkeeping (LSNs,
//! answers waiting for durability, poisoning), `thread` the thread's life
//! (recovery, tasks, shutdown), `checkpoint` the snapshots, `notify` the
//! wake-ups between a shard's tasks.

pub mod checkpoint;
pub mod core;
pub(crate) mod durable;
pub mod expiry;
pub mod gc;
pub mod notify;
pub mod router;
pub mod thread;
