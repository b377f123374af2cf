//! Built graphs kept per connection: a GRAPH_COMPUTE whose blob equals one built before on this
//! connection (every tensor field, address and node the same) reuses that graph instead of
//! rebuilding and revalidating it. A master that alternates between several graphs — the row-split
//! master sends one per layer phase, 61 per token for SmolLM2 — then pays the build once per graph
//! shape, as GRAPH_RECOMPUTE gives a master that repeats one graph. Transparent to the protocol.
//!
//! Soundness: a built graph depends only on its blob and on the bounds of the buffers it points
//! into, and it holds those buffers alive. The session clears the cache whenever a buffer is freed
//! (as it drops its stored graphs, ref: ggml-rpc-protocol.md §14 item 5), so a cached graph never
//! outlives a handle it was validated against. Lookups compare the whole blob, never a hash alone.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use llamad_proto::GraphBlob;

use crate::error::Result;
use crate::rpc::exec::StoredGraph;

/// Graphs kept per connection; past this the cache starts over (a master that never repeats a
/// graph gains nothing from it).
const MAX_GRAPHS: usize = 512;

/// Blobs larger than this (tensors) are not kept: whole-model graphs are repeated with
/// GRAPH_RECOMPUTE, and comparing them costs more than it saves.
const MAX_TENSORS: usize = 4096;

/// The per-connection cache.
#[derive(Default)]
pub struct GraphCache {
    entries: HashMap<u64, Vec<(GraphBlob, Arc<StoredGraph>)>>,
    len: usize,
    /// Lookups answered from the cache.
    pub hits: u64,
}

/// A cheap key over the fields that tell graphs apart; equality is checked on the whole blob.
fn key(blob: &GraphBlob) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    blob.device.hash(&mut h);
    blob.nodes.hash(&mut h);
    for t in &blob.tensors {
        (t.id, t.data, t.op, t.ne).hash(&mut h);
    }
    h.finish()
}

impl GraphCache {
    /// The graph of `blob`: the cached one when an equal blob was built before, else `build`'s
    /// result (kept for next time).
    pub fn get_or_build(
        &mut self,
        blob: &GraphBlob,
        build: impl FnOnce(&GraphBlob) -> Result<StoredGraph>,
    ) -> Result<Arc<StoredGraph>> {
        if blob.tensors.len() > MAX_TENSORS {
            return Ok(Arc::new(build(blob)?));
        }
        let k = key(blob);
        if let Some(g) = self.entries.get(&k).and_then(|v| v.iter().find(|(b, _)| b == blob)) {
            self.hits += 1;
            return Ok(g.1.clone());
        }
        let g = Arc::new(build(blob)?);
        if self.len >= MAX_GRAPHS {
            self.clear();
        }
        self.entries.entry(k).or_default().push((blob.clone(), g.clone()));
        self.len += 1;
        Ok(g)
    }

    /// Forgets every graph (a buffer was freed).
    pub fn clear(&mut self) {
        self.entries.clear();
        self.len = 0;
    }
}
