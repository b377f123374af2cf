//! `llamad-api`: request and response types of llamad's admin API (`/v1/`).
//!
//! The daemon serves these as JSON and `llamactl` reads them; neither side defines its own copy. The
//! crate has no async or HTTP dependency. With the `openapi` feature every type also derives
//! `utoipa::ToSchema`, which the daemon uses to describe its routes.
//!
//! Conventions: sizes are `u64` bytes, instants are milliseconds since the Unix epoch (`*_ms`),
//! durations carry their unit in the field name (`uptime_secs`, `rtt_us`). Digests are lowercase hex.
//!
//! ```
//! use llamad_api::{ErrorBody, code};
//! let e: ErrorBody = serde_json::from_str(r#"{"code":"cache-object-not-found","message":"no object 00ab"}"#).unwrap();
//! assert_eq!(e.code, code::CACHE_OBJECT_NOT_FOUND);
//! ```

pub mod cache;
pub mod error;
pub mod jobs;
pub mod models;
pub mod status;
pub mod workers;

pub use cache::*;
pub use error::{code, ErrorBody};
pub use jobs::*;
pub use models::*;
pub use status::*;
pub use workers::*;

/// The RPC protocol version llamad announces unless configured otherwise.
pub const PROTOCOL_VERSION: &str = "8.0.0";

/// The path prefix of every versioned route.
pub const API_PREFIX: &str = "/v1";

/// Default admin listen address.
pub const DEFAULT_ADMIN_ADDR: &str = "127.0.0.1:50053";
