//! The thread-per-core plumbing in one place: the messages shards receive,
//! the bounded channels that carry them from outside callers (shard to
//! shard, sub-batches go through `crate::mesh`), the thread-local pointer
//! that lets a caller on a shard thread run its own part inline, and the
//! split / reassemble of a batch across shards.
//!
//! What must hold: a batch is validated against the limits before any of
//! it is applied (a broken limit is an error answer for that op); answers
//! come back in op order; a full shard inbox (or a full share of the mesh
//! to a peer) makes the sender wait (back-pressure), nothing is queued
//! without bound; a caller on a shard
//! thread never sends to its own shard's inbox.

use crate::api::{Op, OpError, OpResult};
use crate::hash::{fnv1a64, shard_of_hash};
use crate::metrics::ShardStats;
use crate::shard::core::ShardCore;
use futures::channel::oneshot;
use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A future made on the shard thread by a [`SpawnFn`].
pub(crate) type LocalTask = Pin<Box<dyn Future<Output = ()>>>;
/// What [`crate::Engine::spawn_on`] sends to a shard.
pub(crate) type SpawnFn = Box<dyn FnOnce() -> LocalTask + Send>;

/// A message on a shard's data inbox.
pub(crate) enum ShardMsg {
    /// A sub-batch; the answers (in its order) go back on `reply`.
    Batch {
        ops: Vec<Op>,
        reply: oneshot::Sender<Vec<OpResult>>,
    },
    /// Work for the shard's transaction side (locks, parts).
    Txn(crate::shard::txn::TxnMsg),
    /// An online backup's request for the checkpointer.
    Backup(crate::shard::backup::BackupRequest),
    /// Publish the tier's counters now (they are otherwise copied after
    /// background steps, at least every 100 ms), then answer: a STATS read
    /// after it sees every request answered before it was sent.
    Refresh { done: oneshot::Sender<()> },
    /// Stop after everything queued before this message: flush, fdatasync,
    /// report, end the thread.
    Shutdown {
        done: oneshot::Sender<Result<(), crate::EngineError>>,
    },
}

/// A message on a shard's control channel.
pub(crate) enum Control {
    Spawn(SpawnFn),
}

/// Capacity of each shard's control channel (spawn requests).
pub(crate) const CONTROL_QUEUE_DEPTH: usize = 1024;

/// Limits every operation is checked against before it reaches a shard.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub(crate) key_bytes_max: usize,
    pub(crate) value_bytes_max: usize,
    pub(crate) ops_per_batch_max: usize,
    /// The largest single WAL record (one flush buffer): a transaction's
    /// part on one shard must fit it; larger plain Puts go as chunk chains.
    pub(crate) record_bytes_max: usize,
}

impl Limits {
    /// The key's limits, and the value's when there is one (a PUT's, or
    /// an update's argument).
    pub(crate) fn check_slices(&self, key: &[u8], value: Option<&[u8]>) -> Result<(), OpError> {
        if key.is_empty() {
            return Err(OpError::EmptyKey);
        }
        if key.len() > self.key_bytes_max {
            return Err(OpError::KeyTooLarge {
                len: key.len(),
                max: self.key_bytes_max,
            });
        }
        match value {
            Some(v) if v.len() > self.value_bytes_max => Err(OpError::ValueTooLarge {
                len: v.len(),
                max: self.value_bytes_max,
            }),
            _ => Ok(()),
        }
    }

    pub(crate) fn check(&self, op: &Op) -> Result<(), OpError> {
        let value = match op {
            Op::Put { value, .. }
            | Op::Update {
                update: crate::api::Update { arg: value, .. },
                ..
            } => Some(&value[..]),
            _ => None,
        };
        self.check_slices(op.key(), value)?;
        // An expiry-aware update may put a few bytes of options in front
        // of a value (the value it writes is checked on the shard).
        if let Op::UpdateTtl { update, .. } = op {
            let max = self.value_bytes_max + crate::api::TTL_ARG_OPTION_BYTES_MAX;
            if update.arg.len() > max {
                return Err(OpError::ValueTooLarge {
                    len: update.arg.len(),
                    max: self.value_bytes_max,
                });
            }
        }
        Ok(())
    }
}

/// What every handle shares.
pub(crate) struct EngineShared {
    pub(crate) engine_id: u64,
    pub(crate) shard_count: usize,
    /// The CPU each shard thread is pinned to (`io.cpus`).
    pub(crate) cpus: Vec<Option<usize>>,
    pub(crate) inboxes: Vec<flume::Sender<ShardMsg>>,
    /// Set by a shard thread as it ends, before it drains its inbox.
    pub(crate) closed: Vec<Arc<AtomicBool>>,
    pub(crate) controls: Vec<flume::Sender<Control>>,
    pub(crate) stats: Vec<Arc<ShardStats>>,
    pub(crate) devices: Vec<Arc<crate::io::throttle::Device>>,
    pub(crate) shutting_down: AtomicBool,
    pub(crate) limits: Limits,
    /// Commit versions and transaction ids (one monotonic clock).
    pub(crate) clock: Arc<crate::shard::core::CommitClock>,
    pub(crate) txn_stats: Arc<crate::metrics::TxnStats>,
    /// The tier keeps values in RAM (the memory tier): what a
    /// transaction's put adds to memory, for `storage.max_memory`.
    pub(crate) values_in_ram: bool,
    /// Online backups and checkpoints of every shard (`crate::backup`).
    pub(crate) backup: crate::shard::backup::BackupShared,
}

struct LocalShard {
    engine_id: u64,
    shard: usize,
    core: Rc<ShardCore>,
}

thread_local! {
    static LOCAL: RefCell<Option<LocalShard>> = const { RefCell::new(None) };
}

/// Marks the current thread as shard `shard` of engine `engine_id`.
pub(crate) fn set_local(engine_id: u64, shard: usize, core: Rc<ShardCore>) {
    LOCAL.with(|l| {
        *l.borrow_mut() = Some(LocalShard {
            engine_id,
            shard,
            core,
        })
    });
}

/// Whether this thread runs a shard of any engine.
pub(crate) fn thread_runs_a_shard() -> bool {
    LOCAL.with(|l| l.borrow().is_some())
}

/// Unmarks the current thread, returning the core it pointed to.
pub(crate) fn clear_local() -> Option<Rc<ShardCore>> {
    LOCAL.with(|l| l.borrow_mut().take()).map(|s| s.core)
}

/// The shard (and its core) this thread runs for `engine_id`, if any.
pub(crate) fn local_shard(engine_id: u64) -> Option<(usize, Rc<ShardCore>)> {
    LOCAL.with(|l| {
        l.borrow()
            .as_ref()
            .filter(|s| s.engine_id == engine_id)
            .map(|s| (s.shard, s.core.clone()))
    })
}

impl EngineShared {
    pub(crate) fn shard_of(&self, key: &[u8]) -> usize {
        if self.shard_count == 1 {
            0
        } else {
            shard_of_hash(fnv1a64(key), self.shard_count)
        }
    }

    fn refuse_if_closing(&self) -> Result<(), OpError> {
        if self.shutting_down.load(Ordering::Acquire) {
            Err(OpError::ShuttingDown)
        } else {
            Ok(())
        }
    }

    /// Sends a sub-batch to `shard`: through the mesh from another shard's
    /// thread (it leaves at the end of this loop turn, with whatever else
    /// this shard sends there), through the shard's inbox from any other
    /// thread (waiting while it is full).
    async fn send(
        &self,
        shard: usize,
        ops: Vec<Op>,
    ) -> Result<oneshot::Receiver<Vec<OpResult>>, OpError> {
        if let Some(port) = crate::mesh::port_of(self.engine_id) {
            return port.request(shard, ops).await;
        }
        let (reply, rx) = oneshot::channel();
        self.inboxes[shard]
            .send_async(ShardMsg::Batch { ops, reply })
            .await
            .map_err(|_| OpError::ShuttingDown)?;
        // A shard that ended sets `closed` before draining its inbox: if it
        // is set now, our message may sit in a queue nobody reads.
        if self.closed[shard].load(Ordering::SeqCst) {
            return Err(OpError::ShuttingDown);
        }
        Ok(rx)
    }

    /// Runs a sub-batch on `shard`: inline when this thread is that shard,
    /// through its inbox otherwise.
    async fn run_on(
        &self,
        shard: usize,
        ops: Vec<Op>,
        local: &Option<(usize, Rc<ShardCore>)>,
    ) -> Result<Vec<OpResult>, OpError> {
        match local {
            Some((s, core)) if *s == shard => Ok(core.execute(ops).await),
            _ => self
                .send(shard, ops)
                .await?
                .await
                .map_err(|_| OpError::ShuttingDown),
        }
    }

    /// See [`crate::Handle::batch`].
    pub(crate) async fn batch(&self, ops: Vec<Op>) -> Result<Vec<OpResult>, OpError> {
        self.refuse_if_closing()?;
        if ops.len() > self.limits.ops_per_batch_max {
            return Err(OpError::BatchTooLarge {
                count: ops.len(),
                max: self.limits.ops_per_batch_max,
            });
        }
        if ops.is_empty() {
            return Ok(Vec::new());
        }
        let local = local_shard(self.engine_id);
        // Fast path: every op valid and owned by one shard (always so with
        // one shard): the batch moves as it is.
        let mut single: Option<usize> = None;
        let mut uniform = true;
        for op in &ops {
            if self.limits.check(op).is_err() {
                uniform = false;
                break;
            }
            let s = self.shard_of(op.key());
            match single {
                None => single = Some(s),
                Some(first) if first != s => {
                    uniform = false;
                    break;
                }
                Some(_) => {}
            }
        }
        if uniform {
            if let Some(shard) = single {
                return self.run_on(shard, ops, &local).await;
            }
        }
        // General path: answer invalid ops here, split the rest by shard.
        let n = ops.len();
        let mut answers: Vec<Option<OpResult>> = (0..n).map(|_| None).collect();
        let mut parts: Vec<(Vec<Op>, Vec<u32>)> = (0..self.shard_count)
            .map(|_| (Vec::new(), Vec::new()))
            .collect();
        for (i, op) in ops.into_iter().enumerate() {
            match self.limits.check(&op) {
                Err(e) => answers[i] = Some(OpResult::Err(e)),
                Ok(()) => {
                    let s = self.shard_of(op.key());
                    parts[s].0.push(op);
                    parts[s].1.push(i as u32);
                }
            }
        }
        let mut remote = Vec::new();
        let mut local_part = None;
        for (shard, (sub, positions)) in parts.into_iter().enumerate() {
            if sub.is_empty() {
                continue;
            }
            match &local {
                Some((s, _)) if *s == shard => local_part = Some((sub, positions)),
                _ => remote.push((self.send(shard, sub).await?, positions)),
            }
        }
        if let (Some((sub, positions)), Some((_, core))) = (local_part, &local) {
            let results = core.execute(sub).await;
            place(&mut answers, results, &positions);
        }
        for (rx, positions) in remote {
            let results = rx.await.map_err(|_| OpError::ShuttingDown)?;
            place(&mut answers, results, &positions);
        }
        Ok(answers
            .into_iter()
            .map(|a| a.expect("every operation is answered"))
            .collect())
    }
}

fn place(answers: &mut [Option<OpResult>], results: Vec<OpResult>, positions: &[u32]) {
    assert_eq!(results.len(), positions.len(), "one answer per operation");
    for (r, &p) in results.into_iter().zip(positions) {
        answers[p as usize] = Some(r);
    }
}
