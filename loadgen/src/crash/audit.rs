//! The durability audit of a crash run: versioned values, the per-key table
//! of versions written and acknowledged, and the read-back check.
//!
//! What must hold (the audit's rule, docs/loadgen.md "Crash runs"): for
//! every key read back, the value is well-formed (magic, its own key, a
//! matching checksum), its version is at least the highest version
//! acknowledged for that key before the kill, and at most the highest
//! version ever sent for it. A key with an acknowledged version that reads
//! back as missing or older is lost; a version above the highest sent is a
//! phantom (a value nobody wrote).

use bytes::Bytes;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};

/// First bytes of every audited value.
const MAGIC: [u8; 4] = *b"RKVA";
/// magic (4) + key number (8) + version (4) + balance (8) + checksum (4).
pub const HEADER_BYTES: usize = 28;

/// What one audited value says about itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Versioned {
    pub keynum: u64,
    pub version: u32,
    /// The account balance (bank runs); 0 elsewhere.
    pub balance: i64,
}

/// Why a value read back is not a value loadgen wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Malformed {
    TooShort,
    Magic,
    Checksum,
}

/// The value of `v`, padded with a pattern to `size` bytes (at least
/// [`HEADER_BYTES`]). The checksum covers every other byte, padding included.
pub fn encode(v: Versioned, size: usize) -> Bytes {
    let size = size.max(HEADER_BYTES);
    let mut out = Vec::with_capacity(size);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&v.keynum.to_le_bytes());
    out.extend_from_slice(&v.version.to_le_bytes());
    out.extend_from_slice(&v.balance.to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.extend((HEADER_BYTES..size).map(|i| (i as u8) ^ (v.version as u8)));
    let crc = checksum(&out);
    out[24..28].copy_from_slice(&crc.to_le_bytes());
    Bytes::from(out)
}

/// Reads back what [`encode`] wrote.
pub fn decode(value: &[u8]) -> Result<Versioned, Malformed> {
    if value.len() < HEADER_BYTES {
        return Err(Malformed::TooShort);
    }
    if value[..4] != MAGIC {
        return Err(Malformed::Magic);
    }
    let word = |from: usize, to: usize| value[from..to].to_vec();
    let stored = u32::from_le_bytes(word(24, 28).try_into().expect("4 bytes"));
    if checksum(value) != stored {
        return Err(Malformed::Checksum);
    }
    Ok(Versioned {
        keynum: u64::from_le_bytes(word(4, 12).try_into().expect("8 bytes")),
        version: u32::from_le_bytes(word(12, 16).try_into().expect("4 bytes")),
        balance: i64::from_le_bytes(word(16, 24).try_into().expect("8 bytes")),
    })
}

/// crc32 of the value with its checksum field read as zero.
fn checksum(value: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&value[..24]);
    h.update(&[0; 4]);
    h.update(&value[HEADER_BYTES..]);
    h.finalize()
}

/// Per key: the highest version sent and the highest acknowledged (8 bytes
/// a key, so 15M records take 120 MB). Version 0 means "never".
pub struct VersionTable {
    written: Vec<AtomicU32>,
    acked: Vec<AtomicU32>,
}

impl VersionTable {
    pub fn new(keys: u64) -> VersionTable {
        let n = usize::try_from(keys).expect("the key count fits in memory");
        VersionTable {
            written: (0..n).map(|_| AtomicU32::new(0)).collect(),
            acked: (0..n).map(|_| AtomicU32::new(0)).collect(),
        }
    }

    pub fn keys(&self) -> u64 {
        self.written.len() as u64
    }

    /// Claims the next version of `keynum` for a write about to be sent.
    pub fn next_version(&self, keynum: u64) -> u32 {
        self.written[keynum as usize].fetch_add(1, Relaxed) + 1
    }

    /// Notes that `version` of `keynum` was sent (transactions choose their
    /// version from the value they read).
    pub fn note_written(&self, keynum: u64, version: u32) {
        self.written[keynum as usize].fetch_max(version, Relaxed);
    }

    /// The server acknowledged `version` of `keynum`.
    pub fn acknowledge(&self, keynum: u64, version: u32) {
        assert!(
            version <= self.written(keynum),
            "an acknowledged version was sent"
        );
        self.acked[keynum as usize].fetch_max(version, Relaxed);
    }

    pub fn written(&self, keynum: u64) -> u32 {
        self.written[keynum as usize].load(Relaxed)
    }

    pub fn acked(&self, keynum: u64) -> u32 {
        self.acked[keynum as usize].load(Relaxed)
    }

    /// After a loss the server's state is the new floor: later audits
    /// measure only what later kills lose.
    pub fn lower_acked(&self, keynum: u64, version: u32) {
        self.acked[keynum as usize].store(version, Relaxed);
    }
}

/// What the read-back found for one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finding {
    Ok,
    /// Acknowledged `acked`, found `found` (0 = missing).
    Lost {
        acked: u32,
        found: u32,
    },
    /// A version above the highest ever sent.
    Phantom {
        written: u32,
        found: u32,
    },
    Malformed(Malformed),
    /// The value names another key.
    WrongKey {
        found: u64,
    },
}

/// Checks one key's read-back (`None`: the server has no such key).
pub fn check(
    table: &VersionTable,
    keynum: u64,
    got: Option<&[u8]>,
) -> (Finding, Option<Versioned>) {
    let acked = table.acked(keynum);
    let Some(value) = got else {
        let finding = if acked > 0 {
            Finding::Lost { acked, found: 0 }
        } else {
            Finding::Ok
        };
        return (finding, None);
    };
    let v = match decode(value) {
        Ok(v) => v,
        Err(m) => return (Finding::Malformed(m), None),
    };
    let written = table.written(keynum);
    let finding = if v.keynum != keynum {
        Finding::WrongKey { found: v.keynum }
    } else if v.version > written {
        Finding::Phantom {
            written,
            found: v.version,
        }
    } else if v.version < acked {
        Finding::Lost {
            acked,
            found: v.version,
        }
    } else {
        Finding::Ok
    };
    (finding, Some(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table_with(keynum: u64, written: u32, acked: u32) -> VersionTable {
        let t = VersionTable::new(keynum + 1);
        for _ in 0..written {
            t.next_version(keynum);
        }
        if acked > 0 {
            t.acknowledge(keynum, acked);
        }
        t
    }

    fn value(keynum: u64, version: u32) -> Bytes {
        encode(
            Versioned {
                keynum,
                version,
                balance: -5,
            },
            64,
        )
    }

    #[test]
    fn a_value_round_trips_and_a_flipped_byte_is_caught() {
        let v = Versioned {
            keynum: 7,
            version: 3,
            balance: -12,
        };
        let bytes = encode(v, 100);
        assert_eq!(bytes.len(), 100);
        assert_eq!(decode(&bytes), Ok(v));
        for i in [0, 5, 13, 20, 60, 99] {
            let mut bad = bytes.to_vec();
            bad[i] ^= 1;
            assert!(decode(&bad).is_err(), "byte {i} flipped was not caught");
        }
        assert_eq!(decode(&bytes[..10]), Err(Malformed::TooShort));
        assert_eq!(encode(v, 1).len(), HEADER_BYTES);
    }

    #[test]
    fn the_rule_sorts_each_case() {
        let t = table_with(2, 5, 3);
        assert_eq!(check(&t, 2, Some(&value(2, 3))).0, Finding::Ok);
        assert_eq!(check(&t, 2, Some(&value(2, 5))).0, Finding::Ok);
        assert_eq!(
            check(&t, 2, Some(&value(2, 2))).0,
            Finding::Lost { acked: 3, found: 2 }
        );
        assert_eq!(check(&t, 2, None).0, Finding::Lost { acked: 3, found: 0 });
        assert_eq!(
            check(&t, 2, Some(&value(2, 6))).0,
            Finding::Phantom {
                written: 5,
                found: 6
            }
        );
        assert_eq!(
            check(&t, 2, Some(&value(1, 4))).0,
            Finding::WrongKey { found: 1 }
        );
        assert_eq!(
            check(&t, 2, Some(b"garbage-garbage-garbage-garbage")).0,
            Finding::Malformed(Malformed::Magic)
        );
        // Never acknowledged: missing is fine.
        assert_eq!(check(&table_with(0, 2, 0), 0, None).0, Finding::Ok);
    }
}
