//! RESPONSE and ERROR frames, the server's two answers to a request. A
//! response carries one self-describing result per operation (status,
//! payload kind, payload); an ERROR frame refuses a request or the
//! connection as a whole.

use bytes::{BufMut, Bytes, BytesMut};

use super::error::{DecodeError, FrameFault, LimitError};
use super::frame::{
    begin_frame, finish_frame, open_frame, take_and_parse, truncate_utf8, wire_len, Cursor,
};
use super::limits::Limits;
use super::wire::{
    error_flags, frame_kind, payload_kind, Status, EXPIRY_PAYLOAD_BYTES, FRAME_HEADER_BYTES,
    KEYS_ENTRY_HEADER_BYTES, KEYS_PAYLOAD_HEADER_BYTES, MESSAGE_BYTES_MAX, RESULT_HEADER_BYTES,
    STAT_TEXT_BYTES_MAX,
};

/// When a key expires, as a TTL answers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expiry {
    /// The expiry time, absolute Unix ms (never 0).
    pub at_ms: u64,
    /// Milliseconds left by the server's clock when it answered.
    pub left_ms: u64,
}

/// The answer to one operation, in the position of its operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpReply {
    /// Status OK without payload: a PUT was applied, a DELETE removed its key,
    /// a PING was answered.
    Ok,
    /// Status OK with the value a GET found.
    Value(Bytes),
    /// Status NOT_FOUND: a GET or DELETE found no such key.
    NotFound,
    /// Status OK with the answer to STATS: (name, value) text pairs.
    Stats(Vec<(String, String)>),
    /// Status OK with the answer to TTL: the key's expiry, `None` when it
    /// has none.
    Expiry(Option<Expiry>),
    /// Status OK with the answer to SCAN: the cursor of the next step (0
    /// when the walk is done) and the keys of this step.
    Keys { cursor: u64, keys: Vec<Bytes> },
    /// The operation failed and was not applied. `status.is_error()` holds;
    /// `message` is at most [`MESSAGE_BYTES_MAX`] bytes once encoded.
    Error { status: Status, message: String },
}

impl OpReply {
    /// An error reply. Panics if `status` is not an error status.
    pub fn error(status: Status, message: impl Into<String>) -> OpReply {
        assert!(status.is_error(), "{status} is not an error status");
        OpReply::Error {
            status,
            message: message.into(),
        }
    }

    /// The wire status of this reply.
    pub fn status(&self) -> Status {
        match self {
            OpReply::Ok
            | OpReply::Value(_)
            | OpReply::Stats(_)
            | OpReply::Expiry(_)
            | OpReply::Keys { .. } => Status::Ok,
            OpReply::NotFound => Status::NotFound,
            OpReply::Error { status, .. } => *status,
        }
    }

    /// Bytes this result takes in a frame.
    pub fn encoded_len(&self) -> usize {
        RESULT_HEADER_BYTES
            + match self {
                OpReply::Ok | OpReply::NotFound => 0,
                OpReply::Value(value) => value.len(),
                OpReply::Stats(entries) => stats_len(entries),
                OpReply::Expiry(_) => EXPIRY_PAYLOAD_BYTES,
                OpReply::Keys { keys, .. } => keys_len(keys),
                OpReply::Error { message, .. } => truncate_utf8(message, MESSAGE_BYTES_MAX).len(),
            }
    }
}

/// Bytes of a KEYS payload holding `keys`.
pub fn keys_len(keys: &[Bytes]) -> usize {
    KEYS_PAYLOAD_HEADER_BYTES
        + keys
            .iter()
            .map(|k| KEYS_ENTRY_HEADER_BYTES + k.len())
            .sum::<usize>()
}

fn stats_len(entries: &[(String, String)]) -> usize {
    4 + entries
        .iter()
        .map(|(name, value)| {
            2 + truncate_utf8(name, STAT_TEXT_BYTES_MAX).len()
                + 2
                + truncate_utf8(value, STAT_TEXT_BYTES_MAX).len()
        })
        .sum::<usize>()
}

/// The answer to a request: same id, one result per operation, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub id: u64,
    pub results: Vec<OpReply>,
}

impl Response {
    /// Bytes of the encoded frame, length prefix included.
    pub fn encoded_len(&self) -> usize {
        FRAME_HEADER_BYTES + self.results.iter().map(OpReply::encoded_len).sum::<usize>()
    }
}

/// A request, or the whole connection, refused by the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorFrame {
    /// The refused request, when its frame could be read. `None` for errors
    /// about the connection (bad checksum, oversized frame, shutdown).
    pub id: Option<u64>,
    /// Why; always an error status.
    pub status: Status,
    /// A short human-readable reason (cut to [`MESSAGE_BYTES_MAX`] bytes).
    pub message: String,
    /// The server closes the connection after this frame.
    pub close: bool,
}

impl ErrorFrame {
    /// The ERROR frame a server sends for a decode error: `Rejected` names
    /// the request and keeps the connection; anything else closes it.
    /// `None` for `NeedMore`, which is not an error.
    pub fn from_decode_error(error: &DecodeError) -> Option<ErrorFrame> {
        if let DecodeError::NeedMore { .. } = error {
            return None;
        }
        Some(ErrorFrame {
            id: error.request_id(),
            status: error.status(),
            message: error.to_string(),
            close: error.closes_connection(),
        })
    }
}

/// What a server sends after the handshake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerFrame {
    Response(Response),
    Error(ErrorFrame),
}

/// Appends `response` to `buf` as one RESPONSE frame.
///
/// Call [`fit_response`] first so the frame stays within the client's
/// `frame_bytes_max`. Messages and STATS texts are cut to their limits.
/// Panics if an error reply carries a non-error status.
pub fn encode_response(response: &Response, buf: &mut BytesMut) {
    buf.reserve(response.encoded_len());
    let count = wire_len(response.results.len(), "result count");
    let start = begin_frame(buf, frame_kind::RESPONSE, count, response.id);
    for reply in &response.results {
        match reply {
            OpReply::Ok => put_result(buf, Status::Ok, payload_kind::NONE, &[]),
            OpReply::NotFound => put_result(buf, Status::NotFound, payload_kind::NONE, &[]),
            OpReply::Value(value) => put_result(buf, Status::Ok, payload_kind::VALUE, value),
            OpReply::Stats(entries) => {
                buf.put_u8(Status::Ok.code());
                buf.put_u8(payload_kind::STATS);
                buf.put_u32_le(wire_len(stats_len(entries), "stats payload"));
                buf.put_u32_le(wire_len(entries.len(), "stats entry count"));
                for (name, value) in entries {
                    put_text16(buf, truncate_utf8(name, STAT_TEXT_BYTES_MAX));
                    put_text16(buf, truncate_utf8(value, STAT_TEXT_BYTES_MAX));
                }
            }
            OpReply::Expiry(expiry) => {
                buf.put_u8(Status::Ok.code());
                buf.put_u8(payload_kind::EXPIRY);
                buf.put_u32_le(EXPIRY_PAYLOAD_BYTES as u32);
                let (at_ms, left_ms) = expiry.map_or((0, 0), |e| (e.at_ms, e.left_ms));
                assert!(
                    expiry.is_none() || at_ms != 0,
                    "an expiry time of 0 means none"
                );
                buf.put_u64_le(at_ms);
                buf.put_u64_le(left_ms);
            }
            OpReply::Keys { cursor, keys } => {
                buf.put_u8(Status::Ok.code());
                buf.put_u8(payload_kind::KEYS);
                buf.put_u32_le(wire_len(keys_len(keys), "keys payload"));
                buf.put_u64_le(*cursor);
                buf.put_u32_le(wire_len(keys.len(), "key count"));
                for key in keys {
                    buf.put_u32_le(wire_len(key.len(), "key"));
                    buf.put_slice(key);
                }
            }
            OpReply::Error { status, message } => {
                assert!(status.is_error(), "error reply with status {status}");
                let message = truncate_utf8(message, MESSAGE_BYTES_MAX);
                put_result(buf, *status, payload_kind::MESSAGE, message.as_bytes());
            }
        }
    }
    finish_frame(buf, start);
}

fn put_result(buf: &mut BytesMut, status: Status, kind: u8, payload: &[u8]) {
    buf.put_u8(status.code());
    buf.put_u8(kind);
    buf.put_u32_le(wire_len(payload.len(), "payload"));
    buf.put_slice(payload);
}

fn put_text16(buf: &mut BytesMut, text: &str) {
    buf.put_u16_le(text.len() as u16); // cut to STAT_TEXT_BYTES_MAX = u16::MAX by the caller
    buf.put_slice(text.as_bytes());
}

/// Appends `error` to `buf` as one ERROR frame. Panics if its status is not
/// an error status, or if it neither names a request nor closes (the client
/// could not tell which request it refuses).
pub fn encode_error(error: &ErrorFrame, buf: &mut BytesMut) {
    assert!(
        error.status.is_error(),
        "ERROR frame with status {}",
        error.status
    );
    assert!(
        error.close || error.id.is_some(),
        "an ERROR frame that keeps the connection open must name its request"
    );
    let message = truncate_utf8(&error.message, MESSAGE_BYTES_MAX);
    let mut flags = 0;
    if error.close {
        flags |= error_flags::CLOSE;
    }
    if error.id.is_some() {
        flags |= error_flags::ID_VALID;
    }
    let start = begin_frame(buf, frame_kind::ERROR, 0, error.id.unwrap_or(0));
    buf.put_u8(error.status.code());
    buf.put_u8(flags);
    buf.put_u16_le(message.len() as u16); // <= MESSAGE_BYTES_MAX < u16::MAX
    buf.put_slice(message.as_bytes());
    finish_frame(buf, start);
}

/// Makes `response` fit in `frame_bytes_max` bytes: a payload (GET value,
/// STATS) that does not fit in what is left, keeping room for every later
/// result, is replaced by a FRAME_TOO_LARGE error whose message says why;
/// later results that still fit keep their payload. Returns how many
/// results were replaced.
///
/// Every error keeps a non-empty message unless the limits are within a
/// few bytes per operation of the smallest [`Limits::validate`] allows
/// (`24 + 6 × ops_per_frame_max`), where only the 6-byte result headers
/// are guaranteed to fit. Always succeeds for valid limits and a response
/// of at most `ops_per_frame_max` results.
pub fn fit_response(response: &mut Response, frame_bytes_max: u32) -> usize {
    let max = frame_bytes_max as usize;
    if response.encoded_len() <= max {
        return 0;
    }
    let count = response.results.len();
    let floor = FRAME_HEADER_BYTES + RESULT_HEADER_BYTES * count;
    assert!(
        floor <= max,
        "{count} results cannot fit in {max} bytes; Limits::validate forbids this"
    );
    let message = format!(
        "response would exceed the frame limit of {max} bytes; read this key in a smaller batch"
    );
    // Results with a payload can shrink to a header plus a message; give
    // each the same share of what is left beyond the headers, at most the
    // whole message.
    let shrinkable = |r: &OpReply| !matches!(r, OpReply::Ok | OpReply::NotFound);
    let shrink_count = response.results.iter().filter(|r| shrinkable(r)).count();
    let message_len = (max - floor)
        .checked_div(shrink_count)
        .map_or(0, |share| share.min(message.len()));
    let message = truncate_utf8(&message, message_len);
    let smallest = |r: &OpReply| {
        let payload = r.encoded_len() - RESULT_HEADER_BYTES;
        RESULT_HEADER_BYTES
            + if shrinkable(r) {
                payload.min(message_len)
            } else {
                0
            }
    };
    // after[i]: the least room results i.. need.
    let mut after = vec![0usize; count + 1];
    for i in (0..count).rev() {
        after[i] = after[i + 1] + smallest(&response.results[i]);
    }
    let mut replaced = 0;
    let mut used = FRAME_HEADER_BYTES;
    for (index, reply) in response.results.iter_mut().enumerate() {
        let reserve = after[index + 1];
        if used + reply.encoded_len() + reserve > max {
            let room = max - used - reserve - RESULT_HEADER_BYTES;
            match reply {
                // An error keeps its status; only its message is cut.
                OpReply::Error { message: m, .. } => {
                    let cut = truncate_utf8(m, room).len();
                    m.truncate(cut);
                }
                _ => {
                    *reply = OpReply::Error {
                        status: Status::FrameTooLarge,
                        message: truncate_utf8(message, room).to_owned(),
                    };
                    replaced += 1;
                }
            }
        }
        used += reply.encoded_len();
    }
    assert!(
        used <= max,
        "fit_response left {used} bytes for a limit of {max}"
    );
    replaced
}

/// Removes one RESPONSE or ERROR frame from the front of `buf` and decodes it.
///
/// `Ok(None)`: incomplete, nothing consumed. A client treats every `Err` as
/// fatal for the connection: a server that sends a bad frame cannot be trusted.
pub fn decode_response(
    buf: &mut BytesMut,
    limits: &Limits,
) -> Result<Option<ServerFrame>, DecodeError> {
    take_and_parse(buf, limits, parse_server_frame)
}

fn parse_server_frame(frame: &Bytes, limits: &Limits) -> Result<ServerFrame, (u64, FrameFault)> {
    let (header, mut cursor) = open_frame(frame)?;
    let id = header.id;
    let fault = |fault| (id, fault);
    match header.kind {
        frame_kind::RESPONSE => {
            let count = header.count as usize;
            if count == 0 {
                return Err(fault(FrameFault::OverLimit(LimitError::EmptyBatch)));
            }
            if count > limits.ops_per_frame_max as usize {
                return Err(fault(FrameFault::OverLimit(LimitError::TooManyOps {
                    count,
                    max: limits.ops_per_frame_max,
                })));
            }
            let mut results =
                Vec::with_capacity(count.min(cursor.remaining() / RESULT_HEADER_BYTES));
            for index in 0..count {
                results.push(parse_result(&mut cursor, index, limits).map_err(fault)?);
            }
            cursor.finish().map_err(fault)?;
            Ok(ServerFrame::Response(Response { id, results }))
        }
        frame_kind::ERROR => {
            if header.count != 0 {
                return Err(fault(FrameFault::BadCount {
                    kind: "ERROR",
                    count: header.count as usize,
                    expected: 0,
                }));
            }
            let error = parse_error_body(&mut cursor, id).map_err(fault)?;
            cursor.finish().map_err(fault)?;
            Ok(ServerFrame::Error(error))
        }
        kind => Err(fault(FrameFault::UnexpectedKind {
            kind,
            expected: "RESPONSE or ERROR",
        })),
    }
}

fn parse_result(
    cursor: &mut Cursor<'_>,
    index: usize,
    limits: &Limits,
) -> Result<OpReply, FrameFault> {
    let code = cursor.u8("status")?;
    let status = Status::from_code(code).ok_or(FrameFault::UnknownStatus { index, code })?;
    let kind = cursor.u8("payload kind")?;
    let len = cursor.u32("payload length")? as usize;
    let bad = FrameFault::BadReply {
        index,
        status,
        payload_kind: kind,
        len,
    };
    match (status, kind) {
        (Status::Ok, payload_kind::NONE) | (Status::NotFound, payload_kind::NONE) => {
            if len != 0 {
                return Err(bad);
            }
            Ok(if status == Status::Ok {
                OpReply::Ok
            } else {
                OpReply::NotFound
            })
        }
        (Status::Ok, payload_kind::VALUE) => {
            if len > limits.value_bytes_max as usize {
                return Err(FrameFault::OverLimit(LimitError::ValueTooLarge {
                    index,
                    len,
                    max: limits.value_bytes_max,
                }));
            }
            Ok(OpReply::Value(cursor.bytes(len, "value")?))
        }
        (Status::Ok, payload_kind::STATS) => {
            let blob = cursor.bytes(len, "stats payload")?;
            Ok(OpReply::Stats(parse_stats(&blob)?))
        }
        (Status::Ok, payload_kind::EXPIRY) => {
            if len != EXPIRY_PAYLOAD_BYTES {
                return Err(bad);
            }
            let at_ms = cursor.u64("expiry time")?;
            let left_ms = cursor.u64("expiry time left")?;
            match (at_ms, left_ms) {
                (0, 0) => Ok(OpReply::Expiry(None)),
                (0, _) => Err(bad),
                (at_ms, left_ms) => Ok(OpReply::Expiry(Some(Expiry { at_ms, left_ms }))),
            }
        }
        (Status::Ok, payload_kind::KEYS) => {
            let blob = cursor.bytes(len, "keys payload")?;
            let (next, keys) = parse_keys(&blob, limits)?;
            Ok(OpReply::Keys { cursor: next, keys })
        }
        (status, payload_kind::MESSAGE) if status.is_error() => {
            if len > MESSAGE_BYTES_MAX {
                return Err(FrameFault::MessageTooLarge {
                    len,
                    max: MESSAGE_BYTES_MAX,
                });
            }
            Ok(OpReply::Error {
                status,
                message: cursor.text(len, "message")?,
            })
        }
        _ => Err(bad),
    }
}

/// Parses a KEYS payload: the next cursor and the keys, each checked
/// against `key_bytes_max`. Offsets in faults are relative to the payload.
fn parse_keys(blob: &Bytes, limits: &Limits) -> Result<(u64, Vec<Bytes>), FrameFault> {
    let mut cursor = Cursor::new(blob, 0);
    let next = cursor.u64("next cursor")?;
    let count = cursor.u32("key count")? as usize;
    // Each key takes at least its length field and one byte.
    let mut keys =
        Vec::with_capacity(count.min(cursor.remaining() / (KEYS_ENTRY_HEADER_BYTES + 1)));
    for index in 0..count {
        let len = cursor.u32("key length")? as usize;
        if len == 0 {
            return Err(FrameFault::OverLimit(LimitError::EmptyKey { index }));
        }
        if len > limits.key_bytes_max as usize {
            return Err(FrameFault::OverLimit(LimitError::KeyTooLarge {
                index,
                len,
                max: limits.key_bytes_max,
            }));
        }
        keys.push(cursor.bytes(len, "key")?);
    }
    cursor.finish()?;
    Ok((next, keys))
}

/// Parses a STATS blob. Offsets in faults are relative to the blob.
fn parse_stats(blob: &Bytes) -> Result<Vec<(String, String)>, FrameFault> {
    let mut cursor = Cursor::new(blob, 0);
    let count = cursor.u32("stats entry count")? as usize;
    // Each entry takes at least its two 2-byte lengths.
    let mut entries = Vec::with_capacity(count.min(cursor.remaining() / 4));
    for _ in 0..count {
        let name_len = cursor.u16("stats name length")? as usize;
        let name = cursor.text(name_len, "stats name")?;
        let value_len = cursor.u16("stats value length")? as usize;
        let value = cursor.text(value_len, "stats value")?;
        entries.push((name, value));
    }
    cursor.finish()?;
    Ok(entries)
}

fn parse_error_body(cursor: &mut Cursor<'_>, id: u64) -> Result<ErrorFrame, FrameFault> {
    let code = cursor.u8("status")?;
    let status = Status::from_code(code).ok_or(FrameFault::UnknownStatus { index: 0, code })?;
    if !status.is_error() {
        return Err(FrameFault::NotAnError { status });
    }
    let flags_offset = cursor.offset();
    let flags = cursor.u8("error flags")?;
    if flags & !error_flags::KNOWN != 0 {
        return Err(FrameFault::ReservedBits {
            what: "error flag bits",
            offset: flags_offset,
            got: flags,
        });
    }
    if flags & (error_flags::CLOSE | error_flags::ID_VALID) == 0 {
        return Err(FrameFault::UnattributedError { flags });
    }
    let message = cursor.message()?;
    Ok(ErrorFrame {
        id: (flags & error_flags::ID_VALID != 0).then_some(id),
        status,
        message,
        close: flags & error_flags::CLOSE != 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(len: usize) -> OpReply {
        OpReply::Value(Bytes::from(vec![7u8; len]))
    }

    fn round_trip(frame: &ServerFrame) -> ServerFrame {
        let mut buf = BytesMut::new();
        match frame {
            ServerFrame::Response(response) => encode_response(response, &mut buf),
            ServerFrame::Error(error) => encode_error(error, &mut buf),
        }
        let decoded = decode_response(&mut buf, &Limits::default())
            .unwrap()
            .unwrap();
        assert!(buf.is_empty());
        decoded
    }

    #[test]
    fn every_reply_kind_round_trips() {
        let response = Response {
            id: 77,
            results: vec![
                OpReply::Ok,
                OpReply::Value(Bytes::from_static(b"one")),
                OpReply::Value(Bytes::new()),
                OpReply::NotFound,
                OpReply::Stats(vec![("shards".into(), "4".into()), ("".into(), "".into())]),
                OpReply::error(Status::Poisoned, "shard 3 is poisoned"),
                OpReply::error(Status::Internal, ""),
                OpReply::Expiry(None),
                OpReply::Expiry(Some(Expiry {
                    at_ms: 1_700_000_000_000,
                    left_ms: 0,
                })),
                OpReply::Keys {
                    cursor: 0,
                    keys: vec![],
                },
                OpReply::Keys {
                    cursor: 513,
                    keys: vec![Bytes::from_static(b"a"), Bytes::from_static(b"key-2")],
                },
            ],
        };
        let frame = ServerFrame::Response(response.clone());
        assert_eq!(round_trip(&frame), frame);
        let mut buf = BytesMut::new();
        encode_response(&response, &mut buf);
        assert_eq!(buf.len(), response.encoded_len());
    }

    /// A response of one result whose payload is `payload` with `kind`.
    fn one_result(kind: u8, payload: &[u8]) -> BytesMut {
        let mut buf = BytesMut::new();
        let start = begin_frame(&mut buf, frame_kind::RESPONSE, 1, 5);
        put_result(&mut buf, Status::Ok, kind, payload);
        finish_frame(&mut buf, start);
        buf
    }

    #[test]
    fn malformed_expiry_and_keys_payloads_are_rejected() {
        let limits = Limits {
            key_bytes_max: 4,
            ..Limits::default()
        };
        let rejected = |mut buf: BytesMut| match decode_response(&mut buf, &limits) {
            Err(DecodeError::Rejected { id: 5, fault }) => fault,
            other => panic!("expected a rejection, got {other:?}"),
        };
        // Time left without an expiry time; a payload of the wrong size.
        let mut payload = [0u8; 16];
        payload[8] = 1;
        assert!(matches!(
            rejected(one_result(payload_kind::EXPIRY, &payload)),
            FrameFault::BadReply { .. }
        ));
        assert!(matches!(
            rejected(one_result(payload_kind::EXPIRY, &[0u8; 8])),
            FrameFault::BadReply { .. }
        ));
        // Keys: an empty one, one over key_bytes_max, a count past the end.
        let keys = |count: u32, entries: &[&[u8]]| {
            let mut p = 0u64.to_le_bytes().to_vec();
            p.extend_from_slice(&count.to_le_bytes());
            for key in entries {
                p.extend_from_slice(&(key.len() as u32).to_le_bytes());
                p.extend_from_slice(key);
            }
            one_result(payload_kind::KEYS, &p)
        };
        assert_eq!(
            rejected(keys(1, &[b""])),
            FrameFault::OverLimit(LimitError::EmptyKey { index: 0 })
        );
        assert_eq!(
            rejected(keys(2, &[b"ok", b"toolong"])),
            FrameFault::OverLimit(LimitError::KeyTooLarge {
                index: 1,
                len: 7,
                max: 4
            })
        );
        assert!(matches!(
            rejected(keys(1_000_000, &[b"a"])),
            FrameFault::Truncated { .. }
        ));
        let mut fine = keys(2, &[b"a", b"bcd"]);
        assert_eq!(
            decode_response(&mut fine, &limits),
            Ok(Some(ServerFrame::Response(Response {
                id: 5,
                results: vec![OpReply::Keys {
                    cursor: 0,
                    keys: vec![Bytes::from_static(b"a"), Bytes::from_static(b"bcd")]
                }]
            })))
        );
    }

    #[test]
    fn error_frames_round_trip_with_and_without_id() {
        for (id, close) in [(Some(5), false), (None, true), (Some(0), true)] {
            let frame = ServerFrame::Error(ErrorFrame {
                id,
                status: Status::ShuttingDown,
                message: "bye".into(),
                close,
            });
            assert_eq!(round_trip(&frame), frame);
        }
    }

    #[test]
    fn an_error_frame_must_name_its_request_or_close() {
        let mut buf = BytesMut::new();
        encode_error(
            &ErrorFrame {
                id: Some(4),
                status: Status::BadRequest,
                message: "x".into(),
                close: false,
            },
            &mut buf,
        );
        // Clear ID_VALID (body offset 1) and fix the checksum.
        buf[FRAME_HEADER_BYTES + 1] = 0;
        let crc = crc32fast::hash(&buf[8..]);
        buf[4..8].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(
            decode_response(&mut buf, &Limits::default()),
            Err(DecodeError::Rejected {
                id: 4,
                fault: FrameFault::UnattributedError { flags: 0 }
            })
        );
    }

    #[test]
    fn long_messages_are_cut_on_a_character_boundary() {
        let long = "é".repeat(MESSAGE_BYTES_MAX);
        let response = Response {
            id: 1,
            results: vec![OpReply::error(Status::BadRequest, long)],
        };
        let ServerFrame::Response(decoded) = round_trip(&ServerFrame::Response(response)) else {
            panic!("expected a response");
        };
        let OpReply::Error { message, .. } = &decoded.results[0] else {
            panic!("expected an error")
        };
        assert_eq!(message.len(), MESSAGE_BYTES_MAX);
        assert!(message.chars().all(|c| c == 'é'));
    }

    #[test]
    fn fit_response_replaces_values_that_overflow() {
        let limits = Limits {
            frame_bytes_max: 4096,
            ops_per_frame_max: 100,
            ..Limits::default()
        };
        let mut response = Response {
            id: 1,
            results: vec![value(1000), value(2000), value(1500), OpReply::Ok],
        };
        let replaced = fit_response(&mut response, limits.frame_bytes_max);
        assert_eq!(replaced, 1);
        assert!(response.encoded_len() <= 4096);
        assert_eq!(response.results[0], value(1000));
        assert_eq!(response.results[1], value(2000));
        assert_eq!(response.results[2].status(), Status::FrameTooLarge);
        assert_eq!(response.results[3], OpReply::Ok);
    }

    #[test]
    fn fit_response_never_leaves_a_replaced_value_without_its_message() {
        // Many large values after the frame is full: every replaced one
        // carries the whole message, and a later small value still fits.
        let frame_bytes_max = 1 << 20;
        let mut results: Vec<OpReply> = (0..2000).map(|_| value(100_000)).collect();
        results.push(value(10));
        let mut response = Response { id: 1, results };
        let replaced = fit_response(&mut response, frame_bytes_max);
        assert!(replaced > 1900, "{replaced}");
        assert!(response.encoded_len() <= frame_bytes_max as usize);
        for r in &response.results[..2000] {
            if let OpReply::Error { status, message } = r {
                assert_eq!(*status, Status::FrameTooLarge);
                assert!(
                    message.ends_with("read this key in a smaller batch"),
                    "{message:?}"
                );
            }
        }
        assert_eq!(response.results[2000], value(10));
    }

    #[test]
    fn fit_response_fits_a_full_batch_at_the_tightest_valid_limits() {
        let ops = 1000u32;
        let frame_bytes_max = Limits::frame_bytes_min(ops) as u32;
        let mut response = Response {
            id: 1,
            results: (0..ops).map(|_| value(50)).collect(),
        };
        let replaced = fit_response(&mut response, frame_bytes_max);
        assert!(replaced > 0);
        assert!(response.encoded_len() <= frame_bytes_max as usize);
        let mut buf = BytesMut::new();
        encode_response(&response, &mut buf);
        let limits = Limits {
            frame_bytes_max,
            ops_per_frame_max: ops,
            ..Limits::default()
        };
        assert!(decode_response(&mut buf, &limits).unwrap().is_some());
    }

    #[test]
    fn from_decode_error_keeps_rejected_connections_open() {
        let rejected = DecodeError::Rejected {
            id: 9,
            fault: FrameFault::OverLimit(LimitError::TooManyOps { count: 20, max: 10 }),
        };
        let frame = ErrorFrame::from_decode_error(&rejected).unwrap();
        assert_eq!(frame.id, Some(9));
        assert_eq!(frame.status, Status::TooManyOps);
        assert!(!frame.close);
        assert!(frame.message.contains("20 operations"), "{}", frame.message);

        let fatal = DecodeError::ChecksumMismatch {
            stored: 1,
            computed: 2,
        };
        let frame = ErrorFrame::from_decode_error(&fatal).unwrap();
        assert_eq!(
            (frame.id, frame.status, frame.close),
            (None, Status::ChecksumMismatch, true)
        );
        assert_eq!(
            ErrorFrame::from_decode_error(&DecodeError::NeedMore { have: 0, need: 4 }),
            None
        );
    }
}
