//! The gradient ops a master sends when it trains or fine-tunes through a worker (llama.cpp's
//! `ggml-opt`): SILU_BACK, RMS_NORM_BACK, SOFT_MAX_BACK, REPEAT_BACK, GET_ROWS_BACK,
//! CROSS_ENTROPY_LOSS, CROSS_ENTROPY_LOSS_BACK and OPT_STEP_SGD. (ROPE_BACK is ROPE with the sine
//! negated, in `rope`.)
//!
//! Formulas (row = a row along dim 0; `dy` the incoming gradient):
//! - SILU_BACK(dy, x): `dy · s · (1 + x·(1 − s))`, `s = sigmoid(x)`.
//! - RMS_NORM_BACK(dz, x; eps): with `Sxx = Σx²`, `Sxz = Σx·dz` (f64), `r = 1/√(Sxx/n + eps)`:
//!   `(x · (−Sxz/(Sxx + eps·n)) + dz) · r`.
//! - SOFT_MAX_BACK(dy, y; scale): `(dy − Σy·dy) · y · scale` (ALiBi is refused, as ggml does).
//! - REPEAT_BACK: the sum of every repetition of each destination element.
//! - GET_ROWS_BACK(g, ids): destination row `r` = Σ of the rows `i` of `g` with `ids[i] = r`.
//! - CROSS_ENTROPY_LOSS(logits, labels): `−Σ_rows Σ labels · log_softmax(logits) / rows`.
//! - CROSS_ENTROPY_LOSS_BACK(dl, logits, labels): `(softmax(logits) − labels) · dl / rows`.
//! - OPT_STEP_SGD(x, g, [α, wd]): `x · (1 − α·wd) − α·g`, written over `x` (the destination is a
//!   view of `x`).
//! - FLASH_ATTN_BACK: see [`FlashBack`].
//! - OPT_STEP_ADAMW(x, g, m, v, [α, β1, β2, eps, wd, β1h, β2h]): `m ← m·β1 + g·(1 − β1)`,
//!   `v ← v·β2 + g²·(1 − β2)`, `x ← x·(1 − α·wd) − α·(m·β1h)/(√(v·β2h) + eps)`; `m` and `v` are
//!   updated in their own buffers (sources the op writes, as ggml's does), `x` through the
//!   destination (a view of `x`).

use crate::dtype::GgmlType;
use crate::error::{Error, Result};
use crate::graph::Node;
use crate::op::GgmlOp;

use super::access::Tv;
use super::{check_overlap, param_f32, shape_err, tv, types_err, Alias, Ctx, Kind, Plan};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Which {
    SiluBack,
    RmsNormBack { eps: f32 },
    SoftMaxBack { scale: f32 },
    RepeatBack,
    GetRowsBack,
    CrossEntropy,
    CrossEntropyBack,
    SgdStep,
    AdamwStep,
}

/// A planned gradient op.
pub(crate) struct Backward {
    dst: Tv,
    s: [Option<Tv>; 5],
    which: Which,
}

/// Validates one of the gradient ops.
///
/// # Safety
/// As `ops::prepare`.
pub(crate) unsafe fn prepare(n: &Node) -> Result<Plan> {
    let op = n.op;
    // SAFETY: forwarded contract.
    let dst = unsafe { tv(&n.dst)? };
    let mut s: [Option<Tv>; 5] = [None; 5];
    for (k, slot) in s.iter_mut().enumerate() {
        if let Some(t) = n.src[k].as_ref() {
            // SAFETY: forwarded contract.
            *slot = Some(unsafe { tv(t)? });
        }
    }
    let need = |k: usize| -> Result<Tv> { s[k].ok_or_else(|| shape_err(op, format!("missing src[{k}]"))) };
    let all_f32 = |ts: &[&Tv]| ts.iter().all(|t| t.dtype() == GgmlType::F32);
    let (which, units) = match op {
        GgmlOp::SiluBack | GgmlOp::RmsNormBack | GgmlOp::SoftMaxBack => {
            let (a, b) = (need(0)?, need(1)?);
            if !all_f32(&[&a, &b, &dst]) || a.ne != b.ne || a.ne != dst.ne {
                return Err(shape_err(
                    op,
                    format!("{:?} / {:?} -> {:?} (F32, same shapes)", a.ne, b.ne, dst.ne),
                ));
            }
            let which = match op {
                GgmlOp::SiluBack => Which::SiluBack,
                GgmlOp::RmsNormBack => Which::RmsNormBack { eps: param_f32(n, 0) },
                _ => {
                    if param_f32(n, 1) != 0.0 {
                        return Err(Error::UnsupportedOp { op, detail: "SOFT_MAX_BACK with ALiBi".into() });
                    }
                    Which::SoftMaxBack { scale: param_f32(n, 0) }
                }
            };
            (which, 0)
        }
        GgmlOp::RepeatBack => {
            let a = need(0)?;
            if !all_f32(&[&a, &dst]) || (0..4).any(|k| dst.ne[k] == 0 || a.ne[k] % dst.ne[k] != 0) {
                return Err(shape_err(op, format!("{:?} does not fold to {:?}", a.ne, dst.ne)));
            }
            (Which::RepeatBack, 0)
        }
        GgmlOp::GetRowsBack => {
            let (g, ids) = (need(0)?, need(1)?);
            if !all_f32(&[&g, &dst]) || ids.dtype() != GgmlType::I32 {
                return Err(types_err(op, "F32 gradients, I32 row ids"));
            }
            if g.ne[2] != 1
                || g.ne[3] != 1
                || ids.nelements() != g.ne[1]
                || ids.ne[0] != g.ne[1]
                || dst.ne[0] != g.ne[0]
                || dst.ne[2] != 1
                || dst.ne[3] != 1
            {
                return Err(shape_err(op, format!("rows {:?}, ids {:?} -> {:?}", g.ne, ids.ne, dst.ne)));
            }
            (Which::GetRowsBack, 0)
        }
        GgmlOp::CrossEntropyLoss => {
            let (a, b) = (need(0)?, need(1)?);
            if !all_f32(&[&a, &b, &dst]) || a.ne != b.ne || dst.ne != [1, 1, 1, 1] {
                return Err(shape_err(op, format!("{:?} / {:?} -> {:?}", a.ne, b.ne, dst.ne)));
            }
            (Which::CrossEntropy, 1)
        }
        GgmlOp::CrossEntropyLossBack => {
            let (dl, a, b) = (need(0)?, need(1)?, need(2)?);
            if !all_f32(&[&dl, &a, &b, &dst]) || dl.nelements() != 1 || a.ne != b.ne || a.ne != dst.ne {
                return Err(shape_err(op, format!("{:?}: {:?} / {:?} -> {:?}", dl.ne, a.ne, b.ne, dst.ne)));
            }
            (Which::CrossEntropyBack, 0)
        }
        GgmlOp::OptStepSgd => {
            let (x, g, p) = (need(0)?, need(1)?, need(2)?);
            if !all_f32(&[&x, &g, &p, &dst]) || x.ne != g.ne || x.ne != dst.ne || p.nelements() != 2 {
                return Err(shape_err(op, format!("x {:?}, grad {:?}, params {:?}", x.ne, g.ne, p.ne)));
            }
            // The destination is the parameters themselves (a view of src0).
            check_overlap(op, &dst, &x, Alias::RowLocal)?;
            for t in [&g, &p] {
                check_overlap(op, &dst, t, Alias::Never)?;
            }
            let mut plan =
                super::simple(Kind::Backward(Box::new(Backward { dst, s, which: Which::SgdStep })), 0);
            // `run_rows` takes four rows of scratch whichever op it runs.
            plan.local_f32 = 4 * dst.ne[0];
            return Ok(plan);
        }
        GgmlOp::OptStepAdamw => {
            let (x, g, m, v, p) = (need(0)?, need(1)?, need(2)?, need(3)?, need(4)?);
            let same = [&g, &m, &v, &dst].iter().all(|t| t.ne == x.ne);
            if !all_f32(&[&x, &g, &m, &v, &p, &dst]) || !same || p.nelements() != 7 {
                return Err(shape_err(
                    op,
                    format!("x {:?}, grad {:?}, m {:?}, v {:?}, params {:?}", x.ne, g.ne, m.ne, v.ne, p.ne),
                ));
            }
            // The destination is the parameters themselves (a view of src0); the moments are
            // written in place, each row by the unit that reads it.
            check_overlap(op, &dst, &x, Alias::RowLocal)?;
            for t in [&g, &m, &v, &p] {
                check_overlap(op, &dst, t, Alias::Never)?;
            }
            for (i, t) in [&g, &x, &v, &p].into_iter().enumerate() {
                check_overlap(op, &m, t, Alias::Never)
                    .map_err(|_| shape_err(op, format!("m overlaps source {i}")))?;
            }
            for t in [&g, &x, &p] {
                check_overlap(op, &v, t, Alias::Never)
                    .map_err(|_| shape_err(op, "v overlaps another source"))?;
            }
            if !m.self_disjoint() || !v.self_disjoint() {
                return Err(shape_err(op, "m and v must not overlap themselves"));
            }
            let mut plan =
                super::simple(Kind::Backward(Box::new(Backward { dst, s, which: Which::AdamwStep })), 0);
            plan.local_f32 = 4 * dst.ne[0];
            return Ok(plan);
        }
        _ => return Err(Error::UnsupportedOp { op, detail: "not a gradient op".into() }),
    };
    for t in s.iter().flatten() {
        check_overlap(op, &dst, t, Alias::Never)?;
    }
    let width = s.iter().flatten().map(|t| t.ne[0]).max().unwrap_or(0).max(dst.ne[0]);
    let mut plan = super::simple(Kind::Backward(Box::new(Backward { dst, s, which })), 4 * width);
    if units > 0 {
        plan.units = [units, 0];
    }
    Ok(plan)
}

impl Backward {
    fn src(&self, k: usize) -> &Tv {
        self.s[k].as_ref().expect("validated source")
    }

    pub(crate) fn run(&self, op: GgmlOp, ctx: &mut Ctx<'_>) {
        let d = &self.dst;
        match self.which {
            Which::CrossEntropy => {
                if ctx.unit == 0 {
                    let (a, b) = (self.src(0), self.src(1));
                    let n0 = a.ne[0];
                    let mut total = 0.0f64;
                    for r in 0..a.nrows() {
                        let (i1, i2, i3) = a.unravel_row(r);
                        let (x, rest) = ctx.local.split_at_mut(n0);
                        let y = &mut rest[..n0];
                        a.load_row(i1, i2, i3, x);
                        b.load_row(i1, i2, i3, y);
                        let max = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
                        let sum: f64 = x.iter().map(|&v| ((v - max).exp()) as f64).sum();
                        let ls = (sum.ln()) as f32;
                        let row: f64 =
                            x.iter().zip(y.iter()).map(|(&v, &l)| ((v - max - ls) * l) as f64).sum();
                        total += row;
                    }
                    d.set_f32(0, 0, 0, 0, (-total / a.nrows() as f64) as f32);
                }
            }
            Which::RepeatBack => {
                let a = self.src(0);
                let reps: [usize; 4] = std::array::from_fn(|k| a.ne[k] / d.ne[k]);
                for r in ctx.range(d.nrows()) {
                    let (i1, i2, i3) = d.unravel_row(r);
                    for i0 in 0..d.ne[0] {
                        let mut sum = 0.0f32;
                        for r3 in 0..reps[3] {
                            for r2 in 0..reps[2] {
                                for r1 in 0..reps[1] {
                                    for r0 in 0..reps[0] {
                                        sum += a.get_f32(
                                            i0 + r0 * d.ne[0],
                                            i1 + r1 * d.ne[1],
                                            i2 + r2 * d.ne[2],
                                            i3 + r3 * d.ne[3],
                                        );
                                    }
                                }
                            }
                        }
                        d.set_f32(i0, i1, i2, i3, sum);
                    }
                }
            }
            Which::GetRowsBack => {
                let (g, ids) = (self.src(0), self.src(1));
                let mut bad = 0usize;
                for r in ctx.range(d.nrows()) {
                    let (i1, _, _) = d.unravel_row(r);
                    let row = &mut ctx.local[..d.ne[0]];
                    row.fill(0.0);
                    for i in 0..g.ne[1] {
                        let id = ids.get_index(i, 0, 0, 0);
                        if id < 0 || id as usize >= d.ne[1] {
                            bad += 1;
                            continue;
                        }
                        if id as usize == i1 {
                            for (i0, v) in row.iter_mut().enumerate() {
                                *v += g.get_f32(i0, i, 0, 0);
                            }
                        }
                    }
                    d.store_row(i1, 0, 0, row);
                }
                if bad > 0 && ctx.unit == 0 {
                    ctx.errors.report(Error::IndexOutOfRange {
                        op,
                        detail: format!("row ids outside 0..{}", d.ne[1]),
                    });
                }
            }
            _ => self.run_rows(ctx),
        }
    }

    /// The row-wise ops: each destination row from the same rows of the sources.
    fn run_rows(&self, ctx: &mut Ctx<'_>) {
        let d = &self.dst;
        let n0 = d.ne[0];
        for r in ctx.range(d.nrows()) {
            let (i1, i2, i3) = d.unravel_row(r);
            let (a, rest) = ctx.local.split_at_mut(n0);
            let (b, rest) = rest.split_at_mut(n0);
            let (c, rest) = rest.split_at_mut(n0);
            let e = &mut rest[..n0];
            match self.which {
                Which::SiluBack => {
                    self.src(0).load_row(i1, i2, i3, a);
                    self.src(1).load_row(i1, i2, i3, b);
                    for (dy, &x) in a.iter_mut().zip(b.iter()) {
                        let s = 1.0 / (1.0 + (-x).exp());
                        *dy = *dy * s * (1.0 + x * (1.0 - s));
                    }
                }
                Which::RmsNormBack { eps } => {
                    self.src(0).load_row(i1, i2, i3, a);
                    self.src(1).load_row(i1, i2, i3, b);
                    let sxx: f64 = b.iter().map(|&x| (x * x) as f64).sum();
                    let sxz: f64 = b.iter().zip(a.iter()).map(|(&x, &z)| (x * z) as f64).sum();
                    let mean_eps = (sxx / n0 as f64 + eps as f64) as f32;
                    let sum_eps = (sxx + eps as f64 * n0 as f64) as f32;
                    let rrms = 1.0 / mean_eps.sqrt();
                    let k = (-sxz) as f32 / sum_eps;
                    for (z, &x) in a.iter_mut().zip(b.iter()) {
                        *z = (x * k + *z) * rrms;
                    }
                }
                Which::SoftMaxBack { scale } => {
                    self.src(0).load_row(i1, i2, i3, a);
                    self.src(1).load_row(i1, i2, i3, b);
                    let dot: f64 = a.iter().zip(b.iter()).map(|(&dy, &y)| (dy * y) as f64).sum();
                    let dot = dot as f32;
                    for (dy, &y) in a.iter_mut().zip(b.iter()) {
                        *dy = (*dy - dot) * y * scale;
                    }
                }
                Which::CrossEntropyBack => {
                    let dl = self.src(0).get_f32(0, 0, 0, 0);
                    let rows = d.nrows() as f32;
                    self.src(1).load_row(i1, i2, i3, a);
                    self.src(2).load_row(i1, i2, i3, b);
                    let max = a.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
                    let mut sum = 0.0f64;
                    for (e, &v) in c.iter_mut().zip(a.iter()) {
                        *e = (v - max).exp();
                        sum += *e as f64;
                    }
                    let inv = (1.0 / sum) as f32;
                    for ((o, &e), &l) in a.iter_mut().zip(c.iter()).zip(b.iter()) {
                        *o = (e * inv - l) * (dl / rows);
                    }
                }
                Which::SgdStep => {
                    let p = self.src(2);
                    let (alpha, wd) = (p.get_f32(0, 0, 0, 0), p.get_f32(1, 0, 0, 0));
                    let keep = 1.0 - alpha * wd;
                    self.src(0).load_row(i1, i2, i3, a);
                    self.src(1).load_row(i1, i2, i3, b);
                    for (x, &g) in a.iter_mut().zip(b.iter()) {
                        // As ggml's x86 build contracts it.
                        *x = x.mul_add(keep, -(alpha * g));
                    }
                }
                Which::AdamwStep => {
                    let p = self.src(4);
                    let h: [f32; 7] = std::array::from_fn(|k| {
                        let (k0, k1) = (k % p.ne[0], k / p.ne[0]);
                        p.get_f32(k0, k1 % p.ne[1], (k1 / p.ne[1]) % p.ne[2], k1 / (p.ne[1] * p.ne[2]))
                    });
                    let [alpha, beta1, beta2, eps, wd, beta1h, beta2h] = h;
                    let keep = 1.0 - alpha * wd;
                    let (m, v) = (self.src(2), self.src(3));
                    self.src(0).load_row(i1, i2, i3, a);
                    self.src(1).load_row(i1, i2, i3, b);
                    m.load_row(i1, i2, i3, c);
                    v.load_row(i1, i2, i3, e);
                    for (((x, &g), mi), vi) in a.iter_mut().zip(b.iter()).zip(c.iter_mut()).zip(e.iter_mut())
                    {
                        // Products fused into the sums as ggml's x86 build contracts them.
                        *mi = mi.mul_add(beta1, g * (1.0 - beta1));
                        *vi = vi.mul_add(beta2, g * g * (1.0 - beta2));
                        let mh = *mi * beta1h;
                        let vh = (*vi * beta2h).sqrt() + eps;
                        *x = x.mul_add(keep, -(alpha * mh / vh));
                    }
                    m.store_row(i1, i2, i3, c);
                    v.store_row(i1, i2, i3, e);
                }
                _ => unreachable!("not a row-wise gradient op"),
            }
            d.store_row(i1, i2, i3, a);
        }
    }
}

/// GGML_SOFT_MAX_UNROLL: FLASH_ATTN_BACK's softmax runs over the key count rounded up to it.
const SOFT_MAX_UNROLL: usize = 4;
/// ggml's tensor data alignment: the three gradients in FLASH_ATTN_BACK's result start at multiples.
const MEM_ALIGN: usize = 16;

/// A planned FLASH_ATTN_BACK: the gradients of `softmax(q·kᵀ/√D) · v` (causal when masked) for
/// q {D, N, H, B}, k {D, M, H_k, B}, v transposed {M, D, H_k, B} and the output gradient d {D, N, H,
/// B}, written into one flat F32 result: grad q (shaped as q), then grad k (rows of D for each key,
/// head and batch, heads strided as q's), then grad v (as v), each starting at a 16-byte multiple.
/// Per query row (keys `0..mb`, `mb = M − N + i + 1` when masked):
/// `s = k·q/√D`, `p = softmax(s)`, `g = v·d`, `g = (g − p·g)·p/√D`; then
/// `grad q += Σ_j g[j]·k_j`, `grad k_j += g[j]·q`, `grad v[:, c] += d[c]·p`, every sum in ggml's
/// order (keys, then query rows, then heads of a group) with its fused multiply-adds, the dot
/// products through the F32 dot kernel (ggml's `vec_dot_f32` order on AVX2): ggml's bit for bit.
pub(crate) struct FlashBack {
    q: Tv,
    k: Tv,
    v: Tv,
    d: Tv,
    dst: Tv,
    masked: bool,
    /// Float offsets of grad k and grad v in the result.
    offs: [usize; 2],
}

/// Validates FLASH_ATTN_BACK.
///
/// # Safety
/// As `ops::prepare`.
pub(crate) unsafe fn prepare_flash_back(n: &Node) -> Result<Plan> {
    let op = n.op;
    let mut t = Vec::with_capacity(4);
    for i in 0..4 {
        let s = n.src[i].as_ref().ok_or_else(|| shape_err(op, format!("missing src[{i}]")))?;
        // SAFETY: forwarded contract.
        t.push(unsafe { tv(s)? });
    }
    // SAFETY: forwarded contract.
    let dst = unsafe { tv(&n.dst)? };
    let (q, k, v, d) = (t[0], t[1], t[2], t[3]);
    if [&q, &k, &v, &d, &dst].iter().any(|x| x.dtype() != GgmlType::F32) {
        return Err(types_err(op, "FLASH_ATTN_BACK takes F32 tensors"));
    }
    let (dd, nq, m) = (q.ne[0], q.ne[1], k.ne[1]);
    let shapes = k.ne[0] == dd
        && m >= nq
        && v.ne == [m, dd, k.ne[2], k.ne[3]]
        && d.ne == q.ne
        && k.ne[2] > 0
        && q.ne[2] % k.ne[2] == 0
        && k.ne[3] == q.ne[3];
    let pad = |x: usize| x.next_multiple_of(MEM_ALIGN);
    let offs_k = pad(4 * q.nelements());
    let offs_v = offs_k + pad(4 * k.nelements());
    let end = offs_v + 4 * v.nelements();
    if !shapes || dst.nrows() != 1 || 4 * dst.ne[0] < end {
        return Err(shape_err(
            op,
            format!("q {:?}, k {:?}, v {:?}, d {:?} -> {:?}", q.ne, k.ne, v.ne, d.ne, dst.ne),
        ));
    }
    for s in [&q, &k, &v, &d] {
        check_overlap(op, &dst, s, Alias::Never)?;
    }
    let mup = m.next_multiple_of(SOFT_MAX_UNROLL);
    let local = 2 * mup + 3 * dd + m;
    let masked = n.op_params[0] != 0;
    let fb = FlashBack { q, k, v, d, dst, masked, offs: [offs_k / 4, offs_v / 4] };
    // Phase 0 zeroes the result, phase 1 accumulates into it.
    let mut plan = super::simple(Kind::FlashBack(Box::new(fb)), local);
    plan.phases = 2;
    plan.units = [(end / 4096).clamp(1, super::MAX_UNITS), (k.ne[2] * k.ne[3]).clamp(1, super::MAX_UNITS)];
    Ok(plan)
}

impl FlashBack {
    /// Each unit takes some key heads: every query row of the heads sharing them, in order.
    pub(crate) fn run(&self, ctx: &mut Ctx<'_>) {
        let (q, k, v, d, out) = (&self.q, &self.k, &self.v, &self.d, &self.dst);
        let (dd, nq, m) = (q.ne[0], q.ne[1], k.ne[1]);
        let (hq, hk) = (q.ne[2], k.ne[2]);
        let mup = m.next_multiple_of(SOFT_MAX_UNROLL);
        let scale = 1.0 / (dd as f32).sqrt();
        let dot = crate::quant::kernels(GgmlType::F32).vec_dot.expect("F32 has a dot kernel");
        let dotf = |n: usize, x: &[f32], y: &[f32]| {
            dot(n, bytemuck::cast_slice(&x[..n]), bytemuck::cast_slice(&y[..n]))
        };
        // Flat indices of the three gradients (grad k's heads strided by q's head count, as ggml).
        let gq = |j: usize, i: usize, h: usize, b: usize| j + dd * (i + nq * (h + hq * b));
        let gk = |j: usize, i: usize, h: usize, b: usize| self.offs[0] + j + dd * (i + m * (h + hq * b));
        let gv = |i: usize, c: usize, h: usize, b: usize| self.offs[1] + i + m * (c + dd * (h + hq * b));
        let mad =
            |at: usize, x: f32, s: f32| out.set_f32(at, 0, 0, 0, x.mul_add(s, out.get_f32(at, 0, 0, 0)));
        for r in ctx.range(hk * k.ne[3]) {
            let (h2, b) = (r % hk, r / hk);
            let (s, rest) = ctx.local[..2 * mup + 3 * dd + m].split_at_mut(mup);
            let (sm, rest) = rest.split_at_mut(mup);
            let (qr, rest) = rest.split_at_mut(dd);
            let (kr, rest) = rest.split_at_mut(dd);
            let (gqr, vr) = rest.split_at_mut(dd);
            for rep in 0..hq / hk {
                let h = h2 + rep * hk;
                for i in 0..nq {
                    let mb = if self.masked { m - nq + i + 1 } else { m };
                    q.load_row(i, h, b, qr);
                    for (j, sj) in s[..mb].iter_mut().enumerate() {
                        k.load_row(j, h2, b, kr);
                        *sj = dotf(dd, kr, qr) * scale;
                    }
                    s[mb..].fill(f32::NEG_INFINITY);
                    let max = s[..mb].iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    let sum = super::vexp::soft_max_exp(s, max, sm);
                    let inv = (1.0 / sum) as f32;
                    sm[..mb].iter_mut().for_each(|p| *p *= inv);
                    // g = v·d over the live keys.
                    s[..mb].fill(0.0);
                    for c in 0..dd {
                        v.load_row(c, h2, b, vr);
                        let dc = d.get_f32(c, i, h, b);
                        for (sj, &vj) in s[..mb].iter_mut().zip(vr.iter()) {
                            *sj = vj.mul_add(dc, *sj);
                        }
                    }
                    let pg = dotf(mb, sm, s);
                    for (sj, &p) in s[..mb].iter_mut().zip(sm.iter()) {
                        *sj = (*sj + -pg) * p * scale;
                    }
                    gqr.fill(0.0);
                    for (j, &sj) in s[..mb].iter().enumerate() {
                        k.load_row(j, h2, b, kr);
                        for (g, &kv) in gqr.iter_mut().zip(kr.iter()) {
                            *g = kv.mul_add(sj, *g);
                        }
                        for (c, &qv) in qr.iter().enumerate() {
                            mad(gk(c, j, h2, b), qv, sj);
                        }
                    }
                    for (c, &g) in gqr.iter().enumerate() {
                        out.set_f32(gq(c, i, h, b), 0, 0, 0, g);
                    }
                    for c in 0..dd {
                        let dc = d.get_f32(c, i, h, b);
                        for (j, &p) in sm[..mb].iter().enumerate() {
                            mad(gv(j, c, h2, b), p, dc);
                        }
                    }
                }
            }
        }
    }

    /// Zeroes the result (ggml's gradients start at 0, the padding between them included).
    pub(crate) fn clear(&self, ctx: &mut Ctx<'_>) {
        for j in ctx.range(self.dst.ne[0]) {
            self.dst.set_f32(j, 0, 0, 0, 0.0);
        }
    }
}
