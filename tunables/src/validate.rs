//! Validation of a [`Config`]: the allowed range of every numeric field and the
//! rules that tie fields together.
//!
//! Must hold: `validate` reports every broken rule, not only the first, and a
//! rule that reads a field the loader could not parse is skipped (the parse
//! error already names that field; a second message about a default value the
//! user never chose would only mislead). The ranges here are the ones
//! documented in `docs/config.md`; change both together.

use crate::error::{ConfigError, ConfigErrors};
use crate::schema::Section;
use crate::suggest::nearest;
use crate::{
    builtin_profile_names, ByteSize, Config, Durability, Duration, IoConfig, LimitsConfig,
    LogConfig, ProfileConfig, ServerConfig, StorageConfig, Tier, SHARDS_MAX,
};
use std::collections::BTreeSet;
use std::fmt::Display;
use std::net::SocketAddr;

/// O_DIRECT alignment: WAL segments, group-commit buffers and profile I/O
/// units are multiples of this.
pub const PAGE_SIZE_BYTES: u64 = 4096;
/// Room a flush buffer keeps besides the key of a chain's end record, in the
/// rule `key_bytes_max + WAL_FLUSH_OVERHEAD_BYTES_MAX <= group_commit_max_bytes`:
/// the segment header block, the largest seal, the record header and the
/// expiry and chain-start fields. Values have no such rule: a value larger
/// than a flush is logged as a chunk chain.
pub const WAL_FLUSH_OVERHEAD_BYTES_MAX: u64 = 12 * 1024;
/// Room reserved for a frame header plus one operation header in the rule
/// `frame_bytes_max >= key_bytes_max + value_bytes_max + FRAME_OVERHEAD_BYTES_MAX`
/// (one max-size PUT always fits a frame).
pub const FRAME_OVERHEAD_BYTES_MAX: u64 = 256;
const QUEUE_DEPTH: (u32, u32) = (8, 4096);
/// What `storage.max_memory`'s rule counts per key of `storage.index_keys`
/// for the hybrid tier's fixed index (its slots, sized above the key count).
pub const HYBRID_INDEX_BYTES_PER_KEY: u64 = 8;
const NAME_LEN_MAX: usize = 64;
/// Longest password; the wire protocol's auth block carries at most this many
/// bytes (`ringkv_protocol::PASSWORD_BYTES_MAX`, kept equal by a server test).
pub const PASSWORD_BYTES_MAX: usize = 512;

/// Whether `addr` is reachable only from this machine (127.0.0.0/8, ::1, or
/// an IPv4-mapped loopback address). 0.0.0.0 and :: are every interface.
pub fn is_loopback(addr: &SocketAddr) -> bool {
    addr.ip().to_canonical().is_loopback()
}

/// Protected mode's decision: the listeners of `c` that are reachable from
/// other machines while no password is configured and the opt-out is off,
/// as (field, address). Empty when the configuration may start.
pub fn unprotected_listeners(c: &Config) -> Vec<(&'static str, SocketAddr)> {
    if c.has_password() || c.server.dangerously_listen_without_password {
        return Vec::new();
    }
    let mut out = Vec::new();
    for (field, value) in [
        ("server.listen", &c.server.listen),
        ("server.metrics_listen", &c.server.metrics_listen),
        ("server.resp_listen", &c.server.resp_listen),
    ] {
        if let Ok(addr) = value.parse::<SocketAddr>() {
            if !is_loopback(&addr) {
                out.push((field, addr));
            }
        }
    }
    out
}

/// Collects errors. Works in two phases: first each field on its own (range,
/// format), then the rules between fields. A field that failed to parse or is
/// out of range is "bad", and a rule reading a bad field is skipped.
pub(crate) struct Checker {
    errors: Vec<ConfigError>,
    bad: BTreeSet<String>,
}

/// How a value appears in a message: sizes and durations as the quoted
/// strings one would write in TOML, numbers bare.
fn quoted(v: impl Display) -> String {
    format!("\"{v}\"")
}

impl Checker {
    /// `failed`: fields the loader could not parse (they hold defaults).
    pub(crate) fn new(failed: &BTreeSet<String>) -> Self {
        Checker {
            errors: Vec::new(),
            bad: failed.clone(),
        }
    }

    pub(crate) fn finish(self) -> Vec<ConfigError> {
        self.errors
    }

    fn is_bad(&self, fields: &[&str]) -> bool {
        fields.iter().any(|f| self.bad.contains(*f))
    }

    fn push(&mut self, error: ConfigError) {
        if let Some(field) = error.field() {
            self.bad.insert(field.to_string());
        }
        self.errors.push(error);
    }

    fn out_of_range(&mut self, field: &str, value: String, allowed: String) {
        self.push(ConfigError::OutOfRange {
            field: field.to_string(),
            line: None,
            value,
            allowed,
        });
    }

    pub(crate) fn range_u64(&mut self, field: &str, value: u64, (min, max): (u64, u64)) {
        if !self.is_bad(&[field]) && !(min..=max).contains(&value) {
            self.out_of_range(field, value.to_string(), format!("{min}..={max}"));
        }
    }

    pub(crate) fn range_u32(&mut self, field: &str, value: u32, (min, max): (u32, u32)) {
        self.range_u64(field, u64::from(value), (u64::from(min), u64::from(max)));
    }

    pub(crate) fn range_size(
        &mut self,
        field: &str,
        value: ByteSize,
        (min, max): (ByteSize, ByteSize),
    ) {
        if !self.is_bad(&[field]) && !(min..=max).contains(&value) {
            self.out_of_range(field, quoted(value), format!("{min}..={max}"));
        }
    }

    pub(crate) fn range_duration(
        &mut self,
        field: &str,
        value: Duration,
        (min, max): (Duration, Duration),
    ) {
        if !self.is_bad(&[field]) && !(min..=max).contains(&value) {
            self.out_of_range(field, quoted(value), format!("{min}..={max}"));
        }
    }

    /// Reports `rule` against `field` unless it `holds`, or unless `field` or
    /// one of `reads` (the other fields the rule depends on) is bad.
    fn rule(&mut self, holds: bool, field: &str, value: String, reads: &[&str], rule: String) {
        if holds || self.is_bad(reads) || self.is_bad(&[field]) {
            return;
        }
        self.push(ConfigError::Relation {
            field: field.to_string(),
            line: None,
            value,
            rule,
        });
    }

    pub(crate) fn bad_value(&mut self, field: &str, value: String, reason: String) {
        if self.is_bad(&[field]) {
            return;
        }
        self.push(ConfigError::BadValue {
            field: field.to_string(),
            line: None,
            value,
            reason,
        });
    }

    fn unknown_name(&mut self, field: &str, value: &str, kind: &'static str, known: Vec<String>) {
        if self.is_bad(&[field]) {
            return;
        }
        let suggestion = nearest(value, known.iter().map(String::as_str));
        self.push(ConfigError::UnknownName {
            field: field.to_string(),
            line: None,
            value: quoted(value),
            kind,
            known,
            suggestion,
        });
    }

    /// A device or profile name: 1 to 64 of `A-Z a-z 0-9 _ -`, so it can be
    /// used as a metric label and a directory name.
    fn name(&mut self, field: &str, name: &str) {
        let ok = !name.is_empty()
            && name.len() <= NAME_LEN_MAX
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !ok {
            self.bad_value(
                field,
                quoted(name),
                format!(
                    "a name must be 1 to {NAME_LEN_MAX} characters of A-Z, a-z, 0-9, '_' and '-'"
                ),
            );
        }
    }

    /// Multiple of [`PAGE_SIZE_BYTES`].
    fn page_multiple(&mut self, field: &str, value: ByteSize) {
        self.rule(
            value.0.is_multiple_of(PAGE_SIZE_BYTES),
            field,
            quoted(value),
            &[],
            format!("must be a multiple of {PAGE_SIZE_BYTES} bytes (O_DIRECT alignment)"),
        );
    }

    pub(crate) fn socket_addr(&mut self, field: &str, value: &str) -> Option<SocketAddr> {
        if self.is_bad(&[field]) {
            return None;
        }
        match value.parse::<SocketAddr>() {
            Ok(addr) => Some(addr),
            Err(_) => {
                self.bad_value(
                    field,
                    quoted(value),
                    "not an IP socket address; write IP:PORT such as \"127.0.0.1:7379\" or \"[::1]:7379\" (host names are not resolved)".to_string(),
                );
                None
            }
        }
    }

    pub(crate) fn config(&mut self, c: &Config) {
        self.fields(c);
        self.rules(c);
        for (name, p) in &c.profiles {
            let prefix = format!("profiles.{name}");
            self.name(&prefix, name);
            self.profile(&prefix, p);
        }
    }

    /// Phase one: every field on its own (the checks declared in the schema).
    fn fields(&mut self, c: &Config) {
        self.range_u32("shards", c.shards, (0, SHARDS_MAX));
        c.server.check_fields(self, ServerConfig::PATH);
        if c.server.requirepass.len() > PASSWORD_BYTES_MAX {
            // Never echo a password, not even a wrong one.
            self.bad_value(
                "server.requirepass",
                quoted(crate::REDACTED),
                format!(
                    "is {} bytes; a password is at most {PASSWORD_BYTES_MAX} bytes",
                    c.server.requirepass.len()
                ),
            );
        }
        c.storage.check_fields(self, StorageConfig::PATH);
        c.limits.check_fields(self, LimitsConfig::PATH);
        c.io.check_fields(self, IoConfig::PATH);
        c.log.check_fields(self, LogConfig::PATH);
        for (name, device) in &c.devices {
            let prefix = format!("devices.{name}");
            self.name(&prefix, name);
            device.check_fields(self, &prefix);
        }
        self.role("server.default_role", &c.server.default_role);
        for (name, user) in &c.users {
            let prefix = format!("users.{name}");
            self.name(&prefix, name);
            if name == crate::DEFAULT_USER {
                self.bad_value(
                    &prefix,
                    quoted(name),
                    "duplicate user: `default` is the user of server.requirepass / \
                     server.password_file; set its role with server.default_role"
                        .to_string(),
                );
            }
            user.check_fields(self, &prefix);
            self.role(&format!("{prefix}.role"), &user.role);
        }
    }

    /// A role name: one of [`crate::ROLE_NAMES`].
    fn role(&mut self, field: &str, role: &str) {
        if !crate::ROLE_NAMES.contains(&role) {
            let known = crate::ROLE_NAMES.iter().map(|r| r.to_string()).collect();
            self.unknown_name(field, role, "role", known);
        }
    }

    /// Access control: password sources, TLS files, protected mode.
    fn access_rules(&mut self, c: &Config) {
        let s = &c.server;
        let path_set = |p: &std::path::Path| !p.as_os_str().is_empty();
        self.rule(
            s.requirepass.is_empty() || !path_set(&s.password_file),
            "server.password_file",
            quoted(s.password_file.display()),
            &["server.requirepass"],
            "cannot be set together with server.requirepass; keep one of them".to_string(),
        );
        let tls = s.tls_native || s.tls_metrics || s.tls_resp;
        for (field, path) in [
            ("server.tls_cert_file", &s.tls_cert_file),
            ("server.tls_key_file", &s.tls_key_file),
        ] {
            self.rule(
                !tls || path_set(path),
                field,
                "\"\"".to_string(),
                &["server.tls_native", "server.tls_metrics", "server.tls_resp"],
                "must name a PEM file when server.tls_native, tls_metrics or tls_resp is on"
                    .to_string(),
            );
        }
        self.rule(
            tls || !path_set(&s.tls_client_ca_file),
            "server.tls_client_ca_file",
            quoted(s.tls_client_ca_file.display()),
            &["server.tls_native", "server.tls_metrics", "server.tls_resp"],
            "has no effect while TLS is off; set server.tls_native (or tls_metrics, tls_resp) = true, or remove it".to_string(),
        );
        for (field, addr) in unprotected_listeners(c) {
            let value = match field {
                "server.listen" => &s.listen,
                "server.resp_listen" => &s.resp_listen,
                _ => &s.metrics_listen,
            };
            // The TLS setting of this listener, named in the advice.
            let tls = match field {
                "server.listen" => "server.tls_native",
                "server.resp_listen" => "server.tls_resp",
                _ => "server.tls_metrics",
            };
            self.rule(
                false,
                field,
                quoted(value),
                &[],
                format!(
                    "protected mode: {addr} is reachable from other machines and no password is set, \
                     so anyone who can connect could read and delete every key. Set \
                     server.requirepass or server.password_file (and {tls} = true), \
                     or listen on 127.0.0.1; to run open anyway, set \
                     server.dangerously_listen_without_password = true \
                     (flag --dangerously-listen-without-password)"
                ),
            );
        }
    }

    /// Phase two: the rules that tie fields together.
    fn rules(&mut self, c: &Config) {
        self.access_rules(c);
        if !self.is_bad(&["io.cpus"]) {
            if let Err(reason) = crate::CpuPlacement::parse(&c.io.cpus) {
                self.bad_value("io.cpus", quoted(&c.io.cpus), reason);
            }
        }
        let s = &c.server;
        if !s.metrics_listen.is_empty() {
            let listen = s.listen.parse::<SocketAddr>();
            let metrics = s.metrics_listen.parse::<SocketAddr>();
            if let (Ok(l), Ok(m)) = (listen, metrics) {
                self.rule(
                    l != m || l.port() == 0,
                    "server.metrics_listen",
                    quoted(&s.metrics_listen),
                    &["server.listen"],
                    "must differ from server.listen (one port cannot serve both)".to_string(),
                );
            }
        }
        if !s.resp_listen.is_empty() {
            if let Ok(r) = s.resp_listen.parse::<SocketAddr>() {
                for (field, other) in [
                    ("server.listen", &s.listen),
                    ("server.metrics_listen", &s.metrics_listen),
                ] {
                    if let Ok(o) = other.parse::<SocketAddr>() {
                        self.rule(
                            r != o || r.port() == 0,
                            "server.resp_listen",
                            quoted(&s.resp_listen),
                            &[field],
                            format!("must differ from {field} (one port cannot serve both)"),
                        );
                    }
                }
            }
        }

        let s = &c.storage;
        let l = &c.limits;
        let gc = s.group_commit_max_bytes;
        self.page_multiple("storage.wal_segment_size", s.wal_segment_size);
        self.page_multiple("storage.group_commit_max_bytes", gc);
        self.page_multiple("storage.value_segment_size", s.value_segment_size);
        let half = ByteSize(s.wal_segment_size.0 / 2);
        self.rule(
            gc <= half,
            "storage.group_commit_max_bytes",
            quoted(gc),
            &["storage.wal_segment_size"],
            format!("must be <= storage.wal_segment_size / 2 ({half}) so a flush never straddles most of a segment"),
        );
        let record = l
            .key_bytes_max
            .0
            .saturating_add(WAL_FLUSH_OVERHEAD_BYTES_MAX);
        self.rule(
            record <= gc.0,
            "storage.group_commit_max_bytes",
            quoted(gc),
            &["limits.key_bytes_max"],
            format!(
                "must be >= limits.key_bytes_max + {WAL_FLUSH_OVERHEAD_BYTES_MAX} ({record} bytes) so the record of the largest key always fits a flush"
            ),
        );
        for (field, device) in [
            ("storage.wal_device", &s.wal_device),
            ("storage.value_device", &s.value_device),
        ] {
            if !c.devices.contains_key(device) && !self.is_bad(&["devices"]) {
                self.unknown_name(field, device, "device", c.devices.keys().cloned().collect());
            }
        }
        self.rule(
            s.hot_bytes.0 == 0 || !s.hot_device.is_empty(),
            "storage.hot_bytes",
            quoted(s.hot_bytes),
            &["storage.hot_device"],
            "needs storage.hot_device (the device the hot bytes live on)".to_string(),
        );
        if !s.hot_device.is_empty() {
            if !c.devices.contains_key(&s.hot_device) && !self.is_bad(&["devices"]) {
                self.unknown_name(
                    "storage.hot_device",
                    &s.hot_device,
                    "device",
                    c.devices.keys().cloned().collect(),
                );
            }
            self.rule(
                s.hot_device != s.value_device,
                "storage.hot_device",
                quoted(&s.hot_device),
                &["storage.value_device"],
                "must differ from storage.value_device (the hot device sits in front of it)"
                    .to_string(),
            );
            self.rule(
                s.tier == Tier::Hybrid,
                "storage.hot_device",
                quoted(&s.hot_device),
                &["storage.tier"],
                "needs storage.tier = \"hybrid\" (the memory tier keeps values in RAM)".to_string(),
            );
        }
        self.rule(
            !(s.tier == Tier::Hybrid && s.durability == Durability::None),
            "storage.durability",
            quoted(s.durability),
            &["storage.tier"],
            "cannot be \"none\" with storage.tier = \"hybrid\": the hybrid tier rebuilds its index from the WAL and checkpoints; use \"sync\" or \"async\", or storage.tier = \"memory\"".to_string(),
        );

        self.max_memory(s);

        let put = l
            .key_bytes_max
            .0
            .saturating_add(l.value_bytes_max.0)
            .saturating_add(FRAME_OVERHEAD_BYTES_MAX);
        self.rule(
            put <= l.frame_bytes_max.0,
            "limits.frame_bytes_max",
            quoted(l.frame_bytes_max),
            &["limits.value_bytes_max", "limits.key_bytes_max"],
            format!(
                "must be >= limits.key_bytes_max + limits.value_bytes_max + {FRAME_OVERHEAD_BYTES_MAX} ({put} bytes) so one max-size PUT fits a frame"
            ),
        );

        let qd = c.io.queue_depth;
        self.rule(
            qd.is_power_of_two(),
            "io.queue_depth",
            qd.to_string(),
            &[],
            format!(
                "must be a power of two in {}..={}",
                QUEUE_DEPTH.0, QUEUE_DEPTH.1
            ),
        );

        for (name, d) in &c.devices {
            let field = format!("devices.{name}.profile");
            // A profile table that could not be read is already reported.
            let unreadable = self.is_bad(&[&format!("profiles.{}", d.profile)]);
            if c.profile(&d.profile).is_none() && !unreadable {
                let mut known: Vec<String> = builtin_profile_names()
                    .iter()
                    .map(|s| s.to_string())
                    .collect();
                for user in c.profiles.keys() {
                    if !known.contains(user) {
                        known.push(user.clone());
                    }
                }
                self.unknown_name(&field, &d.profile, "profile", known);
            }
        }
    }

    /// The fields and rules of one disk profile, named `{prefix}.iops` etc.
    pub(crate) fn profile(&mut self, prefix: &str, p: &ProfileConfig) {
        let f = |name: &str| format!("{prefix}.{name}");
        let (iops, burst_iops, credit) = (f("iops"), f("burst_iops"), f("burst_credit"));
        let (io_unit, bps) = (f("io_unit"), f("bytes_per_sec"));
        p.check_fields(self, prefix);

        if p.iops == 0 {
            self.rule(
                p.burst_iops == 0,
                &burst_iops,
                p.burst_iops.to_string(),
                &[&iops],
                "must be 0 when iops = 0 (iops = 0 means no IOPS limit, so there is nothing to burst above)".to_string(),
            );
            self.rule(
                p.burst_credit == 0,
                &credit,
                p.burst_credit.to_string(),
                &[&iops],
                "must be 0 when iops = 0 (iops = 0 means no IOPS limit)".to_string(),
            );
        } else {
            self.rule(
                p.burst_iops >= p.iops,
                &burst_iops,
                p.burst_iops.to_string(),
                &[&iops],
                format!(
                    "must be >= iops ({}); set it equal to iops for a profile without burst",
                    p.iops
                ),
            );
            self.rule(
                p.burst_iops <= p.iops || p.burst_credit > 0,
                &credit,
                p.burst_credit.to_string(),
                &[&iops, &burst_iops],
                format!(
                    "must be > 0 when burst_iops ({}) > iops ({}), or the burst can never happen",
                    p.burst_iops, p.iops
                ),
            );
        }
        self.page_multiple(&io_unit, p.io_unit);
        self.rule(
            p.bytes_per_sec.0 == 0 || p.bytes_per_sec >= p.io_unit,
            &bps,
            quoted(p.bytes_per_sec),
            &[&io_unit],
            format!(
                "must be \"0B\" (no cap) or at least io_unit ({}) so one full-size I/O fits a second's budget",
                p.io_unit
            ),
        );
    }
}

impl Checker {
    /// `storage.max_memory`: off, or room for the tier's fixed costs.
    fn max_memory(&mut self, s: &crate::StorageConfig) {
        let max = s.max_memory;
        if max.0 == 0 {
            return;
        }
        self.rule(
            max >= ByteSize::mib(1),
            "storage.max_memory",
            quoted(max),
            &[],
            "must be \"0B\" (no limit) or at least 1MiB (an empty shard's tables take some)"
                .to_string(),
        );
        // The hybrid tier's index is a fixed table and its read cache may
        // fill: both are held whatever is written.
        let fixed = s
            .cache_bytes
            .0
            .saturating_add(s.index_keys.saturating_mul(HYBRID_INDEX_BYTES_PER_KEY));
        self.rule(
            s.tier != Tier::Hybrid || max.0 > fixed,
            "storage.max_memory",
            quoted(max),
            &["storage.tier", "storage.cache_bytes", "storage.index_keys"],
            format!(
                "must be more than storage.cache_bytes + {HYBRID_INDEX_BYTES_PER_KEY} B x storage.index_keys ({fixed} bytes) with storage.tier = \"hybrid\": the index and a full read cache are held whatever is written"
            ),
        );
    }
}

impl Config {
    /// Checks every range and every rule between fields (see
    /// `docs/config.md`), reporting all problems at once.
    pub fn validate(&self) -> Result<(), ConfigErrors> {
        let mut c = Checker::new(&BTreeSet::new());
        c.config(self);
        let errors = c.finish();
        if errors.is_empty() {
            Ok(())
        } else {
            Err(ConfigErrors::new(errors))
        }
    }
}

impl ProfileConfig {
    /// Checks this profile's ranges and rules, naming fields
    /// `profiles.{name}.*` in the errors.
    pub fn validate(&self, name: &str) -> Result<(), ConfigErrors> {
        let mut c = Checker::new(&BTreeSet::new());
        let prefix = format!("profiles.{name}");
        c.name(&prefix, name);
        c.profile(&prefix, self);
        let errors = c.finish();
        if errors.is_empty() {
            Ok(())
        } else {
            Err(ConfigErrors::new(errors))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DeviceConfig;
    use std::path::PathBuf;

    /// The errors of `c`, as (field, display) pairs; empty when valid.
    fn problems(c: &Config) -> Vec<(String, String)> {
        match c.validate() {
            Ok(()) => Vec::new(),
            Err(e) => e
                .iter()
                .map(|e| (e.field().unwrap_or("").to_string(), e.to_string()))
                .collect(),
        }
    }

    /// Asserts exactly one problem, about `field`, whose message contains `text`.
    fn assert_one(c: &Config, field: &str, text: &str) {
        let p = problems(c);
        assert_eq!(p.len(), 1, "expected one problem about {field}, got {p:#?}");
        assert_eq!(p[0].0, field, "{p:#?}");
        assert!(
            p[0].1.contains(text),
            "'{}' does not contain '{text}'",
            p[0].1
        );
    }

    #[test]
    fn defaults_are_valid() {
        assert_eq!(problems(&Config::default()), Vec::<(String, String)>::new());
    }

    #[test]
    fn wal_segment_size_must_be_page_aligned() {
        let mut c = Config::default();
        c.storage.wal_segment_size = ByteSize::mib(64).0.saturating_add(512).into();
        assert_one(&c, "storage.wal_segment_size", "multiple of 4096");
    }

    #[test]
    fn group_commit_max_bytes_must_be_page_aligned() {
        let mut c = Config::default();
        c.storage.group_commit_max_bytes = ByteSize(ByteSize::mib(2).0 + 100);
        assert_one(&c, "storage.group_commit_max_bytes", "multiple of 4096");
    }

    #[test]
    fn group_commit_at_most_half_a_segment() {
        let mut c = Config::default();
        c.storage.wal_segment_size = ByteSize::mib(4);
        c.storage.group_commit_max_bytes = ByteSize::mib(2);
        assert_eq!(problems(&c), Vec::<(String, String)>::new());
        c.storage.group_commit_max_bytes = ByteSize(ByteSize::mib(2).0 + 4096);
        assert_one(
            &c,
            "storage.group_commit_max_bytes",
            "<= storage.wal_segment_size / 2 (2MiB)",
        );
    }

    #[test]
    fn the_largest_key_fits_a_flush_and_values_do_not_need_to() {
        let mut c = Config::default();
        // A 512 MiB value is allowed with the default 2 MiB flush: it is
        // logged as a chunk chain (with a frame large enough to carry it).
        c.limits.value_bytes_max = ByteSize::mib(512);
        c.limits.frame_bytes_max = ByteSize::mib(513);
        assert_eq!(problems(&c), Vec::<(String, String)>::new());
        // The largest key must fit one flush: exactly fitting is allowed.
        let mut c = Config::default();
        c.storage.group_commit_max_bytes = ByteSize::mib(1);
        c.limits.key_bytes_max = ByteSize(ByteSize::mib(1).0 - WAL_FLUSH_OVERHEAD_BYTES_MAX);
        assert_eq!(problems(&c), Vec::<(String, String)>::new());
        c.limits.key_bytes_max = ByteSize(c.limits.key_bytes_max.0 + 1);
        assert_one(
            &c,
            "storage.group_commit_max_bytes",
            "the record of the largest key always fits a flush",
        );
    }

    #[test]
    fn max_memory_is_off_or_room_for_the_tiers_fixed_costs() {
        let mut c = Config::default();
        c.storage.max_memory = ByteSize::kib(512);
        assert_one(&c, "storage.max_memory", "at least 1MiB");
        c.storage.max_memory = ByteSize::mib(1);
        assert_eq!(problems(&c), Vec::<(String, String)>::new());
        // Hybrid: 256 MiB of cache + 8 B x 16M keys of index are fixed.
        c.storage.tier = Tier::Hybrid;
        let fixed = ByteSize::mib(256).0 + 16_000_000 * 8;
        c.storage.max_memory = ByteSize(fixed);
        assert_one(&c, "storage.max_memory", "a full read cache");
        c.storage.max_memory = ByteSize(fixed + 1);
        assert_eq!(problems(&c), Vec::<(String, String)>::new());
        c.storage.max_memory = ByteSize(0);
        assert_eq!(problems(&c), Vec::<(String, String)>::new());
    }

    #[test]
    fn one_max_size_put_fits_a_frame() {
        let mut c = Config::default();
        c.limits.frame_bytes_max = ByteSize::mib(1);
        assert_one(
            &c,
            "limits.frame_bytes_max",
            "one max-size PUT fits a frame",
        );
        c.limits.value_bytes_max = ByteSize::kib(512);
        c.limits.frame_bytes_max =
            ByteSize(ByteSize::kib(512).0 + ByteSize::kib(64).0 + FRAME_OVERHEAD_BYTES_MAX);
        assert_eq!(problems(&c), Vec::<(String, String)>::new());
    }

    #[test]
    fn queue_depth_is_a_power_of_two_in_range() {
        let mut c = Config::default();
        for ok in [8, 16, 256, 4096] {
            c.io.queue_depth = ok;
            assert_eq!(problems(&c), Vec::<(String, String)>::new(), "{ok}");
        }
        c.io.queue_depth = 100;
        assert_one(&c, "io.queue_depth", "power of two in 8..=4096");
        for out in [0, 4, 8192] {
            c.io.queue_depth = out;
            assert_one(&c, "io.queue_depth", "out of range, allowed 8..=4096");
        }
    }

    #[test]
    fn io_cpus_must_be_auto_off_or_a_cpu_list() {
        let mut c = Config::default();
        for good in ["auto", "off", "0", "0-1,3"] {
            c.io.cpus = good.to_string();
            assert_eq!(problems(&c), Vec::<(String, String)>::new(), "{good}");
        }
        c.io.cpus = "3-1".to_string();
        assert_one(&c, "io.cpus", "runs backwards");
        c.io.cpus = "all".to_string();
        assert_one(&c, "io.cpus", "not a CPU number");
    }

    #[test]
    fn protected_mode_decides_by_address_password_and_opt_out() {
        let open = |listen: &str, metrics: &str| {
            let mut c = Config::default();
            c.server.listen = listen.to_string();
            c.server.metrics_listen = metrics.to_string();
            c
        };
        for loopback in [
            "127.0.0.1:7379",
            "127.1.2.3:0",
            "[::1]:0",
            "[::ffff:127.0.0.1]:0",
        ] {
            assert!(
                unprotected_listeners(&open(loopback, "")).is_empty(),
                "{loopback}"
            );
        }
        for exposed in ["0.0.0.0:0", "[::]:7379", "10.0.0.5:7379", "192.168.1.1:1"] {
            let c = open(exposed, "");
            assert_eq!(
                unprotected_listeners(&c),
                vec![("server.listen", exposed.parse().unwrap())]
            );
            assert_one(&c, "server.listen", "protected mode");
            let message = &problems(&c)[0].1;
            for names in [
                "server.requirepass",
                "server.password_file",
                "server.dangerously_listen_without_password = true",
            ] {
                assert!(message.contains(names), "{message}");
            }
            let mut with_password = c.clone();
            with_password.server.requirepass = "pw".to_string();
            assert_eq!(problems(&with_password), Vec::<(String, String)>::new());
            let mut with_file = c.clone();
            with_file.server.password_file = "/run/secrets/ringkv".into();
            assert_eq!(problems(&with_file), Vec::<(String, String)>::new());
            let mut opted_out = c.clone();
            opted_out.server.dangerously_listen_without_password = true;
            assert_eq!(problems(&opted_out), Vec::<(String, String)>::new());
        }
        // The metrics listener counts too.
        assert_one(
            &open("127.0.0.1:0", "0.0.0.0:9100"),
            "server.metrics_listen",
            "protected mode",
        );
        // Each listener's advice names its own TLS setting.
        for (field, tls) in [
            ("server.listen", "server.tls_native"),
            ("server.resp_listen", "server.tls_resp"),
            ("server.metrics_listen", "server.tls_metrics"),
        ] {
            let mut c = open("127.0.0.1:0", "");
            match field {
                "server.listen" => c.server.listen = "0.0.0.0:0".to_string(),
                "server.resp_listen" => c.server.resp_listen = "0.0.0.0:0".to_string(),
                _ => c.server.metrics_listen = "0.0.0.0:9100".to_string(),
            }
            let found = problems(&c);
            let (_, message) = found
                .iter()
                .find(|(f, _)| f == field)
                .unwrap_or_else(|| panic!("{field}: {found:?}"));
            assert!(
                message.contains(&format!("(and {tls} = true)")),
                "{message}"
            );
        }
    }

    #[test]
    fn password_and_tls_rules() {
        let mut c = Config::default();
        c.server.requirepass = "x".repeat(PASSWORD_BYTES_MAX);
        assert_eq!(problems(&c), Vec::<(String, String)>::new());
        c.server.requirepass.push('x');
        assert_one(&c, "server.requirepass", "at most 512 bytes");
        assert!(
            !problems(&c)[0].1.contains("xxx"),
            "the password is never printed"
        );
        c.server.requirepass = "pw".to_string();
        c.server.password_file = "/run/secrets/pw".into();
        assert_one(
            &c,
            "server.password_file",
            "together with server.requirepass",
        );

        let mut c = Config::default();
        c.server.tls_native = true;
        let p = problems(&c);
        assert_eq!(p.len(), 2, "{p:#?}");
        assert_eq!(p[0].0, "server.tls_cert_file");
        assert_eq!(p[1].0, "server.tls_key_file");
        c.server.tls_cert_file = "cert.pem".into();
        c.server.tls_key_file = "key.pem".into();
        assert_eq!(problems(&c), Vec::<(String, String)>::new());
        c.server.tls_native = false;
        c.server.tls_client_ca_file = "ca.pem".into();
        assert_one(
            &c,
            "server.tls_client_ca_file",
            "no effect while TLS is off",
        );
        c.server.tls_metrics = true;
        assert_eq!(problems(&c), Vec::<(String, String)>::new());
        c.server.tls_metrics = false;
        c.server.tls_resp = true;
        assert_eq!(problems(&c), Vec::<(String, String)>::new());
        c.server.tls_cert_file = "".into();
        assert_one(&c, "server.tls_cert_file", "tls_resp");

        let mut c = Config::default();
        c.server.handshake_timeout = Duration::ZERO;
        assert_one(&c, "server.handshake_timeout", "out of range");
        c.server.handshake_timeout = Duration::from_secs(1);
        c.server.auth_failure_delay = Duration::from_secs(11);
        assert_one(&c, "server.auth_failure_delay", "out of range");
    }

    #[test]
    fn redacted_hides_only_the_inline_password() {
        let mut c = Config::default();
        assert_eq!(c.redacted(), c);
        c.server.requirepass = "hunter2".to_string();
        c.server.password_file = PathBuf::new();
        let r = c.redacted();
        assert_eq!(r.server.requirepass, crate::REDACTED);
        assert!(!r.to_toml_string().contains("hunter2"));
    }

    #[test]
    fn wal_device_must_exist() {
        let mut c = Config::default();
        c.storage.wal_device = "wall".to_string();
        assert_one(
            &c,
            "storage.wal_device",
            "no device by that name — did you mean 'wal'? (known: wal)",
        );
    }

    #[test]
    fn value_device_must_exist() {
        let mut c = Config::default();
        c.storage.value_device = "wall".to_string();
        assert_one(
            &c,
            "storage.value_device",
            "no device by that name — did you mean 'wal'? (known: wal)",
        );
        c.storage.value_device = "vals".to_string();
        assert_one(
            &c,
            "storage.value_device",
            "no device by that name (known: wal)",
        );
        c.devices.insert(
            "vals".to_string(),
            DeviceConfig {
                path: "/mnt/values".into(),
                profile: "nvme".to_string(),
            },
        );
        assert_eq!(problems(&c), Vec::<(String, String)>::new());
    }

    #[test]
    fn a_hot_device_exists_differs_from_the_value_device_and_needs_the_hybrid_tier() {
        let mut c = Config::default();
        c.storage.tier = Tier::Hybrid;
        c.storage.hot_device = "fast".to_string();
        assert_one(
            &c,
            "storage.hot_device",
            "no device by that name (known: wal)",
        );
        c.storage.hot_device = "wal".to_string();
        assert_one(
            &c,
            "storage.hot_device",
            "must differ from storage.value_device",
        );
        c.devices.insert(
            "fast".to_string(),
            DeviceConfig {
                path: "/mnt/fast".into(),
                profile: "nvme".to_string(),
            },
        );
        c.storage.hot_device = "fast".to_string();
        assert_eq!(problems(&c), Vec::<(String, String)>::new());
        c.storage.tier = Tier::Memory;
        assert_one(&c, "storage.hot_device", "needs storage.tier = \"hybrid\"");
        let mut c = Config::default();
        c.storage.hot_bytes = ByteSize::gib(1);
        assert_one(&c, "storage.hot_bytes", "needs storage.hot_device");
    }

    #[test]
    fn value_segment_size_is_page_aligned() {
        let mut c = Config::default();
        c.storage.value_segment_size = ByteSize(ByteSize::mib(1).0 + 512);
        assert_one(&c, "storage.value_segment_size", "multiple of 4096");
        c.storage.value_segment_size = ByteSize(ByteSize::mib(1).0 + 4096);
        assert_eq!(problems(&c), Vec::<(String, String)>::new());
    }

    #[test]
    fn hybrid_tier_needs_a_wal() {
        let mut c = Config::default();
        c.storage.tier = Tier::Hybrid;
        assert_eq!(problems(&c), Vec::<(String, String)>::new());
        c.storage.durability = Durability::Async;
        assert_eq!(problems(&c), Vec::<(String, String)>::new());
        c.storage.durability = Durability::None;
        assert_one(
            &c,
            "storage.durability",
            "cannot be \"none\" with storage.tier = \"hybrid\"",
        );
        c.storage.tier = Tier::Memory;
        assert_eq!(problems(&c), Vec::<(String, String)>::new());
    }

    #[test]
    fn device_profiles_must_exist() {
        let mut c = Config::default();
        c.devices.insert(
            "cold".to_string(),
            DeviceConfig {
                path: "/mnt/cold".into(),
                profile: "mydisk".to_string(),
            },
        );
        assert_one(&c, "devices.cold.profile", "no profile by that name");
        c.profiles
            .insert("mydisk".to_string(), ProfileConfig::default());
        assert_eq!(problems(&c), Vec::<(String, String)>::new());
        for name in builtin_profile_names() {
            c.devices.get_mut("cold").expect("cold").profile = name.to_string();
            assert_eq!(problems(&c), Vec::<(String, String)>::new(), "{name}");
        }
    }

    fn throttled(iops: u64, burst_iops: u64, burst_credit: u64) -> ProfileConfig {
        ProfileConfig {
            iops,
            burst_iops,
            burst_credit,
            ..ProfileConfig::default()
        }
    }

    #[test]
    fn profile_burst_rules() {
        assert!(throttled(100, 100, 0).validate("p").is_ok());
        assert!(throttled(100, 500, 1_000).validate("p").is_ok());
        let msg = |p: ProfileConfig| p.validate("p").expect_err("invalid").to_string();
        assert!(msg(throttled(100, 50, 0))
            .contains("profiles.p.burst_iops = 50: must be >= iops (100)"));
        assert!(msg(throttled(100, 500, 0)).contains("profiles.p.burst_credit = 0: must be > 0"));
        assert!(msg(throttled(0, 500, 0))
            .contains("profiles.p.burst_iops = 500: must be 0 when iops = 0"));
        assert!(msg(throttled(0, 0, 7))
            .contains("profiles.p.burst_credit = 7: must be 0 when iops = 0"));
        assert!(msg(throttled(20_000_000, 20_000_000, 0))
            .contains("profiles.p.iops = 20000000: out of range"));
    }

    #[test]
    fn profile_io_unit_and_bandwidth_rules() {
        let with = |io_unit: u64, bps: u64| ProfileConfig {
            io_unit: ByteSize(io_unit),
            bytes_per_sec: ByteSize(bps),
            ..ProfileConfig::default()
        };
        assert!(with(4096, 0).validate("p").is_ok());
        assert!(with(4096, 4096).validate("p").is_ok());
        let e = with(0, 0).validate("p").expect_err("zero unit");
        assert_eq!(e.len(), 1);
        assert!(
            e.to_string()
                .contains("profiles.p.io_unit = \"0B\": out of range"),
            "{e}"
        );
        let e = with(6000, 0).validate("p").expect_err("unaligned unit");
        assert!(e.to_string().contains("multiple of 4096"), "{e}");
        let e = with(1 << 20, 1000)
            .validate("p")
            .expect_err("tiny bandwidth");
        assert!(e.to_string().contains("at least io_unit (1MiB)"), "{e}");
    }

    #[test]
    fn profile_and_device_names_are_label_safe() {
        let mut c = Config::default();
        c.profiles
            .insert("my disk".to_string(), ProfileConfig::default());
        assert_one(&c, "profiles.my disk", "a name must be");
        let mut c = Config::default();
        c.devices.insert(String::new(), DeviceConfig::default());
        assert_one(&c, "devices.", "a name must be");
    }

    #[test]
    fn listen_addresses() {
        let mut c = Config::default();
        c.server.listen = "localhost:7379".to_string();
        assert_one(&c, "server.listen", "not an IP socket address");
        let mut c = Config::default();
        c.server.metrics_listen = "127.0.0.1:9100".to_string();
        assert_eq!(problems(&c), Vec::<(String, String)>::new());
        c.server.metrics_listen = "127.0.0.1".to_string();
        assert_one(&c, "server.metrics_listen", "not an IP socket address");
        c.server.metrics_listen = "127.0.0.1:7379".to_string();
        assert_one(
            &c,
            "server.metrics_listen",
            "must differ from server.listen",
        );
        // Two ephemeral ports are two different ports.
        c.server.listen = "127.0.0.1:0".to_string();
        c.server.metrics_listen = "127.0.0.1:0".to_string();
        assert_eq!(problems(&c), Vec::<(String, String)>::new());
        c.server.listen = "[::1]:7379".to_string();
        assert_eq!(problems(&c), Vec::<(String, String)>::new());
    }

    #[test]
    fn resp_listen_is_an_address_apart_from_the_others() {
        let mut c = Config::default();
        c.server.resp_listen = "127.0.0.1:6379".to_string();
        assert_eq!(problems(&c), Vec::<(String, String)>::new());
        c.server.resp_listen = "redis:6379".to_string();
        assert_one(&c, "server.resp_listen", "not an IP socket address");
        c.server.resp_listen = "127.0.0.1:7379".to_string();
        assert_one(&c, "server.resp_listen", "must differ from server.listen");
        c.server.metrics_listen = "127.0.0.1:9100".to_string();
        c.server.resp_listen = "127.0.0.1:9100".to_string();
        assert_one(
            &c,
            "server.resp_listen",
            "must differ from server.metrics_listen",
        );
        c.server.listen = "127.0.0.1:0".to_string();
        c.server.resp_listen = "127.0.0.1:0".to_string();
        assert_eq!(problems(&c), Vec::<(String, String)>::new());
    }

    #[test]
    fn data_dir_must_not_be_empty() {
        let mut c = Config::default();
        c.storage.data_dir = "".into();
        assert_one(&c, "storage.data_dir", "must name a directory");
    }

    #[test]
    fn every_numeric_range_rejects_values_just_outside() {
        type Set = fn(&mut Config);
        let cases: &[(&str, Set)] = &[
            ("shards", |c| c.shards = SHARDS_MAX + 1),
            ("server.max_connections", |c| c.server.max_connections = 0),
            ("server.max_connections", |c| {
                c.server.max_connections = 1_000_001
            }),
            ("server.idle_timeout", |c| {
                c.server.idle_timeout = Duration::ZERO
            }),
            ("server.idle_timeout", |c| {
                c.server.idle_timeout = Duration::from_secs(7 * 86_400 + 1)
            }),
            ("server.pipeline_depth_max", |c| {
                c.server.pipeline_depth_max = 0
            }),
            ("server.pipeline_depth_max", |c| {
                c.server.pipeline_depth_max = 65_537
            }),
            ("storage.wal_segment_size", |c| {
                c.storage.wal_segment_size = ByteSize::kib(60)
            }),
            ("storage.wal_segment_size", |c| {
                c.storage.wal_segment_size = ByteSize(ByteSize::gib(64).0 + 4096)
            }),
            ("storage.group_commit_max_bytes", |c| {
                c.storage.group_commit_max_bytes = ByteSize(0)
            }),
            ("storage.group_commit_max_bytes", |c| {
                c.storage.group_commit_max_bytes = ByteSize(ByteSize::gib(1).0 + 4096)
            }),
            ("storage.group_commit_max_delay", |c| {
                c.storage.group_commit_max_delay = Duration::from_millis(1001)
            }),
            ("storage.wal_flushes_in_flight", |c| {
                c.storage.wal_flushes_in_flight = 0
            }),
            ("storage.wal_flushes_in_flight", |c| {
                c.storage.wal_flushes_in_flight = 9
            }),
            ("storage.flush_interval", |c| {
                c.storage.flush_interval = Duration::from_micros(99)
            }),
            ("storage.flush_interval", |c| {
                c.storage.flush_interval = Duration::from_secs(61)
            }),
            ("storage.wal_mark_interval", |c| {
                c.storage.wal_mark_interval = Duration::from_micros(999)
            }),
            ("storage.wal_mark_interval", |c| {
                c.storage.wal_mark_interval = Duration::from_secs(61)
            }),
            ("storage.checkpoint_wal_bytes", |c| {
                c.storage.checkpoint_wal_bytes = ByteSize::kib(60)
            }),
            ("storage.checkpoint_wal_bytes", |c| {
                c.storage.checkpoint_wal_bytes = ByteSize(ByteSize::gib(1024).0 + 1)
            }),
            ("storage.checkpoint_interval", |c| {
                c.storage.checkpoint_interval = Duration::from_secs(7 * 86_400 + 1)
            }),
            ("storage.cache_bytes", |c| {
                c.storage.cache_bytes = ByteSize(ByteSize::gib(1024).0 + 1)
            }),
            ("storage.value_segment_size", |c| {
                c.storage.value_segment_size = ByteSize::kib(60)
            }),
            ("storage.value_segment_size", |c| {
                c.storage.value_segment_size = ByteSize(ByteSize::gib(4).0 + 4096)
            }),
            ("storage.index_keys", |c| c.storage.index_keys = 1023),
            ("storage.index_keys", |c| {
                c.storage.index_keys = 100_000_000_001
            }),
            ("storage.gc_garbage_percent", |c| {
                c.storage.gc_garbage_percent = 4
            }),
            ("storage.gc_garbage_percent", |c| {
                c.storage.gc_garbage_percent = 96
            }),
            ("limits.key_bytes_max", |c| {
                c.limits.key_bytes_max = ByteSize(0)
            }),
            ("limits.key_bytes_max", |c| {
                c.limits.key_bytes_max = ByteSize(ByteSize::mib(1).0 + 1)
            }),
            ("limits.value_bytes_max", |c| {
                c.limits.value_bytes_max = ByteSize(ByteSize::mib(512).0 + 1)
            }),
            ("limits.value_bytes_max", |c| {
                c.limits.value_bytes_max = ByteSize(u64::MAX)
            }),
            ("limits.frame_bytes_max", |c| {
                c.limits.frame_bytes_max = ByteSize::kib(2)
            }),
            ("limits.frame_bytes_max", |c| {
                c.limits.frame_bytes_max = ByteSize(ByteSize::gib(1).0 + 1)
            }),
            ("limits.ops_per_frame_max", |c| {
                c.limits.ops_per_frame_max = 0
            }),
            ("limits.ops_per_frame_max", |c| {
                c.limits.ops_per_frame_max = 1_000_001
            }),
            ("limits.shard_queue_depth", |c| {
                c.limits.shard_queue_depth = 0
            }),
            ("limits.shard_queue_depth", |c| {
                c.limits.shard_queue_depth = 65_537
            }),
        ];
        for (field, set) in cases {
            let mut c = Config::default();
            set(&mut c);
            assert_one(&c, field, "out of range, allowed");
        }
    }

    #[test]
    fn range_edges_are_accepted() {
        let mut c = Config {
            shards: SHARDS_MAX,
            ..Config::default()
        };
        c.server.idle_timeout = Duration::from_millis(1);
        c.storage.group_commit_max_delay = Duration::from_secs(1);
        c.storage.flush_interval = Duration::from_micros(100);
        c.storage.wal_mark_interval = Duration::from_millis(1);
        c.storage.checkpoint_interval = Duration::ZERO;
        c.storage.checkpoint_wal_bytes = ByteSize::kib(64);
        c.limits.ops_per_frame_max = 1;
        c.limits.shard_queue_depth = 65_536;
        c.storage.cache_bytes = ByteSize(0);
        c.storage.value_segment_size = ByteSize::mib(1);
        c.storage.index_keys = 1024;
        c.storage.gc_garbage_percent = 5;
        assert_eq!(problems(&c), Vec::<(String, String)>::new());
        c.storage.cache_bytes = ByteSize::gib(1024);
        c.storage.value_segment_size = ByteSize::gib(4);
        c.storage.index_keys = 100_000_000_000;
        c.storage.gc_garbage_percent = 95;
        assert_eq!(problems(&c), Vec::<(String, String)>::new());
        // The smallest segment: 64 KiB segments, 32 KiB flushes, small records.
        c.storage.wal_segment_size = ByteSize::kib(64);
        c.storage.group_commit_max_bytes = ByteSize::kib(32);
        c.limits.key_bytes_max = ByteSize(1);
        c.limits.value_bytes_max = ByteSize(0);
        c.limits.frame_bytes_max = ByteSize::kib(4);
        assert_eq!(problems(&c), Vec::<(String, String)>::new());
    }

    #[test]
    fn all_problems_are_reported_together() {
        let mut c = Config {
            shards: 1000,
            ..Config::default()
        };
        c.io.queue_depth = 3;
        c.storage.wal_device = "nope".to_string();
        c.server.listen = "nowhere".to_string();
        let fields: Vec<String> = problems(&c).into_iter().map(|(f, _)| f).collect();
        assert_eq!(
            fields,
            // Fields on their own first, then the rules between fields.
            [
                "shards",
                "server.listen",
                "io.queue_depth",
                "storage.wal_device"
            ]
        );
    }
}
