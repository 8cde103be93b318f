//! The REST admin API: operators and CI edit the variant database here.
//!
//! Every write is a changeset applied by the store, through the same validation as the CLI and
//! fixture loading. Errors are RFC 9457 problem documents ([`problem`]); request bodies are
//! JSON or YAML ([`body`]); bearer tokens guard reads and writes ([`auth`]). The OpenAPI
//! document is generated from the handlers and types and checked in as `api/openapi.yaml`.
#![forbid(unsafe_code)]

pub mod auth;
mod body;
mod changesets;
mod clients;
mod conditional;
mod coverage;
pub mod events;
mod export;
mod health;
pub mod impact;
pub mod metrics;
pub mod origin;
pub mod problem;
mod query;
pub mod redact;
mod repr;
mod resolve;
mod resources;
mod revisions;
pub mod rollout;
pub mod ui;

use std::sync::Arc;

use axum::Router;
use axum::middleware;
use prometheus_client::registry::Registry;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use vxds_store::{Index, Store};

pub use auth::{Scope, TokenFileError, Tokens};
pub use body::read_body;
pub use export::REVISION_HEADER;
pub use metrics::AdminMetrics;
pub use origin::{OriginConfigError, OriginPolicy};
pub use problem::{ApiError, ProblemBody, ProblemItem};
pub use query::path_segment;

/// What every handler shares. Cheap to clone.
#[derive(Clone, Debug)]
pub struct AdminState {
    pub store: Store,
    pub index: Index,
    pub tokens: Arc<Tokens>,
    pub metrics: Arc<AdminMetrics>,
    /// The process-wide registry `/metrics` encodes.
    pub registry: Arc<Registry>,
    /// Largest request body, in bytes.
    pub body_limit: usize,
    /// Largest changeset body (`POST /v1/changesets`), in bytes: what a store's export is sent
    /// back as.
    pub changeset_body_limit: usize,
    /// The xDS server's streams, when one runs in this process.
    pub clients: Option<Arc<vxds_xds::Registry>>,
    /// The `Host` names and `Origin`s requests may come with.
    pub origins: Arc<OriginPolicy>,
    /// This replica's id in the store's client summaries (impact preview).
    pub replica_id: Option<Arc<str>>,
    /// The xDS server's identity template, for `/v1/resolve` with an identity.
    pub identity_template: Option<Arc<vxds_core::IdentityTemplate>>,
    /// Set when the server starts shutting down: `/readyz` answers 503, event streams end.
    draining: Option<tokio::sync::watch::Receiver<bool>>,
    /// How often an idle `GET /v1/events` stream gets a keep-alive comment.
    pub events_keep_alive: std::time::Duration,
    /// The event streams' hub: their readers, its limits.
    pub events: Arc<events::hub::Hub>,
    openapi_json: Arc<serde_json::Value>,
}

/// Default request body limit: 16 MiB.
pub const DEFAULT_BODY_LIMIT: usize = 16 << 20;

/// Default changeset body limit: 256 MiB, the JSON of 100,000 resources of 2.5 KiB each (an
/// export of 100,000 clusters of four variants is 130 MB). The body is validated as it arrives and never held whole, so a write costs about
/// its validated form (see `docs/benchmarks.md`).
pub const DEFAULT_CHANGESET_BODY_LIMIT: usize = 256 << 20;

impl AdminState {
    pub fn new(
        store: Store,
        index: Index,
        tokens: Tokens,
        metrics: Arc<AdminMetrics>,
        registry: Arc<Registry>,
        body_limit: usize,
    ) -> Self {
        let openapi_json = serde_json::to_value(openapi()).unwrap_or_default();
        Self {
            store,
            index,
            tokens: Arc::new(tokens),
            metrics,
            registry,
            body_limit,
            changeset_body_limit: DEFAULT_CHANGESET_BODY_LIMIT.max(body_limit),
            clients: None,
            replica_id: None,
            origins: Arc::new(OriginPolicy::default()),
            identity_template: None,
            draining: None,
            events_keep_alive: events::KEEP_ALIVE,
            events: Arc::default(),
            openapi_json: Arc::new(openapi_json),
        }
    }

    /// Answers to these hosts and origins instead of loopback names only.
    pub fn with_origin_policy(mut self, policy: OriginPolicy) -> Self {
        self.origins = Arc::new(policy);
        self
    }

    /// `/readyz` follows `draining`: 503 once it is set.
    pub fn with_drain_signal(mut self, draining: tokio::sync::watch::Receiver<bool>) -> Self {
        self.draining = Some(draining);
        self
    }

    /// Whether the server is shutting down.
    pub fn is_draining(&self) -> bool {
        self.draining.as_ref().is_some_and(|d| *d.borrow())
    }

    /// Changeset bodies up to `limit` bytes (default [`DEFAULT_CHANGESET_BODY_LIMIT`]).
    pub fn with_changeset_body_limit(mut self, limit: usize) -> Self {
        self.changeset_body_limit = limit;
        self
    }

    /// The identity template the xDS server applies, so that `/v1/resolve` can too.
    pub fn with_identity_template(mut self, template: Option<vxds_core::IdentityTemplate>) -> Self {
        self.identity_template = template.map(Arc::new);
        self
    }

    /// The methods `path` allows, for `Allow`: from the OpenAPI document, which is generated
    /// from the routes (with HEAD wherever GET is, as axum answers it).
    fn allowed_methods(&self, path: &str) -> String {
        let segments: Vec<&str> = path.split('/').collect();
        let matches = |template: &str| {
            let parts: Vec<&str> = template.split('/').collect();
            parts.len() == segments.len()
                && parts.iter().zip(&segments).all(|(t, s)| {
                    (t.starts_with('{') && t.ends_with('}') && !s.is_empty()) || t == s
                })
        };
        let mut methods = Vec::new();
        for (template, item) in self.openapi_json["paths"].as_object().into_iter().flatten() {
            if !matches(template) {
                continue;
            }
            for method in item.as_object().into_iter().flatten().map(|(m, _)| m) {
                methods.push(method.to_ascii_uppercase());
                if method == "get" {
                    methods.push("HEAD".to_owned());
                }
            }
        }
        methods.join(", ")
    }

    /// The id this replica publishes its client summary under, so that a preview counts its
    /// clients once (afresh, not as published).
    pub fn with_replica_id(mut self, replica_id: impl Into<Arc<str>>) -> Self {
        self.replica_id = Some(replica_id.into());
        self
    }

    /// Keep-alive comments on idle event streams this often (default 15 s).
    pub fn with_events_keep_alive(mut self, every: std::time::Duration) -> Self {
        self.events_keep_alive = every;
        self
    }

    /// At most `max_readers` event streams (`--max-event-readers`), each at most `queue_bytes`
    /// behind before it is reset.
    pub fn with_event_limits(mut self, max_readers: usize, queue_bytes: usize) -> Self {
        self.events = Arc::new(events::hub::Hub::new(max_readers, queue_bytes));
        self
    }

    /// Shows the streams of the xDS server in `/v1/clients`.
    pub fn with_clients(mut self, clients: Arc<vxds_xds::Registry>) -> Self {
        self.clients = Some(clients);
        self
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "vxds admin API",
        description = "Edit vxds's variant database: resources with TP2 variants, changesets applied \
                       all or nothing as one revision, resolution of a client's variant, and history. \
                       Errors are RFC 9457 problem documents (`application/problem+json`) whose `errors` \
                       each carry a JSON pointer into the request, a code and a message (and, for \
                       overlapping variants, a witness parameter set).",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    tags(
        (name = "resources", description = "Single resources and their variants"),
        (name = "changesets", description = "All-or-nothing writes of many resources"),
        (name = "resolve", description = "Which variant a client receives"),
        (name = "revisions", description = "History"),
        (name = "clients", description = "Connected xDS clients"),
        (name = "operations", description = "Health, readiness, metrics"),
    ),
    modifiers(&BearerAuth),
)]
struct ApiDoc;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "A token from `--admin-token-file`: `read` tokens may read, `write` tokens may \
                         also write. Without a token file the server listens on loopback only and \
                         needs no token.",
                    ))
                    .build(),
            ),
        );
    }
}

fn api_router() -> OpenApiRouter<AdminState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(resources::list))
        .routes(routes!(export::export))
        .routes(routes!(resources::get, resources::put, resources::delete))
        .routes(routes!(coverage::get))
        .routes(routes!(changesets::post))
        .routes(routes!(impact::preview))
        .routes(routes!(resolve::resolve))
        .routes(routes!(revisions::list))
        .routes(routes!(revisions::get))
        .routes(routes!(revisions::changes))
        .routes(routes!(revisions::restore))
        .routes(routes!(rollout::get))
        .routes(routes!(clients::list))
        .routes(routes!(events::events))
        .routes(routes!(health::healthz))
        .routes(routes!(health::readyz))
        .routes(routes!(health::store))
        .routes(routes!(health::metrics))
        .routes(routes!(health::openapi))
}

/// The OpenAPI document, generated from the handlers.
pub fn openapi() -> utoipa::openapi::OpenApi {
    api_router().split_for_parts().1
}

/// The OpenAPI document as checked in at `api/openapi.yaml`.
pub fn openapi_yaml() -> String {
    openapi().to_yaml().unwrap_or_default()
}

/// The admin API.
pub fn router(state: AdminState) -> Router {
    let (api, _) = api_router().split_for_parts();
    api.merge(console())
        .fallback(|| async { ApiError::NotFound("there is nothing at this path".into()) })
        .method_not_allowed_fallback(
            |axum::extract::State(state): axum::extract::State<AdminState>,
             uri: axum::http::Uri| async move {
                ApiError::MethodNotAllowed {
                    allow: state.allowed_methods(uri.path()),
                }
            },
        )
        .layer(middleware::from_fn(body::warn_form_json))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            auth::authorize,
        ))
        // Before the token check: a misdirected or cross-origin request is refused whatever
        // it carries.
        .layer(middleware::from_fn_with_state(state.clone(), origin::check))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            metrics::track,
        ))
        .layer(tower_http::trace::TraceLayer::new_for_http())
        // A client that trickles its body (slowloris) holds a connection for at most this long.
        .layer(tower_http::timeout::RequestBodyTimeoutLayer::new(
            BODY_READ_TIMEOUT,
        ))
        .with_state(state)
}

/// The web console's files (not API operations, so not in the OpenAPI document).
fn console() -> Router<AdminState> {
    use axum::routing::get;
    Router::new()
        .route(ui::PREFIX, get(ui::redirect))
        .route("/ui/", get(ui::index))
        .route("/ui/console.js", get(ui::script))
        .route("/ui/console.css", get(ui::style))
}

/// How long a request body may take to arrive.
pub const BODY_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);
