//! AVX2 dot products of the K-quants and IQ4_XS against Q8_K
//! (ref: ggml-compute-semantics.md §2.2 layouts, §2.3 dot products).
//!
//! Every 32-byte vector of quants covers two 16-element sub-blocks (one per 128-bit lane) or one
//! 32-element sub-block, so the integer scales are applied with `madd_epi16` against a vector
//! holding the right scale in each lane; the per-super-block integer sum is then scaled once.
//!
//! The float steps are ggml's AVX2 ones (`ggml_vec_dot_q*_K_q8_K`, x86 `quants.c`), so results are
//! bit-identical to llama.cpp's x86 CPU backend: per 32-bit lane the same exact integer sums, the same
//! `fma`s into the same accumulators (Q2_K's mins per lane into the main one, Q4_K's into a 4-lane
//! one, Q5_K's into a fused scalar sum), the same final reductions. The scalar model of that order,
//! and the kernels' bit-exact twin, is `quant::scalar::kquants_x86`.

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

/// What one super-block contributes: `scale · lanes(sumi)` plus its mins term.
struct Part {
    sumi: __m256i,
    scale: f32,
    mins: Mins,
}

/// The mins term of a super-block in ggml's AVX2 form, with `dmin = -d_y · dmin_x`.
enum Mins {
    /// No mins (Q3_K, Q6_K, IQ4_XS).
    None,
    /// Q2_K: `acc = fma(dmin, float(lanes), acc)` before the block's own product.
    Lanes8(__m256i, f32),
    /// Q4_K: a separate 4-lane accumulator `acc_m = fma(dmin, float(lanes), acc_m)`.
    Lanes4(__m128i, f32),
    /// Q5_K: a scalar `summs = fma(dmin, float(mins), summs)`.
    Scalar(i32, f32),
}

/// Accumulates one super-block into ggml's accumulators (the scalar model is
/// `quant::scalar::kquants_x86`).
#[inline(always)]
unsafe fn accumulate(p: Part, acc: &mut __m256, acc_m: &mut __m128, summs: &mut f32) {
    // SAFETY: register arithmetic under the caller's AVX2 + FMA.
    unsafe {
        match p.mins {
            Mins::None => {}
            Mins::Lanes8(m, dmin) => {
                *acc = _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(m), *acc)
            }
            Mins::Lanes4(m, dmin) => *acc_m = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(m), *acc_m),
            Mins::Scalar(m, dmin) => *summs = dmin.mul_add(m as f32, *summs),
        }
        *acc = _mm256_fmadd_ps(_mm256_set1_ps(p.scale), _mm256_cvtepi32_ps(p.sumi), *acc);
    }
}

/// ggml's finish: the horizontal sum of `acc`, plus Q4_K's `(m0 + m2) + (m1 + m3)` or Q5_K's `summs`.
#[inline(always)]
pub(in crate::quant::x86_64) unsafe fn finish(kind: MinsKind, acc: __m256, acc_m: __m128, summs: f32) -> f32 {
    // SAFETY: register arithmetic under the caller's AVX.
    unsafe {
        let h = hsum_ps(acc);
        match kind {
            MinsKind::Lanes4 => h + hsum_m(acc_m),
            MinsKind::Scalar => h + summs,
            MinsKind::Other => h,
        }
    }
}

/// `(m0 + m2) + (m1 + m3)`: the reduction of Q4_K's min accumulator.
#[inline(always)]
pub(in crate::quant::x86_64) unsafe fn hsum_m(m: __m128) -> f32 {
    // SAFETY: register arithmetic under SSE3.
    unsafe {
        let m = _mm_add_ps(m, _mm_movehl_ps(m, m));
        _mm_cvtss_f32(_mm_add_ss(m, _mm_movehdup_ps(m)))
    }
}

/// Which finish a type takes.
#[derive(Clone, Copy)]
pub(in crate::quant::x86_64) enum MinsKind {
    Lanes4,
    Scalar,
    Other,
}

macro_rules! kernel {
    ($pub_name:ident, $loop_name:ident, $inner:ident, $blk:ty, $kind:expr) => {
        /// Dot product against Q8_K in ggml's AVX2 order (see the module docs).
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
                let mut acc_m = _mm_setzero_ps();
                let mut summs = 0.0f32;
                for (bx, by) in xs.iter().zip(ys) {
                    accumulate($inner(bx, by), &mut acc, &mut acc_m, &mut summs);
                }
                finish($kind, acc, acc_m, summs)
            }
        }
    };
}

kernel!(vec_dot_q4_k_q8_k, q4_k_loop, q4_k_block, BlockQ4K, MinsKind::Lanes4);
kernel!(vec_dot_q5_k_q8_k, q5_k_loop, q5_k_block, BlockQ5K, MinsKind::Scalar);
kernel!(vec_dot_q6_k_q8_k, q6_k_loop, q6_k_block, BlockQ6K, MinsKind::Other);
kernel!(vec_dot_q2_k_q8_k, q2_k_loop, q2_k_block, BlockQ2K, MinsKind::Other);
kernel!(vec_dot_q3_k_q8_k, q3_k_loop, q3_k_block, BlockQ3K, MinsKind::Other);
kernel!(vec_dot_iq4_xs_q8_k, iq4_xs_loop, iq4_xs_block, BlockIq4Xs, MinsKind::Other);

/// ggml's tiled product per super-block: `r = d_x·float(s1)` (minus `dmin_x·float(s2)`, fused),
/// then `acc = fma(r, d_y, acc)`; `s1` and `s2` are the block's exact integer sums, here the lane
/// sums of the one-column kernel's [`Part`] (ref: ggml-cpu `tiled/tiled-kernel.cpp`, AVX2 epilogue;
/// scalar model `quant::scalar::kquants_x86`).
#[inline(always)]
fn tiled_step(p: &Part, dx: f32, dmin_x: f32, dy: f32, acc: f32) -> f32 {
    // SAFETY: register arithmetic under the caller's AVX2.
    let (s1, s2) = unsafe {
        let s2 = match p.mins {
            Mins::None => 0,
            Mins::Lanes8(m, _) => hsum_epi32(m),
            Mins::Lanes4(m, _) => hsum_epi32_4(m),
            Mins::Scalar(m, _) => m,
        };
        (hsum_epi32(p.sumi), s2)
    };
    let mut r = dx * s1 as f32;
    if !matches!(p.mins, Mins::None) {
        r = (-dmin_x).mul_add(s2 as f32, r);
    }
    r.mul_add(dy, acc)
}

macro_rules! tiled_kernel {
    ($pub_name:ident, $loop_name:ident, $inner:ident, $blk:ty, |$b:ident| $dd:expr) => {
        /// Dot product against Q8_K in the order of ggml's tiled product (see [`tiled_step`]).
        pub(super) fn $pub_name(n: usize, x: &[u8], y: &[u8]) -> f32 {
            let (xs, ys) = rows::<$blk>(n, x, y);
            // SAFETY: installed only after AVX2/FMA/F16C detection (module docs of `avx2`);
            // the blocks are whole structs.
            unsafe { $loop_name(xs, ys) }
        }

        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn $loop_name(xs: &[$blk], ys: &[BlockQ8K]) -> f32 {
            let mut acc = 0.0f32;
            for ($b, by) in xs.iter().zip(ys) {
                // SAFETY: register arithmetic and whole-block reads; features enabled on this fn.
                let p = unsafe { $inner($b, by) };
                // SAFETY: F16C enabled on this fn.
                let (dx, dmin_x) = unsafe { $dd };
                acc = tiled_step(&p, dx, dmin_x, q8k_d(by), acc);
            }
            acc
        }
    };
}

tiled_kernel!(vec_dot_q2_k_q8_k_tiled, q2_k_tiled, q2_k_block, BlockQ2K, |b| f16_pair(b.d, b.dmin));
tiled_kernel!(vec_dot_q3_k_q8_k_tiled, q3_k_tiled, q3_k_block, BlockQ3K, |b| f16_pair(b.d, b.d));
tiled_kernel!(vec_dot_q4_k_q8_k_tiled, q4_k_tiled, q4_k_block, BlockQ4K, |b| f16_pair(b.d, b.dmin));
tiled_kernel!(vec_dot_q5_k_q8_k_tiled, q5_k_tiled, q5_k_block, BlockQ5K, |b| f16_pair(b.d, b.dmin));
tiled_kernel!(vec_dot_q6_k_q8_k_tiled, q6_k_tiled, q6_k_block, BlockQ6K, |b| f16_pair(b.d, b.d));
tiled_kernel!(vec_dot_iq4_xs_q8_k_tiled, iq4_xs_tiled, iq4_xs_block, BlockIq4Xs, |b| f16_pair(b.d, b.d));

/// [`vec_dot_q4_k_q8_k_tiled`] of one weight row against four activation rows: each super-block's
/// nibbles and scales decoded once; every column's exact integer sums and float steps as the
/// one-column kernel's, so each output has its bits.
pub(super) fn vec_dot_q4_k_q8_k_tiled_x4(n: usize, x: &[u8], y: [&[u8]; 4]) -> [f32; 4] {
    let (xs, _) = rows::<BlockQ4K>(n, x, y[0]);
    let ys = y.map(|r| take_blocks::<BlockQ8K>(r, n / QK_K));
    // SAFETY: installed only after AVX2/FMA/F16C detection (module docs of `avx2`); the blocks are
    // whole structs, as many in every row.
    unsafe { q4_k_tiled_x4(xs, ys) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_k_tiled_x4(xs: &[BlockQ4K], ys: [&[BlockQ8K]; 4]) -> [f32; 4] {
    let mut acc = [0.0f32; 4];
    // SAFETY: in-bounds 32-byte loads (checked by `load32_at`), 16-byte reads of whole fields, and
    // register arithmetic; features enabled on this fn.
    unsafe {
        let mask = _mm256_set1_epi8(0x0F);
        for (b, bx) in xs.iter().enumerate() {
            let u = k4_unpack(&bx.scales);
            let v = _mm_loadu_si128(u.as_ptr().cast());
            let sc = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(v));
            let mn = _mm_cvtepu8_epi16(_mm_srli_si128(v, 8));
            let mut sumi = [_mm256_setzero_si256(); 4];
            for c in 0..4 {
                let q = load32_at(&bx.qs, c * 32);
                let lo = _mm256_and_si256(q, mask);
                let hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), mask);
                let j = 2 * c as i32;
                let (sl, sh) = (pick16(sc, j, j), pick16(sc, j + 1, j + 1));
                for (s, yk) in sumi.iter_mut().zip(&ys) {
                    let by = &yk[b];
                    let pl = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, load32_at(&by.qs, c * 64)), sl);
                    let ph = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, load32_at(&by.qs, c * 64 + 32)), sh);
                    *s = _mm256_add_epi32(*s, _mm256_add_epi32(pl, ph));
                }
            }
            let (d, dmin) = f16_pair(bx.d, bx.dmin);
            for k in 0..4 {
                let by = &ys[k][b];
                let b0 = _mm_loadu_si128(by.bsums.as_ptr().cast());
                let b1 = _mm_loadu_si128(by.bsums[8..].as_ptr().cast());
                let mins = _mm_madd_epi16(mn, _mm_hadd_epi16(b0, b1));
                let dy = q8k_d(by);
                let p = Part { sumi: sumi[k], scale: dy * d, mins: Mins::Lanes4(mins, -dy * dmin) };
                acc[k] = tiled_step(&p, d, dmin, dy, acc[k]);
            }
        }
    }
    acc
}

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

/// The eight Q4_K/Q5_K scales as i16 in both lanes, and ggml's four min lanes
/// `mn_2k·(bsum_4k + bsum_4k+1) + mn_2k+1·(bsum_4k+2 + bsum_4k+3)`.
#[inline(always)]
unsafe fn k4_scales_mins(scales: &[u8; 12], by: &BlockQ8K) -> (__m256i, __m128i) {
    let u = k4_unpack(scales);
    // SAFETY: 16-byte reads of the 16-byte `u` and of the 32-byte `bsums` halves; register
    // arithmetic under AVX2.
    unsafe {
        let v = _mm_loadu_si128(u.as_ptr().cast());
        let sc = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(v));
        let mn = _mm_cvtepu8_epi16(_mm_srli_si128(v, 8));
        let b0 = _mm_loadu_si128(by.bsums.as_ptr().cast());
        let b1 = _mm_loadu_si128(by.bsums[8..].as_ptr().cast());
        (sc, _mm_madd_epi16(mn, _mm_hadd_epi16(b0, b1)))
    }
}

/// Sum of the 4 i32 lanes.
#[inline(always)]
unsafe fn hsum_epi32_4(m: __m128i) -> i32 {
    // SAFETY: register arithmetic under SSE2.
    unsafe {
        let m = _mm_add_epi32(m, _mm_unpackhi_epi64(m, m));
        _mm_cvtsi128_si32(_mm_add_epi32(m, _mm_shuffle_epi32(m, 0b01)))
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
        Part { sumi, scale: dy * d, mins: Mins::Lanes4(mins, -dy * dmin) }
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
        Part { sumi, scale: dy * d, mins: Mins::Scalar(hsum_epi32_4(mins), -dy * dmin) }
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
        Part { sumi, scale: q8k_d(by) * d, mins: Mins::None }
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
        let (dy, (d, dmin)) = (q8k_d(by), f16_pair(bx.d, bx.dmin));
        Part { sumi, scale: dy * d, mins: Mins::Lanes8(m, -dy * dmin) }
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
        Part { sumi, scale: q8k_d(by) * d, mins: Mins::None }
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
        Part { sumi, scale: q8k_d(by) * d, mins: Mins::None }
    }
}
