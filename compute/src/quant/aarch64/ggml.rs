//! The legacy formats Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 in ggml's NEON order (the `neon-dotprod` and
//! `neon-i8mm` tables): `vec_dot` / `vec_dot_x4` as ggml's `ggml_vec_dot_*` with dotprod (two
//! blocks per step into two lane accumulators); at the dotprod level, for Q4_0 and Q8_0,
//! `vec_dot_gemm` as llamafile's `tinyBLAS_Q0_ARM` (one lane accumulator), which ggml runs for two or
//! more activation rows; at the i8mm level (where ggml has no llamafile) Q4_0, Q4_1 and Q8_0's
//! two-row `smmla` kernels.
//! Q8_0 / Q8_1 activations round half to even as ggml's NEON quantizers do.
//!
//! The scalar twins, and the description of the order, are in `quant::scalar::neon_order`; every
//! kernel here equals its twin bit for bit (tests in `quant::tests::neon`).

use std::arch::aarch64::*;

use super::dot::{Dot, Sdot};
use super::legacy::B32;
use crate::quant::blocks::*;
use crate::quant::scalar::neon_order::NeonBlock;
use crate::quant::scalar::quant_blocks;
use crate::quant::{VecDot2x2Fn, VecDotFn, VecDotX4Fn};

/// The four `sdot` lanes of one block (elements `4l..4l+4` and `16+4l..16+4l+4` in lane `l`).
#[inline(always)]
unsafe fn lanes<B: B32>(x: &B::X, y: &B::Y) -> int32x4_t {
    // SAFETY: register arithmetic and in-bounds loads; dotprod is enabled in every caller.
    unsafe {
        let [a, b] = B::decode(x);
        let q = B::qs(y);
        let (u, v) = (vld1q_s8(q.as_ptr()), vld1q_s8(q.as_ptr().add(16)));
        Sdot::dot(Sdot::dot(vdupq_n_s32(0), a, u), b, v)
    }
}

/// `acc + f32(p)·d`, multiply and add rounded separately (ggml's `vmlaq_n_f32`).
#[inline(always)]
unsafe fn mla(acc: float32x4_t, p: int32x4_t, d: f32) -> float32x4_t {
    // SAFETY: register arithmetic (NEON enabled in every caller).
    unsafe { vaddq_f32(acc, vmulq_n_f32(vcvtq_f32_s32(p), d)) }
}

/// `(v0 + v1) + (v2 + v3)`.
#[inline(always)]
unsafe fn hadd(v: float32x4_t) -> f32 {
    // SAFETY: register arithmetic (NEON enabled in every caller).
    unsafe {
        let p = vpaddq_f32(v, v);
        vgetq_lane_f32::<0>(vpaddq_f32(p, p))
    }
}

/// One column in ggml's `vec_dot` order (`neon_order::vec_dot_blocks`).
#[inline(always)]
unsafe fn dot1<B: B32, M: NeonBlock<X = B::X, Y = B::Y>>(xs: &[B::X], ys: &[B::Y]) -> f32 {
    // SAFETY: in-bounds block access (`ys.len() == xs.len()`, checked by the wrappers) and
    // register arithmetic.
    unsafe {
        let nb = xs.len();
        let (mut acc0, mut acc1) = (vdupq_n_f32(0.0), vdupq_n_f32(0.0));
        let (mut summs, mut summs1) = (0.0f32, 0.0f32);
        let mut ib = 0;
        while ib + 1 < nb {
            let (x0, x1, y0, y1) = (&xs[ib], &xs[ib + 1], &ys[ib], &ys[ib + 1]);
            if M::OFFSET {
                let ((a0, b0), (a1, b1)) = (M::m(x0, y0), M::m(x1, y1));
                if M::SPLIT_SUMMS {
                    summs = a0.mul_add(b0, summs);
                    summs1 = a1.mul_add(b1, summs1);
                } else {
                    summs += a0.mul_add(b0, a1 * b1);
                }
            }
            acc0 = mla(acc0, lanes::<B>(x0, y0), M::d(x0, y0));
            acc1 = mla(acc1, lanes::<B>(x1, y1), M::d(x1, y1));
            ib += 2;
        }
        let mut sumf = hadd(acc0) + hadd(acc1);
        if M::OFFSET {
            sumf = if M::SPLIT_SUMMS { sumf + summs + summs1 } else { sumf + summs };
        }
        if ib < nb {
            let s = vaddvq_s32(lanes::<B>(&xs[ib], &ys[ib]));
            sumf = M::tail(sumf, s, &xs[ib], &ys[ib]);
        }
        sumf
    }
}

/// Four columns sharing the weight blocks, each in [`dot1`]'s order.
#[inline(always)]
unsafe fn dot4<B: B32, M: NeonBlock<X = B::X, Y = B::Y>>(xs: &[B::X], ys: [&[B::Y]; 4]) -> [f32; 4] {
    // SAFETY: in-bounds block access (every column has xs.len() blocks, checked by the wrapper)
    // and register arithmetic.
    unsafe {
        let nb = xs.len();
        let mut acc = [[vdupq_n_f32(0.0); 2]; 4];
        let mut summs = [[0.0f32; 2]; 4];
        let mut ib = 0;
        while ib + 1 < nb {
            for h in 0..2 {
                let x = &xs[ib + h];
                let [a, b] = B::decode(x);
                for c in 0..4 {
                    let y = &ys[c][ib + h];
                    let q = B::qs(y);
                    let (u, v) = (vld1q_s8(q.as_ptr()), vld1q_s8(q.as_ptr().add(16)));
                    let p = Sdot::dot(Sdot::dot(vdupq_n_s32(0), a, u), b, v);
                    acc[c][h] = mla(acc[c][h], p, M::d(x, y));
                }
            }
            if M::OFFSET {
                for c in 0..4 {
                    let ((a0, b0), (a1, b1)) = (M::m(&xs[ib], &ys[c][ib]), M::m(&xs[ib + 1], &ys[c][ib + 1]));
                    if M::SPLIT_SUMMS {
                        summs[c][0] = a0.mul_add(b0, summs[c][0]);
                        summs[c][1] = a1.mul_add(b1, summs[c][1]);
                    } else {
                        summs[c][0] += a0.mul_add(b0, a1 * b1);
                    }
                }
            }
            ib += 2;
        }
        let mut out = [0.0f32; 4];
        for c in 0..4 {
            let mut sumf = hadd(acc[c][0]) + hadd(acc[c][1]);
            if M::OFFSET {
                sumf = if M::SPLIT_SUMMS { sumf + summs[c][0] + summs[c][1] } else { sumf + summs[c][0] };
            }
            if ib < nb {
                let s = vaddvq_s32(lanes::<B>(&xs[ib], &ys[c][ib]));
                sumf = M::tail(sumf, s, &xs[ib], &ys[c][ib]);
            }
            out[c] = sumf;
        }
        out
    }
}

/// One output of `tinyBLAS_Q0_ARM`: one lane accumulator over all blocks, one `hadd`.
#[inline(always)]
unsafe fn gemm1<B: B32, M: NeonBlock<X = B::X, Y = B::Y>>(xs: &[B::X], ys: &[B::Y]) -> f32 {
    // SAFETY: in-bounds block access (zip) and register arithmetic.
    unsafe {
        let mut acc = vdupq_n_f32(0.0);
        for (x, y) in xs.iter().zip(ys) {
            acc = mla(acc, lanes::<B>(x, y), M::d(x, y));
        }
        hadd(acc)
    }
}

#[target_feature(enable = "neon,dotprod")]
unsafe fn dot1_sdot<B: B32, M: NeonBlock<X = B::X, Y = B::Y>>(xs: &[B::X], ys: &[B::Y]) -> f32 {
    // SAFETY: NEON and dotprod are enabled on this fn; the caller checked the lengths.
    unsafe { dot1::<B, M>(xs, ys) }
}

#[target_feature(enable = "neon,dotprod")]
unsafe fn dot4_sdot<B: B32, M: NeonBlock<X = B::X, Y = B::Y>>(xs: &[B::X], ys: [&[B::Y]; 4]) -> [f32; 4] {
    // SAFETY: NEON and dotprod are enabled on this fn; the caller checked the lengths.
    unsafe { dot4::<B, M>(xs, ys) }
}

#[target_feature(enable = "neon,dotprod")]
unsafe fn gemm1_sdot<B: B32, M: NeonBlock<X = B::X, Y = B::Y>>(xs: &[B::X], ys: &[B::Y]) -> f32 {
    // SAFETY: NEON and dotprod are enabled on this fn.
    unsafe { gemm1::<B, M>(xs, ys) }
}

fn rows<'a, B: B32>(n: usize, x: &'a [u8], y: &'a [u8]) -> (&'a [B::X], &'a [B::Y]) {
    assert_eq!(n % QK, 0, "vec_dot: n = {n} is not a whole number of blocks of {QK}");
    (take_blocks::<B::X>(x, n / QK), take_blocks::<B::Y>(y, n / QK))
}

/// `vec_dot` in ggml's NEON order.
fn vec_dot<B: B32, M: NeonBlock<X = B::X, Y = B::Y>>(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let (xs, ys) = rows::<B>(n, x, y);
    // SAFETY: installed only after NEON and dotprod detection (module docs of `aarch64`).
    unsafe { dot1_sdot::<B, M>(xs, ys) }
}

/// `vec_dot_x4` in ggml's NEON order per column.
fn vec_dot_x4<B: B32, M: NeonBlock<X = B::X, Y = B::Y>>(n: usize, x: &[u8], y: [&[u8]; 4]) -> [f32; 4] {
    assert_eq!(n % QK, 0, "vec_dot_x4: n = {n} is not a whole number of blocks of {QK}");
    let xs = take_blocks::<B::X>(x, n / QK);
    let ys = y.map(|r| take_blocks::<B::Y>(r, n / QK));
    // SAFETY: installed only after NEON and dotprod detection; every column has n / 32 blocks.
    unsafe { dot4_sdot::<B, M>(xs, ys) }
}

/// `vec_dot_gemm`: `tinyBLAS_Q0_ARM`'s order.
fn vec_dot_gemm<B: B32, M: NeonBlock<X = B::X, Y = B::Y>>(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let (xs, ys) = rows::<B>(n, x, y);
    // SAFETY: installed only after NEON and dotprod detection (module docs of `aarch64`).
    unsafe { gemm1_sdot::<B, M>(xs, ys) }
}

/// One column of IQ4_NL or MXFP4 in ggml's NEON order (`neon_order::vec_dot_pairs_blocks`): the
/// block sums from `sdot`, the float steps in scalar registers.
#[target_feature(enable = "neon,dotprod")]
unsafe fn dot_pairs<B: B32, M: NeonBlock<X = B::X, Y = B::Y>>(xs: &[B::X], ys: &[B::Y]) -> f32 {
    // SAFETY: in-bounds block access (`ys.len() == xs.len()`, checked by the wrapper) and register
    // arithmetic under NEON + dotprod.
    unsafe {
        let nb = xs.len();
        let mut sumf = 0.0f32;
        let mut ib = 0;
        while ib + 1 < nb {
            let (x0, x1, y0, y1) = (&xs[ib], &xs[ib + 1], &ys[ib], &ys[ib + 1]);
            let (p0, p1) = (vaddvq_s32(lanes::<B>(x0, y0)), vaddvq_s32(lanes::<B>(x1, y1)));
            sumf += crate::quant::scalar::neon_order::pair_sum::<M>(p0, M::d(x0, y0), p1, M::d(x1, y1));
            ib += 2;
        }
        if ib < nb {
            sumf = M::tail(sumf, vaddvq_s32(lanes::<B>(&xs[ib], &ys[ib])), &xs[ib], &ys[ib]);
        }
        sumf
    }
}

fn vec_dot_pairs<B: B32, M: NeonBlock<X = B::X, Y = B::Y>>(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let (xs, ys) = rows::<B>(n, x, y);
    // SAFETY: installed only after NEON and dotprod detection (module docs of `aarch64`).
    unsafe { dot_pairs::<B, M>(xs, ys) }
}

fn vec_dot_pairs_x4<B: B32, M: NeonBlock<X = B::X, Y = B::Y>>(n: usize, x: &[u8], y: [&[u8]; 4]) -> [f32; 4] {
    y.map(|c| vec_dot_pairs::<B, M>(n, x, c))
}

/// ggml's NEON-order kernels of IQ4_NL or MXFP4: `(vec_dot, vec_dot_x4)`.
pub(super) fn set_pairs<B: B32, M: NeonBlock<X = B::X, Y = B::Y>>() -> (VecDotFn, VecDotX4Fn) {
    (vec_dot_pairs::<B, M>, vec_dot_pairs_x4::<B, M>)
}

/// The ggml-order kernels of one format: `(vec_dot, vec_dot_x4, vec_dot_gemm)`.
pub(super) fn set<B: B32, M: NeonBlock<X = B::X, Y = B::Y>>(
    gemm: bool,
) -> (VecDotFn, VecDotX4Fn, Option<VecDotFn>) {
    (vec_dot::<B, M>, vec_dot_x4::<B, M>, gemm.then_some(vec_dot_gemm::<B, M> as VecDotFn))
}

/// ggml's i8mm two-row kernel (twin: `neon_order::vec_dot_2x2_mmla`): the four exact block sums
/// from `smmla`, then per output `sumd + f32(Σ)·(d_x·d_y)` and, with an offset, `fma(m_x, s_y,
/// summ)`; `sumd (+ summ)` at the end.
#[target_feature(enable = "neon,dotprod,i8mm")]
unsafe fn mmla_i8mm<B: B32, M: NeonBlock<X = B::X, Y = B::Y>>(
    xs: [&[B::X]; 2],
    ys: [&[B::Y]; 2],
) -> [f32; 4] {
    // SAFETY: register arithmetic and in-bounds loads; i8mm is enabled on this fn and detected
    // (install); all four rows have the same block count (checked by the wrapper).
    unsafe {
        let (mut sumd, mut summ) = ([0.0f32; 4], [0.0f32; 4]);
        for i in 0..xs[0].len() {
            let (x0, x1, y0, y1) = (&xs[0][i], &xs[1][i], &ys[0][i], &ys[1][i]);
            let (q0, q1) = (B::qs(y0), B::qs(y1));
            let t = super::dot::tile2x2(
                vdupq_n_s32(0),
                B::decode(x0),
                B::decode(x1),
                [vld1q_s8(q0.as_ptr()), vld1q_s8(q0.as_ptr().add(16))],
                [vld1q_s8(q1.as_ptr()), vld1q_s8(q1.as_ptr().add(16))],
            );
            let s = super::dot::lanes(t);
            let pairs = [(x0, y0), (x0, y1), (x1, y0), (x1, y1)];
            for (o, (x, y)) in pairs.into_iter().enumerate() {
                sumd[o] += s[o] as f32 * M::d(x, y);
                if M::OFFSET {
                    let (m, sy) = M::m(x, y);
                    summ[o] = m.mul_add(sy, summ[o]);
                }
            }
        }
        std::array::from_fn(|o| if M::OFFSET { sumd[o] + summ[o] } else { sumd[o] })
    }
}

/// `vec_dot_2x2` in ggml's i8mm order.
fn vec_dot_2x2<B: B32, M: NeonBlock<X = B::X, Y = B::Y>>(n: usize, x: [&[u8]; 2], y: [&[u8]; 2]) -> [f32; 4] {
    assert_eq!(n % QK, 0, "vec_dot_2x2: n = {n} is not a whole number of blocks of {QK}");
    let xs = x.map(|r| take_blocks::<B::X>(r, n / QK));
    let ys = y.map(|r| take_blocks::<B::Y>(r, n / QK));
    // SAFETY: installed only after NEON, dotprod and i8mm detection; every row has n / 32 blocks.
    unsafe { mmla_i8mm::<B, M>(xs, ys) }
}

/// The two-row kernel of a format in ggml's i8mm order.
pub(super) fn two_row<B: B32, M: NeonBlock<X = B::X, Y = B::Y>>() -> VecDot2x2Fn {
    vec_dot_2x2::<B, M>
}

#[target_feature(enable = "neon")]
unsafe fn q8_block(x: &[f32], qs: &mut [i8; 32]) -> f32 {
    assert_eq!(x.len(), 32);
    // SAFETY: 32 readable floats (asserted) and 32 writable bytes; register arithmetic.
    unsafe {
        let mut m = vabsq_f32(vld1q_f32(x.as_ptr()));
        for k in 1..8 {
            m = vmaxq_f32(m, vabsq_f32(vld1q_f32(x.as_ptr().add(4 * k))));
        }
        let d = vmaxvq_f32(m) / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        for k in 0..8 {
            let q = vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(x.as_ptr().add(4 * k)), id));
            let n16 = vqmovn_s32(q);
            let n8 = vqmovn_s16(vcombine_s16(n16, n16));
            let w = vget_lane_u32::<0>(vreinterpret_u32_s8(n8));
            qs[4 * k..4 * k + 4].copy_from_slice(&w.to_le_bytes().map(|b| b as i8));
        }
        d
    }
}

/// f32 → Q8_0 as ggml's NEON `quantize_row_q8_0` (twin: `neon_order::q8_0_from_f32_neon`).
pub(super) fn q8_0_from_f32(src: &[f32], dst: &mut [u8]) {
    quant_blocks(src, dst, QK, |x, b: &mut BlockQ8_0| {
        // SAFETY: installed only after NEON detection (module docs of `aarch64`).
        let d = unsafe { q8_block(x, &mut b.qs) };
        b.d = to_f16le(d);
    });
}

/// f32 → Q8_1 as ggml's NEON `quantize_row_q8_1` (twin: `neon_order::q8_1_from_f32_neon`).
pub(super) fn q8_1_from_f32(src: &[f32], dst: &mut [u8]) {
    quant_blocks(src, dst, QK, |x, b: &mut BlockQ8_1| {
        // SAFETY: installed only after NEON detection (module docs of `aarch64`).
        let d = unsafe { q8_block(x, &mut b.qs) };
        let sum: i32 = b.qs.iter().map(|&q| q as i32).sum();
        b.d = to_f16le(d);
        b.s = to_f16le(d * sum as f32);
    });
}
