//! AVX2 dot products of Q1_0, Q2_0 and NVFP4 against Q8_0 in ggml's x86 orders (the `avx2` and
//! `avx512` numerics profiles; scalar twins in `scalar::extra_x86`, whose module docs give the order).

use std::arch::x86_64::*;

use super::util::{hsum_epi32, hsum_ps};
use crate::quant::blocks::{
    as_blocks, ue4m3_half, BlockNvfp4, BlockQ1_0, BlockQ2_0, BlockQ8_0, KVALUES_MXFP4, QK,
};

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
fn q2_0_dot(xs: &[BlockQ2_0], ys: &[BlockQ8_0]) -> f32 {
    // Element e = 4b + j of a Q8_0 block's 32 takes bits 2j..2j+2 of its 8th-block byte b. Each
    // 128-bit lane holds the 8 bytes twice (a 64-bit broadcast), so lane 1 indexes bytes 4..7 directly.
    let byte_of = _mm256_setr_epi8(
        0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7,
    );
    // Blend masks choosing, per byte, the copy shifted by 2j: byte j of every dword (e % 4 == j).
    let pick = |j: u32| _mm256_set1_epi32((0xFFu32 << (8 * j)) as i32);
    let (pick1, pick2, pick3) = (pick(1), pick(2), pick(3));
    let (m3, ones8, ones16) = (_mm256_set1_epi8(3), _mm256_set1_epi8(1), _mm256_set1_epi16(1));
    let mut sum = 0f32;
    for (bx, by2) in xs.iter().zip(ys.chunks_exact(2)) {
        let mut sumi = 0f32;
        for (k, by) in by2.iter().enumerate() {
            let mut b8 = [0u8; 8];
            b8.copy_from_slice(&bx.qs[8 * k..8 * k + 8]);
            let rep = _mm256_shuffle_epi8(_mm256_set1_epi64x(i64::from_le_bytes(b8)), byte_of);
            // Both bytes of each 16-bit lane are equal, so 16-bit shifts followed by `& 3` are exact.
            let mut q = _mm256_blendv_epi8(rep, _mm256_srli_epi16(rep, 2), pick1);
            q = _mm256_blendv_epi8(q, _mm256_srli_epi16(rep, 4), pick2);
            q = _mm256_blendv_epi8(q, _mm256_srli_epi16(rep, 6), pick3);
            let q = _mm256_and_si256(q, m3);
            let qy = load32(&by.qs);
            // Σ(q-1)·y = Σq·y − Σy; both pairwise sums stay within i16 (|q·y| ≤ 3·128).
            let d = _mm256_sub_epi16(_mm256_maddubs_epi16(q, qy), _mm256_maddubs_epi16(ones8, qy));
            // SAFETY: register arithmetic; AVX2 is enabled here.
            let isum = unsafe { hsum_epi32(_mm256_madd_epi16(d, ones16)) };
            sumi = (isum as f32).mul_add(f16c(by.d), sumi);
        }
        sum = sumi.mul_add(f16c(bx.d), sum);
    }
    sum
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

/// Q2_0 · Q8_0 in the order of ggml's generic loop as GCC compiles it for x86: the integer sums
/// vectorised (exact in any order), the float steps scalar FMAs.
pub(crate) fn vec_dot_q2_0_q8_0_ggml(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let (xs, ys) = rows::<BlockQ2_0>(n, 64, x, y);
    // SAFETY: installed only after AVX2, FMA and F16C were detected (see the module doc of `avx2`).
    unsafe { q2_0_dot(xs, ys) }
}

/// NVFP4 · Q8_0 in ggml's AVX2 order.
pub(crate) fn vec_dot_nvfp4_q8_0_ggml(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let (xs, ys) = rows::<BlockNvfp4>(n, 64, x, y);
    // SAFETY: installed only after AVX2, FMA and F16C were detected (see the module doc of `avx2`).
    unsafe { nvfp4_dot(xs, ys) }
}
