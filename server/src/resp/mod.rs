//! The Redis-protocol (RESP2/RESP3) listener: every shard serves it beside
//! the native port, on the same engine, with the same durability rule (a
//! write's reply waits for the fdatasync that covers it in `sync` mode).
//! `docs/resp.md` lists the commands and how they differ from Redis.
//!
//! Layout: `conn` (accept loop, reader and executor tasks) → `command`
//! (arguments → engine ops or a reply, pure) → `update` (the
//! read-modify-write commands as engine update functions) and `info`
//! (DBSIZE, INFO, CONFIG GET); `multi` (MULTI/EXEC/WATCH, MSETNX on
//! the engine's transactions); `counters` for INFO.

pub mod command;
pub mod conn;
pub mod counters;
pub mod info;
pub mod loading;
pub mod multi;
pub mod update;

pub use conn::{accept_loop, resp_limits};
pub use counters::{RespCounters, RespTotals};
