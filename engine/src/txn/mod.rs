//! Transactions, the parts every layer shares (strict two-phase locking,
//! wait-die, atomic multi-shard commit; the design, the isolation levels
//! and the recovery rule are in `docs/transactions.md`).
//!
//! This folder sits below the WAL and the shards and imports neither:
//! - `record`: the `TxnPart` WAL record a participant logs at commit, and
//!   the applied multi-shard parts a shard must keep (`record::HeldPart`);
//! - `locks`: one shard's lock table (wait-die);
//! - `watch`: the write marks WATCH compares;
//! - `recovery`: replaying parts found in the WAL, and the exchange that
//!   lets the shards agree which multi-shard transactions are complete;
//! - here: the error and settings types.
//!
//! The two halves that need the shards live above them: the shard's side
//! (its lock table in use, handling transaction messages, logging and
//! applying parts) is `crate::shard::txn`, and the coordinator a caller
//! holds ([`Txn`](crate::Txn)) is `crate::coordinator`. The counters are
//! [`TxnStats`](crate::metrics::TxnStats) in `crate::metrics`.
//!
//! What must hold: every lock a `Txn` takes is released exactly once (on
//! commit, rollback, abort or drop), except the locks of a multi-shard
//! commit that failed with its outcome undecided, which its participants
//! keep until the restart decides it; nobody sees a multi-shard
//! transaction's writes before every part is durable; a failed commit is
//! answered as failed, never as done.

pub mod locks;
pub mod record;
pub(crate) mod recovery;
pub mod watch;

use crate::api::OpError;
use std::time::Duration;

/// Why a transaction operation failed. After `Die`, `LockTimeout` and
/// `Aborted` the transaction holds no locks and only rollback is left.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TxnError {
    /// Wait-die: an older transaction holds a key this one asked for; this
    /// one was aborted (retry it).
    #[error("aborted by wait-die: an older transaction holds the key (retry the transaction)")]
    Die,
    /// The lock was not granted within the lock-wait timeout; aborted.
    #[error(
        "aborted: the lock was not granted within the lock-wait timeout (retry the transaction)"
    )]
    LockTimeout,
    /// The transaction was aborted earlier (wait-die, lock timeout, idle
    /// timeout); only rollback or commit (which answers this) are left.
    #[error("the transaction was aborted earlier ({reason}); roll back and retry")]
    Aborted { reason: AbortReason },
    /// Taking this lock would pass the per-transaction lock limit.
    #[error("a transaction may lock at most {max} keys")]
    TooManyLocks { max: usize },
    /// The writes of this transaction on one shard do not fit one WAL record.
    #[error("the transaction's writes on shard {shard} take {bytes} bytes, over the {max} one record may hold")]
    TooLarge {
        shard: usize,
        bytes: usize,
        max: usize,
    },
    /// A key broke a limit, or the engine refused the work.
    #[error(transparent)]
    Op(#[from] OpError),
    /// The shard is poisoned: the commit's outcome is unknown until restart
    /// (recovery applies all of it or none of it). Until then nobody reads
    /// its writes, and the keys of a multi-shard commit that may still be
    /// applied stay locked (docs/transactions.md, "A failed commit").
    #[error(
        "shard {shard} is poisoned; the commit's outcome is decided at restart (all or nothing)"
    )]
    Poisoned { shard: usize },
}

/// Why a transaction was aborted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AbortReason {
    Die,
    LockTimeout,
    /// No operation within the idle-transaction timeout.
    Idle,
}

impl std::fmt::Display for AbortReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            AbortReason::Die => "wait-die",
            AbortReason::LockTimeout => "lock-wait timeout",
            AbortReason::Idle => "idle timeout",
        })
    }
}

/// Limits of one transaction.
#[derive(Debug, Clone, Copy)]
pub struct TxnSettings {
    /// Longest wait for one lock before the transaction aborts.
    pub lock_wait_max: Duration,
    /// Most keys one transaction may lock.
    pub locks_max: usize,
}

impl Default for TxnSettings {
    fn default() -> Self {
        TxnSettings {
            lock_wait_max: Duration::from_millis(1000),
            locks_max: 1024,
        }
    }
}
