//! Workers: add, probe against an in-process llamad RPC server (HELLO, DEVICE_COUNT,
//! GET_DEVICE_MEMORY), probe of a dead address, persistence across a restart, remove; `/status` and
//! `/metrics` see the probe's RPC traffic.

use axum::http::StatusCode;
use serde_json::json;

use crate::common::{metric, rpc_shared, Api};

#[tokio::test]
async fn add_probe_persist_remove() {
    let dir = tempfile::tempdir().unwrap();
    let shared = rpc_shared();
    let (addr, stop) = crate::common::rpc_server(shared.clone()).await;
    let api = Api::open(dir.path(), None, shared.clone());
    let before = api.metrics().await;
    assert_eq!(metric(&before, "llamad_rpc_commands_total{command=\"DEVICE_COUNT\"}"), Some(0.0));

    let (s, v) = api
        .call("POST", "/v1/workers", Some(json!({ "address": addr.to_string(), "labels": ["local", "a"] })))
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    assert!(v["health"].is_null());
    let (s, v) = api.call("POST", "/v1/workers", Some(json!({ "address": addr.to_string() }))).await;
    assert_eq!((s, v["code"].as_str()), (StatusCode::CONFLICT, Some("worker-exists")));
    let (s, _) = api.call("POST", "/v1/workers", Some(json!({ "address": "no-port" }))).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);

    let (s, v) = api.call("POST", &format!("/v1/workers/{addr}/probe"), None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let h = &v["health"];
    assert_eq!(h["ok"], true, "{v}");
    assert_eq!(h["protocol_version"], "8.0.0");
    assert_eq!(h["devices"], json!([{ "index": 0, "free": 16u64 << 20, "total": 16u64 << 20 }]));
    assert!(h["rtt_us"].as_u64().unwrap() < 2_000_000);
    assert!(h["error"].is_null());

    // The probe went through the RPC server whose counters the admin API reads.
    let m = api.metrics().await;
    assert_eq!(metric(&m, "llamad_rpc_commands_total{command=\"DEVICE_COUNT\"}"), Some(1.0));
    assert_eq!(metric(&m, "llamad_rpc_commands_total{command=\"GET_DEVICE_MEMORY\"}"), Some(1.0));
    assert_eq!(metric(&m, "llamad_rpc_connections_total"), Some(1.0));
    let (_, st) = api.call("GET", "/v1/status", None).await;
    assert_eq!(st["protocol_version"], "8.0.0");
    assert_eq!(st["protocols"][0]["version"], "8.0.0");
    assert_eq!(st["rpc"]["connections_total"], 1);
    assert_eq!(st["memory"]["total"], 16u64 << 20);
    assert_eq!(st["devices"], json!([{ "index": 0, "name": "CPU" }]));
    assert!(st["rpc"]["commands"]
        .as_array()
        .unwrap()
        .iter()
        .any(|c| c["command"] == "HELLO" && c["count"] == 1));

    // A port nobody listens on.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    api.call("POST", "/v1/workers", Some(json!({ "address": dead.to_string() }))).await;
    let (s, v) = api.call("POST", &format!("/v1/workers/{dead}/probe"), None).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["health"]["ok"], false);
    assert!(v["health"]["error"].as_str().unwrap().contains("connect"), "{v}");

    // Persisted: a new state on the same directory has both, with their health.
    drop(api);
    let api = Api::open(dir.path(), None, shared);
    let (_, v) = api.call("GET", "/v1/workers", None).await;
    let ws = v["workers"].as_array().unwrap();
    assert_eq!(ws.len(), 2);
    let w = ws.iter().find(|w| w["address"] == addr.to_string()).unwrap();
    assert_eq!(w["labels"], json!(["local", "a"]));
    assert_eq!(w["health"]["ok"], true);

    let (s, _) = api.call("DELETE", &format!("/v1/workers/{dead}"), None).await;
    assert_eq!(s, StatusCode::OK);
    let (s, v) = api.call("DELETE", &format!("/v1/workers/{dead}"), None).await;
    assert_eq!((s, v["code"].as_str()), (StatusCode::NOT_FOUND, Some("worker-not-found")));
    let (_, v) = api.call("GET", "/v1/workers", None).await;
    assert_eq!(v["workers"].as_array().unwrap().len(), 1);
    let _ = stop.send(());
}

/// `serve` probes every worker periodically, and `start` serves on a Unix socket (mode 0600).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn periodic_probe_and_unix_socket() {
    use std::io::{Read, Write};
    use std::time::Duration;

    let dir = tempfile::tempdir().unwrap();
    let shared = rpc_shared();
    let (addr, stop_rpc) = crate::common::rpc_server(shared.clone()).await;
    let sock = dir.path().join("admin.sock");
    let cfg = llamad::admin::AdminConfig {
        listen: format!("unix:{}", sock.display()),
        probe_interval: Duration::from_millis(100),
        ..crate::common::config(dir.path())
    };
    // Register the worker before the server starts: only the periodic probe can fill its health.
    std::fs::write(
        dir.path().join("workers.json"),
        json!([{ "address": addr.to_string(), "labels": [], "added_ms": 1, "health": null }]).to_string(),
    )
    .unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = llamad::admin::start(cfg, shared, None, None, async move {
        let _ = stopped.await;
    })
    .await
    .unwrap();
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&sock).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600);
    let token = std::fs::read_to_string(dir.path().join("admin.token")).unwrap().trim().to_string();
    let get = move |path: String| {
        let mut s = std::os::unix::net::UnixStream::connect(&sock).unwrap();
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut b = String::new();
        s.read_to_string(&mut b).unwrap();
        b
    };
    let g = get.clone();
    let health = tokio::task::spawn_blocking(move || g("/v1/health".into())).await.unwrap();
    assert!(health.starts_with("HTTP/1.1 200") && health.ends_with("{\"status\":\"ok\"}"), "{health}");
    let mut probed = false;
    for _ in 0..100 {
        let g = get.clone();
        let w = tokio::task::spawn_blocking(move || g(format!("/v1/workers/{addr}"))).await.unwrap();
        if w.contains("\"ok\":true") {
            probed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(probed, "the periodic probe filled the worker's health");
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), server).await.unwrap().unwrap().unwrap();
    let _ = stop_rpc.send(());
}
