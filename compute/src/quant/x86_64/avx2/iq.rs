//! AVX2 dot products of the grid IQ types, TQ1_0 and TQ2_0. The integer `Σ_g scale_g · Σ v·q8` of
//! each 256-element block is formed with `maddubs`/`madd` and the float part is the scalar
//! kernel's own; the integer is exact in both, so each result equals the scalar kernel's bit for
//! bit (`quant::tests::simd`). IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S and TQ2_0 are fused: grid entries and sign masks are
//! gathered straight into vectors and the signs applied to the activations (`sign_epi8`), so that
//! `maddubs` multiplies unsigned magnitudes by signed activations. IQ1_S, IQ1_M and TQ1_0 use the
//! scalar decoder and a vector integer sum.

use std::arch::x86_64::*;

use crate::dtype::QK_K;
use crate::quant::blocks::{
    as_blocks, f16le, BlockIq2S, BlockIq2Xs, BlockIq2Xxs, BlockIq3S, BlockIq3Xxs, BlockQ8K, BlockTq2_0,
};
use crate::quant::scalar::iq::{self, Decoded, SIGN7_MASKS, SIGN_MASKS};
use crate::quant::scalar::iq_grids::{IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID};

/// Horizontal sum of eight i32 lanes.
#[target_feature(enable = "avx2")]
fn hsum_i32(acc: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
    _mm_cvtsi128_si32(s)
}

/// `maddubs(magnitudes, q8 with the signs applied)` summed with scale `ls` into i32 lanes.
#[target_feature(enable = "avx2")]
fn signed_madd(mag: __m256i, signs: __m256i, q8: __m256i, ls: i16) -> __m256i {
    signed_madd2(mag, signs, q8, ls, ls)
}

/// As [`signed_madd`], with scale `ls0` for the first 16 elements and `ls1` for the last 16.
#[target_feature(enable = "avx2")]
fn signed_madd2(mag: __m256i, signs: __m256i, q8: __m256i, ls0: i16, ls1: i16) -> __m256i {
    // sign_epi8(q8, s): −q8 where s < 0, q8 where s > 0 (s = mask | 1 is never 0).
    let one = _mm256_set1_epi8(1);
    let q = _mm256_sign_epi8(q8, _mm256_or_si256(signs, one));
    // Elements 0..16 are i16 lanes 0..8 (the low 128 bits), 16..32 lanes 8..16.
    let scales = _mm256_set_m128i(_mm_set1_epi16(ls1), _mm_set1_epi16(ls0));
    _mm256_madd_epi16(_mm256_maddubs_epi16(mag, q), scales)
}

/// The 32 activations of sub-block `ib`.
#[target_feature(enable = "avx2")]
fn q8_at(y: &BlockQ8K, ib: usize) -> __m256i {
    let q = &y.qs[32 * ib..32 * ib + 32];
    // SAFETY: `q` is 32 bytes (the slice above is bounds-checked); unaligned load.
    unsafe { _mm256_loadu_si256(q.as_ptr() as *const __m256i) }
}

/// IQ2_XS blocks against Q8_K blocks: each block's exact integer sum.
#[target_feature(enable = "avx2")]
fn iq2_xs_isum(b: &BlockIq2Xs, y: &BlockQ8K) -> i32 {
    let mut acc = _mm256_setzero_si256();
    for ib in 0..8 {
        let q = |l: usize| u16::from_le_bytes([b.qs[2 * (4 * ib + l)], b.qs[2 * (4 * ib + l) + 1]]) as usize;
        let g = |l: usize| i64::from_le_bytes(bytemuck::cast(IQ2XS_GRID[q(l) & 511]));
        let m = |l: usize| SIGN7_MASKS[q(l) >> 9] as i64;
        let mag = _mm256_set_epi64x(g(3), g(2), g(1), g(0));
        let signs = _mm256_set_epi64x(m(3), m(2), m(1), m(0));
        let sc = b.scales[ib];
        let (ls0, ls1) = (2 * (sc & 15) as i16 + 1, 2 * (sc >> 4) as i16 + 1);
        acc = _mm256_add_epi32(acc, signed_madd2(mag, signs, q8_at(y, ib), ls0, ls1));
    }
    hsum_i32(acc)
}

/// IQ2_S blocks against Q8_K blocks: each block's exact integer sum.
#[target_feature(enable = "avx2")]
fn iq2_s_isum(b: &BlockIq2S, y: &BlockQ8K) -> i32 {
    let (idx, sg) = b.qs.split_at(QK_K / 8);
    let mut acc = _mm256_setzero_si256();
    for ib in 0..8 {
        let qh = b.qh[ib] as usize;
        let g = |l: usize| {
            let i = idx[4 * ib + l] as usize | ((qh << (8 - 2 * l)) & 0x300);
            i64::from_le_bytes(bytemuck::cast(IQ2S_GRID[i]))
        };
        let m = |l: usize| SIGN_MASKS[sg[4 * ib + l] as usize] as i64;
        let mag = _mm256_set_epi64x(g(3), g(2), g(1), g(0));
        let signs = _mm256_set_epi64x(m(3), m(2), m(1), m(0));
        let sc = b.scales[ib];
        let (ls0, ls1) = (2 * (sc & 15) as i16 + 1, 2 * (sc >> 4) as i16 + 1);
        acc = _mm256_add_epi32(acc, signed_madd2(mag, signs, q8_at(y, ib), ls0, ls1));
    }
    hsum_i32(acc)
}

/// IQ3_S blocks against Q8_K blocks: each block's exact integer sum.
#[target_feature(enable = "avx2")]
fn iq3_s_isum(b: &BlockIq3S, y: &BlockQ8K) -> i32 {
    let mut acc = _mm256_setzero_si256();
    for ib in 0..8 {
        let qh = b.qh[ib] as usize;
        let g = |l: usize, k: usize| {
            let i = b.qs[8 * ib + 2 * l + k] as usize | ((qh << (8 - 2 * l - k)) & 256);
            i32::from_le_bytes(IQ3S_GRID[i])
        };
        let mag = _mm256_set_epi32(g(3, 1), g(3, 0), g(2, 1), g(2, 0), g(1, 1), g(1, 0), g(0, 1), g(0, 0));
        let m = |l: usize| SIGN_MASKS[b.signs[4 * ib + l] as usize] as i64;
        let signs = _mm256_set_epi64x(m(3), m(2), m(1), m(0));
        let ls = 2 * ((b.scales[ib / 2] >> (4 * (ib % 2))) & 15) as i16 + 1;
        acc = _mm256_add_epi32(acc, signed_madd(mag, signs, q8_at(y, ib), ls));
    }
    hsum_i32(acc)
}

/// IQ2_XXS blocks against Q8_K blocks: each block's exact integer sum.
///
/// # Safety
/// AVX2 must be available.
#[target_feature(enable = "avx2")]
unsafe fn iq2_xxs_isum(b: &BlockIq2Xxs, y: &BlockQ8K) -> i32 {
    let mut acc = _mm256_setzero_si256();
    for ib in 0..8 {
        let q = &b.qs[8 * ib..8 * ib + 8];
        let aux = u32::from_le_bytes([q[4], q[5], q[6], q[7]]);
        let g = |l: usize| i64::from_le_bytes(bytemuck::cast(IQ2XXS_GRID[q[l] as usize]));
        let m = |l: usize| SIGN7_MASKS[((aux >> (7 * l)) & 127) as usize] as i64;
        let mag = _mm256_set_epi64x(g(3), g(2), g(1), g(0));
        let signs = _mm256_set_epi64x(m(3), m(2), m(1), m(0));
        // SAFETY: 32 bytes at offset 32·ib of the 256 quants; unaligned load.
        let q8 = unsafe { _mm256_loadu_si256(y.qs.as_ptr().add(32 * ib) as *const __m256i) };
        acc = _mm256_add_epi32(acc, signed_madd(mag, signs, q8, (2 * (aux >> 28) + 1) as i16));
    }
    hsum_i32(acc)
}

/// IQ3_XXS blocks against Q8_K blocks: each block's exact integer sum.
///
/// # Safety
/// AVX2 must be available.
#[target_feature(enable = "avx2")]
unsafe fn iq3_xxs_isum(b: &BlockIq3Xxs, y: &BlockQ8K) -> i32 {
    let (idx, sas) = b.qs.split_at(QK_K / 4);
    let mut acc = _mm256_setzero_si256();
    for ib in 0..8 {
        let aux = u32::from_le_bytes([sas[4 * ib], sas[4 * ib + 1], sas[4 * ib + 2], sas[4 * ib + 3]]);
        let g = |k: usize| i32::from_le_bytes(IQ3XXS_GRID[idx[8 * ib + k] as usize]);
        let m = |l: usize| SIGN7_MASKS[((aux >> (7 * l)) & 127) as usize] as i64;
        let mag = _mm256_set_epi32(g(7), g(6), g(5), g(4), g(3), g(2), g(1), g(0));
        let signs = _mm256_set_epi64x(m(3), m(2), m(1), m(0));
        // SAFETY: 32 bytes at offset 32·ib of the 256 quants; unaligned load.
        let q8 = unsafe { _mm256_loadu_si256(y.qs.as_ptr().add(32 * ib) as *const __m256i) };
        acc = _mm256_add_epi32(acc, signed_madd(mag, signs, q8, (2 * (aux >> 28) + 1) as i16));
    }
    hsum_i32(acc)
}

/// TQ2_0 blocks against Q8_K blocks: `Σ (q − 1)·y = Σ q·y − Σ y`, exact.
///
/// # Safety
/// AVX2 must be available.
#[target_feature(enable = "avx2")]
unsafe fn tq2_0_isum(b: &BlockTq2_0, y: &BlockQ8K) -> i32 {
    let mut acc = _mm256_setzero_si256();
    let ones = _mm256_set1_epi16(1);
    let three = _mm256_set1_epi8(3);
    for g in 0..2 {
        // SAFETY: 32 bytes at offset 32·g of the 64 quant bytes; unaligned load.
        let q = unsafe { _mm256_loadu_si256(b.qs.as_ptr().add(32 * g) as *const __m256i) };
        for l in 0..4 {
            // Bits 2l..2l+1 of each byte (16-bit shifts, then the mask drops the neighbours' bits).
            let ql = match l {
                0 => _mm256_and_si256(q, three),
                1 => _mm256_and_si256(_mm256_srli_epi16(q, 2), three),
                2 => _mm256_and_si256(_mm256_srli_epi16(q, 4), three),
                _ => _mm256_and_si256(_mm256_srli_epi16(q, 6), three),
            };
            // SAFETY: 32 bytes at offset 128·g + 32·l of the 256 quants; unaligned load.
            let yv = unsafe { _mm256_loadu_si256(y.qs.as_ptr().add(128 * g + 32 * l) as *const __m256i) };
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(ql, yv), ones));
        }
    }
    let ysum: i32 = y.bsums.iter().map(|b| i16::from_le_bytes(*b) as i32).sum();
    hsum_i32(acc) - ysum
}

/// The float part shared with the scalar kernels: `C · Σ_blocks d_x · d_y · isum`, in order.
#[inline(always)]
fn dot_fused<B: bytemuck::Pod>(
    n: usize,
    x: &[u8],
    y: &[u8],
    c: f32,
    d: impl Fn(&B) -> f32,
    isum: impl Fn(&B, &BlockQ8K) -> i32,
) -> f32 {
    assert_eq!(n % QK_K, 0, "vec_dot: n = {n} is not a whole number of blocks");
    let nb = n / QK_K;
    let (bs, ys) = (std::mem::size_of::<B>(), std::mem::size_of::<BlockQ8K>());
    assert!(x.len() >= nb * bs && y.len() >= nb * ys, "vec_dot: rows too short");
    let xs: &[B] = as_blocks(&x[..nb * bs]);
    let yq: &[BlockQ8K] = as_blocks(&y[..nb * ys]);
    let mut sum = 0.0f32;
    for (b, a) in xs.iter().zip(yq) {
        sum += d(b) * f32::from_le_bytes(a.d) * isum(b, a) as f32;
    }
    c * sum
}

pub(crate) fn vec_dot_iq2_xxs_fused(n: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: installed only after AVX2 was detected (see the module doc of `avx2`).
    dot_fused(n, x, y, 0.125, iq::d_f16::<BlockIq2Xxs>, |b, a| unsafe { iq2_xxs_isum(b, a) })
}

pub(crate) fn vec_dot_iq2_xs_fused(n: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: installed only after AVX2 was detected (see the module doc of `avx2`).
    dot_fused(n, x, y, 0.125, iq::d_f16::<BlockIq2Xs>, |b, a| unsafe { iq2_xs_isum(b, a) })
}

pub(crate) fn vec_dot_iq2_s_fused(n: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: installed only after AVX2 was detected (see the module doc of `avx2`).
    dot_fused(n, x, y, 0.125, iq::d_f16::<BlockIq2S>, |b, a| unsafe { iq2_s_isum(b, a) })
}

pub(crate) fn vec_dot_iq3_s_fused(n: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: installed only after AVX2 was detected (see the module doc of `avx2`).
    dot_fused(n, x, y, 1.0, iq::d_f16::<BlockIq3S>, |b, a| unsafe { iq3_s_isum(b, a) })
}

pub(crate) fn vec_dot_tq2_0_fused(n: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: installed only after AVX2 was detected (see the module doc of `avx2`).
    dot_fused(n, x, y, 1.0, |b: &BlockTq2_0| f16le(b.d), |b, a| unsafe { tq2_0_isum(b, a) })
}

pub(crate) fn vec_dot_iq3_xxs_fused(n: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: installed only after AVX2 was detected (see the module doc of `avx2`).
    dot_fused(n, x, y, 0.25, iq::d_f16::<BlockIq3Xxs>, |b, a| unsafe { iq3_xxs_isum(b, a) })
}

/// `Σ_g scale_g · Σ_{16 elements of g} v·q8` over a decoded block.
///
/// # Safety
/// AVX2 must be available (see the module doc of `avx2`).
#[target_feature(enable = "avx2")]
unsafe fn isum_avx2(dec: &Decoded, q8: &[i8; QK_K]) -> i32 {
    let mut acc = _mm256_setzero_si256();
    for c in 0..QK_K / 32 {
        // SAFETY: 32 bytes at offset 32·c of 256-byte arrays; unaligned loads.
        let (v, y) = unsafe {
            (
                _mm256_loadu_si256(dec.v.as_ptr().add(32 * c) as *const __m256i),
                _mm256_loadu_si256(q8.as_ptr().add(32 * c) as *const __m256i),
            )
        };
        // |v| · (y with v's sign): i8 products summed in pairs into i16 (|v| ≤ 62, |y| ≤ 127: no
        // saturation).
        let p = _mm256_maddubs_epi16(_mm256_sign_epi8(v, v), _mm256_sign_epi8(y, v));
        // Elements 0..16 of the chunk are i16 lanes 0..8 (scale 2c), 16..32 lanes 8..16 (2c + 1).
        let s = _mm256_set_m128i(
            _mm_set1_epi16(dec.scale[2 * c + 1] as i16),
            _mm_set1_epi16(dec.scale[2 * c] as i16),
        );
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, s));
    }
    hsum_i32(acc)
}

fn isum(dec: &Decoded, q8: &[i8; QK_K]) -> i32 {
    // SAFETY: installed only after AVX2 was detected (see the module doc of `avx2`).
    unsafe { isum_avx2(dec, q8) }
}

macro_rules! dots {
    ($($name:ident = $spec:ident),*) => {$(
        pub(crate) fn $name(n: usize, x: &[u8], y: &[u8]) -> f32 {
            iq::$spec.dot(n, x, y, isum)
        }
    )*};
}

dots!(vec_dot_iq1_s_q8_k = IQ1_S_SPEC, vec_dot_iq1_m_q8_k = IQ1_M_SPEC, vec_dot_tq1_0_q8_k = TQ1_0_SPEC);
