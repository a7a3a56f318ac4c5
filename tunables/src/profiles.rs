//! Disk profiles: the built-in device classes and the rule for what counts as
//! one I/O.
//!
//! The burst model: a credit bucket holds up to `burst_credit` I/Os and fills
//! at `iops` per second (it starts full). While it holds credit the device may
//! run at up to `burst_iops`; every I/O takes one credit; when it is empty the
//! device runs at `iops`. A non-zero `bytes_per_sec` caps bandwidth on top.
//! One I/O is one submitted read or write of up to `io_unit` bytes (a larger
//! one counts `ceil(len / io_unit)`), plus one per fdatasync when
//! `count_fsync`. Must hold: every built-in passes [`ProfileConfig::validate`].
//!
//! Sources (see `docs/config.md`): the sustained and burst IOPS of `sas`,
//! `gpssd` and `nvme` are the three classes of the MapDB/ChronicleMap benchmark
//! document (High I/O "SAS", General Purpose SSD "GPSSD", Ultra-high I/O "SSD").
//! That document gives nothing else. The bandwidth caps are the published
//! per-disk throughput maxima of those cloud volume classes; the burst credit
//! (30 minutes at the burst rate) and the 256 KiB I/O unit follow the common
//! cloud block-volume convention (EBS gp2: 5.4 M credits = 30 min at 3,000 IOPS;
//! SSD I/Os up to 256 KiB count as one).

use crate::{ByteSize, ProfileConfig};

/// Seconds of full-rate burst a full bucket is sized for (before refill).
pub const BURST_WINDOW_SECS: u64 = 30 * 60;

/// Names of the built-in profiles, in order of increasing speed.
pub fn builtin_profile_names() -> &'static [&'static str] {
    &["sas", "gpssd", "nvme", "unthrottled"]
}

/// The built-in profile of this name, or `None`.
pub fn builtin_profile(name: &str) -> Option<ProfileConfig> {
    let throttled = |iops: u64, burst_iops: u64, mib_per_sec: u64| ProfileConfig {
        iops,
        burst_iops,
        burst_credit: burst_iops * BURST_WINDOW_SECS,
        bytes_per_sec: ByteSize::mib(mib_per_sec),
        io_unit: ByteSize::kib(256),
        count_fsync: true,
    };
    match name {
        // High I/O (SAS-backed) cloud volume.
        "sas" => Some(throttled(1_800, 5_000, 150)),
        // General purpose SSD cloud volume.
        "gpssd" => Some(throttled(2_300, 8_000, 250)),
        // Ultra-high I/O SSD cloud volume (the seed's "超高IO - SSD").
        "nvme" => Some(throttled(6_500, 16_000, 350)),
        // Real hardware, no emulation.
        "unthrottled" => Some(ProfileConfig::unthrottled()),
        _ => None,
    }
}

impl ProfileConfig {
    /// No limit of any kind: every I/O goes straight to the backend.
    pub fn unthrottled() -> Self {
        ProfileConfig::default()
    }

    /// True when the profile limits nothing: no IOPS limit (`iops == 0`) and
    /// no bandwidth cap (`bytes_per_sec == 0`).
    pub fn is_unlimited(&self) -> bool {
        self.iops == 0 && self.bytes_per_sec.0 == 0
    }

    /// True when the profile limits the I/O rate (`iops > 0`).
    pub fn limits_iops(&self) -> bool {
        self.iops > 0
    }

    /// How many I/Os a read or write of `len` bytes counts as:
    /// `max(1, ceil(len / io_unit))`. Panics if `io_unit` is 0 (a validated
    /// profile never has that).
    pub fn ios_for_len(&self, len: u64) -> u64 {
        let unit = self.io_unit.0;
        assert!(
            unit > 0,
            "ProfileConfig::io_unit must be > 0 (validate the profile)"
        );
        len.div_ceil(unit).max(1)
    }

    /// How many I/Os one fdatasync counts as: 1 when `count_fsync`, else 0.
    pub fn ios_for_fsync(&self) -> u64 {
        u64::from(self.count_fsync)
    }

    /// How long a full bucket sustains `burst_iops` while the bucket refills
    /// at `iops`: `burst_credit / (burst_iops - iops)`. `None` when the
    /// profile has no burst (no IOPS limit, or `burst_iops <= iops`).
    pub fn full_burst_duration(&self) -> Option<std::time::Duration> {
        if self.iops == 0 || self.burst_iops <= self.iops || self.burst_credit == 0 {
            return None;
        }
        let drain_per_sec = self.burst_iops - self.iops;
        Some(std::time::Duration::from_secs_f64(
            self.burst_credit as f64 / drain_per_sec as f64,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The seed document's IOPS and burst IOPS per class; the credit is 30
    /// minutes of burst; the bandwidth caps are the sources in docs/config.md.
    #[test]
    fn throttled_profiles_match_the_seed_document() {
        for (name, iops, burst_iops, bandwidth_mib) in [
            ("sas", 1_800, 5_000, 150),
            ("gpssd", 2_300, 8_000, 250),
            ("nvme", 6_500, 16_000, 350),
        ] {
            let p = builtin_profile(name).expect("built in");
            assert_eq!((p.iops, p.burst_iops), (iops, burst_iops), "{name}");
            assert_eq!(p.burst_credit, burst_iops * 1_800, "{name}");
            assert_eq!(p.bytes_per_sec, ByteSize::mib(bandwidth_mib), "{name}");
            assert_eq!(p.io_unit, ByteSize::kib(256), "{name}");
            assert!(p.count_fsync, "{name}");
            assert!(!p.is_unlimited(), "{name}");
            p.validate(name).expect("built-in profile validates");
        }
    }

    #[test]
    fn unthrottled_limits_nothing() {
        let p = builtin_profile("unthrottled").expect("unthrottled is built in");
        assert!(p.is_unlimited());
        assert!(!p.limits_iops());
        assert_eq!(p.full_burst_duration(), None);
        assert_eq!(p, ProfileConfig::default());
        p.validate("unthrottled")
            .expect("built-in unthrottled validates");
    }

    #[test]
    fn every_listed_name_is_built_in_and_nothing_else_is() {
        for name in builtin_profile_names() {
            assert!(builtin_profile(name).is_some(), "{name}");
        }
        assert_eq!(builtin_profile_names().len(), 4);
        assert!(builtin_profile("ssd").is_none());
        assert!(builtin_profile("SAS").is_none());
    }

    #[test]
    fn classes_get_faster_in_listed_order() {
        let limited: Vec<ProfileConfig> = ["sas", "gpssd", "nvme"]
            .iter()
            .filter_map(|n| builtin_profile(n))
            .collect();
        for pair in limited.windows(2) {
            assert!(pair[0].iops < pair[1].iops);
            assert!(pair[0].burst_iops < pair[1].burst_iops);
            assert!(pair[0].bytes_per_sec < pair[1].bytes_per_sec);
        }
    }

    #[test]
    fn io_counting_rule() {
        let p = builtin_profile("sas").expect("sas");
        assert_eq!(p.ios_for_len(0), 1);
        assert_eq!(p.ios_for_len(4096), 1);
        assert_eq!(p.ios_for_len(256 << 10), 1);
        assert_eq!(p.ios_for_len((256 << 10) + 1), 2);
        assert_eq!(p.ios_for_len(2 << 20), 8);
        assert_eq!(p.ios_for_fsync(), 1);
        let no_fsync = ProfileConfig {
            count_fsync: false,
            ..p
        };
        assert_eq!(no_fsync.ios_for_fsync(), 0);
    }

    #[test]
    fn burst_lasts_credit_over_net_drain() {
        let p = builtin_profile("sas").expect("sas");
        // 9,000,000 credits drained at 5,000 - 1,800 = 3,200 per second.
        let d = p.full_burst_duration().expect("sas bursts");
        assert_eq!(d.as_millis(), 2_812_500);
    }
}
