//! Binary, unary, GLU, norm, ROPE, SOFT_MAX, reductions, sorts and layout ops against f64
//! references written here.

use compute::{GgmlOp, GgmlType};
use half::f16;

use crate::harness::*;

/// Rounding of the destination type, as an NMSE budget (f32 results computed in f32 vs f64).
fn type_bound(t: GgmlType) -> f64 {
    match t {
        GgmlType::F32 => 1e-10,
        GgmlType::F16 => 1e-6,
        _ => 1e-4,
    }
}

#[test]
fn binary_ops_broadcast_and_type_triples() {
    let triples = [
        (GgmlType::F32, GgmlType::F32, GgmlType::F32),
        (GgmlType::F16, GgmlType::F16, GgmlType::F16),
        (GgmlType::BF16, GgmlType::BF16, GgmlType::BF16),
        (GgmlType::BF16, GgmlType::F32, GgmlType::BF16),
        (GgmlType::BF16, GgmlType::F32, GgmlType::F32),
        (GgmlType::F16, GgmlType::F32, GgmlType::F16),
        (GgmlType::F16, GgmlType::F32, GgmlType::F32),
    ];
    let shapes: [([u64; 4], [u64; 4]); 3] =
        [([16, 5, 3, 2], [16, 5, 3, 2]), ([16, 5, 3, 2], [16, 1, 1, 1]), ([16, 6, 3, 2], [8, 3, 1, 2])];
    let mut seed = 500;
    for (ta, tb, td) in triples {
        for (sa, sb) in shapes {
            for op in [GgmlOp::Add, GgmlOp::Sub, GgmlOp::Mul, GgmlOp::Div] {
                seed += 1;
                let mut r = rng(seed);
                let na = sa.iter().product::<u64>() as usize;
                let nb = sb.iter().product::<u64>() as usize;
                let a = T::from_f32(ta, sa, &randv(&mut r, na, 2.0));
                let bv: Vec<f32> =
                    randv(&mut r, nb, 2.0).into_iter().map(|v| if v.abs() < 0.1 { 0.5 } else { v }).collect();
                let b = T::from_f32(tb, sb, &bv);
                let d = T::new(td, sa);
                run(vec![node(op, d.t(), &[a.t(), b.t()])], 2).unwrap();
                let (av, bvals) = (a.values(), b.values());
                let mut want = Vec::new();
                let s = sa.map(|v| v as usize);
                let sbb = sb.map(|v| v as usize);
                for i3 in 0..s[3] {
                    for i2 in 0..s[2] {
                        for i1 in 0..s[1] {
                            for i0 in 0..s[0] {
                                let x = av[((i3 * s[2] + i2) * s[1] + i1) * s[0] + i0];
                                let (j0, j1, j2, j3) = (i0 % sbb[0], i1 % sbb[1], i2 % sbb[2], i3 % sbb[3]);
                                let y = bvals[((j3 * sbb[2] + j2) * sbb[1] + j1) * sbb[0] + j0];
                                want.push(match op {
                                    GgmlOp::Add => x + y,
                                    GgmlOp::Sub => x - y,
                                    GgmlOp::Mul => x * y,
                                    _ => x / y,
                                });
                            }
                        }
                    }
                }
                check(&format!("{op:?} {ta}/{tb}/{td} {sa:?} {sb:?}"), &d.values(), &want, type_bound(td));
            }
        }
    }
}

#[test]
fn binary_in_place_and_strided_src1_and_add1() {
    let mut r = rng(520);
    let a = T::from_f32(GgmlType::F32, [8, 4, 1, 1], &randv(&mut r, 32, 1.0));
    let before = a.values();
    // src1 = a transposed view of a 8x4 tensor (strided elements along dim 0).
    let bt = T::from_f32(GgmlType::F32, [4, 8, 1, 1], &randv(&mut r, 32, 1.0));
    let bview = compute::graph::Tensor { layout: bt.l.transpose(), data: bt.ptr };
    let bvals = read_all(&bview);
    // In place: dst is src0.
    run(vec![node(GgmlOp::Add, a.t(), &[a.t(), bview])], 2).unwrap();
    let want: Vec<f64> = before.iter().zip(&bvals).map(|(x, y)| x + y).collect();
    check("add in place", &a.values(), &want, 1e-12);
    let one = T::from_f32(GgmlType::F32, [1, 1, 1, 1], &[0.25]);
    let d = T::new(GgmlType::F32, [8, 4, 1, 1]);
    run(vec![node(GgmlOp::Add1, d.t(), &[a.t(), one.t()])], 1).unwrap();
    let want: Vec<f64> = a.values().iter().map(|x| x + 0.25).collect();
    check("add1", &d.values(), &want, 1e-12);
}

#[test]
fn add_quantized_src0() {
    if !has_codec(GgmlType::Q8_0) {
        return;
    }
    let mut r = rng(530);
    let a = T::from_f32(GgmlType::Q8_0, [64, 2, 1, 1], &randv(&mut r, 128, 1.0));
    let b = T::from_f32(GgmlType::F32, [64, 2, 1, 1], &randv(&mut r, 128, 1.0));
    let d = T::new(GgmlType::F32, [64, 2, 1, 1]);
    run(vec![node(GgmlOp::Add, d.t(), &[a.t(), b.t()])], 2).unwrap();
    let want: Vec<f64> = a.values().iter().zip(b.values()).map(|(x, y)| x + y).collect();
    check("add q8_0 + f32", &d.values(), &want, 1e-12);
}

fn gelu64(x: f64) -> f64 {
    0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * x * (1.0 + 0.044715 * x * x)).tanh())
}

fn erf64(x: f64) -> f64 {
    // Series for |x| < 3, asymptotic beyond (accurate to ~1e-12 on the test range).
    if x.abs() > 5.0 {
        return x.signum();
    }
    let mut sum = 0.0;
    let mut term = x;
    let mut n = 0.0;
    while term.abs() > 1e-17 {
        sum += term / (2.0 * n + 1.0);
        n += 1.0;
        term *= -x * x / n;
    }
    2.0 / std::f64::consts::PI.sqrt() * sum
}

fn unary_ref(u: i32, x: f64, p: [f64; 4]) -> f64 {
    let sig = |v: f64| 1.0 / (1.0 + (-v).exp());
    match u {
        0 => x.abs(),
        1 => {
            if x > 0.0 {
                1.0
            } else if x < 0.0 {
                -1.0
            } else {
                0.0
            }
        }
        2 => -x,
        3 => (x > 0.0) as i32 as f64,
        4 => x.tanh(),
        5 => {
            if x > 0.0 {
                x
            } else {
                x.exp_m1()
            }
        }
        6 => x.max(0.0),
        7 => sig(x),
        8 => gelu64(x),
        9 => x * sig(1.702 * x),
        10 => x * sig(x),
        11 => x * ((x + 3.0) / 6.0).clamp(0.0, 1.0),
        12 => ((x + 3.0) / 6.0).clamp(0.0, 1.0),
        13 => x.exp(),
        14 => x.exp_m1(),
        15 => {
            if x > 20.0 {
                x
            } else {
                x.exp().ln_1p()
            }
        }
        16 => 0.5 * x * (1.0 + erf64(x / 2f64.sqrt())),
        17 => {
            let (an, ap, beta, eps) = (p[0], p[1], p[2], p[3]);
            if x > 0.0 {
                ap * x * x + beta * x
            } else {
                (x.min(eps).exp_m1() - x) * an + beta * x
            }
        }
        18 => x.floor(),
        19 => x.ceil(),
        20 => x.round(),
        _ => x.trunc(),
    }
}

#[test]
fn unary_all_22() {
    let mut r = rng(600);
    let mut v = randv(&mut r, 4 * 64, 4.0);
    v.extend([-12.0, 12.0, 0.0, 2.5, -2.5, 0.5, -0.5, 30.0]);
    let n = v.len() as u64;
    let a = T::from_f32(GgmlType::F32, [n / 4, 4, 1, 1], &v);
    let xs = a.values();
    let p = [0.8f32, 0.6, 0.5, -1e-6];
    for u in 0..22 {
        let d = T::new(GgmlType::F32, [n / 4, 4, 1, 1]);
        let params = [u, f(p[0]), f(p[1]), f(p[2]), f(p[3])];
        run(vec![node_p(GgmlOp::Unary, &params, d.t(), &[a.t()])], 2).unwrap();
        let want: Vec<f64> = xs.iter().map(|&x| unary_ref(u, x, p.map(|v| v as f64))).collect();
        // GELU and GELU_QUICK go through the f16 table: f16 precision (NMSE ~ 2^-22).
        let bound = if u == 8 || u == 9 { 1e-6 } else { 1e-10 };
        check(&format!("unary {u}"), &d.values(), &want, bound);
        if u == 8 {
            // The table quirk itself: values equal f16(gelu(f16(x))) within (-10, 10).
            let got = d.values();
            for (g, &x) in got.iter().zip(&xs) {
                if x > -10.0 && x < 10.0 {
                    let h = f16::from_f64(x).to_f64();
                    assert!(
                        (g - f16::from_f64(gelu64(h)).to_f64()).abs() <= 2e-3 * (1.0 + g.abs()),
                        "gelu({x})"
                    );
                }
            }
        }
    }
    // Unknown sub-op is refused.
    let d = T::new(GgmlType::F32, [n / 4, 4, 1, 1]);
    assert!(validate(vec![node_p(GgmlOp::Unary, &[22], d.t(), &[a.t()])]).is_err());
}

#[test]
fn simple_elementwise_ops() {
    let mut r = rng(610);
    let v: Vec<f32> = randv(&mut r, 96, 3.0).into_iter().map(|x| x.abs() + 0.01).collect();
    let a = T::from_f32(GgmlType::F32, [32, 3, 1, 1], &v);
    let xs = a.values();
    type Case = (GgmlOp, Vec<i32>, Box<dyn Fn(f64) -> f64>);
    let cases: Vec<Case> = vec![
        (GgmlOp::Sqr, vec![], Box::new(|x| x * x)),
        (GgmlOp::Sqrt, vec![], Box::new(|x: f64| x.sqrt())),
        (GgmlOp::Log, vec![], Box::new(|x: f64| x.ln())),
        (GgmlOp::Sin, vec![], Box::new(|x: f64| x.sin())),
        (GgmlOp::Cos, vec![], Box::new(|x: f64| x.cos())),
        (GgmlOp::Scale, vec![f(0.125), f(0.0)], Box::new(|x| x * 0.125)),
        (GgmlOp::Scale, vec![f(2.0), f(-1.5)], Box::new(|x| x * 2.0 - 1.5)),
        (GgmlOp::Clamp, vec![f(0.5), f(1.5)], Box::new(|x: f64| x.clamp(0.5, 1.5))),
        (GgmlOp::Fill, vec![f(-3.25)], Box::new(|_| -3.25)),
    ];
    for (op, params, func) in cases {
        let d = T::new(GgmlType::F32, [32, 3, 1, 1]);
        run(vec![node_p(op, &params, d.t(), &[a.t()])], 2).unwrap();
        let want: Vec<f64> = xs.iter().map(|&x| func(x)).collect();
        check(&format!("{op:?} {params:?}"), &d.values(), &want, 1e-12);
    }
}

#[test]
fn glu_all_variants_split_fused_swapped() {
    let mut r = rng(620);
    let (n0, rows) = (24u64, 3u64);
    let xv = randv(&mut r, (n0 * rows) as usize, 4.0);
    let gv = randv(&mut r, (n0 * rows) as usize, 2.0);
    let (alpha, limit) = (1.702f32, 1.5f32);
    let sig = |v: f64| 1.0 / (1.0 + (-v).exp());
    let func = |op: i32, x: f64, g: f64| -> f64 {
        match op {
            0 => x.max(0.0) * g,
            1 => gelu64(x) * g,
            2 => x * sig(x) * g,
            3 => {
                let x = x.min(limit as f64);
                let g = g.clamp(-limit as f64, limit as f64);
                x * sig(alpha as f64 * x) * (g + 1.0)
            }
            4 => 0.5 * x * (1.0 + erf64(x / 2f64.sqrt())) * g,
            6 => {
                let x = x.min(limit as f64);
                x * sig(x) * g.clamp(-limit as f64, limit as f64)
            }
            _ => x * sig(1.702 * x) * g,
        }
    };
    for op in 0..7 {
        let bound = if op == 1 || op == 5 { 1e-6 } else { 1e-10 };
        let params = [op, 0, f(alpha), f(limit)];
        // Split form.
        let x = T::from_f32(GgmlType::F32, [n0, rows, 1, 1], &xv);
        let g = T::from_f32(GgmlType::F32, [n0, rows, 1, 1], &gv);
        let d = T::new(GgmlType::F32, [n0, rows, 1, 1]);
        run(vec![node_p(GgmlOp::Glu, &params, d.t(), &[x.t(), g.t()])], 2).unwrap();
        let want: Vec<f64> = x.values().iter().zip(g.values()).map(|(&a, b)| func(op, a, b)).collect();
        check(&format!("glu {op} split"), &d.values(), &want, bound);
        // Fused form: each row is [x | g], or [g | x] when swapped.
        for swapped in [0, 1] {
            let mut fused = Vec::new();
            for rr in 0..rows as usize {
                let xs = &xv[rr * n0 as usize..(rr + 1) * n0 as usize];
                let gs = &gv[rr * n0 as usize..(rr + 1) * n0 as usize];
                if swapped == 0 {
                    fused.extend_from_slice(xs);
                    fused.extend_from_slice(gs);
                } else {
                    fused.extend_from_slice(gs);
                    fused.extend_from_slice(xs);
                }
            }
            let a = T::from_f32(GgmlType::F32, [2 * n0, rows, 1, 1], &fused);
            let d = T::new(GgmlType::F32, [n0, rows, 1, 1]);
            let params = [op, swapped, f(alpha), f(limit)];
            run(vec![node_p(GgmlOp::Glu, &params, d.t(), &[a.t()])], 3).unwrap();
            check(&format!("glu {op} fused swapped {swapped}"), &d.values(), &want, bound);
        }
    }
    // A GLU op past the enum is refused.
    let x = T::new(GgmlType::F32, [4, 1, 1, 1]);
    let d = T::new(GgmlType::F32, [4, 1, 1, 1]);
    assert!(matches!(
        validate(vec![node_p(GgmlOp::Glu, &[7], d.t(), &[x.t(), x.t()])]),
        Err(compute::Error::UnsupportedOp { .. })
    ));
}

#[test]
fn norms() {
    let mut r = rng(630);
    let (n0, rows) = (96u64, 5u64);
    let a = T::from_f32(GgmlType::F32, [n0, rows, 1, 1], &randv(&mut r, (n0 * rows) as usize, 2.0));
    let eps = 1e-5f32;
    for op in [GgmlOp::RmsNorm, GgmlOp::Norm, GgmlOp::L2Norm] {
        let d = T::new(GgmlType::F32, [n0, rows, 1, 1]);
        run(vec![node_p(op, &[f(eps)], d.t(), &[a.t()])], 2).unwrap();
        let mut want = Vec::new();
        for row in a.values().chunks(n0 as usize) {
            let n = n0 as f64;
            match op {
                GgmlOp::RmsNorm => {
                    let ms = row.iter().map(|x| x * x).sum::<f64>() / n;
                    want.extend(row.iter().map(|x| x / (ms + eps as f64).sqrt()));
                }
                GgmlOp::Norm => {
                    let mean = row.iter().sum::<f64>() / n;
                    let var = row.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n;
                    want.extend(row.iter().map(|x| (x - mean) / (var + eps as f64).sqrt()));
                }
                _ => {
                    let norm = row.iter().map(|x| x * x).sum::<f64>().sqrt();
                    want.extend(row.iter().map(|x| x / norm.max(eps as f64)));
                }
            }
        }
        check(&format!("{op:?}"), &d.values(), &want, 1e-10);
    }
    // RMS_NORM over a strided view (rows padded), in place.
    let big = T::from_f32(GgmlType::F32, [8, 3, 1, 1], &randv(&mut r, 24, 1.0));
    let v = big.view([6, 3, 1, 1], [4, 32, 96, 96], 0);
    let before = read_all(&v);
    run(vec![node_p(GgmlOp::RmsNorm, &[f(eps)], v, &[v])], 2).unwrap();
    let mut want = Vec::new();
    for row in before.chunks(6) {
        let ms = row.iter().map(|x| x * x).sum::<f64>() / 6.0;
        want.extend(row.iter().map(|x| x / (ms + eps as f64).sqrt()));
    }
    check("rms_norm strided in place", &read_all(&v), &want, 1e-10);
}

/// f64 RoPE reference (ref: §3.3 ROPE), including YaRN and frequency factors.
#[allow(clippy::too_many_arguments)]
fn rope_ref(
    x: &[f64],
    ne: [usize; 4],
    pos: &[i32],
    n_dims: usize,
    neox: bool,
    base: f64,
    fscale: f64,
    ext: f64,
    attn: f64,
    corr: [f64; 2],
    ff: Option<&[f64]>,
) -> Vec<f64> {
    let mut out = x.to_vec();
    for i3 in 0..ne[3] {
        for (i2, &p) in pos.iter().enumerate().take(ne[2]) {
            let p = p as f64;
            for i1 in 0..ne[1] {
                let off = ((i3 * ne[2] + i2) * ne[1] + i1) * ne[0];
                for k in 0..n_dims / 2 {
                    let te = p * base.powf(-2.0 * k as f64 / n_dims as f64) / ff.map_or(1.0, |f| f[k]);
                    let ti = fscale * te;
                    let (mut th, mut ms) = (ti, attn);
                    if ext != 0.0 {
                        let y = (k as f64 - corr[0]) / (corr[1] - corr[0]).max(0.001);
                        let mix = (1.0 - y.clamp(0.0, 1.0)) * ext;
                        th = ti * (1.0 - mix) + te * mix;
                        ms *= 1.0 + 0.1 * (1.0 / fscale).ln();
                    }
                    let (j0, j1) = if neox { (k, k + n_dims / 2) } else { (2 * k, 2 * k + 1) };
                    let (a, b) = (x[off + j0], x[off + j1]);
                    out[off + j0] = (a * th.cos() - b * th.sin()) * ms;
                    out[off + j1] = (a * th.sin() + b * th.cos()) * ms;
                }
            }
        }
    }
    out
}

#[test]
fn rope_normal_neox_freq_factors_yarn() {
    let mut r = rng(640);
    let (d, h, t) = (64usize, 3usize, 5usize);
    let pos: Vec<i32> = vec![0, 1, 7, 100, 4000];
    let p = T::i32s([t as u64, 1, 1, 1], &pos);
    let ffv: Vec<f32> = (0..d / 2).map(|i| 1.0 + i as f32 * 0.1).collect();
    let ff = T::from_f32(GgmlType::F32, [(d / 2) as u64, 1, 1, 1], &ffv);
    for (case, (mode, n_dims, fscale, ext, with_ff)) in [
        (0, 64, 1.0f32, 0.0f32, false),
        (2, 64, 1.0, 0.0, false),
        (0, 32, 1.0, 0.0, true),
        (2, 64, 0.25, 1.0, false),
        (0, 64, 0.5, 1.0, true),
    ]
    .into_iter()
    .enumerate()
    {
        for dt in [GgmlType::F32, GgmlType::F16] {
            let x = T::from_f32(dt, [d as u64, h as u64, t as u64, 1], &randv(&mut r, d * h * t, 1.0));
            let dst = T::new(dt, [d as u64, h as u64, t as u64, 1]);
            let (base, n_ctx, attn, bf, bs) = (10000.0f32, 4096, 1.0f32, 32.0f32, 1.0f32);
            let params =
                [0, n_dims, mode, 0, n_ctx, f(base), f(fscale), f(ext), f(attn), f(bf), f(bs), 0, 0, 0, 0, 0];
            let n = with_src(
                node_p(GgmlOp::Rope, &params, dst.t(), &[x.t(), p.t()]),
                2,
                if with_ff { Some(ff.t()) } else { None },
            );
            run(vec![n], 2).unwrap();
            let cd = |beta: f64| {
                n_dims as f64 * (n_ctx as f64 / (beta * 2.0 * std::f64::consts::PI)).ln()
                    / (2.0 * (base as f64).ln())
            };
            let corr = [cd(bf as f64).floor().max(0.0), cd(bs as f64).ceil().min(n_dims as f64 - 1.0)];
            let ffd: Vec<f64> = ff.values();
            let want = rope_ref(
                &x.values(),
                [d, h, t, 1],
                &pos,
                n_dims as usize,
                mode == 2,
                base as f64,
                fscale as f64,
                ext as f64,
                attn as f64,
                corr,
                if with_ff { Some(&ffd) } else { None },
            );
            // f32 theta by repeated multiplication at position 4000: ~1e-4 absolute phase error.
            let bound = if dt == GgmlType::F32 { 1e-7 } else { 2e-6 };
            check(&format!("rope case {case} {dt}"), &dst.values(), &want, bound);
        }
    }
    // A mode ggml does not have is refused as unsupported; M-RoPE without sections, or with one
    // position per token where it needs four, is refused as malformed.
    let x = T::new(GgmlType::F32, [64, 1, 5, 1]);
    let dst = T::new(GgmlType::F32, [64, 1, 5, 1]);
    let params = [0, 64, 4, 0, 0, f(10000.0), f(1.0)];
    assert!(matches!(
        validate(vec![node_p(GgmlOp::Rope, &params, dst.t(), &[x.t(), p.t()])]),
        Err(compute::Error::UnsupportedOp { .. })
    ));
    let params = [0, 64, 8, 0, 0, f(10000.0), f(1.0)];
    assert!(matches!(
        validate(vec![node_p(GgmlOp::Rope, &params, dst.t(), &[x.t(), p.t()])]),
        Err(compute::Error::Shape { .. })
    ));
    let params = [0, 64, 8, 0, 0, f(10000.0), f(1.0), 0, 0, 0, 0, 16, 8, 8, 0];
    assert!(matches!(
        validate(vec![node_p(GgmlOp::Rope, &params, dst.t(), &[x.t(), p.t()])]),
        Err(compute::Error::Shape { .. })
    ));
    // n_dims larger than the row is refused.
    let params = [0, 128, 0, 0, 0, f(10000.0), f(1.0)];
    assert!(validate(vec![node_p(GgmlOp::Rope, &params, dst.t(), &[x.t(), p.t()])]).is_err());
}

#[test]
fn soft_max_mask_alibi_sinks() {
    let mut r = rng(650);
    let (n0, rows, heads) = (32usize, 4usize, 5usize);
    let x = T::from_f32(
        GgmlType::F32,
        [n0 as u64, rows as u64, heads as u64, 1],
        &randv(&mut r, n0 * rows * heads, 3.0),
    );
    let mut mv = randv(&mut r, n0 * (rows + 2), 1.0);
    for (i, m) in mv.iter_mut().enumerate() {
        if i % 7 == 3 {
            *m = f32::NEG_INFINITY;
        }
    }
    let sinks_v = randv(&mut r, heads, 1.0);
    let sinks = T::from_f32(GgmlType::F32, [heads as u64, 1, 1, 1], &sinks_v);
    for mask_t in [None, Some(GgmlType::F32), Some(GgmlType::F16)] {
        for (max_bias, with_sinks) in [(0.0f32, false), (8.0, false), (0.0, true)] {
            let mask = mask_t.map(|t| T::from_f32(t, [n0 as u64, (rows + 2) as u64, 1, 1], &mv));
            let dst = T::new(GgmlType::F32, x.l.ne);
            let scale = 0.3f32;
            let mut srcs = vec![x.t()];
            let n = node_p(GgmlOp::SoftMax, &[f(scale), f(max_bias)], dst.t(), &srcs.split_off(0));
            let n = with_src(n, 1, mask.as_ref().map(|m| m.t()));
            let n = with_src(n, 2, if with_sinks { Some(sinks.t()) } else { None });
            run(vec![n], 2).unwrap();
            let xs = x.values();
            let ms = mask.as_ref().map(|m| m.values());
            let mut want = Vec::new();
            for h in 0..heads {
                let slope = if max_bias > 0.0 {
                    let nl = 4.0; // 2^floor(log2(5))
                    let m0 = 2f64.powf(-(max_bias as f64) / nl);
                    let m1 = 2f64.powf(-(max_bias as f64 / 2.0) / nl);
                    if (h as f64) < nl {
                        m0.powi(h as i32 + 1)
                    } else {
                        m1.powi(2 * (h as i32 - 4) + 1)
                    }
                } else {
                    1.0
                };
                for i1 in 0..rows {
                    let w: Vec<f64> = (0..n0)
                        .map(|i| {
                            xs[(h * rows + i1) * n0 + i] * scale as f64
                                + ms.as_ref().map_or(0.0, |m| slope * m[i1 * n0 + i])
                        })
                        .collect();
                    let mut mx = w.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let sink = sinks_v[h] as f64;
                    if with_sinks {
                        mx = mx.max(sink);
                    }
                    let mut s: f64 = w.iter().map(|v| (v - mx).exp()).sum();
                    if with_sinks {
                        s += (sink - mx).exp();
                    }
                    want.extend(w.iter().map(|v| (v - mx).exp() / s));
                }
            }
            check(
                &format!("soft_max mask {mask_t:?} bias {max_bias} sinks {with_sinks}"),
                &dst.values(),
                &want,
                1e-10,
            );
        }
    }
}

#[test]
fn reductions_sorts_and_masks() {
    let mut r = rng(660);
    let (n0, rows) = (10usize, 6usize);
    let v = randv(&mut r, n0 * rows, 5.0);
    let a = T::from_f32(GgmlType::F32, [n0 as u64, rows as u64, 1, 1], &v);
    let xs = a.values();
    let sum = T::new(GgmlType::F32, [1, 1, 1, 1]);
    let sr = T::new(GgmlType::F32, [1, rows as u64, 1, 1]);
    let mean = T::new(GgmlType::F32, [1, rows as u64, 1, 1]);
    let am = T::new(GgmlType::I32, [rows as u64, 1, 1, 1]);
    let asc = T::new(GgmlType::I32, [n0 as u64, rows as u64, 1, 1]);
    let desc = T::new(GgmlType::I32, [n0 as u64, rows as u64, 1, 1]);
    let topk = T::new(GgmlType::I32, [3, rows as u64, 1, 1]);
    let dm = T::new(GgmlType::F32, [n0 as u64, rows as u64, 1, 1]);
    run(
        vec![
            node(GgmlOp::Sum, sum.t(), &[a.t()]),
            node(GgmlOp::SumRows, sr.t(), &[a.t()]),
            node(GgmlOp::Mean, mean.t(), &[a.t()]),
            node(GgmlOp::Argmax, am.t(), &[a.t()]),
            node_p(GgmlOp::Argsort, &[0], asc.t(), &[a.t()]),
            node_p(GgmlOp::Argsort, &[1], desc.t(), &[a.t()]),
            node(GgmlOp::TopK, topk.t(), &[a.t()]),
            node_p(GgmlOp::DiagMaskInf, &[2], dm.t(), &[a.t()]),
        ],
        3,
    )
    .unwrap();
    check("sum", &sum.values(), &[xs.iter().sum()], 1e-12);
    let rows_v: Vec<&[f64]> = xs.chunks(n0).collect();
    check("sum_rows", &sr.values(), &rows_v.iter().map(|r| r.iter().sum()).collect::<Vec<f64>>(), 1e-12);
    check(
        "mean",
        &mean.values(),
        &rows_v.iter().map(|r| r.iter().sum::<f64>() / n0 as f64).collect::<Vec<f64>>(),
        1e-12,
    );
    let (asc_v, desc_v, top_v, am_v) = (asc.values(), desc.values(), topk.values(), am.values());
    for (i, row) in rows_v.iter().enumerate() {
        let mut idx: Vec<usize> = (0..n0).collect();
        idx.sort_by(|a, b| row[*a].partial_cmp(&row[*b]).unwrap());
        let got_asc: Vec<usize> = asc_v[i * n0..(i + 1) * n0].iter().map(|v| *v as usize).collect();
        assert_eq!(got_asc, idx, "argsort asc row {i}");
        idx.reverse();
        let got_desc: Vec<usize> = desc_v[i * n0..(i + 1) * n0].iter().map(|v| *v as usize).collect();
        assert_eq!(got_desc, idx, "argsort desc row {i}");
        let mut top: Vec<usize> = top_v[i * 3..(i + 1) * 3].iter().map(|v| *v as usize).collect();
        top.sort();
        let mut want_top = idx[..3].to_vec();
        want_top.sort();
        assert_eq!(top, want_top, "top_k row {i}");
        assert_eq!(am_v[i] as usize, idx[0], "argmax row {i}");
    }
    let dmv = dm.values();
    for i1 in 0..rows {
        for i0 in 0..n0 {
            let want = if i0 > 2 + i1 { f64::NEG_INFINITY } else { xs[i1 * n0 + i0] };
            assert_eq!(dmv[i1 * n0 + i0], want);
        }
    }
}

#[test]
fn concat_pad_repeat() {
    let a = T::from_f32(GgmlType::F32, [2, 3, 1, 1], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let b = T::from_f32(GgmlType::F32, [2, 1, 1, 1], &[7.0, 8.0]);
    let c = T::new(GgmlType::F32, [2, 4, 1, 1]);
    run(vec![node_p(GgmlOp::Concat, &[1], c.t(), &[a.t(), b.t()])], 2).unwrap();
    assert_eq!(c.values(), [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]);
    let b0 = T::from_f32(GgmlType::F32, [1, 3, 1, 1], &[9.0, 10.0, 11.0]);
    let c0 = T::new(GgmlType::F32, [3, 3, 1, 1]);
    run(vec![node_p(GgmlOp::Concat, &[0], c0.t(), &[a.t(), b0.t()])], 2).unwrap();
    assert_eq!(c0.values(), [1.0, 2.0, 9.0, 3.0, 4.0, 10.0, 5.0, 6.0, 11.0]);
    // The same rows of 2-byte elements, split over 3 threads (the row-copy path).
    let a16 = T::from_f32(GgmlType::F16, [2, 3, 1, 1], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let b16 = T::from_f32(GgmlType::F16, [1, 3, 1, 1], &[9.0, 10.0, 11.0]);
    let c16 = T::new(GgmlType::F16, [3, 3, 1, 1]);
    run(vec![node_p(GgmlOp::Concat, &[0], c16.t(), &[a16.t(), b16.t()])], 3).unwrap();
    assert_eq!(c16.values(), [1.0, 2.0, 9.0, 3.0, 4.0, 10.0, 5.0, 6.0, 11.0]);
    let p = T::new(GgmlType::F32, [5, 4, 1, 1]);
    run(vec![node_p(GgmlOp::Pad, &[1, 2, 0, 1], p.t(), &[a.t()])], 2).unwrap();
    #[rustfmt::skip]
    let want = [0.0, 1.0, 2.0, 0.0, 0.0, 0.0, 3.0, 4.0, 0.0, 0.0, 0.0, 5.0, 6.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0];
    assert_eq!(p.values(), want);
    let pc = T::new(GgmlType::F32, [4, 3, 1, 1]);
    run(vec![node_p(GgmlOp::Pad, &[1, 1, 0, 0, 0, 0, 0, 0, 1], pc.t(), &[a.t()])], 1).unwrap();
    assert_eq!(pc.values(), [2.0, 1.0, 2.0, 1.0, 4.0, 3.0, 4.0, 3.0, 6.0, 5.0, 6.0, 5.0]);
    let rep = T::new(GgmlType::F32, [4, 6, 1, 1]);
    run(vec![node(GgmlOp::Repeat, rep.t(), &[a.t()])], 3).unwrap();
    let rv = rep.values();
    for i1 in 0..6 {
        for i0 in 0..4 {
            assert_eq!(rv[i1 * 4 + i0], a.values()[(i1 % 3) * 2 + i0 % 2]);
        }
    }
    // Bad concat shape refused.
    let bad = T::new(GgmlType::F32, [2, 5, 1, 1]);
    assert!(validate(vec![node_p(GgmlOp::Concat, &[1], bad.t(), &[a.t(), b.t()])]).is_err());
}

#[test]
fn add_id_adds_selected_bias_rows() {
    let mut r = rng(670);
    let (n0, n_used, n_tok, n_exp) = (16u64, 2u64, 3u64, 4u64);
    let a = T::from_f32(
        GgmlType::F32,
        [n0, n_used, n_tok, 1],
        &randv(&mut r, (n0 * n_used * n_tok) as usize, 1.0),
    );
    let b = T::from_f32(GgmlType::F32, [n0, n_exp, 1, 1], &randv(&mut r, (n0 * n_exp) as usize, 1.0));
    let ids_v = [3, 0, 1, 1, 2, 3];
    let ids = T::i32s([n_used, n_tok, 1, 1], &ids_v);
    let d = T::new(GgmlType::F32, [n0, n_used, n_tok, 1]);
    run(vec![node(GgmlOp::AddId, d.t(), &[a.t(), b.t(), ids.t()])], 2).unwrap();
    let (av, bv) = (a.values(), b.values());
    let n0 = n0 as usize;
    let want: Vec<f64> = (0..av.len()).map(|i| av[i] + bv[ids_v[i / n0] as usize * n0 + i % n0]).collect();
    check("add_id", &d.values(), &want, 1e-14);
    let bad = T::i32s([n_used, n_tok, 1, 1], &[0, 0, 9, 0, 0, 0]);
    let r = run(vec![node(GgmlOp::AddId, d.t(), &[a.t(), b.t(), bad.t()])], 2);
    assert!(matches!(r, Err(compute::Error::IndexOutOfRange { .. })), "{r:?}");
}

#[test]
fn rope_partial_window_with_n_offs() {
    let mut r = rng(680);
    let (d, h, t) = (16usize, 2usize, 3usize);
    let x = T::from_f32(GgmlType::F32, [d as u64, h as u64, t as u64, 1], &randv(&mut r, d * h * t, 1.0));
    let pos = [5i32, 6, 9];
    let p = T::i32s([t as u64, 1, 1, 1], &pos);
    let dst = T::new(GgmlType::F32, [d as u64, h as u64, t as u64, 1]);
    let (n_dims, n_offs) = (8usize, 4usize);
    let mut params = [0i32; 16];
    params[1] = n_dims as i32;
    params[2] = 2;
    params[5] = f(10000.0);
    params[6] = f(1.0);
    params[8] = f(1.0);
    params[15] = n_offs as i32;
    run(vec![node_p(GgmlOp::Rope, &params, dst.t(), &[x.t(), p.t()])], 2).unwrap();
    let xv = x.values();
    let got = dst.values();
    for row in 0..h * t {
        let tok = row / h;
        let xs = &xv[row * d..(row + 1) * d];
        for i in 0..d {
            let want = if i < n_offs || i >= n_offs + n_dims {
                xs[i]
            } else {
                let j = i - n_offs;
                let k = j % (n_dims / 2);
                let th = pos[tok] as f64 * 10000f64.powf(-2.0 * k as f64 / n_dims as f64);
                let (a, b) = (xs[n_offs + k], xs[n_offs + k + n_dims / 2]);
                if j < n_dims / 2 {
                    a * th.cos() - b * th.sin()
                } else {
                    a * th.sin() + b * th.cos()
                }
            };
            assert!(
                (got[row * d + i] - want).abs() < 1e-5,
                "row {row} ch {i}: {} vs {want}",
                got[row * d + i]
            );
        }
    }
}

/// GELU's f16 table equals ggml's at the one entry where fusing `1 + a·x·x` into a multiply-add
/// matters: at x = -1.9990234375 (f16 0xBFFF) llama.cpp 0.3.36's CPU backend (AVX2 build, read
/// back by the differential op test's sweep of every f16 value) gives -0.045501709 (f32 0xBD3A6000);
/// the unfused formula rounds to the neighbouring f16 value -0.045471191.
#[test]
fn gelu_table_entry_matches_ggml() {
    for (op, params) in [(GgmlOp::Unary, vec![8]), (GgmlOp::Glu, vec![1, 0])] {
        let x = T::from_f32(GgmlType::F32, [1, 1, 1, 1], &[-1.999_023_4]);
        let one = T::from_f32(GgmlType::F32, [1, 1, 1, 1], &[1.0]);
        let d = T::new(GgmlType::F32, [1, 1, 1, 1]);
        let srcs = if op == GgmlOp::Glu { vec![x.t(), one.t()] } else { vec![x.t()] };
        run(vec![node_p(op, &params, d.t(), &srcs)], 1).unwrap();
        assert_eq!((d.values()[0] as f32).to_bits(), 0xBD3A_6000, "{op:?}");
    }
}

/// ggml's F16 SWIGLU is the scalar formula: `x / (1 + expf(-x)) · g` in f32, rounded once to f16
/// (its vectorised `exp` serves the F32 form only).
#[test]
fn swiglu_f16_is_the_scalar_formula() {
    // Every finite f16 x below 16 in magnitude, against eight gates: the two `exp`s differ by an
    // ulp in about one f32 result in eight, which moves the f16 rounding a few times in these 311k.
    let sweep: Vec<f32> = (0..=u16::MAX)
        .map(|h| f16::from_bits(h).to_f32())
        .filter(|v| v.is_finite() && v.abs() < 16.0)
        .collect();
    let gates = [0.75f32, 1.25, -1.5, 0.3, -0.6, 1.7, 3.1, -2.9];
    let xv: Vec<f32> = gates.iter().flat_map(|_| sweep.iter().copied()).collect();
    let gv: Vec<f32> = gates.iter().flat_map(|&g| std::iter::repeat_n(g, sweep.len())).collect();
    let n = xv.len();
    let x = T::from_f32(GgmlType::F16, [n as u64, 1, 1, 1], &xv);
    let g = T::from_f32(GgmlType::F16, [n as u64, 1, 1, 1], &gv);
    let d = T::new(GgmlType::F16, [n as u64, 1, 1, 1]);
    run(vec![node_p(GgmlOp::Glu, &[2, 0], d.t(), &[x.t(), g.t()])], 2).unwrap();
    for (i, ((xv, gv), dv)) in x.values().iter().zip(g.values()).zip(d.values()).enumerate() {
        let xf = *xv as f32;
        let want = f16::from_f32(xf / (1.0 + (-xf).exp()) * gv as f32).to_f32();
        assert_eq!(dv as f32, want, "element {i}: x {xf}, g {gv}");
    }
}

/// YaRN ROPE equals ggml's bit for bit: unit pairs (1, 0) at position 1000 give each pair's
/// (cos θ, sin θ) × magnitude scale, here across the whole ramp between extrapolated and
/// interpolated frequencies (n_dims 64, freq_base 1e5, freq_scale 0.25, ext_factor 1,
/// attn_factor 0.9, n_ctx_orig 2048, beta 32/1). The bits are llama.cpp 0.3.36's CPU backend
/// (AVX2 build) output for this input, read back by the differential op test
/// (`rope/normal-yarn/f32/64x1x1/unit-pairs`).
#[test]
fn rope_yarn_matches_ggml_bits() {
    const GGML: [u32; 64] = [
        0x3F1388DE, 0x3F58EC7B, 0x3F71EFDF, 0x3ECADE40, 0xBF832465, 0xBCAD3CA8, 0x3F62823D, 0x3F045944,
        0xBD5DF202, 0xBF82FC92, 0xBF08B0EE, 0x3F5FEA3D, 0xBF3E04B2, 0x3F34DFC0, 0x3F79F6A8, 0xBE9F4198,
        0xBE06D7AC, 0xBF821528, 0x3F8088EB, 0xBE514989, 0x3EFDA6DA, 0x3F65A58B, 0x3F831DDE, 0x3CEF94E4,
        0xBCD98673, 0x3F832046, 0x3E1ED9CA, 0xBF81A892, 0xBF80D026, 0x3E460941, 0xBE3BE8F1, 0x3F810CC6,
        0x3F0C605B, 0x3F5D9F8C, 0x3F5F6B9C, 0x3F097F86, 0x3F73236A, 0x3EC50A1B, 0x3F7CEE12, 0x3E8B4452,
        0x3F80DF2D, 0x3E4393B2, 0x3F820C99, 0x3E08E41B, 0x3F829FB6, 0x3DBF5562, 0x3F82E76D, 0x3D859D15,
        0x3F830A5E, 0x3D3A8B47, 0x3F831B64, 0x3D0232BA, 0x3F8323AE, 0x3CB5BA3A, 0x3F8327B7, 0x3C7DA3DE,
        0x3F8329AE, 0x3C310053, 0x3F832AA3, 0x3BF70940, 0x3F832B1B, 0x3BAC63E2, 0x3F832B55, 0x3B70994A,
    ];
    let xv: Vec<f32> = (0..64).map(|i| if i % 2 == 0 { 1.0 } else { 0.0 }).collect();
    let x = T::from_f32(GgmlType::F32, [64, 1, 1, 1], &xv);
    let p = T::i32s([1, 1, 1, 1], &[1000]);
    let dst = T::new(GgmlType::F32, [64, 1, 1, 1]);
    let params = [0, 64, 0, 0, 2048, f(1e5), f(0.25), f(1.0), f(0.9), f(32.0), f(1.0), 0, 0, 0, 0, 0];
    run(vec![node_p(GgmlOp::Rope, &params, dst.t(), &[x.t(), p.t()])], 1).unwrap();
    let got: Vec<u32> = dst.values().iter().map(|&v| (v as f32).to_bits()).collect();
    let bad: Vec<usize> = (0..64).filter(|&i| got[i] != GGML[i]).collect();
    assert!(bad.is_empty(), "elements {bad:?} differ from ggml");
}
