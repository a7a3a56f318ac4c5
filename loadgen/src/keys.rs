//! Key numbers and key names, generated the way YCSB's CoreWorkload does.
//!
//! What must hold: the same `--seed` gives the same key sequence on every
//! machine and every build (the generator is a fixed algorithm written here,
//! not a library RNG whose stream may change between versions); every
//! generator returns key numbers inside the range it was built for.
//!
//! - [`Rng`]: xoshiro256++ seeded through splitmix64.
//! - [`fnv64`] / [`key_name`]: YCSB's "hashed" insert order: record `n` is
//!   stored under `"user" + fnv64(n)` in decimal.
//! - [`Zipfian`], [`ScrambledZipfian`], [`SkewedLatest`], [`Uniform`]: YCSB's
//!   request distributions (Gray et al., "Quickly generating billion-record
//!   synthetic databases", SIGMOD 1994, with theta = 0.99).
//! - [`InsertSequence`]: the acknowledged-insert counter that `latest` reads
//!   behind, shared by every client task.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// YCSB's zipfian constant (theta).
pub const ZIPFIAN_THETA: f64 = 0.99;

/// Item count of the hidden zipfian behind [`ScrambledZipfian`] (YCSB uses 10^10
/// so that the popular items do not depend on the record count).
pub const SCRAMBLED_ITEM_COUNT: u64 = 10_000_000_000;

/// Below this many items, zeta is summed term by term; above, the sum is
/// evaluated in closed form (Euler-Maclaurin), which is exact to ~1e-12.
const ZETA_EXACT_MAX: u64 = 1_000_000;

const FNV_OFFSET_BASIS_64: u64 = 0xCBF2_9CE4_8422_2325;
const FNV_PRIME_64: u64 = 0x0000_0100_0000_01B3;

/// FNV-1a over the 8 little-endian bytes of `value`, folded to a non-negative
/// 63-bit number as YCSB's `Utils.fnvhash64` (`Math.abs` of a Java long) does.
pub fn fnv64(value: u64) -> u64 {
    let mut hash = FNV_OFFSET_BASIS_64;
    for byte in value.to_le_bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(FNV_PRIME_64);
    }
    // Java's Math.abs on the signed value; i64::MIN stays as 2^63 here.
    (hash as i64).unsigned_abs()
}

/// The key of record number `keynum`: `"user"` followed by the decimal FNV hash.
pub fn key_name(keynum: u64) -> Vec<u8> {
    let mut key = Vec::with_capacity(4 + 20);
    key.extend_from_slice(b"user");
    key.extend_from_slice(fnv64(keynum).to_string().as_bytes());
    key
}

/// A small, fast, reproducible random generator (xoshiro256++).
#[derive(Debug, Clone)]
pub struct Rng {
    state: [u64; 4],
}

impl Rng {
    /// A generator for `stream` under `seed`: every (seed, stream) pair gives
    /// an independent, reproducible sequence.
    pub fn new(seed: u64, stream: u64) -> Rng {
        let mut sm = seed ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(17);
        let mut state = [0u64; 4];
        for word in &mut state {
            *word = splitmix64(&mut sm);
        }
        // An all-zero state would repeat zero forever; splitmix64 never yields
        // four zeros in a row, but the invariant is cheap to keep explicit.
        assert!(
            state.iter().any(|&w| w != 0),
            "xoshiro state must not be all zero"
        );
        Rng { state }
    }

    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.state;
        let result = s[0].wrapping_add(s[3]).rotate_left(23).wrapping_add(s[0]);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1) with 53 random bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in [0, bound) without modulo bias (Lemire's method). `bound > 0`.
    pub fn below(&mut self, bound: u64) -> u64 {
        assert!(bound > 0, "Rng::below needs a positive bound");
        let threshold = bound.wrapping_neg() % bound;
        loop {
            let wide = u128::from(self.next_u64()) * u128::from(bound);
            if (wide as u64) >= threshold {
                return (wide >> 64) as u64;
            }
        }
    }
}

fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `sum_{i=1..n} 1 / i^theta`.
pub fn zeta(n: u64, theta: f64) -> f64 {
    if n <= ZETA_EXACT_MAX {
        return zeta_partial(0, n, theta, 0.0);
    }
    // Exact head up to m, Euler-Maclaurin for the tail [m, n].
    let m: u64 = 1_000;
    let head = zeta_partial(0, m - 1, theta, 0.0);
    let f = |x: f64| x.powf(-theta);
    let f1 = |x: f64| -theta * x.powf(-theta - 1.0);
    let f3 = |x: f64| -theta * (theta + 1.0) * (theta + 2.0) * x.powf(-theta - 3.0);
    let (a, b) = (m as f64, n as f64);
    let integral = (b.powf(1.0 - theta) - a.powf(1.0 - theta)) / (1.0 - theta);
    head + integral + (f(a) + f(b)) / 2.0 + (f1(b) - f1(a)) / 12.0 - (f3(b) - f3(a)) / 720.0
}

/// `start_sum + sum_{i=from+1..=to} 1 / i^theta`.
fn zeta_partial(from: u64, to: u64, theta: f64, start_sum: f64) -> f64 {
    let mut sum = start_sum;
    for i in from + 1..=to {
        sum += 1.0 / (i as f64).powf(theta);
    }
    sum
}

/// Zipfian over `[0, items)`: item 0 is the most popular.
#[derive(Debug, Clone)]
pub struct Zipfian {
    items: u64,
    theta: f64,
    alpha: f64,
    zeta2theta: f64,
    zetan: f64,
    eta: f64,
}

impl Zipfian {
    pub fn new(items: u64) -> Zipfian {
        Zipfian::with_zetan(items, zeta(items, ZIPFIAN_THETA))
    }

    /// Like [`Zipfian::new`] with a precomputed `zeta(items, theta)`.
    pub fn with_zetan(items: u64, zetan: f64) -> Zipfian {
        assert!(items >= 1, "a zipfian needs at least one item");
        let theta = ZIPFIAN_THETA;
        let zeta2theta = zeta(2, theta);
        let mut z = Zipfian {
            items,
            theta,
            alpha: 1.0 / (1.0 - theta),
            zeta2theta,
            zetan,
            eta: 0.0,
        };
        z.eta = z.eta_for(items);
        z
    }

    fn eta_for(&self, items: u64) -> f64 {
        (1.0 - (2.0 / items as f64).powf(1.0 - self.theta)) / (1.0 - self.zeta2theta / self.zetan)
    }

    pub fn items(&self) -> u64 {
        self.items
    }

    /// Grows or shrinks the item count, updating zeta incrementally when it grows
    /// a little (the `latest` distribution grows by one item per insert).
    pub fn set_items(&mut self, items: u64) {
        assert!(items >= 1, "a zipfian needs at least one item");
        if items == self.items {
            return;
        }
        self.zetan = if items > self.items && items - self.items <= ZETA_EXACT_MAX {
            zeta_partial(self.items, items, self.theta, self.zetan)
        } else {
            zeta(items, self.theta)
        };
        self.items = items;
        self.eta = self.eta_for(items);
    }

    pub fn next(&mut self, rng: &mut Rng) -> u64 {
        let u = rng.next_f64();
        let uz = u * self.zetan;
        if uz < 1.0 {
            return 0;
        }
        if uz < 1.0 + 0.5f64.powf(self.theta) {
            return 1.min(self.items - 1);
        }
        let value = (self.items as f64 * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as u64;
        value.min(self.items - 1)
    }
}

/// Zipfian popularity spread over `[min, min + items)` by hashing, so the
/// popular keys are scattered over the keyspace (YCSB's default "zipfian").
#[derive(Debug, Clone)]
pub struct ScrambledZipfian {
    min: u64,
    items: u64,
    inner: Zipfian,
}

impl ScrambledZipfian {
    pub fn new(min: u64, items: u64) -> ScrambledZipfian {
        assert!(items >= 1, "a scrambled zipfian needs at least one item");
        let zetan = zeta(SCRAMBLED_ITEM_COUNT, ZIPFIAN_THETA);
        ScrambledZipfian {
            min,
            items,
            inner: Zipfian::with_zetan(SCRAMBLED_ITEM_COUNT, zetan),
        }
    }

    pub fn next(&mut self, rng: &mut Rng) -> u64 {
        self.min + fnv64(self.inner.next(rng)) % self.items
    }
}

/// Uniform over `[min, min + items)`.
#[derive(Debug, Clone)]
pub struct Uniform {
    min: u64,
    items: u64,
}

impl Uniform {
    pub fn new(min: u64, items: u64) -> Uniform {
        assert!(items >= 1, "a uniform distribution needs at least one item");
        Uniform { min, items }
    }

    pub fn next(&mut self, rng: &mut Rng) -> u64 {
        self.min + rng.below(self.items)
    }
}

/// YCSB's hotspot: the first `hot_set_percent` of the records of
/// `[min, min + items)` get `hot_ops_percent` of the draws, uniformly among
/// them; the other draws go uniformly to the other records.
#[derive(Debug, Clone)]
pub struct Hotspot {
    min: u64,
    items: u64,
    /// Records in the hot set (at least one, at most `items`).
    hot: u64,
    /// Chance that a draw goes to the hot set.
    hot_ops: f64,
}

impl Hotspot {
    pub fn new(min: u64, items: u64, hot_set_percent: u32, hot_ops_percent: u32) -> Hotspot {
        assert!(items >= 1, "a hotspot distribution needs at least one item");
        let hot = (u128::from(items) * u128::from(hot_set_percent.min(100)) / 100) as u64;
        Hotspot {
            min,
            items,
            hot: hot.clamp(1, items),
            hot_ops: f64::from(hot_ops_percent.min(100)) / 100.0,
        }
    }

    /// Records in the hot set (they are `[min, min + hot_records())`).
    pub fn hot_records(&self) -> u64 {
        self.hot
    }

    pub fn next(&mut self, rng: &mut Rng) -> u64 {
        if self.hot == self.items || rng.next_f64() < self.hot_ops {
            self.min + rng.below(self.hot)
        } else {
            self.min + self.hot + rng.below(self.items - self.hot)
        }
    }
}

/// The record numbers handed to inserts, and the highest number below which
/// every insert has been acknowledged (YCSB's AcknowledgedCounterGenerator).
/// Reads only target acknowledged records, so they never miss a key that a
/// slower task has not finished inserting.
#[derive(Debug)]
pub struct InsertSequence {
    next: AtomicU64,
    /// Every record number `<= last_acked` is acknowledged.
    last_acked: AtomicU64,
    pending: Mutex<BTreeSet<u64>>,
}

impl InsertSequence {
    /// Records `[0, preloaded)` already exist; inserts continue from `preloaded`.
    pub fn new(preloaded: u64) -> InsertSequence {
        assert!(
            preloaded >= 1,
            "the insert sequence starts after at least one loaded record"
        );
        InsertSequence {
            next: AtomicU64::new(preloaded),
            last_acked: AtomicU64::new(preloaded - 1),
            pending: Mutex::new(BTreeSet::new()),
        }
    }

    /// The next record number to insert.
    pub fn claim(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    /// Marks `keynum` (from [`InsertSequence::claim`]) as stored by the server.
    pub fn acknowledge(&self, keynum: u64) {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let mut last = self.last_acked.load(Ordering::Acquire);
        assert!(
            keynum > last,
            "record {keynum} acknowledged twice (last acknowledged {last})"
        );
        pending.insert(keynum);
        while pending.remove(&(last + 1)) {
            last += 1;
        }
        self.last_acked.store(last, Ordering::Release);
    }

    /// Highest record number such that it and every one below it is stored.
    pub fn last_acked(&self) -> u64 {
        self.last_acked.load(Ordering::Acquire)
    }

    /// Record numbers handed out so far (loaded + claimed).
    pub fn claimed(&self) -> u64 {
        self.next.load(Ordering::Relaxed)
    }
}

/// YCSB's "latest": recently inserted records are the most popular.
#[derive(Debug, Clone)]
pub struct SkewedLatest {
    zipf: Zipfian,
}

impl SkewedLatest {
    pub fn new(sequence: &InsertSequence) -> SkewedLatest {
        SkewedLatest {
            zipf: Zipfian::new(sequence.last_acked() + 1),
        }
    }

    /// A record number in `[0, last_acked]`, most likely `last_acked`.
    pub fn next(&mut self, sequence: &InsertSequence, rng: &mut Rng) -> u64 {
        let last = sequence.last_acked();
        self.zipf.set_items(last + 1);
        last - self.zipf.next(rng)
    }
}

/// How a workload picks the record an operation touches.
#[derive(Debug, Clone)]
pub enum KeyChooser {
    Uniform(Uniform),
    Zipfian(ScrambledZipfian),
    Latest(SkewedLatest),
    Hotspot(Hotspot),
}

impl KeyChooser {
    /// A record number that exists: at most `sequence.last_acked()`.
    ///
    /// Like YCSB, a zipfian draw beyond the acknowledged records is drawn
    /// again; after a bounded number of tries it folds into range instead, so
    /// the loop always ends.
    pub fn next(&mut self, sequence: &InsertSequence, rng: &mut Rng) -> u64 {
        let last = sequence.last_acked();
        match self {
            KeyChooser::Latest(latest) => latest.next(sequence, rng),
            KeyChooser::Uniform(u) => redraw_within(last, || u.next(rng)),
            KeyChooser::Zipfian(z) => redraw_within(last, || z.next(rng)),
            KeyChooser::Hotspot(h) => redraw_within(last, || h.next(rng)),
        }
    }
}

/// Draws until a value is at most `last` (64 tries), then folds one into range.
fn redraw_within(last: u64, mut draw: impl FnMut() -> u64) -> u64 {
    for _ in 0..64 {
        let k = draw();
        if k <= last {
            return k;
        }
    }
    draw() % (last + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hot set gets its share of the draws, spread over it, and the
    /// cold records the rest: 10% of 1,000 records with 90% of 1M draws.
    #[test]
    fn hotspot_sends_its_share_to_the_hot_set() {
        let mut h = Hotspot::new(5, 1_000, 10, 90);
        assert_eq!(h.hot_records(), 100);
        let mut rng = Rng::new(7, 1);
        let mut counts = vec![0u32; 1_000];
        let draws = 1_000_000;
        for _ in 0..draws {
            let k = h.next(&mut rng);
            assert!((5..1_005).contains(&k), "{k}");
            counts[(k - 5) as usize] += 1;
        }
        let hot: u32 = counts[..100].iter().sum();
        let share = f64::from(hot) / f64::from(draws);
        assert!((0.88..0.92).contains(&share), "hot share {share}");
        // Uniform within each part: no record far off its part's mean (a
        // cold record's is 111 draws: half of it is five deviations).
        let (hot_mean, cold_mean) = (0.9 * 1e6 / 100.0, 0.1 * 1e6 / 900.0);
        for (i, &c) in counts.iter().enumerate() {
            let mean = if i < 100 { hot_mean } else { cold_mean };
            assert!(
                f64::from(c) > mean * 0.5 && f64::from(c) < mean * 1.5,
                "record {i}: {c} draws, mean {mean}"
            );
        }
        // Edge cases: a hot set of every record, and one that rounds to none.
        let mut all = Hotspot::new(0, 10, 100, 0);
        assert_eq!(all.hot_records(), 10);
        assert!(all.next(&mut rng) < 10);
        assert_eq!(Hotspot::new(0, 10, 1, 50).hot_records(), 1);
    }

    #[test]
    fn fnv64_matches_reference_values() {
        // FNV-1a 64 of the eight bytes of 0 (all zero bytes), computed by hand
        // from the definition: each step xors 0 and multiplies by the prime.
        let mut h = FNV_OFFSET_BASIS_64;
        for _ in 0..8 {
            h = h.wrapping_mul(FNV_PRIME_64);
        }
        assert_eq!(fnv64(0), (h as i64).unsigned_abs());
        // The published FNV-1a test vector for the single byte "a" is
        // 0xaf63dc4c8601ec8c; check the byte loop against it.
        let mut single = FNV_OFFSET_BASIS_64;
        single ^= u64::from(b'a');
        single = single.wrapping_mul(FNV_PRIME_64);
        assert_eq!(single, 0xaf63_dc4c_8601_ec8c);
        assert_ne!(fnv64(1), fnv64(2));
        assert!(fnv64(12345) <= i64::MAX as u64 + 1);
    }

    #[test]
    fn key_names_are_user_plus_decimal_hash() {
        let k = key_name(7);
        assert!(k.starts_with(b"user"));
        let digits = std::str::from_utf8(&k[4..]).expect("ascii");
        assert_eq!(digits.parse::<u64>().expect("decimal"), fnv64(7));
        assert_ne!(key_name(7), key_name(8));
    }

    #[test]
    fn rng_is_reproducible_and_streams_differ() {
        let a: Vec<u64> = {
            let mut r = Rng::new(42, 0);
            (0..8).map(|_| r.next_u64()).collect()
        };
        let b: Vec<u64> = {
            let mut r = Rng::new(42, 0);
            (0..8).map(|_| r.next_u64()).collect()
        };
        let c: Vec<u64> = {
            let mut r = Rng::new(42, 1);
            (0..8).map(|_| r.next_u64()).collect()
        };
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn rng_below_and_f64_stay_in_range() {
        let mut r = Rng::new(1, 2);
        let mut seen = [0u32; 7];
        for _ in 0..70_000 {
            let v = r.below(7);
            seen[v as usize] += 1;
            let f = r.next_f64();
            assert!((0.0..1.0).contains(&f));
        }
        // Every bucket is hit roughly 10,000 times.
        for count in seen {
            assert!((9_000..11_000).contains(&count), "{seen:?}");
        }
    }

    #[test]
    fn closed_form_zeta_matches_the_sum() {
        let n = 2_500_000;
        let exact = zeta_partial(0, n, ZIPFIAN_THETA, 0.0);
        let closed = zeta(n, ZIPFIAN_THETA);
        assert!(
            (exact - closed).abs() < 1e-9,
            "exact {exact} closed {closed}"
        );
    }

    #[test]
    fn zeta_of_ten_billion_matches_ycsb_constant() {
        // YCSB hard-codes zeta(10^10, 0.99) = 26.46902820178302.
        let z = zeta(SCRAMBLED_ITEM_COUNT, ZIPFIAN_THETA);
        assert!((z - 26.469_028_201_783_02).abs() < 1e-6, "{z}");
    }

    #[test]
    fn zipfian_is_skewed_towards_small_items() {
        let mut rng = Rng::new(3, 0);
        let mut z = Zipfian::new(1000);
        let mut counts = vec![0u32; 1000];
        for _ in 0..100_000 {
            let v = z.next(&mut rng);
            assert!(v < 1000);
            counts[v as usize] += 1;
        }
        // With theta 0.99 over 1000 items, item 0 takes about 1/zeta(1000) ~ 13%.
        let p0 = f64::from(counts[0]) / 100_000.0;
        let expected = 1.0 / zeta(1000, ZIPFIAN_THETA);
        assert!((p0 - expected).abs() < 0.01, "p0 {p0} expected {expected}");
        assert!(counts[0] > counts[1] && counts[1] > counts[10] && counts[10] > counts[500]);
    }

    #[test]
    fn zipfian_set_items_matches_fresh_generator() {
        let mut grown = Zipfian::new(100);
        grown.set_items(5_000);
        let fresh = Zipfian::new(5_000);
        assert!((grown.zetan - fresh.zetan).abs() < 1e-9);
        assert!((grown.eta - fresh.eta).abs() < 1e-12);
        grown.set_items(10);
        assert!((grown.zetan - zeta(10, ZIPFIAN_THETA)).abs() < 1e-12);
    }

    #[test]
    fn scrambled_zipfian_spreads_hot_keys_but_stays_skewed() {
        let mut rng = Rng::new(5, 0);
        let mut z = ScrambledZipfian::new(100, 10_000);
        let mut counts = std::collections::HashMap::new();
        for _ in 0..200_000 {
            let v = z.next(&mut rng);
            assert!((100..10_100).contains(&v));
            *counts.entry(v).or_insert(0u32) += 1;
        }
        let mut by_count: Vec<u32> = counts.values().copied().collect();
        by_count.sort_unstable_by(|a, b| b.cmp(a));
        // The hottest key is far above the uniform share of 20 hits.
        assert!(by_count[0] > 2_000, "hottest {}", by_count[0]);
        // The hottest key is not simply the lowest key number.
        let hottest = counts.iter().max_by_key(|(_, c)| **c).map(|(k, _)| *k);
        assert_ne!(hottest, Some(100));
    }

    #[test]
    fn uniform_covers_its_range() {
        let mut rng = Rng::new(9, 0);
        let mut u = Uniform::new(10, 5);
        let mut seen = [false; 5];
        for _ in 0..1000 {
            let v = u.next(&mut rng);
            assert!((10..15).contains(&v));
            seen[(v - 10) as usize] = true;
        }
        assert!(seen.iter().all(|&s| s));
    }

    #[test]
    fn insert_sequence_acknowledges_contiguously() {
        let seq = InsertSequence::new(10);
        assert_eq!(seq.last_acked(), 9);
        let a = seq.claim();
        let b = seq.claim();
        let c = seq.claim();
        assert_eq!((a, b, c), (10, 11, 12));
        seq.acknowledge(c);
        assert_eq!(seq.last_acked(), 9, "a gap at 10 holds the limit back");
        seq.acknowledge(a);
        assert_eq!(seq.last_acked(), 10);
        seq.acknowledge(b);
        assert_eq!(seq.last_acked(), 12);
        assert_eq!(seq.claimed(), 13);
    }

    #[test]
    fn latest_prefers_recent_records_and_never_passes_the_limit() {
        let seq = InsertSequence::new(1000);
        let mut rng = Rng::new(11, 0);
        let mut latest = SkewedLatest::new(&seq);
        let mut recent = 0;
        for i in 0..10_000 {
            if i % 100 == 0 {
                let k = seq.claim();
                seq.acknowledge(k);
            }
            let v = latest.next(&seq, &mut rng);
            assert!(v <= seq.last_acked());
            if seq.last_acked() - v < 10 {
                recent += 1;
            }
        }
        assert!(recent > 3_000, "recent {recent}");
    }

    #[test]
    fn key_chooser_never_returns_unacknowledged_records() {
        let seq = InsertSequence::new(50);
        let mut rng = Rng::new(13, 0);
        let mut chooser = KeyChooser::Zipfian(ScrambledZipfian::new(0, 200));
        for _ in 0..10_000 {
            assert!(chooser.next(&seq, &mut rng) < 50);
        }
        let mut uniform = KeyChooser::Uniform(Uniform::new(0, 200));
        for _ in 0..1_000 {
            assert!(uniform.next(&seq, &mut rng) < 50);
        }
    }
}
