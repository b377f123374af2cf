//! MUL_MAT (every weight type with a dot product; batch 1, small and ≥ 32; SmolLM2 shapes;
//! permuted, strided, offset and broadcast operands; the permuted F16 KQ and transposed-V KQV of
//! attention without flash attention) and MUL_MAT_ID.
//!
//! ref: ggml-compute-semantics.md §3.3 MUL_MAT, MUL_MAT_ID, §4.4.

use compute::{GgmlOp, GgmlType};
use GgmlType::*;

use super::{i32_input, input, push, tn, Case, Form, EXACT, ORDER};
use crate::opdiff::compare::Bound;
use crate::opdiff::data;
use crate::opdiff::graph::{Graph, Id};

/// Every weight type ggml's CPU backend multiplies (all with a `vec_dot`; ggml-compute-semantics.md §2.3).
pub const WEIGHT_TYPES: [GgmlType; 28] = [
    F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, MXFP4, NVFP4,
    Q1_0, Q2_0, TQ1_0, TQ2_0, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M,
];

/// Types whose AVX2 matrix product reproduces ggml's bit for bit (tests/interop/README.md: the
/// legacy dot products with the Q8_0/Q8_1 activation quantizers, F32/F16/BF16 in tinyBLAS or vec_dot order,
/// the K-quants and IQ4_XS with the Q8_K quantizer in vec_dot order and, from 8 activation rows on,
/// in the order of ggml's tiled K-quant product, IQ4_NL in vec_dot or tinyBLAS order, the grid IQ
/// types in vec_dot order and, from 8 activation rows on, in the tiled product's, TQ1_0/TQ2_0,
/// MXFP4, Q1_0, Q2_0 and NVFP4 in vec_dot order).
fn designed_exact(t: GgmlType) -> bool {
    matches!(
        t,
        F32 | F16
            | BF16
            | Q4_0
            | Q4_1
            | Q5_0
            | Q5_1
            | Q8_0
            | IQ4_NL
            | Q2_K
            | Q3_K
            | Q4_K
            | Q5_K
            | Q6_K
            | IQ4_XS
    ) || GRID_IQ.contains(&t)
        || matches!(t, TQ1_0 | TQ2_0 | MXFP4 | Q1_0 | Q2_0 | NVFP4)
}

/// The grid IQ types (ggml's tiled product takes them from 8 activation rows, as the K-quants).
const GRID_IQ: [GgmlType; 7] = [IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M];

/// The types ggml multiplies with its tiled product from 8 activation rows.
fn tiled_types() -> impl Iterator<Item = GgmlType> {
    [Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS].into_iter().chain(GRID_IQ)
}

fn bound(t: GgmlType) -> Bound {
    if designed_exact(t) {
        EXACT
    } else {
        ORDER
    }
}

/// Weight deviation: small for the float and quantized types (real-looking weights).
const W_SCALE: f32 = 0.05;

fn mul_mat(g: &mut Graph, a: Id, b: Id) -> crate::opdiff::Result<Id> {
    let (la, lb) = (g.layout(a), g.layout(b));
    let d = g.op(GgmlOp::MulMat, F32, [la.ne[1], lb.ne[1], lb.ne[2], lb.ne[3]], &[a, b], &[])?;
    Ok(g.output(d))
}

/// Adds one MUL_MAT case: weight `t` `[k, m, w2, 1]` in form `wf`, activations f32 `[k, n, b2, 1]`
/// in form `bf`.
#[allow(clippy::too_many_arguments)]
fn mm(
    v: &mut Vec<Case>,
    t: GgmlType,
    k: u64,
    m: u64,
    n: u64,
    w2: u64,
    b2: u64,
    wf: Form,
    bf: Form,
    tag: &str,
) {
    let name = format!("mul_mat/{}/k{k}m{m}n{n}b{w2}x{b2}/{}-{}{tag}", tn(t), wf.name(), bf.name());
    push(v, "MUL_MAT", name, bound(t), move |rng| {
        let mut g = Graph::new();
        let a = input(&mut g, rng, t, [k, m, w2, 1], W_SCALE, wf)?;
        let b = input(&mut g, rng, F32, [k, n, b2, 1], 1.0, bf)?;
        mul_mat(&mut g, a, b)?;
        Ok(g)
    });
}

pub fn cases(v: &mut Vec<Case>) {
    use Form::*;
    for t in WEIGHT_TYPES {
        for n in [1, 5, 37] {
            mm(v, t, 512, 384, n, 1, 1, Contig, Contig, "");
        }
        // Broadcast over dim 2 (three activation batches per weight matrix), permuted activations.
        mm(v, t, 256, 32, 5, 2, 6, Contig, Permuted, "");
        // Weights as a permuted view, activations as a strided view; a weight view one row in.
        mm(v, t, 256, 32, 5, 2, 2, Permuted, Strided, "");
        mm(v, t, 256, 32, 4, 1, 1, Offset, Offset, "");
    }
    // ggml's tiled product starts at 8 activation rows: both sides of the threshold.
    for t in tiled_types() {
        for n in [7, 8] {
            mm(v, t, 768, 48, n, 1, 1, Contig, Contig, "-tiled-threshold");
        }
    }
    // SmolLM2 shapes: attention (E×E, prompt of 37), FFN up/down (E×F, F×E), output rows (vocab part).
    mm(v, Q4_1, 576, 576, 37, 1, 1, Contig, Contig, "-smollm-attn");
    mm(v, Q4_1, 576, 1536, 5, 1, 1, Contig, Contig, "-smollm-ffn-up");
    mm(v, Q4_1, 1536, 576, 5, 1, 1, Contig, Contig, "-smollm-ffn-down");
    mm(v, Q8_0, 576, 4096, 1, 1, 1, Contig, Contig, "-smollm-vocab");
    // Rows not a multiple of 8 (vec_dot leftovers, no tinyBLAS): F32 and F16.
    for t in [F32, F16, BF16] {
        for n in [1, 5] {
            mm(v, t, 100, 24, n, 1, 1, Contig, Contig, "");
        }
    }
    // F16 activations against F16 weights (no conversion of src1).
    for n in [1, 5] {
        push(v, "MUL_MAT", format!("mul_mat/f16/k256m32n{n}/src1-f16"), EXACT, move |rng| {
            let mut g = Graph::new();
            let a = input(&mut g, rng, F16, [256, 32, 1, 1], W_SCALE, Form::Contig)?;
            let b = input(&mut g, rng, F16, [256, n, 1, 1], 1.0, Form::Contig)?;
            mul_mat(&mut g, a, b)?;
            Ok(g)
        });
    }
    for t in [1u64, 5] {
        push(v, "MUL_MAT", format!("mul_mat/f16/kq-permuted/t{t}"), EXACT, move |rng| kq(rng, t));
        push(v, "MUL_MAT", format!("mul_mat/f16/kqv-transposed-v/t{t}"), EXACT, move |rng| kqv(rng, t));
    }
    mul_mat_id(v);
}

const D: u64 = 64;
const HKV: u64 = 3;
const H: u64 = 9;
const NKV: u64 = 256;
const KV: u64 = 512;

/// Attention scores without flash attention: a permuted view of the F16 K cache × permuted Q
/// (ref: §4.4).
fn kq(rng: &mut rand::rngs::StdRng, t: u64) -> crate::opdiff::Result<Graph> {
    let mut g = Graph::new();
    let cache =
        g.input(F16, [HKV * D, KV, 1, 1], data::f16_bytes(&data::normal(rng, (HKV * D * KV) as usize, 1.0)))?;
    let kview = g.view(cache, [D, HKV, NKV, 1], [D * 2, HKV * D * 2, HKV * D * 2 * NKV], 0);
    let kperm = g.permute(kview, [0, 2, 1, 3])?;
    let q = input(&mut g, rng, F32, [D, H, t, 1], 1.0, Form::Contig)?;
    let qperm = g.permute(q, [0, 2, 1, 3])?;
    let d = g.op(GgmlOp::MulMat, F32, [NKV, t, H, 1], &[kperm, qperm], &[10])?;
    g.output(d);
    Ok(g)
}

/// Attention output without flash attention: the transposed F16 V cache × softmax (ref: §4.4).
fn kqv(rng: &mut rand::rngs::StdRng, t: u64) -> crate::opdiff::Result<Graph> {
    let mut g = Graph::new();
    let cache = g.input(
        F16,
        [HKV * D * KV, 1, 1, 1],
        data::f16_bytes(&data::normal(rng, (HKV * D * KV) as usize, 1.0)),
    )?;
    let vview = g.view(cache, [NKV, HKV, D, 1], [KV * D * 2, KV * 2, KV * HKV * D * 2], 0);
    let vperm = g.permute(vview, [0, 2, 1, 3])?;
    let mut p: Vec<f32> = (0..(H * t * NKV)).map(|_| rand::Rng::random::<f32>(rng)).collect();
    for row in p.chunks_mut(NKV as usize) {
        let s: f32 = row.iter().sum();
        row.iter_mut().for_each(|x| *x /= s);
    }
    let sm = g.input(F32, [NKV, t, H, 1], data::f32_bytes(&p))?;
    let d = g.op(GgmlOp::MulMat, F32, [D, t, H, 1], &[vperm, sm], &[])?;
    g.output(d);
    Ok(g)
}

/// MUL_MAT_ID: 4 experts of `[256, 32]`, 2 used per token, 5 tokens; activations shared by the
/// used experts (`n_b` 1) or one row per used expert.
fn mul_mat_id(v: &mut Vec<Case>) {
    const K: u64 = 256;
    const M: u64 = 32;
    const NE: u64 = 4;
    const NU: u64 = 2;
    // 5 tokens: under 8 rows per expert; 24 tokens: some experts get 8+ rows, which ggml multiplies
    // with its tiled product for the K-quants and IQ types.
    let tokens = |t: GgmlType| {
        if tiled_types().any(|x| x == t) {
            &[5u64, 24][..]
        } else {
            &[5u64][..]
        }
    };
    for t in WEIGHT_TYPES {
        for &nt in tokens(t) {
            for nb in [1, NU] {
                for form in [Form::Contig, Form::Permuted] {
                    let name = format!("mul_mat_id/{}/k{K}m{M}e{NE}u{NU}t{nt}/nb{nb}-{}", tn(t), form.name());
                    push(v, "MUL_MAT_ID", name, bound(t), move |rng| {
                        let mut g = Graph::new();
                        let a = input(&mut g, rng, t, [K, M, NE, 1], W_SCALE, Form::Contig)?;
                        let b = input(&mut g, rng, F32, [K, nb, nt, 1], 1.0, form)?;
                        let mut ids = Vec::new();
                        for tok in 0..nt {
                            let first = rand::Rng::random_range(rng, 0..NE) as i32;
                            ids.push(first);
                            ids.push((first + 1 + (tok as i32 % 3)) % NE as i32);
                        }
                        let ids = i32_input(&mut g, [NU, nt, 1, 1], &ids)?;
                        let d = g.op(GgmlOp::MulMatId, F32, [M, NU, nt, 1], &[a, b, ids], &[])?;
                        g.output(d);
                        Ok(g)
                    });
                }
            }
        }
    }
}
