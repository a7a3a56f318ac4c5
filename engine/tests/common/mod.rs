//! Helpers shared by the engine's integration tests: small-footprint
//! configs (64 KiB segments so rollover and checkpoints happen quickly),
//! op builders, and a bounded wait.

#![allow(dead_code)]

pub mod hybrid;
pub mod tape;

use bytes::Bytes;
use ringkv_engine::{Current, Op, OpResult, UpdateAnswer, UpdateOutcome, UpdateWrite};
use std::path::Path;
use tunables::{Backend, ByteSize, Config, Durability};

/// A config for tests on the simulated disk: tiny segments and group
/// commits, checkpoints every 128 KiB of WAL, no timed checkpoints.
pub fn small_config(data_dir: &Path, shards: u32, durability: Durability) -> Config {
    let mut c = Config {
        shards,
        ..Default::default()
    };
    c.storage.data_dir = data_dir.to_path_buf();
    c.storage.durability = durability;
    c.storage.wal_segment_size = ByteSize::kib(64);
    c.storage.group_commit_max_bytes = ByteSize::kib(16);
    c.storage.checkpoint_wal_bytes = ByteSize::kib(128);
    c.storage.checkpoint_interval = tunables::Duration::from_secs(0);
    c.storage.flush_interval = tunables::Duration::from_millis(2);
    c.limits.key_bytes_max = ByteSize(64);
    c.limits.value_bytes_max = ByteSize(2048);
    c.limits.ops_per_frame_max = 500;
    c.limits.shard_queue_depth = 16;
    c.io.backend = Backend::Auto;
    c
}

pub fn key(i: u64) -> Bytes {
    Bytes::from(format!("key-{i:06}"))
}

/// A value naming its key and a version, of a length that varies with both.
pub fn value(i: u64, version: u64) -> Bytes {
    let len = 16 + ((i * 131 + version * 31) % 700) as usize;
    let mut v = format!("v{i}:{version}:").into_bytes();
    v.resize(len, b'.');
    Bytes::from(v)
}

/// Parses a value made by [`value`] back into (key index, version).
pub fn parse_value(v: &[u8]) -> Option<(u64, u64)> {
    let s = std::str::from_utf8(v).ok()?;
    let s = s.strip_prefix('v')?;
    let mut parts = s.split(':');
    let i = parts.next()?.parse().ok()?;
    let version = parts.next()?.parse().ok()?;
    Some((i, version))
}

pub fn put(i: u64, version: u64) -> Op {
    Op::Put {
        key: key(i),
        value: value(i, version),
    }
}

pub fn get(i: u64) -> Op {
    Op::Get { key: key(i) }
}

pub fn del(i: u64) -> Op {
    Op::Delete { key: key(i) }
}

pub fn value_of(r: &OpResult) -> Option<Bytes> {
    match r {
        OpResult::Value(v) => Some(v.clone()),
        _ => None,
    }
}

/// Runs `f` to its end on a fresh engine-style runtime (the simulated
/// disk's and recovery's futures need one).
pub fn block_on<F: std::future::Future>(f: F) -> F::Output {
    compio::runtime::Runtime::new()
        .expect("runtime")
        .block_on(f)
}

/// Installs a test log subscriber once (RUST_LOG picks the level).
pub fn init_log() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_test_writer()
        .try_init();
}

/// An update function (for `Op::Update`) that sets the value `arg`
/// expiring at `number` (Unix ms; 0: never).
pub fn set_expiring(_: Current, _now: u64, arg: &Bytes, number: i64) -> UpdateOutcome {
    UpdateOutcome {
        write: UpdateWrite::PutExpiring(arg.clone(), (number != 0).then_some(number as u64)),
        answer: UpdateAnswer::Ok,
    }
}

/// An update function that answers the key's expiry time: -2 missing,
/// -1 none, else the Unix ms.
pub fn expiry_of(current: Current, _now: u64, _: &Bytes, _: i64) -> UpdateOutcome {
    let answer = match current {
        None => -2,
        Some((_, None)) => -1,
        Some((_, Some(at))) => at as i64,
    };
    UpdateOutcome {
        write: UpdateWrite::Keep,
        answer: UpdateAnswer::Int(answer),
    }
}

/// Turns `config` into the crash tests' hybrid tier: values in 64 KiB
/// segments with a 16 KiB cache and a small index, so commits append to
/// the value device, GC runs and reads after a restart go to the device.
pub fn use_small_hybrid_tier(config: &mut Config) {
    config.storage.tier = tunables::Tier::Hybrid;
    config.storage.value_segment_size = tunables::ByteSize::kib(64);
    config.storage.cache_bytes = tunables::ByteSize::kib(16);
    config.storage.index_keys = 1024;
    config.storage.gc_garbage_percent = 5;
}

/// Log lines kept for a test to read ([`Captured::install`]).
#[derive(Clone, Default)]
pub struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    /// Makes the process's log (INFO and above, plain text) go here; once
    /// per test binary.
    pub fn install() -> Captured {
        let log = Captured::default();
        let writer = log.clone();
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::INFO)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .init();
        log
    }

    /// Everything logged so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

/// The lengths of the files on `disk` whose name ends in `.ext` (WAL
/// segments: "wal", snapshots: "snap").
pub fn file_lens(disk: &ringkv_engine::io::sim::SimDisk, ext: &str) -> Vec<u64> {
    disk.files()
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .filter_map(|p| disk.file_len(p))
        .collect()
}
