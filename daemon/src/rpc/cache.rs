//! The hook between the RPC server and a tensor cache (SET_TENSOR_HASH, `cache_flag`).
//!
//! ref: ggml-rpc-protocol.md §9, §14 item 20. Entries are keyed by (FNV-1a-64, length): the request
//! carries no size, so the length is what the target tensor has room for from `offset` on (the master
//! always uploads whole tensors). Loaded bytes are re-hashed before a hit is answered; anything
//! doubtful is a miss, so the master simply resends the data. The store behind the trait (the
//! `cachestore` crate) is blocking and is only called from `spawn_blocking`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use llamad_proto::WireHash;
use tracing::{debug, warn};

use crate::rpc::buffer::{Buffer, Region};

/// A blocking store of tensor data keyed by llama.cpp's hash and the data's length.
pub trait WireCache: Send + Sync + 'static {
    /// Fills `dst` with the entry stored under (`hash`, `dst.len()`); false on a miss or any doubt
    /// (`dst` may then hold garbage; the caller answers "miss" and the peer rewrites it).
    fn load(&self, hash: WireHash, dst: &mut [u8]) -> bool;
    /// Stores `data` under (`hash`, `data.len()`); failures are the store's to log.
    fn store(&self, hash: WireHash, data: &[u8]);
}

/// Loads an entry straight into `region` of `buf`; true only if the loaded bytes hash to `hash`.
pub async fn load(cache: Arc<dyn WireCache>, hash: WireHash, buf: Arc<Buffer>, region: Region) -> bool {
    let r = tokio::task::spawn_blocking(move || {
        // SAFETY: `region` lies inside `buf`, kept alive by this closure; the session awaits this task
        // before touching any buffer again.
        let dst = unsafe { region.as_mut_slice() };
        let hit = cache.load(hash, dst) && WireHash::of(dst) == hash;
        drop(buf);
        hit
    })
    .await;
    match r {
        Ok(hit) => hit,
        Err(e) => {
            warn!(error = %e, "cache load task failed; answering miss");
            false
        }
    }
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

    /// Plants `data` under an arbitrary hash (to test poisoning).
    pub fn insert_raw(&self, hash: WireHash, data: Vec<u8>) {
        if let Ok(mut m) = self.entries.lock() {
            m.insert((hash, data.len() as u64), data);
        }
    }
}

impl WireCache for MemoryCache {
    fn load(&self, hash: WireHash, dst: &mut [u8]) -> bool {
        let Ok(m) = self.entries.lock() else { return false };
        match m.get(&(hash, dst.len() as u64)) {
            Some(v) => {
                dst.copy_from_slice(v);
                true
            }
            None => false,
        }
    }

    fn store(&self, hash: WireHash, data: &[u8]) {
        if let Ok(mut m) = self.entries.lock() {
            m.insert((hash, data.len() as u64), data.to_vec());
        }
    }
}
