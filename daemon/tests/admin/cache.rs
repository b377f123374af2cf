//! Cache routes against a real `cachestore::Store` in a temp dir: list (filter, sort, paging), stat,
//! pin/unpin, rm, verify (after a byte flip on disk), gc, totals with hit rate, and GGUF import keyed
//! by llama.cpp's wire hash; and the request timeout's JSON 408.

use std::sync::Arc;

use axum::http::StatusCode;
use cachestore::{Digest, Store, WireHash};
use serde_json::json;

use crate::common::{metric, rpc_shared, write_tiny_model, Api};

#[tokio::test]
async fn cache_routes_on_a_real_store() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(&dir.path().join("cache"), Default::default()).unwrap());
    let a = store.put(&[1u8; 100], Some(WireHash(7)), Some("blk.0.attn_q.weight")).unwrap();
    let b = store.put(&[2u8; 300], None, Some("blk.0.ffn_up.weight")).unwrap();
    let c = store.put(&[3u8; 200], None, Some("output.weight")).unwrap();
    let api = Api::open(dir.path(), Some(store.clone()), rpc_shared());

    // Filter by name, sort by size ascending.
    let (s, v) = api.call("GET", "/v1/cache?name=blk.0&sort=size&asc=true", None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["total"], 2);
    let digests: Vec<&str> =
        v["items"].as_array().unwrap().iter().map(|i| i["digest"].as_str().unwrap()).collect();
    assert_eq!(digests, [a.to_hex(), b.to_hex()]);
    assert_eq!(v["items"][0]["wire_hash"], "0000000000000007");
    assert_eq!(v["items"][0]["label"], "blk.0.attn_q.weight");
    // Minimum size, default order (last used, descending) and paging.
    let (_, v) = api.call("GET", "/v1/cache?min_size=150&sort=size", None).await;
    assert_eq!(v["total"], 2);
    assert_eq!(v["items"][0]["digest"], b.to_hex());
    assert_eq!(v["items"][1]["digest"], c.to_hex());
    let (_, v) = api.call("GET", "/v1/cache?sort=size&offset=1&limit=1", None).await;
    assert_eq!((v["total"].as_u64(), v["items"].as_array().unwrap().len()), (Some(3), 1));
    assert_eq!(v["items"][0]["digest"], c.to_hex());
    let (s, v) = api.call("GET", "/v1/cache?min_size=lots", None).await;
    assert_eq!((s, v["code"].as_str()), (StatusCode::BAD_REQUEST, Some("bad-request")));

    // Stat, pin, unpin.
    let (s, v) = api.call("GET", &format!("/v1/cache/{a}"), None).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!((v["size"].as_u64(), v["pinned"].as_bool()), (Some(100), Some(false)));
    let (s, v) = api.call("POST", &format!("/v1/cache/{a}/pin"), None).await;
    assert_eq!((s, v["pinned"].as_bool()), (StatusCode::OK, Some(true)));
    assert!(store.stat(&a).unwrap().unwrap().pinned);
    let (_, v) = api.call("GET", "/v1/cache?pinned=true", None).await;
    assert_eq!(v["items"][0]["digest"], a.to_hex());
    let (_, v) = api.call("GET", "/v1/cache/totals", None).await;
    assert_eq!(
        (v["count"].as_u64(), v["bytes"].as_u64(), v["pinned_bytes"].as_u64()),
        (Some(3), Some(600), Some(100))
    );
    api.call("POST", &format!("/v1/cache/{a}/unpin"), None).await;
    assert!(!store.stat(&a).unwrap().unwrap().pinned);
    let missing = Digest::of(b"not stored");
    let (s, v) = api.call("GET", &format!("/v1/cache/{missing}"), None).await;
    assert_eq!((s, v["code"].as_str()), (StatusCode::NOT_FOUND, Some("cache-object-not-found")));
    let (s, v) = api.call("POST", "/v1/cache/zz/pin", None).await;
    assert_eq!((s, v["code"].as_str()), (StatusCode::BAD_REQUEST, Some("bad-request")));

    // Hit rate: one hit, one miss.
    assert!(store.get(&a).unwrap().is_some());
    assert!(store.get(&missing).unwrap().is_none());
    let (_, v) = api.call("GET", "/v1/cache/totals", None).await;
    assert_eq!(
        (v["hits"].as_u64(), v["misses"].as_u64(), v["hit_rate"].as_f64()),
        (Some(1), Some(1), Some(0.5))
    );
    assert_eq!(v["bytes_saved"], 100);
    let m = api.metrics().await;
    assert_eq!(metric(&m, "llamad_cache_hits_total"), Some(1.0));
    assert_eq!(metric(&m, "llamad_cache_misses_total"), Some(1.0));
    assert_eq!(metric(&m, "llamad_cache_bytes_saved_total"), Some(100.0));

    // Verify finds a flipped byte.
    let (_, v) = api.call("POST", "/v1/cache/verify", Some(json!({}))).await;
    assert_eq!((v["checked"].as_u64(), v["corrupt"].as_array().unwrap().len()), (Some(3), 0));
    let p = store.layout().object_path(&c);
    std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let mut bytes = std::fs::read(&p).unwrap();
    bytes[5] ^= 0x40;
    std::fs::write(&p, bytes).unwrap();
    let (_, v) = api.call("POST", "/v1/cache/verify", Some(json!({ "digest": b.to_hex() }))).await;
    assert_eq!((v["checked"].as_u64(), v["corrupt"].as_array().unwrap().len()), (Some(1), 0));
    let (_, v) = api.call("POST", "/v1/cache/verify", Some(json!({}))).await;
    assert_eq!(v["corrupt"], json!([c.to_hex()]));

    // Remove; gc reports a leftover temp file... or nothing, but answers.
    let (s, v) = api.call("DELETE", &format!("/v1/cache/{b}"), None).await;
    assert_eq!((s, v["exists"].as_bool()), (StatusCode::OK, Some(false)));
    let (s, _) = api.call("DELETE", &format!("/v1/cache/{b}"), None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, v) = api.call("POST", "/v1/cache/gc", None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert!(v["stale_entries"].is_u64());

    // Import a GGUF: every tensor, labelled, keyed by FNV-1a-64; a second import adds nothing.
    let model = dir.path().join("tiny.gguf");
    write_tiny_model(&model);
    let (s, v) = api.call("POST", "/v1/cache/import", Some(json!({ "path": model }))).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let g = compute::gguf::Gguf::read(&model).unwrap();
    assert_eq!(v["tensors"].as_u64(), Some(g.tensors().len() as u64));
    assert_eq!(v["new"], v["tensors"]);
    let info = g.tensor_info("blk.0.ffn_up.weight").unwrap();
    let data = g.tensor_data(info).unwrap();
    assert_eq!(v["bytes"].as_u64(), Some(g.tensors().iter().map(|t| t.size).sum::<u64>()));
    let fnv =
        data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| (h ^ u64::from(x)).wrapping_mul(0x100_0000_01b3));
    let found = store.find_by_wire_hash(WireHash(fnv), Some(data.len() as u64)).unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].label.as_deref(), Some("blk.0.ffn_up.weight"));
    assert_eq!(found[0].digest, Digest::of(data));
    let (_, v) = api.call("POST", "/v1/cache/import", Some(json!({ "path": model }))).await;
    assert_eq!(v["new"], 0);
    let (s, v) =
        api.call("POST", "/v1/cache/import", Some(json!({ "path": dir.path().join("nope.gguf") }))).await;
    assert_eq!((s, v["code"].as_str()), (StatusCode::BAD_REQUEST, Some("cache-import-failed")));
}

#[tokio::test]
async fn cache_routes_without_a_cache_say_so() {
    let dir = tempfile::tempdir().unwrap();
    let api = Api::new(dir.path());
    let (s, v) = api.call("GET", "/v1/cache", None).await;
    assert_eq!((s, v["code"].as_str()), (StatusCode::CONFLICT, Some("cache-disabled")));
}

#[tokio::test]
async fn slow_requests_time_out_with_a_json_error() {
    // A "worker" that accepts (the kernel does, from the backlog) but never answers HELLO: the probe
    // blocks for its 2 s timeout, far beyond the 100 ms request timeout.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = silent.local_addr().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cfg = llamad::admin::AdminConfig {
        request_timeout: std::time::Duration::from_millis(100),
        ..crate::common::config(dir.path())
    };
    let state = llamad::admin::AdminState::new(cfg, rpc_shared(), None, None).unwrap();
    let token = state.token().expose().to_string();
    state.workers().add(llamad_api::WorkerAdd { address: addr.to_string(), labels: vec![] }).unwrap();
    let app = llamad::admin::router(state);
    let req = axum::http::Request::post(format!("/v1/workers/{addr}/probe"))
        .header("authorization", format!("Bearer {token}"))
        .body(axum::body::Body::empty())
        .unwrap();
    let t0 = std::time::Instant::now();
    let rsp = tower::ServiceExt::oneshot(app, req).await.unwrap();
    assert!(t0.elapsed() < std::time::Duration::from_millis(1500), "{:?}", t0.elapsed());
    assert_eq!(rsp.status(), StatusCode::REQUEST_TIMEOUT);
    let b = http_body_util::BodyExt::collect(rsp.into_body()).await.unwrap().to_bytes();
    let v: serde_json::Value = serde_json::from_slice(&b).unwrap();
    assert_eq!(v["code"], "timeout");
    drop(silent);
}
