//! The data directory's lock file, `DATA/LOCK`: held with
//! `flock(LOCK_EX | LOCK_NB)` for the whole life of the server and holding the
//! holder's pid, so two processes (servers, or programs embedding the engine
//! with [`crate::Db`]) never run on one directory.
//!
//! The kernel lock is the truth; the pid in the file is only there to tell a
//! person which process holds it. The lock goes away with the process (even
//! after kill -9), so a stale file never blocks a restart.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// Name of the lock file inside the data directory.
pub const LOCK_FILE_NAME: &str = "LOCK";

/// Why the data directory could not be locked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    #[error("cannot create data directory {path}: {source}")]
    CreateDir { path: PathBuf, source: io::Error },
    #[error("cannot open lock file {path}: {source}")]
    Open { path: PathBuf, source: io::Error },
    #[error("data directory is in use: {path} is locked by {holder}")]
    Held { path: PathBuf, holder: LockHolder },
    #[error("cannot lock {path}: {source}")]
    Lock { path: PathBuf, source: io::Error },
    #[error("cannot write the pid into {path}: {source}")]
    Write { path: PathBuf, source: io::Error },
}

/// Who holds a lock, as far as the lock file says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockHolder {
    /// The file names this process id.
    Pid(u32),
    /// The file is empty or unreadable (the holder is still writing it, or it
    /// is not a ringkv lock file).
    Unknown,
}

impl std::fmt::Display for LockHolder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LockHolder::Pid(pid) => write!(f, "pid {pid}"),
            LockHolder::Unknown => write!(f, "another process (pid unknown)"),
        }
    }
}

/// An exclusive lock on a data directory, released when dropped (or when the
/// process exits, however it exits).
#[derive(Debug)]
pub struct DirLock {
    file: File,
    path: PathBuf,
    /// This lock made the file: it is removed again when the lock goes, so
    /// a directory an offline tool checked (a backup) is left as it was.
    created: bool,
}

impl DirLock {
    /// Creates `data_dir` if needed and locks `data_dir/LOCK`, writing this
    /// process's pid into it. Fails with [`LockError::Held`] naming the
    /// holder's pid if another process has it.
    pub fn acquire(data_dir: &Path) -> Result<DirLock, LockError> {
        std::fs::create_dir_all(data_dir).map_err(|source| LockError::CreateDir {
            path: data_dir.to_path_buf(),
            source,
        })?;
        let path = data_dir.join(LOCK_FILE_NAME);
        let created = !path.exists();
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|source| LockError::Open {
                path: path.clone(),
                source,
            })?;
        // An exclusive flock(2), released when the file is closed (also by
        // kill -9).
        match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(rustix::io::Errno::WOULDBLOCK) => {
                let holder = read_holder(&mut file);
                return Err(LockError::Held { path, holder });
            }
            Err(errno) => {
                return Err(LockError::Lock {
                    path,
                    source: errno.into(),
                });
            }
        }
        let write = |file: &mut File| -> io::Result<()> {
            file.set_len(0)?;
            file.seek(SeekFrom::Start(0))?;
            file.write_all(format!("{}\n", std::process::id()).as_bytes())?;
            file.sync_data()
        };
        write(&mut file).map_err(|source| LockError::Write {
            path: path.clone(),
            source,
        })?;
        Ok(DirLock {
            file,
            path,
            created,
        })
    }

    /// Path of the lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for DirLock {
    fn drop(&mut self) {
        // A file this lock made goes, while still locked: a process that
        // opens the name after this makes a new file and locks that.
        if self.created {
            match std::fs::remove_file(&self.path) {
                Ok(()) => return,
                Err(e) => {
                    tracing::debug!(path = %self.path.display(), error = %e, "could not remove the lock file")
                }
            }
        }
        // Empty the file so nobody reads our pid after we are gone; the flock
        // itself is released when `file` is closed right after.
        if let Err(e) = self.file.set_len(0) {
            tracing::debug!(path = %self.path.display(), error = %e, "could not empty the lock file");
        }
    }
}

fn read_holder(file: &mut File) -> LockHolder {
    let mut text = String::new();
    // A pid is at most 10 digits; never read more than a small bound.
    let mut limited = file.take(64);
    if limited.read_to_string(&mut text).is_err() {
        return LockHolder::Unknown;
    }
    match text.trim().parse::<u32>() {
        Ok(pid) => LockHolder::Pid(pid),
        Err(_) => LockHolder::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_lock_on_same_dir_names_the_holder() {
        let dir = tempfile::tempdir().unwrap();
        let first = DirLock::acquire(dir.path()).unwrap();
        let text = std::fs::read_to_string(first.path()).unwrap();
        assert_eq!(text.trim(), std::process::id().to_string());
        // flock locks belong to the open file description, so a second open
        // in the same process conflicts just like another process would.
        match DirLock::acquire(dir.path()) {
            Err(LockError::Held { holder, .. }) => {
                assert_eq!(holder, LockHolder::Pid(std::process::id()))
            }
            other => panic!("expected Held, got {other:?}"),
        }
        drop(first);
        let again = DirLock::acquire(dir.path()).unwrap();
        drop(again);
    }

    /// A directory that had no lock file (a backup an offline tool checks)
    /// has none afterwards; one that had it keeps it.
    #[test]
    fn a_lock_file_is_left_only_where_it_was() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(LOCK_FILE_NAME);
        drop(DirLock::acquire(dir.path()).unwrap());
        assert!(!path.exists());
        std::fs::write(&path, b"").unwrap();
        drop(DirLock::acquire(dir.path()).unwrap());
        assert!(path.exists());
        assert_eq!(std::fs::read(&path).unwrap(), b"");
    }

    #[test]
    fn creates_missing_directory() {
        let dir = tempfile::tempdir().unwrap();
        let nested = dir.path().join("a/b/c");
        let lock = DirLock::acquire(&nested).unwrap();
        assert!(lock.path().exists());
    }
}
