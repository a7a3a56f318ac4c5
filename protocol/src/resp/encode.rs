//! The reply side of RESP: appending RESP2 or RESP3 replies to a buffer.
//! The caller picks the version per connection ([`Version`]); the few reply
//! types that differ between the two (null, map, double, verbatim text) are
//! written the way that version's clients expect.
//!
//! What must hold: a simple string or error never carries `\r` or `\n`
//! (they would break the stream; they are replaced by spaces).

use bytes::{BufMut, BytesMut};

/// The protocol version a connection speaks (`HELLO 2` / `HELLO 3`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Version {
    #[default]
    Resp2,
    Resp3,
}

impl Version {
    pub fn number(self) -> i64 {
        match self {
            Version::Resp2 => 2,
            Version::Resp3 => 3,
        }
    }
}

/// Writes replies of one version into a buffer.
#[derive(Debug)]
pub struct ReplyWriter<'a> {
    pub out: &'a mut BytesMut,
    pub version: Version,
}

impl<'a> ReplyWriter<'a> {
    pub fn new(out: &'a mut BytesMut, version: Version) -> Self {
        ReplyWriter { out, version }
    }

    fn line(&mut self, prefix: u8, text: &[u8]) {
        self.out.reserve(text.len() + 3);
        self.out.put_u8(prefix);
        for &b in text {
            self.out
                .put_u8(if b == b'\r' || b == b'\n' { b' ' } else { b });
        }
        self.out.put_slice(b"\r\n");
    }

    fn number_line(&mut self, prefix: u8, n: i64) {
        self.out.put_u8(prefix);
        self.out.put_slice(itoa(n).as_bytes());
        self.out.put_slice(b"\r\n");
    }

    /// `+OK`
    pub fn ok(&mut self) {
        self.out.put_slice(b"+OK\r\n");
    }

    /// `+text`
    pub fn simple(&mut self, text: &str) {
        self.line(b'+', text.as_bytes());
    }

    /// `-text`; `text` starts with the error code (`ERR`, `WRONGTYPE`...).
    pub fn error(&mut self, text: &str) {
        self.line(b'-', text.as_bytes());
    }

    /// `:n`
    pub fn int(&mut self, n: i64) {
        self.number_line(b':', n);
    }

    /// `$len` + bytes
    pub fn bulk(&mut self, value: &[u8]) {
        self.out.reserve(value.len() + 16);
        self.number_line(b'$', value.len() as i64);
        self.out.put_slice(value);
        self.out.put_slice(b"\r\n");
    }

    /// The null reply: `$-1` in RESP2, `_` in RESP3.
    pub fn null(&mut self) {
        match self.version {
            Version::Resp2 => self.out.put_slice(b"$-1\r\n"),
            Version::Resp3 => self.out.put_slice(b"_\r\n"),
        }
    }

    /// The null array: `*-1` in RESP2, `_` in RESP3.
    pub fn null_array(&mut self) {
        match self.version {
            Version::Resp2 => self.out.put_slice(b"*-1\r\n"),
            Version::Resp3 => self.out.put_slice(b"_\r\n"),
        }
    }

    /// An array of `len` elements follows.
    pub fn array(&mut self, len: usize) {
        self.number_line(b'*', len as i64);
    }

    /// A map of `pairs` key/value pairs follows: `%pairs` in RESP3, a flat
    /// array of 2×pairs elements in RESP2.
    pub fn map(&mut self, pairs: usize) {
        match self.version {
            Version::Resp2 => self.number_line(b'*', 2 * pairs as i64),
            Version::Resp3 => self.number_line(b'%', pairs as i64),
        }
    }

    /// A double: `,repr` in RESP3, a bulk string in RESP2.
    pub fn double(&mut self, repr: &str) {
        match self.version {
            Version::Resp2 => self.bulk(repr.as_bytes()),
            Version::Resp3 => self.line(b',', repr.as_bytes()),
        }
    }

    /// Free text (INFO): a verbatim string `=len\r\ntxt:...` in RESP3, a bulk
    /// string in RESP2.
    pub fn verbatim(&mut self, text: &str) {
        match self.version {
            Version::Resp2 => self.bulk(text.as_bytes()),
            Version::Resp3 => {
                self.number_line(b'=', text.len() as i64 + 4);
                self.out.put_slice(b"txt:");
                self.out.put_slice(text.as_bytes());
                self.out.put_slice(b"\r\n");
            }
        }
    }
}

fn itoa(n: i64) -> String {
    n.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(version: Version, f: impl FnOnce(&mut ReplyWriter)) -> String {
        let mut out = BytesMut::new();
        f(&mut ReplyWriter::new(&mut out, version));
        String::from_utf8(out.to_vec()).unwrap()
    }

    #[test]
    fn version_dependent_types() {
        assert_eq!(write(Version::Resp2, |w| w.null()), "$-1\r\n");
        assert_eq!(write(Version::Resp3, |w| w.null()), "_\r\n");
        assert_eq!(write(Version::Resp2, |w| w.null_array()), "*-1\r\n");
        assert_eq!(write(Version::Resp2, |w| w.map(2)), "*4\r\n");
        assert_eq!(write(Version::Resp3, |w| w.map(2)), "%2\r\n");
        assert_eq!(write(Version::Resp2, |w| w.double("1.5")), "$3\r\n1.5\r\n");
        assert_eq!(write(Version::Resp3, |w| w.double("1.5")), ",1.5\r\n");
        assert_eq!(
            write(Version::Resp3, |w| w.verbatim("a")),
            "=5\r\ntxt:a\r\n"
        );
    }

    #[test]
    fn common_types() {
        assert_eq!(
            write(Version::Resp2, |w| {
                w.ok();
                w.int(-3);
                w.bulk(b"x\r\ny");
                w.array(0);
                w.error("ERR bad\r\nthing");
                w.simple("PONG");
            }),
            "+OK\r\n:-3\r\n$4\r\nx\r\ny\r\n*0\r\n-ERR bad  thing\r\n+PONG\r\n"
        );
    }
}
