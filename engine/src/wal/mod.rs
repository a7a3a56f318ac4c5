//! The write-ahead log of one shard, split by role:
//! - `format`: byte layouts; `head`: the file naming the log's first
//!   segment; `segment`: one segment file (create, prepare, recycle);
//! - `writer`: the append buffer ([`writer::WalAppender`]) and the set of
//!   segment files ([`writer::SegmentFiles`]);
//! - `durable`: the WAL as the shard uses it (LSNs, answers waiting for
//!   durability, poisoning, the checkpoint trigger);
//! - `flusher`: the group-commit and segment-creator tasks; `watch`: the
//!   task that logs a durable LSN standing still behind logged records;
//! - `reader`: validating and replaying flushes; `chain`: putting chunk
//!   chains back together on replay; `recovery`: the decision table that
//!   turns what is on disk into a state and a clean log end.
//!
//! The WAL knows no shard: it imports `snapshot` (recovery picks one) and
//! `txn` (the part record and the replay of parts), both below it, and
//! nothing in `shard/` or above.
//!
//! The byte diagrams and the rules are in `docs/wal.md`.

pub mod chain;
pub(crate) mod durable;
pub(crate) mod flusher;
pub mod format;
pub mod head;
pub mod reader;
pub mod recovery;
pub mod segment;
pub(crate) mod watch;
pub mod writer;
