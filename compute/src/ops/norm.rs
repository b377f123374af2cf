//! RMS_NORM, NORM and L2_NORM: per-row normalisation.
//!
//! ref: ggml-compute-semantics.md §3.3 RMS_NORM, NORM. Sums are accumulated in f64 as ggml does.

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
        _ => Which::L2,
    };
    Ok(super::simple(Kind::Norm(Norm { a, dst, which, eps: param_f32(n, 0) }), a.ne[0]))
}

impl Norm {
    pub(crate) fn run(&self, ctx: &mut Ctx<'_>) {
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
                Which::Layer => {
                    let sum: f64 = x.iter().map(|&v| v as f64).sum();
                    let mean = (sum / n0 as f64) as f32;
                    let mut var = 0.0f64;
                    for v in x.iter_mut() {
                        *v -= mean;
                        var += (*v as f64) * (*v as f64);
                    }
                    let var = (var / n0 as f64) as f32;
                    let scale = 1.0 / (var + self.eps).sqrt();
                    x.iter_mut().for_each(|v| *v *= scale);
                }
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
