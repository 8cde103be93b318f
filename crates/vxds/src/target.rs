//! Where a command sends its requests: a running server's admin API over HTTP, or a database
//! directly, through the same admin router run in-process. Either way the request, the
//! validation and the answer are the admin API's.

use std::sync::Arc;

use anyhow::{Context, bail};
use axum::http::{Method, Request, header};
use clap::Args;
use http_body_util::BodyExt;
use prometheus_client::registry::Registry;
use serde_json::Value;
use tokio::task::JoinHandle;
use tower::ServiceExt;
use vxds_admin::{AdminMetrics, AdminState, DEFAULT_BODY_LIMIT, Tokens};
use vxds_store::index::Snapshot;
use vxds_store::{Index, Store, StoreOptions, index};

#[derive(Clone, Debug, Args)]
pub struct TargetArgs {
    /// A running server's admin API.
    #[arg(long, env = "VXDS_SERVER", default_value = "http://127.0.0.1:8080")]
    pub server: String,
    /// A bearer token for the server.
    #[arg(long, env = "VXDS_TOKEN")]
    pub token: Option<String>,
    /// A CA certificate (PEM) to trust for an `https://` server besides the system's, e.g.
    /// the `ca.pem` of `vxds dev-certs`.
    #[arg(long, env = "VXDS_CA_CERT")]
    pub ca_cert: Option<std::path::PathBuf>,
    /// Work on this database (`postgres://...`, `sqlite://...`) instead of a server.
    #[arg(long)]
    pub database_url: Option<String>,
}

/// A path segment, percent-encoded the way the admin API decodes it.
pub fn segment(s: &str) -> String {
    vxds_admin::path_segment(s)
}

pub struct Reply {
    pub status: u16,
    pub body: Value,
}

pub enum Target {
    Server {
        base: String,
        token: Option<String>,
        client: reqwest::Client,
    },
    Database {
        router: axum::Router,
        store: Store,
        follower: JoinHandle<()>,
    },
}

impl Target {
    pub async fn connect(args: &TargetArgs) -> anyhow::Result<Self> {
        Self::connect_with(args, true).await
    }

    /// Like [`Self::connect`], for commands that only read the store and write changesets
    /// (`apply`, `export`): with `--database-url`, no in-memory index is loaded, which would
    /// read the whole store first.
    pub async fn connect_without_index(args: &TargetArgs) -> anyhow::Result<Self> {
        Self::connect_with(args, false).await
    }

    async fn connect_with(args: &TargetArgs, with_index: bool) -> anyhow::Result<Self> {
        match &args.database_url {
            Some(url) => {
                let store = Store::connect(url, StoreOptions::default())
                    .await
                    .with_context(|| format!("opening {}", vxds_store::redact(url)))?;
                let (index, follower) = if with_index {
                    index::start(store.clone()).await?
                } else {
                    (Index::fixed(Snapshot::default()), tokio::spawn(async {}))
                };
                let mut registry = Registry::default();
                let metrics = Arc::new(AdminMetrics::register(&mut registry));
                let state = AdminState::new(
                    store.clone(),
                    index,
                    Tokens::none(),
                    metrics,
                    Arc::new(registry),
                    DEFAULT_BODY_LIMIT,
                );
                Ok(Target::Database {
                    router: vxds_admin::router(state),
                    store,
                    follower,
                })
            }
            None => {
                let mut client = reqwest::Client::builder();
                if let Some(path) = &args.ca_cert {
                    let pem = std::fs::read(path)
                        .with_context(|| format!("reading --ca-cert {}", path.display()))?;
                    for ca in reqwest::Certificate::from_pem_bundle(&pem).with_context(|| {
                        format!("--ca-cert {}: not PEM certificates", path.display())
                    })? {
                        client = client.add_root_certificate(ca);
                    }
                }
                let client = client.build().context("building the HTTP client")?;
                let base = args.server.trim_end_matches('/').to_owned();
                Ok(Target::Server {
                    base,
                    token: args.token.clone(),
                    client,
                })
            }
        }
    }

    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> anyhow::Result<Reply> {
        let payload = body.map(serde_json::to_vec).transpose()?;
        self.call_bytes(method, path, payload).await
    }

    /// [`Self::call`] with `body` written as JSON straight from its type (a changeset of
    /// 100,000 resources as a `Value` tree would take many times its text).
    pub async fn send<T: serde::Serialize>(
        &self,
        method: Method,
        path: &str,
        body: &T,
    ) -> anyhow::Result<Reply> {
        let payload = serde_json::to_vec(body)?;
        self.call_bytes(method, path, Some(payload)).await
    }

    async fn call_bytes(
        &self,
        method: Method,
        path: &str,
        payload: Option<Vec<u8>>,
    ) -> anyhow::Result<Reply> {
        let (status, bytes) = match self {
            Target::Server {
                base,
                token,
                client,
            } => {
                let mut request = client.request(method, format!("{base}{path}"));
                if let Some(token) = token {
                    request = request.bearer_auth(token);
                }
                if let Some(payload) = payload {
                    request = request
                        .header(header::CONTENT_TYPE, "application/json")
                        .body(payload);
                }
                let response = request
                    .send()
                    .await
                    .with_context(|| format!("calling {base}"))?;
                (response.status().as_u16(), response.bytes().await?.to_vec())
            }
            Target::Database { router, .. } => {
                let request = Request::builder()
                    .method(method)
                    .uri(path)
                    .header(header::CONTENT_TYPE, "application/json")
                    .body(axum::body::Body::from(payload.unwrap_or_default()))?;
                let response = router.clone().oneshot(request).await?;
                let status = response.status().as_u16();
                (
                    status,
                    response.into_body().collect().await?.to_bytes().to_vec(),
                )
            }
        };
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap_or(Value::Null)
        };
        Ok(Reply { status, body })
    }

    /// GETs `path` and hands the answer's body to `sink` piece by piece, as it arrives. An
    /// error status is an error with the problem's detail.
    pub async fn stream(
        &self,
        path: &str,
        mut sink: impl FnMut(&[u8]) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        match self {
            Target::Server {
                base,
                token,
                client,
            } => {
                let mut request = client.get(format!("{base}{path}"));
                if let Some(token) = token {
                    request = request.bearer_auth(token);
                }
                let mut response = request
                    .send()
                    .await
                    .with_context(|| format!("calling {base}"))?;
                let status = response.status().as_u16();
                if !(200..300).contains(&status) {
                    let body =
                        serde_json::from_slice(&response.bytes().await?).unwrap_or(Value::Null);
                    return self.expect_ok(Reply { status, body }).map(drop);
                }
                while let Some(piece) = response.chunk().await.context("reading the answer")? {
                    sink(&piece)?;
                }
            }
            Target::Database { router, .. } => {
                let request = Request::builder()
                    .method(Method::GET)
                    .uri(path)
                    .body(axum::body::Body::empty())?;
                let response = router.clone().oneshot(request).await?;
                let status = response.status().as_u16();
                let mut body = response.into_body();
                if !(200..300).contains(&status) {
                    let bytes = body.collect().await?.to_bytes();
                    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                    return self.expect_ok(Reply { status, body }).map(drop);
                }
                while let Some(frame) = body.frame().await {
                    if let Ok(piece) = frame.context("reading the answer")?.into_data() {
                        sink(&piece)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// The store's head revision, read from the store now.
    pub async fn head(&self) -> anyhow::Result<u64> {
        let reply = self.call(Method::GET, "/healthz/store", None).await?;
        match reply.body["revision"].as_u64() {
            Some(revision) if reply.status == 200 => Ok(revision),
            _ => bail!("the store does not answer (HTTP {})", reply.status),
        }
    }

    /// Every resource's `(type_url, name)`, optionally of one type.
    pub async fn list_all(
        &self,
        resource_type: Option<&str>,
    ) -> anyhow::Result<Vec<(String, String)>> {
        Ok(self
            .list_versions(resource_type)
            .await?
            .into_iter()
            .map(|(key, _)| key)
            .collect())
    }

    /// Every resource's `(type_url, name)` and version, optionally of one type, read a page of
    /// 1,000 at a time.
    pub async fn list_versions(
        &self,
        resource_type: Option<&str>,
    ) -> anyhow::Result<Vec<((String, String), String)>> {
        let mut keys = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let mut path = "/v1/resources?limit=1000".to_owned();
            if let Some(t) = resource_type {
                path.push_str(&format!("&type={}", segment(t)));
            }
            if let Some(c) = &cursor {
                path.push_str(&format!("&cursor={c}"));
            }
            let reply = self.expect_ok(self.call(Method::GET, &path, None).await?)?;
            for r in reply.body["resources"].as_array().into_iter().flatten() {
                keys.push((
                    (
                        r["type_url"].as_str().unwrap_or_default().to_owned(),
                        r["name"].as_str().unwrap_or_default().to_owned(),
                    ),
                    r["version"].as_str().unwrap_or_default().to_owned(),
                ));
            }
            match reply.body["next_cursor"].as_str() {
                Some(next) => cursor = Some(next.to_owned()),
                None => return Ok(keys),
            }
        }
    }

    /// `reply` if it succeeded; otherwise an error with the problem's detail.
    pub fn expect_ok(&self, reply: Reply) -> anyhow::Result<Reply> {
        if (200..300).contains(&reply.status) {
            return Ok(reply);
        }
        let detail = reply.body["detail"]
            .as_str()
            .unwrap_or("no detail")
            .to_owned();
        bail!("HTTP {}: {detail}", reply.status)
    }

    pub async fn close(self) {
        if let Target::Database {
            store, follower, ..
        } = self
        {
            follower.abort();
            store.close().await;
        }
    }
}
