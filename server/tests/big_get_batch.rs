//! One request of many GETs of large values: the server's memory stays
//! bounded by what the response can carry (docs/protocol.md, "Memory per
//! request"), the values that do not fit answer FRAME_TOO_LARGE with a
//! message, and a small request from another client is answered promptly
//! meanwhile (measured; asserted only against a generous bound).

mod common;

use common::*;
use ringkv_protocol::{OpReply, RequestOp, ServerFrame, Status};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const VALUE_BYTES: usize = 1_000_000;
const KEYS: u64 = 16;
const GETS: u64 = 3_000;

fn status_kib(pid: u32, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    text.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("{field} missing"))
}

#[test]
fn a_huge_get_batch_takes_bounded_memory_and_does_not_starve_others() {
    let dir = tempfile::tempdir().unwrap();
    let server = start_server(dir.path(), &["--durability", "async"]);
    let pid = server.pid();
    let mut a = RawConn::open(server.addr);
    let frame_max = a.limits.frame_bytes_max as usize;
    for chunk in 0..KEYS / 4 {
        let ops = (chunk * 4..chunk * 4 + 4)
            .map(|i| RequestOp::Put {
                key: key(i),
                value: value(i, VALUE_BYTES),
            })
            .collect();
        a.send(chunk, ops);
        assert!(matches!(a.read_frame(), Some(ServerFrame::Response(_))));
    }
    let rss_before_kib = status_kib(pid, "VmRSS:");

    // Another client pings in a loop while the big request runs.
    let done = Arc::new(AtomicBool::new(false));
    let pinger = {
        let done = Arc::clone(&done);
        let addr = server.addr;
        std::thread::spawn(move || {
            let mut b = RawConn::open(addr);
            let mut worst = Duration::ZERO;
            let mut id = 0;
            while !done.load(Ordering::Relaxed) {
                id += 1;
                let sent = Instant::now();
                b.send(id, vec![RequestOp::Ping, RequestOp::Get { key: key(999) }]);
                match b.read_frame() {
                    Some(ServerFrame::Response(r)) => assert_eq!(r.id, id),
                    other => panic!("ping answered {other:?}"),
                }
                worst = worst.max(sent.elapsed());
                std::thread::sleep(Duration::from_millis(5));
            }
            (worst, id)
        })
    };

    let started = Instant::now();
    let ops = (0..GETS)
        .map(|i| RequestOp::Get { key: key(i % KEYS) })
        .collect();
    a.send(100, ops);
    let response = match a.read_frame() {
        Some(ServerFrame::Response(r)) => r,
        other => panic!("big batch answered {other:?}"),
    };
    let big_ms = started.elapsed().as_millis();
    done.store(true, Ordering::Relaxed);
    let (worst_ping, pings) = pinger.join().expect("pinger");
    let hwm_kib = status_kib(pid, "VmHWM:");

    assert_eq!(response.results.len(), GETS as usize);
    assert!(response.encoded_len() <= frame_max);
    let values = response
        .results
        .iter()
        .filter(|r| matches!(r, OpReply::Value(_)))
        .count();
    assert!(
        values > 0 && values * VALUE_BYTES <= frame_max,
        "{values} values"
    );
    for r in &response.results {
        match r {
            OpReply::Value(v) => assert_eq!(v.len(), VALUE_BYTES),
            OpReply::Error { status, message } => {
                assert_eq!(*status, Status::FrameTooLarge);
                assert!(!message.is_empty(), "an error always comes with a message");
            }
            other => panic!("unexpected result {other:?}"),
        }
    }
    let grew_mib = hwm_kib.saturating_sub(rss_before_kib) / 1024;
    eprintln!(
        "{GETS} GETs of {VALUE_BYTES} B values: answered in {big_ms} ms with {values} values; \
         server peak RSS {} MiB over {} MiB before; {pings} pings meanwhile, slowest {} ms",
        grew_mib,
        rss_before_kib / 1024,
        worst_ping.as_millis()
    );
    // Bound (docs/protocol.md): per shard one frame of values plus one
    // value, the response and its encoding: about 4 frames; 256 MiB is
    // generous. Without the bound this request reads ~3 GB.
    assert!(
        grew_mib <= 256,
        "server RSS grew by {grew_mib} MiB for one request"
    );
    assert!(
        worst_ping < Duration::from_secs(5),
        "a small request waited {worst_ping:?} behind the big batch"
    );
}
