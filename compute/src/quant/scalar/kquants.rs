//! K-quants (Q2_K … Q6_K), their Q8_K activation partner, and IQ4_XS: dequantization, the Q8_K
//! quantizer and the dot products against Q8_K.
//!
//! ref: ggml-compute-semantics.md §2.2 (layouts) and §2.3 (Q8_K and dot products). Each block is
//! first unpacked to its integer quants in element order (the `*_quants` functions), which keeps
//! the bit placement in one place per type; the weight quantizers in `kquantize` are their inverses.

use super::{dequant_blocks, dot_blocks, quant_blocks};
use crate::dtype::QK_K;
use crate::quant::blocks::*;

/// Q2_K quants (0..=3) in element order.
pub fn q2k_quants(b: &BlockQ2K) -> [u8; QK_K] {
    let mut q = [0u8; QK_K];
    for n in 0..2 {
        let qs = &b.qs[n * 32..n * 32 + 32];
        for j in 0..4 {
            for l in 0..16 {
                q[n * 128 + j * 32 + l] = (qs[l] >> (2 * j)) & 3;
                q[n * 128 + j * 32 + 16 + l] = (qs[l + 16] >> (2 * j)) & 3;
            }
        }
    }
    q
}

/// Q3_K quants (-4..=3) in element order.
pub fn q3k_quants(b: &BlockQ3K) -> [i8; QK_K] {
    let mut q = [0i8; QK_K];
    for n in 0..2 {
        let qs = &b.qs[n * 32..n * 32 + 32];
        for j in 0..4 {
            let bit = 1u8 << (n * 4 + j);
            for l in 0..32 {
                let low = ((qs[l] >> (2 * j)) & 3) as i8;
                let hi = if b.hmask[l] & bit != 0 { 0 } else { 4 };
                // l < 16 and l >= 16 cover the two 16-element sub-blocks of this j.
                q[n * 128 + j * 32 + l] = low - hi;
            }
        }
    }
    q
}

/// Q4_K quants (0..=15) in element order.
pub fn q4k_quants(b: &BlockQ4K) -> [u8; QK_K] {
    let mut q = [0u8; QK_K];
    for c in 0..4 {
        for l in 0..32 {
            let v = b.qs[c * 32 + l];
            q[c * 64 + l] = v & 0xF;
            q[c * 64 + 32 + l] = v >> 4;
        }
    }
    q
}

/// Q5_K quants (0..=31) in element order.
pub fn q5k_quants(b: &BlockQ5K) -> [u8; QK_K] {
    let mut q = [0u8; QK_K];
    for c in 0..4 {
        for l in 0..32 {
            let v = b.qs[c * 32 + l];
            let h = b.qh[l];
            q[c * 64 + l] = (v & 0xF) | (((h >> (2 * c)) & 1) << 4);
            q[c * 64 + 32 + l] = (v >> 4) | (((h >> (2 * c + 1)) & 1) << 4);
        }
    }
    q
}

/// Q6_K quants (-32..=31) in element order.
pub fn q6k_quants(b: &BlockQ6K) -> [i8; QK_K] {
    let mut q = [0i8; QK_K];
    for n in 0..2 {
        let (ql, qh) = (&b.ql[n * 64..n * 64 + 64], &b.qh[n * 32..n * 32 + 32]);
        for l in 0..32 {
            let e = n * 128 + l;
            q[e] = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i8 - 32;
            q[e + 32] = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
            q[e + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
            q[e + 96] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
        }
    }
    q
}

/// IQ4_XS codebook indices (0..=15) in element order.
pub fn iq4xs_indices(b: &BlockIq4Xs) -> [u8; QK_K] {
    let mut q = [0u8; QK_K];
    for ib in 0..8 {
        for j in 0..16 {
            let v = b.qs[ib * 16 + j];
            q[ib * 32 + j] = v & 0xF;
            q[ib * 32 + 16 + j] = v >> 4;
        }
    }
    q
}

/// The 8 (scale, min) pairs of a Q4_K / Q5_K block.
#[inline(always)]
pub fn k4_scales(s: &[u8; 12]) -> [(u8, u8); 8] {
    std::array::from_fn(|j| scale_min_k4(j, s))
}

// ---- dequantization ----

/// Q2_K → f32.
pub fn q2_k_to_f32(src: &[u8], dst: &mut [f32]) {
    dequant_blocks(src, dst, QK_K, |b: &BlockQ2K, y| {
        let (d, dmin) = (f16le(b.d), f16le(b.dmin));
        let q = q2k_quants(b);
        for (i, o) in y.iter_mut().enumerate() {
            let sc = b.scales[i / 16];
            *o = d * (sc & 0xF) as f32 * q[i] as f32 - dmin * (sc >> 4) as f32;
        }
    });
}

/// Q3_K → f32.
pub fn q3_k_to_f32(src: &[u8], dst: &mut [f32]) {
    dequant_blocks(src, dst, QK_K, |b: &BlockQ3K, y| {
        let d = f16le(b.d);
        let (q, sc) = (q3k_quants(b), q3k_scales(&b.scales));
        for (i, o) in y.iter_mut().enumerate() {
            *o = d * sc[i / 16] as f32 * q[i] as f32;
        }
    });
}

/// Q4_K → f32.
pub fn q4_k_to_f32(src: &[u8], dst: &mut [f32]) {
    dequant_blocks(src, dst, QK_K, |b: &BlockQ4K, y| {
        let (d, dmin) = (f16le(b.d), f16le(b.dmin));
        let (q, sm) = (q4k_quants(b), k4_scales(&b.scales));
        for (i, o) in y.iter_mut().enumerate() {
            let (sc, mn) = sm[i / 32];
            *o = d * sc as f32 * q[i] as f32 - dmin * mn as f32;
        }
    });
}

/// Q5_K → f32.
pub fn q5_k_to_f32(src: &[u8], dst: &mut [f32]) {
    dequant_blocks(src, dst, QK_K, |b: &BlockQ5K, y| {
        let (d, dmin) = (f16le(b.d), f16le(b.dmin));
        let (q, sm) = (q5k_quants(b), k4_scales(&b.scales));
        for (i, o) in y.iter_mut().enumerate() {
            let (sc, mn) = sm[i / 32];
            *o = d * sc as f32 * q[i] as f32 - dmin * mn as f32;
        }
    });
}

/// Q6_K → f32.
pub fn q6_k_to_f32(src: &[u8], dst: &mut [f32]) {
    dequant_blocks(src, dst, QK_K, |b: &BlockQ6K, y| {
        let d = f16le(b.d);
        let q = q6k_quants(b);
        for (i, o) in y.iter_mut().enumerate() {
            *o = d * b.scales[i / 16] as f32 * q[i] as f32;
        }
    });
}

/// Q8_K → f32.
pub fn q8_k_to_f32(src: &[u8], dst: &mut [f32]) {
    dequant_blocks(src, dst, QK_K, |b: &BlockQ8K, y| {
        let d = f32::from_le_bytes(b.d);
        for (o, &q) in y.iter_mut().zip(&b.qs) {
            *o = d * q as f32;
        }
    });
}

/// IQ4_XS → f32.
pub fn iq4_xs_to_f32(src: &[u8], dst: &mut [f32]) {
    dequant_blocks(src, dst, QK_K, |b: &BlockIq4Xs, y| {
        let d = f16le(b.d);
        let q = iq4xs_indices(b);
        for (i, o) in y.iter_mut().enumerate() {
            let dl = d * (iq4xs_scale(b, i / 32) - 32) as f32;
            *o = dl * KVALUES_IQ4NL[q[i] as usize] as f32;
        }
    });
}

// ---- the Q8_K activation quantizer ----

/// Quantizes 256 values to one Q8_K block exactly as ggml's reference (ref: §2.3 Q8_K):
/// `iscale = -127/max`, `q = min(127, round_half_even(iscale*x))`, `d = 1/iscale` as f32.
pub fn q8k_block(x: &[f32], b: &mut BlockQ8K) {
    let mut amax = 0.0f32;
    let mut max = 0.0f32;
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax == 0.0 {
        *b = bytemuck::Zeroable::zeroed();
        return;
    }
    let iscale = -127.0 / max;
    for (q, &v) in b.qs.iter_mut().zip(x) {
        *q = ((iscale * v).round_ties_even() as i32).min(127) as i8;
    }
    q8k_bsums(b);
    b.d = (1.0 / iscale).to_le_bytes();
}

/// Fills `bsums` from `qs`.
#[inline(always)]
pub fn q8k_bsums(b: &mut BlockQ8K) {
    for g in 0..QK_K / 16 {
        let s: i32 = b.qs[g * 16..g * 16 + 16].iter().map(|&q| q as i32).sum();
        b.bsums[g] = (s as i16).to_le_bytes();
    }
}

/// f32 → Q8_K.
pub fn q8_k_from_f32(src: &[f32], dst: &mut [u8]) {
    quant_blocks(src, dst, QK_K, q8k_block);
}

// ---- dot products against Q8_K (ref: ggml-compute-semantics.md §2.3) ----

#[inline(always)]
fn q8k_d(b: &BlockQ8K) -> f32 {
    f32::from_le_bytes(b.d)
}

#[inline(always)]
fn bsum(b: &BlockQ8K, g: usize) -> i32 {
    i16::from_le_bytes(b.bsums[g]) as i32
}

/// Σ w[i]·a[i] for i in `range`.
#[inline(always)]
fn isum<W: Copy + Into<i32>>(w: &[W], a: &[i8], range: std::ops::Range<usize>) -> i32 {
    w[range.clone()].iter().zip(&a[range]).map(|(&w, &a)| w.into() * a as i32).sum()
}

/// The exact integer sums of one Q2_K super-block against Q8_K: `(Σ scale·(q·y), Σ min·bsum)`.
pub fn q2k_ints(bx: &BlockQ2K, by: &BlockQ8K) -> (i32, i32) {
    let q = q2k_quants(bx);
    let (mut isc, mut imn) = (0i32, 0i32);
    for g in 0..16 {
        let sc = bx.scales[g];
        isc += (sc & 0xF) as i32 * isum(&q, &by.qs, g * 16..g * 16 + 16);
        imn += (sc >> 4) as i32 * bsum(by, g);
    }
    (isc, imn)
}

/// Q2_K · Q8_K.
pub fn vec_dot_q2_k_q8_k(n: usize, x: &[u8], y: &[u8]) -> f32 {
    dot_blocks(n, x, y, QK_K, QK_K, |bx: &BlockQ2K, by: &[BlockQ8K]| {
        let by = &by[0];
        let (isc, imn) = q2k_ints(bx, by);
        let dy = q8k_d(by);
        dy * f16le(bx.d) * isc as f32 - dy * f16le(bx.dmin) * imn as f32
    })
}

/// The exact `Σ scale·(q·y)` of one Q3_K super-block against Q8_K (signed quants and scales).
pub fn q3k_ints(bx: &BlockQ3K, by: &BlockQ8K) -> i32 {
    let (q, sc) = (q3k_quants(bx), q3k_scales(&bx.scales));
    let mut isc = 0i32;
    for g in 0..16 {
        isc += sc[g] as i32 * isum(&q, &by.qs, g * 16..g * 16 + 16);
    }
    isc
}

/// Q3_K · Q8_K.
pub fn vec_dot_q3_k_q8_k(n: usize, x: &[u8], y: &[u8]) -> f32 {
    dot_blocks(n, x, y, QK_K, QK_K, |bx: &BlockQ3K, by: &[BlockQ8K]| {
        let by = &by[0];
        q8k_d(by) * f16le(bx.d) * q3k_ints(bx, by) as f32
    })
}

/// The exact integer sums of one Q4_K super-block against Q8_K: `(Σ scale·(q·y), Σ min·bsum)`.
pub fn q4k_ints(bx: &BlockQ4K, by: &BlockQ8K) -> (i32, i32) {
    k4_ints(&q4k_quants(bx), &k4_scales(&bx.scales), by)
}

/// The exact integer sums of one Q5_K super-block against Q8_K: `(Σ scale·(q·y), Σ min·bsum)`.
pub fn q5k_ints(bx: &BlockQ5K, by: &BlockQ8K) -> (i32, i32) {
    k4_ints(&q5k_quants(bx), &k4_scales(&bx.scales), by)
}

/// Q4_K · Q8_K.
pub fn vec_dot_q4_k_q8_k(n: usize, x: &[u8], y: &[u8]) -> f32 {
    dot_blocks(n, x, y, QK_K, QK_K, |bx: &BlockQ4K, by: &[BlockQ8K]| {
        let by = &by[0];
        k4_value(q4k_ints(bx, by), by, f16le(bx.d), f16le(bx.dmin))
    })
}

/// Q5_K · Q8_K.
pub fn vec_dot_q5_k_q8_k(n: usize, x: &[u8], y: &[u8]) -> f32 {
    dot_blocks(n, x, y, QK_K, QK_K, |bx: &BlockQ5K, by: &[BlockQ8K]| {
        let by = &by[0];
        k4_value(q5k_ints(bx, by), by, f16le(bx.d), f16le(bx.dmin))
    })
}

/// The Q4_K/Q5_K super-block integer sums: scaled sub-block sums, and the mins times the bsums.
#[inline(always)]
fn k4_ints(q: &[u8; QK_K], sm: &[(u8, u8); 8], by: &BlockQ8K) -> (i32, i32) {
    let (mut isc, mut imn) = (0i32, 0i32);
    for (j, &(sc, mn)) in sm.iter().enumerate() {
        isc += sc as i32 * isum(q, &by.qs, j * 32..j * 32 + 32);
        imn += mn as i32 * (bsum(by, 2 * j) + bsum(by, 2 * j + 1));
    }
    (isc, imn)
}

/// The reference's float steps of a Q4_K/Q5_K super-block.
#[inline(always)]
fn k4_value((isc, imn): (i32, i32), by: &BlockQ8K, d: f32, dmin: f32) -> f32 {
    let dy = q8k_d(by);
    dy * d * isc as f32 - dy * dmin * imn as f32
}

/// The exact `Σ scale·(q·y)` of one Q6_K super-block against Q8_K (quants minus 32).
pub fn q6k_ints(bx: &BlockQ6K, by: &BlockQ8K) -> i32 {
    let q = q6k_quants(bx);
    let mut isc = 0i32;
    for g in 0..16 {
        isc += bx.scales[g] as i32 * isum(&q, &by.qs, g * 16..g * 16 + 16);
    }
    isc
}

/// Q6_K · Q8_K.
pub fn vec_dot_q6_k_q8_k(n: usize, x: &[u8], y: &[u8]) -> f32 {
    dot_blocks(n, x, y, QK_K, QK_K, |bx: &BlockQ6K, by: &[BlockQ8K]| {
        let by = &by[0];
        q8k_d(by) * f16le(bx.d) * q6k_ints(bx, by) as f32
    })
}

/// IQ4_XS · Q8_K.
pub fn vec_dot_iq4_xs_q8_k(n: usize, x: &[u8], y: &[u8]) -> f32 {
    dot_blocks(n, x, y, QK_K, QK_K, |bx: &BlockIq4Xs, by: &[BlockQ8K]| {
        let by = &by[0];
        q8k_d(by) * f16le(bx.d) * iq4xs_ints(bx, by) as f32
    })
}

/// The exact `Σ (scale - 32)·(w·y)` of one IQ4_XS super-block against Q8_K.
pub fn iq4xs_ints(bx: &BlockIq4Xs, by: &BlockQ8K) -> i32 {
    let w = iq4xs_indices(bx).map(|i| KVALUES_IQ4NL[i as usize]);
    let mut isc = 0i32;
    for ib in 0..8 {
        isc += (iq4xs_scale(bx, ib) - 32) * isum(&w, &by.qs, ib * 32..ib * 32 + 32);
    }
    isc
}
