//! The handshake: the client's 8-byte hello (from version 2 on optionally
//! followed by an auth block carrying a password, from version 4 on by a
//! user block naming the user before it) and the server's hello-ack
//! with its limits and identity (or a refusal with a status and message).
//! Both start with the magic `RKV1` and the version, which every protocol
//! version keeps at the same place, so any two versions can tell each other
//! apart.

use bytes::{BufMut, Bytes, BytesMut};

use super::error::{DecodeError, FrameFault};
use super::frame::{truncate_utf8, wire_len, Cursor};
use super::limits::Limits;
use super::wire::{
    hello_flags, Status, AUTH_LEN_BYTES, HELLO_ACK_BODY_BYTES_MAX, HELLO_ACK_PREFIX_BYTES,
    HELLO_BYTES, MAGIC, MESSAGE_BYTES_MAX, PASSWORD_BYTES_MAX, PROTOCOL_VERSION,
    PROTOCOL_VERSION_MIN, SERVER_NAME_BYTES_MAX, USER_LEN_BYTES, USER_NAME_BYTES_MAX,
};

/// The first message on a connection, client to server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    /// The protocol version the client wants to speak.
    pub version: u16,
    /// Features the client requires: version 1 defines none; versions 2 and
    /// later define [`hello_flags::AUTH`] (an auth block follows the hello).
    pub flags: u16,
}

impl Hello {
    /// The hello of this crate: version [`PROTOCOL_VERSION`], no flags.
    pub const fn current() -> Hello {
        Hello {
            version: PROTOCOL_VERSION,
            flags: 0,
        }
    }

    /// The hello of this crate announcing a password: version
    /// [`PROTOCOL_VERSION`] with [`hello_flags::AUTH`]; send it with
    /// [`encode_auth`] right after.
    pub const fn with_password() -> Hello {
        Hello {
            version: PROTOCOL_VERSION,
            flags: hello_flags::AUTH,
        }
    }

    /// The hello of this crate announcing a user name and a password:
    /// version [`PROTOCOL_VERSION`] with [`hello_flags::AUTH`] and
    /// [`hello_flags::USER`]; send [`encode_user`] then [`encode_auth`].
    pub const fn with_user() -> Hello {
        Hello {
            version: PROTOCOL_VERSION,
            flags: hello_flags::AUTH | hello_flags::USER,
        }
    }

    /// Whether an auth block follows this hello.
    pub const fn has_auth(&self) -> bool {
        self.flags & hello_flags::AUTH != 0
    }

    /// Whether a user block follows this hello (before its auth block).
    pub const fn has_user(&self) -> bool {
        self.flags & hello_flags::USER != 0
    }
}

/// The flag bits protocol `version` defines for a hello.
const fn known_hello_flags(version: u16) -> u16 {
    if version >= 4 {
        hello_flags::KNOWN_V4
    } else if version >= 2 {
        hello_flags::KNOWN_V2
    } else {
        0
    }
}

/// Who the client is talking to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerInfo {
    /// Identifies the server instance (e.g. of its data directory).
    pub server_id: u64,
    /// Number of shards the keyspace is split over.
    pub shard_count: u32,
    /// Software name and version, e.g. `ringkv-server 0.1.0`; at most
    /// [`SERVER_NAME_BYTES_MAX`] bytes once encoded.
    pub server_name: String,
}

/// The server's answer to a hello.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HelloAck {
    /// The server speaks `version` (the client's) and enforces `limits`.
    Accepted {
        version: u16,
        limits: Limits,
        server: ServerInfo,
    },
    /// The server refuses the connection and then closes it. `version` is the
    /// highest version the server speaks, so a client may retry with it.
    Refused {
        version: u16,
        status: Status,
        message: String,
    },
}

impl HelloAck {
    /// The refusal a server sends when [`decode_hello`] fails. `None` for
    /// `NeedMore`, which is not an error.
    pub fn refusal_for(error: &DecodeError) -> Option<HelloAck> {
        if let DecodeError::NeedMore { .. } = error {
            return None;
        }
        Some(HelloAck::Refused {
            version: PROTOCOL_VERSION,
            status: error.status(),
            message: error.to_string(),
        })
    }
}

/// Appends a hello to `buf`.
pub fn encode_hello(hello: &Hello, buf: &mut BytesMut) {
    buf.put_slice(&MAGIC);
    buf.put_u16_le(hello.version);
    buf.put_u16_le(hello.flags);
}

/// Appends the auth block that follows a hello with [`hello_flags::AUTH`]:
/// the password's length as a `u16`, then its bytes. Panics unless the
/// password is 1..=[`PASSWORD_BYTES_MAX`] bytes.
pub fn encode_auth(password: &[u8], buf: &mut BytesMut) {
    assert!(
        (1..=PASSWORD_BYTES_MAX).contains(&password.len()),
        "a password is 1..={PASSWORD_BYTES_MAX} bytes, got {}",
        password.len()
    );
    buf.put_u16_le(password.len() as u16); // <= PASSWORD_BYTES_MAX < u16::MAX
    buf.put_slice(password);
}

/// Appends the user block that follows a hello with [`hello_flags::USER`]
/// (before its auth block): the name's length as a `u16`, then its bytes.
/// Panics unless the name is 1..=[`USER_NAME_BYTES_MAX`] bytes.
pub fn encode_user(user: &[u8], buf: &mut BytesMut) {
    assert!(
        (1..=USER_NAME_BYTES_MAX).contains(&user.len()),
        "a user name is 1..={USER_NAME_BYTES_MAX} bytes, got {}",
        user.len()
    );
    buf.put_u16_le(user.len() as u16); // <= USER_NAME_BYTES_MAX < u16::MAX
    buf.put_slice(user);
}

/// Removes a user block from the front of `buf` and returns the name.
/// `Ok(None)`: incomplete. Like [`decode_auth`], the length is checked
/// before its bytes are waited for; every `Err` means: send
/// [`HelloAck::refusal_for`] and close.
pub fn decode_user(buf: &mut BytesMut) -> Result<Option<Bytes>, DecodeError> {
    let Some(prefix) = buf.first_chunk::<USER_LEN_BYTES>() else {
        return Ok(None);
    };
    let len = u16::from_le_bytes(*prefix) as usize;
    if !(1..=USER_NAME_BYTES_MAX).contains(&len) {
        return Err(DecodeError::BadUserLength {
            len,
            max: USER_NAME_BYTES_MAX,
        });
    }
    if buf.len() < USER_LEN_BYTES + len {
        return Ok(None);
    }
    let _ = buf.split_to(USER_LEN_BYTES);
    Ok(Some(buf.split_to(len).freeze()))
}

/// Removes an auth block from the front of `buf` and returns the password.
/// `Ok(None)`: incomplete. The length is checked before its bytes are waited
/// for, so a peer can make the receiver buffer at most
/// [`AUTH_LEN_BYTES`] + [`PASSWORD_BYTES_MAX`] bytes. Every `Err` means:
/// send [`HelloAck::refusal_for`] and close.
pub fn decode_auth(buf: &mut BytesMut) -> Result<Option<Bytes>, DecodeError> {
    let Some(prefix) = buf.first_chunk::<AUTH_LEN_BYTES>() else {
        return Ok(None);
    };
    let len = u16::from_le_bytes(*prefix) as usize;
    if !(1..=PASSWORD_BYTES_MAX).contains(&len) {
        return Err(DecodeError::BadPasswordLength {
            len,
            max: PASSWORD_BYTES_MAX,
        });
    }
    if buf.len() < AUTH_LEN_BYTES + len {
        return Ok(None);
    }
    let _ = buf.split_to(AUTH_LEN_BYTES);
    Ok(Some(buf.split_to(len).freeze()))
}

/// Removes a hello from the front of `buf`.
///
/// Wrong magic is reported as soon as the first differing byte arrives. A
/// version outside [`PROTOCOL_VERSION_MIN`]..=[`PROTOCOL_VERSION`] or a flag
/// bit that version does not define is an error. Every `Err` means: send
/// [`HelloAck::refusal_for`] and close. A hello with [`Hello::has_auth`] is
/// followed by an auth block ([`decode_auth`]).
pub fn decode_hello(buf: &mut BytesMut) -> Result<Option<Hello>, DecodeError> {
    check_magic(buf)?;
    if buf.len() < HELLO_BYTES {
        return Ok(None);
    }
    let version = u16::from_le_bytes([buf[4], buf[5]]);
    let flags = u16::from_le_bytes([buf[6], buf[7]]);
    if !(PROTOCOL_VERSION_MIN..=PROTOCOL_VERSION).contains(&version) {
        return Err(DecodeError::UnsupportedVersion {
            got: version,
            min: PROTOCOL_VERSION_MIN,
            max: PROTOCOL_VERSION,
        });
    }
    let known = known_hello_flags(version);
    // A user name without a password is not a way to log in.
    let user_alone = flags & hello_flags::USER != 0 && flags & hello_flags::AUTH == 0;
    if flags & !known != 0 || user_alone {
        return Err(DecodeError::UnsupportedFlags {
            flags,
            version,
            known,
        });
    }
    let _ = buf.split_to(HELLO_BYTES);
    Ok(Some(Hello { version, flags }))
}

fn check_magic(buf: &[u8]) -> Result<(), DecodeError> {
    let seen = buf.len().min(MAGIC.len());
    if buf[..seen] != MAGIC[..seen] {
        return Err(DecodeError::BadMagic {
            got: buf[..seen].to_vec(),
        });
    }
    Ok(())
}

/// Appends a hello-ack to `buf`. Texts are cut to their limits. Panics if a
/// refusal carries a non-error status.
pub fn encode_hello_ack(ack: &HelloAck, buf: &mut BytesMut) {
    let mut body = BytesMut::with_capacity(64);
    let (version, status) = match ack {
        HelloAck::Accepted {
            version,
            limits,
            server,
        } => {
            body.put_u32_le(limits.frame_bytes_max);
            body.put_u32_le(limits.ops_per_frame_max);
            body.put_u32_le(limits.key_bytes_max);
            body.put_u32_le(limits.value_bytes_max);
            body.put_u32_le(limits.pipeline_depth_max);
            body.put_u32_le(server.shard_count);
            body.put_u64_le(server.server_id);
            let name = truncate_utf8(&server.server_name, SERVER_NAME_BYTES_MAX);
            body.put_u16_le(name.len() as u16); // <= SERVER_NAME_BYTES_MAX < u16::MAX
            body.put_slice(name.as_bytes());
            (*version, Status::Ok)
        }
        HelloAck::Refused {
            version,
            status,
            message,
        } => {
            assert!(status.is_error(), "hello refusal with status {status}");
            let message = truncate_utf8(message, MESSAGE_BYTES_MAX);
            body.put_u16_le(message.len() as u16); // <= MESSAGE_BYTES_MAX < u16::MAX
            body.put_slice(message.as_bytes());
            (*version, *status)
        }
    };
    assert!(body.len() <= HELLO_ACK_BODY_BYTES_MAX);
    buf.put_slice(&MAGIC);
    buf.put_u16_le(version);
    buf.put_u8(status.code());
    buf.put_u8(0);
    buf.put_u32_le(wire_len(body.len(), "hello-ack body"));
    buf.put_u32_le(crc32fast::hash(&body));
    buf.put_slice(&body);
}

/// Removes a hello-ack from the front of `buf`. `Ok(None)`: incomplete. Any
/// `Err` means the peer is not a usable ringkv server.
///
/// An accepted ack's limits are validated ([`Limits::validate`]); its version
/// is returned as sent, and the caller checks it is one it speaks.
pub fn decode_hello_ack(buf: &mut BytesMut) -> Result<Option<HelloAck>, DecodeError> {
    check_magic(buf)?;
    if buf.len() < HELLO_ACK_PREFIX_BYTES {
        return Ok(None);
    }
    let version = u16::from_le_bytes([buf[4], buf[5]]);
    let status_code = buf[6];
    let reserved = buf[7];
    let body_len = u32::from_le_bytes([buf[8], buf[9], buf[10], buf[11]]) as usize;
    let stored = u32::from_le_bytes([buf[12], buf[13], buf[14], buf[15]]);
    if body_len > HELLO_ACK_BODY_BYTES_MAX {
        return Err(DecodeError::AckTooLarge {
            len: body_len,
            max: HELLO_ACK_BODY_BYTES_MAX,
        });
    }
    let total = HELLO_ACK_PREFIX_BYTES + body_len;
    if buf.len() < total {
        return Ok(None);
    }
    let computed = crc32fast::hash(&buf[HELLO_ACK_PREFIX_BYTES..total]);
    if stored != computed {
        return Err(DecodeError::ChecksumMismatch { stored, computed });
    }
    if reserved != 0 {
        return Err(DecodeError::BadAck(FrameFault::ReservedBits {
            what: "hello-ack byte",
            offset: 7,
            got: reserved,
        }));
    }
    let status =
        Status::from_code(status_code).ok_or(DecodeError::BadAck(FrameFault::UnknownStatus {
            index: 0,
            code: status_code,
        }))?;
    let frame: Bytes = buf.split_to(total).freeze();
    let mut cursor = Cursor::new(&frame, HELLO_ACK_PREFIX_BYTES);
    let ack = parse_ack_body(&mut cursor, version, status).map_err(DecodeError::BadAck)?;
    cursor.finish().map_err(DecodeError::BadAck)?;
    if let HelloAck::Accepted { limits, .. } = &ack {
        limits.validate().map_err(DecodeError::BadLimits)?;
    }
    Ok(Some(ack))
}

fn parse_ack_body(
    cursor: &mut Cursor<'_>,
    version: u16,
    status: Status,
) -> Result<HelloAck, FrameFault> {
    match status {
        Status::Ok => {
            let limits = Limits {
                frame_bytes_max: cursor.u32("frame_bytes_max")?,
                ops_per_frame_max: cursor.u32("ops_per_frame_max")?,
                key_bytes_max: cursor.u32("key_bytes_max")?,
                value_bytes_max: cursor.u32("value_bytes_max")?,
                pipeline_depth_max: cursor.u32("pipeline_depth_max")?,
            };
            let shard_count = cursor.u32("shard_count")?;
            let server_id = cursor.u64("server_id")?;
            let name_len = cursor.u16("server name length")? as usize;
            if name_len > SERVER_NAME_BYTES_MAX {
                return Err(FrameFault::MessageTooLarge {
                    len: name_len,
                    max: SERVER_NAME_BYTES_MAX,
                });
            }
            let server_name = cursor.text(name_len, "server name")?;
            Ok(HelloAck::Accepted {
                version,
                limits,
                server: ServerInfo {
                    server_id,
                    shard_count,
                    server_name,
                },
            })
        }
        status if status.is_error() => {
            let message = cursor.message()?;
            Ok(HelloAck::Refused {
                version,
                status,
                message,
            })
        }
        status => Err(FrameFault::NotAnError { status }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accepted() -> HelloAck {
        HelloAck::Accepted {
            version: 1,
            limits: Limits::default(),
            server: ServerInfo {
                server_id: 42,
                shard_count: 4,
                server_name: "ringkv-server 0.1.0".into(),
            },
        }
    }

    #[test]
    fn hello_round_trips() {
        let mut buf = BytesMut::new();
        encode_hello(&Hello::current(), &mut buf);
        assert_eq!(&buf[..], b"RKV1\x05\x00\x00\x00");
        assert_eq!(decode_hello(&mut buf), Ok(Some(Hello::current())));
        assert!(buf.is_empty());
    }

    #[test]
    fn bad_magic_is_reported_on_the_first_wrong_byte() {
        let mut buf = BytesMut::from(&b"G"[..]);
        assert_eq!(
            decode_hello(&mut buf),
            Err(DecodeError::BadMagic { got: b"G".to_vec() })
        );
        let mut buf = BytesMut::from(&b"RK"[..]);
        assert_eq!(decode_hello(&mut buf), Ok(None));
        let mut buf = BytesMut::from(&b"GET / HTTP/1.1\r\n"[..]);
        let error = decode_hello(&mut buf).unwrap_err();
        assert_eq!(
            error,
            DecodeError::BadMagic {
                got: b"GET ".to_vec()
            }
        );
        assert!(error.to_string().contains("GET "), "{error}");
        let Some(HelloAck::Refused { status, .. }) = HelloAck::refusal_for(&error) else {
            panic!("a bad magic is refused");
        };
        assert_eq!(status, Status::BadRequest);
    }

    #[test]
    fn other_versions_and_flags_are_unsupported() {
        for (version, flags, expected) in [
            (
                6u16,
                0u16,
                DecodeError::UnsupportedVersion {
                    got: 6,
                    min: 1,
                    max: 5,
                },
            ),
            (
                0,
                0,
                DecodeError::UnsupportedVersion {
                    got: 0,
                    min: 1,
                    max: 5,
                },
            ),
            (
                3,
                2,
                DecodeError::UnsupportedFlags {
                    flags: 2,
                    version: 3,
                    known: 1,
                },
            ),
            (
                1,
                1,
                DecodeError::UnsupportedFlags {
                    flags: 1,
                    version: 1,
                    known: 0,
                },
            ),
            (
                2,
                4,
                DecodeError::UnsupportedFlags {
                    flags: 4,
                    version: 2,
                    known: 1,
                },
            ),
            (
                4,
                4,
                DecodeError::UnsupportedFlags {
                    flags: 4,
                    version: 4,
                    known: 3,
                },
            ),
            // USER without AUTH.
            (
                4,
                2,
                DecodeError::UnsupportedFlags {
                    flags: 2,
                    version: 4,
                    known: 3,
                },
            ),
        ] {
            let mut buf = BytesMut::new();
            encode_hello(&Hello { version, flags }, &mut buf);
            let error = decode_hello(&mut buf).unwrap_err();
            assert_eq!(error, expected);
            assert_eq!(error.status(), Status::Unsupported);
            assert!(error.closes_connection());
        }
    }

    #[test]
    fn hello_with_user_round_trips_and_is_bounded() {
        let mut buf = BytesMut::new();
        encode_hello(&Hello::with_user(), &mut buf);
        encode_user(b"reader", &mut buf);
        encode_auth(b"pw", &mut buf);
        let full = buf.clone();
        for cut in HELLO_BYTES..HELLO_BYTES + USER_LEN_BYTES + 6 {
            let mut part = BytesMut::from(&full[..cut]);
            let hello = decode_hello(&mut part).unwrap().unwrap();
            assert!(hello.has_user() && hello.has_auth());
            assert_eq!(decode_user(&mut part), Ok(None), "prefix of {cut} bytes");
        }
        assert_eq!(decode_hello(&mut buf), Ok(Some(Hello::with_user())));
        assert_eq!(
            decode_user(&mut buf),
            Ok(Some(Bytes::from_static(b"reader")))
        );
        assert_eq!(decode_auth(&mut buf), Ok(Some(Bytes::from_static(b"pw"))));
        assert!(buf.is_empty());
        for len in [0u16, USER_NAME_BYTES_MAX as u16 + 1, u16::MAX] {
            let mut buf = BytesMut::from(&len.to_le_bytes()[..]);
            let error = decode_user(&mut buf).unwrap_err();
            assert_eq!(
                error,
                DecodeError::BadUserLength {
                    len: len as usize,
                    max: USER_NAME_BYTES_MAX
                }
            );
            assert_eq!(error.status(), Status::BadRequest);
        }
    }

    #[test]
    fn hello_with_password_round_trips_and_is_bounded() {
        let mut buf = BytesMut::new();
        encode_hello(&Hello::with_password(), &mut buf);
        encode_auth(b"s3cret", &mut buf);
        let full = buf.clone();
        for cut in HELLO_BYTES..full.len() {
            let mut part = BytesMut::from(&full[..cut]);
            let hello = decode_hello(&mut part).unwrap().unwrap();
            assert!(hello.has_auth());
            assert_eq!(decode_auth(&mut part), Ok(None), "prefix of {cut} bytes");
        }
        assert_eq!(decode_hello(&mut buf), Ok(Some(Hello::with_password())));
        assert_eq!(
            decode_auth(&mut buf),
            Ok(Some(Bytes::from_static(b"s3cret")))
        );
        assert!(buf.is_empty());
        for len in [0u16, PASSWORD_BYTES_MAX as u16 + 1, u16::MAX] {
            let mut buf = BytesMut::from(&len.to_le_bytes()[..]);
            let error = decode_auth(&mut buf).unwrap_err();
            assert_eq!(
                error,
                DecodeError::BadPasswordLength {
                    len: len as usize,
                    max: PASSWORD_BYTES_MAX
                }
            );
            assert_eq!(error.status(), Status::BadRequest);
            assert!(error.closes_connection());
        }
    }

    #[test]
    fn acks_round_trip() {
        for ack in [
            accepted(),
            HelloAck::Refused {
                version: 1,
                status: Status::Overloaded,
                message: "too many connections".into(),
            },
        ] {
            let mut buf = BytesMut::new();
            encode_hello_ack(&ack, &mut buf);
            buf.put_slice(b"next");
            assert_eq!(decode_hello_ack(&mut buf), Ok(Some(ack)));
            assert_eq!(&buf[..], b"next");
        }
    }

    #[test]
    fn ack_with_invalid_limits_is_rejected() {
        let HelloAck::Accepted { server, .. } = accepted() else {
            unreachable!()
        };
        let ack = HelloAck::Accepted {
            version: 1,
            limits: Limits {
                pipeline_depth_max: 0,
                ..Limits::default()
            },
            server,
        };
        let mut buf = BytesMut::new();
        encode_hello_ack(&ack, &mut buf);
        assert!(matches!(
            decode_hello_ack(&mut buf),
            Err(DecodeError::BadLimits(_))
        ));
    }

    #[test]
    fn oversized_ack_is_rejected_before_its_body_arrives() {
        let mut buf = BytesMut::new();
        buf.put_slice(b"RKV1\x01\x00\x00\x00");
        buf.put_u32_le(1 << 30);
        buf.put_u32_le(0);
        assert_eq!(
            decode_hello_ack(&mut buf),
            Err(DecodeError::AckTooLarge {
                len: 1 << 30,
                max: HELLO_ACK_BODY_BYTES_MAX
            })
        );
    }

    #[test]
    fn every_prefix_of_an_ack_is_incomplete() {
        let mut full = BytesMut::new();
        encode_hello_ack(&accepted(), &mut full);
        for cut in 0..full.len() {
            let mut buf = BytesMut::from(&full[..cut]);
            assert_eq!(
                decode_hello_ack(&mut buf),
                Ok(None),
                "prefix of {cut} bytes"
            );
            assert_eq!(buf.len(), cut);
        }
    }
}
