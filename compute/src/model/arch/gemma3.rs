//! `gemma3`: embeddings scaled by √E, per-head Q/K norm, Q scaled by `1/√D` with KQ scale 1,
//! post-attention and post-FFN norms, GeGLU, sliding-window layers with their own mask and RoPE
//! base (ref: ggml-compute-semantics.md §4.6).
//!
//! All layers keep a full-size KV cache; sliding-window layers differ only by their mask (which
//! hides cells `p_query - p_cell >= n_swa`), which is equivalent to llama.cpp's separate SWA cache.

use crate::error::Result;
use crate::model::arch::blocks::{
    attention, ffn_gated, layers_and_head, rms_norm_mul, select_outputs, AttnOptions,
};
use crate::model::arch::Ctx;
use crate::model::graph_def::TensorId;
use crate::op::GluOp;

/// Builds the gemma3 graph; returns its output tensor.
pub fn build(b: &mut Ctx<'_>) -> Result<TensorId> {
    let mut x = b.input_embeddings()?;
    if b.p.layers.start == 0 {
        x = b.g.scale(x, (b.hp.n_embd as f32).sqrt())?;
        b.g.set_name(x, "inp_scaled");
    }
    let q_scale = if b.hp.attention_scale != 0.0 {
        b.hp.attention_scale
    } else {
        1.0 / (b.hp.head_dim_k as f32).sqrt()
    };
    let o = AttnOptions { qk_norm: true, q_scale };
    layers_and_head(b, x, |b, il, inp| {
        let e = b.hp.n_embd;
        let wn = b.lw(il, "attn_norm.weight", [e, 1, 1, 1])?;
        let cur = rms_norm_mul(b, inp, wn, "attn_norm", il)?;
        let cur = attention(b, il, cur, o)?;
        let (cur, inp) = select_outputs(b, il, cur, inp)?;
        let wp = b.lw(il, "post_attention_norm.weight", [e, 1, 1, 1])?;
        let cur = rms_norm_mul(b, cur, wp, "attn_post_norm", il)?;
        let sa_out = b.g.add(cur, inp)?;
        b.name(sa_out, "sa_out", il);
        let wf = b.lw(il, "ffn_norm.weight", [e, 1, 1, 1])?;
        let cur = rms_norm_mul(b, sa_out, wf, "ffn_norm", il)?;
        let cur = ffn_gated(b, il, cur, GluOp::Geglu)?;
        let wpf = b.lw(il, "post_ffw_norm.weight", [e, 1, 1, 1])?;
        let cur = rms_norm_mul(b, cur, wpf, "ffn_post_norm", il)?;
        let out = b.g.add(cur, sa_out)?;
        Ok(b.name(out, "l_out", il))
    })
}
