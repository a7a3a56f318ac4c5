//! The request watch (docs/operations.md, Logs): a shard whose thread is
//! blocked while requests wait in its inbox is reported in the log, with
//! its counters, and so is its end; a shard that serves is never reported.
//! The call watch says the same from the caller's side: a blocking call
//! unanswered past its deadline logs every shard's state once.

mod common;

use common::*;
use ringkv_engine::{Engine, OpResult};
use std::time::{Duration, Instant};
use tunables::Durability;

const STUCK: &str = "a shard has requests waiting in its inbox and has taken none";
const MOVING: &str = "the shard takes requests again";
const CALL: &str = "a blocking call has had no answer for a while";

#[test]
fn a_shard_that_takes_no_request_is_reported_and_then_its_end() {
    // Before any engine thread exists: the watch reads it once at start.
    std::env::set_var("RINGKV_STUCK_WARN_MS", "1000");
    std::env::set_var("RINGKV_CALL_WARN_MS", "2000");
    let log = Captured::install();
    let dir = tempfile::tempdir().expect("tempdir");
    let config = small_config(&dir.path().join("d"), 1, Durability::None);
    let engine = Engine::open(&config).expect("open");
    let h = engine.handle();
    // Serving: nothing said.
    for round in 0..30 {
        assert_eq!(
            h.batch_blocking(vec![put(round, 1)]).expect("put"),
            vec![OpResult::Ok]
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!log.text().contains(STUCK), "{}", log.text());
    assert!(!log.text().contains(CALL), "{}", log.text());

    // The shard's thread blocked for 8 s by a task of its own, with a
    // request waiting: said while it waits, then said to end.
    let (blocked_tx, blocked_rx) = std::sync::mpsc::channel();
    engine.spawn_on(0, move || async move {
        let _ = blocked_tx.send(());
        std::thread::sleep(Duration::from_secs(8));
    });
    blocked_rx.recv().expect("the task runs");
    let waiting = {
        let h = h.clone();
        std::thread::spawn(move || h.batch_blocking(vec![put(1000, 1)]))
    };
    let started = Instant::now();
    while !log.text().contains(STUCK) {
        assert!(
            started.elapsed() < Duration::from_secs(6),
            "not reported within 6 s:\n{}",
            log.text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    while !log.text().contains(CALL) {
        assert!(
            started.elapsed() < Duration::from_secs(7),
            "the waiting call was not reported within 7 s:\n{}",
            log.text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        !waiting.is_finished(),
        "answered while the shard was blocked"
    );
    let call = log
        .text()
        .lines()
        .find(|l| l.contains(CALL))
        .unwrap()
        .to_string();
    for field in [
        "shard=0",
        "inbox=",
        "durable_lsn=",
        "current_lsn=",
        "waited_s=",
    ] {
        assert!(call.contains(field), "{field} missing: {call}");
    }
    assert_eq!(
        waiting.join().expect("join").expect("put"),
        vec![OpResult::Ok]
    );
    let started = Instant::now();
    while !log.text().contains(MOVING) {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "its end was not said:\n{}",
            log.text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let line = log
        .text()
        .lines()
        .find(|l| l.contains(STUCK))
        .unwrap()
        .to_string();
    for field in ["shard=0", "inbox=1", "durable_lsn=", "current_lsn="] {
        assert!(line.contains(field), "{field} missing: {line}");
    }
    engine.shutdown().expect("shutdown");
}
