//! The MapDB/ChronicleMap sweep (seed document 001): write N items, then read
//! the same N items, timing each phase in nanoseconds, for each N.
//!
//! What must hold: the read phase reads exactly the N records the write phase
//! wrote, and checks every value. Connections are opened before the clock
//! starts; nothing else is excluded (the seed times the whole loop, so there
//! is no warm-up: the phase itself is the unit being timed).

use super::{Access, RangeCursor, RangeWork};
use crate::driver::{run_phase, DriverError};
use crate::record::ValuePool;
use crate::report::{rows_from_phase, ResultRow};
use crate::settings::Settings;
use crate::target::Target;
use std::sync::Arc;

pub const WORKLOAD: &str = "sweep";

/// The seed document's sizes; 50M only on request.
pub const DEFAULT_SIZES: [u64; 3] = [10_000, 100_000, 1_000_000];

/// Writes then reads `n` records in key namespace `base`.
pub async fn run_size<T: Target>(
    target: &T,
    s: &Settings,
    n: u64,
    base: u64,
    label: &str,
) -> Result<Vec<ResultRow>, DriverError> {
    s.check();
    let pool = Arc::new(ValuePool::new(s.seed, s.shape));
    let mut rows = Vec::new();
    for (access, op) in [(Access::Put, "write"), (Access::Get, "read")] {
        let cursor = RangeCursor::new(n);
        let works: Vec<RangeWork> = (0..s.threads)
            .map(|_| RangeWork {
                cursor: cursor.clone(),
                access,
                op,
                base,
                batch: s.batch as u64,
                pool: pool.clone(),
            })
            .collect();
        let plan = s.exhaust_plan(
            format!("{label} {op} {}", crate::cli::format_count(n)),
            n,
            s.pacing,
        );
        let out = run_phase(target, &plan, works).await?;
        rows.extend(rows_from_phase(WORKLOAD, &out, &[op], Some(n), s.mode())?);
    }
    Ok(rows)
}

/// Namespace for size index `i` on a shared server: sizes never share keys.
pub fn namespace(i: usize) -> u64 {
    (i as u64 + 1) << 40
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Status;
    use crate::settings::tests::tiny;
    use crate::target::memory::MemoryTarget;

    #[tokio::test]
    async fn writes_then_reads_every_item_of_each_size() {
        let target = MemoryTarget::default();
        let s = tiny();
        let mut total = 0;
        for (i, &n) in s.sweep_sizes.iter().enumerate() {
            let rows = run_size(&target, &s, n, namespace(i), "t")
                .await
                .expect("size");
            assert_eq!(rows.len(), 2);
            assert_eq!(
                (rows[0].operation.as_str(), rows[1].operation.as_str()),
                ("write", "read")
            );
            for r in &rows {
                assert_eq!(r.ops, n);
                assert_eq!(r.items, Some(n));
                assert_eq!(r.status, Status::Ok);
                assert!(r.elapsed_ns > 0);
            }
            total += n;
            // Distinct namespaces: the store holds every size's items.
            assert_eq!(target.keys() as u64, total);
        }
    }
}
