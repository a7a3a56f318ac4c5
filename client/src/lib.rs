//! ringkv's async client. [`protocol`] re-exports the runtime-free codec of the
//! `ringkv-protocol` crate, which the server shares; [`Client`] is a pipelining
//! tokio client on top of it. This crate must not depend on the engine or the server.
//!
//! # Using it
//!
//! In `Cargo.toml`, without the `ringkv` command-line tool and its clap
//! dependency (the default `cli` feature):
//!
//! ```toml
//! ringkv-client = { version = "0.1", default-features = false }
//! tokio = { version = "1", features = ["rt-multi-thread", "macros"] }
//! ```
//!
//! Connect, write, read, and send several operations in one frame. The
//! example needs a server on 127.0.0.1:7379 (`ringkv-server`), so it is
//! compiled but not run by the doc tests; `examples/basic.rs` is the same
//! program as a binary (`cargo run -p ringkv-client --example basic`).
//!
//! ```no_run
//! use ringkv_client::{Client, ClientError, OpReply, RequestOp};
//!
//! #[tokio::main]
//! async fn main() -> Result<(), ClientError> {
//!     let client = Client::connect("127.0.0.1:7379").await?;
//!
//!     client.put("greeting", "hello").await?;
//!     assert_eq!(client.get("greeting").await?.as_deref(), Some(&b"hello"[..]));
//!     assert_eq!(client.get("no such key").await?, None);
//!
//!     // One frame, one round trip, one reply per operation, in order. A
//!     // failed operation is an `OpReply::Error` in its place; `Err` means
//!     // the frame as a whole failed.
//!     let replies = client
//!         .batch(vec![
//!             RequestOp::Put { key: "a".into(), value: "1".into() },
//!             RequestOp::Get { key: "a".into() },
//!             RequestOp::Delete { key: "b".into() },
//!         ])
//!         .await?;
//!     assert_eq!(replies, vec![OpReply::Ok, OpReply::Value("1".into()), OpReply::NotFound]);
//!     Ok(())
//! }
//! ```
//!
//! With TLS, a user and a password, build [`ConnectOptions`] and call
//! [`Client::connect_with`]:
//!
//! ```no_run
//! # async fn run() -> Result<(), ringkv_client::ClientError> {
//! use std::time::Duration;
//! use ringkv_client::{Client, ConnectOptions, TlsOptions};
//!
//! let options = ConnectOptions::new()
//!     .with_tls(TlsOptions::new().with_ca_file("ca.pem"))
//!     .with_user("app")
//!     .with_password(std::fs::read("password").unwrap_or_default())
//!     .with_timeout(Duration::from_secs(5));
//! let client = Client::connect_with("db.example.com:7379", &options).await?;
//! client.ping().await?;
//! # Ok(())
//! # }
//! ```
//!
//! A `Client` is shared by reference (or in an `Arc`) between tasks: their
//! frames are pipelined on its one connection.
//!
//! # Features
//!
//! - `cli` (default): the `ringkv` binary and `ConnectArgs`, its clap
//!   flags. Without it the crate needs neither clap nor tokio's
//!   multi-threaded runtime or macros.

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
