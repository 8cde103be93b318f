//! `vxds serve`: the store, the in-memory index, the admin API and the xDS server, until
//! SIGTERM or SIGINT.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, bail};
use clap::Args;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tracing::info;
use vxds_admin::{
    AdminMetrics, AdminState, DEFAULT_BODY_LIMIT, DEFAULT_CHANGESET_BODY_LIMIT, OriginPolicy,
    Tokens,
};
use vxds_core::IdentityTemplate;
use vxds_envoy::changeset::{DEFAULT_MAX_OPERATIONS, ValidationConfig};
use vxds_store::{
    DEFAULT_INDEX_HISTORY_BYTES, IndexOptions, Retention, Store, StoreOptions, index, redact,
};

use crate::DEFAULT_DATABASE_URL;
use crate::tls::{ServerTls, TlsFiles};

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Where the admin API listens.
    #[arg(long, env = "VXDS_ADMIN_ADDR", default_value = "127.0.0.1:8080")]
    pub admin_addr: SocketAddr,
    /// The store: `postgres://...`, or `sqlite://...` (created on first start).
    #[arg(long, env = "VXDS_DATABASE_URL", default_value = DEFAULT_DATABASE_URL)]
    pub database_url: String,
    /// Do not apply pending migrations at start.
    #[arg(long)]
    pub no_migrate: bool,
    /// Bearer tokens for the admin API, one per line: `<scope> <token> [name]`, the scope
    /// `metrics` (`/metrics` only), `read`, `write` or `secrets` (each allows what the ones
    /// before it do; only `secrets` sees secret key material, redacted for the others), the
    /// token in plaintext or as `sha256:<hex>` (what `vxds token create` prints). Required
    /// when the admin API listens beyond loopback.
    #[arg(long, env = "VXDS_ADMIN_TOKEN_FILE")]
    pub admin_token_file: Option<PathBuf>,
    /// Names (comma-separated `name` or `name:port`; `*` for any) clients may reach the admin
    /// API by, in `Host`, besides loopback names and the listen address. Others are refused
    /// (421), which stops DNS rebinding.
    #[arg(long, env = "VXDS_ADMIN_ALLOWED_HOSTS", value_delimiter = ',')]
    pub admin_allowed_hosts: Vec<String>,
    /// Origins (comma-separated `scheme://host[:port]`) whose pages may write through the
    /// admin API; writes from other origins than the server's own are refused (403).
    #[arg(long, env = "VXDS_ADMIN_ALLOWED_ORIGINS", value_delimiter = ',')]
    pub admin_allowed_origins: Vec<String>,
    /// How long an admin client may take to send a request's headers; one that trickles them
    /// (slowloris) is disconnected. Bodies must arrive within 30 s.
    #[arg(long, env = "VXDS_ADMIN_HEADER_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub admin_header_timeout: std::time::Duration,
    /// Largest admin request body, in bytes (16 MiB). A larger one is refused with 413 before
    /// it is read: by its Content-Length, or as soon as it crosses the limit.
    #[arg(long, env = "VXDS_ADMIN_BODY_LIMIT", default_value_t = DEFAULT_BODY_LIMIT)]
    pub admin_body_limit: usize,
    /// Largest changeset body (`POST /v1/changesets`, what `vxds apply` sends), in bytes
    /// (256 MiB: the export of 100,000 resources of 2.5 KiB each applies back). It is validated
    /// as it arrives and never held whole. A larger one is refused with 413.
    #[arg(long, env = "VXDS_ADMIN_CHANGESET_BODY_LIMIT", default_value_t = DEFAULT_CHANGESET_BODY_LIMIT)]
    pub admin_changeset_body_limit: usize,
    /// Most operations in one changeset (a restore is one too), each changeset one revision.
    #[arg(long, env = "VXDS_MAX_CHANGESET_OPERATIONS", default_value_t = DEFAULT_MAX_OPERATIONS)]
    pub max_changeset_operations: usize,
    /// xdstp authorities this server serves (comma-separated); names with others are refused.
    /// None allows any.
    #[arg(long = "authority", env = "VXDS_AUTHORITIES", value_delimiter = ',')]
    pub authorities: Vec<String>,
    /// How often the store's head is read to catch commits nobody announced (other
    /// processes on SQLite; a half-open LISTEN on Postgres). Default: 500ms on SQLite, 10s on
    /// Postgres.
    #[arg(long, env = "VXDS_STORE_HEAD_POLL", value_parser = humantime::parse_duration)]
    pub store_head_poll: Option<std::time::Duration>,
    /// Database connections in the pool.
    #[arg(long, env = "VXDS_DATABASE_CONNECTIONS", default_value_t = 8)]
    pub database_connections: u32,
    /// How long a request waits for a database connection before it is refused (503). While
    /// the store is known to be unreachable, requests are refused at once.
    #[arg(long, env = "VXDS_DATABASE_ACQUIRE_TIMEOUT", default_value = "2s", value_parser = humantime::parse_duration)]
    pub database_acquire_timeout: std::time::Duration,
    /// Longest a database statement may run (Postgres `statement_timeout`; on SQLite, how long
    /// a writer waits for another's lock). `0s`: no limit on Postgres.
    #[arg(long, env = "VXDS_DATABASE_STATEMENT_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    pub database_statement_timeout: std::time::Duration,
    /// Where the xDS server (ADS, the per-type services, CSDS) listens.
    #[arg(long, env = "VXDS_XDS_ADDR", default_value = "127.0.0.1:18000")]
    pub xds_addr: SocketAddr,
    /// Node metadata fields (comma-separated) whose string values serve as dynamic parameters
    /// for clients that send none (TP2's migration path).
    #[arg(long, env = "VXDS_NODE_METADATA_PARAMS", value_delimiter = ',')]
    pub node_metadata_params: Vec<String>,
    /// Subscriptions one xDS stream may hold.
    #[arg(long, env = "VXDS_XDS_MAX_SUBSCRIPTIONS", default_value_t = 100_000)]
    pub xds_max_subscriptions: usize,
    /// Largest xDS request, in bytes (room for the default subscription limit).
    #[arg(long, env = "VXDS_XDS_MAX_REQUEST_BYTES", default_value_t = 16 << 20)]
    pub xds_max_request_bytes: usize,
    /// Heartbeats for TTL'd resources go out at this fraction of the shortest TTL a stream
    /// holds (0.1 to 0.75): 0.5 sends two per TTL, so one can be lost or late.
    #[arg(long, env = "VXDS_XDS_HEARTBEAT_FRACTION", default_value_t = vxds_xds::DEFAULT_HEARTBEAT_FRACTION, value_parser = parse_heartbeat_fraction)]
    pub xds_heartbeat_fraction: f64,
    /// Responses one xDS stream may leave unanswered before it is ended with
    /// RESOURCE_EXHAUSTED (what they carried is kept until they are answered).
    #[arg(long, env = "VXDS_XDS_MAX_UNANSWERED", default_value_t = vxds_xds::DEFAULT_MAX_UNANSWERED)]
    pub xds_max_unanswered: usize,
    /// Serve CSDS on the xDS port (what each client holds; secret bodies are never returned).
    #[arg(long, env = "VXDS_XDS_CSDS", default_value_t = true, action = clap::ArgAction::Set)]
    pub xds_csds: bool,
    /// At most this many `GET /v1/events` streams at once (503 beyond): each holds a socket
    /// and a queue of up to 1 MiB of events it has not read yet.
    #[arg(long, env = "VXDS_MAX_EVENT_READERS", default_value_t = vxds_admin::events::hub::MAX_READERS, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=100_000))]
    pub max_event_readers: usize,
    /// After the drain, how long shutdown still waits for connections before cutting them.
    #[arg(long, env = "VXDS_SHUTDOWN_DEADLINE", default_value = "10s", value_parser = humantime::parse_duration)]
    pub shutdown_deadline: std::time::Duration,
    /// On SIGTERM, xDS connections are closed spread over this long (each at its own moment),
    /// so that proxies move to other replicas without a thundering herd; `/readyz` answers 503
    /// from the start. `0s` closes them all at once.
    #[arg(long, env = "VXDS_DRAIN_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    pub drain_timeout: std::time::Duration,
    /// Server HTTP/2 pings on xDS connections; a peer that vanished (no FIN) is found within
    /// the interval plus `--xds-keepalive-timeout`. `0s` sends none.
    #[arg(long, env = "VXDS_XDS_KEEPALIVE_INTERVAL", default_value = "30s", value_parser = humantime::parse_duration)]
    pub xds_keepalive_interval: std::time::Duration,
    /// How long a ping may go unanswered before the connection is closed; also how long a new
    /// connection may stay silent (no HTTP/2 preface) before it is closed.
    #[arg(long, env = "VXDS_XDS_KEEPALIVE_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub xds_keepalive_timeout: std::time::Duration,
    /// Close xDS connections this old (±10 % jitter; gRPC's MAX_CONNECTION_AGE) so that load
    /// re-spreads over replicas and a client whose certificate was rotated out, expired or
    /// revoked is dropped within it: each reconnect is a new handshake against the current CA
    /// bundle. Clients reconnect and resume. `0s`: never.
    #[arg(long, env = "VXDS_XDS_MAX_CONNECTION_AGE", default_value = "1h", value_parser = humantime::parse_duration)]
    pub xds_max_connection_age: std::time::Duration,
    /// How long a closing connection's streams have to end before the connection is cut.
    #[arg(long, env = "VXDS_XDS_MAX_CONNECTION_AGE_GRACE", default_value = "30s", value_parser = humantime::parse_duration)]
    pub xds_max_connection_age_grace: std::time::Duration,
    /// Requests per second one xDS stream may send, sustained; a client in a tight loop is
    /// ended with RESOURCE_EXHAUSTED. The unary Fetch calls of one connection share one such
    /// allowance.
    #[arg(long, env = "VXDS_XDS_REQUEST_RATE", default_value_t = 100)]
    pub xds_request_rate: u32,
    /// Requests one xDS stream may send in a burst above the rate.
    #[arg(long, env = "VXDS_XDS_REQUEST_BURST", default_value_t = 1000)]
    pub xds_request_burst: u32,
    /// Largest xDS response, in bytes; a stream whose state outgrows it fails with a clear error.
    #[arg(long, env = "VXDS_XDS_MAX_RESPONSE_BYTES", default_value_t = 256 << 20)]
    pub xds_max_response_bytes: usize,
    /// This replica's name in the store's client summaries (impact preview). Default: the
    /// host name and process id.
    #[arg(long, env = "VXDS_REPLICA_ID", value_parser = replica_id)]
    pub replica_id: Option<String>,
    /// How often this replica publishes the summary of its connected clients to the store,
    /// so that a dry run on any replica sees the whole fleet's; a summary not renewed within
    /// three periods no longer counts. `0s`: never publish.
    #[arg(long, env = "VXDS_CLIENT_SUMMARY_PERIOD", default_value = "5s", value_parser = summary_period)]
    pub client_summary_period: std::time::Duration,
    /// How much revision history the store keeps: an age (`30d`), a revision count
    /// (`100000`), both (`30d,100000`: whichever prunes more) or `forever`. Older revisions,
    /// their changes and variant history are pruned in the background, a small batch at a
    /// time; the head's state is never pruned. A diff or restore of a pruned revision answers
    /// 410 `history_pruned`.
    #[arg(long, env = "VXDS_HISTORY_RETENTION", default_value = "30d", value_parser = Retention::parse)]
    pub history_retention: Retention,
    /// How much memory the index's recent change lists may take, in bytes (estimated). Clients
    /// that fell further behind are sent every resource again; event-stream readers resuming
    /// from further back read the store.
    #[arg(long, env = "VXDS_INDEX_HISTORY_BYTES", default_value_t = DEFAULT_INDEX_HISTORY_BYTES)]
    pub index_history_bytes: usize,
    #[command(flatten)]
    pub tls: TlsArgs,
}

/// How often the history retention is applied (each sweep is a series of small batches).
const PRUNE_PERIOD: std::time::Duration = std::time::Duration::from_secs(60);

/// TLS and client identity. Certificate files are re-read when they change.
#[derive(Debug, Args)]
pub struct TlsArgs {
    /// The xDS server's certificate chain (PEM); with `--xds-tls-key`, xDS is served over TLS.
    #[arg(long, env = "VXDS_XDS_TLS_CERT", requires = "xds_tls_key")]
    pub xds_tls_cert: Option<PathBuf>,
    /// The xDS server's private key (PEM).
    #[arg(long, env = "VXDS_XDS_TLS_KEY", requires = "xds_tls_cert")]
    pub xds_tls_key: Option<PathBuf>,
    /// CA bundle (PEM) client certificates must chain to: mutual TLS, a client without a valid
    /// certificate gets no stream.
    #[arg(long, env = "VXDS_XDS_CLIENT_CA", requires = "xds_tls_cert")]
    pub xds_client_ca: Option<PathBuf>,
    /// Certificate revocation lists (PEM, one or more) for the client CAs: a client whose
    /// certificate they revoke is refused at the handshake. Re-read when it changes, like the
    /// CA bundle; connections made before a revocation close at --xds-max-connection-age.
    #[arg(long, env = "VXDS_XDS_CLIENT_CRL", requires = "xds_client_ca")]
    pub xds_client_crl: Option<PathBuf>,
    /// Turns a client certificate's identity (its one URI SAN; without any, its one DNS SAN; a
    /// certificate with several has none and is refused) into trusted
    /// dynamic parameters, e.g. `spiffe://{trust_domain}/ns/{namespace}/sa/{service_account}`:
    /// they override what the client claims, and a client whose identity does not fit is
    /// refused (PERMISSION_DENIED). Needs `--xds-client-ca`.
    #[arg(long, env = "VXDS_XDS_IDENTITY_TEMPLATE", requires = "xds_client_ca")]
    pub xds_identity_template: Option<String>,
    /// Serve xDS in plaintext on a non-loopback address: anyone who reaches the port can
    /// read every resource and claim any parameters.
    #[arg(long, env = "VXDS_XDS_INSECURE")]
    pub xds_insecure: bool,
    /// Serve xDS over TLS without `--xds-client-ca` on a non-loopback address: clients are
    /// not authenticated, so anyone who reaches the port can read every resource.
    #[arg(long, env = "VXDS_XDS_UNAUTHENTICATED")]
    pub xds_unauthenticated: bool,
    /// Serve secrets over SDS although clients are not authenticated (no `--xds-client-ca`):
    /// without it, SDS serves no secrets to such clients.
    #[arg(long, env = "VXDS_XDS_SECRETS_WITHOUT_MTLS")]
    pub xds_secrets_without_mtls: bool,
    /// Serve the admin API in plaintext on a non-loopback address (bearer tokens cross the
    /// network in clear text), or accept any `Host` (`--admin-allowed-hosts '*'`) without
    /// tokens (a DNS-rebinding page could then write).
    #[arg(long, env = "VXDS_ADMIN_INSECURE")]
    pub admin_insecure: bool,
    /// The admin API's certificate chain (PEM); with `--admin-tls-key`, it is served over HTTPS.
    #[arg(long, env = "VXDS_ADMIN_TLS_CERT", requires = "admin_tls_key")]
    pub admin_tls_cert: Option<PathBuf>,
    /// The admin API's private key (PEM).
    #[arg(long, env = "VXDS_ADMIN_TLS_KEY", requires = "admin_tls_cert")]
    pub admin_tls_key: Option<PathBuf>,
}

impl TlsArgs {
    fn xds(&self) -> Option<TlsFiles> {
        Some(TlsFiles {
            cert: self.xds_tls_cert.clone()?,
            key: self.xds_tls_key.clone()?,
            client_ca: self.xds_client_ca.clone(),
            client_crl: self.xds_client_crl.clone(),
        })
    }

    fn admin(&self) -> Option<TlsFiles> {
        Some(TlsFiles {
            cert: self.admin_tls_cert.clone()?,
            key: self.admin_tls_key.clone()?,
            client_ca: None,
            client_crl: None,
        })
    }

    /// The identity template, parsed (a bad one stops the start with the reason).
    pub fn identity_template(&self) -> anyhow::Result<Option<IdentityTemplate>> {
        self.xds_identity_template
            .as_deref()
            .map(IdentityTemplate::parse)
            .transpose()
            .context("--xds-identity-template")
    }
}

pub async fn run(args: ServeArgs) -> anyhow::Result<ExitCode> {
    let shutdown = shutdown_signal()?;
    raise_open_file_limit();
    let tokens = match &args.admin_token_file {
        Some(path) => Tokens::load(path)?,
        None => Tokens::none(),
    };
    let template = args.tls.identity_template()?;
    let xds_tls = args.tls.xds();
    check_start(&args, &tokens)?;
    if let Some(template) = &template
        && template.as_str().starts_with("spiffe://{")
    {
        tracing::warn!(
            template = template.as_str(),
            "the identity template takes the trust domain from the certificate: any CA in \
             --xds-client-ca can vouch for any trust domain; spell your trust domain out unless \
             the bundle holds only your own CA"
        );
    }
    // Certificates first: a bad file stops the start before anything listens.
    let xds_tls = xds_tls
        .map(|files| ServerTls::load("xDS", files, &[b"h2"]))
        .transpose()?;
    let admin_tls = args
        .tls
        .admin()
        .map(|files| ServerTls::load("admin", files, &[b"h2", b"http/1.1"]))
        .transpose()?;
    let origins = OriginPolicy::new(&args.admin_allowed_hosts, &args.admin_allowed_origins)?
        .with_address(args.admin_addr.ip());
    let options = StoreOptions {
        migrate: !args.no_migrate,
        max_connections: args.database_connections,
        validation: ValidationConfig {
            authorities: args.authorities.clone(),
            max_operations: args.max_changeset_operations,
            trusted_keys: template
                .iter()
                .flat_map(|t| t.keys().map(str::to_owned))
                .collect(),
            ..Default::default()
        },
        head_poll: args.store_head_poll,
        acquire_timeout: args.database_acquire_timeout,
        statement_timeout: args.database_statement_timeout,
    };
    let store = Store::connect(&args.database_url, options)
        .await
        .with_context(|| format!("opening the store at {}", redact(&args.database_url)))?;
    store.spawn_pruner(args.history_retention, PRUNE_PERIOD);
    let index_options = IndexOptions {
        history_bytes: args.index_history_bytes,
    };
    let (index, follower) = index::start_with(store.clone(), index_options)
        .await
        .context("loading the index")?;
    info!(
        store = %redact(&args.database_url),
        revision = index.snapshot().revision,
        resources = index.snapshot().len(),
        "store ready"
    );

    let mut registry = Registry::default();
    let admin_metrics = Arc::new(AdminMetrics::register(&mut registry));
    store.metrics().register(&mut registry);
    let xds_metrics = Arc::new(vxds_xds::XdsMetrics::register(&mut registry));
    crate::heap::register(&mut registry);
    if let Err(e) = crate::heap::purge_in_background() {
        tracing::warn!(error = %e, "jemalloc's background purging could not be turned on");
    }
    if let Err(e) = crate::heap::decay_freed_pages_within(crate::heap::DIRTY_DECAY_MS) {
        tracing::warn!(error = %e, "jemalloc's decay time could not be set");
    }
    let xds_config = vxds_xds::XdsConfig {
        machine: vxds_xds::MachineConfig {
            node_metadata_params: args.node_metadata_params.clone(),
            max_subscriptions: args.xds_max_subscriptions,
            heartbeat_fraction: args.xds_heartbeat_fraction,
            secrets: secret_access(&args.tls, template.as_ref()),
            max_unanswered: args.xds_max_unanswered,
            ..Default::default()
        },
        max_request_bytes: args.xds_max_request_bytes,
        max_response_bytes: args.xds_max_response_bytes,
        csds: args.xds_csds,
        identity_template: template.clone(),
        connections: vxds_xds::ConnectionConfig {
            keepalive_interval: Some(args.xds_keepalive_interval).filter(|i| !i.is_zero()),
            keepalive_timeout: args.xds_keepalive_timeout,
            max_age: Some(args.xds_max_connection_age).filter(|a| !a.is_zero()),
            max_age_grace: args.xds_max_connection_age_grace,
            drain_window: args.drain_timeout,
            drain_grace: args.shutdown_deadline,
            // Connections of certificates a reloaded CRL revokes are closed.
            revoked: xds_tls
                .as_ref()
                .filter(|_| args.tls.xds_client_crl.is_some())
                .map(|tls| tls.revoked.clone()),
            ..Default::default()
        },
        request_rate: vxds_xds::RequestRate {
            per_second: args.xds_request_rate.max(1),
            burst: args.xds_request_burst.max(1),
        },
        ..Default::default()
    };
    let xds = vxds_xds::XdsServer::new(index.clone(), xds_config, xds_metrics);
    let replica_id = args.replica_id.clone().unwrap_or_else(default_replica_id);
    let summaries = (!args.client_summary_period.is_zero()).then(|| {
        tokio::spawn(vxds_admin::impact::publish_summaries(
            store.clone(),
            xds.registry(),
            replica_id.clone(),
            args.client_summary_period,
        ))
    });
    info!(replica = %replica_id, period = ?args.client_summary_period, "publishing the client summary");
    let state = AdminState::new(
        store.clone(),
        index.clone(),
        tokens,
        admin_metrics,
        Arc::new(registry),
        args.admin_body_limit,
    )
    .with_changeset_body_limit(args.admin_changeset_body_limit)
    .with_clients(xds.registry())
    .with_replica_id(replica_id.clone())
    .with_origin_policy(origins)
    .with_identity_template(template.clone())
    .with_event_limits(args.max_event_readers, vxds_admin::events::hub::QUEUE_BYTES);
    // Set on the signal: `/readyz` turns 503 while xDS drains.
    let (draining, drain_signal) = tokio::sync::watch::channel(false);
    let state = state.with_drain_signal(drain_signal);

    let admin = TcpListener::bind(args.admin_addr)
        .await
        .with_context(|| format!("listening on {}", args.admin_addr))?;
    let xds_listener = listen(args.xds_addr, XDS_BACKLOG)
        .with_context(|| format!("listening on {}", args.xds_addr))?;
    let scheme = |tls: bool| if tls { "https" } else { "http" };
    info!(scheme = scheme(admin_tls.is_some()), addr = %admin.local_addr()?, "admin API listening");
    info!(
        tls = xds_tls.is_some(),
        mtls = args.tls.xds_client_ca.is_some(),
        identity_template = template.as_ref().map(IdentityTemplate::as_str),
        addr = %xds_listener.local_addr()?,
        "xDS server listening"
    );

    // The signal starts the drain: readiness off, xDS connections closed over the window.
    // The admin API serves on until xDS has drained (operators watch the drain in /metrics
    // and /readyz), then finishes its requests in flight.
    let (xds_drained, admin_stop) = tokio::sync::watch::channel(false);
    let until = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|set| *set).await;
    };
    let mut stop_xds = draining.subscribe();
    let mut drain_started = draining.subscribe();
    tokio::spawn(async move {
        shutdown.await;
        info!("draining: /readyz answers 503; xDS connections close over the drain window");
        let _ = draining.send(true);
    });
    let admin_server = serve_admin(
        admin,
        vxds_admin::router(state),
        admin_tls.as_ref().map(|tls| tls.acceptor.clone()),
        args.admin_header_timeout,
        until(admin_stop.clone()),
    );
    let xds_stop = async move {
        let _ = stop_xds.wait_for(|set| *set).await;
    };
    let xds_server = async {
        let served = match &xds_tls {
            Some(tls) => {
                let incoming = crate::tls::incoming(xds_listener, tls.acceptor.clone());
                xds.serve_incoming(incoming, xds_stop).await
            }
            None => xds.serve(xds_listener, xds_stop).await,
        };
        let _ = xds_drained.send(true);
        served
    };
    let servers = async { tokio::join!(admin_server, xds_server) };
    // Graceful, within a deadline: a client that never reads must not keep the process up.
    let deadline = args.drain_timeout + args.shutdown_deadline;
    let past_deadline = async move {
        let _ = drain_started.wait_for(|set| *set).await;
        tokio::time::sleep(deadline).await;
    };
    tokio::select! {
        (admin_result, xds_result) = servers => {
            admin_result.context("serving the admin API")?;
            xds_result.context("serving xDS")?;
        }
        () = past_deadline => {
            tracing::warn!(?deadline, "connections still open at the shutdown deadline; closing them");
        }
    }

    info!("shutting down");
    if let Some(summaries) = summaries {
        summaries.abort();
        // Its clients have moved on: other replicas stop counting them now, not at expiry.
        if let Err(e) = store.withdraw_client_summary(&replica_id).await {
            tracing::debug!(error = %e, "withdrawing the client summary failed; it expires");
        }
    }
    follower.abort();
    store.close().await;
    Ok(ExitCode::SUCCESS)
}

/// What a start must not do without being told: each refusal names the flag that allows it;
/// each allowed risk is logged as a warning.
fn check_start(args: &ServeArgs, tokens: &Tokens) -> anyhow::Result<()> {
    let tls = &args.tls;
    let xds_beyond_loopback = !args.xds_addr.ip().is_loopback();
    let admin_beyond_loopback = !args.admin_addr.ip().is_loopback();
    if tokens.is_empty() && admin_beyond_loopback {
        bail!(
            "refusing to serve the admin API on {} without tokens: pass --admin-token-file, or \
             listen on a loopback address",
            args.admin_addr
        );
    }
    if tls.xds().is_none() && xds_beyond_loopback {
        if !tls.xds_insecure {
            bail!(
                "refusing to serve xDS in plaintext on {}: anyone who reaches it could read every \
                 resource and claim any parameters. Pass --xds-tls-cert and --xds-tls-key (and \
                 --xds-client-ca for mutual TLS), listen on a loopback address, or accept the \
                 risk with --xds-insecure",
                args.xds_addr
            );
        }
        tracing::warn!(
            addr = %args.xds_addr,
            "--xds-insecure: serving xDS in PLAINTEXT beyond loopback; any client that reaches \
             the port can read every resource and claim any parameters"
        );
    }
    if tls.xds().is_some() && tls.xds_client_ca.is_none() && xds_beyond_loopback {
        if !tls.xds_unauthenticated {
            bail!(
                "refusing to serve xDS over TLS on {} without --xds-client-ca: clients would not \
                 be authenticated, so anyone who reaches the port could read every resource. \
                 Pass --xds-client-ca (mutual TLS), listen on a loopback address, or accept the \
                 risk with --xds-unauthenticated",
                args.xds_addr
            );
        }
        tracing::warn!(
            addr = %args.xds_addr,
            "--xds-unauthenticated: xDS over TLS without client certificates beyond loopback; \
             anyone who reaches the port can read every resource"
        );
    }
    if tls.admin().is_none() && admin_beyond_loopback {
        if !tls.admin_insecure {
            bail!(
                "refusing to serve the admin API in plaintext on {}: bearer tokens would cross \
                 the network in clear text. Pass --admin-tls-cert and --admin-tls-key, listen on \
                 a loopback address, or accept the risk with --admin-insecure",
                args.admin_addr
            );
        }
        tracing::warn!(
            addr = %args.admin_addr,
            "--admin-insecure: the admin API listens beyond loopback without TLS; bearer tokens \
             cross the network in clear text"
        );
    }
    if tokens.is_empty() && args.admin_allowed_hosts.iter().any(|h| h.trim() == "*") {
        if !tls.admin_insecure {
            bail!(
                "refusing --admin-allowed-hosts '*' without tokens: any web page could reach the \
                 admin API through DNS rebinding and write. Pass --admin-token-file, name the \
                 hosts, or accept the risk with --admin-insecure"
            );
        }
        tracing::warn!(
            "--admin-insecure: any Host is accepted and no token is asked for; a DNS-rebinding \
             page can use the admin API"
        );
    }
    if tls.xds_client_ca.is_none() && tls.xds_secrets_without_mtls {
        tracing::warn!(
            "--xds-secrets-without-mtls: SDS serves secrets to clients that are not \
             authenticated"
        );
    }
    if tls.xds_client_ca.is_some() && tls.xds_identity_template.is_none() {
        tracing::warn!(
            "mutual TLS without --xds-identity-template: any client with a certificate can \
             claim any parameters, and obtain any secret whose variants they match"
        );
    }
    Ok(())
}

/// Which secrets SDS serves: with an identity template, only variants bound to the identities
/// they name (or shared secrets); with mutual TLS and no template, all; without mutual TLS,
/// none unless `--xds-secrets-without-mtls`.
fn secret_access(tls: &TlsArgs, template: Option<&IdentityTemplate>) -> vxds_xds::SecretAccess {
    match (template, tls.xds_client_ca.is_some()) {
        (Some(template), _) => vxds_xds::SecretAccess::IdentityBound(
            template
                .keys()
                .map(str::to_owned)
                .collect::<Vec<_>>()
                .into(),
        ),
        (None, true) => vxds_xds::SecretAccess::Open,
        (None, false) if tls.xds_secrets_without_mtls => vxds_xds::SecretAccess::Open,
        (None, false) => vxds_xds::SecretAccess::Refused,
    }
}

fn replica_id(text: &str) -> Result<String, String> {
    if text.is_empty() || text.len() > 200 || text.chars().any(char::is_control) {
        return Err("a replica id is 1 to 200 printable characters".into());
    }
    Ok(text.to_owned())
}

fn summary_period(text: &str) -> Result<std::time::Duration, String> {
    let period = humantime::parse_duration(text).map_err(|e| e.to_string())?;
    if period.is_zero()
        || (std::time::Duration::from_millis(100)..=std::time::Duration::from_secs(3600))
            .contains(&period)
    {
        Ok(period)
    } else {
        Err("the period is 0s (off) or between 100ms and 1h".into())
    }
}

/// The host name and process id: unique per process across a fleet.
fn default_replica_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "vxds".to_owned());
    format!("{host}-{}", std::process::id())
}

/// Connections the kernel queues for the xDS listener before it accepts them: a fleet
/// reconnecting at once (a replica drained, a network blip) arrives in thousands.
const XDS_BACKLOG: u32 = 4096;

/// A listener on `addr` with `backlog` (tokio's `bind` uses 1024).
fn listen(addr: SocketAddr, backlog: u32) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(backlog)
}

/// Raises the soft open-file limit to the hard one: each xDS stream is a socket, and the usual
/// soft limit (1024) would cap a replica at about a thousand proxies.
fn raise_open_file_limit() {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) => info!(limit, "open-file limit"),
        Err(e) => tracing::warn!(error = %e, "could not raise the open-file limit"),
    }
}

/// The admin API, as `axum::serve` would run it, with a header read timeout (axum sets no
/// timer, so hyper enforces none), until `stop`; then open connections finish gracefully —
/// except those that carried an event stream: those streams ended when the drain began, and
/// one whose reader stopped reading would hold shutdown to the deadline, so they are cut.
async fn serve_admin(
    listener: TcpListener,
    app: axum::Router,
    tls: Option<tokio_rustls::TlsAcceptor>,
    header_read_timeout: std::time::Duration,
    stop: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    use hyper_util::server::conn::auto::Builder;
    use hyper_util::server::graceful::GracefulShutdown;
    use hyper_util::service::TowerToHyperService;

    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout);
    let graceful = GracefulShutdown::new();
    let (stopped, stopping) = tokio::sync::watch::channel(false);
    tokio::pin!(stop);
    loop {
        let (stream, remote) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors and the like: wait a moment, keep serving.
                    tracing::warn!(error = %e, "accepting an admin connection failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut stop => break,
        };
        let events = vxds_admin::events::hub::StreamConnection::default();
        let service = TowerToHyperService::new(tower::ServiceExt::map_request(
            app.clone(),
            marking(events.clone()),
        ));
        let cut = cut_event_streams(stopping.clone(), events);
        let Some(tls) = &tls else {
            let connection = builder
                .serve_connection_with_upgrades(TokioIo::new(stream), service)
                .into_owned();
            let connection = graceful.watch(connection);
            tokio::spawn(async move {
                tokio::select! {
                    ended = connection => if let Err(e) = ended {
                        tracing::debug!(error = %e, "admin connection ended with an error");
                    },
                    () = cut => tracing::debug!("cut an event-stream connection at shutdown"),
                }
            });
            continue;
        };
        // The handshake in the connection's own task: a silent client delays no one.
        let (tls, builder, watcher) = (tls.clone(), builder.clone(), graceful.watcher());
        tokio::spawn(async move {
            let stream = match crate::tls::handshake(&tls, stream, remote).await {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::debug!(%remote, error = %e, "admin TLS handshake failed");
                    return;
                }
            };
            let connection = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
            tokio::select! {
                ended = watcher.watch(connection.into_owned()) => if let Err(e) = ended {
                    tracing::debug!(error = %e, "admin connection ended with an error");
                },
                () = cut => tracing::debug!("cut an event-stream connection at shutdown"),
            }
        });
    }
    drop(listener);
    let _ = stopped.send(true);
    graceful.shutdown().await;
    Ok(())
}

/// Gives each request the connection's marker, which `GET /v1/events` sets.
fn marking<B>(
    events: vxds_admin::events::hub::StreamConnection,
) -> impl Fn(axum::http::Request<B>) -> axum::http::Request<B> + Clone {
    move |mut request| {
        request.extensions_mut().insert(events.clone());
        request
    }
}

/// Resolves at shutdown if the connection carried an event stream.
async fn cut_event_streams(
    mut stopping: tokio::sync::watch::Receiver<bool>,
    events: vxds_admin::events::hub::StreamConnection,
) {
    if stopping.wait_for(|stop| *stop).await.is_err() || !events.carries_events() {
        std::future::pending::<()>().await;
    }
}

/// A future that resolves on SIGTERM or SIGINT (Ctrl-C). The handlers are installed now, not
/// when the future is first polled, so a signal that comes early is not missed.
#[cfg(unix)]
fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate =
        signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    Ok(async move {
        tokio::select! {
            _ = terminate.recv() => info!("SIGTERM received"),
            _ = interrupt.recv() => info!("SIGINT received"),
        }
    })
}

#[cfg(not(unix))]
fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    Ok(async {
        let _ = tokio::signal::ctrl_c().await;
    })
}

/// `--xds-heartbeat-fraction`: late enough not to flood, early enough that a heartbeat one
/// tick late still beats the shortest TTL (1 s).
fn parse_heartbeat_fraction(text: &str) -> Result<f64, String> {
    let fraction: f64 = text
        .parse()
        .map_err(|e| format!("{text:?} is not a number: {e}"))?;
    if (0.1..=0.75).contains(&fraction) {
        Ok(fraction)
    } else {
        Err(format!("{fraction} is outside 0.1 to 0.75"))
    }
}
