//! Choosing and loading the snapshot chain recovery starts from: list the
//! shard's snapshot files, drop the ones a checkpoint did not finish, read
//! every header, load the newest snapshot whose chain (the full snapshot it
//! builds on and every delta up to it) checks out, keep what retention needs
//! and set aside the snapshots newer than the one chosen.
//!
//! Recovery's snapshot phase (`choose_snapshot` in `wal::recovery`) calls
//! these pieces in order and records the rows of its decision table they
//! lead to (`SnapshotLoaded`, `DamagedSnapshotSkipped`, `NoUsableSnapshot`).
//! Nothing here knows the WAL: the phase passes in the first LSN the log
//! holds.

use crate::error::{EngineError, SnapshotError};
use crate::io::{Disk, DiskFile};
use crate::layout::{
    parse_numbered, DirId, ShardPaths, DAMAGED_SUFFIX, SNAPSHOT_SUFFIX, TMP_SUFFIX,
};
use crate::snapshot::{self, SnapshotFile, SnapshotMeta};
use crate::tier::Tier;
use std::path::PathBuf;

/// Makes an empty tier for recovery to load a checkpoint into; the
/// argument is the checkpoint's entry count, when known.
pub type TierFactory<'a> = dyn Fn(Option<u64>) -> Box<dyn Tier> + 'a;

pub(crate) fn list_snapshots<D: Disk>(
    disk: &D,
    paths: &ShardPaths,
) -> Result<(Vec<SnapshotFile>, Vec<PathBuf>), EngineError> {
    let files = disk
        .list_dir(&paths.snapshot_dir)
        .map_err(|source| EngineError::Io {
            op: "list snapshot directory",
            path: paths.snapshot_dir.clone(),
            source,
        })?;
    let mut snaps = Vec::new();
    let mut leftovers = Vec::new();
    for path in files {
        if let Some(lsn) = parse_numbered(&path, SNAPSHOT_SUFFIX) {
            snaps.push(SnapshotFile {
                lsn,
                path,
                base_lsn: None,
                bytes: 0,
            });
        } else if path.to_string_lossy().ends_with(TMP_SUFFIX) {
            leftovers.push(path);
        } else if !path.to_string_lossy().ends_with(DAMAGED_SUFFIX) {
            tracing::warn!(file = %path.display(), "ignoring a file that is not a snapshot");
        }
    }
    snaps.sort_by_key(|s| s.lsn);
    Ok((snaps, leftovers))
}

/// `snap` cannot be used, for `reason` (a damage found at its start, or in
/// what it builds on).
fn unusable(snap: &SnapshotFile, reason: String) -> (SnapshotFile, SnapshotError) {
    let e = SnapshotError::Corrupt {
        file: snap.path.clone(),
        offset: 0,
        reason,
    };
    (snap.clone(), e)
}

/// The snapshot recovery loaded: its place among the snapshots, its chain
/// (indexes, the full one first), the tier it loaded and what its last
/// file's trailer says, and the entries of the whole chain.
pub(crate) struct Chosen {
    pub(crate) at: usize,
    chain: Vec<usize>,
    pub(crate) tier: Box<dyn Tier>,
    pub(crate) meta: SnapshotMeta,
    pub(crate) entries: u64,
}

/// A damaged snapshot and what is wrong with it.
pub(crate) type Damaged = (SnapshotFile, SnapshotError);

async fn open_snapshot<D: Disk>(disk: &D, snap: &SnapshotFile) -> Result<D::File, SnapshotError> {
    disk.open(&snap.path, false)
        .await
        .map_err(|source| SnapshotError::Io {
            op: "open",
            file: snap.path.clone(),
            offset: 0,
            source,
        })
}

/// Removes snapshots a checkpoint did not finish. Returns whether any was
/// removed (the folder then needs an fsync).
pub(crate) async fn remove_unfinished_snapshots<D: Disk>(
    disk: &D,
    leftovers: Vec<PathBuf>,
) -> Result<bool, EngineError> {
    let removed = !leftovers.is_empty();
    for tmp in leftovers {
        tracing::info!(file = %tmp.display(), "removing an unfinished snapshot");
        disk.remove_file(&tmp)
            .await
            .map_err(|source| EngineError::Io {
                op: "remove unfinished snapshot",
                path: tmp.clone(),
                source,
            })?;
    }
    Ok(removed)
}

/// Reads every snapshot's header: which snapshot each delta builds on, and
/// its size. Returns the readable ones and the damaged ones.
pub(crate) async fn read_snapshot_headers<D: Disk>(
    disk: &D,
    listed: Vec<SnapshotFile>,
    owner: (u32, DirId),
) -> Result<(Vec<SnapshotFile>, Vec<Damaged>), EngineError> {
    let mut snapshots = Vec::new();
    let mut damaged = Vec::new();
    for mut snap in listed {
        let file = open_snapshot(disk, &snap).await?;
        snap.bytes = file.len().await.unwrap_or(0);
        match snapshot::read_header(&file, &snap.path, owner).await {
            Ok(h) if h.lsn == snap.lsn => {
                snap.base_lsn = h.base_lsn;
                snapshots.push(snap);
            }
            Ok(h) => {
                let reason = format!("header covers LSN {} but the name says {}", h.lsn, snap.lsn);
                damaged.push(unusable(&snap, reason));
            }
            // A file of another directory is not damage to fall back from.
            Err(e @ (SnapshotError::Io { .. } | SnapshotError::ForeignDirectory { .. })) => {
                return Err(e.into())
            }
            Err(e) => damaged.push((snap, e)),
        }
    }
    Ok((snapshots, damaged))
}

/// Why the chain of the delta `snap` does not reach a full snapshot: the
/// first base on the way that is not a readable snapshot, named as
/// damaged (with why) or as missing (with the path it would have), so a
/// refusal names the file to restore, not only the newest delta.
fn broken_link(snapshots: &[SnapshotFile], damaged: &[Damaged], snap: &SnapshotFile) -> String {
    let mut cur = snap;
    // Bounded: a base naming a later snapshot (damage) must not loop.
    for _ in 0..=snapshots.len() {
        let Some(base) = cur.base_lsn else {
            break;
        };
        if let Some(next) = snapshots.iter().find(|s| s.lsn == base && base < cur.lsn) {
            cur = next;
            continue;
        }
        if let Some((d, e)) = damaged.iter().find(|(d, _)| d.lsn == base) {
            return format!(
                "it builds on the damaged snapshot {} ({e})",
                d.path.display()
            );
        }
        let path = cur
            .path
            .with_file_name(format!("{base:020}{SNAPSHOT_SUFFIX}"));
        return format!(
            "it is a delta, and its chain builds on {} (over LSN {base}), which is missing",
            path.display()
        );
    }
    "its chain of bases does not lead to a full snapshot".to_string()
}

fn is_damaged(damaged: &[Damaged], lsn: u64) -> bool {
    damaged.iter().any(|(d, _)| d.lsn == lsn)
}

/// Loads the newest snapshot whose whole chain loads, adding to `damaged`
/// every snapshot found unusable on the way. An older snapshot only helps
/// if the WAL reaches back to it (`first_header_lsn`: the first LSN of the
/// oldest used segment).
pub(crate) async fn load_newest_chain<D: Disk>(
    disk: &D,
    snapshots: &[SnapshotFile],
    damaged: &mut Vec<Damaged>,
    first_header_lsn: Option<u64>,
    owner: (u32, DirId),
    new_tier: &TierFactory<'_>,
) -> Result<Option<Chosen>, EngineError> {
    for at in (0..snapshots.len()).rev() {
        let snap = &snapshots[at];
        let newer_exist = damaged.iter().any(|(d, _)| d.lsn > snap.lsn) || at + 1 < snapshots.len();
        if newer_exist && first_header_lsn.is_none_or(|first| first > snap.lsn + 1) {
            return Ok(None);
        }
        let Some(chain) = crate::snapshot::chain_of(snapshots, at) else {
            let reason = broken_link(snapshots, damaged, snap);
            damaged.push(unusable(snap, reason));
            continue;
        };
        if let Some(&bad) = chain
            .iter()
            .find(|&&i| is_damaged(damaged, snapshots[i].lsn))
        {
            if bad != at {
                let reason = format!(
                    "it builds on the damaged snapshot {}",
                    snapshots[bad].path.display()
                );
                damaged.push(unusable(snap, reason));
            }
            continue;
        }
        match load_chain(disk, snapshots, &chain, owner, new_tier).await? {
            Ok((tier, meta, entries)) => {
                return Ok(Some(Chosen {
                    at,
                    chain,
                    tier,
                    meta,
                    entries,
                }))
            }
            Err(found) => {
                // Name the damaged file: the newest snapshot's refusal is
                // the one an operator reads.
                let reason = format!(
                    "it builds on the damaged snapshot {} ({})",
                    found.0.path.display(),
                    found.1
                );
                let found_is_snap = found.0.lsn == snap.lsn;
                damaged.push(found);
                if !found_is_snap && !is_damaged(damaged, snap.lsn) {
                    damaged.push(unusable(snap, reason));
                }
            }
        }
    }
    Ok(None)
}

/// Loads one chain (indexes into `snapshots`, the full snapshot first)
/// into a new tier: the tier, the newest file's trailer and the entries of
/// the whole chain, or the damaged file (the newest one when the tier
/// refused the chain as a whole).
async fn load_chain<D: Disk>(
    disk: &D,
    snapshots: &[SnapshotFile],
    chain: &[usize],
    owner: (u32, DirId),
    new_tier: &TierFactory<'_>,
) -> Result<Result<(Box<dyn Tier>, SnapshotMeta, u64), Damaged>, EngineError> {
    // The tier is sized from the full snapshot's entry count up front, so
    // the load does not grow and rehash its tables.
    let root = open_snapshot(disk, &snapshots[chain[0]]).await?;
    let mut tier = new_tier(snapshot::entry_count_hint(&root).await);
    drop(root);
    let mut entries = 0;
    let mut last = None;
    for &i in chain {
        let file = open_snapshot(disk, &snapshots[i]).await?;
        match snapshot::load(&file, &snapshots[i].path, owner, Some(&mut *tier)).await {
            Ok(meta) => {
                entries += meta.entries;
                last = Some(meta);
            }
            // A file of another directory is not damage to fall back from.
            Err(e @ (SnapshotError::Io { .. } | SnapshotError::ForeignDirectory { .. })) => {
                return Err(e.into())
            }
            Err(e) => {
                tracing::warn!(file = %snapshots[i].path.display(), error = %e, "snapshot is damaged");
                return Ok(Err((snapshots[i].clone(), e)));
            }
        }
    }
    let meta = last.expect("a chain holds at least its full snapshot");
    // The tier's last step: what only the whole chain says (the hybrid
    // tier opens the value segments its newest table lists).
    if let Err(reason) = tier.load_checkpoint_done() {
        let newest = &snapshots[*chain.last().expect("a chain is not empty")];
        let (snap, e) = unusable(newest, reason);
        tracing::warn!(file = %snap.path.display(), error = %e, "snapshot is damaged");
        return Ok(Err((snap, e)));
    }
    Ok(Ok((tier, meta, entries)))
}

/// What is kept for the checkpointer's retention: the chosen chain, and
/// the chain of the snapshot before it if that one checks out (the
/// fallback until the next checkpoint), each file read once.
pub(crate) async fn kept_snapshots<D: Disk>(
    disk: &D,
    snapshots: &[SnapshotFile],
    chosen: Option<&Chosen>,
    owner: (u32, DirId),
) -> Result<Vec<SnapshotFile>, EngineError> {
    let mut kept: Vec<usize> = chosen.map(|c| c.chain.clone()).unwrap_or_default();
    if let Some(at) = chosen.map(|c| c.at).filter(|&at| at > 0) {
        if let Some(chain) = crate::snapshot::chain_of(snapshots, at - 1) {
            let mut all_valid = true;
            for &i in chain.iter().filter(|i| !kept.contains(i)) {
                let file = open_snapshot(disk, &snapshots[i]).await?;
                match snapshot::load(&file, &snapshots[i].path, owner, None).await {
                    Ok(_) => {}
                    // A file of another directory is not damage to fall back from.
                    Err(
                        e @ (SnapshotError::Io { .. } | SnapshotError::ForeignDirectory { .. }),
                    ) => return Err(e.into()),
                    Err(e) => {
                        tracing::warn!(file = %snapshots[i].path.display(), error = %e, "snapshot is damaged");
                        all_valid = false;
                    }
                }
            }
            if all_valid {
                kept.extend(chain);
            }
        }
    }
    kept.sort_unstable();
    kept.dedup();
    Ok(kept.iter().map(|&i| snapshots[i].clone()).collect())
}

/// The snapshots newer than the one chosen (at `chosen_lsn`), each with
/// why it cannot be used, newest first.
pub(crate) fn unusable_after(
    snapshots: &[SnapshotFile],
    damaged: &[Damaged],
    chosen_lsn: u64,
) -> Vec<(SnapshotFile, String)> {
    let mut unusable: Vec<(SnapshotFile, String)> = damaged
        .iter()
        .filter(|(d, _)| d.lsn > chosen_lsn)
        .map(|(d, e)| (d.clone(), e.to_string()))
        .collect();
    for snap in snapshots.iter().filter(|s| s.lsn > chosen_lsn) {
        if !unusable.iter().any(|(d, _)| d.lsn == snap.lsn) {
            unusable.push((snap.clone(), "a snapshot it builds on is damaged".into()));
        }
    }
    unusable.sort_by_key(|(d, _)| std::cmp::Reverse(d.lsn));
    unusable
}

/// Renames each unusable snapshot `*.damaged`: an older snapshot plus the
/// WAL cover it.
pub(crate) async fn set_aside_damaged<D: Disk>(
    disk: &D,
    unusable: &[(SnapshotFile, String)],
) -> Result<(), EngineError> {
    for (snap, reason) in unusable {
        let to = PathBuf::from(format!("{}{DAMAGED_SUFFIX}", snap.path.display()));
        tracing::warn!(file = %snap.path.display(), error = %reason, renamed_to = %to.display(),
            "skipping a damaged snapshot: an older snapshot plus the WAL cover it");
        disk.rename(&snap.path, &to)
            .await
            .map_err(|source| EngineError::Io {
                op: "rename damaged snapshot",
                path: snap.path.clone(),
                source,
            })?;
    }
    Ok(())
}
