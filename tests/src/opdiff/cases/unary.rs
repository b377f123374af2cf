//! UNARY (all 22 functions), SQR, SQRT, LOG, SIN, COS, SCALE, CLAMP, FILL, and GLU (every gated
//! form: split, fused, swapped).
//!
//! ref: ggml-compute-semantics.md §3.3 UNARY, GLU, SCALE, CLAMP, FILL. Exact where the function is
//! IEEE arithmetic or ggml's f16 table (GELU, GELU_QUICK, their GLUs) or ggml's vectorised `exp`
//! (SWIGLU); about one ulp where ggml and llamad call different `exp`/`tanh`/`erf` implementations.

use compute::op::UnaryOp;
use compute::{GgmlOp, GgmlType};
use GgmlType::*;

use super::{input, push, tn, Case, Form, EXACT, ULP};
use crate::opdiff::compare::Bound;
use crate::opdiff::graph::{f32p, Graph};

const NE: [u64; 4] = [128, 5, 3, 1];

/// (op, name, exact: IEEE arithmetic or ggml's f16 table).
const UNARY: [(UnaryOp, &str, bool); 22] = [
    (UnaryOp::Abs, "abs", true),
    (UnaryOp::Sgn, "sgn", true),
    (UnaryOp::Neg, "neg", true),
    (UnaryOp::Step, "step", true),
    (UnaryOp::Tanh, "tanh", false),
    (UnaryOp::Elu, "elu", false),
    (UnaryOp::Relu, "relu", true),
    (UnaryOp::Sigmoid, "sigmoid", false),
    (UnaryOp::Gelu, "gelu", true),
    (UnaryOp::GeluQuick, "gelu_quick", true),
    (UnaryOp::Silu, "silu", false),
    (UnaryOp::Hardswish, "hardswish", true),
    (UnaryOp::Hardsigmoid, "hardsigmoid", true),
    (UnaryOp::Exp, "exp", false),
    (UnaryOp::Expm1, "expm1", false),
    (UnaryOp::Softplus, "softplus", false),
    (UnaryOp::GeluErf, "gelu_erf", false),
    (UnaryOp::Xielu, "xielu", false),
    (UnaryOp::Floor, "floor", true),
    (UnaryOp::Ceil, "ceil", true),
    (UnaryOp::Round, "round", true),
    (UnaryOp::Trunc, "trunc", true),
];

/// One single-operand elementwise node.
struct Elementwise {
    op: GgmlOp,
    t: GgmlType,
    ne: [u64; 4],
    form: Form,
    params: Vec<i32>,
    /// Inputs made positive (SQRT, LOG).
    positive: bool,
}

fn unary_case(v: &mut Vec<Case>, family: &'static str, name: String, bound: Bound, e: Elementwise) {
    push(v, family, name, bound, move |rng| {
        let mut g = Graph::new();
        let a = input(&mut g, rng, e.t, e.ne, 2.0, e.form)?;
        if e.positive {
            make_positive(&mut g, a)?;
        }
        let d = g.op(e.op, e.t, e.ne, &[a], &e.params)?;
        g.output(d);
        Ok(g)
    });
}

/// Replaces the values under `id` by `|x| + 0.1` (inputs of SQRT and LOG).
fn make_positive(g: &mut Graph, id: crate::opdiff::graph::Id) -> crate::opdiff::Result<()> {
    let root = g.t(id).view_src.unwrap_or(id);
    let rt = g.layout(root).dtype;
    if let Some(bytes) = g.tensors[root].data.as_mut() {
        let vals = crate::opdiff::data::decode(rt, bytes).unwrap_or_default();
        let pos: Vec<f32> = vals.iter().map(|&x| x.abs() as f32 + 0.1).collect();
        *bytes = crate::opdiff::data::convert(rt, pos.len(), &pos)?;
    }
    Ok(())
}

pub fn cases(v: &mut Vec<Case>) {
    for (u, name, exact) in UNARY {
        let mut params = vec![u as i32];
        if u == UnaryOp::Xielu {
            // alpha_n, alpha_p, beta, eps.
            params.extend([f32p(0.8), f32p(0.8), f32p(0.5), f32p(-1e-6)]);
        }
        for (t, form) in [(F32, Form::Contig), (F32, Form::Strided), (F32, Form::Offset), (F16, Form::Contig)]
        {
            // f16 results round the function's f32 value once more: one f16 ulp.
            let bound = match (exact, t) {
                (true, _) => EXACT,
                (false, F16) => Bound::close(1e-6, 1e-3),
                _ => ULP,
            };
            let cname = format!("unary/{name}/{}/128x5x3/{}", tn(t), form.name());
            let e =
                Elementwise { op: GgmlOp::Unary, t, ne: NE, form, params: params.clone(), positive: false };
            unary_case(v, "UNARY", cname, bound, e);
        }
    }
    let simple: [(GgmlOp, &str, bool, Vec<i32>, bool); 9] = [
        (GgmlOp::Sqr, "sqr", true, vec![], false),
        (GgmlOp::Sqrt, "sqrt", true, vec![], true),
        (GgmlOp::Log, "log", false, vec![], true),
        (GgmlOp::Sin, "sin", false, vec![], false),
        (GgmlOp::Cos, "cos", false, vec![], false),
        (GgmlOp::Scale, "scale", true, vec![f32p(0.125), f32p(0.0)], false),
        (GgmlOp::Scale, "scale-bias", true, vec![f32p(0.125), f32p(-0.75)], false),
        (GgmlOp::Clamp, "clamp", true, vec![f32p(-0.5), f32p(1.25)], false),
        (GgmlOp::Fill, "fill", true, vec![f32p(-3.5)], false),
    ];
    for (op, name, exact, params, positive) in simple {
        let forms: &[Form] =
            if op == GgmlOp::Scale { &[Form::Contig, Form::Offset] } else { &[Form::Contig, Form::Strided] };
        for &form in forms {
            for t in [F32, F16] {
                if op == GgmlOp::Scale && t == F16 {
                    continue;
                }
                let bound = match (exact, t) {
                    (true, _) => EXACT,
                    (false, F16) => Bound::close(1e-6, 1e-3),
                    _ => ULP,
                };
                let cname = format!("{name}/{}/128x5x3/{}", tn(t), form.name());
                let e = Elementwise { op, t, ne: NE, form, params: params.clone(), positive };
                unary_case(v, op.name(), cname, bound, e);
            }
        }
    }
    // SCALE on SmolLM2's shape (scores × 1/√D).
    let e = Elementwise {
        op: GgmlOp::Scale,
        t: F32,
        ne: [4096, 1, 1, 1],
        form: Form::Contig,
        params: vec![f32p(0.125), f32p(0.0)],
        positive: false,
    };
    unary_case(v, "SCALE", "scale/f32/4096/contig".into(), EXACT, e);
    glu(v);
    table_sweeps(v);
}

/// Every finite f16 value in (-10, 10), as f32: GELU, GELU_QUICK and GEGLU read ggml's f16 tables
/// there, so these sweeps compare every table entry.
fn f16_sweep() -> Vec<f32> {
    (0..=u16::MAX)
        .map(|h| half::f16::from_bits(h).to_f32())
        .filter(|x| x.is_finite() && x.abs() < 10.0)
        .collect()
}

fn table_sweeps(v: &mut Vec<Case>) {
    for (u, name) in [(UnaryOp::Gelu, "gelu"), (UnaryOp::GeluQuick, "gelu_quick")] {
        push(v, "UNARY", format!("unary/{name}/f32/all-f16-values"), EXACT, move |_| {
            let x = f16_sweep();
            let ne = [x.len() as u64, 1, 1, 1];
            let mut g = Graph::new();
            let a = super::f32_input(&mut g, ne, &x)?;
            let d = g.op(GgmlOp::Unary, F32, ne, &[a], &[u as i32])?;
            g.output(d);
            Ok(g)
        });
    }
    for (op, name) in [(1, "geglu"), (5, "geglu_quick")] {
        push(v, "GLU", format!("glu/{name}/f32/all-f16-values-times-one"), EXACT, move |_| {
            let x = f16_sweep();
            let ne = [x.len() as u64, 1, 1, 1];
            let mut g = Graph::new();
            let a = super::f32_input(&mut g, ne, &x)?;
            let b = super::f32_input(&mut g, ne, &vec![1.0; x.len()])?;
            let d = g.op(GgmlOp::Glu, F32, ne, &[a, b], &[op, 0])?;
            g.output(d);
            Ok(g)
        });
    }
}

/// (glu op, name, exact).
const GLU: [(i32, &str, bool); 7] = [
    (0, "reglu", true),
    (1, "geglu", true),
    (2, "swiglu", true),
    (3, "swiglu_oai", false),
    (4, "geglu_erf", false),
    (5, "geglu_quick", true),
    (6, "swiglu_clamp", false),
];

fn glu(v: &mut Vec<Case>) {
    for (op, name, exact) in GLU {
        let mut params = vec![op, 0];
        if op == 3 || op == 6 {
            params.extend([f32p(1.702), f32p(if op == 3 { 7.0 } else { 1.5 })]);
        }
        let bound = if exact { EXACT } else { ULP };
        // The split form llama.cpp emits (gate, up) on SmolLM2's FFN width, plus strided rows.
        for form in [Form::Contig, Form::Strided] {
            let p = params.clone();
            push(v, "GLU", format!("glu/{name}/f32/1536x5/split-{}", form.name()), bound, move |rng| {
                let mut g = Graph::new();
                let a = input(&mut g, rng, F32, [1536, 5, 1, 1], 2.0, form)?;
                let b = input(&mut g, rng, F32, [1536, 5, 1, 1], 1.0, form)?;
                let d = g.op(GgmlOp::Glu, F32, [1536, 5, 1, 1], &[a, b], &p)?;
                g.output(d);
                Ok(g)
            });
        }
        // Split operands that are views of one fused gate|up tensor (rows of 2·256, each operand
        // one half: non-contiguous rows, the form a fused FFN projection gives).
        let p = params.clone();
        push(v, "GLU", format!("glu/{name}/f32/256x5x2/split-views-of-one"), bound, move |rng| {
            let mut g = Graph::new();
            let both = input(&mut g, rng, F32, [512, 5, 2, 1], 2.0, Form::Contig)?;
            let a = g.view(both, [256, 5, 2, 1], [2048, 2048 * 5, 2048 * 10], 0);
            let b = g.view(both, [256, 5, 2, 1], [2048, 2048 * 5, 2048 * 10], 1024);
            let d = g.op(GgmlOp::Glu, F32, [256, 5, 2, 1], &[a, b], &p)?;
            g.output(d);
            Ok(g)
        });
        // Fused (both halves in one row), plain and swapped.
        for swapped in [0, 1] {
            let mut p = params.clone();
            p[1] = swapped;
            let cname = format!("glu/{name}/f32/2x256x5x2/fused-swapped{swapped}");
            push(v, "GLU", cname, bound, move |rng| {
                let mut g = Graph::new();
                let a = input(&mut g, rng, F32, [512, 5, 2, 1], 2.0, Form::Contig)?;
                let d = g.op(GgmlOp::Glu, F32, [256, 5, 2, 1], &[a], &p)?;
                g.output(d);
                Ok(g)
            });
        }
        // F16 operands (ggml has no F16 SWIGLU_OAI or SWIGLU_CLAMP).
        if op == 3 || op == 6 {
            continue;
        }
        let p = params.clone();
        let fb = if exact { EXACT } else { Bound::close(1e-6, 1e-3) };
        push(v, "GLU", format!("glu/{name}/f16/256x5/split"), fb, move |rng| {
            let mut g = Graph::new();
            let a = input(&mut g, rng, F16, [256, 5, 1, 1], 2.0, Form::Contig)?;
            let b = input(&mut g, rng, F16, [256, 5, 1, 1], 1.0, Form::Contig)?;
            let d = g.op(GgmlOp::Glu, F16, [256, 5, 1, 1], &[a, b], &p)?;
            g.output(d);
            Ok(g)
        });
    }
}
