//! Write marks: what Redis's WATCH needs from the engine. Each shard keeps
//! a counter per slot of key hashes ([`WRITE_MARK_SLOTS`] slots), bumped
//! on its own thread whenever a key hashing to that slot changes in the
//! tier: a put, a delete, a read-modify-write that wrote, an expiry
//! delete, a transaction part applied. A [`KeyMark`] is a key's slot
//! counter and its expiry time at one moment; a later mark that differs
//! (or an expiry time that has passed) means the key may have changed.
//!
//! What must hold: every change of a key in the tier bumps its slot in
//! the same step that makes the change visible (so a mark taken after a
//! change sees it, and one taken before it differs afterwards); counters
//! only grow (`u64`, they do not wrap in practice). A mark never misses a
//! change, including a write of the same value (no value is compared);
//! keys sharing a slot make a change of one look like a change of the
//! other (a spurious difference, never a missed one).
//!
//! Taking marks ([`Handle::key_marks`](crate::Handle::key_marks)) goes
//! through the shards, so it is in `crate::coordinator`.

use crate::hash::mix;

/// Counter slots per shard (8 bytes each: 512 KiB per shard).
pub const WRITE_MARK_SLOTS: usize = 1 << 16;
const _: () = assert!(WRITE_MARK_SLOTS.is_power_of_two());

/// The slot counters of one shard (lives in its core state).
pub(crate) struct WriteMarks {
    counters: Box<[u64]>,
}

impl WriteMarks {
    pub(crate) fn new() -> WriteMarks {
        WriteMarks {
            counters: vec![0; WRITE_MARK_SLOTS].into_boxed_slice(),
        }
    }

    /// The slot of a key's table hash ([`crate::hash::TableHasher`], keyed
    /// in a data directory made by this build, so a client cannot choose
    /// keys that share a slot): the finalised hash's top bits.
    fn slot(hash: u64) -> usize {
        (mix(hash) >> (64 - WRITE_MARK_SLOTS.trailing_zeros())) as usize
    }

    /// A key with table hash `hash` changed.
    pub(crate) fn bump(&mut self, hash: u64) {
        let c = &mut self.counters[Self::slot(hash)];
        *c = c.wrapping_add(1);
    }

    pub(crate) fn get(&self, hash: u64) -> u64 {
        self.counters[Self::slot(hash)]
    }
}

/// A key's write mark at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyMark {
    /// The key's slot counter on its shard.
    pub writes: u64,
    /// When the key expires (Unix ms), if it is present and has an expiry
    /// time. Passing this time changes the key without a write.
    pub expires_at_ms: Option<u64>,
}

impl KeyMark {
    /// Whether the key may have changed between `self` (taken earlier)
    /// and `later`, as seen at `now_ms`: a write or delete happened (the
    /// counter moved), or the key held an expiry time that has passed.
    pub fn changed_by(&self, later: &KeyMark, now_ms: u64) -> bool {
        self.writes != later.writes || self.expires_at_ms.is_some_and(|at| at <= now_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bump_moves_only_its_own_slot() {
        let mut marks = WriteMarks::new();
        let (a, b) = (crate::hash::fnv1a64(b"a"), crate::hash::fnv1a64(b"b"));
        assert_ne!(WriteMarks::slot(a), WriteMarks::slot(b));
        marks.bump(a);
        marks.bump(a);
        assert_eq!(marks.get(a), 2);
        assert_eq!(marks.get(b), 0);
    }

    #[test]
    fn a_mark_changes_on_a_write_or_a_passed_expiry() {
        let before = KeyMark {
            writes: 3,
            expires_at_ms: Some(1_000),
        };
        let same = before;
        assert!(!before.changed_by(&same, 999));
        assert!(before.changed_by(&same, 1_000));
        let written = KeyMark {
            writes: 4,
            expires_at_ms: None,
        };
        assert!(before.changed_by(&written, 0));
        let no_expiry = KeyMark {
            writes: 3,
            expires_at_ms: None,
        };
        assert!(!no_expiry.changed_by(&no_expiry, u64::MAX));
    }
}
