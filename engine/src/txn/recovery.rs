//! Recovery of transaction parts. A part of a one-shard transaction is
//! applied where it stands in the log. A part of a multi-shard transaction
//! is held back ("deferred") until every shard has read its log: it is
//! applied only if every participant's log holds its part; otherwise none
//! of the transaction is applied anywhere.
//!
//! What must hold: a deferred part is applied at the end in LSN order, but
//! never over a key a later applied record of the same shard wrote (that
//! record was logged after the transaction's locks were released, so it is
//! newer); a later *deferred* part hides nothing (it may be dropped); the
//! decision is the same on every shard (one exchange).

use crate::tier::Tier;
use crate::txn::record::{decode_header, visit_writes, HeldPart};
use bytes::Bytes;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

struct Deferred {
    lsn: u64,
    txn: u64,
    /// (key, value or delete, overwritten later in this shard's log)
    writes: Vec<(Bytes, Option<Bytes>, bool)>,
}

/// What one shard's replay learns about transaction parts.
#[derive(Default)]
pub(crate) struct TxnReplay {
    deferred: Vec<Deferred>,
    /// key -> (deferred index, write index) not yet overwritten.
    open: HashMap<Bytes, Vec<(usize, usize)>>,
    /// Multi-shard parts present in this shard's log: (txn, participants, lsn).
    pub(crate) seen: Vec<(u64, Arc<[u16]>, u64)>,
}

impl TxnReplay {
    /// A replayed plain record (or applied part) wrote `key`.
    pub(crate) fn overwritten(&mut self, key: &[u8]) {
        if self.open.is_empty() {
            return;
        }
        if let Some(list) = self.open.remove(key) {
            for (d, w) in list {
                self.deferred[d].writes[w].2 = true;
            }
        }
    }

    /// A `TxnPart` record. `replay`: its LSN is after the snapshot (apply
    /// or defer it); otherwise it is only noted as present.
    pub(crate) fn part(
        &mut self,
        lsn: u64,
        key: &[u8],
        value: &[u8],
        replay: bool,
        tier: &mut dyn Tier,
    ) {
        let Ok(header) = decode_header(key) else {
            unreachable!("decode_record checked the part");
        };
        if header.participants.len() > 1 {
            self.seen
                .push((header.txn_id, header.participants.clone().into(), lsn));
        }
        if !replay {
            return;
        }
        let mut writes = Vec::new();
        let parsed = visit_writes(value, |k, v| {
            writes.push((Bytes::copy_from_slice(k), v.map(Bytes::copy_from_slice)));
        });
        assert!(parsed.is_ok(), "decode_record checked the part");
        if header.participants.len() == 1 {
            for (k, v) in writes {
                apply(tier, &k, v.as_deref(), lsn);
                self.overwritten(&k);
            }
            return;
        }
        // A later deferred part does not hide an earlier one: it may be
        // dropped, and then the earlier part's value is the newest. Both
        // apply in LSN order at the end.
        let d = self.deferred.len();
        for (w, (k, _)) in writes.iter().enumerate() {
            self.open.entry(k.clone()).or_default().push((d, w));
        }
        self.deferred.push(Deferred {
            lsn,
            txn: header.txn_id,
            writes: writes.into_iter().map(|(k, v)| (k, v, false)).collect(),
        });
    }

    /// Applies the deferred parts of complete transactions (in LSN order),
    /// skipping keys written later; returns (applied, dropped) part counts.
    pub(crate) fn finish(self, complete: &HashSet<u64>, tier: &mut dyn Tier) -> (u64, u64) {
        let (mut applied, mut dropped) = (0, 0);
        for d in self.deferred {
            if !complete.contains(&d.txn) {
                // The first few by name; the shard's recovery line counts all.
                if dropped < DROPPED_PARTS_NAMED {
                    tracing::warn!(txn = d.txn, lsn = d.lsn,
                        "a multi-shard transaction part whose other parts are missing is not applied (the commit never finished)");
                }
                dropped += 1;
                continue;
            }
            applied += 1;
            for (k, v, later) in d.writes {
                if !later {
                    apply(tier, &k, v.as_deref(), d.lsn);
                }
            }
        }
        (applied, dropped)
    }
}

/// Dropped parts named one by one in the log, per shard.
const DROPPED_PARTS_NAMED: u64 = 5;

/// Applies one write of the part logged at `lsn` (its version).
fn apply(tier: &mut dyn Tier, key: &[u8], value: Option<&[u8]>, lsn: u64) {
    let hash = tier.table_hasher().hash_key(key);
    match value {
        Some(v) => {
            tier.put(hash, key, v, lsn);
        }
        None => {
            tier.delete_blind(hash, key, lsn);
        }
    }
}

/// The one exchange of parts between the shards at open.
pub(crate) struct Exchange {
    shards: usize,
    state: Mutex<ExchangeState>,
    ready: Condvar,
}

/// Participants of a transaction and the (shard, LSN) of its parts found.
type PartsFound = (Arc<[u16]>, Vec<(u16, u64)>);

#[derive(Default)]
struct ExchangeState {
    reported: usize,
    failed: bool,
    /// txn -> (participants, (shard, lsn) of parts found)
    parts: HashMap<u64, PartsFound>,
}

/// The decision every shard gets back.
pub(crate) struct Decision {
    pub(crate) complete: HashSet<u64>,
    parts: HashMap<u64, Vec<(u16, u64)>>,
}

impl Decision {
    /// The parts of complete transactions on `shard`, to hold their
    /// segments as a running shard would.
    pub(crate) fn held_on(&self, shard: u16) -> Vec<HeldPart> {
        let mut held = Vec::new();
        for txn in &self.complete {
            if let Some(parts) = self.parts.get(txn) {
                for &(s, lsn) in parts {
                    if s == shard {
                        held.push(HeldPart {
                            lsn,
                            parts: parts.clone().into(),
                        });
                    }
                }
            }
        }
        held
    }
}

impl Exchange {
    pub(crate) fn new(shards: usize) -> Exchange {
        Exchange {
            shards,
            state: Mutex::new(ExchangeState::default()),
            ready: Condvar::new(),
        }
    }

    /// A shard could not recover (or start): the others stop waiting.
    pub(crate) fn fail(&self) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.failed = true;
        self.ready.notify_all();
    }

    /// Reports `shard`'s parts and waits for every shard's report. `None`
    /// if some shard failed (this one must stop too).
    pub(crate) fn report(
        &self,
        shard: u16,
        seen: &[(u64, Arc<[u16]>, u64)],
    ) -> Option<Arc<Decision>> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        for (txn, participants, lsn) in seen {
            let entry = st
                .parts
                .entry(*txn)
                .or_insert_with(|| (participants.clone(), Vec::new()));
            entry.1.push((shard, *lsn));
        }
        st.reported += 1;
        self.ready.notify_all();
        while st.reported < self.shards && !st.failed {
            st = self
                .ready
                .wait_timeout(st, Duration::from_millis(100))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        if st.failed {
            return None;
        }
        let mut complete = HashSet::new();
        let mut parts = HashMap::new();
        for (txn, (participants, found)) in &st.parts {
            let all = participants
                .iter()
                .all(|p| found.iter().any(|(s, _)| s == p));
            if all {
                complete.insert(*txn);
                parts.insert(*txn, found.clone());
            }
        }
        Some(Arc::new(Decision { complete, parts }))
    }
}
