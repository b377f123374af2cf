//! ADD, SUB, MUL, DIV, ADD1 (modulo broadcast of src1) and ADD_ID.
//!
//! ref: ggml-compute-semantics.md §1.5 and §3.3 ADD/SUB/MUL/DIV, ADD_ID. Rows are read as f32,
//! combined, and converted to the destination type; quantized operands go through their kernels.

use crate::dtype::GgmlType;
use crate::error::{Error, Result};
use crate::graph::Node;
use crate::op::GgmlOp;

use super::access::{split, Tv};
use super::rows::{check_loadable, check_storable};
use super::{check_overlap, shape_err, src, tv, types_err, Alias, Ctx, Kind, Plan};

#[derive(Clone, Copy)]
enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
}

/// A planned element-wise binary op.
pub(crate) struct Binary {
    a: Tv,
    b: Tv,
    dst: Tv,
    op: BinOp,
}

/// Validates ADD / SUB / MUL / DIV / ADD1.
///
/// # Safety
/// As `ops::prepare`.
pub(crate) unsafe fn prepare(n: &Node) -> Result<Plan> {
    let op = n.op;
    // SAFETY: forwarded contract.
    let (a, b, dst) = unsafe { (tv(src(n, 0)?)?, tv(src(n, 1)?)?, tv(&n.dst)?) };
    let bop = match op {
        GgmlOp::Add | GgmlOp::Add1 => BinOp::Add,
        GgmlOp::Sub => BinOp::Sub,
        GgmlOp::Mul => BinOp::Mul,
        _ => BinOp::Div,
    };
    if op == GgmlOp::Add1 && b.nelements() != 1 {
        return Err(shape_err(op, "src1 must be a scalar"));
    }
    if dst.ne != a.ne {
        return Err(shape_err(op, format!("dst {:?} differs from src0 {:?}", dst.ne, a.ne)));
    }
    if !dst.is_empty() && (0..4).any(|i| b.ne[i] == 0 || a.ne[i] % b.ne[i] != 0) {
        return Err(shape_err(op, format!("src1 {:?} does not repeat to {:?}", b.ne, a.ne)));
    }
    if b.bs > 1 && b.ne[0] != a.ne[0] {
        return Err(types_err(op, "a quantized src1 cannot broadcast along rows"));
    }
    check_loadable(op, &a, "src0")?;
    check_loadable(op, &b, "src1")?;
    check_storable(op, &dst, "dst")?;
    if [a.dtype(), b.dtype(), dst.dtype()].iter().any(|t| matches!(t, GgmlType::I32 | GgmlType::I64)) {
        return Err(types_err(op, "integer operands"));
    }
    check_overlap(op, &dst, &a, Alias::RowLocal)?;
    check_overlap(op, &dst, &b, Alias::RowLocal)?;
    let local = a.ne[0] + b.ne[0];
    Ok(super::simple(Kind::Binary(Binary { a, b, dst, op: bop }), local))
}

impl Binary {
    pub(crate) fn run(&self, ctx: &mut Ctx<'_>) {
        let (a, b, d) = (&self.a, &self.b, &self.dst);
        let n0 = a.ne[0];
        let nb0 = b.ne[0];
        for r in split(d.nrows(), ctx.ith, ctx.nth) {
            let (i1, i2, i3) = d.unravel_row(r);
            let (x, y) = ctx.local.split_at_mut(n0);
            a.load_row(i1, i2, i3, x);
            b.load_row(i1 % b.ne[1], i2 % b.ne[2], i3 % b.ne[3], y);
            let y = &y[..nb0];
            if nb0 == n0 {
                apply(self.op, x, y);
            } else {
                for chunk in x.chunks_mut(nb0) {
                    let m = chunk.len();
                    apply(self.op, chunk, &y[..m]);
                }
            }
            d.store_row(i1, i2, i3, x);
        }
    }
}

fn apply(op: BinOp, x: &mut [f32], y: &[f32]) {
    match op {
        BinOp::Add => x.iter_mut().zip(y).for_each(|(x, y)| *x += y),
        BinOp::Sub => x.iter_mut().zip(y).for_each(|(x, y)| *x -= y),
        BinOp::Mul => x.iter_mut().zip(y).for_each(|(x, y)| *x *= y),
        BinOp::Div => x.iter_mut().zip(y).for_each(|(x, y)| *x /= y),
    }
}

/// A planned ADD_ID.
pub(crate) struct AddId {
    a: Tv,
    b: Tv,
    ids: Tv,
    dst: Tv,
}

/// Validates ADD_ID: `dst[:, e, t] = a[:, e, t] + b[:, ids[e, t]]`.
///
/// # Safety
/// As `ops::prepare`.
pub(crate) unsafe fn prepare_add_id(n: &Node) -> Result<Plan> {
    let op = n.op;
    // SAFETY: forwarded contract.
    let (a, b, ids, dst) = unsafe { (tv(src(n, 0)?)?, tv(src(n, 1)?)?, tv(src(n, 2)?)?, tv(&n.dst)?) };
    if ids.dtype() != GgmlType::I32 {
        return Err(types_err(op, "ids must be I32"));
    }
    let ok = dst.ne == a.ne
        && a.ne[3] == 1
        && b.ne[0] == a.ne[0]
        && b.ne[2] == 1
        && b.ne[3] == 1
        && ids.ne[0] == a.ne[1]
        && ids.ne[1] == a.ne[2]
        && ids.ne[2] == 1
        && ids.ne[3] == 1;
    if !ok {
        return Err(shape_err(op, format!("a {:?}, b {:?}, ids {:?}, dst {:?}", a.ne, b.ne, ids.ne, dst.ne)));
    }
    check_loadable(op, &a, "src0")?;
    check_loadable(op, &b, "src1")?;
    check_storable(op, &dst, "dst")?;
    check_overlap(op, &dst, &a, Alias::RowLocal)?;
    check_overlap(op, &dst, &b, Alias::Never)?;
    check_overlap(op, &dst, &ids, Alias::Never)?;
    Ok(super::simple(Kind::AddId(AddId { a, b, ids, dst }), 2 * a.ne[0]))
}

impl AddId {
    pub(crate) fn run(&self, op: GgmlOp, ctx: &mut Ctx<'_>) {
        let n0 = self.a.ne[0];
        let mut bad = 0usize;
        for r in split(self.dst.nrows(), ctx.ith, ctx.nth) {
            let (e, t, _) = self.dst.unravel_row(r);
            let id = self.ids.get_index(e, t, 0, 0);
            if id < 0 || id as usize >= self.b.ne[1] {
                bad += 1;
                continue;
            }
            let (x, y) = ctx.local.split_at_mut(n0);
            self.a.load_row(e, t, 0, x);
            self.b.load_row(id as usize, 0, 0, y);
            x.iter_mut().zip(y.iter()).for_each(|(x, y)| *x += y);
            self.dst.store_row(e, t, 0, x);
        }
        if bad > 0 {
            ctx.errors.report(Error::IndexOutOfRange {
                op,
                detail: format!("{bad} ids outside 0..{}", self.b.ne[1]),
            });
        }
    }
}
