//! The transaction side of one shard: its lock table, the parts it logged
//! and has not yet applied ("unresolved"), the applied parts of
//! multi-shard transactions whose WAL segments must stay ("held"), and the
//! handling of transaction messages. Lives on its shard thread.
//!
//! What must hold:
//! - a multi-shard part's writes reach the tier only after every part of
//!   its transaction is logged and durable (in every mode with a WAL);
//! - the locks of a multi-shard commit that failed with its outcome
//!   undecided stay taken until the restart (the coordinator does not
//!   release them), so nobody builds on the values from before it;
//! - a snapshot never claims an LSN at or above an unresolved part (its
//!   writes are not in the tier yet): see [`TxnShard::checkpoint_lsn_max`];
//! - a WAL segment holding a part of a multi-shard transaction is removed
//!   only when every participant's oldest kept snapshot covers its own
//!   part, so recovery of any participant that replays its part finds all
//!   the other parts: see [`TxnShard::retain_from`].

use crate::mesh::Back;
use crate::metrics::TxnStats;
use crate::shard::core::ShardCore;
use crate::txn::locks::{Acquire, LockTable};
use crate::txn::record::{encode_header, encode_writes, HeldPart, TxnWrite};
use crate::txn::TxnError;
use bytes::Bytes;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A message for the transaction side of a shard.
pub(crate) enum TxnMsg {
    /// Lock `key` for `txn` (waiting up to `wait_max`); with `read`, answer
    /// its committed value.
    Lock {
        txn: u64,
        key: Bytes,
        read: bool,
        wait_max: Duration,
        reply: Back<Result<Option<Bytes>, TxnError>>,
    },
    /// Read `key`'s committed, durable value without a lock.
    Read {
        key: Bytes,
        reply: Back<Result<Option<Bytes>, TxnError>>,
    },
    /// Log this shard's part. Without `finish` (one part of several), the
    /// answer waits until it is durable (in every mode with a WAL, see
    /// [`log_part`]). With `finish` (the only part): apply it and release
    /// `txn`'s locks here as soon as it is in the WAL buffer (early lock
    /// release), signal `released`, and answer once it is durable (under
    /// `sync`); reads of its keys wait for that too.
    Log {
        txn: u64,
        participants: Arc<[u16]>,
        writes: Vec<TxnWrite>,
        finish: bool,
        released: Option<Back<()>>,
        reply: Back<Result<u64, PartFailure>>,
    },
    /// Every part is logged (durable under `sync`): apply this shard's
    /// writes, remember the participants' part LSNs, release the locks.
    Apply {
        txn: u64,
        lsn: u64,
        writes: Vec<TxnWrite>,
        parts: Arc<[(u16, u64)]>,
        /// `Err` if the tier failed to take the writes (the shard is
        /// poisoned; the restart decides).
        reply: Back<Result<(), TxnError>>,
    },
    /// The write marks of `keys` (WATCH, and EXEC's check), in order.
    Marks {
        keys: Vec<Bytes>,
        reply: Back<Vec<crate::txn::watch::KeyMark>>,
    },
    /// Release `txn`'s locks here without applying anything.
    Release { txn: u64, reply: Option<Back<()>> },
}

/// A part that was not logged durably: the error for the committer, and
/// whether the part may be on disk all the same. A part appended to the WAL
/// buffer whose flush then failed may have reached the disk (a failed
/// write can land in part, a failed fdatasync says nothing about what
/// stayed), so only the restart knows; a part refused before it was
/// appended (the shard was poisoned already) is in no log.
#[derive(Debug)]
pub(crate) struct PartFailure {
    pub(crate) error: TxnError,
    pub(crate) maybe_logged: bool,
}

impl PartFailure {
    fn poisoned(shard: usize, maybe_logged: bool) -> PartFailure {
        PartFailure {
            error: TxnError::Poisoned { shard },
            maybe_logged,
        }
    }
}

/// The transaction state of one shard.
pub(crate) struct TxnShard {
    shard: u16,
    pub(crate) locks: RefCell<LockTable>,
    /// LSN -> transaction id of parts logged here and not applied.
    unresolved: RefCell<BTreeMap<u64, u64>>,
    held: RefCell<Vec<HeldPart>>,
    /// Per shard: the LSN its oldest kept snapshot covers (published by
    /// each shard's checkpointer; shared by the engine).
    floors: Arc<[AtomicU64]>,
    pub(crate) stats: Arc<TxnStats>,
}

impl TxnShard {
    pub(crate) fn new(
        shard: usize,
        floors: Arc<[AtomicU64]>,
        stats: Arc<TxnStats>,
        held: Vec<HeldPart>,
    ) -> TxnShard {
        TxnShard {
            shard: shard as u16,
            locks: RefCell::new(LockTable::default()),
            unresolved: RefCell::new(BTreeMap::new()),
            held: RefCell::new(held),
            floors,
            stats,
        }
    }

    /// Whether a transaction holds `key` (plain writes on it are refused).
    pub(crate) fn is_locked(&self, key: &[u8]) -> bool {
        self.locks.borrow().is_locked(key)
    }

    /// The highest LSN a snapshot may claim now: below the oldest
    /// unresolved part (`None`: no limit).
    pub(crate) fn checkpoint_lsn_max(&self) -> Option<u64> {
        self.unresolved
            .borrow()
            .keys()
            .next()
            .map(|&lsn| lsn.saturating_sub(1))
    }

    /// This shard's oldest kept snapshot now covers `lsn`.
    pub(crate) fn publish_floor(&self, lsn: u64) {
        self.floors[self.shard as usize].fetch_max(lsn, Relaxed);
    }

    /// The oldest LSN whose segment must stay for transactions (`None`: no
    /// constraint). Drops held parts every participant has covered.
    pub(crate) fn retain_from(&self) -> Option<u64> {
        let mut held = self.held.borrow_mut();
        held.retain(|h| {
            h.parts
                .iter()
                .any(|&(s, lsn)| self.floors[s as usize].load(Relaxed) < lsn)
        });
        let oldest_held = held.iter().map(|h| h.lsn).min();
        let oldest_unresolved = self.unresolved.borrow().keys().next().copied();
        match (oldest_held, oldest_unresolved) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// Handles one transaction message on `core`'s shard thread. Never blocks
/// the inbox: anything that waits runs as its own task.
pub(crate) fn handle(core: &Rc<ShardCore>, msg: TxnMsg) {
    match msg {
        TxnMsg::Lock {
            txn,
            key,
            read,
            wait_max,
            reply,
        } => lock(core, txn, key, read, wait_max, reply),
        TxnMsg::Read { key, reply } => read_and_reply(core, key, reply),
        TxnMsg::Log {
            txn,
            participants,
            writes,
            finish,
            released,
            reply,
        } => {
            let core = core.clone();
            compio::runtime::spawn(async move {
                let result = if finish {
                    commit_part(&core, txn, &participants, &writes, released).await
                } else {
                    log_part(&core, txn, &participants, &writes).await
                };
                let _ = reply.send(result);
            })
            .detach();
        }
        TxnMsg::Apply {
            txn,
            lsn,
            writes,
            parts,
            reply,
        } => {
            let applied = apply_part(core, txn, lsn, &writes, Some(parts), None);
            let _ = reply.send(applied);
        }
        TxnMsg::Marks { keys, reply } => {
            let marks = core.key_marks(&keys);
            // A mark a transaction moved before it was durable is answered
            // once it is (a WATCH that fails over it tells of the write).
            let Some(lsn) = core.undurable_lsn_of(&keys) else {
                let _ = reply.send(marks);
                return;
            };
            let core = core.clone();
            compio::runtime::spawn(async move {
                // Poisoned first: no answer (the caller sees an error).
                if core.wait_durable(lsn).await.is_ok() {
                    let _ = reply.send(marks);
                }
            })
            .detach();
        }
        TxnMsg::Release { txn, reply } => {
            core.txn.locks.borrow_mut().release_all(txn);
            if let Some(reply) = reply {
                let _ = reply.send(());
            }
        }
    }
}

/// Takes `key`'s lock for `txn` (reading its value too when `read`): at
/// once, or in a task of its own that waits up to `wait_max` for the
/// holder; a younger transaction that would wait dies instead.
fn lock(
    core: &Rc<ShardCore>,
    txn: u64,
    key: Bytes,
    read: bool,
    wait_max: Duration,
    reply: Back<Result<Option<Bytes>, TxnError>>,
) {
    let acquired = core.txn.locks.borrow_mut().acquire(&key, txn);
    let rx = match acquired {
        Acquire::Granted if read => return read_and_reply(core, key, reply),
        Acquire::Granted => {
            let _ = reply.send(Ok(None));
            return;
        }
        Acquire::Die => {
            let _ = reply.send(Err(TxnError::Die));
            return;
        }
        Acquire::Wait(rx) => rx,
    };
    let core = core.clone();
    compio::runtime::spawn(async move {
        let stats = &core.txn.stats;
        stats.lock_waits.fetch_add(1, Relaxed);
        let started = Instant::now();
        let outcome = compio::time::timeout(wait_max, rx).await;
        stats
            .lock_wait_us
            .fetch_add(started.elapsed().as_micros() as u64, Relaxed);
        let granted = match outcome {
            Ok(Ok(granted)) => granted,
            Ok(Err(_)) => false,
            Err(_) => {
                if !core.txn.locks.borrow_mut().give_up(&key, txn) {
                    let _ = reply.send(Err(TxnError::LockTimeout));
                    return;
                }
                true
            }
        };
        if !granted {
            let _ = reply.send(Err(TxnError::Die));
            return;
        }
        if reply.is_canceled() {
            // The transaction's owner is gone: nothing will ever release
            // this lock but us.
            core.txn.locks.borrow_mut().release_all(txn);
            return;
        }
        if read {
            read_and_reply(&core, key, reply);
        } else {
            let _ = reply.send(Ok(None));
        }
    })
    .detach();
}

/// Answers `key`'s value once the records it may reflect are durable
/// (under `sync`: the newest plain write, and the part of a transaction
/// that released its locks before its part was durable and wrote `key`),
/// so a transaction never sees a value a crash could take back.
fn read_and_reply(core: &Rc<ShardCore>, key: Bytes, reply: Back<Result<Option<Bytes>, TxnError>>) {
    let value = match core.read_tier(&key) {
        Ok(v) => v,
        Err(e) => {
            let _ = reply.send(Err(TxnError::Op(e)));
            return;
        }
    };
    let Some(lsn) = core.undurable_lsn_of(std::slice::from_ref(&key)) else {
        let _ = reply.send(Ok(value));
        return;
    };
    let core = core.clone();
    compio::runtime::spawn(async move {
        let result = match core.wait_durable(lsn).await {
            Ok(()) => Ok(value),
            Err(()) => Err(TxnError::Poisoned {
                shard: core.settings.shard,
            }),
        };
        let _ = reply.send(result);
    })
    .detach();
}

/// Logs `writes` as one part of a multi-shard transaction and waits for it
/// to be durable, under `async` too (the wait asks for a flush at once).
/// Returns its LSN (0 without a WAL).
///
/// Why `async` waits as well: a part applied before every part is durable
/// can be taken into a snapshot of this shard, while another shard loses
/// its own part in a crash or a failed flush; recovery then drops the
/// transaction, but this shard's snapshot already holds its writes and
/// nothing can take them back (a half-applied transaction for good).
async fn log_part(
    core: &ShardCore,
    txn: u64,
    participants: &[u16],
    writes: &[TxnWrite],
) -> Result<u64, PartFailure> {
    let shard = core.settings.shard;
    let header = encode_header(txn, participants);
    let body = encode_writes(writes);
    let lsn = match core.log_txn_part(&header, &body).await {
        Err(()) => return Err(PartFailure::poisoned(shard, false)),
        Ok(None) => return Ok(0),
        Ok(Some(lsn)) => lsn,
    };
    core.txn.unresolved.borrow_mut().insert(lsn, txn);
    core.wait_durable(lsn)
        .await
        .map_err(|()| PartFailure::poisoned(shard, true))?;
    Ok(lsn)
}

/// The commit of a transaction that writes on this shard only, with early
/// lock release: logs its part to the WAL buffer, applies it to the tier
/// and releases its locks at once (signalling `released`), then answers
/// once the part is durable (under `sync`). Until then every read that may
/// see its writes waits for the same LSN ([`ShardCore::undurable_lsn_of`],
/// and plain GETs in the apply step), so nobody is told of a write a crash
/// could take back; if the shard is poisoned first, the commit and those
/// reads answer POISONED and the restart decides (a part that did not
/// reach the disk is gone, and nobody saw it).
async fn commit_part(
    core: &ShardCore,
    txn: u64,
    participants: &[u16],
    writes: &[TxnWrite],
    released: Option<Back<()>>,
) -> Result<u64, PartFailure> {
    let shard = core.settings.shard;
    let header = encode_header(txn, participants);
    let body = encode_writes(writes);
    let lsn = match core.log_txn_part(&header, &body).await {
        Err(()) => {
            core.txn.locks.borrow_mut().release_all(txn);
            return Err(PartFailure::poisoned(shard, false));
        }
        Ok(None) => 0,
        Ok(Some(lsn)) => lsn,
    };
    let sync = lsn > 0 && core.settings.durability == tunables::Durability::Sync;
    if lsn > 0 {
        core.txn.unresolved.borrow_mut().insert(lsn, txn);
    }
    apply_part(core, txn, lsn, writes, None, sync.then_some(lsn)).map_err(|error| PartFailure {
        error,
        maybe_logged: lsn > 0,
    })?;
    core.wake_settles();
    if let Some(released) = released {
        let _ = released.send(());
    }
    if sync {
        core.wait_durable(lsn)
            .await
            .map_err(|()| PartFailure::poisoned(shard, true))?;
    }
    Ok(lsn)
}

/// Applies a logged part to the tier, resolves it, releases the locks.
/// `undurable_lsn`: the part is not durable yet (see [`commit_part`]).
/// If the tier could not take the writes, the shard is poisoned: the
/// commit answers [`TxnError::Poisoned`] (a restart replays the part), and
/// the part stays unresolved, so no snapshot claims its LSN.
fn apply_part(
    core: &ShardCore,
    txn: u64,
    lsn: u64,
    writes: &[TxnWrite],
    parts: Option<Arc<[(u16, u64)]>>,
    undurable_lsn: Option<u64>,
) -> Result<(), TxnError> {
    if core.apply_txn_writes(writes, lsn, undurable_lsn).is_err() {
        core.txn.locks.borrow_mut().release_all(txn);
        return Err(TxnError::Poisoned {
            shard: core.settings.shard,
        });
    }
    if lsn > 0 {
        core.txn.unresolved.borrow_mut().remove(&lsn);
        if let Some(parts) = parts.filter(|p| p.len() > 1) {
            core.txn.held.borrow_mut().push(HeldPart { lsn, parts });
        }
    }
    core.txn.locks.borrow_mut().release_all(txn);
    Ok(())
}
