//! AVX2 dot products of the K-quants and IQ4_XS against Q8_K
//! (ref: ggml-compute-semantics.md §2.2 layouts, §2.3 dot products).
//!
//! Every 32-byte vector of quants covers two 16-element sub-blocks (one per 128-bit lane) or one
//! 32-element sub-block, so the integer scales are applied with `madd_epi16` against a vector
//! holding the right scale in each lane; the per-super-block integer sum is then scaled once.

use std::arch::x86_64::*;

use super::legacy::iq4_lut;
use super::util::*;
use crate::dtype::QK_K;
use crate::quant::blocks::*;

/// Checks `n` and the row lengths, returning the block slices.
fn rows<'a, X: bytemuck::Pod>(n: usize, x: &'a [u8], y: &'a [u8]) -> (&'a [X], &'a [BlockQ8K]) {
    assert_eq!(n % QK_K, 0, "vec_dot: n = {n} is not a whole number of super-blocks");
    (take_blocks::<X>(x, n / QK_K), take_blocks::<BlockQ8K>(y, n / QK_K))
}

#[inline(always)]
fn q8k_d(b: &BlockQ8K) -> f32 {
    f32::from_le_bytes(b.d)
}

/// What one super-block contributes: `scale · Σ sumi - minus`.
struct Part {
    sumi: __m256i,
    scale: f32,
    minus: f32,
}

macro_rules! kernel {
    ($pub_name:ident, $loop_name:ident, $inner:ident, $blk:ty) => {
        /// Dot product against Q8_K (see the module docs).
        pub(super) fn $pub_name(n: usize, x: &[u8], y: &[u8]) -> f32 {
            let (xs, ys) = rows::<$blk>(n, x, y);
            // SAFETY: installed only after AVX2/FMA/F16C detection (module docs of `avx2`);
            // the blocks are whole structs.
            unsafe { $loop_name(xs, ys) }
        }

        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn $loop_name(xs: &[$blk], ys: &[BlockQ8K]) -> f32 {
            // SAFETY: register arithmetic and whole-block reads; features enabled on this fn.
            unsafe {
                let mut acc = _mm256_setzero_ps();
                let mut minus = 0.0f32;
                for (bx, by) in xs.iter().zip(ys) {
                    let p = $inner(bx, by);
                    acc = _mm256_fmadd_ps(_mm256_set1_ps(p.scale), _mm256_cvtepi32_ps(p.sumi), acc);
                    minus += p.minus;
                }
                hsum_ps(acc) - minus
            }
        }
    };
}

kernel!(vec_dot_q4_k_q8_k, q4_k_loop, q4_k_block, BlockQ4K);
kernel!(vec_dot_q5_k_q8_k, q5_k_loop, q5_k_block, BlockQ5K);
kernel!(vec_dot_q6_k_q8_k, q6_k_loop, q6_k_block, BlockQ6K);
kernel!(vec_dot_q2_k_q8_k, q2_k_loop, q2_k_block, BlockQ2K);
kernel!(vec_dot_q3_k_q8_k, q3_k_loop, q3_k_block, BlockQ3K);
kernel!(vec_dot_iq4_xs_q8_k, iq4_xs_loop, iq4_xs_block, BlockIq4Xs);

/// Q4_K/Q5_K scales and mins as `[sc0..8, mn0..8]`, unpacked on 32-bit words: with
/// `w0, w1, w2` the three little-endian words of `scales`, `sc0..3 = w0 & 0x3f…`,
/// `mn0..3 = w1 & 0x3f…`, `sc4..7 = (w2 & 0x0f…) | ((w0 >> 6) & 0x03…) << 4`,
/// `mn4..7 = ((w2 >> 4) & 0x0f…) | ((w1 >> 6) & 0x03…) << 4` (ref: §2.2 Q4_K, restated per byte).
#[inline(always)]
pub(in crate::quant::x86_64) fn k4_unpack(s: &[u8; 12]) -> [u8; 16] {
    let w = |i: usize| u32::from_le_bytes([s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3]]);
    let (w0, w1, w2) = (w(0), w(1), w(2));
    let sc_lo = w0 & 0x3f3f_3f3f;
    let mn_lo = w1 & 0x3f3f_3f3f;
    let sc_hi = (w2 & 0x0f0f_0f0f) | (((w0 >> 6) & 0x0303_0303) << 4);
    let mn_hi = ((w2 >> 4) & 0x0f0f_0f0f) | (((w1 >> 6) & 0x0303_0303) << 4);
    let mut out = [0u8; 16];
    for (k, v) in [sc_lo, sc_hi, mn_lo, mn_hi].into_iter().enumerate() {
        out[4 * k..4 * k + 4].copy_from_slice(&v.to_le_bytes());
    }
    out
}

/// The eight Q4_K/Q5_K scales as i16 in both lanes, and the min term `Σ mn_j·(bsum_2j + bsum_2j+1)`.
#[inline(always)]
unsafe fn k4_scales_mins(scales: &[u8; 12], by: &BlockQ8K) -> (__m256i, i32) {
    let u = k4_unpack(scales);
    // SAFETY: 16-byte reads of the 16-byte `u` and of the 32-byte `bsums` halves; register
    // arithmetic under AVX2.
    unsafe {
        let v = _mm_loadu_si128(u.as_ptr().cast());
        let sc = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(v));
        let mn = _mm_cvtepu8_epi16(_mm_srli_si128(v, 8));
        let b0 = _mm_loadu_si128(by.bsums.as_ptr().cast());
        let b1 = _mm_loadu_si128(by.bsums[8..].as_ptr().cast());
        let m = _mm_madd_epi16(mn, _mm_hadd_epi16(b0, b1));
        let m = _mm_add_epi32(m, _mm_unpackhi_epi64(m, m));
        let m = _mm_add_epi32(m, _mm_shuffle_epi32(m, 0b01));
        (sc, _mm_cvtsi128_si32(m))
    }
}

/// i16 element `j` (0..8) of each 128-bit lane of `v`, broadcast across that lane.
#[inline(always)]
pub(in crate::quant::x86_64) unsafe fn pick16(v: __m256i, j_lo: i32, j_hi: i32) -> __m256i {
    let m = |j: i32| (((2 * j + 1) << 8) | (2 * j)) as i16;
    // SAFETY: register arithmetic under AVX2.
    unsafe { _mm256_shuffle_epi8(v, _mm256_set_m128i(_mm_set1_epi16(m(j_hi)), _mm_set1_epi16(m(j_lo)))) }
}

#[inline(always)]
unsafe fn q4_k_block(bx: &BlockQ4K, by: &BlockQ8K) -> Part {
    // SAFETY: in-bounds 32-byte loads (checked by `load32_at`) and register arithmetic.
    unsafe {
        let (sc, mins) = k4_scales_mins(&bx.scales, by);
        let mask = _mm256_set1_epi8(0x0F);
        let mut sumi = _mm256_setzero_si256();
        for c in 0..4 {
            let q = load32_at(&bx.qs, c * 32);
            let lo = _mm256_and_si256(q, mask);
            let hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), mask);
            let pl = _mm256_maddubs_epi16(lo, load32_at(&by.qs, c * 64));
            let ph = _mm256_maddubs_epi16(hi, load32_at(&by.qs, c * 64 + 32));
            let j = 2 * c as i32;
            let pl = _mm256_madd_epi16(pl, pick16(sc, j, j));
            let ph = _mm256_madd_epi16(ph, pick16(sc, j + 1, j + 1));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(pl, ph));
        }
        let (dy, (d, dmin)) = (q8k_d(by), f16_pair(bx.d, bx.dmin));
        Part { sumi, scale: dy * d, minus: dy * dmin * mins as f32 }
    }
}

#[inline(always)]
unsafe fn q5_k_block(bx: &BlockQ5K, by: &BlockQ8K) -> Part {
    // SAFETY: in-bounds 32-byte loads (checked by `load32_at`) and register arithmetic.
    unsafe {
        let (sc, mins) = k4_scales_mins(&bx.scales, by);
        let mask = _mm256_set1_epi8(0x0F);
        let one = _mm256_set1_epi8(1);
        let hbits = load32(&bx.qh);
        let mut sumi = _mm256_setzero_si256();
        for c in 0..4 {
            let q = load32_at(&bx.qs, c * 32);
            let sh0 = _mm_cvtsi32_si128(2 * c as i32);
            let sh1 = _mm_cvtsi32_si128(2 * c as i32 + 1);
            let h0 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(hbits, sh0), one), 4);
            let h1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(hbits, sh1), one), 4);
            let lo = _mm256_or_si256(_mm256_and_si256(q, mask), h0);
            let hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), mask), h1);
            let pl = _mm256_maddubs_epi16(lo, load32_at(&by.qs, c * 64));
            let ph = _mm256_maddubs_epi16(hi, load32_at(&by.qs, c * 64 + 32));
            let j = 2 * c as i32;
            let pl = _mm256_madd_epi16(pl, pick16(sc, j, j));
            let ph = _mm256_madd_epi16(ph, pick16(sc, j + 1, j + 1));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(pl, ph));
        }
        let (dy, (d, dmin)) = (q8k_d(by), f16_pair(bx.d, bx.dmin));
        Part { sumi, scale: dy * d, minus: dy * dmin * mins as f32 }
    }
}

#[inline(always)]
unsafe fn q6_k_block(bx: &BlockQ6K, by: &BlockQ8K) -> Part {
    // SAFETY: in-bounds 32-byte loads (checked by `load32_at`) and register arithmetic.
    unsafe {
        let mut sumi = _mm256_setzero_si256();
        for n in 0..2 {
            let (qs, sv) = q6k_half(bx, n);
            for (k, q) in qs.into_iter().enumerate() {
                let y = load32_at(&by.qs, n * 128 + 32 * k);
                let p =
                    _mm256_madd_epi16(_mm256_maddubs_epi16(q, y), pick16(sv, 2 * k as i32, 2 * k as i32 + 1));
                sumi = _mm256_add_epi32(sumi, p);
            }
        }
        let sumi = _mm256_sub_epi32(sumi, q6k_offset(bx, by));
        let (d, _) = f16_pair(bx.d, bx.d);
        Part { sumi, scale: q8k_d(by) * d, minus: 0.0 }
    }
}

/// The four 32-quant vectors (0..=63, without the -32) of half `n` of a Q6_K block, and its eight
/// scales as i16 in both lanes.
#[inline(always)]
pub(in crate::quant::x86_64) unsafe fn q6k_half(bx: &BlockQ6K, n: usize) -> ([__m256i; 4], __m256i) {
    // SAFETY: in-bounds loads (8 bytes of the 16-byte `scales` at n·8, `load32_at` checks the
    // rest) and register arithmetic under AVX2.
    unsafe {
        let m4 = _mm256_set1_epi8(0x0F);
        let m30 = _mm256_set1_epi8(0x30);
        let sv8 = _mm_loadl_epi64(bx.scales[n * 8..].as_ptr().cast());
        let sv = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(sv8));
        let l0 = load32_at(&bx.ql, n * 64);
        let l1 = load32_at(&bx.ql, n * 64 + 32);
        let h = load32_at(&bx.qh, n * 32);
        // Bit pairs 0-1, 2-3, 4-5, 6-7 of `h` moved to bits 4-5 (the 16-bit shifts leak bits
        // across bytes, which the 0x30 mask removes).
        let h0 = _mm256_and_si256(_mm256_slli_epi16(h, 4), m30);
        let h1 = _mm256_and_si256(_mm256_slli_epi16(h, 2), m30);
        let h2 = _mm256_and_si256(h, m30);
        let h3 = _mm256_and_si256(_mm256_srli_epi16(h, 2), m30);
        let q0 = _mm256_or_si256(_mm256_and_si256(l0, m4), h0);
        let q1 = _mm256_or_si256(_mm256_and_si256(l1, m4), h1);
        let q2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), h2);
        let q3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4), h3);
        ([q0, q1, q2, q3], sv)
    }
}

/// `32 · Σ_g scale_g · bsum_g` as 8 i32 lanes: what the quants' missing -32 contributes.
#[inline(always)]
pub(super) unsafe fn q6k_offset(bx: &BlockQ6K, by: &BlockQ8K) -> __m256i {
    // SAFETY: 16-byte read of `scales` and 32-byte read of `bsums` (whole fields); AVX2 arithmetic.
    unsafe {
        let s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(bx.scales.as_ptr().cast()));
        let offset = _mm256_madd_epi16(s16, _mm256_loadu_si256(by.bsums.as_ptr().cast()));
        _mm256_slli_epi32(offset, 5)
    }
}

#[inline(always)]
unsafe fn q2_k_block(bx: &BlockQ2K, by: &BlockQ8K) -> Part {
    // SAFETY: in-bounds 16/32-byte loads (whole fields, or checked by `load32_at`) and register
    // arithmetic.
    unsafe {
        let m2 = _mm256_set1_epi8(0x03);
        let raw = _mm_loadu_si128(bx.scales.as_ptr().cast());
        let lo4 = _mm_and_si128(raw, _mm_set1_epi8(0x0F));
        let mn = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), _mm_set1_epi8(0x0F)));
        let m = _mm256_madd_epi16(mn, _mm256_loadu_si256(by.bsums.as_ptr().cast()));
        let mut sumi = _mm256_setzero_si256();
        for n in 0..2 {
            let bits = load32_at(&bx.qs, n * 32);
            let half = if n == 0 { lo4 } else { _mm_srli_si128(lo4, 8) };
            let sv = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(half));
            for j in 0..4 {
                let q = _mm256_and_si256(_mm256_srl_epi16(bits, _mm_cvtsi32_si128(2 * j as i32)), m2);
                let y = load32_at(&by.qs, n * 128 + j * 32);
                let p =
                    _mm256_madd_epi16(_mm256_maddubs_epi16(q, y), pick16(sv, 2 * j as i32, 2 * j as i32 + 1));
                sumi = _mm256_add_epi32(sumi, p);
            }
        }
        let mins = hsum_epi32(m);
        let (dy, (d, dmin)) = (q8k_d(by), f16_pair(bx.d, bx.dmin));
        Part { sumi, scale: dy * d, minus: dy * dmin * mins as f32 }
    }
}

#[inline(always)]
unsafe fn q3_k_block(bx: &BlockQ3K, by: &BlockQ8K) -> Part {
    let sc = q3k_scales(&bx.scales);
    // SAFETY: in-bounds 32-byte loads (checked by `load32_at`) and register arithmetic.
    unsafe {
        let m2 = _mm256_set1_epi8(0x03);
        let four = _mm256_set1_epi8(4);
        let hbits = load32(&bx.hmask);
        let sc16 = _mm_loadu_si128(sc.as_ptr().cast());
        let mut sumi = _mm256_setzero_si256();
        for n in 0..2 {
            let bits = load32_at(&bx.qs, n * 32);
            let sv = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(if n == 0 {
                sc16
            } else {
                _mm_srli_si128(sc16, 8)
            }));
            for j in 0..4 {
                let q = _mm256_and_si256(_mm256_srl_epi16(bits, _mm_cvtsi32_si128(2 * j as i32)), m2);
                // 4 where the high bit is clear: the quant is low2 - 4 there.
                let bit = _mm256_set1_epi8((1u8 << (4 * n + j)) as i8);
                let clear = _mm256_cmpeq_epi8(_mm256_and_si256(hbits, bit), _mm256_setzero_si256());
                let off = _mm256_and_si256(clear, four);
                let y = load32_at(&by.qs, n * 128 + j * 32);
                let p = _mm256_sub_epi16(_mm256_maddubs_epi16(q, y), _mm256_maddubs_epi16(off, y));
                let p = _mm256_madd_epi16(p, pick16(sv, 2 * j as i32, 2 * j as i32 + 1));
                sumi = _mm256_add_epi32(sumi, p);
            }
        }
        let (d, _) = f16_pair(bx.d, bx.d);
        Part { sumi, scale: q8k_d(by) * d, minus: 0.0 }
    }
}

#[inline(always)]
unsafe fn iq4_xs_block(bx: &BlockIq4Xs, by: &BlockQ8K) -> Part {
    // SAFETY: in-bounds 16/32-byte loads (checked) and register arithmetic.
    unsafe {
        let lut = iq4_lut();
        let mut sumi = _mm256_setzero_si256();
        for ib in 0..8 {
            let nib: &[u8; 16] = bx.qs[ib * 16..ib * 16 + 16].try_into().unwrap_or(&[0; 16]);
            let q = _mm256_shuffle_epi8(lut, nibbles32(nib));
            let p = dot_i8i8_epi16(q, load32_at(&by.qs, ib * 32));
            let ls = (iq4xs_scale(bx, ib) - 32) as i16;
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, _mm256_set1_epi16(ls)));
        }
        let (d, _) = f16_pair(bx.d, bx.d);
        Part { sumi, scale: q8k_d(by) * d, minus: 0.0 }
    }
}
