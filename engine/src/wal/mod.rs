//! The write-ahead log of one shard, split by role: `format` (byte
//! layouts), `writer` (append buffer, group-commit flusher, segment files),
//! `reader` (validating and replaying flushes), `recovery` (the decision
//! table that turns what is on disk into a state and a clean log end).
//! The byte diagrams and the rules are in `docs/wal.md`.

pub mod format;
pub mod head;
pub mod reader;
pub mod recovery;
pub mod writer;
