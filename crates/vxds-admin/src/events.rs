//! `GET /v1/events`: a Server-Sent Events stream of what happens, as it happens.
//!
//! - `revision` (id = the revision number): each committed revision with its author, message
//!   and the resources it changed, taken from the index's change lists — a reader costs the
//!   database nothing while it follows;
//! - `client_connected`, `client_disconnected`, `ack`, `nack` (with the client's error text):
//!   from the xDS server's bounded broadcast (`vxds_xds::events`); a reader too slow for it
//!   gets `lagged` with how many it missed, and never slows a stream;
//! - `hello` once caught up (id = the revision the reader is current with), `reset` when the
//!   store's head went backwards (a restored database) or a resuming reader's revisions were
//!   pruned by the history retention.
//!
//! Resumable: with `Last-Event-ID: N` the stream first replays every revision after N —
//! from the index's recent change lists, or from the store's history for what the index no
//! longer remembers (if the store cannot answer, `lagged` says how many were skipped) — then
//! goes live. Client events are not replayed: they describe the
//! present, which `GET /v1/clients` shows whole. Keep-alive comments keep proxies from
//! closing an idle stream, and the stream ends when the server starts draining.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures::Stream;
use serde::Serialize;
use tokio::sync::{broadcast, mpsc};
use utoipa::ToSchema;
use vxds_envoy::resource::ResourceType;
use vxds_store::{ResourceKey, Snapshot};
use vxds_xds::ClientEvent;

use crate::AdminState;
use crate::problem::{ApiError, ProblemBody, ReadProblems};
use crate::repr::timestamp;

/// The default interval of keep-alive comments.
pub const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// Events queued per reader before its task waits for it (the task, not the xDS server).
const QUEUE: usize = 64;

/// Revisions read from the store per page when replaying beyond the index's memory.
const REPLAY_PAGE: usize = 500;

/// A committed revision (`event: revision`, `id:` its number).
#[derive(Debug, Serialize, ToSchema)]
pub struct RevisionEvent {
    pub revision: u64,
    /// RFC 3339.
    pub committed_at: String,
    /// The name of the token that wrote it.
    pub author: Option<String>,
    pub message: Option<String>,
    /// The resources it created, updated or deleted.
    pub changed: Vec<ChangedName>,
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

/// `event: lagged`: the reader missed `missed` events — client events it was too slow for, or
/// revisions the store could not replay on a resume (the stream then goes on from the index).
#[derive(Debug, Serialize, ToSchema)]
pub struct LaggedEvent {
    pub missed: u64,
}

/// `event: reset`: the store's head went backwards (a restored database), or a resuming
/// reader's revisions were pruned by the history retention; revisions continue from
/// `revision`.
#[derive(Debug, Serialize, ToSchema)]
pub struct ResetEvent {
    pub revision: u64,
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
        type_url: key.type_url.clone(),
        alias: ResourceType::resolve(&key.type_url)
            .ok()
            .and_then(|t| t.alias()),
        name: key.name.clone(),
    }
}

/// `Last-Event-ID`, if given: a revision number.
fn last_event_id(headers: &HeaderMap) -> Result<Option<u64>, ApiError> {
    let Some(value) = headers.get("last-event-id") else {
        return Ok(None);
    };
    let text = value.to_str().unwrap_or_default().trim();
    // An empty id is how a browser's EventSource says it has none.
    if text.is_empty() {
        return Ok(None);
    }
    text.parse::<u64>()
        .ok()
        .filter(|n| *n <= i64::MAX as u64)
        .map(Some)
        .ok_or_else(|| {
            ApiError::bad_header(
                "last-event-id",
                "invalid_event_id",
                "must be a revision number (the id of a `revision` or `hello` event)",
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
        ("Last-Event-ID" = Option<u64>, Header, description = "Resume: replay every revision after this one first"),
    ),
    responses(
        (status = 200, description = "A `text/event-stream`: with `Last-Event-ID`, the revisions after it replayed first; then `hello` (id: the revision the reader is current with); then live `revision` events (id: the revision number), `client_connected`, `client_disconnected`, `ack`, `nack` (with the client's error text), `lagged` (client events missed by a slow reader) and `reset` (the head went backwards, or the revisions after `Last-Event-ID` were pruned by the history retention); keep-alive comments while idle. Each `data:` is the JSON of the `StreamEvent` variant the `event:` names (`client` for the four client events, told apart by their `event` field).", body = StreamEvent, content_type = "text/event-stream"),
        (status = 400, description = "A `Last-Event-ID` that is not a revision number", body = ProblemBody, content_type = "application/problem+json"),
        ReadProblems,
    ),
    security(("bearer" = []), ())
)]
pub async fn events(
    State(state): State<AdminState>,
    headers: HeaderMap,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let resume = last_event_id(&headers)?;
    let (tx, mut rx) = mpsc::channel(QUEUE);
    let keep_alive = state.events_keep_alive;
    tokio::spawn(follow(state, resume, tx));
    let stream = futures::stream::poll_fn(move |cx| rx.poll_recv(cx).map(|e| e.map(Ok)));
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(keep_alive)))
}

/// The reader left.
struct Gone;

async fn send(tx: &mpsc::Sender<Event>, event: Event) -> Result<(), Gone> {
    tx.send(event).await.map_err(|_| Gone)
}

fn json_event(name: &str, data: &impl Serialize) -> Event {
    Event::default()
        .event(name)
        .json_data(data)
        .unwrap_or_else(|_| Event::default().event(name))
}

/// The head went back to `revision` (a restored database); its id is where to resume.
fn reset_event(revision: u64) -> Event {
    json_event("reset", &ResetEvent { revision }).id(revision.to_string())
}

fn revision_event(event: &RevisionEvent) -> Event {
    json_event("revision", event).id(event.revision.to_string())
}

/// How long a reader resuming from a revision this replica's index has not reached yet waits
/// for it, before it is told the head went backwards.
const RESUME_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Feeds one reader until it leaves or the server drains.
async fn follow(state: AdminState, resume: Option<u64>, tx: mpsc::Sender<Event>) {
    // Subscribed before anything is read, so nothing falls between the replay and live.
    let mut snapshots = state.index.subscribe();
    let mut clients = state.clients.as_ref().map(|r| r.events.subscribe());
    let mut draining = state.draining.clone();
    let mut snapshot = snapshots.borrow_and_update().clone();
    if let Some(resume) = resume
        && resume > snapshot.revision
    {
        // A reader ahead of this replica's index: another replica served it, or it resumes
        // from the revision its own write returned, which the index takes in a moment after
        // the commit. Only if the index does not get there is the head behind it (a restored
        // database).
        if let Ok(caught_up) = tokio::time::timeout(RESUME_WAIT, state.index.wait_for(resume)).await
        {
            snapshot = caught_up;
        }
    }
    let mut last = resume.unwrap_or(snapshot.revision);
    if last > snapshot.revision {
        last = snapshot.revision;
        if send(&tx, reset_event(last)).await.is_err() {
            return;
        }
    }
    // The replay first, then `hello`: its id is where a reader that drops now resumes.
    if catch_up(&state, &snapshot, &mut last, &tx).await.is_err() {
        return;
    }
    let hello = HelloEvent {
        revision: last,
        clients: clients.is_some(),
    };
    if send(&tx, json_event("hello", &hello).id(last.to_string()))
        .await
        .is_err()
    {
        return;
    }
    loop {
        tokio::select! {
            changed = snapshots.changed() => {
                if changed.is_err() {
                    return;
                }
                let snapshot = snapshots.borrow_and_update().clone();
                if snapshot.revision < last {
                    last = snapshot.revision;
                    if send(&tx, reset_event(last)).await.is_err() {
                        return;
                    }
                }
                if catch_up(&state, &snapshot, &mut last, &tx).await.is_err() {
                    return;
                }
            }
            event = next_client_event(&mut clients) => {
                let event = match event {
                    Ok(event) => json_event(event.name(), &*event),
                    Err(broadcast::error::RecvError::Lagged(missed)) => {
                        json_event("lagged", &LaggedEvent { missed })
                    }
                    Err(broadcast::error::RecvError::Closed) => {
                        clients = None;
                        continue;
                    }
                };
                if send(&tx, event).await.is_err() {
                    return;
                }
            }
            () = tx.closed() => return,
            () = until_draining(&mut draining) => return,
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

async fn until_draining(draining: &mut Option<tokio::sync::watch::Receiver<bool>>) {
    match draining {
        Some(d) => {
            if d.wait_for(|draining| *draining).await.is_err() {
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending().await,
    }
}

/// Sends every revision after `last` up to `snapshot`'s: from the index's change lists, and
/// from the store's history for the older ones the index no longer keeps.
async fn catch_up(
    state: &AdminState,
    snapshot: &Snapshot,
    last: &mut u64,
    tx: &mpsc::Sender<Event>,
) -> Result<(), Gone> {
    if snapshot.revision <= *last {
        return Ok(());
    }
    let oldest_remembered = snapshot
        .revisions_since(*last)
        .next()
        .map_or(snapshot.revision + 1, |r| r.revision);
    // A reader resuming from before what the history retention kept cannot be told what it
    // missed: it starts over from the present.
    if *last + 1 < oldest_remembered
        && let Ok(oldest_kept) = state.store.oldest_kept_revision().await
        && *last + 1 < oldest_kept
    {
        *last = snapshot.revision;
        return send(tx, reset_event(*last)).await;
    }
    // What the index forgot (or a reader resuming from long ago): the store's history, a page
    // at a time, once for this reader.
    while *last + 1 < oldest_remembered {
        let page = match state.store.revisions(*last, REPLAY_PAGE).await {
            Ok(page) => page,
            Err(e) => {
                tracing::warn!(error = %e, "replaying revisions for an event stream failed");
                // The reader resumes from the index; it is told which revisions it missed.
                let missed = oldest_remembered - *last - 1;
                *last = oldest_remembered - 1;
                return send(tx, json_event("lagged", &LaggedEvent { missed })).await;
            }
        };
        let Some(newest) = page.last().map(|r| r.revision) else {
            break;
        };
        for revision in page.iter().filter(|r| r.revision < oldest_remembered) {
            let event = RevisionEvent {
                revision: revision.revision,
                committed_at: timestamp(revision.created_at_ms),
                author: revision.author.clone(),
                message: revision.message.clone(),
                changed: revision
                    .changes
                    .iter()
                    .map(|c| changed_name(&c.key))
                    .collect(),
            };
            send(tx, revision_event(&event)).await?;
            *last = revision.revision;
        }
        if newest >= oldest_remembered - 1 {
            break;
        }
    }
    for change in snapshot.revisions_since(*last) {
        let event = RevisionEvent {
            revision: change.revision,
            committed_at: timestamp(change.committed_at_ms),
            author: change.author.as_deref().map(str::to_owned),
            message: change.message.as_deref().map(str::to_owned),
            changed: change.changed.iter().map(changed_name).collect(),
        };
        send(tx, revision_event(&event)).await?;
        *last = change.revision;
    }
    *last = (*last).max(snapshot.revision);
    Ok(())
}
