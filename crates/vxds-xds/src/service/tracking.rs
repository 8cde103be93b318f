//! What a stream's task tells rollout tracking (`crate::rollout`): the client's answers, each
//! computation and what it sent, and what the client accepted, mirrored into its status.

use crate::machine::{RequestOutcome, Response, StreamMachine};
use crate::registry::{Inbox, Registry};
use crate::rollout::{Computation, Mark, StreamRollout};

/// A refusal, held until the computation that follows it: `(type, nonce, node, error text)`.
pub(super) type Refusal = (String, Option<u64>, String, String);

/// The client's ACKs, for rollout tracking, and the revisions it accepted, in its status; its
/// NACKs, for [`record_refusals`].
pub(super) fn record_answers(
    rollout: &mut StreamRollout,
    machine: &StreamMachine,
    outcome: &RequestOutcome,
    nonce: Option<u64>,
) -> Vec<Refusal> {
    let mut refusals = Vec::new();
    if let Some((type_url, names)) = &outcome.unsubscribed {
        rollout.unsubscribed(type_url, names);
    }
    if outcome.acks.is_empty() && outcome.nacks.is_empty() && outcome.superseded_acks.is_empty() {
        return refusals;
    }
    // An ACK of a superseded SotW response accepts that response's revision: a refusal of
    // the later one then refuses only what came after it.
    for type_url in outcome.acks.iter().chain(&outcome.superseded_acks) {
        rollout.acked(type_url, nonce);
    }
    if !outcome.nacks.is_empty() {
        let status = machine.status();
        let (node, texts) = match status.lock() {
            Ok(status) => (
                status.node_id.clone(),
                outcome
                    .nacks
                    .iter()
                    .map(|t| {
                        status
                            .types
                            .iter()
                            .find(|s| &s.type_url == t)
                            .and_then(|s| s.last_nacked.as_ref())
                            .map(|n| n.message.clone())
                            .unwrap_or_default()
                    })
                    .collect::<Vec<_>>(),
            ),
            Err(_) => return refusals,
        };
        for (type_url, text) in outcome.nacks.iter().zip(texts) {
            refusals.push(((*type_url).to_owned(), nonce, node.clone(), text));
        }
    }
    mirror_revisions(
        rollout,
        machine,
        (outcome.acks.iter())
            .chain(&outcome.nacks)
            .chain(&outcome.superseded_acks),
    );
    refusals
}

/// NACKs count against the revisions they refuse unless, on SotW, the computation right after
/// them sent the type again: a refused make-before-break update is followed by the type's whole
/// state without what the refusal no longer holds back, and the client's answer to that
/// decides. A Delta response after a refusal carries only what changed since (removals, say),
/// never the refused resources again, so there the refusal stands.
fn record_refusals(rollout: &mut StreamRollout, refusals: Vec<Refusal>, responses: &[Response]) {
    for (type_url, nonce, node, text) in refusals {
        let resent_whole = responses
            .iter()
            .any(|r| matches!(r, Response::Sotw(_)) && r.type_url() == type_url);
        if !resent_whole {
            rollout.nacked(&type_url, nonce, &node, &text);
        }
    }
}

/// After a request of the client, its answers recorded: the subscriptions it changed go to
/// the registry; then whether the stream must catch up with its inbox and compute
/// ([`after_request`]). An answer and nothing else to do (an ACK, nearly always) need not:
/// the computation would find nothing to send and decide nothing, and marks that came
/// meanwhile raised the task's wake, so its next turn computes them. Not a refusal: on SotW
/// one counts only if no whole state follows it at once, and that is for the computation to
/// say. Not async: the computation's future, hundreds of bytes, is only made when it runs.
pub(super) fn computes_after_request(
    (registry, id): (&Registry, u64),
    rollout: &StreamRollout,
    machine: &mut StreamMachine,
    outcome: &RequestOutcome,
) -> bool {
    // Interest first, then the snapshot: no change can slip in between.
    if outcome.interest_changed {
        registry.set_interest(id, machine.interest());
    }
    outcome.interest_changed
        || !outcome.nacks.is_empty()
        || rollout.waits_on_computation()
        || !machine.rest_if_quiet()
}

/// The computation after a request ([`computes_after_request`]): the stream catches up with
/// its inbox and computes, and the computation and the client's refusals are recorded.
pub(super) async fn after_request(
    registry: &Registry,
    inbox: &Inbox,
    rollout: &mut StreamRollout,
    machine: &mut StreamMachine,
    refusals: Vec<Refusal>,
) -> Vec<Response> {
    let (responses, _) = catch_up_and_compute(registry, inbox, rollout, machine).await;
    record_refusals(rollout, refusals, &responses);
    responses
}

/// The stream catches up with its inbox (one revision for every type), computes from the
/// published snapshot, and records the computation; the responses, and the snapshot.
pub(super) async fn catch_up_and_compute(
    registry: &Registry,
    inbox: &Inbox,
    rollout: &mut StreamRollout,
    machine: &mut StreamMachine,
) -> (Vec<Response>, std::sync::Arc<vxds_store::Snapshot>) {
    let mut marked = super::Marked::new();
    let snapshot = registry.catch_up_marked(inbox, machine, &mut marked).await;
    let responses = poll(rollout, machine, &snapshot, &marked);
    record_computed(
        rollout,
        machine,
        (snapshot.epoch, snapshot.revision),
        &marked,
        &responses,
    );
    (responses, snapshot)
}

/// The responses to send now, computed from `snapshot`: rollout tracking follows what they
/// name when a revision may wait for it.
fn poll(
    rollout: &StreamRollout,
    machine: &mut StreamMachine,
    snapshot: &vxds_store::Snapshot,
    marked: &[Mark],
) -> Vec<Response> {
    machine.follow_references(rollout.follows_references(marked));
    machine.poll(snapshot)
}

/// A computation from the snapshot at `revision`, told of `marked`, that sent `responses`.
fn record_computed(
    rollout: &mut StreamRollout,
    machine: &StreamMachine,
    (epoch, revision): (u64, u64),
    marked: &[Mark],
    responses: &[Response],
) {
    let held = machine.held_removals();
    let computation = Computation {
        epoch,
        revision,
        marked,
        responses,
        held: &held,
        dependencies: machine.dependencies(),
    };
    rollout.computed(computation, machine);
    if !responses.is_empty() {
        mirror_revisions(rollout, machine, responses.iter().map(Response::type_url));
    }
}

/// Copies what the client accepted and what is in flight into its status (`/v1/clients`, CSDS).
fn mirror_revisions<'a, S: AsRef<str> + 'a>(
    rollout: &StreamRollout,
    machine: &StreamMachine,
    types: impl Iterator<Item = S>,
) {
    let status = machine.status();
    let Ok(mut status) = status.lock() else {
        return;
    };
    for type_url in types {
        let type_url = type_url.as_ref();
        let Some((accepted, sent)) = rollout.versions(type_url) else {
            continue;
        };
        if let Some(entry) = status.types.iter_mut().find(|t| t.type_url == type_url) {
            entry.accepted_revision = (accepted > 0).then_some(accepted);
            entry.pending_revision = (sent > accepted).then_some(sent);
        }
    }
}

#[cfg(test)]
mod tests;
