//! The data directory's manifest, `DATA/MANIFEST`: format version, shard
//! count, routing-hash name and storage tier, so a reopen never misroutes
//! keys or reads one tier's files as another's. One checksummed 4 KiB block,
//! replaced atomically (write `MANIFEST.tmp`, fdatasync, rename over
//! `MANIFEST`, fsync the directory).
//!
//! Version 1 had no tier field; it is read as the memory tier (the only
//! tier that build had). Versions 1 and 2 had no table hash key: they read
//! as the unkeyed [`TableHasher::LEGACY`] table hash. Versions 1 to 3 had
//! no directory identity ([`DirId`]): they read as 0 ("none yet"). The
//! engine rewrites an older manifest in the current layout (version 4) on
//! open, with a fresh identity; see [`settle_table_hasher`] for which table
//! hash it then records.

use crate::error::{IoFailure, ManifestError};
use crate::hash::{TableHasher, ROUTING_HASH_NAME, TABLE_HASH_KEY_BYTES};
use crate::io::{AlignedBuf, Disk, DiskFile, ALIGN};
use crate::layout::DirId;
use std::path::{Path, PathBuf};
use tunables::Tier as StorageTier;

pub const MANIFEST_FILE: &str = "MANIFEST";
const MANIFEST_TMP_FILE: &str = "MANIFEST.tmp";
const MAGIC: [u8; 8] = *b"RINGKVMF";
/// Manifest layout version written by this build.
pub const MANIFEST_VERSION: u32 = 4;
/// The oldest manifest version this build still reads.
pub const MANIFEST_VERSION_MIN: u32 = 1;
const HASH_NAME_BYTES: usize = 16;
/// Where the hash name ends (and, from version 2 on, the tier code starts).
const HASH_END: usize = 16 + HASH_NAME_BYTES;
/// Bytes covered by the checksum in version 1: magic, version, shard
/// count, hash name.
const BODY_BYTES_V1: usize = HASH_END;
/// Bytes covered by the checksum in version 2: version 1's, then the tier code.
const BODY_BYTES_V2: usize = HASH_END + 4;
/// Where the table hash code (u32) starts, from version 3 on; the 16 bytes
/// of its key follow it.
const TABLE_HASH_AT: usize = BODY_BYTES_V2;
const TABLE_KEY_AT: usize = TABLE_HASH_AT + 4;
/// Bytes covered by the checksum in version 3: version 2's, then the table
/// hash code and key.
const BODY_BYTES_V3: usize = TABLE_KEY_AT + TABLE_HASH_KEY_BYTES;
/// Where the directory identity (u64) starts, from version 4 on: after the
/// version 3 checksum, which version 4 keeps (over bytes 0..56, where a
/// version 3 build looks for it), so such a build reports the manifest as
/// written by a newer build rather than as corrupt.
const DIR_ID_AT: usize = BODY_BYTES_V3 + 4;
/// Bytes covered by the checksum in version 4: version 3's with its
/// checksum, then the directory identity.
const BODY_BYTES_V4: usize = DIR_ID_AT + 8;
const MANIFEST_BYTES: usize = BODY_BYTES_V4 + 4;
const _: () = assert!(MANIFEST_BYTES <= ALIGN);
/// Table hash code of the unkeyed FNV-1a table hash (its key bytes are zero).
pub const TABLE_HASH_CODE_LEGACY: u32 = 0;
/// Table hash code of SipHash-1-3 under the 16 key bytes that follow.
pub const TABLE_HASH_CODE_SIPHASH13: u32 = 1;

/// The manifest's table hash code and key bytes of `hasher`.
fn table_hash_fields(hasher: &TableHasher) -> (u32, [u8; TABLE_HASH_KEY_BYTES]) {
    match hasher.key() {
        None => (TABLE_HASH_CODE_LEGACY, [0; TABLE_HASH_KEY_BYTES]),
        Some(key) => (TABLE_HASH_CODE_SIPHASH13, key),
    }
}

/// The tier code of the manifest: 0 = memory, 1 = hybrid.
pub fn tier_code(tier: StorageTier) -> u32 {
    match tier {
        StorageTier::Memory => 0,
        StorageTier::Hybrid => 1,
    }
}

/// The tier of a manifest tier code, if this build knows it.
pub fn tier_from_code(code: u32) -> Option<StorageTier> {
    match code {
        0 => Some(StorageTier::Memory),
        1 => Some(StorageTier::Hybrid),
        _ => None,
    }
}

/// What the manifest records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    /// The layout version the manifest was read in (or is written in).
    pub version: u32,
    pub shard_count: u32,
    pub hash: String,
    /// The storage tier the data directory was created with. A version 1
    /// manifest reads as [`StorageTier::Memory`].
    pub tier: StorageTier,
    /// How the shards' in-RAM tables hash keys (its key is a secret: the
    /// `Debug` form prints only the hash's name). Versions 1 and 2 read as
    /// [`TableHasher::LEGACY`].
    pub table_hasher: TableHasher,
    /// The data directory's identity ([`DirId`]), in the header of every
    /// file the engine writes there. 0: none yet (versions 1 to 3); the
    /// engine gives the directory one when it upgrades the manifest.
    pub dir_id: DirId,
}

fn le_u32(bytes: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(w)
}

/// Whether the CRC-32 stored right after `bytes[..body]` matches them.
fn checksum_holds(bytes: &[u8], body: usize) -> Result<(), (u32, u32)> {
    let stored = le_u32(bytes, body);
    let computed = crc32fast::hash(&bytes[..body]);
    if stored == computed {
        Ok(())
    } else {
        Err((stored, computed))
    }
}

impl Manifest {
    /// The manifest this build writes for `shard_count` shards of `tier`
    /// whose tables hash keys with `table_hasher` (no directory identity
    /// yet: see [`Manifest::with_dir_id`]).
    pub fn current(shard_count: u32, tier: StorageTier, table_hasher: TableHasher) -> Manifest {
        Manifest {
            version: MANIFEST_VERSION,
            shard_count,
            hash: ROUTING_HASH_NAME.to_string(),
            tier,
            table_hasher,
            dir_id: 0,
        }
    }

    /// This manifest with the directory identity `dir_id`.
    pub fn with_dir_id(mut self, dir_id: DirId) -> Manifest {
        self.dir_id = dir_id;
        self
    }

    /// Whether this manifest was read in an older layout than this build
    /// writes (the engine then rewrites it).
    pub fn is_outdated(&self) -> bool {
        self.version < MANIFEST_VERSION
    }

    /// The manifest's bytes in the current layout (version 4): magic,
    /// version u32, shard count u32, hash name (16 bytes, zero padded), tier
    /// code u32, table hash code u32, table hash key (16 bytes, zero when
    /// unkeyed), CRC32 of all of those, directory identity u64, CRC32 of
    /// all before it; zero to 4 KiB. The `version` field is written as
    /// [`MANIFEST_VERSION`] whatever it holds.
    pub fn encode(&self) -> AlignedBuf {
        assert!(self.hash.len() <= HASH_NAME_BYTES);
        let mut buf = AlignedBuf::with_capacity(ALIGN);
        buf.set_len(ALIGN);
        let b = buf.as_mut_slice();
        b[0..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&MANIFEST_VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&self.shard_count.to_le_bytes());
        b[16..16 + self.hash.len()].copy_from_slice(self.hash.as_bytes());
        b[HASH_END..BODY_BYTES_V2].copy_from_slice(&tier_code(self.tier).to_le_bytes());
        let (code, key) = table_hash_fields(&self.table_hasher);
        b[TABLE_HASH_AT..TABLE_KEY_AT].copy_from_slice(&code.to_le_bytes());
        b[TABLE_KEY_AT..BODY_BYTES_V3].copy_from_slice(&key);
        let crc = crc32fast::hash(&b[..BODY_BYTES_V3]);
        b[BODY_BYTES_V3..DIR_ID_AT].copy_from_slice(&crc.to_le_bytes());
        b[DIR_ID_AT..BODY_BYTES_V4].copy_from_slice(&self.dir_id.to_le_bytes());
        let crc = crc32fast::hash(&b[..BODY_BYTES_V4]);
        b[BODY_BYTES_V4..MANIFEST_BYTES].copy_from_slice(&crc.to_le_bytes());
        buf
    }

    /// Parses and checks a manifest block read from `file` (version 1 to 4).
    pub fn decode(bytes: &[u8], file: &Path) -> Result<Manifest, ManifestError> {
        let corrupt = |reason: &str| ManifestError::Corrupt {
            file: file.to_path_buf(),
            reason: reason.to_string(),
        };
        if bytes.len() < MANIFEST_BYTES {
            return Err(corrupt("shorter than a manifest"));
        }
        // The version says where the checksum is; a damaged version field
        // shows up as a checksum that holds in no layout.
        let version = le_u32(bytes, 8);
        let body = match version {
            1 => BODY_BYTES_V1,
            2 => BODY_BYTES_V2,
            3 => BODY_BYTES_V3,
            4 => BODY_BYTES_V4,
            _ => {
                let holds = [BODY_BYTES_V1, BODY_BYTES_V2, BODY_BYTES_V3, BODY_BYTES_V4]
                    .into_iter()
                    .any(|body| checksum_holds(bytes, body).is_ok());
                if bytes[0..8] == MAGIC && holds {
                    return Err(ManifestError::UnsupportedVersion {
                        file: file.to_path_buf(),
                        found: version,
                        oldest: MANIFEST_VERSION_MIN,
                        newest: MANIFEST_VERSION,
                    });
                }
                BODY_BYTES_V4
            }
        };
        if let Err((stored, computed)) = checksum_holds(bytes, body) {
            return Err(corrupt(&format!(
                "checksum mismatch (stored {stored:#010x}, computed {computed:#010x})"
            )));
        }
        if bytes[0..8] != MAGIC {
            return Err(corrupt("bad magic"));
        }
        if version >= 4 {
            // Version 4 keeps version 3's checksum too: both must hold.
            if let Err((stored, computed)) = checksum_holds(bytes, BODY_BYTES_V3) {
                return Err(corrupt(&format!(
                    "checksum mismatch (stored {stored:#010x}, computed {computed:#010x})"
                )));
            }
        }
        let shard_count = le_u32(bytes, 12);
        if shard_count == 0 {
            return Err(corrupt("shard count is zero"));
        }
        let name = &bytes[16..HASH_END];
        let name_len = name.iter().position(|&b| b == 0).unwrap_or(HASH_NAME_BYTES);
        let hash = std::str::from_utf8(&name[..name_len])
            .map_err(|_| corrupt("hash name is not UTF-8"))?
            .to_string();
        if hash != ROUTING_HASH_NAME {
            return Err(ManifestError::UnknownHash {
                file: file.to_path_buf(),
                found: hash,
                supported: ROUTING_HASH_NAME,
            });
        }
        let tier = if version == 1 {
            StorageTier::Memory
        } else {
            let code = le_u32(bytes, HASH_END);
            tier_from_code(code).ok_or_else(|| ManifestError::UnknownTier {
                file: file.to_path_buf(),
                found: code,
            })?
        };
        let table_hasher = if version < 3 {
            TableHasher::LEGACY
        } else {
            let mut key = [0u8; TABLE_HASH_KEY_BYTES];
            key.copy_from_slice(&bytes[TABLE_KEY_AT..BODY_BYTES_V3]);
            match le_u32(bytes, TABLE_HASH_AT) {
                TABLE_HASH_CODE_LEGACY if key == [0; TABLE_HASH_KEY_BYTES] => TableHasher::LEGACY,
                TABLE_HASH_CODE_LEGACY => {
                    return Err(corrupt("the unkeyed table hash has key bytes"));
                }
                TABLE_HASH_CODE_SIPHASH13 => TableHasher::keyed(key),
                code => return Err(corrupt(&format!("unknown table hash code {code}"))),
            }
        };
        let dir_id = if version >= 4 {
            u64::from_le_bytes(bytes[DIR_ID_AT..BODY_BYTES_V4].try_into().expect("8 bytes"))
        } else {
            0
        };
        Ok(Manifest {
            version,
            shard_count,
            hash,
            tier,
            table_hasher,
            dir_id,
        })
    }
}

/// Path of the manifest in `data_dir`.
pub fn manifest_path(data_dir: &Path) -> PathBuf {
    data_dir.join(MANIFEST_FILE)
}

/// Reads the manifest of `data_dir`; `Ok(None)` if there is none yet.
pub async fn load<D: Disk>(disk: &D, data_dir: &Path) -> Result<Option<Manifest>, ManifestError> {
    let path = manifest_path(data_dir);
    if !disk.exists(&path) {
        return Ok(None);
    }
    let file = disk
        .open(&path, false)
        .await
        .map_err(ManifestError::io("open", &path))?;
    let (res, buf) = file.read_at(AlignedBuf::with_capacity(ALIGN), 0).await;
    res.map_err(ManifestError::io("read", &path))?;
    Manifest::decode(buf.as_slice(), &path).map(Some)
}

/// Writes `manifest` into `data_dir` atomically and durably.
pub async fn store<D: Disk>(
    disk: &D,
    data_dir: &Path,
    manifest: &Manifest,
) -> Result<(), ManifestError> {
    let tmp = data_dir.join(MANIFEST_TMP_FILE);
    let path = manifest_path(data_dir);
    let file = disk
        .open(&tmp, true)
        .await
        .map_err(ManifestError::io("create", &tmp))?;
    file.set_len(0)
        .await
        .map_err(ManifestError::io("truncate", &tmp))?;
    let (res, _) = file.write_at(manifest.encode(), 0).await;
    res.map_err(ManifestError::io("write", &tmp))?;
    file.sync_data()
        .await
        .map_err(ManifestError::io("fdatasync", &tmp))?;
    drop(file);
    disk.rename(&tmp, &path)
        .await
        .map_err(ManifestError::io("rename", &tmp))?;
    disk.sync_dir(data_dir)
        .await
        .map_err(ManifestError::io("fsync directory", data_dir))?;
    Ok(())
}

/// The table hasher a data directory runs with, and whether the manifest
/// must record it (a new directory, or an upgrade). `fresh_key` draws a new
/// random key; it is called only when one is needed.
///
/// - A new directory gets a keyed hasher under a fresh key.
/// - A directory whose manifest has a key keeps it.
/// - A memory-tier directory without one (made before keys existed) is
///   given a fresh key: nothing it keeps on disk depends on the table hash
///   (its snapshots and WAL hold keys, placed again by hash on load).
/// - A hybrid-tier directory without one keeps the unkeyed
///   [`TableHasher::LEGACY`]: its index checkpoints store tags of that hash.
///   To key it, copy its data into a new data directory.
pub fn settle_table_hasher(
    existing: Option<&Manifest>,
    fresh_key: impl FnOnce() -> std::io::Result<[u8; TABLE_HASH_KEY_BYTES]>,
) -> std::io::Result<(TableHasher, bool)> {
    match existing {
        Some(m) if m.table_hasher.is_keyed() || m.tier == StorageTier::Hybrid => {
            Ok((m.table_hasher, false))
        }
        _ => Ok((TableHasher::keyed(fresh_key()?), true)),
    }
}

/// Refuses to open a data directory whose manifest records another tier
/// than the config asks for: the tiers keep different files, and there is
/// no conversion between them.
pub fn check_tier(
    config_tier: StorageTier,
    existing: Option<&Manifest>,
    data_dir: &Path,
) -> Result<(), ManifestError> {
    match existing {
        Some(m) if m.tier != config_tier => Err(ManifestError::TierMismatch {
            dir: data_dir.to_path_buf(),
            manifest: m.tier,
            config: config_tier,
        }),
        _ => Ok(()),
    }
}

/// The shard count to run with: the config's, unless it is 0 (one per
/// core) and a manifest exists, whose count then wins. A config count that
/// differs from the manifest's is refused: re-sharding is not built.
pub fn resolve_shard_count(
    config_shards: u32,
    existing: Option<&Manifest>,
    cores: usize,
    data_dir: &Path,
) -> Result<u32, ManifestError> {
    match (config_shards, existing) {
        (0, Some(m)) => {
            tracing::info!(
                shards = m.shard_count,
                dir = %data_dir.display(),
                "shards = 0: using the shard count recorded in the manifest"
            );
            Ok(m.shard_count)
        }
        (0, None) => Ok(u32::try_from(cores.max(1)).unwrap_or(u32::MAX)),
        (n, Some(m)) if n != m.shard_count => Err(ManifestError::ShardCountMismatch {
            dir: data_dir.to_path_buf(),
            manifest: m.shard_count,
            config: n,
        }),
        (n, _) => Ok(n),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A version 1 manifest block, laid out as that version wrote it.
    fn encode_v1(shard_count: u32) -> Vec<u8> {
        let mut b = vec![0u8; ALIGN];
        b[0..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&1u32.to_le_bytes());
        b[12..16].copy_from_slice(&shard_count.to_le_bytes());
        b[16..16 + ROUTING_HASH_NAME.len()].copy_from_slice(ROUTING_HASH_NAME.as_bytes());
        let crc = crc32fast::hash(&b[..BODY_BYTES_V1]);
        b[BODY_BYTES_V1..BODY_BYTES_V1 + 4].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// A version 2 manifest block (no table hash fields).
    fn encode_v2(shard_count: u32, tier: StorageTier) -> Vec<u8> {
        let mut b = encode_v1(shard_count);
        b[8..12].copy_from_slice(&2u32.to_le_bytes());
        b[HASH_END..BODY_BYTES_V2].copy_from_slice(&tier_code(tier).to_le_bytes());
        let crc = crc32fast::hash(&b[..BODY_BYTES_V2]);
        b[BODY_BYTES_V2..BODY_BYTES_V2 + 4].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Sets the u32 at `at` and recomputes the version 3 and 4 checksums.
    fn patch_v3(bytes: &mut [u8], at: usize, value: u32) {
        bytes[at..at + 4].copy_from_slice(&value.to_le_bytes());
        let crc = crc32fast::hash(&bytes[..BODY_BYTES_V3]);
        bytes[BODY_BYTES_V3..DIR_ID_AT].copy_from_slice(&crc.to_le_bytes());
        let crc = crc32fast::hash(&bytes[..BODY_BYTES_V4]);
        bytes[BODY_BYTES_V4..MANIFEST_BYTES].copy_from_slice(&crc.to_le_bytes());
    }

    /// A version 3 manifest block (no directory identity).
    fn encode_v3(shard_count: u32, tier: StorageTier, hasher: TableHasher) -> Vec<u8> {
        let mut b = Manifest::current(shard_count, tier, hasher)
            .with_dir_id(77)
            .encode()
            .as_slice()
            .to_vec();
        b[8..12].copy_from_slice(&3u32.to_le_bytes());
        b[DIR_ID_AT..].fill(0);
        let crc = crc32fast::hash(&b[..BODY_BYTES_V3]);
        b[BODY_BYTES_V3..DIR_ID_AT].copy_from_slice(&crc.to_le_bytes());
        b
    }

    fn keyed() -> TableHasher {
        TableHasher::keyed(*b"0123456789abcdef")
    }

    #[test]
    fn round_trip() {
        for tier in [StorageTier::Memory, StorageTier::Hybrid] {
            for hasher in [TableHasher::LEGACY, keyed()] {
                let m = Manifest::current(7, tier, hasher).with_dir_id(0x1234_5678_9abc_def0);
                let buf = m.encode();
                let back = Manifest::decode(buf.as_slice(), Path::new("M")).expect("decode");
                assert_eq!(back, m);
                assert_eq!(back.table_hasher.key(), hasher.key());
                assert_eq!(back.version, 4);
                assert_eq!(back.dir_id, 0x1234_5678_9abc_def0);
                assert!(!back.is_outdated());
                // A version 3 manifest reads without an identity.
                let v3 = Manifest::decode(&encode_v3(7, tier, hasher), Path::new("M"))
                    .expect("v3 decodes");
                assert_eq!((v3.version, v3.dir_id), (3, 0));
                assert!(v3.is_outdated());
                assert_eq!(v3.table_hasher.key(), hasher.key());
            }
        }
        // The layout: code 1, then the key's bytes as given.
        let b = Manifest::current(1, StorageTier::Memory, keyed()).encode();
        assert_eq!(
            le_u32(b.as_slice(), TABLE_HASH_AT),
            TABLE_HASH_CODE_SIPHASH13
        );
        assert_eq!(
            &b.as_slice()[TABLE_KEY_AT..BODY_BYTES_V3],
            b"0123456789abcdef"
        );
        assert!(
            !format!("{:?}", Manifest::current(1, StorageTier::Memory, keyed())).contains("0123")
        );
    }

    #[test]
    fn version_2_reads_with_the_unkeyed_table_hash() {
        for tier in [StorageTier::Memory, StorageTier::Hybrid] {
            let m = Manifest::decode(&encode_v2(3, tier), Path::new("M")).expect("v2 decodes");
            assert_eq!((m.version, m.shard_count, m.tier), (2, 3, tier));
            assert_eq!(m.table_hasher, TableHasher::LEGACY);
            assert!(m.is_outdated());
        }
    }

    #[test]
    fn bad_table_hash_fields_are_refused() {
        let mut b = Manifest::current(2, StorageTier::Memory, keyed())
            .encode()
            .as_slice()
            .to_vec();
        patch_v3(&mut b, TABLE_HASH_AT, 7);
        let err = Manifest::decode(&b, Path::new("M")).expect_err("unknown code");
        assert!(
            err.to_string().contains("unknown table hash code 7"),
            "{err}"
        );
        // The unkeyed code with key bytes left is damage, not a hash to run.
        patch_v3(&mut b, TABLE_HASH_AT, TABLE_HASH_CODE_LEGACY);
        let err = Manifest::decode(&b, Path::new("M")).expect_err("legacy with a key");
        assert!(err.to_string().contains("key bytes"), "{err}");
    }

    #[test]
    fn table_hasher_rules() {
        let fresh = || Ok(*b"fresh-key-16-byt");
        let fresh_hasher = TableHasher::keyed(*b"fresh-key-16-byt");
        let never = || -> std::io::Result<[u8; 16]> { panic!("no key needed") };
        // A new directory: a fresh key, recorded.
        assert_eq!(
            settle_table_hasher(None, fresh).ok(),
            Some((fresh_hasher, true))
        );
        // A keyed directory keeps its key.
        for tier in [StorageTier::Memory, StorageTier::Hybrid] {
            let m = Manifest::current(1, tier, keyed());
            assert_eq!(
                settle_table_hasher(Some(&m), never).ok(),
                Some((keyed(), false))
            );
        }
        // An old memory directory is given a key; an old hybrid one is not
        // (its checkpoints hold tags of the unkeyed hash).
        let old_memory =
            Manifest::decode(&encode_v2(1, StorageTier::Memory), Path::new("M")).expect("v2");
        assert_eq!(
            settle_table_hasher(Some(&old_memory), fresh).ok(),
            Some((fresh_hasher, true))
        );
        let old_hybrid =
            Manifest::decode(&encode_v2(1, StorageTier::Hybrid), Path::new("M")).expect("v2");
        assert_eq!(
            settle_table_hasher(Some(&old_hybrid), never).ok(),
            Some((TableHasher::LEGACY, false))
        );
        // A failed draw is an error, not an unkeyed table.
        let failed = || Err(std::io::Error::other("no entropy"));
        assert!(settle_table_hasher(None, failed).is_err());
    }

    #[test]
    fn tier_codes_round_trip() {
        for tier in [StorageTier::Memory, StorageTier::Hybrid] {
            assert_eq!(tier_from_code(tier_code(tier)), Some(tier));
        }
        assert_eq!(tier_code(StorageTier::Memory), 0);
        assert_eq!(tier_code(StorageTier::Hybrid), 1);
        assert_eq!(tier_from_code(2), None);
    }

    #[test]
    fn version_1_reads_as_the_memory_tier() {
        let m = Manifest::decode(&encode_v1(5), Path::new("M")).expect("v1 decodes");
        assert_eq!(m.version, 1);
        assert_eq!(m.shard_count, 5);
        assert_eq!(m.tier, StorageTier::Memory);
        assert!(m.is_outdated());
        assert_eq!(m.table_hasher, TableHasher::LEGACY);
        // Re-encoding writes the current layout.
        let again = Manifest::decode(m.encode().as_slice(), Path::new("M")).expect("v3");
        assert_eq!(
            again,
            Manifest::current(5, StorageTier::Memory, TableHasher::LEGACY)
        );
    }

    #[test]
    fn unknown_tier_code_is_refused_by_name() {
        let mut b = Manifest::current(2, StorageTier::Memory, keyed())
            .encode()
            .as_slice()
            .to_vec();
        patch_v3(&mut b, HASH_END, 9);
        let err = Manifest::decode(&b, Path::new("/d/MANIFEST")).expect_err("unknown tier");
        assert!(
            matches!(err, ManifestError::UnknownTier { found: 9, .. }),
            "{err}"
        );
        let text = err.to_string();
        assert!(
            text.contains("/d/MANIFEST") && text.contains("tier code 9"),
            "{text}"
        );
    }

    #[test]
    fn newer_versions_are_refused_as_such() {
        let mut b = Manifest::current(2, StorageTier::Memory, keyed())
            .encode()
            .as_slice()
            .to_vec();
        patch_v3(&mut b, 8, 5);
        let err = Manifest::decode(&b, Path::new("M")).expect_err("v5");
        assert!(
            matches!(
                err,
                ManifestError::UnsupportedVersion {
                    found: 5,
                    oldest: 1,
                    newest: 4,
                    ..
                }
            ),
            "{err}"
        );
        // A build that knows only version 3 finds its checksum at 56 in a
        // version 4 manifest, so it reports a newer build, not damage.
        let v4 = Manifest::current(2, StorageTier::Memory, keyed())
            .with_dir_id(9)
            .encode();
        assert!(checksum_holds(v4.as_slice(), BODY_BYTES_V3).is_ok());
    }

    #[test]
    fn every_flipped_bit_is_refused() {
        let v4 = Manifest::current(3, StorageTier::Hybrid, keyed())
            .with_dir_id(5)
            .encode();
        let v3 = encode_v3(3, StorageTier::Hybrid, keyed());
        let v2 = encode_v2(3, StorageTier::Hybrid);
        let v1 = encode_v1(3);
        for (name, buf, len) in [
            ("v4", v4.as_slice(), MANIFEST_BYTES),
            ("v3", &v3[..], BODY_BYTES_V3 + 4),
            ("v2", &v2[..], BODY_BYTES_V2 + 4),
            ("v1", &v1[..], BODY_BYTES_V1 + 4),
        ] {
            for bit in 0..len * 8 {
                let mut b = buf.to_vec();
                b[bit / 8] ^= 1 << (bit % 8);
                assert!(
                    Manifest::decode(&b, Path::new("M")).is_err(),
                    "{name} bit {bit}"
                );
            }
        }
    }

    #[test]
    fn tier_rule() {
        let dir = Path::new("/d");
        let memory = Manifest::current(1, StorageTier::Memory, keyed());
        let hybrid = Manifest::current(1, StorageTier::Hybrid, keyed());
        assert!(check_tier(StorageTier::Hybrid, None, dir).is_ok());
        assert!(check_tier(StorageTier::Memory, Some(&memory), dir).is_ok());
        assert!(check_tier(StorageTier::Hybrid, Some(&hybrid), dir).is_ok());
        let text = check_tier(StorageTier::Hybrid, Some(&memory), dir)
            .expect_err("mismatch")
            .to_string();
        assert_eq!(
            text,
            "data directory /d holds a \"memory\" tier; storage.tier is \"hybrid\": set storage.tier = \"memory\", or point storage.data_dir at an empty directory (tiers cannot be converted in place)"
        );
        assert!(check_tier(StorageTier::Memory, Some(&hybrid), dir).is_err());
    }

    #[test]
    fn shard_count_rules() {
        let dir = Path::new("/d");
        let m = Manifest::current(4, StorageTier::Memory, keyed());
        assert_eq!(resolve_shard_count(0, None, 2, dir).ok(), Some(2));
        assert_eq!(resolve_shard_count(0, Some(&m), 2, dir).ok(), Some(4));
        assert_eq!(resolve_shard_count(4, Some(&m), 2, dir).ok(), Some(4));
        assert_eq!(resolve_shard_count(3, None, 2, dir).ok(), Some(3));
        let err = resolve_shard_count(2, Some(&m), 2, dir).expect_err("mismatch");
        let text = err.to_string();
        assert!(
            text.contains("4 shards") && text.contains("asks for 2"),
            "{text}"
        );
        assert!(text.contains("re-sharding is not supported"), "{text}");
    }
}
