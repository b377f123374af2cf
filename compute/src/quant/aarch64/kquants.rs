//! The 256-element formats on NEON: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS against Q8_K, as
//! one-column, four-column and (i8mm) two-row × two-column kernels; the grid IQ types and TQ1_0/TQ2_0
//! use the same loops with their decoders in [`super::iq`].
//! ref: ggml-compute-semantics.md §2.2, §2.3.
//!
//! Each format decodes a super-block into 16 groups of 16 signed weights with one integer scale
//! per group (formats with 32-element sub-blocks repeat the scale) and, for the formats with mins,
//! one integer min per group ([`KBlock::decode`]). The integer sums `Σ scale·(q·y)` and
//! `Σ min·bsum` are exact whatever the lane layout, and [`KBlock::value`] applies the reference's
//! float steps (`quant::scalar::kquants`) in its order, so every kernel equals the scalar `vec_dot`
//! bit for bit.

use std::arch::aarch64::*;

use bytemuck::Pod;

use super::dot::*;
use crate::dtype::QK_K;
use crate::quant::blocks::*;
use crate::quant::scalar::k4_scales;
use crate::quant::{VecDot2x2Fn, VecDotFn, VecDotX4Fn};

/// A decoded super-block.
pub(super) struct Decoded {
    /// The 256 weights, 16 per vector, in element order.
    pub q: [int8x16_t; 16],
    /// The integer scale of each group of 16.
    pub sc: [i32; 16],
    /// The integer min of each group of 16 (zero for the symmetric formats).
    pub mn: [i32; 16],
}

/// A 256-element weight format (activations are Q8_K).
pub(super) trait KBlock {
    /// The weight block.
    type X: Pod;
    /// Whether the format has mins (the `Σ min·bsum` term).
    const MINS: bool;
    /// Whether scales (and mins) come per 32 elements (groups 2j and 2j+1 share them), so the
    /// kernels scale pairs of groups at once.
    const PER32: bool;
    /// A factor of the whole row's sum, applied once after the blocks are summed (the grid types'
    /// per-type constant `C`, as `quant::scalar::iq::IqSpec::dot` applies it); 1 for the K-quants.
    const C: f32 = 1.0;
    /// Decodes one block.
    ///
    /// # Safety
    /// NEON must be enabled in the caller.
    unsafe fn decode(x: &Self::X) -> Decoded;
    /// The reference's f32 term of one block from the exact `isc = Σ scale·(q·y)` and
    /// `imn = Σ min·bsum`.
    fn value(isc: i32, imn: i32, x: &Self::X, y: &BlockQ8K) -> f32;
    /// The running sum after one block: the reference's `sum + value` unless the format follows
    /// another order ([`Ggml`]).
    #[inline(always)]
    fn step(sum: f32, isc: i32, imn: i32, x: &Self::X, y: &BlockQ8K) -> f32 {
        sum + Self::value(isc, imn, x, y)
    }
    /// Whether the format folds a decoded block into the running sum by its own [`KBlock::fold`]
    /// (ggml's NEON order of the grid IQ types needs more than the block's one integer sum); the
    /// one- and four-column loops then call it per column.
    const FOLD: bool = false;
    /// The running sum after one decoded block `d` of `x` against `y`: by default the exact
    /// `isc` and `imn` folded in by [`KBlock::step`].
    ///
    /// # Safety
    /// NEON must be enabled in the caller, and dotprod when `D` is [`Sdot`].
    #[inline(always)]
    unsafe fn fold<D: Dot>(sum: f32, d: &Decoded, x: &Self::X, y: &BlockQ8K) -> f32
    where
        Self: Sized,
    {
        // SAFETY: forwarded contract.
        let isc = unsafe { vaddvq_s32(scaled::<Self, D>(d, y)) };
        Self::step(sum, isc, mins::<Self>(d, y), x, y)
    }
}

/// A K-quant in ggml's NEON order (the `neon-dotprod` / `neon-i8mm` tables): the same decoder and
/// exact integer sums, folded into the running sum by ggml's float step
/// (`quant::scalar::neon_order::neon_step_*`, whose twins are the `vec_dot_*_neon` there).
pub(super) struct Ggml<B>(std::marker::PhantomData<B>);

/// ggml's NEON float step of a format.
pub(super) trait GgmlStep: KBlock {
    /// The running sum after one block.
    fn ggml_step(sum: f32, isc: i32, imn: i32, x: &Self::X, y: &BlockQ8K) -> f32;
}

impl<B: GgmlStep> KBlock for Ggml<B> {
    type X = B::X;
    const MINS: bool = B::MINS;
    const PER32: bool = B::PER32;
    #[inline(always)]
    unsafe fn decode(x: &B::X) -> Decoded {
        // SAFETY: forwarded contract.
        unsafe { B::decode(x) }
    }
    fn value(isc: i32, imn: i32, x: &B::X, y: &BlockQ8K) -> f32 {
        B::value(isc, imn, x, y)
    }
    #[inline(always)]
    fn step(sum: f32, isc: i32, imn: i32, x: &B::X, y: &BlockQ8K) -> f32 {
        B::ggml_step(sum, isc, imn, x, y)
    }
}

/// A K-quant's two-row kernel in ggml's i8mm order (`neon-i8mm`; Q4_K and Q6_K, the formats ggml
/// has `smmla` kernels for): the exact sums of the two-row loop folded into each output's running
/// sum by the float step of ggml's `nrc == 2` kernel (`quant::scalar::neon_order::mmla_step_*`,
/// twins `vec_dot_2x2_q4_k_q8_k_neon` / `vec_dot_2x2_q6_k_q8_k_neon`). Each output is its own lane:
/// the pairing of rows and columns does not change its bits.
/// `SVE`: the step of ggml's SVE build's `svmmla` kernel instead (the `sve` profile; twins
/// `vec_dot_2x2_q4_k_q8_k_sve` / `vec_dot_2x2_q6_k_q8_k_sve`).
pub(super) struct GgmlMmla<B, const SVE: bool = false>(std::marker::PhantomData<B>);

/// ggml's i8mm two-row float steps of a format.
pub(super) trait GgmlMmlaStep: KBlock {
    /// The running sum of one output after one block (NEON `smmla` kernel).
    fn mmla_step(sum: f32, isc: i32, imn: i32, x: &Self::X, y: &BlockQ8K) -> f32;
    /// The same for the SVE build's `svmmla` kernel.
    fn sve_mmla_step(sum: f32, isc: i32, imn: i32, x: &Self::X, y: &BlockQ8K) -> f32;
}

impl<B: GgmlMmlaStep, const SVE: bool> KBlock for GgmlMmla<B, SVE> {
    type X = B::X;
    const MINS: bool = B::MINS;
    const PER32: bool = B::PER32;
    #[inline(always)]
    unsafe fn decode(x: &B::X) -> Decoded {
        // SAFETY: forwarded contract.
        unsafe { B::decode(x) }
    }
    fn value(isc: i32, imn: i32, x: &B::X, y: &BlockQ8K) -> f32 {
        B::value(isc, imn, x, y)
    }
    #[inline(always)]
    fn step(sum: f32, isc: i32, imn: i32, x: &B::X, y: &BlockQ8K) -> f32 {
        if SVE {
            B::sve_mmla_step(sum, isc, imn, x, y)
        } else {
            B::mmla_step(sum, isc, imn, x, y)
        }
    }
}

mod ggml_steps {
    use super::*;
    use crate::quant::scalar::neon_order as no;

    impl GgmlStep for Q2K {
        fn ggml_step(sum: f32, isc: i32, imn: i32, x: &BlockQ2K, y: &BlockQ8K) -> f32 {
            no::neon_step_q2k(sum, isc, imn, h2f(x.d), h2f(x.dmin), dy(y))
        }
    }
    impl GgmlStep for Q3K {
        fn ggml_step(sum: f32, isc: i32, _imn: i32, x: &BlockQ3K, y: &BlockQ8K) -> f32 {
            no::neon_step_q3k(sum, isc, h2f(x.d), dy(y))
        }
    }
    impl GgmlStep for Q4K {
        fn ggml_step(sum: f32, isc: i32, imn: i32, x: &BlockQ4K, y: &BlockQ8K) -> f32 {
            no::neon_step_q4k(sum, isc, imn, h2f(x.d), h2f(x.dmin), dy(y))
        }
    }
    impl GgmlStep for Q5K {
        fn ggml_step(sum: f32, isc: i32, imn: i32, x: &BlockQ5K, y: &BlockQ8K) -> f32 {
            no::neon_step_q5k(sum, isc, imn, h2f(x.d), h2f(x.dmin), dy(y))
        }
    }
    impl GgmlStep for Iq4Xs {
        fn ggml_step(sum: f32, isc: i32, _imn: i32, x: &BlockIq4Xs, y: &BlockQ8K) -> f32 {
            no::neon_step_q6k(sum, isc, h2f(x.d), dy(y))
        }
    }
    impl GgmlStep for Q6K {
        fn ggml_step(sum: f32, isc: i32, _imn: i32, x: &BlockQ6K, y: &BlockQ8K) -> f32 {
            no::neon_step_q6k(sum, isc, h2f(x.d), dy(y))
        }
    }
    impl GgmlMmlaStep for Q4K {
        fn mmla_step(sum: f32, isc: i32, imn: i32, x: &BlockQ4K, y: &BlockQ8K) -> f32 {
            no::mmla_step_q4k(sum, isc, imn, h2f(x.d), h2f(x.dmin), dy(y))
        }
        fn sve_mmla_step(sum: f32, isc: i32, imn: i32, x: &BlockQ4K, y: &BlockQ8K) -> f32 {
            no::sve_mmla_step_q4k(sum, isc, imn, h2f(x.d), h2f(x.dmin), dy(y))
        }
    }
    impl GgmlMmlaStep for Q6K {
        fn mmla_step(sum: f32, isc: i32, _imn: i32, x: &BlockQ6K, y: &BlockQ8K) -> f32 {
            no::mmla_step_q6k(sum, isc, h2f(x.d), dy(y))
        }
        fn sve_mmla_step(sum: f32, isc: i32, _imn: i32, x: &BlockQ6K, y: &BlockQ8K) -> f32 {
            no::sve_mmla_step_q6k(sum, isc, h2f(x.d), dy(y))
        }
    }
}

#[inline(always)]
fn bsum(b: &BlockQ8K, g: usize) -> i32 {
    i16::from_le_bytes(b.bsums[g]) as i32
}

#[inline(always)]
pub(super) fn dy(b: &BlockQ8K) -> f32 {
    f32::from_le_bytes(b.d)
}

/// `Σ min·bsum` of one column.
#[inline(always)]
pub(super) fn mins<B: KBlock>(d: &Decoded, y: &BlockQ8K) -> i32 {
    if B::MINS {
        (0..16).map(|g| d.mn[g] * bsum(y, g)).sum()
    } else {
        0
    }
}

/// The scaled lane sums `Σ_g scale_g · (q_g · y_g)` of one column (exact in every lane).
#[inline(always)]
pub(super) unsafe fn scaled<B: KBlock, D: Dot>(d: &Decoded, y: &BlockQ8K) -> int32x4_t {
    // SAFETY: in-bounds loads (checked in `lds`) and register arithmetic under NEON.
    unsafe {
        let mut acc = vdupq_n_s32(0);
        if B::PER32 {
            for g in (0..16).step_by(2) {
                let p = D::dot(vdupq_n_s32(0), d.q[g], lds(&y.qs, 16 * g));
                let p = D::dot(p, d.q[g + 1], lds(&y.qs, 16 * g + 16));
                acc = vmlaq_n_s32(acc, p, d.sc[g]);
            }
        } else {
            for g in 0..16 {
                let p = D::dot(vdupq_n_s32(0), d.q[g], lds(&y.qs, 16 * g));
                acc = vmlaq_n_s32(acc, p, d.sc[g]);
            }
        }
        acc
    }
}

#[inline(always)]
unsafe fn dot1<B: KBlock, D: Dot>(xs: &[B::X], ys: &[BlockQ8K]) -> f32 {
    // SAFETY: register arithmetic and checked loads under NEON (enabled by the callers).
    unsafe {
        let mut sum = 0.0f32;
        for (bx, by) in xs.iter().zip(ys) {
            let d = B::decode(bx);
            sum = B::fold::<D>(sum, &d, bx, by);
        }
        B::C * sum
    }
}

#[inline(always)]
unsafe fn dot4<B: KBlock, D: Dot>(xs: &[B::X], ys: [&[BlockQ8K]; 4]) -> [f32; 4] {
    // SAFETY: register arithmetic and checked loads under NEON (enabled by the callers); every
    // column has xs.len() blocks (checked by the wrapper).
    unsafe {
        let mut sum = [0.0f32; 4];
        for (i, bx) in xs.iter().enumerate() {
            let d = B::decode(bx);
            if B::FOLD {
                for c in 0..4 {
                    sum[c] = B::fold::<D>(sum[c], &d, bx, &ys[c][i]);
                }
                continue;
            }
            // A loop, not a closure: closures do not inherit the caller's target features.
            let mut p = [vdupq_n_s32(0); 4];
            for c in 0..4 {
                p[c] = scaled::<B, D>(&d, &ys[c][i]);
            }
            let s = lanes(hsum4(p));
            for c in 0..4 {
                let by = &ys[c][i];
                sum[c] = B::step(sum[c], s[c], mins::<B>(&d, by), bx, by);
            }
        }
        sum.map(|v| B::C * v)
    }
}

#[inline(always)]
unsafe fn dot2x2<B: KBlock>(xs: [&[B::X]; 2], ys: [&[BlockQ8K]; 2]) -> [f32; 4] {
    // SAFETY: register arithmetic and checked loads; i8mm is enabled and detected (callers); all
    // rows have xs[0].len() blocks (checked by the wrapper).
    unsafe {
        let mut sum = [0.0f32; 4];
        for i in 0..xs[0].len() {
            let (x0, x1) = (&xs[0][i], &xs[1][i]);
            let (y0, y1) = (&ys[0][i], &ys[1][i]);
            let (d0, d1) = (B::decode(x0), B::decode(x1));
            let mut acc = vdupq_n_s32(0);
            let step = if B::PER32 { 2 } else { 1 };
            for g in (0..16).step_by(step) {
                let mut t = vdupq_n_s32(0);
                for h in g..g + step {
                    t = tile16(t, d0.q[h], d1.q[h], lds(&y0.qs, 16 * h), lds(&y1.qs, 16 * h));
                }
                let sc = [d0.sc[g], d0.sc[g], d1.sc[g], d1.sc[g]];
                acc = vmlaq_s32(acc, t, vld1q_s32(sc.as_ptr()));
            }
            let s = lanes(acc);
            sum[0] = B::step(sum[0], s[0], mins::<B>(&d0, y0), x0, y0);
            sum[1] = B::step(sum[1], s[1], mins::<B>(&d0, y1), x0, y1);
            sum[2] = B::step(sum[2], s[2], mins::<B>(&d1, y0), x1, y0);
            sum[3] = B::step(sum[3], s[3], mins::<B>(&d1, y1), x1, y1);
        }
        sum.map(|v| B::C * v)
    }
}

#[target_feature(enable = "neon")]
unsafe fn dot1_neon<B: KBlock>(xs: &[B::X], ys: &[BlockQ8K]) -> f32 {
    // SAFETY: NEON is enabled on this fn.
    unsafe { dot1::<B, Plain>(xs, ys) }
}

#[target_feature(enable = "neon,dotprod")]
unsafe fn dot1_sdot<B: KBlock>(xs: &[B::X], ys: &[BlockQ8K]) -> f32 {
    // SAFETY: NEON and dotprod are enabled on this fn.
    unsafe { dot1::<B, Sdot>(xs, ys) }
}

#[target_feature(enable = "neon")]
unsafe fn dot4_neon<B: KBlock>(xs: &[B::X], ys: [&[BlockQ8K]; 4]) -> [f32; 4] {
    // SAFETY: NEON is enabled on this fn; the caller checked the column lengths.
    unsafe { dot4::<B, Plain>(xs, ys) }
}

#[target_feature(enable = "neon,dotprod")]
unsafe fn dot4_sdot<B: KBlock>(xs: &[B::X], ys: [&[BlockQ8K]; 4]) -> [f32; 4] {
    // SAFETY: NEON and dotprod are enabled on this fn; the caller checked the column lengths.
    unsafe { dot4::<B, Sdot>(xs, ys) }
}

#[target_feature(enable = "neon,dotprod,i8mm")]
unsafe fn dot2x2_i8mm<B: KBlock>(xs: [&[B::X]; 2], ys: [&[BlockQ8K]; 2]) -> [f32; 4] {
    // SAFETY: NEON and i8mm are enabled on this fn; the caller checked the row lengths.
    unsafe { dot2x2::<B>(xs, ys) }
}

fn rows<'a, B: KBlock>(n: usize, x: &'a [u8], y: &'a [u8]) -> (&'a [B::X], &'a [BlockQ8K]) {
    assert_eq!(n % QK_K, 0, "vec_dot: n = {n} is not a whole number of blocks of {QK_K}");
    (take_blocks::<B::X>(x, n / QK_K), take_blocks::<BlockQ8K>(y, n / QK_K))
}

fn rows4<'a, B: KBlock>(n: usize, x: &'a [u8], y: [&'a [u8]; 4]) -> (&'a [B::X], [&'a [BlockQ8K]; 4]) {
    assert_eq!(n % QK_K, 0, "vec_dot_x4: n = {n} is not a whole number of blocks of {QK_K}");
    (take_blocks::<B::X>(x, n / QK_K), y.map(|r| take_blocks::<BlockQ8K>(r, n / QK_K)))
}

/// `vec_dot`, baseline NEON.
fn vec_dot_neon<B: KBlock>(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let (xs, ys) = rows::<B>(n, x, y);
    // SAFETY: installed only after NEON detection (module docs of `aarch64`).
    unsafe { dot1_neon::<B>(xs, ys) }
}

/// `vec_dot`, dotprod.
fn vec_dot_sdot<B: KBlock>(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let (xs, ys) = rows::<B>(n, x, y);
    // SAFETY: installed only after NEON and dotprod detection (module docs of `aarch64`).
    unsafe { dot1_sdot::<B>(xs, ys) }
}

/// `vec_dot_x4`, baseline NEON.
fn vec_dot_x4_neon<B: KBlock>(n: usize, x: &[u8], y: [&[u8]; 4]) -> [f32; 4] {
    let (xs, ys) = rows4::<B>(n, x, y);
    // SAFETY: installed only after NEON detection; every column has n / 256 blocks (checked).
    unsafe { dot4_neon::<B>(xs, ys) }
}

/// `vec_dot_x4`, dotprod.
fn vec_dot_x4_sdot<B: KBlock>(n: usize, x: &[u8], y: [&[u8]; 4]) -> [f32; 4] {
    let (xs, ys) = rows4::<B>(n, x, y);
    // SAFETY: installed only after NEON and dotprod detection; every column has n / 256 blocks.
    unsafe { dot4_sdot::<B>(xs, ys) }
}

/// `vec_dot_2x2`, i8mm.
fn vec_dot_2x2_i8mm<B: KBlock>(n: usize, x: [&[u8]; 2], y: [&[u8]; 2]) -> [f32; 4] {
    assert_eq!(n % QK_K, 0, "vec_dot_2x2: n = {n} is not a whole number of blocks of {QK_K}");
    let xs = x.map(|r| take_blocks::<B::X>(r, n / QK_K));
    let ys = y.map(|r| take_blocks::<BlockQ8K>(r, n / QK_K));
    // SAFETY: installed only after NEON, dotprod and i8mm detection; every row has n / 256 blocks.
    unsafe { dot2x2_i8mm::<B>(xs, ys) }
}

/// The i8mm two-row kernel of `B` alone (for [`GgmlMmla`]; the caller installs it only where i8mm
/// was detected).
pub(super) fn two_row<B: KBlock>() -> VecDot2x2Fn {
    vec_dot_2x2_i8mm::<B>
}

/// The kernels of `B` for the level (`dotprod`, `i8mm` as detected by the caller).
pub(super) fn set<B: KBlock>(dotprod: bool, i8mm: bool) -> (VecDotFn, VecDotX4Fn, Option<VecDot2x2Fn>) {
    // The 2×2 tile folds by `step`, so a format with its own fold has no two-row kernel.
    let two = (i8mm && !B::FOLD).then_some(vec_dot_2x2_i8mm::<B> as VecDot2x2Fn);
    if dotprod {
        (vec_dot_sdot::<B>, vec_dot_x4_sdot::<B>, two)
    } else {
        (vec_dot_neon::<B>, vec_dot_x4_neon::<B>, two)
    }
}

// ---- the formats ----

/// Q2_K.
pub(super) struct Q2K;
/// Q3_K.
pub(super) struct Q3K;
/// Q4_K.
pub(super) struct Q4K;
/// Q5_K.
pub(super) struct Q5K;
/// Q6_K.
pub(super) struct Q6K;
/// IQ4_XS.
pub(super) struct Iq4Xs;

/// Bits `2j..2j+2` of every byte of `v`.
#[inline(always)]
unsafe fn crumb(v: uint8x16_t, j: usize) -> uint8x16_t {
    // SAFETY: register arithmetic under NEON.
    unsafe { vandq_u8(vshlq_u8(v, vdupq_n_s8(-2 * j as i8)), vdupq_n_u8(3)) }
}

/// `0x10` in every byte of `v` that has bit `bit` set.
#[inline(always)]
unsafe fn fifth(v: uint8x16_t, bit: usize) -> uint8x16_t {
    // SAFETY: register arithmetic under NEON.
    unsafe { vandq_u8(vtstq_u8(v, vdupq_n_u8(1 << bit)), vdupq_n_u8(0x10)) }
}

/// The shared value of Q2_K, Q4_K and Q5_K (ref: §2.3, `dy·d·isc − dy·dmin·imn`).
#[inline(always)]
fn value_with_mins(isc: i32, imn: i32, d: [u8; 2], dmin: [u8; 2], y: &BlockQ8K) -> f32 {
    let dy = dy(y);
    dy * h2f(d) * isc as f32 - dy * h2f(dmin) * imn as f32
}

impl KBlock for Q2K {
    type X = BlockQ2K;
    const MINS: bool = true;
    const PER32: bool = false;
    #[inline(always)]
    unsafe fn decode(x: &BlockQ2K) -> Decoded {
        // SAFETY: checked loads (`ld`) and register arithmetic under NEON.
        unsafe {
            let zero = vdupq_n_s8(0);
            let mut q = [zero; 16];
            for n in 0..2 {
                let (q0, q1) = (ld(&x.qs, 32 * n), ld(&x.qs, 32 * n + 16));
                for j in 0..4 {
                    q[8 * n + 2 * j] = vreinterpretq_s8_u8(crumb(q0, j));
                    q[8 * n + 2 * j + 1] = vreinterpretq_s8_u8(crumb(q1, j));
                }
            }
            let sc = std::array::from_fn(|g| (x.scales[g] & 0xF) as i32);
            let mn = std::array::from_fn(|g| (x.scales[g] >> 4) as i32);
            Decoded { q, sc, mn }
        }
    }
    #[inline(always)]
    fn value(isc: i32, imn: i32, x: &BlockQ2K, y: &BlockQ8K) -> f32 {
        value_with_mins(isc, imn, x.d, x.dmin, y)
    }
}

impl KBlock for Q3K {
    type X = BlockQ3K;
    const MINS: bool = false;
    const PER32: bool = false;
    #[inline(always)]
    unsafe fn decode(x: &BlockQ3K) -> Decoded {
        // SAFETY: checked loads (`ld`) and register arithmetic under NEON.
        unsafe {
            let zero = vdupq_n_s8(0);
            let mut q = [zero; 16];
            let hm = [ld(&x.hmask, 0), ld(&x.hmask, 16)];
            let four = vdupq_n_u8(4);
            for n in 0..2 {
                let qv = [ld(&x.qs, 32 * n), ld(&x.qs, 32 * n + 16)];
                for j in 0..4 {
                    let bit = vdupq_n_u8(1 << (4 * n + j));
                    for h in 0..2 {
                        // q = low 2 bits − (high bit clear ? 4 : 0).
                        let sub = vbicq_u8(four, vtstq_u8(hm[h], bit));
                        q[8 * n + 2 * j + h] =
                            vsubq_s8(vreinterpretq_s8_u8(crumb(qv[h], j)), vreinterpretq_s8_u8(sub));
                    }
                }
            }
            let s = q3k_scales(&x.scales);
            Decoded { q, sc: s.map(|v| v as i32), mn: [0; 16] }
        }
    }
    #[inline(always)]
    fn value(isc: i32, _imn: i32, x: &BlockQ3K, y: &BlockQ8K) -> f32 {
        dy(y) * h2f(x.d) * isc as f32
    }
}

/// Q4_K / Q5_K nibbles: chunk `c` gives groups 4c..4c+4 (low nibbles of bytes 0..16, 16..32,
/// then the high nibbles).
#[inline(always)]
unsafe fn k4_nibbles(qs: &[u8; QK_K / 2]) -> [int8x16_t; 16] {
    // SAFETY: checked loads (`ld`) and register arithmetic under NEON.
    unsafe {
        let mut q = [vdupq_n_s8(0); 16];
        for c in 0..4 {
            let (l0, h0) = nibbles(ld(qs, 32 * c), 0);
            let (l1, h1) = nibbles(ld(qs, 32 * c + 16), 0);
            q[4 * c] = l0;
            q[4 * c + 1] = l1;
            q[4 * c + 2] = h0;
            q[4 * c + 3] = h1;
        }
        q
    }
}

/// Per-16 scales and mins of Q4_K / Q5_K (each 32-element pair repeated).
#[inline(always)]
fn k4_sc_mn(s: &[u8; 12]) -> ([i32; 16], [i32; 16]) {
    let sm = k4_scales(s);
    (std::array::from_fn(|g| sm[g / 2].0 as i32), std::array::from_fn(|g| sm[g / 2].1 as i32))
}

impl KBlock for Q4K {
    type X = BlockQ4K;
    const MINS: bool = true;
    const PER32: bool = true;
    #[inline(always)]
    unsafe fn decode(x: &BlockQ4K) -> Decoded {
        let (sc, mn) = k4_sc_mn(&x.scales);
        // SAFETY: NEON is enabled in the caller.
        Decoded { q: unsafe { k4_nibbles(&x.qs) }, sc, mn }
    }
    #[inline(always)]
    fn value(isc: i32, imn: i32, x: &BlockQ4K, y: &BlockQ8K) -> f32 {
        value_with_mins(isc, imn, x.d, x.dmin, y)
    }
}

impl KBlock for Q5K {
    type X = BlockQ5K;
    const MINS: bool = true;
    const PER32: bool = true;
    #[inline(always)]
    unsafe fn decode(x: &BlockQ5K) -> Decoded {
        let (sc, mn) = k4_sc_mn(&x.scales);
        // SAFETY: checked loads (`ld`) and register arithmetic under NEON.
        unsafe {
            let mut q = k4_nibbles(&x.qs);
            let qh = [ld(&x.qh, 0), ld(&x.qh, 16)];
            for c in 0..4 {
                for (k, bit) in [(0, 2 * c), (2, 2 * c + 1)] {
                    for h in 0..2 {
                        let v = &mut q[4 * c + k + h];
                        *v = vorrq_s8(*v, vreinterpretq_s8_u8(fifth(qh[h], bit)));
                    }
                }
            }
            Decoded { q, sc, mn }
        }
    }
    #[inline(always)]
    fn value(isc: i32, imn: i32, x: &BlockQ5K, y: &BlockQ8K) -> f32 {
        value_with_mins(isc, imn, x.d, x.dmin, y)
    }
}

/// Q6_K quants (minus 32) of 16 elements: low nibble or high nibble of `l`, two bits of `h`.
#[inline(always)]
unsafe fn q6(l: uint8x16_t, h: uint8x16_t, high_nibble: bool, hshift: i32) -> int8x16_t {
    // SAFETY: register arithmetic under NEON.
    unsafe {
        let low = if high_nibble { vshrq_n_u8::<4>(l) } else { vandq_u8(l, vdupq_n_u8(0x0F)) };
        let hb = vandq_u8(vshlq_u8(h, vdupq_n_s8(-hshift as i8)), vdupq_n_u8(3));
        let q = vorrq_u8(low, vshlq_n_u8::<4>(hb));
        vsubq_s8(vreinterpretq_s8_u8(q), vdupq_n_s8(32))
    }
}

impl KBlock for Q6K {
    type X = BlockQ6K;
    const MINS: bool = false;
    const PER32: bool = false;
    #[inline(always)]
    unsafe fn decode(x: &BlockQ6K) -> Decoded {
        // SAFETY: checked loads (`ld`) and register arithmetic under NEON.
        unsafe {
            let mut q = [vdupq_n_s8(0); 16];
            for n in 0..2 {
                for i in 0..2 {
                    let l0 = ld(&x.ql, 64 * n + 16 * i);
                    let l1 = ld(&x.ql, 64 * n + 32 + 16 * i);
                    let h = ld(&x.qh, 32 * n + 16 * i);
                    // Element n·128 + 32k + 16i + l is group 8n + 2k + i.
                    q[8 * n + i] = q6(l0, h, false, 0);
                    q[8 * n + 2 + i] = q6(l1, h, false, 2);
                    q[8 * n + 4 + i] = q6(l0, h, true, 4);
                    q[8 * n + 6 + i] = q6(l1, h, true, 6);
                }
            }
            Decoded { q, sc: x.scales.map(|v| v as i32), mn: [0; 16] }
        }
    }
    #[inline(always)]
    fn value(isc: i32, _imn: i32, x: &BlockQ6K, y: &BlockQ8K) -> f32 {
        dy(y) * h2f(x.d) * isc as f32
    }
}

impl KBlock for Iq4Xs {
    type X = BlockIq4Xs;
    const MINS: bool = false;
    const PER32: bool = true;
    #[inline(always)]
    unsafe fn decode(x: &BlockIq4Xs) -> Decoded {
        // SAFETY: checked loads (`ld`) and register arithmetic under NEON.
        unsafe {
            let mut q = [vdupq_n_s8(0); 16];
            for ib in 0..8 {
                let (lo, hi) = nibbles_lut(ld(&x.qs, 16 * ib), &KVALUES_IQ4NL);
                q[2 * ib] = lo;
                q[2 * ib + 1] = hi;
            }
            let sc = std::array::from_fn(|g| iq4xs_scale(x, g / 2) - 32);
            Decoded { q, sc, mn: [0; 16] }
        }
    }
    #[inline(always)]
    fn value(isc: i32, _imn: i32, x: &BlockIq4Xs, y: &BlockQ8K) -> f32 {
        dy(y) * h2f(x.d) * isc as f32
    }
}

/// Q2_K's one-row dot in ggml's SVE order for `L` = 4 or 8 f32 lanes (twin:
/// `scalar::sve_quant::vec_dot_q2_k_q8_k_sve`, whose module docs give the order): the exact lane
/// sums of the 128-bit layout (`L` = 4, [`scaled`]'s lanes) or of the 256-bit one (even groups in
/// lanes 0..4, odd ones in 4..8), folded per super-block by two fused steps.
#[target_feature(enable = "neon,dotprod")]
unsafe fn q2_k_sve_dot<const L: usize>(xs: &[BlockQ2K], ys: &[BlockQ8K]) -> f32 {
    // SAFETY: register arithmetic and checked loads under NEON + dotprod (enabled here; the
    // installer checked both).
    unsafe {
        let mut acc = [vdupq_n_f32(0.0); 2];
        for (bx, by) in xs.iter().zip(ys) {
            let dec = Q2K::decode(bx);
            let yd = dy(by);
            let (d, dmin) = (yd * h2f(bx.d), -yd * h2f(bx.dmin));
            let m = |g: usize| dec.mn[g] * bsum(by, g);
            let (mins, sums) = if L == 4 {
                let mins: [i32; 4] = std::array::from_fn(|l| m(l) + m(4 + l) + m(8 + l) + m(12 + l));
                ([vld1q_s32(mins.as_ptr()), vdupq_n_s32(0)], [scaled::<Q2K, Sdot>(&dec, by), vdupq_n_s32(0)])
            } else {
                let mins: [i32; 8] = std::array::from_fn(|l| m(l) + m(8 + l));
                let mut sums = [vdupq_n_s32(0); 2];
                for g in 0..16 {
                    let p = Sdot::dot(vdupq_n_s32(0), dec.q[g], lds(&by.qs, 16 * g));
                    sums[g % 2] = vmlaq_n_s32(sums[g % 2], p, dec.sc[g]);
                }
                ([vld1q_s32(mins.as_ptr()), vld1q_s32(mins.as_ptr().add(4))], sums)
            };
            for h in 0..L / 4 {
                acc[h] = vfmaq_n_f32(acc[h], vcvtq_f32_s32(mins[h]), dmin);
                acc[h] = vfmaq_n_f32(acc[h], vcvtq_f32_s32(sums[h]), d);
            }
        }
        super::sve_float::faddv(&acc[..L / 4])
    }
}

fn q2_k_sve<const L: usize>(n: usize, x: &[u8], y: &[u8]) -> f32 {
    assert_eq!(n % QK_K, 0, "vec_dot: n = {n} is not a whole number of blocks of {QK_K}");
    let (xs, ys) = (take_blocks::<BlockQ2K>(x, n / QK_K), take_blocks::<BlockQ8K>(y, n / QK_K));
    // SAFETY: installed only after NEON and dotprod detection (`q2_k_sve_kernel`).
    unsafe { q2_k_sve_dot::<L>(xs, ys) }
}

fn q2_k_sve_x4<const L: usize>(n: usize, x: &[u8], y: [&[u8]; 4]) -> [f32; 4] {
    y.map(|c| q2_k_sve::<L>(n, x, c))
}

/// Q2_K's SVE-order one-row dot (and its four-column form, each column in that order) for `w` f32
/// lanes per SVE vector (4, 8 or 16); `None` for another length or without dotprod.
pub(super) fn q2_k_sve_kernel(w: usize) -> Option<(VecDotFn, VecDotX4Fn)> {
    if !std::arch::is_aarch64_feature_detected!("dotprod") {
        return None;
    }
    match w {
        4 => Some((q2_k_sve::<4>, q2_k_sve_x4::<4>)),
        8 | 16 => Some((q2_k_sve::<8>, q2_k_sve_x4::<8>)),
        _ => None,
    }
}
