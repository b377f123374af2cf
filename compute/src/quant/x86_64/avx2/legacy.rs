//! AVX2 dot products of the 32-element formats against Q8_0 / Q8_1
//! (ref: ggml-compute-semantics.md §2.2 layouts, §2.3 dot products).

use std::arch::x86_64::*;

use super::util::*;
use crate::quant::blocks::*;

/// Checks `n` and the row lengths, returning the block slices.
fn rows<'a, X: bytemuck::Pod, Y: bytemuck::Pod>(n: usize, x: &'a [u8], y: &'a [u8]) -> (&'a [X], &'a [Y]) {
    assert_eq!(n % QK, 0, "vec_dot: n = {n} is not a whole number of blocks");
    (take_blocks::<X>(x, n / QK), take_blocks::<Y>(y, n / QK))
}

/// Q4_0 · Q8_0.
pub(super) fn vec_dot_q4_0_q8_0(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let (xs, ys) = rows::<BlockQ4_0, BlockQ8_0>(n, x, y);
    // SAFETY: installed only after AVX2/FMA/F16C detection (see module docs); slices checked above.
    unsafe { q4_0_q8_0(xs, ys) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_0_q8_0(xs: &[BlockQ4_0], ys: &[BlockQ8_0]) -> f32 {
    // SAFETY: register arithmetic and in-bounds block reads; features enabled on this fn.
    unsafe {
        let eight = _mm256_set1_epi8(8);
        let ones = _mm256_set1_epi16(1);
        block_loop!(xs, ys, |bx, by| {
            // Σ (q - 8)·y = Σ q·y - Σ 8·y, with q and 8 as maddubs' unsigned operand.
            let y = load32(&by.qs);
            let p =
                _mm256_sub_epi16(_mm256_maddubs_epi16(nibbles32(&bx.qs), y), _mm256_maddubs_epi16(eight, y));
            (f16_mul(bx.d, by.d), _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones)))
        })
    }
}

/// Q8_0 · Q8_0.
pub(super) fn vec_dot_q8_0_q8_0(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let (xs, ys) = rows::<BlockQ8_0, BlockQ8_0>(n, x, y);
    // SAFETY: installed only after AVX2/FMA/F16C detection; slices checked above.
    unsafe { q8_0_q8_0(xs, ys) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_0_q8_0(xs: &[BlockQ8_0], ys: &[BlockQ8_0]) -> f32 {
    // SAFETY: register arithmetic and in-bounds block reads; features enabled on this fn.
    unsafe {
        block_loop!(xs, ys, |bx, by| {
            let v = _mm256_cvtepi32_ps(dot_i8i8_epi32(load32(&bx.qs), load32(&by.qs)));
            (f16_mul(bx.d, by.d), v)
        })
    }
}

/// IQ4_NL · Q8_0.
pub(super) fn vec_dot_iq4_nl_q8_0(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let (xs, ys) = rows::<BlockIq4Nl, BlockQ8_0>(n, x, y);
    // SAFETY: installed only after AVX2/FMA/F16C detection; slices checked above.
    unsafe { iq4_nl_q8_0(xs, ys) }
}

/// The IQ4 codebook in both 128-bit lanes, for `pshufb` lookups.
#[inline(always)]
pub(in crate::quant::x86_64) unsafe fn iq4_lut() -> __m256i {
    // SAFETY: 16-byte read of a 16-byte constant, then a register broadcast.
    unsafe { _mm256_broadcastsi128_si256(_mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast())) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq4_nl_q8_0(xs: &[BlockIq4Nl], ys: &[BlockQ8_0]) -> f32 {
    // SAFETY: register arithmetic and in-bounds block reads; features enabled on this fn.
    unsafe {
        let lut = iq4_lut();
        block_loop2!(xs, ys, |bx, by| {
            let q = _mm256_shuffle_epi8(lut, nibbles32(&bx.qs));
            (f16_mul(bx.d, by.d), _mm256_cvtepi32_ps(dot_i8i8_epi32(q, load32(&by.qs))))
        })
    }
}

/// IQ4_NL · Q8_0 in the order of llamafile's tinyBLAS (`tinyBLAS_Q0_AVX`), which ggml uses for IQ4_NL
/// matrix products over two or more activation rows: one accumulator, `fma(d_x·d_y, lanes, acc)`
/// block after block, then `hsum_ps` (the one-column kernel pairs blocks into two accumulators).
pub(super) fn vec_dot_iq4_nl_q8_0_gemm(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let (xs, ys) = rows::<BlockIq4Nl, BlockQ8_0>(n, x, y);
    // SAFETY: installed only after AVX2/FMA/F16C detection; slices checked above.
    unsafe { iq4_nl_q8_0_gemm(xs, ys) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq4_nl_q8_0_gemm(xs: &[BlockIq4Nl], ys: &[BlockQ8_0]) -> f32 {
    // SAFETY: register arithmetic and in-bounds block reads; features enabled on this fn.
    unsafe {
        let lut = iq4_lut();
        block_loop!(xs, ys, |bx, by| {
            let q = _mm256_shuffle_epi8(lut, nibbles32(&bx.qs));
            (f16_mul(bx.d, by.d), _mm256_cvtepi32_ps(dot_i8i8_epi32(q, load32(&by.qs))))
        })
    }
}

/// Q5_0 · Q8_0.
pub(super) fn vec_dot_q5_0_q8_0(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let (xs, ys) = rows::<BlockQ5_0, BlockQ8_0>(n, x, y);
    // SAFETY: installed only after AVX2/FMA/F16C detection; slices checked above.
    unsafe { q5_0_q8_0(xs, ys) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_0_q8_0(xs: &[BlockQ5_0], ys: &[BlockQ8_0]) -> f32 {
    // SAFETY: register arithmetic and in-bounds block reads; features enabled on this fn.
    unsafe {
        let (b4, sixteen, ones) = (_mm256_set1_epi8(0x10), _mm256_set1_epi8(16), _mm256_set1_epi16(1));
        block_loop!(xs, ys, |bx, by| {
            // Σ (q - 16)·y = Σ q·y - Σ 16·y with the unsigned 5-bit q = nib | hi<<4.
            let hi = _mm256_and_si256(bytes_from_bits(u32::from_le_bytes(bx.qh)), b4);
            let q = _mm256_or_si256(nibbles32(&bx.qs), hi);
            let y = load32(&by.qs);
            let p = _mm256_sub_epi16(_mm256_maddubs_epi16(q, y), _mm256_maddubs_epi16(sixteen, y));
            (f16_mul(bx.d, by.d), _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones)))
        })
    }
}

/// Q4_1 · Q8_1.
pub(super) fn vec_dot_q4_1_q8_1(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let (xs, ys) = rows::<BlockQ4_1, BlockQ8_1>(n, x, y);
    // SAFETY: installed only after AVX2/FMA/F16C detection; slices checked above.
    unsafe { q4_1_q8_1(xs, ys) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_1_q8_1(xs: &[BlockQ4_1], ys: &[BlockQ8_1]) -> f32 {
    // SAFETY: register arithmetic and in-bounds block reads; features enabled on this fn.
    unsafe {
        let mut ms = _mm_setzero_ps();
        let dot = block_loop!(xs, ys, |bx, by| {
            let p = dm_products(bytemuck::bytes_of(bx), bytemuck::bytes_of(by));
            ms = _mm_add_ps(ms, p);
            let v = _mm256_cvtepi32_ps(dot_u8i8_epi32(nibbles32(&bx.qs), load32(&by.qs)));
            (_mm_cvtss_f32(p), v)
        });
        dot + _mm_cvtss_f32(_mm_movehdup_ps(ms))
    }
}

/// Q5_1 · Q8_1.
pub(super) fn vec_dot_q5_1_q8_1(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let (xs, ys) = rows::<BlockQ5_1, BlockQ8_1>(n, x, y);
    // SAFETY: installed only after AVX2/FMA/F16C detection; slices checked above.
    unsafe { q5_1_q8_1(xs, ys) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_1_q8_1(xs: &[BlockQ5_1], ys: &[BlockQ8_1]) -> f32 {
    // SAFETY: register arithmetic and in-bounds block reads; features enabled on this fn.
    unsafe {
        let mut ms = _mm_setzero_ps();
        let dot = block_loop!(xs, ys, |bx, by| {
            let p = dm_products(bytemuck::bytes_of(bx), bytemuck::bytes_of(by));
            ms = _mm_add_ps(ms, p);
            let hi = _mm256_and_si256(bytes_from_bits(u32::from_le_bytes(bx.qh)), _mm256_set1_epi8(0x10));
            let q = _mm256_or_si256(nibbles32(&bx.qs), hi);
            (_mm_cvtss_f32(p), _mm256_cvtepi32_ps(dot_u8i8_epi32(q, load32(&by.qs))))
        });
        dot + _mm_cvtss_f32(_mm_movehdup_ps(ms))
    }
}

/// MXFP4 · Q8_0.
pub(super) fn vec_dot_mxfp4_q8_0(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let (xs, ys) = rows::<BlockMxfp4, BlockQ8_0>(n, x, y);
    // SAFETY: installed only after AVX2/FMA/F16C detection; slices checked above.
    unsafe { mxfp4_q8_0(xs, ys) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn mxfp4_q8_0(xs: &[BlockMxfp4], ys: &[BlockQ8_0]) -> f32 {
    // SAFETY: register arithmetic and in-bounds block reads; features enabled on this fn.
    unsafe {
        let lut = _mm256_broadcastsi128_si256(_mm_loadu_si128(KVALUES_MXFP4.as_ptr().cast()));
        let one = [0x00u8, 0x3c];
        block_loop2!(xs, ys, |bx, by| {
            let q = _mm256_shuffle_epi8(lut, nibbles32(&bx.qs));
            (e8m0_half(bx.e) * f16_mul(by.d, one), _mm256_cvtepi32_ps(dot_i8i8_epi32(q, load32(&by.qs))))
        })
    }
}
