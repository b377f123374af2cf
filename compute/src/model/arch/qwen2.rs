//! `qwen2` (Qwen2 / Qwen2.5) and `qwen2moe` (Qwen1.5-MoE, Qwen2-MoE): the llama layer with NEOX
//! RoPE and Q/K/V biases; the MoE variant uses the expert block plus the shared expert
//! (ref: ggml-compute-semantics.md §4.6, §4.7).

use crate::error::Result;
use crate::model::arch::blocks::{layers_and_head, pre_norm_layer, AttnOptions};
use crate::model::arch::Ctx;
use crate::model::graph_def::TensorId;

/// Builds the qwen2 graph; returns its output tensor. The biases are picked up by
/// [`crate::model::arch::blocks::attention`] from `blk.N.attn_{q,k,v}.bias`; the NEOX mode comes from
/// the architecture.
pub fn build(b: &mut Ctx<'_>) -> Result<TensorId> {
    let x = b.input_embeddings()?;
    layers_and_head(b, x, |b, il, x| pre_norm_layer(b, il, x, AttnOptions::default()))
}
