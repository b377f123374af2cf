//! The panel product (`quant::panel`): the scalar reference against an f64 product of the
//! dequantized operands, and every SIMD panel kernel against the reference bit for bit.

use super::simd::{activations, filled_row, random_row};
use super::*;
use crate::quant::panel::{self, PanelKernels, PANEL_COLS, PANEL_ROWS};

/// The weight types with panel packers.
const PANEL_TYPES: [GgmlType; 18] = {
    use GgmlType::*;
    [
        Q4_0, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K, IQ4_NL, MXFP4, IQ4_XS, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S,
        IQ1_S, IQ1_M, TQ1_0, TQ2_0,
    ]
};

/// 16 weight rows of `nb` blocks: random codes at three scales, plus rows of all-ones and
/// all-zeros code bytes (extreme quants) with random scales.
fn weight_rows(r: &mut StdRng, t: GgmlType, nb: usize) -> Vec<Vec<u8>> {
    // The grid types: random valid blocks (every index and sign pattern) with finite scales; the
    // ternary types: random bytes (digits past the valid range included) with a finite scale.
    let seed = r.random::<u64>();
    if let Some(all) = crate::quant::testing::random_grid_blocks(t, PANEL_ROWS * nb, 1.0, seed) {
        return all.chunks_exact(nb * t.type_size()).map(|c| c.to_vec()).collect();
    }
    if let Some(at) = match t {
        GgmlType::TQ1_0 => Some(52),
        GgmlType::TQ2_0 => Some(64),
        _ => None,
    } {
        return (0..PANEL_ROWS)
            .map(|_| {
                let mut q: Vec<u8> = (0..nb * t.type_size()).map(|_| r.random()).collect();
                for b in q.chunks_exact_mut(t.type_size()) {
                    b[at..at + 2]
                        .copy_from_slice(&half::f16::from_f32(r.random_range(-1.0..1.0)).to_le_bytes());
                }
                q
            })
            .collect();
    }
    let mut rows: Vec<Vec<u8>> =
        (0..PANEL_ROWS - 2).map(|i| random_row(r, t, nb, [1.5, 1e3, -2.0][i % 3])).collect();
    for fill in [0xFFu8, 0x00] {
        let mut q = filled_row(r, t, nb, fill);
        if t == GgmlType::MXFP4 {
            // The fill would also set the E8M0 exponent (no f16 field keeps it): keep it at 2^0 so
            // the f64 comparison stays finite (0xFF is 2^127, whose dequantized values overflow).
            for b in q.chunks_exact_mut(t.type_size()) {
                b[0] = 128;
            }
        }
        rows.push(q);
    }
    rows
}

/// [`PANEL_COLS`] activation rows of `n` elements quantized to `vt`.
fn activation_rows(r: &mut StdRng, vt: GgmlType, n: usize) -> Vec<Vec<u8>> {
    let s = scalar_table();
    let mut ys: Vec<Vec<u8>> = Vec::new();
    while ys.len() < PANEL_COLS {
        ys.extend(activations(r, n).iter().map(|y| quantize(&s, vt, y)));
    }
    ys.truncate(PANEL_COLS);
    ys
}

/// Packs `rows` and `ys` with the packers of `p`.
fn pack(p: &PanelKernels, n: usize, rows: &[Vec<u8>], ys: &[Vec<u8>]) -> (Vec<u8>, Vec<Vec<u8>>) {
    let refs: [&[u8]; PANEL_ROWS] = std::array::from_fn(|i| rows[i].as_slice());
    let mut panel = vec![0u8; p.format.panel_bytes(n)];
    (p.pack_rows)(n, &refs, &mut panel);
    let cols = ys
        .iter()
        .map(|y| {
            let mut c = vec![0u8; p.format.col_bytes(n)];
            (p.pack_col)(n, y, &mut c);
            c
        })
        .collect();
    (panel, cols)
}

/// Block counts per type: one and three super-blocks' worth, and an odd count of 32-blocks.
fn block_counts(t: GgmlType) -> Vec<usize> {
    if t.blck_size() == 32 {
        vec![8, 24, 19]
    } else {
        vec![1, 3, 2]
    }
}

#[test]
fn reference_matches_f64_product_of_dequantized_operands() {
    let s = scalar_table();
    let mut r = rng(61);
    for t in PANEL_TYPES {
        let p = panel::scalar_kernels(t).unwrap();
        let vt = s.get(t).vec_dot_type;
        for nb in block_counts(t) {
            let n = nb * t.blck_size();
            let rows = weight_rows(&mut r, t, nb);
            let ys = activation_rows(&mut r, vt, n);
            let (panel_bytes, cols) = pack(&p, n, &rows, &ys);
            let col_refs: Vec<&[u8]> = cols.iter().map(|c| c.as_slice()).collect();
            let mut out = vec![f32::NAN; PANEL_COLS * PANEL_ROWS];
            (p.run)(p.format, n, &panel_bytes, &col_refs, &mut out);
            let wx: Vec<Vec<f32>> = rows.iter().map(|q| dequantize(&s, t, q, n)).collect();
            let wy: Vec<Vec<f32>> = ys.iter().map(|q| dequantize(&s, vt, q, n)).collect();
            for (c, y) in wy.iter().enumerate() {
                for (i, x) in wx.iter().enumerate() {
                    let want: f64 = x.iter().zip(y).map(|(&a, &b)| a as f64 * b as f64).sum();
                    let mag: f64 = x.iter().zip(y).map(|(&a, &b)| (a as f64 * b as f64).abs()).sum();
                    let got = out[c * PANEL_ROWS + i] as f64;
                    // f32 scale products and per-sub-block rounding: a few ulps of the magnitude,
                    // plus the weights' own f32 dequantization (K-quants: d·sc·q - dmin·m).
                    assert!(
                        (got - want).abs() <= 2e-6 * mag + 1e-30,
                        "{t} n={n} ({i},{c}): {got} vs {want} (magnitude {mag})"
                    );
                }
            }
            // And the one-column kernel agrees to the same bound.
            let dot = s.get(t).vec_dot.unwrap();
            for (c, y) in ys.iter().enumerate() {
                for (i, x) in rows.iter().enumerate() {
                    let (got, want) = (out[c * PANEL_ROWS + i] as f64, dot(n, x, y) as f64);
                    let mag: f64 = wx[i].iter().zip(&wy[c]).map(|(&a, &b)| (a as f64 * b as f64).abs()).sum();
                    assert!(
                        (got - want).abs() <= 4e-6 * mag + 1e-30,
                        "{t} n={n} ({i},{c}): {got} vs vec_dot {want}"
                    );
                }
            }
        }
    }
}

#[test]
fn simd_panels_equal_the_reference_bit_for_bit() {
    let s = scalar_table();
    let mut r = rng(62);
    let mut tested = 0;
    for isa in Isa::all_available() {
        let k = Kernels::build(isa);
        for t in PANEL_TYPES {
            let Some(p) = k.get(t).panel else { continue };
            let reference = panel::scalar_kernels(t).unwrap();
            assert_eq!(p.format, reference.format);
            let vt = s.get(t).vec_dot_type;
            for nb in block_counts(t) {
                let n = nb * t.blck_size();
                let rows = weight_rows(&mut r, t, nb);
                let ys = activation_rows(&mut r, vt, n);
                let (panel_bytes, cols) = pack(&p, n, &rows, &ys);
                for nc in 1..=PANEL_COLS {
                    let col_refs: Vec<&[u8]> = cols[cols.len() - nc..].iter().map(|c| c.as_slice()).collect();
                    let mut got = vec![f32::NAN; nc * PANEL_ROWS];
                    let mut want = vec![f32::NAN; nc * PANEL_ROWS];
                    (p.run)(p.format, n, &panel_bytes, &col_refs, &mut got);
                    panel::run_reference(p.format, n, &panel_bytes, &col_refs, &mut want);
                    for (o, (g, w)) in got.iter().zip(&want).enumerate() {
                        assert_eq!(
                            g.to_bits(),
                            w.to_bits(),
                            "{} {t} n={n} nc={nc} output {o}: {g} vs {w}",
                            isa.name()
                        );
                    }
                    tested += 1;
                }
            }
        }
    }
    // Only AVX-512 VNNI has panel kernels: a machine without them tests nothing here.
    let has_panels = Isa::all_available()
        .iter()
        .any(|&i| PANEL_TYPES.iter().any(|&t| Kernels::build(i).get(t).panel.is_some()));
    assert_eq!(tested > 0, has_panels);
}

#[test]
fn simd_packers_equal_the_scalar_packers_byte_for_byte() {
    // Every kernel set's packers (SIMD twins where a set has them) against the scalar ones, on
    // random rows at three scales and rows of extreme code bytes, over several block counts.
    let s = scalar_table();
    let mut r = rng(63);
    for isa in Isa::all_available() {
        let k = Kernels::build(isa);
        for t in PANEL_TYPES {
            let Some(p) = k.get(t).panel else { continue };
            let reference = panel::scalar_kernels(t).unwrap();
            let vt = s.get(t).vec_dot_type;
            for nb in block_counts(t) {
                let n = nb * t.blck_size();
                let rows = weight_rows(&mut r, t, nb);
                let ys = activation_rows(&mut r, vt, n);
                let (got_panel, got_cols) = pack(&p, n, &rows, &ys);
                let (want_panel, want_cols) = pack(&reference, n, &rows, &ys);
                assert!(got_panel == want_panel, "{} {t} n={n}: weight panels differ", isa.name());
                assert!(got_cols == want_cols, "{} {t} n={n}: activation columns differ", isa.name());
            }
        }
    }
}

#[test]
#[should_panic(expected = "row too short")]
fn short_weight_rows_are_refused_before_any_read() {
    // The SIMD packer where one is installed, else the scalar one: both check every row first.
    let t = GgmlType::Q4_0;
    let p = Kernels::build(*Isa::all_available().last().unwrap())
        .get(t)
        .panel
        .or(panel::scalar_kernels(t))
        .unwrap();
    let mut rows: Vec<Vec<u8>> = (0..PANEL_ROWS).map(|_| vec![0u8; 2 * t.type_size()]).collect();
    rows[PANEL_ROWS - 1].pop();
    let refs: [&[u8]; PANEL_ROWS] = std::array::from_fn(|i| rows[i].as_slice());
    let mut out = vec![0u8; p.format.panel_bytes(64)];
    (p.pack_rows)(64, &refs, &mut out);
}

#[test]
#[should_panic(expected = "a column is short")]
fn short_columns_are_refused_before_any_read() {
    let p = panel::scalar_kernels(GgmlType::Q4_0).unwrap();
    let panel_bytes = vec![0u8; p.format.panel_bytes(64)];
    let col = vec![0u8; p.format.col_bytes(32)];
    let mut out = [0.0f32; PANEL_ROWS];
    (p.run)(p.format, 64, &panel_bytes, &[&col], &mut out);
}
