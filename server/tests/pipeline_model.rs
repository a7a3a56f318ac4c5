//! Pipelines across shards against a sequential model, on both protocols:
//! one connection sends random interleavings of writes, reads and deletes
//! on keys of every shard, in deep pipelines of random depth, while another
//! thread reads the answers; every answer must be the one a server that
//! ran the requests one at a time, in order, would give. Under `sync` a
//! write's answer waits for its flush while a read behind it does not, so
//! the server must hold answers back to keep them in request order.
//!
//! Also: a connection with a very deep pipeline does not keep another
//! connection's single request waiting until it is done (fairness).

mod common;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use common::*;
use ringkv_protocol::resp::{decode_reply, Reply, ReplyLimits};
use ringkv_protocol::{OpReply, RequestOp, ServerFrame};

/// xorshift64*: a small deterministic generator, so a failing seed replays.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[derive(Debug, Clone)]
enum Cmd {
    Set(u64, Bytes),
    Get(u64),
    Del(u64),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Expect {
    Ok,
    Value(Option<Bytes>),
    Deleted(bool),
}

const KEYS: u64 = 96;

fn key_name(k: u64) -> String {
    // Keys spread over every shard (the routing hash decides).
    format!("model-key-{k}")
}

/// `count` random commands and the answers the sequential model gives.
fn script(seed: u64, count: usize) -> (Vec<Cmd>, Vec<Expect>) {
    let mut rng = Rng::new(seed);
    let mut model: HashMap<u64, Bytes> = HashMap::new();
    let mut cmds = Vec::with_capacity(count);
    let mut expect = Vec::with_capacity(count);
    for i in 0..count {
        let k = rng.below(KEYS);
        match rng.below(10) {
            0..=3 => {
                let len = 1 + rng.below(300) as usize;
                let v = Bytes::from(format!("{seed}:{i}:{}", "v".repeat(len)));
                model.insert(k, v.clone());
                cmds.push(Cmd::Set(k, v));
                expect.push(Expect::Ok);
            }
            4..=7 => {
                cmds.push(Cmd::Get(k));
                expect.push(Expect::Value(model.get(&k).cloned()));
            }
            _ => {
                cmds.push(Cmd::Del(k));
                expect.push(Expect::Deleted(model.remove(&k).is_some()));
            }
        }
    }
    (cmds, expect)
}

/// Cuts `0..len` into runs of random length (1 to `max`): the pipelines.
fn runs(rng: &mut Rng, len: usize, max: u64) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < len {
        let n = (1 + rng.below(max) as usize).min(len - at);
        out.push(at..at + n);
        at += n;
    }
    out
}

fn resp_command(cmd: &Cmd) -> Vec<u8> {
    let args: Vec<Vec<u8>> = match cmd {
        Cmd::Set(k, v) => vec![b"SET".to_vec(), key_name(*k).into_bytes(), v.to_vec()],
        Cmd::Get(k) => vec![b"GET".to_vec(), key_name(*k).into_bytes()],
        Cmd::Del(k) => vec![b"DEL".to_vec(), key_name(*k).into_bytes()],
    };
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(&a);
        out.extend_from_slice(b"\r\n");
    }
    out
}

fn resp_matches(reply: &Reply, expect: &Expect) -> bool {
    match (reply, expect) {
        (Reply::Simple(s), Expect::Ok) => s == "OK",
        (Reply::Bulk(v), Expect::Value(Some(want))) => v == want,
        (Reply::Null, Expect::Value(None)) => true,
        (Reply::Int(n), Expect::Deleted(existed)) => *n == i64::from(*existed),
        _ => false,
    }
}

fn start(dir: &std::path::Path, extra: &[&str]) -> (ServerProcess, SocketAddr, SocketAddr) {
    let config = dir.join("ringkv.toml");
    std::fs::write(
        &config,
        "[storage]\nwal_segment_size = \"8MiB\"\ncheckpoint_wal_bytes = \"16MiB\"\n",
    )
    .unwrap();
    let mut args = vec![
        "--config",
        config.to_str().unwrap(),
        "--resp-listen",
        "127.0.0.1:0",
        "--shards",
        "4",
    ];
    args.extend_from_slice(extra);
    let server = start_server(&dir.join("data"), &args);
    let line = server.wait_for_log("ringkv-server ready");
    let native = field(&line, "addr")
        .parse()
        .expect("addr= in the ready line");
    let resp = field(&line, "resp")
        .parse()
        .expect("resp= in the ready line");
    (server, native, resp)
}

/// Sends `cmds` on the RESP port in pipelines of random depth from one
/// thread while this one checks every reply in order.
fn run_resp(addr: SocketAddr, seed: u64, cmds: &[Cmd], expect: &[Expect]) {
    let stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let mut writer = stream.try_clone().unwrap();
    let mut rng = Rng::new(seed ^ 0x5eed);
    let pipelines: Vec<Vec<u8>> = runs(&mut rng, cmds.len(), 2_000)
        .into_iter()
        .map(|r| cmds[r].iter().flat_map(resp_command).collect())
        .collect();
    let sender = std::thread::spawn(move || {
        for p in pipelines {
            writer.write_all(&p).unwrap();
        }
    });
    let mut reader = stream;
    let mut buf = BytesMut::new();
    let mut chunk = vec![0u8; 64 * 1024];
    for (i, want) in expect.iter().enumerate() {
        let reply = loop {
            if let Some(r) = decode_reply(&mut buf, &ReplyLimits::default()).expect("valid reply") {
                break r;
            }
            let n = reader.read(&mut chunk).expect("read (timed out?)");
            assert!(n > 0, "seed {seed}: the server closed after {i} replies");
            buf.extend_from_slice(&chunk[..n]);
        };
        assert!(
            resp_matches(&reply, want),
            "seed {seed}, command {i} ({:?}): got {reply:?}, the model says {want:?}",
            cmds[i]
        );
    }
    sender.join().unwrap();
}

fn native_op(cmd: &Cmd) -> RequestOp {
    match cmd {
        Cmd::Set(k, v) => RequestOp::Put {
            key: Bytes::from(key_name(*k)),
            value: v.clone(),
        },
        Cmd::Get(k) => RequestOp::Get {
            key: Bytes::from(key_name(*k)),
        },
        Cmd::Del(k) => RequestOp::Delete {
            key: Bytes::from(key_name(*k)),
        },
    }
}

fn native_matches(reply: &OpReply, expect: &Expect) -> bool {
    match (reply, expect) {
        (OpReply::Ok, Expect::Ok) => true,
        (OpReply::Value(v), Expect::Value(Some(want))) => v == want,
        (OpReply::NotFound, Expect::Value(None)) => true,
        (OpReply::Ok, Expect::Deleted(true)) => true,
        (OpReply::NotFound, Expect::Deleted(false)) => true,
        _ => false,
    }
}

/// Sends `cmds` on the native port as frames of random size (1 to 64 ops
/// each, so one frame may span every shard), many frames in flight, and
/// checks every frame's answers in order.
fn run_native(addr: SocketAddr, seed: u64, cmds: &[Cmd], expect: &[Expect]) {
    let mut conn = RawConn::open(addr);
    conn.stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let mut rng = Rng::new(seed ^ 0xf4a3e);
    let frames = runs(&mut rng, cmds.len(), 64);
    let mut writer = conn.stream.try_clone().unwrap();
    let encoded: Vec<BytesMut> = frames
        .iter()
        .enumerate()
        .map(|(id, r)| {
            let mut b = BytesMut::new();
            ringkv_protocol::encode_request(
                &ringkv_protocol::Request {
                    id: id as u64,
                    ops: cmds[r.clone()].iter().map(native_op).collect(),
                },
                &mut b,
            );
            b
        })
        .collect();
    let sender = std::thread::spawn(move || {
        for b in encoded {
            writer.write_all(&b).unwrap();
        }
    });
    for (id, range) in frames.iter().enumerate() {
        let frame = conn.read_frame().expect("a response");
        let ServerFrame::Response(resp) = frame else {
            panic!("seed {seed}: frame {id} refused: {frame:?}");
        };
        assert_eq!(resp.id, id as u64, "seed {seed}: answers out of order");
        assert_eq!(resp.results.len(), range.len(), "seed {seed}: frame {id}");
        for (reply, i) in resp.results.iter().zip(range.clone()) {
            assert!(
                native_matches(reply, &expect[i]),
                "seed {seed}, op {i} ({:?}) in frame {id}: got {reply:?}, the model says {:?}",
                cmds[i],
                expect[i]
            );
        }
    }
    sender.join().unwrap();
}

fn seeds() -> Vec<u64> {
    let n: u64 = std::env::var("RINGKV_PIPELINE_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    (1..=n).collect()
}

#[test]
fn resp_pipelines_across_shards_match_a_sequential_model() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, _native, resp) = start(dir.path(), &["--durability", "sync"]);
    for seed in seeds() {
        let (cmds, expect) = script(seed, 20_000);
        run_resp(resp, seed, &cmds, &expect);
        // The next seed starts from an empty key set.
        flush_all_resp(resp);
    }
}

#[test]
fn native_pipelines_across_shards_match_a_sequential_model() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, native, resp) = start(dir.path(), &["--durability", "sync"]);
    for seed in seeds() {
        let (cmds, expect) = script(seed + 1000, 20_000);
        run_native(native, seed + 1000, &cmds, &expect);
        flush_all_resp(resp);
    }
}

/// Deletes every model key and waits for the answers.
fn flush_all_resp(addr: SocketAddr) {
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let all: Vec<u8> = (0..KEYS).flat_map(|k| resp_command(&Cmd::Del(k))).collect();
    c.write_all(&all).unwrap();
    let mut buf = BytesMut::new();
    let mut chunk = vec![0u8; 4096];
    let mut seen = 0;
    while seen < KEYS {
        while let Some(r) = decode_reply(&mut buf, &ReplyLimits::default()).unwrap() {
            assert!(matches!(r, Reply::Int(_)), "{r:?}");
            seen += 1;
        }
        if seen < KEYS {
            let n = c.read(&mut chunk).unwrap();
            assert!(n > 0);
            buf.extend_from_slice(&chunk[..n]);
        }
    }
}

/// One connection streams 100,000 requests as fast as the server takes
/// them; another sends single GETs meanwhile. Each single GET must be
/// answered while the deep pipeline is still far from done (the server
/// interleaves connections; it never serves one connection's whole queue
/// first), and within a generous 10 s backstop. The latencies are printed
/// for the record (`--nocapture`); they are not a benchmark.
#[test]
fn a_deep_pipeline_does_not_hold_back_another_connections_request() {
    const DEEP: usize = 100_000;
    let dir = tempfile::tempdir().unwrap();
    let (_server, _native, resp) = start(dir.path(), &["--durability", "sync"]);
    let mut setup = TcpStream::connect(resp).unwrap();
    setup
        .write_all(&resp_command(&Cmd::Set(0, Bytes::from_static(b"single"))))
        .unwrap();
    let mut ok = [0u8; 5];
    setup.read_exact(&mut ok).unwrap();
    assert_eq!(&ok, b"+OK\r\n");

    let answered = Arc::new(AtomicUsize::new(0));
    let stream = TcpStream::connect(resp).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(120)))
        .unwrap();
    let mut writer = stream.try_clone().unwrap();
    let deep_writer = std::thread::spawn(move || {
        let value = Bytes::from(vec![b'x'; 1000]);
        let mut rng = Rng::new(77);
        let mut out = Vec::new();
        for i in 0..DEEP {
            let k = 1 + rng.below(KEYS - 1);
            let cmd = if i % 2 == 0 {
                Cmd::Set(k, value.clone())
            } else {
                Cmd::Get(k)
            };
            out.extend_from_slice(&resp_command(&cmd));
            if out.len() > 256 * 1024 {
                writer.write_all(&out).unwrap();
                out.clear();
            }
        }
        writer.write_all(&out).unwrap();
    });
    let counter = Arc::clone(&answered);
    let deep_reader = std::thread::spawn(move || {
        let mut reader = stream;
        let mut buf = BytesMut::new();
        let mut chunk = vec![0u8; 256 * 1024];
        let mut seen = 0;
        while seen < DEEP {
            while let Some(_r) = decode_reply(&mut buf, &ReplyLimits::default()).unwrap() {
                seen += 1;
            }
            counter.store(seen, Ordering::Release);
            if seen < DEEP {
                let n = reader.read(&mut chunk).unwrap();
                assert!(n > 0, "the deep pipeline's connection closed");
                buf.extend_from_slice(&chunk[..n]);
            }
        }
    });
    // Wait until the deep pipeline is being served.
    let t0 = Instant::now();
    while answered.load(Ordering::Acquire) < 1_000 {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the deep pipeline never started"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut single = TcpStream::connect(resp).unwrap();
    single
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let want = b"$6\r\nsingle\r\n";
    let mut worst = Duration::ZERO;
    let mut progress_at_answers = Vec::new();
    for _ in 0..20 {
        let started = Instant::now();
        single.write_all(&resp_command(&Cmd::Get(0))).unwrap();
        let mut got = [0u8; 12];
        single.read_exact(&mut got).unwrap();
        let took = started.elapsed();
        assert_eq!(&got, want);
        worst = worst.max(took);
        progress_at_answers.push(answered.load(Ordering::Acquire));
        std::thread::sleep(Duration::from_millis(5));
    }
    eprintln!(
        "single GETs beside a {DEEP}-request pipeline: worst {worst:?}; the pipeline had {:?} answers when they were answered",
        progress_at_answers
    );
    assert!(
        progress_at_answers[0] < DEEP / 2,
        "the first single GET was answered only after {} of the {DEEP} pipelined requests",
        progress_at_answers[0]
    );
    assert!(
        worst < Duration::from_secs(10),
        "a single GET took {worst:?}"
    );
    deep_writer.join().unwrap();
    deep_reader.join().unwrap();
}
