//! The GridGain-style put/get benchmark (seed document 000): preload the
//! keyspace, then batches of 1,000 puts of 10 x 100-byte records from 16
//! client tasks, then batches of 1,000 gets, each phase warmed up and then
//! measured. Keys are chosen uniformly (YCSB's default request distribution).
//!
//! What must hold: the get phase reads only records the preload wrote, and
//! every value it reads is checked against what was written.

use super::{Access, RandomWork, RangeCursor, RangeWork};
use crate::driver::{run_phase, DriverError, Pacing};
use crate::keys::{Rng, Uniform};
use crate::record::ValuePool;
use crate::report::{rows_from_phase, ResultRow};
use crate::settings::Settings;
use crate::target::Target;
use std::sync::Arc;

pub const WORKLOAD: &str = "putget";

/// Preloads `records` records (closed loop, all measured as "load").
pub async fn preload<T: Target>(
    target: &T,
    s: &Settings,
    pool: &Arc<ValuePool>,
    label: &str,
    workload: &str,
) -> Result<Vec<ResultRow>, DriverError> {
    let cursor = RangeCursor::new(s.records);
    let works: Vec<RangeWork> = (0..s.threads)
        .map(|_| RangeWork {
            cursor: cursor.clone(),
            access: Access::Put,
            op: "load",
            base: 0,
            batch: s.batch as u64,
            pool: pool.clone(),
        })
        .collect();
    let plan = s.exhaust_plan(format!("{label} load"), s.records, Pacing::Closed);
    let out = run_phase(target, &plan, works).await?;
    Ok(rows_from_phase(
        workload,
        &out,
        &["load"],
        Some(s.records),
        "closed",
    )?)
}

/// Runs preload, put and get; returns the rows load, put, get.
pub async fn run<T: Target>(
    target: &T,
    s: &Settings,
    label: &str,
) -> Result<Vec<ResultRow>, DriverError> {
    s.check();
    let pool = Arc::new(ValuePool::new(s.seed, s.shape));
    let mut rows = preload(target, s, &pool, label, WORKLOAD).await?;
    for (access, op, stream) in [(Access::Put, "put", 1_000u64), (Access::Get, "get", 2_000)] {
        let works: Vec<RandomWork> = (0..s.threads as u64)
            .map(|t| RandomWork {
                rng: Rng::new(s.seed, stream + t),
                chooser: Uniform::new(0, s.records),
                access,
                op,
                batch: s.batch,
                pool: pool.clone(),
            })
            .collect();
        let out = run_phase(target, &s.measured_plan(format!("{label} {op}")), works).await?;
        rows.extend(rows_from_phase(WORKLOAD, &out, &[op], None, s.mode())?);
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Status;
    use crate::settings::tests::tiny;
    use crate::target::memory::MemoryTarget;

    #[tokio::test]
    async fn runs_load_put_get_with_verified_reads() {
        let target = MemoryTarget::default();
        let s = tiny();
        let rows = run(&target, &s, "test").await.expect("run");
        let ops: Vec<&str> = rows.iter().map(|r| r.operation.as_str()).collect();
        assert_eq!(ops, ["load", "put", "get"]);
        assert_eq!(target.keys() as u64, s.records);
        assert_eq!(rows[0].ops, s.records);
        assert_eq!(rows[0].items, Some(s.records));
        // 300 ops in batches of 10.
        assert_eq!(rows[1].ops, 300);
        assert_eq!(rows[2].ops, 300);
        assert!(rows.iter().all(|r| r.status == Status::Ok), "{rows:?}");
        assert!(rows
            .iter()
            .all(|r| r.workload == WORKLOAD && r.device == "unthrottled"));
        assert!(rows[2].latency_us.max >= rows[2].latency_us.p50);
        // The load put every record once: its keys and 2 x 10-byte values.
        let load_payload: u64 = (0..s.records)
            .map(|n| crate::keys::key_name(n).len() as u64 + 20)
            .sum();
        assert_eq!(rows[0].payload_bytes, load_payload);
        assert!(rows[1].payload_bytes > 300 * 20, "{:?}", rows[1]);
        assert_eq!(rows[2].payload_bytes, 0, "gets carry no payload");
        // Each phase has its per-second timeline (one point: under a second).
        assert!(rows.iter().all(|r| r.timeline.len() == 1), "{rows:?}");
    }
}
