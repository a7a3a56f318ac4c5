//! The histogram of the engine and the server (latencies, group-commit
//! sizes, request times): lock-free, with log-scale buckets: 8 sub-buckets per
//! power of two (values below 16 are exact), so any recorded value lies
//! within 12.5% of the bounds of its bucket. Recording is three relaxed
//! atomic adds and a fetch_max; any thread may record and snapshot.
//!
//! What must hold: every u64 maps to exactly one bucket, bucket bounds are
//! contiguous and increasing, and a quantile is never below the true value's
//! bucket (it reports the bucket's upper bound, capped by the maximum seen).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

const SUB_BITS: u32 = 3;
const SUB_BUCKETS: usize = 1 << SUB_BITS;
/// Number of buckets: 8 exact ones below 8, then 8 per octave 2^3..2^63.
pub const HISTOGRAM_BUCKETS: usize = (64 - SUB_BITS as usize + 1) * SUB_BUCKETS;

/// The bucket a value falls in.
fn bucket_index(value: u64) -> usize {
    if value < SUB_BUCKETS as u64 {
        return value as usize;
    }
    let exponent = 63 - value.leading_zeros(); // >= SUB_BITS
    let sub = (value >> (exponent - SUB_BITS)) as usize & (SUB_BUCKETS - 1);
    (exponent - SUB_BITS + 1) as usize * SUB_BUCKETS + sub
}

/// Smallest value in bucket `index`.
fn bucket_low(index: usize) -> u64 {
    if index < SUB_BUCKETS {
        return index as u64;
    }
    let exponent = (index / SUB_BUCKETS) as u32 + SUB_BITS - 1;
    let sub = (index % SUB_BUCKETS) as u64;
    (SUB_BUCKETS as u64 + sub) << (exponent - SUB_BITS)
}

/// Largest value in bucket `index` (inclusive).
fn bucket_high(index: usize) -> u64 {
    if index + 1 == HISTOGRAM_BUCKETS {
        u64::MAX
    } else {
        bucket_low(index + 1) - 1
    }
}

/// Records nanosecond latencies (or any u64) from any thread without locks.
pub struct AtomicHistogram {
    counts: Box<[AtomicU64]>,
    sum: AtomicU64,
    max: AtomicU64,
}

impl std::fmt::Debug for AtomicHistogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("AtomicHistogram")
            .field(&self.snapshot())
            .finish()
    }
}

impl Default for AtomicHistogram {
    fn default() -> Self {
        Self::new()
    }
}

impl AtomicHistogram {
    pub fn new() -> Self {
        AtomicHistogram {
            counts: (0..HISTOGRAM_BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            sum: AtomicU64::new(0),
            max: AtomicU64::new(0),
        }
    }

    /// Records one value, in nanoseconds by convention.
    pub fn record(&self, ns: u64) {
        self.counts[bucket_index(ns)].fetch_add(1, Ordering::Relaxed);
        self.sum.fetch_add(ns, Ordering::Relaxed);
        self.max.fetch_max(ns, Ordering::Relaxed);
    }

    /// Records a duration (saturating at u64::MAX nanoseconds).
    pub fn record_duration(&self, duration: Duration) {
        self.record(u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX));
    }

    /// A copy of the counts. Taken bucket by bucket while others may record,
    /// so `sum` may include a value whose bucket count is not yet visible.
    pub fn snapshot(&self) -> HistogramSnapshot {
        HistogramSnapshot {
            counts: self
                .counts
                .iter()
                .map(|c| c.load(Ordering::Relaxed))
                .collect(),
            sum: self.sum.load(Ordering::Relaxed),
            max: self.max.load(Ordering::Relaxed),
        }
    }

    /// Shorthand for `snapshot().quantile(q)`.
    pub fn quantile(&self, q: f64) -> u64 {
        self.snapshot().quantile(q)
    }
}

/// A point-in-time copy of a [`AtomicHistogram`].
#[derive(Clone, PartialEq, Eq)]
pub struct HistogramSnapshot {
    counts: Vec<u64>,
    sum: u64,
    max: u64,
}

impl std::fmt::Debug for HistogramSnapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HistogramSnapshot")
            .field("count", &self.count())
            .field("mean", &self.mean())
            .field("p50", &self.quantile(0.5))
            .field("p99", &self.quantile(0.99))
            .field("max", &self.max)
            .finish()
    }
}

impl Default for HistogramSnapshot {
    fn default() -> Self {
        HistogramSnapshot {
            counts: vec![0; HISTOGRAM_BUCKETS],
            sum: 0,
            max: 0,
        }
    }
}

impl HistogramSnapshot {
    /// Number of recorded values.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Sum of recorded values (wrapping past u64::MAX).
    pub fn sum(&self) -> u64 {
        self.sum
    }

    /// Largest recorded value (0 when empty).
    pub fn max(&self) -> u64 {
        self.max
    }

    /// Mean of recorded values, 0.0 when empty.
    pub fn mean(&self) -> f64 {
        let count = self.count();
        if count == 0 {
            0.0
        } else {
            self.sum as f64 / count as f64
        }
    }

    /// The value at quantile `q` (0.0..=1.0): the upper bound of the bucket
    /// holding the ceil(q * count)-th smallest value, capped by `max`, so it
    /// overestimates by at most 12.5%. 0 when empty.
    pub fn quantile(&self, q: f64) -> u64 {
        assert!((0.0..=1.0).contains(&q), "quantile {q} outside 0..=1");
        let count = self.count();
        if count == 0 {
            return 0;
        }
        let rank = ((q * count as f64).ceil() as u64).clamp(1, count);
        let mut seen = 0u64;
        for (index, &n) in self.counts.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return bucket_high(index).min(self.max);
            }
        }
        self.max
    }

    /// Non-empty buckets as (lowest value, highest value, count), ascending.
    pub fn buckets(&self) -> impl Iterator<Item = (u64, u64, u64)> + '_ {
        self.counts
            .iter()
            .enumerate()
            .filter(|(_, &n)| n > 0)
            .map(|(i, &n)| (bucket_low(i), bucket_high(i), n))
    }

    /// Values known to be <= `bound` (whole buckets whose highest value is
    /// <= bound): a Prometheus `le` bucket, rounded down to bucket bounds.
    pub fn count_at_most(&self, bound: u64) -> u64 {
        self.counts
            .iter()
            .enumerate()
            .take_while(|(i, _)| bucket_high(*i) <= bound)
            .map(|(_, &n)| n)
            .sum()
    }

    /// Adds another snapshot's values to this one (e.g. across devices).
    pub fn merge(&mut self, other: &HistogramSnapshot) {
        for (mine, theirs) in self.counts.iter_mut().zip(&other.counts) {
            *mine += theirs;
        }
        self.sum = self.sum.wrapping_add(other.sum);
        self.max = self.max.max(other.max);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_contiguous_and_cover_u64() {
        assert_eq!(bucket_low(0), 0);
        for i in 1..HISTOGRAM_BUCKETS {
            assert_eq!(bucket_low(i), bucket_high(i - 1) + 1, "bucket {i}");
            assert!(bucket_low(i) <= bucket_high(i));
        }
        assert_eq!(bucket_high(HISTOGRAM_BUCKETS - 1), u64::MAX);
    }

    #[test]
    fn every_value_lands_in_its_bucket() {
        let mut values: Vec<u64> = (0..5000).collect();
        for shift in 0..64 {
            let p = 1u64 << shift;
            values.extend([p - 1, p, p + 1, p.saturating_mul(3) / 2]);
        }
        values.push(u64::MAX);
        for v in values {
            let i = bucket_index(v);
            assert!(
                bucket_low(i) <= v && v <= bucket_high(i),
                "value {v} bucket {i}"
            );
            // Relative width at most 1/8 above the exact range.
            if v >= 16 {
                let width = bucket_high(i) - bucket_low(i) + 1;
                assert!(width * 8 <= bucket_low(i), "value {v}: bucket too wide");
            }
        }
    }

    #[test]
    fn quantiles_bound_the_truth() {
        let h = AtomicHistogram::new();
        for v in 1..=10_000u64 {
            h.record(v * 1000);
        }
        let s = h.snapshot();
        assert_eq!(s.count(), 10_000);
        assert_eq!(s.max(), 10_000_000);
        assert_eq!(s.sum(), 1000 * 10_000 * 10_001 / 2);
        for (q, truth) in [(0.5, 5_000_000u64), (0.99, 9_900_000), (0.999, 9_990_000)] {
            let got = s.quantile(q);
            assert!(got >= truth, "q{q}: {got} < {truth}");
            assert!(
                got <= truth + truth / 8,
                "q{q}: {got} too far above {truth}"
            );
        }
        assert_eq!(s.quantile(1.0), 10_000_000);
        assert!(s.quantile(0.0) >= 1000 && s.quantile(0.0) <= 1000 + 1000 / 8);
        assert_eq!(AtomicHistogram::new().snapshot().quantile(0.5), 0);
    }

    #[test]
    fn le_counts_and_merge() {
        let h = AtomicHistogram::new();
        for v in [1u64, 2, 3, 100, 1000, 1_000_000] {
            h.record(v);
        }
        let mut s = h.snapshot();
        assert_eq!(s.count_at_most(3), 3);
        assert_eq!(s.count_at_most(u64::MAX), 6);
        assert_eq!(s.buckets().map(|(_, _, n)| n).sum::<u64>(), 6);
        let other = s.clone();
        s.merge(&other);
        assert_eq!(s.count(), 12);
        assert_eq!(s.max(), 1_000_000);
    }

    #[test]
    fn concurrent_recording_loses_nothing() {
        let h = std::sync::Arc::new(AtomicHistogram::new());
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let h = h.clone();
                std::thread::spawn(move || {
                    for v in 0..10_000u64 {
                        h.record(v * (t + 1));
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(h.snapshot().count(), 40_000);
    }
}
