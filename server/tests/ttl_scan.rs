//! Expiry times and SCAN on the native port (protocol version 3), against
//! the real server binary: expiry times survive a restart and expired keys
//! are not returned; a SCAN walk returns every key present for the whole
//! walk while other keys are being inserted; MATCH filters; bad cursors and
//! old-version connections are answered with errors, not misread.

mod common;

use std::collections::HashSet;
use std::io::Write;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use common::*;
use ringkv_client::{
    expiry_time_ms, Client, ClientError, KeyTtl, OpReply, RequestOp, ScanPage, Status,
};
use ringkv_protocol::{
    encode_hello, encode_request, Hello, HelloAck, Request, ServerFrame, PROTOCOL_VERSION,
};

/// Every key of a whole SCAN walk, in the order returned.
async fn walk(c: &Client, count: u32, pattern: &str) -> Vec<Bytes> {
    let mut cursor = 0;
    let mut keys = Vec::new();
    let started = Instant::now();
    loop {
        let ScanPage {
            cursor: next,
            keys: page,
        } = c
            .scan(cursor, count, Bytes::copy_from_slice(pattern.as_bytes()))
            .await
            .expect("scan");
        keys.extend(page);
        if next == 0 {
            return keys;
        }
        assert!(
            started.elapsed() < WAIT,
            "the walk did not finish (cursor {next})"
        );
        cursor = next;
    }
}

fn set(keys: &[Bytes]) -> HashSet<Bytes> {
    keys.iter().cloned().collect()
}

fn now_ms() -> u64 {
    expiry_time_ms(Duration::ZERO)
}

#[test]
fn expiry_times_survive_a_restart_and_expired_keys_stay_gone() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = start_server(dir.path(), &["--shards", "2"]);
    let long_at = now_ms() + 3_600_000;
    let short_at = with_runtime(async {
        let c = connect(server.addr).await;
        assert_eq!(c.protocol_version(), PROTOCOL_VERSION);
        c.put_expiring_at("long", "l", long_at).await.unwrap();
        c.put("plain", "p").await.unwrap();
        c.put("persisted", "x").await.unwrap();
        assert!(c
            .expire_in("persisted", Duration::from_secs(60))
            .await
            .unwrap());
        assert!(c.persist("persisted").await.unwrap());
        assert!(!c
            .expire_in("missing", Duration::from_secs(60))
            .await
            .unwrap());
        assert!(!c.persist("missing").await.unwrap());
        // Already past: the key is deleted.
        c.put("doomed", "d").await.unwrap();
        assert!(c.expire_at("doomed", 1).await.unwrap());
        assert_eq!(c.get("doomed").await.unwrap(), None);

        let KeyTtl::Expires(e) = c.ttl("long").await.unwrap() else {
            panic!("long has an expiry")
        };
        assert_eq!(e.at_ms, long_at);
        assert!(e.left_ms > 3_500_000 && e.left_ms <= 3_600_000, "{e:?}");
        assert_eq!(c.ttl("plain").await.unwrap(), KeyTtl::Persistent);
        assert_eq!(c.ttl("persisted").await.unwrap(), KeyTtl::Persistent);
        assert_eq!(c.ttl("missing").await.unwrap(), KeyTtl::NotFound);

        // A key that expires soon after the restart.
        let short_at = now_ms() + 1_500;
        c.put_expiring_at("short", "s", short_at).await.unwrap();
        assert_eq!(c.get("short").await.unwrap().as_deref(), Some(&b"s"[..]));
        // A plain PUT removes an expiry.
        c.put_expiring_in("reset", "r", Duration::from_secs(60))
            .await
            .unwrap();
        c.put("reset", "r2").await.unwrap();
        assert_eq!(c.ttl("reset").await.unwrap(), KeyTtl::Persistent);
        short_at
    });
    server.terminate();

    let server = start_server(dir.path(), &["--shards", "2"]);
    with_runtime(async {
        let c = connect(server.addr).await;
        let KeyTtl::Expires(e) = c.ttl("long").await.unwrap() else {
            panic!("long lost its expiry in the restart")
        };
        assert_eq!(e.at_ms, long_at);
        assert_eq!(c.get("long").await.unwrap().as_deref(), Some(&b"l"[..]));
        assert_eq!(c.ttl("plain").await.unwrap(), KeyTtl::Persistent);
        assert_eq!(c.ttl("persisted").await.unwrap(), KeyTtl::Persistent);
        assert_eq!(c.get("doomed").await.unwrap(), None);

        let wait = short_at.saturating_sub(now_ms()) + 50;
        tokio::time::sleep(Duration::from_millis(wait)).await;
        assert_eq!(
            c.get("short").await.unwrap(),
            None,
            "an expired key is not read"
        );
        assert_eq!(c.ttl("short").await.unwrap(), KeyTtl::NotFound);
        assert!(!c.expire_in("short", Duration::from_secs(9)).await.unwrap());
        let all = set(&walk(&c, 100, "").await);
        assert!(!all.contains(&Bytes::from_static(b"short")), "{all:?}");
        assert!(all.contains(&Bytes::from_static(b"long")), "{all:?}");

        let stats = c.stats().await.unwrap();
        let stat = |name: &str| -> u64 {
            stats
                .iter()
                .find(|(n, _)| n == name)
                .unwrap_or_else(|| panic!("no {name}"))
                .1
                .parse()
                .unwrap()
        };
        // Counted since this process started.
        assert!(stat("ops.ttl") >= 4, "{stats:?}");
        assert!(stat("ops.expire") >= 1, "{stats:?}");
        assert!(stat("ops.scan") >= 1, "{stats:?}");
        assert_eq!(stat("ops.put_expiring"), 0, "{stats:?}");
    });
}

#[test]
fn a_scan_walk_returns_every_key_present_throughout_despite_inserts() {
    let dir = tempfile::tempdir().unwrap();
    let server = start_server(dir.path(), &["--shards", "2", "--durability", "none"]);
    let addr = server.addr;
    with_runtime(async move {
        let c = connect(addr).await;
        let before: Vec<Bytes> = (0..4_000).map(key).collect();
        for chunk in before.chunks(500) {
            let ops = chunk
                .iter()
                .map(|k| RequestOp::Put {
                    key: k.clone(),
                    value: Bytes::from_static(b"v"),
                })
                .collect();
            for reply in c.batch(ops).await.unwrap() {
                assert_eq!(reply, OpReply::Ok);
            }
        }
        // Grow both shards' tables while the walk runs.
        let writer = tokio::spawn(async move {
            let w = connect(addr).await;
            for round in 0..40u64 {
                let ops = (0..500)
                    .map(|i| RequestOp::Put {
                        key: Bytes::from(format!("new-{round}-{i}")),
                        value: Bytes::from_static(b"n"),
                    })
                    .collect();
                w.batch(ops).await.unwrap();
            }
        });
        let mut seen = HashSet::new();
        let mut cursor = 0;
        let mut steps = 0;
        loop {
            let page = c.scan(cursor, 20, Bytes::new()).await.unwrap();
            seen.extend(page.keys);
            steps += 1;
            if page.cursor == 0 {
                break;
            }
            cursor = page.cursor;
            // Between steps, grow the tables here too (so growth during the
            // walk does not depend on the writer task's timing).
            let ops = (0..50)
                .map(|i| RequestOp::Put {
                    key: Bytes::from(format!("mid-{steps}-{i}")),
                    value: Bytes::from_static(b"m"),
                })
                .collect();
            c.batch(ops).await.unwrap();
        }
        writer.await.unwrap();
        let missing: Vec<&Bytes> = before.iter().filter(|k| !seen.contains(*k)).collect();
        assert!(
            missing.is_empty(),
            "{} keys present for the whole walk were not returned, e.g. {:?}",
            missing.len(),
            &missing[..missing.len().min(5)]
        );
        assert!(steps > 10, "a count of 20 takes many steps, took {steps}");
        // Once quiet, a walk returns exactly the live keys.
        let all = walk(&c, 1000, "").await;
        assert_eq!(all.len(), set(&all).len(), "no key twice in one walk");
        assert_eq!(all.len(), 4_000 + 40 * 500 + (steps - 1) * 50);
    });
}

#[test]
fn scan_match_filters_and_bad_cursors_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let server = start_server(dir.path(), &["--shards", "2", "--durability", "none"]);
    with_runtime(async {
        let c = connect(server.addr).await;
        let mut ops = Vec::new();
        for i in 0..100 {
            ops.push(RequestOp::Put {
                key: Bytes::from(format!("user:{i}")),
                value: Bytes::from_static(b"u"),
            });
        }
        for i in 0..50 {
            ops.push(RequestOp::Put {
                key: Bytes::from(format!("order:{i}")),
                value: Bytes::from_static(b"o"),
            });
        }
        c.batch(ops).await.unwrap();

        let users = walk(&c, 7, "user:*").await;
        assert_eq!(users.len(), 100);
        assert!(users.iter().all(|k| k.starts_with(b"user:")));
        let few = set(&walk(&c, 0, "order:[1-3]").await);
        let expected: HashSet<Bytes> = ["order:1", "order:2", "order:3"]
            .into_iter()
            .map(Bytes::from)
            .collect();
        assert_eq!(few, expected);
        assert!(walk(&c, 1000, "nothing*").await.is_empty());
        assert_eq!(walk(&c, 1000, "").await.len(), 150);

        // A cursor past the last shard, and the largest one.
        for cursor in [2 * 256, u64::MAX] {
            match c.scan(cursor, 10, Bytes::new()).await {
                Err(ClientError::Server { status, message }) => {
                    assert_eq!(status, Status::BadRequest);
                    assert!(message.contains("invalid SCAN cursor"), "{message}");
                }
                other => panic!("cursor {cursor}: {other:?}"),
            }
        }
        // The connection goes on.
        c.ping().await.unwrap();
        // A pattern over the limit is refused before it is sent.
        let long = Bytes::from(vec![b'*'; 257]);
        assert!(matches!(
            c.scan(0, 10, long).await,
            Err(ClientError::Limit(_))
        ));
        // Inside a transaction SCAN and TTL are refused, not run.
        let replies = c
            .batch(vec![
                RequestOp::Begin,
                RequestOp::Ttl {
                    key: Bytes::from_static(b"user:1"),
                },
                RequestOp::Scan {
                    cursor: 0,
                    count: 10,
                    pattern: Bytes::new(),
                },
                RequestOp::Rollback,
            ])
            .await
            .unwrap();
        assert_eq!(replies[1].status(), Status::Unsupported, "{replies:?}");
        assert_eq!(replies[2].status(), Status::Unsupported, "{replies:?}");
        assert_eq!(replies[3], OpReply::Ok);
    });
}

#[test]
fn scan_answers_fit_a_small_frame_limit() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("small.toml");
    std::fs::write(
        &config,
        "[limits]\nframe_bytes_max = \"8KiB\"\nops_per_frame_max = 100\nkey_bytes_max = \"1KiB\"\nvalue_bytes_max = \"1KiB\"\n",
    )
    .unwrap();
    let data = dir.path().join("data");
    let server = start_server(
        &data,
        &["--config", config.to_str().unwrap(), "--shards", "1"],
    );
    with_runtime(async {
        let c = connect(server.addr).await;
        assert_eq!(c.limits().frame_bytes_max, 8192);
        // 600 keys of 400 bytes: 240 KB, far over one frame. A partition
        // (of 256, placed by the keyed table hash, so by chance) must fit
        // one page: 20 such keys do, and 600 keys put that many in one
        // partition with a chance below 1e-8.
        let keys: Vec<Bytes> = (0..600u64)
            .map(|i| {
                let mut k = format!("big-{i:05}-").into_bytes();
                k.resize(400, b'k');
                Bytes::from(k)
            })
            .collect();
        for chunk in keys.chunks(5) {
            let ops = chunk
                .iter()
                .map(|k| RequestOp::Put {
                    key: k.clone(),
                    value: Bytes::from_static(b"v"),
                })
                .collect();
            c.batch(ops).await.unwrap();
        }
        let mut cursor = 0;
        let mut seen = Vec::new();
        let mut steps = 0;
        loop {
            // Asks for far more keys than fit; the server stops in time.
            let page = c.scan(cursor, 100_000, Bytes::new()).await.unwrap();
            let bytes: usize = page.keys.iter().map(|k| 4 + k.len()).sum();
            assert!(bytes + 12 + 6 + 24 <= 8192, "a page of {bytes} bytes");
            seen.extend(page.keys);
            steps += 1;
            if page.cursor == 0 {
                break;
            }
            cursor = page.cursor;
        }
        assert!(steps >= 600 * 404 / 8192, "{steps} steps");
        assert_eq!(set(&seen), set(&keys));
    });
}

#[test]
fn a_version_2_connection_gets_unsupported_for_new_opcodes() {
    let dir = tempfile::tempdir().unwrap();
    let server = start_server(dir.path(), &["--shards", "2"]);
    let mut stream = raw_connect(server.addr);
    let mut out = BytesMut::new();
    encode_hello(
        &Hello {
            version: 2,
            flags: 0,
        },
        &mut out,
    );
    stream.write_all(&out).unwrap();
    let mut conn = RawConn {
        stream,
        buf: BytesMut::new(),
        limits: ringkv_protocol::Limits::default(),
    };
    match conn.read_hello_ack() {
        HelloAck::Accepted {
            version, limits, ..
        } => {
            assert_eq!(version, 2);
            conn.limits = limits;
        }
        refused => panic!("{refused:?}"),
    }
    let ops = vec![
        RequestOp::Put {
            key: Bytes::from_static(b"k"),
            value: Bytes::from_static(b"v"),
        },
        RequestOp::Scan {
            cursor: 0,
            count: 10,
            pattern: Bytes::new(),
        },
    ];
    let mut frame = BytesMut::new();
    encode_request(&Request { id: 41, ops }, &mut frame);
    conn.send_raw(&frame);
    conn.send(
        42,
        vec![RequestOp::Get {
            key: Bytes::from_static(b"k"),
        }],
    );
    let Some(ServerFrame::Error(e)) = conn.read_frame() else {
        panic!("expected an ERROR frame")
    };
    assert_eq!(
        (e.id, e.status, e.close),
        (Some(41), Status::Unsupported, false)
    );
    assert!(
        e.message.contains("SCAN") && e.message.contains("needs protocol version 3"),
        "{}",
        e.message
    );
    // Nothing of the refused request ran, and the connection goes on.
    let Some(ServerFrame::Response(r)) = conn.read_frame() else {
        panic!("expected a response")
    };
    assert_eq!((r.id, r.results.clone()), (42, vec![OpReply::NotFound]));
}
