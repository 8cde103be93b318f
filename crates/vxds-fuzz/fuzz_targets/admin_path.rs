//! The admin API's path parameters, through the real router over an in-memory SQLite store
//! that holds routes with names a doubly decoding server would confuse (`rA`, `r%41`,
//! `r%2541`, ...).
//!
//! The first byte picks the form of the rest:
//! - a resource name, put in the path as the CLI does (`path_segment`): the API must answer
//!   about exactly that name: the stored resource when its normal form is stored, else a 404
//!   naming it, or the 400 the name rule gives for it, naming the `name` parameter;
//! - raw path text after `/v1/resources/` or `/v1/revisions/`: a resource path
//!   `route/{segment}` is decoded exactly once (the answer is about `percent_decode(segment)`,
//!   or a 400 `invalid_encoding` naming `name`), and no path gets a 5xx or a body that is not
//!   JSON.
//!
//! Only reads are sent, so the store stays as it was set up.
#![no_main]

use std::collections::BTreeSet;
use std::sync::{Arc, OnceLock};

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use libfuzzer_sys::fuzz_target;
use percent_encoding::percent_decode_str;
use prometheus_client::registry::Registry;
use serde_json::{Value, json};
use tokio::runtime::Runtime;
use tower::ServiceExt;
use vxds_admin::{AdminMetrics, AdminState, DEFAULT_BODY_LIMIT, Tokens, path_segment};
use vxds_envoy::changeset::{ChangesetRequest, Problem, ValidationConfig, resource_name};
use vxds_envoy::resource::ResourceType;
use vxds_store::{Store, StoreOptions, index};

const ROUTE: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";

/// Names stored at set-up: pairs a server decoding twice (or not at all) would mix up.
const STORED: [&str; 9] = [
    "rA",
    "r%41",
    "r%2541",
    "a/b",
    "a%2Fb",
    "q?x#y",
    "caf\u{e9} \u{1F980}",
    "+plus+",
    "xdstp://auth/envoy.config.route.v3.RouteConfiguration/r?k=a%25b",
];

struct Server {
    runtime: Runtime,
    router: Router,
    /// [`STORED`] in normal form, as the store keys them.
    stored: BTreeSet<String>,
}

/// The name rule the admin API applies to a route's name.
fn route_name(name: &str) -> Result<String, Box<Problem>> {
    let ty = ResourceType::resolve("route").expect("route is a type");
    resource_name(name, &ty, &ValidationConfig::default())
}

fn server() -> &'static Server {
    static SERVER: OnceLock<Server> = OnceLock::new();
    SERVER.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime");
        let router = runtime.block_on(async {
            let store = Store::connect("sqlite::memory:", StoreOptions::default())
                .await
                .expect("an in-memory store");
            let operations: Vec<Value> = STORED
                .iter()
                .map(|name| {
                    json!({"op": "put", "type": "route", "name": name, "variants": [
                        {"resource": {"@type": ROUTE, "name": name}}]})
                })
                .collect();
            let request: ChangesetRequest =
                serde_json::from_value(json!({ "operations": operations })).expect("a changeset");
            store
                .apply(request, None)
                .await
                .expect("the names are stored");
            let (index, follower) = index::start(store.clone()).await.expect("the index");
            // The follower runs whenever the runtime does; the fuzzer never stops it.
            std::mem::forget(follower);
            let mut registry = Registry::default();
            let metrics = Arc::new(AdminMetrics::register(&mut registry));
            let state = AdminState::new(
                store,
                index,
                Tokens::none(),
                metrics,
                Arc::new(registry),
                DEFAULT_BODY_LIMIT,
            );
            vxds_admin::router(state)
        });
        let stored = STORED
            .iter()
            .map(|name| route_name(name).expect("a valid route name"))
            .collect();
        Server {
            runtime,
            router,
            stored,
        }
    })
}

struct Reply {
    status: StatusCode,
    body: Value,
}

fn get(path: &str) -> Option<Reply> {
    let request = Request::get(path).body(Body::empty()).ok()?;
    let server = server();
    Some(server.runtime.block_on(async {
        let response = server
            .router
            .clone()
            .oneshot(request)
            .await
            .expect("the router is infallible");
        let status = response.status();
        let bytes = response
            .into_body()
            .collect()
            .await
            .expect("a buffered body")
            .to_bytes();
        let body = serde_json::from_slice(&bytes)
            .unwrap_or_else(|e| panic!("GET {path}: {status} with a body that is not JSON: {e}"));
        Reply { status, body }
    }))
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    match mode % 3 {
        0 => encoded_name(text),
        1 => raw_path("/v1/resources/", text),
        _ => raw_path("/v1/revisions/", text),
    }
});

/// A name as the CLI puts it in a path.
fn encoded_name(name: &str) {
    // An empty segment is another route (the list), not a resource.
    if name.is_empty() {
        return;
    }
    let path = format!("/v1/resources/route/{}", path_segment(name));
    let reply = get(&path).unwrap_or_else(|| panic!("{path:?} is not a valid URI"));
    expect_resource(&path, name, &reply);
}

fn raw_path(prefix: &str, raw: &str) {
    let path = format!("{prefix}{raw}");
    let Some(reply) = get(&path) else {
        return; // not a URI: no client can send it
    };
    assert!(
        !reply.status.is_server_error(),
        "GET {path:?}: {} {}",
        reply.status,
        reply.body
    );
    // `route/{segment}`: one resource path parameter, decoded once.
    let Some(segment) = prefix
        .ends_with("/resources/")
        .then(|| raw.strip_prefix("route/"))
        .flatten()
        .filter(|s| !s.is_empty() && !s.contains(['/', '?', '#']))
    else {
        return;
    };
    match percent_decode_str(segment).decode_utf8() {
        Ok(name) => expect_resource(&path, &name, &reply),
        Err(_) => expect_name_refused(&path, "invalid_encoding", &reply),
    }
}

/// A 400 that names the `name` parameter, with `code`.
fn expect_name_refused(path: &str, code: &str, reply: &Reply) {
    let item = &reply.body["errors"][0];
    assert_eq!(
        reply.status,
        StatusCode::BAD_REQUEST,
        "GET {path:?}: {}",
        reply.body
    );
    assert_eq!(item["parameter"], "name", "GET {path:?}: {}", reply.body);
    assert_eq!(item["code"], code, "GET {path:?}: {}", reply.body);
}

/// The answer to a GET of the route `name` (decoded): about that name and no other.
fn expect_resource(path: &str, name: &str, reply: &Reply) {
    match route_name(name) {
        Ok(normal) if server().stored.contains(&normal) => {
            assert_eq!(reply.status, StatusCode::OK, "GET {path:?}: {}", reply.body);
            assert_eq!(reply.body["name"], normal.as_str(), "GET {path:?}");
        }
        Ok(normal) => {
            assert_eq!(
                reply.status,
                StatusCode::NOT_FOUND,
                "GET {path:?}: {}",
                reply.body
            );
            assert_eq!(
                reply.body["detail"],
                format!("there is no route named `{normal}`"),
                "GET {path:?}"
            );
        }
        Err(problem) => expect_name_refused(path, &problem.code, reply),
    }
}
