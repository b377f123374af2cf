//! NEON dequantizers (`to_f32`) for the quantized types, equal to the reference bit for bit: the
//! weights are decoded as in the dot kernels ([`B32::decode`], [`KBlock::decode`]), widened to f32
//! exactly, and scaled with the reference's float steps in its order
//! (ref: ggml-compute-semantics.md §2.2; `quant::scalar::{legacy, kquants}`).
//! They serve GET_ROWS of quantized embeddings and quantized KV caches.

use std::arch::aarch64::*;

use super::dot::h2f;
use super::kquants::{self, KBlock};
use super::legacy::{self, B32};
use crate::dtype::QK_K;
use crate::quant::blocks::*;
use crate::quant::scalar::dequant_blocks;

/// The reference's `y = q·d (+ m)` of a 32-element format.
pub(super) trait Affine32: B32 {
    /// The scale and, for the formats with an offset, the offset.
    fn affine(x: &Self::X) -> (f32, Option<f32>);
}

/// The reference's `y = q·(d·sc) − dmin·mn` of a 256-element format.
pub(super) trait AffineK: KBlock {
    /// The super-block scale and min scale (the latter unused without mins).
    fn d_dmin(x: &Self::X) -> (f32, f32);
}

/// What follows the multiplication in the reference's formula.
#[derive(Clone, Copy)]
enum Then {
    /// `q·a`.
    Nothing,
    /// `q·a + b` (Q4_1, Q5_1).
    Add(f32),
    /// `q·a − b` (the K-quants with mins).
    Sub(f32),
}

/// Writes 16 signed bytes `q` as `q·a` followed by `then`, as f32 to `out[..16]`.
#[inline(always)]
unsafe fn store16(q: int8x16_t, a: f32, then: Then, out: &mut [f32]) {
    assert!(out.len() >= 16);
    // SAFETY: 16 writable floats (checked); register arithmetic under NEON.
    unsafe {
        let w = [vmovl_s8(vget_low_s8(q)), vmovl_high_s8(q)];
        for h in 0..2 {
            let v = [vmovl_s16(vget_low_s16(w[h])), vmovl_high_s16(w[h])];
            for k in 0..2 {
                let f = vmulq_n_f32(vcvtq_f32_s32(v[k]), a);
                let f = match then {
                    Then::Nothing => f,
                    Then::Add(b) => vaddq_f32(f, vdupq_n_f32(b)),
                    Then::Sub(b) => vsubq_f32(f, vdupq_n_f32(b)),
                };
                vst1q_f32(out.as_mut_ptr().add(8 * h + 4 * k), f);
            }
        }
    }
}

#[target_feature(enable = "neon")]
unsafe fn deq32<B: Affine32>(src: &[u8], dst: &mut [f32]) {
    dequant_blocks(src, dst, QK, |b: &B::X, y| {
        let (d, m) = B::affine(b);
        // SAFETY: NEON is enabled on this fn; `store16` checks the output length.
        unsafe {
            let [lo, hi] = B::decode(b);
            let then = m.map_or(Then::Nothing, Then::Add);
            store16(lo, d, then, &mut y[..16]);
            store16(hi, d, then, &mut y[16..]);
        }
    });
}

#[target_feature(enable = "neon")]
unsafe fn deqk<B: AffineK>(src: &[u8], dst: &mut [f32]) {
    dequant_blocks(src, dst, QK_K, |b: &B::X, y| {
        let (d, dmin) = B::d_dmin(b);
        // SAFETY: NEON is enabled on this fn; `store16` checks the output length.
        unsafe {
            let dec = B::decode(b);
            for g in 0..16 {
                let a = d * dec.sc[g] as f32;
                let then = if B::MINS { Then::Sub(dmin * dec.mn[g] as f32) } else { Then::Nothing };
                store16(dec.q[g], a, then, &mut y[16 * g..]);
            }
        }
    });
}

/// `to_f32` of a 32-element format.
pub(super) fn to_f32_32<B: Affine32>(src: &[u8], dst: &mut [f32]) {
    // SAFETY: installed only after NEON detection (module docs of `aarch64`); `dequant_blocks`
    // checks the lengths.
    unsafe { deq32::<B>(src, dst) }
}

/// `to_f32` of a 256-element format.
pub(super) fn to_f32_k<B: AffineK>(src: &[u8], dst: &mut [f32]) {
    // SAFETY: installed only after NEON detection (module docs of `aarch64`); `dequant_blocks`
    // checks the lengths.
    unsafe { deqk::<B>(src, dst) }
}

impl Affine32 for legacy::Q40 {
    fn affine(x: &BlockQ4_0) -> (f32, Option<f32>) {
        (h2f(x.d), None)
    }
}

impl Affine32 for legacy::Q41 {
    fn affine(x: &BlockQ4_1) -> (f32, Option<f32>) {
        (h2f(x.d), Some(h2f(x.m)))
    }
}

impl Affine32 for legacy::Q50 {
    fn affine(x: &BlockQ5_0) -> (f32, Option<f32>) {
        (h2f(x.d), None)
    }
}

impl Affine32 for legacy::Q51 {
    fn affine(x: &BlockQ5_1) -> (f32, Option<f32>) {
        (h2f(x.d), Some(h2f(x.m)))
    }
}

impl Affine32 for legacy::Q80 {
    fn affine(x: &BlockQ8_0) -> (f32, Option<f32>) {
        (h2f(x.d), None)
    }
}

impl Affine32 for legacy::Iq4Nl {
    fn affine(x: &BlockIq4Nl) -> (f32, Option<f32>) {
        (h2f(x.d), None)
    }
}

impl Affine32 for legacy::Mxfp4 {
    fn affine(x: &BlockMxfp4) -> (f32, Option<f32>) {
        (e8m0_half(x.e), None)
    }
}

impl AffineK for kquants::Q2K {
    fn d_dmin(x: &BlockQ2K) -> (f32, f32) {
        (h2f(x.d), h2f(x.dmin))
    }
}

impl AffineK for kquants::Q3K {
    fn d_dmin(x: &BlockQ3K) -> (f32, f32) {
        (h2f(x.d), 0.0)
    }
}

impl AffineK for kquants::Q4K {
    fn d_dmin(x: &BlockQ4K) -> (f32, f32) {
        (h2f(x.d), h2f(x.dmin))
    }
}

impl AffineK for kquants::Q5K {
    fn d_dmin(x: &BlockQ5K) -> (f32, f32) {
        (h2f(x.d), h2f(x.dmin))
    }
}

impl AffineK for kquants::Q6K {
    fn d_dmin(x: &BlockQ6K) -> (f32, f32) {
        (h2f(x.d), 0.0)
    }
}

impl AffineK for kquants::Iq4Xs {
    fn d_dmin(x: &BlockIq4Xs) -> (f32, f32) {
        (h2f(x.d), 0.0)
    }
}
