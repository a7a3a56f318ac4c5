//! In-memory simulated disk for tests: every file keeps a *written* image
//! (what reads return) and a *durable* image (what survives [`SimDisk::crash`]),
//! and the directory tree keeps a current and a durable namespace.
//!
//! What must hold:
//! - Deterministic: the same seed and the same sequence of operations give the
//!   same results, faults and crash images (one seeded RNG in the state; all
//!   maps are ordered).
//! - O_DIRECT rules are enforced like the kernel would: offsets and lengths of
//!   `write_at`/`read_at`, and `allocate_zeroed` lengths, must be multiples of
//!   [`ALIGN`], otherwise the call fails with `InvalidInput` (EINVAL).
//! - `sync_data` makes a file's written image durable (contents and length).
//!   Creations, renames and removals are durable only after `sync_dir` of the
//!   parent directory. Directories themselves are durable as soon as
//!   `create_dir_all` returns.
//! - A crash never invents data: after it every file equals its durable image,
//!   plus (with `torn_write_on_crash`) a prefix, in write order, of the writes
//!   made since its last sync: whole 4 KiB blocks, then at most one torn block
//!   of which a random subset of 512-byte sectors is new. With
//!   `crash_keeps_any_writes` (a disk with several writes in flight) each
//!   unsynced write is instead kept whole, lost, or kept block by block (each
//!   block new, old or torn), independently of the others. Writes past the
//!   durable length are never kept (the size change was not synced).
//! - `write_at_durable` makes only its own write durable (as an `O_DSYNC`
//!   write does), not the file's other unsynced writes, unless the write
//!   reaches past the durable length (then the whole file is synced, as the
//!   size change needs).
//! - With `latency_jitter`, each delayed operation waits a random extra time,
//!   so operations in flight together complete in any order.
//! - File handles do not survive a crash: every operation on a handle opened
//!   before the crash fails, so a zombie engine cannot write into the next life.
//!
//! Injected write and sync faults (see [`SimFaults`]) are one-shot counters:
//! exactly the Nth matching `write_at`/`sync_data` fails with EIO, later ones
//! succeed again. That is deliberate: an engine that wrongly retries a failed
//! fdatasync then "succeeds" and acknowledges data the sim has dropped, which
//! a model test catches after the next crash. Read faults are random instead
//! (a probability of EIO, a probability of one flipped bit), drawn from the
//! seeded RNG only while enabled, so seeds keep their meaning otherwise.
//!
//! The blocking variants (`*_blocking`) run the very same code as the async
//! methods: only the injected latency differs (a `std::thread::sleep` instead
//! of the compio timer). Countdowns, stats, pending writes and crash handling
//! are therefore shared: a blocking write left unsynced is dropped or torn by
//! a crash exactly like an async one.

use super::{AlignedBuf, Disk, DiskFile, ALIGN};
use crate::rng::SplitMix64;
use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

/// Sector size used for torn writes: a torn 4 KiB block keeps a random subset
/// of its sectors new.
pub const SECTOR_BYTES: usize = 512;

const _: () = assert!(ALIGN.is_multiple_of(SECTOR_BYTES));

/// A shared simulated disk. Cloning gives another handle to the same disk
/// (the state is behind one mutex, shared by every shard thread).
#[derive(Clone)]
pub struct SimDisk {
    state: Arc<Mutex<State>>,
}

impl std::fmt::Debug for SimDisk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.lock();
        f.debug_struct("SimDisk")
            .field("seed", &state.seed)
            .field("files", &state.names.len())
            .field("generation", &state.generation)
            .finish()
    }
}

/// Faults to inject. Counters start when [`SimDisk::set_faults`] is called.
#[derive(Clone, Debug)]
pub struct SimFaults {
    /// The Nth matching `write_at` from now (0 = the next one) fails with EIO.
    /// A random prefix of its whole blocks may still land in the written
    /// (not the durable) image, like a real failed write. One-shot: later
    /// writes succeed. `allocate_zeroed` is not counted.
    pub fail_write_after: Option<u64>,
    /// The Nth matching `sync_data` from now (0 = the next one) fails with
    /// EIO, and the file's unsynced data is dropped (the written image goes
    /// back to the durable image), as Linux may do after a writeback error.
    /// One-shot: later syncs succeed (an engine must not retry, see module doc).
    pub fail_sync_after: Option<u64>,
    /// Probability that a matching `read_at` returns one flipped bit (the
    /// stored images are untouched).
    pub corrupt_read_probability: f64,
    /// Probability that a matching `read_at` fails with EIO (counted in
    /// [`SimStats::injected_read_errors`]); the buffer is left as it was.
    pub read_error_probability: f64,
    /// Whether [`SimDisk::crash`] may keep a prefix of unsynced writes with
    /// one torn block. Default: true.
    pub torn_write_on_crash: bool,
    /// Each matching `write_at` and `sync_data` first waits this long: the
    /// async calls on the compio timer (so they need a compio runtime), the
    /// blocking ones in `std::thread::sleep`.
    pub latency: Option<Duration>,
    /// Each matching `read_at` first waits this long, the same way.
    pub read_latency: Option<Duration>,
    /// Each delayed `write_at` and `sync_data` (those with `latency` set)
    /// waits a further random time below this, drawn from the seeded RNG,
    /// so that operations in flight together complete in any order.
    pub latency_jitter: Option<Duration>,
    /// Whether a crash may keep any subset of the unsynced writes, each
    /// whole, lost or torn block by block, instead of a prefix in write
    /// order (see the module doc). Needs `torn_write_on_crash`.
    pub crash_keeps_any_writes: bool,
    /// Faults apply only to files whose path (as opened) contains this
    /// substring; `None` means every file.
    pub path_filter: Option<String>,
}

impl Default for SimFaults {
    /// No injected errors, no latency, torn writes on crash enabled.
    fn default() -> Self {
        SimFaults {
            fail_write_after: None,
            fail_sync_after: None,
            corrupt_read_probability: 0.0,
            read_error_probability: 0.0,
            torn_write_on_crash: true,
            latency: None,
            read_latency: None,
            latency_jitter: None,
            crash_keeps_any_writes: false,
            path_filter: None,
        }
    }
}

impl SimFaults {
    fn applies_to(&self, path: &Path) -> bool {
        match &self.path_filter {
            None => true,
            Some(needle) => path.to_string_lossy().contains(needle.as_str()),
        }
    }
}

/// Counters of what the sim disk has done since [`SimDisk::new`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SimStats {
    /// Successful `write_at` calls.
    pub writes: u64,
    /// Bytes of successful `write_at` calls.
    pub bytes_written: u64,
    /// Successful `read_at` calls.
    pub reads: u64,
    /// Bytes returned by `read_at`.
    pub bytes_read: u64,
    /// Successful `sync_data` calls.
    pub syncs: u64,
    /// Successful `sync_dir` calls.
    pub dir_syncs: u64,
    /// Successful `allocate_zeroed` calls that extended a file.
    pub allocations: u64,
    /// Calls of [`SimDisk::crash`].
    pub crashes: u64,
    /// `write_at` calls failed on purpose.
    pub injected_write_errors: u64,
    /// `sync_data` calls failed on purpose.
    pub injected_sync_errors: u64,
    /// `read_at` calls that returned a flipped bit on purpose.
    pub corrupted_reads: u64,
    /// `read_at` calls failed on purpose (`read_error_probability`).
    pub injected_read_errors: u64,
    /// Blocks left torn (some sectors new, some old) by crashes.
    pub torn_blocks: u64,
}

/// One write made since the file's last successful sync, kept with its data
/// so that a crash can persist a prefix of them in order.
#[derive(Debug)]
struct PendingWrite {
    offset: u64,
    data: Vec<u8>,
}

#[derive(Debug)]
struct Inode {
    /// The latest name, used for the fault path filter and messages.
    path: PathBuf,
    written: Vec<u8>,
    durable: Vec<u8>,
    pending: Vec<PendingWrite>,
    /// Open handles of the current generation.
    open_handles: u64,
}

impl Inode {
    fn new(path: PathBuf) -> Self {
        Inode {
            path,
            written: Vec::new(),
            durable: Vec::new(),
            pending: Vec::new(),
            open_handles: 0,
        }
    }

    /// A whole sync: everything written is durable.
    fn sync_all(&mut self) {
        self.durable = self.written.clone();
        self.pending.clear();
    }

    /// Everything not synced is lost.
    fn drop_unsynced(&mut self) {
        self.written = self.durable.clone();
        self.pending.clear();
    }
}

#[derive(Debug)]
struct State {
    seed: u64,
    rng: SplitMix64,
    faults: SimFaults,
    write_countdown: Option<u64>,
    sync_countdown: Option<u64>,
    /// Incremented by every crash; handles of older generations are dead.
    generation: u64,
    /// Existing directories (always durable). "" and "/" always exist.
    dirs: BTreeSet<PathBuf>,
    /// Current namespace: file path -> inode number.
    names: BTreeMap<PathBuf, u64>,
    /// Namespace a crash returns to.
    durable_names: BTreeMap<PathBuf, u64>,
    inodes: BTreeMap<u64, Inode>,
    next_inode: u64,
    stats: SimStats,
}

fn normalize(path: &Path) -> PathBuf {
    path.components().collect()
}

fn parent_of(path: &Path) -> PathBuf {
    path.parent().map(Path::to_path_buf).unwrap_or_default()
}

fn not_found(what: &str, path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("sim: {what} {}: no such file or directory", path.display()),
    )
}

fn eio(what: &str, path: &Path, seed: u64) -> io::Error {
    io::Error::other(format!(
        "sim: injected EIO on {what} of {} (sim seed {seed})",
        path.display()
    ))
}

fn misaligned(what: &str, path: &Path, offset: u64, len: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!(
            "sim: {what} of {} at offset {offset} with length {len}: offset and length must be \
             multiples of {ALIGN} (O_DIRECT would fail with EINVAL)",
            path.display()
        ),
    )
}

fn is_aligned(n: u64) -> bool {
    n.is_multiple_of(ALIGN as u64)
}

fn to_usize(n: u64, path: &Path) -> io::Result<usize> {
    usize::try_from(n).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("sim: size {n} too large for {}", path.display()),
        )
    })
}

/// Copies `data` into `image` at `offset`, growing it with zeroes as needed.
fn write_image(image: &mut Vec<u8>, offset: usize, data: &[u8]) {
    let end = offset + data.len();
    if image.len() < end {
        image.resize(end, 0);
    }
    image[offset..end].copy_from_slice(data);
}

impl State {
    fn dir_exists(&self, dir: &Path) -> bool {
        dir.as_os_str().is_empty() || dir == Path::new("/") || self.dirs.contains(dir)
    }

    fn inode(&self, ino: u64) -> &Inode {
        self.inodes
            .get(&ino)
            .expect("sim: live handle to a freed inode")
    }

    fn inode_mut(&mut self, ino: u64) -> &mut Inode {
        self.inodes
            .get_mut(&ino)
            .expect("sim: live handle to a freed inode")
    }

    /// Frees an inode once no name (current or durable) and no handle refers to it.
    fn maybe_free(&mut self, ino: u64) {
        let referenced = self.names.values().any(|&i| i == ino)
            || self.durable_names.values().any(|&i| i == ino)
            || self.inodes.get(&ino).is_some_and(|n| n.open_handles > 0);
        if !referenced {
            self.inodes.remove(&ino);
        }
    }
    /// An injected sync failure, if the sync countdown fires for `path`:
    /// the file's unsynced writes are lost (as after a failed fdatasync
    /// the page cache's dirty pages may be) and the sync fails with EIO.
    fn injected_sync_failure(&mut self, ino: u64, path: &Path) -> io::Result<()> {
        if !self.faults.applies_to(path) || !State::countdown_fires(&mut self.sync_countdown) {
            return Ok(());
        }
        self.inode_mut(ino).drop_unsynced();
        self.stats.injected_sync_errors += 1;
        Err(eio("sync_data", path, self.seed))
    }

    /// Counts one matching operation against a one-shot countdown; true if
    /// this operation must fail.
    fn countdown_fires(countdown: &mut Option<u64>) -> bool {
        match countdown {
            None => false,
            Some(0) => {
                *countdown = None;
                true
            }
            Some(n) => {
                *n -= 1;
                false
            }
        }
    }

    /// The durable image of one inode after a power loss.
    fn crash_image(&mut self, ino: u64) -> Vec<u8> {
        let torn_allowed = self.faults.torn_write_on_crash;
        let inode = self.inodes.get_mut(&ino).expect("inode listed");
        let mut image = std::mem::take(&mut inode.durable);
        let pending = std::mem::take(&mut inode.pending);
        let applies = torn_allowed && self.faults.applies_to(&inode.path);
        if !applies || pending.is_empty() {
            return image;
        }
        if self.faults.crash_keeps_any_writes {
            self.keep_any_writes(&mut image, &pending);
            return image;
        }
        let block = ALIGN;
        let total_blocks: u64 = pending
            .iter()
            .map(|w| w.data.len().div_ceil(block) as u64)
            .sum();
        // How many whole blocks, in write order, reached the platter.
        let mut kept = self.rng.below(total_blocks + 1);
        let durable_len = image.len();
        let mut torn = false;
        'writes: for write in &pending {
            for (index, chunk) in write.data.chunks(block).enumerate() {
                let start = write.offset as usize + index * block;
                if kept > 0 {
                    kept -= 1;
                    let end = (start + chunk.len()).min(durable_len);
                    if start < end {
                        image[start..end].copy_from_slice(&chunk[..end - start]);
                    }
                    continue;
                }
                // The first block not kept whole is torn: each sector new or old.
                for (s, sector) in chunk.chunks(SECTOR_BYTES).enumerate() {
                    let sector_start = start + s * SECTOR_BYTES;
                    let new = self.rng.below(2) == 1;
                    let end = (sector_start + sector.len()).min(durable_len);
                    if new && sector_start < end {
                        image[sector_start..end].copy_from_slice(&sector[..end - sector_start]);
                        torn = true;
                    }
                }
                break 'writes;
            }
        }
        if torn {
            self.stats.torn_blocks += 1;
        }
        image
    }
}

impl State {
    /// A crash of a disk with several writes in flight: each pending write
    /// is lost, kept whole, or kept block by block (each block old, new,
    /// or torn sector by sector), independently.
    fn keep_any_writes(&mut self, image: &mut [u8], pending: &[PendingWrite]) {
        let durable_len = image.len();
        let mut torn = false;
        for write in pending {
            let how = self.rng.below(3);
            for (index, chunk) in write.data.chunks(ALIGN).enumerate() {
                let start = write.offset as usize + index * ALIGN;
                let block = match how {
                    0 => 0,
                    1 => 1,
                    _ => self.rng.below(3),
                };
                for (s, sector) in chunk.chunks(SECTOR_BYTES).enumerate() {
                    let new = match block {
                        0 => false,
                        1 => true,
                        _ => self.rng.below(2) == 1,
                    };
                    let sector_start = start + s * SECTOR_BYTES;
                    let end = (sector_start + sector.len()).min(durable_len);
                    if new && sector_start < end {
                        image[sector_start..end].copy_from_slice(&sector[..end - sector_start]);
                        torn |= block == 2;
                    }
                }
            }
        }
        if torn {
            self.stats.torn_blocks += 1;
        }
    }

    /// Makes the pending write of `data` at `offset` (only it) durable.
    /// False if it reaches past the durable length (the caller syncs the
    /// whole file then).
    fn make_write_durable(&mut self, ino: u64, offset: u64, data: &[u8]) -> bool {
        let inode = self.inode_mut(ino);
        let start = offset as usize;
        let end = start + data.len();
        if end > inode.durable.len() {
            return false;
        }
        inode.durable[start..end].copy_from_slice(data);
        if let Some(at) = inode
            .pending
            .iter()
            .position(|w| w.offset == offset && w.data == data)
        {
            inode.pending.remove(at);
        }
        true
    }
}

impl SimDisk {
    /// An empty disk. Faults: none, except torn writes on crash (enabled).
    pub fn new(seed: u64) -> SimDisk {
        SimDisk {
            state: Arc::new(Mutex::new(State {
                seed,
                rng: SplitMix64::new(seed),
                faults: SimFaults::default(),
                write_countdown: None,
                sync_countdown: None,
                generation: 0,
                dirs: BTreeSet::new(),
                names: BTreeMap::new(),
                durable_names: BTreeMap::new(),
                inodes: BTreeMap::new(),
                next_inode: 1,
                stats: SimStats::default(),
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves the sim state consistent
        // enough for the failing test to report; don't cascade the poison.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn seed(&self) -> u64 {
        self.lock().seed
    }

    /// Replaces the injected faults; the write/sync countdowns restart now.
    pub fn set_faults(&self, faults: SimFaults) {
        let mut state = self.lock();
        state.write_countdown = faults.fail_write_after;
        state.sync_countdown = faults.fail_sync_after;
        state.faults = faults;
    }

    /// The faults currently configured (countdowns as originally given).
    pub fn faults(&self) -> SimFaults {
        self.lock().faults.clone()
    }

    /// Simulates power loss (see the module doc for exactly what survives).
    /// Handles opened before the crash fail from now on. The disk can then be
    /// reopened by a new engine instance.
    pub fn crash(&self) {
        let mut state = self.lock();
        state.generation += 1;
        state.stats.crashes += 1;
        let inos: Vec<u64> = state.inodes.keys().copied().collect();
        for ino in inos {
            let image = state.crash_image(ino);
            let inode = state.inode_mut(ino);
            inode.written = image.clone();
            inode.durable = image;
            inode.open_handles = 0;
        }
        state.names = state.durable_names.clone();
        let referenced: BTreeSet<u64> = state.names.values().copied().collect();
        state.inodes.retain(|ino, _| referenced.contains(ino));
        let names: Vec<(PathBuf, u64)> = state
            .names
            .iter()
            .map(|(path, &ino)| (path.clone(), ino))
            .collect();
        for (path, ino) in names {
            state.inode_mut(ino).path = path;
        }
    }

    /// Flips every bit of `offset..offset + len` in both images of `path`
    /// (corruption at rest). Bytes past the end of an image are ignored.
    /// Returns false if there is no such file.
    pub fn corrupt(&self, path: &Path, offset: u64, len: usize) -> bool {
        let mut state = self.lock();
        let Some(&ino) = state.names.get(&normalize(path)) else {
            return false;
        };
        let inode = state.inode_mut(ino);
        for image in [&mut inode.written, &mut inode.durable] {
            let start = usize::try_from(offset)
                .unwrap_or(usize::MAX)
                .min(image.len());
            let end = start.saturating_add(len).min(image.len());
            for byte in &mut image[start..end] {
                *byte ^= 0xFF;
            }
        }
        true
    }

    /// Length of the written image of `path`, if the file exists.
    pub fn file_len(&self, path: &Path) -> Option<u64> {
        let state = self.lock();
        let ino = *state.names.get(&normalize(path))?;
        Some(state.inode(ino).written.len() as u64)
    }

    /// The written image of `path` (what reads return now).
    pub fn read_written(&self, path: &Path) -> Option<Vec<u8>> {
        let state = self.lock();
        let ino = *state.names.get(&normalize(path))?;
        Some(state.inode(ino).written.clone())
    }

    /// The durable image of `path` (its contents as of its last sync; what a
    /// crash keeps apart from torn writes). `None` if no current file has
    /// that name.
    pub fn read_durable(&self, path: &Path) -> Option<Vec<u8>> {
        let state = self.lock();
        let ino = *state.names.get(&normalize(path))?;
        Some(state.inode(ino).durable.clone())
    }

    /// Every file of the current namespace, sorted.
    pub fn files(&self) -> Vec<PathBuf> {
        self.lock().names.keys().cloned().collect()
    }

    pub fn stats(&self) -> SimStats {
        self.lock().stats
    }

    /// The delay `pick` selects from the faults (write or read latency),
    /// if configured and applying to `path`.
    fn delay_for(&self, path: &Path, pick: fn(&SimFaults) -> Option<Duration>) -> Option<Duration> {
        let mut state = self.lock();
        let delay = pick(&state.faults).filter(|_| state.faults.applies_to(path))?;
        let jitter = state
            .faults
            .latency_jitter
            .map_or(0, |j| j.as_nanos() as u64);
        let extra = if jitter > 0 {
            state.rng.below(jitter)
        } else {
            0
        };
        Some(delay + Duration::from_nanos(extra))
    }

    fn open_now(&self, path: &Path, create: bool) -> io::Result<SimFile> {
        let path = normalize(path);
        let mut state = self.lock();
        if state.dir_exists(&path) {
            return Err(io::Error::new(
                io::ErrorKind::IsADirectory,
                format!("sim: open {}: is a directory", path.display()),
            ));
        }
        let ino = match state.names.get(&path) {
            Some(&ino) => ino,
            None if create => {
                if !state.dir_exists(&parent_of(&path)) {
                    return Err(not_found("open (parent directory)", &path));
                }
                let ino = state.next_inode;
                state.next_inode += 1;
                state.inodes.insert(ino, Inode::new(path.clone()));
                state.names.insert(path.clone(), ino);
                ino
            }
            None => return Err(not_found("open", &path)),
        };
        state.inode_mut(ino).open_handles += 1;
        let generation = state.generation;
        drop(state);
        Ok(SimFile {
            disk: self.clone(),
            ino,
            generation,
            path,
        })
    }

    fn remove_file_now(&self, path: &Path) -> io::Result<()> {
        let path = normalize(path);
        let mut state = self.lock();
        let ino = state
            .names
            .remove(&path)
            .ok_or_else(|| not_found("remove_file", &path))?;
        state.maybe_free(ino);
        Ok(())
    }

    fn sync_dir_now(&self, dir: &Path) -> io::Result<()> {
        let dir = normalize(dir);
        let mut state = self.lock();
        if !state.dir_exists(&dir) {
            return Err(not_found("sync_dir", &dir));
        }
        let in_dir = |path: &PathBuf| path.parent() == Some(dir.as_path());
        let gone: Vec<(PathBuf, u64)> = state
            .durable_names
            .iter()
            .filter(|(path, _)| in_dir(path))
            .map(|(path, &ino)| (path.clone(), ino))
            .collect();
        for (path, _) in &gone {
            state.durable_names.remove(path);
        }
        let current: Vec<(PathBuf, u64)> = state
            .names
            .iter()
            .filter(|(path, _)| in_dir(path))
            .map(|(path, &ino)| (path.clone(), ino))
            .collect();
        state.durable_names.extend(current);
        for (_, ino) in gone {
            state.maybe_free(ino);
        }
        state.stats.dir_syncs += 1;
        Ok(())
    }
}

/// Waits out an injected delay on the compio timer.
async fn delay_async(delay: Option<Duration>) {
    if let Some(delay) = delay {
        compio::time::sleep(delay).await;
    }
}

/// Waits out an injected delay by blocking the thread.
fn delay_blocking(delay: Option<Duration>) {
    if let Some(delay) = delay {
        std::thread::sleep(delay);
    }
}

/// A file open on a [`SimDisk`]. Holds the inode, so it keeps working after
/// a rename or removal of its name (like a Unix file descriptor), but not
/// after a crash.
pub struct SimFile {
    disk: SimDisk,
    ino: u64,
    generation: u64,
    /// The path it was opened with (fault filter, messages).
    path: PathBuf,
}

impl std::fmt::Debug for SimFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimFile")
            .field("path", &self.path)
            .field("ino", &self.ino)
            .field("generation", &self.generation)
            .finish()
    }
}

impl SimFile {
    /// Locks the disk and checks that this handle survived no crash.
    fn live(&self) -> io::Result<MutexGuard<'_, State>> {
        let state = self.disk.lock();
        if state.generation != self.generation {
            return Err(io::Error::other(format!(
                "sim: {} was opened before a crash (generation {} now {}); handles do not \
                 survive power loss",
                self.path.display(),
                self.generation,
                state.generation
            )));
        }
        Ok(state)
    }

    /// Checks a write's alignment; the delay it must wait first, if any.
    fn before_write(&self, offset: u64, len: usize) -> io::Result<Option<Duration>> {
        let len = len as u64;
        if !is_aligned(offset) || !is_aligned(len) {
            return Err(misaligned("write_at", &self.path, offset, len));
        }
        Ok(self.disk.delay_for(&self.path, |f| f.latency))
    }

    /// Checks a read's alignment; the delay it must wait first, if any.
    fn before_read(&self, offset: u64, capacity: usize) -> io::Result<Option<Duration>> {
        if !is_aligned(offset) {
            return Err(misaligned("read_at", &self.path, offset, capacity as u64));
        }
        Ok(self.disk.delay_for(&self.path, |f| f.read_latency))
    }

    /// The delay a sync must wait first, if any.
    fn before_sync(&self) -> Option<Duration> {
        self.disk.delay_for(&self.path, |f| f.latency)
    }

    /// The effect of an (aligned, already delayed) write of `data` at `offset`.
    fn apply_write(&self, data: &[u8], offset: u64) -> io::Result<()> {
        let mut state = self.live()?;
        let start = to_usize(offset, &self.path)?;
        let state = &mut *state;
        let matches = state.faults.applies_to(&self.path);
        if matches && State::countdown_fires(&mut state.write_countdown) {
            // A failed write may still have moved some whole blocks.
            let blocks = data.len() / ALIGN;
            let landed = state.rng.below(blocks as u64 + 1) as usize * ALIGN;
            let data = &data[..landed];
            let inode = state.inode_mut(self.ino);
            if landed > 0 {
                write_image(&mut inode.written, start, data);
                inode.pending.push(PendingWrite {
                    offset,
                    data: data.to_vec(),
                });
            }
            state.stats.injected_write_errors += 1;
            return Err(eio("write_at", &self.path, state.seed));
        }
        let inode = state.inode_mut(self.ino);
        write_image(&mut inode.written, start, data);
        if !data.is_empty() {
            inode.pending.push(PendingWrite {
                offset,
                data: data.to_vec(),
            });
        }
        state.stats.writes += 1;
        state.stats.bytes_written += data.len() as u64;
        Ok(())
    }

    /// The effect of an (aligned, already delayed) read into `buf` at `offset`.
    fn apply_read(&self, buf: &mut AlignedBuf, offset: u64) -> io::Result<usize> {
        let mut state = self.live()?;
        let state = &mut *state;
        let matches = state.faults.applies_to(&self.path);
        // Draw from the RNG only when the fault is enabled, so that seeds of
        // runs without it keep their meaning.
        let p_error = state.faults.read_error_probability;
        if matches && p_error > 0.0 && state.rng.unit() < p_error {
            state.stats.injected_read_errors += 1;
            return Err(eio("read_at", &self.path, state.seed));
        }
        let image = &state.inode(self.ino).written;
        let start = usize::try_from(offset)
            .unwrap_or(usize::MAX)
            .min(image.len());
        let count = (image.len() - start).min(buf.capacity());
        buf.spare_mut()[..count].copy_from_slice(&image[start..start + count]);
        buf.set_len(count);
        let p = state.faults.corrupt_read_probability;
        if count > 0 && p > 0.0 && matches && state.rng.unit() < p {
            let bit = state.rng.below(count as u64 * 8);
            buf.as_mut_slice()[(bit / 8) as usize] ^= 1 << (bit % 8);
            state.stats.corrupted_reads += 1;
        }
        state.stats.reads += 1;
        state.stats.bytes_read += count as u64;
        Ok(count)
    }

    /// The effect of an (already delayed) durable write's sync: only the
    /// write itself becomes durable (see the module doc).
    fn apply_durable_write(&self, data: &[u8], offset: u64) -> io::Result<()> {
        let mut state = self.live()?;
        let state = &mut *state;
        state.injected_sync_failure(self.ino, &self.path)?;
        if !state.make_write_durable(self.ino, offset, data) {
            // Past the durable length: the size change needs a whole sync.
            state.inode_mut(self.ino).sync_all();
        }
        state.stats.syncs += 1;
        Ok(())
    }

    /// The effect of an (already delayed) `sync_data`.
    fn apply_sync(&self) -> io::Result<()> {
        let mut state = self.live()?;
        let state = &mut *state;
        state.injected_sync_failure(self.ino, &self.path)?;
        state.inode_mut(self.ino).sync_all();
        state.stats.syncs += 1;
        Ok(())
    }
}

impl Drop for SimFile {
    fn drop(&mut self) {
        let mut state = self.disk.lock();
        if state.generation == self.generation {
            if let Some(inode) = state.inodes.get_mut(&self.ino) {
                inode.open_handles -= 1;
            }
            state.maybe_free(self.ino);
        }
    }
}

impl Disk for SimDisk {
    type File = SimFile;

    fn new_table_hash_key(&self) -> io::Result<[u8; crate::hash::TABLE_HASH_KEY_BYTES]> {
        // A stream of its own, so the fault RNG's draws keep their meaning.
        let mut rng = SplitMix64::new(self.seed() ^ 0x7461_626c_6568_6173);
        let mut key = [0u8; crate::hash::TABLE_HASH_KEY_BYTES];
        key[..8].copy_from_slice(&rng.next_u64().to_le_bytes());
        key[8..].copy_from_slice(&rng.next_u64().to_le_bytes());
        Ok(key)
    }

    fn new_dir_id(&self) -> io::Result<crate::layout::DirId> {
        // A stream of its own, like the table hash key's.
        let mut rng = SplitMix64::new(self.seed() ^ 0x6469_7269_6465_6e74);
        Ok(rng.next_u64().max(1))
    }

    async fn open(&self, path: &Path, create: bool) -> io::Result<SimFile> {
        self.open_now(path, create)
    }

    fn open_blocking(&self, path: &Path, create: bool) -> io::Result<SimFile> {
        self.open_now(path, create)
    }

    async fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.remove_file_now(path)
    }

    fn remove_file_blocking(&self, path: &Path) -> io::Result<()> {
        self.remove_file_now(path)
    }

    async fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let from = normalize(from);
        let to = normalize(to);
        let mut state = self.lock();
        let Some(&ino) = state.names.get(&from) else {
            return Err(not_found("rename (source)", &from));
        };
        if !state.dir_exists(&parent_of(&to)) {
            return Err(not_found("rename (target directory)", &to));
        }
        if state.dir_exists(&to) {
            return Err(io::Error::new(
                io::ErrorKind::IsADirectory,
                format!("sim: rename onto {}: is a directory", to.display()),
            ));
        }
        if from == to {
            return Ok(());
        }
        state.names.remove(&from);
        let replaced = state.names.insert(to.clone(), ino);
        state.inode_mut(ino).path = to;
        if let Some(old) = replaced {
            state.maybe_free(old);
        }
        Ok(())
    }

    async fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.sync_dir_now(dir)
    }

    fn sync_dir_blocking(&self, dir: &Path) -> io::Result<()> {
        self.sync_dir_now(dir)
    }

    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        let dir = normalize(dir);
        let mut state = self.lock();
        for ancestor in dir.ancestors() {
            if state.names.contains_key(ancestor) {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!(
                        "sim: create_dir_all {}: {} is a file",
                        dir.display(),
                        ancestor.display()
                    ),
                ));
            }
        }
        for ancestor in dir.ancestors() {
            if !ancestor.as_os_str().is_empty() && ancestor != Path::new("/") {
                state.dirs.insert(ancestor.to_path_buf());
            }
        }
        Ok(())
    }

    fn list_dir(&self, dir: &Path) -> io::Result<Vec<PathBuf>> {
        let dir = normalize(dir);
        let state = self.lock();
        if !state.dir_exists(&dir) {
            return Err(not_found("list_dir", &dir));
        }
        Ok(state
            .names
            .keys()
            .filter(|path| path.parent() == Some(dir.as_path()))
            .cloned()
            .collect())
    }

    fn exists(&self, path: &Path) -> bool {
        let path = normalize(path);
        let state = self.lock();
        state.names.contains_key(&path) || state.dir_exists(&path)
    }
}

impl DiskFile for SimFile {
    async fn write_at(&self, buf: AlignedBuf, offset: u64) -> (io::Result<()>, AlignedBuf) {
        let result = match self.before_write(offset, buf.len()) {
            Ok(delay) => {
                delay_async(delay).await;
                self.apply_write(buf.as_slice(), offset)
            }
            Err(err) => Err(err),
        };
        (result, buf)
    }

    fn write_at_blocking(&self, buf: &AlignedBuf, offset: u64) -> io::Result<()> {
        delay_blocking(self.before_write(offset, buf.len())?);
        self.apply_write(buf.as_slice(), offset)
    }

    async fn read_at(&self, mut buf: AlignedBuf, offset: u64) -> (io::Result<usize>, AlignedBuf) {
        let result = match self.before_read(offset, buf.capacity()) {
            Ok(delay) => {
                delay_async(delay).await;
                self.apply_read(&mut buf, offset)
            }
            Err(err) => Err(err),
        };
        (result, buf)
    }

    fn read_at_blocking(&self, buf: &mut AlignedBuf, offset: u64) -> io::Result<usize> {
        delay_blocking(self.before_read(offset, buf.capacity())?);
        self.apply_read(buf, offset)
    }

    async fn write_at_durable(&self, buf: AlignedBuf, offset: u64) -> (io::Result<()>, AlignedBuf) {
        let (result, buf) = self.write_at(buf, offset).await;
        if result.is_err() {
            return (result, buf);
        }
        delay_async(self.before_sync()).await;
        let result = self.apply_durable_write(buf.as_slice(), offset);
        (result, buf)
    }

    async fn sync_data(&self) -> io::Result<()> {
        delay_async(self.before_sync()).await;
        self.apply_sync()
    }

    fn sync_data_blocking(&self) -> io::Result<()> {
        delay_blocking(self.before_sync());
        self.apply_sync()
    }

    async fn allocate_zeroed(&self, len: u64) -> io::Result<()> {
        if !is_aligned(len) {
            return Err(misaligned("allocate_zeroed", &self.path, 0, len));
        }
        let new_len = to_usize(len, &self.path)?;
        let mut state = self.live()?;
        let inode = state.inode_mut(self.ino);
        if inode.written.len() < new_len {
            inode.written.resize(new_len, 0);
            state.stats.allocations += 1;
        }
        Ok(())
    }

    async fn set_len(&self, len: u64) -> io::Result<()> {
        let new_len = to_usize(len, &self.path)?;
        let mut state = self.live()?;
        let inode = state.inode_mut(self.ino);
        inode.written.resize(new_len, 0);
        // Unsynced writes past the new end are gone from the written image;
        // a crash must not bring them back either.
        for write in &mut inode.pending {
            let keep = new_len.saturating_sub(write.offset as usize);
            write.data.truncate(keep);
        }
        inode.pending.retain(|w| !w.data.is_empty());
        Ok(())
    }

    async fn len(&self) -> io::Result<u64> {
        let state = self.live()?;
        Ok(state.inode(self.ino).written.len() as u64)
    }
}

/// What a crash left on a [`SimDisk`]: its directories, every file's
/// contents and the position of its random stream. Saved after a crash
/// ([`SimDisk::image`]) and put back in place of one ([`SimDisk::restore`]),
/// it lets a test replay a run whose crash points thread timing decided:
/// the recovery that follows, and everything after it that does not depend
/// on timing, repeats exactly.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimImage {
    rng_state: u64,
    dirs: Vec<PathBuf>,
    files: Vec<(PathBuf, Vec<u8>)>,
}

/// Why bytes could not be read as a [`SimImage`].
#[derive(Debug, thiserror::Error)]
#[error("sim image: {0}")]
pub struct SimImageError(String);

const IMAGE_MAGIC: &[u8; 8] = b"RKVSIMG1";

impl SimImage {
    /// The image as bytes: a magic, the random stream's position, then the
    /// directories and the files, each length-prefixed (little endian).
    pub fn encode(&self, out: &mut Vec<u8>) {
        fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
            out.extend_from_slice(&(b.len() as u64).to_le_bytes());
            out.extend_from_slice(b);
        }
        out.extend_from_slice(IMAGE_MAGIC);
        out.extend_from_slice(&self.rng_state.to_le_bytes());
        out.extend_from_slice(&(self.dirs.len() as u64).to_le_bytes());
        for d in &self.dirs {
            put_bytes(out, d.as_os_str().as_encoded_bytes());
        }
        out.extend_from_slice(&(self.files.len() as u64).to_le_bytes());
        for (path, data) in &self.files {
            put_bytes(out, path.as_os_str().as_encoded_bytes());
            put_bytes(out, data);
        }
    }

    /// Reads an image [`SimImage::encode`] wrote from the front of `input`,
    /// advancing it; anything else is an error, never a panic.
    pub fn decode(input: &mut &[u8]) -> Result<SimImage, SimImageError> {
        fn take<'a>(input: &mut &'a [u8], n: u64, what: &str) -> Result<&'a [u8], SimImageError> {
            let n = usize::try_from(n)
                .ok()
                .filter(|&n| n <= input.len())
                .ok_or_else(|| SimImageError(format!("{what} runs past the end")))?;
            let (head, rest) = input.split_at(n);
            *input = rest;
            Ok(head)
        }
        fn u64_of(input: &mut &[u8], what: &str) -> Result<u64, SimImageError> {
            let b = take(input, 8, what)?;
            Ok(u64::from_le_bytes(b.try_into().expect("8 bytes")))
        }
        fn path_of(input: &mut &[u8]) -> Result<PathBuf, SimImageError> {
            let n = u64_of(input, "a path's length")?;
            let b = take(input, n, "a path")?;
            let s = std::str::from_utf8(b)
                .map_err(|_| SimImageError("a path is not UTF-8".to_string()))?;
            Ok(PathBuf::from(s))
        }
        if take(input, 8, "the magic")? != IMAGE_MAGIC {
            return Err(SimImageError("not a sim image (bad magic)".to_string()));
        }
        let rng_state = u64_of(input, "the random state")?;
        let dir_count = u64_of(input, "the directory count")?;
        let mut dirs = Vec::new();
        for _ in 0..dir_count {
            dirs.push(path_of(input)?);
        }
        let file_count = u64_of(input, "the file count")?;
        let mut files = Vec::new();
        for _ in 0..file_count {
            let path = path_of(input)?;
            let n = u64_of(input, "a file's length")?;
            files.push((path, take(input, n, "a file's contents")?.to_vec()));
        }
        Ok(SimImage {
            rng_state,
            dirs,
            files,
        })
    }
}

impl SimDisk {
    /// The disk as a crash left it. Call right after [`SimDisk::crash`]
    /// (or with no write unsynced): only durable state is saved.
    pub fn image(&self) -> SimImage {
        let state = self.lock();
        SimImage {
            rng_state: state.rng.state(),
            dirs: state.dirs.iter().cloned().collect(),
            files: state
                .durable_names
                .iter()
                .map(|(path, &ino)| (path.clone(), state.inode(ino).durable.clone()))
                .collect(),
        }
    }

    /// Puts `image` in place of whatever the disk holds, as a crash would:
    /// handles opened before are dead from now on. Faults, countdowns and
    /// counters are kept (the crash counter counts this as one).
    pub fn restore(&self, image: &SimImage) {
        let mut state = self.lock();
        state.generation += 1;
        state.stats.crashes += 1;
        state.rng = SplitMix64::new(image.rng_state);
        state.dirs = image.dirs.iter().cloned().collect();
        state.inodes.clear();
        state.names.clear();
        for (path, data) in &image.files {
            let ino = state.next_inode;
            state.next_inode += 1;
            let mut inode = Inode::new(path.clone());
            inode.written = data.clone();
            inode.durable = data.clone();
            state.inodes.insert(ino, inode);
            state.names.insert(path.clone(), ino);
        }
        state.durable_names = state.names.clone();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(byte: u8, blocks: usize) -> AlignedBuf {
        let mut buf = AlignedBuf::with_capacity(blocks * ALIGN);
        buf.extend_from_slice(&vec![byte; blocks * ALIGN]);
        buf
    }

    #[test]
    fn written_vs_durable() {
        pollster::block_on(async {
            let disk = SimDisk::new(1);
            disk.create_dir_all(Path::new("/d")).unwrap();
            let f = disk.open(Path::new("/d/f"), true).await.unwrap();
            let (r, _) = f.write_at(block(7, 1), 0).await;
            r.unwrap();
            assert_eq!(
                disk.read_written(Path::new("/d/f")).unwrap(),
                vec![7; ALIGN]
            );
            assert_eq!(
                disk.read_durable(Path::new("/d/f")).unwrap(),
                Vec::<u8>::new()
            );
            f.sync_data().await.unwrap();
            assert_eq!(
                disk.read_durable(Path::new("/d/f")).unwrap(),
                vec![7; ALIGN]
            );
        });
    }

    #[test]
    fn an_image_restores_what_the_crash_left_and_round_trips_as_bytes() {
        pollster::block_on(async {
            let disk = SimDisk::new(9);
            disk.create_dir_all(Path::new("/d")).unwrap();
            let f = disk.open(Path::new("/d/f"), true).await.unwrap();
            let (r, _) = f.write_at(block(1, 2), 0).await;
            r.unwrap();
            f.sync_data().await.unwrap();
            disk.sync_dir(Path::new("/d")).await.unwrap();
            let (r, _) = f.write_at(block(2, 1), 0).await;
            r.unwrap();
            disk.crash();
            let image = disk.image();
            let mut bytes = Vec::new();
            image.encode(&mut bytes);
            let mut input = &bytes[..];
            assert_eq!(SimImage::decode(&mut input).unwrap(), image);
            assert!(input.is_empty());

            // Another disk with other contents becomes the crashed one.
            let other = SimDisk::new(1);
            other.create_dir_all(Path::new("/e")).unwrap();
            let g = other.open(Path::new("/e/g"), true).await.unwrap();
            other.restore(&image);
            assert!(g.len().await.is_err(), "a handle from before is dead");
            assert_eq!(other.files(), disk.files());
            assert_eq!(
                other.read_durable(Path::new("/d/f")),
                disk.read_durable(Path::new("/d/f"))
            );
            assert_eq!(other.image(), image);

            // Damaged bytes are an error, never a panic.
            for cut in 0..bytes.len() {
                let mut input = &bytes[..cut];
                assert!(SimImage::decode(&mut input).is_err(), "cut at {cut}");
            }
            let mut bad = bytes.clone();
            bad[0] ^= 1;
            assert!(SimImage::decode(&mut &bad[..]).is_err());
        });
    }
}
