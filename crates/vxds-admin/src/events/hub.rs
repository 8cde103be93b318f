//! The one task that turns revisions and client events into Server-Sent Event frames, once
//! each, and hands the same bytes to every reader's queue.
//!
//! Readers hold no index snapshot: the hub borrows the newest one for as long as it takes to
//! serialise what is new, and readers hold only frames (`Bytes`, shared). Each reader's queue
//! is bounded in bytes; a reader whose queue would overflow is dropped from the hub (its
//! frames freed at once) and its stream ends with `reset` (reason `slow_reader`), so that it
//! reconnects with `Last-Event-ID` and re-reads what it missed from the store. Nothing here
//! ever waits for a reader. The hub runs while someone reads and stops with the last reader
//! or when the server drains.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use axum::body::Bytes;
use tokio::sync::{Notify, broadcast, watch};
use vxds_store::Snapshot;
use vxds_xds::ClientEvent;

use super::{EventId, LaggedEvent, ResetEvent, RevisionEvent, frame};
use crate::AdminState;

/// What a frame is, so that each reader can skip revisions it already has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Revision(EventId),
    /// The head went back to this revision.
    Reset(EventId),
    /// A client event or `lagged`: not replayable, passed on as it is.
    Client,
}

/// One serialised event, shared by every queue it is in.
#[derive(Clone, Debug)]
pub(crate) struct Frame {
    pub(crate) kind: Kind,
    pub(crate) bytes: Bytes,
}

/// What a reader's stream finds in its queue.
#[derive(Debug)]
pub(crate) enum Next {
    Frame(Frame),
    /// It fell further behind than its queue holds: the frames are gone.
    Overflowed,
    /// The server drains.
    Closed,
}

#[derive(Debug, Default)]
struct QueueState {
    frames: VecDeque<Frame>,
    bytes: usize,
    overflowed: bool,
    closed: bool,
    waker: Option<Waker>,
}

/// One reader's frames, bounded in bytes.
#[derive(Debug, Default)]
pub(crate) struct Queue {
    state: Mutex<QueueState>,
}

impl Queue {
    /// Adds `frame` unless that passes `limit` bytes; then the queue is emptied and marked
    /// overflowed. False once the reader is overflowed (the hub forgets it).
    fn push(&self, frame: &Frame, limit: usize) -> bool {
        let Ok(mut q) = self.state.lock() else {
            return false;
        };
        if q.overflowed || q.closed {
            return false;
        }
        if q.bytes + frame.bytes.len() > limit {
            drop(q);
            self.overflow();
            return false;
        }
        q.bytes += frame.bytes.len();
        q.frames.push_back(frame.clone());
        if let Some(waker) = q.waker.take() {
            waker.wake();
        }
        true
    }

    /// Drops the reader's frames: it re-reads from the store.
    fn overflow(&self) {
        if let Ok(mut q) = self.state.lock() {
            q.frames = VecDeque::new();
            q.bytes = 0;
            q.overflowed = true;
            if let Some(waker) = q.waker.take() {
                waker.wake();
            }
        }
    }

    fn close(&self) {
        if let Ok(mut q) = self.state.lock() {
            q.closed = true;
            if let Some(waker) = q.waker.take() {
                waker.wake();
            }
        }
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.state.lock().map_or(true, |q| q.closed)
    }

    /// The next frame; an overflow or the drain once the frames before it are read.
    pub(crate) fn poll_next(&self, cx: &mut Context<'_>) -> Poll<Next> {
        let Ok(mut q) = self.state.lock() else {
            return Poll::Ready(Next::Closed);
        };
        if q.closed {
            return Poll::Ready(Next::Closed);
        }
        if let Some(frame) = q.frames.pop_front() {
            q.bytes -= frame.bytes.len();
            return Poll::Ready(Next::Frame(frame));
        }
        if q.overflowed {
            return Poll::Ready(Next::Overflowed);
        }
        q.waker = Some(cx.waker().clone());
        Poll::Pending
    }

    /// Bytes waiting (for tests and metrics).
    #[cfg(test)]
    fn queued_bytes(&self) -> usize {
        self.state.lock().map_or(0, |q| q.bytes)
    }
}

#[derive(Debug, Default)]
struct Inner {
    readers: Vec<Arc<Queue>>,
    running: bool,
    /// The newest revision whose frame went to the queues.
    published: u64,
    /// The index's epoch at `published`: another epoch is another history (a reload).
    epoch: u64,
    /// `published`'s commit id.
    commit: i64,
}

/// The server's event hub. Cheap to share.
#[derive(Debug)]
pub struct Hub {
    inner: Mutex<Inner>,
    /// Streams open (counted until the response is dropped, not just while registered).
    open: AtomicUsize,
    idle: Notify,
    pub(crate) max_readers: usize,
    pub(crate) queue_bytes: usize,
}

/// Default `--max-event-readers`.
pub const MAX_READERS: usize = 256;
/// Default bytes a reader may fall behind by before it is dropped (1 MiB).
pub const QUEUE_BYTES: usize = 1 << 20;

impl Default for Hub {
    fn default() -> Self {
        Self::new(MAX_READERS, QUEUE_BYTES)
    }
}

/// A reader's place: frees its slot and leaves the hub when its stream is dropped.
#[derive(Debug)]
pub(crate) struct Slot {
    hub: Arc<Hub>,
    pub(crate) queue: Arc<Queue>,
    /// The revision the hub had published when the reader joined: older ones are replayed.
    pub(crate) joined_at: u64,
    /// `joined_at`'s commit id.
    pub(crate) joined_commit: i64,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.hub.open.fetch_sub(1, Ordering::AcqRel);
        if let Ok(mut inner) = self.hub.inner.lock() {
            inner.readers.retain(|q| !Arc::ptr_eq(q, &self.queue));
            if inner.readers.is_empty() {
                self.hub.idle.notify_one();
            }
        }
    }
}

/// Refused: as many readers as allowed already follow.
#[derive(Debug)]
pub(crate) struct Full;

impl Hub {
    pub fn new(max_readers: usize, queue_bytes: usize) -> Self {
        Self {
            inner: Mutex::default(),
            open: AtomicUsize::new(0),
            idle: Notify::new(),
            max_readers: max_readers.max(1),
            queue_bytes: queue_bytes.max(1),
        }
    }

    /// Streams open now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }

    /// A place for one more reader, starting the hub if it is not running.
    pub(crate) fn join(self: &Arc<Self>, state: &AdminState) -> Result<Slot, Full> {
        self.open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max_readers).then_some(n + 1)
            })
            .map_err(|_| Full)?;
        let queue = Arc::new(Queue::default());
        let Ok(mut inner) = self.inner.lock() else {
            self.open.fetch_sub(1, Ordering::AcqRel);
            return Err(Full);
        };
        if !inner.running {
            // Subscribed before the revision is read, so nothing falls between.
            let snapshots = state.index.subscribe();
            (inner.published, inner.epoch, inner.commit) = {
                let snapshot = snapshots.borrow();
                (snapshot.revision, snapshot.epoch, snapshot.commit_id)
            };
            let clients = state.clients.as_ref().map(|r| r.events.subscribe());
            inner.running = true;
            tokio::spawn(run(
                self.clone(),
                snapshots,
                clients,
                state.draining.clone(),
                state.metrics.clone(),
            ));
        }
        inner.readers.push(queue.clone());
        Ok(Slot {
            hub: self.clone(),
            queue,
            joined_at: inner.published,
            joined_commit: inner.commit,
        })
    }

    /// Hands `frames` to every queue; readers that overflow are forgotten and counted.
    fn publish(
        &self,
        frames: &[Frame],
        revision: Option<&Snapshot>,
        metrics: &crate::AdminMetrics,
    ) {
        let Ok(mut inner) = self.inner.lock() else {
            return;
        };
        let limit = self.queue_bytes;
        let before = inner.readers.len();
        inner
            .readers
            .retain(|q| frames.iter().all(|frame| q.push(frame, limit)));
        let dropped = before - inner.readers.len();
        if dropped > 0 {
            metrics.event_readers_dropped.inc_by(dropped as u64);
        }
        if let Some(snapshot) = revision {
            inner.published = snapshot.revision;
            inner.epoch = snapshot.epoch;
            inner.commit = snapshot.commit_id;
        }
    }

    /// Stops the hub if nobody reads; true if it did.
    fn stop_if_idle(&self) -> bool {
        let Ok(mut inner) = self.inner.lock() else {
            return true;
        };
        if inner.readers.is_empty() {
            inner.running = false;
        }
        !inner.running
    }

    /// The drain: every stream ends, the hub stops.
    fn close_all(&self) {
        if let Ok(mut inner) = self.inner.lock() {
            for q in inner.readers.drain(..) {
                q.close();
            }
            inner.running = false;
        }
    }
}

/// The frames for what `snapshot` has beyond `published` (of `epoch`): a `reset` if the index
/// was reloaded (the database went back, or diverged at the same revision number: a restore,
/// a failover to a lagging standby), else one frame per revision. None if the index no longer
/// remembers some of them (the hub fell further behind than the index keeps; every reader
/// then re-reads from the store).
fn frames_since(snapshot: &Snapshot, published: u64, epoch: u64) -> Option<Vec<Frame>> {
    let mut frames = Vec::new();
    if snapshot.epoch != epoch || snapshot.revision < published {
        let from = snapshot.revision;
        let id = EventId::new(from, snapshot.commit_id);
        frames.push(Frame {
            kind: Kind::Reset(id),
            bytes: frame(
                "reset",
                Some(id),
                &ResetEvent {
                    revision: from,
                    reason: super::ResetReason::HeadWentBack,
                },
            ),
        });
        return Some(frames);
    }
    let mut expected = published + 1;
    for change in snapshot.revisions_since(published) {
        if change.revision != expected {
            return None;
        }
        let event = RevisionEvent::of_index(change);
        let id = EventId::new(change.revision, change.commit_id);
        frames.push(Frame {
            kind: Kind::Revision(id),
            bytes: frame("revision", Some(id), &event),
        });
        expected = change.revision + 1;
    }
    (expected > snapshot.revision).then_some(frames)
}

async fn run(
    hub: Arc<Hub>,
    mut snapshots: watch::Receiver<Arc<Snapshot>>,
    mut clients: Option<broadcast::Receiver<Arc<ClientEvent>>>,
    mut draining: Option<watch::Receiver<bool>>,
    metrics: Arc<crate::AdminMetrics>,
) {
    loop {
        tokio::select! {
            changed = snapshots.changed() => {
                if changed.is_err() {
                    hub.close_all();
                    return;
                }
                // Held only while the new revisions are serialised.
                let snapshot = snapshots.borrow_and_update().clone();
                let (published, epoch) = hub.inner.lock().map_or((0, 0), |i| (i.published, i.epoch));
                match frames_since(&snapshot, published, epoch) {
                    Some(frames) => hub.publish(&frames, Some(&*snapshot), &metrics),
                    None => {
                        // Every reader re-reads from the store.
                        let readers = hub.inner.lock().map(|mut i| {
                            i.published = snapshot.revision;
                            i.epoch = snapshot.epoch;
                            i.commit = snapshot.commit_id;
                            std::mem::take(&mut i.readers)
                        }).unwrap_or_default();
                        readers.iter().for_each(|q| q.overflow());
                        metrics.event_readers_dropped.inc_by(readers.len() as u64);
                    }
                }
            }
            event = next_client_event(&mut clients) => {
                let frame = match event {
                    Ok(event) => frame(event.name(), None, &*event),
                    Err(broadcast::error::RecvError::Lagged(missed)) => {
                        frame("lagged", None, &LaggedEvent { missed })
                    }
                    Err(broadcast::error::RecvError::Closed) => {
                        clients = None;
                        continue;
                    }
                };
                hub.publish(&[Frame { kind: Kind::Client, bytes: frame }], None, &metrics);
            }
            () = hub.idle.notified() => {}
            () = super::until_draining(&mut draining) => {
                hub.close_all();
                return;
            }
        }
        if hub.stop_if_idle() {
            return;
        }
    }
}

async fn next_client_event(
    clients: &mut Option<broadcast::Receiver<Arc<ClientEvent>>>,
) -> Result<Arc<ClientEvent>, broadcast::error::RecvError> {
    match clients {
        Some(receiver) => receiver.recv().await,
        None => std::future::pending().await,
    }
}

/// Marks a connection that carries an event stream: at shutdown such a connection is cut
/// rather than waited for, since a reader that stopped reading would hold it to the deadline.
#[derive(Clone, Debug, Default)]
pub struct StreamConnection(Arc<AtomicBool>);

impl StreamConnection {
    pub(crate) fn mark(&self) {
        self.0.store(true, Ordering::Release);
    }

    /// Whether an event stream was served on this connection.
    pub fn carries_events(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(bytes: &'static [u8]) -> Frame {
        Frame {
            kind: Kind::Client,
            bytes: Bytes::from_static(bytes),
        }
    }

    fn next(queue: &Queue) -> Poll<Next> {
        let waker = futures::task::noop_waker();
        queue.poll_next(&mut Context::from_waker(&waker))
    }

    /// Frames are shared, not copied; a queue holds at most its limit in bytes, and the frame
    /// that would pass it empties the queue and marks the reader overflowed.
    #[test]
    fn a_queue_is_bounded_in_bytes_and_overflows_once() {
        let queue = Queue::default();
        let shared = client(b"0123456789");
        assert!(queue.push(&shared, 25));
        assert!(queue.push(&shared, 25));
        assert_eq!(queue.queued_bytes(), 20);
        let Poll::Ready(Next::Frame(first)) = next(&queue) else {
            panic!()
        };
        assert_eq!(first.bytes.as_ptr(), shared.bytes.as_ptr(), "shared bytes");
        assert!(queue.push(&shared, 25));
        assert!(
            !queue.push(&shared, 25),
            "the third pending frame passes 25 bytes"
        );
        assert_eq!(queue.queued_bytes(), 0, "its frames are freed at once");
        assert!(matches!(next(&queue), Poll::Ready(Next::Overflowed)));
        assert!(
            !queue.push(&shared, 1000),
            "an overflowed reader takes no more"
        );
        let empty = Queue::default();
        assert!(matches!(next(&empty), Poll::Pending));
        empty.close();
        assert!(matches!(next(&empty), Poll::Ready(Next::Closed)));
    }

    /// The hub frames each new revision once; a head that went back is one `reset`; revisions
    /// the index no longer has are reported as none (readers then re-read from the store).
    #[test]
    fn frames_since_a_published_revision() {
        use vxds_store::{ChangeBatch, ResourceKey, RevisionChangeList};
        let revision = |n: u64| RevisionChangeList {
            revision: n,
            committed_at_ms: 0,
            commit_id: 0,
            changed: vec![ResourceKey {
                type_url: "t".into(),
                name: format!("r{n}"),
            }],
            author: None,
            message: None,
        };
        let batch = ChangeBatch {
            revision: 3,
            commit_id: 0,
            revisions: (1..=3).map(revision).collect(),
            resources: Vec::new(),
            deleted: Vec::new(),
            complete: false,
        };
        let snapshot = Snapshot::default().apply(batch);
        let frames = frames_since(&snapshot, 1, 0).unwrap();
        let kinds: Vec<Kind> = frames.iter().map(|f| f.kind).collect();
        assert_eq!(
            kinds,
            [
                Kind::Revision(EventId::new(2, 0)),
                Kind::Revision(EventId::new(3, 0))
            ]
        );
        let text = String::from_utf8_lossy(&frames[0].bytes).into_owned();
        assert!(
            text.starts_with("event: revision\nid: 2\ndata: {"),
            "{text}"
        );
        assert!(text.ends_with("}\n\n"), "{text}");
        assert!(frames_since(&snapshot, 3, 0).unwrap().is_empty());
        let back = frames_since(&snapshot, 7, 0).unwrap();
        assert_eq!(back.len(), 1);
        assert_eq!(back[0].kind, Kind::Reset(EventId::new(3, 0)));
        // Reloaded at the same revision number with other content (a failover that reused
        // it): a reset too.
        let reloaded = snapshot.reload(ChangeBatch {
            revision: 3,
            commit_id: 9,
            revisions: Vec::new(),
            resources: Vec::new(),
            deleted: Vec::new(),
            complete: true,
        });
        let diverged = frames_since(&reloaded, 3, 0).unwrap();
        assert_eq!(diverged.len(), 1);
        assert_eq!(diverged[0].kind, Kind::Reset(EventId::new(3, 9)));
        assert!(frames_since(&reloaded, 3, 1).unwrap().is_empty());
    }
}
