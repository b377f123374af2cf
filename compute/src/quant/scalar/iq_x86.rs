//! Scalar models of ggml's x86 dot products of the grid IQ types against Q8_K: the bit-exact twins
//! of the AVX2 kernels the `avx2` and `avx512` numerics profiles install (`quant::x86_64::avx2::iq`),
//! and therefore of llama.cpp's x86 CPU backend (read from `ggml_vec_dot_iq*_q8_K` under `__AVX2__`
//! in ggml-cpu's `arch/x86/quants.c`, which ggml's native AVX-512 build runs too, from its tiled
//! product `tiled/`, and from both reference builds' machine code).
//!
//! One activation row (and up to seven; ggml's `vec_dot` of these types takes one row at a time):
//! every 32 weights go through one 32-byte vector whose eight 32-bit lanes each receive the products
//! of 4 adjacent bytes (`maddubs` + `madd`) times the scale of their 16 or 32 elements, so lane `l`
//! holds the exact integer `Σ_{e : (e mod 32) / 4 = l} scale(e)·v(e)·y(e)`. Then per super-block
//! `acc = fma(d_x·d_y, float(lanes), acc)` and at the end `C·hsum(acc)` (`C` = 1/8 for IQ2_XXS,
//! IQ2_XS, IQ2_S, 1/4 for IQ3_XXS, 1 for IQ3_S; `hsum` is ggml's `hsum_float_8`). IQ1_S and IQ1_M keep
//! the grid part (`g ∈ {−1, 0, 1}`) and the `±1/8` delta part apart:
//! * IQ1_S: the lanes hold `Σ scale·g·y`; the delta part is one integer per super-block from the
//!   Q8_K `bsums`, `Σ_ib scale_ib·δ_ib·(bsum_2ib + bsum_2ib+1)`, summed in a scalar
//!   `acc1 = fma(d, float(that), acc1)` (GCC contracts ggml's `accum1 += d * sumi1`); the result is
//!   `hsum(acc) + acc1·0.125`;
//! * IQ1_M: two lane accumulators, `Σ scale·g·y` and `Σ scale·δ·y`, each by `fma`; the result is
//!   `fma(hsum(acc2), 0.125, hsum(acc1))` (contracted in both builds).
//!
//! TQ1_0 and TQ2_0 (one order for every row count: ggml has no tiled product for them) form their
//! lanes from the digits `q ∈ {0, 1, 2}` and subtract the Q8_K `bsums` lane-wise: the i16 lane `k`
//! of the products loses `bsum_k`, so i32 lane `l` is `Σ_{e : (e mod 32) / 4 = l} q(e)·y(e) −
//! bsum_2l − bsum_2l+1` (not the lane's own `Σ (q − 1)·y`); then `acc = fma(float(lanes), d_x·d_y,
//! acc)` (contracted in both builds) and `hsum(acc)`.
//!
//! Eight or more activation rows take ggml's tiled product (`tiled/tiled.cpp`, as for the K-quants,
//! see [`super::kquants_x86`]): the tile's weight scale is `d_x·C` (exact: `C` is a power of two; IQ1
//! codes are `8·g ± 1` with `C` = 1/8), the integer `s1 = Σ scale·v·y` of the super-block is exact,
//! `r = (d_x·C)·float(s1)` and `acc = fma(r, d_y, acc)` super-block after super-block.

use super::iq::{
    block_isum, decode_iq1_m, decode_iq1_s, iq1_m_d, iq1_s_delta_isum, iq1_split, Decoded, IqSpec,
    IQ1_M_SPEC, IQ1_S_SPEC, IQ2_S_SPEC, IQ2_XS_SPEC, IQ2_XXS_SPEC, IQ3_S_SPEC, IQ3_XXS_SPEC, TQ1_0_SPEC,
    TQ2_0_SPEC,
};
use super::kquants_x86::hsum8;
use crate::dtype::QK_K;
use crate::quant::blocks::*;

pub(super) fn q8k_d(b: &BlockQ8K) -> f32 {
    f32::from_le_bytes(b.d)
}

/// The super-blocks of `x` and `y`, checked.
pub(super) fn pairs<'a, B: bytemuck::Pod>(
    n: usize,
    x: &'a [u8],
    y: &'a [u8],
) -> impl Iterator<Item = (&'a B, &'a BlockQ8K)> {
    assert_eq!(n % QK_K, 0, "vec_dot: n = {n} is not a whole number of super-blocks");
    let nb = n / QK_K;
    take_blocks::<B>(x, nb).iter().zip(take_blocks::<BlockQ8K>(y, nb))
}

/// The eight exact lane sums of one super-block: `Σ scale(e)·w(e)·y(e)` over the elements `e`
/// that land in each 32-bit lane (`scale` per 16 elements).
fn lanes(w: impl Fn(usize) -> i32, scale: &[i32; QK_K / 16], y: &[i8; QK_K]) -> [i32; 8] {
    let mut l = [0i32; 8];
    for (e, &ye) in y.iter().enumerate() {
        l[(e % 32) / 4] += scale[e / 16] * w(e) * ye as i32;
    }
    l
}

/// `acc = fma(d, float(v), acc)` per lane.
fn fma8(acc: &mut [f32; 8], d: f32, v: [i32; 8]) {
    for (a, v) in acc.iter_mut().zip(v) {
        *a = d.mul_add(v as f32, *a);
    }
}

/// The one-row order of the types without a separate delta: lanes, `fma(d_x·d_y)`, `C·hsum`.
fn one_row<B: bytemuck::Pod>(spec: &IqSpec<B>, n: usize, x: &[u8], y: &[u8]) -> f32 {
    let mut acc = [0f32; 8];
    for (bx, by) in pairs::<B>(n, x, y) {
        let dec = (spec.decode)(bx);
        fma8(&mut acc, (spec.d)(bx) * q8k_d(by), lanes(|e| dec.v[e] as i32, &dec.scale, &by.qs));
    }
    spec.c * hsum8(acc)
}

/// The tiled order: `r = (d_x·C)·float(s1)`, `acc = fma(r, d_y, acc)`.
fn tiled<B: bytemuck::Pod>(spec: &IqSpec<B>, n: usize, x: &[u8], y: &[u8]) -> f32 {
    let c = if spec.eighths { 0.125 } else { spec.c };
    let mut acc = 0f32;
    for (bx, by) in pairs::<B>(n, x, y) {
        let dec: Decoded = (spec.decode)(bx);
        let r = ((spec.d)(bx) * c) * block_isum(&dec, &by.qs) as f32;
        acc = r.mul_add(q8k_d(by), acc);
    }
    acc
}

macro_rules! models {
    ($($one:ident, $tiled:ident, $spec:ident, $name:literal;)*) => {$(
        #[doc = concat!($name, " · Q8_K in ggml's AVX2 one-row order.")]
        pub fn $one(n: usize, x: &[u8], y: &[u8]) -> f32 {
            one_row(&$spec, n, x, y)
        }

        #[doc = concat!($name, " · Q8_K in ggml's tiled order (8 or more activation rows).")]
        pub fn $tiled(n: usize, x: &[u8], y: &[u8]) -> f32 {
            tiled(&$spec, n, x, y)
        }
    )*};
}

models! {
    vec_dot_iq2_xxs_q8_k_x86, vec_dot_iq2_xxs_q8_k_tiled_x86, IQ2_XXS_SPEC, "IQ2_XXS";
    vec_dot_iq2_xs_q8_k_x86, vec_dot_iq2_xs_q8_k_tiled_x86, IQ2_XS_SPEC, "IQ2_XS";
    vec_dot_iq2_s_q8_k_x86, vec_dot_iq2_s_q8_k_tiled_x86, IQ2_S_SPEC, "IQ2_S";
    vec_dot_iq3_xxs_q8_k_x86, vec_dot_iq3_xxs_q8_k_tiled_x86, IQ3_XXS_SPEC, "IQ3_XXS";
    vec_dot_iq3_s_q8_k_x86, vec_dot_iq3_s_q8_k_tiled_x86, IQ3_S_SPEC, "IQ3_S";
}

/// The TQ order: digit lanes less the paired `bsums`, `fma(d_x·d_y)`, `hsum`.
fn tq_row<B: bytemuck::Pod>(spec: &IqSpec<B>, n: usize, x: &[u8], y: &[u8]) -> f32 {
    let mut acc = [0f32; 8];
    for (bx, by) in pairs::<B>(n, x, y) {
        let dec = (spec.decode)(bx);
        let mut l = lanes(|e| dec.v[e] as i32 + 1, &dec.scale, &by.qs);
        for (j, l) in l.iter_mut().enumerate() {
            *l -= i16::from_le_bytes(by.bsums[2 * j]) as i32 + i16::from_le_bytes(by.bsums[2 * j + 1]) as i32;
        }
        fma8(&mut acc, (spec.d)(bx) * q8k_d(by), l);
    }
    hsum8(acc)
}

/// TQ1_0 · Q8_K in ggml's AVX2 order.
pub fn vec_dot_tq1_0_q8_k_x86(n: usize, x: &[u8], y: &[u8]) -> f32 {
    tq_row(&TQ1_0_SPEC, n, x, y)
}

/// TQ2_0 · Q8_K in ggml's AVX2 order.
pub fn vec_dot_tq2_0_q8_k_x86(n: usize, x: &[u8], y: &[u8]) -> f32 {
    tq_row(&TQ2_0_SPEC, n, x, y)
}

/// IQ1_S · Q8_K in ggml's AVX2 one-row order.
pub fn vec_dot_iq1_s_q8_k_x86(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let (mut acc, mut acc1) = ([0f32; 8], 0f32);
    for (bx, by) in pairs::<BlockIq1S>(n, x, y) {
        let dec = decode_iq1_s(bx);
        let l = lanes(|e| iq1_split(dec.v[e]).0, &dec.scale, &by.qs);
        let sumi1 = iq1_s_delta_isum(bx, by);
        let d = q8k_d(by) * f16le(bx.d);
        fma8(&mut acc, d, l);
        acc1 = d.mul_add(sumi1 as f32, acc1);
    }
    hsum8(acc) + acc1 * 0.125
}

/// IQ1_S · Q8_K in ggml's tiled order (8 or more activation rows).
pub fn vec_dot_iq1_s_q8_k_tiled_x86(n: usize, x: &[u8], y: &[u8]) -> f32 {
    tiled(&IQ1_S_SPEC, n, x, y)
}

/// IQ1_M · Q8_K in ggml's AVX2 one-row order.
pub fn vec_dot_iq1_m_q8_k_x86(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let (mut acc1, mut acc2) = ([0f32; 8], [0f32; 8]);
    for (bx, by) in pairs::<BlockIq1M>(n, x, y) {
        let dec = decode_iq1_m(bx);
        let d = q8k_d(by) * iq1_m_d(bx);
        fma8(&mut acc1, d, lanes(|e| iq1_split(dec.v[e]).0, &dec.scale, &by.qs));
        fma8(&mut acc2, d, lanes(|e| iq1_split(dec.v[e]).1, &dec.scale, &by.qs));
    }
    hsum8(acc2).mul_add(0.125, hsum8(acc1))
}

/// IQ1_M · Q8_K in ggml's tiled order (8 or more activation rows).
pub fn vec_dot_iq1_m_q8_k_tiled_x86(n: usize, x: &[u8], y: &[u8]) -> f32 {
    tiled(&IQ1_M_SPEC, n, x, y)
}
