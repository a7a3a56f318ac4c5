//! The STATS answer, built from the server's counters and an engine metrics
//! snapshot into the typed [`Stats`] of `ringkv_protocol::stats`, where every
//! name is declared (and `docs/protocol.md` lists them).
//!
//! What must hold: every documented name is present in every answer (a
//! device or shard that exists always has all its keys), values are plain
//! decimal integers or the documented words, and nothing here blocks.

use engine::histogram::HistogramSnapshot;
use engine::metrics::EngineMetrics;
use ringkv_protocol::stats::{
    EngineStats, OpsStats, RespStats, ServerStats, ShardStats, Stats, TierStats, TxnStats, WalStats,
};
use std::sync::atomic::Ordering::Relaxed;

use crate::ops::counters::OpKind;
use crate::shard::Shared;

/// The STATS answer for this server and engine snapshot.
pub fn stats(shared: &Shared, engine: &EngineMetrics) -> Stats {
    let facts = &shared.facts;
    let counters = shared.counters_total();
    let resp = crate::resp::RespTotals::of(shared);
    let save = shared.handle.save_status();
    let mut fsync = HistogramSnapshot::default();
    for s in &engine.shards {
        fsync.merge(&s.fdatasync_latency_us);
    }
    Stats {
        server: ServerStats {
            version: facts.version.to_string(),
            backend: facts.backend.clone(),
            durability: facts.durability.clone(),
            tier: facts.tier.clone(),
            shards: facts.shard_count as u64,
            uptime_s: shared.started.elapsed().as_secs(),
            connections: shared.connections_open() as u64,
            auth_failures: shared.access.auth.failures(),
        },
        ops: OpsStats {
            put: counters.ops_of_kind(OpKind::Put),
            get: counters.ops_of_kind(OpKind::Get),
            delete: counters.ops_of_kind(OpKind::Delete),
            put_expiring: counters.ops_of_kind(OpKind::PutExpiring),
            expire: counters.ops_of_kind(OpKind::Expire),
            ttl: counters.ops_of_kind(OpKind::Ttl),
            scan: counters.ops_of_kind(OpKind::Scan),
        },
        resp: RespStats {
            connections: resp.connections_open(),
            connections_accepted: resp.connections_accepted,
            commands: resp.commands,
            unknown_commands: resp.unknown,
            errors: resp.errors,
        },
        engine: EngineStats {
            keys: engine.shards.iter().map(|s| s.keys).sum(),
            memory_bytes: engine.shards.iter().map(|s| s.memory_bytes).sum(),
            memory_bytes_max: engine.shards.iter().map(|s| s.memory_bytes_max).sum(),
            oom_refusals: engine.shards.iter().map(|s| s.oom_refusals).sum(),
            expiring_keys: engine.shards.iter().map(|s| s.expiring_keys).sum(),
            expired_keys: engine.shards.iter().map(|s| s.expired_keys).sum(),
            backup_in_progress: u64::from(save.in_progress),
            backup_files: save.backup_files,
            backup_files_total: save.backup_files_total,
            backup_bytes: save.backup_bytes,
        },
        tier: tier_stats(engine),
        wal: WalStats {
            bytes_written: engine.shards.iter().map(|s| s.wal_bytes_written).sum(),
            flushes: engine.shards.iter().map(|s| s.wal_flushes).sum(),
            fsync_p99_us: fsync.quantile(0.99),
        },
        txn: txn_stats(shared.handle.txn_stats()),
        devices: engine
            .devices
            .iter()
            .map(|d| (d.name.clone(), crate::ops::metrics::device_stats(shared, d)))
            .collect(),
        shards: engine
            .shards
            .iter()
            .map(|s| {
                let stats = ShardStats {
                    keys: s.keys,
                    wal_bytes: s.wal_bytes_written,
                    durable_lsn: s.durable_lsn,
                    poisoned: u64::from(s.poisoned),
                };
                (s.shard as u32, stats)
            })
            .collect(),
    }
}

/// The `tier.*` group: the tier's values summed over the shards, each
/// under the STATS name the tier gives it. The memory tier keeps no
/// values of its own; its answer carries the hybrid tier's names, all
/// zero (as `docs/protocol.md` says).
pub fn tier_stats(engine: &EngineMetrics) -> TierStats {
    let (total, latency) = engine.hybrid_total();
    total
        .unwrap_or_default()
        .counters(&latency)
        .into_iter()
        .filter_map(|c| c.stat.map(|s| (s.name.to_string(), c.value)))
        .collect()
}

/// The `txn.*` group from the engine's transaction counters.
pub fn txn_stats(t: &engine::TxnStats) -> TxnStats {
    TxnStats {
        open: t.open.load(Relaxed),
        commits: t.commits.load(Relaxed),
        rollbacks: t.rollbacks.load(Relaxed),
        aborts_die: t.aborts_die.load(Relaxed),
        aborts_lock_timeout: t.aborts_lock_timeout.load(Relaxed),
        aborts_idle: t.aborts_idle.load(Relaxed),
        aborts_dropped: t.aborts_dropped.load(Relaxed),
        commit_failures: t.commit_failures.load(Relaxed),
        lock_waits: t.lock_waits.load(Relaxed),
        lock_wait_us: t.lock_wait_us.load(Relaxed),
    }
}

/// The STATS pairs for this server and engine snapshot.
pub fn stats_pairs(shared: &Shared, engine: &EngineMetrics) -> Vec<(String, String)> {
    stats(shared, engine).to_pairs()
}

/// The Markdown table of the `tier.*` names, from the tier's own list, as
/// `docs/protocol.md` has it below the table of the other names.
pub fn tier_docs_table() -> String {
    let mut out = String::from("| name | kind | unit | meaning |\n| --- | --- | --- | --- |\n");
    let list = engine::HybridStats::default().counters(&HistogramSnapshot::default());
    for c in list {
        let Some(s) = c.stat else { continue };
        out.push_str(&format!(
            "| `tier.{}` | {} | {} | {} |\n",
            s.name,
            c.kind.stat_kind(),
            s.unit,
            s.meaning
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protocol_md_lists_every_tier_name() {
        let doc = include_str!("../../../docs/protocol.md");
        assert!(
            doc.contains(&tier_docs_table()),
            "docs/protocol.md's tier.* table differs from the hybrid tier's list (engine/src/tier/hybrid/stats.rs); paste the output of `tier_docs_table()`:\n{}",
            tier_docs_table()
        );
    }

    #[test]
    fn a_memory_tier_answer_has_every_tier_name_at_zero() {
        let engine = EngineMetrics {
            shards: Vec::new(),
            devices: Vec::new(),
        };
        let tier = tier_stats(&engine);
        let table = tier_docs_table();
        assert_eq!(tier.values.len(), table.lines().count() - 2);
        for (name, value) in &tier.values {
            assert!(table.contains(&format!("| `tier.{name}` |")), "{name}");
            assert_eq!(*value, 0, "{name}");
        }
    }
}
