//! Latency histograms (HdrHistogram, nanoseconds, 3 significant digits) and the
//! summary every result carries.
//!
//! What must hold: percentiles are computed from the merged histogram of all
//! client tasks (never averaged across tasks); values above the trackable
//! maximum are clamped into the top bucket and counted, never dropped.

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Largest latency tracked exactly: one hour.
const TRACKABLE_MAX_NS: u64 = 3_600 * 1_000_000_000;
const SIGNIFICANT_DIGITS: u8 = 3;

/// Latencies of one operation kind, in nanoseconds.
#[derive(Debug, Clone)]
pub struct LatencyHistogram {
    inner: Histogram<u64>,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        LatencyHistogram::new()
    }
}

impl LatencyHistogram {
    pub fn new() -> LatencyHistogram {
        let inner = Histogram::new_with_bounds(1, TRACKABLE_MAX_NS, SIGNIFICANT_DIGITS)
            .expect("constant histogram bounds are valid");
        LatencyHistogram { inner }
    }

    pub fn record(&mut self, latency: Duration) {
        let ns = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX).max(1);
        self.inner.saturating_record(ns);
    }

    pub fn count(&self) -> u64 {
        self.inner.len()
    }

    pub fn merge(&mut self, other: &LatencyHistogram) {
        // Both histograms were built with the same bounds, so addition cannot fail.
        self.inner
            .add(&other.inner)
            .expect("histograms with identical bounds always add");
    }

    pub fn summary(&self) -> LatencySummary {
        if self.inner.is_empty() {
            return LatencySummary::default();
        }
        let us = |ns: u64| ns as f64 / 1_000.0;
        LatencySummary {
            avg: round1(self.inner.mean() / 1_000.0),
            p50: us(self.inner.value_at_quantile(0.50)),
            p95: us(self.inner.value_at_quantile(0.95)),
            p99: us(self.inner.value_at_quantile(0.99)),
            p999: us(self.inner.value_at_quantile(0.999)),
            max: us(self.inner.max()),
        }
    }
}

/// Percentiles of the stored latency spectrum: dense in the tail, where
/// each "nine" of a percentile plot gets the same width. The maximum is
/// stored as percentile 100.
pub const SPECTRUM_PERCENTILES: [f64; 11] = [
    50.0, 75.0, 90.0, 95.0, 99.0, 99.5, 99.9, 99.95, 99.99, 99.999, 100.0,
];

/// One point of a latency percentile spectrum.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SpectrumPoint {
    /// Percentile, 0..=100 (100 = the maximum).
    pub percentile: f64,
    /// Latency at that percentile, µs.
    pub us: f64,
}

impl LatencyHistogram {
    /// The latency at each of [`SPECTRUM_PERCENTILES`], from the full
    /// histogram (empty when nothing was recorded).
    pub fn spectrum(&self) -> Vec<SpectrumPoint> {
        if self.inner.is_empty() {
            return Vec::new();
        }
        SPECTRUM_PERCENTILES
            .iter()
            .map(|&p| SpectrumPoint {
                percentile: p,
                us: if p >= 100.0 {
                    self.inner.max()
                } else {
                    self.inner.value_at_quantile(p / 100.0)
                } as f64
                    / 1_000.0,
            })
            .collect()
    }
}

fn round1(v: f64) -> f64 {
    (v * 10.0).round() / 10.0
}

/// Latency of one batch (or one step, see docs/loadgen.md), in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct LatencySummary {
    pub avg: f64,
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
}

impl LatencySummary {
    /// The percentile fields with their report labels, in order.
    pub fn labelled(&self) -> [(&'static str, f64); 6] {
        [
            ("avg", self.avg),
            ("p50", self.p50),
            ("p95", self.p95),
            ("p99", self.p99),
            ("p99.9", self.p999),
            ("max", self.max),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_of_known_values() {
        let mut h = LatencyHistogram::new();
        for us in 1..=1000u64 {
            h.record(Duration::from_micros(us));
        }
        let s = h.summary();
        assert_eq!(h.count(), 1000);
        assert!((s.avg - 500.5).abs() < 1.0, "{s:?}");
        assert!((s.p50 - 500.0).abs() <= 1.0, "{s:?}");
        assert!((s.p95 - 950.0).abs() <= 1.0, "{s:?}");
        assert!((s.p99 - 990.0).abs() <= 1.0, "{s:?}");
        assert!((s.p999 - 999.0).abs() <= 1.0, "{s:?}");
        assert!((s.max - 1000.0).abs() <= 1.0, "{s:?}");
    }

    #[test]
    fn merge_combines_counts_and_tails() {
        let mut a = LatencyHistogram::new();
        let mut b = LatencyHistogram::new();
        for _ in 0..99 {
            a.record(Duration::from_micros(10));
        }
        b.record(Duration::from_millis(50));
        a.merge(&b);
        let s = a.summary();
        assert_eq!(a.count(), 100);
        assert!((s.p50 - 10.0).abs() < 0.1);
        assert!((s.max - 50_000.0).abs() < 50.0, "{s:?}");
    }

    #[test]
    fn empty_histogram_summarises_to_zero_and_huge_values_clamp() {
        assert_eq!(LatencyHistogram::new().summary(), LatencySummary::default());
        let mut h = LatencyHistogram::new();
        h.record(Duration::from_secs(10 * 3600));
        assert_eq!(h.count(), 1);
        assert!(h.summary().max >= 3_599_000_000.0);
    }
}
