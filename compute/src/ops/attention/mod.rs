//! FLASH_ATTN_EXT: fused attention with an online softmax.
//!
//! ref: ggml-compute-semantics.md §3.3 FLASH_ATTN_EXT. Two paths, chosen as ggml's CPU backend chooses:
//! - [`tiled`] from [`tiled::Q_TILE`] query rows when Q is F32 and K and V are both F16 or both F32
//!   (under the `portable` profile: any loadable types): blocks of query rows against tiles of keys,
//!   both products in ggml's tiled order, bit-identical to llama.cpp's;
//! - otherwise one query row per unit (this file): Q is converted to K's `vec_dot_type` so scores use
//!   the SIMD dot kernels, and with an F16 V the running `Σ softmax·v` row is kept at f16 precision
//!   exactly as ggml keeps it ([`super::f16acc`]); other V types are widened to f32 once and
//!   accumulated in f32. Bit-identical to llama.cpp's per-row path.

use crate::dtype::GgmlType;
use crate::error::Result;
use crate::graph::Node;
use crate::quant::{self, FromF32Fn, VecDotFn};

use super::access::{is_float, Tv};
use super::prefetch::prefetch;
use super::rows::check_loadable;
use super::softmax::alibi_slope;
use super::{check_overlap, opt_tv, param_f32, shape_err, src, tv, types_err, Alias, Ctx, Kind, Plan};

mod gemm;
mod tiled;

/// How scores are computed.
enum Scores {
    /// Q converted to K's vec_dot type, then the table's vec_dot.
    VecDot { vec_dot: VecDotFn, from_f32: Option<FromF32Fn>, row: usize },
    /// K rows widened to f32, then the f32 dot kernel with f32 Q (a K type without a vec_dot).
    F32 { dot: VecDotFn },
}

/// How many keys ahead the K and V rows are prefetched.
const PREFETCH_KEYS: usize = 4;

/// How the `Σ softmax·v` row is accumulated.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Acc {
    /// f32 accumulator over V rows that are f32 (read in place) or widened to f32 in phase 0.
    F32 { widen: bool },
    /// f16-precision accumulator over F16 V rows read in place.
    F16,
}

/// A planned FLASH_ATTN_EXT.
pub(crate) struct FlashAttn {
    q: Tv,
    k: Tv,
    v: Tv,
    mask: Option<Tv>,
    sinks: Option<Tv>,
    dst: Tv,
    scale: f32,
    max_bias: f32,
    softcap: f32,
    scores: Scores,
    acc: Acc,
    /// Set when the tiled path runs (then `scores` and `acc` are unused).
    tiled: Option<tiled::Tiled>,
}

/// Validates FLASH_ATTN_EXT.
///
/// # Safety
/// As `ops::prepare`.
pub(crate) unsafe fn prepare(n: &Node) -> Result<Plan> {
    let op = n.op;
    // SAFETY: forwarded contract.
    let (q, k, v, dst) = unsafe { (tv(src(n, 0)?)?, tv(src(n, 1)?)?, tv(src(n, 2)?)?, tv(&n.dst)?) };
    // SAFETY: forwarded contract.
    let mask = unsafe { opt_tv(n, 3)? };
    // SAFETY: forwarded contract.
    let sinks = unsafe { opt_tv(n, 4)? };
    if !is_float(q.dtype()) || dst.dtype() != GgmlType::F32 {
        return Err(types_err(op, format!("q {} dst {}", q.dtype(), dst.dtype())));
    }
    check_loadable(op, &q, "q")?;
    check_loadable(op, &k, "k")?;
    check_loadable(op, &v, "v")?;
    let (dk, nq, h, ne3) = (q.ne[0], q.ne[1], q.ne[2], q.ne[3]);
    let (nkv, hkv) = (k.ne[1], k.ne[2]);
    let dv = v.ne[0];
    let shapes_ok =
        k.ne[0] == dk && v.ne[1] == nkv && v.ne[2] == hkv && v.ne[3] == k.ne[3] && dst.ne == [dv, h, nq, ne3];
    if !shapes_ok {
        return Err(shape_err(op, format!("q {:?} k {:?} v {:?} dst {:?}", q.ne, k.ne, v.ne, dst.ne)));
    }
    if dst.is_empty() {
        return Ok(super::simple(Kind::Nop, 0));
    }
    if hkv == 0 || h % hkv != 0 || k.ne[3] == 0 || ne3 % k.ne[3] != 0 {
        return Err(shape_err(
            op,
            format!("{h} heads over {hkv} kv heads, {ne3} over {} sequences", k.ne[3]),
        ));
    }
    if !k.packed || !v.packed {
        return Err(shape_err(op, "k and v rows must be packed"));
    }
    if let Some(m) = &mask {
        if !matches!(m.dtype(), GgmlType::F16 | GgmlType::F32) {
            return Err(types_err(op, format!("mask {}", m.dtype())));
        }
        let ok = m.ne[0] >= nkv
            && m.ne[1] >= nq
            && m.ne[2] != 0
            && m.ne[3] != 0
            && h % m.ne[2] == 0
            && ne3 % m.ne[3] == 0;
        if !ok {
            return Err(shape_err(op, format!("mask {:?} for q {:?}, {nkv} kv", m.ne, q.ne)));
        }
        check_overlap(op, &dst, m, Alias::Never)?;
    }
    if let Some(s) = &sinks {
        if s.dtype() != GgmlType::F32 || s.ne[0] < h {
            return Err(shape_err(op, format!("sinks {} {:?} for {h} heads", s.dtype(), s.ne)));
        }
        check_overlap(op, &dst, s, Alias::Never)?;
    }
    for t in [&q, &k, &v] {
        check_overlap(op, &dst, t, Alias::Never)?;
    }
    let kk = quant::kernels(k.dtype());
    let vdt = kk.vec_dot_type;
    let scores = match (kk.vec_dot, quant::kernels(vdt).from_f32) {
        (Some(vec_dot), Some(f)) if dk % vdt.blck_size() == 0 => {
            let row = vdt.row_size(dk as u64).unwrap_or(0) as usize;
            let from_f32 = if vdt == GgmlType::F32 { None } else { Some(f) };
            Scores::VecDot { vec_dot, from_f32, row }
        }
        _ => match quant::kernels(GgmlType::F32).vec_dot {
            Some(dot) => Scores::F32 { dot },
            None => return Err(types_err(op, "no f32 dot kernel")),
        },
    };
    let conv_words = match &scores {
        Scores::VecDot { row, .. } => row.div_ceil(4),
        Scores::F32 { .. } => 0,
    };
    // Layout of the local scratch: q (dk) | k row (dk) | acc (dv) | v row (dv) | converted q |
    // the mask row's values (then the visible keys' values) | the visible keys (see `run`).
    let mask_words = mask.as_ref().map_or(0, |m| m.ne[0] + nkv);
    let local = 2 * dk + 2 * dv + conv_words + mask_words;
    let acc =
        if v.dtype() == GgmlType::F16 { Acc::F16 } else { Acc::F32 { widen: v.dtype() != GgmlType::F32 } };
    let mut softcap = param_f32(n, 2);
    if !softcap.is_finite() {
        softcap = 0.0;
    }
    let tiled = tiled::applies(&q, &k, &v).then(|| tiled::Tiled::new(nq, h, hkv, ne3, dk, dv));
    let v_conv = tiled.is_none() && acc == Acc::F32 { widen: true };
    let shared_bytes = if v_conv {
        v.nrows().checked_mul(dv * 4).ok_or_else(|| shape_err(op, "scratch size overflows"))?
    } else {
        0
    };
    let plan = FlashAttn {
        q,
        k,
        v,
        mask,
        sinks,
        dst,
        scale: param_f32(n, 0),
        max_bias: param_f32(n, 1),
        softcap,
        scores,
        acc,
        tiled,
    };
    if let Some(t) = tiled {
        let (units, local_f32) = (t.units(h, ne3), t.local_words(dk, dv));
        let kind = Kind::FlashAttn(Box::new(plan));
        return Ok(Plan { phases: 1, units: [units, 0], shared_bytes: 0, local_f32, kind });
    }
    let phases = if v_conv { 2 } else { 1 };
    let rows = nq * h * ne3;
    let units = if v_conv { [v.nrows().clamp(1, super::MAX_UNITS), rows] } else { [rows, 0] };
    Ok(Plan { phases, units, shared_bytes, local_f32: local, kind: Kind::FlashAttn(Box::new(plan)) })
}

impl FlashAttn {
    /// Phase 0 (when V is not f32): widens every V row into shared scratch, rows split across
    /// threads.
    fn convert_v(&self, ctx: &mut Ctx<'_>) {
        let v = &self.v;
        let dv = v.ne[0];
        let sh = ctx.sh;
        for r in ctx.range(v.nrows()) {
            let (i1, i2, i3) = v.unravel_row(r);
            let tmp = &mut ctx.local[..dv];
            v.load_row(i1, i2, i3, tmp);
            sh.bytes_mut(r * dv * 4, dv * 4).copy_from_slice(bytemuck::cast_slice(tmp));
        }
    }

    pub(crate) fn run(&self, phase: u8, ctx: &mut Ctx<'_>) {
        if let Some(t) = &self.tiled {
            self.run_tiled(t, ctx);
            return;
        }
        let v_conv = self.acc == Acc::F32 { widen: true };
        if v_conv && phase == 0 {
            self.convert_v(ctx);
            return;
        }
        let sh = ctx.sh;
        let (q, k, v) = (&self.q, &self.k, &self.v);
        let (dk, nq, h) = (q.ne[0], q.ne[1], q.ne[2]);
        let dv = v.ne[0];
        let nkv = k.ne[1];
        let rk2 = h / k.ne[2];
        let rk3 = q.ne[3] / k.ne[3];
        let mut scale = self.scale;
        if self.softcap != 0.0 {
            scale /= self.softcap;
        }
        let (qf, rest) = ctx.local.split_at_mut(dk);
        let (kf, rest) = rest.split_at_mut(dk);
        let (acc, rest) = rest.split_at_mut(dv);
        let (vf, rest) = rest.split_at_mut(dv);
        let conv_words = match &self.scores {
            Scores::VecDot { row, .. } => row.div_ceil(4),
            Scores::F32 { .. } => 0,
        };
        let (conv, rest) = rest.split_at_mut(conv_words);
        // One unit = one query row (query, head, sequence).
        {
            let u = ctx.unit;
            let iq1 = u % nq;
            let iq2 = (u / nq) % h;
            let iq3 = u / (nq * h);
            let (ik2, ik3) = (iq2 / rk2, iq3 / rk3);
            q.load_row(iq1, iq2, iq3, qf);
            let qbytes: &[u8] = match &self.scores {
                Scores::VecDot { from_f32, row, .. } => {
                    let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut conv[..]);
                    let bytes = &mut bytes[..*row];
                    match from_f32 {
                        Some(f) => f(qf, bytes),
                        None => {
                            for (o, x) in bytes.chunks_exact_mut(4).zip(qf.iter()) {
                                o.copy_from_slice(&x.to_le_bytes());
                            }
                        }
                    }
                    bytes
                }
                Scores::F32 { .. } => &[],
            };
            let slope = alibi_slope(self.max_bias, h, iq2);
            // The keys this row sees, in order, and their `slope · mask` values: a key whose value
            // is -inf changes nothing, so it is dropped before the loop (with several sequences in
            // one cache most keys are another sequence's, and reading their mask values and
            // prefetching their rows one by one cost more than the visible keys' products).
            let (visible, keys) = match &self.mask {
                Some(mk) => {
                    let (vals, keys) = rest.split_at_mut(mk.ne[0]);
                    let keys: &mut [u32] = bytemuck::cast_slice_mut(&mut keys[..nkv]);
                    let (i2, i3) = (iq2 % mk.ne[2], iq3 % mk.ne[3]);
                    let n = if mk.dtype() == GgmlType::F16 && mk.packed && slope > 0.0 {
                        visible_keys_f16(&mk.row_bytes(iq1, i2, i3)[..2 * nkv], slope, vals, keys)
                    } else {
                        mk.load_row(iq1, i2, i3, vals);
                        let mut n = 0;
                        for j in 0..nkv {
                            let mv = slope * vals[j];
                            if mv != f32::NEG_INFINITY {
                                // n <= j: the value at n was read already.
                                vals[n] = mv;
                                keys[n] = j as u32;
                                n += 1;
                            }
                        }
                        n
                    };
                    (n, Some((&vals[..n], &keys[..n])))
                }
                None => (nkv, None),
            };
            let key = |i: usize| keys.map_or((i, 0.0), |(vals, keys)| (keys[i] as usize, vals[i]));
            acc.fill(0.0);
            let mut m = f32::NEG_INFINITY;
            let mut s_sum = 0.0f32;
            for i in 0..visible {
                // The cache rows of a later key: each key is a new row (a cache miss once the
                // weights of a generation step have streamed the KV cache out of L2/L3).
                if i + PREFETCH_KEYS < visible {
                    let (jp, _) = key(i + PREFETCH_KEYS);
                    let (kp, vp) = (k.row_ptr(jp, ik2, ik3), v.row_ptr(jp, ik2, ik3));
                    for off in (0..k.row_size.min(256)).step_by(64) {
                        prefetch(kp.wrapping_add(off));
                    }
                    for off in (0..v.row_size.min(256)).step_by(64) {
                        prefetch(vp.wrapping_add(off));
                    }
                }
                let (j, mv) = key(i);
                let dot = match &self.scores {
                    Scores::VecDot { vec_dot, .. } => vec_dot(dk, k.row_bytes(j, ik2, ik3), qbytes),
                    Scores::F32 { dot } => {
                        k.load_row(j, ik2, ik3, kf);
                        dot(dk, bytemuck::cast_slice(kf), bytemuck::cast_slice(qf))
                    }
                };
                let mut s = dot * scale;
                if self.softcap != 0.0 {
                    s = self.softcap * s.tanh();
                }
                s += mv;
                let mut ms = 1.0f32;
                let mut vs = 1.0f32;
                if s > m {
                    let old = m;
                    m = s;
                    ms = (old - m).exp();
                    match self.acc {
                        Acc::F16 => super::f16acc::scale(acc, ms),
                        Acc::F32 { .. } => acc.iter_mut().for_each(|a| *a *= ms),
                    }
                } else {
                    vs = (s - m).exp();
                }
                if self.acc == Acc::F16 {
                    super::f16acc::mad(acc, v.row_bytes(j, ik2, ik3), vs);
                    s_sum = s_sum.mul_add(ms, vs);
                    continue;
                }
                let vrow: &[f32] = if v_conv {
                    let r = j + v.ne[1] * (ik2 + v.ne[2] * ik3);
                    bytemuck::cast_slice(sh.bytes(r * dv * 4, dv * 4))
                } else {
                    v.load_row(j, ik2, ik3, vf);
                    vf
                };
                super::f16acc::mad_f32(acc, vrow, vs);
                s_sum = s_sum.mul_add(ms, vs);
            }
            if let Some(sk) = &self.sinks {
                let s = sk.get_f32(iq2, 0, 0, 0);
                let mut ms = 1.0f32;
                let mut vs = 1.0f32;
                if s > m {
                    ms = (m - s).exp();
                    acc.iter_mut().for_each(|a| *a *= ms);
                } else {
                    vs = (s - m).exp();
                }
                s_sum = s_sum.mul_add(ms, vs);
            }
            let inv = if s_sum == 0.0 { 0.0 } else { 1.0 / s_sum };
            acc.iter_mut().for_each(|a| *a *= inv);
            self.dst.store_row(iq2, iq1, iq3, acc);
        }
    }
}

/// F16 -inf.
const F16_NEG_INF: u16 = 0xFC00;

/// The keys of an F16 mask row `row` (one value per key) whose `slope · mask` is not -inf, for a
/// positive `slope`: their indices into `keys` and those products into `vals`, in order; returns
/// how many. A -inf mask value times a positive slope is -inf, so those are skipped on their bits
/// (four at a time: with several sequences in one cache most of a row is -inf), and every other
/// value is widened and multiplied as the element-wise path does.
fn visible_keys_f16(row: &[u8], slope: f32, vals: &mut [f32], keys: &mut [u32]) -> usize {
    debug_assert!(slope > 0.0);
    let mut n = 0;
    let mut push = |j: usize, bits: u16| {
        let mv = slope * half::f16::from_bits(bits).to_f32();
        if mv != f32::NEG_INFINITY {
            vals[n] = mv;
            keys[n] = j as u32;
            n += 1;
        }
    };
    let mut quads = row.chunks_exact(8);
    for (q, c) in quads.by_ref().enumerate() {
        let w = u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
        if w == 0xFC00_FC00_FC00_FC00 {
            continue;
        }
        for e in 0..4 {
            let bits = u16::from_le_bytes([c[2 * e], c[2 * e + 1]]);
            if bits != F16_NEG_INF {
                push(4 * q + e, bits);
            }
        }
    }
    let done = row.len() / 8 * 4;
    for (e, c) in quads.remainder().chunks_exact(2).enumerate() {
        let bits = u16::from_le_bytes([c[0], c[1]]);
        if bits != F16_NEG_INF {
            push(done + e, bits);
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// The element-wise definition: every key whose widened mask value times `slope` is not -inf.
    fn visible_reference(row: &[u16], slope: f32) -> Vec<(u32, u32)> {
        let vals = row.iter().map(|&b| slope * half::f16::from_bits(b).to_f32());
        vals.enumerate()
            .filter(|(_, v)| *v != f32::NEG_INFINITY)
            .map(|(j, v)| (j as u32, v.to_bits()))
            .collect()
    }

    #[test]
    fn f16_mask_scan_equals_the_element_wise_one() {
        let mut r = rand::rngs::StdRng::seed_from_u64(7);
        // -inf, +inf, a NaN, the largest finite negatives, zeros, a subnormal, ordinary values.
        let special = [F16_NEG_INF, 0x7C00, 0x7E01, 0xFBFF, 0x7BFF, 0x0000, 0x8000, 0x0001, 0x3C00, 0xC500];
        for len in [0usize, 1, 3, 4, 7, 8, 33, 560] {
            for density in [0.0, 0.125, 0.5, 1.0] {
                let row: Vec<u16> = (0..len)
                    .map(|_| {
                        if r.random::<f64>() >= density {
                            F16_NEG_INF
                        } else {
                            special[r.random_range(0..special.len())]
                        }
                    })
                    .collect();
                let bytes: Vec<u8> = row.iter().flat_map(|b| b.to_le_bytes()).collect();
                // Slopes: 1 (no ALiBi), ALiBi-like, tiny, and one that overflows -65504 to -inf.
                for slope in [1.0f32, 0.5, 0.0039, 1e-30, 1e35] {
                    let (mut vals, mut keys) = (vec![0.0f32; len], vec![0u32; len]);
                    let n = visible_keys_f16(&bytes, slope, &mut vals, &mut keys);
                    let got: Vec<(u32, u32)> = (0..n).map(|i| (keys[i], vals[i].to_bits())).collect();
                    assert_eq!(
                        got,
                        visible_reference(&row, slope),
                        "len {len} density {density} slope {slope}"
                    );
                }
            }
        }
    }
}
