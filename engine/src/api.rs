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
    /// Reads `key`, computes a new state from its value with
    /// `update.apply` and writes it, all in one step on the key's shard: no
    /// other operation on the key runs in between (a read-modify-write such
    /// as an increment or a put-if-absent). The write is logged to the WAL
    /// as an ordinary put or delete record, and the answer waits for
    /// durability exactly as a put's does.
    Update { key: Bytes, update: Update },
    /// [`Op::Update`] whose function also sees the key's expiry time and
    /// the shard's clock (expiry commands: TTL, EXPIRE, GETEX, SET KEEPTTL...).
    UpdateTtl { key: Bytes, update: TtlUpdate },
}

/// Bytes a [`TtlUpdate`]'s `arg` may hold beyond `value_bytes_max`
/// (options an expiry command sends in front of a value; the value the
/// update writes is still checked against `value_bytes_max`).
pub const TTL_ARG_OPTION_BYTES_MAX: usize = 8;

/// An expiry-aware read-modify-write of one key (see [`Op::UpdateTtl`]).
#[derive(Debug, Clone)]
pub struct TtlUpdate {
    /// Computes the new state; the same rules as [`Update::apply`].
    pub apply: TtlUpdateFn,
    pub arg: Bytes,
    pub number: i64,
}

impl PartialEq for TtlUpdate {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::fn_addr_eq(self.apply, other.apply)
            && self.arg == other.arg
            && self.number == other.number
    }
}

impl Eq for TtlUpdate {}

/// What an expiry-aware update sees of its key: the value and its expiry
/// time (absolute Unix ms), `None` for a missing or expired key.
pub type Current = Option<(Bytes, Option<u64>)>;

/// `apply(current, now in Unix ms, arg, number)`.
pub type TtlUpdateFn = fn(Current, u64, &Bytes, i64) -> UpdateOutcome;

/// A read-modify-write of one key (see [`Op::Update`]).
#[derive(Debug, Clone)]
pub struct Update {
    /// Computes the new state; runs on the shard thread, so it must be quick,
    /// must not block and must not panic.
    pub apply: UpdateFn,
    /// An argument for `apply` (a value to store, append, compare...).
    pub arg: Bytes,
    /// A second argument for `apply` (an increment, an offset...).
    pub number: i64,
}

impl PartialEq for Update {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::fn_addr_eq(self.apply, other.apply)
            && self.arg == other.arg
            && self.number == other.number
    }
}

impl Eq for Update {}

/// `apply(current value, arg, number)`.
pub type UpdateFn = fn(Option<Bytes>, &Bytes, i64) -> UpdateOutcome;

/// What an [`UpdateFn`] decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpdateOutcome {
    pub write: UpdateWrite,
    pub answer: UpdateAnswer,
}

/// The change an update makes to its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpdateWrite {
    /// Leave the key as it is (nothing is logged).
    Keep,
    /// Set the key to this value (checked against `value_bytes_max`),
    /// keeping its expiry time, as Redis's INCR, APPEND and SETRANGE do.
    Put(Bytes),
    /// Set the key to this value with this expiry time (absolute Unix ms;
    /// `None`: none, as a plain SET). A time not after the shard's clock
    /// deletes the key instead.
    PutExpiring(Bytes, Option<u64>),
    /// Keep the value and set its expiry time (`None`: remove it, as
    /// PERSIST); nothing happens to a missing key. A time not after the
    /// shard's clock deletes the key.
    SetExpiry(Option<u64>),
    /// Remove the key.
    Delete,
}

/// The answer of an update, chosen by its [`UpdateFn`] and passed back
/// untouched (unless the write is refused: then the result is an error).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpdateAnswer {
    /// No value.
    Nil,
    /// Done, nothing to report.
    Ok,
    /// A number.
    Int(i64),
    /// A value.
    Value(Bytes),
    /// The update was refused (nothing was written); the text says why.
    Refused(&'static str),
}

impl Op {
    pub fn key(&self) -> &Bytes {
        match self {
            Op::Put { key, .. }
            | Op::Get { key }
            | Op::Delete { key }
            | Op::Update { key, .. }
            | Op::UpdateTtl { key, .. } => key,
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
    /// The answer of an [`Op::Update`].
    Updated(UpdateAnswer),
    /// The operation failed; nothing was applied for it.
    Err(OpError),
}

/// Why one operation (or a whole batch) was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OpError {
    #[error("key is empty")]
    EmptyKey,
    #[error("key of {len} bytes is over the limit of {max} (limits.key_bytes_max)")]
    KeyTooLarge { len: usize, max: usize },
    #[error("value of {len} bytes is over the limit of {max} (limits.value_bytes_max)")]
    ValueTooLarge { len: usize, max: usize },
    #[error("batch of {count} operations is over the limit of {max} (limits.ops_per_frame_max)")]
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
    /// The key's record could not be read back from its value segment (a
    /// device error, or a block whose checksum does not match). Nothing
    /// was changed; `reason` names the file and offset.
    #[error("shard {shard}: {reason}")]
    ValueUnreadable { shard: usize, reason: String },
    /// The write would grow the shard's tier past its share of
    /// `storage.max_memory` (`max`, in bytes; `used` is what it holds).
    /// Nothing was logged or applied; reads, deletes and writes that do
    /// not grow memory still work.
    #[error("command not allowed when used memory > 'maxmemory': shard {shard} holds {used} bytes of its {max}-byte share of storage.max_memory and this write would grow it; nothing was written (reads, deletes and shrinking writes still work)")]
    OutOfMemory { shard: usize, used: u64, max: u64 },
}
