//! The engine's window on disks: a small async trait ([`Disk`], [`DiskFile`])
//! and the 4 KiB-aligned buffers that O_DIRECT needs.
//!
//! Backends:
//! - [`real`]: files opened with O_DIRECT on a compio runtime whose driver is
//!   io_uring, or readiness polling with a blocking thread pool where the
//!   kernel refuses io_uring (see [`runtime`]).
//! - [`sim`]: an in-memory disk for tests with separate written and durable
//!   images, driven by a seed, with fault injection.
//! - [`throttle`]: wraps any backend in a device with a disk profile (token
//!   buckets for IOPS, burst credit and bandwidth) and per-device metrics.
//!
//! All futures here are `!Send`: a file belongs to the shard thread that
//! opened it. A `Disk` itself is `Clone + Send + Sync` so one value can be
//! handed to every shard thread.
//!
//! Blocking variants: `open`, `remove_file`, `sync_dir`, `read_at`,
//! `write_at` and `sync_data` also come as `*_blocking` methods for
//! synchronous code running on a shard thread. They block the calling thread
//! (no other task of the shard runs meanwhile) and need no compio runtime,
//! but otherwise behave exactly like their async twins on every backend: the
//! same alignment rules and error messages, the same simulated crash and
//! fault model (countdowns and unsynced-write bookkeeping are shared, so a
//! file may freely mix the two kinds of call), and on a throttled disk the
//! same token buckets and device metrics (an admission delay is slept on the
//! thread instead of awaited on the timer).

mod buf;
pub mod real;
pub mod runtime;
pub mod sim;
pub mod throttle;
pub mod window;

pub use buf::{AlignedBuf, ALIGN};

use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};

/// Hands the I/O that futures polled on this thread have queued (io_uring
/// submission entries) to the kernel now, instead of at the thread's next
/// wait, so that a read started ahead of time runs while the thread
/// computes. Does nothing outside a compio runtime.
pub fn submit_queued() {
    let _ = compio::runtime::Runtime::try_with_current(|runtime| {
        // `flush` clears the driver's "woken by another thread" mark and
        // reports it; set it again, or the next wait could sleep through
        // that wake-up.
        if runtime.flush() {
            runtime.waker().wake();
        }
    });
}

/// A directory tree on one backend. Paths are absolute or relative to the
/// process's working directory, exactly as for `std::fs`.
pub trait Disk: Clone + Send + Sync + 'static {
    type File: DiskFile;

    /// Opens a file for reading and writing (O_DIRECT on real disks),
    /// creating it when `create` is true.
    fn open(&self, path: &Path, create: bool) -> impl Future<Output = io::Result<Self::File>>;

    /// Removes a file. The removal is durable after `sync_dir` of its parent.
    fn remove_file(&self, path: &Path) -> impl Future<Output = io::Result<()>>;

    /// Renames a file atomically. Durable after `sync_dir` of the parent.
    fn rename(&self, from: &Path, to: &Path) -> impl Future<Output = io::Result<()>>;

    /// Makes creations, removals and renames in `dir` durable.
    fn sync_dir(&self, dir: &Path) -> impl Future<Output = io::Result<()>>;

    /// Blocking `open` (O_DIRECT on real disks), for synchronous callers on a shard thread.
    fn open_blocking(&self, path: &Path, create: bool) -> io::Result<Self::File>;

    /// Blocking `remove_file`.
    fn remove_file_blocking(&self, path: &Path) -> io::Result<()>;

    /// Blocking `sync_dir`.
    fn sync_dir_blocking(&self, dir: &Path) -> io::Result<()>;

    /// Creates a directory and its parents (durably on the sim disk).
    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;

    /// The files (not directories) directly inside `dir`, sorted by name.
    fn list_dir(&self, dir: &Path) -> io::Result<Vec<PathBuf>>;

    /// Whether a file or directory exists at `path`.
    fn exists(&self, path: &Path) -> bool;

    /// The table hash key of a data directory created on this disk:
    /// random ([`crate::hash::random_key`]); the sim disk derives it from
    /// its seed, so that a seed replays the same run.
    fn new_table_hash_key(&self) -> io::Result<[u8; crate::hash::TABLE_HASH_KEY_BYTES]> {
        crate::hash::random_key()
    }

    /// The identity of a data directory created on this disk
    /// ([`crate::layout::DirId`]): random and nonzero; the sim disk derives
    /// it from its seed, so that a seed replays the same run.
    fn new_dir_id(&self) -> io::Result<crate::layout::DirId> {
        loop {
            let key = crate::hash::random_key()?;
            let id = u64::from_le_bytes([
                key[0], key[1], key[2], key[3], key[4], key[5], key[6], key[7],
            ]);
            if id != 0 {
                return Ok(id);
            }
        }
    }

    /// How long until an I/O of `len` bytes that moves records from one
    /// device to another fits the share of this disk's device kept for
    /// such moves (`storage.hot_move_percent`); zero when it fits now.
    /// Takes nothing. A disk without a device profile never waits.
    fn move_wait(&self, _len: u64) -> std::time::Duration {
        std::time::Duration::ZERO
    }

    /// Counts an I/O of `len` bytes that moves records against that share.
    fn take_move(&self, _len: u64) {}
}

/// One open file. Offsets and lengths of `write_at` and `read_at` must be
/// multiples of [`ALIGN`]; buffers come from [`AlignedBuf`].
#[allow(clippy::len_without_is_empty)]
pub trait DiskFile: 'static {
    /// Writes all of `buf[..buf.len()]` at `offset`.
    fn write_at(
        &self,
        buf: AlignedBuf,
        offset: u64,
    ) -> impl Future<Output = (io::Result<()>, AlignedBuf)>;

    /// Reads up to `buf.capacity()` bytes at `offset` into `buf`, setting
    /// `buf.len()` to the count read (short only at end of file).
    fn read_at(
        &self,
        buf: AlignedBuf,
        offset: u64,
    ) -> impl Future<Output = (io::Result<usize>, AlignedBuf)>;

    /// Writes all of `buf` at `offset` and returns once it is durable, as
    /// `write_at` followed by `sync_data` would, and on the same terms: after
    /// an error nothing is known about data not yet synced, and it must not
    /// be retried. Only this write is made durable; writes made earlier
    /// through this file without a `sync_data` may not be. The real disk
    /// writes through a second descriptor opened `O_DSYNC`: one operation,
    /// no separate fdatasync and no thread hand-off for it.
    fn write_at_durable(
        &self,
        buf: AlignedBuf,
        offset: u64,
    ) -> impl Future<Output = (io::Result<()>, AlignedBuf)> {
        write_then_sync(self, buf, offset)
    }

    /// fdatasync: every completed write is durable when this returns Ok.
    /// After an error nothing is known about unsynced data; callers must not
    /// retry (the shard is poisoned instead).
    fn sync_data(&self) -> impl Future<Output = io::Result<()>>;

    /// Extends the file to `len` bytes (never shrinks) with zeroes actually
    /// written, so later overwrites do not have to allocate blocks or
    /// convert unwritten extents. Durable after `sync_data`.
    fn allocate_zeroed(&self, len: u64) -> impl Future<Output = io::Result<()>>;

    /// Sets the file length (shrinks or extends with a hole).
    fn set_len(&self, len: u64) -> impl Future<Output = io::Result<()>>;

    /// Current length in bytes.
    fn len(&self) -> impl Future<Output = io::Result<u64>>;

    /// Blocking `read_at`: reads up to `buf.capacity()` bytes at `offset`, sets `buf.len()` (short only at EOF).
    fn read_at_blocking(&self, buf: &mut AlignedBuf, offset: u64) -> io::Result<usize>;

    /// Blocking `write_at` of all of `buf[..buf.len()]`.
    fn write_at_blocking(&self, buf: &AlignedBuf, offset: u64) -> io::Result<()>;

    /// Blocking `sync_data` (fdatasync).
    fn sync_data_blocking(&self) -> io::Result<()>;
}

/// `write_at` and then `sync_data`: what [`DiskFile::write_at_durable`]
/// does where a file has no single durable write.
pub(crate) async fn write_then_sync<F: DiskFile + ?Sized>(
    file: &F,
    buf: AlignedBuf,
    offset: u64,
) -> (io::Result<()>, AlignedBuf) {
    let (result, buf) = file.write_at(buf, offset).await;
    if result.is_err() {
        return (result, buf);
    }
    (file.sync_data().await, buf)
}
