//! ringkv-server as a library: the daemon's whole machinery, so `main.rs`
//! stays a thin wrapper and loadgen can embed the very same server
//! ([`start`] → [`RunningServer`]).
//!
//! Layout: `server` (start/stop) → `listener` (per-shard accept loop) →
//! `connection` (reader + executor tasks) → `session` (pure frame
//! processing) and `exec` (request ↔ engine batch); `status` maps engine
//! errors to wire statuses; `stats` and `metrics` report; `http` serves
//! /metrics; `sockets`, `lockfile`, `signals`, `cli` are the OS edges.

#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod auth;
pub mod cli;
pub mod connection;
pub mod counters;
pub mod exec;
pub mod expiry;
pub mod glob;
pub mod http;
pub mod listener;
pub mod lockfile;
pub mod metrics;
pub mod pipe;
pub mod prom;
pub mod resp;
pub mod scan;
pub mod server;
pub mod session;
pub mod shard;
pub mod signals;
pub mod sockets;
pub mod stats;
pub mod status;
pub mod tls;
pub mod txn;

pub use server::{limits_from_config, start, RunningServer, ServerError, StopHandle};
