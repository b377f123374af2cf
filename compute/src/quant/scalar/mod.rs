//! Scalar reference kernels: the specification every SIMD path is tested against.
//!
//! Split per type family: [`float`] (F32, F16, BF16), [`legacy`] (the 32-element formats and their
//! Q8_0/Q8_1 activation partners), [`kquants`] (K-quants, Q8_K, IQ4_XS), [`kquantize`] (their
//! packers), [`refquant`] (ggml's reference quantizers for the K-quants, IQ4, MXFP4 and TQ types),
//! [`extra`] (Q1_0, Q2_0, NVFP4, TQ2_0) and [`iq`] (the grid-based IQ1/IQ2/IQ3 types and TQ1_0).

pub mod bf16_x86;
pub mod extra;
pub mod extra_neon;
pub mod extra_x86;
pub mod float;
pub mod iq;
pub(crate) mod iq_grids;
pub mod iq_neon;
pub mod iq_x86;
pub mod kquantize;
pub mod kquants;
pub mod kquants_x86;
pub mod legacy;
pub mod neon_float;
pub mod neon_order;
pub mod refquant;
pub mod sve_float;
pub mod sve_quant;

pub use extra::*;
pub use float::*;
pub use iq::*;
pub use kquantize::*;
pub use kquants::*;
pub use legacy::*;
pub use refquant::*;

use bytemuck::Pod;

use super::blocks::{as_blocks_mut, take_blocks};

/// Applies `f` to each of the `dst.len() / qk` blocks of `src` and their output slices.
#[inline(always)]
pub(crate) fn dequant_blocks<B: Pod>(src: &[u8], dst: &mut [f32], qk: usize, f: impl Fn(&B, &mut [f32])) {
    assert_eq!(dst.len() % qk, 0, "dequantize: {} values is not a whole number of blocks of {qk}", dst.len());
    let blocks = take_blocks::<B>(src, dst.len() / qk);
    for (b, out) in blocks.iter().zip(dst.chunks_exact_mut(qk)) {
        f(b, out);
    }
}

/// Applies `f` to each group of `qk` values of `src` and its output block in `dst`.
#[inline(always)]
pub(crate) fn quant_blocks<B: Pod>(src: &[f32], dst: &mut [u8], qk: usize, f: impl Fn(&[f32], &mut B)) {
    assert_eq!(src.len() % qk, 0, "quantize: {} values is not a whole number of blocks of {qk}", src.len());
    let nb = src.len() / qk;
    let size = std::mem::size_of::<B>();
    assert!(dst.len() >= nb * size, "quantize: {} bytes for {nb} blocks of {size}", dst.len());
    let blocks = as_blocks_mut::<B>(&mut dst[..nb * size]);
    for (x, b) in src.chunks_exact(qk).zip(blocks.iter_mut()) {
        f(x, b);
    }
}

/// Sums `f(x_block, y_blocks)` over the `n / qk` blocks of `x`; each `x` block of `qk` elements
/// pairs with `qk / qk_y` blocks of `y`.
#[inline(always)]
pub(crate) fn dot_blocks<X: Pod, Y: Pod>(
    n: usize,
    x: &[u8],
    y: &[u8],
    qk: usize,
    qk_y: usize,
    f: impl Fn(&X, &[Y]) -> f32,
) -> f32 {
    assert_eq!(n % qk, 0, "vec_dot: n = {n} is not a whole number of blocks of {qk}");
    let nb = n / qk;
    let ratio = qk / qk_y;
    let xs = take_blocks::<X>(x, nb);
    let ys = take_blocks::<Y>(y, nb * ratio);
    let mut sum = 0.0f32;
    for (bx, by) in xs.iter().zip(ys.chunks_exact(ratio)) {
        sum += f(bx, by);
    }
    sum
}
