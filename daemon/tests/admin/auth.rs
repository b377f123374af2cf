//! Every route but `GET /v1/health` refuses a missing (401) or wrong (403) token; the routes are taken
//! from the OpenAPI description (which `openapi.rs` checks against the router), so a new route is
//! covered as soon as it is described. The token never appears in the logs, even at TRACE level, from
//! its creation to refused and accepted requests (`ctl/tests/e2e.rs` checks the real binary's log too).

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};

use axum::http::StatusCode;
use llamad::admin::openapi::described_routes;
use llamad::admin::router::HEALTH;
use serde_json::{json, Value};

use crate::common::Api;

/// A concrete path for a route pattern.
pub fn concrete(path: &str) -> String {
    path.replace("{digest}", &"ab".repeat(32)).replace("{address}", "127.0.0.1:9").replace("{id}", "0000")
}

#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Every log line of every test in this binary, at TRACE level. A process-wide subscriber: a scoped one
/// (`set_default`) misses events whose callsites another test thread registered first.
fn capture() -> &'static Capture {
    static CAP: OnceLock<Capture> = OnceLock::new();
    CAP.get_or_init(|| {
        let cap = Capture::default();
        let w = cap.clone();
        let sub = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(move || w.clone())
            .finish();
        tracing::subscriber::set_global_default(sub).unwrap();
        cap
    })
}

#[tokio::test]
async fn missing_or_wrong_token_is_refused_and_never_logged() {
    let cap = capture();

    let dir = tempfile::tempdir().unwrap();
    let api = Api::new(dir.path());
    // The token file was created, 64 hex digits, mode 0600.
    let file = dir.path().join("admin.token");
    let meta = std::fs::metadata(&file).unwrap();
    assert_eq!(std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777, 0o600);
    assert_eq!(std::fs::read_to_string(&file).unwrap().trim(), api.token);
    assert_eq!(api.token.len(), 64);
    assert!(api.token.bytes().all(|b| b.is_ascii_hexdigit()));

    let body = json!({});
    let mut checked = 0;
    let routes = described_routes();
    assert!(routes.len() > 20, "{routes:?}");
    for (m, p) in &routes {
        let (m, p) = (m.as_str(), p.as_str());
        let path = concrete(p);
        let b = (m == "POST").then_some(&body);
        if (m, p) == HEALTH {
            let (s, _) = api.raw(m, &path, None, None).await;
            assert_eq!(s, StatusCode::OK, "{m} {p}");
            continue;
        }
        let (s, b1) = api.raw(m, &path, None, b).await;
        assert_eq!(s, StatusCode::UNAUTHORIZED, "{m} {p} without a token");
        let v: Value = serde_json::from_slice(&b1).unwrap();
        assert_eq!(v["code"], llamad_api::code::UNAUTHENTICATED, "{m} {p}");
        // The token with its last digit changed (appending a fixed "0" would be the token itself
        // whenever it already ends in 0: one run in 16).
        let last = if api.token.ends_with('0') { '1' } else { '0' };
        let wrong = format!("{}{last}", &api.token[..63]);
        let (s, b2) = api.raw(m, &path, Some(&wrong), b).await;
        assert_eq!(s, StatusCode::FORBIDDEN, "{m} {p} with a wrong token");
        let v: Value = serde_json::from_slice(&b2).unwrap();
        assert_eq!(v["code"], llamad_api::code::FORBIDDEN, "{m} {p}");
        let (s, _) = api.raw(m, &path, Some(&api.token), b).await;
        assert!(s != StatusCode::UNAUTHORIZED && s != StatusCode::FORBIDDEN, "{m} {p} with the token: {s}");
        checked += 1;
    }
    assert_eq!(checked, routes.len() - 1, "every route but health needs the token");
    // A second state on the same directory reads the same token instead of making a new one.
    let again = Api::new(dir.path());
    assert_eq!(again.token, api.token);

    let logs = String::from_utf8(cap.0.lock().unwrap().clone()).unwrap();
    assert!(logs.contains("admin token created"), "capture works");
    assert!(logs.contains("admin request method=GET path=/v1/status status=200"), "requests are logged");
    assert!(logs.contains("admin request with a wrong token"), "refusals are logged");
    assert!(!logs.contains(&api.token), "the token appears in the logs");
    assert!(!logs.contains(&api.token[..16]), "part of the token appears in the logs");
}

#[tokio::test]
async fn unknown_route_is_a_json_404() {
    let dir = tempfile::tempdir().unwrap();
    let api = Api::new(dir.path());
    let (s, v) = api.call("GET", "/v1/nope", None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert_eq!(v["code"], llamad_api::code::NOT_FOUND);
}
