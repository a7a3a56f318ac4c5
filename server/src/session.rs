//! The server side of one connection's byte stream, as a pure state machine:
//! bytes in, [`Step`]s out (send these bytes, run this request, close). No
//! sockets, no runtime, no clock — so it can be fuzzed and tested directly.
//!
//! What must hold, for ANY input bytes, split at ANY points:
//! - it never panics, and never asks to buffer more than the frame limit
//!   ([`Session::bytes_wanted`] is at most `frame_bytes_max`);
//! - the first message must be a valid hello, answered by the hello-ack;
//!   a bad hello is answered by a refusal and a close;
//! - after the handshake, each complete frame yields exactly one step in
//!   stream order: a request to run, or an ERROR frame for a rejected one;
//! - an error the stream cannot recover from (bad length, checksum) yields
//!   one final ERROR frame with the CLOSE flag and then nothing more.

use bytes::{Bytes, BytesMut};
use ringkv_protocol::{
    check_frame, decode_hello, decode_request, encode_error, encode_hello_ack, DecodeError,
    ErrorFrame, HelloAck, Limits, Request, ServerInfo, Status, HELLO_BYTES, LEN_PREFIX_BYTES,
    PROTOCOL_VERSION,
};

/// The encoded hello-ack accepting a client: this protocol version, the
/// limits the server enforces, and who the server is. A server encodes it
/// once and hands a clone to every connection's [`Session::new`].
pub fn accepted_hello_ack(limits: Limits, server: ServerInfo) -> Bytes {
    let mut ack = BytesMut::new();
    encode_hello_ack(
        &HelloAck::Accepted {
            version: PROTOCOL_VERSION,
            limits,
            server,
        },
        &mut ack,
    );
    ack.freeze()
}

/// What the connection must do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Write these bytes (the hello-ack, or an ERROR frame refusing one
    /// request), in order with the answers of earlier requests.
    Send(Bytes),
    /// Run this request and write its response, in order. `frame_bytes` is
    /// the size of the frame it came in, for the memory budget.
    Run {
        request: Request,
        frame_bytes: usize,
    },
    /// Write `reply` (if any) after everything before it, then close.
    Close {
        reply: Option<Bytes>,
        reason: CloseReason,
    },
}

/// Why the server closes a connection (also a metrics label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CloseReason {
    /// The peer closed its side.
    PeerClosed,
    /// No bytes in either direction for `server.idle_timeout`, with no
    /// request running.
    IdleTimeout,
    /// The handshake failed (bad magic, version or flags).
    BadHandshake,
    /// A frame broke the framing (length, checksum); the stream cannot be
    /// resynchronised.
    ProtocolError,
    /// Reading or writing the socket failed.
    IoError,
    /// The server is stopping.
    Shutdown,
    /// `server.max_connections` connections were already open.
    TooManyConnections,
}

impl CloseReason {
    pub const ALL: [CloseReason; 7] = [
        CloseReason::PeerClosed,
        CloseReason::IdleTimeout,
        CloseReason::BadHandshake,
        CloseReason::ProtocolError,
        CloseReason::IoError,
        CloseReason::Shutdown,
        CloseReason::TooManyConnections,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            CloseReason::PeerClosed => "peer_closed",
            CloseReason::IdleTimeout => "idle_timeout",
            CloseReason::BadHandshake => "bad_handshake",
            CloseReason::ProtocolError => "protocol_error",
            CloseReason::IoError => "io_error",
            CloseReason::Shutdown => "shutdown",
            CloseReason::TooManyConnections => "too_many_connections",
        }
    }

    pub const fn index(self) -> usize {
        self as usize
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    AwaitHello,
    Ready,
    Closed,
}

/// Decoding state of one connection.
#[derive(Debug)]
pub struct Session {
    phase: Phase,
    limits: Limits,
    /// The encoded hello-ack, the same for every connection of a server.
    hello_ack: Bytes,
    /// The last decode error that closed the stream, for the close log line.
    last_error: Option<DecodeError>,
}

impl Session {
    /// A session that answers a valid hello with `hello_ack` (already
    /// encoded) and enforces `limits` on every frame.
    pub fn new(limits: Limits, hello_ack: Bytes) -> Session {
        Session {
            phase: Phase::AwaitHello,
            limits,
            hello_ack,
            last_error: None,
        }
    }

    /// A session that accepts a valid hello on behalf of `server`,
    /// advertising `limits` (which it also enforces).
    pub fn accepting(limits: Limits, server: ServerInfo) -> Session {
        Session::new(limits, accepted_hello_ack(limits, server))
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Whether the handshake is done and the session still open.
    pub fn is_ready(&self) -> bool {
        self.phase == Phase::Ready
    }

    pub fn is_closed(&self) -> bool {
        self.phase == Phase::Closed
    }

    /// The error that made the session close, if it was a decode error.
    pub fn last_error(&self) -> Option<&DecodeError> {
        self.last_error.as_ref()
    }

    /// The next step for the bytes in `buf`, consuming what it used; `None`
    /// when more bytes are needed (or the session is closed). When `refuse`
    /// is set, complete requests are answered with an ERROR frame of that
    /// status instead of being run (used while shutting down).
    pub fn next_step(&mut self, buf: &mut BytesMut, refuse: Option<Status>) -> Option<Step> {
        match self.phase {
            Phase::Closed => None,
            Phase::AwaitHello => match decode_hello(buf) {
                Ok(None) => None,
                Ok(Some(_hello)) => {
                    self.phase = Phase::Ready;
                    Some(Step::Send(self.hello_ack.clone()))
                }
                Err(error) => {
                    let reply = HelloAck::refusal_for(&error).map(|ack| {
                        let mut out = BytesMut::new();
                        encode_hello_ack(&ack, &mut out);
                        out.freeze()
                    });
                    Some(self.close(buf, error, reply, CloseReason::BadHandshake))
                }
            },
            Phase::Ready => {
                // Read the frame size before decoding consumes it (the
                // prefix is only trusted once decode_request accepted it).
                let frame_bytes = buf
                    .first_chunk::<LEN_PREFIX_BYTES>()
                    .map(|p| LEN_PREFIX_BYTES + u32::from_le_bytes(*p) as usize);
                match decode_request(buf, &self.limits) {
                    Ok(None) => None,
                    Ok(Some(request)) => {
                        let frame_bytes = frame_bytes.unwrap_or(0);
                        match refuse {
                            None => Some(Step::Run {
                                request,
                                frame_bytes,
                            }),
                            Some(status) => Some(Step::Send(error_frame(
                                Some(request.id),
                                status,
                                refusal_message(status),
                                false,
                            ))),
                        }
                    }
                    Err(error) => {
                        let Some(frame) = ErrorFrame::from_decode_error(&error) else {
                            // NeedMore is never returned by decode_request;
                            // treat it as "wait" rather than trusting that.
                            return None;
                        };
                        if error.closes_connection() {
                            let mut out = BytesMut::new();
                            encode_error(&frame, &mut out);
                            Some(self.close(
                                buf,
                                error,
                                Some(out.freeze()),
                                CloseReason::ProtocolError,
                            ))
                        } else {
                            let mut out = BytesMut::new();
                            encode_error(&frame, &mut out);
                            Some(Step::Send(out.freeze()))
                        }
                    }
                }
            }
        }
    }

    fn close(
        &mut self,
        buf: &mut BytesMut,
        error: DecodeError,
        reply: Option<Bytes>,
        reason: CloseReason,
    ) -> Step {
        self.phase = Phase::Closed;
        self.last_error = Some(error);
        // Nothing after an unrecoverable error can be trusted; drop it.
        buf.clear();
        Step::Close { reply, reason }
    }

    /// How many bytes `buf` must be able to hold for the next message to be
    /// complete: at least what is buffered plus one byte. Never more than the
    /// frame limit, since lengths are checked before they are trusted.
    pub fn bytes_wanted(&self, buf: &[u8]) -> usize {
        let need = match self.phase {
            Phase::Closed => 0,
            Phase::AwaitHello => HELLO_BYTES,
            Phase::Ready => match check_frame(buf, &self.limits) {
                Err(DecodeError::NeedMore { need, .. }) => need,
                // A complete frame or an error: next_step will consume it.
                _ => LEN_PREFIX_BYTES,
            },
        };
        need.max(buf.len() + 1)
    }
}

/// Feeds `input` to `session` the way the connection reader does: each read
/// offers at most `max(bytes_wanted - buffered, read_chunk)` bytes, further
/// capped by the next entry of `cuts` (read sizes chosen by a test or a
/// fuzzer; the last one repeats as "unbounded"). Returns every step.
///
/// Panics if an invariant breaks: the buffer growing past one frame plus one
/// read chunk, a step after a close, or no progress. For tests and fuzzing.
pub fn feed_checked(
    session: &mut Session,
    input: &[u8],
    cuts: &[usize],
    read_chunk: usize,
) -> Vec<Step> {
    assert!(read_chunk >= 1);
    let mut buf = BytesMut::new();
    let mut steps = Vec::new();
    let mut offset = 0;
    let mut cut_index = 0;
    let max_buffered = session.limits.frame_bytes_max as usize + read_chunk;
    let mut closed = session.is_closed();
    let mut reads = 0usize;
    loop {
        while let Some(step) = session.next_step(&mut buf, None) {
            assert!(!closed, "a step after the close: {step:?}");
            if matches!(step, Step::Close { .. }) {
                closed = true;
            }
            steps.push(step);
        }
        if closed || offset >= input.len() {
            break;
        }
        let want = session.bytes_wanted(&buf);
        assert!(
            want <= max_buffered,
            "asked to buffer {want} bytes with a frame limit of {}",
            session.limits.frame_bytes_max
        );
        let room = want.saturating_sub(buf.len()).max(read_chunk);
        let cut = cuts.get(cut_index).copied().unwrap_or(usize::MAX).max(1);
        cut_index += 1;
        let n = room.min(cut).min(input.len() - offset);
        buf.extend_from_slice(&input[offset..offset + n]);
        offset += n;
        assert!(
            buf.len() <= max_buffered,
            "buffer grew to {} bytes",
            buf.len()
        );
        reads += 1;
        assert!(reads <= input.len() + 2, "no progress after {reads} reads");
    }
    if closed {
        assert!(session.is_closed());
        assert_eq!(session.next_step(&mut buf, None), None);
    }
    steps
}

/// An encoded ERROR frame.
pub fn error_frame(id: Option<u64>, status: Status, message: String, close: bool) -> Bytes {
    let mut out = BytesMut::new();
    encode_error(
        &ErrorFrame {
            id,
            status,
            message,
            close,
        },
        &mut out,
    );
    out.freeze()
}

fn refusal_message(status: Status) -> String {
    match status {
        Status::ShuttingDown => "the server is shutting down; the request was not run".to_string(),
        other => format!("request refused: {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringkv_protocol::{
        decode_hello_ack, decode_response, encode_hello, encode_request, Hello, RequestOp,
        ServerFrame,
    };

    fn limits() -> Limits {
        Limits {
            frame_bytes_max: 64 * 1024,
            ops_per_frame_max: 100,
            key_bytes_max: 64,
            value_bytes_max: 1024,
            pipeline_depth_max: 8,
        }
    }

    fn session() -> Session {
        Session::accepting(
            limits(),
            ServerInfo {
                server_id: 7,
                shard_count: 2,
                server_name: "test".into(),
            },
        )
    }

    fn hello() -> BytesMut {
        let mut b = BytesMut::new();
        encode_hello(&Hello::current(), &mut b);
        b
    }

    fn request(id: u64, ops: Vec<RequestOp>) -> BytesMut {
        let mut b = BytesMut::new();
        encode_request(&Request { id, ops }, &mut b);
        b
    }

    fn server_frame(bytes: &Bytes) -> ServerFrame {
        let mut b = BytesMut::from(&bytes[..]);
        decode_response(&mut b, &limits()).unwrap().unwrap()
    }

    #[test]
    fn handshake_then_requests_in_order() {
        let mut s = session();
        let mut buf = hello();
        buf.extend_from_slice(&request(1, vec![RequestOp::Ping]));
        buf.extend_from_slice(&request(
            2,
            vec![RequestOp::Get {
                key: Bytes::from_static(b"k"),
            }],
        ));
        let Some(Step::Send(ack)) = s.next_step(&mut buf, None) else {
            panic!()
        };
        let mut ack = BytesMut::from(&ack[..]);
        assert!(matches!(
            decode_hello_ack(&mut ack),
            Ok(Some(HelloAck::Accepted { .. }))
        ));
        let Some(Step::Run {
            request,
            frame_bytes,
        }) = s.next_step(&mut buf, None)
        else {
            panic!()
        };
        assert_eq!(request.id, 1);
        assert_eq!(frame_bytes, 25);
        let Some(Step::Run { request, .. }) = s.next_step(&mut buf, None) else {
            panic!()
        };
        assert_eq!(request.id, 2);
        assert_eq!(s.next_step(&mut buf, None), None);
        assert!(buf.is_empty());
    }

    #[test]
    fn bad_magic_is_refused_and_closes() {
        let mut s = session();
        let mut buf = BytesMut::from(&b"GET / HTTP/1.1\r\n"[..]);
        let Some(Step::Close {
            reply: Some(reply),
            reason,
        }) = s.next_step(&mut buf, None)
        else {
            panic!()
        };
        assert_eq!(reason, CloseReason::BadHandshake);
        let mut reply = BytesMut::from(&reply[..]);
        let Ok(Some(HelloAck::Refused { status, .. })) = decode_hello_ack(&mut reply) else {
            panic!()
        };
        assert_eq!(status, Status::BadRequest);
        assert!(s.is_closed());
        assert_eq!(s.next_step(&mut BytesMut::from(&hello()[..]), None), None);
    }

    #[test]
    fn rejected_frame_gets_an_error_and_the_stream_goes_on() {
        let mut s = session();
        let mut buf = hello();
        s.next_step(&mut buf, None);
        // 101 ops: over ops_per_frame_max, but well framed.
        buf.extend_from_slice(&request(5, vec![RequestOp::Ping; 101]));
        buf.extend_from_slice(&request(6, vec![RequestOp::Ping]));
        let Some(Step::Send(err)) = s.next_step(&mut buf, None) else {
            panic!()
        };
        let ServerFrame::Error(e) = server_frame(&err) else {
            panic!()
        };
        assert_eq!(
            (e.id, e.status, e.close),
            (Some(5), Status::TooManyOps, false)
        );
        let Some(Step::Run { request, .. }) = s.next_step(&mut buf, None) else {
            panic!()
        };
        assert_eq!(request.id, 6);
    }

    #[test]
    fn huge_length_prefix_closes_without_buffering() {
        let mut s = session();
        let mut buf = hello();
        s.next_step(&mut buf, None);
        buf.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(s.bytes_wanted(&buf) <= limits().frame_bytes_max as usize);
        let Some(Step::Close {
            reply: Some(err),
            reason,
        }) = s.next_step(&mut buf, None)
        else {
            panic!()
        };
        assert_eq!(reason, CloseReason::ProtocolError);
        let ServerFrame::Error(e) = server_frame(&err) else {
            panic!()
        };
        assert_eq!((e.status, e.close), (Status::FrameTooLarge, true));
    }

    #[test]
    fn refusing_answers_shutting_down_with_the_request_id() {
        let mut s = session();
        let mut buf = hello();
        s.next_step(&mut buf, None);
        buf.extend_from_slice(&request(9, vec![RequestOp::Ping]));
        let Some(Step::Send(err)) = s.next_step(&mut buf, Some(Status::ShuttingDown)) else {
            panic!()
        };
        let ServerFrame::Error(e) = server_frame(&err) else {
            panic!()
        };
        assert_eq!(
            (e.id, e.status, e.close),
            (Some(9), Status::ShuttingDown, false)
        );
    }

    #[test]
    fn bytes_wanted_follows_the_length_prefix() {
        let mut s = session();
        let mut buf = hello();
        assert_eq!(s.bytes_wanted(&buf[..3]), HELLO_BYTES);
        s.next_step(&mut buf, None);
        let frame = request(
            1,
            vec![RequestOp::Put {
                key: Bytes::from_static(b"k"),
                value: Bytes::from(vec![1u8; 500]),
            }],
        );
        assert_eq!(s.bytes_wanted(&frame[..2]), LEN_PREFIX_BYTES);
        assert_eq!(s.bytes_wanted(&frame[..10]), frame.len());
    }
}
