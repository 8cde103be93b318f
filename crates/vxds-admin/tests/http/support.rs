//! What the HTTP tests share: a server on 127.0.0.1 (ephemeral port) over a test store, a
//! client, and helpers for bodies and problem documents.

use std::sync::Arc;

use prometheus_client::registry::Registry;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use vxds_admin::{AdminMetrics, AdminState, OriginPolicy, Tokens};
use vxds_store::{Store, index};
use vxds_testkit::TestDb;

pub(crate) const ROUTE: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
pub(crate) const CLUSTER: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";

pub(crate) const WRITE_TOKEN: &str = "write-token-0123456789";
pub(crate) const READ_TOKEN: &str = "read-token-0123456789";

pub(crate) struct Api {
    pub base: String,
    pub http: reqwest::Client,
    pub store: Store,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Api {
    fn drop(&mut self) {
        self.tasks.iter().for_each(JoinHandle::abort);
    }
}

pub(crate) async fn serve(db: &TestDb, tokens: Tokens, body_limit: usize) -> Api {
    serve_with(db, tokens, body_limit, OriginPolicy::default()).await
}

pub(crate) async fn serve_with(
    db: &TestDb,
    tokens: Tokens,
    body_limit: usize,
    origins: OriginPolicy,
) -> Api {
    serve_store(db.store().await, tokens, body_limit, origins).await
}

/// The admin API over `store`, with the store's metrics in `/metrics` as `vxds serve` has them.
pub(crate) async fn serve_store(
    store: Store,
    tokens: Tokens,
    body_limit: usize,
    origins: OriginPolicy,
) -> Api {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (index, follower) = index::start(store.clone()).await.unwrap();
    let mut registry = Registry::default();
    let metrics = Arc::new(AdminMetrics::register(&mut registry));
    store.metrics().register(&mut registry);
    let state = AdminState::new(
        store.clone(),
        index,
        tokens,
        metrics,
        Arc::new(registry),
        body_limit,
    )
    // The tests' limit is the changesets' too, so that they can cross it cheaply.
    .with_changeset_body_limit(body_limit)
    .with_origin_policy(origins);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let app = vxds_admin::router(state);
    let server = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    Api {
        base,
        http: reqwest::Client::new(),
        store,
        tasks: vec![server, follower],
    }
}

pub(crate) struct Reply {
    pub status: StatusCode,
    pub headers: reqwest::header::HeaderMap,
    pub body: Value,
    pub text: String,
}

impl Api {
    pub(crate) async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<(&str, String)>,
        headers: &[(&str, &str)],
    ) -> Reply {
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some((content_type, body)) = body {
            request = request.header("content-type", content_type).body(body);
        }
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = request.send().await.unwrap();
        let status = response.status();
        let headers = response.headers().clone();
        let text = response.text().await.unwrap();
        let body = serde_json::from_str(&text).unwrap_or(Value::Null);
        Reply {
            status,
            headers,
            body,
            text,
        }
    }

    pub(crate) async fn get(&self, path: &str) -> Reply {
        self.call(Method::GET, path, None, &[]).await
    }

    pub(crate) async fn send_json(&self, method: Method, path: &str, body: Value) -> Reply {
        self.call(
            method,
            path,
            Some(("application/json", body.to_string())),
            &[],
        )
        .await
    }
}

pub(crate) fn route(name: &str, text: &str) -> Value {
    json!({
        "@type": ROUTE,
        "name": name,
        "virtual_hosts": [{"name": "vh", "domains": ["*"], "routes": [{
            "match": {"prefix": "/"}, "direct_response": {"status": 200, "body": {"inline_string": text}}
        }]}]
    })
}

pub(crate) fn variants(name: &str, rows: &[(&str, &str)]) -> Value {
    let rows: Vec<Value> = rows
        .iter()
        .map(|(c, t)| json!({"constraints": c, "resource": route(name, t)}))
        .collect();
    json!({"variants": rows})
}

pub(crate) fn problem_codes(reply: &Reply) -> Vec<(String, String)> {
    reply.body["errors"]
        .as_array()
        .unwrap_or(&vec![])
        .iter()
        .map(|e| {
            (
                e["pointer"].as_str().unwrap_or_default().to_owned(),
                e["code"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

pub(crate) fn assert_problem(reply: &Reply, status: u16) {
    assert_eq!(reply.status.as_u16(), status, "{}", reply.text);
    assert_eq!(
        reply.headers["content-type"], "application/problem+json",
        "{}",
        reply.text
    );
    assert_eq!(reply.body["status"], status);
    assert!(
        reply.body["type"]
            .as_str()
            .unwrap()
            .starts_with("urn:vxds:problem:")
    );
    assert!(!reply.body["detail"].as_str().unwrap().is_empty());
}
