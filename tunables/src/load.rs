//! Loading a configuration file: TOML text -> [`Config`], with every problem
//! reported in one go.
//!
//! Steps: parse the text to a spanned TOML table (all syntax errors, with line
//! and column); walk it against the schema, reading each field on its own so a
//! bad unit in one does not hide a typo in another, and naming unknown keys
//! with the nearest known one; then run the validation rules, skipping those
//! that read a field which failed to parse. Must hold: a field absent from the
//! file keeps its default, and every key the schema has is accepted here (the
//! key lists below are checked against the serde schema by a test).

use crate::error::{ConfigError, ConfigErrors};
use crate::schema::Section;
use crate::suggest::nearest;
use crate::validate::Checker;
use crate::{
    Backend, ByteSize, Config, DeviceConfig, Durability, Duration, IoConfig, LimitsConfig,
    LogConfig, ProfileConfig, ServerConfig, StorageConfig, Tier, UserConfig,
};
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::path::{Path, PathBuf};
use toml::de::{DeTable, DeValue};
use toml::Spanned;

pub(crate) const TOP_KEYS: &[&str] = &[
    "shards", "server", "storage", "limits", "io", "log", "devices", "profiles", "users",
];

/// The fixed sections and their keys, for "did you mean 'storage.x'?" when a
/// key is written in the wrong section.
const SECTIONS: &[(&str, &[&str])] = &[
    ("", TOP_KEYS),
    (ServerConfig::PATH, ServerConfig::KEYS),
    (StorageConfig::PATH, StorageConfig::KEYS),
    (LimitsConfig::PATH, LimitsConfig::KEYS),
    (IoConfig::PATH, IoConfig::KEYS),
    (LogConfig::PATH, LogConfig::KEYS),
];

/// Why one TOML value could not become a field.
pub(crate) enum Problem {
    WrongType,
    Bad(String),
}

/// A field type that can be read from one TOML value.
pub(crate) trait FromToml: Sized {
    /// What a correct value looks like, for "expected ..., got ...".
    const EXPECTED: &'static str;
    fn from_toml(v: &DeValue<'_>) -> Result<Self, Problem>;
}

fn integer(v: &DeValue<'_>) -> Result<i128, Problem> {
    match v {
        DeValue::Integer(i) => i128::from_str_radix(i.as_str(), i.radix())
            .map_err(|_| Problem::Bad("integer too large".to_string())),
        _ => Err(Problem::WrongType),
    }
}

impl FromToml for u32 {
    const EXPECTED: &'static str = "a whole number";
    fn from_toml(v: &DeValue<'_>) -> Result<Self, Problem> {
        let n = integer(v)?;
        u32::try_from(n)
            .map_err(|_| Problem::Bad(format!("must be a whole number in 0..={}", u32::MAX)))
    }
}

impl FromToml for u64 {
    const EXPECTED: &'static str = "a whole number";
    fn from_toml(v: &DeValue<'_>) -> Result<Self, Problem> {
        let n = integer(v)?;
        u64::try_from(n)
            .map_err(|_| Problem::Bad(format!("must be a whole number in 0..={}", u64::MAX)))
    }
}

impl FromToml for bool {
    const EXPECTED: &'static str = "true or false";
    fn from_toml(v: &DeValue<'_>) -> Result<Self, Problem> {
        match v {
            DeValue::Boolean(b) => Ok(*b),
            _ => Err(Problem::WrongType),
        }
    }
}

impl FromToml for String {
    const EXPECTED: &'static str = "a string";
    fn from_toml(v: &DeValue<'_>) -> Result<Self, Problem> {
        match v {
            DeValue::String(s) => Ok(s.to_string()),
            _ => Err(Problem::WrongType),
        }
    }
}

impl FromToml for PathBuf {
    const EXPECTED: &'static str = "a path string";
    fn from_toml(v: &DeValue<'_>) -> Result<Self, Problem> {
        String::from_toml(v).map(PathBuf::from)
    }
}

impl FromToml for ByteSize {
    const EXPECTED: &'static str = "a size such as \"64MiB\" or a whole number of bytes";
    fn from_toml(v: &DeValue<'_>) -> Result<Self, Problem> {
        match v {
            DeValue::String(s) => s
                .parse()
                .map_err(|e: crate::UnitError| Problem::Bad(e.message)),
            DeValue::Integer(_) => {
                let n = integer(v)?;
                u64::try_from(n).map(ByteSize).map_err(|_| {
                    Problem::Bad("a size must be a whole number of bytes in 0..=2^64-1".to_string())
                })
            }
            _ => Err(Problem::WrongType),
        }
    }
}

impl FromToml for Duration {
    const EXPECTED: &'static str = "a duration such as \"10ms\" or \"5s\"";
    fn from_toml(v: &DeValue<'_>) -> Result<Self, Problem> {
        match v {
            DeValue::String(s) => s
                .parse()
                .map_err(|e: crate::UnitError| Problem::Bad(e.message)),
            DeValue::Integer(_) if integer(v)? == 0 => Ok(Duration::ZERO),
            DeValue::Integer(_) => Err(Problem::Bad(format!(
                "a duration needs a unit: write a string such as \"10ms\" (units: {})",
                crate::units::DURATION_UNITS
            ))),
            _ => Err(Problem::WrongType),
        }
    }
}

/// Reads a string naming one of `T::NAMES`.
fn enum_from_toml<T: crate::NamedVariants>(v: &DeValue<'_>) -> Result<T, Problem> {
    let DeValue::String(s) = v else {
        return Err(Problem::WrongType);
    };
    s.parse::<T>().map_err(|e| {
        let mut reason = format!("unknown {}", e.kind);
        if let Some(near) = nearest(s, T::NAMES.iter().copied()) {
            reason.push_str(&format!(" — did you mean \"{near}\"?"));
        }
        reason.push_str(&format!(" (allowed: {})", quoted_list(T::NAMES)));
        Problem::Bad(reason)
    })
}

fn quoted_list(names: &[&str]) -> String {
    names
        .iter()
        .map(|n| format!("\"{n}\""))
        .collect::<Vec<_>>()
        .join(", ")
}

impl FromToml for Tier {
    const EXPECTED: &'static str = "a tier name string";
    fn from_toml(v: &DeValue<'_>) -> Result<Self, Problem> {
        enum_from_toml(v)
    }
}

impl FromToml for Durability {
    const EXPECTED: &'static str = "a durability mode string";
    fn from_toml(v: &DeValue<'_>) -> Result<Self, Problem> {
        enum_from_toml(v)
    }
}

impl FromToml for Backend {
    const EXPECTED: &'static str = "a backend name string";
    fn from_toml(v: &DeValue<'_>) -> Result<Self, Problem> {
        enum_from_toml(v)
    }
}

impl FromToml for crate::LogFormat {
    const EXPECTED: &'static str = "a log format name string";
    fn from_toml(v: &DeValue<'_>) -> Result<Self, Problem> {
        enum_from_toml(v)
    }
}

fn type_name(v: &DeValue<'_>) -> &'static str {
    match v {
        DeValue::String(_) => "a string",
        DeValue::Integer(_) => "an integer",
        DeValue::Float(_) => "a float",
        DeValue::Boolean(_) => "a boolean",
        DeValue::Datetime(_) => "a datetime",
        DeValue::Array(_) => "an array",
        DeValue::Table(_) => "a table",
    }
}

/// The value as it would be written in TOML, shortened for one-line messages.
fn render(v: &DeValue<'_>) -> String {
    let s = match v {
        DeValue::String(s) => format!("{:?}", s.as_ref()),
        DeValue::Integer(i) => i.to_string(),
        DeValue::Float(f) => f.as_str().to_string(),
        DeValue::Boolean(b) => b.to_string(),
        DeValue::Datetime(d) => d.to_string(),
        DeValue::Array(_) => "[...]".to_string(),
        DeValue::Table(_) => "{...}".to_string(),
    };
    if s.chars().count() > 80 {
        let cut: String = s.chars().take(77).collect();
        format!("{cut}...")
    } else {
        s
    }
}

fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_string()
    } else {
        format!("{prefix}.{key}")
    }
}

/// 1-based line and column (in characters) of a byte offset.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let offset = (0..=offset)
        .rev()
        .find(|&o| text.is_char_boundary(o))
        .unwrap_or(0);
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |p| p + 1);
    let column = text[line_start..offset].chars().count() + 1;
    (line, column)
}

pub(crate) struct Loader<'t> {
    text: &'t str,
    errors: Vec<ConfigError>,
    /// Fields whose value could not be read (they keep their default).
    failed: BTreeSet<String>,
    /// Line of every field or table written in the file, by dotted path.
    lines: BTreeMap<String, usize>,
}

type Entry<'a, 'i> = (
    &'a Spanned<std::borrow::Cow<'i, str>>,
    &'a Spanned<DeValue<'i>>,
);

impl<'t> Loader<'t> {
    fn line(&self, span: Range<usize>) -> usize {
        line_col(self.text, span.start).0
    }

    /// Reads one field; on failure records the error and keeps the default.
    pub(crate) fn field<T: FromToml>(
        &mut self,
        path: String,
        v: &Spanned<DeValue<'_>>,
        target: &mut T,
    ) {
        let line = self.line(v.span());
        self.lines.insert(path.clone(), line);
        match T::from_toml(v.get_ref()) {
            Ok(value) => *target = value,
            Err(problem) => {
                let value = render(v.get_ref());
                self.errors.push(match problem {
                    Problem::WrongType => ConfigError::WrongType {
                        field: path.clone(),
                        line: Some(line),
                        value,
                        expected: T::EXPECTED.to_string(),
                        got: type_name(v.get_ref()),
                    },
                    Problem::Bad(reason) => ConfigError::BadValue {
                        field: path.clone(),
                        line: Some(line),
                        value,
                        reason,
                    },
                });
                self.failed.insert(path);
            }
        }
    }

    /// The value as a table, or a "expected a table" error.
    fn table<'a, 'i>(
        &mut self,
        path: &str,
        v: &'a Spanned<DeValue<'i>>,
    ) -> Option<&'a DeTable<'i>> {
        let line = self.line(v.span());
        self.lines.insert(path.to_string(), line);
        match v.get_ref() {
            DeValue::Table(t) => Some(t),
            other => {
                self.errors.push(ConfigError::WrongType {
                    field: path.to_string(),
                    line: Some(line),
                    value: render(other),
                    expected: "a table".to_string(),
                    got: type_name(other),
                });
                self.failed.insert(path.to_string());
                None
            }
        }
    }

    fn unknown_key(&mut self, prefix: &str, key: &str, span: Range<usize>, known: &[&str]) {
        let suggestion = nearest(key, known.iter().copied()).or_else(|| {
            // Written in the wrong section? Suggest the full path.
            SECTIONS
                .iter()
                .filter(|(section, _)| *section != prefix)
                .find_map(|(section, keys)| {
                    nearest(key, keys.iter().copied())
                        .filter(|k| k.eq_ignore_ascii_case(&key.replace('-', "_")))
                        .map(|k| join(section, &k))
                })
        });
        self.errors.push(ConfigError::UnknownKey {
            field: join(prefix, key),
            line: Some(self.line(span)),
            suggestion,
            known: known.iter().map(|k| k.to_string()).collect(),
        });
    }

    fn entries<'a, 'i>(t: &'a DeTable<'i>) -> impl Iterator<Item = (&'a str, Entry<'a, 'i>)> {
        t.iter().map(|(k, v)| (k.get_ref().as_ref(), (k, v)))
    }

    /// Reads the table `t` at `prefix` into the section `c`.
    fn section<S: Section>(&mut self, prefix: &str, t: &DeTable<'_>, c: &mut S) {
        for (key, (k, v)) in Self::entries(t) {
            let path = join(prefix, key);
            if !c.read_key(self, key, path, v) {
                self.unknown_key(prefix, key, k.span(), S::KEYS);
            }
        }
    }

    fn document(&mut self, doc: &DeTable<'_>) -> Config {
        let mut c = Config::default();
        for (key, (k, v)) in Self::entries(doc) {
            match key {
                "shards" => self.field(key.to_string(), v, &mut c.shards),
                "server" => {
                    if let Some(t) = self.table(key, v) {
                        self.section(key, t, &mut c.server);
                    }
                }
                "storage" => {
                    if let Some(t) = self.table(key, v) {
                        self.section(key, t, &mut c.storage);
                    }
                }
                "limits" => {
                    if let Some(t) = self.table(key, v) {
                        self.section(key, t, &mut c.limits);
                    }
                }
                "io" => {
                    if let Some(t) = self.table(key, v) {
                        self.section(key, t, &mut c.io);
                    }
                }
                "log" => {
                    if let Some(t) = self.table(key, v) {
                        self.section(key, t, &mut c.log);
                    }
                }
                "devices" => {
                    let Some(t) = self.table(key, v) else {
                        continue;
                    };
                    for (name, (_, dv)) in Self::entries(t) {
                        let prefix = join("devices", name);
                        match self.table(&prefix, dv) {
                            // A device in the file replaces the default one of that name.
                            Some(dt) => {
                                let mut d = DeviceConfig::default();
                                self.section(&prefix, dt, &mut d);
                                c.devices.insert(name.to_string(), d);
                            }
                            None => {
                                self.failed.insert("devices".to_string());
                            }
                        }
                    }
                }
                "profiles" => {
                    let Some(t) = self.table(key, v) else {
                        continue;
                    };
                    for (name, (_, pv)) in Self::entries(t) {
                        let prefix = join("profiles", name);
                        if let Some(pt) = self.table(&prefix, pv) {
                            let mut p = ProfileConfig::default();
                            self.section(&prefix, pt, &mut p);
                            c.profiles.insert(name.to_string(), p);
                        }
                    }
                }
                "users" => {
                    let Some(t) = self.table(key, v) else {
                        continue;
                    };
                    // TOML itself refuses a user defined twice (a duplicate key).
                    for (name, (_, uv)) in Self::entries(t) {
                        let prefix = join("users", name);
                        if let Some(ut) = self.table(&prefix, uv) {
                            let mut u = UserConfig::default();
                            self.section(&prefix, ut, &mut u);
                            c.users.insert(name.to_string(), u);
                        }
                    }
                }
                _ => self.unknown_key("", key, k.span(), TOP_KEYS),
            }
        }
        c
    }
}

impl Config {
    /// Parses and validates a configuration from TOML text. Keys left out keep
    /// their defaults; a `[devices.NAME]` table replaces the default device of
    /// that name and keeps the others. On failure every problem found is
    /// returned, in file order.
    pub fn from_toml_str(text: &str) -> Result<Config, ConfigErrors> {
        let (doc, syntax) = DeTable::parse_recoverable(text);
        if !syntax.is_empty() {
            let mut seen = BTreeSet::new();
            let errors: Vec<ConfigError> = syntax
                .iter()
                .map(|e| {
                    let offset = e.span().map_or(text.len(), |s| s.start);
                    let (line, column) = line_col(text, offset);
                    ConfigError::Syntax {
                        line,
                        column,
                        reason: e.message().to_string(),
                    }
                })
                .filter(|e| seen.insert(e.clone().to_string()))
                .collect();
            return Err(ConfigErrors::new(errors));
        }
        let mut loader = Loader {
            text,
            errors: Vec::new(),
            failed: BTreeSet::new(),
            lines: BTreeMap::new(),
        };
        let config = loader.document(doc.get_ref());
        let mut checker = Checker::new(&loader.failed);
        checker.config(&config);
        let mut errors = loader.errors;
        for mut e in checker.finish() {
            if let Some(line) = e.field().and_then(|f| loader.lines.get(f)) {
                e.set_line_if_unknown(*line);
            }
            errors.push(e);
        }
        if errors.is_empty() {
            return Ok(config);
        }
        // File order; errors about fields left at their defaults go last.
        errors.sort_by_key(|e| e.line().unwrap_or(usize::MAX));
        Err(ConfigErrors::new(errors))
    }

    /// Reads, parses and validates a configuration file; errors name the file.
    pub fn load(path: &Path) -> Result<Config, ConfigErrors> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            ConfigErrors::new(vec![ConfigError::Io {
                file: path.to_path_buf(),
                reason: e.to_string(),
            }])
            .with_file(path)
        })?;
        Config::from_toml_str(&text).map_err(|e| e.with_file(path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{builtin_profile, DeviceConfig};
    use std::collections::BTreeSet;

    fn errors(text: &str) -> Vec<ConfigError> {
        match Config::from_toml_str(text) {
            Ok(c) => panic!("expected errors, got {c:#?}"),
            Err(e) => e.into_vec(),
        }
    }

    fn lines(text: &str) -> Vec<String> {
        errors(text).iter().map(ToString::to_string).collect()
    }

    #[test]
    fn users_are_read_and_checked() {
        let c = Config::from_toml_str(
            "[users.reader]\npassword_file = \"/run/r\"\nrole = \"read-only\"\n\
             [users.ops]\npassword_file = \"/run/o\"\nrole = \"admin\"\n",
        )
        .expect("valid");
        assert_eq!(c.users.len(), 2);
        assert_eq!(c.users["ops"].role, "admin");
        assert_eq!(c.users["reader"].password_file, PathBuf::from("/run/r"));
        assert_eq!(Config::from_toml_str(&c.to_toml_string()), Ok(c));

        let l = lines("[users.a]\npassword_file = \"/run/a\"\nrole = \"reader\"\n");
        assert_eq!(l.len(), 1, "{l:?}");
        assert!(
            l[0].contains("users.a.role") && l[0].contains("read-only"),
            "{l:?}"
        );
        let l = lines("[users.a]\nrole = \"admin\"\n");
        assert_eq!(l.len(), 1, "{l:?}");
        assert!(
            l[0].contains("users.a.password_file") && l[0].contains("needs a password file"),
            "{l:?}"
        );
        let l = lines("[users.a]\npassword_file = \"/a\"\n[users.a]\npassword_file = \"/b\"\n");
        assert!(!l.is_empty() && l[0].contains("line 3"), "{l:?}");
        let l = lines("[users.default]\npassword_file = \"/a\"\n");
        assert!(l.len() == 1 && l[0].contains("duplicate user"), "{l:?}");
        let l = lines("[server]\ndefault_role = \"root\"\n");
        assert!(
            l.len() == 1 && l[0].contains("server.default_role"),
            "{l:?}"
        );
    }

    #[test]
    fn empty_text_is_the_default() {
        assert_eq!(Config::from_toml_str(""), Ok(Config::default()));
        assert_eq!(
            Config::from_toml_str("# nothing\n\n"),
            Ok(Config::default())
        );
    }

    #[test]
    fn unknown_key_names_the_nearest_known_key() {
        let e = errors("[storage]\ndurabilty = \"none\"\n");
        assert_eq!(e.len(), 1, "{e:#?}");
        assert_eq!(
            e[0],
            ConfigError::UnknownKey {
                field: "storage.durabilty".to_string(),
                line: Some(2),
                suggestion: Some("durability".to_string()),
                known: StorageConfig::KEYS.iter().map(|k| k.to_string()).collect(),
            }
        );
        assert_eq!(
            e[0].to_string(),
            "line 2: unknown key 'storage.durabilty' — did you mean 'durability'?"
        );
    }

    #[test]
    fn unknown_sections_and_keys_in_the_wrong_section() {
        let l = lines("[storag]\ndata_dir = \"x\"\n");
        assert_eq!(
            l,
            ["line 1: unknown key 'storag' — did you mean 'storage'?"]
        );
        let l = lines("[server]\nwal_segment_size = \"64MiB\"\n");
        assert_eq!(
            l,
            ["line 2: unknown key 'server.wal_segment_size' — did you mean 'storage.wal_segment_size'?"]
        );
        let l = lines("queue_depth = 64\n");
        assert_eq!(
            l,
            ["line 1: unknown key 'queue_depth' — did you mean 'io.queue_depth'?"]
        );
        let l = lines("[io]\ncompression = true\n");
        assert_eq!(
            l,
            ["line 2: unknown key 'io.compression' — allowed here: backend, queue_depth, cpus"]
        );
        let l = lines("[devices.wal]\nprofil = \"sas\"\n[profiles.p]\niosp = 5\n");
        assert_eq!(
            l,
            [
                "line 2: unknown key 'devices.wal.profil' — did you mean 'profile'?",
                "line 4: unknown key 'profiles.p.iosp' — did you mean 'iops'?",
            ]
        );
    }

    #[test]
    fn typo_out_of_range_and_bad_unit_are_three_errors_at_once() {
        let text = "\
shards = 300

[server]
listn = \"127.0.0.1:7000\"

[storage]
flush_interval = \"10 msec\"
";
        let e = errors(text);
        let fields: Vec<&str> = e.iter().filter_map(ConfigError::field).collect();
        assert_eq!(
            fields,
            ["shards", "server.listn", "storage.flush_interval"],
            "{e:#?}"
        );
        let l: Vec<String> = e.iter().map(ToString::to_string).collect();
        assert_eq!(
            l,
            [
                "line 1: shards = 300: out of range, allowed 0..=256",
                "line 4: unknown key 'server.listn' — did you mean 'listen'?",
                "line 7: storage.flush_interval = \"10 msec\": unknown duration unit 'msec' in '10 msec' (allowed: ns, us, ms, s, m, h)",
            ]
        );
    }

    #[test]
    fn syntax_errors_report_line_and_column() {
        let e = errors("shards = 1\n[storage]\nwal_segment_size = \"64MiB\n");
        assert!(!e.is_empty());
        match &e[0] {
            ConfigError::Syntax { line, column, .. } => {
                assert_eq!(*line, 3, "{e:#?}");
                assert!(*column >= 20, "{e:#?}");
            }
            other => panic!("expected a syntax error, got {other:?}"),
        }
        assert!(e[0].to_string().starts_with("line 3, column "), "{}", e[0]);
        assert!(e[0].to_string().contains("TOML syntax error"), "{}", e[0]);
        // A duplicate key is a syntax error too, at the second occurrence.
        let e = errors("[io]\nqueue_depth = 8\nqueue_depth = 16\n");
        assert!(
            matches!(e[0], ConfigError::Syntax { line: 3, .. }),
            "{e:#?}"
        );
    }

    #[test]
    fn several_syntax_errors_are_all_reported() {
        let e = errors("[storage\nshards = 1\n[io\n");
        let syntax_lines: BTreeSet<usize> = e
            .iter()
            .map(|e| match e {
                ConfigError::Syntax { line, .. } => *line,
                other => panic!("expected only syntax errors, got {other:?}"),
            })
            .collect();
        assert!(
            syntax_lines.contains(&1) && syntax_lines.contains(&3),
            "{e:#?}"
        );
    }

    #[test]
    fn wrong_types_say_what_was_expected() {
        let l = lines("[storage]\nwal_segment_size = true\ndurability = 1\n[server]\nmax_connections = \"many\"\n");
        assert_eq!(
            l,
            [
                "line 2: storage.wal_segment_size = true: expected a size such as \"64MiB\" or a whole number of bytes, got a boolean",
                "line 3: storage.durability = 1: expected a durability mode string, got an integer",
                "line 5: server.max_connections = \"many\": expected a whole number, got a string",
            ]
        );
        let l = lines("storage = 5\n");
        assert_eq!(l, ["line 1: storage = 5: expected a table, got an integer"]);
    }

    #[test]
    fn unknown_enum_names_suggest_the_nearest() {
        let l = lines("[storage]\ndurability = \"snyc\"\n[io]\nbackend = \"epoll\"\n");
        assert_eq!(
            l,
            [
                "line 2: storage.durability = \"snyc\": unknown durability mode — did you mean \"sync\"? (allowed: \"sync\", \"async\", \"none\")",
                "line 4: io.backend = \"epoll\": unknown I/O backend (allowed: \"auto\", \"uring\", \"fallback\")",
            ]
        );
        let l = lines("[storage]\ntier = \"disk\"\n");
        assert_eq!(
            l,
            ["line 2: storage.tier = \"disk\": unknown tier (allowed: \"memory\", \"hybrid\")"]
        );
    }

    #[test]
    fn integers_that_do_not_fit_are_errors_not_wrapped() {
        let l = lines("shards = -1\n[profiles.p]\niops = 99999999999999999999\n");
        assert_eq!(
            l,
            [
                "line 1: shards = -1: must be a whole number in 0..=4294967295",
                "line 3: profiles.p.iops = 99999999999999999999: must be a whole number in 0..=18446744073709551615",
            ]
        );
    }

    #[test]
    fn a_field_that_failed_to_parse_does_not_trigger_rules_on_its_default() {
        // group_commit_max_bytes keeps its 2 MiB default after the bad unit;
        // with 2 MiB segments the half-a-segment rule would fail on that
        // default, but the user never chose it: only the unit error is reported.
        let text = "[storage]\nwal_segment_size = \"2MiB\"\ngroup_commit_max_bytes = \"16 Mibs\"\n";
        let e = errors(text);
        assert_eq!(e.len(), 1, "{e:#?}");
        assert_eq!(e[0].field(), Some("storage.group_commit_max_bytes"));
        // With a readable but too-small value the rule does fire, on its line.
        let text =
            "[limits]\nkey_bytes_max = \"1MiB\"\n[storage]\ngroup_commit_max_bytes = \"1MiB\"\n";
        let l = lines(text);
        assert_eq!(
            l,
            ["line 4: storage.group_commit_max_bytes = \"1MiB\": must be >= limits.key_bytes_max + 12288 (1060864 bytes) so the record of the largest key always fits a flush"]
        );
    }

    #[test]
    fn rule_errors_about_defaults_come_after_file_errors() {
        // wal_segment_size is written (line 2); group_commit_max_bytes is the
        // default 2 MiB, which is more than half of 2 MiB: no line for it.
        let e = errors("[storage]\nwal_segment_size = \"2MiB\"\nflush_interval = \"1h\"\n");
        let l: Vec<String> = e.iter().map(ToString::to_string).collect();
        assert_eq!(
            l,
            [
                "line 3: storage.flush_interval = \"3600s\": out of range, allowed 100us..=60s",
                "storage.group_commit_max_bytes = \"2MiB\": must be <= storage.wal_segment_size / 2 (1MiB) so a flush never straddles most of a segment",
            ]
        );
    }

    #[test]
    fn devices_merge_with_the_default_and_user_profiles_override_builtins() {
        let text = "\
[devices.cold]
path = \"/mnt/cold\"
profile = \"sas\"

[profiles.sas]
iops = 100
burst_iops = 100
";
        let c = Config::from_toml_str(text).expect("valid");
        assert_eq!(c.devices.len(), 2);
        assert_eq!(c.devices["wal"], DeviceConfig::default());
        assert_eq!(c.devices["cold"].path, PathBuf::from("/mnt/cold"));
        let sas = c.profile("sas").expect("sas");
        assert_eq!((sas.iops, sas.burst_iops, sas.burst_credit), (100, 100, 0));
        assert_eq!(c.device_profile("cold"), Some(sas));
        assert_eq!(c.profile("gpssd"), builtin_profile("gpssd"));
        assert_eq!(c.profile("nope"), None);
        assert_eq!(c.device_profile("wal"), builtin_profile("unthrottled"));
        assert_eq!(c.device_profile("nope"), None);

        let c = Config::from_toml_str("[devices.wal]\nprofile = \"nvme\"\n").expect("valid");
        assert_eq!(c.devices.len(), 1);
        assert_eq!(c.device_profile("wal"), builtin_profile("nvme"));
    }

    #[test]
    fn a_device_entry_that_is_not_a_table_does_not_cascade() {
        let l = lines("[devices]\nwal = \"nvme\"\n");
        assert_eq!(
            l,
            ["line 2: devices.wal = \"nvme\": expected a table, got a string"]
        );
        let l = lines("[profiles]\nfast = 5\n[devices.wal]\nprofile = \"fast\"\n");
        assert_eq!(
            l,
            ["line 2: profiles.fast = 5: expected a table, got an integer"]
        );
    }

    #[test]
    fn every_field_is_read_from_the_file() {
        let text = "\
shards = 4
[server]
listen = \"0.0.0.0:9000\"
metrics_listen = \"127.0.0.1:9100\"
resp_listen = \"127.0.0.1:6390\"
resp_flush_enabled = false
max_connections = 500
idle_timeout = \"30s\"
pipeline_depth_max = 16
requirepass = \"pw\"
password_file = \"\"
dangerously_listen_without_password = true
handshake_timeout = \"2s\"
auth_failure_delay = \"50ms\"
tls_native = true
tls_metrics = true
tls_resp = true
tls_cert_file = \"/etc/ringkv/cert.pem\"
tls_key_file = \"/etc/ringkv/key.pem\"
tls_client_ca_file = \"/etc/ringkv/ca.pem\"
[storage]
data_dir = \"/var/lib/ringkv\"
tier = \"hybrid\"
durability = \"async\"
wal_segment_size = \"128MiB\"
group_commit_max_bytes = 4194304
group_commit_max_delay = \"200us\"
wal_flushes_in_flight = 4
flush_interval = \"5ms\"
wal_mark_interval = \"250ms\"
checkpoint_wal_bytes = \"1GiB\"
checkpoint_interval = 0
checkpoint_deltas_max = 3
wal_device = \"fast\"
value_device = \"wal\"
hot_device = \"fast\"
hot_bytes = \"1GiB\"
hot_promote_reads = 3
hot_move_percent = 35
cache_bytes = \"1GiB\"
value_segment_size = \"16MiB\"
index_keys = 2_000_000
gc_garbage_percent = 30
expiry_tick = \"250ms\"
expiry_keys_per_tick = 1000
[limits]
key_bytes_max = \"512B\"
value_bytes_max = \"2MiB\"
frame_bytes_max = \"32MiB\"
ops_per_frame_max = 500
shard_queue_depth = 64
[io]
backend = \"fallback\"
queue_depth = 0x40
[devices.fast]
path = \"/mnt/fast\"
profile = \"mine\"
[profiles.mine]
iops = 1_000
burst_iops = 2000
burst_credit = 10000
bytes_per_sec = \"100MiB\"
io_unit = \"128KiB\"
count_fsync = false
";
        let c = Config::from_toml_str(text).expect("valid");
        let mut want = Config {
            shards: 4,
            ..Config::default()
        };
        want.server = ServerConfig {
            listen: "0.0.0.0:9000".to_string(),
            metrics_listen: "127.0.0.1:9100".to_string(),
            resp_listen: "127.0.0.1:6390".to_string(),
            resp_flush_enabled: false,
            max_connections: 500,
            idle_timeout: Duration::from_secs(30),
            pipeline_depth_max: 16,
            requirepass: "pw".to_string(),
            password_file: PathBuf::new(),
            dangerously_listen_without_password: true,
            handshake_timeout: Duration::from_secs(2),
            auth_failure_delay: Duration::from_millis(50),
            tls_native: true,
            tls_metrics: true,
            tls_resp: true,
            tls_cert_file: PathBuf::from("/etc/ringkv/cert.pem"),
            tls_key_file: PathBuf::from("/etc/ringkv/key.pem"),
            tls_client_ca_file: PathBuf::from("/etc/ringkv/ca.pem"),
            ..ServerConfig::default()
        };
        want.storage = StorageConfig {
            data_dir: PathBuf::from("/var/lib/ringkv"),
            tier: Tier::Hybrid,
            durability: Durability::Async,
            wal_segment_size: ByteSize::mib(128),
            group_commit_max_bytes: ByteSize::mib(4),
            group_commit_max_delay: Duration::from_micros(200),
            wal_flushes_in_flight: 4,
            flush_interval: Duration::from_millis(5),
            wal_mark_interval: Duration::from_millis(250),
            checkpoint_wal_bytes: ByteSize::gib(1),
            checkpoint_interval: Duration::ZERO,
            checkpoint_deltas_max: 3,
            wal_device: "fast".to_string(),
            value_device: "wal".to_string(),
            hot_device: "fast".to_string(),
            hot_bytes: ByteSize::gib(1),
            hot_promote_reads: 3,
            hot_move_percent: 35,
            cache_bytes: ByteSize::gib(1),
            value_segment_size: ByteSize::mib(16),
            index_keys: 2_000_000,
            gc_garbage_percent: 30,
            expiry_tick: Duration::from_millis(250),
            expiry_keys_per_tick: 1000,
            max_memory: ByteSize(0),
        };
        want.limits = LimitsConfig {
            key_bytes_max: ByteSize(512),
            value_bytes_max: ByteSize::mib(2),
            frame_bytes_max: ByteSize::mib(32),
            ops_per_frame_max: 500,
            shard_queue_depth: 64,
        };
        want.io = IoConfig {
            backend: Backend::Fallback,
            queue_depth: 64,
            cpus: "auto".to_string(),
        };
        want.devices.insert(
            "fast".to_string(),
            DeviceConfig {
                path: PathBuf::from("/mnt/fast"),
                profile: "mine".to_string(),
            },
        );
        want.profiles.insert(
            "mine".to_string(),
            ProfileConfig {
                iops: 1000,
                burst_iops: 2000,
                burst_credit: 10_000,
                bytes_per_sec: ByteSize::mib(100),
                io_unit: ByteSize::kib(128),
                count_fsync: false,
            },
        );
        assert_eq!(c, want);
        // And the printed form loads back to the same config.
        assert_eq!(Config::from_toml_str(&c.to_toml_string()), Ok(c));
    }

    #[test]
    fn printed_default_loads_back_equal() {
        let c = Config::default();
        let text = c.to_toml_string();
        assert!(text.contains("wal_segment_size = \"64MiB\""), "{text}");
        assert_eq!(Config::from_toml_str(&text), Ok(c));
    }

    /// The key lists used by the loader must be exactly the serde schema's
    /// fields, or a field would be rejected as unknown (or silently ignored).
    #[test]
    fn key_lists_match_the_schema() {
        let mut c = Config::default();
        c.profiles.insert("p".to_string(), ProfileConfig::default());
        c.users.insert("u".to_string(), UserConfig::default());
        let table: toml::Table =
            toml::from_str(&c.to_toml_string()).expect("printed config is TOML");
        let keys = |t: &toml::Table| t.keys().cloned().collect::<BTreeSet<String>>();
        let list = |l: &[&str]| {
            l.iter()
                .map(|k| k.to_string())
                .collect::<BTreeSet<String>>()
        };
        let section = |name: &str| match &table[name] {
            toml::Value::Table(t) => t.clone(),
            other => panic!("{name} is {other:?}"),
        };
        assert_eq!(keys(&table), list(TOP_KEYS));
        assert_eq!(keys(&section("server")), list(ServerConfig::KEYS));
        assert_eq!(keys(&section("storage")), list(StorageConfig::KEYS));
        assert_eq!(keys(&section("limits")), list(LimitsConfig::KEYS));
        assert_eq!(keys(&section("io")), list(IoConfig::KEYS));
        assert_eq!(keys(&section("log")), list(LogConfig::KEYS));
        let device = match &section("devices")["wal"] {
            toml::Value::Table(t) => t.clone(),
            other => panic!("{other:?}"),
        };
        assert_eq!(keys(&device), list(DeviceConfig::KEYS));
        let profile = match &section("profiles")["p"] {
            toml::Value::Table(t) => t.clone(),
            other => panic!("{other:?}"),
        };
        assert_eq!(keys(&profile), list(ProfileConfig::KEYS));
        let user = match &section("users")["u"] {
            toml::Value::Table(t) => t.clone(),
            other => panic!("{other:?}"),
        };
        assert_eq!(keys(&user), list(UserConfig::KEYS));
    }

    #[test]
    fn load_names_the_file() {
        let dir = std::env::temp_dir().join(format!("ringkv-tunables-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("bad.toml");
        std::fs::write(&path, "[io]\nqueue_depth = 100\n").expect("write");
        let e = Config::load(&path).expect_err("invalid");
        assert_eq!(e.file(), Some(path.as_path()));
        assert_eq!(
            e.to_string(),
            format!(
                "{}: line 2: io.queue_depth = 100: must be a power of two in 8..=4096",
                path.display()
            )
        );
        let good = dir.join("good.toml");
        std::fs::write(&good, "shards = 2\n").expect("write");
        assert_eq!(Config::load(&good).map(|c| c.shards), Ok(2));
        let missing = dir.join("missing.toml");
        let e = Config::load(&missing).expect_err("missing");
        assert!(matches!(e.errors(), [ConfigError::Io { .. }]), "{e:?}");
        assert!(
            e.to_string()
                .starts_with(&format!("cannot read {}", missing.display())),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }

    fn repo_file(name: &str) -> String {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(name);
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
    }

    #[test]
    fn shipped_ringkv_toml_is_exactly_the_default() {
        let text = repo_file("ringkv.toml");
        assert_eq!(Config::from_toml_str(&text), Ok(Config::default()));
        // Every field is written out (none left to the default silently).
        let table: toml::Table = toml::from_str(&text).expect("TOML");
        let printed: toml::Table =
            toml::from_str(&Config::default().to_toml_string()).expect("TOML");
        let mut printed = printed;
        if let Some(toml::Value::Table(p)) = printed.get("profiles") {
            assert!(p.is_empty());
            printed.remove("profiles");
        }
        assert_eq!(table, printed);
    }

    #[test]
    fn shipped_ringkv_toml_examples_load_when_uncommented() {
        let text = repo_file("ringkv.toml");
        let start = text.find("\n# Examples").expect("examples section");
        let examples: String = text[start..]
            .lines()
            .skip(2)
            .map(|l| {
                l.strip_prefix("# ")
                    .or_else(|| l.strip_prefix('#'))
                    .unwrap_or(l)
            })
            .collect::<Vec<_>>()
            .join("\n");
        let c = Config::from_toml_str(&examples).expect("examples are valid");
        assert_eq!(c.device_profile("wal"), builtin_profile("nvme"));
        let mine = c.profile("mydisk").expect("mydisk");
        assert_eq!((mine.iops, mine.burst_iops), (3000, 6000));
        mine.validate("mydisk").expect("valid profile");
    }
}
