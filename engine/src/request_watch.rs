//! The request watch: a thread per engine that looks at every shard every
//! [`LOOK_EVERY`] and says in the log when a shard has requests waiting in
//! its inbox but has taken none of them for [`STUCK_AFTER`] (a shard thread
//! that is blocked, starved of its CPU, or in a loop), with what the shard's
//! counters say, and says again when it takes requests again. The
//! durability watch (`wal/watch.rs`) covers the other way a request waits:
//! a WAL whose flushes stopped becoming durable.
//!
//! It costs the request path one relaxed increment per message taken
//! (`ShardStats::taken`); the watch only reads.

use crate::shard::router::EngineShared;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Weak;
use std::time::{Duration, Instant};

/// How often the watch looks.
const LOOK_EVERY: Duration = Duration::from_millis(500);

/// How long a shard may leave a waiting inbox untouched before the watch
/// warns: 10 s, or `RINGKV_STUCK_WARN_MS` milliseconds (tests).
fn stuck_after() -> Duration {
    std::env::var("RINGKV_STUCK_WARN_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .map_or(STUCK_AFTER, Duration::from_millis)
}

/// See [`stuck_after`].
const STUCK_AFTER: Duration = Duration::from_secs(10);

/// What one look at one shard shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Look {
    /// Messages waiting in the shard's inbox.
    pub waiting: usize,
    /// The shard's count of messages taken.
    pub taken: u64,
}

/// What a look found worth saying.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    Quiet,
    /// Requests have waited this long without the shard taking any (said
    /// once per episode).
    Stuck(Duration),
    /// It takes requests again after a reported episode of about this long.
    Moving(Duration),
}

/// One shard's memory between looks.
#[derive(Debug)]
pub(crate) struct ShardWatch {
    warn_after: Duration,
    /// The taken count and since when it has stood while requests waited.
    standing: Option<(u64, Instant)>,
    reported: bool,
}

impl ShardWatch {
    pub(crate) fn new(warn_after: Duration) -> ShardWatch {
        ShardWatch {
            warn_after,
            standing: None,
            reported: false,
        }
    }

    pub(crate) fn look(&mut self, l: Look, now: Instant) -> Verdict {
        match self.standing {
            Some((taken, since)) if taken == l.taken && l.waiting > 0 => {
                let waited = now.saturating_duration_since(since);
                if !self.reported && waited >= self.warn_after {
                    self.reported = true;
                    return Verdict::Stuck(waited);
                }
                Verdict::Quiet
            }
            _ => {
                let ended = self
                    .standing
                    .filter(|_| self.reported)
                    .map(|(_, since)| now.saturating_duration_since(since));
                self.standing = (l.waiting > 0).then_some((l.taken, now));
                self.reported = false;
                ended.map_or(Verdict::Quiet, Verdict::Moving)
            }
        }
    }
}

/// Starts the watch for the engine behind `shared`; it ends once the
/// engine is shutting down or gone.
pub(crate) fn spawn(shared: Weak<EngineShared>) {
    let started = std::thread::Builder::new()
        .name("rkv-watch".to_string())
        .spawn(move || run(shared));
    if let Err(e) = started {
        tracing::warn!(error = %e, "could not start the request watch; stuck shards will not be reported");
    }
}

fn run(shared: Weak<EngineShared>) {
    let warn_after = stuck_after();
    let mut watches: Vec<ShardWatch> = Vec::new();
    loop {
        std::thread::sleep(LOOK_EVERY);
        let Some(engine) = shared.upgrade() else {
            return;
        };
        if engine.shutting_down.load(Relaxed) || engine.closed.iter().all(|c| c.load(Relaxed)) {
            return;
        }
        if watches.is_empty() {
            watches = (0..engine.shard_count)
                .map(|_| ShardWatch::new(warn_after))
                .collect();
        }
        let now = Instant::now();
        for (shard, watch) in watches.iter_mut().enumerate() {
            let stats = &engine.stats[shard];
            let look = Look {
                waiting: engine.inboxes[shard].len(),
                taken: stats.taken.load(Relaxed),
            };
            match watch.look(look, now) {
                Verdict::Quiet => {}
                Verdict::Stuck(waited) => tracing::warn!(
                    shard,
                    waited_s = waited.as_secs_f64(),
                    inbox = look.waiting,
                    taken = look.taken,
                    cpu = ?engine.cpus.get(shard).copied().flatten(),
                    current_lsn = stats.current_lsn.load(Relaxed),
                    durable_lsn = stats.durable_lsn.load(Relaxed),
                    poisoned = stats.poisoned.load(Relaxed),
                    "a shard has requests waiting in its inbox and has taken none for a while: its thread is blocked, starved of its CPU (see cpu and io.cpus) or looping; report this line"
                ),
                Verdict::Moving(waited) => tracing::info!(
                    shard,
                    waited_s = waited.as_secs_f64(),
                    "the shard takes requests again"
                ),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shard_that_leaves_its_inbox_waiting_is_reported_once_then_its_end() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let at = |waiting, taken| Look { waiting, taken };
        let mut w = ShardWatch::new(s(10));
        // Busy: requests wait but the count moves.
        for i in 0..30 {
            assert_eq!(w.look(at(5, i), t0 + s(i)), Verdict::Quiet);
        }
        // Idle: nothing waits, the count stands.
        let t1 = t0 + s(100);
        for i in 0..30 {
            assert_eq!(w.look(at(0, 29), t1 + s(i)), Verdict::Quiet);
        }
        // Stuck: requests wait, the count stands.
        let t2 = t0 + s(200);
        assert_eq!(w.look(at(1, 29), t2), Verdict::Quiet);
        assert_eq!(w.look(at(3, 29), t2 + s(9)), Verdict::Quiet);
        assert_eq!(w.look(at(3, 29), t2 + s(10)), Verdict::Stuck(s(10)));
        assert_eq!(w.look(at(9, 29), t2 + s(40)), Verdict::Quiet, "said once");
        assert_eq!(w.look(at(0, 39), t2 + s(41)), Verdict::Moving(s(41)));
        assert_eq!(w.look(at(0, 39), t2 + s(90)), Verdict::Quiet);
    }
}
