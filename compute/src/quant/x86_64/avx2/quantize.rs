//! AVX2 activation quantizers Q8_0, Q8_1 and Q8_K, rounding exactly as the scalar reference
//! (ref: ggml-compute-semantics.md §2.3): Q8_0/Q8_1 multiply by the same scalar `1/d` and round
//! half away from zero; Q8_K multiplies by the same `-127/max` and rounds half to even.

use std::arch::x86_64::*;

use crate::dtype::QK_K;
use crate::quant::blocks::*;
use crate::quant::scalar::{q8k_bsums, quant_blocks};

/// Largest |x| of a slice whose length is a multiple of 8.
#[inline(always)]
unsafe fn amax8(x: &[f32]) -> f32 {
    // SAFETY: loads 8 floats at multiples of 8 below x.len(); register arithmetic under AVX.
    unsafe {
        let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
        let mut m = _mm256_setzero_ps();
        for i in (0..x.len() / 8 * 8).step_by(8) {
            m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(x.as_ptr().add(i)), abs));
        }
        let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        let m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        let m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        _mm_cvtss_f32(m4)
    }
}

/// `roundf` (half away from zero) of 8 lanes: truncate, then step away from zero where the
/// dropped fraction is at least one half (the subtraction is exact).
#[inline(always)]
unsafe fn round_away(v: __m256) -> __m256 {
    // SAFETY: register arithmetic under AVX.
    unsafe {
        let t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
        let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
        let frac = _mm256_and_ps(_mm256_sub_ps(v, t), abs);
        let step = _mm256_or_ps(_mm256_set1_ps(1.0), _mm256_andnot_ps(abs, v));
        let big = _mm256_cmp_ps(frac, _mm256_set1_ps(0.5), _CMP_GE_OQ);
        _mm256_add_ps(t, _mm256_and_ps(big, step))
    }
}

/// Packs 32 i32 (four vectors in element order) to 32 saturated i8 and stores them.
#[inline(always)]
unsafe fn store_i8x32(v: [__m256i; 4], out: &mut [i8; 32]) {
    // SAFETY: register arithmetic under AVX2; stores exactly 32 bytes into a 32-byte array.
    unsafe {
        let a = _mm256_packs_epi32(v[0], v[1]);
        let b = _mm256_packs_epi32(v[2], v[3]);
        let p = _mm256_packs_epi16(a, b);
        // The packs interleave the 128-bit lanes: restore element order.
        let p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(out.as_mut_ptr().cast(), p);
    }
}

/// Q8_0 quants of 32 values; returns the unrounded `d`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_block(x: &[f32], qs: &mut [i8; 32]) -> f32 {
    assert_eq!(x.len(), 32);
    // SAFETY: 32 floats are readable (asserted); register arithmetic otherwise.
    unsafe {
        let amax = amax8(x);
        let d = amax / 127.0;
        let id = _mm256_set1_ps(if d != 0.0 { 1.0 / d } else { 0.0 });
        let v: [__m256i; 4] = std::array::from_fn(|k| {
            let r = round_away(_mm256_mul_ps(_mm256_loadu_ps(x.as_ptr().add(8 * k)), id));
            _mm256_cvtps_epi32(r)
        });
        store_i8x32(v, qs);
        d
    }
}

/// f32 → Q8_0.
pub(super) fn q8_0_from_f32(src: &[f32], dst: &mut [u8]) {
    quant_blocks(src, dst, QK, |x, b: &mut BlockQ8_0| {
        // SAFETY: installed only after AVX2/FMA/F16C detection (module docs of `avx2`).
        let d = unsafe { q8_block(x, &mut b.qs) };
        b.d = to_f16le(d);
    });
}

/// f32 → Q8_1.
pub(super) fn q8_1_from_f32(src: &[f32], dst: &mut [u8]) {
    quant_blocks(src, dst, QK, |x, b: &mut BlockQ8_1| {
        // SAFETY: installed only after AVX2/FMA/F16C detection (module docs of `avx2`).
        let d = unsafe { q8_block(x, &mut b.qs) };
        let sum: i32 = b.qs.iter().map(|&q| q as i32).sum();
        b.d = to_f16le(d);
        b.s = to_f16le(sum as f32 * d);
    });
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8k_block(x: &[f32], b: &mut BlockQ8K) {
    assert_eq!(x.len(), QK_K);
    // SAFETY: 256 floats are readable (asserted); register arithmetic otherwise.
    unsafe {
        let amax = amax8(x);
        if amax == 0.0 || amax.is_nan() {
            // NaN input: fall back to the reference, which defines the result for it.
            return crate::quant::scalar::q8k_block(x, b);
        }
        // The signed value of the first element of largest magnitude (ref: §2.3 Q8_K).
        let max = x.iter().copied().find(|v| v.abs() == amax).unwrap_or(amax);
        let iscale = -127.0 / max;
        let is = _mm256_set1_ps(iscale);
        let top = _mm256_set1_epi32(127);
        for c in 0..QK_K / 32 {
            let v: [__m256i; 4] = std::array::from_fn(|k| {
                let p = _mm256_mul_ps(_mm256_loadu_ps(x.as_ptr().add(32 * c + 8 * k)), is);
                _mm256_min_epi32(_mm256_cvtps_epi32(p), top)
            });
            let out: &mut [i8; 32] =
                (&mut b.qs[32 * c..32 * c + 32]).try_into().unwrap_or_else(|_| unreachable!());
            store_i8x32(v, out);
        }
        q8k_bsums(b);
        b.d = (1.0 / iscale).to_le_bytes();
    }
}

/// f32 → Q8_K.
pub(super) fn q8_k_from_f32(src: &[f32], dst: &mut [u8]) {
    quant_blocks(src, dst, QK_K, |x, b: &mut BlockQ8K| {
        // SAFETY: installed only after AVX2/FMA/F16C detection (module docs of `avx2`).
        unsafe { q8k_block(x, b) }
    });
}
