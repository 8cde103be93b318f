//! `GET /v1/events`: a Server-Sent Events stream of what happens, as it happens.
//!
//! - `revision` (id = the revision number): each committed revision with its author, message,
//!   how many resources it changed and the first [`CHANGED_SHOWN`] of them, taken from the
//!   index's change lists — a reader costs the database nothing while it follows;
//! - `client_connected`, `client_disconnected`, `ack`, `nack` (with the client's error text):
//!   from the xDS server's bounded broadcast (`vxds_xds::events`); `lagged` says how many
//!   the server itself missed, and no reader ever slows a stream;
//! - `hello` once caught up (id = the revision the reader is current with), `reset` when the
//!   store's head went backwards (a restored database), when a resuming reader's revisions
//!   were pruned by the history retention, or when the reader fell further behind than its
//!   queue holds (the stream then ends; the reader resumes with `Last-Event-ID`).
//!
//! Costs per event, not per reader ([`hub`]): one task serialises each event once and every
//! reader's queue shares the bytes; queues are bounded in bytes; at most
//! `--max-event-readers` streams are open (503 beyond). Readers hold no index snapshot.
//!
//! Event ids name a revision and its commit (`N-<commit id in hex>`; `N` alone for revisions
//! from before commit ids): after a failover to a lagging standby the next commits reuse
//! revision numbers, and a reader resuming from a revision the database now holds as another
//! commit (or no longer holds) gets `reset` (`head_went_back`), even when it was not connected
//! when the index reloaded.
//!
//! Resumable: with `Last-Event-ID: N` the stream first replays every revision after N —
//! from the index's recent change lists, or from the store's history for what the index no
//! longer remembers (if the store cannot answer, `lagged` says how many were skipped) — then
//! goes live. A reader ahead of this replica's index (another replica served it) waits for
//! the index without a `reset` when the store has its revision. Client events are not
//! replayed: they describe the present, which `GET /v1/clients` shows whole. Keep-alive
//! comments keep proxies from closing an idle stream (and `X-Accel-Buffering: no` keeps nginx
//! from buffering it); the stream ends when the server starts draining.

pub mod hub;

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Duration;

use axum::Extension;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::Response;
use serde::Serialize;
use utoipa::ToSchema;
use vxds_envoy::resource::ResourceType;
use vxds_store::ResourceKey;
use vxds_xds::ClientEvent;

use crate::AdminState;
use crate::problem::{ApiError, ProblemBody, ReadProblems};
use crate::repr::timestamp;
use hub::{Kind, Next, Slot, StreamConnection};

/// The default interval of keep-alive comments.
pub const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// Revisions read per page when replaying to a resuming reader.
const REPLAY_PAGE: usize = 100;

/// Changed names a `revision` event lists; `change_count` has them all
/// (`GET /v1/revisions/{n}/changes` pages through them).
pub const CHANGED_SHOWN: usize = 100;

/// A committed revision (`event: revision`, `id:` its number).
#[derive(Debug, Serialize, ToSchema)]
pub struct RevisionEvent {
    pub revision: u64,
    /// RFC 3339.
    pub committed_at: String,
    /// The name of the token that wrote it.
    pub author: Option<String>,
    pub message: Option<String>,
    /// How many resources it created, updated or deleted.
    pub change_count: usize,
    /// The first of them (at most 100).
    pub changed: Vec<ChangedName>,
}

impl RevisionEvent {
    fn of_index(change: &vxds_store::index::RevisionChanges) -> Self {
        Self {
            revision: change.revision,
            committed_at: timestamp(change.committed_at_ms),
            author: change.author.as_deref().map(str::to_owned),
            message: change.message.as_deref().map(str::to_owned),
            change_count: change.changed.len(),
            changed: change
                .changed
                .iter()
                .take(CHANGED_SHOWN)
                .map(|key| changed_name(key))
                .collect(),
        }
    }

    fn of_store(revision: &vxds_store::Revision) -> Self {
        Self {
            revision: revision.revision,
            committed_at: timestamp(revision.created_at_ms),
            author: revision.author.clone(),
            message: revision.message.clone(),
            change_count: revision.changes.len(),
            changed: revision
                .changes
                .iter()
                .take(CHANGED_SHOWN)
                .map(|c| changed_name(&c.key))
                .collect(),
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ChangedName {
    pub type_url: String,
    /// The short alias (`route`), if the type has one.
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub alias: Option<&'static str>,
    pub name: String,
}

/// `event: hello`, after the replay of a resuming reader (first for a new one); its id is
/// `revision`.
#[derive(Debug, Serialize, ToSchema)]
pub struct HelloEvent {
    /// The revision the stream is current with (replayed revisions included).
    pub revision: u64,
    /// Whether client events (`client_connected`, `ack`, ...) come on this stream: an xDS
    /// server runs in this process.
    pub clients: bool,
}

/// `event: lagged`: `missed` events were lost — client events the server itself was too
/// slow for, or revisions the store could not replay on a resume (the stream then goes on
/// from the index).
#[derive(Debug, Serialize, ToSchema)]
pub struct LaggedEvent {
    pub missed: u64,
}

/// Why a `reset` came.
#[derive(Clone, Copy, Debug, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ResetReason {
    /// The database no longer holds what the server had indexed: its head went backwards, or
    /// the same revision number now holds another commit (a restored database, a failover to
    /// a lagging standby). The server reloaded it; revisions continue from `revision`, and
    /// what the reader was told (even at revisions up to it) no longer holds: re-read.
    HeadWentBack,
    /// The reader fell further behind than its queue holds: the stream ends after this
    /// event; resume with `Last-Event-ID` (its id) to re-read the revisions from the store,
    /// and re-read `GET /v1/clients` (client events are not replayed).
    SlowReader,
    /// The revisions after the reader's `Last-Event-ID` were pruned by the history retention:
    /// it cannot be told what it missed, and goes on from `revision` (re-read what it needs).
    HistoryPruned,
}

/// `event: reset`; its id is `revision`.
#[derive(Debug, Serialize, ToSchema)]
pub struct ResetEvent {
    pub revision: u64,
    pub reason: ResetReason,
}

/// Every event the stream carries, for the OpenAPI document: the SSE `event:` field names it,
/// `data:` is its JSON.
#[derive(Debug, Serialize, ToSchema)]
#[allow(dead_code)] // documentation only
pub enum StreamEvent {
    #[serde(rename = "hello")]
    Hello(HelloEvent),
    #[serde(rename = "revision")]
    Revision(RevisionEvent),
    #[serde(rename = "client")]
    Client(ClientEvent),
    #[serde(rename = "lagged")]
    Lagged(LaggedEvent),
    #[serde(rename = "reset")]
    Reset(ResetEvent),
}

fn changed_name(key: &ResourceKey) -> ChangedName {
    ChangedName {
        type_url: key.type_url.to_string(),
        alias: ResourceType::alias_of(&key.type_url),
        name: key.name.clone(),
    }
}

/// An event's id: a revision and its commit id, so that a resume tells the revision the
/// reader was told of from another commit with the same number (after a failover).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct EventId {
    pub(crate) revision: u64,
    /// 0: unknown (revisions from before commit ids, or a resume by number only): not checked.
    pub(crate) commit: i64,
}

impl EventId {
    pub(crate) fn new(revision: u64, commit: i64) -> Self {
        Self { revision, commit }
    }

    /// `N`, or `N-<commit id>`: a revision number and the commit id's 64 bits in hex.
    fn parse(text: &str) -> Option<Self> {
        let (revision, commit) = match text.split_once('-') {
            Some((revision, commit)) if commit.len() == 16 => {
                (revision, u64::from_str_radix(commit, 16).ok()? as i64)
            }
            Some(_) => return None,
            None => (text, 0),
        };
        let revision = revision
            .parse::<u64>()
            .ok()
            .filter(|n| *n <= i64::MAX as u64)?;
        Some(Self { revision, commit })
    }
}

impl std::fmt::Display for EventId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.commit {
            0 => write!(f, "{}", self.revision),
            commit => write!(f, "{}-{:016x}", self.revision, commit as u64),
        }
    }
}

/// One Server-Sent Event: `event:`, `id:` if given, and the JSON of `data` on one line.
pub(crate) fn frame(name: &str, id: Option<EventId>, data: &impl Serialize) -> Bytes {
    let mut out = Vec::with_capacity(128);
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(name.as_bytes());
    if let Some(id) = id {
        out.extend_from_slice(format!("\nid: {id}").as_bytes());
    }
    out.extend_from_slice(b"\ndata: ");
    if serde_json::to_writer(&mut out, data).is_err() {
        out.extend_from_slice(b"{}");
    }
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

fn reset_frame(id: EventId, reason: ResetReason) -> Bytes {
    let revision = id.revision;
    frame("reset", Some(id), &ResetEvent { revision, reason })
}

/// `Last-Event-ID`, if given: an event's id (`N-<commit>`), or a revision number.
fn last_event_id(headers: &HeaderMap) -> Result<Option<EventId>, ApiError> {
    let Some(value) = headers.get("last-event-id") else {
        return Ok(None);
    };
    let text = value.to_str().unwrap_or_default().trim();
    // An empty id is how a browser's EventSource says it has none.
    if text.is_empty() {
        return Ok(None);
    }
    EventId::parse(text).map(Some).ok_or_else(|| {
        ApiError::bad_header(
            "last-event-id",
            "invalid_event_id",
            "must be an event's id (`N-<commit>`, the id of a `revision`, `hello` or `reset` \
             event) or a revision number",
        )
    })
}

/// Follow revisions and client events as Server-Sent Events.
#[utoipa::path(
    get,
    path = "/v1/events",
    operation_id = "streamEvents",
    tag = "revisions",
    params(
        ("Last-Event-ID" = Option<String>, Header, description = "Resume: replay every revision after this one first. An event's id (`N-<commit id, 16 hex digits>`: a revision this server no longer holds as that commit, after a failover to a lagging standby, answers `reset`) or a bare revision number (not checked)"),
    ),
    responses(
        (status = 200, description = "A `text/event-stream` (with `X-Accel-Buffering: no`): with `Last-Event-ID`, the revisions after it replayed first; then `hello` (id: the revision the reader is current with); then live `revision` events (id: `N-<commit id>`, the revision number and its commit's id in 16 hex digits, or `N` for revisions from before commit ids; `change_count` and the first 100 changed names), `client_connected`, `client_disconnected`, `ack`, `nack` (with the client's error text), `lagged` (client events the server missed) and `reset` (`head_went_back`: a restored database or a failover to a lagging standby, even at the same revision number; `slow_reader`: the reader fell more than its queue (1 MiB) behind, and the stream ends so that it resumes with `Last-Event-ID`); keep-alive comments while idle. Each `data:` is the JSON of the `StreamEvent` variant the `event:` names (`client` for the four client events, told apart by their `event` field).", body = StreamEvent, content_type = "text/event-stream"),
        (status = 400, description = "A `Last-Event-ID` that is neither an event's id nor a revision number", body = ProblemBody, content_type = "application/problem+json"),
        (status = 503, description = "As many event streams are open as `--max-event-readers` allows (default 256; `too_many_event_readers`), or the server is shutting down (`draining`); `Retry-After` says when to try again", body = ProblemBody, content_type = "application/problem+json"),
        ReadProblems,
    ),
    security(("bearer" = []), ())
)]
pub async fn events(
    State(state): State<AdminState>,
    connection: Option<Extension<StreamConnection>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let resume = last_event_id(&headers)?;
    if state.is_draining() {
        return Err(ApiError::Busy {
            code: "draining",
            detail: "the server is shutting down; follow another replica".into(),
        });
    }
    let slot = state.events.join(&state).map_err(|_| ApiError::Busy {
        code: "too_many_event_readers",
        detail: format!(
            "{} event streams are open, as many as this server allows (--max-event-readers); \
             try again later",
            state.events.max_readers
        ),
    })?;
    if let Some(Extension(connection)) = connection {
        connection.mark();
    }
    state.metrics.event_readers.inc();
    let reader = Reader {
        keep_alive: state.events_keep_alive,
        last: slot.joined_at,
        last_commit: slot.joined_commit,
        state,
        slot,
        resume,
        phase: Phase::Resolve,
        pending: VecDeque::new(),
    };
    let stream = futures::stream::unfold(reader, |mut reader| async move {
        let bytes = reader.next().await?;
        Some((Ok::<_, Infallible>(bytes), reader))
    });
    let mut response = Response::new(Body::from_stream(stream));
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    // nginx buffers responses (Server-Sent Events too) unless told not to.
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    Ok(response)
}

pub(crate) async fn until_draining(draining: &mut Option<tokio::sync::watch::Receiver<bool>>) {
    match draining {
        Some(d) => {
            if d.wait_for(|draining| *draining).await.is_err() {
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending().await,
    }
}

/// How long a reader resuming from a revision neither this replica's index nor the store has
/// reached yet waits for it (it resumes from what its own write is about to return), before
/// it is told the head went backwards.
const RESUME_WAIT: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Copy)]
enum Phase {
    /// Where to start: `Last-Event-ID`, checked against the index and the store.
    Resolve,
    /// Revisions up to where the reader joined the hub.
    Replay,
    /// Frames from the hub.
    Live,
    Done,
}

/// One reader's stream: its queue in the hub and where it is.
struct Reader {
    state: AdminState,
    slot: Slot,
    resume: Option<EventId>,
    /// The newest revision this reader has (or had when it resumed).
    last: u64,
    /// `last`'s commit id (0: unknown), for the ids of `hello` and `reset`.
    last_commit: i64,
    phase: Phase,
    /// Frames made for this reader alone (the replay, `hello`).
    pending: VecDeque<Bytes>,
    keep_alive: Duration,
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.state.metrics.event_readers.dec();
    }
}

impl Reader {
    async fn next(&mut self) -> Option<Bytes> {
        loop {
            if let Some(bytes) = self.pending.pop_front() {
                return Some(bytes);
            }
            if self.slot.queue.is_closed() {
                return None;
            }
            match self.phase {
                Phase::Resolve => {
                    self.resolve().await;
                    self.phase = Phase::Replay;
                }
                Phase::Replay if self.last < self.slot.joined_at => self.replay_page().await,
                Phase::Replay => {
                    let hello = HelloEvent {
                        revision: self.last,
                        clients: self.state.clients.is_some(),
                    };
                    self.pending
                        .push_back(frame("hello", Some(self.last_id()), &hello));
                    self.phase = Phase::Live;
                }
                Phase::Live => {
                    let queue = self.slot.queue.clone();
                    let next = std::future::poll_fn(|cx| queue.poll_next(cx));
                    let Ok(next) = tokio::time::timeout(self.keep_alive, next).await else {
                        return Some(Bytes::from_static(b":\n\n"));
                    };
                    match next {
                        Next::Closed => return None,
                        Next::Overflowed => {
                            self.phase = Phase::Done;
                            return Some(reset_frame(self.last_id(), ResetReason::SlowReader));
                        }
                        Next::Frame(frame) => match frame.kind {
                            Kind::Revision(id) if id.revision > self.last => {
                                (self.last, self.last_commit) = (id.revision, id.commit);
                                return Some(frame.bytes);
                            }
                            // The index was reloaded (the database went back, or diverged
                            // at the same number): what the reader was told no longer holds.
                            Kind::Reset(id) => {
                                (self.last, self.last_commit) = (id.revision, id.commit);
                                return Some(frame.bytes);
                            }
                            Kind::Revision(_) => {}
                            Kind::Client => return Some(frame.bytes),
                        },
                    }
                }
                Phase::Done => return None,
            }
        }
    }

    /// Where the reader starts. A `Last-Event-ID` ahead of this replica's index is normal on
    /// a replica a little behind (or right after the reader's own write): if the store has
    /// that revision, the reader simply skips the revisions up to it as they arrive. Only a
    /// revision the store does not have either (after a short wait for a write in flight) is
    /// a head that went back.
    ///
    /// A resume by an event's id also checks that the revision is still that commit: after a
    /// failover to a lagging standby the number may name another commit (or none yet), and what
    /// the reader was told up to it no longer holds, even if it was away when the index
    /// reloaded.
    async fn resolve(&mut self) {
        let Some(resume) = self.resume else {
            return;
        };
        let indexed = self.state.index.snapshot().revision;
        let reached = resume.revision <= indexed
            || matches!(self.state.store.head_revision().await, Ok(head) if head >= resume.revision)
            || tokio::time::timeout(RESUME_WAIT, self.state.index.wait_for(resume.revision))
                .await
                .is_ok();
        if reached && self.same_commit(resume).await {
            (self.last, self.last_commit) = (resume.revision, resume.commit);
            return;
        }
        let snapshot = self.state.index.snapshot();
        (self.last, self.last_commit) = (snapshot.revision, snapshot.commit_id);
        drop(snapshot);
        self.pending
            .push_back(reset_frame(self.last_id(), ResetReason::HeadWentBack));
    }

    /// Whether the database (as the index has it, or the store's history for what the index
    /// forgot) holds `id`'s revision as `id`'s commit. True when it cannot tell: a bare
    /// number, a revision the retention pruned (the replay says so), a store that does not
    /// answer.
    async fn same_commit(&self, id: EventId) -> bool {
        if id.commit == 0 {
            return true;
        }
        let known = {
            let snapshot = self.state.index.snapshot();
            if snapshot.revision == id.revision {
                Some(snapshot.commit_id)
            } else {
                snapshot
                    .revisions_since(id.revision.saturating_sub(1))
                    .next()
                    .filter(|c| c.revision == id.revision)
                    .map(|c| c.commit_id)
            }
        };
        let commit = match known {
            Some(commit) => commit,
            None => match self
                .state
                .store
                .revisions(id.revision.saturating_sub(1), 1)
                .await
            {
                Ok(page) => match page.first().filter(|r| r.revision == id.revision) {
                    Some(revision) => revision.commit_id,
                    None => return true,
                },
                Err(_) => return true,
            },
        };
        // 0: a revision from before commit ids, which the reader cannot have been told of.
        commit == id.commit || commit == 0
    }

    fn last_id(&self) -> EventId {
        EventId::new(self.last, self.last_commit)
    }

    /// The next page of revisions after `last` (up to where the reader joined the hub): from
    /// the index's change lists, or from the store's history for what the index forgot.
    async fn replay_page(&mut self) {
        let until = self.slot.joined_at;
        let oldest_remembered = {
            // Held only while this page is serialised.
            let snapshot = self.state.index.snapshot();
            let oldest = snapshot
                .revisions_since(self.last)
                .next()
                .map_or(snapshot.revision + 1, |r| r.revision);
            if self.last + 1 >= oldest {
                for change in snapshot
                    .revisions_since(self.last)
                    .take_while(|c| c.revision <= until)
                    .take(REPLAY_PAGE)
                {
                    let event = RevisionEvent::of_index(change);
                    let id = EventId::new(change.revision, change.commit_id);
                    self.pending.push_back(frame("revision", Some(id), &event));
                    (self.last, self.last_commit) = (id.revision, id.commit);
                }
                if self.pending.is_empty() {
                    (self.last, self.last_commit) = (until, self.slot.joined_commit);
                }
                return;
            }
            oldest
        };
        let upto = (oldest_remembered - 1).min(until);
        // A reader resuming from before what the history retention kept cannot be told what
        // it missed: it starts over from where it joined.
        if let Ok(oldest_kept) = self.state.store.oldest_kept_revision().await
            && self.last + 1 < oldest_kept
        {
            self.history_pruned(until);
            return;
        }
        match self.state.store.revisions(self.last, REPLAY_PAGE).await {
            // Pruned between the check above and this page (or between pages): a gap.
            Ok(page) if page.first().is_some_and(|r| r.revision > self.last + 1) => {
                self.history_pruned(until);
            }
            Ok(page) => {
                for revision in page.iter().filter(|r| r.revision <= upto) {
                    let event = RevisionEvent::of_store(revision);
                    let id = EventId::new(revision.revision, revision.commit_id);
                    self.pending.push_back(frame("revision", Some(id), &event));
                    (self.last, self.last_commit) = (id.revision, id.commit);
                }
                if page.last().is_none_or(|r| r.revision >= upto) && upto > self.last {
                    // Revisions the store does not list (none up to `upto`): their commit is
                    // not known here.
                    (self.last, self.last_commit) = (upto, 0);
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "replaying revisions for an event stream failed");
                // The reader goes on from the index; it is told how many revisions it missed.
                let missed = upto - self.last;
                (self.last, self.last_commit) = (upto, 0);
                self.pending
                    .push_back(frame("lagged", None, &LaggedEvent { missed }));
            }
        }
    }

    fn history_pruned(&mut self, until: u64) {
        (self.last, self.last_commit) = (until, self.slot.joined_commit);
        self.pending
            .push_back(reset_frame(self.last_id(), ResetReason::HistoryPruned));
    }
}
