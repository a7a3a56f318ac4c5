//! The bounded, single-thread queue between a connection's reader task and
//! its executor task: frames read but not yet answered.
//!
//! What must hold: at most `frames_max` items and at most `bytes_max` bytes
//! are in flight (pushed and not yet [`Pipe::complete`]d) — except that one
//! item is always admitted when nothing is in flight, so a single frame of up
//! to the frame limit can always pass. Both tasks live on the same shard
//! thread, so plain `Rc<RefCell>` state and one waker per side suffice.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::poll_fn;
use std::rc::Rc;
use std::task::{Poll, Waker};

struct Inner<T> {
    queue: VecDeque<(T, usize)>,
    frames_in_flight: usize,
    bytes_in_flight: usize,
    frames_max: usize,
    bytes_max: usize,
    sender_closed: bool,
    receiver_closed: bool,
    push_waker: Option<Waker>,
    pop_waker: Option<Waker>,
}

impl<T> Inner<T> {
    fn has_room_for(&self, bytes: usize) -> bool {
        self.frames_in_flight == 0
            || (self.frames_in_flight < self.frames_max
                && self.bytes_in_flight.saturating_add(bytes) <= self.bytes_max)
    }

    fn wake_pusher(&mut self) {
        if let Some(w) = self.push_waker.take() {
            w.wake();
        }
    }

    fn wake_popper(&mut self) {
        if let Some(w) = self.pop_waker.take() {
            w.wake();
        }
    }
}

/// One end-agnostic handle; the reader pushes, the executor pops and completes.
pub struct Pipe<T> {
    inner: Rc<RefCell<Inner<T>>>,
}

impl<T> Clone for Pipe<T> {
    fn clone(&self) -> Self {
        Pipe {
            inner: Rc::clone(&self.inner),
        }
    }
}

impl<T> std::fmt::Debug for Pipe<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let i = self.inner.borrow();
        f.debug_struct("Pipe")
            .field("queued", &i.queue.len())
            .field("frames_in_flight", &i.frames_in_flight)
            .field("bytes_in_flight", &i.bytes_in_flight)
            .finish()
    }
}

/// The other side has gone; the item was not queued.
#[derive(Debug, PartialEq, Eq)]
pub struct Closed;

impl<T> Pipe<T> {
    pub fn new(frames_max: usize, bytes_max: usize) -> Pipe<T> {
        assert!(frames_max >= 1, "a pipe must admit at least one frame");
        Pipe {
            inner: Rc::new(RefCell::new(Inner {
                queue: VecDeque::new(),
                frames_in_flight: 0,
                bytes_in_flight: 0,
                frames_max,
                bytes_max,
                sender_closed: false,
                receiver_closed: false,
                push_waker: None,
                pop_waker: None,
            })),
        }
    }

    /// Queues `item`, which accounts for `bytes`, waiting while the pipe is
    /// full. Fails once the receiver has closed.
    pub async fn push(&self, item: T, bytes: usize) -> Result<(), Closed> {
        poll_fn(|cx| {
            let mut i = self.inner.borrow_mut();
            if i.receiver_closed {
                return Poll::Ready(Err(Closed));
            }
            if i.has_room_for(bytes) {
                return Poll::Ready(Ok(()));
            }
            i.push_waker = Some(cx.waker().clone());
            Poll::Pending
        })
        .await?;
        let mut i = self.inner.borrow_mut();
        i.frames_in_flight += 1;
        i.bytes_in_flight += bytes;
        i.queue.push_back((item, bytes));
        i.wake_popper();
        Ok(())
    }

    /// The next item and its byte count, or `None` once the sender closed
    /// and the queue is empty. The item stays in flight until `complete`.
    pub async fn pop(&self) -> Option<(T, usize)> {
        poll_fn(|cx| {
            let mut i = self.inner.borrow_mut();
            if let Some(entry) = i.queue.pop_front() {
                return Poll::Ready(Some(entry));
            }
            if i.sender_closed {
                return Poll::Ready(None);
            }
            i.pop_waker = Some(cx.waker().clone());
            Poll::Pending
        })
        .await
    }

    /// Marks one popped item of `bytes` as answered, freeing its room.
    /// The next queued item, if one is queued now (never waits).
    pub fn try_pop(&self) -> Option<(T, usize)> {
        self.inner.borrow_mut().queue.pop_front()
    }

    pub fn complete(&self, bytes: usize) {
        let mut i = self.inner.borrow_mut();
        assert!(
            i.frames_in_flight >= 1,
            "complete without a frame in flight"
        );
        assert!(
            i.bytes_in_flight >= bytes,
            "complete of more bytes than in flight"
        );
        i.frames_in_flight -= 1;
        i.bytes_in_flight -= bytes;
        i.wake_pusher();
    }

    /// No more pushes will come; `pop` drains and then returns `None`.
    pub fn close_sender(&self) {
        let mut i = self.inner.borrow_mut();
        i.sender_closed = true;
        i.wake_popper();
    }

    /// No more pops will come; pending and later pushes fail.
    pub fn close_receiver(&self) {
        let mut i = self.inner.borrow_mut();
        i.receiver_closed = true;
        i.queue.clear();
        i.wake_pusher();
    }

    /// Waits until every pushed item is completed (nothing in flight).
    /// Fails once the receiver has closed. For the pushing side only (it
    /// shares the pusher's waker).
    pub async fn drained(&self) -> Result<(), Closed> {
        poll_fn(|cx| {
            let mut i = self.inner.borrow_mut();
            if i.receiver_closed {
                return Poll::Ready(Err(Closed));
            }
            if i.frames_in_flight == 0 {
                return Poll::Ready(Ok(()));
            }
            i.push_waker = Some(cx.waker().clone());
            Poll::Pending
        })
        .await
    }

    /// Frames read and not yet answered.
    pub fn frames_in_flight(&self) -> usize {
        self.inner.borrow().frames_in_flight
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;

    #[test]
    fn drained_waits_for_every_item_to_complete() {
        let pipe: Pipe<u32> = Pipe::new(4, 100);
        assert_eq!(pipe.drained().now_or_never(), Some(Ok(())));
        assert_eq!(pipe.push(1, 10).now_or_never(), Some(Ok(())));
        assert!(pipe.drained().now_or_never().is_none());
        let (_, bytes) = pipe.pop().now_or_never().unwrap().unwrap();
        assert!(pipe.drained().now_or_never().is_none());
        pipe.complete(bytes);
        assert_eq!(pipe.drained().now_or_never(), Some(Ok(())));
        pipe.close_receiver();
        assert_eq!(pipe.drained().now_or_never(), Some(Err(Closed)));
    }

    #[test]
    fn bounds_frames_and_bytes_but_always_admits_one() {
        let pipe: Pipe<u32> = Pipe::new(2, 100);
        // One oversized item passes when the pipe is empty.
        assert_eq!(pipe.push(1, 500).now_or_never(), Some(Ok(())));
        // Nothing else fits until it completes.
        assert!(pipe.push(2, 1).now_or_never().is_none());
        let (item, bytes) = pipe.pop().now_or_never().unwrap().unwrap();
        assert_eq!((item, bytes), (1, 500));
        assert_eq!(pipe.frames_in_flight(), 1);
        pipe.complete(bytes);
        assert_eq!(pipe.push(2, 60).now_or_never(), Some(Ok(())));
        // Byte budget: 60 + 50 > 100.
        assert!(pipe.push(3, 50).now_or_never().is_none());
        assert_eq!(pipe.push(3, 40).now_or_never(), Some(Ok(())));
        // Frame budget: 2 in flight.
        assert!(pipe.push(4, 0).now_or_never().is_none());
        assert_eq!(pipe.frames_in_flight(), 2);
    }

    #[test]
    fn pop_drains_then_ends_after_sender_closes() {
        let pipe: Pipe<&str> = Pipe::new(4, 1000);
        pipe.push("a", 1).now_or_never().unwrap().unwrap();
        pipe.push("b", 1).now_or_never().unwrap().unwrap();
        pipe.close_sender();
        assert_eq!(pipe.pop().now_or_never(), Some(Some(("a", 1))));
        assert_eq!(pipe.pop().now_or_never(), Some(Some(("b", 1))));
        assert_eq!(pipe.pop().now_or_never(), Some(None));
    }

    #[test]
    fn push_fails_after_receiver_closes() {
        let pipe: Pipe<u8> = Pipe::new(1, 10);
        pipe.push(1, 1).now_or_never().unwrap().unwrap();
        pipe.close_receiver();
        assert_eq!(pipe.push(2, 1).now_or_never(), Some(Err(Closed)));
    }

    #[test]
    fn empty_pop_waits() {
        let pipe: Pipe<u8> = Pipe::new(1, 10);
        assert!(pipe.pop().now_or_never().is_none());
    }
}
