//! The request side of RESP (the Redis serialization protocol) as a
//! resumable, sans-IO decoder: bytes in, commands (argument lists) out.
//!
//! What must hold:
//! - every length read from the peer is checked against [`RespLimits`]
//!   before anything is reserved for it: a bulk against `bulk_bytes_max`, an
//!   argument count against `args_max`, a whole command against
//!   `command_bytes_max`; lines without a terminator are refused past
//!   [`LINE_BYTES_MAX`] (Redis's 64 KiB inline limit);
//! - decoding resumes where the previous call stopped, so a large command
//!   that arrives in many reads costs O(bytes), not O(bytes²);
//! - arguments are slices of the input buffer (no copies);
//! - the error texts are Redis's own (`Protocol error: ...`), so clients and
//!   test suites that match them keep working.

use bytes::{Bytes, BytesMut};

/// Longest line without a terminator: an inline command, or the count line
/// of a multibulk or a bulk. Redis's `PROTO_INLINE_MAX_SIZE`.
pub const LINE_BYTES_MAX: usize = 64 * 1024;
/// Most arguments a command may have before the client authenticated
/// (Redis's limit, so a client without the password cannot make the
/// server buffer much).
pub const UNAUTHENTICATED_ARGS_MAX: usize = 10;
/// Largest argument before the client authenticated (Redis's limit).
pub const UNAUTHENTICATED_BULK_BYTES_MAX: usize = 16 * 1024;

/// Bounds on what one command may declare.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RespLimits {
    /// Largest single argument (key or value).
    pub bulk_bytes_max: usize,
    /// Most arguments in one command (the command name included).
    pub args_max: usize,
    /// Most bytes one command may occupy on the wire, framing included.
    pub command_bytes_max: usize,
}

/// Why the input is not valid RESP. Each one ends the connection after its
/// error reply, as in Redis (the stream cannot be resynchronised).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RespError {
    #[error("Protocol error: invalid multibulk length")]
    InvalidMultibulkLength,
    #[error("Protocol error: invalid bulk length")]
    InvalidBulkLength,
    /// Redis's text for the same case, with what to change: an argument
    /// longer than the largest key or value the server takes.
    #[error(
        "Protocol error: invalid bulk length (an argument of {len} bytes is over ringkv's \
         limit of {max}: raise limits.value_bytes_max, or limits.key_bytes_max for a key)"
    )]
    BulkTooLarge { len: u64, max: usize },
    #[error("Protocol error: unauthenticated multibulk length")]
    UnauthenticatedMultibulkLength,
    #[error("Protocol error: unauthenticated bulk length")]
    UnauthenticatedBulkLength,
    #[error("Protocol error: expected '$', got '{}'", char::from(*.0))]
    ExpectedBulk(u8),
    #[error("Protocol error: too big mult bulk count string")]
    MultibulkCountTooLong,
    #[error("Protocol error: too big bulk count string")]
    BulkCountTooLong,
    #[error("Protocol error: too big inline request")]
    InlineTooLong,
    #[error("Protocol error: unbalanced quotes in request")]
    UnbalancedQuotes,
    /// Not a Redis text (Redis closes such a client without a reply, after
    /// its 1 GiB query buffer limit): the command is larger than ringkv's
    /// frame limit.
    #[error(
        "Protocol error: command of at least {len} bytes is over ringkv's limit of {max} \
         (limits.frame_bytes_max)"
    )]
    CommandTooLarge { len: usize, max: usize },
}

/// Where a multibulk command stands between calls.
#[derive(Debug)]
struct Partial {
    /// Arguments still to read.
    remaining: usize,
    /// Offset of the next unread byte in the buffer.
    pos: usize,
    /// (start, end) of every argument read so far.
    args: Vec<(usize, usize)>,
}

/// A resumable RESP command decoder for one connection.
#[derive(Debug)]
pub struct RespDecoder {
    limits: RespLimits,
    /// Redis's tighter limits apply (a password is required and the
    /// client has not authenticated yet).
    unauthenticated: bool,
    partial: Option<Partial>,
    /// Bytes the buffer must hold before the next call can progress.
    wanted: usize,
}

/// One decoded command: its arguments (the name first). Never empty.
pub type Command = Vec<Bytes>;

impl RespDecoder {
    pub fn new(limits: RespLimits) -> RespDecoder {
        RespDecoder {
            limits,
            unauthenticated: false,
            partial: None,
            wanted: 0,
        }
    }

    /// Whether the limits for a client that has not authenticated apply
    /// ([`UNAUTHENTICATED_ARGS_MAX`], [`UNAUTHENTICATED_BULK_BYTES_MAX`]).
    pub fn set_unauthenticated(&mut self, unauthenticated: bool) {
        self.unauthenticated = unauthenticated;
    }

    /// How many bytes the buffer should hold for the next call to make
    /// progress (a hint for sizing the next read; 0 when unknown).
    pub fn bytes_wanted(&self) -> usize {
        self.wanted
    }

    /// Whether part of a command is buffered.
    pub fn has_partial(&self, buf: &BytesMut) -> bool {
        self.partial.is_some() || !buf.is_empty()
    }

    /// Takes the next complete command off the front of `buf`. `Ok(None)`:
    /// more bytes are needed (what was read so far is kept for the next
    /// call; `buf` must only grow at its end in between). Empty commands
    /// (an empty inline line, `*0`, `*-1`) are skipped, as Redis does.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Command>, RespError> {
        loop {
            self.wanted = 0;
            if self.partial.is_none() {
                if buf.is_empty() {
                    return Ok(None);
                }
                if buf[0] != b'*' {
                    match self.inline(buf)? {
                        None => return Ok(None),
                        Some(args) if args.is_empty() => continue,
                        Some(args) => return Ok(Some(args)),
                    }
                }
                match self.multibulk_header(buf)? {
                    None => return Ok(None),
                    Some(false) => continue,
                    Some(true) => {}
                }
            }
            return self.multibulk_args(buf);
        }
    }

    /// Reads `*N\r\n`. `Some(false)`: an empty command was consumed.
    fn multibulk_header(&mut self, buf: &mut BytesMut) -> Result<Option<bool>, RespError> {
        let Some(cr) = find_cr(buf, 0) else {
            if buf.len() > LINE_BYTES_MAX {
                return Err(RespError::MultibulkCountTooLong);
            }
            return Ok(None);
        };
        // The line ends with \r\n; the \n must be buffered too.
        if cr + 2 > buf.len() {
            return Ok(None);
        }
        let count = parse_i64(&buf[1..cr]).ok_or(RespError::InvalidMultibulkLength)?;
        if count > i64::from(i32::MAX) {
            return Err(RespError::InvalidMultibulkLength);
        }
        if count <= 0 {
            let _ = buf.split_to(cr + 2);
            return Ok(Some(false));
        }
        let count = count as usize;
        if self.unauthenticated && count > UNAUTHENTICATED_ARGS_MAX {
            return Err(RespError::UnauthenticatedMultibulkLength);
        }
        if count > self.limits.args_max {
            return Err(RespError::InvalidMultibulkLength);
        }
        self.partial = Some(Partial {
            remaining: count,
            pos: cr + 2,
            args: Vec::with_capacity(count.min(1024)),
        });
        Ok(Some(true))
    }

    fn multibulk_args(&mut self, buf: &mut BytesMut) -> Result<Option<Command>, RespError> {
        let limits = self.limits;
        let unauthenticated = self.unauthenticated;
        let Some(p) = self.partial.as_mut() else {
            return Ok(None);
        };
        while p.remaining > 0 {
            if p.pos >= buf.len() {
                return Ok(None);
            }
            let Some(cr) = find_cr(buf, p.pos) else {
                if buf.len() - p.pos > LINE_BYTES_MAX {
                    return Err(RespError::BulkCountTooLong);
                }
                return Ok(None);
            };
            if buf[p.pos] != b'$' {
                return Err(RespError::ExpectedBulk(buf[p.pos]));
            }
            let len = parse_i64(&buf[p.pos + 1..cr]).ok_or(RespError::InvalidBulkLength)?;
            if unauthenticated && len > UNAUTHENTICATED_BULK_BYTES_MAX as i64 {
                return Err(RespError::UnauthenticatedBulkLength);
            }
            if len < 0 {
                return Err(RespError::InvalidBulkLength);
            }
            if len as u64 > limits.bulk_bytes_max as u64 {
                return Err(RespError::BulkTooLarge {
                    len: len as u64,
                    max: limits.bulk_bytes_max,
                });
            }
            let len = len as usize;
            let start = cr + 2;
            // Checked before waiting for the body: nothing is reserved for
            // a command over the limit.
            let end = start + len + 2;
            if end > limits.command_bytes_max {
                return Err(RespError::CommandTooLarge {
                    len: end,
                    max: limits.command_bytes_max,
                });
            }
            if end > buf.len() {
                self.wanted = end;
                return Ok(None);
            }
            // Like Redis, the two bytes after the body are skipped unread.
            p.args.push((start, start + len));
            p.pos = end;
            p.remaining -= 1;
        }
        let Some(p) = self.partial.take() else {
            return Ok(None);
        };
        let frozen = buf.split_to(p.pos).freeze();
        Ok(Some(
            p.args.iter().map(|&(s, e)| frozen.slice(s..e)).collect(),
        ))
    }

    /// Reads one inline command (a line of space-separated words).
    fn inline(&mut self, buf: &mut BytesMut) -> Result<Option<Command>, RespError> {
        let Some(nl) = buf.iter().position(|&b| b == b'\n') else {
            if buf.len() > LINE_BYTES_MAX {
                return Err(RespError::InlineTooLong);
            }
            return Ok(None);
        };
        if nl > LINE_BYTES_MAX {
            return Err(RespError::InlineTooLong);
        }
        let line = buf.split_to(nl + 1);
        let mut text = &line[..nl];
        if let [rest @ .., b'\r'] = text {
            text = rest;
        }
        split_inline(text).map(Some)
    }
}

fn find_cr(buf: &[u8], from: usize) -> Option<usize> {
    buf[from..]
        .iter()
        .position(|&b| b == b'\r')
        .map(|i| from + i)
}

/// Redis's `string2ll`: an optional '-', then digits without a leading zero
/// (except "0"), no sign on zero, no spaces, within i64.
pub fn parse_i64(s: &[u8]) -> Option<i64> {
    let (negative, digits) = match s {
        [b'-', rest @ ..] => (true, rest),
        _ => (false, s),
    };
    match digits {
        [] => return None,
        [b'0'] if !negative => return Some(0),
        [b'0', ..] => return None,
        _ => {}
    }
    let mut v: i64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        let digit = i64::from(d - b'0');
        v = v.checked_mul(10)?;
        v = if negative {
            v.checked_sub(digit)?
        } else {
            v.checked_add(digit)?
        };
    }
    Some(v)
}

/// Splits an inline line into arguments the way Redis's `sdssplitargs`
/// does: words separated by whitespace; "double quotes" with escapes
/// (`\n \r \t \b \a \\ \" \xHH`); 'single quotes' with `\'`; a closing quote
/// must be followed by whitespace or the end of the line.
pub fn split_inline(line: &[u8]) -> Result<Command, RespError> {
    let mut args = Vec::new();
    let mut i = 0;
    let n = line.len();
    loop {
        while i < n && is_space(line[i]) {
            i += 1;
        }
        if i >= n {
            return Ok(args);
        }
        let mut current = Vec::new();
        let mut in_double = false;
        let mut in_single = false;
        loop {
            if in_double {
                if i >= n {
                    return Err(RespError::UnbalancedQuotes);
                }
                let c = line[i];
                if c == b'\\' && i + 3 < n && line[i + 1] == b'x' {
                    if let (Some(h), Some(l)) = (hex(line[i + 2]), hex(line[i + 3])) {
                        current.push(h * 16 + l);
                        i += 4;
                        continue;
                    }
                }
                if c == b'\\' && i + 1 < n {
                    current.push(match line[i + 1] {
                        b'n' => b'\n',
                        b'r' => b'\r',
                        b't' => b'\t',
                        b'b' => 8,
                        b'a' => 7,
                        other => other,
                    });
                    i += 2;
                } else if c == b'"' {
                    if i + 1 < n && !is_space(line[i + 1]) {
                        return Err(RespError::UnbalancedQuotes);
                    }
                    i += 1;
                    break;
                } else {
                    current.push(c);
                    i += 1;
                }
            } else if in_single {
                if i >= n {
                    return Err(RespError::UnbalancedQuotes);
                }
                let c = line[i];
                if c == b'\\' && i + 1 < n && line[i + 1] == b'\'' {
                    current.push(b'\'');
                    i += 2;
                } else if c == b'\'' {
                    if i + 1 < n && !is_space(line[i + 1]) {
                        return Err(RespError::UnbalancedQuotes);
                    }
                    i += 1;
                    break;
                } else {
                    current.push(c);
                    i += 1;
                }
            } else {
                if i >= n {
                    break;
                }
                match line[i] {
                    c if is_space(c) => break,
                    b'"' => in_double = true,
                    b'\'' => in_single = true,
                    c => current.push(c),
                }
                i += 1;
            }
        }
        args.push(Bytes::from(current));
    }
}

fn is_space(c: u8) -> bool {
    matches!(c, b' ' | b'\n' | b'\r' | b'\t' | 0x0b | 0x0c)
}

fn hex(c: u8) -> Option<u8> {
    (c as char).to_digit(16).map(|d| d as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: RespLimits = RespLimits {
        bulk_bytes_max: 1024,
        args_max: 16,
        command_bytes_max: 4096,
    };

    fn all(input: &[u8]) -> Result<Vec<Vec<String>>, RespError> {
        let mut d = RespDecoder::new(LIMITS);
        let mut buf = BytesMut::from(input);
        let mut out = Vec::new();
        while let Some(cmd) = d.decode(&mut buf)? {
            out.push(
                cmd.iter()
                    .map(|a| String::from_utf8_lossy(a).into_owned())
                    .collect(),
            );
        }
        Ok(out)
    }

    fn words(s: &[&str]) -> Vec<String> {
        s.iter().map(|w| w.to_string()).collect()
    }

    #[test]
    fn multibulk_and_inline_commands() {
        let got = all(b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\nPING\r\nset a \"b c\"\r\n*0\r\n\r\n*-1\r\n")
            .unwrap();
        assert_eq!(
            got,
            vec![
                words(&["GET", "k"]),
                words(&["PING"]),
                words(&["set", "a", "b c"])
            ]
        );
    }

    #[test]
    fn incomplete_input_waits_and_resumes() {
        let whole = b"*3\r\n$3\r\nSET\r\n$3\r\nkey\r\n$5\r\nvalue\r\n";
        let mut d = RespDecoder::new(LIMITS);
        let mut buf = BytesMut::new();
        for (i, &b) in whole.iter().enumerate() {
            buf.extend_from_slice(&[b]);
            let r = d.decode(&mut buf).unwrap();
            if i + 1 < whole.len() {
                assert_eq!(r, None, "at byte {i}");
                assert!(d.has_partial(&buf));
            } else {
                assert_eq!(r.unwrap(), vec!["SET", "key", "value"]);
            }
        }
        assert!(buf.is_empty());
        assert!(!d.has_partial(&buf));
    }

    #[test]
    fn wanted_bytes_cover_a_bulk_body() {
        let mut d = RespDecoder::new(LIMITS);
        let mut buf = BytesMut::from(&b"*1\r\n$100\r\nab"[..]);
        assert_eq!(d.decode(&mut buf).unwrap(), None);
        assert_eq!(d.bytes_wanted(), 4 + 6 + 100 + 2);
    }

    #[test]
    fn redis_protocol_error_texts() {
        let cases: &[(&[u8], &str)] = &[
            (
                b"*3000000000\r\n",
                "Protocol error: invalid multibulk length",
            ),
            (b"*x\r\n", "Protocol error: invalid multibulk length"),
            (b"*17\r\n", "Protocol error: invalid multibulk length"),
            (
                b"*3\r\n$3\r\nSET\r\n$1\r\nx\r\nfooz\r\n",
                "Protocol error: expected '$', got 'f'",
            ),
            (
                b"*3\r\n$3\r\nSET\r\n$1\r\nx\r\n$-10\r\n",
                "Protocol error: invalid bulk length",
            ),
            (
                b"*3\r\n$3\r\nSET\r\n$1\r\nx\r\n$2000000000\r\n",
                "Protocol error: invalid bulk length (an argument of 2000000000 bytes is over \
                 ringkv's limit of 1024: raise limits.value_bytes_max, or \
                 limits.key_bytes_max for a key)",
            ),
            (
                b"*3\r\n$3\r\nSET\r\n$1\r\nx\r\n$blabla\r\n",
                "Protocol error: invalid bulk length",
            ),
            (b"*1\r\nfoo\r\n", "Protocol error: expected '$', got 'f'"),
            (
                b"set \"\"\"test-key\"\"\" test-value\r\n",
                "Protocol error: unbalanced quotes in request",
            ),
            (
                b"set 'a\r\n",
                "Protocol error: unbalanced quotes in request",
            ),
        ];
        for (input, text) in cases {
            let err = all(input).unwrap_err();
            assert_eq!(
                err.to_string(),
                *text,
                "{:?}",
                String::from_utf8_lossy(input)
            );
        }
    }

    #[test]
    fn lines_without_terminator_are_bounded() {
        let mut big = vec![b'A'; LINE_BYTES_MAX + 1];
        assert_eq!(all(&big), Err(RespError::InlineTooLong));
        big[0] = b'*';
        assert_eq!(all(&big), Err(RespError::MultibulkCountTooLong));
        let mut bulk = b"*1\r\n".to_vec();
        bulk.extend(vec![b'$'; LINE_BYTES_MAX + 1]);
        assert_eq!(all(&bulk), Err(RespError::BulkCountTooLong));
        // Shorter than the limit: still waiting.
        assert_eq!(all(&big[..1000]), Ok(vec![]));
    }

    #[test]
    fn a_command_over_the_byte_limit_is_refused_before_its_body_arrives() {
        let mut input = b"*5\r\n".to_vec();
        for _ in 0..4 {
            input.extend_from_slice(b"$1000\r\n");
            input.extend(vec![b'x'; 1000]);
            input.extend_from_slice(b"\r\n");
        }
        input.extend_from_slice(b"$1000\r\n");
        assert!(matches!(
            all(&input),
            Err(RespError::CommandTooLarge { max: 4096, .. })
        ));
    }

    #[test]
    fn inline_quoting_follows_redis() {
        let s = |line: &[u8]| -> Vec<Vec<u8>> {
            split_inline(line)
                .unwrap()
                .into_iter()
                .map(|b| b.to_vec())
                .collect()
        };
        assert_eq!(
            s(b"  a  \"b\\x41\\n\" 'c\\'d' "),
            vec![b"a".to_vec(), b"bA\n".to_vec(), b"c'd".to_vec()]
        );
        assert_eq!(s(b"\"\""), vec![Vec::<u8>::new()]);
        assert_eq!(s(b""), Vec::<Vec<u8>>::new());
        assert!(split_inline(b"\"a\"b").is_err());
        assert!(split_inline(b"'a'b").is_err());
    }

    #[test]
    fn parse_i64_is_strict() {
        assert_eq!(parse_i64(b"0"), Some(0));
        assert_eq!(parse_i64(b"-12"), Some(-12));
        assert_eq!(parse_i64(b"9223372036854775807"), Some(i64::MAX));
        assert_eq!(parse_i64(b"-9223372036854775808"), Some(i64::MIN));
        for bad in [
            &b""[..],
            b"-",
            b"-0",
            b"01",
            b"+1",
            b" 1",
            b"1 ",
            b"9223372036854775808",
        ] {
            assert_eq!(parse_i64(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn redis_limits_before_authentication() {
        let mut d = RespDecoder::new(LIMITS);
        d.set_unauthenticated(true);
        let mut ok = BytesMut::from(&b"*2\r\n$4\r\nAUTH\r\n$2\r\npw\r\n"[..]);
        assert!(matches!(d.decode(&mut ok), Ok(Some(c)) if c.len() == 2));
        let mut many = BytesMut::from(&b"*11\r\n"[..]);
        assert_eq!(
            d.decode(&mut many).map_err(|e| e.to_string()),
            Err("Protocol error: unauthenticated multibulk length".to_string())
        );
        let mut d = RespDecoder::new(LIMITS);
        d.set_unauthenticated(true);
        let mut big = BytesMut::from(&b"*2\r\n$3\r\nSET\r\n$16385\r\n"[..]);
        assert_eq!(
            d.decode(&mut big).map_err(|e| e.to_string()),
            Err("Protocol error: unauthenticated bulk length".to_string())
        );
        // Once authenticated, the configured limits apply again.
        let mut d = RespDecoder::new(LIMITS);
        d.set_unauthenticated(false);
        let mut eleven = BytesMut::from(&b"*11\r\n"[..]);
        assert_eq!(d.decode(&mut eleven), Ok(None));
    }
}
