//! CSDS (`envoy.service.status.v3.ClientStatusDiscoveryService`): what the server knows of
//! each connected client — what it sent, what the client acknowledged or refused and why —
//! the same data as `GET /v1/clients`, in Envoy's own form. Each node carries the parameters
//! it resolves with (`dynamic_parameters`) and, in its metadata under `vxds`, its certificate
//! identity, the trusted parameters and where each parameter came from. Secret bodies are
//! never returned; with an identity template a caller sees only the streams of its own
//! identity (one namespace's proxies must not read another's configuration; the fleet view is
//! `/v1/clients`, behind the admin tokens). `XdsConfig::csds` turns the service off.

use std::collections::BTreeMap;
use std::sync::Arc;

use prost::Message;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};
use vxds_envoy::pb::envoy::admin::v3::{ClientResourceStatus, UpdateFailureState};
use vxds_envoy::pb::envoy::config::core::v3::Node;
use vxds_envoy::pb::envoy::service::status::v3::client_status_discovery_service_server::ClientStatusDiscoveryService;
use vxds_envoy::pb::envoy::service::status::v3::{
    ClientConfig, ClientStatusRequest, ClientStatusResponse, ConfigStatus,
    client_config::GenericXdsConfig,
};
use vxds_envoy::pb::envoy::r#type::matcher::v3::StringMatcher;
use vxds_envoy::pb::envoy::r#type::matcher::v3::string_matcher::MatchPattern;
use vxds_envoy::pb::google::protobuf::value::Kind;
use vxds_envoy::pb::google::protobuf::{Any, Struct, Timestamp, Value};
use vxds_envoy::pb::xds::core::v3::ContextParams;

use vxds_core::IdentityTemplate;

use crate::identity::{PeerInfo, trusted_params};
use crate::registry::Registry;
use crate::status::{ClientStatus, TypeStatus};

#[derive(Debug, Clone)]
pub struct Csds {
    registry: Arc<Registry>,
    /// With a template, callers are admitted as ADS clients are (their identity must fit)
    /// and see only their own identity's streams.
    template: Option<Arc<IdentityTemplate>>,
}

impl Csds {
    pub fn new(registry: Arc<Registry>, template: Option<IdentityTemplate>) -> Self {
        Self {
            registry,
            template: template.map(Arc::new),
        }
    }

    /// Who may be shown: everyone, or the streams of the caller's identity.
    fn audience<T>(&self, request: &Request<T>) -> Result<Option<String>, Status> {
        let Some(template) = &self.template else {
            return Ok(None);
        };
        let peer = request
            .extensions()
            .get::<PeerInfo>()
            .and_then(|info| info.identity.as_ref());
        trusted_params(Some(template), peer)?;
        Ok(peer.and_then(|p| p.identity()).map(str::to_owned))
    }

    fn respond(
        &self,
        request: &ClientStatusRequest,
        audience: Option<&str>,
    ) -> Result<ClientStatusResponse, Status> {
        let matchers: Vec<&StringMatcher> = request
            .node_matchers
            .iter()
            .map(|m| {
                if !m.node_metadatas.is_empty() {
                    return Err(Status::unimplemented(
                        "node metadata matchers are not supported; match on node_id",
                    ));
                }
                Ok(m.node_id.as_ref())
            })
            .collect::<Result<Vec<_>, _>>()?
            .into_iter()
            .flatten()
            .collect();
        let mut by_node: BTreeMap<String, (ClientStatus, Vec<GenericXdsConfig>)> = BTreeMap::new();
        for client in self.registry.clients() {
            let mut wanted =
                audience.is_none_or(|identity| client.identity.as_deref() == Some(identity));
            for matcher in &matchers {
                wanted &= string_matches(matcher, &client.node_id)?;
            }
            if !wanted {
                continue;
            }
            let configs: Vec<GenericXdsConfig> = client
                .types
                .iter()
                .flat_map(|t| generic_configs(t, request.exclude_resource_contents))
                .collect();
            by_node
                .entry(client.node_id.clone())
                .or_insert_with(|| (client.clone(), Vec::new()))
                .1
                .extend(configs);
        }
        let config = by_node
            .into_values()
            .map(|(client, generic_xds_configs)| ClientConfig {
                node: Some(node(&client)),
                generic_xds_configs,
                ..Default::default()
            })
            .collect();
        Ok(ClientStatusResponse { config })
    }
}

/// The node as the server sees it: the parameters each type resolves with, and (metadata
/// `vxds`) the identity, the trusted parameters and each parameter's source.
fn node(client: &ClientStatus) -> Node {
    let text = |s: &str| Value {
        kind: Some(Kind::StringValue(s.to_owned())),
    };
    let object = |fields: BTreeMap<String, Value>| Value {
        kind: Some(Kind::StructValue(Struct {
            fields: fields.into_iter().collect(),
        })),
    };
    let strings = |map: &BTreeMap<String, String>| {
        object(map.iter().map(|(k, v)| (k.clone(), text(v))).collect())
    };
    let mut vxds = BTreeMap::new();
    if let Some(identity) = &client.identity {
        vxds.insert("identity".to_owned(), text(identity));
    }
    if !client.trusted_params.is_empty() {
        vxds.insert("trusted_params".to_owned(), strings(&client.trusted_params));
    }
    let sources: BTreeMap<String, Value> = client
        .types
        .iter()
        .filter(|t| !t.param_sources.is_empty())
        .map(|t| {
            let by_key = t
                .param_sources
                .iter()
                .map(|(k, source)| (k.clone(), text(source)))
                .collect();
            (t.type_url.to_owned(), object(by_key))
        })
        .collect();
    if !sources.is_empty() {
        vxds.insert("param_sources".to_owned(), object(sources));
    }
    Node {
        id: client.node_id.clone(),
        cluster: client.node_cluster.clone(),
        dynamic_parameters: client
            .types
            .iter()
            .filter(|t| !t.params.is_empty())
            .map(|t| {
                let params = t.params.0.clone().into_iter().collect();
                (t.type_url.to_owned(), ContextParams { params })
            })
            .collect(),
        metadata: (!vxds.is_empty()).then(|| Struct {
            fields: [("vxds".to_owned(), object(vxds))].into(),
        }),
        ..Default::default()
    }
}

fn string_matches(matcher: &StringMatcher, value: &str) -> Result<bool, Status> {
    let fold = |s: &str| {
        if matcher.ignore_case {
            s.to_lowercase()
        } else {
            s.to_owned()
        }
    };
    let value = fold(value);
    match &matcher.match_pattern {
        Some(MatchPattern::Exact(s)) => Ok(value == fold(s)),
        Some(MatchPattern::Prefix(s)) => Ok(value.starts_with(&fold(s))),
        Some(MatchPattern::Suffix(s)) => Ok(value.ends_with(&fold(s))),
        Some(MatchPattern::Contains(s)) => Ok(value.contains(&fold(s))),
        None => Ok(true),
        Some(_) => Err(Status::unimplemented(
            "node_id matchers support exact, prefix, suffix and contains",
        )),
    }
}

fn timestamp(rfc3339: &str) -> Option<Timestamp> {
    let t = OffsetDateTime::parse(rfc3339, &Rfc3339).ok()?;
    Some(Timestamp {
        seconds: t.unix_timestamp(),
        nanos: t.nanosecond() as i32,
    })
}

fn generic_configs(ty: &TypeStatus, exclude_contents: bool) -> Vec<GenericXdsConfig> {
    let (config_status, client_status) = if ty.in_error() {
        (ConfigStatus::Error, ClientResourceStatus::Nacked)
    } else if ty.synced() {
        (ConfigStatus::Synced, ClientResourceStatus::Acked)
    } else {
        (ConfigStatus::Stale, ClientResourceStatus::Requested)
    };
    let error_state =
        ty.last_nacked
            .as_ref()
            .filter(|_| ty.in_error())
            .map(|n| UpdateFailureState {
                details: n.message.clone(),
                version_info: n.version.clone(),
                last_update_attempt: timestamp(&n.at),
                ..Default::default()
            });
    // When the client last accepted this type (what it runs), not when it was last sent.
    let last_updated = ty
        .last_acked
        .as_ref()
        .and_then(|a| timestamp(&a.at.rfc3339()));
    // CSDS answers anyone who reaches the xDS port: secret bodies (private keys) never leave
    // through it; their names, versions and status do.
    let redact = exclude_contents || ty.type_url == crate::types::SECRET;
    ty.resources
        .iter()
        .map(|r| GenericXdsConfig {
            type_url: ty.type_url.to_owned(),
            name: r.name.to_string(),
            version_info: r.version.to_string(),
            xds_config: if redact {
                None
            } else {
                r.body.as_ref().and_then(|b| Any::decode(b.clone()).ok())
            },
            last_updated,
            config_status: config_status as i32,
            client_status: client_status as i32,
            error_state: error_state.clone(),
            is_static_resource: false,
        })
        .collect()
}

#[tonic::async_trait]
impl ClientStatusDiscoveryService for Csds {
    type StreamClientStatusStream = ReceiverStream<Result<ClientStatusResponse, Status>>;

    async fn stream_client_status(
        &self,
        request: Request<Streaming<ClientStatusRequest>>,
    ) -> Result<Response<Self::StreamClientStatusStream>, Status> {
        let audience = self.audience(&request)?;
        let mut requests = request.into_inner();
        let (tx, rx) = mpsc::channel(4);
        let csds = self.clone();
        tokio::spawn(async move {
            while let Ok(Some(request)) = requests.message().await {
                if tx
                    .send(csds.respond(&request, audience.as_deref()))
                    .await
                    .is_err()
                {
                    return;
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn fetch_client_status(
        &self,
        request: Request<ClientStatusRequest>,
    ) -> Result<Response<ClientStatusResponse>, Status> {
        let audience = self.audience(&request)?;
        self.respond(&request.into_inner(), audience.as_deref())
            .map(Response::new)
    }
}
