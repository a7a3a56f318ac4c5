//! The server's STATS, read before and after each measured phase, and the
//! per-device counters of a run (the deltas between the two reads).
//!
//! What must hold: counters in STATS are totals since server start, so a
//! phase's figures are `after - before`; a counter that goes backwards (the
//! server restarted) is reported, never turned into a huge unsigned delta.
//! Names and their types come from `ringkv_protocol::stats`, shared with the
//! server (docs/protocol.md lists them).

use ringkv_protocol::stats::{DeviceStats, Stats, StatsError as ProtocolStatsError, TierStats};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// What loadgen reads from one STATS answer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ServerSnapshot {
    pub version: String,
    pub backend: String,
    pub durability: String,
    pub tier: String,
    pub shards: u64,
    pub keys: u64,
    pub memory_bytes: u64,
    pub wal_bytes_written: u64,
    pub wal_flushes: u64,
    pub wal_fsync_p99_us: u64,
    pub devices: BTreeMap<String, DeviceSnapshot>,
    /// The `tier.*` values loadgen uses (all zero on the memory tier).
    pub hybrid: TierSnapshot,
}

/// The `tier.*` values the `tiered` workload reads (STATS carries more:
/// the tier names them, `docs/protocol.md` lists them); 0 when absent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TierSnapshot {
    pub segment_bytes: u64,
    pub hot_segment_bytes: u64,
    pub cold_reads: u64,
    pub hot_reads: u64,
    pub promotions: u64,
    pub demotions: u64,
    pub move_waits: u64,
}

impl TierSnapshot {
    fn of(tier: &TierStats) -> TierSnapshot {
        let get = |name: &str| tier.get(name).unwrap_or(0);
        TierSnapshot {
            segment_bytes: get("segment_bytes"),
            hot_segment_bytes: get("hot_segment_bytes"),
            cold_reads: get("cold_reads"),
            hot_reads: get("hot_reads"),
            promotions: get("promotions"),
            demotions: get("demotions"),
            move_waits: get("move_waits"),
        }
    }
}

/// One device's STATS counters, as the server sends them.
pub type DeviceSnapshot = DeviceStats;

/// Facts about the server that produced a result.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ServerInfo {
    /// `server.version`.
    pub version: String,
    /// `server.backend` (uring | fallback).
    pub backend: String,
    /// `server.durability` (sync | async | none).
    pub durability: String,
    /// `server.tier` (memory | hybrid); empty in reports of servers (and
    /// files) from before the tier was reported.
    #[serde(default)]
    pub tier: String,
    pub shards: u64,
    /// Profile of the WAL device (the device class of the run).
    pub profile: String,
    /// Sustained IOPS of that profile (0 = unlimited).
    pub iops_limit: u64,
    pub burst_iops: u64,
}

/// A device's activity during one measured phase.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceCounters {
    pub profile: String,
    /// I/O units admitted by the throttle (after the profile's io_unit rule).
    pub ios: u64,
    pub reads: u64,
    pub writes: u64,
    pub syncs: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    /// `ios` divided by the phase's measured seconds.
    pub iops: f64,
    /// Time spent waiting for throttle tokens during the phase (µs).
    pub token_wait_us: u64,
    /// The server's p99 fdatasync latency through this device, read after the
    /// phase (a since-start figure: STATS keeps no per-phase histogram).
    pub fsync_p99_us: u64,
}

/// Problems reading STATS.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum StatsError {
    #[error("STATS value of {name} is {value:?}, expected an unsigned integer")]
    NotANumber { name: String, value: String },
    #[error(
        "STATS counter {name} went backwards from {before} to {after} (did the server restart?)"
    )]
    Backwards {
        name: String,
        before: u64,
        after: u64,
    },
}

impl ServerSnapshot {
    /// Reads STATS pairs through the shared typed reader
    /// ([`ringkv_protocol::stats::Stats`]); unknown names are ignored.
    pub fn parse(pairs: &[(String, String)]) -> Result<ServerSnapshot, StatsError> {
        let stats = Stats::from_pairs(pairs).map_err(|e| match e {
            ProtocolStatsError::NotANumber { name, value } => {
                StatsError::NotANumber { name, value }
            }
            other => StatsError::NotANumber {
                name: String::new(),
                value: other.to_string(),
            },
        })?;
        Ok(ServerSnapshot {
            version: stats.server.version,
            backend: stats.server.backend,
            durability: stats.server.durability,
            tier: stats.server.tier,
            shards: stats.server.shards,
            keys: stats.engine.keys,
            memory_bytes: stats.engine.memory_bytes,
            wal_bytes_written: stats.wal.bytes_written,
            wal_flushes: stats.wal.flushes,
            wal_fsync_p99_us: stats.wal.fsync_p99_us,
            devices: stats.devices,
            hybrid: TierSnapshot::of(&stats.tier),
        })
    }

    /// The device the WAL lives on: `wal` when present, else the first device.
    pub fn wal_device(&self) -> Option<(&String, &DeviceSnapshot)> {
        self.devices
            .get_key_value("wal")
            .or_else(|| self.devices.iter().next())
    }

    pub fn info(&self) -> ServerInfo {
        let (profile, iops_limit, burst_iops) = match self.wal_device() {
            Some((_, d)) => (d.profile.clone(), d.iops_limit, d.burst_iops),
            None => (String::new(), 0, 0),
        };
        ServerInfo {
            version: self.version.clone(),
            backend: self.backend.clone(),
            durability: self.durability.clone(),
            tier: self.tier.clone(),
            shards: self.shards,
            profile,
            iops_limit,
            burst_iops,
        }
    }
}

/// A disk profile's limits, for the profile-accuracy report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProfileLimits {
    /// Sustained I/O units per second (0 = unlimited).
    pub iops: u64,
    pub burst_iops: u64,
    /// Bandwidth cap (0 = none).
    pub bytes_per_sec: u64,
}

/// The limits of a built-in profile by name (`None` for a custom profile,
/// whose limits STATS does not carry).
pub fn profile_limits(profile: &str) -> Option<ProfileLimits> {
    tunables::builtin_profile(profile).map(|p| ProfileLimits {
        iops: p.iops,
        burst_iops: p.burst_iops,
        bytes_per_sec: p.bytes_per_sec.0,
    })
}

fn delta(name: &str, before: u64, after: u64) -> Result<u64, StatsError> {
    after
        .checked_sub(before)
        .ok_or_else(|| StatsError::Backwards {
            name: name.to_string(),
            before,
            after,
        })
}

/// Per-device activity between `before` and `after` over `seconds`.
pub fn device_counters(
    before: &ServerSnapshot,
    after: &ServerSnapshot,
    seconds: f64,
) -> Result<BTreeMap<String, DeviceCounters>, StatsError> {
    let mut out = BTreeMap::new();
    for (name, a) in &after.devices {
        let zero = DeviceSnapshot::default();
        let b = before.devices.get(name).unwrap_or(&zero);
        let key = |f: &str| format!("device.{name}.{f}");
        let ios = delta(&key("ios"), b.ios, a.ios)?;
        out.insert(
            name.clone(),
            DeviceCounters {
                profile: a.profile.clone(),
                ios,
                reads: delta(&key("reads"), b.reads, a.reads)?,
                writes: delta(&key("writes"), b.writes, a.writes)?,
                syncs: delta(&key("syncs"), b.syncs, a.syncs)?,
                bytes_read: delta(&key("bytes_read"), b.bytes_read, a.bytes_read)?,
                bytes_written: delta(&key("bytes_written"), b.bytes_written, a.bytes_written)?,
                iops: if seconds > 0.0 {
                    ios as f64 / seconds
                } else {
                    0.0
                },
                token_wait_us: delta(&key("token_wait_us"), b.token_wait_us, a.token_wait_us)?,
                fsync_p99_us: a.fsync_p99_us,
            },
        );
    }
    Ok(out)
}

/// The counters of several server lives added up: each life is the STATS
/// read at its start and the last STATS read in it (a restarted server
/// counts from zero again, so the lives' deltas are summed, never one delta
/// across a restart). Gauges (profile, limits, fsync p99) come from the
/// last life, except fsync p99, the highest of the lives'. `before` of the
/// result is [`ServerSnapshot::default`] (all zero).
pub fn sum_of_lives(
    lives: &[(ServerSnapshot, ServerSnapshot)],
) -> Result<ServerSnapshot, StatsError> {
    let Some((_, last)) = lives.last() else {
        return Ok(ServerSnapshot::default());
    };
    let mut sum = ServerSnapshot {
        wal_bytes_written: 0,
        wal_flushes: 0,
        wal_fsync_p99_us: 0,
        devices: BTreeMap::new(),
        ..last.clone()
    };
    for (start, end) in lives {
        sum.wal_bytes_written += delta(
            "wal.bytes_written",
            start.wal_bytes_written,
            end.wal_bytes_written,
        )?;
        sum.wal_flushes += delta("wal.flushes", start.wal_flushes, end.wal_flushes)?;
        sum.wal_fsync_p99_us = sum.wal_fsync_p99_us.max(end.wal_fsync_p99_us);
        for (name, d) in device_counters(start, end, 0.0)? {
            let gauges = &end.devices[&name];
            let into = sum.devices.entry(name).or_default();
            into.profile = gauges.profile.clone();
            into.iops_limit = gauges.iops_limit;
            into.burst_iops = gauges.burst_iops;
            into.credit = gauges.credit;
            into.ios += d.ios;
            into.reads += d.reads;
            into.writes += d.writes;
            into.syncs += d.syncs;
            into.bytes_read += d.bytes_read;
            into.bytes_written += d.bytes_written;
            into.token_wait_us += d.token_wait_us;
            into.fsync_p99_us = into.fsync_p99_us.max(d.fsync_p99_us);
        }
    }
    Ok(sum)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn parses_server_and_device_fields() {
        let snap = ServerSnapshot::parse(&pairs(&[
            ("server.version", "0.1.0"),
            ("server.backend", "uring"),
            ("server.durability", "sync"),
            ("server.tier", "hybrid"),
            ("server.shards", "2"),
            ("wal.fsync_p99_us", "170"),
            ("device.wal.profile", "sas"),
            ("device.wal.iops_limit", "1800"),
            ("device.wal.burst_iops", "5000"),
            ("device.wal.ios", "42"),
            ("device.cold.data.profile", "nvme"),
            ("some.future.key", "whatever"),
        ]))
        .expect("parse");
        assert_eq!(snap.version, "0.1.0");
        assert_eq!(snap.shards, 2);
        assert_eq!(snap.wal_fsync_p99_us, 170);
        assert_eq!(snap.devices["wal"].ios, 42);
        assert_eq!(snap.devices["cold.data"].profile, "nvme");
        let info = snap.info();
        assert_eq!(
            (info.profile.as_str(), info.iops_limit, info.burst_iops),
            ("sas", 1800, 5000)
        );
        assert_eq!(info.tier, "hybrid");
    }

    #[test]
    fn parses_the_tier_group() {
        let snap = ServerSnapshot::parse(&pairs(&[
            ("tier.segment_bytes", "3000"),
            ("tier.hot_segment_bytes", "1000"),
            ("tier.cold_reads", "50"),
            ("tier.hot_reads", "45"),
        ]))
        .expect("parse");
        assert_eq!(snap.hybrid.segment_bytes, 3000);
        assert_eq!(snap.hybrid.hot_segment_bytes, 1000);
        assert_eq!((snap.hybrid.cold_reads, snap.hybrid.hot_reads), (50, 45));
    }

    #[test]
    fn rejects_non_numeric_counters() {
        let err = ServerSnapshot::parse(&pairs(&[("device.wal.ios", "many")])).unwrap_err();
        assert_eq!(
            err,
            StatsError::NotANumber {
                name: "device.wal.ios".into(),
                value: "many".into()
            }
        );
        // Values are decimal integers (docs/protocol.md): a fraction is refused too.
        assert!(ServerSnapshot::parse(&pairs(&[("device.wal.fsync_p99_us", "12.6")])).is_err());
    }

    #[test]
    fn counters_are_deltas_and_iops_is_per_second() {
        let before = ServerSnapshot::parse(&pairs(&[
            ("device.wal.ios", "100"),
            ("device.wal.bytes_written", "4096"),
            ("device.wal.token_wait_us", "5"),
        ]))
        .expect("parse");
        let after = ServerSnapshot::parse(&pairs(&[
            ("device.wal.profile", "nvme"),
            ("device.wal.ios", "1100"),
            ("device.wal.bytes_written", "8192"),
            ("device.wal.token_wait_us", "25"),
            ("device.wal.fsync_p99_us", "300"),
        ]))
        .expect("parse");
        let c = device_counters(&before, &after, 2.0).expect("delta");
        let wal = &c["wal"];
        assert_eq!(wal.ios, 1000);
        assert_eq!(wal.bytes_written, 4096);
        assert_eq!(wal.token_wait_us, 20);
        assert!((wal.iops - 500.0).abs() < 1e-9);
        assert_eq!(wal.fsync_p99_us, 300);
    }

    #[test]
    fn a_counter_going_backwards_is_an_error() {
        let before = ServerSnapshot::parse(&pairs(&[("device.wal.ios", "100")])).expect("parse");
        let after = ServerSnapshot::parse(&pairs(&[("device.wal.ios", "5")])).expect("parse");
        assert!(matches!(
            device_counters(&before, &after, 1.0),
            Err(StatsError::Backwards {
                before: 100,
                after: 5,
                ..
            })
        ));
    }

    #[test]
    fn lives_are_summed_life_by_life() {
        let snap = |list: &[(&str, &str)]| ServerSnapshot::parse(&pairs(list)).expect("parse");
        // Life 1 from 10 to 110 I/Os; the restarted server counts from 0:
        // life 2 from 5 to 55. One delta across the restart would go
        // backwards (110 -> 55).
        let lives = [
            (
                snap(&[("device.wal.ios", "10"), ("wal.bytes_written", "1000")]),
                snap(&[
                    ("device.wal.profile", "nvme"),
                    ("device.wal.ios", "110"),
                    ("device.wal.bytes_written", "8192"),
                    ("device.wal.fsync_p99_us", "900"),
                    ("wal.bytes_written", "5000"),
                    ("wal.flushes", "7"),
                ]),
            ),
            (
                snap(&[
                    ("device.wal.ios", "5"),
                    ("device.wal.bytes_written", "4096"),
                ]),
                snap(&[
                    ("device.wal.profile", "nvme"),
                    ("device.wal.ios", "55"),
                    ("device.wal.bytes_written", "12288"),
                    ("device.wal.fsync_p99_us", "300"),
                    ("wal.bytes_written", "2000"),
                    ("wal.flushes", "3"),
                ]),
            ),
        ];
        let sum = sum_of_lives(&lives).expect("sum");
        let wal = &sum.devices["wal"];
        assert_eq!(wal.ios, 150);
        assert_eq!(wal.bytes_written, 8192 + 8192);
        assert_eq!(wal.fsync_p99_us, 900);
        assert_eq!(wal.profile, "nvme");
        assert_eq!(sum.wal_bytes_written, 4000 + 2000);
        assert_eq!(sum.wal_flushes, 10);
        let c = device_counters(&ServerSnapshot::default(), &sum, 3.0).expect("delta");
        assert!((c["wal"].iops - 50.0).abs() < 1e-9);
        assert_eq!(sum_of_lives(&[]).expect("none"), ServerSnapshot::default());
    }
}
