//! FLASH_ATTN_EXT for batches of [`Q_TILE`] query rows and more: blocks of query rows against tiles of
//! [`KV_TILE`] keys, both products through [`super::gemm`].
//!
//! ref: ggml-compute-semantics.md §3.3 FLASH_ATTN_EXT. From 64 query rows ggml's CPU backend (F32 Q,
//! K and V both F16 or both F32) computes each row in this order, which is reproduced here bit for bit:
//! - keys in tiles of 64 from key 0; per tile, the scores `s = Σ_d q·k` (one fused chain over `d`),
//!   `s·scale`, the softcap `c·tanh(s)`, `+ slope·mask`, keys past the end at −∞;
//! - a tile whose scores are all −∞ leaves the row alone; otherwise `M' = fmax(M, max s)`, and when
//!   `M' > M` the accumulator and the sum are scaled by `expf(M − M')`; then `p = exp(s − M')` with
//!   ggml's vectorised `exp` and the sum of the tile in f64 per vector ([`vexp::soft_max_exp`]), added
//!   to the f32 sum;
//! - `acc += p·V` (one fused chain over the tile's 64 keys, padding keys included with `p = 0`);
//! - after the last tile the sink (if any) as in the per-row path, then `acc / sum`.
//!
//! ggml skips a tile only when every row of its own 64-row query tile is masked there, and its query
//! tiles follow its thread chunks; here the block is this unit's. A row that is fully masked in a
//! tile gets `acc += 0·V` in ggml when a neighbour keeps the tile and nothing here: the same value,
//! except that `−0 + 0·v` may turn an accumulator that is exactly −0 into +0, and a non-finite V
//! value in a masked cell would make ggml's row NaN. Neither arises from a KV cache llama.cpp writes.
//!
//! Work is split by query block × group of query heads sharing one KV head; each unit widens (and
//! for K transposes) one K/V tile once for all its heads and rows. Units run the last query blocks
//! (the ones a causal mask leaves the most keys to) first.

use crate::dtype::GgmlType;
use crate::numerics::{self, Numerics};
use crate::quant;

use super::super::access::Tv;
use super::super::vexp;
use super::super::Ctx;
use super::gemm::{gemm, Dims};
use super::FlashAttn;

/// Query rows per block (ggml's `GGML_FA_TILE_Q`; from this many rows ggml takes its tiled path).
pub(super) const Q_TILE: usize = 64;
/// Keys per tile (ggml's `GGML_FA_TILE_KV`; it fixes where the online softmax rescales).
pub(super) const KV_TILE: usize = 64;

/// How a tiled FLASH_ATTN_EXT is cut into units.
#[derive(Clone, Copy, Debug)]
pub(super) struct Tiled {
    /// Query heads per unit (a divisor of the heads per KV head).
    group: usize,
    /// Query blocks per head.
    blocks: usize,
}

/// Whether the tiled path applies: ggml's condition (F32 Q, K and V of one type, F16 or F32, at least
/// [`Q_TILE`] rows; on aarch64 also whole vectors of V), or under `portable` any loadable types.
pub(super) fn applies(q: &Tv, k: &Tv, v: &Tv) -> bool {
    let (nq, dv) = (q.ne[1], v.ne[0]);
    if nq < Q_TILE || !k.can_load() || !v.can_load() || !q.can_load() {
        return false;
    }
    let profile = numerics::active();
    if profile == Numerics::Portable {
        return true;
    }
    let ggml_types = q.dtype() == GgmlType::F32
        && k.dtype() == v.dtype()
        && matches!(k.dtype(), GgmlType::F16 | GgmlType::F32);
    // ggml's non-x86 builds also want DV in whole vectors (4 lanes on NEON, 8 on 256-bit SVE).
    let lanes = match profile {
        Numerics::Sve => 8,
        Numerics::NeonDotprod | Numerics::NeonI8mm => 4,
        _ => 1,
    };
    ggml_types && dv.is_multiple_of(lanes)
}

impl Tiled {
    /// The cut for `h` query heads over `hkv` KV heads, `nq` rows, `ne3` sequences and head sizes
    /// `dk`, `dv`: as many heads per unit as fit a modest scratch, fewer when that leaves under 8 units.
    pub(super) fn new(nq: usize, h: usize, hkv: usize, ne3: usize, dk: usize, dv: usize) -> Tiled {
        let rep = h / hkv;
        let blocks = nq.div_ceil(Q_TILE);
        let divisors = (1..=rep).rev().filter(|g| rep.is_multiple_of(*g));
        let mut group = 1;
        for g in divisors {
            let fits = g * dk.max(dv) <= 512;
            let enough = ne3 * hkv * (rep / g) * blocks >= 8;
            if fits && enough {
                group = g;
                break;
            }
        }
        Tiled { group, blocks }
    }

    /// Units of the one phase.
    pub(super) fn units(&self, h: usize, ne3: usize) -> usize {
        ne3 * (h / self.group) * self.blocks
    }

    /// f32 words of per-thread scratch.
    pub(super) fn local_words(&self, dk: usize, dv: usize) -> usize {
        let rows = self.group * Q_TILE;
        dk * KV_TILE + KV_TILE * dv + rows * (dk + dv + 2) + 3 * Q_TILE * KV_TILE + dk
    }
}

/// Loads row `(i1, i2, i3)` of `t` as f32 (F16 through the table's vector conversion).
fn load_row(t: &Tv, i1: usize, i2: usize, i3: usize, out: &mut [f32]) {
    if t.packed && t.dtype() == GgmlType::F16 {
        if let Some(f) = quant::kernels(GgmlType::F16).to_f32 {
            f(t.row_bytes(i1, i2, i3), &mut out[..t.ne[0]]);
            return;
        }
    }
    t.load_row(i1, i2, i3, out);
}

/// `slope · mask[from..from + out.len()]` of row `(i1, i2, i3)` into `out`.
fn load_mask(mk: &Tv, i1: usize, i2: usize, i3: usize, from: usize, slope: f32, out: &mut [f32]) {
    let n = out.len();
    match mk.dtype() {
        GgmlType::F16 if mk.packed => match quant::kernels(GgmlType::F16).to_f32 {
            Some(f) => f(&mk.row_bytes(i1, i2, i3)[2 * from..2 * (from + n)], out),
            None => out.iter_mut().enumerate().for_each(|(j, o)| *o = mk.get_f32(from + j, i1, i2, i3)),
        },
        _ => out.iter_mut().enumerate().for_each(|(j, o)| *o = mk.get_f32(from + j, i1, i2, i3)),
    }
    out.iter_mut().for_each(|x| *x *= slope);
}

/// ggml's `MAX` fold (`m > x ? m : x`) over a row: lane-wise, or in order when a NaN makes the
/// order matter.
fn row_max(x: &[f32]) -> f32 {
    let seq = |x: &[f32]| x.iter().fold(f32::NEG_INFINITY, |m, &v| if m > v { m } else { v });
    if !x.len().is_multiple_of(16) {
        return seq(x);
    }
    let mut lanes = [f32::NEG_INFINITY; 16];
    let mut nan = false;
    for c in x.chunks_exact(16) {
        for (l, &v) in lanes.iter_mut().zip(c) {
            *l = if *l > v { *l } else { v };
            nan |= v.is_nan();
        }
    }
    if nan {
        return seq(x);
    }
    seq(&lanes)
}

/// The parts of the per-thread scratch.
struct Scratch<'a> {
    /// One K tile, transposed: `kt[d·KV_TILE + j]`.
    kt: &'a mut [f32],
    /// One V tile: `vt[j·dv + c]`, rows past the keys zero.
    vt: &'a mut [f32],
    /// Q rows of the unit's heads: `q[(g·Q_TILE + r)·dk + d]`.
    q: &'a mut [f32],
    /// Accumulators: `acc[(g·Q_TILE + r)·dv + c]`.
    acc: &'a mut [f32],
    /// Running maximum and sum per row (`g·Q_TILE + r`).
    m: &'a mut [f32],
    sum: &'a mut [f32],
    /// Scores, probabilities and `slope·mask` of one head: `[r·KV_TILE + j]`.
    s: &'a mut [f32],
    p: &'a mut [f32],
    mask: &'a mut [f32],
    /// One K row before it is transposed.
    krow: &'a mut [f32],
}

impl<'a> Scratch<'a> {
    fn split(local: &'a mut [f32], t: &Tiled, dk: usize, dv: usize) -> Scratch<'a> {
        let rows = t.group * Q_TILE;
        let (kt, rest) = local.split_at_mut(dk * KV_TILE);
        let (vt, rest) = rest.split_at_mut(KV_TILE * dv);
        let (q, rest) = rest.split_at_mut(rows * dk);
        let (acc, rest) = rest.split_at_mut(rows * dv);
        let (m, rest) = rest.split_at_mut(rows);
        let (sum, rest) = rest.split_at_mut(rows);
        let (s, rest) = rest.split_at_mut(Q_TILE * KV_TILE);
        let (p, rest) = rest.split_at_mut(Q_TILE * KV_TILE);
        let (mask, rest) = rest.split_at_mut(Q_TILE * KV_TILE);
        let krow = &mut rest[..dk];
        Scratch { kt, vt, q, acc, m, sum, s, p, mask, krow }
    }
}

impl FlashAttn {
    /// One unit: a block of query rows of one group of heads, against every key.
    pub(super) fn run_tiled(&self, t: &Tiled, ctx: &mut Ctx<'_>) {
        let (q, k, v) = (&self.q, &self.k, &self.v);
        let (dk, nq, h, ne3) = (q.ne[0], q.ne[1], q.ne[2], q.ne[3]);
        let dv = v.ne[0];
        let (nkv, hkv) = (k.ne[1], k.ne[2]);
        let rep = h / hkv;
        let rk3 = ne3 / k.ne[3];
        let mut scale = self.scale;
        if self.softcap != 0.0 {
            scale /= self.softcap;
        }

        // Unit → (query block, sequence, KV head, head group); the last blocks first.
        let subs = rep / t.group;
        let per_block = ne3 * hkv * subs;
        let u = ctx.unit;
        let blk = t.blocks - 1 - u / per_block;
        let rest = u % per_block;
        let sub = rest % subs;
        let ik2 = (rest / subs) % hkv;
        let iq3 = rest / (subs * hkv);
        let ik3 = iq3 / rk3;
        let h0 = ik2 * rep + sub * t.group;
        let r0 = blk * Q_TILE;
        let nr = Q_TILE.min(nq - r0);

        let sc = Scratch::split(ctx.local, t, dk, dv);
        for g in 0..t.group {
            for r in 0..nr {
                let row = (g * Q_TILE + r) * dk;
                q.load_row(r0 + r, h0 + g, iq3, &mut sc.q[row..row + dk]);
            }
        }
        sc.acc.fill(0.0);
        sc.m.fill(f32::NEG_INFINITY);
        sc.sum.fill(0.0);
        sc.kt.fill(0.0);

        let qk = Dims { m: nr, k: dk, n: KV_TILE, lda: dk, ldb: KV_TILE, ldc: KV_TILE };
        let pv = Dims { m: nr, k: KV_TILE, n: dv, lda: KV_TILE, ldb: dv, ldc: dv };
        for ic in (0..nkv).step_by(KV_TILE) {
            let kvt = KV_TILE.min(nkv - ic);
            let mut loaded = false;
            // Which head's mask `sc.mask` holds (ALiBi makes it per head), and whether any row lives.
            let mut mask_of: Option<usize> = None;
            let mut live = true;
            for g in 0..t.group {
                let hh = h0 + g;
                let slope = super::alibi_slope(self.max_bias, h, hh);
                if let Some(mk) = &self.mask {
                    let key = if self.max_bias > 0.0 { hh } else { hh % mk.ne[2] };
                    if mask_of != Some(key) {
                        live = false;
                        for r in 0..nr {
                            let out = &mut sc.mask[r * KV_TILE..r * KV_TILE + kvt];
                            load_mask(mk, r0 + r, hh % mk.ne[2], iq3 % mk.ne[3], ic, slope, out);
                            live |= out.iter().any(|&x| x != f32::NEG_INFINITY);
                        }
                        mask_of = Some(key);
                    }
                    if !live {
                        continue;
                    }
                }
                if !loaded {
                    for j in 0..kvt {
                        load_row(k, ic + j, ik2, ik3, sc.krow);
                        for (d, &x) in sc.krow.iter().enumerate() {
                            sc.kt[d * KV_TILE + j] = x;
                        }
                        load_row(v, ic + j, ik2, ik3, &mut sc.vt[j * dv..(j + 1) * dv]);
                    }
                    sc.vt[kvt * dv..].fill(0.0);
                    loaded = true;
                }
                let qg = &sc.q[g * Q_TILE * dk..];
                let s = &mut sc.s[..nr * KV_TILE];
                s.fill(0.0);
                gemm(qk, s, qg, sc.kt);
                let acc = &mut sc.acc[g * Q_TILE * dv..(g * Q_TILE + nr) * dv];
                for r in 0..nr {
                    let srow = &mut s[r * KV_TILE..(r + 1) * KV_TILE];
                    let prow = &mut sc.p[r * KV_TILE..(r + 1) * KV_TILE];
                    for x in srow[..kvt].iter_mut() {
                        *x *= scale;
                    }
                    if self.softcap != 0.0 {
                        for x in srow[..kvt].iter_mut() {
                            *x = x.tanh() * self.softcap;
                        }
                    }
                    srow[kvt..].fill(f32::NEG_INFINITY);
                    if self.mask.is_some() {
                        for (x, mv) in srow[..kvt].iter_mut().zip(&sc.mask[r * KV_TILE..]) {
                            *x += *mv;
                        }
                    }
                    let tile_max = row_max(srow);
                    if tile_max == f32::NEG_INFINITY {
                        prow.fill(0.0);
                        continue;
                    }
                    let i = g * Q_TILE + r;
                    let m_old = sc.m[i];
                    let m_new = m_old.max(tile_max);
                    if m_new > m_old {
                        let ms = (m_old - m_new).exp();
                        acc[r * dv..(r + 1) * dv].iter_mut().for_each(|a| *a *= ms);
                        sc.sum[i] *= ms;
                    }
                    sc.m[i] = m_new;
                    let tile_sum = vexp::soft_max_exp(srow, m_new, prow);
                    sc.sum[i] = (sc.sum[i] as f64 + tile_sum) as f32;
                }
                gemm(pv, acc, &sc.p[..nr * KV_TILE], sc.vt);
            }
        }

        for g in 0..t.group {
            let hh = h0 + g;
            for r in 0..nr {
                let i = g * Q_TILE + r;
                let acc = &mut sc.acc[i * dv..(i + 1) * dv];
                if let Some(sk) = &self.sinks {
                    let s = sk.get_f32(hh, 0, 0, 0);
                    let (mut ms, mut vs) = (1.0f32, 1.0f32);
                    if s > sc.m[i] {
                        ms = (sc.m[i] - s).exp();
                        acc.iter_mut().for_each(|a| *a *= ms);
                    } else {
                        vs = (s - sc.m[i]).exp();
                    }
                    sc.sum[i] = sc.sum[i].mul_add(ms, vs);
                }
                let inv = if sc.sum[i] == 0.0 { 0.0 } else { 1.0 / sc.sum[i] };
                acc.iter_mut().for_each(|a| *a *= inv);
                self.dst.store_row(hh, r0 + r, iq3, acc);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_max_is_ggml_fold() {
        let mut x = vec![f32::NEG_INFINITY; 64];
        assert_eq!(row_max(&x), f32::NEG_INFINITY);
        x[37] = -3.0;
        x[5] = -4.0;
        assert_eq!(row_max(&x), -3.0);
        // NaN followed only by −∞: ggml's fold ends at −∞ (the NaN compares false), so the tile is
        // skipped; a lane-wise max must not turn that into NaN.
        let mut y = vec![f32::NEG_INFINITY; 64];
        y[3] = f32::NAN;
        assert_eq!(row_max(&y), f32::NEG_INFINITY);
        y[63] = f32::NAN;
        assert!(row_max(&y).is_nan());
    }

    #[test]
    fn cut_keeps_scratch_modest_and_units_plenty() {
        // SmolLM2 pp512: 9 heads over 3, d 64: 3 heads per unit, 24 units.
        let t = Tiled::new(512, 9, 3, 1, 64, 64);
        assert_eq!((t.group, t.blocks, t.units(9, 1)), (3, 8, 24));
        // One KV head, one block: split to single heads.
        let t = Tiled::new(64, 8, 1, 1, 128, 128);
        assert_eq!((t.group, t.units(8, 1)), (1, 8));
        // d 256: at most 2 heads per unit.
        let t = Tiled::new(512, 16, 2, 1, 256, 256);
        assert_eq!(t.group, 2);
    }
}
