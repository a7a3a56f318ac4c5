//! The configuration schema, declared once. Each field of a section is one
//! entry in a [`section!`] block: its doc line, name, type, default, the check
//! of its own value and, where the check does not say it all, a note on what
//! is allowed. Everything else follows from that entry: the struct and its
//! `Default`, the loader's match arm and the "did you mean" key list
//! ([`Section::KEYS`], [`Section::read_key`]), the per-field validation
//! ([`Section::check_fields`]), `--print-config` and the example `ringkv.toml`
//! ([`Config::to_toml_string`], [`example_toml`]), and the field tables of
//! `docs/config.md` ([`docs_table`]); a test keeps the checked-in files equal
//! to what this module prints.
//!
//! Rules that tie several fields together are not facts of one field; they
//! live in `validate.rs` (`Checker::rules`). The top-level `shards` key and the
//! `[devices]`/`[profiles]` maps are read by `load.rs` by hand.

use crate::load::{FromToml, Loader};
use crate::validate::Checker;
use crate::{Backend, ByteSize, Config, Durability, Duration, LogFormat, NamedVariants, Tier};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use toml::de::DeValue;
use toml::Spanned;

/// One value of the file, with where it stands.
type Value<'i> = Spanned<DeValue<'i>>;

/// What a field's own value must satisfy (rules between fields are separate).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Check<T> {
    /// Any value the type can hold.
    Any,
    /// An inclusive range.
    Range(T, T),
    /// An `IP:PORT` socket address.
    Addr,
    /// An `IP:PORT` socket address, or empty (off).
    AddrOrEmpty,
    /// Not empty; the text is the reason given when it is.
    NotEmpty(&'static str),
}

/// The facts of one field, as the docs and the example file print them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldInfo {
    /// The key within its section.
    pub key: &'static str,
    /// What the field means (one paragraph).
    pub doc: String,
    /// The kind of value: "integer", "size", "duration", "address", ...
    pub kind: &'static str,
    /// The default, as it is written in TOML.
    pub default: String,
    /// What is allowed, in words (Markdown).
    pub allowed: String,
}

/// A type a config field can have.
pub(crate) trait FieldValue: FromToml + Sized {
    /// The "type / unit" column of the docs.
    const KIND: &'static str;
    /// The value as written in a TOML file.
    fn toml_text(&self) -> String;
    /// Runs `check` on this value, reporting as `field`.
    fn check(&self, c: &mut Checker, field: &str, check: &Check<Self>);
    /// `check` in words, for the docs.
    fn allowed(check: &Check<Self>) -> String {
        match check {
            Check::Any => "any".to_string(),
            Check::Range(min, max) => format!("{}..={}", min.toml_text(), max.toml_text()),
            Check::Addr => "`IP:PORT`".to_string(),
            Check::AddrOrEmpty => "`IP:PORT`, or `\"\"` (off)".to_string(),
            Check::NotEmpty(_) => "not empty".to_string(),
        }
    }
}

/// `s` as a TOML basic string: quotes, backslashes and control characters
/// escaped as TOML spells them (`\"`, `\\`, `\n`, `\uXXXX`); every other
/// character, combining marks and non-ASCII letters included, as itself.
/// (Rust's `{:?}` is not TOML: it writes `\u{301}`.)
pub(crate) fn quoted_toml(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => {
                use std::fmt::Write;
                let _ = write!(out, "\\u{:04X}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Numbers: bare in TOML, checked against a range by `$range`.
macro_rules! integer_field_value {
    ($($ty:ty => $range:ident),*) => {$(
        impl FieldValue for $ty {
            const KIND: &'static str = "integer";
            fn toml_text(&self) -> String {
                self.to_string()
            }
            fn check(&self, c: &mut Checker, field: &str, check: &Check<Self>) {
                if let Check::Range(min, max) = check {
                    c.$range(field, *self, (*min, *max));
                }
            }
        }
    )*};
}
integer_field_value!(u32 => range_u32, u64 => range_u64);

/// Sizes and durations: quoted strings in TOML, checked against a range.
macro_rules! unit_field_value {
    ($($ty:ty => $kind:literal, $range:ident),*) => {$(
        impl FieldValue for $ty {
            const KIND: &'static str = $kind;
            fn toml_text(&self) -> String {
                quoted_toml(&self.to_string())
            }
            fn check(&self, c: &mut Checker, field: &str, check: &Check<Self>) {
                if let Check::Range(min, max) = check {
                    c.$range(field, *self, (*min, *max));
                }
            }
            fn allowed(check: &Check<Self>) -> String {
                match check {
                    Check::Range(min, max) => {
                        format!("`{}`..=`{}`", min.toml_text(), max.toml_text())
                    }
                    _ => "any".to_string(),
                }
            }
        }
    )*};
}
unit_field_value!(ByteSize => "size", range_size, Duration => "duration", range_duration);

impl FieldValue for bool {
    const KIND: &'static str = "boolean";
    fn toml_text(&self) -> String {
        self.to_string()
    }
    fn check(&self, _: &mut Checker, _: &str, _: &Check<Self>) {}
    fn allowed(_: &Check<Self>) -> String {
        "`true`, `false`".to_string()
    }
}

impl FieldValue for String {
    const KIND: &'static str = "string";
    fn toml_text(&self) -> String {
        quoted_toml(self)
    }
    fn check(&self, c: &mut Checker, field: &str, check: &Check<Self>) {
        match check {
            Check::Addr => {
                c.socket_addr(field, self);
            }
            Check::AddrOrEmpty if !self.is_empty() => {
                c.socket_addr(field, self);
            }
            Check::NotEmpty(reason) if self.is_empty() => {
                c.bad_value(field, "\"\"".to_string(), reason.to_string());
            }
            _ => {}
        }
    }
}

impl FieldValue for PathBuf {
    const KIND: &'static str = "path";
    fn toml_text(&self) -> String {
        quoted_toml(&self.to_string_lossy())
    }
    fn check(&self, c: &mut Checker, field: &str, check: &Check<Self>) {
        if let Check::NotEmpty(reason) = check {
            if self.as_os_str().is_empty() {
                c.bad_value(field, "\"\"".to_string(), reason.to_string());
            }
        }
    }
}

macro_rules! named_field_value {
    ($($ty:ty),*) => {$(
        impl FieldValue for $ty {
            const KIND: &'static str = "name";
            fn toml_text(&self) -> String {
                quoted_toml(self.as_str())
            }
            fn check(&self, _: &mut Checker, _: &str, _: &Check<Self>) {}
            fn allowed(_: &Check<Self>) -> String {
                <$ty as NamedVariants>::NAMES
                    .iter()
                    .map(|n| format!("`\"{n}\"`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        }
    )*};
}
named_field_value!(Tier, Durability, Backend, LogFormat);

/// A table of the config file whose fields are declared with [`section!`].
pub trait Section: Default {
    /// Where the table sits, as the docs name it: `server`, `devices.NAME`.
    const PATH: &'static str;
    /// Its keys, in declaration order.
    const KEYS: &'static [&'static str];
    /// Every field's facts, in declaration order.
    fn fields() -> Vec<FieldInfo>;
    /// Each field's value as TOML text, in declaration order.
    fn values(&self) -> Vec<(&'static str, String)>;
    /// Reads `key` into its field; `false` if the section has no such key.
    #[doc(hidden)]
    #[allow(private_interfaces)]
    fn read_key(&mut self, loader: &mut Loader<'_>, key: &str, path: String, v: &Value<'_>)
        -> bool;
    /// Checks each field's own value, naming fields `{prefix}.{key}`.
    #[doc(hidden)]
    #[allow(private_interfaces)]
    fn check_fields(&self, c: &mut Checker, prefix: &str);
}

/// Declares a config section: the struct, its `Default` and its [`Section`]
/// implementation, from one entry per field:
///
/// ```text
/// /// What it means.
/// key: Type = default, check Check::..., note "more on what is allowed";
/// ```
macro_rules! section {
    (
        $(#[$meta:meta])*
        pub struct $name:ident at $path:literal {
            $(
                $(#[doc = $doc:literal])+
                $field:ident : $ty:ty = $default:expr,
                    kind $kind:expr, check $check:expr $(, note $note:literal)?;
            )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
        #[serde(default, deny_unknown_fields)]
        pub struct $name {
            $(
                $(#[doc = $doc])+
                pub $field: $ty,
            )+
        }

        impl Default for $name {
            fn default() -> Self {
                $name { $($field: $default,)+ }
            }
        }

        impl Section for $name {
            const PATH: &'static str = $path;
            const KEYS: &'static [&'static str] = &[$(stringify!($field)),+];

            fn fields() -> Vec<FieldInfo> {
                let defaults = $name::default();
                vec![$(
                    FieldInfo {
                        key: stringify!($field),
                        doc: join_doc(&[$($doc),+]),
                        kind: kind_or(<$ty as FieldValue>::KIND, $kind),
                        default: defaults.$field.toml_text(),
                        allowed: with_note(
                            <$ty as FieldValue>::allowed(&$check),
                            None $(.or(Some($note)))?,
                        ),
                    },
                )+]
            }

            fn values(&self) -> Vec<(&'static str, String)> {
                vec![$((stringify!($field), self.$field.toml_text()),)+]
            }

            #[allow(private_interfaces)]
            fn read_key(&mut self, loader: &mut Loader<'_>, key: &str, path: String, v: &Value<'_>) -> bool {
                match key {
                    $(stringify!($field) => loader.field(path, v, &mut self.$field),)+
                    _ => return false,
                }
                true
            }

            #[allow(private_interfaces)]
            fn check_fields(&self, c: &mut Checker, prefix: &str) {
                $(
                    let check: Check<$ty> = $check;
                    self.$field.check(c, &join_key(prefix, stringify!($field)), &check);
                )+
            }
        }
    };
}

fn join_doc(lines: &[&str]) -> String {
    lines.iter().map(|l| l.trim()).collect::<Vec<_>>().join(" ")
}

fn kind_or(default: &'static str, given: Option<&'static str>) -> &'static str {
    given.unwrap_or(default)
}

fn with_note(allowed: String, note: Option<&str>) -> String {
    match note {
        Some(note) if allowed == "any" => note.to_string(),
        Some(note) => format!("{allowed}; {note}"),
        None => allowed,
    }
}

pub(crate) fn join_key(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_string()
    } else {
        format!("{prefix}.{key}")
    }
}

// ---------------------------------------------------------------------------
// The sections.

/// Most shards a node runs.
pub const SHARDS_MAX: u32 = 256;

/// The top-level `shards` key (read by hand in `load.rs`, checked in `validate.rs`).
pub(crate) fn shards_field() -> FieldInfo {
    FieldInfo {
        key: "shards",
        doc: "Number of shards, each an OS thread pinned to a core with its own io_uring, WAL and storage. 0 = one per available core.".to_string(),
        kind: u32::KIND,
        default: Config::default().shards.toml_text(),
        allowed: u32::allowed(&Check::Range(0, SHARDS_MAX)),
    }
}

section! {
    /// `[server]`: listeners and per-connection bounds.
    pub struct ServerConfig at "server" {
        /// Binary-protocol listener (one SO_REUSEPORT socket per shard); no host names.
        listen: String = "127.0.0.1:7379".to_string(),
            kind Some("address"), check Check::Addr;
        /// Prometheus `/metrics` (and `/healthz`, `/readyz`) listener; `""` disables it.
        metrics_listen: String = String::new(),
            kind Some("address or `\"\"`"), check Check::AddrOrEmpty,
            note "not the same as `listen` (unless both use port 0)";
        /// Redis-protocol (RESP2/RESP3) listener, served by every shard like `listen`;
        /// `""` disables it. See `docs/resp.md`.
        resp_listen: String = String::new(),
            kind Some("address or `\"\"`"), check Check::AddrOrEmpty,
            note "not the same as `listen` or `metrics_listen` (unless port 0)";
        /// FLUSHDB and FLUSHALL on the RESP listener; `false` answers them as unknown
        /// commands (like Redis's `rename-command FLUSHALL ""`).
        resp_flush_enabled: bool = true,
            kind None, check Check::Any;
        /// Connections open at once, across all shards.
        max_connections: u32 = 10_000,
            kind None, check Check::Range(1, 1_000_000);
        /// A connection with no traffic for this long is closed.
        idle_timeout: Duration = Duration::from_secs(300),
            kind None, check Check::Range(Duration::from_millis(1), Duration::from_secs(7 * 86_400));
        /// Frames one connection may have in flight (sent, not yet answered).
        pipeline_depth_max: u32 = 128,
            kind None, check Check::Range(1, 65_536);
        /// Password every client must present in the handshake; `""` means none. Not
        /// together with `password_file`. `--print-config` shows it redacted.
        requirepass: String = String::new(),
            kind Some("string"), check Check::Any, note "`\"\"`, or 1 to 512 bytes";
        /// File whose content (one trailing newline removed) is the password, which
        /// keeps the secret out of this file; read at start. `""` means none.
        password_file: PathBuf = PathBuf::new(),
            kind None, check Check::Any, note "not together with `requirepass`";
        /// Role of the `default` user, the one `requirepass` / `password_file` (or no
        /// password at all) authenticates: `read-only`, `read-write` or `admin`. See
        /// `docs/security.md`, "Users and roles".
        default_role: String = "admin".to_string(),
            kind Some("role"), check Check::Any, note "`read-only`, `read-write` or `admin`";
        /// Protected mode's opt-out: allow listening on a non-loopback address with
        /// no password.
        dangerously_listen_without_password: bool = false,
            kind None, check Check::Any;
        /// A connection must finish its handshake (TLS included) within this.
        handshake_timeout: Duration = Duration::from_secs(10),
            kind None, check Check::Range(Duration::from_millis(10), Duration::from_secs(3600));
        /// How long a wrong password waits before it is refused.
        auth_failure_delay: Duration = Duration::from_millis(200),
            kind None, check Check::Range(Duration::ZERO, Duration::from_secs(10));
        /// TLS on the binary-protocol listener; needs `tls_cert_file` and `tls_key_file`.
        tls_native: bool = false,
            kind None, check Check::Any;
        /// TLS (HTTPS) on the `/metrics` listener; needs `tls_cert_file` and `tls_key_file`.
        tls_metrics: bool = false,
            kind None, check Check::Any;
        /// TLS on the Redis-protocol (`resp_listen`) listener; needs `tls_cert_file` and
        /// `tls_key_file`.
        tls_resp: bool = false,
            kind None, check Check::Any;
        /// Certificate chain, PEM, leaf first.
        tls_cert_file: PathBuf = PathBuf::new(),
            kind None, check Check::Any, note "a PEM file when TLS is on";
        /// Private key of the certificate, PEM (PKCS#8, PKCS#1 or SEC1).
        tls_key_file: PathBuf = PathBuf::new(),
            kind None, check Check::Any, note "a PEM file when TLS is on";
        /// CA certificates, PEM: when set, TLS clients must present a certificate signed
        /// by one of them. `""`: no client certificates.
        tls_client_ca_file: PathBuf = PathBuf::new(),
            kind None, check Check::Any, note "only with TLS on";
        /// A transaction waiting this long for one lock is aborted (LOCK_TIMEOUT).
        /// Wait-die already prevents deadlocks; this bounds waits behind slow holders.
        txn_lock_wait_timeout: Duration = Duration::from_millis(1000),
            kind None, check Check::Range(Duration::from_millis(1), Duration::from_secs(3600));
        /// An open transaction whose connection sends nothing for this long is aborted
        /// and its locks released; its next operations answer ABORTED.
        txn_idle_timeout: Duration = Duration::from_secs(10),
            kind None, check Check::Range(Duration::from_millis(1), Duration::from_secs(86_400));
        /// Most keys one transaction may lock (GET_FOR_UPDATE, PUT and DELETE each lock
        /// their key); the op past it answers TXN_TOO_LARGE and aborts the transaction.
        txn_locks_max: u32 = 10_000,
            kind None, check Check::Range(1, 1_000_000);
    }
}

section! {
    /// `[storage]`: where data lives and how it is made durable.
    pub struct StorageConfig at "storage" {
        /// Directory with the manifest, the lock file and one folder per shard.
        data_dir: PathBuf = PathBuf::from("./data"),
            kind None, check Check::NotEmpty("must name a directory");
        /// Where keys and values live. `"memory"`: all in RAM, persisted through the WAL and
        /// snapshots. `"hybrid"`: the index in RAM, values in segment files on `value_device`,
        /// hot values cached in `cache_bytes`. A data directory keeps the tier it was created
        /// with (see `docs/wal.md`, manifest).
        tier: Tier = Tier::Memory,
            kind None, check Check::Any;
        /// `"sync"`: a write is acknowledged after the fdatasync covering it returns.
        /// `"async"`: acknowledged once applied in memory, flushed every `flush_interval`
        /// (a crash loses at most that window). `"none"`: RAM only, no WAL, no snapshots.
        durability: Durability = Durability::Sync,
            kind None, check Check::Any;
        /// Size of one preallocated, zero-filled WAL segment file.
        wal_segment_size: ByteSize = ByteSize::mib(64),
            kind None, check Check::Range(ByteSize::kib(64), ByteSize::gib(64)),
            note "multiple of 4096";
        /// Most bytes one group commit (one write + one fdatasync) carries; each shard
        /// holds `wal_flushes_in_flight` + 1 buffers of this size. A value whose record is larger is logged as a
        /// chain of chunks over several flushes (`docs/wal.md`, "Chunk chains").
        group_commit_max_bytes: ByteSize = ByteSize::mib(2),
            kind None, check Check::Range(ByteSize::kib(4), ByteSize::gib(1)),
            note "multiple of 4096, see the rules below";
        /// Longest a write waits for others to join its group commit. `"0s"`: a flush
        /// starts as soon as the previous one completes (writes arriving meanwhile still batch).
        group_commit_max_delay: Duration = Duration::ZERO,
            kind None, check Check::Range(Duration::ZERO, Duration::from_secs(1));
        /// Most group commits a shard has on the device at once: while one is written, the
        /// next is sealed and submitted; writes are acknowledged in LSN order once every
        /// flush up to theirs returned. `1`: one at a time. Each shard holds one buffer of
        /// `group_commit_max_bytes` more than this (`docs/wal.md`, "Several flushes in flight").
        wal_flushes_in_flight: u32 = 1,
            kind None, check Check::Range(1, 8);
        /// In `"async"` mode, how often buffered writes are flushed.
        flush_interval: Duration = Duration::from_millis(10),
            kind None, check Check::Range(Duration::from_micros(100), Duration::from_secs(60));
        /// How often, while records become durable, each shard records in its `wal.head` that
        /// every record so far is durable (one 4 KiB write and one fdatasync, beside the
        /// flushes; it also does so at a clean stop). Recovery then refuses a log whose last
        /// flushes were damaged instead of reading them as a torn write: only what was
        /// acknowledged in the last `wal_mark_interval` before a crash can be damaged
        /// unnoticed (`docs/wal.md`, "The durable mark").
        wal_mark_interval: Duration = Duration::from_millis(100),
            kind None, check Check::Range(Duration::from_millis(1), Duration::from_secs(60));
        /// The WAL allowance: a checkpoint is due once the WAL past the last one reaches
        /// this, or, with the memory tier, what twice the live data leaves beside the kept
        /// snapshots if that is more. Disk use stays within 2 x live data + this + 3
        /// segments per shard, plus up to this again of segments kept for the next
        /// checkpoint while checkpoints run long (`docs/wal.md`, "Disk bounded by live
        /// data"). WAL replayed at a start counts too; a start that replays the threshold
        /// checkpoints before ready.
        checkpoint_wal_bytes: ByteSize = ByteSize::mib(256),
            kind None, check Check::Range(ByteSize::kib(64), ByteSize::gib(1024));
        /// Also take a checkpoint this often if anything was written; `"0s"` disables the timer.
        checkpoint_interval: Duration = Duration::from_secs(300),
            kind None, check Check::Range(Duration::ZERO, Duration::from_secs(7 * 86_400));
        /// Most delta checkpoints in a row: a delta writes only what changed since the
        /// checkpoint before it (loaded over it at a restart); a full checkpoint, which copies
        /// everything, starts each chain, and one is also taken once the chain's deltas
        /// together outgrow it. `0`: every checkpoint is full.
        checkpoint_deltas_max: u32 = 32,
            kind None, check Check::Range(0, 1000);
        /// The device (a `[devices]` key) holding the WAL and snapshots.
        wal_device: String = "wal".to_string(),
            kind Some("name"), check Check::Any, note "a key of `[devices]`";
        /// The device (a `[devices]` key) holding the hybrid tier's value segments. It may
        /// differ from `wal_device`; its I/O pays its own device's profile.
        value_device: String = "wal".to_string(),
            kind Some("name"), check Check::Any, note "a key of `[devices]`";
        /// A faster device (a `[devices]` key) in front of `value_device` for the hybrid
        /// tier: new writes and records read often lately live there, up to `hot_bytes`;
        /// GC moves the records not read lately to `value_device`, which is then the cold
        /// device (`docs/storage.md`, "Hot and cold devices"). `""`: none, every value on
        /// `value_device`.
        hot_device: String = String::new(),
            kind Some("name"), check Check::Any, note "`\"\"` or a key of `[devices]` other than `value_device`";
        /// Bytes of value segment files the hot device may hold, whole server (split evenly
        /// across the shards; each shard's part at least four `value_segment_size`).
        /// `"0B"` with a `hot_device` set empties the hot device (its records move to the
        /// cold one as GC comes to them) and writes go to the cold device.
        hot_bytes: ByteSize = ByteSize(0),
            kind None, check Check::Range(ByteSize(0), ByteSize::gib(1 << 20));
        /// Reads of a key lately it needs at least to be copied from the cold device to the
        /// hot one when a GET reads it there, or kept on the hot device when GC comes to it
        /// there; past this floor it must also be read more often than the records at the
        /// hot device's eviction end (TinyLFU's test, `docs/storage.md`, "Hot and cold
        /// devices"; "lately": a count that halves as the shard reads other keys).
        hot_promote_reads: u32 = 2,
            kind None, check Check::Range(1, 15);
        /// The share (percent) of each device's IOPS and bandwidth that moves between the hot
        /// and the cold device may take: copies up on a read, and GC of hot segments (which
        /// moves records down). Past it a copy up is skipped and GC of a hot segment waits;
        /// GETs, PUTs and the WAL keep the rest of the device's profile. Only limited profiles
        /// limit moves.
        hot_move_percent: u32 = 20,
            kind None, check Check::Range(1, 100);
        /// The hybrid tier's read cache for the whole server, split evenly across the shards.
        cache_bytes: ByteSize = ByteSize::mib(256),
            kind None, check Check::Range(ByteSize(0), ByteSize::gib(1024));
        /// Size of one hybrid-tier value segment file.
        value_segment_size: ByteSize = ByteSize::mib(64),
            kind None, check Check::Range(ByteSize::kib(64), ByteSize::gib(4)),
            note "multiple of 4096";
        /// Keys the hybrid index is sized for, whole server (split across the shards): the
        /// index is a fixed table sized for this many keys (about 8 B of RAM per key at that
        /// size); more keys still work but spill to overflow buckets and cost more RAM per key
        /// (STATS `tier.spilled_keys`). It can change for an existing data directory: a
        /// restart rebuilds the index at the new size, reading every record's key once from
        /// the value segments before the shard serves (`docs/storage.md`, Recovery).
        index_keys: u64 = 16_000_000,
            kind None, check Check::Range(1024, 100_000_000_000);
        /// The hybrid tier's garbage collection rewrites segments while garbage exceeds this
        /// percent of segment bytes (bounds space amplification to 100 / (100 - this)).
        gc_garbage_percent: u32 = 50,
            kind None, check Check::Range(5, 95);
        /// How often each shard's active expiry runs (deletes keys whose expiry time passed;
        /// reads never return such keys, this reclaims their memory).
        expiry_tick: Duration = Duration::from_millis(100),
            kind None, check Check::Range(Duration::from_millis(1), Duration::from_secs(60));
        /// Most expired keys one active-expiry tick deletes on a shard (its cost bound; the
        /// rest wait for later ticks).
        expiry_keys_per_tick: u32 = 256,
            kind None, check Check::Range(1, 1_000_000);
        /// Most bytes of RAM the storage tier may hold, whole server (split evenly across the
        /// shards): entries, tables and expiry index on the memory tier; index, read cache and
        /// their bookkeeping on the hybrid tier. A write that would grow a shard past its share
        /// answers OUT_OF_MEMORY (`-OOM` on RESP); reads, deletes and writes that do not grow
        /// memory still work (Redis's `noeviction`). What is not counted, and its bound:
        /// `docs/operations.md`, "Memory limit". `"0B"`: no limit.
        max_memory: ByteSize = ByteSize(0),
            kind None, check Check::Range(ByteSize(0), ByteSize::gib(1024 * 1024)),
            note "\"0B\" or at least 1MiB; see the rules below";
    }
}

section! {
    /// `[limits]`: sizes and counts the server enforces on every request.
    pub struct LimitsConfig at "limits" {
        /// Largest key. 64 KiB by default, above the 50,000-byte keys of Redis's own tests.
        key_bytes_max: ByteSize = ByteSize::kib(64),
            kind None, check Check::Range(ByteSize(1), ByteSize::mib(1)),
            note "see the rules below";
        /// Largest value. 8 MiB by default: twice the largest value of Redis's string
        /// tests, and it fits the default frame with the largest key. Values larger than
        /// a group commit are logged as chunk chains; up to 512 MiB (Redis's limit).
        value_bytes_max: ByteSize = ByteSize::mib(8),
            kind None, check Check::Range(ByteSize(0), ByteSize::mib(512)),
            note "see the rules below";
        /// Largest wire frame, in either direction. Also the most bytes of values one
        /// request's GETs read per shard (later GETs answer FRAME_TOO_LARGE without a
        /// lookup), which bounds a request's memory.
        frame_bytes_max: ByteSize = ByteSize::mib(16),
            kind None, check Check::Range(ByteSize::kib(4), ByteSize::gib(1)),
            note "see the rules below";
        /// Most operations in one frame or engine batch.
        ops_per_frame_max: u32 = 10_000,
            kind None, check Check::Range(1, 1_000_000);
        /// Capacity of each shard's inbound request channel, in batches, and
        /// the most batches one shard may have unanswered at another (the
        /// shard-to-shard queues). A full channel or share is back-pressure.
        shard_queue_depth: u32 = 1024,
            kind None, check Check::Range(1, 65_536);
    }
}

section! {
    /// `[io]`: the I/O backend.
    pub struct IoConfig at "io" {
        /// `"auto"`: io_uring when the kernel allows it, else the fallback (said once
        /// in the log). `"uring"`: io_uring or refuse to start. `"fallback"`: always
        /// readiness polling + a blocking-I/O thread pool.
        backend: Backend = Backend::Auto,
            kind None, check Check::Any;
        /// io_uring submission queue entries per shard.
        queue_depth: u32 = 256,
            kind None, check Check::Range(8, 4096), note "a power of two";
        /// Where shard threads run. `"auto"`: each pinned to one of the CPUs the
        /// process may use (its affinity mask, e.g. from `taskset` or systemd's
        /// `CPUAffinity=`), shard after shard, starting at a CPU that differs from
        /// process to process so that servers sharing a machine spread out.
        /// `"off"`: not pinned (the kernel places them). A list such as `"0-3,6"`:
        /// shard i on the list's i-th CPU (round-robin); each must be in the mask.
        cpus: String = "auto".to_string(),
            kind Some("`\"auto\"`, `\"off\"` or a CPU list"), check Check::NotEmpty("give \"auto\", \"off\" or a CPU list such as \"0-3,6\"");
    }
}

section! {
    /// `[log]`: the server's log lines (written to stderr).
    pub struct LogConfig at "log" {
        /// `"text"`: one human-readable line per event. `"json"`: one JSON object
        /// per line (`timestamp`, `level`, `fields`, `target`), for journald or a
        /// log collector. `RUST_LOG` still chooses the levels.
        format: LogFormat = LogFormat::Text,
            kind None, check Check::Any;
    }
}

section! {
    /// `[devices.NAME]`: a directory on a disk, with the disk profile that I/O
    /// to it obeys.
    pub struct DeviceConfig at "devices.NAME" {
        /// Directory on this device; `""` means the data directory.
        path: PathBuf = PathBuf::new(),
            kind None, check Check::Any;
        /// Disk profile: a built-in (`sas`, `gpssd`, `nvme`, `unthrottled`) or a `[profiles]` entry.
        profile: String = "unthrottled".to_string(),
            kind Some("name"), check Check::Any, note "a known profile";
    }
}

section! {
    /// `[users.NAME]`: a named user with its own password and role, next to the
    /// `default` user of `server.requirepass` / `server.password_file`.
    pub struct UserConfig at "users.NAME" {
        /// File whose content (one trailing newline removed) is this user's password;
        /// read at start, like `server.password_file`.
        password_file: PathBuf = PathBuf::new(),
            kind None, check Check::NotEmpty("every user needs a password file"),
            note "a readable file holding 1 to 512 bytes";
        /// What the user may do: `read-only`, `read-write` or `admin`.
        role: String = "read-only".to_string(),
            kind Some("role"), check Check::Any, note "`read-only`, `read-write` or `admin`";
    }
}

section! {
    /// `[profiles.NAME]`: a disk class, an IOPS rate with a burst credit and
    /// optionally a bandwidth cap. The default is the `unthrottled` profile.
    /// See the module docs of `profiles` and `docs/config.md` for the burst
    /// model and the I/O counting rule.
    pub struct ProfileConfig at "profiles.NAME" {
        /// Sustained I/Os per second; the credit bucket's refill rate. `0` = no IOPS limit.
        iops: u64 = 0,
            kind None, check Check::Range(0, 10_000_000);
        /// Rate allowed while burst credit lasts.
        burst_iops: u64 = 0,
            kind None, check Check::Range(0, 10_000_000),
            note "`>= iops`; `0` when `iops = 0`";
        /// Size of the credit bucket, in I/Os; it starts full and refills at `iops` per second.
        burst_credit: u64 = 0,
            kind None, check Check::Range(0, 1_000_000_000_000),
            note "`> 0` when `burst_iops > iops`; `0` when `iops = 0`";
        /// Bandwidth cap in bytes per second; `"0B"` = none.
        bytes_per_sec: ByteSize = ByteSize(0),
            kind None, check Check::Range(ByteSize(0), ByteSize::gib(1024)),
            note "`\"0B\"` or at least `io_unit`";
        /// An I/O larger than this counts as `ceil(len / io_unit)` I/Os.
        io_unit: ByteSize = ByteSize::kib(256),
            kind None, check Check::Range(ByteSize::kib(4), ByteSize::mib(64)),
            note "multiple of 4096";
        /// Whether an fdatasync counts as one I/O.
        count_fsync: bool = true,
            kind None, check Check::Any;
    }
}

// ---------------------------------------------------------------------------
// What the schema prints.

/// The Markdown table of a section's fields, as `docs/config.md` shows it.
pub fn docs_table(fields: &[FieldInfo]) -> String {
    let mut out = String::from(
        "| key | meaning | type / unit | default | allowed |\n| --- | --- | --- | --- | --- |\n",
    );
    for f in fields {
        out.push_str(&format!(
            "| `{}` | {} | {} | `{}` | {} |\n",
            f.key,
            f.doc.replace('|', "\\|"),
            f.kind,
            f.default,
            f.allowed.replace('|', "\\|"),
        ));
    }
    out
}

/// Every section whose table `docs/config.md` carries, by its path.
pub fn docs_sections() -> Vec<(&'static str, Vec<FieldInfo>)> {
    vec![
        ("top level", vec![shards_field()]),
        (ServerConfig::PATH, ServerConfig::fields()),
        (StorageConfig::PATH, StorageConfig::fields()),
        (LimitsConfig::PATH, LimitsConfig::fields()),
        (IoConfig::PATH, IoConfig::fields()),
        (LogConfig::PATH, LogConfig::fields()),
        (DeviceConfig::PATH, DeviceConfig::fields()),
        (ProfileConfig::PATH, ProfileConfig::fields()),
        (UserConfig::PATH, UserConfig::fields()),
    ]
}

/// Wraps `text` into `# ` comment lines of at most 80 columns.
fn comment(text: &str, out: &mut String) {
    let plain = text.replace('`', "");
    let mut line = String::from("#");
    for word in plain.split_whitespace() {
        if line.len() + 1 + word.len() > 80 && line.len() > 1 {
            out.push_str(&line);
            out.push('\n');
            line = String::from("#");
        }
        line.push(' ');
        line.push_str(word);
    }
    out.push_str(&line);
    out.push('\n');
}

fn write_table(
    out: &mut String,
    header: &str,
    fields: &[FieldInfo],
    values: &[(&str, String)],
    commented: bool,
) {
    if !header.is_empty() {
        out.push_str(&format!("\n[{header}]\n"));
    }
    for (f, (key, value)) in fields.iter().zip(values) {
        debug_assert_eq!(f.key, *key);
        if commented {
            comment(&format!("{} Allowed: {}.", f.doc, f.allowed), out);
        }
        out.push_str(&format!("{key} = {value}\n"));
    }
}

impl Config {
    fn write_toml(&self, out: &mut String, commented: bool) {
        fn table<S: Section>(out: &mut String, header: &str, s: &S, commented: bool) {
            write_table(out, header, &S::fields(), &s.values(), commented);
        }
        write_table(
            out,
            "",
            &[shards_field()],
            &[("shards", self.shards.toml_text())],
            commented,
        );
        table(out, ServerConfig::PATH, &self.server, commented);
        table(out, StorageConfig::PATH, &self.storage, commented);
        table(out, LimitsConfig::PATH, &self.limits, commented);
        table(out, IoConfig::PATH, &self.io, commented);
        table(out, LogConfig::PATH, &self.log, commented);
        let named = |kind: &str, name: &str| format!("{kind}.{}", table_key(name));
        for (name, device) in &self.devices {
            table(out, &named("devices", name), device, commented);
        }
        for (name, profile) in &self.profiles {
            table(out, &named("profiles", name), profile, commented);
        }
        for (name, user) in &self.users {
            table(out, &named("users", name), user, commented);
        }
    }

    /// The effective configuration as TOML (every field, defaults included),
    /// e.g. for `ringkv-server --print-config`. Loading the text back with
    /// [`Config::from_toml_str`] gives an equal `Config`.
    pub fn to_toml_string(&self) -> String {
        let mut out = String::new();
        self.write_toml(&mut out, false);
        out
    }
}

/// A table name as TOML needs it: bare when it is a bare key, else quoted.
fn table_key(name: &str) -> String {
    let bare = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if bare {
        name.to_string()
    } else {
        quoted_toml(name)
    }
}

const EXAMPLE_HEADER: &str = "\
# ringkv configuration: every setting at its default. docs/config.md explains
# each one (meaning, unit, range). Unknown keys are rejected, so a typo is an
# error, not a silent default. Sizes: \"4096\", \"64KiB\", \"1MiB\" (also KB, MB, GB).
# Durations: \"200us\", \"10ms\", \"5s\", \"2m\", \"1h\" (\"0\" alone needs no unit).
# This file is generated from the schema in tunables/src/schema.rs; a test
# keeps the two equal (RINGKV_BLESS=1 cargo test -p ringkv-tunables rewrites it).

";

const EXAMPLE_FOOTER: &str = "
# Examples (uncomment to use; they replace the [devices.wal] table above).
#
# # The WAL on an emulated ultra-high I/O cloud SSD (6,500 IOPS, burst 16,000).
# [devices.wal]
# path = \"/mnt/nvme/ringkv\"
# profile = \"nvme\"
#
# # A disk class of your own; a device uses it with profile = \"mydisk\".
# # A profile named like a built-in one (e.g. \"sas\") replaces the built-in.
# [profiles.mydisk]
# iops = 3000                # sustained I/Os per second; 0 = no IOPS limit
# burst_iops = 6000          # rate while burst credit lasts; >= iops
# burst_credit = 1800000     # credit bucket size in I/Os; refills at iops per second
# bytes_per_sec = \"200MiB\"   # bandwidth cap; \"0B\" = none
# io_unit = \"256KiB\"         # a larger I/O counts ceil(len / io_unit) I/Os
# count_fsync = true         # an fdatasync counts as one I/O
";

/// The shipped `ringkv.toml`: every field at its default with its doc as a
/// comment, then commented-out examples.
pub fn example_toml() -> String {
    let mut out = String::from(EXAMPLE_HEADER);
    Config::default().write_toml(&mut out, true);
    out.push_str(EXAMPLE_FOOTER);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// What `--print-config` writes parses back to the same values, for
    /// strings TOML and Rust escape differently.
    #[test]
    fn printed_strings_parse_back_as_they_were() {
        let mut c = Config::default();
        let dir = "/srv/cafe\u{301}/\"quoted\" \\ tab\tbell\u{7}/\u{1F600}";
        c.storage.data_dir = dir.into();
        c.server.requirepass = "pa\"ss\\word\u{0}\u{9f}".to_string();
        let text = c.to_toml_string();
        assert!(text.contains("cafe\u{301}"), "{text}");
        let back = Config::from_toml_str(&text).expect("printed config parses back");
        assert_eq!(back.storage.data_dir, Path::new(dir));
        assert_eq!(back.server.requirepass, c.server.requirepass);
    }

    fn repo_path(name: &str) -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(name)
    }

    /// Compares a checked-in file with what the schema prints; with
    /// `RINGKV_BLESS=1` rewrites the file instead.
    fn assert_generated(name: &str, expected: &str) {
        let path = repo_path(name);
        if std::env::var_os("RINGKV_BLESS").is_some() {
            std::fs::write(&path, expected).expect("write generated file");
            return;
        }
        let actual = std::fs::read_to_string(&path).expect("read checked-in file");
        assert!(
            actual == expected,
            "{name} is not what the schema prints; run `RINGKV_BLESS=1 cargo test -p ringkv-tunables` and commit the result"
        );
    }

    #[test]
    fn shipped_ringkv_toml_is_generated_from_the_schema() {
        assert_generated("ringkv.toml", &example_toml());
    }

    /// `docs/config.md` carries each section's table between
    /// `<!-- schema: PATH -->` and `<!-- /schema -->` lines.
    #[test]
    fn config_docs_tables_are_generated_from_the_schema() {
        let path = repo_path("docs/config.md");
        let mut text = std::fs::read_to_string(&path).expect("read docs/config.md");
        for (section, fields) in docs_sections() {
            let open = format!("<!-- schema: {section} -->\n");
            let start = text
                .find(&open)
                .unwrap_or_else(|| panic!("docs/config.md has no `{}` marker", open.trim()))
                + open.len();
            let end = start
                + text[start..]
                    .find("<!-- /schema -->")
                    .expect("closing schema marker");
            text.replace_range(start..end, &docs_table(&fields));
        }
        assert_generated("docs/config.md", &text);
    }

    #[test]
    fn every_section_lists_its_fields_once_with_docs() {
        for (section, fields) in docs_sections() {
            let mut keys: Vec<&str> = fields.iter().map(|f| f.key).collect();
            keys.sort_unstable();
            keys.dedup();
            assert_eq!(keys.len(), fields.len(), "{section}: a key twice");
            for f in &fields {
                assert!(!f.doc.is_empty(), "{section}.{}: no doc", f.key);
                assert!(!f.allowed.is_empty(), "{section}.{}: no allowed", f.key);
            }
        }
    }

    #[test]
    fn printed_config_loads_back_equal() {
        let mut c = Config::default();
        c.server.listen = "127.0.0.1:9000".to_string();
        c.storage.wal_segment_size = ByteSize::mib(128);
        c.profiles.insert(
            "my-disk".to_string(),
            crate::builtin_profile("sas").expect("sas"),
        );
        assert_eq!(Config::from_toml_str(&c.to_toml_string()), Ok(c));
        assert_eq!(
            Config::from_toml_str(&example_toml()),
            Ok(Config::default())
        );
    }
}
