//! Why bytes did not decode, and why a request breaks the limits. Each error
//! knows the wire status it maps to and whether the connection survives it:
//! only [`DecodeError::Rejected`] leaves the byte stream in sync.

use super::wire::{Status, MAGIC};

/// A decoder's verdict on bytes that are not a valid message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// Not an error yet: the message is incomplete. Only [`check_frame`]
    /// returns it; the `decode_*` functions return `Ok(None)` instead.
    ///
    /// [`check_frame`]: super::check_frame
    #[error("incomplete message: {have} bytes buffered, {need} needed")]
    NeedMore { have: usize, need: usize },

    /// The peer does not speak this protocol (first bytes are not `RKV1`).
    #[error(
        "bad magic: expected {:02x?} (\"RKV1\"), got {got:02x?} ({:?})",
        MAGIC,
        String::from_utf8_lossy(got)
    )]
    BadMagic { got: Vec<u8> },
    /// The hello asks for a protocol version this side does not speak.
    #[error("protocol version {got} is not supported; this side speaks versions {min}..={max}")]
    UnsupportedVersion { got: u16, min: u16, max: u16 },
    /// The hello sets flag bits its version does not define.
    #[error("hello flags {flags:#06x} are not supported by protocol version {version} (it defines {known:#06x})")]
    UnsupportedFlags {
        flags: u16,
        version: u16,
        known: u16,
    },
    /// The hello's auth block announces an empty password or one over
    /// [`PASSWORD_BYTES_MAX`](super::PASSWORD_BYTES_MAX) bytes.
    #[error("hello password of {len} bytes: a password is 1..={max} bytes")]
    BadPasswordLength { len: usize, max: usize },
    /// The hello's user block announces an empty user name or one over
    /// [`USER_NAME_BYTES_MAX`](super::USER_NAME_BYTES_MAX) bytes.
    #[error("hello user name of {len} bytes: a user name is 1..={max} bytes")]
    BadUserLength { len: usize, max: usize },
    /// A hello-ack announces a body longer than any valid one.
    #[error("hello-ack body of {len} bytes is over the limit of {max}")]
    AckTooLarge { len: usize, max: usize },
    /// A hello-ack's body is malformed.
    #[error("malformed hello-ack: {0}")]
    BadAck(FrameFault),
    /// A hello-ack advertises limits no valid server has.
    #[error("hello-ack advertises invalid limits: {0}")]
    BadLimits(LimitsError),

    /// A length prefix is over `frame_bytes_max` (total frame bytes). Checked
    /// before any byte of the frame body is buffered.
    #[error("frame of {len} bytes is over the limit of {max}")]
    FrameTooLarge { len: u64, max: u32 },
    /// A length prefix is shorter than a frame header.
    #[error("frame length prefix {len} is below the minimum of {min}")]
    FrameTooShort { len: u32, min: u32 },
    /// The stored checksum does not match the bytes. The length prefix cannot
    /// be trusted either, so the stream is out of sync.
    #[error("frame checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    ChecksumMismatch { stored: u32, computed: u32 },

    /// A well-framed message whose content is invalid. The frame has been
    /// removed from the buffer: the stream is still in sync, and a server
    /// answers an ERROR frame with this id and goes on.
    #[error("request {id} rejected: {fault}")]
    Rejected { id: u64, fault: FrameFault },
}

impl DecodeError {
    /// Whether the peer must be disconnected: the stream cannot be resynced or
    /// the handshake failed. False for `NeedMore` and `Rejected`.
    pub fn closes_connection(&self) -> bool {
        !matches!(
            self,
            DecodeError::NeedMore { .. } | DecodeError::Rejected { .. }
        )
    }

    /// The status a server answers with for this error.
    pub fn status(&self) -> Status {
        match self {
            DecodeError::NeedMore { .. } => Status::BadRequest,
            DecodeError::BadMagic { .. }
            | DecodeError::BadPasswordLength { .. }
            | DecodeError::BadUserLength { .. } => Status::BadRequest,
            DecodeError::UnsupportedVersion { .. } | DecodeError::UnsupportedFlags { .. } => {
                Status::Unsupported
            }
            DecodeError::AckTooLarge { .. }
            | DecodeError::BadAck(_)
            | DecodeError::BadLimits(_) => Status::BadRequest,
            DecodeError::FrameTooLarge { .. } => Status::FrameTooLarge,
            DecodeError::FrameTooShort { .. } => Status::BadRequest,
            DecodeError::ChecksumMismatch { .. } => Status::ChecksumMismatch,
            DecodeError::Rejected { fault, .. } => fault.status(),
        }
    }

    /// The id of the rejected request, when the frame was readable.
    pub fn request_id(&self) -> Option<u64> {
        match self {
            DecodeError::Rejected { id, .. } => Some(*id),
            _ => None,
        }
    }
}

/// What is wrong inside a frame (or hello-ack body) whose boundaries are known.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FrameFault {
    /// The kind byte is not one this side accepts.
    #[error("frame kind {kind:#04x} is not accepted here (expected {expected})")]
    UnexpectedKind { kind: u8, expected: &'static str },
    /// A reserved byte or flag bit is not zero.
    #[error("reserved {what} at offset {offset} is {got:#04x}, must be 0")]
    ReservedBits {
        what: &'static str,
        offset: usize,
        got: u8,
    },
    /// The content breaks a limit.
    #[error("{0}")]
    OverLimit(LimitError),
    /// An opcode v1 does not define.
    #[error("op {index}: unknown opcode {code:#04x}")]
    UnknownOpcode { index: usize, code: u8 },
    /// An opcode reserved for a later protocol version.
    #[error("op {index}: opcode {code:#04x} ({name}) is reserved and not supported by this protocol version")]
    ReservedOpcode {
        index: usize,
        code: u8,
        name: &'static str,
    },
    /// An opcode of a later protocol version than the connection's (a
    /// client that negotiated an older version sent it).
    #[error("op {index}: opcode {code:#04x} ({name}) needs protocol version {since}; this connection speaks version {version}")]
    OpcodeNeedsVersion {
        index: usize,
        code: u8,
        name: &'static str,
        since: u16,
        version: u16,
    },
    /// A field runs past the end of the frame.
    #[error("{what} at offset {offset} needs {need} bytes, only {have} left in the frame")]
    Truncated {
        what: &'static str,
        offset: usize,
        need: usize,
        have: usize,
    },
    /// Bytes are left after the last field.
    #[error("{count} unexpected bytes after the last field, at offset {offset}")]
    TrailingBytes { offset: usize, count: usize },
    /// A status byte v1 does not define.
    #[error("result {index}: unknown status {code:#04x}")]
    UnknownStatus { index: usize, code: u8 },
    /// A status and payload kind that do not go together, or a NONE payload
    /// that is not empty.
    #[error("result {index}: status {status} with payload kind {payload_kind:#04x} and {len} payload bytes is not a valid reply")]
    BadReply {
        index: usize,
        status: Status,
        payload_kind: u8,
        len: usize,
    },
    /// A text field is not valid UTF-8.
    #[error("{what} at offset {offset} is not valid UTF-8")]
    InvalidUtf8 { what: &'static str, offset: usize },
    /// An error message is over [`MESSAGE_BYTES_MAX`](super::MESSAGE_BYTES_MAX).
    #[error("message of {len} bytes is over the limit of {max}")]
    MessageTooLarge { len: usize, max: usize },
    /// An ERROR frame, or a refused hello-ack, whose status is not an error.
    #[error("status {status} cannot refuse a request or a handshake")]
    NotAnError { status: Status },
    /// An ERROR frame that neither names a request nor closes the connection.
    #[error("ERROR frame flags {flags:#04x} set neither CLOSE nor ID_VALID")]
    UnattributedError { flags: u8 },
    /// A frame's count field is wrong for its kind.
    #[error("{kind} frame has count {count}, expected {expected}")]
    BadCount {
        kind: &'static str,
        count: usize,
        expected: usize,
    },
}

impl FrameFault {
    /// The status a server answers with for this fault.
    pub fn status(&self) -> Status {
        match self {
            FrameFault::UnexpectedKind { .. }
            | FrameFault::ReservedBits { .. }
            | FrameFault::UnknownOpcode { .. }
            | FrameFault::ReservedOpcode { .. }
            | FrameFault::OpcodeNeedsVersion { .. } => Status::Unsupported,
            FrameFault::OverLimit(limit) => limit.status(),
            FrameFault::Truncated { .. }
            | FrameFault::TrailingBytes { .. }
            | FrameFault::UnknownStatus { .. }
            | FrameFault::BadReply { .. }
            | FrameFault::InvalidUtf8 { .. }
            | FrameFault::MessageTooLarge { .. }
            | FrameFault::NotAnError { .. }
            | FrameFault::UnattributedError { .. }
            | FrameFault::BadCount { .. } => Status::BadRequest,
        }
    }
}

/// A request (or response) that breaks one of the negotiated [`Limits`].
///
/// [`Limits`]: super::Limits
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LimitError {
    #[error("a batch must hold at least one operation")]
    EmptyBatch,
    #[error("batch of {count} operations is over the limit of {max} (the server's limits.ops_per_frame_max)")]
    TooManyOps { count: usize, max: u32 },
    #[error("op {index}: key is empty")]
    EmptyKey { index: usize },
    #[error("op {index}: key of {len} bytes is over the limit of {max} (the server's limits.key_bytes_max)")]
    KeyTooLarge { index: usize, len: usize, max: u32 },
    #[error("op {index}: value of {len} bytes is over the limit of {max} (the server's limits.value_bytes_max)")]
    ValueTooLarge { index: usize, len: usize, max: u32 },
    #[error("encoded frame of {len} bytes is over the limit of {max} (the server's limits.frame_bytes_max)")]
    FrameTooLarge { len: usize, max: u32 },
    #[error("op {index}: SCAN pattern of {len} bytes is over the limit of {max}")]
    PatternTooLarge {
        index: usize,
        len: usize,
        max: usize,
    },
    #[error("op {index}: a BACKUP path of {len} bytes (it must have 1 to {max})")]
    BackupPath {
        index: usize,
        len: usize,
        max: usize,
    },
}

impl LimitError {
    /// The wire status for this violation.
    pub fn status(&self) -> Status {
        match self {
            LimitError::EmptyBatch
            | LimitError::EmptyKey { .. }
            | LimitError::PatternTooLarge { .. }
            | LimitError::BackupPath { .. } => Status::BadRequest,
            LimitError::TooManyOps { .. } => Status::TooManyOps,
            LimitError::KeyTooLarge { .. } => Status::KeyTooLarge,
            LimitError::ValueTooLarge { .. } => Status::ValueTooLarge,
            LimitError::FrameTooLarge { .. } => Status::FrameTooLarge,
        }
    }
}

/// A set of limits that no server may advertise.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LimitsError {
    #[error("{field} is 0; it must be at least 1")]
    Zero { field: &'static str },
    #[error("frame_bytes_max {frame_bytes_max} is below {min}: it must hold an ERROR frame and a response of {ops_per_frame_max} empty results")]
    FrameTooSmall {
        frame_bytes_max: u32,
        ops_per_frame_max: u32,
        min: u64,
    },
}
