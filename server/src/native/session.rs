//! The server side of one connection's byte stream, as a pure state machine:
//! bytes in, [`Step`]s out (send these bytes, run this request, close). No
//! sockets, no runtime, no clock — so it can be fuzzed and tested directly.
//!
//! What must hold, for ANY input bytes, split at ANY points:
//! - it never panics, and never asks to buffer more than the frame limit
//!   ([`Session::bytes_wanted`] is at most `frame_bytes_max`);
//! - the first message must be a valid hello (with its auth block when the
//!   hello says one follows), answered by the hello-ack; a bad hello or a
//!   refused password is answered by a refusal and a close;
//! - before the handshake is accepted it never asks for more than
//!   [`HANDSHAKE_BYTES_MAX`] bytes, and no request is decoded or run;
//! - a request with an operation the connection's user may not run
//!   (`acl::native_category`) is refused as a whole with an ERROR frame
//!   (NO_PERMISSION; BAD_REQUEST on connections older than version 4) and
//!   never reaches [`Step::Run`], so no write path can skip the check;
//! - after the handshake, each complete frame yields exactly one step in
//!   stream order: a request to run, or an ERROR frame for a rejected one;
//! - an error the stream cannot recover from (bad length, checksum) yields
//!   one final ERROR frame with the CLOSE flag and then nothing more.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use ringkv_protocol::{
    check_frame, decode_auth, decode_hello, decode_request_version, decode_user, encode_error,
    encode_hello_ack, DecodeError, ErrorFrame, Hello, HelloAck, Limits, Request, ServerInfo,
    Status, AUTH_LEN_BYTES, HELLO_BYTES, LEN_PREFIX_BYTES, PASSWORD_BYTES_MAX, PROTOCOL_VERSION,
    USER_LEN_BYTES, USER_NAME_BYTES_MAX,
};

use crate::acl::{self, Identity};
use crate::auth::{Authenticator, Verdict};

/// Most bytes a connection's handshake may occupy: the hello, the longest
/// user block and the longest auth block. Before the handshake is accepted
/// the server reads no more than this (plus one small read) from the client.
pub const HANDSHAKE_BYTES_MAX: usize =
    HELLO_BYTES + USER_LEN_BYTES + USER_NAME_BYTES_MAX + AUTH_LEN_BYTES + PASSWORD_BYTES_MAX;

/// The first protocol version that has the status NO_PERMISSION; older
/// connections are refused with BAD_REQUEST (a status they know).
const NO_PERMISSION_SINCE: u16 = 4;

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
    /// The handshake was refused for its password: none given to a server
    /// that has one, a wrong one, or one given to a server without.
    AuthFailed,
    /// The handshake (TLS included) did not finish within
    /// `server.handshake_timeout`.
    HandshakeTimeout,
    /// The TLS handshake failed or a TLS record was bad.
    TlsError,
}

impl CloseReason {
    pub const ALL: [CloseReason; 10] = [
        CloseReason::PeerClosed,
        CloseReason::IdleTimeout,
        CloseReason::BadHandshake,
        CloseReason::ProtocolError,
        CloseReason::IoError,
        CloseReason::Shutdown,
        CloseReason::TooManyConnections,
        CloseReason::AuthFailed,
        CloseReason::HandshakeTimeout,
        CloseReason::TlsError,
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
            CloseReason::AuthFailed => "auth_failed",
            CloseReason::HandshakeTimeout => "handshake_timeout",
            CloseReason::TlsError => "tls_error",
        }
    }

    pub const fn index(self) -> usize {
        self as usize
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    AwaitHello,
    /// The hello (of this version) announced a user block, then an auth block.
    AwaitUser {
        version: u16,
    },
    /// The hello (of this version) announced an auth block.
    AwaitAuth {
        version: u16,
    },
    Ready,
    Closed,
}

/// Decoding state of one connection.
#[derive(Debug)]
pub struct Session {
    phase: Phase,
    limits: Limits,
    /// The encoded hello-ack (version [`PROTOCOL_VERSION`]), the same for
    /// every connection of a server.
    hello_ack: Bytes,
    /// The server's password check.
    auth: Arc<Authenticator>,
    /// The last decode error that closed the stream, for the close log line.
    last_error: Option<DecodeError>,
    /// Why the last handshake was refused for its password, for the log.
    auth_refusal: Option<Verdict>,
    /// The protocol version the handshake settled on: requests are decoded
    /// as that version defines them (a later version's opcode is refused).
    version: u16,
    /// The user name of the hello's user block, until the password is in.
    pending_user: Option<Bytes>,
    /// Who the client is once the handshake is accepted.
    identity: Identity,
}

impl Session {
    /// A session that answers a valid hello with `hello_ack` (already
    /// encoded) and enforces `limits` on every frame; no password.
    pub fn new(limits: Limits, hello_ack: Bytes) -> Session {
        Session::with_auth(limits, hello_ack, Arc::new(Authenticator::open()))
    }

    /// Like [`Session::new`], with the handshake judged by `auth`.
    pub fn with_auth(limits: Limits, hello_ack: Bytes, auth: Arc<Authenticator>) -> Session {
        let identity = auth.default_identity().clone();
        Session {
            phase: Phase::AwaitHello,
            limits,
            hello_ack,
            auth,
            last_error: None,
            auth_refusal: None,
            version: PROTOCOL_VERSION,
            pending_user: None,
            identity,
        }
    }

    /// Who the client is (the `default` user until a handshake naming
    /// another is accepted).
    pub fn identity(&self) -> &Identity {
        &self.identity
    }

    /// Why the handshake was refused for its password, if it was.
    pub fn auth_refusal(&self) -> Option<Verdict> {
        self.auth_refusal
    }

    /// A session that accepts a valid hello on behalf of `server`,
    /// advertising `limits` (which it also enforces).
    pub fn accepting(limits: Limits, server: ServerInfo) -> Session {
        Session::new(limits, accepted_hello_ack(limits, server))
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The protocol version of the connection (the latest until the
    /// handshake is accepted).
    pub fn version(&self) -> u16 {
        self.version
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
                Ok(Some(hello)) if hello.has_user() => {
                    self.phase = Phase::AwaitUser {
                        version: hello.version,
                    };
                    self.next_step(buf, refuse)
                }
                Ok(Some(hello)) if hello.has_auth() => {
                    self.phase = Phase::AwaitAuth {
                        version: hello.version,
                    };
                    self.next_step(buf, refuse)
                }
                Ok(Some(hello)) => Some(self.authenticate(buf, hello, None)),
                Err(error) => Some(self.refuse_hello(buf, error)),
            },
            Phase::AwaitUser { version } => match decode_user(buf) {
                Ok(None) => None,
                Ok(Some(user)) => {
                    self.pending_user = Some(user);
                    self.phase = Phase::AwaitAuth { version };
                    self.next_step(buf, refuse)
                }
                Err(error) => Some(self.refuse_hello(buf, error)),
            },
            Phase::AwaitAuth { version } => match decode_auth(buf) {
                Ok(None) => None,
                Ok(Some(password)) => {
                    let hello = Hello {
                        version,
                        flags: ringkv_protocol::hello_flags::AUTH,
                    };
                    Some(self.authenticate(buf, hello, Some(&password)))
                }
                Err(error) => Some(self.refuse_hello(buf, error)),
            },
            Phase::Ready => {
                // Read the frame size before decoding consumes it (the
                // prefix is only trusted once decode_request accepted it).
                let frame_bytes = buf
                    .first_chunk::<LEN_PREFIX_BYTES>()
                    .map(|p| LEN_PREFIX_BYTES + u32::from_le_bytes(*p) as usize);
                match decode_request_version(buf, &self.limits, self.version) {
                    Ok(None) => None,
                    Ok(Some(request)) => {
                        let frame_bytes = frame_bytes.unwrap_or(0);
                        if let Some(refusal) = self.refuse_by_role(&request) {
                            return Some(Step::Send(refusal));
                        }
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

    /// The ERROR frame refusing `request` when an operation of it is not
    /// for this connection's role; `None` when every one is.
    fn refuse_by_role(&self, request: &Request) -> Option<Bytes> {
        let (index, op) = acl::first_refused(self.identity.role, &request.ops)?;
        let status = if self.version >= NO_PERMISSION_SINCE {
            Status::NoPermission
        } else {
            Status::BadRequest
        };
        let message = format!(
            "NOPERM user '{}' ({}) has no permission to run {} (operation {index}); \
             nothing of this request was applied",
            self.identity.user,
            self.identity.role.name(),
            ringkv_protocol::opcode::name(op.opcode()).unwrap_or("this operation"),
        );
        Some(error_frame(Some(request.id), status, message, false))
    }

    fn refuse_hello(&mut self, buf: &mut BytesMut, error: DecodeError) -> Step {
        let reply = HelloAck::refusal_for(&error).map(|ack| encode_ack(&ack));
        self.close(buf, error, reply, CloseReason::BadHandshake)
    }

    /// Ends the handshake of `hello` (which carried `password`, if any):
    /// the accepting ack, or a refusal and a close.
    fn authenticate(&mut self, buf: &mut BytesMut, hello: Hello, password: Option<&[u8]>) -> Step {
        let user = self.pending_user.take();
        let verdict = if hello.version < 2 && self.auth.is_required() {
            // Version 1 cannot carry a password nor name AUTH_REQUIRED.
            self.auth.check(None);
            None
        } else {
            let (verdict, identity) = self.auth.check_user(user.as_deref(), password);
            if let Some(identity) = identity {
                self.identity = identity;
            }
            Some(verdict)
        };
        let (status, message) = match verdict {
            Some(Verdict::Accepted) => {
                self.phase = Phase::Ready;
                self.version = hello.version;
                let ack = if hello.version == PROTOCOL_VERSION {
                    self.hello_ack.clone()
                } else {
                    // The ack names the client's version; the version field
                    // is outside the body checksum.
                    let mut ack = BytesMut::from(&self.hello_ack[..]);
                    ack[4..6].copy_from_slice(&hello.version.to_le_bytes());
                    ack.freeze()
                };
                return Step::Send(ack);
            }
            None => (
                Status::Unsupported,
                "this server requires a password, which protocol version 1 cannot carry; \
                 connect with protocol version 2 and send the password in the hello"
                    .to_string(),
            ),
            Some(Verdict::Required) => (
                Status::AuthRequired,
                "authentication required: this server has a password; \
                 send it in the hello (protocol version 2, flag AUTH)"
                    .to_string(),
            ),
            Some(Verdict::WrongPassword) => (
                Status::AuthFailed,
                "authentication failed: wrong password (or unknown user)".to_string(),
            ),
            Some(Verdict::NoPasswordConfigured) => (
                Status::AuthFailed,
                "authentication failed: this server has no password configured; \
                 is the client talking to the right server?"
                    .to_string(),
            ),
        };
        self.auth_refusal = Some(verdict.unwrap_or(Verdict::Required));
        self.phase = Phase::Closed;
        buf.clear();
        let reply = encode_ack(&HelloAck::Refused {
            version: PROTOCOL_VERSION,
            status,
            message,
        });
        Step::Close {
            reply: Some(reply),
            reason: CloseReason::AuthFailed,
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
            Phase::AwaitUser { .. } => match buf.first_chunk::<USER_LEN_BYTES>() {
                Some(prefix) => {
                    USER_LEN_BYTES + (u16::from_le_bytes(*prefix) as usize).min(USER_NAME_BYTES_MAX)
                }
                None => USER_LEN_BYTES,
            },
            Phase::AwaitAuth { .. } => match buf.first_chunk::<AUTH_LEN_BYTES>() {
                Some(prefix) => {
                    AUTH_LEN_BYTES + (u16::from_le_bytes(*prefix) as usize).min(PASSWORD_BYTES_MAX)
                }
                None => AUTH_LEN_BYTES,
            },
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

fn encode_ack(ack: &HelloAck) -> Bytes {
    let mut out = BytesMut::new();
    encode_hello_ack(ack, &mut out);
    out.freeze()
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
    fn a_version_2_connection_refuses_version_3_opcodes() {
        for version in [1u16, 2] {
            let mut s = session();
            let mut buf = BytesMut::new();
            encode_hello(&Hello { version, flags: 0 }, &mut buf);
            let Some(Step::Send(_ack)) = s.next_step(&mut buf, None) else {
                panic!()
            };
            assert_eq!(s.version(), version);
            buf.extend_from_slice(&request(
                7,
                vec![RequestOp::Ttl {
                    key: Bytes::from_static(b"k"),
                }],
            ));
            buf.extend_from_slice(&request(8, vec![RequestOp::Ping]));
            let Some(Step::Send(err)) = s.next_step(&mut buf, None) else {
                panic!()
            };
            let ServerFrame::Error(e) = server_frame(&err) else {
                panic!()
            };
            assert_eq!(
                (e.id, e.status, e.close),
                (Some(7), Status::Unsupported, false)
            );
            assert!(
                e.message.contains(&format!(
                    "needs protocol version 3; this connection speaks version {version}"
                )),
                "{}",
                e.message
            );
            let Some(Step::Run { request, .. }) = s.next_step(&mut buf, None) else {
                panic!()
            };
            assert_eq!(request.id, 8);
        }
        // The same frame on a version 3 connection runs.
        let mut s = session();
        let mut buf = hello();
        s.next_step(&mut buf, None);
        assert_eq!(s.version(), PROTOCOL_VERSION);
        buf.extend_from_slice(&request(
            9,
            vec![RequestOp::Ttl {
                key: Bytes::from_static(b"k"),
            }],
        ));
        assert!(matches!(
            s.next_step(&mut buf, None),
            Some(Step::Run { .. })
        ));
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

    fn password_session() -> Session {
        let pw = |p: &[u8]| crate::auth::Password::new(p, "test").unwrap();
        let auth = Authenticator::with_users(
            Some(pw(b"pw")),
            crate::acl::Role::Admin,
            vec![(
                "reader".to_string(),
                pw(b"r-pw"),
                crate::acl::Role::ReadOnly,
            )],
            std::time::Duration::ZERO,
        );
        Session::with_auth(
            limits(),
            accepted_hello_ack(
                limits(),
                ServerInfo {
                    server_id: 7,
                    shard_count: 2,
                    server_name: "test".into(),
                },
            ),
            Arc::new(auth),
        )
    }

    fn hello_with(password: &[u8]) -> BytesMut {
        let mut b = BytesMut::new();
        encode_hello(&Hello::with_password(), &mut b);
        ringkv_protocol::encode_auth(password, &mut b);
        b
    }

    fn hello_as(user: &[u8], password: &[u8], version: u16) -> BytesMut {
        let mut b = BytesMut::new();
        let flags = ringkv_protocol::hello_flags::AUTH | ringkv_protocol::hello_flags::USER;
        encode_hello(&Hello { version, flags }, &mut b);
        ringkv_protocol::encode_user(user, &mut b);
        ringkv_protocol::encode_auth(password, &mut b);
        b
    }

    fn sent_error(step: Option<Step>) -> ErrorFrame {
        let Some(Step::Send(bytes)) = step else {
            panic!("expected an ERROR frame, got {step:?}")
        };
        match server_frame(&bytes) {
            ServerFrame::Error(e) => e,
            other => panic!("expected an ERROR frame, got {other:?}"),
        }
    }

    #[test]
    fn a_read_only_user_is_refused_every_write_before_it_runs() {
        let mut s = password_session();
        let mut buf = hello_as(b"reader", b"r-pw", PROTOCOL_VERSION);
        assert!(matches!(s.next_step(&mut buf, None), Some(Step::Send(_))));
        assert!(s.is_ready());
        assert_eq!(&*s.identity().user, "reader");
        let k = || Bytes::from_static(b"k");
        let reads = vec![
            RequestOp::Get { key: k() },
            RequestOp::Ping,
            RequestOp::Stats,
        ];
        buf.extend_from_slice(&request(1, reads));
        assert!(matches!(
            s.next_step(&mut buf, None),
            Some(Step::Run { .. })
        ));
        for (id, op) in [
            RequestOp::Put {
                key: k(),
                value: k(),
            },
            RequestOp::Delete { key: k() },
            RequestOp::Expire {
                key: k(),
                expires_at_ms: 0,
            },
            RequestOp::Begin,
            RequestOp::Commit,
        ]
        .into_iter()
        .enumerate()
        {
            let id = id as u64 + 2;
            buf.extend_from_slice(&request(id, vec![RequestOp::Get { key: k() }, op]));
            let e = sent_error(s.next_step(&mut buf, None));
            assert_eq!(
                (e.id, e.status, e.close),
                (Some(id), Status::NoPermission, false)
            );
            assert!(
                e.message.contains("NOPERM user 'reader' (read-only)"),
                "{}",
                e.message
            );
        }
        // The connection goes on.
        buf.extend_from_slice(&request(9, vec![RequestOp::Ping]));
        assert!(matches!(
            s.next_step(&mut buf, None),
            Some(Step::Run { .. })
        ));

        // The default user (admin) runs writes.
        let mut s = password_session();
        let mut buf = hello_with(b"pw");
        buf.extend_from_slice(&request(
            1,
            vec![RequestOp::Put {
                key: k(),
                value: k(),
            }],
        ));
        assert!(matches!(s.next_step(&mut buf, None), Some(Step::Send(_))));
        assert_eq!(&*s.identity().user, "default");
        assert!(matches!(
            s.next_step(&mut buf, None),
            Some(Step::Run { .. })
        ));

        // A wrong password or an unknown user is refused in the handshake.
        for (user, pw) in [(&b"reader"[..], &b"pw"[..]), (b"nobody", b"r-pw")] {
            let mut s = password_session();
            let mut buf = hello_as(user, pw, PROTOCOL_VERSION);
            assert_eq!(
                refusal(s.next_step(&mut buf, None)),
                (Status::AuthFailed, CloseReason::AuthFailed)
            );
        }
    }

    #[test]
    fn an_old_connection_of_a_limited_default_user_gets_bad_request() {
        let auth = Authenticator::with_users(
            None,
            crate::acl::Role::ReadOnly,
            Vec::new(),
            std::time::Duration::ZERO,
        );
        let mut s = Session::with_auth(
            limits(),
            password_session().hello_ack.clone(),
            Arc::new(auth),
        );
        let mut buf = BytesMut::new();
        encode_hello(
            &Hello {
                version: 3,
                flags: 0,
            },
            &mut buf,
        );
        assert!(matches!(s.next_step(&mut buf, None), Some(Step::Send(_))));
        let k = Bytes::from_static(b"k");
        buf.extend_from_slice(&request(4, vec![RequestOp::Delete { key: k }]));
        let e = sent_error(s.next_step(&mut buf, None));
        assert_eq!((e.id, e.status), (Some(4), Status::BadRequest));
        assert!(e.message.starts_with("NOPERM"), "{}", e.message);
    }

    fn refusal(step: Option<Step>) -> (Status, CloseReason) {
        let Some(Step::Close {
            reply: Some(reply),
            reason,
        }) = step
        else {
            panic!("expected a close, got {step:?}")
        };
        let Ok(Some(HelloAck::Refused { status, .. })) =
            decode_hello_ack(&mut BytesMut::from(&reply[..]))
        else {
            panic!("expected a refusal")
        };
        (status, reason)
    }

    #[test]
    fn the_password_decides_the_handshake() {
        let mut s = password_session();
        let mut buf = hello_with(b"pw");
        buf.extend_from_slice(&request(1, vec![RequestOp::Ping]));
        assert!(matches!(s.next_step(&mut buf, None), Some(Step::Send(_))));
        assert!(s.is_ready());
        assert!(matches!(
            s.next_step(&mut buf, None),
            Some(Step::Run { .. })
        ));

        let mut s = password_session();
        let mut buf = hello_with(b"pW");
        buf.extend_from_slice(&request(1, vec![RequestOp::Ping]));
        assert_eq!(
            refusal(s.next_step(&mut buf, None)),
            (Status::AuthFailed, CloseReason::AuthFailed)
        );
        assert_eq!(s.auth_refusal(), Some(Verdict::WrongPassword));
        assert!(buf.is_empty(), "nothing after a refusal is kept");
        assert_eq!(s.next_step(&mut buf, None), None);

        let mut s = password_session();
        let mut buf = hello();
        buf.extend_from_slice(&request(1, vec![RequestOp::Ping]));
        assert_eq!(
            refusal(s.next_step(&mut buf, None)),
            (Status::AuthRequired, CloseReason::AuthFailed)
        );

        let mut s = password_session();
        let mut buf = BytesMut::new();
        encode_hello(
            &Hello {
                version: 1,
                flags: 0,
            },
            &mut buf,
        );
        assert_eq!(
            refusal(s.next_step(&mut buf, None)),
            (Status::Unsupported, CloseReason::AuthFailed)
        );
    }

    #[test]
    fn the_handshake_never_asks_for_more_than_its_budget() {
        let mut s = password_session();
        let full = hello_as(
            &[b'u'; USER_NAME_BYTES_MAX],
            &[b'x'; PASSWORD_BYTES_MAX],
            PROTOCOL_VERSION,
        );
        assert_eq!(full.len(), HANDSHAKE_BYTES_MAX);
        for cut in 0..full.len() {
            let mut buf = BytesMut::from(&full[..cut]);
            let _ = s.next_step(&mut buf, None);
            assert!(
                s.bytes_wanted(&buf) <= HANDSHAKE_BYTES_MAX,
                "after {cut} bytes"
            );
            assert!(!s.is_ready());
            s = password_session();
        }
        // A huge announced password is refused from its two length bytes.
        let mut buf = BytesMut::new();
        encode_hello(&Hello::with_password(), &mut buf);
        buf.extend_from_slice(&u16::MAX.to_le_bytes());
        assert_eq!(
            refusal(s.next_step(&mut buf, None)),
            (Status::BadRequest, CloseReason::BadHandshake)
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
