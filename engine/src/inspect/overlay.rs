//! A [`Disk`] that reads a real directory tree and keeps every change in
//! memory: writes, new files, removals and renames are seen by later calls
//! on the same `OverlayDisk` and never reach the real files.
//!
//! What must hold: no call on an `OverlayDisk` or its files modifies the
//! real file system. Files are read with plain `pread` (no O_DIRECT), so
//! any offset works; alignment is still checked as on the real disk.
//! Memory grows with what is written through it (WAL records and hybrid
//! value segments that recovery rewrites), never with what is only read:
//! zero-filled space (`allocate_zeroed`, `set_len`) is a length, not a
//! buffer.

use crate::io::{AlignedBuf, Disk, DiskFile, ALIGN};
use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

/// Bytes of one overlay block: writes are kept in blocks of this size.
const BLOCK: u64 = ALIGN as u64;

/// The changed contents of one file.
struct FileData {
    /// The real file the unchanged bytes come from, if any.
    base: Option<Arc<File>>,
    /// Bytes of `base` still visible (a shrink hides the rest for good).
    base_len: u64,
    /// Current length.
    len: u64,
    /// Blocks written through the overlay, by block index.
    blocks: BTreeMap<u64, Box<[u8]>>,
}

impl FileData {
    fn read(&self, mut offset: u64, out: &mut [u8]) -> io::Result<usize> {
        let end = (offset + out.len() as u64).min(self.len);
        if offset >= end {
            return Ok(0);
        }
        let total = (end - offset) as usize;
        let mut done = 0usize;
        while done < total {
            let block = offset / BLOCK;
            let in_block = (offset % BLOCK) as usize;
            let n = (BLOCK as usize - in_block).min(total - done);
            let dst = &mut out[done..done + n];
            if let Some(data) = self.blocks.get(&block) {
                dst.copy_from_slice(&data[in_block..in_block + n]);
            } else {
                dst.fill(0);
                if let Some(base) = &self.base {
                    if offset < self.base_len {
                        let m = ((self.base_len - offset) as usize).min(n);
                        read_exact_at(base, &mut dst[..m], offset)?;
                    }
                }
            }
            done += n;
            offset += n as u64;
        }
        Ok(total)
    }

    fn write(&mut self, mut offset: u64, mut bytes: &[u8]) -> io::Result<()> {
        while !bytes.is_empty() {
            let block = offset / BLOCK;
            let in_block = (offset % BLOCK) as usize;
            let n = (BLOCK as usize - in_block).min(bytes.len());
            if !self.blocks.contains_key(&block) {
                let mut data = vec![0u8; BLOCK as usize].into_boxed_slice();
                let start = block * BLOCK;
                self.read(start, &mut data)?;
                self.blocks.insert(block, data);
            }
            let data = self.blocks.get_mut(&block).expect("inserted above");
            data[in_block..in_block + n].copy_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
            offset += n as u64;
            self.len = self.len.max(offset);
        }
        Ok(())
    }

    fn set_len(&mut self, len: u64) {
        if len < self.len {
            self.base_len = self.base_len.min(len);
            let first_gone = len.div_ceil(BLOCK);
            self.blocks.split_off(&first_gone);
            if !len.is_multiple_of(BLOCK) {
                if let Some(data) = self.blocks.get_mut(&(len / BLOCK)) {
                    data[(len % BLOCK) as usize..].fill(0);
                }
            }
        }
        self.len = len;
    }
}

fn read_exact_at(file: &File, mut buf: &mut [u8], mut offset: u64) -> io::Result<()> {
    while !buf.is_empty() {
        match file.read_at(buf, offset) {
            // The file shrank under us: what is gone reads as zero.
            Ok(0) => {
                buf.fill(0);
                return Ok(());
            }
            Ok(n) => {
                buf = &mut buf[n..];
                offset += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// What a path names in the overlay.
#[derive(Clone)]
enum Entry {
    File(Arc<Mutex<FileData>>),
    Removed,
}

#[derive(Default)]
struct State {
    /// Paths the overlay has touched (opened, created, removed, renamed).
    names: BTreeMap<PathBuf, Entry>,
    /// Directories created through the overlay.
    dirs: BTreeSet<PathBuf>,
}

/// The disk; see the module doc.
#[derive(Clone, Default)]
pub struct OverlayDisk {
    state: Arc<Mutex<State>>,
}

impl std::fmt::Debug for OverlayDisk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OverlayDisk")
    }
}

/// One open file of an [`OverlayDisk`].
pub struct OverlayFile {
    data: Arc<Mutex<FileData>>,
    path: PathBuf,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn not_found(op: &str, path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("{op} {}: no such file", path.display()),
    )
}

fn check_aligned(op: &str, path: &Path, offset: u64, len: usize) -> io::Result<()> {
    if !offset.is_multiple_of(BLOCK) || !len.is_multiple_of(ALIGN) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{op} {} at offset {offset} of {len} bytes: not {ALIGN}-byte aligned",
                path.display()
            ),
        ));
    }
    Ok(())
}

impl OverlayDisk {
    pub fn new() -> OverlayDisk {
        OverlayDisk::default()
    }

    /// The entry of `path`, looking at the real file system for paths the
    /// overlay has not touched yet.
    fn resolve(&self, state: &mut State, path: &Path) -> io::Result<Option<Arc<Mutex<FileData>>>> {
        if let Some(entry) = state.names.get(path) {
            return Ok(match entry {
                Entry::File(f) => Some(f.clone()),
                Entry::Removed => None,
            });
        }
        match std::fs::metadata(path) {
            Ok(meta) if meta.is_file() => {
                let file = File::open(path).map_err(|e| {
                    io::Error::new(e.kind(), format!("open {}: {e}", path.display()))
                })?;
                let data = Arc::new(Mutex::new(FileData {
                    base: Some(Arc::new(file)),
                    base_len: meta.len(),
                    len: meta.len(),
                    blocks: BTreeMap::new(),
                }));
                state
                    .names
                    .insert(path.to_path_buf(), Entry::File(data.clone()));
                Ok(Some(data))
            }
            _ => Ok(None),
        }
    }

    fn dir_exists(state: &State, dir: &Path) -> bool {
        state.dirs.contains(dir) || dir.is_dir()
    }

    fn open_now(&self, path: &Path, create: bool) -> io::Result<OverlayFile> {
        let mut state = lock(&self.state);
        let data = match self.resolve(&mut state, path)? {
            Some(d) => d,
            None if create => {
                let parent = path.parent().unwrap_or(Path::new("."));
                if !Self::dir_exists(&state, parent) {
                    return Err(not_found("open (directory)", path));
                }
                let d = Arc::new(Mutex::new(FileData {
                    base: None,
                    base_len: 0,
                    len: 0,
                    blocks: BTreeMap::new(),
                }));
                state
                    .names
                    .insert(path.to_path_buf(), Entry::File(d.clone()));
                d
            }
            None => return Err(not_found("open", path)),
        };
        Ok(OverlayFile {
            data,
            path: path.to_path_buf(),
        })
    }

    fn remove_now(&self, path: &Path) -> io::Result<()> {
        let mut state = lock(&self.state);
        if self.resolve(&mut state, path)?.is_none() {
            return Err(not_found("remove", path));
        }
        state.names.insert(path.to_path_buf(), Entry::Removed);
        Ok(())
    }

    /// Whether the overlay holds changes to `path` (written, created,
    /// removed or renamed). For tests and reports.
    pub fn changed_paths(&self) -> Vec<PathBuf> {
        let state = lock(&self.state);
        state
            .names
            .iter()
            .filter(|(_, e)| match e {
                Entry::Removed => true,
                Entry::File(f) => {
                    let f = lock(f);
                    !f.blocks.is_empty() || f.base.is_none() || f.len != f.base_len
                }
            })
            .map(|(p, _)| p.clone())
            .collect()
    }
}

impl Disk for OverlayDisk {
    type File = OverlayFile;

    async fn open(&self, path: &Path, create: bool) -> io::Result<OverlayFile> {
        self.open_now(path, create)
    }

    fn open_blocking(&self, path: &Path, create: bool) -> io::Result<OverlayFile> {
        self.open_now(path, create)
    }

    async fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.remove_now(path)
    }

    fn remove_file_blocking(&self, path: &Path) -> io::Result<()> {
        self.remove_now(path)
    }

    async fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut state = lock(&self.state);
        let Some(data) = self.resolve(&mut state, from)? else {
            return Err(not_found("rename", from));
        };
        if from != to {
            state.names.insert(from.to_path_buf(), Entry::Removed);
            state.names.insert(to.to_path_buf(), Entry::File(data));
        }
        Ok(())
    }

    async fn sync_dir(&self, _dir: &Path) -> io::Result<()> {
        Ok(())
    }

    fn sync_dir_blocking(&self, _dir: &Path) -> io::Result<()> {
        Ok(())
    }

    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        let mut state = lock(&self.state);
        for ancestor in dir.ancestors() {
            if ancestor.as_os_str().is_empty() || ancestor.is_dir() {
                break;
            }
            state.dirs.insert(ancestor.to_path_buf());
        }
        Ok(())
    }

    fn list_dir(&self, dir: &Path) -> io::Result<Vec<PathBuf>> {
        let state = lock(&self.state);
        let mut files = BTreeSet::new();
        if dir.is_dir() {
            for entry in std::fs::read_dir(dir)? {
                let entry = entry?;
                if entry.file_type()?.is_file() {
                    files.insert(entry.path());
                }
            }
        } else if !state.dirs.contains(dir) {
            return Err(not_found("list_dir", dir));
        }
        for (path, entry) in &state.names {
            if path.parent() != Some(dir) {
                continue;
            }
            match entry {
                Entry::File(_) => files.insert(path.clone()),
                Entry::Removed => files.remove(path),
            };
        }
        Ok(files.into_iter().collect())
    }

    fn exists(&self, path: &Path) -> bool {
        let state = lock(&self.state);
        match state.names.get(path) {
            Some(Entry::File(_)) => true,
            Some(Entry::Removed) => false,
            None => state.dirs.contains(path) || path.exists(),
        }
    }
}

impl OverlayFile {
    fn read_into(&self, buf: &mut AlignedBuf, offset: u64) -> io::Result<usize> {
        check_aligned("read", &self.path, offset, buf.capacity())?;
        buf.set_len(buf.capacity());
        let n = lock(&self.data)
            .read(offset, buf.as_mut_slice())
            .map_err(|e| io::Error::new(e.kind(), format!("read {}: {e}", self.path.display())))?;
        buf.set_len(n);
        Ok(n)
    }

    fn write_from(&self, buf: &AlignedBuf, offset: u64) -> io::Result<()> {
        check_aligned("write", &self.path, offset, buf.len())?;
        lock(&self.data).write(offset, buf.as_slice())
    }
}

impl DiskFile for OverlayFile {
    async fn write_at(&self, buf: AlignedBuf, offset: u64) -> (io::Result<()>, AlignedBuf) {
        (self.write_from(&buf, offset), buf)
    }

    async fn read_at(&self, mut buf: AlignedBuf, offset: u64) -> (io::Result<usize>, AlignedBuf) {
        (self.read_into(&mut buf, offset), buf)
    }

    async fn sync_data(&self) -> io::Result<()> {
        Ok(())
    }

    async fn allocate_zeroed(&self, len: u64) -> io::Result<()> {
        let mut data = lock(&self.data);
        if len > data.len {
            data.set_len(len);
        }
        Ok(())
    }

    async fn set_len(&self, len: u64) -> io::Result<()> {
        lock(&self.data).set_len(len);
        Ok(())
    }

    async fn len(&self) -> io::Result<u64> {
        Ok(lock(&self.data).len)
    }

    fn read_at_blocking(&self, buf: &mut AlignedBuf, offset: u64) -> io::Result<usize> {
        self.read_into(buf, offset)
    }

    fn write_at_blocking(&self, buf: &AlignedBuf, offset: u64) -> io::Result<()> {
        self.write_from(buf, offset)
    }

    fn sync_data_blocking(&self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(byte: u8) -> AlignedBuf {
        let mut b = AlignedBuf::with_capacity(ALIGN);
        b.set_len(ALIGN);
        b.as_mut_slice().fill(byte);
        b
    }

    #[test]
    fn changes_stay_in_memory() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("a");
        std::fs::write(&real, vec![7u8; 2 * ALIGN]).unwrap();
        let disk = OverlayDisk::new();
        let f = disk.open_blocking(&real, false).unwrap();
        f.write_at_blocking(&block(9), ALIGN as u64).unwrap();
        let mut buf = AlignedBuf::with_capacity(2 * ALIGN);
        assert_eq!(f.read_at_blocking(&mut buf, 0).unwrap(), 2 * ALIGN);
        assert!(buf.as_slice()[..ALIGN].iter().all(|&b| b == 7));
        assert!(buf.as_slice()[ALIGN..].iter().all(|&b| b == 9));
        pollster::block_on(f.set_len(ALIGN as u64 / 2)).unwrap();
        pollster::block_on(f.allocate_zeroed(ALIGN as u64)).unwrap();
        assert_eq!(f.read_at_blocking(&mut buf, 0).unwrap(), ALIGN);
        assert!(buf.as_slice()[ALIGN / 2..ALIGN].iter().all(|&b| b == 0));
        pollster::block_on(disk.rename(&real, &dir.path().join("b"))).unwrap();
        let created = dir.path().join("new/c");
        disk.create_dir_all(created.parent().unwrap()).unwrap();
        disk.open_blocking(&created, true).unwrap();
        assert!(!disk.exists(&real) && disk.exists(&dir.path().join("b")));
        assert_eq!(
            disk.list_dir(dir.path()).unwrap(),
            vec![dir.path().join("b")]
        );
        // The real directory is as it was.
        assert_eq!(std::fs::read(&real).unwrap(), vec![7u8; 2 * ALIGN]);
        assert!(!dir.path().join("b").exists() && !dir.path().join("new").exists());
        assert_eq!(disk.changed_paths().len(), 3);
    }
}
