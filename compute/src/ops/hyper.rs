//! DeepSeek-V4's hyper-connection ops (DSV4_HC_COMB, DSV4_HC_PRE, DSV4_HC_POST) and its sparse
//! attention's LIGHTNING_INDEXER. All F32 (LIGHTNING_INDEXER's keys may be any type with a row
//! conversion, its mask F16).
//!
//! - **DSV4_HC_COMB** (src0 `mixes` {(2+hc)·hc, T}, src1 `scale` {≥3}, src2 `base` {(2+hc)·hc};
//!   op_params f32 `eps`, i32 `n_iter` > 0; dst {hc, hc, T}, hc = 4): per token, the logits
//!   `l[d, s] = mixes[2hc + d + hc·s]·scale[2] + base[2hc + d + hc·s]`, a softmax over `d` for each
//!   `s` plus `eps`, then Sinkhorn normalisation: columns (`eps` + Σ over `s`), then `n_iter − 1`
//!   times rows (Σ over `d`) and columns again. dst `[d, s, t]`.
//! - **DSV4_HC_PRE** (src0 `x` {E, hc, T}, src1 `w` {hc, T}; dst {E, T}):
//!   `scale·Σ_h x[i, h, t]·w[h, t]`, `scale` f32 op_params\[0\] (1 from ggml's constructor). With
//!   op_params i32\[1\] ≠ 0 (the gated form), src1 is a gate `g` shaped as `x` and the result is
//!   `scale·Σ_h x[i, h, t]·σ(g[i, h, t])`.
//! - **DSV4_HC_POST** (src0 `x` {E, T}, src1 `residual` {E, hc, T}, src2 `post` {hc, T}, src3
//!   `comb` {hc, hc, T} or absent; dst {E, hc, T}): `x[i, t]·post[d, t] + Σ_s residual[i, s, t]·
//!   comb[d, s, t]`; without `comb`, `x[i, t]·post[d, t] + residual[i, d, t]`.
//! - **LIGHTNING_INDEXER** (src0 `q` {E, H, T, S}, src1 `k` {E, 1, n_kv, S}, src2 `w` {H, T, 1, S},
//!   src3 `mask` F16 {n_kv, T, 1, S'} with S' dividing S; dst {n_kv, T, 1, S}):
//!   `Σ_h max(q[·, h, t, s]·k[·, 0, j, s], 0)·w[h, t, s] + mask[j, t, s mod S']`.
//!
//! The arithmetic is ggml's x86 build's: sums in its loop order, the products its compiler fuses
//! into the sums fused here (`mul_add`), the q·k dot products through the active F32 dot kernel
//! (ggml's `vec_dot_f32` order on AVX2), exp the C library's.

use crate::dtype::GgmlType;
use crate::error::{Error, Result};
use crate::graph::Node;
use crate::op::GgmlOp;

use super::access::Tv;
use super::{check_overlap, param_f32, shape_err, tv, types_err, Alias, Ctx, Kind, Plan};

/// Streams of a hyper-connection (ggml fixes it at 4).
const HC: usize = 4;

/// The op and its parameters.
#[derive(Clone, Copy, Debug)]
enum Rule {
    Comb { eps: f32, n_iter: i32 },
    Pre { scale: f32 },
    PreGated { scale: f32 },
    Post { comb: bool },
    Indexer,
}

/// A planned hyper-connection op or lightning indexer.
pub(crate) struct Hyper {
    rule: Rule,
    src: Vec<Tv>,
    dst: Tv,
}

/// Validates DSV4_HC_COMB, DSV4_HC_PRE, DSV4_HC_POST and LIGHTNING_INDEXER.
///
/// # Safety
/// As `ops::prepare`.
pub(crate) unsafe fn prepare(n: &Node) -> Result<Plan> {
    let op = n.op;
    // SAFETY: forwarded contract.
    let dst = unsafe { tv(&n.dst)? };
    let mut src = Vec::new();
    for t in n.src.iter().take(4) {
        match t {
            // SAFETY: forwarded contract.
            Some(t) => src.push(unsafe { tv(t)? }),
            None => break,
        }
    }
    let need =
        |k: usize| -> Result<&Tv> { src.get(k).ok_or_else(|| shape_err(op, format!("missing src[{k}]"))) };
    let f32s = |ts: &[&Tv]| {
        if ts.iter().any(|t| t.dtype() != GgmlType::F32) {
            return Err(types_err(op, "operands must be F32"));
        }
        Ok(())
    };
    let rule = match op {
        GgmlOp::Dsv4HcComb => {
            let (m, sc, b) = (need(0)?, need(1)?, need(2)?);
            f32s(&[m, sc, b, &dst])?;
            let mix = (2 + HC) * HC;
            let (eps, n_iter) = (param_f32(n, 0), n.op_params[1]);
            let t = m.ne[1];
            let ok = m.ne[0] == mix
                && m.ne[2] == 1
                && m.ne[3] == 1
                && sc.ne[0] >= 3
                && b.ne[0] == mix
                && dst.ne == [HC, HC, t, 1]
                && n_iter > 0;
            if !ok {
                return Err(shape_err(
                    op,
                    format!(
                        "mixes {:?}, scale {:?}, base {:?}, {n_iter} iterations -> {:?}",
                        m.ne, sc.ne, b.ne, dst.ne
                    ),
                ));
            }
            Rule::Comb { eps, n_iter }
        }
        GgmlOp::Dsv4HcPre => {
            let (x, w) = (need(0)?, need(1)?);
            f32s(&[x, w, &dst])?;
            let (e, hc, t) = (x.ne[0], x.ne[1], x.ne[2]);
            let gated = n.op_params[1] != 0;
            let w_ok = if gated { w.ne == x.ne } else { w.ne == [hc, t, 1, 1] };
            if x.ne[3] != 1 || !w_ok || dst.ne != [e, t, 1, 1] {
                return Err(shape_err(
                    op,
                    format!("x {:?}, weights {:?} (gated {gated}) -> {:?}", x.ne, w.ne, dst.ne),
                ));
            }
            let scale = param_f32(n, 0);
            if gated {
                Rule::PreGated { scale }
            } else {
                Rule::Pre { scale }
            }
        }
        GgmlOp::Dsv4HcPost => {
            let (x, r, p) = (need(0)?, need(1)?, need(2)?);
            let comb = src.get(3);
            f32s(&[x, r, p, &dst])?;
            let (e, t, hc) = (x.ne[0], x.ne[1], r.ne[1]);
            let comb_ok = comb.is_none_or(|c| c.dtype() == GgmlType::F32 && c.ne == [hc, hc, t, 1]);
            let ok = x.ne[2] == 1
                && x.ne[3] == 1
                && r.ne == [e, hc, t, 1]
                && p.ne == [hc, t, 1, 1]
                && comb_ok
                && dst.ne == [e, hc, t, 1];
            if !ok {
                return Err(shape_err(
                    op,
                    format!(
                        "x {:?}, residual {:?}, post {:?}, comb {:?} -> {:?}",
                        x.ne,
                        r.ne,
                        p.ne,
                        comb.map(|c| c.ne),
                        dst.ne
                    ),
                ));
            }
            Rule::Post { comb: comb.is_some() }
        }
        GgmlOp::LightningIndexer => {
            let (q, k, w, m) = (need(0)?, need(1)?, need(2)?, need(3)?);
            f32s(&[q, w, &dst])?;
            let (e, h, t, s) = (q.ne[0], q.ne[1], q.ne[2], q.ne[3]);
            let n_kv = k.ne[2];
            if m.dtype() != GgmlType::F16 {
                return Err(types_err(op, format!("the mask must be F16, got {}", m.dtype())));
            }
            if !k.can_load() || !k.packed {
                return Err(types_err(op, format!("keys of type {} have no row conversion", k.dtype())));
            }
            let ok = k.ne == [e, 1, n_kv, s]
                && w.ne == [h, t, 1, s]
                && m.ne[0] >= n_kv
                && m.ne[1] >= t
                && m.ne[3] > 0
                && s % m.ne[3] == 0
                && dst.ne == [n_kv, t, 1, s];
            if !ok {
                return Err(shape_err(
                    op,
                    format!(
                        "q {:?}, k {:?}, weights {:?}, mask {:?} -> {:?}",
                        q.ne, k.ne, w.ne, m.ne, dst.ne
                    ),
                ));
            }
            Rule::Indexer
        }
        _ => return Err(Error::UnsupportedOp { op, detail: "not a hyper-connection op".into() }),
    };
    for t in &src {
        check_overlap(op, &dst, t, Alias::Never)?;
    }
    // Scratch: a token's 4×4 combination, or a key row and the token's query rows (one per head).
    let local = match rule {
        Rule::Indexer => src[0].ne[0].saturating_mul(src[0].ne[1].saturating_add(1)),
        _ => HC * HC,
    };
    Ok(super::simple(Kind::Hyper(Box::new(Hyper { rule, src, dst })), local))
}

impl Hyper {
    pub(crate) fn run(&self, ctx: &mut Ctx<'_>) {
        let d = &self.dst;
        for r in ctx.range(d.nrows()) {
            let (i1, i2, i3) = d.unravel_row(r);
            match self.rule {
                Rule::Comb { eps, n_iter } => {
                    // Row (s = i1, t = i2) of the token's combination.
                    let comb = &mut ctx.local[..HC * HC];
                    self.comb(i2, eps, n_iter, comb);
                    for i0 in 0..HC {
                        d.set_f32(i0, i1, i2, 0, comb[i0 + HC * i1]);
                    }
                }
                Rule::Indexer => self.indexer_row(i1, i3, ctx),
                _ => {
                    for i0 in 0..d.ne[0] {
                        let v = self.value(i0, i1, i2);
                        d.set_f32(i0, i1, i2, i3, v);
                    }
                }
            }
        }
    }

    /// DSV4_HC_PRE / DSV4_HC_POST at one destination element.
    fn value(&self, i0: usize, i1: usize, i2: usize) -> f32 {
        let s = &self.src;
        match self.rule {
            Rule::Pre { scale } => {
                let (x, w) = (&s[0], &s[1]);
                let mut sum = 0.0f32;
                for h in 0..x.ne[1] {
                    sum = x.get_f32(i0, h, i1, 0).mul_add(w.get_f32(h, i1, 0, 0), sum);
                }
                scale * sum
            }
            Rule::PreGated { scale } => {
                let (x, g) = (&s[0], &s[1]);
                let mut sum = 0.0f32;
                for h in 0..x.ne[1] {
                    let gate = 1.0 / (1.0 + (-g.get_f32(i0, h, i1, 0)).exp());
                    sum = x.get_f32(i0, h, i1, 0).mul_add(gate, sum);
                }
                scale * sum
            }
            Rule::Post { comb } => {
                let (x, r, p) = (&s[0], &s[1], &s[2]);
                let (dd, t) = (i1, i2);
                let xp = x.get_f32(i0, t, 0, 0);
                if !comb {
                    return xp * p.get_f32(dd, t, 0, 0) + r.get_f32(i0, dd, t, 0);
                }
                let c = &s[3];
                let mut sum = xp * p.get_f32(dd, t, 0, 0);
                for src in 0..r.ne[1] {
                    sum = r.get_f32(i0, src, t, 0).mul_add(c.get_f32(dd, src, t, 0), sum);
                }
                sum
            }
            Rule::Comb { .. } | Rule::Indexer => unreachable!("computed by rows"),
        }
    }

    /// Token `t`'s 4×4 combination, element `(d, s)` at `d + 4s`.
    fn comb(&self, t: usize, eps: f32, n_iter: i32, c: &mut [f32]) {
        let (m, sc, b) = (&self.src[0], &self.src[1], &self.src[2]);
        let scale = sc.get_f32(2, 0, 0, 0);
        const OFF: usize = 2 * HC;
        for s in 0..HC {
            let mut max = f32::NEG_INFINITY;
            for d in 0..HC {
                let j = d + HC * s;
                let v = m.get_f32(OFF + j, t, 0, 0).mul_add(scale, b.get_f32(OFF + j, 0, 0, 0));
                c[j] = v;
                max = max.max(v);
            }
            let mut sum = 0.0f32;
            for d in 0..HC {
                let v = (c[d + HC * s] - max).exp();
                c[d + HC * s] = v;
                sum += v;
            }
            let inv = 1.0 / sum;
            for d in 0..HC {
                c[d + HC * s] = c[d + HC * s].mul_add(inv, eps);
            }
        }
        normalise(c, eps, true);
        for _ in 1..n_iter {
            normalise(c, eps, false);
            normalise(c, eps, true);
        }
    }

    /// Row `(t, s)` of LIGHTNING_INDEXER's scores: every key `j`.
    fn indexer_row(&self, t: usize, st: usize, ctx: &mut Ctx<'_>) {
        let (q, k, w, m) = (&self.src[0], &self.src[1], &self.src[2], &self.src[3]);
        let e = q.ne[0];
        let dot = crate::quant::kernels(GgmlType::F32).vec_dot.expect("F32 has a dot kernel");
        let heads = q.ne[1];
        let (kr, qs) = ctx.local[..e * (heads + 1)].split_at_mut(e);
        // The token's query rows, once for all its keys.
        for (h, qr) in qs.chunks_exact_mut(e.max(1)).enumerate() {
            q.load_row(h, t, st, qr);
        }
        for j in 0..k.ne[2] {
            k.load_row(0, j, st, kr);
            let mut score = 0.0f32;
            for (h, qr) in qs.chunks_exact(e.max(1)).enumerate() {
                let qk = dot(e, bytemuck::cast_slice(qr), bytemuck::cast_slice(kr));
                score = qk.max(0.0).mul_add(w.get_f32(h, t, 0, st), score);
            }
            let v = score + m.get_f32(j, t, 0, st % m.ne[3]);
            self.dst.set_f32(j, t, 0, st, v);
        }
    }
}

/// One Sinkhorn half-step: each column (`cols`: fixed `d`, summed over `s`) or row (fixed `s`) of
/// the 4×4 combination divided by `eps` plus its sum.
fn normalise(c: &mut [f32], eps: f32, cols: bool) {
    for a in 0..HC {
        let at = |b: usize| if cols { a + HC * b } else { b + HC * a };
        let mut sum = eps;
        for b in 0..HC {
            sum += c[at(b)];
        }
        let inv = 1.0 / sum;
        for b in 0..HC {
            c[at(b)] *= inv;
        }
    }
}
