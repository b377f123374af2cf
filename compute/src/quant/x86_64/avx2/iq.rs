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
    as_blocks, f16le, BlockIq1M, BlockIq1S, BlockIq2S, BlockIq2Xs, BlockIq2Xxs, BlockIq3S, BlockIq3Xxs,
    BlockQ8K, BlockTq1_0, BlockTq2_0,
};
use crate::quant::scalar::iq::{self, SIGN7_MASKS, SIGN_MASKS};
use crate::quant::scalar::iq_grids::{IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID};

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

/// Loads 32 bytes.
#[target_feature(enable = "avx2")]
fn load32(a: &[u8; 32]) -> __m256i {
    // SAFETY: `a` is 32 readable bytes; unaligned load.
    unsafe { _mm256_loadu_si256(a.as_ptr() as *const __m256i) }
}

/// Loads 16 bytes.
#[target_feature(enable = "avx2")]
fn load16(a: &[u8; 16]) -> __m128i {
    // SAFETY: `a` is 16 readable bytes; unaligned load.
    unsafe { _mm_loadu_si128(a.as_ptr() as *const __m128i) }
}

/// A Q8_K block's quants as eight 32-byte chunks and its 16 `bsums` as one 32-byte vector.
///
/// Every Q8_K quant lies in −127..=127 (the quantizer scales the largest magnitude to 127), so
/// `sign_epi8` never meets −128, and the `bsums` are the sums of the quants they cover (the
/// quantizer writes them so), which the kernels below use in place of summing the quants again.
#[target_feature(enable = "avx2")]
fn q8_parts(y: &BlockQ8K) -> (&[[u8; 32]; 8], __m256i) {
    (bytemuck::cast_ref(&y.qs), load32(bytemuck::cast_ref(&y.bsums)))
}

/// Rows `i[0..4]` of a table of 8-byte rows, side by side in one vector (`& (N − 1)` keeps each
/// index in range without a bounds check; `N` is a power of two and the callers' indices fit).
#[target_feature(enable = "avx2")]
fn rows4<const N: usize>(t: &[[i8; 8]; N], i: [usize; 4]) -> __m256i {
    let r = |k: usize| i64::from_le_bytes(bytemuck::cast(t[i[k] & (N - 1)]));
    _mm256_set_epi64x(r(3), r(2), r(1), r(0))
}

/// TQ2_0 blocks against Q8_K blocks: `Σ (q − 1)·y = Σ q·y − Σ y`, exact. The products are summed
/// in i16 lanes (8 pairs of at most 2·3·127 each, less a bsum of at most 16·127: no overflow).
#[target_feature(enable = "avx2")]
fn tq2_0_isum(b: &BlockTq2_0, y: &BlockQ8K) -> i32 {
    let (yq, bsums) = q8_parts(y);
    let qs: &[[u8; 32]; 2] = bytemuck::cast_ref(&b.qs);
    let three = _mm256_set1_epi8(3);
    let mut acc = _mm256_sub_epi16(_mm256_setzero_si256(), bsums);
    for g in 0..2 {
        let q = load32(&qs[g]);
        // Bits 2l..2l+1 of each byte (16-bit shifts, then the mask drops the neighbours' bits).
        let planes = [q, _mm256_srli_epi16(q, 2), _mm256_srli_epi16(q, 4), _mm256_srli_epi16(q, 6)];
        for (l, p) in planes.into_iter().enumerate() {
            let ql = _mm256_and_si256(p, three);
            acc = _mm256_add_epi16(acc, _mm256_maddubs_epi16(ql, load32(&yq[4 * g + l])));
        }
    }
    hsum_i32(_mm256_madd_epi16(acc, _mm256_set1_epi16(1)))
}

/// `s ↦ 3·s mod 256` per byte: the next base-3 digit plane of TQ1_0 bytes (see [`tq1_0_isum`]).
#[target_feature(enable = "avx2")]
fn triple(s: __m256i) -> __m256i {
    _mm256_add_epi8(s, _mm256_add_epi8(s, s))
}

/// The leading base-3 digit (0..=2) of each byte `r`, given `s = r ^ 0x80`: `⌊3r / 256⌋` is 1 from
/// r = 86 and 2 from r = 171, i.e. where the signed `s` exceeds −43 and 42.
#[target_feature(enable = "avx2")]
fn trits(s: __m256i) -> __m256i {
    let ge86 = _mm256_cmpgt_epi8(s, _mm256_set1_epi8((85i32 - 128) as i8));
    let ge171 = _mm256_cmpgt_epi8(s, _mm256_set1_epi8((170i32 - 128) as i8));
    _mm256_sub_epi8(_mm256_sub_epi8(_mm256_setzero_si256(), ge86), ge171)
}

/// TQ1_0 blocks against Q8_K blocks: `Σ (t − 1)·y = Σ t·y − Σ y` over the digits `t`, exact.
///
/// Digit n of byte q is the leading digit of `r = q·3ⁿ mod 256`, and `r ^ 0x80` triples with `r`
/// (3·128 ≡ 128 mod 256), so each digit plane is two byte adds from the last. The digits meet the
/// activations in order: planes 0..5 of `qs[0..32]` are elements 0..160; planes (0, 1), (2, 3) of
/// `qs[32..48]` side by side are 160..224; plane 4 of `qs[32..48]` then the four planes of `qh`
/// (one per 32-bit lane, byte m of lane n is digit n of `qh[m]`) are 224..256. i16 sums: 8 pairs of
/// at most 2·2·127 each, less a bsum of at most 16·127.
#[target_feature(enable = "avx2")]
fn tq1_0_isum(b: &BlockTq1_0, y: &BlockQ8K) -> i32 {
    let (yq, bsums) = q8_parts(y);
    let (head, tail) = b.qs.split_at(32);
    let (head, tail): (&[u8; 32], &[u8; 16]) = (head.try_into().unwrap(), tail.try_into().unwrap());
    let bias = _mm256_set1_epi8(-128);
    let mut acc = _mm256_sub_epi16(_mm256_setzero_si256(), bsums);
    let mut s = _mm256_xor_si256(load32(head), bias);
    for chunk in &yq[..5] {
        acc = _mm256_add_epi16(acc, _mm256_maddubs_epi16(trits(s), load32(chunk)));
        s = triple(s);
    }
    let u = _mm256_xor_si256(_mm256_broadcastsi128_si256(load16(tail)), bias);
    let v01 = _mm256_blend_epi32(u, triple(u), 0b1111_0000);
    let v23 = triple(triple(v01));
    let mut h = _mm256_xor_si256(_mm256_set1_epi32(i32::from_le_bytes(b.qh)), bias);
    h = _mm256_blend_epi32(h, triple(h), 0b1110_1110);
    h = _mm256_blend_epi32(h, triple(h), 0b1100_1100);
    h = _mm256_blend_epi32(h, triple(h), 0b1000_1000);
    let v4h = _mm256_blend_epi32(triple(triple(v23)), h, 0b1111_0000);
    for (v, chunk) in [v01, v23, v4h].into_iter().zip(&yq[5..]) {
        acc = _mm256_add_epi16(acc, _mm256_maddubs_epi16(trits(v), load32(chunk)));
    }
    hsum_i32(_mm256_madd_epi16(acc, _mm256_set1_epi16(1)))
}

/// IQ1_S blocks against Q8_K blocks: `Σ_ib s_ib·(8·Σ g·y + δ_ib·Σ y)`, exact (the scalar kernel's
/// `Σ s·(8g + δ)·y`). The grid values g ∈ {−1, 0, 1} become signs of the activations, the scale
/// multiplies them in `maddubs` and the sums stay in i16 lanes (8 pairs of at most 2·15·127); the
/// δ term comes from the bsums.
#[target_feature(enable = "avx2")]
fn iq1_s_isum(b: &BlockIq1S, y: &BlockQ8K) -> i32 {
    let (yq, bsums) = q8_parts(y);
    let h = load16(&b.qh);
    // Per 32 elements: scale 2·((h >> 12) & 7) + 1, and the scale times δ (bit 15 set: δ = −1).
    let s = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(h, 11), _mm_set1_epi16(14)), _mm_set1_epi16(1));
    let sd = _mm_sign_epi16(s, _mm_or_si128(h, _mm_set1_epi16(1)));
    let sd = _mm256_set_m128i(_mm_unpackhi_epi16(sd, sd), _mm_unpacklo_epi16(sd, sd));
    let sb = _mm256_broadcastsi128_si256(_mm_packus_epi16(s, s));
    let mut acc = _mm256_setzero_si256();
    for ib in 0..8 {
        let hq = u16::from_le_bytes([b.qh[2 * ib], b.qh[2 * ib + 1]]) as usize;
        let i = |l: usize| b.qs[4 * ib + l] as usize | (((hq >> (3 * l)) & 7) << 8);
        let g = rows4(&IQ1S_GRID, [i(0), i(1), i(2), i(3)]);
        let sc = _mm256_shuffle_epi8(sb, _mm256_set1_epi8(ib as i8));
        let gy = _mm256_sign_epi8(load32(&yq[ib]), g);
        acc = _mm256_add_epi16(acc, _mm256_maddubs_epi16(sc, gy));
    }
    let grid = _mm256_madd_epi16(acc, _mm256_set1_epi16(8));
    hsum_i32(_mm256_add_epi32(grid, _mm256_madd_epi16(bsums, sd)))
}

/// The 16 scales `2·s + 1` of an IQ1_M block, one byte per 16 elements: word j of `scales` holds
/// those of groups 4j..4j+4 in bits 0..3, 3..6, 6..9, 9..12 (a multiply shifts each to the top).
#[target_feature(enable = "avx2")]
fn iq1_m_scales(scales: &[u8; 8]) -> __m128i {
    let w = _mm_cvtsi64_si128(i64::from_le_bytes(*scales));
    let lo = _mm_shuffle_epi8(w, _mm_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3));
    let hi = _mm_shuffle_epi8(w, _mm_setr_epi8(4, 5, 4, 5, 4, 5, 4, 5, 6, 7, 6, 7, 6, 7, 6, 7));
    let shift = _mm_setr_epi16(512, 64, 8, 1, 512, 64, 8, 1);
    let field = |v: __m128i| {
        let f = _mm_and_si128(_mm_srli_epi16(_mm_mullo_epi16(v, shift), 9), _mm_set1_epi16(7));
        _mm_or_si128(_mm_slli_epi16(f, 1), _mm_set1_epi16(1))
    };
    _mm_packus_epi16(field(lo), field(hi))
}

/// IQ1_M blocks against Q8_K blocks: `Σ_g s_g·(8·Σ g·y + Σ δ·y)`, exact, with
/// `Σ s·δ·y = Σ s·y − 2·Σ_{δ = −1} s·y` (the first from the bsums). Both sums stay in i16 lanes
/// (8 pairs of at most 2·15·127 each), as in [`iq1_s_isum`].
#[target_feature(enable = "avx2")]
fn iq1_m_isum(b: &BlockIq1M, y: &BlockQ8K) -> i32 {
    let (yq, bsums) = q8_parts(y);
    let s16 = iq1_m_scales(&b.scales);
    let sb = _mm256_broadcastsi128_si256(s16);
    let qh = _mm256_broadcastsi128_si256(load16(&b.qh));
    // The δ bit of each 8 elements: bit 3 of nibble l of the u16 `qh[2ib..2ib + 2]`.
    let dbit = _mm256_setr_epi16(
        8, 8, 8, 8, 0x80, 0x80, 0x80, 0x80, 0x800, 0x800, 0x800, 0x800, -0x8000, -0x8000, -0x8000, -0x8000,
    );
    let (mut acc, mut neg) = (_mm256_setzero_si256(), _mm256_setzero_si256());
    for ib in 0..8 {
        let hq = u16::from_le_bytes([b.qh[2 * ib], b.qh[2 * ib + 1]]) as usize;
        let i = |l: usize| b.qs[4 * ib + l] as usize | (((hq >> (4 * l)) & 7) << 8);
        let g = rows4(&IQ1S_GRID, [i(0), i(1), i(2), i(3)]);
        let sc = _mm256_shuffle_epi8(
            sb,
            _mm256_set_m128i(_mm_set1_epi8(2 * ib as i8 + 1), _mm_set1_epi8(2 * ib as i8)),
        );
        let yv = load32(&yq[ib]);
        acc = _mm256_add_epi16(acc, _mm256_maddubs_epi16(sc, _mm256_sign_epi8(yv, g)));
        let hv = _mm256_shuffle_epi8(qh, _mm256_set1_epi16((((2 * ib + 1) << 8) | (2 * ib)) as i16));
        let m = _mm256_cmpeq_epi16(_mm256_and_si256(hv, dbit), dbit);
        neg = _mm256_add_epi16(neg, _mm256_maddubs_epi16(sc, _mm256_and_si256(yv, m)));
    }
    let grid = _mm256_madd_epi16(acc, _mm256_set1_epi16(8));
    let delta = _mm256_sub_epi32(
        _mm256_madd_epi16(bsums, _mm256_cvtepu8_epi16(s16)),
        _mm256_madd_epi16(neg, _mm256_set1_epi16(2)),
    );
    hsum_i32(_mm256_add_epi32(grid, delta))
}

/// The float part shared with the scalar kernels: `C · Σ_blocks d_x · d_y · isum`, in order.
#[inline(always)]
fn dot_fused<B: bytemuck::Pod>(
    n: usize,
    x: &[u8],
    y: &[u8],
    c: f32,
    d: impl Fn(&B) -> f32,
    value: impl Fn(&B, &BlockQ8K) -> f32,
) -> f32 {
    assert_eq!(n % QK_K, 0, "vec_dot: n = {n} is not a whole number of blocks");
    let nb = n / QK_K;
    let (bs, ys) = (std::mem::size_of::<B>(), std::mem::size_of::<BlockQ8K>());
    assert!(x.len() >= nb * bs && y.len() >= nb * ys, "vec_dot: rows too short");
    let xs: &[B] = as_blocks(&x[..nb * bs]);
    let yq: &[BlockQ8K] = as_blocks(&y[..nb * ys]);
    let mut sum = 0.0f32;
    for (b, a) in xs.iter().zip(yq) {
        sum += d(b) * f32::from_le_bytes(a.d) * value(b, a);
    }
    c * sum
}

pub(crate) fn vec_dot_iq2_xxs_fused(n: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: installed only after AVX2 was detected (see the module doc of `avx2`).
    dot_fused(n, x, y, 0.125, iq::d_f16::<BlockIq2Xxs>, |b, a| unsafe { iq2_xxs_isum(b, a) } as f32)
}

pub(crate) fn vec_dot_iq2_xs_fused(n: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: installed only after AVX2 was detected (see the module doc of `avx2`).
    dot_fused(n, x, y, 0.125, iq::d_f16::<BlockIq2Xs>, |b, a| unsafe { iq2_xs_isum(b, a) } as f32)
}

pub(crate) fn vec_dot_iq2_s_fused(n: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: installed only after AVX2 was detected (see the module doc of `avx2`).
    dot_fused(n, x, y, 0.125, iq::d_f16::<BlockIq2S>, |b, a| unsafe { iq2_s_isum(b, a) } as f32)
}

pub(crate) fn vec_dot_iq3_s_fused(n: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: installed only after AVX2 was detected (see the module doc of `avx2`).
    dot_fused(n, x, y, 1.0, iq::d_f16::<BlockIq3S>, |b, a| unsafe { iq3_s_isum(b, a) } as f32)
}

pub(crate) fn vec_dot_tq2_0_fused(n: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: installed only after AVX2 was detected (see the module doc of `avx2`).
    dot_fused(n, x, y, 1.0, |b: &BlockTq2_0| f16le(b.d), |b, a| unsafe { tq2_0_isum(b, a) } as f32)
}

pub(crate) fn vec_dot_iq3_xxs_fused(n: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: installed only after AVX2 was detected (see the module doc of `avx2`).
    dot_fused(n, x, y, 0.25, iq::d_f16::<BlockIq3Xxs>, |b, a| unsafe { iq3_xxs_isum(b, a) } as f32)
}

pub(crate) fn vec_dot_iq1_s_fused(n: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: installed only after AVX2 was detected (see the module doc of `avx2`).
    dot_fused(n, x, y, 1.0, iq::d_f16::<BlockIq1S>, |b, a| unsafe { iq1_s_isum(b, a) } as f32 * 0.125)
}

pub(crate) fn vec_dot_iq1_m_fused(n: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: installed only after AVX2 was detected (see the module doc of `avx2`).
    dot_fused(n, x, y, 1.0, iq::iq1_m_d, |b, a| unsafe { iq1_m_isum(b, a) } as f32 * 0.125)
}

pub(crate) fn vec_dot_tq1_0_fused(n: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: installed only after AVX2 was detected (see the module doc of `avx2`).
    dot_fused(n, x, y, 1.0, iq::d_f16::<BlockTq1_0>, |b, a| unsafe { tq1_0_isum(b, a) } as f32)
}
