//! Throughput and p99 over wall-clock time in fixed buckets, for the crash
//! report's per-crash before/after figures and its chart.
//!
//! What must hold: a batch counts in the bucket of its completion time;
//! buckets cover the whole run, downtime included (they show as zero).

use crate::hist::LatencyHistogram;
use serde::{Deserialize, Serialize};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One bucket of the report's timeline.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct TimelinePoint {
    /// Start of the bucket, seconds since the run started.
    pub at_s: f64,
    pub ops_per_sec: f64,
    /// Batch latency p99, µs (0 when nothing completed).
    pub p99_us: f64,
}

/// Throughput and p99 over a span of the run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Window {
    pub ops_per_sec: f64,
    pub p99_us: f64,
}

#[derive(Default)]
struct Bucket {
    ops: u64,
    hist: LatencyHistogram,
}

pub struct Timeline {
    start: Instant,
    width: Duration,
    buckets: Mutex<Vec<Bucket>>,
}

impl Timeline {
    pub fn new(start: Instant, width: Duration) -> Timeline {
        assert!(!width.is_zero(), "timeline buckets have a width");
        Timeline {
            start,
            width,
            buckets: Mutex::new(Vec::new()),
        }
    }

    pub fn since_start(&self, at: Instant) -> Duration {
        at.saturating_duration_since(self.start)
    }

    /// A batch of `ops` that completed at `done` after `latency`.
    pub fn record(&self, done: Instant, ops: u64, latency: Duration) {
        let index = (self.since_start(done).as_nanos() / self.width.as_nanos()) as usize;
        let mut b = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        if b.len() <= index {
            b.resize_with(index + 1, Bucket::default);
        }
        b[index].ops += ops;
        b[index].hist.record(latency);
    }

    /// Operations recorded so far, in all buckets.
    pub fn total_ops(&self) -> u64 {
        let b = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        b.iter().map(|bucket| bucket.ops).sum()
    }

    /// Throughput and p99 over `[from, to)` (seconds since the start).
    pub fn window(&self, from_s: f64, to_s: f64) -> Window {
        let w = self.width.as_secs_f64();
        let b = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        let first = (from_s.max(0.0) / w).floor() as usize;
        let last = ((to_s / w).ceil() as usize).min(b.len());
        let mut hist = LatencyHistogram::new();
        let mut ops = 0;
        for bucket in b.iter().take(last).skip(first) {
            ops += bucket.ops;
            hist.merge(&bucket.hist);
        }
        let span = (last.saturating_sub(first)) as f64 * w;
        Window {
            ops_per_sec: if span > 0.0 { ops as f64 / span } else { 0.0 },
            p99_us: hist.summary().p99,
        }
    }

    /// Every bucket up to `end_s`, as report points.
    pub fn points(&self, end_s: f64) -> Vec<TimelinePoint> {
        let w = self.width.as_secs_f64();
        let b = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        let count = ((end_s / w).ceil() as usize).max(b.len());
        (0..count)
            .map(|i| match b.get(i) {
                Some(bucket) => TimelinePoint {
                    at_s: i as f64 * w,
                    ops_per_sec: bucket.ops as f64 / w,
                    p99_us: bucket.hist.summary().p99,
                },
                None => TimelinePoint {
                    at_s: i as f64 * w,
                    ..TimelinePoint::default()
                },
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_land_in_their_buckets_and_gaps_are_zero() {
        let start = Instant::now();
        let t = Timeline::new(start, Duration::from_millis(100));
        t.record(
            start + Duration::from_millis(10),
            50,
            Duration::from_micros(200),
        );
        t.record(
            start + Duration::from_millis(350),
            30,
            Duration::from_micros(900),
        );
        assert_eq!(t.total_ops(), 80);
        let p = t.points(0.5);
        assert_eq!(p.len(), 5);
        assert!((p[0].ops_per_sec - 500.0).abs() < 1e-6);
        assert_eq!(p[1].ops_per_sec, 0.0);
        assert!((p[3].ops_per_sec - 300.0).abs() < 1e-6);
        let w = t.window(0.0, 0.2);
        assert!((w.ops_per_sec - 250.0).abs() < 1e-6);
        assert!(w.p99_us >= 199.0 && w.p99_us <= 201.0, "{}", w.p99_us);
    }
}
