//! `ringkv-server verify`, `inspect` and `repair` on real data directories:
//! an engine (memory and hybrid tier) writes, checkpoints and stops; copies
//! of its directory are then damaged one way each, and the tools must name
//! the file and offset, give the exit code of `docs/operations.md`, agree
//! with the engine's own open, and (`repair`) make a refused directory
//! open again, saying what was dropped.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::copy_tree;
use engine::inspect::{self, Depth, SegmentState};
use engine::{Engine, Op};
use ringkv_server::cli::{RepairArgs, ToolArgs};
use ringkv_server::ops::verify::{
    inspect_dir, repair, verify, EXIT_CLEAN, EXIT_DAMAGED, EXIT_UNUSABLE, EXIT_USAGE,
};
use tunables::{ByteSize, Config, Durability, Tier};

/// Small segments, frequent checkpoints: several WAL segments, snapshots
/// and (hybrid) value segments after a few hundred KiB of writes.
fn config(dir: &Path, tier: Tier) -> Config {
    let mut c = Config {
        shards: 2,
        ..Default::default()
    };
    c.storage.data_dir = dir.to_path_buf();
    c.storage.durability = Durability::Sync;
    c.storage.tier = tier;
    c.storage.wal_segment_size = ByteSize::kib(64);
    c.storage.group_commit_max_bytes = ByteSize::kib(16);
    c.storage.checkpoint_wal_bytes = ByteSize::kib(96);
    c.storage.checkpoint_interval = tunables::Duration::from_secs(0);
    c.limits.key_bytes_max = ByteSize(64);
    c.limits.value_bytes_max = ByteSize(2048);
    if tier == Tier::Hybrid {
        c.storage.value_segment_size = ByteSize::kib(128);
        c.storage.cache_bytes = ByteSize::kib(64);
        c.storage.index_keys = 4096;
    }
    c
}

/// A data directory written by a real engine: at least one checkpoint per
/// shard, then more writes after it, then a clean stop. Returns the
/// directory and the config file the tools are given.
fn build(tier: Tier) -> (tempfile::TempDir, PathBuf) {
    build_with(tier, |_| {})
}

/// [`build`] with the config changed by `change` first.
fn build_with(tier: Tier, change: impl Fn(&mut Config)) -> (tempfile::TempDir, PathBuf) {
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("data");
    let mut config = config(&data, tier);
    change(&mut config);
    let engine = Engine::open(&config).unwrap();
    let handle = engine.handle();
    let mut version = 0u64;
    let write_round = |version: u64| {
        let ops = (0..40u64)
            .map(|i| Op::Put {
                key: Bytes::from(format!("key-{i:04}")),
                value: Bytes::from(vec![
                    b'a' + (version % 26) as u8;
                    300 + (i as usize * 7) % 200
                ]),
            })
            .collect();
        handle.batch_blocking(ops).unwrap();
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        write_round(version);
        version += 1;
        let m = engine.metrics();
        if m.shards.iter().all(|s| s.checkpoints >= 1) && version > 20 {
            break;
        }
        assert!(Instant::now() < deadline, "no checkpoint on every shard");
        std::thread::sleep(Duration::from_millis(5));
    }
    // Wait for the checkpoints to finish, then write a few flushes after them.
    std::thread::sleep(Duration::from_millis(200));
    for _ in 0..6 {
        write_round(version);
        version += 1;
    }
    engine.shutdown().unwrap();
    let file = root.path().join("ringkv.toml");
    std::fs::write(&file, config.to_toml_string()).unwrap();
    (root, file)
}

/// A copy of the built directory, to damage.
fn copy(from: &Path) -> tempfile::TempDir {
    let to = tempfile::tempdir().unwrap();
    copy_tree(from, to.path());
    to
}

/// Every file under `dir` but the lock, with its contents.
fn tree(dir: &Path) -> std::collections::BTreeMap<PathBuf, Vec<u8>> {
    let mut out = std::collections::BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let entry = entry.unwrap();
            if entry.file_type().unwrap().is_dir() {
                stack.push(entry.path());
            } else if entry.file_name() != "LOCK" {
                out.insert(entry.path(), std::fs::read(entry.path()).unwrap());
            }
        }
    }
    out
}

fn args(dir: &Path, config: &Path) -> ToolArgs {
    ToolArgs {
        data_dir: dir.to_path_buf(),
        config: Some(config.to_path_buf()),
    }
}

fn run_verify(dir: &Path, config: &Path) -> (u8, String) {
    let mut out = Vec::new();
    let code = verify(&args(dir, config), &mut out);
    let out = String::from_utf8(out).unwrap();
    if std::env::var_os("RINGKV_TEST_SHOW").is_some() {
        eprintln!("verify exit {code}:\n{out}");
    }
    (code, out)
}

/// What the engine itself says: does it open this directory?
fn engine_opens(dir: &Path, config_file: &Path, tier: Tier) -> bool {
    let scratch = copy(dir);
    let mut c = Config::load(config_file).unwrap();
    c.storage.data_dir = scratch.path().to_path_buf();
    c.storage.tier = tier;
    match Engine::open(&c) {
        Ok(e) => {
            e.halt();
            true
        }
        Err(_) => false,
    }
}

fn flip(path: &Path, offset: u64) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[offset as usize] ^= 0x10;
    std::fs::write(path, bytes).unwrap();
}

fn report(dir: &Path, config_file: &Path) -> inspect::Report {
    let mut c = Config::load(config_file).unwrap();
    c.storage.data_dir = dir.to_path_buf();
    inspect::examine(&c, Depth::Full)
}

/// Shard 0's newest used WAL segment and the flushes in it.
fn newest_segment(dir: &Path, config_file: &Path) -> (PathBuf, Vec<u64>) {
    let r = report(dir, config_file);
    let s = r.shards[0]
        .segments
        .iter()
        .rev()
        .find(|s| matches!(s.state, SegmentState::Used { .. }))
        .expect("a used segment");
    (s.path.clone(), s.flush_offsets.clone())
}

fn newest_snapshot(dir: &Path) -> PathBuf {
    let mut snaps: Vec<PathBuf> = std::fs::read_dir(dir.join("shard-000/snapshots"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "snap"))
        .collect();
    snaps.sort();
    snaps.pop().expect("a snapshot")
}

#[test]
fn a_clean_directory_verifies_and_inspect_lists_its_shards() {
    for tier in [Tier::Memory, Tier::Hybrid] {
        let (root, cfg) = build(tier);
        let data = root.path().join("data");
        let (code, out) = run_verify(&data, &cfg);
        assert_eq!(code, EXIT_CLEAN, "{tier:?}:\n{out}");
        assert!(
            out.contains("problems: none") && out.contains("opens"),
            "{out}"
        );
        assert!(out.contains("newest snapshot's chain"), "{out}");
        let mut listing = Vec::new();
        assert_eq!(inspect_dir(&args(&data, &cfg), &mut listing), EXIT_CLEAN);
        let listing = String::from_utf8(listing).unwrap();
        assert!(
            listing.contains("shard 0 (") && listing.contains("shard 1 ("),
            "{listing}"
        );
        assert!(
            listing.contains(&format!("tier {}", tier.as_str())),
            "{listing}"
        );
        // The two hashes by their own names: routing (shard of a key) and
        // the tables' (keyed SipHash on a new directory).
        assert!(
            listing.contains("routing hash fnv1a64, table hash siphash-1-3"),
            "{listing}"
        );
        if tier == Tier::Hybrid {
            assert!(listing.contains("value segments:"), "{listing}");
            assert!(out.contains("% live"), "{out}");
        }
        // Verify and inspect write nothing but the lock file, even though
        // the trial recovery recycles segments and rewrites the WAL head.
        let before = tree(&data);
        assert_eq!(run_verify(&data, &cfg).0, EXIT_CLEAN);
        assert_eq!(
            tree(&data),
            before,
            "{tier:?}: verify changed the directory"
        );
    }
}

#[test]
fn damage_mid_log_refuses_and_repair_drops_exactly_the_tail() {
    let (root, cfg) = build(Tier::Memory);
    let dir = copy(&root.path().join("data"));
    let (segment, flushes) = newest_segment(dir.path(), &cfg);
    assert!(
        flushes.len() >= 3,
        "need 3 flushes in {}: {flushes:?}",
        segment.display()
    );
    // A bit in the second flush's first record: newer complete flushes follow.
    let at = flushes[1];
    flip(&segment, at + 20);
    let (code, out) = run_verify(dir.path(), &cfg);
    assert_eq!(code, EXIT_UNUSABLE, "{out}");
    assert!(!engine_opens(dir.path(), &cfg, Tier::Memory));
    let line = format!("{} at offset {at}:", segment.display());
    assert!(
        out.contains(&line) && out.contains("DamageBeforeData"),
        "{line}\n{out}"
    );

    // Without the flag nothing is written.
    let before = std::fs::read(&segment).unwrap();
    let mut plan = Vec::new();
    let repair_args = |truncate: bool| RepairArgs {
        target: args(dir.path(), &cfg),
        truncate_wal_tail: truncate,
        backup_dir: None,
        no_backup: false,
    };
    assert_eq!(repair(&repair_args(false), &mut plan), EXIT_UNUSABLE);
    let plan = String::from_utf8(plan).unwrap();
    assert!(
        plan.contains(&format!("segment {} from offset {at}", segment.display())),
        "{plan}"
    );
    assert!(plan.contains("nothing was written"), "{plan}");
    assert_eq!(std::fs::read(&segment).unwrap(), before);

    let mut done = Vec::new();
    assert_eq!(repair(&repair_args(true), &mut done), EXIT_CLEAN);
    let done = String::from_utf8(done).unwrap();
    let dropped = flushes.len() - 2;
    assert!(
        done.contains(&format!("{dropped} complete flush(es)")),
        "{done}"
    );
    assert!(
        done.contains("LSNs ") && done.contains("copy kept: "),
        "{done}"
    );
    assert!(done.contains("repaired: 1 segment(s) changed"), "{done}");
    // The copy is the segment as it was.
    let copy_path = done
        .lines()
        .find_map(|l| l.strip_prefix("copy kept: "))
        .unwrap();
    assert_eq!(std::fs::read(copy_path).unwrap(), before);
    // The engine opens; verify is clean.
    assert!(engine_opens(dir.path(), &cfg, Tier::Memory));
    let (code, out) = run_verify(dir.path(), &cfg);
    assert_eq!(code, EXIT_CLEAN, "{out}");
}

/// Reopens the built directory with no durable mark due for a minute,
/// writes one more round and stops crash-like: its last flush is durable
/// but no mark vouches for it, as after a crash right behind a write.
fn write_unmarked_round(dir: &Path, config_file: &Path) {
    let mut c = Config::load(config_file).unwrap();
    c.storage.data_dir = dir.to_path_buf();
    c.storage.wal_mark_interval = tunables::Duration::from_secs(60);
    let engine = Engine::open(&c).unwrap();
    // Batches until the newest segment holds two flushes of them, so the
    // last flush is not its segment's first (whose header the WAL head
    // relies on: damage there is refused as such). A start continues in
    // the segment the log ended in, so the first batches may fill that
    // one and roll over.
    for round in 0..64u8 {
        let ops = (0..40u64)
            .map(|i| Op::Put {
                key: Bytes::from(format!("key-{i:04}")),
                value: Bytes::from(vec![b'a' + round % 26; 300]),
            })
            .collect();
        engine.handle().batch_blocking(ops).unwrap();
        if round >= 1 && newest_segment(dir, config_file).1.len() >= 2 {
            break;
        }
    }
    engine.halt();
}

fn repair_args(dir: &Path, cfg: &Path, truncate: bool) -> RepairArgs {
    RepairArgs {
        target: args(dir, cfg),
        truncate_wal_tail: truncate,
        backup_dir: None,
        no_backup: false,
    }
}

#[test]
fn a_torn_tail_is_damage_the_server_accepts() {
    let (root, cfg) = build(Tier::Memory);
    let dir = copy(&root.path().join("data"));
    write_unmarked_round(dir.path(), &cfg);
    let (segment, flushes) = newest_segment(dir.path(), &cfg);
    let last = *flushes.last().unwrap();
    flip(&segment, last + 20);
    let (code, out) = run_verify(dir.path(), &cfg);
    assert_eq!(code, EXIT_DAMAGED, "{out}");
    assert!(engine_opens(dir.path(), &cfg, Tier::Memory));
    assert!(
        out.contains(&format!("{} at offset {last}:", segment.display())),
        "{out}"
    );
    assert!(out.contains("TornTail"), "{out}");
    // Nothing for repair to do.
    let mut o = Vec::new();
    let code = repair(
        &RepairArgs {
            target: args(dir.path(), &cfg),
            truncate_wal_tail: true,
            backup_dir: None,
            no_backup: true,
        },
        &mut o,
    );
    assert_eq!(code, EXIT_DAMAGED, "{}", String::from_utf8_lossy(&o));
}

#[test]
fn a_damaged_last_flush_after_a_clean_stop_refuses_and_repair_counts_the_loss() {
    // The build ends with a clean stop, whose durable mark vouches for the
    // last flush: damage there is not a torn write. Before the mark the
    // server started on it and the flush's acknowledged writes were gone.
    let (root, cfg) = build(Tier::Memory);
    let dir = copy(&root.path().join("data"));
    let (segment, flushes) = newest_segment(dir.path(), &cfg);
    let last = *flushes.last().unwrap();
    let before = report(dir.path(), &cfg);
    let mark = before.shards[0].head.unwrap().marked_lsn;
    let end = before.shards[0].lsn_range().unwrap().1;
    assert_eq!(mark, end, "a clean stop marks its last record");
    flip(&segment, last + 20);
    let (code, out) = run_verify(dir.path(), &cfg);
    assert_eq!(code, EXIT_UNUSABLE, "{out}");
    assert!(!engine_opens(dir.path(), &cfg, Tier::Memory));
    assert!(out.contains("MarkedRecordsMissing"), "{out}");
    assert!(
        out.contains(&format!("{} at offset {last}", segment.display())),
        "names the damaged flush: {out}"
    );
    let damaged = report(dir.path(), &cfg);
    let reached = damaged.shards[0].lsn_range().unwrap().1;
    assert!(reached < mark);

    let mut done = Vec::new();
    assert_eq!(
        repair(&repair_args(dir.path(), &cfg, true), &mut done),
        EXIT_CLEAN
    );
    let done = String::from_utf8(done).unwrap();
    assert!(
        done.contains(&format!(
            "{} record(s) the durable mark vouched for are lost (LSNs {}..={mark})",
            mark - reached,
            reached + 1
        )),
        "{done}"
    );
    assert!(done.contains("wal.head"), "the head is kept too: {done}");
    assert!(
        done.contains("transactions: if what is given up held a part"),
        "two shards: the transaction warning is printed: {done}"
    );
    assert!(engine_opens(dir.path(), &cfg, Tier::Memory));
    // What is left is a torn tail below nothing the mark vouches for.
    let (code, out) = run_verify(dir.path(), &cfg);
    assert_eq!(code, EXIT_DAMAGED, "{out}");
    assert!(out.contains("TornTail"), "{out}");
}

#[test]
fn a_cut_segment_refuses_and_repair_grows_it_back() {
    // The case: the newest segment cut to half of what it holds.
    // A crash never leaves a used segment short, so this is damage.
    let (root, cfg) = build(Tier::Memory);
    let dir = copy(&root.path().join("data"));
    let (segment, flushes) = newest_segment(dir.path(), &cfg);
    assert!(flushes.len() >= 2, "{flushes:?}");
    let size = std::fs::metadata(&segment).unwrap().len();
    let cut = flushes[flushes.len() / 2] + 1000;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&segment)
        .unwrap()
        .set_len(cut)
        .unwrap();
    let (code, out) = run_verify(dir.path(), &cfg);
    assert_eq!(code, EXIT_UNUSABLE, "{out}");
    assert!(!engine_opens(dir.path(), &cfg, Tier::Memory));
    assert!(
        out.contains(&format!(
            "the segment is {cut} bytes but was created with {size}"
        )),
        "{out}"
    );
    assert!(out.contains("ShortSegment"), "{out}");

    let mut done = Vec::new();
    assert_eq!(
        repair(&repair_args(dir.path(), &cfg, true), &mut done),
        EXIT_CLEAN
    );
    let done = String::from_utf8(done).unwrap();
    assert!(
        done.contains(&format!("grow it back to {size} bytes")),
        "{done}"
    );
    assert!(
        done.contains("the durable mark vouched for are lost"),
        "{done}"
    );
    assert_eq!(std::fs::metadata(&segment).unwrap().len(), size);
    assert!(engine_opens(dir.path(), &cfg, Tier::Memory));
    let (code, out) = run_verify(dir.path(), &cfg);
    assert_eq!(code, EXIT_CLEAN, "{out}");
}

#[test]
fn a_missing_segment_refuses_naming_it() {
    let (root, cfg) = build(Tier::Memory);
    let dir = copy(&root.path().join("data"));
    let (segment, _) = newest_segment(dir.path(), &cfg);
    std::fs::remove_file(&segment).unwrap();
    let (code, out) = run_verify(dir.path(), &cfg);
    assert_eq!(code, EXIT_UNUSABLE, "{out}");
    assert!(!engine_opens(dir.path(), &cfg, Tier::Memory));
    assert!(out.contains(&segment.display().to_string()), "{out}");
    // When the removed segment was the only one holding records (the
    // newest snapshot lies in it, and nothing older is kept), the first
    // refusal is that no segment holds records; either way the head's
    // segment is named above.
    assert!(
        out.contains("NewestSegmentMissing") || out.contains("NoWalForSnapshot"),
        "{out}"
    );
}

#[test]
fn damaged_and_truncated_snapshots_are_named_and_judged_as_recovery_does() {
    let (root, cfg) = build(Tier::Memory);
    for truncate in [false, true] {
        let dir = copy(&root.path().join("data"));
        let snap = newest_snapshot(dir.path());
        let len = std::fs::metadata(&snap).unwrap().len();
        if truncate {
            let f = std::fs::OpenOptions::new().write(true).open(&snap).unwrap();
            f.set_len(len / 2).unwrap();
        } else {
            flip(&snap, 4096 + 40);
        }
        let (code, out) = run_verify(dir.path(), &cfg);
        let expected = if engine_opens(dir.path(), &cfg, Tier::Memory) {
            EXIT_DAMAGED
        } else {
            EXIT_UNUSABLE
        };
        assert_eq!(code, expected, "truncate={truncate}:\n{out}");
        let named = out
            .lines()
            .any(|l| l.contains(&format!("{} at offset ", snap.display())));
        assert!(named, "truncate={truncate}:\n{out}");
    }
}

#[test]
fn a_damaged_value_segment_block_is_named_with_its_offset() {
    let (root, cfg) = build(Tier::Hybrid);
    let dir = copy(&root.path().join("data"));
    let values = dir.path().join("shard-000/values");
    let mut segs: Vec<PathBuf> = std::fs::read_dir(&values)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    segs.sort();
    let seg = segs.first().expect("a value segment").clone();
    assert!(std::fs::metadata(&seg).unwrap().len() >= 2 * 4096);
    flip(&seg, 4096 + 100);
    let (code, out) = run_verify(dir.path(), &cfg);
    let expected = if engine_opens(dir.path(), &cfg, Tier::Hybrid) {
        EXIT_DAMAGED
    } else {
        EXIT_UNUSABLE
    };
    assert_eq!(code, expected, "{out}");
    assert!(
        out.contains(&format!(
            "{} at offset 4096: block checksum mismatch",
            seg.display()
        )),
        "{out}"
    );
}

/// A hot device in front of the value device (in the data directory too,
/// in its own folder): verify reads its segments as well, and names a
/// damaged block of one.
#[test]
fn a_damaged_hot_segment_block_is_named_with_its_offset() {
    let (root, cfg) = build_with(Tier::Hybrid, |c| {
        // The default device: the data directory, unthrottled.
        c.devices.insert("hot".to_string(), Default::default());
        c.storage.hot_device = "hot".to_string();
        c.storage.hot_bytes = ByteSize::kib(2 * 4 * 128);
    });
    let data = root.path().join("data");
    let (code, out) = run_verify(&data, &cfg);
    assert_eq!(code, EXIT_CLEAN, "{out}");
    let hot = data.join("shard-000/values-hot");
    let mut segs: Vec<PathBuf> = std::fs::read_dir(&hot)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| std::fs::metadata(p).unwrap().len() >= 2 * 4096)
        .collect();
    segs.sort();
    let seg = segs
        .first()
        .expect("a hot value segment with records")
        .clone();
    let dir = copy(&data);
    let seg = dir.path().join(seg.strip_prefix(&data).unwrap());
    flip(&seg, 4096 + 100);
    let (code, out) = run_verify(dir.path(), &cfg);
    assert!(code == EXIT_DAMAGED || code == EXIT_UNUSABLE, "{out}");
    assert!(
        out.contains(&format!(
            "{} at offset 4096: block checksum mismatch",
            seg.display()
        )),
        "{out}"
    );
}

#[test]
fn a_damaged_manifest_is_unusable() {
    let (root, cfg) = build(Tier::Memory);
    let dir = copy(&root.path().join("data"));
    let manifest = dir.path().join("MANIFEST");
    flip(&manifest, 13);
    let (code, out) = run_verify(dir.path(), &cfg);
    assert_eq!(code, EXIT_UNUSABLE, "{out}");
    assert!(
        out.contains(&format!("{} at offset 0:", manifest.display())),
        "{out}"
    );
}

#[test]
fn the_tools_refuse_a_directory_a_server_holds_and_exit_codes_reach_the_shell() {
    let (root, cfg) = build(Tier::Memory);
    let data = root.path().join("data");
    let held = ringkv_server::lockfile::DirLock::acquire(&data).unwrap();
    let mut out = Vec::new();
    assert_eq!(verify(&args(&data, &cfg), &mut out), EXIT_USAGE);
    drop(held);
    // The binary: exit codes 0 and 3, and 2 on a damaged manifest.
    let bin = env!("CARGO_BIN_EXE_ringkv-server");
    let status = |dir: &Path| {
        std::process::Command::new(bin)
            .args(["verify", "--config"])
            .arg(&cfg)
            .arg("--data-dir")
            .arg(dir)
            .output()
            .unwrap()
            .status
            .code()
    };
    assert_eq!(status(&data), Some(i32::from(EXIT_CLEAN)));
    assert_eq!(
        status(&root.path().join("nope")),
        Some(i32::from(EXIT_USAGE))
    );
    flip(&data.join("MANIFEST"), 13);
    assert_eq!(status(&data), Some(i32::from(EXIT_UNUSABLE)));
    // A command line the tools cannot parse is a usage error (3), never
    // "the server would refuse to start" (2); the server's own stays 2.
    let code = |args: &[&str]| {
        std::process::Command::new(bin)
            .args(args)
            .output()
            .unwrap()
            .status
            .code()
    };
    for tool in ["verify", "inspect", "repair"] {
        assert_eq!(code(&[tool]), Some(i32::from(EXIT_USAGE)), "{tool}");
        assert_eq!(
            code(&[tool, "--data-dir", "x", "--no-such-flag"]),
            Some(i32::from(EXIT_USAGE)),
            "{tool}"
        );
        assert_eq!(code(&[tool, "--help"]), Some(0), "{tool}");
    }
    assert_eq!(code(&["--no-such-flag"]), Some(2));
}

/// A start that fails says why once, on stderr, in the log's format.
#[test]
fn a_failed_start_says_why_once_in_the_logs_format() {
    let root = tempfile::tempdir().unwrap();
    let file = root.path().join("not-a-directory");
    std::fs::write(&file, b"x").unwrap();
    let bin = env!("CARGO_BIN_EXE_ringkv-server");
    for json in [false, true] {
        let config = root.path().join("ringkv.toml");
        let format = if json { "json" } else { "text" };
        std::fs::write(
            &config,
            format!("[log]\nformat = \"{format}\"\n[server]\nlisten = \"127.0.0.1:0\"\n"),
        )
        .unwrap();
        let out = std::process::Command::new(bin)
            .arg("--config")
            .arg(&config)
            .arg("--data-dir")
            .arg(&file)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.matches("cannot start").count(), 1, "{err}");
        if json {
            for line in err.lines() {
                assert!(line.starts_with('{'), "not JSON: {line}");
            }
        }
    }
}

/// Long reads say how far they are: verify's checks of WAL and value
/// segments and snapshots, and the server's recovery, print progress lines
/// (every 5 s; here at every step, RINGKV_PROGRESS_MS=0), on stderr for
/// the tools, whatever RUST_LOG is unset to.
#[test]
fn verify_and_recovery_print_progress_lines() {
    let (root, cfg) = build(Tier::Hybrid);
    let data = root.path().join("data");
    let bin = env!("CARGO_BIN_EXE_ringkv-server");
    let out = std::process::Command::new(bin)
        .args(["verify", "--config"])
        .arg(&cfg)
        .arg("--data-dir")
        .arg(&data)
        .env("RINGKV_PROGRESS_MS", "0")
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(i32::from(EXIT_CLEAN)), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    for what in [
        "checking a WAL segment",
        "checking a value segment",
        "reading a snapshot",
        "replaying a WAL segment",
    ] {
        assert!(err.contains(what), "no '{what}' line in:\n{err}");
    }
    // The report itself stays on stdout, without progress lines.
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(!report.contains("% of "), "{report}");
}

/// A hybrid directory of 3,000 keys written once, every one of them in
/// the newest checkpoint (nothing after it in the WAL), and its config
/// file: damage to a value segment then costs keys no replay brings back.
fn build_hybrid_keys() -> (tempfile::TempDir, PathBuf) {
    let root = tempfile::tempdir().unwrap();
    let config = config(&root.path().join("data"), Tier::Hybrid);
    let engine = Engine::open(&config).unwrap();
    let handle = engine.handle();
    for chunk in (0..3_000u64).collect::<Vec<_>>().chunks(100) {
        let ops = chunk
            .iter()
            .map(|&i| Op::Put {
                key: hybrid_key(i),
                value: Bytes::from(vec![b'v'; 400]),
            })
            .collect();
        handle.batch_blocking(ops).unwrap();
    }
    handle.checkpoint_all().unwrap();
    engine.shutdown().unwrap();
    let file = root.path().join("ringkv.toml");
    std::fs::write(&file, config.to_toml_string()).unwrap();
    (root, file)
}

fn hybrid_key(i: u64) -> Bytes {
    Bytes::from(format!("user:{i:06}"))
}

/// Shard 0's first value segment (full and sealed) in `dir`.
fn first_value_segment(dir: &Path) -> PathBuf {
    let seg = dir.join("shard-000/values/0000000000000001.seg");
    assert_eq!(std::fs::metadata(&seg).unwrap().len(), 128 * 1024);
    seg
}

/// The keys of [`build_hybrid_keys`] whose reads fail when the engine
/// opens a copy of `dir`; every other key must read its value.
fn unreadable_keys(dir: &Path, config_file: &Path) -> u64 {
    let scratch = copy(dir);
    let mut c = Config::load(config_file).unwrap();
    c.storage.data_dir = scratch.path().to_path_buf();
    let engine = Engine::open(&c).unwrap();
    let h = engine.handle();
    let mut failed = 0;
    for i in 0..3_000u64 {
        match h.batch_blocking(vec![Op::Get { key: hybrid_key(i) }]) {
            Ok(answers) => match &answers[..] {
                [engine::OpResult::Value(v)] => assert_eq!(v.len(), 400, "key {i}"),
                [engine::OpResult::Err(engine::OpError::ValueUnreadable { .. })] => failed += 1,
                other => panic!("key {i}: {other:?}"),
            },
            Err(engine::OpError::ValueUnreadable { .. }) => failed += 1,
            Err(e) => panic!("key {i}: {e}"),
        }
    }
    engine.shutdown().unwrap();
    failed
}

/// The issue "damage is never mistaken for a crash": a value segment cut
/// to less than half said only "a partial block at the end" while
/// thousands of keys could not be read.
#[test]
fn a_truncated_value_segment_is_reported_with_its_lengths_and_the_keys_lost() {
    let (root, cfg) = build_hybrid_keys();
    let dir = copy(&root.path().join("data"));
    let seg = first_value_segment(dir.path());
    let len = 12 * 4096 + 2816;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&seg)
        .unwrap()
        .set_len(len)
        .unwrap();
    let lost = unreadable_keys(dir.path(), &cfg);
    assert!(lost > 50, "{lost} keys lost");
    let (code, out) = run_verify(dir.path(), &cfg);
    assert_eq!(code, EXIT_DAMAGED, "{out}");
    let counted = format!(
        "{} at offset 49152: value segment damaged: it is {len} bytes, the index needs 131072, unreadable from offset 49152: {lost} keys unreadable (counted in the index of the newest snapshot",
        seg.display()
    );
    assert!(out.contains(&counted), "{out}");
    // The trial open counts after the WAL replay, as a start does.
    let at_start = format!("shard 0: {lost} keys unreadable, their values past the end of 1 value segment(s) cut short");
    assert!(out.contains(&at_start), "{out}");
    // repair has nothing to do for it, and says so.
    let mut out = Vec::new();
    let code = repair(
        &RepairArgs {
            target: args(dir.path(), &cfg),
            truncate_wal_tail: false,
            backup_dir: None,
            no_backup: false,
        },
        &mut out,
    );
    let out = String::from_utf8(out).unwrap();
    assert_eq!(code, EXIT_DAMAGED, "{out}");
    assert!(
        out.contains("not repaired (repair rewrites only WAL tails"),
        "{out}"
    );
    assert!(out.contains(&format!("{lost} keys unreadable")), "{out}");
}

/// A zeroed block in the middle of a value segment: verify names it and
/// counts its keys (a start does not read every block, so only the reads
/// of those keys find it).
#[test]
fn a_zeroed_value_block_is_reported_with_the_keys_lost() {
    let (root, cfg) = build_hybrid_keys();
    let dir = copy(&root.path().join("data"));
    let seg = first_value_segment(dir.path());
    let mut bytes = std::fs::read(&seg).unwrap();
    bytes[5 * 4096..6 * 4096].fill(0);
    std::fs::write(&seg, bytes).unwrap();
    let lost = unreadable_keys(dir.path(), &cfg);
    assert!(lost >= 9, "{lost} keys lost");
    let (code, out) = run_verify(dir.path(), &cfg);
    assert_eq!(code, EXIT_DAMAGED, "{out}");
    assert!(
        out.contains(&format!(
            "{} at offset 20480: block checksum mismatch",
            seg.display()
        )),
        "{out}"
    );
    let counted = format!(
        "{} at offset 20480: value segment damaged: it is 131072 bytes, the index needs 131072, 1 damaged block(s) at offset 20480: {lost} keys unreadable",
        seg.display()
    );
    assert!(out.contains(&counted), "{out}");
}

/// A value segment that is missing: the start refuses, naming it and the
/// keys the checkpoint's index holds there, and verify says the same.
#[test]
fn a_missing_value_segment_is_refused_with_the_keys_it_held() {
    let (root, cfg) = build_hybrid_keys();
    let dir = copy(&root.path().join("data"));
    let seg = first_value_segment(dir.path());
    std::fs::remove_file(&seg).unwrap();
    let (code, out) = run_verify(dir.path(), &cfg);
    assert!(!engine_opens(dir.path(), &cfg, Tier::Hybrid));
    assert_eq!(code, EXIT_UNUSABLE, "{out}");
    let refused = format!(
        "value segment(s) missing: {} (the checkpoint's index holds ",
        seg.display()
    );
    assert!(out.contains(&refused), "{out}");
    assert!(
        out.contains(&format!(
            "{}: value segment damaged: it is missing",
            seg.display()
        )),
        "{out}"
    );
}
