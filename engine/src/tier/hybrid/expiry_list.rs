//! The hybrid tier's expiry list: every (expiry time, record address) pair
//! in order, at about 12-17 bytes a pair.
//!
//! A `BTreeSet<(u64, u32)>` costs about 40 bytes a pair (a 16-byte padded
//! element in nodes a third empty on average, plus the allocator's share),
//! which at 10% of keys with an expiry time is 4 bytes per key of the
//! tier's ~8-byte budget. Here a pair is packed into 12 bytes, big-endian so
//! that byte order is pair order, and pairs sit sorted in leaves of up to
//! [`LEAF`] pairs keyed in a `BTreeMap` by a lower bound of their contents.
//!
//! Invariants (checked by the tests below against a `BTreeSet`):
//! - every leaf is non-empty and sorted, with no pair twice;
//! - a leaf's key is at most its first pair, and greater than every pair of
//!   the leaf before it.
//!
//! Expiry times mostly grow with the clock, so most inserts land at the end
//! of the last leaf: a full leaf then starts a new one instead of splitting,
//! and leaves fill completely. Inserts elsewhere split a full leaf in two
//! halves; a leaf that falls under a quarter full after removals is merged
//! into a neighbour when the two fit in one.

use std::collections::BTreeMap;

/// Most pairs in one leaf (6 KiB of pairs).
pub(super) const LEAF: usize = 512;

/// What one leaf holds in RAM: room for [`LEAF`] pairs (a leaf is made
/// with that capacity and never grows past it), and the map's key, vector
/// header and share of a node.
const LEAF_BYTES: u64 = LEAF as u64 * 12 + 12 + 24 + 16;

/// One (expiry, address) pair: expiry big-endian in bytes 0..8, address
/// big-endian in 8..12, so comparing the bytes compares the pairs.
type Packed = [u8; 12];

fn pack(at: u64, addr: u32) -> Packed {
    let mut p = [0u8; 12];
    p[..8].copy_from_slice(&at.to_be_bytes());
    p[8..].copy_from_slice(&addr.to_be_bytes());
    p
}

fn unpack(p: &Packed) -> (u64, u32) {
    let at = u64::from_be_bytes(p[..8].try_into().expect("8 bytes"));
    let addr = u32::from_be_bytes(p[8..].try_into().expect("4 bytes"));
    (at, addr)
}

/// An ordered set of (expiry ms, record address) pairs.
#[derive(Default)]
pub(super) struct ExpiryList {
    leaves: BTreeMap<Packed, Vec<Packed>>,
    len: usize,
}

impl ExpiryList {
    pub(super) fn new() -> ExpiryList {
        ExpiryList::default()
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn clear(&mut self) {
        self.leaves.clear();
        self.len = 0;
    }

    /// RAM held: the leaves' buffers and the map's share per leaf.
    pub(super) fn memory_bytes(&self) -> u64 {
        self.leaves.len() as u64 * LEAF_BYTES
    }

    /// What [`ExpiryList::memory_bytes`] grows by when a pair expiring at
    /// `at` is inserted, whatever its address: a new leaf when a leaf it
    /// may land in is full (or there is none), else nothing.
    pub(super) fn insert_growth_bytes(&self, at: u64) -> u64 {
        let (lo, hi) = (pack(at, 0), pack(at, u32::MAX));
        let (Some(first), Some(last)) = (self.leaf_for(&lo), self.leaf_for(&hi)) else {
            return LEAF_BYTES;
        };
        if self.leaves.range(first..=last).all(|(_, l)| l.len() < LEAF) {
            0
        } else {
            LEAF_BYTES
        }
    }

    /// The key of the leaf `p` belongs in: the last one whose lower bound
    /// is at most `p`, or the first leaf when `p` is below every bound.
    fn leaf_for(&self, p: &Packed) -> Option<Packed> {
        self.leaves
            .range(..=*p)
            .next_back()
            .or_else(|| self.leaves.iter().next())
            .map(|(k, _)| *k)
    }

    /// Adds the pair; false if it was there.
    pub(super) fn insert(&mut self, at: u64, addr: u32) -> bool {
        let p = pack(at, addr);
        let Some(mut key) = self.leaf_for(&p) else {
            let mut leaf = Vec::with_capacity(LEAF);
            leaf.push(p);
            self.leaves.insert(p, leaf);
            self.len = 1;
            return true;
        };
        if p < key {
            // Below every bound: the first leaf takes it and a new bound.
            let leaf = self.leaves.remove(&key).expect("leaf just found");
            self.leaves.insert(p, leaf);
            key = p;
        }
        let leaf = self.leaves.get_mut(&key).expect("leaf just found");
        let pos = match leaf.binary_search(&p) {
            Ok(_) => return false,
            Err(pos) => pos,
        };
        self.len += 1;
        if leaf.len() < LEAF {
            leaf.insert(pos, p);
            return true;
        }
        if pos == leaf.len() {
            // Past the end of a full leaf (the usual case: expiry times
            // grow): a new leaf, the full one stays full. Its bound `p` is
            // above every pair here and below the next leaf's bound, since
            // `p` is below that bound (this leaf was the last at most `p`).
            let mut next = Vec::with_capacity(LEAF);
            next.push(p);
            self.leaves.insert(p, next);
            return true;
        }
        let mut right = Vec::with_capacity(LEAF);
        right.extend_from_slice(&leaf[LEAF / 2..]);
        leaf.truncate(LEAF / 2);
        if pos <= LEAF / 2 {
            leaf.insert(pos, p);
        } else {
            right.insert(pos - LEAF / 2, p);
        }
        self.leaves.insert(right[0], right);
        true
    }

    /// Removes the pair; false if it was not there.
    pub(super) fn remove(&mut self, at: u64, addr: u32) -> bool {
        let p = pack(at, addr);
        let Some((&key, leaf)) = self.leaves.range_mut(..=p).next_back() else {
            return false;
        };
        let Ok(pos) = leaf.binary_search(&p) else {
            return false;
        };
        leaf.remove(pos);
        self.len -= 1;
        let left = leaf.len();
        if left == 0 {
            self.leaves.remove(&key);
        } else if left < LEAF / 4 {
            self.merge_small(key);
        }
        true
    }

    /// Merges the leaf at `key` into the leaf before it, or the leaf after
    /// it into this one, when the two fit in one leaf.
    fn merge_small(&mut self, key: Packed) {
        let len = self.leaves[&key].len();
        let before = self
            .leaves
            .range(..key)
            .next_back()
            .map(|(k, l)| (*k, l.len()));
        if let Some((bk, blen)) = before {
            if blen + len <= LEAF {
                let leaf = self.leaves.remove(&key).expect("leaf exists");
                self.leaves
                    .get_mut(&bk)
                    .expect("leaf exists")
                    .extend_from_slice(&leaf);
                return;
            }
        }
        let after = self
            .leaves
            .range((std::ops::Bound::Excluded(key), std::ops::Bound::Unbounded))
            .next()
            .map(|(k, l)| (*k, l.len()));
        if let Some((ak, alen)) = after {
            if alen + len <= LEAF {
                let next = self.leaves.remove(&ak).expect("leaf exists");
                self.leaves
                    .get_mut(&key)
                    .expect("leaf exists")
                    .extend_from_slice(&next);
            }
        }
    }

    /// Every pair, in (expiry, address) order.
    pub(super) fn iter(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.leaves.values().flat_map(|l| l.iter().map(unpack))
    }

    #[cfg(test)]
    fn check(&self) {
        let mut prev: Option<Packed> = None;
        let mut n = 0;
        for (key, leaf) in &self.leaves {
            assert!(!leaf.is_empty(), "empty leaf");
            assert!(leaf.len() <= LEAF, "leaf over its bound");
            assert_eq!(leaf.capacity(), LEAF, "a leaf's room for pairs");
            assert!(*key <= leaf[0], "leaf bound above its first pair");
            if let Some(prev) = prev {
                assert!(prev < *key, "leaf bound not above the leaf before");
            }
            assert!(leaf.windows(2).all(|w| w[0] < w[1]), "leaf out of order");
            prev = Some(*leaf.last().expect("non-empty"));
            n += leaf.len();
        }
        assert_eq!(n, self.len, "count");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// xorshift64*: the tests' own generator, so a seed replays.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
    }

    fn same(list: &ExpiryList, model: &BTreeSet<(u64, u32)>) {
        list.check();
        assert_eq!(list.len(), model.len());
        assert!(
            list.iter().eq(model.iter().copied()),
            "pairs differ from the model"
        );
    }

    #[test]
    fn random_operations_match_a_btreeset() {
        for seed in 1..=20u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
            let mut list = ExpiryList::new();
            let mut model = BTreeSet::new();
            // Narrow ranges so that pairs repeat and removals hit.
            let span = [50u64, 5_000, 1 << 40][(seed % 3) as usize];
            let (mut inserts, mut exact) = (0u32, 0u32);
            for step in 0..30_000 {
                let at = rng.next() % span;
                let addr = (rng.next() % 64) as u32;
                let op = rng.next() % 10;
                if op < 6 {
                    // What a memory limit checks an insert against bounds
                    // what it adds, and is exact but for a pair already in.
                    let growth = list.insert_growth_bytes(at);
                    let before = list.memory_bytes();
                    let added = list.insert(at, addr);
                    assert_eq!(added, model.insert((at, addr)), "insert, seed {seed}");
                    let grew = list.memory_bytes() - before;
                    assert!(
                        grew <= growth,
                        "insert grew {grew} bytes, checked for {growth}, seed {seed}"
                    );
                    inserts += 1;
                    exact += u32::from(grew == growth);
                } else if op < 9 {
                    assert_eq!(
                        list.remove(at, addr),
                        model.remove(&(at, addr)),
                        "remove, seed {seed}"
                    );
                } else if let Some(&(at, addr)) = model
                    .iter()
                    .nth((rng.next() % (model.len() as u64 + 1)) as usize)
                {
                    assert!(
                        list.remove(at, addr),
                        "remove of a present pair, seed {seed}"
                    );
                    model.remove(&(at, addr));
                }
                if step % 997 == 0 {
                    same(&list, &model);
                }
            }
            same(&list, &model);
            assert!(
                exact * 10 >= inserts * 9,
                "{exact} of {inserts} growth estimates exact, seed {seed}"
            );
            // Drain from the front, as active expiry does.
            while let Some(&(at, addr)) = model.iter().next() {
                assert!(list.remove(at, addr));
                model.remove(&(at, addr));
            }
            same(&list, &model);
            assert_eq!(list.memory_bytes(), 0);
        }
    }

    #[test]
    fn growing_expiry_times_fill_leaves_completely() {
        let mut list = ExpiryList::new();
        let n = 1_000_000u64;
        for i in 0..n {
            list.insert(1_000_000 + i * 3, (i * 7919 % 1_000_003) as u32);
        }
        list.check();
        let per_pair = list.memory_bytes() as f64 / n as f64;
        assert!(
            per_pair < 12.2,
            "{per_pair:.2} bytes per pair for growing times"
        );
    }

    #[test]
    fn random_expiry_times_stay_well_under_a_btreesets_cost() {
        let mut list = ExpiryList::new();
        let mut rng = Rng(7);
        let n = 1_000_000;
        for _ in 0..n {
            list.insert(rng.next() % (1 << 40), rng.next() as u32);
        }
        list.check();
        let per_pair = list.memory_bytes() as f64 / list.len() as f64;
        assert!(
            per_pair < 20.0,
            "{per_pair:.2} bytes per pair for random times"
        );
        // Removing three quarters at random keeps leaves merged.
        let all: Vec<(u64, u32)> = list.iter().collect();
        for (i, (at, addr)) in all.iter().enumerate() {
            if i % 4 != 0 {
                assert!(list.remove(*at, *addr));
            }
        }
        list.check();
        let per_pair = list.memory_bytes() as f64 / list.len() as f64;
        assert!(
            per_pair < 40.0,
            "{per_pair:.2} bytes per pair after removals"
        );
    }
}
