//! The mesh: how shards hand each other sub-batches and their answers.
//!
//! Each ordered pair of shards has one bounded queue (a *link*). Whatever a
//! shard sends another during one turn of its loop (sub-batches its
//! callers addressed to the other shard, answers to sub-batches the other
//! shard sent it) collects in an outbox and goes on the link as one item at
//! the end of the turn. Each turn, before it looks for I/O, a shard drains
//! its incoming links: sub-batches go to its serve task, answers go to the
//! task waiting for them (a wake-up on the shard's own thread).
//!
//! A shard is woken by another only when it is *parked*: before its loop
//! blocks in the kernel it publishes "parked", then looks at its links once
//! more (see [`handshake`]). A sender that finds the flag set after putting
//! a batch on the link takes it (only one sender wakes a given sleep) and
//! rings the shard's bell: an `IORING_OP_MSG_RING` submitted on the
//! sender's own ring, which posts a completion on the parked shard's ring
//! (no system call of its own: it goes with the sender's next submit), or,
//! where the kernel has no MSG_RING or the shard runs the fallback backend,
//! the runtime's own wake-up (an eventfd write). A busy shard is never
//! woken: it finds the batch on its next turn.
//!
//! Callers that are not shard threads (a test, an embedding program, the
//! native protocol's blocking paths) still use the shard's inbox channel;
//! this module is shard-to-shard only.
//!
//! What must hold: no batch on a link is left unseen by a shard that
//! sleeps (the handshake); answers keep the order in which each shard
//! produced them; a shard has at most `in_flight_max` sub-batches
//! unanswered at any peer (a sender over it waits on its own thread: that
//! is the mesh's back-pressure); a shard that has stopped gets nothing
//! more, and what was queued for it is dropped, which its callers see as
//! `ShuttingDown`.

use crate::api::{Op, OpError, OpResult};
use crate::metrics::ShardStats;
use crate::notify::Notify;
use crossbeam_queue::ArrayQueue;
use futures::channel::oneshot;
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

/// Items (turns' worth of envelopes) a link holds. A sender whose link is
/// full keeps its outbox for a later turn.
const LINK_ITEMS: usize = 256;

/// How long a shard with envelopes it could not place waits for the peer
/// to make room before trying again (instead of sleeping).
const RETRY_FULL_LINK: Duration = Duration::from_micros(50);

/// The other end of a sub-batch: where its answers go.
pub(crate) type ReplyTx = oneshot::Sender<Vec<OpResult>>;

/// Where a shard sends the answers to a sub-batch.
pub(crate) enum Reply {
    /// Straight to the waiting caller: one on this shard's own thread, or
    /// one outside every shard (its runtime is woken by the channel).
    Direct(ReplyTx),
    /// Back through the mesh to shard `to`, whose task waits for it.
    Shard { to: usize, tx: ReplyTx },
}

impl Reply {
    /// Sends the answers; a caller that stopped waiting is no error.
    pub(crate) fn send(self, results: Vec<OpResult>) {
        match self {
            Reply::Direct(tx) => {
                let _ = tx.send(results);
            }
            Reply::Shard { to, tx } => match current_port() {
                Some(port) => port.post(to, Envelope::Answer { results, tx }),
                // Not on a shard thread of a mesh (cannot happen for an
                // answer made by a shard): the channel still delivers it.
                None => {
                    let _ = tx.send(results);
                }
            },
        }
    }
}

/// The sending half of an answer channel that, sent on another shard's
/// thread, goes back through the mesh to the shard `to` (which hands the
/// value to its waiting task), instead of waking that task's thread from
/// afar. Used by transaction messages.
pub(crate) struct Back<T> {
    tx: oneshot::Sender<T>,
    to: Option<usize>,
}

impl<T: Send + 'static> Back<T> {
    /// An answer channel back to the shard this thread runs, if it runs one
    /// of `engine_id`'s (a plain channel otherwise).
    pub(crate) fn new(engine_id: u64, tx: oneshot::Sender<T>) -> Back<T> {
        Back {
            tx,
            to: port_of(engine_id).map(|p| p.me),
        }
    }

    /// Whether the receiver is gone (nobody waits for the value).
    pub(crate) fn is_canceled(&self) -> bool {
        self.tx.is_canceled()
    }

    /// Sends the value. `Err` gives it back when the receiver is known to
    /// be gone (on the mesh, a dropped receiver is not seen here).
    pub(crate) fn send(self, value: T) -> Result<(), T> {
        match (self.to, current_port()) {
            (Some(to), Some(port)) if to != port.me => {
                let tx = self.tx;
                port.post(
                    to,
                    Envelope::Deliver(Box::new(move || {
                        let _ = tx.send(value);
                    })),
                );
                Ok(())
            }
            _ => self.tx.send(value),
        }
    }
}

/// Work a shard runs for another, in order with its sub-batches.
pub(crate) type Job = Box<dyn FnOnce() + Send>;

/// What a shard's serve task takes from the mesh, in arrival order.
pub(crate) enum Incoming {
    /// A sub-batch and where its answers go.
    Batch(Vec<Op>, Reply),
    /// A transaction message (a closure that hands it to the shard).
    Job(Job),
}

/// What travels on a link.
enum Envelope {
    /// A sub-batch; its answers go back to the sending shard.
    Request { ops: Vec<Op>, tx: ReplyTx },
    /// Answers to a sub-batch the receiving shard sent.
    Answer { results: Vec<OpResult>, tx: ReplyTx },
    /// Work for the receiving shard's serve task.
    Job(Job),
    /// A value for a task of the receiving shard (run when drained).
    Deliver(Job),
}

/// How a parked shard is woken.
struct Bell {
    /// The shard's io_uring descriptor, for MSG_RING. Not a duplicate: a
    /// ring must close when its runtime drops it (the kernel then cancels
    /// what is in flight before the runtime frees the buffers). Senders
    /// ring only a shard whose door is not closed; one that rings in the
    /// instant its peer closes reaches a closed descriptor (the entry
    /// fails) or, if the number was reused, another file: a ring then sees
    /// one completion it ignores, anything else refuses the entry.
    ring: Option<RawFd>,
    /// The runtime's own wake-up (an eventfd write when it sleeps).
    waker: Waker,
}

/// One shard's side of the park/wake handshake.
struct Door {
    /// Set by the shard just before it sleeps; taken by the one sender
    /// that wakes it.
    parked: AtomicBool,
    /// Set when the shard's thread ends: nothing more is sent to it.
    closed: AtomicBool,
    bell: OnceLock<Bell>,
}

/// The links and doors of every shard of one engine.
pub(crate) struct Mesh {
    engine_id: u64,
    shards: usize,
    /// `links[to * shards + from]`.
    links: Box<[ArrayQueue<Vec<Envelope>>]>,
    doors: Box<[Door]>,
    /// Most sub-batches one shard may have unanswered at one peer.
    in_flight_max: usize,
}

impl Mesh {
    pub(crate) fn new(engine_id: u64, shards: usize, in_flight_max: usize) -> Arc<Mesh> {
        Arc::new(Mesh {
            engine_id,
            shards,
            links: (0..shards * shards)
                .map(|_| ArrayQueue::new(LINK_ITEMS))
                .collect(),
            doors: (0..shards)
                .map(|_| Door {
                    parked: AtomicBool::new(false),
                    closed: AtomicBool::new(false),
                    bell: OnceLock::new(),
                })
                .collect(),
            in_flight_max: in_flight_max.max(1),
        })
    }

    /// How many shards the mesh joins.
    pub(crate) fn shards(&self) -> usize {
        self.shards
    }

    fn link(&self, to: usize, from: usize) -> &ArrayQueue<Vec<Envelope>> {
        &self.links[to * self.shards + from]
    }

    fn has_incoming(&self, me: usize) -> bool {
        (0..self.shards).any(|from| from != me && !self.link(me, from).is_empty())
    }
}

/// The park/wake handshake, over the atomics it needs: the shard side
/// ([`may_sleep`]) and the sender side ([`must_wake`]). Generic so that the
/// model test (`engine/tests/mesh_model.rs`) runs this very code on loom's
/// atomics under every interleaving.
pub mod handshake {
    use std::sync::atomic::Ordering::{AcqRel, Relaxed, SeqCst};

    /// The "parked" flag.
    pub trait Flag {
        fn store(&self, value: bool);
        fn load(&self) -> bool;
        fn swap(&self, value: bool) -> bool;
    }

    impl Flag for std::sync::atomic::AtomicBool {
        fn store(&self, value: bool) {
            std::sync::atomic::AtomicBool::store(self, value, Relaxed)
        }
        fn load(&self) -> bool {
            std::sync::atomic::AtomicBool::load(self, Relaxed)
        }
        fn swap(&self, value: bool) -> bool {
            std::sync::atomic::AtomicBool::swap(self, value, AcqRel)
        }
    }

    /// The shard, about to sleep: publishes "parked", then looks at its
    /// links again (`has_work`). Returns whether it may sleep; when it may
    /// not, the flag is taken back. A sender that put work on a link before
    /// the look is seen by it; one that put work after it sees the flag
    /// (both sides order their store before their load with a full fence).
    pub fn may_sleep<F: Flag>(parked: &F, fence: impl Fn(), has_work: impl Fn() -> bool) -> bool {
        parked.store(true);
        fence();
        if has_work() {
            parked.store(false);
            return false;
        }
        true
    }

    /// The sender, after putting work on a link: whether it must wake the
    /// shard. At most one sender takes a given sleep's flag.
    pub fn must_wake<F: Flag>(parked: &F, fence: impl Fn()) -> bool {
        fence();
        parked.load() && parked.swap(false)
    }

    /// The shard, after waking for any reason: not parked any more.
    pub fn woke<F: Flag>(parked: &F) {
        parked.store(false);
    }

    /// The full fence both sides use.
    pub fn full_fence() {
        std::sync::atomic::fence(SeqCst);
    }
}

thread_local! {
    static PORT: RefCell<Option<Rc<Port>>> = const { RefCell::new(None) };
}

fn current_port() -> Option<Rc<Port>> {
    PORT.with(|p| p.borrow().clone())
}

/// The port of `engine_id`'s shard this thread runs, if any.
pub(crate) fn port_of(engine_id: u64) -> Option<Rc<Port>> {
    PORT.with(|p| {
        p.borrow()
            .as_ref()
            .filter(|p| p.mesh.engine_id == engine_id)
            .cloned()
    })
}

/// Whether this kernel runs IORING_OP_MSG_RING (asked once per process).
fn msg_ring_supported() -> bool {
    static SUPPORTED: OnceLock<bool> = OnceLock::new();
    *SUPPORTED.get_or_init(|| {
        if std::env::var("RINGKV_WAKE").as_deref() == Ok("eventfd") {
            return false;
        }
        let Ok(ring) = io_uring::IoUring::new(2) else {
            return false;
        };
        let mut probe = io_uring::Probe::new();
        ring.submitter().register_probe(&mut probe).is_ok()
            && probe.is_supported(io_uring::opcode::MsgRingData::CODE)
    })
}

/// A shard thread's end of the mesh (lives in a thread-local while the
/// shard runs).
pub(crate) struct Port {
    mesh: Arc<Mesh>,
    me: usize,
    stats: Arc<ShardStats>,
    /// Envelopes for each peer, sent at the end of this turn.
    outbox: RefCell<Vec<Vec<Envelope>>>,
    /// Sub-batches and jobs from peers, in arrival order, for the serve
    /// task.
    requests: RefCell<VecDeque<Incoming>>,
    serve_waker: RefCell<Option<Waker>>,
    /// Sub-batches sent to each peer and not answered yet.
    in_flight: Box<[Cell<usize>]>,
    /// Fired when an answer comes back (room under `in_flight_max`).
    room: Notify,
    /// Bells rung with MSG_RING on this shard's ring, until they complete.
    bells: RefCell<Vec<Pin<Box<dyn Future<Output = ()>>>>>,
    /// This thread's runtime runs io_uring and the kernel has MSG_RING.
    rings: bool,
}

impl Port {
    /// Joins the mesh as shard `me` on the current thread, whose compio
    /// runtime is `runtime` (its ring, if it runs io_uring, is where peers
    /// post their wake-ups).
    pub(crate) fn install(
        mesh: Arc<Mesh>,
        me: usize,
        stats: Arc<ShardStats>,
        runtime: &compio::runtime::Runtime,
        uring: bool,
    ) -> Rc<Port> {
        let rings = uring && msg_ring_supported();
        let ring = rings.then(|| runtime.as_raw_fd());
        let _ = mesh.doors[me].bell.set(Bell {
            ring,
            waker: runtime.waker(),
        });
        let shards = mesh.shards;
        let port = Rc::new(Port {
            mesh,
            me,
            stats,
            outbox: RefCell::new((0..shards).map(|_| Vec::new()).collect()),
            requests: RefCell::new(VecDeque::new()),
            serve_waker: RefCell::new(None),
            in_flight: (0..shards).map(|_| Cell::new(0)).collect(),
            room: Notify::new(),
            bells: RefCell::new(Vec::new()),
            rings,
        });
        PORT.with(|p| *p.borrow_mut() = Some(port.clone()));
        port
    }

    /// Leaves the mesh as the shard's thread ends: closed to senders, and
    /// everything queued for it dropped (its callers see `ShuttingDown`).
    pub(crate) fn close(&self) {
        PORT.with(|p| p.borrow_mut().take());
        self.mesh.doors[self.me]
            .closed
            .store(true, Ordering::SeqCst);
        self.bells.borrow_mut().clear();
        self.discard();
    }

    /// Drops what is queued for this shard and what it had not sent.
    pub(crate) fn discard(&self) {
        for from in 0..self.mesh.shards {
            while self.mesh.link(self.me, from).pop().is_some() {}
        }
        self.requests.borrow_mut().clear();
        for out in self.outbox.borrow_mut().iter_mut() {
            out.clear();
        }
    }

    /// Sends a sub-batch to peer `to` (at the end of this turn) and
    /// returns where its answers arrive. Waits while this shard has
    /// `in_flight_max` sub-batches unanswered there.
    pub(crate) async fn request(
        &self,
        to: usize,
        ops: Vec<Op>,
    ) -> Result<oneshot::Receiver<Vec<OpResult>>, OpError> {
        debug_assert_ne!(to, self.me, "a shard runs its own part inline");
        while self.in_flight[to].get() >= self.mesh.in_flight_max {
            if self.mesh.doors[to].closed.load(Ordering::Acquire) {
                return Err(OpError::ShuttingDown);
            }
            self.room.notified().await;
        }
        if self.mesh.doors[to].closed.load(Ordering::Acquire) {
            return Err(OpError::ShuttingDown);
        }
        let (tx, rx) = oneshot::channel();
        let n = self.in_flight[to].get() + 1;
        self.in_flight[to].set(n);
        self.stats
            .cross_requests
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.stats
            .cross_in_flight_peak
            .fetch_max(n as u64, std::sync::atomic::Ordering::Relaxed);
        self.post(to, Envelope::Request { ops, tx });
        Ok(rx)
    }

    /// Sends `job` to peer `to`, to run there in order with the
    /// sub-batches this shard sent before it.
    pub(crate) fn call(&self, to: usize, job: Job) -> Result<(), OpError> {
        debug_assert_ne!(to, self.me, "a shard runs its own jobs inline");
        if self.mesh.doors[to].closed.load(Ordering::Acquire) {
            return Err(OpError::ShuttingDown);
        }
        self.stats
            .cross_requests
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.post(to, Envelope::Job(job));
        Ok(())
    }

    /// Queues `envelope` for peer `to`. It leaves at the end of the turn,
    /// with the rest of the turn's envelopes for `to`, unless it is the
    /// first and `to` sleeps: then it leaves now and wakes `to` at once, so
    /// that the peer works while this turn goes on (the wake-up is owed
    /// either way; only its moment changes).
    fn post(&self, to: usize, envelope: Envelope) {
        let mut outbox = self.outbox.borrow_mut();
        let out = &mut outbox[to];
        out.push(envelope);
        if out.len() > 1 || !self.mesh.doors[to].parked.load(Ordering::Relaxed) {
            return;
        }
        self.send_out(to, out, true);
    }

    /// Puts `out` on the link to `to` (or drops it if `to` has stopped:
    /// dropping the envelopes closes their answer channels) and wakes `to`
    /// if it is parked (`now`: see [`Port::ring`]). Returns whether the
    /// link was full (`out` keeps its envelopes for a later turn).
    fn send_out(&self, to: usize, out: &mut Vec<Envelope>, now: bool) -> bool {
        let door = &self.mesh.doors[to];
        if door.closed.load(Ordering::Acquire) {
            out.clear();
            return false;
        }
        let mut full = false;
        if let Err(batch) = self.mesh.link(to, self.me).push(std::mem::take(out)) {
            *out = batch;
            full = true;
        }
        if handshake::must_wake(&door.parked, handshake::full_fence) {
            self.ring(door, now);
        }
        full
    }

    /// The next sub-batch or job a peer sent, or `None` (and the serve task
    /// is woken when one comes).
    pub(crate) fn poll_request(&self, cx: &mut Context<'_>) -> Option<Incoming> {
        let next = self.requests.borrow_mut().pop_front();
        if next.is_none() {
            let mut w = self.serve_waker.borrow_mut();
            if !w.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                *w = Some(cx.waker().clone());
            }
        }
        next
    }

    /// Takes what peers sent: sub-batches to the serve task, answers to
    /// their waiting tasks. Returns whether anything came.
    fn drain(&self) -> bool {
        let mut any = false;
        let mut freed = false;
        for from in 0..self.mesh.shards {
            if from == self.me {
                continue;
            }
            let link = self.mesh.link(self.me, from);
            while let Some(batch) = link.pop() {
                any = true;
                for envelope in batch {
                    match envelope {
                        Envelope::Request { ops, tx } => self
                            .requests
                            .borrow_mut()
                            .push_back(Incoming::Batch(ops, Reply::Shard { to: from, tx })),
                        Envelope::Answer { results, tx } => {
                            let n = &self.in_flight[from];
                            n.set(n.get().saturating_sub(1));
                            freed = true;
                            let _ = tx.send(results);
                        }
                        Envelope::Job(job) => {
                            self.requests.borrow_mut().push_back(Incoming::Job(job))
                        }
                        Envelope::Deliver(deliver) => deliver(),
                    }
                }
            }
        }
        if !self.requests.borrow().is_empty() {
            if let Some(w) = self.serve_waker.borrow_mut().take() {
                w.wake();
            }
        }
        if freed {
            self.room.notify();
        }
        any
    }

    /// Puts each outbox on its link and wakes the peers found parked.
    /// Returns whether some envelopes could not be placed (a full link).
    fn flush(&self) -> bool {
        let mut left = false;
        let mut outbox = self.outbox.borrow_mut();
        for (to, out) in outbox.iter_mut().enumerate() {
            if out.is_empty() {
                continue;
            }
            left |= self.send_out(to, out, false);
        }
        left
    }

    /// Wakes a parked peer. With MSG_RING the entry goes to the kernel with
    /// this shard's next submission, or at once with `now` (one
    /// `io_uring_enter` of its own, for a wake-up in the middle of a turn).
    fn ring(&self, door: &Door, now: bool) {
        let Some(bell) = door.bell.get() else {
            return;
        };
        self.stats
            .wakeups
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        match (&bell.ring, self.rings) {
            (Some(fd), true) => {
                if door.closed.load(Ordering::Acquire) {
                    return;
                }
                let submit = compio::runtime::submit(RingBell { fd: *fd });
                let mut op: Pin<Box<dyn Future<Output = ()>>> = Box::pin(async move {
                    let _ = submit.await;
                });
                // The first poll puts the entry on this shard's ring. Kept
                // until it completes.
                let mut cx = Context::from_waker(Waker::noop());
                if op.as_mut().poll(&mut cx).is_pending() {
                    self.bells.borrow_mut().push(op);
                }
                if now {
                    // `flush` submits, and also takes the runtime's
                    // "notified" mark (a wake-up from another thread seen
                    // while this thread was awake). Taken here, that
                    // wake-up would be lost to the loop's next sleep (the
                    // loop's own future is woken only through it): give
                    // it back.
                    compio::runtime::Runtime::with_current(|rt| {
                        if rt.flush() {
                            rt.waker().wake_by_ref();
                        }
                    });
                }
            }
            _ => bell.waker.wake_by_ref(),
        }
    }

    /// Polls the bells in flight, dropping those that completed.
    fn reap_bells(&self) {
        let mut bells = self.bells.borrow_mut();
        if bells.is_empty() {
            return;
        }
        let mut cx = Context::from_waker(Waker::noop());
        bells.retain_mut(|b| b.as_mut().poll(&mut cx).is_pending());
    }

    /// Before sleeping with sub-batches of its own at peers: looks at the
    /// links for a while (`RINGKV_MESH_SPIN_US`), since their answers are
    /// usually a few microseconds away. Returns whether something came.
    fn spin(&self) -> bool {
        static SPIN: OnceLock<Duration> = OnceLock::new();
        let limit = *SPIN.get_or_init(|| {
            let us = std::env::var("RINGKV_MESH_SPIN_US")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0u64);
            Duration::from_micros(us)
        });
        if limit.is_zero() || self.in_flight.iter().all(|n| n.get() == 0) {
            return false;
        }
        let start = std::time::Instant::now();
        loop {
            for _ in 0..64 {
                if self.mesh.has_incoming(self.me) {
                    return true;
                }
                std::hint::spin_loop();
            }
            if start.elapsed() >= limit {
                return false;
            }
        }
    }

    /// One turn's exchange: answers and sub-batches in, the turn's
    /// envelopes out. Returns (something came in, something is left to
    /// send).
    fn turn(&self) -> (bool, bool) {
        self.reap_bells();
        let came = self.drain();
        let left = self.flush();
        (came, left)
    }
}

/// An `IORING_OP_MSG_RING` to another shard's ring: posts a completion
/// there (user data `u64::MAX`, which the runtime reads as nothing to do)
/// and so ends its wait.
struct RingBell {
    fd: RawFd,
}

// SAFETY: the entry names no buffer; the descriptor is kept open by the
// mesh while any shard can ring.
unsafe impl compio::driver::IourOpCode for RingBell {
    type Control = ();

    fn create_entry(&mut self, _: &mut ()) -> compio::driver::OpEntry {
        compio::driver::OpEntry::Submission(
            io_uring::opcode::MsgRingData::new(io_uring::types::Fd(self.fd), 0, u64::MAX, None)
                .build(),
        )
    }
}

// SAFETY: never submitted on the polling driver (a shard on it wakes its
// peers through their runtime's waker); completes at once if it were.
unsafe impl compio::driver::PollOpCode for RingBell {
    type Control = ();

    fn pre_submit(&mut self, _: &mut ()) -> std::io::Result<compio::driver::Decision> {
        Ok(compio::driver::Decision::Completed(0))
    }

    fn operate(&mut self, _: &mut ()) -> Poll<std::io::Result<usize>> {
        Poll::Ready(Ok(0))
    }
}

/// Runs `future` to completion on `runtime`, turning the mesh each loop
/// turn when `port` is set: compio's own `block_on`, with the mesh's
/// exchange between running the ready tasks and asking the kernel for
/// I/O, and the handshake before sleeping.
pub(crate) fn drive<F: Future>(
    runtime: &compio::runtime::Runtime,
    port: Option<&Port>,
    future: F,
) -> F::Output {
    let Some(port) = port else {
        return runtime.block_on(future);
    };
    runtime.enter(|| {
        let waker = runtime.waker();
        let mut cx = Context::from_waker(&waker);
        let mut future = std::pin::pin!(future);
        loop {
            if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
                runtime.run();
                port.turn();
                return out;
            }
            let mut busy = runtime.run();
            let (came, mut left) = port.turn();
            if came {
                // What came in runs now, and its answers leave in this turn.
                busy = runtime.run();
                left = port.flush();
            }
            if busy {
                runtime.poll_with(Some(Duration::ZERO));
            } else if left {
                runtime.poll_with(Some(RETRY_FULL_LINK));
            } else if port.spin() {
                // An answer or a sub-batch came while spinning.
            } else {
                let door = &port.mesh.doors[port.me];
                let me = port.me;
                if handshake::may_sleep(&door.parked, handshake::full_fence, || {
                    port.mesh.has_incoming(me)
                }) {
                    runtime.poll();
                    handshake::woke(&door.parked);
                } else {
                    runtime.poll_with(Some(Duration::ZERO));
                }
            }
        }
    })
}
