//! An in-memory [`Index`] for tests and for callers that want no index file.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, MutexGuard};

use super::{Index, IndexOp, ObjectMeta};
use crate::digest::{Digest, WireHash};
use crate::error::Result;

#[derive(Default)]
struct Tables {
    objects: BTreeMap<Digest, ObjectMeta>,
    by_wire: BTreeMap<WireHash, BTreeSet<Digest>>,
}

impl Tables {
    fn unlink_wire(&mut self, m: &ObjectMeta) {
        if let Some(w) = m.wire_hash {
            if let Some(set) = self.by_wire.get_mut(&w) {
                set.remove(&m.digest);
                if set.is_empty() {
                    self.by_wire.remove(&w);
                }
            }
        }
    }
}

/// A `BTreeMap` behind a mutex; nothing survives the process.
#[derive(Default)]
pub struct MemIndex {
    tables: Mutex<Tables>,
}

impl MemIndex {
    /// An empty index.
    pub fn new() -> MemIndex {
        MemIndex::default()
    }

    fn lock(&self) -> MutexGuard<'_, Tables> {
        // A panic while holding this lock cannot leave the maps half-updated in a way we rely on, so a
        // poisoned lock is still usable.
        self.tables.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Index for MemIndex {
    fn get(&self, digest: &Digest) -> Result<Option<ObjectMeta>> {
        Ok(self.lock().objects.get(digest).cloned())
    }

    fn by_wire_hash(&self, hash: WireHash) -> Result<Vec<Digest>> {
        Ok(self.lock().by_wire.get(&hash).map(|s| s.iter().copied().collect()).unwrap_or_default())
    }

    fn scan(&self) -> Result<Vec<ObjectMeta>> {
        Ok(self.lock().objects.values().cloned().collect())
    }

    fn apply(&self, ops: &[IndexOp], _durable: bool) -> Result<()> {
        let mut t = self.lock();
        for op in ops {
            match op {
                IndexOp::Put(m) => {
                    if let Some(old) = t.objects.remove(&m.digest) {
                        t.unlink_wire(&old);
                    }
                    if let Some(w) = m.wire_hash {
                        t.by_wire.entry(w).or_default().insert(m.digest);
                    }
                    t.objects.insert(m.digest, m.clone());
                }
                IndexOp::Remove(d) => {
                    if let Some(old) = t.objects.remove(d) {
                        t.unlink_wire(&old);
                    }
                }
                IndexOp::Touch { digest, last_used_us, hits } => {
                    if let Some(m) = t.objects.get_mut(digest) {
                        m.last_used_us = m.last_used_us.max(*last_used_us);
                        m.hits = m.hits.saturating_add(*hits);
                    }
                }
            }
        }
        Ok(())
    }

    fn clear(&self) -> Result<()> {
        *self.lock() = Tables::default();
        Ok(())
    }
}
