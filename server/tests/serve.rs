//! Serving: pipelined batches over many connections, STATS names, the
//! /metrics page, the connection limit.

mod common;

use std::collections::HashSet;
use std::io::{Read, Write};
use std::time::Duration;

use bytes::Bytes;
use common::*;
use ringkv_client::{ClientError, OpReply, RequestOp, Status};

/// A config with small WAL segments so tests start fast.
fn small_config(dir: &std::path::Path, extra: &str) -> std::path::PathBuf {
    let path = dir.join("ringkv.toml");
    std::fs::write(
        &path,
        format!(
            "[storage]\nwal_segment_size = \"8MiB\"\ncheckpoint_wal_bytes = \"64MiB\"\n{extra}"
        ),
    )
    .unwrap();
    path
}

#[test]
fn pipelined_batches_over_sixteen_connections() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = small_config(dir.path(), "");
    let server = start_server(
        &data,
        &["--config", config.to_str().unwrap(), "--shards", "2"],
    );
    let addr = server.addr;
    const CONNECTIONS: u64 = 16;
    const BATCHES: u64 = 4;
    const BATCH: u64 = 1000;
    const VALUE: usize = 100;
    with_runtime(async move {
        let mut tasks = Vec::new();
        for c in 0..CONNECTIONS {
            tasks.push(tokio::spawn(async move {
                let client = std::sync::Arc::new(connect(addr).await);
                // All of this connection's batches in flight at once.
                let mut puts = Vec::new();
                for b in 0..BATCHES {
                    let client = std::sync::Arc::clone(&client);
                    puts.push(tokio::spawn(async move {
                        let base = (c * BATCHES + b) * BATCH;
                        let ops = (base..base + BATCH)
                            .map(|i| RequestOp::Put {
                                key: key(i),
                                value: value(i, VALUE),
                            })
                            .collect();
                        let replies = client.batch(ops).await.expect("put batch");
                        assert_eq!(replies.len(), BATCH as usize);
                        assert!(replies.iter().all(|r| *r == OpReply::Ok), "{replies:?}");
                    }));
                }
                for p in puts {
                    p.await.unwrap();
                }
                // Read everything back, pipelined the same way.
                let mut gets = Vec::new();
                for b in 0..BATCHES {
                    let client = std::sync::Arc::clone(&client);
                    gets.push(tokio::spawn(async move {
                        let base = (c * BATCHES + b) * BATCH;
                        let ops = (base..base + BATCH)
                            .map(|i| RequestOp::Get { key: key(i) })
                            .collect();
                        let replies = client.batch(ops).await.expect("get batch");
                        for (offset, reply) in replies.into_iter().enumerate() {
                            let i = base + offset as u64;
                            assert_eq!(reply, OpReply::Value(value(i, VALUE)), "key {i}");
                        }
                    }));
                }
                for g in gets {
                    g.await.unwrap();
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let client = connect(addr).await;
        let stats: std::collections::HashMap<String, String> =
            client.stats().await.unwrap().into_iter().collect();
        let total = CONNECTIONS * BATCHES * BATCH;
        assert_eq!(stats["ops.put"], total.to_string());
        assert_eq!(stats["ops.get"], total.to_string());
        assert_eq!(stats["engine.keys"], total.to_string());
        // Group commit: a batch of 1,000 puts costs at most one flush per
        // shard it touches (2 shards), never one per put.
        let flushes: u64 = stats["wal.flushes"].parse().unwrap();
        let batches = CONNECTIONS * BATCHES;
        assert!(
            (1..=2 * batches).contains(&flushes),
            "{flushes} flushes for {batches} batches"
        );
    });
}

#[test]
fn mixed_batch_answers_in_order_and_limits_refuse_whole_frames() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config(
        dir.path(),
        "[limits]\nkey_bytes_max = \"16B\"\nvalue_bytes_max = \"64B\"\n",
    );
    let server = start_server(
        &dir.path().join("d"),
        &["--config", config.to_str().unwrap()],
    );
    let mut conn = RawConn::open(server.addr);
    assert_eq!(conn.limits.key_bytes_max, 16);
    conn.send(
        7,
        vec![
            RequestOp::Put {
                key: Bytes::from_static(b"a"),
                value: Bytes::from_static(b"1"),
            },
            RequestOp::Ping,
            RequestOp::Get {
                key: Bytes::from_static(b"a"),
            },
            RequestOp::Delete {
                key: Bytes::from_static(b"zz"),
            },
            RequestOp::Stats,
            RequestOp::Get {
                key: Bytes::from_static(b"a"),
            },
        ],
    );
    let Some(ringkv_protocol::ServerFrame::Response(r)) = conn.read_frame() else {
        panic!("expected a response")
    };
    assert_eq!(r.id, 7);
    assert_eq!(r.results[0], OpReply::Ok);
    assert_eq!(r.results[1], OpReply::Ok);
    assert_eq!(r.results[2], OpReply::Value(Bytes::from_static(b"1")));
    assert_eq!(r.results[3], OpReply::NotFound);
    assert!(matches!(r.results[4], OpReply::Stats(_)));
    assert_eq!(r.results[5], OpReply::Value(Bytes::from_static(b"1")));

    // A key over the advertised 16 bytes: the frame is refused with its id,
    // and the connection goes on.
    conn.send(
        8,
        vec![RequestOp::Get {
            key: Bytes::from_static(b"seventeen-bytes!!"),
        }],
    );
    let Some(ringkv_protocol::ServerFrame::Error(e)) = conn.read_frame() else {
        panic!("expected an ERROR frame")
    };
    assert_eq!(
        (e.id, e.status, e.close),
        (Some(8), Status::KeyTooLarge, false)
    );
    conn.send(
        9,
        vec![RequestOp::Get {
            key: Bytes::from_static(b"a"),
        }],
    );
    let Some(ringkv_protocol::ServerFrame::Response(r)) = conn.read_frame() else {
        panic!("expected a response")
    };
    assert_eq!(
        (r.id, &r.results[..]),
        (9, &[OpReply::Value(Bytes::from_static(b"1"))][..])
    );
}

#[test]
fn stats_has_every_contracted_name() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config(dir.path(), "");
    let server = start_server(
        &dir.path().join("d"),
        &[
            "--config",
            config.to_str().unwrap(),
            "--shards",
            "2",
            "--device-profile",
            "nvme",
        ],
    );
    with_runtime(async move {
        let c = connect(server.addr).await;
        c.put("k", "v").await.unwrap();
        let stats = c.stats().await.unwrap();
        let names: HashSet<&str> = stats.iter().map(|(n, _)| n.as_str()).collect();
        let mut expected = vec![
            "server.version",
            "server.backend",
            "server.durability",
            "server.tier",
            "server.shards",
            "server.uptime_s",
            "server.connections",
            "ops.put",
            "ops.get",
            "ops.delete",
            "engine.keys",
            "engine.memory_bytes",
            "wal.bytes_written",
            "wal.flushes",
            "wal.fsync_p99_us",
        ]
        .into_iter()
        .map(String::from)
        .collect::<Vec<_>>();
        for key in [
            "profile",
            "iops_limit",
            "burst_iops",
            "ios",
            "reads",
            "writes",
            "syncs",
            "bytes_read",
            "bytes_written",
            "token_wait_us",
            "fsync_p99_us",
            "credit",
        ] {
            expected.push(format!("device.wal.{key}"));
        }
        for shard in 0..2 {
            for key in ["keys", "wal_bytes", "durable_lsn", "poisoned"] {
                expected.push(format!("shard.{shard}.{key}"));
            }
        }
        for name in &expected {
            assert!(
                names.contains(name.as_str()),
                "STATS lacks {name}: {stats:?}"
            );
        }
        let get = |n: &str| {
            stats
                .iter()
                .find(|(k, _)| k == n)
                .map(|(_, v)| v.clone())
                .unwrap()
        };
        assert_eq!(get("device.wal.profile"), "nvme");
        assert_eq!(get("device.wal.iops_limit"), "6500");
        assert_eq!(get("server.shards"), "2");
        assert_eq!(get("engine.keys"), "1");
        assert!(["uring", "fallback"].contains(&get("server.backend").as_str()));
    });
}

fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    let mut s = raw_connect(addr);
    write!(s, "GET {path} HTTP/1.1\r\nHost: test\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[test]
fn metrics_endpoint_serves_prometheus_text_with_device_labels() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config(dir.path(), "");
    let server = start_server(
        &dir.path().join("d"),
        &[
            "--config",
            config.to_str().unwrap(),
            "--shards",
            "2",
            "--metrics-listen",
            "127.0.0.1:0",
            "--device-profile",
            "sas",
        ],
    );
    let metrics = server
        .metrics_addr
        .expect("metrics address in the ready line");
    with_runtime(async {
        let c = connect(server.addr).await;
        c.put("k", "v").await.unwrap();
        assert!(c.get("missing").await.unwrap().is_none());
    });
    let page = http_get(metrics, "/metrics");
    assert!(page.starts_with("HTTP/1.1 200 OK\r\n"), "{page}");
    assert!(
        page.contains("Content-Type: text/plain; version=0.0.4"),
        "{page}"
    );
    let body = page.split("\r\n\r\n").nth(1).unwrap();
    for needle in [
        "# TYPE ringkv_ops_total counter",
        "ringkv_ops_total{op=\"put\",status=\"OK\"} 1",
        "ringkv_ops_total{op=\"get\",status=\"NOT_FOUND\"} 1",
        "# TYPE ringkv_batch_latency_seconds histogram",
        "ringkv_batch_latency_seconds_bucket{le=\"+Inf\"}",
        "# TYPE ringkv_wal_fdatasync_seconds histogram",
        "# TYPE ringkv_wal_flush_bytes histogram",
        "# TYPE ringkv_wal_group_commit_records histogram",
        "ringkv_shard_queue_depth{shard=\"1\"}",
        "ringkv_recovery_duration_seconds{shard=\"0\"}",
        "ringkv_device_ios_total{device=\"wal\",profile=\"sas\"}",
        "ringkv_device_iops_limit{device=\"wal\",profile=\"sas\"} 1800",
        "ringkv_device_token_wait_seconds_total{device=\"wal\",profile=\"sas\"}",
        "ringkv_device_burst_credit{device=\"wal\",profile=\"sas\"}",
        "ringkv_device_fsync_seconds_bucket{device=\"wal\",profile=\"sas\",le=\"+Inf\"}",
        "# TYPE ringkv_connections_open gauge",
        "ringkv_connections_accepted_total ",
        // The process's own, under the names every exporter uses.
        "# TYPE process_cpu_seconds_total counter",
        "# TYPE process_resident_memory_bytes gauge",
        "# TYPE process_virtual_memory_bytes gauge",
        "# TYPE process_start_time_seconds gauge",
        "# TYPE process_open_fds gauge",
        "# TYPE process_max_fds gauge",
    ] {
        assert!(body.contains(needle), "missing {needle:?} in:\n{body}");
    }
    let sample = |name: &str| -> f64 {
        body.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("no {name} sample"))
            .parse()
            .unwrap()
    };
    assert!(sample("process_resident_memory_bytes") > 1e6);
    assert!(sample("process_open_fds") >= 3.0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let started = sample("process_start_time_seconds");
    assert!(
        started <= now + 1.0 && started > now - 600.0,
        "{started} vs {now}"
    );
    let info = body
        .lines()
        .find(|l| l.starts_with("ringkv_info{"))
        .expect("ringkv_info sample");
    assert!(info.contains("tier=\"memory\""), "{info}");
    // Every sample line is `name{labels} value` or `name value`.
    for line in body.lines().filter(|l| !l.starts_with('#')) {
        let value = line.rsplit(' ').next().unwrap();
        assert!(
            value.parse::<f64>().is_ok() || value == "+Inf",
            "bad sample {line:?}"
        );
    }
    let missing = http_get(metrics, "/");
    assert!(missing.starts_with("HTTP/1.1 404 "), "{missing}");
}

#[test]
fn connections_over_the_limit_are_refused_with_overloaded() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config(dir.path(), "");
    let server = start_server(
        &dir.path().join("d"),
        &[
            "--config",
            config.to_str().unwrap(),
            "--max-connections",
            "3",
        ],
    );
    let held: Vec<RawConn> = (0..3).map(|_| RawConn::open(server.addr)).collect();
    let addr = server.addr;
    with_runtime(async move {
        match ringkv_client::Client::connect_timeout(addr, WAIT).await {
            Err(ClientError::Refused {
                status, message, ..
            }) => {
                assert_eq!(status, Status::Overloaded);
                assert!(message.contains("too many connections"), "{message}");
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
    });
    drop(held);
    // Slots come back once those connections close.
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let ok = with_runtime(async move {
            match ringkv_client::Client::connect_timeout(addr, WAIT).await {
                Ok(c) => c.ping().await.is_ok(),
                Err(ClientError::Refused { .. }) => false,
                Err(e) => panic!("{e}"),
            }
        });
        if ok {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "slots never came back"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
