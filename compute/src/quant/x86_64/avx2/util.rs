//! Shared AVX2 building blocks: horizontal sums, signed/unsigned byte dot products, nibble and bit
//! unpacking, f16 scalars through F16C.

use std::arch::x86_64::*;

/// Sum of the 8 lanes.
#[inline(always)]
pub(super) unsafe fn hsum_ps(v: __m256) -> f32 {
    // SAFETY: pure register arithmetic; the caller runs with AVX enabled.
    unsafe {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }
}

/// Pairwise i16 sums of unsigned `a` (0..=127 in practice) times signed `b`, widened to 8 i32.
#[inline(always)]
pub(super) unsafe fn dot_u8i8_epi32(a: __m256i, b: __m256i) -> __m256i {
    // SAFETY: pure register arithmetic under AVX2.
    unsafe { _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1)) }
}

/// Products of signed `a` and signed `b` bytes, as pairwise i16 sums (|a| ≤ 127 required).
#[inline(always)]
pub(super) unsafe fn dot_i8i8_epi16(a: __m256i, b: __m256i) -> __m256i {
    // SAFETY: pure register arithmetic under AVX2. maddubs takes |a| as the unsigned operand and
    // moves a's sign onto b.
    unsafe { _mm256_maddubs_epi16(_mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a)) }
}

/// Products of signed `a` and signed `b` bytes summed to 8 i32.
#[inline(always)]
pub(super) unsafe fn dot_i8i8_epi32(a: __m256i, b: __m256i) -> __m256i {
    // SAFETY: pure register arithmetic under AVX2.
    unsafe { _mm256_madd_epi16(dot_i8i8_epi16(a, b), _mm256_set1_epi16(1)) }
}

/// 32 nibbles from 16 bytes: low nibbles in the low lane (elements 0..16), high nibbles in the
/// high lane (elements 16..32), as in every 32-element block.
#[inline(always)]
pub(super) unsafe fn nibbles32(p: &[u8; 16]) -> __m256i {
    // SAFETY: reads exactly 16 bytes from a 16-byte array; the rest is register arithmetic.
    unsafe {
        let t = _mm_loadu_si128(p.as_ptr().cast());
        let both = _mm256_set_m128i(_mm_srli_epi16(t, 4), t);
        _mm256_and_si256(both, _mm256_set1_epi8(0x0F))
    }
}

/// 0xFF in byte j for every set bit j of `bits` (j = 0..32), 0 elsewhere.
#[inline(always)]
pub(super) unsafe fn bytes_from_bits(bits: u32) -> __m256i {
    // SAFETY: pure register arithmetic under AVX2. Byte j gets a copy of byte j/8 of `bits`, is
    // ORed with every bit except bit j%8, and compared with all ones.
    unsafe {
        let x = _mm256_set1_epi32(bits as i32);
        let spread =
            _mm256_setr_epi64x(0, 0x0101_0101_0101_0101, 0x0202_0202_0202_0202, 0x0303_0303_0303_0303);
        let x = _mm256_shuffle_epi8(x, spread);
        let others = _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfeu64 as i64);
        _mm256_cmpeq_epi8(_mm256_or_si256(x, others), _mm256_set1_epi64x(-1))
    }
}

/// f16 little-endian bytes to f32 through F16C.
#[inline(always)]
pub(super) unsafe fn f16(b: [u8; 2]) -> f32 {
    // SAFETY: register conversion under F16C.
    unsafe { _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(u16::from_le_bytes(b) as i32))) }
}

/// A 256-bit vector of 16 i16 with `lo` in the low lane and `hi` in the high lane.
#[inline(always)]
pub(super) unsafe fn lanes_epi16(lo: i16, hi: i16) -> __m256i {
    // SAFETY: register construction under AVX.
    unsafe { _mm256_set_m128i(_mm_set1_epi16(hi), _mm_set1_epi16(lo)) }
}

/// Loads 32 bytes.
#[inline(always)]
pub(super) unsafe fn load32<T>(p: &[T; 32]) -> __m256i {
    // SAFETY: `p` is a 32-element array of a byte-sized type: 32 readable bytes.
    unsafe { _mm256_loadu_si256(p.as_ptr().cast()) }
}

/// Loads 32 bytes starting at `s[at]` (bounds checked).
#[inline(always)]
pub(super) unsafe fn load32_at<T: Copy>(s: &[T], at: usize) -> __m256i {
    assert!(std::mem::size_of::<T>() == 1 && at + 32 <= s.len());
    // SAFETY: checked above: 32 readable bytes at `at`.
    unsafe { _mm256_loadu_si256(s.as_ptr().add(at).cast()) }
}
