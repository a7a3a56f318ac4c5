//! RESP, the Redis serialization protocol (versions 2 and 3), as a sans-IO
//! codec: the command decoder a server uses ([`RespDecoder`]), the reply
//! writer ([`ReplyWriter`]) and a reply decoder for clients and tests
//! ([`decode_reply`]). `docs/resp.md` says what the server does with it.

mod decode;
mod encode;
mod reply;

pub use decode::{
    parse_i64, split_inline, Command, RespDecoder, RespError, RespLimits, LINE_BYTES_MAX,
};
pub use encode::{ReplyWriter, Version};
pub use reply::{decode_reply, Reply, ReplyError, ReplyLimits};
