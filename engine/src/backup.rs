//! Online backup: a consistent, self-contained copy of every shard into a
//! new directory while the engine serves ([`Handle::backup`]), and the
//! checkpoint of every shard that `BGSAVE` asks for
//! ([`Handle::checkpoint_all`]). The guarantees are in
//! `docs/operations.md` ("Backup and restore").
//!
//! The steps:
//! 1. every shard takes a checkpoint and is *pinned*: it takes no further
//!    checkpoint, so nothing is retired (no snapshot, WAL segment or value
//!    segment is removed or recycled) until the backup ends;
//! 2. once every shard is pinned, each is asked for its *cut*: its last
//!    LSN, made durable, with the list of its WAL segments and its WAL head;
//! 3. the files are copied (snapshots and sealed value segments hard-linked
//!    where the file system allows: neither is ever written again; WAL
//!    segments and the active value segment copied, the latter only up to
//!    its written blocks), each copied WAL segment cut after its last
//!    complete flush (bytes a flush in progress left are zeroed);
//! 4. `BACKUP` (a summary) and then the manifest are written; the
//!    `BACKUP-IN-PROGRESS` marker made at the start is removed last.
//!
//! What must hold: a multi-shard transaction is whole or absent in the
//! copy. Its parts are logged on every participant before any of it is
//! applied, so a part found in any shard's snapshot has all its parts
//! logged before step 2 began, below every cut; recovery applies a part
//! beyond a snapshot only when every participant's copy holds its own
//! (`crate::txn::recovery`), and the pinned WAL reaches back as far as the
//! live one, which keeps what that decision needs. A directory with the
//! marker, or without the manifest, is refused by a start and by verify.

use crate::engine::Handle;
use crate::error::IoFailure;
use crate::inspect::OverlayDisk;
use crate::io::Disk;
use crate::layout::ShardPaths;
use crate::manifest;
use crate::shard::backup::{unix_now, BackupRequest, Cut, Pinned};
use crate::shard::router::ShardMsg;
use crate::tier::config::TierDirs;
use crate::wal::head::{with_mark_at_most, HEAD_FILE};
use crate::wal::reader::{scan_flush, FileWindow, FlushScan, SegmentIdentity};
use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

pub use crate::layout::BACKUP_MARKER;
/// The summary a finished backup holds (text, one `key value` per line).
pub const BACKUP_SUMMARY: &str = "BACKUP";
/// Bytes copied per read and write.
const COPY_CHUNK: usize = 1 << 20;

/// Why a backup or a checkpoint of every shard failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BackupError {
    #[error("a backup is already running")]
    Busy,
    #[error(
        "the server keeps no files (storage.durability = \"none\"): there is nothing to back up"
    )]
    NoFiles,
    #[error("{path}: {reason}")]
    Target { path: PathBuf, reason: String },
    #[error("shard {shard}: {reason}")]
    Shard { shard: usize, reason: String },
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        source: io::Error,
    },
}

impl IoFailure for BackupError {
    fn from_io(op: &'static str, path: PathBuf, _offset: u64, source: io::Error) -> Self {
        BackupError::Io { op, path, source }
    }
}

/// What a backup is told.
#[derive(Debug, Clone)]
pub struct BackupOptions {
    /// The directory to write; it must not exist, or be empty.
    pub dest: PathBuf,
    /// Most bytes per second copied (0: no limit). Hard links cost none.
    pub rate_bytes_per_sec: u64,
}

/// How far a backup is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BackupProgress {
    pub files: u64,
    /// Bytes the copy holds (linked files count their size).
    pub bytes: u64,
    /// Files hard-linked instead of copied.
    pub linked: u64,
    pub files_total: u64,
}

/// One shard in a finished backup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardCutReport {
    pub shard: usize,
    /// The newest snapshot copied (none on a shard that never wrote one).
    pub snapshot_lsn: Option<u64>,
    /// The LSN every record at or below is in the copy (at least the cut).
    pub last_lsn: u64,
}

/// A finished backup.
#[derive(Debug, Clone)]
pub struct BackupReport {
    pub dest: PathBuf,
    pub progress: BackupProgress,
    pub shards: Vec<ShardCutReport>,
    pub duration: Duration,
    /// Unix seconds at the end.
    pub finished_unix: u64,
}

/// The engine's record of backups and checkpoints of every shard (for
/// `LASTSAVE` and INFO's persistence fields).
#[derive(Debug, Default)]
pub struct SaveStatus {
    pub in_progress: bool,
    /// Unix seconds of the last finished one (the engine's open before any).
    pub last_save_unix: u64,
    /// Whether the last one finished without error.
    pub last_ok: bool,
    /// The running (or last) online backup's progress: files copied or
    /// linked so far, the files it will hold, and the bytes (all 0 before
    /// the first backup; a BGSAVE copies nothing).
    pub backup_files: u64,
    pub backup_files_total: u64,
    pub backup_bytes: u64,
}

/// Holds the "running" flag; records the outcome and lets the shards go.
struct Running<'a> {
    handle: &'a Handle,
    pinned: Vec<usize>,
    ok: bool,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        for &shard in &self.pinned {
            let _ = self.handle.shared.inboxes[shard].send(ShardMsg::Backup(BackupRequest::Unpin));
        }
        let b = &self.handle.shared.backup;
        b.last_failed.store(!self.ok, Ordering::Relaxed);
        if self.ok {
            b.last_save_unix.store(unix_now(), Ordering::Relaxed);
        }
        b.running.store(false, Ordering::Release);
    }
}

impl Handle {
    /// Where backups and `BGSAVE` stand.
    pub fn save_status(&self) -> SaveStatus {
        let b = &self.shared.backup;
        SaveStatus {
            in_progress: b.running.load(Ordering::Acquire),
            last_save_unix: b.last_save_unix.load(Ordering::Relaxed),
            last_ok: !b.last_failed.load(Ordering::Relaxed),
            backup_files: b.files.load(Ordering::Relaxed),
            backup_files_total: b.files_total.load(Ordering::Relaxed),
            backup_bytes: b.bytes.load(Ordering::Relaxed),
        }
    }

    /// Whether the engine keeps files to back up (`durability` is not
    /// `none`).
    pub fn keeps_files(&self) -> bool {
        !self.shared.backup.paths.is_empty()
    }

    fn start_running(&self) -> Result<Running<'_>, BackupError> {
        if self.shared.backup.paths.is_empty() {
            return Err(BackupError::NoFiles);
        }
        if self
            .shared
            .backup
            .running
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return Err(BackupError::Busy);
        }
        Ok(Running {
            handle: self,
            pinned: Vec::new(),
            ok: false,
        })
    }

    /// Asks every shard for a checkpoint (with `pin`, held until the
    /// backup ends); returns what each one keeps.
    fn checkpoint_shards(
        &self,
        run: &mut Running<'_>,
        pin: bool,
    ) -> Result<Vec<Pinned>, BackupError> {
        let mut waits = Vec::new();
        for (shard, inbox) in self.shared.inboxes.iter().enumerate() {
            let (reply, rx) = flume::bounded(1);
            inbox
                .send(ShardMsg::Backup(BackupRequest::Checkpoint { pin, reply }))
                .map_err(|_| shard_gone(shard))?;
            waits.push((shard, rx));
        }
        let mut out = Vec::new();
        let mut first_error = None;
        for (shard, rx) in waits {
            match rx.recv() {
                Ok(Ok(p)) => {
                    if pin {
                        run.pinned.push(shard);
                    }
                    out.push(p);
                }
                Ok(Err(reason)) => {
                    first_error.get_or_insert(BackupError::Shard { shard, reason });
                }
                Err(_) => {
                    first_error.get_or_insert(shard_gone(shard));
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }

    /// Takes a checkpoint on every shard now (`BGSAVE`); blocking, call it
    /// off the shard threads. Refused while a backup runs.
    pub fn checkpoint_all(&self) -> Result<(), BackupError> {
        let mut run = self.start_running()?;
        self.checkpoint_shards(&mut run, false)?;
        run.ok = true;
        Ok(())
    }

    /// Writes a backup into `opts.dest` (see the module doc); blocking, call
    /// it off the shard threads. `progress` is called after each file.
    pub fn backup(
        &self,
        opts: &BackupOptions,
        progress: &mut dyn FnMut(&BackupProgress),
    ) -> Result<BackupReport, BackupError> {
        let started = Instant::now();
        let mut run = self.start_running()?;
        for counter in [
            &self.shared.backup.files,
            &self.shared.backup.files_total,
            &self.shared.backup.bytes,
        ] {
            counter.store(0, Ordering::Relaxed);
        }
        let dest = &opts.dest;
        prepare_dest(dest, &self.shared.backup.data_dir)?;
        let marker = dest.join(BACKUP_MARKER);
        write_file(&marker, b"an online backup is being written here; until this file is gone the copy is incomplete\n")?;
        sync_dir(dest)?;
        let pinned = self.checkpoint_shards(&mut run, true)?;
        let cuts = self.cuts()?;
        let mut copier = Copier::new(opts.rate_bytes_per_sec);
        copier.progress.files_total = pinned
            .iter()
            .zip(&cuts)
            .map(|(p, c)| (p.snapshots.len() + p.tier_files.len() + c.segments.len() + 1) as u64)
            .sum();
        let shared = &self.shared.backup;
        shared
            .files_total
            .store(copier.progress.files_total, Ordering::Relaxed);
        // Every step is published for STATS before the caller hears of it.
        let progress = &mut |p: &BackupProgress| {
            shared.files.store(p.files, Ordering::Relaxed);
            shared.bytes.store(p.bytes, Ordering::Relaxed);
            progress(p);
        };
        let mut shards = Vec::new();
        for (shard, (pin, cut)) in pinned.iter().zip(&cuts).enumerate() {
            let src = &self.shared.backup.paths[shard];
            let to = ShardPaths::new(dest, shard);
            let last_lsn = copy_shard(
                &mut copier,
                src,
                &to,
                pin,
                cut,
                self.shared.backup.tier_dirs,
                progress,
            )?;
            shards.push(ShardCutReport {
                shard,
                snapshot_lsn: pin.snapshots.last().map(|s| s.lsn),
                last_lsn,
            });
        }
        // A file copied after the last progress call counts too.
        shared.files.store(copier.progress.files, Ordering::Relaxed);
        shared.bytes.store(copier.progress.bytes, Ordering::Relaxed);
        let finished_unix = unix_now();
        let mut summary = format!(
            "ringkv backup\nfinished_unix {finished_unix}\nshards {}\nfiles {}\nbytes {}\n",
            shards.len(),
            copier.progress.files,
            copier.progress.bytes
        );
        for s in &shards {
            summary.push_str(&format!(
                "shard {} snapshot_lsn {} last_lsn {}\n",
                s.shard,
                s.snapshot_lsn.unwrap_or(0),
                s.last_lsn
            ));
        }
        write_file(&dest.join(BACKUP_SUMMARY), summary.as_bytes())?;
        // The manifest last: without it no server starts on the copy.
        let src_manifest = manifest::manifest_path(&self.shared.backup.data_dir);
        let bytes = std::fs::read(&src_manifest).map_err(BackupError::io("read", &src_manifest))?;
        let dst_manifest = manifest::manifest_path(dest);
        let tmp = dst_manifest.with_extension("tmp");
        write_file(&tmp, &bytes)?;
        std::fs::rename(&tmp, &dst_manifest).map_err(BackupError::io("rename", &tmp))?;
        sync_dir(dest)?;
        std::fs::remove_file(&marker).map_err(BackupError::io("remove", &marker))?;
        sync_dir(dest)?;
        run.ok = true;
        drop(run);
        Ok(BackupReport {
            dest: dest.clone(),
            progress: copier.progress,
            shards,
            duration: started.elapsed(),
            finished_unix,
        })
    }

    /// Every pinned shard's cut.
    fn cuts(&self) -> Result<Vec<Cut>, BackupError> {
        let mut waits = Vec::new();
        for (shard, inbox) in self.shared.inboxes.iter().enumerate() {
            let (reply, rx) = flume::bounded(1);
            inbox
                .send(ShardMsg::Backup(BackupRequest::Cut { reply }))
                .map_err(|_| shard_gone(shard))?;
            waits.push((shard, rx));
        }
        waits
            .into_iter()
            .map(|(shard, rx)| match rx.recv() {
                Ok(Ok(c)) => Ok(c),
                Ok(Err(reason)) => Err(BackupError::Shard { shard, reason }),
                Err(_) => Err(shard_gone(shard)),
            })
            .collect()
    }
}

fn shard_gone(shard: usize) -> BackupError {
    BackupError::Shard {
        shard,
        reason: "the shard has stopped".into(),
    }
}

/// The target must be new or empty, and not the data directory.
fn prepare_dest(dest: &Path, data_dir: &Path) -> Result<(), BackupError> {
    let target = |reason: &str| BackupError::Target {
        path: dest.to_path_buf(),
        reason: reason.to_string(),
    };
    if dest.exists() {
        let mut entries =
            std::fs::read_dir(dest).map_err(BackupError::io("read directory", dest))?;
        if entries.next().is_some() {
            return Err(target("the backup directory must not exist or be empty"));
        }
    }
    std::fs::create_dir_all(dest).map_err(BackupError::io("create directory", dest))?;
    let same = |a: &Path, b: &Path| match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    if same(dest, data_dir) {
        return Err(target("the backup directory is the data directory"));
    }
    Ok(())
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<(), BackupError> {
    let mut f = File::create(path).map_err(BackupError::io("create", path))?;
    f.write_all(bytes).map_err(BackupError::io("write", path))?;
    f.sync_data().map_err(BackupError::io("fdatasync", path))
}

fn sync_dir(dir: &Path) -> Result<(), BackupError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(BackupError::io("fsync directory", dir))
}

/// Copies (or links) files, counting, at a bounded rate.
struct Copier {
    progress: BackupProgress,
    rate: u64,
    started: Instant,
    copied: u64,
    buf: Vec<u8>,
}

impl Copier {
    fn new(rate: u64) -> Copier {
        Copier {
            progress: BackupProgress::default(),
            rate,
            started: Instant::now(),
            copied: 0,
            buf: vec![0; COPY_CHUNK],
        }
    }

    /// Hard-links `src` at `dst` (a file never written again), or copies it
    /// where the file system cannot (another device).
    fn link_or_copy(&mut self, src: &Path, dst: &Path) -> Result<(), BackupError> {
        if std::fs::hard_link(src, dst).is_ok() {
            let len = std::fs::metadata(dst).map_or(0, |m| m.len());
            self.progress.files += 1;
            self.progress.linked += 1;
            self.progress.bytes += len;
            return Ok(());
        }
        self.copy(src, dst, u64::MAX)
    }

    /// Copies the first `limit` bytes of `src` to `dst` and makes them
    /// durable.
    fn copy(&mut self, src: &Path, dst: &Path, limit: u64) -> Result<(), BackupError> {
        let mut from = File::open(src).map_err(BackupError::io("open", src))?;
        let mut to = File::create(dst).map_err(BackupError::io("create", dst))?;
        let mut left = limit;
        while left > 0 {
            let want = (self.buf.len() as u64).min(left) as usize;
            let n = match from.read(&mut self.buf[..want]) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(BackupError::io("read", src)(e)),
            };
            to.write_all(&self.buf[..n])
                .map_err(BackupError::io("write", dst))?;
            left -= n as u64;
            self.progress.bytes += n as u64;
            self.copied += n as u64;
            self.pace();
        }
        to.sync_data().map_err(BackupError::io("fdatasync", dst))?;
        self.progress.files += 1;
        Ok(())
    }

    /// Sleeps while the copy runs ahead of the rate.
    fn pace(&self) {
        if self.rate == 0 {
            return;
        }
        let due = Duration::from_secs_f64(self.copied as f64 / self.rate as f64);
        let elapsed = self.started.elapsed();
        if due > elapsed {
            std::thread::sleep(due - elapsed);
        }
    }
}

/// Copies one shard; returns the last LSN its copied WAL holds.
fn copy_shard(
    copier: &mut Copier,
    src: &ShardPaths,
    to: &ShardPaths,
    pin: &Pinned,
    cut: &Cut,
    tier_dirs: TierDirs,
    progress: &mut dyn FnMut(&BackupProgress),
) -> Result<u64, BackupError> {
    for dir in [&to.wal_dir, &to.snapshot_dir]
        .into_iter()
        .chain(tier_dirs.of(to))
    {
        std::fs::create_dir_all(dir).map_err(BackupError::io("create directory", dir))?;
    }
    for snap in &pin.snapshots {
        copier.link_or_copy(&snap.path, &to.snapshot(snap.lsn))?;
        progress(&copier.progress);
    }
    for file in &pin.tier_files {
        let Some(name) = file.path.file_name() else {
            continue;
        };
        let dst = to.values_dir.join(name);
        if file.sealed {
            copier.link_or_copy(&file.path, &dst)?;
        } else {
            copier.copy(&file.path, &dst, file.bytes)?;
        }
        progress(&copier.progress);
    }
    // WAL segments in order; the copy ends after the last complete flush.
    // A segment none of whose flushes continues the LSNs (one a flush in
    // progress was just opening) is left out, and so is every one after.
    let mut last_lsn = None;
    for (path, seq) in &cut.segments {
        let dst = to.segment(*seq);
        // Only the flushes (segments are made full-size in advance: a
        // 64 MiB file may hold a few KiB); the copy is then grown to the
        // file's size, the rest a hole that reads as zeroes, as recovery
        // expects of a used segment.
        let (used, _, file_len) = flush_end(path, src.shard as u32, *seq, last_lsn)?;
        copier.copy(path, &dst, used)?;
        grow(&dst, file_len)?;
        match trim_segment(&dst, src.shard as u32, *seq, last_lsn)? {
            Some(last) => last_lsn = Some(last),
            None => {
                std::fs::remove_file(&dst).map_err(BackupError::io("remove", &dst))?;
                break;
            }
        }
        progress(&copier.progress);
    }
    let last_lsn = last_lsn.unwrap_or(0);
    if last_lsn < cut.lsn {
        return Err(BackupError::Shard {
            shard: src.shard,
            reason: format!(
                "the copied WAL ends at LSN {last_lsn}, before the cut at {} (a WAL segment changed while it was copied)",
                cut.lsn
            ),
        });
    }
    if let Some(head) = &cut.head {
        // The head was read before the copy, so its durable mark is at or
        // below what the copy holds; clamping it says so even if a flush
        // the mark covered were ever left out of the copy.
        let head =
            with_mark_at_most(head, src.shard as u32, last_lsn).unwrap_or_else(|| head.clone());
        write_file(&to.dir.join(HEAD_FILE), &head)?;
        copier.progress.files += 1;
    }
    for dir in [&to.wal_dir, &to.snapshot_dir, &to.dir]
        .into_iter()
        .chain(tier_dirs.of(to))
    {
        sync_dir(dir)?;
    }
    if let Some(parent) = to.dir.parent() {
        sync_dir(parent)?;
    }
    Ok(last_lsn)
}

/// Reads a copied WAL segment's flushes as recovery does and zeroes what
/// follows the last complete one that continues the LSNs (bytes of a flush
/// still being written, stale bytes of a recycled file). Returns the last
/// LSN it holds, `None` if no flush continues `prev_lsn`.
fn trim_segment(
    path: &Path,
    shard: u32,
    seq: u64,
    prev_lsn: Option<u64>,
) -> Result<Option<u64>, BackupError> {
    let (end, last, file_len) = flush_end(path, shard, seq, prev_lsn)?;
    if last.is_some() && end < file_len {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .map_err(BackupError::io("open", path))?;
        // Cut and grow back: the rest reads as zeroes, "never written".
        f.set_len(end).map_err(BackupError::io("truncate", path))?;
        f.set_len(file_len)
            .map_err(BackupError::io("truncate", path))?;
        f.sync_all().map_err(BackupError::io("fsync", path))?;
    }
    Ok(last)
}

/// Makes the copy at `path` `len` bytes long (a hole after what was
/// copied), durably.
fn grow(path: &Path, len: u64) -> Result<(), BackupError> {
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(BackupError::io("open", path))?;
    if f.metadata().map_err(BackupError::io("stat", path))?.len() < len {
        f.set_len(len).map_err(BackupError::io("truncate", path))?;
        f.sync_all().map_err(BackupError::io("fsync", path))?;
    }
    Ok(())
}

/// Scans a WAL segment's flushes as recovery does: returns the end of the
/// last complete one that continues `prev_lsn`, its last LSN (`None`: no
/// flush continues it), and the file's length.
fn flush_end(
    path: &Path,
    shard: u32,
    seq: u64,
    prev_lsn: Option<u64>,
) -> Result<(u64, Option<u64>, u64), BackupError> {
    let disk = OverlayDisk::new();
    pollster::block_on(async {
        let file = disk.open(path, false).await?;
        let mut win = FileWindow::new(&file, path).await?;
        let identity = SegmentIdentity { shard, seq };
        let mut pos = 0u64;
        let mut last: Option<u64> = None;
        while let FlushScan::Complete(info) = scan_flush(&mut win, pos, identity).await? {
            if last.or(prev_lsn).is_some_and(|l| info.first_lsn != l + 1) {
                break;
            }
            last = Some(info.last_lsn);
            pos = info.end;
        }
        io::Result::Ok((pos, last, win.file_len()))
    })
    .map_err(BackupError::io("read", path))
}
