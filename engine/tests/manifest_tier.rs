//! The storage tier, table hash and directory identity in the manifest
//! (format version 4): a
//! fresh data directory records the configured tier and a keyed table
//! hash, a version 1 manifest reads as the memory tier and is rewritten as
//! version 4 with a fresh identity, a directory is never opened with another tier than it holds,
//! and a tier code this build does not know is refused by name. Manifests of version 1 and odd tier codes are
//! written byte by byte here from the layout in `docs/wal.md`, not with the
//! engine's encoder, so the tests also pin the format.

mod common;

use common::*;
use ringkv_engine::hash::TableHasher;
use ringkv_engine::io::sim::SimDisk;
use ringkv_engine::io::{AlignedBuf, Disk, DiskFile};
use ringkv_engine::manifest::{self, Manifest, MANIFEST_VERSION};
use ringkv_engine::{Engine, EngineError, ManifestError};
use std::path::Path;
use tunables::{Durability, Tier};

const DIR: &str = "/d";

fn config(shards: u32, tier: Tier) -> tunables::Config {
    let mut c = small_config(Path::new(DIR), shards, Durability::Sync);
    c.storage.tier = tier;
    c
}

fn manifest_path() -> std::path::PathBuf {
    manifest::manifest_path(Path::new(DIR))
}

/// A manifest block: magic, `version`, shard count, "fnv1a64" padded to 16
/// bytes, then (when `tier_code` is given) the tier code, then the CRC-32
/// of everything before it.
fn manifest_bytes(version: u32, shards: u32, tier_code: Option<u32>) -> Vec<u8> {
    manifest_bytes_with(version, shards, tier_code, None)
}

/// A version 4 manifest block: version 3's fields (version 2's, then the
/// table hash code and its 16 key bytes, then the CRC-32 of those), then
/// the directory identity and the CRC-32 of everything before it.
fn manifest_bytes_v4(
    shards: u32,
    tier_code: u32,
    table_hash: (u32, [u8; 16]),
    dir_id: u64,
) -> Vec<u8> {
    let mut b = manifest_bytes_with(4, shards, Some(tier_code), Some(table_hash));
    b[60..68].copy_from_slice(&dir_id.to_le_bytes());
    let crc = crc32fast::hash(&b[..68]);
    b[68..72].copy_from_slice(&crc.to_le_bytes());
    b
}

fn manifest_bytes_with(
    version: u32,
    shards: u32,
    tier_code: Option<u32>,
    table_hash: Option<(u32, [u8; 16])>,
) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(b"RINGKVMF");
    b.extend_from_slice(&version.to_le_bytes());
    b.extend_from_slice(&shards.to_le_bytes());
    let mut name = [0u8; 16];
    name[..7].copy_from_slice(b"fnv1a64");
    b.extend_from_slice(&name);
    if let Some(code) = tier_code {
        b.extend_from_slice(&code.to_le_bytes());
    }
    if let Some((code, key)) = table_hash {
        b.extend_from_slice(&code.to_le_bytes());
        b.extend_from_slice(&key);
    }
    let crc = crc32fast::hash(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    b.resize(4096, 0);
    b
}

fn write_file(disk: &SimDisk, path: &Path, bytes: &[u8]) {
    block_on(async {
        disk.create_dir_all(path.parent().expect("parent"))
            .expect("mkdir");
        let f = disk.open(path, true).await.expect("create");
        let mut buf = AlignedBuf::with_capacity(bytes.len());
        buf.set_len(bytes.len());
        buf.as_mut_slice().copy_from_slice(bytes);
        let (r, _) = f.write_at(buf, 0).await;
        r.expect("write");
        f.sync_data().await.expect("sync");
    });
}

fn load(disk: &SimDisk) -> Manifest {
    block_on(manifest::load(disk, Path::new(DIR)))
        .expect("load")
        .expect("a manifest")
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

fn tier_mismatch_text(dir_tier: &str, config_tier: &str) -> String {
    format!(
        "data directory {DIR} holds a \"{dir_tier}\" tier; storage.tier is \"{config_tier}\": \
         set storage.tier = \"{dir_tier}\", or point storage.data_dir at an empty directory \
         (tiers cannot be converted in place)"
    )
}

#[test]
fn version_1_manifest_opens_as_memory_and_is_rewritten_as_version_4() {
    let disk = SimDisk::new(1);
    write_file(&disk, &manifest_path(), &manifest_bytes(1, 2, None));
    assert_eq!(load(&disk).version, 1);
    assert_eq!(load(&disk).tier, Tier::Memory);

    // shards = 0 follows the old manifest's count.
    let engine = Engine::open_with_disk(&config(0, Tier::Memory), disk.clone()).expect("open");
    assert_eq!(engine.shard_count(), 2);
    assert_eq!(engine.tier(), Tier::Memory);
    let h = engine.handle();
    h.batch_blocking((0..50).map(|i| put(i, 1)).collect())
        .expect("batch");
    engine.shutdown().expect("shutdown");

    assert_eq!(
        load(&disk),
        Manifest {
            version: MANIFEST_VERSION,
            shard_count: 2,
            hash: "fnv1a64".to_string(),
            tier: Tier::Memory,
            // A memory directory has nothing on disk placed by the table
            // hash: it is given a key with the rewrite.
            table_hasher: TableHasher::keyed(disk.new_table_hash_key().expect("key")),
            // And an identity.
            dir_id: disk.new_dir_id().expect("id"),
        }
    );
    let raw = disk
        .read_durable(&manifest_path())
        .expect("durable manifest");
    assert_eq!(u32_at(&raw, 8), 4, "version field");
    assert_eq!(u32_at(&raw, 32), 0, "tier code of memory");
    assert_eq!(u32_at(&raw, 36), 1, "table hash code of SipHash-1-3");
    assert_eq!(u32_at(&raw, 56), crc32fast::hash(&raw[..56]), "checksum");
    assert_eq!(
        u64::from_le_bytes(raw[60..68].try_into().expect("8")),
        disk.new_dir_id().expect("id"),
        "directory identity"
    );
    assert_eq!(u32_at(&raw, 68), crc32fast::hash(&raw[..68]), "checksum");
    assert!(
        !disk.files().iter().any(|p| p.ends_with("MANIFEST.tmp")),
        "the rewrite left its temporary file: {:?}",
        disk.files()
    );

    // The data written after the upgrade is there on the next open.
    let engine = Engine::open_with_disk(&config(2, Tier::Memory), disk).expect("reopen");
    let a = engine
        .handle()
        .batch_blocking((0..50).map(get).collect())
        .expect("batch");
    for (i, a) in a.iter().enumerate() {
        assert_eq!(value_of(a), Some(value(i as u64, 1)), "key {i}");
    }
    engine.shutdown().expect("shutdown");
}

#[test]
fn version_1_manifest_is_refused_for_the_hybrid_tier_and_left_as_it_was() {
    let disk = SimDisk::new(2);
    let old = manifest_bytes(1, 1, None);
    write_file(&disk, &manifest_path(), &old);
    let err = Engine::open_with_disk(&config(1, Tier::Hybrid), disk.clone())
        .expect_err("a memory directory must not open as hybrid");
    match &err {
        EngineError::Manifest(ManifestError::TierMismatch {
            manifest, config, ..
        }) => assert_eq!((*manifest, *config), (Tier::Memory, Tier::Hybrid)),
        other => panic!("wrong error: {other}"),
    }
    assert_eq!(err.to_string(), tier_mismatch_text("memory", "hybrid"));
    assert_eq!(
        disk.read_durable(&manifest_path()).as_deref(),
        Some(&old[..]),
        "a refused open must not rewrite the manifest"
    );
}

#[test]
fn hybrid_directory_is_refused_for_the_memory_tier() {
    let disk = SimDisk::new(3);
    write_file(&disk, &manifest_path(), &manifest_bytes(2, 1, Some(1)));
    assert_eq!(load(&disk).tier, Tier::Hybrid);
    let err = Engine::open_with_disk(&config(1, Tier::Memory), disk.clone())
        .expect_err("a hybrid directory must not open as memory");
    assert!(
        matches!(
            err,
            EngineError::Manifest(ManifestError::TierMismatch {
                manifest: Tier::Hybrid,
                config: Tier::Memory,
                ..
            })
        ),
        "{err}"
    );
    assert_eq!(err.to_string(), tier_mismatch_text("hybrid", "memory"));
    // Nothing of the memory tier was created there.
    assert!(
        !disk.files().iter().any(|p| p.starts_with("/d/shard-000")),
        "{:?}",
        disk.files()
    );
}

#[test]
fn fresh_directory_records_the_configured_tier() {
    let disk = SimDisk::new(4);
    let engine = Engine::open_with_disk(&config(1, Tier::Memory), disk.clone()).expect("open");
    engine.shutdown().expect("shutdown");
    // The sim disk draws the key from its seed; a real disk from getrandom.
    let key = disk.new_table_hash_key().expect("key");
    assert_eq!(
        load(&disk),
        Manifest::current(1, Tier::Memory, TableHasher::keyed(key))
            .with_dir_id(disk.new_dir_id().expect("id"))
    );
    let raw = disk.read_durable(&manifest_path()).expect("manifest");
    assert_eq!(
        raw,
        manifest_bytes_v4(1, 0, (1, key), disk.new_dir_id().expect("id"))
    );

    // The hybrid tier.
    let disk = SimDisk::new(5);
    let engine = Engine::open_with_disk(&config(1, Tier::Hybrid), disk.clone()).expect("open");
    assert_eq!(engine.tier(), Tier::Hybrid);
    engine.shutdown().expect("shutdown");
    let key = disk.new_table_hash_key().expect("key");
    assert_eq!(
        load(&disk),
        Manifest::current(1, Tier::Hybrid, TableHasher::keyed(key))
            .with_dir_id(disk.new_dir_id().expect("id"))
    );
    let raw = disk.read_durable(&manifest_path()).expect("manifest");
    assert_eq!(
        raw,
        manifest_bytes_v4(1, 1, (1, key), disk.new_dir_id().expect("id"))
    );
}

#[test]
fn version_4_manifest_round_trips_through_a_reopen() {
    let disk = SimDisk::new(6);
    let engine = Engine::open_with_disk(&config(2, Tier::Memory), disk.clone()).expect("open");
    engine
        .handle()
        .batch_blocking((0..20).map(|i| put(i, 3)).collect())
        .expect("batch");
    engine.shutdown().expect("shutdown");
    let before = disk.read_durable(&manifest_path()).expect("manifest");
    let key = disk.new_table_hash_key().expect("key");
    assert_eq!(
        before,
        manifest_bytes_v4(2, 0, (1, key), disk.new_dir_id().expect("id"))
    );

    let engine = Engine::open_with_disk(&config(0, Tier::Memory), disk.clone()).expect("reopen");
    assert_eq!(engine.shard_count(), 2);
    let a = engine
        .handle()
        .batch_blocking((0..20).map(get).collect())
        .expect("batch");
    assert!(a
        .iter()
        .enumerate()
        .all(|(i, a)| value_of(a) == Some(value(i as u64, 3))));
    engine.shutdown().expect("shutdown");
    assert_eq!(disk.read_durable(&manifest_path()), Some(before));
}

#[test]
fn unknown_tier_code_is_a_clear_error() {
    let disk = SimDisk::new(7);
    // A well-formed manifest (checksum holds) naming a tier this build
    // does not know, as a newer build could write.
    write_file(&disk, &manifest_path(), &manifest_bytes(2, 1, Some(7)));
    let err = Engine::open_with_disk(&config(1, Tier::Memory), disk.clone())
        .expect_err("unknown tier code");
    assert!(
        matches!(
            err,
            EngineError::Manifest(ManifestError::UnknownTier { found: 7, .. })
        ),
        "{err}"
    );
    let text = err.to_string();
    assert!(
        text.contains("/d/MANIFEST")
            && text.contains("tier code 7")
            && text.contains("newer build"),
        "{text}"
    );

    // A damaged tier field (checksum no longer holds) is corruption.
    let mut bytes = manifest_bytes(2, 1, Some(0));
    bytes[32] ^= 0x04;
    write_file(&disk, &manifest_path(), &bytes);
    let err = Engine::open_with_disk(&config(1, Tier::Memory), disk).expect_err("damaged tier");
    assert!(
        matches!(err, EngineError::Manifest(ManifestError::Corrupt { .. })),
        "{err}"
    );
    assert!(err.to_string().contains("checksum mismatch"), "{err}");
}

#[test]
fn hybrid_tier_without_a_wal_is_refused_at_open() {
    let disk = SimDisk::new(8);
    let mut c = small_config(Path::new(DIR), 1, Durability::None);
    c.storage.tier = Tier::Hybrid;
    let err = Engine::open_with_disk(&c, disk.clone()).expect_err("hybrid needs its WAL");
    assert!(matches!(err, EngineError::Config { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("storage.durability")
            && text.contains("\"none\"")
            && text.contains("storage.tier = \"hybrid\""),
        "{text}"
    );
    assert!(disk.files().is_empty(), "{:?}", disk.files());
}

/// A version 2 hybrid directory keeps the unkeyed table hash its index
/// checkpoints were built with (rewritten as version 4, table hash code 0);
/// a version 2 memory directory is given a key.
#[test]
fn version_2_directories_keep_or_gain_their_table_hash_by_tier() {
    for (seed, tier, code) in [(9, Tier::Hybrid, 1), (10, Tier::Memory, 0)] {
        let disk = SimDisk::new(seed);
        write_file(&disk, &manifest_path(), &manifest_bytes(2, 1, Some(code)));
        assert_eq!(load(&disk).table_hasher, TableHasher::LEGACY);
        let engine = Engine::open_with_disk(&config(1, tier), disk.clone()).expect("open");
        engine
            .handle()
            .batch_blocking((0..20).map(|i| put(i, 4)).collect())
            .expect("batch");
        engine.shutdown().expect("shutdown");
        let m = load(&disk);
        assert_eq!((m.version, m.tier), (4, tier));
        assert_eq!(m.dir_id, disk.new_dir_id().expect("id"));
        let raw = disk.read_durable(&manifest_path()).expect("manifest");
        match tier {
            Tier::Hybrid => {
                assert_eq!(m.table_hasher, TableHasher::LEGACY);
                let id = disk.new_dir_id().expect("id");
                assert_eq!(raw, manifest_bytes_v4(1, 1, (0, [0; 16]), id));
            }
            Tier::Memory => {
                let key = disk.new_table_hash_key().expect("key");
                assert_eq!(m.table_hasher, TableHasher::keyed(key));
                let id = disk.new_dir_id().expect("id");
                assert_eq!(raw, manifest_bytes_v4(1, 0, (1, key), id));
            }
        }
        // The data is there on the next open, with the same table hash.
        let engine = Engine::open_with_disk(&config(1, tier), disk.clone()).expect("reopen");
        let a = engine
            .handle()
            .batch_blocking((0..20).map(get).collect())
            .expect("batch");
        for (i, a) in a.iter().enumerate() {
            assert_eq!(value_of(a), Some(value(i as u64, 4)), "{tier:?} key {i}");
        }
        engine.shutdown().expect("shutdown");
        assert_eq!(disk.read_durable(&manifest_path()), Some(raw));
    }
}
