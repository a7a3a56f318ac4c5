//! The STATS answer, typed. A STATS reply carries `(name, value)` text pairs;
//! this module declares their names, meanings and units, except those of the
//! `tier.*` group, which the storage tier declares and which travel here as
//! plain names and values ([`TierStats`]). The server fills a [`Stats`] and
//! sends [`Stats::to_pairs`]; a client reads the pairs back with
//! [`Stats::from_pairs`]. `docs/protocol.md` lists every name (a test keeps
//! its main table equal to [`docs_table`], and the server's tests keep the
//! `tier.*` table equal to the tier's list).
//!
//! Names are `group.field` for server-wide values, `device.NAME.field` for
//! each storage device and `shard.N.field` for each shard. Values are decimal
//! unsigned integers, except the fields of kind `text`. A reader ignores names
//! it does not know, so fields can be added without breaking old clients.

use std::collections::BTreeMap;

/// Problems reading STATS pairs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StatsError {
    #[error("STATS value of {name} is {value:?}, expected an unsigned integer")]
    NotANumber { name: String, value: String },
}

/// One declared STATS field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatInfo {
    /// The name, with `NAME`/`N` standing for a device name or shard number.
    pub name: &'static str,
    /// `count` (only grows while the server runs), `gauge`, or `text`.
    pub kind: &'static str,
    /// Unit of the value.
    pub unit: &'static str,
    /// What it means.
    pub meaning: &'static str,
}

/// A STATS value type: unsigned integers and text.
trait StatValue: Sized {
    fn render(&self) -> String;
    fn parse(name: &str, value: &str) -> Result<Self, StatsError>;
}

impl StatValue for u64 {
    fn render(&self) -> String {
        self.to_string()
    }
    fn parse(name: &str, value: &str) -> Result<Self, StatsError> {
        value
            .trim()
            .parse::<u64>()
            .map_err(|_| StatsError::NotANumber {
                name: name.to_string(),
                value: value.to_string(),
            })
    }
}

impl StatValue for String {
    fn render(&self) -> String {
        self.clone()
    }
    fn parse(_: &str, value: &str) -> Result<Self, StatsError> {
        Ok(value.to_string())
    }
}

/// Declares a group of STATS fields: the struct, its [`StatInfo`] list, and
/// writing and reading its pairs under a name prefix.
macro_rules! stats_group {
    (
        $(#[$meta:meta])*
        pub struct $name:ident at $prefix:literal {
            $(
                #[doc = $doc:literal]
                $field:ident : $ty:ty, $kind:literal, $unit:literal;
            )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Default, PartialEq, Eq)]
        pub struct $name {
            $(#[doc = $doc] pub $field: $ty,)+
        }

        impl $name {
            /// Every field of the group, as `docs/protocol.md` lists it.
            pub const FIELDS: &'static [StatInfo] = &[$(
                StatInfo {
                    name: concat!($prefix, ".", stringify!($field)),
                    kind: $kind,
                    unit: $unit,
                    meaning: $doc.trim_ascii(),
                },
            )+];

            fn push_pairs(&self, prefix: &str, out: &mut Vec<(String, String)>) {
                $(out.push((format!("{prefix}.{}", stringify!($field)), self.$field.render()));)+
            }

            /// Sets `field` from its text; `Ok(false)` for a field this
            /// version does not know.
            fn set(&mut self, name: &str, field: &str, value: &str) -> Result<bool, StatsError> {
                match field {
                    $(stringify!($field) => self.$field = <$ty as StatValue>::parse(name, value)?,)+
                    _ => return Ok(false),
                }
                Ok(true)
            }
        }
    };
}

stats_group! {
    /// `server.*`: the server process.
    pub struct ServerStats at "server" {
        /// The server's version.
        version: String, "text", "";
        /// I/O backend in use: `uring` or `fallback`.
        backend: String, "text", "";
        /// Durability mode: `sync`, `async` or `none`.
        durability: String, "text", "";
        /// Storage tier: `memory` or `hybrid`.
        tier: String, "text", "";
        /// Number of shards.
        shards: u64, "gauge", "shards";
        /// Time since the server started.
        uptime_s: u64, "gauge", "seconds";
        /// Client connections open now.
        connections: u64, "gauge", "connections";
        /// Handshakes refused for a missing or wrong password since start.
        auth_failures: u64, "count", "handshakes";
    }
}

stats_group! {
    /// `ops.*`: operations answered, by kind, since start.
    pub struct OpsStats at "ops" {
        /// PUT operations answered (any status).
        put: u64, "count", "operations";
        /// GET operations answered (any status).
        get: u64, "count", "operations";
        /// DELETE operations answered (any status).
        delete: u64, "count", "operations";
        /// PUT_EXPIRING operations answered (any status).
        put_expiring: u64, "count", "operations";
        /// EXPIRE operations answered (any status).
        expire: u64, "count", "operations";
        /// TTL operations answered (any status).
        ttl: u64, "count", "operations";
        /// SCAN operations answered (any status).
        scan: u64, "count", "operations";
    }
}

stats_group! {
    /// `resp.*`: the Redis-protocol listener (all zero while it is off).
    pub struct RespStats at "resp" {
        /// RESP connections open now.
        connections: u64, "gauge", "connections";
        /// RESP connections accepted since start.
        connections_accepted: u64, "count", "connections";
        /// RESP commands received since start, known or not.
        commands: u64, "count", "commands";
        /// RESP commands whose name ringkv does not know.
        unknown_commands: u64, "count", "commands";
        /// Error replies sent on RESP connections (argument errors, failed runs, protocol errors).
        errors: u64, "count", "replies";
    }
}

stats_group! {
    /// `engine.*`: the data held.
    pub struct EngineStats at "engine" {
        /// Live keys, all shards.
        keys: u64, "gauge", "keys";
        /// Bytes of RAM the storage tier holds for keys and values, all shards.
        memory_bytes: u64, "gauge", "bytes";
        /// storage.max_memory: the most memory_bytes may reach, each shard held to its equal share (0 = no limit).
        memory_bytes_max: u64, "gauge", "bytes";
        /// Writes answered OUT_OF_MEMORY (plain writes and transaction commits) since start, all shards.
        oom_refusals: u64, "count", "writes";
        /// Keys that carry an expiry time (expired ones included until deleted), all shards.
        expiring_keys: u64, "gauge", "keys";
        /// Expired keys deleted since start (by active expiry, or by a write that found its key expired), all shards.
        expired_keys: u64, "count", "keys";
        /// 1 while an online backup or a BGSAVE runs, else 0.
        backup_in_progress: u64, "gauge", "backups";
        /// Files the running (or last) online backup has copied or linked so far.
        backup_files: u64, "gauge", "files";
        /// Files the running (or last) online backup will hold.
        backup_files_total: u64, "gauge", "files";
        /// Bytes the running (or last) online backup has copied or linked so far.
        backup_bytes: u64, "gauge", "bytes";
    }
}

/// `tier.*`: the storage tier's values, all shards. Unlike the groups
/// above they are not declared here: the tier names them itself (the
/// hybrid tier in `engine/src/tier/hybrid/stats.rs`), the server sends what
/// its tier lists, in that order, and `docs/protocol.md` has their table
/// apart from the one of [`docs_table`]. A reader keeps every `tier.*` name
/// whose value is a number, known to it or not.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TierStats {
    /// `(name after "tier.", value)`, in the order of the answer.
    pub values: Vec<(String, u64)>,
}

impl TierStats {
    /// The value named `tier.NAME`, if the answer has it.
    pub fn get(&self, name: &str) -> Option<u64> {
        self.values.iter().find(|(n, _)| n == name).map(|&(_, v)| v)
    }

    /// Sets `tier.NAME` (added at the end if new).
    pub fn set(&mut self, name: &str, value: u64) {
        match self.values.iter_mut().find(|(n, _)| n == name) {
            Some(slot) => slot.1 = value,
            None => self.values.push((name.to_string(), value)),
        }
    }

    fn push_pairs(&self, prefix: &str, out: &mut Vec<(String, String)>) {
        for (name, value) in &self.values {
            out.push((format!("{prefix}.{name}"), value.render()));
        }
    }
}

impl FromIterator<(String, u64)> for TierStats {
    fn from_iter<I: IntoIterator<Item = (String, u64)>>(iter: I) -> TierStats {
        TierStats {
            values: iter.into_iter().collect(),
        }
    }
}

stats_group! {
    /// `wal.*`: the write-ahead logs of all shards.
    pub struct WalStats at "wal" {
        /// Bytes written to WAL segments since start (payload, padding and seals).
        bytes_written: u64, "count", "bytes";
        /// Group-commit flushes (one durable write each) since start.
        flushes: u64, "count", "flushes";
        /// 99th percentile latency of the WAL's durable flush writes since start (the `O_DSYNC` write that replaces write + fdatasync; upper bucket bound).
        fsync_p99_us: u64, "gauge", "microseconds";
    }
}

stats_group! {
    /// `txn.*`: interactive transactions, all connections, since start.
    pub struct TxnStats at "txn" {
        /// Transactions open now (begun, not yet committed or rolled back).
        open: u64, "gauge", "transactions";
        /// Transactions committed.
        commits: u64, "count", "transactions";
        /// Transactions rolled back by their client.
        rollbacks: u64, "count", "transactions";
        /// Transactions aborted by wait-die (answered DIE).
        aborts_die: u64, "count", "transactions";
        /// Transactions aborted by the lock-wait timeout (answered LOCK_TIMEOUT).
        aborts_lock_timeout: u64, "count", "transactions";
        /// Transactions aborted by the idle timeout.
        aborts_idle: u64, "count", "transactions";
        /// Transactions rolled back because their connection closed.
        aborts_dropped: u64, "count", "transactions";
        /// COMMITs that failed (aborted earlier, too large, poisoned shard).
        commit_failures: u64, "count", "transactions";
        /// Lock requests that had to wait for another transaction.
        lock_waits: u64, "count", "waits";
        /// Time spent waiting for locks, summed.
        lock_wait_us: u64, "count", "microseconds";
    }
}

stats_group! {
    /// `device.NAME.*`: one storage device and its disk profile.
    pub struct DeviceStats at "device.NAME" {
        /// The device's disk profile.
        profile: String, "text", "";
        /// Sustained IOPS of the profile (0 = unlimited).
        iops_limit: u64, "gauge", "I/Os per second";
        /// Burst IOPS of the profile.
        burst_iops: u64, "gauge", "I/Os per second";
        /// I/O units admitted by the throttle (after the profile's `io_unit` rule).
        ios: u64, "count", "I/O units";
        /// Read operations.
        reads: u64, "count", "operations";
        /// Write operations.
        writes: u64, "count", "operations";
        /// fdatasync and directory fsync calls.
        syncs: u64, "count", "operations";
        /// Bytes read.
        bytes_read: u64, "count", "bytes";
        /// Bytes written, segment zero-fill included.
        bytes_written: u64, "count", "bytes";
        /// Time I/O waited for throttle tokens.
        token_wait_us: u64, "count", "microseconds";
        /// 99th percentile fdatasync latency on this device since start, token wait included.
        fsync_p99_us: u64, "gauge", "microseconds";
        /// Burst credit left, in I/Os (0 when the profile has no IOPS limit).
        credit: u64, "gauge", "I/Os";
    }
}

stats_group! {
    /// `shard.N.*`: one shard.
    pub struct ShardStats at "shard.N" {
        /// Live keys on this shard.
        keys: u64, "gauge", "keys";
        /// Bytes this shard wrote to its WAL since start.
        wal_bytes: u64, "count", "bytes";
        /// Highest log sequence number known durable.
        durable_lsn: u64, "gauge", "LSN";
        /// 1 when a failed write or fdatasync poisoned the shard (it refuses writes), else 0.
        poisoned: u64, "gauge", "0 or 1";
    }
}

/// One whole STATS answer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    pub server: ServerStats,
    pub ops: OpsStats,
    pub resp: RespStats,
    pub engine: EngineStats,
    pub tier: TierStats,
    pub wal: WalStats,
    pub txn: TxnStats,
    /// By device name.
    pub devices: BTreeMap<String, DeviceStats>,
    /// By shard number.
    pub shards: BTreeMap<u32, ShardStats>,
}

impl Stats {
    /// The pairs of a STATS answer, in a stable order.
    pub fn to_pairs(&self) -> Vec<(String, String)> {
        let mut out = Vec::with_capacity(
            64 + self.tier.values.len() + 12 * self.devices.len() + 4 * self.shards.len(),
        );
        self.server.push_pairs("server", &mut out);
        self.ops.push_pairs("ops", &mut out);
        self.resp.push_pairs("resp", &mut out);
        self.engine.push_pairs("engine", &mut out);
        self.tier.push_pairs("tier", &mut out);
        self.wal.push_pairs("wal", &mut out);
        self.txn.push_pairs("txn", &mut out);
        for (name, d) in &self.devices {
            d.push_pairs(&format!("device.{name}"), &mut out);
        }
        for (n, s) in &self.shards {
            s.push_pairs(&format!("shard.{n}"), &mut out);
        }
        out
    }

    /// Reads STATS pairs. Names this version does not know are ignored; a
    /// known numeric field that is not a number is an error.
    pub fn from_pairs(pairs: &[(String, String)]) -> Result<Stats, StatsError> {
        let mut stats = Stats::default();
        for (name, value) in pairs {
            let Some((group, rest)) = name.split_once('.') else {
                continue;
            };
            match group {
                "server" => {
                    stats.server.set(name, rest, value)?;
                }
                "ops" => {
                    stats.ops.set(name, rest, value)?;
                }
                "resp" => {
                    stats.resp.set(name, rest, value)?;
                }
                "engine" => {
                    stats.engine.set(name, rest, value)?;
                }
                "tier" => {
                    // Every tier value is a number; one that is not is left
                    // out, as a name this version does not know would be.
                    if let Ok(v) = <u64 as StatValue>::parse(name, value) {
                        stats.tier.set(rest, v);
                    }
                }
                "wal" => {
                    stats.wal.set(name, rest, value)?;
                }
                "txn" => {
                    stats.txn.set(name, rest, value)?;
                }
                "device" => {
                    // Device names may not contain '.', fields never do.
                    if let Some((device, field)) = rest.rsplit_once('.') {
                        stats
                            .devices
                            .entry(device.to_string())
                            .or_default()
                            .set(name, field, value)?;
                    }
                }
                "shard" => {
                    if let Some((n, field)) = rest.split_once('.') {
                        if let Ok(n) = n.parse::<u32>() {
                            stats.shards.entry(n).or_default().set(name, field, value)?;
                        }
                    }
                }
                _ => {}
            }
        }
        Ok(stats)
    }

    /// Every declared field, in the order of an answer (the `tier.*` ones,
    /// which the tier declares, between `engine.*` and `wal.*`, left out).
    pub fn fields() -> impl Iterator<Item = &'static StatInfo> {
        ServerStats::FIELDS
            .iter()
            .chain(OpsStats::FIELDS)
            .chain(RespStats::FIELDS)
            .chain(EngineStats::FIELDS)
            .chain(WalStats::FIELDS)
            .chain(TxnStats::FIELDS)
            .chain(DeviceStats::FIELDS)
            .chain(ShardStats::FIELDS)
    }
}

/// The Markdown table of every STATS field declared here, as
/// `docs/protocol.md` lists it (the `tier.*` names have a table of their
/// own there).
pub fn docs_table() -> String {
    let mut out = String::from("| name | kind | unit | meaning |\n| --- | --- | --- | --- |\n");
    for f in Stats::fields() {
        out.push_str(&format!(
            "| `{}` | {} | {} | {} |\n",
            f.name, f.kind, f.unit, f.meaning
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Stats {
        let mut s = Stats::default();
        s.server.version = "0.1.0".to_string();
        s.server.backend = "uring".to_string();
        s.server.durability = "sync".to_string();
        s.server.shards = 2;
        s.ops.put = 7;
        s.wal.fsync_p99_us = 512;
        s.devices.insert(
            "wal".to_string(),
            DeviceStats {
                profile: "nvme".to_string(),
                iops_limit: 6500,
                ios: 42,
                ..DeviceStats::default()
            },
        );
        s.shards.insert(
            1,
            ShardStats {
                keys: 3,
                poisoned: 1,
                ..ShardStats::default()
            },
        );
        s
    }

    #[test]
    fn pairs_round_trip() {
        let s = sample();
        let pairs = s.to_pairs();
        assert!(pairs.contains(&("device.wal.ios".to_string(), "42".to_string())));
        assert!(pairs.contains(&("shard.1.poisoned".to_string(), "1".to_string())));
        assert_eq!(Stats::from_pairs(&pairs), Ok(s));
    }

    #[test]
    fn unknown_names_are_ignored_and_bad_numbers_refused() {
        let pairs = vec![
            ("server.shards".to_string(), "4".to_string()),
            ("server.someday".to_string(), "x".to_string()),
            ("future".to_string(), "1".to_string()),
        ];
        assert_eq!(Stats::from_pairs(&pairs).map(|s| s.server.shards), Ok(4));
        let bad = vec![("ops.get".to_string(), "12x".to_string())];
        assert_eq!(
            Stats::from_pairs(&bad),
            Err(StatsError::NotANumber {
                name: "ops.get".to_string(),
                value: "12x".to_string()
            })
        );
    }

    #[test]
    fn every_field_is_written_once() {
        let pairs = sample().to_pairs();
        let mut names: Vec<&str> = pairs.iter().map(|(n, _)| n.as_str()).collect();
        let count = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), count);
        // One device and one shard: every declared field appears once.
        assert_eq!(count, Stats::fields().count());
    }

    #[test]
    fn protocol_md_lists_every_stats_name() {
        let doc = include_str!("../../docs/protocol.md");
        assert!(
            doc.contains(&docs_table()),
            "docs/protocol.md's STATS table differs from protocol/src/stats.rs; paste the output of `ringkv_protocol::stats::docs_table()`:\n{}",
            docs_table()
        );
    }
}
