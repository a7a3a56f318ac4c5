//! Every chart kind drawn from a small saved report (checked in under
//! `tests/charts/`, written by the loadgen commands in docs/loadgen.md):
//! the SVG must be well-formed XML and carry the series names and axis
//! labels a reader needs; a `.png` name gives a PNG.

use loadgen::plot::{kind_of, plot_compare, svg_of, ChartKind};
use loadgen::report::Report;
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> Report {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/charts")
        .join(name);
    Report::read_json(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Parses the SVG as XML and returns every text it shows.
fn texts(svg: &str) -> Vec<String> {
    let doc = roxmltree::Document::parse(svg).expect("the SVG is well-formed XML");
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    doc.descendants()
        .filter(|n| n.is_text())
        .filter_map(|n| n.text())
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty())
        .collect()
}

fn assert_has(texts: &[String], want: &str) {
    assert!(
        texts.iter().any(|t| t.contains(want)),
        "no text containing {want:?} among {texts:?}"
    );
}

#[test]
fn putget_chart_has_bars_and_the_nines_axis() {
    let report = fixture("putget.json");
    assert_eq!(kind_of(&report), ChartKind::Operations);
    let t = texts(&svg_of(&report).expect("chart"));
    for want in [
        "Throughput, operations/s",
        "Latency by percentile",
        "50%",
        "90%",
        "99%",
        "99.9%",
        "99.99%",
        "max",
        "put — sas none",
        "get — nvme sync",
        "profile sas, gpssd, nvme",
        "durability none, sync",
        "CPUs",
    ] {
        assert_has(&t, want);
    }
    // Human units on the axes, no raw floats like "700000.0".
    assert!(
        t.iter().any(|x| x.ends_with(" ms") || x.ends_with(" µs")),
        "{t:?}"
    );
    assert!(!t.iter().any(|x| x.ends_with(".0")), "{t:?}");
}

/// A report from before the timeline has no timeline panels; once its
/// rows carry per-second points, the chart adds both panels, one line per
/// row in the row's legend name, and the time axis in seconds.
#[test]
fn putget_chart_draws_the_timeline_panels_when_rows_have_them() {
    use loadgen::crash::timeline::TimelinePoint;
    use loadgen::plot::{TIMELINE_OPS_TITLE, TIMELINE_P99_TITLE};
    let mut report = fixture("putget.json");
    let t = texts(&svg_of(&report).expect("chart"));
    assert!(!t.iter().any(|x| x == TIMELINE_OPS_TITLE), "{t:?}");
    for (i, r) in report.results.iter_mut().enumerate() {
        r.timeline = (0..12)
            .map(|s| TimelinePoint {
                at_s: s as f64,
                ops_per_sec: 100_000.0 + 1_000.0 * (i + s) as f64,
                p99_us: 2_000.0 + 100.0 * s as f64,
            })
            .collect();
    }
    let t = texts(&svg_of(&report).expect("chart"));
    assert_has(&t, TIMELINE_OPS_TITLE);
    assert_has(&t, TIMELINE_P99_TITLE);
    // The put/get legend names appear in the two timeline panels as well.
    let named = t.iter().filter(|x| *x == "put — sas none").count();
    assert!(named >= 3, "{named} legend entries for put — sas none");
    assert_has(&t, "10 s");
}

#[test]
fn ycsb_chart_names_each_workload_operation() {
    let report = fixture("ycsb.json");
    assert_eq!(kind_of(&report), ChartKind::Operations);
    let t = texts(&svg_of(&report).expect("chart"));
    for want in [
        "ycsb-a read",
        "ycsb-a update",
        "ycsb-c read",
        "ycsb-f read-modify-write",
        "99.99%",
        "operations/s",
    ] {
        assert_has(&t, want);
    }
}

#[test]
fn sweep_chart_has_log_axes_and_published_lines() {
    let report = fixture("sweep.json");
    assert_eq!(kind_of(&report), ChartKind::Sweep);
    let t = texts(&svg_of(&report).expect("chart"));
    for want in [
        "write N items",
        "read N items",
        "N (items)",
        "time for all N",
        "ringkv sas",
        "ringkv nvme",
        "MapDB sas (published)",
        "ChronicleMap gpssd (published)",
        "10K",
        "100K",
        "durability async",
    ] {
        assert_has(&t, want);
    }
}

#[test]
fn compare_chart_puts_a_and_b_side_by_side() {
    let a = fixture("putget.json");
    let b = fixture("putget-b.json");
    let dir = tempfile::tempdir().expect("tempdir");
    let svg_path = dir.path().join("compare.svg");
    plot_compare(&a, "base.json", &b, "new.json", &svg_path).expect("compare chart");
    let svg = std::fs::read_to_string(&svg_path).expect("read");
    let t = texts(&svg);
    for want in [
        "A: base.json",
        "B: new.json",
        "nvme put (sync)",
        "nvme get (sync)",
        "p99 latency",
    ] {
        assert_has(&t, want);
    }
}

#[test]
fn a_png_name_gives_a_png() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path: PathBuf = dir.path().join("sweep.png");
    match loadgen::plot::plot(&fixture("sweep.json"), &path) {
        Ok(()) => {
            let bytes = std::fs::read(&path).expect("read");
            assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "PNG signature");
        }
        // A machine without any font cannot draw text: the error says so.
        Err(e) => assert!(e.to_string().contains("no system fonts"), "{e}"),
    }
}

/// The pieces of each legend sample line of the latency panel, by label:
/// the polylines drawn after the legend's text (plotters draws a legend's
/// samples last) that lie in the sample's slot left of the label.
fn legend_samples(svg: &str) -> Vec<(String, usize)> {
    let doc = roxmltree::Document::parse(svg).expect("xml");
    let nodes: Vec<roxmltree::Node> = doc.descendants().filter(|n| n.is_element()).collect();
    let num = |n: &roxmltree::Node, a: &str| -> f64 {
        n.attribute(a)
            .and_then(|v| v.parse().ok())
            .unwrap_or(f64::NAN)
    };
    let mut out = Vec::new();
    for (i, label) in nodes.iter().enumerate() {
        let Some(text) = label.text().filter(|t| t.contains(" — ")) else {
            continue;
        };
        if !label.has_tag_name("text") {
            continue;
        }
        // The sample is level with the middle of its label's line.
        let (tx, ty) = (num(label, "x"), num(label, "y"));
        let mid = ty + num(label, "font-size") / 2.0;
        let pieces = nodes[i + 1..]
            .iter()
            .filter(|n| n.has_tag_name("polyline"))
            .filter(|n| {
                let points: Vec<(f64, f64)> = n
                    .attribute("points")
                    .unwrap_or("")
                    .split_whitespace()
                    .filter_map(|p| {
                        let (x, y) = p.split_once(',')?;
                        Some((x.parse().ok()?, y.parse().ok()?))
                    })
                    .collect();
                !points.is_empty()
                    && points
                        .iter()
                        .all(|&(x, y)| x >= tx - 32.0 && x < tx && (y - mid).abs() < 4.0)
            })
            .count();
        out.push((text.trim().to_string(), pieces));
    }
    out
}

#[test]
fn a_dashed_series_has_a_dashed_legend_sample() {
    let report = fixture("putget.json");
    let samples: Vec<(String, usize)> = legend_samples(&svg_of(&report).expect("chart"))
        .into_iter()
        .filter(|(label, _)| label.starts_with("put — ") || label.starts_with("get — "))
        .collect();
    assert_eq!(samples.len(), 12, "{samples:?}");
    // The first line style (sas none, the first rows) is solid: one piece.
    // The others are dashed, and their samples are separate dashes too.
    for (label, pieces) in &samples {
        if label.ends_with("sas none") {
            assert_eq!(*pieces, 1, "{label}: {samples:?}");
        } else {
            assert!(*pieces >= 2, "{label} is dashed: {samples:?}");
        }
    }
}

#[test]
fn ycsb_operations_each_get_their_own_colour() {
    let report = fixture("ycsb.json");
    let svg = svg_of(&report).expect("chart");
    let doc = roxmltree::Document::parse(&svg).expect("xml");
    // The latency lines (and their legend samples) are the 2-pixel lines.
    let colours: std::collections::BTreeSet<&str> = doc
        .descendants()
        .filter(|n| n.has_tag_name("polyline") && n.attribute("stroke-width") == Some("2"))
        .filter_map(|n| n.attribute("stroke"))
        .collect();
    let measured = report
        .results
        .iter()
        .filter(|r| r.operation != "load" && r.status != loadgen::report::Status::Unsupported)
        .count();
    assert_eq!(
        measured, 9,
        "the fixture has YCSB's nine measured operations"
    );
    assert_eq!(colours.len(), measured, "{colours:?}");
}
