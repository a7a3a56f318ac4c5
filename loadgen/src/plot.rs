//! `--plot FILE.svg`: throughput per device class (grouped bars, one group
//! per operation) above latency percentiles (log scale, one line per device
//! class and operation). Drawn with plotters' SVG backend: no external
//! program, no font files (the browser renders the text).
//!
//! What must hold: only measured rows are drawn (unsupported rows are not);
//! an empty report is an error, not an empty picture.

use crate::cli::format_count;
use crate::report::{Report, ResultRow, Status};
use plotters::prelude::*;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PlotError {
    #[error("nothing to plot: the report has no measured results")]
    Empty,
    #[error("cannot draw {path}: {reason}")]
    Draw { path: PathBuf, reason: String },
}

/// Percentiles on the latency chart's x axis.
const PERCENTILES: [&str; 5] = ["p50", "p95", "p99", "p99.9", "max"];

/// Writes the chart of `report` to `path`.
pub fn plot(report: &Report, path: &Path) -> Result<(), PlotError> {
    let rows: Vec<&ResultRow> = report
        .results
        .iter()
        .filter(|r| r.status != Status::Unsupported && r.ops > 0)
        .collect();
    if rows.is_empty() {
        return Err(PlotError::Empty);
    }
    draw(report, &rows, path).map_err(|reason| PlotError::Draw {
        path: path.to_path_buf(),
        reason,
    })
}

fn group_label(r: &ResultRow, one_workload: bool, one_durability: bool) -> String {
    let mut s = if one_workload {
        r.operation.clone()
    } else {
        format!("{} {}", r.workload, r.operation)
    };
    if let Some(n) = r.items {
        s.push_str(&format!(" {}", format_count(n)));
    }
    if !one_durability {
        s.push_str(&format!(" ({})", r.durability));
    }
    s
}

fn draw(report: &Report, rows: &[&ResultRow], path: &Path) -> Result<(), String> {
    let e = |err: &dyn std::fmt::Display| err.to_string();
    let devices = crate::render::devices_in_order(report);
    let one_workload = rows.iter().all(|r| r.workload == rows[0].workload);
    let one_durability = rows.iter().all(|r| r.durability == rows[0].durability);
    let mut groups: Vec<String> = Vec::new();
    for r in rows {
        let g = group_label(r, one_workload, one_durability);
        if !groups.contains(&g) {
            groups.push(g);
        }
    }
    let find = |device: &str, group: &str| {
        rows.iter()
            .find(|r| r.device == device && group_label(r, one_workload, one_durability) == group)
    };

    let root = SVGBackend::new(path, (1200, 960)).into_drawing_area();
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let title = format!(
        "ringkv loadgen {} — {} — {} client tasks x batch {} — {}",
        report.loadgen_version,
        report.run.workload,
        report.run.threads,
        report.run.batch,
        report.started_at
    );
    let root = root.titled(&title, ("sans-serif", 18)).map_err(|x| e(&x))?;
    let (upper, lower) = root.split_vertically(440);

    // Throughput: one slot per (group, device) plus a gap slot between groups.
    // A segmented `0..n` range has n + 1 segments.
    let per_group = devices.len() + 1;
    let slots = groups.len() * per_group - 1;
    let max_kops = rows
        .iter()
        .map(|r| r.throughput_kops)
        .fold(0.0, f64::max)
        .max(1e-3);
    let mut chart = ChartBuilder::on(&upper)
        .caption(
            "Throughput, 1000 ops/s (higher is better)",
            ("sans-serif", 16),
        )
        .margin(12)
        .x_label_area_size(50)
        .y_label_area_size(70)
        .build_cartesian_2d((0..slots - 1).into_segmented(), 0.0..max_kops * 1.4)
        .map_err(|x| e(&x))?;
    let middle = devices.len() / 2;
    let group_names = groups.clone();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(slots + 1)
        .x_label_formatter(&|v| match v {
            SegmentValue::CenterOf(slot) if slot % per_group == middle => group_names
                .get(slot / per_group)
                .cloned()
                .unwrap_or_default(),
            _ => String::new(),
        })
        .y_desc("1000 ops/s")
        .draw()
        .map_err(|x| e(&x))?;
    for (d, device) in devices.iter().enumerate() {
        let color = Palette99::pick(d).to_rgba();
        let bars: Vec<Rectangle<(SegmentValue<usize>, f64)>> = groups
            .iter()
            .enumerate()
            .filter_map(|(g, group)| {
                find(device, group).map(|r| {
                    let slot = g * per_group + d;
                    Rectangle::new(
                        [
                            (SegmentValue::Exact(slot), 0.0),
                            (SegmentValue::Exact(slot + 1), r.throughput_kops),
                        ],
                        color.filled(),
                    )
                })
            })
            .collect();
        chart
            .draw_series(bars)
            .map_err(|x| e(&x))?
            .label(device.clone())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(|x| e(&x))?;

    // Latency percentiles, log scale.
    let values = |r: &ResultRow| {
        let l = r.latency_us;
        [l.p50, l.p95, l.p99, l.p999, l.max]
    };
    let all: Vec<f64> = rows
        .iter()
        .flat_map(|r| values(r))
        .filter(|v| *v > 0.0)
        .collect();
    let lo = all.iter().copied().fold(f64::INFINITY, f64::min).max(0.1) / 1.5;
    let hi = all.iter().copied().fold(0.0, f64::max).max(lo * 10.0) * 1.5;
    let mut chart = ChartBuilder::on(&lower)
        .caption(
            "Batch latency percentiles, µs (log scale, lower is better)",
            ("sans-serif", 16),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(
            (0..PERCENTILES.len() - 1).into_segmented(),
            (lo..hi).log_scale(),
        )
        .map_err(|x| e(&x))?;
    chart
        .configure_mesh()
        .x_labels(PERCENTILES.len() + 1)
        .x_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) => PERCENTILES
                .get(*i)
                .map(|s| s.to_string())
                .unwrap_or_default(),
            _ => String::new(),
        })
        .y_desc("µs")
        .draw()
        .map_err(|x| e(&x))?;
    for (d, device) in devices.iter().enumerate() {
        for (g, group) in groups.iter().enumerate() {
            let Some(r) = find(device, group) else {
                continue;
            };
            // Same hue as the device's bars; lighter for later operations.
            let color = shade(Palette99::pick(d).to_rgba(), g, groups.len());
            let points: Vec<(SegmentValue<usize>, f64)> = values(r)
                .iter()
                .enumerate()
                .map(|(i, v)| (SegmentValue::CenterOf(i), v.max(lo)))
                .collect();
            chart
                .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
                .map_err(|x| e(&x))?
                .label(format!("{device} {group}"))
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
                });
            chart
                .draw_series(
                    points
                        .into_iter()
                        .map(|p| Circle::new(p, 3, color.filled())),
                )
                .map_err(|x| e(&x))?;
        }
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(|x| e(&x))?;
    root.present().map_err(|x| e(&x))?;
    Ok(())
}

/// `base` blended towards white by up to 60% as `index` goes from 0 to `count`.
fn shade(base: RGBAColor, index: usize, count: usize) -> RGBAColor {
    let t = if count <= 1 {
        0.0
    } else {
        0.6 * index as f64 / (count - 1) as f64
    };
    let lift = |c: u8| (f64::from(c) + (255.0 - f64::from(c)) * t).round() as u8;
    RGBAColor(lift(base.0), lift(base.1), lift(base.2), base.3)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::tests::sample_report;

    #[test]
    fn writes_an_svg_with_every_device_and_operation() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("chart.svg");
        let report = sample_report(&["sas", "gpssd", "nvme"], &["put", "get"], 1.0);
        plot(&report, &path).expect("plot");
        if let Ok(keep) = std::env::var("LOADGEN_KEEP_SVG") {
            std::fs::copy(&path, keep).expect("copy");
        }
        let svg = std::fs::read_to_string(&path).expect("read");
        assert!(svg.starts_with("<svg"), "{}", &svg[..80.min(svg.len())]);
        assert!(svg.trim_end().ends_with("</svg>"));
        for text in ["sas", "gpssd", "nvme", "put", "get", "p99.9", "Throughput"] {
            assert!(svg.contains(text), "svg lacks {text}");
        }
        // Six bars: one per (device, operation).
        let bars = svg.matches("<rect").count();
        assert!(bars >= 6, "{bars} rects");
    }

    #[test]
    fn an_empty_report_is_refused() {
        let mut report = sample_report(&["nvme"], &["put"], 1.0);
        report.results[0].status = Status::Unsupported;
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(matches!(
            plot(&report, &dir.path().join("x.svg")),
            Err(PlotError::Empty)
        ));
    }
}
