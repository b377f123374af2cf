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

/// Sums `d_i * v_i` over block pairs, with `v` an 8×i32 or 8×f32 vector per block, two
/// accumulators for latency hiding.
macro_rules! block_loop {
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
        block_loop!(xs, ys, |bx, by| {
            let q = _mm256_sub_epi8(nibbles32(&bx.qs), _mm256_set1_epi8(8));
            (f16(bx.d) * f16(by.d), _mm256_cvtepi32_ps(dot_i8i8_epi32(q, load32(&by.qs))))
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
            (f16(bx.d) * f16(by.d), v)
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
pub(super) unsafe fn iq4_lut() -> __m256i {
    // SAFETY: 16-byte read of a 16-byte constant, then a register broadcast.
    unsafe { _mm256_broadcastsi128_si256(_mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast())) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq4_nl_q8_0(xs: &[BlockIq4Nl], ys: &[BlockQ8_0]) -> f32 {
    // SAFETY: register arithmetic and in-bounds block reads; features enabled on this fn.
    unsafe {
        let lut = iq4_lut();
        block_loop!(xs, ys, |bx, by| {
            let q = _mm256_shuffle_epi8(lut, nibbles32(&bx.qs));
            (f16(bx.d) * f16(by.d), _mm256_cvtepi32_ps(dot_i8i8_epi32(q, load32(&by.qs))))
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
        block_loop!(xs, ys, |bx, by| {
            // (nib | hi<<4) - 16 == nib | 0xF0 (as i8) where the fifth bit is clear, nib where set.
            let hi = bytes_from_bits(u32::from_le_bytes(bx.qh));
            let q =
                _mm256_or_si256(nibbles32(&bx.qs), _mm256_andnot_si256(hi, _mm256_set1_epi8(0xF0u8 as i8)));
            (f16(bx.d) * f16(by.d), _mm256_cvtepi32_ps(dot_i8i8_epi32(q, load32(&by.qs))))
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
        let mut summs = 0.0f32;
        for (bx, by) in xs.iter().zip(ys) {
            summs += f16(bx.m) * f16(by.s);
        }
        let dot = block_loop!(xs, ys, |bx, by| {
            let v = _mm256_cvtepi32_ps(dot_u8i8_epi32(nibbles32(&bx.qs), load32(&by.qs)));
            (f16(bx.d) * f16(by.d), v)
        });
        dot + summs
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
        let mut summs = 0.0f32;
        for (bx, by) in xs.iter().zip(ys) {
            summs += f16(bx.m) * f16(by.s);
        }
        let dot = block_loop!(xs, ys, |bx, by| {
            let hi = _mm256_and_si256(bytes_from_bits(u32::from_le_bytes(bx.qh)), _mm256_set1_epi8(0x10));
            let q = _mm256_or_si256(nibbles32(&bx.qs), hi);
            (f16(bx.d) * f16(by.d), _mm256_cvtepi32_ps(dot_u8i8_epi32(q, load32(&by.qs))))
        });
        dot + summs
    }
}
