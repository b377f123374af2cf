//! Reductions (SUM, SUM_ROWS, MEAN, ARGMAX, COUNT_EQUAL), running sums (CUMSUM) and sorts
//! (ARGSORT, TOP_K).
//!
//! ref: ggml-compute-semantics.md §3.3 SUM_ROWS, ARGSORT/TOP_K. Sums accumulate in f64. CUMSUM runs
//! in f32 along each row, one addition per element in order (as ggml). COUNT_EQUAL counts equal
//! I32 elements of two same-shaped tensors into one I64. Sorting breaks ties by index, so results
//! are deterministic.

use std::cmp::Ordering;

use crate::dtype::GgmlType;
use crate::error::Result;
use crate::graph::Node;
use crate::op::GgmlOp;

use super::access::{is_float, Tv};
use super::{check_overlap, shape_err, src, tv, types_err, Alias, Ctx, Kind, Plan};

#[derive(Clone, Copy, PartialEq, Eq)]
enum Red {
    Sum,
    SumRows,
    Mean,
    Argmax,
    Cumsum,
    CountEqual,
}

/// A planned reduction.
pub(crate) struct Reduce {
    a: Tv,
    /// COUNT_EQUAL's second operand.
    b: Option<Tv>,
    dst: Tv,
    red: Red,
}

/// Validates SUM / SUM_ROWS / MEAN / ARGMAX.
///
/// # Safety
/// As `ops::prepare`.
pub(crate) unsafe fn prepare(n: &Node) -> Result<Plan> {
    let op = n.op;
    // SAFETY: forwarded contract.
    let (a, dst) = unsafe { (tv(src(n, 0)?)?, tv(&n.dst)?) };
    if op == GgmlOp::CountEqual {
        // SAFETY: forwarded contract.
        let b = unsafe { tv(src(n, 1)?)? };
        if a.dtype() != GgmlType::I32 || b.dtype() != GgmlType::I32 || dst.dtype() != GgmlType::I64 {
            return Err(types_err(op, format!("{} == {} -> {}", a.dtype(), b.dtype(), dst.dtype())));
        }
        if a.ne != b.ne || dst.ne != [1, 1, 1, 1] {
            return Err(shape_err(op, format!("a {:?} b {:?} dst {:?}", a.ne, b.ne, dst.ne)));
        }
        check_overlap(op, &dst, &a, Alias::Never)?;
        check_overlap(op, &dst, &b, Alias::Never)?;
        let mut plan = super::simple(Kind::Reduce(Reduce { a, b: Some(b), dst, red: Red::CountEqual }), 0);
        plan.units = [1, 0];
        return Ok(plan);
    }
    if !is_float(a.dtype()) {
        return Err(types_err(op, format!("src0 {}", a.dtype())));
    }
    let (red, want, dt_ok) = match op {
        GgmlOp::Cumsum => (Red::Cumsum, a.ne, is_float(dst.dtype())),
        GgmlOp::Sum => (Red::Sum, [1, 1, 1, 1], is_float(dst.dtype())),
        GgmlOp::SumRows => (Red::SumRows, [1, a.ne[1], a.ne[2], a.ne[3]], is_float(dst.dtype())),
        GgmlOp::Mean => (Red::Mean, [1, a.ne[1], a.ne[2], a.ne[3]], is_float(dst.dtype())),
        _ => {
            if a.ne[2] != 1 || a.ne[3] != 1 {
                return Err(shape_err(op, "argmax takes a matrix"));
            }
            (Red::Argmax, [a.ne[1], 1, 1, 1], dst.dtype() == GgmlType::I32)
        }
    };
    if !dt_ok {
        return Err(types_err(op, format!("dst {}", dst.dtype())));
    }
    if dst.ne != want {
        return Err(shape_err(op, format!("dst {:?}, expected {want:?}", dst.ne)));
    }
    check_overlap(op, &dst, &a, if red == Red::Cumsum { Alias::RowLocal } else { Alias::Never })?;
    let mut plan = super::simple(Kind::Reduce(Reduce { a, b: None, dst, red }), a.ne[0]);
    if red == Red::Sum {
        plan.units = [1, 0];
    }
    Ok(plan)
}

impl Reduce {
    pub(crate) fn run(&self, ctx: &mut Ctx<'_>) {
        let a = &self.a;
        let n0 = a.ne[0];
        if self.red == Red::CountEqual {
            if ctx.unit == 0 {
                let b = self.b.as_ref().expect("validated");
                let mut count = 0i64;
                for r in 0..a.nrows() {
                    let (i1, i2, i3) = a.unravel_row(r);
                    for i0 in 0..n0 {
                        count += i64::from(a.get_index(i0, i1, i2, i3) == b.get_index(i0, i1, i2, i3));
                    }
                }
                self.dst.set_i64(0, 0, 0, 0, count);
            }
            return;
        }
        if self.red == Red::Sum {
            if ctx.unit == 0 {
                let mut sum = 0.0f64;
                for r in 0..a.nrows() {
                    let (i1, i2, i3) = a.unravel_row(r);
                    let x = &mut ctx.local[..n0];
                    a.load_row(i1, i2, i3, x);
                    sum += x.iter().map(|&v| v as f64).sum::<f64>();
                }
                self.dst.set_f32(0, 0, 0, 0, sum as f32);
            }
            return;
        }
        for r in ctx.range(a.nrows()) {
            let (i1, i2, i3) = a.unravel_row(r);
            let x = &mut ctx.local[..n0];
            a.load_row(i1, i2, i3, x);
            match self.red {
                Red::SumRows | Red::Mean => {
                    let mut s = x.iter().map(|&v| v as f64).sum::<f64>();
                    if self.red == Red::Mean {
                        s /= n0 as f64;
                    }
                    self.dst.set_f32(0, i1, i2, i3, s as f32);
                }
                Red::Cumsum => {
                    let mut acc = 0.0f32;
                    for v in x.iter_mut() {
                        acc += *v;
                        *v = acc;
                    }
                    self.dst.store_row(i1, i2, i3, x);
                }
                _ => {
                    let mut best = 0usize;
                    for (i, &v) in x.iter().enumerate() {
                        if v > x[best] {
                            best = i;
                        }
                    }
                    self.dst.set_i32(i1, 0, 0, 0, best as i32);
                }
            }
        }
    }
}

/// A planned ARGSORT or TOP_K.
pub(crate) struct Sort {
    a: Tv,
    dst: Tv,
    descending: bool,
}

/// Validates ARGSORT (`op_params[0]` = order) and TOP_K (dst `ne0` = k, indices of the k largest).
///
/// # Safety
/// As `ops::prepare`.
pub(crate) unsafe fn prepare_sort(n: &Node) -> Result<Plan> {
    let op = n.op;
    // SAFETY: forwarded contract.
    let (a, dst) = unsafe { (tv(src(n, 0)?)?, tv(&n.dst)?) };
    if !is_float(a.dtype()) || dst.dtype() != GgmlType::I32 {
        return Err(types_err(op, format!("{} -> {}", a.dtype(), dst.dtype())));
    }
    let descending = match op {
        GgmlOp::Argsort => {
            if dst.ne != a.ne {
                return Err(shape_err(op, format!("dst {:?} vs src0 {:?}", dst.ne, a.ne)));
            }
            match n.op_params[0] {
                0 => false,
                1 => true,
                o => return Err(shape_err(op, format!("sort order {o}"))),
            }
        }
        _ => {
            if dst.ne[0] > a.ne[0] || dst.ne[1..] != a.ne[1..] {
                return Err(shape_err(op, format!("dst {:?} vs src0 {:?}", dst.ne, a.ne)));
            }
            true
        }
    };
    if a.ne[0] >= 1 << 24 {
        return Err(shape_err(op, "rows too long to sort"));
    }
    check_overlap(op, &dst, &a, Alias::Never)?;
    Ok(super::simple(Kind::Sort(Sort { a, dst, descending }), 2 * a.ne[0]))
}

impl Sort {
    pub(crate) fn run(&self, ctx: &mut Ctx<'_>) {
        let a = &self.a;
        let n0 = a.ne[0];
        for r in ctx.range(a.nrows()) {
            let (i1, i2, i3) = a.unravel_row(r);
            let (vals, idx) = ctx.local.split_at_mut(n0);
            a.load_row(i1, i2, i3, vals);
            let idx = &mut idx[..n0];
            for (i, s) in idx.iter_mut().enumerate() {
                *s = f32::from_bits(i as u32);
            }
            let desc = self.descending;
            idx.sort_unstable_by(|x, y| {
                let (i, j) = (x.to_bits() as usize, y.to_bits() as usize);
                let o = vals[i].partial_cmp(&vals[j]).unwrap_or(Ordering::Equal);
                let o = if desc { o.reverse() } else { o };
                o.then(i.cmp(&j))
            });
            for (k, s) in idx.iter().take(self.dst.ne[0]).enumerate() {
                self.dst.set_i32(k, i1, i2, i3, s.to_bits() as i32);
            }
        }
    }
}
