//! `#[repr(C)]` block structs of the quantized types, byte for byte as ggml lays them out.
//!
//! ref: ggml-compute-semantics.md §2.2. Every field is a byte array (alignment 1), so a block slice
//! can be cast from any `&[u8]` without alignment concerns; multi-byte scalars are little-endian and
//! read through the accessors below. Sizes are asserted at compile time against [`GgmlType`].

use bytemuck::{Pod, Zeroable};
use half::{bf16, f16};

use crate::dtype::{GgmlType, QK_K};

/// Elements per block of the 32-element ("legacy") formats.
pub const QK: usize = 32;

/// Reads a little-endian f16 as f32 (exact).
#[inline(always)]
pub fn f16le(b: [u8; 2]) -> f32 {
    f16::from_bits(u16::from_le_bytes(b)).to_f32()
}

/// Rounds `v` to f16 (round to nearest even) and returns its little-endian bytes.
#[inline(always)]
pub fn to_f16le(v: f32) -> [u8; 2] {
    f16::from_f32(v).to_bits().to_le_bytes()
}

/// f32 → bf16 bits, round to nearest even, NaN forced quiet (ref: ggml-compute-semantics.md §1.7).
#[inline(always)]
pub fn f32_to_bf16_bits(v: f32) -> u16 {
    let bits = v.to_bits();
    if (bits & 0x7fff_ffff) > 0x7f80_0000 {
        return ((bits >> 16) | 64) as u16;
    }
    ((bits.wrapping_add(0x7fff + ((bits >> 16) & 1))) >> 16) as u16
}

/// bf16 bits → f32 (exact: `bits << 16`).
#[inline(always)]
pub fn bf16_bits_to_f32(b: u16) -> f32 {
    bf16::from_bits(b).to_f32()
}

macro_rules! block {
    ($(#[$m:meta])* $name:ident, $ty:expr, { $($(#[$fm:meta])* $f:ident : $t:ty),* $(,)? }) => {
        $(#[$m])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Pod, Zeroable)]
        pub struct $name {
            $($(#[$fm])* pub $f: $t,)*
        }
        const _: () = assert!(std::mem::size_of::<$name>() == $ty.type_size());
        const _: () = assert!(std::mem::align_of::<$name>() == 1);
    };
}

block!(
    /// Q4_0: `d: f16 | qs: u8[16]`, 32 elements.
    BlockQ4_0, GgmlType::Q4_0, {
    /// Scale (f16).
    d: [u8; 2],
    /// Nibbles: low = elements 0..16, high = 16..32.
    qs: [u8; QK / 2],
});

block!(
    /// Q4_1: `d: f16 | m: f16 | qs: u8[16]`.
    BlockQ4_1, GgmlType::Q4_1, {
    /// Scale (f16).
    d: [u8; 2],
    /// Offset (f16).
    m: [u8; 2],
    /// Nibbles as in Q4_0.
    qs: [u8; QK / 2],
});

block!(
    /// Q5_0: `d: f16 | qh: u8[4] | qs: u8[16]`.
    BlockQ5_0, GgmlType::Q5_0, {
    /// Scale (f16).
    d: [u8; 2],
    /// Fifth bits, a little-endian u32: bit j for element j.
    qh: [u8; 4],
    /// Low nibbles as in Q4_0.
    qs: [u8; QK / 2],
});

block!(
    /// Q5_1: `d: f16 | m: f16 | qh: u8[4] | qs: u8[16]`.
    BlockQ5_1, GgmlType::Q5_1, {
    /// Scale (f16).
    d: [u8; 2],
    /// Offset (f16).
    m: [u8; 2],
    /// Fifth bits as in Q5_0.
    qh: [u8; 4],
    /// Low nibbles as in Q4_0.
    qs: [u8; QK / 2],
});

block!(
    /// Q8_0: `d: f16 | qs: i8[32]`.
    BlockQ8_0, GgmlType::Q8_0, {
    /// Scale (f16).
    d: [u8; 2],
    /// Quants.
    qs: [i8; QK],
});

block!(
    /// Q8_1: `d: f16 | s: f16 | qs: i8[32]`, with `s = d * Σ qs`.
    BlockQ8_1, GgmlType::Q8_1, {
    /// Scale (f16).
    d: [u8; 2],
    /// `d * Σ qs` (f16).
    s: [u8; 2],
    /// Quants.
    qs: [i8; QK],
});

block!(
    /// Q2_K: `scales: u8[16] | qs: u8[64] | d: f16 | dmin: f16`.
    BlockQ2K, GgmlType::Q2_K, {
    /// Low nibble scale, high nibble min, per 16-element sub-block.
    scales: [u8; QK_K / 16],
    /// 2-bit quants.
    qs: [u8; QK_K / 4],
    /// Super-block scale of the scales (f16).
    d: [u8; 2],
    /// Super-block scale of the mins (f16).
    dmin: [u8; 2],
});

block!(
    /// Q3_K: `hmask: u8[32] | qs: u8[64] | scales: u8[12] | d: f16`.
    BlockQ3K, GgmlType::Q3_K, {
    /// High bits.
    hmask: [u8; QK_K / 8],
    /// Low 2 bits.
    qs: [u8; QK_K / 4],
    /// 16 packed 6-bit scales.
    scales: [u8; 12],
    /// Super-block scale (f16).
    d: [u8; 2],
});

block!(
    /// Q4_K: `d: f16 | dmin: f16 | scales: u8[12] | qs: u8[128]`.
    BlockQ4K, GgmlType::Q4_K, {
    /// Super-block scale of the scales (f16).
    d: [u8; 2],
    /// Super-block scale of the mins (f16).
    dmin: [u8; 2],
    /// 8 packed 6-bit scales and mins.
    scales: [u8; 12],
    /// Nibbles.
    qs: [u8; QK_K / 2],
});

block!(
    /// Q5_K: `d: f16 | dmin: f16 | scales: u8[12] | qh: u8[32] | qs: u8[128]`.
    BlockQ5K, GgmlType::Q5_K, {
    /// Super-block scale of the scales (f16).
    d: [u8; 2],
    /// Super-block scale of the mins (f16).
    dmin: [u8; 2],
    /// 8 packed 6-bit scales and mins.
    scales: [u8; 12],
    /// Fifth bits.
    qh: [u8; QK_K / 8],
    /// Low nibbles.
    qs: [u8; QK_K / 2],
});

block!(
    /// Q6_K: `ql: u8[128] | qh: u8[64] | scales: i8[16] | d: f16`.
    BlockQ6K, GgmlType::Q6_K, {
    /// Low nibbles.
    ql: [u8; QK_K / 2],
    /// High 2 bits.
    qh: [u8; QK_K / 4],
    /// Signed scales per 16 elements.
    scales: [i8; QK_K / 16],
    /// Super-block scale (f16).
    d: [u8; 2],
});

block!(
    /// Q8_K: `d: f32 | qs: i8[256] | bsums: i16[16]`.
    BlockQ8K, GgmlType::Q8_K, {
    /// Scale (f32, little-endian).
    d: [u8; 4],
    /// Quants.
    qs: [i8; QK_K],
    /// Sums of each 16 quants (i16, little-endian).
    bsums: [[u8; 2]; QK_K / 16],
});

block!(
    /// IQ4_NL: `d: f16 | qs: u8[16]`, non-linear codebook.
    BlockIq4Nl, GgmlType::IQ4_NL, {
    /// Scale (f16).
    d: [u8; 2],
    /// Codebook indices, nibbles as in Q4_0.
    qs: [u8; QK / 2],
});

block!(
    /// IQ4_XS: `d: f16 | scales_h: u16 | scales_l: u8[4] | qs: u8[128]`.
    BlockIq4Xs, GgmlType::IQ4_XS, {
    /// Super-block scale (f16).
    d: [u8; 2],
    /// High 2 bits of the 8 sub-block scales (u16).
    scales_h: [u8; 2],
    /// Low 4 bits of the 8 sub-block scales.
    scales_l: [u8; QK_K / 64],
    /// Codebook indices.
    qs: [u8; QK_K / 2],
});

block!(
    /// MXFP4: `e: u8 (E8M0) | qs: u8[16]`.
    BlockMxfp4, GgmlType::MXFP4, {
    /// Shared exponent.
    e: u8,
    /// E2M1 codes, nibbles as in Q4_0.
    qs: [u8; QK / 2],
});

block!(
    /// NVFP4: `d: u8[4] (UE4M3 per 16) | qs: u8[32]`, 64 elements.
    BlockNvfp4, GgmlType::NVFP4, {
    /// Sub-block scales.
    d: [u8; 4],
    /// E2M1 codes.
    qs: [u8; 32],
});

block!(
    /// Q1_0: `d: f16 | qs: u8[16]`, 128 elements of ±d.
    BlockQ1_0, GgmlType::Q1_0, {
    /// Scale (f16).
    d: [u8; 2],
    /// Sign bits.
    qs: [u8; 16],
});

block!(
    /// Q2_0: `d: f16 | qs: u8[16]`, 64 elements of (q-1)·d.
    BlockQ2_0, GgmlType::Q2_0, {
    /// Scale (f16).
    d: [u8; 2],
    /// 2-bit quants.
    qs: [u8; 16],
});

block!(
    /// TQ2_0: `qs: u8[64] | d: f16`, 256 ternary elements.
    BlockTq2_0, GgmlType::TQ2_0, {
    /// 2-bit quants.
    qs: [u8; QK_K / 4],
    /// Scale (f16).
    d: [u8; 2],
});

block!(
    /// TQ1_0: `qs: u8[48] | qh: u8[4] | d: f16`, 256 ternary elements, five base-3 digits per
    /// `qs` byte and four per `qh` byte.
    BlockTq1_0, GgmlType::TQ1_0, {
    /// Five trits per byte.
    qs: [u8; 48],
    /// Four trits per byte.
    qh: [u8; 4],
    /// Scale (f16).
    d: [u8; 2],
});

block!(
    /// IQ2_XXS: `d: f16 | qs: u16[32]`; per 32 elements four grid bytes and a u32 of four 7-bit
    /// sign fields and a 4-bit scale.
    BlockIq2Xxs, GgmlType::IQ2_XXS, {
    /// Super-block scale (f16).
    d: [u8; 2],
    /// Grid indices, signs and scales.
    qs: [u8; QK_K / 4],
});

block!(
    /// IQ2_XS: `d: f16 | qs: u16[32] | scales: u8[8]`; each u16 = 9-bit grid index, 7-bit signs.
    BlockIq2Xs, GgmlType::IQ2_XS, {
    /// Super-block scale (f16).
    d: [u8; 2],
    /// Grid indices and sign fields (u16).
    qs: [u8; QK_K / 4],
    /// Two 4-bit scales per 32 elements.
    scales: [u8; QK_K / 32],
});

block!(
    /// IQ2_S: `d: f16 | qs: u8[64] (32 index bytes, 32 sign bytes) | qh: u8[8] | scales: u8[8]`.
    BlockIq2S, GgmlType::IQ2_S, {
    /// Super-block scale (f16).
    d: [u8; 2],
    /// Low grid index bytes, then explicit sign bytes.
    qs: [u8; QK_K / 4],
    /// Bits 8..9 of the grid indices, two per index.
    qh: [u8; QK_K / 32],
    /// Two 4-bit scales per 32 elements.
    scales: [u8; QK_K / 32],
});

block!(
    /// IQ3_XXS: `d: f16 | qs: u8[96]` (64 grid bytes, then a u32 of signs and scale per 32).
    BlockIq3Xxs, GgmlType::IQ3_XXS, {
    /// Super-block scale (f16).
    d: [u8; 2],
    /// Grid indices, then signs and scales.
    qs: [u8; 3 * QK_K / 8],
});

block!(
    /// IQ3_S: `d: f16 | qs: u8[64] | qh: u8[8] | signs: u8[32] | scales: u8[4]`.
    BlockIq3S, GgmlType::IQ3_S, {
    /// Super-block scale (f16).
    d: [u8; 2],
    /// Low grid index bytes.
    qs: [u8; QK_K / 4],
    /// Bit 8 of the grid indices.
    qh: [u8; QK_K / 32],
    /// Explicit sign bits.
    signs: [u8; QK_K / 8],
    /// 4-bit scales, one per 32 elements.
    scales: [u8; QK_K / 64],
});

block!(
    /// IQ1_S: `d: f16 | qs: u8[32] | qh: u16[8]`.
    BlockIq1S, GgmlType::IQ1_S, {
    /// Super-block scale (f16).
    d: [u8; 2],
    /// Low grid index bytes.
    qs: [u8; QK_K / 8],
    /// Per 32 elements: 3 high index bits per 8, 3-bit scale, delta sign (u16).
    qh: [u8; QK_K / 16],
});

block!(
    /// IQ1_M: `qs: u8[32] | qh: u8[16] | scales: u8[8]`; the f16 super-block scale is spread over
    /// the top nibbles of the four u16 scale words.
    BlockIq1M, GgmlType::IQ1_M, {
    /// Low grid index bytes.
    qs: [u8; QK_K / 8],
    /// High index bits and delta signs, one nibble per 8 elements.
    qh: [u8; QK_K / 16],
    /// 3-bit scales per 16 elements and the super-block scale.
    scales: [u8; QK_K / 32],
});

/// The 16 IQ4_NL / IQ4_XS codebook values (ref: ggml-compute-semantics.md §2.2 IQ4_NL).
pub const KVALUES_IQ4NL: [i8; 16] =
    [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

/// The doubled E2M1 values of MXFP4 / NVFP4 (ref: ggml-compute-semantics.md §2.2 MXFP4).
pub const KVALUES_MXFP4: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// Views `bytes` as blocks; panics unless it holds a whole number of blocks.
#[inline(always)]
pub fn as_blocks<T: Pod>(bytes: &[u8]) -> &[T] {
    bytemuck::cast_slice(bytes)
}

/// Views `bytes` mutably as blocks; panics unless it holds a whole number of blocks.
#[inline(always)]
pub fn as_blocks_mut<T: Pod>(bytes: &mut [u8]) -> &mut [T] {
    bytemuck::cast_slice_mut(bytes)
}

/// The first `n` blocks of `bytes`, asserting that they are there.
#[inline(always)]
pub fn take_blocks<T: Pod>(bytes: &[u8], n: usize) -> &[T] {
    let size = std::mem::size_of::<T>();
    assert!(bytes.len() >= n * size, "row too short: {} bytes for {n} blocks of {size}", bytes.len());
    as_blocks(&bytes[..n * size])
}

/// The 6-bit scale and min of sub-block `j` of Q4_K / Q5_K (ref: ggml-compute-semantics.md §2.2 Q4_K).
#[inline(always)]
pub fn scale_min_k4(j: usize, s: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        ((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4), (s[j + 4] >> 4) | ((s[j] >> 6) << 4))
    }
}

/// Unpacks the 16 signed scales of Q3_K, each already minus 32 (ref: ggml-compute-semantics.md §2.2 Q3_K).
#[inline(always)]
pub fn q3k_scales(s: &[u8; 12]) -> [i8; 16] {
    let mut sc = [0i8; 16];
    for j in 0..4 {
        sc[j] = ((s[j] & 0xF) | (s[8 + j] & 3) << 4) as i8 - 32;
        sc[4 + j] = ((s[4 + j] & 0xF) | ((s[8 + j] >> 2) & 3) << 4) as i8 - 32;
        sc[8 + j] = ((s[j] >> 4) | ((s[8 + j] >> 4) & 3) << 4) as i8 - 32;
        sc[12 + j] = ((s[4 + j] >> 4) | ((s[8 + j] >> 6) & 3) << 4) as i8 - 32;
    }
    sc
}

/// The 6-bit scale of sub-block `ib` of IQ4_XS (0..63; the effective scale is this minus 32).
#[inline(always)]
pub fn iq4xs_scale(b: &BlockIq4Xs, ib: usize) -> i32 {
    let h = u16::from_le_bytes(b.scales_h);
    let lo = (b.scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF;
    (lo as i32) | ((((h >> (2 * ib)) & 3) as i32) << 4)
}

/// MXFP4's E8M0 scale `2^(e-128)`, built exactly as an f32 (subnormal for e < 2).
#[inline(always)]
pub fn e8m0_half(e: u8) -> f32 {
    if e < 2 {
        // 2^-128 = bit 0x00200000, 2^-127 = 0x00400000 as f32 subnormals.
        f32::from_bits(0x0020_0000u32 << e)
    } else {
        f32::from_bits(((e as u32) - 1) << 23)
    }
}

/// NVFP4's UE4M3 scale times 0.5 (ref: ggml-compute-semantics.md §2.2 NVFP4).
#[inline(always)]
pub fn ue4m3_half(x: u8) -> f32 {
    if x == 0 || x == 0x7F {
        return 0.0;
    }
    let e = ((x >> 3) & 0xF) as i32;
    let m = (x & 7) as f32;
    let v = if e == 0 { m * (2.0f32).powi(-9) } else { (1.0 + m / 8.0) * (2.0f32).powi(e - 7) };
    v * 0.5
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e8m0_matches_powers_of_two() {
        for e in 0..=254u8 {
            assert_eq!(e8m0_half(e) as f64, 2f64.powi(e as i32 - 128), "e={e}");
        }
    }

    #[test]
    fn bf16_rounding_matches_reference_formula() {
        // 1.0 + 2^-8 is exactly half way between two bf16 values: ties to even (down).
        assert_eq!(f32_to_bf16_bits(1.0 + 1.0 / 256.0), 0x3f80);
        // 1.0 + 3·2^-8 ties to even (up).
        assert_eq!(f32_to_bf16_bits(1.0 + 3.0 / 256.0), 0x3f82);
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x7f80_0001)), 0x7fc0);
        assert_eq!(bf16_bits_to_f32(0x3f80), 1.0);
    }

    #[test]
    fn q3k_scale_unpacking_hand_built() {
        // Scale 0: low nibble 0x5 from s[0], high bits 2 from s[8] → 0x25 = 37 → 5.
        // Scale 12: high nibble 0xA of s[4], bits 6..7 of s[8] = 1 → 0x1A = 26 → -6.
        let mut s = [0u8; 12];
        s[0] = 0x05;
        s[4] = 0xA0;
        s[8] = 0b0100_0010;
        let sc = q3k_scales(&s);
        assert_eq!(sc[0], 5);
        assert_eq!(sc[12], -6);
        assert_eq!(sc[1], -32);
    }

    #[test]
    fn scale_min_k4_hand_built() {
        let mut s = [0u8; 12];
        s[0] = 0b1100_0011; // sc0 = 3, top bits 3 → high bits of sc4
        s[4] = 0b0100_0111; // mn0 = 7, top bits 1 → high bits of mn4
        s[8] = 0x9A; // sc4 low = 0xA, mn4 low = 0x9
        assert_eq!(scale_min_k4(0, &s), (3, 7));
        // sc4 takes its top bits from s[0] >> 6 = 3, mn4 from s[4] >> 6 = 1.
        assert_eq!(scale_min_k4(4, &s), (0xA | 3 << 4, 0x9 | 1 << 4));
    }
}
