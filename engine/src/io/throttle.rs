//! Disk profiles enforced at the I/O layer: a [`Device`] per configured
//! `[devices.NAME]`, shared by every shard that places files on it (like one
//! physical disk), and [`Throttled`], a [`Disk`] wrapper whose files take
//! their I/O budget from a device before each operation.
//!
//! What counts as one I/O (the rule of `tunables::ProfileConfig`): a read or
//! write of `len` bytes costs `max(1, ceil(len / io_unit))` I/Os and `len`
//! bytes of bandwidth; an fdatasync (and a directory fsync) costs 1 I/O when
//! `count_fsync`; `allocate_zeroed` costs the zero bytes it writes, admitted
//! [`ZERO_FILL_PIECE_BYTES`] at a time. Reads are charged for the buffer's
//! capacity (the most they can transfer).
//!
//! When the fdatasync is charged: a file's first write after its last
//! fdatasync reserves the next fdatasync's I/O together with its own, and
//! that fdatasync then goes without asking the device again. The counts are
//! the same (one I/O per fdatasync); what changes is that a WAL flush (write,
//! then fdatasync) waits for tokens once instead of twice. Waiting twice
//! made each flush pay two timer wake-ups and two token slots one after the
//! other, so a shard with one flush in flight could not keep a profile busy:
//! two shards of unbatched sync writers reached 78% of `sas`'s 5,000
//! I/Os/s (and 70% of `nvme`'s 16,000) while waiting for tokens a third of
//! the time; with the fdatasync charged with its write they reach the
//! profile's rate (docs/benchmarks.md, issue 9). A file written and never
//! synced is charged one fdatasync too many, once.
//!
//! What must hold: an unlimited profile never waits and takes no lock; a
//! limited one admits I/O exactly as the token buckets of [`Limiter`] allow
//! (IOPS with burst credit, and bandwidth), in FIFO order; waiting is a
//! compio timer, never a blocked thread, so the shard's other tasks run.
//! Tokens are spent when reserved: a dropped future keeps its reservation.
//!
//! The blocking variants (`*_blocking`) are the one exception to "never a
//! blocked thread": they exist for synchronous callers, so they reserve from
//! the same [`Limiter`] and then sleep the thread until the admission time.
//! Costs, the fdatasync prepayment and every metric are computed by the same
//! code for both kinds of call, so a device's budget and numbers cover them
//! together.

mod limiter;

/// Zero bytes one admission of [`DiskFile::allocate_zeroed`] pays for: a
/// 64 MiB segment paid at once held every later I/O of its device for
/// 174 ms on `nvme`.
pub const ZERO_FILL_PIECE_BYTES: u64 = 4 << 20;

const _: () = assert!(ZERO_FILL_PIECE_BYTES.is_multiple_of(super::ALIGN as u64));

pub use crate::histogram::{AtomicHistogram, HistogramSnapshot, HISTOGRAM_BUCKETS};
pub use limiter::{Limiter, PACING_WINDOW_NS};

use super::{AlignedBuf, Disk, DiskFile};
use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tunables::{Config, ProfileConfig};

/// Why the configured devices cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DeviceError {
    #[error(
        "devices.{device}.profile = \"{profile}\": no profile by that name (known: {})",
        known.join(", ")
    )]
    UnknownProfile {
        device: String,
        profile: String,
        known: Vec<String>,
    },
    #[error("devices.{device}.profile = \"{profile}\" is not a valid profile: {reason}")]
    InvalidProfile {
        device: String,
        profile: String,
        reason: String,
    },
}

/// Counters of one device, updated with relaxed atomics from any thread.
#[derive(Default)]
struct DeviceCounters {
    reads: AtomicU64,
    writes: AtomicU64,
    syncs: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    ios_admitted: AtomicU64,
    wait_ns_total: AtomicU64,
    waits: AtomicU64,
    errors: AtomicU64,
}

/// A copy of a device's metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeviceMetricsSnapshot {
    /// Completed `read_at` calls.
    pub reads: u64,
    /// Completed `write_at` calls (zero-fill writes of `allocate_zeroed` excluded).
    pub writes: u64,
    /// Completed `sync_data` and `sync_dir` calls.
    pub syncs: u64,
    pub bytes_read: u64,
    /// Bytes of `write_at` and `allocate_zeroed`.
    pub bytes_written: u64,
    /// I/O units admitted by the profile (see the module doc for the rule).
    pub ios_admitted: u64,
    /// Total time operations waited for tokens, in nanoseconds.
    pub wait_ns_total: u64,
    /// Operations that had to wait for tokens.
    pub waits: u64,
    /// Operations that returned an error from the backend.
    pub errors: u64,
    /// Burst credit (I/Os) held now; `None` when the profile has no IOPS limit.
    pub credit: Option<u64>,
    /// Latency of `sync_data` as the caller sees it (token wait included).
    pub fsync_latency: HistogramSnapshot,
    /// Latency of `write_at` as the caller sees it (token wait included).
    pub write_latency: HistogramSnapshot,
}

/// One emulated (or real, when unthrottled) disk.
pub struct Device {
    name: String,
    dir: PathBuf,
    profile_name: String,
    profile: ProfileConfig,
    /// `None` when the profile limits nothing: no lock, no wait.
    limiter: Option<Mutex<Limiter>>,
    /// The share of the profile that moves of records between devices may
    /// take (`storage.hot_move_percent`), on top of `limiter`: a mover
    /// looks first ([`Device::move_wait`]) and goes only when it fits.
    /// `None` when the profile limits nothing, or no share was set
    /// ([`Device::with_move_percent`]): then moves have only `limiter`.
    moves: Option<Mutex<Limiter>>,
    epoch: Instant,
    counters: DeviceCounters,
    fsync_latency: AtomicHistogram,
    write_latency: AtomicHistogram,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("name", &self.name)
            .field("dir", &self.dir)
            .field("profile_name", &self.profile_name)
            .field("profile", &self.profile)
            .finish()
    }
}

impl Device {
    /// A device named `name` whose files live under `dir`, with the profile
    /// `profile` (called `profile_name` in reports). Its buckets start full.
    pub fn new(
        name: impl Into<String>,
        dir: impl Into<PathBuf>,
        profile_name: impl Into<String>,
        profile: ProfileConfig,
    ) -> Result<Device, DeviceError> {
        let name = name.into();
        let profile_name = profile_name.into();
        profile
            .validate(&profile_name)
            .map_err(|e| DeviceError::InvalidProfile {
                device: name.clone(),
                profile: profile_name.clone(),
                reason: e.to_string(),
            })?;
        let limiter = Limiter::new(&profile);
        Ok(Device {
            name,
            dir: dir.into(),
            profile_name,
            moves: None,
            limiter: (!limiter.is_unlimited()).then(|| Mutex::new(limiter)),
            profile,
            epoch: Instant::now(),
            counters: DeviceCounters::default(),
            fsync_latency: AtomicHistogram::new(),
            write_latency: AtomicHistogram::new(),
        })
    }

    /// This device with moves of records between devices held to
    /// `percent` (1..=100) of its profile (`storage.hot_move_percent`).
    pub fn with_move_percent(mut self, percent: u32) -> Device {
        if self.limiter.is_some() {
            self.moves = Some(Mutex::new(Limiter::new(&share_of(&self.profile, percent))));
        }
        self
    }

    /// How long until a move's I/O of `len` bytes fits this device's share
    /// for moves; zero when it fits now (or nothing limits the device).
    /// Takes nothing: [`take_move`](Self::take_move) does.
    pub fn move_wait(&self, len: u64) -> Duration {
        let Some(moves) = &self.moves else {
            return Duration::ZERO;
        };
        let now = self.now_ns();
        let wait = moves
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .wait_ns(now, self.ios_for_len(len), len);
        Duration::from_nanos(wait)
    }

    /// Counts a move's I/O of `len` bytes against this device's share for
    /// moves (the I/O itself then asks the device as any other does).
    pub fn take_move(&self, len: u64) {
        if let Some(moves) = &self.moves {
            let now = self.now_ns();
            moves
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .reserve(now, self.ios_for_len(len), len);
        }
    }

    /// The key of `[devices]` this device was built from.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Directory of the device (the data directory when the config left it empty).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn profile_name(&self) -> &str {
        &self.profile_name
    }

    pub fn profile(&self) -> &ProfileConfig {
        &self.profile
    }

    /// Whether this device never waits (profile limits nothing).
    pub fn is_unlimited(&self) -> bool {
        self.limiter.is_none()
    }

    fn now_ns(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Waits (on the compio timer) until the device admits an operation of
    /// `ios` I/O units and `bytes` bytes. Returns at once when unlimited or
    /// when the cost is zero. Needs a compio runtime only when it must wait.
    pub async fn acquire(&self, ios: u64, bytes: u64) {
        if let Some(admit) = self.reserve(ios, bytes) {
            compio::time::sleep_until(admit).await;
        }
    }

    /// [`acquire`](Self::acquire) for synchronous callers: the same
    /// reservation, but the admission delay blocks the calling thread.
    pub fn acquire_blocking(&self, ios: u64, bytes: u64) {
        if let Some(admit) = self.reserve(ios, bytes) {
            std::thread::sleep(admit.saturating_duration_since(Instant::now()));
        }
    }

    /// Reserves the cost with the limiter and counts it; the instant the
    /// operation may start, when that is later than now.
    fn reserve(&self, ios: u64, bytes: u64) -> Option<Instant> {
        let Some(limiter) = &self.limiter else {
            self.counters.ios_admitted.fetch_add(ios, Ordering::Relaxed);
            return None;
        };
        if ios == 0 && bytes == 0 {
            return None;
        }
        let now = self.now_ns();
        let admit = limiter
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .reserve(now, ios, bytes);
        self.counters.ios_admitted.fetch_add(ios, Ordering::Relaxed);
        if admit <= now {
            return None;
        }
        self.counters.waits.fetch_add(1, Ordering::Relaxed);
        self.counters
            .wait_ns_total
            .fetch_add(admit - now, Ordering::Relaxed);
        Some(self.epoch + Duration::from_nanos(admit))
    }

    /// I/O units a read or write of `len` bytes costs.
    pub fn ios_for_len(&self, len: u64) -> u64 {
        self.profile.ios_for_len(len)
    }

    /// Current metrics. Counters are read with relaxed loads; the credit
    /// takes the device lock briefly.
    pub fn metrics(&self) -> DeviceMetricsSnapshot {
        let c = &self.counters;
        let credit = self.limiter.as_ref().and_then(|l| {
            let now = self.now_ns();
            l.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .credit_at(now)
        });
        DeviceMetricsSnapshot {
            reads: c.reads.load(Ordering::Relaxed),
            writes: c.writes.load(Ordering::Relaxed),
            syncs: c.syncs.load(Ordering::Relaxed),
            bytes_read: c.bytes_read.load(Ordering::Relaxed),
            bytes_written: c.bytes_written.load(Ordering::Relaxed),
            ios_admitted: c.ios_admitted.load(Ordering::Relaxed),
            wait_ns_total: c.wait_ns_total.load(Ordering::Relaxed),
            waits: c.waits.load(Ordering::Relaxed),
            errors: c.errors.load(Ordering::Relaxed),
            credit,
            fsync_latency: self.fsync_latency.snapshot(),
            write_latency: self.write_latency.snapshot(),
        }
    }

    fn count_result<T>(&self, result: &io::Result<T>) {
        if result.is_err() {
            self.counters.errors.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Metrics of a finished `write_at` of `len` bytes begun at `started`.
    fn record_write(&self, result: &io::Result<()>, len: u64, started: Instant) {
        self.count_result(result);
        if result.is_ok() {
            self.counters.writes.fetch_add(1, Ordering::Relaxed);
            self.counters
                .bytes_written
                .fetch_add(len, Ordering::Relaxed);
            self.write_latency.record_duration(started.elapsed());
        }
    }

    /// Metrics of a finished `read_at`.
    fn record_read(&self, result: &io::Result<usize>) {
        self.count_result(result);
        if let Ok(n) = result {
            self.counters.reads.fetch_add(1, Ordering::Relaxed);
            self.counters
                .bytes_read
                .fetch_add(*n as u64, Ordering::Relaxed);
        }
    }

    /// Metrics of a finished `sync_data` begun at `started`, or of a
    /// `sync_dir` (`started` = `None`: no latency sample).
    fn record_sync(&self, result: &io::Result<()>, started: Option<Instant>) {
        self.count_result(result);
        if result.is_ok() {
            self.counters.syncs.fetch_add(1, Ordering::Relaxed);
            if let Some(started) = started {
                self.fsync_latency.record_duration(started.elapsed());
            }
        }
    }
}

/// `percent` of `profile`'s rates and burst (each at least 1 where the
/// profile limits it): what moves between devices may take of it.
fn share_of(profile: &ProfileConfig, percent: u32) -> ProfileConfig {
    let percent = u64::from(percent.clamp(1, 100));
    let part = |v: u64| {
        if v == 0 {
            0
        } else {
            (v * percent / 100).max(1)
        }
    };
    ProfileConfig {
        iops: part(profile.iops),
        burst_iops: part(profile.burst_iops),
        burst_credit: profile.burst_credit * percent / 100,
        bytes_per_sec: tunables::ByteSize(part(profile.bytes_per_sec.0)),
        ..profile.clone()
    }
}

/// Builds one [`Device`] per `[devices.NAME]` of `config` (an empty `path`
/// means the data directory). Fails on an unknown or invalid profile.
pub fn build_devices(config: &Config) -> Result<BTreeMap<String, Arc<Device>>, DeviceError> {
    let mut devices = BTreeMap::new();
    for (name, device) in &config.devices {
        let profile =
            config
                .profile(&device.profile)
                .ok_or_else(|| DeviceError::UnknownProfile {
                    device: name.clone(),
                    profile: device.profile.clone(),
                    known: tunables::builtin_profile_names()
                        .iter()
                        .map(|s| s.to_string())
                        .chain(config.profiles.keys().cloned())
                        .collect(),
                })?;
        let dir = if device.path.as_os_str().is_empty() {
            config.storage.data_dir.clone()
        } else {
            device.path.clone()
        };
        let built = Device::new(name.clone(), dir, device.profile.clone(), profile)?
            .with_move_percent(config.storage.hot_move_percent);
        devices.insert(name.clone(), Arc::new(built));
    }
    Ok(devices)
}

/// A [`Disk`] whose operations are admitted by a [`Device`].
#[derive(Clone, Debug)]
pub struct Throttled<D: Disk> {
    inner: D,
    device: Arc<Device>,
}

impl<D: Disk> Throttled<D> {
    pub fn new(inner: D, device: Arc<Device>) -> Self {
        Throttled { inner, device }
    }

    fn wrap(&self, inner: D::File) -> ThrottledFile<D::File> {
        ThrottledFile {
            inner,
            device: self.device.clone(),
            sync_prepaid: std::cell::Cell::new(false),
        }
    }

    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }

    pub fn inner(&self) -> &D {
        &self.inner
    }
}

/// A file of a [`Throttled`] disk.
pub struct ThrottledFile<F: DiskFile> {
    inner: F,
    device: Arc<Device>,
    /// The next fdatasync's I/O was reserved by a write (see the module doc).
    /// A file belongs to one shard thread: a `Cell` is enough.
    sync_prepaid: std::cell::Cell<bool>,
}

impl<F: DiskFile> ThrottledFile<F> {
    pub fn inner(&self) -> &F {
        &self.inner
    }

    /// I/O units a write of `len` bytes reserves: its own, plus the next
    /// fdatasync's when it is the first write since the last one (see the
    /// module doc).
    fn write_ios(&self, len: u64) -> u64 {
        let prepay = if self.sync_prepaid.get() {
            0
        } else {
            self.device.profile.ios_for_fsync()
        };
        if prepay > 0 {
            self.sync_prepaid.set(true);
        }
        self.device.ios_for_len(len) + prepay
    }

    /// I/O units an fdatasync reserves: none when a write prepaid it.
    fn sync_ios(&self) -> u64 {
        if self.sync_prepaid.replace(false) {
            0
        } else {
            self.device.profile.ios_for_fsync()
        }
    }
}

impl<F: DiskFile + std::fmt::Debug> std::fmt::Debug for ThrottledFile<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThrottledFile")
            .field("inner", &self.inner)
            .field("device", &self.device.name)
            .finish()
    }
}

impl<D: Disk> Disk for Throttled<D> {
    type File = ThrottledFile<D::File>;

    async fn open(&self, path: &Path, create: bool) -> io::Result<Self::File> {
        Ok(self.wrap(self.inner.open(path, create).await?))
    }

    fn open_blocking(&self, path: &Path, create: bool) -> io::Result<Self::File> {
        Ok(self.wrap(self.inner.open_blocking(path, create)?))
    }

    async fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.inner.remove_file(path).await
    }

    fn remove_file_blocking(&self, path: &Path) -> io::Result<()> {
        self.inner.remove_file_blocking(path)
    }

    async fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.inner.rename(from, to).await
    }

    async fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let device = &self.device;
        device.acquire(device.profile.ios_for_fsync(), 0).await;
        let result = self.inner.sync_dir(dir).await;
        device.record_sync(&result, None);
        result
    }

    fn sync_dir_blocking(&self, dir: &Path) -> io::Result<()> {
        let device = &self.device;
        device.acquire_blocking(device.profile.ios_for_fsync(), 0);
        let result = self.inner.sync_dir_blocking(dir);
        device.record_sync(&result, None);
        result
    }

    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        self.inner.create_dir_all(dir)
    }

    fn list_dir(&self, dir: &Path) -> io::Result<Vec<PathBuf>> {
        self.inner.list_dir(dir)
    }

    fn move_wait(&self, len: u64) -> Duration {
        self.device.move_wait(len)
    }

    fn take_move(&self, len: u64) {
        self.device.take_move(len);
    }

    fn exists(&self, path: &Path) -> bool {
        self.inner.exists(path)
    }
}

impl<F: DiskFile> DiskFile for ThrottledFile<F> {
    async fn write_at(&self, buf: AlignedBuf, offset: u64) -> (io::Result<()>, AlignedBuf) {
        let started = Instant::now();
        let len = buf.len() as u64;
        self.device.acquire(self.write_ios(len), len).await;
        let (result, buf) = self.inner.write_at(buf, offset).await;
        self.device.record_write(&result, len, started);
        (result, buf)
    }

    async fn write_at_durable(&self, buf: AlignedBuf, offset: u64) -> (io::Result<()>, AlignedBuf) {
        // Paid as the write and the fdatasync it replaces.
        let started = Instant::now();
        let len = buf.len() as u64;
        self.device
            .acquire(self.write_ios(len) + self.sync_ios(), len)
            .await;
        let (result, buf) = self.inner.write_at_durable(buf, offset).await;
        self.device.record_write(&result, len, started);
        if result.is_ok() {
            // (An error is counted once, by the write.)
            self.device.record_sync(&result, Some(started));
        }
        (result, buf)
    }

    fn write_at_blocking(&self, buf: &AlignedBuf, offset: u64) -> io::Result<()> {
        let started = Instant::now();
        let len = buf.len() as u64;
        self.device.acquire_blocking(self.write_ios(len), len);
        let result = self.inner.write_at_blocking(buf, offset);
        self.device.record_write(&result, len, started);
        result
    }

    async fn read_at(&self, buf: AlignedBuf, offset: u64) -> (io::Result<usize>, AlignedBuf) {
        let len = buf.capacity() as u64;
        self.device.acquire(self.device.ios_for_len(len), len).await;
        let (result, buf) = self.inner.read_at(buf, offset).await;
        self.device.record_read(&result);
        (result, buf)
    }

    fn read_at_blocking(&self, buf: &mut AlignedBuf, offset: u64) -> io::Result<usize> {
        let len = buf.capacity() as u64;
        self.device
            .acquire_blocking(self.device.ios_for_len(len), len);
        let result = self.inner.read_at_blocking(buf, offset);
        self.device.record_read(&result);
        result
    }

    async fn sync_data(&self) -> io::Result<()> {
        let started = Instant::now();
        self.device.acquire(self.sync_ios(), 0).await;
        let result = self.inner.sync_data().await;
        self.device.record_sync(&result, Some(started));
        result
    }

    fn sync_data_blocking(&self) -> io::Result<()> {
        let started = Instant::now();
        self.device.acquire_blocking(self.sync_ios(), 0);
        let result = self.inner.sync_data_blocking();
        self.device.record_sync(&result, Some(started));
        result
    }

    async fn allocate_zeroed(&self, len: u64) -> io::Result<()> {
        let device = &self.device;
        if !len.is_multiple_of(super::ALIGN as u64) {
            // The backend refuses it, naming the file.
            let result = self.inner.allocate_zeroed(len).await;
            device.count_result(&result);
            return result;
        }
        let current = self.inner.len().await?;
        // Paid for and written a piece at a time: I/O reserved meanwhile
        // is admitted between the pieces, as a device serves a large write
        // beside its other commands, instead of waiting for all of it. The
        // pieces end on multiples of the piece size (so on block bounds,
        // whatever the file's length now) and at `len`, which the backend
        // checks.
        let mut done = current;
        while done < len {
            let end = (done / ZERO_FILL_PIECE_BYTES + 1)
                .saturating_mul(ZERO_FILL_PIECE_BYTES)
                .min(len);
            let piece = end - done;
            device.acquire(device.ios_for_len(piece), piece).await;
            let result = self.inner.allocate_zeroed(end).await;
            device.count_result(&result);
            result?;
            done = end;
            device
                .counters
                .bytes_written
                .fetch_add(piece, Ordering::Relaxed);
        }
        Ok(())
    }

    async fn set_len(&self, len: u64) -> io::Result<()> {
        self.inner.set_len(len).await
    }

    async fn len(&self) -> io::Result<u64> {
        self.inner.len().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::sim::SimDisk;
    use crate::io::ALIGN;
    use tunables::{ByteSize, DeviceConfig};

    /// Moves have a budget of their own, `percent` of the profile's: a
    /// look at it takes nothing, a move takes from it and not from the
    /// device's own budget, and an unlimited device never holds a move.
    #[test]
    fn moves_take_their_share_of_the_profile_and_nothing_else() {
        let profile = ProfileConfig {
            iops: 1_000,
            burst_iops: 1_000,
            burst_credit: 0,
            bytes_per_sec: ByteSize(0),
            io_unit: ByteSize::kib(4),
            count_fsync: true,
        };
        // 10%: 100 I/Os a second, one held (10 ms of them, at least one).
        let device = Device::new("d", "/d", "p", profile.clone())
            .expect("valid")
            .with_move_percent(10);
        assert!(device.move_wait(4096).is_zero());
        assert!(device.move_wait(4096).is_zero(), "a look took the share");
        device.take_move(4096);
        let wait = device.move_wait(4096);
        assert!(
            wait > Duration::from_millis(5) && wait <= Duration::from_millis(10),
            "{wait:?}"
        );
        assert_eq!(
            device.metrics().ios_admitted,
            0,
            "a move took the device's own budget"
        );
        // 100%: the whole profile's rate, a tenth of the wait.
        let all = Device::new("d", "/d", "p", profile)
            .expect("valid")
            .with_move_percent(100);
        all.take_move(4096);
        all.take_move(4096);
        assert!(
            all.move_wait(4096) <= Duration::from_millis(2),
            "{:?}",
            all.move_wait(4096)
        );
        let free = Device::new("d", "/d", "unthrottled", ProfileConfig::unthrottled())
            .expect("valid")
            .with_move_percent(1);
        free.take_move(1 << 30);
        assert!(free.move_wait(1 << 30).is_zero());
    }

    #[test]
    fn unknown_profile_names_device_and_profile() {
        let mut config = Config::default();
        config.devices.insert(
            "cold".to_string(),
            DeviceConfig {
                path: PathBuf::from("/mnt/cold"),
                profile: "floppy".to_string(),
            },
        );
        let err = build_devices(&config).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("devices.cold.profile"), "{text}");
        assert!(text.contains("floppy"), "{text}");
        assert!(text.contains("sas"), "{text}");
    }

    #[test]
    fn builds_every_device_with_its_profile_and_dir() {
        let mut config = Config::default();
        config.storage.data_dir = PathBuf::from("/var/lib/ringkv");
        config.devices.insert(
            "cold".to_string(),
            DeviceConfig {
                path: PathBuf::from("/mnt/cold"),
                profile: "sas".to_string(),
            },
        );
        config.profiles.insert(
            "tiny".to_string(),
            ProfileConfig {
                iops: 10,
                burst_iops: 10,
                ..ProfileConfig::default()
            },
        );
        config.devices.insert(
            "slow".to_string(),
            DeviceConfig {
                path: PathBuf::new(),
                profile: "tiny".to_string(),
            },
        );
        let devices = build_devices(&config).unwrap();
        assert_eq!(
            devices.keys().collect::<Vec<_>>(),
            vec!["cold", "slow", "wal"]
        );
        let cold = &devices["cold"];
        assert_eq!(cold.profile_name(), "sas");
        assert_eq!(cold.profile().iops, 1_800);
        assert_eq!(cold.dir(), Path::new("/mnt/cold"));
        assert!(!cold.is_unlimited());
        assert_eq!(devices["slow"].profile().iops, 10);
        assert_eq!(devices["slow"].dir(), Path::new("/var/lib/ringkv"));
        assert!(devices["wal"].is_unlimited());
        assert_eq!(devices["wal"].metrics().credit, None);
        assert_eq!(cold.metrics().credit, Some(5_000 * 1_800));
    }

    #[test]
    fn invalid_profile_is_refused() {
        let bad = ProfileConfig {
            iops: 100,
            burst_iops: 50,
            ..ProfileConfig::default()
        };
        let err = Device::new("d", "/x", "bad", bad).unwrap_err();
        assert!(matches!(err, DeviceError::InvalidProfile { .. }), "{err}");
    }

    /// Unthrottled I/O never waits: it runs on pollster, which has no timer,
    /// so any attempt to sleep would panic.
    #[test]
    fn unthrottled_never_waits() {
        let device =
            Arc::new(Device::new("wal", "", "unthrottled", ProfileConfig::unthrottled()).unwrap());
        let disk = Throttled::new(SimDisk::new(1), device.clone());
        pollster::block_on(async {
            disk.create_dir_all(Path::new("/d")).unwrap();
            let f = disk.open(Path::new("/d/f"), true).await.unwrap();
            f.allocate_zeroed(64 * ALIGN as u64).await.unwrap();
            for i in 0..2_000u64 {
                let mut buf = AlignedBuf::with_capacity(ALIGN);
                buf.extend_from_slice(&[1; ALIGN]);
                let (r, _) = f.write_at(buf, (i % 64) * ALIGN as u64).await;
                r.unwrap();
                f.sync_data().await.unwrap();
            }
            disk.sync_dir(Path::new("/d")).await.unwrap();
        });
        let m = device.metrics();
        assert_eq!(m.writes, 2_000);
        assert_eq!(m.syncs, 2_001);
        assert_eq!(m.waits, 0);
        assert_eq!(m.wait_ns_total, 0);
        assert_eq!(m.bytes_written, 2_000 * ALIGN as u64 + 64 * ALIGN as u64);
        assert_eq!(m.fsync_latency.count(), 2_000);
        assert_eq!(m.write_latency.count(), 2_000);
    }

    /// A write pays for the next fdatasync; that fdatasync does not ask the
    /// device again, so the counts stay one I/O per write and per sync.
    #[test]
    fn a_write_prepays_its_fdatasync() {
        let profile = ProfileConfig {
            iops: 1_000_000,
            burst_iops: 1_000_000,
            burst_credit: 0,
            bytes_per_sec: ByteSize(0),
            io_unit: ByteSize::kib(256),
            count_fsync: true,
        };
        let device = Arc::new(Device::new("d", "", "fast", profile).unwrap());
        let disk = Throttled::new(SimDisk::new(3), device.clone());
        let admitted = || device.metrics().ios_admitted;
        compio::runtime::Runtime::new().unwrap().block_on(async {
            disk.create_dir_all(Path::new("/d")).unwrap();
            let f = disk.open(Path::new("/d/f"), true).await.unwrap();
            let block = || {
                let mut b = AlignedBuf::with_capacity(ALIGN);
                b.extend_from_slice(&[3; ALIGN]);
                b
            };
            // write + sync: 2 units, both taken by the write.
            let (r, _) = f.write_at(block(), 0).await;
            r.unwrap();
            assert_eq!(admitted(), 2);
            f.sync_data().await.unwrap();
            assert_eq!(admitted(), 2, "the sync was prepaid");
            // A sync with no write before it pays for itself.
            f.sync_data().await.unwrap();
            assert_eq!(admitted(), 3);
            // Two writes then one sync: 2 + 1.
            let (r, _) = f.write_at(block(), 0).await;
            r.unwrap();
            let (r, _) = f.write_at(block(), ALIGN as u64).await;
            r.unwrap();
            f.sync_data().await.unwrap();
            assert_eq!(admitted(), 6);
        });
        let m = device.metrics();
        assert_eq!((m.writes, m.syncs), (3, 3));
    }

    #[test]
    fn costs_follow_the_profile_rule() {
        let profile = ProfileConfig {
            iops: 1_000_000,
            burst_iops: 1_000_000,
            burst_credit: 0,
            bytes_per_sec: ByteSize(0),
            io_unit: ByteSize::kib(16),
            count_fsync: false,
        };
        let device = Arc::new(Device::new("d", "", "fast", profile).unwrap());
        let disk = Throttled::new(SimDisk::new(2), device.clone());
        compio::runtime::Runtime::new().unwrap().block_on(async {
            disk.create_dir_all(Path::new("/d")).unwrap();
            let f = disk.open(Path::new("/d/f"), true).await.unwrap();
            let mut big = AlignedBuf::with_capacity(40 * 1024);
            big.extend_from_slice(&[7; 40 * 1024]);
            let (r, _) = f.write_at(big, 0).await; // ceil(40/16) = 3
            r.unwrap();
            let (r, _) = f.read_at(AlignedBuf::with_capacity(ALIGN), 0).await; // 1
            r.unwrap();
            f.sync_data().await.unwrap(); // 0: count_fsync = false
            f.allocate_zeroed(128 * 1024).await.unwrap(); // 88 KiB more: 6
        });
        let m = device.metrics();
        assert_eq!(m.ios_admitted, 3 + 1 + 6);
        assert_eq!(m.reads, 1);
        assert_eq!(m.bytes_read, ALIGN as u64);
        assert_eq!(m.syncs, 1);
    }
}
