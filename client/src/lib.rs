//! ringkv's wire protocol and async client. [`protocol`] is the runtime-free
//! codec that the server shares; [`Client`] is a pipelining tokio client on
//! top of it. This crate must not depend on the engine or the server.

mod client;
pub mod protocol;

pub use client::{Client, ClientError, ProtocolError, CONNECT_TIMEOUT_DEFAULT};
pub use protocol::{Limits, OpReply, RequestOp, ServerInfo, Status};
