//! Counters of the RESP listener, one block per shard (written only by that
//! shard's thread, read by INFO from any): connections, commands by name,
//! error replies.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::command::COMMANDS;
use crate::shard::Shared;

/// One shard's RESP counters.
#[repr(align(128))]
#[derive(Debug)]
pub struct RespCounters {
    connections_accepted: AtomicU64,
    connections_closed: AtomicU64,
    /// Per name in [`COMMANDS`], then one slot for unknown names: calls,
    /// calls refused before running (arity, syntax), calls whose run failed.
    commands: Box<[AtomicU64]>,
    rejected: Box<[AtomicU64]>,
    failed: Box<[AtomicU64]>,
    errors: AtomicU64,
}

impl Default for RespCounters {
    fn default() -> Self {
        RespCounters {
            connections_accepted: AtomicU64::new(0),
            connections_closed: AtomicU64::new(0),
            commands: (0..=COMMANDS.len()).map(|_| AtomicU64::new(0)).collect(),
            rejected: (0..=COMMANDS.len()).map(|_| AtomicU64::new(0)).collect(),
            failed: (0..=COMMANDS.len()).map(|_| AtomicU64::new(0)).collect(),
            errors: AtomicU64::new(0),
        }
    }
}

impl RespCounters {
    pub fn add_accepted(&self) {
        self.connections_accepted.fetch_add(1, Relaxed);
    }

    pub fn add_closed(&self) {
        self.connections_closed.fetch_add(1, Relaxed);
    }

    /// The counter slot of a command name (case-insensitive).
    pub fn slot(name: &[u8]) -> usize {
        COMMANDS
            .iter()
            .position(|c| c.as_bytes().eq_ignore_ascii_case(name))
            .unwrap_or(COMMANDS.len())
    }

    pub fn add_command(&self, slot: usize) {
        self.commands[slot].fetch_add(1, Relaxed);
    }

    /// An error reply before the command ran (unknown, arity, syntax).
    pub fn add_rejected(&self, slot: usize) {
        self.rejected[slot].fetch_add(1, Relaxed);
        self.errors.fetch_add(1, Relaxed);
    }

    /// An error reply from running the command.
    pub fn add_failed(&self, slot: usize) {
        self.failed[slot].fetch_add(1, Relaxed);
        self.errors.fetch_add(1, Relaxed);
    }

    /// An error that belongs to no command (a protocol error).
    pub fn add_error(&self) {
        self.errors.fetch_add(1, Relaxed);
    }
}

/// The sum over all shards.
#[derive(Debug, Default)]
pub struct RespTotals {
    pub connections_accepted: u64,
    pub connections_closed: u64,
    pub commands: u64,
    /// Per name in [`COMMANDS`]: (calls, rejected, failed).
    pub per_command: Vec<(u64, u64, u64)>,
    pub unknown: u64,
    pub errors: u64,
}

impl RespTotals {
    pub fn of(shared: &Shared) -> RespTotals {
        let mut t = RespTotals {
            per_command: vec![(0, 0, 0); COMMANDS.len()],
            ..Default::default()
        };
        for c in shared.resp_counters.iter() {
            t.connections_accepted += c.connections_accepted.load(Relaxed);
            t.connections_closed += c.connections_closed.load(Relaxed);
            t.errors += c.errors.load(Relaxed);
            for i in 0..c.commands.len() {
                let n = c.commands[i].load(Relaxed);
                t.commands += n;
                match t.per_command.get_mut(i) {
                    Some(slot) => {
                        slot.0 += n;
                        slot.1 += c.rejected[i].load(Relaxed);
                        slot.2 += c.failed[i].load(Relaxed);
                    }
                    None => t.unknown += n,
                }
            }
        }
        t
    }

    pub fn connections_open(&self) -> u64 {
        self.connections_accepted
            .saturating_sub(self.connections_closed)
    }
}
