//! The mesh's park/wake handshake (`ringkv_engine::mesh::handshake`) under every
//! interleaving loom finds, on loom's atomics and fences: two shards that
//! send each other work and an outside sender that sends to one of them.
//! Each shard drains its links, and sleeps (on a bell that keeps a ring
//! made before the sleep, as an eventfd or a MSG_RING completion does)
//! only when the handshake lets it. A lost wake-up leaves a shard asleep
//! with work on its link: loom reports that as a deadlock, and the test
//! fails.
//!
//! The same scenario with the look after publishing "parked" taken out
//! must fail (in a process of its own: loom aborts on a deadlock): that
//! proves the model can see a lost wake-up at all.

use loom::sync::atomic::{fence, AtomicBool, AtomicUsize, Ordering};
use loom::sync::{Arc, Condvar, Mutex};
use ringkv_engine::mesh::handshake::{self, Flag};

/// The production flag's orderings, on loom's atomics.
struct Parked(AtomicBool);

impl Flag for Parked {
    fn store(&self, value: bool) {
        self.0.store(value, Ordering::Relaxed)
    }
    fn load(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
    fn swap(&self, value: bool) -> bool {
        self.0.swap(value, Ordering::AcqRel)
    }
}

fn full_fence() {
    fence(Ordering::SeqCst)
}

/// A wake-up that is kept until the sleeper takes it.
struct Bell {
    rung: Mutex<bool>,
    cv: Condvar,
}

impl Bell {
    fn ring(&self) {
        *self.rung.lock().unwrap() = true;
        self.cv.notify_one();
    }

    fn sleep(&self) {
        let mut rung = self.rung.lock().unwrap();
        while !*rung {
            rung = self.cv.wait(rung).unwrap();
        }
        *rung = false;
    }
}

/// Shard `i`'s door and its incoming links (one per sender: 0, 1 and the
/// outside sender 2), each a count of items not yet taken.
struct Shard {
    parked: Parked,
    bell: Bell,
    links: [AtomicUsize; 3],
}

struct World {
    shards: [Shard; 2],
}

impl World {
    fn new() -> Arc<World> {
        let shard = || Shard {
            parked: Parked(AtomicBool::new(false)),
            bell: Bell {
                rung: Mutex::new(false),
                cv: Condvar::new(),
            },
            links: [
                AtomicUsize::new(0),
                AtomicUsize::new(0),
                AtomicUsize::new(0),
            ],
        };
        Arc::new(World {
            shards: [shard(), shard()],
        })
    }

    /// `from` puts one item on its link to `to`, then wakes `to` if the
    /// handshake says so.
    fn send(&self, from: usize, to: usize) {
        let shard = &self.shards[to];
        shard.links[from].fetch_add(1, Ordering::Release);
        if handshake::must_wake(&shard.parked, full_fence) {
            shard.bell.ring();
        }
    }

    fn has_work(&self, me: usize) -> bool {
        self.shards[me]
            .links
            .iter()
            .any(|l| l.load(Ordering::Acquire) > 0)
    }

    fn drain(&self, me: usize) -> usize {
        self.shards[me]
            .links
            .iter()
            .map(|l| l.swap(0, Ordering::Acquire))
            .sum()
    }

    /// A shard's loop: receive `expect` items, sleeping when the
    /// handshake (`may_sleep`) lets it.
    fn serve(&self, me: usize, expect: usize, may_sleep: fn(&World, usize) -> bool) {
        let mut got = 0;
        loop {
            got += self.drain(me);
            if got >= expect {
                return;
            }
            if may_sleep(self, me) {
                self.shards[me].bell.sleep();
                handshake::woke(&self.shards[me].parked);
            }
        }
    }
}

/// The production handshake.
fn handshake_sleep(w: &World, me: usize) -> bool {
    handshake::may_sleep(&w.shards[me].parked, full_fence, || w.has_work(me))
}

/// The handshake without its second look: publish "parked" and sleep.
fn no_recheck_sleep(w: &World, me: usize) -> bool {
    w.shards[me].parked.store(true);
    full_fence();
    true
}

/// Shard 0 sends to shard 1 and shard 1 to shard 0, each while the other
/// may be going to sleep; the outside sender sends to shard 1 too.
fn scenario(may_sleep: fn(&World, usize) -> bool) {
    let w = World::new();
    let w0 = w.clone();
    let t0 = loom::thread::spawn(move || {
        w0.send(0, 1);
        w0.serve(0, 1, may_sleep);
    });
    let w1 = w.clone();
    let t1 = loom::thread::spawn(move || {
        w1.send(1, 0);
        w1.serve(1, 2, may_sleep);
    });
    // The outside caller.
    w.send(2, 1);
    t0.join().unwrap();
    t1.join().unwrap();
}

fn model(f: fn()) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(3);
    builder.check(f);
}

#[test]
fn no_wake_up_is_lost_between_two_shards_and_an_outside_caller() {
    model(|| scenario(handshake_sleep));
}

/// The broken handshake's model, run by the test below in a process of its
/// own (a deadlock loom finds aborts the process it runs in).
#[test]
#[ignore = "run by without_the_look_after_parking_a_wake_up_is_lost, which expects it to fail"]
fn model_of_the_handshake_without_its_second_look() {
    model(|| scenario(no_recheck_sleep));
}

#[test]
fn without_the_look_after_parking_a_wake_up_is_lost() {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "model_of_the_handshake_without_its_second_look",
            "--test-threads=1",
        ])
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        !out.status.success(),
        "the model found no lost wake-up in a handshake that loses them, so it proves nothing:\n{stdout}\n{stderr}"
    );
    assert!(
        stderr.contains("deadlock") || stdout.contains("deadlock"),
        "the broken handshake failed, but not with a lost wake-up (a deadlock):\n{stdout}\n{stderr}"
    );
}
