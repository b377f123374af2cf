//! Abstract compute graphs: a ggml-context-like builder that records tensors and nodes without
//! touching memory.
//!
//! A [`GraphDef`] holds every tensor the forward pass mentions — weights, graph inputs, KV-cache
//! buffers, intermediates and views — with exactly the fields a ggml tensor (and therefore an RPC
//! `rpc_tensor`, ref: ggml-compute-semantics.md §1.1) carries: type/shape/strides ([`Layout`]), op,
//! `op_params`, flags, ten source ids, `view_src` / `view_offs` and a name. Only the `data` address is
//! missing: a backend assigns it from the tensor's [`Storage`] class (see `model::local`), which is what
//! lets the same definition run in-process or be serialized to a remote `llamad` / `ggml-rpc-server`.
//!
//! The constructors mirror ggml's (`ggml_mul_mat`, `ggml_view_2d`, `ggml_set_rows`, …) with ggml's
//! shape, stride and `op_params` rules and the same validity checks, returning errors instead of
//! asserting. Views are flattened as ggml flattens them: `view_src` is always the tensor that owns
//! the memory and `view_offs` the accumulated byte offset (ref: §1.4).
//!
//! Nodes enter the graph as ggml's `ggml_build_forward_expand` adds them: [`GraphDef::expand`]
//! visits a tensor's sources depth first, in source order, and appends every node not yet in the
//! graph after its sources (ref: ggml-compute-semantics.md §1.5). A builder that expands at the
//! points llama.cpp's graph code does (Q, V, K before the cache stores, each store, the attention
//! output, the result) gets llama.cpp's node order exactly; a tensor never reached by an expansion
//! is not computed, as in ggml. Every node gets the `COMPUTE` flag (ggml's expansion sets it on every
//! node it visits).

use crate::dtype::GgmlType;
use crate::error::{Error, Result};
use crate::op::{flags, GgmlOp, GluOp, UnaryOp};
use crate::tensor::{Layout, MAX_DIMS};

/// Maximum number of sources of a tensor (`GGML_MAX_SRC`).
pub const MAX_SRC: usize = 10;
/// Maximum name length without the terminating NUL (`GGML_MAX_NAME - 1`).
pub const MAX_NAME: usize = 63;
/// The precision hint llama.cpp sets on KQ matmuls and flash attention (`GGML_PREC_F32`).
pub const PREC_F32: i32 = 10;

/// Index of a tensor inside its [`GraphDef`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TensorId(pub u32);

impl TensorId {
    /// The index as `usize`.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// Which half of a layer's KV cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KvKind {
    /// Keys.
    K,
    /// Values.
    V,
}

/// Where a tensor's memory comes from.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Storage {
    /// A model weight, by its GGUF tensor name.
    Weight(String),
    /// A graph input the caller fills before each run (the string is the input's name).
    Input(String),
    /// One layer's K or V cache buffer (persistent across runs).
    KvCache {
        /// Layer index.
        layer: u32,
        /// K or V.
        kind: KvKind,
    },
    /// A node result with memory of its own (a backend may reuse it once it is dead).
    Intermediate,
    /// Aliases the memory of `view_src` at `view_offs`.
    View,
}

/// One tensor of an abstract graph: ggml's tensor fields minus the data address.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorDef {
    /// Type, shape and strides.
    pub layout: Layout,
    /// The op that produces it (`None` for leaves).
    pub op: GgmlOp,
    /// Raw op parameters (floats stored bit-wise).
    pub op_params: [i32; 16],
    /// INPUT / OUTPUT / COMPUTE bits.
    pub flags: i32,
    /// Operands.
    pub src: [Option<TensorId>; MAX_SRC],
    /// The tensor owning the memory this one aliases (always an owner, never a view).
    pub view_src: Option<TensorId>,
    /// Byte offset into `view_src`.
    pub view_offs: u64,
    /// ggml name (at most [`MAX_NAME`] bytes).
    pub name: String,
    /// Storage class.
    pub storage: Storage,
}

/// A recorded graph: all tensors plus the node order.
#[derive(Clone, Debug, Default)]
pub struct GraphDef {
    tensors: Vec<TensorDef>,
    nodes: Vec<TensorId>,
    /// Per tensor: already visited by an expansion.
    visited: Vec<bool>,
}

fn f(v: f32) -> i32 {
    v.to_bits() as i32
}

fn shape_err(op: GgmlOp, detail: impl Into<String>) -> Error {
    Error::Shape { op, detail: detail.into() }
}

impl GraphDef {
    /// An empty graph.
    pub fn new() -> GraphDef {
        GraphDef::default()
    }

    /// Every tensor, indexed by [`TensorId`].
    pub fn tensors(&self) -> &[TensorDef] {
        &self.tensors
    }

    /// The tensor `id`.
    pub fn get(&self, id: TensorId) -> &TensorDef {
        &self.tensors[id.index()]
    }

    /// Layout of `id`.
    pub fn layout(&self, id: TensorId) -> Layout {
        self.get(id).layout
    }

    /// The nodes (non-leaf tensors) expanded so far, in execution order.
    pub fn nodes(&self) -> &[TensorId] {
        &self.nodes
    }

    /// Adds `id` and every node it depends on that is not in the graph yet, sources first in source
    /// order (ggml's `ggml_build_forward_expand`). Expanding a tensor twice, or a leaf, adds nothing
    /// new.
    pub fn expand(&mut self, id: TensorId) {
        // Iterative depth-first post-order: (tensor, next source slot to look at).
        let mut stack = vec![(id, 0usize)];
        if std::mem::replace(&mut self.visited[id.index()], true) {
            return;
        }
        while let Some(&mut (t, ref mut slot)) = stack.last_mut() {
            let srcs = self.tensors[t.index()].src;
            let mut next = None;
            while *slot < MAX_SRC {
                let s = srcs[*slot];
                *slot += 1;
                if let Some(s) = s {
                    if !std::mem::replace(&mut self.visited[s.index()], true) {
                        next = Some(s);
                        break;
                    }
                }
            }
            match next {
                Some(s) => stack.push((s, 0)),
                None => {
                    stack.pop();
                    if self.tensors[t.index()].op != GgmlOp::None {
                        self.nodes.push(t);
                    }
                }
            }
        }
    }

    /// Every graph input (storage class `Input`), in creation order.
    pub fn inputs(&self) -> impl Iterator<Item = (TensorId, &TensorDef)> {
        self.tensors
            .iter()
            .enumerate()
            .filter(|(_, t)| matches!(t.storage, Storage::Input(_)))
            .map(|(i, t)| (TensorId(i as u32), t))
    }

    /// The tensor that owns the memory of `id` (itself unless it is a view).
    pub fn owner(&self, id: TensorId) -> TensorId {
        self.get(id).view_src.unwrap_or(id)
    }

    /// Renames `id` (truncated to [`MAX_NAME`] bytes at a character boundary).
    pub fn set_name(&mut self, id: TensorId, name: &str) -> TensorId {
        let mut end = name.len().min(MAX_NAME);
        while !name.is_char_boundary(end) {
            end -= 1;
        }
        self.tensors[id.index()].name = name[..end].to_string();
        id
    }

    /// Marks `id` as a graph output (OUTPUT flag).
    pub fn set_output(&mut self, id: TensorId) {
        self.tensors[id.index()].flags |= flags::OUTPUT;
    }

    fn push(&mut self, t: TensorDef) -> TensorId {
        let id = TensorId(self.tensors.len() as u32);
        self.tensors.push(t);
        self.visited.push(false);
        id
    }

    fn leaf(&mut self, layout: Layout, storage: Storage, name: &str, fl: i32) -> TensorId {
        let id = self.push(TensorDef {
            layout,
            op: GgmlOp::None,
            op_params: [0; 16],
            flags: fl,
            src: [None; MAX_SRC],
            view_src: None,
            view_offs: 0,
            name: String::new(),
            storage,
        });
        self.set_name(id, name)
    }

    /// A weight leaf with the given type and shape (contiguous, as stored in GGUF).
    pub fn weight(&mut self, name: &str, dtype: GgmlType, ne: [u64; MAX_DIMS]) -> Result<TensorId> {
        let layout = Layout::contiguous(dtype, ne)?;
        Ok(self.leaf(layout, Storage::Weight(name.to_string()), name, 0))
    }

    /// A graph input leaf (INPUT flag).
    pub fn input(&mut self, name: &str, dtype: GgmlType, ne: [u64; MAX_DIMS]) -> Result<TensorId> {
        let layout = Layout::contiguous(dtype, ne)?;
        Ok(self.leaf(layout, Storage::Input(name.to_string()), name, flags::INPUT))
    }

    /// A KV-cache leaf `cache_{k,v}_l{layer}`.
    pub fn kv_cache(
        &mut self,
        layer: u32,
        kind: KvKind,
        dtype: GgmlType,
        ne: [u64; MAX_DIMS],
    ) -> Result<TensorId> {
        let layout = Layout::contiguous(dtype, ne)?;
        let name = match kind {
            KvKind::K => format!("cache_k_l{layer}"),
            KvKind::V => format!("cache_v_l{layer}"),
        };
        Ok(self.leaf(layout, Storage::KvCache { layer, kind }, &name, 0))
    }

    /// A new node owning fresh contiguous memory.
    fn node(&mut self, op: GgmlOp, layout: Layout, src: &[TensorId], op_params: [i32; 16]) -> TensorId {
        let mut s = [None; MAX_SRC];
        for (d, &x) in s.iter_mut().zip(src) {
            *d = Some(x);
        }
        self.push(TensorDef {
            layout,
            op,
            op_params,
            flags: flags::COMPUTE,
            src: s,
            view_src: None,
            view_offs: 0,
            name: String::new(),
            storage: Storage::Intermediate,
        })
    }

    /// A new node aliasing `base` at `offs` (flattened to the owner, as ggml_new_tensor_impl does).
    fn view_node(
        &mut self,
        op: GgmlOp,
        layout: Layout,
        base: TensorId,
        offs: u64,
        src: &[TensorId],
        op_params: [i32; 16],
    ) -> Result<TensorId> {
        let b = self.get(base);
        let (owner, total) = match b.view_src {
            Some(o) => (o, b.view_offs.checked_add(offs)),
            None => (base, Some(offs)),
        };
        let total = total.ok_or_else(|| shape_err(op, "view offset overflows"))?;
        let owner_bytes = self.get(owner).layout.nbytes().unwrap_or(0);
        let need = layout.nbytes().ok_or_else(|| shape_err(op, "view extent overflows"))?;
        if need != 0 && total.checked_add(need).is_none_or(|end| end > owner_bytes) {
            return Err(shape_err(
                op,
                format!("view of {need} bytes at offset {total} exceeds its source of {owner_bytes} bytes"),
            ));
        }
        let id = self.node(op, layout, src, op_params);
        let t = &mut self.tensors[id.index()];
        t.view_src = Some(owner);
        t.view_offs = total;
        t.storage = Storage::View;
        let name = format!("{} (view)", self.get(base).name);
        Ok(self.set_name(id, &name))
    }

    fn same_as(&self, a: TensorId) -> Result<Layout> {
        Layout::contiguous(self.layout(a).dtype, self.layout(a).ne)
    }

    // ---- element-wise -------------------------------------------------------------------------

    fn binary(&mut self, op: GgmlOp, a: TensorId, b: TensorId) -> Result<TensorId> {
        let (la, lb) = (self.layout(a), self.layout(b));
        if !lb.can_repeat_to(&la) {
            return Err(shape_err(op, format!("cannot broadcast {:?} over {:?}", lb.ne, la.ne)));
        }
        let l = self.same_as(a)?;
        Ok(self.node(op, l, &[a, b], [0; 16]))
    }

    /// ggml_add: `a + b`, `b` broadcast by repetition.
    pub fn add(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        self.binary(GgmlOp::Add, a, b)
    }

    /// ggml_mul: `a * b`, `b` broadcast by repetition.
    pub fn mul(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        self.binary(GgmlOp::Mul, a, b)
    }

    /// ggml_div: `a / b`, `b` broadcast by repetition.
    pub fn div(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        self.binary(GgmlOp::Div, a, b)
    }

    /// ggml_scale: `a * s` (op_params f32 s, f32 bias 0).
    pub fn scale(&mut self, a: TensorId, s: f32) -> Result<TensorId> {
        let l = self.same_as(a)?;
        let mut p = [0; 16];
        p[0] = f(s);
        p[1] = f(0.0);
        Ok(self.node(GgmlOp::Scale, l, &[a], p))
    }

    /// ggml_rms_norm (op_params f32 eps).
    pub fn rms_norm(&mut self, a: TensorId, eps: f32) -> Result<TensorId> {
        let l = self.same_as(a)?;
        let mut p = [0; 16];
        p[0] = f(eps);
        Ok(self.node(GgmlOp::RmsNorm, l, &[a], p))
    }

    /// ggml_clamp (op_params f32 min, f32 max).
    pub fn clamp(&mut self, a: TensorId, min: f32, max: f32) -> Result<TensorId> {
        let l = self.same_as(a)?;
        let mut p = [0; 16];
        p[0] = f(min);
        p[1] = f(max);
        Ok(self.node(GgmlOp::Clamp, l, &[a], p))
    }

    /// ggml_unary (op_params i32 op).
    pub fn unary(&mut self, a: TensorId, op: UnaryOp) -> Result<TensorId> {
        let l = self.same_as(a)?;
        let mut p = [0; 16];
        p[0] = op as i32;
        Ok(self.node(GgmlOp::Unary, l, &[a], p))
    }

    /// ggml_glu_split: `act(a) * b` with `a` the gate (op_params i32 op, i32 swapped = 0).
    pub fn glu_split(&mut self, a: TensorId, b: TensorId, op: GluOp) -> Result<TensorId> {
        let (la, lb) = (self.layout(a), self.layout(b));
        if la.ne != lb.ne || la.dtype != lb.dtype {
            return Err(shape_err(GgmlOp::Glu, format!("gate {:?} and up {:?} differ", la.ne, lb.ne)));
        }
        let l = self.same_as(a)?;
        let mut p = [0; 16];
        p[0] = op as i32;
        p[1] = 0;
        Ok(self.node(GgmlOp::Glu, l, &[a, b], p))
    }

    /// ggml_sum_rows: `[1, ne1, ne2, ne3]`.
    pub fn sum_rows(&mut self, a: TensorId) -> Result<TensorId> {
        let la = self.layout(a);
        let l = Layout::contiguous(la.dtype, [1, la.ne[1], la.ne[2], la.ne[3]])?;
        Ok(self.node(GgmlOp::SumRows, l, &[a], [0; 16]))
    }

    // ---- matrix products ----------------------------------------------------------------------

    /// ggml_mul_mat: `[M, N, ne12, ne13]` F32 from `a [K, M, ne02, ne03]` and `b [K, N, ne12, ne13]`.
    pub fn mul_mat(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        let (la, lb) = (self.layout(a), self.layout(b));
        if la.ne[0] != lb.ne[0] || lb.ne[2] % la.ne[2] != 0 || lb.ne[3] % la.ne[3] != 0 || la.is_transposed()
        {
            return Err(shape_err(GgmlOp::MulMat, format!("a {:?} b {:?}", la.ne, lb.ne)));
        }
        let l = Layout::contiguous(GgmlType::F32, [la.ne[1], lb.ne[1], lb.ne[2], lb.ne[3]])?;
        Ok(self.node(GgmlOp::MulMat, l, &[a, b], [0; 16]))
    }

    /// Sets `op_params[0]` of a MUL_MAT / FLASH_ATTN_EXT node to the F32 precision hint
    /// (`ggml_mul_mat_set_prec`, `ggml_flash_attn_ext_set_prec`).
    pub fn set_prec_f32(&mut self, id: TensorId) {
        let t = &mut self.tensors[id.index()];
        match t.op {
            GgmlOp::MulMat => t.op_params[0] = PREC_F32,
            GgmlOp::FlashAttnExt => t.op_params[3] = PREC_F32,
            _ => {}
        }
    }

    /// ggml_mul_mat_id: `as [K, M, n_expert]`, `b [K, n_b, T]`, `ids` I32 `[n_used, T]` →
    /// F32 `[M, n_used, T]`.
    pub fn mul_mat_id(&mut self, experts: TensorId, b: TensorId, ids: TensorId) -> Result<TensorId> {
        let (la, lb, li) = (self.layout(experts), self.layout(b), self.layout(ids));
        if li.dtype != GgmlType::I32
            || la.ne[3] != 1
            || lb.ne[3] != 1
            || li.ne[2] != 1
            || li.ne[3] != 1
            || li.ne[1] != lb.ne[2]
            || li.ne[0] % lb.ne[1] != 0
            || la.ne[0] != lb.ne[0]
            || la.is_transposed()
        {
            return Err(shape_err(GgmlOp::MulMatId, format!("as {:?} b {:?} ids {:?}", la.ne, lb.ne, li.ne)));
        }
        let l = Layout::contiguous(GgmlType::F32, [la.ne[1], li.ne[0], lb.ne[2], 1])?;
        Ok(self.node(GgmlOp::MulMatId, l, &[experts, b, ids], [0; 16]))
    }

    // ---- rows ---------------------------------------------------------------------------------

    /// ggml_get_rows: rows of `a` picked by I32 `b` → `[a.ne0, b.ne0, b.ne1, b.ne2]` F32.
    pub fn get_rows(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        let (la, lb) = (self.layout(a), self.layout(b));
        if lb.dtype != GgmlType::I32 || la.ne[2] != lb.ne[1] || lb.ne[3] != 1 {
            return Err(shape_err(GgmlOp::GetRows, format!("a {:?} b {:?} {}", la.ne, lb.ne, lb.dtype)));
        }
        let dt = if la.dtype == GgmlType::I32 { GgmlType::I32 } else { GgmlType::F32 };
        let l = Layout::contiguous(dt, [la.ne[0], lb.ne[0], lb.ne[1], lb.ne[2]])?;
        Ok(self.node(GgmlOp::GetRows, l, &[a, b], [0; 16]))
    }

    /// ggml_set_rows(a = destination, b = rows, c = I64/I32 indices): a view of `a`, stored as
    /// src0 = b, src1 = c, src2 = a (ref: ggml-compute-semantics.md §3.3 SET_ROWS).
    pub fn set_rows(&mut self, a: TensorId, b: TensorId, c: TensorId) -> Result<TensorId> {
        let (la, lb, lc) = (self.layout(a), self.layout(b), self.layout(c));
        if la.ne[0] != lb.ne[0]
            || la.ne[2] != lb.ne[2]
            || la.ne[3] != lb.ne[3]
            || lb.ne[1] != lc.ne[0]
            || lb.ne[2] % lc.ne[1] != 0
            || lb.ne[3] % lc.ne[2] != 0
            || lc.ne[3] != 1
            || !matches!(lc.dtype, GgmlType::I64 | GgmlType::I32)
            || !matches!(lb.dtype, GgmlType::F32 | GgmlType::F16)
            || !la.is_contiguous_rows()
            || !lb.is_contiguous_rows()
        {
            return Err(shape_err(GgmlOp::SetRows, format!("a {:?} b {:?} c {:?}", la.ne, lb.ne, lc.ne)));
        }
        self.view_node(GgmlOp::SetRows, la, a, 0, &[b, c, a], [0; 16])
    }

    /// ggml_cpy(a, b): writes `a` converted into `b`; the node is a view of `b`.
    pub fn cpy(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        let (la, lb) = (self.layout(a), self.layout(b));
        if la.nelements() != lb.nelements() {
            return Err(shape_err(GgmlOp::Cpy, format!("{:?} -> {:?}", la.ne, lb.ne)));
        }
        self.view_node(GgmlOp::Cpy, lb, b, 0, &[a, b], [0; 16])
    }

    /// ggml_concat(a, b, dim): `b` appended to `a` along `dim` (the other dims equal, same type).
    pub fn concat(&mut self, a: TensorId, b: TensorId, dim: usize) -> Result<TensorId> {
        let (la, lb) = (self.layout(a), self.layout(b));
        let fits =
            dim < MAX_DIMS && la.dtype == lb.dtype && (0..MAX_DIMS).all(|i| i == dim || la.ne[i] == lb.ne[i]);
        if !fits {
            return Err(shape_err(GgmlOp::Concat, format!("a {:?} b {:?} along {dim}", la.ne, lb.ne)));
        }
        let mut ne = la.ne;
        ne[dim] += lb.ne[dim];
        let l = Layout::contiguous(la.dtype, ne)?;
        let mut p = [0; 16];
        p[0] = dim as i32;
        Ok(self.node(GgmlOp::Concat, l, &[a, b], p))
    }

    /// ggml_cont: a contiguous copy with the same shape.
    pub fn cont(&mut self, a: TensorId) -> Result<TensorId> {
        let ne = self.layout(a).ne;
        self.cont_4d(a, ne)
    }

    /// ggml_cont_4d: a contiguous copy with a new shape of the same element count.
    pub fn cont_4d(&mut self, a: TensorId, ne: [u64; MAX_DIMS]) -> Result<TensorId> {
        let la = self.layout(a);
        let l = Layout::contiguous(la.dtype, ne)?;
        if l.nelements() != la.nelements() {
            return Err(shape_err(GgmlOp::Cont, format!("{:?} -> {ne:?}", la.ne)));
        }
        Ok(self.node(GgmlOp::Cont, l, &[a], [0; 16]))
    }

    // ---- views --------------------------------------------------------------------------------

    /// ggml_reshape_4d (also `_1d.._3d` with trailing 1s): requires `a` contiguous.
    pub fn reshape(&mut self, a: TensorId, ne: [u64; MAX_DIMS]) -> Result<TensorId> {
        let la = self.layout(a);
        let l = la.reshape(ne).map_err(|e| shape_err(GgmlOp::Reshape, e.to_string()))?;
        let id = self.view_node(GgmlOp::Reshape, l, a, 0, &[a], [0; 16])?;
        let name = format!("{} (reshaped)", self.get(a).name);
        Ok(self.set_name(id, &name))
    }

    /// ggml_view_4d: shape `ne`, strides `nb1..nb3`, byte `offset` (stored in op_params[0..2]).
    pub fn view(
        &mut self,
        a: TensorId,
        ne: [u64; MAX_DIMS],
        nb123: [u64; 3],
        offset: u64,
    ) -> Result<TensorId> {
        let l = self.layout(a).view(ne, nb123);
        let mut p = [0; 16];
        p[0] = offset as u32 as i32;
        p[1] = (offset >> 32) as u32 as i32;
        self.view_node(GgmlOp::View, l, a, offset, &[a], p)
    }

    /// ggml_view_1d.
    pub fn view_1d(&mut self, a: TensorId, ne0: u64, offset: u64) -> Result<TensorId> {
        let ts = self.layout(a).dtype.row_size(ne0).unwrap_or(0);
        self.view(a, [ne0, 1, 1, 1], [ts, ts, ts], offset)
    }

    /// ggml_view_2d: `nb2 = nb3 = nb1 * ne1`.
    pub fn view_2d(&mut self, a: TensorId, ne0: u64, ne1: u64, nb1: u64, offset: u64) -> Result<TensorId> {
        self.view(a, [ne0, ne1, 1, 1], [nb1, nb1 * ne1, nb1 * ne1], offset)
    }

    /// ggml_view_3d: `nb3 = nb2 * ne2`.
    pub fn view_3d(
        &mut self,
        a: TensorId,
        ne: [u64; 3],
        nb1: u64,
        nb2: u64,
        offset: u64,
    ) -> Result<TensorId> {
        self.view(a, [ne[0], ne[1], ne[2], 1], [nb1, nb2, nb2 * ne[2]], offset)
    }

    /// ggml_permute: source dim `k` moves to `axes[k]` (op_params = axes).
    pub fn permute(&mut self, a: TensorId, axes: [usize; MAX_DIMS]) -> Result<TensorId> {
        let l = self.layout(a).permute(axes).map_err(|e| shape_err(GgmlOp::Permute, e.to_string()))?;
        let mut p = [0; 16];
        for (d, &x) in p.iter_mut().zip(&axes) {
            *d = x as i32;
        }
        let id = self.view_node(GgmlOp::Permute, l, a, 0, &[a], p)?;
        let name = format!("{} (permuted)", self.get(a).name);
        Ok(self.set_name(id, &name))
    }

    /// ggml_transpose: swaps dims 0 and 1.
    pub fn transpose(&mut self, a: TensorId) -> Result<TensorId> {
        let l = self.layout(a).transpose();
        let id = self.view_node(GgmlOp::Transpose, l, a, 0, &[a], [0; 16])?;
        let name = format!("{} (transposed)", self.get(a).name);
        Ok(self.set_name(id, &name))
    }

    // ---- attention ----------------------------------------------------------------------------

    /// ggml_rope_ext (ref: ggml-compute-semantics.md §3.3 ROPE for the op_params slots).
    pub fn rope_ext(
        &mut self,
        a: TensorId,
        pos: TensorId,
        freq_factors: Option<TensorId>,
        p: &RopeParams,
    ) -> Result<TensorId> {
        let (la, lp) = (self.layout(a), self.layout(pos));
        if lp.dtype != GgmlType::I32
            || lp.ne[0] != la.ne[2]
            || p.n_dims as u64 > la.ne[0]
            || p.n_dims % 2 != 0
        {
            return Err(shape_err(
                GgmlOp::Rope,
                format!("x {:?} pos {:?} n_dims {}", la.ne, lp.ne, p.n_dims),
            ));
        }
        if let Some(ff) = freq_factors {
            let lf = self.layout(ff);
            if lf.dtype != GgmlType::F32 || lf.ne[0] < (p.n_dims / 2) as u64 {
                return Err(shape_err(GgmlOp::Rope, format!("freq factors {:?}", lf.ne)));
            }
        }
        let mut o = [0; 16];
        o[1] = p.n_dims;
        o[2] = p.mode;
        o[4] = p.n_ctx_orig;
        o[5] = f(p.freq_base);
        o[6] = f(p.freq_scale);
        o[7] = f(p.ext_factor);
        o[8] = f(p.attn_factor);
        o[9] = f(p.beta_fast);
        o[10] = f(p.beta_slow);
        let l = self.same_as(a)?;
        Ok(match freq_factors {
            Some(ff) => self.node(GgmlOp::Rope, l, &[a, pos, ff], o),
            None => self.node(GgmlOp::Rope, l, &[a, pos], o),
        })
    }

    /// ggml_soft_max_ext (op_params f32 scale, f32 max_bias).
    pub fn soft_max_ext(
        &mut self,
        a: TensorId,
        mask: Option<TensorId>,
        scale: f32,
        max_bias: f32,
    ) -> Result<TensorId> {
        let la = self.layout(a);
        if let Some(m) = mask {
            let lm = self.layout(m);
            if lm.ne[0] != la.ne[0]
                || lm.ne[1] < la.ne[1]
                || !la.ne[2].is_multiple_of(lm.ne[2])
                || !la.ne[3].is_multiple_of(lm.ne[3])
            {
                return Err(shape_err(GgmlOp::SoftMax, format!("x {:?} mask {:?}", la.ne, lm.ne)));
            }
        }
        let l = self.same_as(a)?;
        let mut p = [0; 16];
        p[0] = f(scale);
        p[1] = f(max_bias);
        Ok(match mask {
            Some(m) => self.node(GgmlOp::SoftMax, l, &[a, m], p),
            None => self.node(GgmlOp::SoftMax, l, &[a], p),
        })
    }

    /// ggml_flash_attn_ext: F32 `[D_v, n_head, n_q, ne3]` (op_params f32 scale, max_bias, softcap,
    /// i32 precision = F32).
    #[allow(clippy::too_many_arguments)] // mirrors ggml_flash_attn_ext
    pub fn flash_attn_ext(
        &mut self,
        q: TensorId,
        k: TensorId,
        v: TensorId,
        mask: Option<TensorId>,
        scale: f32,
        max_bias: f32,
        softcap: f32,
    ) -> Result<TensorId> {
        let (lq, lk, lv) = (self.layout(q), self.layout(k), self.layout(v));
        if lq.ne[0] != lk.ne[0]
            || lk.ne[1] != lv.ne[1]
            || lq.ne[2] % lk.ne[2] != 0
            || lq.ne[3] % lk.ne[3] != 0
        {
            return Err(shape_err(
                GgmlOp::FlashAttnExt,
                format!("q {:?} k {:?} v {:?}", lq.ne, lk.ne, lv.ne),
            ));
        }
        let mut srcs = vec![q, k, v];
        if let Some(m) = mask {
            let lm = self.layout(m);
            if lm.ne[0] != lk.ne[1]
                || lm.ne[1] < lq.ne[1]
                || lq.ne[2] % lm.ne[2] != 0
                || lq.ne[3] % lm.ne[3] != 0
            {
                return Err(shape_err(GgmlOp::FlashAttnExt, format!("mask {:?} for k {:?}", lm.ne, lk.ne)));
            }
            srcs.push(m);
        }
        let l = Layout::contiguous(GgmlType::F32, [lv.ne[0], lq.ne[2], lq.ne[1], lq.ne[3]])?;
        let mut p = [0; 16];
        p[0] = f(scale);
        p[1] = f(max_bias);
        p[2] = f(softcap);
        p[3] = PREC_F32;
        Ok(self.node(GgmlOp::FlashAttnExt, l, &srcs, p))
    }

    // ---- sorting ------------------------------------------------------------------------------

    /// ggml_argsort (op_params i32 order: 0 ascending, 1 descending) → I32 same shape.
    pub fn argsort(&mut self, a: TensorId, descending: bool) -> Result<TensorId> {
        let la = self.layout(a);
        let l = Layout::contiguous(GgmlType::I32, la.ne)?;
        let mut p = [0; 16];
        p[0] = i32::from(descending);
        Ok(self.node(GgmlOp::Argsort, l, &[a], p))
    }

    /// ggml_argsort_top_k: ARGSORT descending, then a view of the first `k` columns.
    pub fn argsort_top_k(&mut self, a: TensorId, k: u64) -> Result<TensorId> {
        let la = self.layout(a);
        if k == 0 || k > la.ne[0] {
            return Err(shape_err(GgmlOp::Argsort, format!("top {k} of {}", la.ne[0])));
        }
        let s = self.argsort(a, true)?;
        let ls = self.layout(s);
        self.view(s, [k, ls.ne[1], ls.ne[2], ls.ne[3]], [ls.nb[1], ls.nb[2], ls.nb[3]], 0)
    }
}

/// The ROPE parameters (ref: ggml-compute-semantics.md §3.3 ROPE).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeParams {
    /// Rotated dimensions.
    pub n_dims: i32,
    /// `rope_mode` value.
    pub mode: i32,
    /// Original training context (YaRN).
    pub n_ctx_orig: i32,
    /// Base frequency.
    pub freq_base: f32,
    /// 1 / scaling factor.
    pub freq_scale: f32,
    /// YaRN extrapolation mix (0 = off).
    pub ext_factor: f32,
    /// Magnitude scale.
    pub attn_factor: f32,
    /// YaRN beta_fast.
    pub beta_fast: f32,
    /// YaRN beta_slow.
    pub beta_slow: f32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn views_flatten_and_offsets_accumulate() {
        let mut g = GraphDef::new();
        let a = g.input("a", GgmlType::F32, [8, 4, 1, 1]).unwrap();
        let v = g.view_2d(a, 8, 2, 32, 32).unwrap();
        let r = g.reshape(v, [16, 1, 1, 1]);
        // A non-contiguous view cannot be reshaped, a contiguous one can.
        assert!(r.is_ok());
        let v2 = g.view_1d(v, 4, 16).unwrap();
        assert_eq!(g.get(v2).view_src, Some(a));
        assert_eq!(g.get(v2).view_offs, 48);
        assert_eq!(g.get(v2).op_params[0], 16);
        assert!(g.view_1d(a, 8, 100).is_err(), "view past the end must fail");
        let p = g.permute(a, [0, 2, 1, 3]).unwrap();
        assert_eq!(g.layout(p).ne, [8, 1, 4, 1]);
        assert_eq!(&g.get(p).op_params[..4], &[0, 2, 1, 3]);
    }

    #[test]
    fn mul_mat_and_flash_attn_shapes() {
        let mut g = GraphDef::new();
        let w = g.weight("w", GgmlType::Q4_0, [64, 10, 1, 1]).unwrap();
        let x = g.input("x", GgmlType::F32, [64, 3, 1, 1]).unwrap();
        let y = g.mul_mat(w, x).unwrap();
        assert_eq!(g.layout(y).ne, [10, 3, 1, 1]);
        assert_eq!(g.layout(y).dtype, GgmlType::F32);
        let bad = g.input("bad", GgmlType::F32, [32, 3, 1, 1]).unwrap();
        assert!(g.mul_mat(w, bad).is_err());
        let q = g.input("q", GgmlType::F32, [16, 5, 4, 1]).unwrap();
        let k = g.input("k", GgmlType::F16, [16, 256, 2, 1]).unwrap();
        let v = g.input("v", GgmlType::F16, [16, 256, 2, 1]).unwrap();
        let m = g.input("m", GgmlType::F16, [256, 5, 1, 1]).unwrap();
        let o = g.flash_attn_ext(q, k, v, Some(m), 0.25, 0.0, 0.0).unwrap();
        assert_eq!(g.layout(o).ne, [16, 4, 5, 1]);
        assert_eq!(g.get(o).op_params[3], PREC_F32);
        assert_eq!(f32::from_bits(g.get(o).op_params[0] as u32), 0.25);
        assert!(g.nodes().is_empty(), "nothing is in the graph before an expansion");
        g.expand(o);
        g.expand(y);
        assert_eq!(g.nodes(), &[o, y]);
    }

    #[test]
    fn expand_is_ggml_depth_first_post_order() {
        // d = add(b, c), b = mul(a, a2), c = scale(a): sources first, in source order, each once.
        let mut g = GraphDef::new();
        let a = g.input("a", GgmlType::F32, [4, 1, 1, 1]).unwrap();
        let a2 = g.input("a2", GgmlType::F32, [4, 1, 1, 1]).unwrap();
        let c = g.scale(a, 2.0).unwrap();
        let b = g.mul(a, a2).unwrap();
        let d = g.add(b, c).unwrap();
        let unused = g.scale(d, 3.0).unwrap();
        g.expand(c);
        assert_eq!(g.nodes(), &[c]);
        g.expand(d);
        assert_eq!(g.nodes(), &[c, b, d], "c was already in the graph; b comes before d");
        g.expand(d);
        g.expand(a);
        assert_eq!(g.nodes(), &[c, b, d], "expanding again or a leaf adds nothing");
        assert!(!g.nodes().contains(&unused));
        // A long chain does not overflow the stack.
        let mut g = GraphDef::new();
        let mut x = g.input("x", GgmlType::F32, [4, 1, 1, 1]).unwrap();
        for _ in 0..100_000 {
            x = g.scale(x, 1.0).unwrap();
        }
        g.expand(x);
        assert_eq!(g.nodes().len(), 100_000);
    }

    #[test]
    fn set_rows_aliases_destination() {
        let mut g = GraphDef::new();
        let cache = g.kv_cache(3, KvKind::K, GgmlType::F16, [32, 512, 1, 1]).unwrap();
        let rows = g.input("rows", GgmlType::F32, [32, 5, 1, 1]).unwrap();
        let idx = g.input("idx", GgmlType::I64, [5, 1, 1, 1]).unwrap();
        let s = g.set_rows(cache, rows, idx).unwrap();
        let t = g.get(s);
        assert_eq!(t.view_src, Some(cache));
        assert_eq!(t.src[..3], [Some(rows), Some(idx), Some(cache)]);
        assert_eq!(t.name, "cache_k_l3 (view)");
        assert_eq!(t.flags & flags::COMPUTE, flags::COMPUTE);
    }
}
