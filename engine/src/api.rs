//! The operations a caller hands the engine and the answers it gets back.
//! These types are the engine's public contract with the server.

use bytes::Bytes;

/// One operation of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Sets `key` to `value`.
    Put { key: Bytes, value: Bytes },
    /// Reads `key`.
    Get { key: Bytes },
    /// Removes `key`.
    Delete { key: Bytes },
}

impl Op {
    pub fn key(&self) -> &Bytes {
        match self {
            Op::Put { key, .. } | Op::Get { key } | Op::Delete { key } => key,
        }
    }

    pub fn is_write(&self) -> bool {
        !matches!(self, Op::Get { .. })
    }
}

/// The answer to one operation, in the same position as its operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpResult {
    /// A put succeeded, or a delete removed a key.
    Ok,
    /// A get found the key.
    Value(Bytes),
    /// A get or delete found no such key.
    NotFound,
    /// The operation failed; nothing was applied for it.
    Err(OpError),
}

/// Why one operation (or a whole batch) was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OpError {
    #[error("key is empty")]
    EmptyKey,
    #[error("key of {len} bytes is over the limit of {max}")]
    KeyTooLarge { len: usize, max: usize },
    #[error("value of {len} bytes is over the limit of {max}")]
    ValueTooLarge { len: usize, max: usize },
    #[error("batch of {count} operations is over the limit of {max}")]
    BatchTooLarge { count: usize, max: usize },
    #[error(
        "shard {shard} is poisoned by an earlier I/O error and accepts no writes until restart"
    )]
    Poisoned { shard: usize },
    #[error("shard {shard} is overloaded (its queue is full)")]
    Overloaded { shard: usize },
    #[error("the engine is shutting down")]
    ShuttingDown,
    /// A transaction holds the key: the plain write was not applied (retry
    /// it after the transaction ends).
    #[error("a transaction holds a lock on this key (shard {shard}); the write was not applied, retry it")]
    Locked { shard: usize },
    /// The GETs before this one in the batch (on its shard) already read
    /// `max` bytes of values: this one was not looked up. Read it in a
    /// smaller batch.
    #[error("this batch's GETs on shard {shard} already read {max} bytes of values (the per-batch read limit, limits.frame_bytes_max); read this key in a smaller batch")]
    ReadLimitReached { shard: usize, max: usize },
}
