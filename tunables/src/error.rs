//! Configuration errors: one [`ConfigError`] per problem, gathered in
//! [`ConfigErrors`] so a person fixes a file in one pass.
//!
//! Must hold: every variant that concerns a field names it by its dotted path
//! (`storage.wal_segment_size`), shows the offending value as written in TOML,
//! and says what is allowed; `Display` is exactly one line.

use std::fmt;
use std::path::{Path, PathBuf};

/// One problem found while loading or validating a configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    Io { file: PathBuf, reason: String },
    /// The text is not valid TOML. `line` and `column` are 1-based.
    Syntax {
        line: usize,
        column: usize,
        reason: String,
    },
    /// A key that is not part of the schema (usually a typo).
    UnknownKey {
        field: String,
        line: Option<usize>,
        /// The nearest known key: a sibling name, or a full dotted path when
        /// the key exists in another section.
        suggestion: Option<String>,
        /// The keys allowed where this one was found.
        known: Vec<String>,
    },
    /// The value has the wrong TOML type (e.g. a boolean where a size goes).
    WrongType {
        field: String,
        line: Option<usize>,
        /// The value as written.
        value: String,
        expected: String,
        got: &'static str,
    },
    /// The value has the right type but cannot be understood (bad unit, unknown
    /// enum name, unparsable address, integer that does not fit).
    BadValue {
        field: String,
        line: Option<usize>,
        value: String,
        reason: String,
    },
    /// A number outside the field's allowed range.
    OutOfRange {
        field: String,
        line: Option<usize>,
        value: String,
        /// The allowed range, e.g. "8..=4096" or "64KiB..=64GiB".
        allowed: String,
    },
    /// A value that breaks a rule tying it to itself or to other fields
    /// (alignment, power of two, "<= wal_segment_size / 2", ...).
    Relation {
        field: String,
        line: Option<usize>,
        value: String,
        rule: String,
    },
    /// A name that must refer to an entry elsewhere (a device, a profile) and
    /// does not.
    UnknownName {
        field: String,
        line: Option<usize>,
        value: String,
        /// What kind of thing the name refers to: "device", "profile".
        kind: &'static str,
        known: Vec<String>,
        suggestion: Option<String>,
    },
}

impl ConfigError {
    /// The dotted path of the field concerned, if the error is about a field.
    pub fn field(&self) -> Option<&str> {
        match self {
            ConfigError::Io { .. } | ConfigError::Syntax { .. } => None,
            ConfigError::UnknownKey { field, .. }
            | ConfigError::WrongType { field, .. }
            | ConfigError::BadValue { field, .. }
            | ConfigError::OutOfRange { field, .. }
            | ConfigError::Relation { field, .. }
            | ConfigError::UnknownName { field, .. } => Some(field),
        }
    }

    /// The 1-based line in the file the error points at, when known.
    pub fn line(&self) -> Option<usize> {
        match self {
            ConfigError::Io { .. } => None,
            ConfigError::Syntax { line, .. } => Some(*line),
            ConfigError::UnknownKey { line, .. }
            | ConfigError::WrongType { line, .. }
            | ConfigError::BadValue { line, .. }
            | ConfigError::OutOfRange { line, .. }
            | ConfigError::Relation { line, .. }
            | ConfigError::UnknownName { line, .. } => *line,
        }
    }

    /// Sets the line of a field error that does not have one yet.
    pub(crate) fn set_line_if_unknown(&mut self, at: usize) {
        match self {
            ConfigError::Io { .. } | ConfigError::Syntax { .. } => {}
            ConfigError::UnknownKey { line, .. }
            | ConfigError::WrongType { line, .. }
            | ConfigError::BadValue { line, .. }
            | ConfigError::OutOfRange { line, .. }
            | ConfigError::Relation { line, .. }
            | ConfigError::UnknownName { line, .. } => {
                if line.is_none() {
                    *line = Some(at);
                }
            }
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(line) = self.line() {
            if !matches!(self, ConfigError::Syntax { .. }) {
                write!(f, "line {line}: ")?;
            }
        }
        match self {
            ConfigError::Io { file, reason } => {
                write!(f, "cannot read {}: {reason}", file.display())
            }
            ConfigError::Syntax {
                line,
                column,
                reason,
            } => write!(
                f,
                "line {line}, column {column}: TOML syntax error: {reason}"
            ),
            ConfigError::UnknownKey {
                field,
                suggestion,
                known,
                ..
            } => {
                write!(f, "unknown key '{field}'")?;
                match suggestion {
                    Some(s) => write!(f, " — did you mean '{s}'?"),
                    None if known.is_empty() => write!(f, " — nothing is allowed here"),
                    None => write!(f, " — allowed here: {}", known.join(", ")),
                }
            }
            ConfigError::WrongType {
                field,
                value,
                expected,
                got,
                ..
            } => write!(f, "{field} = {value}: expected {expected}, got {got}"),
            ConfigError::BadValue {
                field,
                value,
                reason,
                ..
            } => write!(f, "{field} = {value}: {reason}"),
            ConfigError::OutOfRange {
                field,
                value,
                allowed,
                ..
            } => write!(f, "{field} = {value}: out of range, allowed {allowed}"),
            ConfigError::Relation {
                field, value, rule, ..
            } => write!(f, "{field} = {value}: {rule}"),
            ConfigError::UnknownName {
                field,
                value,
                kind,
                known,
                suggestion,
                ..
            } => {
                write!(f, "{field} = {value}: no {kind} by that name")?;
                if let Some(s) = suggestion {
                    write!(f, " — did you mean '{s}'?")?;
                }
                if known.is_empty() {
                    write!(f, " (none is defined)")
                } else {
                    write!(f, " (known: {})", known.join(", "))
                }
            }
        }
    }
}

impl std::error::Error for ConfigError {}

/// Every problem found in one configuration, in file order where lines are
/// known, then in schema order. Never empty when returned as an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigErrors {
    file: Option<PathBuf>,
    errors: Vec<ConfigError>,
}

impl ConfigErrors {
    pub(crate) fn new(errors: Vec<ConfigError>) -> Self {
        assert!(
            !errors.is_empty(),
            "ConfigErrors must hold at least one error"
        );
        ConfigErrors { file: None, errors }
    }

    pub(crate) fn with_file(mut self, file: &Path) -> Self {
        self.file = Some(file.to_path_buf());
        self
    }

    /// The file the errors were found in, when loaded from one.
    pub fn file(&self) -> Option<&Path> {
        self.file.as_deref()
    }

    pub fn errors(&self) -> &[ConfigError] {
        &self.errors
    }

    pub fn iter(&self) -> std::slice::Iter<'_, ConfigError> {
        self.errors.iter()
    }

    pub fn len(&self) -> usize {
        self.errors.len()
    }

    pub fn is_empty(&self) -> bool {
        self.errors.is_empty()
    }

    pub fn into_vec(self) -> Vec<ConfigError> {
        self.errors
    }
}

impl<'a> IntoIterator for &'a ConfigErrors {
    type Item = &'a ConfigError;
    type IntoIter = std::slice::Iter<'a, ConfigError>;
    fn into_iter(self) -> Self::IntoIter {
        self.errors.iter()
    }
}

impl IntoIterator for ConfigErrors {
    type Item = ConfigError;
    type IntoIter = std::vec::IntoIter<ConfigError>;
    fn into_iter(self) -> Self::IntoIter {
        self.errors.into_iter()
    }
}

/// One line per error, each prefixed with the file name when there is one.
impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.errors.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            match (&self.file, e) {
                // An I/O error already names the file.
                (Some(_), ConfigError::Io { .. }) | (None, _) => write!(f, "{e}")?,
                (Some(file), _) => write!(f, "{}: {e}", file.display())?,
            }
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}
