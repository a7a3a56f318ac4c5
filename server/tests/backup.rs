//! Online backup (`docs/operations.md`, "Backup and restore"): a backup
//! taken while writers hit every shard and multi-shard transactions commit
//! holds every write acknowledged before it started and none started after
//! it ended, transactions whole; a server started on the copy serves it;
//! `verify` passes the copy and refuses a copy whose server was killed
//! mid-backup, and the live directory is intact after that kill.

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{cli_binary, connect, start_server, with_runtime, WAIT};
use engine::backup::{BackupOptions, BACKUP_MARKER};
use engine::{Engine, Handle, Op, OpResult, TxnSettings};
use ringkv_server::cli::ToolArgs;
use ringkv_server::ops::verify::{verify, EXIT_CLEAN, EXIT_UNUSABLE};
use tunables::{ByteSize, Config, Durability, Tier};

const SHARDS: u32 = 4;

/// Small WAL segments and frequent checkpoints, so a backup meets several
/// segments, snapshot chains and (hybrid) value segments, and checkpoints
/// want to run while it copies.
fn engine_config(dir: &Path, tier: Tier) -> Config {
    let mut c = Config {
        shards: SHARDS,
        ..Default::default()
    };
    c.storage.data_dir = dir.to_path_buf();
    c.storage.durability = Durability::Sync;
    c.storage.tier = tier;
    c.storage.wal_segment_size = ByteSize::kib(256);
    c.storage.group_commit_max_bytes = ByteSize::kib(32);
    c.storage.checkpoint_wal_bytes = ByteSize::kib(384);
    c.storage.checkpoint_interval = tunables::Duration::from_secs(0);
    c.limits.key_bytes_max = ByteSize(128);
    c.limits.value_bytes_max = ByteSize::kib(8);
    if tier == Tier::Hybrid {
        c.storage.value_segment_size = ByteSize::kib(256);
        c.storage.cache_bytes = ByteSize::kib(256);
        c.storage.index_keys = 1 << 16;
    }
    c
}

/// The same settings as a config file, for the server and the tools.
fn config_file(dir: &Path, tier: Tier) -> PathBuf {
    let path = dir.join("ringkv.toml");
    let hybrid = match tier {
        Tier::Hybrid => {
            "value_segment_size = \"256KiB\"\ncache_bytes = \"256KiB\"\nindex_keys = 65536\n"
        }
        _ => "",
    };
    let tier = match tier {
        Tier::Hybrid => "hybrid",
        _ => "memory",
    };
    std::fs::write(
        &path,
        format!(
            "shards = {SHARDS}\n[storage]\ndurability = \"sync\"\ntier = \"{tier}\"\nwal_segment_size = \"256KiB\"\ngroup_commit_max_bytes = \"32KiB\"\ncheckpoint_wal_bytes = \"384KiB\"\ncheckpoint_interval = \"0s\"\n{hybrid}[limits]\nkey_bytes_max = 128\nvalue_bytes_max = \"8KiB\"\n"
        ),
    )
    .unwrap();
    path
}

/// [`config_file`] with segments large enough that the WAL a backup
/// copies (it links snapshots, and copies the used part of every segment
/// from the one its checkpoint falls in) is several MiB: at `--rate-mib 1`
/// the copy then takes seconds.
fn slow_backup_config_file(dir: &Path) -> PathBuf {
    let path = config_file(dir, Tier::Memory);
    let text = std::fs::read_to_string(&path).unwrap();
    let text = text.replace(
        "wal_segment_size = \"256KiB\"",
        "wal_segment_size = \"16MiB\"",
    );
    assert!(text.contains("16MiB"), "{text}");
    std::fs::write(&path, text).unwrap();
    path
}

fn run_verify(dir: &Path, config: &Path) -> (u8, String) {
    let mut out = Vec::new();
    let code = verify(
        &ToolArgs {
            data_dir: dir.to_path_buf(),
            config: Some(config.to_path_buf()),
        },
        &mut out,
    );
    (code, String::from_utf8(out).unwrap())
}

/// One write as its writer saw it: sent at `sent`, acknowledged at `acked`.
#[derive(Clone)]
struct Write {
    keys: Vec<Bytes>,
    value: Bytes,
    sent: Instant,
    acked: Option<Instant>,
}

fn value_for(key: &Bytes) -> Bytes {
    let mut v = key.to_vec();
    v.extend(std::iter::repeat_n(b'v', 100 + key.len() * 3));
    Bytes::from(v)
}

/// Keys `prefix-N` for N = 0.., the first one found on each of `shards`.
fn keys_on_shards(handle: &Handle, prefix: &str, shards: &[usize]) -> Vec<Bytes> {
    shards
        .iter()
        .map(|&s| {
            (0..)
                .map(|i| Bytes::from(format!("{prefix}-{i}")))
                .find(|k| handle.shard_of(k) == s)
                .unwrap()
        })
        .collect()
}

/// Writers on every shard (one key per write) and a stream of transactions
/// over two shards each, until `stop`; every write's times are logged.
fn start_load(
    handle: &Handle,
    stop: &Arc<AtomicBool>,
) -> (Vec<std::thread::JoinHandle<()>>, Arc<Mutex<Vec<Write>>>) {
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut threads = Vec::new();
    for w in 0..4u64 {
        let (handle, stop, log) = (handle.clone(), stop.clone(), log.clone());
        threads.push(std::thread::spawn(move || {
            let mut seq = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let ops: Vec<Op> = (0..8)
                    .map(|i| {
                        let key = Bytes::from(format!("w{w}-{seq:08}-{i}"));
                        Op::Put {
                            value: value_for(&key),
                            key,
                        }
                    })
                    .collect();
                let keys: Vec<Bytes> = ops.iter().map(|o| o.key().clone()).collect();
                let sent = Instant::now();
                let res = handle.batch_blocking(ops).unwrap();
                assert!(res.iter().all(|r| matches!(r, OpResult::Ok)));
                let acked = Some(Instant::now());
                let mut l = log.lock().unwrap();
                for key in keys {
                    l.push(Write {
                        value: value_for(&key),
                        keys: vec![key],
                        sent,
                        acked,
                    });
                }
                seq += 1;
            }
        }));
    }
    for t in 0..2u64 {
        let (handle, stop, log) = (handle.clone(), stop.clone(), log.clone());
        threads.push(std::thread::spawn(move || {
            let shards = [
                t as usize % SHARDS as usize,
                (t as usize + 1) % SHARDS as usize,
            ];
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let keys = keys_on_shards(&handle, &format!("tx{t}-{n}"), &shards);
                assert_ne!(handle.shard_of(&keys[0]), handle.shard_of(&keys[1]));
                let value = Bytes::from(format!("txn {t}-{n}"));
                let sent = Instant::now();
                let mut txn = handle.begin(TxnSettings::default());
                let ok = futures::executor::block_on(async {
                    for k in &keys {
                        if txn.put(k.clone(), value.clone()).await.is_err() {
                            txn.rollback().await;
                            return false;
                        }
                    }
                    txn.commit().await.is_ok()
                });
                let acked = ok.then(Instant::now);
                log.lock().unwrap().push(Write {
                    keys,
                    value,
                    sent,
                    acked,
                });
                n += 1;
            }
        }));
    }
    (threads, log)
}

/// Checks a restored engine against the writes' log and the backup's
/// window: acknowledged before `start` → present; sent after `end` →
/// absent; a transaction whole or absent. Returns (present, absent).
fn check_restored(handle: &Handle, log: &[Write], start: Instant, end: Instant) -> (usize, usize) {
    let (mut present, mut absent) = (0, 0);
    for w in log {
        let found: Vec<bool> = w
            .keys
            .iter()
            .map(|k| {
                match handle
                    .batch_blocking(vec![Op::Get { key: k.clone() }])
                    .unwrap()
                    .pop()
                {
                    Some(OpResult::Value(v)) => {
                        assert_eq!(v, w.value, "key {k:?} has another value");
                        true
                    }
                    Some(OpResult::NotFound) => false,
                    other => panic!("GET {k:?}: {other:?}"),
                }
            })
            .collect();
        assert!(
            found.iter().all(|&f| f) || found.iter().all(|&f| !f),
            "a transaction is half in the backup: {:?} -> {found:?}",
            w.keys
        );
        if w.acked.is_some_and(|a| a < start) {
            assert!(
                found[0],
                "{:?} was acknowledged before the backup began but is missing",
                w.keys
            );
        }
        if w.sent > end {
            assert!(
                !found[0],
                "{:?} was sent after the backup ended but is in it",
                w.keys
            );
        }
        if w.acked.is_none() {
            // A failed commit may be in or out, but whole (checked above).
        }
        if found[0] {
            present += 1;
        } else {
            absent += 1;
        }
    }
    (present, absent)
}

fn backup_under_load(tier: Tier) {
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("data");
    let dest = root.path().join("backup");
    let engine = Engine::open(&engine_config(&data, tier)).unwrap();
    let handle = engine.handle();
    let stop = Arc::new(AtomicBool::new(false));
    let (threads, log) = start_load(&handle, &stop);
    std::thread::sleep(Duration::from_millis(800));
    let start = Instant::now();
    let report = handle
        .backup(
            &BackupOptions {
                dest: dest.clone(),
                // Slow enough that the writers fill WAL segments and want
                // checkpoints while the files are copied.
                rate_bytes_per_sec: 4 << 20,
            },
            &mut |_| {},
        )
        .unwrap();
    let end = Instant::now();
    eprintln!(
        "backup: {} files, {} bytes in {:?}",
        report.progress.files, report.progress.bytes, report.duration
    );
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    assert!(handle.save_status().last_save_unix > 0);
    let m = engine.metrics();
    engine.shutdown().unwrap();
    assert!(
        m.shards.iter().all(|s| s.checkpoints >= 1),
        "the backup checkpoints every shard"
    );
    assert_eq!(report.shards.len(), SHARDS as usize);
    assert!(!dest.join(BACKUP_MARKER).exists());
    if tier == Tier::Hybrid {
        assert!(
            report.progress.linked > 0,
            "sealed value segments and snapshots are hard-linked"
        );
    }

    let config_path = config_file(root.path(), tier);
    let (code, out) = run_verify(&dest, &config_path);
    assert_eq!(code, EXIT_CLEAN, "verify of the backup:\n{out}");

    let restored = Engine::open(&engine_config(&dest, tier)).unwrap();
    let log = log.lock().unwrap().clone();
    let (present, absent) = check_restored(&restored.handle(), &log, start, end);
    restored.shutdown().unwrap();
    assert!(
        present > 200 && absent > 0,
        "present {present}, absent {absent}"
    );
    // The live directory still opens with everything.
    let live = Engine::open(&engine_config(&data, tier)).unwrap();
    for w in log.iter().filter(|w| w.acked.is_some()) {
        for k in &w.keys {
            assert!(
                matches!(
                    live.handle()
                        .batch_blocking(vec![Op::Get { key: k.clone() }])
                        .unwrap()[0],
                    OpResult::Value(_)
                ),
                "{k:?} lost from the live directory"
            );
        }
    }
    live.shutdown().unwrap();
}

#[test]
fn backup_under_load_memory_tier() {
    backup_under_load(Tier::Memory);
}

#[test]
fn backup_under_load_hybrid_tier() {
    backup_under_load(Tier::Hybrid);
}

#[test]
fn backup_refuses_a_used_directory_and_a_second_backup_at_once() {
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("data");
    let engine = Engine::open(&engine_config(&data, Tier::Memory)).unwrap();
    let handle = engine.handle();
    handle
        .batch_blocking(vec![Op::Put {
            key: Bytes::from_static(b"k"),
            value: Bytes::from_static(b"v"),
        }])
        .unwrap();
    let used = root.path().join("used");
    std::fs::create_dir_all(&used).unwrap();
    std::fs::write(used.join("x"), b"x").unwrap();
    let err = handle
        .backup(
            &BackupOptions {
                dest: used,
                rate_bytes_per_sec: 0,
            },
            &mut |_| {},
        )
        .unwrap_err();
    assert!(
        err.to_string().contains("must not exist or be empty"),
        "{err}"
    );
    let err = handle
        .backup(
            &BackupOptions {
                dest: data.clone(),
                rate_bytes_per_sec: 0,
            },
            &mut |_| {},
        )
        .unwrap_err();
    assert!(
        err.to_string().contains("must not exist or be empty"),
        "{err}"
    );
    engine.shutdown().unwrap();
}

/// A small data set makes a small backup: of the WAL segments (made
/// full-size in advance) only the flushes are copied, and the copies keep
/// their size as holes, which recovery reads as zeroes.
#[test]
fn a_backup_copies_the_used_part_of_wal_segments() {
    use std::os::unix::fs::MetadataExt;
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("data");
    let config = engine_config(&data, Tier::Memory);
    let segment = config.storage.wal_segment_size.0;
    let engine = Engine::open(&config).unwrap();
    let handle = engine.handle();
    let ops = (0..7)
        .map(|i| Op::Put {
            key: Bytes::from(format!("k{i}")),
            value: Bytes::from_static(b"v"),
        })
        .collect();
    handle.batch_blocking(ops).unwrap();
    let dest = root.path().join("backup");
    let report = handle
        .backup(
            &BackupOptions {
                dest: dest.clone(),
                rate_bytes_per_sec: 0,
            },
            &mut |_| {},
        )
        .unwrap();
    engine.shutdown().unwrap();
    assert!(
        report.progress.bytes < segment,
        "{} bytes copied for 7 keys ({segment}-byte segments)",
        report.progress.bytes
    );
    let mut segments = 0;
    for entry in walk(&dest) {
        if entry.extension().is_some_and(|e| e == "wal") {
            let m = std::fs::metadata(&entry).unwrap();
            assert_eq!(m.len(), segment, "{}", entry.display());
            assert!(m.blocks() * 512 < segment / 2, "{}: {m:?}", entry.display());
            segments += 1;
        }
    }
    assert!(segments > 0, "no WAL segment in the copy");
    let restored = Engine::open(&engine_config(&dest, Tier::Memory)).unwrap();
    for i in 0..7 {
        let got = restored
            .handle()
            .batch_blocking(vec![Op::Get {
                key: Bytes::from(format!("k{i}")),
            }])
            .unwrap();
        assert_eq!(got, vec![OpResult::Value(Bytes::from_static(b"v"))], "k{i}");
    }
    restored.shutdown().unwrap();
}

/// Every file under `dir`.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// The real server and CLI: `ringkv backup --to DIR` while clients write,
/// then a server started on DIR serves every acknowledged write.
#[test]
fn cli_backup_of_a_running_server_restores() {
    for tier in [Tier::Memory, Tier::Hybrid] {
        let root = tempfile::tempdir().unwrap();
        let data = root.path().join("data");
        let dest = root.path().join("backup");
        let config_path = config_file(root.path(), tier);
        let cfg = config_path.to_str().unwrap().to_string();
        let mut server = start_server(&data, &["--config", &cfg]);
        let addr = server.addr;
        let acked_before: Vec<u64> = with_runtime(async {
            let c = connect(addr).await;
            let mut acked = Vec::new();
            for i in 0..2000u64 {
                c.put(format!("k{i}"), format!("v{i}")).await.unwrap();
                acked.push(i);
            }
            acked
        });
        // A relative path would be the server's working directory's.
        let relative = std::process::Command::new(cli_binary())
            .args(["--server", &addr.to_string(), "backup", "--to", "backup"])
            .output()
            .unwrap();
        assert!(!relative.status.success());
        assert!(
            String::from_utf8_lossy(&relative.stderr).contains("must be absolute"),
            "{relative:?}"
        );
        let out = std::process::Command::new(cli_binary())
            .args(["--server", &addr.to_string(), "backup", "--to"])
            .arg(&dest)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            text.starts_with("backup ") && text.contains("files"),
            "{text}"
        );
        // Written after the backup: not in it.
        with_runtime(async {
            let c = connect(addr).await;
            c.put("after", "x").await.unwrap();
        });
        server.terminate();
        let (code, vout) = run_verify(&dest, &config_path);
        assert_eq!(code, EXIT_CLEAN, "{vout}");
        let mut restored = start_server(&dest, &["--config", &cfg]);
        let raddr = restored.addr;
        with_runtime(async {
            let c = connect(raddr).await;
            for i in &acked_before {
                let v = c.get(format!("k{i}")).await.unwrap();
                assert_eq!(v.as_deref(), Some(format!("v{i}").as_bytes()), "k{i}");
            }
            assert_eq!(c.get("after").await.unwrap(), None);
        });
        restored.terminate();
    }
}

/// `ringkv backup` prints a progress line (from a second connection's
/// STATS) while a slow backup copies, and STATS then tells the files the
/// finished backup holds.
#[test]
fn cli_backup_prints_progress_from_stats() {
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("data");
    let dest = root.path().join("backup");
    let config_path = slow_backup_config_file(root.path());
    let cfg = config_path.to_str().unwrap().to_string();
    let mut server = start_server(&data, &["--config", &cfg]);
    let addr = server.addr;
    let big = "x".repeat(2000);
    with_runtime(async {
        let c = connect(addr).await;
        for i in 0..2000u64 {
            c.put(format!("k{i}"), big.clone()).await.unwrap();
        }
    });
    // About 4 MB at 1 MiB/s: several seconds of copying.
    let out = std::process::Command::new(cli_binary())
        .args([
            "--server",
            &addr.to_string(),
            "backup",
            "--rate-mib",
            "1",
            "--to",
        ])
        .arg(&dest)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr
            .lines()
            .any(|l| l.starts_with("backup in progress: ") && l.contains(" files, ")),
        "no progress line while the backup copied: {stderr:?}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let files: u64 = stdout
        .split(": ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no file count in {stdout:?}"));
    let stats = with_runtime(async { connect(addr).await.stats().await.unwrap() });
    let stat = |name: &str| {
        stats
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("no {name} in STATS"))
    };
    assert_eq!(stat("engine.backup_in_progress"), "0");
    assert_eq!(stat("engine.backup_files"), files.to_string());
    assert!(stat("engine.backup_bytes").parse::<u64>().unwrap() >= 4_000_000);
    server.terminate();
}

/// kill -9 of the server while a (slow) backup copies: the live directory
/// opens with every acknowledged write; the partial copy is refused by
/// verify and by a start.
#[test]
fn kill_mid_backup_leaves_live_data_and_a_refused_copy() {
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("data");
    let dest = root.path().join("backup");
    let config_path = slow_backup_config_file(root.path());
    let cfg = config_path.to_str().unwrap().to_string();
    let mut server = start_server(&data, &["--config", &cfg]);
    let addr = server.addr;
    let big = "x".repeat(2000);
    let n = 3000u64;
    with_runtime(async {
        let c = connect(addr).await;
        for i in 0..n {
            c.put(format!("k{i}"), format!("{i}{big}")).await.unwrap();
        }
    });
    // 1 MiB/s over several MiB: the copy takes seconds.
    let mut cli = std::process::Command::new(cli_binary())
        .args([
            "--server",
            &addr.to_string(),
            "backup",
            "--rate-mib",
            "1",
            "--to",
        ])
        .arg(&dest)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + WAIT;
    while !dest.join("shard-000").join("wal").is_dir() {
        assert!(Instant::now() < deadline, "the backup never began copying");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(500));
    server.kill9();
    let _ = cli.wait();
    assert!(
        dest.join(BACKUP_MARKER).exists(),
        "the backup finished before the kill"
    );
    let (code, out) = run_verify(&dest, &config_path);
    assert_eq!(
        code, EXIT_UNUSABLE,
        "verify must refuse a partial backup:\n{out}"
    );
    assert!(out.contains(BACKUP_MARKER), "{out}");
    assert!(common::try_start_server(&dest, &["--config", &cfg]).is_err());
    let mut live = start_server(&data, &["--config", &cfg]);
    let laddr = live.addr;
    with_runtime(async {
        let c = connect(laddr).await;
        for i in 0..n {
            let v = c
                .get(format!("k{i}"))
                .await
                .unwrap()
                .expect("acknowledged key lost");
            assert!(v.starts_with(format!("{i}x").as_bytes()));
        }
    });
    live.terminate();
}
