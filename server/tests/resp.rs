//! The RESP listener end to end, against the real binary: commands across
//! shards with Redis's reply types, pipelining order, atomic
//! read-modify-writes under concurrent clients, RESP3 after HELLO 3,
//! protocol errors (Redis's text, then close) that never take the server
//! down, a client that never reads its replies, acknowledged writes
//! that survive kill -9, and the expiry commands (their replies, errors,
//! and expiry times that survive kill -9).

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use common::resp::{bulk, err, ok, start_with_resp, RespConn as Resp};
use common::*;
use ringkv_protocol::resp::Reply;

fn small_config(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("ringkv.toml");
    std::fs::write(
        &path,
        "[storage]\nwal_segment_size = \"8MiB\"\ncheckpoint_wal_bytes = \"64MiB\"\n[limits]\nvalue_bytes_max = \"64KiB\"\nframe_bytes_max = \"1MiB\"\nops_per_frame_max = 200\n",
    )
    .unwrap();
    path
}

/// Starts a server with a RESP listener; returns it and the RESP address.
fn start(dir: &std::path::Path, extra: &[&str]) -> (ServerProcess, SocketAddr) {
    let config = small_config(dir);
    start_with_config(dir, &config, extra)
}

/// [`start`] with the configuration file `config`.
fn start_with_config(
    dir: &std::path::Path,
    config: &std::path::Path,
    extra: &[&str],
) -> (ServerProcess, SocketAddr) {
    let mut args = vec!["--config", config.to_str().unwrap()];
    args.extend_from_slice(extra);
    start_with_resp(dir, &args)
}

#[test]
fn string_commands_across_shards() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, addr) = start(dir.path(), &["--shards", "3"]);
    let mut c = Resp::connect(addr);
    assert_eq!(c.call("PING"), Reply::Simple("PONG".into()));
    assert_eq!(c.call("SET a 1"), ok());
    assert_eq!(c.call("GET a"), bulk("1"));
    assert_eq!(c.call("GET nothing"), Reply::Null);
    assert_eq!(c.call("INCR a"), Reply::Int(2));
    assert_eq!(c.call("INCRBY a 10"), Reply::Int(12));
    assert_eq!(c.call("DECR a"), Reply::Int(11));
    assert_eq!(c.call("DECRBY a 20"), Reply::Int(-9));
    assert_eq!(c.call("INCRBYFLOAT f 1.5"), bulk("1.5"));
    assert_eq!(c.call("INCRBYFLOAT f 0.25"), bulk("1.75"));
    assert_eq!(c.call("APPEND s hello"), Reply::Int(5));
    assert_eq!(c.call("APPEND s _world"), Reply::Int(11));
    assert_eq!(c.call("STRLEN s"), Reply::Int(11));
    assert_eq!(c.call("GETRANGE s 0 4"), bulk("hello"));
    assert_eq!(c.call("GETRANGE s -5 -1"), bulk("world"));
    assert_eq!(c.call("SETRANGE s 0 J"), Reply::Int(11));
    assert_eq!(c.call("GET s"), bulk("Jello_world"));
    assert_eq!(c.call("SETNX s x"), Reply::Int(0));
    assert_eq!(c.call("SETNX n x"), Reply::Int(1));
    assert_eq!(c.call("SET n y NX"), Reply::Null);
    assert_eq!(c.call("SET n y XX GET"), bulk("x"));
    assert_eq!(c.call("SET missing y XX"), Reply::Null);
    assert_eq!(c.call("GETSET n z"), bulk("y"));
    assert_eq!(c.call("GETDEL n"), bulk("z"));
    assert_eq!(c.call("GETDEL n"), Reply::Null);
    assert_eq!(c.call("MSET k1 v1 k2 v2 k3 v3 k4 v4"), ok());
    assert_eq!(
        c.call("MGET k1 nope k4 k2"),
        Reply::Array(vec![bulk("v1"), Reply::Null, bulk("v4"), bulk("v2")])
    );
    assert_eq!(c.call("EXISTS k1 k2 nope k1"), Reply::Int(3));
    assert_eq!(c.call("DEL k1 k2 nope"), Reply::Int(2));
    assert_eq!(c.call("UNLINK k3 k1"), Reply::Int(1));
    assert_eq!(c.call("TYPE k4"), Reply::Simple("string".into()));
    assert_eq!(c.call("TYPE k1"), Reply::Simple("none".into()));
    // a, f, s, k4
    assert_eq!(c.call("DBSIZE"), Reply::Int(4));
    assert_eq!(c.call("SET a notanumber"), ok());
    assert_eq!(
        c.call("INCR a"),
        err("ERR value is not an integer or out of range")
    );
    assert_eq!(c.call("SET big 9223372036854775807"), ok());
    assert_eq!(
        c.call("INCR big"),
        err("ERR increment or decrement would overflow")
    );
    assert_eq!(
        c.call("NOSUCH x"),
        err("ERR unknown command 'NOSUCH', with args beginning with: 'x' ")
    );
    assert_eq!(
        c.call("GET"),
        err("ERR wrong number of arguments for 'get' command")
    );
    assert_eq!(c.call("SELECT 0"), ok());
    assert_eq!(c.call("SELECT 1"), err("ERR DB index is out of range"));
    assert!(
        matches!(c.call("AUTH pw"), Reply::Error(e) if e.starts_with("ERR AUTH <password> called without any password configured"))
    );
    assert_eq!(c.call("CLIENT SETNAME me"), ok());
    assert_eq!(c.call("CLIENT GETNAME"), bulk("me"));
    assert!(matches!(c.call("CLIENT ID"), Reply::Int(id) if id > 0));
    assert_eq!(c.call("ECHO hi"), bulk("hi"));
    // Values too large for the configured limit: refused, nothing stored.
    let big = "x".repeat(40 * 1024);
    assert_eq!(c.call(&format!("SET b {big}")), ok());
    assert!(
        matches!(c.call(&format!("APPEND b {big}")), Reply::Error(e) if e.starts_with("ERR string exceeds maximum allowed size"))
    );
    assert_eq!(c.call("STRLEN b"), Reply::Int(40 * 1024));
    assert_eq!(
        c.call("CONFIG GET appendfsync"),
        Reply::Array(vec![bulk("appendfsync"), bulk("always")])
    );
    let Reply::Bulk(info) = c.call("INFO") else {
        panic!("INFO is a bulk string in RESP2")
    };
    let info = String::from_utf8_lossy(&info).into_owned();
    for field in [
        "redis_version:",
        "ringkv_version:",
        "arch_bits:64",
        "cluster_enabled:0",
        "db0:keys=6",
        "# Ringkv",
        "ringkv_tier:memory",
    ] {
        assert!(info.contains(field), "INFO lacks {field}:\n{info}");
    }
    assert_eq!(c.call("QUIT"), ok());
    assert_eq!(c.read(), None);
}

#[test]
fn resp3_after_hello_3() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, addr) = start(dir.path(), &["--shards", "2"]);
    let mut c = Resp::connect(addr);
    c.send_raw(b"GET nothing\r\n");
    c.send_raw(b"HELLO 3\r\nGET nothing\r\nCONFIG GET appendonly\r\n");
    c.send_raw(b"HELLO 2\r\nGET nothing\r\n");
    let mut raw = Vec::new();
    // Read the five replies' bytes raw to check the wire types.
    while raw.windows(5).filter(|w| *w == b"$-1\r\n").count() < 2 {
        let mut chunk = [0u8; 4096];
        let n = c.stream.read(&mut chunk).unwrap();
        assert!(n > 0);
        raw.extend_from_slice(&chunk[..n]);
    }
    let text = String::from_utf8_lossy(&raw);
    assert!(text.starts_with("$-1\r\n%7\r\n"), "{text}");
    assert!(text.contains("$5\r\nproto\r\n:3\r\n"), "{text}");
    assert!(
        text.contains("_\r\n%1\r\n$10\r\nappendonly\r\n$3\r\nyes\r\n*14\r\n"),
        "{text}"
    );
    assert!(text.ends_with("$-1\r\n"), "{text}");
}

#[test]
fn pipelined_commands_answer_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, addr) = start(dir.path(), &["--shards", "4"]);
    let mut c = Resp::connect(addr);
    const N: usize = 3000;
    let mut out = Vec::new();
    for i in 0..N {
        // Each key is written, incremented and read back in one pipeline;
        // the keys spread over every shard.
        out.extend_from_slice(
            format!("SET k{i} {i}\r\nINCR k{i}\r\nGET k{i}\r\nPING p{i}\r\n").as_bytes(),
        );
    }
    c.send_raw(&out);
    for i in 0..N {
        assert_eq!(c.read(), Some(ok()), "SET {i}");
        assert_eq!(c.read(), Some(Reply::Int(i as i64 + 1)), "INCR {i}");
        assert_eq!(c.read(), Some(bulk(&(i + 1).to_string())), "GET {i}");
        assert_eq!(c.read(), Some(bulk(&format!("p{i}"))), "PING {i}");
    }
    assert_eq!(c.call("DBSIZE"), Reply::Int(N as i64));
}

#[test]
fn concurrent_increments_are_atomic() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, addr) = start(dir.path(), &["--shards", "2", "--durability", "async"]);
    const CLIENTS: usize = 6;
    const ROUNDS: usize = 50;
    const PIPELINE: usize = 20;
    let threads: Vec<_> = (0..CLIENTS)
        .map(|_| {
            std::thread::spawn(move || {
                let mut c = Resp::connect(addr);
                for _ in 0..ROUNDS {
                    c.send_raw(&b"INCR counter\r\nAPPEND log x\r\n".repeat(PIPELINE));
                    for _ in 0..2 * PIPELINE {
                        assert!(matches!(c.read(), Some(Reply::Int(_))));
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let mut c = Resp::connect(addr);
    let total = CLIENTS * ROUNDS * PIPELINE;
    assert_eq!(c.call("GET counter"), bulk(&total.to_string()));
    assert_eq!(c.call("STRLEN log"), Reply::Int(total as i64));
}

/// Sends `input`, expects `error` then the connection to close, and checks
/// the server still serves a new connection.
fn protocol_error_closes(addr: SocketAddr, input: &[u8], error: &str) {
    let mut c = Resp::connect(addr);
    c.send_raw(b"PING\r\n");
    c.send_raw(input);
    assert_eq!(c.read(), Some(Reply::Simple("PONG".into())));
    assert_eq!(
        c.read(),
        Some(err(error)),
        "{:?}",
        String::from_utf8_lossy(input)
    );
    assert_eq!(c.read(), None);
    assert_eq!(
        Resp::connect(addr).call("PING"),
        Reply::Simple("PONG".into())
    );
}

/// A client still sending a value over the limit (redis-cli -x SET of a
/// large file writes it all before reading) is reset, as Redis does: its
/// write fails with "connection reset" within moments, not with a broken
/// pipe after the server closed its side, nor after a stall.
#[test]
fn an_oversized_upload_is_reset_while_the_client_still_sends() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, addr) = start(dir.path(), &["--shards", "1"]);
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(30))).unwrap();
    let body = 100usize << 20;
    s.write_all(format!("*3\r\n$3\r\nSET\r\n$3\r\nbig\r\n${body}\r\n").as_bytes())
        .unwrap();
    let chunk = vec![b'a'; 1 << 20];
    let mut sent = 0;
    let failed = loop {
        if sent >= body {
            break None;
        }
        match s.write(&chunk) {
            Ok(n) => sent += n,
            Err(e) => break Some(e),
        }
    };
    let e = failed.unwrap_or_else(|| panic!("all {sent} bytes were taken"));
    assert_eq!(
        e.kind(),
        std::io::ErrorKind::ConnectionReset,
        "{e} after {sent} bytes"
    );
    assert!(sent < body / 2, "{sent} bytes sent before the reset");
}

#[test]
fn protocol_errors_answer_redis_text_then_close() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, addr) = start(dir.path(), &["--shards", "2"]);
    protocol_error_closes(
        addr,
        b"*3000000000\r\n",
        "ERR Protocol error: invalid multibulk length",
    );
    protocol_error_closes(
        addr,
        b"*3\r\n$3\r\nSET\r\n$1\r\nx\r\nfooz\r\n",
        "ERR Protocol error: expected '$', got 'f'",
    );
    // Larger than the configured bulk limit: refused before any body.
    protocol_error_closes(
        addr,
        b"*3\r\n$3\r\nSET\r\n$1\r\nx\r\n$2000000000\r\n",
        "ERR Protocol error: invalid bulk length (an argument of 2000000000 bytes is over \
         ringkv's limit of 65536: raise limits.value_bytes_max, or limits.key_bytes_max for a key)",
    );
    protocol_error_closes(
        addr,
        b"set \"\"\"test-key\"\"\" test-value\r\n",
        "ERR Protocol error: unbalanced quotes in request",
    );
    // 64 KiB without a newline.
    let mut flood = b"\x00".to_vec();
    flood.extend(b"payload".repeat(10_000));
    protocol_error_closes(addr, &flood, "ERR Protocol error: too big inline request");
    let mut flood = b"*\x00".to_vec();
    flood.extend(b"payload".repeat(10_000));
    protocol_error_closes(
        addr,
        &flood,
        "ERR Protocol error: too big mult bulk count string",
    );
    // Empty lines are ignored.
    let mut c = Resp::connect(addr);
    c.send_raw(b"\r\n\r\nPING\r\n");
    assert_eq!(c.read(), Some(Reply::Simple("PONG".into())));
}

#[test]
fn half_commands_and_garbage_never_take_the_server_down() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, addr) = start(dir.path(), &["--shards", "2"]);
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    for round in 0..200 {
        let mut bytes = Vec::new();
        for _ in 0..(round % 50 + 1) {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let piece: &[u8] = match seed % 8 {
                0 => b"*",
                1 => b"$",
                2 => b"\r\n",
                3 => b"99999",
                4 => b"-1",
                5 => b"SET",
                6 => b"\"",
                _ => b"3",
            };
            bytes.extend_from_slice(piece);
        }
        let mut s = TcpStream::connect(addr).unwrap();
        let _ = s.write_all(&bytes);
        // Half the connections hang up mid-command.
        if round % 2 == 0 {
            drop(s);
        } else {
            let _ = s.shutdown(std::net::Shutdown::Write);
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut sink = Vec::new();
            let _ = s.read_to_end(&mut sink);
        }
    }
    assert_eq!(
        Resp::connect(addr).call("PING"),
        Reply::Simple("PONG".into())
    );
}

#[test]
fn a_client_that_never_reads_does_not_stall_others() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, addr) = start(dir.path(), &["--shards", "1"]);
    let mut c = Resp::connect(addr);
    assert_eq!(c.call(&format!("SET v {}", "x".repeat(60 * 1024))), ok());
    // Ask for far more reply bytes than the socket buffers hold and never
    // read them: the server must stop reading this client, not buffer
    // without bound and not stall the shard.
    let writer = {
        let mut s = c.stream.try_clone().unwrap();
        std::thread::spawn(move || {
            s.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
            let cmd = b"GET v\r\n".repeat(1000);
            let mut sent = 0usize;
            for _ in 0..3000 {
                match s.write_all(&cmd) {
                    Ok(()) => sent += cmd.len(),
                    Err(_) => break,
                }
            }
            sent
        })
    };
    let sent = writer.join().unwrap();
    // 3000 × 7000 bytes of GETs (21 MB) ask for 180 GB of replies: the
    // writes must have blocked long before all of them were accepted.
    assert!(
        sent < 3000 * 7000,
        "the server read everything: {sent} bytes"
    );
    let mut other = Resp::connect(addr);
    assert_eq!(other.call("PING"), Reply::Simple("PONG".into()));
    assert_eq!(other.call("SET w 1"), ok());
}

#[test]
fn kill_9_keeps_every_acknowledged_resp_write() {
    let dir = tempfile::tempdir().unwrap();
    let (mut server, addr) = start(dir.path(), &["--shards", "2", "--durability", "sync"]);
    let mut c = Resp::connect(addr);
    let mut batch = Vec::new();
    for i in 0..500 {
        batch.extend_from_slice(format!("SET key{i} value{i}\r\nINCR n\r\n").as_bytes());
    }
    c.send_raw(&batch);
    for i in 0..500 {
        assert_eq!(c.read(), Some(ok()));
        assert_eq!(c.read(), Some(Reply::Int(i + 1)));
    }
    server.kill9();
    let (_server, addr) = start(dir.path(), &["--shards", "2", "--durability", "sync"]);
    let mut c = Resp::connect(addr);
    for i in 0..500 {
        assert_eq!(c.call(&format!("GET key{i}")), bulk(&format!("value{i}")));
    }
    assert_eq!(c.call("GET n"), bulk("500"));
}

#[test]
fn keyspace_commands_across_shards() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, addr) = start(dir.path(), &["--shards", "3"]);
    let mut c = Resp::connect(addr);
    assert_eq!(c.call("RANDOMKEY"), Reply::Null);
    assert_eq!(c.call("KEYS *"), Reply::Array(vec![]));
    let mut mset = String::from("MSET");
    for i in 0..150 {
        mset.push_str(&format!(" user:{i} v{i}"));
    }
    mset.push_str(" other x");
    assert_eq!(c.call(&mset), ok());
    let Reply::Array(keys) = c.call("KEYS user:1?") else {
        panic!("KEYS answers an array")
    };
    assert_eq!(keys.len(), 10);
    // A full SCAN returns every key at least once, whatever COUNT says.
    let mut seen = std::collections::BTreeSet::new();
    let mut cursor = "0".to_string();
    let mut steps = 0;
    loop {
        let Reply::Array(parts) = c.call(&format!("SCAN {cursor} MATCH user:* COUNT 7")) else {
            panic!("SCAN answers an array")
        };
        let [Reply::Bulk(next), Reply::Array(found)] = &parts[..] else {
            panic!("SCAN answers [cursor, keys]: {parts:?}")
        };
        for k in found {
            let Reply::Bulk(k) = k else { panic!("{k:?}") };
            assert!(k.starts_with(b"user:"));
            seen.insert(k.clone());
        }
        cursor = String::from_utf8(next.to_vec()).unwrap();
        steps += 1;
        assert!(steps < 10_000);
        if cursor == "0" {
            break;
        }
    }
    assert_eq!(seen.len(), 150);
    assert_eq!(c.call("SCAN x"), err("ERR invalid cursor"));
    assert!(matches!(c.call("RANDOMKEY"), Reply::Bulk(_)));
    assert_eq!(c.call("RENAME user:1 renamed"), ok());
    assert_eq!(c.call("GET renamed"), bulk("v1"));
    assert_eq!(c.call("GET user:1"), Reply::Null);
    assert_eq!(c.call("RENAME user:1 x"), err("ERR no such key"));
    assert_eq!(c.call("RENAMENX renamed user:2"), Reply::Int(0));
    assert_eq!(c.call("RENAMENX renamed fresh"), Reply::Int(1));
    assert_eq!(c.call("GET fresh"), bulk("v1"));
    assert_eq!(c.call("DBSIZE"), Reply::Int(151));
    assert_eq!(c.call("FLUSHALL"), ok());
    assert_eq!(c.call("DBSIZE"), Reply::Int(0));
    assert_eq!(c.call("FLUSHDB ASYNC"), ok());
    assert_eq!(c.call("FLUSHDB x"), err("ERR syntax error"));
}

/// A RESP client has no opening handshake: one that waits longer than
/// `server.handshake_timeout` before (or between) commands is still served.
/// (The native listener's handshake deadline once closed RESP connections
/// after 10 s, which broke every Tcl unit running longer than that.)
#[test]
fn the_native_handshake_deadline_does_not_close_resp_clients() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("ringkv.toml");
    std::fs::write(&config, "[server]\nhandshake_timeout = \"100ms\"\n").unwrap();
    let (_server, addr) = start_with_config(dir.path(), &config, &["--shards", "2"]);
    let mut c = Resp::connect(addr);
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(c.call("SET a 1"), ok());
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(c.call("GET a"), bulk("1"));
}

/// One client, one write at a time, no other traffic: every reply must
/// come without help from a later write. Values are large next to the
/// segment size, so the WAL moves to a new segment every few writes, and
/// the appender regularly runs ahead of the segment the flusher waits for
/// (the case where a reply used to wait until another write arrived: the
/// segment creator slept on "the appender rolled" while the flusher waited
/// for a segment it had skipped).
#[test]
fn a_lone_write_is_answered_without_a_later_write() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("ringkv.toml");
    std::fs::write(
        &config,
        "[storage]\nwal_segment_size = \"256KiB\"\ngroup_commit_max_bytes = \"128KiB\"\n\
         checkpoint_wal_bytes = \"64MiB\"\n[limits]\nvalue_bytes_max = \"64KiB\"\n",
    )
    .unwrap();
    let (_server, addr) = start_with_config(dir.path(), &config, &["--shards", "2"]);
    let mut c = Resp::connect(addr);
    // Generous for a loaded machine, far below "forever".
    c.stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let sizes = [60_000usize, 1, 45_000, 30_000, 100, 64_000];
    for i in 0..400usize {
        let key = format!("lone:{}", i % 37);
        let value = vec![b'a' + (i % 26) as u8; sizes[i % sizes.len()]];
        let started = std::time::Instant::now();
        c.send(&[b"SET", key.as_bytes(), &value]);
        let reply = c.read();
        assert_eq!(
            reply,
            Some(ok()),
            "write {i} answered {reply:?} after {:?}",
            started.elapsed()
        );
    }
    // Several such writers at once: the appender can then move on to a
    // new segment while a flush of the previous one is in flight.
    let writers: Vec<_> = (0..6usize)
        .map(|w| {
            std::thread::spawn(move || {
                let mut c = Resp::connect(addr);
                c.stream
                    .set_read_timeout(Some(Duration::from_secs(10)))
                    .unwrap();
                for i in 0..150usize {
                    let key = format!("many:{w}:{}", i % 11);
                    let value = vec![b'm'; sizes[(i + w) % sizes.len()]];
                    c.send(&[b"SET", key.as_bytes(), &value]);
                    assert_eq!(c.read(), Some(ok()), "writer {w}, write {i}");
                }
            })
        })
        .collect();
    for w in writers {
        w.join().expect("a writer saw every reply in time");
    }
    // Deletes and conditional writes that log nothing also wait for the
    // durability of what came before; they must be answered too.
    for i in 0..100usize {
        let key = format!("lone:{}", i % 37);
        assert_eq!(c.call(&format!("SETNX {key} x")), Reply::Int(0));
        c.send(&[b"SET", key.as_bytes(), &vec![b'z'; sizes[i % sizes.len()]]]);
        assert_eq!(c.read(), Some(ok()), "write {i}");
        assert_eq!(c.call(&format!("DEL nothing:{i}")), Reply::Int(0));
    }
}

/// With `server.requirepass` set, a RESP client must AUTH (or HELLO AUTH)
/// before anything but AUTH, HELLO and QUIT, with Redis's replies; the
/// password is the one the native port checks.
#[test]
fn auth_with_requirepass() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("ringkv.toml");
    std::fs::write(
        &config,
        "[server]\nrequirepass = \"s3cret\"\nauth_failure_delay = \"10ms\"\n",
    )
    .unwrap();
    let (_server, addr) = start_with_config(dir.path(), &config, &["--shards", "2"]);
    let mut c = Resp::connect(addr);
    assert_eq!(c.call("GET a"), err("NOAUTH Authentication required."));
    assert_eq!(c.call("SET a 1"), err("NOAUTH Authentication required."));
    // Unknown names and arity are judged first, as in Redis.
    assert!(matches!(c.call("NOSUCH x"), Reply::Error(e) if e.starts_with("ERR unknown command")));
    assert!(
        matches!(c.call("HELLO 3"), Reply::Error(e) if e.starts_with("NOAUTH HELLO must be called"))
    );
    let wrong = err("WRONGPASS invalid username-password pair or user is disabled.");
    assert_eq!(c.call("AUTH nope"), wrong);
    assert_eq!(c.call("AUTH someone s3cret"), wrong);
    assert_eq!(c.call("GET a"), err("NOAUTH Authentication required."));
    assert_eq!(c.call("AUTH s3cret"), ok());
    assert_eq!(c.call("SET a 1"), ok());
    assert_eq!(c.call("GET a"), bulk("1"));

    // HELLO with AUTH authenticates and switches the protocol at once.
    let mut h = Resp::connect(addr);
    assert_eq!(h.call("HELLO 3 AUTH default wrong"), wrong);
    match h.call("HELLO 3 AUTH default s3cret SETNAME me") {
        Reply::Map(pairs) => assert!(pairs
            .iter()
            .any(|(k, v)| *k == bulk("proto") && *v == Reply::Int(3))),
        other => panic!("HELLO answered {other:?}"),
    }
    assert_eq!(h.call("GET a"), bulk("1"));
    assert_eq!(h.call("GET missing"), Reply::Null);
    assert_eq!(h.call("CLIENT GETNAME"), bulk("me"));
    assert_eq!(h.call("QUIT"), ok());

    // Redis's limits before AUTH: at most 10 arguments of at most 16 KiB;
    // breaking them is a protocol error (reply, then close).
    let mut big = Resp::connect(addr);
    big.send_raw(b"*11\r\n");
    assert_eq!(
        big.read(),
        Some(err("ERR Protocol error: unauthenticated multibulk length"))
    );
    assert_eq!(big.read(), None);
    let mut big = Resp::connect(addr);
    big.send_raw(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$16385\r\n");
    assert_eq!(
        big.read(),
        Some(err("ERR Protocol error: unauthenticated bulk length"))
    );
    assert_eq!(big.read(), None);
    // An AUTH lifts them for what follows it in the same pipeline.
    let mut p = Resp::connect(addr);
    let value = vec![b'v'; 20_000];
    let mut pipeline = b"*2\r\n$4\r\nAUTH\r\n$6\r\ns3cret\r\n".to_vec();
    pipeline.extend_from_slice(b"*3\r\n$3\r\nSET\r\n$3\r\nbig\r\n$20000\r\n");
    pipeline.extend_from_slice(&value);
    pipeline.extend_from_slice(b"\r\n*2\r\n$6\r\nSTRLEN\r\n$3\r\nbig\r\n");
    p.send_raw(&pipeline);
    assert_eq!(p.read(), Some(ok()));
    assert_eq!(p.read(), Some(ok()));
    assert_eq!(p.read(), Some(Reply::Int(20_000)));
}

/// Without a password, AUTH behaves as on a Redis without requirepass.
#[test]
fn auth_without_a_password() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, addr) = start(dir.path(), &["--shards", "1"]);
    let mut c = Resp::connect(addr);
    assert!(
        matches!(c.call("AUTH x"), Reply::Error(e) if e.starts_with("ERR AUTH <password> called without any password configured"))
    );
    assert_eq!(c.call("AUTH default anything"), ok());
    assert_eq!(c.call("SET a 1"), ok());
}

/// Protected mode covers the RESP listener: a non-loopback RESP address
/// without a password is refused at start.
#[test]
fn protected_mode_covers_the_resp_listener() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config(dir.path());
    let refused = try_start_server(
        &dir.path().join("data"),
        &[
            "--config",
            config.to_str().unwrap(),
            "--resp-listen",
            "0.0.0.0:0",
        ],
    );
    let log = match refused {
        Ok(_) => panic!("a server listening for RESP on 0.0.0.0 without a password started"),
        Err(log) => log.join("\n"),
    };
    assert!(
        log.contains("server.resp_listen") && log.contains("protected mode"),
        "{log}"
    );
}

/// RESP traffic shows in STATS (`resp.*`, read with the `ringkv` CLI over
/// the native port) and in /metrics (per command).
#[test]
fn resp_counters_in_stats_and_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let (server, addr) = start(
        dir.path(),
        &["--shards", "2", "--metrics-listen", "127.0.0.1:0"],
    );
    let line = server.wait_for_log("ringkv-server ready");
    let native = field(&line, "addr");
    let metrics: SocketAddr = field(&line, "metrics").parse().expect("metrics=");
    let mut c = Resp::connect(addr);
    assert_eq!(c.call("SET a 1"), ok());
    assert_eq!(c.call("GET a"), bulk("1"));
    assert!(matches!(c.call("NOSUCH"), Reply::Error(_)));
    assert!(matches!(c.call("GET"), Reply::Error(_)));

    let out = std::process::Command::new(cli_binary())
        .args(["--server", &native, "stats"])
        .output()
        .expect("run ringkv stats");
    let text = String::from_utf8_lossy(&out.stdout);
    let stat = |name: &str| -> u64 {
        text.lines()
            .find_map(|l| {
                let mut it = l.split_whitespace();
                (it.next() == Some(name)).then(|| it.next().and_then(|v| v.parse().ok()))
            })
            .flatten()
            .unwrap_or_else(|| panic!("no {name} in STATS:\n{text}"))
    };
    assert_eq!(stat("resp.connections"), 1, "{text}");
    assert!(stat("resp.connections_accepted") >= 1);
    assert_eq!(stat("resp.commands"), 4);
    assert_eq!(stat("resp.unknown_commands"), 1);
    assert_eq!(stat("resp.errors"), 2);

    let mut s = TcpStream::connect(metrics).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut page = String::new();
    s.read_to_string(&mut page).unwrap();
    for expected in [
        "ringkv_resp_commands_total{command=\"set\"} 1",
        "ringkv_resp_commands_total{command=\"get\"} 2",
        "ringkv_resp_command_errors_total{command=\"get\"} 1",
        "ringkv_resp_commands_total{command=\"unknown\"} 1",
        "ringkv_resp_connections_open 1",
        "ringkv_resp_errors_total 2",
    ] {
        assert!(page.contains(expected), "no {expected:?} in\n{page}");
    }
}

/// `server.resp_flush_enabled = false`: FLUSHDB and FLUSHALL are unknown
/// commands and delete nothing.
#[test]
fn flush_can_be_disabled_in_the_config() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("ringkv.toml");
    std::fs::write(&config, "[server]\nresp_flush_enabled = false\n").unwrap();
    let (_server, addr) = start_with_config(dir.path(), &config, &["--shards", "2"]);
    let mut c = Resp::connect(addr);
    assert_eq!(c.call("SET a 1"), ok());
    for cmd in ["FLUSHALL", "FLUSHDB", "flushall ASYNC"] {
        assert!(
            matches!(c.call(cmd), Reply::Error(e) if e.starts_with("ERR unknown command")),
            "{cmd}"
        );
    }
    assert_eq!(c.call("DBSIZE"), Reply::Int(1));
}

/// While the engine recovers, the RESP port answers `-LOADING` (as Redis
/// does while it loads) instead of refusing connections; once recovery
/// ends the shards serve it, on the same port. Recovery is made slow with
/// a throttled WAL device: about 4 MiB of WAL read as 4 KiB I/Os at 400
/// per second takes a few seconds.
#[test]
fn loading_is_answered_while_recovering() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let fast = dir.path().join("fast.toml");
    std::fs::write(
        &fast,
        "[storage]\nwal_segment_size = \"8MiB\"\ncheckpoint_wal_bytes = \"1GiB\"\n",
    )
    .unwrap();
    {
        let mut server = start_server(
            &data,
            &[
                "--config",
                fast.to_str().unwrap(),
                "--resp-listen",
                "127.0.0.1:0",
                "--shards",
                "1",
            ],
        );
        let line = server.wait_for_log("ringkv-server ready");
        let addr: SocketAddr = field(&line, "resp").parse().unwrap();
        let mut c = Resp::connect(addr);
        let value = vec![b'x'; 8 * 1024];
        for i in 0..512 {
            let key = format!("k{i}");
            c.send(&[b"SET", key.as_bytes(), &value]);
        }
        for _ in 0..512 {
            assert_eq!(c.read(), Some(ok()));
        }
        // No checkpoint at a clean stop: recovery replays the WAL.
        server.kill9();
    }
    let slow = dir.path().join("slow.toml");
    std::fs::write(
        &slow,
        "[storage]\nwal_segment_size = \"8MiB\"\ncheckpoint_wal_bytes = \"1GiB\"\n\
         [profiles.slow]\niops = 400\nburst_iops = 400\nio_unit = \"4KiB\"\n\
         [devices.wal]\nprofile = \"slow\"\n",
    )
    .unwrap();
    let mut child = std::process::Command::new(server_binary())
        .arg("--data-dir")
        .arg(&data)
        .args(["--config", slow.to_str().unwrap()])
        .args(["--listen", "127.0.0.1:0", "--resp-listen", "127.0.0.1:0"])
        .args(["--shards", "1"])
        .env("RUST_LOG", "info")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn ringkv-server");
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            let _ = tx.send(line);
        }
    });
    let next_line_with = |needle: &str| -> String {
        loop {
            let line = rx
                .recv_timeout(Duration::from_secs(60))
                .unwrap_or_else(|_| panic!("no log line with {needle:?}"));
            if line.contains(needle) {
                return line;
            }
            assert!(
                !line.contains("ringkv-server ready") || needle.contains("ready"),
                "ready before the test saw the loading port: {line}"
            );
        }
    };
    let line = next_line_with("answers -LOADING");
    let addr: SocketAddr = field(&line, "resp").parse().unwrap();
    let mut c = Resp::connect(addr);
    assert_eq!(
        c.call("GET k1"),
        err("LOADING ringkv is loading the dataset in memory")
    );
    assert_eq!(c.read(), None, "closed after the LOADING reply");
    let ready = next_line_with("ringkv-server ready");
    assert_eq!(field(&ready, "resp").parse::<SocketAddr>().unwrap(), addr);
    let mut c = Resp::connect(addr);
    assert!(matches!(c.call("GET k0"), Reply::Bulk(b) if b.len() == 8 * 1024));
    match c.call("STRLEN k511") {
        Reply::Int(n) => assert_eq!(n, 8 * 1024),
        other => panic!("STRLEN answered {other:?}"),
    }
    stop_child(&mut child);
}

fn stop_child(child: &mut std::process::Child) {
    let _ = child.kill();
    let _ = child.wait();
}

fn int(n: i64) -> Reply {
    Reply::Int(n)
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

#[test]
fn expiry_commands_answer_as_redis() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, addr) = start(dir.path(), &["--shards", "3"]);
    let mut c = Resp::connect(addr);
    // SET's expiry options, TTL, PTTL, PERSIST.
    assert_eq!(c.call("SET a 1 EX 100"), ok());
    assert_eq!(c.call("TTL a"), int(100));
    let Reply::Int(pttl) = c.call("PTTL a") else {
        panic!("PTTL")
    };
    assert!((99_000..=100_000).contains(&pttl), "{pttl}");
    assert_eq!(c.call("TTL missing"), int(-2));
    assert_eq!(c.call("SET b 2"), ok());
    assert_eq!(c.call("TTL b"), int(-1));
    assert_eq!(c.call("PERSIST a"), int(1));
    assert_eq!(c.call("PERSIST a"), int(0));
    assert_eq!(c.call("TTL a"), int(-1));
    assert_eq!(
        c.call("SET a 1 PX 0"),
        err("ERR invalid expire time in 'set' command")
    );
    assert_eq!(
        c.call("SET a 1 EX -5"),
        err("ERR invalid expire time in 'set' command")
    );
    assert_eq!(
        c.call("SET a 1 EX 9223372036854775807"),
        err("ERR invalid expire time in 'set' command")
    );
    assert_eq!(c.call("SET a 1 EX 10 KEEPTTL"), err("ERR syntax error"));
    assert_eq!(c.call("SET a 1 EX 10 PX 10"), err("ERR syntax error"));
    assert_eq!(
        c.call("SET a 1 EX x"),
        err("ERR value is not an integer or out of range")
    );
    // KEEPTTL keeps it, a plain SET clears it, INCR and APPEND keep it.
    assert_eq!(c.call("SET n 1 EXAT 4102444800"), ok());
    assert_eq!(c.call("EXPIRETIME n"), int(4_102_444_800));
    assert_eq!(c.call("PEXPIRETIME n"), int(4_102_444_800_000));
    assert_eq!(c.call("INCR n"), int(2));
    assert_eq!(c.call("APPEND n 0"), int(2));
    assert_eq!(c.call("EXPIRETIME n"), int(4_102_444_800));
    assert_eq!(c.call("SET n 5 KEEPTTL"), ok());
    assert_eq!(c.call("EXPIRETIME n"), int(4_102_444_800));
    assert_eq!(c.call("SET n 6 GET"), bulk("5"));
    assert_eq!(c.call("EXPIRETIME n"), int(-1));
    // A value of the largest size takes an expiry too.
    let big = vec![b'x'; 64 * 1024];
    c.send(&[b"SET", b"big", &big, b"EX", b"100"]);
    assert_eq!(c.read(), Some(ok()));
    assert_eq!(c.call("TTL big"), int(100));
    assert_eq!(c.call("DEL big"), int(1));
    // SETEX, PSETEX, GETEX.
    assert_eq!(c.call("SETEX s 50 v"), ok());
    assert_eq!(c.call("TTL s"), int(50));
    assert_eq!(
        c.call("SETEX s 0 v"),
        err("ERR invalid expire time in 'setex' command")
    );
    assert_eq!(c.call("PSETEX p 50000 v"), ok());
    assert_eq!(c.call("TTL p"), int(50));
    assert_eq!(c.call("GETEX s PERSIST"), bulk("v"));
    assert_eq!(c.call("TTL s"), int(-1));
    assert_eq!(c.call("GETEX s EX 30"), bulk("v"));
    assert_eq!(c.call("TTL s"), int(30));
    assert_eq!(c.call("GETEX s"), bulk("v"));
    assert_eq!(c.call("GETEX missing EX 5"), Reply::Null);
    assert_eq!(
        c.call("GETEX s EX 0"),
        err("ERR invalid expire time in 'getex' command")
    );
    assert_eq!(c.call("GETEX s FOO"), err("ERR syntax error"));
    // EXPIRE and its conditions.
    assert_eq!(c.call("EXPIRE missing 10"), int(0));
    assert_eq!(c.call("SET e v"), ok());
    assert_eq!(c.call("EXPIRE e 100 XX"), int(0));
    assert_eq!(c.call("EXPIRE e 100 GT"), int(0));
    assert_eq!(c.call("EXPIRE e 100 NX"), int(1));
    assert_eq!(c.call("EXPIRE e 200 NX"), int(0));
    assert_eq!(c.call("EXPIRE e 50 GT"), int(0));
    assert_eq!(c.call("EXPIRE e 200 GT"), int(1));
    assert_eq!(c.call("EXPIRE e 300 LT"), int(0));
    assert_eq!(c.call("PEXPIRE e 100000 LT"), int(1));
    assert_eq!(c.call("TTL e"), int(100));
    assert_eq!(
        c.call("EXPIRE e 10 NX XX"),
        err("ERR NX and XX, GT or LT options at the same time are not compatible")
    );
    assert_eq!(
        c.call("EXPIRE e 10 GT LT"),
        err("ERR GT and LT options at the same time are not compatible")
    );
    assert_eq!(c.call("EXPIRE e 10 FOO"), err("ERR Unsupported option FOO"));
    assert_eq!(
        c.call("EXPIRE e 9223372036854775807"),
        err("ERR invalid expire time in 'expire' command")
    );
    let at = now_ms() + 60_000;
    assert_eq!(c.call(&format!("PEXPIREAT e {at}")), int(1));
    assert_eq!(c.call("PEXPIRETIME e"), int(at));
    // RENAME moves the expiry; the target's own expiry does not survive.
    assert_eq!(c.call("SET t x EX 1000"), ok());
    assert_eq!(c.call("RENAME e t"), ok());
    assert_eq!(c.call("PEXPIRETIME t"), int(at));
    assert_eq!(c.call("RENAME b t"), ok());
    assert_eq!(c.call("TTL t"), int(-1));
    // A past time deletes the key; expired keys are gone for every read.
    assert_eq!(c.call("EXPIRE t -1"), int(1));
    assert_eq!(c.call("EXISTS t"), int(0));
    for i in 0..20 {
        assert_eq!(c.call(&format!("SET gone{i} v PX 100")), ok());
    }
    std::thread::sleep(Duration::from_millis(150));
    assert_eq!(c.call("GET gone3"), Reply::Null);
    assert_eq!(c.call("EXISTS gone1 gone2 gone3"), int(0));
    assert_eq!(c.call("KEYS gone*"), Reply::Array(vec![]));
    assert_eq!(c.call("TTL gone4"), int(-2));
    assert_eq!(c.call("DEL gone5"), int(0));
    // Active expiry deletes the rest: DBSIZE drops to the live keys.
    let live = 4; // a, n, s, p
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while c.call("DBSIZE") != int(live) {
        assert!(
            std::time::Instant::now() < deadline,
            "expired keys were not reclaimed"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn kill_9_keeps_expiry_times() {
    let dir = tempfile::tempdir().unwrap();
    let (mut server, addr) = start(dir.path(), &["--shards", "2", "--durability", "sync"]);
    let mut c = Resp::connect(addr);
    let mut batch = Vec::new();
    for i in 0..300 {
        let line = match i % 3 {
            0 => format!("SET key{i} v{i} PXAT {}\r\n", 4_102_444_800_000i64 + i),
            1 => format!("SET key{i} v{i} PX 300\r\n"),
            _ => format!("SET key{i} v{i}\r\n"),
        };
        batch.extend_from_slice(line.as_bytes());
    }
    c.send_raw(&batch);
    for _ in 0..300 {
        assert_eq!(c.read(), Some(ok()));
    }
    server.kill9();
    std::thread::sleep(Duration::from_millis(350));
    let (_server, addr) = start(dir.path(), &["--shards", "2", "--durability", "sync"]);
    let mut c = Resp::connect(addr);
    for i in 0..300i64 {
        let (value, expiry) = match i % 3 {
            0 => (bulk(&format!("v{i}")), int(4_102_444_800_000 + i)),
            1 => (Reply::Null, int(-2)),
            _ => (bulk(&format!("v{i}")), int(-1)),
        };
        assert_eq!(c.call(&format!("GET key{i}")), value, "key{i}");
        assert_eq!(c.call(&format!("PEXPIRETIME key{i}")), expiry, "key{i}");
    }
}

#[test]
fn read_modify_writes_on_a_key_a_transaction_holds_are_refused() {
    // A RESP INCR/APPEND is a read-modify-write on the key's shard; applied
    // while a native transaction holds the key, the transaction's commit
    // would overwrite it after it was acknowledged. It is refused instead,
    // like a plain write, and applies once the transaction ends.
    let dir = tempfile::tempdir().unwrap();
    let (mut server, resp) = start(dir.path(), &[]);
    let native = server.addr;
    let mut c = Resp::connect(resp);
    assert_eq!(c.call("SET counter 10"), ok());
    with_runtime(async move {
        let client = connect(native).await;
        let mut txn = client.transaction();
        txn.get_for_update("counter").await.unwrap();
        txn.put("counter", "100").await.unwrap();
        // SET is a plain write: refused the same way.
        for cmd in ["INCR counter", "APPEND counter x", "SET counter 5"] {
            let got = c.call(cmd);
            assert!(
                matches!(&got, Reply::Error(e) if e.starts_with("LOCKED ")),
                "{cmd}: {got:?}"
            );
        }
        txn.commit().await.unwrap();
        assert_eq!(c.call("INCR counter"), Reply::Int(101));
    });
    server.terminate();
}

#[test]
fn bit_commands_copy_and_lcs() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, addr) = start(dir.path(), &["--shards", "2"]);
    let mut c = Resp::connect(addr);
    // SETBIT answers the old bit and grows the value with zero bytes; bit
    // 0 is the top bit of the first byte.
    assert_eq!(c.call("GETBIT b 5"), Reply::Int(0));
    assert_eq!(c.call("SETBIT b 5 1"), Reply::Int(0));
    assert_eq!(c.call("SETBIT b 5 1"), Reply::Int(1));
    assert_eq!(c.call("GETBIT b 5"), Reply::Int(1));
    assert_eq!(c.call("GET b"), bulk("\u{4}"));
    assert_eq!(c.call("SETBIT b 17 1"), Reply::Int(0));
    assert_eq!(c.call("STRLEN b"), Reply::Int(3));
    assert_eq!(c.call("GETBIT b 1000"), Reply::Int(0));
    assert_eq!(c.call("SET s foobar"), ok());
    assert_eq!(c.call("BITCOUNT s"), Reply::Int(26));
    assert_eq!(c.call("BITCOUNT s 0 0"), Reply::Int(4));
    assert_eq!(c.call("BITCOUNT s 1 1"), Reply::Int(6));
    assert_eq!(c.call("BITCOUNT s 1 1 BYTE"), Reply::Int(6));
    assert_eq!(c.call("BITCOUNT s 5 30 BIT"), Reply::Int(17));
    assert_eq!(c.call("BITCOUNT s -2 -1"), Reply::Int(7));
    assert_eq!(c.call("BITCOUNT nothing"), Reply::Int(0));
    let offset = "ERR bit offset is not an integer or out of range";
    assert_eq!(c.call("SETBIT b 4294967296 1"), err(offset));
    assert_eq!(c.call("SETBIT b -1 1"), err(offset));
    assert_eq!(c.call("GETBIT b x"), err(offset));
    assert_eq!(
        c.call("SETBIT b 0 2"),
        err("ERR bit is not an integer or out of range")
    );
    assert_eq!(c.call("BITCOUNT s 0"), err("ERR syntax error"));
    assert_eq!(c.call("BITCOUNT s 0 1 WORD"), err("ERR syntax error"));
    // Past limits.value_bytes_max (64 KiB here): ringkv's limit error.
    assert!(matches!(
        c.call("SETBIT b 600000 1"),
        Reply::Error(e) if e.starts_with("ERR string exceeds maximum allowed size")
    ));

    // COPY keeps the expiry time (or none); without REPLACE it does not
    // overwrite; only database 0 exists.
    assert_eq!(c.call("SET src v EX 100"), ok());
    assert_eq!(c.call("COPY src dst"), Reply::Int(1));
    assert_eq!(c.call("GET dst"), bulk("v"));
    assert!(matches!(c.call("TTL dst"), Reply::Int(t) if t > 90 && t <= 100));
    assert_eq!(c.call("SET src w"), ok());
    assert_eq!(c.call("COPY src dst"), Reply::Int(0));
    assert_eq!(c.call("GET dst"), bulk("v"));
    assert_eq!(c.call("COPY src dst REPLACE DB 0"), Reply::Int(1));
    assert_eq!(c.call("GET dst"), bulk("w"));
    assert_eq!(c.call("TTL dst"), Reply::Int(-1));
    assert_eq!(c.call("COPY nothing dst2"), Reply::Int(0));
    assert_eq!(c.call("EXISTS dst2"), Reply::Int(0));
    assert_eq!(
        c.call("COPY src src"),
        err("ERR source and destination objects are the same")
    );
    assert_eq!(
        c.call("COPY src x DB 1"),
        err("ERR DB index is out of range")
    );
    assert_eq!(
        c.call("COPY src x DB one"),
        err("ERR value is not an integer or out of range")
    );
    assert_eq!(c.call("COPY src x NOW"), err("ERR syntax error"));

    // LCS reads its two keys wherever they live.
    assert_eq!(c.call("MSET left ohmytext right0 mynewtext"), ok());
    assert_eq!(c.call("LCS left right0"), bulk("mytext"));
    assert_eq!(c.call("LCS left right0 LEN"), Reply::Int(6));
    assert_eq!(c.call("LCS left nothing"), bulk(""));
}

/// BGSAVE checkpoints every shard in the background, LASTSAVE moves to its
/// end, and INFO persistence says how it went (the Redis backup-script
/// loop: BGSAVE, then poll LASTSAVE).
#[test]
fn bgsave_checkpoints_and_lastsave_follows() {
    let dir = tempfile::tempdir().unwrap();
    let (server, addr) = start(dir.path(), &[]);
    let mut c = Resp::connect(addr);
    for i in 0..200 {
        assert_eq!(c.call(&format!("SET k{i} v{i}")), ok());
    }
    let Reply::Int(first) = c.call("LASTSAVE") else {
        panic!("LASTSAVE answers an integer")
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    assert!(first > 0 && first <= now, "LASTSAVE {first} (now {now})");
    let (Reply::Bulk(info) | Reply::Verbatim(_, info)) = c.call("INFO persistence") else {
        panic!("INFO answers text")
    };
    let info = String::from_utf8_lossy(&info).to_string();
    for field in [
        "rdb_bgsave_in_progress:0",
        "rdb_last_bgsave_status:ok",
        &format!("rdb_last_save_time:{first}"),
    ] {
        assert!(info.contains(field), "{field} missing from:\n{info}");
    }
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(
        c.call("BGSAVE"),
        Reply::Simple("Background saving started".into())
    );
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let Reply::Int(t) = c.call("LASTSAVE") else {
            panic!("LASTSAVE answers an integer")
        };
        if t > first {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "LASTSAVE never moved");
        std::thread::sleep(Duration::from_millis(20));
    }
    server.wait_for_log("BGSAVE: every shard checkpointed");
    assert_eq!(c.call("BGSAVE now"), err("ERR syntax error"));
}
