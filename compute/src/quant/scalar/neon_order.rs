//! Scalar models of ggml's aarch64 NEON arithmetic (ggml-cpu/arch/arm/quants.c built with dotprod,
//! as llama.cpp's armv8.2-a+dotprod CPU variant runs it): the twins of the `neon-dotprod` /
//! `neon-i8mm` kernels in `quant::aarch64::ggml` and portable, so the order can be tested anywhere.
//!
//! What differs from the reference kernels of [`super::legacy`]:
//! - Q8_0 / Q8_1 activations round `x * (1/d)` half to even (`fcvtns`), not half away from zero.
//! - A legacy dot product (`nrc == 1`) takes blocks two at a time. Each block's integer products go
//!   to four lanes (`sdot`: lane `l` holds elements `4l..4l+4` and `16+4l..16+4l+4`); a lane's sum,
//!   converted to f32, is multiplied by `d_x·d_y` and added to that lane of an accumulator, one
//!   accumulator for the even blocks and one for the odd ones, multiply and add rounded separately
//!   (`vmlaq_n_f32` is `fmul` + `fadd`). The result is `hadd(acc0) + hadd(acc1)` (`hadd(v) =
//!   (v0 + v1) + (v2 + v3)`, `faddp` twice), plus the Q4_1 / Q5_1 offset terms, and a last odd block
//!   is added as the generic C loop does.
//! - ggml is compiled with `-std=gnu11`, so GCC contracts the scalar `a*b + c` of the offset terms and
//!   of the last block into `fmadd`; where it does (read off the aarch64 disassembly of the reference
//!   built by tests/peer/build-peer-aarch64.sh) the models use `mul_add`.
//! - With two or more activation rows ggml hands Q4_0 and Q8_0 to llamafile's `tinyBLAS_Q0_ARM`: the
//!   same lane products, but one accumulator over all blocks and one `hadd` ([`gemm_q0_blocks`]).
//!   Only without i8mm and SVE: ggml-cpu.c turns llamafile off when either is enabled.
//! - With i8mm ggml's mul_mat runs Q4_0, Q4_1, Q8_0, Q4_K and Q6_K through two-row `smmla`
//!   kernels when the weight rows and activation rows are both even in number
//!   ([`vec_dot_2x2_mmla`], [`vec_dot_2x2_q4_k_q8_k_neon`], [`vec_dot_2x2_q6_k_q8_k_neon`]).

use super::quant_blocks;
use crate::quant::blocks::*;

/// Q8_0 quants of one block as ggml's NEON `quantize_row_q8_0` computes them: `d = amax/127`,
/// `id = 1/d` (0 when d is 0), `q = x*id` rounded half to even. Returns the unrounded `d`.
#[inline(always)]
pub(crate) fn q8_quants_neon(x: &[f32], qs: &mut [i8; QK]) -> f32 {
    // fmax / fmaxv: a NaN anywhere makes the maximum NaN.
    let amax = x.iter().fold(0.0f32, |a, v| if a.is_nan() || v.is_nan() { f32::NAN } else { a.max(v.abs()) });
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    for (q, &v) in qs.iter_mut().zip(x) {
        *q = (v * id).round_ties_even() as i8;
    }
    d
}

/// f32 → Q8_0 with ggml's NEON rounding ([`q8_quants_neon`]).
pub fn q8_0_from_f32_neon(src: &[f32], dst: &mut [u8]) {
    quant_blocks(src, dst, QK, |x, b: &mut BlockQ8_0| {
        let d = q8_quants_neon(x, &mut b.qs);
        b.d = to_f16le(d);
    });
}

/// f32 → Q8_1 with ggml's NEON rounding: `s = f16(d · Σ qs)`.
pub fn q8_1_from_f32_neon(src: &[f32], dst: &mut [u8]) {
    quant_blocks(src, dst, QK, |x, b: &mut BlockQ8_1| {
        let d = q8_quants_neon(x, &mut b.qs);
        let sum: i32 = b.qs.iter().map(|&q| q as i32).sum();
        b.d = to_f16le(d);
        b.s = to_f16le(d * sum as f32);
    });
}

/// The four `sdot` lanes of one block: lane `l` sums elements `4l..4l+4` and `16+4l..16+4l+4`.
#[inline(always)]
pub(crate) fn lane_sums(w: &[i32; QK], y: &[i8; QK]) -> [i32; 4] {
    std::array::from_fn(|l| {
        (0..4)
            .map(|k| w[4 * l + k] * y[4 * l + k] as i32 + w[16 + 4 * l + k] * y[16 + 4 * l + k] as i32)
            .sum()
    })
}

/// `acc + p·d` per lane, rounded after the multiply and after the add (`vmlaq_n_f32`).
#[inline(always)]
pub(crate) fn mla(acc: [f32; 4], p: [i32; 4], d: f32) -> [f32; 4] {
    std::array::from_fn(|l| acc[l] + p[l] as f32 * d)
}

/// `vaddvq_f32`: `(v0 + v1) + (v2 + v3)`.
#[inline(always)]
pub(crate) fn hadd(v: [f32; 4]) -> f32 {
    (v[0] + v[1]) + (v[2] + v[3])
}

/// A legacy format as ggml's NEON loops see it.
pub(crate) trait NeonBlock {
    /// The weight block.
    type X: bytemuck::Pod;
    /// The activation block.
    type Y: bytemuck::Pod;
    /// The 32 signed weights in element order.
    fn weights(x: &Self::X) -> [i32; QK];
    /// The activation quants.
    fn qs(y: &Self::Y) -> &[i8; QK];
    /// `d_x · d_y`.
    fn d(x: &Self::X, y: &Self::Y) -> f32;
    /// The factors `(m_x, s_y)` of the offset term (Q4_1, Q5_1; unused where `OFFSET` is false).
    fn m(x: &Self::X, y: &Self::Y) -> (f32, f32);
    /// How the pairs loop sums the offset terms of two blocks: Q4_1 `summs += fma(m0, s0, m1·s1)`
    /// (`false`), Q5_1 two sums `summs0 = fma(m0, s0, summs0)`, `summs1` alike (`true`).
    const SPLIT_SUMMS: bool = false;
    /// Whether [`NeonBlock::m`] is `Some` (the offset sums are added after the lanes).
    const OFFSET: bool = false;
    /// `sumf` after the generic C loop's step for a last odd block with integer sum `s`.
    fn tail(sumf: f32, s: i32, x: &Self::X, y: &Self::Y) -> f32;
    /// For [`vec_dot_pairs_blocks`]: whether GCC fused the first block's product of a pair (and
    /// rounded the second's) rather than the other way round.
    const PAIR_FUSES_FIRST: bool = false;
}

/// ggml's NEON `vec_dot` (`nrc == 1`) for `B` over whole blocks (`xs.len() == ys.len()`).
pub(crate) fn vec_dot_blocks<B: NeonBlock>(xs: &[B::X], ys: &[B::Y]) -> f32 {
    let nb = xs.len();
    let (mut acc0, mut acc1) = ([0.0f32; 4], [0.0f32; 4]);
    let (mut summs, mut summs1) = (0.0f32, 0.0f32);
    let mut ib = 0;
    while ib + 1 < nb {
        let (x0, x1, y0, y1) = (&xs[ib], &xs[ib + 1], &ys[ib], &ys[ib + 1]);
        if B::OFFSET {
            let ((a0, b0), (a1, b1)) = (B::m(x0, y0), B::m(x1, y1));
            if B::SPLIT_SUMMS {
                summs = a0.mul_add(b0, summs);
                summs1 = a1.mul_add(b1, summs1);
            } else {
                summs += a0.mul_add(b0, a1 * b1);
            }
        }
        acc0 = mla(acc0, lane_sums(&B::weights(x0), B::qs(y0)), B::d(x0, y0));
        acc1 = mla(acc1, lane_sums(&B::weights(x1), B::qs(y1)), B::d(x1, y1));
        ib += 2;
    }
    let mut sumf = hadd(acc0) + hadd(acc1);
    if B::OFFSET {
        sumf = if B::SPLIT_SUMMS { sumf + summs + summs1 } else { sumf + summs };
    }
    if ib < nb {
        let s = lane_sums(&B::weights(&xs[ib]), B::qs(&ys[ib])).iter().sum();
        sumf = B::tail(sumf, s, &xs[ib], &ys[ib]);
    }
    sumf
}

/// llamafile's `tinyBLAS_Q0_ARM` for one output: one lane accumulator over all blocks, one `hadd`.
pub(crate) fn gemm_q0_blocks<B: NeonBlock>(xs: &[B::X], ys: &[B::Y]) -> f32 {
    let mut acc = [0.0f32; 4];
    for (x, y) in xs.iter().zip(ys) {
        acc = mla(acc, lane_sums(&B::weights(x), B::qs(y)), B::d(x, y));
    }
    hadd(acc)
}

fn nibbles(qs: &[u8; QK / 2], off: i32) -> [i32; QK] {
    std::array::from_fn(|e| if e < 16 { (qs[e] & 0xF) as i32 - off } else { (qs[e - 16] >> 4) as i32 - off })
}

fn q5(qs: &[u8; QK / 2], qh: [u8; 4], off: i32) -> [i32; QK] {
    let h = u32::from_le_bytes(qh);
    let lo = nibbles(qs, 0);
    std::array::from_fn(|e| (lo[e] | (((h >> e) & 1) as i32) << 4) - off)
}

/// Q4_0 · Q8_0.
pub(crate) struct Q40;
/// Q4_1 · Q8_1.
pub(crate) struct Q41;
/// Q5_0 · Q8_0.
pub(crate) struct Q50;
/// Q5_1 · Q8_1.
pub(crate) struct Q51;
/// Q8_0 · Q8_0.
pub(crate) struct Q80;

impl NeonBlock for Q40 {
    type X = BlockQ4_0;
    type Y = BlockQ8_0;
    fn weights(x: &BlockQ4_0) -> [i32; QK] {
        nibbles(&x.qs, 8)
    }
    fn qs(y: &BlockQ8_0) -> &[i8; QK] {
        &y.qs
    }
    fn d(x: &BlockQ4_0, y: &BlockQ8_0) -> f32 {
        f16le(x.d) * f16le(y.d)
    }
    fn m(_: &BlockQ4_0, _: &BlockQ8_0) -> (f32, f32) {
        (0.0, 0.0)
    }
    fn tail(sumf: f32, s: i32, x: &BlockQ4_0, y: &BlockQ8_0) -> f32 {
        // sumf += sumi*dx*dy
        (s as f32 * f16le(x.d)).mul_add(f16le(y.d), sumf)
    }
}

impl NeonBlock for Q41 {
    const OFFSET: bool = true;
    type X = BlockQ4_1;
    type Y = BlockQ8_1;
    fn weights(x: &BlockQ4_1) -> [i32; QK] {
        nibbles(&x.qs, 0)
    }
    fn qs(y: &BlockQ8_1) -> &[i8; QK] {
        &y.qs
    }
    fn d(x: &BlockQ4_1, y: &BlockQ8_1) -> f32 {
        f16le(x.d) * f16le(y.d)
    }
    fn m(x: &BlockQ4_1, y: &BlockQ8_1) -> (f32, f32) {
        (f16le(x.m), f16le(y.s))
    }
    fn tail(sumf: f32, s: i32, x: &BlockQ4_1, y: &BlockQ8_1) -> f32 {
        // sumf += (dx*dy)*sumi + mx*sy: the first product fused
        sumf + Self::d(x, y).mul_add(s as f32, f16le(x.m) * f16le(y.s))
    }
}

impl NeonBlock for Q50 {
    type X = BlockQ5_0;
    type Y = BlockQ8_0;
    fn weights(x: &BlockQ5_0) -> [i32; QK] {
        q5(&x.qs, x.qh, 16)
    }
    fn qs(y: &BlockQ8_0) -> &[i8; QK] {
        &y.qs
    }
    fn d(x: &BlockQ5_0, y: &BlockQ8_0) -> f32 {
        f16le(x.d) * f16le(y.d)
    }
    fn m(_: &BlockQ5_0, _: &BlockQ8_0) -> (f32, f32) {
        (0.0, 0.0)
    }
    fn tail(sumf: f32, s: i32, x: &BlockQ5_0, y: &BlockQ8_0) -> f32 {
        // sumf += (dx*dy)*sumi
        Self::d(x, y).mul_add(s as f32, sumf)
    }
}

impl NeonBlock for Q51 {
    type X = BlockQ5_1;
    type Y = BlockQ8_1;
    const SPLIT_SUMMS: bool = true;
    const OFFSET: bool = true;
    fn weights(x: &BlockQ5_1) -> [i32; QK] {
        q5(&x.qs, x.qh, 0)
    }
    fn qs(y: &BlockQ8_1) -> &[i8; QK] {
        &y.qs
    }
    fn d(x: &BlockQ5_1, y: &BlockQ8_1) -> f32 {
        f16le(x.d) * f16le(y.d)
    }
    fn m(x: &BlockQ5_1, y: &BlockQ8_1) -> (f32, f32) {
        (f16le(x.m), f16le(y.s))
    }
    fn tail(sumf: f32, s: i32, x: &BlockQ5_1, y: &BlockQ8_1) -> f32 {
        sumf + Self::d(x, y).mul_add(s as f32, f16le(x.m) * f16le(y.s))
    }
}

impl NeonBlock for Q80 {
    type X = BlockQ8_0;
    type Y = BlockQ8_0;
    fn weights(x: &BlockQ8_0) -> [i32; QK] {
        x.qs.map(|q| q as i32)
    }
    fn qs(y: &BlockQ8_0) -> &[i8; QK] {
        &y.qs
    }
    fn d(x: &BlockQ8_0, y: &BlockQ8_0) -> f32 {
        f16le(x.d) * f16le(y.d)
    }
    fn m(_: &BlockQ8_0, _: &BlockQ8_0) -> (f32, f32) {
        (0.0, 0.0)
    }
    fn tail(sumf: f32, s: i32, x: &BlockQ8_0, y: &BlockQ8_0) -> f32 {
        // sumf += sumi*(dx*dy)
        (s as f32).mul_add(Self::d(x, y), sumf)
    }
}

/// IQ4_NL · Q8_0 (ggml's NEON `vec_dot` sums pairs of blocks in scalar registers:
/// [`vec_dot_pairs_blocks`]).
pub(crate) struct Iq4NlPairs;
/// MXFP4 · Q8_0 (as [`Iq4NlPairs`]).
pub(crate) struct Mxfp4Pairs;

fn lut_weights(qs: &[u8; QK / 2], table: &[i8; 16]) -> [i32; QK] {
    std::array::from_fn(|e| {
        let nib = if e < 16 { qs[e] & 0xF } else { qs[e - 16] >> 4 };
        table[nib as usize] as i32
    })
}

impl NeonBlock for Iq4NlPairs {
    const PAIR_FUSES_FIRST: bool = true;
    type X = BlockIq4Nl;
    type Y = BlockQ8_0;
    fn weights(x: &BlockIq4Nl) -> [i32; QK] {
        lut_weights(&x.qs, &KVALUES_IQ4NL)
    }
    fn qs(y: &BlockQ8_0) -> &[i8; QK] {
        &y.qs
    }
    fn d(x: &BlockIq4Nl, y: &BlockQ8_0) -> f32 {
        f16le(x.d) * f16le(y.d)
    }
    fn m(_: &BlockIq4Nl, _: &BlockQ8_0) -> (f32, f32) {
        (0.0, 0.0)
    }
    fn tail(sumf: f32, s: i32, x: &BlockIq4Nl, y: &BlockQ8_0) -> f32 {
        // sumf += d*(sumi1 + sumi2)
        (s as f32).mul_add(Self::d(x, y), sumf)
    }
}

impl NeonBlock for Mxfp4Pairs {
    type X = BlockMxfp4;
    type Y = BlockQ8_0;
    fn weights(x: &BlockMxfp4) -> [i32; QK] {
        lut_weights(&x.qs, &KVALUES_MXFP4)
    }
    fn qs(y: &BlockQ8_0) -> &[i8; QK] {
        &y.qs
    }
    fn d(x: &BlockMxfp4, y: &BlockQ8_0) -> f32 {
        e8m0_half(x.e) * f16le(y.d)
    }
    fn m(_: &BlockMxfp4, _: &BlockQ8_0) -> (f32, f32) {
        (0.0, 0.0)
    }
    fn tail(sumf: f32, s: i32, x: &BlockMxfp4, y: &BlockQ8_0) -> f32 {
        (s as f32).mul_add(Self::d(x, y), sumf)
    }
}

/// ggml's NEON `vec_dot` of IQ4_NL and MXFP4 (`nrc == 1` only; no llamafile or `smmla` kernel):
/// per pair of blocks the exact integer sums `p0`, `p1`, then for MXFP4 `sumf += fma(f32(p1), d1,
/// f32(p0)·d0)`, for IQ4_NL `sumf += fma(f32(p0), d0, f32(p1)·d1)` (GCC fuses one product and
/// rounds the other and the sum; which one, read from the three aarch64 reference builds' machine
/// code); an odd last block `sumf = fma(f32(p), d, sumf)`.
pub(crate) fn vec_dot_pairs_blocks<B: NeonBlock>(xs: &[B::X], ys: &[B::Y]) -> f32 {
    let isum =
        |x: &B::X, y: &B::Y| -> i32 { B::weights(x).iter().zip(B::qs(y)).map(|(&w, &q)| w * q as i32).sum() };
    let nb = xs.len();
    let mut sumf = 0.0f32;
    let mut ib = 0;
    while ib + 1 < nb {
        let (p0, p1) = (isum(&xs[ib], &ys[ib]), isum(&xs[ib + 1], &ys[ib + 1]));
        let (d0, d1) = (B::d(&xs[ib], &ys[ib]), B::d(&xs[ib + 1], &ys[ib + 1]));
        sumf += pair_sum::<B>(p0, d0, p1, d1);
        ib += 2;
    }
    if ib < nb {
        sumf = B::tail(sumf, isum(&xs[ib], &ys[ib]), &xs[ib], &ys[ib]);
    }
    sumf
}

/// The term of one pair of blocks in [`vec_dot_pairs_blocks`].
#[inline(always)]
pub(crate) fn pair_sum<B: NeonBlock>(p0: i32, d0: f32, p1: i32, d1: f32) -> f32 {
    if B::PAIR_FUSES_FIRST {
        (p0 as f32).mul_add(d0, p1 as f32 * d1)
    } else {
        (p1 as f32).mul_add(d1, p0 as f32 * d0)
    }
}

/// IQ4_NL · Q8_0, ggml NEON order.
pub fn vec_dot_iq4_nl_q8_0_neon(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let (xs, ys) = rows::<Iq4NlPairs>(n, x, y);
    vec_dot_pairs_blocks::<Iq4NlPairs>(xs, ys)
}

/// MXFP4 · Q8_0, ggml NEON order.
pub fn vec_dot_mxfp4_q8_0_neon(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let (xs, ys) = rows::<Mxfp4Pairs>(n, x, y);
    vec_dot_pairs_blocks::<Mxfp4Pairs>(xs, ys)
}

fn rows<'a, B: NeonBlock>(n: usize, x: &'a [u8], y: &'a [u8]) -> (&'a [B::X], &'a [B::Y]) {
    assert_eq!(n % QK, 0, "vec_dot: n = {n} is not a whole number of blocks of {QK}");
    (take_blocks::<B::X>(x, n / QK), take_blocks::<B::Y>(y, n / QK))
}

/// ggml's NEON `vec_dot` order for `B` on byte rows of `n` elements.
pub(crate) fn vec_dot_neon<B: NeonBlock>(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let (xs, ys) = rows::<B>(n, x, y);
    if xs.is_empty() {
        return 0.0;
    }
    vec_dot_blocks::<B>(xs, ys)
}

/// `tinyBLAS_Q0_ARM`'s order for `B` on byte rows of `n` elements.
pub(crate) fn gemm_q0_neon<B: NeonBlock>(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let (xs, ys) = rows::<B>(n, x, y);
    gemm_q0_blocks::<B>(xs, ys)
}

/// ggml's i8mm two-row kernel (`nrc == 2`, `smmla`; Q4_0, Q4_1 and Q8_0): rows `x0, x1` against
/// columns `y0, y1`, returned as `[x0·y0, x0·y1, x1·y0, x1·y1]`. Each output is its own lane: over
/// blocks in order `sumd = sumd + f32(Σ)·(d_x·d_y)` (rounded twice); Q4_1 also sums
/// `summ = fma(m_x, s_y, summ)` (GCC fuses the vectorized offset products into the accumulation)
/// and returns `sumd + summ`.
pub(crate) fn vec_dot_2x2_mmla<B: NeonBlock>(n: usize, x: [&[u8]; 2], y: [&[u8]; 2]) -> [f32; 4] {
    assert_eq!(n % QK, 0, "vec_dot_2x2: n = {n} is not a whole number of blocks of {QK}");
    let xs = x.map(|r| take_blocks::<B::X>(r, n / QK));
    let ys = y.map(|r| take_blocks::<B::Y>(r, n / QK));
    let mut out = [0.0f32; 4];
    for (o, (r, c)) in [(0, 0), (0, 1), (1, 0), (1, 1)].into_iter().enumerate() {
        let (mut sumd, mut summ) = (0.0f32, 0.0f32);
        for (bx, by) in xs[r].iter().zip(ys[c]) {
            let s: i32 = lane_sums(&B::weights(bx), B::qs(by)).iter().sum();
            sumd += s as f32 * B::d(bx, by);
            if B::OFFSET {
                let (m, sy) = B::m(bx, by);
                summ = m.mul_add(sy, summ);
            }
        }
        out[o] = if B::OFFSET { sumd + summ } else { sumd };
    }
    out
}

/// Q4_0 · Q8_0, ggml's i8mm two-row order.
pub fn vec_dot_2x2_q4_0_q8_0_neon(n: usize, x: [&[u8]; 2], y: [&[u8]; 2]) -> [f32; 4] {
    vec_dot_2x2_mmla::<Q40>(n, x, y)
}
/// Q4_1 · Q8_1, ggml's i8mm two-row order.
pub fn vec_dot_2x2_q4_1_q8_1_neon(n: usize, x: [&[u8]; 2], y: [&[u8]; 2]) -> [f32; 4] {
    vec_dot_2x2_mmla::<Q41>(n, x, y)
}
/// Q8_0 · Q8_0, ggml's i8mm two-row order.
pub fn vec_dot_2x2_q8_0_q8_0_neon(n: usize, x: [&[u8]; 2], y: [&[u8]; 2]) -> [f32; 4] {
    vec_dot_2x2_mmla::<Q80>(n, x, y)
}

/// Q4_0 · Q8_0, ggml NEON order.
pub fn vec_dot_q4_0_q8_0_neon(n: usize, x: &[u8], y: &[u8]) -> f32 {
    vec_dot_neon::<Q40>(n, x, y)
}
/// Q4_1 · Q8_1, ggml NEON order.
pub fn vec_dot_q4_1_q8_1_neon(n: usize, x: &[u8], y: &[u8]) -> f32 {
    vec_dot_neon::<Q41>(n, x, y)
}
/// Q5_0 · Q8_0, ggml NEON order.
pub fn vec_dot_q5_0_q8_0_neon(n: usize, x: &[u8], y: &[u8]) -> f32 {
    vec_dot_neon::<Q50>(n, x, y)
}
/// Q5_1 · Q8_1, ggml NEON order.
pub fn vec_dot_q5_1_q8_1_neon(n: usize, x: &[u8], y: &[u8]) -> f32 {
    vec_dot_neon::<Q51>(n, x, y)
}
/// Q8_0 · Q8_0, ggml NEON order.
pub fn vec_dot_q8_0_q8_0_neon(n: usize, x: &[u8], y: &[u8]) -> f32 {
    vec_dot_neon::<Q80>(n, x, y)
}
/// Q4_0 · Q8_0, `tinyBLAS_Q0_ARM` order (matrix products of two or more activation rows).
pub fn gemm_q4_0_q8_0_neon(n: usize, x: &[u8], y: &[u8]) -> f32 {
    gemm_q0_neon::<Q40>(n, x, y)
}
/// Q8_0 · Q8_0, `tinyBLAS_Q0_ARM` order.
pub fn gemm_q8_0_q8_0_neon(n: usize, x: &[u8], y: &[u8]) -> f32 {
    gemm_q0_neon::<Q80>(n, x, y)
}

// ---- K-quants (ggml-cpu/arch/arm/quants.c, NEON with dotprod, one row) ----
//
// ggml's NEON K-quant dots form the same exact integer sums per super-block as the reference
// (`Σ scale·(q·y)` and `Σ min·bsum`, [`super::kquants::q2k_ints`] etc.), then fold them into one
// running f32 sum with the block's own float steps, which GCC contracts (read off the aarch64
// disassembly of the reference): the `neon_step_*` functions below, shared by the NEON kernels and
// their twins. `d = y.d·x.d` and `dmin = y.d·x.dmin` are rounded products.

/// Q2_K: `sum = fma(Σmin, -(y.d·x.dmin), sum)`, then `fma(Σscale, y.d·x.d, sum)`.
#[inline(always)]
pub fn neon_step_q2k(sum: f32, isc: i32, imn: i32, xd: f32, xdmin: f32, yd: f32) -> f32 {
    let sum = (imn as f32).mul_add(-(yd * xdmin), sum);
    (isc as f32).mul_add(yd * xd, sum)
}

/// Q3_K: `sum = fma(Σscale, y.d·x.d, sum)`.
#[inline(always)]
pub fn neon_step_q3k(sum: f32, isc: i32, xd: f32, yd: f32) -> f32 {
    (isc as f32).mul_add(yd * xd, sum)
}

/// Q4_K: `sum = fma(-Σmin, dmin, sum)`, then `fma(Σscale, d, sum)`.
#[inline(always)]
pub fn neon_step_q4k(sum: f32, isc: i32, imn: i32, xd: f32, xdmin: f32, yd: f32) -> f32 {
    let sum = (-(imn as f32)).mul_add(yd * xdmin, sum);
    (isc as f32).mul_add(yd * xd, sum)
}

/// Q5_K: `sum + fma(Σscale, d, -(Σmin·dmin))` (`sumf += d*sumi - dmin*sumi_mins`).
#[inline(always)]
pub fn neon_step_q5k(sum: f32, isc: i32, imn: i32, xd: f32, xdmin: f32, yd: f32) -> f32 {
    sum + (isc as f32).mul_add(yd * xd, -((imn as f32) * (yd * xdmin)))
}

/// Q6_K (and IQ4_XS): `sum = fma(x.d·y.d, Σscale·(q-32), sum)`.
#[inline(always)]
pub fn neon_step_q6k(sum: f32, isc: i32, xd: f32, yd: f32) -> f32 {
    (xd * yd).mul_add(isc as f32, sum)
}

/// Q4_K, ggml's i8mm two-row kernel (`nrc == 2`): `sum − f32(Σmin)·(x.dmin·y.d)`, then
/// `+ f32(Σscale)·(x.d·y.d)`, every product and sum rounded (GCC's `vmlsq_f32` / `vmlaq_f32` are
/// `fmul` then `fsub` / `fadd`).
#[inline(always)]
pub fn mmla_step_q4k(sum: f32, isc: i32, imn: i32, xd: f32, xdmin: f32, yd: f32) -> f32 {
    let sum = sum - imn as f32 * (xdmin * yd);
    sum + isc as f32 * (xd * yd)
}

/// Q6_K, ggml's i8mm two-row kernel: `sum + f32(Σscale·(q−32))·(x.d·y.d)`, rounded twice (the
/// `−32` offset is taken out of the integer sum as `32·Σscale·bsum`: the same exact integer).
#[inline(always)]
pub fn mmla_step_q6k(sum: f32, isc: i32, xd: f32, yd: f32) -> f32 {
    sum + isc as f32 * (xd * yd)
}

/// Q4_K, ggml's SVE build's two-row kernel (`svmmla`, every vector length): `fma(f32(Σscale),
/// y.d·x.d, sum)`, then `fma(f32(Σmin), −(y.d·x.dmin), ·)` (SVE `fmla`, fused).
#[inline(always)]
pub fn sve_mmla_step_q4k(sum: f32, isc: i32, imn: i32, xd: f32, xdmin: f32, yd: f32) -> f32 {
    let sum = (isc as f32).mul_add(yd * xd, sum);
    (imn as f32).mul_add(-(yd * xdmin), sum)
}

/// Q6_K, ggml's SVE build's two-row kernel: `fma(f32(Σscale·(q−32)), y.d·x.d, sum)`.
#[inline(always)]
pub fn sve_mmla_step_q6k(sum: f32, isc: i32, xd: f32, yd: f32) -> f32 {
    (isc as f32).mul_add(yd * xd, sum)
}

/// The four outputs `[x0·y0, x0·y1, x1·y0, x1·y1]` of a two-row kernel, each folded over the
/// super-blocks by `step` from the exact integer sums `ints`.
fn k_2x2<X: bytemuck::Pod>(
    n: usize,
    x: [&[u8]; 2],
    y: [&[u8]; 2],
    ints: impl Fn(&X, &BlockQ8K) -> (i32, i32),
    step: impl Fn(f32, i32, i32, &X, &BlockQ8K) -> f32,
) -> [f32; 4] {
    let rows = [k_rows::<X>(n, x[0], y[0]), k_rows::<X>(n, x[1], y[1])];
    std::array::from_fn(|o| {
        let (xs, ys) = (rows[o / 2].0, rows[o % 2].1);
        xs.iter().zip(ys).fold(0.0, |s, (bx, by)| {
            let (isc, imn) = ints(bx, by);
            step(s, isc, imn, bx, by)
        })
    })
}

/// Q4_K · Q8_K, ggml's i8mm two-row order (rows `x0, x1`, columns `y0, y1`).
pub fn vec_dot_2x2_q4_k_q8_k_neon(n: usize, x: [&[u8]; 2], y: [&[u8]; 2]) -> [f32; 4] {
    k_2x2::<BlockQ4K>(n, x, y, super::kquants::q4k_ints, |s, isc, imn, bx, by| {
        mmla_step_q4k(s, isc, imn, f16le(bx.d), f16le(bx.dmin), yd(by))
    })
}

/// Q6_K · Q8_K, ggml's i8mm two-row order.
pub fn vec_dot_2x2_q6_k_q8_k_neon(n: usize, x: [&[u8]; 2], y: [&[u8]; 2]) -> [f32; 4] {
    k_2x2::<BlockQ6K>(
        n,
        x,
        y,
        |bx, by| (super::kquants::q6k_ints(bx, by), 0),
        |s, isc, _, bx, by| mmla_step_q6k(s, isc, f16le(bx.d), yd(by)),
    )
}

/// Q4_K · Q8_K, the two-row order of ggml's SVE build (i8mm).
pub fn vec_dot_2x2_q4_k_q8_k_sve(n: usize, x: [&[u8]; 2], y: [&[u8]; 2]) -> [f32; 4] {
    k_2x2::<BlockQ4K>(n, x, y, super::kquants::q4k_ints, |s, isc, imn, bx, by| {
        sve_mmla_step_q4k(s, isc, imn, f16le(bx.d), f16le(bx.dmin), yd(by))
    })
}

/// Q6_K · Q8_K, the two-row order of ggml's SVE build (i8mm).
pub fn vec_dot_2x2_q6_k_q8_k_sve(n: usize, x: [&[u8]; 2], y: [&[u8]; 2]) -> [f32; 4] {
    k_2x2::<BlockQ6K>(
        n,
        x,
        y,
        |bx, by| (super::kquants::q6k_ints(bx, by), 0),
        |s, isc, _, bx, by| sve_mmla_step_q6k(s, isc, f16le(bx.d), yd(by)),
    )
}

fn k_rows<'a, X: bytemuck::Pod>(n: usize, x: &'a [u8], y: &'a [u8]) -> (&'a [X], &'a [BlockQ8K]) {
    use crate::dtype::QK_K;
    assert_eq!(n % QK_K, 0, "vec_dot: n = {n} is not a whole number of blocks of {QK_K}");
    (take_blocks::<X>(x, n / QK_K), take_blocks::<BlockQ8K>(y, n / QK_K))
}

fn yd(b: &BlockQ8K) -> f32 {
    f32::from_le_bytes(b.d)
}

/// Q2_K · Q8_K in ggml's NEON order.
pub fn vec_dot_q2_k_q8_k_neon(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let (xs, ys) = k_rows::<BlockQ2K>(n, x, y);
    xs.iter().zip(ys).fold(0.0, |s, (bx, by)| {
        let (isc, imn) = super::kquants::q2k_ints(bx, by);
        neon_step_q2k(s, isc, imn, f16le(bx.d), f16le(bx.dmin), yd(by))
    })
}

/// Q3_K · Q8_K in ggml's NEON order.
pub fn vec_dot_q3_k_q8_k_neon(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let (xs, ys) = k_rows::<BlockQ3K>(n, x, y);
    xs.iter()
        .zip(ys)
        .fold(0.0, |s, (bx, by)| neon_step_q3k(s, super::kquants::q3k_ints(bx, by), f16le(bx.d), yd(by)))
}

/// Q4_K · Q8_K in ggml's NEON order.
pub fn vec_dot_q4_k_q8_k_neon(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let (xs, ys) = k_rows::<BlockQ4K>(n, x, y);
    xs.iter().zip(ys).fold(0.0, |s, (bx, by)| {
        let (isc, imn) = super::kquants::q4k_ints(bx, by);
        neon_step_q4k(s, isc, imn, f16le(bx.d), f16le(bx.dmin), yd(by))
    })
}

/// Q5_K · Q8_K in ggml's NEON order.
pub fn vec_dot_q5_k_q8_k_neon(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let (xs, ys) = k_rows::<BlockQ5K>(n, x, y);
    xs.iter().zip(ys).fold(0.0, |s, (bx, by)| {
        let (isc, imn) = super::kquants::q5k_ints(bx, by);
        neon_step_q5k(s, isc, imn, f16le(bx.d), f16le(bx.dmin), yd(by))
    })
}

/// Q6_K · Q8_K in ggml's NEON order.
pub fn vec_dot_q6_k_q8_k_neon(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let (xs, ys) = k_rows::<BlockQ6K>(n, x, y);
    xs.iter()
        .zip(ys)
        .fold(0.0, |s, (bx, by)| neon_step_q6k(s, super::kquants::q6k_ints(bx, by), f16le(bx.d), yd(by)))
}

/// IQ4_XS · Q8_K in ggml's NEON order (the float step of Q6_K: `fma(x.d·y.d, Σ, sum)`).
pub fn vec_dot_iq4_xs_q8_k_neon(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let (xs, ys) = k_rows::<BlockIq4Xs>(n, x, y);
    xs.iter()
        .zip(ys)
        .fold(0.0, |s, (bx, by)| neon_step_q6k(s, super::kquants::iq4xs_ints(bx, by), f16le(bx.d), yd(by)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::scalar as s;

    fn rand_row(n: usize, seed: u64) -> Vec<f32> {
        let mut state = seed | 1;
        (0..n)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                ((state >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) as f32
            })
            .collect()
    }

    fn quant(f: fn(&[f32], &mut [u8]), x: &[f32], bytes_per_block: usize) -> Vec<u8> {
        let mut out = vec![0u8; x.len() / QK * bytes_per_block];
        f(x, &mut out);
        out
    }

    #[test]
    fn lanes_cover_every_element_once() {
        let w: [i32; QK] = std::array::from_fn(|e| e as i32 - 16);
        let y: [i8; QK] = std::array::from_fn(|e| (3 * e as i32 - 40) as i8);
        let want: i32 = w.iter().zip(&y).map(|(&a, &b)| a * b as i32).sum();
        assert_eq!(lane_sums(&w, &y).iter().sum::<i32>(), want);
        // Lane 1 holds elements 4..8 and 20..24.
        let l1: i32 = [4, 5, 6, 7, 20, 21, 22, 23].iter().map(|&e| w[e] * y[e] as i32).sum();
        assert_eq!(lane_sums(&w, &y)[1], l1);
    }

    #[test]
    fn neon_rounding_is_half_to_even() {
        // amax 127 → d = 1, id = 1: 2.5 → 2 (ref: 3), -0.5 → -0 (ref: -1), 1.5 → 2.
        let mut x = vec![0.0f32; QK];
        x[0] = 127.0;
        x[1] = 2.5;
        x[2] = -0.5;
        x[3] = 1.5;
        let neon = quant(q8_0_from_f32_neon, &x, std::mem::size_of::<BlockQ8_0>());
        let refq = quant(s::q8_0_from_f32, &x, std::mem::size_of::<BlockQ8_0>());
        let (bn, br) = (&as_blocks::<BlockQ8_0>(&neon)[0], &as_blocks::<BlockQ8_0>(&refq)[0]);
        assert_eq!(&bn.qs[..4], &[127, 2, 0, 2]);
        assert_eq!(&br.qs[..4], &[127, 3, -1, 2]);
    }

    /// The NEON-order dots equal an f64 sum of the dequantized products within a float
    /// summation bound (independent of the order), on random rows of odd and even block counts.
    #[test]
    fn neon_order_dots_are_dot_products() {
        type Dot = fn(usize, &[u8], &[u8]) -> f32;
        type Quant = fn(&[f32], &mut [u8]);
        /// Name, weight quantizer and block bytes, activation quantizer and block bytes, the NEON-order
        /// dot and the reference dot.
        type Case = (&'static str, Quant, usize, Quant, usize, Dot, Dot);
        let cases: [Case; 5] = [
            (
                "q4_0",
                s::q4_0_from_f32,
                18,
                q8_0_from_f32_neon,
                34,
                vec_dot_q4_0_q8_0_neon,
                s::vec_dot_q4_0_q8_0,
            ),
            (
                "q4_1",
                s::q4_1_from_f32,
                20,
                q8_1_from_f32_neon,
                36,
                vec_dot_q4_1_q8_1_neon,
                s::vec_dot_q4_1_q8_1,
            ),
            (
                "q5_0",
                s::q5_0_from_f32,
                22,
                q8_0_from_f32_neon,
                34,
                vec_dot_q5_0_q8_0_neon,
                s::vec_dot_q5_0_q8_0,
            ),
            (
                "q5_1",
                s::q5_1_from_f32,
                24,
                q8_1_from_f32_neon,
                36,
                vec_dot_q5_1_q8_1_neon,
                s::vec_dot_q5_1_q8_1,
            ),
            (
                "q8_0",
                s::q8_0_from_f32,
                34,
                q8_0_from_f32_neon,
                34,
                vec_dot_q8_0_q8_0_neon,
                s::vec_dot_q8_0_q8_0,
            ),
        ];
        for (name, qx, bx, qy, by, dot, reference) in cases {
            for nb in [1usize, 2, 3, 7, 18] {
                let n = nb * QK;
                let x = quant(qx, &rand_row(n, 11 + nb as u64), bx);
                let y = quant(qy, &rand_row(n, 97 + nb as u64), by);
                let (a, b) = (dot(n, &x, &y), reference(n, &x, &y));
                let scale: f32 = 1e-5 * (nb as f32) * 40.0;
                assert!((a - b).abs() <= scale.max(1e-5 * b.abs()), "{name} nb={nb}: {a} vs {b}");
            }
        }
        let n = 5 * QK;
        let x = quant(s::q8_0_from_f32, &rand_row(n, 5), 34);
        let y = quant(q8_0_from_f32_neon, &rand_row(n, 6), 34);
        let (a, b) = (gemm_q8_0_q8_0_neon(n, &x, &y), s::vec_dot_q8_0_q8_0(n, &x, &y));
        assert!((a - b).abs() <= 1e-3, "gemm q8_0: {a} vs {b}");
    }
}
