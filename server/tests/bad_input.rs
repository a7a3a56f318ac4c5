//! Bad input never takes the server down: each misbehaving client gets an
//! error answer or a close, and a normal client is served right after.

mod common;

use std::io::Write;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use common::*;
use ringkv_protocol::{
    decode_hello_ack, encode_hello, encode_request, opcode, HelloAck, Request, RequestOp,
    ServerFrame, Status, FRAME_HEADER_BYTES,
};

fn config(dir: &std::path::Path, extra: &str) -> std::path::PathBuf {
    let path = dir.join("ringkv.toml");
    std::fs::write(
        &path,
        format!("[storage]\nwal_segment_size = \"8MiB\"\n{extra}"),
    )
    .unwrap();
    path
}

fn start(dir: &std::path::Path, extra: &str) -> ServerProcess {
    let cfg = config(dir, extra);
    start_server(
        &dir.join("d"),
        &["--config", cfg.to_str().unwrap(), "--shards", "2"],
    )
}

fn expect_error_frame(conn: &mut RawConn, id: Option<u64>, status: Status, close: bool) {
    match conn.read_frame() {
        Some(ServerFrame::Error(e)) => {
            assert_eq!((e.id, e.status, e.close), (id, status, close), "{e:?}");
            assert!(!e.message.is_empty());
        }
        other => panic!("expected an ERROR frame {status}, got {other:?}"),
    }
}

#[test]
fn garbage_instead_of_a_hello_is_refused_and_closed() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), "");
    let mut s = raw_connect(server.addr);
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut reply = BytesMut::from(&read_to_close(&mut s)[..]);
    match decode_hello_ack(&mut reply) {
        Ok(Some(HelloAck::Refused {
            status, message, ..
        })) => {
            assert_eq!(status, Status::BadRequest);
            assert!(message.contains("magic"), "{message}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    ping_works(server.addr);
}

#[test]
fn unsupported_version_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), "");
    let mut s = raw_connect(server.addr);
    s.write_all(b"RKV1\x09\x00\x00\x00").unwrap();
    let mut reply = BytesMut::from(&read_to_close(&mut s)[..]);
    match decode_hello_ack(&mut reply) {
        Ok(Some(HelloAck::Refused { status, .. })) => assert_eq!(status, Status::Unsupported),
        other => panic!("expected a refusal, got {other:?}"),
    }
    ping_works(server.addr);
}

#[test]
fn huge_length_prefix_gets_frame_too_large_and_a_close() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), "");
    let mut conn = RawConn::open(server.addr);
    conn.send_raw(&u32::MAX.to_le_bytes());
    expect_error_frame(&mut conn, None, Status::FrameTooLarge, true);
    conn.expect_eof();
    ping_works(server.addr);
}

#[test]
fn frame_over_the_configured_limit_is_refused_before_it_is_buffered() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(
        dir.path(),
        "[limits]\nframe_bytes_max = \"64KiB\"\nkey_bytes_max = \"1KiB\"\nvalue_bytes_max = \"16KiB\"\nops_per_frame_max = 100\n",
    );
    let mut conn = RawConn::open(server.addr);
    assert_eq!(conn.limits.frame_bytes_max, 64 * 1024);
    let mut frame = BytesMut::new();
    encode_request(
        &Request {
            id: 1,
            ops: vec![RequestOp::Put {
                key: Bytes::from_static(b"k"),
                value: Bytes::from(vec![0u8; 100 * 1024]),
            }],
        },
        &mut frame,
    );
    // Only the header goes out: the server must refuse on the length alone.
    conn.send_raw(&frame[..FRAME_HEADER_BYTES]);
    expect_error_frame(&mut conn, None, Status::FrameTooLarge, true);
    conn.expect_eof();
    ping_works(server.addr);
}

#[test]
fn unknown_and_reserved_opcodes_are_refused_and_the_connection_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), "");
    let mut conn = RawConn::open(server.addr);
    for (id, code) in [(41u64, 0x7Fu8), (42, 0x14), (43, opcode::SCAN + 1)] {
        // A valid frame around one unknown opcode byte (0x21: reserved for
        // later scan operations).
        let mut frame = BytesMut::new();
        encode_request(
            &Request {
                id,
                ops: vec![RequestOp::Ping],
            },
            &mut frame,
        );
        let last = frame.len() - 1;
        frame[last] = code;
        let crc = crc32(&frame[8..]);
        frame[4..8].copy_from_slice(&crc.to_le_bytes());
        conn.send_raw(&frame);
        expect_error_frame(&mut conn, Some(id), Status::Unsupported, false);
    }
    conn.send(44, vec![RequestOp::Ping]);
    match conn.read_frame() {
        Some(ServerFrame::Response(r)) => assert_eq!(r.id, 44),
        other => panic!("{other:?}"),
    }
    ping_works(server.addr);
}

fn crc32(bytes: &[u8]) -> u32 {
    // CRC-32 (IEEE), bitwise: the test's own implementation, independent of
    // the codec's.
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

#[test]
fn corrupted_frame_gets_checksum_mismatch_and_a_close() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), "");
    let mut conn = RawConn::open(server.addr);
    let mut frame = BytesMut::new();
    encode_request(
        &Request {
            id: 5,
            ops: vec![RequestOp::Get {
                key: Bytes::from_static(b"abc"),
            }],
        },
        &mut frame,
    );
    let last = frame.len() - 1;
    frame[last] ^= 0x40;
    conn.send_raw(&frame);
    expect_error_frame(&mut conn, None, Status::ChecksumMismatch, true);
    conn.expect_eof();
    ping_works(server.addr);
}

#[test]
fn truncated_frame_then_close_does_not_disturb_others() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), "");
    let mut conn = RawConn::open(server.addr);
    let mut frame = BytesMut::new();
    encode_request(
        &Request {
            id: 1,
            ops: vec![RequestOp::Put {
                key: Bytes::from_static(b"t"),
                value: Bytes::from(vec![1u8; 5000]),
            }],
        },
        &mut frame,
    );
    conn.send_raw(&frame[..frame.len() / 2]);
    conn.stream.shutdown(std::net::Shutdown::Write).unwrap();
    // Nothing is answered for half a frame; the server closes its side.
    conn.expect_eof();
    ping_works(server.addr);
    // And the half-sent put was not applied.
    with_runtime(async {
        let c = connect(server.addr).await;
        assert_eq!(c.get("t").await.unwrap(), None);
    });
}

#[test]
fn half_a_frame_then_silence_is_closed_by_the_idle_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "[server]\nidle_timeout = \"1s\"\n");
    let server = start_server(
        &dir.path().join("d"),
        &[
            "--config",
            cfg.to_str().unwrap(),
            "--metrics-listen",
            "127.0.0.1:0",
        ],
    );
    let mut conn = RawConn::open(server.addr);
    let mut frame = BytesMut::new();
    encode_request(
        &Request {
            id: 1,
            ops: vec![RequestOp::Ping],
        },
        &mut frame,
    );
    conn.send_raw(&frame[..10]);
    // The server closes it (our own read timeout is far longer).
    conn.expect_eof();
    ping_works(server.addr);
    // The close is counted just after the socket is shut; poll for it.
    let deadline = Instant::now() + WAIT;
    loop {
        let page = http_get(server.metrics_addr.unwrap(), "/metrics");
        let closed = page
            .lines()
            .find(|l| l.starts_with("ringkv_connections_closed_total{reason=\"idle_timeout\"}"))
            .unwrap_or_else(|| panic!("no idle_timeout counter in {page}"));
        let n: u64 = closed.rsplit(' ').next().unwrap().parse().unwrap();
        if n >= 1 {
            break;
        }
        assert!(Instant::now() < deadline, "{closed}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_client_trickling_one_byte_at_a_time_is_cut_off() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), "[server]\nidle_timeout = \"1s\"\n");
    let mut conn = RawConn::open(server.addr);
    let mut frame = BytesMut::new();
    encode_request(
        &Request {
            id: 1,
            ops: vec![RequestOp::Get {
                key: Bytes::from(vec![b'k'; 200]),
            }],
        },
        &mut frame,
    );
    // One byte every 100 ms keeps bytes moving (never silent for 1 s), but
    // the frame would take 23 s to complete.
    let started = Instant::now();
    let mut cut_off = false;
    for byte in frame.iter() {
        if conn.stream.write_all(&[*byte]).is_err() {
            cut_off = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        if started.elapsed() > Duration::from_secs(15) {
            break;
        }
    }
    if !cut_off {
        // The server may have closed without our write noticing yet.
        conn.stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut b = [0u8; 16];
        let n = std::io::Read::read(&mut conn.stream, &mut b);
        cut_off = match n {
            Ok(0) => true,
            Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
            Ok(_) => false,
        };
    }
    assert!(cut_off, "a trickling client kept its connection for 15 s");
    ping_works(server.addr);
}

fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    use std::io::Read;
    let mut s = raw_connect(addr);
    write!(s, "GET {path} HTTP/1.1\r\nHost: test\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

fn stats_of(addr: std::net::SocketAddr) -> Vec<(String, String)> {
    with_runtime(async move { connect(addr).await.stats().await.unwrap() })
}

#[test]
fn thousands_of_idle_connections_do_not_stop_service() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), "[server]\nmax_connections = 2500\n");
    // 2,000 connections that never say hello (fewer if this process may not
    // open that many descriptors), 200 of which stop right after it.
    let fd_limit = ringkv_server::sockets::raise_open_files_limit(4096).unwrap();
    let count = 2000.min(fd_limit.saturating_sub(200) as usize);
    assert!(
        count >= 500,
        "open-files limit {fd_limit} is too low for this test"
    );
    let mut idle: Vec<std::net::TcpStream> = (0..count).map(|_| raw_connect(server.addr)).collect();
    let mut hello = BytesMut::new();
    encode_hello(&ringkv_protocol::Hello::current(), &mut hello);
    for s in idle.iter_mut().take(200) {
        s.write_all(&hello).unwrap();
    }
    ping_works(server.addr);
    // The server counts them (they are all accepted and open).
    let deadline = Instant::now() + WAIT;
    loop {
        let open: usize = stats_of(server.addr)
            .iter()
            .find(|(k, _)| k == "server.connections")
            .map(|(_, v)| v.parse().unwrap())
            .unwrap();
        if open > count {
            break;
        }
        assert!(Instant::now() < deadline, "only {open} connections open");
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(idle);
    ping_works(server.addr);
}

#[test]
fn a_client_that_never_reads_does_not_block_others() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), "");
    with_runtime(async {
        let c = connect(server.addr).await;
        let ops = (0..1000u64)
            .map(|i| RequestOp::Put {
                key: key(i),
                value: value(i, 1000),
            })
            .collect();
        c.batch(ops).await.unwrap();
    });
    // Pipeline many 1 MB GET answers and never read them.
    let mut greedy = RawConn::open(server.addr);
    let gets: Vec<RequestOp> = (0..1000u64)
        .map(|i| RequestOp::Get { key: key(i) })
        .collect();
    let mut frame = BytesMut::new();
    encode_request(&Request { id: 1, ops: gets }, &mut frame);
    greedy.stream.set_nonblocking(true).unwrap();
    let mut sent = 0usize;
    for _ in 0..64 {
        match greedy.stream.write(&frame) {
            Ok(n) => sent += n,
            Err(_) => break,
        }
    }
    assert!(sent > 0);
    ping_works(server.addr);
}
