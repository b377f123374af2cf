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
use crate::quant::scalar::k4_scales;

/// Checks `n` and the row lengths, returning the block slices.
fn rows<'a, X: bytemuck::Pod>(n: usize, x: &'a [u8], y: &'a [u8]) -> (&'a [X], &'a [BlockQ8K]) {
    assert_eq!(n % QK_K, 0, "vec_dot: n = {n} is not a whole number of super-blocks");
    (take_blocks::<X>(x, n / QK_K), take_blocks::<BlockQ8K>(y, n / QK_K))
}

#[inline(always)]
fn q8k_d(b: &BlockQ8K) -> f32 {
    f32::from_le_bytes(b.d)
}

#[inline(always)]
fn bsum(b: &BlockQ8K, g: usize) -> i32 {
    i16::from_le_bytes(b.bsums[g]) as i32
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

/// The min term `Σ mn_j · (bsum_2j + bsum_2j+1)` of Q4_K/Q5_K.
#[inline(always)]
fn k4_min_term(sm: &[(u8, u8); 8], by: &BlockQ8K) -> i32 {
    sm.iter().enumerate().map(|(j, &(_, mn))| mn as i32 * (bsum(by, 2 * j) + bsum(by, 2 * j + 1))).sum()
}

#[inline(always)]
unsafe fn q4_k_block(bx: &BlockQ4K, by: &BlockQ8K) -> Part {
    let sm = k4_scales(&bx.scales);
    // SAFETY: in-bounds 32-byte loads (checked by `load32_at`) and register arithmetic.
    unsafe {
        let mask = _mm256_set1_epi8(0x0F);
        let mut sumi = _mm256_setzero_si256();
        for c in 0..4 {
            let q = load32_at(&bx.qs, c * 32);
            let lo = _mm256_and_si256(q, mask);
            let hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), mask);
            let pl = _mm256_maddubs_epi16(lo, load32_at(&by.qs, c * 64));
            let ph = _mm256_maddubs_epi16(hi, load32_at(&by.qs, c * 64 + 32));
            let pl = _mm256_madd_epi16(pl, _mm256_set1_epi16(sm[2 * c].0 as i16));
            let ph = _mm256_madd_epi16(ph, _mm256_set1_epi16(sm[2 * c + 1].0 as i16));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(pl, ph));
        }
        let dy = q8k_d(by);
        Part { sumi, scale: dy * f16(bx.d), minus: dy * f16(bx.dmin) * k4_min_term(&sm, by) as f32 }
    }
}

#[inline(always)]
unsafe fn q5_k_block(bx: &BlockQ5K, by: &BlockQ8K) -> Part {
    let sm = k4_scales(&bx.scales);
    // SAFETY: in-bounds 32-byte loads (checked by `load32_at`) and register arithmetic.
    unsafe {
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
            let pl = _mm256_madd_epi16(pl, _mm256_set1_epi16(sm[2 * c].0 as i16));
            let ph = _mm256_madd_epi16(ph, _mm256_set1_epi16(sm[2 * c + 1].0 as i16));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(pl, ph));
        }
        let dy = q8k_d(by);
        Part { sumi, scale: dy * f16(bx.d), minus: dy * f16(bx.dmin) * k4_min_term(&sm, by) as f32 }
    }
}

/// `maddubs(q, y) - maddubs(off, y)` scaled per lane by `(s_lo, s_hi)` and widened: the signed
/// dot of `q - off` against `y` for two 16-element sub-blocks.
#[inline(always)]
unsafe fn scaled_pair(q: __m256i, off: __m256i, y: __m256i, s_lo: i16, s_hi: i16) -> __m256i {
    // SAFETY: register arithmetic; the caller has AVX2 enabled.
    unsafe {
        let p = _mm256_sub_epi16(_mm256_maddubs_epi16(q, y), _mm256_maddubs_epi16(off, y));
        _mm256_madd_epi16(p, lanes_epi16(s_lo, s_hi))
    }
}

#[inline(always)]
unsafe fn q6_k_block(bx: &BlockQ6K, by: &BlockQ8K) -> Part {
    // SAFETY: in-bounds 32-byte loads (checked by `load32_at`) and register arithmetic.
    unsafe {
        let m4 = _mm256_set1_epi8(0x0F);
        let m2 = _mm256_set1_epi8(0x03);
        let off = _mm256_set1_epi8(32);
        let s = &bx.scales;
        let mut sumi = _mm256_setzero_si256();
        for n in 0..2 {
            let l0 = load32_at(&bx.ql, n * 64);
            let l1 = load32_at(&bx.ql, n * 64 + 32);
            let h = load32_at(&bx.qh, n * 32);
            let hb = |k: i32| {
                _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(h, _mm_cvtsi32_si128(k)), m2), 4)
            };
            let q0 = _mm256_or_si256(_mm256_and_si256(l0, m4), hb(0));
            let q1 = _mm256_or_si256(_mm256_and_si256(l1, m4), hb(2));
            let q2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), hb(4));
            let q3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4), hb(6));
            let (e, g) = (n * 128, n * 8);
            for (k, q) in [q0, q1, q2, q3].into_iter().enumerate() {
                let y = load32_at(&by.qs, e + 32 * k);
                let p = scaled_pair(q, off, y, s[g + 2 * k] as i16, s[g + 2 * k + 1] as i16);
                sumi = _mm256_add_epi32(sumi, p);
            }
        }
        Part { sumi, scale: q8k_d(by) * f16(bx.d), minus: 0.0 }
    }
}

#[inline(always)]
unsafe fn q2_k_block(bx: &BlockQ2K, by: &BlockQ8K) -> Part {
    let mins: i32 = (0..16).map(|g| (bx.scales[g] >> 4) as i32 * bsum(by, g)).sum();
    // SAFETY: in-bounds 32-byte loads (checked by `load32_at`) and register arithmetic.
    unsafe {
        let m2 = _mm256_set1_epi8(0x03);
        let zero = _mm256_setzero_si256();
        let mut sumi = _mm256_setzero_si256();
        for n in 0..2 {
            let bits = load32_at(&bx.qs, n * 32);
            for j in 0..4 {
                let q = _mm256_and_si256(_mm256_srl_epi16(bits, _mm_cvtsi32_si128(2 * j as i32)), m2);
                let y = load32_at(&by.qs, n * 128 + j * 32);
                let g = n * 8 + 2 * j;
                let (s0, s1) = ((bx.scales[g] & 0xF) as i16, (bx.scales[g + 1] & 0xF) as i16);
                sumi = _mm256_add_epi32(sumi, scaled_pair(q, zero, y, s0, s1));
            }
        }
        let dy = q8k_d(by);
        Part { sumi, scale: dy * f16(bx.d), minus: dy * f16(bx.dmin) * mins as f32 }
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
        let mut sumi = _mm256_setzero_si256();
        for n in 0..2 {
            let bits = load32_at(&bx.qs, n * 32);
            for j in 0..4 {
                let q = _mm256_and_si256(_mm256_srl_epi16(bits, _mm_cvtsi32_si128(2 * j as i32)), m2);
                // 4 where the high bit is clear: the quant is low2 - 4 there.
                let bit = _mm256_set1_epi8((1u8 << (4 * n + j)) as i8);
                let clear = _mm256_cmpeq_epi8(_mm256_and_si256(hbits, bit), _mm256_setzero_si256());
                let off = _mm256_and_si256(clear, four);
                let y = load32_at(&by.qs, n * 128 + j * 32);
                let g = n * 8 + 2 * j;
                sumi = _mm256_add_epi32(sumi, scaled_pair(q, off, y, sc[g] as i16, sc[g + 1] as i16));
            }
        }
        Part { sumi, scale: q8k_d(by) * f16(bx.d), minus: 0.0 }
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
        Part { sumi, scale: q8k_d(by) * f16(bx.d), minus: 0.0 }
    }
}
