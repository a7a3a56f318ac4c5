//! The wall clock that expiry times are compared with: Unix time in
//! milliseconds. Expiry times are absolute, so a key expires at the same
//! instant whichever process (or restart) looks at it; a clock set back
//! makes keys live longer, one set forward expires them early, as in Redis.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch (0 if the clock reads before 1970).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
