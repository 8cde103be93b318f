//! What happens to clients, as it happens: streams connecting and leaving, responses accepted
//! and refused. `GET /v1/events` forwards these to operators.
//!
//! One bounded broadcast channel per server. Sending never waits: a reader that falls more
//! than [`CAPACITY`] events behind loses the oldest ones and is told how many it missed
//! (`RecvError::Lagged`), so a slow reader never slows an xDS stream. Streams build an event
//! only while someone listens.

use std::sync::Arc;

use serde::Serialize;
use tokio::sync::broadcast;

use crate::status::ClientStatus;

/// Events kept for readers that are behind.
pub const CAPACITY: usize = 1024;

/// One thing that happened to a client.
#[derive(Clone, Debug, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum ClientEvent {
    /// A stream's first request arrived: the node is known.
    ClientConnected(StreamInfo),
    /// A stream ended.
    ClientDisconnected(StreamInfo),
    /// The client accepted a response.
    Ack(Answer),
    /// The client refused a response; `message` is its error text.
    Nack(Answer),
    /// A revision's rollout on this replica moved: a stream accepted or refused it, or it was
    /// told to every stream. `GET /v1/revisions/{n}/rollout` has the fleet's status.
    Rollout(RolloutProgress),
}

/// This replica's counts of a revision's rollout (see `vxds_core::rollout::RolloutRecord`).
#[derive(Clone, Debug, Default, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RolloutProgress {
    pub revision: u64,
    pub streams: u64,
    pub acked: u64,
    pub nacked: u64,
    pub pending: u64,
    pub gone: u64,
    /// Streams still working out whether the revision changes anything they resolve.
    pub undecided: u64,
}

impl ClientEvent {
    /// The SSE event name.
    pub fn name(&self) -> &'static str {
        match self {
            ClientEvent::ClientConnected(_) => "client_connected",
            ClientEvent::ClientDisconnected(_) => "client_disconnected",
            ClientEvent::Ack(_) => "ack",
            ClientEvent::Nack(_) => "nack",
            ClientEvent::Rollout(_) => "rollout",
        }
    }
}

/// Which stream, and whose.
#[derive(Clone, Debug, Default, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StreamInfo {
    pub stream_id: u64,
    pub node_id: String,
    pub node_cluster: String,
    /// `ads`, or the per-type service (`lds`, `cds`, ...).
    pub service: &'static str,
    /// `sotw` or `delta`.
    pub protocol: &'static str,
    /// e.g. `envoy 1.40.0`.
    pub user_agent: String,
    /// RFC 3339.
    pub at: String,
}

/// A client's answer to a response.
#[derive(Clone, Debug, Default, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Answer {
    pub stream_id: u64,
    pub node_id: String,
    pub type_url: String,
    /// The version the client now holds (SotW; empty for Delta).
    pub version: String,
    pub nonce: String,
    /// The client's error text (NACKs only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// RFC 3339.
    pub at: String,
}

/// The server's client events. Cheap to clone.
#[derive(Clone, Debug)]
pub struct ClientEvents {
    sender: Arc<broadcast::Sender<Arc<ClientEvent>>>,
}

impl Default for ClientEvents {
    fn default() -> Self {
        Self::with_capacity(CAPACITY)
    }
}

impl ClientEvents {
    /// A channel that keeps `capacity` events for readers that are behind.
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            sender: Arc::new(broadcast::channel(capacity.max(1)).0),
        }
    }

    /// Events from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<ClientEvent>> {
        self.sender.subscribe()
    }

    /// Whether anyone listens: streams skip building events otherwise.
    pub fn is_watched(&self) -> bool {
        self.sender.receiver_count() > 0
    }

    /// Sends without waiting; with no reader the event is dropped.
    pub fn send(&self, event: ClientEvent) {
        let _ = self.sender.send(Arc::new(event));
    }
}

impl StreamInfo {
    /// The stream as its status shows it now.
    pub(crate) fn of(status: &ClientStatus) -> Self {
        Self {
            stream_id: status.stream_id,
            node_id: status.node_id.clone(),
            node_cluster: status.node_cluster.clone(),
            service: status.service,
            protocol: status.protocol,
            user_agent: status.user_agent.clone(),
            at: now(),
        }
    }
}

impl Answer {
    /// The answer the status last recorded for `type_url`: the refusal when `nacked`.
    pub(crate) fn of(status: &ClientStatus, type_url: &str, nacked: bool) -> Option<Self> {
        let entry = status.types.iter().find(|t| t.type_url == type_url)?;
        let (version, nonce, message, at) = if nacked {
            let n = entry.last_nacked.as_ref()?;
            let message = Some(n.message.clone());
            (n.version.clone(), n.nonce.clone(), message, n.at.clone())
        } else {
            let a = entry.last_acked.as_ref()?;
            (
                a.version.to_string(),
                a.nonce.to_string(),
                None,
                a.at.rfc3339(),
            )
        };
        Some(Self {
            stream_id: status.stream_id,
            node_id: status.node_id.clone(),
            type_url: type_url.to_owned(),
            version,
            nonce,
            message,
            at,
        })
    }
}

/// A stream that has announced itself: says goodbye when dropped, however the stream ends.
#[derive(Debug)]
pub(crate) struct Presence {
    events: ClientEvents,
    status: Arc<std::sync::Mutex<ClientStatus>>,
}

impl Presence {
    /// Sends `client_connected` for the stream `status` describes.
    pub(crate) fn announce(
        events: &ClientEvents,
        status: Arc<std::sync::Mutex<ClientStatus>>,
    ) -> Self {
        if events.is_watched()
            && let Ok(s) = status.lock()
        {
            events.send(ClientEvent::ClientConnected(StreamInfo::of(&s)));
        }
        Self {
            events: events.clone(),
            status,
        }
    }
}

impl Drop for Presence {
    fn drop(&mut self) {
        if self.events.is_watched()
            && let Ok(s) = self.status.lock()
        {
            self.events
                .send(ClientEvent::ClientDisconnected(StreamInfo::of(&s)));
        }
    }
}

fn now() -> String {
    use time::OffsetDateTime;
    use time::format_description::well_known::Rfc3339;
    OffsetDateTime::now_utc()
        .format(&Rfc3339)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_reader_that_falls_behind_is_told_how_much_it_missed() {
        let events = ClientEvents::with_capacity(4);
        assert!(!events.is_watched());
        // Nobody listens: nothing is kept, nothing fails.
        events.send(ClientEvent::Ack(Answer::default()));
        let mut reader = events.subscribe();
        assert!(events.is_watched());
        for stream_id in 0..10 {
            events.send(ClientEvent::Nack(Answer {
                stream_id,
                message: Some("refused".into()),
                ..Answer::default()
            }));
        }
        match reader.recv().await {
            Err(broadcast::error::RecvError::Lagged(missed)) => assert_eq!(missed, 6),
            other => panic!("expected a lag, got {other:?}"),
        }
        let next = reader.recv().await.unwrap();
        let ClientEvent::Nack(answer) = &*next else {
            panic!("{next:?}")
        };
        assert_eq!(answer.stream_id, 6);
        assert_eq!(
            serde_json::to_value(&*next).unwrap()["event"],
            serde_json::json!("nack")
        );
    }
}
