//! [`WireCache`] over the `cachestore` crate: llama.cpp's (FNV-1a-64, length) key as the secondary key
//! of a BLAKE3 content-addressed store.
//!
//! ref: ggml-rpc-protocol.md §9, §14 item 20. The store verifies each object's BLAKE3 hash before serving
//! it (by default) and the RPC layer re-hashes the loaded bytes with FNV-1a before answering a hit, so a
//! corrupt, truncated or planted object is a miss, never served.

use std::sync::Arc;

use cachestore::{Store, WireHash as StoreWireHash};
use llamad_proto::WireHash;
use tracing::{debug, warn};

use super::cache::WireCache;

/// The daemon's tensor cache.
pub struct StoreCache {
    store: Arc<Store>,
}

impl StoreCache {
    /// Wraps an open store.
    pub fn new(store: Arc<Store>) -> StoreCache {
        StoreCache { store }
    }

    /// The store (for the admin API and the watcher).
    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }
}

/// The function the store uses to recompute wire hashes of objects it indexes on its own.
pub fn wire_hasher() -> cachestore::WireHasher {
    Arc::new(|data: &[u8]| StoreWireHash(WireHash::of(data).0))
}

impl WireCache for StoreCache {
    fn load(&self, hash: WireHash, dst: &mut [u8]) -> bool {
        match self.store.get_by_wire_hash(StoreWireHash(hash.0), dst.len() as u64) {
            Ok(Some(blob)) if blob.len() == dst.len() => {
                dst.copy_from_slice(&blob);
                true
            }
            Ok(Some(blob)) => {
                warn!(%hash, want = dst.len(), got = blob.len(), "cache object of the wrong size; miss");
                false
            }
            Ok(None) => {
                debug!(%hash, len = dst.len(), "cache miss");
                false
            }
            Err(e) => {
                warn!(%hash, error = %e, "cache read failed; miss");
                false
            }
        }
    }

    fn store(&self, hash: WireHash, data: &[u8]) {
        if let Err(e) = self.store.put(data, Some(StoreWireHash(hash.0)), None) {
            warn!(%hash, len = data.len(), error = %e, "cache write failed");
        }
    }
}
