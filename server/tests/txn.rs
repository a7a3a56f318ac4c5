//! Transactions against the real server process: the bank invariant under
//! concurrent transfers (checked continuously by locking read-only
//! transactions, and after kill -9 at random moments), and the deadlock and
//! stuck-client cases ending within their timeouts with the documented
//! answers (docs/transactions.md).
//!
//! Rounds of kill -9: `RINGKV_TXN_KILL9_ROUNDS` (default 2; CI runs more).

mod common;

use bytes::Bytes;
use common::*;
use ringkv_client::{Client, ClientError, OpReply, RequestOp, Status};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const ACCOUNTS: u64 = 16;
const START_BALANCE: u64 = 1000;
const CLIENTS: u64 = 6;

fn account(i: u64) -> Bytes {
    Bytes::from(format!("acct-{i:03}"))
}

fn receipt(c: u64) -> Bytes {
    Bytes::from(format!("receipt-{c}"))
}

fn number(v: &Option<Bytes>) -> u64 {
    v.as_ref()
        .map(|b| {
            std::str::from_utf8(b)
                .expect("utf8")
                .parse()
                .expect("number")
        })
        .unwrap_or(0)
}

/// A small xorshift; tests need no quality, only variety.
struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

fn retry_status(e: &ClientError) -> bool {
    matches!(e, ClientError::Server { status, .. } if status.is_txn_retry())
}

/// One transfer in two frames: [BEGIN, GFU a, GFU b], then
/// [PUT a, PUT b, PUT receipt, COMMIT]. Ok(true) committed, Ok(false)
/// aborted by DIE/LOCK_TIMEOUT/ABORTED (retry), Err otherwise.
async fn transfer(
    c: &Client,
    a: u64,
    b: u64,
    amount: u64,
    me: u64,
    seq: u64,
) -> Result<bool, ClientError> {
    let mut tx = c.transaction();
    let replies = match tx
        .batch(vec![
            RequestOp::GetForUpdate { key: account(a) },
            RequestOp::GetForUpdate { key: account(b) },
        ])
        .await
    {
        Ok(r) => r,
        Err(e) if retry_status(&e) => return Ok(false),
        Err(e) => return Err(e),
    };
    let mut balances = Vec::new();
    for r in replies {
        match r {
            OpReply::Value(v) => balances.push(number(&Some(v))),
            OpReply::NotFound => balances.push(0),
            OpReply::Error { status, .. } if status.is_txn_retry() => {
                let _ = tx.rollback().await;
                return Ok(false);
            }
            other => panic!("unexpected reply {other:?}"),
        }
    }
    let amount = amount.min(balances[0]);
    let puts = vec![
        RequestOp::Put {
            key: account(a),
            value: Bytes::from((balances[0] - amount).to_string()),
        },
        RequestOp::Put {
            key: account(b),
            value: Bytes::from((balances[1] + amount).to_string()),
        },
        RequestOp::Put {
            key: receipt(me),
            value: Bytes::from(seq.to_string()),
        },
    ];
    match tx.commit_with(puts).await {
        Ok(_) => Ok(true),
        Err(e) if retry_status(&e) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Sums every account inside one locking read-only transaction (one frame).
/// `None` if the transaction was aborted (retry).
async fn locked_total(c: &Client) -> Result<Option<u64>, ClientError> {
    let mut tx = c.transaction();
    let ops = (0..ACCOUNTS)
        .map(|i| RequestOp::GetForUpdate { key: account(i) })
        .collect();
    let replies = match tx.batch(ops).await {
        Ok(r) => r,
        Err(e) if retry_status(&e) => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut total = 0;
    for r in replies {
        match r {
            OpReply::Value(v) => total += number(&Some(v)),
            OpReply::NotFound => {}
            OpReply::Error { status, .. } if status.is_txn_retry() => {
                let _ = tx.rollback().await;
                return Ok(None);
            }
            other => panic!("unexpected reply {other:?}"),
        }
    }
    tx.rollback().await?;
    Ok(Some(total))
}

fn config_file(dir: &std::path::Path, extra: &str) -> std::path::PathBuf {
    config_file_with(dir, "", extra)
}

/// A configuration with `storage` lines in `[storage]` and `server` lines
/// in `[server]`.
fn config_file_with(dir: &std::path::Path, storage: &str, server: &str) -> std::path::PathBuf {
    let path = dir.join("ringkv-test.toml");
    std::fs::write(
        &path,
        format!("shards = 2\n[storage]\ndurability = \"sync\"\n{storage}\n[server]\n{server}\n"),
    )
    .unwrap();
    path
}

/// Runs transfer clients and a checker for `run_for` (or until `stop`);
/// returns the highest acknowledged receipt per client and the checks done.
async fn bank_load(addr: std::net::SocketAddr, run_for: Duration, seed: u64) -> (Vec<u64>, u64) {
    let stop = Arc::new(AtomicBool::new(false));
    let acked: Arc<Vec<AtomicU64>> = Arc::new((0..CLIENTS).map(|_| AtomicU64::new(0)).collect());
    let mut tasks = Vec::new();
    for me in 0..CLIENTS {
        let (stop, acked) = (stop.clone(), acked.clone());
        tasks.push(tokio::spawn(async move {
            let Ok(c) = Client::connect_timeout(addr, Duration::from_secs(5)).await else {
                return;
            };
            let mut rng = Rng(seed ^ (me + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
            let mut seq = acked[me as usize].load(Ordering::SeqCst);
            while !stop.load(Ordering::Relaxed) {
                let a = rng.below(ACCOUNTS);
                let b = (a + 1 + rng.below(ACCOUNTS - 1)) % ACCOUNTS;
                seq += 1;
                match transfer(&c, a, b, 1 + rng.below(50), me, seq).await {
                    Ok(true) => acked[me as usize].store(seq, Ordering::SeqCst),
                    Ok(false) => {
                        seq -= 1;
                        tokio::time::sleep(Duration::from_micros(100 + rng.below(900))).await;
                    }
                    // The server was killed under us.
                    Err(_) => return,
                }
            }
        }));
    }
    let checks = Arc::new(AtomicU64::new(0));
    let checker = {
        let (stop, checks) = (stop.clone(), checks.clone());
        tokio::spawn(async move {
            let Ok(c) = Client::connect_timeout(addr, Duration::from_secs(5)).await else {
                return;
            };
            while !stop.load(Ordering::Relaxed) {
                match locked_total(&c).await {
                    Ok(Some(total)) => {
                        assert_eq!(total, ACCOUNTS * START_BALANCE, "the bank total changed");
                        checks.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(None) => tokio::time::sleep(Duration::from_millis(1)).await,
                    Err(_) => return,
                }
            }
        })
    };
    // Until `run_for` has passed or every client stopped (server killed).
    let started = Instant::now();
    while started.elapsed() < run_for && !tasks.iter().all(|t| t.is_finished()) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.expect("transfer task");
    }
    checker
        .await
        .expect("the checker saw the bank total change");
    let acked = acked.iter().map(|a| a.load(Ordering::SeqCst)).collect();
    (acked, checks.load(Ordering::Relaxed))
}

async fn check_after_restart(addr: std::net::SocketAddr, acked: &[u64]) {
    let c = connect(addr).await;
    let total = loop {
        if let Some(t) = locked_total(&c).await.expect("total") {
            break t;
        }
    };
    assert_eq!(total, ACCOUNTS * START_BALANCE, "total after restart");
    for (me, &seq) in acked.iter().enumerate() {
        let got = number(&c.get(receipt(me as u64)).await.expect("receipt"));
        assert!(
            got >= seq,
            "client {me}: acknowledged transfer {seq} is lost (receipt says {got})"
        );
    }
}

#[test]
fn bank_total_holds_under_concurrency_and_kill_9() {
    bank_test("");
}

/// The same on the hybrid tier (values in segment files, a 1 MiB cache, so
/// the checks after each restart read balances from the device).
#[test]
fn bank_total_holds_under_concurrency_and_kill_9_hybrid_tier() {
    bank_test(
        "tier = \"hybrid\"\nindex_keys = 100000\ncache_bytes = \"1MiB\"\nvalue_segment_size = \"16MiB\"",
    );
}

fn bank_test(storage: &str) {
    let dir = tempfile::tempdir().unwrap();
    // Small WAL segments: the kill -9 rounds cross segment rollovers (a
    // new one every round or two), and the test keeps tens of MiB on disk
    // instead of ~1 GiB (64 MiB segments, each zero-filled when made).
    let storage = format!("wal_segment_size = \"4MiB\"\n{storage}");
    let cfg = config_file_with(dir.path(), &storage, "");
    let cfg = cfg.to_str().unwrap().to_string();
    let mut server = start_server(&dir.path().join("data"), &["--config", &cfg]);
    with_runtime(async {
        let c = connect(server.addr).await;
        let mut tx = c.transaction();
        let puts = (0..ACCOUNTS)
            .map(|i| RequestOp::Put {
                key: account(i),
                value: Bytes::from(START_BALANCE.to_string()),
            })
            .collect();
        tx.batch(puts).await.unwrap();
        tx.commit().await.unwrap();
        let (acked, checks) = bank_load(server.addr, Duration::from_millis(1500), 1).await;
        assert!(checks > 0, "the checker never completed a check");
        assert!(acked.iter().sum::<u64>() > 0, "no transfer committed");
        check_after_restart(server.addr, &acked).await;
    });
    let rounds: u64 = std::env::var("RINGKV_TXN_KILL9_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2);
    let mut rng = Rng(0xB4_4E);
    for round in 0..rounds {
        let addr = server.addr;
        let kill_after = Duration::from_millis(100 + rng.below(700));
        let acked = with_runtime(async {
            let load = tokio::spawn(bank_load(addr, Duration::from_secs(30), round + 7));
            tokio::time::sleep(kill_after).await;
            server.kill9();
            let (acked, _) = load.await.expect("load");
            acked
        });
        server = start_server(&dir.path().join("data"), &["--config", &cfg]);
        with_runtime(check_after_restart(server.addr, &acked));
        eprintln!(
            "kill -9 round {round}: after {kill_after:?}, acked receipts {acked:?}: total intact"
        );
    }
    server.terminate();
}

async fn status_of(r: Result<Vec<OpReply>, ClientError>) -> Vec<Status> {
    match r {
        Ok(replies) => replies.iter().map(OpReply::status).collect(),
        Err(ClientError::Server { status, .. }) => vec![status],
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn deadlocks_and_stuck_clients_end_within_the_timeouts() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config_file(
        dir.path(),
        "txn_lock_wait_timeout = \"300ms\"\ntxn_idle_timeout = \"800ms\"",
    );
    let mut server = start_server(
        &dir.path().join("data"),
        &["--config", cfg.to_str().unwrap()],
    );
    let addr = server.addr;
    with_runtime(async move {
        let a = connect(addr).await;
        let b = connect(addr).await;
        // 1. Opposite lock order: A (older) holds k1, B holds k2; B asking
        // for k1 dies at once; A asking for k2 waits until B's abort frees it.
        let mut ta = a.transaction();
        ta.get_for_update("k1").await.unwrap();
        let mut tb = b.transaction();
        tb.get_for_update("k2").await.unwrap();
        let started = Instant::now();
        let a_side = async move {
            let r = ta.get_for_update("k2").await;
            (r.map(|_| ()), ta.commit().await)
        };
        let b_side = async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let died = tb.get_for_update("k1").await;
            assert!(
                matches!(
                    &died,
                    Err(ClientError::Server {
                        status: Status::Die,
                        ..
                    })
                ),
                "{died:?}"
            );
            // B's later ops answer ABORTED until it ends.
            let again = tb.put("k3", "x").await;
            assert!(
                matches!(
                    &again,
                    Err(ClientError::Server {
                        status: Status::Aborted,
                        ..
                    })
                ),
                "{again:?}"
            );
            tb.rollback().await.unwrap();
        };
        let ((got, committed), ()) = tokio::join!(a_side, b_side);
        got.unwrap();
        committed.unwrap();
        assert!(started.elapsed() < Duration::from_secs(2));

        // 2. A silent client: C locks k and goes quiet. D, older than C,
        // waits for k and gets LOCK_TIMEOUT; after the idle timeout C's
        // transaction is aborted (its next op answers ABORTED) and k is free.
        let c = connect(addr).await;
        let d = connect(addr).await;
        let mut td = d.transaction();
        td.get("other").await.unwrap(); // D begins first: older
        let mut tc = c.transaction();
        tc.put("k", "c").await.unwrap();
        let started = Instant::now();
        let timed_out = td.get_for_update("k").await;
        assert!(
            matches!(
                &timed_out,
                Err(ClientError::Server {
                    status: Status::LockTimeout,
                    ..
                })
            ),
            "{timed_out:?}"
        );
        assert!(
            started.elapsed() >= Duration::from_millis(250),
            "{:?}",
            started.elapsed()
        );
        td.rollback().await.unwrap();
        tokio::time::sleep(Duration::from_millis(1200)).await;
        let late = tc.get("k").await;
        assert!(
            matches!(
                &late,
                Err(ClientError::Server {
                    status: Status::Aborted,
                    ..
                })
            ),
            "{late:?}"
        );
        let commit = tc.commit().await;
        assert!(
            matches!(
                &commit,
                Err(ClientError::Server {
                    status: Status::Aborted,
                    ..
                })
            ),
            "{commit:?}"
        );
        assert_eq!(
            c.get("k").await.unwrap(),
            None,
            "an aborted write is not applied"
        );
        let mut te = d.transaction();
        te.put("k", "e").await.unwrap();
        te.commit().await.unwrap();

        // 3. A connection dropped mid-transaction: its locks are released.
        let f = connect(addr).await;
        let mut tf = f.transaction();
        tf.put("dropped", "f").await.unwrap();
        std::mem::forget(tf); // no ROLLBACK: only the connection's close
        drop(f);
        let g = connect(addr).await;
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            let mut tg = g.transaction();
            match tg.put("dropped", "g").await {
                Ok(()) => {
                    tg.commit().await.unwrap();
                    break;
                }
                Err(ClientError::Server { status, .. }) if status.is_txn_retry() => {
                    drop(tg);
                    assert!(
                        Instant::now() < deadline,
                        "the dropped connection's lock stayed"
                    );
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(g.get("dropped").await.unwrap().as_deref(), Some(&b"g"[..]));

        // 4. A plain PUT on a locked key gets LOCKED and is not applied.
        let h = connect(addr).await;
        let mut th = h.transaction();
        th.put("hot", "txn").await.unwrap();
        let plain = g.put("hot", "plain").await;
        assert!(
            matches!(
                &plain,
                Err(ClientError::Server {
                    status: Status::Locked,
                    ..
                })
            ),
            "{plain:?}"
        );
        th.commit().await.unwrap();
        assert_eq!(g.get("hot").await.unwrap().as_deref(), Some(&b"txn"[..]));

        // 5. Protocol misuse gets NO_TRANSACTION, not a hang or a close.
        let misuse = status_of(h.batch(vec![RequestOp::Commit]).await).await;
        assert_eq!(misuse, vec![Status::NoTransaction]);
        let twice = status_of(
            h.batch(vec![
                RequestOp::Begin,
                RequestOp::Begin,
                RequestOp::Rollback,
            ])
            .await,
        )
        .await;
        assert_eq!(twice, vec![Status::Ok, Status::NoTransaction, Status::Ok]);
    });
    server.terminate();
}

#[test]
fn ringkv_tx_runs_a_script_as_one_transaction() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config_file(dir.path(), "");
    let mut server = start_server(
        &dir.path().join("data"),
        &["--config", cfg.to_str().unwrap()],
    );
    let run = |script: &str| {
        let path = dir.path().join("script.tx");
        std::fs::write(&path, script).unwrap();
        let out = std::process::Command::new(cli_binary())
            .args(["--server", &server.addr.to_string(), "tx"])
            .arg(&path)
            .output()
            .expect("run ringkv tx");
        (String::from_utf8(out.stdout).unwrap(), out.status.code())
    };
    let (out, code) = run("# move one\nput a 10\nput b 20\ngetu a\nget missing\n");
    assert_eq!(out, "OK\nOK\n10\nNOT_FOUND\nCOMMITTED\n");
    assert_eq!(code, Some(0));
    let (out, code) = run("put a 99\nrollback\n");
    assert_eq!(out, "OK\nROLLED BACK\n");
    assert_eq!(code, Some(0));
    let (out, _) = run("get a\nget b\n");
    assert_eq!(out, "10\n20\nCOMMITTED\n");
    let (_, code) = run("frobnicate a\n");
    assert_eq!(code, Some(2));
    server.terminate();
}

/// A client retries a transaction that died by sending BEGIN again on the
/// same connection: the retry keeps the first attempt's age, so it waits
/// behind a holder younger than that first attempt instead of dying for
/// it (with a new id it would be the youngest and die again).
#[test]
fn a_retry_after_die_keeps_the_first_attempts_age() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config_file(dir.path(), "txn_lock_wait_timeout = \"5s\"");
    let mut server = start_server(
        &dir.path().join("data"),
        &["--config", cfg.to_str().unwrap()],
    );
    let addr = server.addr;
    with_runtime(async move {
        let (a, b, c) = (
            connect(addr).await,
            connect(addr).await,
            connect(addr).await,
        );
        // A, the oldest, holds k1. B begins after A and dies on k1.
        let mut ta = a.transaction();
        ta.get_for_update("k1").await.unwrap();
        let mut tb = b.transaction();
        tb.get("x").await.unwrap();
        let died = tb.get_for_update("k1").await;
        assert!(
            matches!(
                &died,
                Err(ClientError::Server {
                    status: Status::Die,
                    ..
                })
            ),
            "{died:?}"
        );
        tb.rollback().await.unwrap();
        // C begins after B's first attempt and holds k2.
        let mut tc = c.transaction();
        tc.get_for_update("k2").await.unwrap();
        // B's retry is older than C: it waits for k2 and reads C's write.
        let mut retry = b.transaction();
        let b_side = async move {
            let got = retry.get_for_update("k2").await;
            retry.put("k2", "b").await.unwrap();
            retry.commit().await.unwrap();
            got
        };
        let c_side = async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            tc.put("k2", "c").await.unwrap();
            tc.commit().await.unwrap();
        };
        let (got, ()) = tokio::join!(b_side, c_side);
        assert_eq!(
            got.expect("the retry waits instead of dying").as_deref(),
            Some(&b"c"[..])
        );
        ta.rollback().await.unwrap();
        assert_eq!(a.get("k2").await.unwrap().as_deref(), Some(&b"b"[..]));

        // A committed transaction passes no age on: B's next transaction
        // is younger than D's, and dies on D's lock.
        let d = connect(addr).await;
        let mut td = d.transaction();
        td.get_for_update("k3").await.unwrap();
        let mut fresh = b.transaction();
        let died = fresh.get_for_update("k3").await;
        assert!(
            matches!(
                &died,
                Err(ClientError::Server {
                    status: Status::Die,
                    ..
                })
            ),
            "{died:?}"
        );
        fresh.rollback().await.unwrap();
        td.commit().await.unwrap();
    });
    server.terminate();
}
