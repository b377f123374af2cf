//! The error body every failed request returns, and its machine-readable codes.

use serde::{Deserialize, Serialize};

/// `{ "code": "...", "message": "..." }`: `code` is one of the constants in [`code`], `message` is for people.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ErrorBody {
    /// A stable code from [`code`].
    pub code: String,
    /// A human-readable explanation (lowercase, no trailing period).
    pub message: String,
}

impl ErrorBody {
    /// A body with `code` and `message`.
    pub fn new(code: &str, message: impl Into<String>) -> ErrorBody {
        ErrorBody { code: code.to_string(), message: message.into() }
    }
}

impl std::fmt::Display for ErrorBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

/// Error codes. Clients match on these, never on messages.
pub mod code {
    /// No `Authorization: Bearer` header.
    pub const UNAUTHENTICATED: &str = "unauthenticated";
    /// A bearer token that is not the daemon's.
    pub const FORBIDDEN: &str = "forbidden";
    /// A malformed request (bad JSON, bad query, bad digest).
    pub const BAD_REQUEST: &str = "bad-request";
    /// No such route.
    pub const NOT_FOUND: &str = "not-found";
    /// The request took longer than the server allows.
    pub const TIMEOUT: &str = "timeout";
    /// A server-side failure (I/O, index).
    pub const INTERNAL: &str = "internal";
    /// The daemon runs without a tensor cache.
    pub const CACHE_DISABLED: &str = "cache-disabled";
    /// No cache object with that digest.
    pub const CACHE_OBJECT_NOT_FOUND: &str = "cache-object-not-found";
    /// The file given to `cache import` could not be read as GGUF.
    pub const CACHE_IMPORT_FAILED: &str = "cache-import-failed";
    /// No worker with that address.
    pub const WORKER_NOT_FOUND: &str = "worker-not-found";
    /// A worker with that address is already registered.
    pub const WORKER_EXISTS: &str = "worker-exists";
    /// No job with that id.
    pub const JOB_NOT_FOUND: &str = "job-not-found";
    /// The job is already finished and cannot be cancelled.
    pub const JOB_FINISHED: &str = "job-finished";
    /// The request names a feature this build does not have.
    pub const NOT_IMPLEMENTED: &str = "not-implemented";
    /// A job's worker was unreachable, refused the model or failed while it ran (the message names it).
    pub const WORKER_FAILED: &str = "worker-failed";
}
