//! Key hashing: which shard owns a key, which partition of the shard's tier
//! holds it, and the hash its table uses. The routing hash is fixed forever
//! for a data directory (its name is recorded in the manifest): changing it
//! would silently misroute every stored key.

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

#[cfg(test)]
mod tests {
    use super::*;

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
