//! Reductions and sorts (SUM, SUM_ROWS, MEAN, ARGMAX, ARGSORT, TOP_K) and the layout ops CONCAT,
//! PAD, REPEAT.
//!
//! ref: ggml-compute-semantics.md §3.3 SUM_ROWS, ARGSORT/TOP_K, CONCAT/PAD/REPEAT.

use compute::{GgmlOp, GgmlType};
use GgmlType::*;

use super::{input, push, tn, Case, Form, EXACT, ORDER};
use crate::opdiff::compare::Bound;
use crate::opdiff::graph::Graph;

const NE: [u64; 4] = [96, 5, 3, 1];

pub fn cases(v: &mut Vec<Case>) {
    reductions(v);
    layout(v);
}

fn reductions(v: &mut Vec<Case>) {
    // ggml's SUM keeps the source type (F32, F16, BF16); SUM_ROWS and MEAN take F32 only.
    for (op, name, dne, types) in [
        (GgmlOp::Sum, "sum", [1, 1, 1, 1], &[F32, F16, BF16][..]),
        (GgmlOp::SumRows, "sum_rows", [1, 5, 3, 1], &[F32][..]),
        (GgmlOp::Mean, "mean", [1, 5, 3, 1], &[F32][..]),
    ] {
        for (&t, form) in
            types.iter().zip([Form::Contig, Form::Contig, Form::Contig]).chain([(&F32, Form::Permuted)])
        {
            let bound = if t == F32 { ORDER } else { Bound::close(1e-6, 1e-2) };
            push(v, op.name(), format!("{name}/{}/96x5x3/{}", tn(t), form.name()), bound, move |rng| {
                let mut g = Graph::new();
                let x = input(&mut g, rng, t, NE, 1.0, form)?;
                let d = g.op(op, t, dne, &[x], &[])?;
                g.output(d);
                Ok(g)
            });
        }
    }
    push(v, "ARGMAX", "argmax/f32/96x5/contig".into(), EXACT, |rng| {
        let mut g = Graph::new();
        let x = input(&mut g, rng, F32, [96, 5, 1, 1], 1.0, Form::Contig)?;
        let d = g.op(GgmlOp::Argmax, I32, [5, 1, 1, 1], &[x], &[])?;
        g.output(d);
        Ok(g)
    });
    for (order, oname) in [(0, "asc"), (1, "desc")] {
        for form in [Form::Contig, Form::Strided] {
            push(v, "ARGSORT", format!("argsort/{oname}/f32/96x5x3/{}", form.name()), EXACT, move |rng| {
                let mut g = Graph::new();
                let x = input(&mut g, rng, F32, NE, 1.0, form)?;
                let d = g.op(GgmlOp::Argsort, I32, NE, &[x], &[order])?;
                g.output(d);
                Ok(g)
            });
        }
    }
    // TOP_K: the k largest, in no promised order (compared as sets per row).
    push(v, "TOP_K", "top_k/f32/96x5x3/k8".into(), Bound::row_sets(8), |rng| {
        let mut g = Graph::new();
        let x = input(&mut g, rng, F32, NE, 1.0, Form::Contig)?;
        let d = g.op(GgmlOp::TopK, I32, [8, 5, 3, 1], &[x], &[8])?;
        g.output(d);
        Ok(g)
    });
}

fn layout(v: &mut Vec<Case>) {
    let a_ne = [32u64, 4, 3, 2];
    for dim in 0..4usize {
        for (t, fb) in [(F32, Form::Contig), (F32, Form::Permuted), (F16, Form::Contig), (I32, Form::Contig)]
        {
            let mut b_ne = a_ne;
            b_ne[dim] = 2;
            let mut d_ne = a_ne;
            d_ne[dim] += 2;
            if fb == Form::Permuted && (b_ne[1] == 1 || b_ne[2] == 1) {
                continue;
            }
            let name = format!("concat/{}/32x4x3x2/dim{dim}-{}", tn(t), fb.name());
            push(v, "CONCAT", name, EXACT, move |rng| {
                let mut g = Graph::new();
                let a = input(&mut g, rng, t, a_ne, 1.0, Form::Contig)?;
                let b = input(&mut g, rng, t, b_ne, 1.0, fb)?;
                let d = g.op(GgmlOp::Concat, t, d_ne, &[a, b], &[dim as i32])?;
                g.output(d);
                Ok(g)
            });
        }
    }
    // Every other type ggml concatenates: raw 8- and 2-byte elements, and quantized blocks (rows of
    // 256 so that every block type fits; along dim 0 whole rows of blocks are joined).
    for t in [I64, I16, BF16, Q4_0, Q8_0, Q4_K, IQ4_NL, MXFP4] {
        for dim in 0..4usize {
            let qa = [256u64, 4, 3, 2];
            let mut b_ne = qa;
            b_ne[dim] = if dim == 0 { 256 } else { 2 };
            let mut d_ne = qa;
            d_ne[dim] += b_ne[dim];
            let name = format!("concat/{}/256x4x3x2/dim{dim}", tn(t));
            push(v, "CONCAT", name, EXACT, move |rng| {
                let mut g = Graph::new();
                let a = input(&mut g, rng, t, qa, 1.0, Form::Contig)?;
                let b = input(&mut g, rng, t, b_ne, 1.0, Form::Contig)?;
                let d = g.op(GgmlOp::Concat, t, d_ne, &[a, b], &[dim as i32])?;
                g.output(d);
                Ok(g)
            });
        }
    }
    for (circular, cname) in [(0, "zero"), (1, "circular")] {
        // ggml pads F32 only.
        for (t, form) in [(F32, Form::Contig), (F32, Form::Permuted), (F32, Form::Strided)] {
            let name = format!("pad/{cname}/{}/32x4x3x2/{}", tn(t), form.name());
            push(v, "PAD", name, EXACT, move |rng| {
                let mut g = Graph::new();
                let a = input(&mut g, rng, t, a_ne, 1.0, form)?;
                let p = [1, 3, 0, 2, 2, 1, 0, 1, circular];
                let d_ne = [32 + 4, 4 + 2, 3 + 3, 2 + 1];
                let d = g.op(GgmlOp::Pad, t, d_ne, &[a], &p)?;
                g.output(d);
                Ok(g)
            });
        }
    }
    for (t, form) in [(F32, Form::Contig), (F32, Form::Permuted), (F16, Form::Contig)] {
        push(
            v,
            "REPEAT",
            format!("repeat/{}/32x4x3x1-to-64x8x3x2/{}", tn(t), form.name()),
            EXACT,
            move |rng| {
                let mut g = Graph::new();
                let a = input(&mut g, rng, t, [32, 4, 3, 1], 1.0, form)?;
                let d = g.op(GgmlOp::Repeat, t, [64, 8, 3, 2], &[a], &[])?;
                g.output(d);
                Ok(g)
            },
        );
    }
}
