//! Closing the gap between what a client should have and what it has: the *make* phase
//! (additions, updates, variant swaps, and what does not exist) and the *break* phase
//! (removals), the responses that carry them, and the client's answers, which decide when a
//! removal may go (A74: never while an update computed before it is unanswered or refused).

use std::collections::BTreeSet;
use std::sync::Arc;

use super::accepted::Carried;
use super::sotw_state::{SotwState, shared_state};
use super::*;
use crate::wire::{DeltaResponse, Naming, RemovedName, SotwResponse, Wrapped};

impl TypeState {
    // ---- closing the gap -----------------------------------------------------------------

    /// The sequence numbers of the earliest response of this type that is sent and unanswered
    /// (a SotW response answers for those it superseded), and of the earliest refused and not
    /// yet followed by an accepted one. `u64::MAX` when there is none.
    pub fn unsettled_from(&self) -> (u64, u64) {
        let unanswered = self.outstanding.iter().map(|(_, o)| o.since).min();
        let refused = self.refused.map(|r| r.since);
        (unanswered.unwrap_or(u64::MAX), refused.unwrap_or(u64::MAX))
    }

    /// SotW: the client answered a response that a later one superseded (its requests lag
    /// behind under churn; Envoy answers every response). An acceptance means it holds that
    /// response's state, and settles every response up to that one, so the latest outstanding
    /// response no longer stands for them; a refusal leaves it with what it had. Whether it
    /// accepted a response still in flight: a nonce already answered accepts nothing again
    /// (Envoy's legacy mux stamps requests after a NACK with the refused nonce, no error).
    pub fn answer_superseded(&mut self, nonce: &str, accepted: bool) -> bool {
        let Ok(answered) = nonce.parse::<u64>() else {
            return false;
        };
        if !self.answer_superseded_state(answered, accepted) {
            return false;
        }
        // Only an answer to a response in flight shows a client that keeps up; what is
        // still unanswered is what was sent after it.
        self.unanswered = self.unacked.len();
        if !accepted {
            return false;
        }
        for (_, outstanding) in self.outstanding.iter_mut() {
            if outstanding.since <= answered && answered < outstanding.seq {
                outstanding.since = answered + 1;
            }
        }
        true
    }

    /// A type the client no longer watches (it unsubscribed from everything): it answers
    /// nothing of that type any more (Envoy drops responses for unwatched types), so nothing
    /// may wait for such an answer, and nothing is sent.
    pub fn release_if_unwatched(&mut self) {
        if self.seen_request && !self.wildcard() && !self.has_subscriptions() {
            self.outstanding.clear();
            self.unacked.clear();
            self.unanswered = 0;
            self.refused = None;
            self.force_send = false;
        }
    }

    /// Stamps removals that just became due with `seq`, the last response sent so far: they
    /// may go once every response up to it is accepted.
    pub fn stamp_removals(&mut self, seq: u64) {
        // Removals are among the dirty items: none, none due (nearly every poll).
        if self.dirty.is_empty() {
            self.removal_stamps.clear();
            return;
        }
        let due: BTreeSet<ItemKey> = self.pending_removals().cloned().collect();
        self.removal_stamps.retain(|k, _| due.contains(k));
        for key in due {
            if let std::collections::btree_map::Entry::Vacant(v) =
                self.removal_stamps.entry(key.clone())
            {
                v.insert(seq);
                self.removals_due_now.push(key);
            }
        }
    }

    /// Whether the removal of `key` may go: every response up to its stamp is answered, and
    /// none of them refused — or, if one was, nothing the client accepted names `key` (a
    /// refused update never holds back a removal nothing the client holds needs).
    fn removal_eligible(&self, key: &ItemKey, settled: &Settled) -> bool {
        self.removal_stamps.get(key).is_some_and(|stamp| {
            *stamp < settled.unanswered_before
                && (*stamp < settled.refused_before
                    || !settled.references(&self.type_url, key.name()))
        })
    }

    /// Additions or updates the client does not have yet.
    fn pending_upserts(&self) -> impl Iterator<Item = (&ItemKey, &Item)> {
        self.dirty.iter().filter_map(|k| {
            let item = self.desired.get(k)?;
            let current = self.sent.get(k).map(Sent::version);
            (current != Some(item.version())).then_some((k, item))
        })
    }

    /// Removals pending: what the client has that it should no longer have.
    fn pending_removals(&self) -> impl Iterator<Item = &ItemKey> {
        self.dirty
            .iter()
            .filter(|k| self.sent.contains_key(*k) && !self.desired.contains_key(*k))
    }

    /// What is dirty and neither to send nor to remove needs no attention any more (desired
    /// looked up first: nearly everything dirty was just sent, one search each). Usually
    /// nothing is left: the set is cleared without a walk that rebuilds it.
    fn keep_only_pending_removals_dirty(&mut self) {
        let pending = |k: &ItemKey| !self.desired.contains_key(k) && self.sent.contains_key(k);
        if self.dirty.iter().any(pending) {
            self.dirty.retain(|k| pending(k));
        } else {
            self.dirty.clear();
        }
    }

    fn eligible_removals<'s>(&'s self, settled: &'s Settled) -> impl Iterator<Item = &'s ItemKey> {
        self.pending_removals()
            .filter(move |k| self.removal_eligible(k, settled))
    }

    /// A client answered the response `nonce`. `None` when the nonce is not one in flight.
    pub fn answer(
        &mut self,
        nonce: &str,
        error: Option<String>,
        client_version: &str,
    ) -> Option<Ack> {
        let answered = remove_by_seq(&mut self.outstanding, nonce_seq(nonce)?)?;
        // Clients answer in order (Envoy does): an answer to one response answers every
        // earlier one of the type too, and what is left unanswered was sent after it. Only a
        // response in flight counts: a bogus nonce resets nothing.
        self.outstanding.retain(|(_, o)| o.seq > answered.seq);
        self.unanswered = self.outstanding.len();
        let version = answered.version;
        Some(match error {
            Some(message) if !answered.renewing.is_empty() => {
                // Not a refusal of content: the client dropped what the heartbeat renewed.
                // Nothing is held back; what it renewed is sent again, with its body.
                self.refuse(answered.seq);
                self.lapsed(&answered.renewing);
                Ack::Nacked { version, message }
            }
            Some(message) => {
                self.refuse(answered.seq);
                self.nacked_version = Some(version.clone());
                // What was computed after the refused update stays held back (A74).
                let since = self
                    .refused
                    .map_or(answered.since, |r| r.since.min(answered.since));
                self.refused = Some(Refused {
                    seq: answered.seq,
                    since,
                });
                Ack::Nacked { version, message }
            }
            None => {
                self.accept_through(answered.seq);
                // Rewritten in place: once per ACK on every stream.
                match &mut self.accepted_version {
                    Some(accepted) => {
                        accepted.clear();
                        accepted.push_str(&version);
                    }
                    None => self.accepted_version = Some(version.to_string()),
                }
                // A later version accepted: the refusal is behind the client, and the refused
                // content may be sent again if it comes back. A heartbeat is no later version:
                // it renews what the client held when it refused.
                if !answered.heartbeat {
                    if self.refused.is_some_and(|r| answered.seq > r.seq) {
                        self.refused = None;
                    }
                    if self.nacked_version.as_deref() != Some(&*version) {
                        self.nacked_version = None;
                    }
                }
                Ack::Acked {
                    version: if client_version.is_empty() || client_version == &*version {
                        version
                    } else {
                        Arc::from(client_version)
                    },
                }
            }
        })
    }

    /// SotW, make phase: the full state with additions and updates, keeping what is due for
    /// removal until it is eligible (see [`Self::stamp_removals`]). `None` when there is
    /// nothing to say.
    pub fn sotw_make(
        &mut self,
        seq: u64,
        revision: u64,
        wrap_all: bool,
        settled: &Settled,
    ) -> Option<SotwResponse> {
        let has_upserts = self.pending_upserts().next().is_some();
        if !has_upserts && !self.force_send {
            return None;
        }
        let keep = self.sotw_kept(settled);
        self.sotw_respond(seq, revision, wrap_all, keep)
    }

    /// SotW, break phase: the full state without the removals that are eligible.
    pub fn sotw_break(
        &mut self,
        seq: u64,
        revision: u64,
        wrap_all: bool,
        settled: &Settled,
    ) -> Option<SotwResponse> {
        self.eligible_removals(settled).next()?;
        let keep = self.sotw_kept(settled);
        self.sotw_respond(seq, revision, wrap_all, keep)
    }

    /// What the client has and should no longer have, but keeps for now: removals not yet
    /// eligible. A resource whose name the new state carries anyway (another variant of it)
    /// is replaced, not kept: SotW clients key by name, and a name twice is refused.
    fn sotw_kept(&self, settled: &Settled) -> Vec<(ItemKey, Sent)> {
        // What was sent and is not desired is among the dirty items (a pending removal stays
        // dirty until it goes), so only they are looked at, not everything the client holds.
        self.pending_removals()
            .filter(|key| !self.removal_eligible(key, settled) && !self.desires_name(key.name()))
            .filter_map(|key| Some((key.clone(), self.sent.get(key)?.clone())))
            .collect()
    }

    /// Whether the client holds the variant it was sent for the locator `(name, params)`.
    fn locator_held(&self, name: &str, params: &ParamSet) -> bool {
        self.sent_variants(&Arc::from(name)).any(
            |k| matches!(self.sent.get(k), Some(Sent::Delivered(item)) if item.resolves(params)),
        )
    }

    /// Whether the desired state holds something under `name`, by name or as a variant.
    pub(super) fn desires_name(&self, name: &Arc<str>) -> bool {
        let first = ItemKey::Variant(name.clone(), vxds_core::ConstraintsId::MIN);
        let last = ItemKey::Variant(name.clone(), vxds_core::ConstraintsId::MAX);
        self.desired.contains_key(&ItemKey::Name(name.clone()))
            || self.desired.range(first..=last).next().is_some()
    }

    fn sotw_respond(
        &mut self,
        seq: u64,
        revision: u64,
        wrap_all: bool,
        keep: Vec<(ItemKey, Sent)>,
    ) -> Option<SotwResponse> {
        // What was kept and delivered: what the client reported but was never sent cannot
        // be kept.
        let kept: Vec<(ItemKey, Item)> = keep
            .into_iter()
            .filter_map(|(key, sent)| match sent {
                Sent::Delivered(item) => Some((key, item)),
                Sent::Reported(_) => None,
            })
            .collect();
        let state = if kept.is_empty() {
            // Nothing kept for make-before-break (the usual state): the desired items, as
            // every stream of the type that resolves alike sends them.
            shared_state(&self.type_url, revision, self.desired.iter())
        } else {
            // The desired items merged with those kept (never desired, so no key is in
            // both), in key order.
            let mut kept = kept.into_iter().peekable();
            let mut items = Vec::with_capacity(self.desired.len() + kept.len());
            for (key, item) in &self.desired {
                while let Some(held) = kept.next_if(|(k, _)| k < key) {
                    items.push(held);
                }
                items.push((key.clone(), item.clone()));
            }
            items.extend(kept);
            Arc::new(SotwState::new(&self.type_url, items))
        };
        let version = state.version().clone();
        let force = std::mem::take(&mut self.force_send);
        let repeat = self.last_version.as_deref() == Some(&*version);
        let refused = self.nacked_version.as_deref() == Some(&*version);
        if !force && (repeat || refused) {
            self.keep_only_pending_removals_dirty();
            return None;
        }
        self.sent_becomes(state.items());
        self.keep_only_pending_removals_dirty();
        self.last_version = Some(version.clone());
        let nonce = self.sotw_outstanding(seq, &version);
        let resources = state.resources(wrap_all);
        self.carry(seq, Carried::State(state));
        Some(SotwResponse {
            version_info: version,
            resources,
            type_url: self.type_url.clone(),
            nonce,
        })
    }

    /// SotW: what the client holds becomes `state` (sorted by key), changed in place: a
    /// response usually changes one item of many, and the status follows change by change.
    fn sent_becomes(&mut self, state: &[(ItemKey, Item)]) {
        // Usually the same keys as before (a revision changes versions, not names): the
        // values are replaced in place, in one walk without a search by key. A key that
        // differs ends the walk, and the rest goes by key.
        let mut in_step = self.sent.len() == state.len();
        let mut changed = Vec::new();
        if in_step {
            for ((key, sent), (new_key, item)) in self.sent.iter_mut().zip(state) {
                if !key.same(new_key) {
                    in_step = false;
                    break;
                }
                if !matches!(&*sent, Sent::Delivered(held) if held.same(item)) {
                    *sent = Sent::Delivered(item.clone());
                    changed.push((key.clone(), sent.clone()));
                }
            }
        }
        for (key, sent) in changed {
            if let Sent::Delivered(item) = &sent {
                self.note_referencing(&key, item);
            }
            self.log_held(&key, Some(sent));
        }
        if in_step {
            return;
        }
        let gone: Vec<ItemKey> = self
            .sent
            .keys()
            .filter(|k| state.binary_search_by(|(s, _)| s.cmp(*k)).is_err())
            .cloned()
            .collect();
        for key in &gone {
            self.unsend(key);
        }
        for (key, item) in state {
            let same = matches!(self.sent.get(key), Some(Sent::Delivered(held)) if held.same(item));
            if !same {
                self.note_referencing(key, item);
                self.send(key.clone(), Sent::Delivered(item.clone()));
            }
        }
    }

    /// Delta, make phase: additions and updates, and what the client subscribed to but does
    /// not exist. `None` when there is nothing to say.
    pub fn delta_make(&mut self, seq: u64, system_version: &Arc<str>) -> Option<DeltaResponse> {
        let upserts: SmallVec<[(ItemKey, Item); 2]> = self
            .pending_upserts()
            .map(|(k, item)| (k.clone(), item.clone()))
            .collect();
        let mut response = DeltaResponse::default();
        response.resources.reserve_exact(upserts.len());
        let mut carried: Vec<(ItemKey, Option<Item>)> = Vec::with_capacity(upserts.len());
        for (key, item) in upserts {
            self.note_referencing(&key, &item);
            response.resources.push(item.wrapped(key.name()));
            carried.push((key.clone(), Some(item.clone())));
            self.send(key.clone(), Sent::Delivered(item));
            self.dirty.remove(&key);
            // A resource that exists again is no longer reported missing.
            if !self.reported_missing.is_empty() {
                self.reported_missing
                    .remove(&Missing::Name(key.name().to_string()));
            }
        }
        // A variant replaced by another (TP2): the old one's removal goes in the same response
        // as the new one, so that the client swaps them atomically. What the client holds
        // and should not is dirty (as `stamp_removals` relies on), and what was just sent
        // left the dirty set above: the old variants are among what is left, usually
        // nothing, in key order.
        let sends_variant_of =
            |name: &str| (response.resources.iter()).any(|r| names_variant(r) && *r.name == *name);
        let replaced: SmallVec<[ItemKey; 1]> =
            if self.dirty.is_empty() || !response.resources.iter().any(names_variant) {
                SmallVec::new()
            } else {
                (self.dirty.iter())
                    .filter(|k| {
                        matches!(k, ItemKey::Variant(..))
                            && sends_variant_of(k.name())
                            && self.sent.contains_key(*k)
                            && !self.desired.contains_key(*k)
                    })
                    .cloned()
                    .collect()
            };
        #[cfg(test)]
        self.check_replaced(&response, &replaced);
        for key in replaced {
            let sent = self.unsend(&key);
            self.dirty.remove(&key);
            carried.push((key.clone(), None));
            response.removed_resource_names.push(RemovedName {
                name: key.name().to_string(),
                constraints: sent.and_then(|s| s.constraints()),
            });
        }
        // Whatever is neither to send nor to remove needs no attention (desired looked up
        // first: nearly everything dirty was just sent, one search each).
        self.dirty
            .retain(|k| !self.desired.contains_key(k) && self.sent.contains_key(k));

        // Tell the client what does not exist, so that it does not wait for it. What it has is
        // a removal instead, for the break phase.
        let still_missing: BTreeSet<Missing> = (*self.missing).clone();
        if !self.reported_missing.is_empty() {
            self.reported_missing.retain(|m| match m {
                Missing::Glob(g) => self.glob_members.get(g).is_some_and(BTreeSet::is_empty),
                other => still_missing.contains(other),
            });
        }
        for missing in still_missing {
            if self.reported_missing.contains(&missing) {
                continue;
            }
            match &missing {
                Missing::Name(name)
                    if self
                        .sent
                        .contains_key(&ItemKey::Name(Arc::from(name.as_str()))) =>
                {
                    continue;
                }
                Missing::Name(name) => response.removed_resources.push(name.clone()),
                Missing::Locator(name, params) => {
                    // What it holds for this locator goes in the break phase, by constraints.
                    if self.locator_held(name, params) {
                        continue;
                    }
                    response.removed_resource_names.push(RemovedName {
                        name: name.to_string(),
                        constraints: None,
                    });
                }
                Missing::Glob(_) => continue,
            }
            self.reported_missing.insert(missing);
        }
        // An empty glob collection is reported by its own name, once its members are gone.
        for (glob, members) in self.glob_members.iter() {
            let report = Missing::Glob(glob.clone());
            if !members.is_empty() || self.reported_missing.contains(&report) {
                continue;
            }
            let Some(url) = self.globs.get(glob).map(|g| &g.url) else {
                continue;
            };
            // Reported only once the client holds none of its members any more.
            let holds = self.sent.keys().any(|k| {
                vxds_core::xdstp::XdstpUrn::parse(k.name()).is_ok_and(|urn| url.glob_matches(&urn))
            });
            if !holds {
                response.removed_resources.push(glob.clone());
                self.reported_missing.insert(report);
            }
        }
        // A new wildcard subscription is answered even when nothing matches it: an empty
        // response, else the client waits its initial fetch timeout (Envoy: 15 s).
        if std::mem::take(&mut self.force_send)
            && response.resources.is_empty()
            && response.removed_resources.is_empty()
            && response.removed_resource_names.is_empty()
        {
            return Some(self.stamp_delta(
                response,
                seq,
                system_version,
                Carried::Changes(carried),
            ));
        }
        self.finish_delta(response, seq, system_version, Carried::Changes(carried))
    }

    /// Test builds: the old variants a response replaces, found among the dirty items, are
    /// exactly those found by walking every variant sent under the response's names.
    #[cfg(test)]
    fn check_replaced(&self, response: &DeltaResponse, replaced: &[ItemKey]) {
        let mut walked: Vec<ItemKey> = (response.resources.iter())
            .filter(|r| names_variant(r))
            .flat_map(|r| self.sent_variants(&r.name))
            .filter(|old| !self.desired.contains_key(*old))
            .cloned()
            .collect();
        walked.sort_unstable();
        walked.dedup();
        assert_eq!(replaced, walked.as_slice(), "replaced variants");
    }

    /// Delta, break phase: the eligible removals of what the client has.
    pub fn delta_break(
        &mut self,
        seq: u64,
        system_version: &Arc<str>,
        settled: &Settled,
    ) -> Option<DeltaResponse> {
        // Removals are among the dirty items: none, nothing to remove (nearly every poll).
        if self.dirty.is_empty() {
            return None;
        }
        let removals: Vec<ItemKey> = self.eligible_removals(settled).cloned().collect();
        let mut response = DeltaResponse::default();
        let carried: Vec<(ItemKey, Option<Item>)> =
            removals.iter().map(|k| (k.clone(), None)).collect();
        for key in removals {
            let sent = self.unsend(&key);
            self.dirty.remove(&key);
            match &key {
                ItemKey::Name(name) => {
                    response.removed_resources.push(name.to_string());
                    let missing = Missing::Name(name.to_string());
                    if self.missing.contains(&missing) {
                        self.reported_missing.insert(missing);
                    }
                }
                ItemKey::Variant(name, _) => {
                    response.removed_resource_names.push(RemovedName {
                        name: name.to_string(),
                        constraints: sent.as_ref().and_then(|s| s.constraints()),
                    });
                    // The locators this variant answered, which match nothing now: this
                    // removal tells them, once.
                    let answered: Vec<Missing> = self
                        .missing
                        .iter()
                        .filter(|m| match (m, &sent) {
                            (Missing::Locator(n, params), Some(Sent::Delivered(item))) => {
                                **n == **name && item.resolves(params)
                            }
                            _ => false,
                        })
                        .cloned()
                        .collect();
                    self.reported_missing.extend(answered);
                }
            }
        }
        self.finish_delta(response, seq, system_version, Carried::Changes(carried))
    }

    pub(super) fn finish_delta(
        &mut self,
        response: DeltaResponse,
        seq: u64,
        system_version: &Arc<str>,
        carried: Carried,
    ) -> Option<DeltaResponse> {
        if response.resources.is_empty()
            && response.removed_resources.is_empty()
            && response.removed_resource_names.is_empty()
        {
            return None;
        }
        Some(self.stamp_delta(response, seq, system_version, carried))
    }

    /// Stamps a Delta response with its type, nonce and version, and records it in flight.
    fn stamp_delta(
        &mut self,
        mut response: DeltaResponse,
        seq: u64,
        system_version: &Arc<str>,
        carried: Carried,
    ) -> DeltaResponse {
        response.type_url = self.type_url.clone();
        response.nonce = seq.to_string();
        response.system_version_info = system_version.clone();
        self.carry(seq, carried);
        self.unanswered += 1;
        insert_by_seq(
            &mut self.outstanding,
            seq,
            Outstanding {
                version: system_version.clone(),
                seq,
                since: seq,
                heartbeat: false,
                renewing: Box::default(),
            },
        );
        response
    }

    /// Records a SotW response of `entries` at `version` as the one outstanding: the client
    /// answers only the latest, which stands for those it supersedes.
    pub(super) fn sotw_outstanding(&mut self, seq: u64, version: &Arc<str>) -> String {
        self.unanswered += 1;
        let nonce = seq.to_string();
        self.last_seq = Some(seq);
        let since = self
            .outstanding
            .iter()
            .map(|(_, o)| o.since)
            .min()
            .unwrap_or(seq)
            .min(seq);
        self.outstanding.clear();
        self.outstanding.push((
            seq,
            Outstanding {
                version: version.clone(),
                seq,
                since,
                heartbeat: false,
                renewing: Box::default(),
            },
        ));
        nonce
    }

    /// Marks response `nonce` as a heartbeat (see [`Outstanding::heartbeat`]) renewing
    /// `renewing` without their bodies (Delta).
    pub(super) fn mark_heartbeat(&mut self, nonce: &str, renewing: Vec<ItemKey>) {
        let seq = nonce_seq(nonce);
        if let Some((_, outstanding)) = self.outstanding.iter_mut().find(|(s, _)| Some(*s) == seq) {
            outstanding.heartbeat = true;
            outstanding.renewing = renewing.into_boxed_slice();
        }
    }

    /// What the client holds, for visibility.
    pub fn held(&self) -> impl Iterator<Item = (HeldKey, Sent)> + '_ {
        self.sent
            .iter()
            .map(|(key, sent)| (key.held_key(), sent.clone()))
    }
}

/// Whether a Delta resource goes by locator (TP2): named with its variant's constraints.
fn names_variant(resource: &Wrapped) -> bool {
    matches!(resource.naming, Naming::Constrained(_))
}

/// The sequence number a nonce names (in `status`, beside the status's nonces).
pub(crate) use crate::status::nonce_seq;

#[cfg(test)]
mod tests {
    use super::*;

    /// Only a response's own spelling of its sequence number names it.
    #[test]
    fn nonces_name_responses_by_their_own_spelling() {
        assert_eq!(nonce_seq("7"), Some(7));
        assert_eq!(nonce_seq("0"), Some(0));
        assert_eq!(nonce_seq("18446744073709551615"), Some(u64::MAX));
        for other in [
            "",
            "007",
            "+7",
            " 7",
            "7 ",
            "-1",
            "x",
            "18446744073709551616",
        ] {
            assert_eq!(nonce_seq(other), None, "{other:?}");
        }
        for seq in [1u64, 9, 10, 12345] {
            assert_eq!(nonce_seq(&seq.to_string()), Some(seq));
        }
    }
}
