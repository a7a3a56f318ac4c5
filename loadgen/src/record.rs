//! Record values: YCSB's 10 fields x 100 bytes, stored as one value.
//!
//! What must hold: the value of record `n` is a pure function of (seed, n), so a
//! read can check that the server returned exactly the bytes that were written
//! for that key — a benchmark whose answers are wrong must not be quoted.
//! Values come from a pool of pre-generated records (shared `Bytes`, so a put
//! copies nothing on the client and the generator costs no CPU the server needs).

use crate::keys::Rng;
use bytes::Bytes;

/// Distinct record bodies in a pool.
const POOL_SIZE: usize = 1024;

/// The shape of one record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordShape {
    /// Fields per record (YCSB `fieldcount`). Default: 10.
    pub field_count: usize,
    /// Bytes per field (YCSB `fieldlength`). Default: 100.
    pub field_length: usize,
}

impl RecordShape {
    pub const YCSB: RecordShape = RecordShape {
        field_count: 10,
        field_length: 100,
    };

    pub fn value_bytes(&self) -> usize {
        self.field_count * self.field_length
    }
}

/// Pre-generated record bodies; record `n` uses body `n % POOL_SIZE`.
#[derive(Debug, Clone)]
pub struct ValuePool {
    shape: RecordShape,
    values: Vec<Bytes>,
}

impl ValuePool {
    /// Bodies are printable ASCII (like YCSB's random strings), field after field.
    pub fn new(seed: u64, shape: RecordShape) -> ValuePool {
        let mut rng = Rng::new(seed, 0x7661_6c75_6573); // "values"
        let len = shape.value_bytes();
        let values = (0..POOL_SIZE)
            .map(|_| {
                let body: Vec<u8> = (0..len).map(|_| b' ' + rng.below(95) as u8).collect();
                Bytes::from(body)
            })
            .collect();
        ValuePool { shape, values }
    }

    pub fn shape(&self) -> RecordShape {
        self.shape
    }

    /// The value stored for record number `keynum`.
    pub fn value_for(&self, keynum: u64) -> Bytes {
        self.values[(keynum % POOL_SIZE as u64) as usize].clone()
    }

    /// Whether `got` is exactly the value of record `keynum`.
    pub fn matches(&self, keynum: u64, got: &[u8]) -> bool {
        self.values[(keynum % POOL_SIZE as u64) as usize].as_ref() == got
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_have_the_record_shape_and_are_printable() {
        let pool = ValuePool::new(1, RecordShape::YCSB);
        let v = pool.value_for(12);
        assert_eq!(v.len(), 1000);
        assert!(v.iter().all(|b| (b' '..=b'~').contains(b)));
        let small = ValuePool::new(
            1,
            RecordShape {
                field_count: 2,
                field_length: 3,
            },
        );
        assert_eq!(small.value_for(0).len(), 6);
    }

    #[test]
    fn values_are_a_function_of_seed_and_record() {
        let a = ValuePool::new(7, RecordShape::YCSB);
        let b = ValuePool::new(7, RecordShape::YCSB);
        let c = ValuePool::new(8, RecordShape::YCSB);
        assert_eq!(a.value_for(5), b.value_for(5));
        assert_ne!(a.value_for(5), c.value_for(5));
        assert_ne!(a.value_for(5), a.value_for(6));
        assert!(a.matches(5, &b.value_for(5)));
        assert!(!a.matches(6, &b.value_for(5)));
        assert!(!a.matches(5, &a.value_for(5)[..999]));
    }
}
