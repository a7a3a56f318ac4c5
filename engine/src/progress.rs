//! Progress lines for work that can run for minutes without answering
//! anyone: recovery's snapshot load and WAL replay, and the offline tools'
//! reads (which run the same code). At most one line per
//! [`interval`] for each piece of work, logged at INFO under the target
//! `ringkv_engine::progress`, so a filter can show these lines alone (the
//! offline tools do).

use std::path::Path;
use std::time::{Duration, Instant};

/// Time between two progress lines of one piece of work: 5 s, or
/// `RINGKV_PROGRESS_MS` milliseconds (0: a line at every step, for tests).
pub fn interval() -> Duration {
    static EVERY: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *EVERY.get_or_init(|| {
        std::env::var("RINGKV_PROGRESS_MS")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .map_or(Duration::from_secs(5), Duration::from_millis)
    })
}

/// One piece of work's progress: what it is, through which file.
pub struct Progress {
    what: &'static str,
    file: String,
    started: Instant,
    next: Instant,
}

impl Progress {
    /// Work named `what` (e.g. "replaying the WAL") on `file`; the first
    /// line comes one interval after this.
    pub fn new(what: &'static str, file: &Path) -> Progress {
        let now = Instant::now();
        Progress {
            what,
            file: file.display().to_string(),
            started: now,
            next: now + interval(),
        }
    }

    /// Says how far the work is, if an interval passed since the last line:
    /// `done` of `total` bytes of the file, and `items` (records, entries)
    /// so far.
    pub fn tick(&mut self, done: u64, total: u64, items: u64) {
        let now = Instant::now();
        if now < self.next {
            return;
        }
        self.next = now + interval();
        let percent = done.saturating_mul(100).checked_div(total).unwrap_or(100);
        tracing::info!(
            file = %self.file,
            done_bytes = done,
            total_bytes = total,
            percent,
            items,
            elapsed_s = self.started.elapsed().as_secs(),
            "{}: {percent}% of {}",
            self.what,
            self.file
        );
    }
}
