//! AVX2 four-column dot products: one weight row against four activation rows, decoding each
//! weight block (nibbles, signs, scales) once and reusing it for the four columns.
//! ref: ggml-compute-semantics.md §2.2, §2.3.

use std::arch::x86_64::*;

use super::kquants::{hsum_m, k4_unpack, pick16, q6k_half, q6k_offset};
use super::util::*;
use crate::dtype::QK_K;
use crate::quant::blocks::*;
use crate::quant::scalar::k4_scales;

/// Checks `n` and the lengths of the weight row and the four activation rows.
pub(in crate::quant::x86_64) fn rows4<'a, X: bytemuck::Pod, Y: bytemuck::Pod>(
    n: usize,
    qk: usize,
    x: &'a [u8],
    y: [&'a [u8]; 4],
) -> (&'a [X], [&'a [Y]; 4]) {
    assert_eq!(n % qk, 0, "vec_dot_x4: n = {n} is not a whole number of blocks of {qk}");
    (take_blocks::<X>(x, n / qk), y.map(|r| take_blocks::<Y>(r, n / qk)))
}

macro_rules! wrapper {
    ($pub_name:ident, $inner:ident, $x:ty, $y:ty, $qk:expr) => {
        /// Four dot products sharing the weight row (see the module docs).
        pub(super) fn $pub_name(n: usize, x: &[u8], y: [&[u8]; 4]) -> [f32; 4] {
            let (xs, ys) = rows4::<$x, $y>(n, $qk, x, y);
            // SAFETY: installed only after AVX2/FMA/F16C detection (module docs of `avx2`); every
            // row holds n / qk whole blocks (checked above).
            unsafe { $inner(xs, ys) }
        }
    };
}

wrapper!(vec_dot_q4_0_q8_0_x4, q4_0_x4, BlockQ4_0, BlockQ8_0, QK);
wrapper!(vec_dot_q4_1_q8_1_x4, q4_1_x4, BlockQ4_1, BlockQ8_1, QK);
wrapper!(vec_dot_q5_0_q8_0_x4, q5_0_x4, BlockQ5_0, BlockQ8_0, QK);
wrapper!(vec_dot_q8_0_q8_0_x4, q8_0_x4, BlockQ8_0, BlockQ8_0, QK);
wrapper!(vec_dot_q4_k_q8_k_x4, q4_k_x4, BlockQ4K, BlockQ8K, QK_K);
wrapper!(vec_dot_q6_k_q8_k_x4, q6_k_x4, BlockQ6K, BlockQ8K, QK_K);

/// Horizontal sums of four accumulators.
#[inline(always)]
pub(in crate::quant::x86_64) unsafe fn hsum4(acc: [__m256; 4]) -> [f32; 4] {
    // SAFETY: register arithmetic under AVX.
    unsafe { [hsum_ps(acc[0]), hsum_ps(acc[1]), hsum_ps(acc[2]), hsum_ps(acc[3])] }
}

/// Signed weight bytes `q` (|q| ≤ 127) against column `c`: `|q|` is shared, `q`'s sign moves to y.
#[inline(always)]
unsafe fn signed_col(aq: __m256i, q: __m256i, y: __m256i) -> __m256 {
    // SAFETY: register arithmetic under AVX2.
    unsafe {
        _mm256_cvtepi32_ps(_mm256_madd_epi16(
            _mm256_maddubs_epi16(aq, _mm256_sign_epi8(y, q)),
            _mm256_set1_epi16(1),
        ))
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_0_x4(xs: &[BlockQ4_0], ys: [&[BlockQ8_0]; 4]) -> [f32; 4] {
    // SAFETY: all block slices have xs.len() blocks (checked by the wrapper); register arithmetic.
    unsafe {
        let mut acc = [_mm256_setzero_ps(); 4];
        for (i, bx) in xs.iter().enumerate() {
            let q = _mm256_sub_epi8(nibbles32(&bx.qs), _mm256_set1_epi8(8));
            let aq = _mm256_sign_epi8(q, q);
            for c in 0..4 {
                let by = &ys[c][i];
                let v = signed_col(aq, q, load32(&by.qs));
                acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(f16_mul(bx.d, by.d)), v, acc[c]);
            }
        }
        hsum4(acc)
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_0_x4(xs: &[BlockQ5_0], ys: [&[BlockQ8_0]; 4]) -> [f32; 4] {
    // SAFETY: all block slices have xs.len() blocks (checked by the wrapper); register arithmetic.
    unsafe {
        let (b4, sixteen, ones) = (_mm256_set1_epi8(0x10), _mm256_set1_epi8(16), _mm256_set1_epi16(1));
        let mut acc = [_mm256_setzero_ps(); 4];
        for (i, bx) in xs.iter().enumerate() {
            // The unsigned 5-bit q = nib | hi<<4, as in the one-column kernel: Σ q·y - Σ 16·y.
            let hi = _mm256_and_si256(bytes_from_bits(u32::from_le_bytes(bx.qh)), b4);
            let q = _mm256_or_si256(nibbles32(&bx.qs), hi);
            for c in 0..4 {
                let by = &ys[c][i];
                let y = load32(&by.qs);
                let p = _mm256_sub_epi16(_mm256_maddubs_epi16(q, y), _mm256_maddubs_epi16(sixteen, y));
                let v = _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones));
                acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(f16_mul(bx.d, by.d)), v, acc[c]);
            }
        }
        hsum4(acc)
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_0_x4(xs: &[BlockQ8_0], ys: [&[BlockQ8_0]; 4]) -> [f32; 4] {
    // SAFETY: all block slices have xs.len() blocks (checked by the wrapper); register arithmetic.
    unsafe {
        let mut acc = [_mm256_setzero_ps(); 4];
        for (i, bx) in xs.iter().enumerate() {
            let q = load32(&bx.qs);
            let aq = _mm256_sign_epi8(q, q);
            for c in 0..4 {
                let by = &ys[c][i];
                let v = signed_col(aq, q, load32(&by.qs));
                acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(f16_mul(bx.d, by.d)), v, acc[c]);
            }
        }
        hsum4(acc)
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_1_x4(xs: &[BlockQ4_1], ys: [&[BlockQ8_1]; 4]) -> [f32; 4] {
    // SAFETY: all block slices have xs.len() blocks (checked by the wrapper); register arithmetic.
    unsafe {
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut ms = [_mm_setzero_ps(); 4];
        for (i, bx) in xs.iter().enumerate() {
            let q = nibbles32(&bx.qs);
            for c in 0..4 {
                let by = &ys[c][i];
                let p = dm_products(bytemuck::bytes_of(bx), bytemuck::bytes_of(by));
                ms[c] = _mm_add_ps(ms[c], p);
                let v = _mm256_cvtepi32_ps(dot_u8i8_epi32(q, load32(&by.qs)));
                acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(_mm_cvtss_f32(p)), v, acc[c]);
            }
        }
        let d = hsum4(acc);
        std::array::from_fn(|c| d[c] + _mm_cvtss_f32(_mm_movehdup_ps(ms[c])))
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_k_x4(xs: &[BlockQ4K], ys: [&[BlockQ8K]; 4]) -> [f32; 4] {
    // SAFETY: all block slices have xs.len() blocks (checked by the wrapper); in-bounds loads
    // (checked by `load32_at`); register arithmetic.
    unsafe {
        let mask = _mm256_set1_epi8(0x0F);
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut acc_m = [_mm_setzero_ps(); 4];
        for (i, bx) in xs.iter().enumerate() {
            let sm = k4_scales(&bx.scales);
            let (d, dmin) = f16_pair(bx.d, bx.dmin);
            let mut sumi = [_mm256_setzero_si256(); 4];
            for ch in 0..4 {
                let q = load32_at(&bx.qs, ch * 32);
                let lo = _mm256_and_si256(q, mask);
                let hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), mask);
                let (s0, s1) =
                    (_mm256_set1_epi16(sm[2 * ch].0 as i16), _mm256_set1_epi16(sm[2 * ch + 1].0 as i16));
                for c in 0..4 {
                    let pl =
                        _mm256_madd_epi16(_mm256_maddubs_epi16(lo, load32_at(&ys[c][i].qs, ch * 64)), s0);
                    let ph = _mm256_madd_epi16(
                        _mm256_maddubs_epi16(hi, load32_at(&ys[c][i].qs, ch * 64 + 32)),
                        s1,
                    );
                    sumi[c] = _mm256_add_epi32(sumi[c], _mm256_add_epi32(pl, ph));
                }
            }
            // The mins in ggml's form: four i32 lanes per column into a 4-lane accumulator.
            let u = k4_unpack(&bx.scales);
            let mn = _mm_cvtepu8_epi16(_mm_srli_si128(_mm_loadu_si128(u.as_ptr().cast()), 8));
            for c in 0..4 {
                let by = &ys[c][i];
                let dy = f32::from_le_bytes(by.d);
                let b0 = _mm_loadu_si128(by.bsums.as_ptr().cast());
                let b1 = _mm_loadu_si128(by.bsums[8..].as_ptr().cast());
                let m = _mm_madd_epi16(mn, _mm_hadd_epi16(b0, b1));
                acc_m[c] = _mm_fmadd_ps(_mm_set1_ps(-dy * dmin), _mm_cvtepi32_ps(m), acc_m[c]);
                acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(dy * d), _mm256_cvtepi32_ps(sumi[c]), acc[c]);
            }
        }
        let s = hsum4(acc);
        std::array::from_fn(|c| s[c] + hsum_m(acc_m[c]))
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6_k_x4(xs: &[BlockQ6K], ys: [&[BlockQ8K]; 4]) -> [f32; 4] {
    // SAFETY: all block slices have xs.len() blocks (checked by the wrapper); in-bounds loads
    // (checked by `load32_at`); register arithmetic.
    unsafe {
        let mut acc = [_mm256_setzero_ps(); 4];
        for (i, bx) in xs.iter().enumerate() {
            let mut sumi = [_mm256_setzero_si256(); 4];
            for n in 0..2 {
                let (qs, sv) = q6k_half(bx, n);
                for (k, q) in qs.into_iter().enumerate() {
                    let s = pick16(sv, 2 * k as i32, 2 * k as i32 + 1);
                    for c in 0..4 {
                        let y = load32_at(&ys[c][i].qs, n * 128 + 32 * k);
                        sumi[c] = _mm256_add_epi32(sumi[c], _mm256_madd_epi16(_mm256_maddubs_epi16(q, y), s));
                    }
                }
            }
            let (d, _) = f16_pair(bx.d, bx.d);
            for c in 0..4 {
                let by = &ys[c][i];
                let si = _mm256_sub_epi32(sumi[c], q6k_offset(bx, by));
                let dy = f32::from_le_bytes(by.d);
                acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(dy * d), _mm256_cvtepi32_ps(si), acc[c]);
            }
        }
        hsum4(acc)
    }
}
