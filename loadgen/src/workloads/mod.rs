//! The client-side steps the workloads are made of, and the checks applied to
//! every answer.
//!
//! What must hold: every put is answered `Done`; every get of a record that
//! was written is answered with exactly that record's value. Anything else is
//! counted (failed / not found / wrong value) and makes the run fail.
//!
//! - [`RangeWork`]: walks record numbers `[0, count)` in chunks shared by all
//!   tasks (preload, the sweep's write and read phases).
//! - [`RandomWork`]: puts or gets of uniformly chosen records (the GridGain-style
//!   put and get phases: YCSB's default request distribution is uniform).
//! - `ycsb`: the YCSB core workloads' mixes.
//! - `tiered`: the hybrid tier's hot device against all-nvme and all-sas.

pub mod gridgain;
pub mod putgettx;
pub mod sweep;
pub mod tiered;
pub mod ycsb;

use crate::driver::{StepContext, StepOutcome, Work};
use crate::keys::{key_name, Rng, Uniform};
use crate::record::ValuePool;
use crate::target::{Op, Reply, Session, TargetError};
use bytes::Bytes;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Put or get.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Put,
    Get,
}

/// The key of record `keynum` in namespace `base` (keys of different sweep
/// sizes never collide on a shared server).
pub fn record_key(base: u64, keynum: u64) -> Bytes {
    Bytes::from(key_name(base.wrapping_add(keynum)))
}

/// Checks the reply to a put.
pub fn check_put(ctx: &mut StepContext<'_>, op: &'static str, reply: &Reply) {
    match reply {
        Reply::Done => {}
        Reply::Failed(reason) => ctx.failed(op, reason),
        other => ctx.failed(op, &format!("unexpected answer to a put: {other:?}")),
    }
}

/// Checks the reply to a get of record `keynum`, which must exist.
pub fn check_get(
    ctx: &mut StepContext<'_>,
    op: &'static str,
    pool: &ValuePool,
    keynum: u64,
    reply: &Reply,
) {
    match reply {
        Reply::Value(v) => {
            if !pool.matches(keynum, v) {
                ctx.wrong_value(op);
            }
        }
        Reply::NotFound => ctx.not_found(op),
        Reply::Failed(reason) => ctx.failed(op, reason),
        other => ctx.failed(op, &format!("unexpected answer to a get: {other:?}")),
    }
}

/// Bytes of keys and values the puts among `ops` carry (the payload a
/// device's writes are compared with).
pub fn put_payload(ops: &[Op]) -> u64 {
    ops.iter()
        .map(|op| match op {
            Op::Put { key, value } => (key.len() + value.len()) as u64,
            _ => 0,
        })
        .sum()
}

/// Sends `ops` and insists on one reply per op.
pub async fn send<S: Session>(session: &mut S, ops: Vec<Op>) -> Result<Vec<Reply>, TargetError> {
    let sent = ops.len();
    let replies = session.batch(ops).await?;
    if replies.len() != sent {
        return Err(TargetError::ReplyCount {
            addr: "server".to_string(),
            sent,
            got: replies.len(),
        });
    }
    Ok(replies)
}

/// Shared cursor over record numbers `[0, count)`, handed out `batch` at a time.
#[derive(Debug)]
pub struct RangeCursor {
    next: AtomicU64,
    count: u64,
}

impl RangeCursor {
    pub fn new(count: u64) -> Arc<RangeCursor> {
        Arc::new(RangeCursor {
            next: AtomicU64::new(0),
            count,
        })
    }

    /// The next chunk of at most `len` record numbers, or `None` when done.
    pub fn claim(&self, len: u64) -> Option<std::ops::Range<u64>> {
        let start = self.next.fetch_add(len, Ordering::Relaxed);
        (start < self.count).then(|| start..(start + len).min(self.count))
    }
}

/// Writes or reads every record of a range, in chunks of `batch`.
pub struct RangeWork {
    pub cursor: Arc<RangeCursor>,
    pub access: Access,
    pub op: &'static str,
    pub base: u64,
    pub batch: u64,
    pub pool: Arc<ValuePool>,
}

impl Work for RangeWork {
    fn operations(&self) -> Vec<&'static str> {
        vec![self.op]
    }

    async fn step<S: Session>(
        &mut self,
        session: &mut S,
        ctx: &mut StepContext<'_>,
    ) -> Result<StepOutcome, TargetError> {
        let Some(range) = self.cursor.claim(self.batch) else {
            return Ok(StepOutcome::Exhausted);
        };
        let numbers: Vec<u64> = range.collect();
        put_or_get(
            session,
            ctx,
            self.op,
            self.access,
            &self.pool,
            self.base,
            &numbers,
        )
        .await
    }
}

/// Puts or gets of uniformly chosen records among `records` loaded ones.
pub struct RandomWork {
    pub rng: Rng,
    pub chooser: Uniform,
    pub access: Access,
    pub op: &'static str,
    pub batch: usize,
    pub pool: Arc<ValuePool>,
}

impl Work for RandomWork {
    fn operations(&self) -> Vec<&'static str> {
        vec![self.op]
    }

    async fn step<S: Session>(
        &mut self,
        session: &mut S,
        ctx: &mut StepContext<'_>,
    ) -> Result<StepOutcome, TargetError> {
        let keynums: Vec<u64> = (0..self.batch)
            .map(|_| self.chooser.next(&mut self.rng))
            .collect();
        put_or_get(session, ctx, self.op, self.access, &self.pool, 0, &keynums).await
    }
}

/// One batch: puts or gets of the records `numbers` (keys under `base`),
/// sent as one request, every reply checked.
async fn put_or_get<S: Session>(
    session: &mut S,
    ctx: &mut StepContext<'_>,
    op: &'static str,
    access: Access,
    pool: &ValuePool,
    base: u64,
    numbers: &[u64],
) -> Result<StepOutcome, TargetError> {
    let ops: Vec<Op> = numbers
        .iter()
        .map(|&n| match access {
            Access::Put => Op::Put {
                key: record_key(base, n),
                value: pool.value_for(n),
            },
            Access::Get => Op::Get {
                key: record_key(base, n),
            },
        })
        .collect();
    let payload = put_payload(&ops);
    let replies = send(session, ops).await?;
    ctx.complete(op, replies.len() as u64);
    ctx.payload(op, payload);
    for (&n, reply) in numbers.iter().zip(&replies) {
        match access {
            Access::Put => check_put(ctx, op, reply),
            Access::Get => check_get(ctx, op, pool, n, reply),
        }
    }
    Ok(StepOutcome::Ran {
        ops: replies.len() as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::{run_phase, Pacing, PhasePlan, Stop};
    use crate::record::RecordShape;
    use crate::target::memory::MemoryTarget;
    use std::time::Duration;

    fn plan(stop: Stop) -> PhasePlan {
        PhasePlan {
            label: "t".into(),
            stop,
            pacing: Pacing::Closed,
            batch: 7,
            progress: crate::driver::Progress::Off,
        }
    }

    #[test]
    fn cursor_hands_out_each_number_once() {
        let c = RangeCursor::new(10);
        assert_eq!(c.claim(4), Some(0..4));
        assert_eq!(c.claim(4), Some(4..8));
        assert_eq!(c.claim(4), Some(8..10));
        assert_eq!(c.claim(4), None);
    }

    #[tokio::test]
    async fn range_then_random_reads_verify_values() {
        let target = MemoryTarget::default();
        let pool = Arc::new(ValuePool::new(1, RecordShape::YCSB));
        let cursor = RangeCursor::new(100);
        let load: Vec<RangeWork> = (0..3)
            .map(|_| RangeWork {
                cursor: cursor.clone(),
                access: Access::Put,
                op: "load",
                base: 0,
                batch: 7,
                pool: pool.clone(),
            })
            .collect();
        let out = run_phase(&target, &plan(Stop::Exhausted { total_ops: 100 }), load)
            .await
            .expect("load");
        assert_eq!(out.tallies["load"].ops, 100);
        assert_eq!(target.keys(), 100);

        // One key answers garbage: the check must catch it.
        target.corrupt(record_key(0, 5));
        let reads: Vec<RandomWork> = (0..2)
            .map(|t| RandomWork {
                rng: Rng::new(9, t),
                chooser: Uniform::new(0, 100),
                access: Access::Get,
                op: "get",
                batch: 50,
                pool: pool.clone(),
            })
            .collect();
        let stop = Stop::Steps {
            warmup: Duration::ZERO,
            steps: 20,
        };
        let out = run_phase(&target, &plan(stop), reads).await.expect("reads");
        let get = &out.tallies["get"];
        assert_eq!(get.ops, 1000);
        assert!(get.wrong_value > 0, "the corrupt key was read and caught");
        assert_eq!(get.not_found, 0);
    }

    #[tokio::test]
    async fn reading_missing_records_counts_not_found() {
        let target = MemoryTarget::default();
        let pool = Arc::new(ValuePool::new(1, RecordShape::YCSB));
        let reads = vec![RangeWork {
            cursor: RangeCursor::new(10),
            access: Access::Get,
            op: "read",
            base: 0,
            batch: 4,
            pool,
        }];
        let out = run_phase(&target, &plan(Stop::Exhausted { total_ops: 10 }), reads)
            .await
            .expect("reads");
        assert_eq!(out.tallies["read"].not_found, 10);
        assert_eq!(out.tallies["read"].error_count(), 10);
    }
}
