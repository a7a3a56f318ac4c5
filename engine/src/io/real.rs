//! The production disk: files opened with O_DIRECT | O_CLOEXEC through
//! compio, on whichever driver the shard's runtime uses (io_uring, or the
//! polling fallback's blocking thread pool).
//!
//! What must hold: every data write bypasses the page cache (O_DIRECT), so a
//! completed `sync_data` (fdatasync) means the bytes are on the device;
//! offsets and lengths are checked against [`ALIGN`] before submission;
//! `allocate_zeroed` writes real zeroes, so later overwrites neither allocate
//! blocks nor convert unwritten extents; a new directory is durable when
//! `create_dir_all` returns; every error names the operation and the path.
//!
//! The blocking variants (`*_blocking`) make plain positional system calls
//! (pread, pwrite, fdatasync) on the same descriptor a [`RealFile`] holds for
//! compio, so one file serves both kinds of call. Both kinds share the
//! alignment checks, the open flags, the retry loops (`WriteAll`,
//! `ReadFill`) and the error context; only the system call differs.

use super::{AlignedBuf, Disk, DiskFile, ALIGN};
use compio::buf::{BufResult, IntoInner, IoBuf, IoBufMut, SetLen};
use compio::driver::op::{ReadAt, WriteAt};
use compio::driver::ToSharedFd;
use std::fmt;
use std::io;
use std::mem::{ManuallyDrop, MaybeUninit};
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Largest single write `allocate_zeroed` issues.
pub const ZERO_FILL_CHUNK_BYTES: usize = 1 << 20;

const _: () = assert!(ZERO_FILL_CHUNK_BYTES.is_multiple_of(ALIGN));

// compio buffer traits for AlignedBuf. The allocation never moves while the
// buffer is owned by an operation (it is a heap pointer), which is what
// completion-based I/O needs.

impl IoBuf for AlignedBuf {
    fn as_init(&self) -> &[u8] {
        self.as_slice()
    }
}

impl SetLen for AlignedBuf {
    // SAFETY: the trait asks that the first `len` bytes be initialised and
    // `len` be within capacity; `AlignedBuf` is zero-filled at allocation, so
    // every byte is always initialised, and its own `set_len` asserts
    // `len <= capacity`.
    unsafe fn set_len(&mut self, len: usize) {
        AlignedBuf::set_len(self, len);
    }
}

impl IoBufMut for AlignedBuf {
    fn as_uninit(&mut self) -> &mut [MaybeUninit<u8>] {
        let spare = self.spare_mut();
        let len = spare.len();
        // SAFETY: `spare` is a valid, initialised &mut [u8] for the whole
        // capacity; MaybeUninit<u8> has the same layout, and writing any
        // byte through it keeps the memory initialised.
        unsafe { std::slice::from_raw_parts_mut(spare.as_mut_ptr().cast(), len) }
    }
}

/// An I/O error with the operation, path and (when relevant) offset and
/// length. Carried inside the `io::Error` returned by this backend, with the
/// same `ErrorKind` and the OS error as its source.
#[derive(Debug)]
#[non_exhaustive]
pub struct RealIoError {
    pub op: &'static str,
    pub path: PathBuf,
    /// The second path of a two-path operation (the target of a rename).
    pub target: Option<PathBuf>,
    pub offset: Option<u64>,
    pub len: Option<u64>,
    pub source: io::Error,
}

impl fmt::Display for RealIoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.op, self.path.display())?;
        if let Some(target) = &self.target {
            write!(f, " -> {}", target.display())?;
        }
        match (self.offset, self.len) {
            (Some(offset), Some(len)) => write!(f, " (offset {offset}, {len} bytes)")?,
            (None, Some(len)) => write!(f, " ({len} bytes)")?,
            (Some(offset), None) => write!(f, " (offset {offset})")?,
            (None, None) => {}
        }
        write!(f, ": {}", self.source)
    }
}

impl std::error::Error for RealIoError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// The OS error number behind an error of this backend (or any plain
/// `io::Error`), looking through the context wrapper.
pub fn raw_os_error(err: &io::Error) -> Option<i32> {
    err.raw_os_error().or_else(|| {
        err.get_ref()
            .and_then(|inner| inner.downcast_ref::<RealIoError>())
            .and_then(|ctx| ctx.source.raw_os_error())
    })
}

fn context(
    source: io::Error,
    op: &'static str,
    path: &Path,
    offset: Option<u64>,
    len: Option<u64>,
) -> io::Error {
    io::Error::new(
        source.kind(),
        RealIoError {
            op,
            path: path.to_path_buf(),
            target: None,
            offset,
            len,
            source,
        },
    )
}

fn misaligned(op: &'static str, path: &Path, offset: u64, len: u64) -> io::Error {
    context(
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("offset and length must be multiples of {ALIGN} for O_DIRECT"),
        ),
        op,
        path,
        Some(offset),
        Some(len),
    )
}

fn is_aligned(n: u64) -> bool {
    n.is_multiple_of(ALIGN as u64)
}

/// Flags every data file is opened with, by `open` and `open_blocking` alike.
const DATA_FILE_FLAGS: i32 = libc::O_DIRECT | libc::O_CLOEXEC;

/// Flags of the directory handle that `sync_dir` fsyncs.
const DIR_FLAGS: i32 = libc::O_DIRECTORY | libc::O_CLOEXEC;

/// The error of a failed data-file open. EINVAL there almost always means
/// the file system refuses O_DIRECT; say so, since the engine cannot work
/// around it (every write must bypass the page cache).
fn open_failed(err: io::Error, path: &Path) -> io::Error {
    let op = if err.raw_os_error() == Some(libc::EINVAL) {
        "open with O_DIRECT (does this file system support O_DIRECT? tmpfs before \
         Linux 6.6 and some FUSE/overlay file systems do not)"
    } else {
        "open"
    };
    context(err, op, path, None, None)
}

fn remove_failed(err: io::Error, path: &Path) -> io::Error {
    context(err, "remove_file", path, None, None)
}

fn dir_open_failed(err: io::Error, dir: &Path) -> io::Error {
    context(err, "open directory for fsync", dir, None, None)
}

fn dir_sync_failed(err: io::Error, dir: &Path) -> io::Error {
    context(err, "fsync directory", dir, None, None)
}

/// A positional write of `total` bytes at `offset` that may take several
/// system calls: short writes continue where they stopped, EINTR retries,
/// a zero-byte write or any other error ends it with the path and offset in
/// the message. The async path (compio `WriteAt`) and the blocking path
/// (pwrite) drive the same value, so they cannot disagree on any of this.
struct WriteAll<'a> {
    path: &'a Path,
    offset: u64,
    total: usize,
    done: usize,
}

impl<'a> WriteAll<'a> {
    fn new(path: &'a Path, offset: u64, total: usize) -> Self {
        WriteAll {
            path,
            offset,
            total,
            done: 0,
        }
    }

    /// Where the next system call writes: the file offset, and the index in
    /// the buffer it starts from. `None` once everything is written.
    fn next(&self) -> Option<(u64, usize)> {
        (self.done < self.total).then(|| (self.offset + self.done as u64, self.done))
    }

    /// Takes the outcome of the system call `next` asked for.
    fn record(&mut self, result: io::Result<usize>) -> io::Result<()> {
        let at = self.offset + self.done as u64;
        let fail = |err| {
            context(
                err,
                "write_at",
                self.path,
                Some(at),
                Some(self.total as u64),
            )
        };
        match result {
            Ok(0) => Err(fail(io::Error::new(
                io::ErrorKind::WriteZero,
                "write returned 0 bytes",
            ))),
            Ok(n) => {
                self.done += n;
                Ok(())
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(()),
            Err(e) => Err(fail(e)),
        }
    }
}

/// A positional read of up to `capacity` bytes at `offset`. A regular file
/// read is short only at end of file, but after a short *aligned* read it
/// asks again to be sure (signals, odd file systems); an empty or unaligned
/// read marks the end. EINTR retries. Shared by the async and blocking
/// paths like `WriteAll`.
struct ReadFill<'a> {
    path: &'a Path,
    offset: u64,
    capacity: usize,
    done: usize,
    at_eof: bool,
}

impl<'a> ReadFill<'a> {
    fn new(path: &'a Path, offset: u64, capacity: usize) -> Self {
        ReadFill {
            path,
            offset,
            capacity,
            done: 0,
            at_eof: false,
        }
    }

    /// Where the next system call reads: the file offset, and the index in
    /// the buffer it fills from. `None` once the buffer is full or at EOF.
    fn next(&self) -> Option<(u64, usize)> {
        (!self.at_eof && self.done < self.capacity)
            .then(|| (self.offset + self.done as u64, self.done))
    }

    /// Takes the outcome of the system call `next` asked for; `done` is
    /// then the buffer's length.
    fn record(&mut self, result: io::Result<usize>) -> io::Result<()> {
        match result {
            Ok(0) => self.at_eof = true,
            Ok(n) => {
                self.done += n;
                // An unaligned tail is the end of the file.
                self.at_eof = !is_aligned(n as u64);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                let at = self.offset + self.done as u64;
                let len = Some(self.capacity as u64);
                return Err(context(e, "read_at", self.path, Some(at), len));
            }
        }
        Ok(())
    }
}

/// The real file system. Stateless: every shard may hold a clone.
#[derive(Clone, Copy, Debug, Default)]
pub struct RealDisk;

/// A file opened with O_DIRECT on the current compio runtime.
#[derive(Debug)]
pub struct RealFile {
    file: compio::fs::File,
    path: PathBuf,
    /// A second descriptor of the same file opened `O_DSYNC`, for
    /// `write_at_durable`; opened on first use (`None`: it could not be
    /// opened, and durable writes are a write and an fdatasync).
    dsync: std::cell::OnceCell<Option<compio::fs::File>>,
}

impl RealFile {
    /// The path the file was opened with.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes all of `buf` at `offset`, continuing after short writes.
    async fn write_all_at(&self, buf: AlignedBuf, offset: u64) -> (io::Result<()>, AlignedBuf) {
        self.write_all_through(&self.file, buf, offset).await
    }

    /// Writes all of `buf` at `offset` through `file` (this file's own
    /// descriptor or its `O_DSYNC` twin).
    async fn write_all_through(
        &self,
        file: &compio::fs::File,
        buf: AlignedBuf,
        offset: u64,
    ) -> (io::Result<()>, AlignedBuf) {
        let mut progress = WriteAll::new(&self.path, offset, buf.len());
        let mut buf = buf;
        while let Some((at, from)) = progress.next() {
            let op = WriteAt::new(file.to_shared_fd(), at, buf.slice(from..));
            let BufResult(result, slice) = compio::runtime::submit(op).await.into_inner();
            buf = slice.into_inner();
            if let Err(err) = progress.record(result) {
                return (Err(err), buf);
            }
        }
        (Ok(()), buf)
    }

    /// Runs `f` on the file's descriptor seen as a `std::fs::File`, for the
    /// blocking variants' positional system calls.
    fn with_std<R>(&self, f: impl FnOnce(&std::fs::File) -> R) -> R {
        // SAFETY: the descriptor is open for as long as `self.file` lives,
        // which outlasts this call; `ManuallyDrop` keeps the borrowed
        // `std::fs::File` from closing it (the compio file owns it).
        let file = ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(self.file.as_raw_fd()) });
        f(&file)
    }

    fn check_write(&self, offset: u64, len: usize) -> io::Result<()> {
        let len = len as u64;
        if is_aligned(offset) && is_aligned(len) {
            Ok(())
        } else {
            Err(misaligned("write_at", &self.path, offset, len))
        }
    }

    /// Read lengths are the buffer's capacity, always a multiple of [`ALIGN`].
    fn check_read(&self, offset: u64, capacity: usize) -> io::Result<()> {
        if is_aligned(offset) {
            Ok(())
        } else {
            Err(misaligned("read_at", &self.path, offset, capacity as u64))
        }
    }

    fn sync_failed(&self, err: io::Error) -> io::Error {
        context(err, "fdatasync", &self.path, None, None)
    }
}

impl Disk for RealDisk {
    type File = RealFile;

    async fn open(&self, path: &Path, create: bool) -> io::Result<RealFile> {
        let file = compio::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(create)
            .custom_flags(DATA_FILE_FLAGS)
            .open(path)
            .await
            .map_err(|e| open_failed(e, path))?;
        Ok(RealFile {
            file,
            path: path.to_path_buf(),
            dsync: std::cell::OnceCell::new(),
        })
    }

    fn open_blocking(&self, path: &Path, create: bool) -> io::Result<RealFile> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(create)
            .custom_flags(DATA_FILE_FLAGS)
            .open(path)
            .map_err(|e| open_failed(e, path))?;
        // SAFETY: `into_raw_fd` hands over sole ownership of an open
        // descriptor, which the compio file then closes on drop. compio's
        // own `open` would additionally "attach" the descriptor to the
        // thread's driver, which on Linux (io_uring and polling drivers
        // alike) is a no-op, so the file works on any runtime of this
        // thread, and without one for the blocking calls.
        let file = unsafe { compio::fs::File::from_raw_fd(file.into_raw_fd()) };
        Ok(RealFile {
            file,
            path: path.to_path_buf(),
            dsync: std::cell::OnceCell::new(),
        })
    }

    async fn remove_file(&self, path: &Path) -> io::Result<()> {
        compio::fs::remove_file(path)
            .await
            .map_err(|e| remove_failed(e, path))
    }

    fn remove_file_blocking(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path).map_err(|e| remove_failed(e, path))
    }

    async fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        compio::fs::rename(from, to).await.map_err(|source| {
            io::Error::new(
                source.kind(),
                RealIoError {
                    op: "rename",
                    path: from.to_path_buf(),
                    target: Some(to.to_path_buf()),
                    offset: None,
                    len: None,
                    source,
                },
            )
        })
    }

    async fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let handle = compio::fs::OpenOptions::new()
            .read(true)
            .custom_flags(DIR_FLAGS)
            .open(dir)
            .await
            .map_err(|e| dir_open_failed(e, dir))?;
        handle.sync_all().await.map_err(|e| dir_sync_failed(e, dir))
    }

    fn sync_dir_blocking(&self, dir: &Path) -> io::Result<()> {
        fsync_dir_blocking(dir)
    }

    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        // Remember which ancestors are new, so that their entries can be
        // made durable (fsync of each new directory's parent).
        let mut missing = Vec::new();
        for ancestor in dir.ancestors() {
            if ancestor.as_os_str().is_empty() || ancestor.exists() {
                break;
            }
            missing.push(ancestor.to_path_buf());
        }
        std::fs::create_dir_all(dir).map_err(|e| context(e, "create_dir_all", dir, None, None))?;
        for new_dir in missing.iter().rev() {
            let parent = match new_dir.parent() {
                Some(p) if !p.as_os_str().is_empty() => p,
                _ => Path::new("."),
            };
            fsync_dir_blocking(parent)?;
        }
        Ok(())
    }

    fn list_dir(&self, dir: &Path) -> io::Result<Vec<PathBuf>> {
        let entries =
            std::fs::read_dir(dir).map_err(|e| context(e, "read_dir", dir, None, None))?;
        let mut files = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| context(e, "read_dir entry", dir, None, None))?;
            let kind = entry
                .file_type()
                .map_err(|e| context(e, "file type", &entry.path(), None, None))?;
            if kind.is_file() {
                files.push(entry.path());
            }
        }
        files.sort();
        Ok(files)
    }

    fn exists(&self, path: &Path) -> bool {
        path.exists()
    }
}

/// `sync_dir` without a runtime: also what `create_dir_all` uses to make
/// new directory entries durable.
fn fsync_dir_blocking(dir: &Path) -> io::Result<()> {
    let handle = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(DIR_FLAGS)
        .open(dir)
        .map_err(|e| dir_open_failed(e, dir))?;
    handle.sync_all().map_err(|e| dir_sync_failed(e, dir))
}

impl DiskFile for RealFile {
    async fn write_at(&self, buf: AlignedBuf, offset: u64) -> (io::Result<()>, AlignedBuf) {
        if let Err(err) = self.check_write(offset, buf.len()) {
            return (Err(err), buf);
        }
        self.write_all_at(buf, offset).await
    }

    async fn write_at_durable(&self, buf: AlignedBuf, offset: u64) -> (io::Result<()>, AlignedBuf) {
        if let Err(err) = self.check_write(offset, buf.len()) {
            return (Err(err), buf);
        }
        if self.dsync.get().is_none() {
            // Reopened through the descriptor, not the path: the file may
            // have been renamed since it was opened (a new WAL segment is
            // made under a temporary name).
            let own_fd = PathBuf::from(format!("/proc/self/fd/{}", self.file.as_raw_fd()));
            let opened = compio::fs::OpenOptions::new()
                .write(true)
                .custom_flags(DATA_FILE_FLAGS | libc::O_DSYNC)
                .open(&own_fd)
                .await;
            if let Err(e) = &opened {
                tracing::debug!(file = %self.path.display(), error = %e, "no O_DSYNC descriptor (no /proc?); durable writes are a write and an fdatasync");
            }
            let _ = self.dsync.set(opened.ok());
        }
        match self.dsync.get().and_then(Option::as_ref) {
            Some(dsync) => self.write_all_through(dsync, buf, offset).await,
            None => super::write_then_sync(self, buf, offset).await,
        }
    }

    fn write_at_blocking(&self, buf: &AlignedBuf, offset: u64) -> io::Result<()> {
        self.check_write(offset, buf.len())?;
        let mut progress = WriteAll::new(&self.path, offset, buf.len());
        self.with_std(|file| {
            while let Some((at, from)) = progress.next() {
                progress.record(file.write_at(&buf.as_slice()[from..], at))?;
            }
            Ok(())
        })
    }

    async fn read_at(&self, buf: AlignedBuf, offset: u64) -> (io::Result<usize>, AlignedBuf) {
        if let Err(err) = self.check_read(offset, buf.capacity()) {
            return (Err(err), buf);
        }
        let mut fill = ReadFill::new(&self.path, offset, buf.capacity());
        let mut buf = buf;
        AlignedBuf::set_len(&mut buf, 0);
        while let Some((at, from)) = fill.next() {
            let op = ReadAt::new(self.file.to_shared_fd(), at, buf.slice(from..));
            let BufResult(result, slice) = compio::runtime::submit(op).await.into_inner();
            buf = slice.into_inner();
            let recorded = fill.record(result);
            AlignedBuf::set_len(&mut buf, fill.done);
            if let Err(err) = recorded {
                return (Err(err), buf);
            }
        }
        (Ok(fill.done), buf)
    }

    fn read_at_blocking(&self, buf: &mut AlignedBuf, offset: u64) -> io::Result<usize> {
        self.check_read(offset, buf.capacity())?;
        let mut fill = ReadFill::new(&self.path, offset, buf.capacity());
        buf.set_len(0);
        self.with_std(|file| {
            while let Some((at, from)) = fill.next() {
                let recorded = fill.record(file.read_at(&mut buf.spare_mut()[from..], at));
                buf.set_len(fill.done);
                recorded?;
            }
            Ok(fill.done)
        })
    }

    async fn sync_data(&self) -> io::Result<()> {
        self.file.sync_data().await.map_err(|e| self.sync_failed(e))
    }

    fn sync_data_blocking(&self) -> io::Result<()> {
        self.with_std(|file| file.sync_data())
            .map_err(|e| self.sync_failed(e))
    }

    async fn allocate_zeroed(&self, len: u64) -> io::Result<()> {
        if !is_aligned(len) {
            return Err(misaligned("allocate_zeroed", &self.path, 0, len));
        }
        let current = self.len().await?;
        if current >= len {
            return Ok(());
        }
        // An unaligned end (from set_len) lies inside an allocated block:
        // extending to the block boundary zero-fills it in place.
        let mut start = current.next_multiple_of(ALIGN as u64);
        if start != current {
            self.set_len(start).await?;
        }
        let chunk_bytes = (len - start).min(ZERO_FILL_CHUNK_BYTES as u64) as usize;
        let mut zeroes = AlignedBuf::with_capacity(chunk_bytes);
        while start < len {
            let n = (len - start).min(chunk_bytes as u64) as usize;
            AlignedBuf::set_len(&mut zeroes, n);
            let (result, returned) = self.write_all_at(zeroes, start).await;
            zeroes = returned;
            result?;
            start += n as u64;
        }
        Ok(())
    }

    async fn set_len(&self, len: u64) -> io::Result<()> {
        self.file
            .set_len(len)
            .await
            .map_err(|e| context(e, "set_len", &self.path, None, Some(len)))
    }

    async fn len(&self) -> io::Result<u64> {
        let meta = self
            .file
            .metadata()
            .await
            .map_err(|e| context(e, "stat", &self.path, None, None))?;
        Ok(meta.len())
    }
}
