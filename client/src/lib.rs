//! ringkv's async client. [`protocol`] re-exports the runtime-free codec of the
//! `ringkv-protocol` crate, which the server shares; [`Client`] is a pipelining
//! tokio client on top of it. This crate must not depend on the engine or the server.

#![cfg_attr(not(test), deny(clippy::unwrap_used))]

#[cfg(feature = "cli")]
pub mod args;
mod client;
pub mod tls;
/// The sans-IO wire codec, re-exported from `ringkv-protocol`.
pub use ringkv_protocol as protocol;

#[cfg(feature = "cli")]
pub use args::ConnectArgs;
pub use client::{
    expiry_time_ms, Client, ClientError, ConnectOptions, KeyTtl, ProtocolError, ScanPage,
    Transaction, CONNECT_TIMEOUT_DEFAULT,
};
pub use protocol::{Limits, OpReply, RequestOp, ServerInfo, Status};
pub use tls::TlsOptions;
