//! A stream task's wake-ups from others: the dispatcher marked its inbox, its heartbeat is
//! due. Flags and one waker slot: the task's select polls it on every turn (after every
//! request), and a pending poll costs an atomic load and the waker's re-registration — a
//! `Notify` per cause took its waiter list's lock on each, twice per turn.

use std::future::Future;
use std::sync::atomic::{AtomicU8, Ordering};
use std::task::{Context, Poll};

use atomic_waker::AtomicWaker;

/// The inbox holds marks (`super::Inbox`).
pub const MARKED: u8 = 1;
/// A heartbeat is due (`super::heartbeats`).
pub const HEARTBEAT: u8 = 2;

/// What woke a stream, kept until its task takes it. One waiter: the stream's task.
#[derive(Debug, Default)]
pub struct Wake {
    raised: AtomicU8,
    waker: AtomicWaker,
}

impl Wake {
    /// Raises `causes` and wakes the task; raised again before the task looks, they are
    /// taken once (as a `Notify`'s permit).
    pub fn raise(&self, causes: u8) {
        self.raised.fetch_or(causes, Ordering::AcqRel);
        self.waker.wake();
    }

    /// Takes what was raised; pending (the task woken by the next raise) when nothing was.
    pub fn poll_take(&self, cx: &mut Context<'_>) -> Poll<u8> {
        if self.raised.load(Ordering::Acquire) == 0 {
            self.waker.register(cx.waker());
            // Raised between the load and the registration: its wake went to the old waker.
            if self.raised.load(Ordering::Acquire) == 0 {
                return Poll::Pending;
            }
        }
        Poll::Ready(self.raised.swap(0, Ordering::AcqRel))
    }

    /// Waits until something is raised, and takes it (a raise before the wait counts).
    pub fn take(&self) -> impl Future<Output = u8> + '_ {
        std::future::poll_fn(|cx| self.poll_take(cx))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[tokio::test]
    async fn a_raise_before_the_wait_counts_and_causes_accumulate() {
        let wake = Wake::default();
        wake.raise(MARKED);
        wake.raise(HEARTBEAT);
        wake.raise(MARKED);
        assert_eq!(wake.take().await, MARKED | HEARTBEAT);
        // Taken: nothing is left to take.
        let again = tokio::time::timeout(Duration::from_millis(20), wake.take()).await;
        assert!(again.is_err());
    }

    #[tokio::test]
    async fn a_raise_wakes_the_waiting_task() {
        let wake = Arc::new(Wake::default());
        let waiting = tokio::spawn({
            let wake = wake.clone();
            async move { wake.take().await }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        wake.raise(HEARTBEAT);
        let taken = tokio::time::timeout(Duration::from_secs(5), waiting).await;
        assert_eq!(taken.expect("woken").expect("joined"), HEARTBEAT);
    }
}
