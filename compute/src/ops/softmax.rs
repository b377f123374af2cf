//! SOFT_MAX (scale, f16/f32 mask, ALiBi, sinks) and DIAG_MASK_INF.
//!
//! ref: ggml-compute-semantics.md §3.3 SOFT_MAX. The exponential sum is accumulated in f64.

use crate::dtype::GgmlType;
use crate::error::Result;
use crate::graph::Node;

use super::access::{is_float, Tv};
use super::{check_overlap, opt_tv, param_f32, shape_err, src, tv, types_err, Alias, Ctx, Kind, Plan};

/// ALiBi slope of head `h` (1 when `max_bias` is 0).
pub(crate) fn alibi_slope(max_bias: f32, n_head: usize, h: usize) -> f32 {
    if max_bias <= 0.0 {
        return 1.0;
    }
    let n_head_log2 = 1usize << (usize::BITS - 1 - n_head.max(1).leading_zeros());
    let m0 = 2f32.powf(-max_bias / n_head_log2 as f32);
    let m1 = 2f32.powf(-(max_bias / 2.0) / n_head_log2 as f32);
    if h < n_head_log2 {
        m0.powi(h as i32 + 1)
    } else {
        m1.powi(2 * (h - n_head_log2) as i32 + 1)
    }
}

/// A planned SOFT_MAX.
pub(crate) struct SoftMax {
    a: Tv,
    mask: Option<Tv>,
    sinks: Option<Tv>,
    dst: Tv,
    scale: f32,
    max_bias: f32,
}

/// Validates SOFT_MAX.
///
/// # Safety
/// As `ops::prepare`.
pub(crate) unsafe fn prepare(n: &Node) -> Result<Plan> {
    let op = n.op;
    // SAFETY: forwarded contract.
    let (a, dst) = unsafe { (tv(src(n, 0)?)?, tv(&n.dst)?) };
    // SAFETY: forwarded contract.
    let mask = unsafe { opt_tv(n, 1)? };
    // SAFETY: forwarded contract.
    let sinks = unsafe { opt_tv(n, 2)? };
    if !is_float(a.dtype()) || !is_float(dst.dtype()) {
        return Err(types_err(op, format!("{} -> {}", a.dtype(), dst.dtype())));
    }
    if a.ne != dst.ne {
        return Err(shape_err(op, format!("src0 {:?} vs dst {:?}", a.ne, dst.ne)));
    }
    if let Some(m) = &mask {
        if !matches!(m.dtype(), GgmlType::F32 | GgmlType::F16) {
            return Err(types_err(op, format!("mask {}", m.dtype())));
        }
        let ok = m.ne[0] == a.ne[0]
            && m.ne[1] >= a.ne[1]
            && (a.is_empty()
                || m.ne[2] != 0 && m.ne[3] != 0 && a.ne[2] % m.ne[2] == 0 && a.ne[3] % m.ne[3] == 0);
        if !ok {
            return Err(shape_err(op, format!("mask {:?} for {:?}", m.ne, a.ne)));
        }
        check_overlap(op, &dst, m, Alias::Never)?;
    }
    if let Some(s) = &sinks {
        if s.dtype() != GgmlType::F32 || s.ne[0] < a.ne[2] {
            return Err(shape_err(op, format!("sinks {} {:?} for {} heads", s.dtype(), s.ne, a.ne[2])));
        }
        check_overlap(op, &dst, s, Alias::Never)?;
    }
    check_overlap(op, &dst, &a, Alias::RowLocal)?;
    let plan = SoftMax { a, mask, sinks, dst, scale: param_f32(n, 0), max_bias: param_f32(n, 1) };
    Ok(super::simple(Kind::SoftMax(plan), 2 * a.ne[0]))
}

impl SoftMax {
    pub(crate) fn run(&self, ctx: &mut Ctx<'_>) {
        let d = &self.dst;
        let n0 = d.ne[0];
        for r in ctx.range(d.nrows()) {
            let (i1, i2, i3) = d.unravel_row(r);
            let (x, m) = ctx.local.split_at_mut(n0);
            self.a.load_row(i1, i2, i3, x);
            let slope = alibi_slope(self.max_bias, d.ne[2], i2);
            match &self.mask {
                Some(mask) => {
                    mask.load_row(i1, i2 % mask.ne[2], i3 % mask.ne[3], m);
                    for (v, mv) in x.iter_mut().zip(m.iter()) {
                        *v = *v * self.scale + slope * mv;
                    }
                }
                None => x.iter_mut().for_each(|v| *v *= self.scale),
            }
            let sink = self.sinks.as_ref().map(|s| s.get_f32(i2, 0, 0, 0));
            normalize_row(x, &mut m[..n0], sink, true);
            d.store_row(i1, i2, i3, x);
        }
    }
}

/// Turns the scaled and masked row `x` into its softmax (with an optional sink logit), `y` being
/// scratch of the same length. With `skip_tail`, a tail of -inf (the masked end of a causal
/// mask's row) is not run through `exp`: it is cut after the vector group (8 or 16 elements) holding the last
/// other value, which keeps [`super::vexp::soft_max_exp`]'s groups and so every bit of the sum,
/// and written as the +0.0 that `exp(-inf)` gives. A row of -inf only is computed in full (its
/// NaNs are ggml's).
fn normalize_row(x: &mut [f32], y: &mut [f32], sink: Option<f32>, skip_tail: bool) {
    let n = x.len();
    let live = match x.iter().rposition(|&v| v != f32::NEG_INFINITY) {
        Some(i) if skip_tail => (i + 1).next_multiple_of(super::vexp::group()).min(n),
        _ => n,
    };
    let (x, tail) = x.split_at_mut(live);
    let y = &mut y[..live];
    let mut max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if let Some(s) = sink {
        max = max.max(s);
    }
    let mut sum = super::vexp::soft_max_exp(x, max, y);
    x.copy_from_slice(y);
    if let Some(s) = sink {
        sum += (s - max).exp() as f64;
    }
    let inv = (1.0 / sum) as f32;
    x.iter_mut().for_each(|v| *v *= inv);
    tail.fill(0.0);
}

/// A planned DIAG_MASK_INF.
pub(crate) struct DiagMaskInf {
    a: Tv,
    dst: Tv,
    n_past: i64,
    /// What masked elements become: −∞ (DIAG_MASK_INF) or 0 (DIAG_MASK_ZERO).
    fill: f32,
}

/// Validates DIAG_MASK_INF and DIAG_MASK_ZERO (`op_params[0]` = n_past).
///
/// # Safety
/// As `ops::prepare`.
pub(crate) unsafe fn prepare_diag_mask_inf(n: &Node) -> Result<Plan> {
    let op = n.op;
    // SAFETY: forwarded contract.
    let (a, dst) = unsafe { (tv(src(n, 0)?)?, tv(&n.dst)?) };
    if !is_float(a.dtype()) || !is_float(dst.dtype()) || a.ne != dst.ne {
        return Err(shape_err(op, format!("{} {:?} -> {} {:?}", a.dtype(), a.ne, dst.dtype(), dst.ne)));
    }
    check_overlap(op, &dst, &a, Alias::RowLocal)?;
    let fill = if op == crate::op::GgmlOp::DiagMaskZero { 0.0 } else { f32::NEG_INFINITY };
    Ok(super::simple(Kind::DiagMaskInf(DiagMaskInf { a, dst, n_past: n.op_params[0] as i64, fill }), a.ne[0]))
}

impl DiagMaskInf {
    pub(crate) fn run(&self, ctx: &mut Ctx<'_>) {
        let d = &self.dst;
        let n0 = d.ne[0];
        for r in ctx.range(d.nrows()) {
            let (i1, i2, i3) = d.unravel_row(r);
            let x = &mut ctx.local[..n0];
            self.a.load_row(i1, i2, i3, x);
            for (i0, v) in x.iter_mut().enumerate() {
                if i0 as i64 > self.n_past + i1 as i64 {
                    *v = self.fill;
                }
            }
            d.store_row(i1, i2, i3, x);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Cutting a -inf tail gives the bits of the full computation, for every tail length around
    /// the eight-element groups, with and without a sink, on rows of every length modulo 8.
    #[test]
    fn a_cut_minus_infinity_tail_keeps_every_bit() {
        let mut seed = 0x9e37_79b9_u32;
        let mut rnd = move || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            (seed as f32 / u32::MAX as f32 - 0.5) * 20.0
        };
        let mut cut_something = false;
        for n in [1usize, 7, 8, 9, 31, 64, 77] {
            for keep in 0..=n {
                for sink in [None, Some(1.5f32)] {
                    let mut row: Vec<f32> = (0..n).map(|_| rnd()).collect();
                    row[keep..].fill(f32::NEG_INFINITY);
                    let (mut full, mut cut) = (row.clone(), row.clone());
                    let mut y = vec![0.0f32; n];
                    normalize_row(&mut full, &mut y, sink, false);
                    normalize_row(&mut cut, &mut y, sink, true);
                    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&cut), bits(&full), "n {n} keep {keep} sink {sink:?}");
                    cut_something |= keep > 0 && keep.next_multiple_of(8) < n;
                }
            }
        }
        assert!(cut_something);
    }
}
