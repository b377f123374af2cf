//! Quantized block formats and their kernels.
//!
//! Every type has a scalar reference kernel in [`scalar`] (the specification) and, where it pays,
//! SIMD twins chosen once at run time by [`dispatch`]. Callers only ever see the [`TypeKernels`]
//! table returned by [`kernels`]; [`active_isa`] names the kernel set in use, and
//! `LLAMAD_KERNELS=scalar|avx2|avx512|neon|neon-dotprod|neon-i8mm` forces one (falling back to the
//! best available set).
//!
//! What exists (ref: ggml-compute-semantics.md §2.2, §2.3):
//!
//! | type | to_f32 | from_f32 (CPY/SET_ROWS) | vec_dot (scalar) | SIMD vec_dot |
//! |---|---|---|---|---|
//! | F32, F16, BF16 | ✓ | ✓ (RNE) | ✓ | AVX2 (F32, F16, BF16), NEON all |
//! | Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 | ✓ | ggml reference quantizers | ✓ | AVX2 all; AVX-512 VNNI Q4_0, Q4_1, Q8_0; NEON all |
//! | Q8_1, Q8_K (activations) | ✓ | ggml reference rounding, bitwise in every SIMD set | — | — |
//! | Q2_K … Q6_K | ✓ | ggml's reference searches, byte for byte ([`scalar::refquant`]) | ✓ | AVX2 all; NEON all |
//! | IQ4_NL, IQ4_XS | ✓ | ggml's reference searches, byte for byte | ✓ | AVX2 both; AVX-512 VNNI IQ4_NL; NEON both |
//! | MXFP4, NVFP4, Q1_0, Q2_0, TQ1_0, TQ2_0 | ✓ | ggml's reference quantizers, byte for byte | ✓ | MXFP4: AVX2, NEON; TQ1_0, TQ2_0: fused AVX2, NEON dots (to_f32 scalar) |
//! | IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S | ✓ ([`scalar::iq`]) | — (ggml's CPU backend has none either) | ✓ | AVX2: IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S fused, IQ1_S, IQ1_M fused (all bit-identical to scalar; under the `avx2`/`avx512` profiles in ggml's one-row and tiled orders instead, twins in [`scalar::iq_x86`]); NEON: dot products of all seven in one, four and 2×2 (i8mm) columns, bit-identical to scalar, to_f32 scalar |
//!
//! `compute/tests/quant_peer.rs` checks every row against ggml itself: dequantization bit for bit,
//! dot products within summation order, quantizers byte for byte.
//!
//! [`TypeKernels::vec_dot_x4`] (one weight row against four activation rows) exists on AVX2 for
//! Q4_0, Q4_1, Q8_0, Q4_K and Q6_K and on NEON for every quantized type;
//! [`TypeKernels::gemm`] (register tiles of several weight rows × several activation rows,
//! bit-identical to `vec_dot` per output) for Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K and F16 on AVX-512
//! VNNI (4 × 4 tiles) and AVX2 (2 × 4 tiles); [`TypeKernels::vec_dot_2x2`] (two weight rows against
//! two activation rows, `smmla`) on the `neon-i8mm` set for every quantized type. The NEON sets
//! (`neon`, `neon-dotprod`, `neon-i8mm`) are separate tables, so a CPU with i8mm tests all three;
//! their quantized kernels and dequantizers equal the scalar reference bit for bit (see
//! `quant::aarch64`).
//!
//! [`TypeKernels::panel`] (16 weight rows unpacked once into a packed panel, activations into
//! per-sub-block records, one `vpdpbusd` per four elements of 16 rows) exists on AVX-512 VNNI for
//! Q4_0, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, the grid IQ types, TQ1_0 and TQ2_0; it has
//! its own summation order (see [`panel`]), equal to [`panel::run_reference`] bit for bit; only the
//! `portable` numerics profile installs it (see [`crate::numerics`]).
//!
//! The table in use is built for the kernel set ([`active_isa`]) and the numerics profile
//! ([`crate::numerics::active`]): under `avx512` the F32/F16 `vec_dot`, `vec_dot_gemm` and F16 `gemm`
//! follow ggml's AVX-512 build (16-lane accumulators, `x86_64::float512`).
//!
//! [`TypeKernels::interleaved_dot`] (AVX-512 VNNI, Q4_0/Q4_1/Q5_0/Q8_0) multiplies weights stored
//! interleaved in groups of 16 rows (see [`interleave`]; the in-process model backend makes such
//! copies) with one or two prepared activation rows: the prepared `vec_dot`'s values bit for bit.
//!
//! Row arguments are checked with `assert!` before any vector code runs: a short row panics in the
//! kernel rather than reading out of bounds, so callers validate shapes first.

// Block layouts are easiest to check against the reference with explicit indices.
#![allow(clippy::needless_range_loop)]

#[cfg(target_arch = "aarch64")]
pub mod aarch64;
pub mod blocks;
pub mod dispatch;
pub mod interleave;
pub mod local;
pub mod panel;
pub mod prepared;
pub mod scalar;
pub mod testing;
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

/// Dot products of one weight row `x` with four rows `y[0..4]` of its `vec_dot_type`, each of
/// `n` elements: the same four values as four [`VecDotFn`] calls (up to summation order), with the
/// weight blocks decoded once. For matrix-matrix products (prompt processing).
pub type VecDotX4Fn = fn(n: usize, x: &[u8], y: [&[u8]; 4]) -> [f32; 4];

/// Dot products of four weight rows `x[0..4]` with one row `y` of the `vec_dot_type`, each of `n`
/// elements: bit for bit the four [`VecDotFn`] values of the same set, with the activation loaded
/// once and the four reductions done together. For products over one activation row with short
/// weight rows (attention's K·Q at generation, 64 or 128 elements per row), where the reduction and
/// the call cost as much as the products.
pub type VecDotRows4Fn = fn(n: usize, x: [&[u8]; 4], y: &[u8]) -> [f32; 4];

/// Dot products of two weight rows `x[0..2]` with two rows `y[0..2]` of the `vec_dot_type`, each
/// of `n` elements, row-major: `[x0·y0, x0·y1, x1·y0, x1·y1]`. Each value equals the same set's
/// [`VecDotFn`] bit for bit. Exists where a 2×2 integer matrix instruction pays (aarch64 i8mm's
/// `smmla`); for matrix-matrix products.
pub type VecDot2x2Fn = fn(n: usize, x: [&[u8]; 2], y: [&[u8]; 2]) -> [f32; 4];

/// Dot products of every weight row `x[i]` with every activation row `y[j]` (rows of `n`
/// elements, of the weight type and of its `vec_dot_type`) into `out[j * x.len() + i]`, the layout
/// of a packed F32 MUL_MAT destination (one activation row's results are consecutive). Each value is
/// bit-identical to `vec_dot(n, x[i], y[j])` of the same kernel set (to `vec_dot_gemm` for the
/// float types that have one); register tiles of several rows and columns make it faster for
/// matrix × matrix products (prompt processing).
pub type GemmFn = fn(n: usize, x: &[&[u8]], y: &[&[u8]], out: &mut [f32]);

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
    /// Optional faster form of four `vec_dot` calls sharing the weight row (`None`: call
    /// `vec_dot` four times).
    pub vec_dot_x4: Option<VecDotX4Fn>,
    /// Optional four-row form of `vec_dot` over one activation row (see [`VecDotRows4Fn`]).
    pub vec_dot_rows4: Option<VecDotRows4Fn>,
    /// Optional two-row × two-column form (see [`VecDot2x2Fn`]); matrix products prefer it over
    /// `vec_dot_x4` where both exist.
    pub vec_dot_2x2: Option<VecDot2x2Fn>,
    /// The dot product as ggml's GEMM computes it (llamafile's tinyBLAS), which ggml uses instead of
    /// `vec_dot` for F32/F16 matrix products over two or more activation rows (and, on aarch64 with
    /// dotprod, for Q4_0 and Q8_0: `tinyBLAS_Q0_ARM`); `None` where the two agree. Matrix products pick it so that results equal a llama.cpp CPU
    /// backend's bit for bit.
    pub vec_dot_gemm: Option<VecDotFn>,
    /// When a matrix product takes `vec_dot_gemm` (llamafile's conditions, which differ per build).
    pub gemm_rule: GemmRule,
    /// The dot product as ggml's tiled K-quant matrix product computes it (`GGML_CPU_TILED_MM`,
    /// ggml-cpu `tiled/`), which ggml uses instead of `vec_dot` for the K-quants, IQ4_XS and the grid
    /// IQ types when a matrix product has [`TILED_MIN_ROWS`] or more activation rows (per expert for
    /// MUL_MAT_ID): per super-block `r = d·s1 - dmin·s2` (exact integer sums `s1`, `s2`; the minus
    /// fused), then `acc = fma(r, d_y, acc)`. `None` where the kernel set does not reproduce it.
    pub vec_dot_batch: Option<VecDotFn>,
    /// Optional four-column form of `vec_dot_batch` (one weight row decoded once for four
    /// activation rows; the same bits per output).
    pub vec_dot_batch_x4: Option<VecDotX4Fn>,
    /// Optional register-tiled matrix × matrix form of `vec_dot` (`None`: call `vec_dot_x4` /
    /// `vec_dot` per row).
    pub gemm: Option<GemmFn>,
    /// Optional dot against a prepared activation row (see [`prepared`]), for generation.
    pub vec_dot_prepared: Option<prepared::PreparedDot>,
    /// Optional packed-panel product (see [`panel`]): faster than `gemm` for many activation rows,
    /// but in its own summation order, so only where no bit-exact ggml parity is promised.
    pub panel: Option<panel::PanelKernels>,
    /// Optional product of interleaved weights (see [`interleave`]) with 1..=2 prepared activation
    /// rows: `vec_dot_prepared`'s values bit for bit, 16 rows at a time.
    pub interleaved_dot: Option<interleave::InterleavedDotFn>,
    /// Optional kernels in llama.cpp's local (repacked) order (see [`local`]), which in-process
    /// products of the weights llama.cpp would repack take under every profile; unlike `panel`,
    /// the ggml profiles keep them.
    pub local: Option<local::LocalKernels>,
}

/// The conditions under which ggml's float GEMM (llamafile's tinyBLAS) serves a matrix product, so
/// that [`TypeKernels::vec_dot_gemm`] replaces `vec_dot`. Always: the weight rows are a multiple of
/// 4 (tinyBLAS's smallest row tile; else ggml falls back to `vec_dot`), and, for F32 weights, the
/// activations are contiguous.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmRule {
    /// Fewest activation rows (2 on x86; ggml's NEON F32 tinyBLAS asks for 4).
    pub min_cols: usize,
    /// The GEMM dot reads the activations as unconverted f32 (`y` is an f32 row, not one of the
    /// `vec_dot_type`): ggml's NEON F16 × F32 tinyBLAS without fp16 vector arithmetic, which runs
    /// only on contiguous F32 activations and a shared dimension that is a multiple of 4.
    pub f32_activations: bool,
}

impl GemmRule {
    /// The x86 rule: two or more activation rows, converted activations.
    pub const DEFAULT: GemmRule = GemmRule { min_cols: 2, f32_activations: false };
}

/// Fewest activation rows for which ggml's CPU backend takes its tiled K-quant product (see
/// [`TypeKernels::vec_dot_batch`]).
pub const TILED_MIN_ROWS: usize = 8;

/// The kernel table of `t`, for the instruction set chosen at start-up.
pub fn kernels(t: GgmlType) -> &'static TypeKernels {
    dispatch::table().get(t)
}

/// The name of the kernel set in use (`scalar`, `avx2`, `avx512` or `neon`).
pub fn active_isa() -> &'static str {
    dispatch::table().isa().name()
}
