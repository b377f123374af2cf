//! aarch64 only: which NEON levels this CPU runs (checked against the runner's expectation, so a
//! qemu CPU that silently lacks dotprod or i8mm fails instead of testing a fallback twice), the
//! i8mm 2×2 kernels, and bitwise agreement with the scalar reference on non-finite inputs, for the
//! legacy, K- and IQ4 types and for the grid IQ and TQ types.

use std::arch::is_aarch64_feature_detected as has;

use super::simd::{activations, f16_fields, filled_row, random_row};
use super::*;

/// Bit-for-bit equal, where any NaN equals any NaN: Rust (like LLVM) leaves NaN payloads and signs
/// unspecified, so two compilations of the same float expression may disagree on them.
pub(super) fn same_bits(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

/// The quantized weight types (every one has NEON kernels at every level).
const QUANT_TYPES: [GgmlType; 13] = {
    use GgmlType::*;
    [Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, MXFP4]
};

fn neon_sets() -> Vec<Isa> {
    Isa::all_available()
        .into_iter()
        .filter(|i| matches!(i, Isa::Neon | Isa::NeonDotprod | Isa::NeonI8mm))
        .collect()
}

/// `scripts/test-arm64.sh` names the features each qemu CPU must have in `LLAMAD_EXPECT_AARCH64`
/// (`neon`, `neon,dotprod` or `neon,dotprod,i8mm`).
#[test]
fn detected_levels_match_the_runner() {
    let (dotprod, i8mm) = (has!("dotprod"), has!("i8mm"));
    let sets: Vec<&str> = neon_sets().iter().map(|i| i.name()).collect();
    eprintln!("aarch64 features: dotprod={dotprod} i8mm={i8mm}; NEON kernel sets {sets:?}");
    assert!(sets.contains(&"neon"), "{sets:?}");
    assert_eq!(sets.contains(&"neon-dotprod"), dotprod, "{sets:?}");
    assert_eq!(sets.contains(&"neon-i8mm"), dotprod && i8mm, "{sets:?}");
    let Ok(want) = std::env::var("LLAMAD_EXPECT_AARCH64") else { return };
    let want: Vec<&str> = want.split(',').map(str::trim).collect();
    assert_eq!(dotprod, want.contains(&"dotprod"), "dotprod detected={dotprod}, runner expects {want:?}");
    assert_eq!(i8mm, want.contains(&"i8mm"), "i8mm detected={i8mm}, runner expects {want:?}");
    // The active table is the best set unless a kernel set is forced or the `neon-dotprod` profile
    // lowers it (`Isa::for_profile`).
    if std::env::var("LLAMAD_KERNELS").map_or(true, |v| v.is_empty())
        && crate::numerics::active() != crate::numerics::Numerics::NeonDotprod
    {
        let best = if i8mm {
            "neon-i8mm"
        } else if dotprod {
            "neon-dotprod"
        } else {
            "neon"
        };
        assert_eq!(crate::quant::active_isa(), best);
    }
}

/// Every level has one-column and four-column kernels for every quantized type; exactly the i8mm
/// level has the 2×2 ones.
#[test]
fn levels_install_their_kernels() {
    for isa in neon_sets() {
        let k = Kernels::build(isa);
        for t in QUANT_TYPES {
            let e = k.get(t);
            assert!(e.vec_dot_x4.is_some(), "{} {t}: no x4", isa.name());
            // From dotprod up Q5_0, Q5_1, IQ4_NL, MXFP4, IQ4_XS and the K-quants but Q4_K / Q6_K
            // have ggml's one-row order only (ggml's mul_mat runs no two-row kernel for them).
            use GgmlType::*;
            let ggml_one_row = matches!(isa, Isa::NeonDotprod | Isa::NeonI8mm)
                && matches!(t, Q5_0 | Q5_1 | IQ4_NL | MXFP4 | Q2_K | Q3_K | Q5_K | IQ4_XS);
            assert_eq!(
                e.vec_dot_2x2.is_some(),
                isa == Isa::NeonI8mm && !ggml_one_row,
                "{} {t}: 2x2",
                isa.name()
            );
            let s = scalar_table();
            assert_ne!(e.vec_dot.unwrap() as usize, s.get(t).vec_dot.unwrap() as usize, "{} {t}", isa.name());
            assert_ne!(e.to_f32.unwrap() as usize, s.get(t).to_f32.unwrap() as usize, "{} {t}", isa.name());
        }
    }
}

/// Weight rows for `t`: random, random with extreme scales, and every quant byte 0x00 / 0xFF.
fn weight_rows(r: &mut StdRng, t: GgmlType, nb: usize) -> Vec<Vec<u8>> {
    let mut rows = vec![random_row(r, t, nb, 1.5), random_row(r, t, nb, -1e3), random_row(r, t, nb, 0.0)];
    for fill in [0x00u8, 0xFF] {
        rows.push(filled_row(r, t, nb, fill));
    }
    rows
}

/// A copy of `q` with the scale fields of the blocks set to quiet and signalling NaNs (with
/// payloads), ±Inf, −0, the smallest subnormal and the largest f16 (MXFP4: exponents 0 and 254).
fn nonfinite_scales(t: GgmlType, q: &[u8]) -> Vec<u8> {
    let specials: [u16; 8] = [0x7E00, 0x7C01, 0xFD55, 0x7C00, 0xFC00, 0x8000, 0x0001, 0x7BFF];
    let mut q = q.to_vec();
    for (i, b) in q.chunks_exact_mut(t.type_size()).enumerate() {
        if t == GgmlType::MXFP4 {
            b[0] = if i % 2 == 0 { 254 } else { 0 };
        }
        for (j, &off) in f16_fields(t).iter().enumerate() {
            b[off..off + 2].copy_from_slice(&specials[(i + j) % specials.len()].to_le_bytes());
        }
    }
    q
}

/// Asserts that every kernel shape of `isa` gives its scalar twin's `vec_dot` of `t` bit for bit on `xs`
/// against the activation rows `ys` (already quantized to the vec_dot type).
fn assert_all_shapes_bitwise(isa: Isa, t: GgmlType, n: usize, xs: &[Vec<u8>], ys: &[Vec<u8>]) {
    let (s, k) = (twin_table(isa), Kernels::build(isa));
    let want = |x: &[u8], y: &[u8]| (s.get(t).vec_dot.unwrap())(n, x, y);
    let e = k.get(t);
    // The GEMM order (Q4_0 / Q8_0 from dotprod up) against its twin; exactly where the twin has one.
    assert_eq!(e.vec_dot_gemm.is_some(), s.get(t).vec_dot_gemm.is_some(), "{} {t}: vec_dot_gemm", isa.name());
    if let (Some(g), Some(tw)) = (e.vec_dot_gemm, s.get(t).vec_dot_gemm) {
        for x in xs {
            for y in ys {
                let (a, b) = (g(n, x, y), tw(n, x, y));
                assert!(same_bits(a, b), "{} {t} n={n}: vec_dot_gemm {a} vs twin {b}", isa.name());
            }
        }
    }
    for (ix, x) in xs.iter().enumerate() {
        for (iy, y) in ys.iter().enumerate() {
            let got = (e.vec_dot.unwrap())(n, x, y);
            let w = want(x, y);
            assert!(same_bits(got, w), "{} {t} n={n} row {ix} col {iy}: vec_dot {got} vs {w}", isa.name());
        }
        for w in ys.windows(4) {
            let got = (e.vec_dot_x4.unwrap())(n, x, [&w[0], &w[1], &w[2], &w[3]]);
            for c in 0..4 {
                let v = want(x, &w[c]);
                assert!(
                    same_bits(got[c], v),
                    "{} {t} n={n} row {ix}: x4 col {c}: {} vs {v}",
                    isa.name(),
                    got[c]
                );
            }
        }
    }
    // The two-row kernels against the twin's where it has one (Q4_1 in ggml's i8mm order), else
    // against its one-row dot (llamad's own order: the scalar reference's).
    let reference = scalar_table();
    if let (Some(k22), Some(tw)) = (e.vec_dot_2x2, s.get(t).vec_dot_2x2) {
        for xp in xs.windows(2) {
            for yp in ys.windows(2) {
                let (got, want) =
                    (k22(n, [&xp[0], &xp[1]], [&yp[0], &yp[1]]), tw(n, [&xp[0], &xp[1]], [&yp[0], &yp[1]]));
                for j in 0..4 {
                    assert!(
                        same_bits(got[j], want[j]),
                        "{} {t} n={n}: 2x2 lane {j}: {} vs twin {}",
                        isa.name(),
                        got[j],
                        want[j]
                    );
                }
            }
        }
    } else if let Some(k22) = e.vec_dot_2x2 {
        for xp in xs.windows(2) {
            for yp in ys.windows(2) {
                let got = k22(n, [&xp[0], &xp[1]], [&yp[0], &yp[1]]);
                for (j, g) in got.iter().enumerate() {
                    let (x, y) = (&xp[j / 2], &yp[j % 2]);
                    let v = (reference.get(t).vec_dot.unwrap())(n, x, y);
                    assert!(same_bits(*g, v), "{} {t} n={n}: 2x2 lane {j}: {g} vs {v}", isa.name());
                }
            }
        }
    }
}

/// One, four and 2×2 columns against the scalar reference, bit for bit, on random and edge rows
/// with odd block counts.
#[test]
fn every_shape_equals_scalar_bitwise() {
    let s = scalar_table();
    let mut r = rng(21);
    for t in QUANT_TYPES {
        let vt = s.get(t).vec_dot_type;
        let per256 = 256 / t.blck_size();
        for nb in [1, 3 * per256, if t.blck_size() == 32 { 7 } else { 5 }] {
            let n = nb * t.blck_size();
            let xs = weight_rows(&mut r, t, nb);
            let ys: Vec<Vec<u8>> = activations(&mut r, n).iter().map(|y| quantize(&s, vt, y)).collect();
            for isa in neon_sets() {
                assert_all_shapes_bitwise(isa, t, n, &xs, &ys);
            }
        }
    }
}

/// The grid IQ types, TQ1_0 and TQ2_0 (NEON dot products at every level; their dequantizers are the
/// scalar ones).
const GRID_TYPES: [GgmlType; 9] = {
    use GgmlType::*;
    [IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M, TQ1_0, TQ2_0]
};

/// Sets the f16 super-block scale of one grid-type block to `bits` (IQ1_M's is spread over the top
/// nibbles of its four scale words, bytes 48..56).
fn set_grid_scale(t: GgmlType, b: &mut [u8], bits: u16) {
    match t {
        GgmlType::IQ1_M => {
            for i in 0..4 {
                let hi = &mut b[48 + 2 * i + 1];
                *hi = (*hi & 0x0F) | ((((bits >> (4 * i)) & 0xF) as u8) << 4);
            }
        }
        GgmlType::TQ1_0 => b[52..54].copy_from_slice(&bits.to_le_bytes()),
        GgmlType::TQ2_0 => b[64..66].copy_from_slice(&bits.to_le_bytes()),
        _ => b[..2].copy_from_slice(&bits.to_le_bytes()),
    }
}

/// Grid-type weight rows of `nb` blocks: grid-realistic random blocks (random bytes for the TQ
/// types), the same with NaN, ±Inf, ±0, subnormal, negative and largest f16 scales, every quant byte
/// 0x00 and 0xFF, and random bytes with a negative scale.
fn grid_weight_rows(r: &mut StdRng, t: GgmlType, nb: usize) -> Vec<Vec<u8>> {
    use crate::quant::testing::random_grid_blocks;
    let size = t.type_size();
    let scale = |r: &mut StdRng| half::f16::from_f32(r.random_range(-1.0f32..1.0)).to_bits();
    let base = random_grid_blocks(t, nb, 1.0, r.random()).unwrap_or_else(|| {
        let mut q: Vec<u8> = (0..nb * size).map(|_| r.random()).collect();
        for b in q.chunks_exact_mut(size) {
            set_grid_scale(t, b, scale(r));
        }
        q
    });
    let specials: [u16; 10] =
        [0x7E00, 0x7C01, 0xFD55, 0x7C00, 0xFC00, 0x8000, 0x0001, 0x7BFF, 0xC000, 0x0000];
    let mut special = base.clone();
    for (i, b) in special.chunks_exact_mut(size).enumerate() {
        set_grid_scale(t, b, specials[i % specials.len()]);
    }
    let mut rows = vec![base, special];
    for fill in [0x00u8, 0xFF] {
        let mut q = vec![fill; nb * size];
        for b in q.chunks_exact_mut(size) {
            set_grid_scale(t, b, scale(r));
        }
        rows.push(q);
    }
    let mut noise: Vec<u8> = (0..nb * size).map(|_| r.random()).collect();
    for b in noise.chunks_exact_mut(size) {
        set_grid_scale(t, b, half::f16::from_f32(-1.5).to_bits());
    }
    rows.push(noise);
    rows
}

/// The grid types have NEON one- and four-column kernels at every level (the 2×2 ones at none: at
/// the plain NEON level the table has no i8mm, above it ggml's order is one-row), and every shape equals its twin bit for bit (the scalar `vec_dot`, or from
/// dotprod up for the grid IQ types ggml's NEON order, `quant::scalar::iq_neon`) on realistic, extreme-scale
/// (NaN and Inf included), all-zero, all-ones and random blocks, against random, zero, large,
/// NaN/Inf-bearing and ±127 activations.
#[test]
fn grid_types_every_shape_equals_scalar_bitwise() {
    let s = scalar_table();
    let mut r = rng(25);
    for t in GRID_TYPES {
        for isa in neon_sets() {
            let (e, se) = (Kernels::build(isa), s.get(t));
            let e = e.get(t);
            assert_ne!(e.vec_dot.unwrap() as usize, se.vec_dot.unwrap() as usize, "{} {t}", isa.name());
            assert!(e.vec_dot_x4.is_some(), "{} {t}: no x4", isa.name());
            // From dotprod up these types have ggml's one-row order only (no two-row kernel in
            // ggml), so the i8mm level has no 2×2 kernel for them either.
            assert!(e.vec_dot_2x2.is_none(), "{} {t}: 2x2", isa.name());
        }
        for nb in [1usize, 2, 5] {
            let n = nb * 256;
            let xs = grid_weight_rows(&mut r, t, nb);
            let mut acts = activations(&mut r, n);
            acts.push((0..n).map(|i| if i % 3 == 0 { -1.0 } else { 1.0 }).collect());
            acts[0][5] = f32::INFINITY;
            acts[3][n - 1] = f32::NAN;
            let ys: Vec<Vec<u8>> = acts.iter().map(|a| quantize(&s, GgmlType::Q8_K, a)).collect();
            for isa in neon_sets() {
                assert_all_shapes_bitwise(isa, t, n, &xs, &ys);
            }
        }
    }
}

/// NaN, ±Inf, −0 and subnormal scales in the weights, and NaN/Inf activations: every kernel shape,
/// the dequantizers and the activation quantizers still equal the scalar reference bit for bit
/// (NaN results as NaN: see [`same_bits`]).
#[test]
fn nonfinite_inputs_equal_scalar_bitwise() {
    let s = scalar_table();
    let mut r = rng(22);
    for t in QUANT_TYPES {
        let vt = s.get(t).vec_dot_type;
        let nb = 2 * (256 / t.blck_size()) + 1;
        let n = nb * t.blck_size();
        let xs: Vec<Vec<u8>> = weight_rows(&mut r, t, nb).iter().map(|q| nonfinite_scales(t, q)).collect();
        let mut acts = activations(&mut r, n);
        for (i, a) in acts.iter_mut().enumerate() {
            a[(7 * i) % n] = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -0.0, 3e38][i % 5];
        }
        for isa in neon_sets() {
            let k = Kernels::build(isa);
            for a in &acts {
                assert_eq!(
                    quantize(&k, vt, a),
                    super::simd::quantize_twin(isa, vt, a),
                    "{} {vt} from_f32",
                    isa.name()
                );
            }
            let ys: Vec<Vec<u8>> = acts.iter().map(|a| quantize(&s, vt, a)).collect();
            assert_all_shapes_bitwise(isa, t, n, &xs, &ys);
            for x in &xs {
                let (a, b) = (dequantize(&s, t, x, n), dequantize(&k, t, x, n));
                for (i, (a, b)) in a.iter().zip(&b).enumerate() {
                    assert!(same_bits(*a, *b), "{} {t} to_f32 [{i}]: {a} vs {b}", isa.name());
                }
            }
        }
    }
}

/// F16 and BF16 narrowing of NaN, ±Inf, ±0, subnormals, overflow and exact ties equals the
/// reference bit for bit, on every length (the vector body and the scalar tail).
#[test]
fn float_conversions_bitwise_on_special_values() {
    let s = scalar_table();
    let mut vals = vec![
        f32::NAN,
        -f32::NAN,
        f32::from_bits(0x7f80_0001),
        f32::from_bits(0xffc1_2345),
        f32::INFINITY,
        f32::NEG_INFINITY,
        0.0,
        -0.0,
        1e-40,
        -6e-8,
        3e-5,
        65520.0,
        -65519.0,
        1e10,
        1.0 + 1.0 / 2048.0,
        1.0 + 3.0 / 2048.0,
        1.0 + 1.0 / 256.0,
        1.0 + 3.0 / 256.0,
    ];
    vals.extend(gaussian(&mut rng(23), 45));
    for isa in neon_sets() {
        let k = Kernels::build(isa);
        for t in [GgmlType::F16, GgmlType::BF16] {
            for len in [vals.len(), 7, 16] {
                let x = &vals[..len];
                let (a, b) = (quantize(&s, t, x), quantize(&k, t, x));
                assert_eq!(a, b, "{} {t} from_f32 len {len}", isa.name());
                let (da, db) = (dequantize(&s, t, &a, len), dequantize(&k, t, &a, len));
                assert!(
                    da.iter().zip(&db).all(|(p, q)| p.to_bits() == q.to_bits()),
                    "{} {t} to_f32",
                    isa.name()
                );
            }
        }
    }
}

/// ggml's NEON F32 / F16 orders (from dotprod up): `vec_dot` and, at the dotprod level, the
/// tinyBLAS dots (F16 weights against unconverted f32 rows) equal their twins in
/// `quant::scalar::neon_float` bit for bit, on every leftover length, random and special values;
/// BF16 is the scalar reference (ggml has no NEON BF16 dot).
#[test]
fn float_dots_in_ggml_order_equal_their_twins() {
    use crate::quant::scalar::neon_float as nf;
    let mut r = rng(31);
    let s = scalar_table();
    let specials = [f32::NAN, f32::INFINITY, -0.0, 1e-40, 65504.0, -1e30, 1.0 + 1.0 / 4096.0];
    let mut checked = 0;
    for isa in neon_sets().into_iter().filter(|&i| i != Isa::Neon) {
        let k = Kernels::build(isa);
        let (f32k, f16k) = (k.get(GgmlType::F32), k.get(GgmlType::F16));
        assert_eq!(f32k.vec_dot_gemm.is_some(), isa == Isa::NeonDotprod, "{}", isa.name());
        assert_eq!(f16k.vec_dot_gemm.is_some(), isa == Isa::NeonDotprod, "{}", isa.name());
        assert_eq!(
            k.get(GgmlType::BF16).vec_dot.map(|f| f as usize),
            s.get(GgmlType::BF16).vec_dot.map(|f| f as usize)
        );
        for n in [1usize, 3, 4, 7, 8, 15, 16, 17, 19, 20, 23, 31, 32, 36, 100, 256, 1000] {
            for scale in [1.0f32, 1e3, 1e-3] {
                let mut x: Vec<f32> = gaussian(&mut r, n).iter().map(|v| v * scale).collect();
                let y = gaussian(&mut r, n);
                if scale == 1e-3 {
                    x[n / 2] = specials[n % specials.len()];
                }
                let (x32, y32) = (quantize(&s, GgmlType::F32, &x), quantize(&s, GgmlType::F32, &y));
                let (x16, y16) = (quantize(&s, GgmlType::F16, &x), quantize(&s, GgmlType::F16, &y));
                let pairs: [(&str, crate::quant::VecDotFn, crate::quant::VecDotFn, &[u8], &[u8]); 2] = [
                    ("f32 vec_dot", f32k.vec_dot.unwrap(), nf::vec_dot_f32_f32_neon, &x32, &y32),
                    ("f16 vec_dot", f16k.vec_dot.unwrap(), nf::vec_dot_f16_f16_neon, &x16, &y16),
                ];
                for (what, got, want, a, b) in pairs {
                    let (g, w) = (got(n, a, b), want(n, a, b));
                    assert!(same_bits(g, w), "{} {what} n={n}: {g} vs twin {w}", isa.name());
                }
                if let (Some(g32), Some(g16)) = (f32k.vec_dot_gemm, f16k.vec_dot_gemm) {
                    let (g, w) = (g32(n, &x32, &y32), nf::gemm_f32_f32_neon(n, &x32, &y32));
                    assert!(same_bits(g, w), "f32 gemm n={n}: {g} vs twin {w}");
                    let (g, w) = (g16(n, &x16, &y32), nf::gemm_f16_f32_neon(n, &x16, &y32));
                    assert!(same_bits(g, w), "f16 x f32 gemm n={n}: {g} vs twin {w}");
                }
                checked += 1;
            }
        }
    }
    eprintln!("float orders: {checked} row pairs checked");
}

/// ggml's i8mm two-row order of Q4_K and Q6_K (`neon-i8mm`) is another order than its one-row
/// dot: on random rows some outputs of the two-row kernel differ from `vec_dot` (which is why
/// matmul runs it only where ggml does), and every output equals its twin (checked with the other
/// shapes in `every_shape_equals_scalar_bitwise`).
#[test]
fn kquant_two_row_order_is_ggml_smmla_order() {
    use crate::quant::scalar::neon_order as no;
    if !Isa::NeonI8mm.available() {
        eprintln!("no i8mm: nothing to check");
        return;
    }
    let (s, k) = (scalar_table(), Kernels::build(Isa::NeonI8mm));
    let mut r = rng(27);
    let twins: [(GgmlType, crate::quant::VecDot2x2Fn); 2] =
        [(GgmlType::Q4_K, no::vec_dot_2x2_q4_k_q8_k_neon), (GgmlType::Q6_K, no::vec_dot_2x2_q6_k_q8_k_neon)];
    for (t, twin) in twins {
        let e = k.get(t);
        let k22 = e.vec_dot_2x2.expect("an i8mm two-row kernel");
        let n = 8 * 256;
        let mut differ = 0;
        for _ in 0..16 {
            let x: Vec<Vec<u8>> = (0..2).map(|_| quantize(&s, t, &gaussian(&mut r, n))).collect();
            let y: Vec<Vec<u8>> =
                (0..2).map(|_| quantize(&s, GgmlType::Q8_K, &gaussian(&mut r, n))).collect();
            let (got, want) =
                (k22(n, [&x[0], &x[1]], [&y[0], &y[1]]), twin(n, [&x[0], &x[1]], [&y[0], &y[1]]));
            for o in 0..4 {
                assert_eq!(
                    got[o].to_bits(),
                    want[o].to_bits(),
                    "{t} lane {o}: {} vs twin {}",
                    got[o],
                    want[o]
                );
                let one = (e.vec_dot.unwrap())(n, &x[o / 2], &y[o % 2]);
                differ += usize::from(one.to_bits() != got[o].to_bits());
            }
        }
        assert!(differ > 0, "{t}: the two-row order never differed from vec_dot in 64 outputs");
    }
}

/// The `sve` profile's Q4_K and Q6_K two-row kernels follow ggml's SVE build (`svmmla`, fused
/// steps): every output equals the SVE twin bit for bit, and on random rows some differ from the
/// NEON build's two-row order (so the profile changes what it claims to).
#[test]
fn kquant_two_row_sve_order_equals_twin_and_differs_from_neon() {
    use crate::numerics::Numerics;
    use crate::quant::scalar::neon_order as no;
    if !Isa::NeonI8mm.available() || crate::quant::aarch64::sve_f32_lanes().is_none() {
        eprintln!("no SVE with i8mm: nothing to check");
        return;
    }
    let s = scalar_table();
    let k = Kernels::build_for(Isa::NeonI8mm, Numerics::Sve);
    let mut r = rng(29);
    type Twin = crate::quant::VecDot2x2Fn;
    let twins: [(GgmlType, Twin, Twin); 2] = [
        (GgmlType::Q4_K, no::vec_dot_2x2_q4_k_q8_k_sve, no::vec_dot_2x2_q4_k_q8_k_neon),
        (GgmlType::Q6_K, no::vec_dot_2x2_q6_k_q8_k_sve, no::vec_dot_2x2_q6_k_q8_k_neon),
    ];
    for (t, twin, neon) in twins {
        let k22 = k.get(t).vec_dot_2x2.expect("a two-row kernel");
        let n = 8 * 256;
        let mut differ = 0;
        for _ in 0..16 {
            let x: Vec<Vec<u8>> = (0..2).map(|_| quantize(&s, t, &gaussian(&mut r, n))).collect();
            let y: Vec<Vec<u8>> =
                (0..2).map(|_| quantize(&s, GgmlType::Q8_K, &gaussian(&mut r, n))).collect();
            let (xr, yr) = ([&x[0][..], &x[1][..]], [&y[0][..], &y[1][..]]);
            let (got, want, other) = (k22(n, xr, yr), twin(n, xr, yr), neon(n, xr, yr));
            for o in 0..4 {
                assert_eq!(
                    got[o].to_bits(),
                    want[o].to_bits(),
                    "{t} lane {o}: {} vs twin {}",
                    got[o],
                    want[o]
                );
                differ += usize::from(other[o].to_bits() != got[o].to_bits());
            }
        }
        assert!(differ > 0, "{t}: the SVE two-row order never differed from the NEON one in 64 outputs");
    }
}
