//! ringkv's storage engine.
//!
//! Thread-per-core and shared-nothing: each shard is an OS thread pinned to
//! a core, running its own compio (io_uring) runtime, owning its slice of the
//! keyspace, its own write-ahead log and its own storage tier.

#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod api;
pub mod io;

pub use api::{Op, OpError, OpResult};
