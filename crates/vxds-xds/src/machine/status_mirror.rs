//! The status mirror: what a stream's client holds, was sent and answered, copied into the
//! shared `ClientStatus` that `/v1/clients`, CSDS and the summaries read. Written once per
//! response and per answer on every stream, so what it writes then is shared or a number
//! (versions, interned type URLs, nonces): no text of the stream's own, out of cache by the
//! time the next revision comes, is read or written.

use std::sync::Mutex;

use vxds_envoy::pb::envoy::config::core::v3::Node;

use super::type_state::{Ack, HeldChanges, TypeState};
use super::{RequestOutcome, Response, StreamMachine, now};
use crate::status::{Acked, ClientStatus, Nacked, Nonce, SentVersion, Stamp, TypeStatus};
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
        entry.last_sent = Some(SentVersion {
            version: version.clone(),
            nonce: Nonce::new(response.nonce()),
            at: Stamp::now(),
        });
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

/// The entry of `type_url`, added if new. Entries name their type by its interned text: the
/// search compares bytes every stream shares, in cache.
pub(super) fn type_entry<'a>(status: &'a mut ClientStatus, type_url: &str) -> &'a mut TypeStatus {
    if let Some(i) = status.types.iter().position(|t| t.type_url == type_url) {
        return &mut status.types[i];
    }
    status.types.push(TypeStatus {
        type_url: crate::types::intern(type_url),
        ..Default::default()
    });
    crate::status::summary_inputs_changed();
    // Types are added a few times per stream: room for exactly them, not for twice as many.
    status.types.shrink_to_fit();
    status
        .types
        .sort_by_key(|t| (push_rank(t.type_url), t.type_url));
    let i = status
        .types
        .iter()
        .position(|t| t.type_url == type_url)
        .expect("just inserted");
    &mut status.types[i]
}

pub(super) fn record_ack(
    outcome: &mut RequestOutcome,
    type_url: &'static str,
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
            outcome.acks.push(type_url);
            entry.last_acked = Some(Acked {
                version,
                nonce: Nonce::new(nonce),
                at: Stamp::now(),
            });
        }
        Ack::Nacked { version, message } => {
            outcome.nacks.push(type_url);
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
