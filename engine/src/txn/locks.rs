//! One shard's lock table: exclusive locks on keys of this shard only,
//! held by transactions until they finish (strict two-phase locking), with
//! wait-die ordering. Lives on its shard thread (no lock shared between
//! threads).
//!
//! What must hold: a key has at most one holder; a transaction waits only
//! for a holder younger than itself (a larger id), so the waits-for graph
//! has no cycle (wait-die); when a lock passes to a waiter, the waiters
//! younger than the new holder are told to die; releasing all of a
//! transaction's locks leaves no key naming it.

use bytes::Bytes;
use futures::channel::oneshot;
use std::collections::HashMap;

/// What a lock request gets at once.
#[derive(Debug)]
pub(crate) enum Acquire {
    /// The caller holds the lock now (or already did).
    Granted,
    /// A younger transaction holds it: the caller may wait; the receiver
    /// says `true` when the lock passes to the caller, `false` when it
    /// must die (a younger transaction got the lock first).
    Wait(oneshot::Receiver<bool>),
    /// An older transaction holds it: the caller must abort (wait-die).
    Die,
}

struct Waiter {
    txn: u64,
    wake: oneshot::Sender<bool>,
}

struct Entry {
    holder: u64,
    waiters: Vec<Waiter>,
}

/// The locks of one shard.
#[derive(Default)]
pub(crate) struct LockTable {
    keys: HashMap<Bytes, Entry>,
    /// Keys each transaction holds on this shard.
    held: HashMap<u64, Vec<Bytes>>,
}

impl LockTable {
    /// Whether some transaction holds `key`.
    pub(crate) fn is_locked(&self, key: &[u8]) -> bool {
        self.keys.contains_key(key)
    }

    /// The transaction holding `key`, if any.
    #[cfg(test)]
    pub(crate) fn holder(&self, key: &[u8]) -> Option<u64> {
        self.keys.get(key).map(|e| e.holder)
    }

    /// Locks held on this shard.
    #[cfg(test)]
    pub(crate) fn locked_count(&self) -> usize {
        self.keys.len()
    }

    /// Asks for `key` on behalf of `txn` (smaller id = older).
    pub(crate) fn acquire(&mut self, key: &Bytes, txn: u64) -> Acquire {
        match self.keys.get_mut(key) {
            None => {
                self.keys.insert(
                    key.clone(),
                    Entry {
                        holder: txn,
                        waiters: Vec::new(),
                    },
                );
                self.held.entry(txn).or_default().push(key.clone());
                Acquire::Granted
            }
            Some(e) if e.holder == txn => Acquire::Granted,
            Some(e) if txn < e.holder => {
                let (wake, rx) = oneshot::channel();
                e.waiters.push(Waiter { txn, wake });
                Acquire::Wait(rx)
            }
            Some(_) => Acquire::Die,
        }
    }

    /// A waiter of `key` gave up (timeout or its caller went away). Returns
    /// whether it holds the lock after all (it was passed on just before).
    pub(crate) fn give_up(&mut self, key: &[u8], txn: u64) -> bool {
        match self.keys.get_mut(key) {
            Some(e) if e.holder == txn => true,
            Some(e) => {
                e.waiters.retain(|w| w.txn != txn);
                false
            }
            None => false,
        }
    }

    /// Releases every lock `txn` holds here, passing each to its oldest
    /// live waiter. Returns how many locks were released.
    pub(crate) fn release_all(&mut self, txn: u64) -> usize {
        let keys = self.held.remove(&txn).unwrap_or_default();
        let n = keys.len();
        for key in keys {
            self.release_one(key, txn);
        }
        n
    }

    fn release_one(&mut self, key: Bytes, txn: u64) {
        let Some(mut entry) = self.keys.remove(&key) else {
            panic!("a held lock is in the table");
        };
        assert_eq!(entry.holder, txn, "only the holder releases a lock");
        // Oldest waiter first; a waiter whose caller is gone is skipped.
        entry.waiters.sort_by_key(|w| w.txn);
        let mut waiters = entry.waiters.into_iter();
        for next in waiters.by_ref() {
            if next.wake.is_canceled() {
                continue;
            }
            if next.wake.send(true).is_err() {
                continue;
            }
            self.held.entry(next.txn).or_default().push(key.clone());
            // Wait-die against the new holder: every remaining waiter is
            // younger than it (sorted), so it dies.
            for younger in waiters {
                let _ = younger.wake.send(false);
            }
            self.keys.insert(
                key,
                Entry {
                    holder: next.txn,
                    waiters: Vec::new(),
                },
            );
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(k: &str) -> Bytes {
        Bytes::copy_from_slice(k.as_bytes())
    }

    #[test]
    fn older_waits_younger_dies() {
        let mut t = LockTable::default();
        assert!(matches!(t.acquire(&key("a"), 5), Acquire::Granted));
        assert!(matches!(t.acquire(&key("a"), 5), Acquire::Granted));
        assert!(matches!(t.acquire(&key("a"), 9), Acquire::Die));
        let Acquire::Wait(mut rx) = t.acquire(&key("a"), 2) else {
            panic!("older waits")
        };
        assert_eq!(t.release_all(5), 1);
        assert_eq!(rx.try_recv().unwrap(), Some(true));
        assert_eq!(t.holder(b"a"), Some(2));
        assert_eq!(t.release_all(2), 1);
        assert!(!t.is_locked(b"a"));
        assert_eq!(t.locked_count(), 0);
    }

    #[test]
    fn the_oldest_waiter_wins_and_younger_waiters_die() {
        let mut t = LockTable::default();
        assert!(matches!(t.acquire(&key("a"), 10), Acquire::Granted));
        let Acquire::Wait(mut r3) = t.acquire(&key("a"), 3) else {
            panic!()
        };
        let Acquire::Wait(mut r1) = t.acquire(&key("a"), 1) else {
            panic!()
        };
        let Acquire::Wait(mut r2) = t.acquire(&key("a"), 2) else {
            panic!()
        };
        t.release_all(10);
        assert_eq!(r1.try_recv().unwrap(), Some(true));
        assert_eq!(r2.try_recv().unwrap(), Some(false));
        assert_eq!(r3.try_recv().unwrap(), Some(false));
        assert_eq!(t.holder(b"a"), Some(1));
    }

    #[test]
    fn a_waiter_that_gave_up_is_skipped() {
        let mut t = LockTable::default();
        assert!(matches!(t.acquire(&key("a"), 10), Acquire::Granted));
        let Acquire::Wait(r1) = t.acquire(&key("a"), 1) else {
            panic!()
        };
        assert!(!t.give_up(b"a", 1));
        drop(r1);
        t.release_all(10);
        assert!(!t.is_locked(b"a"));
    }
}
