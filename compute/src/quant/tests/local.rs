//! llama.cpp's local (repacked) order (`quant::local`): the panels (scalar and SIMD) and the
//! interleaved product (scalar twin and SIMD) equal the scalar model of ggml's repacked Q4_0 /
//! IQ4_NL / MXFP4 product bit for bit, for every count of activation columns; so do Q4_K's one-row dots
//! (scalar twin and SIMD); the repack rule; and the ggml profiles keep the local kernels while
//! dropping the panels.

use super::simd::{activations, filled_row, random_row};
use super::*;
use crate::numerics::Numerics;
use crate::quant::interleave::{self, ROWS};
use crate::quant::local;
use crate::quant::panel::{self, PANEL_COLS, PANEL_ROWS};
use crate::quant::prepared;
use crate::quant::scalar::q8_0_from_f32_x86;
use crate::tensor::Layout;

const TYPES: [GgmlType; 3] = [GgmlType::Q4_0, GgmlType::IQ4_NL, GgmlType::MXFP4];

/// 16 weight rows: random codes at several scales, extreme codes, zero codes.
fn weight_rows(r: &mut StdRng, t: GgmlType, nb: usize) -> Vec<Vec<u8>> {
    (0..PANEL_ROWS)
        .map(|i| match i % 6 {
            4 => filled_row(r, t, nb, 0xFF),
            5 => filled_row(r, t, nb, 0x00),
            j => random_row(r, t, nb, [1.5, 1e3, -2.0, 0.01][j]),
        })
        .collect()
}

/// Activation rows quantized as ggml's x86 `quantize_row_q8_0` / `quantize_mat_q8_0_4x8`.
fn q8_rows(r: &mut StdRng, k: usize, n: usize) -> Vec<Vec<u8>> {
    let mut ys = Vec::new();
    while ys.len() < n {
        for y in activations(r, k) {
            let mut q = vec![0u8; k / 32 * 34];
            q8_0_from_f32_x86(&y, &mut q);
            ys.push(q);
        }
    }
    ys.truncate(n);
    ys
}

fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

/// The kernel sets this CPU runs under the `avx2` profile, best last.
fn tables() -> Vec<Kernels> {
    Isa::all_available().into_iter().map(|isa| Kernels::build_for(isa, Numerics::Avx2)).collect()
}

#[test]
fn panels_are_ggmls_repacked_order() {
    let mut r = rng(251);
    let mut simd = 0;
    for t in TYPES {
        for nb in [1usize, 7, 64] {
            let k = nb * 32;
            let rows = weight_rows(&mut r, t, nb);
            let ys = q8_rows(&mut r, k, PANEL_COLS);
            let want: Vec<Vec<f32>> =
                ys.iter().map(|y| rows.iter().map(|x| local::model(t, k, x, y, false)).collect()).collect();
            let refs: [&[u8]; PANEL_ROWS] = std::array::from_fn(|i| rows[i].as_slice());
            let mut kernels = vec![panel::scalar_kernels(t).unwrap()];
            for tab in tables() {
                if let Some(p) = tab.get(t).local.and_then(|lk| lk.panel) {
                    kernels.push(p);
                    simd += 1;
                }
            }
            for p in kernels {
                let mut packed = vec![0u8; p.format.panel_bytes(k)];
                (p.pack_rows)(k, &refs, &mut packed);
                let cols: Vec<Vec<u8>> = ys
                    .iter()
                    .map(|y| {
                        let mut c = vec![0u8; p.format.col_bytes(k)];
                        (p.pack_col)(k, y, &mut c);
                        c
                    })
                    .collect();
                for n in 1..=PANEL_COLS {
                    let cs: Vec<&[u8]> = cols[..n].iter().map(|c| c.as_slice()).collect();
                    let mut out = vec![0.0f32; n * PANEL_ROWS];
                    (p.run)(p.format, k, &packed, &cs, &mut out);
                    for (j, w) in want[..n].iter().enumerate() {
                        for (i, &w) in w.iter().enumerate() {
                            let g = out[j * PANEL_ROWS + i];
                            assert!(same(g, w), "{t} nb {nb} cols {n}: ({i}, {j}) panel {g} vs model {w}");
                        }
                    }
                }
            }
        }
    }
    if Isa::Avx512.available() {
        assert!(simd > 0, "AVX-512 VNNI present but no local panel kernel was tested");
    }
}

#[test]
fn interleaved_local_dots_are_ggmls_repacked_order() {
    let t = GgmlType::Q4_0;
    let mut r = rng(252);
    let mut fns: Vec<interleave::InterleavedDotFn> = vec![local::dot_reference];
    fns.extend(tables().iter().filter_map(|tab| tab.get(t).local.and_then(|l| l.interleaved)));
    if Isa::Avx512.available() {
        assert!(fns.len() > 1, "AVX-512 VNNI present but no interleaved local kernel");
    }
    for nb in [1usize, 8, 19, 64] {
        let k = nb * 32;
        let rows = weight_rows(&mut r, t, nb);
        let src: Vec<u8> = rows.concat();
        let mut il = vec![0u8; src.len()];
        interleave::interleave(t, k, ROWS, &src, &mut il);
        let ys = q8_rows(&mut r, k, 7);
        let preps: Vec<Vec<u8>> = ys
            .iter()
            .map(|y| {
                let mut p = vec![0u8; prepared::row_bytes(k)];
                prepared::prepare(k, GgmlType::Q8_0, interleave::bias(t), y, &mut p);
                p
            })
            .collect();
        for f in &fns {
            // Every column count a call takes (1..=4), and the same columns in other positions.
            for (c0, cols) in [(0, 1), (1, 2), (3, 3), (0, 4), (3, 4)] {
                let cs: Vec<&[u8]> = preps[c0..c0 + cols].iter().map(|p| p.as_slice()).collect();
                let mut out = vec![0.0f32; cs.len() * ROWS];
                f(k, &il, &cs, &mut out, &[]);
                for j in 0..cs.len() {
                    let y = &ys[c0 + j];
                    for (i, x) in rows.iter().enumerate() {
                        let (g, w) = (out[j * ROWS + i], local::model(t, k, x, y, false));
                        assert!(same(g, w), "nb {nb}: ({i}, {j}) interleaved {g} vs model {w}");
                    }
                }
            }
        }
    }
}

/// The model differs from the RPC server's `vec_dot` order somewhere (else there would be nothing
/// to reproduce), and stays within float rounding of it.
#[test]
fn local_order_is_not_vec_dots() {
    let t = GgmlType::Q4_0;
    let tab = Kernels::build_for(*Isa::all_available().last().unwrap(), Numerics::Avx2);
    let dot = tab.get(t).vec_dot.unwrap();
    let mut r = rng(253);
    let k = 64 * 32;
    let (mut differ, mut total) = (0, 0);
    for x in weight_rows(&mut r, t, 64).iter().take(4) {
        for y in q8_rows(&mut r, k, 4) {
            let (m, v) = (local::model(t, k, x, &y, false), dot(k, x, &y));
            differ += usize::from(!same(m, v));
            total += 1;
            assert!((m - v).abs() <= 1e-4 * m.abs().max(v.abs()) + 1e-3, "model {m} vs vec_dot {v}");
        }
    }
    assert!(differ > 0, "0 of {total} products differ between the orders");
}

#[test]
fn q4_k_dots_are_ggmls_repacked_order() {
    let t = GgmlType::Q4_K;
    let s = scalar_table();
    let mut r = rng(254);
    // (gemv, gemm) pairs: the scalar twins, then every kernel set's.
    let mut fns: Vec<(crate::quant::VecDotFn, crate::quant::VecDotFn)> =
        vec![(local::vec_dot_q4_k, local::vec_dot_q4_k_gemm)];
    fns.extend(tables().iter().filter_map(|tab| tab.get(t).local.and_then(|l| l.vec_dot)));
    if Isa::Avx2.available() {
        assert!(fns.len() > 1, "AVX2 present but no local Q4_K kernel");
    }
    let mut split = 0;
    let (mut differ, mut total) = (0, 0);
    for nb in [1usize, 3, 6] {
        let k = nb * 256;
        let rows = weight_rows(&mut r, t, nb);
        let ys: Vec<Vec<u8>> =
            activations(&mut r, k).iter().map(|y| quantize(&s, GgmlType::Q8_K, y)).collect();
        for x in &rows {
            for y in &ys {
                let want = local::model(t, k, x, y, false);
                let want4 = local::model(t, k, x, y, true);
                split += usize::from(!same(want, want4));
                for (gemv, gemm) in &fns {
                    let (got, got4) = (gemv(k, x, y), gemm(k, x, y));
                    assert!(same(got, want), "nb {nb}: local Q4_K gemv dot {got} vs model {want}");
                    assert!(same(got4, want4), "nb {nb}: local Q4_K gemm dot {got4} vs model {want4}");
                }
                let v = (s.get(t).vec_dot.unwrap())(k, x, y);
                differ += usize::from(!same(v, want));
                total += 1;
            }
        }
    }
    assert!(differ > 0, "0 of {total} Q4_K products differ from vec_dot's order");
    assert!(split > 0, "0 of {total} Q4_K products differ between the gemv and gemm groupings");
}

#[test]
fn repack_rule_follows_ggml() {
    use GgmlType::*;
    let l = |t: GgmlType, ne: [u64; 4]| Layout::contiguous(t, ne).unwrap();
    let cases = [
        (Numerics::Avx2, l(Q4_0, [576, 192, 1, 1]), false, true),
        (Numerics::Avx2, l(Q4_0, [576, 196, 1, 1]), false, false),
        (Numerics::Avx2, l(Q4_0, [576, 192, 2, 1]), false, false),
        (Numerics::Avx2, l(Q4_0, [576, 192, 2, 1]), true, true),
        (Numerics::Avx2, l(Q4_K, [1536, 576, 1, 1]), false, true),
        (Numerics::Avx2, l(IQ4_NL, [576, 576, 1, 1]), false, true),
        (Numerics::Avx2, l(MXFP4, [576, 576, 1, 1]), false, true),
        (Numerics::Avx2, l(Q2_K, [1536, 576, 1, 1]), false, false),
        (Numerics::Avx512, l(Q2_K, [1536, 576, 1, 1]), false, true),
        (Numerics::Avx2, l(Q8_0, [576, 576, 1, 1]), false, false),
        (Numerics::Avx2, l(Q5_0, [576, 576, 1, 1]), false, false),
        (Numerics::Avx2, l(Q6_K, [1536, 576, 1, 1]), false, false),
        (Numerics::Portable, l(Q4_0, [576, 192, 1, 1]), false, false),
        (Numerics::NeonI8mm, l(Q4_0, [576, 192, 1, 1]), false, false),
    ];
    for (n, layout, id, want) in cases {
        assert_eq!(
            local::repacks(n, &layout, id),
            want,
            "{} {} {:?} id {id}",
            n.name(),
            layout.dtype,
            layout.ne
        );
    }
}

#[test]
fn ggml_profiles_keep_the_local_kernels() {
    if !Isa::Avx512.available() {
        return;
    }
    for n in [Numerics::Avx2, Numerics::Avx512, Numerics::Portable] {
        let k = Kernels::build_for(Isa::Avx512, n);
        for t in [GgmlType::Q4_0, GgmlType::IQ4_NL, GgmlType::MXFP4, GgmlType::Q4_K] {
            assert!(k.get(t).local.is_some(), "{} {t}: no local kernels", n.name());
        }
        assert!(k.get(GgmlType::Q4_0).local.unwrap().interleaved.is_some(), "{}", n.name());
    }
}

/// The four-row form of Q4_K's local `gemm` order equals the model per output, for every column
/// position (random rows, 1–6 super-blocks).
#[test]
fn q4_k_gemm_x4_is_the_gemm_order_per_column() {
    let t = GgmlType::Q4_K;
    let s = scalar_table();
    let mut r = rng(255);
    let x4s: Vec<crate::quant::VecDotX4Fn> =
        tables().iter().filter_map(|tab| tab.get(t).local.and_then(|l| l.gemm_x4)).collect();
    if Isa::Avx2.available() {
        assert!(!x4s.is_empty(), "AVX2 present but no four-row local Q4_K kernel");
    }
    let mut checked = 0;
    for nb in [1usize, 2, 6] {
        let k = nb * 256;
        let rows = weight_rows(&mut r, t, nb);
        let ys: Vec<Vec<u8>> =
            (0..4).map(|_| quantize(&s, GgmlType::Q8_K, &activations(&mut r, k)[0])).collect();
        let cols: [&[u8]; 4] = std::array::from_fn(|j| &ys[j][..]);
        for x in &rows {
            for f in &x4s {
                let got = f(k, x, cols);
                for (j, y) in cols.iter().enumerate() {
                    let want = local::model(t, k, x, y, true);
                    assert!(same(got[j], want), "nb {nb} column {j}: {} vs model {want}", got[j]);
                    checked += 1;
                }
            }
        }
    }
    if Isa::Avx2.available() {
        assert!(checked > 0);
    }
}
