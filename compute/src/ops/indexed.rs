//! Ops whose every destination element is a small function of its index: generators (ARANGE,
//! TIMESTEP_EMBEDDING), element moves (ROLL, PAD_REFLECT_1D, DIAG, TRI, ACC, SET, UPSCALE, WIN_PART,
//! WIN_UNPART, GET_REL_POS) and the vision/audio-encoder ops built from windows (IM2COL, POOL_1D,
//! POOL_2D, CONV_2D_DW, CONV_2D, CONV_TRANSPOSE_1D, CONV_TRANSPOSE_2D, OUT_PROD).
//!
//! `prepare` validates shapes and parameters so that every source index a formula computes is in
//! shape (and the bounds-checked accessors of `Tv` check again); `run` walks the destination rows
//! of this unit and writes each element. These ops are rare in inference graphs (audio and vision
//! encoders, state-space models' helpers), so the scalar form is the kernel; the arithmetic follows
//! ggml's CPU backend operation for operation (same float expressions, same loop order for sums), so
//! results are bit-identical where ggml's own is scalar.
//!
//! Formulas (`d` = destination index `[i0, i1, i2, i3]`, `a` = src0, `b` = src1):
//! - ARANGE: `start + step·i0` (op_params f32 start, stop, step).
//! - TIMESTEP_EMBEDDING: row `i1` for timestep `a[i1]`, `half = dim/2`: `cos(a·f_j)` at `j`,
//!   `sin(a·f_j)` at `j + half`, `f_j = exp(−ln(max_period)·j/half)`, 0 in the odd last column.
//! - ROLL: `a[(d_k − shift_k) mod ne_k]` per dim, `|shift_k| < ne_k`.
//! - PAD_REFLECT_1D: `a` with `p0` columns mirrored on the left and `p1` on the right (the edge
//!   column itself is not repeated).
//! - DIAG: `a[i0, 0, i2, i3]` where `i0 = i1`, else 0.
//! - TRI: `a` where the (column, row) test of the type holds, else 0.
//! - ACC / SET: `a`, except inside the window `b` describes (byte offset and strides nb1..3 in
//!   op_params) where it is `a + b` (ACC) or `b` (SET).
//! - UPSCALE: nearest (`a[⌊d/sf⌋]`) or bilinear (half-pixel centres, or aligned corners) per dims 0–1,
//!   nearest for dims 2–3, `sf = ne_dst/ne_src`; bilinear within an ulp of ggml's (not bit for bit).
//! - IM2COL: the column matrix of a 1-D or 2-D convolution, zero outside the input.
//! - POOL_1D / POOL_2D: max or average of each window (average over the whole window size, padding
//!   counting as absent).
//! - CONV_2D_DW: depthwise 2-D convolution (one kernel per channel), zero padding.
//! - CONV_2D, CONV_TRANSPOSE_1D, CONV_TRANSPOSE_2D: direct sums over the kernel window and input
//!   channels; with an F16 kernel the input is rounded to f16 first, as ggml's CPU backend does.
//! - OUT_PROD: `Σ_k a[i0, k] · b[i1, k]` (float operands).
//! - WIN_PART / WIN_UNPART: the windowed attention layout of SAM-style encoders (`w × w` windows,
//!   zero padding at the right and bottom edges) and back; GET_REL_POS: relative position rows.

// Per-dimension loops index several arrays at once.
#![allow(clippy::needless_range_loop)]

use crate::dtype::GgmlType;
use crate::error::{Error, Result};
use crate::graph::Node;
use crate::op::GgmlOp;

use super::access::{is_float, Tv};
use super::{check_overlap, param_f32, shape_err, tv, types_err, Alias, Ctx, Kind, Plan};

/// Which element (column `i0`, row `i1`) TRI keeps (`ggml_tri_type`).
#[derive(Clone, Copy, Debug)]
enum TriKeep {
    /// `i0 >= i1`.
    UpperDiag,
    /// `i0 > i1`.
    Upper,
    /// `i0 <= i1`.
    LowerDiag,
    /// `i0 < i1`.
    Lower,
}

/// The per-element formula of one op.
#[derive(Clone, Copy, Debug)]
enum Formula {
    Arange {
        start: f32,
        step: f32,
    },
    Timestep {
        half: usize,
        log_period: f32,
    },
    Roll {
        shift: [usize; 4],
    },
    PadReflect {
        p0: usize,
    },
    Diag,
    Tri(TriKeep),
    Window {
        offset: usize,
        nb: [usize; 3],
        set: bool,
    },
    UpNearest {
        sf: [f32; 4],
    },
    UpBilinear {
        sf: [f32; 4],
        offset: f32,
    },
    Im2col {
        s: [i64; 2],
        p: [i64; 2],
        d: [i64; 2],
        k: [usize; 2],
        two_d: bool,
    },
    Pool {
        max: bool,
        k: [usize; 2],
        s: [usize; 2],
        p: [i64; 2],
    },
    ConvDw {
        s: [i64; 2],
        p: [i64; 2],
        d: [i64; 2],
    },
    /// CONV_2D: kernel `a` `{KW, KH, IC, OC}`, input `b` `{W, H, IC, N}`; `f16`: the input rounded
    /// to f16 as ggml's F16-kernel path does.
    Conv2d {
        s: [i64; 2],
        p: [i64; 2],
        d: [i64; 2],
        f16: bool,
    },
    /// CONV_TRANSPOSE_1D: kernel `a` `{K, OC, IC}`, input `b` `{L, IC}`.
    ConvT1d {
        s: usize,
        f16: bool,
    },
    /// CONV_TRANSPOSE_2D: kernel `a` `{KW, KH, OC, IC}`, input `b` `{W, H, IC, N}`.
    ConvT2d {
        s: usize,
        f16: bool,
    },
    /// OUT_PROD: `Σ_k a[i0, k] · b[i1, k]`, broadcast over dims 2–3.
    OutProd,
    /// WIN_PART: windows of `w × w` positions, `npx` across.
    WinPart {
        npx: usize,
        w: usize,
    },
    /// WIN_UNPART: the inverse, `npx` windows across.
    WinUnpart {
        npx: usize,
        w: usize,
    },
    /// GET_REL_POS: row `(ne1 − i1 − 1) + i2` of the table.
    RelPos,
    /// UPSCALE bicubic (α = −0.75, clamped taps) in dims 0–1, nearest in dims 2–3.
    UpBicubic {
        sf: [f32; 4],
        offset: f32,
    },
    /// UPSCALE bilinear with antialiasing: a triangle filter as wide as the down-scaling.
    UpAntialias {
        sf: [f32; 4],
        offset: f32,
    },
    /// IM2COL_3D: kernel `a` `{KW, KH, KD, OC·IC}`, image `b` `{W, H, D, N·IC}` -> `{IC·KD·KH·KW, OW,
    /// OH, N·OD}`.
    Im2col3d {
        s: [i64; 3],
        p: [i64; 3],
        d: [i64; 3],
        k: [usize; 3],
        ic: usize,
        od: usize,
    },
    /// CONV_3D: kernel `a` `{KW, KH, KD, IC·OC}`, input `b` `{W, H, D, IC·N}` -> `{OW, OH, OD, OC·N}`.
    Conv3d {
        s: [i64; 3],
        p: [i64; 3],
        d: [i64; 3],
        ic: usize,
        oc: usize,
        f16: bool,
    },
    /// IM2COL_BACK: the gradient of an image from the gradient `a` of its IM2COL columns.
    Im2colBack {
        s: [i64; 2],
        p: [i64; 2],
        d: [i64; 2],
        k: [usize; 2],
        out: [usize; 2],
        two_d: bool,
    },
    /// COL2IM_1D: columns `a` `{K·OC, T_in}` summed back into a signal `{T_out, OC}`.
    Col2im1d {
        s: usize,
        k: usize,
        p: usize,
    },
    /// POOL_2D_BACK: the gradient `a` of a pooling's output spread over its input `b`'s positions.
    Pool2dBack {
        max: bool,
        k: [usize; 2],
        s: [usize; 2],
        p: [i64; 2],
    },
    /// ADD_REL_POS: `a` plus `ph` (src2) by row and `pw` (src1) by column of each `W × W` block.
    AddRelPos,
}

/// A planned index-formula op.
pub(crate) struct Indexed {
    dst: Tv,
    a: Option<Tv>,
    b: Option<Tv>,
    /// src2 (ADD_REL_POS's `ph`).
    c: Option<Tv>,
    f: Formula,
}

fn i(n: &Node, k: usize) -> i32 {
    n.op_params[k]
}

/// Validates one of the ops of this module.
///
/// # Safety
/// As `ops::prepare`.
pub(crate) unsafe fn prepare(n: &Node) -> Result<Plan> {
    let op = n.op;
    // SAFETY: forwarded contract.
    let dst = unsafe { tv(&n.dst)? };
    let a = match n.src[0].as_ref() {
        // SAFETY: forwarded contract.
        Some(t) => Some(unsafe { tv(t)? }),
        None => None,
    };
    let b = match n.src[1].as_ref() {
        // SAFETY: forwarded contract.
        Some(t) => Some(unsafe { tv(t)? }),
        None => None,
    };
    let c = match n.src[2].as_ref() {
        // SAFETY: forwarded contract.
        Some(t) => Some(unsafe { tv(t)? }),
        None => None,
    };
    let need = |t: &Option<Tv>, k: usize| -> Result<Tv> {
        t.ok_or_else(|| shape_err(op, format!("missing src[{k}]")))
    };
    let f = match op {
        GgmlOp::Arange => {
            if dst.dtype() != GgmlType::F32 || dst.nrows() != 1 {
                return Err(shape_err(op, format!("dst {} {:?} (a 1-D F32 tensor)", dst.dtype(), dst.ne)));
            }
            let (start, stop, step) = (param_f32(n, 0), param_f32(n, 1), param_f32(n, 2));
            let steps = ((stop - start) / step).ceil();
            if !steps.is_finite() || steps != dst.ne[0] as f32 {
                return Err(shape_err(
                    op,
                    format!("{} elements for arange({start}, {stop}, {step})", dst.ne[0]),
                ));
            }
            Formula::Arange { start, step }
        }
        GgmlOp::TimestepEmbedding => {
            let a = need(&a, 0)?;
            let (dim, max_period) = (i(n, 0), i(n, 1));
            if a.dtype() != GgmlType::F32 || dst.dtype() != GgmlType::F32 || dim <= 0 || max_period <= 0 {
                return Err(shape_err(
                    op,
                    format!("timesteps {}, dim {dim}, max_period {max_period}", a.dtype()),
                ));
            }
            // ggml makes rows of `dim` (older releases: `dim` rounded up to even); the column past
            // the last (cos, sin) pair of an odd `dim` is 0.
            let (dim_u, even_up) = (dim as usize, dim as usize + dim as usize % 2);
            if a.nrows() != 1 || !(dst.ne == [dim_u, a.ne[0], 1, 1] || dst.ne == [even_up, a.ne[0], 1, 1]) {
                return Err(shape_err(op, format!("{:?} timesteps, dim {dim} -> dst {:?}", a.ne, dst.ne)));
            }
            Formula::Timestep { half: dim as usize / 2, log_period: (max_period as f32).ln() }
        }
        GgmlOp::Roll => {
            let a = need(&a, 0)?;
            same_shape(op, &a, &dst)?;
            // ggml takes shifts of less than a whole turn (its CPU kernel reads outside the row
            // otherwise): refused here.
            let mut shift = [0usize; 4];
            for k in 0..4 {
                let s = i64::from(i(n, k));
                if s.unsigned_abs() as usize >= a.ne[k].max(1) {
                    return Err(shape_err(op, format!("shift {s} of dim {k} with {} elements", a.ne[k])));
                }
                shift[k] = if a.ne[k] == 0 { 0 } else { s.rem_euclid(a.ne[k] as i64) as usize };
            }
            Formula::Roll { shift }
        }
        GgmlOp::PadReflect1d => {
            let a = need(&a, 0)?;
            let (p0, p1) = (i(n, 0), i(n, 1));
            if p0 < 0
                || p1 < 0
                || p0 as usize >= a.ne[0]
                || p1 as usize >= a.ne[0]
                || dst.ne != [a.ne[0] + p0 as usize + p1 as usize, a.ne[1], a.ne[2], a.ne[3]]
            {
                return Err(shape_err(op, format!("reflect {p0}/{p1} of {:?} to {:?}", a.ne, dst.ne)));
            }
            floats(op, &[&a, &dst])?;
            Formula::PadReflect { p0: p0 as usize }
        }
        GgmlOp::Diag => {
            let a = need(&a, 0)?;
            if a.ne[1] != 1 || dst.ne != [a.ne[0], a.ne[0], a.ne[2], a.ne[3]] {
                return Err(shape_err(op, format!("diag of {:?} -> {:?}", a.ne, dst.ne)));
            }
            floats(op, &[&a, &dst])?;
            Formula::Diag
        }
        GgmlOp::Tri => {
            let a = need(&a, 0)?;
            same_shape(op, &a, &dst)?;
            floats(op, &[&a, &dst])?;
            let keep = match i(n, 0) {
                0 => TriKeep::UpperDiag,
                1 => TriKeep::Upper,
                2 => TriKeep::LowerDiag,
                3 => TriKeep::Lower,
                t => return Err(shape_err(op, format!("tri type {t}"))),
            };
            Formula::Tri(keep)
        }
        GgmlOp::Acc | GgmlOp::Set => {
            let (a, b) = (need(&a, 0)?, need(&b, 1)?);
            same_shape(op, &a, &dst)?;
            if [a.dtype(), b.dtype(), dst.dtype()].iter().any(|&t| t != GgmlType::F32) || !dst.packed {
                return Err(types_err(op, "ACC and SET take F32 tensors with a packed destination"));
            }
            if dst.nb != contiguous_nb(&dst) {
                return Err(shape_err(op, "the destination must be contiguous"));
            }
            let nb = [i(n, 0), i(n, 1), i(n, 2)];
            let offset = i(n, 3);
            if nb.iter().any(|&x| x < 0) || offset < 0 || offset % 4 != 0 || nb.iter().any(|&x| x % 4 != 0) {
                return Err(shape_err(op, format!("window strides {nb:?} offset {offset}")));
            }
            let nb = nb.map(|x| x as usize);
            // The window's strides must nest (each dim steps over the whole of the smaller ones),
            // so that every destination element is in the window at most once, and the window must
            // end inside the destination.
            let nested = (4 * b.ne[0] <= nb[0] || b.ne[1] <= 1)
                && (b.ne[1] * nb[0] <= nb[1] || b.ne[2] <= 1)
                && (b.ne[2] * nb[1] <= nb[2] || b.ne[3] <= 1);
            let last = if b.is_empty() {
                0
            } else {
                offset as usize
                    + 4 * (b.ne[0] - 1)
                    + nb[0] * (b.ne[1] - 1)
                    + nb[1] * (b.ne[2] - 1)
                    + nb[2] * (b.ne[3] - 1)
                    + 4
            };
            if !nested || last > 4 * dst.nelements() {
                return Err(shape_err(
                    op,
                    format!("window {:?} at {offset} strides {nb:?} in {:?}", b.ne, dst.ne),
                ));
            }
            check_overlap(op, &dst, &b, Alias::Never)?;
            Formula::Window { offset: offset as usize, nb, set: op == GgmlOp::Set }
        }
        GgmlOp::Upscale => {
            let a = need(&a, 0)?;
            floats(op, &[&a, &dst])?;
            if (0..4).any(|k| a.ne[k] == 0 && dst.ne[k] != 0) {
                return Err(shape_err(op, format!("upscale {:?} -> {:?}", a.ne, dst.ne)));
            }
            let mode = i(n, 0);
            let mut sf: [f32; 4] = std::array::from_fn(|k| dst.ne[k] as f32 / a.ne[k].max(1) as f32);
            // Aligned corners (whatever the mode, as ggml): sample centres at whole pixels and the
            // scale of dims 0–1 from the outer pixels' distance.
            let mut offset = 0.5;
            if mode & 0x100 != 0 {
                offset = 0.0;
                for k in 0..2 {
                    if dst.ne[k] > 1 && a.ne[k] > 1 {
                        sf[k] = (dst.ne[k] - 1) as f32 / (a.ne[k] - 1) as f32;
                    }
                }
            }
            match mode & 0xFF {
                0 => Formula::UpNearest { sf },
                1 if mode & 0x200 != 0 => Formula::UpAntialias { sf, offset },
                1 => Formula::UpBilinear { sf, offset },
                2 => Formula::UpBicubic { sf, offset },
                m => return Err(Error::UnsupportedOp { op, detail: format!("upscale mode {m}") }),
            }
        }
        GgmlOp::Im2col => {
            let (k, x) = (need(&a, 0)?, need(&b, 1)?);
            let two_d = i(n, 6) != 0;
            let s = [i64::from(i(n, 0)), i64::from(i(n, 1))];
            let p = [i64::from(i(n, 2)), i64::from(i(n, 3))];
            let d = [i64::from(i(n, 4)), i64::from(i(n, 5))];
            let (kw, kh) = (k.ne[0], if two_d { k.ne[1] } else { 1 });
            let ic = if two_d { x.ne[2] } else { x.ne[1] };
            let batch = if two_d { x.ne[3] } else { x.ne[2] };
            let (ow, oh) = (dst.ne[1], if two_d { dst.ne[2] } else { 1 });
            let want = if two_d { [ic * kh * kw, ow, oh, batch] } else { [ic * kw, ow, batch, 1] };
            if s[0] <= 0
                || (two_d && s[1] <= 0)
                || d[0] <= 0
                || (two_d && d[1] <= 0)
                || p.iter().any(|&v| v < 0)
            {
                return Err(shape_err(op, format!("stride {s:?} padding {p:?} dilation {d:?}")));
            }
            let out = |q: usize, kq: usize| {
                (x.ne[q] as i64 + 2 * p[q] - d[q] * (kq as i64 - 1) - 1).div_euclid(s[q].max(1)) + 1
            };
            let sizes_ok = out(0, kw) == ow as i64 && (!two_d || out(1, kh) == oh as i64);
            if dst.ne != want || !sizes_ok || !is_float(x.dtype()) || !is_float(dst.dtype()) {
                return Err(shape_err(
                    op,
                    format!("im2col of {:?} with kernel {:?} -> {:?}", x.ne, k.ne, dst.ne),
                ));
            }
            Formula::Im2col { s, p, d, k: [kw, kh], two_d }
        }
        GgmlOp::Pool1d | GgmlOp::Pool2d => {
            let a = need(&a, 0)?;
            floats(op, &[&a, &dst])?;
            let max = match i(n, 0) {
                0 => true,
                1 => false,
                o => return Err(shape_err(op, format!("pool op {o}"))),
            };
            let (k, s, p) = if op == GgmlOp::Pool1d {
                ([i(n, 1), 1], [i(n, 2), 1], [i(n, 3), 0])
            } else {
                ([i(n, 1), i(n, 2)], [i(n, 3), i(n, 4)], [i(n, 5), i(n, 6)])
            };
            if k.iter().chain(&s).any(|&v| v <= 0) || p.iter().any(|&v| v < 0) {
                return Err(shape_err(op, format!("pool kernel {k:?} stride {s:?} padding {p:?}")));
            }
            let dims = if op == GgmlOp::Pool1d { 1 } else { 2 };
            for q in 0..dims {
                let out = (a.ne[q] as i64 + 2 * p[q] as i64 - k[q] as i64) / s[q] as i64 + 1;
                if out < 0 || dst.ne[q] as i64 != out {
                    return Err(shape_err(op, format!("pool of {:?} -> {:?}", a.ne, dst.ne)));
                }
            }
            if (dims..4).any(|q| dst.ne[q] != a.ne[q]) {
                return Err(shape_err(op, format!("pool of {:?} -> {:?}", a.ne, dst.ne)));
            }
            Formula::Pool { max, k: k.map(|v| v as usize), s: s.map(|v| v as usize), p: p.map(i64::from) }
        }
        GgmlOp::Conv2dDw => {
            let (k, x) = (need(&a, 0)?, need(&b, 1)?);
            floats(op, &[&k, &x, &dst])?;
            let (s, p, d) = conv_params(n)?;
            let out = |q: usize| (x.ne[q] as i64 + 2 * p[q] - d[q] * (k.ne[q] as i64 - 1) - 1) / s[q] + 1;
            if k.ne[2] != 1
                || k.ne[3] != x.ne[2]
                || dst.ne != [out(0).max(0) as usize, out(1).max(0) as usize, x.ne[2], x.ne[3]]
            {
                return Err(shape_err(
                    op,
                    format!("depthwise kernel {:?} on {:?} -> {:?}", k.ne, x.ne, dst.ne),
                ));
            }
            Formula::ConvDw { s, p, d }
        }
        GgmlOp::Conv2d => {
            let (k, x) = (need(&a, 0)?, need(&b, 1)?);
            floats(op, &[&k, &x, &dst])?;
            let (s, p, d) = conv_params(n)?;
            let out =
                |q: usize| (x.ne[q] as i64 + 2 * p[q] - d[q] * (k.ne[q] as i64 - 1) - 1).div_euclid(s[q]) + 1;
            if k.ne[2] != x.ne[2]
                || out(0) < 0
                || out(1) < 0
                || dst.ne != [out(0) as usize, out(1) as usize, k.ne[3], x.ne[3]]
            {
                return Err(shape_err(op, format!("kernel {:?} on {:?} -> {:?}", k.ne, x.ne, dst.ne)));
            }
            Formula::Conv2d { s, p, d, f16: k.dtype() == GgmlType::F16 }
        }
        GgmlOp::ConvTranspose1d => {
            let (k, x) = (need(&a, 0)?, need(&b, 1)?);
            floats(op, &[&k, &x, &dst])?;
            let (s0, p0, d0) = (i(n, 0), i(n, 1), i(n, 2));
            if s0 <= 0 || p0 != 0 || d0 != 1 {
                return Err(shape_err(
                    op,
                    format!("stride {s0} padding {p0} dilation {d0} (ggml: padding 0, dilation 1)"),
                ));
            }
            let len = if x.ne[0] == 0 { 0 } else { (x.ne[0] - 1) * s0 as usize + k.ne[0] };
            if k.ne[2] != x.ne[1]
                || k.ne[3] != 1
                || x.ne[2] != 1
                || x.ne[3] != 1
                || dst.ne != [len, k.ne[1], 1, 1]
            {
                return Err(shape_err(op, format!("kernel {:?} on {:?} -> {:?}", k.ne, x.ne, dst.ne)));
            }
            Formula::ConvT1d { s: s0 as usize, f16: k.dtype() == GgmlType::F16 }
        }
        GgmlOp::ConvTranspose2d => {
            let (k, x) = (need(&a, 0)?, need(&b, 1)?);
            floats(op, &[&k, &x, &dst])?;
            let s0 = i(n, 0);
            if s0 <= 0 {
                return Err(shape_err(op, format!("stride {s0}")));
            }
            let len = |q: usize| if x.ne[q] == 0 { 0 } else { (x.ne[q] - 1) * s0 as usize + k.ne[q] };
            if k.ne[3] != x.ne[2] || dst.ne != [len(0), len(1), k.ne[2], x.ne[3]] {
                return Err(shape_err(op, format!("kernel {:?} on {:?} -> {:?}", k.ne, x.ne, dst.ne)));
            }
            Formula::ConvT2d { s: s0 as usize, f16: k.dtype() == GgmlType::F16 }
        }
        GgmlOp::OutProd => {
            let (a, b) = (need(&a, 0)?, need(&b, 1)?);
            floats(op, &[&a, &b, &dst])?;
            let bcast = (2..4).all(|q| a.ne[q] > 0 && b.ne[q] % a.ne[q] == 0 && dst.ne[q] == b.ne[q]);
            if a.ne[1] != b.ne[1] || dst.ne[0] != a.ne[0] || dst.ne[1] != b.ne[0] || !bcast {
                return Err(shape_err(op, format!("out_prod of {:?} and {:?} -> {:?}", a.ne, b.ne, dst.ne)));
            }
            Formula::OutProd
        }
        GgmlOp::WinPart => {
            let a = need(&a, 0)?;
            floats(op, &[&a, &dst])?;
            let (npx, npy, w) = (i(n, 0), i(n, 1), i(n, 2));
            if w <= 0 || npx <= 0 || npy <= 0 || a.ne[3] != 1 {
                return Err(shape_err(op, format!("window {w}, {npx} × {npy} windows of {:?}", a.ne)));
            }
            let (npx, npy, w) = (npx as usize, npy as usize, w as usize);
            if a.ne[1].div_ceil(w) != npx
                || a.ne[2].div_ceil(w) != npy
                || dst.ne != [a.ne[0], w, w, npx * npy]
            {
                return Err(shape_err(op, format!("windows of {w} over {:?} -> {:?}", a.ne, dst.ne)));
            }
            Formula::WinPart { npx, w }
        }
        GgmlOp::WinUnpart => {
            let a = need(&a, 0)?;
            floats(op, &[&a, &dst])?;
            let w = i(n, 0);
            if w <= 0 || dst.ne[3] != 1 {
                return Err(shape_err(op, format!("window {w} -> {:?}", dst.ne)));
            }
            let w = w as usize;
            let npx = dst.ne[1].div_ceil(w);
            let np = npx * dst.ne[2].div_ceil(w);
            if a.ne != [dst.ne[0], w, w, np] {
                return Err(shape_err(op, format!("windows {:?} -> {:?} with w {w}", a.ne, dst.ne)));
            }
            Formula::WinUnpart { npx, w }
        }
        GgmlOp::GetRelPos => {
            let a = need(&a, 0)?;
            floats(op, &[&a, &dst])?;
            if dst.ne[0] != a.ne[0]
                || dst.ne[3] != 1
                || a.ne[2] != 1
                || a.ne[3] != 1
                || (dst.ne[1] + dst.ne[2]).saturating_sub(1) > a.ne[1]
            {
                return Err(shape_err(op, format!("relative positions {:?} -> {:?}", a.ne, dst.ne)));
            }
            Formula::RelPos
        }
        GgmlOp::Im2col3d => {
            let (k, x) = (need(&a, 0)?, need(&b, 1)?);
            let s = [0, 1, 2].map(|q| i64::from(i(n, q)));
            let p = [3, 4, 5].map(|q| i64::from(i(n, q)));
            let d = [6, 7, 8].map(|q| i64::from(i(n, q)));
            let ic = i(n, 9);
            if s.iter().chain(&d).any(|&v| v <= 0) || p.iter().any(|&v| v < 0) || ic <= 0 {
                return Err(shape_err(
                    op,
                    format!("stride {s:?} padding {p:?} dilation {d:?} channels {ic}"),
                ));
            }
            let ic = ic as usize;
            let kk = [k.ne[0], k.ne[1], k.ne[2]];
            let out: [i64; 3] = std::array::from_fn(|q| {
                (x.ne[q] as i64 + 2 * p[q] - d[q] * (kk[q] as i64 - 1) - 1).div_euclid(s[q]) + 1
            });
            let n_b = x.ne[3] / ic;
            let od = out[2].max(0) as usize;
            let ok = x.ne[3] % ic == 0
                && k.ne[3] % ic == 0
                && out.iter().all(|&o| o >= 0)
                && dst.ne == [ic * kk[0] * kk[1] * kk[2], out[0] as usize, out[1] as usize, n_b * od];
            if !ok || x.dtype() != GgmlType::F32 || !matches!(dst.dtype(), GgmlType::F32 | GgmlType::F16) {
                return Err(shape_err(
                    op,
                    format!(
                        "im2col_3d of {} {:?}, kernel {:?}, {ic} channels -> {} {:?}",
                        x.dtype(),
                        x.ne,
                        k.ne,
                        dst.dtype(),
                        dst.ne
                    ),
                ));
            }
            Formula::Im2col3d { s, p, d, k: kk, ic, od }
        }
        GgmlOp::Conv3d => {
            let (k, x) = (need(&a, 0)?, need(&b, 1)?);
            let s = [0, 1, 2].map(|q| i64::from(i(n, q)));
            let p = [3, 4, 5].map(|q| i64::from(i(n, q)));
            let d = [6, 7, 8].map(|q| i64::from(i(n, q)));
            let (ic, nb, oc) = (i(n, 9), i(n, 10), i(n, 11));
            if s.iter().chain(&d).any(|&v| v <= 0)
                || p.iter().any(|&v| v < 0)
                || ic <= 0
                || nb <= 0
                || oc <= 0
            {
                return Err(shape_err(
                    op,
                    format!("stride {s:?} padding {p:?} dilation {d:?} channels {ic}/{oc} batch {nb}"),
                ));
            }
            let (ic, nb, oc) = (ic as usize, nb as usize, oc as usize);
            let out: [i64; 3] = std::array::from_fn(|q| {
                (x.ne[q] as i64 + 2 * p[q] - d[q] * (k.ne[q] as i64 - 1) - 1).div_euclid(s[q]) + 1
            });
            let ok = k.ne[3] == ic * oc
                && x.ne[3] == ic * nb
                && out.iter().all(|&o| o >= 0)
                && dst.ne == [out[0] as usize, out[1] as usize, out[2] as usize, oc * nb];
            let types = matches!(k.dtype(), GgmlType::F32 | GgmlType::F16)
                && x.dtype() == GgmlType::F32
                && dst.dtype() == GgmlType::F32;
            if !ok || !types {
                return Err(shape_err(
                    op,
                    format!(
                        "{} kernel {:?} on {} {:?} ({ic} -> {oc} channels, batch {nb}) -> {:?}",
                        k.dtype(),
                        k.ne,
                        x.dtype(),
                        x.ne,
                        dst.ne
                    ),
                ));
            }
            Formula::Conv3d { s, p, d, ic, oc, f16: k.dtype() == GgmlType::F16 }
        }
        GgmlOp::Im2colBack => {
            let (g, k) = (need(&a, 0)?, need(&b, 1)?);
            let two_d = i(n, 6) != 0;
            let s = [i64::from(i(n, 0)), i64::from(i(n, 1))];
            let p = [i64::from(i(n, 2)), i64::from(i(n, 3))];
            let d = [i64::from(i(n, 4)), i64::from(i(n, 5))];
            if s[0] <= 0 || (two_d && s[1] <= 0) || p.iter().any(|&v| v < 0) {
                return Err(shape_err(op, format!("stride {s:?} padding {p:?} dilation {d:?}")));
            }
            let (kw, kh) = (k.ne[0], if two_d { k.ne[1] } else { 1 });
            let (ic, batch) = if two_d { (dst.ne[2], dst.ne[3]) } else { (dst.ne[1], dst.ne[2]) };
            let out = [g.ne[1], if two_d { g.ne[2] } else { 1 }];
            let g_batch = if two_d { g.ne[3] } else { g.ne[2] };
            let ok = g.ne[0] == ic * kh * kw
                && g_batch == batch
                && (two_d || (g.ne[3] == 1 && dst.ne[3] == 1))
                && g.dtype() == GgmlType::F32
                && dst.dtype() == GgmlType::F32;
            if !ok {
                return Err(shape_err(
                    op,
                    format!("gradient {:?} of columns for kernel {:?} -> image {:?}", g.ne, k.ne, dst.ne),
                ));
            }
            Formula::Im2colBack { s, p, d, k: [kw, kh], out, two_d }
        }
        GgmlOp::Col2im1d => {
            let a = need(&a, 0)?;
            let (s0, oc, p0) = (i(n, 0), i(n, 1), i(n, 2));
            if s0 <= 0 || oc <= 0 || p0 < 0 {
                return Err(shape_err(op, format!("stride {s0}, {oc} channels, padding {p0}")));
            }
            let (s0, oc, p0) = (s0 as usize, oc as usize, p0 as usize);
            let k = a.ne[0] / oc;
            let full = if a.ne[1] == 0 { 0 } else { (a.ne[1] - 1) * s0 + k };
            let ok = a.ne[0] % oc == 0
                && full >= 2 * p0
                && dst.ne == [full - 2 * p0, oc, 1, 1]
                && a.ne[2] == 1
                && a.ne[3] == 1
                && a.dtype() == dst.dtype()
                && is_float(a.dtype());
            if !ok {
                return Err(shape_err(
                    op,
                    format!(
                        "{} columns {:?} (stride {s0}, {oc} channels, padding {p0}) -> {} {:?}",
                        a.dtype(),
                        a.ne,
                        dst.dtype(),
                        dst.ne
                    ),
                ));
            }
            Formula::Col2im1d { s: s0, k, p: p0 }
        }
        GgmlOp::Pool2dBack => {
            let (g, f) = (need(&a, 0)?, need(&b, 1)?);
            let max = match i(n, 0) {
                0 => true,
                1 => false,
                o => return Err(shape_err(op, format!("pool op {o}"))),
            };
            let (k, s, p) = ([i(n, 1), i(n, 2)], [i(n, 3), i(n, 4)], [i(n, 5), i(n, 6)]);
            if k.iter().chain(&s).any(|&v| v <= 0) || p.iter().any(|&v| v < 0) {
                return Err(shape_err(op, format!("pool kernel {k:?} stride {s:?} padding {p:?}")));
            }
            // ggml's F16 destination adds the bits of f16 values as integers (not a gradient):
            // only F32 is computed.
            if [g.dtype(), f.dtype(), dst.dtype()].iter().any(|&t| t != GgmlType::F32) {
                return Err(types_err(op, "POOL_2D_BACK is computed for F32 tensors only"));
            }
            if f.ne != dst.ne || g.ne[2] != dst.ne[2] || g.ne[3] != dst.ne[3] {
                return Err(shape_err(op, format!("gradient {:?}, input {:?} -> {:?}", g.ne, f.ne, dst.ne)));
            }
            Formula::Pool2dBack {
                max,
                k: k.map(|v| v as usize),
                s: s.map(|v| v as usize),
                p: p.map(i64::from),
            }
        }
        GgmlOp::AddRelPos => {
            let (x, pw, ph) = (need(&a, 0)?, need(&b, 1)?, need(&c, 2)?);
            let w = pw.ne[0];
            let ok =
                [&x, &pw, &ph, &dst].iter().all(|t| t.dtype() == GgmlType::F32 && t.nb == contiguous_nb(t))
                    && pw.ne == ph.ne
                    && x.ne == dst.ne
                    && w.checked_mul(pw.nelements()) == Some(x.nelements());
            if !ok {
                return Err(shape_err(
                    op,
                    format!("attention {:?} with positions {:?} / {:?} (contiguous F32)", x.ne, pw.ne, ph.ne),
                ));
            }
            Formula::AddRelPos
        }
        _ => return Err(Error::UnsupportedOp { op, detail: "not an indexed op".into() }),
    };
    // ADD_REL_POS may run in place (its destination is then src0 itself).
    let in_place = matches!(f, Formula::AddRelPos);
    for (k, t) in [&a, &b, &c].into_iter().enumerate() {
        if let Some(t) = t {
            let alias = if k == 0 && in_place { Alias::RowLocal } else { Alias::Never };
            check_overlap(op, &dst, t, alias)?;
        }
    }
    Ok(super::simple(Kind::Indexed(Box::new(Indexed { dst, a, b, c, f })), 0))
}

/// Stride, padding and dilation of a 2-D convolution (op_params 0..6): positive, non-negative,
/// positive.
fn conv_params(n: &Node) -> Result<([i64; 2], [i64; 2], [i64; 2])> {
    let s = [i64::from(i(n, 0)), i64::from(i(n, 1))];
    let p = [i64::from(i(n, 2)), i64::from(i(n, 3))];
    let d = [i64::from(i(n, 4)), i64::from(i(n, 5))];
    if s.iter().chain(&d).any(|&v| v <= 0) || p.iter().any(|&v| v < 0) {
        return Err(shape_err(n.op, format!("stride {s:?} padding {p:?} dilation {d:?}")));
    }
    Ok((s, p, d))
}

fn same_shape(op: GgmlOp, a: &Tv, d: &Tv) -> Result<()> {
    if a.ne != d.ne {
        return Err(shape_err(op, format!("src0 {:?} vs dst {:?}", a.ne, d.ne)));
    }
    Ok(())
}

fn floats(op: GgmlOp, ts: &[&Tv]) -> Result<()> {
    if ts.iter().any(|t| !is_float(t.dtype())) {
        return Err(types_err(op, "operands must be F32/F16/BF16"));
    }
    Ok(())
}

fn contiguous_nb(t: &Tv) -> [usize; 4] {
    let mut nb = [t.ts; 4];
    for k in 1..4 {
        nb[k] = nb[k - 1] * t.ne[k - 1];
    }
    nb
}

impl Indexed {
    pub(crate) fn run(&self, ctx: &mut Ctx<'_>) {
        let d = &self.dst;
        for r in ctx.range(d.nrows()) {
            let (i1, i2, i3) = d.unravel_row(r);
            for i0 in 0..d.ne[0] {
                d.set_f32(i0, i1, i2, i3, self.value([i0, i1, i2, i3]));
            }
        }
    }

    fn value(&self, x: [usize; 4]) -> f32 {
        let [i0, i1, i2, i3] = x;
        // Sources are present for every formula that reads them (checked in prepare).
        let a = || self.a.as_ref().expect("src0 validated");
        match self.f {
            Formula::Arange { start, step } => start + step * i0 as f32,
            Formula::Timestep { half, log_period } => {
                if i0 >= 2 * half {
                    return 0.0;
                }
                let j = i0 % half.max(1);
                let t = a().get_f32(i1, 0, 0, 0);
                let freq = (-log_period * j as f32 / half as f32).exp();
                let arg = t * freq;
                if i0 < half {
                    arg.cos()
                } else {
                    arg.sin()
                }
            }
            Formula::Roll { shift } => {
                let a = a();
                let s: [usize; 4] = std::array::from_fn(|k| (x[k] + a.ne[k] - shift[k]) % a.ne[k]);
                a.get_f32(s[0], s[1], s[2], s[3])
            }
            Formula::PadReflect { p0 } => {
                let a = a();
                let n = a.ne[0] as i64;
                let j = i0 as i64 - p0 as i64;
                let j = if j < 0 {
                    -j
                } else if j >= n {
                    2 * (n - 1) - j
                } else {
                    j
                };
                a.get_f32(j as usize, i1, i2, i3)
            }
            Formula::Diag => {
                if i0 == i1 {
                    a().get_f32(i0, 0, i2, i3)
                } else {
                    0.0
                }
            }
            Formula::Tri(keep) => {
                let k = match keep {
                    TriKeep::UpperDiag => i0 >= i1,
                    TriKeep::Upper => i0 > i1,
                    TriKeep::LowerDiag => i0 <= i1,
                    TriKeep::Lower => i0 < i1,
                };
                if k {
                    a().get_f32(i0, i1, i2, i3)
                } else {
                    0.0
                }
            }
            Formula::Window { offset, nb, set } => {
                let v = a().get_f32(i0, i1, i2, i3);
                match self.window_index(offset, nb, x) {
                    Some(j) => {
                        let b = self.b.as_ref().expect("src1 validated").get_f32(j[0], j[1], j[2], j[3]);
                        if set {
                            b
                        } else {
                            v + b
                        }
                    }
                    None => v,
                }
            }
            Formula::UpNearest { sf } => {
                let a = a();
                let s: [usize; 4] =
                    std::array::from_fn(|k| ((x[k] as f32 / sf[k]) as usize).min(a.ne[k] - 1));
                a.get_f32(s[0], s[1], s[2], s[3])
            }
            Formula::UpBicubic { sf, offset } => {
                let a = a();
                let j2 = ((i2 as f32 / sf[2]) as usize).min(a.ne[2] - 1);
                let j3 = ((i3 as f32 / sf[3]) as usize).min(a.ne[3] - 1);
                let y = (i1 as f32 + offset) / sf[1] - offset;
                let x = (i0 as f32 + offset) / sf[0] - offset;
                let (y0, x0) = (y.floor(), x.floor());
                let (dy, dx) = (y - y0, x - x0);
                let p = |xo: i64, yo: i64| {
                    let u = (x0 as i64 + xo).clamp(0, a.ne[0] as i64 - 1) as usize;
                    let v = (y0 as i64 + yo).clamp(0, a.ne[1] as i64 - 1) as usize;
                    a.get_f32(u, v, j2, j3)
                };
                let row = |yo: i64| bicubic([p(-1, yo), p(0, yo), p(1, yo), p(2, yo)], dx);
                bicubic([row(-1), row(0), row(1), row(2)], dy)
            }
            Formula::UpAntialias { sf, offset } => {
                let a = a();
                let j2 = ((i2 as f32 / sf[2]) as usize).min(a.ne[2] - 1);
                let j3 = ((i3 as f32 / sf[3]) as usize).min(a.ne[3] - 1);
                let support = [0, 1].map(|q| (1.0 / sf[q]).max(1.0));
                let y = (i1 as f32 + offset) / sf[1];
                let x = (i0 as f32 + offset) / sf[0];
                let span = |c: f32, q: usize| {
                    let lo = ((c - support[q] + offset) as i64).max(0);
                    let hi = ((c + support[q] + offset) as i64).min(a.ne[q] as i64);
                    lo..hi
                };
                let tri = |v: f32| (1.0 - v.abs()).max(0.0);
                let (mut val, mut total) = (0.0f32, 0.0f32);
                for sy in span(y, 1) {
                    let wy = tri((sy as f32 - y + offset) * (1.0 / support[1]));
                    for sx in span(x, 0) {
                        let wx = tri((sx as f32 - x + offset) * (1.0 / support[0]));
                        let w = wx * wy;
                        if w <= 0.0 {
                            continue;
                        }
                        val += a.get_f32(sx as usize, sy as usize, j2, j3) * w;
                        total += w;
                    }
                }
                if total > 0.0 {
                    val / total
                } else {
                    val
                }
            }
            Formula::Im2col3d { s, p, d, k, ic, od } => {
                let src = self.b.as_ref().expect("src1 validated");
                let per_c = k[0] * k[1] * k[2];
                let (c, r) = (i0 / per_c, i0 % per_c);
                let (kd, kh, kw) = (r / (k[0] * k[1]), (r / k[0]) % k[1], r % k[0]);
                let (nb, oz) = (i3 / od.max(1), i3 % od.max(1));
                let at = [(i1, kw), (i2, kh), (oz, kd)];
                let mut pos = [0usize; 3];
                for q in 0..3 {
                    let v = at[q].0 as i64 * s[q] + at[q].1 as i64 * d[q] - p[q];
                    if v < 0 || v >= src.ne[q] as i64 {
                        return 0.0;
                    }
                    pos[q] = v as usize;
                }
                src.get_f32(pos[0], pos[1], pos[2], nb * ic + c)
            }
            Formula::Conv3d { s, p, d, ic, oc, f16 } => {
                let (k, src) = (a(), self.b.as_ref().expect("src1 validated"));
                let (nb, o) = (i3 / oc, i3 % oc);
                let out = [i0, i1, i2];
                let mut sum = 0.0f32;
                for c in 0..ic {
                    for kz in 0..k.ne[2] {
                        for ky in 0..k.ne[1] {
                            for kx in 0..k.ne[0] {
                                let kk = [kx, ky, kz];
                                let at: [i64; 3] = std::array::from_fn(|q| {
                                    out[q] as i64 * s[q] + kk[q] as i64 * d[q] - p[q]
                                });
                                if (0..3).any(|q| at[q] < 0 || at[q] >= src.ne[q] as i64) {
                                    continue;
                                }
                                let v =
                                    src.get_f32(at[0] as usize, at[1] as usize, at[2] as usize, nb * ic + c);
                                sum += k.get_f32(kx, ky, kz, o * ic + c) * round_to(f16, v);
                            }
                        }
                    }
                }
                sum
            }
            Formula::Im2colBack { s, p, d, k, out, two_d } => {
                let g = a();
                let (iw, ih, c, nb) = if two_d { (i0, i1, i2, i3) } else { (i0, 0, i1, i2) };
                let mut grad = 0.0f32;
                for kh in 0..k[1] {
                    for kw in 0..k[0] {
                        // Positions a stride skipped over in the forward pass take no gradient.
                        let tw = iw as i64 + p[0] - kw as i64 * d[0];
                        if tw % s[0] != 0 {
                            continue;
                        }
                        let ow = tw / s[0];
                        let oh = if two_d {
                            let th = ih as i64 + p[1] - kh as i64 * d[1];
                            if th % s[1] != 0 {
                                continue;
                            }
                            th / s[1]
                        } else {
                            0
                        };
                        if ow < 0 || ow >= out[0] as i64 || oh < 0 || oh >= out[1] as i64 {
                            continue;
                        }
                        let col = (c * k[1] + kh) * k[0] + kw;
                        grad += if two_d {
                            g.get_f32(col, ow as usize, oh as usize, nb)
                        } else {
                            g.get_f32(col, ow as usize, nb, 0)
                        };
                    }
                }
                grad
            }
            Formula::Col2im1d { s, k, p } => {
                let cols = a();
                let t = i0 + p;
                let mut sum = 0.0f32;
                for t_in in 0..cols.ne[1] {
                    if let Some(kk) = t.checked_sub(t_in * s).filter(|&kk| kk < k) {
                        sum += cols.get_f32(i1 * k + kk, t_in, 0, 0);
                    }
                }
                sum
            }
            Formula::Pool2dBack { max, k, s, p } => {
                let (g, f) = (a(), self.b.as_ref().expect("src1 validated"));
                let (x, y) = (i0 as i64, i1 as i64);
                // Output positions whose window holds (x, y), in ggml's scatter order (rows, then
                // columns), so the gradient sums in the same order.
                let range = |c: i64, q: usize, n: usize| {
                    let lo = (c + p[q] - k[q] as i64 + 1).max(0);
                    let lo = (lo + s[q] as i64 - 1) / s[q] as i64;
                    let hi = ((c + p[q]) / s[q] as i64).min(n as i64 - 1);
                    lo..=hi
                };
                let mut sum = 0.0f32;
                for oy in range(y, 1, g.ne[1]) {
                    for ox in range(x, 0, g.ne[0]) {
                        let grad = g.get_f32(ox as usize, oy as usize, i2, i3);
                        let (ix, iy) = (ox * s[0] as i64 - p[0], oy * s[1] as i64 - p[1]);
                        if max {
                            if pool_argmax(f, [ix, iy], k, i2, i3) == Some((x, y)) {
                                sum += grad;
                            }
                        } else {
                            sum += grad / (k[0] * k[1]) as f32;
                        }
                    }
                }
                sum
            }
            Formula::AddRelPos => {
                let (x, pw, ph) = (a(), self.b.as_ref().expect("src1"), self.c.as_ref().expect("src2"));
                let w = pw.ne[0];
                let flat = i0 + x.ne[0] * (i1 + x.ne[1] * (i2 + x.ne[2] * i3));
                let (block, r, col) = (flat / (w * w), (flat / w) % w, flat % w);
                let at = |t: &Tv, j: usize| {
                    let f = block * w + j;
                    t.get_f32(
                        f % w,
                        (f / w) % t.ne[1],
                        (f / (w * t.ne[1])) % t.ne[2],
                        f / (w * t.ne[1] * t.ne[2]),
                    )
                };
                let v = x.get_f32(i0, i1, i2, i3);
                // ggml adds row `r`'s term when its loop reaches min(r, col) first.
                if r <= col {
                    (v + at(ph, r)) + at(pw, col)
                } else {
                    (v + at(pw, col)) + at(ph, r)
                }
            }
            Formula::UpBilinear { sf, offset } => {
                let a = a();
                let j2 = ((i2 as f32 / sf[2]) as usize).min(a.ne[2] - 1);
                let j3 = ((i3 as f32 / sf[3]) as usize).min(a.ne[3] - 1);
                let axis = |q: usize| {
                    let y = (x[q] as f32 + offset) / sf[q] - offset;
                    let lo = y.floor() as i64;
                    let top = a.ne[q] as i64 - 1;
                    let (c0, c1) = (lo.clamp(0, top) as usize, (lo + 1).clamp(0, top) as usize);
                    (c0, c1, (y - y.floor()).clamp(0.0, 1.0))
                };
                let (x0, x1, dx) = axis(0);
                let (y0, y1, dy) = axis(1);
                let p = |u, v| a.get_f32(u, v, j2, j3);
                // Within an ulp of ggml's (its compiler's contraction of this sum is not reproduced).
                p(x0, y0) * (1.0 - dx) * (1.0 - dy)
                    + p(x1, y0) * dx * (1.0 - dy)
                    + p(x0, y1) * (1.0 - dx) * dy
                    + p(x1, y1) * dx * dy
            }
            Formula::Im2col { s, p, d, k, two_d } => {
                let src = self.b.as_ref().expect("src1 validated");
                let per_c = k[0] * k[1];
                let (c, rest) = (i0 / per_c, i0 % per_c);
                let (kh, kw) = (rest / k[0], rest % k[0]);
                let ow = i1 as i64;
                let iw = ow * s[0] + kw as i64 * d[0] - p[0];
                if two_d {
                    let ih = i2 as i64 * s[1] + kh as i64 * d[1] - p[1];
                    if iw < 0 || ih < 0 || iw >= src.ne[0] as i64 || ih >= src.ne[1] as i64 {
                        return 0.0;
                    }
                    src.get_f32(iw as usize, ih as usize, c, i3)
                } else {
                    if iw < 0 || iw >= src.ne[0] as i64 {
                        return 0.0;
                    }
                    src.get_f32(iw as usize, c, i2, 0)
                }
            }
            Formula::Pool { max, k, s, p } => {
                let a = a();
                let mut acc = if max { -f32::MAX } else { 0.0 };
                let (bx, by) = (i0 as i64 * s[0] as i64 - p[0], i1 as i64 * s[1] as i64 - p[1]);
                // POOL_1D has k[1] = s[1] = 1 and p[1] = 0: row i1 of the source.
                for ky in 0..k[1] as i64 {
                    let y = by + ky;
                    if y < 0 || y >= a.ne[1] as i64 {
                        continue;
                    }
                    for kx in 0..k[0] as i64 {
                        let xx = bx + kx;
                        if xx < 0 || xx >= a.ne[0] as i64 {
                            continue;
                        }
                        let v = a.get_f32(xx as usize, y as usize, i2, i3);
                        if max {
                            acc = acc.max(v);
                        } else {
                            acc += v;
                        }
                    }
                }
                if max {
                    acc
                } else {
                    acc / (k[0] * k[1]) as f32
                }
            }
            Formula::Conv2d { s, p, d, f16 } => {
                let (k, src) = (a(), self.b.as_ref().expect("src1 validated"));
                let mut sum = 0.0f32;
                for ic in 0..k.ne[2] {
                    for ky in 0..k.ne[1] {
                        let y = i1 as i64 * s[1] + ky as i64 * d[1] - p[1];
                        for kx in 0..k.ne[0] {
                            let xx = i0 as i64 * s[0] + kx as i64 * d[0] - p[0];
                            let inside = y >= 0 && xx >= 0 && y < src.ne[1] as i64 && xx < src.ne[0] as i64;
                            if inside {
                                let v = round_to(f16, src.get_f32(xx as usize, y as usize, ic, i3));
                                sum += k.get_f32(kx, ky, ic, i2) * v;
                            }
                        }
                    }
                }
                sum
            }
            Formula::ConvT1d { s, f16 } => {
                let (k, src) = (a(), self.b.as_ref().expect("src1 validated"));
                let mut sum = 0.0f32;
                for t in 0..src.ne[0] {
                    let Some(kk) = i0.checked_sub(t * s).filter(|&kk| kk < k.ne[0]) else { continue };
                    let mut dot = 0.0f32;
                    for ic in 0..src.ne[1] {
                        dot += k.get_f32(kk, i1, ic, 0) * round_to(f16, src.get_f32(t, ic, 0, 0));
                    }
                    sum += dot;
                }
                sum
            }
            Formula::ConvT2d { s, f16 } => {
                let (k, src) = (a(), self.b.as_ref().expect("src1 validated"));
                let mut sum = 0.0f32;
                for iy in 0..src.ne[1] {
                    let Some(ky) = i1.checked_sub(iy * s).filter(|&ky| ky < k.ne[1]) else { continue };
                    for ix in 0..src.ne[0] {
                        let Some(kx) = i0.checked_sub(ix * s).filter(|&kx| kx < k.ne[0]) else { continue };
                        let mut dot = 0.0f32;
                        for ic in 0..src.ne[2] {
                            dot += k.get_f32(kx, ky, i2, ic) * round_to(f16, src.get_f32(ix, iy, ic, i3));
                        }
                        sum += dot;
                    }
                }
                sum
            }
            Formula::OutProd => {
                let (a, b) = (a(), self.b.as_ref().expect("src1 validated"));
                let (j2, j3) = (i2 / (b.ne[2] / a.ne[2]), i3 / (b.ne[3] / a.ne[3]));
                let mut sum = 0.0f32;
                for k in 0..a.ne[1] {
                    sum += a.get_f32(i0, k, j2, j3) * b.get_f32(i1, k, i2, i3);
                }
                sum
            }
            Formula::WinPart { npx, w } => {
                let a = a();
                let (py, px) = (i3 / npx, i3 % npx);
                let (y, xx) = (py * w + i2, px * w + i1);
                if y >= a.ne[2] || xx >= a.ne[1] {
                    0.0
                } else {
                    a.get_f32(i0, xx, y, 0)
                }
            }
            Formula::WinUnpart { npx, w } => a().get_f32(i0, i1 % w, i2 % w, (i2 / w) * npx + i1 / w),
            Formula::RelPos => a().get_f32(i0, (self.dst.ne[1] - i1 - 1) + i2, 0, 0),
            Formula::ConvDw { s, p, d } => {
                let (k, src) = (a(), self.b.as_ref().expect("src1 validated"));
                let mut sum = 0.0f32;
                for ky in 0..k.ne[1] {
                    let y = i1 as i64 * s[1] + ky as i64 * d[1] - p[1];
                    if y < 0 || y >= src.ne[1] as i64 {
                        continue;
                    }
                    for kx in 0..k.ne[0] {
                        let xx = i0 as i64 * s[0] + kx as i64 * d[0] - p[0];
                        if xx < 0 || xx >= src.ne[0] as i64 {
                            continue;
                        }
                        sum += k.get_f32(kx, ky, 0, i2) * src.get_f32(xx as usize, y as usize, i2, i3);
                    }
                }
                sum
            }
        }
    }

    /// The window (ACC/SET) index of destination element `x`, if it lies in the window.
    fn window_index(&self, offset: usize, nb: [usize; 3], x: [usize; 4]) -> Option<[usize; 4]> {
        let d = &self.dst;
        let b = self.b.as_ref()?;
        let off = x[0] * 4 + x[1] * d.nb[1] + x[2] * d.nb[2] + x[3] * d.nb[3];
        let mut rel = off.checked_sub(offset)?;
        let mut j = [0usize; 4];
        for k in (1..4).rev() {
            if b.ne[k] > 1 {
                j[k] = rel / nb[k - 1];
                rel %= nb[k - 1];
            }
        }
        if rel % 4 != 0 {
            return None;
        }
        j[0] = rel / 4;
        (0..4).all(|k| j[k] < b.ne[k]).then_some(j)
    }
}

/// The cubic convolution of four taps at fraction `t` (α = −0.75, as ggml and PyTorch).
fn bicubic(p: [f32; 4], t: f32) -> f32 {
    const A: f32 = -0.75;
    let near = |x: f32| ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0;
    let far = |x: f32| ((A * x - 5.0 * A) * x + 8.0 * A) * x - 4.0 * A;
    p[0] * far(t + 1.0) + p[1] * near(t) + p[2] * near(1.0 - t) + p[3] * far(2.0 - t)
}

/// The first largest forward value of the pooling window at `origin` (rows, then columns; only
/// positions inside `f`), as ggml's POOL_2D_BACK picks it; None when no value exceeds −f32::MAX.
fn pool_argmax(f: &Tv, origin: [i64; 2], k: [usize; 2], i2: usize, i3: usize) -> Option<(i64, i64)> {
    let mut best = -f32::MAX;
    let mut at = None;
    for ky in 0..k[1] as i64 {
        let y = origin[1] + ky;
        if y < 0 || y >= f.ne[1] as i64 {
            continue;
        }
        for kx in 0..k[0] as i64 {
            let x = origin[0] + kx;
            if x < 0 || x >= f.ne[0] as i64 {
                continue;
            }
            let v = f.get_f32(x as usize, y as usize, i2, i3);
            if v > best {
                best = v;
                at = Some((x, y));
            }
        }
    }
    at
}

/// `v` rounded to f16 when `f16` (ggml converts convolution inputs to an F16 kernel's type).
#[inline(always)]
fn round_to(f16: bool, v: f32) -> f32 {
    if f16 {
        half::f16::from_f32(v).to_f32()
    } else {
        v
    }
}
