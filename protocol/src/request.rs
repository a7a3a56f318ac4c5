//! REQUEST frames: a batch of operations under one request id. Decoding
//! enforces the limits before it reads a key or value, and hands keys and
//! values out as zero-copy slices of the frame.

use bytes::{BufMut, Bytes, BytesMut};

use super::error::{DecodeError, FrameFault, LimitError};
use super::frame::{begin_frame, finish_frame, open_frame, take_and_parse, wire_len, Cursor};
use super::limits::Limits;
use super::response::OpReply;
use super::wire::{
    frame_kind, opcode, BACKUP_OP_FIXED_BYTES, BACKUP_PATH_BYTES_MAX, FRAME_HEADER_BYTES,
    OP_BYTES_MIN, PROTOCOL_VERSION, SCAN_OP_FIXED_BYTES, SCAN_PATTERN_BYTES_MAX,
};

/// One operation of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestOp {
    /// Sets `key` to `value`. Answered OK.
    Put { key: Bytes, value: Bytes },
    /// Reads `key`. Answered with its value, or NOT_FOUND.
    Get { key: Bytes },
    /// Removes `key`. Answered OK if it existed, NOT_FOUND if not.
    Delete { key: Bytes },
    /// Does nothing. Answered OK.
    Ping,
    /// Asks for server and shard counters. Answered with STATS entries.
    Stats,
    /// Version 3: sets `key` to `value`, expiring at `expires_at_ms`
    /// (absolute Unix ms; 0: never, like PUT; a time already past deletes
    /// the key). Answered OK.
    PutExpiring {
        key: Bytes,
        value: Bytes,
        expires_at_ms: u64,
    },
    /// Version 3: sets the expiry time of an existing `key` (absolute Unix
    /// ms; 0 removes it; a time already past deletes the key). Answered OK,
    /// or NOT_FOUND when there is no such key.
    Expire { key: Bytes, expires_at_ms: u64 },
    /// Version 3: reads the expiry time of `key`. Answered with an EXPIRY
    /// payload, or NOT_FOUND.
    Ttl { key: Bytes },
    /// Version 3: one step of a walk over every key. `cursor` is 0 to
    /// start, then the cursor the previous step answered; `count` is a hint
    /// of how many keys to visit (0: the server's default); a non-empty
    /// `pattern` keeps only keys that match it (a glob, see
    /// `docs/protocol.md`). Answered with a KEYS payload.
    Scan {
        cursor: u64,
        count: u32,
        pattern: Bytes,
    },
    /// Opens the connection's transaction. Answered OK.
    Begin,
    /// Locks `key` and reads it (in a transaction). Answered with its
    /// value, or NOT_FOUND.
    GetForUpdate { key: Bytes },
    /// Commits the transaction. Answered OK once durable (under `sync`).
    Commit,
    /// Rolls the transaction back. Answered OK.
    Rollback,
    /// Version 5: writes an online backup of every shard into the directory
    /// `dest` on the server's machine (new or empty), copying at most
    /// `rate_bytes_per_sec` (0: no limit). Answered once it is finished,
    /// with STATS entries describing it.
    Backup {
        dest: Bytes,
        rate_bytes_per_sec: u64,
    },
}

impl RequestOp {
    /// The opcode byte of this operation.
    pub fn opcode(&self) -> u8 {
        match self {
            RequestOp::Put { .. } => opcode::PUT,
            RequestOp::Get { .. } => opcode::GET,
            RequestOp::Delete { .. } => opcode::DELETE,
            RequestOp::Ping => opcode::PING,
            RequestOp::Stats => opcode::STATS,
            RequestOp::PutExpiring { .. } => opcode::PUT_EXPIRING,
            RequestOp::Expire { .. } => opcode::EXPIRE,
            RequestOp::Ttl { .. } => opcode::TTL,
            RequestOp::Scan { .. } => opcode::SCAN,
            RequestOp::Begin => opcode::BEGIN,
            RequestOp::GetForUpdate { .. } => opcode::GET_FOR_UPDATE,
            RequestOp::Commit => opcode::COMMIT,
            RequestOp::Rollback => opcode::ROLLBACK,
            RequestOp::Backup { .. } => opcode::BACKUP,
        }
    }

    /// The first protocol version that defines this operation.
    pub fn since_version(&self) -> u16 {
        opcode::since_version(self.opcode())
    }

    /// The key this operation addresses, if any.
    pub fn key(&self) -> Option<&Bytes> {
        match self {
            RequestOp::Put { key, .. }
            | RequestOp::Get { key }
            | RequestOp::Delete { key }
            | RequestOp::PutExpiring { key, .. }
            | RequestOp::Expire { key, .. }
            | RequestOp::Ttl { key }
            | RequestOp::GetForUpdate { key } => Some(key),
            RequestOp::Ping
            | RequestOp::Stats
            | RequestOp::Scan { .. }
            | RequestOp::Begin
            | RequestOp::Commit
            | RequestOp::Rollback
            | RequestOp::Backup { .. } => None,
        }
    }

    /// Bytes this operation takes in a frame.
    pub fn encoded_len(&self) -> usize {
        match self {
            RequestOp::Put { key, value } => 1 + 4 + key.len() + 4 + value.len(),
            RequestOp::PutExpiring { key, value, .. } => 1 + 4 + key.len() + 4 + value.len() + 8,
            RequestOp::Expire { key, .. } => 1 + 4 + key.len() + 8,
            RequestOp::Scan { pattern, .. } => SCAN_OP_FIXED_BYTES + pattern.len(),
            RequestOp::Backup { dest, .. } => BACKUP_OP_FIXED_BYTES + dest.len(),
            RequestOp::Get { key }
            | RequestOp::Delete { key }
            | RequestOp::Ttl { key }
            | RequestOp::GetForUpdate { key } => 1 + 4 + key.len(),
            RequestOp::Ping
            | RequestOp::Stats
            | RequestOp::Begin
            | RequestOp::Commit
            | RequestOp::Rollback => 1,
        }
    }

    /// Whether `reply` is a valid answer to this operation. Any error reply
    /// is valid for any operation.
    pub fn accepts(&self, reply: &OpReply) -> bool {
        match reply {
            OpReply::Error { .. } => true,
            OpReply::Ok => matches!(
                self,
                RequestOp::Put { .. }
                    | RequestOp::PutExpiring { .. }
                    | RequestOp::Expire { .. }
                    | RequestOp::Delete { .. }
                    | RequestOp::Ping
                    | RequestOp::Begin
                    | RequestOp::Commit
                    | RequestOp::Rollback
            ),
            OpReply::Value(_) => {
                matches!(self, RequestOp::Get { .. } | RequestOp::GetForUpdate { .. })
            }
            OpReply::NotFound => matches!(
                self,
                RequestOp::Get { .. }
                    | RequestOp::Delete { .. }
                    | RequestOp::GetForUpdate { .. }
                    | RequestOp::Expire { .. }
                    | RequestOp::Ttl { .. }
            ),
            OpReply::Stats(_) => matches!(self, RequestOp::Stats | RequestOp::Backup { .. }),
            OpReply::Expiry(_) => matches!(self, RequestOp::Ttl { .. }),
            OpReply::Keys { .. } => matches!(self, RequestOp::Scan { .. }),
        }
    }
}

/// A batch of operations. The response carries the same `id` and one result
/// per operation, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub id: u64,
    pub ops: Vec<RequestOp>,
}

impl Request {
    /// Bytes of the encoded frame, length prefix included.
    pub fn encoded_len(&self) -> usize {
        FRAME_HEADER_BYTES + self.ops.iter().map(RequestOp::encoded_len).sum::<usize>()
    }
}

/// Appends `request` to `buf` as one REQUEST frame.
///
/// Does not check [`Limits`] (see [`Limits::check_request`]); panics only if
/// a count or length does not fit the wire's u32, or a SCAN pattern is over
/// [`SCAN_PATTERN_BYTES_MAX`].
pub fn encode_request(request: &Request, buf: &mut BytesMut) {
    buf.reserve(request.encoded_len());
    let count = wire_len(request.ops.len(), "operation count");
    let start = begin_frame(buf, frame_kind::REQUEST, count, request.id);
    for op in &request.ops {
        buf.put_u8(op.opcode());
        match op {
            RequestOp::Put { key, value } => {
                put_field(buf, key, "key");
                put_field(buf, value, "value");
            }
            RequestOp::PutExpiring {
                key,
                value,
                expires_at_ms,
            } => {
                put_field(buf, key, "key");
                put_field(buf, value, "value");
                buf.put_u64_le(*expires_at_ms);
            }
            RequestOp::Expire { key, expires_at_ms } => {
                put_field(buf, key, "key");
                buf.put_u64_le(*expires_at_ms);
            }
            RequestOp::Scan {
                cursor,
                count,
                pattern,
            } => {
                buf.put_u64_le(*cursor);
                buf.put_u32_le(*count);
                assert!(
                    pattern.len() <= SCAN_PATTERN_BYTES_MAX,
                    "a SCAN pattern of {} bytes is over the limit of {SCAN_PATTERN_BYTES_MAX}",
                    pattern.len()
                );
                buf.put_u16_le(pattern.len() as u16); // <= SCAN_PATTERN_BYTES_MAX < u16::MAX
                buf.put_slice(pattern);
            }
            RequestOp::Backup {
                dest,
                rate_bytes_per_sec,
            } => {
                assert!(
                    dest.len() <= BACKUP_PATH_BYTES_MAX,
                    "a BACKUP path of {} bytes is over the limit of {BACKUP_PATH_BYTES_MAX}",
                    dest.len()
                );
                buf.put_u16_le(dest.len() as u16); // <= BACKUP_PATH_BYTES_MAX < u16::MAX
                buf.put_slice(dest);
                buf.put_u64_le(*rate_bytes_per_sec);
            }
            RequestOp::Get { key }
            | RequestOp::Delete { key }
            | RequestOp::Ttl { key }
            | RequestOp::GetForUpdate { key } => put_field(buf, key, "key"),
            RequestOp::Ping
            | RequestOp::Stats
            | RequestOp::Begin
            | RequestOp::Commit
            | RequestOp::Rollback => {}
        }
    }
    finish_frame(buf, start);
}

fn put_field(buf: &mut BytesMut, field: &[u8], what: &str) {
    buf.put_u32_le(wire_len(field.len(), what));
    buf.put_slice(field);
}

/// Removes one REQUEST frame from the front of `buf` and decodes it.
///
/// - `Ok(None)`: the frame is incomplete; nothing was consumed.
/// - `Err(Rejected { id, .. })`: the frame was well framed but invalid; it
///   has been consumed. Answer an ERROR frame for `id` and keep going.
/// - any other `Err`: the stream cannot be trusted; answer an ERROR frame
///   with CLOSE and close the connection. `buf` is left as it was.
///
/// Keys and values are slices of one shared frame buffer: copy them before
/// keeping them long-term, or the whole frame stays allocated.
pub fn decode_request(buf: &mut BytesMut, limits: &Limits) -> Result<Option<Request>, DecodeError> {
    decode_request_version(buf, limits, PROTOCOL_VERSION)
}

/// [`decode_request`] on a connection that negotiated protocol `version`:
/// an opcode of a later version is refused (UNSUPPORTED, naming the version
/// it needs) like any opcode the connection does not define, so an old
/// client's frame is never read with a newer layout.
pub fn decode_request_version(
    buf: &mut BytesMut,
    limits: &Limits,
    version: u16,
) -> Result<Option<Request>, DecodeError> {
    take_and_parse(buf, limits, |frame, limits| {
        parse_request(frame, limits, version)
    })
}

fn parse_request(
    frame: &Bytes,
    limits: &Limits,
    version: u16,
) -> Result<Request, (u64, FrameFault)> {
    let (header, mut cursor) = open_frame(frame)?;
    let id = header.id;
    let fault = |fault| (id, fault);
    if header.kind != frame_kind::REQUEST {
        return Err(fault(FrameFault::UnexpectedKind {
            kind: header.kind,
            expected: "REQUEST",
        }));
    }
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
    // The count is bounded by the limit and by what the body can hold.
    let mut ops = Vec::with_capacity(count.min(cursor.remaining() / OP_BYTES_MIN));
    for index in 0..count {
        let op = parse_op(&mut cursor, index, limits, version).map_err(fault)?;
        ops.push(op);
    }
    cursor.finish().map_err(fault)?;
    Ok(Request { id, ops })
}

fn parse_op(
    cursor: &mut Cursor<'_>,
    index: usize,
    limits: &Limits,
    version: u16,
) -> Result<RequestOp, FrameFault> {
    let code = cursor.u8("opcode")?;
    let since = opcode::since_version(code);
    if since > version {
        return Err(FrameFault::OpcodeNeedsVersion {
            index,
            code,
            name: opcode::name(code).unwrap_or("?"),
            since,
            version,
        });
    }
    let op = match code {
        opcode::PUT => {
            let key = parse_key(cursor, index, limits)?;
            let value = parse_value(cursor, index, limits)?;
            RequestOp::Put { key, value }
        }
        opcode::PUT_EXPIRING => {
            let key = parse_key(cursor, index, limits)?;
            let value = parse_value(cursor, index, limits)?;
            let expires_at_ms = cursor.u64("expiry time")?;
            RequestOp::PutExpiring {
                key,
                value,
                expires_at_ms,
            }
        }
        opcode::EXPIRE => RequestOp::Expire {
            key: parse_key(cursor, index, limits)?,
            expires_at_ms: cursor.u64("expiry time")?,
        },
        opcode::TTL => RequestOp::Ttl {
            key: parse_key(cursor, index, limits)?,
        },
        opcode::SCAN => {
            let scan_cursor = cursor.u64("scan cursor")?;
            let count = cursor.u32("scan count")?;
            let len = cursor.u16("pattern length")? as usize;
            if len > SCAN_PATTERN_BYTES_MAX {
                return Err(FrameFault::OverLimit(LimitError::PatternTooLarge {
                    index,
                    len,
                    max: SCAN_PATTERN_BYTES_MAX,
                }));
            }
            RequestOp::Scan {
                cursor: scan_cursor,
                count,
                pattern: cursor.bytes(len, "pattern")?,
            }
        }
        opcode::BACKUP => {
            let len = cursor.u16("path length")? as usize;
            if len == 0 || len > BACKUP_PATH_BYTES_MAX {
                return Err(FrameFault::OverLimit(LimitError::BackupPath {
                    index,
                    len,
                    max: BACKUP_PATH_BYTES_MAX,
                }));
            }
            let dest = cursor.bytes(len, "path")?;
            RequestOp::Backup {
                dest,
                rate_bytes_per_sec: cursor.u64("rate")?,
            }
        }
        opcode::GET => RequestOp::Get {
            key: parse_key(cursor, index, limits)?,
        },
        opcode::DELETE => RequestOp::Delete {
            key: parse_key(cursor, index, limits)?,
        },
        opcode::PING => RequestOp::Ping,
        opcode::STATS => RequestOp::Stats,
        opcode::BEGIN => RequestOp::Begin,
        opcode::GET_FOR_UPDATE => RequestOp::GetForUpdate {
            key: parse_key(cursor, index, limits)?,
        },
        opcode::COMMIT => RequestOp::Commit,
        opcode::ROLLBACK => RequestOp::Rollback,
        _ => {
            return Err(match opcode::reserved_name(code) {
                Some(name) => FrameFault::ReservedOpcode { index, code, name },
                None => FrameFault::UnknownOpcode { index, code },
            })
        }
    };
    Ok(op)
}

fn parse_value(
    cursor: &mut Cursor<'_>,
    index: usize,
    limits: &Limits,
) -> Result<Bytes, FrameFault> {
    let len = cursor.u32("value length")? as usize;
    if len > limits.value_bytes_max as usize {
        return Err(FrameFault::OverLimit(LimitError::ValueTooLarge {
            index,
            len,
            max: limits.value_bytes_max,
        }));
    }
    cursor.bytes(len, "value")
}

fn parse_key(cursor: &mut Cursor<'_>, index: usize, limits: &Limits) -> Result<Bytes, FrameFault> {
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
    cursor.bytes(len, "key")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Status;

    fn b(s: &'static str) -> Bytes {
        Bytes::from_static(s.as_bytes())
    }

    fn sample() -> Request {
        Request {
            id: 0x0102_0304_0506_0708,
            ops: vec![
                RequestOp::Put {
                    key: b("alpha"),
                    value: b("one"),
                },
                RequestOp::Get { key: b("alpha") },
                RequestOp::Delete { key: b("beta") },
                RequestOp::Ping,
                RequestOp::Stats,
                RequestOp::Put {
                    key: b("empty"),
                    value: Bytes::new(),
                },
            ],
        }
    }

    fn encoded(request: &Request) -> BytesMut {
        let mut buf = BytesMut::new();
        encode_request(request, &mut buf);
        buf
    }

    /// Re-encodes a frame after editing its body, so the checksum stays valid
    /// and the edit reaches the content checks.
    fn reseal(mut frame: BytesMut) -> BytesMut {
        let len = (frame.len() - 4) as u32;
        frame[..4].copy_from_slice(&len.to_le_bytes());
        let crc = crc32fast::hash(&frame[8..]);
        frame[4..8].copy_from_slice(&crc.to_le_bytes());
        frame
    }

    #[test]
    fn round_trip_consumes_exactly_one_frame() {
        let request = sample();
        let mut buf = encoded(&request);
        assert_eq!(buf.len(), request.encoded_len());
        encode_request(
            &Request {
                id: 9,
                ops: vec![RequestOp::Ping],
            },
            &mut buf,
        );
        let limits = Limits::default();
        assert_eq!(decode_request(&mut buf, &limits), Ok(Some(request)));
        assert_eq!(
            decode_request(&mut buf, &limits),
            Ok(Some(Request {
                id: 9,
                ops: vec![RequestOp::Ping]
            }))
        );
        assert!(buf.is_empty());
        assert_eq!(decode_request(&mut buf, &limits), Ok(None));
    }

    #[test]
    fn over_limit_content_is_rejected_and_consumed() {
        let limits = Limits {
            key_bytes_max: 4,
            ..Limits::default()
        };
        let mut buf = encoded(&sample());
        let total = buf.len();
        let error = decode_request(&mut buf, &limits).unwrap_err();
        assert_eq!(
            error,
            DecodeError::Rejected {
                id: 0x0102_0304_0506_0708,
                fault: FrameFault::OverLimit(LimitError::KeyTooLarge {
                    index: 0,
                    len: 5,
                    max: 4
                })
            }
        );
        assert_eq!(error.status(), Status::KeyTooLarge);
        assert!(!error.closes_connection());
        assert!(
            buf.is_empty(),
            "all {total} bytes of the rejected frame are consumed"
        );
    }

    #[test]
    fn reserved_opcode_is_unsupported_with_its_name() {
        let mut frame = encoded(&Request {
            id: 5,
            ops: vec![RequestOp::Ping],
        });
        frame[24] = 0x14;
        let mut buf = reseal(frame);
        let error = decode_request(&mut buf, &Limits::default()).unwrap_err();
        assert_eq!(
            error,
            DecodeError::Rejected {
                id: 5,
                fault: FrameFault::ReservedOpcode {
                    index: 0,
                    code: 0x14,
                    name: "a transaction opcode"
                }
            }
        );
        assert_eq!(error.status(), Status::Unsupported);
        assert!(error.to_string().contains("transaction"), "{error}");
    }

    #[test]
    fn unknown_opcode_and_trailing_bytes_are_rejected() {
        let mut frame = encoded(&Request {
            id: 6,
            ops: vec![RequestOp::Ping],
        });
        frame[24] = 0x7f;
        let error = decode_request(&mut reseal(frame), &Limits::default()).unwrap_err();
        assert_eq!(
            error,
            DecodeError::Rejected {
                id: 6,
                fault: FrameFault::UnknownOpcode {
                    index: 0,
                    code: 0x7f
                }
            }
        );

        let mut frame = encoded(&Request {
            id: 7,
            ops: vec![RequestOp::Ping],
        });
        frame.put_u8(0);
        let error = decode_request(&mut reseal(frame), &Limits::default()).unwrap_err();
        assert_eq!(
            error,
            DecodeError::Rejected {
                id: 7,
                fault: FrameFault::TrailingBytes {
                    offset: 25,
                    count: 1
                }
            }
        );
    }

    #[test]
    fn count_beyond_body_is_truncated_not_allocated() {
        let mut frame = encoded(&Request {
            id: 8,
            ops: vec![RequestOp::Ping],
        });
        frame[12..16].copy_from_slice(&10_000u32.to_le_bytes());
        let error = decode_request(&mut reseal(frame), &Limits::default()).unwrap_err();
        assert_eq!(
            error,
            DecodeError::Rejected {
                id: 8,
                fault: FrameFault::Truncated {
                    what: "opcode",
                    offset: 25,
                    need: 1,
                    have: 0
                }
            }
        );
    }

    #[test]
    fn empty_batch_and_wrong_kind_are_rejected() {
        let mut frame = encoded(&Request {
            id: 3,
            ops: vec![RequestOp::Ping],
        });
        frame[12..16].copy_from_slice(&0u32.to_le_bytes());
        let error = decode_request(&mut reseal(frame), &Limits::default()).unwrap_err();
        assert_eq!(
            error,
            DecodeError::Rejected {
                id: 3,
                fault: FrameFault::OverLimit(LimitError::EmptyBatch)
            }
        );

        let mut frame = encoded(&Request {
            id: 4,
            ops: vec![RequestOp::Ping],
        });
        frame[8] = frame_kind::RESPONSE;
        let error = decode_request(&mut reseal(frame), &Limits::default()).unwrap_err();
        assert_eq!(
            error,
            DecodeError::Rejected {
                id: 4,
                fault: FrameFault::UnexpectedKind {
                    kind: 2,
                    expected: "REQUEST"
                }
            }
        );
    }

    fn version_3_ops() -> Vec<RequestOp> {
        vec![
            RequestOp::PutExpiring {
                key: b("session"),
                value: b("token"),
                expires_at_ms: 1_700_000_000_000,
            },
            RequestOp::Expire {
                key: b("session"),
                expires_at_ms: 0,
            },
            RequestOp::Ttl { key: b("session") },
            RequestOp::Scan {
                cursor: 257,
                count: 100,
                pattern: b("user:*"),
            },
            RequestOp::Scan {
                cursor: 0,
                count: 0,
                pattern: Bytes::new(),
            },
        ]
    }

    #[test]
    fn backup_round_trips_needs_version_5_and_a_bounded_path() {
        let request = Request {
            id: 21,
            ops: vec![RequestOp::Backup {
                dest: b("/var/backups/ringkv"),
                rate_bytes_per_sec: 100 << 20,
            }],
        };
        let mut buf = encoded(&request);
        assert_eq!(buf.len(), request.encoded_len());
        assert_eq!(
            decode_request(&mut buf, &Limits::default()),
            Ok(Some(request.clone()))
        );
        let mut buf = encoded(&request);
        let error = decode_request_version(&mut buf, &Limits::default(), 4).unwrap_err();
        assert_eq!(error.status(), Status::Unsupported);
        assert!(
            error.to_string().contains("needs protocol version 5"),
            "{error}"
        );
        // An empty path, and one over the limit (edited after encoding).
        for len in [0u16, BACKUP_PATH_BYTES_MAX as u16 + 1] {
            let mut frame = encoded(&Request {
                id: 22,
                ops: vec![RequestOp::Backup {
                    dest: b("x"),
                    rate_bytes_per_sec: 0,
                }],
            });
            frame[FRAME_HEADER_BYTES + 1..FRAME_HEADER_BYTES + 3]
                .copy_from_slice(&len.to_le_bytes());
            let error = decode_request(&mut reseal(frame), &Limits::default()).unwrap_err();
            assert_eq!(error.status(), Status::BadRequest, "{error}");
            assert!(!error.closes_connection());
        }
    }

    #[test]
    fn version_3_ops_round_trip() {
        let request = Request {
            id: 11,
            ops: version_3_ops(),
        };
        let mut buf = encoded(&request);
        assert_eq!(buf.len(), request.encoded_len());
        assert_eq!(
            decode_request(&mut buf, &Limits::default()),
            Ok(Some(request))
        );
        assert!(buf.is_empty());
    }

    #[test]
    fn version_3_ops_are_refused_on_older_connections() {
        for (position, op) in version_3_ops().into_iter().enumerate() {
            let code = op.opcode();
            assert_eq!(op.since_version(), 3);
            let request = Request {
                id: 12,
                ops: vec![RequestOp::Ping, op],
            };
            for version in [1, 2] {
                let mut buf = encoded(&request);
                let error = decode_request_version(&mut buf, &Limits::default(), version)
                    .expect_err("an op of version 3 on an older connection");
                assert_eq!(error.status(), Status::Unsupported, "op {position}");
                assert!(!error.closes_connection());
                assert!(buf.is_empty(), "the refused frame is consumed");
                let DecodeError::Rejected {
                    id: 12,
                    fault:
                        FrameFault::OpcodeNeedsVersion {
                            index: 1,
                            since: 3,
                            version: v,
                            code: c,
                            ..
                        },
                } = &error
                else {
                    panic!("unexpected {error:?}");
                };
                assert_eq!((*v, *c), (version, code));
                assert!(
                    error.to_string().contains("needs protocol version 3"),
                    "{error}"
                );
            }
            let mut buf = encoded(&request);
            assert!(decode_request_version(&mut buf, &Limits::default(), 3).is_ok());
        }
    }

    #[test]
    fn scan_pattern_and_expiring_value_are_bounded() {
        let mut frame = encoded(&Request {
            id: 13,
            ops: vec![RequestOp::Scan {
                cursor: 0,
                count: 1,
                pattern: b("x"),
            }],
        });
        // The pattern length field: opcode, cursor and count precede it.
        let at = FRAME_HEADER_BYTES + 1 + 8 + 4;
        frame[at..at + 2].copy_from_slice(&((SCAN_PATTERN_BYTES_MAX + 1) as u16).to_le_bytes());
        let error = decode_request(&mut reseal(frame), &Limits::default()).unwrap_err();
        assert_eq!(
            error,
            DecodeError::Rejected {
                id: 13,
                fault: FrameFault::OverLimit(LimitError::PatternTooLarge {
                    index: 0,
                    len: SCAN_PATTERN_BYTES_MAX + 1,
                    max: SCAN_PATTERN_BYTES_MAX
                })
            }
        );
        assert_eq!(error.status(), Status::BadRequest);

        let limits = Limits {
            value_bytes_max: 2,
            ..Limits::default()
        };
        let mut buf = encoded(&Request {
            id: 14,
            ops: vec![RequestOp::PutExpiring {
                key: b("k"),
                value: b("abc"),
                expires_at_ms: 5,
            }],
        });
        assert_eq!(
            decode_request(&mut buf, &limits).unwrap_err().status(),
            Status::ValueTooLarge
        );
    }

    #[test]
    fn accepts_matches_ops_to_replies() {
        let get = RequestOp::Get { key: b("k") };
        assert!(get.accepts(&OpReply::Value(b("v"))));
        assert!(get.accepts(&OpReply::NotFound));
        assert!(!get.accepts(&OpReply::Ok));
        assert!(RequestOp::Ping.accepts(&OpReply::Ok));
        assert!(!RequestOp::Ping.accepts(&OpReply::NotFound));
        assert!(RequestOp::Stats.accepts(&OpReply::Stats(vec![])));
        let ttl = RequestOp::Ttl { key: b("k") };
        assert!(ttl.accepts(&OpReply::Expiry(None)));
        assert!(ttl.accepts(&OpReply::NotFound));
        assert!(!ttl.accepts(&OpReply::Ok));
        let expire = RequestOp::Expire {
            key: b("k"),
            expires_at_ms: 0,
        };
        assert!(expire.accepts(&OpReply::Ok) && expire.accepts(&OpReply::NotFound));
        assert!(!expire.accepts(&OpReply::Expiry(None)));
        let scan = RequestOp::Scan {
            cursor: 0,
            count: 0,
            pattern: Bytes::new(),
        };
        let page = OpReply::Keys {
            cursor: 0,
            keys: vec![],
        };
        assert!(scan.accepts(&page) && !get.accepts(&page));
        assert!(!scan.accepts(&OpReply::NotFound));
        assert!(RequestOp::Put {
            key: b("k"),
            value: b("v")
        }
        .accepts(&OpReply::error(Status::Poisoned, "shard 1 poisoned")));
    }
}
