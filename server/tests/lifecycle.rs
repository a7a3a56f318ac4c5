//! The process lifecycle: graceful stop on SIGTERM/SIGINT, kill -9 and
//! restart, the data-directory lock, the listening port.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::BytesMut;
use common::*;
use ringkv_client::OpReply;
use ringkv_protocol::{
    decode_hello_ack, encode_hello, Hello, HelloAck, RequestOp, ServerFrame, Status,
};

fn config(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("ringkv.toml");
    std::fs::write(&path, "[storage]\nwal_segment_size = \"8MiB\"\n").unwrap();
    path
}

fn put_range(addr: std::net::SocketAddr, from: u64, to: u64) {
    with_runtime(async move {
        let c = connect(addr).await;
        let ops = (from..to)
            .map(|i| RequestOp::Put {
                key: key(i),
                value: value(i, 200),
            })
            .collect();
        let replies = c.batch(ops).await.unwrap();
        assert!(replies.iter().all(|r| *r == OpReply::Ok));
    });
}

fn check_range(addr: std::net::SocketAddr, from: u64, to: u64) {
    with_runtime(async move {
        let c = connect(addr).await;
        let ops = (from..to).map(|i| RequestOp::Get { key: key(i) }).collect();
        let replies = c.batch(ops).await.unwrap();
        for (offset, r) in replies.into_iter().enumerate() {
            let i = from + offset as u64;
            assert_eq!(r, OpReply::Value(value(i, 200)), "key {i}");
        }
    });
}

#[test]
fn sigterm_stops_gracefully_and_data_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let data = dir.path().join("d");
    let args = ["--config", cfg.to_str().unwrap(), "--shards", "2"];
    let mut server = start_server(&data, &args);
    put_range(server.addr, 0, 3000);
    let status = server.terminate();
    assert!(
        status.success(),
        "exit status {status:?}:\n{}",
        server.log().join("\n")
    );
    server.wait_for_log("ringkv-server stopping");
    server.wait_for_log("ringkv-server stopped");
    // The lock file no longer names a live holder.
    let lock = std::fs::read_to_string(data.join("LOCK")).unwrap_or_default();
    assert!(lock.trim().is_empty(), "LOCK still says {lock:?}");

    let restarted = start_server(&data, &args);
    check_range(restarted.addr, 0, 3000);
}

#[test]
fn sigint_also_stops_gracefully() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = start_server(&dir.path().join("d"), &["--durability", "async"]);
    put_range(server.addr, 0, 10);
    server.signal(libc::SIGINT);
    let status = server.wait_exit();
    assert!(status.success(), "{status:?}");
}

#[test]
fn connected_clients_are_told_the_server_is_shutting_down() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let mut server = start_server(&dir.path().join("d"), &["--config", cfg.to_str().unwrap()]);
    let mut conn = RawConn::open(server.addr);
    conn.send(1, vec![RequestOp::Ping]);
    assert!(matches!(conn.read_frame(), Some(ServerFrame::Response(_))));
    server.signal(libc::SIGTERM);
    match conn.read_frame() {
        Some(ServerFrame::Error(e)) => {
            assert_eq!(
                (e.id, e.status, e.close),
                (None, Status::ShuttingDown, true),
                "{e:?}"
            );
        }
        other => panic!("expected SHUTTING_DOWN, got {other:?}"),
    }
    conn.expect_eof();
    assert!(server.wait_exit().success());
}

#[test]
fn kill_9_keeps_every_acknowledged_sync_write() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let data = dir.path().join("d");
    let args = [
        "--config",
        cfg.to_str().unwrap(),
        "--shards",
        "2",
        "--durability",
        "sync",
    ];
    let mut server = start_server(&data, &args);
    let addr = server.addr;
    // Writers run until the kill; each records how far it was acknowledged.
    let acked: Arc<Vec<AtomicU64>> = Arc::new((0..4).map(|_| AtomicU64::new(0)).collect());
    let writers = {
        let acked = Arc::clone(&acked);
        std::thread::spawn(move || {
            with_runtime(async move {
                let mut tasks = Vec::new();
                for w in 0..4u64 {
                    let acked = Arc::clone(&acked);
                    tasks.push(tokio::spawn(async move {
                        let c = connect(addr).await;
                        let base = w * 1_000_000;
                        let mut next = 0u64;
                        loop {
                            let ops = (next..next + 100)
                                .map(|i| RequestOp::Put {
                                    key: key(base + i),
                                    value: value(base + i, 200),
                                })
                                .collect();
                            match c.batch(ops).await {
                                Ok(replies) if replies.iter().all(|r| *r == OpReply::Ok) => {
                                    next += 100;
                                    acked[w as usize].store(next, Ordering::SeqCst);
                                }
                                _ => return,
                            }
                        }
                    }));
                }
                for t in tasks {
                    let _ = t.await;
                }
            })
        })
    };
    // Let some batches be acknowledged, then kill.
    let deadline = std::time::Instant::now() + WAIT;
    while acked.iter().map(|a| a.load(Ordering::SeqCst)).sum::<u64>() < 2000 {
        assert!(
            std::time::Instant::now() < deadline,
            "writers made no progress"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    server.kill9();
    writers.join().unwrap();
    let counts: Vec<u64> = acked.iter().map(|a| a.load(Ordering::SeqCst)).collect();

    let restarted = start_server(&data, &args);
    for (w, &count) in counts.iter().enumerate() {
        let base = w as u64 * 1_000_000;
        check_range(restarted.addr, base, base + count);
    }
}

#[test]
fn second_server_on_the_same_directory_is_refused_with_the_holders_pid() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let data = dir.path().join("d");
    let first = start_server(&data, &["--config", cfg.to_str().unwrap()]);
    let log = match try_start_server(&data, &["--config", cfg.to_str().unwrap()]) {
        Ok(_) => panic!("a second server started on the same directory"),
        Err(log) => log.join("\n"),
    };
    assert!(log.contains("data directory is in use"), "{log}");
    assert!(log.contains(&format!("pid {}", first.pid())), "{log}");
    // The first one is unaffected.
    ping_works(first.addr);
}

#[test]
fn two_servers_sharing_a_wal_device_directory_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let wal = dir.path().join("wal-disk");
    let path = dir.path().join("ringkv.toml");
    std::fs::write(
        &path,
        format!(
            "[storage]\nwal_segment_size = \"8MiB\"\n[devices.wal]\npath = \"{}\"\nprofile = \"nvme\"\n",
            wal.display()
        ),
    )
    .unwrap();
    let first = start_server(&dir.path().join("a"), &["--config", path.to_str().unwrap()]);
    let log = match try_start_server(&dir.path().join("b"), &["--config", path.to_str().unwrap()]) {
        Ok(_) => panic!("a second server started on the same WAL directory"),
        Err(log) => log.join("\n"),
    };
    assert!(log.contains(&format!("pid {}", first.pid())), "{log}");
    assert!(log.contains("wal-disk"), "{log}");
    ping_works(first.addr);
}

#[test]
fn second_server_on_the_same_port_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let first = start_server(
        &dir.path().join("a"),
        &["--config", cfg.to_str().unwrap(), "--shards", "2"],
    );
    let listen = first.addr.to_string();
    let log = match try_start_server(
        &dir.path().join("b"),
        &[
            "--config",
            cfg.to_str().unwrap(),
            "--shards",
            "2",
            "--listen",
            &listen,
        ],
    ) {
        Ok(_) => panic!("a second server started on the same port"),
        Err(log) => log.join("\n"),
    };
    assert!(log.contains("already in use"), "{log}");
    ping_works(first.addr);
}

#[test]
fn handshake_advertises_the_configured_limits() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ringkv.toml");
    std::fs::write(
        &path,
        "[storage]\nwal_segment_size = \"8MiB\"\n[server]\npipeline_depth_max = 7\n\
         [limits]\nkey_bytes_max = \"100B\"\nvalue_bytes_max = \"2KiB\"\nops_per_frame_max = 50\n\
         frame_bytes_max = \"1MiB\"\n",
    )
    .unwrap();
    let server = start_server(
        &dir.path().join("d"),
        &["--config", path.to_str().unwrap(), "--shards", "2"],
    );
    let mut s = raw_connect(server.addr);
    let mut hello = BytesMut::new();
    encode_hello(&Hello::current(), &mut hello);
    std::io::Write::write_all(&mut s, &hello).unwrap();
    let mut buf = BytesMut::new();
    let ack = loop {
        let mut chunk = [0u8; 1024];
        let n = std::io::Read::read(&mut s, &mut chunk).unwrap();
        assert!(n > 0);
        buf.extend_from_slice(&chunk[..n]);
        if let Some(ack) = decode_hello_ack(&mut buf).unwrap() {
            break ack;
        }
    };
    let HelloAck::Accepted {
        limits,
        server: info,
        ..
    } = ack
    else {
        panic!("{ack:?}")
    };
    assert_eq!(limits.pipeline_depth_max, 7);
    assert_eq!(limits.key_bytes_max, 100);
    assert_eq!(limits.value_bytes_max, 2048);
    assert_eq!(limits.ops_per_frame_max, 50);
    assert_eq!(limits.frame_bytes_max, 1 << 20);
    assert_eq!(info.shard_count, 2);
    assert!(info.server_name.starts_with("ringkv-server"));
}
