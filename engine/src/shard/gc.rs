//! The tier's background work on one shard: the hybrid tier's segment GC,
//! one bounded step at a time on the shard thread, yielding to requests
//! between steps, sleeping when there is nothing to do; and its settling
//! reads (the older records of keys put while its unresolved set was
//! full), made asynchronously after the puts.

use crate::notify::yield_now;
use crate::shard::core::ShardCore;
use std::rc::Rc;
use std::time::Duration;

/// Pause between looks when the tier has no background work.
const IDLE: Duration = Duration::from_millis(100);

/// Most settling reads submitted at once.
const SETTLE_BATCH: usize = 1024;

pub(crate) async fn run_tier_background(core: Rc<ShardCore>) {
    let mut asked: Option<std::time::Instant> = None;
    loop {
        if core.is_poisoned() {
            return;
        }
        core.wake_settles();
        let worked = core.with_tier_mut(|t| t.background_step());
        core.publish_tier_stats();
        // A checkpoint the tier needs (a hot device full of segments GC
        // emptied): the checkpointer looks again (told at most every IDLE).
        if asked.is_none_or(|at| at.elapsed() >= IDLE)
            && core.with_tier(|t| t.checkpoint_wanted().is_some())
        {
            core.wal.checkpoint_wanted.notify();
            asked = Some(std::time::Instant::now());
        }
        if worked {
            yield_now().await;
        } else {
            // GC of a hot segment waiting for the moves' share of a device
            // goes on when that share allows, not a whole idle pause later.
            let pause = core.with_tier(|t| t.background_wait()).map_or(IDLE, |at| {
                at.saturating_duration_since(std::time::Instant::now())
                    .min(IDLE)
            });
            compio::time::sleep(pause).await;
        }
    }
}

/// Makes the tier's settling reads as they are queued.
pub(crate) async fn run_settles(core: Rc<ShardCore>) {
    loop {
        let wanted = core.settle_wanted.notified();
        if !core.settle_some(SETTLE_BATCH).await {
            wanted.await;
        }
    }
}
