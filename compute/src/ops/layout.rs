//! CONCAT, PAD and REPEAT: element moves between shapes, without conversion.
//!
//! ref: ggml-compute-semantics.md §3.3 CONCAT, PAD, REPEAT. CONCAT takes every type, as ggml's CPU
//! backend does: it moves raw elements (I64, F64 and the rest) or, for the quantized types, whole
//! blocks (joining along dim 0 puts `a`'s blocks then `b`'s in each row).

use crate::error::Result;
use crate::graph::Node;
use crate::op::GgmlOp;

use super::access::{is_elem_type, is_float, Tv};
use super::{check_overlap, shape_err, src, tv, types_err, Alias, Ctx, Kind, Plan};

enum Which {
    Concat { b: Tv, dim: usize },
    Pad { lp: [usize; 4], circular: bool },
    Repeat,
}

/// A planned CONCAT, PAD or REPEAT.
pub(crate) struct LayoutOp {
    a: Tv,
    dst: Tv,
    which: Which,
}

/// Validates CONCAT / PAD / REPEAT.
///
/// # Safety
/// As `ops::prepare`.
pub(crate) unsafe fn prepare(n: &Node) -> Result<Plan> {
    let op = n.op;
    // SAFETY: forwarded contract.
    let (a, dst) = unsafe { (tv(src(n, 0)?)?, tv(&n.dst)?) };
    let any_type = op == GgmlOp::Concat;
    if a.dtype() != dst.dtype() || !(any_type || is_elem_type(a.dtype())) {
        return Err(types_err(op, format!("{} -> {}", a.dtype(), dst.dtype())));
    }
    check_overlap(op, &dst, &a, Alias::Never)?;
    let which = match op {
        GgmlOp::Concat => {
            // SAFETY: forwarded contract.
            let b = unsafe { tv(src(n, 1)?)? };
            let dim = n.op_params[0];
            if !(0..4).contains(&dim) || b.dtype() != a.dtype() {
                return Err(shape_err(op, format!("dim {dim}, types {} / {}", a.dtype(), b.dtype())));
            }
            let dim = dim as usize;
            let ok = (0..4).all(|i| {
                if i == dim {
                    a.ne[i].checked_add(b.ne[i]) == Some(dst.ne[i])
                } else {
                    a.ne[i] == dst.ne[i] && b.ne[i] == dst.ne[i]
                }
            });
            if !ok {
                return Err(shape_err(op, format!("a {:?} b {:?} dst {:?} along {dim}", a.ne, b.ne, dst.ne)));
            }
            check_overlap(op, &dst, &b, Alias::Never)?;
            Which::Concat { b, dim }
        }
        GgmlOp::Pad => {
            if !is_float(a.dtype()) {
                return Err(types_err(op, format!("{}", a.dtype())));
            }
            let mut lp = [0usize; 4];
            #[allow(clippy::needless_range_loop)]
            for i in 0..4 {
                let (l, r) = (n.op_params[2 * i], n.op_params[2 * i + 1]);
                if l < 0 || r < 0 || a.ne[i].checked_add(l as usize + r as usize) != Some(dst.ne[i]) {
                    return Err(shape_err(
                        op,
                        format!("pad {l}/{r} of {} to {} in dim {i}", a.ne[i], dst.ne[i]),
                    ));
                }
                lp[i] = l as usize;
            }
            let circular = n.op_params[8] != 0;
            if circular && a.is_empty() && !dst.is_empty() {
                return Err(shape_err(op, "circular padding of an empty tensor"));
            }
            Which::Pad { lp, circular }
        }
        _ => {
            if !dst.is_empty() && (0..4).any(|i| a.ne[i] == 0 || dst.ne[i] % a.ne[i] != 0) {
                return Err(shape_err(op, format!("{:?} does not repeat to {:?}", a.ne, dst.ne)));
            }
            Which::Repeat
        }
    };
    Ok(super::simple(Kind::Layout(LayoutOp { a, dst, which }), 0))
}

impl LayoutOp {
    pub(crate) fn run(&self, ctx: &mut Ctx<'_>) {
        let (a, d) = (&self.a, &self.dst);
        if let Which::Concat { b, dim } = &self.which {
            if d.bs > 1 || !is_elem_type(d.dtype()) {
                return self.concat_blocks(b, *dim, ctx);
            }
        }
        if let Which::Concat { b, dim: 0 } = &self.which {
            if a.packed && b.packed && d.packed && d.bs == 1 {
                // Rows side by side (row-split attention joining its head groups): two copies a row.
                for r in ctx.range(d.nrows()) {
                    let i = d.unravel_row(r);
                    d.copy_row_span(i, 0, a, i, a.ne[0]);
                    d.copy_row_span(i, a.ne[0], b, i, b.ne[0]);
                }
                return;
            }
        }
        for r in ctx.range(d.nrows()) {
            let (i1, i2, i3) = d.unravel_row(r);
            for i0 in 0..d.ne[0] {
                let i = [i0, i1, i2, i3];
                match &self.which {
                    Which::Concat { b, dim } => {
                        if i[*dim] < a.ne[*dim] {
                            d.copy_elem_from(i, a, i);
                        } else {
                            let mut j = i;
                            j[*dim] -= a.ne[*dim];
                            d.copy_elem_from(i, b, j);
                        }
                    }
                    Which::Pad { lp, circular } => {
                        let mut j = [0usize; 4];
                        let mut inside = true;
                        for k in 0..4 {
                            let x = i[k] as i64 - lp[k] as i64;
                            if *circular {
                                j[k] = x.rem_euclid(a.ne[k] as i64) as usize;
                            } else if x < 0 || x >= a.ne[k] as i64 {
                                inside = false;
                            } else {
                                j[k] = x as usize;
                            }
                        }
                        if inside {
                            d.copy_elem_from(i, a, j);
                        } else {
                            d.set_f32(i0, i1, i2, i3, 0.0);
                        }
                    }
                    Which::Repeat => {
                        d.copy_elem_from(i, a, [i0 % a.ne[0], i1 % a.ne[1], i2 % a.ne[2], i3 % a.ne[3]]);
                    }
                }
            }
        }
    }

    /// CONCAT by raw blocks (quantized types) or raw elements of types not loaded as numbers.
    fn concat_blocks(&self, b: &Tv, dim: usize, ctx: &mut Ctx<'_>) {
        let (a, d) = (&self.a, &self.dst);
        let bs = d.bs;
        for r in ctx.range(d.nrows()) {
            let (i1, i2, i3) = d.unravel_row(r);
            for ib in 0..d.ne[0] / bs {
                let i = [ib * bs, i1, i2, i3];
                if i[dim] < a.ne[dim] {
                    d.copy_block_from(ib, (i1, i2, i3), a, ib, (i1, i2, i3));
                } else {
                    let mut j = i;
                    j[dim] -= a.ne[dim];
                    d.copy_block_from(ib, (i1, i2, i3), b, j[0] / bs, (j[1], j[2], j[3]));
                }
            }
        }
    }
}
