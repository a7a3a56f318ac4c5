//! The `/metrics` page: the server's counters and the engine's metrics
//! (per shard, per device) in Prometheus text format. Device series carry
//! `device` and `profile` labels so a graph always says which disk profile
//! produced it.
//!
//! What must hold: metric names and labels are stable (dashboards depend on
//! them; docs/benchmarks.md and the README cite some), every histogram is
//! cumulative, and rendering reads only snapshots (no lock on the data path).

use engine::metrics::{DeviceMetrics, EngineMetrics, ShardMetrics};
use ringkv_protocol::stats::DeviceStats;
use ringkv_protocol::Status;

use crate::native::session::CloseReason;
use crate::ops::counters::{CountersSnapshot, OpKind};
use crate::ops::prom::{latency_sample, size_sample, PromText};
use crate::shard::{DeviceFacts, Shared};

/// Renders the whole page.
pub fn render(shared: &Shared, engine: &EngineMetrics) -> String {
    let mut p = PromText::new();
    render_process(&mut p);
    render_server(&mut p, shared);
    render_txn(&mut p, shared);
    for shard in &engine.shards {
        render_shard(&mut p, shard);
    }
    for device in &engine.devices {
        render_device(&mut p, shared, device);
    }
    p.render()
}

/// The process's own figures under the names every Prometheus client
/// library uses (`process_*`), read from /proc/self: CPU, memory, open
/// descriptors and their limit, start time. A figure /proc does not give
/// is left out.
fn render_process(p: &mut PromText) {
    let stat = std::fs::read_to_string("/proc/self/stat").ok();
    // Fields after the parenthesised command name (which may hold spaces):
    // state is field 3, utime 14, stime 15, starttime 22, vsize 23, rss 24.
    let fields: Vec<&str> = stat
        .as_deref()
        .and_then(|s| s.rsplit_once(')'))
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let field = |n: usize| fields.get(n - 3).and_then(|v| v.parse::<u64>().ok());
    // SAFETY: sysconf only reads the named configuration value.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    // SAFETY: as above.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as f64;
    if let (Some(u), Some(s)) = (field(14), field(15)) {
        p.counter_float(
            "process_cpu_seconds_total",
            "User and system CPU time the process spent, in seconds.",
            &[],
            (u + s) as f64 / ticks,
        );
    }
    if let Some(rss) = field(24) {
        p.gauge(
            "process_resident_memory_bytes",
            "Resident memory size in bytes.",
            &[],
            rss as f64 * page,
        );
    }
    if let Some(vsize) = field(23) {
        p.gauge(
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes.",
            &[],
            vsize as f64,
        );
    }
    let boot = std::fs::read_to_string("/proc/stat").ok().and_then(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("btime "))
            .and_then(|v| v.trim().parse::<u64>().ok())
    });
    if let (Some(boot), Some(start)) = (boot, field(22)) {
        p.gauge(
            "process_start_time_seconds",
            "Start time of the process since the Unix epoch, in seconds.",
            &[],
            boot as f64 + start as f64 / ticks,
        );
    }
    if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
        p.gauge(
            "process_open_fds",
            "Open file descriptors.",
            &[],
            fds.count() as f64,
        );
    }
    // SAFETY: an all-zero rlimit is a valid value that getrlimit overwrites.
    let mut limit: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: `limit` is a valid, writable rlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0 {
        p.gauge(
            "process_max_fds",
            "Most open file descriptors allowed (the soft limit).",
            &[],
            limit.rlim_cur as f64,
        );
    }
}

fn render_txn(p: &mut PromText, shared: &Shared) {
    let t = crate::ops::stats::txn_stats(shared.handle.txn_stats());
    p.gauge(
        "ringkv_txn_open",
        "Transactions open now.",
        &[],
        t.open as f64,
    );
    p.counter(
        "ringkv_txn_commits_total",
        "Transactions committed.",
        &[],
        t.commits,
    );
    for (reason, n) in [
        ("rollback", t.rollbacks),
        ("die", t.aborts_die),
        ("lock_timeout", t.aborts_lock_timeout),
        ("idle", t.aborts_idle),
        ("dropped", t.aborts_dropped),
        ("commit_failed", t.commit_failures),
    ] {
        p.counter(
            "ringkv_txn_aborts_total",
            "Transactions that did not commit, by reason.",
            &[("reason", reason)],
            n,
        );
    }
    p.counter(
        "ringkv_txn_lock_waits_total",
        "Lock requests that waited for another transaction.",
        &[],
        t.lock_waits,
    );
    p.counter_float(
        "ringkv_txn_lock_wait_seconds_total",
        "Time spent waiting for locks, summed.",
        &[],
        t.lock_wait_us as f64 / 1e6,
    );
}

fn render_server(p: &mut PromText, shared: &Shared) {
    let facts = &shared.facts;
    let shards = facts.shard_count.to_string();
    p.gauge(
        "ringkv_info",
        "Build and run facts of this server (value is always 1).",
        &[
            ("version", facts.version),
            ("backend", &facts.backend),
            ("durability", &facts.durability),
            ("tier", &facts.tier),
            ("shards", &shards),
        ],
        1.0,
    );
    p.gauge(
        "ringkv_uptime_seconds",
        "Seconds since the server started.",
        &[],
        shared.started.elapsed().as_secs_f64(),
    );
    let c = shared.counters_total();
    for kind in OpKind::ALL {
        for status in Status::ALL {
            let n = c.ops(kind, status);
            // Always show OK so every op kind has a series from the start.
            if n > 0 || status == Status::Ok {
                p.counter(
                    "ringkv_ops_total",
                    "Operations answered, by type and wire status.",
                    &[("op", kind.name()), ("status", status.name())],
                    n,
                );
            }
        }
    }
    p.counter(
        "ringkv_requests_total",
        "Request frames answered with a RESPONSE frame.",
        &[],
        c.requests,
    );
    for status in Status::ALL {
        let n = c.error_frames(status);
        if n > 0 {
            p.counter(
                "ringkv_error_frames_total",
                "ERROR frames sent (refused requests or connections), by status.",
                &[("status", status.name())],
                n,
            );
        }
    }
    p.histogram(
        "ringkv_batch_latency_seconds",
        "Time from a request frame being decoded to its response being encoded.",
        &[],
        &latency_sample(&c.batch_latency, 1e6),
    );
    render_connections(p, shared, &c);
    render_resp(p, shared, &c);
}

/// Connections and authentication.
fn render_connections(p: &mut PromText, shared: &Shared, c: &CountersSnapshot) {
    p.gauge(
        "ringkv_connections_open",
        "Client connections open now.",
        &[],
        shared.connections_open() as f64,
    );
    p.gauge(
        "ringkv_connections_max",
        "Most client connections allowed at once (server.max_connections).",
        &[],
        shared.max_connections as f64,
    );
    p.counter(
        "ringkv_connections_accepted_total",
        "TCP connections accepted (including refused ones).",
        &[],
        c.connections_accepted,
    );
    for reason in CloseReason::ALL {
        p.counter(
            "ringkv_connections_closed_total",
            "Connections closed, by reason.",
            &[("reason", reason.name())],
            c.closed(reason),
        );
    }
    let auth = &shared.access.auth;
    p.gauge(
        "ringkv_auth_required",
        "1 when clients must present a password (server.requirepass / password_file).",
        &[],
        if auth.is_required() { 1.0 } else { 0.0 },
    );
    p.counter(
        "ringkv_auth_failures_total",
        "Refused authentication attempts (missing or wrong password), all listeners.",
        &[],
        auth.failures(),
    );
    p.counter(
        "ringkv_auth_successes_total",
        "Accepted password checks, all listeners.",
        &[],
        auth.successes(),
    );
}

/// The RESP port's commands, and the bytes of every client connection.
fn render_resp(p: &mut PromText, shared: &Shared, c: &CountersSnapshot) {
    let resp = crate::resp::RespTotals::of(shared);
    p.gauge(
        "ringkv_resp_connections_open",
        "RESP (Redis-protocol) connections open now.",
        &[],
        resp.connections_open() as f64,
    );
    p.counter(
        "ringkv_resp_connections_accepted_total",
        "RESP connections accepted.",
        &[],
        resp.connections_accepted,
    );
    for (name, (calls, rejected, failed)) in
        crate::resp::command::COMMANDS.iter().zip(&resp.per_command)
    {
        if *calls == 0 {
            continue;
        }
        let labels = [("command", *name)];
        p.counter(
            "ringkv_resp_commands_total",
            "RESP commands received, by command (lowercase name; \"unknown\" for names ringkv does not know).",
            &labels,
            *calls,
        );
        p.counter(
            "ringkv_resp_command_errors_total",
            "RESP commands answered with an error, by command: refused before running (arity, syntax) or failed while running.",
            &labels,
            rejected + failed,
        );
    }
    if resp.unknown > 0 {
        p.counter(
            "ringkv_resp_commands_total",
            "RESP commands received, by command (lowercase name; \"unknown\" for names ringkv does not know).",
            &[("command", "unknown")],
            resp.unknown,
        );
    }
    p.counter(
        "ringkv_resp_errors_total",
        "Error replies on RESP connections (argument errors, failed runs, protocol errors).",
        &[],
        resp.errors,
    );
    p.counter(
        "ringkv_network_received_bytes_total",
        "Bytes read from client connections.",
        &[],
        c.bytes_received,
    );
    p.counter(
        "ringkv_network_sent_bytes_total",
        "Bytes written to client connections.",
        &[],
        c.bytes_sent,
    );
}

/// The tier's values of one shard that `/metrics` shows (gauges first,
/// then counters, each kind in the tier's order), and its cold read
/// latencies.
fn render_tier(
    p: &mut PromText,
    l: &[(&str, &str)],
    values: &[engine::TierCounter],
    latency: &engine::histogram::HistogramSnapshot,
) {
    for kind in [engine::CounterKind::Gauge, engine::CounterKind::Counter] {
        for c in values.iter().filter(|c| c.kind == kind) {
            let Some(m) = c.metric else { continue };
            match kind {
                engine::CounterKind::Gauge => p.gauge(m.name, m.help, l, c.value as f64),
                engine::CounterKind::Counter => p.counter(m.name, m.help, l, c.value),
            }
        }
    }
    p.histogram(
        "ringkv_tier_cold_read_seconds",
        "Latency of cold reads (records read from a value device).",
        l,
        &latency_sample(latency, 1e6),
    );
}

fn render_shard(p: &mut PromText, s: &ShardMetrics) {
    let shard = s.shard.to_string();
    let l = [("shard", shard.as_str())];
    p.gauge(
        "ringkv_shard_keys",
        "Keys stored in the shard.",
        &l,
        s.keys as f64,
    );
    p.gauge(
        "ringkv_shard_memory_bytes",
        "Bytes held by the shard's storage tier.",
        &l,
        s.memory_bytes as f64,
    );
    p.gauge(
        "ringkv_shard_memory_max_bytes",
        "The shard's share of storage.max_memory (0: no limit).",
        &l,
        s.memory_bytes_max as f64,
    );
    p.counter(
        "ringkv_shard_oom_refusals_total",
        "Writes the shard refused with OUT_OF_MEMORY.",
        &l,
        s.oom_refusals,
    );
    for (op, n) in [
        ("get", s.ops_get),
        ("put", s.ops_put),
        ("delete", s.ops_delete),
    ] {
        p.counter(
            "ringkv_shard_ops_total",
            "Operations the shard executed, by type.",
            &[("shard", shard.as_str()), ("op", op)],
            n,
        );
    }
    p.counter(
        "ringkv_shard_ops_failed_total",
        "Operations the shard answered with an error.",
        &l,
        s.ops_failed,
    );
    if let Some(h) = &s.hybrid {
        let values = h.counters(&s.cold_read_latency_us);
        render_tier(p, &l, &values, &s.cold_read_latency_us);
    }
    p.gauge(
        "ringkv_shard_queue_depth",
        "Sub-batches waiting in the shard's inbound channel.",
        &l,
        s.queue_depth as f64,
    );
    p.counter(
        "ringkv_shard_cross_requests_total",
        "Sub-batches the shard sent to other shards (keys another shard owns).",
        &l,
        s.cross_requests,
    );
    p.counter(
        "ringkv_shard_wakeups_total",
        "Parked shards this shard woke to hand them work or answers.",
        &l,
        s.wakeups,
    );
    p.gauge(
        "ringkv_shard_poisoned",
        "1 if a failed write or fdatasync stopped the shard's writes until restart.",
        &l,
        f64::from(u8::from(s.poisoned)),
    );
    render_wal(p, &l, s);
    render_checkpoints(p, &l, s);
}

/// One shard's WAL.
fn render_wal(p: &mut PromText, l: &[(&str, &str)], s: &ShardMetrics) {
    p.counter(
        "ringkv_wal_written_bytes_total",
        "Bytes written to WAL segments.",
        l,
        s.wal_bytes_written,
    );
    p.counter(
        "ringkv_wal_flushes_total",
        "WAL group commits (one write and one fdatasync each).",
        l,
        s.wal_flushes,
    );
    p.counter(
        "ringkv_wal_records_total",
        "Data records logged.",
        l,
        s.wal_records,
    );
    p.histogram(
        "ringkv_wal_group_commit_records",
        "Records per WAL group commit.",
        l,
        &size_sample(&s.group_commit_records),
    );
    p.histogram(
        "ringkv_wal_flush_bytes",
        "Bytes per WAL group commit.",
        l,
        &size_sample(&s.group_commit_bytes),
    );
    p.histogram(
        "ringkv_wal_fdatasync_seconds",
        "fdatasync latency of WAL flushes.",
        l,
        &latency_sample(&s.fdatasync_latency_us, 1e6),
    );
    p.gauge(
        "ringkv_wal_current_lsn",
        "Last LSN assigned.",
        l,
        s.current_lsn as f64,
    );
    p.gauge(
        "ringkv_wal_durable_lsn",
        "Last LSN known durable on disk.",
        l,
        s.durable_lsn as f64,
    );
    p.gauge(
        "ringkv_wal_live_bytes",
        "Bytes in live WAL segment files.",
        l,
        s.wal_live_bytes as f64,
    );
}

/// One shard's checkpoints, recovery and expiry.
fn render_checkpoints(p: &mut PromText, l: &[(&str, &str)], s: &ShardMetrics) {
    p.counter(
        "ringkv_checkpoints_total",
        "Checkpoints (snapshots) written.",
        l,
        s.checkpoints,
    );
    p.counter(
        "ringkv_checkpoint_failures_total",
        "Checkpoints that failed.",
        l,
        s.checkpoint_failures,
    );
    p.counter(
        "ringkv_checkpoint_deltas_total",
        "Checkpoints written as deltas over the one before.",
        l,
        s.checkpoint_deltas,
    );
    p.counter(
        "ringkv_checkpoint_bytes_total",
        "Bytes of checkpoint files written.",
        l,
        s.checkpoint_bytes,
    );
    p.gauge(
        "ringkv_checkpoint_last_duration_seconds",
        "Duration of the newest checkpoint.",
        l,
        s.checkpoint_last_duration_us as f64 / 1e6,
    );
    p.gauge(
        "ringkv_checkpoint_last_lsn",
        "LSN covered by the newest checkpoint.",
        l,
        s.checkpoint_last_lsn as f64,
    );
    p.gauge(
        "ringkv_recovery_duration_seconds",
        "Time the shard's recovery took at start.",
        l,
        s.recovery_duration_us as f64 / 1e6,
    );
    p.gauge(
        "ringkv_recovery_replayed_bytes",
        "WAL bytes replayed at start.",
        l,
        s.recovery_bytes_replayed as f64,
    );
    p.gauge(
        "ringkv_recovery_replayed_records",
        "WAL records replayed at start.",
        l,
        s.recovery_records_replayed as f64,
    );
    p.gauge(
        "ringkv_recovery_snapshot_entries",
        "Entries loaded from the snapshot at start.",
        l,
        s.recovery_snapshot_entries as f64,
    );
    p.gauge(
        "ringkv_expiring_keys",
        "Keys that carry an expiry time (expired ones included until deleted).",
        l,
        s.expiring_keys as f64,
    );
    p.counter(
        "ringkv_expired_keys_total",
        "Expired keys deleted (active expiry, or a write that found its key expired).",
        l,
        s.expired_keys,
    );
}

fn facts_of<'a>(shared: &'a Shared, device: &DeviceMetrics) -> Option<&'a DeviceFacts> {
    shared.facts.devices.iter().find(|d| d.name == device.name)
}

/// The `device.NAME.*` STATS entries of one device (without the prefix).
pub fn device_stats(shared: &Shared, d: &DeviceMetrics) -> DeviceStats {
    let profile = facts_of(shared, d).map(|f| &f.profile);
    let io = &d.io;
    DeviceStats {
        profile: d.profile.clone(),
        iops_limit: profile.map_or(0, |p| p.iops),
        burst_iops: profile.map_or(0, |p| p.burst_iops),
        ios: io.ios_admitted,
        reads: io.reads,
        writes: io.writes,
        syncs: io.syncs,
        bytes_read: io.bytes_read,
        bytes_written: io.bytes_written,
        token_wait_us: io.wait_ns_total / 1_000,
        fsync_p99_us: io.fsync_latency.quantile(0.99) / 1_000,
        credit: io.credit.unwrap_or(0),
    }
}

fn render_device(p: &mut PromText, shared: &Shared, d: &DeviceMetrics) {
    let l = [("device", d.name.as_str()), ("profile", d.profile.as_str())];
    let io = &d.io;
    let profile = facts_of(shared, d).map(|f| &f.profile);
    p.gauge(
        "ringkv_device_iops_limit",
        "Sustained IOPS of the device's disk profile (0 = unlimited).",
        &l,
        profile.map_or(0, |p| p.iops) as f64,
    );
    p.gauge(
        "ringkv_device_burst_iops",
        "Burst IOPS of the device's disk profile.",
        &l,
        profile.map_or(0, |p| p.burst_iops) as f64,
    );
    p.gauge(
        "ringkv_device_bandwidth_limit_bytes_per_second",
        "Bandwidth cap of the device's disk profile (0 = none).",
        &l,
        profile.map_or(0, |p| p.bytes_per_sec.as_u64()) as f64,
    );
    p.counter(
        "ringkv_device_ios_total",
        "I/O units admitted by the disk profile (large I/Os count per io_unit).",
        &l,
        io.ios_admitted,
    );
    p.counter(
        "ringkv_device_reads_total",
        "Reads submitted.",
        &l,
        io.reads,
    );
    p.counter(
        "ringkv_device_writes_total",
        "Writes submitted.",
        &l,
        io.writes,
    );
    p.counter(
        "ringkv_device_syncs_total",
        "fdatasync and directory syncs submitted.",
        &l,
        io.syncs,
    );
    p.counter(
        "ringkv_device_errors_total",
        "Operations the backend failed.",
        &l,
        io.errors,
    );
    p.counter(
        "ringkv_device_read_bytes_total",
        "Bytes read.",
        &l,
        io.bytes_read,
    );
    p.counter(
        "ringkv_device_written_bytes_total",
        "Bytes written (including preallocation zero-fill).",
        &l,
        io.bytes_written,
    );
    p.counter_float(
        "ringkv_device_token_wait_seconds_total",
        "Total time operations waited for the profile's tokens.",
        &l,
        io.wait_ns_total as f64 / 1e9,
    );
    p.counter(
        "ringkv_device_token_waits_total",
        "Operations that had to wait for tokens.",
        &l,
        io.waits,
    );
    p.gauge(
        "ringkv_device_burst_credit",
        "Burst credit (I/Os) held now (0 when the profile has no IOPS limit).",
        &l,
        io.credit.unwrap_or(0) as f64,
    );
    p.histogram(
        "ringkv_device_fsync_seconds",
        "fdatasync latency through the device, token wait included.",
        &l,
        &latency_sample(&io.fsync_latency, 1e9),
    );
    p.histogram(
        "ringkv_device_write_seconds",
        "Write latency through the device, token wait included.",
        &l,
        &latency_sample(&io.write_latency, 1e9),
    );
}
