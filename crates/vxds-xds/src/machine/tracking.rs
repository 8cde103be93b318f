//! What the machine tells rollout tracking (`crate::rollout`): the removals it holds back, by
//! name; what the resources it sends name that the client fetches next; and what the client
//! subscribes to and was sent.

use std::sync::Arc;

use vxds_store::Snapshot;

use super::StreamMachine;
use crate::rollout::{Dependency, HeldRemoval, Subscriptions};
use crate::types;

impl StreamMachine {
    /// Asks the next poll to find what the resources it sends name that the client does not
    /// hold ([`Self::dependencies`]): rollout tracking waits for the client to fetch them.
    /// Only on an ADS stream: on a per-type service the client fetches what a resource names
    /// on another stream (an LDS stream never carries the routes its listeners name), and
    /// nothing on this one would ever answer for it.
    pub fn follow_references(&mut self, on: bool) {
        self.follow_references = on && self.service.type_url.is_none();
    }

    /// What the resources sent in the last poll name that the client does not hold accepted
    /// and is to fetch (when it was asked to follow them): each exists in the snapshot, and
    /// either the client does not subscribe to it yet, or a response carrying it is in flight.
    /// What it subscribes to and does not get does not exist for it (it was told). A cluster
    /// is followed only when the client already subscribes to it by name and a response in
    /// flight carries it: Envoy holds every cluster (a wildcard, skipped up front) or its own
    /// static ones, or fetches one on demand (ODCDS) when traffic asks for it; gRPC subscribes
    /// to the clusters of the one virtual host its target matches, of all a route names.
    pub fn dependencies(&self) -> &[Dependency] {
        &self.dependencies
    }

    pub(super) fn follow(&mut self, snapshot: &Snapshot) {
        // Clusters only by name: none when the client takes them all, or none at all.
        let clusters_by_name = self
            .types
            .get(types::CLUSTER)
            .is_some_and(|t| !t.wildcard());
        for (from_type, state) in &self.types {
            for (from_name, item) in &state.referencing {
                for (type_url, name) in &item.variant().references {
                    let cluster = *type_url == types::CLUSTER;
                    if cluster && !clusters_by_name {
                        continue;
                    }
                    let target = self.types.get(*type_url);
                    let nonce = match target {
                        Some(ty) if ty.holds_accepted(name) => continue,
                        Some(ty) if cluster && !ty.subscribes_by_name(name) => continue,
                        Some(ty) if ty.subscribes(name) => match ty.in_flight_carrying(name) {
                            Some(seq) => Some(seq),
                            None => continue,
                        },
                        None if cluster => continue,
                        _ if snapshot.get(type_url, name).is_none() => continue,
                        _ => None,
                    };
                    self.dependencies.push(Dependency {
                        from_type: (*from_type).to_owned(),
                        from_name: from_name.clone(),
                        type_url,
                        name: name.clone(),
                        nonce,
                    });
                }
            }
        }
        for ty in self.types.values_mut() {
            ty.follow_references = false;
            ty.referencing.clear();
        }
    }

    /// The removals due and held back until earlier responses are answered
    /// (make-before-break), each with whether it became due in the last poll: the revisions
    /// that made them are not rolled out before they go.
    pub fn held_removals(&self) -> Vec<HeldRemoval<'_>> {
        let mut held = Vec::new();
        for (type_url, t) in self.types.iter().filter(|(_, t)| t.removals_waiting()) {
            for key in t.removals_held() {
                held.push(HeldRemoval {
                    type_url,
                    name: key.name(),
                    due_now: t.removals_due_now.contains(key),
                });
            }
        }
        held
    }
}

impl Subscriptions for StreamMachine {
    fn in_sync(&self, type_url: &str) -> bool {
        self.types.get(type_url).is_some_and(|ty| ty.in_sync())
    }

    fn subscribes(&self, type_url: &str, name: &str) -> bool {
        self.types
            .get(type_url)
            .is_some_and(|ty| ty.subscribes(&Arc::from(name)))
    }

    fn still_names(
        &self,
        from_type: &str,
        from_name: &Arc<str>,
        type_url: &str,
        name: &str,
    ) -> bool {
        let item = self
            .types
            .get(from_type)
            .and_then(|ty| ty.sent_item(from_name));
        item.is_some_and(|item| {
            (item.variant().references.iter()).any(|(t, n)| *t == type_url && **n == *name)
        })
    }
}
