//! AVX-512 VNNI panel product (see `quant::panel` for the layouts and the arithmetic): per
//! sub-block, the `sub / 4` weight groups stay in registers while each column's four-byte groups
//! are broadcast into one `vpdpbusd` each, so one instruction forms four products of 16 rows, and
//! the scale step (`cvt`, `mul`, `fma`) is taken once per 16 outputs per sub-block.
//!
//! Bit-identical to `panel::run_reference`: the integer sums are exact, and the float steps are
//! the same operations in the same order per lane.
//!
//! Like the other x86 modules, the safe wrapper is reachable only through [`install`], which runs
//! only after the features were detected: the invariant behind every `// SAFETY:` comment here.

use std::arch::x86_64::*;

use crate::dtype::GgmlType;
use crate::quant::dispatch::Kernels;
use crate::quant::panel::{check_args, PanelFormat, PANEL_COLS, PANEL_ROWS};

/// Installs the panel product for every type with panel packers; does nothing without AVX-512
/// F + VNNI.
pub fn install(k: &mut Kernels) {
    if !super::avx512_available() {
        return;
    }
    for t in [GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K]
    {
        k.set_panel(t, run);
    }
}

/// The safe entry point: checks every length, then runs the kernel for the format and the
/// number of columns (a partial set of columns repeats its last one; the extra results are
/// dropped).
fn run(f: PanelFormat, k: usize, panel: &[u8], cols: &[&[u8]], out: &mut [f32]) {
    check_args(f, k, panel, cols, out);
    let n = cols.len();
    let mut padded = [cols[n - 1]; PANEL_COLS];
    padded[..n].copy_from_slice(cols);
    let nsub = k / f.sub;
    let mut res = [0.0f32; PANEL_COLS * PANEL_ROWS];
    // SAFETY: AVX-512 F/VNNI were detected before `install` put this function in the table; the
    // panel holds nsub sub-blocks of the format and every column nsub column sub-blocks
    // (check_args), which is all the kernels read.
    unsafe {
        match (f.sub, f.min, n) {
            (32, false, 1..=4) => kernel::<32, false, 4>(nsub, panel, &padded, &mut res),
            (32, false, _) => kernel::<32, false, 8>(nsub, panel, &padded, &mut res),
            (32, true, 1..=4) => kernel::<32, true, 4>(nsub, panel, &padded, &mut res),
            (32, true, _) => kernel::<32, true, 8>(nsub, panel, &padded, &mut res),
            (16, false, 1..=4) => kernel::<16, false, 4>(nsub, panel, &padded, &mut res),
            (16, false, _) => kernel::<16, false, 8>(nsub, panel, &padded, &mut res),
            (16, true, 1..=4) => kernel::<16, true, 4>(nsub, panel, &padded, &mut res),
            (16, true, _) => kernel::<16, true, 8>(nsub, panel, &padded, &mut res),
            _ => unreachable!("panel sub-blocks are 16 or 32 elements"),
        }
    }
    out[..n * PANEL_ROWS].copy_from_slice(&res[..n * PANEL_ROWS]);
}

/// The first `C` columns against the panel into `res[c * 16 + r]`.
///
/// # Safety
/// AVX-512 F and VNNI must be available; `panel` must hold `nsub` weight sub-blocks of format
/// (`SUB`, `MIN`) and each of the first `C` columns `nsub` column sub-blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,fma")]
unsafe fn kernel<const SUB: usize, const MIN: bool, const C: usize>(
    nsub: usize,
    panel: &[u8],
    cols: &[&[u8]; PANEL_COLS],
    res: &mut [f32; PANEL_COLS * PANEL_ROWS],
) {
    let f = PanelFormat { sub: SUB, min: MIN };
    let (rsb, csb) = (f.row_sub_bytes(), f.col_sub_bytes());
    let groups = SUB / 4;
    let mut acc = [_mm512_setzero_ps(); C];
    let wp = panel.as_ptr();
    let cp: [*const u8; C] = std::array::from_fn(|c| cols[c].as_ptr());
    for s in 0..nsub {
        // SAFETY: sub-block s lies inside the panel and every column (the caller's contract);
        // all loads are unaligned loads of bytes inside those ranges.
        unsafe {
            let w = wp.add(s * rsb);
            let mut wv = [_mm512_setzero_si512(); 8];
            for (g, v) in wv.iter_mut().enumerate().take(groups) {
                *v = _mm512_loadu_si512(w.add(g * 64) as *const _);
            }
            let sx = _mm512_loadu_ps(w.add(SUB * PANEL_ROWS) as *const f32);
            let mx = if MIN { _mm512_loadu_ps(w.add(SUB * PANEL_ROWS + 64) as *const f32) } else { sx };
            for c in 0..C {
                let y = cp[c].add(s * csb);
                let mut isum = _mm512_set1_epi32((y.add(SUB) as *const i32).read_unaligned());
                for (g, v) in wv.iter().enumerate().take(groups) {
                    let yb = _mm512_set1_epi32((y.add(4 * g) as *const i32).read_unaligned());
                    isum = _mm512_dpbusd_epi32(isum, *v, yb);
                }
                let sy = _mm512_set1_ps((y.add(SUB + 4) as *const f32).read_unaligned());
                acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(sx, sy), acc[c]);
                if MIN {
                    let ty = _mm512_set1_ps((y.add(SUB + 8) as *const f32).read_unaligned());
                    acc[c] = _mm512_fmadd_ps(mx, ty, acc[c]);
                }
            }
        }
    }
    for (c, a) in acc.iter().enumerate() {
        // SAFETY: 16 floats at c * 16 lie inside `res` (C ≤ PANEL_COLS).
        unsafe { _mm512_storeu_ps(res.as_mut_ptr().add(c * PANEL_ROWS), *a) };
    }
}
