//! The one parser for lengths of time on the command lines of the engine's
//! benches and of `ringkv-bench` (server/examples), used as a clap
//! `value_parser`. It lives in a folder without a `main.rs`, so Cargo does
//! not take it for a bench target of its own.

use std::time::Duration;

/// Parses a length of time: a bare number is seconds (`10`, `2.5`); a
/// number may also carry a unit, `ms` or `s` (`500ms`, `2s`). Refuses
/// negative, infinite and unparsable values, and other units.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let trimmed = text.trim();
    let (number, seconds_per_unit) = if let Some(n) = trimmed.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = trimmed.strip_suffix('s') {
        (n, 1.0)
    } else {
        (trimmed, 1.0)
    };
    let invalid = || {
        format!("`{text}` is not a length of time: give seconds (`10`, `2.5`) or a number with the unit ms or s (`500ms`, `2s`)")
    };
    let value: f64 = number.trim().parse().map_err(|_| invalid())?;
    if !value.is_finite() || value < 0.0 {
        return Err(invalid());
    }
    Duration::try_from_secs_f64(value * seconds_per_unit).map_err(|_| invalid())
}
