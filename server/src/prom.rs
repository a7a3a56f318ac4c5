//! Prometheus text exposition (format 0.0.4) writing: metric families with
//! `# HELP` / `# TYPE` once each and all samples of a family together, label
//! values escaped. Also the server's own fixed-bucket latency histogram.
//!
//! What must hold: whatever order the caller adds samples in, the output
//! groups each family's samples under its one HELP/TYPE header, and bucket
//! counts are cumulative and end with `le="+Inf"` equal to `_count`.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

/// The kind of a metric family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

struct Family {
    name: String,
    help: &'static str,
    kind: Kind,
    samples: String,
}

/// Collects samples family by family and renders them in one go.
#[derive(Default)]
pub struct PromText {
    families: Vec<Family>,
}

impl std::fmt::Debug for PromText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PromText")
            .field("families", &self.families.len())
            .finish()
    }
}

/// A histogram as cumulative buckets: `(upper bound, count of samples <= it)`.
#[derive(Debug, Clone, PartialEq)]
pub struct HistogramSample {
    pub buckets: Vec<(f64, u64)>,
    pub sum: f64,
    pub count: u64,
}

impl PromText {
    pub fn new() -> PromText {
        PromText::default()
    }

    fn family(&mut self, name: &str, help: &'static str, kind: Kind) -> &mut String {
        let index = match self.families.iter().position(|f| f.name == name) {
            Some(i) => {
                assert_eq!(
                    self.families[i].kind, kind,
                    "metric {name} used with two kinds"
                );
                i
            }
            None => {
                self.families.push(Family {
                    name: name.to_string(),
                    help,
                    kind,
                    samples: String::new(),
                });
                self.families.len() - 1
            }
        };
        &mut self.families[index].samples
    }

    pub fn counter(&mut self, name: &str, help: &'static str, labels: &[(&str, &str)], value: u64) {
        let out = self.family(name, help, Kind::Counter);
        write_sample(out, name, labels, None, &value.to_string());
    }

    /// A counter whose value is not a whole number (e.g. seconds).
    pub fn counter_float(
        &mut self,
        name: &str,
        help: &'static str,
        labels: &[(&str, &str)],
        value: f64,
    ) {
        let out = self.family(name, help, Kind::Counter);
        write_sample(out, name, labels, None, &format_float(value));
    }

    pub fn gauge(&mut self, name: &str, help: &'static str, labels: &[(&str, &str)], value: f64) {
        let out = self.family(name, help, Kind::Gauge);
        write_sample(out, name, labels, None, &format_float(value));
    }

    pub fn histogram(
        &mut self,
        name: &str,
        help: &'static str,
        labels: &[(&str, &str)],
        sample: &HistogramSample,
    ) {
        let out = self.family(name, help, Kind::Histogram);
        let bucket_name = format!("{name}_bucket");
        let mut last = 0;
        for &(le, count) in &sample.buckets {
            assert!(count >= last, "histogram {name} buckets are not cumulative");
            last = count;
            write_sample(
                out,
                &bucket_name,
                labels,
                Some(&format_float(le)),
                &count.to_string(),
            );
        }
        assert!(
            sample.count >= last,
            "histogram {name} count below its last bucket"
        );
        write_sample(
            out,
            &bucket_name,
            labels,
            Some("+Inf"),
            &sample.count.to_string(),
        );
        write_sample(
            out,
            &format!("{name}_sum"),
            labels,
            None,
            &format_float(sample.sum),
        );
        write_sample(
            out,
            &format!("{name}_count"),
            labels,
            None,
            &sample.count.to_string(),
        );
    }

    /// The exposition text.
    pub fn render(&self) -> String {
        let mut out =
            String::with_capacity(self.families.iter().map(|f| f.samples.len() + 128).sum());
        for f in &self.families {
            let _ = writeln!(out, "# HELP {} {}", f.name, f.help);
            let _ = writeln!(out, "# TYPE {} {}", f.name, f.kind.as_str());
            out.push_str(&f.samples);
        }
        out
    }
}

fn write_sample(
    out: &mut String,
    name: &str,
    labels: &[(&str, &str)],
    le: Option<&str>,
    value: &str,
) {
    out.push_str(name);
    if !labels.is_empty() || le.is_some() {
        out.push('{');
        let mut first = true;
        let all = labels.iter().copied().chain(le.map(|v| ("le", v)));
        for (key, val) in all {
            if !first {
                out.push(',');
            }
            first = false;
            out.push_str(key);
            out.push_str("=\"");
            escape_label_value(out, val);
            out.push('"');
        }
        out.push('}');
    }
    out.push(' ');
    out.push_str(value);
    out.push('\n');
}

fn escape_label_value(out: &mut String, value: &str) {
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

fn format_float(v: f64) -> String {
    if v.is_nan() {
        "NaN".to_string()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.to_string()
    } else if v == v.trunc() && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

/// Number of finite buckets of [`LatencyHistogramUs`]: upper bounds 1 µs,
/// 2 µs, 4 µs, ... 2^(N-1) µs (about 67 s), then +Inf.
pub const LATENCY_BUCKET_COUNT: usize = 27;

/// A lock-free latency histogram in microseconds with power-of-two buckets.
/// Written by one shard thread, read by the metrics thread; relaxed atomics
/// are enough because readers only need eventually consistent totals.
#[derive(Debug)]
pub struct LatencyHistogramUs {
    buckets: [AtomicU64; LATENCY_BUCKET_COUNT + 1],
    sum_us: AtomicU64,
    count: AtomicU64,
}

impl Default for LatencyHistogramUs {
    fn default() -> Self {
        LatencyHistogramUs {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_us: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }
}

impl LatencyHistogramUs {
    /// Index of the smallest bucket whose upper bound is >= `us`.
    fn bucket_index(us: u64) -> usize {
        if us <= 1 {
            return 0;
        }
        // ceil(log2(us)) for us >= 2.
        let index = (64 - (us - 1).leading_zeros()) as usize;
        index.min(LATENCY_BUCKET_COUNT)
    }

    pub fn record_us(&self, us: u64) {
        self.buckets[Self::bucket_index(us)].fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(us, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// Adds this histogram's counts into `into` (bucket-wise, not cumulative).
    pub fn add_to(&self, into: &mut LatencyCounts) {
        for (slot, b) in into.buckets.iter_mut().zip(self.buckets.iter()) {
            *slot += b.load(Ordering::Relaxed);
        }
        into.sum_us += self.sum_us.load(Ordering::Relaxed);
        into.count += self.count.load(Ordering::Relaxed);
    }
}

/// A plain copy of one or more [`LatencyHistogramUs`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LatencyCounts {
    pub buckets: [u64; LATENCY_BUCKET_COUNT + 1],
    pub sum_us: u64,
    pub count: u64,
}

impl Default for LatencyCounts {
    fn default() -> Self {
        LatencyCounts {
            buckets: [0; LATENCY_BUCKET_COUNT + 1],
            sum_us: 0,
            count: 0,
        }
    }
}

impl LatencyCounts {
    /// Prometheus form, in seconds. The overflow bucket is only in `count`.
    pub fn to_sample_seconds(&self) -> HistogramSample {
        let mut cumulative = 0;
        let mut buckets = Vec::with_capacity(LATENCY_BUCKET_COUNT);
        for (i, n) in self.buckets[..LATENCY_BUCKET_COUNT].iter().enumerate() {
            cumulative += n;
            buckets.push(((1u64 << i) as f64 / 1e6, cumulative));
        }
        // Samples may be recorded between the loads above; never report a
        // count below the buckets.
        let count = self
            .count
            .max(cumulative + self.buckets[LATENCY_BUCKET_COUNT]);
        HistogramSample {
            buckets,
            sum: self.sum_us as f64 / 1e6,
            count,
        }
    }

    /// The smallest bucket bound (µs) at or below which `q` of the samples
    /// fall; 0 when empty. An upper estimate, within a factor of two.
    pub fn quantile_us(&self, q: f64) -> u64 {
        let total: u64 = self.buckets.iter().sum();
        if total == 0 {
            return 0;
        }
        let rank = ((total as f64) * q).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return 1u64 << i.min(LATENCY_BUCKET_COUNT);
            }
        }
        1u64 << LATENCY_BUCKET_COUNT
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_group_samples_whatever_the_order() {
        let mut p = PromText::new();
        p.counter("a_total", "A.", &[("shard", "0")], 1);
        p.gauge("b", "B.", &[], 2.5);
        p.counter("a_total", "A.", &[("shard", "1")], 3);
        let text = p.render();
        assert_eq!(
            text,
            "# HELP a_total A.\n# TYPE a_total counter\na_total{shard=\"0\"} 1\na_total{shard=\"1\"} 3\n\
             # HELP b B.\n# TYPE b gauge\nb 2.5\n"
        );
    }

    #[test]
    fn label_values_are_escaped() {
        let mut p = PromText::new();
        p.gauge("g", "G.", &[("device", "a\"b\\c\nd")], 1.0);
        assert!(p.render().contains("g{device=\"a\\\"b\\\\c\\nd\"} 1\n"));
    }

    #[test]
    fn histogram_buckets_are_cumulative_and_end_in_inf() {
        let h = LatencyHistogramUs::default();
        for us in [0, 1, 2, 3, 4, 5, 1000, u64::MAX / 4] {
            h.record_us(us);
        }
        let mut counts = LatencyCounts::default();
        h.add_to(&mut counts);
        assert_eq!(counts.count, 8);
        let sample = counts.to_sample_seconds();
        assert_eq!(sample.buckets[0], (1e-6, 2)); // 0 and 1
        assert_eq!(sample.buckets[1].1, 3); // 2
        assert_eq!(sample.buckets[2].1, 5); // 3, 4
        assert_eq!(sample.buckets[3].1, 6); // 5
        assert_eq!(sample.buckets[LATENCY_BUCKET_COUNT - 1].1, 7);
        assert_eq!(sample.count, 8);
        let mut p = PromText::new();
        p.histogram("lat_seconds", "L.", &[], &sample);
        let text = p.render();
        assert!(
            text.contains("lat_seconds_bucket{le=\"+Inf\"} 8\n"),
            "{text}"
        );
        assert!(text.contains("lat_seconds_count 8\n"));
        assert_eq!(counts.quantile_us(0.5), 4);
        assert_eq!(counts.quantile_us(0.0), 1);
    }

    #[test]
    fn bucket_index_is_ceil_log2() {
        assert_eq!(LatencyHistogramUs::bucket_index(0), 0);
        assert_eq!(LatencyHistogramUs::bucket_index(1), 0);
        assert_eq!(LatencyHistogramUs::bucket_index(2), 1);
        assert_eq!(LatencyHistogramUs::bucket_index(3), 2);
        assert_eq!(LatencyHistogramUs::bucket_index(1024), 10);
        assert_eq!(LatencyHistogramUs::bucket_index(1025), 11);
        assert_eq!(
            LatencyHistogramUs::bucket_index(u64::MAX),
            LATENCY_BUCKET_COUNT
        );
    }
}
