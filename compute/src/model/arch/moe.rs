//! The mixture-of-experts feed-forward (Mixtral, Qwen2-MoE, Qwen3-MoE) and Qwen2-MoE's shared
//! expert (ref: ggml-compute-semantics.md §4.7).

use crate::error::Result;
use crate::model::arch::blocks::ffn_gated_named;
use crate::model::arch::Ctx;
use crate::model::graph_def::TensorId;
use crate::op::{GluOp, UnaryOp};

/// Mixture-of-experts feed-forward with softmax gating and SwiGLU experts (ref §4.7).
pub fn ffn_moe(b: &mut Ctx<'_>, il: u32, cur: TensorId) -> Result<TensorId> {
    let hp = b.hp;
    let (e, f, ne, nu) = (hp.n_embd, hp.n_ff_exp, hp.n_expert, hp.n_expert_used);
    let t = b.g.layout(cur).ne[1];
    let router = b.lw(il, "ffn_gate_inp.weight", [e, ne, 1, 1])?;
    let logits = b.g.mul_mat(router, cur)?;
    b.name(logits, "ffn_moe_logits", il);
    let probs = b.g.soft_max_ext(logits, None, 1.0, 0.0)?;
    b.name(probs, "ffn_moe_probs", il);
    let topk = b.g.argsort_top_k(probs, nu)?;
    b.name(topk, "ffn_moe_topk", il);
    let probs3 = b.g.reshape(probs, [1, ne, t, 1])?;
    let mut weights = b.g.get_rows(probs3, topk)?;
    b.name(weights, "ffn_moe_weights", il);
    if hp.expert_weights_norm {
        let w2 = b.g.reshape(weights, [nu, t, 1, 1])?;
        let sum = b.g.sum_rows(w2)?;
        b.name(sum, "ffn_moe_weights_sum", il);
        let sum = b.g.clamp(sum, 6.103_515_6e-5, f32::INFINITY)?;
        let w2 = b.g.div(w2, sum)?;
        b.name(w2, "ffn_moe_weights_norm", il);
        weights = b.g.reshape(w2, [1, nu, t, 1])?;
    }
    if hp.expert_weights_scale != 0.0 && hp.expert_weights_scale != 1.0 {
        weights = b.g.scale(weights, hp.expert_weights_scale)?;
    }
    // llama.cpp adds the routing weights to the graph before the experts, the weighted experts before
    // their sum, each expert's view, and each partial sum (ggml_build_forward_expand).
    b.g.expand(weights);
    let x = b.g.reshape(cur, [e, 1, t, 1])?;
    let up_exps = b.lw(il, "ffn_up_exps.weight", [e, f, ne, 1])?;
    let gate_exps = b.lw(il, "ffn_gate_exps.weight", [e, f, ne, 1])?;
    let down_exps = b.lw(il, "ffn_down_exps.weight", [f, e, ne, 1])?;
    let up = b.g.mul_mat_id(up_exps, x, topk)?;
    b.name(up, "ffn_moe_up", il);
    let gate = b.g.mul_mat_id(gate_exps, x, topk)?;
    b.name(gate, "ffn_moe_gate", il);
    let act = b.g.glu_split(gate, up, GluOp::Swiglu)?;
    b.name(act, "ffn_moe_swiglu", il);
    let down = b.g.mul_mat_id(down_exps, act, topk)?;
    b.name(down, "ffn_moe_down", il);
    let weighted = b.g.mul(down, weights)?;
    b.name(weighted, "ffn_moe_weighted", il);
    b.g.expand(weighted);
    let l = b.g.layout(weighted);
    let mut views = Vec::with_capacity(nu as usize);
    for slot in 0..nu {
        let v = b.g.view_2d(weighted, e, t, l.nb[2], slot * l.nb[1])?;
        b.g.expand(v);
        views.push(v);
    }
    let mut out = views[0];
    for &v in &views[1..] {
        out = b.g.add(out, v)?;
        b.g.expand(out);
    }
    if nu == 1 {
        out = b.g.cont(out)?;
    }
    Ok(b.name(out, "ffn_moe_out", il))
}

/// Qwen2-MoE's shared expert, added to the routed experts' output `routed`: a SwiGLU FFN of width
/// `expert_shared_feed_forward_length` on the same input `cur`, scaled per token by
/// `sigmoid(ffn_gate_inp_shexp · cur)` (ref §4.7), which llama.cpp computes as `silu(x) / x` (so do
/// we: the same bits). Nodes as llama.cpp orders them: the shared FFN, its gate, their product
/// `ffn_shexp_out`, the sum `ffn_out`.
pub fn add_shared_expert(b: &mut Ctx<'_>, il: u32, cur: TensorId, routed: TensorId) -> Result<TensorId> {
    let (e, f) = (b.hp.n_embd, b.hp.n_ff_shexp);
    let names = ["ffn_gate_shexp.weight", "ffn_up_shexp.weight", "ffn_down_shexp.weight"];
    let shared = ffn_gated_named(b, il, cur, GluOp::Swiglu, f, names)?;
    b.name(shared, "ffn_shexp", il);
    let w = b.lw(il, "ffn_gate_inp_shexp.weight", [e, 1, 1, 1])?;
    let logit = b.g.mul_mat(w, cur)?;
    b.name(logit, "ffn_shexp_gate_inp", il);
    let silu = b.g.unary(logit, UnaryOp::Silu)?;
    let gate = b.g.div(silu, logit)?;
    b.name(gate, "ffn_shexp_gate", il);
    let scaled = b.g.mul(shared, gate)?;
    b.name(scaled, "ffn_shexp_out", il);
    let out = b.g.add(routed, scaled)?;
    Ok(b.name(out, "ffn_out", il))
}
