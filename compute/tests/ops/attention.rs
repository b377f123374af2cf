//! FLASH_ATTN_EXT against an f64 reference (GQA, masks, softcap, ALiBi, sinks, KV views).

use compute::{GgmlOp, GgmlType};

use crate::harness::*;

struct Case {
    kv_type: GgmlType,
    d: u64,
    h: u64,
    hkv: u64,
    nq: u64,
    nkv: u64,
    softcap: f32,
    max_bias: f32,
    sinks: bool,
    mask: bool,
}

/// NMSE budget: Q is rounded to K's vec_dot type before the scores (f16: 2^-11 relative;
/// q8_0: 1/254 of the block max), everything else is f32 arithmetic.
fn bound(t: GgmlType) -> f64 {
    match t {
        GgmlType::F32 => 1e-9,
        GgmlType::F16 | GgmlType::BF16 => 1e-5,
        _ => 5e-4,
    }
}

fn run_case(c: &Case, seed: u64) {
    let mut r = rng(seed);
    let kv_size = c.nkv + 8;
    let ts_row = |n: u64| c.kv_type.row_size(n).unwrap();
    // q stored as [D, H, nq] and permuted to [D, nq, H] (ref: §4.3).
    let q = T::from_f32(GgmlType::F32, [c.d, c.h, c.nq, 1], &randv(&mut r, (c.d * c.h * c.nq) as usize, 1.0));
    let qp = q.permuted([0, 2, 1, 3]);
    // Caches [Hkv*D, kv_size] viewed as [D, nkv, Hkv].
    let kc = T::from_f32(
        c.kv_type,
        [c.hkv * c.d, kv_size, 1, 1],
        &randv(&mut r, (c.hkv * c.d * kv_size) as usize, 1.0),
    );
    let vc = T::from_f32(
        c.kv_type,
        [c.hkv * c.d, kv_size, 1, 1],
        &randv(&mut r, (c.hkv * c.d * kv_size) as usize, 1.0),
    );
    let nb = [c.kv_type.type_size() as u64, ts_row(c.hkv * c.d), ts_row(c.d), ts_row(c.hkv * c.d) * kv_size];
    let k = kc.view([c.d, c.nkv, c.hkv, 1], nb, 0);
    let v = vc.view([c.d, c.nkv, c.hkv, 1], nb, 0);
    // Causal-looking F16 mask [nkv, nq + pad] with some -inf.
    let nq_pad = c.nq + 3;
    let mut mv = vec![0f32; (c.nkv * nq_pad) as usize];
    for i in 0..nq_pad as usize {
        for j in 0..c.nkv as usize {
            mv[i * c.nkv as usize + j] = if j > i + c.nkv as usize - c.nq as usize || (j * 7 + i) % 11 == 0 {
                f32::NEG_INFINITY
            } else {
                r_small(j, i)
            };
        }
    }
    let mask = T::from_f32(GgmlType::F16, [c.nkv, nq_pad, 1, 1], &mv);
    let sinks_v = randv(&mut r, c.h as usize, 1.0);
    let sinks = T::from_f32(GgmlType::F32, [c.h, 1, 1, 1], &sinks_v);
    let scale = 1.0 / (c.d as f32).sqrt();
    let params = [f(scale), f(c.max_bias), f(c.softcap), 10];

    let mut outs = Vec::new();
    for nth in [1, 2, 3] {
        let dst = T::new(GgmlType::F32, [c.d, c.h, c.nq, 1]);
        let n = node_p(GgmlOp::FlashAttnExt, &params, dst.t(), &[qp, k, v]);
        let n = with_src(n, 3, if c.mask { Some(mask.t()) } else { None });
        let n = with_src(n, 4, if c.sinks { Some(sinks.t()) } else { None });
        run(vec![n], nth).unwrap();
        outs.push(dst.values());
    }
    assert_eq!(outs[0], outs[1]);
    assert_eq!(outs[0], outs[2]);

    // f64 reference.
    let mvals = mask.values();
    let mut want = vec![0f64; (c.d * c.h * c.nq) as usize];
    let (d, h, nq, nkv) = (c.d as usize, c.h as usize, c.nq as usize, c.nkv as usize);
    let rep = h / c.hkv as usize;
    let n_head_log2 = 1usize << (usize::BITS - 1 - h.leading_zeros());
    for iq in 0..nq {
        for hh in 0..h {
            let hk = hh / rep;
            let slope = if c.max_bias > 0.0 {
                let m0 = 2f64.powf(-(c.max_bias as f64) / n_head_log2 as f64);
                let m1 = 2f64.powf(-(c.max_bias as f64 / 2.0) / n_head_log2 as f64);
                if hh < n_head_log2 {
                    m0.powi(hh as i32 + 1)
                } else {
                    m1.powi(2 * (hh - n_head_log2) as i32 + 1)
                }
            } else {
                1.0
            };
            let qv: Vec<f64> = (0..d).map(|i| get(&qp, [i, iq, hh, 0])).collect();
            let mut scores = Vec::new();
            for j in 0..nkv {
                let m = if c.mask { mvals[iq * nkv + j] } else { 0.0 };
                if m == f64::NEG_INFINITY {
                    continue;
                }
                let kr = row(&k, j, hk, 0);
                let mut s: f64 = qv.iter().zip(&kr).map(|(a, b)| a * b).sum::<f64>() * scale as f64;
                if c.softcap != 0.0 {
                    s = c.softcap as f64 * (s / c.softcap as f64).tanh();
                }
                scores.push((j, s + slope * m));
            }
            let mut mx = scores.iter().map(|x| x.1).fold(f64::NEG_INFINITY, f64::max);
            if c.sinks {
                mx = mx.max(sinks_v[hh] as f64);
            }
            let mut sum: f64 = scores.iter().map(|x| (x.1 - mx).exp()).sum();
            if c.sinks {
                sum += (sinks_v[hh] as f64 - mx).exp();
            }
            for (j, s) in &scores {
                let p = (s - mx).exp() / sum;
                let vr = row(&v, *j, hk, 0);
                for i in 0..d {
                    want[(iq * h + hh) * d + i] += p * vr[i];
                }
            }
        }
    }
    check(
        &format!(
            "fa {} nq {} nkv {} cap {} bias {} sinks {}",
            c.kv_type, c.nq, c.nkv, c.softcap, c.max_bias, c.sinks
        ),
        &outs[0],
        &want,
        bound(c.kv_type),
    );
}

fn r_small(j: usize, i: usize) -> f32 {
    ((j * 31 + i * 17) % 13) as f32 * -0.05
}

#[test]
fn flash_attn_ext_matches_f64() {
    let mut kv_types = vec![GgmlType::F32, GgmlType::F16];
    for t in [GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_0] {
        if has_matmul_kernels(t) {
            kv_types.push(t);
        }
    }
    let mut seed = 700;
    for kv_type in kv_types {
        for (nq, nkv) in [(1u64, 40u64), (7, 64)] {
            for (softcap, max_bias, sinks) in [(0.0f32, 0.0f32, false), (20.0, 0.0, false), (0.0, 8.0, true)]
            {
                seed += 1;
                let c = Case { kv_type, d: 64, h: 6, hkv: 2, nq, nkv, softcap, max_bias, sinks, mask: true };
                run_case(&c, seed);
            }
        }
        seed += 1;
        run_case(
            &Case {
                kv_type,
                d: 64,
                h: 4,
                hkv: 4,
                nq: 3,
                nkv: 16,
                softcap: 0.0,
                max_bias: 0.0,
                sinks: false,
                mask: false,
            },
            seed,
        );
    }
}

#[test]
fn flash_attn_fully_masked_row_is_zero_and_bad_shapes_refused() {
    let q = T::from_f32(GgmlType::F32, [32, 1, 2, 1], &[0.5; 64]);
    let k = T::from_f32(GgmlType::F16, [32, 4, 1, 1], &[0.25; 128]);
    let v = T::from_f32(GgmlType::F16, [32, 4, 1, 1], &[1.0; 128]);
    let mask = T::from_f32(GgmlType::F16, [4, 1, 1, 1], &[f32::NEG_INFINITY; 4]);
    let dst = T::from_f32(GgmlType::F32, [32, 2, 1, 1], &[9.0; 64]);
    let n = node_p(GgmlOp::FlashAttnExt, &[f(1.0)], dst.t(), &[q.t(), k.t(), v.t(), mask.t()]);
    run(vec![n], 2).unwrap();
    assert!(dst.values().iter().all(|v| *v == 0.0));
    // 3 heads over 2 kv heads: refused.
    let q3 = T::new(GgmlType::F32, [32, 1, 3, 1]);
    let k2 = T::new(GgmlType::F16, [32, 4, 2, 1]);
    let d3 = T::new(GgmlType::F32, [32, 3, 1, 1]);
    assert!(validate(vec![node(GgmlOp::FlashAttnExt, d3.t(), &[q3.t(), k2.t(), k2.t()])]).is_err());
    // Mask with too few columns: refused.
    let small = T::new(GgmlType::F16, [3, 1, 1, 1]);
    let n = node(GgmlOp::FlashAttnExt, dst.t(), &[q.t(), k.t(), v.t(), small.t()]);
    assert!(validate(vec![n]).is_err());
    // dst in the q/k/v layout (not [Dv, H, nq]): refused.
    let wrong = T::new(GgmlType::F32, [32, 1, 2, 1]);
    assert!(validate(vec![node(GgmlOp::FlashAttnExt, wrong.t(), &[q.t(), k.t(), v.t()])]).is_err());
}

/// Prompt batches (64 query rows and more, ggml's tiled path for F16/F32 K and V; the per-row path
/// for quantized caches): block edges (64, 65, 127, 128 rows), head sizes 64–256, GQA ratios 1–8,
/// softcap, ALiBi with sinks, and rows that see no key at all in some tiles.
#[test]
fn flash_attn_ext_prompt_batches_match_f64() {
    let mut kv_types = vec![GgmlType::F16, GgmlType::F32];
    for t in [GgmlType::Q8_0, GgmlType::Q4_0] {
        if has_matmul_kernels(t) {
            kv_types.push(t);
        }
    }
    let mut seed = 900;
    for &kv_type in &kv_types {
        for nq in [64u64, 65, 127, 128] {
            for (softcap, max_bias, sinks) in [(0.0f32, 0.0f32, false), (20.0, 0.0, false), (0.0, 8.0, true)]
            {
                seed += 1;
                let c = Case {
                    kv_type,
                    d: 64,
                    h: 6,
                    hkv: 2,
                    nq,
                    nkv: nq + 10,
                    softcap,
                    max_bias,
                    sinks,
                    mask: true,
                };
                run_case(&c, seed);
            }
        }
    }
    // Head sizes and GQA ratios (F16, the cache llama.cpp uses by default).
    for (d, h, hkv) in [(80u64, 4u64, 4u64), (96, 8, 4), (128, 8, 2), (256, 8, 1), (64, 7, 7), (128, 6, 2)] {
        for mask in [true, false] {
            seed += 1;
            let c = Case {
                kv_type: GgmlType::F16,
                d,
                h,
                hkv,
                nq: 70,
                nkv: 150,
                softcap: 0.0,
                max_bias: 0.0,
                sinks: false,
                mask,
            };
            run_case(&c, seed);
        }
    }
    // A full ubatch of 511 and 512 rows.
    for nq in [511u64, 512] {
        seed += 1;
        let c = Case {
            kv_type: GgmlType::F16,
            d: 64,
            h: 3,
            hkv: 1,
            nq,
            nkv: 512,
            softcap: 0.0,
            max_bias: 0.0,
            sinks: false,
            mask: true,
        };
        run_case(&c, seed);
    }
}
