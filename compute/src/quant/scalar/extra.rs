//! Dequantization and dot products of the rarer formats: Q1_0, Q2_0, NVFP4 (against Q8_0) and
//! TQ2_0 (against Q8_K). Their quantizers (what CPY and SET_ROWS write) are ggml's reference ones, in
//! `refquant`.
//!
//! ref: ggml-compute-semantics.md §2.2 (Q1_0, Q2_0, NVFP4, TQ2_0) and §2.3 (their vec_dot_types).

use super::{dequant_blocks, dot_blocks};
use crate::dtype::QK_K;
use crate::quant::blocks::*;

/// Q1_0 signs (±1) in element order.
pub(crate) fn q1_0_values(b: &BlockQ1_0) -> [i8; 128] {
    std::array::from_fn(|j| if (b.qs[j / 8] >> (j % 8)) & 1 != 0 { 1 } else { -1 })
}

/// Q2_0 values (q-1, in -1..=2) in element order.
pub(crate) fn q2_0_values(b: &BlockQ2_0) -> [i8; 64] {
    std::array::from_fn(|j| ((b.qs[j / 4] >> (2 * (j % 4))) & 3) as i8 - 1)
}

/// NVFP4 doubled E2M1 values in element order.
pub(crate) fn nvfp4_values(b: &BlockNvfp4) -> [i8; 64] {
    std::array::from_fn(|e| {
        let (s, j) = (e / 16, e % 16);
        let byte = b.qs[s * 8 + (j % 8)];
        let nib = if j < 8 { byte & 0xF } else { byte >> 4 };
        KVALUES_MXFP4[nib as usize]
    })
}

/// TQ2_0 values (-1..=2) in element order (g, l, m).
fn tq2_0_values(b: &BlockTq2_0) -> [i8; QK_K] {
    std::array::from_fn(|e| {
        let (g, l, m) = (e / 128, (e % 128) / 32, e % 32);
        ((b.qs[g * 32 + m] >> (2 * l)) & 3) as i8 - 1
    })
}

/// Q1_0 → f32.
pub fn q1_0_to_f32(src: &[u8], dst: &mut [f32]) {
    dequant_blocks(src, dst, 128, |b: &BlockQ1_0, y| {
        let d = f16le(b.d);
        for (o, v) in y.iter_mut().zip(q1_0_values(b)) {
            *o = v as f32 * d;
        }
    });
}

/// Q2_0 → f32.
pub fn q2_0_to_f32(src: &[u8], dst: &mut [f32]) {
    dequant_blocks(src, dst, 64, |b: &BlockQ2_0, y| {
        let d = f16le(b.d);
        for (o, v) in y.iter_mut().zip(q2_0_values(b)) {
            *o = v as f32 * d;
        }
    });
}

/// NVFP4 → f32.
pub fn nvfp4_to_f32(src: &[u8], dst: &mut [f32]) {
    dequant_blocks(src, dst, 64, |b: &BlockNvfp4, y| {
        for (e, (o, v)) in y.iter_mut().zip(nvfp4_values(b)).enumerate() {
            *o = v as f32 * ue4m3_half(b.d[e / 16]);
        }
    });
}

/// TQ2_0 → f32.
pub fn tq2_0_to_f32(src: &[u8], dst: &mut [f32]) {
    dequant_blocks(src, dst, QK_K, |b: &BlockTq2_0, y| {
        let d = f16le(b.d);
        for (o, v) in y.iter_mut().zip(tq2_0_values(b)) {
            *o = v as f32 * d;
        }
    });
}

/// Σ w·a over 32 elements starting at `off` of `w`.
#[inline(always)]
fn isum32(w: &[i8], off: usize, a: &[i8; 32]) -> i32 {
    w[off..off + 32].iter().zip(a).map(|(&w, &a)| w as i32 * a as i32).sum()
}

/// Q1_0 · Q8_0 (one Q1_0 block spans four Q8_0 blocks).
pub fn vec_dot_q1_0_q8_0(n: usize, x: &[u8], y: &[u8]) -> f32 {
    dot_blocks(n, x, y, 128, QK, |bx: &BlockQ1_0, by: &[BlockQ8_0]| {
        let w = q1_0_values(bx);
        let s: f32 = by.iter().enumerate().map(|(k, b)| f16le(b.d) * isum32(&w, 32 * k, &b.qs) as f32).sum();
        f16le(bx.d) * s
    })
}

/// Q2_0 · Q8_0 (one Q2_0 block spans two Q8_0 blocks).
pub fn vec_dot_q2_0_q8_0(n: usize, x: &[u8], y: &[u8]) -> f32 {
    dot_blocks(n, x, y, 64, QK, |bx: &BlockQ2_0, by: &[BlockQ8_0]| {
        let w = q2_0_values(bx);
        let s: f32 = by.iter().enumerate().map(|(k, b)| f16le(b.d) * isum32(&w, 32 * k, &b.qs) as f32).sum();
        f16le(bx.d) * s
    })
}

/// NVFP4 · Q8_0 (one NVFP4 block spans two Q8_0 blocks, with one scale per 16 elements).
pub fn vec_dot_nvfp4_q8_0(n: usize, x: &[u8], y: &[u8]) -> f32 {
    dot_blocks(n, x, y, 64, QK, |bx: &BlockNvfp4, by: &[BlockQ8_0]| {
        let w = nvfp4_values(bx);
        let mut sum = 0.0f32;
        for s in 0..4 {
            let b = &by[s / 2];
            let a = &b.qs[(s % 2) * 16..(s % 2) * 16 + 16];
            let i: i32 = w[s * 16..s * 16 + 16].iter().zip(a).map(|(&w, &a)| w as i32 * a as i32).sum();
            sum += f16le(b.d) * ue4m3_half(bx.d[s]) * i as f32;
        }
        sum
    })
}

/// TQ2_0 · Q8_K.
pub fn vec_dot_tq2_0_q8_k(n: usize, x: &[u8], y: &[u8]) -> f32 {
    dot_blocks(n, x, y, QK_K, QK_K, |bx: &BlockTq2_0, by: &[BlockQ8K]| {
        let w = tq2_0_values(bx);
        let i: i32 = w.iter().zip(&by[0].qs).map(|(&w, &a)| w as i32 * a as i32).sum();
        f16le(bx.d) * f32::from_le_bytes(by[0].d) * i as f32
    })
}
