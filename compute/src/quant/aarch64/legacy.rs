//! The 32-element formats on NEON: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL and MXFP4 against their
//! Q8_0 / Q8_1 activations, as one-column (`vec_dot`), four-column (`vec_dot_x4`) and, with i8mm,
//! two-row × two-column (`vec_dot_2x2`) kernels. ref: ggml-compute-semantics.md §2.2, §2.3.
//!
//! Each format says how to decode a block into 32 signed bytes ([`B32::decode`]) and how the
//! reference turns a block's exact integer sum into its f32 term ([`B32::value`], copied from
//! `quant::scalar::legacy` operation for operation); the generic loops below do the rest. The
//! per-column float sums run in block order as the reference's, so every kernel here equals the
//! scalar `vec_dot` bit for bit.

use std::arch::aarch64::*;

use bytemuck::Pod;

use super::dot::*;
use crate::quant::blocks::*;
use crate::quant::{VecDot2x2Fn, VecDotFn, VecDotX4Fn};

/// A 32-element weight format and its activation block.
pub(super) trait B32 {
    /// The weight block.
    type X: Pod;
    /// The activation block (Q8_0 or Q8_1).
    type Y: Pod;
    /// The 32 weights as signed bytes, elements 0..16 and 16..32.
    ///
    /// # Safety
    /// NEON must be enabled in the caller.
    unsafe fn decode(x: &Self::X) -> [int8x16_t; 2];
    /// The activation quants.
    fn qs(y: &Self::Y) -> &[i8; QK];
    /// The reference's f32 term of one block from its exact integer sum `s`.
    fn value(s: i32, x: &Self::X, y: &Self::Y) -> f32;
}

/// The activation quants of `y` as two vectors.
#[inline(always)]
unsafe fn yv<B: B32>(y: &B::Y) -> [int8x16_t; 2] {
    // SAFETY: in-bounds loads (checked in `lds`).
    unsafe { [lds(B::qs(y), 0), lds(B::qs(y), 16)] }
}

/// One column: Σ over blocks of `value(exact sum)`, in block order.
#[inline(always)]
unsafe fn dot1<B: B32, D: Dot>(xs: &[B::X], ys: &[B::Y]) -> f32 {
    // SAFETY: in-bounds loads and register arithmetic (NEON enabled by the callers).
    unsafe {
        let mut sum = 0.0f32;
        for (bx, by) in xs.iter().zip(ys) {
            let [a, b] = B::decode(bx);
            let [u, v] = yv::<B>(by);
            let s = vaddvq_s32(D::dot(D::dot(vdupq_n_s32(0), a, u), b, v));
            sum += B::value(s, bx, by);
        }
        sum
    }
}

/// Four columns sharing each decoded weight block; each column summed as [`dot1`] does.
#[inline(always)]
unsafe fn dot4<B: B32, D: Dot>(xs: &[B::X], ys: [&[B::Y]; 4]) -> [f32; 4] {
    // SAFETY: in-bounds loads and register arithmetic (NEON enabled by the callers); every column
    // has xs.len() blocks (checked by the wrapper).
    unsafe {
        let mut sum = [0.0f32; 4];
        for (i, bx) in xs.iter().enumerate() {
            let [a, b] = B::decode(bx);
            // A loop, not a closure: closures do not inherit the caller's target features.
            let mut p = [vdupq_n_s32(0); 4];
            for c in 0..4 {
                let [u, v] = yv::<B>(&ys[c][i]);
                p[c] = D::dot(D::dot(p[c], a, u), b, v);
            }
            let s = lanes(hsum4(p));
            for c in 0..4 {
                sum[c] += B::value(s[c], bx, &ys[c][i]);
            }
        }
        sum
    }
}

/// Two rows × two columns with `smmla`: `[x0·y0, x0·y1, x1·y0, x1·y1]`, each summed as [`dot1`].
#[inline(always)]
unsafe fn dot2x2<B: B32>(xs: [&[B::X]; 2], ys: [&[B::Y]; 2]) -> [f32; 4] {
    // SAFETY: in-bounds loads and register arithmetic; i8mm is enabled and detected (callers);
    // all four rows have the same block count (checked by the wrapper).
    unsafe {
        let mut sum = [0.0f32; 4];
        for i in 0..xs[0].len() {
            let (x0, x1) = (&xs[0][i], &xs[1][i]);
            let (y0, y1) = (&ys[0][i], &ys[1][i]);
            let t = tile2x2(vdupq_n_s32(0), B::decode(x0), B::decode(x1), yv::<B>(y0), yv::<B>(y1));
            let s = lanes(t);
            sum[0] += B::value(s[0], x0, y0);
            sum[1] += B::value(s[1], x0, y1);
            sum[2] += B::value(s[2], x1, y0);
            sum[3] += B::value(s[3], x1, y1);
        }
        sum
    }
}

/// Checks `n` and the row lengths, returning the block slices.
fn rows<'a, B: B32>(n: usize, x: &'a [u8], y: &'a [u8]) -> (&'a [B::X], &'a [B::Y]) {
    assert_eq!(n % QK, 0, "vec_dot: n = {n} is not a whole number of blocks of {QK}");
    (take_blocks::<B::X>(x, n / QK), take_blocks::<B::Y>(y, n / QK))
}

#[target_feature(enable = "neon")]
unsafe fn dot1_neon<B: B32>(xs: &[B::X], ys: &[B::Y]) -> f32 {
    // SAFETY: NEON is enabled on this fn.
    unsafe { dot1::<B, Plain>(xs, ys) }
}

#[target_feature(enable = "neon,dotprod")]
unsafe fn dot1_sdot<B: B32>(xs: &[B::X], ys: &[B::Y]) -> f32 {
    // SAFETY: NEON and dotprod are enabled on this fn.
    unsafe { dot1::<B, Sdot>(xs, ys) }
}

#[target_feature(enable = "neon")]
unsafe fn dot4_neon<B: B32>(xs: &[B::X], ys: [&[B::Y]; 4]) -> [f32; 4] {
    // SAFETY: NEON is enabled on this fn; the caller checked the column lengths.
    unsafe { dot4::<B, Plain>(xs, ys) }
}

#[target_feature(enable = "neon,dotprod")]
unsafe fn dot4_sdot<B: B32>(xs: &[B::X], ys: [&[B::Y]; 4]) -> [f32; 4] {
    // SAFETY: NEON and dotprod are enabled on this fn; the caller checked the column lengths.
    unsafe { dot4::<B, Sdot>(xs, ys) }
}

#[target_feature(enable = "neon,dotprod,i8mm")]
unsafe fn dot2x2_i8mm<B: B32>(xs: [&[B::X]; 2], ys: [&[B::Y]; 2]) -> [f32; 4] {
    // SAFETY: NEON and i8mm are enabled on this fn; the caller checked the row lengths.
    unsafe { dot2x2::<B>(xs, ys) }
}

/// `vec_dot`, baseline NEON.
fn vec_dot_neon<B: B32>(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let (xs, ys) = rows::<B>(n, x, y);
    // SAFETY: installed only after NEON detection (module docs of `aarch64`).
    unsafe { dot1_neon::<B>(xs, ys) }
}

/// `vec_dot`, dotprod.
fn vec_dot_sdot<B: B32>(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let (xs, ys) = rows::<B>(n, x, y);
    // SAFETY: installed only after NEON and dotprod detection (module docs of `aarch64`).
    unsafe { dot1_sdot::<B>(xs, ys) }
}

/// Checks `n` and the lengths of one weight row and four activation rows.
fn rows4<'a, B: B32>(n: usize, x: &'a [u8], y: [&'a [u8]; 4]) -> (&'a [B::X], [&'a [B::Y]; 4]) {
    assert_eq!(n % QK, 0, "vec_dot_x4: n = {n} is not a whole number of blocks of {QK}");
    (take_blocks::<B::X>(x, n / QK), y.map(|r| take_blocks::<B::Y>(r, n / QK)))
}

/// `vec_dot_x4`, baseline NEON.
fn vec_dot_x4_neon<B: B32>(n: usize, x: &[u8], y: [&[u8]; 4]) -> [f32; 4] {
    let (xs, ys) = rows4::<B>(n, x, y);
    // SAFETY: installed only after NEON detection; every column has n / 32 blocks (checked).
    unsafe { dot4_neon::<B>(xs, ys) }
}

/// `vec_dot_x4`, dotprod.
fn vec_dot_x4_sdot<B: B32>(n: usize, x: &[u8], y: [&[u8]; 4]) -> [f32; 4] {
    let (xs, ys) = rows4::<B>(n, x, y);
    // SAFETY: installed only after NEON and dotprod detection; every column has n / 32 blocks.
    unsafe { dot4_sdot::<B>(xs, ys) }
}

/// `vec_dot_2x2`, i8mm.
fn vec_dot_2x2_i8mm<B: B32>(n: usize, x: [&[u8]; 2], y: [&[u8]; 2]) -> [f32; 4] {
    assert_eq!(n % QK, 0, "vec_dot_2x2: n = {n} is not a whole number of blocks of {QK}");
    let xs = x.map(|r| take_blocks::<B::X>(r, n / QK));
    let ys = y.map(|r| take_blocks::<B::Y>(r, n / QK));
    // SAFETY: installed only after NEON, dotprod and i8mm detection; every row has n / 32 blocks.
    unsafe { dot2x2_i8mm::<B>(xs, ys) }
}

/// The kernels of one format at one level.
pub(super) struct Set {
    pub vec_dot: VecDotFn,
    pub x4: VecDotX4Fn,
    pub two: Option<VecDot2x2Fn>,
}

/// The kernels of `B` for the level (`dotprod`, `i8mm` as detected by the caller).
pub(super) fn set<B: B32>(dotprod: bool, i8mm: bool) -> Set {
    let two = i8mm.then_some(vec_dot_2x2_i8mm::<B> as VecDot2x2Fn);
    if dotprod {
        Set { vec_dot: vec_dot_sdot::<B>, x4: vec_dot_x4_sdot::<B>, two }
    } else {
        Set { vec_dot: vec_dot_neon::<B>, x4: vec_dot_x4_neon::<B>, two }
    }
}

// ---- the formats ----

/// Q4_0 · Q8_0.
pub(super) struct Q40;
/// Q4_1 · Q8_1.
pub(super) struct Q41;
/// Q5_0 · Q8_0.
pub(super) struct Q50;
/// Q5_1 · Q8_1.
pub(super) struct Q51;
/// Q8_0 · Q8_0.
pub(super) struct Q80;
/// IQ4_NL · Q8_0.
pub(super) struct Iq4Nl;
/// MXFP4 · Q8_0.
pub(super) struct Mxfp4;

/// The 5-bit values of a Q5 block (nibbles or'ed with the fifth bits), minus `off`.
#[inline(always)]
unsafe fn q5(qs: &[u8; QK / 2], qh: [u8; 4], off: i8) -> [int8x16_t; 2] {
    // SAFETY: in-bounds loads (checked in `ld`) and register arithmetic under NEON.
    unsafe {
        let h = u32::from_le_bytes(qh);
        let (lo, hi) = nibbles(ld(qs, 0), 0);
        let lo = vorrq_u8(vreinterpretq_u8_s8(lo), bit16(h as u16));
        let hi = vorrq_u8(vreinterpretq_u8_s8(hi), bit16((h >> 16) as u16));
        let o = vdupq_n_s8(off);
        [vsubq_s8(vreinterpretq_s8_u8(lo), o), vsubq_s8(vreinterpretq_s8_u8(hi), o)]
    }
}

impl B32 for Q40 {
    type X = BlockQ4_0;
    type Y = BlockQ8_0;
    #[inline(always)]
    unsafe fn decode(x: &BlockQ4_0) -> [int8x16_t; 2] {
        // SAFETY: in-bounds load (checked in `ld`); register arithmetic.
        let (lo, hi) = unsafe { nibbles(ld(&x.qs, 0), 8) };
        [lo, hi]
    }
    #[inline(always)]
    fn qs(y: &BlockQ8_0) -> &[i8; QK] {
        &y.qs
    }
    #[inline(always)]
    fn value(s: i32, x: &BlockQ4_0, y: &BlockQ8_0) -> f32 {
        s as f32 * h2f(x.d) * h2f(y.d)
    }
}

impl B32 for Q41 {
    type X = BlockQ4_1;
    type Y = BlockQ8_1;
    #[inline(always)]
    unsafe fn decode(x: &BlockQ4_1) -> [int8x16_t; 2] {
        // SAFETY: in-bounds load (checked in `ld`); register arithmetic.
        let (lo, hi) = unsafe { nibbles(ld(&x.qs, 0), 0) };
        [lo, hi]
    }
    #[inline(always)]
    fn qs(y: &BlockQ8_1) -> &[i8; QK] {
        &y.qs
    }
    #[inline(always)]
    fn value(s: i32, x: &BlockQ4_1, y: &BlockQ8_1) -> f32 {
        s as f32 * (h2f(x.d) * h2f(y.d)) + h2f(x.m) * h2f(y.s)
    }
}

impl B32 for Q50 {
    type X = BlockQ5_0;
    type Y = BlockQ8_0;
    #[inline(always)]
    unsafe fn decode(x: &BlockQ5_0) -> [int8x16_t; 2] {
        // SAFETY: register arithmetic and in-bounds loads under NEON.
        unsafe { q5(&x.qs, x.qh, 16) }
    }
    #[inline(always)]
    fn qs(y: &BlockQ8_0) -> &[i8; QK] {
        &y.qs
    }
    #[inline(always)]
    fn value(s: i32, x: &BlockQ5_0, y: &BlockQ8_0) -> f32 {
        s as f32 * h2f(x.d) * h2f(y.d)
    }
}

impl B32 for Q51 {
    type X = BlockQ5_1;
    type Y = BlockQ8_1;
    #[inline(always)]
    unsafe fn decode(x: &BlockQ5_1) -> [int8x16_t; 2] {
        // SAFETY: register arithmetic and in-bounds loads under NEON.
        unsafe { q5(&x.qs, x.qh, 0) }
    }
    #[inline(always)]
    fn qs(y: &BlockQ8_1) -> &[i8; QK] {
        &y.qs
    }
    #[inline(always)]
    fn value(s: i32, x: &BlockQ5_1, y: &BlockQ8_1) -> f32 {
        s as f32 * (h2f(x.d) * h2f(y.d)) + h2f(x.m) * h2f(y.s)
    }
}

impl B32 for Q80 {
    type X = BlockQ8_0;
    type Y = BlockQ8_0;
    #[inline(always)]
    unsafe fn decode(x: &BlockQ8_0) -> [int8x16_t; 2] {
        // SAFETY: in-bounds loads (checked in `lds`).
        unsafe { [lds(&x.qs, 0), lds(&x.qs, 16)] }
    }
    #[inline(always)]
    fn qs(y: &BlockQ8_0) -> &[i8; QK] {
        &y.qs
    }
    #[inline(always)]
    fn value(s: i32, x: &BlockQ8_0, y: &BlockQ8_0) -> f32 {
        s as f32 * h2f(x.d) * h2f(y.d)
    }
}

impl B32 for Iq4Nl {
    type X = BlockIq4Nl;
    type Y = BlockQ8_0;
    #[inline(always)]
    unsafe fn decode(x: &BlockIq4Nl) -> [int8x16_t; 2] {
        // SAFETY: in-bounds load (checked in `ld`); register arithmetic.
        let (lo, hi) = unsafe { nibbles_lut(ld(&x.qs, 0), &KVALUES_IQ4NL) };
        [lo, hi]
    }
    #[inline(always)]
    fn qs(y: &BlockQ8_0) -> &[i8; QK] {
        &y.qs
    }
    #[inline(always)]
    fn value(s: i32, x: &BlockIq4Nl, y: &BlockQ8_0) -> f32 {
        s as f32 * h2f(x.d) * h2f(y.d)
    }
}

impl B32 for Mxfp4 {
    type X = BlockMxfp4;
    type Y = BlockQ8_0;
    #[inline(always)]
    unsafe fn decode(x: &BlockMxfp4) -> [int8x16_t; 2] {
        // SAFETY: in-bounds load (checked in `ld`); register arithmetic.
        let (lo, hi) = unsafe { nibbles_lut(ld(&x.qs, 0), &KVALUES_MXFP4) };
        [lo, hi]
    }
    #[inline(always)]
    fn qs(y: &BlockQ8_0) -> &[i8; QK] {
        &y.qs
    }
    #[inline(always)]
    fn value(s: i32, x: &BlockMxfp4, y: &BlockQ8_0) -> f32 {
        s as f32 * e8m0_half(x.e) * h2f(y.d)
    }
}
