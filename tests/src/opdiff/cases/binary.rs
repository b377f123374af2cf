//! ADD, SUB, MUL, DIV over the supported type triples and broadcast shapes, with strided,
//! permuted and transposed operands; ADD1, ADD of a quantized tensor, ADD_ID.
//!
//! ref: ggml-compute-semantics.md §1.5, §3.3 ADD/SUB/MUL/DIV, ADD_ID.

use compute::{GgmlOp, GgmlType};
use rand::Rng;
use GgmlType::*;

use super::{i32_input, input, push, tn, Case, Form, EXACT};
use crate::opdiff::graph::Graph;

const OPS: [(GgmlOp, &str); 4] =
    [(GgmlOp::Add, "add"), (GgmlOp::Sub, "sub"), (GgmlOp::Mul, "mul"), (GgmlOp::Div, "div")];

/// (src0, src1, dst) types ggml's CPU backend supports.
const TRIPLES: [(GgmlType, GgmlType, GgmlType); 7] = [
    (F32, F32, F32),
    (F16, F16, F16),
    (F16, F32, F16),
    (F16, F32, F32),
    (BF16, BF16, BF16),
    (BF16, F32, BF16),
    (BF16, F32, F32),
];

const NE: [u64; 4] = [64, 6, 4, 2];

/// src1 shapes that repeat to [`NE`]: same shape, one row, per-plane rows, a repeated
/// quarter-row.
const BCAST: [([u64; 4], &str); 4] =
    [(NE, "same"), ([64, 1, 1, 1], "row"), ([64, 1, 4, 1], "row-per-plane"), ([16, 6, 1, 2], "ne0-repeat")];

fn op_name(op: GgmlOp) -> &'static str {
    OPS.iter().find(|o| o.0 == op).map_or("?", |o| o.1)
}

pub fn cases(v: &mut Vec<Case>) {
    for (op, _) in OPS {
        for (ta, tb, td) in TRIPLES {
            for (bne, bname) in BCAST {
                let name = format!("{}/{}-{}-{}/64x6x4x2/b-{bname}", op_name(op), tn(ta), tn(tb), tn(td));
                push(v, op.name(), name, EXACT, move |rng| {
                    let mut g = Graph::new();
                    let a = input(&mut g, rng, ta, NE, 1.0, Form::Contig)?;
                    let b = operand(&mut g, rng, op, tb, bne, Form::Contig)?;
                    let d = g.op(op, td, NE, &[a, b], &[])?;
                    g.output(d);
                    Ok(g)
                });
            }
        }
        // Operand forms: src0 permuted/strided/offset, src1 permuted/transposed/strided.
        for (fa, fb) in [
            (Form::Permuted, Form::Contig),
            (Form::Strided, Form::Offset),
            (Form::Offset, Form::Permuted),
            (Form::Contig, Form::Transposed),
            (Form::Contig, Form::Strided),
        ] {
            let name = format!("{}/f32/64x6x4x2/{}-{}", op_name(op), fa.name(), fb.name());
            push(v, op.name(), name, EXACT, move |rng| {
                let mut g = Graph::new();
                let a = input(&mut g, rng, F32, NE, 1.0, fa)?;
                let b = operand(&mut g, rng, op, F32, NE, fb)?;
                let d = g.op(op, F32, NE, &[a, b], &[])?;
                g.output(d);
                Ok(g)
            });
        }
    }
    // The SmolLM2 residual add and norm-weight multiply shapes.
    push(v, "ADD", "add/f32/576x5/residual".into(), EXACT, |rng| {
        let mut g = Graph::new();
        let a = input(&mut g, rng, F32, [576, 5, 1, 1], 1.0, Form::Contig)?;
        let b = input(&mut g, rng, F32, [576, 5, 1, 1], 1.0, Form::Contig)?;
        let d = g.op(GgmlOp::Add, F32, [576, 5, 1, 1], &[a, b], &[])?;
        g.output(d);
        Ok(g)
    });
    push(v, "ADD1", "add1/f32/64x6x4x2/scalar".into(), EXACT, |rng| {
        let mut g = Graph::new();
        let a = input(&mut g, rng, F32, NE, 1.0, Form::Contig)?;
        let b = input(&mut g, rng, F32, [1, 1, 1, 1], 1.0, Form::Contig)?;
        let d = g.op(GgmlOp::Add1, F32, NE, &[a, b], &[])?;
        g.output(d);
        Ok(g)
    });
    // A quantized tensor plus F32 (dequantize, add, requantize with ggml's reference quantizer).
    for t in [Q4_0, Q8_0, Q4_K, IQ4_NL, Q6_K] {
        push(v, "ADD", format!("add/{}-f32-{}/256x4x2/same", tn(t), tn(t)), EXACT, move |rng| {
            let mut g = Graph::new();
            let a = input(&mut g, rng, t, [256, 4, 2, 1], 1.0, Form::Contig)?;
            let b = input(&mut g, rng, F32, [256, 4, 2, 1], 0.1, Form::Contig)?;
            let d = g.op(GgmlOp::Add, t, [256, 4, 2, 1], &[a, b], &[])?;
            g.output(d);
            Ok(g)
        });
    }
    // ADD_ID: a [64, 2 used, 5 tokens] + b[:, ids] with 4 expert biases.
    for fa in [Form::Contig, Form::Strided] {
        push(v, "ADD_ID", format!("add_id/f32/64x2x5-e4/{}", fa.name()), EXACT, move |rng| {
            let mut g = Graph::new();
            let a = input(&mut g, rng, F32, [64, 2, 5, 1], 1.0, fa)?;
            let b = input(&mut g, rng, F32, [64, 4, 1, 1], 1.0, Form::Contig)?;
            let ids: Vec<i32> = (0..10).map(|_| rng.random_range(0..4)).collect();
            let ids = i32_input(&mut g, [2, 5, 1, 1], &ids)?;
            let d = g.op(GgmlOp::AddId, F32, [64, 2, 5, 1], &[a, b, ids], &[])?;
            g.output(d);
            Ok(g)
        });
    }
}

/// src1 of a binary op: for DIV kept away from zero (|b| ≥ 0.5) so results stay finite and of
/// order 1.
fn operand(
    g: &mut Graph,
    rng: &mut rand::rngs::StdRng,
    op: GgmlOp,
    t: GgmlType,
    ne: [u64; 4],
    form: Form,
) -> crate::opdiff::Result<crate::opdiff::graph::Id> {
    if op != GgmlOp::Div {
        return input(g, rng, t, ne, 1.0, form);
    }
    let id = input(g, rng, t, ne, 1.0, form)?;
    let root = g.t(id).view_src.unwrap_or(id);
    let rt = g.layout(root).dtype;
    if let Some(bytes) = g.tensors[root].data.as_mut() {
        let vals = crate::opdiff::data::decode(rt, bytes).unwrap_or_default();
        let shifted: Vec<f32> =
            vals.iter().map(|&x| (x as f32).signum() * (0.5 + (x as f32).abs())).collect();
        *bytes = crate::opdiff::data::convert(rt, shifted.len(), &shifted)?;
    }
    Ok(id)
}
