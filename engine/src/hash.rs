//! Key hashing: which shard owns a key, which partition of the shard's tier
//! holds it, and the hash its table uses. The routing hash is fixed forever
//! for a data directory (its name is recorded in the manifest): changing it
//! would silently misroute every stored key.
//!
//! Two hashes, for two jobs:
//! - the **routing hash** ([`fnv1a64`]) picks a key's shard. It is unkeyed
//!   and public: anyone can make keys that share it, which only moves load
//!   between shards (`docs/wal.md`, "Routing hash").
//! - the **table hash** ([`TableHasher::hash_key`], the one function every
//!   in-RAM table takes its hash from) places a key in its shard's tier:
//!   partition, bucket, tag, expiry index, WATCH slot. A data directory
//!   made by this build keys it with SipHash-1-3 under a random 128-bit key
//!   kept in its manifest, so colliding keys cannot be built offline and
//!   made to share one probe chain. Directories made before keep the
//!   unkeyed [`TableHasher::LEGACY`] hash (FNV-1a), whose tags their
//!   hybrid checkpoints hold.
//!
//! What must hold: a tier is given, for a key, exactly the hash its own
//! [`TableHasher`] makes of it, and one data directory is always opened
//! with the same table hasher (the hybrid tier's checkpoints store tags of
//! it; SCAN cursors name partitions of it).

/// Name of the routing hash, as written in the manifest.
pub const ROUTING_HASH_NAME: &str = "fnv1a64";

const FNV_OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// FNV-1a, 64-bit: for each byte, `h = (h ^ byte) * 0x100000001b3`, starting
/// from `0xcbf29ce484222325`. A key's shard is `fnv1a64(key) % shard_count`.
#[inline]
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut hash = FNV_OFFSET_BASIS;
    for &byte in bytes {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(FNV_PRIME);
    }
    hash
}

/// The shard owning a key whose routing hash is `hash`.
#[inline]
pub fn shard_of_hash(hash: u64, shard_count: usize) -> usize {
    assert!(shard_count > 0);
    (hash % shard_count as u64) as usize
}

/// A finaliser (murmur3 `fmix64`) spreading every bit of the routing hash
/// over the whole word, so partition and table bits are independent of the
/// `% shard_count` the router used. Not part of any on-disk format.
#[inline]
pub fn mix(hash: u64) -> u64 {
    let mut h = hash;
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^= h >> 33;
    h
}

/// How a shard's in-RAM tables hash keys: the one place a key becomes a
/// table hash. `Copy` and cheap; a tier keeps its own and the shard asks
/// the tier for it, so the two cannot disagree.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct TableHasher {
    kind: TableHashKind,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum TableHashKind {
    /// FNV-1a of the key, unkeyed (data directories made before the table
    /// hash was keyed).
    Legacy,
    /// SipHash-1-3 of the key under the 128-bit key `(k0, k1)`.
    SipHash13 { k0: u64, k1: u64 },
}

/// Name of the keyed table hash (docs, logs).
pub const TABLE_HASH_KEYED_NAME: &str = "siphash-1-3";
/// Name of the unkeyed table hash of older data directories.
pub const TABLE_HASH_LEGACY_NAME: &str = "fnv1a64 (unkeyed)";
/// Bytes of a table hash key.
pub const TABLE_HASH_KEY_BYTES: usize = 16;

impl TableHasher {
    /// The unkeyed table hash: FNV-1a, as every data directory made before
    /// the key existed was built with. Anyone can build keys that all
    /// share one table hash; use it only where the data was made with it
    /// (and in tests of the tiers alone).
    pub const LEGACY: TableHasher = TableHasher {
        kind: TableHashKind::Legacy,
    };

    /// SipHash-1-3 under `key` (16 bytes, read as two little-endian words).
    pub fn keyed(key: [u8; TABLE_HASH_KEY_BYTES]) -> TableHasher {
        let mut k0 = [0u8; 8];
        let mut k1 = [0u8; 8];
        k0.copy_from_slice(&key[..8]);
        k1.copy_from_slice(&key[8..]);
        TableHasher {
            kind: TableHashKind::SipHash13 {
                k0: u64::from_le_bytes(k0),
                k1: u64::from_le_bytes(k1),
            },
        }
    }

    /// A keyed hasher under a fresh key from the kernel's random source
    /// (for an engine that keeps nothing on disk).
    pub fn random() -> std::io::Result<TableHasher> {
        random_key().map(TableHasher::keyed)
    }

    /// The key, `None` for [`TableHasher::LEGACY`] (what the manifest keeps).
    pub fn key(&self) -> Option<[u8; TABLE_HASH_KEY_BYTES]> {
        match self.kind {
            TableHashKind::Legacy => None,
            TableHashKind::SipHash13 { k0, k1 } => {
                let mut key = [0u8; TABLE_HASH_KEY_BYTES];
                key[..8].copy_from_slice(&k0.to_le_bytes());
                key[8..].copy_from_slice(&k1.to_le_bytes());
                Some(key)
            }
        }
    }

    pub fn is_keyed(&self) -> bool {
        self.kind != TableHashKind::Legacy
    }

    /// The hash's name (never the key).
    pub fn name(&self) -> &'static str {
        match self.kind {
            TableHashKind::Legacy => TABLE_HASH_LEGACY_NAME,
            TableHashKind::SipHash13 { .. } => TABLE_HASH_KEYED_NAME,
        }
    }

    /// The table hash of `key`: what a tier is handed with the key, and
    /// the only function that computes it. Tiers finalise it with [`mix`]
    /// before taking partition, bucket and tag bits from it.
    #[inline]
    pub fn hash_key(&self, key: &[u8]) -> u64 {
        match self.kind {
            TableHashKind::Legacy => fnv1a64(key),
            TableHashKind::SipHash13 { k0, k1 } => {
                siphasher::sip::SipHasher13::new_with_keys(k0, k1).hash(key)
            }
        }
    }
}

impl std::fmt::Debug for TableHasher {
    /// Names the hash; never prints the key (it is a secret).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// 16 bytes from the kernel's random source (`getrandom(2)`), for a new
/// table hash key.
pub fn random_key() -> std::io::Result<[u8; TABLE_HASH_KEY_BYTES]> {
    let mut key = [0u8; TABLE_HASH_KEY_BYTES];
    let mut filled = 0;
    while filled < key.len() {
        let rest = &mut key[filled..];
        // SAFETY: `rest` is a valid, writable buffer of `rest.len()` bytes.
        let n = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        filled += n as usize;
    }
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference vectors of SipHash-1-3 (key 00..0f, message 00..len-1),
    /// as the Rust standard library and the siphasher crate test them.
    #[test]
    fn siphash13_reference_vectors() {
        let mut key = [0u8; 16];
        for (i, b) in key.iter_mut().enumerate() {
            *b = i as u8;
        }
        let h = TableHasher::keyed(key);
        let message: Vec<u8> = (0..16u8).collect();
        for (len, want) in [
            (0, 0xabac_0158_050f_c4dc_u64),
            (1, 0xc9f4_9bf3_7d57_ca93),
            (7, 0xd392_7d98_9bb1_1140),
            (8, 0x3690_9511_8d29_9a8e),
            (15, 0xd320_d86d_2a51_9956),
            (16, 0xcc4f_dd1a_7d90_8b66),
        ] {
            assert_eq!(h.hash_key(&message[..len]), want, "length {len}");
        }
        assert_eq!(h.key(), Some(key));
        assert!(h.is_keyed());
    }

    #[test]
    fn legacy_table_hash_is_fnv1a64() {
        for k in [&b""[..], b"a", b"foobar"] {
            assert_eq!(TableHasher::LEGACY.hash_key(k), fnv1a64(k));
        }
        assert_eq!(TableHasher::LEGACY.key(), None);
        assert!(!TableHasher::LEGACY.is_keyed());
    }

    #[test]
    fn keys_change_the_hash_and_stay_secret() {
        let a = TableHasher::random().expect("getrandom");
        let b = TableHasher::random().expect("getrandom");
        assert_ne!(a.key(), b.key());
        assert_ne!(a.hash_key(b"k"), b.hash_key(b"k"));
        assert_eq!(format!("{a:?}"), TABLE_HASH_KEYED_NAME);
    }

    #[test]
    fn fnv1a64_known_vectors() {
        // Reference values of the FNV-1a 64-bit specification.
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn shards_are_balanced_enough() {
        let shards = 4;
        let mut counts = [0u32; 4];
        for i in 0..40_000u32 {
            let key = format!("key-{i}");
            counts[shard_of_hash(fnv1a64(key.as_bytes()), shards)] += 1;
        }
        for c in counts {
            assert!((9_000..11_000).contains(&c), "unbalanced: {counts:?}");
        }
    }
}
