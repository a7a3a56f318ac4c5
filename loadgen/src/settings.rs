//! The resolved run settings every workload reads (the CLI's flags after
//! defaults and checks).
//!
//! What must hold: a `Settings` is always runnable — at least one client task,
//! batches of at least one operation, at least one record, a positive rate in
//! open loop (the CLI checks these before building one; `assert`s here).

use crate::driver::{Pacing, PhasePlan, Progress, Stop};
use crate::record::RecordShape;
use std::time::Duration;

/// How long each measured phase lasts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Measure {
    /// Measure for this long (after the warm-up).
    Time(Duration),
    /// Measure this many operations (rounded up to whole batches).
    Ops(u64),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub threads: usize,
    pub batch: usize,
    pub records: u64,
    pub measure: Measure,
    pub warmup: Duration,
    pub pacing: Pacing,
    pub seed: u64,
    pub shape: RecordShape,
    /// How each phase shows its progress while it runs.
    pub progress: Progress,
    /// The sweep's N values.
    pub sweep_sizes: Vec<u64>,
    /// What one sweep item is (the document's, or YCSB-style records).
    pub sweep_items: crate::workloads::sweep::ItemShape,
    /// Operations run before each sweep phase's clock starts.
    pub sweep_warmup_ops: u64,
    /// Reads in each size's read phase, if fewer than the size's N (a
    /// uniform sample; the document reads N).
    pub sweep_reads: Option<u64>,
    /// PutGetTx: keys are drawn from `[0, txn_range)` (Yardstick's `--range`).
    pub txn_range: u64,
}

impl Settings {
    pub fn check(&self) {
        assert!(self.threads >= 1, "at least one client task");
        assert!(self.batch >= 1, "batches of at least one operation");
        assert!(self.records >= 1, "at least one record");
        if let Pacing::Open { ops_per_sec } = self.pacing {
            assert!(ops_per_sec > 0.0, "open-loop rate must be positive");
        }
    }

    /// "closed" or "open".
    pub fn mode(&self) -> &'static str {
        match self.pacing {
            Pacing::Closed => "closed",
            Pacing::Open { .. } => "open",
        }
    }

    /// A timed (or op-counted) phase with warm-up.
    pub fn measured_plan(&self, label: String) -> PhasePlan {
        let stop = match self.measure {
            Measure::Time(measure) => Stop::Time {
                warmup: self.warmup,
                measure,
            },
            Measure::Ops(ops) => Stop::Steps {
                warmup: self.warmup,
                steps: ops.div_ceil(self.batch as u64),
            },
        };
        PhasePlan {
            label,
            stop,
            pacing: self.pacing,
            batch: self.batch,
            progress: self.progress,
        }
    }

    /// A phase that runs until `total_ops` operations are done (load, sweep).
    /// Load phases always run closed loop: they exist to fill the store.
    pub fn exhaust_plan(&self, label: String, total_ops: u64, pacing: Pacing) -> PhasePlan {
        PhasePlan {
            label,
            stop: Stop::Exhausted { total_ops },
            pacing,
            batch: self.batch,
            progress: self.progress,
        }
    }
}

#[cfg(test)]
pub mod tests {
    use super::*;

    /// Small settings for unit tests.
    pub fn tiny() -> Settings {
        Settings {
            threads: 3,
            batch: 10,
            records: 200,
            measure: Measure::Ops(300),
            warmup: Duration::ZERO,
            pacing: Pacing::Closed,
            seed: 1,
            shape: RecordShape {
                field_count: 2,
                field_length: 10,
            },
            progress: Progress::Off,
            sweep_sizes: vec![50, 120],
            sweep_items: crate::workloads::sweep::ItemShape::Document,
            sweep_warmup_ops: 20,
            sweep_reads: None,
            txn_range: 100,
        }
    }

    #[test]
    fn ops_budget_rounds_up_to_whole_batches() {
        let s = Settings {
            measure: Measure::Ops(25),
            ..tiny()
        };
        assert_eq!(
            s.measured_plan("x".into()).stop,
            Stop::Steps {
                warmup: Duration::ZERO,
                steps: 3
            }
        );
        assert_eq!(s.mode(), "closed");
    }
}
