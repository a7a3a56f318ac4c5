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
