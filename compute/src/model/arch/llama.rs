//! `llama` (Llama 2/3, TinyLlama, SmolLM2, Mistral 7B, Mixtral) and `mistral3`: pre-norm layers,
//! NORMAL RoPE, SwiGLU or MoE feed-forward (ref: ggml-compute-semantics.md §4.3, §4.6, §4.7).
//! Mistral 3's optional attention temperature (`inp_attn_scale`, multiplied into Q after RoPE) is
//! added by [`crate::model::arch::blocks::attention`] when the graph has that input.

use crate::error::Result;
use crate::model::arch::blocks::{layers_and_head, pre_norm_layer, AttnOptions};
use crate::model::arch::Ctx;
use crate::model::graph_def::TensorId;

/// Builds the llama graph; returns its output tensor.
pub fn build(b: &mut Ctx<'_>) -> Result<TensorId> {
    let x = b.input_embeddings()?;
    layers_and_head(b, x, |b, il, x| pre_norm_layer(b, il, x, AttnOptions::default()))
}
