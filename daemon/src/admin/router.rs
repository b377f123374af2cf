//! The routes: one table ([`ROUTES`]) from which both the router and the OpenAPI test are built, the
//! token check on every route except `GET /v1/health`, a request timeout, and a request log line that
//! never includes headers.

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{self, MethodRouter};
use axum::Router;
use tracing::Instrument;

use llamad_api::code;

use crate::admin::error::ApiError;
use crate::admin::{auth, handlers, AdminState};

/// Every route: `(method, path)`, in the order they are mounted. `GET /v1/health` is the only one
/// without authentication.
pub const ROUTES: &[(&str, &str)] = &[
    ("GET", "/v1/health"),
    ("GET", "/v1/status"),
    ("GET", "/metrics"),
    ("GET", "/v1/openapi.json"),
    ("GET", "/v1/cache"),
    ("GET", "/v1/cache/totals"),
    ("POST", "/v1/cache/verify"),
    ("POST", "/v1/cache/gc"),
    ("POST", "/v1/cache/import"),
    ("GET", "/v1/cache/{digest}"),
    ("DELETE", "/v1/cache/{digest}"),
    ("POST", "/v1/cache/{digest}/pin"),
    ("POST", "/v1/cache/{digest}/unpin"),
    ("GET", "/v1/workers"),
    ("POST", "/v1/workers"),
    ("GET", "/v1/workers/{address}"),
    ("DELETE", "/v1/workers/{address}"),
    ("POST", "/v1/workers/{address}/probe"),
    ("GET", "/v1/jobs"),
    ("POST", "/v1/jobs"),
    ("GET", "/v1/jobs/{id}"),
    ("POST", "/v1/jobs/{id}/cancel"),
    ("GET", "/v1/jobs/{id}/events"),
    ("GET", "/v1/models"),
];

/// The public route.
pub const HEALTH: (&str, &str) = ("GET", "/v1/health");

fn handler(method: &str, path: &str) -> Option<MethodRouter<AdminState>> {
    use handlers as h;
    Some(match (method, path) {
        ("GET", "/v1/health") => routing::get(h::health),
        ("GET", "/v1/status") => routing::get(h::status),
        ("GET", "/metrics") => routing::get(h::metrics),
        ("GET", "/v1/openapi.json") => routing::get(h::openapi_json),
        ("GET", "/v1/cache") => routing::get(h::cache_list),
        ("GET", "/v1/cache/totals") => routing::get(h::cache_totals),
        ("POST", "/v1/cache/verify") => routing::post(h::cache_verify),
        ("POST", "/v1/cache/gc") => routing::post(h::cache_gc),
        ("POST", "/v1/cache/import") => routing::post(h::cache_import),
        ("GET", "/v1/cache/{digest}") => routing::get(h::cache_stat),
        ("DELETE", "/v1/cache/{digest}") => routing::delete(h::cache_remove),
        ("POST", "/v1/cache/{digest}/pin") => routing::post(h::cache_pin),
        ("POST", "/v1/cache/{digest}/unpin") => routing::post(h::cache_unpin),
        ("GET", "/v1/workers") => routing::get(h::workers_list),
        ("POST", "/v1/workers") => routing::post(h::workers_add),
        ("GET", "/v1/workers/{address}") => routing::get(h::workers_get),
        ("DELETE", "/v1/workers/{address}") => routing::delete(h::workers_remove),
        ("POST", "/v1/workers/{address}/probe") => routing::post(h::workers_probe),
        ("GET", "/v1/jobs") => routing::get(h::jobs_list),
        ("POST", "/v1/jobs") => routing::post(h::jobs_submit),
        ("GET", "/v1/jobs/{id}") => routing::get(h::jobs_show),
        ("POST", "/v1/jobs/{id}/cancel") => routing::post(h::jobs_cancel),
        ("GET", "/v1/jobs/{id}/events") => routing::get(h::jobs_events),
        ("GET", "/v1/models") => routing::get(h::models_list),
        _ => return None,
    })
}

fn mount(
    mut r: Router<AdminState>,
    routes: impl Iterator<Item = (&'static str, &'static str)>,
) -> Router<AdminState> {
    for (m, p) in routes {
        // Every entry of ROUTES has a handler (checked by a unit test).
        if let Some(h) = handler(m, p) {
            r = r.route(p, h);
        }
    }
    r
}

/// Logs method, path, status and duration of each request; no header (so never the token).
async fn log_request(req: Request, next: Next) -> Response {
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    let span = tracing::debug_span!("admin", %method, %path);
    let t0 = std::time::Instant::now();
    let rsp = next.run(req).instrument(span).await;
    tracing::debug!(%method, %path, status = rsp.status().as_u16(), ms = t0.elapsed().as_millis() as u64, "admin request");
    rsp
}

/// Answers 408 `timeout` (JSON, as every error) when the handler has not answered within the configured
/// time. Our own middleware rather than tower-http's `TimeoutLayer`, whose 408 has an empty body. It bounds
/// the time to the response head; an SSE body then streams as long as the job runs.
async fn timeout(State(state): State<AdminState>, req: Request, next: Next) -> Response {
    let limit = state.config().request_timeout;
    match tokio::time::timeout(limit, next.run(req)).await {
        Ok(rsp) => rsp,
        Err(_) => ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            code::TIMEOUT,
            format!("no answer within {} ms", limit.as_millis()),
        )
        .into_response(),
    }
}

/// The admin router over `state`.
pub fn router(state: AdminState) -> Router {
    let public = mount(Router::new(), ROUTES.iter().copied().filter(|r| *r == HEALTH));
    let private = mount(Router::new(), ROUTES.iter().copied().filter(|r| *r != HEALTH))
        .route_layer(middleware::from_fn_with_state(state.clone(), auth::require_token));
    public
        .merge(private)
        .fallback(handlers::fallback)
        .method_not_allowed_fallback(handlers::fallback)
        .layer(middleware::from_fn_with_state(state.clone(), timeout))
        .layer(middleware::from_fn(log_request))
        .with_state(state)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_route_has_a_handler() {
        for (m, p) in ROUTES {
            assert!(handler(m, p).is_some(), "{m} {p}");
        }
        assert!(handler("GET", "/nope").is_none());
    }
}
