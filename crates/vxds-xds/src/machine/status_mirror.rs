//! The status mirror: what a stream's client holds, was sent and answered, copied into the
//! shared `ClientStatus` that `/v1/clients`, CSDS and the summaries read. Written once per
//! response and per answer on every stream, so the last-sent and last-acked strings are
//! rewritten in place.

use std::sync::Mutex;

use vxds_envoy::pb::envoy::config::core::v3::Node;

use super::type_state::{Ack, HeldChanges, TypeState};
use super::{RequestOutcome, Response, StreamMachine, now};
use crate::status::{Acked, ClientStatus, Nacked, SentVersion, Stamp, TypeStatus};
use crate::types::push_rank;

impl StreamMachine {
    pub(super) fn record_sent(&mut self, response: &Response) {
        let type_url = response.type_url();
        let version = match response {
            Response::Sotw(r) => &r.version_info,
            Response::Delta(r) => &r.system_version_info,
        };
        let Ok(mut status) = self.status.lock() else {
            return;
        };
        let entry = type_entry(&mut status, type_url);
        // Once per response on every stream: the strings are rewritten in place.
        let sent = entry.last_sent.get_or_insert_with(SentVersion::default);
        overwrite(&mut sent.version, version);
        overwrite(&mut sent.nonce, response.nonce());
        sent.at = Stamp::now();
        // What the client holds changed; its subscriptions did not.
        if let Some(ty) = self.types.get_mut(type_url) {
            apply_held_changes(ty, entry);
        }
    }

    /// Mirrors one type's state into the shared status.
    pub(super) fn refresh_status(&mut self, type_url: &str, subscriptions: bool) {
        let sources = subscriptions.then(|| self.param_sources(type_url));
        let Some(ty) = self.types.get_mut(type_url) else {
            return;
        };
        let Ok(mut status) = self.status.lock() else {
            return;
        };
        let entry = type_entry(&mut status, type_url);
        if subscriptions {
            // Shared with every stream that subscribes alike.
            entry.subscriptions = crate::intern::descriptions(ty.describe_subscriptions());
            let summary = crate::status::shared_summary(ty.summary_subscriptions());
            if !std::sync::Arc::ptr_eq(&summary, &entry.summary) {
                entry.summary = summary;
                crate::status::summary_inputs_changed();
            }
            entry.params = ty.default_params.clone();
        }
        if let Some(sources) = sources {
            entry.param_sources = crate::status::shared_param_sources(sources);
        }
        apply_held_changes(ty, entry);
    }
}

/// Mirrors what the client holds of `ty` into its status entry.
pub(super) fn apply_held_changes(ty: &mut TypeState, entry: &mut TypeStatus) {
    match ty.take_held_changes() {
        HeldChanges::All => entry.resources = ty.held().collect(),
        HeldChanges::Some(changes) => {
            for (key, held) in changes {
                entry.resources.apply(key, held);
            }
        }
    }
}

/// `*to = from`, reusing `to`'s allocation — unless it is far larger than `from` needs
/// (a client's version text can be megabytes once): then it is let go.
pub(super) fn overwrite(to: &mut String, from: &str) {
    if to.capacity() > from.len().max(64) * 4 {
        *to = from.to_owned();
        return;
    }
    to.clear();
    to.push_str(from);
}

pub(super) fn type_entry<'a>(status: &'a mut ClientStatus, type_url: &str) -> &'a mut TypeStatus {
    if let Some(i) = status.types.iter().position(|t| t.type_url == type_url) {
        return &mut status.types[i];
    }
    status.types.push(TypeStatus {
        type_url: type_url.to_owned(),
        ..Default::default()
    });
    crate::status::summary_inputs_changed();
    // Types are added a few times per stream: room for exactly them, not for twice as many.
    status.types.shrink_to_fit();
    status
        .types
        .sort_by_key(|t| (push_rank(&t.type_url), t.type_url.clone()));
    let i = status
        .types
        .iter()
        .position(|t| t.type_url == type_url)
        .expect("just inserted");
    &mut status.types[i]
}

pub(super) fn record_ack(
    outcome: &mut RequestOutcome,
    type_url: &str,
    ack: Ack,
    nonce: &str,
    status: &Mutex<ClientStatus>,
) {
    let Ok(mut status) = status.lock() else {
        return;
    };
    let entry = type_entry(&mut status, type_url);
    match ack {
        Ack::Acked { version } => {
            outcome.acks.push(crate::types::intern(type_url));
            // Once per ACK on every stream: the strings are rewritten in place.
            let acked = entry.last_acked.get_or_insert_with(Acked::default);
            overwrite(&mut acked.version, &version);
            overwrite(&mut acked.nonce, nonce);
            acked.at = Stamp::now();
        }
        Ack::Nacked { version, message } => {
            outcome.nacks.push(crate::types::intern(type_url));
            entry.last_nacked = Some(Nacked {
                version: version.to_string(),
                nonce: nonce.to_owned(),
                message,
                at: now(),
            });
        }
    }
}

/// Longest NACK text kept: it is copied into the stream's status, CSDS and client events, and
/// a client may send megabytes of it.
const MAX_ERROR_TEXT: usize = 4096;

pub(super) fn error_message(error: &Option<vxds_envoy::pb::google::rpc::Status>) -> Option<String> {
    error.as_ref().map(|e| {
        if e.message.is_empty() {
            return format!("code {}", e.code);
        }
        if e.message.len() <= MAX_ERROR_TEXT {
            return e.message.clone();
        }
        let mut end = MAX_ERROR_TEXT;
        while !e.message.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}… ({} bytes)", &e.message[..end], e.message.len())
    })
}

pub(super) fn user_agent(node: &Node) -> String {
    use vxds_envoy::pb::envoy::config::core::v3::node::UserAgentVersionType;
    let version = match &node.user_agent_version_type {
        Some(UserAgentVersionType::UserAgentVersion(v)) => v.clone(),
        Some(UserAgentVersionType::UserAgentBuildVersion(b)) => b
            .version
            .as_ref()
            .map(|v| format!("{}.{}.{}", v.major_number, v.minor_number, v.patch))
            .unwrap_or_default(),
        None => String::new(),
    };
    format!("{} {version}", node.user_agent_name)
        .trim()
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nack_text_is_kept_within_bounds() {
        let status = |message: String| {
            Some(vxds_envoy::pb::google::rpc::Status {
                code: 3,
                message,
                details: vec![],
            })
        };
        assert_eq!(error_message(&status(String::new())).unwrap(), "code 3");
        assert_eq!(error_message(&status("bad".into())).unwrap(), "bad");
        let long = "é".repeat(5000);
        let kept = error_message(&status(long)).unwrap();
        assert!(kept.len() < MAX_ERROR_TEXT + 32, "{}", kept.len());
        assert!(kept.ends_with("… (10000 bytes)"));
    }
}
