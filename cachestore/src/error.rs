//! The crate's error type: one enum, with the context (path, digest, operation) a reader needs.

use std::path::PathBuf;

use crate::Digest;

/// Result alias used throughout `cachestore`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in the store.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A filesystem operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What we were doing (`"create"`, `"rename"`, `"fsync"`, ...).
        op: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The redb index failed.
    #[error("index {op}: {source}")]
    Redb {
        /// The index operation.
        op: &'static str,
        /// The underlying redb error.
        #[source]
        source: Box<redb::Error>,
    },
    /// Another process (or another `Store` in this process) holds the index open.
    #[error("cache index {path} is already open by another store")]
    Locked {
        /// The index file.
        path: PathBuf,
    },
    /// An index record could not be decoded.
    #[error("corrupt index record for {digest}: {reason}")]
    CorruptRecord {
        /// The record's key.
        digest: Digest,
        /// What was wrong with it.
        reason: &'static str,
    },
    /// A string is not a 64-digit hex BLAKE3 digest.
    #[error("invalid digest {input:?}: expected 64 hex digits")]
    InvalidDigest {
        /// The rejected text (truncated to 80 characters).
        input: String,
    },
    /// The object is not in the store.
    #[error("object {digest} not found")]
    NotFound {
        /// The missing digest.
        digest: Digest,
    },
    /// The object can never fit under `max_size`, or pinned objects leave no room for it.
    #[error("object of {size} bytes does not fit: {available} of max_size {max_size} bytes can be freed")]
    NoSpace {
        /// Size of the object being stored.
        size: u64,
        /// Bytes usable for it after evicting every unpinned object.
        available: u64,
        /// The configured limit.
        max_size: u64,
    },
    /// No cache directory could be determined (no `LLAMA_CACHE`, no XDG/home directory).
    #[error("cannot determine a cache directory: LLAMA_CACHE is unset and there is no home directory")]
    NoCacheDir,
    /// The filesystem watcher failed.
    #[error("watch {path}: {source}")]
    Watch {
        /// The watched path.
        path: PathBuf,
        /// The underlying notify error.
        #[source]
        source: notify::Error,
    },
}

impl Error {
    /// Wraps an I/O error with the operation and path.
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io { op, path: path.into(), source }
    }

    /// Wraps any redb error with the index operation.
    pub(crate) fn redb(op: &'static str, source: impl Into<redb::Error>) -> Self {
        Error::Redb { op, source: Box::new(source.into()) }
    }
}
