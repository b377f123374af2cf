//! The attention part of a llama layer as llama.cpp sends it, with flash attention on (§4.3) and
//! off (§4.4): ROPE, SET_ROWS into F16 caches (the V cache transposed when FA is off), then
//! FLASH_ATTN_EXT, or MUL_MAT + SOFT_MAX + MUL_MAT + CONT of a permute. Both are checked against an
//! f64 attention computed from the roped q/k and the cache contents.

use compute::graph::Tensor;
use compute::{GgmlOp, GgmlType, Layout};

use crate::harness::*;

const D: u64 = 64;
const H: u64 = 4;
const HKV: u64 = 2;
const T: u64 = 5;
const KV: u64 = 32;
/// Cells already in the cache before this batch.
const PAST: u64 = 3;

fn flat_view(t: &T, ne: [u64; 4]) -> Tensor {
    Tensor { layout: Layout::contiguous(t.l.dtype, ne).unwrap(), data: t.ptr }
}

#[test]
fn llama_attention_fa_on_and_off_agree_with_f64() {
    let mut r = rng(1000);
    let q = T::from_f32(GgmlType::F32, [D, H, T, 1], &randv(&mut r, (D * H * T) as usize, 1.0));
    let k = T::from_f32(GgmlType::F32, [D, HKV, T, 1], &randv(&mut r, (D * HKV * T) as usize, 1.0));
    let v = T::from_f32(GgmlType::F32, [D, HKV, T, 1], &randv(&mut r, (D * HKV * T) as usize, 1.0));
    let pos: Vec<i32> = (0..T as i32).map(|i| i + PAST as i32).collect();
    let pos_t = T::i32s([T, 1, 1, 1], &pos);
    let k_idx = T::i64s([T, 1, 1, 1], &pos.iter().map(|p| *p as i64).collect::<Vec<_>>());
    // FA-off V indices: element (token t, channel c) goes to c * KV + cell(t).
    let v_idx_v: Vec<i64> =
        (0..T).flat_map(|t| (0..HKV * D).map(move |c| (c * KV + PAST + t) as i64)).collect();
    let v_idx = T::i64s([T * HKV * D, 1, 1, 1], &v_idx_v);
    // Earlier cells: random history, the same in both cache layouts.
    let hist = randv(&mut r, (HKV * D * KV) as usize, 1.0);
    let hist_v = randv(&mut r, (HKV * D * KV) as usize, 1.0);
    let keep = |p: u64| p < PAST;
    let mut kc_v = vec![0f32; (HKV * D * KV) as usize];
    let mut vc_v = vec![0f32; (HKV * D * KV) as usize];
    let mut vt_v = vec![0f32; (HKV * D * KV) as usize];
    for p in 0..KV {
        for c in 0..HKV * D {
            if keep(p) {
                kc_v[(p * HKV * D + c) as usize] = hist[(p * HKV * D + c) as usize];
                vc_v[(p * HKV * D + c) as usize] = hist_v[(p * HKV * D + c) as usize];
                vt_v[(c * KV + p) as usize] = hist_v[(p * HKV * D + c) as usize];
            }
        }
    }
    let scale = 1.0 / (D as f32).sqrt();
    let mut mask_v = vec![0f32; (KV * (T + 3)) as usize];
    for t in 0..T + 3 {
        for p in 0..KV {
            let visible = t < T && p <= PAST + t;
            mask_v[(t * KV + p) as usize] = if visible { 0.0 } else { f32::NEG_INFINITY };
        }
    }
    let rope_params = [0, D as i32, 0, 0, 8192, f(100000.0), f(1.0), f(0.0), f(1.0), f(32.0), f(1.0)];
    let k_view = |cache: &T| cache.view([D, KV, HKV, 1], [2, HKV * D * 2, D * 2, HKV * D * KV * 2], 0);

    // FA on.
    let (qr, kr) = (T::new(GgmlType::F32, [D, H, T, 1]), T::new(GgmlType::F32, [D, HKV, T, 1]));
    let kc = T::from_f32(GgmlType::F16, [HKV * D, KV, 1, 1], &kc_v);
    let vc = T::from_f32(GgmlType::F16, [HKV * D, KV, 1, 1], &vc_v);
    let mask16 = T::from_f32(GgmlType::F16, [KV, T + 3, 1, 1], &mask_v);
    let fa_out = T::new(GgmlType::F32, [D, H, T, 1]);
    let fa_graph = vec![
        node_p(GgmlOp::Rope, &rope_params, qr.t(), &[q.t(), pos_t.t()]),
        node_p(GgmlOp::Rope, &rope_params, kr.t(), &[k.t(), pos_t.t()]),
        node(GgmlOp::SetRows, kc.t(), &[flat_view(&kr, [HKV * D, T, 1, 1]), k_idx.t(), kc.t()]),
        node(GgmlOp::SetRows, vc.t(), &[flat_view(&v, [HKV * D, T, 1, 1]), k_idx.t(), vc.t()]),
        node_p(
            GgmlOp::FlashAttnExt,
            &[f(scale), f(0.0), f(0.0), 10],
            fa_out.t(),
            &[qr.permuted([0, 2, 1, 3]), k_view(&kc), k_view(&vc), mask16.t()],
        ),
    ];
    run(fa_graph, 2).unwrap();

    // FA off.
    let (qr2, kr2) = (T::new(GgmlType::F32, [D, H, T, 1]), T::new(GgmlType::F32, [D, HKV, T, 1]));
    let kc2 = T::from_f32(GgmlType::F16, [HKV * D, KV, 1, 1], &kc_v);
    let vt = T::from_f32(GgmlType::F16, [1, HKV * D * KV, 1, 1], &vt_v);
    let mask32 = T::from_f32(GgmlType::F32, [KV, T + 3, 1, 1], &mask_v);
    let kq = T::new(GgmlType::F32, [KV, T, H, 1]);
    let kq_sm = T::new(GgmlType::F32, [KV, T, H, 1]);
    let kqv = T::new(GgmlType::F32, [D, T, H, 1]);
    let out = T::new(GgmlType::F32, [H * D, T, 1, 1]);
    let v_t_view = vt.view([KV, D, HKV, 1], [2, KV * 2, KV * D * 2, KV * HKV * D * 2], 0);
    let nofa_graph = vec![
        node_p(GgmlOp::Rope, &rope_params, qr2.t(), &[q.t(), pos_t.t()]),
        node_p(GgmlOp::Rope, &rope_params, kr2.t(), &[k.t(), pos_t.t()]),
        node(GgmlOp::SetRows, kc2.t(), &[flat_view(&kr2, [HKV * D, T, 1, 1]), k_idx.t(), kc2.t()]),
        node(GgmlOp::SetRows, vt.t(), &[flat_view(&v, [1, T * HKV * D, 1, 1]), v_idx.t(), vt.t()]),
        node_p(GgmlOp::MulMat, &[10], kq.t(), &[k_view(&kc2), qr2.permuted([0, 2, 1, 3])]),
        node_p(GgmlOp::SoftMax, &[f(scale), f(0.0)], kq_sm.t(), &[kq.t(), mask32.t()]),
        node(GgmlOp::MulMat, kqv.t(), &[v_t_view, kq_sm.t()]),
        node(GgmlOp::Cont, out.t(), &[kqv.permuted([0, 2, 1, 3])]),
    ];
    run(nofa_graph, 3).unwrap();

    // The caches hold the same values in both layouts.
    let (kcv, vcv, vtv) = (kc.values(), vc.values(), vt.values());
    assert_eq!(kcv, kc2.values());
    for p in 0..KV as usize {
        for c in 0..(HKV * D) as usize {
            assert_eq!(vcv[p * (HKV * D) as usize + c], vtv[c * KV as usize + p]);
        }
    }
    // f64 attention from the roped q and the caches.
    let qv = qr.values();
    let (d, h, hkv) = (D as usize, H as usize, HKV as usize);
    let mut want = vec![0f64; d * h * T as usize];
    for t in 0..T as usize {
        for hh in 0..h {
            let hk = hh / (h / hkv);
            let qrow = &qv[(t * h + hh) * d..(t * h + hh + 1) * d];
            let cells = PAST as usize + t + 1;
            let s: Vec<f64> = (0..cells)
                .map(|p| {
                    let krow = &kcv[p * hkv * d + hk * d..p * hkv * d + (hk + 1) * d];
                    qrow.iter().zip(krow).map(|(a, b)| a * b).sum::<f64>() * scale as f64
                })
                .collect();
            let mx = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = s.iter().map(|x| (x - mx).exp()).sum();
            for (p, sv) in s.iter().enumerate() {
                let w = (sv - mx).exp() / z;
                for i in 0..d {
                    want[(t * h + hh) * d + i] += w * vcv[p * hkv * d + hk * d + i];
                }
            }
        }
    }
    // FA rounds q to f16 for the scores; FA off rounds q and the softmax output to f16 (the
    // F16 cache's vec_dot type): ~2^-11 relative, NMSE budget 1e-5.
    check("fa on", &fa_out.values(), &want, 1e-5);
    check("fa off", &out.values(), &want, 1e-5);
    check("fa on vs off", &fa_out.values(), &out.values(), 1e-5);
}
