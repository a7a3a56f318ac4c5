//! The WAL's durability watch (docs/operations.md, Logs) on the simulated
//! disk: a durable write of the WAL that does not return for longer than
//! the watch's threshold is reported in the log while the write waits, and
//! its end once it returned; a WAL that keeps up is never reported.

mod common;

use common::*;
use ringkv_engine::io::sim::{SimDisk, SimFaults};
use ringkv_engine::{Engine, OpResult};
use std::path::Path;
use std::time::{Duration, Instant};
use tunables::Durability;

const STALLED: &str = "WAL: logged records are not becoming durable";
const MOVING: &str = "WAL: the durable LSN moves again";

#[test]
fn a_wal_write_that_does_not_return_is_logged_while_it_waits_and_when_it_ends() {
    let log = Captured::install();
    let disk = SimDisk::new(7);
    let config = small_config(Path::new("/watch"), 1, Durability::Sync);
    let engine = Engine::open_with_disk(&config, disk.clone()).expect("open");
    let h = engine.handle();
    // A WAL that keeps up: nothing said.
    for i in 0..20 {
        assert_eq!(
            h.batch_blocking(vec![put(i, 1)]).expect("put"),
            vec![OpResult::Ok]
        );
    }
    std::thread::sleep(Duration::from_secs(3));
    assert!(!log.text().contains(STALLED), "{}", log.text());

    // The WAL's next durable write waits 2 x 15 s (the write, then its
    // sync): the watch, which looks every 2 s and warns after 10 s, must
    // say so before it returns (at 14 s at the latest, timers on time).
    disk.set_faults(SimFaults {
        latency: Some(Duration::from_secs(15)),
        path_filter: Some(".wal".into()),
        ..SimFaults::default()
    });
    let started = Instant::now();
    let stalled = {
        let h = h.clone();
        std::thread::spawn(move || h.batch_blocking(vec![put(100, 1)]))
    };
    while !log.text().contains(STALLED) {
        assert!(
            !stalled.is_finished(),
            "the write returned after {:?} and the watch said nothing:\n{}",
            started.elapsed(),
            log.text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let warned_after = started.elapsed();
    assert!(
        warned_after >= Duration::from_secs(10),
        "warned after {warned_after:?}, before the threshold"
    );
    assert_eq!(
        stalled.join().expect("writer").expect("put"),
        vec![OpResult::Ok]
    );
    disk.set_faults(SimFaults::default());
    let line = log
        .text()
        .lines()
        .find(|l| l.contains(STALLED))
        .map(str::to_string)
        .expect("the warning");
    for field in ["shard=0", "waiting_answers=1", "stalled_s="] {
        assert!(line.contains(field), "{field} missing: {line}");
    }
    // Once the write returned, the next look says the LSN moves again.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !log.text().contains(MOVING) {
        assert!(
            Instant::now() < deadline,
            "no end of the stall:\n{}",
            log.text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    engine.shutdown().expect("shutdown");
}
