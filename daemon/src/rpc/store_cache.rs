//! [`WireCache`] over the `cachestore` crate: llama.cpp's (FNV-1a-64, length) key as the secondary key
//! of a BLAKE3 content-addressed store.
//!
//! ref: ggml-rpc-protocol.md §9, §14 item 20. A hit is read straight into the target buffer and the store
//! verifies the object's BLAKE3 hash as it reads it (by default, `verify_on_read`), so a corrupt or
//! truncated object is a miss, never served. Every wire hash llamad gives the store is computed from the
//! bytes themselves: by the RPC layer when it stores a SET_TENSOR's data (`cache::store`), by the GGUF
//! import, and by [`wire_hasher`] for objects the store indexes on its own; none comes from a peer. So an
//! object that matches its BLAKE3 digest also hashes to the FNV-1a key it is found under, and such a hit is
//! [`Loaded::Verified`]: the RPC layer skips its own FNV-1a pass (about 0.7 GB/s, byte-serial). With
//! verification off the hit is [`Loaded::Unchecked`] and the RPC layer re-hashes it. (Someone who can
//! rewrite the index file can still mislabel objects; the cache directory must be writable by llamad only.)

use std::sync::Arc;

use cachestore::{Store, WireHash as StoreWireHash};
use llamad_proto::WireHash;
use tracing::{debug, warn};

use super::cache::{Loaded, WireCache};

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
    fn load(&self, hash: WireHash, dst: &mut [u8]) -> Loaded {
        match self.store.read_by_wire_hash(StoreWireHash(hash.0), dst) {
            Ok(Some(_)) if self.store.options().verify_on_read => Loaded::Verified,
            Ok(Some(_)) => Loaded::Unchecked,
            Ok(None) => {
                debug!(%hash, len = dst.len(), "cache miss");
                Loaded::Miss
            }
            Err(e) => {
                warn!(%hash, error = %e, "cache read failed; miss");
                Loaded::Miss
            }
        }
    }

    fn store(&self, hash: WireHash, data: &[u8]) {
        if let Err(e) = self.store.put(data, Some(StoreWireHash(hash.0)), None) {
            warn!(%hash, len = data.len(), error = %e, "cache write failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cachestore::Options;

    fn cache(dir: &std::path::Path, verify_on_read: bool) -> StoreCache {
        let opts = Options { verify_on_read, wire_hasher: Some(wire_hasher()), ..Options::default() };
        StoreCache::new(Arc::new(Store::open(dir, opts).unwrap()))
    }

    fn data(n: usize, seed: u32) -> Vec<u8> {
        (0..n as u32).map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(seed) >> 13) as u8).collect()
    }

    fn flip_first_byte(c: &StoreCache, bytes: &[u8]) {
        use std::os::unix::fs::PermissionsExt;
        let path = c.store().layout().object_path(&cachestore::Digest::of(bytes));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let mut b = std::fs::read(&path).unwrap();
        b[0] ^= 0x01;
        std::fs::write(&path, b).unwrap();
    }

    #[test]
    fn a_verifying_store_vouches_for_its_hits_and_drops_corrupt_objects() {
        let dir = tempfile::tempdir().unwrap();
        let c = cache(dir.path(), true);
        let a = data(3 << 20, 1);
        let h = WireHash::of(&a);
        WireCache::store(&c, h, &a);
        let mut dst = vec![0u8; a.len()];
        assert_eq!(c.load(h, &mut dst), Loaded::Verified);
        assert!(dst == a, "a hit gives the stored bytes");
        assert_eq!(c.load(WireHash(h.0 ^ 1), &mut dst), Loaded::Miss);
        assert_eq!(c.load(h, &mut dst[1..]), Loaded::Miss, "the length is part of the key");
        flip_first_byte(&c, &a);
        assert_eq!(c.load(h, &mut dst), Loaded::Miss, "a corrupt object is never served");
        assert_eq!(c.store().totals().count, 0, "and it is dropped");
    }

    #[test]
    fn without_verification_a_hit_is_unchecked() {
        let dir = tempfile::tempdir().unwrap();
        let c = cache(dir.path(), false);
        let a = data(4096, 2);
        let h = WireHash::of(&a);
        WireCache::store(&c, h, &a);
        let mut dst = vec![0u8; a.len()];
        assert_eq!(c.load(h, &mut dst), Loaded::Unchecked);
        assert!(dst == a);
        // The store only checks the size now: the flipped object comes back, and only the caller's
        // FNV-1a re-hash (`cache::load`) tells it from the original.
        flip_first_byte(&c, &a);
        assert_eq!(c.load(h, &mut dst), Loaded::Unchecked);
        assert_ne!(WireHash::of(&dst), h);
    }
}
