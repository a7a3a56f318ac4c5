//! Human-readable sizes ("64MiB") and durations ("200us") for the config file.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

/// A size in bytes, written in the config as "4096", "64KiB", "1MiB", "2GiB".
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ByteSize(pub u64);

/// A duration, written in the config as "0", "200us", "10ms", "5s", "2m".
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Duration(pub std::time::Duration);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct UnitError {
    pub message: String,
}

impl ByteSize {
    pub const fn kib(n: u64) -> Self {
        ByteSize(n * 1024)
    }
    pub const fn mib(n: u64) -> Self {
        ByteSize(n * 1024 * 1024)
    }
    pub const fn gib(n: u64) -> Self {
        ByteSize(n * 1024 * 1024 * 1024)
    }
    pub const fn as_u64(self) -> u64 {
        self.0
    }
}

impl Duration {
    pub const fn from_secs(n: u64) -> Self {
        Duration(std::time::Duration::from_secs(n))
    }
    pub const fn from_millis(n: u64) -> Self {
        Duration(std::time::Duration::from_millis(n))
    }
    pub const fn from_micros(n: u64) -> Self {
        Duration(std::time::Duration::from_micros(n))
    }
    pub const fn get(self) -> std::time::Duration {
        self.0
    }
}

fn split_number(s: &str) -> Result<(u64, &str), UnitError> {
    let s = s.trim();
    let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    if end == 0 {
        return Err(UnitError {
            message: format!("'{s}' does not start with a whole number"),
        });
    }
    let n: u64 = s[..end].parse().map_err(|_| UnitError {
        message: format!("'{s}' is too large"),
    })?;
    Ok((n, s[end..].trim()))
}

impl std::str::FromStr for ByteSize {
    type Err = UnitError;
    fn from_str(s: &str) -> Result<Self, UnitError> {
        let (n, unit) = split_number(s)?;
        let mult: u64 = match unit {
            "" | "B" => 1,
            "KiB" => 1 << 10,
            "MiB" => 1 << 20,
            "GiB" => 1 << 30,
            "TiB" => 1 << 40,
            "KB" | "kB" => 1_000,
            "MB" => 1_000_000,
            "GB" => 1_000_000_000,
            other => {
                return Err(UnitError {
                    message: format!(
                        "unknown size unit '{other}' in '{s}' (use B, KiB, MiB, GiB, TiB, KB, MB, GB)"
                    ),
                })
            }
        };
        n.checked_mul(mult).map(ByteSize).ok_or_else(|| UnitError {
            message: format!("'{s}' is too large"),
        })
    }
}

impl std::str::FromStr for Duration {
    type Err = UnitError;
    fn from_str(s: &str) -> Result<Self, UnitError> {
        let (n, unit) = split_number(s)?;
        let d = match unit {
            "ns" => std::time::Duration::from_nanos(n),
            "us" | "µs" => std::time::Duration::from_micros(n),
            "ms" => std::time::Duration::from_millis(n),
            "s" => std::time::Duration::from_secs(n),
            "m" | "min" => std::time::Duration::from_secs(n.saturating_mul(60)),
            "h" => std::time::Duration::from_secs(n.saturating_mul(3600)),
            "" if n == 0 => std::time::Duration::ZERO,
            other => {
                return Err(UnitError {
                    message: format!(
                        "unknown duration unit '{other}' in '{s}' (use ns, us, ms, s, m, h)"
                    ),
                })
            }
        };
        Ok(Duration(d))
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0;
        for (unit, size) in [("TiB", 1u64 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)] {
            if n >= size && n % size == 0 {
                return write!(f, "{}{unit}", n / size);
            }
        }
        write!(f, "{n}B")
    }
}

impl fmt::Display for Duration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ns = self.0.as_nanos();
        if ns == 0 {
            return write!(f, "0s");
        }
        for (unit, size) in [("s", 1_000_000_000u128), ("ms", 1_000_000), ("us", 1_000)] {
            if ns % size == 0 {
                return write!(f, "{}{unit}", ns / size);
            }
        }
        write!(f, "{ns}ns")
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl Serialize for Duration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

/// Accepts a string with a unit, or a bare integer meaning bytes.
impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(u64),
            S(String),
        }
        match Raw::deserialize(d)? {
            Raw::N(n) => Ok(ByteSize(n)),
            Raw::S(s) => s.parse().map_err(serde::de::Error::custom),
        }
    }
}

impl<'de> Deserialize<'de> for Duration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}
