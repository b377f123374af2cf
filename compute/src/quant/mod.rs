//! Quantized block formats and their kernels.
//!
//! Every type has a scalar reference kernel in [`scalar`] (the specification) and, where it pays,
//! SIMD twins chosen once at run time by [`dispatch`]. Callers only ever see the [`TypeKernels`]
//! table returned by [`kernels`].

// Block layouts are easiest to check against the reference with explicit indices.
#![allow(clippy::needless_range_loop)]

#[cfg(target_arch = "aarch64")]
pub mod aarch64;
pub mod blocks;
pub mod dispatch;
pub mod scalar;
#[cfg(test)]
mod tests;
#[cfg(target_arch = "x86_64")]
pub mod x86_64;

use crate::dtype::GgmlType;

/// Converts whole blocks to f32: `src` holds `dst.len() / blck_size` blocks.
pub type ToF32Fn = fn(src: &[u8], dst: &mut [f32]);

/// Quantizes f32 values to whole blocks: `src.len()` is a multiple of the block size and `dst`
/// holds exactly `src.len() / blck_size` blocks.
pub type FromF32Fn = fn(src: &[f32], dst: &mut [u8]);

/// Dot product of `n` elements: `x` is a row of the weight type, `y` a row of its `vec_dot_type`.
pub type VecDotFn = fn(n: usize, x: &[u8], y: &[u8]) -> f32;

/// The kernels of one type.
#[derive(Clone, Copy, Debug)]
pub struct TypeKernels {
    /// Dequantization (or widening) to f32.
    pub to_f32: Option<ToF32Fn>,
    /// Quantization (or narrowing) from f32.
    pub from_f32: Option<FromF32Fn>,
    /// Dot product against a row of `vec_dot_type`.
    pub vec_dot: Option<VecDotFn>,
    /// The type activations are converted to before `vec_dot` (ref: ggml-compute-semantics.md §2.3).
    pub vec_dot_type: GgmlType,
}

/// The kernel table of `t`, for the instruction set chosen at start-up.
pub fn kernels(t: GgmlType) -> &'static TypeKernels {
    dispatch::table().get(t)
}

/// The name of the kernel set in use (`scalar`, `avx2`, `avx512` or `neon`).
pub fn active_isa() -> &'static str {
    dispatch::table().isa().name()
}
