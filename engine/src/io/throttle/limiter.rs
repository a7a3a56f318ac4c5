//! The token-bucket state machine of one device, over an injected clock
//! (nanoseconds since the device's epoch), so tests drive virtual time.
//!
//! Three buckets, each present only if the profile limits it:
//! - pacing: capacity [`PACING_WINDOW_NS`] worth of `burst_iops`, refilled at
//!   `burst_iops` — the fastest the device ever goes;
//! - credit: capacity `burst_credit`, refilled at `iops` — while it holds
//!   credit the pacing bucket sets the rate; once empty, the rate is `iops`;
//! - bandwidth: capacity [`PACING_WINDOW_NS`] worth of `bytes_per_sec`
//!   (at least one `io_unit`), refilled at `bytes_per_sec`.
//!
//! An I/O costing `ios` units and `bytes` bytes is admitted at the earliest
//! time every bucket holds its cost (or, for a cost above a bucket's
//! capacity, is full), and then takes the cost (a bucket may go negative).
//! Reservations are served strictly in call order: each one starts no earlier
//! than the previous admission, so nobody starves and the schedule is exactly
//! what the buckets allow. All arithmetic is integer: levels are kept in
//! nano-tokens (a rate in tokens/s times nanoseconds), so nothing drifts.
//!
//! What must hold: all buckets start full; admitted work up to time t never
//! exceeds `capacity + rate * t` of any bucket; a reservation never returns a
//! time before `now` or before the previous admission.

use tunables::ProfileConfig;

/// Window whose worth of `burst_iops` (and of `bytes_per_sec`) may go out
/// back to back: the fine-grained burstiness of an otherwise paced device.
pub const PACING_WINDOW_NS: u64 = 10_000_000;

const NANOS_PER_SEC: i128 = 1_000_000_000;

/// One token bucket, levels in nano-tokens.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Bucket {
    capacity: i128,
    level: i128,
    /// Tokens per second = nano-tokens per nanosecond.
    rate: i128,
}

impl Bucket {
    /// A full bucket of `capacity` nano-tokens refilled at `rate` tokens/s.
    fn full(capacity: i128, rate: u64) -> Bucket {
        assert!(rate > 0, "a bucket needs a positive refill rate");
        assert!(capacity >= 0);
        Bucket {
            capacity,
            level: capacity,
            rate: i128::from(rate),
        }
    }

    fn refill(&mut self, elapsed_ns: u64) {
        let added = self.rate * i128::from(elapsed_ns);
        self.level = (self.level + added).min(self.capacity);
    }

    /// Nanoseconds until this bucket can admit `cost` tokens.
    fn wait_ns(&self, cost: u64) -> u64 {
        if cost == 0 {
            return 0;
        }
        let need = (i128::from(cost) * NANOS_PER_SEC).min(self.capacity);
        if self.level >= need {
            return 0;
        }
        let deficit = need - self.level;
        let ns = (deficit + self.rate - 1) / self.rate;
        u64::try_from(ns).unwrap_or(u64::MAX)
    }

    fn take(&mut self, cost: u64) {
        self.level -= i128::from(cost) * NANOS_PER_SEC;
    }

    /// Whole tokens available after `elapsed_ns` more of refill (0 if in debt).
    fn tokens_after(&self, elapsed_ns: u64) -> u64 {
        let mut projected = self.clone();
        projected.refill(elapsed_ns);
        u64::try_from(projected.level.max(0) / NANOS_PER_SEC).unwrap_or(u64::MAX)
    }
}

/// The admission schedule of one device. Not thread-safe by itself: the
/// device keeps it behind a mutex.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limiter {
    /// Time the bucket levels are valid for: the latest admission (which
    /// may lie in the future while reservations wait).
    as_of_ns: u64,
    pacing: Option<Bucket>,
    credit: Option<Bucket>,
    bandwidth: Option<Bucket>,
}

impl Limiter {
    /// A limiter with full buckets at time 0. `profile` must be valid (see
    /// `ProfileConfig::validate`).
    pub fn new(profile: &ProfileConfig) -> Limiter {
        let window = i128::from(PACING_WINDOW_NS);
        let (pacing, credit) = if profile.iops > 0 {
            let burst_rate = profile.burst_iops.max(profile.iops);
            let pacing_capacity = (i128::from(burst_rate) * window).max(NANOS_PER_SEC);
            let credit_capacity = i128::from(profile.burst_credit) * NANOS_PER_SEC;
            (
                Some(Bucket::full(pacing_capacity, burst_rate)),
                Some(Bucket::full(credit_capacity, profile.iops)),
            )
        } else {
            (None, None)
        };
        let bandwidth = (profile.bytes_per_sec.0 > 0).then(|| {
            let rate = profile.bytes_per_sec.0;
            let floor = i128::from(profile.io_unit.0.max(1)) * NANOS_PER_SEC;
            Bucket::full((i128::from(rate) * window).max(floor), rate)
        });
        Limiter {
            as_of_ns: 0,
            pacing,
            credit,
            bandwidth,
        }
    }

    /// True when no bucket exists: every reservation is admitted at once.
    pub fn is_unlimited(&self) -> bool {
        self.pacing.is_none() && self.credit.is_none() && self.bandwidth.is_none()
    }

    fn buckets_mut(&mut self) -> impl Iterator<Item = &mut Bucket> {
        [&mut self.pacing, &mut self.credit, &mut self.bandwidth]
            .into_iter()
            .flatten()
    }

    fn advance_to(&mut self, t_ns: u64) {
        if t_ns > self.as_of_ns {
            let elapsed = t_ns - self.as_of_ns;
            for bucket in self.buckets_mut() {
                bucket.refill(elapsed);
            }
            self.as_of_ns = t_ns;
        }
    }

    /// Reserves an I/O of `ios` units and `bytes` bytes arriving at `now_ns`
    /// and returns the time (>= now_ns) at which it may start.
    pub fn reserve(&mut self, now_ns: u64, ios: u64, bytes: u64) -> u64 {
        let start = now_ns.max(self.as_of_ns);
        self.advance_to(start);
        let wait = [
            self.pacing.as_ref().map_or(0, |b| b.wait_ns(ios)),
            self.credit.as_ref().map_or(0, |b| b.wait_ns(ios)),
            self.bandwidth.as_ref().map_or(0, |b| b.wait_ns(bytes)),
        ]
        .into_iter()
        .max()
        .unwrap_or(0);
        let admit = start.saturating_add(wait);
        self.advance_to(admit);
        if let Some(b) = self.pacing.as_mut() {
            b.take(ios);
        }
        if let Some(b) = self.credit.as_mut() {
            b.take(ios);
        }
        if let Some(b) = self.bandwidth.as_mut() {
            b.take(bytes);
        }
        admit
    }

    /// How long after `now_ns` a reservation of `ios` units and `bytes`
    /// bytes would wait, without reserving it (0: it would go at once).
    pub fn wait_ns(&self, now_ns: u64, ios: u64, bytes: u64) -> u64 {
        let start = now_ns.max(self.as_of_ns);
        let elapsed = start - self.as_of_ns;
        let wait = |b: &Option<Bucket>, cost: u64| {
            b.as_ref().map_or(0, |b| {
                let mut b = b.clone();
                b.refill(elapsed);
                b.wait_ns(cost)
            })
        };
        let wait = wait(&self.pacing, ios)
            .max(wait(&self.credit, ios))
            .max(wait(&self.bandwidth, bytes));
        (start - now_ns).saturating_add(wait)
    }

    /// Burst credit (whole I/Os) the device would hold at `now_ns` if no
    /// more I/O arrived; `None` when the profile has no IOPS limit.
    pub fn credit_at(&self, now_ns: u64) -> Option<u64> {
        let credit = self.credit.as_ref()?;
        Some(credit.tokens_after(now_ns.saturating_sub(self.as_of_ns)))
    }

    /// Time of the latest admission handed out (0 before the first).
    pub fn last_admission_ns(&self) -> u64 {
        self.as_of_ns
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tunables::ByteSize;

    const SEC: u64 = 1_000_000_000;

    fn profile(iops: u64, burst_iops: u64, burst_credit: u64) -> ProfileConfig {
        ProfileConfig {
            iops,
            burst_iops,
            burst_credit,
            bytes_per_sec: ByteSize(0),
            io_unit: ByteSize::kib(256),
            count_fsync: true,
        }
    }

    /// Reserves `n` unit I/Os all arriving at `at_ns`; admission times.
    fn flood(limiter: &mut Limiter, at_ns: u64, n: usize, bytes: u64) -> Vec<u64> {
        (0..n).map(|_| limiter.reserve(at_ns, 1, bytes)).collect()
    }

    fn admitted_by(times: &[u64], t_ns: u64) -> usize {
        times.iter().filter(|&&a| a <= t_ns).count()
    }

    /// `wait_ns` tells what `reserve` would wait, and takes nothing.
    #[test]
    fn a_look_at_the_wait_reserves_nothing() {
        let mut limiter = Limiter::new(&profile(1_000, 1_000, 0));
        // The pacing bucket holds 10 I/Os; the credit bucket none: one
        // I/O goes at once, the next after 1 ms.
        assert_eq!(limiter.wait_ns(0, 1, 0), 0);
        assert_eq!(limiter.wait_ns(0, 1, 0), 0, "looking took tokens");
        let first = limiter.reserve(0, 1, 0);
        assert_eq!(first, 0);
        let wait = limiter.wait_ns(0, 1, 0);
        assert_eq!(wait, limiter.clone().reserve(0, 1, 0));
        assert_eq!(wait, 1_000_000);
        // Later, refilled: no wait.
        assert_eq!(limiter.wait_ns(2_000_000, 1, 0), 0);
        // After a reservation of 5 the look waits for its debt too.
        assert_eq!(limiter.reserve(2_000_000, 5, 0), 2_000_000);
        let wait = limiter.wait_ns(2_000_000, 1, 0);
        assert_eq!(wait, limiter.clone().reserve(2_000_000, 1, 0) - 2_000_000);
        assert!(wait >= 5_000_000, "{wait}");
    }

    #[test]
    fn sustained_demand_is_held_to_the_cap() {
        // No burst: 1,000 IOPS; pacing bucket holds 10 ms = 10 I/Os.
        let mut limiter = Limiter::new(&profile(1_000, 1_000, 0));
        let times = flood(&mut limiter, 0, 30_000, 4096);
        for secs in [1u64, 5, 10, 20] {
            let got = admitted_by(&times, secs * SEC) as i64;
            // Credit capacity 0: the credit bucket paces strictly at 1,000/s
            // from time 0 (1 admitted at t=0, then one per ms).
            let expected = (1_000 * secs + 1) as i64;
            assert!((got - expected).abs() <= 1, "{secs}s: {got} vs {expected}");
        }
        // Never earlier than asked, never out of order.
        assert!(times.windows(2).all(|w| w[0] <= w[1]));
    }

    #[test]
    fn burst_then_sustained_exact_counts() {
        // 100 IOPS sustained, 1,000 burst, 500 credit; pacing holds 10 I/Os.
        let mut limiter = Limiter::new(&profile(100, 1_000, 500));
        let times = flood(&mut limiter, 0, 5_000, 0);
        let expected = |t_ns: u64| -> i64 {
            let t = t_ns as f64 / SEC as f64;
            (10.0 + 1_000.0 * t).min(500.0 + 100.0 * t).floor() as i64
        };
        for t_ms in [
            0u64, 50, 100, 300, 500, 544, 545, 600, 1_000, 2_000, 10_000, 40_000,
        ] {
            let t = t_ms * 1_000_000;
            let got = admitted_by(&times, t) as i64;
            assert!(
                (got - expected(t)).abs() <= 1,
                "at {t_ms} ms: admitted {got}, expected {}",
                expected(t)
            );
        }
        // Phase rates: 1,000/s while credit lasts, then 100/s.
        let burst = admitted_by(&times, 400_000_000) - admitted_by(&times, 100_000_000);
        assert!((299..=301).contains(&burst), "burst phase {burst}");
        let sustained = admitted_by(&times, 5 * SEC) - admitted_by(&times, 2 * SEC);
        assert!(
            (299..=301).contains(&sustained),
            "sustained phase {sustained}"
        );
        assert_eq!(limiter.credit_at(limiter.last_admission_ns()), Some(0));
    }

    #[test]
    fn idle_time_refills_the_burst() {
        let mut limiter = Limiter::new(&profile(100, 1_000, 500));
        let first = flood(&mut limiter, 0, 2_000, 0);
        let end = *first.last().unwrap();
        assert_eq!(limiter.credit_at(end), Some(0));
        // 10 s idle refills 1,000 credits, capped at 500.
        let later = end + 10 * SEC;
        assert_eq!(limiter.credit_at(later), Some(500));
        let second = flood(&mut limiter, later, 2_000, 0);
        let got = |dt_ms: u64| admitted_by(&second, later + dt_ms * 1_000_000) as i64;
        // Same shape as from a fresh device: 10 + 1000 t until 500 + 100 t.
        assert!((got(100) - 110).abs() <= 1, "{}", got(100));
        assert!((got(500) - 510).abs() <= 1, "{}", got(500));
        assert!((got(3_000) - 800).abs() <= 1, "{}", got(3_000));
    }

    #[test]
    fn bandwidth_cap() {
        let p = ProfileConfig {
            bytes_per_sec: ByteSize::mib(1),
            io_unit: ByteSize::kib(64),
            ..profile(0, 0, 0)
        };
        let mut limiter = Limiter::new(&p);
        assert!(!limiter.is_unlimited());
        let times = flood(&mut limiter, 0, 2_000, 64 << 10);
        // Capacity: max(10 ms of 1 MiB/s, 64 KiB) = 64 KiB = 1 I/O at t=0,
        // then 16 I/Os of 64 KiB per second.
        for secs in [1u64, 10, 60] {
            let got = admitted_by(&times, secs * SEC) as i64;
            let expected = 1 + 16 * secs as i64;
            assert!((got - expected).abs() <= 1, "{secs}s: {got} vs {expected}");
        }
    }

    #[test]
    fn iops_and_bandwidth_together_take_the_tighter() {
        let p = ProfileConfig {
            bytes_per_sec: ByteSize::mib(4),
            io_unit: ByteSize::kib(4),
            ..profile(1_000, 1_000, 0)
        };
        // 64 KiB I/Os: 16 units each by io_unit, so 1,000 units/s allows
        // 62.5 I/Os/s while 4 MiB/s allows 64; units are tighter.
        let mut limiter = Limiter::new(&p);
        let times: Vec<u64> = (0..2_000)
            .map(|_| limiter.reserve(0, 16, 64 << 10))
            .collect();
        let got = admitted_by(&times, 16 * SEC) as i64;
        assert!((got - 1_000).abs() <= 2, "{got}");
    }

    #[test]
    fn a_cost_above_capacity_waits_for_a_full_bucket_then_goes_into_debt() {
        let mut limiter = Limiter::new(&profile(100, 100, 0));
        // Pacing capacity is 1 I/O (10 ms of 100/s); a 50-unit I/O goes at once
        // (bucket full), and the next one pays back the debt first.
        assert_eq!(limiter.reserve(0, 50, 0), 0);
        let next = limiter.reserve(0, 1, 0);
        assert_eq!(next, 500_000_000, "50 units at 100/s");
    }

    #[test]
    fn never_before_now_and_fifo() {
        let mut limiter = Limiter::new(&profile(1_000, 2_000, 100));
        let mut last = 0;
        for i in 0..5_000u64 {
            let now = i * 200_000; // arrivals at 5,000/s
            let admit = limiter.reserve(now, 1, 0);
            assert!(admit >= now && admit >= last);
            last = admit;
        }
    }

    #[test]
    fn unlimited_admits_immediately() {
        let mut limiter = Limiter::new(&ProfileConfig::unthrottled());
        assert!(limiter.is_unlimited());
        for i in 0..1_000u64 {
            assert_eq!(limiter.reserve(i, 100, 1 << 30), i);
        }
        assert_eq!(limiter.credit_at(5), None);
    }
}
