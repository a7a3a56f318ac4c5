//! Throughput and p99 over wall-clock time in fixed buckets, for the crash
//! report's per-crash before/after figures and its chart, and for the
//! per-second timeline every measured phase records (`driver`).
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
    /// Sealed (see [`Timeline::per_phase`]): the p99 its histogram had,
    /// which was then dropped.
    sealed_p99_us: Option<f64>,
}

impl Bucket {
    fn p99_us(&self) -> f64 {
        self.sealed_p99_us
            .unwrap_or_else(|| self.hist.summary().p99)
    }
}

struct Buckets {
    list: Vec<Bucket>,
    /// Buckets below this are sealed.
    sealed: usize,
}

pub struct Timeline {
    start: Instant,
    width: Duration,
    /// Seal buckets two widths behind the newest (per-phase timelines,
    /// which need each bucket's p99 only: a histogram a second would hold
    /// hundreds of MB over an hour's run).
    seal: bool,
    buckets: Mutex<Buckets>,
}

impl Timeline {
    /// A timeline whose buckets keep their histograms, so any window's p99
    /// can be merged from them (crash runs).
    pub fn new(start: Instant, width: Duration) -> Timeline {
        assert!(!width.is_zero(), "timeline buckets have a width");
        Timeline {
            start,
            width,
            seal: false,
            buckets: Mutex::new(Buckets {
                list: Vec::new(),
                sealed: 0,
            }),
        }
    }

    /// A timeline for [`Timeline::window_points`] only: a bucket two
    /// widths older than the newest keeps its p99 and drops its histogram
    /// (a batch that lands in it later still counts its operations).
    pub fn per_phase(start: Instant, width: Duration) -> Timeline {
        Timeline {
            seal: true,
            ..Timeline::new(start, width)
        }
    }

    pub fn since_start(&self, at: Instant) -> Duration {
        at.saturating_duration_since(self.start)
    }

    /// A batch of `ops` that completed at `done` after `latency`.
    pub fn record(&self, done: Instant, ops: u64, latency: Duration) {
        let index = (self.since_start(done).as_nanos() / self.width.as_nanos()) as usize;
        let mut guard = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        let b = &mut *guard;
        if b.list.len() <= index {
            b.list.resize_with(index + 1, Bucket::default);
        }
        let bucket = &mut b.list[index];
        bucket.ops += ops;
        if bucket.sealed_p99_us.is_none() {
            bucket.hist.record(latency);
        }
        if self.seal {
            let upto = b.list.len().saturating_sub(2);
            while b.sealed < upto {
                let old = &mut b.list[b.sealed];
                old.sealed_p99_us = Some(old.hist.summary().p99);
                old.hist = LatencyHistogram::default();
                b.sealed += 1;
            }
        }
    }

    /// Operations recorded so far, in all buckets.
    pub fn total_ops(&self) -> u64 {
        let b = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        b.list.iter().map(|bucket| bucket.ops).sum()
    }

    /// Throughput and p99 over `[from, to)` (seconds since the start).
    pub fn window(&self, from_s: f64, to_s: f64) -> Window {
        let w = self.width.as_secs_f64();
        let guard = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        let b = &guard.list;
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
        let guard = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        let b = &guard.list;
        let count = ((end_s / w).ceil() as usize).max(b.len());
        (0..count)
            .map(|i| match b.get(i) {
                Some(bucket) => TimelinePoint {
                    at_s: i as f64 * w,
                    ops_per_sec: bucket.ops as f64 / w,
                    p99_us: bucket.p99_us(),
                },
                None => TimelinePoint {
                    at_s: i as f64 * w,
                    ..TimelinePoint::default()
                },
            })
            .collect()
    }
}

impl Timeline {
    /// The buckets of a measurement window `elapsed` long, as report
    /// points. The window is cut into `round(elapsed / width)` buckets (at
    /// least one): a last fragment shorter than half a bucket joins the
    /// bucket before it, a longer one stands alone, and the last bucket's
    /// rate is over its own length. Empty when nothing was measured.
    pub fn window_points(&self, elapsed: Duration) -> Vec<TimelinePoint> {
        let w = self.width.as_secs_f64();
        let e = elapsed.as_secs_f64();
        if e <= 0.0 {
            return Vec::new();
        }
        let count = ((e / w).round() as usize).max(1);
        let guard = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        let b = &guard.list;
        (0..count)
            .map(|i| {
                // The last point takes every bucket from its own on.
                let end = if i + 1 == count {
                    b.len().max(i + 1)
                } else {
                    i + 1
                };
                let mut hist = LatencyHistogram::new();
                let mut ops = 0;
                // Of sealed buckets only the p99 is left: the highest stands
                // for their merge.
                let mut sealed_p99: f64 = 0.0;
                for bucket in b.iter().take(end).skip(i) {
                    ops += bucket.ops;
                    match bucket.sealed_p99_us {
                        Some(p99) => sealed_p99 = sealed_p99.max(p99),
                        None => hist.merge(&bucket.hist),
                    }
                }
                let span = if i + 1 == count { e - i as f64 * w } else { w };
                TimelinePoint {
                    at_s: i as f64 * w,
                    ops_per_sec: ops as f64 / span,
                    p99_us: hist.summary().p99.max(sealed_p99),
                }
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

    /// A per-phase timeline drops the histograms of buckets two seconds
    /// behind and keeps their p99 and counts.
    #[test]
    fn per_phase_buckets_keep_their_p99_after_sealing() {
        let start = Instant::now();
        let t = Timeline::per_phase(start, Duration::from_secs(1));
        let at = |ms: u64| start + Duration::from_millis(ms);
        for s in 0..10u64 {
            t.record(at(s * 1000 + 10), 10, Duration::from_micros(100 * (s + 1)));
        }
        {
            let b = t.buckets.lock().unwrap();
            assert_eq!(b.sealed, 8);
            assert!(b.list[..8].iter().all(|x| x.hist.count() == 0));
        }
        // A late batch in a sealed second still counts.
        t.record(at(2_500), 5, Duration::from_secs(1));
        let p = t.window_points(Duration::from_secs(10));
        assert_eq!(p.len(), 10);
        assert!((p[2].ops_per_sec - 15.0).abs() < 1e-9, "{p:?}");
        for (s, point) in p.iter().enumerate() {
            let want = 100.0 * (s as f64 + 1.0);
            assert!((point.p99_us - want).abs() <= want * 0.01, "{s}: {p:?}");
        }
    }

    #[test]
    fn a_window_is_cut_into_whole_seconds_and_a_short_tail_joins_the_last() {
        let start = Instant::now();
        let t = Timeline::new(start, Duration::from_secs(1));
        let at = |ms: u64| start + Duration::from_millis(ms);
        t.record(at(100), 100, Duration::from_micros(100));
        t.record(at(1_500), 200, Duration::from_micros(300));
        // 30 ms past the second second: folded into it.
        t.record(at(2_010), 10, Duration::from_micros(5_000));
        let p = t.window_points(Duration::from_millis(2_030));
        assert_eq!(p.len(), 2);
        assert_eq!(p[0].at_s, 0.0);
        assert!((p[0].ops_per_sec - 100.0).abs() < 1e-9);
        assert_eq!(p[1].at_s, 1.0);
        // 210 ops over the last 1.03 s.
        assert!((p[1].ops_per_sec - 210.0 / 1.03).abs() < 1e-6, "{p:?}");
        assert!(p[1].p99_us >= 4_990.0, "{p:?}");
        // A tail of 0.7 s stands alone, its rate over its own length.
        let p = t.window_points(Duration::from_millis(2_700));
        assert_eq!(p.len(), 3);
        assert!((p[2].ops_per_sec - 10.0 / 0.7).abs() < 1e-6, "{p:?}");
        // A quiet second shows as zero.
        let p = t.window_points(Duration::from_millis(4_000));
        assert_eq!(p.len(), 4);
        assert_eq!(p[3].ops_per_sec, 0.0);
        assert!(t.window_points(Duration::ZERO).is_empty());
    }
}
