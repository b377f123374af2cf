//! llama.cpp's local CPU order: the arithmetic of the products a llama.cpp CPU backend in the
//! same process (no RPC) runs on the weights it repacks, reproduced for in-process runs.
//!
//! A llama.cpp model loaded on its own CPU puts some weight matrices into `CPU_REPACK` buffers
//! (ggml-cpu `repack.cpp`, `ggml_repack_get_optimal_repack_type`); MUL_MAT on those runs the
//! repacked kernels instead of `vec_dot` / tinyBLAS. An RPC server's buffers are never repacked, so
//! llama.cpp's local text can differ from the text it gets through its own RPC server: llamad as
//! an RPC server keeps the server's order, in-process runs (`llamactl run`/`bench`, llamad's own
//! models) take this one where [`repacks`] says llama.cpp would repack and a kernel set has it.
//!
//! Facts read from the peer's source (llama.cpp of llama-cpp-python 0.3.36):
//!
//! * Which tensors (x86): a 2-D (`MUL_MAT`) or 3-D (`MUL_MAT_ID`) weight whose activations are
//!   F32, of type Q4_0, Q4_K, IQ4_NL or MXFP4 with `ne[1] % 8 == 0` (`ggml_cpu_has_avx2()`, true in
//!   both x86 builds), and Q2_K the same way in a build with AVX-512 (`ggml_cpu_has_avx512()` is a
//!   compile-time flag: the native build, not the AVX2 one). The token embedding is read by
//!   GET_ROWS, which the repack buffer does not support, so it (and an output tied to it) stays in
//!   a plain buffer.
//! * Q4_0, IQ4_NL and MXFP4 (`gemv`/`gemm_q4_b32_8x8_q8_0_lut_avx`, one template, both builds; MXFP4
//!   with its E2M1 table and the E8M0 exponent as an f32 half-scale): activations quantized
//!   to Q8_0 with `d = amax / 127`, `id = 127 / amax`, round to nearest even (`quantize_mat_q8_0_4x8`
//!   for each group of four activation rows, `quantize_row_q8_0` for the rest: the same values);
//!   per output, block after block, `acc = fma(f32(isum), f32(d_w) · f32(d_a), acc)` from 0, with
//!   `isum` the block's exact integer dot of the signed weights (nibble − 8, or IQ4_NL's table
//!   value) with the activation quants. The 4-row `gemm` (groups of four activation rows; its
//!   512-bit form in the native build) and the `gemv` (the remaining rows, and every row of
//!   MUL_MAT_ID) compute that same value per output, so the split changes no bit.
//! * Q4_K (`gemv`/`gemm_q4_K_8x8_q8_K`, both builds): activations quantized to Q8_K
//!   (`quantize_row_q8_K`, the reference quantizer; `quantize_mat_q8_K_4x8` for groups of four rows
//!   computes the same values, but for a tie of `+amax` and `−amax`, where the reference takes the
//!   first and it the positive one); the exact integers `iacc = Σ_j sc_j · Σ q·y` and
//!   `imin = Σ_j m_j · bsum_j` (sub-blocks `j` of 32), then `acc = fma(f32(iacc), f32(d) · d_a, acc)`
//!   and `acc_min = fma(f32(imin), f32(dmin) · d_a, acc_min)` from 0, and the output is
//!   `acc − acc_min`. Unlike Q4_0, the two kernels group differently: the `gemv` (the last
//!   `ne11 % 4` activation rows of each plane, so every row of a generation step) takes one float
//!   step per super-block (`j` over its 8 sub-blocks), the `gemm` (the groups of four rows, in its
//!   256- and 512-bit forms alike) one per pair of sub-blocks (`j ∈ {2p, 2p + 1}`).
//! * Q2_K (native AVX-512 build only): not reproduced yet; in-process products of it keep the RPC
//!   server's order, as do MUL_MAT_ID's expert tensors (llama.cpp repacks those too, read by `gemv`
//!   only).
//!
//! For Q4_0, IQ4_NL and MXFP4 the order is exactly that of the packed panels ([`super::panel`]: `fma(f32(off + Σ w·y),
//! sx · sy, acc)`, no min term for these types), so the panels serve it for many activation rows;
//! for generation, [`dot_reference`] defines the same order over interleaved weights
//! ([`super::interleave`]) and prepared rows, and the x86 AVX-512 kernel equals it bit for bit.
//! For Q4_K, [`vec_dot_q4_k`] is the one-row form (the scalar twin of the AVX2 kernel).
//! [`model`] is an independent scalar model of ggml's repacked product from the raw blocks; the
//! tests hold every kernel to it bit for bit.
//! ref: ggml-compute-semantics.md §2.2 (block layouts), §2.3 (Q8_0 activations).

use super::blocks::{
    e8m0_half, f16le, take_blocks, BlockIq4Nl, BlockMxfp4, BlockQ4K, BlockQ4_0, BlockQ8K, BlockQ8_0,
    KVALUES_IQ4NL, KVALUES_MXFP4, QK,
};
use super::interleave::{self, InterleavedDotFn, ROWS};
use super::panel::PanelKernels;
use super::prepared::PreparedQ8;
use super::scalar::{k4_scales, q4k_quants};
use super::VecDotFn;
use crate::dtype::{GgmlType, QK_K};
use crate::numerics::Numerics;
use crate::tensor::Layout;

/// The kernels of a type in llama.cpp's local (repacked) order.
#[derive(Clone, Copy, Debug)]
pub struct LocalKernels {
    /// Packed panels (any number of activation columns; they pay from [`super::panel`]'s minimum).
    pub panel: Option<PanelKernels>,
    /// Interleaved weights against prepared rows, for generation (Q4_0).
    pub interleaved: Option<InterleavedDotFn>,
    /// One weight row against one activation row of the type's `vec_dot_type`, for types without
    /// panels in this order (Q4_K): as ggml's `gemv` sums it (the last `ne11 % 4` activation rows
    /// of a plane) and as its four-row `gemm` does (the others).
    pub vec_dot: Option<(VecDotFn, VecDotFn)>,
    /// The `gemm` order of [`LocalKernels::vec_dot`] for four activation rows at once (the weight
    /// row decoded once; every output's steps those of the one-row form).
    pub gemm_x4: Option<super::VecDotX4Fn>,
}

/// Whether a llama.cpp CPU backend of the build that `numerics` reproduces keeps a weight of
/// layout `l` in a `CPU_REPACK` buffer when it loads the model on its own CPU (see the module docs;
/// `id` for a MUL_MAT_ID expert tensor). Only the x86 builds are modelled; the aarch64 profiles
/// and `portable` answer `false`.
pub fn repacks(numerics: Numerics, l: &Layout, id: bool) -> bool {
    use GgmlType::*;
    let dims_ok = if id { l.ne[3] == 1 } else { l.ne[2] == 1 && l.ne[3] == 1 };
    let typed = match numerics {
        Numerics::Avx2 => matches!(l.dtype, Q4_0 | Q4_K | IQ4_NL | MXFP4),
        Numerics::Avx512 => matches!(l.dtype, Q4_0 | Q4_K | IQ4_NL | MXFP4 | Q2_K),
        _ => false,
    };
    typed && dims_ok && l.ne[1].is_multiple_of(8)
}

/// The signed weights of a block of `t` (Q4_0: nibble − 8; IQ4_NL, MXFP4: the table value) and its scale.
fn signed_block(t: GgmlType, raw: &[u8]) -> ([i32; QK], f32) {
    let nib = |qs: &[u8; 16], e: usize| if e < 16 { qs[e] & 0xF } else { qs[e - 16] >> 4 };
    match t {
        GgmlType::Q4_0 => {
            let b = &take_blocks::<BlockQ4_0>(raw, 1)[0];
            (std::array::from_fn(|e| nib(&b.qs, e) as i32 - 8), f16le(b.d))
        }
        GgmlType::IQ4_NL => {
            let b = &take_blocks::<BlockIq4Nl>(raw, 1)[0];
            (std::array::from_fn(|e| KVALUES_IQ4NL[nib(&b.qs, e) as usize] as i32), f16le(b.d))
        }
        GgmlType::MXFP4 => {
            let b = &take_blocks::<BlockMxfp4>(raw, 1)[0];
            (std::array::from_fn(|e| KVALUES_MXFP4[nib(&b.qs, e) as usize] as i32), e8m0_half(b.e))
        }
        other => panic!("local order: {other} is not modelled"),
    }
}

/// ggml's repacked product of one weight row of `k` elements of `t` (Q4_0, IQ4_NL or MXFP4 against a
/// Q8_0 row, Q4_K against a Q8_K row; `gemm`: Q4_K's grouping of the four-row kernel, else its
/// `gemv`'s), as the module docs state it: the model the kernels are tested against.
pub fn model(t: GgmlType, k: usize, x: &[u8], y: &[u8], gemm: bool) -> f32 {
    if t == GgmlType::Q4_K {
        return model_q4_k(k, x, y, if gemm { 2 } else { 8 });
    }
    assert_eq!(k % QK, 0, "local model: k = {k} is not a whole number of blocks");
    let ts = t.type_size();
    let ys = take_blocks::<BlockQ8_0>(y, k / QK);
    let mut acc = 0.0f32;
    for (b, yb) in ys.iter().enumerate() {
        let (w, dw) = signed_block(t, &x[b * ts..(b + 1) * ts]);
        let isum: i32 = w.iter().zip(yb.qs.iter()).map(|(&w, &y)| w * y as i32).sum();
        acc = (isum as f32).mul_add(dw * f16le(yb.d), acc);
    }
    acc
}

/// Q4_K with one float step per `per` sub-blocks.
fn model_q4_k(k: usize, x: &[u8], y: &[u8], per: usize) -> f32 {
    assert_eq!(k % QK_K, 0, "local model: k = {k} is not a whole number of super-blocks");
    let nb = k / QK_K;
    let (xs, ys) = (take_blocks::<BlockQ4K>(x, nb), take_blocks::<BlockQ8K>(y, nb));
    let (mut acc, mut acc_min) = (0.0f32, 0.0f32);
    for (xb, yb) in xs.iter().zip(ys) {
        let q = q4k_quants(xb);
        let sm = k4_scales(&xb.scales);
        let da = f32::from_le_bytes(yb.d);
        for group in sm.chunks(per).enumerate().map(|(g, c)| g * per..g * per + c.len()) {
            let (mut iacc, mut imin) = (0i32, 0i32);
            for j in group {
                let isum: i32 = (32 * j..32 * j + 32).map(|e| q[e] as i32 * yb.qs[e] as i32).sum();
                let bsum: i32 = yb.qs[32 * j..32 * j + 32].iter().map(|&v| v as i32).sum();
                iacc += sm[j].0 as i32 * isum;
                imin += sm[j].1 as i32 * bsum;
            }
            acc = (iacc as f32).mul_add(f16le(xb.d) * da, acc);
            acc_min = (imin as f32).mul_add(f16le(xb.dmin) * da, acc_min);
        }
    }
    acc - acc_min
}

/// The local order of Q4_K as ggml's `gemv` sums it, one weight row against one Q8_K row, from
/// the block fields as the kernels read them (the activation's `bsums` for the min term): the
/// scalar twin of the SIMD kernels.
pub fn vec_dot_q4_k(n: usize, x: &[u8], y: &[u8]) -> f32 {
    q4_k_steps::<4>(n, x, y)
}

/// As [`vec_dot_q4_k`], grouped as ggml's four-row `gemm`: one float step per pair of sub-blocks.
pub fn vec_dot_q4_k_gemm(n: usize, x: &[u8], y: &[u8]) -> f32 {
    q4_k_steps::<1>(n, x, y)
}

/// Q4_K with one float step per `P` pairs of sub-blocks (4: per super-block).
fn q4_k_steps<const P: usize>(n: usize, x: &[u8], y: &[u8]) -> f32 {
    assert_eq!(n % QK_K, 0, "local Q4_K dot: n = {n} is not a whole number of super-blocks");
    let nb = n / QK_K;
    let (xs, ys) = (take_blocks::<BlockQ4K>(x, nb), take_blocks::<BlockQ8K>(y, nb));
    let (mut acc, mut acc_min) = (0.0f32, 0.0f32);
    for (xb, yb) in xs.iter().zip(ys) {
        let sm = k4_scales(&xb.scales);
        let da = f32::from_le_bytes(yb.d);
        for g in 0..4 / P {
            let (mut iacc, mut imin) = (0i32, 0i32);
            for p in g * P..(g + 1) * P {
                for (h, j) in [(0u32, 2 * p), (4, 2 * p + 1)] {
                    let isum: i32 = (0..32)
                        .map(|l| ((xb.qs[32 * p + l] >> h) & 0xF) as i32 * yb.qs[32 * j + l] as i32)
                        .sum();
                    iacc += sm[j].0 as i32 * isum;
                    let bsum = i16::from_le_bytes(yb.bsums[2 * j]) as i32
                        + i16::from_le_bytes(yb.bsums[2 * j + 1]) as i32;
                    imin += sm[j].1 as i32 * bsum;
                }
            }
            acc = (iacc as f32).mul_add(f16le(xb.d) * da, acc);
            acc_min = (imin as f32).mul_add(f16le(xb.dmin) * da, acc_min);
        }
    }
    acc - acc_min
}

/// The local order over interleaved Q4_0 weights: one group of [`ROWS`] rows against 1..=
/// [`interleave::LOCAL_MAX_COLS`] prepared rows (bias 8), `out[j * ROWS + r]`; per block the exact sum
/// `Σ off + Σ w·y` (the prepared lane offsets make it `Σ (w − 8)·y`), then `acc = fma(f32(isum),
/// d_w · d_y, acc)`. The scalar twin of the SIMD kernels.
pub fn dot_reference(k: usize, group: &[u8], cols: &[&[u8]], out: &mut [f32], _ahead: &[u8]) {
    let t = GgmlType::Q4_0;
    interleave::check_args_cols(t, k, group, cols, out, interleave::LOCAL_MAX_COLS);
    let (bb, qb) = (interleave::block_bytes(t), interleave::quant_bytes(t));
    let nb = k / QK;
    for (j, col) in cols.iter().enumerate() {
        let ys = take_blocks::<PreparedQ8>(col, nb);
        for r in 0..ROWS {
            let mut acc = 0.0f32;
            for (b, y) in ys.iter().enumerate() {
                let g = &group[b * bb..(b + 1) * bb];
                let mut isum = 0i32;
                for l in 0..8 {
                    isum += i32::from_le_bytes(y.off[l]);
                    for e in 0..4 {
                        isum += interleave::weight(t, g, l, r, e) as i32 * y.qs[4 * l + e] as i32;
                    }
                }
                let dx = f16le([g[qb + 2 * r], g[qb + 2 * r + 1]]);
                acc = (isum as f32).mul_add(dx * f32::from_le_bytes(y.d), acc);
            }
            out[j * ROWS + r] = acc;
        }
    }
}

/// A compile-time check of the block sizes [`model`] reads.
const _: () = {
    assert!(std::mem::size_of::<BlockQ4_0>() == 18);
    assert!(std::mem::size_of::<BlockIq4Nl>() == 18);
    assert!(std::mem::size_of::<BlockQ8_0>() == 34);
    assert!(std::mem::size_of::<BlockQ4K>() == 144);
    assert!(std::mem::size_of::<BlockQ8K>() == 292);
};
