//! AVX2 dot products of Q1_0 and NVFP4 against Q8_0 in ggml's AVX2 order (the `avx2` and `avx512`
//! numerics profiles; scalar twins in `scalar::extra_x86`, whose module docs give the order).

use std::arch::x86_64::*;

use super::util::hsum_ps;
use crate::quant::blocks::{as_blocks, ue4m3_half, BlockNvfp4, BlockQ1_0, BlockQ8_0, KVALUES_MXFP4, QK};

/// The rows as blocks: `qk` weights per block of `B`, `qk / 32` Q8_0 blocks each.
fn rows<'a, B: bytemuck::Pod>(n: usize, qk: usize, x: &'a [u8], y: &'a [u8]) -> (&'a [B], &'a [BlockQ8_0]) {
    assert_eq!(n % qk, 0, "vec_dot: n = {n} is not a whole number of blocks");
    let nb = n / qk;
    let (bs, ys) = (std::mem::size_of::<B>(), (n / QK) * std::mem::size_of::<BlockQ8_0>());
    assert!(x.len() >= nb * bs && y.len() >= ys, "vec_dot: rows too short");
    (as_blocks(&x[..nb * bs]), as_blocks(&y[..ys]))
}

/// An f16 as f32, by F16C (exact).
#[target_feature(enable = "avx2,f16c")]
fn f16c(d: [u8; 2]) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(u16::from_le_bytes(d) as i32)))
}

/// Loads 32 bytes.
#[target_feature(enable = "avx2")]
fn load32(a: &[i8; 32]) -> __m256i {
    // SAFETY: `a` is 32 readable bytes; unaligned load.
    unsafe { _mm256_loadu_si256(a.as_ptr() as *const __m256i) }
}

/// Loads 16 bytes.
#[target_feature(enable = "avx2")]
fn load16(a: &[u8]) -> __m128i {
    assert!(a.len() >= 16);
    // SAFETY: `a` holds 16 readable bytes (checked); unaligned load.
    unsafe { _mm_loadu_si128(a.as_ptr() as *const __m128i) }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q1_0_dot(xs: &[BlockQ1_0], ys: &[BlockQ8_0]) -> f32 {
    let ones8 = _mm256_set1_epi8(1);
    let ones16 = _mm256_set1_epi16(1);
    let byte_shuf = _mm256_setr_epi8(
        0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
    );
    let bits = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let mut acc = _mm256_setzero_ps();
    for (bx, by4) in xs.iter().zip(ys.chunks_exact(4)) {
        let mut block = _mm256_setzero_ps();
        for (k, by) in by4.iter().enumerate() {
            let w = i32::from_le_bytes([bx.qs[4 * k], bx.qs[4 * k + 1], bx.qs[4 * k + 2], bx.qs[4 * k + 3]]);
            let spread = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32(w), byte_shuf), bits);
            // All ones where the bit is clear: those activations are negated.
            let neg = _mm256_cmpeq_epi8(spread, _mm256_setzero_si256());
            let qy = load32(&by.qs);
            let sy = _mm256_sub_epi8(_mm256_xor_si256(qy, neg), neg);
            let lanes = _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(ones8, sy), ones16));
            let dy = _mm256_set1_ps(f16c(by.d));
            block = if k == 0 { _mm256_mul_ps(dy, lanes) } else { _mm256_fmadd_ps(dy, lanes, block) };
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(f16c(bx.d)), block, acc);
    }
    // SAFETY: register arithmetic; AVX is enabled here.
    unsafe { hsum_ps(acc) }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn nvfp4_dot(xs: &[BlockNvfp4], ys: &[BlockQ8_0]) -> f32 {
    let values = load16(bytemuck::cast_slice(&KVALUES_MXFP4));
    let m4 = _mm_set1_epi8(0x0F);
    let ones16 = _mm256_set1_epi16(1);
    let mut acc = _mm256_setzero_ps();
    for (bx, by2) in xs.iter().zip(ys.chunks_exact(2)) {
        for (p, by) in by2.iter().enumerate() {
            let q = load16(&bx.qs[16 * p..]);
            let lo = _mm_shuffle_epi8(values, _mm_and_si128(q, m4));
            let hi = _mm_shuffle_epi8(values, _mm_and_si128(_mm_srli_epi16(q, 4), m4));
            // Element order: the 8 low nibbles, the 8 high ones, of each 8 bytes.
            let w = _mm256_set_m128i(_mm_unpackhi_epi64(lo, hi), _mm_unpacklo_epi64(lo, hi));
            let qy = load32(&by.qs);
            let prod = _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(qy, w));
            let lanes = _mm256_cvtepi32_ps(_mm256_madd_epi16(prod, ones16));
            let dy = f16c(by.d);
            let (s0, s1) = (ue4m3_half(bx.d[2 * p]) * dy, ue4m3_half(bx.d[2 * p + 1]) * dy);
            let scales = _mm256_set_m128(_mm_set1_ps(s1), _mm_set1_ps(s0));
            acc = _mm256_fmadd_ps(scales, lanes, acc);
        }
    }
    // SAFETY: register arithmetic; AVX is enabled here.
    unsafe { hsum_ps(acc) }
}

/// Q1_0 · Q8_0 in ggml's AVX2 order.
pub(crate) fn vec_dot_q1_0_q8_0_ggml(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let (xs, ys) = rows::<BlockQ1_0>(n, 128, x, y);
    // SAFETY: installed only after AVX2, FMA and F16C were detected (see the module doc of `avx2`).
    unsafe { q1_0_dot(xs, ys) }
}

/// NVFP4 · Q8_0 in ggml's AVX2 order.
pub(crate) fn vec_dot_nvfp4_q8_0_ggml(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let (xs, ys) = rows::<BlockNvfp4>(n, 64, x, y);
    // SAFETY: installed only after AVX2, FMA and F16C were detected (see the module doc of `avx2`).
    unsafe { nvfp4_dot(xs, ys) }
}
