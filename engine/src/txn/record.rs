//! The payload of a `TxnPart` WAL record: one shard's writes of one
//! committed transaction and the set of shards that hold the other parts.
//! The record header (length, CRC, LSN, commit version, kind 4) is the
//! common one of `wal::format`; this module owns the two fields inside it.
//!
//! Key field (part header): `txn_id u64 | participant_count u16 |
//! participant u16 × count` (shard numbers, strictly increasing).
//! Value field (writes): `write_count u32`, then per write `op u8` (1 put,
//! 2 delete), `key_len u32`, `value_len u32`, key, value (empty for a
//! delete). Little-endian; diagram in `docs/wal.md`.
//!
//! What must hold: `check_part` accepts exactly what `encode_*` produce;
//! a decoder never reads past a length it has not checked.
//!
//! Also here: `HeldPart`, an applied part a shard must keep in its log
//! (recovery rebuilds the list; the shard's transaction side extends it).

use bytes::Bytes;
use std::sync::Arc;

/// Write opcode of a put inside a part.
const OP_PUT: u8 = 1;
/// Write opcode of a delete inside a part.
const OP_DELETE: u8 = 2;
/// Fixed bytes of a part header before the participant list.
pub const PART_HEADER_FIXED_BYTES: usize = 8 + 2;
/// Fixed bytes of a write before its key and value.
pub const WRITE_FIXED_BYTES: usize = 1 + 4 + 4;
/// Bytes of the write count that starts the value field.
pub const WRITES_FIXED_BYTES: usize = 4;

/// A part of a multi-shard transaction, applied, whose segment must stay
/// until every participant's snapshots cover its own part.
#[derive(Debug, Clone)]
pub(crate) struct HeldPart {
    pub(crate) lsn: u64,
    pub(crate) parts: Arc<[(u16, u64)]>,
}

/// One buffered write of a transaction: `None` deletes the key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnWrite {
    pub key: Bytes,
    pub value: Option<Bytes>,
}

impl TxnWrite {
    /// Bytes this write takes in a part's value field.
    pub fn encoded_len(&self) -> usize {
        WRITE_FIXED_BYTES + self.key.len() + self.value.as_ref().map_or(0, |v| v.len())
    }
}

/// Bytes of a part header naming `participants` shards.
pub fn header_len(participants: usize) -> usize {
    PART_HEADER_FIXED_BYTES + 2 * participants
}

/// The part header: transaction id and participant shards (sorted, unique).
pub fn encode_header(txn_id: u64, participants: &[u16]) -> Vec<u8> {
    assert!(
        !participants.is_empty(),
        "a part names at least its own shard"
    );
    assert!(
        participants.windows(2).all(|w| w[0] < w[1]),
        "participants are sorted and unique"
    );
    let count = u16::try_from(participants.len()).expect("at most 65535 shards");
    let mut out = Vec::with_capacity(header_len(participants.len()));
    out.extend_from_slice(&txn_id.to_le_bytes());
    out.extend_from_slice(&count.to_le_bytes());
    for p in participants {
        out.extend_from_slice(&p.to_le_bytes());
    }
    out
}

/// The writes field of a part.
pub fn encode_writes(writes: &[TxnWrite]) -> Vec<u8> {
    let count = u32::try_from(writes.len()).expect("fewer than 2^32 writes");
    let total = WRITES_FIXED_BYTES + writes.iter().map(TxnWrite::encoded_len).sum::<usize>();
    let mut out = Vec::with_capacity(total);
    out.extend_from_slice(&count.to_le_bytes());
    for w in writes {
        let (op, value): (u8, &[u8]) = match &w.value {
            Some(v) => (OP_PUT, v),
            None => (OP_DELETE, b""),
        };
        out.push(op);
        out.extend_from_slice(&(w.key.len() as u32).to_le_bytes());
        out.extend_from_slice(&(value.len() as u32).to_le_bytes());
        out.extend_from_slice(&w.key);
        out.extend_from_slice(value);
    }
    out
}

/// A decoded part header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartHeader {
    pub txn_id: u64,
    pub participants: Vec<u16>,
}

/// Decodes a part header (the record's key field).
pub fn decode_header(key: &[u8]) -> Result<PartHeader, &'static str> {
    if key.len() < PART_HEADER_FIXED_BYTES {
        return Err("part header shorter than its fixed fields");
    }
    let txn_id = u64::from_le_bytes(key[0..8].try_into().map_err(|_| "txn id")?);
    let count = u16::from_le_bytes(key[8..10].try_into().map_err(|_| "count")?) as usize;
    if count == 0 {
        return Err("a part names no participant");
    }
    if key.len() != header_len(count) {
        return Err("part header length does not match its participant count");
    }
    let participants: Vec<u16> = key[PART_HEADER_FIXED_BYTES..]
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect();
    if !participants.windows(2).all(|w| w[0] < w[1]) {
        return Err("participants are not sorted and unique");
    }
    Ok(PartHeader {
        txn_id,
        participants,
    })
}

fn read_u32(bytes: &[u8], at: usize) -> Result<usize, &'static str> {
    let b = bytes.get(at..at + 4).ok_or("write field past the end")?;
    Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
}

/// Calls `each(key, value)` for every write of a part's value field
/// (`None` for a delete), in order; errs on the first malformed byte.
pub fn visit_writes<'a>(
    value: &'a [u8],
    mut each: impl FnMut(&'a [u8], Option<&'a [u8]>),
) -> Result<(), &'static str> {
    let count = read_u32(value, 0)?;
    let mut at = WRITES_FIXED_BYTES;
    for _ in 0..count {
        let op = *value.get(at).ok_or("write past the end")?;
        let key_len = read_u32(value, at + 1)?;
        let value_len = read_u32(value, at + 5)?;
        let start = at + WRITE_FIXED_BYTES;
        let key_end = start.checked_add(key_len).ok_or("key length overflows")?;
        let end = key_end
            .checked_add(value_len)
            .ok_or("value length overflows")?;
        if end > value.len() {
            return Err("write past the end");
        }
        if key_len == 0 {
            return Err("empty key in a write");
        }
        let key = &value[start..key_end];
        match op {
            OP_PUT => each(key, Some(&value[key_end..end])),
            OP_DELETE if value_len == 0 => each(key, None),
            OP_DELETE => return Err("a delete carries a value"),
            _ => return Err("unknown write opcode"),
        }
        at = end;
    }
    if at != value.len() {
        return Err("bytes after the last write");
    }
    Ok(())
}

/// Whether a record's key and value fields form a valid part.
pub fn check_part(key: &[u8], value: &[u8]) -> Result<(), &'static str> {
    decode_header(key)?;
    visit_writes(value, |_, _| {})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(key: &str, value: Option<&str>) -> TxnWrite {
        TxnWrite {
            key: Bytes::copy_from_slice(key.as_bytes()),
            value: value.map(|v| Bytes::copy_from_slice(v.as_bytes())),
        }
    }

    #[test]
    fn a_part_round_trips() {
        let writes = vec![w("a", Some("1")), w("bb", None), w("c", Some(""))];
        let header = encode_header(77, &[0, 3]);
        let body = encode_writes(&writes);
        assert_eq!(
            body.len(),
            4 + writes.iter().map(|w| w.encoded_len()).sum::<usize>()
        );
        check_part(&header, &body).unwrap();
        let h = decode_header(&header).unwrap();
        assert_eq!(h.txn_id, 77);
        assert_eq!(h.participants, vec![0, 3]);
        let mut seen = Vec::new();
        visit_writes(&body, |k, v| seen.push((k.to_vec(), v.map(|v| v.to_vec())))).unwrap();
        assert_eq!(
            seen,
            vec![
                (b"a".to_vec(), Some(b"1".to_vec())),
                (b"bb".to_vec(), None),
                (b"c".to_vec(), Some(Vec::new())),
            ]
        );
    }

    #[test]
    fn every_truncation_and_bad_field_is_refused() {
        let header = encode_header(1, &[2]);
        let body = encode_writes(&[w("key", Some("value"))]);
        for cut in 0..body.len() {
            assert!(check_part(&header, &body[..cut]).is_err(), "cut at {cut}");
        }
        for cut in 0..header.len() {
            assert!(check_part(&header[..cut], &body).is_err(), "cut at {cut}");
        }
        let mut extra = body.clone();
        extra.push(0);
        assert!(check_part(&header, &extra).is_err());
        let mut bad_op = body.clone();
        bad_op[4] = 9;
        assert!(check_part(&header, &bad_op).is_err());
        let unsorted = [
            1u64.to_le_bytes().as_slice(),
            &2u16.to_le_bytes(),
            &3u16.to_le_bytes(),
            &1u16.to_le_bytes(),
        ]
        .concat();
        assert!(decode_header(&unsorted).is_err());
    }
}
