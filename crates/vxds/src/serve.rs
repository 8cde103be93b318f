//! `vxds serve`: the store, the in-memory index and the admin API, until SIGTERM or SIGINT.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, bail};
use clap::Args;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tracing::info;
use vxds_admin::{AdminMetrics, AdminState, DEFAULT_BODY_LIMIT, Tokens};
use vxds_envoy::changeset::ValidationConfig;
use vxds_store::{Store, StoreOptions, index, redact};

use crate::DEFAULT_DATABASE_URL;

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
    /// Bearer tokens for the admin API, one per line: `read <token> [name]` or
    /// `write <token> [name]`. Required when the admin API listens beyond loopback.
    #[arg(long, env = "VXDS_ADMIN_TOKEN_FILE")]
    pub admin_token_file: Option<PathBuf>,
    /// Largest admin request body, in bytes.
    #[arg(long, env = "VXDS_ADMIN_BODY_LIMIT", default_value_t = DEFAULT_BODY_LIMIT)]
    pub admin_body_limit: usize,
    /// xdstp authorities this server serves (comma-separated); names with others are refused.
    /// None allows any.
    #[arg(long = "authority", env = "VXDS_AUTHORITIES", value_delimiter = ',')]
    pub authorities: Vec<String>,
    /// Database connections in the pool.
    #[arg(long, env = "VXDS_DATABASE_CONNECTIONS", default_value_t = 8)]
    pub database_connections: u32,
}

pub async fn run(args: ServeArgs) -> anyhow::Result<ExitCode> {
    let shutdown = shutdown_signal()?;
    let tokens = match &args.admin_token_file {
        Some(path) => Tokens::load(path)?,
        None => Tokens::none(),
    };
    if tokens.is_empty() && !args.admin_addr.ip().is_loopback() {
        bail!(
            "refusing to serve the admin API on {} without tokens: pass --admin-token-file, or \
             listen on a loopback address",
            args.admin_addr
        );
    }
    let options = StoreOptions {
        migrate: !args.no_migrate,
        max_connections: args.database_connections,
        validation: ValidationConfig {
            authorities: args.authorities.clone(),
            ..Default::default()
        },
    };
    let store = Store::connect(&args.database_url, options)
        .await
        .with_context(|| format!("opening the store at {}", redact(&args.database_url)))?;
    let (index, follower) = index::start(store.clone())
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
    let state = AdminState::new(
        store.clone(),
        index.clone(),
        tokens,
        admin_metrics,
        Arc::new(registry),
        args.admin_body_limit,
    );
    let admin = TcpListener::bind(args.admin_addr)
        .await
        .with_context(|| format!("listening on {}", args.admin_addr))?;
    info!(addr = %admin.local_addr()?, "admin API listening");
    let server = axum::serve(admin, vxds_admin::router(state)).with_graceful_shutdown(shutdown);
    server.await.context("serving the admin API")?;

    info!("shutting down");
    follower.abort();
    store.close().await;
    Ok(ExitCode::SUCCESS)
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
