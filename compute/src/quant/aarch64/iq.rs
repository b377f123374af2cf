//! The grid IQ types (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S) and the ternary TQ1_0 and
//! TQ2_0 on NEON, as decoders for the generic super-block loops of [`super::kquants`] (one column,
//! four columns and the i8mm 2×2 tile, with or without `sdot`).
//! ref: ggml-compute-semantics.md §2.1–§2.3; the layouts are those of `quant::scalar::iq`.
//!
//! Each decoder turns a block into the same 256 small signed integers and the same per-16 integer
//! scales as the scalar decoder (`quant::scalar::iq::Decoded`): grid rows are loaded by index (8
//! bytes for the IQ1/IQ2 grids, 4 bytes for the IQ3 grids), sign bytes become lane masks by a
//! bit test and negate the magnitudes they mark, IQ1 values are `8·grid ± 1`, and the TQ digits are
//! computed in lanes. The loops then form each block's integer `Σ_g scale_g · Σ v·q8` exactly and
//! apply the scalar kernel's float steps in its order (`d_x · d_y · value` per block, the per-type
//! constant `C` once per row), so every kernel equals the scalar `vec_dot` bit for bit
//! (`quant::tests::simd::grid_type_dots_equal_the_scalar_kernel_bitwise` and
//! `quant::tests::neon::grid_types_every_shape_equals_scalar_bitwise`).
//!
//! Their speed is unmeasured on aarch64 hardware: they were written and tested under qemu only, as
//! plain vector code (row loads, bit tests, `sdot` or widening multiplies), not tuned.

use std::arch::aarch64::*;

use super::dot::*;
use super::kquants::{dy, scaled, Decoded, KBlock};
use crate::dtype::QK_K;
use crate::quant::blocks::*;
use crate::quant::scalar::iq::{iq1_m_d_bits, iq1_s_delta_isum, signs8};
use crate::quant::scalar::iq_grids::{IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID};

/// IQ2_XXS.
pub(super) struct Iq2Xxs;
/// IQ2_XS.
pub(super) struct Iq2Xs;
/// IQ2_S.
pub(super) struct Iq2S;
/// IQ3_XXS.
pub(super) struct Iq3Xxs;
/// IQ3_S.
pub(super) struct Iq3S;
/// IQ1_S.
pub(super) struct Iq1S;
/// IQ1_M.
pub(super) struct Iq1M;
/// TQ1_0.
pub(super) struct Tq1_0;
/// TQ2_0.
pub(super) struct Tq2_0;

#[inline(always)]
fn u16le(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

#[inline(always)]
fn u32le(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Grid rows `i0` and `i1` of a table of 8-byte rows, side by side (`& (N − 1)` keeps the index
/// in range; `N` is a power of two and every caller's index fits).
#[inline(always)]
unsafe fn rows2<const N: usize>(t: &[[i8; 8]; N], i0: usize, i1: usize) -> int8x16_t {
    let (r0, r1) = (&t[i0 & (N - 1)], &t[i1 & (N - 1)]);
    // SAFETY: each row is 8 readable bytes; NEON is enabled in the caller.
    unsafe { vcombine_s8(vld1_s8(r0.as_ptr()), vld1_s8(r1.as_ptr())) }
}

/// Grid rows `i[0..4]` of a table of 4-byte rows, side by side (as [`rows2`]).
#[inline(always)]
unsafe fn rows4<const N: usize>(t: &[[u8; 4]; N], i: [usize; 4]) -> int8x16_t {
    let w: [u32; 4] = i.map(|k| u32::from_le_bytes(t[k & (N - 1)]));
    // SAFETY: `w` is 16 readable bytes; NEON is enabled in the caller.
    unsafe { vreinterpretq_s8_u32(vld1q_u32(w.as_ptr())) }
}

/// `g` negated in byte `j` (0..8) where bit `j` of `s0` is set and in byte `8 + j` where bit `j`
/// of `s1` is. No magnitude is −128, so the negation is exact.
#[inline(always)]
unsafe fn signed(g: int8x16_t, s0: u8, s1: u8) -> int8x16_t {
    const BITS: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];
    // SAFETY: BITS is 16 readable bytes; register arithmetic under NEON.
    unsafe {
        let s = vcombine_u8(vdup_n_u8(s0), vdup_n_u8(s1));
        let m = vtstq_u8(s, vld1q_u8(BITS.as_ptr()));
        vbslq_s8(m, vnegq_s8(g), g)
    }
}

/// `8·g + δ` per byte, with `δ0` in bytes 0..8 and `δ1` in bytes 8..16 (the IQ1 values in eighths;
/// |g| ≤ 1, so every value fits).
#[inline(always)]
unsafe fn eighths(g: int8x16_t, d0: i8, d1: i8) -> int8x16_t {
    // SAFETY: register arithmetic under NEON.
    unsafe { vaddq_s8(vshlq_n_s8::<3>(g), vcombine_s8(vdup_n_s8(d0), vdup_n_s8(d1))) }
}

/// The f32 block value of the types whose integer sum is the value (`C` applies per row).
#[inline(always)]
fn plain_value(isc: i32, d: [u8; 2], y: &BlockQ8K) -> f32 {
    h2f(d) * f32::from_le_bytes(y.d) * isc as f32
}

/// The f32 block value of IQ1_S / IQ1_M, whose integer sum is in eighths.
#[inline(always)]
fn eighths_value(isc: i32, d: [u8; 2], y: &BlockQ8K) -> f32 {
    h2f(d) * f32::from_le_bytes(y.d) * (isc as f32 * 0.125)
}

/// `2·s + 1` for a 4-bit (or 3-bit) field `s`.
#[inline(always)]
fn odd(s: u32) -> i32 {
    2 * s as i32 + 1
}

impl KBlock for Iq2Xxs {
    type X = BlockIq2Xxs;
    const MINS: bool = false;
    const PER32: bool = true;
    const C: f32 = 0.125;
    #[inline(always)]
    unsafe fn decode(x: &BlockIq2Xxs) -> Decoded {
        // SAFETY: NEON is enabled in the caller; loads are of whole grid rows.
        unsafe {
            let mut v = [vdupq_n_s8(0); 16];
            let mut sc = [0i32; 16];
            for ib in 0..8 {
                let b = &x.qs[8 * ib..8 * ib + 8];
                let aux = u32le(b, 4);
                let s = odd(aux >> 28);
                sc[2 * ib] = s;
                sc[2 * ib + 1] = s;
                for h in 0..2 {
                    let (l0, l1) = (2 * h, 2 * h + 1);
                    let g = rows2(&IQ2XXS_GRID, b[l0] as usize, b[l1] as usize);
                    v[2 * ib + h] = signed(g, signs8(aux >> (7 * l0)), signs8(aux >> (7 * l1)));
                }
            }
            Decoded { q: v, sc, mn: [0; 16] }
        }
    }
    #[inline(always)]
    fn value(isc: i32, _imn: i32, x: &BlockIq2Xxs, y: &BlockQ8K) -> f32 {
        plain_value(isc, x.d, y)
    }
}

impl KBlock for Iq2Xs {
    type X = BlockIq2Xs;
    const MINS: bool = false;
    const PER32: bool = false;
    const C: f32 = 0.125;
    #[inline(always)]
    unsafe fn decode(x: &BlockIq2Xs) -> Decoded {
        // SAFETY: NEON is enabled in the caller; loads are of whole grid rows.
        unsafe {
            let mut v = [vdupq_n_s8(0); 16];
            let mut sc = [0i32; 16];
            for ib in 0..8 {
                sc[2 * ib] = odd((x.scales[ib] & 15) as u32);
                sc[2 * ib + 1] = odd((x.scales[ib] >> 4) as u32);
                for h in 0..2 {
                    // Each u16: a 9-bit grid index and a 7-bit sign field.
                    let w0 = u16le(&x.qs, 2 * (4 * ib + 2 * h)) as usize;
                    let w1 = u16le(&x.qs, 2 * (4 * ib + 2 * h + 1)) as usize;
                    let g = rows2(&IQ2XS_GRID, w0 & 511, w1 & 511);
                    v[2 * ib + h] = signed(g, signs8((w0 >> 9) as u32), signs8((w1 >> 9) as u32));
                }
            }
            Decoded { q: v, sc, mn: [0; 16] }
        }
    }
    #[inline(always)]
    fn value(isc: i32, _imn: i32, x: &BlockIq2Xs, y: &BlockQ8K) -> f32 {
        plain_value(isc, x.d, y)
    }
}

impl KBlock for Iq2S {
    type X = BlockIq2S;
    const MINS: bool = false;
    const PER32: bool = false;
    const C: f32 = 0.125;
    #[inline(always)]
    unsafe fn decode(x: &BlockIq2S) -> Decoded {
        let (idx, sg) = x.qs.split_at(QK_K / 8);
        // SAFETY: NEON is enabled in the caller; loads are of whole grid rows.
        unsafe {
            let mut v = [vdupq_n_s8(0); 16];
            let mut sc = [0i32; 16];
            for ib in 0..8 {
                sc[2 * ib] = odd((x.scales[ib] & 15) as u32);
                sc[2 * ib + 1] = odd((x.scales[ib] >> 4) as u32);
                let qh = x.qh[ib] as usize;
                // Index l of the sub-block: its low byte and bits 2l..2l+2 of `qh` as bits 8..10.
                let i = |l: usize| idx[4 * ib + l] as usize | ((qh << (8 - 2 * l)) & 0x300);
                for h in 0..2 {
                    let (l0, l1) = (2 * h, 2 * h + 1);
                    let g = rows2(&IQ2S_GRID, i(l0), i(l1));
                    v[2 * ib + h] = signed(g, sg[4 * ib + l0], sg[4 * ib + l1]);
                }
            }
            Decoded { q: v, sc, mn: [0; 16] }
        }
    }
    #[inline(always)]
    fn value(isc: i32, _imn: i32, x: &BlockIq2S, y: &BlockQ8K) -> f32 {
        plain_value(isc, x.d, y)
    }
}

impl KBlock for Iq3Xxs {
    type X = BlockIq3Xxs;
    const MINS: bool = false;
    const PER32: bool = true;
    const C: f32 = 0.25;
    #[inline(always)]
    unsafe fn decode(x: &BlockIq3Xxs) -> Decoded {
        let (idx, sas) = x.qs.split_at(QK_K / 4);
        // SAFETY: NEON is enabled in the caller; loads are of whole grid rows.
        unsafe {
            let mut v = [vdupq_n_s8(0); 16];
            let mut sc = [0i32; 16];
            for ib in 0..8 {
                let aux = u32le(sas, 4 * ib);
                let s = odd(aux >> 28);
                sc[2 * ib] = s;
                sc[2 * ib + 1] = s;
                for h in 0..2 {
                    // Four 4-byte rows: the 8 elements of sign field 2h, then of 2h + 1.
                    let i: [usize; 4] = std::array::from_fn(|k| idx[8 * ib + 4 * h + k] as usize);
                    let g = rows4(&IQ3XXS_GRID, i);
                    let (l0, l1) = (2 * h, 2 * h + 1);
                    v[2 * ib + h] = signed(g, signs8(aux >> (7 * l0)), signs8(aux >> (7 * l1)));
                }
            }
            Decoded { q: v, sc, mn: [0; 16] }
        }
    }
    #[inline(always)]
    fn value(isc: i32, _imn: i32, x: &BlockIq3Xxs, y: &BlockQ8K) -> f32 {
        plain_value(isc, x.d, y)
    }
}

impl KBlock for Iq3S {
    type X = BlockIq3S;
    const MINS: bool = false;
    const PER32: bool = true;
    #[inline(always)]
    unsafe fn decode(x: &BlockIq3S) -> Decoded {
        // SAFETY: NEON is enabled in the caller; loads are of whole grid rows.
        unsafe {
            let mut v = [vdupq_n_s8(0); 16];
            let mut sc = [0i32; 16];
            for ib in 0..8 {
                let s = odd(((x.scales[ib / 2] >> (4 * (ib % 2))) & 15) as u32);
                sc[2 * ib] = s;
                sc[2 * ib + 1] = s;
                let qh = x.qh[ib] as usize;
                for h in 0..2 {
                    // Index k of the sub-block: its low byte and bit k of `qh` as bit 8.
                    let i: [usize; 4] = std::array::from_fn(|j| {
                        let k = 4 * h + j;
                        x.qs[8 * ib + k] as usize | (((qh >> k) & 1) << 8)
                    });
                    let g = rows4(&IQ3S_GRID, i);
                    v[2 * ib + h] = signed(g, x.signs[4 * ib + 2 * h], x.signs[4 * ib + 2 * h + 1]);
                }
            }
            Decoded { q: v, sc, mn: [0; 16] }
        }
    }
    #[inline(always)]
    fn value(isc: i32, _imn: i32, x: &BlockIq3S, y: &BlockQ8K) -> f32 {
        plain_value(isc, x.d, y)
    }
}

impl KBlock for Iq1S {
    type X = BlockIq1S;
    const MINS: bool = false;
    const PER32: bool = true;
    #[inline(always)]
    unsafe fn decode(x: &BlockIq1S) -> Decoded {
        // SAFETY: NEON is enabled in the caller; loads are of whole grid rows.
        unsafe {
            let mut v = [vdupq_n_s8(0); 16];
            let mut sc = [0i32; 16];
            for ib in 0..8 {
                // Three index bits per 8 elements (bits 0..12), the scale (12..15), δ's sign (15).
                let hw = u16le(&x.qh, 2 * ib) as usize;
                let s = odd(((hw >> 12) & 7) as u32);
                sc[2 * ib] = s;
                sc[2 * ib + 1] = s;
                let delta = if hw & 0x8000 != 0 { -1 } else { 1 };
                let i = |l: usize| x.qs[4 * ib + l] as usize | (((hw >> (3 * l)) & 7) << 8);
                for h in 0..2 {
                    let g = rows2(&IQ1S_GRID, i(2 * h), i(2 * h + 1));
                    v[2 * ib + h] = eighths(g, delta, delta);
                }
            }
            Decoded { q: v, sc, mn: [0; 16] }
        }
    }
    #[inline(always)]
    fn value(isc: i32, _imn: i32, x: &BlockIq1S, y: &BlockQ8K) -> f32 {
        eighths_value(isc, x.d, y)
    }
}

impl KBlock for Iq1M {
    type X = BlockIq1M;
    const MINS: bool = false;
    const PER32: bool = false;
    #[inline(always)]
    unsafe fn decode(x: &BlockIq1M) -> Decoded {
        // SAFETY: NEON is enabled in the caller; loads are of whole grid rows.
        unsafe {
            let mut v = [vdupq_n_s8(0); 16];
            let mut sc = [0i32; 16];
            for ib in 0..8 {
                // Scale word ib / 2 holds 3-bit scales for groups 4·(ib/2)..+4 in bits 0, 3, 6, 9.
                let w = u16le(&x.scales, 2 * (ib / 2)) as u32;
                let sh = 6 * (ib % 2);
                sc[2 * ib] = odd((w >> sh) & 7);
                sc[2 * ib + 1] = odd((w >> (sh + 3)) & 7);
                // One nibble per 8 elements: three index bits, then δ's sign.
                let nib = |l: usize| (x.qh[2 * ib + l / 2] >> (4 * (l % 2))) as usize & 15;
                let i = |l: usize| x.qs[4 * ib + l] as usize | ((nib(l) & 7) << 8);
                let delta = |l: usize| if nib(l) & 8 != 0 { -1 } else { 1 };
                for h in 0..2 {
                    let (l0, l1) = (2 * h, 2 * h + 1);
                    let g = rows2(&IQ1S_GRID, i(l0), i(l1));
                    v[2 * ib + h] = eighths(g, delta(l0), delta(l1));
                }
            }
            Decoded { q: v, sc, mn: [0; 16] }
        }
    }
    #[inline(always)]
    fn value(isc: i32, _imn: i32, x: &BlockIq1M, y: &BlockQ8K) -> f32 {
        eighths_value(isc, iq1_m_d_bits(x), y)
    }
}

/// A grid IQ type in ggml's NEON order (the `neon-dotprod`, `neon-i8mm` and `sve` tables): the
/// type's decoder and exact integer sums, folded into each column's running sum as ggml's
/// `ggml_vec_dot_iq*_q8_K` does under `__ARM_NEON` (twins `quant::scalar::iq_neon`). One- and
/// four-column kernels only: ggml has no two-row kernel for these types.
pub(super) struct GgmlGrid<B>(std::marker::PhantomData<B>);

/// ggml's NEON fold of a grid type.
pub(super) trait GridOrder: KBlock {
    /// The factor ggml applies to the row's sum.
    const GGML_C: f32;
    /// The running sum after one decoded block.
    ///
    /// # Safety
    /// NEON must be enabled in the caller, and dotprod when `D` is [`Sdot`].
    unsafe fn ggml_fold<D: Dot>(sum: f32, d: &Decoded, x: &Self::X, y: &BlockQ8K) -> f32;
}

impl<B: GridOrder> KBlock for GgmlGrid<B> {
    type X = B::X;
    const MINS: bool = false;
    const PER32: bool = B::PER32;
    const C: f32 = B::GGML_C;
    const FOLD: bool = true;
    #[inline(always)]
    unsafe fn decode(x: &B::X) -> Decoded {
        // SAFETY: forwarded contract.
        unsafe { B::decode(x) }
    }
    fn value(isc: i32, imn: i32, x: &B::X, y: &BlockQ8K) -> f32 {
        B::value(isc, imn, x, y)
    }
    #[inline(always)]
    unsafe fn fold<D: Dot>(sum: f32, d: &Decoded, x: &B::X, y: &BlockQ8K) -> f32 {
        // SAFETY: forwarded contract.
        unsafe { B::ggml_fold::<D>(sum, d, x, y) }
    }
}

/// IQ2_XXS and IQ3_XXS: per 32-element block the raw integer dot `p` goes in by
/// `fma(float(p), 0.5 + s, acc)`, even blocks into one accumulator and odd ones into the other
/// (`0.5 + s` is half the decoded scale `2s + 1`), then `fma(acc1 + acc2, d_x·d_y, sum)`.
#[inline(always)]
unsafe fn xxs_fold<D: Dot>(sum: f32, d: &Decoded, xd: [u8; 2], y: &BlockQ8K) -> f32 {
    // SAFETY: forwarded contract (no closures here: they would not inherit the caller's target
    // features).
    unsafe {
        let (mut a1, mut a2) = (0f32, 0f32);
        for k in 0..4 {
            let (j1, j2) = (2 * k, 2 * k + 1);
            a1 = block32::<D>(d, y, j1).mul_add(d.sc[2 * j1] as f32 * 0.5, a1);
            a2 = block32::<D>(d, y, j2).mul_add(d.sc[2 * j2] as f32 * 0.5, a2);
        }
        (a1 + a2).mul_add(h2f(xd) * dy(y), sum)
    }
}

/// The raw integer dot (no scale) of 32-element block `j`, as f32.
#[inline(always)]
unsafe fn block32<D: Dot>(d: &Decoded, y: &BlockQ8K, j: usize) -> f32 {
    // SAFETY: checked loads (`lds`) and register arithmetic under NEON (and dotprod for `Sdot`).
    unsafe {
        let acc = D::dot(vdupq_n_s32(0), d.q[2 * j], lds(&y.qs, 32 * j));
        vaddvq_s32(D::dot(acc, d.q[2 * j + 1], lds(&y.qs, 32 * j + 16))) as f32
    }
}

/// IQ2_XS, IQ2_S and IQ3_S: `fma(float(Σ scale·p), d_x·d_y, sum)`.
#[inline(always)]
unsafe fn integer_fold<B: KBlock, D: Dot>(sum: f32, d: &Decoded, xd: [u8; 2], y: &BlockQ8K) -> f32 {
    // SAFETY: forwarded contract.
    let isc = unsafe { vaddvq_s32(scaled::<B, D>(d, y)) };
    (isc as f32).mul_add(h2f(xd) * dy(y), sum)
}

/// The grid part `Σ scale·g·y` of an IQ1 block whose values are `8·g + δ` (`g = (v + 4) >> 3`).
#[inline(always)]
unsafe fn iq1_grid_part<B: KBlock, D: Dot>(d: &Decoded, y: &BlockQ8K) -> i32 {
    // SAFETY: register arithmetic under NEON; `v + 4` stays within −5..=13.
    unsafe {
        let mut g = Decoded { q: d.q, sc: d.sc, mn: d.mn };
        for q in &mut g.q {
            *q = vshrq_n_s8::<3>(vaddq_s8(*q, vdupq_n_s8(4)));
        }
        vaddvq_s32(scaled::<B, D>(&g, y))
    }
}

/// ggml's IQ1 step: `fma(d, fma(float(Δ), 1/8, float(S)), sum)`.
#[inline(always)]
fn iq1_step(sum: f32, d: f32, s: i32, delta: i32) -> f32 {
    d.mul_add((delta as f32).mul_add(0.125, s as f32), sum)
}

impl GridOrder for Iq2Xxs {
    const GGML_C: f32 = 0.25;
    #[inline(always)]
    unsafe fn ggml_fold<D: Dot>(sum: f32, d: &Decoded, x: &BlockIq2Xxs, y: &BlockQ8K) -> f32 {
        // SAFETY: forwarded contract.
        unsafe { xxs_fold::<D>(sum, d, x.d, y) }
    }
}

impl GridOrder for Iq3Xxs {
    const GGML_C: f32 = 0.5;
    #[inline(always)]
    unsafe fn ggml_fold<D: Dot>(sum: f32, d: &Decoded, x: &BlockIq3Xxs, y: &BlockQ8K) -> f32 {
        // SAFETY: forwarded contract.
        unsafe { xxs_fold::<D>(sum, d, x.d, y) }
    }
}

macro_rules! integer_order {
    ($($t:ty, $c:expr);* $(;)?) => {$(
        impl GridOrder for $t {
            const GGML_C: f32 = $c;
            #[inline(always)]
            unsafe fn ggml_fold<D: Dot>(sum: f32, d: &Decoded, x: &Self::X, y: &BlockQ8K) -> f32 {
                // SAFETY: forwarded contract.
                unsafe { integer_fold::<Self, D>(sum, d, x.d, y) }
            }
        }
    )*};
}
integer_order! {
    Iq2Xs, 0.125;
    Iq2S, 0.125;
    Iq3S, 1.0;
}

impl GridOrder for Iq1S {
    const GGML_C: f32 = 1.0;
    /// The delta part from the activations' `bsums`, as ggml takes it.
    #[inline(always)]
    unsafe fn ggml_fold<D: Dot>(sum: f32, d: &Decoded, x: &BlockIq1S, y: &BlockQ8K) -> f32 {
        // SAFETY: forwarded contract.
        let s = unsafe { iq1_grid_part::<Self, D>(d, y) };
        iq1_step(sum, h2f(x.d) * dy(y), s, iq1_s_delta_isum(x, y))
    }
}

impl GridOrder for Iq1M {
    const GGML_C: f32 = 1.0;
    /// The delta part from the activations themselves: `Σ scale·(8g + δ)·y − 8·S`.
    #[inline(always)]
    unsafe fn ggml_fold<D: Dot>(sum: f32, d: &Decoded, x: &BlockIq1M, y: &BlockQ8K) -> f32 {
        // SAFETY: forwarded contract.
        let (isc, s) = unsafe { (vaddvq_s32(scaled::<Self, D>(d, y)), iq1_grid_part::<Self, D>(d, y)) };
        iq1_step(sum, h2f(iq1_m_d_bits(x)) * dy(y), s, isc - 8 * s)
    }
}

/// TQ1_0 and TQ2_0: ggml sums the digits `q ∈ {0, 1, 2}` against the activations and subtracts
/// the Q8_K `bsums`, then `fma(float(that), d_x·d_y, sum)`. The `bsums` of every Q8_K row llamad
/// forms are the exact sums of its quants, so that integer is the decoded `Σ (q − 1)·y` and the fold
/// is [`integer_fold`]'s (the twin, `quant::scalar::iq_neon`, keeps ggml's `bsums` form).
impl GridOrder for Tq1_0 {
    const GGML_C: f32 = 1.0;
    #[inline(always)]
    unsafe fn ggml_fold<D: Dot>(sum: f32, d: &Decoded, x: &BlockTq1_0, y: &BlockQ8K) -> f32 {
        // SAFETY: forwarded contract.
        unsafe { integer_fold::<Self, D>(sum, d, x.d, y) }
    }
}

impl GridOrder for Tq2_0 {
    const GGML_C: f32 = 1.0;
    #[inline(always)]
    unsafe fn ggml_fold<D: Dot>(sum: f32, d: &Decoded, x: &BlockTq2_0, y: &BlockQ8K) -> f32 {
        // SAFETY: forwarded contract.
        unsafe { integer_fold::<Self, D>(sum, d, x.d, y) }
    }
}

/// The leading base-3 digit of each byte `r`, `⌊3r / 256⌋`, minus 1 (TQ1_0's digit of `q` at
/// position n is that of `r = q·3ⁿ mod 256`).
#[inline(always)]
unsafe fn lead_trit(r: uint8x16_t) -> int8x16_t {
    // SAFETY: register arithmetic under NEON.
    unsafe {
        let lo = vmull_u8(vget_low_u8(r), vdup_n_u8(3));
        let hi = vmull_high_u8(r, vdupq_n_u8(3));
        let d = vshrn_high_n_u16::<8>(vshrn_n_u16::<8>(lo), hi);
        vsubq_s8(vreinterpretq_s8_u8(d), vdupq_n_s8(1))
    }
}

impl KBlock for Tq1_0 {
    type X = BlockTq1_0;
    const MINS: bool = false;
    const PER32: bool = true;
    #[inline(always)]
    unsafe fn decode(x: &BlockTq1_0) -> Decoded {
        const POW3: [u8; 5] = [1, 3, 9, 27, 81];
        // SAFETY: checked loads (`ld`) and register arithmetic under NEON.
        unsafe {
            let mut v = [vdupq_n_s8(0); 16];
            // qs[0..32]: digit n of byte m is element 32n + m.
            let head = [ld(&x.qs, 0), ld(&x.qs, 16)];
            // qs[32..48]: digit n of byte m is element 160 + 16n + m.
            let tail = ld(&x.qs, 32);
            for (n, &p) in POW3.iter().enumerate() {
                let p = vdupq_n_u8(p);
                v[2 * n] = lead_trit(vmulq_u8(head[0], p));
                v[2 * n + 1] = lead_trit(vmulq_u8(head[1], p));
                v[10 + n] = lead_trit(vmulq_u8(tail, p));
            }
            // qh: digit n of byte m is element 240 + 4n + m; lane n of the u32s is multiplied by 3ⁿ.
            const MUL: [u8; 16] = [1, 1, 1, 1, 3, 3, 3, 3, 9, 9, 9, 9, 27, 27, 27, 27];
            let h = vreinterpretq_u8_u32(vdupq_n_u32(u32::from_le_bytes(x.qh)));
            v[15] = lead_trit(vmulq_u8(h, vld1q_u8(MUL.as_ptr())));
            Decoded { q: v, sc: [1; 16], mn: [0; 16] }
        }
    }
    #[inline(always)]
    fn value(isc: i32, _imn: i32, x: &BlockTq1_0, y: &BlockQ8K) -> f32 {
        plain_value(isc, x.d, y)
    }
}

impl KBlock for Tq2_0 {
    type X = BlockTq2_0;
    const MINS: bool = false;
    const PER32: bool = true;
    #[inline(always)]
    unsafe fn decode(x: &BlockTq2_0) -> Decoded {
        // SAFETY: checked loads (`ld`) and register arithmetic under NEON.
        unsafe {
            let mut v = [vdupq_n_s8(0); 16];
            // Element 128g + 32l + m is bits 2l..2l+2 of qs[32g + m], minus 1.
            for g in 0..2 {
                for h in 0..2 {
                    let b = ld(&x.qs, 32 * g + 16 * h);
                    for l in 0..4 {
                        let c = vandq_u8(vshlq_u8(b, vdupq_n_s8(-2 * l as i8)), vdupq_n_u8(3));
                        v[8 * g + 2 * l + h] = vsubq_s8(vreinterpretq_s8_u8(c), vdupq_n_s8(1));
                    }
                }
            }
            Decoded { q: v, sc: [1; 16], mn: [0; 16] }
        }
    }
    #[inline(always)]
    fn value(isc: i32, _imn: i32, x: &BlockTq2_0, y: &BlockQ8K) -> f32 {
        plain_value(isc, x.d, y)
    }
}
