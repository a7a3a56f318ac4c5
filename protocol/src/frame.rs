//! Framing shared by every post-handshake message: the 24-byte header, the
//! length prefix and the CRC-32 that covers everything after it. A frame is
//! accepted only once its length is within the limit, all its bytes are
//! buffered and its checksum matches; nothing is allocated from an unchecked
//! length.

use bytes::{BufMut, Bytes, BytesMut};

use super::error::{DecodeError, FrameFault};
use super::limits::Limits;
use super::wire::{CHECKSUM_START, FRAME_HEADER_BYTES, LEN_PREFIX_BYTES, MESSAGE_BYTES_MAX};

/// Checks the frame at the start of `buf` without consuming it.
///
/// Returns the frame's total size (length prefix included) once the whole
/// frame is buffered and its checksum matches. `Err(NeedMore { need, .. })`
/// says how many bytes the frame needs in total; `need` is only ever larger
/// than 4 after the length prefix passed the `frame_bytes_max` check, so a
/// caller may reserve `need` bytes safely. Every other error is fatal for the
/// connection.
pub fn check_frame(buf: &[u8], limits: &Limits) -> Result<usize, DecodeError> {
    let have = buf.len();
    let Some(prefix) = buf.first_chunk::<LEN_PREFIX_BYTES>() else {
        return Err(DecodeError::NeedMore {
            have,
            need: LEN_PREFIX_BYTES,
        });
    };
    let len = u32::from_le_bytes(*prefix);
    let min = (FRAME_HEADER_BYTES - LEN_PREFIX_BYTES) as u32;
    if len < min {
        return Err(DecodeError::FrameTooShort { len, min });
    }
    let total = LEN_PREFIX_BYTES as u64 + u64::from(len);
    if total > u64::from(limits.frame_bytes_max) {
        return Err(DecodeError::FrameTooLarge {
            len: total,
            max: limits.frame_bytes_max,
        });
    }
    // Fits in usize: total <= frame_bytes_max, a u32.
    let total = total as usize;
    if have < total {
        return Err(DecodeError::NeedMore { have, need: total });
    }
    let stored = read_u32(buf, LEN_PREFIX_BYTES);
    let computed = crc32fast::hash(&buf[CHECKSUM_START..total]);
    if stored != computed {
        return Err(DecodeError::ChecksumMismatch { stored, computed });
    }
    Ok(total)
}

/// Removes the next complete, checksummed frame from `buf`. `Ok(None)` when
/// more bytes are needed.
pub(crate) fn take_frame(
    buf: &mut BytesMut,
    limits: &Limits,
) -> Result<Option<Bytes>, DecodeError> {
    match check_frame(buf, limits) {
        Ok(total) => Ok(Some(buf.split_to(total).freeze())),
        Err(DecodeError::NeedMore { .. }) => Ok(None),
        Err(error) => Err(error),
    }
}

/// Removes the next complete frame from `buf` and parses it with `parse`,
/// which names the frame's id with any fault it finds. `Ok(None)` when more
/// bytes are needed (nothing consumed).
pub(crate) fn take_and_parse<T>(
    buf: &mut BytesMut,
    limits: &Limits,
    parse: impl FnOnce(&Bytes, &Limits) -> Result<T, (u64, FrameFault)>,
) -> Result<Option<T>, DecodeError> {
    let Some(frame) = take_frame(buf, limits)? else {
        return Ok(None);
    };
    parse(&frame, limits)
        .map(Some)
        .map_err(|(id, fault)| DecodeError::Rejected { id, fault })
}

fn read_u32(buf: &[u8], at: usize) -> u32 {
    let mut le = [0u8; 4];
    le.copy_from_slice(&buf[at..at + 4]);
    u32::from_le_bytes(le)
}

/// The fixed fields of a frame header, after the length and checksum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Header {
    pub kind: u8,
    pub count: u32,
    pub id: u64,
}

/// Reads the header of a checked frame (see [`check_frame`]) and positions a
/// cursor on its body. Reserved header bytes must be zero.
pub(crate) fn open_frame(frame: &Bytes) -> Result<(Header, Cursor<'_>), (u64, FrameFault)> {
    assert!(
        frame.len() >= FRAME_HEADER_BYTES,
        "open_frame needs a checked frame"
    );
    // The id is read first so every fault below can name the request.
    let mut id_le = [0u8; 8];
    id_le.copy_from_slice(&frame[16..24]);
    let id = u64::from_le_bytes(id_le);
    let kind = frame[8];
    for offset in 9..12 {
        if frame[offset] != 0 {
            let got = frame[offset];
            return Err((
                id,
                FrameFault::ReservedBits {
                    what: "header byte",
                    offset,
                    got,
                },
            ));
        }
    }
    let count = read_u32(frame, 12);
    Ok((
        Header { kind, count, id },
        Cursor::new(frame, FRAME_HEADER_BYTES),
    ))
}

/// Reads little-endian fields from a frame, handing out byte fields as
/// zero-copy slices of it. Every read checks that the field fits.
pub(crate) struct Cursor<'a> {
    frame: &'a Bytes,
    offset: usize,
}

impl<'a> Cursor<'a> {
    pub fn new(frame: &'a Bytes, offset: usize) -> Self {
        assert!(offset <= frame.len());
        Cursor { frame, offset }
    }

    pub fn offset(&self) -> usize {
        self.offset
    }

    pub fn remaining(&self) -> usize {
        self.frame.len() - self.offset
    }

    fn take(&mut self, need: usize, what: &'static str) -> Result<&'a [u8], FrameFault> {
        let have = self.remaining();
        if need > have {
            return Err(FrameFault::Truncated {
                what,
                offset: self.offset,
                need,
                have,
            });
        }
        let frame: &'a Bytes = self.frame;
        let field = &frame[self.offset..self.offset + need];
        self.offset += need;
        Ok(field)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], FrameFault> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N, what)?);
        Ok(out)
    }

    pub fn u8(&mut self, what: &'static str) -> Result<u8, FrameFault> {
        Ok(self.array::<1>(what)?[0])
    }

    pub fn u16(&mut self, what: &'static str) -> Result<u16, FrameFault> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }

    pub fn u32(&mut self, what: &'static str) -> Result<u32, FrameFault> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    pub fn u64(&mut self, what: &'static str) -> Result<u64, FrameFault> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A zero-copy slice of the next `len` bytes.
    pub fn bytes(&mut self, len: usize, what: &'static str) -> Result<Bytes, FrameFault> {
        let have = self.remaining();
        if len > have {
            return Err(FrameFault::Truncated {
                what,
                offset: self.offset,
                need: len,
                have,
            });
        }
        let slice = self.frame.slice(self.offset..self.offset + len);
        self.offset += len;
        Ok(slice)
    }

    /// The next `len` bytes as UTF-8 text.
    /// An error message: a u16 length (at most [`MESSAGE_BYTES_MAX`]) and
    /// that many bytes of UTF-8.
    pub fn message(&mut self) -> Result<String, FrameFault> {
        let len = self.u16("message length")? as usize;
        if len > MESSAGE_BYTES_MAX {
            return Err(FrameFault::MessageTooLarge {
                len,
                max: MESSAGE_BYTES_MAX,
            });
        }
        self.text(len, "message")
    }

    pub fn text(&mut self, len: usize, what: &'static str) -> Result<String, FrameFault> {
        let offset = self.offset;
        let raw = self.take(len, what)?;
        match std::str::from_utf8(raw) {
            Ok(text) => Ok(text.to_owned()),
            Err(_) => Err(FrameFault::InvalidUtf8 { what, offset }),
        }
    }

    /// Fails if anything is left after the last field.
    pub fn finish(self) -> Result<(), FrameFault> {
        match self.remaining() {
            0 => Ok(()),
            count => Err(FrameFault::TrailingBytes {
                offset: self.offset,
                count,
            }),
        }
    }
}

/// Starts a frame in `buf`: writes a header with placeholder length and
/// checksum. Returns where the frame starts, for [`finish_frame`].
pub(crate) fn begin_frame(buf: &mut BytesMut, kind: u8, count: u32, id: u64) -> usize {
    let start = buf.len();
    buf.put_u32_le(0); // length, patched by finish_frame
    buf.put_u32_le(0); // checksum, patched by finish_frame
    buf.put_u8(kind);
    buf.put_bytes(0, 3);
    buf.put_u32_le(count);
    buf.put_u64_le(id);
    debug_assert_eq!(buf.len() - start, FRAME_HEADER_BYTES);
    start
}

/// Patches the length prefix and checksum of the frame begun at `start`.
pub(crate) fn finish_frame(buf: &mut BytesMut, start: usize) {
    let total = buf.len() - start;
    assert!(
        total >= FRAME_HEADER_BYTES,
        "frame at {start} lost its header"
    );
    let len = wire_len(total - LEN_PREFIX_BYTES, "frame");
    buf[start..start + 4].copy_from_slice(&len.to_le_bytes());
    let crc = crc32fast::hash(&buf[start + CHECKSUM_START..]);
    buf[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

/// A length as the u32 the wire carries. Larger lengths are a caller bug:
/// every path that builds frames from outside input checks [`Limits`] first.
pub(crate) fn wire_len(len: usize, what: &str) -> u32 {
    assert!(
        len <= u32::MAX as usize,
        "{what} of {len} bytes cannot be encoded (u32 length)"
    );
    len as u32
}

/// The longest prefix of `text` that is at most `max` bytes and ends on a
/// character boundary.
pub(crate) fn truncate_utf8(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame_with_body(body: &[u8]) -> BytesMut {
        let mut buf = BytesMut::new();
        let start = begin_frame(&mut buf, 1, 0, 42);
        buf.extend_from_slice(body);
        finish_frame(&mut buf, start);
        buf
    }

    #[test]
    fn check_frame_needs_the_prefix_then_the_whole_frame() {
        let limits = Limits::default();
        let frame = frame_with_body(b"abc");
        assert_eq!(
            check_frame(&frame[..3], &limits),
            Err(DecodeError::NeedMore { have: 3, need: 4 })
        );
        assert_eq!(
            check_frame(&frame[..10], &limits),
            Err(DecodeError::NeedMore { have: 10, need: 27 })
        );
        assert_eq!(check_frame(&frame, &limits), Ok(27));
    }

    #[test]
    fn oversized_prefix_is_rejected_with_four_bytes() {
        let limits = Limits {
            frame_bytes_max: 4096,
            ..Limits::default()
        };
        let prefix = 4093u32.to_le_bytes();
        assert_eq!(
            check_frame(&prefix, &limits),
            Err(DecodeError::FrameTooLarge {
                len: 4097,
                max: 4096
            })
        );
        let huge = u32::MAX.to_le_bytes();
        assert_eq!(
            check_frame(&huge, &limits),
            Err(DecodeError::FrameTooLarge {
                len: 4 + u64::from(u32::MAX),
                max: 4096
            })
        );
    }

    #[test]
    fn short_prefix_is_rejected() {
        assert_eq!(
            check_frame(&19u32.to_le_bytes(), &Limits::default()),
            Err(DecodeError::FrameTooShort { len: 19, min: 20 })
        );
    }

    #[test]
    fn any_flipped_bit_after_the_prefix_fails_the_checksum() {
        let limits = Limits::default();
        let frame = frame_with_body(b"payload");
        for byte in 4..frame.len() {
            for bit in 0..8 {
                let mut bad = frame.clone();
                bad[byte] ^= 1 << bit;
                assert!(
                    matches!(
                        check_frame(&bad, &limits),
                        Err(DecodeError::ChecksumMismatch { .. })
                    ),
                    "byte {byte} bit {bit}"
                );
            }
        }
    }

    #[test]
    fn truncate_utf8_keeps_whole_characters() {
        assert_eq!(truncate_utf8("héllo", 2), "h");
        assert_eq!(truncate_utf8("héllo", 3), "hé");
        assert_eq!(truncate_utf8("abc", 10), "abc");
        assert_eq!(truncate_utf8("abc", 0), "");
    }
}
