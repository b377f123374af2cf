//! AVX2 F32 / F16 / BF16 dot products and F16C conversions.

use std::arch::x86_64::*;

use super::util::hsum_ps;
use crate::quant::scalar;

fn check(n: usize, x: &[u8], y: &[u8], elem: usize) {
    assert!(x.len() >= n * elem && y.len() >= n * elem, "vec_dot: rows shorter than {n} elements");
}

/// Loads 8 values at element `i` of a row, widened to f32.
type Load8 = unsafe fn(&[u8], usize) -> __m256;

#[inline(always)]
unsafe fn load_f32(p: &[u8], i: usize) -> __m256 {
    // SAFETY: the caller checked that 8 elements of 4 bytes exist at `i`.
    unsafe { _mm256_loadu_ps(p.as_ptr().add(4 * i).cast()) }
}

#[inline(always)]
unsafe fn load_f16(p: &[u8], i: usize) -> __m256 {
    // SAFETY: the caller checked that 8 elements of 2 bytes exist at `i`; F16C is enabled.
    unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.as_ptr().add(2 * i).cast())) }
}

#[inline(always)]
unsafe fn load_bf16(p: &[u8], i: usize) -> __m256 {
    // SAFETY: the caller checked that 8 elements of 2 bytes exist at `i`; bf16 → f32 is `<< 16`.
    unsafe {
        let w = _mm256_cvtepu16_epi32(_mm_loadu_si128(p.as_ptr().add(2 * i).cast()));
        _mm256_castsi256_ps(_mm256_slli_epi32(w, 16))
    }
}

/// Σ x·y over the first `n / 32 * 32` elements with four accumulators.
#[inline(always)]
unsafe fn dot_body(n: usize, x: &[u8], y: &[u8], load: Load8) -> f32 {
    // SAFETY: every load is below `n / 32 * 32` elements, which the caller checked.
    unsafe {
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        while i + 32 <= n {
            for (k, a) in acc.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(load(x, i + 8 * k), load(y, i + 8 * k), *a);
            }
            i += 32;
        }
        hsum_ps(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])))
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_bf16(n: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: lengths checked by the caller; features enabled on this fn.
    unsafe { dot_body(n, x, y, load_bf16) }
}

/// Splits off the tail that the vector loop does not cover and dots it with the scalar kernel.
fn tail(n: usize, x: &[u8], y: &[u8], elem: usize, f: fn(usize, &[u8], &[u8]) -> f32) -> f32 {
    let head = n / 32 * 32;
    f(n - head, &x[head * elem..n * elem], &y[head * elem..n * elem])
}

/// Σ x·y with one 8-lane accumulator, `fma` per 8 elements, then `hsum_ps`: the arithmetic of ggml's
/// x86 float GEMM (llamafile's tinyBLAS, which ggml uses for F32/F16 matrix products whenever the
/// shared dimension is a multiple of 8). `n % 8 == 0` is the caller's.
#[inline(always)]
unsafe fn dot_gemm_order(n: usize, x: &[u8], y: &[u8], load: Load8) -> f32 {
    // SAFETY: every load is below `n` elements, which the caller checked.
    unsafe {
        let mut acc = _mm256_setzero_ps();
        for i in (0..n).step_by(8) {
            acc = _mm256_fmadd_ps(load(x, i), load(y, i), acc);
        }
        hsum_ps(acc)
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_f32_gemm(n: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: lengths checked by the caller; features enabled on this fn.
    unsafe { dot_gemm_order(n, x, y, load_f32) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_f16_gemm(n: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: lengths checked by the caller; features enabled on this fn.
    unsafe { dot_gemm_order(n, x, y, load_f16) }
}

/// ggml's AVX2 `vec_dot` reduction of four 8-lane accumulators: `a0 + a2`, `a1 + a3`, their sum, then
/// the two 128-bit halves added and two horizontal adds.
#[inline(always)]
unsafe fn reduce4_hadd(acc: [__m256; 4]) -> f32 {
    // SAFETY: register arithmetic; the caller runs with AVX enabled.
    unsafe {
        let a = _mm256_add_ps(_mm256_add_ps(acc[0], acc[2]), _mm256_add_ps(acc[1], acc[3]));
        let t0 = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
        let t1 = _mm_hadd_ps(t0, t0);
        _mm_cvtss_f32(_mm_hadd_ps(t1, t1))
    }
}

/// Σ x·y over the first `n / 32 * 32` elements as ggml's AVX2 `vec_dot` forms it: four accumulators
/// over steps of 32, reduced by [`reduce4_hadd`].
#[inline(always)]
unsafe fn dot_vec_order(n: usize, x: &[u8], y: &[u8], load: Load8) -> f32 {
    // SAFETY: every load is below `n / 32 * 32` elements, which the caller checked.
    unsafe {
        let mut acc = [_mm256_setzero_ps(); 4];
        for i in (0..n / 32 * 32).step_by(32) {
            for (k, a) in acc.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(load(x, i + 8 * k), load(y, i + 8 * k), *a);
            }
        }
        reduce4_hadd(acc)
    }
}

/// ggml's AVX2 `ggml_vec_dot_f32` whole: the vector part, then the leftovers past the last 32
/// elements added in order in f32. Its compiler multiplies the first multiple of 4 leftovers 4 at
/// a time (products rounded) and fuses the rest into the sum (`sumf += x[i]*y[i]` as an FMA), as
/// in SOLVE_TRI's and SSM_CONV's sums.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_f32_vec(n: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: lengths checked by the caller; features enabled on this fn.
    let mut sum = unsafe { dot_vec_order(n, x, y, load_f32) };
    let head = n / 32 * 32;
    let split = head + (n - head) / 4 * 4;
    for i in head..n {
        let (a, b) = (f32_at(x, i), f32_at(y, i));
        sum = if i < split { sum + a * b } else { a.mul_add(b, sum) };
    }
    sum
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_f16_vec(n: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: lengths checked by the caller; features enabled on this fn.
    unsafe { dot_vec_order(n, x, y, load_f16) }
}

/// [`dot_f16_vec`] of two rows against one, the activation's vectors loaded once, and the two
/// [`reduce4_hadd`]s side by side (each row's halves in one add, each 128-bit lane's `hadd`s).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_f16_vec_rows2(n: usize, x0: &[u8], x1: &[u8], y: &[u8]) -> [f32; 2] {
    // SAFETY: every load is below `n / 32 * 32` elements, which the caller checked for each row.
    unsafe {
        let (mut a0, mut a1) = ([_mm256_setzero_ps(); 4], [_mm256_setzero_ps(); 4]);
        for i in (0..n / 32 * 32).step_by(32) {
            for k in 0..4 {
                let yv = load_f16(y, i + 8 * k);
                a0[k] = _mm256_fmadd_ps(load_f16(x0, i + 8 * k), yv, a0[k]);
                a1[k] = _mm256_fmadd_ps(load_f16(x1, i + 8 * k), yv, a1[k]);
            }
        }
        let s0 = _mm256_add_ps(_mm256_add_ps(a0[0], a0[2]), _mm256_add_ps(a0[1], a0[3]));
        let s1 = _mm256_add_ps(_mm256_add_ps(a1[0], a1[2]), _mm256_add_ps(a1[1], a1[3]));
        // [s0.lo + s0.hi | s1.lo + s1.hi], then two horizontal adds within each 128-bit lane.
        let t = _mm256_add_ps(_mm256_permute2f128_ps::<0x20>(s0, s1), _mm256_permute2f128_ps::<0x31>(s0, s1));
        let h = _mm256_hadd_ps(t, t);
        let h = _mm256_hadd_ps(h, h);
        [_mm256_cvtss_f32(h), _mm_cvtss_f32(_mm256_extractf128_ps::<1>(h))]
    }
}

/// Four rows · one as [`vec_dot_f16_f16`] each, bit for bit.
pub(super) fn vec_dot_f16_f16_rows4(n: usize, x: [&[u8]; 4], y: &[u8]) -> [f32; 4] {
    for xr in x {
        check(n, xr, y, 2);
    }
    // SAFETY: installed only after AVX2/FMA/F16C detection; lengths checked above.
    let (a, b) = unsafe { (dot_f16_vec_rows2(n, x[0], x[1], y), dot_f16_vec_rows2(n, x[2], x[3], y)) };
    let v = [a[0], a[1], b[0], b[1]];
    std::array::from_fn(|r| {
        let mut sum = v[r] as f64;
        for i in n / 32 * 32..n {
            sum += (f16_at(x[r], i) * f16_at(y, i)) as f64;
        }
        sum as f32
    })
}

/// f32 · f32 as ggml's AVX2 `ggml_vec_dot_f32` ([`dot_f32_vec`]).
pub(super) fn vec_dot_f32_f32(n: usize, x: &[u8], y: &[u8]) -> f32 {
    check(n, x, y, 4);
    // SAFETY: installed only after AVX2/FMA/F16C detection; lengths checked above.
    unsafe { dot_f32_vec(n, x, y) }
}

/// f16 · f16 as ggml's AVX2 `ggml_vec_dot_f16`: the vector part, then the leftovers added in f64.
pub(super) fn vec_dot_f16_f16(n: usize, x: &[u8], y: &[u8]) -> f32 {
    check(n, x, y, 2);
    // SAFETY: installed only after AVX2/FMA/F16C detection; lengths checked above.
    let mut sum = unsafe { dot_f16_vec(n, x, y) } as f64;
    for i in n / 32 * 32..n {
        sum += (f16_at(x, i) * f16_at(y, i)) as f64;
    }
    sum as f32
}

/// f32 · f32 in ggml's GEMM order (one accumulator; `n % 8 == 0`, else as [`vec_dot_f32_f32`]).
pub(super) fn vec_dot_f32_f32_gemm(n: usize, x: &[u8], y: &[u8]) -> f32 {
    check(n, x, y, 4);
    if !n.is_multiple_of(8) {
        return vec_dot_f32_f32(n, x, y);
    }
    // SAFETY: installed only after AVX2/FMA/F16C detection; lengths checked above.
    unsafe { dot_f32_gemm(n, x, y) }
}

/// f16 · f16 in ggml's GEMM order (one accumulator; `n % 8 == 0`, else as [`vec_dot_f16_f16`]).
pub(in crate::quant::x86_64) fn vec_dot_f16_f16_gemm(n: usize, x: &[u8], y: &[u8]) -> f32 {
    check(n, x, y, 2);
    if !n.is_multiple_of(8) {
        return vec_dot_f16_f16(n, x, y);
    }
    // SAFETY: installed only after AVX2/FMA/F16C detection; lengths checked above.
    unsafe { dot_f16_gemm(n, x, y) }
}

fn f32_at(b: &[u8], i: usize) -> f32 {
    f32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]])
}

fn f16_at(b: &[u8], i: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([b[2 * i], b[2 * i + 1]])).to_f32()
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_bf16_ggml(n: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: every load is below `n / 32 * 32` elements, which the caller checked; features
    // enabled on this fn.
    let v = unsafe {
        let mut acc = [_mm256_setzero_ps(); 4];
        for i in (0..n / 32 * 32).step_by(32) {
            for (k, a) in acc.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(load_bf16(x, i + 8 * k), load_bf16(y, i + 8 * k), *a);
            }
        }
        hsum_ps(_mm256_add_ps(_mm256_add_ps(acc[0], acc[2]), _mm256_add_ps(acc[1], acc[3])))
    };
    let mut sum = 0.0 + v as f64;
    for i in n / 32 * 32..n {
        sum += (bf16_at(x, i) * bf16_at(y, i)) as f64;
    }
    sum as f32
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_bf16_gemm(n: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: lengths checked by the caller; features enabled on this fn.
    unsafe { dot_gemm_order(n, x, y, load_bf16) }
}

fn bf16_at(b: &[u8], i: usize) -> f32 {
    crate::quant::blocks::bf16_bits_to_f32(u16::from_le_bytes([b[2 * i], b[2 * i + 1]]))
}

/// bf16 · bf16 as ggml's AVX2 `ggml_vec_dot_bf16` (model: `scalar::bf16_x86`): four accumulators,
/// `(a0 + a2) + (a1 + a3)`, `hsum`, leftovers in f64.
pub(crate) fn vec_dot_bf16_bf16_ggml(n: usize, x: &[u8], y: &[u8]) -> f32 {
    check(n, x, y, 2);
    // SAFETY: installed only after AVX2/FMA/F16C detection; lengths checked above.
    unsafe { dot_bf16_ggml(n, x, y) }
}

/// bf16 · bf16 in the order of ggml's AVX2 tinyBLAS (`n % 8 == 0`, else [`vec_dot_bf16_bf16_ggml`]).
pub(crate) fn vec_dot_bf16_bf16_gemm(n: usize, x: &[u8], y: &[u8]) -> f32 {
    check(n, x, y, 2);
    if !n.is_multiple_of(8) {
        return vec_dot_bf16_bf16_ggml(n, x, y);
    }
    // SAFETY: installed only after AVX2/FMA/F16C detection; lengths checked above.
    unsafe { dot_bf16_gemm(n, x, y) }
}

/// bf16 · bf16.
pub(super) fn vec_dot_bf16_bf16(n: usize, x: &[u8], y: &[u8]) -> f32 {
    check(n, x, y, 2);
    // SAFETY: installed only after AVX2/FMA/F16C detection; lengths checked above.
    unsafe { dot_bf16(n, x, y) + tail(n, x, y, 2, scalar::vec_dot_bf16_bf16) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f16_to_f32_body(src: &[u8], dst: &mut [f32]) {
    let head = dst.len() / 8 * 8;
    for i in (0..head).step_by(8) {
        // SAFETY: `src` holds 2·dst.len() bytes (checked by the caller), `dst` has 8 slots at i.
        unsafe { _mm256_storeu_ps(dst.as_mut_ptr().add(i), load_f16(src, i)) }
    }
    scalar::f16_to_f32(&src[2 * head..], &mut dst[head..]);
}

/// f16 → f32 (exact, F16C).
pub(super) fn f16_to_f32(src: &[u8], dst: &mut [f32]) {
    assert!(src.len() >= 2 * dst.len(), "f16_to_f32: {} bytes for {} values", src.len(), dst.len());
    // SAFETY: installed only after AVX2/FMA/F16C detection; lengths checked above.
    unsafe { f16_to_f32_body(src, dst) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f16_from_f32_body(src: &[f32], dst: &mut [u8]) {
    let head = src.len() / 8 * 8;
    for i in (0..head).step_by(8) {
        // SAFETY: `dst` holds 2·src.len() bytes (checked by the caller), `src` has 8 values at i.
        unsafe {
            let h = _mm256_cvtps_ph(_mm256_loadu_ps(src.as_ptr().add(i)), _MM_FROUND_TO_NEAREST_INT);
            _mm_storeu_si128(dst.as_mut_ptr().add(2 * i).cast(), h);
        }
    }
    scalar::f16_from_f32(&src[head..], &mut dst[2 * head..]);
}

/// f32 → f16, round to nearest even (F16C).
pub(super) fn f16_from_f32(src: &[f32], dst: &mut [u8]) {
    assert!(dst.len() >= 2 * src.len(), "f16_from_f32: {} bytes for {} values", dst.len(), src.len());
    // SAFETY: installed only after AVX2/FMA/F16C detection; lengths checked above.
    unsafe { f16_from_f32_body(src, dst) }
}
