//! Weight quantizers for the K-quants and IQ4_XS, with the packers that invert the `*_quants`
//! unpackers of `kquants`.
//!
//! These are simple, sound quantizers (not ggml's iterative searches): per sub-block a min/max
//! (asymmetric types) or signed-absmax (symmetric types) fit, super-block scales chosen so the
//! largest sub-block scale uses the full integer range, f16 rounding of the super-block scales
//! before the final quants are chosen. Their errors on ggml's test signal are bounded by ggml's
//! own budgets (see the tests in `quant::tests::quantize`).

use super::legacy::{fit_iq4_scale, nearest_in};
use super::quant_blocks;
use crate::dtype::QK_K;
use crate::quant::blocks::*;

// ---- packers (inverses of the unpackers in `kquants`) ----

/// Packs 2-bit quants in element order into Q2_K/Q3_K's `qs` layout.
pub fn q2k_pack(q: &[u8; QK_K]) -> [u8; QK_K / 4] {
    let mut qs = [0u8; QK_K / 4];
    for n in 0..2 {
        for j in 0..4 {
            for l in 0..32 {
                qs[n * 32 + l] |= (q[n * 128 + j * 32 + l] & 3) << (2 * j);
            }
        }
    }
    qs
}

/// Packs Q3_K quants (-4..=3) into `(hmask, qs)`.
pub fn q3k_pack(q: &[i8; QK_K]) -> ([u8; QK_K / 8], [u8; QK_K / 4]) {
    let u: [u8; QK_K] = q.map(|v| (v + 4) as u8);
    let mut hmask = [0u8; QK_K / 8];
    for n in 0..2 {
        for j in 0..4 {
            for l in 0..32 {
                hmask[l] |= (u[n * 128 + j * 32 + l] >> 2) << (n * 4 + j);
            }
        }
    }
    (hmask, q2k_pack(&u.map(|v| v & 3)))
}

/// Packs 16 Q3_K scales (-32..=31) into 12 bytes.
pub fn q3k_pack_scales(sc: &[i8; 16]) -> [u8; 12] {
    let u = sc.map(|v| (v + 32) as u8);
    let mut s = [0u8; 12];
    for j in 0..4 {
        s[j] = (u[j] & 0xF) | ((u[8 + j] & 0xF) << 4);
        s[4 + j] = (u[4 + j] & 0xF) | ((u[12 + j] & 0xF) << 4);
        s[8 + j] = (u[j] >> 4) | ((u[4 + j] >> 4) << 2) | ((u[8 + j] >> 4) << 4) | ((u[12 + j] >> 4) << 6);
    }
    s
}

/// Packs 8 6-bit scales and mins of Q4_K/Q5_K into 12 bytes.
pub fn k4_pack_scales(sc: &[u8; 8], mn: &[u8; 8]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for j in 0..4 {
        s[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
        s[j + 4] = mn[j] | ((mn[j + 4] >> 4) << 6);
        s[j + 8] = (sc[j + 4] & 0xF) | ((mn[j + 4] & 0xF) << 4);
    }
    s
}

/// Packs Q4_K nibbles in element order.
pub fn q4k_pack(q: &[u8; QK_K]) -> [u8; QK_K / 2] {
    std::array::from_fn(|i| {
        let (c, l) = (i / 32, i % 32);
        (q[c * 64 + l] & 0xF) | ((q[c * 64 + 32 + l] & 0xF) << 4)
    })
}

/// Packs Q5_K quants (0..=31) into `(qh, qs)`.
pub fn q5k_pack(q: &[u8; QK_K]) -> ([u8; QK_K / 8], [u8; QK_K / 2]) {
    let mut qh = [0u8; QK_K / 8];
    for c in 0..4 {
        for l in 0..32 {
            qh[l] |= ((q[c * 64 + l] >> 4) & 1) << (2 * c);
            qh[l] |= ((q[c * 64 + 32 + l] >> 4) & 1) << (2 * c + 1);
        }
    }
    (qh, q4k_pack(q))
}

/// Packs Q6_K quants (-32..=31) into `(ql, qh)`.
pub fn q6k_pack(q: &[i8; QK_K]) -> ([u8; QK_K / 2], [u8; QK_K / 4]) {
    let u: [u8; QK_K] = q.map(|v| (v + 32) as u8);
    let (mut ql, mut qh) = ([0u8; QK_K / 2], [0u8; QK_K / 4]);
    for n in 0..2 {
        for l in 0..32 {
            let e = n * 128 + l;
            ql[n * 64 + l] = (u[e] & 0xF) | ((u[e + 64] & 0xF) << 4);
            ql[n * 64 + l + 32] = (u[e + 32] & 0xF) | ((u[e + 96] & 0xF) << 4);
            qh[n * 32 + l] =
                (u[e] >> 4) | ((u[e + 32] >> 4) << 2) | ((u[e + 64] >> 4) << 4) | ((u[e + 96] >> 4) << 6);
        }
    }
    (ql, qh)
}

/// Packs IQ4_XS indices (element order) and 6-bit scales into a block (without `d`).
pub fn iq4xs_pack(q: &[u8; QK_K], ls: &[u8; 8], b: &mut BlockIq4Xs) {
    let mut h = 0u16;
    b.scales_l = [0; 4];
    for ib in 0..8 {
        b.scales_l[ib / 2] |= (ls[ib] & 0xF) << (4 * (ib % 2));
        h |= (((ls[ib] >> 4) & 3) as u16) << (2 * ib);
        for j in 0..16 {
            b.qs[ib * 16 + j] = (q[ib * 32 + j] & 0xF) | ((q[ib * 32 + 16 + j] & 0xF) << 4);
        }
    }
    b.scales_h = h.to_le_bytes();
}

// ---- fitting helpers ----

/// Largest finite magnitude among `v` (0 if none).
fn max_abs(v: &[f32]) -> f32 {
    v.iter().filter(|x| x.is_finite()).fold(0.0f32, |a, x| a.max(x.abs()))
}

/// Integer index `round(v / d)` clamped to `lo..=hi` (0 when `d` is 0 or the ratio is not finite).
#[inline(always)]
fn iround(v: f32, d: f32, lo: i32, hi: i32) -> i32 {
    let r = v / d;
    if d == 0.0 || !r.is_finite() {
        return 0.max(lo).min(hi);
    }
    (r.round() as i32).clamp(lo, hi)
}

/// Squared error of `x ≈ scale*q - m` with the best `q` in `0..=top`, and the least-squares
/// `(scale, m)` for those quants (with `m ≥ 0`).
fn asym_pass(x: &[f32], scale: f32, m: f32, top: f32) -> (f32, f32, f32) {
    let q: Vec<f32> = x
        .iter()
        .map(|&v| if scale > 0.0 { ((v + m) / scale).round().clamp(0.0, top) } else { 0.0 })
        .collect();
    let n = x.len() as f32;
    let (sq, sx) = (q.iter().sum::<f32>(), x.iter().sum::<f32>());
    let (sqq, sqx) = (q.iter().map(|a| a * a).sum::<f32>(), q.iter().zip(x).map(|(a, b)| a * b).sum::<f32>());
    let det = n * sqq - sq * sq;
    let (mut s, mut mm) = (scale, m);
    if det > 0.0 {
        s = (n * sqx - sq * sx) / det;
        mm = -(sx - s * sq) / n;
        if mm < 0.0 {
            mm = 0.0;
            s = if sqq > 0.0 { sqx / sqq } else { 0.0 };
        }
    }
    let err = x.iter().zip(&q).map(|(&v, &qq)| (v - (s * qq - mm)).powi(2)).sum();
    (err, s.max(0.0), mm)
}

/// Asymmetric fit of one sub-block: `x ≈ scale*q - m` with `m ≥ 0` and `q` in `0..=top`. Starts
/// from the min/max fit and a small grid of tighter scales, each refined by least squares; keeps
/// the best.
fn fit_asym(x: &[f32], top: f32) -> (f32, f32) {
    let lo = x.iter().fold(0.0f32, |a, &v| a.min(v));
    let hi = x.iter().fold(lo, |a, &v| a.max(v));
    if !(hi - lo).is_finite() || hi == lo {
        return (0.0, -lo);
    }
    let mut best = (f32::INFINITY, (hi - lo) / top, -lo);
    for k in 0..16 {
        let scale = (hi - lo) / (top + 0.1 * k as f32 - 0.5).max(0.5);
        let (e0, mut s, mut m) = asym_pass(x, scale, -lo, top);
        if e0 < best.0 {
            best = (e0, s, m);
        }
        for _ in 0..2 {
            let (e, s2, m2) = asym_pass(x, s, m, top);
            if e < best.0 {
                best = (e, s2, m2);
            }
            (s, m) = (s2, m2);
        }
    }
    (best.1, best.2)
}

/// `(d, dmin, scales, mins, quants)` of an asymmetric K-quant block.
type AsymFit = ([u8; 2], [u8; 2], Vec<u8>, Vec<u8>, [u8; QK_K]);

/// Shared asymmetric K-quant: `nsub` sub-blocks, quants in `0..=top`, integer scales and mins in
/// `0..=smax`. Returns `(d, dmin, scales, mins, quants)` with `d`/`dmin` as f16 bytes.
fn quantize_asym(x: &[f32], nsub: usize, top: i32, smax: i32) -> AsymFit {
    let len = QK_K / nsub;
    let fits: Vec<(f32, f32)> = x.chunks_exact(len).map(|c| fit_asym(c, top as f32)).collect();
    let sc_f: Vec<f32> = fits.iter().map(|f| f.0).collect();
    let mn_f: Vec<f32> = fits.iter().map(|f| f.1).collect();
    let d = to_f16le(max_abs(&sc_f) / smax as f32);
    let dmin = to_f16le(max_abs(&mn_f) / smax as f32);
    let (dr, dminr) = (f16le(d), f16le(dmin));
    let sc: Vec<u8> = sc_f.iter().map(|&s| iround(s, dr, 0, smax) as u8).collect();
    let mn: Vec<u8> = mn_f.iter().map(|&m| iround(m, dminr, 0, smax) as u8).collect();
    let mut q = [0u8; QK_K];
    for (i, o) in q.iter_mut().enumerate() {
        let g = i / len;
        *o = iround(x[i] + dminr * mn[g] as f32, dr * sc[g] as f32, 0, top) as u8;
    }
    (d, dmin, sc, mn, q)
}

/// Shared symmetric K-quant: `nsub` sub-blocks of signed quants in `-nq..nq`, signed integer
/// scales in `-smax..=smax`. Returns `(d as f16 bytes, scales, quants)`.
fn quantize_sym(x: &[f32], nsub: usize, nq: i32, smax: i32) -> ([u8; 2], Vec<i8>, [i8; QK_K]) {
    let len = QK_K / nsub;
    let s_f: Vec<f32> = x
        .chunks_exact(len)
        .map(|c| {
            let (max, _) = super::legacy::signed_absmax(c);
            max / -(nq as f32)
        })
        .collect();
    let d = to_f16le(max_abs(&s_f) / smax as f32);
    let dr = f16le(d);
    let sc: Vec<i8> = s_f.iter().map(|&s| iround(s, dr, -smax, smax) as i8).collect();
    let mut q = [0i8; QK_K];
    for (i, o) in q.iter_mut().enumerate() {
        *o = iround(x[i], dr * sc[i / len] as f32, -nq, nq - 1) as i8;
    }
    (d, sc, q)
}

// ---- quantizers ----

/// f32 → Q2_K.
pub fn q2_k_from_f32(src: &[f32], dst: &mut [u8]) {
    quant_blocks(src, dst, QK_K, |x, b: &mut BlockQ2K| {
        let (d, dmin, sc, mn, q) = quantize_asym(x, 16, 3, 15);
        b.d = d;
        b.dmin = dmin;
        b.scales = std::array::from_fn(|g| sc[g] | (mn[g] << 4));
        b.qs = q2k_pack(&q);
    });
}

/// f32 → Q3_K.
pub fn q3_k_from_f32(src: &[f32], dst: &mut [u8]) {
    quant_blocks(src, dst, QK_K, |x, b: &mut BlockQ3K| {
        let (d, sc, q) = quantize_sym(x, 16, 4, 31);
        b.d = d;
        b.scales = q3k_pack_scales(&std::array::from_fn(|g| sc[g]));
        (b.hmask, b.qs) = q3k_pack(&q);
    });
}

/// f32 → Q4_K.
pub fn q4_k_from_f32(src: &[f32], dst: &mut [u8]) {
    quant_blocks(src, dst, QK_K, |x, b: &mut BlockQ4K| {
        let (d, dmin, sc, mn, q) = quantize_asym(x, 8, 15, 63);
        b.d = d;
        b.dmin = dmin;
        b.scales = k4_pack_scales(&std::array::from_fn(|j| sc[j]), &std::array::from_fn(|j| mn[j]));
        b.qs = q4k_pack(&q);
    });
}

/// f32 → Q5_K.
pub fn q5_k_from_f32(src: &[f32], dst: &mut [u8]) {
    quant_blocks(src, dst, QK_K, |x, b: &mut BlockQ5K| {
        let (d, dmin, sc, mn, q) = quantize_asym(x, 8, 31, 63);
        b.d = d;
        b.dmin = dmin;
        b.scales = k4_pack_scales(&std::array::from_fn(|j| sc[j]), &std::array::from_fn(|j| mn[j]));
        (b.qh, b.qs) = q5k_pack(&q);
    });
}

/// f32 → Q6_K.
pub fn q6_k_from_f32(src: &[f32], dst: &mut [u8]) {
    quant_blocks(src, dst, QK_K, |x, b: &mut BlockQ6K| {
        let (d, sc, q) = quantize_sym(x, 16, 32, 127);
        b.d = d;
        b.scales = std::array::from_fn(|g| sc[g]);
        (b.ql, b.qh) = q6k_pack(&q);
    });
}

/// f32 → IQ4_XS: an IQ4 scale fit per 32-element sub-block, 6-bit signed sub-block scales
/// against an f16 super-block scale, then nearest codebook entries for the final scales.
pub fn iq4_xs_from_f32(src: &[f32], dst: &mut [u8]) {
    quant_blocks(src, dst, QK_K, |x, b: &mut BlockIq4Xs| {
        let mut idx = [0u8; QK_K];
        let s: Vec<f32> =
            x.chunks_exact(32).zip(idx.chunks_exact_mut(32)).map(|(c, i)| fit_iq4_scale(c, i)).collect();
        b.d = to_f16le(max_abs(&s) / 31.0);
        let dr = f16le(b.d);
        let ls: [u8; 8] = std::array::from_fn(|ib| (iround(s[ib], dr, -32, 31) + 32) as u8);
        for (i, o) in idx.iter_mut().enumerate() {
            let dl = dr * (ls[i / 32] as i32 - 32) as f32;
            if dl != 0.0 {
                *o = nearest_in(&KVALUES_IQ4NL, x[i] / dl) as u8;
            }
        }
        iq4xs_pack(&idx, &ls, b);
    });
}
