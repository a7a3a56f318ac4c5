//! The native protocol's side of the server: accepting on each shard
//! (`listener`), one connection's byte stream as a pure state machine
//! (`session`), the connection's reader and executor tasks joined by a
//! bounded queue (`connection`, `pipe`), and a request turned into engine
//! operations (`exec`, with `expiry`, `scan` and `txn` for those opcodes).

pub mod connection;
pub mod exec;
pub mod expiry;
pub mod listener;
pub mod pipe;
pub mod scan;
pub mod session;
pub mod txn;
