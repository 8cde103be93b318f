//! The client's requests, SotW and Delta: ACKs and NACKs, subscriptions (names, wildcards,
//! locators with their parameters), what a reconnecting client says it holds; each read
//! into the stream's type states, with what the request means for the rest of the stream
//! ([`RequestOutcome`]).

use tonic::Status;
use vxds_envoy::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};

use super::config;
use super::status_mirror::{error_message, record_ack};
use super::{RequestOutcome, StreamMachine, type_state};
use crate::types::legacy_wildcard;

impl StreamMachine {
    /// A SotW request.
    pub fn on_sotw_request(&mut self, request: DiscoveryRequest) -> Result<RequestOutcome, Status> {
        self.update_node(request.node.as_ref());
        let Some(type_url) = self.type_url(&request.type_url)? else {
            return Ok(self.unknown_type(&request.type_url));
        };
        let mut outcome = RequestOutcome::default();
        let status = self.status.clone();
        let locators: Vec<(String, vxds_core::ParamSet)> = request
            .resource_locators
            .iter()
            .map(|l| (l.name.clone(), self.locator_params(&l.dynamic_parameters)))
            .collect();
        config::refuse_secret_globs(
            type_url,
            request
                .resource_names
                .iter()
                .chain(request.resource_locators.iter().map(|l| &l.name)),
        )?;
        let ty = self.type_state(type_url)?;
        if !request.response_nonce.is_empty() {
            // Not the latest response's nonce: a later response superseded what this request
            // answers, so it is stale: no answer to the latest, but an ACK of a superseded
            // response still in flight means the client holds that one's state (and a NACK,
            // that it kept what it had); see `answer_superseded`. Its subscription still
            // counts — Envoy's unified mux stamps every request that is not an answer with the
            // last nonce it *accepted*, so after a NACK a new name arrives this way. (A nonce
            // on a stream that has sent nothing yet is a client reconnecting; it counts.)
            let stale = ty
                .last_seq
                .is_some_and(|last| type_state::nonce_seq(&request.response_nonce) != Some(last));
            if stale {
                if ty.answer_superseded(&request.response_nonce, request.error_detail.is_none()) {
                    outcome.superseded_acks.push(type_url);
                }
            } else if let Some(ack) = ty.answer(
                &request.response_nonce,
                error_message(&request.error_detail),
                &request.version_info,
            ) {
                record_ack(
                    &mut outcome,
                    type_url,
                    ack,
                    &request.response_nonce,
                    &status,
                );
            }
        }
        let first = !ty.seen_request;
        ty.seen_request = true;
        let wildcard_before = ty.wildcard();
        let names_empty = request.resource_names.is_empty() && locators.is_empty();
        if first {
            ty.set_legacy_wildcard(names_empty && legacy_wildcard(type_url));
            ty.force_send = true;
        } else if !names_empty {
            ty.set_legacy_wildcard(false);
        }
        ty.set_explicit_wildcard(request.resource_names.iter().any(|n| n == "*"));
        let changed = ty.replace_subscriptions(&request.resource_names, &locators);
        if changed {
            ty.force_send = true;
        }
        ty.forget_left_wildcard();
        ty.release_if_unwatched();
        // Most requests are ACKs: the registry and the status are only touched on a change.
        outcome.interest_changed = changed || first || ty.wildcard() != wildcard_before;
        self.settle_request(type_url, outcome.interest_changed)?;
        Ok(outcome)
    }

    /// A Delta request.
    pub fn on_delta_request(
        &mut self,
        request: DeltaDiscoveryRequest,
    ) -> Result<RequestOutcome, Status> {
        self.update_node(request.node.as_ref());
        let Some(type_url) = self.type_url(&request.type_url)? else {
            return Ok(self.unknown_type(&request.type_url));
        };
        let mut outcome = RequestOutcome::default();
        let status = self.status.clone();
        let subscribe: Vec<(&str, vxds_core::ParamSet)> = request
            .resource_locators_subscribe
            .iter()
            .map(|l| (l.name.as_str(), self.locator_params(&l.dynamic_parameters)))
            .collect();
        let unsubscribe: Vec<(&str, vxds_core::ParamSet)> = request
            .resource_locators_unsubscribe
            .iter()
            .map(|l| (l.name.as_str(), self.locator_params(&l.dynamic_parameters)))
            .collect();
        config::refuse_secret_globs(
            type_url,
            request
                .resource_names_subscribe
                .iter()
                .chain(request.resource_locators_subscribe.iter().map(|l| &l.name)),
        )?;
        let ty = self.type_state(type_url)?;
        if !request.response_nonce.is_empty()
            && let Some(ack) = ty.answer(
                &request.response_nonce,
                error_message(&request.error_detail),
                "",
            )
        {
            record_ack(
                &mut outcome,
                type_url,
                ack,
                &request.response_nonce,
                &status,
            );
        }
        // Subscription changes count whatever the nonce.
        let first = !ty.seen_request;
        ty.seen_request = true;
        let wildcard_before = ty.wildcard();
        if first {
            for (name, version) in &request.initial_resource_versions {
                ty.client_has(name, version);
            }
            let nothing = request.resource_names_subscribe.is_empty()
                && request.resource_locators_subscribe.is_empty();
            ty.set_legacy_wildcard(nothing && legacy_wildcard(type_url));
        }
        // A name subscribed on top of the legacy wildcard continues it (xds_protocol: only
        // unsubscribing `*` ends it); Envoy's on-demand CDS does exactly this.
        // Every name subscribed is answered, even one the client holds (discovery.proto: it
        // may have dropped it) — except on the first request, where
        // `initial_resource_versions` says what it holds.
        for name in &request.resource_names_subscribe {
            if name == "*" {
                ty.set_explicit_wildcard(true);
                continue;
            }
            if !ty.is_subscribed(name, None) {
                ty.subscribe(name, None);
            }
            if !first {
                ty.resend(name, None);
            }
        }
        for (name, params) in subscribe {
            // The first request is never a resend: its parameters move into the subscription.
            let resend = (!first).then(|| params.clone());
            if !ty.is_subscribed(name, Some(&params)) {
                ty.subscribe(name, Some(params));
            }
            if let Some(params) = resend {
                ty.resend(name, Some(&params));
            }
        }
        for name in &request.resource_names_unsubscribe {
            if name == "*" {
                ty.set_explicit_wildcard(false);
                ty.set_legacy_wildcard(false);
            } else {
                ty.unsubscribe(name, None);
            }
        }
        for (name, params) in unsubscribe {
            ty.unsubscribe(name, Some(params));
        }
        let unsubscribed: Vec<String> = (request.resource_names_unsubscribe.iter())
            .chain(
                request
                    .resource_locators_unsubscribe
                    .iter()
                    .map(|l| &l.name),
            )
            .filter(|n| *n != "*")
            .cloned()
            .collect();
        // A new wildcard is answered even when it matches nothing — unless the client
        // reconnects with what it holds: it is not waiting, and is sent nothing again.
        if ty.wildcard() && !wildcard_before && request.initial_resource_versions.is_empty() {
            ty.force_send = true;
        }
        ty.forget_left_wildcard();
        ty.release_if_unwatched();
        // Most requests are ACKs: the registry and the status are only touched on a change.
        outcome.interest_changed = first
            || ty.wildcard() != wildcard_before
            || !request.resource_names_subscribe.is_empty()
            || !request.resource_locators_subscribe.is_empty()
            || !request.resource_names_unsubscribe.is_empty()
            || !request.resource_locators_unsubscribe.is_empty();
        self.settle_request(type_url, outcome.interest_changed)?;
        if !unsubscribed.is_empty() {
            outcome.unsubscribed = Some((type_url, unsubscribed));
        }
        Ok(outcome)
    }
}
