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
        [GgmlOp::Conv2d, GgmlOp::Pool2d, GgmlOp::MapCustom1, GgmlOp::Custom, GgmlOp::Acc, GgmlOp::RopeBack]
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
    // A destination whose rows share memory (nb[1] = 0): threads would write the same bytes.
    let src = T::new(GgmlType::F32, [4, 3, 1, 1]);
    let squashed = buf.view([4, 3, 1, 1], [4, 0, 16, 16], 0);
    assert!(matches!(validate(vec![node(GgmlOp::Scale, squashed, &[src.t()])]), Err(Error::Shape { .. })));
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

#[test]
fn index_error_skips_rows_but_the_rest_of_the_graph_runs() {
    let table = T::from_f32(GgmlType::F32, [4, 3, 1, 1], &(0..12).map(|v| v as f32).collect::<Vec<_>>());
    let idx = T::i32s([2, 1, 1, 1], &[2, 9]);
    let rows = T::new(GgmlType::F32, [4, 2, 1, 1]);
    let scaled = T::new(GgmlType::F32, [4, 2, 1, 1]);
    let nodes = vec![
        node(GgmlOp::GetRows, rows.t(), &[table.t(), idx.t()]),
        node_p(GgmlOp::Scale, &[f(2.0)], scaled.t(), &[rows.t()]),
    ];
    // SAFETY: all tensors are live owned buffers used only by this graph.
    let g = unsafe { Graph::new(nodes).unwrap() };
    let mut ex = Executor::new(2);
    assert!(matches!(ex.compute(&g), Err(Error::IndexOutOfRange { .. })));
    assert_eq!(scaled.values(), [16.0, 18.0, 20.0, 22.0, 0.0, 0.0, 0.0, 0.0]);
    // Fix the index and recompute the same graph: no error, new result.
    idx.slice_mut(4, 4).copy_from_slice(&0i32.to_le_bytes());
    ex.compute(&g).unwrap();
    assert_eq!(scaled.values(), [16.0, 18.0, 20.0, 22.0, 0.0, 2.0, 4.0, 6.0]);
}

/// Three products of one input by three quantized matrices (a generation step's Q, K and V) share
/// their steps: their activation conversions run together, then their products, each keeping its
/// converted activations in its own part of the shared scratch. The results equal each product run
/// on its own graph, bit for bit, on 1 and 2 threads.
#[test]
fn independent_products_share_steps_and_give_the_same_bits() {
    let mut r = rng(91);
    let k = 256u64;
    let x = T::from_f32(GgmlType::F32, [k, 1, 1, 1], &randv(&mut r, k as usize, 1.0));
    let rows = [96u64, 32, 48];
    let ws: Vec<T> = rows
        .iter()
        .zip([GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_K])
        .map(|(&m, t)| T::from_f32(t, [k, m, 1, 1], &randv(&mut r, (k * m) as usize, 0.5)))
        .collect();
    let outs: Vec<T> = rows.iter().map(|&m| T::new(GgmlType::F32, [m, 1, 1, 1])).collect();
    let nodes: Vec<_> =
        ws.iter().zip(&outs).map(|(w, o)| node(GgmlOp::MulMat, o.t(), &[w.t(), x.t()])).collect();
    // SAFETY: every tensor points into a live owned buffer, used by nobody else.
    let g = unsafe { Graph::new(nodes.clone()).unwrap() };
    assert_eq!(g.phases(), 6, "three products of two phases each");
    assert_eq!(g.steps(), 2, "conversions together, then products together");
    for nth in [1, 2] {
        for o in &outs {
            o.slice_mut(0, o.bytes).fill(0);
        }
        Executor::new(nth).compute(&g).unwrap();
        for (n, o) in nodes.iter().zip(&outs) {
            let alone = T::new(GgmlType::F32, o.l.ne);
            run(vec![node(GgmlOp::MulMat, alone.t(), &[n.src[0].unwrap(), x.t()])], 1).unwrap();
            let (a, b) = (read_all(&o.t()), read_all(&alone.t()));
            assert!(a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits()), "{nth} threads");
        }
    }
}

/// Nodes that touch the same memory keep their order: a later node that overwrites what an earlier
/// one reads (the arena reusing a dead tensor), or reads what it writes, gets a step of its own.
#[test]
fn dependent_nodes_keep_their_order() {
    let a = T::from_f32(GgmlType::F32, [64, 1, 1, 1], &(0..64).map(|i| i as f32).collect::<Vec<_>>());
    let b = T::new(GgmlType::F32, [64, 1, 1, 1]);
    let c = T::new(GgmlType::F32, [64, 1, 1, 1]);
    // b = 2a; then a = 3c (overwrites a, which the first node reads); then c = b + 1 (reads b).
    let n1 = node_p(GgmlOp::Scale, &[f(2.0)], b.t(), &[a.t()]);
    let n2 = node_p(GgmlOp::Scale, &[f(3.0)], a.t(), &[c.t()]);
    let n3 = node_p(GgmlOp::Scale, &[f(1.0), f(1.0)], c.t(), &[b.t()]);
    // SAFETY: as above.
    let g = unsafe { Graph::new(vec![n1, n2, n3]).unwrap() };
    assert_eq!(g.steps(), 3);
    Executor::new(2).compute(&g).unwrap();
    let want_b: Vec<f64> = (0..64).map(|i| 2.0 * i as f64).collect();
    assert_eq!(read_all(&b.t()), want_b);
    assert_eq!(read_all(&a.t()), vec![0.0; 64], "a = 3c with c still zero");
    assert_eq!(read_all(&c.t()), want_b.iter().map(|v| v + 1.0).collect::<Vec<_>>());
}

/// Merging never multiplies the shared scratch beyond a bound: three independent products of one
/// large input (each converting it into about 35 MB of scratch) would need all three regions at
/// once, so they run one phase per step on the largest plan's scratch, as without merging.
#[test]
fn merging_that_would_multiply_the_scratch_is_not_done() {
    let (k, n) = (4096u64, 8192u64);
    let x = T::new(GgmlType::F32, [k, n, 1, 1]);
    let ws: Vec<T> = (0..3).map(|_| T::new(GgmlType::Q8_0, [k, 16, 1, 1])).collect();
    let outs: Vec<T> = (0..3).map(|_| T::new(GgmlType::F32, [16, n, 1, 1])).collect();
    let nodes: Vec<_> =
        ws.iter().zip(&outs).map(|(w, o)| node(GgmlOp::MulMat, o.t(), &[w.t(), x.t()])).collect();
    // SAFETY: every tensor points into a live owned buffer, used by nobody else.
    let g = unsafe { Graph::new(nodes).unwrap() };
    assert_eq!(g.steps(), g.phases());
    // SAFETY: as above.
    let one = unsafe { Graph::new(vec![node(GgmlOp::MulMat, outs[0].t(), &[ws[0].t(), x.t()])]).unwrap() };
    assert_eq!(g.scratch_bytes(1), one.scratch_bytes(1));
    assert!(one.scratch_bytes(1) > 30 << 20, "the product converts its input: {}", one.scratch_bytes(1));
}
