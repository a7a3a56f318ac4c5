//! The durability watch of one shard's WAL. Records logged but not yet
//! durable normally become durable within a flush or two; if the durable
//! LSN stands still behind them for [`STALL_WARN_AFTER`] (a device that
//! stopped answering, a flush nobody asked for), every write and every
//! read that waits for durability waits with it. The watch says so in the
//! log, once per stall and with the WAL's state, and says again when the
//! durable LSN moves, so a stall reads as a log line instead of as clients
//! that wait without a word.

use crate::wal::durable::Wal;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// How often the watch looks.
const WATCH_PERIOD: Duration = Duration::from_secs(2);

/// How long the durable LSN may stand still behind logged records before
/// the watch warns (at least; see [`warn_after`]).
pub(crate) const STALL_WARN_AFTER: Duration = Duration::from_secs(10);

/// The stall the watch warns about: [`STALL_WARN_AFTER`], or twice the
/// longest pause the flusher takes on purpose (the `async` mode's flush
/// interval, the group-commit delay), whichever is longer.
pub(crate) fn warn_after(flush_interval: Duration, group_commit_max_delay: Duration) -> Duration {
    STALL_WARN_AFTER
        .max(flush_interval.saturating_mul(2))
        .max(group_commit_max_delay.saturating_mul(2))
}

/// The WAL's progress as the watch reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Progress {
    pub durable_lsn: u64,
    pub last_lsn: u64,
    /// Answers queued until their LSN is durable.
    pub waiting_answers: usize,
    pub oldest_waiting_lsn: Option<u64>,
    pub open_buffer_has_records: bool,
    pub flush_requested: bool,
}

/// What one look found worth saying.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    Quiet,
    /// The durable LSN has stood still behind logged records for this long
    /// (said once per stall).
    Stalled(Duration),
    /// It moved again after a stall that was reported, which lasted about
    /// this long.
    Moving(Duration),
}

/// The watch's memory between looks: since when the durable LSN has stood
/// at the same value behind logged records, and whether that was said.
#[derive(Debug)]
pub(crate) struct StallWatch {
    warn_after: Duration,
    behind_since: Option<(u64, Instant)>,
    reported: bool,
}

impl StallWatch {
    pub(crate) fn new(warn_after: Duration) -> Self {
        StallWatch {
            warn_after,
            behind_since: None,
            reported: false,
        }
    }

    /// Takes one look at `p`, made at `now`.
    pub(crate) fn look(&mut self, p: &Progress, now: Instant) -> Verdict {
        let behind = p.durable_lsn < p.last_lsn;
        match self.behind_since {
            Some((lsn, since)) if behind && lsn == p.durable_lsn => {
                let stalled = now.saturating_duration_since(since);
                if !self.reported && stalled >= self.warn_after {
                    self.reported = true;
                    Verdict::Stalled(stalled)
                } else {
                    Verdict::Quiet
                }
            }
            previous => {
                let verdict = match previous {
                    Some((_, since)) if self.reported => {
                        Verdict::Moving(now.saturating_duration_since(since))
                    }
                    _ => Verdict::Quiet,
                };
                self.reported = false;
                self.behind_since = behind.then_some((p.durable_lsn, now));
                verdict
            }
        }
    }
}

/// Looks at `wal` every [`WATCH_PERIOD`] and logs what [`StallWatch`]
/// finds. Ends when the shard is poisoned (that is logged on its own).
pub(crate) async fn run_durability_watch(wal: Rc<Wal>, warn_after: Duration) {
    let mut watch = StallWatch::new(warn_after);
    loop {
        compio::time::sleep(WATCH_PERIOD).await;
        if wal.is_poisoned() {
            return;
        }
        let p = wal.progress();
        match watch.look(&p, Instant::now()) {
            Verdict::Quiet => {}
            Verdict::Stalled(stalled) => tracing::warn!(
                shard = wal.shard(),
                stalled_s = stalled.as_secs(),
                durable_lsn = p.durable_lsn,
                last_lsn = p.last_lsn,
                waiting_answers = p.waiting_answers,
                oldest_waiting_lsn = ?p.oldest_waiting_lsn,
                open_buffer_has_records = p.open_buffer_has_records,
                flush_requested = p.flush_requested,
                "WAL: logged records are not becoming durable (the durable LSN has not moved); writes and reads that wait for durability wait too: check the device (a flush that does not return) or report this line"
            ),
            Verdict::Moving(stalled) => tracing::info!(
                shard = wal.shard(),
                stalled_s = stalled.as_secs(),
                durable_lsn = p.durable_lsn,
                "WAL: the durable LSN moves again"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(durable_lsn: u64, last_lsn: u64) -> Progress {
        Progress {
            durable_lsn,
            last_lsn,
            waiting_answers: 0,
            oldest_waiting_lsn: None,
            open_buffer_has_records: false,
            flush_requested: false,
        }
    }

    const AFTER: Duration = Duration::from_secs(10);

    #[test]
    fn a_durable_lsn_that_stands_behind_is_reported_once_then_its_end() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut w = StallWatch::new(AFTER);
        assert_eq!(w.look(&at(5, 9), t0), Verdict::Quiet);
        assert_eq!(w.look(&at(5, 9), t0 + s(9)), Verdict::Quiet);
        assert_eq!(w.look(&at(5, 12), t0 + s(10)), Verdict::Stalled(s(10)));
        assert_eq!(w.look(&at(5, 12), t0 + s(30)), Verdict::Quiet, "said once");
        assert_eq!(w.look(&at(12, 12), t0 + s(31)), Verdict::Moving(s(31)));
        assert_eq!(w.look(&at(12, 12), t0 + s(60)), Verdict::Quiet);
        // A new stall is reported again.
        assert_eq!(w.look(&at(12, 13), t0 + s(61)), Verdict::Quiet);
        assert_eq!(w.look(&at(12, 13), t0 + s(71)), Verdict::Stalled(s(10)));
        // Moving but still behind ends the stall and starts a new count.
        assert_eq!(w.look(&at(13, 20), t0 + s(72)), Verdict::Moving(s(11)));
        assert_eq!(w.look(&at(13, 20), t0 + s(81)), Verdict::Quiet);
        assert_eq!(w.look(&at(13, 20), t0 + s(82)), Verdict::Stalled(s(10)));
    }

    #[test]
    fn a_durable_lsn_that_keeps_moving_or_is_caught_up_is_never_reported() {
        let t0 = Instant::now();
        let mut w = StallWatch::new(AFTER);
        for i in 0..100u64 {
            // Behind at every look, but never at the same durable LSN.
            let v = w.look(&at(i, i + 50), t0 + Duration::from_secs(i * 5));
            assert_eq!(v, Verdict::Quiet, "look {i}");
        }
        let mut w = StallWatch::new(AFTER);
        for i in 0..100u64 {
            // Standing still, with nothing logged beyond it.
            let v = w.look(&at(7, 7), t0 + Duration::from_secs(i * 5));
            assert_eq!(v, Verdict::Quiet, "look {i}");
        }
    }

    #[test]
    fn the_threshold_covers_the_flushers_own_pauses() {
        let ms = Duration::from_millis;
        assert_eq!(warn_after(ms(10), ms(1)), STALL_WARN_AFTER);
        assert_eq!(
            warn_after(Duration::from_secs(30), ms(1)),
            Duration::from_secs(60)
        );
        assert_eq!(
            warn_after(ms(10), Duration::from_secs(8)),
            Duration::from_secs(16)
        );
    }
}
