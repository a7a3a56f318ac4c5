//! The ringkv wire protocol, versions 1 to 4, as a sans-IO codec: pure functions
//! from values to bytes and back, with no runtime attached, so the tokio
//! client and the compio server share one implementation. The format is
//! specified in `docs/protocol.md`; the test vectors there are checked
//! against this code.
//!
//! Decoders never panic on input, never allocate from a length before it
//! passed the [`Limits`], and tell an incomplete message (`Ok(None)`) apart
//! from a bad one (`Err`).

#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod error;
mod frame;
mod handshake;
mod limits;
mod request;
pub mod resp;
mod response;
mod wire;

pub mod stats;

pub use error::{DecodeError, FrameFault, LimitError, LimitsError};
pub use frame::check_frame;
pub use handshake::{
    decode_auth, decode_hello, decode_hello_ack, decode_user, encode_auth, encode_hello,
    encode_hello_ack, encode_user, Hello, HelloAck, ServerInfo,
};
pub use limits::Limits;
pub use request::{decode_request, decode_request_version, encode_request, Request, RequestOp};
pub use response::{
    decode_response, encode_error, encode_response, fit_response, keys_len, ErrorFrame, Expiry,
    OpReply, Response, ServerFrame,
};
pub use wire::{
    error_flags, frame_kind, hello_flags, opcode, payload_kind, Status, AUTH_LEN_BYTES,
    CHECKSUM_START, ERROR_BODY_HEADER_BYTES, EXPIRY_PAYLOAD_BYTES, FRAME_BYTES_MAX_FLOOR,
    FRAME_HEADER_BYTES, HELLO_ACK_BODY_BYTES_MAX, HELLO_ACK_PREFIX_BYTES, HELLO_BYTES,
    KEYS_ENTRY_HEADER_BYTES, KEYS_PAYLOAD_HEADER_BYTES, LEN_PREFIX_BYTES, MAGIC, MESSAGE_BYTES_MAX,
    OP_BYTES_MIN, PASSWORD_BYTES_MAX, PROTOCOL_VERSION, PROTOCOL_VERSION_MIN, RESULT_HEADER_BYTES,
    SCAN_OP_FIXED_BYTES, SCAN_PATTERN_BYTES_MAX, SERVER_NAME_BYTES_MAX, STAT_TEXT_BYTES_MAX,
    USER_LEN_BYTES, USER_NAME_BYTES_MAX,
};
