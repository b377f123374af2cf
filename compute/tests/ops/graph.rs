//! Graph validation (security boundary) and executor behaviour.

use compute::graph::{Executor, Graph, Tensor};
use compute::op::flags;
use compute::{Error, GgmlOp, GgmlType, Layout};

use crate::harness::*;

#[test]
fn unsupported_and_callback_ops_are_refused_by_name() {
    let a = T::new(GgmlType::F32, [4, 4, 1, 1]);
    let d = T::new(GgmlType::F32, [4, 4, 1, 1]);
    for op in
        [GgmlOp::Conv2d, GgmlOp::SsmScan, GgmlOp::MapCustom1, GgmlOp::Custom, GgmlOp::Acc, GgmlOp::RopeBack]
    {
        match validate(vec![node(op, d.t(), &[a.t()])]) {
            Err(Error::UnsupportedOp { op: got, .. }) => assert_eq!(got, op),
            other => panic!("{op:?}: {other:?}"),
        }
    }
}

#[test]
fn nodes_without_compute_flag_and_view_ops_are_skipped() {
    let a = T::from_f32(GgmlType::F32, [4, 1, 1, 1], &[1.0, 2.0, 3.0, 4.0]);
    let d = T::new(GgmlType::F32, [4, 1, 1, 1]);
    let mut skipped = node(GgmlOp::Conv2d, d.t(), &[a.t()]);
    skipped.flags = flags::INPUT;
    let view = node(GgmlOp::View, a.t(), &[a.t()]);
    let scale = node_p(GgmlOp::Scale, &[f(2.0)], d.t(), &[a.t()]);
    run(vec![skipped, view, scale], 2).unwrap();
    assert_eq!(d.values(), [2.0, 4.0, 6.0, 8.0]);
}

#[test]
fn malformed_layouts_are_refused() {
    // §14 item 7: quantized ne0 not a multiple of the block size.
    let l = Layout { dtype: GgmlType::Q4_0, ne: [33, 2, 1, 1], nb: [18, 36, 72, 72] };
    let q = T::with_bytes(l, 128);
    let idx = T::i32s([1, 1, 1, 1], &[0]);
    let d = T::new(GgmlType::F32, [33, 1, 1, 1]);
    let r = validate(vec![node(GgmlOp::GetRows, d.t(), &[q.t(), idx.t()])]);
    assert!(matches!(r, Err(Error::Layout(_))), "{r:?}");
    // §14 item 8: element count overflow.
    let huge = Tensor {
        layout: Layout { dtype: GgmlType::F32, ne: [u32::MAX as u64; 4], nb: [4, 1 << 34, 1 << 50, 1 << 60] },
        data: d.ptr,
    };
    assert!(validate(vec![node(GgmlOp::Scale, huge, &[huge])]).is_err());
    // Null data with elements.
    let null = Tensor { layout: d.l, data: std::ptr::null_mut() };
    assert!(validate(vec![node(GgmlOp::Scale, d.t(), &[null])]).is_err());
    // Partial overlap of dst with a source.
    let buf = T::new(GgmlType::F32, [8, 1, 1, 1]);
    let s = buf.view([4, 1, 1, 1], [4, 16, 16, 16], 0);
    let o = buf.view([4, 1, 1, 1], [4, 16, 16, 16], 8);
    assert!(matches!(validate(vec![node(GgmlOp::Scale, o, &[s])]), Err(Error::Shape { .. })));
    // Missing source.
    assert!(validate(vec![node(GgmlOp::Add, d.t(), &[d.t()])]).is_err());
    // Binary op whose src1 does not repeat.
    let b = T::new(GgmlType::F32, [5, 1, 1, 1]);
    assert!(validate(vec![node(GgmlOp::Add, d.t(), &[d.t(), b.t()])]).is_err());
    // Integer operands in a float op.
    let i = T::new(GgmlType::I32, [33, 1, 1, 1]);
    assert!(matches!(
        validate(vec![node(GgmlOp::Add, d.t(), &[i.t(), d.t()])]),
        Err(Error::UnsupportedTypes { .. })
    ));
}

/// A llama-style FFN block plus attention pieces, as a multi-node graph.
fn layer_graph(x: &T, w: &[T], scratch: &[T], out: &T) -> Vec<compute::graph::Node> {
    let (norm, normed, gate, up, act, down) =
        (&scratch[0], &scratch[1], &scratch[2], &scratch[3], &scratch[4], &scratch[5]);
    vec![
        node_p(GgmlOp::RmsNorm, &[f(1e-5)], norm.t(), &[x.t()]),
        node(GgmlOp::Mul, normed.t(), &[norm.t(), w[0].t()]),
        node(GgmlOp::MulMat, gate.t(), &[w[1].t(), normed.t()]),
        node(GgmlOp::MulMat, up.t(), &[w[2].t(), normed.t()]),
        node_p(GgmlOp::Glu, &[2, 0], act.t(), &[gate.t(), up.t()]),
        node(GgmlOp::MulMat, down.t(), &[w[3].t(), act.t()]),
        node(GgmlOp::Add, out.t(), &[down.t(), x.t()]),
    ]
}

#[test]
fn executor_threads_agree_and_graphs_recompute() {
    let wt = if has_matmul_kernels(GgmlType::Q4_0) { GgmlType::Q4_0 } else { GgmlType::F16 };
    let (e, ff, t) = (256u64, 512u64, 9u64);
    let mut r = rng(900);
    let w = vec![
        T::from_f32(GgmlType::F32, [e, 1, 1, 1], &randv(&mut r, e as usize, 1.0)),
        T::from_f32(wt, [e, ff, 1, 1], &randv(&mut r, (e * ff) as usize, 0.1)),
        T::from_f32(wt, [e, ff, 1, 1], &randv(&mut r, (e * ff) as usize, 0.1)),
        T::from_f32(wt, [ff, e, 1, 1], &randv(&mut r, (e * ff) as usize, 0.1)),
    ];
    let x = T::from_f32(GgmlType::F32, [e, t, 1, 1], &randv(&mut r, (e * t) as usize, 1.0));
    let mk = || {
        vec![
            T::new(GgmlType::F32, [e, t, 1, 1]),
            T::new(GgmlType::F32, [e, t, 1, 1]),
            T::new(GgmlType::F32, [ff, t, 1, 1]),
            T::new(GgmlType::F32, [ff, t, 1, 1]),
            T::new(GgmlType::F32, [ff, t, 1, 1]),
            T::new(GgmlType::F32, [e, t, 1, 1]),
        ]
    };
    let mut results = Vec::new();
    for nth in [1, 2, 4] {
        let s = mk();
        let out = T::new(GgmlType::F32, [e, t, 1, 1]);
        // SAFETY: all tensors are live owned buffers used only by this graph.
        let g = unsafe { Graph::new(layer_graph(&x, &w, &s, &out)).unwrap() };
        let mut ex = Executor::new(nth);
        assert_eq!(ex.n_threads(), nth);
        ex.compute(&g).unwrap();
        let first = out.values();
        // Recompute: same result; let the workers park in between.
        std::thread::sleep(std::time::Duration::from_millis(20));
        for _ in 0..3 {
            ex.compute(&g).unwrap();
            assert_eq!(out.values(), first);
        }
        results.push(first);
    }
    assert_eq!(results[0], results[1]);
    assert_eq!(results[0], results[2]);
    // Executor is Send: it can move to another thread with its graph.
    fn is_send<S: Send>() {}
    is_send::<Executor>();
    is_send::<Graph>();
}
