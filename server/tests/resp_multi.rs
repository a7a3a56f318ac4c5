//! MULTI / EXEC / DISCARD / WATCH / UNWATCH and MSETNX on the RESP port,
//! against the real binary: queueing and Redis's errors, read-your-writes
//! inside EXEC, EXEC's atomicity under concurrent clients (two keys on two
//! shards always move together), WATCH aborting on every kind of change
//! (a write, a write of the same value, a delete, an expiry, a native
//! write, a native transaction), and an EXEC acknowledged under `sync`
//! surviving kill -9 whole.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::resp::{bulk, err, ok, start_with_resp, RespConn as Resp};
use common::*;
use ringkv_protocol::resp::Reply;

/// Starts a server with a RESP listener and two shards; returns it and the
/// RESP address.
fn start(dir: &std::path::Path, extra: &[&str]) -> (ServerProcess, SocketAddr) {
    let mut args = vec!["--shards", "2"];
    args.extend_from_slice(extra);
    start_with_resp(dir, &args)
}

impl Resp {
    /// MULTI, the commands (each must answer +QUEUED), EXEC's reply.
    fn exec(&mut self, lines: &[&str]) -> Reply {
        assert_eq!(self.call("MULTI"), ok());
        for line in lines {
            assert_eq!(self.call(line), queued(), "{line}");
        }
        self.call("EXEC")
    }
}

fn queued() -> Reply {
    Reply::Simple("QUEUED".into())
}

fn is_error(r: &Reply, starting: &str) -> bool {
    matches!(r, Reply::Error(e) if e.starts_with(starting))
}

#[test]
fn exec_answers_every_queued_command_in_order_with_read_your_writes() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, addr) = start(dir.path(), &[]);
    let mut c = Resp::connect(addr);
    assert_eq!(c.call("SET before x"), ok());
    let replies = c.exec(&[
        "SET k 1",
        "INCR k",
        "INCRBY k 10",
        "GET k",
        "APPEND s ab",
        "STRLEN s",
        "MSET a 1 b 2",
        "MGET a b nothing",
        "EXISTS a b nothing",
        "GETSET a 9",
        "SETNX a 5",
        "GETDEL b",
        "DEL before nothing",
        "INCRBYFLOAT f 1.5",
        "SET k v NX",
        "SET k w XX GET",
        "INCR w",
        "PING",
        "ECHO hi",
        "GET before",
    ]);
    assert_eq!(
        replies,
        Reply::Array(vec![
            ok(),
            Reply::Int(2),
            Reply::Int(12),
            bulk("12"),
            Reply::Int(2),
            Reply::Int(2),
            ok(),
            Reply::Array(vec![bulk("1"), bulk("2"), Reply::Null]),
            Reply::Int(2),
            bulk("1"),
            Reply::Int(0),
            bulk("2"),
            Reply::Int(1),
            bulk("1.5"),
            Reply::Null,
            bulk("12"),
            Reply::Int(1),
            Reply::Simple("PONG".into()),
            bulk("hi"),
            Reply::Null,
        ])
    );
    // And the effects are there afterwards.
    assert_eq!(c.call("GET k"), bulk("w"));
    assert_eq!(c.call("MGET a b before w"), {
        Reply::Array(vec![bulk("9"), Reply::Null, Reply::Null, bulk("1")])
    });
    // A runtime error answers in its slot; the other commands still apply.
    assert_eq!(
        c.exec(&["SET t 1", "INCR s", "SET u 2"]),
        Reply::Array(vec![
            ok(),
            err("ERR value is not an integer or out of range"),
            ok()
        ])
    );
    assert_eq!(c.call("MGET t u"), Reply::Array(vec![bulk("1"), bulk("2")]));
    // An empty MULTI answers an empty array; RESP3 nulls inside EXEC.
    assert_eq!(c.exec(&[]), Reply::Array(vec![]));
    assert!(matches!(c.call("HELLO 3"), Reply::Map(_)));
    assert_eq!(
        c.exec(&["GET nothing", "GET t"]),
        Reply::Array(vec![Reply::Null, bulk("1")])
    );
}

#[test]
fn redis_errors_around_multi() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, addr) = start(dir.path(), &[]);
    let mut c = Resp::connect(addr);
    assert_eq!(c.call("EXEC"), err("ERR EXEC without MULTI"));
    assert_eq!(c.call("DISCARD"), err("ERR DISCARD without MULTI"));
    assert_eq!(c.call("MULTI"), ok());
    assert_eq!(c.call("MULTI"), err("ERR MULTI calls can not be nested"));
    assert_eq!(
        c.call("WATCH k"),
        err("ERR WATCH inside MULTI is not allowed")
    );
    assert_eq!(c.call("SET k 1"), queued());
    // Neither error discarded the transaction.
    assert_eq!(c.call("EXEC"), Reply::Array(vec![ok()]));

    // Unknown commands, wrong arity and commands a transaction cannot run
    // are refused while queueing, and EXEC discards the transaction.
    for bad in [
        "NOSUCH x",
        "GET",
        "KEYS *",
        "FLUSHALL",
        "SET k 2 EX 100",
        "EXPIRE k 10",
    ] {
        assert_eq!(c.call("MULTI"), ok());
        assert_eq!(c.call("SET k 2"), queued());
        assert!(is_error(&c.call(bad), "ERR"), "{bad}");
        assert_eq!(
            c.call("EXEC"),
            err("EXECABORT Transaction discarded because of previous errors."),
            "{bad}"
        );
        assert_eq!(c.call("GET k"), bulk("1"), "{bad}");
    }

    // DISCARD drops the queue.
    assert_eq!(c.call("MULTI"), ok());
    assert_eq!(c.call("SET k 3"), queued());
    assert_eq!(c.call("DISCARD"), ok());
    assert_eq!(c.call("GET k"), bulk("1"));
    assert_eq!(c.call("EXEC"), err("ERR EXEC without MULTI"));

    // INCR keeps an expiry time, which a transaction write cannot carry:
    // refused in its slot, the key untouched.
    assert_eq!(c.call("SET e 5 EX 100"), ok());
    assert_eq!(
        c.exec(&["INCR e", "SET f 1"]),
        Reply::Array(vec![
            err("ERR ringkv cannot run this command inside MULTI on a key with an expiry time (it keeps the expiry, and transaction writes carry none); the command did nothing"),
            ok()
        ])
    );
    assert_eq!(c.call("GET e"), bulk("5"));
    assert!(matches!(c.call("TTL e"), Reply::Int(t) if t > 0));
    // A plain SET inside MULTI removes it, as outside.
    assert_eq!(
        c.exec(&["SET e 6", "INCR e"]),
        Reply::Array(vec![ok(), Reply::Int(7)])
    );
    assert_eq!(c.call("TTL e"), Reply::Int(-1));

    // MULTI is per connection, and a connection dropped in MULTI leaves
    // nothing behind (no write, no lock).
    let mut d = Resp::connect(addr);
    assert_eq!(d.call("MULTI"), ok());
    assert_eq!(d.call("SET gone 1"), queued());
    drop(d);
    assert_eq!(c.call("GET gone"), Reply::Null);
    assert_eq!(c.call("SET gone 2"), ok());
}

#[test]
fn msetnx_sets_all_keys_or_none() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, addr) = start(dir.path(), &[]);
    let mut c = Resp::connect(addr);
    assert_eq!(c.call("MSETNX a 1 b 2 c 3 d 4"), Reply::Int(1));
    assert_eq!(c.call("MSETNX x 1 d 5"), Reply::Int(0));
    assert_eq!(c.call("EXISTS x"), Reply::Int(0));
    assert_eq!(c.call("GET d"), bulk("4"));
    assert_eq!(c.call("MSETNX y 1 y 2"), Reply::Int(1));
    assert_eq!(c.call("GET y"), bulk("2"));
    assert_eq!(
        c.call("MSETNX a"),
        err("ERR wrong number of arguments for 'msetnx' command")
    );
    assert_eq!(
        c.call("MSETNX a 1 b"),
        err("ERR wrong number of arguments for 'msetnx' command")
    );
    assert_eq!(
        c.exec(&["MSETNX p 1 q 2", "MSETNX q 3 r 4", "MGET p q r"]),
        Reply::Array(vec![
            Reply::Int(1),
            Reply::Int(0),
            Reply::Array(vec![bulk("1"), bulk("2"), Reply::Null])
        ])
    );
}

#[test]
fn watch_aborts_exec_after_any_change_of_a_watched_key() {
    let dir = tempfile::tempdir().unwrap();
    let (server, addr) = start(dir.path(), &[]);
    let mut c = Resp::connect(addr);
    let mut other = Resp::connect(addr);
    let aborted = |c: &mut Resp| c.exec(&["SET result changed"]) == Reply::Null;

    // Unchanged: EXEC runs.
    assert_eq!(c.call("SET k 1"), ok());
    assert_eq!(c.call("WATCH k nothing"), ok());
    assert!(!aborted(&mut c));

    // A write by another client.
    assert_eq!(c.call("WATCH k"), ok());
    assert_eq!(other.call("SET k 2"), ok());
    assert!(aborted(&mut c));
    // EXEC forgot the watched keys: the next one runs.
    assert!(!aborted(&mut c));

    // A write of the same value (ABA): still a change.
    assert_eq!(c.call("WATCH k"), ok());
    assert_eq!(other.call("SET k 2"), ok());
    assert_eq!(c.call("GET k"), bulk("2"));
    assert!(aborted(&mut c));

    // A read-modify-write, a delete, a key created after WATCH.
    for change in ["INCR k", "DEL k", "SET k again", "APPEND k x"] {
        assert_eq!(c.call("WATCH k"), ok());
        assert!(!is_error(&other.call(change), "ERR"), "{change}");
        assert!(aborted(&mut c), "{change}");
    }
    assert_eq!(c.call("WATCH missing"), ok());
    assert_eq!(other.call("SET missing 1"), ok());
    assert!(aborted(&mut c));

    // The watching client's own write after WATCH counts too (Redis).
    assert_eq!(c.call("WATCH k"), ok());
    assert_eq!(c.call("SET k mine"), ok());
    assert!(aborted(&mut c));

    // An expiry after WATCH.
    assert_eq!(c.call("SET short v PX 150"), ok());
    assert_eq!(c.call("WATCH short"), ok());
    std::thread::sleep(Duration::from_millis(400));
    assert!(aborted(&mut c));

    // A write on the native port.
    assert_eq!(c.call("WATCH native"), ok());
    with_runtime(async {
        let n = connect(server.addr).await;
        n.put("native", "v").await.expect("native put");
    });
    assert!(aborted(&mut c));

    // A native transaction's commit.
    assert_eq!(c.call("WATCH k"), ok());
    with_runtime(async {
        let n = connect(server.addr).await;
        let mut tx = n.transaction();
        tx.put("k", "from a transaction").await.expect("tx put");
        tx.commit().await.expect("commit");
    });
    assert!(aborted(&mut c));

    // An EXEC of another connection that writes the key.
    assert_eq!(c.call("WATCH k"), ok());
    assert_eq!(other.exec(&["SET k 3"]), Reply::Array(vec![ok()]));
    assert!(aborted(&mut c));

    // UNWATCH and DISCARD forget the watched keys.
    assert_eq!(c.call("WATCH k"), ok());
    assert_eq!(c.call("UNWATCH"), ok());
    assert_eq!(other.call("SET k 4"), ok());
    assert!(!aborted(&mut c));
    assert_eq!(c.call("WATCH k"), ok());
    assert_eq!(c.call("MULTI"), ok());
    assert_eq!(c.call("DISCARD"), ok());
    assert_eq!(other.call("SET k 5"), ok());
    assert!(!aborted(&mut c));

    // A write to another key does not abort (these two keys do not share
    // a counter slot).
    assert_eq!(c.call("WATCH k"), ok());
    assert_eq!(other.call("SET unrelated 1"), ok());
    assert!(!aborted(&mut c));

    // Nothing of an aborted EXEC ran; the null is an array (`*-1`) in
    // RESP2 and `_` in RESP3.
    assert_eq!(c.call("DEL result"), Reply::Int(1));
    for (hello, null) in [("HELLO 2", &b"*-1\r\n"[..]), ("HELLO 3", &b"_\r\n"[..])] {
        assert!(matches!(c.call(hello), Reply::Map(_) | Reply::Array(_)));
        assert_eq!(c.call("WATCH k"), ok());
        assert_eq!(other.call("SET k 6"), ok());
        assert_eq!(c.call("MULTI"), ok());
        assert_eq!(c.call("SET result x"), queued());
        c.send(&[b"EXEC"]);
        assert_eq!(c.read_raw(null.len()), null, "{hello}");
        assert_eq!(c.call("GET result"), Reply::Null);
    }
}

/// Two keys on different shards, changed only together by EXECs from
/// several clients; readers that read both in one EXEC must always see
/// them equal, and no increment may be lost.
#[test]
fn exec_is_atomic_under_concurrent_clients() {
    let dir = tempfile::tempdir().unwrap();
    let (server, addr) = start(dir.path(), &["--durability", "async"]);
    // Two keys on different shards (2 shards: the router takes the
    // FNV-1a hash modulo 2).
    let (a, b) = ("left", "right0");
    let shard = |k: &str| engine::hash::fnv1a64(k.as_bytes()) % 2;
    assert_ne!(shard(a), shard(b), "pick keys on different shards");
    with_runtime(async {
        let n = connect(server.addr).await;
        n.put(a, "0").await.unwrap();
        n.put(b, "0").await.unwrap();
    });
    let stop = Arc::new(AtomicBool::new(false));
    const WRITERS: usize = 3;
    const ROUNDS: usize = 150;
    let writers: Vec<_> = (0..WRITERS)
        .map(|_| {
            std::thread::spawn(move || {
                let mut c = Resp::connect(addr);
                for _ in 0..ROUNDS {
                    let r = c.exec(&[&format!("INCR {a}"), &format!("INCR {b}")]);
                    let Reply::Array(r) = r else {
                        panic!("EXEC failed: {r:?}")
                    };
                    assert_eq!(r[0], r[1]);
                }
            })
        })
        .collect();
    let reader = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut c = Resp::connect(addr);
            let mut reads = 0;
            while !stop.load(Ordering::SeqCst) {
                let r = c.exec(&[&format!("GET {a}"), &format!("GET {b}")]);
                let Reply::Array(r) = r else {
                    panic!("EXEC failed: {r:?}")
                };
                assert_eq!(r[0], r[1], "a reader saw half of an EXEC");
                reads += 1;
            }
            reads
        })
    };
    for w in writers {
        w.join().expect("writer");
    }
    stop.store(true, Ordering::SeqCst);
    assert!(reader.join().expect("reader") > 0);
    let mut c = Resp::connect(addr);
    let total = (WRITERS * ROUNDS).to_string();
    assert_eq!(
        c.call(&format!("MGET {a} {b}")),
        Reply::Array(vec![bulk(&total), bulk(&total)])
    );
}

/// EXECs acknowledged under `sync` survive kill -9, whole: each writes two
/// keys on different shards, and after the restart both or neither of
/// every EXEC's keys are there, and every acknowledged one is.
#[test]
fn kill_9_keeps_every_acknowledged_exec_whole() {
    let dir = tempfile::tempdir().unwrap();
    let (mut server, addr) = start(dir.path(), &["--durability", "sync"]);
    let acked = Arc::new(std::sync::Mutex::new(Vec::new()));
    let writer = {
        let acked = acked.clone();
        std::thread::spawn(move || {
            let mut c = Resp::connect(addr);
            for i in 0..100_000u64 {
                assert_eq!(c.call("MULTI"), ok());
                c.send(&[b"SET", format!("a{i}").as_bytes(), b"x"]);
                let Some(q) = c.read() else { return };
                assert_eq!(q, queued());
                c.send(&[b"SET", format!("b{i}").as_bytes(), b"y"]);
                let Some(q) = c.read() else { return };
                assert_eq!(q, queued());
                c.send(&[b"EXEC"]);
                match c.read() {
                    Some(Reply::Array(r)) => {
                        assert_eq!(r, vec![ok(), ok()]);
                        acked.lock().unwrap().push(i);
                    }
                    None => return,
                    Some(other) => panic!("EXEC: {other:?}"),
                }
            }
        })
    };
    let started = Instant::now();
    while acked.lock().unwrap().len() < 50 && started.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(20));
    }
    server.kill9();
    let _ = writer.join();
    let acked = acked.lock().unwrap().clone();
    assert!(acked.len() >= 50, "only {} EXECs acknowledged", acked.len());
    let (_server, addr) = start(dir.path(), &["--durability", "sync"]);
    let mut c = Resp::connect(addr);
    let last = *acked.last().unwrap();
    for i in 0..=last + 1 {
        let got = c.call(&format!("MGET a{i} b{i}"));
        let whole = Reply::Array(vec![bulk("x"), bulk("y")]);
        if i <= last {
            assert_eq!(got, whole, "acknowledged EXEC {i} lost");
        } else {
            assert!(
                got == whole || got == Reply::Array(vec![Reply::Null, Reply::Null]),
                "EXEC {i} half applied: {got:?}"
            );
        }
    }
}

/// A transaction over `server.txn_locks_max`, or whose writes on one
/// shard do not fit one WAL record, answers an error and applies nothing;
/// a MULTI holds at most `txn_locks_max` commands.
#[test]
fn too_large_transactions_apply_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("ringkv.toml");
    std::fs::write(
        &config,
        "[server]\ntxn_locks_max = 4\n[storage]\ngroup_commit_max_bytes = \"16KiB\"\n[limits]\nkey_bytes_max = \"1KiB\"\nvalue_bytes_max = \"8KiB\"\n",
    )
    .unwrap();
    let (_server, addr) = start(dir.path(), &["--config", config.to_str().unwrap()]);
    let mut c = Resp::connect(addr);
    let too_many = "ERR ringkv: the transaction is too large (a transaction may lock at most 4 keys); nothing was applied";
    assert_eq!(c.exec(&["MSET a 1 b 2 c 3 d 4 e 5"]), err(too_many));
    assert_eq!(c.call("MSETNX a 1 b 2 c 3 d 4 e 5"), err(too_many));
    assert_eq!(c.call("EXISTS a b c d e"), Reply::Int(0));

    // Two 5 KiB values on one shard ("left" and "right1" share shard 0)
    // do not fit one record of a 16 KiB flush buffer (a transaction's part
    // is never chained).
    let shard = |k: &str| engine::hash::fnv1a64(k.as_bytes()) % 2;
    assert_eq!(shard("left"), shard("right1"));
    let big = "x".repeat(5 * 1024);
    let got = c.exec(&[&format!("SET left {big}"), &format!("SET right1 {big}")]);
    assert!(
        matches!(&got, Reply::Error(e) if e.starts_with("ERR ringkv: the transaction is too large")),
        "{got:?}"
    );
    assert_eq!(c.call("EXISTS left right1"), Reply::Int(0));

    assert_eq!(c.call("MULTI"), ok());
    for _ in 0..4 {
        assert_eq!(c.call("PING"), queued());
    }
    assert!(is_error(
        &c.call("PING"),
        "ERR ringkv: a MULTI holds at most 4"
    ));
    assert_eq!(
        c.call("EXEC"),
        err("EXECABORT Transaction discarded because of previous errors.")
    );
}
