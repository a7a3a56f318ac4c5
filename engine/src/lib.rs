//! ringkv's storage engine.
//!
//! Thread-per-core and shared-nothing: each shard is an OS thread pinned to
//! a core, running its own compio (io_uring) runtime, owning its slice of the
//! keyspace, its own write-ahead log and its own storage tier.
//!
//! A program that links the engine and calls it from one thread starts
//! with [`Db::open`] (`docs/embedding.md`); a server, or a program with a
//! runtime and many threads, with [`Engine::open`] and [`Handle::batch`]. The on-disk formats
//! and the durability rules are described in `docs/wal.md`.
//!
//! Layers, bottom up (`docs/architecture.md`, "Layers"): `io` and the
//! small helpers; `tier`, `metrics`, `notify`; `txn` (record format, locks,
//! marks, recovery replay); `snapshot`; `wal`; `shard`; then `engine`
//! (`Engine`, `Handle`) and `coordinator` (`Txn`). No module imports one
//! above it; `scripts/check-engine-layers.sh` fails on any import circle.

#![cfg_attr(not(test), deny(clippy::unwrap_used))]

// The public API: the engine and its handle, operations and their
// answers, transactions, errors, metrics, the disk seam (`io`: a custom or
// simulated disk for `Engine::open_with_disk`) and the routing hash
// (`hash`: which shard owns a key is part of the on-disk contract).
pub mod api;
pub mod backup;
pub mod clock;
pub mod error;
pub mod hash;
pub mod histogram;
pub mod inspect;
pub mod io;
pub mod lockfile;
pub mod metrics;
pub mod rng;

mod call_watch;
mod coordinator;
mod db;
mod engine;
mod identity;
mod keyspace;
mod notify;
mod progress;
mod request_watch;
mod shard;

/// The engine's internals: public only with the `internals` feature (the
/// engine's own tests and benches, which check formats and recovery cases
/// piece by piece), crate-private otherwise. Nothing outside the engine's
/// own test code may rely on them.
///
/// Built without the feature, an item of theirs that only tests and
/// benches call is dead code. `tier` and `wal` still hold such items, so
/// they alone keep `dead_code` allowed in that build; for the other
/// modules the lint fires as for any module. For all of them
/// `scripts/check-engine-dead-code.sh` (run by CI) lists what the lint
/// finds with the allow overridden and fails on any item not known to be
/// used by tests or benches.
macro_rules! internal_modules {
    ($($name:ident),* $(,)?) => {
        $(
            #[cfg(feature = "internals")]
            pub mod $name;
            #[cfg(not(feature = "internals"))]
            pub(crate) mod $name;
        )*
    };
    (test_only_items: $($name:ident),* $(,)?) => {
        $(
            #[cfg(feature = "internals")]
            pub mod $name;
            #[cfg(not(feature = "internals"))]
            #[allow(dead_code)]
            pub(crate) mod $name;
        )*
    };
}

internal_modules!(layout, manifest, mesh, snapshot, txn);
internal_modules!(test_only_items: tier, wal);

pub use api::{
    Current, Op, OpError, OpResult, TtlUpdate, TtlUpdateFn, Update, UpdateAnswer, UpdateFn,
    UpdateOutcome, UpdateWrite,
};
pub use coordinator::{RetryTicket, Txn};
pub use db::{Db, DbError, DbTxn};
pub use engine::{Engine, Handle};
pub use error::{Damage, EngineError, ManifestError, SnapshotError, WalError};
pub use histogram::{AtomicHistogram, HistogramSnapshot};
pub use io::runtime::BackendKind;
pub use keyspace::{PartitionKeys, PARTITIONS_PER_SHARD};
pub use metrics::{DeviceMetrics, EngineMetrics, ShardMetrics, TxnStats};
pub use tier::{CounterKind, HybridStats, SegmentDamage, TierCounter};
pub use tunables::Durability;
pub use txn::watch::KeyMark;
pub use txn::{AbortReason, TxnError, TxnSettings};

#[cfg(test)]
mod log_target_tests {
    /// Log lines are filtered by target (`RUST_LOG=ringkv_engine=debug`);
    /// the engine's target is its package's name, like the server's.
    #[test]
    fn log_targets_carry_the_package_name() {
        assert_eq!(module_path!().split("::").next(), Some("ringkv_engine"));
    }
}
