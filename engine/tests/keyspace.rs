//! Whole-keyspace operations: a partition walk returns every key once per
//! walk; `clear` deletes every key durably (logged deletes survive a crash
//! of the simulated disk).

mod common;

use common::*;
use ringkv_engine::io::sim::SimDisk;
use ringkv_engine::{Engine, Op, OpResult, PARTITIONS_PER_SHARD};
use std::collections::BTreeSet;
use std::path::Path;
use tunables::Durability;

fn all_keys(h: &ringkv_engine::Handle) -> Vec<Vec<u8>> {
    let mut keys = Vec::new();
    for shard in 0..h.shard_count() {
        let mut from = Some(0);
        let mut steps = 0;
        while let Some(p) = from {
            let step = pollster::block_on(h.partition_keys(shard, p, 7)).expect("walk");
            keys.extend(step.keys.iter().map(|k| k.to_vec()));
            from = step.next;
            steps += 1;
            assert!(steps <= PARTITIONS_PER_SHARD);
        }
    }
    keys
}

#[test]
fn a_partition_walk_returns_every_key_once_and_clear_removes_them_durably() {
    init_log();
    let disk = SimDisk::new(21);
    let dir = Path::new("/data");
    let config = small_config(dir, 3, Durability::Sync);
    let engine = Engine::open_with_disk(&config, disk.clone()).expect("open");
    let h = engine.handle();
    let ops: Vec<Op> = (0..400).map(|i| put(i, 1)).collect();
    assert!(h
        .batch_blocking(ops)
        .unwrap()
        .iter()
        .all(|r| *r == OpResult::Ok));
    let keys = all_keys(&h);
    assert_eq!(keys.len(), 400);
    let unique: BTreeSet<Vec<u8>> = keys.into_iter().collect();
    let want: BTreeSet<Vec<u8>> = (0..400).map(|i| key(i).to_vec()).collect();
    assert_eq!(unique, want);

    assert_eq!(pollster::block_on(h.clear()).expect("clear"), 400);
    assert!(all_keys(&h).is_empty());
    assert_eq!(pollster::block_on(h.clear()).expect("clear"), 0);
    assert!(h
        .batch_blocking(vec![put(1, 2)])
        .unwrap()
        .iter()
        .all(|r| *r == OpResult::Ok));
    engine.halt();
    disk.crash();
    let engine = Engine::open_with_disk(&config, disk).expect("reopen");
    let h = engine.handle();
    let keys = all_keys(&h);
    assert_eq!(keys, vec![key(1).to_vec()]);
    engine.shutdown().expect("shutdown");
}
