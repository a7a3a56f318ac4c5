//! Crash runs (`--crash-every`, `--crashes`): the workload runs against a
//! `ringkv-server` child process that loadgen SIGKILLs at random moments,
//! restarts on the same data directory and audits (docs/loadgen.md "Crash
//! runs").
//!
//! What must hold: clients are paused (and every in-flight answer counted)
//! before a read-back starts, so the audit compares the server with every
//! acknowledgement it gave; the run's active time (clients sending) adds up
//! to the requested duration, kills and audits come on top; the child is
//! killed whenever the run ends, by error or Ctrl-C included.

pub mod audit;
pub mod chart;
pub mod clients;
pub mod process;
pub mod report;
pub mod timeline;

mod control;

pub use control::{async_window, run, CrashError, CrashOutcome, RunOn};

use audit::VersionTable;
use clients::Phase;
use std::collections::VecDeque;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};
use timeline::Timeline;

/// Called between a kill and the restart with the data directory (tests
/// damage the WAL here to check that the audit sees the loss).
pub type BetweenKillAndRestart = Arc<dyn Fn(&Path) + Send + Sync>;

/// What a crash run does (the CLI's crash flags after defaults).
#[derive(Clone)]
pub struct CrashPlan {
    /// Mean time between kills; each gap is uniform in [0.5, 1.5] x this.
    pub interval: Duration,
    /// At most this many kills (None: as many as fit in the duration).
    pub crashes: Option<u32>,
    /// Time the clients send, in total (kills, restarts and audits add to it).
    pub duration: Duration,
    /// The server program and leading arguments (a shell command line).
    pub server_command: String,
    /// Read back every key up to this many; above it, a uniform sample of
    /// about this many.
    pub audit_keys_max: u64,
    /// Async runs: losses may lie within the server's flush interval plus
    /// this before a kill.
    pub async_slack: Duration,
    /// A restart not ready within this fails the run.
    pub ready_within: Duration,
    /// Request timeout of the clients and the audit.
    pub timeout: Duration,
    pub between_kill_and_restart: Option<BetweenKillAndRestart>,
}

/// The client mix a crash run uses for a workload (None: not supported).
pub fn mix_of(workload: crate::cli::WorkloadArg) -> Option<clients::Mix> {
    use crate::cli::WorkloadArg as W;
    match workload {
        W::Putget => Some(clients::Mix::PutGet),
        W::Sweep => Some(clients::Mix::Sweep),
        W::YcsbA => Some(clients::Mix::YcsbA),
        W::Putgettx | W::PutgettxContended => Some(clients::Mix::Bank),
        _ => None,
    }
}

/// One acknowledged write, remembered for a short while (async runs).
#[derive(Debug, Clone, Copy)]
struct Ack {
    keynum: u64,
    version: u32,
    at: Instant,
}

/// Recent acknowledgements, to tell how long before a kill a lost write
/// was acknowledged.
struct AckLog {
    keep: Duration,
    acks: Mutex<VecDeque<Ack>>,
}

/// What the clients and the controller share.
pub struct Shared {
    pub table: VersionTable,
    addr: RwLock<String>,
    phase: tokio::sync::watch::Sender<Phase>,
    /// Clients waiting for the run to resume.
    parked: AtomicUsize,
    timeline: Timeline,
    acks: Option<AckLog>,
    /// Acknowledged writes so far.
    acknowledged: AtomicU64,
    /// Read back every key up to this many, else a sample of about this many.
    audit_keys_max: u64,
    /// Durability none: every loss is expected (nothing is on disk).
    keeps_nothing: bool,
    /// Async runs: how long before a kill a lost write may be acknowledged.
    async_window: Option<Duration>,
    value_bytes: usize,
    threads: usize,
    batch: usize,
    timeout: Duration,
    seed: u64,
}

impl Shared {
    fn addr(&self) -> String {
        self.addr.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn set_addr(&self, addr: &str) {
        *self.addr.write().unwrap_or_else(|e| e.into_inner()) = addr.to_string();
    }

    /// Remembers an acknowledgement (async runs only).
    fn note_ack(&self, keynum: u64, version: u32) {
        self.acknowledged
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let Some(log) = &self.acks else { return };
        let now = Instant::now();
        let mut acks = log.acks.lock().unwrap_or_else(|e| e.into_inner());
        while acks.front().is_some_and(|a| now - a.at > log.keep) {
            acks.pop_front();
        }
        acks.push_back(Ack {
            keynum,
            version,
            at: now,
        });
    }

    /// Forgets the acknowledgements of versions an audit has judged lost
    /// (`(keynum, acked, found)`): the next audit starts from `found`, and
    /// a later loss of the same key must be timed by its own, newer
    /// acknowledgements, not by these.
    fn forget_judged_acks(&self, lost: &[(u64, u32, u32)]) {
        let Some(log) = &self.acks else { return };
        let judged: std::collections::HashMap<u64, u32> =
            lost.iter().map(|&(k, acked, _)| (k, acked)).collect();
        let mut acks = log.acks.lock().unwrap_or_else(|e| e.into_inner());
        acks.retain(|a| judged.get(&a.keynum).is_none_or(|&acked| a.version > acked));
    }

    /// For each `(keynum, found)`, when the oldest acknowledged version
    /// above `found` was acknowledged, if still remembered.
    fn oldest_lost_acks(&self, lost: &[(u64, u32)]) -> Vec<Option<Instant>> {
        let Some(log) = &self.acks else {
            return vec![None; lost.len()];
        };
        let wanted: std::collections::HashMap<u64, u32> = lost.iter().copied().collect();
        let mut oldest: std::collections::HashMap<u64, Instant> = Default::default();
        let acks = log.acks.lock().unwrap_or_else(|e| e.into_inner());
        for a in acks.iter() {
            if wanted
                .get(&a.keynum)
                .is_some_and(|&found| a.version > found)
            {
                oldest.entry(a.keynum).or_insert(a.at);
            }
        }
        lost.iter().map(|(k, _)| oldest.get(k).copied()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shared() -> Shared {
        Shared {
            table: VersionTable::new(100),
            addr: RwLock::new(String::new()),
            phase: tokio::sync::watch::Sender::new(Phase::Running),
            parked: Default::default(),
            timeline: Timeline::new(Instant::now(), Duration::from_secs(1)),
            acks: Some(AckLog {
                keep: Duration::from_secs(60),
                acks: Mutex::new(VecDeque::new()),
            }),
            acknowledged: Default::default(),
            audit_keys_max: 100,
            keeps_nothing: false,
            async_window: Some(Duration::from_millis(10)),
            value_bytes: 64,
            threads: 1,
            batch: 1,
            timeout: Duration::from_secs(1),
            seed: 1,
        }
    }

    /// A key loses version 14 at one kill (judged then) and version 15 at
    /// the next: the second loss is timed by 15's acknowledgement, not by
    /// 14's, which the first audit already judged. (Timing it by 14's
    /// once failed an async crash test with a loss "outside the window".)
    #[test]
    fn a_loss_already_judged_does_not_time_a_later_one() {
        let s = shared();
        s.note_ack(96, 14);
        let v14 = s.oldest_lost_acks(&[(96, 13)])[0].expect("remembered");
        s.forget_judged_acks(&[(96, 14, 13)]);
        std::thread::sleep(Duration::from_millis(5));
        s.note_ack(96, 15);
        let v15 = s.oldest_lost_acks(&[(96, 13)])[0].expect("remembered");
        assert!(v15 > v14, "timed by the newer acknowledgement");
        // Other keys keep theirs.
        s.note_ack(7, 3);
        s.forget_judged_acks(&[(96, 15, 13)]);
        assert!(s.oldest_lost_acks(&[(7, 2)])[0].is_some());
        assert!(s.oldest_lost_acks(&[(96, 13)])[0].is_none());
    }
}
