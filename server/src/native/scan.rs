//! The native protocol's SCAN: one step of a walk over every shard's keys,
//! partition by partition, answered as a KEYS reply that fits the room the
//! response has for it.
//!
//! The cursor is `shard × PARTITIONS_PER_SHARD + partition`: the next
//! partition to read. A key's partition is a function of its hash and a
//! shard's partition count never changes, so a cursor stays valid while
//! the shard grows, and a walk that reads every partition once returns
//! every key present for the whole walk (each partition is read in one
//! step on its shard's thread).
//!
//! What must hold: the KEYS payload is at most `room_bytes` (a step stops
//! before the partition that would pass it; a first partition that alone
//! passes it answers FRAME_TOO_LARGE); a step reads at most
//! [`SCAN_COUNT_MAX`] keys beyond one partition; a cursor naming a shard
//! the server does not have answers BAD_REQUEST, never a panic.

use bytes::Bytes;
use engine::{Handle, PARTITIONS_PER_SHARD};
use ringkv_protocol::{OpReply, Status, KEYS_ENTRY_HEADER_BYTES, KEYS_PAYLOAD_HEADER_BYTES};

use crate::glob::glob_match;
use crate::ops::status::op_error_status;

/// Keys a step visits when the request's count is 0.
pub const SCAN_COUNT_DEFAULT: usize = 10;
/// Most keys a step is asked to visit, whatever the count says.
pub const SCAN_COUNT_MAX: usize = 100_000;

/// The arguments of one SCAN operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanArgs {
    pub cursor: u64,
    pub count: u32,
    /// Empty: every key.
    pub pattern: Bytes,
}

/// Where a cursor points: a shard and the next partition to read there.
fn position(cursor: u64, shard_count: usize) -> Option<(usize, usize)> {
    let per_shard = PARTITIONS_PER_SHARD as u64;
    let shard = usize::try_from(cursor / per_shard).ok()?;
    (shard < shard_count).then_some((shard, (cursor % per_shard) as usize))
}

fn cursor_of(shard: usize, partition: usize) -> u64 {
    shard as u64 * PARTITIONS_PER_SHARD as u64 + partition as u64
}

/// Runs one SCAN step; the KEYS payload it answers is at most `room_bytes`.
pub async fn scan(handle: &Handle, args: &ScanArgs, room_bytes: usize) -> OpReply {
    let shard_count = handle.shard_count();
    let Some((mut shard, mut partition)) = position(args.cursor, shard_count) else {
        return OpReply::Error {
            status: Status::BadRequest,
            message: format!(
                "invalid SCAN cursor {}: no SCAN answer carries it (this server has {shard_count} shards); start a walk with cursor 0",
                args.cursor
            ),
        };
    };
    let wanted = match args.count {
        0 => SCAN_COUNT_DEFAULT,
        n => (n as usize).min(SCAN_COUNT_MAX),
    };
    let mut visited = 0usize;
    let mut keys: Vec<Bytes> = Vec::new();
    let mut payload_bytes = KEYS_PAYLOAD_HEADER_BYTES;
    while shard < shard_count && visited < wanted {
        // Asking for one key reads exactly one non-empty partition (empty
        // ones before it are skipped), so each step adds a whole partition.
        let step = match handle.partition_keys(shard, partition, 1).await {
            Ok(step) => step,
            Err(error) => {
                return OpReply::Error {
                    status: op_error_status(&error),
                    message: error.to_string(),
                }
            }
        };
        let read = step.keys.len();
        let matched: Vec<Bytes> = step
            .keys
            .into_iter()
            .filter(|key| args.pattern.is_empty() || glob_match(&args.pattern, key))
            .collect();
        let step_bytes: usize = matched
            .iter()
            .map(|key| KEYS_ENTRY_HEADER_BYTES + key.len())
            .sum();
        if payload_bytes + step_bytes > room_bytes {
            if keys.is_empty() && visited == 0 {
                return OpReply::Error {
                    status: Status::FrameTooLarge,
                    message: format!(
                        "SCAN at cursor {}: the next partition of shard {shard} holds {} matching keys ({step_bytes} bytes), more than the {room_bytes} bytes a response has room for; scan with a narrower MATCH pattern, or raise limits.frame_bytes_max",
                        args.cursor,
                        matched.len()
                    ),
                };
            }
            // This partition is read again by the next step.
            break;
        }
        visited += read;
        payload_bytes += step_bytes;
        keys.extend(matched);
        match step.next {
            Some(next) => partition = next,
            None => {
                shard += 1;
                partition = 0;
            }
        }
    }
    let cursor = if shard >= shard_count {
        0
    } else {
        cursor_of(shard, partition)
    };
    OpReply::Keys { cursor, keys }
}

/// Runs `scans` one after another, each with `room_bytes` for its keys.
pub async fn scan_each(handle: &Handle, scans: &[ScanArgs], room_bytes: usize) -> Vec<OpReply> {
    let mut answers = Vec::with_capacity(scans.len());
    for args in scans {
        answers.push(scan(handle, args, room_bytes).await);
    }
    answers
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_name_a_shard_and_a_partition() {
        let per = PARTITIONS_PER_SHARD as u64;
        assert_eq!(position(0, 2), Some((0, 0)));
        assert_eq!(position(per + 3, 2), Some((1, 3)));
        assert_eq!(position(2 * per, 2), None);
        assert_eq!(position(u64::MAX, 2), None);
        assert_eq!(cursor_of(1, 3), per + 3);
        for cursor in [0, 1, per - 1, per, per + 255] {
            let (shard, partition) = position(cursor, 2).unwrap();
            assert_eq!(cursor_of(shard, partition), cursor);
        }
    }
}
