//! CPY, DUP and CONT: a logical flat-order copy with type conversion.
//!
//! ref: ggml-compute-semantics.md §3.3 CPY/DUP/CONT. Source elements are enumerated in row-major
//! logical order (using the source strides) and written, converted, to the destination elements
//! in the destination's logical order; only the element counts must match.

use crate::error::Result;
use crate::graph::Node;

use super::access::{is_elem_type, split, Tv};
use super::rows::{check_loadable, check_storable};
use super::{check_overlap, shape_err, src, tv, types_err, Alias, Ctx, Kind, Plan};

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Same first dimension: row `r` of the source goes to flat row `r` of the destination.
    Rows,
    /// Element by element with a running destination index.
    Elements,
}

/// A planned copy.
pub(crate) struct Copy {
    a: Tv,
    dst: Tv,
    mode: Mode,
    /// Same type: bytes are copied, never converted.
    raw: bool,
}

/// Validates CPY / DUP / CONT.
///
/// # Safety
/// As `ops::prepare`.
pub(crate) unsafe fn prepare(n: &Node) -> Result<Plan> {
    let op = n.op;
    // SAFETY: forwarded contract.
    let (a, dst) = unsafe { (tv(src(n, 0)?)?, tv(&n.dst)?) };
    if a.nelements() != dst.nelements() {
        return Err(shape_err(op, format!("element counts differ: {:?} vs {:?}", a.ne, dst.ne)));
    }
    check_overlap(op, &dst, &a, Alias::RowLocal)?;
    let raw = a.dtype() == dst.dtype();
    let both_elem = a.bs == 1 && dst.bs == 1 && is_elem_type(a.dtype()) && is_elem_type(dst.dtype());
    let mode = if a.ne[0] == dst.ne[0] {
        Mode::Rows
    } else if both_elem || a.bs > 1 && dst.bs == 1 && is_elem_type(dst.dtype()) {
        Mode::Elements
    } else {
        return Err(types_err(
            op,
            format!(
                "{} -> {} with different row lengths {} / {}",
                a.dtype(),
                dst.dtype(),
                a.ne[0],
                dst.ne[0]
            ),
        ));
    };
    if raw && a.bs > 1 && !(a.packed && dst.packed) {
        return Err(shape_err(op, "quantized copies need packed rows"));
    }
    if !raw || a.bs > 1 && mode == Mode::Elements {
        check_loadable(op, &a, "src0")?;
        check_storable(op, &dst, "dst")?;
    }
    if !raw && !both_elem && a.bs == 1 && !is_elem_type(a.dtype()) {
        return Err(types_err(op, format!("cannot convert {}", a.dtype())));
    }
    let local = a.ne[0].max(dst.ne[0]);
    Ok(super::simple(Kind::Copy(Copy { a, dst, mode, raw }), local))
}

impl Copy {
    pub(crate) fn run(&self, ctx: &mut Ctx<'_>) {
        let (a, d) = (&self.a, &self.dst);
        let rows = split(a.nrows(), ctx.ith, ctx.nth);
        if rows.is_empty() {
            return;
        }
        match self.mode {
            Mode::Rows => {
                for r in rows {
                    let (i1, i2, i3) = a.unravel_row(r);
                    let (j1, j2, j3) = d.unravel_row(r);
                    if self.raw && a.packed && d.packed {
                        let s = a.row_ptr(i1, i2, i3);
                        let t = d.row_ptr(j1, j2, j3);
                        // SAFETY: both rows are packed rows of the same type and length inside
                        // their tensors; `copy` tolerates the exact aliasing `prepare` allows.
                        unsafe { std::ptr::copy(s as *const u8, t, a.row_size) };
                    } else if self.raw {
                        for i0 in 0..a.ne[0] {
                            d.copy_elem_from([i0, j1, j2, j3], a, [i0, i1, i2, i3]);
                        }
                    } else {
                        a.load_row(i1, i2, i3, ctx.local);
                        d.store_row(j1, j2, j3, ctx.local);
                    }
                }
            }
            Mode::Elements => {
                let start = rows.start * a.ne[0];
                let mut j = [0usize; 4];
                let mut f = start;
                for (k, v) in j.iter_mut().enumerate() {
                    *v = f % d.ne[k];
                    f /= d.ne[k];
                }
                for r in rows {
                    let (i1, i2, i3) = a.unravel_row(r);
                    let quant = a.bs > 1;
                    if quant {
                        a.load_row(i1, i2, i3, ctx.local);
                    }
                    for i0 in 0..a.ne[0] {
                        if self.raw {
                            d.copy_elem_from(j, a, [i0, i1, i2, i3]);
                        } else {
                            let v = if quant { ctx.local[i0] } else { a.get_f32(i0, i1, i2, i3) };
                            d.set_f32(j[0], j[1], j[2], j[3], v);
                        }
                        // Advance the destination index in logical order.
                        j[0] += 1;
                        let mut k = 0;
                        while k < 3 && j[k] == d.ne[k] {
                            j[k] = 0;
                            j[k + 1] += 1;
                            k += 1;
                        }
                    }
                }
            }
        }
    }
}
