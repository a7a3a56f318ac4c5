//! Single-thread wake-ups between the tasks of one shard (appenders, the
//! flusher, the checkpointer). Not `Send`: a shard's tasks never leave its
//! thread. A waiter registers on its first poll, which happens before the
//! task yields, so a notification can never fall between checking a
//! condition and waiting for it.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

/// Wakes every task waiting at the time of [`Notify::notify`].
#[derive(Default)]
pub(crate) struct Notify {
    epoch: Cell<u64>,
    waiters: RefCell<Vec<Waker>>,
}

impl Notify {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    pub(crate) fn notify(&self) {
        self.epoch.set(self.epoch.get().wrapping_add(1));
        if self.waiters.borrow().is_empty() {
            return;
        }
        let waiters = std::mem::take(&mut *self.waiters.borrow_mut());
        for w in waiters {
            w.wake();
        }
    }

    /// Resolves after the next `notify` (one that happens after this call).
    pub(crate) fn notified(&self) -> Notified<'_> {
        Notified {
            notify: self,
            epoch: self.epoch.get(),
        }
    }
}

pub(crate) struct Notified<'a> {
    notify: &'a Notify,
    epoch: u64,
}

impl Future for Notified<'_> {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.notify.epoch.get() != self.epoch {
            return Poll::Ready(());
        }
        let mut waiters = self.notify.waiters.borrow_mut();
        if !waiters.iter().any(|w| w.will_wake(cx.waker())) {
            waiters.push(cx.waker().clone());
        }
        Poll::Pending
    }
}

/// Lets other tasks of the runtime run once.
pub(crate) async fn yield_now() {
    struct YieldNow(bool);
    impl Future for YieldNow {
        type Output = ();
        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            if self.0 {
                return Poll::Ready(());
            }
            self.0 = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }
    YieldNow(false).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::rc::Rc;

    #[test]
    fn notified_after_notify() {
        let rt = compio::runtime::Runtime::new().expect("runtime");
        rt.block_on(async {
            let n = Rc::new(Notify::new());
            let flag = Rc::new(Cell::new(false));
            let (n2, f2) = (n.clone(), flag.clone());
            let task = compio::runtime::spawn(async move {
                n2.notified().await;
                f2.set(true);
            });
            yield_now().await;
            assert!(!flag.get());
            n.notify();
            let _ = task.await;
            assert!(flag.get());
        });
    }
}
