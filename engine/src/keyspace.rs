//! Whole-keyspace operations on a [`Handle`]: listing the keys of a shard
//! partition by partition (for SCAN, KEYS, RANDOMKEY) and deleting every
//! key (FLUSHALL). Each runs on the shard's own thread, between batches.
//!
//! What must hold: a partition's keys are read in one synchronous step (a
//! consistent view of that partition); the keys of a partition never move
//! to another one (the partition is a function of the key's hash), so a
//! walk over every partition returns every key present for the whole walk
//! at least once; deletes go through the WAL as ordinary delete records
//! and are answered under the durability mode, like any delete.

use crate::api::{Op, OpError, OpResult};
use crate::engine::Handle;
use crate::shard::core::ShardCore;
use crate::shard::router::{local_shard, Control};
use bytes::Bytes;
use futures::channel::oneshot;
use std::future::Future;
use std::rc::Rc;

/// Partitions per shard (fixed for the life of a shard; see
/// [`crate::tier::Tier::partition_count`]).
pub const PARTITIONS_PER_SHARD: usize = crate::tier::memory::PARTITION_COUNT;

/// Deletes are sent to the shard in chunks of this many keys.
const CLEAR_CHUNK: usize = 1024;

/// One step of a partition walk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionKeys {
    /// Keys of the partitions visited.
    pub keys: Vec<Bytes>,
    /// The next partition to visit, `None` once the shard is done.
    pub next: Option<usize>,
}

impl Handle {
    /// Runs `f` with the shard's core on the shard's thread (inline when
    /// called there) and returns its output.
    async fn on_shard<R, F, Fut>(&self, shard: usize, f: F) -> Result<R, OpError>
    where
        R: Send + 'static,
        F: FnOnce(Rc<ShardCore>) -> Fut + Send + 'static,
        Fut: Future<Output = R> + 'static,
    {
        if shard >= self.shared.shard_count {
            return Err(OpError::ShuttingDown);
        }
        let engine_id = self.shared.engine_id;
        if let Some((s, core)) = local_shard(engine_id) {
            if s == shard {
                return Ok(f(core).await);
            }
        }
        let (tx, rx) = oneshot::channel();
        let task: crate::shard::router::SpawnFn = Box::new(move || {
            Box::pin(async move {
                if let Some((_, core)) = local_shard(engine_id) {
                    let _ = tx.send(f(core).await);
                }
            })
        });
        self.shared.controls[shard]
            .send_async(Control::Spawn(task))
            .await
            .map_err(|_| OpError::ShuttingDown)?;
        rx.await.map_err(|_| OpError::ShuttingDown)
    }

    /// The keys of shard `shard` from partition `from` on: whole partitions
    /// are visited until at least `count` keys were found (or the shard's
    /// partitions are exhausted).
    pub async fn partition_keys(
        &self,
        shard: usize,
        from: usize,
        count: usize,
    ) -> Result<PartitionKeys, OpError> {
        self.refuse_if_closing()?;
        self.on_shard(shard, move |core| async move {
            let mut keys = Vec::new();
            let mut partition = from;
            while partition < PARTITIONS_PER_SHARD && keys.len() < count.max(1) {
                core.with_tier(|t| {
                    t.visit_partition(partition, &mut |k, _, _| {
                        keys.push(Bytes::copy_from_slice(k))
                    })
                });
                partition += 1;
            }
            PartitionKeys {
                keys,
                next: (partition < PARTITIONS_PER_SHARD).then_some(partition),
            }
        })
        .await
    }

    /// Deletes every key on every shard (each delete logged like any other);
    /// returns how many keys were deleted. Writes that run at the same time
    /// may survive (the shards are cleared partition by partition).
    pub async fn clear(&self) -> Result<u64, OpError> {
        self.refuse_if_closing()?;
        let mut deleted = 0;
        for shard in 0..self.shared.shard_count {
            deleted += self
                .on_shard(shard, move |core| async move { clear_shard(&core).await })
                .await??;
        }
        Ok(deleted)
    }

    fn refuse_if_closing(&self) -> Result<(), OpError> {
        if self
            .shared
            .shutting_down
            .load(std::sync::atomic::Ordering::Acquire)
        {
            Err(OpError::ShuttingDown)
        } else {
            Ok(())
        }
    }
}

async fn clear_shard(core: &ShardCore) -> Result<u64, OpError> {
    let mut deleted = 0;
    for partition in 0..PARTITIONS_PER_SHARD {
        let mut keys = Vec::new();
        core.with_tier(|t| {
            t.visit_partition(partition, &mut |k, _, _| {
                keys.push(Bytes::copy_from_slice(k))
            })
        });
        for chunk in keys.chunks(CLEAR_CHUNK) {
            let ops = chunk
                .iter()
                .map(|k| Op::Delete { key: k.clone() })
                .collect();
            for result in core.execute(ops).await {
                match result {
                    OpResult::Ok => deleted += 1,
                    OpResult::NotFound => {}
                    OpResult::Err(e) => return Err(e),
                    other => unreachable!("a delete answered {other:?}"),
                }
            }
        }
    }
    Ok(deleted)
}
