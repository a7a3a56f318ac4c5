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
    loop {
        if core.is_poisoned() {
            return;
        }
        core.wake_settles();
        if core.with_tier_mut(|t| t.background_step()) {
            core.publish_tier_stats();
            yield_now().await;
        } else {
            core.publish_tier_stats();
            compio::time::sleep(IDLE).await;
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
