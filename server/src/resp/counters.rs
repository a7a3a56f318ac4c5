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
    /// Per name in [`COMMANDS`], then one slot for unknown names.
    commands: Box<[AtomicU64]>,
    errors: AtomicU64,
}

impl Default for RespCounters {
    fn default() -> Self {
        RespCounters {
            connections_accepted: AtomicU64::new(0),
            connections_closed: AtomicU64::new(0),
            commands: (0..=COMMANDS.len()).map(|_| AtomicU64::new(0)).collect(),
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

    /// Counts a command by its name (case-insensitive).
    pub fn add_command(&self, name: &[u8]) {
        let slot = COMMANDS
            .iter()
            .position(|c| c.as_bytes().eq_ignore_ascii_case(name))
            .unwrap_or(COMMANDS.len());
        self.commands[slot].fetch_add(1, Relaxed);
    }

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
    pub per_command: Vec<u64>,
    pub unknown: u64,
    pub errors: u64,
}

impl RespTotals {
    pub fn of(shared: &Shared) -> RespTotals {
        let mut t = RespTotals {
            per_command: vec![0; COMMANDS.len()],
            ..Default::default()
        };
        for c in shared.resp_counters.iter() {
            t.connections_accepted += c.connections_accepted.load(Relaxed);
            t.connections_closed += c.connections_closed.load(Relaxed);
            t.errors += c.errors.load(Relaxed);
            for (i, n) in c.commands.iter().enumerate() {
                let n = n.load(Relaxed);
                t.commands += n;
                match t.per_command.get_mut(i) {
                    Some(slot) => *slot += n,
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
