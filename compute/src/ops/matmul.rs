//! MUL_MAT and MUL_MAT_ID.
//!
//! ref: ggml-compute-semantics.md §3.3 MUL_MAT, MUL_MAT_ID and §2.3. Rows of `src1` are first
//! converted to the weight type's `vec_dot_type` (phase 0, rows split across units, into shared
//! scratch); then (phase 1) every output element is one `vec_dot` of a weight row with a converted
//! row, the work split in tiles of weight rows so each tile stays in cache while it meets every
//! activation row. A block of 16 weight rows × 16 activation rows goes to the type's register-tiled
//! `gemm` kernel when it has one (else four-column and one-column dots); its results, bit-identical
//! whichever kernel ran, are written one destination column (16 consecutive floats) at a time.

use crate::dtype::GgmlType;
use crate::error::{Error, Result};
use crate::graph::Node;
use crate::graph::{Interleaved, WeightHint};
use crate::op::GgmlOp;
use crate::quant::interleave::{self, InterleavedDotFn};
use crate::quant::local;
use crate::quant::panel::{PanelKernels, PANEL_COLS, PANEL_ROWS};
use crate::quant::prepared::PreparedDot;
use crate::quant::{self, FromF32Fn, GemmFn, VecDot2x2Fn, VecDotFn, VecDotRows4Fn, VecDotX4Fn};

use super::access::{self, Tv};
use super::{check_overlap, shape_err, src, tv, types_err, Alias, Ctx, Kind, Plan, SharedScratch};

/// Weight rows per work unit.
const ROW_BLOCK: usize = 16;
/// Activation rows per inner tile.
const COL_BLOCK: usize = 16;
// A unit of weight rows is exactly one panel.
const _: () = assert!(ROW_BLOCK == PANEL_ROWS);

/// How activation rows reach `vec_dot`.
struct Activations {
    /// Converted rows live in shared scratch (else `src1` rows are used in place).
    convert: bool,
    /// Quantizer of the vec_dot type (`None` for F32: rows are stored as f32).
    from_f32: Option<FromF32Fn>,
    /// Bytes of one converted row.
    row: usize,
    /// Set when quantized rows are repacked for a kernel (the quantized row then goes through
    /// thread scratch, and `row` is the repacked row's size).
    repack: Option<Repack>,
    /// Bytes of one row of the vec_dot type.
    vdt_row: usize,
    /// The vec_dot type.
    vdt: GgmlType,
}

/// How converted activation rows are repacked after quantization.
#[derive(Clone, Copy)]
enum Repack {
    /// Into panel columns: the product runs on packed panels (many activation rows).
    Panel(PanelKernels),
    /// Into prepared rows for the type's prepared dot (generation: few activation rows).
    Prepared(PreparedDot),
    /// Into prepared rows for weights stored with this bias, read only by an interleaved product
    /// in llama.cpp's local order (see [`plan_local`]).
    Interleaved(i32),
}

/// Most activation rows for which the prepared dot is used (one preparation per activation row
/// pays when every weight row meets few of them): a generation step of up to 8 sequences decoded
/// together (a server's parallel slots) reads the interleaved copy, two rows per kernel call,
/// instead of falling back to one-row dots; every output keeps the one-row `vec_dot`'s bits.
const PREPARED_MAX_COLS: usize = crate::quant::interleave::SERVE_MAX_COLS;

/// Activation columns per kernel call of the tiled product on prepared rows: its weight rows'
/// scales are prepared once per call.
const PREPARED_GEMM_COLS: usize = 64;

/// Fewest activation rows for which packing a panel of weights pays.
const PANEL_MIN_COLS: usize = 8;

/// Most activation rows of a product in llama.cpp's local order that read the model's interleaved
/// weight copy rather than packing panels (the same bits, see [`plan_local`]). A panel packs its
/// weights once per work unit, which 8 columns do not repay: a step of 8 parallel sequences on a
/// 1B-shape Q4_0 model ran at 104 tokens/s on panels against 131 for 7 rows on the copy
/// (`llamactl bench -p 7,8`, 2 threads; bench/results/serving-2026-12-02.md).
const LOCAL_INTERLEAVED_MAX_COLS: usize = PREPARED_MAX_COLS;

fn plan_activations(op: GgmlOp, a: &Tv, b: &Tv) -> Result<(VecDotFn, Activations)> {
    let k = quant::kernels(a.dtype());
    let vec_dot =
        k.vec_dot.ok_or_else(|| types_err(op, format!("no vec_dot kernel for src0 {}", a.dtype())))?;
    let vdt = k.vec_dot_type;
    let k_len = a.ne[0];
    if !k_len.is_multiple_of(vdt.blck_size()) {
        return Err(shape_err(op, format!("K = {k_len} is not a multiple of the {vdt} block")));
    }
    let row = vdt.row_size(k_len as u64).ok_or_else(|| shape_err(op, "row size overflows"))? as usize;
    if b.dtype() == vdt && b.packed {
        return Ok((
            vec_dot,
            Activations { convert: false, from_f32: None, row, repack: None, vdt_row: row, vdt },
        ));
    }
    if !b.can_load() || !matches!(b.dtype(), GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) {
        return Err(types_err(op, format!("src1 {} cannot be converted to {vdt}", b.dtype())));
    }
    let from_f32 = if vdt == GgmlType::F32 {
        None
    } else {
        Some(quant::kernels(vdt).from_f32.ok_or(Error::MissingKernel { dtype: vdt, kernel: "from_f32" })?)
    };
    Ok((vec_dot, Activations { convert: true, from_f32, row, repack: None, vdt_row: row, vdt }))
}

/// Chooses a repacking of the converted rows: panels for many activation rows, prepared rows for
/// few (or for many, when the type has a tiled product on prepared rows and no mask may hide
/// blocks of the result), when the weight type has the kernels; returns the f32 scratch each
/// thread then needs (0 without one).
fn plan_repack(a: &Tv, b: &Tv, act: &mut Activations, masked: bool) -> usize {
    if !act.convert || act.from_f32.is_none() {
        return 0;
    }
    let kern = quant::kernels(a.dtype());
    let k = a.ne[0];
    // Phase 0 holds the f32 row, then the quantized row.
    let convert = k + act.vdt_row.div_ceil(4);
    match (kern.panel, kern.vec_dot_prepared) {
        (Some(p), _) if b.ne[1] >= PANEL_MIN_COLS => {
            act.repack = Some(Repack::Panel(p));
            act.row = p.format.col_bytes(k);
            // Phase 1 holds the unit's weight panel.
            convert.max(p.format.panel_bytes(k).div_ceil(4))
        }
        (_, Some(p)) if b.ne[1] <= PREPARED_MAX_COLS || p.gemm.is_some() && !masked => {
            act.repack = Some(Repack::Prepared(p));
            act.row = quant::prepared::row_bytes(k);
            convert
        }
        _ => 0,
    }
}

/// The product in llama.cpp's local (repacked) order, when `hint` says the weights are a model's
/// own, llama.cpp's CPU backend would repack them under the active profile
/// ([`local::repacks`]), and the kernel set has that order: panels, or for generation the
/// interleaved copy when there is one, or the type's one-row dot in that order. Sets the
/// activations' repacking where there is one. `None`: the RPC server's order (logged when it is
/// only because the order is not reproduced).
fn plan_local(a: &Tv, b: &Tv, act: &mut Activations, hint: WeightHint) -> Option<LocalPlan> {
    let numerics = crate::numerics::active();
    if !hint.local || !act.convert || b.dtype() != GgmlType::F32 || !local::repacks(numerics, &a.l, false) {
        return None;
    }
    let t = a.dtype();
    let Some(lk) = quant::kernels(t).local else {
        tracing::debug!(%t, ne = ?a.ne, numerics = numerics.name(), "llama.cpp repacks this weight on its local CPU; its order is not reproduced here (the RPC server's order is used)");
        return None;
    };
    act.from_f32?;
    let k = a.ne[0];
    let convert = k + act.vdt_row.div_ceil(4);
    if b.ne[1] <= LOCAL_INTERLEAVED_MAX_COLS {
        let copy = match (lk.interleaved, hint.interleaved) {
            (Some(f), Some(il)) if interleave::eligible(&a.l) => {
                let need = (a.ne[1] / interleave::ROWS).checked_mul(interleave::group_bytes(t, k))?;
                (!il.data.is_null() && il.len >= need).then_some((il.data, f))
            }
            _ => None,
        };
        if let Some(copy) = copy {
            act.repack = Some(Repack::Interleaved(interleave::bias(t)));
            act.row = quant::prepared::row_bytes(k);
            return Some(LocalPlan::Repacked(convert, Some(copy)));
        }
    }
    if let Some(p) = lk.panel {
        act.repack = Some(Repack::Panel(p));
        act.row = p.format.col_bytes(k);
        return Some(LocalPlan::Repacked(convert.max(p.format.panel_bytes(k).div_ceil(4)), None));
    }
    lk.vec_dot.map(|(gemv, gemm)| LocalPlan::Dot((gemv, gemm, lk.gemm_x4)))
}

/// The one-row local-order dots (see [`LocalPlan::Dot`]).
type LocalDots = (VecDotFn, VecDotFn, Option<VecDotX4Fn>);

/// How a product in llama.cpp's local order runs (see [`plan_local`]).
#[derive(Clone, Copy)]
enum LocalPlan {
    /// On repacked activations (panels, or prepared rows for the interleaved product): the f32
    /// scratch each thread needs, and the interleaved copy with its kernel.
    Repacked(usize, Option<(*const u8, InterleavedDotFn)>),
    /// One-row dots on the converted activation rows: (ggml's `gemv` order, its `gemm` order, the
    /// `gemm` order for four activation rows at once).
    Dot(LocalDots),
}

/// Phase 0: converts the rows `rows` (flat indices over `b`) into shared scratch, and records
/// their extents when asked.
fn convert_rows(
    b: &Tv,
    act: &Activations,
    extents: Option<Extents>,
    rows: std::ops::Range<usize>,
    ctx: &mut Ctx<'_>,
) {
    for r in rows {
        let (i1, i2, i3) = b.unravel_row(r);
        let k = b.ne[0];
        let local = &mut ctx.local[..k];
        b.load_row(i1, i2, i3, local);
        let sh = ctx.sh;
        let out = sh.bytes_mut(r * act.row, act.row);
        if let (Some(repack), Some(f)) = (act.repack, act.from_f32) {
            let (row, rest) = ctx.local.split_at_mut(k);
            let q = &mut bytemuck::cast_slice_mut::<f32, u8>(rest)[..act.vdt_row];
            f(row, q);
            match repack {
                Repack::Panel(p) => (p.pack_col)(k, q, out),
                Repack::Prepared(p) => quant::prepared::prepare(k, act.vdt, p.bias, q, out),
                Repack::Interleaved(bias) => quant::prepared::prepare(k, act.vdt, bias, q, out),
            }
            continue;
        }
        match act.from_f32 {
            Some(f) => f(local, out),
            None => {
                for (o, v) in out.chunks_exact_mut(4).zip(local.iter()) {
                    o.copy_from_slice(&v.to_le_bytes());
                }
            }
        }
        if let Some(e) = extents {
            let ext = f16_extent(out) as u32;
            sh.bytes_mut(e.off + 4 * r, 4).copy_from_slice(&ext.to_ne_bytes());
        }
    }
}

/// The number of values of the F16 row `row` up to and including its last one that is not ±0.
fn f16_extent(row: &[u8]) -> usize {
    row.chunks_exact(2).rposition(|h| u16::from_le_bytes([h[0], h[1]]) & 0x7fff != 0).map_or(0, |i| i + 1)
}

/// Activation row `(i1, i2, i3)` of `b`, converted or in place.
fn act_row<'c>(
    b: &'c Tv,
    act: &Activations,
    sh: &'c SharedScratch,
    i1: usize,
    i2: usize,
    i3: usize,
) -> &'c [u8] {
    if act.convert {
        let r = i1 + b.ne[1] * (i2 + b.ne[2] * i3);
        sh.bytes(r * act.row, act.row)
    } else {
        b.row_bytes(i1, i2, i3)
    }
}

/// A planned MUL_MAT.
pub(crate) struct MulMat {
    a: Tv,
    b: Tv,
    dst: Tv,
    k: DotKernels,
    act: Activations,
    /// The interleaved copy of `a` (whole groups of its rows), its kernel and the most columns
    /// one call of it takes, for generation.
    interleaved: Option<(*const u8, InterleavedDotFn, usize)>,
    /// Where phase 0 records each converted activation row's extent (see [`Extents`]).
    extents: Option<Extents>,
    /// The softmax mask that alone reads the result, and where phase 0 records which blocks it
    /// hides (see [`Hidden`]).
    hidden: Option<Hidden>,
    /// llama.cpp's local order by one-row dots, `(gemv, gemm)` (see [`MulMat::run_local_dots`]).
    local_dots: Option<LocalDots>,
}

/// The blocks of the result a softmax mask hides: for every mask row (token, mask head, mask
/// batch) and every block of [`ROW_BLOCK`] weight rows (KV cells), one byte at `off` in shared
/// scratch, 1 when the mask holds -inf for all of them. Such a block of outputs is written as 0
/// instead of computed: the softmax turns it into exact zeros either way (`graph::fusion`).
struct Hidden {
    mask: Tv,
    off: usize,
    /// Tokens: the result's `ne[1]`.
    tokens: usize,
    /// Mask rows: `tokens * mask.ne[2] * mask.ne[3]`.
    rows: usize,
    /// Row blocks per mask row.
    blocks: usize,
}

/// The extents of converted F16 activation rows: one `u32` per row at `off` in shared scratch, the
/// row's length up to and including its last nonzero value. Products in the float GEMM order
/// accumulate eight lanes at a time, so stopping a block of columns at the eight-element group
/// after its longest extent leaves out only products with a zero factor: the sums keep their bits
/// (a lane that is exactly -0.0 could end as +0.0 with the full length; nothing else changes).
/// Attention's KQV product meets this on every prompt: the softmax rows of a causal mask end in
/// zeros, about half of them.
#[derive(Clone, Copy)]
struct Extents {
    off: usize,
}

/// Group of elements the float GEMM order accumulates per lane step (see [`Extents`]): 8 lanes in
/// ggml's AVX2 order, 16 in its AVX-512 order (the `avx512` numerics profile, whose F16 GEMM also
/// takes only whole 16-element steps and falls back to `vec_dot`'s order otherwise).
fn extent_step() -> usize {
    if crate::numerics::active() == crate::numerics::Numerics::Avx512 {
        16
    } else {
        8
    }
}

/// The interleaved copy of `a` and its kernel, when the product can read it: a 2-D matrix of a
/// type with an interleaved kernel, whose rows form whole groups, and a copy that holds them all.
fn plan_interleaved(a: &Tv, il: Interleaved) -> Option<(*const u8, InterleavedDotFn)> {
    let t = a.dtype();
    let kern = quant::kernels(t);
    let f = kern.interleaved_dot?;
    let (k, m) = (a.ne[0], a.ne[1]);
    let whole =
        interleave::eligible(&a.l) && kern.vec_dot_prepared.map(|p| p.bias) == Some(interleave::bias(t));
    let need = (m / interleave::ROWS).checked_mul(interleave::group_bytes(t, k))?;
    (whole && !il.data.is_null() && il.len >= need).then_some((il.data, f))
}

/// Validates MUL_MAT.
///
/// # Safety
/// As `ops::prepare`.
pub(crate) unsafe fn prepare_mul_mat(
    n: &Node,
    hint: WeightHint,
    mask: Option<&crate::graph::Tensor>,
) -> Result<Plan> {
    let op = n.op;
    // SAFETY: forwarded contract.
    let (a, b, dst) = unsafe { (tv(src(n, 0)?)?, tv(src(n, 1)?)?, tv(&n.dst)?) };
    if !a.packed || a.l.is_transposed() && a.ne[1] > 1 {
        return Err(shape_err(op, "src0 rows must be packed and not transposed"));
    }
    if a.ne[0] != b.ne[0] {
        return Err(shape_err(op, format!("K mismatch: src0 ne0 {} vs src1 ne0 {}", a.ne[0], b.ne[0])));
    }
    if dst.dtype() != GgmlType::F32 || !dst.packed {
        return Err(types_err(op, format!("dst must be packed F32, got {}", dst.dtype())));
    }
    if dst.ne != [a.ne[1], b.ne[1], b.ne[2], b.ne[3]] {
        return Err(shape_err(op, format!("dst {:?} for src0 {:?} x src1 {:?}", dst.ne, a.ne, b.ne)));
    }
    if dst.is_empty() {
        return Ok(super::simple(Kind::Nop, 0));
    }
    if a.is_empty() || b.is_empty() || b.ne[2] % a.ne[2] != 0 || b.ne[3] % a.ne[3] != 0 {
        return Err(shape_err(op, format!("src1 batch {:?} does not broadcast src0 {:?}", b.ne, a.ne)));
    }
    check_overlap(op, &dst, &a, Alias::Never)?;
    check_overlap(op, &dst, &b, Alias::Never)?;
    let (vec_dot, mut act) = plan_activations(op, &a, &b)?;
    let local = plan_local(&a, &b, &mut act, hint);
    // ggml multiplies F16 weights (and F32 weights by contiguous F32 activations) with its float GEMM
    // (llamafile's tinyBLAS) when there are enough activation rows and the weight rows are a multiple
    // of 4, and with `vec_dot` otherwise; use the same arithmetic so results match a llama.cpp CPU
    // backend bit for bit (the conditions of the build: `GemmRule`).
    let rule = quant::kernels(a.dtype()).gemm_rule;
    let gemm = quant::kernels(a.dtype()).vec_dot_gemm.filter(|_| {
        let fits = b.ne[1] >= rule.min_cols && a.ne[1].is_multiple_of(4);
        let operands = if rule.f32_activations {
            b.dtype() == GgmlType::F32 && b.l.is_contiguous() && a.ne[0].is_multiple_of(4)
        } else {
            a.dtype() != GgmlType::F32 || b.l.is_contiguous()
        };
        fits && operands && local.is_none()
    });
    if gemm.is_some() && rule.f32_activations {
        // The GEMM dot reads the f32 rows of `src1` in place.
        let row = 4 * a.ne[0];
        act = Activations {
            convert: false,
            from_f32: None,
            row,
            repack: None,
            vdt_row: row,
            vdt: GgmlType::F32,
        };
    }
    // The float GEMM order is its own kernel: neither the four-column nor the tiled quantized
    // kernels apply to it.
    let k = match gemm {
        Some(g) => DotKernels {
            vec_dot: g,
            vec_dot_x4: None,
            vec_dot_rows4: None,
            gemm: quant::kernels(a.dtype()).gemm,
            vec_dot_2x2: None,
        },
        None => DotKernels::new(a.dtype(), vec_dot),
    };
    // ggml's mul_mat runs its two-row kernels (aarch64 i8mm) for every output when the weight rows
    // and the activation rows are both even in number, and one-row dots otherwise; for the types
    // whose two-row kernel has its own order (ggml's smmla order) only the same rule gives its bits.
    let mut k = k;
    if two_row_order_differs(a.dtype()) && (a.ne[1] % 2 != 0 || b.ne[1] % 2 != 0) {
        k.vec_dot_2x2 = None;
    }
    let repack_local = match local {
        Some(LocalPlan::Repacked(scratch, _)) => scratch,
        Some(LocalPlan::Dot(_)) => 0,
        None if gemm.is_none() => plan_repack(&a, &b, &mut act, mask.is_some()),
        None => 0,
    };
    let k = match act.repack {
        // Prepared rows: the one-column dot for few columns, the prepared tiles for many (the
        // same bits).
        Some(Repack::Prepared(p)) => DotKernels {
            vec_dot: p.dot,
            vec_dot_x4: None,
            vec_dot_rows4: None,
            gemm: p.gemm.filter(|_| b.ne[1] > PREPARED_MAX_COLS),
            vec_dot_2x2: None,
        },
        _ => k,
    };
    // ggml takes its tiled product for 8+ activation rows of a K-quant or IQ type: that order where
    // the kernel set reproduces it (and no repacked product runs instead).
    let k = match (act.repack, DotKernels::batch(a.dtype())) {
        (None, Some(bk)) if gemm.is_none() && local.is_none() && b.ne[1] >= quant::TILED_MIN_ROWS => bk,
        _ => k,
    };
    // llama.cpp's local order by one-row dots (`run_local_dots`).
    let local_dots = match local {
        Some(LocalPlan::Dot(pair)) => Some(pair),
        _ => None,
    };
    // Generation steps read the interleaved copy when there is one (the same values).
    let interleaved = match (act.repack, hint.interleaved) {
        (Some(Repack::Interleaved(_)), _) => match local {
            Some(LocalPlan::Repacked(_, il)) => il.map(|(d, f)| (d, f, interleave::LOCAL_MAX_COLS)),
            _ => None,
        },
        (Some(Repack::Prepared(_)), Some(il)) if b.ne[1] <= PREPARED_MAX_COLS => {
            plan_interleaved(&a, il).map(|(d, f)| (d, f, interleave::MAX_COLS))
        }
        _ => None,
    };
    let mut shared_bytes = if act.convert {
        b.nrows().checked_mul(act.row).ok_or_else(|| shape_err(op, "scratch size overflows"))?
    } else {
        0
    };
    // F16 weights against converted rows in the float GEMM order, with whole lane steps: rows
    // may stop at their extent.
    let extents = (gemm.is_some()
        && a.dtype() == GgmlType::F16
        && act.convert
        && act.vdt == GgmlType::F16
        && a.ne[0].is_multiple_of(extent_step()))
    .then(|| -> Result<Extents> {
        let off = shared_bytes.next_multiple_of(4);
        shared_bytes = b
            .nrows()
            .checked_mul(4)
            .and_then(|n| n.checked_add(off))
            .ok_or_else(|| shape_err(op, "scratch size overflows"))?;
        Ok(Extents { off })
    })
    .transpose()?;
    let hidden = match mask {
        // SAFETY: forwarded contract (the mask is a live tensor of the same graph).
        Some(m) if act.convert && act.repack.is_none() => unsafe {
            plan_hidden(m, &dst, &b, &mut shared_bytes)
        },
        _ => None,
    };
    let phases = if act.convert { 2 } else { 1 };
    let mut local = if act.convert { a.ne[0].max(repack_local) } else { 0 };
    if let Some(h) = &hidden {
        local = local.max(h.mask.ne[0]);
    }
    let work = b.ne[2] * b.ne[3] * a.ne[1].div_ceil(ROW_BLOCK);
    let units = if act.convert { [b.nrows().clamp(1, super::MAX_UNITS), work] } else { [work, 0] };
    Ok(Plan {
        phases,
        units,
        shared_bytes,
        local_f32: local,
        kind: Kind::MulMat(MulMat { a, b, dst, k, act, interleaved, extents, hidden, local_dots }),
    })
}

/// The [`Hidden`] blocks of a product whose result only the softmax with `mask` reads, when the
/// mask fits the result as SOFT_MAX requires and can be read; `None` (compute everything)
/// otherwise. Grows the shared scratch by the flags.
///
/// # Safety
/// As `ops::prepare`, for `mask`.
unsafe fn plan_hidden(mask: &crate::graph::Tensor, dst: &Tv, b: &Tv, shared: &mut usize) -> Option<Hidden> {
    // SAFETY: forwarded contract.
    let m = unsafe { tv(mask) }.ok()?;
    let fits = matches!(m.dtype(), GgmlType::F16 | GgmlType::F32)
        && m.can_load()
        && m.ne[0] == dst.ne[0]
        && m.ne[1] >= dst.ne[1]
        && m.ne[2] > 0
        && m.ne[3] > 0
        && dst.ne[2].is_multiple_of(m.ne[2])
        && dst.ne[3].is_multiple_of(m.ne[3]);
    if !fits {
        return None;
    }
    let rows = dst.ne[1].checked_mul(m.ne[2])?.checked_mul(m.ne[3])?;
    // Phase 0 visits every activation row once; the mask rows are a prefix of them.
    if rows > b.nrows() {
        return None;
    }
    let blocks = dst.ne[0].div_ceil(ROW_BLOCK);
    let off = *shared;
    *shared = rows.checked_mul(blocks)?.checked_add(off)?;
    Some(Hidden { mask: m, off, tokens: dst.ne[1], rows, blocks })
}

impl Hidden {
    /// Phase 0: the flags of mask row `r`, from `row` (scratch of at least `mask.ne[0]` floats).
    fn record(&self, r: usize, row: &mut [f32], sh: &SharedScratch) {
        let m = &self.mask;
        let (c, rest) = (r % self.tokens, r / self.tokens);
        let row = &mut row[..m.ne[0]];
        m.load_row(c, rest % m.ne[2], rest / m.ne[2], row);
        let flags = sh.bytes_mut(self.off + r * self.blocks, self.blocks);
        for (f, block) in flags.iter_mut().zip(row.chunks(ROW_BLOCK)) {
            *f = u8::from(block.iter().all(|&v| v == f32::NEG_INFINITY));
        }
    }

    /// Whether the mask hides the block `rb` of weight rows from every activation row `cols` of
    /// batch `(i12, i13)`.
    fn hides(
        &self,
        sh: &SharedScratch,
        rb: usize,
        cols: std::ops::Range<usize>,
        i12: usize,
        i13: usize,
    ) -> bool {
        let m = &self.mask;
        let base = self.tokens * (i12 % m.ne[2] + m.ne[2] * (i13 % m.ne[3]));
        let flags = sh.bytes(self.off, self.rows * self.blocks);
        cols.into_iter().all(|c| flags[(base + c) * self.blocks + rb] != 0)
    }
}

impl MulMat {
    pub(crate) fn run(&self, phase: u8, ctx: &mut Ctx<'_>) {
        if self.act.convert && phase == 0 {
            let rows = ctx.range(self.b.nrows());
            convert_rows(&self.b, &self.act, self.extents, rows.clone(), ctx);
            if let Some(h) = &self.hidden {
                let sh = ctx.sh;
                for r in rows.filter(|&r| r < h.rows) {
                    h.record(r, ctx.local, &sh);
                }
            }
            return;
        }
        let (a, b, dst) = (&self.a, &self.b, &self.dst);
        let m = a.ne[1];
        let n = b.ne[1];
        let row_blocks = m.div_ceil(ROW_BLOCK);
        let r2 = b.ne[2] / a.ne[2];
        let r3 = b.ne[3] / a.ne[3];
        // One unit = one block of weight rows of one batch, against every activation row.
        let u = ctx.unit;
        let batch = u / row_blocks;
        let rb = u % row_blocks;
        let (i12, i13) = (batch % b.ne[2], batch / b.ne[2]);
        let (i02, i03) = (i12 / r2, i13 / r3);
        let r0 = rb * ROW_BLOCK;
        if let Some((data, f, per_call)) = self.interleaved {
            self.run_interleaved(data, (f, per_call), r0, (i12, i13), ctx);
            return;
        }
        let nr = ROW_BLOCK.min(m - r0);
        let xs: [&[u8]; ROW_BLOCK] = std::array::from_fn(|i| a.row_bytes(r0 + i.min(nr - 1), i02, i03));
        if let Some(dots) = self.local_dots {
            self.run_local_dots(dots, &xs[..nr], r0, (i12, i13), ctx);
            return;
        }
        if let Some(Repack::Panel(p)) = self.act.repack {
            self.run_panel(p, &xs, r0, nr, (i12, i13), ctx);
            return;
        }
        let mut out = [0.0f32; ROW_BLOCK * PREPARED_GEMM_COLS];
        // The tiled product on prepared rows takes wider calls (never with a mask's hidden blocks).
        let step = match self.act.repack {
            Some(Repack::Prepared(_)) if self.k.gemm.is_some() => PREPARED_GEMM_COLS,
            _ => COL_BLOCK,
        };
        let mut c0 = 0;
        while c0 < n {
            let nc = step.min(n - c0);
            if self.hidden.as_ref().is_some_and(|h| h.hides(&ctx.sh, rb, c0..c0 + nc, i12, i13)) {
                for j in 0..nc {
                    dst.store_f32s(r0, c0 + j, i12, i13, &[0.0; ROW_BLOCK][..nr]);
                }
                c0 += nc;
                continue;
            }
            let mut ys: [&[u8]; PREPARED_GEMM_COLS] = [&[]; PREPARED_GEMM_COLS];
            for (j, y) in ys.iter_mut().enumerate().take(nc) {
                *y = act_row(b, &self.act, &ctx.sh, c0 + j, i12, i13);
            }
            let k = match self.extents {
                Some(e) => self.block_extent(e, &ctx.sh, c0..c0 + nc, i12, i13),
                None => a.ne[0],
            };
            self.k.products(k, &xs[..nr], &ys[..nc], &mut out[..nr * nc]);
            for (j, col) in out[..nr * nc].chunks_exact(nr).enumerate() {
                dst.store_f32s(r0, c0 + j, i12, i13, col);
            }
            c0 += nc;
        }
    }
}

impl MulMat {
    /// How far the products of the activation rows `cols` of batch `(i12, i13)` must run: their
    /// longest extent rounded up to whole lane steps (at least one step, at most the row).
    fn block_extent(
        &self,
        e: Extents,
        sh: &SharedScratch,
        cols: std::ops::Range<usize>,
        i12: usize,
        i13: usize,
    ) -> usize {
        let b = &self.b;
        let first = b.ne[1] * (i12 + b.ne[2] * i13);
        let longest = cols
            .map(|c| {
                let v = sh.bytes(e.off + 4 * (first + c), 4);
                u32::from_ne_bytes([v[0], v[1], v[2], v[3]]) as usize
            })
            .max()
            .unwrap_or(0);
        let step = extent_step();
        longest.next_multiple_of(step).clamp(step, self.a.ne[0])
    }

    /// One unit on the interleaved copy: the group of rows `r0..r0 + 16` against the prepared
    /// activation rows, `per_call` (at most [`interleave::LOCAL_MAX_COLS`]) at a time (each
    /// column's sums are its own, so the grouping does not change a bit).
    fn run_interleaved(
        &self,
        data: *const u8,
        (f, per_call): (InterleavedDotFn, usize),
        r0: usize,
        (i12, i13): (usize, usize),
        ctx: &mut Ctx<'_>,
    ) {
        let (a, b, dst) = (&self.a, &self.b, &self.dst);
        let k = a.ne[0];
        let gb = interleave::group_bytes(a.dtype(), k);
        // SAFETY: `plan_interleaved` checked that the copy holds every group of `a`'s rows (r0 is
        // a multiple of 16 below ne1), and the contract of `Graph::with_interleaved` keeps it valid
        // and unchanged while the graph exists.
        let group = unsafe { std::slice::from_raw_parts(data.add(r0 / interleave::ROWS * gb), gb) };
        let n = b.ne[1];
        // The next group of rows (the unit a thread most often claims next): each kernel call
        // prefetches a share of it, so it arrives while this group computes.
        let next: &[u8] = if r0 + interleave::ROWS < a.ne[1] {
            // SAFETY: the group after r0's lies inside the copy too (r0 + 16 < ne1, whole groups).
            unsafe { std::slice::from_raw_parts(data.add((r0 / interleave::ROWS + 1) * gb), gb) }
        } else {
            &[]
        };
        const CAP: usize = interleave::LOCAL_MAX_COLS;
        let per_call = per_call.clamp(1, CAP);
        let share = gb.div_ceil(n.div_ceil(per_call)).next_multiple_of(64);
        let mut c0 = 0;
        while c0 < n {
            let first = (c0 / per_call * share).min(next.len());
            let ahead = &next[first..(first + share).min(next.len())];
            let nc = per_call.min(n - c0);
            let ys: [&[u8]; CAP] =
                std::array::from_fn(|j| act_row(b, &self.act, &ctx.sh, c0 + j.min(nc - 1), i12, i13));
            let mut out = [0.0f32; CAP * interleave::ROWS];
            f(k, group, &ys[..nc], &mut out[..nc * interleave::ROWS], ahead);
            for (j, col) in out[..nc * interleave::ROWS].chunks_exact(interleave::ROWS).enumerate() {
                dst.store_f32s(r0, c0 + j, i12, i13, col);
            }
            c0 += nc;
        }
    }

    /// One unit in llama.cpp's local order by one-row dots: ggml's repacked product takes its
    /// four-row `gemm` for the first `n - n % 4` activation rows of a plane and its `gemv` for the
    /// rest, and for some types (Q4_K) the two group the float steps differently.
    fn run_local_dots(
        &self,
        (gemv, gemm, gemm_x4): LocalDots,
        xs: &[&[u8]],
        r0: usize,
        (i12, i13): (usize, usize),
        ctx: &mut Ctx<'_>,
    ) {
        let (b, dst) = (&self.b, &self.dst);
        let (k, n) = (self.a.ne[0], b.ne[1]);
        let mut out = [0.0f32; ROW_BLOCK];
        // ggml's four-row `gemm` takes the first `n - n % 4` rows: four at a time where the kernel
        // set has that form (the same bits per output).
        let mut c = 0;
        if let Some(x4) = gemm_x4 {
            let mut out4 = [[0.0f32; ROW_BLOCK]; 4];
            while c + 4 <= n - n % 4 {
                let ys: [&[u8]; 4] = std::array::from_fn(|j| act_row(b, &self.act, &ctx.sh, c + j, i12, i13));
                for (i, x) in xs.iter().enumerate() {
                    let r = x4(k, x, ys);
                    for j in 0..4 {
                        out4[j][i] = r[j];
                    }
                }
                for (j, o) in out4.iter().enumerate() {
                    dst.store_f32s(r0, c + j, i12, i13, &o[..xs.len()]);
                }
                c += 4;
            }
        }
        for c in c..n {
            let f = if c < n - n % 4 { gemm } else { gemv };
            let y = act_row(b, &self.act, &ctx.sh, c, i12, i13);
            for (o, x) in out.iter_mut().zip(xs) {
                *o = f(k, x, y);
            }
            dst.store_f32s(r0, c, i12, i13, &out[..xs.len()]);
        }
    }

    /// One unit on packed panels: the unit's weight rows are packed once into this thread's
    /// scratch, then meet every activation column, [`PANEL_COLS`] at a time.
    fn run_panel(
        &self,
        p: PanelKernels,
        xs: &[&[u8]; ROW_BLOCK],
        r0: usize,
        nr: usize,
        (i12, i13): (usize, usize),
        ctx: &mut Ctx<'_>,
    ) {
        let (b, dst) = (&self.b, &self.dst);
        let k = self.a.ne[0];
        let bytes = p.format.panel_bytes(k);
        let sh = ctx.sh;
        let panel = &mut bytemuck::cast_slice_mut::<f32, u8>(ctx.local)[..bytes];
        (p.pack_rows)(k, xs, panel);
        let n = b.ne[1];
        let mut out = [0.0f32; PANEL_ROWS * PANEL_COLS];
        let mut c0 = 0;
        while c0 < n {
            let nc = PANEL_COLS.min(n - c0);
            let mut ys: [&[u8]; PANEL_COLS] = [&[]; PANEL_COLS];
            for (j, y) in ys.iter_mut().enumerate().take(nc) {
                *y = act_row(b, &self.act, &sh, c0 + j, i12, i13);
            }
            (p.run)(p.format, k, panel, &ys[..nc], &mut out[..nc * PANEL_ROWS]);
            for (j, o) in out[..nc * PANEL_ROWS].chunks_exact(PANEL_ROWS).enumerate() {
                dst.store_f32s(r0, c0 + j, i12, i13, &o[..nr]);
            }
            c0 += nc;
        }
    }
}

/// Whether `t`'s two-row kernel (where the kernel set has one) sums in another order than its
/// `vec_dot`: the formats ggml runs through `smmla` with i8mm (Q4_0, Q4_1, Q8_0, Q4_K, Q6_K), whose
/// aarch64 kernels follow ggml's order (`quant::aarch64`). Elsewhere the two agree bit for bit.
fn two_row_order_differs(t: GgmlType) -> bool {
    use GgmlType::*;
    matches!(t, Q4_0 | Q4_1 | Q8_0 | Q4_K | Q6_K)
}

/// The dot kernels of a planned matrix product.
struct DotKernels {
    vec_dot: VecDotFn,
    /// One weight row against four activation rows, when the type has it.
    vec_dot_x4: Option<VecDotX4Fn>,
    /// Four weight rows against one activation row, `vec_dot`'s bits, when the type has it.
    vec_dot_rows4: Option<VecDotRows4Fn>,
    /// Register-tiled rows × columns, when the type has it.
    gemm: Option<GemmFn>,
    /// Two weight rows against two activation rows (aarch64 i8mm), when the type has it.
    vec_dot_2x2: Option<VecDot2x2Fn>,
}

/// Fewest activation rows for which the tiled kernel pays (it pads a tile of four).
const GEMM_MIN_COLS: usize = 3;

impl DotKernels {
    /// The one-column dot in the order of ggml's tiled product, when the kernel set has it.
    fn batch(t: GgmlType) -> Option<DotKernels> {
        let k = quant::kernels(t);
        k.vec_dot_batch.map(|f| DotKernels {
            vec_dot: f,
            vec_dot_x4: k.vec_dot_batch_x4,
            vec_dot_rows4: None,
            gemm: None,
            vec_dot_2x2: None,
        })
    }

    fn new(t: GgmlType, vec_dot: VecDotFn) -> DotKernels {
        let k = quant::kernels(t);
        // A float type's tiled kernel follows its GEMM order, which this product does not use.
        let gemm = k.gemm.filter(|_| k.vec_dot_gemm.is_none());
        // The four-row form gives `vec_dot`'s bits only for the type's own `vec_dot`.
        let rows4 = k.vec_dot_rows4.filter(|_| k.vec_dot.map(|f| f as usize) == Some(vec_dot as usize));
        DotKernels {
            vec_dot,
            vec_dot_x4: k.vec_dot_x4,
            vec_dot_rows4: rows4,
            gemm,
            vec_dot_2x2: k.vec_dot_2x2,
        }
    }

    /// `out[j * x.len() + i]` = row `x[i]` · row `y[j]`. Every kernel gives the same bits for a
    /// given pair (tested), so the choice only affects speed.
    fn products(&self, k: usize, xs: &[&[u8]], ys: &[&[u8]], out: &mut [f32]) {
        if let Some(g) = self.gemm.filter(|_| ys.len() >= GEMM_MIN_COLS) {
            g(k, xs, ys, out);
            return;
        }
        let m = xs.len();
        let mut i0 = 0;
        if let Some(k22) = self.vec_dot_2x2.filter(|_| ys.len() >= 2) {
            // Pairs of rows against pairs of columns; a last odd column here, a last odd row below.
            while i0 + 2 <= m {
                let x = [xs[i0], xs[i0 + 1]];
                let mut j = 0;
                while j + 2 <= ys.len() {
                    let [v00, v01, v10, v11] = k22(k, x, [ys[j], ys[j + 1]]);
                    out[j * m + i0] = v00;
                    out[(j + 1) * m + i0] = v01;
                    out[j * m + i0 + 1] = v10;
                    out[(j + 1) * m + i0 + 1] = v11;
                    j += 2;
                }
                if j < ys.len() {
                    // The column twice: every output of the two-row kernel is its own lane.
                    let [v0, _, v1, _] = k22(k, x, [ys[j], ys[j]]);
                    out[j * m + i0] = v0;
                    out[j * m + i0 + 1] = v1;
                }
                i0 += 2;
            }
            if i0 < m {
                // A last odd row, paired with itself.
                let x = xs[i0];
                let mut j = 0;
                while j < ys.len() {
                    let y1 = ys.get(j + 1).unwrap_or(&ys[j]);
                    let [v0, v1, _, _] = k22(k, [x, x], [ys[j], y1]);
                    out[j * m + i0] = v0;
                    if j + 1 < ys.len() {
                        out[(j + 1) * m + i0] = v1;
                    }
                    j += 2;
                }
                return;
            }
        }
        if let Some(r4) = self.vec_dot_rows4.filter(|_| self.vec_dot_x4.is_none() || ys.len() < 4) {
            // Four rows against each column, the column's vectors loaded once.
            while i0 + 4 <= m {
                for ahead in
                    xs.iter().skip(i0 + PREFETCH_ROWS).take(4).filter(|r| r.len() <= PREFETCH_MAX_ROW)
                {
                    for off in (0..ahead.len()).step_by(64) {
                        super::prefetch::prefetch(ahead[off..].as_ptr());
                    }
                }
                let x = [xs[i0], xs[i0 + 1], xs[i0 + 2], xs[i0 + 3]];
                for (j, y) in ys.iter().enumerate() {
                    out[j * m + i0..j * m + i0 + 4].copy_from_slice(&r4(k, x, y));
                }
                i0 += 4;
            }
        }
        for (i, x) in xs.iter().enumerate().skip(i0) {
            if let Some(ahead) = xs.get(i + PREFETCH_ROWS).filter(|r| r.len() <= PREFETCH_MAX_ROW) {
                for off in (0..ahead.len()).step_by(64) {
                    super::prefetch::prefetch(ahead[off..].as_ptr());
                }
            }
            let mut j = 0;
            if let Some(x4) = self.vec_dot_x4 {
                while j + 4 <= ys.len() {
                    let v = x4(k, x, [ys[j], ys[j + 1], ys[j + 2], ys[j + 3]]);
                    for (t, v) in v.into_iter().enumerate() {
                        out[(j + t) * m + i] = v;
                    }
                    j += 4;
                }
            }
            while j < ys.len() {
                out[j * m + i] = (self.vec_dot)(k, x, ys[j]);
                j += 1;
            }
        }
    }
}

/// How many rows ahead [`DotKernels::products`] prefetches short rows (the KV cache's K rows and
/// transposed V rows in attention, which the step's weights have streamed out of the caches).
const PREFETCH_ROWS: usize = 8;
/// Rows longer than this are left to the hardware prefetcher (weights stream sequentially).
const PREFETCH_MAX_ROW: usize = 1024;

/// A planned MUL_MAT_ID.
pub(crate) struct MulMatId {
    a: Tv,
    b: Tv,
    ids: Tv,
    dst: Tv,
    k: DotKernels,
    /// The dot in ggml's tiled-product order, for experts with 8+ routed rows (see
    /// `TypeKernels::vec_dot_batch`).
    k_batch: Option<DotKernels>,
    act: Activations,
    /// Offset of the expert lists in shared scratch.
    lists_off: usize,
}

/// Validates MUL_MAT_ID.
///
/// # Safety
/// As `ops::prepare`.
pub(crate) unsafe fn prepare_mul_mat_id(n: &Node) -> Result<Plan> {
    let op = n.op;
    // SAFETY: forwarded contract.
    let (a, b, ids, dst) = unsafe { (tv(src(n, 0)?)?, tv(src(n, 1)?)?, tv(src(n, 2)?)?, tv(&n.dst)?) };
    if !a.packed {
        return Err(shape_err(op, "src0 rows must be packed"));
    }
    if ids.dtype() != GgmlType::I32 {
        return Err(types_err(op, format!("ids must be I32, got {}", ids.dtype())));
    }
    if dst.dtype() != GgmlType::F32 || !dst.packed {
        return Err(types_err(op, "dst must be packed F32"));
    }
    let (n_used, n_tok) = (ids.ne[0], ids.ne[1]);
    if a.ne[3] != 1
        || ids.ne[2] != 1
        || ids.ne[3] != 1
        || b.ne[3] != 1
        || a.ne[0] != b.ne[0]
        || b.ne[2] != n_tok
    {
        return Err(shape_err(op, format!("src0 {:?} src1 {:?} ids {:?}", a.ne, b.ne, ids.ne)));
    }
    if dst.ne != [a.ne[1], n_used, n_tok, 1] {
        return Err(shape_err(op, format!("dst {:?} for src0 {:?} ids {:?}", dst.ne, a.ne, ids.ne)));
    }
    if dst.is_empty() {
        return Ok(super::simple(Kind::Nop, 0));
    }
    if a.is_empty() || b.ne[1] == 0 || (b.ne[1] != 1 && b.ne[1] != n_used) {
        return Err(shape_err(op, format!("src1 ne1 {} must be 1 or n_used {n_used}", b.ne[1])));
    }
    for s in [&a, &b, &ids] {
        check_overlap(op, &dst, s, Alias::Never)?;
    }
    let (vec_dot, act) = plan_activations(op, &a, &b)?;
    let conv = if act.convert {
        b.nrows().checked_mul(act.row).ok_or_else(|| shape_err(op, "scratch overflows"))?
    } else {
        0
    };
    let lists_off = conv.next_multiple_of(8);
    let n_exp = a.ne[2];
    // Expert lists: n_exp + 1 offsets, then n_used * n_tok pair indices (u32 each).
    let lists = (n_exp + 1 + n_used * n_tok) * 4;
    let shared_bytes = lists_off + lists;
    let local = a.ne[0].max(2 * (n_exp + 1));
    let conv_units = if act.convert { b.nrows().clamp(1, super::MAX_UNITS) } else { 0 };
    let units = [conv_units + 1, n_exp * a.ne[1].div_ceil(ROW_BLOCK)];
    Ok(Plan {
        phases: 2,
        units,
        shared_bytes,
        local_f32: local,
        kind: Kind::MulMatId(MulMatId {
            a,
            b,
            ids,
            dst,
            k: {
                // ggml's mul_mat_id runs one-row dots only.
                let mut k = DotKernels::new(a.dtype(), vec_dot);
                if two_row_order_differs(a.dtype()) {
                    k.vec_dot_2x2 = None;
                }
                k
            },
            k_batch: DotKernels::batch(a.dtype()),
            act,
            lists_off,
        }),
    })
}

impl MulMatId {
    pub(crate) fn run(&self, op: GgmlOp, phase: u8, ctx: &mut Ctx<'_>) {
        let (a, b, ids, dst) = (&self.a, &self.b, &self.ids, &self.dst);
        let n_exp = a.ne[2];
        let (n_used, n_tok) = (ids.ne[0], ids.ne[1]);
        let pairs = n_used * n_tok;
        if phase == 0 {
            // Units 0..units-1 convert activation rows; the last one sorts the pairs by expert.
            if ctx.unit + 1 == ctx.units {
                self.build_lists(op, ctx);
            } else {
                let rows = access::split(b.nrows(), ctx.unit, ctx.units - 1);
                convert_rows(b, &self.act, None, rows, ctx);
            }
            return;
        }
        let offs = ctx.shared(self.lists_off, (n_exp + 1) * 4);
        let m = a.ne[1];
        let k = a.ne[0];
        let row_blocks = m.div_ceil(ROW_BLOCK);
        {
            let u = ctx.unit;
            let e = u / row_blocks;
            let (p0, p1) = (u32_at(offs, e) as usize, u32_at(offs, e + 1) as usize);
            if p0 >= p1 || p1 > pairs {
                return;
            }
            let list = ctx.shared(self.lists_off + (n_exp + 1 + p0) * 4, (p1 - p0) * 4);
            let r0 = (u % row_blocks) * ROW_BLOCK;
            let nr = ROW_BLOCK.min(m - r0);
            let xs: [&[u8]; ROW_BLOCK] = std::array::from_fn(|i| a.row_bytes(r0 + i.min(nr - 1), e, 0));
            // ggml's tiled product takes an expert with 8+ routed rows.
            let kern = match &self.k_batch {
                Some(bk) if p1 - p0 >= quant::TILED_MIN_ROWS => bk,
                _ => &self.k,
            };
            let mut out = [0.0f32; ROW_BLOCK * COL_BLOCK];
            // Pairs in chunks fixed by the list order (not by the threads).
            for chunk in list.chunks(COL_BLOCK * 4) {
                let nc = chunk.len() / 4;
                let pair = |i: usize| {
                    let p = u32_at(chunk, i) as usize;
                    (p % n_used, p / n_used)
                };
                let ys: [&[u8]; COL_BLOCK] = std::array::from_fn(|j| {
                    let (slot, t) = pair(j.min(nc - 1));
                    act_row(b, &self.act, &ctx.sh, slot % b.ne[1], t, 0)
                });
                kern.products(k, &xs[..nr], &ys[..nc], &mut out[..nr * nc]);
                for (j, col) in out[..nr * nc].chunks_exact(nr).enumerate() {
                    let (slot, t) = pair(j);
                    dst.store_f32s(r0, slot, t, 0, col);
                }
            }
        }
    }

    /// Counting sort of the (slot, token) pairs by expert; ids out of range are reported and
    /// left out (their output rows are not written).
    fn build_lists(&self, op: GgmlOp, ctx: &mut Ctx<'_>) {
        let ids = &self.ids;
        let n_exp = self.a.ne[2];
        let (n_used, n_tok) = (ids.ne[0], ids.ne[1]);
        // Counts and fill cursors live in this thread's scratch (no allocation per run).
        let words: &mut [u32] = bytemuck::cast_slice_mut(&mut ctx.local[..2 * (n_exp + 1)]);
        let (counts, fill) = words.split_at_mut(n_exp + 1);
        counts.fill(0);
        let mut bad = 0usize;
        for t in 0..n_tok {
            for s in 0..n_used {
                let id = ids.get_index(s, t, 0, 0);
                if id >= 0 && (id as usize) < n_exp {
                    counts[id as usize + 1] += 1;
                } else {
                    bad += 1;
                }
            }
        }
        for e in 0..n_exp {
            counts[e + 1] += counts[e];
        }
        let sh = ctx.sh;
        let offs = sh.bytes_mut(self.lists_off, (n_exp + 1) * 4);
        for (o, c) in offs.chunks_exact_mut(4).zip(counts.iter()) {
            o.copy_from_slice(&c.to_le_bytes());
        }
        let list = sh.bytes_mut(self.lists_off + (n_exp + 1) * 4, n_used * n_tok * 4);
        fill.copy_from_slice(counts);
        for t in 0..n_tok {
            for s in 0..n_used {
                let id = ids.get_index(s, t, 0, 0);
                if id >= 0 && (id as usize) < n_exp {
                    let at = fill[id as usize] as usize;
                    fill[id as usize] += 1;
                    list[at * 4..at * 4 + 4].copy_from_slice(&((t * n_used + s) as u32).to_le_bytes());
                }
            }
        }
        if bad > 0 {
            ctx.errors.report(Error::IndexOutOfRange {
                op,
                detail: format!("{bad} expert ids outside 0..{n_exp}"),
            });
        }
    }
}

fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]])
}
