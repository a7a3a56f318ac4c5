//! ringkv-server as a library: the daemon's whole machinery, so `main.rs`
//! stays a thin wrapper and loadgen can embed the very same server
//! ([`start`] → [`RunningServer`]).
//!
//! Layout: `server` (start/stop) → `native/` (the native port: per-shard
//! accept loop, connection tasks, the pure frame state machine `session`,
//! request ↔ engine batch in `exec`) and `resp/` (the Redis-protocol port);
//! `ops/` is what operators see (counters, STATS, `/metrics` and its HTTP
//! server, the engine-error → wire-status mapping); `auth`, `tls`, `sockets`,
//! `lockfile`, `signals` and `cli` are the edges.

#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod acl;
pub mod auth;
pub mod cli;
pub mod glob;
/// The data directory's lock (the engine's, which the embedded API takes too).
pub use engine::lockfile;
pub mod native;
pub mod ops;
pub mod resp;
pub mod server;
pub mod shard;
pub mod signals;
pub mod sockets;
pub mod tls;

pub use server::{limits_from_config, start, RunningServer, ServerError, StopHandle};
