//! Human-readable sizes ("64MiB") and durations ("200us") for the config file.
//!
//! Must hold: for every value `v`, `v.to_string().parse() == Ok(v)` (display is
//! exact, never rounded), and parsing never wraps or saturates: a number whose
//! value does not fit is an error, not a smaller or clamped value.

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

/// A size in bytes, written in the config as "4096", "64KiB", "1MiB", "2GiB".
///
/// Binary units (KiB, MiB, GiB, TiB) are powers of 1024, decimal units (KB or
/// kB, MB, GB, TB) powers of 1000; a bare number or "B" is bytes. The number is
/// a whole, non-negative integer; fractions ("1.5GiB") are rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ByteSize(pub u64);

/// A duration, written in the config as "0", "200us", "10ms", "5s", "2m".
///
/// Units: ns, us (or µs), ms, s, m (or min), h. A bare number is allowed only
/// for zero. Values up to `u64::MAX` nanoseconds in the finer units and up to
/// `u64::MAX` seconds in s, m and h are accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Duration(pub std::time::Duration);

/// Why a size or duration string was rejected. `input` is the text as given,
/// `message` a complete sentence saying what is wrong and what is allowed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct UnitError {
    pub input: String,
    pub message: String,
}

/// The size units accepted by [`ByteSize`], as listed in error messages.
pub const SIZE_UNITS: &str = "B, KiB, MiB, GiB, TiB, KB, MB, GB, TB";
/// The duration units accepted by [`Duration`], as listed in error messages.
pub const DURATION_UNITS: &str = "ns, us, ms, s, m, h";

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
    pub const ZERO: Duration = Duration(std::time::Duration::ZERO);

    pub const fn from_secs(n: u64) -> Self {
        Duration(std::time::Duration::from_secs(n))
    }
    pub const fn from_millis(n: u64) -> Self {
        Duration(std::time::Duration::from_millis(n))
    }
    pub const fn from_micros(n: u64) -> Self {
        Duration(std::time::Duration::from_micros(n))
    }
    pub const fn from_nanos(n: u64) -> Self {
        Duration(std::time::Duration::from_nanos(n))
    }
    pub const fn get(self) -> std::time::Duration {
        self.0
    }
    pub const fn is_zero(self) -> bool {
        self.0.is_zero()
    }
}

impl From<std::time::Duration> for Duration {
    fn from(d: std::time::Duration) -> Self {
        Duration(d)
    }
}

impl From<Duration> for std::time::Duration {
    fn from(d: Duration) -> Self {
        d.0
    }
}

impl From<u64> for ByteSize {
    fn from(n: u64) -> Self {
        ByteSize(n)
    }
}

fn unit_error(input: &str, message: String) -> UnitError {
    UnitError {
        input: input.to_string(),
        message,
    }
}

/// Splits "64 MiB" into (64, "MiB"). Rejects a missing number, a sign, a
/// fraction and a number that does not fit in u64.
fn split_number<'a>(input: &'a str, what: &str) -> Result<(u64, &'a str), UnitError> {
    let s = input.trim();
    let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    if end == 0 {
        return Err(unit_error(
            input,
            format!("'{input}' is not a {what}: it must start with a whole, non-negative number"),
        ));
    }
    let digits = &s[..end];
    let rest = &s[end..];
    if rest.starts_with('.') || rest.starts_with(',') {
        return Err(unit_error(
            input,
            format!("'{input}' is not a {what}: use a whole number with a smaller unit instead of a fraction"),
        ));
    }
    let n: u64 = digits.parse().map_err(|_| {
        unit_error(
            input,
            format!("'{input}' is too large: the number must fit in 64 bits"),
        )
    })?;
    Ok((n, rest.trim()))
}

impl std::str::FromStr for ByteSize {
    type Err = UnitError;
    fn from_str(input: &str) -> Result<Self, UnitError> {
        let (n, unit) = split_number(input, "size")?;
        let mult: u64 = match unit {
            "" | "B" => 1,
            "KiB" => 1 << 10,
            "MiB" => 1 << 20,
            "GiB" => 1 << 30,
            "TiB" => 1 << 40,
            "KB" | "kB" => 1_000,
            "MB" => 1_000_000,
            "GB" => 1_000_000_000,
            "TB" => 1_000_000_000_000,
            other => {
                return Err(unit_error(
                    input,
                    format!("unknown size unit '{other}' in '{input}' (allowed: {SIZE_UNITS})"),
                ))
            }
        };
        n.checked_mul(mult).map(ByteSize).ok_or_else(|| {
            unit_error(
                input,
                format!("'{input}' is too large: at most 2^64-1 bytes (16 EiB)"),
            )
        })
    }
}

impl std::str::FromStr for Duration {
    type Err = UnitError;
    fn from_str(input: &str) -> Result<Self, UnitError> {
        let (n, unit) = split_number(input, "duration")?;
        let too_large = || {
            unit_error(
                input,
                format!("'{input}' is too large: at most 2^64-1 seconds"),
            )
        };
        let d = match unit {
            "ns" => std::time::Duration::from_nanos(n),
            "us" | "µs" => std::time::Duration::from_micros(n),
            "ms" => std::time::Duration::from_millis(n),
            "s" => std::time::Duration::from_secs(n),
            "m" | "min" => std::time::Duration::from_secs(n.checked_mul(60).ok_or_else(too_large)?),
            "h" => std::time::Duration::from_secs(n.checked_mul(3600).ok_or_else(too_large)?),
            "" if n == 0 => std::time::Duration::ZERO,
            "" => {
                return Err(unit_error(
                    input,
                    format!("'{input}' has no unit: only 0 may be written without one (allowed: {DURATION_UNITS})"),
                ))
            }
            other => {
                return Err(unit_error(
                    input,
                    format!("unknown duration unit '{other}' in '{input}' (allowed: {DURATION_UNITS})"),
                ))
            }
        };
        Ok(Duration(d))
    }
}

/// Prints the largest binary unit that divides the size exactly ("64MiB"),
/// else bytes ("1000B"). Never rounds.
impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0;
        for (unit, size) in [
            ("TiB", 1u64 << 40),
            ("GiB", 1 << 30),
            ("MiB", 1 << 20),
            ("KiB", 1 << 10),
        ] {
            if n >= size && n.is_multiple_of(size) {
                return write!(f, "{}{unit}", n / size);
            }
        }
        write!(f, "{n}B")
    }
}

/// Prints the largest unit among s, ms, us, ns that divides the duration
/// exactly ("300s", "200us"); zero is "0s". Never rounds.
impl fmt::Display for Duration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ns = self.0.as_nanos();
        if ns == 0 {
            return write!(f, "0s");
        }
        for (unit, size) in [("s", 1_000_000_000u128), ("ms", 1_000_000), ("us", 1_000)] {
            if ns.is_multiple_of(size) {
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

struct ByteSizeVisitor;

impl Visitor<'_> for ByteSizeVisitor {
    type Value = ByteSize;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a size such as \"64MiB\" or a whole number of bytes")
    }
    fn visit_u64<E: de::Error>(self, n: u64) -> Result<ByteSize, E> {
        Ok(ByteSize(n))
    }
    fn visit_i64<E: de::Error>(self, n: i64) -> Result<ByteSize, E> {
        u64::try_from(n)
            .map(ByteSize)
            .map_err(|_| E::custom(format!("a size cannot be negative (got {n})")))
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<ByteSize, E> {
        s.parse().map_err(E::custom)
    }
}

/// Accepts a string with a unit, or a bare non-negative integer meaning bytes.
impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ByteSizeVisitor)
    }
}

struct DurationVisitor;

impl Visitor<'_> for DurationVisitor {
    type Value = Duration;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a duration such as \"10ms\" or \"5s\"")
    }
    fn visit_u64<E: de::Error>(self, n: u64) -> Result<Duration, E> {
        if n == 0 {
            Ok(Duration::ZERO)
        } else {
            Err(E::custom(format!(
                "{n} has no unit: write a string such as \"{n}ms\" (units: {DURATION_UNITS})"
            )))
        }
    }
    fn visit_i64<E: de::Error>(self, n: i64) -> Result<Duration, E> {
        match u64::try_from(n) {
            Ok(n) => self.visit_u64(n),
            Err(_) => Err(E::custom(format!(
                "a duration cannot be negative (got {n})"
            ))),
        }
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<Duration, E> {
        s.parse().map_err(E::custom)
    }
}

/// Accepts a string with a unit; the bare integer 0 is also accepted.
impl<'de> Deserialize<'de> for Duration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(DurationVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn sizes_parse_with_every_unit() {
        let cases: &[(&str, u64)] = &[
            ("0", 0),
            ("4096", 4096),
            ("4096B", 4096),
            ("64KiB", 64 << 10),
            ("64 MiB", 64 << 20),
            ("2GiB", 2 << 30),
            ("1TiB", 1 << 40),
            ("5KB", 5_000),
            ("5kB", 5_000),
            ("7MB", 7_000_000),
            ("3GB", 3_000_000_000),
            ("2TB", 2_000_000_000_000),
            ("  8MiB  ", 8 << 20),
        ];
        for &(text, want) in cases {
            assert_eq!(text.parse::<ByteSize>(), Ok(ByteSize(want)), "{text}");
        }
    }

    #[test]
    fn sizes_reject_bad_units_fractions_signs_and_overflow() {
        for text in [
            "64Mb", "64mib", "64 M", "1.5GiB", "-1MiB", "MiB", "", "12 34",
        ] {
            let err = text.parse::<ByteSize>().expect_err(text);
            assert_eq!(err.input, text);
        }
        let err = "64Mb".parse::<ByteSize>().expect_err("bad unit");
        assert!(err.message.contains("unknown size unit 'Mb'"), "{err}");
        assert!(err.message.contains("KiB"), "{err}");
        let err = "1.5GiB".parse::<ByteSize>().expect_err("fraction");
        assert!(err.message.contains("whole number"), "{err}");
        // 2^64 does not fit; 2^54 TiB = 2^94 bytes does not fit either.
        let err = "18446744073709551616"
            .parse::<ByteSize>()
            .expect_err("u64 overflow");
        assert!(err.message.contains("too large"), "{err}");
        let err = "16777216TiB"
            .parse::<ByteSize>()
            .expect_err("multiply overflow");
        assert!(err.message.contains("too large"), "{err}");
        assert_eq!(
            "18446744073709551615".parse::<ByteSize>(),
            Ok(ByteSize(u64::MAX))
        );
    }

    #[test]
    fn durations_parse_with_every_unit() {
        let cases: &[(&str, std::time::Duration)] = &[
            ("0", std::time::Duration::ZERO),
            ("0s", std::time::Duration::ZERO),
            ("15ns", std::time::Duration::from_nanos(15)),
            ("200us", std::time::Duration::from_micros(200)),
            ("200µs", std::time::Duration::from_micros(200)),
            ("10ms", std::time::Duration::from_millis(10)),
            ("5s", std::time::Duration::from_secs(5)),
            ("2m", std::time::Duration::from_secs(120)),
            ("3min", std::time::Duration::from_secs(180)),
            ("1h", std::time::Duration::from_secs(3600)),
        ];
        for &(text, want) in cases {
            assert_eq!(text.parse::<Duration>(), Ok(Duration(want)), "{text}");
        }
    }

    #[test]
    fn durations_reject_bad_units_bare_numbers_and_overflow() {
        for text in ["10", "10 sec", "1.5s", "-3ms", "ms", "5d"] {
            text.parse::<Duration>().expect_err(text);
        }
        let err = "10".parse::<Duration>().expect_err("bare");
        assert!(err.message.contains("only 0"), "{err}");
        let err = "5d".parse::<Duration>().expect_err("unit");
        assert!(err.message.contains("unknown duration unit 'd'"), "{err}");
        // u64::MAX minutes and hours overflow u64 seconds: rejected, not saturated.
        let err = "18446744073709551615m".parse::<Duration>().expect_err("m");
        assert!(err.message.contains("too large"), "{err}");
        let err = "5124095576030432h".parse::<Duration>().expect_err("h");
        assert!(err.message.contains("too large"), "{err}");
        assert_eq!(
            "5124095576030431h".parse::<Duration>(),
            Ok(Duration::from_secs(5_124_095_576_030_431 * 3600))
        );
    }

    #[test]
    fn display_picks_the_largest_exact_unit() {
        assert_eq!(ByteSize::mib(64).to_string(), "64MiB");
        assert_eq!(ByteSize(1536).to_string(), "1536B");
        assert_eq!(ByteSize(1_000).to_string(), "1000B");
        assert_eq!(ByteSize(0).to_string(), "0B");
        assert_eq!(ByteSize(3 << 40).to_string(), "3TiB");
        assert_eq!(Duration::from_secs(300).to_string(), "300s");
        assert_eq!(Duration::from_micros(200).to_string(), "200us");
        assert_eq!(Duration::from_millis(1500).to_string(), "1500ms");
        assert_eq!(Duration::from_nanos(7).to_string(), "7ns");
        assert_eq!(Duration::ZERO.to_string(), "0s");
    }

    #[derive(Debug, PartialEq, Deserialize, Serialize)]
    struct Holder {
        size: ByteSize,
        wait: Duration,
    }

    #[test]
    fn serde_accepts_strings_and_integers() {
        let h: Holder = toml::from_str("size = 8192\nwait = \"3ms\"").expect("parse");
        assert_eq!(h.size, ByteSize::kib(8));
        assert_eq!(h.wait, Duration::from_millis(3));
        let h: Holder = toml::from_str("size = \"1MiB\"\nwait = 0").expect("parse");
        assert_eq!(h.size, ByteSize::mib(1));
        assert_eq!(h.wait, Duration::ZERO);
        let err = toml::from_str::<Holder>("size = -1\nwait = 0").expect_err("negative");
        assert!(err.message().contains("negative"), "{err}");
        let err = toml::from_str::<Holder>("size = 1\nwait = 5").expect_err("no unit");
        assert!(err.message().contains("no unit"), "{err}");
        let text = toml::to_string(&Holder {
            size: ByteSize::mib(3),
            wait: Duration::from_micros(250),
        })
        .expect("serialize");
        assert_eq!(text, "size = \"3MiB\"\nwait = \"250us\"\n");
    }

    fn size_unit() -> impl Strategy<Value = (&'static str, u64)> {
        prop_oneof![
            Just(("B", 1u64)),
            Just(("KiB", 1 << 10)),
            Just(("MiB", 1 << 20)),
            Just(("GiB", 1 << 30)),
            Just(("TiB", 1 << 40)),
            Just(("KB", 1_000)),
            Just(("MB", 1_000_000)),
            Just(("GB", 1_000_000_000)),
            Just(("TB", 1_000_000_000_000)),
        ]
    }

    fn duration_unit() -> impl Strategy<Value = (&'static str, u64)> {
        prop_oneof![
            Just(("ns", 1u64)),
            Just(("us", 1_000)),
            Just(("ms", 1_000_000)),
            Just(("s", 1_000_000_000)),
            Just(("m", 60_000_000_000)),
            Just(("h", 3_600_000_000_000)),
        ]
    }

    proptest! {
        #[test]
        fn any_size_round_trips_through_display(n in any::<u64>()) {
            let size = ByteSize(n);
            prop_assert_eq!(size.to_string().parse::<ByteSize>(), Ok(size));
        }

        #[test]
        fn any_duration_round_trips_through_display(ns in any::<u64>(), secs in any::<u64>()) {
            let d = Duration::from_nanos(ns);
            prop_assert_eq!(d.to_string().parse::<Duration>(), Ok(d));
            let d = Duration::from_secs(secs);
            prop_assert_eq!(d.to_string().parse::<Duration>(), Ok(d));
        }

        #[test]
        fn sizes_with_units_parse_exactly_or_report_overflow(n in any::<u64>(), (unit, mult) in size_unit()) {
            let text = format!("{n}{unit}");
            match n.checked_mul(mult) {
                Some(bytes) => {
                    let size = text.parse::<ByteSize>();
                    prop_assert_eq!(size, Ok(ByteSize(bytes)));
                    prop_assert_eq!(ByteSize(bytes).to_string().parse::<ByteSize>(), Ok(ByteSize(bytes)));
                }
                None => {
                    let err = text.parse::<ByteSize>().expect_err("overflow must be rejected");
                    prop_assert!(err.message.contains("too large"));
                }
            }
        }

        #[test]
        fn durations_with_units_parse_exactly(n in 0u64..=u64::MAX / 3_600_000_000_000, (unit, ns_per) in duration_unit()) {
            let text = format!("{n}{unit}");
            let want = std::time::Duration::from_nanos(n * ns_per);
            prop_assert_eq!(text.parse::<Duration>(), Ok(Duration(want)));
            prop_assert_eq!(Duration(want).to_string().parse::<Duration>(), Ok(Duration(want)));
        }

        #[test]
        fn unknown_unit_suffixes_are_rejected(n in any::<u32>(), suffix in "[a-zA-Z]{1,4}") {
            let known_size = matches!(suffix.as_str(), "B" | "KiB" | "MiB" | "GiB" | "TiB" | "KB" | "kB" | "MB" | "GB" | "TB");
            let text = format!("{n}{suffix}");
            // A known unit may still overflow (4294967295TB is over u64).
            match text.parse::<ByteSize>() {
                Ok(_) => prop_assert!(known_size, "{text} parsed"),
                Err(e) => prop_assert!(!known_size || e.message.contains("too large"), "{text}: {}", e.message),
            }
            let known_duration = matches!(suffix.as_str(), "ns" | "us" | "ms" | "s" | "m" | "min" | "h");
            prop_assert_eq!(text.parse::<Duration>().is_ok(), known_duration);
        }
    }
}
