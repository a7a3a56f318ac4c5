//! The crash run's chart: throughput and p99 over time, one pair of panels
//! per crash run, each kill a vertical line and the time until the clients
//! resumed shaded.
//!
//! What must hold: every kill of the summary is drawn; the chart is drawn
//! from the report alone (so `loadgen plot` redraws it from `--json`).

use super::report::CrashSummary;
use plotters::prelude::*;

const WIDTH: u32 = 1100;
const PANEL_HEIGHT: u32 = 260;
const FONT: &str = "sans-serif";
const KILL: RGBColor = RGBColor(213, 94, 0);
const LINE: RGBColor = RGBColor(0, 114, 178);

/// The SVG text of the crash chart.
pub fn svg(runs: &[CrashSummary]) -> Result<String, String> {
    if runs.is_empty() {
        return Err("no crash runs in the report".to_string());
    }
    let mut out = String::new();
    {
        let height = 60 + PANEL_HEIGHT * 2 * runs.len() as u32;
        let root = SVGBackend::with_string(&mut out, (WIDTH, height)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let (title, body) = root.split_vertically(60);
        title
            .titled(
                "ringkv under kills: throughput and p99 over time (vertical lines: SIGKILL; shaded: until clients resumed)",
                (FONT, 18),
            )
            .map_err(|e| e.to_string())?;
        for (run, area) in runs.iter().zip(body.split_evenly((runs.len(), 1))) {
            let (top, bottom) = area.split_vertically(PANEL_HEIGHT);
            draw_panel(
                &top,
                run,
                "throughput, ops/s",
                crate::plot::human_count,
                |p| p.ops_per_sec,
            )?;
            draw_panel(&bottom, run, "batch p99", crate::plot::human_us, |p| {
                p.p99_us
            })?;
        }
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(out)
}

fn draw_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    run: &CrashSummary,
    what: &str,
    tick_label: fn(f64) -> String,
    value: impl Fn(&super::timeline::TimelinePoint) -> f64,
) -> Result<(), String> {
    let e = |x: &dyn std::fmt::Display| x.to_string();
    let end = run.timeline.last().map_or(1.0, |p| p.at_s).max(1.0);
    let top = run
        .timeline
        .iter()
        .map(&value)
        .fold(0.0f64, f64::max)
        .max(1.0)
        * 1.1;
    let mut chart = ChartBuilder::on(area)
        .caption(
            format!(
                "[{} {} {}] {}: {} (acknowledged {}, lost {})",
                run.device,
                run.durability,
                run.tier,
                run.workload,
                what,
                run.acknowledged,
                run.lost
            ),
            (FONT, 15),
        )
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..end, 0.0..top)
        .map_err(|x| e(&x))?;
    chart
        .configure_mesh()
        .x_desc("time since start")
        .x_label_formatter(&|v| crate::plot::human_us(*v * 1e6))
        .y_label_formatter(&|v| tick_label(*v))
        .x_labels(12)
        .y_labels(5)
        .draw()
        .map_err(|x| e(&x))?;
    for c in &run.crashes {
        let resumed = c.kill_at_s + (c.ready_ms + c.audit.audit_ms) / 1e3;
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(c.kill_at_s, 0.0), (resumed, top)],
                KILL.mix(0.15).filled(),
            )))
            .map_err(|x| e(&x))?;
        chart
            .draw_series(LineSeries::new(
                [(c.kill_at_s, 0.0), (c.kill_at_s, top)],
                KILL.stroke_width(2),
            ))
            .map_err(|x| e(&x))?;
    }
    chart
        .draw_series(LineSeries::new(
            run.timeline.iter().map(|p| (p.at_s, value(p))),
            LINE.stroke_width(2),
        ))
        .map_err(|x| e(&x))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kill_is_drawn() {
        let mut run = crate::crash::report::tests::sample(0);
        run.timeline = (0..20)
            .map(|i| crate::crash::timeline::TimelinePoint {
                at_s: i as f64 * 0.25,
                ops_per_sec: 1000.0 + i as f64,
                p99_us: 500.0,
            })
            .collect();
        let mut second = run.crashes[0].clone();
        second.kill_at_s = 3.5;
        run.crashes.push(second);
        let text = svg(&[run]).expect("draws");
        // One kill line per panel and kill, in the kill colour.
        let kill_lines = text.matches("stroke=\"#D55E00\"").count();
        assert!(kill_lines >= 4, "{kill_lines} kill lines\n{text}");
        assert!(roxmltree::Document::parse(&text).is_ok());
        assert!(svg(&[]).is_err());
    }

    /// The p99 panel's axis is in time units: 1.5 s, not "1.5M" (µs);
    /// the throughput panel keeps plain counts; the time axis reads 10 s.
    #[test]
    fn the_latency_axis_reads_in_time_units() {
        let mut run = crate::crash::report::tests::sample(0);
        run.timeline = (0..20)
            .map(|i| crate::crash::timeline::TimelinePoint {
                at_s: i as f64 * 2.0,
                ops_per_sec: 2_000_000.0,
                p99_us: if i == 10 { 1_500_000.0 } else { 800.0 },
            })
            .collect();
        let text = svg(&[run]).expect("draws");
        let doc = roxmltree::Document::parse(&text).expect("xml");
        let labels: Vec<&str> = doc
            .descendants()
            .filter(|n| n.has_tag_name("text"))
            .filter_map(|n| n.text())
            .map(str::trim)
            .collect();
        let p99_panel = labels
            .iter()
            .position(|l| l.contains("batch p99"))
            .expect("the p99 panel's caption");
        let (throughput, p99) = labels.split_at(p99_panel);
        assert!(p99.contains(&"1.5 s"), "{p99:?}");
        assert!(p99.contains(&"500 ms"), "{p99:?}");
        assert!(!p99.iter().any(|l| l.ends_with('M')), "{p99:?}");
        // Throughput ticks stay counts.
        assert!(throughput.contains(&"2M"), "{throughput:?}");
        // The time axis is in seconds too (0 to 38 s), not "10.0".
        assert!(p99.contains(&"10 s"), "{p99:?}");
        assert!(!p99.iter().any(|l| l.ends_with(".0")), "{p99:?}");
    }
}
