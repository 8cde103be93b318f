//! Issue 21, item 4: an event-stream reader that stops reading never holds shutdown.

use std::time::{Duration, Instant};

use serde_json::json;
use tokio::io::AsyncWriteExt;

use super::Server;

const ROUTE: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";

/// A reader of `GET /v1/events` that stopped reading, with its socket and queue full, is
/// reset; at SIGTERM its connection is cut instead of holding the process to the shutdown
/// deadline (60 s here): the process exits 0 without the deadline's warning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_event_reader_does_not_hold_shutdown() {
    let mut server = Server::start(&["--drain-timeout", "0s", "--shutdown-deadline", "60s"]);
    let base = server.base.clone();
    let address: std::net::SocketAddr = base.trim_start_matches("http://").parse().unwrap();
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut stuck = socket.connect(address).await.unwrap();
    stuck
        .write_all(b"GET /v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::new();
    let long = "n".repeat(150);
    let mut revisions = 0;
    loop {
        let metrics = http
            .get(format!("{base}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        if metrics.contains("vxds_event_readers_reset_total 1") {
            break;
        }
        assert!(revisions < 1000, "the stuck reader was never reset");
        // Revisions of 100 long names: ~30 KB events.
        let operations: Vec<_> = (0..100)
            .map(|i| {
                let name = format!("{long}-{i}");
                json!({"op": "put", "type": "route", "name": name, "variants": [{"resource": {
                    "@type": ROUTE, "name": name,
                    "virtual_hosts": [{"name": "vh", "domains": ["*"], "routes": [{
                        "match": {"prefix": "/"},
                        "direct_response": {"status": 200, "body": {"inline_string": format!("{revisions}")}}
                    }]}]
                }}]})
            })
            .collect();
        let reply = http
            .post(format!("{base}/v1/changesets"))
            .json(&json!({"operations": operations}))
            .send()
            .await
            .unwrap();
        assert!(
            reply.status().is_success(),
            "{}",
            reply.text().await.unwrap()
        );
        revisions += 1;
    }
    let pid = server.process.child.id().to_string();
    assert!(
        std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = server.process.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "vxds serve waited for the stuck reader"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(status.success(), "{status}");
    let log = std::fs::read_to_string(&server.process.log).unwrap();
    assert!(!log.contains("shutdown deadline"), "{log}");
    drop(stuck);
}
