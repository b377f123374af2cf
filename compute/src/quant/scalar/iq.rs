//! The grid-based "i-quants" (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S) and the ternary
//! TQ1_0: dequantization and dot products against Q8_K. Read-only: ggml's CPU backend has no
//! quantizer into the grid types either (they need an importance matrix), so neither CPY nor
//! SET_ROWS writes them.
//!
//! Every block is first decoded into [`Decoded`]: 256 small signed integers (grid value times sign,
//! or for IQ1 `8·grid ± 1`, the grid value plus its ±1/8 delta in eighths) and one odd integer scale
//! per 16 elements. An element is `d · scale · C · v` with a per-type constant `C`, and a dot
//! product is `d_x · d_y · Σ_g scale_g · Σ v·q8`, integer inside the super-block, in the order ggml
//! groups it (an integer sum per super-block, then one float multiply-add per super-block, then `C`).
//!
//! Layouts (ggml-compute-semantics.md §2.1 gives the sizes; the element placement below was checked
//! against ggml's dequantizer on random blocks by `compute/tests/quant_peer.rs`):
//! - IQ2_XXS: per 32 elements 8 bytes: four grid indices, then a u32 with four 7-bit sign fields
//!   (bits 0..27) and a 4-bit scale `s` (bits 28..31); scale `2s+1`, `C = 1/8`.
//! - IQ2_XS: per 8 elements a u16, 9-bit index and 7-bit sign field; per 32 one byte of two 4-bit
//!   scales (first and second 16 elements); `C = 1/8`.
//! - IQ2_S: 32 low index bytes then 32 explicit sign bytes; `qh[ib]` carries bits 8..9 of the
//!   four indices of its 32 elements (two bits each, in order); scales as IQ2_XS; `C = 1/8`.
//! - IQ3_XXS: 64 index bytes (4-element grid entries, two per 8 elements), then per 32 elements a u32
//!   of signs and scale as IQ2_XXS; `C = 1/4`.
//! - IQ3_S: 64 low index bytes, `qh[ib]` with bit 8 of the 8 indices of its 32 elements, 32 explicit
//!   sign bytes, one 4-bit scale per 32; `C = 1`.
//! - IQ1_S: 32 low index bytes, per 32 elements a u16 with three index bits per 8 (bits 0..11), a
//!   3-bit scale (12..14) and the delta's sign (15); value `grid + delta`, delta `±1/8`; `C = 1`.
//! - IQ1_M: as IQ1_S but with a nibble per 8 elements (three index bits, delta sign in bit 3), 3-bit
//!   scales per 16 and the f16 super-block scale spread over the scale words' top nibbles.
//! - TQ1_0: 48 bytes of five base-3 digits and 4 bytes of four, digit `n` of byte `q` being
//!   `((q·3ⁿ mod 256)·3) >> 8`, minus 1; `C = 1`.
//!
//! Sign fields of seven bits get an eighth bit that makes the byte's parity even (ggml's
//! `ksigns_iq2xs` table is exactly that function).

use super::iq_grids::{IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID};
use super::{dequant_blocks, dot_blocks};
use crate::dtype::QK_K;
use crate::quant::blocks::*;

/// One block, decoded: `x[k] = d · scale[k/16] · C · v[k]` (`d` and `C` per type).
pub struct Decoded {
    /// Signed grid values (IQ1: in eighths).
    pub v: [i8; QK_K],
    /// Integer scale per 16 elements.
    pub scale: [i32; QK_K / 16],
}

/// The 8 sign bits of a 7-bit sign field: bit 7 makes the parity even.
#[inline(always)]
pub(crate) fn signs8(field: u32) -> u8 {
    let f = (field & 127) as u8;
    f | (((f.count_ones() & 1) as u8) << 7)
}

/// For each sign byte, the u64 whose byte `j` is 0xFF where bit `j` is set.
pub(crate) const SIGN_MASKS: [u64; 256] = {
    let mut t = [0u64; 256];
    let mut i = 0;
    while i < 256 {
        let mut j = 0;
        while j < 8 {
            if (i >> j) & 1 == 1 {
                t[i] |= 0xFF << (8 * j);
            }
            j += 1;
        }
        i += 1;
    }
    t
};

/// Eight magnitudes (each 1..=127, packed little-endian in `g`) negated where `signs` has a bit:
/// `(g ^ m) + (m & 1)` per byte is the two's complement where the mask byte is 0xFF, and no byte
/// carries into the next because no magnitude is 0.
#[inline(always)]
fn signed8(g: u64, signs: u8) -> [i8; 8] {
    let m = SIGN_MASKS[signs as usize];
    let v = (g ^ m).wrapping_add(m & 0x0101_0101_0101_0101);
    bytemuck::cast(v.to_le_bytes())
}

/// Writes the 8-magnitude grid entry `grid` with `signs` (bit j negates element j) at `out`.
#[inline(always)]
fn put_signed(out: &mut [i8], grid: &[i8; 8], signs: u8) {
    let g = u64::from_le_bytes(bytemuck::cast(*grid));
    out[..8].copy_from_slice(&signed8(g, signs));
}

/// Writes two 4-magnitude grid entries side by side with `signs` at `out`.
#[inline(always)]
fn put_signed_4x2(out: &mut [i8], g1: &[u8; 4], g2: &[u8; 4], signs: u8) {
    let g = u32::from_le_bytes(*g1) as u64 | (u32::from_le_bytes(*g2) as u64) << 32;
    out[..8].copy_from_slice(&signed8(g, signs));
}

#[inline(always)]
fn u32le(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

#[inline(always)]
fn u16le(b: &[u8]) -> u16 {
    u16::from_le_bytes([b[0], b[1]])
}

/// Decodes an IQ2_XXS block.
pub fn decode_iq2_xxs(b: &BlockIq2Xxs) -> Decoded {
    let mut d = Decoded { v: [0; QK_K], scale: [0; 16] };
    for ib in 0..8 {
        let q = &b.qs[8 * ib..8 * ib + 8];
        let aux = u32le(&q[4..]);
        let s = 2 * (aux >> 28) as i32 + 1;
        d.scale[2 * ib] = s;
        d.scale[2 * ib + 1] = s;
        for l in 0..4 {
            let o = 32 * ib + 8 * l;
            put_signed(&mut d.v[o..o + 8], &IQ2XXS_GRID[q[l] as usize], signs8(aux >> (7 * l)));
        }
    }
    d
}

/// Decodes an IQ2_XS block.
pub fn decode_iq2_xs(b: &BlockIq2Xs) -> Decoded {
    let mut d = Decoded { v: [0; QK_K], scale: [0; 16] };
    for ib in 0..8 {
        d.scale[2 * ib] = 2 * (b.scales[ib] & 15) as i32 + 1;
        d.scale[2 * ib + 1] = 2 * (b.scales[ib] >> 4) as i32 + 1;
        for l in 0..4 {
            let q = u16le(&b.qs[2 * (4 * ib + l)..]) as usize;
            let o = 32 * ib + 8 * l;
            put_signed(&mut d.v[o..o + 8], &IQ2XS_GRID[q & 511], signs8((q >> 9) as u32));
        }
    }
    d
}

/// Decodes an IQ2_S block.
pub fn decode_iq2_s(b: &BlockIq2S) -> Decoded {
    let mut d = Decoded { v: [0; QK_K], scale: [0; 16] };
    let (idx, signs) = b.qs.split_at(QK_K / 8);
    for ib in 0..8 {
        d.scale[2 * ib] = 2 * (b.scales[ib] & 15) as i32 + 1;
        d.scale[2 * ib + 1] = 2 * (b.scales[ib] >> 4) as i32 + 1;
        for l in 0..4 {
            let hi = ((b.qh[ib] as usize) << (8 - 2 * l)) & 0x300;
            let o = 32 * ib + 8 * l;
            put_signed(&mut d.v[o..o + 8], &IQ2S_GRID[idx[4 * ib + l] as usize | hi], signs[4 * ib + l]);
        }
    }
    d
}

/// Decodes an IQ3_XXS block.
pub fn decode_iq3_xxs(b: &BlockIq3Xxs) -> Decoded {
    let mut d = Decoded { v: [0; QK_K], scale: [0; 16] };
    let (idx, sas) = b.qs.split_at(QK_K / 4);
    for ib in 0..8 {
        let aux = u32le(&sas[4 * ib..]);
        let s = 2 * (aux >> 28) as i32 + 1;
        d.scale[2 * ib] = s;
        d.scale[2 * ib + 1] = s;
        for l in 0..4 {
            let signs = signs8(aux >> (7 * l));
            let o = 32 * ib + 8 * l;
            let g1 = &IQ3XXS_GRID[idx[8 * ib + 2 * l] as usize];
            let g2 = &IQ3XXS_GRID[idx[8 * ib + 2 * l + 1] as usize];
            put_signed_4x2(&mut d.v[o..o + 8], g1, g2, signs);
        }
    }
    d
}

/// Decodes an IQ3_S block.
pub fn decode_iq3_s(b: &BlockIq3S) -> Decoded {
    let mut d = Decoded { v: [0; QK_K], scale: [0; 16] };
    for ib in 0..8 {
        let s = 2 * ((b.scales[ib / 2] >> (4 * (ib % 2))) & 15) as i32 + 1;
        d.scale[2 * ib] = s;
        d.scale[2 * ib + 1] = s;
        let qh = b.qh[ib] as usize;
        for l in 0..4 {
            let i1 = b.qs[8 * ib + 2 * l] as usize | ((qh << (8 - 2 * l)) & 256);
            let i2 = b.qs[8 * ib + 2 * l + 1] as usize | ((qh << (7 - 2 * l)) & 256);
            let signs = b.signs[4 * ib + l];
            let o = 32 * ib + 8 * l;
            put_signed_4x2(&mut d.v[o..o + 8], &IQ3S_GRID[i1], &IQ3S_GRID[i2], signs);
        }
    }
    d
}

/// Writes `8·grid + delta` (delta ±1: the grid value plus ±1/8, in eighths).
#[inline(always)]
fn put_iq1(out: &mut [i8], grid: &[i8; 8], delta: i8) {
    for (o, &g) in out.iter_mut().zip(grid) {
        *o = 8 * g + delta;
    }
}

/// Decodes an IQ1_S block (values in eighths).
pub fn decode_iq1_s(b: &BlockIq1S) -> Decoded {
    let mut d = Decoded { v: [0; QK_K], scale: [0; 16] };
    for ib in 0..8 {
        let h = u16le(&b.qh[2 * ib..]) as usize;
        let s = 2 * ((h >> 12) & 7) as i32 + 1;
        d.scale[2 * ib] = s;
        d.scale[2 * ib + 1] = s;
        let delta = if h & 0x8000 != 0 { -1 } else { 1 };
        for l in 0..4 {
            let i = b.qs[4 * ib + l] as usize | (((h >> (3 * l)) & 7) << 8);
            let o = 32 * ib + 8 * l;
            put_iq1(&mut d.v[o..o + 8], &IQ1S_GRID[i], delta);
        }
    }
    d
}

/// The f16 super-block scale of an IQ1_M block (top nibbles of its four u16 scale words).
pub fn iq1_m_d(b: &BlockIq1M) -> f32 {
    f16le(iq1_m_d_bits(b))
}

/// The bytes of [`iq1_m_d`]'s f16.
#[inline(always)]
pub fn iq1_m_d_bits(b: &BlockIq1M) -> [u8; 2] {
    let sc: [u16; 4] = std::array::from_fn(|i| u16le(&b.scales[2 * i..]));
    let bits = (sc[0] >> 12) | ((sc[1] >> 8) & 0x00F0) | ((sc[2] >> 4) & 0x0F00) | (sc[3] & 0xF000);
    bits.to_le_bytes()
}

/// Decodes an IQ1_M block (values in eighths).
pub fn decode_iq1_m(b: &BlockIq1M) -> Decoded {
    let mut d = Decoded { v: [0; QK_K], scale: [0; 16] };
    for ib in 0..8 {
        let w = u16le(&b.scales[2 * (ib / 2)..]) as i32;
        let sh = 6 * (ib % 2);
        d.scale[2 * ib] = 2 * ((w >> sh) & 7) + 1;
        d.scale[2 * ib + 1] = 2 * ((w >> (sh + 3)) & 7) + 1;
        for l in 0..4 {
            let nib = (b.qh[2 * ib + l / 2] >> (4 * (l % 2))) as usize & 15;
            let i = b.qs[4 * ib + l] as usize | ((nib & 7) << 8);
            let delta = if nib & 8 != 0 { -1 } else { 1 };
            let o = 32 * ib + 8 * l;
            put_iq1(&mut d.v[o..o + 8], &IQ1S_GRID[i], delta);
        }
    }
    d
}

/// Digit `n` (0..5) of a TQ1_0 byte, as -1..=1.
#[inline(always)]
fn trit(q: u8, n: u32) -> i8 {
    let r = q.wrapping_mul(3u8.pow(n));
    ((r as u16 * 3) >> 8) as i8 - 1
}

/// Decodes a TQ1_0 block (scale 1 everywhere).
pub fn decode_tq1_0(b: &BlockTq1_0) -> Decoded {
    let mut d = Decoded { v: [0; QK_K], scale: [1; 16] };
    let mut k = 0;
    // The first 32 bytes give 5 × 32 values, the next 16 give 5 × 16, each digit in turn.
    for (start, len) in [(0usize, 32usize), (32, 16)] {
        for n in 0..5 {
            for m in 0..len {
                d.v[k] = trit(b.qs[start + m], n);
                k += 1;
            }
        }
    }
    for n in 0..4 {
        for &q in &b.qh {
            d.v[k] = trit(q, n);
            k += 1;
        }
    }
    d
}

/// Decodes a TQ2_0 block (scale 1 everywhere): element order (g, l, m), value `q − 1`.
pub fn decode_tq2_0(b: &BlockTq2_0) -> Decoded {
    let mut d = Decoded { v: [0; QK_K], scale: [1; 16] };
    for g in 0..2 {
        for l in 0..4 {
            let out = &mut d.v[128 * g + 32 * l..128 * g + 32 * l + 32];
            for (o, &q) in out.iter_mut().zip(&b.qs[32 * g..32 * g + 32]) {
                *o = ((q >> (2 * l)) & 3) as i8 - 1;
            }
        }
    }
    d
}

/// Writes one decoded block: `(d · scale) · C` per 16 elements, times `v` (IQ1: times `v / 8`).
#[inline(always)]
fn emit(dec: &Decoded, d: f32, c: f32, eighths: bool, y: &mut [f32]) {
    for (g, out) in y.chunks_exact_mut(16).enumerate() {
        let db = d * dec.scale[g] as f32 * c;
        for (o, &v) in out.iter_mut().zip(&dec.v[16 * g..16 * g + 16]) {
            *o = if eighths { db * (v as f32 * 0.125) } else { db * v as f32 };
        }
    }
}

/// The integer `Σ_g scale_g · Σ v·q8` of one decoded block against one Q8_K block.
#[inline(always)]
pub fn block_isum(dec: &Decoded, q8: &[i8; QK_K]) -> i32 {
    let mut sum = 0i32;
    for g in 0..16 {
        let s: i32 =
            dec.v[16 * g..16 * g + 16].iter().zip(&q8[16 * g..]).map(|(&v, &a)| v as i32 * a as i32).sum();
        sum += dec.scale[g] * s;
    }
    sum
}

/// The grid value `g` and the delta `δ` of an IQ1 code `8·g + δ`.
pub(crate) fn iq1_split(v: i8) -> (i32, i32) {
    let g = (v as i32 + 4).div_euclid(8);
    (g, v as i32 - 8 * g)
}

/// The delta part of an IQ1_S super-block against Q8_K, as ggml forms it from the activations'
/// `bsums`: `Σ_ib scale_ib·δ_ib·(bsum_2ib + bsum_2ib+1)` (δ = ±1, the sign bit of `qh[ib]`).
pub(crate) fn iq1_s_delta_isum(b: &BlockIq1S, y: &BlockQ8K) -> i32 {
    let bsum = |g: usize| i16::from_le_bytes(y.bsums[g]) as i32;
    (0..8)
        .map(|ib| {
            let h = u16le(&b.qh[2 * ib..]) as i32;
            let ls = 2 * ((h >> 12) & 7) + 1;
            let delta = if h & 0x8000 != 0 { -1 } else { 1 };
            (bsum(2 * ib) + bsum(2 * ib + 1)) * delta * ls
        })
        .sum()
}

/// One grid type: how its blocks decode and scale.
pub struct IqSpec<B> {
    /// The decoder.
    pub decode: fn(&B) -> Decoded,
    /// The super-block scale.
    pub d: fn(&B) -> f32,
    /// The per-type constant `C`.
    pub c: f32,
    /// Values in eighths (IQ1).
    pub eighths: bool,
}

impl<B: bytemuck::Pod> IqSpec<B> {
    /// Dequantizes whole blocks to f32.
    #[inline(always)]
    pub fn to_f32(&self, src: &[u8], dst: &mut [f32]) {
        dequant_blocks(src, dst, QK_K, |b: &B, y| {
            emit(&(self.decode)(b), (self.d)(b), self.c, self.eighths, y)
        });
    }

    /// The dot product with Q8_K blocks, the integer part of each block by `isum` (every `isum`
    /// returns the same integer, so every caller gets the same bits).
    #[inline(always)]
    pub fn dot(&self, n: usize, x: &[u8], y: &[u8], isum: impl Fn(&Decoded, &[i8; QK_K]) -> i32) -> f32 {
        let sum = dot_blocks(n, x, y, QK_K, QK_K, |b: &B, a: &[BlockQ8K]| {
            let i = isum(&(self.decode)(b), &a[0].qs);
            let v = if self.eighths { i as f32 * 0.125 } else { i as f32 };
            (self.d)(b) * f32::from_le_bytes(a[0].d) * v
        });
        self.c * sum
    }
}

pub(crate) fn d_f16<B: HasD>(b: &B) -> f32 {
    f16le(b.d())
}

/// Blocks whose first or last field is an f16 super-block scale.
pub trait HasD {
    /// The scale's bytes.
    fn d(&self) -> [u8; 2];
}

macro_rules! has_d {
    ($($t:ty),*) => { $(impl HasD for $t { fn d(&self) -> [u8; 2] { self.d } })* };
}
has_d!(BlockIq2Xxs, BlockIq2Xs, BlockIq2S, BlockIq3Xxs, BlockIq3S, BlockIq1S, BlockTq1_0, BlockTq2_0);

macro_rules! iq_type {
    ($spec:ident, $to:ident, $dot:ident, $blk:ty, $decode:path, $d:expr, $c:expr, $eighths:expr) => {
        #[doc = concat!("`", stringify!($blk), "`'s decoding and scales.")]
        pub const $spec: IqSpec<$blk> = IqSpec { decode: $decode, d: $d, c: $c, eighths: $eighths };

        #[doc = concat!("Dequantizes whole `", stringify!($blk), "` blocks to f32.")]
        pub fn $to(src: &[u8], dst: &mut [f32]) {
            $spec.to_f32(src, dst)
        }

        #[doc = concat!("Dot product of `", stringify!($blk), "` blocks with Q8_K blocks.")]
        pub fn $dot(n: usize, x: &[u8], y: &[u8]) -> f32 {
            $spec.dot(n, x, y, block_isum)
        }
    };
}

iq_type!(
    IQ2_XXS_SPEC,
    iq2_xxs_to_f32,
    vec_dot_iq2_xxs_q8_k,
    BlockIq2Xxs,
    decode_iq2_xxs,
    d_f16,
    0.125,
    false
);
iq_type!(IQ2_XS_SPEC, iq2_xs_to_f32, vec_dot_iq2_xs_q8_k, BlockIq2Xs, decode_iq2_xs, d_f16, 0.125, false);
iq_type!(IQ2_S_SPEC, iq2_s_to_f32, vec_dot_iq2_s_q8_k, BlockIq2S, decode_iq2_s, d_f16, 0.125, false);
iq_type!(IQ3_XXS_SPEC, iq3_xxs_to_f32, vec_dot_iq3_xxs_q8_k, BlockIq3Xxs, decode_iq3_xxs, d_f16, 0.25, false);
iq_type!(IQ3_S_SPEC, iq3_s_to_f32, vec_dot_iq3_s_q8_k, BlockIq3S, decode_iq3_s, d_f16, 1.0, false);
iq_type!(IQ1_S_SPEC, iq1_s_to_f32, vec_dot_iq1_s_q8_k, BlockIq1S, decode_iq1_s, d_f16, 1.0, true);
iq_type!(IQ1_M_SPEC, iq1_m_to_f32, vec_dot_iq1_m_q8_k, BlockIq1M, decode_iq1_m, iq1_m_d, 1.0, true);
/// TQ2_0's decoding and scale (its to_f32 and scalar dot live in `extra`; the SIMD sets use this).
pub const TQ2_0_SPEC: IqSpec<BlockTq2_0> = IqSpec { decode: decode_tq2_0, d: d_f16, c: 1.0, eighths: false };

iq_type!(TQ1_0_SPEC, tq1_0_to_f32, vec_dot_tq1_0_q8_k, BlockTq1_0, decode_tq1_0, d_f16, 1.0, false);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iq1_codes_split_into_grid_and_delta() {
        for g in -1..=1 {
            for delta in [-1, 1] {
                assert_eq!(iq1_split((8 * g + delta) as i8), (g, delta));
            }
        }
    }

    #[test]
    fn signed8_negates_exactly_the_marked_bytes() {
        let g = [1i8, 2, 43, 62, 127, 8, 25, 9];
        for signs in 0..=255u8 {
            let got = signed8(u64::from_le_bytes(bytemuck::cast(g)), signs);
            for j in 0..8 {
                let want = if signs & (1 << j) != 0 { -g[j] } else { g[j] };
                assert_eq!(got[j], want, "signs {signs:#x} byte {j}");
            }
        }
    }

    #[test]
    fn sign_fields_have_even_parity() {
        for f in 0..128u32 {
            assert_eq!(signs8(f).count_ones() % 2, 0);
            assert_eq!(signs8(f) & 127, f as u8);
        }
    }

    #[test]
    fn tq1_0_digits_hand_computed() {
        // 5 trits (t0..t4) packed as ceil(Σ tᵢ·3^(4-i) · 256 / 243): digit n of the byte is tₙ.
        for v in 0..243u32 {
            let q = (v * 256).div_ceil(243) as u8;
            let mut t = [0u32; 5];
            let mut r = v;
            for i in (0..5).rev() {
                t[i] = r % 3;
                r /= 3;
            }
            for n in 0..5 {
                assert_eq!(trit(q, n as u32), t[n] as i8 - 1, "v={v} n={n}");
            }
        }
    }

    #[test]
    fn iq2_xxs_hand_built_block() {
        // d = 1, first 32 elements: grid 0 (all 8), sign field 1 on the first group (negates
        // element 0 and, for parity, element 7), scale nibble 1 → 3 · 1/8.
        let mut b = BlockIq2Xxs { d: to_f16le(1.0), qs: [0; 64] };
        b.qs[4..8].copy_from_slice(&(1u32 | 1 << 28).to_le_bytes());
        let mut y = [0f32; QK_K];
        iq2_xxs_to_f32(bytemuck::bytes_of(&b), &mut y);
        assert_eq!(y[0], -3.0);
        assert_eq!(y[1], 3.0);
        assert_eq!(y[7], -3.0);
        // The second 32 elements have scale 1 · 1/8.
        assert_eq!(y[32], 1.0);
    }
}
