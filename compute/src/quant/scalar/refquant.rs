//! ggml's reference quantizers for the K-quants, IQ4_NL, IQ4_XS, MXFP4, NVFP4, Q1_0, Q2_0 and the
//! ternary TQ1_0/TQ2_0:
//! the arithmetic ggml's CPU backend runs when CPY or SET_ROWS writes one of these types (a
//! quantized KV cache, a runtime requantization), reproduced step for step so that the bytes are
//! the same as ggml's (checked block for block by `compute/tests/quant_peer.rs`).
//!
//! The algorithms, in short:
//! - **Q2_K, Q4_K, Q5_K** ([`fit_scale_min`]): per sub-block an asymmetric fit `x ≈ s·q − m` that
//!   starts from the min/max fit and tries `nstep + 1` wider or narrower inverse scales, each
//!   refined by weighted least squares for `s` and `m` (`m` clamped to ≤ 0 in ggml's sign
//!   convention), keeping the one with the smallest weighted error (absolute error for Q2_K,
//!   squared for the others). Sub-block scales and mins are then quantized against the largest
//!   (to 4 bits for Q2_K, 6 bits otherwise), and the quants re-chosen for the f16-rounded scales.
//! - **Q3_K** ([`fit_symmetric_rmse`]): per 16 elements a signed fit that moves one quant at a time
//!   while the weighted correlation improves (at most five sweeps); 6-bit signed sub-block scales.
//! - **Q6_K** ([`fit_symmetric_search`]): per 16 elements a signed fit trying inverse scales
//!   `−(32 + 0.1·k)/max`, k = −9..=9, keeping the best weighted correlation; 8-bit signed scales.
//! - **IQ4_NL / IQ4_XS** ([`fit_iq4`]): per 32 elements, nearest-codebook assignment with the
//!   largest magnitude at `K[0]` and its weighted least-squares scale; IQ4_XS also tries inverse
//!   scales `(K[0] + t)/max`, t = −7..=7, keeping the best weighted correlation, then quantizes the
//!   eight scales to 6 bits against the largest.
//! - **MXFP4**: shared exponent `floor(log2(amax)) − 2`, then the nearest E2M1 value per element.
//! - **TQ1_0 / TQ2_0**: `d = amax`, each element rounded to −1, 0 or 1 (half away from zero).
//! - **Q1_0**: `d` = mean magnitude, a sign bit per element; **Q2_0**: `d = amax`, quants −1..=2;
//!   **NVFP4**: per 16 elements the UE4M3 scale nearest `amax/6` (ties up), nearest E2M1 values.
//!
//! All rounding of a float to an integer goes through [`nearest_int`] (round half to even, ggml's
//! magic-number trick), except where ggml itself uses `roundf`.

use super::kquantize::{k4_pack_scales, q2k_pack, q3k_pack, q3k_pack_scales, q4k_pack, q5k_pack, q6k_pack};
use super::quant_blocks;
use crate::dtype::QK_K;
use crate::quant::blocks::*;

/// Below this a group's largest magnitude counts as zero.
const GROUP_MAX_EPS: f32 = 1e-15;

/// Round half to even for `|x| < 2^22`, as ggml computes it: add `1.5 · 2^23` and read the mantissa.
#[inline(always)]
pub(crate) fn nearest_int(x: f32) -> i32 {
    let bits = (x + 12_582_912.0f32).to_bits() as i32;
    (bits & 0x007F_FFFF) - 0x0040_0000
}

/// The value of largest magnitude (the first of equals) and that magnitude.
#[inline(always)]
fn signed_absmax(x: &[f32]) -> (f32, f32) {
    let (mut max, mut amax) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    (max, amax)
}

/// Result of the asymmetric fit of one sub-block: `x ≈ scale·L − min`.
struct ScaleMin {
    scale: f32,
    /// The offset to subtract, ≥ 0.
    min: f32,
}

/// The asymmetric least-squares search of Q2_K/Q4_K/Q5_K for one sub-block (quants `0..=nmax`
/// into `l`, weights `w`): the min/max fit, then `nstep + 1` inverse scales
/// `(rmin + rdelta·i + nmax)/(max − min)`, each refined by weighted least squares.
#[allow(clippy::too_many_arguments)]
fn fit_scale_min(
    x: &[f32],
    w: &[f32],
    nmax: i32,
    l: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> ScaleMin {
    let n = x.len();
    let (mut min, mut max) = (x[0], x[0]);
    let (mut sum_w, mut sum_x) = (0.0f32, 0.0f32);
    for i in 0..n {
        min = min.min(x[i]);
        max = max.max(x[i]);
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l.fill(0);
        return ScaleMin { scale: 0.0, min: -min };
    }
    let err = |d: f32| if use_mad { d.abs() } else { d * d };
    let iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best = 0.0f32;
    for i in 0..n {
        let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        l[i] = q as u8;
        best += w[i] * err(scale * q as f32 + min - x[i]);
    }
    let mut aux = vec![0u8; n];
    for is in 0..=nstep {
        let iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..n {
            let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            aux[i] = q as u8;
            let wq = w[i] * q as f32;
            sum_l += wq;
            sum_l2 += wq * q as f32;
            sum_xl += wq * x[i];
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut e = 0.0f32;
            for i in 0..n {
                e += w[i] * err(this_scale * aux[i] as f32 + this_min - x[i]);
            }
            if e < best {
                l.copy_from_slice(&aux);
                best = e;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    ScaleMin { scale, min: -min }
}

/// Q3_K's signed fit of one group (quants `-nmax..nmax` stored as `q + nmax` in `l`): the absmax
/// fit, then up to five sweeps moving single quants while the weighted correlation improves.
fn fit_symmetric_rmse(x: &[f32], nmax: i32, l: &mut [i8]) -> f32 {
    let (max, amax) = signed_absmax(x);
    if amax < GROUP_MAX_EPS {
        l.fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for (q, &v) in l.iter_mut().zip(x) {
        let li = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
        *q = li as i8;
        let w = v * v;
        sumlx += w * v * li as f32;
        suml2 += w * li as f32 * li as f32;
    }
    for _ in 0..5 {
        let mut changed = 0;
        for (q, &v) in l.iter_mut().zip(x) {
            let w = v * v;
            let old = *q as f32;
            let mut slx = sumlx - w * v * old;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * old * old;
                let new = nearest_int(v * sl2 / slx).clamp(-nmax, nmax - 1);
                if new != *q as i32 {
                    slx += w * v * new as f32;
                    sl2 += w * new as f32 * new as f32;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        *q = new as i8;
                        sumlx = slx;
                        suml2 = sl2;
                        changed += 1;
                    }
                }
            }
        }
        if changed == 0 {
            break;
        }
    }
    for q in l.iter_mut() {
        *q += nmax as i8;
    }
    sumlx / suml2
}

/// Q6_K's signed fit of one group (weights `x²`, quants stored as `q + nmax`): the absmax fit
/// refined by least squares, then inverse scales `−(nmax + 0.1·k)/max` for k = −9..=9.
fn fit_symmetric_search(x: &[f32], nmax: i32, l: &mut [i8]) -> f32 {
    let (max, amax) = signed_absmax(x);
    if amax < GROUP_MAX_EPS {
        l.fill(0);
        return 0.0;
    }
    let sums = |iscale: f32| {
        let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
        for &v in x {
            let li = nearest_int(iscale * v).clamp(-nmax, nmax - 1) as f32;
            let w = v * v;
            sumlx += w * v * li;
            suml2 += w * li * li;
        }
        (sumlx, suml2)
    };
    let assign = |iscale: f32, l: &mut [i8]| {
        for (q, &v) in l.iter_mut().zip(x) {
            *q = (nearest_int(iscale * v).clamp(-nmax, nmax - 1) + nmax) as i8;
        }
    };
    let iscale = -(nmax as f32) / max;
    assign(iscale, l);
    let (sumlx, suml2) = sums(iscale);
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        let iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        let (sumlx, suml2) = sums(iscale);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            assign(iscale, l);
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// Index of the codebook entry nearest `x` (`book` ascending; ties to the upper entry only when
/// strictly closer, as ggml's bisection decides).
#[inline(always)]
fn best_index(book: &[i8; 16], x: f32) -> u8 {
    if x <= book[0] as f32 {
        return 0;
    }
    if x >= book[15] as f32 {
        return 15;
    }
    let (mut lo, mut hi) = (0usize, 15usize);
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if x < book[mid] as f32 {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    if x - (book[hi - 1] as f32) < book[hi] as f32 - x {
        (hi - 1) as u8
    } else {
        hi as u8
    }
}

/// The IQ4 scale fit of one 32-element group (weights `x²`); writes codebook indices into `l`
/// and returns the group's scale (0 for an all-zero group, `l` then untouched). With `search`
/// (IQ4_XS) the largest magnitude starts at `+K[0]`'s magnitude and 15 inverse scales are tried; without
/// (IQ4_NL) it maps to `K[0]` itself and the least-squares scale of that one assignment is kept.
fn fit_iq4(x: &[f32], l: &mut [u8], search: bool) -> f32 {
    let ntry: i32 = if search { 7 } else { 0 };
    let k = &KVALUES_IQ4NL;
    let (max, amax) = signed_absmax(x);
    if amax < GROUP_MAX_EPS {
        return 0.0;
    }
    let corr = |id: f32, l: Option<&mut [u8]>| {
        let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
        let mut l = l;
        for (j, &v) in x.iter().enumerate() {
            let i = best_index(k, id * v);
            if let Some(l) = l.as_deref_mut() {
                l[j] = i;
            }
            let q = k[i as usize] as f32;
            let w = v * v;
            sumqx += w * q * v;
            sumq2 += w * q * q;
        }
        (sumqx, sumq2)
    };
    let d0 = if search { -max / k[0] as f32 } else { max / k[0] as f32 };
    let (sumqx, sumq2) = corr(1.0 / d0, Some(l));
    let mut d = sumqx / sumq2;
    let mut best = d * sumqx;
    for itry in (-ntry..=ntry).filter(|_| search) {
        let id = (itry as f32 + k[0] as f32) / max;
        let (sumqx, sumq2) = corr(id, None);
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    d
}

/// Packs 32 IQ4 indices of element order into 16 bytes (low nibbles: first half).
fn pack_iq4(l: &[u8], qs: &mut [u8]) {
    for j in 0..16 {
        qs[j] = l[j] | (l[16 + j] << 4);
    }
}

/// Averages of `x²` used by Q4_K/Q5_K as the base weight: `sqrt(Σx²/n)`.
fn rms(x: &[f32]) -> f32 {
    let mut s = 0.0f32;
    for &v in x {
        s += v * v;
    }
    (s / x.len() as f32).sqrt()
}

// ---- the quantizers ----

/// f32 → Q2_K (ggml's reference quantizer).
pub fn q2_k_from_f32(src: &[f32], dst: &mut [u8]) {
    quant_blocks(src, dst, QK_K, |x, b: &mut BlockQ2K| {
        let mut l = [0u8; QK_K];
        let mut fits = [(0.0f32, 0.0f32); 16];
        for j in 0..16 {
            let xs = &x[16 * j..16 * j + 16];
            let w: [f32; 16] = std::array::from_fn(|i| xs[i].abs());
            let f = fit_scale_min(xs, &w, 3, &mut l[16 * j..16 * j + 16], -0.5, 0.1, 15, true);
            fits[j] = (f.scale, f.min);
        }
        let max_scale = fits.iter().fold(0.0f32, |a, f| if f.0 > a { f.0 } else { a });
        let max_min = fits.iter().fold(0.0f32, |a, f| if f.1 > a { f.1 } else { a });
        let mut scales = [0u8; 16];
        b.d = [0; 2];
        b.dmin = [0; 2];
        if max_scale > 0.0 {
            let iscale = 15.0 / max_scale;
            for j in 0..16 {
                scales[j] = nearest_int(iscale * fits[j].0) as u8;
            }
            b.d = to_f16le(max_scale / 15.0);
        }
        if max_min > 0.0 {
            let iscale = 15.0 / max_min;
            for j in 0..16 {
                scales[j] |= (nearest_int(iscale * fits[j].1) as u8) << 4;
            }
            b.dmin = to_f16le(max_min / 15.0);
        }
        let (dd, dm) = (f16le(b.d), f16le(b.dmin));
        for j in 0..16 {
            let d = dd * (scales[j] & 0xF) as f32;
            if d == 0.0 {
                continue;
            }
            let m = dm * (scales[j] >> 4) as f32;
            for i in 16 * j..16 * j + 16 {
                l[i] = nearest_int((x[i] + m) / d).clamp(0, 3) as u8;
            }
        }
        b.scales = scales;
        b.qs = q2k_pack(&l);
    });
}

/// f32 → Q3_K (ggml's reference quantizer).
pub fn q3_k_from_f32(src: &[f32], dst: &mut [u8]) {
    quant_blocks(src, dst, QK_K, |x, b: &mut BlockQ3K| {
        let mut l = [0i8; QK_K];
        let mut scales = [0.0f32; 16];
        for j in 0..16 {
            scales[j] = fit_symmetric_rmse(&x[16 * j..16 * j + 16], 4, &mut l[16 * j..16 * j + 16]);
        }
        let (max_scale, _) = signed_absmax(&scales);
        let mut sc = [0i8; 16];
        if max_scale == 0.0 {
            // ggml leaves the scale bytes zero (not the packed form of scale 0) and d = 0.
            b.d = [0; 2];
            b.scales = [0; 12];
            (b.hmask, b.qs) = q3k_pack(&std::array::from_fn(|i| l[i] - 4));
            return;
        }
        {
            let iscale = -32.0 / max_scale;
            for j in 0..16 {
                sc[j] = (nearest_int(iscale * scales[j]) as i8).clamp(-32, 31);
            }
            b.d = to_f16le(1.0 / iscale);
        }
        let dd = f16le(b.d);
        for j in 0..16 {
            let d = dd * sc[j] as f32;
            if d == 0.0 {
                continue;
            }
            for i in 16 * j..16 * j + 16 {
                l[i] = (nearest_int(x[i] / d).clamp(-4, 3) + 4) as i8;
            }
        }
        b.scales = q3k_pack_scales(&sc);
        // The packer takes signed quants (-4..=3).
        let q: [i8; QK_K] = std::array::from_fn(|i| l[i] - 4);
        (b.hmask, b.qs) = q3k_pack(&q);
    });
}

/// Q4_K / Q5_K: sub-block fits with weights `rms(x) + |x|`, 6-bit scales and mins, requantized.
fn quantize_k4(x: &[f32], nmax: i32, rmin: f32, nstep: i32) -> ([u8; 2], [u8; 2], [u8; 12], [u8; QK_K]) {
    let mut l = [0u8; QK_K];
    let mut fits = [(0.0f32, 0.0f32); 8];
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        let av = rms(xs);
        let w: [f32; 32] = std::array::from_fn(|i| av + xs[i].abs());
        let f = fit_scale_min(xs, &w, nmax, &mut l[32 * j..32 * j + 32], rmin, 0.1, nstep, false);
        fits[j] = (f.scale, f.min);
    }
    let max_scale = fits.iter().fold(0.0f32, |a, f| if f.0 > a { f.0 } else { a });
    let max_min = fits.iter().fold(0.0f32, |a, f| if f.1 > a { f.1 } else { a });
    let inv_scale = if max_scale > 0.0 { 63.0 / max_scale } else { 0.0 };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let sc: [u8; 8] = std::array::from_fn(|j| nearest_int(inv_scale * fits[j].0).min(63) as u8);
    let mn: [u8; 8] = std::array::from_fn(|j| nearest_int(inv_min * fits[j].1).min(63) as u8);
    let d = to_f16le(max_scale / 63.0);
    let dmin = to_f16le(max_min / 63.0);
    let (dd, dm) = (f16le(d), f16le(dmin));
    for j in 0..8 {
        let dl = dd * sc[j] as f32;
        if dl == 0.0 {
            continue;
        }
        let m = dm * mn[j] as f32;
        for i in 32 * j..32 * j + 32 {
            l[i] = nearest_int((x[i] + m) / dl).clamp(0, nmax) as u8;
        }
    }
    (d, dmin, k4_pack_scales(&sc, &mn), l)
}

/// f32 → Q4_K (ggml's reference quantizer).
pub fn q4_k_from_f32(src: &[f32], dst: &mut [u8]) {
    quant_blocks(src, dst, QK_K, |x, b: &mut BlockQ4K| {
        let (d, dmin, scales, l) = quantize_k4(x, 15, -1.0, 20);
        (b.d, b.dmin, b.scales) = (d, dmin, scales);
        b.qs = q4k_pack(&l);
    });
}

/// f32 → Q5_K (ggml's reference quantizer).
pub fn q5_k_from_f32(src: &[f32], dst: &mut [u8]) {
    quant_blocks(src, dst, QK_K, |x, b: &mut BlockQ5K| {
        let (d, dmin, scales, l) = quantize_k4(x, 31, -0.5, 15);
        (b.d, b.dmin, b.scales) = (d, dmin, scales);
        (b.qh, b.qs) = q5k_pack(&l);
    });
}

/// f32 → Q6_K (ggml's reference quantizer).
pub fn q6_k_from_f32(src: &[f32], dst: &mut [u8]) {
    quant_blocks(src, dst, QK_K, |x, b: &mut BlockQ6K| {
        let mut l = [0i8; QK_K];
        let mut scales = [0.0f32; 16];
        for j in 0..16 {
            scales[j] = fit_symmetric_search(&x[16 * j..16 * j + 16], 32, &mut l[16 * j..16 * j + 16]);
        }
        let (max_scale, amax) = signed_absmax(&scales);
        if amax < GROUP_MAX_EPS {
            *b = bytemuck::Zeroable::zeroed();
            return;
        }
        let iscale = -128.0 / max_scale;
        b.d = to_f16le(1.0 / iscale);
        let dd = f16le(b.d);
        for j in 0..16 {
            b.scales[j] = nearest_int(iscale * scales[j]).min(127) as i8;
            let d = dd * b.scales[j] as f32;
            if d == 0.0 {
                continue;
            }
            for i in 16 * j..16 * j + 16 {
                l[i] = (nearest_int(x[i] / d).clamp(-32, 31) + 32) as i8;
            }
        }
        let q: [i8; QK_K] = std::array::from_fn(|i| l[i] - 32);
        (b.ql, b.qh) = q6k_pack(&q);
    });
}

/// f32 → IQ4_NL (ggml's reference quantizer). An all-zero group gets scale 0 and, like ggml's,
/// the indices of the previous group of the row (0 for the first): the values are 0 either way,
/// and the bytes stay identical to ggml's.
pub fn iq4_nl_from_f32(src: &[f32], dst: &mut [u8]) {
    let carried = std::cell::Cell::new([0u8; 32]);
    quant_blocks(src, dst, 32, |x, b: &mut BlockIq4Nl| {
        let mut l = carried.get();
        let d = fit_iq4(x, &mut l, false);
        b.d = to_f16le(d);
        pack_iq4(&l, &mut b.qs);
        carried.set(l);
    });
}

/// f32 → IQ4_XS (ggml's reference quantizer).
pub fn iq4_xs_from_f32(src: &[f32], dst: &mut [u8]) {
    quant_blocks(src, dst, QK_K, |x, b: &mut BlockIq4Xs| {
        let mut l = [0u8; QK_K];
        let mut scales = [0.0f32; 8];
        for ib in 0..8 {
            scales[ib] = fit_iq4(&x[32 * ib..32 * ib + 32], &mut l[32 * ib..32 * ib + 32], true);
        }
        let (max_scale, _) = signed_absmax(&scales);
        let d = -max_scale / 32.0;
        b.d = to_f16le(d);
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut h = 0u16;
        b.scales_l = [0; 4];
        for ib in 0..8 {
            let ls = nearest_int(id * scales[ib]).clamp(-32, 31);
            let dl = d * ls as f32;
            let idl = if dl != 0.0 { 1.0 / dl } else { 0.0 };
            for i in 32 * ib..32 * ib + 32 {
                l[i] = best_index(&KVALUES_IQ4NL, idl * x[i]);
            }
            let u = (ls + 32) as u8;
            b.scales_l[ib / 2] |= (u & 0xF) << (4 * (ib % 2));
            h |= ((u >> 4) as u16) << (2 * ib);
            pack_iq4(&l[32 * ib..32 * ib + 32], &mut b.qs[16 * ib..16 * ib + 16]);
        }
        b.scales_h = h.to_le_bytes();
    });
}

/// Index of the MXFP4 value nearest `x` at scale `d` (first of equals wins).
fn best_index_mxfp4(x: f32, d: f32) -> u8 {
    let mut best = (0u8, (KVALUES_MXFP4[0] as f32 * d - x).abs());
    for i in 1..16u8 {
        let e = (KVALUES_MXFP4[i as usize] as f32 * d - x).abs();
        if e < best.1 {
            best = (i, e);
        }
    }
    best.0
}

/// f32 → MXFP4 (ggml's reference quantizer).
pub fn mxfp4_from_f32(src: &[f32], dst: &mut [u8]) {
    quant_blocks(src, dst, 32, |x, b: &mut BlockMxfp4| {
        let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        b.e = if amax > 0.0 { (amax.log2().floor() - 2.0 + 127.0) as u8 } else { 0 };
        let d = e8m0_half(b.e);
        for j in 0..16 {
            b.qs[j] = best_index_mxfp4(x[j], d) | (best_index_mxfp4(x[16 + j], d) << 4);
        }
    });
}

/// The ternary digit (0, 1, 2) of `v / d` rounded half away from zero, plus one.
#[inline(always)]
fn ternary(v: f32, id: f32) -> i32 {
    (v * id).round() as i32 + 1
}

/// f32 → TQ1_0 (ggml's reference quantizer): five digits per byte, most significant first, then
/// scaled so that digit `n` is `((q·3ⁿ mod 256)·3) >> 8` (see `iq::decode_tq1_0`).
pub fn tq1_0_from_f32(src: &[f32], dst: &mut [u8]) {
    quant_blocks(src, dst, QK_K, |x, b: &mut BlockTq1_0| {
        let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        let id = if amax != 0.0 { 1.0 / amax } else { 0.0 };
        b.d = to_f16le(amax);
        let pack = |digits: &mut dyn Iterator<Item = i32>| {
            let q = digits.fold(0i32, |q, t| q * 3 + t) as u16;
            (q * 256).div_ceil(243) as u8
        };
        // Bytes 0..32: digit n of byte m is element n·32 + m; bytes 32..48: element 160 + n·16 + m.
        for m in 0..32 {
            b.qs[m] = pack(&mut (0..5).map(|n| ternary(x[n * 32 + m], id)));
        }
        for m in 0..16 {
            b.qs[32 + m] = pack(&mut (0..5).map(|n| ternary(x[160 + n * 16 + m], id)));
        }
        // qh: four digits (element 240 + n·4 + m), padded with a zero digit at the end.
        for m in 0..4 {
            b.qh[m] = pack(&mut (0..4).map(|n| ternary(x[240 + n * 4 + m], id)).chain(std::iter::once(0)));
        }
    });
}

/// f32 → TQ2_0 (ggml's reference quantizer).
pub fn tq2_0_from_f32(src: &[f32], dst: &mut [u8]) {
    quant_blocks(src, dst, QK_K, |x, b: &mut BlockTq2_0| {
        let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        let id = if amax != 0.0 { 1.0 / amax } else { 0.0 };
        b.d = to_f16le(amax);
        for g in 0..2 {
            for m in 0..32 {
                let mut q = 0u8;
                for l in 0..4 {
                    q |= ((ternary(x[g * 128 + l * 32 + m], id) & 3) as u8) << (2 * l);
                }
                b.qs[g * 32 + m] = q;
            }
        }
    });
}

/// f32 → Q1_0 (ggml's reference quantizer): `d` = the mean magnitude, bit set for `x ≥ 0`.
pub fn q1_0_from_f32(src: &[f32], dst: &mut [u8]) {
    quant_blocks(src, dst, 128, |x, b: &mut BlockQ1_0| {
        let mut sum = 0.0f32;
        for &v in x {
            sum += v.abs();
        }
        b.d = to_f16le(sum / 128.0);
        b.qs = [0; 16];
        for (j, &v) in x.iter().enumerate() {
            if v >= 0.0 {
                b.qs[j / 8] |= 1 << (j % 8);
            }
        }
    });
}

/// f32 → Q2_0 (ggml's reference quantizer): `d` = the largest magnitude, each element rounded to
/// −1, 0, 1 or 2 (half away from zero).
pub fn q2_0_from_f32(src: &[f32], dst: &mut [u8]) {
    quant_blocks(src, dst, 64, |x, b: &mut BlockQ2_0| {
        let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        let id = if amax != 0.0 { 1.0 / amax } else { 0.0 };
        b.d = to_f16le(amax);
        b.qs = [0; 16];
        for (j, &v) in x.iter().enumerate() {
            let q = (ternary(v, id)).clamp(0, 3) as u8;
            b.qs[j / 4] |= q << (2 * (j % 4));
        }
    });
}

/// The UE4M3 code nearest `v` (ties to the larger code; 0 for `v ≤ 0`, at most 0x7E).
fn ue4m3_code(v: f32) -> u8 {
    if v.is_nan() || v <= 0.0 {
        return 0;
    }
    let mut best = (0u8, v);
    for c in 1..=0x7Eu8 {
        let e = (2.0 * ue4m3_half(c) - v).abs();
        if e <= best.1 {
            best = (c, e);
        }
    }
    best.0
}

/// f32 → NVFP4 (ggml's reference quantizer): per 16 elements the UE4M3 scale nearest
/// `amax / 6`, then the nearest E2M1 value per element.
pub fn nvfp4_from_f32(src: &[f32], dst: &mut [u8]) {
    quant_blocks(src, dst, 64, |x, b: &mut BlockNvfp4| {
        for s in 0..4 {
            let xs = &x[16 * s..16 * s + 16];
            let amax = xs.iter().fold(0.0f32, |a, v| a.max(v.abs()));
            b.d[s] = ue4m3_code(amax / 6.0);
            let d = ue4m3_half(b.d[s]);
            for j in 0..8 {
                b.qs[8 * s + j] = best_index_mxfp4(xs[j], d) | (best_index_mxfp4(xs[8 + j], d) << 4);
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_int_rounds_half_to_even() {
        for (x, want) in [(0.5f32, 0), (1.5, 2), (2.5, 2), (-0.5, 0), (-1.5, -2), (3.49, 3), (-7.6, -8)] {
            assert_eq!(nearest_int(x), want, "{x}");
        }
    }

    #[test]
    fn best_index_picks_the_nearest_codebook_entry() {
        let k = &KVALUES_IQ4NL;
        for t in -1300..1300 {
            let x = t as f32 / 10.0;
            let i = best_index(k, x) as usize;
            let e = (k[i] as f32 - x).abs();
            assert!(k.iter().all(|&v| (v as f32 - x).abs() >= e), "x={x}: {}", k[i]);
        }
    }
}
