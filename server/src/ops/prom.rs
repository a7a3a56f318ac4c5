//! Prometheus text exposition (format 0.0.4) writing: metric families with
//! `# HELP` / `# TYPE` once each and all samples of a family together, label
//! values escaped, and the export of the engine's histograms as buckets.
//!
//! What must hold: whatever order the caller adds samples in, the output
//! groups each family's samples under its one HELP/TYPE header, and bucket
//! counts are cumulative and end with `le="+Inf"` equal to `_count`.

use engine::histogram::HistogramSnapshot;
use std::fmt::Write as _;

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

/// Upper bounds, in seconds, of the buckets every latency histogram is
/// exported with (the engine's histograms keep finer buckets internally).
pub const LATENCY_BOUNDS_S: [f64; 19] = [
    10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3,
    250e-3, 500e-3, 1.0, 2.5, 5.0, 10.0,
];

/// Number of power-of-two buckets (1, 2, 4, ... 2^30) sizes are exported with.
pub const SIZE_BUCKETS: u32 = 31;

/// A latency histogram recorded in units of `1 / units_per_second` seconds
/// (1e6 for microseconds, 1e9 for nanoseconds), as Prometheus buckets in
/// seconds.
pub fn latency_sample(h: &HistogramSnapshot, units_per_second: f64) -> HistogramSample {
    let bounds: Vec<(f64, u64)> = LATENCY_BOUNDS_S
        .iter()
        .map(|&s| (s, (s * units_per_second).round() as u64))
        .collect();
    sample(h, &bounds, units_per_second)
}

/// A histogram of sizes or counts, as Prometheus buckets at powers of two.
pub fn size_sample(h: &HistogramSnapshot) -> HistogramSample {
    let bounds: Vec<(f64, u64)> = (0..SIZE_BUCKETS)
        .map(|i| ((1u64 << i) as f64, 1u64 << i))
        .collect();
    sample(h, &bounds, 1.0)
}

/// `bounds`: (bound as exported, bound in the recorded unit).
fn sample(h: &HistogramSnapshot, bounds: &[(f64, u64)], scale: f64) -> HistogramSample {
    let buckets: Vec<(f64, u64)> = bounds
        .iter()
        .map(|&(shown, bound)| (shown, h.count_at_most(bound)))
        .collect();
    let last = buckets.last().map_or(0, |b| b.1);
    HistogramSample {
        buckets,
        sum: h.sum() as f64 / scale,
        // Buckets are read one by one while others record: never report a
        // count below the buckets.
        count: h.count().max(last),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use engine::histogram::AtomicHistogram;

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
        let h = AtomicHistogram::new();
        for us in [0, 5, 10, 11, 900, 3_000_000, u64::MAX / 4] {
            h.record(us);
        }
        let sample = latency_sample(&h.snapshot(), 1e6);
        assert_eq!(sample.count, 7);
        assert_eq!(sample.buckets[0], (10e-6, 3)); // 0, 5, 10
        assert_eq!(sample.buckets[6], (1e-3, 5)); // and 11, 900 (its bucket ends at 959)
        assert_eq!(sample.buckets[LATENCY_BOUNDS_S.len() - 1].1, 6); // and 3 s
        let mut p = PromText::new();
        p.histogram("lat_seconds", "L.", &[], &sample);
        let text = p.render();
        assert!(
            text.contains("lat_seconds_bucket{le=\"+Inf\"} 7\n"),
            "{text}"
        );
        assert!(text.contains("lat_seconds_count 7\n"));
        let sizes = size_sample(&h.snapshot());
        assert_eq!(sizes.buckets[0], (1.0, 1)); // 0
        assert_eq!(sizes.buckets[3], (8.0, 2)); // and 5
    }
}
