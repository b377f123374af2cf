//! x86_64 kernels: AVX2 (+FMA, F16C) and AVX-512 (F, BW, VL, VNNI) variants, installed into the
//! dispatch table when the CPU has the features.

// Shared by the AVX2 and AVX-512 kernels (defined before the modules that use them).
/// `Σ_blocks d_b · v_b` (`$body` yields `(d: f32, v: __m256)`) with ggml's AVX2 arithmetic for Q4_0,
/// Q4_1, Q5_0, Q5_1 and Q8_0 (VNNI only changes how the exact integer lane sums are formed): one 8-lane
/// accumulator updated by `fma(d, v, acc)` block after block, then the horizontal sum (`hsum_ps`). The
/// same order as the four-row kernels (`x4.rs`), so a row's result does not depend on which kernel ran it.
macro_rules! block_loop {
    ($xs:expr, $ys:expr, |$bx:ident, $by:ident| $body:expr) => {{
        let mut acc = _mm256_setzero_ps();
        for ($bx, $by) in $xs.iter().zip($ys.iter()) {
            let (d, v) = $body;
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), v, acc);
        }
        hsum_ps(acc)
    }};
}

/// As [`block_loop`] with two accumulators (even and odd blocks) summed before the horizontal sum:
/// ggml's AVX2 order for IQ4_NL and MXFP4, which process blocks in pairs.
macro_rules! block_loop2 {
    ($xs:expr, $ys:expr, |$bx:ident, $by:ident| $body:expr) => {{
        let mut acc0 = _mm256_setzero_ps();
        let mut acc1 = _mm256_setzero_ps();
        let mut pairs = $xs.chunks_exact(2).zip($ys.chunks_exact(2));
        for (px, py) in &mut pairs {
            let ($bx, $by) = (&px[0], &py[0]);
            let (d0, v0) = $body;
            let ($bx, $by) = (&px[1], &py[1]);
            let (d1, v1) = $body;
            acc0 = _mm256_fmadd_ps(_mm256_set1_ps(d0), v0, acc0);
            acc1 = _mm256_fmadd_ps(_mm256_set1_ps(d1), v1, acc1);
        }
        if $xs.len() % 2 == 1 {
            let ($bx, $by) = (&$xs[$xs.len() - 1], &$ys[$ys.len() - 1]);
            let (d0, v0) = $body;
            acc0 = _mm256_fmadd_ps(_mm256_set1_ps(d0), v0, acc0);
        }
        hsum_ps(_mm256_add_ps(acc0, acc1))
    }};
}

mod avx2;
mod avx512;
mod bf16_512;
mod float512;
mod gemm;
mod gemm512;
mod interleave;
mod local;
mod panel;

use super::dispatch::Kernels;

/// AVX2, FMA and F16C are all present.
pub fn avx2_available() -> bool {
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")
}

/// AVX-512 F/BW/VL/VNNI are present on top of AVX2.
pub fn avx512_available() -> bool {
    avx2_available()
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni")
}

/// What the `avx512` numerics profile needs: AVX-512 F/BW/VL/DQ (ggml's `skylakex` CPU variant)
/// on top of AVX2.
pub fn avx512_numerics_available() -> bool {
    avx2_available()
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512dq")
}

/// Installs the F32/F16 kernels in the order of ggml built for AVX-512 (the `avx512` numerics
/// profile); the caller checked [`avx512_numerics_available`].
pub fn install_avx512_numerics(k: &mut Kernels) {
    float512::install(k);
}

/// Makes `k` follow ggml's own orders (the `avx2` and `avx512` numerics profiles; `avx512` says
/// which build): no packed panels (their order is their own), IQ4_NL's tinyBLAS product for two or
/// more activation rows, and under `avx512` the F32/F16 kernels of ggml's AVX-512 build. The tiled
/// K-quant product needs nothing of its own: its AVX-512 VNNI epilogue is written as a multiply and
/// an add, which GCC contracts into the fused multiply-add of the AVX2 epilogue (measured: opdiff
/// against the native peer fails 12 K-quant cases with the unfused order, none with the fused).
pub fn install_ggml_orders(k: &mut Kernels, avx512: bool) {
    k.clear_panels();
    avx2::install_iq4_nl_gemm(k);
    avx2::install_iq_ggml_orders(k);
    avx2::install_bf16_ggml_orders(k);
    if avx512 && avx512_numerics_available() {
        install_avx512_numerics(k);
        bf16_512::install(k);
    }
}

/// Installs the AVX2 kernels.
pub fn install_avx2(k: &mut Kernels) {
    avx2::install(k);
    gemm::install_avx2(k);
}

/// Installs the AVX-512 kernels (on top of AVX2's).
pub fn install_avx512(k: &mut Kernels) {
    avx512::install(k);
    gemm::install(k);
    // The 512-bit tiles replace the 256-bit ones of Q4_0, Q5_0 and Q8_0 (same bits, faster).
    gemm512::install(k);
    panel::install(k);
    local::install(k);
    interleave::install(k);
}
