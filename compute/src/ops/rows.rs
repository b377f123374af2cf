//! GET_ROWS and SET_ROWS: rows selected by indices read from tensor data.
//!
//! ref: ggml-compute-semantics.md §3.3 GET_ROWS, SET_ROWS; ggml-rpc-protocol.md §14 items 10–11.
//! The shapes that tie the three tensors together are checked in `prepare`; the indices are
//! checked row by row at run time (out of range: the row is skipped and the graph reports
//! `IndexOutOfRange`).

use crate::dtype::GgmlType;
use crate::error::{Error, Result};
use crate::graph::Node;
use crate::op::GgmlOp;

use super::access::{is_elem_type, Tv};
use super::{check_overlap, shape_err, src, tv, types_err, Alias, Ctx, Kind, Plan};

/// Checks a tensor can be read row by row as f32.
pub(crate) fn check_loadable(op: GgmlOp, t: &Tv, what: &str) -> Result<()> {
    if !t.can_load() || t.bs > 1 && !t.packed {
        return Err(types_err(op, format!("{what} of type {} cannot be read as f32 here", t.dtype())));
    }
    Ok(())
}

/// Checks a tensor can be written row by row from f32.
pub(crate) fn check_storable(op: GgmlOp, t: &Tv, what: &str) -> Result<()> {
    if !t.can_store() || t.bs > 1 && !t.packed {
        return Err(types_err(op, format!("{what} of type {} cannot be written from f32 here", t.dtype())));
    }
    Ok(())
}

/// A planned GET_ROWS.
pub(crate) struct GetRows {
    table: Tv,
    idx: Tv,
    dst: Tv,
    /// Same element type on both sides: copy bytes (keeps I32 exact).
    raw: bool,
}

/// Validates GET_ROWS.
///
/// # Safety
/// As `ops::prepare`.
pub(crate) unsafe fn prepare_get_rows(n: &Node) -> Result<Plan> {
    let op = n.op;
    // SAFETY: forwarded contract.
    let (table, idx, dst) = unsafe { (tv(src(n, 0)?)?, tv(src(n, 1)?)?, tv(&n.dst)?) };
    if idx.dtype() != GgmlType::I32 {
        return Err(types_err(op, format!("indices must be I32, got {}", idx.dtype())));
    }
    let want = [table.ne[0], idx.ne[0], idx.ne[1], idx.ne[2]];
    if dst.ne != want || table.ne[2] != idx.ne[1] || table.ne[3] != idx.ne[2] || idx.ne[3] != 1 {
        return Err(shape_err(
            op,
            format!("src0 {:?}, indices {:?}, dst {:?} do not match", table.ne, idx.ne, dst.ne),
        ));
    }
    check_overlap(op, &dst, &table, Alias::Never)?;
    check_overlap(op, &dst, &idx, Alias::Never)?;
    let raw = table.dtype() == dst.dtype() && table.bs == 1;
    if !raw {
        check_loadable(op, &table, "src0")?;
        check_storable(op, &dst, "dst")?;
    }
    Ok(super::simple(Kind::GetRows(GetRows { table, idx, dst, raw }), dst.ne[0]))
}

impl GetRows {
    pub(crate) fn run(&self, op: GgmlOp, ctx: &mut Ctx<'_>) {
        let (t, dst) = (&self.table, &self.dst);
        let mut bad = 0usize;
        for r in ctx.range(dst.nrows()) {
            let (i10, i11, i12) = dst.unravel_row(r);
            let id = self.idx.get_index(i10, i11, i12, 0);
            if id < 0 || id as usize >= t.ne[1] {
                bad += 1;
                continue;
            }
            let id = id as usize;
            if self.raw {
                for i0 in 0..dst.ne[0] {
                    dst.copy_elem_from([i0, i10, i11, i12], t, [i0, id, i11, i12]);
                }
            } else {
                t.load_row(id, i11, i12, ctx.local);
                dst.store_row(i10, i11, i12, ctx.local);
            }
        }
        if bad > 0 {
            ctx.errors.report(Error::IndexOutOfRange {
                op,
                detail: format!("{bad} row ids outside 0..{}", t.ne[1]),
            });
        }
    }
}

/// Units of SET_ROWS's write phase.
const SET_ROWS_UNITS: usize = 8;

/// A planned SET_ROWS.
///
/// Two phases. Phase 0 checks, in parallel, whether every index row is strictly increasing and
/// in range (the KV cache's case), one flag per unit in shared scratch. Then phase 1 splits the
/// source rows across units when all flags are set (no two source rows share a destination), and
/// otherwise splits the destination rows, each unit scanning every index so that duplicates are
/// written in source order by one unit (the last one wins, as in a sequential run) and bad
/// indices are counted once.
pub(crate) struct SetRows {
    rows: Tv,
    idx: Tv,
    dst: Tv,
    /// Units of phase 0 (flags in shared scratch).
    check_units: usize,
}

/// Validates SET_ROWS (src0 = rows, src1 = indices, dst = view of the destination).
///
/// # Safety
/// As `ops::prepare`.
pub(crate) unsafe fn prepare_set_rows(n: &Node) -> Result<Plan> {
    let op = n.op;
    // SAFETY: forwarded contract.
    let (rows, idx, dst) = unsafe { (tv(src(n, 0)?)?, tv(src(n, 1)?)?, tv(&n.dst)?) };
    if !matches!(idx.dtype(), GgmlType::I32 | GgmlType::I64) {
        return Err(types_err(op, format!("indices must be I64 or I32, got {}", idx.dtype())));
    }
    if !matches!(rows.dtype(), GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) {
        return Err(types_err(op, format!("source rows must be F32/F16/BF16, got {}", rows.dtype())));
    }
    check_storable(op, &dst, "dst")?;
    let ok = dst.ne[0] == rows.ne[0]
        && rows.ne[1] == idx.ne[0]
        && rows.ne[2] == dst.ne[2]
        && rows.ne[3] == dst.ne[3]
        && idx.ne[3] == 1
        && (dst.ne[2] == 0 || idx.ne[1] != 0 && dst.ne[2] % idx.ne[1] == 0)
        && (dst.ne[3] == 0 || idx.ne[2] != 0 && dst.ne[3] % idx.ne[2] == 0);
    if !ok {
        return Err(shape_err(
            op,
            format!("rows {:?}, indices {:?}, dst {:?} do not match", rows.ne, idx.ne, dst.ne),
        ));
    }
    check_overlap(op, &dst, &rows, Alias::Never)?;
    check_overlap(op, &dst, &idx, Alias::Never)?;
    let check_units = (rows.ne[1] / 1024).clamp(1, super::MAX_UNITS);
    let set = SetRows { rows, idx, dst, check_units };
    // Few units in phase 1: when the indices are not increasing (the transposed V cache stores
    // token after token, channel by channel), every unit scans all of them.
    let units = [check_units, dst.ne[1].clamp(1, SET_ROWS_UNITS)];
    Ok(Plan { phases: 2, units, shared_bytes: check_units, local_f32: dst.ne[0], kind: Kind::SetRows(set) })
}

/// One row of an I32 or I64 index tensor, read without per-element shape checks.
struct IndexRow<'a> {
    /// The row's bytes when its elements are packed (else read through `Tv::get_index`).
    bytes: Option<&'a [u8]>,
    wide: bool,
    idx: &'a Tv,
    i1: usize,
    i2: usize,
}

impl<'a> IndexRow<'a> {
    fn new(idx: &'a Tv, i1: usize, i2: usize) -> IndexRow<'a> {
        let bytes = idx.packed.then(|| idx.row_bytes(i1, i2, 0));
        IndexRow { bytes, wide: idx.dtype() == GgmlType::I64, idx, i1, i2 }
    }

    /// Index `i` (below `ne[0]` of the index tensor).
    #[inline(always)]
    fn get(&self, i: usize) -> i64 {
        match self.bytes {
            Some(b) if self.wide => i64::from_le_bytes(b[8 * i..8 * i + 8].try_into().expect("8 bytes")),
            Some(b) => i32::from_le_bytes(b[4 * i..4 * i + 4].try_into().expect("4 bytes")) as i64,
            None => self.idx.get_index(i, self.i1, self.i2, 0),
        }
    }
}

impl SetRows {
    pub(crate) fn run(&self, op: GgmlOp, phase: u8, ctx: &mut Ctx<'_>) {
        if phase == 0 {
            let ok = self.increasing_in_range(ctx.range(self.rows.ne[1]));
            ctx.sh.bytes_mut(ctx.unit, 1)[0] = ok as u8;
            return;
        }
        if ctx.shared(0, self.check_units).iter().all(|&f| f == 1) {
            self.run_by_source(ctx);
        } else {
            self.run_by_destination(op, ctx);
        }
    }

    /// Whether indices `range` (and the one before it) of every index row are strictly increasing
    /// and inside the destination.
    fn increasing_in_range(&self, range: std::ops::Range<usize>) -> bool {
        let (idx, dst) = (&self.idx, &self.dst);
        let first = range.start.saturating_sub(1);
        for i3 in 0..idx.ne[2] {
            for i2 in 0..idx.ne[1] {
                let ids = IndexRow::new(idx, i2, i3);
                let mut prev = -1i64;
                for i in first..range.end {
                    let r = ids.get(i);
                    if r <= prev || r >= dst.ne[1] as i64 {
                        return false;
                    }
                    prev = r;
                }
            }
        }
        true
    }

    /// Source rows split across units (every index distinct and in range, checked in phase 0).
    fn run_by_source(&self, ctx: &mut Ctx<'_>) {
        let (rows, dst, idx) = (&self.rows, &self.dst, &self.idx);
        let n = rows.ne[1];
        let single = rows.ne[0] == 1 && is_elem_type(rows.dtype()) && is_elem_type(dst.dtype());
        let mut slice: Option<(usize, IndexRow<'_>)> = None;
        for flat in ctx.range(n * dst.ne[2] * dst.ne[3]) {
            let (i, plane) = (flat % n, flat / n);
            let (i2, i3) = (plane % dst.ne[2], plane / dst.ne[2]);
            // The index row of this (i2, i3) plane, looked up once per plane.
            let ids = match &slice {
                Some((p, ids)) if *p == plane => ids,
                _ => &slice.insert((plane, IndexRow::new(idx, i2 % idx.ne[1], i3 % idx.ne[2]))).1,
            };
            let r = ids.get(i) as usize;
            if single {
                dst.set_f32(0, r, i2, i3, rows.get_f32(0, i, i2, i3));
            } else {
                rows.load_row(i, i2, i3, ctx.local);
                dst.store_row(r, i2, i3, ctx.local);
            }
        }
    }

    /// Destination rows split across units; each unit scans every index.
    fn run_by_destination(&self, op: GgmlOp, ctx: &mut Ctx<'_>) {
        let (rows, dst, idx) = (&self.rows, &self.dst, &self.idx);
        // Each thread owns a range of destination rows, so duplicate indices are written in
        // source order by one thread (the last one wins, as in a sequential run).
        let mine = ctx.range(dst.ne[1]);
        // Element types convert one value exactly as a row of one would (`get_f32`/`set_f32` are
        // what load_row/store_row use for them).
        let single = rows.ne[0] == 1 && is_elem_type(rows.dtype()) && is_elem_type(dst.dtype());
        let mut bad = 0usize;
        for i3 in 0..dst.ne[3] {
            for i2 in 0..dst.ne[2] {
                // The index row read straight from its bytes: every thread scans all of it (the
                // transposed V cache has one index per element), so this loop must stay cheap.
                let ids = IndexRow::new(idx, i2 % idx.ne[1], i3 % idx.ne[2]);
                for i in 0..rows.ne[1] {
                    let r = ids.get(i);
                    if r < 0 || r as usize >= dst.ne[1] {
                        bad += 1;
                        continue;
                    }
                    let r = r as usize;
                    if !mine.contains(&r) {
                        continue;
                    }
                    if single {
                        // One-element rows (llama.cpp's transposed V cache): no row buffer.
                        dst.set_f32(0, r, i2, i3, rows.get_f32(0, i, i2, i3));
                    } else {
                        rows.load_row(i, i2, i3, ctx.local);
                        dst.store_row(r, i2, i3, ctx.local);
                    }
                }
            }
        }
        if bad > 0 && ctx.unit == 0 {
            ctx.errors.report(Error::IndexOutOfRange {
                op,
                detail: format!("{bad} row ids outside 0..{}", dst.ne[1]),
            });
        }
    }
}
