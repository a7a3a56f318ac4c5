//! The shard's side of an online backup (`crate::backup` drives it): a
//! checkpoint taken on request, a *pin* that stops checkpoints (and so the
//! removal of snapshots, WAL segments and value segments) until the backup
//! has copied what it was told about, and the *cut*: the WAL position the
//! backup copies up to.
//!
//! What must hold: while pinned, no file named in an answer is removed or
//! recycled (only checkpoints retire files, and the checkpointer takes
//! none); the cut's LSN is durable before it is answered, so every flush
//! through it is whole on disk when the backup reads the segments; the
//! pin ends on `Unpin`, or when the backup's side goes away.

use crate::io::Disk;
use crate::layout::ShardPaths;
use crate::shard::core::ShardCore;
use crate::snapshot::SnapshotFile;
use crate::tier::TierFile;
use crate::wal::head::HEAD_FILE;
use crate::wal::writer::SegmentFiles;
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::path::PathBuf;

/// What a backup asks of one shard.
pub(crate) enum BackupRequest {
    /// Take a checkpoint now (unless nothing was logged since the newest);
    /// with `pin`, then hold further checkpoints until `Unpin`.
    Checkpoint {
        pin: bool,
        reply: flume::Sender<Result<Pinned, String>>,
    },
    /// The WAL position to copy up to (pinned shards only).
    Cut {
        reply: flume::Sender<Result<Cut, String>>,
    },
    /// Checkpoints may go on.
    Unpin,
}

/// The files a pinned shard keeps until `Unpin`.
#[derive(Debug, Clone)]
pub(crate) struct Pinned {
    /// Every snapshot file kept (the newest chains), oldest first.
    pub(crate) snapshots: Vec<SnapshotFile>,
    /// The tier's own files (value segments), with their written bytes.
    pub(crate) tier_files: Vec<TierFile>,
}

/// Where a pinned shard's WAL is cut.
#[derive(Debug, Clone)]
pub(crate) struct Cut {
    /// Every record through this LSN is durable.
    pub(crate) lsn: u64,
    /// The segments holding records (`path`, `seq`), oldest first.
    pub(crate) segments: Vec<(PathBuf, u64)>,
    /// The WAL head file's bytes, read after the cut's LSN was durable.
    pub(crate) head: Option<Vec<u8>>,
}

/// The requests waiting for the checkpointer, and whether it is pinned.
#[derive(Default)]
pub(crate) struct BackupSide {
    queue: RefCell<VecDeque<BackupRequest>>,
    pinned: Cell<bool>,
    /// The checkpointer runs and takes requests.
    open: Cell<bool>,
}

impl BackupSide {
    pub(crate) fn pinned(&self) -> bool {
        self.pinned.get()
    }

    /// Queues a request and wakes the checkpointer.
    pub(crate) fn push(&self, core: &ShardCore, req: BackupRequest) {
        if core.is_poisoned() || !self.open.get() {
            answer_refused(req, "the shard is poisoned or has no WAL");
            return;
        }
        self.queue.borrow_mut().push_back(req);
        core.wal.checkpoint_wanted.notify();
    }

    /// The checkpointer starts taking requests.
    pub(crate) fn open(&self) {
        self.open.set(true);
    }

    pub(crate) fn take(&self) -> Option<BackupRequest> {
        self.queue.borrow_mut().pop_front()
    }

    /// The checkpointer ends (a poisoned shard): refuse what waits.
    pub(crate) fn refuse_all(&self) {
        self.open.set(false);
        self.pinned.set(false);
        for req in self.queue.borrow_mut().drain(..) {
            answer_refused(req, "the shard stopped taking checkpoints (poisoned)");
        }
    }
}

fn answer_refused(req: BackupRequest, why: &str) {
    match req {
        BackupRequest::Checkpoint { reply, .. } => {
            let _ = reply.send(Err(why.to_string()));
        }
        BackupRequest::Cut { reply } => {
            let _ = reply.send(Err(why.to_string()));
        }
        BackupRequest::Unpin => {}
    }
}

/// Answers one request on the checkpointer's task. `checkpoint_result`:
/// how the checkpoint the checkpointer took for a `Checkpoint` request went
/// (`None`: none was taken, a backup holds checkpoints).
pub(crate) async fn handle<D: Disk>(
    core: &ShardCore,
    files: &SegmentFiles<D>,
    paths: &ShardPaths,
    snapshots: &[SnapshotFile],
    req: BackupRequest,
    checkpoint_result: Option<Result<(), String>>,
) {
    match req {
        BackupRequest::Checkpoint { pin, reply } => {
            let answer = match checkpoint_result {
                Some(Err(e)) => Err(e),
                _ => {
                    if pin {
                        core.backup.pinned.set(true);
                    }
                    Ok(Pinned {
                        snapshots: snapshots.to_vec(),
                        tier_files: core.with_tier(|t| t.backup_files()),
                    })
                }
            };
            if reply.send(answer).is_err() && pin {
                // Nobody waits for it: do not hold checkpoints.
                core.backup.pinned.set(false);
            }
        }
        BackupRequest::Cut { reply } => {
            let answer = cut(core, files, paths).await;
            let _ = reply.send(answer);
        }
        BackupRequest::Unpin => core.backup.pinned.set(false),
    }
}

async fn cut<D: Disk>(
    core: &ShardCore,
    files: &SegmentFiles<D>,
    paths: &ShardPaths,
) -> Result<Cut, String> {
    if !core.backup.pinned() {
        return Err("no backup holds this shard's checkpoints".into());
    }
    let lsn = core.last_lsn();
    core.wait_durable(lsn)
        .await
        .map_err(|()| "the WAL could not be made durable (the shard is poisoned)".to_string())?;
    // Read after the LSN is durable: the head names no segment whose first
    // flush is not on disk, and the segments listed include it.
    let head_path = paths.dir.join(HEAD_FILE);
    let head = match std::fs::read(&head_path) {
        Ok(b) => Some(b),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(format!("cannot read {}: {e}", head_path.display())),
    };
    let segments = files
        .live_segments()
        .into_iter()
        .map(|s| (s.path, s.seq))
        .collect();
    Ok(Cut {
        lsn,
        segments,
        head,
    })
}

/// The engine-wide side of backups.
#[derive(Debug)]
pub(crate) struct BackupShared {
    /// Per shard, its paths; empty when the engine keeps no files.
    pub(crate) paths: Vec<ShardPaths>,
    /// Where the manifest lives (`storage.data_dir`).
    pub(crate) data_dir: std::path::PathBuf,
    /// The folders of a shard where its tier keeps files of its own: a
    /// backup makes them in its copy of each shard.
    pub(crate) tier_dirs: crate::tier::config::TierDirs,
    pub(crate) running: std::sync::atomic::AtomicBool,
    pub(crate) last_save_unix: std::sync::atomic::AtomicU64,
    pub(crate) last_failed: std::sync::atomic::AtomicBool,
    /// The running (or last) backup's progress, for STATS: files copied or
    /// linked, the files it will hold, and the bytes.
    pub(crate) files: std::sync::atomic::AtomicU64,
    pub(crate) files_total: std::sync::atomic::AtomicU64,
    pub(crate) bytes: std::sync::atomic::AtomicU64,
}

impl BackupShared {
    pub(crate) fn new(
        paths: Vec<ShardPaths>,
        data_dir: std::path::PathBuf,
        tier_dirs: crate::tier::config::TierDirs,
    ) -> BackupShared {
        BackupShared {
            paths,
            data_dir,
            tier_dirs,
            running: std::sync::atomic::AtomicBool::new(false),
            // What recovery loaded is on disk: the start counts as a save
            // (as Redis's load of its dump does).
            last_save_unix: std::sync::atomic::AtomicU64::new(unix_now()),
            last_failed: std::sync::atomic::AtomicBool::new(false),
            files: std::sync::atomic::AtomicU64::new(0),
            files_total: std::sync::atomic::AtomicU64::new(0),
            bytes: std::sync::atomic::AtomicU64::new(0),
        }
    }
}

pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
