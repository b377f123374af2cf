//! BF16 dot products in the order of ggml built natively for a CPU with AVX512-BF16 (the `avx512`
//! numerics profile on such a CPU): `vdpbf16ps` accumulators in `ggml_vec_dot_bf16` (two, over steps
//! of 64 elements) and in llamafile's tinyBLAS (one per output, shared dimension a multiple of 32).
//! Scalar twins: `scalar::bf16_x86`.

use std::arch::x86_64::*;

use super::avx2::util::hsum_ps;
use crate::dtype::GgmlType;
use crate::quant::dispatch::Kernels;

/// AVX-512 F/DQ and BF16 are present.
pub fn available() -> bool {
    super::avx512_numerics_available() && is_x86_feature_detected!("avx512bf16")
}

/// Installs the BF16 `vec_dot` and `vec_dot_gemm` of ggml's AVX512-BF16 build, where the CPU has it.
pub fn install(k: &mut Kernels) {
    if available() {
        k.set_vec_dot(GgmlType::BF16, vec_dot_bf16_bf16);
        k.set_vec_dot_gemm(GgmlType::BF16, vec_dot_bf16_bf16_gemm);
    }
}

fn check(n: usize, x: &[u8], y: &[u8]) {
    assert!(x.len() >= 2 * n && y.len() >= 2 * n, "vec_dot: rows shorter than {n} elements");
}

/// 32 bf16 values at element `i` of a row, as `vdpbf16ps` reads them.
///
/// # Safety
/// 32 elements of 2 bytes exist at `i`; AVX-512F is available.
#[inline(always)]
unsafe fn load32(p: &[u8], i: usize) -> __m512bh {
    // SAFETY: the caller checked the 64 bytes; `__m512bh` is 32 bf16 in the bits of a `__m512i`.
    unsafe { std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(p.as_ptr().add(2 * i).cast())) }
}

/// `_mm512_reduce_add_ps` as GCC forms it: halves of 256, then of 128, then `(s0+s2)+(s1+s3)`.
#[inline(always)]
unsafe fn reduce512(v: __m512) -> f32 {
    // SAFETY: register arithmetic under AVX-512F/DQ (the callers' features).
    unsafe { hsum_ps(_mm256_add_ps(_mm512_extractf32x8_ps::<1>(v), _mm512_castps512_ps256(v))) }
}

fn bf16_at(b: &[u8], i: usize) -> f32 {
    crate::quant::blocks::bf16_bits_to_f32(u16::from_le_bytes([b[2 * i], b[2 * i + 1]]))
}

#[target_feature(enable = "avx2,fma,avx512f,avx512dq,avx512bf16")]
unsafe fn dot_vec(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let head = n / 64 * 64;
    // SAFETY: every load is below `head`, which the caller checked; features enabled on this fn.
    let (r1, r2) = unsafe {
        let (mut c1, mut c2) = (_mm512_setzero_ps(), _mm512_setzero_ps());
        for i in (0..head).step_by(64) {
            c1 = _mm512_dpbf16_ps(c1, load32(x, i), load32(y, i));
            c2 = _mm512_dpbf16_ps(c2, load32(x, i + 32), load32(y, i + 32));
        }
        (reduce512(c1), reduce512(c2))
    };
    let mut sum = (0.0 + r1 as f64) + r2 as f64;
    for i in head..n {
        sum += (bf16_at(x, i) * bf16_at(y, i)) as f64;
    }
    sum as f32
}

#[target_feature(enable = "avx2,fma,avx512f,avx512dq,avx512bf16")]
unsafe fn dot_gemm(n: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: every load is below `n`, which the caller checked; features enabled on this fn.
    unsafe {
        let mut acc = _mm512_setzero_ps();
        for i in (0..n).step_by(32) {
            acc = _mm512_dpbf16_ps(acc, load32(x, i), load32(y, i));
        }
        reduce512(acc)
    }
}

/// bf16 · bf16 as ggml's AVX512-BF16 `ggml_vec_dot_bf16`.
pub(crate) fn vec_dot_bf16_bf16(n: usize, x: &[u8], y: &[u8]) -> f32 {
    check(n, x, y);
    // SAFETY: installed only after AVX-512F/DQ/BF16 detection (`install`); lengths checked above.
    unsafe { dot_vec(n, x, y) }
}

/// bf16 · bf16 in the order of tinyBLAS built for AVX512-BF16 (`n % 32 == 0`, else
/// [`vec_dot_bf16_bf16`]).
pub(crate) fn vec_dot_bf16_bf16_gemm(n: usize, x: &[u8], y: &[u8]) -> f32 {
    check(n, x, y);
    if !n.is_multiple_of(32) {
        return vec_dot_bf16_bf16(n, x, y);
    }
    // SAFETY: installed only after AVX-512F/DQ/BF16 detection (`install`); lengths checked above.
    unsafe { dot_gemm(n, x, y) }
}
