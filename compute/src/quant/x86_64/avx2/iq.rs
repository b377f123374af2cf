//! AVX2 dot products of the grid IQ types, TQ1_0 and TQ2_0, all fused (blocks decode straight into
//! vectors). The integer `Σ_g scale_g · Σ v·q8` of each 256-element block is formed with
//! `maddubs`/`madd` and the float part is the scalar kernel's own; the integer is exact in both, so
//! each result equals the scalar kernel's bit for bit (`quant::tests::simd`). Grid rows are gathered
//! into vectors, sign bits become byte masks by a shuffle and a compare (7-bit fields get their
//! parity bit from two nibble lookups) and are applied to the activations, so that `maddubs`
//! multiplies unsigned magnitudes by signed activations; IQ1_S and TQ terms that only need sums of
//! activations take them from the Q8_K `bsums` (IQ1_M reads its per-8-element δ from a grid table
//! with the δ folded in). Four grid rows are loaded as two pairs (low and high 64-bit halves), and
//! the 9- and 10-bit grid indices of IQ2_XS and IQ2_S are read as u64 words of four (IQ2_S builds
//! its 32 words per block in vectors).

use std::arch::x86_64::*;

use crate::dtype::QK_K;
use crate::quant::blocks::{
    as_blocks, BlockIq1M, BlockIq1S, BlockIq2S, BlockIq2Xs, BlockIq2Xxs, BlockIq3S, BlockIq3Xxs, BlockQ8K,
    BlockTq1_0, BlockTq2_0,
};
use crate::quant::scalar::iq;
use crate::quant::scalar::iq_grids::{IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID};

/// Horizontal sum of eight i32 lanes.
#[target_feature(enable = "avx2")]
fn hsum_i32(acc: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
    _mm_cvtsi128_si32(s)
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

/// Two 8-byte rows in one 128-bit vector, `lo` in bytes 0..8 and `hi` in 8..16: one 64-bit load
/// and one load into the upper half (fewer instructions than building the pair from two `movq`).
#[target_feature(enable = "avx2")]
fn row_pair(lo: &[i8; 8], hi: &[i8; 8]) -> __m128i {
    // SAFETY: each pointer is 8 readable bytes (a `[i8; 8]`); both loads are unaligned-safe.
    unsafe {
        let l = _mm_loadl_epi64(lo.as_ptr() as *const __m128i);
        _mm_castpd_si128(_mm_loadh_pd(_mm_castsi128_pd(l), hi.as_ptr() as *const f64))
    }
}

/// Rows `i[0..4]` of a table of 8-byte rows, side by side in one vector (`& (N − 1)` keeps each
/// index in range without a bounds check; `N` is a power of two and the callers' indices fit).
#[target_feature(enable = "avx2")]
fn rows4<const N: usize>(t: &[[i8; 8]; N], i: [usize; 4]) -> __m256i {
    let r = |k: usize| &t[i[k] & (N - 1)];
    _mm256_set_m128i(row_pair(r(2), r(3)), row_pair(r(0), r(1)))
}

/// The activations `q8` negated where a sign bit is set. `s4` holds the four sign bytes of the 32
/// elements (bit j of byte l: element 8l + j) in bytes 0..4 of both 128-bit lanes; each byte is
/// spread over its 8 elements and tested against its bit, and `(q8 ^ m) − m` negates where `m` is
/// all ones.
#[target_feature(enable = "avx2")]
fn apply_signs(q8: __m256i, s4: __m256i) -> __m256i {
    let spread = _mm256_shuffle_epi8(
        s4,
        _mm256_setr_epi8(
            0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
        ),
    );
    let bits = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let m = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bits), bits);
    _mm256_sub_epi8(_mm256_xor_si256(q8, m), m)
}

/// The four sign bytes of sub-block `ib` (dword `ib` of `signs`) in every dword.
#[target_feature(enable = "avx2")]
fn signs_of(signs: __m256i, ib: usize) -> __m256i {
    _mm256_permutevar8x32_epi32(signs, _mm256_set1_epi32(ib as i32))
}

/// Seven-bit sign fields (one per byte, bit 7 clear) completed with their eighth bit, the parity
/// of the seven (as [`iq::signs8`]): two nibble lookups of the parity, xor-ed.
#[target_feature(enable = "avx2")]
fn with_parity(f: __m256i) -> __m256i {
    let odd = -128i8;
    let t = _mm256_setr_epi8(
        0, odd, odd, 0, odd, 0, 0, odd, odd, 0, 0, odd, 0, odd, odd, 0, 0, odd, odd, 0, odd, 0, 0, odd, odd,
        0, 0, odd, 0, odd, odd, 0,
    );
    let nib = _mm256_set1_epi8(15);
    let lo = _mm256_shuffle_epi8(t, _mm256_and_si256(f, nib));
    let hi = _mm256_shuffle_epi8(t, _mm256_and_si256(_mm256_srli_epi16(f, 4), nib));
    _mm256_or_si256(f, _mm256_xor_si256(lo, hi))
}

/// The sign bytes and the `2s + 1` scales of a block whose sub-block `ib` carries a u32 `aux` with
/// four 7-bit sign fields (bits 0..28) and a 4-bit scale (28..32), given the eight `aux` as i32
/// lanes: dword `ib` of the first result holds the four sign bytes, of the second the scale in
/// both i16 halves.
#[target_feature(enable = "avx2")]
fn aux_signs_scales(aux: __m256i) -> (__m256i, __m256i) {
    let field = |shift: i32, mask: i32| {
        let v = match shift {
            0 => aux,
            1 => _mm256_slli_epi32(aux, 1),
            2 => _mm256_slli_epi32(aux, 2),
            _ => _mm256_slli_epi32(aux, 3),
        };
        _mm256_and_si256(v, _mm256_set1_epi32(mask))
    };
    // Field l (bits 7l..7l+7) moves to byte l.
    let f = _mm256_or_si256(
        _mm256_or_si256(field(0, 0x7F), field(1, 0x7F00)),
        _mm256_or_si256(field(2, 0x7F_0000), field(3, 0x7F00_0000)),
    );
    let s = _mm256_or_si256(_mm256_slli_epi32(_mm256_srli_epi32(aux, 28), 1), _mm256_set1_epi32(1));
    (with_parity(f), _mm256_or_si256(s, _mm256_slli_epi32(s, 16)))
}

/// Sixteen 4-bit scales (byte j: low nibble for elements 32j..32j+16, high for the next 16) as
/// `2s + 1` bytes in order, in both lanes.
#[target_feature(enable = "avx2")]
fn nibble_scales(sc: [u8; 8]) -> __m256i {
    let x = _mm_cvtsi64_si128(i64::from_le_bytes(sc));
    let nib = _mm_set1_epi8(15);
    let s = _mm_unpacklo_epi8(_mm_and_si128(x, nib), _mm_and_si128(_mm_srli_epi16(x, 4), nib));
    _mm256_broadcastsi128_si256(_mm_or_si128(_mm_add_epi8(s, s), _mm_set1_epi8(1)))
}

/// Index bytes for `shuffle_epi8` that take scale byte `first` into the low i16 lanes (elements
/// 0..16) and `second` into the high ones (16..32), zero-extended (0x80 selects zero).
#[target_feature(enable = "avx2")]
fn scale_pick(first: i16, second: i16) -> __m256i {
    _mm256_set_m128i(_mm_set1_epi16(second | i16::MIN), _mm_set1_epi16(first | i16::MIN))
}

/// Rows `i[0..8]` of a table of 4-byte rows, side by side (as [`rows4`]).
#[target_feature(enable = "avx2")]
fn rows8<const N: usize>(t: &[[u8; 4]; N], i: [usize; 8]) -> __m256i {
    let r = |k: usize| i32::from_le_bytes(t[i[k] & (N - 1)]);
    _mm256_setr_epi32(r(0), r(1), r(2), r(3), r(4), r(5), r(6), r(7))
}

/// `Σ scale · mag · (signed q8)` of one sub-block into i32 lanes: `maddubs` pairs (at most
/// 2·62·127, no saturation) then `madd` with the i16 scales.
#[target_feature(enable = "avx2")]
fn scaled(mag: __m256i, q: __m256i, scales: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(mag, q), scales)
}

/// IQ2_XXS blocks against Q8_K blocks: each block's exact integer sum.
#[target_feature(enable = "avx2")]
#[inline]
fn iq2_xxs_isum(b: &BlockIq2Xxs, y: &BlockQ8K) -> i32 {
    hsum_i32(iq2_xxs_lanes(b, y))
}

/// IQ2_XXS blocks against Q8_K blocks: the exact integer sum in ggml's eight lanes (lane `l`: the
/// scaled products of elements `4l..4l + 4` of every 32).
#[target_feature(enable = "avx2")]
#[inline]
fn iq2_xxs_lanes(b: &BlockIq2Xxs, y: &BlockQ8K) -> __m256i {
    let (yq, _) = q8_parts(y);
    let qs: &[[u8; 8]; 8] = bytemuck::cast_ref(&b.qs);
    let halves: &[[u8; 32]; 2] = bytemuck::cast_ref(&b.qs);
    // The aux words are the odd dwords.
    let odd = _mm256_setr_epi32(1, 3, 5, 7, 1, 3, 5, 7);
    let aux = _mm256_blend_epi32(
        _mm256_permutevar8x32_epi32(load32(&halves[0]), odd),
        _mm256_permutevar8x32_epi32(load32(&halves[1]), odd),
        0b1111_0000,
    );
    let (signs, scales) = aux_signs_scales(aux);
    let mut acc = _mm256_setzero_si256();
    for ib in 0..8 {
        let q = &qs[ib];
        let mag = rows4(&IQ2XXS_GRID, [q[0] as usize, q[1] as usize, q[2] as usize, q[3] as usize]);
        let y8 = apply_signs(load32(&yq[ib]), signs_of(signs, ib));
        acc = _mm256_add_epi32(acc, scaled(mag, y8, signs_of(scales, ib)));
    }
    acc
}

/// IQ3_XXS blocks against Q8_K blocks: each block's exact integer sum.
#[target_feature(enable = "avx2")]
#[inline]
fn iq3_xxs_isum(b: &BlockIq3Xxs, y: &BlockQ8K) -> i32 {
    hsum_i32(iq3_xxs_lanes(b, y))
}

/// IQ3_XXS blocks against Q8_K blocks: the exact integer sum in ggml's eight lanes (lane `l`: the
/// scaled products of elements `4l..4l + 4` of every 32).
#[target_feature(enable = "avx2")]
#[inline]
fn iq3_xxs_lanes(b: &BlockIq3Xxs, y: &BlockQ8K) -> __m256i {
    let (yq, _) = q8_parts(y);
    let (idx, sas) = b.qs.split_at(QK_K / 4);
    let idx: &[[u8; 8]; 8] = bytemuck::cast_ref(<&[u8; 64]>::try_from(idx).unwrap());
    let (signs, scales) = aux_signs_scales(load32(sas.try_into().unwrap()));
    let mut acc = _mm256_setzero_si256();
    for ib in 0..8 {
        let mag = rows8(&IQ3XXS_GRID, idx[ib].map(|i| i as usize));
        let y8 = apply_signs(load32(&yq[ib]), signs_of(signs, ib));
        acc = _mm256_add_epi32(acc, scaled(mag, y8, signs_of(scales, ib)));
    }
    acc
}

/// IQ2_XS blocks against Q8_K blocks: each block's exact integer sum.
#[target_feature(enable = "avx2")]
#[inline]
fn iq2_xs_isum(b: &BlockIq2Xs, y: &BlockQ8K) -> i32 {
    hsum_i32(iq2_xs_lanes(b, y))
}

/// IQ2_XS blocks against Q8_K blocks: the exact integer sum in ggml's eight lanes (lane `l`: the
/// scaled products of elements `4l..4l + 4` of every 32).
#[target_feature(enable = "avx2")]
#[inline]
fn iq2_xs_lanes(b: &BlockIq2Xs, y: &BlockQ8K) -> __m256i {
    let (yq, _) = q8_parts(y);
    let halves: &[[u8; 32]; 2] = bytemuck::cast_ref(&b.qs);
    let words: &[[u8; 8]; 8] = bytemuck::cast_ref(&b.qs);
    // The 7-bit sign field of each u16 (its top bits), packed to bytes in order.
    let f0 = _mm256_srli_epi16(load32(&halves[0]), 9);
    let f1 = _mm256_srli_epi16(load32(&halves[1]), 9);
    let f = _mm256_permute4x64_epi64(_mm256_packus_epi16(f0, f1), 0b11_01_10_00);
    let signs = with_parity(f);
    let sb = nibble_scales(b.scales);
    let mut pick = scale_pick(0, 1);
    let mut acc = _mm256_setzero_si256();
    for ib in 0..8 {
        // The four 9-bit grid indices, one per u16 (masked as one word, then split).
        let w = u64::from_le_bytes(words[ib]) & 0x01FF_01FF_01FF_01FF;
        let i = |l: usize| (w >> (16 * l)) as u16 as usize;
        let mag = rows4(&IQ2XS_GRID, [i(0), i(1), i(2), i(3)]);
        let y8 = apply_signs(load32(&yq[ib]), signs_of(signs, ib));
        acc = _mm256_add_epi32(acc, scaled(mag, y8, _mm256_shuffle_epi8(sb, pick)));
        pick = _mm256_add_epi16(pick, _mm256_set1_epi16(2));
    }
    acc
}

/// The 32 10-bit IQ2_S grid indices of a block, one per u16, in order (word `ib` holds those of
/// sub-block `ib`): index `4ib + l` is byte `idx[4ib + l]` with bits `2l..2l + 2` of `qh[ib]` above
/// it, moved there by a multiply by `2^(8 − 2l)` per lane and a mask.
#[target_feature(enable = "avx2")]
#[inline]
fn iq2_s_indices(idx: &[u8; 32], qh: &[u8; 8]) -> [u64; 8] {
    let lo = _mm256_cvtepu8_epi16(load16(idx[..16].try_into().unwrap()));
    let hi = _mm256_cvtepu8_epi16(load16(idx[16..].try_into().unwrap()));
    let h = _mm256_broadcastsi128_si256(_mm_cvtsi64_si128(i64::from_le_bytes(*qh)));
    let z = -1i8;
    // qh byte j zero-extended into the four u16 lanes of sub-block j (j = 0..4, then 4..8).
    let spread = |j: i8| {
        _mm256_setr_epi8(
            j,
            z,
            j,
            z,
            j,
            z,
            j,
            z,
            j + 1,
            z,
            j + 1,
            z,
            j + 1,
            z,
            j + 1,
            z,
            j + 2,
            z,
            j + 2,
            z,
            j + 2,
            z,
            j + 2,
            z,
            j + 3,
            z,
            j + 3,
            z,
            j + 3,
            z,
            j + 3,
            z,
        )
    };
    let shift = _mm256_setr_epi16(256, 64, 16, 4, 256, 64, 16, 4, 256, 64, 16, 4, 256, 64, 16, 4);
    let high = |j: i8| {
        let f = _mm256_mullo_epi16(_mm256_shuffle_epi8(h, spread(j)), shift);
        _mm256_and_si256(f, _mm256_set1_epi16(0x300))
    };
    let words: [[u64; 4]; 2] =
        [bytemuck::cast(_mm256_or_si256(lo, high(0))), bytemuck::cast(_mm256_or_si256(hi, high(4)))];
    bytemuck::cast(words)
}

/// IQ2_S blocks against Q8_K blocks: each block's exact integer sum.
#[target_feature(enable = "avx2")]
#[inline]
fn iq2_s_isum(b: &BlockIq2S, y: &BlockQ8K) -> i32 {
    hsum_i32(iq2_s_lanes(b, y))
}

/// IQ2_S blocks against Q8_K blocks: the exact integer sum in ggml's eight lanes (lane `l`: the
/// scaled products of elements `4l..4l + 4` of every 32).
#[target_feature(enable = "avx2")]
#[inline]
fn iq2_s_lanes(b: &BlockIq2S, y: &BlockQ8K) -> __m256i {
    let (yq, _) = q8_parts(y);
    let (idx, sg) = b.qs.split_at(QK_K / 8);
    let words = iq2_s_indices(idx.try_into().unwrap(), &b.qh);
    let signs = load32(sg.try_into().unwrap());
    let sb = nibble_scales(b.scales);
    let mut pick = scale_pick(0, 1);
    let mut acc = _mm256_setzero_si256();
    for ib in 0..8 {
        let w = words[ib];
        let i = |l: usize| (w >> (16 * l)) as u16 as usize;
        let mag = rows4(&IQ2S_GRID, [i(0), i(1), i(2), i(3)]);
        let y8 = apply_signs(load32(&yq[ib]), signs_of(signs, ib));
        acc = _mm256_add_epi32(acc, scaled(mag, y8, _mm256_shuffle_epi8(sb, pick)));
        pick = _mm256_add_epi16(pick, _mm256_set1_epi16(2));
    }
    acc
}

/// IQ3_S blocks against Q8_K blocks: each block's exact integer sum.
#[target_feature(enable = "avx2")]
#[inline]
fn iq3_s_isum(b: &BlockIq3S, y: &BlockQ8K) -> i32 {
    hsum_i32(iq3_s_lanes(b, y))
}

/// IQ3_S blocks against Q8_K blocks: the exact integer sum in ggml's eight lanes (lane `l`: the
/// scaled products of elements `4l..4l + 4` of every 32).
#[target_feature(enable = "avx2")]
#[inline]
fn iq3_s_lanes(b: &BlockIq3S, y: &BlockQ8K) -> __m256i {
    let (yq, _) = q8_parts(y);
    let idx: &[[u8; 8]; 8] = bytemuck::cast_ref(&b.qs);
    let signs = load32(&b.signs);
    let [s0, s1, s2, s3] = b.scales;
    let sb = nibble_scales([s0, s1, s2, s3, 0, 0, 0, 0]);
    let mut pick = scale_pick(0, 0);
    let mut acc = _mm256_setzero_si256();
    for ib in 0..8 {
        let qh = b.qh[ib] as usize;
        let i: [usize; 8] = std::array::from_fn(|k| idx[ib][k] as usize | (((qh >> k) & 1) << 8));
        let mag = rows8(&IQ3S_GRID, i);
        let y8 = apply_signs(load32(&yq[ib]), signs_of(signs, ib));
        acc = _mm256_add_epi32(acc, scaled(mag, y8, _mm256_shuffle_epi8(sb, pick)));
        pick = _mm256_add_epi16(pick, _mm256_set1_epi16(1));
    }
    acc
}

/// TQ2_0 blocks against Q8_K blocks: `Σ (q − 1)·y = Σ q·y − Σ y`, exact. The products are summed
/// in i16 lanes (8 pairs of at most 2·3·127 each, less a bsum of at most 16·127: no overflow).
#[target_feature(enable = "avx2")]
fn tq2_0_isum(b: &BlockTq2_0, y: &BlockQ8K) -> i32 {
    hsum_i32(tq2_0_lanes(b, y))
}

/// The i32 lanes of [`tq2_0_isum`] before the horizontal sum (ggml's lanes: `madd` of i16 lanes that
/// hold the digit products less one `bsum` each).
#[target_feature(enable = "avx2")]
#[inline]
fn tq2_0_lanes(b: &BlockTq2_0, y: &BlockQ8K) -> __m256i {
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
    _mm256_madd_epi16(acc, _mm256_set1_epi16(1))
}

/// `s ↦ 3·s mod 256` per byte: the next base-3 digit plane of TQ1_0 bytes (see [`tq1_0_isum`]).
/// The result passes through [`opaque`], so that chains of triples stay two adds each.
#[target_feature(enable = "avx2")]
fn triple(s: __m256i) -> __m256i {
    opaque(_mm256_add_epi8(s, _mm256_add_epi8(s, s)))
}

/// `v` unchanged, through an empty `asm!` block: the compiler no longer sees how `v` was computed
/// (without it, chains of [`triple`] become byte multiplies by 9, 27, 81, which AVX2 lacks and
/// which are emulated with 16-bit multiplies, slower than the two adds per step).
#[target_feature(enable = "avx2")]
fn opaque(mut v: __m256i) -> __m256i {
    // SAFETY: the template is empty: no instruction runs, no memory or flags are touched, and the
    // register holds `v` before and after.
    unsafe { std::arch::asm!("/* {0} */", inout(ymm_reg) v, options(pure, nomem, nostack, preserves_flags)) };
    v
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
    hsum_i32(tq1_0_lanes(b, y))
}

/// The i32 lanes of [`tq1_0_isum`] before the horizontal sum (ggml's lanes: `madd` of i16 lanes that
/// hold the digit products less one `bsum` each).
#[target_feature(enable = "avx2")]
#[inline]
fn tq1_0_lanes(b: &BlockTq1_0, y: &BlockQ8K) -> __m256i {
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
    _mm256_madd_epi16(acc, _mm256_set1_epi16(1))
}

/// IQ1_S blocks against Q8_K blocks, in two parts: the i16 lanes of `Σ_ib s_ib·Σ g·y` and the i32
/// lanes of the δ term `Σ_ib s_ib·δ_ib·Σ y`. The grid values g ∈ {−1, 0, 1} become signs of the
/// activations, the scale multiplies them in `maddubs` and the sums stay in i16 lanes (8 pairs of
/// at most 2·15·127, lane `k`: elements `2k, 2k + 1` of every 32); the δ term comes from the bsums.
#[target_feature(enable = "avx2")]
#[inline]
fn iq1_s_parts(b: &BlockIq1S, y: &BlockQ8K) -> (__m256i, __m256i) {
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
    (acc, _mm256_madd_epi16(bsums, sd))
}

/// IQ1_S blocks against Q8_K blocks: `Σ_ib s_ib·(8·Σ g·y + δ_ib·Σ y)`, exact (the scalar kernel's
/// `Σ s·(8g + δ)·y`), from [`iq1_s_parts`].
#[target_feature(enable = "avx2")]
#[inline]
fn iq1_s_isum(b: &BlockIq1S, y: &BlockQ8K) -> i32 {
    let (acc, delta) = iq1_s_parts(b, y);
    let grid = _mm256_madd_epi16(acc, _mm256_set1_epi16(8));
    hsum_i32(_mm256_add_epi32(grid, delta))
}

/// IQ1_S in ggml's AVX2 parts: the lanes of `Σ s·g·y` (lane `l`: elements `4l..4l + 4` of every
/// 32) and the integer `Σ_ib s_ib·δ_ib·(bsum_2ib + bsum_2ib+1)`.
#[target_feature(enable = "avx2")]
#[inline]
fn iq1_s_ggml_parts(b: &BlockIq1S, y: &BlockQ8K) -> (__m256i, i32) {
    let (acc, delta) = iq1_s_parts(b, y);
    (_mm256_madd_epi16(acc, _mm256_set1_epi16(1)), hsum_i32(delta))
}

/// The 16 scales `2·s + 1` of an IQ1_M block, one byte per 16 elements: word j of `scales` holds
/// those of groups 4j..4j+4 in bits 0..3, 3..6, 6..9, 9..12 (a multiply shifts each to the top).
#[target_feature(enable = "avx2")]
#[inline]
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

/// The IQ1 grid rows with their δ folded in, as IQ1_M's nibbles index them: row `i | d << 11`
/// (`i` the 11-bit grid index, `d` the δ bit) holds `8·g + δ` with δ = +1 for d = 0 and −1 for
/// d = 1, i.e. the scalar kernel's per-element values.
static IQ1M_ROWS: [[i8; 8]; 4096] = iq1m_rows();

/// Builds [`IQ1M_ROWS`] at compile time.
const fn iq1m_rows() -> [[i8; 8]; 4096] {
    let mut t = [[0i8; 8]; 4096];
    let mut i = 0;
    while i < 4096 {
        let d = if i < 2048 { 1 } else { -1 };
        let mut k = 0;
        while k < 8 {
            t[i][k] = 8 * IQ1S_GRID[i & 2047][k] + d;
            k += 1;
        }
        i += 1;
    }
    t
}

/// IQ1_M blocks against Q8_K blocks: `Σ_g s_g·Σ (8·g + δ)·y`, exact (the scalar kernel's sum).
/// Rows of `8·g + δ` come from [`IQ1M_ROWS`] (the whole nibble indexes it), their magnitudes
/// (≤ 9) meet the sign-adjusted activations in `maddubs` (pairs of at most 2·9·127) and `madd`
/// applies the i16 scale of each 16 elements.
#[target_feature(enable = "avx2")]
#[inline]
fn iq1_m_isum(b: &BlockIq1M, y: &BlockQ8K) -> i32 {
    let (yq, _) = q8_parts(y);
    let sb = _mm256_broadcastsi128_si256(iq1_m_scales(&b.scales));
    let mut pick = scale_pick(0, 1);
    let mut acc = _mm256_setzero_si256();
    for ib in 0..8 {
        let hq = u16::from_le_bytes([b.qh[2 * ib], b.qh[2 * ib + 1]]) as usize;
        let i = |l: usize| b.qs[4 * ib + l] as usize | (((hq >> (4 * l)) & 15) << 8);
        let v = rows4(&IQ1M_ROWS, [i(0), i(1), i(2), i(3)]);
        let y8 = _mm256_sign_epi8(load32(&yq[ib]), v);
        acc = _mm256_add_epi32(acc, scaled(_mm256_abs_epi8(v), y8, _mm256_shuffle_epi8(sb, pick)));
        pick = _mm256_add_epi16(pick, _mm256_set1_epi16(2));
    }
    hsum_i32(acc)
}

/// Rows of eight `+1` (index 0) or eight `−1` (index 1): IQ1_M's δ per 8 elements.
static DELTA_ROWS: [[i8; 8]; 2] = [[1; 8], [-1; 8]];

/// IQ1_M in ggml's AVX2 parts: the lanes of `Σ s·g·y` and of `Σ s·δ·y` (lane `l`: elements
/// `4l..4l + 4` of every 32; `g ∈ {−1, 0, 1}` the grid value, `δ = ±1` per 8 elements, `s` the
/// scale of 16 elements), both exact.
#[target_feature(enable = "avx2")]
#[inline]
fn iq1_m_ggml_lanes(b: &BlockIq1M, y: &BlockQ8K) -> (__m256i, __m256i) {
    let (yq, _) = q8_parts(y);
    let sb = _mm256_broadcastsi128_si256(iq1_m_scales(&b.scales));
    let one = _mm256_set1_epi8(1);
    let mut pick = scale_pick(0, 1);
    let (mut grid, mut delta) = (_mm256_setzero_si256(), _mm256_setzero_si256());
    for ib in 0..8 {
        let hq = u16::from_le_bytes([b.qh[2 * ib], b.qh[2 * ib + 1]]) as usize;
        let i = |l: usize| b.qs[4 * ib + l] as usize | (((hq >> (4 * l)) & 7) << 8);
        let dl = |l: usize| (hq >> (4 * l + 3)) & 1;
        let g = rows4(&IQ1S_GRID, [i(0), i(1), i(2), i(3)]);
        let dv = rows4(&DELTA_ROWS, [dl(0), dl(1), dl(2), dl(3)]);
        let y8 = load32(&yq[ib]);
        let sc = _mm256_shuffle_epi8(sb, pick);
        grid = _mm256_add_epi32(grid, scaled(_mm256_abs_epi8(g), _mm256_sign_epi8(y8, g), sc));
        delta = _mm256_add_epi32(delta, scaled(one, _mm256_sign_epi8(y8, dv), sc));
        pick = _mm256_add_epi16(pick, _mm256_set1_epi16(2));
    }
    (grid, delta)
}

/// An f16 scale as f32, by F16C (exact, as every conversion of a finite or infinite f16 is).
#[target_feature(enable = "avx2,f16c")]
fn f16c(d: [u8; 2]) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(u16::from_le_bytes(d) as i32)))
}

/// The float part shared with the scalar kernels: `C · Σ_blocks d_x · d_y · value`, in order, where
/// `value` is the block's integer sum as the scalar kernel turns it into f32. Inlined into each
/// `#[target_feature]` kernel below, so that the block sums inline into the loop.
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

/// The table entry and its `#[target_feature]` body for each fused type: `C`, the block scale and
/// the block value.
macro_rules! fused {
    ($($name:ident, $body:ident: $blk:ty, $c:expr, $d:expr, $value:expr;)*) => {$(
        #[target_feature(enable = "avx2,f16c")]
        fn $body(n: usize, x: &[u8], y: &[u8]) -> f32 {
            dot_fused(n, x, y, $c, $d, $value)
        }

        pub(crate) fn $name(n: usize, x: &[u8], y: &[u8]) -> f32 {
            // SAFETY: installed only after AVX2 and F16C were detected (see the module doc of `avx2`).
            unsafe { $body(n, x, y) }
        }
    )*};
}

fused! {
    vec_dot_iq2_xxs_fused, iq2_xxs_dot: BlockIq2Xxs, 0.125, |b: &BlockIq2Xxs| f16c(b.d),
        |b, a| iq2_xxs_isum(b, a) as f32;
    vec_dot_iq2_xs_fused, iq2_xs_dot: BlockIq2Xs, 0.125, |b: &BlockIq2Xs| f16c(b.d),
        |b, a| iq2_xs_isum(b, a) as f32;
    vec_dot_iq2_s_fused, iq2_s_dot: BlockIq2S, 0.125, |b: &BlockIq2S| f16c(b.d),
        |b, a| iq2_s_isum(b, a) as f32;
    vec_dot_iq3_xxs_fused, iq3_xxs_dot: BlockIq3Xxs, 0.25, |b: &BlockIq3Xxs| f16c(b.d),
        |b, a| iq3_xxs_isum(b, a) as f32;
    vec_dot_iq3_s_fused, iq3_s_dot: BlockIq3S, 1.0, |b: &BlockIq3S| f16c(b.d),
        |b, a| iq3_s_isum(b, a) as f32;
    vec_dot_iq1_s_fused, iq1_s_dot: BlockIq1S, 1.0, |b: &BlockIq1S| f16c(b.d),
        |b, a| iq1_s_isum(b, a) as f32 * 0.125;
    vec_dot_iq1_m_fused, iq1_m_dot: BlockIq1M, 1.0, |b: &BlockIq1M| f16c(iq::iq1_m_d_bits(b)),
        |b, a| iq1_m_isum(b, a) as f32 * 0.125;
    vec_dot_tq1_0_fused, tq1_0_dot: BlockTq1_0, 1.0, |b: &BlockTq1_0| f16c(b.d),
        |b, a| tq1_0_isum(b, a) as f32;
    vec_dot_tq2_0_fused, tq2_0_dot: BlockTq2_0, 1.0, |b: &BlockTq2_0| f16c(b.d),
        |b, a| tq2_0_isum(b, a) as f32;
}

// ---- ggml's orders (the `avx2` and `avx512` numerics profiles; models in `scalar::iq_x86`) ----

/// The rows of `n` elements as blocks, checked.
#[inline(always)]
fn block_rows<'a, B: bytemuck::Pod>(n: usize, x: &'a [u8], y: &'a [u8]) -> (&'a [B], &'a [BlockQ8K]) {
    assert_eq!(n % QK_K, 0, "vec_dot: n = {n} is not a whole number of blocks");
    let nb = n / QK_K;
    let (bs, ys) = (std::mem::size_of::<B>(), std::mem::size_of::<BlockQ8K>());
    assert!(x.len() >= nb * bs && y.len() >= nb * ys, "vec_dot: rows too short");
    (as_blocks(&x[..nb * bs]), as_blocks(&y[..nb * ys]))
}

/// `acc = fma(d, float(lanes), acc)`.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn fma_lanes(d: f32, lanes: __m256i, acc: __m256) -> __m256 {
    _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(lanes), acc)
}

/// ggml's `hsum_float_8`: high plus low half, then `(s0 + s2) + (s1 + s3)`.
#[target_feature(enable = "avx2")]
#[inline]
fn hsum8(v: __m256) -> f32 {
    // SAFETY: register arithmetic; AVX2 is enabled here.
    unsafe { super::util::hsum_ps(v) }
}

/// The table entry and its `#[target_feature]` body for each type of ggml's one-row order:
/// `acc = fma(d_x·d_y, float(lanes), acc)` per block, then `C·hsum(acc)`.
macro_rules! ggml_one_row {
    ($($name:ident, $body:ident: $blk:ty, $c:expr, $lanes:ident;)*) => {$(
        #[target_feature(enable = "avx2,fma,f16c")]
        fn $body(n: usize, x: &[u8], y: &[u8]) -> f32 {
            let (xs, ys) = block_rows::<$blk>(n, x, y);
            let mut acc = _mm256_setzero_ps();
            for (b, a) in xs.iter().zip(ys) {
                acc = fma_lanes(f16c(b.d) * f32::from_le_bytes(a.d), $lanes(b, a), acc);
            }
            $c * hsum8(acc)
        }

        pub(crate) fn $name(n: usize, x: &[u8], y: &[u8]) -> f32 {
            // SAFETY: installed only after AVX2, FMA and F16C were detected (see the module doc of `avx2`).
            unsafe { $body(n, x, y) }
        }
    )*};
}

ggml_one_row! {
    vec_dot_iq2_xxs_ggml, iq2_xxs_ggml: BlockIq2Xxs, 0.125, iq2_xxs_lanes;
    vec_dot_iq2_xs_ggml, iq2_xs_ggml: BlockIq2Xs, 0.125, iq2_xs_lanes;
    vec_dot_iq2_s_ggml, iq2_s_ggml: BlockIq2S, 0.125, iq2_s_lanes;
    vec_dot_iq3_xxs_ggml, iq3_xxs_ggml: BlockIq3Xxs, 0.25, iq3_xxs_lanes;
    vec_dot_iq3_s_ggml, iq3_s_ggml: BlockIq3S, 1.0, iq3_s_lanes;
    vec_dot_tq1_0_ggml, tq1_0_ggml: BlockTq1_0, 1.0, tq1_0_lanes;
    vec_dot_tq2_0_ggml, tq2_0_ggml: BlockTq2_0, 1.0, tq2_0_lanes;
}

/// IQ1_S in ggml's one-row order: the grid lanes by `fma(d)` into `acc`, the δ integer by a scalar
/// `fma(d)` into `acc1`, then `hsum(acc) + acc1·0.125`.
#[target_feature(enable = "avx2,fma,f16c")]
fn iq1_s_ggml(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let (xs, ys) = block_rows::<BlockIq1S>(n, x, y);
    let (mut acc, mut acc1) = (_mm256_setzero_ps(), 0f32);
    for (b, a) in xs.iter().zip(ys) {
        let (lanes, sumi1) = iq1_s_ggml_parts(b, a);
        let d = f32::from_le_bytes(a.d) * f16c(b.d);
        acc = fma_lanes(d, lanes, acc);
        acc1 = d.mul_add(sumi1 as f32, acc1);
    }
    hsum8(acc) + acc1 * 0.125
}

/// IQ1_S · Q8_K in ggml's AVX2 one-row order.
pub(crate) fn vec_dot_iq1_s_ggml(n: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: installed only after AVX2, FMA and F16C were detected (see the module doc of `avx2`).
    unsafe { iq1_s_ggml(n, x, y) }
}

/// IQ1_M in ggml's one-row order: grid and δ lanes by `fma(d)` into two accumulators, then
/// `fma(hsum(acc2), 0.125, hsum(acc1))`.
#[target_feature(enable = "avx2,fma,f16c")]
fn iq1_m_ggml(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let (xs, ys) = block_rows::<BlockIq1M>(n, x, y);
    let (mut acc1, mut acc2) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    for (b, a) in xs.iter().zip(ys) {
        let (grid, delta) = iq1_m_ggml_lanes(b, a);
        let d = f32::from_le_bytes(a.d) * f16c(iq::iq1_m_d_bits(b));
        acc1 = fma_lanes(d, grid, acc1);
        acc2 = fma_lanes(d, delta, acc2);
    }
    hsum8(acc2).mul_add(0.125, hsum8(acc1))
}

/// IQ1_M · Q8_K in ggml's AVX2 one-row order.
pub(crate) fn vec_dot_iq1_m_ggml(n: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: installed only after AVX2, FMA and F16C were detected (see the module doc of `avx2`).
    unsafe { iq1_m_ggml(n, x, y) }
}

/// The table entry and its `#[target_feature]` body for each type of ggml's tiled order (8 or more
/// activation rows): `r = (d_x·C)·float(s1)` with the block's exact integer `s1`, then
/// `acc = fma(r, d_y, acc)`.
macro_rules! ggml_tiled {
    ($($name:ident, $body:ident: $blk:ty, $c:expr, $d:expr, $isum:ident;)*) => {$(
        #[target_feature(enable = "avx2,fma,f16c")]
        fn $body(n: usize, x: &[u8], y: &[u8]) -> f32 {
            let (xs, ys) = block_rows::<$blk>(n, x, y);
            let mut acc = 0f32;
            for (b, a) in xs.iter().zip(ys) {
                let r = ($d(b) * $c) * $isum(b, a) as f32;
                acc = r.mul_add(f32::from_le_bytes(a.d), acc);
            }
            acc
        }

        pub(crate) fn $name(n: usize, x: &[u8], y: &[u8]) -> f32 {
            // SAFETY: installed only after AVX2, FMA and F16C were detected (see the module doc of `avx2`).
            unsafe { $body(n, x, y) }
        }
    )*};
}

ggml_tiled! {
    vec_dot_iq2_xxs_tiled, iq2_xxs_tiled: BlockIq2Xxs, 0.125, |b: &BlockIq2Xxs| f16c(b.d), iq2_xxs_isum;
    vec_dot_iq2_xs_tiled, iq2_xs_tiled: BlockIq2Xs, 0.125, |b: &BlockIq2Xs| f16c(b.d), iq2_xs_isum;
    vec_dot_iq2_s_tiled, iq2_s_tiled: BlockIq2S, 0.125, |b: &BlockIq2S| f16c(b.d), iq2_s_isum;
    vec_dot_iq3_xxs_tiled, iq3_xxs_tiled: BlockIq3Xxs, 0.25, |b: &BlockIq3Xxs| f16c(b.d), iq3_xxs_isum;
    vec_dot_iq3_s_tiled, iq3_s_tiled: BlockIq3S, 1.0, |b: &BlockIq3S| f16c(b.d), iq3_s_isum;
    vec_dot_iq1_s_tiled, iq1_s_tiled: BlockIq1S, 0.125, |b: &BlockIq1S| f16c(b.d), iq1_s_isum;
    vec_dot_iq1_m_tiled, iq1_m_tiled: BlockIq1M, 0.125, |b: &BlockIq1M| f16c(iq::iq1_m_d_bits(b)), iq1_m_isum;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`with_parity`] against the scalar [`iq::signs8`] on every 7-bit field.
    #[test]
    fn with_parity_matches_signs8() {
        if !crate::quant::x86_64::avx2_available() {
            return;
        }
        for base in (0..128u8).step_by(32) {
            let f: [u8; 32] = std::array::from_fn(|k| base + k as u8);
            // SAFETY: AVX2 was detected above.
            let got: [u8; 32] = unsafe { bytemuck::cast(with_parity(load32(&f))) };
            for (k, &g) in got.iter().enumerate() {
                assert_eq!(g, iq::signs8(f[k] as u32), "field {}", f[k]);
            }
        }
    }
}
