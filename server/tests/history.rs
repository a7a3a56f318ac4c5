//! A history check with an existing checker: stateright's
//! `LinearizabilityTester` (crates.io `stateright`, pinned). Concurrent
//! clients run single-key writes (plain PUT), reads (a read-only transaction
//! `[BEGIN, GET, COMMIT]`) and small transactions (`GET_FOR_UPDATE a; PUT b;
//! COMMIT`) over three keys on both shards of a real server; the server is
//! killed with SIGKILL in the middle and restarted, and the clients go on.
//! Every invocation and completion is recorded; operations cut by the kill
//! never complete (the checker may place them anywhere, or nowhere). The
//! whole history, across the crash, must be linearizable against a
//! sequential three-register model.
//!
//! Reads use the transaction path on purpose: a plain GET may see a plain
//! write that is applied but not yet durable (docs/transactions.md), which a
//! crash can take back — that is the engine's documented plain-read rule,
//! and not linearizable across crashes.

mod common;

use bytes::Bytes;
use common::*;
use ringkv_client::{Client, ClientError, OpReply, RequestOp, Status};
use stateright::semantics::{ConsistencyTester, LinearizabilityTester, SequentialSpec};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const KEYS: usize = 3;

#[derive(Clone, Debug, Default)]
struct Registers([Option<u64>; KEYS]);

#[derive(Clone, Debug)]
enum HOp {
    Read(usize),
    Write(usize, u64),
    /// Read `a` under lock, write `b`, commit.
    Txn {
        a: usize,
        b: usize,
        v: u64,
    },
}

#[derive(Clone, Debug, PartialEq)]
enum HRet {
    Read(Option<u64>),
    Written,
    Committed(Option<u64>),
    /// Refused with no effect (LOCKED, DIE, LOCK_TIMEOUT, ABORTED).
    NoEffect,
}

impl SequentialSpec for Registers {
    type Op = HOp;
    type Ret = HRet;

    fn invoke(&mut self, op: &HOp) -> HRet {
        match *op {
            HOp::Read(k) => HRet::Read(self.0[k]),
            HOp::Write(k, v) => {
                self.0[k] = Some(v);
                HRet::Written
            }
            HOp::Txn { a, b, v } => {
                let seen = self.0[a];
                self.0[b] = Some(v);
                HRet::Committed(seen)
            }
        }
    }

    fn is_valid_step(&mut self, op: &HOp, ret: &HRet) -> bool {
        if *ret == HRet::NoEffect {
            return !matches!(op, HOp::Read(_));
        }
        &self.invoke(op) == ret
    }
}

fn key(k: usize) -> Bytes {
    Bytes::from(format!("hist-{k}"))
}

fn parse(v: &Bytes) -> u64 {
    std::str::from_utf8(v).unwrap().parse().unwrap()
}

fn refused(status: Status) -> bool {
    status == Status::Locked || status.is_txn_retry()
}

/// Runs `op`; `None` if the connection failed (the op stays pending).
async fn run(c: &Client, op: &HOp) -> Option<HRet> {
    let result: Result<Vec<OpReply>, ClientError> = match *op {
        HOp::Read(k) => {
            c.batch(vec![
                RequestOp::Begin,
                RequestOp::Get { key: key(k) },
                RequestOp::Commit,
            ])
            .await
        }
        HOp::Write(k, v) => {
            c.batch(vec![RequestOp::Put {
                key: key(k),
                value: Bytes::from(v.to_string()),
            }])
            .await
        }
        HOp::Txn { a, b, v } => {
            c.batch(vec![
                RequestOp::Begin,
                RequestOp::GetForUpdate { key: key(a) },
                RequestOp::Put {
                    key: key(b),
                    value: Bytes::from(v.to_string()),
                },
                RequestOp::Commit,
            ])
            .await
        }
    };
    let replies = result.ok()?;
    let value = |r: &OpReply| match r {
        OpReply::Value(v) => Some(parse(v)),
        _ => None,
    };
    let statuses: Vec<Status> = replies.iter().map(OpReply::status).collect();
    if statuses.iter().any(|s| refused(*s)) {
        return Some(HRet::NoEffect);
    }
    if let Some(bad) = statuses.iter().find(|s| s.is_error()) {
        // Anything else (POISONED, SHUTTING_DOWN): the outcome is unknown.
        eprintln!("history: {op:?} answered {bad}; left pending");
        return None;
    }
    Some(match op {
        HOp::Read(_) => HRet::Read(value(&replies[1])),
        HOp::Write(..) => HRet::Written,
        HOp::Txn { .. } => HRet::Committed(value(&replies[1])),
    })
}

type Tester = LinearizabilityTester<(u64, u64), Registers>;

/// Operations completed, and operations cut by the kill (left pending).
static DONE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static CUT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// One epoch of `clients` clients, each running `ops` operations.
async fn epoch(
    addr: std::net::SocketAddr,
    tester: Arc<Mutex<Tester>>,
    epoch: u64,
    clients: u64,
    ops: u64,
    next_value: Arc<std::sync::atomic::AtomicU64>,
) {
    let mut tasks = Vec::new();
    for client in 0..clients {
        let tester = tester.clone();
        let next_value = next_value.clone();
        tasks.push(tokio::spawn(async move {
            let Ok(c) = Client::connect_timeout(addr, Duration::from_secs(5)).await else {
                return;
            };
            let mut seed = (epoch * 31 + client + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            let mut below = |n: u64| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed % n
            };
            let thread = (epoch, client);
            for _ in 0..ops {
                let k = below(KEYS as u64) as usize;
                let op = match below(10) {
                    0..=3 => HOp::Read(k),
                    4..=6 => HOp::Write(
                        k,
                        next_value.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
                    ),
                    _ => HOp::Txn {
                        a: k,
                        b: (k + 1 + below(KEYS as u64 - 1) as usize) % KEYS,
                        v: next_value.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
                    },
                };
                tester
                    .lock()
                    .unwrap()
                    .on_invoke(thread, op.clone())
                    .expect("invoke");
                match run(&c, &op).await {
                    Some(ret) => {
                        tester
                            .lock()
                            .unwrap()
                            .on_return(thread, ret)
                            .expect("return");
                        DONE.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                    // Cut by the kill: this client's thread id stays pending.
                    None => {
                        CUT.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        return;
                    }
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("client task");
    }
}

#[test]
fn history_across_kill_9_is_linearizable() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let args = ["--shards", "2", "--durability", "sync"];
    let mut server = start_server(&data, &args);
    let tester = Arc::new(Mutex::new(Tester::new(Registers::default())));
    let next_value = Arc::new(std::sync::atomic::AtomicU64::new(1));
    let addr = server.addr;
    let (t, n) = (tester.clone(), next_value.clone());
    with_runtime(async move {
        // A bounded history (the check is a search): 3 x 10 operations, the
        // kill landing while they run.
        let load = tokio::spawn(epoch(addr, t, 0, 3, 10, n));
        while DONE.load(std::sync::atomic::Ordering::SeqCst) < 12 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        server.kill9();
        load.await.expect("epoch 0");
    });
    let server2 = start_server(&data, &args);
    let addr = server2.addr;
    let (t, n) = (tester.clone(), next_value.clone());
    with_runtime(epoch(addr, t, 1, 3, 6, n));
    let tester = tester.lock().unwrap();
    let cut = CUT.load(std::sync::atomic::Ordering::SeqCst);
    assert!(cut > 0, "the kill cut no operation (it came too late)");
    let ops = tester.len();
    assert!(ops > 15, "too short a history: {ops} operations");
    let consistent = tester.is_consistent();
    assert!(
        consistent,
        "the history of {ops} operations is not linearizable: {tester:?}"
    );
    eprintln!("history: {ops} operations ({cut} cut by the kill) across a kill -9, linearizable");
    drop(server2);
}
