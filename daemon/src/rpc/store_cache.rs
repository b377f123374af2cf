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
//!
//! A hit of at least [`MAP_MIN`] bytes whose target starts on a page boundary of a mapped buffer (llamactl
//! lays its cached writes out so) is not copied: the object file's whole pages are mapped over the target
//! privately ([`Buffer::map_file`]) and only the tail under a page is read. The buffer then reads the page
//! cache's pages, and the store verifies them there. This spares the warm load its largest cost after the
//! hashing, the first touch of fresh anonymous memory (on this project's VM 40% of a lookup, and several
//! times that now and then). It relies on objects never changing once stored (mode 0444, replaced only by
//! rename, removed only by unlink, which leaves a mapped inode alive). A write into such a page copies
//! it, so the object is never changed through the buffer. A mapping the system refuses falls back to the read.

use std::sync::Arc;

use cachestore::{Store, WireHash as StoreWireHash};
use llamad_proto::WireHash;
use tracing::{debug, warn};

use super::buffer::{Buffer, Region};
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

/// A cache hit's target: a region of a mapped buffer, on a page boundary ([`Buffer::can_map`]).
struct MapInto<'a> {
    buf: &'a Buffer,
    region: Region,
}

impl cachestore::Place for MapInto<'_> {
    fn place(&mut self, file: &std::fs::File) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        // SAFETY: `load_into`'s contract makes `region` a region of `buf` that the caller holds
        // exclusively; the store hands over an object file of exactly `region.len()` bytes, and object
        // files are immutable (module documentation). A mapping the system refuses (say, at its limit of
        // mappings) is no fault of the object: the bytes are read instead.
        let mapped = unsafe { self.buf.map_file(self.region, file) }.unwrap_or_else(|e| {
            debug!(error = %e, "cannot map a cache object; reading it");
            0
        });
        // SAFETY: as above; the mapping call holds no reference into the region.
        let dst = unsafe { self.region.as_mut_slice() };
        file.read_exact_at(&mut dst[mapped..], mapped as u64)
    }

    fn placed(&self) -> &[u8] {
        // SAFETY: as in `place`; nothing writes the region while the store reads it.
        unsafe { self.region.as_slice() }
    }
}

impl StoreCache {
    /// What a lookup of `len` bytes under `hash` that found something (`Ok(true)`) or not amounts to.
    fn answer(&self, hash: WireHash, len: usize, found: cachestore::Result<bool>) -> Loaded {
        match found {
            Ok(true) if self.store.options().verify_on_read => Loaded::Verified,
            Ok(true) => Loaded::Unchecked,
            Ok(false) => {
                debug!(%hash, len, "cache miss");
                Loaded::Miss
            }
            Err(e) => {
                warn!(%hash, error = %e, "cache read failed; miss");
                Loaded::Miss
            }
        }
    }
}

/// Hits of at least this many bytes are mapped into the buffer when they can be: below it, the mapping
/// calls cost more than the copy they save.
pub const MAP_MIN: usize = 256 << 10;

/// The function the store uses to recompute wire hashes of objects it indexes on its own.
pub fn wire_hasher() -> cachestore::WireHasher {
    Arc::new(|data: &[u8]| StoreWireHash(WireHash::of(data).0))
}

impl WireCache for StoreCache {
    fn load(&self, hash: WireHash, dst: &mut [u8]) -> Loaded {
        let r = self.store.read_by_wire_hash(StoreWireHash(hash.0), dst);
        self.answer(hash, dst.len(), r.map(|d| d.is_some()))
    }

    /// Entries of at least [`MAP_MIN`] bytes whose target starts on a page boundary are mapped into the
    /// buffer rather than copied (see the module documentation); the rest are read.
    unsafe fn load_into(&self, hash: WireHash, buf: &Buffer, region: Region) -> Loaded {
        if region.len() < MAP_MIN || !buf.can_map(&region) {
            region.prefault_for_write();
            // SAFETY: forwarded contract.
            return self.load(hash, unsafe { region.as_mut_slice() });
        }
        let mut dst = MapInto { buf, region };
        let r = self.store.place_by_wire_hash(StoreWireHash(hash.0), region.len() as u64, &mut dst);
        self.answer(hash, region.len(), r.map(|d| d.is_some()))
    }

    fn store(&self, hash: WireHash, data: &[u8]) {
        if let Err(e) = self.store.put(data, Some(StoreWireHash(hash.0)), None) {
            warn!(%hash, len = data.len(), error = %e, "cache write failed");
        }
    }
}

#[cfg(test)]
mod tests_support {
    use super::*;
    use cachestore::Options;

    pub fn cache(dir: &std::path::Path, verify_on_read: bool) -> StoreCache {
        let opts = Options { verify_on_read, wire_hasher: Some(wire_hasher()), ..Options::default() };
        StoreCache::new(Arc::new(Store::open(dir, opts).unwrap()))
    }

    pub fn data(n: usize, seed: u32) -> Vec<u8> {
        (0..n as u32).map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(seed) >> 13) as u8).collect()
    }

    /// Rewrites the object of `bytes` with its first byte changed (in place: only for objects no
    /// buffer maps).
    pub fn flip_first_byte(c: &StoreCache, bytes: &[u8]) {
        use std::os::unix::fs::PermissionsExt;
        let path = c.store().layout().object_path(&cachestore::Digest::of(bytes));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let mut b = std::fs::read(&path).unwrap();
        b[0] ^= 0x01;
        std::fs::write(&path, b).unwrap();
    }
}

#[cfg(test)]
mod tests {
    use super::tests_support::*;
    use super::*;

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
        // FNV-1a re-hash (`cache::start_load`) tells it from the original.
        flip_first_byte(&c, &a);
        assert_eq!(c.load(h, &mut dst), Loaded::Unchecked);
        assert_ne!(WireHash::of(&dst), h);
    }
}

#[cfg(all(test, target_os = "linux"))]
mod map_tests {
    use super::tests_support::*;
    use super::*;
    use crate::rpc::buffer::MemoryAccount;

    /// Whether this process maps `path` (a hit was mapped, not copied).
    fn mapped(path: &std::path::Path) -> bool {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        maps.lines().any(|l| l.ends_with(path.to_str().unwrap()))
    }

    fn bytes_of(r: Region) -> Vec<u8> {
        // SAFETY: test regions lie in live buffers that nothing else touches.
        unsafe { r.as_slice() }.to_vec()
    }

    #[test]
    fn page_aligned_hits_are_mapped_copy_on_write_and_verified() {
        let dir = tempfile::tempdir().unwrap();
        let c = cache(dir.path(), true);
        let page = crate::rpc::buffer::page_size().unwrap();
        // Not a whole number of pages: the tail is read, and the bytes after it stay.
        let a = data(MAP_MIN.max(page) + 3000, 5);
        let h = WireHash::of(&a);
        WireCache::store(&c, h, &a);
        let path = c.store().layout().object_path(&cachestore::Digest::of(&a));
        let acc = Arc::new(MemoryAccount::new(Some(64 << 20)));
        let buf = Buffer::alloc(&acc, 4 << 20).unwrap();
        let r = buf.region(page as u64, a.len() as u64).unwrap();
        let after = buf.region((page + a.len()) as u64, 64).unwrap();
        // SAFETY: as in `bytes_of`.
        unsafe { after.as_mut_slice() }.fill(0xab);
        assert!(buf.can_map(&r));
        // SAFETY: `r` lies in `buf`, which nothing else touches.
        assert_eq!(unsafe { c.load_into(h, &buf, r) }, Loaded::Verified);
        assert!(bytes_of(r) == a, "a hit gives the object's bytes");
        assert!(bytes_of(after).iter().all(|&b| b == 0xab), "the tail read stops at the region's end");
        assert!(mapped(&path), "the hit is mapped");

        // A write lands in the buffer only; the object is unchanged and still serves.
        // SAFETY: as in `bytes_of`.
        let w = unsafe { r.as_mut_slice() };
        w[10] ^= 0xff;
        assert_ne!(bytes_of(r)[10], a[10]);
        assert!(std::fs::read(&path).unwrap() == a);
        let buf2 = Buffer::alloc(&acc, 4 << 20).unwrap();
        let r2 = buf2.region(0, a.len() as u64).unwrap();
        // SAFETY: as above.
        assert_eq!(unsafe { c.load_into(h, &buf2, r2) }, Loaded::Verified);
        assert!(bytes_of(r2) == a);

        // Clearing a buffer with mapped pages gives zeros (not the file again) and ends the mapping.
        assert!(buf.zero_whole(buf.region(0, buf.size()).unwrap()));
        assert!(bytes_of(buf.region(0, buf.size()).unwrap()).iter().all(|&b| b == 0));
        drop(buf2);
        assert!(!mapped(&path), "freed and cleared buffers leave no mapping");

        // Off a page boundary the hit is copied.
        let buf3 = Buffer::alloc(&acc, 4 << 20).unwrap();
        let r3 = buf3.region(64, a.len() as u64).unwrap();
        assert!(!buf3.can_map(&r3));
        // SAFETY: as above.
        assert_eq!(unsafe { c.load_into(h, &buf3, r3) }, Loaded::Verified);
        assert!(bytes_of(r3) == a);
        assert!(!mapped(&path));

        // A corrupt object is verified where it is mapped: a miss, and it is dropped.
        flip_first_byte(&c, &a);
        let buf4 = Buffer::alloc(&acc, 4 << 20).unwrap();
        let r4 = buf4.region(0, a.len() as u64).unwrap();
        // SAFETY: as above.
        assert_eq!(unsafe { c.load_into(h, &buf4, r4) }, Loaded::Miss);
        assert_eq!(c.store().totals().count, 0);
    }
}
