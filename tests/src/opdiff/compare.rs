//! Comparison of two results: bit for bit where our kernels are designed to equal ggml's AVX2
//! arithmetic, else normalized mean squared error and largest absolute difference within the
//! bounds each case states.

use compute::GgmlType;

use super::data::decode;

/// What a case promises about llamad's result against the reference's.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bound {
    /// Identical bytes required.
    pub exact: bool,
    /// Largest allowed `Σ(a-b)² / Σa²` over finite values.
    pub nmse: f64,
    /// Largest allowed `max |a-b| / max |a|` over finite values (the largest absolute
    /// difference, in units of the reference's largest magnitude).
    pub max_rel: f64,
    /// Integer rows compared as sets (TOP_K leaves the order open).
    pub row_sets: Option<usize>,
}

impl Bound {
    /// Identical bytes.
    pub const EXACT: Bound = Bound { exact: true, nmse: 0.0, max_rel: 0.0, row_sets: None };

    /// Within `nmse` and `max_rel`.
    pub const fn close(nmse: f64, max_rel: f64) -> Bound {
        Bound { exact: false, nmse, max_rel, row_sets: None }
    }

    /// Rows of `n` integers, equal as sets.
    pub const fn row_sets(n: usize) -> Bound {
        Bound { exact: false, nmse: 0.0, max_rel: 0.0, row_sets: Some(n) }
    }
}

/// Measured differences of one output.
#[derive(Clone, Copy, Debug, Default)]
pub struct Diff {
    /// Bytes identical.
    pub identical: bool,
    /// Normalized mean squared error over finite values.
    pub nmse: f64,
    /// Largest absolute difference over finite values.
    pub max_abs: f64,
    /// `max_abs` over the reference's largest finite magnitude.
    pub max_rel: f64,
}

/// Compares `ours` with `reference` (both `dtype`); `Err` describes the violated bound.
pub fn compare(dtype: GgmlType, reference: &[u8], ours: &[u8], bound: &Bound) -> Result<Diff, String> {
    if reference.len() != ours.len() {
        return Err(format!("lengths differ: {} vs {}", reference.len(), ours.len()));
    }
    let identical = reference == ours;
    let (a, b) = match (decode(dtype, reference), decode(dtype, ours)) {
        (Some(a), Some(b)) => (a, b),
        _ => {
            return if identical {
                Ok(Diff { identical, ..Diff::default() })
            } else {
                Err(format!("{dtype} bytes differ"))
            }
        }
    };
    if let Some(n) = bound.row_sets {
        for (r, (x, y)) in a.chunks(n).zip(b.chunks(n)).enumerate() {
            let (mut x, mut y) = (x.to_vec(), y.to_vec());
            x.sort_by(f64::total_cmp);
            y.sort_by(f64::total_cmp);
            if x != y {
                return Err(format!("row {r}: index sets differ: {x:?} vs {y:?}"));
            }
        }
        return Ok(Diff { identical, ..Diff::default() });
    }
    let (mut num, mut den, mut max_abs, mut peak) = (0.0f64, 0.0f64, 0.0f64, 0.0f64);
    for (i, (&x, &y)) in a.iter().zip(&b).enumerate() {
        if nonfinite_differ(x, y) {
            return Err(format!("element {i}: non-finite values differ: reference {x}, llamad {y}"));
        }
        if x.is_finite() {
            num += (x - y) * (x - y);
            den += x * x;
            max_abs = max_abs.max((x - y).abs());
            peak = peak.max(x.abs());
        }
    }
    let nmse = if num == 0.0 { 0.0 } else { num / den.max(1e-30) };
    let max_rel = if max_abs == 0.0 { 0.0 } else { max_abs / peak.max(1e-30) };
    let d = Diff { identical, nmse, max_abs, max_rel };
    if bound.exact && !identical {
        return Err(format!("expected bit-identical results; nmse {nmse:.3e}, max abs {max_abs:.3e}"));
    }
    if nmse > bound.nmse || max_rel > bound.max_rel {
        return Err(format!(
            "nmse {nmse:.3e} (bound {:.0e}), max abs {max_abs:.3e} = {max_rel:.3e} of the peak (bound {:.0e})",
            bound.nmse, bound.max_rel
        ));
    }
    Ok(d)
}

/// True when `x` and `y` are not both finite and are not the same infinity or both NaN.
fn nonfinite_differ(x: f64, y: f64) -> bool {
    match (x.is_finite(), y.is_finite()) {
        (true, true) => false,
        (false, false) => !(x == y || x.is_nan() && y.is_nan()),
        _ => true,
    }
}
