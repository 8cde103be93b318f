//! A node that reconnects answers for what its previous stream left open.
//!
//! A stream ends without being gone for good: Envoy reconnects when a connection reaches its
//! maximum age or a replica drains it, usually within a second. Counted `gone` at once (which
//! a rollout's state ignores), a revision whose only concerned stream reconnected would be
//! complete before the new stream answered — and stay so though it then refused the revision.
//! So the revisions a stream of a known node leaves open and unanswered stay pending for
//! [`RECONNECT_GRACE`]: a new stream of the same node on the same service and replica within it
//! takes them over (its answers decide them); after it they count as gone.
//!
//! Bounded: at most [`MAX_PARKED_NODES`] nodes wait, each with at most
//! [`super::MAX_CONCERNS`] revisions; beyond, revisions count as gone at once.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::Rollouts;

/// How long a node's open revisions wait for it to reconnect.
pub const RECONNECT_GRACE: Duration = Duration::from_secs(30);
/// Nodes whose revisions wait at once (a mass disconnect beyond counts the rest as gone).
pub const MAX_PARKED_NODES: usize = 65_536;

/// Who a stream's client is, for taking over: the service it uses and its node id.
pub type NodeKey = (&'static str, String);

/// Revisions waiting for their node to reconnect, by node.
#[derive(Debug, Default)]
pub(super) struct Parked {
    by_node: HashMap<NodeKey, Vec<Left>>,
}

/// A revision a stream left open.
#[derive(Debug)]
struct Left {
    revision: u64,
    /// The types it waited for (type URLs: the next stream numbers its types anew).
    types: Vec<&'static str>,
    at: Instant,
}

impl Rollouts {
    /// Open revisions wait this long for their node to reconnect (`Duration::ZERO`: they
    /// count as gone at once, as [`Rollouts::default`] does).
    pub fn with_reconnect_grace(mut self, grace: Duration) -> Self {
        self.reconnect_grace = grace;
        self
    }

    /// A stream of `node` left with `revision` open and unanswered, waiting for `types`: it
    /// stays pending for a new stream of the node. `false` when it cannot wait (no grace, too
    /// many nodes waiting): it is the caller's to count as gone.
    pub(super) fn park(&self, node: &NodeKey, revision: u64, types: Vec<&'static str>) -> bool {
        if self.reconnect_grace.is_zero() {
            return false;
        }
        let Ok(mut parked) = self.parked.lock() else {
            return false;
        };
        if !parked.by_node.contains_key(node) && parked.by_node.len() >= MAX_PARKED_NODES {
            return false;
        }
        let left = parked.by_node.entry(node.clone()).or_default();
        if left.len() >= super::MAX_CONCERNS {
            return false;
        }
        left.push(Left {
            revision,
            types,
            at: Instant::now(),
        });
        true
    }

    /// What a previous stream of `node` left open, within the grace: the new stream takes it
    /// over, `(revision, types)`.
    pub(super) fn adopt(&self, node: &NodeKey) -> Vec<(u64, Vec<&'static str>)> {
        self.expire_parked();
        let Ok(mut parked) = self.parked.lock() else {
            return Vec::new();
        };
        parked
            .by_node
            .remove(node)
            .unwrap_or_default()
            .into_iter()
            .map(|left| (left.revision, left.types))
            .collect()
    }

    /// Revisions whose node did not come back within the grace count as gone. Looked at
    /// whenever the records are read (a wait re-reads them every 250 ms, the client summary
    /// every period), so no timer runs for it.
    pub(super) fn expire_parked(&self) {
        let expired: Vec<u64> = {
            let Ok(mut parked) = self.parked.lock() else {
                return;
            };
            if parked.by_node.is_empty() {
                return;
            }
            let grace = self.reconnect_grace;
            let mut expired = Vec::new();
            parked.by_node.retain(|_, left| {
                left.retain(|l| {
                    let waiting = l.at.elapsed() < grace;
                    if !waiting {
                        expired.push(l.revision);
                    }
                    waiting
                });
                !left.is_empty()
            });
            expired
        };
        for revision in expired {
            self.gone(revision, false);
        }
    }

    /// A reload: what waited refers to revision numbers that now name other content.
    pub(super) fn forget_parked(&self) {
        if let Ok(mut parked) = self.parked.lock() {
            parked.by_node.clear();
        }
    }
}
