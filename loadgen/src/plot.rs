//! Charts: one kind per workload, drawn with plotters' SVG backend, and a
//! PNG made from the same SVG with resvg when the file name ends in `.png`.
//!
//! - put/get and YCSB ([`ChartKind::Operations`]): throughput per operation
//!   (bars, value printed) above a latency percentile spectrum on a "nines"
//!   axis (50, 90, 99, 99.9, 99.99, max: each nine the same width), one
//!   colour per operation and one line style per durability or device.
//! - sweep ([`ChartKind::Sweep`]): time vs N, both logarithmic, write and
//!   read side by side, one colour per device class; the document's MapDB and
//!   ChronicleMap figures drawn thinner and labelled "published".
//! - tiered: GET p99 against cost per month, one point per layout and
//!   read distribution (one colour per layout, one marker per
//!   distribution), each point labelled.
//! - `loadgen compare A.json B.json --plot`: A and B side by side per
//!   operation (throughput and p99 latency).
//!
//! Readable by default: the Okabe-Ito colour-blind-safe palette, human units
//! on every axis (`100K`, `250 µs`, `1.2 s`), a few labelled ticks only, and
//! the machine, profiles and durabilities in a subtitle.
//!
//! What must hold: only measured rows are drawn (unsupported rows are not);
//! an empty report is an error, not an empty picture; the SVG is well-formed
//! XML whatever the labels contain (plotters escapes text).

use crate::cli::format_count;
use crate::report::{Report, ResultRow, Status};
use plotters::coord::types::RangedCoordf64;
use plotters::element::DashedPathElement;
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

/// Which chart a report gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChartKind {
    /// put/get and YCSB: throughput bars and a latency spectrum.
    Operations,
    /// The MapDB/ChronicleMap sweep: time vs N.
    Sweep,
}

/// The chart kind for a report: the sweep's when every row is a sweep row.
pub fn kind_of(report: &Report) -> ChartKind {
    if !report.results.is_empty() && report.results.iter().all(|r| r.workload == "sweep") {
        ChartKind::Sweep
    } else {
        ChartKind::Operations
    }
}

/// Okabe-Ito's eight hues first: they stay distinct with the common
/// colour-vision deficiencies (yellow last of them: weak on white). Then
/// four darker ones from Paul Tol's palettes, so twelve series (YCSB's
/// nine operations and more) each get a colour of their own.
pub const PALETTE: [RGBColor; 12] = [
    RGBColor(0, 114, 178),   // blue
    RGBColor(230, 159, 0),   // orange
    RGBColor(0, 158, 115),   // bluish green
    RGBColor(213, 94, 0),    // vermillion
    RGBColor(204, 121, 167), // reddish purple
    RGBColor(86, 180, 233),  // sky blue
    RGBColor(0, 0, 0),       // black
    RGBColor(240, 228, 66),  // yellow
    RGBColor(136, 34, 85),   // wine
    RGBColor(153, 153, 51),  // olive
    RGBColor(51, 34, 136),   // indigo
    RGBColor(119, 119, 119), // grey
];

/// The colour of series `i`; past twelve series the colours repeat.
fn colour(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

const FONT: &str = "sans-serif";
const WIDTH: u32 = 1200;

/// `1234567` -> "1.2M", `250000` -> "250K".
pub fn human_count(v: f64) -> String {
    let a = v.abs();
    let (x, unit) = if a >= 1e9 {
        (v / 1e9, "G")
    } else if a >= 1e6 {
        (v / 1e6, "M")
    } else if a >= 1e3 {
        (v / 1e3, "K")
    } else {
        (v, "")
    };
    trim(x, unit)
}

/// Microseconds in a human unit: "850 ns", "250 µs", "12 ms", "1.2 s";
/// zero is "0" (an axis origin has no unit worth reading).
pub fn human_us(us: f64) -> String {
    let (x, unit) = if us == 0.0 {
        (0.0, "")
    } else if us >= 1e6 {
        (us / 1e6, " s")
    } else if us >= 1e3 {
        (us / 1e3, " ms")
    } else if us >= 1.0 {
        (us, " µs")
    } else {
        (us * 1e3, " ns")
    };
    trim(x, unit)
}

/// One decimal below 10, none above; no trailing ".0".
fn trim(x: f64, unit: &str) -> String {
    let text = if x.abs() >= 10.0 || x.fract() == 0.0 {
        format!("{x:.0}")
    } else {
        format!("{x:.1}")
    };
    format!("{}{unit}", text.trim_end_matches(".0"))
}

/// The "nines" position of a percentile: 50 -> 0.30, 90 -> 1, 99 -> 2, ...
fn nines(percentile: f64) -> f64 {
    let p = percentile.clamp(0.0, 99.9999);
    -(1.0 - p / 100.0).log10()
}

/// Ticks of the nines axis and where the maximum is drawn.
const NINES_TICKS: [(f64, &str); 5] = [
    (50.0, "50%"),
    (90.0, "90%"),
    (99.0, "99%"),
    (99.9, "99.9%"),
    (99.99, "99.99%"),
];
const MAX_AT: f64 = 5.0;

/// Length in pixels of a legend's line sample.
const LEGEND_SAMPLE: i32 = 24;

/// Line styles of the latency lines: (dash, gap) in pixels; (0, 0) = solid.
/// A series' legend sample at `(x, y)`, drawn as the series is: solid
/// (`dash` 0), or as separate dashes of the same length and gap.
fn legend_sample<DB: DrawingBackend>(
    (x, y): (i32, i32),
    dash: u32,
    gap: u32,
    style: ShapeStyle,
) -> DynElement<'static, DB, (i32, i32)> {
    let sample = vec![(x, y), (x + LEGEND_SAMPLE, y)];
    if dash == 0 {
        PathElement::new(sample, style).into_dyn()
    } else {
        DashedPathElement::new(sample, dash, gap, style).into_dyn()
    }
}

const DASHES: [(u32, u32); 6] = [(0, 0), (9, 5), (2, 4), (14, 4), (5, 9), (1, 2)];

/// Writes the chart of `report` to `path` (SVG, or PNG for a `.png` name).
pub fn plot(report: &Report, path: &Path) -> Result<(), PlotError> {
    let svg = svg_of(report)?;
    write(path, &svg)
}

/// The chart of `report` as SVG text.
pub fn svg_of(report: &Report) -> Result<String, PlotError> {
    if !report.crash.is_empty() {
        return crate::crash::chart::svg(&report.crash).map_err(|reason| PlotError::Draw {
            path: PathBuf::from("(svg)"),
            reason,
        });
    }
    if !report.tiered.is_empty() {
        let mut svg = String::new();
        draw_tiered(report, &mut svg).map_err(|reason| PlotError::Draw {
            path: PathBuf::from("(svg)"),
            reason,
        })?;
        return Ok(svg);
    }
    let rows: Vec<&ResultRow> = report
        .results
        .iter()
        .filter(|r| r.status != Status::Unsupported && r.ops > 0)
        .collect();
    if rows.is_empty() {
        return Err(PlotError::Empty);
    }
    let mut svg = String::new();
    let drawn = match kind_of(report) {
        ChartKind::Sweep => draw_sweep(report, &rows, &mut svg),
        ChartKind::Operations => draw_operations(report, &rows, &mut svg),
    };
    drawn.map_err(|reason| PlotError::Draw {
        path: PathBuf::from("(svg)"),
        reason,
    })?;
    Ok(svg)
}

/// `loadgen compare BASE NEW --plot`: both reports side by side.
pub fn plot_compare(
    base: &Report,
    base_name: &str,
    new: &Report,
    new_name: &str,
    path: &Path,
) -> Result<(), PlotError> {
    let mut svg = String::new();
    draw_compare(base, base_name, new, new_name, &mut svg).map_err(|reason| PlotError::Draw {
        path: path.to_path_buf(),
        reason,
    })?;
    write(path, &svg)
}

fn write(path: &Path, svg: &str) -> Result<(), PlotError> {
    let err = |reason: String| PlotError::Draw {
        path: path.to_path_buf(),
        reason,
    };
    let png = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("png"));
    if png {
        let bytes = png_of(svg).map_err(err)?;
        std::fs::write(path, bytes).map_err(|e| err(e.to_string()))
    } else {
        std::fs::write(path, svg).map_err(|e| err(e.to_string()))
    }
}

/// Renders SVG text to PNG bytes with resvg, using the system's fonts.
pub fn png_of(svg: &str) -> Result<Vec<u8>, String> {
    use resvg::{tiny_skia, usvg};
    let mut options = usvg::Options::default();
    options.fontdb_mut().load_system_fonts();
    if options.fontdb.is_empty() {
        return Err(
            "no system fonts found, so the PNG would have no text (install a font, e.g. Debian's fonts-dejavu-core, or write .svg)"
                .to_string(),
        );
    }
    // The charts ask for "sans-serif": map it to a sans face this system has.
    let families: Vec<String> = options
        .fontdb
        .faces()
        .flat_map(|f| f.families.iter().map(|(name, _)| name.clone()))
        .collect();
    let preferred = [
        "DejaVu Sans",
        "Liberation Sans",
        "Noto Sans",
        "Arial",
        "Helvetica",
    ];
    let family = preferred
        .iter()
        .find(|p| families.iter().any(|f| f == *p))
        .map(|p| p.to_string())
        .or_else(|| families.first().cloned());
    if let Some(family) = family {
        options.fontdb_mut().set_sans_serif_family(family.clone());
        options.font_family = family;
    }
    let tree = usvg::Tree::from_str(svg, &options).map_err(|e| format!("SVG not readable: {e}"))?;
    let size = tree.size().to_int_size();
    let mut pixmap = tiny_skia::Pixmap::new(size.width(), size.height())
        .ok_or_else(|| "empty picture".to_string())?;
    pixmap.fill(tiny_skia::Color::WHITE);
    resvg::render(&tree, tiny_skia::Transform::default(), &mut pixmap.as_mut());
    pixmap
        .encode_png()
        .map_err(|e| format!("PNG encoding: {e}"))
}

/// "2 CPUs (model) — profiles nvme — durability sync".
fn subtitle(report: &Report, rows: &[&ResultRow]) -> String {
    let mut profiles: Vec<&str> = Vec::new();
    let mut durabilities: Vec<&str> = Vec::new();
    for r in rows {
        if !profiles.contains(&r.device.as_str()) {
            profiles.push(&r.device);
        }
        if !durabilities.contains(&r.durability.as_str()) {
            durabilities.push(&r.durability);
        }
    }
    let m = &report.machine;
    format!(
        "{} CPUs ({}), {:.0} GiB — profile {} — durability {} — target {} — {}",
        m.cpus,
        m.cpu_model,
        m.memory_bytes as f64 / (1u64 << 30) as f64,
        profiles.join(", "),
        durabilities.join(", "),
        report.run.target,
        report.started_at
    )
}

/// Title and subtitle; returns the area below them.
fn header<'a>(
    root: &DrawingArea<SVGBackend<'a>, plotters::coord::Shift>,
    title: &str,
    subtitle: &str,
) -> Result<DrawingArea<SVGBackend<'a>, plotters::coord::Shift>, String> {
    let e = |x: &dyn std::fmt::Display| x.to_string();
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let (top, rest) = root.split_vertically(64);
    top.draw(&Text::new(
        title.to_string(),
        (16, 10),
        (FONT, 22).into_font().color(&BLACK),
    ))
    .map_err(|x| e(&x))?;
    top.draw(&Text::new(
        subtitle.to_string(),
        (16, 38),
        (FONT, 14).into_font().color(&RGBColor(80, 80, 80)),
    ))
    .map_err(|x| e(&x))?;
    Ok(rest)
}

/// Series of the operations chart: one per (operation, style key).
struct OpSeries<'r> {
    row: &'r ResultRow,
    /// Colour index: the operation's.
    colour: usize,
    /// Line style index: the durability's or device's.
    style: usize,
    label: String,
}

fn distinct<'r>(rows: &[&'r ResultRow], f: impl Fn(&'r ResultRow) -> String) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for r in rows {
        let v = f(r);
        if !out.contains(&v) {
            out.push(v);
        }
    }
    out
}

fn op_name(r: &ResultRow) -> String {
    let mut s = if r.workload == "putget" || r.workload == "sweep" {
        r.operation.clone()
    } else {
        format!("{} {}", r.workload, r.operation)
    };
    if let Some(n) = r.items {
        if r.workload == "sweep" {
            s.push_str(&format!(" {}", format_count(n)));
        }
    }
    s
}

fn draw_operations(report: &Report, rows: &[&ResultRow], out: &mut String) -> Result<(), String> {
    let e = |x: &dyn std::fmt::Display| x.to_string();
    // The load phase has no spectrum worth showing next to the measured ones.
    let rows: Vec<&ResultRow> = rows
        .iter()
        .copied()
        .filter(|r| r.operation != "load" || rows.iter().all(|x| x.operation == "load"))
        .collect();
    let ops = distinct(&rows, op_name);
    let devices = distinct(&rows, |r| r.device.clone());
    let durabilities = distinct(&rows, |r| r.durability.clone());
    // Line style per durability, or per device when there is one
    // durability, or per (device, durability) when both vary.
    let style_key = |r: &ResultRow| -> String {
        match (devices.len() > 1, durabilities.len() > 1) {
            (true, true) => format!("{} {}", r.device, r.durability),
            (true, false) => r.device.clone(),
            _ => format!("{} ({})", r.durability, r.storage),
        }
    };
    let styles = distinct(&rows, style_key);
    let series: Vec<OpSeries> = rows
        .iter()
        .map(|r| {
            let key = style_key(r);
            let style = styles.iter().position(|s| *s == key).unwrap_or(0);
            OpSeries {
                row: r,
                colour: ops.iter().position(|o| *o == op_name(r)).unwrap_or(0),
                style,
                label: format!("{} — {key}", op_name(r)),
            }
        })
        .collect();

    let timed = series.iter().any(|s| !s.row.timeline.is_empty());
    let height = if timed {
        1000 + 2 * TIMELINE_HEIGHT
    } else {
        1000
    };
    let root = SVGBackend::with_string(out, (WIDTH, height)).into_drawing_area();
    let title = format!(
        "ringkv {} — {} client tasks × batch {}",
        report.run.workload, report.run.threads, report.run.batch
    );
    let area = header(&root, &title, &subtitle(report, &rows))?;
    let (upper, lower) = area.split_vertically(400);
    let (lower, timeline_area) = lower.split_vertically(1000 - 64 - 400);

    // Throughput: one bar per series, grouped by operation.
    let per_group = styles.len();
    let slots = ops.len() * (per_group + 1);
    let max_ops = rows
        .iter()
        .map(|r| r.ops_per_sec)
        .fold(0.0, f64::max)
        .max(1.0);
    let mut chart = ChartBuilder::on(&upper)
        .caption("Throughput, operations/s (higher is better)", (FONT, 18))
        .margin(14)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..slots as f64, 0.0..max_ops * 1.25)
        .map_err(|x| e(&x))?;
    let group_names = ops.clone();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(slots * 2 + 1)
        .x_label_formatter(&move |v| {
            // A label only at each group's centre.
            let group_width = (per_group + 1) as f64;
            let g = (v / group_width).floor();
            let centre = g * group_width + per_group as f64 / 2.0;
            if (v - centre).abs() < 0.26 {
                group_names.get(g as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .y_labels(6)
        .y_label_formatter(&|v| human_count(*v))
        .y_desc("operations/s")
        .light_line_style(WHITE)
        .draw()
        .map_err(|x| e(&x))?;
    for s in &series {
        let g = s.colour as f64 * (per_group + 1) as f64;
        let x0 = g + s.style as f64 + 0.1;
        let x1 = x0 + 0.8;
        let y = s.row.ops_per_sec;
        let c = colour(s.colour);
        // Lighter bars for later styles, so neighbours stay apart.
        let fill = c
            .mix(1.0 - 0.5 * s.style as f64 / per_group.max(1) as f64)
            .filled();
        chart
            .draw_series(std::iter::once(Rectangle::new([(x0, 0.0), (x1, y)], fill)))
            .map_err(|x| e(&x))?;
        chart
            .draw_series(std::iter::once(Text::new(
                human_count(y),
                ((x0 + x1) / 2.0 - 0.3, y + max_ops * 0.03),
                (FONT, 13).into_font(),
            )))
            .map_err(|x| e(&x))?;
    }
    if per_group > 1 {
        let order = styles.join(", ");
        chart
            .draw_series(std::iter::once(Text::new(
                format!("bars left to right in each group (darker to lighter): {order}"),
                (0.2, max_ops * 1.2),
                (FONT, 13).into_font(),
            )))
            .map_err(|x| e(&x))?;
    }

    // Latency spectrum on the nines axis.
    let lo = series
        .iter()
        .flat_map(|s| s.row.latency_spectrum.iter().map(|p| p.us))
        .chain(series.iter().map(|s| s.row.latency_us.p50))
        .filter(|v| *v > 0.0)
        .fold(f64::INFINITY, f64::min);
    let hi = series
        .iter()
        .flat_map(|s| s.row.latency_spectrum.iter().map(|p| p.us))
        .chain(series.iter().map(|s| s.row.latency_us.max))
        .fold(0.0, f64::max);
    let (lo, hi) = if lo.is_finite() && hi > 0.0 {
        (lo / 1.5, hi * 1.5)
    } else {
        (1.0, 10.0)
    };
    let mut chart = ChartBuilder::on(&lower)
        .caption(
            "Latency by percentile (lower is better; each nine gets the same width)",
            (FONT, 18),
        )
        .margin(14)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..MAX_AT + 0.2, (lo..hi).log_scale())
        .map_err(|x| e(&x))?;
    chart
        .configure_mesh()
        .x_labels(0)
        .y_labels(8)
        .y_label_formatter(&|v| human_us(*v))
        .y_desc("latency of one call")
        .light_line_style(WHITE)
        .bold_line_style(RGBColor(225, 225, 225))
        .draw()
        .map_err(|x| e(&x))?;
    // The nines ticks, drawn by hand: only these six labels.
    let ticks: Vec<(f64, String)> = NINES_TICKS
        .iter()
        .map(|(p, l)| (nines(*p), l.to_string()))
        .chain(std::iter::once((MAX_AT, "max".to_string())))
        .collect();
    for (x, label) in &ticks {
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(*x, lo), (*x, hi)],
                RGBColor(225, 225, 225),
            )))
            .map_err(|x| e(&x))?;
        chart
            .draw_series(std::iter::once(Text::new(
                label.clone(),
                (*x - 0.08, lo),
                (FONT, 14).into_font(),
            )))
            .map_err(|x| e(&x))?;
    }
    for s in &series {
        let points = spectrum_points(s.row);
        let c = colour(s.colour);
        draw_line(&mut chart, &points, c, s.style, s.label.clone())?;
        chart
            .draw_series(points.iter().map(|p| Circle::new(*p, 3, c.filled())))
            .map_err(|x| e(&x))?;
    }
    draw_legend(&mut chart, 13, SeriesLabelPosition::LowerRight)?;
    if timed {
        let (ops_area, p99_area) = timeline_area.split_vertically(TIMELINE_HEIGHT);
        draw_timeline(
            &ops_area,
            &series,
            TIMELINE_OPS_TITLE,
            "operations/s",
            human_count,
            |p| p.ops_per_sec,
        )?;
        draw_timeline(
            &p99_area,
            &series,
            TIMELINE_P99_TITLE,
            "batch p99",
            human_us,
            |p| p.p99_us,
        )?;
    }
    root.present().map_err(|x| e(&x))?;
    Ok(())
}

/// Height of each timeline panel.
const TIMELINE_HEIGHT: u32 = 320;
/// Captions of the timeline panels.
pub const TIMELINE_OPS_TITLE: &str =
    "Throughput per second of each measured phase (flat is steady; time from the start of the window)";
pub const TIMELINE_P99_TITLE: &str = "Batch p99 of each second of each measured phase";

/// One timeline panel: a step line per series with a timeline (each second
/// a flat segment over its own span, a dot at its middle), in the series'
/// colour and line style; the top left free for the legend.
fn draw_timeline(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    series: &[OpSeries],
    caption: &str,
    y_desc: &str,
    tick_label: fn(f64) -> String,
    value: fn(&crate::crash::timeline::TimelinePoint) -> f64,
) -> Result<(), String> {
    let e = |x: &dyn std::fmt::Display| x.to_string();
    let end = series
        .iter()
        .flat_map(|s| s.row.timeline.last().map(|p| p.at_s + 1.0))
        .fold(1.0, f64::max);
    let top = series
        .iter()
        .flat_map(|s| s.row.timeline.iter().map(value))
        .fold(0.0, f64::max)
        .max(1.0)
        * 1.6;
    let mut chart = ChartBuilder::on(area)
        .caption(caption, (FONT, 18))
        .margin(14)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..end, 0.0..top)
        .map_err(|x| e(&x))?;
    chart
        .configure_mesh()
        .x_desc("time since the measurement window opened")
        .x_label_formatter(&|v| human_us(*v * 1e6))
        .x_labels(12)
        .y_labels(6)
        .y_label_formatter(&|v| tick_label(*v))
        .y_desc(y_desc)
        .light_line_style(WHITE)
        .bold_line_style(RGBColor(225, 225, 225))
        .draw()
        .map_err(|x| e(&x))?;
    for s in series.iter().filter(|s| !s.row.timeline.is_empty()) {
        let line = &s.row.timeline;
        let points: Vec<(f64, f64)> = line
            .iter()
            .enumerate()
            .flat_map(|(i, p)| {
                let next = line.get(i + 1).map_or(p.at_s + 1.0, |n| n.at_s);
                [(p.at_s, value(p)), (next, value(p))]
            })
            .collect();
        let middles: Vec<(f64, f64)> = points
            .chunks(2)
            .map(|c| ((c[0].0 + c[1].0) / 2.0, c[0].1))
            .collect();
        let c = colour(s.colour);
        draw_line(&mut chart, &points, c, s.style, s.label.clone())?;
        chart
            .draw_series(middles.iter().map(|p| Circle::new(*p, 3, c.filled())))
            .map_err(|x| e(&x))?;
    }
    draw_legend(&mut chart, 12, SeriesLabelPosition::UpperRight)?;
    Ok(())
}

/// Draws one series as a line in `colour`, solid or dashed by `style`
/// (an index into [`DASHES`]), with its legend entry drawn the same way.
fn draw_line<'a, DB, CT>(
    chart: &mut ChartContext<'a, DB, CT>,
    points: &[(f64, f64)],
    colour: RGBColor,
    style: usize,
    label: String,
) -> Result<(), String>
where
    DB: DrawingBackend + 'a,
    CT: CoordTranslate<From = (f64, f64)>,
{
    let stroke = colour.stroke_width(2);
    let (dash, gap) = DASHES[style % DASHES.len()];
    let anno = if dash == 0 {
        chart
            .draw_series(LineSeries::new(points.iter().copied(), stroke))
            .map_err(|x| x.to_string())?
    } else {
        chart
            .draw_series(DashedLineSeries::new(
                points.iter().copied(),
                dash,
                gap,
                stroke,
            ))
            .map_err(|x| x.to_string())?
    };
    anno.label(label)
        .legend(move |at| legend_sample(at, dash, gap, stroke));
    Ok(())
}

/// Draws a chart's legend box, the same look on every chart.
fn draw_legend<'a, DB, CT>(
    chart: &mut ChartContext<'a, DB, CT>,
    font_size: u32,
    position: SeriesLabelPosition,
) -> Result<(), String>
where
    DB: DrawingBackend + 'a,
    CT: CoordTranslate,
{
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(180, 180, 180))
        .label_font((FONT, font_size))
        .position(position)
        .draw()
        .map_err(|x| x.to_string())
}

/// (nines position, µs) of a row: the stored spectrum, or for older reports
/// the five summary points.
fn spectrum_points(r: &ResultRow) -> Vec<(f64, f64)> {
    let raw: Vec<(f64, f64)> = if r.latency_spectrum.is_empty() {
        let l = &r.latency_us;
        vec![
            (50.0, l.p50),
            (95.0, l.p95),
            (99.0, l.p99),
            (99.9, l.p999),
            (100.0, l.max),
        ]
    } else {
        r.latency_spectrum
            .iter()
            .map(|p| (p.percentile, p.us))
            .collect()
    };
    raw.into_iter()
        .filter(|(_, us)| *us > 0.0)
        .map(|(p, us)| (if p >= 100.0 { MAX_AT } else { nines(p) }, us))
        .collect()
}

fn draw_sweep(report: &Report, rows: &[&ResultRow], out: &mut String) -> Result<(), String> {
    let e = |x: &dyn std::fmt::Display| x.to_string();
    let devices = distinct(rows, |r| r.device.clone());
    let sizes: Vec<u64> = {
        let mut v: Vec<u64> = rows.iter().filter_map(|r| r.items).collect();
        v.sort_unstable();
        v.dedup();
        v
    };
    let (n_lo, n_hi) = match (sizes.first(), sizes.last()) {
        (Some(&a), Some(&b)) => (a as f64 / 1.6, b as f64 * 1.6),
        _ => return Err("sweep rows without sizes".to_string()),
    };
    let published_at = |device: &str, op: &str| -> Vec<(&'static str, Vec<(f64, f64)>)> {
        crate::published::sweep_rows(device)
            .filter(|p| p.operation == op)
            .map(|p| {
                let pts = sizes
                    .iter()
                    .filter_map(|&n| p.at(n).map(|ns| (n as f64, ns as f64)))
                    .collect();
                (p.store, pts)
            })
            .collect()
    };
    let all_ns = rows.iter().map(|r| r.items_time_ns().0 as f64).chain(
        devices
            .iter()
            .flat_map(|d| {
                ["write", "read"]
                    .into_iter()
                    .flat_map(|op| published_at(d, op))
            })
            .flat_map(|(_, pts)| pts.into_iter().map(|p| p.1)),
    );
    let (mut t_lo, mut t_hi) = (f64::INFINITY, 0.0f64);
    for ns in all_ns.filter(|v| *v > 0.0) {
        t_lo = t_lo.min(ns);
        t_hi = t_hi.max(ns);
    }
    if !t_lo.is_finite() {
        return Err("sweep rows without times".to_string());
    }
    let (t_lo, t_hi) = (t_lo / 2.0, t_hi * 2.0);

    let root = SVGBackend::with_string(out, (WIDTH, 700)).into_drawing_area();
    let area = header(
        &root,
        "ringkv sweep (MapDB/ChronicleMap document): time to write / read N items",
        &subtitle(report, rows),
    )?;
    let panels = area.split_evenly((1, 2));
    for (panel, op) in panels.iter().zip(["write", "read"]) {
        let mut chart: ChartContext<
            SVGBackend,
            Cartesian2d<
                plotters::coord::combinators::LogCoord<f64>,
                plotters::coord::combinators::LogCoord<f64>,
            >,
        > = ChartBuilder::on(panel)
            .caption(
                format!("{op} N items (lower is better; log–log)"),
                (FONT, 18),
            )
            .margin(14)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d((n_lo..n_hi).log_scale(), (t_lo..t_hi).log_scale())
            .map_err(|x| e(&x))?;
        chart
            .configure_mesh()
            .x_labels(6)
            .y_labels(8)
            .x_label_formatter(&|v| human_count(*v))
            .y_label_formatter(&|v| human_us(*v / 1e3))
            .x_desc("N (items)")
            .y_desc("time for all N")
            .light_line_style(WHITE)
            .bold_line_style(RGBColor(225, 225, 225))
            .draw()
            .map_err(|x| e(&x))?;
        for (di, device) in devices.iter().enumerate() {
            let c = colour(di);
            let mut pts: Vec<(f64, f64)> = rows
                .iter()
                .filter(|r| r.device == *device && r.operation == op)
                .filter_map(|r| r.items.map(|n| (n as f64, r.items_time_ns().0 as f64)))
                .collect();
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            chart
                .draw_series(LineSeries::new(pts.clone(), c.stroke_width(3)))
                .map_err(|x| e(&x))?
                .label(format!("ringkv {device}"))
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 24, y)], c.stroke_width(3))
                });
            chart
                .draw_series(pts.iter().map(|p| Circle::new(*p, 4, c.filled())))
                .map_err(|x| e(&x))?;
            for (store, pts) in published_at(device, op) {
                if pts.is_empty() {
                    continue;
                }
                let thin = c.mix(0.8).stroke_width(1);
                let label = format!("{store} {device} (published)");
                let series = if store == "MapDB" {
                    chart
                        .draw_series(DashedLineSeries::new(pts.clone(), 6, 4, thin))
                        .map_err(|x| e(&x))?
                } else {
                    chart
                        .draw_series(DashedLineSeries::new(pts.clone(), 2, 3, thin))
                        .map_err(|x| e(&x))?
                };
                let dashed = store == "MapDB";
                series.label(label).legend(move |(x, y)| {
                    let end = if dashed { x + 12 } else { x + 4 };
                    PathElement::new(vec![(x, y), (end, y)], c.stroke_width(1))
                });
            }
        }
        draw_legend(&mut chart, 12, SeriesLabelPosition::UpperLeft)?;
    }
    root.present().map_err(|x| e(&x))?;
    Ok(())
}

/// The key pairing rows of two reports (as `loadgen compare` does).
fn pair_label(r: &ResultRow) -> String {
    let mut s = format!("{} {}", r.device, op_name(r));
    if r.durability != "none" || r.workload != "sweep" {
        s.push_str(&format!(" ({})", r.durability));
    }
    s
}

/// One panel of the compare chart: where, caption, value, value's format.
type Panel<'a, 'b> = (
    &'a DrawingArea<SVGBackend<'b>, plotters::coord::Shift>,
    &'static str,
    fn(&ResultRow) -> f64,
    fn(f64) -> String,
);

fn draw_compare(
    base: &Report,
    base_name: &str,
    new: &Report,
    new_name: &str,
    out: &mut String,
) -> Result<(), String> {
    let e = |x: &dyn std::fmt::Display| x.to_string();
    let measured = |r: &Report| -> Vec<ResultRow> {
        r.results
            .iter()
            .filter(|x| x.status != Status::Unsupported && x.ops > 0)
            .cloned()
            .collect()
    };
    let (b, n) = (measured(base), measured(new));
    let pairs: Vec<(&ResultRow, &ResultRow)> = b
        .iter()
        .filter_map(|x| n.iter().find(|y| y.key() == x.key()).map(|y| (x, y)))
        .collect();
    if pairs.is_empty() {
        return Err("the two reports have no operation in common".to_string());
    }
    let root = SVGBackend::with_string(out, (WIDTH, 900)).into_drawing_area();
    let all: Vec<&ResultRow> = pairs.iter().map(|p| p.1).collect();
    let area = header(
        &root,
        &format!("ringkv compare: A = {base_name}, B = {new_name}"),
        &format!("B: {}", subtitle(new, &all)),
    )?;
    let (upper, lower) = area.split_vertically(410);
    let names: Vec<String> = pairs.iter().map(|p| pair_label(p.0)).collect();
    let metrics: [Panel; 2] = [
        (
            &upper,
            "Throughput, operations/s (higher is better)",
            |r| r.ops_per_sec,
            human_count,
        ),
        (
            &lower,
            "p99 latency of one call (lower is better)",
            |r| r.latency_us.p99,
            human_us,
        ),
    ];
    for (panel, caption, value, fmt) in metrics {
        let max = pairs
            .iter()
            .map(|(x, y)| value(x).max(value(y)))
            .fold(0.0, f64::max)
            .max(1e-9);
        let slots = pairs.len() * 3;
        let mut chart: ChartContext<SVGBackend, Cartesian2d<RangedCoordf64, RangedCoordf64>> =
            ChartBuilder::on(panel)
                .caption(caption, (FONT, 18))
                .margin(14)
                .x_label_area_size(40)
                .y_label_area_size(70)
                .build_cartesian_2d(0.0..slots as f64, 0.0..max * 1.3)
                .map_err(|x| e(&x))?;
        let labels = names.clone();
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(slots * 2 + 1)
            .x_label_formatter(&move |v| {
                let g = (v / 3.0).floor();
                if (v - (g * 3.0 + 1.0)).abs() < 0.26 {
                    labels.get(g as usize).cloned().unwrap_or_default()
                } else {
                    String::new()
                }
            })
            .y_labels(6)
            .y_label_formatter(&move |v| fmt(*v))
            .light_line_style(WHITE)
            .draw()
            .map_err(|x| e(&x))?;
        for (i, (x, y)) in pairs.iter().enumerate() {
            for (j, (row, name)) in [(x, "A"), (y, "B")].into_iter().enumerate() {
                let x0 = i as f64 * 3.0 + j as f64 + 0.1;
                let v = value(row);
                let c = colour(j);
                let rect = chart
                    .draw_series(std::iter::once(Rectangle::new(
                        [(x0, 0.0), (x0 + 0.8, v)],
                        c.filled(),
                    )))
                    .map_err(|x| e(&x))?;
                if i == 0 {
                    let label = if j == 0 { base_name } else { new_name };
                    rect.label(format!("{name}: {label}"))
                        .legend(move |(x, y)| {
                            Rectangle::new([(x, y - 5), (x + 12, y + 5)], c.filled())
                        });
                }
                chart
                    .draw_series(std::iter::once(Text::new(
                        fmt(v),
                        (x0, v + max * 0.03),
                        (FONT, 13).into_font(),
                    )))
                    .map_err(|x| e(&x))?;
            }
        }
        draw_legend(&mut chart, 13, SeriesLabelPosition::UpperRight)?;
    }
    root.present().map_err(|x| e(&x))?;
    Ok(())
}

/// Dollars for an axis tick: "$0.005", "$0.01" (no trailing zeros).
fn short_dollars(v: f64) -> String {
    let s = crate::render::dollars(v);
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// A label box in pixels: left, top, width, height.
#[derive(Debug, Clone, Copy, PartialEq)]
struct LabelBox {
    x: i32,
    y: i32,
    w: i32,
    h: i32,
}

impl LabelBox {
    fn overlaps(&self, o: &LabelBox) -> bool {
        self.x < o.x + o.w && o.x < self.x + self.w && self.y < o.y + o.h && o.y < self.y + self.h
    }
}

/// Vertical offsets (pixels, added to each box's `y`) that keep the label
/// boxes from overlapping each other and the `obstacles` (the markers):
/// boxes are placed from the top down, and one that would overlap a box
/// already placed or an obstacle moves down until it clears it. A label
/// that does not collide keeps offset 0, level with its point.
fn spread_labels(boxes: &[LabelBox], obstacles: &[LabelBox]) -> Vec<i32> {
    let mut order: Vec<usize> = (0..boxes.len()).collect();
    order.sort_by_key(|&i| (boxes[i].y, boxes[i].x));
    let mut placed: Vec<LabelBox> = obstacles.to_vec();
    let mut offsets = vec![0; boxes.len()];
    for i in order {
        let mut b = boxes[i];
        // Each move puts the box below one placed box, never back above
        // it, so this ends after at most `placed.len()` moves.
        while let Some(hit) = placed.iter().find(|p| p.overlaps(&b)) {
            b.y = hit.y + hit.h;
        }
        offsets[i] = b.y - boxes[i].y;
        placed.push(b);
    }
    offsets
}

/// Font size of the tiered chart's point labels, and the pixels a line of
/// them takes (a little more than the size, so lines do not touch).
const POINT_LABEL_FONT: u32 = 14;
const POINT_LABEL_LINE: i32 = 18;

/// The width in pixels of `text` at the point-label font, on the generous
/// side: a sans-serif label of digits and lower-case letters averages about
/// 0.4 em a character; 0.5 em leaves room for wider fonts without pushing
/// labels away from markers they do not reach.
fn point_label_width(text: &str) -> i32 {
    (text.chars().count() as f64 * POINT_LABEL_FONT as f64 * 0.5).ceil() as i32
}

/// The tiered workload: GET p99 (y) against cost per month (x), a labelled
/// point per layout and read distribution. A layout's Zipfian and uniform
/// points share their cost, so their labels are spread apart vertically
/// when their latencies are close (a thin line then leads from each moved
/// label to its point).
fn draw_tiered(report: &Report, out: &mut String) -> Result<(), String> {
    let e = |x: &dyn std::fmt::Display| x.to_string();
    let points = &report.tiered;
    let layouts: Vec<&str> = {
        let mut v: Vec<&str> = Vec::new();
        for p in points {
            if !v.contains(&p.layout.as_str()) {
                v.push(&p.layout);
            }
        }
        v
    };
    let cost_hi = points
        .iter()
        .map(|p| p.cost_per_month)
        .fold(0.0f64, f64::max)
        .max(1e-9)
        * 1.6; // room for the labels right of the points
    let p99_hi = points
        .iter()
        .map(|p| p.get_latency_us.p99)
        .fold(0.0f64, f64::max)
        .max(1.0)
        * 1.25;
    let m = &report.machine;
    let writes = points.first().map_or(0, |p| p.write_percent);
    let subtitle = format!(
        "{} CPUs ({}) — {} records — {}% writes — cost: value segment bytes x price per GB-month — {}",
        m.cpus,
        m.cpu_model,
        format_count(report.run.records),
        writes,
        report.started_at
    );
    let root = SVGBackend::with_string(out, (WIDTH, 700)).into_drawing_area();
    let area = header(
        &root,
        "ringkv hybrid tier: GET p99 latency against storage cost (all-nvme, all-sas, tiered)",
        &subtitle,
    )?;
    let mut chart = ChartBuilder::on(&area)
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(90)
        .build_cartesian_2d(0.0..cost_hi, 0.0..p99_hi)
        .map_err(|x| e(&x))?;
    chart
        .configure_mesh()
        .x_desc("cost, dollars per month")
        .y_desc("GET p99")
        .x_label_formatter(&|v| short_dollars(*v))
        .y_label_formatter(&|v| human_us(*v))
        .x_labels(8)
        .y_labels(8)
        .label_style((FONT, 14))
        .draw()
        .map_err(|x| e(&x))?;
    // Every point's label, starting right of its marker and level with it,
    // then moved down where it would cover another.
    let labels: Vec<String> = points
        .iter()
        .map(|p| {
            format!(
                "{} ({}): {}, {}/month",
                p.layout,
                p.distribution,
                human_us(p.get_latency_us.p99),
                crate::render::dollars(p.cost_per_month)
            )
        })
        .collect();
    let at: Vec<(i32, i32)> = points
        .iter()
        .map(|p| chart.backend_coord(&(p.cost_per_month, p.get_latency_us.p99)))
        .collect();
    let boxes: Vec<LabelBox> = at
        .iter()
        .zip(&labels)
        .map(|(&(x, y), label)| LabelBox {
            x: x + 14,
            y: y - POINT_LABEL_LINE / 2,
            w: point_label_width(label),
            h: POINT_LABEL_LINE,
        })
        .collect();
    // The markers (radius 8 or 9), which a label must not cover either.
    let markers: Vec<LabelBox> = at
        .iter()
        .map(|&(x, y)| LabelBox {
            x: x - 10,
            y: y - 10,
            w: 20,
            h: 20,
        })
        .collect();
    let offsets = spread_labels(&boxes, &markers);
    for (i, layout) in layouts.iter().enumerate() {
        let c = colour(i);
        let mine = points
            .iter()
            .zip(labels.iter().zip(&offsets))
            .filter(|(p, _)| p.layout == *layout);
        for (p, (label, &dy)) in mine {
            let at = (p.cost_per_month, p.get_latency_us.p99);
            let style = (FONT, POINT_LABEL_FONT).into_font().color(&BLACK);
            let text = Text::new(label.clone(), (14, -7 + dy), style);
            if dy != 0 {
                chart
                    .draw_series(std::iter::once(
                        EmptyElement::at(at)
                            + PathElement::new(vec![(8, 0), (13, dy)], c.stroke_width(1)),
                    ))
                    .map_err(|x| e(&x))?;
            }
            if p.distribution == "uniform" {
                chart
                    .draw_series(std::iter::once(
                        EmptyElement::at(at) + TriangleMarker::new((0, 0), 9, c.filled()) + text,
                    ))
                    .map_err(|x| e(&x))?;
            } else {
                chart
                    .draw_series(std::iter::once(
                        EmptyElement::at(at) + Circle::new((0, 0), 8, c.filled()) + text,
                    ))
                    .map_err(|x| e(&x))?;
            }
        }
        // A legend entry per layout, in its colour.
        chart
            .draw_series(std::iter::empty::<Circle<(f64, f64), i32>>())
            .map_err(|x| e(&x))?
            .label(layout.to_string())
            .legend(move |(x, y)| Circle::new((x + 8, y), 6, c.filled()));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK.mix(0.3))
        .label_font((FONT, 15))
        .draw()
        .map_err(|x| e(&x))?;
    root.present().map_err(|x| e(&x))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::tests::sample_report;

    #[test]
    fn human_units() {
        assert_eq!(human_count(100_000.0), "100K");
        assert_eq!(human_count(1_000_000.0), "1M");
        assert_eq!(human_count(1_250_000.0), "1.2M");
        assert_eq!(human_count(366_000.0), "366K");
        assert_eq!(human_count(12.0), "12");
        assert_eq!(human_us(250.0), "250 µs");
        assert_eq!(human_us(1_200_000.0), "1.2 s");
        assert_eq!(human_us(12_000.0), "12 ms");
        assert_eq!(human_us(0.85), "850 ns");
        assert_eq!(human_us(2_000.0), "2 ms");
        assert_eq!(human_us(0.0), "0");
        assert_eq!(human_us(1_500_000.0), "1.5 s");
    }

    #[test]
    fn twelve_series_get_twelve_colours() {
        let colours: std::collections::HashSet<(u8, u8, u8)> = (0..12)
            .map(|i| {
                let c = colour(i);
                (c.0, c.1, c.2)
            })
            .collect();
        assert_eq!(colours.len(), 12);
    }

    #[test]
    fn nines_axis_gives_each_nine_the_same_width() {
        assert!((nines(90.0) - 1.0).abs() < 1e-9);
        assert!((nines(99.0) - 2.0).abs() < 1e-9);
        assert!((nines(99.99) - 4.0).abs() < 1e-9);
        assert!(nines(50.0) > 0.3 && nines(50.0) < 0.31);
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

    #[test]
    fn spread_labels_moves_only_colliding_boxes() {
        let b = |x, y| LabelBox {
            x,
            y,
            w: 100,
            h: 18,
        };
        // Apart: untouched.
        assert_eq!(
            spread_labels(&[b(0, 0), b(0, 40), b(200, 5)], &[]),
            vec![0, 0, 0]
        );
        // Three on top of each other: stacked, in order of height.
        assert_eq!(
            spread_labels(&[b(0, 3), b(0, 0), b(50, 1)], &[]),
            vec![33, 0, 17]
        );
        // A marker in the way: the label goes below it.
        let marker = LabelBox {
            x: 30,
            y: 5,
            w: 20,
            h: 20,
        };
        assert_eq!(spread_labels(&[b(0, 0)], &[marker]), vec![25]);
    }

    /// The text's `y` attribute of the first label starting with `prefix`.
    fn label_y(svg: &str, prefix: &str) -> f64 {
        let doc = roxmltree::Document::parse(svg).expect("xml");
        let node = doc
            .descendants()
            .find(|n| {
                n.has_tag_name("text") && n.text().is_some_and(|t| t.trim().starts_with(prefix))
            })
            .unwrap_or_else(|| panic!("no label {prefix:?}"));
        node.attribute("y").and_then(|y| y.parse().ok()).expect("y")
    }

    #[test]
    fn tiered_labels_of_one_layout_do_not_overlap() {
        use crate::workloads::tiered::{tests::sample, Layout};
        let mut report = crate::report::tests::sample_report(&["nvme"], &["read"], 1.0);
        // A layout's two distributions cost the same; close latencies put
        // their points a pixel or two apart.
        let mut uniform = sample(Layout::AllNvme, 1010.0, 6000.0, 0, 100);
        uniform.distribution = "uniform".to_string();
        report.tiered = vec![
            sample(Layout::AllNvme, 1000.0, 6000.0, 0, 100),
            uniform,
            sample(Layout::AllSas, 8000.0, 1500.0, 0, 100),
            sample(Layout::Tiered, 1400.0, 5000.0, 95, 5),
        ];
        let text = svg_of(&report).expect("draws");
        let zipfian = label_y(&text, "all-nvme (zipfian)");
        let uniform = label_y(&text, "all-nvme (uniform)");
        assert!(
            (zipfian - uniform).abs() >= POINT_LABEL_LINE as f64,
            "labels {zipfian} and {uniform} overlap"
        );
        // A label with room keeps its place, level with its point.
        let sas = label_y(&text, "all-sas (zipfian)");
        assert!((sas - zipfian).abs() > 100.0);
    }

    #[test]
    fn tiered_chart_draws_a_labelled_point_per_layout() {
        use crate::workloads::tiered::{tests::sample, Layout};
        let mut report = crate::report::tests::sample_report(&["nvme"], &["read"], 1.0);
        report.tiered = vec![
            sample(Layout::AllNvme, 1000.0, 6000.0, 0, 100),
            sample(Layout::AllSas, 8000.0, 1500.0, 0, 100),
            sample(Layout::Tiered, 1400.0, 5000.0, 95, 5),
        ];
        let text = svg_of(&report).expect("draws");
        assert!(roxmltree::Document::parse(&text).is_ok());
        assert!(
            text.contains("against storage cost"),
            "not the tiered chart"
        );
        assert_eq!(short_dollars(0.005), "$0.005");
        assert_eq!(short_dollars(0.0), "$0");
        for layout in [
            "all-nvme (zipfian)",
            "all-sas (zipfian)",
            "tiered (zipfian)",
        ] {
            assert!(text.contains(layout), "{layout} not labelled");
        }
    }
}
