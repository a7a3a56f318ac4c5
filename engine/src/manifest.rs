//! The data directory's manifest, `DATA/MANIFEST`: format version, shard
//! count and routing-hash name, so a reopen never misroutes keys. One
//! checksummed 4 KiB block, replaced atomically (write `MANIFEST.tmp`,
//! fdatasync, rename over `MANIFEST`, fsync the directory).

use crate::error::ManifestError;
use crate::hash::ROUTING_HASH_NAME;
use crate::io::{AlignedBuf, Disk, DiskFile, ALIGN};
use std::path::{Path, PathBuf};

pub const MANIFEST_FILE: &str = "MANIFEST";
const MANIFEST_TMP_FILE: &str = "MANIFEST.tmp";
const MAGIC: [u8; 8] = *b"RINGKVMF";
/// Manifest layout version written by this build.
pub const MANIFEST_VERSION: u32 = 1;
const HASH_NAME_BYTES: usize = 16;
/// Bytes covered by the checksum; the checksum follows them.
const BODY_BYTES: usize = 8 + 4 + 4 + HASH_NAME_BYTES;
const MANIFEST_BYTES: usize = BODY_BYTES + 4;
const _: () = assert!(MANIFEST_BYTES <= ALIGN);

/// What the manifest records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    pub version: u32,
    pub shard_count: u32,
    pub hash: String,
}

impl Manifest {
    /// The manifest this build writes for `shard_count` shards.
    pub fn current(shard_count: u32) -> Manifest {
        Manifest {
            version: MANIFEST_VERSION,
            shard_count,
            hash: ROUTING_HASH_NAME.to_string(),
        }
    }

    /// The manifest's bytes: magic, version u32, shard count u32, hash name
    /// (16 bytes, zero padded), CRC32 of all of those; zero to 4 KiB.
    pub fn encode(&self) -> AlignedBuf {
        assert!(self.hash.len() <= HASH_NAME_BYTES);
        let mut buf = AlignedBuf::with_capacity(ALIGN);
        buf.set_len(ALIGN);
        let b = buf.as_mut_slice();
        b[0..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&self.version.to_le_bytes());
        b[12..16].copy_from_slice(&self.shard_count.to_le_bytes());
        b[16..16 + self.hash.len()].copy_from_slice(self.hash.as_bytes());
        let crc = crc32fast::hash(&b[..BODY_BYTES]);
        b[BODY_BYTES..MANIFEST_BYTES].copy_from_slice(&crc.to_le_bytes());
        buf
    }

    /// Parses and checks a manifest block read from `file`.
    pub fn decode(bytes: &[u8], file: &Path) -> Result<Manifest, ManifestError> {
        let corrupt = |reason: &str| ManifestError::Corrupt {
            file: file.to_path_buf(),
            reason: reason.to_string(),
        };
        if bytes.len() < MANIFEST_BYTES {
            return Err(corrupt("shorter than a manifest"));
        }
        let mut crc = [0u8; 4];
        crc.copy_from_slice(&bytes[BODY_BYTES..MANIFEST_BYTES]);
        let stored = u32::from_le_bytes(crc);
        let computed = crc32fast::hash(&bytes[..BODY_BYTES]);
        if stored != computed {
            return Err(corrupt(&format!(
                "checksum mismatch (stored {stored:#010x}, computed {computed:#010x})"
            )));
        }
        if bytes[0..8] != MAGIC {
            return Err(corrupt("bad magic"));
        }
        let mut w = [0u8; 4];
        w.copy_from_slice(&bytes[8..12]);
        let version = u32::from_le_bytes(w);
        if version != MANIFEST_VERSION {
            return Err(ManifestError::UnsupportedVersion {
                file: file.to_path_buf(),
                found: version,
                supported: MANIFEST_VERSION,
            });
        }
        w.copy_from_slice(&bytes[12..16]);
        let shard_count = u32::from_le_bytes(w);
        if shard_count == 0 {
            return Err(corrupt("shard count is zero"));
        }
        let name = &bytes[16..16 + HASH_NAME_BYTES];
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
        Ok(Manifest {
            version,
            shard_count,
            hash,
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

    #[test]
    fn round_trip() {
        let m = Manifest::current(7);
        let buf = m.encode();
        assert_eq!(
            Manifest::decode(buf.as_slice(), Path::new("M")).ok(),
            Some(m)
        );
    }

    #[test]
    fn every_flipped_bit_is_refused() {
        let buf = Manifest::current(3).encode();
        for bit in 0..MANIFEST_BYTES * 8 {
            let mut b = buf.as_slice().to_vec();
            b[bit / 8] ^= 1 << (bit % 8);
            assert!(Manifest::decode(&b, Path::new("M")).is_err(), "bit {bit}");
        }
    }

    #[test]
    fn shard_count_rules() {
        let dir = Path::new("/d");
        let m = Manifest::current(4);
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
