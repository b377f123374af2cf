//! The ops: validation and planning of one node ([`prepare`]) and its multi-threaded execution
//! ([`run`]).
//!
//! Each family lives in its own module. `prepare` checks everything a kernel relies on (types,
//! shapes, strides, op_params) so that no kernel can address memory outside a tensor, and records
//! the scratch memory the node needs and how many units of work each phase has. `run` executes one
//! unit of one phase on the calling thread; the executor starts a phase only when every unit of
//! the previous one is done, and the units of a phase write disjoint memory.

pub(crate) mod access;
mod attention;
mod backward;
mod binary;
mod copy;
mod f16acc;
mod hyper;
mod indexed;
mod layout;
mod matmul;
mod norm;
mod prefetch;
mod recurrent;
mod reduce;
mod rope;
mod rows;
mod softmax;
mod unary;
mod vexp;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use crate::error::{Error, Result};
use crate::graph::{Node, Tensor, WeightHint};
use crate::op::GgmlOp;
use access::Tv;

/// What one node needs at run time, decided by [`prepare`].
pub(crate) struct Plan {
    /// Number of phases (steps that all finish before the next begins); 0 for nothing to do.
    pub phases: u8,
    /// Units of work per phase (each unit runs on one thread); 0 = one per destination row
    /// chunk, filled in by [`prepare`].
    pub units: [usize; 2],
    /// Bytes of scratch shared by all threads (written in one phase, read in a later one).
    pub shared_bytes: usize,
    /// f32 words of scratch each thread needs for itself.
    pub local_f32: usize,
    /// The op and its parsed parameters.
    pub kind: Kind,
}

/// Parsed ops.
pub(crate) enum Kind {
    Nop,
    MulMat(matmul::MulMat),
    MulMatId(matmul::MulMatId),
    GetRows(rows::GetRows),
    SetRows(rows::SetRows),
    Copy(copy::Copy),
    Binary(binary::Binary),
    AddId(binary::AddId),
    Unary(unary::Unary),
    Glu(unary::Glu),
    Norm(norm::Norm),
    Rope(Box<rope::Rope>),
    SoftMax(softmax::SoftMax),
    DiagMaskInf(softmax::DiagMaskInf),
    FlashAttn(Box<attention::FlashAttn>),
    Reduce(reduce::Reduce),
    Sort(reduce::Sort),
    Layout(layout::LayoutOp),
    Indexed(Box<indexed::Indexed>),
    Backward(Box<backward::Backward>),
    SsmConv(recurrent::SsmConv),
    SsmScan(Box<recurrent::SsmScan>),
    Wkv(Box<recurrent::Wkv>),
    SolveTri(recurrent::SolveTri),
    DeltaNet(Box<recurrent::DeltaNet>),
    Hyper(Box<hyper::Hyper>),
    FlashBack(Box<backward::FlashBack>),
}

/// Collects the first error raised while a graph runs.
pub(crate) struct ErrorSink {
    set: AtomicBool,
    first: Mutex<Option<Error>>,
}

impl ErrorSink {
    /// An empty sink.
    pub fn new() -> ErrorSink {
        ErrorSink { set: AtomicBool::new(false), first: Mutex::new(None) }
    }

    /// Records `e` unless an error is already recorded.
    pub fn report(&self, e: Error) {
        if self.set.swap(true, Ordering::SeqCst) {
            return;
        }
        let mut g = self.first.lock().unwrap_or_else(|p| p.into_inner());
        if g.is_none() {
            *g = Some(e);
        }
    }

    /// The first error, if any.
    pub fn take(&self) -> Option<Error> {
        self.first.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

/// The scratch memory shared by all threads of a run.
#[derive(Clone, Copy)]
pub(crate) struct SharedScratch {
    ptr: *mut u8,
    len: usize,
}

impl SharedScratch {
    /// Bytes `[off, off + len)` for reading.
    pub fn bytes(&self, off: usize, len: usize) -> &[u8] {
        assert!(off.checked_add(len).is_some_and(|e| e <= self.len), "shared scratch overrun");
        // SAFETY: in bounds (checked); no thread writes this part during a phase that reads it.
        unsafe { std::slice::from_raw_parts(self.ptr.add(off), len) }
    }

    /// Bytes `[off, off + len)` for writing: the caller's op writes each part from one thread
    /// only, in a phase where no thread reads it.
    #[allow(clippy::mut_from_ref)]
    pub fn bytes_mut(&self, off: usize, len: usize) -> &mut [u8] {
        assert!(off.checked_add(len).is_some_and(|e| e <= self.len), "shared scratch overrun");
        // SAFETY: in bounds (checked); ops write disjoint ranges per thread within a phase (see
        // each op's split) and nobody reads them in that phase.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(off), len) }
    }
}

/// Per-thread execution context: which unit of which phase this thread is running.
pub(crate) struct Ctx<'a> {
    /// The unit being run.
    pub unit: usize,
    /// Units in this phase.
    pub units: usize,
    /// Scratch shared by all threads.
    pub sh: SharedScratch,
    /// This thread's own scratch.
    pub local: &'a mut [f32],
    /// Where run-time errors go.
    pub errors: &'a ErrorSink,
}

impl<'a> Ctx<'a> {
    /// A context over the shared scratch `[shared, shared + shared_len)`.
    ///
    /// # Safety
    /// The shared scratch must be valid for `shared_len` bytes while the context is used, and the
    /// units of a phase only write disjoint parts of it (each op documents its split).
    pub(crate) unsafe fn new(
        shared: *mut u8,
        shared_len: usize,
        local: &'a mut [f32],
        errors: &'a ErrorSink,
    ) -> Ctx<'a> {
        Ctx { unit: 0, units: 1, sh: SharedScratch { ptr: shared, len: shared_len }, local, errors }
    }

    /// Points the shared scratch at the region `[off, off + len)` of `[shared, shared + shared_len)`
    /// (clamped to it, so a bad region gives a short scratch, whose accesses fail their checks).
    ///
    /// # Safety
    /// As [`Ctx::new`], for the region: the units running concurrently only write disjoint parts of
    /// it, and no other plan running meanwhile uses an overlapping region.
    pub(crate) unsafe fn set_shared(&mut self, shared: *mut u8, shared_len: usize, off: usize, len: usize) {
        let off = off.min(shared_len);
        let len = len.min(shared_len - off);
        self.sh = SharedScratch { ptr: shared.wrapping_add(off), len };
    }

    /// The part of `0..n` this unit handles (the units of a phase partition `0..n`).
    pub fn range(&self, n: usize) -> std::ops::Range<usize> {
        access::split(n, self.unit, self.units)
    }

    /// Shared scratch bytes for reading (see [`SharedScratch::bytes`]).
    pub fn shared(&self, off: usize, len: usize) -> &[u8] {
        self.sh.bytes(off, len)
    }
}

/// Helper: the source `i` of `n`, or a shape error.
pub(crate) fn src(n: &Node, i: usize) -> Result<&crate::graph::Tensor> {
    n.src[i].as_ref().ok_or_else(|| Error::Shape { op: n.op, detail: format!("missing src[{i}]") })
}

/// Helper: a shape error for `op`.
pub(crate) fn shape_err(op: GgmlOp, detail: impl Into<String>) -> Error {
    Error::Shape { op, detail: detail.into() }
}

/// Helper: an unsupported-types error for `op`.
pub(crate) fn types_err(op: GgmlOp, detail: impl Into<String>) -> Error {
    Error::UnsupportedTypes { op, detail: detail.into() }
}

/// Helper: wraps a tensor.
///
/// # Safety
/// As [`Tv::new`].
pub(crate) unsafe fn tv(t: &crate::graph::Tensor) -> Result<Tv> {
    // SAFETY: forwarded contract.
    unsafe { Tv::new(t) }
}

/// Helper: wraps optional source `i`.
///
/// # Safety
/// As [`Tv::new`].
pub(crate) unsafe fn opt_tv(n: &Node, i: usize) -> Result<Option<Tv>> {
    match n.src[i].as_ref() {
        // SAFETY: forwarded contract.
        Some(t) => Ok(Some(unsafe { Tv::new(t)? })),
        None => Ok(None),
    }
}

/// How a node may share memory between its destination and a source.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Alias {
    /// No overlap allowed.
    Never,
    /// The destination may be exactly the source (same address, shape and strides): the kernel
    /// reads each row before writing the same row, from the same thread.
    RowLocal,
}

/// Rejects partial overlap of `dst` with `s`, and exact aliasing unless `alias` allows it.
pub(crate) fn check_overlap(op: GgmlOp, dst: &Tv, s: &Tv, alias: Alias) -> Result<()> {
    let (d0, dl) = dst.extent();
    let (s0, sl) = s.extent();
    if dl == 0 || sl == 0 || d0 + dl <= s0 || s0 + sl <= d0 {
        return Ok(());
    }
    if alias == Alias::RowLocal && d0 == s0 && dst.l.ne == s.l.ne && dst.l.nb == s.l.nb && dst.ts == s.ts {
        return Ok(());
    }
    Err(shape_err(op, "destination overlaps a source"))
}

/// Validates and plans one node that will run; `mask` is the mask of the softmax that alone reads a
/// MUL_MAT's result (`graph::fusion`).
///
/// # Safety
/// Every tensor of `n` and `mask` must satisfy the contract of `Graph::new`, and `hint`'s copy
/// that of `Graph::with_interleaved`.
pub(crate) unsafe fn prepare(n: &Node, hint: WeightHint, mask: Option<&Tensor>) -> Result<Plan> {
    if n.op.carries_function_pointer() {
        return Err(Error::UnsupportedOp {
            op: n.op,
            detail: "ops with callbacks are never executed".into(),
        });
    }
    // SAFETY: forwarded contract.
    let dst = unsafe { Tv::new(&n.dst)? };
    if !dst.self_disjoint() {
        return Err(shape_err(
            n.op,
            format!("destination elements overlap (ne {:?}, nb {:?})", dst.ne, dst.nb),
        ));
    }
    // SAFETY: forwarded contract (every prepare_* only wraps the node's tensors).
    let mut plan = unsafe { prepare_op(n, hint, mask)? };
    // A node with an empty destination has nothing to write (its inputs were still validated).
    if dst.is_empty() {
        return Ok(Plan { phases: 0, units: [0; 2], shared_bytes: 0, local_f32: 0, kind: Kind::Nop });
    }
    for u in plan.units.iter_mut() {
        if *u == 0 {
            *u = dst.nrows().clamp(1, MAX_UNITS);
        }
    }
    Ok(plan)
}

/// The per-op part of [`prepare`].
///
/// # Safety
/// As [`prepare`].
unsafe fn prepare_op(n: &Node, hint: WeightHint, mask: Option<&Tensor>) -> Result<Plan> {
    // SAFETY: forwarded contract (every prepare_* only wraps the node's tensors).
    unsafe {
        match n.op {
            GgmlOp::MulMat => matmul::prepare_mul_mat(n, hint, mask),
            GgmlOp::MulMatId => matmul::prepare_mul_mat_id(n),
            GgmlOp::GetRows => rows::prepare_get_rows(n),
            GgmlOp::SetRows => rows::prepare_set_rows(n),
            GgmlOp::Cpy | GgmlOp::Dup | GgmlOp::Cont => copy::prepare(n),
            GgmlOp::Add | GgmlOp::Sub | GgmlOp::Mul | GgmlOp::Div | GgmlOp::Add1 => binary::prepare(n),
            GgmlOp::AddId => binary::prepare_add_id(n),
            GgmlOp::Unary
            | GgmlOp::Sqr
            | GgmlOp::Sqrt
            | GgmlOp::Log
            | GgmlOp::Sin
            | GgmlOp::Cos
            | GgmlOp::Scale
            | GgmlOp::Clamp
            | GgmlOp::LeakyRelu
            | GgmlOp::Fill => unary::prepare(n),
            GgmlOp::Glu => unary::prepare_glu(n),
            GgmlOp::RmsNorm | GgmlOp::Norm | GgmlOp::L2Norm | GgmlOp::GroupNorm => norm::prepare(n),
            GgmlOp::Rope | GgmlOp::RopeBack => rope::prepare(n),
            GgmlOp::SoftMax => softmax::prepare(n),
            GgmlOp::DiagMaskInf | GgmlOp::DiagMaskZero => softmax::prepare_diag_mask_inf(n),
            GgmlOp::FlashAttnExt => attention::prepare(n),
            GgmlOp::Sum
            | GgmlOp::SumRows
            | GgmlOp::Mean
            | GgmlOp::Argmax
            | GgmlOp::Cumsum
            | GgmlOp::CountEqual => reduce::prepare(n),
            GgmlOp::Argsort | GgmlOp::TopK => reduce::prepare_sort(n),
            GgmlOp::Concat | GgmlOp::Pad | GgmlOp::Repeat => layout::prepare(n),
            GgmlOp::Arange
            | GgmlOp::TimestepEmbedding
            | GgmlOp::Roll
            | GgmlOp::PadReflect1d
            | GgmlOp::Diag
            | GgmlOp::Tri
            | GgmlOp::Acc
            | GgmlOp::Set
            | GgmlOp::Upscale
            | GgmlOp::Im2col
            | GgmlOp::Pool1d
            | GgmlOp::Pool2d
            | GgmlOp::Conv2dDw
            | GgmlOp::Conv2d
            | GgmlOp::ConvTranspose1d
            | GgmlOp::ConvTranspose2d
            | GgmlOp::OutProd
            | GgmlOp::WinPart
            | GgmlOp::WinUnpart
            | GgmlOp::GetRelPos
            | GgmlOp::Im2col3d
            | GgmlOp::Conv3d
            | GgmlOp::Im2colBack
            | GgmlOp::Col2im1d
            | GgmlOp::Pool2dBack
            | GgmlOp::AddRelPos => indexed::prepare(n),
            GgmlOp::SiluBack
            | GgmlOp::RmsNormBack
            | GgmlOp::SoftMaxBack
            | GgmlOp::RepeatBack
            | GgmlOp::GetRowsBack
            | GgmlOp::CrossEntropyLoss
            | GgmlOp::CrossEntropyLossBack
            | GgmlOp::OptStepSgd
            | GgmlOp::OptStepAdamw => backward::prepare(n),
            GgmlOp::SsmConv => recurrent::prepare_ssm_conv(n),
            GgmlOp::SsmScan => recurrent::prepare_ssm_scan(n),
            GgmlOp::RwkvWkv6 | GgmlOp::GatedLinearAttn | GgmlOp::RwkvWkv7 => recurrent::prepare_wkv(n),
            GgmlOp::SolveTri => recurrent::prepare_solve_tri(n),
            GgmlOp::FlashAttnBack => backward::prepare_flash_back(n),
            GgmlOp::GatedDeltaNet => recurrent::prepare_delta_net(n),
            GgmlOp::Dsv4HcComb | GgmlOp::Dsv4HcPre | GgmlOp::Dsv4HcPost | GgmlOp::LightningIndexer => {
                hyper::prepare(n)
            }
            op => Err(Error::UnsupportedOp { op, detail: "not implemented by this backend".into() }),
        }
    }
}

/// Runs phase `phase` of a planned node on the calling thread.
pub(crate) fn run(n: &Node, plan: &Plan, phase: u8, ctx: &mut Ctx<'_>) {
    match &plan.kind {
        Kind::Nop => {}
        Kind::MulMat(p) => p.run(phase, ctx),
        Kind::MulMatId(p) => p.run(n.op, phase, ctx),
        Kind::GetRows(p) => p.run(n.op, ctx),
        Kind::SetRows(p) => p.run(n.op, phase, ctx),
        Kind::Copy(p) => p.run(ctx),
        Kind::Binary(p) => p.run(ctx),
        Kind::AddId(p) => p.run(n.op, ctx),
        Kind::Unary(p) => p.run(ctx),
        Kind::Glu(p) => p.run(ctx),
        Kind::Norm(p) => p.run(ctx),
        Kind::Rope(p) => p.run(ctx),
        Kind::SoftMax(p) => p.run(ctx),
        Kind::DiagMaskInf(p) => p.run(ctx),
        Kind::FlashAttn(p) => p.run(phase, ctx),
        Kind::Reduce(p) => p.run(ctx),
        Kind::Sort(p) => p.run(ctx),
        Kind::Layout(p) => p.run(ctx),
        Kind::Indexed(p) => p.run(ctx),
        Kind::Backward(p) => p.run(n.op, ctx),
        Kind::SsmConv(p) => p.run(ctx),
        Kind::SsmScan(p) => p.run(n.op, ctx),
        Kind::Wkv(p) => p.run(ctx),
        Kind::SolveTri(p) => p.run(ctx),
        Kind::DeltaNet(p) => p.run(ctx),
        Kind::Hyper(p) => p.run(ctx),
        Kind::FlashBack(p) => {
            if phase == 0 {
                p.clear(ctx)
            } else {
                p.run(ctx)
            }
        }
    }
}

/// Most units a row-wise phase is cut into (enough for any thread count we run with, few enough
/// that claiming a unit costs nothing next to its work).
pub(crate) const MAX_UNITS: usize = 64;

/// A plan with one phase of row-chunk units and no shared scratch.
pub(crate) fn simple(kind: Kind, local_f32: usize) -> Plan {
    Plan { phases: 1, units: [0; 2], shared_bytes: 0, local_f32, kind }
}

/// Reads f32 op_param `i`.
pub(crate) fn param_f32(n: &Node, i: usize) -> f32 {
    f32::from_bits(n.op_params[i] as u32)
}
