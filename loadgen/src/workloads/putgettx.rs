//! PutGetTx, the Ignite/Hazelcast pessimistic-transaction benchmark (seed
//! document 004, Yardstick's `IgnitePutGetTxBenchmark`): in one
//! transaction, get-for-update a key uniform in `[0, range)`; if it existed,
//! pick a new key uniform in `[range/2, range)`; put that key; commit.
//! Two frames per transaction: `[BEGIN, GET_FOR_UPDATE]`, `[PUT, COMMIT]`.
//!
//! What must hold: a transaction counts as done only when its COMMIT
//! answered OK; an aborted one (DIE, LOCK_TIMEOUT, ABORTED) is counted as an
//! abort and ended (ROLLBACK if it is still open), never as done; any other
//! refusal is a failure.

use crate::driver::{run_phase, DriverError, StepContext, StepOutcome, Work};
use crate::keys::Rng;
use crate::report::{rows_from_phase, ResultRow};
use crate::settings::Settings;
use crate::target::{Op, Reply, Session, Target, TargetError};
use bytes::Bytes;

pub const WORKLOAD: &str = "putgettx";
/// The result rows: committed transactions and aborted attempts.
pub const OPS: [&str; 2] = ["tx", "abort"];

fn key(k: u64) -> Bytes {
    Bytes::from(format!("tx-{k:010}"))
}

/// One client task's transactions.
pub struct PutGetTx {
    rng: Rng,
    range: u64,
}

impl PutGetTx {
    pub fn new(seed: u64, stream: u64, range: u64) -> PutGetTx {
        assert!(range >= 2, "PutGetTx needs a range of at least 2 keys");
        PutGetTx {
            rng: Rng::new(seed, stream),
            range,
        }
    }
}

/// Counts an abort and ends the server-side transaction if it is open.
async fn aborted<S: Session>(
    session: &mut S,
    ctx: &mut StepContext<'_>,
    still_open: bool,
) -> Result<StepOutcome, TargetError> {
    if still_open {
        session.batch(vec![Op::Rollback]).await?;
    }
    ctx.complete("abort", 1);
    Ok(StepOutcome::Ran { ops: 0 })
}

impl Work for PutGetTx {
    fn operations(&self) -> Vec<&'static str> {
        OPS.to_vec()
    }

    async fn step<S: Session>(
        &mut self,
        session: &mut S,
        ctx: &mut StepContext<'_>,
    ) -> Result<StepOutcome, TargetError> {
        let mut k = self.rng.below(self.range);
        let first = session
            .batch(vec![Op::Begin, Op::GetForUpdate { key: key(k) }])
            .await?;
        match first.as_slice() {
            [Reply::Done, Reply::Value(_)] => {
                let half = self.range / 2;
                k = half + self.rng.below(self.range - half);
            }
            [Reply::Done, Reply::NotFound] => {}
            [Reply::Done, Reply::Aborted(_)] => return aborted(session, ctx, true).await,
            other => {
                ctx.failed("tx", &format!("BEGIN + GET_FOR_UPDATE answered {other:?}"));
                session.batch(vec![Op::Rollback]).await?;
                return Ok(StepOutcome::Ran { ops: 0 });
            }
        }
        let value = Bytes::from(format!("value-{k}"));
        let second = session
            .batch(vec![Op::Put { key: key(k), value }, Op::Commit])
            .await?;
        match second.as_slice() {
            [Reply::Done, Reply::Done] => {
                ctx.complete("tx", 1);
                Ok(StepOutcome::Ran { ops: 1 })
            }
            // COMMIT answered too: the transaction is over.
            [_, Reply::Aborted(_)] => aborted(session, ctx, false).await,
            other => {
                ctx.failed("tx", &format!("PUT + COMMIT answered {other:?}"));
                Ok(StepOutcome::Ran { ops: 0 })
            }
        }
    }
}

/// Runs PutGetTx with `s.threads` client tasks over `s.txn_range` keys.
pub async fn run<T: Target>(
    target: &T,
    s: &Settings,
    label: &str,
    workload: &str,
) -> Result<Vec<ResultRow>, DriverError> {
    s.check();
    let works: Vec<PutGetTx> = (0..s.threads as u64)
        .map(|t| PutGetTx::new(s.seed, 4_000 + t, s.txn_range))
        .collect();
    let out = run_phase(
        target,
        &s.measured_plan(format!("{label} {workload}")),
        works,
    )
    .await?;
    Ok(rows_from_phase(workload, &out, &OPS, None, s.mode())?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Status;
    use crate::settings::tests::tiny;
    use crate::target::memory::MemoryTarget;

    #[tokio::test]
    async fn commits_transactions_and_fills_the_upper_half() {
        let target = MemoryTarget::default();
        let s = tiny();
        let rows = run(&target, &s, "test", WORKLOAD).await.expect("run");
        let tx = rows.iter().find(|r| r.operation == "tx").expect("tx row");
        assert_eq!(tx.status, Status::Ok, "{rows:?}");
        assert!(tx.ops > 0);
        // A key found once sends later puts to [range/2, range): the map
        // holds at most the lower-half keys first hit plus the upper half.
        assert!(target.keys() as u64 <= s.txn_range);
    }
}
