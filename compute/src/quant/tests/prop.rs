//! Property tests: arbitrary lengths, scales (zero, negative, huge) and NaN/Inf inputs never
//! panic, and finite inputs round-trip within per-block bounds.

use proptest::collection::vec as pvec;
use proptest::prelude::{any, prop_assert, prop_oneof, proptest, Just, ProptestConfig, Strategy};

use super::*;

/// Every type with a quantizer (weights and activation formats).
fn quant_types() -> Vec<GgmlType> {
    let mut v = WEIGHT_TYPES.to_vec();
    v.extend([GgmlType::Q8_1, GgmlType::Q8_K]);
    v
}

/// Any f32, including NaN, ±Inf, subnormals and huge values.
fn any_f32() -> impl Strategy<Value = f32> {
    prop_oneof![
        4 => -10.0f32..10.0,
        1 => Just(0.0f32),
        1 => Just(f32::NAN),
        1 => Just(f32::INFINITY),
        1 => Just(f32::NEG_INFINITY),
        1 => any::<f32>(),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Quantize, dequantize and dot every type on arbitrary values: no panic, whatever comes out.
    #[test]
    fn arbitrary_values_never_panic(vals in pvec(any_f32(), 256..=768), nblk in 0usize..=3) {
        let n = (nblk * 256).min(vals.len() / 256 * 256);
        let x = &vals[..n.min(vals.len())];
        for isa in Isa::all_available() {
            let k = Kernels::build(isa);
            for t in quant_types() {
                let q = quantize(&k, t, x);
                let _ = dequantize(&k, t, &q, x.len());
                if let Some(dot) = k.get(t).vec_dot {
                    let qy = quantize(&k, k.get(t).vec_dot_type, x);
                    let _ = dot(x.len(), &q, &qy);
                }
            }
        }
    }

    /// Q8_0 round trip: every element within half a step plus the f16 rounding of the scale.
    #[test]
    fn q8_0_roundtrip_within_half_step(
        vals in pvec(-1.0f32..1.0, 32..=320),
        scale in prop_oneof![Just(0.0f32), -1e4f32..-1e-4, 1e-4f32..1e4],
    ) {
        let n = vals.len() / 32 * 32;
        let x: Vec<f32> = vals[..n].iter().map(|v| v * scale).collect();
        let k = scalar_table();
        let y = dequantize(&k, GgmlType::Q8_0, &quantize(&k, GgmlType::Q8_0, &x), n);
        for (bx, by) in x.chunks(32).zip(y.chunks(32)) {
            let d = bx.iter().fold(0.0f32, |a, v| a.max(v.abs())) / 127.0;
            for (a, b) in bx.iter().zip(by) {
                prop_assert!((a - b).abs() <= d * (0.5 + 127.0 / 2048.0) * 1.001 + 1e-30, "{a} vs {b}, d {d}");
            }
        }
    }

    /// Every quantizer on scaled finite data: the NMSE is scale-invariant (within its bound and f16
    /// range), including negative scales.
    #[test]
    fn nmse_holds_across_scales(
        seed in any::<u64>(),
        scale in prop_oneof![-100.0f32..-0.01, 0.01f32..100.0],
    ) {
        let x: Vec<f32> = gaussian(&mut rng(seed), 512).iter().map(|v| v * scale).collect();
        let k = scalar_table();
        for t in quant_types() {
            let y = dequantize(&k, t, &quantize(&k, t, &x), x.len());
            let num: f64 = x.iter().zip(&y).map(|(a, b)| ((a - b) as f64).powi(2)).sum();
            let den: f64 = x.iter().map(|a| (*a as f64).powi(2)).sum();
            // Loose (4x the Gaussian-data bounds in the quantize tests) for 512-element samples.
            let bound = match t {
                GgmlType::Q2_K => 0.5,
                GgmlType::Q3_K => 0.2,
                GgmlType::MXFP4 => 0.12,
                GgmlType::F32 => 0.0,
                _ => 0.05,
            };
            prop_assert!(num / den <= bound, "{t}: nmse {} at scale {scale}", num / den);
        }
    }
}
