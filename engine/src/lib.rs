//! ringkv's storage engine.
//!
//! Thread-per-core and shared-nothing: each shard is an OS thread pinned to
//! a core, running its own compio (io_uring) runtime, owning its slice of the
//! keyspace, its own write-ahead log and its own storage tier.
//!
//! Start with [`Engine::open`] and [`Handle::batch`]. The on-disk formats
//! and the durability rules are described in `docs/wal.md`.
//!
//! Layers, bottom up (`docs/architecture.md`, "Layers"): `io` and the
//! small helpers; `tier`, `metrics`, `notify`; `txn` (record format, locks,
//! marks, recovery replay); `snapshot`; `wal`; `shard`; then `engine`
//! (`Engine`, `Handle`) and `coordinator` (`Txn`). No module imports one
//! above it; `scripts/check-engine-layers.sh` fails on any import circle.

#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod api;
pub mod clock;
pub mod io;
mod keyspace;

mod coordinator;
mod engine;
pub mod error;
pub mod hash;
pub mod histogram;
pub mod inspect;
pub mod layout;
pub mod manifest;
pub mod metrics;
mod notify;
pub mod rng;
mod shard;
pub mod snapshot;
pub mod tier;
pub mod txn;
pub mod wal;

pub use api::{
    Current, Op, OpError, OpResult, TtlUpdate, TtlUpdateFn, Update, UpdateAnswer, UpdateFn,
    UpdateOutcome, UpdateWrite,
};
pub use coordinator::Txn;
pub use engine::{Engine, Handle};
pub use error::{Damage, EngineError, ManifestError, SnapshotError, WalError};
pub use histogram::{AtomicHistogram, HistogramSnapshot};
pub use io::runtime::BackendKind;
pub use keyspace::{PartitionKeys, PARTITIONS_PER_SHARD};
pub use metrics::{DeviceMetrics, EngineMetrics, ShardMetrics, TxnStats};
pub use tunables::Durability;
pub use txn::watch::KeyMark;
pub use txn::{AbortReason, TxnError, TxnSettings};
