//! A future polled only after its own waker fired: for the rare endings (a connection's
//! timers and drain, a stream's client leaving) that a busy task waits on beside its work. A
//! `select!` polls every branch each time its task wakes — for every frame of a connection,
//! every request of a stream — and each such poll read the ending's cold notifier. Wrapped,
//! a poll that was not woken for reads one flag beside the task's waker, on one cache line.
//! (`FuturesUnordered` does the same for many futures, over three allocations.)

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};

use atomic_waker::AtomicWaker;

/// `future`, polled only when it asked to be (and at first).
pub(crate) struct WhenWoken<F> {
    future: Pin<Box<F>>,
    flag: Arc<Flag>,
}

/// The waker the inner future sees: raises the flag, then wakes the outer task.
#[derive(Default)]
struct Flag {
    woken: AtomicBool,
    task: AtomicWaker,
}

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.task.wake();
    }
}

impl<F: Future> WhenWoken<F> {
    pub(crate) fn new(future: F) -> Self {
        let flag = Arc::new(Flag::default());
        flag.woken.store(true, Ordering::Relaxed);
        Self {
            future: Box::pin(future),
            flag,
        }
    }
}

impl<F: Future> Future for WhenWoken<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        // Registered before the flag is read: a wake between the two reaches this task.
        this.flag.task.register(cx.waker());
        if !this.flag.woken.swap(false, Ordering::AcqRel) {
            return Poll::Pending;
        }
        let waker = Waker::from(this.flag.clone());
        this.future.as_mut().poll(&mut Context::from_waker(&waker))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    /// Pending until `notify` fires; counts every poll.
    fn counted<'a>(
        polls: &'a AtomicUsize,
        notify: &'a tokio::sync::Notify,
    ) -> impl Future<Output = &'static str> + 'a {
        let mut notified = Box::pin(notify.notified());
        std::future::poll_fn(move |cx| {
            polls.fetch_add(1, Ordering::Relaxed);
            notified.as_mut().poll(cx).map(|()| "done")
        })
    }

    #[tokio::test]
    async fn the_inner_future_is_polled_at_first_and_after_its_wakes_only() {
        let polls = AtomicUsize::new(0);
        let notify = tokio::sync::Notify::new();
        let ending = WhenWoken::new(counted(&polls, &notify));
        tokio::pin!(ending);
        let (tx, mut rx) = tokio::sync::mpsc::channel::<u32>(8);
        // A busy select: every message wakes the task and polls both branches.
        for i in 0..100 {
            tx.send(i).await.unwrap();
            tokio::select! {
                biased;
                _ = &mut ending => panic!("not notified yet"),
                got = rx.recv() => assert_eq!(got, Some(i)),
            }
        }
        // A plain select would have polled it 100 times.
        assert_eq!(polls.load(Ordering::Relaxed), 1, "polled once, at first");
        // Its own wake, from another task, reaches the waiting task.
        let notifier = async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            notify.notify_one();
        };
        let (ended, ()) = tokio::join!(
            tokio::time::timeout(Duration::from_secs(5), &mut ending),
            notifier
        );
        assert_eq!(ended.expect("woken"), "done");
    }
}
