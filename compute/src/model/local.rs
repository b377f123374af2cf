//! The local backend: gives every tensor of an abstract graph real memory and runs it on the
//! in-process executor.
//!
//! Memory by storage class:
//! * weights are zero-copy: the address of the weight's bytes inside the [`WeightSource`] (for a
//!   GGUF file, its read-only mmap; weights are only ever read);
//! * KV-cache buffers are allocated once per (layer, K|V) and live as long as the backend;
//! * graph inputs and intermediates share one arena. A liveness pass gives each intermediate an
//!   offset (first-fit over a free list, a buffer is released after its last reader), inputs and
//!   the graph output stay pinned. The arena only grows, so once the largest graph has been seen no
//!   step allocates.
//!
//! * interleaved copies (`quant::interleave`) of the Q4_0, Q4_1, Q5_0 and Q8_0 matrices that MUL_MAT
//!   reads, made once on the first graph that uses them where the kernel set has the interleaved
//!   product (AVX-512 VNNI): generation steps read them instead of the rows, with the same results
//!   and a third of the instructions. They cost as much memory again as those matrices;
//!   `LLAMAD_INTERLEAVE=0` turns them off.
//!
//! The converted [`Graph`] is cached with the [`BuildParams`] it came from: decode steps with the
//! same shapes (same `T`, `O` and `Nkv`) reuse it and only rewrite the inputs (graph reuse).

use std::collections::HashMap;
use std::sync::Arc;

use crate::dtype::GgmlType;
use crate::error::{Error, Result};
use crate::graph::{Executor, Graph, Interleaved, Node, Tensor, WeightHint, MAX_SRC};
use crate::model::arch::{self, BuildParams, Built, InputSink};
use crate::model::graph_def::{GraphDef, KvKind, Storage, TensorId};
use crate::model::hparams::HParams;
use crate::model::weights::WeightSource;
use crate::op::GgmlOp;
use crate::quant::interleave;

/// Alignment of every arena and cache allocation.
pub const ALIGN: u64 = 64;

#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Block([u8; ALIGN as usize]);

/// A zero-initialised, 64-byte aligned heap buffer.
struct AlignedBuf {
    blocks: Vec<Block>,
}

impl AlignedBuf {
    fn new(bytes: u64) -> Result<AlignedBuf> {
        let n = usize::try_from(bytes.div_ceil(ALIGN))
            .map_err(|_| Error::Model(format!("buffer of {bytes} bytes")))?;
        let mut blocks = Vec::new();
        blocks
            .try_reserve_exact(n)
            .map_err(|_| Error::Model(format!("cannot allocate a buffer of {bytes} bytes")))?;
        blocks.resize(n, Block([0; ALIGN as usize]));
        Ok(AlignedBuf { blocks })
    }

    fn len(&self) -> u64 {
        self.blocks.len() as u64 * ALIGN
    }

    fn ptr(&mut self) -> *mut u8 {
        self.blocks.as_mut_ptr().cast()
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        let len = self.blocks.len() * ALIGN as usize;
        // SAFETY: `Block` is `repr(C)` over `[u8; 64]` with no padding, so the vector's storage is
        // `len` initialised bytes, exclusively borrowed through `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr(), len) }
    }
}

/// Gives the `fill` callback of [`LocalBackend::run`] the bytes of the graph's inputs.
pub struct InputWriter<'a> {
    arena: &'a mut [u8],
    plan: &'a Plan,
    graph: &'a GraphDef,
}

impl InputSink for InputWriter<'_> {
    fn bytes(&mut self, id: TensorId) -> Result<&mut [u8]> {
        let range = arena_range(self.graph, self.plan, id)?;
        self.arena.get_mut(range).ok_or_else(|| Error::Model("arena too small".into()))
    }
}

fn arena_range(g: &GraphDef, plan: &Plan, id: TensorId) -> Result<std::ops::Range<usize>> {
    let off = plan
        .offsets
        .get(id.index())
        .copied()
        .flatten()
        .ok_or_else(|| Error::Model(format!("tensor {} is not in the arena", id.0)))?;
    let len = g.layout(id).nbytes().unwrap_or(0);
    let end = off.checked_add(len).ok_or_else(|| Error::Model("arena range overflows".into()))?;
    Ok(usize::try_from(off).unwrap_or(usize::MAX)..usize::try_from(end).unwrap_or(usize::MAX))
}

/// Arena offsets for the owners of an abstract graph.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Offset of each tensor that lives in the arena (inputs and intermediates), by tensor index.
    pub offsets: Vec<Option<u64>>,
    /// Arena bytes needed.
    pub size: u64,
}

/// Nodes between freeing arena memory and reusing it (see [`plan`]).
const REUSE_DELAY: usize = 4;
/// Only tensors up to this size wait [`REUSE_DELAY`] nodes: a generation step's (a few KiB each, where
/// steps are short and waits cost the most); a prompt's large ones are reused at once, so the arena
/// (and a worker's compute buffer) does not grow.
const REUSE_DELAY_MAX: u64 = 64 << 10;

/// Assigns arena offsets with buffer reuse by liveness.
pub fn plan(g: &GraphDef, pinned: &[TensorId]) -> Result<Plan> {
    let n = g.tensors().len();
    let in_arena = |t: &crate::model::graph_def::TensorDef| {
        matches!(t.storage, Storage::Intermediate | Storage::Input(_))
    };
    // Last node position (index into g.nodes()) reading each owner; usize::MAX = never freed.
    let mut last_use = vec![None::<usize>; n];
    for (pos, &id) in g.nodes().iter().enumerate() {
        let t = g.get(id);
        for s in t.src.iter().flatten() {
            last_use[g.owner(*s).index()] = Some(pos);
        }
        last_use[g.owner(id).index()] = Some(pos);
    }
    let mut offsets = vec![None; n];
    let mut alloc = FreeList::default();
    let mut keep = vec![false; n];
    for &p in pinned {
        keep[g.owner(p).index()] = true;
    }
    // Inputs first, pinned: they are written before the graph runs.
    for (id, t) in g.inputs() {
        offsets[id.index()] = Some(alloc.alloc(size_of(t.layout)?));
        keep[id.index()] = true;
    }
    // Small tensors' memory freed at node `pos` is reused from node `pos + REUSE_DELAY` on: a node that
    // reused the memory its predecessor just read would have to wait for it, where otherwise the
    // executor may run independent neighbours in one step (`graph::schedule`).
    let mut pending: std::collections::VecDeque<(usize, u64, u64)> = std::collections::VecDeque::new();
    for (pos, &id) in g.nodes().iter().enumerate() {
        while let Some(&(_, off, size)) = pending.front().filter(|p| p.0 <= pos) {
            pending.pop_front();
            alloc.free(off, size);
        }
        let t = g.get(id);
        if in_arena(t) && offsets[id.index()].is_none() {
            offsets[id.index()] = Some(alloc.alloc(size_of(t.layout)?));
        }
        // Free what this node was the last to read (never its own result before it is written).
        let mut owners: Vec<TensorId> = t.src.iter().flatten().map(|s| g.owner(*s)).collect();
        owners.push(g.owner(id));
        owners.sort();
        owners.dedup();
        for o in owners {
            let ot = g.get(o);
            if keep[o.index()] || !in_arena(ot) || last_use[o.index()] != Some(pos) {
                continue;
            }
            if let Some(off) = offsets[o.index()] {
                let size = size_of(ot.layout)?;
                if size <= REUSE_DELAY_MAX {
                    pending.push_back((pos + REUSE_DELAY, off, size));
                } else {
                    alloc.free(off, size);
                }
            }
        }
    }
    Ok(Plan { offsets, size: alloc.high_water })
}

fn size_of(l: crate::tensor::Layout) -> Result<u64> {
    let b = l.nbytes().ok_or_else(|| Error::Layout(format!("extent overflows: {:?}", l.ne)))?;
    Ok(b.div_ceil(ALIGN).max(1) * ALIGN)
}

/// First-fit allocator over `[0, high_water)` with coalescing.
#[derive(Default)]
struct FreeList {
    free: Vec<(u64, u64)>,
    high_water: u64,
}

impl FreeList {
    fn alloc(&mut self, size: u64) -> u64 {
        if let Some(i) = self.free.iter().position(|&(_, s)| s >= size) {
            let (off, s) = self.free[i];
            if s == size {
                self.free.remove(i);
            } else {
                self.free[i] = (off + size, s - size);
            }
            return off;
        }
        // Grow, extending a free block that touches the end.
        if let Some(&(off, s)) = self.free.last() {
            if off + s == self.high_water {
                self.free.pop();
                self.high_water = off + size;
                return off;
            }
        }
        let off = self.high_water;
        self.high_water += size;
        off
    }

    fn free(&mut self, off: u64, size: u64) {
        let i = self.free.partition_point(|&(o, _)| o < off);
        self.free.insert(i, (off, size));
        if i + 1 < self.free.len() && self.free[i].0 + self.free[i].1 == self.free[i + 1].0 {
            self.free[i].1 += self.free[i + 1].1;
            self.free.remove(i + 1);
        }
        if i > 0 && self.free[i - 1].0 + self.free[i - 1].1 == self.free[i].0 {
            self.free[i - 1].1 += self.free[i].1;
            self.free.remove(i);
        }
    }
}

struct Prepared {
    built: Built,
    plan: Plan,
    graph: Graph,
}

/// Graphs a [`LocalBackend`] keeps built: the shapes a server's batches alternate between (a
/// generation step of n sequences, the same with a prompt chunk beside it, n ± 1 as requests come
/// and go) run without a rebuild.
pub const GRAPH_CACHE: usize = 8;

/// Runs model graphs in-process.
pub struct LocalBackend {
    src: Arc<dyn WeightSource>,
    hp: HParams,
    kv: HashMap<(u32, KvKind), AlignedBuf>,
    arena: AlignedBuf,
    exec: Executor,
    /// Graphs built, most recently used last (at most [`GRAPH_CACHE`]); their addresses point into
    /// `arena`, so all are dropped when it grows.
    prepared: Vec<Prepared>,
    /// Interleaved copies of weight matrices, by weight name (see the module docs): anonymous
    /// mappings on transparent huge pages where the system grants them (generation streams every
    /// copy once per token).
    interleaved: HashMap<String, memmap2::MmapMut>,
    /// Whether weights are interleaved at all (`LLAMAD_INTERLEAVE` is not `0`).
    interleave: bool,
    /// Number of graphs built (for tests of graph reuse and for logs).
    builds: u64,
}

impl LocalBackend {
    /// A backend over `src` running on `n_threads` threads.
    pub fn new(src: Arc<dyn WeightSource>, hp: HParams, n_threads: usize) -> Result<LocalBackend> {
        Ok(LocalBackend {
            src,
            hp,
            kv: HashMap::new(),
            arena: AlignedBuf::new(0)?,
            exec: Executor::new(n_threads),
            prepared: Vec::new(),
            interleaved: HashMap::new(),
            interleave: std::env::var("LLAMAD_INTERLEAVE").as_deref() != Ok("0"),
            builds: 0,
        })
    }

    /// How many graphs have been built so far (a reused graph does not count).
    pub fn graphs_built(&self) -> u64 {
        self.builds
    }

    /// Bytes held by the intermediate arena.
    pub fn arena_bytes(&self) -> u64 {
        self.arena.len()
    }

    /// Zeroes every KV-cache buffer (a new conversation).
    pub fn clear_kv(&mut self) {
        for b in self.kv.values_mut() {
            b.blocks.fill(Block([0; ALIGN as usize]));
        }
    }

    /// Builds (or reuses) the graph for `p`, lets `fill` write its inputs, runs it and returns the
    /// built description; read results with [`LocalBackend::tensor_bytes`].
    pub fn run(
        &mut self,
        p: &BuildParams,
        fill: impl FnOnce(&Built, &mut InputWriter<'_>) -> Result<()>,
    ) -> Result<&Built> {
        match self.prepared.iter().position(|pr| pr.built.params == *p) {
            Some(i) => {
                let pr = self.prepared.remove(i);
                self.prepared.push(pr);
            }
            None => {
                let built = arch::build(&self.hp, self.src.as_ref(), p)?;
                let plan = plan(&built.graph, &[built.output])?;
                if plan.size > self.arena.len() {
                    // The kept graphs point into the old arena.
                    self.prepared.clear();
                    self.arena = AlignedBuf::new(plan.size)?;
                }
                let graph = self.convert(&built.graph, &plan)?;
                self.builds += 1;
                tracing::debug!(nodes = built.graph.nodes().len(), arena = plan.size, "built ubatch graph");
                if self.prepared.len() >= GRAPH_CACHE {
                    self.prepared.remove(0);
                }
                self.prepared.push(Prepared { built, plan, graph });
            }
        }
        let Some(pr) = self.prepared.last() else {
            return Err(Error::Model("no prepared graph".into()));
        };
        let mut w = InputWriter { arena: self.arena.bytes_mut(), plan: &pr.plan, graph: &pr.built.graph };
        fill(&pr.built, &mut w)?;
        self.exec.compute(&pr.graph)?;
        Ok(&pr.built)
    }

    /// The bytes of an arena tensor of the current graph (inputs, the output).
    pub fn tensor_bytes(&mut self, id: TensorId) -> Result<&[u8]> {
        let pr = self.prepared.last().ok_or_else(|| Error::Model("no graph has run".into()))?;
        let range = arena_range(&pr.built.graph, &pr.plan, id)?;
        self.arena
            .bytes_mut()
            .get(range)
            .map(|b| b as &[u8])
            .ok_or_else(|| Error::Model("arena too small".into()))
    }

    /// Address of the memory owned by `id` (not a view).
    fn owner_addr(&mut self, g: &GraphDef, plan: &Plan, id: TensorId) -> Result<*mut u8> {
        let t = g.get(id);
        match &t.storage {
            Storage::Weight(name) => {
                let w =
                    self.src.tensor(name).ok_or_else(|| Error::Model(format!("missing tensor {name}")))?;
                let need = t.layout.nbytes().unwrap_or(u64::MAX);
                if (w.data.len() as u64) < need {
                    return Err(Error::Model(format!("tensor {name}: {} bytes, need {need}", w.data.len())));
                }
                // Weights are only ever read by the executor (they are never a node's destination).
                Ok(w.data.as_ptr().cast_mut())
            }
            Storage::KvCache { layer, kind } => {
                let need = t.layout.nbytes().unwrap_or(u64::MAX);
                let buf = match self.kv.entry((*layer, *kind)) {
                    std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
                    std::collections::hash_map::Entry::Vacant(v) => v.insert(AlignedBuf::new(need)?),
                };
                if buf.len() < need {
                    return Err(Error::Model(format!("kv cache of layer {layer} changed size")));
                }
                Ok(buf.ptr())
            }
            Storage::Input(_) | Storage::Intermediate => {
                let off = plan.offsets[id.index()]
                    .ok_or_else(|| Error::Model(format!("tensor {} not planned", t.name)))?;
                if off + t.layout.nbytes().unwrap_or(u64::MAX) > self.arena.len() {
                    return Err(Error::Model("arena too small".into()));
                }
                // SAFETY: in bounds of the arena (checked above).
                Ok(unsafe { self.arena.ptr().add(off as usize) })
            }
            Storage::View => Err(Error::Model(format!("view {} has no owner", t.name))),
        }
    }

    fn addr(&mut self, g: &GraphDef, plan: &Plan, id: TensorId) -> Result<*mut u8> {
        let t = g.get(id);
        let owner = g.owner(id);
        let base = self.owner_addr(g, plan, owner)?;
        let owner_bytes = g.get(owner).layout.nbytes().unwrap_or(0);
        let end = t.view_offs.checked_add(t.layout.nbytes().unwrap_or(u64::MAX));
        if end.is_none_or(|e| e > owner_bytes) {
            return Err(Error::Model(format!("view {} exceeds its source", t.name)));
        }
        // SAFETY: `view_offs + nbytes <= owner nbytes` (checked above), so the address stays in
        // the owner's allocation.
        Ok(unsafe { base.add(t.view_offs as usize) })
    }

    /// The interleaved copy of MUL_MAT source `id`, made on first use, when it is a whole weight
    /// matrix that the kernel set can read interleaved.
    fn interleaved_copy(&mut self, g: &GraphDef, id: TensorId) -> Result<Option<Interleaved>> {
        let t = g.get(id);
        let Storage::Weight(name) = &t.storage else { return Ok(None) };
        let l = t.layout;
        let (k, m) = (l.ne[0] as usize, l.ne[1] as usize);
        if !self.interleave || g.owner(id) != id || !interleave::eligible(&l) {
            return Ok(None);
        }
        if !self.interleaved.contains_key(name) {
            let w = self.src.tensor(name).ok_or_else(|| Error::Model(format!("missing tensor {name}")))?;
            let bytes = l.nbytes().unwrap_or(u64::MAX);
            if (w.data.len() as u64) < bytes {
                return Err(Error::Model(format!("tensor {name}: {} bytes, need {bytes}", w.data.len())));
            }
            let len =
                usize::try_from(bytes).map_err(|_| Error::Model(format!("tensor {name}: {bytes} bytes")))?;
            let mut buf = memmap2::MmapMut::map_anon(len.max(1))
                .map_err(|e| Error::Model(format!("cannot map {bytes} bytes for {name}: {e}")))?;
            #[cfg(target_os = "linux")]
            let _ = buf.advise(memmap2::Advice::HugePage);
            interleave::interleave_parallel(l.dtype, k, m, w.data, &mut buf[..], self.exec.n_threads());
            tracing::debug!(tensor = %name, bytes, "interleaved weight matrix");
            self.interleaved.insert(name.clone(), buf);
        }
        let buf = &self.interleaved[name];
        Ok(Some(Interleaved { data: buf.as_ptr(), len: buf.len() }))
    }

    fn convert(&mut self, g: &GraphDef, plan: &Plan) -> Result<Graph> {
        let mut nodes = Vec::with_capacity(g.nodes().len());
        let mut hints = Vec::with_capacity(g.nodes().len());
        for &id in g.nodes() {
            let t = g.get(id);
            let dst = Tensor { layout: t.layout, data: self.addr(g, plan, id)? };
            let mut src = [None; MAX_SRC];
            for (d, s) in src.iter_mut().zip(t.src.iter()) {
                if let Some(s) = s {
                    *d = Some(Tensor { layout: g.layout(*s), data: self.addr(g, plan, *s)? });
                }
            }
            // A whole weight matrix of the model: where llama.cpp's own CPU would repack it, the
            // product follows that order (`quant::local`); an RPC server's never does.
            hints.push(match (t.op, t.src[0]) {
                (GgmlOp::MulMat, Some(s0)) => WeightHint {
                    interleaved: self.interleaved_copy(g, s0)?,
                    local: matches!(g.get(s0).storage, Storage::Weight(_)) && g.owner(s0) == s0,
                },
                _ => WeightHint::default(),
            });
            nodes.push(Node { op: t.op, op_params: t.op_params, flags: t.flags, dst, src });
        }
        // SAFETY: every address points into memory this backend keeps alive (the weight source it
        // holds an `Arc` of, its KV buffers, its arena, which is not reallocated while this graph is
        // cached, and its interleaved copies, which live as long as the backend and are never
        // written after they were made from the very weight bytes each node reads) and was checked
        // to hold the tensor's full extent; the executor runs the graph only through `run`, which
        // holds `&mut self`, so nothing else touches that memory meanwhile. Weight memory is never
        // a destination.
        let g = unsafe { Graph::with_weight_hints(nodes, &hints) }?;
        tracing::debug!(nodes = g.nodes().len(), phases = g.phases(), steps = g.steps(), "graph planned");
        Ok(g)
    }
}

/// Fills an I32 tensor.
pub fn write_i32(dst: &mut [u8], v: impl IntoIterator<Item = i32>) {
    for (d, x) in dst.chunks_exact_mut(4).zip(v) {
        d.copy_from_slice(&x.to_le_bytes());
    }
}

/// Fills an I64 tensor.
pub fn write_i64(dst: &mut [u8], v: impl IntoIterator<Item = i64>) {
    for (d, x) in dst.chunks_exact_mut(8).zip(v) {
        d.copy_from_slice(&x.to_le_bytes());
    }
}

/// Fills an F32 or F16 tensor from f32 values.
pub fn write_float(dst: &mut [u8], dtype: GgmlType, v: impl IntoIterator<Item = f32>) -> Result<()> {
    match dtype {
        GgmlType::F32 => {
            for (d, x) in dst.chunks_exact_mut(4).zip(v) {
                d.copy_from_slice(&x.to_le_bytes());
            }
        }
        GgmlType::F16 => {
            for (d, x) in dst.chunks_exact_mut(2).zip(v) {
                d.copy_from_slice(&half::f16::from_f32(x).to_bits().to_le_bytes());
            }
        }
        t => return Err(Error::Model(format!("cannot write floats to a {t} tensor"))),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_list_reuses_and_coalesces() {
        let mut f = FreeList::default();
        let a = f.alloc(64);
        let b = f.alloc(128);
        let c = f.alloc(64);
        assert_eq!((a, b, c), (0, 64, 192));
        f.free(b, 128);
        assert_eq!(f.alloc(64), 64);
        f.free(64, 64);
        f.free(a, 64);
        assert_eq!(f.free, vec![(0, 192)]);
        f.free(c, 64);
        assert_eq!(f.free, vec![(0, 256)]);
        assert_eq!(f.alloc(512), 0);
        assert_eq!(f.high_water, 512);
    }

    #[test]
    fn plan_reuses_dead_buffers_and_never_overlaps_live_ones() {
        let mut g = GraphDef::new();
        let x = g.input("x", GgmlType::F32, [16, 1, 1, 1]).unwrap();
        let mut cur = x;
        for _ in 0..10 {
            cur = g.add(cur, x).unwrap();
        }
        g.expand(cur);
        let p = plan(&g, &[cur]).unwrap();
        // A chain of ten results needs the input and the buffers in flight while freed memory waits
        // REUSE_DELAY nodes: 6 of the 11 it would take without reuse.
        assert_eq!(p.size, (REUSE_DELAY as u64 + 2) * ALIGN, "arena {}", p.size);
        // A node's result never shares memory with its sources.
        for &id in g.nodes() {
            let d = p.offsets[id.index()].unwrap();
            for s in g.get(id).src.iter().flatten() {
                assert_ne!(p.offsets[s.index()].unwrap(), d);
            }
        }
    }
}
