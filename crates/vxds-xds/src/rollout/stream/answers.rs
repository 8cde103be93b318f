//! The client's answers to what a stream sent — ACKs, NACKs, unsubscriptions — and the
//! revisions they settle.

use std::collections::HashSet;

use vxds_core::rollout::RolloutNack;

use super::{Concern, NameHash, StreamRollout, name_hash};

impl StreamRollout {
    /// The client accepted the response of `type_url` with `nonce` (and so every earlier one).
    pub fn acked(&mut self, type_url: &str, nonce: Option<u64>) {
        self.sync_epoch();
        let (Some(i), Some(nonce)) = (self.find_type(type_url), nonce) else {
            return;
        };
        let t = &mut self.types[i];
        let Some(at) = t.in_flight.iter().position(|f| f.nonce == nonce) else {
            return; // a heartbeat's, or one too old to remember: nothing newer was accepted
        };
        let revision = t.in_flight[at].revision;
        // Delta: what the accepted responses carried again is refused no more.
        let refusals = self.concerns.iter().any(|c| !c.refused.is_empty());
        for f in t.in_flight.drain(..=at) {
            if refusals {
                for c in &mut self.concerns {
                    accept_again(&mut c.refused, i, &f.names);
                }
            }
        }
        t.accepted_nonce = t.accepted_nonce.max(nonce);
        // A Delta response computed from a revision the client refused of this type (the
        // removals the refusal released) never carries the refused resources again: it does
        // not show the refused revision as what the client runs.
        if !(self.delta && revision <= t.refused) {
            t.accepted = t.accepted.max(revision);
        }
        self.settle();
    }

    /// The client unsubscribed from `names` of `type_url` (Delta): what it refused of them,
    /// and what revisions waited to be sent of them, is behind it.
    pub fn unsubscribed(&mut self, type_url: &str, names: &[String]) {
        self.sync_epoch();
        let Some(i) = self.find_type(type_url) else {
            return;
        };
        let waits = |c: &Concern| {
            c.refused.iter().any(|&(ty, _)| ty == i) || c.needs.iter().any(|n| n.ty == i)
        };
        if !self.concerns.iter().any(waits) {
            return;
        }
        // Each name hashed once: a request may unsubscribe from many names.
        let hashes: HashSet<NameHash> = names.iter().map(|n| name_hash(n)).collect();
        let names: HashSet<&str> = names.iter().map(String::as_str).collect();
        let mut changed = false;
        for c in &mut self.concerns {
            let before = (c.refused.len(), c.needs.len());
            c.refused.retain(|&(ty, h)| ty != i || !hashes.contains(&h));
            c.needs.retain(|n| n.ty != i || !names.contains(&*n.name));
            changed |= before != (c.refused.len(), c.needs.len());
        }
        if changed {
            self.settle();
        }
    }

    /// Counts as accepted the revisions that wait for nothing more: their types accepted at
    /// their revision or later, their held-back removals gone and accepted, what their
    /// resources name sent and accepted, and (Delta) nothing they refused left.
    pub(super) fn settle(&mut self) {
        let types = &self.types;
        let rollouts = &self.rollouts;
        let stream_id = self.stream_id;
        self.concerns.retain(|c| {
            let done = c.awaiting.is_empty()
                && c.refused.is_empty()
                && c.types.iter().all(|&i| types[i].accepted >= c.revision)
                && (c.removals.iter()).all(|&(i, n)| types[i].accepted_nonce >= n)
                && (c.needs.iter())
                    .all(|n| n.nonce.is_some_and(|m| types[n.ty].accepted_nonce >= m));
            if done {
                rollouts.acked(c.revision, stream_id, c.nacked);
            }
            !done
        });
    }

    /// The client refused the response of `type_url` with `nonce`, saying `error`: the
    /// revisions up to the one that response was computed from that changed the type and are
    /// not yet accepted are refused, and so are those waiting for what it carried (their
    /// removals, what their resources name).
    pub fn nacked(&mut self, type_url: &str, nonce: Option<u64>, node: &str, error: &str) {
        self.sync_epoch();
        let (Some(i), Some(nonce)) = (self.find_type(type_url), nonce) else {
            return;
        };
        let delta = self.delta;
        let t = &mut self.types[i];
        let Some(at) = t.in_flight.iter().position(|f| f.nonce == nonce) else {
            return;
        };
        let refused = t.in_flight[at].revision;
        let names = t.in_flight[at].names.clone();
        for f in t.in_flight.drain(..at) {
            // Delta: clients answer in order, so those before it were taken without a word.
            if delta {
                t.accepted_nonce = t.accepted_nonce.max(f.nonce);
                for c in &mut self.concerns {
                    accept_again(&mut c.refused, i, &f.names);
                }
            }
        }
        t.in_flight.pop_front();
        t.refused = t.refused.max(refused);
        let (accepted, accepted_nonce) = (t.accepted, t.accepted_nonce);
        for c in &mut self.concerns {
            let of_revision =
                c.revision <= refused && accepted < c.revision && c.types.contains(&i);
            if !(of_revision || c.waits_on(i, nonce, accepted_nonce, delta)) {
                continue;
            }
            c.refused.extend(names.iter().map(|&h| (i, h)));
            if c.nacked {
                continue; // one refusal per stream and revision, one text
            }
            c.nacked = true;
            self.rollouts.nacked(
                c.revision,
                RolloutNack {
                    node: node.to_owned(),
                    type_url: type_url.to_owned(),
                    error: error.to_owned(),
                    replica: String::new(),
                    stream_id: self.stream_id,
                },
            );
        }
    }
}

/// What a response of type `ty` that the client accepted carried again, `names`, is refused
/// no more: in proportion to what it carried.
fn accept_again(refused: &mut HashSet<(usize, NameHash)>, ty: usize, names: &[NameHash]) {
    if refused.is_empty() {
        return;
    }
    for &h in names {
        refused.remove(&(ty, h));
    }
}
