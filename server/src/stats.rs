//! The STATS answer: (name, value) text pairs with exactly the names of
//! `/work/notes/stats-keys.md` (docs/protocol.md lists them), built from the
//! server's counters and an engine metrics snapshot.
//!
//! What must hold: every documented name is present in every answer (a
//! device or shard that exists always has all its keys), values are plain
//! decimal integers or the documented words, and nothing here blocks.

use engine::metrics::{EngineMetrics, Histogram};

use crate::counters::OpKind;
use crate::shard::Shared;

/// Merges histograms with identical bucket bounds (the engine's are).
pub fn merge_histograms<'a>(histograms: impl IntoIterator<Item = &'a Histogram>) -> Histogram {
    let mut total = Histogram::default();
    for h in histograms {
        if total.bounds.is_empty() {
            total.bounds = h.bounds.clone();
            total.counts = vec![0; h.counts.len()];
        }
        assert_eq!(
            total.bounds, h.bounds,
            "engine histograms with different buckets"
        );
        for (t, c) in total.counts.iter_mut().zip(&h.counts) {
            *t += c;
        }
        total.count += h.count;
        total.sum += h.sum;
    }
    total
}

/// The STATS pairs for this server and engine snapshot.
pub fn stats_pairs(shared: &Shared, engine: &EngineMetrics) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::with_capacity(64 + 16 * engine.devices.len());
    let mut put = |name: String, value: String| out.push((name, value));
    let facts = &shared.facts;
    let counters = shared.counters_total();

    put("server.version".into(), facts.version.to_string());
    put("server.backend".into(), facts.backend.clone());
    put("server.durability".into(), facts.durability.clone());
    put("server.shards".into(), facts.shard_count.to_string());
    put(
        "server.uptime_s".into(),
        shared.started.elapsed().as_secs().to_string(),
    );
    put(
        "server.connections".into(),
        shared.connections_open().to_string(),
    );
    put(
        "server.auth_failures".into(),
        shared.access.auth.failures().to_string(),
    );
    for kind in [OpKind::Put, OpKind::Get, OpKind::Delete] {
        put(
            format!("ops.{}", kind.name()),
            counters.ops_of_kind(kind).to_string(),
        );
    }

    let keys: u64 = engine.shards.iter().map(|s| s.keys).sum();
    let memory: u64 = engine.shards.iter().map(|s| s.memory_bytes).sum();
    put("engine.keys".into(), keys.to_string());
    put("engine.memory_bytes".into(), memory.to_string());

    let wal_bytes: u64 = engine.shards.iter().map(|s| s.wal_bytes_written).sum();
    let wal_flushes: u64 = engine.shards.iter().map(|s| s.wal_flushes).sum();
    let fsync = merge_histograms(engine.shards.iter().map(|s| &s.fdatasync_latency_us));
    put("wal.bytes_written".into(), wal_bytes.to_string());
    put("wal.flushes".into(), wal_flushes.to_string());
    put(
        "wal.fsync_p99_us".into(),
        fsync.quantile_bound(0.99).to_string(),
    );

    for device in &engine.devices {
        for (key, value) in crate::metrics::device_stats(shared, device) {
            put(format!("device.{}.{key}", device.name), value);
        }
    }

    for shard in &engine.shards {
        let n = shard.shard;
        put(format!("shard.{n}.keys"), shard.keys.to_string());
        put(
            format!("shard.{n}.wal_bytes"),
            shard.wal_bytes_written.to_string(),
        );
        put(
            format!("shard.{n}.durable_lsn"),
            shard.durable_lsn.to_string(),
        );
        put(
            format!("shard.{n}.poisoned"),
            u8::from(shard.poisoned).to_string(),
        );
    }
    out
}
