//! The hybrid tier's in-RAM index: for every key, 6 bytes (a 15-bit tag of
//! the key's hash, 1 bit saying whether the record crosses a block end,
//! and a 32-bit record address), and no key bytes.
//!
//! Layout: the keys of a shard are split into [`PARTITIONS`] partitions by
//! the top bits of the mixed hash (the same partitions as the memory tier,
//! so SCAN cursors mean the same thing on both tiers). Each partition is a
//! fixed array of buckets of [`SLOTS`] slots, kept as two flat arrays
//! (tags `u16`, addresses `u32`) so a zeroed table costs no RAM until its
//! pages are touched. A key's home bucket is picked from 32 more hash bits;
//! when the home bucket is full the entry goes to the next bucket with a
//! free slot (bucketized linear probing) and every full bucket passed on
//! the way is marked "overflowed", so a lookup knows to go on past it.
//! Marks are never cleared while the process runs (a delete cannot tell
//! whether another key passed the bucket), so heavy churn lengthens probe
//! runs; a restart keeps the marks (only a resize, which rebuilds the
//! table, clears them): the table is sized with slack for that reason
//! (`index_keys` / 0.85).
//!
//! A partition that has no free slot left spills into a small map keyed
//! by the full mixed hash, at about 40 bytes per key: correct, but the
//! table was sized too small (`storage.index_keys`).
//!
//! Address 0 marks an empty slot (no record starts at offset 0 of a
//! segment: the first block is the segment header).
//!
//! The index never decides that two keys are equal: a tag match only names
//! a candidate record, whose key the tier compares.

use std::collections::HashMap;

/// Partitions per shard (the memory tier's count; see [`crate::keyspace`]).
pub const PARTITIONS: usize = crate::tier::memory::PARTITION_COUNT;
const PARTITION_SHIFT: u32 = 64 - PARTITIONS.trailing_zeros();
/// Slots per bucket.
pub const SLOTS: usize = 8;
/// Bits of hash kept in a slot.
pub const TAG_BITS: u32 = 15;
const TAG_MASK: u16 = (1 << TAG_BITS) - 1;
/// Fraction of slots filled when the index holds `index_keys` keys.
pub const TARGET_LOAD: f64 = 0.85;
/// Bytes of RAM one slot costs.
pub const SLOT_BYTES: u64 = 6;
/// What one spilled key costs (hash, address, the map's own share).
pub(super) const SPILL_KEY_BYTES: u64 = 40;
/// Most buckets an insert looks through for a free slot before the entry
/// spills. Without a bound an insert into a full partition walked every
/// bucket, and marked them all overflowed, so every lookup in it walked
/// them too: a WAL replay that doubles the entries (blind writes keep the
/// older ones) went quadratic. At the target load a probe this long is
/// all but never needed, so almost nothing spills for it.
pub const PROBE_MAX: usize = 32;

/// The hash bits the index uses, computed once per operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyHash {
    pub mixed: u64,
}

impl KeyHash {
    /// From a key's table hash ([`crate::hash::TableHasher::hash_key`]).
    pub fn new(table_hash: u64) -> KeyHash {
        KeyHash {
            mixed: crate::hash::mix(table_hash),
        }
    }

    pub fn partition(self) -> usize {
        (self.mixed >> PARTITION_SHIFT) as usize
    }

    fn tag(self) -> u16 {
        (self.mixed as u16 & TAG_MASK).max(1)
    }

    /// Whether an entry made for `other` could be this hash's: same
    /// partition and tag. A record at a candidate whose key fails this
    /// cannot be the entry's record (the entry dangles).
    pub fn could_share_entry(self, other: KeyHash) -> bool {
        self.partition() == other.partition() && self.tag() == other.tag()
    }

    fn home(self, buckets: usize) -> usize {
        ((((self.mixed >> 16) & 0xFFFF_FFFF) * buckets as u64) >> 32) as usize
    }
}

/// Where an entry sits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loc {
    /// Slot index in the partition's flat arrays.
    Slot { part: u16, slot: u32 },
    /// Spilled: the entry's full mixed hash and its place in that list.
    Spill { part: u16, mixed: u64, at: u32 },
}

/// One entry as the index holds it, for a rebuild at another size (see
/// `hybrid/resize.rs`): 8 bytes, so listing every entry of a shard costs 8
/// bytes per key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub addr: u32,
    part: u16,
    /// Span (top bit) and tag (low 15 bits), as in a slot.
    tag: u16,
}

impl Entry {
    /// 1 if the record runs past the end of its first block.
    pub fn span(self) -> u8 {
        (self.tag >> TAG_BITS) as u8
    }

    /// Whether a key of hash `h` can own this entry (same partition and
    /// tag): a record whose key does not match its entry means the index
    /// and the segments disagree.
    pub fn matches(self, h: KeyHash) -> bool {
        h.partition() == usize::from(self.part) && h.tag() == self.tag & TAG_MASK
    }
}

/// One candidate record for a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    pub loc: Loc,
    pub addr: u32,
    /// 1 if the record runs past the end of its first block.
    pub span: u8,
}

#[derive(Default)]
struct Partition {
    /// Per slot: span (top bit) and tag (low 15 bits).
    tags: Vec<u16>,
    /// Per slot: record address, 0 when empty.
    addrs: Vec<u32>,
    /// One bit per bucket: an insert went past it because it was full.
    overflowed: Vec<u64>,
    len: u64,
    spill: HashMap<u64, Vec<(u32, u8)>>,
    spilled: u64,
    /// One bit per bucket: its slots or overflow bit changed since a
    /// checkpoint last copied the partition (what a delta copies).
    changed: Vec<u64>,
    /// The spilled entries changed since then.
    spill_changed: bool,
    /// Most buckets from its home a lookup looks through: no entry lies
    /// further. [`PROBE_MAX`] for entries this process inserted; after a
    /// checkpoint's buckets are loaded, what their overflow bits allow
    /// (an older build's inserts were not bounded).
    reach: usize,
}

impl Partition {
    fn with_buckets(buckets: usize) -> Partition {
        Partition {
            tags: vec![0; buckets * SLOTS],
            addrs: vec![0; buckets * SLOTS],
            overflowed: vec![0; buckets.div_ceil(64)],
            changed: vec![0; buckets.div_ceil(64)],
            reach: PROBE_MAX.min(buckets),
            ..Partition::default()
        }
    }

    /// The longest run of overflowed buckets, around the end too. An entry
    /// `d` buckets from its home has the `d` buckets before it overflowed
    /// (its insert passed them), so no entry lies further than this.
    fn longest_overflowed_run(&self) -> usize {
        let n = self.buckets();
        let (mut longest, mut run) = (0, 0);
        for b in 0..2 * n {
            if self.is_overflowed(b % n) {
                run += 1;
                longest = longest.max(run);
                if run >= n {
                    return n;
                }
            } else {
                run = 0;
            }
        }
        longest
    }

    fn mark_changed(&mut self, bucket: usize) {
        self.changed[bucket / 64] |= 1 << (bucket % 64);
    }

    /// A checkpoint copied the partition: nothing has changed since.
    fn mark_copied(&mut self) {
        self.changed.fill(0);
        self.spill_changed = false;
    }

    fn is_changed(&self, bucket: usize) -> bool {
        self.changed[bucket / 64] >> (bucket % 64) & 1 == 1
    }

    /// Buckets `first..end` as checkpoint bytes: the tags (LE u16), then
    /// the addresses (LE u32), then the overflow bits (one byte each).
    fn encode_buckets(&self, first: usize, end: usize) -> Vec<u8> {
        let (s0, s1) = (first * SLOTS, end * SLOTS);
        let mut bytes = Vec::with_capacity((s1 - s0) * 6 + (end - first));
        self.tags[s0..s1]
            .iter()
            .for_each(|t| bytes.extend_from_slice(&t.to_le_bytes()));
        self.addrs[s0..s1]
            .iter()
            .for_each(|a| bytes.extend_from_slice(&a.to_le_bytes()));
        (first..end).for_each(|b| bytes.push(self.is_overflowed(b) as u8));
        bytes
    }

    /// The spilled entries as checkpoint bytes: (mixed hash u64, address
    /// u32, span u8) each.
    fn encode_spill(&self) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(self.spilled as usize * 13);
        for (&mixed, list) in &self.spill {
            for &(addr, span) in list {
                bytes.extend_from_slice(&mixed.to_le_bytes());
                bytes.extend_from_slice(&addr.to_le_bytes());
                bytes.push(span);
            }
        }
        bytes
    }

    fn buckets(&self) -> usize {
        self.addrs.len() / SLOTS
    }

    /// Puts an entry for `h` into the first free slot within
    /// [`PROBE_MAX`] buckets of its home, marking the buckets it passes
    /// overflowed; the slot, or `None` (nothing changed but those marks)
    /// when there is none. A full partition is not searched.
    fn place(&mut self, h: KeyHash, addr: u32, span: u8) -> Option<usize> {
        let n = self.buckets();
        let mut b = h.home(n);
        let value = slot_tag(h.tag(), span);
        let probe = if (self.len as usize) < self.addrs.len() {
            n.min(PROBE_MAX)
        } else {
            0
        };
        for _ in 0..probe {
            let base = b * SLOTS;
            if let Some(s) = (base..base + SLOTS).find(|&s| self.addrs[s] == 0) {
                self.tags[s] = value;
                self.addrs[s] = addr;
                self.len += 1;
                self.mark_changed(b);
                return Some(s);
            }
            if !self.is_overflowed(b) {
                self.overflowed[b / 64] |= 1 << (b % 64);
                self.mark_changed(b);
            }
            b = (b + 1) % n;
        }
        None
    }

    fn is_overflowed(&self, bucket: usize) -> bool {
        self.overflowed[bucket / 64] >> (bucket % 64) & 1 == 1
    }
}

/// The index of one shard.
pub struct Index {
    parts: Vec<Partition>,
}

/// Buckets per partition for `keys` keys in the shard.
pub fn buckets_for(keys: u64) -> usize {
    let slots = (keys as f64 / TARGET_LOAD).ceil() as u64;
    (slots.div_ceil((PARTITIONS * SLOTS) as u64) as usize).max(4)
}

impl Index {
    /// An empty index sized for `keys` keys (RAM is touched as it fills).
    pub fn new(keys: u64) -> Index {
        Index::with_buckets(buckets_for(keys))
    }

    pub fn with_buckets(buckets: usize) -> Index {
        Index {
            parts: (0..PARTITIONS)
                .map(|_| Partition::with_buckets(buckets))
                .collect(),
        }
    }

    pub fn buckets_per_partition(&self) -> usize {
        self.parts[0].buckets()
    }

    pub fn len(&self) -> u64 {
        self.parts.iter().map(|p| p.len + p.spilled).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes the index holds (slots, marks and spilled entries). Slots of
    /// a fresh table that were never touched cost no RAM; this counts them
    /// anyway (the whole table is touched soon after it fills).
    pub fn memory_bytes(&self) -> u64 {
        self.parts
            .iter()
            .map(|p| {
                p.addrs.len() as u64 * SLOT_BYTES
                    + (p.overflowed.len() + p.changed.len()) as u64 * 8
            })
            .sum::<u64>()
            + self.spilled() * SPILL_KEY_BYTES
    }

    pub fn spilled(&self) -> u64 {
        self.parts.iter().map(|p| p.spilled).sum()
    }

    /// Every entry whose tag matches `h`, in probe order (spilled ones last).
    pub fn candidates(&self, h: KeyHash, out: &mut Vec<Candidate>) {
        self.for_each_candidate(h, |c| out.push(c));
    }

    /// How many entries' tags match `h` (no allocation: a check made
    /// before each write under a memory limit).
    pub fn candidate_count(&self, h: KeyHash) -> usize {
        let mut n = 0;
        self.for_each_candidate(h, |_| n += 1);
        n
    }

    /// Calls `f` on every entry whose tag matches `h`, in probe order
    /// (spilled ones last).
    fn for_each_candidate(&self, h: KeyHash, mut f: impl FnMut(Candidate)) {
        let pi = h.partition();
        let p = &self.parts[pi];
        let n = p.buckets();
        let tag = h.tag();
        let mut b = h.home(n);
        for _ in 0..p.reach {
            let base = b * SLOTS;
            for s in base..base + SLOTS {
                let t = p.tags[s];
                if p.addrs[s] != 0 && t & TAG_MASK == tag {
                    f(Candidate {
                        loc: Loc::Slot {
                            part: pi as u16,
                            slot: s as u32,
                        },
                        addr: p.addrs[s],
                        span: (t >> TAG_BITS) as u8,
                    });
                }
            }
            if !p.is_overflowed(b) {
                break;
            }
            b = (b + 1) % n;
        }
        if let Some(list) = p.spill.get(&h.mixed) {
            for (at, &(addr, span)) in list.iter().enumerate() {
                f(Candidate {
                    loc: Loc::Spill {
                        part: pi as u16,
                        mixed: h.mixed,
                        at: at as u32,
                    },
                    addr,
                    span,
                });
            }
        }
    }

    /// The entry of `h` that points at `addr`, if any (GC's liveness test:
    /// addresses are unique, so no key comparison is needed).
    pub fn find_addr(&self, h: KeyHash, addr: u32) -> Option<Loc> {
        let mut found = Vec::new();
        self.candidates(h, &mut found);
        found.into_iter().find(|c| c.addr == addr).map(|c| c.loc)
    }

    /// Whether an entry added for `h` now would spill (no free slot within
    /// [`PROBE_MAX`] buckets of its home) and cost [`SPILL_KEY_BYTES`] more.
    pub fn insert_would_spill(&self, h: KeyHash) -> bool {
        let p = &self.parts[h.partition()];
        if p.len as usize >= p.addrs.len() {
            return true;
        }
        let n = p.buckets();
        let home = h.home(n);
        !(0..n.min(PROBE_MAX)).any(|i| {
            let base = (home + i) % n * SLOTS;
            p.addrs[base..base + SLOTS].contains(&0)
        })
    }

    /// Adds an entry for a key not in the index.
    pub fn insert(&mut self, h: KeyHash, addr: u32, span: u8) -> Loc {
        assert!(addr != 0, "address 0 is the empty slot");
        let pi = h.partition();
        let p = &mut self.parts[pi];
        if let Some(s) = p.place(h, addr, span) {
            return Loc::Slot {
                part: pi as u16,
                slot: s as u32,
            };
        }
        p.spill_changed = true;
        let list = p.spill.entry(h.mixed).or_default();
        list.push((addr, span));
        p.spilled += 1;
        Loc::Spill {
            part: pi as u16,
            mixed: h.mixed,
            at: (list.len() - 1) as u32,
        }
    }

    /// Moves spilled entries into free slots where an insert would put
    /// them now. Entries spill while their partition is full (a WAL
    /// replay's blind writes keep every older entry until they are
    /// settled) and cost [`SPILL_KEY_BYTES`] each; once settling or GC
    /// freed slots, this gives that RAM back. Returns how many moved.
    pub fn unspill(&mut self) -> u64 {
        let mut moved = 0;
        for p in self.parts.iter_mut().filter(|p| p.spilled > 0) {
            let hashes: Vec<u64> = p.spill.keys().copied().collect();
            for mixed in hashes {
                let h = KeyHash { mixed };
                let mut list = p.spill.remove(&mixed).unwrap_or_default();
                let before = list.len();
                list.retain(|&(addr, span)| p.place(h, addr, span).is_none());
                let placed = (before - list.len()) as u64;
                p.spilled -= placed;
                moved += placed;
                if placed > 0 {
                    p.spill_changed = true;
                }
                if !list.is_empty() {
                    p.spill.insert(mixed, list);
                }
            }
            if p.spill.len() < p.spill.capacity() / 4 {
                p.spill.shrink_to(p.spill.len() * 2);
            }
        }
        moved
    }

    /// Points an existing entry at a new record.
    pub fn set(&mut self, loc: Loc, addr: u32, span: u8) {
        assert!(addr != 0, "address 0 is the empty slot");
        match loc {
            Loc::Slot { part, slot } => {
                let p = &mut self.parts[part as usize];
                let s = slot as usize;
                p.tags[s] = slot_tag(p.tags[s] & TAG_MASK, span);
                p.addrs[s] = addr;
                p.mark_changed(s / SLOTS);
            }
            Loc::Spill { part, mixed, at } => {
                let p = &mut self.parts[part as usize];
                if let Some(e) = p.spill.get_mut(&mixed).and_then(|l| l.get_mut(at as usize)) {
                    *e = (addr, span);
                    p.spill_changed = true;
                }
            }
        }
    }

    /// Removes an entry.
    pub fn remove(&mut self, loc: Loc) {
        match loc {
            Loc::Slot { part, slot } => {
                let p = &mut self.parts[part as usize];
                let s = slot as usize;
                if p.addrs[s] != 0 {
                    p.addrs[s] = 0;
                    p.tags[s] = 0;
                    p.len -= 1;
                    p.mark_changed(s / SLOTS);
                }
            }
            Loc::Spill { part, mixed, at } => {
                let p = &mut self.parts[part as usize];
                if let Some(list) = p.spill.get_mut(&mixed) {
                    if (at as usize) < list.len() {
                        list.remove(at as usize);
                        p.spilled -= 1;
                        p.spill_changed = true;
                    }
                    if list.is_empty() {
                        p.spill.remove(&mixed);
                    }
                }
            }
        }
    }

    /// Every (address, span) of partition `part` (for scans). Stops
    /// looking at slots once it has found the partition's count: an index
    /// sized far over its keys (RANDOMKEY or SCAN over a near-empty one)
    /// does not read every slot.
    pub fn entries(&self, part: usize) -> Vec<(u32, u8)> {
        let p = &self.parts[part];
        let mut out = Vec::with_capacity((p.len + p.spilled) as usize);
        if p.len > 0 {
            for (&a, &t) in p.addrs.iter().zip(&p.tags) {
                if a != 0 {
                    out.push((a, (t >> TAG_BITS) as u8));
                    if out.len() as u64 == p.len {
                        break;
                    }
                }
            }
        }
        out.extend(p.spill.values().flatten().copied());
        out
    }

    /// Every entry, slots and spilled ones, in no useful order.
    pub fn all_entries(&self) -> Vec<Entry> {
        let mut out = Vec::with_capacity(self.len() as usize);
        for (pi, p) in self.parts.iter().enumerate() {
            let part = pi as u16;
            for (&addr, &tag) in p.addrs.iter().zip(&p.tags) {
                if addr != 0 {
                    out.push(Entry { addr, part, tag });
                }
            }
            for (&mixed, list) in &p.spill {
                let tag = KeyHash { mixed }.tag();
                for &(addr, span) in list {
                    out.push(Entry {
                        addr,
                        part,
                        tag: slot_tag(tag, span),
                    });
                }
            }
        }
        out
    }

    /// Every address in the index (live-byte accounting at recovery).
    pub fn for_each_addr(&self, mut f: impl FnMut(u32)) {
        for p in &self.parts {
            p.addrs.iter().filter(|&&a| a != 0).for_each(|&a| f(a));
            p.spill.values().flatten().for_each(|&(a, _)| f(a));
        }
    }

    /// Partition `part` as checkpoint chunks of at most `max_buckets`
    /// buckets each: `(first bucket, bytes)`, the bytes being the tags (LE
    /// u16), then the addresses (LE u32), then the overflow bits of those
    /// buckets (one byte each). A last chunk with first bucket `u32::MAX`
    /// holds the spilled entries: (mixed hash u64, address u32, span u8).
    /// The partition counts as copied from now on (nothing has changed).
    pub fn encode_partition(&mut self, part: usize, max_buckets: usize) -> Vec<(u32, Vec<u8>)> {
        let p = &mut self.parts[part];
        let n = p.buckets();
        let mut out = Vec::new();
        let mut first = 0;
        while first < n {
            let end = (first + max_buckets).min(n);
            out.push((first as u32, p.encode_buckets(first, end)));
            first = end;
        }
        if !p.spill.is_empty() {
            out.push((u32::MAX, p.encode_spill()));
        }
        p.mark_copied();
        out
    }

    /// The buckets of partition `part` that changed since it was last
    /// copied, as chunks of [`Index::encode_partition`]'s format: each run
    /// of consecutive changed buckets, and the whole spill chunk, possibly
    /// empty, if any spilled entry changed. (A chunk's key and header cost
    /// about 30 bytes, less than the 53 of an unchanged bucket, so runs are
    /// not joined across unchanged buckets.) Loaded over the copy they
    /// build on, they give the partition as it is now, which counts as
    /// copied from now on.
    pub fn encode_changed(&mut self, part: usize, max_buckets: usize) -> Vec<(u32, Vec<u8>)> {
        let p = &mut self.parts[part];
        let n = p.buckets();
        let mut out = Vec::new();
        let mut b = 0;
        while b < n {
            let word = p.changed[b / 64] >> (b % 64);
            if word == 0 {
                b = (b / 64 + 1) * 64;
                continue;
            }
            b += word.trailing_zeros() as usize;
            let first = b;
            let mut end = b + 1;
            while end < n && end - first < max_buckets && p.is_changed(end) {
                end += 1;
            }
            out.push((first as u32, p.encode_buckets(first, end)));
            b = end;
        }
        if p.spill_changed {
            out.push((u32::MAX, p.encode_spill()));
        }
        p.mark_copied();
        out
    }

    /// Loads one chunk made by [`Index::encode_partition`]. The index must
    /// have the checkpoint's bucket count.
    pub fn decode_chunk(&mut self, part: usize, first: u32, bytes: &[u8]) -> Result<(), String> {
        let Some(p) = self.parts.get_mut(part) else {
            return Err(format!("partition {part} out of range"));
        };
        if first == u32::MAX {
            if !bytes.len().is_multiple_of(13) {
                return Err("spill chunk length is not a multiple of 13".into());
            }
            // A spill chunk holds all of the partition's spilled entries
            // (a delta's replaces those loaded before it).
            p.spill.clear();
            p.spilled = 0;
            for e in bytes.chunks_exact(13) {
                let mixed = u64::from_le_bytes(e[0..8].try_into().expect("8 bytes"));
                let addr = u32::from_le_bytes(e[8..12].try_into().expect("4 bytes"));
                if addr == 0 || e[12] > 1 {
                    return Err("spilled entry with address 0 or a bad span".into());
                }
                p.spill.entry(mixed).or_default().push((addr, e[12]));
                p.spilled += 1;
            }
            return Ok(());
        }
        let first = first as usize;
        let buckets = bytes.len() / (SLOTS * 6 + 1);
        if bytes.len() != buckets * (SLOTS * 6 + 1) || buckets == 0 {
            return Err(format!(
                "chunk of {} bytes is not whole buckets",
                bytes.len()
            ));
        }
        if first + buckets > p.buckets() {
            return Err(format!(
                "chunk covers buckets {first}..{} of {}",
                first + buckets,
                p.buckets()
            ));
        }
        let slots = buckets * SLOTS;
        let s0 = first * SLOTS;
        for i in 0..slots {
            p.tags[s0 + i] = u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]]);
            let a = 2 * slots + 4 * i;
            let addr = u32::from_le_bytes(bytes[a..a + 4].try_into().expect("4 bytes"));
            if p.addrs[s0 + i] != 0 {
                p.len -= 1;
            }
            p.addrs[s0 + i] = addr;
            if addr != 0 {
                p.len += 1;
            }
        }
        for (i, &flag) in bytes[6 * slots..].iter().enumerate() {
            let b = first + i;
            if flag != 0 {
                p.overflowed[b / 64] |= 1 << (b % 64);
            } else {
                p.overflowed[b / 64] &= !(1 << (b % 64));
            }
        }
        let n = p.buckets();
        p.reach = (p.longest_overflowed_run() + 1).clamp(PROBE_MAX.min(n), n);
        Ok(())
    }
}

fn slot_tag(tag: u16, span: u8) -> u16 {
    (tag & TAG_MASK) | (u16::from(span.min(1)) << TAG_BITS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(i: u64) -> KeyHash {
        KeyHash::new(crate::hash::fnv1a64(&i.to_le_bytes()))
    }

    #[test]
    fn insert_find_set_remove() {
        let mut ix = Index::new(10_000);
        let mut locs = Vec::new();
        for i in 0..20_000u64 {
            locs.push(ix.insert(h(i), (i + 1) as u32, (i % 2) as u8));
        }
        assert_eq!(ix.len(), 20_000);
        for i in 0..20_000u64 {
            let mut c = Vec::new();
            ix.candidates(h(i), &mut c);
            let hit = c.iter().find(|c| c.addr == (i + 1) as u32).expect("found");
            assert_eq!(hit.span, (i % 2) as u8);
            assert_eq!(ix.find_addr(h(i), (i + 1) as u32), Some(locs[i as usize]));
        }
        for i in (0..20_000u64).step_by(2) {
            ix.remove(locs[i as usize]);
        }
        assert_eq!(ix.len(), 10_000);
        for i in 0..20_000u64 {
            let found = ix.find_addr(h(i), (i + 1) as u32).is_some();
            assert_eq!(found, i % 2 == 1, "key {i}");
        }
        ix.set(locs[1], 999_999, 2);
        assert_eq!(ix.find_addr(h(1), 999_999), Some(locs[1]));
    }

    #[test]
    fn a_full_partition_spills_and_still_finds_everything() {
        // 4 buckets of 8 slots per partition: 32 slots; 256 partitions.
        let mut ix = Index::with_buckets(4);
        let n = 256 * 32 * 2;
        for i in 0..n {
            ix.insert(h(i), (i + 1) as u32, 0);
        }
        assert!(ix.spilled() > 0);
        assert_eq!(ix.len(), n);
        for i in 0..n {
            assert!(ix.find_addr(h(i), (i + 1) as u32).is_some(), "key {i}");
        }
    }

    #[test]
    fn spilled_entries_move_into_slots_freed_since() {
        // 4 buckets of 8 slots per partition, filled to twice its slots;
        // then the first half removed (settled older entries).
        let mut ix = Index::with_buckets(4);
        let n = 256 * 32 * 2;
        let locs: Vec<Loc> = (0..n)
            .map(|i| ix.insert(h(i), (i + 1) as u32, (i % 2) as u8))
            .collect();
        let spilled = ix.spilled();
        assert!(spilled > n / 3, "{spilled} spilled");
        for loc in &locs[..n as usize / 2] {
            ix.remove(*loc);
        }
        let spilled = ix.spilled();
        let before = ix.memory_bytes();
        // A checkpoint's copy from before the move, for a delta over it.
        let base: Vec<Vec<(u32, Vec<u8>)>> = (0..ix.parts.len())
            .map(|part| ix.encode_partition(part, 4))
            .collect();
        let moved = ix.unspill();
        assert!(moved > spilled / 2, "{moved} of {spilled} moved");
        assert_eq!(ix.spilled(), spilled - moved);
        assert_eq!(ix.len(), n / 2);
        assert_eq!(ix.memory_bytes(), before - moved * SPILL_KEY_BYTES);
        for i in n / 2..n {
            let mut c = Vec::new();
            ix.candidates(h(i), &mut c);
            let hit = c.iter().find(|c| c.addr == (i + 1) as u32).expect("found");
            assert_eq!(hit.span, (i % 2) as u8, "key {i}");
        }
        for i in 0..n / 2 {
            assert!(
                ix.find_addr(h(i), (i + 1) as u32).is_none(),
                "removed key {i}"
            );
        }
        // A delta over the copy from before the move, and a full copy of
        // the moved entries, each load back the same index.
        let mut delta = Index::with_buckets(4);
        for (part, chunks) in base.iter().enumerate() {
            for (first, bytes) in chunks.iter().cloned().chain(ix.encode_changed(part, 4)) {
                delta.decode_chunk(part, first, &bytes).expect("chunk");
            }
        }
        let mut full = Index::with_buckets(4);
        for part in 0..ix.parts.len() {
            for (first, bytes) in ix.encode_partition(part, 4) {
                full.decode_chunk(part, first, &bytes).expect("chunk");
            }
        }
        for back in [&delta, &full] {
            assert_eq!(back.len(), n / 2);
            assert_eq!(back.spilled(), ix.spilled());
            for i in n / 2..n {
                assert!(
                    back.find_addr(h(i), (i + 1) as u32).is_some(),
                    "key {i} after a reload"
                );
            }
        }
    }

    #[test]
    fn an_overfull_partition_keeps_lookups_short() {
        // 512 buckets of 8 slots per partition, filled to twice its slots
        // (a replay of blind writes can double the entries).
        let mut ix = Index::with_buckets(512);
        let n = 256 * 512 * 8 * 2;
        for i in 0..n {
            ix.insert(h(i), (i + 1) as u32, 0);
        }
        assert_eq!(ix.len(), n);
        let reach = ix.parts.iter().map(|p| p.reach).max().unwrap_or(0);
        assert!(reach <= PROBE_MAX, "a lookup may walk {reach} buckets");
        for i in (0..n).step_by(7) {
            assert!(ix.find_addr(h(i), (i + 1) as u32).is_some(), "key {i}");
            assert!(ix.insert_would_spill(h(i)), "key {i}: the table is full");
        }
    }

    #[test]
    fn at_the_target_load_almost_nothing_spills() {
        let keys = 200_000;
        let mut ix = Index::new(keys);
        for i in 0..keys {
            assert_eq!(
                ix.insert_would_spill(h(i)),
                matches!(ix.insert(h(i), (i + 1) as u32, 0), Loc::Spill { .. }),
                "key {i}: the estimate and the insert disagree"
            );
        }
        assert!(
            ix.spilled() * 1000 < keys,
            "{} of {keys} spilled",
            ix.spilled()
        );
    }

    #[test]
    fn a_loaded_entry_further_than_the_probe_bound_is_found() {
        // An older build placed an entry 40 buckets past its home (its
        // inserts were not bounded), marking the 40 before it overflowed.
        let n = 64;
        let mut old = Index::with_buckets(n);
        let k = h(5);
        let pi = k.partition();
        let home = k.home(n);
        let p = &mut old.parts[pi];
        let b = (home + 40) % n;
        p.tags[b * SLOTS] = slot_tag(k.tag(), 0);
        p.addrs[b * SLOTS] = 77;
        p.len = 1;
        for j in 0..40 {
            let o = (home + j) % n;
            p.overflowed[o / 64] |= 1 << (o % 64);
        }
        let mut back = Index::with_buckets(n);
        for (first, bytes) in old.encode_partition(pi, 16) {
            back.decode_chunk(pi, first, &bytes).expect("decodes");
        }
        assert!(back.parts[pi].reach > 40, "reach {}", back.parts[pi].reach);
        assert!(back.find_addr(k, 77).is_some());
    }

    #[test]
    fn checkpoint_chunks_round_trip() {
        let mut ix = Index::with_buckets(8);
        for i in 0..30_000u64 {
            ix.insert(h(i), (i + 1) as u32, 1);
        }
        let mut back = Index::with_buckets(8);
        for part in 0..PARTITIONS {
            for (first, bytes) in ix.encode_partition(part, 3) {
                back.decode_chunk(part, first, &bytes).expect("decodes");
            }
        }
        assert_eq!(back.len(), ix.len());
        for i in 0..30_000u64 {
            assert!(back.find_addr(h(i), (i + 1) as u32).is_some(), "key {i}");
        }
        assert!(back.decode_chunk(0, 7, &[0u8; 49 * 2]).is_err());
        assert!(back.decode_chunk(0, 0, &[0u8; 50]).is_err());
    }

    #[test]
    fn changed_buckets_loaded_over_a_copy_give_the_index_now() {
        // Small partitions, so inserts overflow buckets and spill.
        let mut ix = Index::with_buckets(4);
        let mut locs = Vec::new();
        for i in 0..20_000u64 {
            locs.push((h(i), ix.insert(h(i), i as u32 + 1, 0)));
        }
        let copy = |ix: &mut Index, delta: bool| -> Vec<Vec<(u32, Vec<u8>)>> {
            (0..PARTITIONS)
                .map(|p| {
                    if delta {
                        ix.encode_changed(p, 3)
                    } else {
                        ix.encode_partition(p, 3)
                    }
                })
                .collect()
        };
        let full = copy(&mut ix, false);
        assert!(
            copy(&mut ix, true).iter().all(Vec::is_empty),
            "nothing changed"
        );
        // Repoint, remove and add, in slots and among the spilled.
        // (Removing a spilled entry moves the ones after it in its list;
        // with distinct hashes each list holds one.)
        for (i, (_, loc)) in locs.iter().enumerate().step_by(7) {
            if i % 2 == 0 {
                ix.set(*loc, 900_000 + i as u32, 1);
            } else {
                ix.remove(*loc);
            }
        }
        for i in 20_000..20_500u64 {
            ix.insert(h(i), i as u32 + 1, 0);
        }
        let delta = copy(&mut ix, true);
        let changed: usize = delta.iter().map(Vec::len).sum();
        let all: usize = full.iter().map(Vec::len).sum();
        assert!(changed > 0, "the delta lists the changes");
        let mut back = Index::with_buckets(4);
        for (part, chunks) in full.iter().enumerate().chain(delta.iter().enumerate()) {
            for (first, bytes) in chunks {
                back.decode_chunk(part, *first, bytes).expect("loads");
            }
        }
        assert_eq!(back.len(), ix.len());
        let mut want = ix.all_entries();
        let mut got = back.all_entries();
        want.sort_by_key(|e| (e.part, e.addr));
        got.sort_by_key(|e| (e.part, e.addr));
        assert_eq!(got, want);
        // The delta is smaller than the copy it builds on.
        let bytes =
            |c: &[Vec<(u32, Vec<u8>)>]| -> usize { c.iter().flatten().map(|(_, b)| b.len()).sum() };
        assert!(bytes(&delta) < bytes(&full), "{changed} of {all} chunks");
    }

    #[test]
    fn all_entries_lists_slots_and_spilled_ones_with_their_span_and_tag() {
        let mut ix = Index::with_buckets(4);
        let n = 256 * 32 * 2;
        for i in 0..n {
            ix.insert(h(i), (i + 1) as u32, (i % 2) as u8);
        }
        assert!(ix.spilled() > 0);
        let mut all = ix.all_entries();
        assert_eq!(all.len() as u64, n);
        all.sort_unstable_by_key(|e| e.addr);
        for (i, e) in (0..n).zip(&all) {
            assert_eq!(e.addr, (i + 1) as u32);
            assert_eq!(e.span(), (i % 2) as u8);
            assert!(e.matches(h(i)), "key {i}");
            assert!(!e.matches(h(i + n)) || h(i).tag() == h(i + n).tag());
        }
    }

    #[test]
    fn misses_rarely_match_a_tag() {
        let mut ix = Index::new(100_000);
        for i in 0..100_000u64 {
            ix.insert(h(i), (i + 1) as u32, 0);
        }
        let mut false_hits = 0;
        let mut c = Vec::new();
        for i in 100_000..1_100_000u64 {
            c.clear();
            ix.candidates(h(i), &mut c);
            false_hits += usize::from(!c.is_empty());
        }
        // Aim: at most 1 in 1,000 misses reads anything.
        assert!(
            false_hits < 1_000,
            "{false_hits} of 1M misses matched a tag"
        );
    }
}
