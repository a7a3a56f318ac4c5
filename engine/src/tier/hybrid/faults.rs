//! What went wrong in the hybrid tier: read errors to answer, a failed
//! write that poisons the shard, keys whose newest put was not written,
//! and the bound on the warnings failed reads log.
use bytes::Bytes;

/// What went wrong: read errors to report, a failed write that poisons
/// the shard, keys whose newest put was not written.
#[derive(Default)]
pub(super) struct Faults {
    /// Errors of reads since the last `take_read_errors`: (key, message).
    pub(super) read_errors: Vec<(Bytes, String)>,
    pub(super) read_error_count: u64,
    /// A write or fdatasync of a segment failed: the shard must stop
    /// taking writes.
    pub(super) fault: Option<String>,
    /// Keys whose newest put failed to append (after a fault): their
    /// entries point at older records, so reads answer an error for them
    /// instead ([`ReadError::Unwritten`]). Only a poisoned shard has any
    /// (it logs no more writes, so the set grows by one batch at most).
    pub(super) unwritten: std::collections::HashSet<Box<[u8]>>,
    /// Bounds the warnings failed reads log.
    pub(super) warnings: ReadWarnings,
}

impl Faults {
    /// Logs a failed read of the device (`what` happened, because of
    /// `error`) unless this minute already logged [`READ_WARNINGS_PER_MINUTE`]
    /// of them; the rest are counted and said in one line when a later
    /// minute's first failure comes. Each failure is still answered as an
    /// error to its request, and STATS counts every one (`read_errors`).
    pub(super) fn warn(&mut self, shard: u32, what: &str, error: &dyn std::fmt::Display) {
        if self.warnings.allow(shard) {
            tracing::warn!(shard, error = %error, "hybrid tier: {what}");
        }
    }
}

/// Failed-read warnings logged per shard per minute: one damaged segment
/// can fail thousands of reads, and the log would repeat one fact.
pub(super) const READ_WARNINGS_PER_MINUTE: u32 = 10;

/// The window [`Faults::warn`] counts in.
#[derive(Default)]
pub(super) struct ReadWarnings {
    pub(super) window_start: Option<std::time::Instant>,
    pub(super) logged: u32,
    pub(super) held_back: u64,
}

impl ReadWarnings {
    pub(super) fn allow(&mut self, shard: u32) -> bool {
        let now = std::time::Instant::now();
        let expired = self
            .window_start
            .is_none_or(|at| now.duration_since(at) >= std::time::Duration::from_secs(60));
        if expired {
            if self.held_back > 0 {
                tracing::warn!(
                    shard,
                    not_logged = self.held_back,
                    "hybrid tier: more reads failed than were logged one by one; STATS read_errors counts every failure"
                );
            }
            *self = ReadWarnings {
                window_start: Some(now),
                ..ReadWarnings::default()
            };
        }
        if self.logged < READ_WARNINGS_PER_MINUTE {
            self.logged += 1;
            true
        } else {
            self.held_back += 1;
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{ReadWarnings, READ_WARNINGS_PER_MINUTE};

    /// A damaged segment fails every read of its keys: the log gets the
    /// first few of a minute and one line for the rest, not one per read.
    #[test]
    fn failed_read_warnings_are_bounded_per_minute() {
        let mut w = ReadWarnings::default();
        let logged = (0..13_334).filter(|_| w.allow(0)).count();
        assert_eq!(logged, READ_WARNINGS_PER_MINUTE as usize);
        assert_eq!(w.held_back, 13_334 - u64::from(READ_WARNINGS_PER_MINUTE));
        // A new minute: the count held back is said and a new one starts.
        w.window_start = Some(std::time::Instant::now() - std::time::Duration::from_secs(61));
        assert!(w.allow(0));
        assert_eq!((w.logged, w.held_back), (1, 0));
    }
}
