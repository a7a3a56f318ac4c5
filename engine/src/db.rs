//! The embedded API: [`Db`], ringkv linked into a program and called on
//! the program's own thread.
//!
//! A `Db` runs one shard, and the thread that opened it is that shard's
//! thread: a call applies its operation right there, with no other thread
//! to wake and no channel to cross. The shard's background work (the WAL's
//! flushes, checkpoints, expiry, the hybrid tier's GC) runs on the same
//! thread while it is inside a call: after each call whatever the call woke
//! runs, and every few calls the I/O that finished and the timers that fell
//! due are looked at (`docs/embedding.md`, "What runs when").
//!
//! What must hold: a write is answered as the server answers it (under
//! `sync`, only once it and everything written before it are on the
//! device); one `Db` per directory per machine (the directory's `LOCK`);
//! bad input gets an [`OpError`], never a panic; a `Db` never leaves its
//! thread (it is neither `Send` nor `Sync`).

use crate::api::{
    Op, OpError, OpResult, TtlUpdate, Update, UpdateAnswer, UpdateOutcome, UpdateWrite,
};
use crate::coordinator::Txn;
use crate::engine::Engine;
use crate::error::EngineError;
use crate::io::real::RealDisk;
use crate::io::Disk;
use crate::lockfile::{DirLock, LockError};
use crate::metrics::EngineMetrics;
use crate::shard::core::ShardCore;
use crate::shard::thread::InlineShard;
use crate::txn::{TxnError, TxnSettings};
use crate::Handle;
use bytes::Bytes;
use std::marker::PhantomData;
use std::path::Path;
use std::rc::Rc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tunables::{Config, Durability};

/// Why a [`Db`] call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DbError {
    /// The directory could not be opened or recovered (a damaged file, a
    /// config the directory disagrees with, an I/O error).
    #[error("cannot open the database: {0}")]
    Open(#[source] EngineError),
    /// Another process (or another `Db` in this one) has the directory.
    #[error(transparent)]
    Locked(#[from] LockError),
    /// The configuration cannot run embedded.
    #[error("{0}")]
    Config(String),
    /// This thread already runs a `Db` (or a shard of an engine): a thread
    /// drives one shard.
    #[error("this thread already runs a ringkv shard (another Db, or an engine's shard thread); open each Db on its own thread")]
    ThreadBusy,
    /// The operation was refused or failed; see [`OpError`].
    #[error(transparent)]
    Op(#[from] OpError),
    /// A transaction failed; see [`TxnError`].
    #[error(transparent)]
    Txn(#[from] TxnError),
    /// The database could not be closed cleanly (its last writes were not
    /// made durable); a reopen recovers what the WAL holds.
    #[error("the database did not close cleanly: {0}")]
    Close(#[source] EngineError),
}

/// An embedded ringkv database: one shard, run by the thread that opened
/// it. A call applies its operation on that thread, with no other thread
/// to wake; the shard's background work (WAL flushes, checkpoints, expiry,
/// the hybrid tier's GC) runs there too, inside calls (`docs/embedding.md`,
/// "What runs when").
///
/// ```
/// # fn main() -> Result<(), ringkv_engine::DbError> {
/// let dir = tempfile::tempdir().unwrap();
/// let db = ringkv_engine::Db::open(dir.path())?;
/// db.put(b"user:1", b"ada")?;
/// assert_eq!(db.get(b"user:1")?.as_deref(), Some(&b"ada"[..]));
/// assert!(db.delete(b"user:1")?);
/// assert_eq!(db.get(b"user:1")?, None);
/// db.close()?;
/// # Ok(())
/// # }
/// ```
///
/// A `Db` stays on its thread; it cannot be sent to another:
///
/// ```compile_fail
/// let dir = tempfile::tempdir().unwrap();
/// let db = ringkv_engine::Db::open(dir.path()).unwrap();
/// std::thread::spawn(move || drop(db));
/// ```
///
/// And a closed `Db` cannot be called (`close` takes it):
///
/// ```compile_fail
/// let dir = tempfile::tempdir().unwrap();
/// let db = ringkv_engine::Db::open(dir.path()).unwrap();
/// db.close().unwrap();
/// db.get(b"k");
/// ```
pub struct Db {
    // Field order is drop order: the engine's shard stops (in `Drop`)
    // before the lock goes.
    /// The shard's state, for the single-operation calls that need no
    /// wait (`None` once closed).
    core: Option<Rc<ShardCore>>,
    /// Whether the tier holds every value in RAM (GETs and DELETEs can
    /// then always be answered at once).
    values_in_ram: bool,
    engine: Option<Engine>,
    shard: InlineShard,
    handle: Handle,
    durability: Durability,
    lock: Option<DirLock>,
    // Neither `Send` nor `Sync`: the shard's runtime belongs to this thread.
    _thread: PhantomData<Rc<()>>,
}

impl std::fmt::Debug for Db {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Db")
            .field("durability", &self.durability)
            .field("engine", &self.engine)
            .finish()
    }
}

impl Db {
    /// Opens (creating or recovering) the database in `dir` with the
    /// default settings: the memory tier, `async` durability (a write is
    /// on the device within `storage.flush_interval`, 10 ms, while the
    /// program calls; see [`Db::sync`]).
    pub fn open(dir: impl AsRef<Path>) -> Result<Db, DbError> {
        let mut config = Config::default();
        config.storage.data_dir = dir.as_ref().to_path_buf();
        Self::open_with(config)
    }

    /// Opens the database `config.storage.data_dir` with these settings
    /// (the server's config: durability, tier, devices and their
    /// profiles, limits). `shards` must be 0 or 1: a `Db` runs one shard;
    /// `server.*` is not used.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let dir = tempfile::tempdir()?;
    /// let mut config = tunables::Config::default();
    /// config.storage.data_dir = dir.path().to_path_buf();
    /// // Answer each write once it is on the device.
    /// config.storage.durability = tunables::Durability::Sync;
    /// let db = ringkv_engine::Db::open_with(config)?;
    /// db.put(b"k", b"v")?; // durable when it returns
    /// db.close()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn open_with(config: Config) -> Result<Db, DbError> {
        let lock = match config.storage.durability {
            // Nothing is kept on disk: nothing to guard.
            Durability::None => None,
            _ => Some(DirLock::acquire(&config.storage.data_dir)?),
        };
        Self::open_parts(config, RealDisk, lock)
    }

    /// [`Db::open_with`] on any [`Disk`] (a simulated disk in tests). No
    /// `LOCK` is taken: guarding the directory is the disk's owner's job.
    pub fn open_with_disk<D: Disk>(config: Config, disk: D) -> Result<Db, DbError> {
        Self::open_parts(config, disk, None)
    }

    fn open_parts<D: Disk>(
        mut config: Config,
        disk: D,
        lock: Option<DirLock>,
    ) -> Result<Db, DbError> {
        if config.shards > 1 {
            return Err(DbError::Config(format!(
                "a Db runs one shard, on the thread that opens it; the config asks for {} (set shards to 1, or run the engine's threads with Engine::open and Handle::batch_blocking)",
                config.shards
            )));
        }
        config.shards = 1;
        if crate::shard::router::thread_runs_a_shard() {
            return Err(DbError::ThreadBusy);
        }
        let durability = config.storage.durability;
        let (engine, shard) = Engine::open_inline(&config, disk).map_err(DbError::Open)?;
        let handle = engine.handle();
        let core = crate::shard::router::local_shard(handle.shared.engine_id).map(|(_, c)| c);
        Ok(Db {
            core,
            values_in_ram: handle.shared.values_in_ram,
            handle,
            engine: Some(engine),
            shard,
            durability,
            lock,
            _thread: PhantomData,
        })
    }

    /// Runs a batch of operations in order, each answered in its place
    /// (an operation that breaks a limit gets its error there and the rest
    /// still run). The writes of a batch share one group commit: under
    /// `sync`, a batch of 1,000 puts waits for one device write, not 1,000.
    ///
    /// ```
    /// # fn main() -> Result<(), ringkv_engine::DbError> {
    /// use ringkv_engine::{Op, OpResult};
    /// let dir = tempfile::tempdir().unwrap();
    /// let db = ringkv_engine::Db::open(dir.path())?;
    /// let answers = db.batch(vec![
    ///     Op::Put { key: "a".into(), value: "1".into() },
    ///     Op::Get { key: "a".into() },
    ///     Op::Get { key: "b".into() },
    /// ])?;
    /// assert_eq!(answers[1], OpResult::Value("1".into()));
    /// assert_eq!(answers[2], OpResult::NotFound);
    /// # Ok(())
    /// # }
    /// ```
    pub fn batch(&self, ops: Vec<Op>) -> Result<Vec<OpResult>, DbError> {
        Ok(self.shard.drive(self.handle.batch(ops))?)
    }

    fn one(&self, op: Op) -> Result<OpResult, DbError> {
        let mut answers = self.batch(vec![op])?;
        match answers.pop() {
            Some(OpResult::Err(e)) => Err(e.into()),
            Some(answer) => Ok(answer),
            None => unreachable!("one answer per operation"),
        }
    }

    /// A single write applied on this thread at once when it can be
    /// ([`ShardCore::write_now`]), else through the batch path.
    fn write(&self, key: &[u8], value: Option<&[u8]>) -> Result<OpResult, DbError> {
        self.handle.shared.limits.check_slices(key, value)?;
        let core = self.core.as_ref().expect("a Db is open until close");
        if value.is_some() || self.values_in_ram {
            if let Some((answer, wait_lsn)) = core.write_now(key, value) {
                self.shard.after_call();
                if let Some(lsn) = wait_lsn {
                    // Under `sync`: answered once durable, as a batch is.
                    self.shard
                        .drive(core.wait_durable(lsn))
                        .map_err(|()| OpError::Poisoned { shard: 0 })?;
                }
                return match answer {
                    OpResult::Err(e) => Err(e.into()),
                    answer => Ok(answer),
                };
            }
        }
        let key = Bytes::copy_from_slice(key);
        self.one(match value {
            Some(v) => Op::Put {
                key,
                value: Bytes::copy_from_slice(v),
            },
            None => Op::Delete { key },
        })
    }

    /// Sets `key` to `value` (removing any expiry time it had).
    pub fn put(&self, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> Result<(), DbError> {
        self.write(key.as_ref(), Some(value.as_ref())).map(drop)
    }

    /// The value of `key`, `None` if it is absent or expired.
    pub fn get(&self, key: impl AsRef<[u8]>) -> Result<Option<Bytes>, DbError> {
        let key = key.as_ref();
        self.handle.shared.limits.check_slices(key, None)?;
        let core = self.core.as_ref().expect("a Db is open until close");
        let answer = match self.values_in_ram.then(|| core.get_now(key)).flatten() {
            Some(answer) => {
                self.shard.after_call();
                answer
            }
            None => self.one(Op::Get {
                key: Bytes::copy_from_slice(key),
            })?,
        };
        match answer {
            OpResult::Value(v) => Ok(Some(v)),
            OpResult::Err(e) => Err(e.into()),
            _ => Ok(None),
        }
    }

    /// Removes `key`; `true` if it was there.
    pub fn delete(&self, key: impl AsRef<[u8]>) -> Result<bool, DbError> {
        Ok(matches!(self.write(key.as_ref(), None)?, OpResult::Ok))
    }

    /// Sets `key` to `value`, to expire `ttl` from now (then it reads as
    /// absent and is removed; the expiry time is kept across restarts).
    ///
    /// ```
    /// # fn main() -> Result<(), ringkv_engine::DbError> {
    /// use std::time::Duration;
    /// let dir = tempfile::tempdir().unwrap();
    /// let db = ringkv_engine::Db::open(dir.path())?;
    /// db.put_expiring(b"session", b"token", Duration::from_secs(60))?;
    /// let left = db.time_to_live(b"session")?.expect("it expires");
    /// assert!(left <= Duration::from_secs(60));
    /// assert_eq!(db.time_to_live(b"missing")?, None);
    /// # Ok(())
    /// # }
    /// ```
    pub fn put_expiring(
        &self,
        key: impl AsRef<[u8]>,
        value: impl AsRef<[u8]>,
        ttl: Duration,
    ) -> Result<(), DbError> {
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        let at = unix_ms(SystemTime::now()).saturating_add(ttl_ms);
        self.one(Op::UpdateTtl {
            key: Bytes::copy_from_slice(key.as_ref()),
            update: TtlUpdate {
                apply: put_expiring_at,
                arg: Bytes::copy_from_slice(value.as_ref()),
                number: at.min(i64::MAX as u64) as i64,
            },
        })
        .map(drop)
    }

    /// How long `key` has left before it expires: `None` if it is absent
    /// or has no expiry time.
    pub fn time_to_live(&self, key: impl AsRef<[u8]>) -> Result<Option<Duration>, DbError> {
        let answer = self.one(Op::UpdateTtl {
            key: Bytes::copy_from_slice(key.as_ref()),
            update: TtlUpdate {
                apply: read_ttl,
                arg: Bytes::new(),
                number: 0,
            },
        })?;
        Ok(match answer {
            OpResult::Updated(UpdateAnswer::Int(ms)) => Some(Duration::from_millis(ms as u64)),
            _ => None,
        })
    }

    /// A read-modify-write of `key` in one step: no other write of the key
    /// falls between the read and the write (see [`Op::Update`]).
    ///
    /// ```
    /// # fn main() -> Result<(), ringkv_engine::DbError> {
    /// use bytes::Bytes;
    /// use ringkv_engine::{Update, UpdateAnswer, UpdateOutcome, UpdateWrite};
    /// // Adds `number` to a little-endian counter.
    /// fn add(current: Option<Bytes>, _arg: &Bytes, number: i64) -> UpdateOutcome {
    ///     let old = current
    ///         .and_then(|v| <[u8; 8]>::try_from(v.as_ref()).ok())
    ///         .map_or(0, i64::from_le_bytes);
    ///     let new = old + number;
    ///     UpdateOutcome {
    ///         write: UpdateWrite::Put(Bytes::copy_from_slice(&new.to_le_bytes())),
    ///         answer: UpdateAnswer::Int(new),
    ///     }
    /// }
    /// let dir = tempfile::tempdir().unwrap();
    /// let db = ringkv_engine::Db::open(dir.path())?;
    /// let step = Update { apply: add, arg: Bytes::new(), number: 5 };
    /// db.update(b"hits", step.clone())?;
    /// assert_eq!(db.update(b"hits", step)?, UpdateAnswer::Int(10));
    /// # Ok(())
    /// # }
    /// ```
    pub fn update(&self, key: impl AsRef<[u8]>, update: Update) -> Result<UpdateAnswer, DbError> {
        match self.one(Op::Update {
            key: Bytes::copy_from_slice(key.as_ref()),
            update,
        })? {
            OpResult::Updated(answer) => Ok(answer),
            other => unreachable!("an update answers Updated, not {other:?}"),
        }
    }

    /// Walks the keys: starting at cursor 0, each call returns some keys
    /// (at least `count` unless the walk ends) and the cursor to go on
    /// from, 0 at the end. Keys come in the engine's hash order, not
    /// sorted. A key present for the whole walk is returned once; one
    /// added or removed during it may or may not be (as Redis's SCAN).
    ///
    /// ```
    /// # fn main() -> Result<(), ringkv_engine::DbError> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let db = ringkv_engine::Db::open(dir.path())?;
    /// for i in 0..100u32 {
    ///     db.put(i.to_be_bytes(), b"x")?;
    /// }
    /// let (mut cursor, mut seen) = (0, 0);
    /// loop {
    ///     let (next, keys) = db.scan(cursor, 10)?;
    ///     seen += keys.len();
    ///     if next == 0 {
    ///         break;
    ///     }
    ///     cursor = next;
    /// }
    /// assert_eq!(seen, 100);
    /// # Ok(())
    /// # }
    /// ```
    pub fn scan(&self, cursor: u64, count: usize) -> Result<(u64, Vec<Bytes>), DbError> {
        let step =
            self.shard
                .drive(self.handle.partition_keys(0, cursor as usize, count.max(1)))?;
        Ok((step.next.map_or(0, |p| p as u64), step.keys))
    }

    /// Runs `body` as a transaction: its reads lock their keys
    /// ([`DbTxn::get_for_update`]), its writes apply together at the commit
    /// when `body` returns `Ok`, or not at all when it returns `Err` (the
    /// error is returned). Under `sync` the commit is answered once it is
    /// durable.
    ///
    /// ```
    /// # fn main() -> Result<(), ringkv_engine::DbError> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let db = ringkv_engine::Db::open(dir.path())?;
    /// db.put(b"a", b"10")?;
    /// db.transaction(|t| {
    ///     let a = t.get_for_update(b"a")?.unwrap_or_default();
    ///     t.put(b"b", &a[..])?;
    ///     t.delete(b"a")?;
    ///     Ok(())
    /// })?;
    /// assert_eq!(db.get(b"a")?, None);
    /// assert_eq!(db.get(b"b")?.as_deref(), Some(&b"10"[..]));
    /// # Ok(())
    /// # }
    /// ```
    pub fn transaction<R>(
        &self,
        body: impl FnOnce(&mut DbTxn<'_>) -> Result<R, TxnError>,
    ) -> Result<R, DbError> {
        let mut txn = DbTxn {
            db: self,
            txn: Some(self.handle.begin(TxnSettings::default())),
        };
        match body(&mut txn) {
            Ok(out) => {
                let t = txn.txn.take().expect("the transaction is open");
                self.shard.drive(t.commit())?;
                Ok(out)
            }
            Err(e) => {
                if let Some(t) = txn.txn.take() {
                    self.shard.drive(t.rollback());
                }
                Err(e.into())
            }
        }
    }

    /// Waits until every write answered so far is on the device (under
    /// `async`, which otherwise gets there within `storage.flush_interval`
    /// while the program calls; under `sync` they already are; `none`
    /// keeps nothing). A program that stops calling for a while with
    /// `async` writes unflushed calls this first.
    pub fn sync(&self) -> Result<(), DbError> {
        if self.durability == Durability::None {
            return Ok(());
        }
        let durable = self.shard.drive(async {
            match crate::shard::router::local_shard(self.handle.shared.engine_id) {
                Some((_, core)) => core.wait_durable(core.last_lsn()).await,
                None => Err(()),
            }
        });
        durable.map_err(|()| OpError::Poisoned { shard: 0 }.into())
    }

    /// Lets the background work run for up to `time` without a call:
    /// flushes, checkpoints, expiry and GC that fall due meanwhile run on
    /// this thread. Returns early never; use it in a program's idle loop.
    pub fn run_background_for(&self, time: Duration) {
        let until = std::time::Instant::now() + time;
        self.shard.drive(async {
            compio::time::sleep_until(until).await;
        });
    }

    /// The I/O backend the shard runs on (io_uring, or the fallback).
    pub fn backend(&self) -> crate::BackendKind {
        self.engine
            .as_ref()
            .map_or(crate::BackendKind::Fallback, Engine::backend)
    }

    /// Every counter of the database: operations, the WAL's writes and
    /// flushes, keys and memory, the tier's own counters, the devices'.
    pub fn metrics(&self) -> EngineMetrics {
        self.shard.drive(self.handle.metrics_now())
    }

    /// Closes the database: the WAL is flushed and made durable, then the
    /// directory's lock is released. Dropping a `Db` closes it too, and
    /// logs what `close` would return as an error.
    pub fn close(mut self) -> Result<(), DbError> {
        self.stop()
    }

    /// Stops at once without flushing: what a crash would leave (tests).
    pub fn halt(mut self) {
        drop(self.core.take());
        if let Some(engine) = self.engine.take() {
            engine.halt_inline(&mut self.shard);
        }
    }

    fn stop(&mut self) -> Result<(), DbError> {
        drop(self.core.take());
        let Some(engine) = self.engine.take() else {
            return Ok(());
        };
        let result = engine.shutdown_inline(&mut self.shard);
        drop(self.lock.take());
        result.map_err(DbError::Close)
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // Turning the runtime now could finish one of its tasks while
            // the thread unwinds, which compio answers by aborting the
            // process. Stop as a crash would instead: `sync` writes are on
            // the device already; `async` ones not yet flushed are lost,
            // as after a crash.
            drop(self.core.take());
            if let Some(engine) = self.engine.take() {
                engine.abandon_inline(&mut self.shard);
            }
            tracing::warn!(
                "a Db dropped while its thread panics stops without a flush, as after a crash"
            );
            return;
        }
        if let Err(e) = self.stop() {
            tracing::error!(error = %e, "a Db dropped without close did not close cleanly");
        }
    }
}

/// A transaction of [`Db::transaction`].
pub struct DbTxn<'db> {
    db: &'db Db,
    txn: Option<Txn>,
}

impl DbTxn<'_> {
    fn txn(&mut self) -> &mut Txn {
        self.txn.as_mut().expect("the transaction is open")
    }

    /// Reads `key` without locking it.
    pub fn get(&mut self, key: impl AsRef<[u8]>) -> Result<Option<Bytes>, TxnError> {
        let key = Bytes::copy_from_slice(key.as_ref());
        let db = self.db;
        db.shard.drive(self.txn().get(key))
    }

    /// Reads `key` and locks it until the transaction ends: no other
    /// transaction writes it in between.
    pub fn get_for_update(&mut self, key: impl AsRef<[u8]>) -> Result<Option<Bytes>, TxnError> {
        let key = Bytes::copy_from_slice(key.as_ref());
        let db = self.db;
        db.shard.drive(self.txn().get_for_update(key))
    }

    /// Sets `key` to `value` at the commit (locking the key now).
    pub fn put(&mut self, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> Result<(), TxnError> {
        let key = Bytes::copy_from_slice(key.as_ref());
        let value = Bytes::copy_from_slice(value.as_ref());
        let db = self.db;
        db.shard.drive(self.txn().put(key, value))
    }

    /// Removes `key` at the commit (locking it now); `true` if it is there
    /// now.
    pub fn delete(&mut self, key: impl AsRef<[u8]>) -> Result<bool, TxnError> {
        let key = Bytes::copy_from_slice(key.as_ref());
        let db = self.db;
        db.shard.drive(self.txn().delete(key))
    }
}

impl Drop for DbTxn<'_> {
    /// A transaction whose body panicked is rolled back: dropping it
    /// queues the release of its locks, which the next call (or the
    /// `Db`'s close) carries out. The runtime is not turned here: it must
    /// not run while the thread unwinds.
    fn drop(&mut self) {
        drop(self.txn.take());
    }
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// [`Db::put_expiring`]'s update: the value, expiring at `number` (Unix ms).
fn put_expiring_at(
    _current: crate::api::Current,
    _now: u64,
    value: &Bytes,
    at: i64,
) -> UpdateOutcome {
    UpdateOutcome {
        write: UpdateWrite::PutExpiring(value.clone(), Some(at as u64)),
        answer: UpdateAnswer::Ok,
    }
}

/// [`Db::time_to_live`]'s update: reads the expiry, writes nothing.
fn read_ttl(current: crate::api::Current, now: u64, _arg: &Bytes, _n: i64) -> UpdateOutcome {
    let answer = match current {
        Some((_, Some(at))) => UpdateAnswer::Int(at.saturating_sub(now) as i64),
        _ => UpdateAnswer::Nil,
    };
    UpdateOutcome {
        write: UpdateWrite::Keep,
        answer,
    }
}
