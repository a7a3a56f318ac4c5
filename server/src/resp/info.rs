//! The RESP commands answered from the server's own state or from the
//! whole keyspace: DBSIZE, INFO, CONFIG GET, FLUSHDB/FLUSHALL, KEYS, SCAN,
//! RANDOMKEY, RENAME/RENAMENX. Each runs after every command before it on
//! the connection has run (the executor runs its pending batch first).
//!
//! What must hold: INFO's field names are Redis's where a Redis field has
//! the same meaning (clients parse `redis_version`, `role`, `loading`...);
//! ringkv's own numbers are in a `# Ringkv` section with the STATS names;
//! CONFIG GET answers only parameters whose value says something true
//! about ringkv.

use std::fmt::Write as _;

use bytes::Bytes;
use engine::{Op, OpError, OpResult, TtlUpdate, Update, UpdateAnswer, PARTITIONS_PER_SHARD};
use ringkv_protocol::resp::ReplyWriter;

use super::command::{
    glob_match, glob_match_nocase, op_error_text, ServerCommand, COMMANDS, REDIS_VERSION,
};
use super::counters::RespTotals;
use super::update;
use crate::shard::ShardContext;

pub async fn answer_server_command(
    ctx: &ShardContext,
    command: &ServerCommand,
    w: &mut ReplyWriter<'_>,
) {
    match command {
        ServerCommand::Flush => match ctx.handle.clear().await {
            Ok(_) => w.ok(),
            Err(e) => w.error(&op_error_text(&e)),
        },
        ServerCommand::Keys(pattern) => match keys(ctx, pattern).await {
            Ok(keys) => {
                w.array(keys.len());
                for k in keys {
                    w.bulk(&k);
                }
            }
            Err(text) => w.error(&text),
        },
        ServerCommand::Scan {
            cursor,
            pattern,
            count,
            strings,
        } => match scan(ctx, *cursor, *count).await {
            Ok((next, keys)) => {
                let keys: Vec<Bytes> = keys
                    .into_iter()
                    .filter(|k| *strings && pattern.as_ref().is_none_or(|p| glob_match(p, k)))
                    .collect();
                w.array(2);
                w.bulk(next.to_string().as_bytes());
                w.array(keys.len());
                for k in keys {
                    w.bulk(&k);
                }
            }
            Err(e) => w.error(&op_error_text(&e)),
        },
        ServerCommand::RandomKey => match random_key(ctx).await {
            Ok(Some(k)) => w.bulk(&k),
            Ok(None) => w.null(),
            Err(e) => w.error(&op_error_text(&e)),
        },
        ServerCommand::Rename { from, to, nx } => rename(ctx, from, to, *nx, w).await,
        ServerCommand::Copy { from, to, replace } => copy(ctx, from, to, *replace, w).await,
        ServerCommand::DbSize => {
            let keys: u64 = ctx.handle.metrics().shards.iter().map(|s| s.keys).sum();
            w.int(keys as i64);
        }
        ServerCommand::BgSave => match crate::ops::backup::start_bgsave(&ctx.handle) {
            Ok(()) => w.simple("Background saving started"),
            Err(e) => w.error(&format!("ERR {e}")),
        },
        ServerCommand::LastSave => w.int(ctx.handle.save_status().last_save_unix as i64),
        ServerCommand::Info(sections) => w.verbatim(&info_text(ctx, sections)),
        ServerCommand::ConfigGet(patterns) => {
            let params = config_params(ctx);
            let chosen: Vec<&(&str, String)> = params
                .iter()
                .filter(|(name, _)| {
                    patterns
                        .iter()
                        .any(|p| glob_match_nocase(p, name.as_bytes()))
                })
                .collect();
            w.map(chosen.len());
            for (name, value) in chosen {
                w.bulk(name.as_bytes());
                w.bulk(value.as_bytes());
            }
        }
    }
}

/// (user, system) CPU seconds of `who` (RUSAGE_SELF / RUSAGE_CHILDREN).
fn cpu_seconds(who: libc::c_int) -> (f64, f64) {
    // SAFETY: an all-zero rusage is a valid value, and getrusage only
    // writes into the struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a valid, writable rusage.
    if unsafe { libc::getrusage(who, &mut usage) } != 0 {
        return (0.0, 0.0);
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    (secs(usage.ru_utime), secs(usage.ru_stime))
}

/// One SCAN step from `cursor` (`shard * partitions + partition`): whole
/// partitions, shard after shard, until at least `count` keys were found
/// or every shard is done (then the next cursor is 0).
async fn scan(ctx: &ShardContext, cursor: u64, count: usize) -> Result<(u64, Vec<Bytes>), OpError> {
    let per_shard = PARTITIONS_PER_SHARD as u64;
    let shards = ctx.handle.shard_count() as u64;
    let (mut shard, mut partition) = (cursor / per_shard, cursor % per_shard);
    let mut keys = Vec::new();
    while shard < shards && keys.len() < count {
        let step = ctx
            .handle
            .partition_keys(shard as usize, partition as usize, count - keys.len())
            .await?;
        keys.extend(step.keys);
        match step.next {
            Some(p) => partition = p as u64,
            None => {
                shard += 1;
                partition = 0;
            }
        }
    }
    let next = if shard >= shards {
        0
    } else {
        shard * per_shard + partition
    };
    Ok((next, keys))
}

/// Every key matching `pattern`, refused when the answer would pass the
/// frame limit (SCAN walks a large keyspace in steps instead).
async fn keys(ctx: &ShardContext, pattern: &[u8]) -> Result<Vec<Bytes>, String> {
    let max = ctx.shared.limits.frame_bytes_max as usize;
    let mut out = Vec::new();
    let mut bytes = 0usize;
    let mut cursor = 0;
    loop {
        let (next, keys) = scan(ctx, cursor, 4096)
            .await
            .map_err(|e| op_error_text(&e))?;
        for k in keys {
            if glob_match(pattern, &k) {
                bytes += k.len() + 16;
                if bytes > max {
                    return Err(format!(
                        "ERR the KEYS answer is over ringkv's limit of {max} bytes (limits.frame_bytes_max); use SCAN"
                    ));
                }
                out.push(k);
            }
        }
        if next == 0 {
            return Ok(out);
        }
        cursor = next;
    }
}

/// A key from a random shard and partition (walking on from there), or
/// `None` when there are no keys.
async fn random_key(ctx: &ShardContext) -> Result<Option<Bytes>, OpError> {
    use std::hash::{BuildHasher, Hasher};
    let seed = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    let shards = ctx.handle.shard_count();
    let total = (shards * PARTITIONS_PER_SHARD) as u64;
    let start = seed % total;
    for step in 0..total {
        let at = (start + step) % total;
        let shard = (at / PARTITIONS_PER_SHARD as u64) as usize;
        let partition = (at % PARTITIONS_PER_SHARD as u64) as usize;
        // One partition at a time.
        let found = ctx.handle.partition_keys(shard, partition, 1).await?;
        if !found.keys.is_empty() {
            let pick = (seed >> 32) as usize % found.keys.len();
            return Ok(found.keys.into_iter().nth(pick));
        }
    }
    Ok(None)
}

fn first(r: Result<Vec<OpResult>, OpError>) -> Result<OpResult, OpError> {
    match r?.into_iter().next() {
        Some(OpResult::Err(e)) => Err(e),
        Some(other) => Ok(other),
        None => Err(OpError::ShuttingDown),
    }
}

/// `key`'s value and expiry time (Unix ms), read in one step on its shard;
/// `Ok(None)` if it is missing, `Err` with the error reply's text.
async fn read_with_expiry(
    ctx: &ShardContext,
    key: &Bytes,
) -> Result<Option<(Bytes, Option<i64>)>, String> {
    let read = vec![
        Op::Get { key: key.clone() },
        Op::UpdateTtl {
            key: key.clone(),
            update: TtlUpdate {
                apply: update::ttl,
                arg: Bytes::new(),
                number: update::EXPIRETIME_MILLIS,
            },
        },
    ];
    match ctx.handle.batch(read).await {
        Ok(r) => match (r.first(), r.get(1)) {
            (Some(OpResult::Value(v)), Some(OpResult::Updated(UpdateAnswer::Int(at)))) => {
                Ok(Some((v.clone(), (*at > 0).then_some(*at))))
            }
            (Some(OpResult::Err(e)), _) | (_, Some(OpResult::Err(e))) => Err(op_error_text(e)),
            _ => Ok(None),
        },
        Err(e) => Err(op_error_text(&e)),
    }
}

/// COPY: reads the source (value and expiry time) in one step, then
/// writes the destination with that expiry time, only if it is absent
/// unless `replace`. Not atomic across shards, as RENAME: a write to the
/// source in between is not copied.
async fn copy(
    ctx: &ShardContext,
    from: &Bytes,
    to: &Bytes,
    replace: bool,
    w: &mut ReplyWriter<'_>,
) {
    let (value, expiry) = match read_with_expiry(ctx, from).await {
        Ok(Some(found)) => found,
        Ok(None) => return w.int(0),
        Err(text) => return w.error(&text),
    };
    let flags = if replace { 0 } else { update::SET_NX as u8 };
    let mut arg = bytes::BytesMut::with_capacity(1 + value.len());
    arg.extend_from_slice(&[flags]);
    arg.extend_from_slice(&value);
    let write = Op::UpdateTtl {
        key: to.clone(),
        update: TtlUpdate {
            apply: update::set_expiring,
            arg: arg.freeze(),
            number: expiry.unwrap_or(0),
        },
    };
    match first(ctx.handle.batch(vec![write]).await) {
        Ok(OpResult::Updated(UpdateAnswer::Nil)) => w.int(0),
        Ok(_) => w.int(1),
        Err(e) => w.error(&op_error_text(&e)),
    }
}

/// RENAME / RENAMENX across shards without losing the value on a crash:
/// read the source, write the destination (NX: only if absent), then delete
/// the source only if it still holds what was copied. A crash in between
/// leaves both keys, never neither.
async fn rename(ctx: &ShardContext, from: &Bytes, to: &Bytes, nx: bool, w: &mut ReplyWriter<'_>) {
    let (value, expiry) = match read_with_expiry(ctx, from).await {
        Ok(Some(found)) => found,
        Ok(None) => return w.error("ERR no such key"),
        Err(text) => return w.error(&text),
    };
    if from == to {
        return if nx { w.int(0) } else { w.ok() };
    }
    // The new key takes the old key's expiry time (or none), as in Redis.
    let flags = if nx { update::SET_NX as u8 } else { 0 };
    let write = match expiry {
        None if !nx => Op::Put {
            key: to.clone(),
            value: value.clone(),
        },
        _ => {
            let mut arg = bytes::BytesMut::with_capacity(1 + value.len());
            arg.extend_from_slice(&[flags]);
            arg.extend_from_slice(&value);
            Op::UpdateTtl {
                key: to.clone(),
                update: TtlUpdate {
                    apply: update::set_expiring,
                    arg: arg.freeze(),
                    number: expiry.unwrap_or(0),
                },
            }
        }
    };
    match first(ctx.handle.batch(vec![write]).await) {
        Ok(OpResult::Updated(UpdateAnswer::Nil)) => return w.int(0),
        Ok(_) => {}
        Err(e) => return w.error(&op_error_text(&e)),
    }
    let delete = Op::Update {
        key: from.clone(),
        update: Update {
            apply: update::delete_if_equal,
            arg: value,
            number: 0,
        },
    };
    match first(ctx.handle.batch(vec![delete]).await) {
        Ok(_) if nx => w.int(1),
        Ok(_) => w.ok(),
        Err(e) => w.error(&op_error_text(&e)),
    }
}

/// The parameters CONFIG GET knows, with values that hold for this server.
fn config_params(ctx: &ShardContext) -> Vec<(&'static str, String)> {
    let shared = &ctx.shared;
    let facts = &shared.facts;
    let (appendonly, appendfsync) = match facts.durability.as_str() {
        "sync" => ("yes", "always"),
        "async" => ("yes", "everysec"),
        _ => ("no", "no"),
    };
    let (bind, port) = match facts.resp_listen {
        Some(a) => (a.ip().to_string(), a.port().to_string()),
        None => (String::new(), "0".to_string()),
    };
    vec![
        ("save", String::new()),
        ("appendonly", appendonly.to_string()),
        ("appendfsync", appendfsync.to_string()),
        ("databases", "1".to_string()),
        ("maxclients", shared.max_connections.to_string()),
        ("timeout", shared.idle_timeout.as_secs().to_string()),
        ("bind", bind),
        ("port", port),
        // The limit as enforced: each shard's share, summed (0: none).
        ("maxmemory", {
            let m = ctx.handle.metrics();
            m.shards
                .iter()
                .map(|s| s.memory_bytes_max)
                .sum::<u64>()
                .to_string()
        }),
        ("maxmemory-policy", "noeviction".to_string()),
        (
            "proto-max-bulk-len",
            shared.limits.value_bytes_max.to_string(),
        ),
        (
            "client-query-buffer-limit",
            shared.limits.frame_bytes_max.to_string(),
        ),
        ("cluster-enabled", "no".to_string()),
    ]
}

const DEFAULT_SECTIONS: &[&str] = &[
    "server",
    "clients",
    "memory",
    "persistence",
    "stats",
    "replication",
    "cpu",
    "cluster",
    "keyspace",
    "ringkv",
];
const ALL_SECTIONS: &[&str] = &[
    "server",
    "clients",
    "memory",
    "persistence",
    "stats",
    "replication",
    "cpu",
    "commandstats",
    "cluster",
    "keyspace",
    "ringkv",
];

fn wanted_sections(asked: &[String]) -> Vec<&'static str> {
    if asked.is_empty() {
        return DEFAULT_SECTIONS.to_vec();
    }
    let mut out = Vec::new();
    for a in asked {
        let add: &[&'static str] = match a.as_str() {
            "all" | "everything" => ALL_SECTIONS,
            "default" => DEFAULT_SECTIONS,
            other => match ALL_SECTIONS.iter().find(|s| **s == other) {
                Some(s) => std::slice::from_ref(s),
                None => &[],
            },
        };
        for s in add {
            if !out.contains(s) {
                out.push(*s);
            }
        }
    }
    out
}

fn info_text(ctx: &ShardContext, asked: &[String]) -> String {
    let metrics = ctx.handle.metrics();
    let sums = InfoSums {
        resp: RespTotals::of(&ctx.shared),
        keys: metrics.shards.iter().map(|s| s.keys).sum(),
        expires: metrics.shards.iter().map(|s| s.expiring_keys).sum(),
        memory: metrics.shards.iter().map(|s| s.memory_bytes).sum(),
        memory_max: metrics.shards.iter().map(|s| s.memory_bytes_max).sum(),
        changes: changes_since_checkpoint(&metrics),
        uptime: ctx.shared.started.elapsed().as_secs(),
    };
    let mut t = String::new();
    for section in wanted_sections(asked) {
        if !t.is_empty() {
            t.push_str("\r\n");
        }
        write_section(&mut t, section, ctx, &sums);
    }
    t
}

/// What several INFO sections show, read once per INFO.
struct InfoSums {
    resp: RespTotals,
    keys: u64,
    expires: u64,
    memory: u64,
    /// `storage.max_memory` as enforced: the sum of the shards' shares.
    memory_max: u64,
    /// Records logged since each shard's newest checkpoint, summed.
    changes: u64,
    uptime: u64,
}

/// What Redis calls changes since the last save: the records each shard
/// logged after the LSN its newest checkpoint covers, summed (a
/// transaction's part counts once; 0 without a WAL).
fn changes_since_checkpoint(metrics: &engine::EngineMetrics) -> u64 {
    metrics
        .shards
        .iter()
        .map(|s| s.current_lsn.saturating_sub(s.checkpoint_last_lsn))
        .sum()
}

/// Appends one INFO section (`section`: its lowercase name) to `t`.
fn write_section(t: &mut String, section: &str, ctx: &ShardContext, sums: &InfoSums) {
    let shared = &ctx.shared;
    let facts = &shared.facts;
    let InfoSums {
        resp,
        keys,
        expires,
        memory,
        memory_max,
        changes,
        uptime,
    } = sums;
    let (keys, expires, memory, uptime) = (*keys, *expires, *memory, *uptime);
    match section {
        "server" => {
            let port = facts.resp_listen.map_or(0, |a| a.port());
            let _ = write!(
                    t,
                    "# Server\r\nredis_version:{REDIS_VERSION}\r\nringkv_version:{}\r\nredis_mode:standalone\r\nos:{} {}\r\narch_bits:{}\r\nprocess_id:{}\r\ntcp_port:{port}\r\nuptime_in_seconds:{uptime}\r\nuptime_in_days:{}\r\n",
                    facts.version,
                    std::env::consts::OS,
                    std::env::consts::ARCH,
                    usize::BITS,
                    std::process::id(),
                    uptime / 86_400,
                );
        }
        "clients" => {
            let _ = write!(
                t,
                "# Clients\r\nconnected_clients:{}\r\nmaxclients:{}\r\n",
                shared.connections_open(),
                shared.max_connections
            );
        }
        "memory" => {
            let _ = write!(
                    t,
                    "# Memory\r\nused_memory:{memory}\r\nmaxmemory:{memory_max}\r\nmaxmemory_policy:noeviction\r\n"
                );
        }
        "persistence" => write_persistence(t, ctx, *changes),
        "stats" => {
            let _ = write!(
                    t,
                    "# Stats\r\ntotal_connections_received:{}\r\ntotal_commands_processed:{}\r\ntotal_error_replies:{}\r\n",
                    resp.connections_accepted, resp.commands, resp.errors
                );
        }
        "replication" => t.push_str(
            "# Replication\r\nrole:master\r\nconnected_slaves:0\r\nmaster_repl_offset:0\r\n",
        ),
        "cpu" => {
            let (user, sys) = cpu_seconds(libc::RUSAGE_SELF);
            let (user_children, sys_children) = cpu_seconds(libc::RUSAGE_CHILDREN);
            let _ = write!(
                    t,
                    "# CPU\r\nused_cpu_sys:{sys:.6}\r\nused_cpu_user:{user:.6}\r\nused_cpu_sys_children:{sys_children:.6}\r\nused_cpu_user_children:{user_children:.6}\r\n"
                );
        }
        "commandstats" => write_commandstats(t, resp),
        "cluster" => t.push_str("# Cluster\r\ncluster_enabled:0\r\n"),
        "keyspace" => {
            t.push_str("# Keyspace\r\n");
            if keys > 0 {
                let _ = write!(t, "db0:keys={keys},expires={expires},avg_ttl=0\r\n");
            }
        }
        "ringkv" => write_ringkv(t, ctx, resp),
        _ => {}
    }
}

fn write_persistence(t: &mut String, ctx: &ShardContext, changes: u64) {
    let facts = &ctx.shared.facts;
    let aof = u8::from(facts.durability != "none");
    let save = ctx.handle.save_status();
    let _ = write!(
        t,
        "# Persistence\r\nloading:0\r\naof_enabled:{aof}\r\nrdb_changes_since_last_save:{changes}\r\nrdb_bgsave_in_progress:{}\r\nrdb_last_save_time:{}\r\nrdb_last_bgsave_status:{}\r\nringkv_durability:{}\r\nringkv_tier:{}\r\n",
        u8::from(save.in_progress),
        save.last_save_unix,
        if save.last_ok { "ok" } else { "err" },
        facts.durability,
        facts.tier
    );
}

fn write_commandstats(t: &mut String, resp: &crate::resp::RespTotals) {
    t.push_str("# Commandstats\r\n");
    for (name, (calls, rejected, failed)) in COMMANDS.iter().zip(&resp.per_command) {
        if *calls > 0 {
            let _ = write!(
                t,
                "cmdstat_{name}:calls={calls},rejected_calls={rejected},failed_calls={failed}\r\n"
            );
        }
    }
}

/// The `# Ringkv` section: every STATS value (dots as underscores) and the
/// RESP port's own counts.
fn write_ringkv(t: &mut String, ctx: &ShardContext, resp: &crate::resp::RespTotals) {
    t.push_str("# Ringkv\r\n");
    for (name, value) in ctx.stats_pairs() {
        let _ = write!(t, "{}:{}\r\n", name.replace('.', "_"), value);
    }
    let _ = write!(
        t,
        "resp_connections_open:{}\r\nresp_commands_unknown:{}\r\n",
        resp.connections_open(),
        resp.unknown
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections() {
        assert_eq!(wanted_sections(&[]), DEFAULT_SECTIONS);
        assert_eq!(wanted_sections(&["server".into()]), vec!["server"]);
        assert_eq!(wanted_sections(&["all".into()]), ALL_SECTIONS);
        assert_eq!(
            wanted_sections(&["keyspace".into(), "nonsense".into(), "keyspace".into()]),
            vec!["keyspace"]
        );
    }
}
