//! Active expiry of one shard: every tick, up to a fixed number of keys
//! whose expiry time has passed are deleted through ordinary logged
//! deletes (so recovery replays exactly what this shard saw). Reads never
//! depend on it (they treat expired keys as absent); it reclaims memory.
//!
//! What must hold: a tick costs at most `storage.expiry_keys_per_tick`
//! index lookups and
//! deletes, whatever the number of expired keys; a key written again (with
//! a later expiry, or none) between the index lookup and the delete is
//! left alone (the delete is a conditional update that runs on the key's
//! state at apply time).

use crate::api::{Current, Op, OpResult, TtlUpdate, UpdateAnswer, UpdateOutcome, UpdateWrite};
use crate::shard::core::ShardCore;
use bytes::Bytes;
use std::rc::Rc;
use std::time::Duration;

/// Deletes the key if it is still expired when the update runs: an
/// expired key reads as missing (`current` is `None`), and the core
/// deletes (and logs) an expired entry on `UpdateWrite::Delete`.
fn delete_if_expired(current: Current, _now_ms: u64, _: &Bytes, _: i64) -> UpdateOutcome {
    match current {
        None => UpdateOutcome {
            write: UpdateWrite::Delete,
            answer: UpdateAnswer::Ok,
        },
        Some(_) => UpdateOutcome {
            write: UpdateWrite::Keep,
            answer: UpdateAnswer::Nil,
        },
    }
}

/// One tick: deletes up to `max` expired keys; returns how many were
/// looked at.
pub(crate) async fn expire_tick(core: &ShardCore, max: usize) -> usize {
    let keys = core.with_tier(|t| t.due_keys(max));
    let n = keys.len();
    if n == 0 {
        return 0;
    }
    let ops = keys
        .into_iter()
        .map(|key| Op::UpdateTtl {
            key,
            update: TtlUpdate {
                apply: delete_if_expired,
                arg: Bytes::new(),
                number: 0,
            },
        })
        .collect();
    for r in core.execute(ops).await {
        if let OpResult::Err(e) = r {
            tracing::debug!(error = %e, "active expiry stopped for this tick");
            break;
        }
    }
    n
}

/// The active-expiry loop of one shard: every `tick`, at most
/// `keys_per_tick` deletes (the rest wait for later ticks; reads already
/// treat them as absent). Ends when the shard is poisoned (no delete could
/// be logged).
pub(crate) async fn run_active_expiry(core: Rc<ShardCore>, tick: Duration, keys_per_tick: usize) {
    loop {
        compio::time::sleep(tick).await;
        if core.is_poisoned() {
            return;
        }
        expire_tick(&core, keys_per_tick).await;
    }
}
