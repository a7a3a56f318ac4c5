//! Runs the `get_batch` benchmark's own code at a tiny size, so the
//! benchmark keeps compiling and working. Checks what it reports (every
//! answer of both read paths is verified inside the run), never speed.

#[path = "../benches/get_batch/bench_core.rs"]
mod bench_core;

use bench_core::{run, Options};

#[test]
fn get_batch_benchmark_runs_at_tiny_size() {
    let opts = Options {
        keys: 2_000,
        value_size: 1000,
        batch: 1000,
        batches_per_run: 3,
        runs: 3,
        missing_per_mille: 100,
        seed: 11,
    };
    let report = run(&opts);
    // Both paths, 3 runs each, 3 batches of 1,000 GETs per run.
    assert_eq!(report.gets_checked, 2 * 3 * 3 * 1000);
    assert_eq!(report.per_key_ns.len(), 3);
    assert_eq!(report.batched_ns.len(), 3);
    // About 10% of GETs ask for absent keys; the rest must all be found.
    let missing = report.gets_checked - report.found;
    assert!(missing > 0 && missing < report.gets_checked / 5, "{report}");
    let text = report.to_string();
    assert!(
        text.contains("ns/GET") && text.contains("speed-up"),
        "{text}"
    );
}
