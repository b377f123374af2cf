//! `cachestore`: a content-addressed object store (BLAKE3) with a redb index.
//!
//! It knows nothing of tensors or ggml: bytes go in, a [`Digest`] comes out. It is a blocking library
//! that owns its directory, `<root>/llamad-v1` (see [`layout`]); llamad uses `$LLAMA_CACHE/rpc`
//! ([`default_root`]) so that it shares the place, but not the files, of llama.cpp's RPC cache.
//!
//! - Writes are atomic (temp file, fsync, rename, fsync of the directory, then the index).
//! - Reads return a [`Blob`] (a read-only map) whose BLAKE3 is verified first; a corrupt object is dropped
//!   and reported as a miss.
//! - An optional size limit evicts least recently used, unpinned objects.
//! - The files are the truth: [`Store::gc`] (run at open) and [`Store::rebuild_index`] repair the index.
//! - [`watch::Watcher`] picks up objects added or removed by hand while the store runs.
//!
//! ```
//! use cachestore::{Options, Store, WireHash};
//!
//! let dir = tempfile::tempdir().unwrap();
//! let store = Store::open(dir.path(), Options::default()).unwrap();
//! let digest = store.put(b"tensor bytes", Some(WireHash(42)), Some("blk.0.ffn_up.weight")).unwrap();
//! assert_eq!(&store.get(&digest).unwrap().unwrap()[..], b"tensor bytes");
//! assert_eq!(store.find_by_wire_hash(WireHash(42), Some(12)).unwrap()[0].digest, digest);
//! assert_eq!(digest.to_string().parse::<cachestore::Digest>().unwrap(), digest);
//! ```
#![warn(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

pub mod blob;
mod crashpoint;
pub mod digest;
pub mod error;
pub mod evict;
pub mod gc;
pub mod index;
pub mod layout;
pub mod query;
pub mod store;
pub mod watch;
mod write;

pub use blob::{Blob, Place};
#[doc(hidden)]
pub use crashpoint::install_crash_hook;
pub use digest::{Digest, WireHash};
pub use error::{Error, Result};
pub use gc::{GcReport, RebuildReport, VerifyReport};
pub use index::ObjectMeta;
pub use layout::{default_root, try_default_root, Layout, LAYOUT_DIR};
pub use query::{ListPage, ListQuery, SortKey};
pub use store::{Options, Stats, Store, Totals, WireHasher, MAX_LABEL_LEN};
