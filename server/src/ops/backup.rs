//! The server's side of online backups (`engine::backup`): the native
//! BACKUP operation and RESP's `BGSAVE`, each run on a thread of its own
//! (the engine's backup blocks), answered when it ends.

use engine::backup::{BackupError, BackupOptions, BackupReport};
use ringkv_protocol::{OpReply, Status};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Runs `f` on a new thread and waits for its answer without blocking the
/// caller's runtime.
async fn off_thread<T: Send + 'static>(
    name: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let (tx, rx) = futures::channel::oneshot::channel();
    let spawned = std::thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            let _ = tx.send(f());
        });
    if spawned.is_err() {
        return None;
    }
    rx.await.ok()
}

/// The wire status of a failed backup.
fn status_of(e: &BackupError) -> Status {
    match e {
        BackupError::Busy => Status::Overloaded,
        BackupError::NoFiles => Status::Unsupported,
        BackupError::Target { .. } => Status::BadRequest,
        _ => Status::Internal,
    }
}

/// A finished backup as (name, value) pairs.
pub fn report_pairs(r: &BackupReport) -> Vec<(String, String)> {
    let secs = r.duration.as_secs_f64();
    let mut out = vec![
        ("backup.dest".to_string(), r.dest.display().to_string()),
        ("backup.files".to_string(), r.progress.files.to_string()),
        ("backup.bytes".to_string(), r.progress.bytes.to_string()),
        (
            "backup.linked_files".to_string(),
            r.progress.linked.to_string(),
        ),
        ("backup.seconds".to_string(), format!("{secs:.3}")),
        (
            "backup.finished_unix".to_string(),
            r.finished_unix.to_string(),
        ),
    ];
    for s in &r.shards {
        out.push((
            format!("backup.shard.{}.last_lsn", s.shard),
            s.last_lsn.to_string(),
        ));
    }
    out
}

/// The native BACKUP operation: a backup into `dest` (on this machine).
pub async fn native_backup(handle: &engine::Handle, dest: &[u8], rate: u64) -> OpReply {
    let Ok(dest) = std::str::from_utf8(dest) else {
        return OpReply::Error {
            status: Status::BadRequest,
            message: "the BACKUP path is not UTF-8".into(),
        };
    };
    // The server resolves a relative path in its own working directory,
    // which the client neither sees nor chose: refused, never guessed.
    if !std::path::Path::new(dest).is_absolute() {
        return OpReply::Error {
            status: Status::BadRequest,
            message: format!(
                "the BACKUP path must be absolute (got {dest:?}): the server would resolve it in its own working directory, not the client's"
            ),
        };
    }
    let handle = handle.clone();
    let opts = BackupOptions {
        dest: PathBuf::from(dest),
        rate_bytes_per_sec: rate,
    };
    let result = off_thread("ringkv-backup", move || run_logged(&handle, &opts)).await;
    match result {
        Some(Ok(report)) => OpReply::Stats(report_pairs(&report)),
        Some(Err(e)) => OpReply::Error {
            status: status_of(&e),
            message: format!("backup failed: {e}"),
        },
        None => OpReply::Error {
            status: Status::Internal,
            message: "backup failed: its thread could not run".into(),
        },
    }
}

/// Runs a backup, logging its start, a progress line at most every few
/// seconds, and its end.
pub fn run_logged(
    handle: &engine::Handle,
    opts: &BackupOptions,
) -> Result<BackupReport, BackupError> {
    tracing::info!(dest = %opts.dest.display(), rate_bytes_per_sec = opts.rate_bytes_per_sec, "backup started");
    let mut last = Instant::now();
    let result = handle.backup(opts, &mut |p| {
        if last.elapsed() >= Duration::from_secs(5) {
            last = Instant::now();
            tracing::info!(
                files = p.files,
                files_total = p.files_total,
                bytes = p.bytes,
                "backup in progress"
            );
        }
    });
    match &result {
        Ok(r) => tracing::info!(
            dest = %r.dest.display(),
            files = r.progress.files,
            linked = r.progress.linked,
            bytes = r.progress.bytes,
            duration_ms = r.duration.as_millis() as u64,
            "backup finished"
        ),
        Err(e) => tracing::warn!(dest = %opts.dest.display(), error = %e, "backup failed"),
    }
    result
}

/// RESP's `BGSAVE`: a checkpoint of every shard, in the background. Returns
/// the refusal if one is already running.
pub fn start_bgsave(handle: &engine::Handle) -> Result<(), String> {
    if !handle.keeps_files() {
        return Err(
            "ringkv keeps no files (storage.durability = \"none\"): nothing to save".into(),
        );
    }
    if handle.save_status().in_progress {
        return Err("Background save already in progress".into());
    }
    let handle = handle.clone();
    std::thread::Builder::new()
        .name("ringkv-bgsave".into())
        .spawn(move || match handle.checkpoint_all() {
            Ok(()) => tracing::info!("BGSAVE: every shard checkpointed"),
            Err(e) => tracing::warn!(error = %e, "BGSAVE failed"),
        })
        .map(|_| ())
        .map_err(|e| format!("cannot start the background save: {e}"))
}
