//! NEON activation quantizers Q8_0, Q8_1 and Q8_K, rounding exactly as the scalar reference
//! (ref: ggml-compute-semantics.md §2.3): `fcvtas` is `roundf` (ties away from zero) for
//! Q8_0/Q8_1 and `fcvtns` is round-half-to-even for Q8_K, applied to the same f32 products.

use std::arch::aarch64::*;

use crate::dtype::QK_K;
use crate::quant::blocks::*;
use crate::quant::scalar::{q8k_block, q8k_bsums, quant_blocks};

/// Largest |x| of 8·k values, skipping NaN as the reference's `f32::max` does (`fmaxnm`).
#[inline(always)]
unsafe fn amax(x: &[f32]) -> f32 {
    // SAFETY: loads 4 floats at multiples of 4 below x.len(); register arithmetic.
    unsafe {
        let mut m = vdupq_n_f32(0.0);
        for i in (0..x.len() / 4 * 4).step_by(4) {
            m = vmaxnmq_f32(m, vabsq_f32(vld1q_f32(x.as_ptr().add(i))));
        }
        vmaxnmvq_f32(m)
    }
}

/// Narrows 16 i32 (four vectors) to 16 saturated i8 and stores them at `out`.
#[inline(always)]
unsafe fn store16(v: [int32x4_t; 4], out: &mut [i8]) {
    assert!(out.len() >= 16);
    // SAFETY: 16 writable bytes (checked); register arithmetic.
    unsafe {
        let a = vcombine_s16(vqmovn_s32(v[0]), vqmovn_s32(v[1]));
        let b = vcombine_s16(vqmovn_s32(v[2]), vqmovn_s32(v[3]));
        vst1q_s8(out.as_mut_ptr(), vcombine_s8(vqmovn_s16(a), vqmovn_s16(b)));
    }
}

#[target_feature(enable = "neon")]
unsafe fn q8_block(x: &[f32], qs: &mut [i8; 32]) -> f32 {
    assert_eq!(x.len(), 32);
    // SAFETY: 32 readable floats (asserted); register arithmetic.
    unsafe {
        let d = amax(x) / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        for h in 0..2 {
            let v: [int32x4_t; 4] = std::array::from_fn(|k| {
                vcvtaq_s32_f32(vmulq_n_f32(vld1q_f32(x.as_ptr().add(16 * h + 4 * k)), id))
            });
            store16(v, &mut qs[16 * h..]);
        }
        d
    }
}

/// f32 → Q8_0.
pub(super) fn q8_0_from_f32(src: &[f32], dst: &mut [u8]) {
    quant_blocks(src, dst, QK, |x, b: &mut BlockQ8_0| {
        // SAFETY: installed only after NEON detection (module docs of `aarch64`).
        let d = unsafe { q8_block(x, &mut b.qs) };
        b.d = to_f16le(d);
    });
}

/// f32 → Q8_1.
pub(super) fn q8_1_from_f32(src: &[f32], dst: &mut [u8]) {
    quant_blocks(src, dst, QK, |x, b: &mut BlockQ8_1| {
        // SAFETY: installed only after NEON detection (module docs of `aarch64`).
        let d = unsafe { q8_block(x, &mut b.qs) };
        let sum: i32 = b.qs.iter().map(|&q| q as i32).sum();
        b.d = to_f16le(d);
        b.s = to_f16le(sum as f32 * d);
    });
}

#[target_feature(enable = "neon")]
unsafe fn q8k_simd(x: &[f32], b: &mut BlockQ8K) {
    assert_eq!(x.len(), QK_K);
    // SAFETY: 256 readable floats (asserted); register arithmetic.
    unsafe {
        let a = amax(x);
        if a == 0.0 || a.is_nan() {
            return q8k_block(x, b);
        }
        // The signed value of the first element of largest magnitude (ref: §2.3 Q8_K).
        let max = x.iter().copied().find(|v| v.abs() == a).unwrap_or(a);
        let iscale = -127.0 / max;
        let top = vdupq_n_s32(127);
        for c in 0..QK_K / 16 {
            let v: [int32x4_t; 4] = std::array::from_fn(|k| {
                let p = vmulq_n_f32(vld1q_f32(x.as_ptr().add(16 * c + 4 * k)), iscale);
                vminq_s32(vcvtnq_s32_f32(p), top)
            });
            store16(v, &mut b.qs[16 * c..]);
        }
        q8k_bsums(b);
        b.d = (1.0 / iscale).to_le_bytes();
    }
}

/// f32 → Q8_K.
pub(super) fn q8_k_from_f32(src: &[f32], dst: &mut [u8]) {
    quant_blocks(src, dst, QK_K, |x, b: &mut BlockQ8K| {
        // SAFETY: installed only after NEON detection (module docs of `aarch64`).
        unsafe { q8k_simd(x, b) }
    });
}
