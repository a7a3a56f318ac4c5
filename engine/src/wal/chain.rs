//! Chunk chains on replay: a value too large for one flush is logged as
//! `Chunk` records with consecutive LSNs, closed by a `FLAG_CHAIN_END` Put
//! naming the first chunk (`docs/wal.md`, "Chunk chains").
//!
//! What must hold: a chain is applied only whole, at its end record. A
//! chain the log leaves unfinished (at its end, or followed by another
//! record after a restart) was never acknowledged and is dropped. An end
//! record whose chunks are not right before it is damage, never a guess.

use crate::error::Damage;
use crate::wal::format::{Record, RecordKind, CHAIN_BYTES_MAX};

/// The chain being read, if any.
#[derive(Debug, Default)]
pub struct ChainReplay {
    /// Whether the value bytes are kept (replay) or only counted (verify).
    keep: bool,
    open: Option<OpenChain>,
    /// Chains dropped because another record followed them unfinished.
    pub abandoned: u64,
    /// Chains read whole.
    pub whole: u64,
}

#[derive(Debug)]
struct OpenChain {
    first_lsn: u64,
    next_lsn: u64,
    bytes: Vec<u8>,
    len: usize,
}

/// The chain still open where the log ends: never acknowledged, dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnfinishedChain {
    pub first_lsn: u64,
    pub last_lsn: u64,
    pub bytes: u64,
}

impl ChainReplay {
    /// A reader that keeps the chunks' bytes to hand out whole values.
    pub fn keeping() -> ChainReplay {
        ChainReplay {
            keep: true,
            ..ChainReplay::default()
        }
    }

    /// A reader that only checks and counts chains.
    pub fn counting() -> ChainReplay {
        ChainReplay::default()
    }

    /// Takes the next record of the log (every kind but seals). Returns
    /// the chain's whole value when `r` ends one (kept mode; empty when
    /// counting), `None` otherwise; `Err` for an end record without its
    /// chunks or a chain longer than any value.
    pub fn record(&mut self, r: &Record<'_>) -> Result<Option<Vec<u8>>, Damage> {
        match (r.kind, r.chain_first_lsn) {
            (RecordKind::Chunk, _) => {
                if self.open.as_ref().is_none_or(|c| c.next_lsn != r.lsn) {
                    self.abandon();
                    self.open = Some(OpenChain {
                        first_lsn: r.lsn,
                        next_lsn: r.lsn,
                        bytes: Vec::new(),
                        len: 0,
                    });
                }
                let keep = self.keep;
                let Some(c) = self.open.as_mut() else {
                    unreachable!("opened above")
                };
                if c.len + r.value.len() > CHAIN_BYTES_MAX {
                    return Err(Damage::BadChain {
                        lsn: r.lsn,
                        reason: "its chunks hold more than the largest value",
                    });
                }
                if keep {
                    c.bytes.extend_from_slice(r.value);
                }
                c.len += r.value.len();
                c.next_lsn = r.lsn + 1;
                Ok(None)
            }
            (RecordKind::Put, Some(first)) => {
                let Some(mut c) = self.open.take() else {
                    return Err(Damage::BadChain {
                        lsn: r.lsn,
                        reason: "no chunks before its end record",
                    });
                };
                if c.first_lsn != first || c.next_lsn != r.lsn {
                    return Err(Damage::BadChain {
                        lsn: r.lsn,
                        reason: "its chunks are not the ones right before it",
                    });
                }
                if c.len + r.value.len() > CHAIN_BYTES_MAX {
                    return Err(Damage::BadChain {
                        lsn: r.lsn,
                        reason: "it holds more than the largest value",
                    });
                }
                self.whole += 1;
                if self.keep {
                    c.bytes.extend_from_slice(r.value);
                }
                Ok(Some(c.bytes))
            }
            _ => {
                self.abandon();
                Ok(None)
            }
        }
    }

    fn abandon(&mut self) {
        if let Some(c) = self.open.take() {
            tracing::warn!(
                first_lsn = c.first_lsn,
                last_lsn = c.next_lsn - 1,
                bytes = c.len,
                "an unfinished chunk chain (never acknowledged) is followed by other records; it is dropped"
            );
            self.abandoned += 1;
        }
    }

    /// The chain left open where the log ends (dropped), if any.
    pub fn unfinished(&self) -> Option<UnfinishedChain> {
        self.open.as_ref().map(|c| UnfinishedChain {
            first_lsn: c.first_lsn,
            last_lsn: c.next_lsn - 1,
            bytes: c.len as u64,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wal::format::{
        chain_end_size, chunk_record_size, decode_record, encode_chain_end, encode_chunk,
        encode_record, Decoded,
    };

    fn chunk(lsn: u64, piece: &[u8]) -> Vec<u8> {
        let mut out = vec![0u8; chunk_record_size(piece.len())];
        encode_chunk(&mut out, lsn, 1, 0, piece);
        out
    }

    fn end(lsn: u64, first: u64, key: &[u8], tail: &[u8]) -> Vec<u8> {
        let mut out = vec![0u8; chain_end_size(key.len(), tail.len(), Some(7))];
        encode_chain_end(&mut out, lsn, 1, 0, key, tail, Some(7), first);
        out
    }

    fn put(lsn: u64) -> Vec<u8> {
        let mut out = vec![0u8; 64];
        let n = encode_record(&mut out, lsn, 1, RecordKind::Put, 0, b"k", b"v");
        out.truncate(n);
        out
    }

    fn feed(c: &mut ChainReplay, bytes: &[u8]) -> Result<Option<Vec<u8>>, Damage> {
        let Ok(Decoded::Record(r)) = decode_record(bytes, bytes.len()) else {
            panic!("record does not decode");
        };
        c.record(&r)
    }

    #[test]
    fn a_whole_chain_gives_its_value_at_the_end() {
        let mut c = ChainReplay::keeping();
        assert_eq!(feed(&mut c, &chunk(5, b"abc")), Ok(None));
        assert_eq!(feed(&mut c, &chunk(6, b"def")), Ok(None));
        let e = end(7, 5, b"key", b"g");
        let Ok(Decoded::Record(r)) = decode_record(&e, e.len()) else {
            panic!()
        };
        assert_eq!(r.key, b"key");
        assert_eq!(r.expires_at_ms, Some(7));
        assert_eq!(r.chain_first_lsn, Some(5));
        assert_eq!(c.record(&r), Ok(Some(b"abcdefg".to_vec())));
        assert_eq!(c.whole, 1);
        assert_eq!(c.unfinished(), None);
    }

    #[test]
    fn an_end_without_its_chunks_is_damage() {
        let mut c = ChainReplay::keeping();
        assert!(feed(&mut c, &end(7, 5, b"key", b"")).is_err());
        let mut c = ChainReplay::keeping();
        feed(&mut c, &chunk(6, b"x")).unwrap();
        // The end names chunk 5, the chain read starts at 6.
        assert!(matches!(
            feed(&mut c, &end(7, 5, b"key", b"")),
            Err(Damage::BadChain { lsn: 7, .. })
        ));
    }

    #[test]
    fn an_unfinished_chain_is_dropped_and_reported() {
        let mut c = ChainReplay::keeping();
        feed(&mut c, &chunk(1, b"ab")).unwrap();
        feed(&mut c, &chunk(2, b"cd")).unwrap();
        assert_eq!(
            c.unfinished(),
            Some(UnfinishedChain {
                first_lsn: 1,
                last_lsn: 2,
                bytes: 4
            })
        );
        // The log went on after a restart: the chain is abandoned.
        assert_eq!(feed(&mut c, &put(3)), Ok(None));
        assert_eq!(c.abandoned, 1);
        assert_eq!(c.unfinished(), None);
        // A new chain after a gap starts fresh.
        feed(&mut c, &chunk(4, b"z")).unwrap();
        assert_eq!(feed(&mut c, &end(5, 4, b"k", b"")), Ok(Some(b"z".to_vec())));
    }

    #[test]
    fn counting_mode_keeps_no_bytes() {
        let mut c = ChainReplay::counting();
        feed(&mut c, &chunk(1, &[1u8; 1000])).unwrap();
        assert_eq!(feed(&mut c, &end(2, 1, b"k", b"")), Ok(Some(Vec::new())));
        assert_eq!(c.whole, 1);
    }

    #[test]
    fn chunk_and_chain_end_bit_flips_are_detected() {
        for rec in [chunk(3, b"piece"), end(9, 3, b"key", b"t")] {
            for bit in 0..rec.len() * 8 {
                let mut b = rec.clone();
                b[bit / 8] ^= 1 << (bit % 8);
                assert!(
                    !matches!(decode_record(&b, b.len()), Ok(Decoded::Record(_))),
                    "bit {bit} flipped went unnoticed"
                );
            }
        }
    }
}
