//! Numbers of the wire format (versions 1 to 4): magic, versions, sizes,
//! hello flags, frame kinds, opcodes, payload kinds and status codes. Every value here is part of the protocol
//! and is documented in `docs/protocol.md`; changing one breaks every client.

/// First four bytes of a hello and of a hello-ack: ASCII `RKV1`.
pub const MAGIC: [u8; 4] = *b"RKV1";

/// The protocol version this crate speaks (the highest one). Version 2 adds
/// the password step of the handshake ([`hello_flags::AUTH`]) and the
/// statuses AUTH_REQUIRED and AUTH_FAILED; frames are the same as in 1.
/// Version 3 adds the expiry operations (PUT_EXPIRING, EXPIRE, TTL), SCAN,
/// and their payload kinds EXPIRY and KEYS; its handshake is version 2's.
/// Version 4 adds users: the hello's [`hello_flags::USER`] (a user name
/// before the password) and the status NO_PERMISSION.
pub const PROTOCOL_VERSION: u16 = 5;
/// The oldest protocol version this crate speaks.
pub const PROTOCOL_VERSION_MIN: u16 = 1;

/// Size of a hello: magic, version, flags.
pub const HELLO_BYTES: usize = 8;
/// Longest password a hello may carry (the auth block's length field).
pub const PASSWORD_BYTES_MAX: usize = 512;
/// Size of the auth block's length field.
pub const AUTH_LEN_BYTES: usize = 2;
/// Longest user name a hello may carry (version 4, [`hello_flags::USER`]).
pub const USER_NAME_BYTES_MAX: usize = 64;
/// Size of the user block's length field.
pub const USER_LEN_BYTES: usize = 2;

/// Flag bits of a hello (offset 6). Version 1 defines none.
pub mod hello_flags {
    /// Version 2: an auth block (`u16` length, then the password) follows
    /// the 8-byte hello.
    pub const AUTH: u16 = 0x0001;
    /// Every bit version 2 defines.
    pub const KNOWN_V2: u16 = AUTH;
    /// Version 4: a user block (`u16` length, then the user name) follows
    /// the hello, before the auth block; only together with [`AUTH`].
    pub const USER: u16 = 0x0002;
    /// Every bit version 4 defines.
    pub const KNOWN_V4: u16 = AUTH | USER;
}

/// Size of the fixed part of a hello-ack: magic, version, status, reserved,
/// body length, body checksum.
pub const HELLO_ACK_PREFIX_BYTES: usize = 16;
/// Largest hello-ack body a client accepts (checked before waiting for it).
pub const HELLO_ACK_BODY_BYTES_MAX: usize = 4096;

/// Size of the length prefix that starts every frame.
pub const LEN_PREFIX_BYTES: usize = 4;
/// Size of a frame header: length, checksum, kind, 3 reserved bytes, count, id.
pub const FRAME_HEADER_BYTES: usize = 24;
/// Offset of the first byte the frame checksum covers (just after it).
pub const CHECKSUM_START: usize = 8;
/// Smallest encoded operation (PING and STATS are one opcode byte).
pub const OP_BYTES_MIN: usize = 1;
/// Size of a result without payload: status, payload kind, payload length.
pub const RESULT_HEADER_BYTES: usize = 6;
/// Size of an ERROR frame body before its message: status, flags, message length.
pub const ERROR_BODY_HEADER_BYTES: usize = 4;

/// Longest error message, in UTF-8 bytes. Encoders cut longer messages at a
/// character boundary; decoders reject longer ones.
pub const MESSAGE_BYTES_MAX: usize = 1024;
/// Longest MATCH pattern of a SCAN, in bytes (a `u16` length on the wire).
/// Matching costs at most pattern × key steps per key, so the bound keeps
/// one SCAN's filtering cheap.
pub const SCAN_PATTERN_BYTES_MAX: usize = 256;
/// Size of a SCAN operation without its pattern: opcode, cursor, count,
/// pattern length.
pub const SCAN_OP_FIXED_BYTES: usize = 1 + 8 + 4 + 2;
/// Longest directory path a BACKUP operation may name.
pub const BACKUP_PATH_BYTES_MAX: usize = 4096;
/// Size of a BACKUP operation without its path: opcode, path length, rate.
pub const BACKUP_OP_FIXED_BYTES: usize = 1 + 2 + 8;
/// Size of an EXPIRY payload: expiry time and time left, both `u64` ms.
pub const EXPIRY_PAYLOAD_BYTES: usize = 16;
/// Size of a KEYS payload before its keys: next cursor, key count.
pub const KEYS_PAYLOAD_HEADER_BYTES: usize = 8 + 4;
/// Size of one key's length field in a KEYS payload.
pub const KEYS_ENTRY_HEADER_BYTES: usize = 4;

/// Longest server name in a hello-ack, in UTF-8 bytes (encoders cut longer ones).
pub const SERVER_NAME_BYTES_MAX: usize = 256;
/// Longest name or value text of one STATS entry (a u16 length on the wire).
pub const STAT_TEXT_BYTES_MAX: usize = u16::MAX as usize;

/// Smallest `frame_bytes_max` a server may advertise: room for an ERROR frame
/// with the longest message, with margin.
pub const FRAME_BYTES_MAX_FLOOR: u32 = 4096;

const _: () = assert!(FRAME_HEADER_BYTES == LEN_PREFIX_BYTES + 4 + 1 + 3 + 4 + 8);
const _: () = assert!(HELLO_ACK_PREFIX_BYTES == 4 + 2 + 1 + 1 + 4 + 4);
const _: () = assert!(
    FRAME_HEADER_BYTES + ERROR_BODY_HEADER_BYTES + MESSAGE_BYTES_MAX
        <= FRAME_BYTES_MAX_FLOOR as usize
);
const _: () = assert!(MESSAGE_BYTES_MAX <= u16::MAX as usize);
const _: () = assert!(SERVER_NAME_BYTES_MAX <= u16::MAX as usize);
const _: () = assert!(SCAN_PATTERN_BYTES_MAX <= u16::MAX as usize);

/// Kind byte of a frame (offset 8 of the header).
pub mod frame_kind {
    /// Client to server: a batch of operations.
    pub const REQUEST: u8 = 0x01;
    /// Server to client: one result per operation of a request.
    pub const RESPONSE: u8 = 0x02;
    /// Server to client: a request or the connection was refused as a whole.
    pub const ERROR: u8 = 0x03;
}

/// Flag bits of an ERROR frame body.
pub mod error_flags {
    /// The server closes the connection after this frame.
    pub const CLOSE: u8 = 0x01;
    /// The header's request id names the rejected request.
    pub const ID_VALID: u8 = 0x02;
    /// Every bit v1 defines.
    pub const KNOWN: u8 = CLOSE | ID_VALID;
}

/// Operation codes.
pub mod opcode {
    pub const PUT: u8 = 0x01;
    pub const GET: u8 = 0x02;
    pub const DELETE: u8 = 0x03;
    pub const PING: u8 = 0x04;
    pub const STATS: u8 = 0x05;

    /// Version 3: PUT with an expiry time. Body: key, value, `u64` expiry
    /// (absolute Unix ms; 0: none).
    pub const PUT_EXPIRING: u8 = 0x06;
    /// Version 3: set or remove an existing key's expiry. Body: key, `u64`
    /// expiry (absolute Unix ms; 0: remove it).
    pub const EXPIRE: u8 = 0x07;
    /// Version 3: read a key's expiry. Body: key.
    pub const TTL: u8 = 0x08;

    /// Interactive transactions (0x10..=0x1F; 0x14 and up stay reserved).
    /// BEGIN opens the connection's transaction; the ops after it on the
    /// connection belong to it until COMMIT or ROLLBACK.
    pub const BEGIN: u8 = 0x10;
    /// Lock a key and read it (inside a transaction). Body: key.
    pub const GET_FOR_UPDATE: u8 = 0x11;
    pub const COMMIT: u8 = 0x12;
    pub const ROLLBACK: u8 = 0x13;
    /// Version 3: one step of a walk over the whole keyspace (0x20..=0x2F
    /// are for scans; 0x21 and up stay reserved). Body: cursor, count
    /// hint, MATCH pattern.
    pub const SCAN: u8 = 0x20;
    /// Version 5: an online backup of the whole server into a directory on
    /// the server's machine (0x30..=0x3F are for administration; 0x31 and
    /// up stay reserved). Body: `u16` path length, path (UTF-8), `u64`
    /// copy rate limit in bytes per second (0: none). Answered, once the
    /// backup is finished, with STATS entries describing it.
    pub const BACKUP: u8 = 0x30;

    /// The name of a reserved opcode, or of its reserved family, if `code` is
    /// in a reserved range. Reserved opcodes are refused with UNSUPPORTED.
    pub fn reserved_name(code: u8) -> Option<&'static str> {
        match code {
            0x14..=0x1F => Some("a transaction opcode"),
            0x21..=0x2F => Some("a scan opcode"),
            0x31..=0x3F => Some("an administration opcode"),
            _ => None,
        }
    }

    /// The first protocol version that defines opcode `code` (1 for the
    /// opcodes of version 1, and for codes no version defines).
    pub fn since_version(code: u8) -> u16 {
        match code {
            PUT_EXPIRING | EXPIRE | TTL | SCAN => 3,
            BACKUP => 5,
            _ => 1,
        }
    }

    /// The name of a defined opcode, as `docs/protocol.md` spells it.
    pub fn name(code: u8) -> Option<&'static str> {
        Some(match code {
            PUT => "PUT",
            GET => "GET",
            DELETE => "DELETE",
            PING => "PING",
            STATS => "STATS",
            PUT_EXPIRING => "PUT_EXPIRING",
            EXPIRE => "EXPIRE",
            TTL => "TTL",
            BEGIN => "BEGIN",
            GET_FOR_UPDATE => "GET_FOR_UPDATE",
            COMMIT => "COMMIT",
            ROLLBACK => "ROLLBACK",
            SCAN => "SCAN",
            BACKUP => "BACKUP",
            _ => return None,
        })
    }
}

/// What follows a result's status byte.
pub mod payload_kind {
    /// No payload: the payload length is 0.
    pub const NONE: u8 = 0x00;
    /// The value of a GET hit.
    pub const VALUE: u8 = 0x01;
    /// A STATS blob: a list of (name, value) text pairs.
    pub const STATS: u8 = 0x02;
    /// A UTF-8 error message.
    pub const MESSAGE: u8 = 0x03;
    /// Version 3, the answer to TTL: expiry time and time left (`u64` ms
    /// each; both 0 for a key without an expiry).
    pub const EXPIRY: u8 = 0x04;
    /// Version 3, the answer to SCAN: the next cursor, then keys.
    pub const KEYS: u8 = 0x05;
}

/// Declares [`Status`]: each status once, with its wire code, its name and
/// its meaning; the enum, [`Status::ALL`] and [`Status::name`] follow.
macro_rules! statuses {
    ($($(#[doc = $doc:literal])+ $variant:ident = $code:literal, $name:literal;)+) => {
        /// Outcome of one operation, of a whole frame, or of a handshake.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u8)]
        pub enum Status {
            $($(#[doc = $doc])+ $variant = $code,)+
        }

        impl Status {
            /// Every status, in code order.
            pub const ALL: [Status; [$($code),+].len()] = [$(Status::$variant),+];

            /// The name used in docs and messages, e.g. `KEY_TOO_LARGE`.
            pub const fn name(self) -> &'static str {
                match self {
                    $(Status::$variant => $name,)+
                }
            }
        }
    };
}

statuses! {
    /// Done; a GET hit carries its value, STATS carries its entries.
    Ok = 0x00, "OK";
    /// A GET or DELETE found no such key.
    NotFound = 0x01, "NOT_FOUND";
    /// The request breaks a protocol rule (empty key, truncated op, bad magic...).
    BadRequest = 0x10, "BAD_REQUEST";
    /// The frame is over `frame_bytes_max` (or a response would be).
    FrameTooLarge = 0x11, "FRAME_TOO_LARGE";
    /// The frame has more operations than `ops_per_frame_max`.
    TooManyOps = 0x12, "TOO_MANY_OPS";
    /// A key is over `key_bytes_max`.
    KeyTooLarge = 0x13, "KEY_TOO_LARGE";
    /// A value is over `value_bytes_max`.
    ValueTooLarge = 0x14, "VALUE_TOO_LARGE";
    /// A version, flag, frame kind or opcode this server does not implement.
    Unsupported = 0x15, "UNSUPPORTED";
    /// The frame checksum does not match its bytes.
    ChecksumMismatch = 0x16, "CHECKSUM_MISMATCH";
    /// Version 2 hello-ack: the server has a password and the hello carried none.
    AuthRequired = 0x17, "AUTH_REQUIRED";
    /// Version 2 hello-ack: the password is wrong (or the server has none).
    AuthFailed = 0x18, "AUTH_FAILED";
    /// Version 4: the connection's user may not run this operation (its role,
    /// `docs/security.md`); nothing of the request was applied.
    NoPermission = 0x19, "NO_PERMISSION";
    /// The shard hit an I/O error earlier and accepts no writes until restart.
    Poisoned = 0x20, "POISONED";
    /// The server is out of capacity (queue full, too many connections); retry later.
    Overloaded = 0x21, "OVERLOADED";
    /// The server is stopping.
    ShuttingDown = 0x22, "SHUTTING_DOWN";
    /// A bug or unexpected failure inside the server.
    Internal = 0x23, "INTERNAL";
    /// A stored value could not be read back (a device read error, or a
    /// block whose checksum does not match); the message names the file
    /// and offset. Other keys are still served.
    ValueUnreadable = 0x24, "VALUE_UNREADABLE";
    /// The write would grow the key's shard past its share of
    /// `storage.max_memory`; nothing was written. Reads, deletes and
    /// writes that do not grow memory still work.
    OutOfMemory = 0x25, "OUT_OF_MEMORY";
    /// Wait-die: an older transaction holds a key this transaction asked
    /// for; the transaction was aborted and its locks released. Retry it.
    Die = 0x30, "DIE";
    /// The lock was not granted within `transactions.lock_wait_timeout`;
    /// the transaction was aborted. Retry it.
    LockTimeout = 0x31, "LOCK_TIMEOUT";
    /// The transaction was aborted earlier (DIE, LOCK_TIMEOUT, or idle for
    /// `transactions.idle_timeout`); this op did nothing. COMMIT answers
    /// this too; ROLLBACK ends it.
    Aborted = 0x32, "ABORTED";
    /// A plain PUT or DELETE hit a key a transaction has locked; it was not
    /// applied. Retry it after the transaction ends.
    Locked = 0x33, "LOCKED";
    /// BEGIN inside a transaction, GET_FOR_UPDATE/COMMIT/ROLLBACK outside one.
    NoTransaction = 0x34, "NO_TRANSACTION";
    /// A transaction limit: `transactions.locks_max` locks, or one shard's
    /// writes over one WAL record; the transaction was aborted.
    TxnTooLarge = 0x35, "TXN_TOO_LARGE";
}

impl Status {
    /// The status byte on the wire.
    pub const fn code(self) -> u8 {
        self as u8
    }

    /// The status with this byte, if the protocol defines it.
    pub fn from_code(code: u8) -> Option<Status> {
        Status::ALL.into_iter().find(|status| status.code() == code)
    }

    /// The status with this name (as [`Status::name`] spells it).
    pub fn from_name(name: &str) -> Option<Status> {
        Status::ALL.into_iter().find(|status| status.name() == name)
    }

    /// Whether this status is a failure (everything but OK and NOT_FOUND).
    pub const fn is_error(self) -> bool {
        self.code() >= 0x10
    }

    /// Whether sending the same request again later may succeed unchanged.
    pub const fn is_retryable(self) -> bool {
        matches!(
            self,
            Status::Overloaded | Status::ShuttingDown | Status::Locked
        )
    }

    /// Whether this status aborted a transaction that may simply be run
    /// again from BEGIN.
    pub const fn is_txn_retry(self) -> bool {
        matches!(self, Status::Die | Status::LockTimeout | Status::Aborted)
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_codes_round_trip_and_are_unique() {
        for status in Status::ALL {
            assert_eq!(Status::from_code(status.code()), Some(status));
            assert_eq!(Status::from_name(status.name()), Some(status));
        }
        let mut codes: Vec<u8> = Status::ALL.iter().map(|s| s.code()).collect();
        codes.dedup();
        assert_eq!(codes.len(), Status::ALL.len());
        assert!(
            codes.windows(2).all(|w| w[0] < w[1]),
            "ALL is in code order"
        );
    }

    #[test]
    fn undefined_status_codes_are_rejected() {
        for code in 0..=u8::MAX {
            let defined = Status::ALL.iter().any(|s| s.code() == code);
            assert_eq!(
                Status::from_code(code).is_some(),
                defined,
                "code {code:#04x}"
            );
        }
    }

    #[test]
    fn only_ok_and_not_found_are_not_errors() {
        let non_errors: Vec<Status> = Status::ALL.into_iter().filter(|s| !s.is_error()).collect();
        assert_eq!(non_errors, vec![Status::Ok, Status::NotFound]);
    }

    #[test]
    fn reserved_opcodes_cover_their_ranges_and_nothing_else() {
        for code in 0..=u8::MAX {
            let reserved = (0x14..=0x1F).contains(&code)
                || (0x21..=0x2F).contains(&code)
                || (0x31..=0x3F).contains(&code);
            assert_eq!(
                opcode::reserved_name(code).is_some(),
                reserved,
                "code {code:#04x}"
            );
        }
        assert_eq!(opcode::reserved_name(opcode::COMMIT), None);
        assert_eq!(opcode::reserved_name(0x14), Some("a transaction opcode"));
        assert_eq!(opcode::reserved_name(opcode::SCAN), None);
    }

    #[test]
    fn opcodes_have_names_and_versions() {
        for code in 0..=u8::MAX {
            let named = opcode::name(code).is_some();
            assert!(
                !(named && opcode::reserved_name(code).is_some()),
                "{code:#04x} is both defined and reserved"
            );
            if !named {
                assert_eq!(opcode::since_version(code), 1, "{code:#04x}");
            }
            assert!(opcode::since_version(code) <= PROTOCOL_VERSION);
        }
        assert_eq!(opcode::since_version(opcode::PUT), 1);
        assert_eq!(opcode::since_version(opcode::COMMIT), 1);
        for code in [
            opcode::PUT_EXPIRING,
            opcode::EXPIRE,
            opcode::TTL,
            opcode::SCAN,
        ] {
            assert_eq!(opcode::since_version(code), 3);
        }
    }
}
