//! `/v1/cache`: the tensor cache (list, stat, remove, pin, verify, gc, import, totals).

use serde::{Deserialize, Serialize};

/// One cached object.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CacheObject {
    /// BLAKE3 digest, 64 hex digits.
    pub digest: String,
    /// Bytes.
    pub size: u64,
    /// When it was stored (ms since the epoch).
    pub created_ms: u64,
    /// Last use (ms since the epoch).
    pub last_used_ms: u64,
    /// Times served.
    pub hits: u64,
    /// Pinned objects are never evicted.
    pub pinned: bool,
    /// llama.cpp's FNV-1a-64 of the content, 16 hex digits, when known.
    pub wire_hash: Option<String>,
    /// A name (the tensor name when imported from a GGUF).
    pub label: Option<String>,
}

/// Sort order of `GET /v1/cache`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "kebab-case")]
pub enum CacheSort {
    /// By size.
    Size,
    /// By last use (default).
    #[default]
    LastUsed,
    /// By hits.
    Hits,
    /// By creation time.
    Created,
}

/// Query string of `GET /v1/cache`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams, utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", into_params(parameter_in = Query))]
pub struct CacheListQuery {
    /// Only objects whose label contains this.
    pub name: Option<String>,
    /// Only objects of at least this many bytes.
    pub min_size: Option<u64>,
    /// Only pinned (true) or unpinned (false) objects.
    pub pinned: Option<bool>,
    /// Sort key (default `last-used`).
    pub sort: Option<CacheSort>,
    /// Ascending instead of descending.
    pub asc: Option<bool>,
    /// Skip this many.
    pub offset: Option<u64>,
    /// Return at most this many (default 100, at most 10000).
    pub limit: Option<u64>,
}

/// `GET /v1/cache`: one page.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CacheList {
    /// Objects matching the filter, before paging.
    pub total: u64,
    /// This page.
    pub items: Vec<CacheObject>,
}

/// `GET /v1/cache/totals`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CacheTotals {
    /// Objects.
    pub count: u64,
    /// Bytes of all objects.
    pub bytes: u64,
    /// Pinned objects.
    pub pinned_count: u64,
    /// Bytes of pinned objects.
    pub pinned_bytes: u64,
    /// The size limit, if any.
    pub max_size: Option<u64>,
    /// Lookups that served an object since the daemon started.
    pub hits: u64,
    /// Lookups that found nothing.
    pub misses: u64,
    /// `hits / (hits + misses)`, 0 without lookups.
    pub hit_rate: f64,
    /// Bytes served from the cache (bytes a peer did not have to send).
    pub bytes_saved: u64,
    /// Objects evicted to respect the limit.
    pub evictions: u64,
}

/// `POST /v1/cache/verify` body.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct VerifyRequest {
    /// One object; all objects when absent.
    pub digest: Option<String>,
}

/// `POST /v1/cache/verify` answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct VerifyReport {
    /// Objects re-hashed.
    pub checked: u64,
    /// Digests whose content did not match (they are dropped from the cache).
    pub corrupt: Vec<String>,
}

/// `POST /v1/cache/gc` answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GcReport {
    /// Leftover temporary files removed.
    pub temp_removed: u64,
    /// Index entries without a file, removed.
    pub stale_entries: u64,
    /// Files whose size disagreed with the index.
    pub wrong_size: u64,
    /// Files found without an index entry, indexed.
    pub orphans_indexed: u64,
    /// Files moved aside as corrupt.
    pub quarantined: u64,
    /// Duplicate files removed.
    pub duplicates_removed: u64,
}

/// `POST /v1/cache/import` body.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ImportRequest {
    /// A GGUF file readable by the daemon.
    pub path: String,
}

/// `POST /v1/cache/import` answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ImportReport {
    /// Tensors read from the file.
    pub tensors: u64,
    /// Of these, tensors that were not cached before.
    pub new: u64,
    /// Bytes of all tensors.
    pub bytes: u64,
}

/// `POST /v1/cache/{digest}/pin` and `/unpin`, `DELETE /v1/cache/{digest}` answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CacheAck {
    /// The object.
    pub digest: String,
    /// Pinned after the call (false after a removal).
    pub pinned: bool,
    /// Whether the object still exists.
    pub exists: bool,
}
