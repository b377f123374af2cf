//! Every SIMD kernel set this CPU can run, against the scalar reference.
//!
//! `simd_vs_scalar!` instantiates one test per type; each test runs every available kernel set
//! (AVX2, AVX-512, NEON with and without dotprod as the CPU has them) on random blocks (random
//! bytes with finite scales, so every bit pattern of the quants occurs) and on edge rows (odd block
//! counts, all-zero and negative scales, large values). Bounds:
//! * dequantization and the activation quantizers Q8_0 / Q8_1 / Q8_K / F16 / BF16: bitwise equal
//!   (the SIMD paths use the reference rounding);
//! * dot products: |simd - scalar| ≤ 1e-5 · Σ|x_i·y_i| + 1e-6 (only the summation order differs);
//!   on the NEON sets the quantized types' dot products (one, four and 2×2 columns) and
//!   dequantizers are bitwise equal to the scalar reference, whatever the inputs (NaN and Inf
//!   included; a NaN result only has to be NaN, as Rust leaves NaN payloads unspecified): they sum
//!   the exact integer block sums in the reference's float order.

use super::*;
use crate::quant::blocks::to_f16le;

/// Byte offsets of the f16 scale fields in a block of `t` (set to finite values in random blocks).
pub(super) fn f16_fields(t: GgmlType) -> &'static [usize] {
    use GgmlType::*;
    match t {
        Q4_0 | Q5_0 | Q8_0 | IQ4_NL | IQ4_XS => &[0],
        Q4_1 | Q5_1 | Q4_K | Q5_K => &[0, 2],
        Q2_K => &[80, 82],
        Q3_K => &[108],
        Q6_K => &[208],
        _ => &[],
    }
}

/// A random row of `nb` blocks of `t` with finite scales; float types get random finite values.
pub(super) fn random_row(r: &mut StdRng, t: GgmlType, nb: usize, scale: f32) -> Vec<u8> {
    let n = nb * t.blck_size();
    match t {
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => {
            let x: Vec<f32> = gaussian(r, n).iter().map(|v| v * scale).collect();
            quantize(&scalar_table(), t, &x)
        }
        _ => {
            let mut q: Vec<u8> = (0..nb * t.type_size()).map(|_| r.random()).collect();
            for b in q.chunks_exact_mut(t.type_size()) {
                if t == GgmlType::MXFP4 {
                    // Exponents up to 2^72: above ~2^110 per-lane partial products overflow f32
                    // where the scalar block sum does not (real MXFP4 scales sit near 2^0).
                    b[0] = r.random_range(0..=200);
                }
                for &off in f16_fields(t) {
                    b[off..off + 2].copy_from_slice(&to_f16le(r.random_range(-1.0..1.0) * scale));
                }
            }
            q
        }
    }
}

/// A random row of `nb` blocks of `t` whose quant bytes are all `fill` (extreme codes), with
/// random finite scales.
pub(super) fn filled_row(r: &mut StdRng, t: GgmlType, nb: usize, fill: u8) -> Vec<u8> {
    let mut q = random_row(r, t, nb, 1.0);
    for b in q.chunks_exact_mut(t.type_size()) {
        let keep: Vec<(usize, [u8; 2])> = f16_fields(t).iter().map(|&o| (o, [b[o], b[o + 1]])).collect();
        b.fill(fill);
        for (o, v) in keep {
            b[o..o + 2].copy_from_slice(&v);
        }
    }
    q
}

/// Activation rows: random, all zero, negative-heavy, large.
pub(super) fn activations(r: &mut StdRng, n: usize) -> Vec<Vec<f32>> {
    vec![
        gaussian(r, n),
        vec![0.0; n],
        gaussian(r, n).iter().map(|v| -v.abs() * 3.0).collect(),
        gaussian(r, n).iter().map(|v| v * 300.0).collect(),
        (0..n).map(|i| if i % 7 == 0 { 1000.0 } else { (i as f32 * 0.37).sin() }).collect(),
    ]
}

/// Whether `isa`'s dot products of `t` must equal their scalar twin bit for bit: the NEON sets'
/// quantized kernels, and from dotprod up the float ones in ggml's NEON order (see `quant::aarch64`).
pub(super) fn bitwise_with_scalar(isa: Isa, t: GgmlType) -> bool {
    let float = matches!(t, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16);
    match isa {
        Isa::Neon => !float,
        Isa::NeonDotprod | Isa::NeonI8mm => true,
        _ => false,
    }
}

fn check_dot(isa: Isa, t: GgmlType, qx: &[u8], y: &[f32]) {
    let (s, k) = (scalar_table(), Kernels::build(isa));
    let vt = s.get(t).vec_dot_type;
    let n = y.len();
    let qy = quantize(&s, vt, y);
    let want = (super::twin_table(isa).get(t).vec_dot.unwrap())(n, qx, &qy);
    let got = (k.get(t).vec_dot.unwrap())(n, qx, &qy);
    if bitwise_with_scalar(isa, t) {
        let same = got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan());
        assert!(same, "{} {t} n={n}: simd {got} vs scalar {want}", isa.name());
    }
    let (dx, dy) = (dequantize(&s, t, qx, n), dequantize(&s, vt, &qy, n));
    let mag: f64 = dx.iter().zip(&dy).map(|(a, b)| (*a as f64 * *b as f64).abs()).sum();
    if !want.is_finite() || !mag.is_finite() {
        // Overflow (an f16 sum or an E8M0 scale near 2^127): only the absence of a panic is checked.
        return;
    }
    let err = (got as f64 - want as f64).abs();
    assert!(err <= 1e-5 * mag + 1e-6, "{} {t} n={n}: simd {got} vs scalar {want} (mag {mag:e})", isa.name());
}

fn check_bitwise(isa: Isa, t: GgmlType, qx: &[u8], x: &[f32]) {
    let (s, k) = (scalar_table(), Kernels::build(isa));
    let n = x.len();
    let a = dequantize(&s, t, qx, n);
    let b = dequantize(&k, t, qx, n);
    assert!(a.iter().zip(&b).all(|(a, b)| a.to_bits() == b.to_bits()), "{} {t}: to_f32 differs", isa.name());
    if matches!(t, GgmlType::Q8_0 | GgmlType::Q8_1 | GgmlType::Q8_K | GgmlType::F16 | GgmlType::BF16) {
        assert_eq!(quantize_twin(isa, t, x), quantize(&k, t, x), "{} {t}: from_f32 differs", isa.name());
    }
}

/// The scalar twin of `isa`'s quantizer for `t`: on x86, Q8_0 and Q8_1 round as ggml's x86 path does
/// (`127/amax`, half to even); on the NEON sets from dotprod up as ggml's NEON path does (`1/d`, half
/// to even); everything else is the scalar reference.
pub(super) fn quantize_twin(isa: Isa, t: GgmlType, x: &[f32]) -> Vec<u8> {
    use crate::quant::scalar as sc;
    let x86 = matches!(isa, Isa::Avx2 | Isa::Avx512);
    let neon = matches!(isa, Isa::NeonDotprod | Isa::NeonI8mm);
    let f: Option<crate::quant::FromF32Fn> = match t {
        GgmlType::Q8_0 if x86 => Some(sc::q8_0_from_f32_x86),
        GgmlType::Q8_1 if x86 => Some(sc::q8_1_from_f32_x86),
        GgmlType::Q8_0 if neon => Some(sc::neon_order::q8_0_from_f32_neon),
        GgmlType::Q8_1 if neon => Some(sc::neon_order::q8_1_from_f32_neon),
        _ => None,
    };
    match f {
        Some(f) => {
            let mut out = vec![0u8; x.len() / t.blck_size() * t.type_size()];
            f(x, &mut out);
            out
        }
        None => quantize(&scalar_table(), t, x),
    }
}

/// Runs every check of `t` on every available SIMD kernel set.
fn check_type(t: GgmlType) {
    let mut r = rng(t as u64 * 1000 + 1);
    let blocks_per_256 = 256 / t.blck_size().min(256);
    for isa in Isa::all_available().into_iter().filter(|&i| i != Isa::Scalar) {
        for nb256 in [1usize, 2, 3, 5, 7] {
            // Odd counts of the type's own blocks too: 1 block of 32 is 32 elements.
            for nb in [nb256 * blocks_per_256, nb256] {
                let n = nb * t.blck_size();
                for scale in [1.0f32, -3.0, 0.0, 2000.0] {
                    let qx = random_row(&mut r, t, nb, scale);
                    for y in activations(&mut r, n) {
                        check_dot(isa, t, &qx, &y);
                        check_bitwise(isa, t, &qx, &y);
                    }
                }
            }
        }
    }
}

macro_rules! simd_vs_scalar {
    ($($name:ident => $t:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                check_type(GgmlType::$t);
            }
        )*
    };
}

simd_vs_scalar! {
    f32_kernels => F32,
    f16_kernels => F16,
    bf16_kernels => BF16,
    q4_0_kernels => Q4_0,
    q4_1_kernels => Q4_1,
    q5_0_kernels => Q5_0,
    q5_1_kernels => Q5_1,
    q8_0_kernels => Q8_0,
    q2_k_kernels => Q2_K,
    q3_k_kernels => Q3_K,
    q4_k_kernels => Q4_K,
    q5_k_kernels => Q5_K,
    q6_k_kernels => Q6_K,
    iq4_nl_kernels => IQ4_NL,
    iq4_xs_kernels => IQ4_XS,
    mxfp4_kernels => MXFP4,
}

#[test]
fn activation_quantizers_bitwise() {
    let mut r = rng(99);
    for isa in Isa::all_available().into_iter().filter(|&i| i != Isa::Scalar) {
        for t in [GgmlType::Q8_0, GgmlType::Q8_1, GgmlType::Q8_K, GgmlType::F16, GgmlType::BF16] {
            for nb in [1usize, 2, 3, 9] {
                for x in activations(&mut r, nb * 256) {
                    let k = Kernels::build(isa);
                    assert_eq!(quantize_twin(isa, t, &x), quantize(&k, t, &x), "{} {t} nb={nb}", isa.name());
                }
            }
        }
    }
}

#[test]
fn vec_dot_x4_matches_four_scalar_dots() {
    let s = scalar_table();
    let mut r = rng(4);
    for isa in Isa::all_available() {
        let k = Kernels::build(isa);
        for t in WEIGHT_TYPES {
            let Some(x4) = k.get(t).vec_dot_x4 else { continue };
            let vt = s.get(t).vec_dot_type;
            for nb256 in [1usize, 3] {
                let n = nb256 * 256;
                let qx = random_row(&mut r, t, n / t.blck_size(), 1.5);
                let ys: Vec<Vec<u8>> =
                    activations(&mut r, n).iter().take(4).map(|y| quantize(&s, vt, y)).collect();
                let got = x4(n, &qx, [&ys[0], &ys[1], &ys[2], &ys[3]]);
                for c in 0..4 {
                    let want = (s.get(t).vec_dot.unwrap())(n, &qx, &ys[c]);
                    let (dx, dy) = (dequantize(&s, t, &qx, n), dequantize(&s, vt, &ys[c], n));
                    let mag: f64 = dx.iter().zip(&dy).map(|(a, b)| (*a as f64 * *b as f64).abs()).sum();
                    let err = (got[c] as f64 - want as f64).abs();
                    assert!(err <= 1e-5 * mag + 1e-6, "{} {t} col {c}: {} vs {want}", isa.name(), got[c]);
                }
            }
        }
    }
}

/// The x86 kernel sets' K-quant and IQ4_XS dot products, in the one-column order and in the tiled
/// product's, against the scalar models of ggml's AVX2 orders (`scalar::kquants_x86`), bit for bit: random blocks (every quant bit pattern, finite
/// scales of both signs), blocks of extreme codes, odd super-block counts, and activations from
/// zero to large (the Q8_K quantizer is itself bitwise equal to ggml's reference, see
/// `activation_quantizers_bitwise`). With the four-column and tiled kernels checked against
/// `vec_dot` below, every x86 path of these types reproduces llama.cpp's AVX2 results.
#[test]
fn x86_kquant_dots_equal_ggml_avx2_model_bitwise() {
    use crate::quant::scalar::kquants_x86 as m;
    use GgmlType::*;
    let s = scalar_table();
    let mut r = rng(11);
    let models: [(GgmlType, crate::quant::VecDotFn); 6] = [
        (Q2_K, m::vec_dot_q2_k_q8_k_x86),
        (Q3_K, m::vec_dot_q3_k_q8_k_x86),
        (Q4_K, m::vec_dot_q4_k_q8_k_x86),
        (Q5_K, m::vec_dot_q5_k_q8_k_x86),
        (Q6_K, m::vec_dot_q6_k_q8_k_x86),
        (IQ4_XS, m::vec_dot_iq4_xs_q8_k_x86),
    ];
    let tiled: [(GgmlType, crate::quant::VecDotFn); 6] = [
        (Q2_K, m::vec_dot_q2_k_q8_k_tiled_x86),
        (Q3_K, m::vec_dot_q3_k_q8_k_tiled_x86),
        (Q4_K, m::vec_dot_q4_k_q8_k_tiled_x86),
        (Q5_K, m::vec_dot_q5_k_q8_k_tiled_x86),
        (Q6_K, m::vec_dot_q6_k_q8_k_tiled_x86),
        (IQ4_XS, m::vec_dot_iq4_xs_q8_k_tiled_x86),
    ];
    let mut tested = 0;
    for isa in Isa::all_available().into_iter().filter(|i| matches!(i, Isa::Avx2 | Isa::Avx512)) {
        let k = Kernels::build(isa);
        // The one-column order (vec_dot) and the tiled-product order (vec_dot_batch).
        let dots = models
            .iter()
            .map(|&(t, f)| (t, f, k.get(t).vec_dot.unwrap()))
            .chain(tiled.iter().map(|&(t, f)| (t, f, k.get(t).vec_dot_batch.unwrap())));
        for (t, model, dot) in dots {
            for nb in [1usize, 2, 5] {
                let n = nb * 256;
                let mut xrows: Vec<Vec<u8>> =
                    [1.0f32, -3.0, 2000.0].iter().map(|&sc| random_row(&mut r, t, nb, sc)).collect();
                for fill in [0xFFu8, 0x00, 0x55, 0xAA] {
                    xrows.push(filled_row(&mut r, t, nb, fill));
                }
                for y in activations(&mut r, n) {
                    let qy = quantize(&s, Q8_K, &y);
                    for qx in &xrows {
                        let (got, want) = (dot(n, qx, &qy), model(n, qx, &qy));
                        assert_eq!(
                            got.to_bits(),
                            want.to_bits(),
                            "{} {t} n={n}: {got} vs model {want}",
                            isa.name()
                        );
                        tested += 1;
                    }
                }
            }
        }
    }
    if Isa::all_available().contains(&Isa::Avx2) {
        assert!(tested > 0);
    }
}

/// AVX2's IQ4_NL dot in tinyBLAS's order (its `vec_dot_gemm`, used for matrix products over two or
/// more activation rows) against the scalar model, bit for bit.
#[test]
fn x86_iq4_nl_gemm_order_equals_tinyblas_model_bitwise() {
    use crate::quant::scalar::kquants_x86::vec_dot_iq4_nl_q8_0_tinyblas_x86 as model;
    let s = scalar_table();
    let mut r = rng(12);
    if !Isa::all_available().contains(&Isa::Avx2) {
        return;
    }
    let k = Kernels::build(Isa::Avx2);
    let dot = k.get(GgmlType::IQ4_NL).vec_dot_gemm.expect("AVX2 sets the IQ4_NL tinyBLAS order");
    for nb in [1usize, 2, 7, 18] {
        let n = nb * 32;
        let mut xrows: Vec<Vec<u8>> =
            [1.0f32, -3.0, 2000.0].iter().map(|&sc| random_row(&mut r, GgmlType::IQ4_NL, nb, sc)).collect();
        for fill in [0xFFu8, 0x00, 0x5A] {
            xrows.push(filled_row(&mut r, GgmlType::IQ4_NL, nb, fill));
        }
        for y in activations(&mut r, n) {
            let qy = quantize(&s, GgmlType::Q8_0, &y);
            for qx in &xrows {
                let (got, want) = (dot(n, qx, &qy), model(n, qx, &qy));
                assert_eq!(got.to_bits(), want.to_bits(), "IQ4_NL n={n}: {got} vs model {want}");
            }
        }
    }
}

/// The four-column kernels against the same kernel set's one-column `vec_dot`, bit for bit: matmul
/// picks one or the other by column position, so they must agree exactly (ggml's order per output).
#[test]
fn vec_dot_x4_bitwise_equals_vec_dot() {
    let s = scalar_table();
    let mut r = rng(5);
    let avx2 = Isa::all_available().contains(&Isa::Avx2).then(|| Kernels::build(Isa::Avx2));
    let avx2_dot = |t: GgmlType| avx2.as_ref().and_then(|k| k.get(t).vec_dot);
    for isa in Isa::all_available() {
        let k = Kernels::build(isa);
        for t in WEIGHT_TYPES {
            let Some(x4) = k.get(t).vec_dot_x4 else { continue };
            let dot = k.get(t).vec_dot.unwrap();
            let vt = s.get(t).vec_dot_type;
            let per256 = 256 / t.blck_size().min(256);
            for nb in [per256, 3 * per256, if t.blck_size() == 32 { 18 } else { 2 }] {
                let n = nb * t.blck_size();
                let mut xrows = vec![random_row(&mut r, t, nb, 1.5), random_row(&mut r, t, nb, 1e3)];
                // Edge weights: every quant byte 0xFF / 0x00 (extreme codes), scales kept finite.
                for fill in [0xFFu8, 0x00] {
                    xrows.push(filled_row(&mut r, t, nb, fill));
                }
                let ys: Vec<Vec<u8>> = activations(&mut r, n).iter().map(|y| quantize(&s, vt, y)).collect();
                for qx in &xrows {
                    for w in ys.windows(4) {
                        let got = x4(n, qx, [&w[0], &w[1], &w[2], &w[3]]);
                        for c in 0..4 {
                            let want = dot(n, qx, &w[c]);
                            assert_eq!(got[c].to_bits(), want.to_bits(), "{} {t} n={n} col {c}", isa.name());
                            // The x86 sets all reproduce ggml's AVX2 results (what opdiff checks).
                            if let Some(d2) = avx2_dot(t) {
                                let want2 = d2(n, qx, &w[c]);
                                assert_eq!(
                                    got[c].to_bits(),
                                    want2.to_bits(),
                                    "{} {t} n={n} col {c} vs avx2",
                                    isa.name()
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The four-row, one-column forms against the same table's `vec_dot`, bit for bit, in every kernel
/// set and numerics profile this CPU runs: matmul takes them for single-column products (attention's
/// K·Q at generation), so they must change nothing. Row lengths around the vector steps, the
/// attention head sizes, and large magnitudes.
#[test]
fn vec_dot_rows4_bitwise_equals_vec_dot() {
    let mut r = rng(44);
    let mut checked = 0;
    for isa in Isa::all_available() {
        for numerics in crate::numerics::ALL {
            let k = Kernels::build_for(isa, numerics);
            for t in WEIGHT_TYPES {
                let (Some(r4), Some(dot)) = (k.get(t).vec_dot_rows4, k.get(t).vec_dot) else { continue };
                let vt = k.get(t).vec_dot_type;
                for n in [t.blck_size(), 32, 64, 80, 96, 128, 256, 4096 + 32 * 3]
                    .into_iter()
                    .filter(|n| n % t.blck_size() == 0)
                    .chain((t.blck_size() == 1).then_some([1usize, 7, 63, 65, 127]).into_iter().flatten())
                {
                    let nb = n / t.blck_size();
                    for scale in [1.0f32, 30.0] {
                        let x: Vec<Vec<u8>> = (0..4).map(|_| random_row(&mut r, t, nb, scale)).collect();
                        let y = quantize(
                            &k,
                            vt,
                            &gaussian(&mut r, n).iter().map(|v| v * scale).collect::<Vec<_>>(),
                        );
                        let got = r4(n, [&x[0], &x[1], &x[2], &x[3]], &y);
                        for i in 0..4 {
                            let want = dot(n, &x[i], &y);
                            assert_eq!(
                                got[i].to_bits(),
                                want.to_bits(),
                                "{} {numerics:?} {t} n={n} row {i}",
                                isa.name()
                            );
                        }
                        checked += 1;
                    }
                }
            }
        }
    }
    // On x86 with AVX2 at least the F16 form exists in every profile but the scalar one.
    if Isa::all_available().contains(&Isa::Avx2) {
        assert!(checked > 0, "no four-row form was checked");
    }
}

/// The four-column forms of the tiled-order dots against their one-column kernels, bit for bit, in
/// every kernel set and profile (matmul takes them for 8+ activation rows, four columns at a time).
#[test]
fn vec_dot_batch_x4_bitwise_equals_vec_dot_batch() {
    let mut r = rng(45);
    let mut checked = 0;
    for isa in Isa::all_available() {
        for numerics in crate::numerics::ALL {
            let k = Kernels::build_for(isa, numerics);
            for t in WEIGHT_TYPES {
                let (Some(x4), Some(one)) = (k.get(t).vec_dot_batch_x4, k.get(t).vec_dot_batch) else {
                    continue;
                };
                let vt = k.get(t).vec_dot_type;
                for nb in [1usize, 3, 6] {
                    let n = nb * t.blck_size();
                    let mut xrows = vec![random_row(&mut r, t, nb, 1.5), random_row(&mut r, t, nb, 1e3)];
                    for fill in [0xFFu8, 0x00] {
                        xrows.push(filled_row(&mut r, t, nb, fill));
                    }
                    let ys: Vec<Vec<u8>> =
                        activations(&mut r, n).iter().map(|y| quantize(&k, vt, y)).collect();
                    for qx in &xrows {
                        for w in ys.windows(4) {
                            let got = x4(n, qx, [&w[0], &w[1], &w[2], &w[3]]);
                            for c in 0..4 {
                                let want = one(n, qx, &w[c]);
                                assert_eq!(
                                    got[c].to_bits(),
                                    want.to_bits(),
                                    "{} {numerics:?} {t} n={n} col {c}",
                                    isa.name()
                                );
                            }
                            checked += 1;
                        }
                    }
                }
            }
        }
    }
    if Isa::all_available().contains(&Isa::Avx2) {
        assert!(checked > 0, "no four-column tiled-order form was checked");
    }
}

/// The tiled matrix × matrix kernels against the same kernel set's `vec_dot` (and AVX2's), bit for
/// bit, for every output of odd-shaped products: row and column counts that leave partial tiles,
/// block counts with tails, extreme weight codes. matmul picks the tile or `vec_dot` by shape, so
/// they must agree exactly (ggml's AVX2 order per output).
#[test]
fn gemm_bitwise_equals_vec_dot() {
    let s = scalar_table();
    let mut r = rng(6);
    let avx2 = Isa::all_available().contains(&Isa::Avx2).then(|| Kernels::build(Isa::Avx2));
    let mut tested = 0;
    for isa in Isa::all_available() {
        let k = Kernels::build(isa);
        for t in WEIGHT_TYPES {
            let Some(gemm) = k.get(t).gemm else { continue };
            // Float types tile their GEMM order.
            let dot = k.get(t).vec_dot_gemm.or(k.get(t).vec_dot).unwrap();
            let vt = s.get(t).vec_dot_type;
            let per256 = 256 / t.blck_size().min(256);
            for nb in [per256, 3 * per256, if t.blck_size() == 32 { 19 } else { 2 }] {
                let n = nb * t.blck_size();
                let mut xrows: Vec<Vec<u8>> =
                    (0..5).map(|i| random_row(&mut r, t, nb, [1.5, 1e3, -2.0][i % 3])).collect();
                for fill in [0xFFu8, 0x00] {
                    let mut q = random_row(&mut r, t, nb, 1.0);
                    for b in q.chunks_exact_mut(t.type_size()) {
                        let keep: Vec<(usize, [u8; 2])> =
                            f16_fields(t).iter().map(|&o| (o, [b[o], b[o + 1]])).collect();
                        b.fill(fill);
                        for (o, v) in keep {
                            b[o..o + 2].copy_from_slice(&v);
                        }
                    }
                    xrows.push(q);
                }
                let mut ys: Vec<Vec<u8>> = Vec::new();
                while ys.len() < 9 {
                    ys.extend(activations(&mut r, n).iter().map(|y| quantize(&s, vt, y)));
                }
                for (m, nc) in [(7usize, 9usize), (4, 4), (1, 5), (5, 3), (3, 1), (2, 8)] {
                    let x: Vec<&[u8]> = xrows[..m].iter().map(|v| v.as_slice()).collect();
                    let y: Vec<&[u8]> = ys[..nc].iter().map(|v| v.as_slice()).collect();
                    let mut out = vec![f32::NAN; m * nc];
                    gemm(n, &x, &y, &mut out);
                    for j in 0..nc {
                        for i in 0..m {
                            let got = out[j * m + i];
                            let want = dot(n, x[i], y[j]);
                            assert_eq!(
                                got.to_bits(),
                                want.to_bits(),
                                "{} {t} n={n} {m}x{nc} ({i},{j})",
                                isa.name()
                            );
                            if let Some(d2) =
                                avx2.as_ref().and_then(|k| k.get(t).vec_dot_gemm.or(k.get(t).vec_dot))
                            {
                                let want2 = d2(n, x[i], y[j]);
                                assert_eq!(
                                    got.to_bits(),
                                    want2.to_bits(),
                                    "{} {t} ({i},{j}) vs avx2",
                                    isa.name()
                                );
                            }
                            tested += 1;
                        }
                    }
                }
            }
        }
    }
    // On a CPU with a tiled kernel set, outputs were compared (elsewhere the loop is empty).
    if Isa::all_available().contains(&Isa::Avx512) {
        assert!(tested > 0, "no tiled kernel was tested");
    }
}

/// The grid IQ types, TQ1_0 and TQ2_0: every kernel set's `vec_dot` (and its four-column and 2×2
/// kernels where it has them: the NEON sets) equals its twin bit for bit (the scalar one; from NEON
/// dotprod up ggml's NEON order, `scalar::iq_neon`) (the SIMD part is the
/// exact integer sum), on random blocks, on blocks with every scale and sign bit set, and against
/// activations of ±127 (the largest products the integer paths meet). On aarch64 this covers the
/// neon, neon-dotprod and neon-i8mm sets the CPU runs; `tests::neon` adds non-finite scales.
#[test]
fn grid_type_dots_equal_the_scalar_kernel_bitwise() {
    use crate::quant::testing::random_grid_blocks;
    let s = scalar_table();
    let mut r = rng(24);
    let types = {
        use GgmlType::*;
        [IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M, TQ1_0, TQ2_0]
    };
    for isa in Isa::all_available() {
        let k = Kernels::build(isa);
        for t in types {
            for nb in [1usize, 3, 8] {
                let n = nb * 256;
                let mut rows = vec![match random_grid_blocks(t, nb, 1.0, r.random()) {
                    Some(b) => b,
                    None => quantize(&s, t, &gaussian(&mut r, n)),
                }];
                // Every bit of the row set except the f16 scales' (kept finite by the copy; IQ1_M's is
                // the top nibbles of its scale words), and a row of random bytes (every bit pattern, TQ bytes past 3^5 included), with the
                // scales of the first row.
                let size = t.type_size();
                let keep_scale = |b: &mut [u8], orig: &[u8]| match t {
                    GgmlType::TQ1_0 => b[52..54].copy_from_slice(&orig[52..54]),
                    GgmlType::TQ2_0 => b[64..66].copy_from_slice(&orig[64..66]),
                    GgmlType::IQ1_M => {
                        for (k, o) in b[48..56].iter_mut().zip(&orig[48..56]).skip(1).step_by(2) {
                            *k = (*k & 0x0F) | (o & 0xF0);
                        }
                    }
                    _ => b[..2].copy_from_slice(&orig[..2]),
                };
                let mut all = rows[0].clone();
                let mut noise: Vec<u8> = (0..rows[0].len()).map(|_| r.random()).collect();
                for ((b, z), orig) in all
                    .chunks_exact_mut(size)
                    .zip(noise.chunks_exact_mut(size))
                    .zip(rows[0].chunks_exact(size))
                {
                    b.fill(0xFF);
                    keep_scale(b, orig);
                    keep_scale(z, orig);
                }
                rows.push(all);
                rows.push(noise);
                let mut acts: Vec<Vec<u8>> =
                    activations(&mut r, n).iter().take(2).map(|y| quantize(&s, GgmlType::Q8_K, y)).collect();
                let extreme: Vec<f32> = (0..n).map(|i| if i % 3 == 0 { -1.0 } else { 1.0 }).collect();
                acts.push(quantize(&s, GgmlType::Q8_K, &extreme));
                // The twin: the scalar kernel, or from NEON dotprod up ggml's NEON order.
                let tw = super::twin_table(isa);
                let want = |x: &[u8], y: &[u8]| (tw.get(t).vec_dot.unwrap())(n, x, y);
                let e = k.get(t);
                for x in &rows {
                    for y in &acts {
                        let w = want(x, y);
                        let got = (e.vec_dot.unwrap())(n, x, y);
                        assert_eq!(got.to_bits(), w.to_bits(), "{} {t} n={n}: {got} vs {w}", isa.name());
                    }
                    if let Some(x4) = e.vec_dot_x4 {
                        let cols = [&acts[0], &acts[1], &acts[2], &acts[0]];
                        let got = x4(n, x, cols.map(|c| c.as_slice()));
                        for (c, g) in got.iter().enumerate() {
                            let w = want(x, cols[c]);
                            assert_eq!(
                                g.to_bits(),
                                w.to_bits(),
                                "{} {t} n={n} x4 col {c}: {g} vs {w}",
                                isa.name()
                            );
                        }
                    }
                }
                if let Some(k22) = e.vec_dot_2x2 {
                    for xp in rows.windows(2) {
                        for yp in acts.windows(2) {
                            let got = k22(n, [&xp[0], &xp[1]], [&yp[0], &yp[1]]);
                            for (j, g) in got.iter().enumerate() {
                                let w = want(&xp[j / 2], &yp[j % 2]);
                                assert_eq!(g.to_bits(), w.to_bits(), "{} {t} n={n} 2x2 lane {j}", isa.name());
                            }
                        }
                    }
                }
                // On aarch64 every NEON set has its own kernels for these types (so this test is
                // not the scalar kernel against itself there).
                #[cfg(target_arch = "aarch64")]
                if isa != Isa::Scalar {
                    assert_ne!(
                        e.vec_dot.unwrap() as usize,
                        s.get(t).vec_dot.unwrap() as usize,
                        "{} {t}",
                        isa.name()
                    );
                }
            }
        }
    }
}

/// Under the `avx2` and `avx512` numerics profiles the x86 kernel sets' grid IQ, TQ1_0 and TQ2_0 dot
/// products follow ggml's orders: `vec_dot` (one to seven activation rows; every count for TQ) and
/// `vec_dot_batch` (the grid types' tiled product, eight or more) equal the scalar models of `scalar::iq_x86` bit for bit, on random blocks, blocks
/// with every bit set but the scale, random bytes, odd super-block counts, and activations from zero
/// to large and of ±127 (the largest products the integer lanes meet).
#[test]
fn x86_grid_iq_dots_equal_ggml_models_bitwise() {
    use crate::numerics::Numerics;
    use crate::quant::scalar::iq_x86 as m;
    use crate::quant::testing::random_grid_blocks;
    use GgmlType::*;
    let s = scalar_table();
    let mut r = rng(31);
    type Dot = crate::quant::VecDotFn;
    let models: [(GgmlType, Dot, Option<Dot>); 9] = [
        (IQ2_XXS, m::vec_dot_iq2_xxs_q8_k_x86, Some(m::vec_dot_iq2_xxs_q8_k_tiled_x86)),
        (IQ2_XS, m::vec_dot_iq2_xs_q8_k_x86, Some(m::vec_dot_iq2_xs_q8_k_tiled_x86)),
        (IQ2_S, m::vec_dot_iq2_s_q8_k_x86, Some(m::vec_dot_iq2_s_q8_k_tiled_x86)),
        (IQ3_XXS, m::vec_dot_iq3_xxs_q8_k_x86, Some(m::vec_dot_iq3_xxs_q8_k_tiled_x86)),
        (IQ3_S, m::vec_dot_iq3_s_q8_k_x86, Some(m::vec_dot_iq3_s_q8_k_tiled_x86)),
        (IQ1_S, m::vec_dot_iq1_s_q8_k_x86, Some(m::vec_dot_iq1_s_q8_k_tiled_x86)),
        (IQ1_M, m::vec_dot_iq1_m_q8_k_x86, Some(m::vec_dot_iq1_m_q8_k_tiled_x86)),
        (TQ1_0, m::vec_dot_tq1_0_q8_k_x86, None),
        (TQ2_0, m::vec_dot_tq2_0_q8_k_x86, None),
    ];
    let mut tested = 0;
    for isa in Isa::all_available().into_iter().filter(|i| matches!(i, Isa::Avx2 | Isa::Avx512)) {
        for numerics in [Numerics::Avx2, Numerics::Avx512] {
            let k = Kernels::build_for(isa, numerics);
            for (t, one_row, tiled) in models {
                let e = k.get(t);
                let mut dots = vec![(one_row, e.vec_dot.unwrap(), "vec_dot")];
                if let Some(tiled) = tiled {
                    dots.push((tiled, e.vec_dot_batch.unwrap(), "tiled"));
                }
                for nb in [1usize, 3, 8] {
                    let n = nb * 256;
                    let first = match random_grid_blocks(t, nb, 1.0, r.random()) {
                        Some(b) => b,
                        None => quantize(&s, t, &gaussian(&mut r, n)),
                    };
                    // Every bit set, and random bytes, each with the first row's (finite) scales.
                    let size = t.type_size();
                    let keep_scale = |b: &mut [u8], orig: &[u8]| match t {
                        TQ1_0 => b[52..54].copy_from_slice(&orig[52..54]),
                        TQ2_0 => b[64..66].copy_from_slice(&orig[64..66]),
                        IQ1_M => {
                            for (k, o) in b[48..56].iter_mut().zip(&orig[48..56]).skip(1).step_by(2) {
                                *k = (*k & 0x0F) | (o & 0xF0);
                            }
                        }
                        _ => b[..2].copy_from_slice(&orig[..2]),
                    };
                    let mut all = first.clone();
                    let mut noise: Vec<u8> = (0..first.len()).map(|_| r.random()).collect();
                    for ((b, z), orig) in all
                        .chunks_exact_mut(size)
                        .zip(noise.chunks_exact_mut(size))
                        .zip(first.chunks_exact(size))
                    {
                        b.fill(0xFF);
                        keep_scale(b, orig);
                        keep_scale(z, orig);
                    }
                    let mut acts: Vec<Vec<u8>> =
                        activations(&mut r, n).iter().map(|y| quantize(&s, Q8_K, y)).collect();
                    let extreme: Vec<f32> = (0..n).map(|i| if i % 3 == 0 { -1.0 } else { 1.0 }).collect();
                    acts.push(quantize(&s, Q8_K, &extreme));
                    for x in [&first, &all, &noise] {
                        for y in &acts {
                            for &(model, dot, what) in &dots {
                                let (got, want) = (dot(n, x, y), model(n, x, y));
                                assert_eq!(
                                    got.to_bits(),
                                    want.to_bits(),
                                    "{} {numerics:?} {t} {what} n={n}: {got} vs model {want}",
                                    isa.name()
                                );
                                tested += 1;
                            }
                        }
                    }
                }
            }
        }
    }
    if Isa::all_available().contains(&Isa::Avx2) {
        assert!(tested > 0);
    }
}

/// Under the `avx2` and `avx512` numerics profiles BF16's `vec_dot` and `vec_dot_gemm` follow ggml's
/// x86 builds (AVX2; on a CPU with AVX512-BF16 the native build's `vdpbf16ps` orders), equal to the
/// scalar models of `scalar::bf16_x86` bit for bit: lengths around every step (8, 32, 64) with
/// leftovers, random rows of several scales, zeros, mixed magnitudes (rounding in every add), and
/// denormal inputs and underflowing products (`vdpbf16ps` reads and writes them as zero).
#[cfg(target_arch = "x86_64")]
#[test]
fn x86_bf16_dots_equal_ggml_models_bitwise() {
    use crate::numerics::Numerics;
    use crate::quant::scalar::bf16_x86 as m;
    let s = scalar_table();
    let mut r = rng(32);
    let mut tested = 0;
    for isa in Isa::all_available().into_iter().filter(|i| matches!(i, Isa::Avx2 | Isa::Avx512)) {
        for numerics in [Numerics::Avx2, Numerics::Avx512] {
            let k = Kernels::build_for(isa, numerics);
            let native_bf16 = numerics == Numerics::Avx512
                && is_x86_feature_detected!("avx512bf16")
                && crate::quant::x86_64::avx512_numerics_available();
            let (one, gemm): (crate::quant::VecDotFn, crate::quant::VecDotFn) = if native_bf16 {
                (m::vec_dot_bf16_avx512bf16_x86, m::vec_dot_bf16_gemm_avx512bf16_x86)
            } else {
                (m::vec_dot_bf16_avx2_x86, m::vec_dot_bf16_gemm_avx2_x86)
            };
            let e = k.get(GgmlType::BF16);
            let pairs = [(one, e.vec_dot.unwrap(), "vec_dot"), (gemm, e.vec_dot_gemm.unwrap(), "gemm")];
            for n in [1usize, 7, 8, 24, 31, 32, 33, 63, 64, 65, 96, 100, 128, 1000, 4096] {
                let mut rows: Vec<Vec<f32>> = [1.0f32, 1e-3, 300.0]
                    .iter()
                    .map(|&sc| gaussian(&mut r, n).iter().map(|v| v * sc).collect())
                    .collect();
                rows.push(vec![0.0; n]);
                rows.push(
                    (0..n).map(|i| if i % 5 == 0 { 1e4 } else { (i as f32 * 0.37).sin() * 1e-3 }).collect(),
                );
                rows.push((0..n).map(|i| if i % 2 == 0 { 1e-39 } else { 1e-20 }).collect());
                let q: Vec<Vec<u8>> = rows.iter().map(|v| quantize(&s, GgmlType::BF16, v)).collect();
                for x in &q {
                    for y in &q {
                        for (model, dot, what) in pairs {
                            let (got, want) = (dot(n, x, y), model(n, x, y));
                            assert_eq!(
                                got.to_bits(),
                                want.to_bits(),
                                "{} {numerics:?} BF16 {what} n={n}: {got} vs model {want}",
                                isa.name()
                            );
                            tested += 1;
                        }
                    }
                }
            }
        }
    }
    if Isa::all_available().contains(&Isa::Avx2) {
        assert!(tested > 0);
    }
}

/// Under the `avx2` and `avx512` numerics profiles Q1_0's, Q2_0's and NVFP4's `vec_dot` follow
/// ggml's x86 orders, equal to the scalar models of `scalar::extra_x86` bit for bit: quantized rows, rows of
/// random bytes with finite scales (every code and sign pattern), odd block counts, and activations
/// from zero to large.
#[test]
fn x86_q1_0_q2_0_nvfp4_dots_equal_ggml_models_bitwise() {
    use crate::numerics::Numerics;
    use crate::quant::scalar::extra_x86 as m;
    use GgmlType::*;
    let s = scalar_table();
    let mut r = rng(33);
    let mut tested = 0;
    for isa in Isa::all_available().into_iter().filter(|i| matches!(i, Isa::Avx2 | Isa::Avx512)) {
        for numerics in [Numerics::Avx2, Numerics::Avx512] {
            let k = Kernels::build_for(isa, numerics);
            let models: [(GgmlType, crate::quant::VecDotFn); 3] = [
                (Q1_0, m::vec_dot_q1_0_q8_0_x86),
                (Q2_0, m::vec_dot_q2_0_q8_0_x86),
                (NVFP4, m::vec_dot_nvfp4_q8_0_x86),
            ];
            for (t, model) in models {
                let dot = k.get(t).vec_dot.unwrap();
                for nb in [1usize, 3, 8] {
                    let n = nb * t.blck_size();
                    let mut xrows = vec![quantize(&s, t, &gaussian(&mut r, n))];
                    let mut noise: Vec<u8> = (0..xrows[0].len()).map(|_| r.random()).collect();
                    for (z, orig) in
                        noise.chunks_exact_mut(t.type_size()).zip(xrows[0].chunks_exact(t.type_size()))
                    {
                        // Keep the scales finite: Q1_0's f16, NVFP4's UE4M3 bytes below 0x7F.
                        match t {
                            Q1_0 | Q2_0 => z[..2].copy_from_slice(&orig[..2]),
                            _ => z[..4].iter_mut().for_each(|b| *b &= 0x7E),
                        }
                    }
                    xrows.push(noise);
                    for y in activations(&mut r, n) {
                        let qy = quantize(&s, Q8_0, &y);
                        for qx in &xrows {
                            let (got, want) = (dot(n, qx, &qy), model(n, qx, &qy));
                            assert_eq!(
                                got.to_bits(),
                                want.to_bits(),
                                "{} {numerics:?} {t} n={n}: {got} vs model {want}",
                                isa.name()
                            );
                            tested += 1;
                        }
                    }
                }
            }
        }
    }
    if Isa::all_available().contains(&Isa::Avx2) {
        assert!(tested > 0);
    }
}
