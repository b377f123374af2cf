//! The OpenAPI description lists exactly the router's routes, and each of them is really mounted.

use std::collections::BTreeSet;

use axum::http::StatusCode;
use llamad::admin::openapi::described_routes;
use llamad::admin::router::ROUTES;
use serde_json::{json, Value};

use crate::auth::concrete;
use crate::common::Api;

#[tokio::test]
async fn described_paths_equal_the_routes() {
    let want: BTreeSet<(String, String)> =
        ROUTES.iter().map(|(m, p)| (m.to_string(), p.to_string())).collect();
    let got: BTreeSet<(String, String)> = described_routes().into_iter().collect();
    assert_eq!(got, want);
    assert_eq!(want.len(), ROUTES.len(), "no duplicate route");

    let dir = tempfile::tempdir().unwrap();
    let store =
        std::sync::Arc::new(cachestore::Store::open(&dir.path().join("cache"), Default::default()).unwrap());
    let api = Api::open(dir.path(), Some(store), crate::common::rpc_shared());
    // The served document is the same description.
    let (s, doc) = api.call("GET", "/v1/openapi.json", None).await;
    assert_eq!(s, StatusCode::OK);
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    let served: BTreeSet<(String, String)> = doc["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(p, item)| item.as_object().unwrap().keys().map(move |m| (m.to_uppercase(), p.clone())))
        .filter(|(m, _)| ["GET", "POST", "DELETE", "PUT", "PATCH"].contains(&m.as_str()))
        .collect();
    assert_eq!(served, want);
    assert!(doc["components"]["schemas"]["JobSubmit"].is_object());
    assert!(doc["components"]["securitySchemes"]["bearer"].is_object());

    // Each route is mounted: the answer never comes from the fallback (code `not-found`) or a 405.
    let body = json!({});
    for &(m, p) in ROUTES {
        let b = (m == "POST").then_some(&body);
        let (s, raw) = api.raw(m, &concrete(p), Some(&api.token), b).await;
        assert_ne!(s, StatusCode::METHOD_NOT_ALLOWED, "{m} {p}");
        if let Ok(v) = serde_json::from_slice::<Value>(&raw) {
            assert_ne!(v["code"], llamad_api::code::NOT_FOUND, "{m} {p} fell through to the fallback");
        }
    }
}
