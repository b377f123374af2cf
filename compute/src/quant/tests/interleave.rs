//! Interleaved weights (`quant::interleave`): the layout round-trips, the SIMD kernels equal
//! [`interleave::dot_reference`] bit for bit, and the reference equals the prepared `vec_dot` of
//! the de-interleaved rows bit for bit (where a kernel set has it) and the scalar `vec_dot` to
//! float rounding.

use super::simd::{activations, filled_row, random_row};
use super::*;
use crate::quant::interleave::{self, ROWS};
use crate::quant::prepared;

const TYPES: [GgmlType; 4] = [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q8_0];

/// 16 rows of `nb` blocks: random codes at three scales, extreme codes, and one row of zero scales.
fn rows(r: &mut rand::rngs::StdRng, t: GgmlType, nb: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for i in 0..ROWS {
        let row = match i % 6 {
            4 => filled_row(r, t, nb, 0xFF),
            5 => filled_row(r, t, nb, 0x00),
            j => random_row(r, t, nb, [1.5, 1e3, -2.0, 0.01][j]),
        };
        out.extend_from_slice(&row);
    }
    out
}

fn prepared_cols(r: &mut rand::rngs::StdRng, t: GgmlType, n: usize, bias: i32) -> Vec<(Vec<u8>, Vec<u8>)> {
    let s = scalar_table();
    let vdt = s.get(t).vec_dot_type;
    activations(r, n)
        .into_iter()
        .map(|y| {
            let q8 = quantize(&s, vdt, &y);
            let mut py = vec![0u8; prepared::row_bytes(n)];
            prepared::prepare(n, vdt, bias, &q8, &mut py);
            (q8, py)
        })
        .collect()
}

#[test]
fn interleave_round_trips_every_row() {
    let mut r = rng(91);
    for t in TYPES {
        for nb in [1usize, 3, 18] {
            let k = nb * 32;
            let row = t.row_size(k as u64).unwrap() as usize;
            let src: Vec<u8> = (0..2).flat_map(|_| rows(&mut r, t, nb)).collect();
            let mut il = vec![0u8; src.len()];
            interleave::interleave(t, k, 2 * ROWS, &src, &mut il);
            assert_eq!(interleave::group_bytes(t, k) * 2, src.len(), "{t}: group size");
            assert_ne!(il, src, "{t}: the layout changed nothing");
            let mut back = vec![0u8; row];
            for g in 0..2 {
                let group = &il[g * interleave::group_bytes(t, k)..];
                for i in 0..ROWS {
                    interleave::deinterleave_row(t, k, group, i, &mut back);
                    assert_eq!(back, src[(g * ROWS + i) * row..][..row], "{t} nb {nb} group {g} row {i}");
                }
            }
        }
    }
}

#[test]
fn interleaved_dots_equal_the_reference_and_vec_dot() {
    let s = scalar_table();
    let mut r = rng(92);
    let mut simd_tested = 0;
    for t in TYPES {
        for nb in [1usize, 8, 19] {
            let k = nb * 32;
            let row = t.row_size(k as u64).unwrap() as usize;
            let src = rows(&mut r, t, nb);
            let mut il = vec![0u8; src.len()];
            interleave::interleave(t, k, ROWS, &src, &mut il);
            let cols = prepared_cols(&mut r, t, k, interleave::bias(t));
            for pair in cols.chunks(2) {
                let ys: Vec<&[u8]> = pair.iter().map(|(_, p)| p.as_slice()).collect();
                let mut want = vec![0.0f32; ys.len() * ROWS];
                interleave::dot_reference(t, k, &il, &ys, &mut want);
                for (j, (q8, _)) in pair.iter().enumerate() {
                    let vdt = s.get(t).vec_dot_type;
                    let yf = dequantize(&s, vdt, q8, k);
                    for i in 0..ROWS {
                        // Against f64 over the dequantized operands: float rounding apart (Q8_1's
                        // f16 `s` rounds the min term by 2^-11 of its size).
                        let xf = dequantize(&s, t, &src[i * row..][..row], k);
                        let exact: f64 = xf.iter().zip(&yf).map(|(a, b)| *a as f64 * *b as f64).sum();
                        let mag: f64 = xf.iter().zip(&yf).map(|(a, b)| (*a as f64 * *b as f64).abs()).sum();
                        let got = want[j * ROWS + i] as f64;
                        if !exact.is_finite() || !mag.is_finite() || mag > 1e30 {
                            continue;
                        }
                        assert!(
                            (got - exact).abs() <= 2e-3 * mag + 1e-6,
                            "{t} k {k} row {i}: {got} vs {exact}"
                        );
                    }
                }
                for isa in Isa::all_available() {
                    let kern = Kernels::build(isa);
                    let Some(p) = kern.get(t).vec_dot_prepared else { continue };
                    assert_eq!(p.bias, interleave::bias(t), "{t}: prepared bias");
                    // The reference is the prepared dot, bit for bit.
                    for (j, (_, py)) in pair.iter().enumerate() {
                        for i in 0..ROWS {
                            let v = (p.dot)(k, &src[i * row..][..row], py);
                            let got = want[j * ROWS + i];
                            assert_eq!(
                                got.to_bits(),
                                v.to_bits(),
                                "{} {t} k {k} row {i}: {got} vs {v}",
                                isa.name()
                            );
                        }
                    }
                    let Some(f) = kern.get(t).interleaved_dot else { continue };
                    let mut got = vec![0.0f32; ys.len() * ROWS];
                    f(k, &il, &ys, &mut got, &il);
                    for (g, w) in got.iter().zip(&want) {
                        assert_eq!(g.to_bits(), w.to_bits(), "{} {t} k {k}: {g} vs {w}", isa.name());
                    }
                    simd_tested += 1;
                }
            }
        }
    }
    if Isa::all_available().contains(&Isa::Avx512) {
        assert!(simd_tested > 0, "no interleaved kernel was tested");
    }
}

#[test]
#[should_panic(expected = "interleaved dot")]
fn a_short_group_is_refused_before_the_kernel_reads_it() {
    let k = 64;
    let group = vec![0u8; interleave::group_bytes(GgmlType::Q4_0, k) - 1];
    let col = vec![0u8; prepared::row_bytes(k)];
    let mut out = [0.0f32; ROWS];
    interleave::dot_reference(GgmlType::Q4_0, k, &group, &[&col], &mut out);
}

#[test]
fn parallel_interleave_equals_the_serial_one() {
    let mut r = rng(93);
    // 8.9 MB: large enough for two threads (and an uneven split: 129 groups).
    let (t, k, m) = (GgmlType::Q8_0, 4096usize, 129 * ROWS);
    let src: Vec<u8> = (0..m * k / 32 * t.type_size()).map(|_| rand::Rng::random::<u8>(&mut r)).collect();
    let (mut a, mut b) = (vec![0u8; src.len()], vec![1u8; src.len()]);
    interleave::interleave(t, k, m, &src, &mut a);
    interleave::interleave_parallel(t, k, m, &src, &mut b, 3);
    assert!(a == b, "the parallel interleave differs");
}
