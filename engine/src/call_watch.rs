//! Blocking calls that explain themselves: [`block_on`] runs a call's
//! future on the calling thread, and if the answer has not come after
//! [`warn_after`] it logs, once per such wait, what every shard of the
//! engine shows (its inbox, the messages it took, its current and durable
//! LSN, whether it is poisoned), then keeps waiting. An answer that never
//! comes is a bug; this line is what its report needs.
//!
//! The request watch (`request_watch.rs`) sees a shard that stopped taking
//! requests, the durability watch (`wal/watch.rs`) a WAL that stopped
//! becoming durable; this one sees the caller's side, whatever the cause
//! (a lock never granted, an answer lost between threads).

use crate::shard::router::EngineShared;
use std::future::Future;
use std::pin::pin;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

/// How long a blocking call may wait before its wait is logged: 30 s, or
/// `RINGKV_CALL_WARN_MS` milliseconds (tests), read once per process (the
/// call path should not pay an environment lookup each time).
pub(crate) fn warn_after() -> Duration {
    static AFTER: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *AFTER.get_or_init(|| {
        std::env::var("RINGKV_CALL_WARN_MS")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .map_or(CALL_WARN_AFTER, Duration::from_millis)
    })
}

const CALL_WARN_AFTER: Duration = Duration::from_secs(30);

/// Wakes the thread blocked in [`block_on`].
struct Unpark(std::thread::Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// Runs `fut` to its end on this thread; past `warn_after` without an
/// answer, `report` is called once with how long the call has waited.
pub(crate) fn block_on_reporting<F: Future>(
    fut: F,
    warn_after: Duration,
    mut report: impl FnMut(Duration),
) -> F::Output {
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut fut = pin!(fut);
    let started = Instant::now();
    let mut reported = false;
    loop {
        if let Poll::Ready(out) = fut.as_mut().poll(&mut cx) {
            return out;
        }
        if reported {
            std::thread::park();
            continue;
        }
        let waited = started.elapsed();
        match warn_after.checked_sub(waited) {
            Some(left) if !left.is_zero() => std::thread::park_timeout(left),
            _ => {
                reported = true;
                report(waited);
            }
        }
    }
}

/// [`block_on_reporting`] for a call into the engine behind `shared`: the
/// report is one WARN per shard with its state.
pub(crate) fn block_on<F: Future>(fut: F, shared: &EngineShared) -> F::Output {
    block_on_reporting(fut, warn_after(), |waited| log_shards(shared, waited))
}

fn log_shards(shared: &EngineShared, waited: Duration) {
    for shard in 0..shared.shard_count {
        let stats = &shared.stats[shard];
        tracing::warn!(
            shard,
            waited_s = waited.as_secs_f64(),
            inbox = shared.inboxes[shard].len(),
            taken = stats.taken.load(Relaxed),
            current_lsn = stats.current_lsn.load(Relaxed),
            durable_lsn = stats.durable_lsn.load(Relaxed),
            poisoned = stats.poisoned.load(Relaxed),
            "a blocking call has had no answer for a while; each shard's state follows (one line per shard): report these lines"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A future that is ready once `at` has passed, and wakes its waker
    /// from another thread then (as an answer from a shard does).
    fn ready_at(at: Instant) -> impl Future<Output = u32> {
        let mut spawned = false;
        std::future::poll_fn(move |cx| {
            if Instant::now() >= at {
                return Poll::Ready(7);
            }
            if !spawned {
                spawned = true;
                let waker = cx.waker().clone();
                std::thread::spawn(move || {
                    std::thread::sleep(at.saturating_duration_since(Instant::now()));
                    waker.wake();
                });
            }
            Poll::Pending
        })
    }

    #[test]
    fn a_quick_answer_reports_nothing() {
        let mut reports = 0;
        let out = block_on_reporting(
            ready_at(Instant::now() + Duration::from_millis(5)),
            Duration::from_secs(60),
            |_| reports += 1,
        );
        assert_eq!((out, reports), (7, 0));
    }

    #[test]
    fn a_late_answer_is_reported_once_and_still_returned() {
        let mut waits = Vec::new();
        let out = block_on_reporting(
            ready_at(Instant::now() + Duration::from_millis(300)),
            Duration::from_millis(20),
            |waited| waits.push(waited),
        );
        assert_eq!(out, 7);
        assert_eq!(waits.len(), 1, "{waits:?}");
        assert!(waits[0] >= Duration::from_millis(20));
    }
}
