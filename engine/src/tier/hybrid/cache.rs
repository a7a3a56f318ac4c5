//! The hybrid tier's read cache: records by address, bounded in bytes,
//! scan-resistant.
//!
//! Two FIFO queues and a ghost list, as in S3-FIFO: a record read from
//! the device enters the small *probation* queue (a tenth of the budget).
//! When it leaves that queue it moves to the *main* queue if it was hit
//! meanwhile, and is dropped otherwise, its address kept in the *ghost*
//! list; a record read again while its address is a ghost goes straight
//! to main. In main, CLOCK (one reference bit per record) decides what
//! goes. A scan reads each record once, so it only ever churns the
//! probation queue and the ghosts, and never evicts the hot set in main.
//!
//! Cost per cached record: its bytes plus [`ENTRY_OVERHEAD`] (map slot,
//! queue slot, `Bytes` header), all counted against the budget.

use super::log::Record;
use std::collections::{HashMap, HashSet, VecDeque};

/// Bytes of bookkeeping counted per cached record.
pub const ENTRY_OVERHEAD: u64 = 96;

struct Entry {
    record: Record,
    main: bool,
    referenced: bool,
}

/// A bounded cache of records by address.
pub struct Cache {
    budget: u64,
    probation_budget: u64,
    map: HashMap<u32, Entry>,
    probation: VecDeque<u32>,
    main: VecDeque<u32>,
    probation_bytes: u64,
    main_bytes: u64,
    /// Addresses dropped from probation without a hit, oldest first.
    ghosts: VecDeque<u32>,
    ghost_set: HashSet<u32>,
    pub hits: u64,
    pub misses: u64,
}

fn cost(r: &Record) -> u64 {
    (r.key.len() + r.value.len()) as u64 + ENTRY_OVERHEAD
}

impl Cache {
    pub fn new(budget: u64) -> Cache {
        Cache {
            budget,
            probation_budget: budget / 10,
            map: HashMap::new(),
            probation: VecDeque::new(),
            main: VecDeque::new(),
            probation_bytes: 0,
            main_bytes: 0,
            ghosts: VecDeque::new(),
            ghost_set: HashSet::new(),
            hits: 0,
            misses: 0,
        }
    }

    /// Most bytes the cache holds (as [`Cache::bytes`] counts them).
    pub fn budget(&self) -> u64 {
        self.budget
    }

    pub fn bytes(&self) -> u64 {
        self.probation_bytes + self.main_bytes
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The record at `addr`, if cached (counts a hit or a miss).
    pub fn get(&mut self, addr: u32) -> Option<Record> {
        match self.map.get_mut(&addr) {
            Some(e) => {
                self.hits += 1;
                e.referenced = true;
                Some(e.record.clone())
            }
            None => {
                self.misses += 1;
                None
            }
        }
    }

    /// The record at `addr` without counting or reordering.
    pub fn peek(&self, addr: u32) -> Option<&Record> {
        self.map.get(&addr).map(|e| &e.record)
    }

    /// Adds a record just read from the device.
    pub fn insert(&mut self, addr: u32, record: Record) {
        let c = cost(&record);
        if c > self.probation_budget.max(1) {
            return;
        }
        let main = self.ghost_set.remove(&addr);
        if let Some(old) = self.map.insert(
            addr,
            Entry {
                record,
                main,
                referenced: false,
            },
        ) {
            self.forget_cost(&old);
        }
        if main {
            self.main_bytes += c;
            self.main.push_back(addr);
        } else {
            self.probation_bytes += c;
            self.probation.push_back(addr);
        }
        self.evict();
    }

    /// Drops the record at `addr` (it was overwritten, deleted or moved).
    pub fn remove(&mut self, addr: u32) -> Option<Record> {
        let e = self.map.remove(&addr)?;
        self.forget_cost(&e);
        Some(e.record)
    }

    /// A record moved (GC): keeps it cached under its new address.
    pub fn rename(&mut self, from: u32, to: u32) {
        if let Some(e) = self.map.remove(&from) {
            let queue = if e.main {
                &mut self.main
            } else {
                &mut self.probation
            };
            queue.push_back(to);
            self.map.insert(to, e);
        }
    }

    fn forget_cost(&mut self, e: &Entry) {
        let c = cost(&e.record);
        if e.main {
            self.main_bytes -= c;
        } else {
            self.probation_bytes -= c;
        }
    }

    fn evict(&mut self) {
        while self.probation_bytes > self.probation_budget {
            let Some(addr) = self.probation.pop_front() else {
                break;
            };
            match self.map.get_mut(&addr) {
                Some(e) if !e.main && e.referenced => {
                    // Hit while on probation: keep it, in main.
                    e.main = true;
                    e.referenced = false;
                    let c = cost(&e.record);
                    self.probation_bytes -= c;
                    self.main_bytes += c;
                    self.main.push_back(addr);
                }
                Some(e) if !e.main => {
                    let e = self.map.remove(&addr).expect("present");
                    self.probation_bytes -= cost(&e.record);
                    self.ghost_set.insert(addr);
                    self.ghosts.push_back(addr);
                }
                _ => {}
            }
        }
        let main_budget = self.budget - self.probation_budget;
        while self.main_bytes > main_budget {
            let Some(addr) = self.main.pop_front() else {
                break;
            };
            match self.map.get_mut(&addr) {
                Some(e) if e.main && e.referenced => {
                    e.referenced = false;
                    self.main.push_back(addr);
                }
                Some(e) if e.main => {
                    let e = self.map.remove(&addr).expect("present");
                    self.main_bytes -= cost(&e.record);
                }
                // A stale queue slot (removed, renamed or not main).
                _ => {}
            }
        }
        // As many ghosts as records cached (at least a few thousand).
        let ghosts_max = self.map.len().max(4096);
        while self.ghosts.len() > ghosts_max {
            if let Some(a) = self.ghosts.pop_front() {
                self.ghost_set.remove(&a);
            }
        }
        // Queue slots left by removals: compact when they dominate.
        if self.probation.len() > 2 * self.map.len() + 1024 {
            let map = &self.map;
            self.probation
                .retain(|a| map.get(a).is_some_and(|e| !e.main));
        }
        if self.main.len() > 2 * self.map.len() + 1024 {
            let map = &self.map;
            self.main.retain(|a| map.get(a).is_some_and(|e| e.main));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn rec(i: u32) -> Record {
        Record {
            key: Bytes::from(i.to_le_bytes().to_vec()),
            value: Bytes::from(vec![0u8; 100]),
            expires_at_ms: None,
            lsn: Some(u64::from(i) + 1),
            size: 112,
        }
    }

    #[test]
    fn stays_within_budget_and_resists_a_scan() {
        let mut c = Cache::new(200_000);
        // A hot set, read twice so it is promoted.
        for _ in 0..3 {
            for i in 0..500 {
                if c.get(i).is_none() {
                    c.insert(i, rec(i));
                }
            }
        }
        assert!(c.bytes() <= 200_000);
        // A scan of 100x the budget, each record read once.
        for i in 1_000..200_000 {
            if c.get(i).is_none() {
                c.insert(i, rec(i));
            }
            assert!(c.bytes() <= 200_000);
        }
        let hot = (0..500).filter(|&i| c.peek(i).is_some()).count();
        assert!(hot >= 450, "only {hot} of 500 hot records survived a scan");
    }

    #[test]
    fn remove_and_rename() {
        let mut c = Cache::new(100_000);
        c.insert(7, rec(7));
        c.rename(7, 9);
        assert!(c.peek(7).is_none());
        assert!(c.peek(9).is_some());
        assert!(c.remove(9).is_some());
        assert_eq!(c.bytes(), 0);
    }
}
