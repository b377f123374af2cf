//! The 32-element formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, IQ4_NL and MXFP4.
//!
//! ref: ggml-compute-semantics.md §2.2 (layouts and dequantization) and §2.3 (activation
//! quantizers and dot products). The weight quantizers are ggml's simple reference ones.

use super::{dequant_blocks, dot_blocks, quant_blocks};
use crate::quant::blocks::*;

const H: usize = QK / 2;

/// The signed value with the largest magnitude (the first one on ties) and that magnitude.
#[inline(always)]
pub(crate) fn signed_absmax(x: &[f32]) -> (f32, f32) {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    (max, amax)
}

/// The 5-bit values of a Q5 block: low nibbles from `qs`, fifth bits from `qh`.
#[inline(always)]
fn q5_values(qs: &[u8; H], qh: [u8; 4]) -> [u8; QK] {
    let h = u32::from_le_bytes(qh);
    let mut v = [0u8; QK];
    for j in 0..H {
        v[j] = (qs[j] & 0xF) | ((((h >> j) & 1) as u8) << 4);
        v[j + H] = (qs[j] >> 4) | ((((h >> (j + H)) & 1) as u8) << 4);
    }
    v
}

/// Packs 32 values below 32 into Q5 nibbles and fifth bits.
#[inline(always)]
fn q5_pack(v: &[u8; QK]) -> ([u8; H], [u8; 4]) {
    let mut qs = [0u8; H];
    let mut h = 0u32;
    for j in 0..H {
        qs[j] = (v[j] & 0xF) | ((v[j + H] & 0xF) << 4);
        h |= (((v[j] >> 4) & 1) as u32) << j;
        h |= (((v[j + H] >> 4) & 1) as u32) << (j + H);
    }
    (qs, h.to_le_bytes())
}

/// The 32 nibbles of a Q4-style block, in element order.
#[inline(always)]
fn nibbles(qs: &[u8; H]) -> [u8; QK] {
    let mut v = [0u8; QK];
    for j in 0..H {
        v[j] = qs[j] & 0xF;
        v[j + H] = qs[j] >> 4;
    }
    v
}

/// Packs 32 nibbles (element order) into 16 bytes.
#[inline(always)]
fn pack_nibbles(v: &[u8; QK]) -> [u8; H] {
    std::array::from_fn(|j| (v[j] & 0xF) | ((v[j + H] & 0xF) << 4))
}

// ---- dequantization ----

/// Q4_0 → f32.
pub fn q4_0_to_f32(src: &[u8], dst: &mut [f32]) {
    dequant_blocks(src, dst, QK, |b: &BlockQ4_0, y| {
        let d = f16le(b.d);
        for (o, q) in y.iter_mut().zip(nibbles(&b.qs)) {
            *o = (q as i32 - 8) as f32 * d;
        }
    });
}

/// Q4_1 → f32.
pub fn q4_1_to_f32(src: &[u8], dst: &mut [f32]) {
    dequant_blocks(src, dst, QK, |b: &BlockQ4_1, y| {
        let (d, m) = (f16le(b.d), f16le(b.m));
        for (o, q) in y.iter_mut().zip(nibbles(&b.qs)) {
            *o = q as f32 * d + m;
        }
    });
}

/// Q5_0 → f32.
pub fn q5_0_to_f32(src: &[u8], dst: &mut [f32]) {
    dequant_blocks(src, dst, QK, |b: &BlockQ5_0, y| {
        let d = f16le(b.d);
        for (o, q) in y.iter_mut().zip(q5_values(&b.qs, b.qh)) {
            *o = (q as i32 - 16) as f32 * d;
        }
    });
}

/// Q5_1 → f32.
pub fn q5_1_to_f32(src: &[u8], dst: &mut [f32]) {
    dequant_blocks(src, dst, QK, |b: &BlockQ5_1, y| {
        let (d, m) = (f16le(b.d), f16le(b.m));
        for (o, q) in y.iter_mut().zip(q5_values(&b.qs, b.qh)) {
            *o = q as f32 * d + m;
        }
    });
}

/// Q8_0 → f32.
pub fn q8_0_to_f32(src: &[u8], dst: &mut [f32]) {
    dequant_blocks(src, dst, QK, |b: &BlockQ8_0, y| {
        let d = f16le(b.d);
        for (o, &q) in y.iter_mut().zip(&b.qs) {
            *o = q as f32 * d;
        }
    });
}

/// Q8_1 → f32 (the sum field is not needed).
pub fn q8_1_to_f32(src: &[u8], dst: &mut [f32]) {
    dequant_blocks(src, dst, QK, |b: &BlockQ8_1, y| {
        let d = f16le(b.d);
        for (o, &q) in y.iter_mut().zip(&b.qs) {
            *o = q as f32 * d;
        }
    });
}

/// IQ4_NL → f32.
pub fn iq4_nl_to_f32(src: &[u8], dst: &mut [f32]) {
    dequant_blocks(src, dst, QK, |b: &BlockIq4Nl, y| {
        let d = f16le(b.d);
        for (o, q) in y.iter_mut().zip(nibbles(&b.qs)) {
            *o = KVALUES_IQ4NL[q as usize] as f32 * d;
        }
    });
}

/// MXFP4 → f32.
pub fn mxfp4_to_f32(src: &[u8], dst: &mut [f32]) {
    dequant_blocks(src, dst, QK, |b: &BlockMxfp4, y| {
        let d = e8m0_half(b.e);
        for (o, q) in y.iter_mut().zip(nibbles(&b.qs)) {
            *o = KVALUES_MXFP4[q as usize] as f32 * d;
        }
    });
}

// ---- quantization ----

/// Q8_0 quants of one block with ggml's reference rounding: `d = amax/127`, `id = 1/d`,
/// `q = roundf(x*id)` (half away from zero). Returns the unrounded `d` (ref: §2.3 Q8_0).
#[inline(always)]
pub(crate) fn q8_quants(x: &[f32], qs: &mut [i8; QK]) -> f32 {
    let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    for (q, &v) in qs.iter_mut().zip(x) {
        *q = (v * id).round() as i8;
    }
    d
}

/// f32 → Q8_0 (the activation and weight quantizer; ref: ggml-compute-semantics.md §2.3).
pub fn q8_0_from_f32(src: &[f32], dst: &mut [u8]) {
    quant_blocks(src, dst, QK, |x, b: &mut BlockQ8_0| {
        let d = q8_quants(x, &mut b.qs);
        b.d = to_f16le(d);
    });
}

/// f32 → Q8_1: Q8_0 plus `s = f16(d * Σ qs)` with the unrounded `d` (ref: §2.3 Q8_1).
pub fn q8_1_from_f32(src: &[f32], dst: &mut [u8]) {
    quant_blocks(src, dst, QK, |x, b: &mut BlockQ8_1| {
        let d = q8_quants(x, &mut b.qs);
        let sum: i32 = b.qs.iter().map(|&q| q as i32).sum();
        b.d = to_f16le(d);
        b.s = to_f16le(sum as f32 * d);
    });
}

/// Q8_0 quants of one block with ggml's x86 (AVX/AVX2) rounding: `id = 127/amax` (0 when amax is 0)
/// and `q = x*id` rounded half to even; `d = amax/127`. The SIMD quantizers on x86 compute exactly this,
/// so that activations quantize as a llama.cpp master's own x86 CPU backend does. Returns the unrounded `d`.
#[inline(always)]
pub(crate) fn q8_quants_x86(x: &[f32], qs: &mut [i8; QK]) -> f32 {
    let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    for (q, &v) in qs.iter_mut().zip(x) {
        *q = (v * id).round_ties_even() as i8;
    }
    amax / 127.0
}

/// f32 → Q8_0 with ggml's x86 rounding ([`q8_quants_x86`]): the scalar twin of the x86 SIMD quantizer.
pub fn q8_0_from_f32_x86(src: &[f32], dst: &mut [u8]) {
    quant_blocks(src, dst, QK, |x, b: &mut BlockQ8_0| {
        let d = q8_quants_x86(x, &mut b.qs);
        b.d = to_f16le(d);
    });
}

/// f32 → Q8_1 with ggml's x86 rounding: the scalar twin of the x86 SIMD quantizer.
pub fn q8_1_from_f32_x86(src: &[f32], dst: &mut [u8]) {
    quant_blocks(src, dst, QK, |x, b: &mut BlockQ8_1| {
        let d = q8_quants_x86(x, &mut b.qs);
        let sum: i32 = b.qs.iter().map(|&q| q as i32).sum();
        b.d = to_f16le(d);
        b.s = to_f16le(sum as f32 * d);
    });
}

/// Symmetric 4/5-bit quants: `d = max / -half` (max = signed largest magnitude),
/// `q = min(2*half-1, trunc(x/d + half + 0.5))`. Returns the unrounded `d`.
#[inline(always)]
fn sym_quants(x: &[f32], half: f32, out: &mut [u8; QK]) -> f32 {
    let (max, _) = signed_absmax(x);
    let d = max / -half;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let top = (2.0 * half - 1.0) as u8;
    for (o, &v) in out.iter_mut().zip(x) {
        *o = ((v * id + half + 0.5) as u8).min(top);
    }
    d
}

/// Asymmetric 4/5-bit quants: `d = (max-min)/top`, `q = min(top, trunc((x-min)/d + 0.5))`.
/// Returns `(d, min)`.
#[inline(always)]
fn asym_quants(x: &[f32], top: u8, out: &mut [u8; QK]) -> (f32, f32) {
    let min = x.iter().fold(f32::MAX, |a, &v| a.min(v));
    let max = x.iter().fold(-f32::MAX, |a, &v| a.max(v));
    let d = (max - min) / top as f32;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    for (o, &v) in out.iter_mut().zip(x) {
        *o = (((v - min) * id + 0.5) as u8).min(top);
    }
    (d, min)
}

/// f32 → Q4_0 (ggml's reference quantizer).
pub fn q4_0_from_f32(src: &[f32], dst: &mut [u8]) {
    quant_blocks(src, dst, QK, |x, b: &mut BlockQ4_0| {
        let mut q = [0u8; QK];
        b.d = to_f16le(sym_quants(x, 8.0, &mut q));
        b.qs = pack_nibbles(&q);
    });
}

/// f32 → Q4_1 (ggml's reference quantizer).
pub fn q4_1_from_f32(src: &[f32], dst: &mut [u8]) {
    quant_blocks(src, dst, QK, |x, b: &mut BlockQ4_1| {
        let mut q = [0u8; QK];
        let (d, m) = asym_quants(x, 15, &mut q);
        b.d = to_f16le(d);
        b.m = to_f16le(m);
        b.qs = pack_nibbles(&q);
    });
}

/// f32 → Q5_0 (ggml's reference quantizer).
pub fn q5_0_from_f32(src: &[f32], dst: &mut [u8]) {
    quant_blocks(src, dst, QK, |x, b: &mut BlockQ5_0| {
        let mut q = [0u8; QK];
        b.d = to_f16le(sym_quants(x, 16.0, &mut q));
        (b.qs, b.qh) = q5_pack(&q);
    });
}

/// f32 → Q5_1 (ggml's reference quantizer).
pub fn q5_1_from_f32(src: &[f32], dst: &mut [u8]) {
    quant_blocks(src, dst, QK, |x, b: &mut BlockQ5_1| {
        let mut q = [0u8; QK];
        let (d, m) = asym_quants(x, 31, &mut q);
        b.d = to_f16le(d);
        b.m = to_f16le(m);
        (b.qs, b.qh) = q5_pack(&q);
    });
}

// ---- dot products (ref: ggml-compute-semantics.md §2.3) ----

/// Σ a[j]·b[j] over one block as i32.
#[inline(always)]
fn idot(a: &[i32; QK], b: &[i8; QK]) -> i32 {
    a.iter().zip(b).map(|(&a, &b)| a * b as i32).sum()
}

/// Q4_0 · Q8_0.
pub fn vec_dot_q4_0_q8_0(n: usize, x: &[u8], y: &[u8]) -> f32 {
    dot_blocks(n, x, y, QK, QK, |bx: &BlockQ4_0, by: &[BlockQ8_0]| {
        let w = nibbles(&bx.qs).map(|q| q as i32 - 8);
        idot(&w, &by[0].qs) as f32 * f16le(bx.d) * f16le(by[0].d)
    })
}

/// Q4_1 · Q8_1.
pub fn vec_dot_q4_1_q8_1(n: usize, x: &[u8], y: &[u8]) -> f32 {
    dot_blocks(n, x, y, QK, QK, |bx: &BlockQ4_1, by: &[BlockQ8_1]| {
        let w = nibbles(&bx.qs).map(|q| q as i32);
        idot(&w, &by[0].qs) as f32 * (f16le(bx.d) * f16le(by[0].d)) + f16le(bx.m) * f16le(by[0].s)
    })
}

/// Q5_0 · Q8_0.
pub fn vec_dot_q5_0_q8_0(n: usize, x: &[u8], y: &[u8]) -> f32 {
    dot_blocks(n, x, y, QK, QK, |bx: &BlockQ5_0, by: &[BlockQ8_0]| {
        let w = q5_values(&bx.qs, bx.qh).map(|q| q as i32 - 16);
        idot(&w, &by[0].qs) as f32 * f16le(bx.d) * f16le(by[0].d)
    })
}

/// Q5_1 · Q8_1.
pub fn vec_dot_q5_1_q8_1(n: usize, x: &[u8], y: &[u8]) -> f32 {
    dot_blocks(n, x, y, QK, QK, |bx: &BlockQ5_1, by: &[BlockQ8_1]| {
        let w = q5_values(&bx.qs, bx.qh).map(|q| q as i32);
        idot(&w, &by[0].qs) as f32 * (f16le(bx.d) * f16le(by[0].d)) + f16le(bx.m) * f16le(by[0].s)
    })
}

/// Q8_0 · Q8_0.
pub fn vec_dot_q8_0_q8_0(n: usize, x: &[u8], y: &[u8]) -> f32 {
    dot_blocks(n, x, y, QK, QK, |bx: &BlockQ8_0, by: &[BlockQ8_0]| {
        let w = bx.qs.map(|q| q as i32);
        idot(&w, &by[0].qs) as f32 * f16le(bx.d) * f16le(by[0].d)
    })
}

/// IQ4_NL · Q8_0.
pub fn vec_dot_iq4_nl_q8_0(n: usize, x: &[u8], y: &[u8]) -> f32 {
    dot_blocks(n, x, y, QK, QK, |bx: &BlockIq4Nl, by: &[BlockQ8_0]| {
        let w = nibbles(&bx.qs).map(|q| KVALUES_IQ4NL[q as usize] as i32);
        idot(&w, &by[0].qs) as f32 * f16le(bx.d) * f16le(by[0].d)
    })
}

/// MXFP4 · Q8_0.
pub fn vec_dot_mxfp4_q8_0(n: usize, x: &[u8], y: &[u8]) -> f32 {
    dot_blocks(n, x, y, QK, QK, |bx: &BlockMxfp4, by: &[BlockQ8_0]| {
        let w = nibbles(&bx.qs).map(|q| KVALUES_MXFP4[q as usize] as i32);
        idot(&w, &by[0].qs) as f32 * e8m0_half(bx.e) * f16le(by[0].d)
    })
}
