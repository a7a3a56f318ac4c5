//! A RESP2/RESP3 reply decoder, for clients and tests: bytes to a
//! [`Reply`] tree. Bounded like the request decoder: lengths are checked
//! against [`ReplyLimits`] before anything is reserved, and nesting depth is
//! capped, so a hostile server cannot make a client allocate without bound
//! or overflow its stack.

use bytes::{Buf, Bytes, BytesMut};

use super::decode::parse_i64;

/// A decoded reply.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Bytes),
    /// `$-1`, `*-1` or `_`.
    Null,
    Array(Vec<Reply>),
    Map(Vec<(Reply, Reply)>),
    Set(Vec<Reply>),
    Push(Vec<Reply>),
    Double(String),
    Bool(bool),
    /// `=len\r\nfmt:text`: the format and the text.
    Verbatim(String, Bytes),
    BigNumber(String),
}

/// Bounds on a reply.
#[derive(Debug, Clone, Copy)]
pub struct ReplyLimits {
    pub bulk_bytes_max: usize,
    pub elements_max: usize,
    pub depth_max: usize,
}

impl Default for ReplyLimits {
    fn default() -> Self {
        ReplyLimits {
            bulk_bytes_max: 512 << 20,
            elements_max: 1 << 24,
            depth_max: 64,
        }
    }
}

/// Why a reply is malformed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReplyError {
    #[error("unknown reply type byte {0:#04x}")]
    UnknownType(u8),
    #[error("malformed reply line")]
    BadLine,
    #[error("reply length {0} is out of bounds")]
    BadLength(i64),
    #[error("replies nested deeper than {0}")]
    TooDeep(usize),
}

/// Decodes one reply from the front of `buf`, removing it; `Ok(None)` if
/// the reply is not complete yet (nothing is removed).
pub fn decode_reply(buf: &mut BytesMut, limits: &ReplyLimits) -> Result<Option<Reply>, ReplyError> {
    let mut pos = 0;
    match parse(buf, &mut pos, limits, 0)? {
        None => Ok(None),
        Some(reply) => {
            buf.advance(pos);
            Ok(Some(reply))
        }
    }
}

fn line<'a>(buf: &'a [u8], pos: &mut usize) -> Option<&'a [u8]> {
    let rest = &buf[*pos..];
    let cr = rest.windows(2).position(|w| w == b"\r\n")?;
    *pos += cr + 2;
    Some(&rest[..cr])
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn parse(
    buf: &[u8],
    pos: &mut usize,
    limits: &ReplyLimits,
    depth: usize,
) -> Result<Option<Reply>, ReplyError> {
    if depth > limits.depth_max {
        return Err(ReplyError::TooDeep(limits.depth_max));
    }
    if *pos >= buf.len() {
        return Ok(None);
    }
    let kind = buf[*pos];
    *pos += 1;
    let Some(l) = line(buf, pos) else {
        return Ok(None);
    };
    let number = || parse_i64(l).ok_or(ReplyError::BadLine);
    let reply = match kind {
        b'+' => Reply::Simple(text(l)),
        b'-' => Reply::Error(text(l)),
        b':' => Reply::Int(number()?),
        b',' => Reply::Double(text(l)),
        b'(' => Reply::BigNumber(text(l)),
        b'_' => Reply::Null,
        b'#' => match l {
            b"t" => Reply::Bool(true),
            b"f" => Reply::Bool(false),
            _ => return Err(ReplyError::BadLine),
        },
        b'$' | b'=' | b'!' => {
            let n = number()?;
            if n == -1 && kind == b'$' {
                return Ok(Some(Reply::Null));
            }
            if n < 0 || n as u64 > limits.bulk_bytes_max as u64 {
                return Err(ReplyError::BadLength(n));
            }
            let n = n as usize;
            if *pos + n + 2 > buf.len() {
                return Ok(None);
            }
            let body = &buf[*pos..*pos + n];
            *pos += n + 2;
            match kind {
                b'$' => Reply::Bulk(Bytes::copy_from_slice(body)),
                b'!' => Reply::Error(text(body)),
                _ => {
                    if body.len() < 4 || body[3] != b':' {
                        return Err(ReplyError::BadLine);
                    }
                    Reply::Verbatim(text(&body[..3]), Bytes::copy_from_slice(&body[4..]))
                }
            }
        }
        b'*' | b'~' | b'>' | b'%' => {
            let n = number()?;
            if n == -1 && kind == b'*' {
                return Ok(Some(Reply::Null));
            }
            if n < 0 || n as u64 > limits.elements_max as u64 {
                return Err(ReplyError::BadLength(n));
            }
            let n = n as usize;
            if kind == b'%' {
                let mut pairs = Vec::with_capacity(n.min(1024));
                for _ in 0..n {
                    let Some(k) = parse(buf, pos, limits, depth + 1)? else {
                        return Ok(None);
                    };
                    let Some(v) = parse(buf, pos, limits, depth + 1)? else {
                        return Ok(None);
                    };
                    pairs.push((k, v));
                }
                Reply::Map(pairs)
            } else {
                let mut items = Vec::with_capacity(n.min(1024));
                for _ in 0..n {
                    let Some(item) = parse(buf, pos, limits, depth + 1)? else {
                        return Ok(None);
                    };
                    items.push(item);
                }
                match kind {
                    b'*' => Reply::Array(items),
                    b'~' => Reply::Set(items),
                    _ => Reply::Push(items),
                }
            }
        }
        other => return Err(ReplyError::UnknownType(other)),
    };
    Ok(Some(reply))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(input: &[u8]) -> Result<Option<Reply>, ReplyError> {
        decode_reply(&mut BytesMut::from(input), &ReplyLimits::default())
    }

    #[test]
    fn every_type() {
        let input = b"*9\r\n+OK\r\n-ERR x\r\n:5\r\n$2\r\nab\r\n$-1\r\n_\r\n%1\r\n+k\r\n,1.5\r\n#t\r\n=7\r\ntxt:abc\r\n";
        assert_eq!(
            one(input).unwrap().unwrap(),
            Reply::Array(vec![
                Reply::Simple("OK".into()),
                Reply::Error("ERR x".into()),
                Reply::Int(5),
                Reply::Bulk(Bytes::from_static(b"ab")),
                Reply::Null,
                Reply::Null,
                Reply::Map(vec![(
                    Reply::Simple("k".into()),
                    Reply::Double("1.5".into())
                )]),
                Reply::Bool(true),
                Reply::Verbatim("txt".into(), Bytes::from_static(b"abc")),
            ])
        );
    }

    #[test]
    fn incomplete_and_bad() {
        assert_eq!(one(b"*2\r\n:1\r\n"), Ok(None));
        assert_eq!(one(b"$5\r\nab"), Ok(None));
        assert_eq!(one(b"?x\r\n"), Err(ReplyError::UnknownType(b'?')));
        assert_eq!(
            one(b"*99999999999\r\n"),
            Err(ReplyError::BadLength(99999999999))
        );
        let deep = "*1\r\n".repeat(100);
        assert_eq!(one(deep.as_bytes()), Err(ReplyError::TooDeep(64)));
    }
}
