//! The generator, element-move and encoder ops (ARANGE … CONV_2D_DW, CUMSUM, COUNT_EQUAL,
//! GROUP_NORM, LEAKY_RELU, DIAG_MASK_ZERO): hand-computed values, and refusal of inconsistent
//! shapes, types and parameters (an error, never a panic). The differential tests against
//! llama.cpp (tests/src/opdiff/cases/moves.rs) cover the general shapes.

use compute::{GgmlOp, GgmlType};

use super::harness::*;

const F32: GgmlType = GgmlType::F32;

fn refused(n: compute::graph::Node) {
    let op = n.op;
    assert!(validate(vec![n]).is_err(), "{op:?} should be refused");
}

#[test]
fn hand_computed_values() {
    // ARANGE(1, 2.5, 0.5) = [1, 1.5, 2].
    let d = T::new(F32, [3, 1, 1, 1]);
    run(vec![node_p(GgmlOp::Arange, &[f(1.0), f(2.5), f(0.5)], d.t(), &[])], 1).unwrap();
    assert_eq!(d.values(), [1.0, 1.5, 2.0]);
    // CUMSUM of [1, 2, 3, 4].
    let a = T::from_f32(F32, [4, 1, 1, 1], &[1.0, 2.0, 3.0, 4.0]);
    let d = T::new(F32, [4, 1, 1, 1]);
    run(vec![node(GgmlOp::Cumsum, d.t(), &[a.t()])], 2).unwrap();
    assert_eq!(d.values(), [1.0, 3.0, 6.0, 10.0]);
    // ROLL [0, 1, 2, 3] by 1 → [3, 0, 1, 2]; by −1 → [1, 2, 3, 0].
    let a = T::from_f32(F32, [4, 1, 1, 1], &[0.0, 1.0, 2.0, 3.0]);
    for (s, want) in [(1, [3.0, 0.0, 1.0, 2.0]), (-1, [1.0, 2.0, 3.0, 0.0])] {
        let d = T::new(F32, [4, 1, 1, 1]);
        run(vec![node_p(GgmlOp::Roll, &[s, 0, 0, 0], d.t(), &[a.t()])], 1).unwrap();
        assert_eq!(d.values(), want);
    }
    // PAD_REFLECT_1D of [1, 2, 3] by (2, 1) → [3, 2, 1, 2, 3, 2].
    let a = T::from_f32(F32, [3, 1, 1, 1], &[1.0, 2.0, 3.0]);
    let d = T::new(F32, [6, 1, 1, 1]);
    run(vec![node_p(GgmlOp::PadReflect1d, &[2, 1], d.t(), &[a.t()])], 1).unwrap();
    assert_eq!(d.values(), [3.0, 2.0, 1.0, 2.0, 3.0, 2.0]);
    // TRI type 3 (strictly lower: column < row) of a 2×2 of ones.
    let a = T::from_f32(F32, [2, 2, 1, 1], &[1.0; 4]);
    let d = T::new(F32, [2, 2, 1, 1]);
    run(vec![node_p(GgmlOp::Tri, &[3], d.t(), &[a.t()])], 1).unwrap();
    assert_eq!(d.values(), [0.0, 0.0, 1.0, 0.0]);
    // LEAKY_RELU slope 0.5 of [-2, 3].
    let a = T::from_f32(F32, [2, 1, 1, 1], &[-2.0, 3.0]);
    let d = T::new(F32, [2, 1, 1, 1]);
    run(vec![node_p(GgmlOp::LeakyRelu, &[f(0.5)], d.t(), &[a.t()])], 1).unwrap();
    assert_eq!(d.values(), [-1.0, 3.0]);
    // COUNT_EQUAL of [1, 2, 3] and [1, 0, 3] = 2.
    let a = T::i32s([3, 1, 1, 1], &[1, 2, 3]);
    let b = T::i32s([3, 1, 1, 1], &[1, 0, 3]);
    let d = T::new(GgmlType::I64, [1, 1, 1, 1]);
    run(vec![node(GgmlOp::CountEqual, d.t(), &[a.t(), b.t()])], 2).unwrap();
    assert_eq!(d.values(), [2.0]);
    // ACC of a 2-element window at element 1 of [0, 0, 0, 0] with [5, 6] → [0, 5, 6, 0].
    let a = T::from_f32(F32, [4, 1, 1, 1], &[0.0; 4]);
    let b = T::from_f32(F32, [2, 1, 1, 1], &[5.0, 6.0]);
    let d = T::new(F32, [4, 1, 1, 1]);
    run(vec![node_p(GgmlOp::Acc, &[16, 16, 16, 4, 0], d.t(), &[a.t(), b.t()])], 1).unwrap();
    assert_eq!(d.values(), [0.0, 5.0, 6.0, 0.0]);
    // POOL_2D max and average of a 2×2 window over [[1, 2], [3, 4]].
    let a = T::from_f32(F32, [2, 2, 1, 1], &[1.0, 2.0, 3.0, 4.0]);
    for (op, want) in [(0, 4.0), (1, 2.5)] {
        let d = T::new(F32, [1, 1, 1, 1]);
        run(vec![node_p(GgmlOp::Pool2d, &[op, 2, 2, 2, 2, 0, 0], d.t(), &[a.t()])], 1).unwrap();
        assert_eq!(d.values(), [want]);
    }
    // IM2COL 1-D, kernel 2, stride 1, no padding, of [1, 2, 3] → columns [1, 2], [2, 3].
    let k = T::new(GgmlType::F16, [2, 1, 1, 1]);
    let x = T::from_f32(F32, [3, 1, 1, 1], &[1.0, 2.0, 3.0]);
    let d = T::new(F32, [2, 2, 1, 1]);
    run(vec![node_p(GgmlOp::Im2col, &[1, 0, 0, 0, 1, 0, 0], d.t(), &[k.t(), x.t()])], 1).unwrap();
    assert_eq!(d.values(), [1.0, 2.0, 2.0, 3.0]);
    // GROUP_NORM of one group [1, 3]: mean 2, variance 1 → [-1, 1] (eps 0).
    let a = T::from_f32(F32, [2, 1, 1, 1], &[1.0, 3.0]);
    let d = T::new(F32, [2, 1, 1, 1]);
    run(vec![node_p(GgmlOp::GroupNorm, &[1, f(0.0)], d.t(), &[a.t()])], 1).unwrap();
    assert_eq!(d.values(), [-1.0, 1.0]);
}

#[test]
fn inconsistent_shapes_types_and_parameters_are_refused() {
    let a = T::new(F32, [8, 4, 2, 1]);
    let d = T::new(F32, [8, 4, 2, 1]);
    // ARANGE whose length does not match its range; a step of 0.
    refused(node_p(GgmlOp::Arange, &[f(0.0), f(4.0), f(1.0)], T::new(F32, [5, 1, 1, 1]).t(), &[]));
    refused(node_p(GgmlOp::Arange, &[f(0.0), f(4.0), f(0.0)], T::new(F32, [4, 1, 1, 1]).t(), &[]));
    // TIMESTEP_EMBEDDING into the wrong width.
    let ts = T::new(F32, [3, 1, 1, 1]);
    refused(node_p(GgmlOp::TimestepEmbedding, &[16, 10000], T::new(F32, [20, 3, 1, 1]).t(), &[ts.t()]));
    // ROLL by a whole turn or more; into another shape.
    refused(node_p(GgmlOp::Roll, &[8, 0, 0, 0], d.t(), &[a.t()]));
    refused(node_p(GgmlOp::Roll, &[1, 0, 0, 0], T::new(F32, [8, 4, 1, 1]).t(), &[a.t()]));
    // PAD_REFLECT_1D wider than the row, negative, or into the wrong width.
    refused(node_p(GgmlOp::PadReflect1d, &[8, 0], T::new(F32, [16, 4, 2, 1]).t(), &[a.t()]));
    refused(node_p(GgmlOp::PadReflect1d, &[-1, 2], T::new(F32, [9, 4, 2, 1]).t(), &[a.t()]));
    refused(node_p(GgmlOp::PadReflect1d, &[1, 1], T::new(F32, [11, 4, 2, 1]).t(), &[a.t()]));
    // DIAG of a matrix; TRI of an unknown type.
    refused(node(GgmlOp::Diag, T::new(F32, [8, 8, 2, 1]).t(), &[a.t()]));
    refused(node_p(GgmlOp::Tri, &[4], d.t(), &[a.t()]));
    // ACC / SET windows that leave the destination, that do not nest, or are misaligned.
    let b = T::new(F32, [4, 2, 1, 1]);
    for op in [GgmlOp::Acc, GgmlOp::Set] {
        refused(node_p(op, &[32, 256, 256, 240, 0], d.t(), &[a.t(), b.t()]));
        refused(node_p(op, &[8, 256, 256, 0, 0], d.t(), &[a.t(), b.t()]));
        refused(node_p(op, &[32, 256, 256, 2, 0], d.t(), &[a.t(), b.t()]));
    }
    // UPSCALE in an unknown mode.
    refused(node_p(GgmlOp::Upscale, &[7], T::new(F32, [16, 8, 2, 1]).t(), &[a.t()]));
    // IM2COL with a zero stride or a destination of the wrong shape.
    let k = T::new(GgmlType::F16, [3, 3, 2, 1]);
    let x = T::new(F32, [8, 8, 2, 1]);
    refused(node_p(GgmlOp::Im2col, &[0, 1, 0, 0, 1, 1, 1], T::new(F32, [18, 6, 6, 1]).t(), &[k.t(), x.t()]));
    refused(node_p(GgmlOp::Im2col, &[1, 1, 0, 0, 1, 1, 1], T::new(F32, [18, 7, 6, 1]).t(), &[k.t(), x.t()]));
    // POOL with an unknown op, a zero kernel, or the wrong output size.
    refused(node_p(GgmlOp::Pool2d, &[2, 2, 2, 2, 2, 0, 0], T::new(F32, [4, 2, 2, 1]).t(), &[a.t()]));
    refused(node_p(GgmlOp::Pool2d, &[0, 0, 2, 2, 2, 0, 0], T::new(F32, [4, 2, 2, 1]).t(), &[a.t()]));
    refused(node_p(GgmlOp::Pool1d, &[0, 2, 2, 0], T::new(F32, [5, 4, 2, 1]).t(), &[a.t()]));
    // CONV_2D_DW whose kernel channels do not match the input's.
    let kd = T::new(F32, [3, 3, 1, 3]);
    refused(node_p(GgmlOp::Conv2dDw, &[1, 1, 1, 1, 1, 1], T::new(F32, [8, 8, 2, 1]).t(), &[kd.t(), x.t()]));
    // CUMSUM into another shape; COUNT_EQUAL of floats or into F32; GROUP_NORM with 0 groups.
    refused(node(GgmlOp::Cumsum, T::new(F32, [8, 4, 1, 1]).t(), &[a.t()]));
    refused(node(GgmlOp::CountEqual, T::new(GgmlType::I64, [1, 1, 1, 1]).t(), &[a.t(), a.t()]));
    let i = T::i32s([2, 1, 1, 1], &[1, 2]);
    refused(node(GgmlOp::CountEqual, T::new(F32, [1, 1, 1, 1]).t(), &[i.t(), i.t()]));
    refused(node_p(GgmlOp::GroupNorm, &[0, f(1e-6)], d.t(), &[a.t()]));
}

#[test]
fn newest_ops_hand_computed_values() {
    // SOLVE_TRI: [[2, 0], [1, 4]]·x = [4, 10] → x = [2, 2] (A stored row by row).
    let a = T::from_f32(F32, [2, 2, 1, 1], &[2.0, 0.0, 1.0, 4.0]);
    let b = T::from_f32(F32, [1, 2, 1, 1], &[4.0, 10.0]);
    let d = T::new(F32, [1, 2, 1, 1]);
    run(vec![node(GgmlOp::SolveTri, d.t(), &[a.t(), b.t()])], 1).unwrap();
    assert_eq!(d.values(), [2.0, 2.0]);
    // DSV4_HC_PRE, scale 1: Σ_h x[i, h]·w[h] with x = [[1, 2], [3, 4]], w = [10, 100].
    let x = T::from_f32(F32, [2, 2, 1, 1], &[1.0, 2.0, 3.0, 4.0]);
    let w = T::from_f32(F32, [2, 1, 1, 1], &[10.0, 100.0]);
    let d = T::new(F32, [2, 1, 1, 1]);
    run(vec![node_p(GgmlOp::Dsv4HcPre, &[f(1.0), 0], d.t(), &[x.t(), w.t()])], 1).unwrap();
    assert_eq!(d.values(), [310.0, 420.0]);
    // COL2IM_1D, K = 2, one channel, stride 1: columns [1, 2], [3, 4], [5, 6] overlap-add to
    // [1, 2 + 3, 4 + 5, 6].
    let cols = T::from_f32(F32, [2, 3, 1, 1], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let d = T::new(F32, [4, 1, 1, 1]);
    run(vec![node_p(GgmlOp::Col2im1d, &[1, 1, 0], d.t(), &[cols.t()])], 1).unwrap();
    assert_eq!(d.values(), [1.0, 5.0, 9.0, 6.0]);
    // POOL_2D_BACK, max over 2×2 windows of a 2×2 input: the gradient goes to the largest value.
    let g = T::from_f32(F32, [1, 1, 1, 1], &[7.0]);
    let fwd = T::from_f32(F32, [2, 2, 1, 1], &[1.0, 5.0, 3.0, 2.0]);
    let d = T::new(F32, [2, 2, 1, 1]);
    run(vec![node_p(GgmlOp::Pool2dBack, &[0, 2, 2, 2, 2, 0, 0], d.t(), &[g.t(), fwd.t()])], 1).unwrap();
    assert_eq!(d.values(), [0.0, 7.0, 0.0, 0.0]);
}

#[test]
fn newest_ops_refuse_inconsistent_shapes() {
    // SOLVE_TRI with a non-square A; GATED_DELTA_NET whose output rows miss the state snapshots.
    let a = T::new(F32, [3, 2, 1, 1]);
    let b = T::new(F32, [1, 2, 1, 1]);
    refused(node(GgmlOp::SolveTri, T::new(F32, [1, 2, 1, 1]).t(), &[a.t(), b.t()]));
    let q = T::new(F32, [4, 1, 2, 1]);
    let v = T::new(F32, [4, 2, 2, 1]);
    let g = T::new(F32, [1, 2, 2, 1]);
    let st = T::new(F32, [4, 4, 2, 1]);
    let srcs = [q.t(), q.t(), v.t(), g.t(), g.t(), st.t()];
    refused(node_p(GgmlOp::GatedDeltaNet, &[1], T::new(F32, [8, 2, 1, 1]).t(), &srcs));
    refused(node_p(GgmlOp::GatedDeltaNet, &[0], T::new(F32, [8, 2, 1, 1]).t(), &srcs));
    // DSV4_HC_COMB with zero Sinkhorn iterations; LIGHTNING_INDEXER with an F32 mask.
    let m = T::new(F32, [24, 3, 1, 1]);
    let sc = T::new(F32, [3, 1, 1, 1]);
    let base = T::new(F32, [24, 1, 1, 1]);
    refused(node_p(
        GgmlOp::Dsv4HcComb,
        &[f(1e-6), 0],
        T::new(F32, [4, 4, 3, 1]).t(),
        &[m.t(), sc.t(), base.t()],
    ));
    let q = T::new(F32, [8, 2, 3, 1]);
    let k = T::new(F32, [8, 1, 5, 1]);
    let w = T::new(F32, [2, 3, 1, 1]);
    let mask = T::new(F32, [5, 3, 1, 1]);
    refused(node(GgmlOp::LightningIndexer, T::new(F32, [5, 3, 1, 1]).t(), &[q.t(), k.t(), w.t(), mask.t()]));
    // POOL_2D_BACK into F16 (ggml adds f16 bit patterns as integers there); COL2IM_1D whose
    // columns do not split into the channels.
    let g = T::new(F32, [1, 1, 1, 1]);
    let fwd = T::new(GgmlType::F16, [2, 2, 1, 1]);
    refused(node_p(
        GgmlOp::Pool2dBack,
        &[0, 2, 2, 2, 2, 0, 0],
        T::new(GgmlType::F16, [2, 2, 1, 1]).t(),
        &[g.t(), fwd.t()],
    ));
    let cols = T::new(F32, [5, 3, 1, 1]);
    refused(node_p(GgmlOp::Col2im1d, &[1, 2, 0], T::new(F32, [4, 2, 1, 1]).t(), &[cols.t()]));
}
