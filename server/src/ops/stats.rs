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

/// The `tier.*` group: the hybrid tier's counters summed over the shards.
pub fn tier_stats(engine: &EngineMetrics) -> TierStats {
    let mut t = TierStats::default();
    let mut latency = HistogramSnapshot::default();
    let mut keys = 0;
    let mut record_bytes = 0;
    for s in &engine.shards {
        latency.merge(&s.cold_read_latency_us);
        let Some(h) = &s.hybrid else { continue };
        keys += h.keys;
        t.index_bytes += h.index_bytes;
        t.cache_bytes += h.cache_bytes;
        t.segments += h.segments;
        t.segment_bytes += h.segment_bytes;
        t.live_bytes += h.live_bytes;
        record_bytes += h.record_bytes;
        t.gc_runs += h.gc_runs;
        t.gc_bytes_read += h.gc_bytes_read;
        t.gc_bytes_written += h.gc_bytes_written;
        t.cache_hits += h.cache_hits;
        t.cache_misses += h.cache_misses;
        t.cold_reads += h.device_reads;
        t.read_errors += h.read_errors;
        t.spilled_keys += h.spilled_keys;
        t.unresolved_entries += h.unresolved_entries;
        t.deleted_keys += h.deleted_keys;
        t.settles_done += h.settles_done;
        t.hot_segments += h.hot_segments;
        t.hot_segment_bytes += h.hot_segment_bytes;
        t.hot_live_bytes += h.hot_live_bytes;
        t.hot_reads += h.hot_reads;
        t.promotions += h.promotions;
        t.demotions += h.demotions;
        t.move_waits += h.move_waits;
    }
    t.index_millibytes_per_key = (t.index_bytes * 1000).checked_div(keys).unwrap_or(0);
    t.cache_millibytes_per_key = (t.cache_bytes * 1000).checked_div(keys).unwrap_or(0);
    t.live_percent = (t.live_bytes * 100)
        .checked_div(record_bytes)
        .map_or(0, |p| p.min(100));
    t.cache_hit_percent = (t.cache_hits * 100)
        .checked_div(t.cache_hits + t.cache_misses)
        .unwrap_or(0);
    if latency.count() > 0 {
        t.cold_read_p50_us = latency.quantile(0.5);
        t.cold_read_p99_us = latency.quantile(0.99);
    }
    t
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
