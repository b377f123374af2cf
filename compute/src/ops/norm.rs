//! RMS_NORM, NORM and L2_NORM: per-row normalisation; GROUP_NORM: normalisation over groups of
//! channels (dim 2), each group's mean and variance taken over all its elements.
//!
//! ref: ggml-compute-semantics.md §3.3 RMS_NORM, NORM. Sums are accumulated in f64 as ggml does;
//! NORM's variance follows the grouping of ggml's AVX2 build (see [`centered_square_sum`]), and
//! rows with strided elements sum in f32 as ggml's scalar fallback for them does.
//! GROUP_NORM (`op_params[0]` = groups, f32 `[1]` = eps) puts `⌈C/groups⌉` channels in a group (the
//! last may have fewer).

use crate::error::Result;
use crate::graph::Node;
use crate::op::GgmlOp;

use super::access::{is_float, Tv};
use super::{check_overlap, param_f32, shape_err, src, tv, types_err, Alias, Ctx, Kind, Plan};

#[derive(Clone, Copy)]
enum Which {
    Rms,
    Layer,
    L2,
    /// Channels per group (the units are the groups).
    Group(usize),
}

/// A planned normalisation.
pub(crate) struct Norm {
    a: Tv,
    dst: Tv,
    which: Which,
    eps: f32,
}

/// Validates RMS_NORM / NORM / L2_NORM.
///
/// # Safety
/// As `ops::prepare`.
pub(crate) unsafe fn prepare(n: &Node) -> Result<Plan> {
    let op = n.op;
    // SAFETY: forwarded contract.
    let (a, dst) = unsafe { (tv(src(n, 0)?)?, tv(&n.dst)?) };
    if !is_float(a.dtype()) || !is_float(dst.dtype()) {
        return Err(types_err(op, format!("{} -> {}", a.dtype(), dst.dtype())));
    }
    if a.ne != dst.ne {
        return Err(shape_err(op, format!("src0 {:?} vs dst {:?}", a.ne, dst.ne)));
    }
    check_overlap(op, &dst, &a, Alias::RowLocal)?;
    let which = match op {
        GgmlOp::RmsNorm => Which::Rms,
        GgmlOp::Norm => Which::Layer,
        GgmlOp::GroupNorm => {
            let groups = n.op_params[0];
            if groups <= 0 {
                return Err(shape_err(op, format!("{groups} groups")));
            }
            let per = a.ne[2].div_ceil(groups as usize);
            let eps = param_f32(n, 1);
            let mut plan = super::simple(Kind::Norm(Norm { a, dst, which: Which::Group(per), eps }), a.ne[0]);
            plan.units = [(groups as usize).clamp(1, super::MAX_UNITS), 0];
            return Ok(plan);
        }
        _ => Which::L2,
    };
    Ok(super::simple(Kind::Norm(Norm { a, dst, which, eps: param_f32(n, 0) }), a.ne[0]))
}

impl Norm {
    /// GROUP_NORM: this unit's share of the groups of `per` channels.
    fn run_groups(&self, per: usize, ctx: &mut Ctx<'_>) {
        let (a, d) = (&self.a, &self.dst);
        let (n0, n1, c) = (a.ne[0], a.ne[1], a.ne[2]);
        let groups = c.div_ceil(per.max(1));
        for g in ctx.range(groups) {
            let (start, end) = (g * per, ((g + 1) * per).min(c));
            let count = (n0 * n1 * (end - start)) as f64;
            for i3 in 0..a.ne[3] {
                let x = &mut ctx.local[..n0];
                let mut sum = 0.0f64;
                for i2 in start..end {
                    for i1 in 0..n1 {
                        a.load_row(i1, i2, i3, x);
                        sum += x.iter().map(|&v| v as f64).sum::<f64>();
                    }
                }
                let mean = (sum / count) as f32;
                let mut sum2 = 0.0f64;
                for i2 in start..end {
                    for i1 in 0..n1 {
                        a.load_row(i1, i2, i3, x);
                        let mut r = 0.0f64;
                        for v in x.iter_mut() {
                            *v -= mean;
                            r += (*v * *v) as f64;
                        }
                        sum2 += r;
                        d.store_row(i1, i2, i3, x);
                    }
                }
                let scale = 1.0f32 / ((sum2 / count) as f32 + self.eps).sqrt();
                for i2 in start..end {
                    for i1 in 0..n1 {
                        d.load_row(i1, i2, i3, x);
                        x.iter_mut().for_each(|v| *v *= scale);
                        d.store_row(i1, i2, i3, x);
                    }
                }
            }
        }
    }

    pub(crate) fn run(&self, ctx: &mut Ctx<'_>) {
        if let Which::Group(per) = self.which {
            return self.run_groups(per, ctx);
        }
        let n0 = self.a.ne[0];
        for r in ctx.range(self.dst.nrows()) {
            let (i1, i2, i3) = self.dst.unravel_row(r);
            let x = &mut ctx.local[..n0];
            self.a.load_row(i1, i2, i3, x);
            match self.which {
                Which::Rms => {
                    // The square is rounded to f32 before it is summed in f64, as ggml does.
                    let sum: f64 = x.iter().map(|&v| (v * v) as f64).sum();
                    let mean = (sum / n0 as f64) as f32;
                    let scale = 1.0 / (mean + self.eps).sqrt();
                    x.iter_mut().for_each(|v| *v *= scale);
                }
                Which::Layer if self.a.packed && self.dst.packed => {
                    // ggml's vector path: the f64 sum rounded to f32, then divided in f32.
                    let sum: f64 = x.iter().map(|&v| v as f64).sum();
                    let mean = sum as f32 / n0 as f32;
                    x.iter_mut().for_each(|v| *v -= mean);
                    let var = (centered_square_sum(x) / n0 as f64) as f32;
                    let scale = 1.0 / (var + self.eps).sqrt();
                    x.iter_mut().for_each(|v| *v *= scale);
                }
                Which::Layer => {
                    // ggml's path for strided rows sums in f32.
                    let mean = x.iter().fold(0.0f32, |s, &v| s + v) / n0 as f32;
                    let mut var = 0.0f32;
                    for v in x.iter_mut() {
                        *v -= mean;
                        var += *v * *v;
                    }
                    let scale = 1.0 / (var / n0 as f32 + self.eps).sqrt();
                    x.iter_mut().for_each(|v| *v *= scale);
                }
                Which::Group(_) => {}
                Which::L2 => {
                    let sum: f64 = x.iter().map(|&v| (v as f64) * (v as f64)).sum();
                    let scale = 1.0 / (sum as f32).sqrt().max(self.eps);
                    x.iter_mut().for_each(|v| *v *= scale);
                }
            }
            self.dst.store_row(i1, i2, i3, x);
        }
    }
}

/// The sum of squares of the centred row `d` as ggml's x86 build takes it for NORM
/// (`ggml_vec_cvar_f32`, AVX2 path): f32 squares, each group of 8 summed in f32 as the AVX
/// reduction does (lane j + lane j+4, then (0+2) + (1+3)) and added to an f64 total; the tail of
/// fewer than 8 added one f32 square at a time.
fn centered_square_sum(d: &[f32]) -> f64 {
    let mut groups = d.chunks_exact(8);
    let mut sum = 0.0f64;
    for g in &mut groups {
        let q: [f32; 8] = std::array::from_fn(|j| g[j] * g[j]);
        let h: [f32; 4] = std::array::from_fn(|j| q[j + 4] + q[j]);
        sum += ((h[0] + h[2]) + (h[1] + h[3])) as f64;
    }
    for &v in groups.remainder() {
        sum += (v * v) as f64;
    }
    sum
}
