//! `storage.max_memory` against the real binary: filled to the limit over
//! the native port, writes that would grow memory answer OUT_OF_MEMORY
//! there and Redis's `-OOM` on RESP, reads, deletes and smaller overwrites
//! still work, INFO, CONFIG GET and STATS report used vs limit, a restart
//! keeps every acknowledged write; and the process's resident memory stays
//! within the limit plus the overhead `docs/operations.md` states while a
//! client tries to write three times the limit.

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;

use bytes::Bytes;
use common::resp::{start_with_resp, RespConn as Resp};
use common::*;
use ringkv_protocol::resp::Reply;
use ringkv_protocol::{OpReply, RequestOp, Status};

const OOM: &str = "OOM command not allowed when used memory > 'maxmemory'.";

fn write_config(dir: &Path, max_memory: &str, durability: &str) -> std::path::PathBuf {
    let path = dir.join("ringkv.toml");
    std::fs::write(
        &path,
        format!(
            "[storage]\ndurability = \"{durability}\"\nwal_segment_size = \"8MiB\"\ncheckpoint_wal_bytes = \"16MiB\"\nmax_memory = \"{max_memory}\"\n[limits]\nvalue_bytes_max = \"64KiB\"\nframe_bytes_max = \"1MiB\"\nops_per_frame_max = 200\n"
        ),
    )
    .unwrap();
    path
}

fn start(dir: &Path, config: &Path) -> (ServerProcess, SocketAddr) {
    start_with_resp(
        dir,
        &["--config", config.to_str().unwrap(), "--shards", "2"],
    )
}

impl Resp {
    /// One field of INFO's text.
    fn info_field(&mut self, section: &str, name: &str) -> u64 {
        let text = match self.call(&format!("INFO {section}")) {
            Reply::Bulk(b) => String::from_utf8(b.to_vec()).expect("utf-8"),
            Reply::Verbatim(_, text) => String::from_utf8(text.to_vec()).expect("utf-8"),
            other => panic!("INFO: {other:?}"),
        };
        let prefix = format!("{name}:");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .unwrap_or_else(|| panic!("no {name} in {text}"))
            .trim()
            .parse()
            .expect("a number")
    }
}

/// Puts keys `from..` (`len`-byte values) over the native port, 32 per
/// batch, until `refusals_wanted` were refused or `bytes_max` bytes of
/// values were sent. Returns the acknowledged keys and the refused ones.
fn fill(
    addr: SocketAddr,
    from: u64,
    len: usize,
    refusals_wanted: usize,
    bytes_max: u64,
) -> (BTreeMap<u64, Bytes>, Vec<u64>) {
    with_runtime(async move {
        let c = connect(addr).await;
        let mut acked = BTreeMap::new();
        let mut refused = Vec::new();
        let mut i = from;
        while refused.len() < refusals_wanted && (i - from) * (len as u64) < bytes_max {
            let ids: Vec<u64> = (i..i + 32).collect();
            i += 32;
            let ops = ids
                .iter()
                .map(|&k| RequestOp::Put {
                    key: key(k),
                    value: value(k, len),
                })
                .collect();
            for (&k, reply) in ids.iter().zip(c.batch(ops).await.expect("batch")) {
                match reply {
                    OpReply::Ok => {
                        acked.insert(k, value(k, len));
                    }
                    OpReply::Error { status, message } => {
                        assert_eq!(status, Status::OutOfMemory, "{message}");
                        assert!(message.contains("storage.max_memory"), "{message}");
                        refused.push(k);
                    }
                    other => panic!("put {k}: {other:?}"),
                }
            }
        }
        (acked, refused)
    })
}

fn check(addr: SocketAddr, model: &BTreeMap<u64, Bytes>, absent: &[u64]) {
    with_runtime(async {
        let c = connect(addr).await;
        for (k, v) in model {
            assert_eq!(
                c.get(key(*k)).await.expect("get").as_ref(),
                Some(v),
                "key {k}"
            );
        }
        for k in absent {
            assert_eq!(c.get(key(*k)).await.expect("get"), None, "key {k}");
        }
    });
}

fn stat(addr: SocketAddr, name: &str) -> u64 {
    with_runtime(async {
        let c = connect(addr).await;
        let stats = c.stats().await.expect("stats");
        stats
            .iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("no {name} in STATS"))
            .1
            .parse()
            .expect("a number")
    })
}

#[test]
fn writes_past_the_limit_answer_oom_on_both_ports_and_the_rest_works() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "4MiB", "sync");
    let (mut server, resp) = start(dir.path(), &config);
    let addr = server.addr;

    let (mut model, refused) = fill(addr, 0, 4000, 64, 64 << 20);
    assert!(
        refused.len() >= 64,
        "no write was refused after {} acknowledged ones",
        model.len()
    );
    let mut c = Resp::connect(resp);
    let big = vec![b'z'; 20_000];
    assert_eq!(
        c.call_args(&[b"SET", b"resp-new", &big]),
        Reply::Error(OOM.to_string())
    );
    assert_eq!(c.call("GET resp-new"), Reply::Null);
    // A read, a smaller overwrite and a delete still work at the limit.
    let (&k0, v0) = model.iter().next().unwrap();
    let k0s = String::from_utf8(key(k0).to_vec()).unwrap();
    assert_eq!(c.call(&format!("GET {k0s}")), Reply::Bulk(v0.clone()));
    assert_eq!(
        c.call(&format!("SET {k0s} short")),
        Reply::Simple("OK".into())
    );
    model.insert(k0, Bytes::from_static(b"short"));
    let (&k1, _) = model.iter().nth(1).unwrap();
    let k1s = String::from_utf8(key(k1).to_vec()).unwrap();
    assert_eq!(c.call(&format!("DEL {k1s}")), Reply::Int(1));
    model.remove(&k1);
    // A read-modify-write that grows its value is refused too.
    let (&k2, v2) = model.iter().nth(2).unwrap();
    let k2s = String::from_utf8(key(k2).to_vec()).unwrap();
    assert_eq!(
        c.call_args(&[b"APPEND", k2s.as_bytes(), &big]),
        Reply::Error(OOM.to_string())
    );
    assert_eq!(c.call(&format!("GET {k2s}")), Reply::Bulk(v2.clone()));
    // A MULTI/EXEC whose write does not fit: -OOM, nothing applied.
    assert_eq!(c.call("MULTI"), Reply::Simple("OK".into()));
    assert_eq!(
        c.call_args(&[b"SET", b"exec-new", &big]),
        Reply::Simple("QUEUED".into())
    );
    assert_eq!(c.call("EXEC"), Reply::Error(OOM.to_string()));
    assert_eq!(c.call("GET exec-new"), Reply::Null);

    // Used vs limit, in INFO, CONFIG GET and STATS.
    let limit = 4u64 << 20;
    assert_eq!(c.info_field("memory", "maxmemory"), limit);
    let used = c.info_field("memory", "used_memory");
    assert!(
        used <= limit && used > limit - 2 * 8200,
        "used_memory {used}"
    );
    assert!(c.info_field("persistence", "rdb_changes_since_last_save") > 0);
    assert_eq!(
        c.call("CONFIG GET maxmemory"),
        Reply::Array(vec![
            Reply::Bulk(Bytes::from_static(b"maxmemory")),
            Reply::Bulk(Bytes::from(limit.to_string())),
        ])
    );
    assert_eq!(stat(addr, "engine.memory_bytes_max"), limit);
    // The fill's refusals, SET, APPEND and EXEC.
    assert_eq!(stat(addr, "engine.oom_refusals"), refused.len() as u64 + 3);
    check(addr, &model, &refused);

    // A restart keeps everything acknowledged, nothing refused.
    server.terminate();
    let (server, resp) = start(dir.path(), &config);
    check(server.addr, &model, &refused);
    let mut c = Resp::connect(resp);
    assert_eq!(c.call("GET resp-new"), Reply::Null);
    assert_eq!(c.call("GET exec-new"), Reply::Null);
}

#[test]
fn hybrid_tier_refuses_index_growth_at_the_limit_on_both_ports() {
    let dir = tempfile::tempdir().unwrap();
    let hybrid = |name: &str, max: u64| {
        let sub = dir.path().join(name);
        std::fs::create_dir_all(&sub).unwrap();
        let path = sub.join("ringkv.toml");
        std::fs::write(
            &path,
            format!(
                "[storage]\ntier = \"hybrid\"\ncache_bytes = \"64KiB\"\nindex_keys = 1024\nvalue_segment_size = \"1MiB\"\nwal_segment_size = \"8MiB\"\nmax_memory = \"{max}B\"\n[limits]\nvalue_bytes_max = \"64KiB\"\nframe_bytes_max = \"1MiB\"\nops_per_frame_max = 200\n"
            ),
        )
        .unwrap();
        (sub, path)
    };
    // What the empty tier holds (its fixed index and buffers, and its
    // caches counted full), from a server without a limit; then a limit
    // 100 spilled keys per shard above that.
    let empty = {
        let (sub, config) = hybrid("probe", 0);
        let (mut server, _) = start(&sub, &config);
        let empty = stat(server.addr, "engine.memory_bytes");
        server.terminate();
        empty
    };
    let limit = empty + 2 * 100 * 40;
    let (sub, config) = hybrid("data", limit);
    let (mut server, resp) = start(&sub, &config);
    let addr = server.addr;
    assert_eq!(stat(addr, "engine.memory_bytes_max"), limit / 2 * 2);

    let (mut model, refused) = fill(addr, 0, 300, 32, 64 << 20);
    assert!(
        refused.len() >= 32,
        "no write was refused after {} acknowledged ones",
        model.len()
    );
    // The tier's own counters are published by each shard's background
    // task (at least every 100 ms), so they may lag the last writes.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while stat(addr, "tier.spilled_keys") == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the limit bit before the index spilled"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(stat(addr, "engine.memory_bytes") <= limit);
    let mut c = Resp::connect(resp);
    // Every put into a full index partition counts as growth; find a key
    // whose partition is full (the refused ones are).
    let r0 = String::from_utf8(key(refused[0]).to_vec()).unwrap();
    assert_eq!(
        c.call(&format!("SET {r0} v")),
        Reply::Error(OOM.to_string())
    );
    let (&k0, v0) = model.iter().next().unwrap();
    let k0s = String::from_utf8(key(k0).to_vec()).unwrap();
    assert_eq!(c.call(&format!("GET {k0s}")), Reply::Bulk(v0.clone()));
    // Deletes work (one over RESP, half the keys over the native port)
    // and empty the full partitions: writes go in again.
    assert_eq!(c.call(&format!("DEL {k0s}")), Reply::Int(1));
    model.remove(&k0);
    let gone: Vec<u64> = model.keys().copied().step_by(2).collect();
    with_runtime(async {
        let n = connect(addr).await;
        for chunk in gone.chunks(100) {
            let ops = chunk
                .iter()
                .map(|&k| RequestOp::Delete { key: key(k) })
                .collect();
            for reply in n.batch(ops).await.expect("batch") {
                assert_eq!(reply, OpReply::Ok);
            }
        }
    });
    for k in &gone {
        model.remove(k);
    }
    let (room, _) = fill(addr, 1_000_000, 300, usize::MAX, 64 * 300);
    assert!(
        room.len() >= 32,
        "{} of 64 writes after the deletes",
        room.len()
    );
    model.extend(room);
    check(addr, &model, &refused);

    server.terminate();
    let (server, _) = start(&sub, &config);
    check(server.addr, &model, &refused);
    check(server.addr, &BTreeMap::new(), &gone);
}

/// VmRSS of process `pid`, in bytes.
fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .expect("VmRSS")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .expect("kB");
    kib * 1024
}

#[test]
fn resident_memory_stays_within_the_limit_plus_the_stated_overhead() {
    let dir = tempfile::tempdir().unwrap();
    let limit: u64 = 64 << 20;
    let config = write_config(dir.path(), "64MiB", "async");
    let (server, _resp) = start(dir.path(), &config);
    let addr = server.addr;
    // The process before any data: code, shard threads and runtimes, WAL
    // buffers, one connection's buffers once it has sent a batch.
    let (warm, _) = fill(addr, 10_000_000, 16 * 1024, 1, 64 * 16 * 1024);
    let base = rss_bytes(server.pid());
    // Try to write three times the limit.
    let (acked, refused) = fill(addr, 0, 16 * 1024, usize::MAX, 3 * limit);
    let keys = (acked.len() + warm.len()) as u64;
    let rss = rss_bytes(server.pid());
    // docs/operations.md, "Memory limit": the tier's own count stays under
    // the limit; the allocator's headers and fragmentation (one arena per
    // shard thread, values freed and reallocated by refused writes and
    // checkpoints) add up to half of it; transient buffers (connection
    // frames, checkpoint chunks, WAL buffers) stay under 16 MiB here.
    let bound = base + limit + limit / 2 + 32 * keys + (16 << 20);
    assert!(
        rss <= bound,
        "RSS {} MiB over the bound {} MiB (before the data {} MiB, {} keys, {} refused)",
        rss >> 20,
        bound >> 20,
        base >> 20,
        keys,
        refused.len()
    );
    assert!(!refused.is_empty(), "nothing was refused");
    // And the limit was reached, not just approached.
    assert!(
        stat(addr, "engine.memory_bytes") > limit - 2 * 17 * 1024,
        "the tier did not fill"
    );
}
