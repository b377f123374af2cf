//! MUL_MAT and MUL_MAT_ID against an f64 reference (weights dequantized with the scalar to_f32).

use compute::quant::kernels;
use compute::{Error, GgmlOp, GgmlType};

use crate::harness::*;

/// Types the target models use as weights (ref: ggml-compute-semantics.md §4.10).
const WEIGHT_TYPES: [GgmlType; 16] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::IQ4_NL,
    GgmlType::IQ4_XS,
    GgmlType::MXFP4,
];

/// NMSE budget of a MUL_MAT against f64 math on the dequantized weights: the error is only
/// the rounding of src1 to the vec_dot type (f16 ≈ 2^-11 relative, bf16 ≈ 2^-8, q8 ≈ 1/254 of the
/// block max). ggml's test-backend-ops uses 5e-4 for every mul_mat case.
fn bound(t: GgmlType) -> f64 {
    match kernels(t).vec_dot_type {
        GgmlType::F32 => 1e-10,
        GgmlType::F16 => 1e-6,
        _ => 5e-4,
    }
}

/// f64 reference: `dst[m, n, i2, i3] = Σ_k a[k, m, i2/r2, i3/r3] * b[k, n, i2, i3]`.
fn reference(a: &compute::graph::Tensor, b: &compute::graph::Tensor) -> Vec<f64> {
    let (an, bn) = (a.layout.ne.map(|v| v as usize), b.layout.ne.map(|v| v as usize));
    let (r2, r3) = (bn[2] / an[2], bn[3] / an[3]);
    let mut out = Vec::new();
    for i3 in 0..bn[3] {
        for i2 in 0..bn[2] {
            for n in 0..bn[1] {
                let y: Vec<f64> = (0..bn[0]).map(|k| get(b, [k, n, i2, i3])).collect();
                for m in 0..an[1] {
                    let x = row(a, m, i2 / r2, i3 / r3);
                    out.push(x.iter().zip(&y).map(|(p, q)| p * q).sum());
                }
            }
        }
    }
    out
}

fn mul_mat_case(t: GgmlType, k: u64, m: u64, n: u64, batch: [u64; 4], seed: u64) {
    let mut r = rng(seed);
    let (ne02, ne03, ne12, ne13) = (batch[0], batch[1], batch[2], batch[3]);
    let a = T::from_f32(t, [k, m, ne02, ne03], &randv(&mut r, (k * m * ne02 * ne03) as usize, 1.0));
    let b =
        T::from_f32(GgmlType::F32, [k, n, ne12, ne13], &randv(&mut r, (k * n * ne12 * ne13) as usize, 1.0));
    let want = reference(&a.t(), &b.t());
    let mut outs = Vec::new();
    for nth in [1, 2, 3] {
        let d = T::new(GgmlType::F32, [m, n, ne12, ne13]);
        run(vec![node(GgmlOp::MulMat, d.t(), &[a.t(), b.t()])], nth).unwrap();
        let got = d.values();
        check(&format!("mul_mat {t} k{k} m{m} n{n} {batch:?} nth{nth}"), &got, &want, bound(t));
        outs.push(got);
    }
    assert_eq!(outs[0], outs[1], "{t}: 1 vs 2 threads differ");
    assert_eq!(outs[0], outs[2], "{t}: 1 vs 3 threads differ");
}

#[test]
fn mul_mat_every_weight_type() {
    assert!(has_matmul_kernels(GgmlType::F32) && has_matmul_kernels(GgmlType::F16));
    let mut covered = Vec::new();
    for (i, t) in WEIGHT_TYPES.into_iter().enumerate() {
        if !has_matmul_kernels(t) {
            continue;
        }
        covered.push(t);
        let seed = 100 + i as u64;
        mul_mat_case(t, 256, 7, 1, [1, 1, 1, 1], seed);
        mul_mat_case(t, 512, 33, 19, [1, 1, 1, 1], seed + 1000);
        mul_mat_case(t, 256, 5, 3, [2, 1, 6, 2], seed + 2000);
        // Eight or more activation rows: packed panels where the kernel set has them, with a
        // partial panel of rows and broadcast batches.
        mul_mat_case(t, 256, 21, 9, [2, 1, 4, 2], seed + 3000);
    }
    eprintln!("mul_mat covered: {covered:?}");
}

#[test]
fn mul_mat_f16_kv_views_times_permuted_f32() {
    // ref: §4.4: kq = MUL_MAT(k_perm, q_perm) with an F16 cache view and a permuted F32 q.
    let (d, hkv, h, kv, nkv, t) = (64u64, 2u64, 6u64, 40u64, 24u64, 5u64);
    let mut r = rng(7);
    let cache = T::from_f32(GgmlType::F16, [hkv * d, kv, 1, 1], &randv(&mut r, (hkv * d * kv) as usize, 1.0));
    // View [D, Hkv, Nkv] then permute (0,2,1,3) -> [D, Nkv, Hkv].
    let k = cache.view([d, nkv, hkv, 1], [2, hkv * d * 2, d * 2, hkv * d * kv * 2], 0);
    let q = T::from_f32(GgmlType::F32, [d, h, t, 1], &randv(&mut r, (d * h * t) as usize, 1.0));
    let qp = q.permuted([0, 2, 1, 3]);
    let want = reference(&k, &qp);
    let dst = T::new(GgmlType::F32, [nkv, t, h, 1]);
    run(vec![node(GgmlOp::MulMat, dst.t(), &[k, qp])], 2).unwrap();
    check("kq", &dst.values(), &want, 1e-6);

    // kqv = MUL_MAT(v_perm, softmax): the transposed V cache view [Nkv, D, Hkv].
    let vcache =
        T::from_f32(GgmlType::F16, [kv * hkv * d, 1, 1, 1], &randv(&mut r, (hkv * d * kv) as usize, 1.0));
    let v = vcache.view([nkv, d, hkv, 1], [2, kv * 2, kv * d * 2, kv * hkv * d * 2], 0);
    let s = T::from_f32(GgmlType::F32, [nkv, t, h, 1], &randv(&mut r, (nkv * t * h) as usize, 1.0));
    let want = reference(&v, &s.t());
    let out = T::new(GgmlType::F32, [d, t, h, 1]);
    run(vec![node(GgmlOp::MulMat, out.t(), &[v, s.t()])], 3).unwrap();
    check("kqv", &out.values(), &want, 1e-6);
}

#[test]
fn mul_mat_rejects_bad_shapes() {
    let a = T::new(GgmlType::F32, [64, 4, 2, 1]);
    let b = T::new(GgmlType::F32, [64, 3, 3, 1]);
    let d = T::new(GgmlType::F32, [4, 3, 3, 1]);
    // ne12 = 3 is not a multiple of ne02 = 2.
    assert!(matches!(validate(vec![node(GgmlOp::MulMat, d.t(), &[a.t(), b.t()])]), Err(Error::Shape { .. })));
    // dst shape that does not match.
    let a = T::new(GgmlType::F32, [64, 4, 1, 1]);
    let b = T::new(GgmlType::F32, [64, 3, 1, 1]);
    let d = T::new(GgmlType::F32, [4, 2, 1, 1]);
    assert!(validate(vec![node(GgmlOp::MulMat, d.t(), &[a.t(), b.t()])]).is_err());
    // K mismatch.
    let b = T::new(GgmlType::F32, [32, 3, 1, 1]);
    let d = T::new(GgmlType::F32, [4, 3, 1, 1]);
    assert!(validate(vec![node(GgmlOp::MulMat, d.t(), &[a.t(), b.t()])]).is_err());
    // dst overlapping a source.
    let b = T::new(GgmlType::F32, [64, 3, 1, 1]);
    let alias = b.view([4, 3, 1, 1], [4, 16, 48, 48], 0);
    assert!(validate(vec![node(GgmlOp::MulMat, alias, &[a.t(), b.t()])]).is_err());
}

#[test]
fn mul_mat_id_routes_tokens_to_experts() {
    let types: Vec<GgmlType> = [GgmlType::F32, GgmlType::F16, GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4_K]
        .into_iter()
        .filter(|t| has_matmul_kernels(*t))
        .collect();
    for (ti, t) in types.into_iter().enumerate() {
        let (k, m, n_exp, n_used, n_tok) = (256u64, 9u64, 5u64, 2u64, 13u64);
        let mut r = rng(50 + ti as u64);
        let a = T::from_f32(t, [k, m, n_exp, 1], &randv(&mut r, (k * m * n_exp) as usize, 1.0));
        for n_b in [1u64, n_used] {
            let b = T::from_f32(
                GgmlType::F32,
                [k, n_b, n_tok, 1],
                &randv(&mut r, (k * n_b * n_tok) as usize, 1.0),
            );
            let ids_v: Vec<i32> = (0..n_used * n_tok).map(|i| ((i * 3 + 1) % n_exp) as i32).collect();
            let ids = T::i32s([n_used, n_tok, 1, 1], &ids_v);
            let mut want = Vec::new();
            for tok in 0..n_tok as usize {
                for e in 0..n_used as usize {
                    let ex = ids_v[tok * n_used as usize + e] as usize;
                    let y: Vec<f64> =
                        (0..k as usize).map(|i| get(&b.t(), [i, e % n_b as usize, tok, 0])).collect();
                    for row_i in 0..m as usize {
                        let x = row(&a.t(), row_i, ex, 0);
                        want.push(x.iter().zip(&y).map(|(p, q)| p * q).sum());
                    }
                }
            }
            let mut outs = Vec::new();
            for nth in [1, 2] {
                let d = T::new(GgmlType::F32, [m, n_used, n_tok, 1]);
                run(vec![node(GgmlOp::MulMatId, d.t(), &[a.t(), b.t(), ids.t()])], nth).unwrap();
                check(&format!("mul_mat_id {t} n_b {n_b}"), &d.values(), &want, bound(t));
                outs.push(d.values());
            }
            assert_eq!(outs[0], outs[1]);
        }
    }
}

#[test]
fn mul_mat_id_out_of_range_expert_is_reported() {
    let a = T::from_f32(GgmlType::F32, [32, 4, 3, 1], &vec![1.0; 32 * 4 * 3]);
    let b = T::from_f32(GgmlType::F32, [32, 1, 2, 1], &vec![1.0; 64]);
    let ids = T::i32s([1, 2, 1, 1], &[1, 7]);
    let d = T::new(GgmlType::F32, [4, 1, 2, 1]);
    let r = run(vec![node(GgmlOp::MulMatId, d.t(), &[a.t(), b.t(), ids.t()])], 2);
    assert!(matches!(r, Err(Error::IndexOutOfRange { .. })), "{r:?}");
    // The valid token was still computed.
    assert_eq!(&d.values()[..4], &[32.0; 4]);
}

#[test]
fn mul_mat_half_precision_activations() {
    // src1 F16/BF16: widened (F32 weights) or converted to the weight's vec_dot type.
    for (wt, at) in [
        (GgmlType::F32, GgmlType::F16),
        (GgmlType::F16, GgmlType::F16),
        (GgmlType::Q4_0, GgmlType::F16),
        (GgmlType::F32, GgmlType::BF16),
    ] {
        if !has_matmul_kernels(wt) {
            continue;
        }
        let mut r = rng(60);
        let a = T::from_f32(wt, [128, 6, 1, 1], &randv(&mut r, 768, 1.0));
        let b = T::from_f32(at, [128, 3, 1, 1], &randv(&mut r, 384, 1.0));
        let want = reference(&a.t(), &b.t());
        let d = T::new(GgmlType::F32, [6, 3, 1, 1]);
        run(vec![node(GgmlOp::MulMat, d.t(), &[a.t(), b.t()])], 2).unwrap();
        check(&format!("mul_mat {wt} x {at}"), &d.values(), &want, bound(wt).max(1e-10));
    }
}

/// Runs one MUL_MAT with an interleaved copy of `a` (`il`, possibly short or misplaced).
fn run_interleaved(d: &T, a: &T, b: &T, il: &[u8], nth: usize) {
    let n = node(GgmlOp::MulMat, d.t(), &[a.t(), b.t()]);
    let copy = compute::graph::Interleaved { data: il.as_ptr(), len: il.len() };
    // SAFETY: every tensor points into a live owned buffer; `il` outlives the graph.
    let g = unsafe { compute::graph::Graph::with_interleaved(vec![n], &[Some(copy)]).unwrap() };
    compute::graph::Executor::new(nth).compute(&g).unwrap();
}

#[test]
fn mul_mat_on_interleaved_weights_equals_the_rows_bit_for_bit() {
    use compute::quant::interleave;
    let mut tested = 0;
    for (i, t) in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q8_0].into_iter().enumerate() {
        let mut r = rng(900 + i as u64);
        let (k, m) = (320u64, 48u64);
        let a = T::from_f32(t, [k, m, 1, 1], &randv(&mut r, (k * m) as usize, 1.0));
        let bytes = a.slice_mut(0, t.row_size(k).unwrap() as usize * m as usize).to_vec();
        let mut il = vec![0u8; bytes.len()];
        interleave::interleave(t, k as usize, m as usize, &bytes, &mut il);
        // Generation shapes (one and two activation rows, broadcast batches), an odd count, and
        // eight rows (a server's eight slots: four kernel calls per group, each prefetching a
        // share of the next group).
        for (n, ne2) in [(1u64, 1u64), (2, 1), (1, 3), (3, 1), (8, 1)] {
            let b = T::from_f32(GgmlType::F32, [k, n, ne2, 1], &randv(&mut r, (k * n * ne2) as usize, 1.0));
            let rows = T::new(GgmlType::F32, [m, n, ne2, 1]);
            run(vec![node(GgmlOp::MulMat, rows.t(), &[a.t(), b.t()])], 1).unwrap();
            check(&format!("{t} n{n}"), &rows.values(), &reference(&a.t(), &b.t()), bound(t));
            for nth in [1, 2] {
                let got = T::new(GgmlType::F32, [m, n, ne2, 1]);
                run_interleaved(&got, &a, &b, &il, nth);
                let (g, w) = (got.values(), rows.values());
                assert!(
                    g.iter().zip(&w).all(|(x, y)| x.to_bits() == y.to_bits()),
                    "{t} n{n} ne2 {ne2} nth{nth}"
                );
            }
            // A copy one byte short is not used (the rows are): same values, no read past it.
            let short = T::new(GgmlType::F32, [m, n, ne2, 1]);
            run_interleaved(&short, &a, &b, &il[..il.len() - 1], 2);
            assert_eq!(short.values(), rows.values(), "{t}: a short copy");
            tested += 1;
        }
        // The kernel is really used where it exists: a copy of other bytes changes the result.
        if kernels(t).interleaved_dot.is_some() {
            let b = T::from_f32(GgmlType::F32, [k, 1, 1, 1], &randv(&mut r, k as usize, 1.0));
            let rows = T::new(GgmlType::F32, [m, 1, 1, 1]);
            run(vec![node(GgmlOp::MulMat, rows.t(), &[a.t(), b.t()])], 1).unwrap();
            let mut other = il.clone();
            interleave::interleave(
                t,
                k as usize,
                m as usize,
                &bytes.iter().map(|v| v ^ 0x11).collect::<Vec<_>>(),
                &mut other,
            );
            let got = T::new(GgmlType::F32, [m, 1, 1, 1]);
            run_interleaved(&got, &a, &b, &other, 1);
            assert_ne!(got.values(), rows.values(), "{t}: the interleaved copy was not read");
        }
    }
    assert!(tested > 0);
}

/// F16 weights times F32 activation rows that end in zeros (attention's softmax rows under a
/// causal mask): the products stop at each block's last nonzero eight-element group, and every
/// output keeps the bits of the full-length float GEMM order (`vec_dot_gemm` over the whole row).
#[test]
fn f16_products_of_rows_ending_in_zeros_keep_the_full_length_bits() {
    let kern = kernels(GgmlType::F16);
    let (Some(dot), Some(to_f16)) = (kern.vec_dot_gemm, kernels(GgmlType::F16).from_f32) else {
        eprintln!("no F16 GEMM order on this kernel set: nothing to compare");
        return;
    };
    let mut r = rng(4242);
    // k multiple of 8 (extents used) and not (full length always); 2 columns take the one-column
    // dot, more the tiles; 37 columns leave a partial block of 16.
    for (k, m, n) in [(64u64, 20u64, 37u64), (200, 16, 5), (64, 7, 2), (68, 9, 6)] {
        let a = T::from_f32(GgmlType::F16, [k, m, 1, 1], &randv(&mut r, (k * m) as usize, 1.0));
        let mut vals = randv(&mut r, (k * n) as usize, 1.0);
        for (j, row) in vals.chunks_exact_mut(k as usize).enumerate() {
            // Nonzero prefixes of every kind of length: none, inside a group, ending on a group's
            // first or last element, the whole row; a -0.0 tail counts as zero.
            let keep = match j % 8 {
                0 => 0,
                1 => 1,
                2 => 9,
                3 => 16,
                4 => 17,
                5 => k as usize,
                6 => k as usize - 1,
                _ => j * 7 % k as usize,
            };
            for (i, v) in row.iter_mut().enumerate().skip(keep) {
                *v = if i % 3 == 0 { -0.0 } else { 0.0 };
            }
        }
        let b = T::from_f32(GgmlType::F32, [k, n, 1, 1], &vals);
        let a_bytes = a.slice_mut(0, 2 * (k * m) as usize).to_vec();
        let mut want = Vec::new();
        for row in vals.chunks_exact(k as usize) {
            let mut y = vec![0u8; 2 * k as usize];
            to_f16(row, &mut y);
            for x in a_bytes.chunks_exact(2 * k as usize) {
                want.push(dot(k as usize, x, &y));
            }
        }
        for nth in [1, 3] {
            let d = T::new(GgmlType::F32, [m, n, 1, 1]);
            run(vec![node(GgmlOp::MulMat, d.t(), &[a.t(), b.t()])], nth).unwrap();
            let got = d.values();
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(
                    (*g as f32).to_bits(),
                    w.to_bits(),
                    "k{k} m{m} n{n} nth{nth}: output {i}: {g} vs {w}"
                );
            }
        }
    }
}

/// KQ = MUL_MAT(K, Q) read only by SOFT_MAX(KQ, causal mask): the blocks of KQ the mask hides are
/// written as 0 instead of computed, and the softmax keeps every bit. With another reader of KQ,
/// KQ flagged as an output, or the mask rewritten in between, KQ is computed in full.
#[test]
fn products_only_a_masked_softmax_reads_skip_the_hidden_blocks() {
    use compute::op::flags;
    let (d, hkv, h, kv, t, past) = (64u64, 2u64, 6u64, 80u64, 40u64, 8u64);
    let mut r = rng(77);
    let kc = T::from_f32(GgmlType::F16, [d, kv, hkv, 1], &randv(&mut r, (d * kv * hkv) as usize, 1.0));
    let q = T::from_f32(GgmlType::F32, [d, t, h, 1], &randv(&mut r, (d * t * h) as usize, 1.0));
    // Causal: token c sees cells 0..=past + c; the padded rows below t see nothing.
    let mut mv = vec![0f32; (kv * (t + 3)) as usize];
    for (c, row) in mv.chunks_exact_mut(kv as usize).enumerate() {
        for (j, v) in row.iter_mut().enumerate() {
            if j as u64 > past + c as u64 {
                *v = f32::NEG_INFINITY;
            }
        }
    }
    let scale = f(0.125);
    let run_case = |mask_t: GgmlType, variant: &str| -> (Vec<f64>, Vec<f64>) {
        let mask = T::from_f32(mask_t, [kv, t + 3, 1, 1], &mv);
        let kq = T::new(GgmlType::F32, [kv, t, h, 1]);
        let sm = T::new(GgmlType::F32, [kv, t, h, 1]);
        let other = T::new(GgmlType::F32, [kv, t, h, 1]);
        let mut product = node(GgmlOp::MulMat, kq.t(), &[kc.t(), q.t()]);
        let mut nodes = Vec::new();
        match variant {
            "output" => product.flags |= flags::OUTPUT,
            "mask written" => {
                nodes.push(product.clone());
                nodes.push(node(GgmlOp::Cpy, mask.t(), &[mask.t()]));
            }
            _ => {}
        }
        if variant != "mask written" {
            nodes.push(product);
        }
        nodes.push(node_p(GgmlOp::SoftMax, &[scale, f(0.0)], sm.t(), &[kq.t(), mask.t()]));
        if variant == "read again" {
            nodes.push(node(GgmlOp::Cpy, other.t(), &[kq.t()]));
        }
        run(nodes, 3).unwrap();
        (kq.values(), sm.values())
    };
    let bits = |v: &[f64]| v.iter().map(|x| (*x as f32).to_bits()).collect::<Vec<_>>();
    for mask_t in [GgmlType::F16, GgmlType::F32] {
        let (full_kq, full_sm) = run_case(mask_t, "read again");
        let (kq, sm) = run_case(mask_t, "fused");
        assert_eq!(bits(&sm), bits(&full_sm), "{mask_t}: the softmax changed");
        // Blocks of 16 cells hidden from all 16 tokens of a block are 0; everything else is the
        // full product.
        let (mut zeroed, mut kept) = (0, 0);
        for (i, (a, b)) in kq.iter().zip(&full_kq).enumerate() {
            let (j, c) = (i as u64 % kv, i as u64 / kv % t);
            let hidden = j / 16 * 16 > past + (c / 16 * 16 + 15).min(t - 1);
            if hidden {
                assert_eq!(*a, 0.0, "{mask_t}: cell {j} token {c} computed");
                zeroed += 1;
            } else {
                assert_eq!((*a as f32).to_bits(), (*b as f32).to_bits(), "{mask_t}: cell {j} token {c}");
                kept += 1;
            }
        }
        assert!(zeroed > 0 && kept > 0);
        assert!(full_kq.iter().all(|v| *v != 0.0), "the full product has no zeros of its own");
        for variant in ["output", "mask written"] {
            let (kq, sm) = run_case(mask_t, variant);
            assert_eq!(bits(&kq), bits(&full_kq), "{mask_t} {variant}: KQ not computed in full");
            assert_eq!(bits(&sm), bits(&full_sm), "{mask_t} {variant}");
        }
    }
}
