//! The data directory's manifest, `DATA/MANIFEST`: format version, shard
//! count, routing-hash name and storage tier, so a reopen never misroutes
//! keys or reads one tier's files as another's. One checksummed 4 KiB block,
//! replaced atomically (write `MANIFEST.tmp`, fdatasync, rename over
//! `MANIFEST`, fsync the directory).
//!
//! Version 1 had no tier field; it is read as the memory tier (the only
//! tier that build had) and rewritten as version 2 by the engine on open.

use crate::error::ManifestError;
use crate::hash::ROUTING_HASH_NAME;
use crate::io::{AlignedBuf, Disk, DiskFile, ALIGN};
use std::path::{Path, PathBuf};
use tunables::Tier as StorageTier;

pub const MANIFEST_FILE: &str = "MANIFEST";
const MANIFEST_TMP_FILE: &str = "MANIFEST.tmp";
const MAGIC: [u8; 8] = *b"RINGKVMF";
/// Manifest layout version written by this build.
pub const MANIFEST_VERSION: u32 = 2;
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
const MANIFEST_BYTES: usize = BODY_BYTES_V2 + 4;
const _: () = assert!(MANIFEST_BYTES <= ALIGN);

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
    /// The manifest this build writes for `shard_count` shards of `tier`.
    pub fn current(shard_count: u32, tier: StorageTier) -> Manifest {
        Manifest {
            version: MANIFEST_VERSION,
            shard_count,
            hash: ROUTING_HASH_NAME.to_string(),
            tier,
        }
    }

    /// Whether this manifest was read in an older layout than this build
    /// writes (the engine then rewrites it).
    pub fn is_outdated(&self) -> bool {
        self.version < MANIFEST_VERSION
    }

    /// The manifest's bytes in the current layout (version 2): magic,
    /// version u32, shard count u32, hash name (16 bytes, zero padded), tier
    /// code u32, CRC32 of all of those; zero to 4 KiB. The `version` field
    /// is written as [`MANIFEST_VERSION`] whatever it holds.
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
        let crc = crc32fast::hash(&b[..BODY_BYTES_V2]);
        b[BODY_BYTES_V2..MANIFEST_BYTES].copy_from_slice(&crc.to_le_bytes());
        buf
    }

    /// Parses and checks a manifest block read from `file` (version 1 or 2).
    pub fn decode(bytes: &[u8], file: &Path) -> Result<Manifest, ManifestError> {
        let corrupt = |reason: &str| ManifestError::Corrupt {
            file: file.to_path_buf(),
            reason: reason.to_string(),
        };
        if bytes.len() < MANIFEST_BYTES {
            return Err(corrupt("shorter than a manifest"));
        }
        // The version says where the checksum is; a damaged version field
        // shows up as a checksum that holds in neither layout.
        let version = le_u32(bytes, 8);
        let body = match version {
            1 => BODY_BYTES_V1,
            2 => BODY_BYTES_V2,
            _ => {
                let v1 = checksum_holds(bytes, BODY_BYTES_V1);
                let v2 = checksum_holds(bytes, BODY_BYTES_V2);
                if bytes[0..8] == MAGIC && (v1.is_ok() || v2.is_ok()) {
                    return Err(ManifestError::UnsupportedVersion {
                        file: file.to_path_buf(),
                        found: version,
                        oldest: MANIFEST_VERSION_MIN,
                        newest: MANIFEST_VERSION,
                    });
                }
                BODY_BYTES_V2
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
        Ok(Manifest {
            version,
            shard_count,
            hash,
            tier,
        })
    }
}

fn io_err(op: &'static str, file: &Path) -> impl FnOnce(std::io::Error) -> ManifestError {
    let file = file.to_path_buf();
    move |source| ManifestError::Io { op, file, source }
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
        .map_err(io_err("open", &path))?;
    let (res, buf) = file.read_at(AlignedBuf::with_capacity(ALIGN), 0).await;
    res.map_err(io_err("read", &path))?;
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
        .map_err(io_err("create", &tmp))?;
    file.set_len(0).await.map_err(io_err("truncate", &tmp))?;
    let (res, _) = file.write_at(manifest.encode(), 0).await;
    res.map_err(io_err("write", &tmp))?;
    file.sync_data().await.map_err(io_err("fdatasync", &tmp))?;
    drop(file);
    disk.rename(&tmp, &path)
        .await
        .map_err(io_err("rename", &tmp))?;
    disk.sync_dir(data_dir)
        .await
        .map_err(io_err("fsync directory", data_dir))?;
    Ok(())
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

    /// Sets the u32 at `at` and recomputes the version 2 checksum.
    fn patch_v2(bytes: &mut [u8], at: usize, value: u32) {
        bytes[at..at + 4].copy_from_slice(&value.to_le_bytes());
        let crc = crc32fast::hash(&bytes[..BODY_BYTES_V2]);
        bytes[BODY_BYTES_V2..MANIFEST_BYTES].copy_from_slice(&crc.to_le_bytes());
    }

    #[test]
    fn round_trip() {
        for tier in [StorageTier::Memory, StorageTier::Hybrid] {
            let m = Manifest::current(7, tier);
            let buf = m.encode();
            let back = Manifest::decode(buf.as_slice(), Path::new("M")).expect("decode");
            assert_eq!(back, m);
            assert_eq!(back.version, 2);
            assert!(!back.is_outdated());
        }
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
        // Re-encoding writes the current layout.
        let again = Manifest::decode(m.encode().as_slice(), Path::new("M")).expect("v2");
        assert_eq!(again, Manifest::current(5, StorageTier::Memory));
    }

    #[test]
    fn unknown_tier_code_is_refused_by_name() {
        let mut b = Manifest::current(2, StorageTier::Memory)
            .encode()
            .as_slice()
            .to_vec();
        patch_v2(&mut b, HASH_END, 9);
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
        let mut b = Manifest::current(2, StorageTier::Memory)
            .encode()
            .as_slice()
            .to_vec();
        patch_v2(&mut b, 8, 3);
        let err = Manifest::decode(&b, Path::new("M")).expect_err("v3");
        assert!(
            matches!(
                err,
                ManifestError::UnsupportedVersion {
                    found: 3,
                    oldest: 1,
                    newest: 2,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn every_flipped_bit_is_refused() {
        let v2 = Manifest::current(3, StorageTier::Hybrid).encode();
        let v1 = encode_v1(3);
        for (name, buf, len) in [
            ("v2", v2.as_slice(), MANIFEST_BYTES),
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
        let memory = Manifest::current(1, StorageTier::Memory);
        let hybrid = Manifest::current(1, StorageTier::Hybrid);
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
        let m = Manifest::current(4, StorageTier::Memory);
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
