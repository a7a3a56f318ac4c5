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

use super::{AlignedBuf, Disk, DiskFile, ALIGN};
use compio::buf::{BufResult, IntoInner, IoBuf, IoBufMut, SetLen};
use compio::driver::op::{ReadAt, WriteAt};
use compio::driver::ToSharedFd;
use std::fmt;
use std::io;
use std::mem::MaybeUninit;
use std::path::{Path, PathBuf};

/// Largest single write `allocate_zeroed` issues.
pub const ZERO_FILL_CHUNK_BYTES: usize = 1 << 20;

const _: () = assert!(ZERO_FILL_CHUNK_BYTES % ALIGN == 0);

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
    n % ALIGN as u64 == 0
}

/// The real file system. Stateless: every shard may hold a clone.
#[derive(Clone, Copy, Debug, Default)]
pub struct RealDisk;

/// A file opened with O_DIRECT on the current compio runtime.
#[derive(Debug)]
pub struct RealFile {
    file: compio::fs::File,
    path: PathBuf,
}

impl RealFile {
    /// The path the file was opened with.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes all of `buf` at `offset`, continuing after short writes.
    async fn write_all_at(&self, buf: AlignedBuf, offset: u64) -> (io::Result<()>, AlignedBuf) {
        let total = buf.len();
        let mut done = 0usize;
        let mut buf = buf;
        while done < total {
            let at = offset + done as u64;
            let op = WriteAt::new(self.file.to_shared_fd(), at, buf.slice(done..));
            let BufResult(result, slice) = compio::runtime::submit(op).await.into_inner();
            buf = slice.into_inner();
            match result {
                Ok(0) => {
                    let err = io::Error::new(io::ErrorKind::WriteZero, "write returned 0 bytes");
                    let err = context(err, "write_at", &self.path, Some(at), Some(total as u64));
                    return (Err(err), buf);
                }
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    let err = context(e, "write_at", &self.path, Some(at), Some(total as u64));
                    return (Err(err), buf);
                }
            }
        }
        (Ok(()), buf)
    }
}

impl Disk for RealDisk {
    type File = RealFile;

    async fn open(&self, path: &Path, create: bool) -> io::Result<RealFile> {
        let file = compio::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(create)
            .custom_flags(libc::O_DIRECT | libc::O_CLOEXEC)
            .open(path)
            .await
            .map_err(|e| {
                let op = if e.raw_os_error() == Some(libc::EINVAL) {
                    "open with O_DIRECT (does this file system support O_DIRECT? tmpfs before \
                     Linux 6.6 and some FUSE/overlay file systems do not)"
                } else {
                    "open"
                };
                context(e, op, path, None, None)
            })?;
        Ok(RealFile {
            file,
            path: path.to_path_buf(),
        })
    }

    async fn remove_file(&self, path: &Path) -> io::Result<()> {
        compio::fs::remove_file(path)
            .await
            .map_err(|e| context(e, "remove_file", path, None, None))
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
            .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
            .open(dir)
            .await
            .map_err(|e| context(e, "open directory for fsync", dir, None, None))?;
        handle
            .sync_all()
            .await
            .map_err(|e| context(e, "fsync directory", dir, None, None))
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

fn fsync_dir_blocking(dir: &Path) -> io::Result<()> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| context(e, "fsync directory", dir, None, None))
}

impl DiskFile for RealFile {
    async fn write_at(&self, buf: AlignedBuf, offset: u64) -> (io::Result<()>, AlignedBuf) {
        let len = buf.len() as u64;
        if !is_aligned(offset) || !is_aligned(len) {
            return (Err(misaligned("write_at", &self.path, offset, len)), buf);
        }
        self.write_all_at(buf, offset).await
    }

    async fn read_at(&self, buf: AlignedBuf, offset: u64) -> (io::Result<usize>, AlignedBuf) {
        let capacity = buf.capacity();
        if !is_aligned(offset) {
            return (
                Err(misaligned("read_at", &self.path, offset, capacity as u64)),
                buf,
            );
        }
        let mut buf = buf;
        AlignedBuf::set_len(&mut buf, 0);
        let mut done = 0usize;
        // A regular file read is short only at end of file; after a short
        // but aligned read, ask again to be sure (signals, odd file systems).
        while done < capacity {
            let at = offset + done as u64;
            let op = ReadAt::new(self.file.to_shared_fd(), at, buf.slice(done..));
            let BufResult(result, slice) = compio::runtime::submit(op).await.into_inner();
            buf = slice.into_inner();
            match result {
                Ok(0) => break,
                Ok(n) => {
                    done += n;
                    AlignedBuf::set_len(&mut buf, done);
                    if !is_aligned(n as u64) {
                        break; // unaligned tail: end of file
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    let err = context(e, "read_at", &self.path, Some(at), Some(capacity as u64));
                    return (Err(err), buf);
                }
            }
        }
        AlignedBuf::set_len(&mut buf, done);
        (Ok(done), buf)
    }

    async fn sync_data(&self) -> io::Result<()> {
        self.file
            .sync_data()
            .await
            .map_err(|e| context(e, "fdatasync", &self.path, None, None))
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
