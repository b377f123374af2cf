//! The bearer token: loaded from its file or created (random, mode 0600) when the file does not exist,
//! and checked on every request except `GET /v1/health`. The token is never logged or formatted:
//! [`Token`]'s `Debug` prints a placeholder.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use llamad_api::code;
use rand::RngCore;
use tracing::{info, warn};

use crate::admin::error::ApiError;
use crate::admin::AdminState;
use crate::error::{Error, Result};

/// Random bytes in a new token (hex-encoded, so 64 characters).
const TOKEN_BYTES: usize = 32;

/// A bearer token.
#[derive(Clone)]
pub struct Token(String);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

impl Token {
    /// A token with this value (tests).
    pub fn new(value: impl Into<String>) -> Token {
        Token(value.into())
    }

    /// The secret itself, to write into a client's header.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Reads the token in `path` (surrounding whitespace trimmed), or creates the file with a new random
    /// token and mode 0600 when it does not exist.
    pub fn load_or_create(path: &Path) -> Result<Token> {
        let io = |e: std::io::Error| Error::Config(format!("token file {}: {e}", path.display()));
        match std::fs::read_to_string(path) {
            Ok(s) => {
                let t = s.trim();
                if t.is_empty() {
                    return Err(Error::Config(format!("token file {}: empty", path.display())));
                }
                info!(path = %path.display(), "admin token loaded");
                Ok(Token(t.to_string()))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if let Some(dir) = path.parent() {
                    std::fs::create_dir_all(dir).map_err(io)?;
                }
                let mut raw = [0u8; TOKEN_BYTES];
                rand::rng().fill_bytes(&mut raw);
                let value: String = raw.iter().map(|b| format!("{b:02x}")).collect();
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(path)
                    .map_err(io)?;
                f.write_all(value.as_bytes()).map_err(io)?;
                f.write_all(b"\n").map_err(io)?;
                f.sync_all().map_err(io)?;
                info!(path = %path.display(), "admin token created");
                Ok(Token(value))
            }
            Err(e) => Err(io(e)),
        }
    }

    /// Compares in time independent of where the first difference is.
    pub fn matches(&self, candidate: &str) -> bool {
        constant_time_eq(self.0.as_bytes(), candidate.as_bytes())
    }
}

/// Whether `a == b`, in time independent of where the first difference is (the length is not
/// secret).
pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The token of an `Authorization: Bearer TOKEN` header, if the request has one.
pub(crate) fn bearer(headers: &axum::http::HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
}

/// Middleware: 401 without a bearer token, 403 with a wrong one.
pub async fn require_token(State(state): State<AdminState>, req: Request, next: Next) -> Response {
    match bearer(req.headers()) {
        None => {
            warn!(method = %req.method(), path = %req.uri().path(), "admin request without a token");
            axum::response::IntoResponse::into_response(ApiError::new(
                StatusCode::UNAUTHORIZED,
                code::UNAUTHENTICATED,
                "missing `Authorization: Bearer <token>`",
            ))
        }
        Some(t) if !state.token().matches(t) => {
            warn!(method = %req.method(), path = %req.uri().path(), "admin request with a wrong token");
            axum::response::IntoResponse::into_response(ApiError::new(
                StatusCode::FORBIDDEN,
                code::FORBIDDEN,
                "wrong token",
            ))
        }
        Some(_) => next.run(req).await,
    }
}
