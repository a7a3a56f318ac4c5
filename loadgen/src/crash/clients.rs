//! The client tasks of a crash run: what each batch sends (put/get, sweep
//! order, YCSB A, bank transfers), how its answers update the version
//! table, and the reconnect loop around a server that gets killed.
//!
//! What must hold: client `c` is the only writer of the keys `k` with
//! `k % threads == c` (put/get, sweep, YCSB A), and sends one batch at a
//! time, so a key's versions reach the server in order; a batch never
//! carries two puts of one key. Bank transfers write any account, under
//! the server's locks, with the version read plus one. A version is noted
//! as written before it is sent and acknowledged only on a `Done` answer.

use super::audit::{self, Versioned};
use super::Shared;
use crate::driver::{OpTally, Tallies};
use crate::keys::{key_name, Rng, ScrambledZipfian};
use crate::ringkv::RingkvTarget;
use crate::target::{Op, Reply, Session, Target};
use bytes::Bytes;
use std::collections::HashSet;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The balance every bank account starts with.
pub const INITIAL_BALANCE: i64 = 1_000;

/// What the clients send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mix {
    /// A batch of puts, then a batch of gets, keys uniform.
    PutGet,
    /// Puts in key order over the client's keys, then gets in the same order.
    Sweep,
    /// 50% read, 50% update, zipfian (YCSB A).
    YcsbA,
    /// Transfers between two accounts (PutGetTx with the bank invariant).
    Bank,
}

/// Where the run is: clients send only while it is `Running`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Running,
    Paused,
    Done,
}

/// One op of a batch as the client remembers it.
#[derive(Debug, Clone, Copy)]
enum Sent {
    Put { keynum: u64, version: u32 },
    Get { keynum: u64 },
}

/// A client's own key picker.
struct Picker {
    client: u64,
    threads: u64,
    /// Keys this client owns.
    owned: u64,
    cursor: u64,
    zipf: Option<ScrambledZipfian>,
}

impl Picker {
    fn new(client: usize, threads: usize, records: u64, mix: Mix) -> Picker {
        let (c, t) = (client as u64, threads as u64);
        let owned = records.saturating_sub(c).div_ceil(t).max(1);
        Picker {
            client: c,
            threads: t,
            owned,
            cursor: 0,
            zipf: (mix == Mix::YcsbA).then(|| ScrambledZipfian::new(0, owned)),
        }
    }

    fn keynum(&self, index: u64) -> u64 {
        index * self.threads + self.client
    }

    fn uniform(&self, rng: &mut Rng) -> u64 {
        self.keynum(rng.below(self.owned))
    }

    fn zipfian(&mut self, rng: &mut Rng) -> u64 {
        let index = self.zipf.as_mut().expect("YCSB A has a zipfian").next(rng);
        self.keynum(index)
    }

    fn sequential(&mut self) -> u64 {
        let k = self.keynum(self.cursor % self.owned);
        self.cursor += 1;
        k
    }
}

/// Redraws before [`another_key`] walks the client's keys in order.
const REDRAWS: usize = 16;

/// A key of this client not yet put in the batch, for a put whose key was
/// (a key is written at most once per batch): drawn again the same way
/// (uniform, or zipfian for YCSB A) up to [`REDRAWS`] times, else the next
/// free key after `keynum` in the client's order. None when every key of
/// the client is already put in the batch.
fn another_key(
    mix: Mix,
    keynum: u64,
    picker: &mut Picker,
    rng: &mut Rng,
    taken: &HashSet<u64>,
) -> Option<u64> {
    for _ in 0..REDRAWS {
        let k = match mix {
            Mix::YcsbA => picker.zipfian(rng),
            _ => picker.uniform(rng),
        };
        if !taken.contains(&k) {
            return Some(k);
        }
    }
    let index = keynum / picker.threads;
    (1..picker.owned)
        .map(|i| picker.keynum((index + i) % picker.owned))
        .find(|k| !taken.contains(k))
}

/// The next batch of a put/get, sweep or YCSB A client. A key is put at
/// most once per batch: a put that draws a key already put in the batch
/// goes to another key ([`another_key`]; sweep: turns into a get, which
/// happens only when the client has fewer keys than the batch), so the mix
/// keeps its share of writes.
fn next_batch(mix: Mix, step: u64, picker: &mut Picker, rng: &mut Rng, batch: usize) -> Vec<Sent> {
    let mut out: Vec<Sent> = Vec::with_capacity(batch);
    let mut taken: HashSet<u64> = HashSet::new();
    let puts = match mix {
        Mix::PutGet => step.is_multiple_of(2),
        Mix::Sweep => (picker.cursor / picker.owned).is_multiple_of(2),
        Mix::YcsbA | Mix::Bank => false,
    };
    for _ in 0..batch {
        let (mut keynum, put) = match mix {
            Mix::PutGet => (picker.uniform(rng), puts),
            Mix::Sweep => (picker.sequential(), puts),
            Mix::YcsbA | Mix::Bank => (picker.zipfian(rng), rng.below(2) == 0),
        };
        if put && taken.contains(&keynum) && mix != Mix::Sweep {
            keynum = another_key(mix, keynum, picker, rng, &taken).unwrap_or(keynum);
        }
        out.push(if put && taken.insert(keynum) {
            Sent::Put { keynum, version: 0 }
        } else {
            Sent::Get { keynum }
        });
    }
    out
}

fn key(keynum: u64) -> Bytes {
    Bytes::from(key_name(keynum))
}

/// Claims versions for the puts and builds the request.
fn ops_of(shared: &Shared, sent: &mut [Sent]) -> Vec<Op> {
    sent.iter_mut()
        .map(|s| match s {
            Sent::Put { keynum, version } => {
                *version = shared.table.next_version(*keynum);
                let v = Versioned {
                    keynum: *keynum,
                    version: *version,
                    balance: 0,
                };
                Op::Put {
                    key: key(*keynum),
                    value: audit::encode(v, shared.value_bytes),
                }
            }
            Sent::Get { keynum } => Op::Get { key: key(*keynum) },
        })
        .collect()
}

/// Applies the answers in request order: acknowledgements, read checks.
fn account(shared: &Shared, sent: &[Sent], replies: &[Reply], tallies: &mut Tallies) {
    for (s, r) in sent.iter().zip(replies) {
        match (s, r) {
            (Sent::Put { keynum, version }, Reply::Done) => {
                shared.table.acknowledge(*keynum, *version);
                shared.note_ack(*keynum, *version);
                tallies.entry("put").or_default().ops += 1;
            }
            (Sent::Put { .. }, other) => failed(tallies.entry("put").or_default(), other),
            (Sent::Get { keynum }, Reply::Value(v)) => {
                read_checked(shared, *keynum, Some(v), tallies)
            }
            (Sent::Get { keynum }, Reply::NotFound) => read_checked(shared, *keynum, None, tallies),
            (Sent::Get { .. }, other) => failed(tallies.entry("get").or_default(), other),
        }
    }
}

fn read_checked(shared: &Shared, keynum: u64, got: Option<&Bytes>, tallies: &mut Tallies) {
    let t = tallies.entry("get").or_default();
    t.ops += 1;
    let (finding, _) = audit::check(&shared.table, keynum, got.map(|b| b.as_ref()));
    match finding {
        audit::Finding::Ok => {}
        audit::Finding::Lost { found: 0, .. } => t.not_found += 1,
        other => {
            t.wrong_value += 1;
            if t.first_failure.is_none() {
                t.first_failure = Some(format!("read of key {keynum}: {other:?}"));
            }
        }
    }
}

fn failed(t: &mut OpTally, reply: &Reply) {
    t.failed += 1;
    if t.first_failure.is_none() {
        t.first_failure = Some(format!("{reply:?}"));
    }
}

/// Counts a finished batch in the tallies' step counts and the timeline.
fn measured(
    shared: &Shared,
    tallies: &mut Tallies,
    kinds: &[&'static str],
    ops: u64,
    began: Instant,
) {
    let now = Instant::now();
    let latency = now - began;
    for &kind in kinds {
        let t = tallies.entry(kind).or_default();
        t.steps += 1;
        t.hist.record(latency);
    }
    shared.timeline.record(now, ops, latency);
}

/// Waits while paused; false once the run is done.
async fn wait_running(shared: &Shared, rx: &mut tokio::sync::watch::Receiver<Phase>) -> bool {
    loop {
        let phase = *rx.borrow_and_update();
        match phase {
            Phase::Running => return true,
            Phase::Done => return false,
            Phase::Paused => {
                shared.parked.fetch_add(1, SeqCst);
                let changed = rx.changed().await;
                shared.parked.fetch_sub(1, SeqCst);
                if changed.is_err() {
                    return false;
                }
            }
        }
    }
}

/// One client task: connect, send until the connection breaks, reconnect
/// once the server is back; returns its tallies when the run is done.
pub async fn client(shared: Arc<Shared>, index: usize, mix: Mix) -> Tallies {
    let mut rx = shared.phase.subscribe();
    let mut rng = Rng::new(shared.seed, 0xC4A5 + index as u64);
    let mut picker = Picker::new(index, shared.threads, shared.table.keys(), mix);
    let mut tallies = Tallies::new();
    let mut step = 0u64;
    while wait_running(&shared, &mut rx).await {
        let target = RingkvTarget::new(shared.addr(), shared.timeout);
        let Ok(mut session) = target.connect().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        while *rx.borrow() == Phase::Running {
            let ok = match mix {
                Mix::Bank => transfer(&shared, &mut session, &mut rng, &mut tallies).await,
                _ => {
                    step += 1;
                    let mut sent = next_batch(mix, step, &mut picker, &mut rng, shared.batch);
                    one_batch(&shared, &mut session, &mut sent, &mut tallies).await
                }
            };
            if !ok {
                break;
            }
        }
    }
    tallies
}

/// Sends one batch; false when the connection broke.
async fn one_batch<S: Session>(
    shared: &Shared,
    session: &mut S,
    sent: &mut [Sent],
    tallies: &mut Tallies,
) -> bool {
    let ops = ops_of(shared, sent);
    let began = Instant::now();
    let Ok(replies) = session.batch(ops).await else {
        return false;
    };
    account(shared, sent, &replies, tallies);
    let puts = sent.iter().any(|s| matches!(s, Sent::Put { .. }));
    let gets = sent.iter().any(|s| matches!(s, Sent::Get { .. }));
    let kinds: Vec<&'static str> = [(puts, "put"), (gets, "get")]
        .iter()
        .filter_map(|(on, k)| on.then_some(*k))
        .collect();
    measured(shared, tallies, &kinds, sent.len() as u64, began);
    true
}

/// Reads a locked account's value; `None` if it is missing or malformed.
fn account_value(keynum: u64, reply: &Reply) -> Option<Versioned> {
    match reply {
        Reply::Value(v) => audit::decode(v).ok().filter(|a| a.keynum == keynum),
        _ => None,
    }
}

/// One bank transfer (begin, lock both, write both, commit); false when
/// the connection broke.
async fn transfer<S: Session>(
    shared: &Shared,
    session: &mut S,
    rng: &mut Rng,
    tallies: &mut Tallies,
) -> bool {
    let accounts = shared.table.keys();
    let a = rng.below(accounts);
    let b = (a + 1 + rng.below(accounts - 1)) % accounts;
    let (a, b) = (a.min(b), a.max(b));
    let began = Instant::now();
    let lock = vec![
        Op::Begin,
        Op::GetForUpdate { key: key(a) },
        Op::GetForUpdate { key: key(b) },
    ];
    let Ok(got) = session.batch(lock).await else {
        return false;
    };
    let (Some(va), Some(vb)) = (account_value(a, &got[1]), account_value(b, &got[2])) else {
        return abort(session, tallies, &got).await;
    };
    let amount = 1 + rng.below(100) as i64;
    let new_a = Versioned {
        version: va.version + 1,
        balance: va.balance - amount,
        ..va
    };
    let new_b = Versioned {
        version: vb.version + 1,
        balance: vb.balance + amount,
        ..vb
    };
    shared.table.note_written(a, new_a.version);
    shared.table.note_written(b, new_b.version);
    let write = vec![
        Op::Put {
            key: key(a),
            value: audit::encode(new_a, shared.value_bytes),
        },
        Op::Put {
            key: key(b),
            value: audit::encode(new_b, shared.value_bytes),
        },
        Op::Commit,
    ];
    let Ok(done) = session.batch(write).await else {
        return false;
    };
    if done.iter().all(|r| *r == Reply::Done) {
        for v in [new_a, new_b] {
            shared.table.acknowledge(v.keynum, v.version);
            shared.note_ack(v.keynum, v.version);
        }
        tallies.entry("tx").or_default().ops += 1;
        measured(shared, tallies, &["tx"], 1, began);
    } else {
        return abort(session, tallies, &done).await;
    }
    true
}

/// Counts an aborted or refused transfer and rolls it back.
async fn abort<S: Session>(session: &mut S, tallies: &mut Tallies, replies: &[Reply]) -> bool {
    let aborted = replies.iter().any(|r| matches!(r, Reply::Aborted(_)));
    let t = tallies
        .entry(if aborted { "abort" } else { "tx" })
        .or_default();
    if aborted {
        t.ops += 1;
    } else {
        failed(
            t,
            replies
                .iter()
                .find(|r| !matches!(r, Reply::Done))
                .unwrap_or(&Reply::Done),
        );
    }
    session.batch(vec![Op::Rollback]).await.is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_client_picks_only_its_own_keys() {
        let mut rng = Rng::new(1, 1);
        for mix in [Mix::PutGet, Mix::Sweep, Mix::YcsbA] {
            for client in 0..3 {
                let mut p = Picker::new(client, 3, 100, mix);
                for step in 0..20 {
                    for s in next_batch(mix, step, &mut p, &mut rng, 50) {
                        let k = match s {
                            Sent::Put { keynum, .. } | Sent::Get { keynum } => keynum,
                        };
                        assert_eq!(k % 3, client as u64, "{mix:?}");
                        assert!(k < 100, "{mix:?} key {k}");
                    }
                }
            }
        }
    }

    /// The share of puts in `batches` batches of `batch` ops.
    fn put_share(mix: Mix, owned: u64, batch: usize, batches: u64) -> f64 {
        let mut rng = Rng::new(3, 3);
        let mut p = Picker::new(0, 1, owned, mix);
        let (mut puts, mut all) = (0usize, 0usize);
        for step in 0..batches {
            let b = next_batch(mix, step, &mut p, &mut rng, batch);
            puts += b.iter().filter(|s| matches!(s, Sent::Put { .. })).count();
            all += b.len();
        }
        puts as f64 / all as f64
    }

    #[test]
    fn ycsb_a_keeps_half_updates_when_a_key_repeats_in_a_batch() {
        // A hot zipfian key comes up several times per batch: its second
        // update goes to another key, it does not turn into a read.
        let share = put_share(Mix::YcsbA, 500, 100, 400);
        assert!((share - 0.5).abs() < 0.01, "updates {:.1}%", share * 100.0);
        // Put/get: a put batch is all puts, even when a key repeats.
        let share = put_share(Mix::PutGet, 200, 100, 400);
        assert!((share - 0.5).abs() < 1e-9, "puts {:.1}%", share * 100.0);
    }

    #[test]
    fn a_batch_never_puts_one_key_twice() {
        let mut rng = Rng::new(2, 2);
        let mut p = Picker::new(0, 1, 5, Mix::YcsbA);
        for step in 0..50 {
            let b = next_batch(Mix::YcsbA, step, &mut p, &mut rng, 20);
            let mut puts: Vec<u64> = b
                .iter()
                .filter_map(|s| match s {
                    Sent::Put { keynum, .. } => Some(*keynum),
                    Sent::Get { .. } => None,
                })
                .collect();
            let n = puts.len();
            puts.dedup();
            puts.sort_unstable();
            puts.dedup();
            assert_eq!(puts.len(), n);
        }
    }
}
