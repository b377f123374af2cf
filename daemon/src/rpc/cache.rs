//! The hook between the RPC server and a tensor cache (SET_TENSOR_HASH, `cache_flag`).
//!
//! ref: ggml-rpc-protocol.md §9, §14 item 20. Entries are keyed by (FNV-1a-64, length): the request
//! carries no size, so the length is what the target tensor has room for from `offset` on (the master
//! always uploads whole writes). A hit is answered only for bytes known to hash to the requested key:
//! either the store vouches for them ([`Loaded::Verified`]: it checked them against a strong content
//! hash, and its key was computed from that content when stored), or they are re-hashed here with
//! FNV-1a. Anything doubtful is a miss, so the master simply resends the data. The store behind the
//! trait (the `cachestore` crate) is blocking and is only called from `spawn_blocking`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use llamad_proto::WireHash;
use tracing::{debug, warn};

use crate::rpc::buffer::{Buffer, Region};

/// What [`WireCache::load`] put in the caller's buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Loaded {
    /// Nothing usable (a miss, or any doubt); the buffer may hold garbage.
    Miss,
    /// The entry's bytes, which the store itself vouches hash to the requested key: it verified them
    /// against a strong content hash, and the key was computed from that same content when it was
    /// stored (never taken from a peer). The caller need not re-hash them.
    Verified,
    /// The entry's bytes, unchecked: the caller must re-hash them before trusting them (a store that
    /// keeps whatever it was given under whatever key, such as [`MemoryCache`]).
    Unchecked,
}

/// A blocking store of tensor data keyed by llama.cpp's hash and the data's length.
pub trait WireCache: Send + Sync + 'static {
    /// Fills `dst` with the entry stored under (`hash`, `dst.len()`) and says how far it can be trusted
    /// (on [`Loaded::Miss`] `dst` may hold garbage; the caller answers "miss" and the peer rewrites it).
    fn load(&self, hash: WireHash, dst: &mut [u8]) -> Loaded;
    /// As [`WireCache::load`], into `region` of `buf`. A store of files may map an entry's pages into
    /// the buffer instead of copying them ([`Buffer::map_file`]); this one copies.
    ///
    /// # Safety
    /// `region` lies inside `buf`, and the caller holds it exclusively for the call.
    unsafe fn load_into(&self, hash: WireHash, buf: &Buffer, region: Region) -> Loaded {
        let _ = buf;
        // SAFETY: forwarded contract.
        self.load(hash, unsafe { region.as_mut_slice() })
    }
    /// Stores `data` under (`hash`, `data.len()`); failures are the store's to log.
    fn store(&self, hash: WireHash, data: &[u8]);
}

/// A lookup running on a blocking thread ([`start_load`]).
pub struct PendingLoad {
    task: tokio::task::JoinHandle<bool>,
    /// The bytes being filled.
    pub region: Region,
}

impl PendingLoad {
    /// True only if the loaded bytes hash to the requested key.
    pub async fn hit(self) -> bool {
        match self.task.await {
            Ok(hit) => hit,
            Err(e) => {
                warn!(error = %e, "cache load task failed; answering miss");
                false
            }
        }
    }
}

/// Starts loading an entry straight into `region` of `buf` on a blocking thread; [`PendingLoad::hit`]
/// is true only if the loaded bytes hash to `hash` (vouched for by the store, or re-hashed here). The
/// caller must not touch `region` (nor let another load into bytes overlapping it start) until
/// [`PendingLoad::hit`] has returned.
pub fn start_load(
    cache: Arc<dyn WireCache>,
    hash: WireHash,
    buf: Arc<Buffer>,
    region: Region,
) -> PendingLoad {
    let task = tokio::task::spawn_blocking(move || {
        // SAFETY: `region` lies inside `buf`, kept alive by this closure; the caller leaves the region
        // alone until the task is awaited (see above).
        let hit = match unsafe { cache.load_into(hash, &buf, region) } {
            Loaded::Miss => false,
            Loaded::Verified => true,
            // SAFETY: as above; the load is over, the bytes are only read.
            Loaded::Unchecked => WireHash::of(unsafe { region.as_slice() }) == hash,
        };
        drop(buf);
        hit
    });
    PendingLoad { task, region }
}

/// Hashes `region` of `buf` and stores it.
pub async fn store(cache: Arc<dyn WireCache>, buf: Arc<Buffer>, region: Region) {
    let r = tokio::task::spawn_blocking(move || {
        // SAFETY: as in `load`; the bytes are only read.
        let data = unsafe { region.as_slice() };
        let hash = WireHash::of(data);
        debug!(%hash, len = data.len(), "storing tensor data in the cache");
        cache.store(hash, data);
        drop(buf);
    })
    .await;
    if let Err(e) = r {
        warn!(error = %e, "cache store task failed");
    }
}

/// An in-memory [`WireCache`], for tests and in-process use (it keeps every entry in RAM).
#[derive(Debug, Default)]
pub struct MemoryCache {
    entries: Mutex<HashMap<(WireHash, u64), Vec<u8>>>,
}

impl MemoryCache {
    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.lock().map(|m| m.len()).unwrap_or(0)
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The keys `(hash, length)` of every entry.
    pub fn keys(&self) -> Vec<(WireHash, u64)> {
        self.entries.lock().map(|m| m.keys().copied().collect()).unwrap_or_default()
    }

    /// Removes the entry under (`hash`, `len`); false if there was none.
    pub fn remove(&self, hash: WireHash, len: u64) -> bool {
        self.entries.lock().is_ok_and(|mut m| m.remove(&(hash, len)).is_some())
    }

    /// Plants `data` under an arbitrary hash (to test poisoning).
    pub fn insert_raw(&self, hash: WireHash, data: Vec<u8>) {
        if let Ok(mut m) = self.entries.lock() {
            m.insert((hash, data.len() as u64), data);
        }
    }
}

impl WireCache for MemoryCache {
    fn load(&self, hash: WireHash, dst: &mut [u8]) -> Loaded {
        let Ok(m) = self.entries.lock() else { return Loaded::Miss };
        match m.get(&(hash, dst.len() as u64)) {
            // `insert_raw` plants anything under any key: the caller must re-hash.
            Some(v) => {
                dst.copy_from_slice(v);
                Loaded::Unchecked
            }
            None => Loaded::Miss,
        }
    }

    fn store(&self, hash: WireHash, data: &[u8]) {
        if let Ok(mut m) = self.entries.lock() {
            m.insert((hash, data.len() as u64), data.to_vec());
        }
    }
}
