//! Prepared-activation dots (`quant::prepared`) against their kernel set's `vec_dot`, bit for bit.

use super::simd::{activations, filled_row, random_row};
use super::*;
use crate::quant::prepared;

#[test]
fn prepared_dots_equal_vec_dot_bit_for_bit() {
    let s = scalar_table();
    let mut r = rng(71);
    let mut tested = 0;
    for isa in Isa::all_available() {
        let k = Kernels::build(isa);
        for t in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q8_0] {
            let Some(p) = k.get(t).vec_dot_prepared else { continue };
            let dot = k.get(t).vec_dot.unwrap();
            for nb in [1usize, 8, 19] {
                let n = nb * 32;
                let mut xs: Vec<Vec<u8>> =
                    (0..3).map(|i| random_row(&mut r, t, nb, [1.5, 1e3, -2.0][i])).collect();
                // Extreme codes (every quant byte 0xFF or 0x00) with random scales.
                for fill in [0xFFu8, 0x00] {
                    xs.push(filled_row(&mut r, t, nb, fill));
                }
                for y in activations(&mut r, n) {
                    let vdt = s.get(t).vec_dot_type;
                    let q8 = quantize(&s, vdt, &y);
                    let mut py = vec![0u8; prepared::row_bytes(n)];
                    prepared::prepare(n, vdt, p.bias, &q8, &mut py);
                    for x in &xs {
                        let (got, want) = ((p.dot)(n, x, &py), dot(n, x, &q8));
                        assert_eq!(
                            got.to_bits(),
                            want.to_bits(),
                            "{} {t} n={n}: {got} vs {want}",
                            isa.name()
                        );
                        tested += 1;
                    }
                }
            }
        }
    }
    if Isa::all_available().contains(&Isa::Avx512) {
        assert!(tested > 0, "no prepared dot was tested");
    }
}
